/* cpu_expf: ggml's vector expf (ggml_v_expf, ggml-cpu/vec.h, its AVX2
 * form), which llama.cpp's softmaxes take their exponentials from, on 8
 * lanes and on one: the scalar twin does the vector's operations in its
 * order (fmaf for each FMA, fnmadd as fmaf of the negated factor), so a
 * build without AVX2 gets the same bits (check_bert compares them). Within
 * 2 ulp of expf; 0 for -inf. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* ggml_v_expf, its AVX2 form, on 8 lanes */
static inline __m256 cpu_v_expf8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256i c = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) {
        return _mm256_fmadd_ps(j, k, k);
    }
    const __m256i g =
        _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                         _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256i d = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
    return _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            _mm256_castsi256_ps(d),
            _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c),
                                       _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                         _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}
#endif

static inline float cpu_bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ggml_v_expf's AVX2 form on one lane: its operations in its order (fmaf
 * for its FMAs, fnmadd as fmaf of the negated factor), so that the scalar
 * build and the vector path give the same bits. */
static inline float cpu_v_expf1(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t zb;
    memcpy(&zb, &z, sizeof(zb));
    const uint32_t e = zb << 23;
    const float k = cpu_bits_f(e + 0x3f800000u);
    const float u = b * b;
    const float j = fmaf(
        fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
        u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) {
        return fmaf(j, k, k);
    }
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = cpu_bits_f(g + 0x7f000000u), s2 = cpu_bits_f(e - g);
    return fabsf(n) > 192.0f ? s1 * s1 : fmaf(s2, j, s2) * s1;
}

/* ggml_vec_soft_max_f32's AVX2 form over a flash-attention tile's scores:
 * sc[p] = exp(sc[p] - M) by ggml_v_expf, 8 at a time (nt a multiple of 8:
 * the tile padded with -inf, as ggml pads and masks it, whose exponentials
 * are 0), each 8 summed as its horizontal add does, ((v0 + v4) + (v2 +
 * v6)) + ((v1 + v5) + (v3 + v7)), into a double in order. Returns the sum.
 * The scalar build gives the same bits. */
static inline double cpu_softmax8_sum(float *sc, int32_t nt, float M) {
    double sum = 0.0;
    for (int32_t p = 0; p < nt; p += 8) {
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 val = cpu_v_expf8(_mm256_sub_ps(_mm256_loadu_ps(sc + p), _mm256_set1_ps(M)));
        _mm256_storeu_ps(sc + p, val);
        __m128 v2 = _mm_add_ps(_mm256_extractf128_ps(val, 1), _mm256_castps256_ps128(val));
        v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
        v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
        sum += (double)_mm_cvtss_f32(v2);
#else
        float *v = sc + p;
        for (int i = 0; i < 8; i++) {
            v[i] = cpu_v_expf1(v[i] - M);
        }
        const float w0 = v[4] + v[0], w1 = v[5] + v[1], w2 = v[6] + v[2], w3 = v[7] + v[3];
        sum += (double)((w0 + w2) + (w1 + w3));
#endif
    }
    return sum;
}

/* ggml_vec_scale_f32: x[i] *= s, a flash-attention accumulator rescaled
 * when the running maximum moves (each element one multiply: the vector
 * and scalar loops give the same bits). */
static inline void cpu_vec_scale_f32(float *x, int32_t n, float s) {
    int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(s)));
    }
#endif
    for (; i < n; i++) {
        x[i] *= s;
    }
}
