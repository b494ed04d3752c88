/* check_cuda_lora: LoRA adapters on the CUDA backend (gpu/lora.cu) against
 * the CPU backend's (cpu_lora.c): the same adapters (F32, F16 and Q8_0,
 * ranks 4, 8 and 32) added to both, steps mixing sequences on the base, on
 * one adapter, at scale 0.5 and on two adapters at once (prefill chunks,
 * then decodes, then a base-only decode that keeps its CUDA graph): logits
 * within an NMSE bound of the CPU's, and the adapters visibly change them.
 * A sequence gives the same bits alone (with only its adapters in the
 * step) as among the others (batch invariance). An adapter removed frees
 * its memory, a step naming it fails for that sequence only, and the same
 * adapter added again under its id gives the same bits; a gemma4 model's
 * adapters are refused by name. Runs on a GPU, or
 * on the CPU under scripts/gpu-emulate (tcase "lora").
 *
 * Needs a CUDA device: exits 77 (skipped) when the build has no CUDA
 * backend or no device is visible. */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda_lora: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "backend/kg_backend.h"
#include "model/kg_lora.h"
#include "model/kg_mklora.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <string.h>

#define BASE_ARGS  "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 5"
/* lora_vs_cpu's bases: a llama, an apertus (up, xIELU, down: its FFN
 * adapted without a gate), and a llama4 (its attention adapted before the
 * RoPE layers' L2 norms, its dense layers' FFN; its MoE layers have no
 * ffn_gate/up/down to adapt, as on the CPU) */
static const char *const k_bases[] = {
    BASE_ARGS,
    "--arch apertus --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 6",
    "--arch llama4 --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 128 --n-ff-exp 64 "
    "--n-expert 4 --n-expert-used 1 --seed 7",
};
static const char *const k_base_names[] = {"llama", "apertus", "llama4"};
#define N_ADAPT    3
#define N_SEQ      4
#define MAX_TOK    32
#define BLOCKS     8 /* per sequence */
#define BLOCK      4

/* Per sequence (base; F32; F16; Q8_0 and F32): an F32 base, so the CPU
 * and the device compute the same products in other orders (check_cuda's
 * F32 steps stay below 1e-6); an F16 adapter rounds its inputs to F16 on
 * both; a Q8_0 adapter is BF16 on the device, its activations BF16 there
 * and Q8 blocks on the CPU, whence the looser bound */
static const double k_bound[4] = {1e-6, 1e-6, 1e-6, 1e-3};
#define NMSE_BOUND 1e-6

static const char *const k_adapter_args[N_ADAPT] = {
    "--rank 4 --type f32 --seed 11",
    "--rank 8 --type f16 --seed 12 --alpha 4",
    "--rank 32 --type q8_0 --seed 13 --targets q,v,o,up,down",
};

/* Each sequence's adapters: base; adapter 0; adapter 1 at 0.5; adapters
 * 0 and 2 at once. */
static kg_lora_set_t seq_set(int s, const int32_t *ids) {
    kg_lora_set_t set;
    memset(&set, 0, sizeof(set));
    if (s == 1) {
        set.n = 1;
        set.id[0] = ids[0];
        set.scale[0] = 1.0f;
    } else if (s == 2) {
        set.n = 1;
        set.id[0] = ids[1];
        set.scale[0] = 0.5f;
    } else if (s == 3) {
        set.n = 2;
        set.id[0] = ids[2]; /* listed out of id order: the backend adds in id order */
        set.scale[0] = 0.75f;
        set.id[1] = ids[0];
        set.scale[1] = 1.0f;
    }
    return set;
}

typedef struct fixture {
    kg_model_t *m;
    kg_lora_t *lora[N_ADAPT];
} fixture_t;

static void make_lora(const char *base, const char *out, const char *args) {
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", args);
    char *argv[32] = {"mkmodel", "--lora", "--base", (char *)base, "--out", (char *)out};
    int argc = 6;
    for (char *save = NULL, *t = strtok_r(copy, " ", &save); t && argc < 31;
         t = strtok_r(NULL, " ", &save)) {
        argv[argc++] = t;
    }
    kg_mklora_opts_t o;
    char err[512];
    ck_assert_msg(kg_mklora_parse_args(argc, argv, &o, err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(kg_mklora_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
}

static void fixture_load(fixture_t *f, const char *base_args) {
    char base[4096], path[4096], err[512];
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("cuda-lora-base"));
    ck_assert(kg_test_mkmodel(base, base_args) == 0);
    f->m = kg_model_load(base, err, sizeof(err));
    ck_assert_msg(f->m != NULL, "%s", err);
    for (int a = 0; a < N_ADAPT; a++) {
        snprintf(path, sizeof(path), "%s.%d.gguf", kg_test_tmp_path("cuda-lora"), a);
        make_lora(base, path, k_adapter_args[a]);
        f->lora[a] = kg_lora_load(path, f->m, err, sizeof(err));
        ck_assert_msg(f->lora[a] != NULL, "%s", err);
        remove(path);
    }
    remove(base);
}

static void fixture_clear(fixture_t *f) {
    for (int a = 0; a < N_ADAPT; a++) {
        kg_lora_free(f->lora[a]);
    }
    kg_model_free(f->m);
}

static kg_backend_t *make_backend(bool cuda, const fixture_t *f, int32_t *ids) {
    char err[512] = "";
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = N_SEQ * BLOCKS,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = MAX_TOK};
    kg_backend_t *be = cuda ? kg_backend_cuda_new(f->m, &p, err, sizeof(err))
                            : kg_backend_cpu_new(f->m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert(kg_backend_has_lora(be));
    for (int a = 0; a < N_ADAPT; a++) {
        ids[a] = -1;
        ck_assert_msg(kg_backend_lora_add(be, f->lora[a], &ids[a], err, sizeof(err)) == KG_OK, "%s",
                      err);
    }
    return be;
}

/* The steps: prefill chunks (two per sequence, of different lengths), then
 * three decodes of every sequence, then a decode of sequence 0 alone. */
#define N_STEPS    6

typedef struct step {
    int32_t n_tokens, n_outputs;
    int32_t token[MAX_TOK], pos[MAX_TOK], seq[MAX_TOK];
    bool want[MAX_TOK];
} step_t;

static const int32_t k_prompt_len[N_SEQ] = {6, 9, 4, 7};

/* Step k's tokens of the sequences in `mask` (bit s: sequence s). */
static void build_step(step_t *st, int k, unsigned mask) {
    memset(st, 0, sizeof(*st));
    for (int s = 0; s < N_SEQ; s++) {
        if (!(mask & (1u << s)) || (k == N_STEPS - 1 && s != 0)) {
            continue;
        }
        int32_t p0, n;
        const int32_t half = k_prompt_len[s] / 2;
        if (k == 0) {
            p0 = 0, n = half;
        } else if (k == 1) {
            p0 = half, n = k_prompt_len[s] - half;
        } else {
            p0 = k_prompt_len[s] + k - 2, n = 1;
        }
        for (int32_t i = 0; i < n; i++) {
            const int32_t t = st->n_tokens++;
            st->seq[t] = s;
            st->pos[t] = p0 + i;
            st->token[t] = (s * 37 + st->pos[t] * 11 + 3) % 250;
            st->want[t] = true; /* every row's logits are compared */
            st->n_outputs++;
        }
    }
}

static int32_t g_table[N_SEQ * BLOCKS];

static kg_step_batch_t as_batch(const step_t *st, const kg_lora_set_t *sets) {
    for (int32_t i = 0; i < N_SEQ * BLOCKS; i++) {
        g_table[i] = (i * 13 + 5) % (N_SEQ * BLOCKS); /* blocks out of order */
    }
    kg_step_batch_t b = {.n_tokens = st->n_tokens,
                         .token = st->token,
                         .pos = st->pos,
                         .seq = st->seq,
                         .want_logits = st->want,
                         .n_outputs = st->n_outputs,
                         .n_slots = N_SEQ,
                         .max_blocks_per_seq = BLOCKS,
                         .block_table = g_table,
                         .slot_lora = sets};
    return b;
}

/* Every step of the sequences in `mask` on `be`; logits of step k, row r
 * (in token order) into out[k] + r * V. */
static void run_steps(kg_backend_t *be, const int32_t *ids, unsigned mask, int V, float **out) {
    kg_lora_set_t sets[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        sets[s] = seq_set(s, ids);
    }
    step_t st;
    for (int k = 0; k < N_STEPS; k++) {
        build_step(&st, k, mask);
        if (st.n_tokens == 0) {
            continue;
        }
        kg_step_batch_t b = as_batch(&st, sets);
        ck_assert_int_eq(kg_backend_forward(be, &b, out[k]), KG_OK);
        (void)V;
    }
}

static float **alloc_logits(int V) {
    float **l = malloc(N_STEPS * sizeof(float *));
    ck_assert_ptr_nonnull(l);
    for (int k = 0; k < N_STEPS; k++) {
        l[k] = calloc((size_t)MAX_TOK * (size_t)V, sizeof(float));
        ck_assert_ptr_nonnull(l[k]);
    }
    return l;
}

static void free_logits(float **l) {
    for (int k = 0; k < N_STEPS; k++) {
        free(l[k]);
    }
    free(l);
}

START_TEST(lora_vs_cpu) {
    fixture_t f;
    fixture_load(&f, k_bases[_i]);
    const int V = f.m->hp.n_vocab;
    int32_t ids_c[N_ADAPT], ids_g[N_ADAPT];
    kg_backend_t *cpu = make_backend(false, &f, ids_c), *gpu = make_backend(true, &f, ids_g);
    ck_assert(kg_backend_is_cuda(gpu));
    ck_assert_int_eq(memcmp(ids_c, ids_g, sizeof(ids_c)), 0);
    float **lc = alloc_logits(V), **lg = alloc_logits(V);
    const unsigned all = (1u << N_SEQ) - 1;
    run_steps(cpu, ids_c, all, V, lc);
    run_steps(gpu, ids_g, all, V, lg);
    step_t st;
    double worst[N_SEQ] = {0};
    for (int k = 0; k < N_STEPS; k++) {
        build_step(&st, k, all);
        for (int32_t r = 0; r < st.n_tokens; r++) {
            const double e = kg_test_nmse(lc[k] + (size_t)r * V, lg[k] + (size_t)r * V, V);
            ck_assert_msg(e < k_bound[st.seq[r]], "step %d row %d (sequence %d): NMSE %g", k, r,
                          st.seq[r], e);
            worst[st.seq[r]] = e > worst[st.seq[r]] ? e : worst[st.seq[r]];
        }
    }
    fprintf(stderr,
            "check_cuda_lora: %s: worst NMSE against the CPU: base %.3g, f32 %.3g, f16 at 0.5 "
            "%.3g, q8_0 + f32 %.3g\n",
            k_base_names[_i], worst[0], worst[1], worst[2], worst[3]);
    /* the last step (sequence 0 on the base, decode only) ran as a graph */
    kg_backend_counters_t cnt;
    kg_backend_counters(gpu, &cnt);
    ck_assert_int_ge(cnt.graph_steps + cnt.graphs_captured, 1);

    /* the adapters change the logits: the same steps on the base alone */
    kg_backend_t *base = make_backend(false, &f, ids_c);
    float **lb = alloc_logits(V);
    kg_lora_set_t none[N_SEQ];
    memset(none, 0, sizeof(none));
    for (int k = 0; k < 2; k++) {
        build_step(&st, k, all);
        kg_step_batch_t b = as_batch(&st, none);
        ck_assert_int_eq(kg_backend_forward(base, &b, lb[k]), KG_OK);
        for (int32_t r = 0; r < st.n_tokens; r++) {
            const double e = kg_test_nmse(lb[k] + (size_t)r * V, lg[k] + (size_t)r * V, V);
            if (st.seq[r] == 0) {
                ck_assert_msg(e < NMSE_BOUND, "base row %d: NMSE %g", r, e);
            } else {
                ck_assert_msg(e > 1e-3,
                              "step %d row %d (sequence %d): the adapter changed little "
                              "(NMSE %g against the base)",
                              k, r, st.seq[r], e);
            }
        }
    }
    free_logits(lb);
    kg_backend_free(base);
    free_logits(lc);
    free_logits(lg);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    fixture_clear(&f);
}
END_TEST

/* Row r of `mask`'s step k within the all-sequences step k. */
static int32_t row_in_all(int k, unsigned mask, int32_t r) {
    step_t one, all;
    build_step(&one, k, mask);
    build_step(&all, k, (1u << N_SEQ) - 1);
    for (int32_t t = 0; t < all.n_tokens; t++) {
        if (all.seq[t] == one.seq[r] && all.pos[t] == one.pos[r]) {
            return t;
        }
    }
    return -1;
}

START_TEST(lora_batch_invariance) {
    fixture_t f;
    fixture_load(&f, BASE_ARGS);
    const int V = f.m->hp.n_vocab;
    int32_t ids[N_ADAPT];
    kg_backend_t *gpu = make_backend(true, &f, ids);
    float **together = alloc_logits(V), **alone = alloc_logits(V);
    run_steps(gpu, ids, (1u << N_SEQ) - 1, V, together);
    kg_backend_free(gpu);
    step_t st;
    for (int s = 1; s < N_SEQ; s++) {
        gpu = make_backend(true, &f, ids);
        run_steps(gpu, ids, 1u << s, V, alone);
        kg_backend_free(gpu);
        for (int k = 0; k < N_STEPS - 1; k++) {
            build_step(&st, k, 1u << s);
            for (int32_t r = 0; r < st.n_tokens; r++) {
                const int32_t ra = row_in_all(k, 1u << s, r);
                ck_assert_int_ge(ra, 0);
                ck_assert_msg(memcmp(alone[k] + (size_t)r * V, together[k] + (size_t)ra * V,
                                     (size_t)V * sizeof(float)) == 0,
                              "sequence %d, step %d, position %d: other bits alone than among "
                              "the others",
                              s, k, st.pos[r]);
            }
        }
    }
    free_logits(together);
    free_logits(alone);
    fixture_clear(&f);
}
END_TEST

START_TEST(lora_remove_and_reload) {
    fixture_t f;
    fixture_load(&f, BASE_ARGS);
    const int V = f.m->hp.n_vocab;
    int32_t ids[N_ADAPT];
    kg_backend_t *gpu = make_backend(true, &f, ids);
    float **before = alloc_logits(V);
    run_steps(gpu, ids, 1u << 2, V, before); /* sequence 2: adapter 1 */
    kg_backend_free(gpu);

    gpu = make_backend(true, &f, ids);
    kg_backend_memory_t m0, m1, m2;
    kg_backend_memory(gpu, &m0);
    kg_backend_lora_remove(gpu, ids[1]);
    kg_backend_memory(gpu, &m1);
    ck_assert_msg(m1.weights_size < m0.weights_size, "removing an adapter freed nothing");
    /* a step naming it fails for that sequence, the backend stays usable */
    kg_lora_set_t sets[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        sets[s] = seq_set(s, ids);
    }
    step_t st;
    build_step(&st, 0, (1u << 2) | (1u << 0));
    kg_step_batch_t b = as_batch(&st, sets);
    float *l = malloc((size_t)MAX_TOK * (size_t)V * sizeof(float));
    ck_assert_int_eq(kg_backend_forward(gpu, &b, l), KG_ERR_INVALID);
    kg_backend_fault_t fault;
    kg_backend_last_fault(gpu, KG_ERR_INVALID, &fault);
    ck_assert_int_eq(fault.scope, KG_FAULT_SEQ);
    ck_assert_int_eq(fault.seq, 2);
    ck_assert_msg(strstr(fault.message, "not loaded") != NULL, "%s", fault.message);
    free(l);
    /* added again under its id: the same bits as before */
    char err[256];
    int32_t id = ids[1];
    ck_assert_msg(kg_backend_lora_add(gpu, f.lora[1], &id, err, sizeof(err)) == KG_OK, "%s", err);
    ck_assert_int_eq(id, ids[1]);
    kg_backend_memory(gpu, &m2);
    ck_assert_uint_eq(m2.weights_size, m0.weights_size);
    float **after = alloc_logits(V);
    run_steps(gpu, ids, 1u << 2, V, after);
    for (int k = 0; k < N_STEPS - 1; k++) {
        build_step(&st, k, 1u << 2);
        ck_assert_msg(memcmp(before[k], after[k], (size_t)st.n_tokens * V * sizeof(float)) == 0,
                      "step %d: other bits after the adapter was removed and added again", k);
    }
    free_logits(before);
    free_logits(after);
    kg_backend_free(gpu);
    fixture_clear(&f);
}
END_TEST

/* Gemma 4 takes no adapters (lora.cu has one Q/K/V and FFN shape for
 * every layer, and its shared-KV layers no K/V projection; the CPU backend
 * takes none either): adding one is refused with a message naming it. */
START_TEST(lora_refused_gemma4) {
    char base[4096], path[4096], err[512] = "";
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("cuda-lora-gemma4"));
    ck_assert(kg_test_mkmodel(base, "--arch gemma4 --n-embd 64 --n-layer 4 --n-head 4 "
                                    "--n-head-kv 2 --head-dim 16 --n-ff 128 --swa-pattern 2 "
                                    "--sliding-window 8 --n-embd-per-layer 16 --n-kv-shared 2 "
                                    "--seed 5") == 0);
    kg_model_t *m = kg_model_load(base, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("cuda-lora-gemma4-a"));
    make_lora(base, path, "--rank 4 --type f32 --seed 11");
    kg_lora_t *l = kg_lora_load(path, m, err, sizeof(err));
    ck_assert_msg(l != NULL, "%s", err);
    remove(path);
    remove(base);
    kg_backend_params_t p = {
        .n_threads = 2, .n_kv_blocks = 8, .kv_block_size = BLOCK, .max_batch_tokens = MAX_TOK};
    kg_backend_t *be = kg_backend_cuda_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    int32_t id = -1;
    ck_assert_int_eq(kg_backend_lora_add(be, l, &id, err, sizeof(err)), KG_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err, "no LoRA adapters on a gemma4 model") != NULL, "%s", err);
    kg_backend_free(be);
    kg_lora_free(l);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda_lora");
    TCase *tc = tcase_create("lora");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, lora_vs_cpu, 0, (int)(sizeof(k_bases) / sizeof(k_bases[0])));
    tcase_add_test(tc, lora_batch_invariance);
    tcase_add_test(tc, lora_remove_and_reload);
    tcase_add_test(tc, lora_refused_gemma4);
    suite_add_tcase(s, tc);
    return s;
}

/* Unforked, as check_cuda (a forked child cannot use the driver its parent
 * initialised). */
int main(void) {
    if (!kg_backend_cuda_available()) {
        fprintf(stderr, "check_cuda_lora: no CUDA device visible, skipping\n");
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
