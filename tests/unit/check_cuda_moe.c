/* check_cuda_moe: the CUDA mixture-of-experts kernels (gpu/moe.cu) against
 * the CPU backend's: the route equals cpu_moe_route's (the same experts in
 * the same order, weights within 1e-6), the FFN's output matches the CPU
 * path (cpu_gemm over each expert's packed matrix, the same rounding of
 * activations to the weights' type, cpu_moe_combine) within an NMSE bound,
 * for Mixtral/qwen3moe's router, gpt-oss's (biases, clamped SwiGLU),
 * glm4moe's and llama4's (the weights on the experts' input), in F32, F16
 * and BF16; and a token's output is bit for bit the same alone
 * and among the others (the grouped GEMM's chains do not depend on the
 * group). Runs on a GPU, or on the CPU under scripts/gpu-emulate.
 *
 * Needs a CUDA device: exits 77 (skipped) when the build has no CUDA
 * backend or no device is visible. */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda_moe: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "../../gpu/kg_cuda_ops.h"
#include "../../gpu/moe_ops.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/kg_math.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *rand_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof(float) + 1);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++) {
        v[i] = frand() * scale;
    }
    return v;
}

static kg_ggml_type_t ggml_type(int dt) {
    return dt == KG_CUDA_OP_BF16  ? KG_GGML_TYPE_BF16
           : dt == KG_CUDA_OP_F16 ? KG_GGML_TYPE_F16
                                  : KG_GGML_TYPE_F32;
}

/* Weights as the CPU backend holds them: the floats stored in the GPU's
 * type, then packed (F16/BF16 stay 16-bit in the panels). */
static void pack(cpu_gemm_weights_t *pw, const float *w, int64_t n, int64_t k, int dt) {
    const kg_ggml_type_t t = ggml_type(dt);
    void *raw = malloc((size_t)(n * k) * 4);
    ck_assert(kg_quantize(t, w, raw, n * k));
    ck_assert(cpu_gemm_pack(pw, t, raw, n, k));
    free(raw);
}

/* The op's router as the CPU's hyperparameters. */
static kg_hparams_t router_hparams(const kg_cuda_op_moe_t *m) {
    kg_hparams_t hp = {.n_expert = m->n_expert, .n_expert_used = m->k};
    hp.moe_gating = m->top_k_then_softmax ? KG_MOE_SOFTMAX_WEIGHT
                    : m->sigmoid          ? KG_MOE_SIGMOID
                                          : KG_MOE_SOFTMAX;
    hp.moe_norm_w = m->norm_w != 0;
    hp.moe_w_scale = m->w_scale;
    hp.n_expert_groups = m->n_groups;
    hp.n_group_used = m->n_group_used;
    hp.moe_w_before = m->w_on_input != 0;
    return hp;
}

/* The CPU path on the same inputs: route, then per expert its rows'
 * gate/up GEMMs (activations rounded to the type), biases, the gate, the
 * down GEMM, its bias, and the rank-order sum. */
static void cpu_ffn(const kg_cuda_op_moe_t *m, const float *x, const float *logits, float *out) {
    const int32_t T = m->n_tokens, E = m->n_embd, F = m->n_ff, X = m->n_expert, k = m->k;
    const kg_hparams_t hp = router_hparams(m);
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, X, k, T));
    cpu_moe_route(&plan, &hp, logits, m->probs_b, T);
    const int64_t TK = (int64_t)T * k;
    float *xa = malloc((size_t)(TK * E) * 4), *xr = malloc((size_t)(TK * E) * 4);
    float *g = malloc((size_t)(TK * F) * 4), *u = malloc((size_t)(TK * F) * 4);
    float *hr = malloc((size_t)(TK * F) * 4), *y = malloc((size_t)(TK * E) * 4);
    if (m->w_on_input) { /* llama4: each row times its weight, the outputs summed */
        cpu_moe_gather_weighted(&plan, x, E, xa, T);
    } else {
        cpu_moe_gather(&plan, x, E, xa, T);
    }
    const kg_ggml_type_t t = ggml_type(m->dtype);
    for (int32_t e = 0; e < X; e++) {
        const int64_t r0 = plan.offset[e], n = plan.offset[e + 1] - r0;
        if (n == 0) {
            continue;
        }
        cpu_gemm_weights_t wg, wu, wd;
        pack(&wg, m->gate + (size_t)e * F * E, F, E, m->dtype);
        pack(&wu, m->up + (size_t)e * F * E, F, E, m->dtype);
        pack(&wd, m->down + (size_t)e * E * F, E, F, m->dtype);
        const float *a = xa + r0 * E;
        if (cpu_round_activations(t, a, xr, n, E)) {
            a = xr;
        }
        cpu_gemm(NULL, a, &wg, g + r0 * F, n);
        cpu_gemm(NULL, a, &wu, u + r0 * F, n);
        for (int64_t r = r0; r < r0 + n; r++) {
            for (int32_t f = 0; f < F; f++) {
                float gv = g[r * F + f], uv = u[r * F + f];
                if (m->gate_b) {
                    gv = gv + m->gate_b[e * F + f];
                    uv = uv + m->up_b[e * F + f];
                }
                g[r * F + f] = m->oai ? kg_swiglu_oai(gv, uv, 1.702f, 7.0f) : kg_silu(gv) * uv;
            }
        }
        const float *hh = g + r0 * F;
        if (cpu_round_activations(t, hh, hr, n, F)) {
            hh = hr;
        }
        cpu_gemm(NULL, hh, &wd, y + r0 * E, n);
        for (int64_t r = r0; m->down_b && r < r0 + n; r++) {
            for (int32_t i = 0; i < E; i++) {
                y[r * E + i] = y[r * E + i] + m->down_b[e * E + i];
            }
        }
        cpu_gemm_clear(&wg), cpu_gemm_clear(&wu), cpu_gemm_clear(&wd);
    }
    cpu_moe_combine(&plan, y, E, out, T);
    free(xa), free(xr), free(g), free(u), free(hr), free(y);
    cpu_moe_plan_clear(&plan);
}

static double nmse(const float *ref, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)ref[i] - got[i]) * ((double)ref[i] - got[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static void check_ffn(kg_cuda_op_moe_t *m, uint64_t seed) {
    g_rng = seed * 0x9E3779B97F4A7C15ull + 1;
    const int32_t T = m->n_tokens, E = m->n_embd, F = m->n_ff, X = m->n_expert, k = m->k;
    float *x = rand_vec((size_t)T * E, 1.0f), *logits = rand_vec((size_t)T * X, 3.0f);
    float *gate = rand_vec((size_t)X * F * E, sqrtf(3.0f / (float)E));
    float *up = rand_vec((size_t)X * F * E, sqrtf(3.0f / (float)E));
    float *down = rand_vec((size_t)X * E * F, sqrtf(3.0f / (float)F));
    float *gb = rand_vec((size_t)X * F, 0.5f), *ub = rand_vec((size_t)X * F, 0.5f);
    float *db = rand_vec((size_t)X * E, 0.1f);
    m->gate = gate, m->up = up, m->down = down;
    if (m->oai) {
        m->gate_b = gb, m->up_b = ub, m->down_b = db;
    }
    float *out = malloc((size_t)T * E * 4), *ref = malloc((size_t)T * E * 4);
    float *one = malloc((size_t)E * 4), *w = malloc((size_t)T * k * 4);
    int32_t *sel = malloc((size_t)T * k * 4), sel1[64];
    float w1[64];
    ck_assert_int_eq(kg_cuda_op_moe_ffn(m, x, logits, out, sel, w), KG_OK);

    /* the route: cpu_moe_route's */
    const kg_hparams_t hp = router_hparams(m);
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, X, k, T));
    cpu_moe_route(&plan, &hp, logits, m->probs_b, T);
    for (int32_t i = 0; i < T * k; i++) {
        ck_assert_int_eq(sel[i], plan.sel[i]);
        ck_assert_msg(fabsf(w[i] - plan.w[i]) <= 1e-6f * (1.0f + fabsf(plan.w[i])), "%g vs %g",
                      (double)w[i], (double)plan.w[i]);
    }
    cpu_moe_plan_clear(&plan);

    /* the output: the CPU path's, within one rounding of the activation
     * type (the GPU's expf is not glibc's); llama4's weighted inputs are
     * rounded twice on the device: the experts' normed input is stored in
     * the type, then x * w is rounded to it for the tensor cores, where the
     * CPU rounds x * w once (1.6e-5 seen in BF16) */
    cpu_ffn(m, x, logits, ref);
    const double e = nmse(ref, out, (size_t)T * E);
    const double bound = m->dtype == KG_CUDA_OP_F32 ? 1e-10 : m->w_on_input ? 5e-5 : 1e-5;
    ck_assert_msg(e < bound, "dtype %d oai %d: nmse %g >= %g", m->dtype, m->oai, e, bound);
    if (m->w_on_input) {
        fprintf(stderr, "check_cuda_moe: weights on the input, dtype %d: nmse %.3g\n", m->dtype, e);
    }

    /* batch invariance: each token alone gives its row's bits */
    kg_cuda_op_moe_t m1 = *m;
    m1.n_tokens = 1;
    for (int32_t t = 0; t < T; t += 4) {
        ck_assert_int_eq(
            kg_cuda_op_moe_ffn(&m1, x + (size_t)t * E, logits + (size_t)t * X, one, sel1, w1),
            KG_OK);
        ck_assert_mem_eq(one, out + (size_t)t * E, (size_t)E * 4);
    }
    free(x), free(logits), free(gate), free(up), free(down), free(gb), free(ub), free(db);
    free(out), free(ref), free(one), free(w), free(sel);
}

/* The routers and shapes check_ffn compares (a new family's router is one
 * row here): the op (its dtype where not every one), the seed, and whether
 * it runs in each of BF16, F16 and F32 (seed + dtype) or once. */
static const float k_glm_bias[16] = {0.1f,  -0.2f, 0.3f,  0.0f, -0.4f,  0.25f, 0.05f, -0.1f,
                                     0.15f, 0.35f, -0.3f, 0.2f, -0.05f, 0.0f,  0.4f,  -0.25f};

static const struct moe_router {
    const char *name;
    kg_cuda_op_moe_t m;
    uint64_t seed;
    bool every_dtype;
} k_moe_routers[] = {
    /* Mixtral / qwen3moe: softmax over 8 experts, top 2, renormalised; the
     * expert width 40 leaves a partial column tile and input chunk */
    {"softmax, top 2 of 8, renormalised",
     {.n_tokens = 13, .n_embd = 64, .n_ff = 40, .n_expert = 8, .k = 2, .norm_w = 1},
     11,
     true},
    /* no renormalisation, a scale, more experts per token */
    {"softmax, top 4 of 12, scaled",
     {.n_tokens = 9,
      .n_embd = 48,
      .n_ff = 72,
      .n_expert = 12,
      .k = 4,
      .w_scale = 2.5f,
      .dtype = KG_CUDA_OP_F32},
     21,
     false},
    /* gpt-oss: top 3 of 6 logits then a softmax, expert biases, the clamped
     * SwiGLU */
    {"oai, top 3 of 6",
     {.n_tokens = 11,
      .n_embd = 64,
      .n_ff = 64,
      .n_expert = 6,
      .k = 3,
      .top_k_then_softmax = 1,
      .oai = 1},
     31,
     true},
    /* glm4moe: sigmoid scores, the selection bias choosing, top 4 of 16
     * within the 2 best of 4 groups, renormalised and scaled by 2.5 */
    {"sigmoid, bias, top 4 of 16 in 2 of 4 groups",
     {.n_tokens = 12,
      .n_embd = 64,
      .n_ff = 40,
      .n_expert = 16,
      .k = 4,
      .norm_w = 1,
      .w_scale = 2.5f,
      .sigmoid = 1,
      .n_groups = 4,
      .n_group_used = 2,
      .probs_b = k_glm_bias},
     41,
     true},
    /* llama4: the logits choose, their sigmoids weigh each chosen expert's
     * input row, the outputs summed unweighted (k 2 here, where llama4's
     * files use 1, so the sum runs) */
    {"llama4, top 2 of 8 logits, weights on the input",
     {.n_tokens = 10,
      .n_embd = 64,
      .n_ff = 40,
      .n_expert = 8,
      .k = 2,
      .sigmoid = 1,
      .w_on_input = 1},
     51,
     true},
};

START_TEST(router_vs_cpu) {
    const struct moe_router *r = &k_moe_routers[_i];
    if (!r->every_dtype) {
        kg_cuda_op_moe_t m = r->m;
        check_ffn(&m, r->seed);
        return;
    }
    for (int dt = 0; dt < 3; dt++) {
        kg_cuda_op_moe_t m = r->m;
        m.dtype = dt;
        check_ffn(&m, r->seed + (uint64_t)dt);
    }
}
END_TEST

/* Expert matrices kept as GGUF blocks (qblocks.cuh) in the grouped GEMM:
 * the FFN's output, route and weights have the bits of the same matrices
 * expanded to BF16 (as the upload did), for each native type (_i), with
 * gpt-oss's router and biases for MXFP4 (its experts' type); each token
 * alone gives its row's bits. */
/* the emulator runs the first three (a block-32 and two K-quant layouts; every
 * type's expansion is check_cuda's gemm_native_blocks), a GPU all six */
static const int k_native_expert_types[] = {KG_GGML_TYPE_MXFP4, KG_GGML_TYPE_Q4_K,
                                            KG_GGML_TYPE_Q8_0,  KG_GGML_TYPE_Q6_K,
                                            KG_GGML_TYPE_Q5_K,  KG_GGML_TYPE_IQ4_XS};

START_TEST(native_expert_blocks) {
    const int qt = k_native_expert_types[_i];
    const bool k_quant = kg_type_block_elems((kg_ggml_type_t)qt) == 256;
    kg_cuda_op_moe_t m = {.n_tokens = 11,
                          .n_embd = k_quant ? 256 : 64,
                          .n_ff = k_quant ? 256 : 96, /* 96: a partial column tile */
                          .n_expert = 6,
                          .k = 3,
                          .norm_w = 1,
                          .dtype = KG_CUDA_OP_BF16,
                          .qtype = qt};
    if (qt == KG_GGML_TYPE_MXFP4) {
        m.top_k_then_softmax = 1;
        m.oai = 1;
        m.norm_w = 0;
    }
    g_rng = 77 + (uint64_t)_i;
    const int32_t T = m.n_tokens, E = m.n_embd, F = m.n_ff, X = m.n_expert, k = m.k;
    float *x = rand_vec((size_t)T * E, 1.0f), *logits = rand_vec((size_t)T * X, 3.0f);
    float *gate = rand_vec((size_t)X * F * E, sqrtf(3.0f / (float)E));
    float *up = rand_vec((size_t)X * F * E, sqrtf(3.0f / (float)E));
    float *down = rand_vec((size_t)X * E * F, sqrtf(3.0f / (float)F));
    float *gb = rand_vec((size_t)X * F, 0.5f), *ub = rand_vec((size_t)X * F, 0.5f);
    float *db = rand_vec((size_t)X * E, 0.1f);
    m.gate = gate, m.up = up, m.down = down;
    if (m.oai) {
        m.gate_b = gb, m.up_b = ub, m.down_b = db;
    }
    float *on = malloc((size_t)T * E * 4), *oe = malloc((size_t)T * E * 4);
    float *wn = malloc((size_t)T * k * 4), *we = malloc((size_t)T * k * 4),
          *one = malloc((size_t)E * 4);
    int32_t *sn = malloc((size_t)T * k * 4), *se = malloc((size_t)T * k * 4), sel1[8];
    float w1[8];
    m.native = 1;
    ck_assert_int_eq(kg_cuda_op_moe_ffn(&m, x, logits, on, sn, wn), KG_OK);
    m.native = 0;
    ck_assert_int_eq(kg_cuda_op_moe_ffn(&m, x, logits, oe, se, we), KG_OK);
    ck_assert_mem_eq(sn, se, (size_t)T * k * 4);
    ck_assert_mem_eq(wn, we, (size_t)T * k * 4);
    for (int32_t i = 0; i < T * E; i++) {
        ck_assert_msg(memcmp(&on[i], &oe[i], 4) == 0, "%s [%d][%d]: native %a, expanded %a",
                      kg_ggml_type_name((kg_ggml_type_t)qt), i / E, i % E, (double)on[i],
                      (double)oe[i]);
    }
    double mag = 0;
    for (int32_t i = 0; i < T * E; i++) {
        mag += fabs(on[i]);
    }
    ck_assert(mag > 0); /* the experts ran */
    kg_cuda_op_moe_t m1 = m;
    m1.native = 1;
    m1.n_tokens = 1;
    for (int32_t t = 0; t < T; t += 5) {
        ck_assert_int_eq(
            kg_cuda_op_moe_ffn(&m1, x + (size_t)t * E, logits + (size_t)t * X, one, sel1, w1),
            KG_OK);
        ck_assert_mem_eq(one, on + (size_t)t * E, (size_t)E * 4);
    }
    /* a shape the type's blocks do not divide is refused */
    kg_cuda_op_moe_t bad = m;
    bad.n_ff = k_quant ? 96 : 40;
    ck_assert_int_eq(kg_cuda_op_moe_ffn(&bad, x, logits, oe, se, we), KG_ERR_INVALID);
    free(x), free(logits), free(gate), free(up), free(down), free(gb), free(ub), free(db);
    free(on), free(oe), free(wn), free(we), free(one), free(sn), free(se);
}
END_TEST

START_TEST(refuses_too_many_experts_per_token) {
    float dummy[4] = {0};
    int32_t sel[4];
    kg_cuda_op_moe_t m = {.n_tokens = 1, .n_embd = 32, .n_ff = 32, .n_expert = 40, .k = 33};
    ck_assert_int_eq(kg_cuda_op_moe_ffn(&m, dummy, dummy, dummy, sel, dummy), KG_ERR_INVALID);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda_moe");
    TCase *tc = tcase_create("moe");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, router_vs_cpu, 0,
                        (int)(sizeof(k_moe_routers) / sizeof(k_moe_routers[0])));
    tcase_add_test(tc, refuses_too_many_experts_per_token);
#ifdef KG_CUEMU
    tcase_add_loop_test(tc, native_expert_blocks, 0, 3);
#else
    tcase_add_loop_test(tc, native_expert_blocks, 0,
                        (int)(sizeof(k_native_expert_types) / sizeof(k_native_expert_types[0])));
#endif
    suite_add_tcase(s, tc);
    return s;
}

/* Unforked, as check_cuda: the availability check initialises the CUDA
 * driver, and a forked child cannot use a driver its parent initialised
 * (every call fails with cudaErrorInitializationError on a real GPU; the
 * emulator does not notice). */
int main(void) {
    if (!kg_backend_cuda_available()) {
        fprintf(stderr, "check_cuda_moe: no CUDA device visible, skipping\n");
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
