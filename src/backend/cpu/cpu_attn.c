/* cpu_attn: one query head's attention over its paged fp16 KV rows (see
 * cpu_attn.h for the arithmetic every path keeps). */
#include "cpu_attn.h"

#include <math.h>
#include <string.h>

#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTN_AVX2 1
#endif

#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_ops.h"

/* Registers of output the value pass keeps at once (8 floats each): 64
 * output elements, one pass over the positions per 64. */
#define V_REGS 8

static inline const uint16_t *row_at(const cpu_kv_view_t *kv, const uint16_t *cache, int32_t p) {
    const int64_t row =
        (int64_t)kv->table[p / kv->block_size] * kv->block_size + p % kv->block_size;
    return cache + row * kv->stride + kv->offset;
}

#ifdef ATTN_AVX2
/* Eight fp16 values widened to F32 (exact). */
static inline __m256 load_h8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline float hsum8(__m256 acc) {
    __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

/* The score arithmetic, one position: lanes, then lanes summed, then the
 * tail, then the scale. */
static float score_scalar(const float *q, const uint16_t *k, int32_t hd, float scale) {
    float sum = 0.0f;
    int32_t i = 0;
#ifdef ATTN_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= hd; i += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_h8(k + i), acc);
    }
    sum = hsum8(acc);
#endif
    for (; i < hd; i++) {
        sum += q[i] * kg_fp16_to_fp32(k[i]);
    }
    return sum * scale;
}

#ifdef ATTN_AVX2

/* Four positions at once: four independent chains hide the FMA latency a
 * single 8-step chain leaves exposed. hd is a multiple of 8. */
static void scores4(const float *q,
                    const uint16_t *k0,
                    const uint16_t *k1,
                    const uint16_t *k2,
                    const uint16_t *k3,
                    int32_t hd,
                    float scale,
                    float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int32_t i = 0; i < hd; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, load_h8(k0 + i), a0);
        a1 = _mm256_fmadd_ps(qv, load_h8(k1 + i), a1);
        a2 = _mm256_fmadd_ps(qv, load_h8(k2 + i), a2);
        a3 = _mm256_fmadd_ps(qv, load_h8(k3 + i), a3);
    }
    s[0] = hsum8(a0) * scale;
    s[1] = hsum8(a1) * scale;
    s[2] = hsum8(a2) * scale;
    s[3] = hsum8(a3) * scale;
}

/* out[c0 .. c0 + 8 nr) = sum over p of s[p] * V[p][c0 ..], the chains in
 * registers for the whole pass. */
static inline __attribute__((always_inline)) void values_chunk(const float *s,
                                                               const cpu_kv_view_t *kv,
                                                               int32_t p0,
                                                               int32_t n_pos,
                                                               int32_t c0,
                                                               int nr,
                                                               float *out) {
    __m256 acc[V_REGS];
    for (int r = 0; r < V_REGS; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    for (int32_t p = p0; p < n_pos; p++) {
        const uint16_t *v = row_at(kv, kv->v, p) + c0;
        const __m256 w = _mm256_set1_ps(s[p - p0]);
        for (int64_t r = 0; r < nr; r++) {
            acc[r] = _mm256_fmadd_ps(w, load_h8(v + 8 * r), acc[r]);
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        _mm256_storeu_ps(out + c0 + 8 * r, acc[r]);
    }
}
#endif

void cpu_attn_scores(const float *q,
                     const cpu_kv_view_t *kv,
                     int32_t p0,
                     int32_t n_pos,
                     int32_t hd,
                     float scale,
                     float softcap,
                     float *s) {
    /* soft-capping works on the raw dot products; x * 1.0f is exact */
    const float sc = softcap > 0.0f ? 1.0f : scale;
    int32_t p = p0;
#ifdef ATTN_AVX2
    if (hd % 8 == 0) {
        for (; p + 4 <= n_pos; p += 4) {
            scores4(q, row_at(kv, kv->k, p), row_at(kv, kv->k, p + 1), row_at(kv, kv->k, p + 2),
                    row_at(kv, kv->k, p + 3), hd, sc, s + (p - p0));
        }
    }
#endif
    for (; p < n_pos; p++) {
        s[p - p0] = score_scalar(q, row_at(kv, kv->k, p), hd, sc);
    }
    if (softcap > 0.0f) {
        for (p = 0; p < n_pos - p0; p++) {
            s[p] = kg_softcap(s[p], softcap) * scale;
        }
    }
}

void cpu_attn_head(const float *q,
                   const cpu_kv_view_t *kv,
                   int32_t p0,
                   int32_t n_pos,
                   int32_t hd,
                   float scale,
                   float softcap,
                   float *s,
                   float *out) {
    cpu_attn_head_sink(q, kv, p0, n_pos, hd, scale, softcap, -INFINITY, s, out);
}

/* The head's attention with hd_k dims of q·K and hd_v dims of values
 * (equal but for MLA, whose values are the first hd_v dims of the rows the
 * scores read). */
static void attn_head(const float *q,
                      const cpu_kv_view_t *kv,
                      int32_t p0,
                      int32_t n_pos,
                      int32_t hd_k,
                      int32_t hd,
                      float scale,
                      float softcap,
                      float sink,
                      float *s,
                      float *out) {
    int32_t p;
    const int32_t n = n_pos - p0; /* visible positions; s[i] belongs to position p0 + i */
    cpu_attn_scores(q, kv, p0, n_pos, hd_k, scale, softcap, s);
    float m = -INFINITY;
    for (p = 0; p < n; p++) {
        m = fmaxf(m, s[p]);
    }
    m = sink > m ? sink : m; /* the sink takes part in the max */
    double sum = 0.0;
    for (p = 0; p < n; p++) {
        s[p] = expf(s[p] - m);
        sum += (double)s[p];
    }
    /* ... and in the sum, after the positions (ggml's soft_max with sinks);
     * without a sink it adds exp(-inf) = 0, which changes nothing */
    sum += (double)expf(sink - m);
    const float inv = (float)(1.0 / sum);
    for (p = 0; p < n; p++) {
        s[p] *= inv;
    }
    cpu_round_fp16(s, n);

    int32_t c0 = 0;
#ifdef ATTN_AVX2
    for (; c0 + 8 <= hd; c0 += 8 * V_REGS) {
        /* constant register counts, so the chains stay in registers */
        switch ((hd - c0) / 8 < V_REGS ? (hd - c0) / 8 : V_REGS) {
        case 1:
            values_chunk(s, kv, p0, n_pos, c0, 1, out);
            break;
        case 2:
            values_chunk(s, kv, p0, n_pos, c0, 2, out);
            break;
        case 3:
            values_chunk(s, kv, p0, n_pos, c0, 3, out);
            break;
        case 4:
            values_chunk(s, kv, p0, n_pos, c0, 4, out);
            break;
        case 5:
            values_chunk(s, kv, p0, n_pos, c0, 5, out);
            break;
        case 6:
            values_chunk(s, kv, p0, n_pos, c0, 6, out);
            break;
        case 7:
            values_chunk(s, kv, p0, n_pos, c0, 7, out);
            break;
        default:
            values_chunk(s, kv, p0, n_pos, c0, 8, out);
            break;
        }
    }
    c0 = hd - hd % 8;
#endif
    /* the tail (and the portable path): the same chains, element by element */
    for (int32_t c = c0; c < hd; c++) {
        float acc = 0.0f;
        for (p = p0; p < n_pos; p++) {
            acc = fmaf(s[p - p0], kg_fp16_to_fp32(row_at(kv, kv->v, p)[c]), acc);
        }
        out[c] = acc;
    }
}

void cpu_attn_head_sink(const float *q,
                        const cpu_kv_view_t *kv,
                        int32_t p0,
                        int32_t n_pos,
                        int32_t hd,
                        float scale,
                        float softcap,
                        float sink,
                        float *s,
                        float *out) {
    attn_head(q, kv, p0, n_pos, hd, hd, scale, softcap, sink, s, out);
}

void cpu_attn_head_mla(const float *q,
                       const cpu_kv_view_t *kv,
                       int32_t n_pos,
                       int32_t hd_k,
                       int32_t hd_v,
                       float scale,
                       float *s,
                       float *out) {
    attn_head(q, kv, 0, n_pos, hd_k, hd_v, scale, 0.0f, -INFINITY, s, out);
}

const char *cpu_attn_kernel_name(void) {
#ifdef ATTN_AVX2
    return "avx2";
#else
    return "scalar";
#endif
}
