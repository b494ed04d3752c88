/* kg_math: per-element math shared by the CPU and CUDA backends.
 *
 * docs/DESIGN.md §5: the math of one element (a RoPE pair, SiLU, the online
 * softmax update) lives here once, as inline functions that compile as C11
 * and as CUDA device code, so the CPU tests cover the math and the GPU tests
 * only the parallel decomposition. Formulas follow ggml's CPU ops so results
 * stay close to llama.cpp's. */
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KG_HD __host__ __device__ __forceinline__
#else
#define KG_HD static inline
#endif

/** SiLU (swish), as ggml_silu_f32. */
KG_HD float kg_silu(float x) {
    return x / (1.0f + expf(-x));
}

/** cos/sin of every RoPE pair at position `pos`, built the way ggml's
 * rope cache builds them: theta starts at pos and is multiplied by
 * base^(-2/n_rot) once per pair, in float, so the angles (and thus the
 * outputs) match llama.cpp's to the bit. `freq_factors` (Llama 3.1
 * rope_freqs) divides each pair's angle; NULL means none. */
KG_HD void kg_rope_cache(int32_t pos,
                         int32_t n_rot,
                         float base,
                         float freq_scale,
                         const float *freq_factors,
                         float *cos_out,
                         float *sin_out) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta_base = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float theta = freq_scale * (theta_base / ff);
        cos_out[i] = cosf(theta);
        sin_out[i] = sinf(theta);
        theta_base *= theta_scale;
    }
}

/** Rotate the adjacent pair (x0, x1) by theta (llama "normal" RoPE mode). */
KG_HD void kg_rope_pair(float *x0, float *x1, float cos_t, float sin_t) {
    float a = *x0, b = *x1;
    *x0 = a * cos_t - b * sin_t;
    *x1 = a * sin_t + b * cos_t;
}

/** One step of the online softmax (running max m, running sum l): returns
 * the factor by which the accumulator so far must be rescaled, and updates
 * m and l for a new score s; *p gets exp(s - m_new). */
KG_HD float kg_online_softmax_step(float *m, float *l, float s, float *p) {
    float m_new = s > *m ? s : *m;
    float scale = expf(*m - m_new);
    *p = expf(s - m_new);
    *l = *l * scale + *p;
    *m = m_new;
    return scale;
}
