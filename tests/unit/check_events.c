/* check_events: every event fits its byte budget (pipeline/kg_events), in
 * the documented shedding order: a done event drops its logprobs, then the
 * metadata echo, then the end of its text; a token event drops its logprobs,
 * then the end of its text; an error event drops the metadata echo. What
 * was shed is marked in the event (logprobs_truncated, metadata_truncated,
 * text_truncated with text_bytes_cut) and decodes back. The intake refuses a
 * job whose metadata alone is over the budget. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_model.h"
#include "model/kg_tokenizer.h"
#include "pipeline/kg_events.h"
#include "pipeline/kg_intake.h"
#include "pipeline/kg_jobrun.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static kg_gguf_t *g;
static kg_tokenizer_t *tok;

static void setup(void) {
    char err[256];
    kg_codec_global_init();
    g = kg_gguf_open(kg_test_data("tokenizer-vectors/ggml-vocab-gpt-2.gguf"), err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    tok = kg_tokenizer_new(g, err, sizeof(err));
    ck_assert_msg(tok != NULL, "%s", err);
}

static void teardown(void) {
    kg_tokenizer_free(tok);
    kg_gguf_free(g);
}

static const kg_event_origin_t origin = {
    .worker_id = "w-test", .topic = "kgen.jobs", .partition = 2, .offset = 77};

/* A job decoded from JSON with `extra` members (", ..." or ""), and
 * metadata of about meta_bytes bytes when meta_bytes > 0. */
static kg_job_t *make_job(const char *extra, size_t meta_bytes) {
    size_t cap = meta_bytes + 512;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    int n = snprintf(text, cap, "{\"request_id\":\"ev-1\",\"prompt\":\"x\"%s", extra);
    if (meta_bytes > 0) {
        n += snprintf(text + n, cap - (size_t)n, ",\"metadata\":{\"b\":\"");
        memset(text + n, 'm', meta_bytes);
        n += (int)meta_bytes;
        n += snprintf(text + n, cap - (size_t)n, "\"}");
    }
    n += snprintf(text + n, cap - (size_t)n, "}");
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    kg_codec_opts_t opts = kg_codec_opts_default();
    opts.max_message_size = cap;
    ck_assert_msg(kg_codec_decode_job_opts(text, (size_t)n, &opts, &job, &err) == KG_OK, "%s",
                  err.message);
    free(text);
    return job;
}

/* Push the tokens of `text` through an output (no stop strings) and finish. */
static void make_output(kg_output_t *out, const char *text, kg_sample_result_t *samples, int *n) {
    int32_t ids[4096];
    int64_t k = kg_tokenizer_encode(tok, text, strlen(text), false, false, ids, 4096);
    ck_assert(k > 0 && k <= 4096);
    kg_output_init(out, tok, NULL, 0);
    kg_output_event_t ev[3];
    for (int64_t i = 0; i < k; i++) {
        kg_sample_result_t s = {.token = ids[i], .logprob = -0.5f, .n_top = KG_MAX_LOGPROBS};
        for (int j = 0; j < KG_MAX_LOGPROBS; j++) {
            s.top_token[j] = ids[i] + j;
            s.top_logprob[j] = -0.5f - (float)j;
        }
        if (samples) {
            samples[i] = s;
        }
        ck_assert_int_ge(kg_output_push(out, ids[i], &s, ev), 0);
    }
    ck_assert_int_ge(kg_output_finish(out, ev), 0);
    *n = (int)k;
}

static kg_event_t *decode(const char *json, size_t len) {
    kg_event_t *ev = NULL;
    char err[256];
    ck_assert_msg(kg_codec_decode_event(json, len, &ev, err, sizeof(err)) == KG_OK, "%s: %.200s",
                  err, json);
    return ev;
}

/* A long text with characters JSON escapes and multi-byte characters, so a
 * cut must respect both. */
static char *long_text(size_t n) {
    static const char piece[] = "Once \"upon\" a time\n\tthere was a caf\xc3\xa9 \xe2\x82\xac 42. ";
    char *t = malloc(n + sizeof(piece));
    ck_assert_ptr_nonnull(t);
    size_t len = 0;
    while (len < n) {
        memcpy(t + len, piece, sizeof(piece) - 1);
        len += sizeof(piece) - 1;
    }
    t[len] = '\0';
    return t;
}

static bool valid_utf8_prefix(const char *part, size_t n, const char *whole) {
    return strncmp(part, whole, n) == 0 && ((unsigned char)whole[n] & 0xC0) != 0x80;
}

/* Every event of a run carries its attempt id, and a run outside Kafka writes none (issue 30:
 * two runs of one job on one worker had the same worker_id, partition and offset). */
START_TEST(attempt_on_every_event) {
    char a[40], b[40];
    kg_events_attempt_id(0x9f0c2a7d41e3b865ull, 17, a, sizeof(a));
    ck_assert_str_eq(a, "9f0c2a7d41e3b865-17");
    kg_events_attempt_id(0x9f0c2a7d41e3b865ull, 18, b, sizeof(b));
    ck_assert_str_ne(a, b);
    kg_event_origin_t o = origin;
    o.attempt = a;
    size_t len;
    kg_events_fit_t fit;
    char *json = kg_events_error(&o, "ev-1", KG_ERROR_EXPIRED, "late", NULL, 0, &len, &fit);
    ck_assert_ptr_nonnull(strstr(json, "\"attempt\":\"9f0c2a7d41e3b865-17\""));
    kg_event_t *ev = decode(json, len);
    ck_assert_str_eq(ev->error.common.attempt, a);
    kg_event_free(ev);
    free(json);
    json = kg_events_error(&origin, "ev-1", KG_ERROR_EXPIRED, "late", NULL, 0, &len, &fit);
    ck_assert_ptr_null(strstr(json, "attempt"));
    ev = decode(json, len);
    ck_assert_ptr_null(ev->error.common.attempt);
    kg_event_free(ev);
    free(json);
}
END_TEST

typedef struct done_case {
    size_t budget;
    bool logprobs, metadata, text; /* expected to be shed */
} done_case_t;

/* The shedding order of the done event, budget by budget. */
START_TEST(done_sheds_in_order) {
    char *text = long_text(6000);
    kg_job_t *job = make_job(",\"logprobs\":20,\"stream\":false", 3000);
    kg_sample_result_t *samples = malloc(4096 * sizeof(*samples));
    kg_output_t out;
    int n;
    make_output(&out, text, samples, &n);
    kg_job_timing_t t = {.taken_us = 1, .submitted_us = 2, .first_token_us = 3, .finished_us = 4};
    size_t full_len;
    char *full = kg_events_done(&origin, tok, job, &out, KG_FINISH_REASON_LENGTH, &t, samples, n, 0,
                                &full_len, NULL);
    ck_assert_ptr_nonnull(full);
    ck_assert_uint_gt(full_len, 100000); /* the logprobs dominate */
    free(full);
    size_t out_len;
    const char *out_text = kg_output_text(&out, &out_len);
    const done_case_t cases[] = {
        {full_len, false, false, false}, /* fits as it is */
        {12000, true, false, false},     /* without logprobs: text + metadata fit */
        {8000, true, true, false},       /* the metadata goes too */
        {4096, true, true, true},        /* and the end of the text */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        kg_events_fit_t fit;
        size_t len;
        char *json = kg_events_done(&origin, tok, job, &out, KG_FINISH_REASON_LENGTH, &t, samples,
                                    n, cases[c].budget, &len, &fit);
        ck_assert_ptr_nonnull(json);
        ck_assert_msg(len <= cases[c].budget, "case %zu: %zu > %zu", c, len, cases[c].budget);
        ck_assert(!fit.over_budget);
        ck_assert_int_eq(fit.logprobs_dropped, cases[c].logprobs);
        ck_assert_int_eq(fit.metadata_dropped, cases[c].metadata);
        ck_assert_int_eq(fit.text_bytes_cut > 0, cases[c].text);
        kg_event_t *ev = decode(json, len);
        ck_assert_int_eq(ev->done.logprobs_truncated, cases[c].logprobs);
        ck_assert_int_eq(ev->done.n_logprobs > 0, !cases[c].logprobs);
        ck_assert_int_eq(ev->done.metadata_truncated, cases[c].metadata);
        ck_assert_int_eq(ev->done.metadata_json == NULL, cases[c].metadata);
        ck_assert_int_eq(ev->done.text_truncated, cases[c].text);
        if (cases[c].text) {
            /* a prefix, cut on a character boundary, and the count adds up */
            ck_assert_uint_eq(ev->done.text_len + (size_t)ev->done.text_bytes_cut, out_len);
            ck_assert(valid_utf8_prefix(ev->done.text, ev->done.text_len, out_text));
            ck_assert_uint_eq((size_t)ev->done.text_bytes_cut, fit.text_bytes_cut);
            /* and it is not cut more than needed: a few escaped bytes of room left */
            ck_assert_uint_gt(len, cases[c].budget - 16);
        } else {
            ck_assert_uint_eq(ev->done.text_len, out_len);
        }
        ck_assert_int_eq(ev->done.completion_tokens, n);
        kg_event_free(ev);
        free(json);
    }
    kg_output_clear(&out);
    kg_job_free(job);
    free(samples);
    free(text);
}
END_TEST

/* Budgets from 1 KiB up: the event is always at most the budget, and a
 * cut text is always a prefix on a character boundary. */
START_TEST(done_fits_every_budget) {
    char *text = long_text(3000);
    kg_job_t *job = make_job("", 0);
    kg_output_t out;
    int n;
    make_output(&out, text, NULL, &n);
    size_t out_len;
    const char *out_text = kg_output_text(&out, &out_len);
    kg_job_timing_t t = {0};
    for (size_t budget = 1024; budget < 4200; budget += 37) {
        kg_events_fit_t fit;
        size_t len;
        char *json = kg_events_done(&origin, tok, job, &out, KG_FINISH_REASON_STOP, &t, NULL, 0,
                                    budget, &len, &fit);
        ck_assert_msg(len <= budget, "budget %zu: %zu", budget, len);
        kg_event_t *ev = decode(json, len);
        ck_assert(valid_utf8_prefix(ev->done.text, ev->done.text_len, out_text));
        ck_assert_uint_eq(ev->done.text_len + fit.text_bytes_cut, out_len);
        kg_event_free(ev);
        free(json);
    }
    kg_output_clear(&out);
    kg_job_free(job);
    free(text);
}
END_TEST

/* A reasoning job's done event: the answer in text, the thought in
 * reasoning; under a budget the reasoning is cut from its end first, then
 * the text, each cut counted (reasoning_bytes_cut, text_bytes_cut). */
START_TEST(done_reasoning_cut_before_text) {
    char *thought = long_text(2000), *answer = long_text(600);
    size_t total = strlen(thought) + strlen(answer) + 32;
    char *text = malloc(total);
    ck_assert_ptr_nonnull(text);
    snprintf(text, total, "<think>%s</think>%s", thought, answer);
    kg_job_t *job = make_job(",\"reasoning_format\":\"deepseek\"", 0);
    kg_output_t out;
    int32_t ids[4096];
    int64_t k = kg_tokenizer_encode(tok, text, strlen(text), false, false, ids, 4096);
    kg_output_init(&out, tok, NULL, 0);
    kg_output_think(&out, false);
    kg_output_event_t ev[3];
    for (int64_t i = 0; i < k; i++) {
        ck_assert_int_ge(kg_output_push(&out, ids[i], NULL, ev), 0);
    }
    ck_assert_int_ge(kg_output_finish(&out, ev), 0);
    kg_job_timing_t t = {0};
    bool saw_both_cut = false, saw_reasoning_cut = false;
    for (size_t budget = 800; budget < 3800; budget += 41) {
        kg_events_fit_t fit;
        size_t len;
        char *json = kg_events_done(&origin, tok, job, &out, KG_FINISH_REASON_STOP, &t, NULL, 0,
                                    budget, &len, &fit);
        ck_assert_msg(len <= budget, "budget %zu: %zu", budget, len);
        kg_event_t *e = decode(json, len);
        ck_assert_ptr_nonnull(e->done.r.reasoning);
        ck_assert(valid_utf8_prefix(e->done.r.reasoning, e->done.r.reasoning_len, thought));
        ck_assert(valid_utf8_prefix(e->done.text, e->done.text_len, answer));
        ck_assert_uint_eq(e->done.r.reasoning_len + fit.reasoning_bytes_cut, strlen(thought));
        ck_assert_uint_eq(e->done.text_len + fit.text_bytes_cut, strlen(answer));
        ck_assert_int_eq(e->done.r.reasoning_truncated, fit.reasoning_bytes_cut > 0);
        /* the answer is cut only once the whole thought is gone */
        ck_assert(fit.text_bytes_cut == 0 || e->done.r.reasoning_len == 0);
        saw_both_cut |= fit.text_bytes_cut > 0;
        saw_reasoning_cut |= fit.reasoning_bytes_cut > 0 && fit.text_bytes_cut == 0;
        kg_event_free(e);
        free(json);
    }
    ck_assert(saw_both_cut && saw_reasoning_cut);
    size_t len;
    char *json =
        kg_events_done(&origin, tok, job, &out, KG_FINISH_REASON_STOP, &t, NULL, 0, 0, &len, NULL);
    kg_event_t *e = decode(json, len);
    ck_assert_uint_eq(e->done.r.reasoning_len, strlen(thought));
    ck_assert_uint_eq(e->done.text_len, strlen(answer));
    kg_event_free(e);
    free(json);
    kg_output_clear(&out);
    kg_job_free(job);
    free(text);
    free(thought);
    free(answer);
}
END_TEST

/* n > 1: the done event carries every choice; over budget it sheds every
 * choice's logprobs, the metadata, the top-level text (choice 0's), then
 * cuts each choice's text to a share, marking each cut in its choice. */
START_TEST(done_with_choices_fits) {
    enum { N = 3 };
    char *texts[N] = {long_text(3000), long_text(1200), long_text(200)};
    kg_job_t *job = make_job(",\"n\":3,\"logprobs\":2,\"stream\":false", 500);
    kg_output_t out[N];
    kg_sample_result_t *samples[N];
    kg_events_choice_t ch[N];
    int n[N];
    for (int c = 0; c < N; c++) {
        samples[c] = malloc(4096 * sizeof(kg_sample_result_t));
        make_output(&out[c], texts[c], samples[c], &n[c]);
        ch[c] =
            (kg_events_choice_t){.out = &out[c],
                                 .reason = c == 2 ? KG_FINISH_REASON_STOP : KG_FINISH_REASON_LENGTH,
                                 .samples = samples[c],
                                 .n_samples = n[c]};
    }
    kg_job_timing_t t = {.taken_us = 1, .submitted_us = 2, .first_token_us = 3, .finished_us = 4};
    const size_t budgets[] = {0, 20000, 4096, 2048};
    for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
        kg_events_fit_t fit;
        size_t len;
        char *json = kg_events_done_choices(&origin, tok, job, ch, N, &t, budgets[b], &len, &fit);
        ck_assert_ptr_nonnull(json);
        ck_assert(budgets[b] == 0 || len <= budgets[b]);
        ck_assert(!fit.over_budget);
        kg_event_t *ev = decode(json, len);
        ck_assert_int_eq(ev->done.n_choices, N);
        ck_assert_int_eq(ev->done.completion_tokens, n[0] + n[1] + n[2]);
        ck_assert_int_eq(ev->done.logprobs_truncated, budgets[b] != 0);
        for (int c = 0; c < N; c++) {
            const kg_event_choice_t *x = &ev->done.choices[c];
            size_t olen;
            const char *otext = kg_output_text(&out[c], &olen);
            ck_assert_int_eq(x->index, c);
            ck_assert_int_eq(x->completion_tokens, n[c]);
            ck_assert_int_eq(x->n_logprobs, budgets[b] == 0 ? n[c] : 0);
            ck_assert(valid_utf8_prefix(x->text, x->text_len, otext));
            ck_assert_uint_eq(x->text_len + (size_t)x->text_bytes_cut, olen);
            ck_assert_int_eq(x->text_truncated, x->text_bytes_cut > 0);
            if (budgets[b] == 2048) {
                ck_assert(c == 2 || x->text_truncated); /* the short one may keep its text */
            }
        }
        ck_assert_int_eq(ev->done.choices[2].finish_reason, KG_FINISH_REASON_STOP);
        kg_event_free(ev);
        free(json);
    }
    for (int c = 0; c < N; c++) {
        kg_output_clear(&out[c]);
        free(samples[c]);
        free(texts[c]);
    }
    kg_job_free(job);
}
END_TEST

/* A job without tools on a gpt-oss model (toolfmt set by kg_intake for its Harmony channels):
 * the analysis channel is the reasoning, the final channel the text, and a call the model
 * writes anyway is dropped (no tool_calls, finish_reason stays "stop"). */
START_TEST(done_harmony_without_tools) {
    static const struct {
        const char *out, *text, *reasoning;
    } cases[] = {
        {"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
         "<|message|>Done.",
         "Done.", "Think."},
        {"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.f <|constrain|>json<|message|>{}<|end|>",
         "", "Think."},
        {"Just text.", "Just text.", NULL},
    };
    kg_job_t *job = make_job("", 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_output_t out;
        int n;
        make_output(&out, cases[i].out, NULL, &n);
        kg_events_choice_t ch = {
            .out = &out, .reason = KG_FINISH_REASON_STOP, .toolfmt = KG_TOOLFMT_GPT_OSS};
        kg_job_timing_t t = {
            .taken_us = 1, .submitted_us = 2, .first_token_us = 3, .finished_us = 4};
        kg_events_fit_t fit;
        size_t len;
        char *json = kg_events_done_choices(&origin, tok, job, &ch, 1, &t, 0, &len, &fit);
        ck_assert_ptr_nonnull(json);
        kg_event_t *ev = decode(json, len);
        ck_assert_int_eq(ev->done.finish_reason, KG_FINISH_REASON_STOP);
        ck_assert_uint_eq(ev->done.n_tool_calls, 0);
        ck_assert_uint_eq(ev->done.text_len, strlen(cases[i].text));
        ck_assert(memcmp(ev->done.text, cases[i].text, ev->done.text_len) == 0);
        if (cases[i].reasoning) {
            ck_assert_uint_eq(ev->done.r.reasoning_len, strlen(cases[i].reasoning));
            ck_assert(memcmp(ev->done.r.reasoning, cases[i].reasoning, ev->done.r.reasoning_len) ==
                      0);
        } else {
            ck_assert_ptr_null(ev->done.r.reasoning);
        }
        kg_event_free(ev);
        free(json);
        kg_output_clear(&out);
    }
    kg_job_free(job);
}
END_TEST

START_TEST(token_sheds_logprobs_then_text) {
    char *text = long_text(2000);
    kg_job_t *job = make_job(",\"logprobs\":20", 0);
    kg_output_t out;
    int n;
    make_output(&out, text, NULL, &n);
    size_t out_len;
    kg_output_text(&out, &out_len);
    kg_sample_result_t s = {.token = 100, .logprob = -1, .n_top = KG_MAX_LOGPROBS};
    for (int j = 0; j < KG_MAX_LOGPROBS; j++) {
        s.top_token[j] = 200 + j;
    }
    /* one event that carries the whole text (as a release at the end can) */
    kg_output_event_t oe = {
        .index = 5, .token_id = 100, .text_off = 0, .text_len = out_len, .sample = s};
    size_t full_len, len;
    kg_events_fit_t fit;
    char *json = kg_events_token(&origin, tok, job, 0, &out, &oe, 0, &full_len, &fit);
    free(json);
    json = kg_events_token(&origin, tok, job, 0, &out, &oe, full_len - 1, &len, &fit);
    ck_assert_uint_le(len, full_len - 1);
    ck_assert(fit.logprobs_dropped && fit.text_bytes_cut == 0);
    kg_event_t *ev = decode(json, len);
    ck_assert(ev->token.logprobs_truncated && !ev->token.has_logprobs);
    ck_assert(!ev->token.text_truncated);
    kg_event_free(ev);
    free(json);
    json = kg_events_token(&origin, tok, job, 0, &out, &oe, 1024, &len, &fit);
    ck_assert_uint_le(len, 1024);
    ev = decode(json, len);
    ck_assert(ev->token.logprobs_truncated && ev->token.text_truncated);
    ck_assert_uint_eq(ev->token.text_len + (size_t)ev->token.text_bytes_cut, out_len);
    kg_event_free(ev);
    free(json);
    kg_output_clear(&out);
    kg_job_free(job);
    free(text);
}
END_TEST

START_TEST(error_sheds_metadata) {
    kg_job_t *job = make_job("", 20000);
    size_t len;
    kg_events_fit_t fit;
    char *json = kg_events_error(&origin, job->request_id, KG_ERROR_EXPIRED, "late",
                                 job->metadata_json, 0, &len, &fit);
    ck_assert_uint_gt(len, 20000);
    ck_assert(!fit.metadata_dropped);
    free(json);
    json = kg_events_error(&origin, job->request_id, KG_ERROR_EXPIRED, "late", job->metadata_json,
                           4096, &len, &fit);
    ck_assert_uint_le(len, 4096);
    ck_assert(fit.metadata_dropped && !fit.over_budget);
    kg_event_t *ev = decode(json, len);
    ck_assert(ev->error.metadata_truncated);
    ck_assert_ptr_null(ev->error.metadata_json);
    ck_assert_str_eq(ev->error.message, "late");
    kg_event_free(ev);
    free(json);
    kg_job_free(job);
}
END_TEST

/* At intake: metadata alone over the budget can never be echoed, so the job
 * is refused with invalid_job (and its error event does not echo it). One
 * byte under the budget, it runs. */
START_TEST(intake_refuses_metadata_over_budget) {
    kg_test_model_opts_t mo = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 64, .seed = 1};
    const char *path = kg_test_make_model(&mo);
    ck_assert_ptr_nonnull(path);
    char err[256];
    kg_model_t *model = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(model != NULL, "%s", err);
    unlink(path);
    kg_intake_limits_t lim = {.max_seq_len = 64, .max_tokens_limit = 16, .max_event_bytes = 8192};
    kg_job_t *job = make_job(",\"max_tokens\":4", 8192);
    size_t meta = strlen(job->metadata_json);
    ck_assert_uint_gt(meta, 8192);
    kg_jobrun_t run;
    kg_error_code_t code;
    char msg[256];
    ck_assert_int_eq(kg_jobrun_start(&run, model, &lim, job, 0, 0, &code, msg, sizeof(msg)),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_INVALID_JOB);
    ck_assert_msg(strstr(msg, "metadata:") && strstr(msg, "8192"), "%s", msg);
    size_t len;
    char *json = kg_events_error(&origin, run.job->request_id, code, msg, run.job->metadata_json,
                                 lim.max_event_bytes, &len, NULL);
    ck_assert_uint_le(len, 8192);
    ck_assert_ptr_null(strstr(json, "mmmm"));
    ck_assert_ptr_nonnull(strstr(json, "\"metadata_truncated\":true"));
    free(json);
    kg_jobrun_clear(&run);

    lim.max_event_bytes = meta;
    job = make_job(",\"max_tokens\":4", 8192);
    ck_assert_int_eq(kg_jobrun_start(&run, model, &lim, job, 0, 0, &code, msg, sizeof(msg)), KG_OK);
    kg_jobrun_clear(&run);

    /* an error message quotes what the job sent, not a clamped value */
    job = make_job(",\"max_tokens\":1000000000000", 0);
    ck_assert_int_eq(kg_jobrun_start(&run, model, &lim, job, 0, 0, &code, msg, sizeof(msg)),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_MAX_TOKENS_TOO_LARGE);
    ck_assert_str_eq(msg, "max_tokens 1000000000000 exceeds this worker's limit of 16");
    kg_jobrun_clear(&run);
    kg_model_free(model);
}
END_TEST

/* A small model, and a job of 4 tokens started on it. */
static kg_model_t *start_small(kg_jobrun_t *run) {
    kg_test_model_opts_t mo = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 64, .seed = 1};
    const char *path = kg_test_make_model(&mo);
    ck_assert_ptr_nonnull(path);
    char err[256];
    kg_model_t *model = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(model != NULL, "%s", err);
    unlink(path);
    kg_intake_limits_t lim = {.max_seq_len = 64, .max_tokens_limit = 16, .max_event_bytes = 8192};
    kg_error_code_t code;
    char msg[256];
    ck_assert_int_eq(kg_jobrun_start(run, model, &lim, make_job(",\"max_tokens\":4", 0), 0, 0,
                                     &code, msg, sizeof(msg)),
                     KG_OK);
    return model;
}

/* The terminal event of a one-choice job whose engine finish is `finish`
 * (the caller frees it; the outcome in *oc). */
static char *terminal_after(kg_finish_t finish, kg_jobrun_outcome_t *oc) {
    kg_jobrun_t run;
    kg_model_t *model = start_small(&run);
    kg_completion_t c;
    memset(&c, 0, sizeof(c));
    c.token = -1;
    c.finish = finish;
    kg_jobrun_step_t js;
    ck_assert_int_eq(kg_jobrun_on_completion(&run, &c, 1000, &js), KG_OK);
    ck_assert(js.finished);
    size_t len;
    char *json = kg_jobrun_terminal(&run, &origin, model->tok, 8192, &len, oc);
    ck_assert_ptr_nonnull(json);
    kg_jobrun_clear(&run);
    kg_model_free(model);
    return json;
}

/* A request the engine refused although intake let it through: a mismatch
 * between the two, not the job's fault, so `internal` (never invalid_job),
 * naming the engine's status; kgen-worker and kgen batch both come here. */
START_TEST(engine_refusal_is_internal) {
    kg_jobrun_t run;
    kg_model_t *model = start_small(&run);
    size_t len;
    kg_jobrun_outcome_t oc;
    char *json = kg_jobrun_refused(&run, &origin, KG_ERR_INVALID, 8192, &len, &oc);
    ck_assert_ptr_nonnull(json);
    ck_assert(oc.is_error);
    ck_assert_int_eq(oc.code, KG_ERROR_INTERNAL);
    ck_assert_uint_eq(len, strlen(json));
    ck_assert_ptr_nonnull(strstr(json, "\"code\":\"internal\""));
    ck_assert_ptr_nonnull(strstr(json, "the engine refused the request: "));
    ck_assert_ptr_nonnull(strstr(json, "\"type\":\"error\""));
    free(json);
    kg_jobrun_clear(&run);
    kg_model_free(model);
}
END_TEST

/* A job the backend could not run (the engine's KG_FINISH_ERROR) ends with
 * an internal error event; kgen-worker and kgen batch both come here. */
START_TEST(backend_failure_is_internal) {
    kg_jobrun_outcome_t oc;
    char *json = terminal_after(KG_FINISH_ERROR, &oc);
    ck_assert(oc.is_error);
    ck_assert_int_eq(oc.code, KG_ERROR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(json, "\"code\":\"internal\""));
    ck_assert_ptr_nonnull(strstr(json, "the backend failed on this job"));
    free(json);
}
END_TEST

/* A constrained choice at a dead end of its grammar (the engine's
 * KG_FINISH_GRAMMAR: no token of the vocabulary continues it) ends the job
 * with invalid_schema, not a done event whose text would not match. */
START_TEST(grammar_dead_end_is_invalid_schema) {
    kg_jobrun_outcome_t oc;
    char *json = terminal_after(KG_FINISH_GRAMMAR, &oc);
    ck_assert(oc.is_error);
    ck_assert_int_eq(oc.code, KG_ERROR_INVALID_SCHEMA);
    ck_assert_ptr_nonnull(strstr(json, "\"code\":\"invalid_schema\""));
    ck_assert_ptr_nonnull(strstr(json, "cannot satisfy the job's constraint"));
    free(json);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("events");
    TCase *tc = tcase_create("fit");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, done_sheds_in_order);
    tcase_add_test(tc, attempt_on_every_event);
    tcase_add_test(tc, done_fits_every_budget);
    tcase_add_test(tc, done_reasoning_cut_before_text);
    tcase_add_test(tc, done_with_choices_fits);
    tcase_add_test(tc, done_harmony_without_tools);
    tcase_add_test(tc, token_sheds_logprobs_then_text);
    tcase_add_test(tc, error_sheds_metadata);
    tcase_add_test(tc, intake_refuses_metadata_over_budget);
    tcase_add_test(tc, backend_failure_is_internal);
    tcase_add_test(tc, grammar_dead_end_is_invalid_schema);
    tcase_add_test(tc, engine_refusal_is_internal);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
