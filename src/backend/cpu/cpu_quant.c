/* cpu_quant: activation quantization as ggml does it, and weight blocks
 * unpacked into panels (see cpu_quant.h). Blocks are read byte-wise: a
 * block inside the mapped file is not aligned. */
#include "cpu_quant.h"

#include "../../model/kg_mxfp4.h"
#include "../../model/kg_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QUANT_AVX2 1
#endif

/* type, activations, block, nonneg, offset, scaled, min_m, min_k */
static const cpu_qtraits_t traits[] = {
    {KG_GGML_TYPE_Q4_0, CPU_ACT_Q8_0, 32, false, 0, false, false, false},
    {KG_GGML_TYPE_Q4_1, CPU_ACT_Q8_1, 32, true, 0, false, true, false},
    {KG_GGML_TYPE_Q5_0, CPU_ACT_Q8_0, 32, false, 0, false, false, false},
    {KG_GGML_TYPE_Q5_1, CPU_ACT_Q8_1, 32, true, 0, false, true, false},
    {KG_GGML_TYPE_Q8_0, CPU_ACT_Q8_0, 32, false, 0, false, false, false},
    {KG_GGML_TYPE_IQ4_NL, CPU_ACT_Q8_0, 32, false, 0, false, false, false},
    {KG_GGML_TYPE_MXFP4, CPU_ACT_Q8_0, 32, false, 0, false, false, false},
    {KG_GGML_TYPE_Q2_K, CPU_ACT_Q8_K, 256, true, 0, true, false, true},
    {KG_GGML_TYPE_Q3_K, CPU_ACT_Q8_K, 256, true, 4, true, false, false},
    {KG_GGML_TYPE_Q4_K, CPU_ACT_Q8_K, 256, true, 0, true, false, true},
    {KG_GGML_TYPE_Q5_K, CPU_ACT_Q8_K, 256, true, 0, true, false, true},
    {KG_GGML_TYPE_Q6_K, CPU_ACT_Q8_K, 256, true, 32, true, false, false},
    {KG_GGML_TYPE_IQ4_XS, CPU_ACT_Q8_K, 256, false, 0, true, false, false},
};

const cpu_qtraits_t *cpu_qtraits(kg_ggml_type_t type) {
    for (size_t i = 0; i < sizeof(traits) / sizeof(traits[0]); i++) {
        if (traits[i].type == type) {
            return &traits[i];
        }
    }
    return NULL;
}

// ---- activations ----

static size_t align32(size_t n) {
    return (n + 31) & ~(size_t)31;
}

size_t cpu_qact_size(int64_t max_m, int64_t max_k) {
    const size_t m = (size_t)max_m, k = (size_t)max_k;
    return 2 * align32(m * k) + 3 * align32(m * (k / 32) * sizeof(float)) +
           align32(m * (k / 16) * sizeof(int16_t));
}

bool cpu_qact_init(cpu_qact_t *a, int64_t max_m, int64_t max_k) {
    memset(a, 0, sizeof(*a));
    const size_t m = (size_t)max_m, k = (size_t)max_k;
    a->qs = aligned_alloc(32, align32(m * k) ? align32(m * k) : 32);
    a->qu = aligned_alloc(32, align32(m * k) ? align32(m * k) : 32);
    a->d = aligned_alloc(32, align32(m * (k / 32) * sizeof(float)) + 32);
    a->s = aligned_alloc(32, align32(m * (k / 32) * sizeof(float)) + 32);
    a->sums = aligned_alloc(32, align32(m * (k / 32) * sizeof(int32_t)) + 32);
    a->bsums = aligned_alloc(32, align32(m * (k / 16) * sizeof(int16_t)) + 32);
    if (!a->qs || !a->qu || !a->d || !a->s || !a->sums || !a->bsums) {
        cpu_qact_clear(a);
        return false;
    }
    return true;
}

void cpu_qact_clear(cpu_qact_t *a) {
    free(a->qs);
    free(a->qu);
    free(a->d);
    free(a->s);
    free(a->sums);
    free(a->bsums);
    memset(a, 0, sizeof(*a));
}

static float half_round(float f) {
    return kg_fp16_to_fp32(kg_fp32_to_fp16(f));
}

/* One 32-block as ggml-cpu's AVX2 quantize_row_q8_0/q8_1: amax, d =
 * amax / 127 stored as fp16, q = round-half-even(x * (127 / amax)). Returns
 * d before fp16 rounding (Q8_1's s uses it) and sets *sum = sum(q). */
static float quant_block_q8(const float *x, int8_t *q, int *sum) {
    float amax = 0.0f;
#ifdef QUANT_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int64_t j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(mx, 1), _mm256_castps256_ps128(mx));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i iv = _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        acc = _mm256_add_epi32(acc, iv);
        /* |x * id| <= 127: the int8 narrowing is exact */
        int32_t t[8];
        _mm256_storeu_si256((__m256i *)(void *)t, iv);
        for (int l = 0; l < 8; l++) {
            q[8 * j + l] = (int8_t)t[l];
        }
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    *sum = _mm_cvtsi128_si32(s4);
#else
    for (int j = 0; j < 32; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int8_t)nearbyintf(x[j] * id);
        s += q[j];
    }
    *sum = s;
#endif
    return amax / 127.0f;
}

/* A 256-block as ggml's quantize_row_q8_K_ref: the first value of largest
 * magnitude maps to -127 (iscale = -127 / max), q = min(127, round-half-even
 * (iscale * x)), d = 1 / iscale, and the sums of each 16 q. */
static float quant_block_q8_k(const float *x, int8_t *q, int16_t *bsums) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax == 0.0f) {
        memset(q, 0, 256);
        memset(bsums, 0, 16 * sizeof(int16_t));
        return 0.0f;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; j++) {
        /* ggml's nearest_int: |iscale * x| <= 127 here, far inside its range */
        const float v = nearbyintf(iscale * x[j]);
        q[j] = (int8_t)(v > 127.0f ? 127.0f : v);
    }
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int l = 0; l < 16; l++) {
            s += q[16 * j + l];
        }
        bsums[j] = (int16_t)s;
    }
    return 1.0f / iscale;
}

void cpu_quant_act(cpu_act_kind_t kind, const float *x, int64_t m, int64_t k, cpu_qact_t *a) {
    cpu_quant_act_rows(kind, x, m, k, a, 0, m);
}

void cpu_quant_act_rows(cpu_act_kind_t kind,
                        const float *x,
                        int64_t m,
                        int64_t k,
                        cpu_qact_t *a,
                        int64_t r0,
                        int64_t r1) {
    a->kind = kind;
    a->m = m;
    a->k = k;
    for (int64_t i = r0; i < r1; i++) {
        const float *xr = x + i * k;
        int8_t *qr = a->qs + i * k;
        uint8_t *ur = a->qu + i * k;
        if (kind == CPU_ACT_Q8_K) {
            for (int64_t b = 0; b < k / 256; b++) {
                a->d[b * m + i] =
                    quant_block_q8_k(xr + 256 * b, qr + 256 * b, a->bsums + i * (k / 16) + 16 * b);
            }
            for (int64_t e = 0; e < k; e++) {
                ur[e] = (uint8_t)(qr[e] + 128);
            }
            continue;
        }
        for (int64_t b = 0; b < k / 32; b++) {
            int sum;
            const float d = quant_block_q8(xr + 32 * b, qr + 32 * b, &sum);
            a->d[b * m + i] = half_round(d);
            a->sums[b * m + i] = sum;
            if (kind == CPU_ACT_Q8_1) {
                a->s[b * m + i] = half_round(d * (float)sum);
            }
        }
        for (int64_t e = 0; e < k; e++) {
            ur[e] = (uint8_t)(qr[e] + 128);
        }
    }
}

// ---- weight panels ----

size_t cpu_qpanel_size(int64_t k) {
    const size_t n = CPU_QPANEL, kk = (size_t)k;
    return 2 * align32(n * kk) + align32(n * (kk / 32) * sizeof(uint32_t)) +
           4 * align32((kk / 32) * n * sizeof(float)) + align32(n * (kk / 16) * sizeof(int16_t)) +
           align32(n * (kk / 16) * sizeof(int32_t));
}

void cpu_qpanel_init(cpu_qpanel_t *p, void *mem, int64_t k) {
    const size_t n = CPU_QPANEL, kk = (size_t)k;
    char *c = mem;
    p->k = k;
    p->w = (int8_t *)c;
    c += align32(n * kk);
    p->sc = (uint32_t *)(void *)c;
    c += align32(n * (kk / 32) * sizeof(uint32_t));
    p->d = (float *)(void *)c;
    c += align32((kk / 32) * n * sizeof(float));
    p->dm = (float *)(void *)c;
    c += align32((kk / 32) * n * sizeof(float));
    p->corr = (int32_t *)(void *)c;
    c += align32((kk / 32) * n * sizeof(int32_t));
    p->wi = (int8_t *)c;
    c += align32(n * kk);
    p->sci = (int32_t *)(void *)c;
    c += align32(n * (kk / 16) * sizeof(int32_t));
    p->mini = (uint32_t *)(void *)c;
    c += align32((kk / 32) * n * sizeof(uint32_t));
    p->mins = (int16_t *)(void *)c;
}

static float rd_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
#ifdef QUANT_AVX2
    return _cvtsh_ss(h); /* F16C: the same value as kg_fp16_to_fp32, subnormals included */
#else
    return kg_fp16_to_fp32(h);
#endif
}

static uint32_t pair16(int lo, int hi) {
    return (uint32_t)(uint16_t)(int16_t)lo | (uint32_t)(uint16_t)(int16_t)hi << 16;
}

/* The q4_k / q5_k 6-bit scale and min of sub-block j. */
static void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Element e (0..31) of a 32-block whose byte j holds e = j (low nibble)
 * and e = j + 16 (high nibble): the 16 bytes expand to 32 nibbles in
 * order. */
static void nibbles32(const uint8_t *qs, uint8_t *out) {
    for (int j = 0; j < 16; j++) {
        out[j] = qs[j] & 0x0f;
        out[j + 16] = qs[j] >> 4;
    }
}

/* One weight row r of the panel: w (k values), sc (k / 32), d / dm at
 * stride CPU_QPANEL, mins (k / 16). */
static void unpack_row(kg_ggml_type_t type, const uint8_t *x, int64_t k, int r, cpu_qpanel_t *p) {
    int8_t *w = p->w + (int64_t)r * k;
    uint32_t *sc = p->sc + (int64_t)r * (k / 32);
    int16_t *mins = p->mins + (int64_t)r * (k / 16);
    float *d = p->d + r, *dm = p->dm + r;
    const int N = CPU_QPANEL;
    uint8_t nib[32];
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
    case KG_GGML_TYPE_IQ4_NL:
        for (int64_t b = 0; b < k / 32; b++, x += 18, w += 32) {
            d[b * N] = rd_half(x);
            nibbles32(x + 2, nib);
            for (int e = 0; e < 32; e++) {
                w[e] = type == KG_GGML_TYPE_Q4_0 ? (int8_t)(nib[e] - 8) : kg_iq4nl_values[nib[e]];
            }
        }
        return;
    case KG_GGML_TYPE_MXFP4:
        /* one E8M0 byte, then the codes as Q4_0 lays out its nibbles */
        for (int64_t b = 0; b < k / 32; b++, x += 17, w += 32) {
            d[b * N] = kg_mxfp4_scale(x[0]);
            nibbles32(x + 1, nib);
            for (int e = 0; e < 32; e++) {
                w[e] = kg_mxfp4_values[nib[e]];
            }
        }
        return;
    case KG_GGML_TYPE_Q4_1:
        for (int64_t b = 0; b < k / 32; b++, x += 20, w += 32) {
            d[b * N] = rd_half(x);
            dm[b * N] = rd_half(x + 2);
            nibbles32(x + 4, nib);
            for (int e = 0; e < 32; e++) {
                w[e] = (int8_t)nib[e];
            }
        }
        return;
    case KG_GGML_TYPE_Q5_0:
    case KG_GGML_TYPE_Q5_1: {
        const bool one = type == KG_GGML_TYPE_Q5_1;
        const size_t bs = one ? 24 : 22, off = one ? 4 : 2;
        for (int64_t b = 0; b < k / 32; b++, x += bs, w += 32) {
            d[b * N] = rd_half(x);
            if (one) {
                dm[b * N] = rd_half(x + 2);
            }
            uint32_t qh;
            memcpy(&qh, x + off, sizeof(qh));
            nibbles32(x + off + 4, nib);
            for (int e = 0; e < 32; e++) {
                const int v = nib[e] | (int)((qh >> e) & 1) << 4;
                w[e] = (int8_t)(one ? v : v - 16);
            }
        }
        return;
    }
    case KG_GGML_TYPE_Q8_0:
        for (int64_t b = 0; b < k / 32; b++, x += 34, w += 32) {
            d[b * N] = rd_half(x);
            memcpy(w, x + 2, 32);
        }
        return;
    case KG_GGML_TYPE_Q2_K:
        for (int64_t b = 0; b < k / 256; b++, x += 84, w += 256, sc += 8, mins += 16) {
            const uint8_t *scales = x, *qs = x + 16;
            d[b * N] = rd_half(x + 80);
            dm[b * N] = rd_half(x + 82);
            for (int e = 0; e < 256; e++) {
                w[e] = (int8_t)((qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3);
            }
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(scales[2 * c] & 15, scales[2 * c + 1] & 15);
            }
            for (int j = 0; j < 16; j++) {
                mins[j] = (int16_t)(scales[j] >> 4);
            }
        }
        return;
    case KG_GGML_TYPE_Q3_K:
        for (int64_t b = 0; b < k / 256; b++, x += 110, w += 256, sc += 8) {
            const uint8_t *hm = x, *qs = x + 32, *s = x + 96;
            d[b * N] = rd_half(x + 108);
            for (int e = 0; e < 256; e++) {
                const int q = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
                const int h = (hm[e % 32] >> (e / 32)) & 1;
                w[e] = (int8_t)(q + (h ? 4 : 0)); /* the value + 4 */
            }
            int s16[16];
            for (int j = 0; j < 16; j++) {
                const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
                const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                s16[j] = (lo | (hi << 4)) - 32;
            }
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(s16[2 * c], s16[2 * c + 1]);
            }
        }
        return;
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K: {
        const bool five = type == KG_GGML_TYPE_Q5_K;
        const size_t bs = five ? 176 : 144;
        for (int64_t b = 0; b < k / 256; b++, x += bs, w += 256, sc += 8, mins += 16) {
            const uint8_t *qh = x + 16, *ql = x + (five ? 48 : 16);
            d[b * N] = rd_half(x);
            dm[b * N] = rd_half(x + 2);
            for (int e = 0; e < 256; e++) {
                const uint8_t byte = ql[e / 64 * 32 + e % 32];
                int q = e % 64 < 32 ? (byte & 15) : (byte >> 4);
                if (five) {
                    q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
                }
                w[e] = (int8_t)q;
            }
            for (int j = 0; j < 8; j++) {
                int s, m;
                scale_min_k4(j, x + 4, &s, &m);
                sc[j] = pair16(s, s);
                mins[2 * (int64_t)j] = mins[2 * (int64_t)j + 1] = (int16_t)m;
            }
        }
        return;
    }
    case KG_GGML_TYPE_Q6_K:
        for (int64_t b = 0; b < k / 256; b++, x += 210, w += 256, sc += 8) {
            const uint8_t *ql = x, *qh = x + 128;
            const int8_t *s = (const int8_t *)(x + 192);
            d[b * N] = rd_half(x + 208);
            for (int e = 0; e < 256; e++) {
                const int half = e / 128, quarter = e % 128 / 32, l = e % 32;
                const uint8_t lb = ql[half * 64 + l + (quarter & 1) * 32];
                const int lo = quarter < 2 ? (lb & 15) : (lb >> 4);
                const int hi = (qh[half * 32 + l] >> (2 * quarter)) & 3;
                w[e] = (int8_t)(lo | (hi << 4)); /* the value + 32 */
            }
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(s[2 * c], s[2 * c + 1]);
            }
        }
        return;
    case KG_GGML_TYPE_IQ4_XS:
        for (int64_t b = 0; b < k / 256; b++, x += 136, w += 256, sc += 8) {
            uint16_t sh;
            memcpy(&sh, x + 2, sizeof(sh));
            d[b * N] = rd_half(x);
            for (int64_t ib = 0; ib < 8; ib++) {
                nibbles32(x + 8 + 16 * ib, nib);
                for (int e = 0; e < 32; e++) {
                    w[32 * ib + e] = kg_iq4nl_values[nib[e]];
                }
                const int ls =
                    ((x[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
                sc[ib] = pair16(ls - 32, ls - 32);
            }
        }
        return;
    default:
        return;
    }
}

// ---- AVX2 unpacking: the same values as unpack_row, 32 at a time ----
#ifdef QUANT_AVX2

#define QU_INLINE static inline __attribute__((always_inline))

/* 16 bytes of packed nibbles -> 32 values: low nibbles first (elements
 * 0-15), then high nibbles (16-31). */
QU_INLINE __m256i nibbles_avx2(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* Bit e of the 32-bit qh for e = 0..31, as 0x10 or 0 in byte e. */
QU_INLINE __m256i bits16_avx2(uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* bit c of each of the 32 bytes at hm, as 0/1 bytes */
QU_INLINE __m256i bit_plane(__m256i hm, int c) {
    return _mm256_and_si256(_mm256_srli_epi16(hm, c), _mm256_set1_epi8(1));
}

QU_INLINE void store32(int8_t *w, __m256i v) {
    _mm256_store_si256((__m256i *)(void *)w, v);
}

static bool
unpack_row_avx2(kg_ggml_type_t type, const uint8_t *x, int64_t k, int r, cpu_qpanel_t *p) {
    int8_t *w = p->w + (int64_t)r * k;
    uint32_t *sc = p->sc + (int64_t)r * (k / 32);
    int16_t *mins = p->mins + (int64_t)r * (k / 16);
    float *d = p->d + r, *dm = p->dm + r;
    const int N = CPU_QPANEL;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const __m256i iq4 = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)kg_iq4nl_values));
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        for (int64_t b = 0; b < k / 32; b++, x += 18, w += 32) {
            d[b * N] = rd_half(x);
            store32(w, _mm256_sub_epi8(nibbles_avx2(x + 2), _mm256_set1_epi8(8)));
        }
        return true;
    case KG_GGML_TYPE_IQ4_NL:
        for (int64_t b = 0; b < k / 32; b++, x += 18, w += 32) {
            d[b * N] = rd_half(x);
            store32(w, _mm256_shuffle_epi8(iq4, nibbles_avx2(x + 2)));
        }
        return true;
    case KG_GGML_TYPE_MXFP4: {
        const __m256i fp4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_mxfp4_values));
        for (int64_t b = 0; b < k / 32; b++, x += 17, w += 32) {
            d[b * N] = kg_mxfp4_scale(x[0]);
            store32(w, _mm256_shuffle_epi8(fp4, nibbles_avx2(x + 1)));
        }
        return true;
    }
    case KG_GGML_TYPE_Q4_1:
        for (int64_t b = 0; b < k / 32; b++, x += 20, w += 32) {
            d[b * N] = rd_half(x);
            dm[b * N] = rd_half(x + 2);
            store32(w, nibbles_avx2(x + 4));
        }
        return true;
    case KG_GGML_TYPE_Q5_0:
        for (int64_t b = 0; b < k / 32; b++, x += 22, w += 32) {
            uint32_t qh;
            memcpy(&qh, x + 2, sizeof(qh));
            d[b * N] = rd_half(x);
            const __m256i v = _mm256_or_si256(nibbles_avx2(x + 6), bits16_avx2(qh));
            store32(w, _mm256_sub_epi8(v, _mm256_set1_epi8(16)));
        }
        return true;
    case KG_GGML_TYPE_Q5_1:
        for (int64_t b = 0; b < k / 32; b++, x += 24, w += 32) {
            uint32_t qh;
            memcpy(&qh, x + 4, sizeof(qh));
            d[b * N] = rd_half(x);
            dm[b * N] = rd_half(x + 2);
            store32(w, _mm256_or_si256(nibbles_avx2(x + 8), bits16_avx2(qh)));
        }
        return true;
    case KG_GGML_TYPE_Q8_0:
        for (int64_t b = 0; b < k / 32; b++, x += 34, w += 32) {
            d[b * N] = rd_half(x);
            store32(w, _mm256_loadu_si256((const __m256i *)(const void *)(x + 2)));
        }
        return true;
    case KG_GGML_TYPE_Q2_K:
        for (int64_t b = 0; b < k / 256; b++, x += 84, w += 256, sc += 8, mins += 16) {
            d[b * N] = rd_half(x + 80);
            dm[b * N] = rd_half(x + 82);
            for (int64_t h = 0; h < 2; h++) {
                const __m256i q =
                    _mm256_loadu_si256((const __m256i *)(const void *)(x + 16 + 32 * h));
                for (int64_t s2 = 0; s2 < 4; s2++) {
                    store32(w + 128 * h + 32 * s2,
                            _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2));
                }
            }
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(x[2 * c] & 15, x[2 * c + 1] & 15);
            }
            const __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)x);
            _mm256_store_si256(
                (__m256i *)(void *)mins,
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f))));
        }
        return true;
    case KG_GGML_TYPE_Q3_K:
        for (int64_t b = 0; b < k / 256; b++, x += 110, w += 256, sc += 8) {
            d[b * N] = rd_half(x + 108);
            const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)x);
            for (int h = 0; h < 2; h++) {
                const __m256i q =
                    _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 + 32 * (int64_t)h));
                for (int s2 = 0; s2 < 4; s2++) {
                    const int c = 4 * h + s2;
                    /* the value + 4: q + 4 * hbit */
                    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2);
                    const __m256i hb = _mm256_slli_epi16(bit_plane(hm, c), 2);
                    store32(w + 32 * (int64_t)c, _mm256_add_epi8(lo, hb));
                }
            }
            const uint8_t *s3 = x + 96;
            int s16[16];
            for (int j = 0; j < 16; j++) {
                const int lo = j < 8 ? (s3[j] & 15) : (s3[j - 8] >> 4);
                const int hi = (s3[8 + j % 4] >> (2 * (j / 4))) & 3;
                s16[j] = (lo | (hi << 4)) - 32;
            }
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(s16[2 * c], s16[2 * c + 1]);
            }
        }
        return true;
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K: {
        const bool five = type == KG_GGML_TYPE_Q5_K;
        const size_t bs = five ? 176 : 144;
        for (int64_t b = 0; b < k / 256; b++, x += bs, w += 256, sc += 8, mins += 16) {
            d[b * N] = rd_half(x);
            dm[b * N] = rd_half(x + 2);
            const uint8_t *ql = x + (five ? 48 : 16);
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)(x + 16))
                                    : _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                const __m256i q =
                    _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32 * (int64_t)g));
                __m256i lo = _mm256_and_si256(q, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(bit_plane(qh, 2 * g), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(bit_plane(qh, 2 * g + 1), 4));
                }
                store32(w + 64 * (int64_t)g, lo);
                store32(w + 64 * (int64_t)g + 32, hi);
            }
            for (int j = 0; j < 8; j++) {
                int s6, m6;
                scale_min_k4(j, x + 4, &s6, &m6);
                sc[j] = pair16(s6, s6);
                mins[2 * (int64_t)j] = mins[2 * (int64_t)j + 1] = (int16_t)m6;
            }
        }
        return true;
    }
    case KG_GGML_TYPE_Q6_K:
        for (int64_t b = 0; b < k / 256; b++, x += 210, w += 256, sc += 8) {
            d[b * N] = rd_half(x + 208);
            for (int64_t h = 0; h < 2; h++) {
                const uint8_t *ql = x + 64 * h, *qhp = x + 128 + 32 * h;
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)qhp);
                const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                       _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
                for (int64_t q4 = 0; q4 < 4; q4++) {
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * q4), m2);
                    /* the value + 32 */
                    store32(w + 128 * h + 32 * q4,
                            _mm256_or_si256(lo[q4], _mm256_slli_epi16(hi, 4)));
                }
            }
            const int8_t *s6 = (const int8_t *)(x + 192);
            for (int64_t c = 0; c < 8; c++) {
                sc[c] = pair16(s6[2 * c], s6[2 * c + 1]);
            }
        }
        return true;
    case KG_GGML_TYPE_IQ4_XS:
        for (int64_t b = 0; b < k / 256; b++, x += 136, w += 256, sc += 8) {
            uint16_t sh;
            memcpy(&sh, x + 2, sizeof(sh));
            d[b * N] = rd_half(x);
            for (int64_t ib = 0; ib < 8; ib++) {
                store32(w + 32 * ib, _mm256_shuffle_epi8(iq4, nibbles_avx2(x + 8 + 16 * ib)));
                const int ls =
                    ((x[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
                sc[ib] = pair16(ls - 32, ls - 32);
            }
        }
        return true;
    default:
        return false;
    }
}
#endif

void cpu_quant_unpack(
    const cpu_qtraits_t *tr, const void *rows, size_t row_size, int n_rows, cpu_qpanel_t *p) {
    const int64_t k = p->k, nb = k / tr->blk;
    for (int r = 0; r < n_rows; r++) {
        const uint8_t *x = (const uint8_t *)rows + (size_t)r * row_size;
#ifdef QUANT_AVX2
        if (unpack_row_avx2(tr->type, x, k, r, p)) {
            continue;
        }
#endif
        unpack_row(tr->type, x, k, r, p);
    }
    if (tr->blk == 32 && !tr->nonneg) {
        for (int r = 0; r < n_rows; r++) {
            const int8_t *w = p->w + (int64_t)r * k;
            for (int64_t b = 0; b < nb; b++) {
                int32_t sum = 0;
                for (int e = 0; e < 32; e++) {
                    sum += w[32 * b + e];
                }
                p->corr[b * CPU_QPANEL + r] = -128 * sum;
            }
        }
    }
    for (int r = n_rows; r < CPU_QPANEL; r++) {
        /* padding rows: zero weights and zero scales give zero */
        memset(p->w + (int64_t)r * k, 0, (size_t)k);
        if (tr->scaled) {
            memset(p->sc + (int64_t)r * (k / 32), 0, (size_t)(k / 32) * sizeof(uint32_t));
        }
        if (tr->min_k) {
            memset(p->mins + (int64_t)r * (k / 16), 0, (size_t)(k / 16) * sizeof(int16_t));
        }
        for (int64_t b = 0; b < nb; b++) {
            p->d[b * CPU_QPANEL + r] = 0.0f;
            p->dm[b * CPU_QPANEL + r] = 0.0f;
            p->corr[b * CPU_QPANEL + r] = 0;
        }
    }
}
