/* cpu_attn_flash: one query head's attention with ggml-cpu's flash
 * attention arithmetic (see cpu_attn_flash.h for what each kernel keeps). */
#include "cpu_attn_flash.h"

#include "../../model/kg_quant.h"
#include "cpu_expf.h"

#include <math.h>

#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FLASH_AVX2 1 /* the vector paths: the scalar loops' bits */
#endif

static inline const uint16_t *row_at(const cpu_kv_view_t *kv, const uint16_t *cache, int32_t p) {
    const int64_t row =
        (int64_t)kv->table[p / kv->block_size] * kv->block_size + p % kv->block_size;
    return cache + row * kv->stride + kv->offset;
}

/* fp16 rounding (to nearest even, as ggml's casts) */
static inline float round_h(float x) {
    return kg_fp16_to_fp32(kg_fp32_to_fp16(x));
}

#ifdef FLASH_AVX2
static inline __m256 load_h8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline __m256 round_h8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

/* How a score sums q · k: ggml_vec_dot_f16 below its SIMD step (the
 * one-chunk kernel: fp16 q, the products, exact in F32, summed one by one
 * in double) or the tiled kernel's GEMM (one F32 FMA chain). */
typedef enum { DOT_DOUBLE, DOT_FMA } dot_mode_t;

static inline __attribute__((always_inline)) float dot_one(const float *q,
                                                           const uint16_t *k,
                                                           int32_t d0,
                                                           int32_t hd,
                                                           dot_mode_t mode,
                                                           double dsum,
                                                           float fsum) {
    for (int32_t d = d0; d < hd; d++) {
        if (mode == DOT_DOUBLE) {
            dsum += (double)(q[d] * kg_fp16_to_fp32(k[d]));
        } else {
            fsum = fmaf(q[d], kg_fp16_to_fp32(k[d]), fsum);
        }
    }
    return mode == DOT_DOUBLE ? (float)dsum : fsum;
}

#ifdef FLASH_AVX2
/* r[j] = element j of eight rows r[0..8) (an 8x8 transpose) */
static inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* Dimensions d .. d+15 of eight rows into the eight lanes' sums, in
 * dimension order (dot_one's per lane): the fp16 words transposed (rows
 * in pairs, then fours, then all eight: register c_j holds dimension d + j
 * in its low half and d + 8 + j in its high half), each dimension's column
 * widened and consumed at once, so only the eight transposed registers
 * stay live (a column array of 16 went through the stack). */
static inline __attribute__((always_inline)) void chain16(const uint16_t *const k[8],
                                                          int32_t d,
                                                          const float *q,
                                                          dot_mode_t mode,
                                                          __m256 *acc,
                                                          __m256d *lo,
                                                          __m256d *hi) {
#define FLASH_LOAD(j) _mm256_loadu_si256((const __m256i *)(const void *)(k[j] + d))
    const __m256i r0 = FLASH_LOAD(0), r1 = FLASH_LOAD(1), r2 = FLASH_LOAD(2), r3 = FLASH_LOAD(3);
    const __m256i r4 = FLASH_LOAD(4), r5 = FLASH_LOAD(5), r6 = FLASH_LOAD(6), r7 = FLASH_LOAD(7);
#undef FLASH_LOAD
    const __m256i a0 = _mm256_unpacklo_epi16(r0, r1), a1 = _mm256_unpackhi_epi16(r0, r1);
    const __m256i a2 = _mm256_unpacklo_epi16(r2, r3), a3 = _mm256_unpackhi_epi16(r2, r3);
    const __m256i a4 = _mm256_unpacklo_epi16(r4, r5), a5 = _mm256_unpackhi_epi16(r4, r5);
    const __m256i a6 = _mm256_unpacklo_epi16(r6, r7), a7 = _mm256_unpackhi_epi16(r6, r7);
    const __m256i b0 = _mm256_unpacklo_epi32(a0, a2), b1 = _mm256_unpackhi_epi32(a0, a2);
    const __m256i b2 = _mm256_unpacklo_epi32(a1, a3), b3 = _mm256_unpackhi_epi32(a1, a3);
    const __m256i b4 = _mm256_unpacklo_epi32(a4, a6), b5 = _mm256_unpackhi_epi32(a4, a6);
    const __m256i b6 = _mm256_unpacklo_epi32(a5, a7), b7 = _mm256_unpackhi_epi32(a5, a7);
    const __m256i c0 = _mm256_unpacklo_epi64(b0, b4), c1 = _mm256_unpackhi_epi64(b0, b4);
    const __m256i c2 = _mm256_unpacklo_epi64(b1, b5), c3 = _mm256_unpackhi_epi64(b1, b5);
    const __m256i c4 = _mm256_unpacklo_epi64(b2, b6), c5 = _mm256_unpackhi_epi64(b2, b6);
    const __m256i c6 = _mm256_unpacklo_epi64(b3, b7), c7 = _mm256_unpackhi_epi64(b3, b7);
#define FLASH_COL(h, j)                                                                            \
    {                                                                                              \
        const __m256 col = _mm256_cvtph_ps(h);                                                     \
        const __m256 qv = _mm256_set1_ps(q[d + (j)]);                                              \
        if (mode == DOT_DOUBLE) {                                                                  \
            const __m256 pr = _mm256_mul_ps(col, qv);                                              \
            *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));                 \
            *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));               \
        } else {                                                                                   \
            *acc = _mm256_fmadd_ps(col, qv, *acc);                                                 \
        }                                                                                          \
    }
#define FLASH_LO(c, j) FLASH_COL(_mm256_castsi256_si128(c), j)
#define FLASH_HI(c, j) FLASH_COL(_mm256_extracti128_si256(c, 1), 8 + (j))
    // clang-format off
    FLASH_LO(c0, 0) FLASH_LO(c1, 1) FLASH_LO(c2, 2) FLASH_LO(c3, 3)
    FLASH_LO(c4, 4) FLASH_LO(c5, 5) FLASH_LO(c6, 6) FLASH_LO(c7, 7)
    FLASH_HI(c0, 0) FLASH_HI(c1, 1) FLASH_HI(c2, 2) FLASH_HI(c3, 3)
    FLASH_HI(c4, 4) FLASH_HI(c5, 5) FLASH_HI(c6, 6) FLASH_HI(c7, 7)
    // clang-format on
#undef FLASH_COL
#undef FLASH_LO
#undef FLASH_HI
}

/* Eight positions' scores side by side, a lane each: eight dimensions of
 * eight rows at a time, transposed so each lane's sum runs in dimension
 * order as dot_one's; the tail dimensions by dot_one. */
static void
dot8(const float *q, const uint16_t *const k[8], int32_t hd, dot_mode_t mode, float *s) {
    __m256 acc = _mm256_setzero_ps();
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int32_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        chain16(k, d, q, mode, &acc, &lo, &hi);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++) {
            r[j] = load_h8(k[j] + d);
        }
        transpose8(r);
        for (int j = 0; j < 8; j++) {
            const __m256 qv = _mm256_set1_ps(q[d + j]);
            if (mode == DOT_DOUBLE) {
                const __m256 pr = _mm256_mul_ps(r[j], qv);
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
            } else {
                acc = _mm256_fmadd_ps(r[j], qv, acc);
            }
        }
    }
    double ds[8];
    float fs[8];
    _mm256_storeu_pd(ds, lo);
    _mm256_storeu_pd(ds + 4, hi);
    _mm256_storeu_ps(fs, acc);
    for (int j = 0; j < 8; j++) {
        s[j] = dot_one(q, k[j], d, hd, mode, ds[j], fs[j]);
    }
}
#endif

#ifdef FLASH_AVX2
/* Registers of output a tile's value pass keeps at once (8 floats each). */
#define V_REGS 8

/* out[c0 .. c0 + 8 nr) += w[p - lo] * V[p][c0 ..] for p in [lo, hi), one
 * FMA chain per element in position order, held in registers over the
 * tile: accumulators written out one by one (macros), as compilers keep
 * an array of vectors in memory rather than unroll its loops. */
static inline __attribute__((always_inline)) void tile_values(const cpu_kv_view_t *kv,
                                                              int32_t lo,
                                                              int32_t hi,
                                                              const float *w,
                                                              int32_t c0,
                                                              int nr,
                                                              float *out) {
#define FLASH_X8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define FLASH_V_DECL(r)                                                                            \
    __m256 a##r = (r) < nr ? _mm256_loadu_ps(o + 8 * (int64_t)(r)) : _mm256_setzero_ps();
#define FLASH_V_FMA(r)                                                                             \
    if ((r) < nr) {                                                                                \
        a##r = _mm256_fmadd_ps(load_h8(v + 8 * (int64_t)(r)), wv, a##r);                           \
    }
#define FLASH_V_STORE(r)                                                                           \
    if ((r) < nr) {                                                                                \
        _mm256_storeu_ps(o + 8 * (int64_t)(r), a##r);                                              \
    }
    float *o = out + c0;
    FLASH_X8(FLASH_V_DECL)
    for (int32_t p = lo; p < hi; p++) {
        const uint16_t *v = row_at(kv, kv->v, p) + c0;
        const __m256 wv = _mm256_set1_ps(w[p - lo]);
        FLASH_X8(FLASH_V_FMA)
    }
    FLASH_X8(FLASH_V_STORE)
#undef FLASH_X8
#undef FLASH_V_DECL
#undef FLASH_V_FMA
#undef FLASH_V_STORE
}
#endif

#ifdef FLASH_AVX2
/* Thirty-two positions' scores (hd a multiple of 16): dot8's arithmetic
 * per lane, four groups of eight side by side, so that four independent
 * chains hide the FMA (or double add) latency one chain waits on. */
static inline __attribute__((always_inline)) void
dot32(const float *q, const uint16_t *const k[32], int32_t hd, dot_mode_t mode, float *s) {
#define DOT32_X4(X) X(0) X(1) X(2) X(3)
#define DOT32_DECL(g)                                                                              \
    __m256 acc##g = _mm256_setzero_ps();                                                           \
    __m256d lo##g = _mm256_setzero_pd(), hi##g = _mm256_setzero_pd();
#define DOT32_GROUP(g) chain16(k + 8 * (int64_t)(g), d, q, mode, &acc##g, &lo##g, &hi##g);
#define DOT32_STORE(g)                                                                             \
    if (mode == DOT_DOUBLE) {                                                                      \
        _mm_storeu_ps(s + 8 * (int64_t)(g), _mm256_cvtpd_ps(lo##g));                               \
        _mm_storeu_ps(s + 8 * (int64_t)(g) + 4, _mm256_cvtpd_ps(hi##g));                           \
    } else {                                                                                       \
        _mm256_storeu_ps(s + 8 * (int64_t)(g), acc##g);                                            \
    }
    DOT32_X4(DOT32_DECL)
    for (int32_t d = 0; d < hd; d += 16) {
        DOT32_X4(DOT32_GROUP)
    }
    DOT32_X4(DOT32_STORE)
#undef DOT32_X4
#undef DOT32_DECL
#undef DOT32_GROUP
#undef DOT32_STORE
}
#endif

/* s[p - p0] = q · K[p] for p in [p0, p1), summed as `mode` says. */
static inline __attribute__((always_inline)) void dots(const float *q,
                                                       const cpu_kv_view_t *kv,
                                                       int32_t p0,
                                                       int32_t p1,
                                                       int32_t hd,
                                                       dot_mode_t mode,
                                                       float *s) {
    int32_t p = p0;
#ifdef FLASH_AVX2
    for (; hd % 16 == 0 && p + 32 <= p1; p += 32) {
        const uint16_t *k[32];
        for (int j = 0; j < 32; j++) {
            k[j] = row_at(kv, kv->k, p + j);
        }
        dot32(q, k, hd, mode, s + (p - p0));
    }
    for (; p + 8 <= p1; p += 8) {
        const uint16_t *k[8];
        for (int j = 0; j < 8; j++) {
            k[j] = row_at(kv, kv->k, p + j);
        }
        dot8(q, k, hd, mode, s + (p - p0));
    }
    if (p < p1) {
        /* the last positions (under 8) in lanes of dot8 too, the spare
         * lanes repeating the last row: a lone chain of hd FMAs waits on
         * each one's latency */
        const uint16_t *k[8];
        float s8[8];
        const int32_t base = p;
        for (int j = 0; j < 8; j++) {
            k[j] = row_at(kv, kv->k, base + j < p1 ? base + j : p1 - 1);
        }
        dot8(q, k, hd, mode, s8);
        for (; p < p1; p++) {
            s[p - p0] = s8[p - base];
        }
    }
#endif
    for (; p < p1; p++) {
        s[p - p0] = dot_one(q, row_at(kv, kv->k, p), 0, hd, mode, 0.0, 0.0f);
    }
}

/* ggml's flash_attn_ext_f16_one_chunk for one query row (V in fp16); the
 * scores of CPU_FLASH_TILE positions at a time first, in scratch. */
static void one_chunk(const float *q,
                      const cpu_kv_view_t *kv,
                      int32_t p0,
                      int32_t n_pos,
                      int32_t hd,
                      float scale,
                      float softcap,
                      float *scratch,
                      float *out) {
    float *qh = scratch, *acc = scratch + hd, *dot = scratch + 2 * (int64_t)hd;
    for (int32_t d = 0; d < hd; d++) {
        qh[d] = round_h(q[d]);
        acc[d] = 0.0f;
    }
    float M = -INFINITY, S = 0.0f;
    for (int32_t p = p0; p < n_pos; p++) {
        const int32_t i = (p - p0) % CPU_FLASH_TILE;
        if (i == 0) {
            const int32_t n = n_pos - p < CPU_FLASH_TILE ? n_pos - p : CPU_FLASH_TILE;
            dots(qh, kv, p, p + n, hd, DOT_DOUBLE, dot);
        }
        float s = dot[i] * scale;
        if (softcap > 0.0f) {
            s = softcap * tanhf(s);
        }
        const uint16_t *vr = row_at(kv, kv->v, p);
        float ms = 1.0f, vs = 1.0f;
        const bool new_max = s > M;
        if (new_max) { /* ggml_vec_scale_f16 of the accumulator */
            const float m_old = M;
            M = s;
            ms = expf(m_old - M);
        } else {
            vs = expf(s - M);
        }
        int32_t d = 0;
#ifdef FLASH_AVX2
        const __m256 msv = _mm256_set1_ps(ms), vsv = _mm256_set1_ps(vs);
        for (; d + 8 <= hd; d += 8) {
            __m256 a = _mm256_loadu_ps(acc + d);
            if (new_max) {
                a = round_h8(_mm256_mul_ps(a, msv));
            }
            _mm256_storeu_ps(acc + d, round_h8(_mm256_fmadd_ps(load_h8(vr + d), vsv, a)));
        }
#endif
        for (; d < hd; d++) { /* ggml_vec_mad_f16: y = fp16(y + x * v), one FMA */
            const float a = new_max ? round_h(acc[d] * ms) : acc[d];
            acc[d] = round_h(fmaf(kg_fp16_to_fp32(vr[d]), vs, a));
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hd; d++) {
        out[d] = acc[d] * inv;
    }
}

/* ggml's flash_attn_ext_tiled for one query row: KV tiles of
 * CPU_FLASH_TILE positions from position 0 (llama.cpp's cache cells, which
 * are the positions for an input evaluated alone), the tile's softmax
 * ggml_vec_soft_max_f32's AVX2 form (cpu_softmax8_sum). sc: CPU_FLASH_TILE
 * floats of scratch. */
static void tiled(const float *q,
                  const cpu_kv_view_t *kv,
                  int32_t p0,
                  int32_t n_pos,
                  int32_t hd,
                  float scale,
                  float softcap,
                  float *sc,
                  float *out) {
    float M = -INFINITY, S = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        out[d] = 0.0f;
    }
    for (int32_t t0 = p0 / CPU_FLASH_TILE * CPU_FLASH_TILE; t0 < n_pos; t0 += CPU_FLASH_TILE) {
        const int32_t lo = t0 > p0 ? t0 : p0;
        const int32_t hi = n_pos - t0 < CPU_FLASH_TILE ? n_pos : t0 + CPU_FLASH_TILE;
        float tile_max = -INFINITY;
        dots(q, kv, lo, hi, hd, DOT_FMA, sc + (lo - t0));
        for (int32_t p = lo; p < hi; p++) {
            float a = sc[p - t0] * scale;
            if (softcap > 0.0f) {
                a = tanhf(a) * softcap;
            }
            sc[p - t0] = a;
            tile_max = a > tile_max ? a : tile_max;
        }
        if (tile_max == -INFINITY) {
            continue;
        }
        const float m_new = fmaxf(M, tile_max);
        if (m_new > M) {
            const float ms = expf(M - m_new);
            cpu_vec_scale_f32(out, hd, ms);
            S *= ms;
        }
        M = m_new;
        /* the tile's groups of 8 from t0 that hold [lo, hi), the positions
         * outside masked to -inf, as ggml's tile holds them (the groups
         * wholly outside add exact zeros: skipped) */
        const int32_t g0 = (lo - t0) / 8 * 8, g1 = (hi - t0 + 7) / 8 * 8;
        for (int32_t i = g0; i < lo - t0; i++) {
            sc[i] = -INFINITY;
        }
        for (int32_t i = hi - t0; i < g1; i++) {
            sc[i] = -INFINITY;
        }
        S = (float)((double)S + cpu_softmax8_sum(sc + g0, g1 - g0, M));
        int32_t c0 = 0;
#ifdef FLASH_AVX2
        for (; c0 + 8 <= hd; c0 += 8 * V_REGS) {
            /* constant register counts, so the chains stay in registers */
            switch ((hd - c0) / 8 < V_REGS ? (hd - c0) / 8 : V_REGS) {
            case 1:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 1, out);
                break;
            case 2:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 2, out);
                break;
            case 3:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 3, out);
                break;
            case 4:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 4, out);
                break;
            case 5:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 5, out);
                break;
            case 6:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 6, out);
                break;
            case 7:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 7, out);
                break;
            default:
                tile_values(kv, lo, hi, sc + (lo - t0), c0, 8, out);
                break;
            }
        }
        c0 = hd - hd % 8;
#endif
        for (int32_t d = c0; d < hd; d++) { /* each element one FMA chain in position order */
            for (int32_t p = lo; p < hi; p++) {
                out[d] = fmaf(kg_fp16_to_fp32(row_at(kv, kv->v, p)[d]), sc[p - t0], out[d]);
            }
        }
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hd; d++) {
        out[d] *= inv;
    }
}

void cpu_attn_head_flash(const float *q,
                         const cpu_kv_view_t *kv,
                         int32_t p0,
                         int32_t n_pos,
                         int32_t hd,
                         float scale,
                         float softcap,
                         bool is_tiled,
                         float *scratch,
                         float *out) {
    /* ggml divides the scale by the cap, then caps: cap * tanh(x * scale / cap) */
    const float sc = softcap > 0.0f ? scale / softcap : scale;
    if (is_tiled) {
        tiled(q, kv, p0, n_pos, hd, sc, softcap, scratch, out);
    } else {
        one_chunk(q, kv, p0, n_pos, hd, sc, softcap, scratch, out);
    }
}
