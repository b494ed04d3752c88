/* kg_quant: element types of GGUF tensors.
 *
 * The block layouts are ggml's (ggml-common.h) and the dequantizers follow
 * ggml-quants.c dequantize_row_* operation for operation, so a tensor read
 * here gives the same floats llama.cpp's reference path gives. Blocks are
 * read byte-wise (memcpy) because GGUF data is only 32-byte aligned as a
 * whole, and a block inside it (34 bytes for Q8_0) is not aligned at all.
 * kgen is compiled as ISO C (-std=c11), where GCC contracts no expression
 * into an FMA, so `d * q - m` rounds twice, as the formula is written. */
#include "kg_quant.h"

#include "kg_mxfp4.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kgen reads GGUF blocks in place and needs a little-endian host"
#endif

// ---- the type table ----

/* Block layouts (bytes), in ggml-common.h field order:
 *   q4_0    d f16 | qs[16]: element j in the low nibble of qs[j], j+16 in the high
 *   q4_1    d f16, m f16 | qs[16] as q4_0
 *   q5_0    d f16 | qh[4] (bit j = 5th bit of element j) | qs[16] as q4_0
 *   q5_1    d f16, m f16 | qh[4] | qs[16]
 *   q8_0    d f16 | qs[32] int8
 *   q2_k    scales[16] (low nibble scale, high nibble min) | qs[64] | d f16, dmin f16
 *   q3_k    hmask[32] | qs[64] | scales[12] (16 6-bit scales) | d f16
 *   q4_k    d f16, dmin f16 | scales[12] (8 6-bit scale/min pairs) | qs[128]
 *   q5_k    d f16, dmin f16 | scales[12] | qh[32] | qs[128]
 *   q6_k    ql[128] | qh[64] | scales[16] int8 | d f16
 *   iq4_nl  d f16 | qs[16] as q4_0, indices into kg_iq4nl_values
 *   iq4_xs  d f16 | scales_h u16 | scales_l[4] | qs[128]
 *   mxfp4   e E8M0 | qs[16] as q4_0 (see kg_mxfp4.h) */
typedef struct type_info {
    uint32_t id;
    const char *name;
    int64_t block_elems;
    size_t block_size; /* 0: a ggml type kgen does not read */
} type_info_t;

static const type_info_t types[] = {
    {0, "f32", 1, 4},           {1, "f16", 1, 2},
    {2, "q4_0", 32, 18},        {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},        {7, "q5_1", 32, 24},
    {8, "q8_0", 32, 34},        {9, "q8_1", 0, 0},
    {10, "q2_k", KG_QK_K, 84},  {11, "q3_k", KG_QK_K, 110},
    {12, "q4_k", KG_QK_K, 144}, {13, "q5_k", KG_QK_K, 176},
    {14, "q6_k", KG_QK_K, 210}, {15, "q8_k", 0, 0},
    {16, "iq2_xxs", 0, 0},      {17, "iq2_xs", 0, 0},
    {18, "iq3_xxs", 0, 0},      {19, "iq1_s", 0, 0},
    {20, "iq4_nl", 32, 18},     {21, "iq3_s", 0, 0},
    {22, "iq2_s", 0, 0},        {23, "iq4_xs", KG_QK_K, 136},
    {24, "i8", 0, 0},           {25, "i16", 0, 0},
    {26, "i32", 0, 0},          {27, "i64", 0, 0},
    {28, "f64", 0, 0},          {29, "iq1_m", 0, 0},
    {30, "bf16", 1, 2},         {31, "q4_0_4_4", 0, 0},
    {32, "q4_0_4_8", 0, 0},     {33, "q4_0_8_8", 0, 0},
    {34, "tq1_0", 0, 0},        {35, "tq2_0", 0, 0},
    {36, "iq4_nl_4_4", 0, 0},   {37, "iq4_nl_4_8", 0, 0},
    {38, "iq4_nl_8_8", 0, 0},   {39, "mxfp4", KG_MXFP4_BLOCK_ELEMS, KG_MXFP4_BLOCK_SIZE},
};

#define N_TYPES (sizeof(types) / sizeof(types[0]))

static const type_info_t *info(uint32_t id) {
    for (size_t i = 0; i < N_TYPES; i++) {
        if (types[i].id == id) {
            return &types[i];
        }
    }
    return NULL;
}

const int8_t kg_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

int64_t kg_type_block_elems(kg_ggml_type_t type) {
    const type_info_t *t = info((uint32_t)type);
    return t && t->block_size ? t->block_elems : 0;
}

size_t kg_type_block_size(kg_ggml_type_t type) {
    const type_info_t *t = info((uint32_t)type);
    return t ? t->block_size : 0;
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

bool kg_type_is_quantized(kg_ggml_type_t type) {
    return kg_type_block_elems(type) > 1;
}

const char *kg_type_name(uint32_t type) {
    const type_info_t *t = info(type);
    return t ? t->name : NULL;
}

bool kg_type_from_name(const char *name, kg_ggml_type_t *out) {
    for (size_t i = 0; i < N_TYPES; i++) {
        const char *a = types[i].name, *b = name;
        while (*a && *b && *a == tolower((unsigned char)*b)) {
            a++, b++;
        }
        if (*a == '\0' && *b == '\0' && types[i].block_size) {
            *out = (kg_ggml_type_t)types[i].id;
            return true;
        }
    }
    return false;
}

const char *kg_type_list(void) {
    return "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, "
           "iq4_xs, mxfp4";
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

/* Block-32 formats: elements j and j + 16 share byte j of qs. */

static void dequant_q4_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = rd_half(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = rd_half(x), m = rd_half(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 0x0f) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

/* The 5th bit of element j is bit j of the little-endian 32-bit qh. */
static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static void dequant_q5_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 22, y += 32) {
        const float d = rd_half(x);
        const uint32_t qh = rd_u32(x + 2);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(((qs[j] & 0x0f) | h0) - 16) * d;
            y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void dequant_q5_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 24, y += 32) {
        const float d = rd_half(x), m = rd_half(x + 2);
        const uint32_t qh = rd_u32(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)((qs[j] & 0x0f) | h0) * d + m;
            y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void dequant_q8_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const float d = rd_half(x);
        const int8_t *qs = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) {
            y[j] = (float)qs[j] * d;
        }
    }
}

static void dequant_iq4_nl(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = rd_half(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)kg_iq4nl_values[qs[j] & 0x0f];
            y[j + 16] = d * (float)kg_iq4nl_values[qs[j] >> 4];
        }
    }
}

/* K-quants. Super-blocks of 256 elements; within a 128-element half, the
 * 2-bit formats keep element 32 s + l (s < 4, l < 32) in bits 2 s of byte
 * l of the half's 32 qs bytes. */

static void dequant_q2_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 84) {
        const uint8_t *scales = x, *q = x + 16;
        const float d = rd_half(x + 80), min = rd_half(x + 82);
        int is = 0;
        for (int n = 0; n < KG_QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = scales[is++];
                    const float dl = d * (float)(sc & 0x0f), ml = min * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) {
                        *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                    }
                }
            }
        }
    }
}

/* The 16 6-bit scales of q3_k, unbiased (-32 .. 31): scale j has its low
 * nibble in byte j (j < 8) or the high nibble of byte j - 8, and its top 2
 * bits at bit 2 (j / 4) of byte 8 + j % 4. */
static void q3_k_scales(const uint8_t *s, int *out) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

static void dequant_q3_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 110) {
        const uint8_t *hm = x, *q = x + 32;
        const float d_all = rd_half(x + 108);
        int sc[16];
        q3_k_scales(x + 96, sc);
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < KG_QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (float)sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}

/* Scale and min of sub-block j (0..7) of q4_k/q5_k from the 12 packed
 * bytes: the first four pairs are the low 6 bits of bytes 0..7; the last
 * four are a nibble of bytes 8..11 plus the top 2 bits of bytes 0..7. */
static void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void dequant_q4_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 144) {
        const float d = rd_half(x), min = rd_half(x + 2);
        const uint8_t *scales = x + 4, *q = x + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            int sc, m;
            scale_min_k4(j, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(j + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) {
                *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            }
            for (int l = 0; l < 32; l++) {
                *y++ = d2 * (float)(q[l] >> 4) - m2;
            }
        }
    }
}

static void dequant_q5_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 176) {
        const float d = rd_half(x), min = rd_half(x + 2);
        const uint8_t *scales = x + 4, *qh = x + 16, *ql = x + 48;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32) {
            int sc, m;
            scale_min_k4(j, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(j + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) {
                *y++ = d1 * (float)((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
            }
            for (int l = 0; l < 32; l++) {
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            }
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void dequant_q6_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210) {
        const float d = rd_half(x + 208);
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < KG_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
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
        }
    }
}

static void dequant_iq4_xs(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 136) {
        const float d = rd_half(x);
        uint16_t scales_h;
        memcpy(&scales_h, x + 2, sizeof(scales_h));
        const uint8_t *scales_l = x + 4, *qs = x + 8;
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const int ls =
                ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)kg_iq4nl_values[qs[j] & 0x0f];
                y[j + 16] = dl * (float)kg_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

void kg_dequantize(kg_ggml_type_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *x = src;
    const int64_t block_elems = kg_type_block_elems(type);
    const int64_t nb = block_elems > 0 ? n / block_elems : 0;
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
        dequant_q4_0(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q4_1:
        dequant_q4_1(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q5_0:
        dequant_q5_0(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q5_1:
        dequant_q5_1(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q8_0:
        dequant_q8_0(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q2_K:
        dequant_q2_k(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q3_K:
        dequant_q3_k(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q4_K:
        dequant_q4_k(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q5_K:
        dequant_q5_k(x, dst, nb);
        return;
    case KG_GGML_TYPE_Q6_K:
        dequant_q6_k(x, dst, nb);
        return;
    case KG_GGML_TYPE_IQ4_NL:
        dequant_iq4_nl(x, dst, nb);
        return;
    case KG_GGML_TYPE_IQ4_XS:
        dequant_iq4_xs(x, dst, nb);
        return;
    case KG_GGML_TYPE_MXFP4:
        kg_mxfp4_dequantize(x, dst, n);
        return;
    }
}
