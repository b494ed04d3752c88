/* cpu_ops: row operations of the CPU backend.
 *
 * The small per-row ops are plain loops the compiler vectorizes (built for
 * x86-64-v3), with F16C intrinsics for the fp16 KV cache where present. */
#include "cpu_ops.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KG_HAVE_F16C 1
#endif

#include "../../model/kg_quant.h"
#include "../kg_math.h"

void cpu_rmsnorm_rows(
    const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0; /* ggml sums squares in double (ggml_float) */
        for (int64_t i = 0; i < n; i++) {
            sum += (double)(xr[i] * xr[i]);
        }
        const float mean = (float)(sum / (double)n);
        const float scale = 1.0f / sqrtf(mean + eps);
        if (!w) { /* ggml_rms_norm alone (Gemma 4's V) */
            for (int64_t i = 0; i < n; i++) {
                yr[i] = xr[i] * scale;
            }
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            yr[i] = (xr[i] * scale) * w[i];
        }
    }
}

void cpu_gelu_table_init(uint16_t *table) {
    for (uint32_t h = 0; h < 65536; h++) {
        table[h] = kg_fp32_to_fp16(kg_gelu_tanh(kg_fp16_to_fp32((uint16_t)h)));
    }
}

void cpu_geglu(const uint16_t *table, const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        if (x <= -10.0f) {
            out[i] = 0.0f;
        } else if (x >= 10.0f) {
            out[i] = x * up[i];
        } else {
            out[i] = kg_fp16_to_fp32(table[kg_fp32_to_fp16(x)]) * up[i];
        }
    }
}

void cpu_round_fp16(float *x, int64_t n) {
    int64_t i = 0;
#ifdef KG_HAVE_F16C
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        x[i] = kg_fp16_to_fp32(kg_fp32_to_fp16(x[i]));
    }
}

void cpu_fp32_to_fp16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
#ifdef KG_HAVE_F16C
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(y + i), h);
    }
#endif
    for (; i < n; i++) {
        y[i] = kg_fp32_to_fp16(x[i]);
    }
}

void cpu_fp16_to_fp32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
#ifdef KG_HAVE_F16C
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(x + i));
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        y[i] = kg_fp16_to_fp32(x[i]);
    }
}

/* ggml's AVX2 quantize_row_q8_0: scale 127/amax, round half to even, the
 * block scale stored as fp16. */
static void round_q8_0(const float *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(x[b + j]));
        }
        const float d = kg_fp16_to_fp32(kg_fp32_to_fp16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; j++) {
            y[b + j] = d * nearbyintf(x[b + j] * id);
        }
    }
}

/* ggml's quantize_row_q8_K: the signed extreme maps to -127, float scale. */
static void round_q8_k(const float *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n; b += 256) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; j++) {
            float ax = fabsf(x[b + j]);
            if (ax > amax) {
                amax = ax;
                max = x[b + j];
            }
        }
        if (amax == 0.0f) {
            memset(y + b, 0, 256 * sizeof(float));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < 256; j++) {
            float q = nearbyintf(iscale * x[b + j]);
            y[b + j] = (q > 127.0f ? 127.0f : q) / iscale;
        }
    }
}

/* The block of the activations ggml's vec_dot_type gives weights of `type`:
 * 32 for Q8_0 (Q4_0, Q5_x, IQ4_NL; MXFP4's vec_dot_type is Q8_0 too), 256
 * for Q8_K (the K-quants, IQ4_XS), 1 for F16 and BF16 (rounded one by one),
 * 0 for none (F32). */
static int64_t act_block(kg_ggml_type_t type) {
    switch (type) {
    case KG_GGML_TYPE_F16:
    case KG_GGML_TYPE_BF16:
        return 1;
    case KG_GGML_TYPE_Q8_0:
    case KG_GGML_TYPE_Q4_0:
    case KG_GGML_TYPE_Q4_1:
    case KG_GGML_TYPE_Q5_0:
    case KG_GGML_TYPE_Q5_1:
    case KG_GGML_TYPE_IQ4_NL:
    case KG_GGML_TYPE_MXFP4:
        return 32;
    case KG_GGML_TYPE_Q2_K:
    case KG_GGML_TYPE_Q3_K:
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K:
    case KG_GGML_TYPE_Q6_K:
    case KG_GGML_TYPE_IQ4_XS:
        return 256;
    default:
        return 0;
    }
}

bool cpu_activations_rounded(kg_ggml_type_t type, int64_t n) {
    const int64_t b = act_block(type);
    return b > 0 && n % b == 0;
}

bool cpu_round_activations(
    kg_ggml_type_t type, const float *x, float *dst, int64_t n_rows, int64_t n) {
    if (!cpu_activations_rounded(type, n)) {
        return false;
    }
    if (type == KG_GGML_TYPE_F16) {
        memcpy(dst, x, (size_t)(n_rows * n) * sizeof(float));
        cpu_round_fp16(dst, n_rows * n);
    } else if (type == KG_GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n_rows * n; i++) {
            dst[i] = kg_bf16_to_fp32(kg_fp32_to_bf16(x[i]));
        }
    } else if (act_block(type) == 32) {
        round_q8_0(x, dst, n_rows * n);
    } else {
        round_q8_k(x, dst, n_rows * n);
    }
    return true;
}

void cpu_advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    const uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    const uintptr_t hi = ((uintptr_t)p + size) & ~(huge - 1);
    if (p && hi > lo) {
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: refused is fine */
    }
#else
    (void)p, (void)size;
#endif
}
