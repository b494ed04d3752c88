/* cpu_attn_flash: one query head's attention with ggml-cpu's flash
 * attention arithmetic (see cpu_attn_flash.h for what each kernel keeps). */
#include "cpu_attn_flash.h"

#include "../../model/kg_quant.h"

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

/* ggml_vec_dot_f16 below its SIMD step: the fp16 products (exact in F32)
 * summed one by one in double. qh: q's fp16 values. */
static float dot_h(const float *qh, const uint16_t *k, int32_t hd) {
    double dot = 0.0;
    int32_t d = 0;
#ifdef FLASH_AVX2
    for (; d + 8 <= hd; d += 8) {
        float pr[8];
        _mm256_storeu_ps(pr, _mm256_mul_ps(_mm256_loadu_ps(qh + d), load_h8(k + d)));
        for (int i = 0; i < 8; i++) {
            dot += (double)pr[i];
        }
    }
#endif
    for (; d < hd; d++) {
        dot += (double)(qh[d] * kg_fp16_to_fp32(k[d]));
    }
    return (float)dot;
}

/* ggml's flash_attn_ext_f16_one_chunk for one query row (V in fp16). */
static void one_chunk(const float *q,
                      const cpu_kv_view_t *kv,
                      int32_t p0,
                      int32_t n_pos,
                      int32_t hd,
                      float scale,
                      float softcap,
                      float *scratch,
                      float *out) {
    float *qh = scratch, *acc = scratch + hd;
    for (int32_t d = 0; d < hd; d++) {
        qh[d] = round_h(q[d]);
        acc[d] = 0.0f;
    }
    float M = -INFINITY, S = 0.0f;
    for (int32_t p = p0; p < n_pos; p++) {
        float s = dot_h(qh, row_at(kv, kv->k, p), hd) * scale;
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
 * are the positions for an input evaluated alone). sc: CPU_FLASH_TILE
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
        for (int32_t p = lo; p < hi; p++) {
            const uint16_t *k = row_at(kv, kv->k, p);
            float a = 0.0f;
            int32_t d = 0;
#ifdef FLASH_AVX2
            /* one chain per position: lanes hold successive dimensions'
             * products only to widen them; the adds stay in order */
            for (; d + 8 <= hd; d += 8) {
                float kf[8];
                _mm256_storeu_ps(kf, load_h8(k + d));
                for (int i = 0; i < 8; i++) {
                    a = fmaf(q[d + i], kf[i], a);
                }
            }
#endif
            for (; d < hd; d++) {
                a = fmaf(q[d], kg_fp16_to_fp32(k[d]), a);
            }
            a *= scale;
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
            for (int32_t d = 0; d < hd; d++) {
                out[d] *= ms;
            }
            S *= ms;
        }
        M = m_new;
        double sum = 0.0;
        for (int32_t p = lo; p < hi; p++) {
            sc[p - t0] = expf(sc[p - t0] - M);
            sum += (double)sc[p - t0];
        }
        S = (float)((double)S + sum);
        for (int32_t p = lo; p < hi; p++) {
            const uint16_t *vr = row_at(kv, kv->v, p);
            const float w = sc[p - t0];
            int32_t d = 0;
#ifdef FLASH_AVX2
            const __m256 wv = _mm256_set1_ps(w);
            for (; d + 8 <= hd; d += 8) {
                _mm256_storeu_ps(out + d,
                                 _mm256_fmadd_ps(load_h8(vr + d), wv, _mm256_loadu_ps(out + d)));
            }
#endif
            for (; d < hd; d++) {
                out[d] = fmaf(kg_fp16_to_fp32(vr[d]), w, out[d]);
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
