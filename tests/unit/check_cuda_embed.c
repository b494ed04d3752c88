/* check_cuda_embed: embedding and rerank jobs on the CUDA backend against
 * the CPU backend, through the engine as the worker runs them: a qwen3
 * model with a reranking head (last-token pooling of the final norm's
 * hidden states, the yes/no score), a bert and a nomic-bert encoder (mean
 * pooling of the non-causal forward's last layer; nomic-bert's RoPE and
 * SwiGLU) and gemma-embedding (gemma3's layers run non-causally, windowed
 * ones symmetrically; mean pooling, then the dense projections), weights
 * from kgen mkmodel in F32, F16 and Q8_0 (CUDA keeps F32 and F16 and
 * widens Q8_0 to BF16, where the CPU quantizes the activations to Q8
 * blocks as ggml does: the Q8_0 bound, cosine 0.999, applies).
 * Every pooled vector within cosine 0.9999 (Q8_0: 0.999) of the CPU's and
 * the rerank scores within 1e-3 (the bound against llama.cpp:
 * fp16 K/V rounding makes relative differences of ~1e-4, as check_cuda's
 * logits NMSE of ~3e-8 for F32 qwen3; Q8_0: 2e-2, see compare); an input's
 * vector the same bits alone and among the others on CUDA (batch invariance); a decoder step that
 * wants hidden rows gives the same logits bits as one that does not; a bert step that cuts an input
 * or asks for logits is refused and the backend keeps working, as is a gemma-embedding step that
 * cuts one; a gemma-embedding step whose inputs span several attention splits (their partial
 * results merged) gives the CPU's hidden rows. Runs on a GPU, or on the CPU under
 * scripts/gpu-emulate (tcase "embed").
 *
 * Needs a CUDA device: exits 77 (skipped) when the build has no CUDA
 * backend or no device is visible. */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda_embed: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "backend/kg_backend.h"
#include "engine/kg_backend_registry.h"
#include "engine/kg_engine.h"
#include "model/kg_embed.h"
#include "model/kg_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN3_ARGS                                                                                 \
    "--arch qwen3 --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 "      \
    "--ctx 512 --rerank --seed 44"
#define BERT_ARGS                                                                                  \
    "--arch bert --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 4 --n-ff 128 --ctx 512 --seed 41"
#define NOMIC_ARGS                                                                                 \
    "--arch nomic-bert --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 4 --n-ff 128 --ctx 512 "     \
    "--rope-base 1000 --seed 43"
/* a window of 8 (4 either side) on every other layer: the inputs of 3 to
 * 19 tokens see part of themselves there */
#define GEMMA_EMBD_ARGS                                                                            \
    "--arch gemma-embedding --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 32 "       \
    "--n-ff 128 --ctx 512 --sliding-window 8 --swa-pattern 2 --seed 51"
#define BATCH_TOKENS 64
#define N_IN         9
#define TARGET       5
#define COS_BOUND    0.9999
#define COS_BOUND_Q8 0.999

/* the weight types the comparisons run in (_i of the loop tests) */
static const char *const types[] = {"f32", "f16", "q8_0"};

static kg_model_t *make_model(const char *args) {
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("cuda-embed"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    return m;
}

static kg_backend_params_t backend_params(const kg_engine_params_t *ep) {
    kg_backend_params_t bp = {.n_threads = 2,
                              .n_kv_blocks = ep->n_kv_blocks,
                              .kv_block_size = ep->kv_block_size,
                              .max_batch_tokens = ep->max_batch_tokens,
                              .max_seq_len = ep->max_seq_len};
    return bp;
}

static kg_engine_params_t engine_params(const kg_model_t *m) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = 8;
    ep.max_queue_depth = 64;
    ep.max_batch_tokens = BATCH_TOKENS;
    ep.max_seq_len = 128;
    ep.n_kv_blocks = 8 * 128 / ep.kv_block_size;
    return ep;
}

static kg_backend_t *make_backend(const kg_model_t *m, bool cuda) {
    const kg_engine_params_t ep = engine_params(m);
    const kg_backend_params_t bp = backend_params(&ep);
    char err[512] = "";
    /* through the registry, so its feature check is part of the test */
    kg_backend_t *be = kg_backend_new(cuda ? "cuda" : "cpu", m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert(kg_backend_has_hidden(be));
    return be;
}

/* One embedding request of n inputs to its end on a new engine over `be`;
 * the pooled rows out. */
static void run_embed(kg_backend_t *be,
                      const kg_model_t *m,
                      const int32_t *ids,
                      const int32_t *lens,
                      int32_t n,
                      kg_engine_pool_t pool,
                      float *rows) {
    const kg_engine_params_t ep = engine_params(m);
    char err[256];
    kg_engine_t *e = kg_engine_new(be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        total += lens[i];
    }
    kg_request_t req = {.id = 1,
                        .prompt = ids,
                        .n_prompt = total,
                        .max_tokens = 1,
                        .n_inputs = n,
                        .input_len = lens,
                        .pool = pool,
                        .embd = rows};
    ck_assert_int_eq(kg_engine_submit(e, &req), KG_OK);
    const int32_t cap = kg_engine_max_completions(e);
    int32_t done = 0;
    kg_completion_t *c = malloc((size_t)cap * sizeof(*c));
    while (kg_engine_busy(e)) {
        const int32_t k = kg_engine_step(e, c, cap);
        ck_assert_int_ge(k, 0);
        for (int32_t j = 0; j < k; j++) {
            ck_assert_int_eq(c[j].finish, KG_FINISH_STOP);
            done++;
        }
    }
    free(c);
    ck_assert_int_eq(done, n);
    kg_engine_free(e);
}

static double cosine(const float *a, const float *b, int32_t n) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int32_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

typedef struct inputs {
    int32_t lens[N_IN], at[N_IN], total;
    int32_t *ids;
} inputs_t;

/* N_IN inputs of 3 to 19 tokens of pseudo-random ids. */
static void make_inputs(inputs_t *in, int32_t n_vocab) {
    in->total = 0;
    for (int32_t i = 0; i < N_IN; i++) {
        in->lens[i] = 3 + (i * 7919) % 17;
        in->at[i] = in->total;
        in->total += in->lens[i];
    }
    in->ids = malloc((size_t)in->total * sizeof(int32_t));
    uint32_t x = 12345;
    for (int32_t k = 0; k < in->total; k++) {
        x = x * 1103515245u + 12345u;
        in->ids[k] = (int32_t)((x >> 8) % (uint32_t)n_vocab);
    }
}

/* Every input's pooled vector on the CPU and on CUDA, compared; the
 * target input alone on CUDA, bit for bit. */
static void compare(const char *base_args, int type, kg_engine_pool_t pool, bool rerank) {
    char args[512];
    snprintf(args, sizeof(args), "%s --type %s", base_args, types[type]);
    const double bound = type == 2 ? COS_BOUND_Q8 : COS_BOUND;
    /* CUDA widens Q8_0 to BF16 (8 significant bits: its d * q values, exact
     * in F32, are not), so its scores sit further from the CPU's, which
     * keeps ggml's Q8 arithmetic: up to 1.03e-2 on the emulator. Native
     * Q8_0 on the GPU (issue 22) would bring them within 1e-3. */
    const float score_bound = type == 2 ? 2e-2f : 1e-3f;
    kg_model_t *m = make_model(args);
    const int32_t E = m->hp.n_embd;
    inputs_t in;
    make_inputs(&in, m->hp.n_vocab);
    float *cpu = malloc((size_t)N_IN * (size_t)E * sizeof(float));
    float *gpu = malloc((size_t)N_IN * (size_t)E * sizeof(float));
    float *alone = malloc((size_t)E * sizeof(float));
    kg_backend_t *be = make_backend(m, false);
    run_embed(be, m, in.ids, in.lens, N_IN, pool, cpu);
    kg_backend_free(be);
    be = make_backend(m, true);
    run_embed(be, m, in.ids, in.lens, N_IN, pool, gpu);
    run_embed(be, m, in.ids + in.at[TARGET], &in.lens[TARGET], 1, pool, alone);
    kg_backend_free(be);
    /* Sentence-Transformers' projections after pooling, where the model
     * has them (gemma-embedding: the host's, as kg_embedjob applies them) */
    for (int32_t i = 0; i < N_IN; i++) {
        ck_assert(kg_embed_dense(m, cpu + (size_t)i * E) && kg_embed_dense(m, gpu + (size_t)i * E));
    }
    ck_assert(kg_embed_dense(m, alone));
    double worst = 1.0;
    float worst_score = 0.0f;
    for (int32_t i = 0; i < N_IN; i++) {
        const float *c = cpu + (size_t)i * E, *g = gpu + (size_t)i * E;
        const double cs = cosine(c, g, E);
        ck_assert_msg(cs >= bound, "%s: input %d: cosine %.8f with the CPU's vector", args, i, cs);
        worst = cs < worst ? cs : worst;
        if (rerank) {
            const float sc = kg_embed_rank_score(m, c), sg = kg_embed_rank_score(m, g);
            ck_assert_msg(fabsf(sc - sg) <= score_bound,
                          "%s: input %d: rerank score %.6f, CPU %.6f", args, i, sg, sc);
            worst_score = fabsf(sc - sg) > worst_score ? fabsf(sc - sg) : worst_score;
        }
    }
    fprintf(stderr,
            "check_cuda_embed: %s %s: worst 1 - cosine with the CPU %.1e, rerank score %.1e\n",
            kg_arch_name(m->hp.arch), types[type], 1.0 - worst, (double)worst_score);
    ck_assert_msg(memcmp(alone, gpu + (size_t)TARGET * E, (size_t)E * sizeof(float)) == 0,
                  "%s: input %d alone gives other bits than among the others", args, TARGET);
    free(cpu);
    free(gpu);
    free(alone);
    free(in.ids);
    kg_model_free(m);
}

START_TEST(qwen3_last_vs_cpu) {
    compare(QWEN3_ARGS, _i, KG_ENGINE_POOL_LAST, true);
}
END_TEST

START_TEST(bert_mean_vs_cpu) {
    compare(BERT_ARGS, _i, KG_ENGINE_POOL_MEAN, false);
}
END_TEST

START_TEST(nomic_mean_vs_cpu) {
    compare(NOMIC_ARGS, _i, KG_ENGINE_POOL_MEAN, false);
}
END_TEST

START_TEST(gemma_embd_mean_vs_cpu) {
    compare(GEMMA_EMBD_ARGS, _i, KG_ENGINE_POOL_MEAN, false);
}
END_TEST

/* gemma-embedding steps by hand. With 32 positions per attention split, an
 * input of 40 tokens makes every token of its global layers read two
 * splits, and those near position 32 in its windowed layers too (the
 * combine's merge of partial results, with the non-causal bounds), beside
 * an input of 9: every hidden row within cosine 0.9999 of the CPU
 * backend's. Then a step whose input starts past position 0 is refused
 * for that slot (its earlier tokens, which every token sees, are not
 * there), as the CPU backend refuses it, and the backend keeps working. */
START_TEST(gemma_embd_split_step) {
    kg_model_t *m = make_model(GEMMA_EMBD_ARGS);
    const int32_t E = m->hp.n_embd, V = m->hp.n_vocab;
    enum { N0 = 40, N1 = 9, T = N0 + N1, BLOCKS = 8 };
    int32_t token[T], pos[T], seq[T], table[2 * BLOCKS];
    bool want[T], want_h[T];
    for (int32_t t = 0; t < T; t++) {
        seq[t] = t < N0 ? 0 : 1;
        pos[t] = t < N0 ? t : t - N0;
        token[t] = (t * 53 + 11) % V;
        want[t] = false;
        want_h[t] = true;
    }
    for (int32_t i = 0; i < 2 * BLOCKS; i++) {
        table[i] = (i * 5 + 3) % (2 * BLOCKS);
    }
    kg_step_batch_t b = {.n_tokens = T,
                         .token = token,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_slots = 2,
                         .max_blocks_per_seq = BLOCKS,
                         .block_table = table,
                         .want_hidden = want_h,
                         .n_hidden = T};
    float *hid_cpu = malloc((size_t)T * E * sizeof(float));
    float *hid_gpu = malloc((size_t)T * E * sizeof(float));
    /* read at the backend's first step (fix_attention) */
    ck_assert_int_eq(setenv("KGEN_CUDA_ATTN_SPLIT", "32", 1), 0);
    kg_backend_t *gpu = make_backend(m, true);
    b.hidden = hid_gpu;
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_OK);
    unsetenv("KGEN_CUDA_ATTN_SPLIT");
    kg_backend_t *cpu = make_backend(m, false);
    b.hidden = hid_cpu;
    ck_assert_int_eq(kg_backend_forward(cpu, &b, NULL), KG_OK);
    double worst = 1.0;
    for (int32_t t = 0; t < T; t++) {
        const double cs = cosine(hid_cpu + (size_t)t * E, hid_gpu + (size_t)t * E, E);
        ck_assert_msg(cs >= COS_BOUND, "row %d: hidden cosine %.8f with the CPU's", t, cs);
        worst = cs < worst ? cs : worst;
    }
    fprintf(stderr, "check_cuda_embed: gemma-embedding split step: worst row 1 - cosine %.1e\n",
            1.0 - worst);
    /* the second input from position 1: refused on both, that slot named */
    for (int32_t t = N0; t < T; t++) {
        pos[t] = t - N0 + 1;
    }
    ck_assert_int_eq(kg_backend_forward(cpu, &b, NULL), KG_ERR_INVALID);
    b.hidden = hid_gpu;
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_ERR_INVALID);
    kg_backend_fault_t f;
    kg_backend_last_fault(gpu, KG_ERR_INVALID, &f);
    ck_assert_int_eq(f.scope, KG_FAULT_SEQ);
    ck_assert_int_eq(f.seq, 1);
    for (int32_t t = N0; t < T; t++) {
        pos[t] = t - N0;
    }
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_OK);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    free(hid_cpu);
    free(hid_gpu);
    kg_model_free(m);
}
END_TEST

/* A decoder prefill step of two sequences, once with logits only and once
 * also wanting every row's hidden state: the same logits bits; the hidden
 * rows within cosine 0.9999 of the CPU backend's. */
START_TEST(qwen3_hidden_step) {
    kg_model_t *m = make_model(QWEN3_ARGS);
    const int32_t E = m->hp.n_embd, V = m->hp.n_vocab;
    enum { T = 12, BLOCKS = 4 };
    int32_t token[T], pos[T], seq[T], table[2 * BLOCKS];
    bool want[T], want_h[T];
    for (int32_t t = 0; t < T; t++) {
        seq[t] = t < 7 ? 0 : 1;
        pos[t] = t < 7 ? t : t - 7;
        token[t] = (t * 37 + 5) % V;
        want[t] = t == 6 || t == T - 1;
        want_h[t] = true;
    }
    for (int32_t i = 0; i < 2 * BLOCKS; i++) {
        table[i] = (i * 3 + 1) % (2 * BLOCKS);
    }
    kg_step_batch_t b = {.n_tokens = T,
                         .token = token,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = 2,
                         .n_slots = 2,
                         .max_blocks_per_seq = BLOCKS,
                         .block_table = table};
    float *logits = malloc(2 * (size_t)V * sizeof(float));
    float *logits_h = malloc(2 * (size_t)V * sizeof(float));
    float *hid_cpu = malloc((size_t)T * E * sizeof(float));
    float *hid_gpu = malloc((size_t)T * E * sizeof(float));
    kg_backend_t *gpu = make_backend(m, true);
    ck_assert_int_eq(kg_backend_forward(gpu, &b, logits), KG_OK);
    b.want_hidden = want_h;
    b.n_hidden = T;
    b.hidden = hid_gpu;
    ck_assert_int_eq(kg_backend_forward(gpu, &b, logits_h), KG_OK);
    ck_assert_mem_eq(logits, logits_h, 2 * (size_t)V * sizeof(float));
    /* a count that disagrees with the flags is refused, the backend lives on */
    b.n_hidden = T - 1;
    ck_assert_int_eq(kg_backend_forward(gpu, &b, logits_h), KG_ERR_INVALID);
    kg_backend_free(gpu);
    kg_backend_t *cpu = make_backend(m, false);
    b.n_hidden = T;
    b.hidden = hid_cpu;
    ck_assert_int_eq(kg_backend_forward(cpu, &b, logits_h), KG_OK);
    kg_backend_free(cpu);
    double worst = 1.0;
    for (int32_t t = 0; t < T; t++) {
        const double cs = cosine(hid_cpu + (size_t)t * E, hid_gpu + (size_t)t * E, E);
        ck_assert_msg(cs >= COS_BOUND, "row %d: hidden cosine %.8f with the CPU's", t, cs);
        worst = cs < worst ? cs : worst;
    }
    fprintf(stderr, "check_cuda_embed: qwen3 step: worst hidden row 1 - cosine %.1e\n",
            1.0 - worst);
    free(logits);
    free(logits_h);
    free(hid_cpu);
    free(hid_gpu);
    kg_model_free(m);
}
END_TEST

/* bert steps the CUDA backend refuses, as the CPU backend does: an input
 * cut (not from position 0), a step asking for logits; a whole step after
 * them runs. */
START_TEST(bert_refusals) {
    kg_model_t *m = make_model(BERT_ARGS);
    const int32_t E = m->hp.n_embd;
    enum { T = 4 };
    int32_t token[T] = {5, 6, 7, 8}, pos[T] = {2, 3, 4, 5}, seq[T] = {0, 0, 0, 0}, table[1] = {0};
    bool want[T] = {false, false, false, false}, want_h[T] = {true, true, true, true};
    float hid[T * 64];
    ck_assert_int_le(E, 64);
    kg_step_batch_t b = {.n_tokens = T,
                         .token = token,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_slots = 1,
                         .max_blocks_per_seq = 1,
                         .block_table = table,
                         .want_hidden = want_h,
                         .n_hidden = T,
                         .hidden = hid};
    kg_backend_t *gpu = make_backend(m, true);
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_ERR_INVALID);
    kg_backend_fault_t f;
    kg_backend_last_fault(gpu, KG_ERR_INVALID, &f);
    ck_assert_int_eq(f.scope, KG_FAULT_SEQ);
    ck_assert_int_eq(f.seq, 0);
    for (int32_t t = 0; t < T; t++) {
        pos[t] = t;
    }
    want[T - 1] = true;
    b.n_outputs = 1;
    float logits[1];
    ck_assert_int_eq(kg_backend_forward(gpu, &b, logits), KG_ERR_UNSUPPORTED);
    want[T - 1] = false;
    b.n_outputs = 0;
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_OK);
    ck_assert(!kg_backend_has_sample(gpu));
    ck_assert(!kg_backend_has_kv_copy(gpu));
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda_embed");
    TCase *tc = tcase_create("embed");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, qwen3_last_vs_cpu, 0, 3);
    tcase_add_loop_test(tc, bert_mean_vs_cpu, 0, 3);
    tcase_add_loop_test(tc, nomic_mean_vs_cpu, 0, 3);
    tcase_add_loop_test(tc, gemma_embd_mean_vs_cpu, 0, 3);
    tcase_add_test(tc, gemma_embd_split_step);
    tcase_add_test(tc, qwen3_hidden_step);
    tcase_add_test(tc, bert_refusals);
    suite_add_tcase(s, tc);
    return s;
}

/* Unforked, as check_cuda (a forked child cannot use the driver its parent
 * initialised). */
int main(void) {
    if (!kg_backend_cuda_available()) {
        fprintf(stderr, "check_cuda_embed: no CUDA device visible, skipping\n");
        return 77;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
