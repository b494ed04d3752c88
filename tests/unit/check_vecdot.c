/* check_vecdot: the CPU backend's quantized matmul (cpu_vecdot) and the
 * activation quantizers it takes (cpu_quant).
 *
 * - Activations are quantized as ggml does (values checked against the
 *   formulas: amax / 127 with round-half-even for Q8_0/Q8_1, the signed
 *   extreme to -127 for Q8_K, block sums).
 * - For every weight type, every element of cpu_qgemm equals the scalar
 *   reference chain bit for bit, for tiles of every shape and partial
 *   panels, and is close to a double-precision dot product of the
 *   dequantized weights (kg_dequantize) and activations.
 * - Batch invariance: a row's results are the same bits alone, inside any
 *   batch at any position, and on one or two threads.
 * - MXFP4 (E8M0 scales, doubled E2M1 codes) against ggml's
 *   vec_dot_mxfp4_q8_0 written out from the raw blocks, scales from the
 *   subnormal ones up.
 *
 * `check_vecdot --bench [TYPE...]` is a micro-benchmark instead of the
 * tests: the SmolLM2-135M and Qwen2.5-0.5B projection shapes for m = 1, 4,
 * 16, 128, 512 activation rows on 1 and 2 threads, weights cycling through
 * 64 MiB of copies so that decode reads them from memory as a model does.
 * KG_VECDOT_KERNEL=scalar|avx2|avxvnni|avx512vnni picks the kernels (the
 * default: the best this CPU runs). */
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/cpu_vecdot.h"
#include "check_common.h"
#include "core/kg_clock.h"
#include "core/kg_pool.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static const kg_ggml_type_t qtypes[] = {
    KG_GGML_TYPE_Q4_0,  KG_GGML_TYPE_Q4_1, KG_GGML_TYPE_Q5_0,   KG_GGML_TYPE_Q5_1,
    KG_GGML_TYPE_Q8_0,  KG_GGML_TYPE_Q2_K, KG_GGML_TYPE_Q3_K,   KG_GGML_TYPE_Q4_K,
    KG_GGML_TYPE_Q5_K,  KG_GGML_TYPE_Q6_K, KG_GGML_TYPE_IQ4_NL, KG_GGML_TYPE_IQ4_XS,
    KG_GGML_TYPE_MXFP4,
};
#define N_QTYPES (int)(sizeof(qtypes) / sizeof(qtypes[0]))

static float *random_acts(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    if (!x) { /* also used by the benchmark, outside any test */
        fprintf(stderr, "check_vecdot: out of memory\n");
        abort();
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_uniform(-1, 1) * (rng_next() % 50 == 0 ? 20.0f : 1.0f);
    }
    return x;
}

// ---- activations ----

START_TEST(act_q8_0_q8_1_formulas) {
    enum { K = 128, M = 3 };
    float x[M * K];
    rng_state = 3;
    for (int i = 0; i < M * K; i++) {
        x[i] = rng_uniform(-2, 2);
    }
    /* ties: 127 / amax = 1 makes x * id exactly x, so .5 values round to even */
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = 3.5f;
    x[3] = -2.5f;
    for (int j = 32; j < 64; j++) {
        x[j] = 0.0f; /* an all-zero block */
    }
    cpu_qact_t a;
    ck_assert(cpu_qact_init(&a, M, K));
    for (int kind = CPU_ACT_Q8_0; kind <= CPU_ACT_Q8_1; kind++) {
        cpu_quant_act((cpu_act_kind_t)kind, x, M, K, &a);
        ck_assert_int_eq(a.m, M);
        for (int i = 0; i < M; i++) {
            for (int b = 0; b < K / 32; b++) {
                const float *xb = x + i * K + 32 * b;
                float amax = 0;
                for (int j = 0; j < 32; j++) {
                    amax = fmaxf(amax, fabsf(xb[j]));
                }
                const float d = amax / 127.0f;
                ck_assert(a.d[b * M + i] == kg_fp16_to_fp32(kg_fp32_to_fp16(d)));
                int sum = 0;
                for (int j = 0; j < 32; j++) {
                    const float v = amax != 0 ? xb[j] * (127.0f / amax) : 0.0f;
                    const int q = (int)nearbyint(v); /* half to even */
                    ck_assert_int_eq(a.qs[i * K + 32 * b + j], q);
                    sum += q;
                }
                if (kind == CPU_ACT_Q8_1) {
                    ck_assert(a.s[b * M + i] == kg_fp16_to_fp32(kg_fp32_to_fp16(d * (float)sum)));
                }
            }
        }
        ck_assert_int_eq(a.qs[1], 2);  /* 2.5 -> 2 */
        ck_assert_int_eq(a.qs[2], 4);  /* 3.5 -> 4 */
        ck_assert_int_eq(a.qs[3], -2); /* -2.5 -> -2 */
        ck_assert(a.d[1 * M + 0] == 0.0f);
    }
    cpu_qact_clear(&a);
}
END_TEST

START_TEST(act_q8_k_formulas) {
    enum { K = 512, M = 2 };
    float x[M * K];
    rng_state = 4;
    for (int i = 0; i < M * K; i++) {
        x[i] = rng_uniform(-3, 3);
    }
    x[5] = -4.0f; /* the signed extreme of row 0 block 0: maps to -127 */
    x[7] = 4.0f;  /* same magnitude, later: +127 */
    for (int j = 256; j < 512; j++) {
        x[j] = 0.0f;
    }
    cpu_qact_t a;
    ck_assert(cpu_qact_init(&a, M, K));
    cpu_quant_act(CPU_ACT_Q8_K, x, M, K, &a);
    for (int i = 0; i < M; i++) {
        for (int b = 0; b < K / 256; b++) {
            const float *xb = x + i * K + 256 * b;
            float amax = 0, max = 0;
            for (int j = 0; j < 256; j++) {
                if (fabsf(xb[j]) > amax) {
                    amax = fabsf(xb[j]);
                    max = xb[j];
                }
            }
            if (amax == 0) {
                ck_assert(a.d[b * M + i] == 0.0f);
                continue;
            }
            const float iscale = -127.0f / max;
            ck_assert(a.d[b * M + i] == 1.0f / iscale);
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) {
                    int q = (int)nearbyint(iscale * xb[16 * g + l]);
                    q = q > 127 ? 127 : q;
                    ck_assert_int_eq(a.qs[i * K + 256 * b + 16 * g + l], q);
                    sum += q;
                }
                ck_assert_int_eq(a.bsums[i * (K / 16) + 16 * b + g], sum);
            }
        }
    }
    ck_assert_int_eq(a.qs[5], -127);
    ck_assert_int_eq(a.qs[7], 127);
    ck_assert(a.d[0] == 1.0f / (-127.0f / -4.0f));
    cpu_qact_clear(&a);
}
END_TEST

// ---- products ----

typedef struct qcase {
    kg_ggml_type_t type;
    int64_t n, k, m;
    uint8_t *w;
    float *deq; /* (n, k) */
    float *x;   /* (m, k) */
    cpu_qmat_t mat;
    cpu_qact_t act;
} qcase_t;

static void qcase_make(qcase_t *q, kg_ggml_type_t type, int64_t n, int64_t k, int64_t m) {
    q->type = type;
    q->n = n;
    q->k = k;
    q->m = m;
    float *src = random_acts(n * k);
    q->w = malloc(kg_type_row_size(type, k) * (size_t)n);
    q->deq = malloc((size_t)(n * k) * sizeof(float));
    ck_assert(q->w && q->deq);
    ck_assert(kg_quantize(type, src, q->w, n * k));
    kg_dequantize(type, q->w, q->deq, n * k);
    free(src);
    q->x = random_acts(m * k);
    ck_assert(cpu_qmat_init(&q->mat, type, q->w, n, k));
    ck_assert(cpu_qact_init(&q->act, m, k));
    cpu_quant_act(q->mat.tr->act, q->x, m, k, &q->act);
}

static void qcase_free(qcase_t *q) {
    free(q->w);
    free(q->deq);
    free(q->x);
    cpu_qact_clear(&q->act);
}

/* The activation values the dot uses, dequantized. */
static double act_value(const cpu_qact_t *a, int64_t i, int64_t e) {
    const int blk = a->kind == CPU_ACT_Q8_K ? 256 : 32;
    return (double)a->d[(e / blk) * a->m + i] * (double)a->qs[i * a->k + e];
}

static void run(kg_pool_t *pool, cpu_qgemm_scratch_t *s, const qcase_t *q, float *c) {
    const cpu_qmat_t *w = &q->mat;
    cpu_qgemm(pool, s, &q->act, 1, &w, &c);
}

/* Every kernel family cpu_vecdot has; a test runs those this machine runs. */
static const char *const kernels[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};
#define N_KERNELS ((int)(sizeof(kernels) / sizeof(kernels[0])))

START_TEST(every_type_matches_reference) {
    /* n = 21: two full panels and a partial one; m = 23 rows: tiles of 4, 2
     * and 1 rows on unpacked panels; the first 7 and the first 3 rows again
     * as batches of their own: the fused decode tiles (3 rows, and 7 for the
     * K-quants) and the panels (7 rows of 32-block types), and the first row
     * alone (one sequence's decode, its own unrolled loop). k = 2304: rows
     * of 72 blocks of 32 (9 of 256), nearer a real model's than 256 or 512;
     * k = 800 (32-block types only): 25 blocks, so the decode's last group
     * of 8 blocks is partial (as 9 of 256 is for the K-quants); k = 1536:
     * 6 superblocks, a decode group of more than 4 but not 8 (at most 4 are
     * reduced as 4) */
    const int64_t n = 21, m = 23;
    static const int64_t subs[] = {7, 3, 1};
    static const int64_t ks[] = {256, 512, 2304, 800, 1536};
    kg_pool_t *pool = kg_pool_new(2);
    cpu_qgemm_scratch_t *s = cpu_qgemm_scratch_new(2, 2304);
    ck_assert(pool && s);
    rng_state = 1000;
    for (int ti = 0; ti < N_QTYPES; ti++) {
        for (int ik = 0; ik < (int)(sizeof(ks) / sizeof(ks[0])); ik++) {
            const int64_t k = ks[ik];
            if (k % kg_type_block_elems(qtypes[ti]) != 0) {
                continue;
            }
            qcase_t q;
            qcase_make(&q, qtypes[ti], n, k, m);
            /* every kernel family this machine runs */
            float *ck[N_KERNELS][4];
            for (int kk = 0; kk < N_KERNELS; kk++) {
                ck[kk][0] = ck[kk][1] = ck[kk][2] = ck[kk][3] = NULL;
                if (!cpu_vecdot_set_kernel(kernels[kk])) {
                    continue;
                }
                for (int v = 0; v < 4; v++) {
                    ck[kk][v] = malloc((size_t)(m * n) * sizeof(float));
                }
                run(pool, s, &q, ck[kk][0]);
                for (int v = 1; v < 4; v++) {
                    qcase_t qs = q;
                    qs.m = subs[v - 1];
                    ck_assert(cpu_qact_init(&qs.act, qs.m, k));
                    cpu_quant_act(q.mat.tr->act, q.x, qs.m, k, &qs.act);
                    run(pool, s, &qs, ck[kk][v]);
                    cpu_qact_clear(&qs.act);
                }
            }
            cpu_vecdot_set_kernel("best");
            for (int64_t i = 0; i < m; i++) {
                for (int64_t j = 0; j < n; j++) {
                    const float ref = cpu_vecdot_ref(&q.mat, j, &q.act, i);
                    for (int kk = 0; kk < N_KERNELS; kk++) {
                        for (int v = 0; v < 4 && ck[kk][0]; v++) {
                            const int64_t rows = v == 0 ? m : subs[v - 1];
                            if (i >= rows) {
                                continue;
                            }
                            const float got = ck[kk][v][i * n + j];
                            ck_assert_msg(memcmp(&got, &ref, 4) == 0,
                                          "%s %s k=%lld (%lld, %lld) in a %lld-row batch: %a, "
                                          "reference %a",
                                          kg_type_name(q.type), kernels[kk], (long long)k,
                                          (long long)i, (long long)j, (long long)rows, (double)got,
                                          (double)ref);
                        }
                    }
                    double exact = 0, mag = 0;
                    for (int64_t e = 0; e < k; e++) {
                        const double t = (double)q.deq[j * k + e] * act_value(&q.act, i, e);
                        exact += t;
                        mag += fabs(t);
                        if (q.mat.tr->min_m) {
                            /* + m * a: its fp16 s carries the rounding */
                            const uint8_t *blk =
                                q.w + (size_t)j * q.mat.row_size +
                                (size_t)(e / 32) * (q.mat.row_size / (size_t)(k / 32));
                            uint16_t mh;
                            memcpy(&mh, blk + 2, 2);
                            mag += fabs((double)kg_fp16_to_fp32(mh) * act_value(&q.act, i, e));
                        }
                    }
                    /* the float block scales round, and Q8_1's s = d * sum(q) is an
                     * fp16 (2^-11 relative: Q4_1 and Q5_1 are looser); the integer
                     * products do not */
                    const double tol = q.mat.tr->min_m ? 2e-3 : 2e-4;
                    ck_assert_msg(fabs((double)ref - exact) <= tol * mag + 1e-6,
                                  "%s (%lld, %lld): %g vs exact %g (magnitude %g)",
                                  kg_type_name(q.type), (long long)i, (long long)j, (double)ref,
                                  exact, mag);
                }
            }
            for (int kk = 0; kk < N_KERNELS; kk++) {
                for (int v = 0; v < 4; v++) {
                    free(ck[kk][v]);
                }
            }
            qcase_free(&q);
        }
    }
    cpu_qgemm_scratch_free(s);
    kg_pool_free(pool);
}
END_TEST

START_TEST(batch_invariance) {
    /* rows of a 20-row batch (unpacked panels for every type) against the
     * same rows alone and in other batches (fused decode tiles, panels), on 1
     * and 2 threads: identical bits */
    const int64_t n = 75, k = 512, m = 20;
    kg_pool_t *pool2 = kg_pool_new(2);
    cpu_qgemm_scratch_t *s = cpu_qgemm_scratch_new(2, k);
    rng_state = 77;
    for (int ti = 0; ti < N_QTYPES; ti++) {
        qcase_t q;
        qcase_make(&q, qtypes[ti], n, k, m);
        float *full = malloc((size_t)(m * n) * sizeof(float));
        run(pool2, s, &q, full);
        float *part = malloc((size_t)(m * n) * sizeof(float));
        const int64_t starts[] = {0, 3, 5, 12, 2};
        const int64_t counts[] = {1, 2, 4, 1, 18};
        for (int v = 0; v < 5; v++) {
            qcase_t sub = q;
            sub.m = counts[v];
            ck_assert(cpu_qact_init(&sub.act, sub.m, k));
            cpu_quant_act(q.mat.tr->act, q.x + starts[v] * k, sub.m, k, &sub.act);
            run(v % 2 ? NULL : pool2, s, &sub, part);
            ck_assert_msg(
                memcmp(part, full + starts[v] * n, (size_t)(counts[v] * n) * sizeof(float)) == 0,
                "%s: rows %lld..+%lld differ from the 13-row batch", kg_type_name(q.type),
                (long long)starts[v], (long long)counts[v]);
            cpu_qact_clear(&sub.act);
        }
        run(NULL, s, &q, part);
        ck_assert_mem_eq(part, full, (size_t)(m * n) * sizeof(float));
        free(full);
        free(part);
        qcase_free(&q);
    }
    cpu_qgemm_scratch_free(s);
    kg_pool_free(pool2);
}
END_TEST

START_TEST(several_products_one_call) {
    /* Q, K and V of different types with one activation kind: one call
     * gives the bits of three */
    const int64_t k = 512, m = 5;
    rng_state = 9;
    qcase_t a, b;
    qcase_make(&a, KG_GGML_TYPE_Q4_K, 40, k, m);
    qcase_make(&b, KG_GGML_TYPE_Q6_K, 16, k, m);
    kg_pool_t *pool = kg_pool_new(2);
    cpu_qgemm_scratch_t *s = cpu_qgemm_scratch_new(2, k);
    float ca[5 * 40], cb[5 * 16], ca1[5 * 40], cb1[5 * 16];
    cpu_quant_act(CPU_ACT_Q8_K, a.x, m, k, &b.act); /* b's activations = a's rows */
    const cpu_qmat_t *ws[2] = {&a.mat, &b.mat};
    float *cs[2] = {ca, cb};
    cpu_qgemm(pool, s, &a.act, 2, ws, cs);
    float *p1 = ca1, *p2 = cb1;
    cpu_qgemm(pool, s, &a.act, 1, &ws[0], &p1);
    cpu_qgemm(pool, s, &b.act, 1, &ws[1], &p2);
    ck_assert_mem_eq(ca, ca1, sizeof(ca));
    ck_assert_mem_eq(cb, cb1, sizeof(cb));
    cpu_qgemm_scratch_free(s);
    kg_pool_free(pool);
    qcase_free(&a);
    qcase_free(&b);
}
END_TEST

/* MXFP4 against ggml's vec_dot_mxfp4_q8_0 written out from the raw
 * blocks, independently of the panels: per block the exact integer sum of
 * the doubled E2M1 values times the Q8_0 activations, scaled by 2^(e - 128)
 * (e the block's E8M0 byte) and the activation's d. Bit for bit against
 * the chain of cpu_vecdot.h (fmaf per block), within float rounding of
 * ggml's own sumf += d * sumi, for every kernel, decode (1 and 3 rows: the
 * fused tiles) and prefill sizes (7 and 23 rows: panels, interleaved with
 * AVX-VNNI), and for exponents from the subnormal scales (e = 0, 1) to
 * 2^72. */
START_TEST(mxfp4_against_ggml_formula) {
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    static const uint8_t exps[] = {118, 0, 121, 1, 124, 2, 127, 3, 126, 128, 119, 200, 125, 122};
    const int64_t n = 13, k = 512, nb = k / 32, m = 23;
    static const int64_t ms[] = {23, 1, 3, 7};
    rng_state = 39;
    const size_t row = kg_type_row_size(KG_GGML_TYPE_MXFP4, k);
    ck_assert_uint_eq(row, (size_t)nb * 17);
    uint8_t *w = malloc(row * (size_t)n);
    ck_assert_ptr_nonnull(w);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = w + (size_t)j * row + (size_t)b * 17;
            /* every fourth row wholly tiny: scales 2^-128 .. 2^-125, so the
             * subnormal ones decide its value */
            blk[0] =
                j % 4 == 3 ? (uint8_t)((j + b) % 4) : exps[(j * 5 + b) % (int64_t)sizeof(exps)];
            for (int q = 1; q < 17; q++) {
                blk[q] = (uint8_t)rng_next();
            }
        }
    }
    float *x = random_acts(m * k);
    cpu_qmat_t mat;
    ck_assert(cpu_qmat_init(&mat, KG_GGML_TYPE_MXFP4, w, n, k));
    ck_assert_int_eq(mat.tr->act, CPU_ACT_Q8_0);
    kg_pool_t *pool = kg_pool_new(2);
    cpu_qgemm_scratch_t *s = cpu_qgemm_scratch_new(2, k);
    float *c = malloc((size_t)(m * n) * sizeof(float));
    ck_assert(pool && s && c);
    int n_kernels = 0;
    for (int kk = 0; kk < N_KERNELS; kk++) {
        if (!cpu_vecdot_set_kernel(kernels[kk])) {
            continue;
        }
        n_kernels++;
        for (size_t v = 0; v < sizeof(ms) / sizeof(ms[0]); v++) {
            const int64_t rows = ms[v];
            cpu_qact_t a;
            ck_assert(cpu_qact_init(&a, rows, k));
            cpu_quant_act(CPU_ACT_Q8_0, x, rows, k, &a);
            const cpu_qmat_t *wm = &mat;
            cpu_qgemm(pool, s, &a, 1, &wm, &c);
            for (int64_t i = 0; i < rows; i++) {
                for (int64_t j = 0; j < n; j++) {
                    float acc = 0.0f, sumf = 0.0f;
                    double mag = 0.0;
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = w + (size_t)j * row + (size_t)b * 17;
                        const int8_t *y = a.qs + i * k + 32 * b;
                        int32_t sumi = 0;
                        for (int e = 0; e < 16; e++) {
                            sumi += kv[blk[1 + e] & 15] * y[e] + kv[blk[1 + e] >> 4] * y[e + 16];
                        }
                        const float d = a.d[b * rows + i] * ldexpf(1.0f, blk[0] - 128);
                        acc = fmaf(d, (float)sumi, acc);
                        const float t = d * (float)sumi;
                        sumf += t;
                        mag += fabs((double)t);
                    }
                    const float got = c[i * n + j];
                    ck_assert_msg(memcmp(&got, &acc, 4) == 0,
                                  "%s, %lld rows: (%lld, %lld) %a, the formula's chain %a",
                                  kernels[kk], (long long)rows, (long long)i, (long long)j,
                                  (double)got, (double)acc);
                    ck_assert_msg(fabs((double)got - (double)sumf) <= 4e-6 * mag,
                                  "(%lld, %lld): %g vs ggml's sum %g", (long long)i, (long long)j,
                                  (double)got, (double)sumf);
                    if (kk == 0) {
                        const float ref = cpu_vecdot_ref(&mat, j, &a, i);
                        ck_assert(memcmp(&ref, &acc, 4) == 0);
                    }
                }
            }
            cpu_qact_clear(&a);
        }
    }
    ck_assert_int_ge(n_kernels, 1);
    cpu_vecdot_set_kernel("best");
    free(c);
    free(x);
    free(w);
    cpu_qgemm_scratch_free(s);
    kg_pool_free(pool);
}
END_TEST

// ---- benchmark (check_vecdot --bench) ----

static int bench(int n_types, char **types) {
    static const char *const defaults[] = {"q8_0", "q5_0",   "iq4_nl", "q4_k",
                                           "q6_k", "iq4_xs", "mxfp4"};
    static const int64_t shapes[][2] = {{1536, 576}, {576, 1536}, {4864, 896}, {896, 4864}};
    static const int64_t ms[] = {1, 4, 16, 128, 512};
    if (n_types == 0) {
        n_types = (int)(sizeof(defaults) / sizeof(defaults[0]));
        types = (char **)(uintptr_t)defaults;
    }
    const char *kname = getenv("KG_VECDOT_KERNEL");
    if (kname && !cpu_vecdot_set_kernel(kname)) {
        fprintf(stderr, "bench: this build or CPU does not run the '%s' kernels\n", kname);
        return EXIT_FAILURE;
    }
    printf("kernels %s; best of several calls; GB/s counts the weight bytes\n",
           cpu_vecdot_kernel_name());
    printf("%-7s %-10s %4s %3s %10s %8s\n", "type", "n x k", "m", "thr", "GMAC/s", "GB/s");
    rng_state = 5;
    for (int ti = 0; ti < n_types; ti++) {
        kg_ggml_type_t t;
        if (!kg_type_from_name(types[ti], &t) || !kg_type_is_quantized(t)) {
            fprintf(stderr, "bench: '%s' is not a quantized type\n", types[ti]);
            return EXIT_FAILURE;
        }
        for (size_t is = 0; is < sizeof(shapes) / sizeof(shapes[0]); is++) {
            const int64_t n = shapes[is][0], k = shapes[is][1];
            if (k % kg_type_block_elems(t) != 0) {
                continue;
            }
            const size_t bytes = kg_type_row_size(t, k) * (size_t)n;
            const int copies = (int)((64u << 20) / bytes + 1);
            float *src = random_acts(n * k);
            uint8_t *w = malloc(bytes * (size_t)copies);
            cpu_qmat_t *mats = calloc((size_t)copies, sizeof(*mats));
            float *x = random_acts(512 * k), *c = malloc((size_t)(512 * n) * sizeof(float));
            cpu_qact_t a;
            if (!w || !mats || !c || !kg_quantize(t, src, w, n * k) || !cpu_qact_init(&a, 512, k)) {
                fprintf(stderr, "bench: out of memory\n");
                return EXIT_FAILURE;
            }
            for (int cp = 0; cp < copies; cp++) {
                if (cp > 0) {
                    memcpy(w + bytes * (size_t)cp, w, bytes);
                }
                if (!cpu_qmat_init(&mats[cp], t, w + bytes * (size_t)cp, n, k)) {
                    fprintf(stderr, "bench: cannot set up %s %lldx%lld\n", types[ti], (long long)n,
                            (long long)k);
                    return EXIT_FAILURE;
                }
            }
            for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++) {
                const int64_t m = ms[im];
                cpu_quant_act(mats[0].tr->act, x, m, k, &a);
                for (int threads = 1; threads <= 2; threads++) {
                    kg_pool_t *pool = kg_pool_new(threads);
                    cpu_qgemm_scratch_t *s = cpu_qgemm_scratch_new(threads, k);
                    double best = 1e30;
                    int calls = 0;
                    const double t_end = ((double)kg_clock_us() * 1e-6) + (m >= 128 ? 0.6 : 0.3);
                    while (calls < 3 || ((double)kg_clock_us() * 1e-6) < t_end) {
                        const cpu_qmat_t *wm = &mats[calls % copies];
                        const double t0 = ((double)kg_clock_us() * 1e-6);
                        cpu_qgemm(pool, s, &a, 1, &wm, &c);
                        const double dt = ((double)kg_clock_us() * 1e-6) - t0;
                        best = dt < best ? dt : best;
                        calls++;
                    }
                    printf("%-7s %5lldx%-4lld %4lld %3d %10.1f %8.1f\n", types[ti], (long long)n,
                           (long long)k, (long long)m, threads,
                           (double)m * (double)n * (double)k / best * 1e-9,
                           (double)bytes / best * 1e-9);
                    fflush(stdout);
                    cpu_qgemm_scratch_free(s);
                    kg_pool_free(pool);
                }
            }
            cpu_qact_clear(&a);
            free(src), free(w), free(mats), free(x), free(c);
        }
    }
    return EXIT_SUCCESS;
}

static Suite *make_suite(void) {
    Suite *s = suite_create("vecdot");
    TCase *tc = tcase_create("activations");
    tcase_add_test(tc, act_q8_0_q8_1_formulas);
    tcase_add_test(tc, act_q8_k_formulas);
    suite_add_tcase(s, tc);
    tc = tcase_create("products");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_type_matches_reference);
    tcase_add_test(tc, batch_invariance);
    tcase_add_test(tc, several_products_one_call);
    tcase_add_test(tc, mxfp4_against_ggml_formula);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        return bench(argc - 2, argv + 2);
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
