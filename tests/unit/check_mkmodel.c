/* check_mkmodel: `kgen mkmodel` run as a program: the keys and shapes
 * llama.cpp expects, weight types and ranges, byte-for-byte determinism,
 * vocabulary copying, and usage errors (exit 2). */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_mkmodel.h"
#include "model/kg_model.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

/** Run `kgen mkmodel ARGS` (stderr folded into the output); returns the exit
 * status and frees the output unless `out` takes it. */
static int mkmodel(const char *args, char **out) {
    char cmd[16384];
    snprintf(cmd, sizeof(cmd), "%s/kgen mkmodel %s 2>&1", KG_BIN_DIR, args);
    int status;
    char *o = kg_test_run(cmd, &status);
    if (out) {
        *out = o;
    } else {
        free(o);
    }
    return status;
}

/** Write a model into a fresh temp file; returns its path (static per call site style). */
static const char *make(const char *name, const char *args) {
    static char paths[8][4096];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, sizeof(paths[0]), "%s.gguf", kg_test_tmp_path(name));
    char full[12000];
    snprintf(full, sizeof(full), "--out '%s' %s", path, args);
    char *out;
    int st = mkmodel(full, &out);
    ck_assert_msg(st == 0, "mkmodel %s: exit %d: %s", args, st, out);
    ck_assert_msg(strstr(out, "kgen mkmodel: wrote ") != NULL, "output: %s", out);
    ck_assert_msg(strchr(out, '\n') == strrchr(out, '\n'), "more than one line: %s", out);
    free(out);
    return path;
}

static uint32_t u32_of(const kg_gguf_t *g, const char *key) {
    uint32_t v = 0xdeadbeef;
    ck_assert_msg(kg_gguf_get_u32(g, key, &v), "missing %s", key);
    return v;
}

static bool str_is(kg_gguf_str_t s, const char *want) {
    return s.len == strlen(want) && memcmp(s.data, want, s.len) == 0;
}

static const kg_gguf_tensor_t *
expect_tensor(const kg_gguf_t *g, const char *name, kg_ggml_type_t type, int64_t ne0, int64_t ne1) {
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
    ck_assert_msg(t != NULL, "no tensor %s", name);
    ck_assert_msg(t->type == type, "%s: type %s", name, kg_ggml_type_name(t->type));
    ck_assert_uint_eq(t->n_dims, ne1 ? 2 : 1);
    ck_assert_msg(t->ne[0] == ne0 && t->ne[1] == (ne1 ? ne1 : 1), "%s: shape %lld x %lld", name,
                  (long long)t->ne[0], (long long)t->ne[1]);
    return t;
}

/** Check every key and tensor of a model made with the built-in vocabulary. */
static void check_model(const char *path,
                        int n_embd,
                        int n_layer,
                        int n_head,
                        int n_head_kv,
                        int n_ff,
                        int head_dim,
                        bool tied,
                        kg_ggml_type_t wt,
                        kg_ggml_type_t head_type,
                        uint32_t ftype) {
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "general.architecture", &s) && str_is(s, "llama"));
    ck_assert(kg_gguf_get_str(g, "general.name", &s));
    ck_assert_uint_eq(u32_of(g, "llama.embedding_length"), n_embd);
    ck_assert_uint_eq(u32_of(g, "llama.block_count"), n_layer);
    ck_assert_uint_eq(u32_of(g, "llama.feed_forward_length"), n_ff);
    ck_assert_uint_eq(u32_of(g, "llama.attention.head_count"), n_head);
    ck_assert_uint_eq(u32_of(g, "llama.attention.head_count_kv"), n_head_kv);
    ck_assert_uint_eq(u32_of(g, "llama.rope.dimension_count"), head_dim);
    ck_assert_uint_eq(u32_of(g, "general.file_type"), ftype);
    ck_assert_uint_eq(u32_of(g, "general.alignment"), 32);
    if (head_dim * n_head != n_embd) {
        ck_assert_uint_eq(u32_of(g, "llama.attention.key_length"), head_dim);
        ck_assert_uint_eq(u32_of(g, "llama.attention.value_length"), head_dim);
    } else {
        ck_assert_int_eq(kg_gguf_find_key(g, "llama.attention.key_length"), -1);
    }
    float eps;
    ck_assert(kg_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps) && eps == 1e-5f);

    uint32_t n_vocab = u32_of(g, "llama.vocab_size");
    kg_gguf_type_t et;
    uint64_t n;
    ck_assert(kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) && n == n_vocab);

    int64_t q_dim = (int64_t)n_head * head_dim, kv_dim = (int64_t)n_head_kv * head_dim;
    ck_assert_int_eq(kg_gguf_n_tensors(g), (tied ? 2 : 3) + 9 * n_layer);
    const kg_gguf_tensor_t *emb =
        expect_tensor(g, "token_embd.weight", tied ? head_type : wt, n_embd, (int64_t)n_vocab);
    expect_tensor(g, "output_norm.weight", KG_GGML_TYPE_F32, n_embd, 0);
    if (tied) {
        ck_assert_ptr_null(kg_gguf_find_tensor(g, "output.weight"));
    } else {
        expect_tensor(g, "output.weight", head_type, n_embd, (int64_t)n_vocab);
    }
    char name[64];
    for (int l = 0; l < n_layer; l++) {
        snprintf(name, sizeof(name), "blk.%d.attn_norm.weight", l);
        const kg_gguf_tensor_t *norm = expect_tensor(g, name, KG_GGML_TYPE_F32, n_embd, 0);
        snprintf(name, sizeof(name), "blk.%d.attn_q.weight", l);
        const kg_gguf_tensor_t *wq = expect_tensor(g, name, wt, n_embd, q_dim);
        snprintf(name, sizeof(name), "blk.%d.attn_k.weight", l);
        expect_tensor(g, name, wt, n_embd, kv_dim);
        snprintf(name, sizeof(name), "blk.%d.attn_v.weight", l);
        expect_tensor(g, name, wt, n_embd, kv_dim);
        snprintf(name, sizeof(name), "blk.%d.attn_output.weight", l);
        expect_tensor(g, name, wt, q_dim, n_embd);
        snprintf(name, sizeof(name), "blk.%d.ffn_norm.weight", l);
        expect_tensor(g, name, KG_GGML_TYPE_F32, n_embd, 0);
        snprintf(name, sizeof(name), "blk.%d.ffn_gate.weight", l);
        expect_tensor(g, name, wt, n_embd, n_ff);
        snprintf(name, sizeof(name), "blk.%d.ffn_up.weight", l);
        expect_tensor(g, name, wt, n_embd, n_ff);
        snprintf(name, sizeof(name), "blk.%d.ffn_down.weight", l);
        expect_tensor(g, name, wt, n_ff, n_embd);

        // value ranges: norms 1 +- 0.1, q within the fan-in bound, both varied
        float *v = malloc((size_t)(n_embd * q_dim) * sizeof(float));
        kg_dequantize(norm->type, norm->data, v, n_embd);
        float lo = 9, hi = -9;
        for (int i = 0; i < n_embd; i++) {
            lo = fminf(lo, v[i]);
            hi = fmaxf(hi, v[i]);
        }
        ck_assert(lo >= 0.899f && hi <= 1.101f && hi - lo > 0.05f);
        kg_dequantize(wq->type, wq->data, v, n_embd * q_dim);
        float bound = sqrtf(3.0f / (float)n_embd) * 1.01f, amax = 0;
        double sum = 0;
        for (int64_t i = 0; i < n_embd * q_dim; i++) {
            amax = fmaxf(amax, fabsf(v[i]));
            sum += v[i];
        }
        ck_assert_msg(amax <= bound && amax > bound * 0.5f, "attn_q amax %g bound %g", (double)amax,
                      (double)bound);
        ck_assert(fabs(sum / (double)(n_embd * q_dim)) < bound * 0.2);
        free(v);
    }
    // embeddings in [-1, 1], mean near zero
    float *e = malloc((size_t)n_embd * n_vocab * sizeof(float));
    kg_dequantize(emb->type, emb->data, e, (int64_t)n_embd * n_vocab);
    double sum = 0;
    float amax = 0;
    for (int64_t i = 0; i < (int64_t)n_embd * n_vocab; i++) {
        sum += e[i];
        amax = fmaxf(amax, fabsf(e[i]));
    }
    ck_assert(amax <= 1.01f && amax > 0.9f);
    ck_assert(fabs(sum / ((double)n_embd * n_vocab)) < 0.05);
    free(e);
    kg_gguf_free(g);
}

static void check_builtin_vocab(const char *path) {
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_uint_eq(u32_of(g, "llama.vocab_size"), 259);
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "tokenizer.ggml.model", &s) && str_is(s, "llama"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 0), "<unk>"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 1), "<s>"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 2), "</s>"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 3), "<0x00>"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 3 + 0x0a), "<0x0A>"));
    ck_assert(str_is(kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 258), "<0xFF>"));
    int32_t types[259];
    float scores[259];
    ck_assert(kg_gguf_arr_i32(g, "tokenizer.ggml.token_type", types, 259));
    ck_assert(kg_gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 259));
    ck_assert(types[0] == 2 && types[1] == 3 && types[2] == 3);
    for (int i = 3; i < 259; i++) {
        ck_assert_int_eq(types[i], 6);
    }
    for (int i = 0; i < 259; i++) {
        ck_assert(scores[i] == 0.0f);
    }
    ck_assert_uint_eq(u32_of(g, "tokenizer.ggml.bos_token_id"), 1);
    ck_assert_uint_eq(u32_of(g, "tokenizer.ggml.eos_token_id"), 2);
    ck_assert_uint_eq(u32_of(g, "tokenizer.ggml.unknown_token_id"), 0);
    bool b;
    ck_assert(kg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b);
    kg_gguf_free(g);
}

START_TEST(basic_f32) {
    const char *p = make("basic", "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 96 "
                                  "--seed 1");
    check_model(p, 64, 2, 4, 2, 96, 16, false, KG_GGML_TYPE_F32, KG_GGML_TYPE_F32, 0);
    check_builtin_vocab(p);
    kg_gguf_t *g = kg_gguf_open(p, err, sizeof(err));
    ck_assert_uint_eq(u32_of(g, "llama.context_length"), 2048);
    float f;
    ck_assert(kg_gguf_get_f32(g, "llama.rope.freq_base", &f) && f == 10000.0f);
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "general.name", &s) && str_is(s, "kgen-random"));
    kg_gguf_free(g);
}
END_TEST

START_TEST(options_tied_f16_head_dim) {
    const char *p = make("tied", "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 4 --n-ff 64 "
                                 "--seed 2 --tied --f16 --head-dim 32 --rope-base 500000 "
                                 "--ctx 256 --name tiny-test");
    check_model(p, 64, 3, 4, 4, 64, 32, true, KG_GGML_TYPE_F16, KG_GGML_TYPE_F16, 1);
    kg_gguf_t *g = kg_gguf_open(p, err, sizeof(err));
    ck_assert_uint_eq(u32_of(g, "llama.context_length"), 256);
    float f;
    ck_assert(kg_gguf_get_f32(g, "llama.rope.freq_base", &f) && f == 500000.0f);
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "general.name", &s) && str_is(s, "tiny-test"));
    kg_gguf_free(g);

    // --flag=value works like --flag value
    p = make("eq", "--n-embd=32 --n-layer=1 --n-head=2 --n-head-kv=1 --n-ff=64 --seed=3 --bf16");
    check_model(p, 32, 1, 2, 1, 64, 16, false, KG_GGML_TYPE_BF16, KG_GGML_TYPE_BF16, 32);
}
END_TEST

START_TEST(quantized_types) {
    const char *p = make("q8", "--n-embd 64 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 128 "
                               "--seed 4 --q8_0");
    check_model(p, 64, 1, 2, 2, 128, 32, false, KG_GGML_TYPE_Q8_0, KG_GGML_TYPE_Q8_0, 7);
    /* q4_0 as llama-quantize writes it: the head wants q6_k, whose 256-blocks do
     * not fit rows of 64, so it falls back to q8_0 */
    p = make("q4", "--n-embd 64 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 128 --seed 4 "
                   "--q4_0");
    check_model(p, 64, 1, 2, 2, 128, 32, false, KG_GGML_TYPE_Q4_0, KG_GGML_TYPE_Q8_0, 2);
    p = make("q4p", "--n-embd 64 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 128 --seed 4 "
                    "--type Q4_0 --pure");
    check_model(p, 64, 1, 2, 2, 128, 32, false, KG_GGML_TYPE_Q4_0, KG_GGML_TYPE_Q4_0, 2);
    p = make("q51", "--n-embd 64 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 128 --seed 4 "
                    "--type=q5_1 --tied");
    check_model(p, 64, 1, 2, 2, 128, 32, true, KG_GGML_TYPE_Q5_1, KG_GGML_TYPE_Q8_0, 9);
    kg_gguf_t *g = kg_gguf_open(p, err, sizeof(err));
    ck_assert_uint_eq(u32_of(g, "general.quantization_version"), 2);
    kg_gguf_free(g);
}
END_TEST

START_TEST(deterministic) {
    const char *args = "--n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 48 --seed 77";
    char a[4096], b[4096];
    snprintf(a, sizeof(a), "%s", make("det", args));
    snprintf(b, sizeof(b), "%s", make("det", args));
    size_t na, nb;
    char *da = kg_test_read_file(a, &na);
    char *db = kg_test_read_file(b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert_mem_eq(da, db, na);
    free(db);
    // another seed: same layout and metadata, different weights in every tensor
    snprintf(b, sizeof(b), "%s",
             make("det", "--n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 48 --seed 78"));
    db = kg_test_read_file(b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert(memcmp(da, db, na) != 0);
    kg_gguf_t *ga = kg_gguf_open_memory(da, na, err, sizeof(err));
    kg_gguf_t *gb = kg_gguf_open_memory(db, nb, err, sizeof(err));
    ck_assert(ga && gb);
    for (int64_t i = 0; i < kg_gguf_n_tensors(ga); i++) {
        const kg_gguf_tensor_t *ta = kg_gguf_tensor(ga, i), *tb = kg_gguf_tensor(gb, i);
        ck_assert_int_eq(ta->offset, tb->offset);
        ck_assert_msg(memcmp(ta->data, tb->data, ta->size) != 0, "tensor %lld unchanged",
                      (long long)i);
    }
    // and within one file no two weight matrices of a shape are equal
    const kg_gguf_tensor_t *k = kg_gguf_find_tensor(ga, "blk.0.ffn_gate.weight");
    const kg_gguf_tensor_t *u = kg_gguf_find_tensor(ga, "blk.0.ffn_up.weight");
    ck_assert(memcmp(k->data, u->data, k->size) != 0);
    kg_gguf_free(ga);
    kg_gguf_free(gb);
    free(da);
    free(db);
}
END_TEST

START_TEST(vocab_from) {
    const char *vocab = kg_test_data("tokenizer-vectors/ggml-vocab-gpt-2.gguf");
    char args[4096];
    snprintf(args, sizeof(args),
             "--n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 32 --seed 5 --tied --f16 "
             "--vocab-from '%s'",
             vocab);
    const char *p = make("gpt2", args);
    kg_gguf_t *g = kg_gguf_open(p, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_t *src = kg_gguf_open(vocab, err, sizeof(err));
    ck_assert_msg(src != NULL, "%s", err);
    ck_assert_uint_eq(u32_of(g, "llama.vocab_size"), 50257);
    expect_tensor(g, "token_embd.weight", KG_GGML_TYPE_F16, 32, 50257);
    int n_copied = 0;
    for (int64_t i = 0; i < kg_gguf_n_kv(src); i++) {
        kg_gguf_str_t k = kg_gguf_key(src, i);
        if (k.len < 10 || memcmp(k.data, "tokenizer.", 10) != 0) {
            continue;
        }
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)k.len, k.data);
        int64_t j = kg_gguf_find_key(g, key);
        ck_assert_msg(j >= 0, "%s not copied", key);
        size_t sa, sb;
        const void *a = kg_gguf_kv_raw(src, i, &sa);
        const void *b = kg_gguf_kv_raw(g, j, &sb);
        ck_assert_int_eq(kg_gguf_kv_type(src, i), kg_gguf_kv_type(g, j));
        ck_assert_int_eq(sa, sb);
        ck_assert_mem_eq(a, b, sa);
        n_copied++;
    }
    ck_assert_int_ge(n_copied, 5);
    // nothing but tokenizer keys came from the source
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "general.architecture", &s) && str_is(s, "llama"));
    ck_assert(kg_gguf_get_str(g, "general.name", &s) && str_is(s, "kgen-random"));
    kg_gguf_free(src);
    kg_gguf_free(g);
}
END_TEST

START_TEST(loads_as_model) {
    // the model loader accepts what mkmodel writes (the shapes it checks are llama.cpp's)
    kg_test_model_opts_t o = {
        .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128, .seed = 9};
    const char *p = kg_test_make_model(&o);
    ck_assert_ptr_nonnull(p);
    kg_model_t *m = kg_model_load(p, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_int_eq(m->hp.n_vocab, 259);
    ck_assert_int_eq(m->hp.head_dim, 16);
    ck_assert(!m->hp.tied);
    kg_model_free(m);

    kg_test_model_opts_t t = {.n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 1,
                              .n_ff = 64,
                              .head_dim = 32,
                              .tied = true,
                              .type = "q8_0",
                              .seed = 10};
    p = kg_test_make_model(&t);
    ck_assert_ptr_nonnull(p);
    m = kg_model_load(p, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_int_eq(m->hp.head_dim, 32);
    ck_assert(m->hp.tied);
    kg_model_free(m);

    /* gemma4 of two layers with the default period (six): both windowed, so
     * no global layer reads rope_freqs and none is written */
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("mk-gemma4-short"));
    ck_assert(kg_test_mkmodel(path, "--arch gemma4 --n-embd 64 --n-layer 2 --n-head 4 "
                                    "--n-head-kv 2 --n-ff 128 --seed 3") == 0);
    m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    kg_model_free(m);
    remove(path);
}
END_TEST

static void expect_usage_error(const char *args, const char *needle) {
    char *out;
    int st = mkmodel(args, &out);
    ck_assert_msg(st == 2, "'%s': exit %d, want 2: %s", args, st, out);
    ck_assert_msg(strstr(out, needle) != NULL, "'%s': output '%s' lacks '%s'", args, out, needle);
    free(out);
}

START_TEST(usage_errors) {
    const char *out = kg_test_tmp_path("never");
    char a[4096];
#define SHAPE "--n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 --n-ff 64"
    expect_usage_error("", "--out FILE is required");
    snprintf(a, sizeof(a), "--out %s " SHAPE, out);
    expect_usage_error(a, "--seed S is required");
    snprintf(a, sizeof(a), "--out %s --n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --seed 1", out);
    expect_usage_error(a, "--n-head-kv is required");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --bogus", out);
    expect_usage_error(a, "unknown option '--bogus'");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed", out);
    expect_usage_error(a, "--seed needs a value");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed -1", out);
    expect_usage_error(a, "--seed: '-1' is not an integer");
    snprintf(a, sizeof(a),
             "--out %s --n-embd abc --n-layer 1 --n-head 4 --n-head-kv 2 "
             "--n-ff 64 --seed 1",
             out);
    expect_usage_error(a, "--n-embd: 'abc' is not an integer");
    snprintf(a, sizeof(a),
             "--out %s --n-embd 0 --n-layer 1 --n-head 4 --n-head-kv 2 "
             "--n-ff 64 --seed 1",
             out);
    expect_usage_error(a, "--n-embd: '0' is not an integer in 1..");
    snprintf(a, sizeof(a),
             "--out %s --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 3 "
             "--n-ff 64 --seed 1",
             out);
    expect_usage_error(a, "--n-head 4 is not a multiple of --n-head-kv 3");
    snprintf(a, sizeof(a),
             "--out %s --n-embd 60 --n-layer 1 --n-head 8 --n-head-kv 2 "
             "--n-ff 64 --seed 1",
             out);
    expect_usage_error(a, "give --head-dim");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --head-dim 15", out);
    expect_usage_error(a, "must be even");
    snprintf(a, sizeof(a),
             "--out %s --n-embd 48 --n-layer 1 --n-head 4 --n-head-kv 2 "
             "--n-ff 64 --seed 1 --q8_0",
             out);
    expect_usage_error(a, "multiples of 32");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --type q4_k --pure", out);
    expect_usage_error(a, "--type q4_k_m --pure needs --n-embd, --n-ff and n_head * head_dim to "
                          "be multiples of 256");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --type q4_k_x", out);
    expect_usage_error(a, "--type: unknown type 'q4_k_x' (one of: f32, f16");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --type iq2_xxs", out);
    expect_usage_error(a, "unknown type 'iq2_xxs'");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --seed 1 --rope-base -5", out);
    expect_usage_error(a, "--rope-base");
    ck_assert(!kg_test_exists(out));
#undef SHAPE

    // --help and --version succeed on stdout
    char *o;
    ck_assert_int_eq(mkmodel("--help", &o), 0);
    ck_assert_ptr_nonnull(strstr(o, "usage: kgen mkmodel"));
    free(o);
    ck_assert_int_eq(mkmodel("--version", &o), 0);
    ck_assert_ptr_nonnull(strstr(o, "kgen "));
    free(o);
}
END_TEST

START_TEST(runtime_errors) {
    char a[8192];
    char *o;
    snprintf(a, sizeof(a),
             "--out %s --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 32 --seed 1 "
             "--vocab-from /nonexistent.gguf",
             kg_test_tmp_path("x"));
    ck_assert_int_eq(mkmodel(a, &o), 1);
    ck_assert_ptr_nonnull(strstr(o, "cannot open '/nonexistent.gguf'"));
    free(o);
    // an output path that cannot be created (the vocabulary comes from a model file)
    kg_test_model_opts_t m = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 2, .n_ff = 32, .seed = 1};
    char model[4096];
    snprintf(model, sizeof(model), "%s", kg_test_make_model(&m));
    snprintf(a, sizeof(a),
             "--out /nonexistent/dir/x.gguf --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 "
             "--n-ff 32 --seed 1 --vocab-from %s",
             model);
    ck_assert_int_eq(mkmodel(a, &o), 1);
    ck_assert_ptr_nonnull(strstr(o, "cannot create '/nonexistent/dir/x.gguf'"));
    free(o);
}
END_TEST

// ---- families ----

static bool f32_is(const kg_gguf_t *g, const char *key, float want) {
    float v = 0.0f;
    return kg_gguf_get_f32(g, key, &v) && v == want;
}

/* Every key and tensor name of one family, as llama.cpp's converter
 * writes them (convert_hf_to_gguf.py). */
START_TEST(families_tensors_and_keys) {
    static const struct {
        const char *args;
        const char *arch;
        int n_per_layer;            /* tensors of a layer */
        const char *const has[8];   /* keys or tensors (blk.0.*) that must be there */
        const char *const lacks[4]; /* and that must not */
    } cases[] = {
        {"--arch qwen2",
         "qwen2",
         12,
         {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias", "output.weight",
          "qwen2.rope.freq_base"},
         {"qwen2.attention.key_length", "qwen2.rope.dimension_count", "llama.vocab_size"}},
        {"--arch qwen3 --head-dim 32",
         "qwen3",
         11,
         {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "qwen3.attention.key_length",
          "qwen3.attention.value_length"},
         {"blk.0.attn_q.bias"}},
        {"--arch gemma2 --head-dim 32 --sliding-window 16",
         "gemma2",
         11,
         {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight",
          "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping",
          "gemma2.attention.sliding_window", "gemma2.attention.key_length"},
         {"output.weight", "gemma2.rope.freq_base", "gemma2.attention.sliding_window_pattern"}},
        {"--arch gemma3 --head-dim 32 --swa-pattern 3 --rope-base-swa 10000",
         "gemma3",
         13,
         {"blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight",
          "gemma3.attention.sliding_window", "gemma3.attention.sliding_window_pattern",
          "gemma3.rope.freq_base_swa", "output.weight"},
         {"gemma3.attn_logit_softcapping", "gemma3.final_logit_softcapping"}},
        {"--arch phi3 --n-rot 8 --rope-scaling longrope --rope-orig-ctx 64",
         "phi3",
         6,
         {"blk.0.attn_qkv.weight", "rope_factors_long.weight", "rope_factors_short.weight",
          "phi3.rope.scaling.attn_factor", "phi3.rope.scaling.original_context_length",
          "phi3.attention.sliding_window"},
         {"blk.0.ffn_gate.weight", "blk.0.attn_q.weight", "phi3.rope.scaling.type"}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "%s --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 64 --ctx 256 "
                 "--seed 1",
                 cases[c].args);
        kg_gguf_t *g = kg_gguf_open(make("fam", args), err, sizeof(err));
        ck_assert_msg(g != NULL, "%s", err);
        kg_gguf_str_t a;
        ck_assert(kg_gguf_get_str(g, "general.architecture", &a) && str_is(a, cases[c].arch));
        for (int i = 0; i < 8 && cases[c].has[i]; i++) {
            ck_assert_msg(kg_gguf_find_key(g, cases[c].has[i]) >= 0 ||
                              kg_gguf_find_tensor(g, cases[c].has[i]) != NULL,
                          "%s: no %s", cases[c].arch, cases[c].has[i]);
        }
        for (int i = 0; i < 4 && cases[c].lacks[i]; i++) {
            ck_assert_msg(kg_gguf_find_key(g, cases[c].lacks[i]) < 0 &&
                              kg_gguf_find_tensor(g, cases[c].lacks[i]) == NULL,
                          "%s: has %s", cases[c].arch, cases[c].lacks[i]);
        }
        int per_layer = 0;
        for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
            kg_gguf_str_t n = kg_gguf_tensor(g, i)->name;
            per_layer += n.len > 6 && memcmp(n.data, "blk.1.", 6) == 0;
            /* 1-D tensors stay F32, as llama.cpp's converter keeps them */
            if (kg_gguf_tensor(g, i)->n_dims == 1) {
                ck_assert_int_eq(kg_gguf_tensor(g, i)->type, KG_GGML_TYPE_F32);
            }
        }
        ck_assert_msg(per_layer == cases[c].n_per_layer, "%s: %d tensors per layer", cases[c].arch,
                      per_layer);
        kg_gguf_free(g);
    }
    /* phi3's fused shapes, gemma's norms near 1, the soft-capping values */
    kg_gguf_t *g = kg_gguf_open(make("phi", "--arch phi3 --n-embd 64 --n-layer 1 --n-head 4 "
                                            "--n-head-kv 2 --n-ff 96 --seed 1"),
                                err, sizeof(err));
    expect_tensor(g, "blk.0.attn_qkv.weight", KG_GGML_TYPE_F32, 64, 64 + 2 * 32);
    expect_tensor(g, "blk.0.ffn_up.weight", KG_GGML_TYPE_F32, 64, 2 * 96);
    expect_tensor(g, "blk.0.ffn_down.weight", KG_GGML_TYPE_F32, 96, 64);
    kg_gguf_free(g);
    g = kg_gguf_open(make("gem", "--arch gemma2 --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 "
                                 "--n-ff 64 --seed 1 --attn-softcap 5 --final-softcap 3"),
                     err, sizeof(err));
    ck_assert(f32_is(g, "gemma2.attn_logit_softcapping", 5.0f));
    ck_assert(f32_is(g, "gemma2.final_logit_softcapping", 3.0f));
    ck_assert_uint_eq(u32_of(g, "gemma2.attention.sliding_window"), 4096);
    const kg_gguf_tensor_t *pn = kg_gguf_find_tensor(g, "blk.0.post_ffw_norm.weight");
    for (int i = 0; i < 64; i++) {
        float v = ((const float *)pn->data)[i];
        ck_assert(v > 2.5f && v < 3.5f); /* stored as applied: the +1 is in */
    }
    kg_gguf_free(g);
}
END_TEST

/* Each built-in vocabulary is what its family's tokenizer path needs. */
START_TEST(family_vocabularies) {
    static const struct {
        const char *arch, *model, *pre;
        bool space_prefix_key, add_bos;
        const char *special;
    } cases[] = {
        {"qwen3", "gpt2", "qwen2", false, false, "<|im_end|>"},
        {"gemma3", "llama", "default", true, true, "<end_of_turn>"},
        {"phi3", "llama", "default", false, true, "<|end|>"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "--arch %s --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 --n-ff 64 "
                 "--head-dim 16 --seed 1 --n-vocab 1000",
                 cases[c].arch);
        const char *path = make("voc", args);
        kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
        kg_gguf_str_t s;
        ck_assert(kg_gguf_get_str(g, "tokenizer.ggml.model", &s) && str_is(s, cases[c].model));
        ck_assert(kg_gguf_get_str(g, "tokenizer.ggml.pre", &s) && str_is(s, cases[c].pre));
        bool v = true;
        ck_assert_int_eq(kg_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v),
                         cases[c].space_prefix_key);
        ck_assert(!v || !cases[c].space_prefix_key); /* gemma: false */
        kg_gguf_free(g);
        kg_model_t *m = kg_model_load(path, err, sizeof(err));
        ck_assert_msg(m != NULL, "%s", err);
        ck_assert_int_eq(m->hp.n_vocab, 1000);
        ck_assert_int_eq(kg_tokenizer_add_bos(m->tok), cases[c].add_bos);
        int32_t id = kg_tokenizer_find(m->tok, cases[c].special, strlen(cases[c].special));
        ck_assert_int_ge(id, 0);
        ck_assert(kg_tokenizer_is_eog(m->tok, id));
        /* English text goes through merges: fewer tokens than bytes */
        const char *text = "the queue is empty and the model waits";
        int32_t ids[64];
        int64_t n = kg_tokenizer_encode(m->tok, text, strlen(text), false, false, ids, 64);
        ck_assert_int_gt(n, 0);
        ck_assert_int_lt(n, (int64_t)strlen(text) * 2 / 3);
        kg_model_free(m);
    }
}
END_TEST

START_TEST(chat_templates) {
    char *o;
    char a[4096];
    snprintf(a, sizeof(a),
             "--out %s --arch qwen2 --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 --n-ff 64 "
             "--seed 1 --chat-template chatml",
             kg_test_tmp_path("chat"));
    char path[4096];
    snprintf(path, sizeof(path), "%s", strstr(a, "--out ") + 6);
    *strchr(path, ' ') = '\0';
    ck_assert_int_eq(mkmodel(a, &o), 0);
    free(o);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_ptr_nonnull(m->chat_template);
    ck_assert_ptr_nonnull(strstr(m->chat_template, "<|im_start|>"));
    kg_model_free(m);

    /* glm4.6 is llama.cpp's GLM-4.6.jinja byte for byte (check_jinja
     * renders that file like llama.cpp); glm4moe's vocabulary has the
     * specials it writes, [gMASK] as BOS, <|user|> and <|observation|>
     * ending generation */
    size_t len;
    char *want = kg_test_read_file(kg_test_data("chat/jinja/templates/GLM-4.6.jinja"), &len);
    ck_assert_ptr_nonnull(want);
    ck_assert_str_eq(kg_mkmodel_chat_template("glm4.6", NULL), want);
    free(want);
    snprintf(a, sizeof(a),
             "--out %.3000s --arch glm4moe --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 "
             "--n-ff 64 --n-ff-exp 64 --seed 1 --chat-template glm4.6",
             path);
    ck_assert_int_eq(mkmodel(a, &o), 0);
    free(o);
    m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_str_eq(m->chat_template, kg_mkmodel_chat_template("glm4.6", NULL));
    const char *specials[] = {"[gMASK]", "<sop>", "<|user|>", "<|observation|>", "<|assistant|>"};
    int32_t id[5];
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(
            kg_tokenizer_encode(m->tok, specials[i], strlen(specials[i]), false, true, &id[i], 1),
            1);
    }
    ck_assert_int_eq(kg_tokenizer_bos(m->tok), id[0]);
    ck_assert(kg_tokenizer_is_eog(m->tok, id[2]) && kg_tokenizer_is_eog(m->tok, id[3]));
    ck_assert(!kg_tokenizer_is_eog(m->tok, id[4]) && !kg_tokenizer_is_eog(m->tok, id[1]));
    kg_model_free(m);

    /* deepseek-v3.1 is llama.cpp's DeepSeek-V3.1.jinja byte for byte;
     * deepseek2's vocabulary has what it writes: BOS <｜begin▁of▁sentence｜>
     * (added to prompts), <｜end▁of▁sentence｜> ending generation, the
     * role and think tokens whole */
    want = kg_test_read_file(kg_test_data("chat/jinja/templates/deepseek-ai-DeepSeek-V3.1.jinja"),
                             &len);
    ck_assert_ptr_nonnull(want);
    ck_assert_str_eq(kg_mkmodel_chat_template("deepseek-v3.1", NULL), want);
    free(want);
    snprintf(a, sizeof(a),
             "--out %.3000s --arch deepseek2 --n-embd 64 --n-layer 2 --n-head 2 --n-head-kv 1 "
             "--head-dim 48 --n-rot 16 --kv-lora-rank 32 --n-ff 64 --n-ff-exp 32 --seed 1 "
             "--chat-template deepseek-v3.1",
             path);
    ck_assert_int_eq(mkmodel(a, &o), 0);
    free(o);
    m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_str_eq(m->chat_template, kg_mkmodel_chat_template("deepseek-v3.1", NULL));
    const char *ds[] = {"<\xef\xbd\x9c"
                        "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                        "<\xef\xbd\x9c"
                        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                        "<\xef\xbd\x9cUser\xef\xbd\x9c>",
                        "<\xef\xbd\x9c"
                        "Assistant\xef\xbd\x9c>",
                        "</think>"};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(kg_tokenizer_encode(m->tok, ds[i], strlen(ds[i]), false, true, &id[i], 1),
                         1);
    }
    ck_assert_int_eq(kg_tokenizer_bos(m->tok), id[0]);
    ck_assert_int_eq(id[0], 0);
    ck_assert(kg_tokenizer_is_eog(m->tok, id[1]));
    ck_assert(!kg_tokenizer_is_eog(m->tok, id[2]) && !kg_tokenizer_is_eog(m->tok, id[3]));
    ck_assert_int_eq(m->hp.n_lora_q, 96); /* the default: 3 x kv_lora_rank */
    kg_model_free(m);

    /* gemma4 is llama.cpp's google-gemma-4-31B-it.jinja byte for byte,
     * joined from its parts */
    want =
        kg_test_read_file(kg_test_data("chat/jinja/templates/google-gemma-4-31B-it.jinja"), &len);
    ck_assert_ptr_nonnull(want);
    ck_assert_str_eq(kg_mkmodel_chat_template("gemma4", NULL), want);
    free(want);
    snprintf(a, sizeof(a),
             "--out %.3000s --arch gemma4 --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 "
             "--n-ff 64 --swa-pattern 2 --seed 1 --chat-template gemma4",
             path);
    ck_assert_int_eq(mkmodel(a, &o), 0);
    free(o);
    m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    ck_assert_str_eq(m->chat_template, kg_mkmodel_chat_template("gemma4", NULL));
    kg_model_free(m);
}
END_TEST

START_TEST(family_usage_errors) {
    const char *out = kg_test_tmp_path("never");
    char a[4096];
#define SHAPE "--n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 --n-ff 64 --seed 1"
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch t5", out);
    expect_usage_error(a, "--arch: unknown 't5' (known: llama, qwen2, qwen3, gemma2");
    /* bert: every head a key/value head, n_embd = n_head x the head width */
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch bert", out);
    expect_usage_error(a, "bert: --n-head-kv must equal --n-head");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --chat-template nope", out);
    expect_usage_error(a, "known: chatml, llama2, llama3, gemma, phi3, phi4, mistral-v7");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --sliding-window 8", out);
    expect_usage_error(a, "are for gemma2, gemma3 and gemma4");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --n-embd-per-layer 16", out);
    expect_usage_error(a, "--n-embd-per-layer and --n-kv-shared are for gemma4");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch gemma4 --n-rot 8", out);
    expect_usage_error(a, "gemma4 rotates its windowed layers' whole head");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch qwen2 --attn-softcap 5", out);
    expect_usage_error(a, "--attn-softcap is for gemma2");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch qwen2 --rope-scaling longrope", out);
    expect_usage_error(a, "longrope needs --arch phi3");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --rope-scaling yarn", out);
    expect_usage_error(a, "yarn needs --rope-factor");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --rope-scaling ntk", out);
    expect_usage_error(a, "--rope-scaling: unknown 'ntk'");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --n-rot 8", out);
    expect_usage_error(a, "(llama: equal)");
    snprintf(a, sizeof(a), "--out %s " SHAPE " --arch gemma2 --n-vocab 300", out);
    expect_usage_error(a, "built-in gemma2 vocabulary has");
    ck_assert(!kg_test_exists(out));
#undef SHAPE
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("mkmodel");
    TCase *tc = tcase_create("models");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, basic_f32);
    tcase_add_test(tc, options_tied_f16_head_dim);
    tcase_add_test(tc, quantized_types);
    tcase_add_test(tc, deterministic);
    tcase_add_test(tc, vocab_from);
    tcase_add_test(tc, loads_as_model);
    tcase_add_test(tc, families_tensors_and_keys);
    tcase_add_test(tc, family_vocabularies);
    tcase_add_test(tc, chat_templates);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_test(tc, usage_errors);
    tcase_add_test(tc, runtime_errors);
    tcase_add_test(tc, family_usage_errors);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
