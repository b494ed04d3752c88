/* cpu_gemm: weight packing, the AVX2/FMA/F16C register-tile kernels, the
 * portable scalar kernel and the dispatch to them and to the AVX-512 tiles
 * of cpu_gemm_avx512.c (see cpu_gemm.h for the design). */
#include "cpu_gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GEMM_AVX2 1
#endif

#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_quant.h"
#include "cpu_gemm_int.h"
#include "cpu_ops.h"

#define NR CPU_GEMM_PANEL

/* Cache blocking of the vector kernels (Goto's order). A K block of MC rows
 * of A (up to 144 KiB) stays in L2 while one panel's K block (up to 24 KiB
 * of F32) sits in L1 and meets each of its 6-row blocks. K is cut into
 * equal blocks of at most KC_MAX (576 = 2 x 288): the accumulators go
 * through C between K blocks, which leaves the order of the FMAs unchanged
 * but costs a trip of C through the caches, so the blocks are as few as L1
 * allows. */
#define KC_MAX 384
#define MC     96

/* Column panels per pool task when there are several row blocks (8 panels
 * of a K block: 128 KiB of F32 in L2), and when there is one (decode: W is
 * read once, so only the balance matters). */
#define TASK_PANELS        8
#define TASK_PANELS_DECODE 12

/* A GEMM runs on the calling thread when it has fewer multiply-adds and
 * fewer weight bytes than these (about 50 us of work on one core): handing
 * off to the pool costs 10-15 us here (a sleeping worker is woken), so the
 * second thread would save less than it costs. */
#define INLINE_MACS  1572864.0
#define INLINE_BYTES 1048576.0

/* How far ahead in a panel the kernels prefetch W, in bytes. */
#define PREFETCH 1024

/* Decode keeps all of K in one block while its rows of A take at most this
 * much of L1. */
#define DECODE_A_BYTES 16384

// ---- packing ----

static kg_ggml_type_t storage_type(kg_ggml_type_t type) {
    return type == KG_GGML_TYPE_F16 || type == KG_GGML_TYPE_BF16 ? type : KG_GGML_TYPE_F32;
}

static size_t elem_size(kg_ggml_type_t storage) {
    return storage == KG_GGML_TYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Index of column jj (0..15) inside a BF16 k-row: word j holds columns j
 * (low half) and j+8 (high half), so one load gives both 8-column halves. */
static int bf16_slot(int64_t jj) {
    return jj < 8 ? (int)(2 * jj) : (int)(2 * (jj - 8) + 1);
}

/* Panels per pack task: a few hundred KiB of F32 each, so the threads
 * share a matrix evenly. */
#define PACK_PANELS 16

typedef struct pack_job {
    cpu_gemm_weights_t *w;
    kg_ggml_type_t type; /* the source's */
    const void *data;
    size_t row_size;
    float *rows; /* (threads, NR * k) dequantized rows of one panel, or NULL */
} pack_job_t;

static void pack_task(void *arg, int64_t task, int thread) {
    const pack_job_t *j = arg;
    const cpu_gemm_weights_t *w = j->w;
    const int64_t n = w->n, k = w->k, n_panels = (n + NR - 1) / NR;
    const int64_t p1 = (task + 1) * PACK_PANELS < n_panels ? (task + 1) * PACK_PANELS : n_panels;
    for (int64_t p = task * PACK_PANELS; p < p1; p++) {
        const int64_t nc = n - p * NR < NR ? n - p * NR : NR;
        const char *src = (const char *)j->data + (size_t)(p * NR) * j->row_size;
        if (w->type == KG_GGML_TYPE_F32) {
            const float *f = (const float *)(const void *)src;
            if (j->rows) {
                float *rows = j->rows + (size_t)thread * (size_t)(NR * k);
                kg_dequantize(j->type, src, rows, nc * k);
                f = rows;
            }
            float *dst = (float *)w->panels + p * k * NR;
            for (int64_t jj = 0; jj < nc; jj++) {
                for (int64_t kk = 0; kk < k; kk++) {
                    dst[kk * NR + jj] = f[jj * k + kk];
                }
            }
        } else {
            const uint16_t *h = (const uint16_t *)(const void *)src;
            uint16_t *dst = (uint16_t *)w->panels + p * k * NR;
            for (int64_t jj = 0; jj < nc; jj++) {
                const int64_t slot = w->type == KG_GGML_TYPE_BF16 ? bf16_slot(jj) : jj;
                for (int64_t kk = 0; kk < k; kk++) {
                    dst[kk * NR + slot] = h[jj * k + kk];
                }
            }
        }
    }
}

bool cpu_gemm_pack_on(struct kg_pool *pool,
                      cpu_gemm_weights_t *w,
                      kg_ggml_type_t type,
                      const void *data,
                      int64_t n,
                      int64_t k) {
    memset(w, 0, sizeof(*w));
    const kg_ggml_type_t st = storage_type(type);
    const int64_t n_panels = (n + NR - 1) / NR,
                  n_tasks = (n_panels + PACK_PANELS - 1) / PACK_PANELS;
    const int n_threads = pool && n_tasks > 1 ? kg_pool_n_threads(pool) : 1;
    const size_t size = ((size_t)(n_panels * k * NR) * elem_size(st) + 63) / 64 * 64;
    pack_job_t j = {.w = w, .type = type, .data = data, .row_size = kg_type_row_size(type, k)};
    w->panels = aligned_alloc(64, size ? size : 64);
    if (!w->panels) {
        goto fail;
    }
    cpu_advise_huge(w->panels, size); /* fewer faults here, fewer TLB misses in the kernels */
    if (st == KG_GGML_TYPE_F32 && type != KG_GGML_TYPE_F32) {
        j.rows = malloc((size_t)n_threads * (size_t)(NR * k) * sizeof(float));
        if (!j.rows) {
            goto fail;
        }
    }
    if (n_panels > 0) { /* zero the last panel: its padding columns */
        const size_t last = (size_t)((n_panels - 1) * k * NR) * elem_size(st);
        memset((char *)w->panels + last, 0, size - last);
    }
    w->n = n;
    w->k = k;
    w->type = st;
    w->size = size;
    /* on the pool: the transposes, and the first touch of the panels' pages,
     * were a few seconds of one thread while the others waited at load */
    if (n_threads > 1) {
        kg_pool_run(pool, n_tasks, pack_task, &j);
    } else {
        for (int64_t t = 0; t < n_tasks; t++) {
            pack_task(&j, t, 0);
        }
    }
    free(j.rows);
    return true;
fail:
    free(j.rows);
    cpu_gemm_clear(w);
    return false;
}

bool cpu_gemm_pack(
    cpu_gemm_weights_t *w, kg_ggml_type_t type, const void *data, int64_t n, int64_t k) {
    return cpu_gemm_pack_on(NULL, w, type, data, n, k);
}

void cpu_gemm_clear(cpu_gemm_weights_t *w) {
    free(w->panels);
    memset(w, 0, sizeof(*w));
}

// ---- scalar kernel ----

static float weight_at(const cpu_gemm_weights_t *w, int64_t j, int64_t kk) {
    const int64_t base = ((j / NR) * w->k + kk) * NR, jj = j % NR;
    switch (w->type) {
    case KG_GGML_TYPE_F16:
        return kg_fp16_to_fp32(((const uint16_t *)w->panels)[base + jj]);
    case KG_GGML_TYPE_BF16:
        return kg_bf16_to_fp32(((const uint16_t *)w->panels)[base + bf16_slot(jj)]);
    default:
        return ((const float *)w->panels)[base + jj];
    }
}

/* Columns [j0, j1) of every row, one fmaf chain per element: the order
 * every kernel follows, and the fallback where the vector kernels are not
 * compiled. */
static void scalar_columns(
    const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m, int64_t j0, int64_t j1) {
    for (int64_t i = 0; i < m; i++) {
        const float *ai = a + i * w->k;
        for (int64_t j = j0; j < j1; j++) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < w->k; kk++) {
                acc = fmaf(ai[kk], weight_at(w, j, kk), acc);
            }
            c[i * w->n + j] = acc;
        }
    }
}

// ---- AVX2 kernels ----
#ifdef GEMM_AVX2

#define GEMM_INLINE static inline __attribute__((always_inline))

/* Eight weights of the k-row at p (one panel, one k): columns 0-7 (half 0)
 * or 8-15 (half 1), widened to F32 exactly. */
GEMM_INLINE __m256 load_w(const int type, const char *p, const int half) {
    if (type == KG_GGML_TYPE_F32) {
        return _mm256_loadu_ps((const float *)(const void *)p + 8 * (int64_t)half);
    }
    if (type == KG_GGML_TYPE_F16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * (int64_t)half));
        return _mm256_cvtph_ps(h);
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (half == 0) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    /* two shifts rather than a mask: a mask constant would take the 16th
     * register the 6x16 tile needs */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16));
}

/* One register tile: rows [0, mr) of `a` (row stride lda) times panels
 * [0, np) of `w` (panel stride pstride bytes) over kc steps of k, into `c`
 * (row stride ldc), continuing the chains stored in c when acc_in. mr * np
 * * 2 <= 12 accumulators c0..c11; accumulator i is row i / (2 np), columns
 * 8 (i % (2 np)) .. +7. With constant shapes the compiler keeps only the
 * live accumulators, in registers. */
GEMM_INLINE void tile(const int type,
                      const int mr,
                      const int np,
                      const float *a,
                      int64_t lda,
                      const char *w,
                      int64_t pstride,
                      int64_t kc,
                      float *c,
                      int64_t ldc,
                      bool acc_in) {
    const int nh = 2 * np, n_acc = mr * nh;
    const int64_t rb = type == KG_GGML_TYPE_F32 ? NR * 4 : NR * 2; /* bytes per k-row */
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
           c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    /* statement macros in rows, which clang-format 14 cannot lay out */
    // clang-format off
#define GEMM_CP(i) (c + (int64_t)((i) / nh) * ldc + (int64_t)((i) % nh) * 8)
#define GEMM_INIT(i)                                                                               \
    if ((i) < n_acc && acc_in) {                                                                   \
        c##i = _mm256_loadu_ps(GEMM_CP(i));                                                        \
    }
    GEMM_INIT(0) GEMM_INIT(1) GEMM_INIT(2) GEMM_INIT(3) GEMM_INIT(4) GEMM_INIT(5)
    GEMM_INIT(6) GEMM_INIT(7) GEMM_INIT(8) GEMM_INIT(9) GEMM_INIT(10) GEMM_INIT(11)
    /* row by row: each broadcast is consumed at once, so the 12
     * accumulators, 2 weight vectors and 1 broadcast fit 16 registers */
#define GEMM_STEP(i, kk, wk)                                                                       \
    if ((i) < n_acc) {                                                                             \
        if ((i) % nh == 0) {                                                                       \
            b = _mm256_broadcast_ss(a + (int64_t)((i) / nh) * lda + (kk));                         \
        }                                                                                          \
        c##i = _mm256_fmadd_ps(                                                                    \
            b, load_w(type, (wk) + (int64_t)(((i) % nh) / 2) * pstride, ((i) % nh) % 2), c##i);    \
    }
#define GEMM_KSTEP(kk)                                                                             \
    {                                                                                              \
        const char *wk = w + (kk) * rb;                                                            \
        __m256 b = _mm256_setzero_ps();                                                            \
        GEMM_STEP(0, kk, wk) GEMM_STEP(1, kk, wk) GEMM_STEP(2, kk, wk) GEMM_STEP(3, kk, wk)        \
        GEMM_STEP(4, kk, wk) GEMM_STEP(5, kk, wk) GEMM_STEP(6, kk, wk) GEMM_STEP(7, kk, wk)        \
        GEMM_STEP(8, kk, wk) GEMM_STEP(9, kk, wk) GEMM_STEP(10, kk, wk) GEMM_STEP(11, kk, wk)      \
    }
    /* two k-steps per turn: one 64-byte line of each panel for F16/BF16,
     * two for F32, prefetched PREFETCH bytes ahead. Decode streams W from
     * memory, and the out-of-order window alone keeps too few lines in
     * flight for F16 (measured: 13 GB/s without, 15 with, on one core). */
    int64_t kk = 0;
    for (; kk + 2 <= kc; kk += 2) {
        const char *pf = w + kk * rb + PREFETCH;
        for (int p = 0; p < np; p++) {
            _mm_prefetch(pf + p * pstride, _MM_HINT_T0);
            if (type == KG_GGML_TYPE_F32) {
                _mm_prefetch(pf + p * pstride + 64, _MM_HINT_T0);
            }
        }
        GEMM_KSTEP(kk)
        GEMM_KSTEP(kk + 1)
    }
    if (kk < kc) {
        GEMM_KSTEP(kk)
    }
#define GEMM_STORE(i)                                                                              \
    if ((i) < n_acc) {                                                                             \
        _mm256_storeu_ps(GEMM_CP(i), c##i);                                                        \
    }
    GEMM_STORE(0) GEMM_STORE(1) GEMM_STORE(2) GEMM_STORE(3) GEMM_STORE(4) GEMM_STORE(5)
    GEMM_STORE(6) GEMM_STORE(7) GEMM_STORE(8) GEMM_STORE(9) GEMM_STORE(10) GEMM_STORE(11)
#undef GEMM_CP
    // clang-format on
#undef GEMM_INIT
#undef GEMM_STEP
#undef GEMM_KSTEP
#undef GEMM_STORE
}

typedef void (*tile_fn)(const float *a,
                        int64_t lda,
                        const char *w,
                        int64_t pstride,
                        int64_t kc,
                        float *c,
                        int64_t ldc,
                        bool acc_in);

#define DEF_TILE(TN, T, MR, NP)                                                                    \
    static void tile_##TN##_##MR##_##NP(const float *a, int64_t lda, const char *w,                \
                                        int64_t pstride, int64_t kc, float *c, int64_t ldc,        \
                                        bool acc_in) {                                             \
        tile(T, MR, NP, a, lda, w, pstride, kc, c, ldc, acc_in);                                   \
    }
#define DEF_TILES(TN, T)                                                                           \
    DEF_TILE(TN, T, 1, 1)                                                                          \
    DEF_TILE(TN, T, 1, 2)                                                                          \
    DEF_TILE(TN, T, 1, 3)                                                                          \
    DEF_TILE(TN, T, 1, 4)                                                                          \
    DEF_TILE(TN, T, 1, 5)                                                                          \
    DEF_TILE(TN, T, 1, 6)                                                                          \
    DEF_TILE(TN, T, 2, 1)                                                                          \
    DEF_TILE(TN, T, 2, 2)                                                                          \
    DEF_TILE(TN, T, 2, 3)                                                                          \
    DEF_TILE(TN, T, 3, 1)                                                                          \
    DEF_TILE(TN, T, 3, 2)                                                                          \
    DEF_TILE(TN, T, 4, 1)                                                                          \
    DEF_TILE(TN, T, 5, 1)                                                                          \
    DEF_TILE(TN, T, 6, 1)                                                                          \
    static const tile_fn tiles_##TN[6][6] = {                                                      \
        {tile_##TN##_1_1, tile_##TN##_1_2, tile_##TN##_1_3, tile_##TN##_1_4, tile_##TN##_1_5,      \
         tile_##TN##_1_6},                                                                         \
        {tile_##TN##_2_1, tile_##TN##_2_2, tile_##TN##_2_3},                                       \
        {tile_##TN##_3_1, tile_##TN##_3_2},                                                        \
        {tile_##TN##_4_1},                                                                         \
        {tile_##TN##_5_1},                                                                         \
        {tile_##TN##_6_1},                                                                         \
    };

DEF_TILES(f32, KG_GGML_TYPE_F32)
DEF_TILES(f16, KG_GGML_TYPE_F16)
DEF_TILES(bf16, KG_GGML_TYPE_BF16)

/* Widest tile (in panels) per row count: 12 accumulators at most. */
static const int max_np[6] = {6, 3, 2, 1, 1, 1};

/* The last panel when it is partial: through a 16-wide scratch tile, so
 * the padding columns are computed but never stored. */
static void partial_tile(const tile_fn (*tab)[6],
                         int mr,
                         const float *a,
                         int64_t lda,
                         const char *w,
                         int64_t pstride,
                         int64_t kc,
                         float *c,
                         int64_t ldc,
                         int64_t nc,
                         bool acc_in) {
    float tmp[6 * NR];
    for (int64_t r = 0; r < mr && acc_in; r++) {
        memcpy(tmp + r * NR, c + r * ldc, (size_t)nc * sizeof(float));
    }
    tab[mr - 1][0](a, lda, w, pstride, kc, tmp, NR, acc_in);
    for (int64_t r = 0; r < mr; r++) {
        memcpy(c + r * ldc, tmp + r * NR, (size_t)nc * sizeof(float));
    }
}

/* Panels [p0, p1) for all m rows. */
static void vector_panels(
    const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m, int64_t p0, int64_t p1) {
    const int64_t K = w->k, N = w->n;
    const int64_t rb = (int64_t)elem_size(w->type) * NR, pstride = K * rb;
    const tile_fn(*tab)[6] = w->type == KG_GGML_TYPE_F16    ? tiles_f16
                             : w->type == KG_GGML_TYPE_BF16 ? tiles_bf16
                                                            : tiles_f32;
    const char *panels = w->panels;
    const bool partial = p1 * NR > N;
    const int64_t pf = partial ? p1 - 1 : p1; /* full panels end */
    const int64_t n_kb = (K + KC_MAX - 1) / KC_MAX, KC = (K + n_kb - 1) / n_kb;
    if (m <= 6) {
        /* decode: one row block, the widest tiles; W streams once. A is a
         * few rows, so K is cut only when they would crowd L1: each panel
         * is then read front to back in one sweep, which the prefetchers
         * follow better than two half sweeps. */
        const int mr = (int)m;
        const int64_t KD = m * K * (int64_t)sizeof(float) <= DECODE_A_BYTES ? K : KC;
        for (int64_t k0 = 0; k0 < K; k0 += KD) {
            const int64_t kc = K - k0 < KD ? K - k0 : KD;
            for (int64_t p = p0; p < pf;) {
                const int np = pf - p < max_np[mr - 1] ? (int)(pf - p) : max_np[mr - 1];
                tab[mr - 1][np - 1](a + k0, K, panels + p * pstride + k0 * rb, pstride, kc,
                                    c + p * NR, N, k0 > 0);
                p += np;
            }
            if (partial) {
                partial_tile(tab, mr, a + k0, K, panels + pf * pstride + k0 * rb, pstride, kc,
                             c + pf * NR, N, N - pf * NR, k0 > 0);
            }
        }
        return;
    }
    /* prefill (Goto's order): a K block of MC rows of A stays in L2 while
     * each panel's K block (in L1) meets all its row blocks */
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        for (int64_t i1 = 0; i1 < m; i1 += MC) {
            const int64_t i2 = i1 + MC < m ? i1 + MC : m;
            for (int64_t p = p0; p < p1; p++) {
                const char *wp = panels + p * pstride + k0 * rb;
                for (int64_t i0 = i1; i0 < i2; i0 += 6) {
                    const int mr = i2 - i0 < 6 ? (int)(i2 - i0) : 6;
                    const float *ai = a + i0 * K + k0;
                    float *ci = c + i0 * N + p * NR;
                    /* the next tile's C rows: with many rows C is far out of
                     * cache, and a tile cannot start before its C is loaded */
                    for (int64_t r = 6; r < 12 && i0 + r < i2; r++) {
                        _mm_prefetch((const char *)(ci + r * N), _MM_HINT_T0);
                        _mm_prefetch((const char *)(ci + r * N + NR - 1), _MM_HINT_T0);
                    }
                    if (p < pf) {
                        tab[mr - 1][0](ai, K, wp, pstride, kc, ci, N, k0 > 0);
                    } else {
                        partial_tile(tab, mr, ai, K, wp, pstride, kc, ci, N, N - pf * NR, k0 > 0);
                    }
                }
            }
        }
    }
}
#endif

// ---- driver ----

/* The kernels in use: 0 scalar, 1 AVX2 (every product), 2 AVX-512 for
 * products of more than 6 rows (AVX2 below: a few rows are bound by
 * reading W, which the wider registers do not speed up). All give the same
 * bits. -1: not chosen yet (the best the build and CPU have). */
static int kernel = -1;

static const char *const kernel_names[] = {"scalar", "avx2", "avx512"};

static bool kernel_runs(int i) {
#ifdef GEMM_AVX2
    return i == 0 || i == 1 || (i == 2 && cpu_gemm_avx512_runs());
#else
    return i == 0;
#endif
}

static int best_kernel(void) {
    return kernel_runs(2) ? 2 : kernel_runs(1) ? 1 : 0;
}

static int kernel_in_use(void) {
    if (kernel < 0) {
        kernel = best_kernel();
    }
    return kernel;
}

bool cpu_gemm_set_kernel(const char *name) {
    if (name == NULL || strcmp(name, "best") == 0) {
        kernel = best_kernel();
        return true;
    }
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, kernel_names[i]) == 0 && kernel_runs(i)) {
            kernel = i;
            return true;
        }
    }
    return false;
}

const char *cpu_gemm_kernel_name(void) {
    return kernel_names[kernel_in_use()];
}

void cpu_gemm_scalar(const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m) {
    scalar_columns(a, w, c, m, 0, w->n);
}

/* Panels [p0, p1) with kernel k (kernel_in_use(), read once per product on
 * the calling thread, so the pool's threads never touch the choice). */
static void run_panels(int k,
                       const float *a,
                       const cpu_gemm_weights_t *w,
                       float *c,
                       int64_t m,
                       int64_t p0,
                       int64_t p1) {
    if (k == 2 && m > 6) {
        cpu_gemm_avx512_panels(a, w, c, m, p0, p1);
        return;
    }
#ifdef GEMM_AVX2
    if (k >= 1) {
        vector_panels(a, w, c, m, p0, p1);
        return;
    }
#endif
    scalar_columns(a, w, c, m, p0 * NR, p1 * NR < w->n ? p1 * NR : w->n);
}

typedef struct gemm_job {
    int kernel; /* kernel_in_use() */
    const float *a;
    int64_t m, panels_per_task;
    int n_w;
    const cpu_gemm_weights_t *const *w; /* (n_w) */
    float *const *c;                    /* (n_w) */
    int64_t
        first_task[CPU_GEMM_MULTI_MAX + 1]; /* tasks of w[i]: [first_task[i], first_task[i + 1]) */
} gemm_job_t;

static void gemm_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const gemm_job_t *j = arg;
    int i = 0;
    while (task >= j->first_task[i + 1]) {
        i++;
    }
    const int64_t n_panels = (j->w[i]->n + NR - 1) / NR;
    const int64_t p0 = (task - j->first_task[i]) * j->panels_per_task;
    const int64_t p1 = p0 + j->panels_per_task < n_panels ? p0 + j->panels_per_task : n_panels;
    run_panels(j->kernel, j->a, j->w[i], j->c[i], j->m, p0, p1);
}

void cpu_gemm_multi(struct kg_pool *pool,
                    const float *a,
                    int64_t m,
                    int n_w,
                    const cpu_gemm_weights_t *const *w,
                    float *const *c) {
    KG_ASSERT(n_w >= 1 && n_w <= CPU_GEMM_MULTI_MAX);
    gemm_job_t j = {.kernel = kernel_in_use(), .a = a, .m = m, .n_w = n_w, .w = w, .c = c};
    int64_t n_panels = 0;
    double macs = 0.0, bytes = 0.0;
    for (int i = 0; i < n_w; i++) {
        n_panels += (w[i]->n + NR - 1) / NR;
        macs += (double)m * (double)w[i]->n * (double)w[i]->k;
        bytes += (double)w[i]->size;
    }
    if (m <= 0 || n_panels == 0) {
        return;
    }
    /* tasks of a few panels, about a multiple of the thread count so the
     * threads finish together; the split never changes a result */
    const int n_threads = pool ? kg_pool_n_threads(pool) : 1;
    const bool serial = n_threads == 1 || (macs < INLINE_MACS && bytes < INLINE_BYTES);
    const int64_t cap = m <= 6 ? TASK_PANELS_DECODE : TASK_PANELS, nt = serial ? 1 : n_threads;
    const int64_t n_tasks = nt * ((n_panels + nt * cap - 1) / (nt * cap));
    j.panels_per_task = (n_panels + n_tasks - 1) / n_tasks;
    for (int i = 0; i < n_w; i++) {
        const int64_t np = (w[i]->n + NR - 1) / NR;
        j.first_task[i + 1] = j.first_task[i] + (np + j.panels_per_task - 1) / j.panels_per_task;
    }
    if (serial) {
        for (int64_t t = 0; t < j.first_task[n_w]; t++) {
            gemm_task(&j, t, 0);
        }
        return;
    }
    kg_pool_run(pool, j.first_task[n_w], gemm_task, &j);
}

void cpu_gemm(
    struct kg_pool *pool, const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m) {
    cpu_gemm_multi(pool, a, m, 1, &w, &c);
}
