/* cpu_vecdot: tiles of integer dot products on unpacked weight panels,
 * the portable scalar tile, and the threaded driver (see cpu_vecdot.h for
 * the numerics and why they are batch invariant). */
#include "cpu_vecdot.h"

#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_mxfp4.h"
#include "../../model/kg_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <cpuid.h>
#include <immintrin.h>
#define VECDOT_AVX2 1
#endif

#define NP CPU_QPANEL

/* Panels a task unpacks and computes: a run of them stays in L2 while the
 * activation rows stream past (prefill), and tasks stay small enough to
 * balance two threads on a decode step. */
#define TASK_PANELS        4
#define TASK_PANELS_DECODE 4

/* Activation rows per block: MC rows of k int8 stay in L2 with the task's
 * panels. */
#define MC 64

/* Below this many activation rows the fused decode tiles read the blocks
 * in place (unpacked panels pay off from there on): 32-block types, whose
 * panels are cheap to build, and the K-quants, whose are not. */
#define FUSED_MAX_ROWS_32 5
#define FUSED_MAX_ROWS_K  17
#define FUSED_MAX_ROWS    17 /* the larger: the fused tiles' buffers hold this many rows */

/* Products smaller than both of these run on the calling thread. A decode
 * step is bound by reading the weights, and a second thread halves that
 * for any matrix above ~128 KiB (the pool's workers poll between the
 * step's products, so a hand-off costs a few microseconds). */
#define INLINE_MACS  262144.0
#define INLINE_BYTES 131072.0

/* The kernel family in use: 0 scalar, 1 AVX2, 2 AVX2 with AVX-VNNI's
 * vpdpbusd for the 4-byte dot products (same integers, one instruction
 * instead of two), 3 the same instruction in its AVX512-VNNI form (EVEX,
 * on ymm registers with AVX512VL): the CPUs most servers run (Ice Lake and
 * later Xeons, AMD Zen 4 and 5) have that one and not AVX-VNNI. -1: not
 * chosen yet (the best the CPU has). */
static int kernel = -1;

#ifdef VECDOT_AVX2
/* CPUID.(EAX=7, ECX=1):EAX bit 4. Asked of cpuid directly: clang before 16
 * has no "avxvnni" for __builtin_cpu_supports (the fuzz build is clang 14). */
static bool has_avxvnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) {
        return false;
    }
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 4) & 1u;
}

/* AVX512_VNNI (CPUID.(7, 0):ECX bit 11) and AVX512VL (EBX bit 31), and the
 * OS saving the AVX-512 state (XCR0 bits 5-7): an EVEX instruction faults
 * without it, even on ymm registers. */
static bool has_avx512vnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) {
        return false;
    }
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1u)) { /* OSXSAVE: xgetbv may run */
        return false;
    }
    __cpuid_count(7, 0, a, b, c, d);
    if (!((c >> 11) & 1u) || !((b >> 31) & 1u)) {
        return false;
    }
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
}
#endif

/* Whether this build and CPU run kernel family i. */
static bool kernel_runs(int i) {
#ifdef VECDOT_AVX2
    return i == 0 || i == 1 || (i == 2 && has_avxvnni()) || (i == 3 && has_avx512vnni());
#else
    return i == 0;
#endif
}

static int best_kernel(void) {
    return kernel_runs(2) ? 2 : kernel_runs(3) ? 3 : kernel_runs(1) ? 1 : 0;
}

static int kernel_in_use(void) {
    if (kernel < 0) {
        kernel = best_kernel();
    }
    return kernel;
}

static const char *const kernel_names[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};

bool cpu_vecdot_set_kernel(const char *name) {
    if (name == NULL || strcmp(name, "best") == 0) {
        kernel = best_kernel();
        return true;
    }
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, kernel_names[i]) == 0 && kernel_runs(i)) {
            kernel = i;
            return true;
        }
    }
    return false;
}

const char *cpu_vecdot_kernel_name(void) {
    return kernel_names[kernel_in_use()];
}

/* The vpdpbusd encoding of the kernels in use: 0 none, 1 VEX, 2 EVEX. */
static int vnni_in_use(void) {
    const int k = kernel_in_use();
    return k >= 2 ? k - 1 : 0;
}

bool cpu_qmat_init(cpu_qmat_t *w, kg_ggml_type_t type, const void *data, int64_t n, int64_t k) {
    memset(w, 0, sizeof(*w));
    const cpu_qtraits_t *tr = cpu_qtraits(type);
    if (!tr || k % tr->blk != 0) {
        return false;
    }
    w->tr = tr;
    w->data = data;
    w->n = n;
    w->k = k;
    w->row_size = kg_type_row_size(type, k);
    return true;
}

// ---- scratch ----

struct cpu_qgemm_scratch {
    int n_threads;
    int64_t max_k;
    size_t panel_size; /* bytes of one panel */
    char *mem;         /* (n_threads, TASK_PANELS, panel_size) */
};

cpu_qgemm_scratch_t *cpu_qgemm_scratch_new(int n_threads, int64_t max_k) {
    cpu_qgemm_scratch_t *s = calloc(1, sizeof(*s));
    if (!s) {
        return NULL;
    }
    s->n_threads = n_threads;
    s->max_k = max_k;
    s->panel_size = (cpu_qpanel_size(max_k) + 63) & ~(size_t)63;
    /* the fused decode tiles' buffers (fused_buf_t) fit the same space */
    const size_t nb32 = (size_t)max_k / 32, ng32 = (nb32 + 7) / 8, ng256 = (max_k / 256 + 7) / 8;
    const size_t fused = (FUSED_MAX_ROWS_32 - 1) * ng32 * NP * 32 +
                         (FUSED_MAX_ROWS_K - 1) * 2 * ng256 * NP * 32 +
                         2 * nb32 * NP * sizeof(uint16_t);
    while ((size_t)TASK_PANELS * s->panel_size < fused) {
        s->panel_size += 64;
    }
    const int tp = TASK_PANELS > TASK_PANELS_DECODE ? TASK_PANELS : TASK_PANELS_DECODE;
    s->mem = aligned_alloc(64, (size_t)n_threads * (size_t)tp * s->panel_size);
    if (!s->mem) {
        free(s);
        return NULL;
    }
    return s;
}

void cpu_qgemm_scratch_free(cpu_qgemm_scratch_t *s) {
    if (s) {
        free(s->mem);
        free(s);
    }
}

size_t cpu_qgemm_scratch_size(const cpu_qgemm_scratch_t *s) {
    const int tp = TASK_PANELS > TASK_PANELS_DECODE ? TASK_PANELS : TASK_PANELS_DECODE;
    return (size_t)s->n_threads * (size_t)tp * s->panel_size;
}

// ---- the scalar tile (the portable kernel and the order every kernel follows) ----

/* Rows [i0, i0 + rm) of a against panel rows [col0, col0 + rn), results for
 * panel rows below nc stored at c[(i - i0) * ldc + (col - col0)]. */
static void tile_scalar(const cpu_qtraits_t *tr,
                        const cpu_qpanel_t *p,
                        int col0,
                        int rn,
                        const cpu_qact_t *a,
                        int64_t i0,
                        int rm,
                        float *c,
                        int64_t ldc,
                        int nc) {
    const int64_t k = p->k, m = a->m, blk = tr->blk;
    for (int r = 0; r < rm; r++) {
        const int64_t i = i0 + r;
        const int8_t *aq = a->qs + i * k;
        for (int jj = 0; jj < rn; jj++) {
            const int col = col0 + jj;
            if (col >= nc) {
                continue;
            }
            const int8_t *w = p->w + (int64_t)col * k;
            float acc = 0.0f, macc = 0.0f;
            for (int64_t b = 0; b < k / blk; b++) {
                int32_t isum = 0;
                for (int64_t e = b * blk; e < (b + 1) * blk; e++) {
                    int s = 1;
                    if (tr->scaled) {
                        const uint32_t pr = p->sc[(int64_t)col * (k / 32) + e / 32];
                        s = (int16_t)(uint16_t)(e % 32 < 16 ? pr : pr >> 16);
                    }
                    isum += s * (w[e] - tr->offset) * aq[e];
                }
                const float da = a->d[b * m + i];
                acc = fmaf(p->d[b * NP + col] * da, (float)isum, acc);
                if (tr->min_m) {
                    macc = fmaf(p->dm[b * NP + col], a->s[b * m + i], macc);
                } else if (tr->min_k) {
                    int32_t msum = 0;
                    for (int j = 0; j < 16; j++) {
                        msum += p->mins[(int64_t)col * (k / 16) + b * 16 + j] *
                                a->bsums[i * (k / 16) + b * 16 + j];
                    }
                    macc = fmaf(-(p->dm[b * NP + col] * da), (float)msum, macc);
                }
            }
            c[r * ldc + jj] = tr->min_m || tr->min_k ? acc + macc : acc;
        }
    }
}

// ---- AVX2 tiles ----
#ifdef VECDOT_AVX2

#define QV_INLINE static inline __attribute__((always_inline))

/* The int16 scale vector of a 32-element chunk: lanes 0-7 (elements 0-15)
 * the low half of pr, lanes 8-15 the high half, as madd pairs them. */
QV_INLINE __m256i scale_vec(uint32_t pr) {
    const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32((int)pr), shuf);
}

/* acc + the 4-byte dot products of unsigned u and signed s, per int32
 * lane: vpdpbusd, VEX-encoded (AVX-VNNI, vnni 1) or EVEX-encoded
 * (AVX512-VNNI with AVX512VL, vnni 2). Written as asm so that this file
 * needs neither -mavxvnni nor -mavx512vnni; each form only runs where the
 * CPU has it. The instruction and its result are the same. */
QV_INLINE __m256i dpbusd(const int vnni, __m256i acc, __m256i u, __m256i sb) {
    if (vnni == 2) {
        __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(sb));
    } else {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(sb));
    }
    return acc;
}

/* The int32 lanes of sum over 4 bytes of w * a (w signed unless nonneg;
 * |w| <= 128, |a| <= 127, so maddubs' int16 pairs never saturate and both
 * paths give the same integers). */
QV_INLINE __m256i dot4(const int vnni, const int nonneg, __m256i w, __m256i a) {
    const __m256i u = nonneg ? w : _mm256_sign_epi8(w, w);
    const __m256i sb = nonneg ? a : _mm256_sign_epi8(a, w);
    if (vnni) {
        return dpbusd(vnni, _mm256_setzero_si256(), u, sb);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, sb), _mm256_set1_epi16(1));
}

/* Sum of each of 4 int32x8 vectors into lanes 0..3 of the result. */
QV_INLINE __m128i reduce4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* A float per pair q = r * RN + jj from per-column values cols[jj] and
 * per-row values rows[r] (RM * RN = 8). */
QV_INLINE __m256 pair_cols(const int RN, const float *cols) {
    if (RN == 8) {
        return _mm256_loadu_ps(cols);
    }
    if (RN == 4) {
        return _mm256_broadcast_ps((const __m128 *)(const void *)cols);
    }
    return _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)cols));
}

QV_INLINE __m256 pair_rows(const int RM, const float *rows) {
    if (RM == 1) {
        return _mm256_broadcast_ss(rows);
    }
    if (RM == 2) {
        return _mm256_set_m128(_mm_broadcast_ss(rows + 1), _mm_broadcast_ss(rows));
    }
    const __m256i idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(rows)), idx);
}

/* The integer sum of pair q = r * RN + jj over one block. */
QV_INLINE __m256i pair_isum(const int nonneg,
                            const int scaled,
                            const int offs,
                            const int nch,
                            const int8_t *w,
                            const int8_t *aq,
                            const uint32_t *sc,
                            const int16_t *bsums) {
    __m256i p = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ch = 0; ch < nch; ch++) {
        const __m256i wv = _mm256_load_si256((const __m256i *)(const void *)(w + 32 * ch));
        __m256i t32;
        const __m256i av = _mm256_load_si256((const __m256i *)(const void *)(aq + 32 * ch));
        if (scaled) {
            /* maddubs multiplies unsigned by signed bytes: signed weights move
             * their sign onto the activation */
            const __m256i t16 =
                nonneg ? _mm256_maddubs_epi16(wv, av)
                       : _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            t32 = _mm256_madd_epi16(t16, scale_vec(sc[ch]));
        } else {
            t32 = dot4(0, nonneg, wv, av);
        }
        p = ch == 0 ? t32 : _mm256_add_epi32(p, t32);
    }
    if (offs) {
        /* the panel holds w + offs: take offs * sum over sub-blocks of sc * bsum back */
        const __m256i sc16 = _mm256_load_si256((const __m256i *)(const void *)sc);
        const __m256i bs = _mm256_load_si256((const __m256i *)(const void *)bsums);
        p = _mm256_sub_epi32(p, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), offs == 32 ? 5 : 2));
    }
    return p;
}

QV_INLINE void tile_avx2(const int offs,
                         const int nonneg,
                         const int scaled,
                         const int min_m,
                         const int min_k,
                         const int blk,
                         const int RM,
                         const int RN,
                         const cpu_qpanel_t *p,
                         int col0,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc) {
    const int64_t k = p->k, m = a->m, nb = k / blk;
    const int nch = blk / 32;
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t off = b * blk;
        __m128i half[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i pq[4];
#pragma GCC unroll 4
            for (int q4 = 0; q4 < 4; q4++) {
                const int q = 4 * h + q4, r = q / RN, jj = q % RN;
                const int64_t col = col0 + jj;
                pq[q4] = pair_isum(nonneg, scaled, offs, nch, p->w + col * k + off,
                                   a->qs + (i0 + r) * k + off, p->sc + col * (k / 32) + off / 32,
                                   a->bsums + (i0 + r) * (k / 16) + off / 16);
            }
            half[h] = reduce4(pq[0], pq[1], pq[2], pq[3]);
        }
        const __m256i isum = _mm256_set_m128i(half[1], half[0]);
        const __m256 da = pair_rows(RM, a->d + b * m + i0);
        const __m256 dd = _mm256_mul_ps(pair_cols(RN, p->d + b * NP + col0), da);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        if (min_m) {
            macc = _mm256_fmadd_ps(pair_cols(RN, p->dm + b * NP + col0),
                                   pair_rows(RM, a->s + b * m + i0), macc);
        }
        if (min_k) {
            __m128i mh[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i t[4];
#pragma GCC unroll 4
                for (int q4 = 0; q4 < 4; q4++) {
                    const int q = 4 * h + q4, r = q / RN, jj = q % RN;
                    const int64_t col = col0 + jj;
                    t[q4] = _mm256_madd_epi16(
                        _mm256_load_si256(
                            (const __m256i *)(const void *)(p->mins + col * (k / 16) + b * 16)),
                        _mm256_load_si256((const __m256i *)(const void *)(a->bsums +
                                                                          (i0 + r) * (k / 16) +
                                                                          b * 16)));
                }
                mh[h] = reduce4(t[0], t[1], t[2], t[3]);
            }
            const __m256 dm = _mm256_mul_ps(pair_cols(RN, p->dm + b * NP + col0), da);
            const __m256 neg = _mm256_xor_ps(dm, _mm256_set1_ps(-0.0f));
            macc = _mm256_fmadd_ps(neg, _mm256_cvtepi32_ps(_mm256_set_m128i(mh[1], mh[0])), macc);
        }
    }
    const __m256 res = min_m || min_k ? _mm256_add_ps(acc, macc) : acc;
    float out[8];
    _mm256_storeu_ps(out, res);
    for (int q = 0; q < 8; q++) {
        const int r = q / RN, jj = q % RN;
        if (col0 + jj < nc) {
            c[r * ldc + jj] = out[q];
        }
    }
}

// ---- AVX2 fused decode tiles: 1 row x 8 weight rows, straight from the blocks ----

/* A decode step meets each weight block once, so unpacking it to a panel
 * first would only add a trip through memory: these kernels unpack in
 * registers. Same integers, same float chain, same bits as the panel
 * tiles (tests compare them). */

QV_INLINE __m256i nib32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

QV_INLINE __m256i bits5(uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* The 32 weight integers of a block-32 format at x (as cpu_quant_unpack). */
QV_INLINE __m256i w_blk32(const kg_ggml_type_t type, const uint8_t *x) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return _mm256_sub_epi8(nib32(x + 2), _mm256_set1_epi8(8));
    case KG_GGML_TYPE_Q4_1:
        return nib32(x + 4);
    case KG_GGML_TYPE_Q5_0: {
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        return _mm256_sub_epi8(_mm256_or_si256(nib32(x + 6), bits5(qh)), _mm256_set1_epi8(16));
    }
    case KG_GGML_TYPE_Q5_1: {
        uint32_t qh;
        memcpy(&qh, x + 4, 4);
        return _mm256_or_si256(nib32(x + 8), bits5(qh));
    }
    case KG_GGML_TYPE_IQ4_NL: {
        const __m256i iq4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_iq4nl_values));
        return _mm256_shuffle_epi8(iq4, nib32(x + 2));
    }
    case KG_GGML_TYPE_MXFP4: {
        /* after the E8M0 byte, the codes as Q4_0's nibbles */
        const __m256i fp4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_mxfp4_values));
        return _mm256_shuffle_epi8(fp4, nib32(x + 1));
    }
    default: /* Q8_0 */
        return _mm256_loadu_si256((const __m256i *)(const void *)(x + 2));
    }
}

/* The fused decode multiplies a signed block-32 format as unsigned weights
 * u = w + off against the signed activations and takes off * sum(a) back in
 * phase 2: the same integer, without the two sign instructions per block
 * (nor Q4_0/Q5_0's subtraction) that signed weights need. Without VNNI the
 * pairs of u * a meet in int16, so only u <= 31 (2 * 31 * 127 fits); with
 * VNNI every offset fits (Q8_0 and IQ4_NL: w + 128 as a byte). 0: the
 * format keeps the sign path (unsigned already: Q4_1, Q5_1). */
QV_INLINE int blk32_offset(const kg_ggml_type_t type, const int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return 8;
    case KG_GGML_TYPE_Q5_0:
        return 16;
    case KG_GGML_TYPE_MXFP4:
        return 12; /* the doubled E2M1 values are -12..12 */
    case KG_GGML_TYPE_Q8_0:
    case KG_GGML_TYPE_IQ4_NL:
        return vnni ? 128 : 0;
    default:
        return 0;
    }
}

/* w + blk32_offset(type) of the block at x, as bytes 0..255. */
QV_INLINE __m256i u_blk32(const kg_ggml_type_t type, const uint8_t *x) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return nib32(x + 2);
    case KG_GGML_TYPE_Q5_0: {
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        return _mm256_or_si256(nib32(x + 6), bits5(qh));
    }
    case KG_GGML_TYPE_MXFP4:
        return _mm256_add_epi8(w_blk32(type, x), _mm256_set1_epi8(12));
    default: /* Q8_0, IQ4_NL: + 128 */
        return _mm256_xor_si256(w_blk32(type, x), _mm256_set1_epi8((char)0x80));
    }
}

/* The 8 lane sums of one block-32 row against activations av: through the
 * offset weights when the format has an offset (phase 2 takes it back). */
QV_INLINE __m256i dot_blk32(const int vnni,
                            const int nonneg,
                            const int off,
                            const kg_ggml_type_t type,
                            const uint8_t *x,
                            __m256i av) {
    return off ? dot4(vnni, 1, u_blk32(type, x), av) : dot4(vnni, nonneg, w_blk32(type, x), av);
}

static inline size_t blk32_size(kg_ggml_type_t type) {
    return type == KG_GGML_TYPE_Q4_1    ? 20
           : type == KG_GGML_TYPE_Q5_0  ? 22
           : type == KG_GGML_TYPE_Q5_1  ? 24
           : type == KG_GGML_TYPE_Q8_0  ? 34
           : type == KG_GGML_TYPE_MXFP4 ? 17
                                        : 18;
}

static inline size_t blk256_size(kg_ggml_type_t type) {
    return type == KG_GGML_TYPE_Q2_K   ? 84
           : type == KG_GGML_TYPE_Q3_K ? 110
           : type == KG_GGML_TYPE_Q4_K ? 144
           : type == KG_GGML_TYPE_Q5_K ? 176
           : type == KG_GGML_TYPE_Q6_K ? 210
                                       : 136;
}

/* The madd scale vector of chunk ch from the 16 int16 scales of a
 * superblock (one per 16 elements): lanes 0-7 scale 2 ch, 8-15 scale 2 ch + 1. */
QV_INLINE __m256i chunk_scale(__m256i sc16, int ch) {
    const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(ch)), shuf);
}

/* 16 bytes, each of the low 8 twice: 8 per-32 values -> 16 per-16 values */
QV_INLINE __m128i dup8(__m128i v, int from) {
    const __m128i lo = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i hi = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    return _mm_shuffle_epi8(v, from ? hi : lo);
}

/* K-quants and IQ4_XS: the 8 chunks of 32 weight integers of the
 * superblock at x, their 16 int16 scales (one per 16 elements) and, for
 * the types with mins, the 16 int16 mins (as cpu_quant_unpack). */
QV_INLINE void
kunpack(const kg_ggml_type_t type, const uint8_t *x, __m256i *w, __m256i *sc16, __m256i *mins16) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    switch (type) {
    case KG_GGML_TYPE_Q2_K: {
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(x + 16 + 32 * h));
#pragma GCC unroll 8
            for (int s2 = 0; s2 < 4; s2++) {
                w[4 * h + s2] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2);
            }
        }
        const __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)x);
        const __m128i m4x = _mm_set1_epi8(0x0f);
        *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, m4x));
        *mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), m4x));
        return;
    }
    case KG_GGML_TYPE_Q3_K: {
        const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)x);
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 + 32 * h));
#pragma GCC unroll 8
            for (int s2 = 0; s2 < 4; s2++) {
                const int ch = 4 * h + s2;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2);
                const __m256i hb = _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hm, ch), _mm256_set1_epi8(1)), 2);
                w[ch] = _mm256_add_epi8(lo, hb); /* the value + 4 */
            }
        }
        /* 16 6-bit scales: low nibbles in bytes 0-7 (scales 0-7) and their high
         * nibbles (8-15); the top 2 bits in bytes 8-11 at bit 2 (j / 4) */
        uint32_t aux[3];
        memcpy(aux, x + 96, 12);
        const uint32_t k2 = 0x0f0f0f0f, k1 = 0x03030303;
        const __m128i s128 =
            _mm_set_epi32((int)(((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4)),
                          (int)(((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4)),
                          (int)((aux[1] & k2) | (((aux[2] >> 2) & k1) << 4)),
                          (int)((aux[0] & k2) | ((aux[2] & k1) << 4)));
        *sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(s128, _mm_set1_epi8(32)));
        return;
    }
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K: {
        const bool five = type == KG_GGML_TYPE_Q5_K;
        const uint8_t *ql = x + (five ? 48 : 16);
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)(x + 16))
                                : _mm256_setzero_si256();
        const __m256i one = _mm256_set1_epi8(1);
#pragma GCC unroll 8
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32 * g));
            w[2 * g] = _mm256_and_si256(q, m4);
            w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                w[2 * g] = _mm256_or_si256(
                    w[2 * g],
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                w[2 * g + 1] = _mm256_or_si256(
                    w[2 * g + 1],
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
        }
        /* the 8 6-bit scales to bytes 0-7 and the 8 mins to bytes 8-15 */
        uint32_t u[4];
        memcpy(u, x + 4, 12);
        const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
        u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
        const uint32_t m03 = u[1] & k1;
        u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
        u[2] = m03;
        u[0] &= k1;
        const __m128i sm = _mm_loadu_si128((const __m128i *)(const void *)u);
        *sc16 = _mm256_cvtepu8_epi16(dup8(sm, 0));
        *mins16 = _mm256_cvtepu8_epi16(dup8(sm, 1));
        return;
    }
    case KG_GGML_TYPE_Q6_K:
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x + 64 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            const __m256i qh =
                _mm256_loadu_si256((const __m256i *)(const void *)(x + 128 + 32 * h));
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
#pragma GCC unroll 8
            for (int q4 = 0; q4 < 4; q4++) {
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * q4), m2);
                /* the value + 32 */
                w[4 * h + q4] = _mm256_or_si256(lo[q4], _mm256_slli_epi16(hi, 4));
            }
        }
        *sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x + 192)));
        return;
    default: { /* IQ4_XS */
        const __m256i iq4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_iq4nl_values));
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            w[ib] = _mm256_shuffle_epi8(iq4, nib32(x + 8 + 16 * ib));
        }
        /* ls = a nibble of scales_l | 2 bits of scales_h << 4, per 32 */
        uint16_t sh;
        uint32_t sl;
        memcpy(&sh, x + 2, 2);
        memcpy(&sl, x + 4, 4);
        const uint64_t ls =
            _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | (_pdep_u64(sh, 0x0303030303030303ull) << 4);
        const __m128i l8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)ls), _mm_set1_epi8(32));
        *sc16 = _mm256_cvtepi8_epi16(dup8(l8, 0));
        return;
    }
    }
}

/* Two phases. 1: each of the 8 weight rows in turn (one sequential stream
 * through the matrix, as the prefetchers like it) is unpacked block by
 * block in registers and met with the activation rows; the 8 lane sums of
 * a group of 8 blocks are reduced there to the blocks' exact sums (one
 * vector, lane j for block 8g + j), which go to a buffer with the block
 * scales as they are stored (fp16). The reduction is arithmetic the memory
 * stream hides; done in phase 2 it took a third of a Q8_0 decode. 2: per
 * activation row and group, the 8 weight rows' vectors are transposed
 * (lane q for weight row q) and the float chain runs across the 8 outputs,
 * block by block in order. */
QV_INLINE void transpose8(__m256i *r) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* Lane j: the sum of p[j]'s 8 lanes. */
QV_INLINE __m256i reduce8_at(const __m256i *p) {
    return _mm256_set_m128i(reduce4(p[4], p[5], p[6], p[7]), reduce4(p[0], p[1], p[2], p[3]));
}

/* The lane sums of one superblock (unpacked: w, sc16) against 256
 * activations aq with their 16 sums bs, sub-block scales applied. */
QV_INLINE __m256i kblock_dot(const int nonneg,
                             const int offs,
                             const __m256i *w,
                             __m256i sc16,
                             const int8_t *aq,
                             const int16_t *bs) {
    __m256i p = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ch = 0; ch < 8; ch++) {
        const __m256i av = _mm256_load_si256((const __m256i *)(const void *)(aq + 32 * ch));
        const __m256i t16 = nonneg ? _mm256_maddubs_epi16(w[ch], av)
                                   : _mm256_maddubs_epi16(_mm256_sign_epi8(w[ch], w[ch]),
                                                          _mm256_sign_epi8(av, w[ch]));
        p = _mm256_add_epi32(p, _mm256_madd_epi16(t16, chunk_scale(sc16, ch)));
    }
    if (offs) {
        const __m256i bsv = _mm256_load_si256((const __m256i *)(const void *)bs);
        p = _mm256_sub_epi32(p,
                             _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), offs == 32 ? 5 : 2));
    }
    return p;
}

typedef struct fused_buf {
    __m256i *p;   /* (m, ng, 8): the sums of group g's 8 blocks, for weight row q */
    __m256i *mp;  /* min_k: (m, ng, 8) the same of mins * bsums */
    uint16_t *d;  /* (nb, 8) fp16 d of each block and weight row (MXFP4: its E8M0 byte) */
    uint16_t *dm; /* (nb, 8) its fp16 m (min_m) or dmin (min_k) */
} fused_buf_t;

/* A block's scales as stored, for phase 2: its fp16 d (MXFP4: the E8M0
 * byte) and, with `second`, the fp16 after it (m or dmin). */
QV_INLINE void fused_scales(const kg_ggml_type_t type,
                            const uint8_t *xb,
                            size_t doff,
                            int second,
                            uint16_t *d,
                            uint16_t *dm) {
    if (type == KG_GGML_TYPE_MXFP4) {
        *d = xb[0];
    } else {
        memcpy(d, xb + doff, 2);
    }
    if (second) {
        memcpy(dm, xb + doff + 2, 2);
    }
}

QV_INLINE void fused_phase1(const int vnni,
                            const kg_ggml_type_t type,
                            const int blk,
                            const uint8_t *x,
                            int q,
                            const cpu_qact_t *a,
                            const fused_buf_t *fb) {
    const int64_t k = a->k, nb = k / blk, m = a->m;
    const int nonneg = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1 ||
                       type == KG_GGML_TYPE_Q2_K || type == KG_GGML_TYPE_Q4_K ||
                       type == KG_GGML_TYPE_Q5_K || type == KG_GGML_TYPE_Q3_K ||
                       type == KG_GGML_TYPE_Q6_K;
    /* Q3_K and Q6_K unpack as value + offs (>= 0; see cpu_qtraits_t.offset) */
    const int offs = type == KG_GGML_TYPE_Q3_K ? 4 : type == KG_GGML_TYPE_Q6_K ? 32 : 0;
    const int off = blk == 32 ? blk32_offset(type, vnni) : 0;
    const int min_m = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1;
    const int min_k =
        type == KG_GGML_TYPE_Q2_K || type == KG_GGML_TYPE_Q4_K || type == KG_GGML_TYPE_Q5_K;
    const size_t bs = blk == 32 ? blk32_size(type) : blk256_size(type);
    const size_t doff = type == KG_GGML_TYPE_Q2_K   ? 80
                        : type == KG_GGML_TYPE_Q3_K ? 108
                        : type == KG_GGML_TYPE_Q6_K ? 208
                                                    : 0;
    const int8_t *restrict qs = a->qs;
    const int16_t *restrict bsums = a->bsums;
    __m256i *restrict P = fb->p;
    __m256i *restrict MP = fb->mp;
    uint16_t *restrict D = fb->d;
    uint16_t *restrict DM = fb->dm;
    const int64_t ng = (nb + 7) / 8;
    const __m256i zero = _mm256_setzero_si256();
    if (blk == 32 && m == 1) {
        /* decode of one sequence: the common case, the group in registers */
        for (int64_t g = 0; g < ng; g++) {
            __m256i pv[8];
#pragma GCC unroll 8
            for (int jb = 0; jb < 8; jb++) {
                const int64_t b = g * 8 + jb;
                if (b >= nb) {
                    pv[jb] = zero;
                    continue;
                }
                const uint8_t *xb = x + (size_t)b * bs;
                fused_scales(type, xb, doff, min_m, D + b * NP + q, DM + b * NP + q);
                const __m256i av = _mm256_load_si256((const __m256i *)(const void *)(qs + 32 * b));
                pv[jb] = dot_blk32(vnni, nonneg, off, type, xb, av);
            }
            P[g * NP + q] = reduce8_at(pv);
        }
        return;
    }
    /* the group's lane sums of every activation row, reduced at its end */
    __m256i S[FUSED_MAX_ROWS][8], SM[FUSED_MAX_ROWS][8];
    for (int64_t g = 0; g < ng; g++) {
        for (int jb = 0; jb < 8; jb++) {
            const int64_t b = g * 8 + jb;
            if (b >= nb) {
                for (int64_t r = 0; r < m; r++) {
                    S[r][jb] = SM[r][jb] = zero;
                }
                continue;
            }
            const uint8_t *xb = x + (size_t)b * bs;
            fused_scales(type, xb, doff, min_m || min_k, D + b * NP + q, DM + b * NP + q);
            if (blk == 32) {
                const __m256i w = off ? u_blk32(type, xb) : w_blk32(type, xb);
                for (int64_t r = 0; r < m; r++) {
                    const __m256i av =
                        _mm256_load_si256((const __m256i *)(const void *)(qs + r * k + 32 * b));
                    S[r][jb] = dot4(vnni, off ? 1 : nonneg, w, av);
                }
                continue;
            }
            __m256i w[8], sc16, mins16 = zero;
            kunpack(type, xb, w, &sc16, &mins16);
            if (m == 1) {
                /* no row loop for the compiler to hoist the scale vectors out of:
                 * they stay in the instruction stream instead of in spills */
                S[0][jb] = kblock_dot(nonneg, offs, w, sc16, qs + 256 * b, bsums + 16 * b);
                if (min_k) {
                    SM[0][jb] = _mm256_madd_epi16(
                        mins16, _mm256_load_si256((const __m256i *)(const void *)(bsums + 16 * b)));
                }
                continue;
            }
            for (int64_t r = 0; r < m; r++) {
                const int16_t *bsr = bsums + r * (k / 16) + 16 * b;
                S[r][jb] = kblock_dot(nonneg, offs, w, sc16, qs + r * k + 256 * b, bsr);
                if (min_k) {
                    SM[r][jb] = _mm256_madd_epi16(
                        mins16, _mm256_load_si256((const __m256i *)(const void *)bsr));
                }
            }
        }
        for (int64_t r = 0; r < m; r++) {
            P[(r * ng + g) * NP + q] = reduce8_at(S[r]);
            if (min_k) {
                MP[(r * ng + g) * NP + q] = reduce8_at(SM[r]);
            }
        }
    }
}

QV_INLINE __m256 halves8(const uint16_t *h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
}

/* 8 MXFP4 scales from their E8M0 bytes (one per uint16), each the float
 * kg_mxfp4_scale gives: 2^(e - 128), the subnormals 0x00200000 << e below
 * e = 2, else the exponent field e - 1. */
QV_INLINE __m256 e8m0_halves8(const uint16_t *h) {
    const __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)h));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, is_normal));
}

QV_INLINE void fused_phase2_t(const int e8m0,
                              const int off,
                              const cpu_qtraits_t *tr,
                              const cpu_qact_t *a,
                              const fused_buf_t *fb,
                              float *c,
                              int64_t ldc,
                              int nc) {
    const int64_t k = a->k, m = a->m, nb = k / tr->blk, ng = (nb + 7) / 8;
    for (int64_t r = 0; r < m; r++) {
        __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m256i t[8], tm[8];
#pragma GCC unroll 8
            for (int q = 0; q < NP; q++) {
                t[q] = _mm256_load_si256(fb->p + (r * ng + g) * NP + q);
            }
            transpose8(t); /* t[jb]: block 8g + jb of each weight row */
            if (tr->min_k) {
#pragma GCC unroll 8
                for (int q = 0; q < NP; q++) {
                    tm[q] = _mm256_load_si256(fb->mp + (r * ng + g) * NP + q);
                }
                transpose8(tm);
            }
            const int nj = nb - g * 8 < 8 ? (int)(nb - g * 8) : 8;
            for (int jb = 0; jb < nj; jb++) {
                const int64_t b = g * 8 + jb;
                __m256i isum = t[jb];
                if (off) { /* the offset weights' extra off * sum(a) (blk32_offset) */
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * a->sums[b * m + r]));
                }
                const __m256 da = _mm256_broadcast_ss(a->d + b * m + r);
                const __m256 dw = e8m0 ? e8m0_halves8(fb->d + b * NP) : halves8(fb->d + b * NP);
                const __m256 dd = _mm256_mul_ps(dw, da);
                acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
                if (tr->min_m) {
                    macc = _mm256_fmadd_ps(halves8(fb->dm + b * NP),
                                           _mm256_broadcast_ss(a->s + b * m + r), macc);
                } else if (tr->min_k) {
                    const __m256i msum = tm[jb];
                    const __m256 dm = _mm256_mul_ps(halves8(fb->dm + b * NP), da);
                    macc = _mm256_fmadd_ps(_mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)),
                                           _mm256_cvtepi32_ps(msum), macc);
                }
            }
        }
        const __m256 res = tr->min_m || tr->min_k ? _mm256_add_ps(acc, macc) : acc;
        float out[8];
        _mm256_storeu_ps(out, res);
        for (int q = 0; q < nc; q++) {
            c[r * ldc + q] = out[q];
        }
    }
}

/* Phase 2 with the block scales stored as fp16 (every type but MXFP4) or
 * as E8M0 bytes (MXFP4). */
static void fused_phase2(const cpu_qtraits_t *tr,
                         const int off,
                         const cpu_qact_t *a,
                         const fused_buf_t *fb,
                         float *c,
                         int64_t ldc,
                         int nc) {
    if (tr->type == KG_GGML_TYPE_MXFP4) {
        fused_phase2_t(1, off, tr, a, fb, c, ldc, nc);
    } else {
        fused_phase2_t(0, off, tr, a, fb, c, ldc, nc);
    }
}

typedef void (*fused_fn)(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb);

#define DEF_FUSED(NAME, TYPE, BLK)                                                                 \
    static void NAME(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) {        \
        fused_phase1(0, TYPE, BLK, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_vnni(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(1, TYPE, BLK, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_evex(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(2, TYPE, BLK, x, q, a, fb);                                                   \
    }
DEF_FUSED(fused_q4_0, KG_GGML_TYPE_Q4_0, 32)
DEF_FUSED(fused_q4_1, KG_GGML_TYPE_Q4_1, 32)
DEF_FUSED(fused_q5_0, KG_GGML_TYPE_Q5_0, 32)
DEF_FUSED(fused_q5_1, KG_GGML_TYPE_Q5_1, 32)
DEF_FUSED(fused_q8_0, KG_GGML_TYPE_Q8_0, 32)
DEF_FUSED(fused_iq4_nl, KG_GGML_TYPE_IQ4_NL, 32)
DEF_FUSED(fused_mxfp4, KG_GGML_TYPE_MXFP4, 32)

#define DEF_FUSED_K(NAME, TYPE)                                                                    \
    static void NAME(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) {        \
        fused_phase1(0, TYPE, 256, x, q, a, fb);                                                   \
    }
DEF_FUSED_K(fused_q2_k, KG_GGML_TYPE_Q2_K)
DEF_FUSED_K(fused_q3_k, KG_GGML_TYPE_Q3_K)
DEF_FUSED_K(fused_q4_k, KG_GGML_TYPE_Q4_K)
DEF_FUSED_K(fused_q5_k, KG_GGML_TYPE_Q5_K)
DEF_FUSED_K(fused_q6_k, KG_GGML_TYPE_Q6_K)
DEF_FUSED_K(fused_iq4_xs, KG_GGML_TYPE_IQ4_XS)

static fused_fn fused_for(kg_ggml_type_t type, int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return vnni == 2 ? fused_q4_0_evex : vnni ? fused_q4_0_vnni : fused_q4_0;
    case KG_GGML_TYPE_Q4_1:
        return vnni == 2 ? fused_q4_1_evex : vnni ? fused_q4_1_vnni : fused_q4_1;
    case KG_GGML_TYPE_Q5_0:
        return vnni == 2 ? fused_q5_0_evex : vnni ? fused_q5_0_vnni : fused_q5_0;
    case KG_GGML_TYPE_Q5_1:
        return vnni == 2 ? fused_q5_1_evex : vnni ? fused_q5_1_vnni : fused_q5_1;
    case KG_GGML_TYPE_Q8_0:
        return vnni == 2 ? fused_q8_0_evex : vnni ? fused_q8_0_vnni : fused_q8_0;
    case KG_GGML_TYPE_IQ4_NL:
        return vnni == 2 ? fused_iq4_nl_evex : vnni ? fused_iq4_nl_vnni : fused_iq4_nl;
    case KG_GGML_TYPE_MXFP4:
        return vnni == 2 ? fused_mxfp4_evex : vnni ? fused_mxfp4_vnni : fused_mxfp4;
    case KG_GGML_TYPE_Q2_K:
        return fused_q2_k;
    case KG_GGML_TYPE_Q3_K:
        return fused_q3_k;
    case KG_GGML_TYPE_Q4_K:
        return fused_q4_k;
    case KG_GGML_TYPE_Q5_K:
        return fused_q5_k;
    case KG_GGML_TYPE_Q6_K:
        return fused_q6_k;
    case KG_GGML_TYPE_IQ4_XS:
        return fused_iq4_xs;
    default:
        return NULL;
    }
}

typedef void (*qtile_fn)(const cpu_qpanel_t *p,
                         int col0,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc);

#define DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, RM, RN)                             \
    static void NAME##_##RM##x##RN(const cpu_qpanel_t *p, int col0, const cpu_qact_t *a,           \
                                   int64_t i0, float *c, int64_t ldc, int nc) {                    \
        tile_avx2(OFFS, NONNEG, SCALED, MINM, MINK, BLK, RM, RN, p, col0, a, i0, c, ldc, nc);      \
    }
#define DEF_QTILES(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK)                                    \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 1, 8)                                   \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 2, 4)                                   \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 4, 2)                                   \
    static const qtile_fn NAME[3] = {NAME##_1x8, NAME##_2x4, NAME##_4x2};

/* the shapes of dot product (cpu_qtraits), for the AVX2 kernels; with
 * vpdpbusd the interleaved panels' tiles (tile_vnni) take their place */
DEF_QTILES(tiles_sym32, 0, 0, 0, 0, 0, 32) /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 */
DEF_QTILES(tiles_min32, 0, 1, 0, 1, 0, 32) /* Q4_1, Q5_1 */
DEF_QTILES(tiles_mink, 0, 1, 1, 0, 1, 256) /* Q2_K, Q4_K, Q5_K */
DEF_QTILES(tiles_q3k, 4, 1, 1, 0, 0, 256)  /* Q3_K */
DEF_QTILES(tiles_q6k, 32, 1, 1, 0, 0, 256) /* Q6_K */
DEF_QTILES(tiles_symk, 0, 0, 1, 0, 0, 256) /* IQ4_XS */

static const qtile_fn *tiles_for(const cpu_qtraits_t *tr) {
    if (tr->blk == 32) {
        return tr->min_m ? tiles_min32 : tiles_sym32;
    }
    return tr->min_k          ? tiles_mink
           : tr->offset == 4  ? tiles_q3k
           : tr->offset == 32 ? tiles_q6k
                              : tiles_symk;
}
#endif

// ---- AVX-VNNI prefill tiles on interleaved panels ----
#ifdef VECDOT_AVX2

/* With vpdpbusd a GEMM needs no horizontal sums: lay 4 consecutive values
 * of the panel's 8 rows side by side (32 bytes), broadcast 4 activation
 * bytes, and one instruction adds 4 products to each of the 8 outputs.
 * The activations go in as a + 128 (unsigned) and the weights as their
 * signed values; the panel's corr takes the 128 back off. Every integer is
 * the same as in the other kernels, so every output is the same bits. */

/* Build wi, sci, mini and corr of an unpacked panel. */
QV_INLINE void interleave_panel_t(const int vnni, const cpu_qtraits_t *tr, cpu_qpanel_t *p) {
    const int64_t k = p->k;
    const __m256i off = _mm256_set1_epi8((char)tr->offset), ones = _mm256_set1_epi8(1);
    for (int64_t c = 0; c < k / 32; c++) {
        __m256i r[8];
        for (int col = 0; col < NP; col++) {
            r[col] = _mm256_load_si256((const __m256i *)(const void *)(p->w + col * k + 32 * c));
            r[col] = _mm256_sub_epi8(r[col], off); /* the signed value */
        }
        transpose8(r);
        for (int g = 0; g < 8; g++) {
            _mm256_store_si256((__m256i *)(void *)(p->wi + (c * 8 + g) * 32), r[g]);
        }
    }
    if (tr->scaled) {
        for (int64_t s16 = 0; s16 < k / 16; s16++) {
            for (int col = 0; col < NP; col++) {
                const uint32_t pr = p->sc[col * (k / 32) + s16 / 2];
                p->sci[s16 * NP + col] = (int16_t)(uint16_t)(s16 % 2 ? pr >> 16 : pr);
            }
        }
    }
    if (tr->min_k) {
        for (int64_t jp = 0; jp < k / 32; jp++) {
            for (int col = 0; col < NP; col++) {
                const int16_t *mn = p->mins + col * (k / 16) + 2 * jp;
                p->mini[jp * NP + col] = (uint32_t)(uint16_t)mn[0] | (uint32_t)(uint16_t)mn[1]
                                                                         << 16;
            }
        }
    }
    /* corr = -128 * sum sc * w per block, from the interleaved values */
    const int blk = tr->blk,
              sub = tr->scaled ? (tr->offset || tr->type == KG_GGML_TYPE_Q2_K ? 16 : 32) : 32;
    for (int64_t b = 0; b < k / blk; b++) {
        __m256i sum = _mm256_setzero_si256();
        for (int64_t s0 = 0; s0 < blk; s0 += sub) {
            __m256i t = _mm256_setzero_si256();
            for (int64_t g = (b * blk + s0) / 4; g < (b * blk + s0 + sub) / 4; g++) {
                t = dpbusd(vnni, t, ones,
                           _mm256_load_si256((const __m256i *)(const void *)(p->wi + g * 32)));
            }
            if (tr->scaled) {
                const __m256i scv = _mm256_load_si256(
                    (const __m256i *)(const void *)(p->sci + ((b * blk + s0) / 16) * NP));
                t = _mm256_mullo_epi32(t, scv);
            }
            sum = _mm256_add_epi32(sum, t);
        }
        _mm256_store_si256((__m256i *)(void *)(p->corr + b * NP),
                           _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    }
}

/* The interleaved panel of 32-block types straight from the file's
 * blocks (one pass: no row-wise panel in between): wi, corr, d and m. */
QV_INLINE void interleave_blk32(const int vnni,
                                const kg_ggml_type_t type,
                                const uint8_t *rows,
                                size_t row_size,
                                int n_rows,
                                cpu_qpanel_t *p) {
    const int64_t k = p->k;
    const size_t bs = blk32_size(type);
    const int min_m = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < k / 32; b++) {
        __m256i r[8];
#pragma GCC unroll 8
        for (int col = 0; col < NP; col++) {
            if (col < n_rows) {
                const uint8_t *x = rows + (size_t)col * row_size + (size_t)b * bs;
                r[col] = w_blk32(type, x);
                uint16_t h;
                memcpy(&h, x, 2);
                p->d[b * NP + col] =
                    type == KG_GGML_TYPE_MXFP4 ? kg_mxfp4_scale(x[0]) : _cvtsh_ss(h);
                if (min_m) {
                    memcpy(&h, x + 2, 2);
                    p->dm[b * NP + col] = _cvtsh_ss(h);
                }
            } else {
                r[col] = _mm256_setzero_si256();
                p->d[b * NP + col] = 0.0f;
                p->dm[b * NP + col] = 0.0f;
            }
        }
        transpose8(r);
        __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            _mm256_store_si256((__m256i *)(void *)(p->wi + (b * 8 + g) * 32), r[g]);
            sum = dpbusd(vnni, sum, ones, r[g]);
        }
        _mm256_store_si256((__m256i *)(void *)(p->corr + b * NP),
                           _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    }
}

static void interleave_panel(const int vnni, const cpu_qtraits_t *tr, cpu_qpanel_t *p) {
    if (vnni == 2) {
        interleave_panel_t(2, tr, p);
    } else {
        interleave_panel_t(1, tr, p);
    }
}

#define DEF_IL32(NAME, TYPE)                                                                       \
    static void NAME(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p) {          \
        interleave_blk32(1, TYPE, rows, row_size, n_rows, p);                                      \
    }                                                                                              \
    static void NAME##_evex(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p) {   \
        interleave_blk32(2, TYPE, rows, row_size, n_rows, p);                                      \
    }
DEF_IL32(il_q4_0, KG_GGML_TYPE_Q4_0)
DEF_IL32(il_q4_1, KG_GGML_TYPE_Q4_1)
DEF_IL32(il_q5_0, KG_GGML_TYPE_Q5_0)
DEF_IL32(il_q5_1, KG_GGML_TYPE_Q5_1)
DEF_IL32(il_q8_0, KG_GGML_TYPE_Q8_0)
DEF_IL32(il_iq4_nl, KG_GGML_TYPE_IQ4_NL)
DEF_IL32(il_mxfp4, KG_GGML_TYPE_MXFP4)

typedef void (*il_fn)(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p);

static il_fn il_for(kg_ggml_type_t type, int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return vnni == 2 ? il_q4_0_evex : il_q4_0;
    case KG_GGML_TYPE_Q4_1:
        return vnni == 2 ? il_q4_1_evex : il_q4_1;
    case KG_GGML_TYPE_Q5_0:
        return vnni == 2 ? il_q5_0_evex : il_q5_0;
    case KG_GGML_TYPE_Q5_1:
        return vnni == 2 ? il_q5_1_evex : il_q5_1;
    case KG_GGML_TYPE_Q8_0:
        return vnni == 2 ? il_q8_0_evex : il_q8_0;
    case KG_GGML_TYPE_IQ4_NL:
        return vnni == 2 ? il_iq4_nl_evex : il_iq4_nl;
    case KG_GGML_TYPE_MXFP4:
        return vnni == 2 ? il_mxfp4_evex : il_mxfp4;
    default:
        return NULL;
    }
}

QV_INLINE __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

QV_INLINE void tile_vnni(const int vnni,
                         const int RM,
                         const int blk,
                         const int scaled,
                         const int sub16,
                         const int min_m,
                         const int min_k,
                         const cpu_qpanel_t *p,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc) {
    const int64_t k = p->k, m = a->m, nb = k / blk;
    __m256 acc[4], macc[4];
    const uint8_t *au[4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        acc[r] = macc[r] = _mm256_setzero_ps();
        au[r] = a->qu + (i0 + r) * k;
    }
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[4];
        const __m256i corr = _mm256_load_si256((const __m256i *)(const void *)(p->corr + b * NP));
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            isum[r] = corr;
        }
        if (!scaled) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const int64_t ga = b * 8 + g;
                const __m256i w =
                    _mm256_load_si256((const __m256i *)(const void *)(p->wi + ga * 32));
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    isum[r] = dpbusd(vnni, isum[r], bcast4(au[r] + 4 * ga), w);
                }
            }
        } else {
            const int sub = sub16 ? 16 : 32, nsub = 256 / sub, gps = sub / 4;
#pragma GCC unroll 16
            for (int sb = 0; sb < nsub; sb++) {
                __m256i t[4];
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    t[r] = _mm256_setzero_si256();
                }
#pragma GCC unroll 8
                for (int gg = 0; gg < gps; gg++) {
                    const int64_t ga = b * 64 + sb * gps + gg;
                    const __m256i w =
                        _mm256_load_si256((const __m256i *)(const void *)(p->wi + ga * 32));
#pragma GCC unroll 4
                    for (int r = 0; r < RM; r++) {
                        t[r] = dpbusd(vnni, t[r], bcast4(au[r] + 4 * ga), w);
                    }
                }
                const __m256i scv = _mm256_load_si256(
                    (const __m256i *)(const void *)(p->sci + (b * 16 + sb * (sub / 16)) * NP));
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(t[r], scv));
                }
            }
        }
        const __m256 dw = _mm256_load_ps(p->d + b * NP);
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const __m256 da = _mm256_broadcast_ss(a->d + b * m + i0 + r);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            if (min_m) {
                macc[r] = _mm256_fmadd_ps(_mm256_load_ps(p->dm + b * NP),
                                          _mm256_broadcast_ss(a->s + b * m + i0 + r), macc[r]);
            }
            if (min_k) {
                __m256i msum = _mm256_setzero_si256();
                const int16_t *bs = a->bsums + (i0 + r) * (k / 16) + 16 * b;
#pragma GCC unroll 8
                for (int jp = 0; jp < 8; jp++) {
                    const __m256i mn = _mm256_load_si256(
                        (const __m256i *)(const void *)(p->mini + (b * 8 + jp) * NP));
                    msum = _mm256_add_epi32(
                        msum, _mm256_madd_epi16(mn, bcast4((const uint8_t *)(bs + 2 * jp))));
                }
                const __m256 dm = _mm256_mul_ps(_mm256_load_ps(p->dm + b * NP), da);
                macc[r] = _mm256_fmadd_ps(_mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)),
                                          _mm256_cvtepi32_ps(msum), macc[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        const __m256 res = min_m || min_k ? _mm256_add_ps(acc[r], macc[r]) : acc[r];
        float out[8];
        _mm256_storeu_ps(out, res);
        for (int q = 0; q < nc; q++) {
            c[r * ldc + q] = out[q];
        }
    }
}

typedef void (*vtile_fn)(
    const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0, float *c, int64_t ldc, int nc);

#define DEF_VTILE(NAME, RM, BLK, SCALED, SUB16, MINM, MINK)                                        \
    static void NAME##_##RM(const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0, float *c,      \
                            int64_t ldc, int nc) {                                                 \
        tile_vnni(1, RM, BLK, SCALED, SUB16, MINM, MINK, p, a, i0, c, ldc, nc);                    \
    }                                                                                              \
    static void NAME##_##RM##_evex(const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0,         \
                                   float *c, int64_t ldc, int nc) {                                \
        tile_vnni(2, RM, BLK, SCALED, SUB16, MINM, MINK, p, a, i0, c, ldc, nc);                    \
    }
/* NAME[vnni - 1]: the 1-, 2- and 4-row tiles with vpdpbusd's VEX or EVEX form */
#define DEF_VTILES(NAME, BLK, SCALED, SUB16, MINM, MINK)                                           \
    DEF_VTILE(NAME, 1, BLK, SCALED, SUB16, MINM, MINK)                                             \
    DEF_VTILE(NAME, 2, BLK, SCALED, SUB16, MINM, MINK)                                             \
    DEF_VTILE(NAME, 4, BLK, SCALED, SUB16, MINM, MINK)                                             \
    static const vtile_fn NAME[2][3] = {{NAME##_1, NAME##_2, NAME##_4},                            \
                                        {NAME##_1_evex, NAME##_2_evex, NAME##_4_evex}};

DEF_VTILES(vtiles_32, 32, 0, 0, 0, 0)    /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 */
DEF_VTILES(vtiles_32m, 32, 0, 0, 1, 0)   /* Q4_1, Q5_1 */
DEF_VTILES(vtiles_k32, 256, 1, 0, 0, 0)  /* IQ4_XS */
DEF_VTILES(vtiles_k32m, 256, 1, 0, 0, 1) /* Q4_K, Q5_K */
DEF_VTILES(vtiles_k16, 256, 1, 1, 0, 0)  /* Q3_K, Q6_K */
DEF_VTILES(vtiles_k16m, 256, 1, 1, 0, 1) /* Q2_K */

static const vtile_fn *vtiles_for(const cpu_qtraits_t *tr, int vnni) {
    if (tr->blk == 32) {
        return tr->min_m ? vtiles_32m[vnni - 1] : vtiles_32[vnni - 1];
    }
    const bool sub16 = tr->offset != 0 || tr->type == KG_GGML_TYPE_Q2_K;
    if (sub16) {
        return tr->min_k ? vtiles_k16m[vnni - 1] : vtiles_k16[vnni - 1];
    }
    return tr->min_k ? vtiles_k32m[vnni - 1] : vtiles_k32[vnni - 1];
}
#endif

// ---- driver ----

/* Rows [i1, i2) of a against one unpacked panel (its first nc rows valid):
 * c[i * ldc + j] for the panel's columns. */
static void panel_rows(const cpu_qtraits_t *tr,
                       const cpu_qpanel_t *p,
                       int nc,
                       const cpu_qact_t *a,
                       int64_t i1,
                       int64_t i2,
                       float *c,
                       int64_t ldc) {
#ifdef VECDOT_AVX2
    if (vnni_in_use()) {
        const vtile_fn *t = vtiles_for(tr, vnni_in_use());
        int64_t i = i1;
        for (; i + 4 <= i2; i += 4) {
            t[2](p, a, i, c + i * ldc, ldc, nc);
        }
        for (; i + 2 <= i2; i += 2) {
            t[1](p, a, i, c + i * ldc, ldc, nc);
        }
        for (; i < i2; i++) {
            t[0](p, a, i, c + i * ldc, ldc, nc);
        }
        return;
    }
    if (kernel_in_use() > 0) {
        const qtile_fn *t = tiles_for(tr);
        int64_t i = i1;
        for (; i + 4 <= i2; i += 4) {
            for (int col0 = 0; col0 < NP && col0 < nc; col0 += 2) {
                t[2](p, col0, a, i, c + i * ldc + col0, ldc, nc);
            }
        }
        for (; i + 2 <= i2; i += 2) {
            for (int col0 = 0; col0 < NP && col0 < nc; col0 += 4) {
                t[1](p, col0, a, i, c + i * ldc + col0, ldc, nc);
            }
        }
        for (; i < i2; i++) {
            t[0](p, 0, a, i, c + i * ldc, ldc, nc);
        }
        return;
    }
#endif
    for (int64_t i = i1; i < i2; i++) {
        tile_scalar(tr, p, 0, NP, a, i, 1, c + i * ldc, ldc, nc);
    }
}

typedef struct qgemm_job {
    cpu_qgemm_scratch_t *scratch;
    const cpu_qact_t *a;
    int n_w;
    const cpu_qmat_t *const *w;
    float *const *c;
    int64_t panels_per_task;
    int64_t first_task[CPU_QGEMM_MAX_W + 1]; /* tasks of w[i]: [first_task[i], first_task[i+1]) */
} qgemm_job_t;

static void qgemm_task(void *arg, int64_t task, int thread) {
    const qgemm_job_t *j = arg;
    int wi = 0;
    while (task >= j->first_task[wi + 1]) {
        wi++;
    }
    const cpu_qmat_t *w = j->w[wi];
    const cpu_qact_t *a = j->a;
    float *c = j->c[wi];
    const int64_t n_panels = (w->n + NP - 1) / NP;
    const int64_t p0 = (task - j->first_task[wi]) * j->panels_per_task;
    const int64_t p1 = p0 + j->panels_per_task < n_panels ? p0 + j->panels_per_task : n_panels;
#ifdef VECDOT_AVX2
    if (a->m < (w->tr->blk == 32 ? FUSED_MAX_ROWS_32 : FUSED_MAX_ROWS_K) && kernel_in_use() > 0) {
        /* decode: the blocks are met in place, in two phases (see fused_phase1) */
        const fused_fn f = fused_for(w->tr->type, vnni_in_use());
        const int off = w->tr->blk == 32 ? blk32_offset(w->tr->type, vnni_in_use()) : 0;
        const int64_t nb = w->k / w->tr->blk, ng = (nb + 7) / 8;
        char *mem = j->scratch->mem + (size_t)thread * TASK_PANELS * j->scratch->panel_size;
        fused_buf_t fb;
        fb.p = (__m256i *)(void *)mem;
        fb.mp = fb.p + a->m * ng * NP;
        fb.d = (uint16_t *)(void *)(fb.mp + (w->tr->min_k ? a->m * ng * NP : 0));
        fb.dm = fb.d + nb * NP;
        for (int64_t p = p0; p < p1; p++) {
            const int64_t r0 = p * NP;
            const int nc = (int)(w->n - r0 < NP ? w->n - r0 : NP);
            for (int q = 0; q < NP; q++) {
                /* missing rows of the last panel repeat the first: computed, not stored */
                f((const uint8_t *)w->data + (size_t)(r0 + (q < nc ? q : 0)) * w->row_size, q, a,
                  &fb);
            }
            fused_phase2(w->tr, off, a, &fb, c + r0, w->n, nc);
        }
        return;
    }
#endif
    char *mem = j->scratch->mem + (size_t)thread * TASK_PANELS * j->scratch->panel_size;
    cpu_qpanel_t panels[TASK_PANELS];
    int ncs[TASK_PANELS];
    for (int64_t p = p0; p < p1; p++) {
        cpu_qpanel_t *pp = &panels[p - p0];
        cpu_qpanel_init(pp, mem + (size_t)(p - p0) * j->scratch->panel_size, w->k);
        const int64_t r0 = p * NP;
        ncs[p - p0] = (int)(w->n - r0 < NP ? w->n - r0 : NP);
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * w->row_size;
#ifdef VECDOT_AVX2
        if (vnni_in_use() && w->tr->blk == 32) {
            il_for(w->tr->type, vnni_in_use())(src, w->row_size, ncs[p - p0], pp);
            continue;
        }
#endif
        cpu_quant_unpack(w->tr, src, w->row_size, ncs[p - p0], pp);
#ifdef VECDOT_AVX2
        if (vnni_in_use()) {
            interleave_panel(vnni_in_use(), w->tr, pp);
        }
#endif
    }
    for (int64_t i1 = 0; i1 < a->m; i1 += MC) {
        const int64_t i2 = i1 + MC < a->m ? i1 + MC : a->m;
        for (int64_t p = p0; p < p1; p++) {
            panel_rows(w->tr, &panels[p - p0], ncs[p - p0], a, i1, i2, c + p * NP, w->n);
        }
    }
}

static void qgemm_run(struct kg_pool *pool,
                      int thread,
                      cpu_qgemm_scratch_t *scratch,
                      const cpu_qact_t *a,
                      int n_w,
                      const cpu_qmat_t *const *w,
                      float *const *c) {
    KG_ASSERT(n_w >= 1 && n_w <= CPU_QGEMM_MAX_W);
    qgemm_job_t j = {.scratch = scratch, .a = a, .n_w = n_w, .w = w, .c = c};
    int64_t n_panels = 0;
    double macs = 0.0, bytes = 0.0;
    for (int i = 0; i < n_w; i++) {
        KG_ASSERT(w[i]->k == a->k && w[i]->k <= scratch->max_k && w[i]->tr->act == a->kind);
        n_panels += (w[i]->n + NP - 1) / NP;
        macs += (double)a->m * (double)w[i]->n * (double)w[i]->k;
        bytes += (double)w[i]->n * (double)w[i]->row_size;
    }
    if (a->m <= 0 || n_panels == 0) {
        return;
    }
    const int n_threads = pool ? kg_pool_n_threads(pool) : 1;
    const bool serial = n_threads == 1 || (macs < INLINE_MACS && bytes < INLINE_BYTES);
    const int64_t cap = a->m <= 16 ? TASK_PANELS_DECODE : TASK_PANELS;
    const int64_t nt = serial ? 1 : n_threads;
    /* tasks of at most cap panels, about a multiple of the thread count */
    const int64_t n_tasks = nt * ((n_panels + nt * cap - 1) / (nt * cap));
    j.panels_per_task = (n_panels + n_tasks - 1) / n_tasks;
    for (int i = 0; i < n_w; i++) {
        const int64_t np = (w[i]->n + NP - 1) / NP;
        j.first_task[i + 1] = j.first_task[i] + (np + j.panels_per_task - 1) / j.panels_per_task;
    }
    if (serial) {
        for (int64_t t = 0; t < j.first_task[n_w]; t++) {
            qgemm_task(&j, t, thread);
        }
        return;
    }
    kg_pool_run(pool, j.first_task[n_w], qgemm_task, &j);
}

void cpu_qgemm(struct kg_pool *pool,
               cpu_qgemm_scratch_t *scratch,
               const cpu_qact_t *a,
               int n_w,
               const cpu_qmat_t *const *w,
               float *const *c) {
    qgemm_run(pool, 0, scratch, a, n_w, w, c);
}

void cpu_qgemm_serial(cpu_qgemm_scratch_t *scratch,
                      int thread,
                      const cpu_qact_t *a,
                      int n_w,
                      const cpu_qmat_t *const *w,
                      float *const *c) {
    KG_ASSERT(thread >= 0 && thread < scratch->n_threads);
    qgemm_run(NULL, thread, scratch, a, n_w, w, c);
}

// ---- reference ----

float cpu_vecdot_ref(const cpu_qmat_t *w, int64_t j, const cpu_qact_t *a, int64_t i) {
    cpu_qpanel_t p;
    void *mem = aligned_alloc(64, (cpu_qpanel_size(w->k) + 63) & ~(size_t)63);
    KG_ASSERT(mem != NULL);
    cpu_qpanel_init(&p, mem, w->k);
    cpu_quant_unpack(w->tr, (const char *)w->data + (size_t)j * w->row_size, w->row_size, 1, &p);
    float out;
    tile_scalar(w->tr, &p, 0, 1, a, i, 1, &out, 1, 1);
    free(mem);
    return out;
}
