/* cpu_gemm_avx512: cpu_gemm's prefill kernel on AVX-512 registers, for the
 * CPUs whose FMA units are 512 bits wide (AMD Zen 5, Intel server cores
 * since Skylake-SP): twice the multiply-adds per instruction of the AVX2
 * tiles in cpu_gemm.c, over the same packed panels.
 *
 * One zmm register is one panel's k-row: 16 output columns, the panel
 * width, so a register tile of MR rows x NP panels is MR * NP accumulators
 * (8 x 3 = 24 of the 32 registers, enough independent chains to cover the
 * FMA latency on two pipes), A broadcast from memory, W loaded and widened
 * to F32 exactly (F16 by vcvtph2ps, BF16 by a shift and a mask). Every
 * accumulator lane is one output element's fmaf chain over k in order,
 * carried through C between K blocks, so the results equal the AVX2 and
 * scalar kernels' bit for bit (check_gemm compares them), and the kernel a
 * machine picks changes no output.
 *
 * Compiled with -march=x86-64-v4 (CMakeLists.txt) and run only where the
 * CPU and the OS have AVX-512 (cpu_gemm.c asks cpu_gemm_avx512_runs). */
#include "cpu_gemm_int.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&                      \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include <cpuid.h>
#include <immintrin.h>

#define NR CPU_GEMM_PANEL
#define MR 8 /* rows of a tile */
#define NP 3 /* panels of a tile */

/* K blocks of at most KC_MAX: an NP-panel K block (72 KiB of F32) comes
 * from L2 at 16 bytes per cycle of FMA work, well inside what L2 gives,
 * and the MC rows of A it meets (96 KiB) stay in L2 beside it. */
#define KC_MAX 256
#define MC     96

/* How far ahead in a panel W is prefetched, in bytes. */
#define PREFETCH 1024

#define AVX512_INLINE static inline __attribute__((always_inline))

/* One k-row of a panel (16 columns) widened to F32 in column order. BF16
 * words hold columns j (low half) and j+8 (high half): the shift gives
 * columns 0-7, the mask 8-15. */
AVX512_INLINE __m512 load_w(const int type, const char *p) {
    if (type == KG_GGML_TYPE_F32) {
        return _mm512_loadu_ps((const void *)p);
    }
    const __m256i v = _mm256_loadu_si256((const void *)p);
    if (type == KG_GGML_TYPE_F16) {
        return _mm512_cvtph_ps(v);
    }
    const __m256i lo = _mm256_slli_epi32(v, 16);
    const __m256i hi = _mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u));
    return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

/* One register tile: rows [0, mr) of a (row stride lda) times panels
 * [0, np) of w (panel stride pstride bytes) over kc steps of k into c (row
 * stride ldc), continuing the chains stored in c when acc_in; the last
 * panel's columns outside `last` (a lane mask) are neither read nor
 * written in c. Accumulator cI_P is row I, panel P; written out statement
 * by statement (macros), as compilers keep an array of vectors in memory
 * rather than unroll its loops, and row by row, so one broadcast of A is
 * live at a time (24 accumulators + 3 weights + 1: no spills). With
 * constant mr and np only the live accumulators remain, in registers. */
AVX512_INLINE void tile(const int type,
                        const int mr,
                        const int np,
                        const float *a,
                        int64_t lda,
                        const char *w,
                        int64_t pstride,
                        int64_t kc,
                        float *c,
                        int64_t ldc,
                        bool acc_in,
                        __mmask16 last) {
    const int64_t rb = type == KG_GGML_TYPE_F32 ? NR * 4 : NR * 2; /* bytes per k-row */
    // clang-format off
#define AVX512_ROW(X, I) X(I, 0) X(I, 1) X(I, 2)
#define AVX512_ALL(X)                                                                              \
    AVX512_ROW(X, 0) AVX512_ROW(X, 1) AVX512_ROW(X, 2) AVX512_ROW(X, 3)                            \
    AVX512_ROW(X, 4) AVX512_ROW(X, 5) AVX512_ROW(X, 6) AVX512_ROW(X, 7)
#define AVX512_MASK(P)    ((P) == np - 1 ? last : (__mmask16)0xffff)
#define AVX512_DECL(I, P) __m512 c##I##_##P = _mm512_setzero_ps();
#define AVX512_INIT(I, P)                                                                          \
    if ((I) < mr && (P) < np && acc_in) {                                                          \
        c##I##_##P = _mm512_maskz_loadu_ps(AVX512_MASK(P), c + (I) * ldc + (int64_t)(P) * NR);              \
    }
#define AVX512_FMA(I, P)                                                                           \
    if ((I) < mr && (P) < np) {                                                                    \
        c##I##_##P = _mm512_fmadd_ps(_mm512_set1_ps(a[(I) * lda + kk]), w##P, c##I##_##P);         \
    }
#define AVX512_STORE(I, P)                                                                         \
    if ((I) < mr && (P) < np) {                                                                    \
        _mm512_mask_storeu_ps(c + (I) * ldc + (int64_t)(P) * NR, AVX512_MASK(P), c##I##_##P);               \
    }
    AVX512_ALL(AVX512_DECL)
    AVX512_ALL(AVX512_INIT)
    for (int64_t kk = 0; kk < kc; kk++) {
        const char *wk = w + kk * rb;
        if (type == KG_GGML_TYPE_F32 || (kk & 1) == 0) { /* once per 64-byte line */
            for (int p = 0; p < np; p++) {
                _mm_prefetch(wk + p * pstride + PREFETCH, _MM_HINT_T0);
            }
        }
        const __m512 w0 = load_w(type, wk);
        const __m512 w1 = np > 1 ? load_w(type, wk + pstride) : w0;
        const __m512 w2 = np > 2 ? load_w(type, wk + 2 * pstride) : w0;
        AVX512_ALL(AVX512_FMA)
    }
    AVX512_ALL(AVX512_STORE)
    // clang-format on
#undef AVX512_ROW
#undef AVX512_ALL
#undef AVX512_MASK
#undef AVX512_DECL
#undef AVX512_INIT
#undef AVX512_FMA
#undef AVX512_STORE
}

typedef void (*tile_fn)(const float *a,
                        int64_t lda,
                        const char *w,
                        int64_t pstride,
                        int64_t kc,
                        float *c,
                        int64_t ldc,
                        bool acc_in,
                        __mmask16 last);

#define DEF_TILE(TN, T, R, P)                                                                      \
    static void tile_##TN##_##R##_##P(const float *a, int64_t lda, const char *w, int64_t pstride, \
                                      int64_t kc, float *c, int64_t ldc, bool acc_in,              \
                                      __mmask16 last) {                                            \
        tile(T, R, P, a, lda, w, pstride, kc, c, ldc, acc_in, last);                               \
    }
#define DEF_ROWS(TN, T, R) DEF_TILE(TN, T, R, 1) DEF_TILE(TN, T, R, 2) DEF_TILE(TN, T, R, 3)
#define ROW_FNS(TN, R)                                                                             \
    { tile_##TN##_##R##_1, tile_##TN##_##R##_2, tile_##TN##_##R##_3 }
#define DEF_TILES(TN, T)                                                                           \
    DEF_ROWS(TN, T, 1)                                                                             \
    DEF_ROWS(TN, T, 2)                                                                             \
    DEF_ROWS(TN, T, 3)                                                                             \
    DEF_ROWS(TN, T, 4)                                                                             \
    DEF_ROWS(TN, T, 5)                                                                             \
    DEF_ROWS(TN, T, 6)                                                                             \
    DEF_ROWS(TN, T, 7)                                                                             \
    DEF_ROWS(TN, T, 8)                                                                             \
    static const tile_fn tiles_##TN[MR][NP] = {ROW_FNS(TN, 1), ROW_FNS(TN, 2), ROW_FNS(TN, 3),     \
                                               ROW_FNS(TN, 4), ROW_FNS(TN, 5), ROW_FNS(TN, 6),     \
                                               ROW_FNS(TN, 7), ROW_FNS(TN, 8)};

DEF_TILES(f32, KG_GGML_TYPE_F32)
DEF_TILES(f16, KG_GGML_TYPE_F16)
DEF_TILES(bf16, KG_GGML_TYPE_BF16)

/* AVX512F, BW, DQ and VL (CPUID.(7, 0):EBX bits 16, 30, 17, 31), F16C and
 * FMA, and the OS saving the AVX-512 state (XCR0 bits 5-7). */
bool cpu_gemm_avx512_runs(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) {
        return false;
    }
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1u) || !((c >> 29) & 1u) || !((c >> 12) & 1u)) { /* OSXSAVE F16C FMA */
        return false;
    }
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    if ((b & need) != need) {
        return false;
    }
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
}

void cpu_gemm_avx512_panels(
    const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m, int64_t p0, int64_t p1) {
    const int64_t K = w->k, N = w->n, n_panels = (N + NR - 1) / NR;
    const int64_t rb = (int64_t)(w->type == KG_GGML_TYPE_F32 ? 4 : 2) * NR, pstride = K * rb;
    const tile_fn(*tab)[NP] = w->type == KG_GGML_TYPE_F16    ? tiles_f16
                              : w->type == KG_GGML_TYPE_BF16 ? tiles_bf16
                                                             : tiles_f32;
    const char *panels = w->panels;
    /* the padding columns of a partial last panel are computed (its
     * weights are zero) and never stored */
    const int64_t tail = N - (n_panels - 1) * NR;
    const __mmask16 tail_mask = (__mmask16)((1u << tail) - 1u);
    const int64_t n_kb = (K + KC_MAX - 1) / KC_MAX, KC = (K + n_kb - 1) / n_kb;
    /* Goto's order: a K block of MC rows of A stays in L2 while the NP
     * panels' K block meets each of its tiles of MR rows */
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        for (int64_t i1 = 0; i1 < m; i1 += MC) {
            const int64_t i2 = i1 + MC < m ? i1 + MC : m;
            for (int64_t p = p0; p < p1; p += NP) {
                const int np = p1 - p < NP ? (int)(p1 - p) : NP;
                const __mmask16 last = p + np == n_panels ? tail_mask : (__mmask16)0xffff;
                const char *wp = panels + p * pstride + k0 * rb;
                for (int64_t i0 = i1; i0 < i2; i0 += MR) {
                    const int mr = i2 - i0 < MR ? (int)(i2 - i0) : MR;
                    float *ci = c + i0 * N + p * NR;
                    /* the next tile's C rows: with many rows C is far out
                     * of cache, and a tile cannot start before its C is in */
                    for (int64_t r = MR; r < (int64_t)2 * MR && i0 + r < i2; r++) {
                        for (int q = 0; q < np; q++) {
                            _mm_prefetch((const char *)(ci + r * N + (int64_t)q * NR), _MM_HINT_T0);
                        }
                    }
                    tab[mr - 1][np - 1](a + i0 * K + k0, K, wp, pstride, kc, ci, N, k0 > 0, last);
                }
            }
        }
    }
}

#else

bool cpu_gemm_avx512_runs(void) {
    return false;
}

void cpu_gemm_avx512_panels(
    const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m, int64_t p0, int64_t p1) {
    (void)a, (void)w, (void)c, (void)m, (void)p0, (void)p1;
}

#endif
