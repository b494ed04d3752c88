/* check_gemm: the CPU GEMM (cpu_gemm) against a double-precision reference
 * and against a plain fmaf chain (the fixed summation order), and batch
 * invariance: a row's result is bitwise the same whatever the row count,
 * its position and the thread count.
 *
 * `check_gemm --bench [quick] [NxK]` is a micro-benchmark instead of the tests:
 * the SmolLM2-135M shapes for m = 1, 4, 16, 128, 512 rows, 1 and 2 threads,
 * F32 and F16 weights, against OpenBLAS sgemm when libopenblas loads. */
#include "backend/cpu/cpu_gemm.h"
#include "check_common.h"
#include "core/kg_clock.h"
#include "core/kg_pool.h"
#include "model/kg_quant.h"

#include <dlfcn.h>
#include <float.h>
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

static float *random_floats(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    if (!x) { /* also used by the benchmark, outside any test */
        fprintf(stderr, "check_gemm: out of memory\n");
        abort();
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_uniform(-1.0f, 1.0f);
    }
    return x;
}

/* A random (n, k) weight matrix stored as `type`, and its exact values. */
typedef struct weights {
    void *data; /* (n, k) in type */
    float *deq; /* (n, k) dequantized: the values the GEMM must use */
    cpu_gemm_weights_t packed;
} weights_t;

static void weights_make(weights_t *w, kg_ggml_type_t type, int64_t n, int64_t k) {
    float *src = random_floats(n * k);
    w->data = malloc(kg_type_row_size(type, k) * (size_t)n);
    w->deq = malloc((size_t)(n * k) * sizeof(float));
    ck_assert_ptr_nonnull(w->data);
    ck_assert_ptr_nonnull(w->deq);
    ck_assert(kg_quantize(type, src, w->data, n * k));
    kg_dequantize(type, w->data, w->deq, n * k);
    ck_assert(cpu_gemm_pack(&w->packed, type, w->data, n, k));
    free(src);
}

static void weights_free(weights_t *w) {
    cpu_gemm_clear(&w->packed);
    free(w->data);
    free(w->deq);
}

/* The order every kernel must follow: one fmaf chain over k per element. */
static void fmaf_chain(const float *a, const float *w, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < k; kk++) {
                acc = fmaf(a[i * k + kk], w[j * k + kk], acc);
            }
            c[i * n + j] = acc;
        }
    }
}

static const kg_ggml_type_t types[] = {KG_GGML_TYPE_F32, KG_GGML_TYPE_F16, KG_GGML_TYPE_BF16,
                                       KG_GGML_TYPE_Q8_0, KG_GGML_TYPE_Q4_0};

static bool is_blocked(kg_ggml_type_t type) {
    return kg_type_block_elems(type) > 1;
}

// ---- tests ----

/* Packing keeps F16 and BF16, turns the rest into F32, pads to panels. */
START_TEST(pack_storage_types) {
    rng_state = 1;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        weights_t w;
        weights_make(&w, types[t], 17, 64);
        kg_ggml_type_t want = types[t] == KG_GGML_TYPE_F16 || types[t] == KG_GGML_TYPE_BF16
                                  ? types[t]
                                  : KG_GGML_TYPE_F32;
        ck_assert_int_eq(w.packed.type, want);
        ck_assert_int_eq(w.packed.n, 17);
        ck_assert_int_eq(w.packed.k, 64);
        size_t esz = want == KG_GGML_TYPE_F32 ? 4 : 2;
        ck_assert_uint_ge(w.packed.size, 2 * 64 * CPU_GEMM_PANEL * esz);
        ck_assert_uint_eq((uintptr_t)w.packed.panels % 64, 0);
        weights_free(&w);
    }
    cpu_gemm_weights_t z;
    memset(&z, 0, sizeof(z));
    cpu_gemm_clear(&z); /* a zeroed one is fine */
}
END_TEST

/* Packing over a pool gives the panels the calling thread packs alone, for
 * every type (the quantized ones through each thread's dequantized rows)
 * and a matrix of several pack tasks with a partial last panel. */
START_TEST(pack_on_pool_same_panels) {
    rng_state = 3;
    kg_pool_t *pool = kg_pool_new(3);
    ck_assert_ptr_nonnull(pool);
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        weights_t w;
        weights_make(&w, types[t], 16 * 37 + 5, 64);
        cpu_gemm_weights_t pooled;
        ck_assert(cpu_gemm_pack_on(pool, &pooled, types[t], w.data, 16 * 37 + 5, 64));
        ck_assert_uint_eq(pooled.size, w.packed.size);
        ck_assert_int_eq(pooled.type, w.packed.type);
        if (memcmp(pooled.panels, w.packed.panels, pooled.size) != 0) {
            ck_abort_msg("type %d: pooled panels differ", (int)types[t]);
        }
        cpu_gemm_clear(&pooled);
        weights_free(&w);
    }
    kg_pool_free(pool);
}
END_TEST

/* Every type and odd shapes (n, k not multiples of 16 or 8, k across the
 * kernels' K blocks, m across their row tiles and row blocks, panels not a
 * multiple of the AVX-512 tile's 3) against a double-precision reference,
 * and bitwise against the fmaf chain and the scalar kernel, with each
 * kernel this machine runs (_i: scalar, avx2, avx512). */
static const char *const gemm_kernels[] = {"scalar", "avx2", "avx512"};

START_TEST(matches_reference) {
    static const int64_t ns[] = {1, 7, 16, 17, 40, 50, 100};
    static const int64_t ks[] = {1, 3, 8, 31, 64, 257, 600};
    static const int64_t ms[] = {1, 2, 5, 7, 8, 13, 17, 100};
    if (!cpu_gemm_set_kernel(gemm_kernels[_i])) {
        printf("gemm: kernel %s does not run on this machine, not tested\n", gemm_kernels[_i]);
        return;
    }
    kg_pool_t *pool = kg_pool_new(2);
    rng_state = 2;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++) {
            for (size_t ik = 0; ik < sizeof(ks) / sizeof(ks[0]); ik++) {
                const int64_t n = ns[in], k = ks[ik];
                if (is_blocked(types[t]) && k % 32 != 0) {
                    continue;
                }
                weights_t w;
                weights_make(&w, types[t], n, k);
                for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++) {
                    const int64_t m = ms[im];
                    float *a = random_floats(m * k);
                    float *c = malloc((size_t)(m * n) * sizeof(float));
                    float *chain = malloc((size_t)(m * n) * sizeof(float));
                    float *scalar = malloc((size_t)(m * n) * sizeof(float));
                    cpu_gemm(pool, a, &w.packed, c, m);
                    fmaf_chain(a, w.deq, chain, m, n, k);
                    cpu_gemm_scalar(a, &w.packed, scalar, m);
                    /* one assertion per product: Check logs every call */
                    int64_t bad = -1;
                    double bad_ref = 0.0;
                    for (int64_t i = 0; i < m * n && bad < 0; i++) {
                        double ref = 0.0, mag = 0.0;
                        for (int64_t kk = 0; kk < k; kk++) {
                            double p = (double)a[i / n * k + kk] * (double)w.deq[i % n * k + kk];
                            ref += p;
                            mag += fabs(p);
                        }
                        if (fabs((double)c[i] - ref) >
                            (double)(k + 1) * FLT_EPSILON * mag + 1e-30) {
                            bad = i, bad_ref = ref;
                        }
                    }
                    ck_assert_msg(bad < 0, "type %d m %lld n %lld k %lld element %lld: %g vs %g",
                                  types[t], (long long)m, (long long)n, (long long)k,
                                  (long long)bad, bad < 0 ? 0.0 : c[bad], bad_ref);
                    ck_assert_msg(memcmp(c, chain, (size_t)(m * n) * sizeof(float)) == 0,
                                  "type %d m %lld n %lld k %lld: not the fmaf chain", types[t],
                                  (long long)m, (long long)n, (long long)k);
                    ck_assert_msg(memcmp(c, scalar, (size_t)(m * n) * sizeof(float)) == 0,
                                  "type %d m %lld n %lld k %lld: not the scalar kernel", types[t],
                                  (long long)m, (long long)n, (long long)k);
                    free(a), free(c), free(chain), free(scalar);
                }
                weights_free(&w);
            }
        }
    }
    kg_pool_free(pool);
    cpu_gemm_set_kernel("best");
}
END_TEST

/* Batch invariance: with 40 random rows, a call on the first m rows
 * (m = 1..40), and on the rows rotated so each one sits at other positions,
 * gives every row exactly the bits it gets alone, on 1, 2 or 3 threads. The
 * second shape is big enough that the pool splits its columns (over 1.5M
 * multiply-adds or 1 MiB of weights) for most m. */
static void check_invariance(kg_ggml_type_t type, int64_t n, int64_t k) {
    enum { M = 40 };
    weights_t w;
    weights_make(&w, type, n, k);
    float *a = random_floats(M * k);
    float *rot = malloc((size_t)(M * k) * sizeof(float));
    float *alone = malloc((size_t)(M * n) * sizeof(float));
    float *c = malloc((size_t)(M * n) * sizeof(float));
    ck_assert_ptr_nonnull(rot);
    ck_assert_ptr_nonnull(alone);
    ck_assert_ptr_nonnull(c);
    for (int64_t r = 0; r < M; r++) {
        cpu_gemm(NULL, a + r * k, &w.packed, alone + r * n, 1);
    }
    for (int threads = 1; threads <= 3; threads++) {
        kg_pool_t *pool = kg_pool_new(threads);
        ck_assert_ptr_nonnull(pool);
        for (int64_t m = 1; m <= M; m++) {
            /* shift s puts input row (r + s) % M at position r */
            for (int64_t s = 0; s < M; s += (m == M ? 7 : M)) {
                for (int64_t r = 0; r < M; r++) {
                    memcpy(rot + r * k, a + ((r + s) % M) * k, (size_t)k * sizeof(float));
                }
                memset(c, 0xff, (size_t)(M * n) * sizeof(float));
                cpu_gemm(pool, rot, &w.packed, c, m);
                for (int64_t r = 0; r < m; r++) {
                    const int64_t src = (r + s) % M;
                    ck_assert_msg(memcmp(c + r * n, alone + src * n, (size_t)n * sizeof(float)) ==
                                      0,
                                  "type %d n %lld k %lld threads %d m %lld: row %lld at position "
                                  "%lld differs from alone",
                                  type, (long long)n, (long long)k, threads, (long long)m,
                                  (long long)src, (long long)r);
                }
                /* rows past m are not written */
                bool untouched = true;
                for (int64_t i = m * n; i < M * n; i++) {
                    uint32_t u;
                    memcpy(&u, c + i, sizeof(u));
                    untouched = untouched && u == 0xffffffffu;
                }
                ck_assert_msg(untouched, "m %lld: a row past m was written", (long long)m);
            }
        }
        kg_pool_free(pool);
    }
    free(a), free(rot), free(alone), free(c);
    weights_free(&w);
}

START_TEST(batch_invariance_f32) {
    rng_state = 3;
    check_invariance(KG_GGML_TYPE_F32, 77, 300);
    check_invariance(KG_GGML_TYPE_F32, 600, 520);
}
END_TEST

START_TEST(batch_invariance_f16) {
    rng_state = 4;
    check_invariance(KG_GGML_TYPE_F16, 77, 300);
    check_invariance(KG_GGML_TYPE_F16, 600, 520);
}
END_TEST

START_TEST(batch_invariance_bf16) {
    rng_state = 5;
    check_invariance(KG_GGML_TYPE_BF16, 77, 300);
    check_invariance(KG_GGML_TYPE_BF16, 600, 520);
}
END_TEST

/* No thread count, pool or none, changes a bit. */
START_TEST(threads_do_not_change_results) {
    rng_state = 6;
    const int64_t m = 9, n = 1000, k = 200; /* 1.8M multiply-adds: the pool runs */
    weights_t w;
    weights_make(&w, KG_GGML_TYPE_F16, n, k);
    float *a = random_floats(m * k);
    float *c0 = malloc((size_t)(m * n) * sizeof(float)),
          *c = malloc((size_t)(m * n) * sizeof(float));
    cpu_gemm(NULL, a, &w.packed, c0, m);
    for (int threads = 1; threads <= 4; threads++) {
        kg_pool_t *pool = kg_pool_new(threads);
        for (int rep = 0; rep < 3; rep++) {
            cpu_gemm(pool, a, &w.packed, c, m);
            ck_assert_msg(memcmp(c, c0, (size_t)(m * n) * sizeof(float)) == 0, "threads %d",
                          threads);
        }
        kg_pool_free(pool);
    }
    free(a), free(c0), free(c);
    weights_free(&w);
}
END_TEST

/* Q, K and V in one call give the bits of three separate calls. */
START_TEST(multi_equals_separate_calls) {
    rng_state = 8;
    const int64_t k = 512, ns[3] = {160, 40, 45}; /* m = 20: the pool runs */
    weights_t w[3];
    for (int i = 0; i < 3; i++) {
        weights_make(&w[i], KG_GGML_TYPE_F16, ns[i], k);
    }
    const cpu_gemm_weights_t *ws[3] = {&w[0].packed, &w[1].packed, &w[2].packed};
    kg_pool_t *pool = kg_pool_new(3);
    for (int64_t m = 1; m <= 20; m += 19) {
        float *a = random_floats(m * k);
        float *c[3], *one[3];
        for (int i = 0; i < 3; i++) {
            c[i] = malloc((size_t)(m * ns[i]) * sizeof(float));
            one[i] = malloc((size_t)(m * ns[i]) * sizeof(float));
            cpu_gemm(NULL, a, ws[i], one[i], m);
        }
        cpu_gemm_multi(pool, a, m, 3, ws, c);
        for (int i = 0; i < 3; i++) {
            ck_assert_msg(memcmp(c[i], one[i], (size_t)(m * ns[i]) * sizeof(float)) == 0,
                          "m %lld product %d", (long long)m, i);
            free(c[i]), free(one[i]);
        }
        free(a);
    }
    kg_pool_free(pool);
    for (int i = 0; i < 3; i++) {
        weights_free(&w[i]);
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, pack_storage_types);
    tcase_add_test(tc, pack_on_pool_same_panels);
    tcase_add_loop_test(tc, matches_reference, 0, 3);
    tcase_add_test(tc, batch_invariance_f32);
    tcase_add_test(tc, batch_invariance_f16);
    tcase_add_test(tc, batch_invariance_bf16);
    tcase_add_test(tc, threads_do_not_change_results);
    tcase_add_test(tc, multi_equals_separate_calls);
    suite_add_tcase(s, tc);
    return s;
}

// ---- benchmark (check_gemm --bench) ----

typedef void (*sgemm_fn)(int order,
                         int ta,
                         int tb,
                         int m,
                         int n,
                         int k,
                         float alpha,
                         const float *a,
                         int lda,
                         const float *b,
                         int ldb,
                         float beta,
                         float *c,
                         int ldc);
typedef void (*set_threads_fn)(int n);

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median seconds per call of `call` over at least 3 and up to 100 calls or
 * about budget_s seconds, after one warm-up call. */
typedef struct bench_case {
    const float *a;
    float *c;
    int64_t m, n, k;
    const cpu_gemm_weights_t *w; /* ours, or NULL for OpenBLAS */
    const float *wf;             /* (n, k) F32 for OpenBLAS */
    kg_pool_t *pool;
    sgemm_fn sgemm;
} bench_case_t;

static void bench_call(const bench_case_t *b) {
    if (b->w) {
        cpu_gemm(b->pool, b->a, b->w, b->c, b->m);
    } else {
        /* CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 */
        b->sgemm(101, 111, 112, (int)b->m, (int)b->n, (int)b->k, 1.0f, b->a, (int)b->k, b->wf,
                 (int)b->k, 0.0f, b->c, (int)b->n);
    }
}

static double bench_median(const bench_case_t *b, double budget_s) {
    double t[100];
    int n = 0;
    bench_call(b);
    const int64_t start = kg_clock_us();
    while (n < 100 && (n < 3 || (double)(kg_clock_us() - start) * 1e-6 < budget_s)) {
        int64_t t0 = kg_clock_us();
        bench_call(b);
        t[n++] = (double)(kg_clock_us() - t0) * 1e-6;
    }
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

static int bench(bool quick, const char *only) {
    static const int64_t shapes[][2] = {
        {576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
    static const int64_t ms[] = {1, 4, 16, 128, 512};
    const double budget = quick ? 0.05 : 0.3;
    void *blas = dlopen("libopenblas.so.0", RTLD_NOW);
    sgemm_fn sgemm = NULL;
    set_threads_fn set_threads = NULL;
    if (blas) {
        void *s1 = dlsym(blas, "cblas_sgemm"), *s2 = dlsym(blas, "openblas_set_num_threads");
        if (s1 && s2) {
            memcpy(&sgemm, &s1, sizeof(sgemm));
            memcpy(&set_threads, &s2, sizeof(set_threads));
        }
    }
    printf("kernel %s; median per call; GB/s counts W + A + C bytes; OpenBLAS: %s\n",
           cpu_gemm_kernel_name(), sgemm ? "libopenblas.so.0 (its own threads)" : "not found");
    printf("%-11s %4s %3s | %-20s | %-20s | %-20s\n", "n x k", "m", "thr", "ours F32 GFLOP/s GB/s",
           "ours F16 GFLOP/s GB/s", "OpenBLAS F32");
    rng_state = 7;
    for (size_t is = 0; is < sizeof(shapes) / sizeof(shapes[0]); is++) {
        const int64_t n = shapes[is][0], k = shapes[is][1];
        char name[32];
        snprintf(name, sizeof(name), "%lldx%lld", (long long)n, (long long)k);
        if (only && strcmp(only, name) != 0) {
            continue;
        }
        float *wf = random_floats(n * k);
        uint16_t *wh = malloc((size_t)(n * k) * sizeof(uint16_t));
        cpu_gemm_weights_t w32, w16;
        if (!wh || !kg_quantize(KG_GGML_TYPE_F16, wf, wh, n * k) ||
            !cpu_gemm_pack(&w32, KG_GGML_TYPE_F32, wf, n, k) ||
            !cpu_gemm_pack(&w16, KG_GGML_TYPE_F16, wh, n, k)) {
            fprintf(stderr, "bench: out of memory\n");
            return EXIT_FAILURE;
        }
        float *a = random_floats(512 * k);
        float *c = malloc((size_t)(512 * n) * sizeof(float));
        for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++) {
            const int64_t m = ms[im];
            for (int threads = 1; threads <= 2; threads++) {
                kg_pool_t *pool = kg_pool_new(threads);
                bench_case_t b = {
                    .a = a, .c = c, .m = m, .n = n, .k = k, .pool = pool, .wf = wf, .sgemm = sgemm};
                const double flop = 2.0 * (double)m * (double)n * (double)k;
                const double act = (double)(m * k + m * n) * 4.0;
                double res[3][2] = {{0}};
                b.w = &w32;
                double s = bench_median(&b, budget);
                res[0][0] = flop / s * 1e-9, res[0][1] = ((double)(n * k) * 4.0 + act) / s * 1e-9;
                b.w = &w16;
                s = bench_median(&b, budget);
                res[1][0] = flop / s * 1e-9, res[1][1] = ((double)(n * k) * 2.0 + act) / s * 1e-9;
                kg_pool_free(pool);
                if (sgemm) {
                    set_threads(threads);
                    b.w = NULL;
                    s = bench_median(&b, budget);
                    res[2][0] = flop / s * 1e-9;
                    res[2][1] = ((double)(n * k) * 4.0 + act) / s * 1e-9;
                    set_threads(1); /* let its threads go idle before our next run */
                }
                printf("%5lldx%-5lld %4lld %3d | %8.1f %9.1f   | %8.1f %9.1f   | %8.1f %9.1f\n",
                       (long long)n, (long long)k, (long long)m, threads, res[0][0], res[0][1],
                       res[1][0], res[1][1], res[2][0], res[2][1]);
                fflush(stdout);
            }
        }
        free(a), free(c), free(wf), free(wh);
        cpu_gemm_clear(&w32);
        cpu_gemm_clear(&w16);
    }
    if (blas) {
        dlclose(blas);
    }
    return EXIT_SUCCESS;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        const bool quick = argc > 2 && strcmp(argv[2], "quick") == 0;
        return bench(quick, argc > 2 + quick ? argv[2 + quick] : NULL);
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
