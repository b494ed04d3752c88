/* check_output: streamed text from tokens: UTF-8 held back until whole,
 * possible stop-string prefixes held back, the cut at a stop string, and
 * token event texts that join to the final text. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_mkmodel.h"
#include "model/kg_tokenizer.h"
#include "pipeline/kg_output.h"
#include "schema/kg_toolcall.h"

#include <stdio.h>
#include <string.h>

static kg_gguf_t *g;
static kg_tokenizer_t *tok;

static void setup(void) {
    char err[256];
    g = kg_gguf_open(kg_test_data("tokenizer-vectors/ggml-vocab-gpt-2.gguf"), err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    tok = kg_tokenizer_new(g, err, sizeof(err));
    ck_assert_msg(tok != NULL, "%s", err);
}

static void teardown(void) {
    kg_tokenizer_free(tok);
    kg_gguf_free(g);
}

typedef struct run {
    char joined[4096];
    size_t joined_len;
    int n_events;
    int last_index;
    char final_text[4096];
    bool stopped;
} run_t;

/* Tokenize `text`, push every token, finish; collect the events. */
static void run_text(const char *text, const char *const *stop, int n_stop, run_t *r) {
    int32_t ids[1024];
    int64_t n = kg_tokenizer_encode(tok, text, strlen(text), false, false, ids, 1024);
    ck_assert(n > 0 && n <= 1024);
    memset(r, 0, sizeof(*r));
    r->last_index = -1;
    kg_output_t out;
    kg_output_init(&out, tok, stop, n_stop);
    kg_output_event_t ev[2];
    for (int64_t i = 0; i < n && !kg_output_stopped(&out); i++) {
        int k = kg_output_push(&out, ids[i], NULL, ev);
        ck_assert_int_ge(k, 0);
        for (int j = 0; j < k; j++) {
            size_t len;
            const char *t = kg_output_text(&out, &len);
            ck_assert_int_eq(ev[j].index, r->last_index + 1); /* in order, none skipped */
            r->last_index = ev[j].index;
            ck_assert_uint_le(ev[j].text_off + ev[j].text_len, len);
            memcpy(r->joined + r->joined_len, t + ev[j].text_off, ev[j].text_len);
            r->joined_len += ev[j].text_len;
            r->n_events++;
        }
    }
    r->stopped = kg_output_stopped(&out);
    int k = kg_output_finish(&out, ev);
    size_t len;
    const char *t = kg_output_text(&out, &len);
    for (int j = 0; j < k; j++) {
        ck_assert_int_eq(ev[j].index, r->last_index + 1);
        r->last_index = ev[j].index;
        memcpy(r->joined + r->joined_len, t + ev[j].text_off, ev[j].text_len);
        r->joined_len += ev[j].text_len;
        r->n_events++;
    }
    memcpy(r->final_text, t, len);
    r->final_text[len] = '\0';
    r->joined[r->joined_len] = '\0';
    kg_output_clear(&out);
}

START_TEST(plain_text_round_trips) {
    run_t r;
    run_text("Hello world, this is kgen.", NULL, 0, &r);
    ck_assert_str_eq(r.final_text, "Hello world, this is kgen.");
    ck_assert_str_eq(r.joined, r.final_text);
    ck_assert(!r.stopped);
}
END_TEST

START_TEST(utf8_split_across_tokens_is_held_back) {
    /* byte-level BPE splits these characters over several tokens: no event
     * may carry half a character */
    const char *text = "日本語のテキスト 🦙🦙 Ünïcödé";
    int32_t ids[256];
    int64_t n = kg_tokenizer_encode(tok, text, strlen(text), false, false, ids, 256);
    kg_output_t out;
    kg_output_init(&out, tok, NULL, 0);
    kg_output_event_t ev[2];
    for (int64_t i = 0; i < n; i++) {
        int k = kg_output_push(&out, ids[i], NULL, ev);
        for (int j = 0; j < k; j++) {
            size_t len;
            const char *t = kg_output_text(&out, &len);
            /* each event's text is whole characters: starts on a lead byte */
            if (ev[j].text_len > 0) {
                ck_assert((t[ev[j].text_off] & 0xC0) != 0x80);
                size_t end = ev[j].text_off + ev[j].text_len;
                ck_assert(end == len || (t[end] & 0xC0) != 0x80);
            }
        }
    }
    kg_output_clear(&out);
    run_t r;
    run_text(text, NULL, 0, &r);
    ck_assert_str_eq(r.final_text, text);
    ck_assert_str_eq(r.joined, text);
    ck_assert_int_eq(r.last_index, (int)n - 1);
}
END_TEST

START_TEST(stop_string_cuts_the_text) {
    const char *stop[] = {"END", "\n\n"};
    run_t r;
    run_text("The answer is 42.\n\nNext question", stop, 2, &r);
    ck_assert(r.stopped);
    ck_assert_str_eq(r.final_text, "The answer is 42.");
    ck_assert_str_eq(r.joined, r.final_text);
}
END_TEST

START_TEST(stop_prefix_that_never_completes_is_released) {
    const char *stop[] = {"ENDING"};
    run_t r;
    run_text("the END of it", stop, 1, &r);
    ck_assert(!r.stopped);
    ck_assert_str_eq(r.final_text, "the END of it");
    ck_assert_str_eq(r.joined, r.final_text);
    run_text("trailing END", stop, 1, &r); /* held back to the very end */
    ck_assert_str_eq(r.final_text, "trailing END");
    ck_assert_str_eq(r.joined, r.final_text);
}
END_TEST

START_TEST(stop_inside_one_token_and_at_start) {
    const char *stop[] = {"world"};
    run_t r;
    run_text("hello world again", stop, 1, &r);
    ck_assert(r.stopped);
    ck_assert_str_eq(r.final_text, "hello ");
    ck_assert_str_eq(r.joined, "hello ");
    run_text("world first", stop, 1, &r);
    ck_assert(r.stopped);
    ck_assert_str_eq(r.final_text, "");
}
END_TEST

// ---- reasoning (kg_reasoning through kg_output) ----

typedef struct think_run {
    char reasoning[1024], answer[1024]; /* the final split ("<null>": no reasoning) */
    char by_part[3][1024];              /* event texts joined per part */
    int n_part[3];
} think_run_t;

/* Push `text` token by token (GPT-2's vocabulary: <think> and </think> are
 * three tokens each, so markers arrive split) with the reasoning parsed
 * (`on`), the prompt having opened the thought or not. */
static void run_think(const char *text, bool on, bool opened, const char *stop, think_run_t *r) {
    int32_t ids[512];
    int64_t n = kg_tokenizer_encode(tok, text, strlen(text), false, false, ids, 512);
    ck_assert(n > 0 && n <= 512);
    memset(r, 0, sizeof(*r));
    const char *stops[1] = {stop};
    kg_output_t out;
    kg_output_init(&out, tok, stops, stop ? 1 : 0);
    if (on) {
        kg_output_think(&out, opened);
    }
    kg_output_event_t ev[2];
    for (int64_t i = 0; i <= n; i++) {
        if (i < n && kg_output_stopped(&out)) {
            continue; /* tokens after a stop string are not output */
        }
        int k = i < n ? kg_output_push(&out, ids[i], NULL, ev) : kg_output_finish(&out, ev);
        size_t len;
        const char *t = kg_output_text(&out, &len);
        for (int j = 0; j < k; j++) {
            ck_assert_int_eq(ev[j].part == KG_PART_NONE, !on);
            strncat(r->by_part[ev[j].part], t + ev[j].text_off, ev[j].text_len);
            r->n_part[ev[j].part]++;
        }
    }
    const char *a, *rs;
    size_t al, rl;
    kg_output_split(&out, &a, &al, &rs, &rl);
    snprintf(r->answer, sizeof(r->answer), "%.*s", (int)al, a);
    snprintf(r->reasoning, sizeof(r->reasoning), "%.*s", rs ? (int)rl : 6, rs ? rs : "<null>");
    kg_output_clear(&out);
}

START_TEST(reasoning_split_across_token_boundaries) {
    think_run_t r;
    run_think("<think>\n91 = 7 * 13.\n</think>\n\n{\"prime\": false}", true, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "\n91 = 7 * 13.\n");
    ck_assert_str_eq(r.answer, "\n\n{\"prime\": false}");
    /* every token to its part: the markers' tokens are the thought's */
    ck_assert_str_eq(r.by_part[KG_PART_REASONING], "<think>\n91 = 7 * 13.\n</think>");
    ck_assert_str_eq(r.by_part[KG_PART_ANSWER], r.answer);
    /* leading whitespace before <think> is allowed */
    run_think("\n <think>a</think>b", true, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "a");
    ck_assert_str_eq(r.answer, "b");
}
END_TEST

START_TEST(reasoning_unclosed_and_absent) {
    think_run_t r;
    /* max_tokens inside the thought: all reasoning, an empty answer */
    run_think("<think>still weighing it", true, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "still weighing it");
    ck_assert_str_eq(r.answer, "");
    ck_assert_int_eq(r.n_part[KG_PART_ANSWER], 0);
    /* no thought opened: all answer, no reasoning, even with a later marker */
    run_think("Yes. <think>x</think>", true, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "<null>");
    ck_assert_str_eq(r.answer, "Yes. <think>x</think>");
    ck_assert_int_eq(r.n_part[KG_PART_REASONING], 0);
    /* "<thin" is a prefix of <think> until the next token says otherwise */
    run_think("<thing>", true, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "<null>");
    ck_assert_str_eq(r.answer, "<thing>");
}
END_TEST

START_TEST(reasoning_opened_by_the_prompt) {
    think_run_t r;
    run_think("Seven times thirteen.\n</think>\n\nNo.", true, true, NULL, &r);
    ck_assert_str_eq(r.reasoning, "Seven times thirteen.\n");
    ck_assert_str_eq(r.answer, "\n\nNo.");
    ck_assert_str_eq(r.by_part[KG_PART_REASONING], "Seven times thirteen.\n</think>");
    ck_assert_str_eq(r.by_part[KG_PART_ANSWER], "\n\nNo.");
    /* a stop string in the answer cuts the answer only */
    run_think("hmm</think>A. B.", true, true, " B", &r);
    ck_assert_str_eq(r.reasoning, "hmm");
    ck_assert_str_eq(r.answer, "A.");
    static const char *const opens[] = {"<|im_start|>assistant\n<think>\n", "<think>"};
    static const char *const closed[] = {"<think>\n\n</think>\n\n", "assistant\n", "think>", ""};
    for (size_t i = 0; i < sizeof(opens) / sizeof(opens[0]); i++) {
        ck_assert(kg_think_prompt_opens(opens[i], strlen(opens[i])));
    }
    for (size_t i = 0; i < sizeof(closed) / sizeof(closed[0]); i++) {
        ck_assert(!kg_think_prompt_opens(closed[i], strlen(closed[i])));
    }
}
END_TEST

START_TEST(reasoning_format_none_keeps_the_raw_text) {
    think_run_t r;
    run_think("<think>a</think>b", false, false, NULL, &r);
    ck_assert_str_eq(r.reasoning, "<null>");
    ck_assert_str_eq(r.answer, "<think>a</think>b");
    ck_assert_str_eq(r.by_part[KG_PART_NONE], "<think>a</think>b");
}
END_TEST

/* gpt-oss's Harmony channels give the tokens their parts (kg_output_harmony), on the vocabulary
 * of a random gpt-oss model (Harmony's markers whole tokens, as in o200k_harmony): only the
 * bodies of final and commentary messages are the answer's, every header, end marker and
 * analysis message the reasoning's; without calls, the answer tokens' texts join to the
 * answer the parse gives the done event. */
START_TEST(harmony_parts) {
    kg_mkmodel_opts_t o = kg_mkmodel_opts_default();
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("harmony"));
    o.out = path;
    o.arch = "gpt-oss";
    o.n_embd = 32;
    o.n_layer = 1;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.head_dim = 8;
    o.n_ff = 32;
    o.n_expert = 4;
    o.n_expert_used = 2;
    o.sliding_window = 8;
    o.ctx = 64;
    o.have_seed = true;
    ck_assert_msg(kg_mkmodel_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
    kg_gguf_t *og = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(og != NULL, "%s", err);
    kg_tokenizer_t *ot = kg_tokenizer_new(og, err, sizeof(err));
    ck_assert_msg(ot != NULL, "%s", err);
    static const struct {
        const char *out, *reasoning, *answer, *stop;
    } cases[] = {
        {"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
         "<|message|>Answer.",
         "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
         "<|message|>",
         "Answer.", NULL},
        /* a preamble and a call: its arguments are the answer's, as other syntaxes' calls */
        {"<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary"
         " to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
         "<|channel|>commentary<|message|><|end|><|start|>assistant<|channel|>commentary"
         " to=functions.get_weather <|constrain|>json<|message|>",
         "Checking.{\"city\": \"Paris\"}", NULL},
        /* the recipient in the role, and a call in the analysis channel */
        {" to=functions.f<|channel|>analysis json<|message|>{}",
         " to=functions.f<|channel|>analysis json<|message|>", "{}", NULL},
        /* a call's arguments are JSON: an <|end|> one of its strings holds does not end them */
        {" to=functions.f<|channel|>commentary<|message|>{\"a\": \"x<|end|>\\\"y\"}<|end|>"
         "<|start|>assistant<|channel|>final<|message|>z",
         " to=functions.f<|channel|>commentary<|message|><|end|><|start|>assistant<|channel|>final"
         "<|message|>",
         "{\"a\": \"x<|end|>\\\"y\"}z", NULL},
        /* not in channels: all answer */
        {"Just text.", "", "Just text.", NULL},
        /* a stop string that cuts a header already scanned: the scan starts over */
        {"<|channel|>final<|message|>Yes. No.", "<|channel|>final<|message|>", "Yes.", " No"},
        {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b",
         "<|channel|>analysis<|message|>a<|end|>", "", "<|start|>assistant<|channel|>final"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t ids[256];
        int64_t n =
            kg_tokenizer_encode(ot, cases[i].out, strlen(cases[i].out), false, true, ids, 256);
        ck_assert(n > 0 && n <= 256);
        const char *stops[1] = {cases[i].stop};
        kg_output_t out;
        kg_output_init(&out, ot, stops, cases[i].stop ? 1 : 0);
        kg_output_harmony(&out);
        char by_part[3][512] = {"", "", ""};
        kg_output_event_t ev[2];
        for (int64_t k = 0; k <= n; k++) {
            if (k < n && kg_output_stopped(&out)) {
                continue;
            }
            int m = k < n ? kg_output_push(&out, ids[k], NULL, ev) : kg_output_finish(&out, ev);
            size_t len;
            const char *t = kg_output_text(&out, &len);
            for (int j = 0; j < m; j++) {
                ck_assert(ev[j].part != KG_PART_NONE);
                strncat(by_part[ev[j].part], t + ev[j].text_off, ev[j].text_len);
            }
        }
        ck_assert_str_eq(by_part[KG_PART_REASONING], cases[i].reasoning);
        ck_assert_str_eq(by_part[KG_PART_ANSWER], cases[i].answer);
        /* the done event's split is the parse's: the text stays whole here */
        const char *a, *r;
        size_t al, rl;
        kg_output_split(&out, &a, &al, &r, &rl);
        ck_assert_ptr_null(r);
        if (i != 1 && i != 3) {
            kg_toolparse_t tp;
            ck_assert_int_eq(kg_toolcall_parse_answer(KG_TOOLFMT_GPT_OSS, a, al, &tp), KG_OK);
            ck_assert_str_eq(tp.content, i == 2 ? "" : cases[i].answer);
            kg_toolparse_clear(&tp);
        }
        kg_output_clear(&out);
    }
    kg_tokenizer_free(ot);
    kg_gguf_free(og);
    remove(path);
}
END_TEST

/* A kept control token is written as its text (a call syntax's marker the parse reads);
 * others are written as nothing. */
START_TEST(keeps_control_markers) {
    int32_t eot = kg_tokenizer_find(tok, "<|endoftext|>", 13);
    ck_assert(eot >= 0 && kg_tokenizer_is_control(tok, eot));
    int32_t hi[8];
    int64_t n = kg_tokenizer_encode(tok, "Hi", 2, false, false, hi, 8);
    ck_assert_int_eq(n, 1);
    for (int keep = 0; keep < 2; keep++) {
        kg_output_t out;
        kg_output_init(&out, tok, NULL, 0);
        if (keep) {
            kg_output_keep(&out, &eot, 1);
        }
        kg_output_event_t ev[3];
        kg_sample_result_t s = {.token = 0};
        ck_assert_int_ge(kg_output_push(&out, hi[0], &s, ev), 0);
        ck_assert_int_ge(kg_output_push(&out, eot, &s, ev), 0);
        ck_assert_int_ge(kg_output_push(&out, hi[0], &s, ev), 0);
        ck_assert_int_ge(kg_output_finish(&out, ev), 0);
        size_t len;
        const char *text = kg_output_text(&out, &len);
        const char *want = keep ? "Hi<|endoftext|>Hi" : "HiHi";
        ck_assert_uint_eq(len, strlen(want));
        ck_assert(memcmp(text, want, len) == 0);
        kg_output_clear(&out);
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("output");
    TCase *tc = tcase_create("output");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, plain_text_round_trips);
    tcase_add_test(tc, reasoning_split_across_token_boundaries);
    tcase_add_test(tc, reasoning_unclosed_and_absent);
    tcase_add_test(tc, reasoning_opened_by_the_prompt);
    tcase_add_test(tc, reasoning_format_none_keeps_the_raw_text);
    tcase_add_test(tc, utf8_split_across_tokens_is_held_back);
    tcase_add_test(tc, stop_string_cuts_the_text);
    tcase_add_test(tc, stop_prefix_that_never_completes_is_released);
    tcase_add_test(tc, stop_inside_one_token_and_at_start);
    tcase_add_test(tc, keeps_control_markers);
    tcase_add_test(tc, harmony_parts);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
