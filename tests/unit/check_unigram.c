/* check_unigram: the SentencePiece unigram ("t5") tokenizer against
 * llama.cpp's llama-tokenize on an XLM-RoBERTa vocabulary
 * (tokenizer-vectors/ggml-vocab-xlm-r.gguf: the real file's charsmap and
 * the pieces its strings need, made by scripts/goldens/ugm-vectors.py),
 * with and without BOS/EOS and special-token parsing; the defaults of a
 * file without the optional keys; decoding; broken charsmaps; and a bert
 * encoder with this vocabulary embedding as llama.cpp's llama-embedding
 * does (tokenizer-vectors/xlm-r-bert.golden, scripts/goldens/ugm-embed.sh). */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_engine.h"
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_model.h"
#include "model/kg_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

static kg_tokenizer_t *load_xlmr(void) {
    const char *path = kg_test_data("tokenizer-vectors/ggml-vocab-xlm-r.gguf");
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", path, err);
    kg_tokenizer_t *tok = kg_tokenizer_new(g, err, sizeof(err));
    ck_assert_msg(tok != NULL, "%s: %s", path, err);
    kg_gguf_free(g);
    return tok;
}

static int32_t *encode(const kg_tokenizer_t *tok,
                       const char *s,
                       size_t len,
                       bool add_special,
                       bool parse_special,
                       int64_t *n) {
    const int64_t need = kg_tokenizer_encode(tok, s, len, add_special, parse_special, NULL, 0);
    ck_assert_int_ge(need, 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    ck_assert_int_eq(kg_tokenizer_encode(tok, s, len, add_special, parse_special, ids, need), need);
    *n = need;
    return ids;
}

/* Each string of the .inp file (followed by "\n__ggml_vocab_test__\n")
 * against its line of ids in the file with `suffix`; returns the count. */
static int check_vectors(const char *suffix, bool special) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    kg_tokenizer_t *tok = load_xlmr();
    ck_assert_int_eq(kg_tokenizer_kind(tok), KG_TOKENIZER_UGM);
    char rel[128];
    snprintf(rel, sizeof(rel), "tokenizer-vectors/ggml-vocab-xlm-r.gguf%s", suffix);
    size_t n_in, n_out;
    char *inp =
        kg_test_read_file(kg_test_data("tokenizer-vectors/ggml-vocab-xlm-r.gguf.inp"), &n_in);
    char *out = kg_test_read_file(kg_test_data(rel), &n_out);
    ck_assert(inp && out);
    char *p = inp, *line = out;
    int n = 0, pass = 0;
    while (p < inp + n_in) {
        char *s = strstr(p, sep);
        ck_assert(s != NULL);
        char *nl = strchr(line, '\n');
        ck_assert_msg(nl != NULL, "%s: fewer lines than strings", rel);
        *nl = '\0';
        int32_t want[1024];
        int64_t n_want = 0;
        for (char *q = line, *end;; q = end) {
            const long v = strtol(q, &end, 10);
            if (end == q) {
                break;
            }
            ck_assert_int_lt(n_want, 1024);
            want[n_want++] = (int32_t)v;
        }
        int64_t n_got;
        int32_t *got = encode(tok, p, (size_t)(s - p), special, special, &n_got);
        if (n_got == n_want && memcmp(got, want, (size_t)n_got * sizeof(int32_t)) == 0) {
            pass++;
        } else {
            fprintf(stderr, "xlm-r%s: string %d differs: got", suffix, n);
            for (int64_t i = 0; i < n_got; i++) {
                fprintf(stderr, " %d", got[i]);
            }
            fprintf(stderr, ", want %s\n", line);
        }
        free(got);
        n++;
        p = s + strlen(sep);
        line = nl + 1;
    }
    ck_assert_msg(line == out + n_out, "%s: more lines than strings", rel);
    printf("unigram vectors xlm-r%s: %d/%d\n", suffix, pass, n);
    ck_assert_int_eq(pass, n);
    free(inp);
    free(out);
    kg_tokenizer_free(tok);
    return n;
}

START_TEST(xlmr_vectors) {
    ck_assert_int_ge(check_vectors(".out", false), 60);
}
END_TEST

/* <s> ... </s> around the text, special tokens parsed (<mask> takes the
 * spaces before it in this nomic-bert-moe file, as llama.cpp sets it). */
START_TEST(xlmr_vectors_special) {
    ck_assert_int_ge(check_vectors(".out-special", true), 60);
}
END_TEST

START_TEST(xlmr_keys_and_decoding) {
    kg_tokenizer_t *tok = load_xlmr();
    ck_assert(kg_tokenizer_add_bos(tok));
    ck_assert(kg_tokenizer_add_eos(tok));
    ck_assert_int_eq(kg_tokenizer_bos(tok), kg_tokenizer_find(tok, "<s>", 3));
    ck_assert_int_eq(kg_tokenizer_eos(tok), kg_tokenizer_find(tok, "</s>", 4));
    ck_assert(kg_tokenizer_is_control(tok, kg_tokenizer_bos(tok)));
    // full-width letters and the ideographic space fold through the charsmap;
    // spaces are one "▁" before each word (remove_extra_whitespaces)
    static const char text[] = "  \xef\xbc\xa8\xef\xbd\x85llo\xe3\x80\x80 world  ";
    int64_t n;
    int32_t *ids = encode(tok, text, strlen(text), false, false, &n);
    char buf[256];
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        o += kg_tokenizer_piece(tok, ids[i], false, buf + o, sizeof(buf) - o);
    }
    ck_assert_uint_lt(o, sizeof(buf));
    buf[o] = '\0';
    ck_assert_str_eq(buf, " Hello world");
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- hand-made vocabularies ----

typedef struct mini {
    const uint8_t *charsmap;
    size_t charsmap_len;
    int n_tokens; /* of the built-in token list below */
    int unk;      /* -1: no tokenizer.ggml.unknown_token_id */
} mini_t;

/* <pad> </s> <unk> ▁ a b ab ▁ab c: llama.cpp's default ids (pad 0, EOS 1, UNK 2). */
static kg_tokenizer_t *make_mini(const mini_t *m) {
    static const char *const toks[] = {"<pad>", "</s>",           "<unk>", "\xe2\x96\x81", "a", "b",
                                       "ab",    "\342\226\201ab", "c"};
    static const float scores[] = {0, 0, 0, -2.0f, -3.0f, -3.0f, -4.0f, -3.5f, -9.0f};
    static const int32_t types[] = {3, 3, 2, 1, 1, 1, 1, 1, 1};
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    kg_gguf_str_t strs[9];
    for (int i = 0; i < m->n_tokens; i++) {
        strs[i] = (kg_gguf_str_t){toks[i], strlen(toks[i])};
    }
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, (uint64_t)m->n_tokens);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)m->n_tokens);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)m->n_tokens);
    if (m->charsmap) {
        kg_gguf_writer_set_arr(w, "tokenizer.ggml.precompiled_charsmap", KG_GGUF_TYPE_UINT8,
                               m->charsmap, m->charsmap_len);
    }
    if (m->unk >= 0) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)m->unk);
    }
    uint8_t *data;
    size_t size;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &data, &size), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_t *g = kg_gguf_open_memory(data, size, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    err[0] = '\0';
    kg_tokenizer_t *tok = kg_tokenizer_new(g, err, sizeof(err));
    kg_gguf_free(g);
    free(data);
    return tok;
}

/* Without the optional keys: llama.cpp's UGM defaults (EOS added, no BOS,
 * no space prefix, every space its own "▁"), no charsmap, the Viterbi's
 * best path, and unknown characters folded into one <unk>. */
START_TEST(mini_defaults) {
    const mini_t m = {NULL, 0, 9, -1};
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    ck_assert(!kg_tokenizer_add_bos(tok));
    ck_assert(kg_tokenizer_add_eos(tok));
    ck_assert_int_eq(kg_tokenizer_bos(tok), -1);
    ck_assert_int_eq(kg_tokenizer_eos(tok), 1);
    int64_t n;
    // "ab": "ab" (-4) beats "a" + "b" (-6); " ab": "▁ab" (-3.5) beats "▁" + "ab" (-6)
    int32_t *ids = encode(tok, "ab ab  c", 8, true, false, &n);
    const int32_t want[] = {6, 7, 3, 3, 8, 1};
    ck_assert_int_eq(n, 6);
    ck_assert_mem_eq(ids, want, sizeof(want));
    free(ids);
    // "xyz" are not pieces: one <unk> (2) for the run, at min score - 10 each
    ids = encode(tok, "axyzb", 5, false, false, &n);
    const int32_t want2[] = {4, 2, 5};
    ck_assert_int_eq(n, 3);
    ck_assert_mem_eq(ids, want2, sizeof(want2));
    free(ids);
    ck_assert_int_eq(kg_tokenizer_encode(tok, "", 0, false, false, NULL, 0), 0);
    kg_tokenizer_free(tok);
}
END_TEST

START_TEST(mini_errors) {
    // no unknown token: llama.cpp's default id 2 is out of range
    mini_t m = {NULL, 0, 2, -1};
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_msg(strstr(err, "unknown token") != NULL, "%s", err);
    // a charsmap whose array size runs past its end
    static const uint8_t big[] = {0xff, 0, 0, 0, 1, 2, 3, 4};
    m = (mini_t){big, sizeof(big), 9, -1};
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_msg(strstr(err, "precompiled_charsmap") != NULL, "%s", err);
    static const uint8_t tiny[] = {0, 0};
    m = (mini_t){tiny, sizeof(tiny), 9, -1};
    ck_assert_ptr_null(make_mini(&m));
    // a charsmap whose root points outside its array: the file loads (as in
    // llama.cpp) but text cannot be tokenized, and says so with -1
    static const uint8_t wild[] = {4, 0, 0, 0, 0x00, 0xfc, 0xff, 0x7f, 'x', 0};
    m = (mini_t){wild, sizeof(wild), 9, -1};
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    ck_assert_int_eq(kg_tokenizer_encode(tok, "ab", 2, false, false, NULL, 0), -1);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- a bert with this vocabulary, end to end ----

/* The golden's texts and CLS vectors against kgen's: the model remade with
 * the golden's `kgen mkmodel` arguments, each text tokenized as an embed
 * job does (<s> ... </s>) and run through the engine on the CPU backend. */
START_TEST(xlmr_bert_embeds) {
    size_t len;
    char *gold = kg_test_read_file(kg_test_data("tokenizer-vectors/xlm-r-bert.golden"), &len);
    ck_assert(gold != NULL);
    char args[1024] = "", *texts[8];
    float *vecs[8];
    int n = 0, n_vec = 0, dim = 0;
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        char *end;
        if (strncmp(line, "# kgen mkmodel ", 15) == 0) {
            // the vocabulary path, relative to the source tree in the golden
            const char *v = strstr(line, "--vocab-from ");
            ck_assert(v != NULL);
            snprintf(args, sizeof(args), "%.*s--vocab-from %s", (int)(v - line - 15), line + 15,
                     kg_test_data("tokenizer-vectors/ggml-vocab-xlm-r.gguf"));
        } else if (strncmp(line, "text ", 5) == 0) {
            // "text I <the text as is, leading spaces included>"
            const long i = strtol(line + 5, &end, 10);
            ck_assert(i == n && n < 8 && *end == ' ');
            texts[n++] = end + 1;
        } else if (strncmp(line, "vec ", 4) == 0) {
            // "vec I DIM v..."
            const long i = strtol(line + 4, &end, 10);
            ck_assert(i == n_vec && i < n);
            char *q = end;
            dim = (int)strtol(q, &end, 10);
            ck_assert(end != q && dim > 0 && dim <= 4096);
            vecs[n_vec] = malloc((size_t)dim * sizeof(float));
            q = end;
            for (int k = 0; k < dim; k++, q = end) {
                vecs[n_vec][k] = strtof(q, &end);
                ck_assert(end != q);
            }
            n_vec++;
        }
    }
    ck_assert_int_ge(n, 3);
    ck_assert_int_eq(n_vec, n);
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("xlmr-bert"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    char e[512];
    kg_model_t *m = kg_model_load(path, e, sizeof(e));
    ck_assert_msg(m != NULL, "%s", e);
    remove(path);
    ck_assert_int_eq(kg_tokenizer_kind(m->tok), KG_TOKENIZER_UGM);
    ck_assert_int_eq(m->hp.n_embd, dim);

    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = 8;
    ep.max_queue_depth = 128;
    ep.max_batch_tokens = 256;
    ep.max_seq_len = 512;
    ep.n_kv_blocks = 8 * 512 / ep.kv_block_size;
    kg_backend_params_t bp = {.n_threads = 1,
                              .n_kv_blocks = ep.n_kv_blocks,
                              .kv_block_size = ep.kv_block_size,
                              .max_batch_tokens = 256,
                              .max_seq_len = 512};
    kg_backend_t *be = kg_backend_cpu_new(m, &bp, e, sizeof(e));
    ck_assert_msg(be != NULL, "%s", e);
    kg_engine_t *eng = kg_engine_new(be, &ep, e, sizeof(e));
    ck_assert_msg(eng != NULL, "%s", e);
    float *row = malloc((size_t)dim * sizeof(float));
    const int32_t cap = kg_engine_max_completions(eng);
    kg_completion_t *c = malloc((size_t)cap * sizeof(*c));
    for (int t = 0; t < n; t++) {
        int64_t n_ids;
        int32_t *ids = encode(m->tok, texts[t], strlen(texts[t]), true, true, &n_ids);
        ck_assert_int_eq(ids[0], kg_tokenizer_bos(m->tok));
        ck_assert_int_eq(ids[n_ids - 1], kg_tokenizer_eos(m->tok));
        const int32_t one = (int32_t)n_ids;
        kg_request_t req = {.id = (uint64_t)t + 1,
                            .prompt = ids,
                            .n_prompt = one,
                            .max_tokens = 1,
                            .n_inputs = 1,
                            .input_len = &one,
                            .pool = KG_ENGINE_POOL_FIRST,
                            .embd = row};
        ck_assert_int_eq(kg_engine_submit(eng, &req), KG_OK);
        while (kg_engine_busy(eng)) {
            ck_assert_int_ge(kg_engine_step(eng, c, cap), 0);
        }
        double dot = 0, na = 0, nb = 0;
        for (int k = 0; k < dim; k++) {
            dot += (double)row[k] * vecs[t][k];
            na += (double)row[k] * row[k];
            nb += (double)vecs[t][k] * vecs[t][k];
        }
        const double cos = dot / sqrt(na * nb);
        printf("xlm-r bert text %d (%lld ids): cosine %.7f\n", t, (long long)n_ids, cos);
        ck_assert_msg(cos >= 0.9999, "text %d: cosine %f with llama.cpp's vector", t, cos);
        free(ids);
        free(vecs[t]);
    }
    free(row);
    free(c);
    kg_engine_free(eng);
    kg_backend_free(be);
    kg_model_free(m);
    free(gold);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("unigram");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, xlmr_vectors);
    tcase_add_test(tc, xlmr_vectors_special);
    tcase_add_test(tc, xlmr_keys_and_decoding);
    tcase_add_test(tc, mini_defaults);
    tcase_add_test(tc, mini_errors);
    tcase_add_test(tc, xlmr_bert_embeds);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
