/* kg_quant: element types of GGUF tensors.
 *
 * The block layouts are ggml's (ggml-common.h) and the dequantizers follow
 * ggml-quants.c dequantize_row_* operation for operation, so a tensor read
 * here gives the same floats llama.cpp's reference path gives. Blocks are
 * read byte-wise (memcpy) because GGUF data is only 32-byte aligned as a
 * whole, and a block inside it (34 bytes for Q8_0) is not aligned at all. */
#include "kg_quant.h"

#include "kg_mxfp4.h"

#include <math.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kgen reads GGUF blocks in place and needs a little-endian host"
#endif

// ---- block layouts (bytes) ----

#define QK4_0 32 /* block_q4_0: d fp16, qs[16] (two 4-bit quants per byte) */
#define QK8_0 32 /* block_q8_0: d fp16, qs[32] int8 */
#define QK_K  256

#define Q4_0_SIZE 18
#define Q8_0_SIZE 34
/* block_q4_K: d fp16, dmin fp16, scales[12] (8 pairs of 6-bit scale/min), qs[128] */
#define Q4_K_SIZE 144
/* block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d fp16 */
#define Q6_K_SIZE 210

int64_t kg_type_block_elems(kg_ggml_type_t type) {
    switch (type) {
    case KG_GGML_TYPE_F32:
    case KG_GGML_TYPE_F16:
    case KG_GGML_TYPE_BF16:
        return 1;
    case KG_GGML_TYPE_Q4_0:
        return QK4_0;
    case KG_GGML_TYPE_Q8_0:
        return QK8_0;
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q6_K:
        return QK_K;
    case KG_GGML_TYPE_MXFP4:
        return KG_MXFP4_BLOCK_ELEMS;
    }
    return 0;
}

size_t kg_type_block_size(kg_ggml_type_t type) {
    switch (type) {
    case KG_GGML_TYPE_F32:
        return 4;
    case KG_GGML_TYPE_F16:
    case KG_GGML_TYPE_BF16:
        return 2;
    case KG_GGML_TYPE_Q4_0:
        return Q4_0_SIZE;
    case KG_GGML_TYPE_Q8_0:
        return Q8_0_SIZE;
    case KG_GGML_TYPE_Q4_K:
        return Q4_K_SIZE;
    case KG_GGML_TYPE_Q6_K:
        return Q6_K_SIZE;
    case KG_GGML_TYPE_MXFP4:
        return KG_MXFP4_BLOCK_SIZE;
    }
    return 0;
}

size_t kg_type_row_size(kg_ggml_type_t type, int64_t n) {
    int64_t blck = kg_type_block_elems(type);
    if (blck == 0) {
        return 0;
    }
    return (size_t)(n / blck) * kg_type_block_size(type);
}

bool kg_type_is_known(uint32_t type) {
    return kg_type_block_size((kg_ggml_type_t)type) != 0;
}

// ---- half precision ----

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float kg_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) {
        // inf and NaN keep their payload in the top mantissa bits
        return f32_from_bits(sign | 0x7f800000 | (mant << 13));
    }
    if (exp == 0) {
        // zero and subnormals: mant * 2^-24, exact in float
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t kg_fp32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) {
        // NaN: keep it quiet and keep what fits of the payload
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    }
    if (ax >= 0x38800000) {
        // normal half range (>= 2^-14): rebias the exponent and round the 13
        // dropped mantissa bits to nearest even; a carry into the exponent
        // is the correct rounding, and anything that reaches 0x7c00 is inf
        uint32_t r = ax + 0xfff + ((ax >> 13) & 1);
        uint32_t h = (r - (112u << 23)) >> 13;
        if (h >= 0x7c00) {
            h = 0x7c00;
        }
        return (uint16_t)(sign | h);
    }
    uint32_t e = ax >> 23;
    if (e < 102) {
        // below 2^-25 everything rounds to zero
        return sign;
    }
    // subnormal half: value / 2^-24 = m * 2^(e - 126)
    uint32_t m = (ax & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; // 14..24
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) {
        h++; // may carry into the smallest normal (0x400), which is right
    }
    return (uint16_t)(sign | h);
}

float kg_bf16_to_fp32(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t kg_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) {
        return (uint16_t)((u >> 16) | 64); // force quiet, as ggml does
    }
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

static float rd_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return kg_fp16_to_fp32(h);
}

// ---- dequantization (ggml-quants.c dequantize_row_*) ----

static void dequant_q4_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += Q4_0_SIZE, y += QK4_0) {
        const float d = rd_half(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (qs[j] & 0x0f) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + QK4_0 / 2] = (float)x1 * d;
        }
    }
}

static void dequant_q8_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += Q8_0_SIZE, y += QK8_0) {
        const float d = rd_half(x);
        const int8_t *qs = (const int8_t *)(x + 2);
        for (int j = 0; j < QK8_0; j++) {
            y[j] = (float)qs[j] * d;
        }
    }
}

/* Scale and min of sub-block j (0..7) from the 12 packed bytes: the first
 * four pairs are the low 6 bits of bytes 0..7; the last four are a nibble of
 * bytes 8..11 plus the top 2 bits of bytes 0..7. */
static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

static void dequant_q4_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += Q4_K_SIZE) {
        const float d = rd_half(x);
        const float min = rd_half(x + 2);
        const uint8_t *scales = x + 4;
        const uint8_t *q = x + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; ++l) {
                *y++ = d1 * (float)(q[l] & 0xF) - m1;
            }
            for (int l = 0; l < 32; ++l) {
                *y++ = d2 * (float)(q[l] >> 4) - m2;
            }
            q += 32;
            is += 2;
        }
    }
}

static void dequant_q6_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += Q6_K_SIZE) {
        const float d = rd_half(x + 208);
        const uint8_t *ql = x;
        const uint8_t *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void kg_dequantize(kg_ggml_type_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *x = src;
    switch (type) {
    case KG_GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case KG_GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            dst[i] = rd_half(x + 2 * i);
        }
        return;
    case KG_GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, x + 2 * i, sizeof(h));
            dst[i] = kg_bf16_to_fp32(h);
        }
        return;
    case KG_GGML_TYPE_Q4_0:
        dequant_q4_0(x, dst, n / QK4_0);
        return;
    case KG_GGML_TYPE_Q8_0:
        dequant_q8_0(x, dst, n / QK8_0);
        return;
    case KG_GGML_TYPE_Q4_K:
        dequant_q4_k(x, dst, n / QK_K);
        return;
    case KG_GGML_TYPE_Q6_K:
        dequant_q6_k(x, dst, n / QK_K);
        return;
    case KG_GGML_TYPE_MXFP4:
        kg_mxfp4_dequantize(x, dst, n);
        return;
    }
}

// ---- quantization (ggml-quants.c quantize_row_*_ref) ----

static void put_half(uint8_t *p, float f) {
    uint16_t h = kg_fp32_to_fp16(f);
    memcpy(p, &h, sizeof(h));
}

static void quant_q8_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0, y += Q8_0_SIZE) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        int8_t *qs = (int8_t *)(y + 2);
        for (int j = 0; j < QK8_0; j++) {
            qs[j] = (int8_t)roundf(x[j] * id);
        }
    }
}

static void quant_q4_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0, y += Q4_0_SIZE) {
        // the value of largest magnitude maps to -8 exactly, keeping its sign
        float amax = 0.0f;
        float max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        uint8_t *qs = y + 2;
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[QK4_0 / 2 + j] * id;
            int xi0 = (int8_t)(x0 + 8.5f);
            int xi1 = (int8_t)(x1 + 8.5f);
            xi0 = xi0 < 15 ? xi0 : 15;
            xi1 = xi1 < 15 ? xi1 : 15;
            qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

bool kg_quantize(kg_ggml_type_t type, const float *src, void *dst, int64_t n) {
    uint8_t *y = dst;
    switch (type) {
    case KG_GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case KG_GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            put_half(y + 2 * i, src[i]);
        }
        return true;
    case KG_GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kg_fp32_to_bf16(src[i]);
            memcpy(y + 2 * i, &h, sizeof(h));
        }
        return true;
    case KG_GGML_TYPE_Q8_0:
        if (n % QK8_0 != 0) {
            return false;
        }
        quant_q8_0(src, y, n / QK8_0);
        return true;
    case KG_GGML_TYPE_Q4_0:
        if (n % QK4_0 != 0) {
            return false;
        }
        quant_q4_0(src, y, n / QK4_0);
        return true;
    case KG_GGML_TYPE_MXFP4:
        if (n % KG_MXFP4_BLOCK_ELEMS != 0) {
            return false;
        }
        kg_mxfp4_quantize(src, y, n);
        return true;
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q6_K:
        break;
    }
    return false;
}
