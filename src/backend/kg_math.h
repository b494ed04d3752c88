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

/** One token of a causal depthwise convolution on one channel, as the
 * hybrids' recurrent layers run ggml_ssm_conv: win holds the channel's
 * K - 1 earlier inputs, oldest first; the result is their dot with the
 * kernel's first K - 1 taps plus x times the last, one float sum in
 * ascending order; x is then shifted into the window. */
KG_HD float kg_conv_step(float *win, const float *k, int64_t K, float x) {
    float sum = 0.0f;
    for (int64_t i = 0; i < K - 1; i++) {
        sum += win[i] * k[i];
    }
    sum += x * k[K - 1];
    for (int64_t i = 0; i + 1 < K - 1; i++) {
        win[i] = win[i + 1];
    }
    if (K > 1) {
        win[K - 2] = x;
    }
    return sum;
}

/** Nemotron-H's squared ReLU (LLM_FFN_RELU_SQR: ggml_relu, then ggml_sqr). */
KG_HD float kg_relu_sqr(float x) {
    const float r = x > 0.0f ? x : 0.0f;
    return r * r;
}

/** gpt-oss's clamped SwiGLU of one element, as ggml_swiglu_oai computes
 * it: x = min(gate, limit), y = clamp(up, -limit, limit),
 * x / (1 + exp(alpha * -x)) * (y + 1) (alpha 1.702, limit 7 in gpt-oss). */
KG_HD float kg_swiglu_oai(float gate, float up, float alpha, float limit) {
    const float x = limit < gate ? limit : gate;                      /* std::min */
    const float y = up < -limit ? -limit : (limit < up ? limit : up); /* std::clamp */
    return x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
}

/** GELU with the tanh approximation, as ggml_gelu_f32 writes it. (ggml's
 * CPU GeGLU looks it up in a table of fp16 inputs: see cpu_geglu.) */
KG_HD float kg_gelu_tanh(float x) {
    const float coef_a = 0.044715f;
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

/** Soft-capping (Gemma 2): c * tanh(x / c), as ggml's scale, tanh, scale. */
KG_HD float kg_softcap(float x, float c) {
    return tanhf(x * (1.0f / c)) * c;
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

/** ggml_rope_yarn_corr_dims: the first and last pair index YaRN blends
 * between extrapolation and interpolation, for a rotation of n_rot dims
 * trained on n_ctx_orig positions. */
KG_HD void kg_rope_yarn_corr_dims(
    int32_t n_rot, int32_t n_ctx_orig, float base, float beta_fast, float beta_slow, float *dims) {
    const float pi = 3.14159265358979323846f;
    const float start = floorf(n_rot * logf(n_ctx_orig / (beta_fast * 2 * pi)) / (2 * logf(base)));
    const float end = ceilf(n_rot * logf(n_ctx_orig / (beta_slow * 2 * pi)) / (2 * logf(base)));
    dims[0] = start > 0.0f ? start : 0.0f;
    dims[1] = end < (float)(n_rot - 1) ? end : (float)(n_rot - 1);
}

/** kg_rope_cache with YaRN (ggml's rope_yarn): each pair's angle blends
 * the interpolated angle (freq_scale * theta) and the extrapolated one
 * (theta) by a ramp over corr_dims, weighted by ext_factor, and cos/sin are
 * multiplied by the magnitude mscale = attn_factor (times 1 + 0.1 ln(1 /
 * freq_scale) when extrapolating). With ext_factor 0 and attn_factor 1 it
 * gives kg_rope_cache's bits. */
KG_HD void kg_rope_cache_yarn(int32_t pos,
                              int32_t n_rot,
                              float base,
                              float freq_scale,
                              const float *freq_factors,
                              float ext_factor,
                              float attn_factor,
                              const float *corr_dims,
                              float *cos_out,
                              float *sin_out) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta_base = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float theta_extrap = theta_base / ff;
        const float theta_interp = freq_scale * theta_extrap;
        float theta = theta_interp;
        float mscale = attn_factor;
        if (ext_factor != 0.0f) {
            const float den = corr_dims[1] - corr_dims[0];
            const float y = ((float)i - corr_dims[0]) / (den > 0.001f ? den : 0.001f);
            const float ramp = 1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y);
            const float ramp_mix = ramp * ext_factor;
            theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
        }
        cos_out[i] = cosf(theta) * mscale;
        sin_out[i] = sinf(theta) * mscale;
        theta_base *= theta_scale;
    }
}

/** Rotate the adjacent pair (x0, x1) by theta (llama "normal" RoPE mode). */
KG_HD void kg_rope_pair(float *x0, float *x1, float cos_t, float sin_t) {
    float a = *x0, b = *x1;
    *x0 = a * cos_t - b * sin_t;
    *x1 = a * sin_t + b * cos_t;
}

/** xIELU of one element (Apertus), as ggml's op_xielu, with the op's
 * parameters (alpha_n already beta + softplus(alpha_n), alpha_p
 * softplus(alpha_p)). */
KG_HD float kg_xielu(float x, float alpha_n, float alpha_p, float beta, float eps) {
    if (x > 0.0f) {
        return alpha_p * x * x + beta * x;
    }
    const float min_x_eps = fminf(x, eps);
    return (expm1f(min_x_eps) - x) * alpha_n + beta * x;
}

/** Llama 4's attention temperature at position pos (mistral3), as
 * llm_graph_input_attn_temp computes it: log(floor(pos / floor_len) + 1)
 * in double, times scale, plus 1, stored as a float. */
KG_HD float kg_attn_temp(float scale, int32_t floor_len, int32_t pos) {
    const float blocks = floorf((float)pos / (float)floor_len);
    return (float)(log((double)blocks + 1.0) * (double)scale + 1.0);
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
