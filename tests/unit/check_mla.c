/* check_mla: DeepSeek's multi-head latent attention (deepseek2) beyond the
 * llama.cpp goldens of check_arch: the KV cache holds one latent row per
 * token and layer (kv_lora_rank + rope dims, fp16) and nothing else, as
 * the backend allocates it, as the engine sizes blocks by it and as the
 * kgen_kv_cache_bytes_per_token metric reports it; the loader's refusals
 * of files it cannot run that way. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_backend_registry.h"
#include "engine/kg_engine.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_lora.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek V3's attention shape in small: 4 heads of 64 nope + 32 rope
 * dims, a 128-dim latent, 64 value dims per head */
#define DS2_ARGS                                                                                   \
    "--arch deepseek2 --n-embd 256 --n-layer 3 --n-head 4 --n-head-kv 1 --head-dim 96 --n-rot "    \
    "32 --kv-lora-rank 128 --q-lora-rank 64 --v-head-dim 64 --n-ff 256 --n-ff-exp 64 "             \
    "--n-expert 8 --n-expert-used 2 --ctx 256 --seed 7"

static kg_model_t *load(const char *path) {
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

START_TEST(kv_cache_holds_the_latent) {
    const char *path = kg_test_tmp_path("mla-kv.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, DS2_ARGS), 0);
    kg_model_t *m = load(path);
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->n_lora_kv, 128);
    ck_assert_int_eq(hp->n_rot, 32);
    ck_assert_int_eq(hp->n_lora_q, 64);
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_MLA);
    /* (kv_lora_rank + rope dims) x layers x fp16 */
    const size_t want = (size_t)(128 + 32) * 3 * 2;
    ck_assert_uint_eq(kg_backend_kv_bytes_per_token(m, KG_KV_F16), want);
    /* full heads would cache K (4 x 96) and V (4 x 64) per layer: 5x more */
    ck_assert_uint_eq((size_t)(4 * 96 + 4 * 64) * 3 * 2, 4 * want);

    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = 2;
    ep.max_batch_tokens = 32;
    ep.max_seq_len = 64;
    ep.kv_block_size = 16;
    ep.n_kv_blocks = 10;
    kg_backend_params_t bp = {.n_threads = 2,
                              .n_kv_blocks = ep.n_kv_blocks,
                              .kv_block_size = ep.kv_block_size,
                              .max_batch_tokens = ep.max_batch_tokens,
                              .max_seq_len = ep.max_seq_len};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_memory_t mem;
    kg_backend_memory(be, &mem);
    ck_assert_uint_eq(mem.kv_size, want * 10 * 16); /* the allocation itself */
    kg_engine_t *e = kg_engine_new(be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    kg_engine_stats_t st;
    kg_engine_stats(e, &st);
    ck_assert_int_eq(st.kv_bytes_per_token, (int64_t)want); /* what the metric exports */
    /* kgen_device_weight_bytes: the backend's weights */
    ck_assert(mem.weights_size > 0);
    ck_assert_int_eq(st.weight_bytes, (int64_t)mem.weights_size);
    kg_engine_free(e);
    kg_backend_free(be);

    /* a KV budget buys blocks at the latent's price */
    ep = kg_engine_params_default(m, (size_t)want * 16 * 100);
    ck_assert_int_eq(ep.n_kv_blocks, 100);
    kg_model_free(m);
}
END_TEST

START_TEST(dense_model_keeps_both_caches) {
    /* the metric's other side: a llama model caches K and V of every KV head */
    const char *path = kg_test_tmp_path("mla-llama.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 "
                                           "--n-ff 64 --seed 3"),
                     0);
    kg_model_t *m = load(path);
    ck_assert(!(kg_model_features(m) & KG_MODEL_FEAT_MLA));
    ck_assert_uint_eq(kg_backend_kv_bytes_per_token(m, KG_KV_F16), (size_t)2 * 2 * 2 * 16 * 2);
    kg_model_free(m);
}
END_TEST

/* A copy of `src` with key `key` dropped (value NULL) or set to the u32
 * `value`. */
static void rewrite_key(const char *src, const char *dst, const char *key, const uint32_t *value) {
    char err[256];
    kg_gguf_t *g = kg_gguf_open(src, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    ck_assert_ptr_nonnull(w);
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t k = kg_gguf_key(g, i);
        if (k.len == strlen(key) && memcmp(k.data, key, k.len) == 0) {
            continue;
        }
        kg_gguf_writer_copy_kv(w, g, i);
    }
    if (value) {
        kg_gguf_writer_set_u32(w, key, *value);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char name[96];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        ck_assert_int_eq(
            kg_gguf_writer_add_tensor_raw(w, name, t->type, t->n_dims, t->ne, t->data, t->size),
            KG_OK);
    }
    ck_assert_int_eq(kg_gguf_writer_write(w, dst, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_free(g);
}

static void expect_refused(const char *path, const char *needle) {
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, needle) != NULL, "'%s' lacks '%s'", err, needle);
}

START_TEST(loader_refuses_what_it_cannot_run_latent) {
    const char *path = kg_test_tmp_path("mla-src.gguf");
    const char *bad = kg_test_tmp_path("mla-bad.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, DS2_ARGS), 0);
    /* a file from before llama.cpp split attn_kv_b: no key_length_mla */
    rewrite_key(path, bad, "deepseek2.attention.key_length_mla", NULL);
    expect_refused(bad, "convert it again");
    /* MLA's cache is one shared latent head */
    const uint32_t two = 2;
    rewrite_key(path, bad, "deepseek2.attention.head_count_kv", &two);
    expect_refused(bad, "head_count_kv 2 must be 1");
    /* the latent row is kv_lora_rank + rope dims */
    const uint32_t wrong = 100;
    rewrite_key(path, bad, "deepseek2.attention.key_length", &wrong);
    expect_refused(bad, "key_length 100");
    const uint32_t func = 3;
    rewrite_key(path, bad, "deepseek2.expert_gating_func", &func);
    expect_refused(bad, "expert_gating_func 3 is not supported");
}
END_TEST

/* The logits of a 24-token prefill then one decode step of model m on
 * `threads` threads into out (2 x n_vocab). */
static void run_steps(const kg_model_t *m, int threads, float *out) {
    kg_backend_params_t bp = {
        .n_threads = threads, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 32};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    int32_t tok[24], pos[24], seq[24] = {0}, table[4] = {2, 0, 3, 1};
    bool want[24] = {false};
    for (int32_t i = 0; i < 24; i++) {
        tok[i] = (i * 37 + 5) % m->hp.n_vocab;
        pos[i] = i;
    }
    want[23] = true;
    kg_step_batch_t b = {.n_tokens = 24,
                         .token = tok,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = 1,
                         .n_slots = 1,
                         .max_blocks_per_seq = 4,
                         .block_table = table};
    ck_assert_int_eq(kg_backend_forward(be, &b, out), KG_OK);
    int32_t next = 11, next_pos = 24;
    bool one = true;
    kg_step_batch_t d = b;
    d.n_tokens = 1;
    d.token = &next;
    d.pos = &next_pos;
    d.want_logits = &one;
    ck_assert_int_eq(kg_backend_forward(be, &d, out + m->hp.n_vocab), KG_OK);
    kg_backend_free(be);
}

START_TEST(heads_side_by_side_or_in_turn_give_the_same_bits) {
    /* 4 heads: on 1 or 2 threads each head's k_b / v_b GEMM is its own
     * pool task, on 8 they run one after another across the pool */
    const char *path = kg_test_tmp_path("mla-threads.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, DS2_ARGS " --type q8_0"), 0);
    kg_model_t *m = load(path);
    const size_t n = 2 * (size_t)m->hp.n_vocab;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    float *c = malloc(n * sizeof(float));
    ck_assert(a && b && c);
    run_steps(m, 1, a);
    run_steps(m, 2, b);
    run_steps(m, 8, c);
    ck_assert_int_eq(memcmp(a, b, n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(a, c, n * sizeof(float)), 0);
    free(a);
    free(b);
    free(c);
    kg_model_free(m);
}
END_TEST

/* Neither backend runs LoRA adapters on the latent attention (the CPU's adapter deltas take
 * one Q/K/V shape, and the latent path applies none): an adapter is refused saying so, not with
 * "this backend runs no adapters". */
START_TEST(lora_refused_naming_the_latent_attention) {
    const char *path = kg_test_tmp_path("mla-lora.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, DS2_ARGS), 0);
    kg_model_t *m = load(path);
    kg_backend_params_t bp = {
        .n_threads = 1, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cpu", m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert(!kg_backend_has_lora(be));
    kg_lora_t lora;
    memset(&lora, 0, sizeof(lora));
    lora.n_layer = m->hp.n_layer;
    int32_t id = -1;
    ck_assert_int_eq(kg_backend_lora_add(be, &lora, &id, err, sizeof(err)), KG_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err, "cpu backend runs no LoRA adapters on this model") &&
                      strstr(err, "multi-head latent attention"),
                  "%s", err);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

START_TEST(every_backend_keeps_the_latent) {
    /* the CUDA backend runs MLA too (gpu/kg_backend_cuda_mla.cu, checked
     * against this backend on the emulator by check_cuda): --backend auto
     * takes the device where there is one, the CPU otherwise, and either
     * allocates the latent rows alone; asked for cuda, a failure is about
     * the device, never about the model */
    const char *path = kg_test_tmp_path("mla-auto.gguf");
    ck_assert_int_eq(kg_test_mkmodel(path, DS2_ARGS), 0);
    kg_model_t *m = load(path);
    const size_t want = (size_t)(128 + 32) * 3 * 2 * 4 * 16; /* 4 blocks of 16 */
    kg_backend_params_t bp = {
        .n_threads = 1, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_memory_t mem;
    kg_backend_t *be = kg_backend_new("auto", m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_memory(be, &mem);
    ck_assert_uint_eq(mem.kv_size, want);
    kg_backend_free(be);
    be = kg_backend_new("cuda", m, &bp, err, sizeof(err));
    if (be) {
        kg_backend_memory(be, &mem);
        ck_assert_uint_eq(mem.kv_size, want);
        kg_backend_free(be);
    } else {
        ck_assert_msg(strstr(err, "does not implement") == NULL && strstr(err, "mla") == NULL, "%s",
                      err);
    }
    kg_model_free(m);
}
END_TEST

static Suite *mla_suite(void) {
    Suite *s = suite_create("mla");
    TCase *tc = tcase_create("mla");
    tcase_add_test(tc, kv_cache_holds_the_latent);
    tcase_add_test(tc, dense_model_keeps_both_caches);
    tcase_add_test(tc, loader_refuses_what_it_cannot_run_latent);
    tcase_add_test(tc, every_backend_keeps_the_latent);
    tcase_add_test(tc, lora_refused_naming_the_latent_attention);
    tcase_add_test(tc, heads_side_by_side_or_in_turn_give_the_same_bits);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(mla_suite)
