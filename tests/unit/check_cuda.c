/* check_cuda: the CUDA backend against the CPU backend.
 *
 * Each kernel family on random inputs against the CPU ops or a double
 * reference (tolerances stated per test), the device sampler against
 * kg_sampler_sample on the same logits and RNG seeds, full steps of random
 * models (mixed prefill chunks and decodes of several sequences, blocks out
 * of order, graph replays) against the CPU backend's logits, and greedy
 * stories260K generation token by token on both backends; the n-choices
 * and logit_bias parts (KV block copies, the bias before the device
 * sampler, an engine running n = 3 with a bias) against the CPU.
 *
 * Needs a CUDA device: exits 77 (skipped) when the build has no CUDA
 * backend or no device is visible. Every test case is tagged "gpu". */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "../../gpu/kg_cuda_ops.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/kg_backend.h"
#include "backend/kg_math.h"
#include "engine/kg_engine.h"
#include "model/kg_model.h"
#include "model/kg_quant.h"
#include "model/kg_sampler.h"
#include "model/kg_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// ---- helpers ----

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void seed(uint64_t s) {
    g_rng = s * 0x9E3779B97F4A7C15ull + 1;
}

/* Uniform in [-1, 1). */
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

static float round_to(float x, int dtype) {
    if (dtype == KG_CUDA_OP_BF16) {
        return kg_bf16_to_fp32(kg_fp32_to_bf16(x));
    }
    if (dtype == KG_CUDA_OP_F16) {
        return kg_fp16_to_fp32(kg_fp32_to_fp16(x));
    }
    return x;
}

/* Relative tolerance of one rounding to dtype (one unit in the last place). */
static double ulp_of(int dtype) {
    return dtype == KG_CUDA_OP_BF16 ? 1.0 / 128 : dtype == KG_CUDA_OP_F16 ? 1.0 / 1024 : 1e-6;
}

static double nmse(const float *ref, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)ref[i] - got[i]) * ((double)ref[i] - got[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static const char *dt_name(int dt) {
    return dt == KG_CUDA_OP_BF16 ? "bf16" : dt == KG_CUDA_OP_F16 ? "f16" : "f32";
}

// ---- kernels ----

/* add + RMSNorm: x must equal x + add exactly (one float add), y the CPU's
 * cpu_rmsnorm_rows rounded to dtype within one unit of that type (the sum
 * of squares is added in another order). */
START_TEST(rmsnorm_vs_cpu) {
    const int rows = 5, n = 1000;
    const float eps = 1e-5f;
    for (int dt = 0; dt < 3; dt++) {
        seed(10 + (uint64_t)dt);
        float *x = rand_vec((size_t)rows * n, 3.0f), *add = rand_vec((size_t)rows * n, 1.0f);
        float *w = rand_vec((size_t)n, 1.0f), *y = malloc((size_t)rows * n * 4);
        float *ref_x = malloc((size_t)rows * n * 4), *ref_y = malloc((size_t)rows * n * 4);
        for (int i = 0; i < rows * n; i++) {
            ref_x[i] = x[i] + add[i];
        }
        cpu_rmsnorm_rows(ref_x, w, ref_y, rows, n, eps);
        ck_assert_int_eq(kg_cuda_op_add_rmsnorm(x, add, w, y, rows, n, eps, dt), KG_OK);
        for (int i = 0; i < rows * n; i++) {
            ck_assert_msg(x[i] == ref_x[i], "%s x[%d] %g != %g", dt_name(dt), i, x[i], ref_x[i]);
            const double r = round_to(ref_y[i], dt);
            ck_assert_msg(fabs(y[i] - r) <= ulp_of(dt) * fabs(r) + 1e-30, "%s y[%d] %g vs %g",
                          dt_name(dt), i, y[i], r);
        }
        /* without the residual: x unchanged */
        memcpy(ref_x, x, (size_t)rows * n * 4);
        ck_assert_int_eq(kg_cuda_op_add_rmsnorm(x, NULL, w, y, rows, n, eps, dt), KG_OK);
        ck_assert_int_eq(memcmp(x, ref_x, (size_t)rows * n * 4), 0);
        free(x), free(add), free(w), free(y), free(ref_x), free(ref_y);
    }
}
END_TEST

/* Paged layout used by the rope and attention tests: two sequences, block
 * size 4, blocks out of order. */
static const int32_t k_table[] = {5, 2, 7, 0, /* seq 1: */ 3, 6, 1, 4};

/* RoPE + KV store: q rounded to fp16 and k, v in their cache rows, against
 * kg_rope_cache + kg_rope_pair on the host (within 2 fp16 units: the
 * device's cosf/sinf/powf may differ from glibc's in the last bit). */
static void check_rope(int n_head, int n_kv, int hd, int n_rot) {
    const int T = 6, bs = 4, n_rows = 8 * bs;
    const int32_t pos[6] = {0, 5, 13, 2, 3, 9};
    const int32_t off[6] = {0, 0, 0, 4, 4, 4};
    const int nq = n_head * hd, nkv = n_kv * hd, W = nq + 2 * nkv;
    seed((uint64_t)(hd + n_rot));
    float *qkv = rand_vec((size_t)T * W, 2.0f), *q = malloc((size_t)T * nq * 4);
    float *kc = malloc((size_t)n_rows * nkv * 4), *vc = malloc((size_t)n_rows * nkv * 4);
    for (int i = 0; i < n_rows * nkv; i++) {
        kc[i] = vc[i] = 7.0f; /* rows the step does not write keep this */
    }
    kg_cuda_op_attn_t a = {.n_head = n_head,
                           .n_head_kv = n_kv,
                           .head_dim = hd,
                           .n_rot = n_rot,
                           .block_size = bs,
                           .rope_base = 10000.0f,
                           .rope_scale = 1.0f,
                           .n_tokens = T,
                           .pos = pos,
                           .tbl_off = off,
                           .table = k_table,
                           .n_table = 8,
                           .n_cache_rows = n_rows};
    ck_assert_int_eq(kg_cuda_op_rope_store(&a, qkv, q, kc, vc), KG_OK);
    bool written[32] = {false};
    for (int t = 0; t < T; t++) {
        float cs[256], row[512];
        kg_rope_cache(pos[t], n_rot, 10000.0f, 1.0f, NULL, cs, cs + n_rot / 2);
        memcpy(row, qkv + (size_t)t * W, (size_t)(nq + nkv) * 4);
        for (int h = 0; h < n_head + n_kv; h++) {
            for (int i = 0; i < n_rot / 2; i++) {
                kg_rope_pair(&row[h * hd + 2 * i], &row[h * hd + 2 * i + 1], cs[i],
                             cs[n_rot / 2 + i]);
            }
        }
        const int r = k_table[off[t] + pos[t] / bs] * bs + pos[t] % bs;
        written[r] = true;
        for (int i = 0; i < nq; i++) {
            const float want = round_to(row[i], KG_CUDA_OP_F16), got = q[t * nq + i];
            ck_assert_msg(fabsf(got - want) <= 2.0f / 1024 * fabsf(want) + 1e-6f,
                          "q t=%d i=%d: %g vs %g", t, i, got, want);
        }
        for (int i = 0; i < nkv; i++) {
            const float want = round_to(row[nq + i], KG_CUDA_OP_F16), got = kc[r * nkv + i];
            ck_assert_msg(fabsf(got - want) <= 2.0f / 1024 * fabsf(want) + 1e-6f,
                          "k t=%d i=%d: %g vs %g", t, i, got, want);
            ck_assert_float_eq(vc[r * nkv + i],
                               round_to(qkv[(size_t)t * W + nq + nkv + i], KG_CUDA_OP_F16));
        }
    }
    for (int r = 0; r < n_rows; r++) {
        if (!written[r]) {
            ck_assert_float_eq(kc[r * nkv], 7.0f);
            ck_assert_float_eq(vc[r * nkv + nkv - 1], 7.0f);
        }
    }
    free(qkv), free(q), free(kc), free(vc);
}

START_TEST(rope_vs_cpu) {
    check_rope(4, 2, 16, 16);
    check_rope(3, 1, 64, 32); /* partial rotation: n_rot < head_dim */
    check_rope(2, 2, 128, 128);
}
END_TEST

/* Attention against a double reference that follows the CPU backend: q, K
 * and V in fp16, softmax in double. Output in F32, so the bound is the
 * float accumulation only: NMSE < 1e-9 per token. Also bf16 output
 * (NMSE < 1e-4) and several split counts (1, 3, automatic). */
static void check_attention(int n_head, int n_kv, int hd, int dt, int n_split) {
    enum { T = 7, BS = 16, N_BLOCKS = 16 };
    const int32_t pos[T] = {0, 1, 31, 32, 100, 17, 63};
    const int32_t off[T] = {0, 0, 0, 0, 0, 8, 8};
    const int32_t table[16] = {9, 3, 14, 0, 7, 1, 12, 5, /* seq 1: */ 2, 15, 4, 11, 6, 8, 10, 13};
    const int nq = n_head * hd, nkv = n_kv * hd, rows = N_BLOCKS * BS, group = n_head / n_kv;
    seed((uint64_t)(n_head * 1000 + hd));
    float *q = rand_vec((size_t)T * nq, 1.0f), *kc = rand_vec((size_t)rows * nkv, 1.0f);
    float *vc = rand_vec((size_t)rows * nkv, 1.0f), *out = malloc((size_t)T * nq * 4);
    float *ref = malloc((size_t)T * nq * 4);
    for (int i = 0; i < T * nq; i++) {
        q[i] = round_to(q[i], KG_CUDA_OP_F16);
    }
    for (int i = 0; i < rows * nkv; i++) {
        kc[i] = round_to(kc[i], KG_CUDA_OP_F16);
        vc[i] = round_to(vc[i], KG_CUDA_OP_F16);
    }
    kg_cuda_op_attn_t a = {.n_head = n_head,
                           .n_head_kv = n_kv,
                           .head_dim = hd,
                           .n_rot = hd,
                           .block_size = BS,
                           .n_tokens = T,
                           .pos = pos,
                           .tbl_off = off,
                           .table = table,
                           .n_table = 16,
                           .n_cache_rows = rows};
    ck_assert_int_eq(kg_cuda_op_attention(&a, q, kc, vc, n_split, out, dt), KG_OK);
    double *s = malloc(128 * sizeof(double));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_head; h++) {
            const int g = h / group;
            double m = -INFINITY, sum = 0;
            for (int p = 0; p <= pos[t]; p++) {
                const int r = table[off[t] + p / BS] * BS + p % BS;
                double d = 0;
                for (int i = 0; i < hd; i++) {
                    d += (double)q[(t * n_head + h) * hd + i] * kc[r * nkv + g * hd + i];
                }
                s[p] = d / sqrt((double)hd);
                m = fmax(m, s[p]);
            }
            for (int p = 0; p <= pos[t]; p++) {
                s[p] = exp(s[p] - m);
                sum += s[p];
            }
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p = 0; p <= pos[t]; p++) {
                    const int r = table[off[t] + p / BS] * BS + p % BS;
                    acc += s[p] / sum * vc[r * nkv + g * hd + i];
                }
                ref[(t * n_head + h) * hd + i] = (float)acc;
            }
        }
        const double e = nmse(ref + t * nq, out + t * nq, (size_t)nq);
        const double bound = dt == KG_CUDA_OP_F32 ? 1e-9 : 1e-4;
        ck_assert_msg(e < bound, "heads %d/%d hd %d %s split %d token %d (pos %d): nmse %g", n_head,
                      n_kv, hd, dt_name(dt), n_split, t, pos[t], e);
    }
    free(q), free(kc), free(vc), free(out), free(ref), free(s);
}

START_TEST(attention_vs_reference) {
    const int splits[3] = {1, 3, 0};
    for (int i = 0; i < 3; i++) {
        check_attention(8, 2, 64, KG_CUDA_OP_F32, splits[i]);   /* GQA, 4 heads per KV head */
        check_attention(32, 2, 128, KG_CUDA_OP_F32, splits[i]); /* 16 per KV head: 2 blocks */
        check_attention(4, 4, 256, KG_CUDA_OP_F32, splits[i]);  /* MHA, widest heads */
        check_attention(9, 3, 8, KG_CUDA_OP_F32, splits[i]);    /* tiny heads */
    }
    check_attention(8, 2, 64, KG_CUDA_OP_BF16, 0);
    check_attention(8, 2, 64, KG_CUDA_OP_F16, 1);
}
END_TEST

/* SwiGLU: kg_silu(g) * u rounded to dtype, within one unit (expf may
 * differ in the last bit). */
START_TEST(swiglu_vs_cpu) {
    const int rows = 3, F = 777;
    for (int dt = 0; dt < 3; dt++) {
        seed(30 + (uint64_t)dt);
        float *gu = rand_vec((size_t)rows * 2 * F, 6.0f), *h = malloc((size_t)rows * F * 4);
        ck_assert_int_eq(kg_cuda_op_swiglu(gu, h, rows, F, dt), KG_OK);
        for (int t = 0; t < rows; t++) {
            for (int f = 0; f < F; f++) {
                const float want = round_to(kg_silu(gu[t * 2 * F + f]) * gu[t * 2 * F + F + f], dt);
                const float got = h[t * F + f];
                ck_assert_msg(fabsf(got - want) <= (float)ulp_of(dt) * fabsf(want) + 1e-30f,
                              "%s [%d][%d]: %g vs %g", dt_name(dt), t, f, got, want);
            }
        }
        free(gu), free(h);
    }
}
END_TEST

/* GEMM (cuBLAS) and GEMV against a double reference on the rounded
 * inputs: |y - ref| <= 2e-5 * sum |w x| (float accumulation over <= 256 terms). */
START_TEST(gemm_vs_reference) {
    const int row_counts[5] = {1, 3, 8, 9, 40};
    const int n_ins[2] = {256, 100}; /* 100: not a multiple of 8, GEMV falls back to cuBLAS */
    const int n_out = 96;
    char err[256] = "";
    for (int dt = 0; dt < 3; dt++) {
        for (int ii = 0; ii < 2; ii++) {
            const int n_in = n_ins[ii];
            seed(40 + (uint64_t)(dt * 10 + ii));
            float *w = rand_vec((size_t)n_out * n_in, 1.0f), *x = rand_vec((size_t)40 * n_in, 1.0f);
            float *y = malloc((size_t)40 * n_out * 4);
            for (int ri = 0; ri < 5; ri++) {
                for (int gemv = 0; gemv < 2; gemv++) {
                    const int rows = row_counts[ri];
                    ck_assert_msg(kg_cuda_op_gemm(w, x, y, rows, n_out, n_in, dt, gemv != 0, err,
                                                  sizeof(err)) == KG_OK,
                                  "gemm: %s", err);
                    for (int r = 0; r < rows; r++) {
                        for (int o = 0; o < n_out; o++) {
                            double ref = 0, mag = 0;
                            for (int i = 0; i < n_in; i++) {
                                const double p = (double)round_to(w[o * n_in + i], dt) *
                                                 round_to(x[r * n_in + i], dt);
                                ref += p;
                                mag += fabs(p);
                            }
                            ck_assert_msg(fabs(y[r * n_out + o] - ref) <= 2e-5 * mag + 1e-12,
                                          "%s n_in %d rows %d gemv %d [%d][%d]: %g vs %g",
                                          dt_name(dt), n_in, rows, gemv, r, o, y[r * n_out + o],
                                          ref);
                        }
                    }
                }
            }
            free(w), free(x), free(y);
        }
    }
}
END_TEST

// ---- sampler ----

#define SV      3000

/* One parameter set of the sampler test. */
typedef struct sample_case {
    float temperature, top_p, min_p, rep, freq, pres;
    int32_t top_k, last_n, n_logprobs;
    int logits_kind; /* 0 random, 1 ties (quarter steps), 2 flat, 3 NaN/inf, 4 all -inf */
} sample_case_t;

static const sample_case_t k_cases[] = {
    {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 0, 0},     /* greedy */
    {0.0f, 1.0f, 0.0f, 1.3f, 0.4f, 0.2f, 0, 64, 3, 1},     /* greedy, penalties, ties */
    {0.8f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 0, 0},     /* temperature only */
    {1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 40, 64, 5, 0},    /* top-k */
    {0.7f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 40, 64, 0, 1},    /* top-k + top-p, ties */
    {1.2f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 2500, 64, 0, 0}, /* top-k over several chunks */
    {1.0f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 0, 0},     /* top-p alone (histogram) */
    {1.0f, 0.5f, 0.05f, 1.0f, 0.0f, 0.0f, 0, 64, 2, 1},    /* top-p + min-p, ties */
    {1.0f, 1.0f, 0.1f, 1.0f, 0.0f, 0.0f, 0, 64, 0, 0},     /* min-p alone */
    {1.5f, 0.8f, 0.0f, 1.3f, 0.5f, 0.3f, 0, -1, 0, 0},     /* penalties over everything */
    {1.0f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 4, 2},     /* flat: one huge boundary bucket */
    {0.9f, 1.0f, 0.0f, 1.1f, 0.0f, 0.0f, 0, 8, 3, 3},      /* NaN and +inf logits */
    {1.0f, 0.9f, 0.02f, 1.0f, 0.0f, 0.0f, 50, 64, 2, 4},   /* all masked */
    {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 20, 4},    /* all masked, greedy */
};
#define N_CASES ((int)(sizeof(k_cases) / sizeof(k_cases[0])))
#define N_SEEDS 6

static void fill_logits(float *l, int kind) {
    for (int i = 0; i < SV; i++) {
        const float x = frand() * 4.0f + (i % 97 == 0 ? 6.0f : 0.0f);
        l[i] = kind == 1 ? roundf(x * 4.0f) / 4.0f : kind == 2 ? 0.5f : kind == 4 ? -INFINITY : x;
    }
    if (kind == 3) {
        l[11] = NAN;
        l[500] = INFINITY;
        l[501] = INFINITY;
        l[2999] = NAN;
    }
}

/* The device sampler against kg_sampler_sample on the same logits and
 * seeds: the same token, the same RNG state afterwards, logprobs within
 * 1e-4. (The draw can only differ when it falls within the last-bit
 * difference of expf between the device and glibc near a boundary.) */
START_TEST(sample_vs_cpu) {
    const int rows = N_CASES * N_SEEDS;
    float *logits = malloc((size_t)rows * SV * sizeof(float));
    kg_sampling_params_t params[N_CASES * N_SEEDS];
    kg_rng_t rng_gpu[N_CASES * N_SEEDS], rng_cpu[N_CASES * N_SEEDS];
    kg_sample_request_t reqs[N_CASES * N_SEEDS];
    kg_sample_result_t got[N_CASES * N_SEEDS], want;
    int32_t prompt[300], output[200];
    seed(50);
    for (int i = 0; i < 300; i++) {
        prompt[i] = (int32_t)((frand() + 1.0f) * 0.5f * SV);
    }
    for (int i = 0; i < 200; i++) {
        output[i] = i % 3 == 0 ? 7 : (int32_t)((frand() + 1.0f) * 0.5f * SV); /* 7 repeats */
    }
    output[5] = -1; /* out of range: ignored by both */
    for (int c = 0; c < N_CASES; c++) {
        for (int s = 0; s < N_SEEDS; s++) {
            const int r = c * N_SEEDS + s;
            const sample_case_t *k = &k_cases[c];
            fill_logits(logits + (size_t)r * SV, k->logits_kind);
            kg_sampling_params_t *p = &params[r];
            *p = kg_sampling_params_default();
            p->temperature = k->temperature;
            p->top_p = k->top_p;
            p->min_p = k->min_p;
            p->top_k = k->top_k;
            p->repetition_penalty = k->rep;
            p->frequency_penalty = k->freq;
            p->presence_penalty = k->pres;
            p->penalty_last_n = k->last_n;
            p->n_logprobs = k->n_logprobs;
            p->seed = 1000 + (uint64_t)r;
            kg_rng_seed(&rng_gpu[r], p->seed);
            rng_cpu[r] = rng_gpu[r];
            reqs[r] = (kg_sample_request_t){.params = p,
                                            .rng = &rng_gpu[r],
                                            .prompt = prompt,
                                            .n_prompt = 300,
                                            .output = output,
                                            .n_output = 200};
        }
    }
    ck_assert_int_eq(kg_cuda_op_sample(logits, rows, SV, reqs, got), KG_OK);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(SV);
    ck_assert_ptr_nonnull(sc);
    for (int r = 0; r < rows; r++) {
        memset(&want, 0, sizeof(want));
        kg_sampler_sample(&params[r], &rng_cpu[r], logits + (size_t)r * SV, SV, prompt, 300, output,
                          200, sc, &want);
        const int c = r / N_SEEDS;
        ck_assert_msg(got[r].token == want.token, "case %d seed %d: token %d, cpu %d", c,
                      r % N_SEEDS, got[r].token, want.token);
        ck_assert_msg(memcmp(&rng_cpu[r], &rng_gpu[r], sizeof(kg_rng_t)) == 0,
                      "case %d: RNG advanced differently", c);
        ck_assert_msg(fabsf(got[r].logprob - want.logprob) <= 1e-4f ||
                          (isinf(got[r].logprob) && got[r].logprob == want.logprob),
                      "case %d: logprob %g, cpu %g", c, got[r].logprob, want.logprob);
        ck_assert_int_eq(got[r].n_top, want.n_top);
        for (int i = 0; i < want.n_top; i++) {
            ck_assert_msg(got[r].top_token[i] == want.top_token[i], "case %d top %d: %d vs %d", c,
                          i, got[r].top_token[i], want.top_token[i]);
            ck_assert_msg(fabsf(got[r].top_logprob[i] - want.top_logprob[i]) <= 1e-4f ||
                              got[r].top_logprob[i] == want.top_logprob[i],
                          "case %d top %d logprob: %g vs %g", c, i, got[r].top_logprob[i],
                          want.top_logprob[i]);
        }
    }
    kg_sampler_scratch_free(sc);
    free(logits);
}
END_TEST

// ---- full steps ----

static kg_model_t *load(const char *path) {
    char err[256];
    ck_assert_ptr_nonnull(path);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

static kg_backend_t *make_backend(const char *name, const kg_model_t *m, int max_tokens) {
    char err[256] = "";
    kg_backend_params_t p = {
        .n_threads = 2, .n_kv_blocks = 32, .kv_block_size = 4, .max_batch_tokens = max_tokens};
    kg_backend_t *be = strcmp(name, "cpu") == 0 ? kg_backend_cpu_new(m, &p, err, sizeof(err))
                                                : kg_backend_cuda_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s backend: %s", name, err);
    return be;
}

/* A step: `n` tokens as (seq, first position, count, wants logits of its last). */
typedef struct chunk {
    int32_t seq, pos0, n;
} chunk_t;

typedef struct step {
    int32_t n_tokens, n_outputs;
    int32_t token[32], pos[32], seq[32];
    bool want[32];
} step_t;

static void build_step(step_t *s, const chunk_t *chunks, int n_chunks, bool all_logits) {
    memset(s, 0, sizeof(*s));
    for (int c = 0; c < n_chunks; c++) {
        for (int i = 0; i < chunks[c].n; i++) {
            const int t = s->n_tokens++;
            s->seq[t] = chunks[c].seq;
            s->pos[t] = chunks[c].pos0 + i;
            s->token[t] = (int32_t)((chunks[c].seq * 131 + s->pos[t] * 17 + 5) % 250);
            s->want[t] = all_logits || i == chunks[c].n - 1;
            s->n_outputs += s->want[t];
        }
    }
}

/* 3 slots, blocks out of order */
static const int32_t k_step_table[3 * 8] = {9,  3,  14, 0,  7,  1, 2,  5, 20, 11, 30, 12,
                                            25, 13, 4,  16, 31, 6, 17, 8, 22, 18, 10, 19};

static kg_step_batch_t as_batch(const step_t *s) {
    kg_step_batch_t b = {.n_tokens = s->n_tokens,
                         .token = s->token,
                         .pos = s->pos,
                         .seq = s->seq,
                         .want_logits = s->want,
                         .n_outputs = s->n_outputs,
                         .n_slots = 3,
                         .max_blocks_per_seq = 8,
                         .block_table = k_step_table};
    return b;
}

/* Run the same steps on the CPU and the CUDA backend and compare every
 * step's logits (NMSE per row below `bound`); then the device sampler on
 * a re-run of the last step against the CPU sampler on its logits. */
static void check_steps(const kg_test_model_opts_t *o, double bound) {
    kg_model_t *m = load(kg_test_make_model(o));
    const int V = m->hp.n_vocab;
    kg_backend_t *cpu = make_backend("cpu", m, 32), *gpu = make_backend("cuda", m, 32);
    ck_assert(kg_backend_is_cuda(gpu));
    ck_assert(!kg_backend_is_cuda(cpu));
    ck_assert(kg_backend_has_sample(gpu));
    kg_backend_memory_t mem;
    kg_backend_memory(gpu, &mem);
    ck_assert(mem.weights_size > 0 && mem.kv_size > 0 && mem.scratch_size > 0);
    float *lc = malloc((size_t)32 * V * 4), *lg = malloc((size_t)32 * V * 4);
    step_t s;
    memset(&s, 0, sizeof(s));
    kg_step_batch_t b = as_batch(&s);

    /* prefill chunks of two sequences */
    const chunk_t s1[2] = {{0, 0, 7}, {1, 0, 5}};
    /* a decode, a prefill continuation and a new prefill */
    const chunk_t s2[3] = {{0, 7, 1}, {1, 5, 5}, {2, 0, 3}};
    for (int k = 0; k < 12; k++) {
        if (k == 0) {
            build_step(&s, s1, 2, false);
        } else if (k == 1) {
            build_step(&s, s2, 3, false);
        } else if (k < 10) {
            /* decodes of all three (graph of bucket 4, captured once, replayed) */
            const chunk_t d[3] = {{0, 6 + k, 1}, {1, 8 + k, 1}, {2, 1 + k, 1}};
            build_step(&s, d, 3, false);
        } else if (k == 10) {
            const chunk_t d[2] = {{0, 16, 1}, {2, 11, 1}}; /* bucket 2 */
            build_step(&s, d, 2, false);
        } else {
            const chunk_t d[1] = {{1, 18, 6}}; /* a chunk with all logits: graph of bucket 8 */
            build_step(&s, d, 1, true);
        }
        b = as_batch(&s);
        ck_assert_int_eq(kg_backend_forward(cpu, &b, lc), KG_OK);
        ck_assert_int_eq(kg_backend_forward(gpu, &b, lg), KG_OK);
        for (int r = 0; r < s.n_outputs; r++) {
            const double e = nmse(lc + (size_t)r * V, lg + (size_t)r * V, (size_t)V);
            ck_assert_msg(e < bound, "%s step %d row %d: nmse %g >= %g", o->type ? o->type : "f32",
                          k, r, e, bound);
        }
    }

    /* a bad batch is refused and leaves the backend usable */
    int32_t bad_tok = V + 5;
    kg_step_batch_t bad = b;
    bad.token = &bad_tok;
    bad.n_tokens = 1;
    bad.n_outputs = 1;
    ck_assert_int_eq(kg_backend_forward(gpu, &bad, lg), KG_ERR_INVALID);

    /* device sampling of the last step: greedy and seeded, against the CPU
     * sampler on the same logits (re-running a step rewrites the same KV) */
    ck_assert_int_eq(kg_backend_forward(gpu, &b, lg), KG_OK);
    ck_assert_int_eq(kg_backend_forward(gpu, &b, NULL), KG_OK);
    kg_sampling_params_t p[6];
    kg_rng_t rg[6], rc[6];
    kg_sample_request_t req[6];
    kg_sample_result_t out[6], want;
    const int32_t hist[4] = {3, 9, 3, 40};
    for (int r = 0; r < s.n_outputs; r++) {
        p[r] = kg_sampling_params_default();
        if (r % 2 == 1) {
            p[r].temperature = 0.9f;
            p[r].top_k = 20;
            p[r].top_p = 0.9f;
            p[r].repetition_penalty = 1.2f;
        }
        kg_rng_seed(&rg[r], 77 + (uint64_t)r);
        rc[r] = rg[r];
        req[r] = (kg_sample_request_t){.params = &p[r],
                                       .rng = &rg[r],
                                       .prompt = hist,
                                       .n_prompt = 4,
                                       .output = hist,
                                       .n_output = 2};
    }
    ck_assert_int_eq(kg_backend_sample(gpu, req, s.n_outputs, out), KG_OK);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(V);
    for (int r = 0; r < s.n_outputs; r++) {
        kg_sampler_sample(&p[r], &rc[r], lg + (size_t)r * V, V, hist, 4, hist, 2, sc, &want);
        ck_assert_msg(out[r].token == want.token, "row %d: device %d, cpu %d", r, out[r].token,
                      want.token);
        ck_assert_int_eq(memcmp(&rg[r], &rc[r], sizeof(kg_rng_t)), 0);
    }
    /* the rows are consumed */
    ck_assert_int_eq(kg_backend_sample(gpu, req, 1, out), KG_ERR_INVALID);
    kg_sampler_scratch_free(sc);
    free(lc), free(lg);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    kg_model_free(m);
}

START_TEST(step_f32) {
    /* F32 weights stay F32 on the device: only summation order differs */
    kg_test_model_opts_t o = {
        .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 96, .seed = 11};
    check_steps(&o, 1e-6);
}
END_TEST

START_TEST(step_f16_mqa) {
    kg_test_model_opts_t o = {.n_embd = 128,
                              .n_layer = 2,
                              .n_head = 8,
                              .n_head_kv = 1,
                              .n_ff = 160,
                              .type = "f16",
                              .seed = 12};
    check_steps(&o, 1e-5);
}
END_TEST

START_TEST(step_bf16_tied_wide_heads) {
    kg_test_model_opts_t o = {.n_embd = 256,
                              .n_layer = 2,
                              .n_head = 2,
                              .n_head_kv = 1,
                              .n_ff = 256,
                              .tied = true,
                              .type = "bf16",
                              .seed = 13};
    check_steps(&o, 1e-4);
}
END_TEST

START_TEST(step_q8_0) {
    /* Q8_0 weights become BF16 on the device while the CPU rounds the
     * activations to Q8_0 blocks: the loosest bound */
    kg_test_model_opts_t o = {.n_embd = 128,
                              .n_layer = 2,
                              .n_head = 4,
                              .n_head_kv = 4,
                              .n_ff = 256,
                              .type = "q8_0",
                              .seed = 14};
    check_steps(&o, 1e-2);
}
END_TEST

/* Greedy generation on stories260K, token by token on both backends: the
 * device (forward without host logits + device sampler) picks the same ids
 * as the CPU (host logits + argmax). */
START_TEST(stories260k_greedy_vs_cpu) {
    const char *path = kg_test_data("models/stories260K.gguf");
    if (!kg_test_exists(path)) {
        ck_abort_msg("missing %s", path);
    }
    kg_model_t *m = load(path);
    const int V = m->hp.n_vocab;
    kg_backend_t *cpu = make_backend("cpu", m, 32), *gpu = make_backend("cuda", m, 32);
    int32_t ids[128];
    const char *prompt = "Once upon a time";
    const int64_t n = kg_tokenizer_encode(m->tok, prompt, strlen(prompt), true, false, ids, 128);
    ck_assert(n > 1 && n < 32);
    float *lc = malloc((size_t)V * 4);
    int32_t gen_cpu[64], gen_gpu[64], pos[32], seq[32];
    bool want[32];
    const int32_t table[8] = {6, 1, 7, 0, 5, 2, 4, 3}; /* 32 positions in blocks of 4 */
    kg_sampling_params_t greedy = kg_sampling_params_default();
    kg_rng_t rng;
    kg_rng_seed(&rng, 1);
    int32_t cur_cpu = -1, cur_gpu = -1;
    const int n_gen = 32 - (int)n;
    for (int k = 0; k <= n_gen; k++) {
        /* step 0: the prompt; then one token each */
        const int T = k == 0 ? (int)n : 1;
        const int32_t p0 = k == 0 ? 0 : (int32_t)n + k - 1;
        for (int i = 0; i < T; i++) {
            pos[i] = p0 + i;
            seq[i] = 0;
            want[i] = i == T - 1;
        }
        int32_t tc[32], tg[32];
        for (int i = 0; i < T; i++) {
            tc[i] = k == 0 ? ids[i] : cur_cpu;
            tg[i] = k == 0 ? ids[i] : cur_gpu;
        }
        kg_step_batch_t bc = {.n_tokens = T,
                              .token = tc,
                              .pos = pos,
                              .seq = seq,
                              .want_logits = want,
                              .n_outputs = 1,
                              .n_slots = 1,
                              .max_blocks_per_seq = 8,
                              .block_table = table};
        kg_step_batch_t bg = bc;
        bg.token = tg;
        ck_assert_int_eq(kg_backend_forward(cpu, &bc, lc), KG_OK);
        ck_assert_int_eq(kg_backend_forward(gpu, &bg, NULL), KG_OK);
        int best = 0;
        for (int i = 1; i < V; i++) {
            best = lc[i] > lc[best] ? i : best;
        }
        kg_sample_request_t req = {.params = &greedy,
                                   .rng = &rng,
                                   .prompt = ids,
                                   .n_prompt = (int32_t)n,
                                   .output = NULL,
                                   .n_output = 0};
        kg_sample_result_t res;
        ck_assert_int_eq(kg_backend_sample(gpu, &req, 1, &res), KG_OK);
        if (k < n_gen) {
            gen_cpu[k] = cur_cpu = best;
            gen_gpu[k] = cur_gpu = res.token;
            ck_assert_msg(gen_cpu[k] == gen_gpu[k], "token %d: cpu %d, cuda %d", k, gen_cpu[k],
                          gen_gpu[k]);
        }
    }
    free(lc);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

// ---- n choices and logit_bias ----

START_TEST(kv_copy_vs_cpu) {
    enum { PLANES = 4, BLOCKS = 6, ELEMS = 12 };
    uint16_t kv[PLANES * BLOCKS * ELEMS], want[PLANES * BLOCKS * ELEMS];
    for (int i = 0; i < PLANES * BLOCKS * ELEMS; i++) {
        kv[i] = want[i] = (uint16_t)(i * 7 + 1);
    }
    const int32_t src[2] = {1, 4}, dst[2] = {3, 0};
    for (int p = 0; p < PLANES; p++) {
        for (int k = 0; k < 2; k++) {
            memcpy(want + (p * BLOCKS + dst[k]) * ELEMS, want + (p * BLOCKS + src[k]) * ELEMS,
                   ELEMS * sizeof(uint16_t));
        }
    }
    ck_assert_int_eq(kg_cuda_op_kv_copy(kv, PLANES, BLOCKS, ELEMS, src, dst, 2), KG_OK);
    ck_assert_mem_eq(kv, want, sizeof(kv));
}
END_TEST

/* The bias kernel then the device sampler (without the bias) must pick
 * what kg_sampler_sample picks with the bias, on the same raw logits. */
START_TEST(logit_bias_vs_cpu) {
    enum { ROWS = 6 };
    static float raw[ROWS * SV], biased[ROWS * SV];
    seed(77);
    for (int i = 0; i < ROWS * SV; i++) {
        raw[i] = 3.0f * frand();
    }
    raw[2 * SV + 10] = NAN;
    raw[3 * SV + 11] = INFINITY;
    /* row 0: ban its argmax; 1: force a bad token; 2: NaN and a shift; 3: +inf
     * biased, and an id outside the vocabulary; 4: none; 5: many */
    int best0 = 0;
    for (int i = 1; i < SV; i++) {
        best0 = raw[i] > raw[best0] ? i : best0;
    }
    static kg_logit_bias_t lb[ROWS][64];
    int32_t nb[ROWS] = {1, 1, 2, 3, 0, 64};
    lb[0][0] = (kg_logit_bias_t){best0, -100.0f};
    lb[1][0] = (kg_logit_bias_t){17, 100.0f};
    lb[2][0] = (kg_logit_bias_t){10, 4.0f};
    lb[2][1] = (kg_logit_bias_t){12, 2.5f};
    lb[3][0] = (kg_logit_bias_t){11, -5.0f};
    lb[3][1] = (kg_logit_bias_t){13, 50.0f};
    lb[3][2] = (kg_logit_bias_t){SV + 3, 100.0f};
    for (int k = 0; k < 64; k++) {
        lb[5][k] = (kg_logit_bias_t){k * 41 % SV, (float)(k % 7) - 3.0f - (k == 5 ? 200 : 0)};
    }
    kg_sampling_params_t with[ROWS], without[ROWS];
    kg_rng_t rng_gpu[ROWS], rng_cpu[ROWS];
    kg_sample_request_t reqs[ROWS], plain[ROWS];
    for (int r = 0; r < ROWS; r++) {
        with[r] = kg_sampling_params_default();
        with[r].temperature = r % 2 ? 0.9f : 0.0f;
        with[r].n_logprobs = 3;
        with[r].seed = 90 + (uint64_t)r;
        with[r].logit_bias = lb[r];
        with[r].n_logit_bias = nb[r];
        without[r] = with[r];
        without[r].logit_bias = NULL;
        without[r].n_logit_bias = 0;
        kg_rng_seed(&rng_gpu[r], with[r].seed);
        rng_cpu[r] = rng_gpu[r];
        reqs[r] = (kg_sample_request_t){.params = &with[r], .rng = &rng_gpu[r]};
        plain[r] = (kg_sample_request_t){.params = &without[r], .rng = &rng_gpu[r]};
    }
    memcpy(biased, raw, sizeof(raw));
    ck_assert_int_eq(kg_cuda_op_logit_bias(biased, ROWS, SV, reqs), KG_OK);
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < SV; i++) {
            float want = raw[r * SV + i], got = biased[r * SV + i];
            for (int k = 0; k < nb[r]; k++) {
                if (lb[r][k].token == i) {
                    want = lb[r][k].bias <= -100.0f ? -INFINITY : raw[r * SV + i] + lb[r][k].bias;
                }
            }
            ck_assert_msg((isnan(want) && isnan(got)) || want == got,
                          "row %d token %d: %g, want %g", r, i, got, want);
        }
    }
    kg_sample_result_t got[ROWS], want;
    ck_assert_int_eq(kg_cuda_op_sample(biased, ROWS, SV, plain, got), KG_OK);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(SV);
    for (int r = 0; r < ROWS; r++) {
        kg_sampler_sample(&with[r], &rng_cpu[r], raw + r * SV, SV, NULL, 0, NULL, 0, sc, &want);
        ck_assert_msg(got[r].token == want.token, "row %d: token %d, cpu %d", r, got[r].token,
                      want.token);
        ck_assert_msg(fabsf(got[r].logprob - want.logprob) <= 1e-4f, "row %d: logprob %g, cpu %g",
                      r, got[r].logprob, want.logprob);
        ck_assert_int_eq(got[r].top_token[0], want.top_token[0]);
    }
    ck_assert_int_ne(got[0].token, best0);
    ck_assert_int_eq(got[1].token, 17);
    kg_sampler_scratch_free(sc);
}
END_TEST

typedef struct choice_out {
    int32_t tok[4][16];
    int32_t n[4];
    int64_t n_forks, n_prefill;
} choice_out_t;

/* stories260K in an engine on `be`: n = 3 greedy choices of one prompt with
 * token `banned` banned, and one more request with a +100 bias. */
static void run_choices(kg_backend_t *be, const kg_model_t *m, int32_t banned, choice_out_t *o) {
    char err[256];
    kg_engine_params_t p = kg_engine_params_default(m, 0);
    p.max_batch_size = 4;
    p.max_queue_depth = 4;
    p.max_batch_tokens = 32;
    p.max_seq_len = 32;
    p.kv_block_size = 4;
    p.n_kv_blocks = 32;
    p.prefix_cache = false;
    kg_engine_t *e = kg_engine_new(be, &p, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    int32_t ids[32];
    const char *prompt = "Once upon a time";
    const int64_t n = kg_tokenizer_encode(m->tok, prompt, strlen(prompt), true, false, ids, 32);
    ck_assert(n > 1 && n < 16);
    const kg_logit_bias_t ban = {banned, -100.0f}, force = {300, 100.0f};
    kg_request_t a = {.id = 1,
                      .prompt = ids,
                      .n_prompt = (int32_t)n,
                      .max_tokens = 12,
                      .ignore_eos = true,
                      .sampling = kg_sampling_params_default(),
                      .n_choices = 3};
    a.sampling.logit_bias = &ban;
    a.sampling.n_logit_bias = 1;
    kg_request_t b = a;
    b.id = 2;
    b.n_choices = 1;
    b.max_tokens = 6;
    b.sampling.logit_bias = &force;
    ck_assert_int_eq(kg_engine_submit(e, &a), KG_OK);
    ck_assert_int_eq(kg_engine_submit(e, &b), KG_OK);
    kg_completion_t comps[8];
    memset(o, 0, sizeof(*o));
    for (int steps = 0; kg_engine_busy(e); steps++) {
        ck_assert_int_lt(steps, 100);
        int32_t k = kg_engine_step(e, comps, 8);
        ck_assert_int_ge(k, 0);
        for (int32_t i = 0; i < k; i++) {
            const int c = comps[i].id == 1 ? comps[i].choice : 3;
            if (comps[i].token >= 0) {
                ck_assert_int_lt(o->n[c], 16);
                o->tok[c][o->n[c]++] = comps[i].token;
            }
        }
    }
    kg_engine_stats_t st;
    kg_engine_stats(e, &st);
    o->n_forks = st.n_forks;
    o->n_prefill = st.n_prefill_tokens;
    kg_engine_free(e);
}

START_TEST(engine_choices_vs_cpu) {
    kg_model_t *m = load(kg_test_data("models/stories260K.gguf"));
    kg_backend_t *cpu = make_backend("cpu", m, 32), *gpu = make_backend("cuda", m, 32);
    ck_assert(kg_backend_has_kv_copy(gpu));
    choice_out_t oc, og;
    run_choices(cpu, m, 0, &oc); /* token 0 (<unk>) is never picked: this is plain greedy */
    const int32_t banned = oc.tok[0][0];
    run_choices(cpu, m, banned, &oc);
    run_choices(gpu, m, banned, &og);
    ck_assert_int_ne(og.tok[0][0], banned);
    ck_assert_int_eq(og.n_forks, 2);
    ck_assert_int_eq(og.n_prefill, oc.n_prefill); /* the prompt once on both */
    for (int c = 0; c < 4; c++) {
        ck_assert_int_eq(og.n[c], c < 3 ? 12 : 6);
        ck_assert_int_eq(og.n[c], oc.n[c]);
        for (int t = 0; t < og.n[c]; t++) {
            ck_assert_msg(og.tok[c][t] == oc.tok[c][t], "choice %d token %d: cuda %d, cpu %d", c, t,
                          og.tok[c][t], oc.tok[c][t]);
            ck_assert_int_ne(og.tok[c][t], c < 3 ? banned : -1);
            ck_assert(c < 3 || og.tok[c][t] == 300);
        }
        /* greedy choices of one prompt say the same: the copied block is right */
        ck_assert_mem_eq(og.tok[c < 3 ? c : 0], og.tok[0], (size_t)og.n[0] * sizeof(int32_t));
    }
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("kernels");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rmsnorm_vs_cpu);
    tcase_add_test(tc, rope_vs_cpu);
    tcase_add_test(tc, attention_vs_reference);
    tcase_add_test(tc, swiglu_vs_cpu);
    tcase_add_test(tc, gemm_vs_reference);
    suite_add_tcase(s, tc);
    tc = tcase_create("sampler");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sample_vs_cpu);
    suite_add_tcase(s, tc);
    tc = tcase_create("steps");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, step_f32);
    tcase_add_test(tc, step_f16_mqa);
    tcase_add_test(tc, step_bf16_tied_wide_heads);
    tcase_add_test(tc, step_q8_0);
    tcase_add_test(tc, stories260k_greedy_vs_cpu);
    suite_add_tcase(s, tc);
    tc = tcase_create("choices");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, kv_copy_vs_cpu);
    tcase_add_test(tc, logit_bias_vs_cpu);
    tcase_add_test(tc, engine_choices_vs_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* before Check forks anything: no device means skipped, not failed */
    if (!kg_backend_cuda_available()) {
        fprintf(stderr, "check_cuda: no CUDA device visible, skipping\n");
        return 77;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
