/* kg_quantize: float rows to GGUF blocks.
 *
 * Each quantizer follows the algorithm llama-quantize runs without an
 * importance matrix (ggml-quants.c quantize_row_*_ref, and for IQ4_NL and
 * IQ4_XS quantize_iq4_*, whose search llama-quantize always runs): the same
 * scale searches, the same float expressions in the same order, the same
 * rounding (ggml's nearest_int rounds half to even, roundf half away from
 * zero, and a float-to-int cast truncates). So the blocks equal what
 * llama-quantize writes for the same floats, and a model written by
 * `kgen mkmodel --type` is the file a user would get from llama.cpp's tools.
 * The block layouts are listed in kg_quant.c. */
#include "kg_quantize.h"

#include "kg_mxfp4.h"
#include "kg_quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Below this a group counts as all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

// ---- helpers ----

static void put_half(uint8_t *p, float f) {
    uint16_t h = kg_fp32_to_fp16(f);
    memcpy(p, &h, sizeof(h));
}

static float half_round(float f) {
    return kg_fp16_to_fp32(kg_fp32_to_fp16(f));
}

/* Round to the nearest integer, ties to even, for |f| <= 2^22: adding
 * 1.5 * 2^23 leaves the integer in the low mantissa bits (ggml's
 * nearest_int). */
static int nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

static int imin(int a, int b) {
    return a < b ? a : b;
}

static int imax(int a, int b) {
    return a > b ? a : b;
}

/* Pack 256 2-bit values: element 32 s + l of each 128-element half goes to
 * bits 2 s of byte l of the half's 32 bytes. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < KG_QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
        }
    }
}

// ---- block-32 formats ----

/* the first of the 32 values of largest magnitude, with its sign (ggml's scan) */
static float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void quant_q4_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 18) {
        /* the value of largest magnitude maps to -8 exactly, keeping its sign */
        const float max = signed_absmax(x);
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        for (int j = 0; j < 16; j++) {
            const int q0 = imin(15, (int8_t)(x[j] * id + 8.5f));
            const int q1 = imin(15, (int8_t)(x[j + 16] * id + 8.5f));
            y[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* min and max of 32 values, starting from +-FLT_MAX as ggml does */
static void min_max(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < *min) {
            *min = x[j];
        }
        if (x[j] > *max) {
            *max = x[j];
        }
    }
}

static void quant_q4_1(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 20) {
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        put_half(y + 2, min);
        for (int j = 0; j < 16; j++) {
            // ggml's quantize_row_q4_1_ref rounds so (x - min >= 0 here); lroundf
            // would differ on ties and break bit-exactness with ggml.
            // NOLINTNEXTLINE(bugprone-incorrect-roundings)
            const int q0 = imin(15, (int8_t)((x[j] - min) * id + 0.5f));
            // NOLINTNEXTLINE(bugprone-incorrect-roundings)
            const int q1 = imin(15, (int8_t)((x[j + 16] - min) * id + 0.5f));
            y[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_q5_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 22) {
        const float max = signed_absmax(x);
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = (uint8_t)imin(31, (int8_t)(x[j] * id + 16.5f));
            const uint8_t q1 = (uint8_t)imin(31, (int8_t)(x[j + 16] * id + 16.5f));
            y[6 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 & 0x10u) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y + 2, &qh, sizeof(qh));
    }
}

static void quant_q5_1(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 24) {
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        put_half(y + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            /* no clamp here in ggml: (max - min) * id rounds to at most 31 */
            const uint8_t q0 = (uint8_t)((x[j] - min) * id + 0.5f);
            const uint8_t q1 = (uint8_t)((x[j + 16] - min) * id + 0.5f);
            y[8 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 & 0x10u) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y + 4, &qh, sizeof(qh));
    }
}

static void quant_q8_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(y, d);
        for (int j = 0; j < 32; j++) {
            y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
    }
}

// ---- scale searches of the K-quants ----

/* Symmetric n-value group on [-nmax, nmax - 1] with weights x^2: the best
 * of 19 scales around nmax / max by weighted least squares (ggml's
 * make_qx_quants with rmse_type 1). L gets q + nmax; returns the scale. */
static float make_qx(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) {
            continue;
        }
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric group for q3_k (ggml's make_q3_quants with do_rmse): start from
 * nmax / max, then move single values while the weighted fit improves (at
 * most 5 passes). L gets q + nmax; returns the scale. */
static float make_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = imax(-nmax, imin(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) {
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        L[i] = (int8_t)(L[i] + nmax);
    }
    return sumlx / suml2;
}

/* Asymmetric group x ~ scale * L - min with L in [0, nmax] (ggml's
 * make_qkx2_quants): weighted least squares of scale and min for nstep + 1
 * scale candidates, keeping the one with the smallest weighted error
 * (absolute when use_mad, squared otherwise). *the_min gets the min as a
 * positive offset; returns the scale. */
static float make_qkx2(int n,
                       int nmax,
                       const float *x,
                       const float *weights,
                       uint8_t *L,
                       float *the_min,
                       uint8_t *Laux,
                       float rmin,
                       float rdelta,
                       int nstep,
                       bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) {
            min = x[i];
        }
        if (x[i] > max) {
            max = x[i];
        }
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) {
        min = 0;
    }
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_mad = 0;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_mad += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float mad = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                mad += weights[i] * diff;
            }
            if (mad < best_mad) {
                memcpy(L, Laux, (size_t)n);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// ---- K-quants ----

static void quant_q2_k(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[KG_QK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    const float q4scale = 15.0f;
    for (int64_t i = 0; i < nb; i++, x += KG_QK_K, y += 84) {
        uint8_t *sc = y, *qs = y + 16;
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) {
                weights[l] = fabsf(x[16 * j + l]);
            }
            // j < 16: the sub-block offset 16 * j stays below KG_QK_K, no overflow
            // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
            scales[j] = make_qkx2(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                  0.1f, 15, true);
            if (scales[j] > max_scale) {
                max_scale = scales[j];
            }
            if (mins[j] > max_min) {
                max_min = mins[j];
            }
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++) {
                sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
            }
            put_half(y + 80, max_scale / q4scale);
        } else {
            memset(sc, 0, 16);
            put_half(y + 80, 0.0f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++) {
                sc[j] = (uint8_t)(sc[j] | (nearest_int(iscale * mins[j]) << 4));
            }
            put_half(y + 82, max_min / q4scale);
        } else {
            put_half(y + 82, 0.0f);
        }
        const float dh = half_round(max_scale > 0 ? max_scale / q4scale : 0.0f);
        const float mh = half_round(max_min > 0 ? max_min / q4scale : 0.0f);
        for (int j = 0; j < 16; j++) {
            const float d = dh * (float)(sc[j] & 0x0f);
            if (d == 0.0f) {
                continue;
            }
            const float dm = mh * (float)(sc[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
            }
        }
        pack_2bit(L, qs);
    }
}

static void quant_q3_k(const float *x, uint8_t *y, int64_t nb) {
    int8_t L[KG_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += KG_QK_K, y += 110) {
        uint8_t *hmask = y, *qs = y + 32, *sc = y + 96;
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            // j < 16: the sub-block offset 16 * j stays below KG_QK_K, no overflow
            // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
            scales[j] = make_q3(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(sc, 0, 12);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                int l = imax(-32, imin(31, (int8_t)nearest_int(iscale * scales[j]))) + 32;
                if (j < 8) {
                    sc[j] = (uint8_t)(l & 0x0f);
                } else {
                    sc[j - 8] = (uint8_t)(sc[j - 8] | ((l & 0x0f) << 4));
                }
                l >>= 4;
                sc[j % 4 + 8] = (uint8_t)(sc[j % 4 + 8] | (l << (2 * (j / 4))));
            }
            put_half(y + 108, 1 / iscale);
        } else {
            put_half(y + 108, 0.0f);
        }
        float dh;
        {
            uint16_t h;
            memcpy(&h, y + 108, sizeof(h));
            dh = kg_fp16_to_fp32(h);
        }
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? (sc[j] & 0x0f) : (sc[j - 8] >> 4);
            const int s = (lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = dh * (float)s;
            if (d == 0.0f) {
                continue;
            }
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
            }
        }
        /* high bit of element j: byte j % 32, bit j / 32 */
        memset(hmask, 0, 32);
        uint8_t Lu[KG_QK_K];
        for (int j = 0; j < KG_QK_K; j++) {
            // L holds small quant levels (0..7), not characters
            int l = L[j]; // NOLINT(bugprone-signed-char-misuse,cert-str34-c)
            if (l > 3) {
                hmask[j % 32] = (uint8_t)(hmask[j % 32] | (1 << (j / 32)));
                l -= 4;
            }
            Lu[j] = (uint8_t)l;
        }
        pack_2bit(Lu, qs);
    }
}

/* The 8 6-bit scale/min pairs of q4_k and q5_k into their 12 bytes (the
 * inverse of kg_quant.c's scale_min_k4). */
static void pack_scale_min_k4(const uint8_t *ls, const uint8_t *lm, uint8_t *s) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
            s[j - 4] = (uint8_t)(s[j - 4] | ((ls[j] >> 4) << 6));
            s[j] = (uint8_t)(s[j] | ((lm[j] >> 4) << 6));
        }
    }
}

/* The part q4_k and q5_k share: sub-block scale searches (nmax 15 or 31),
 * the 6-bit scales, then L requantized against the stored scales. */
static void quant_k4_scales(const float *x,
                            int nmax,
                            float rmin,
                            int nstep,
                            uint8_t *dmin_scales /* d, dmin, scales[12] */,
                            uint8_t *L) {
    uint8_t Laux[32], ls[8], lm[8];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) {
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        }
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) {
            weights[l] = av_x + fabsf(x[32 * j + l]);
        }
        // j < 8: the sub-block offset 32 * j stays below KG_QK_K, no overflow
        // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
        scales[j] = make_qkx2(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                              nstep, false);
        if (scales[j] > max_scale) {
            max_scale = scales[j];
        }
        if (mins[j] > max_min) {
            max_min = mins[j];
        }
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        /* a uint8_t conversion wraps, then the clamp: ggml's order */
        ls[j] = (uint8_t)imin(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        lm[j] = (uint8_t)imin(63, (uint8_t)nearest_int(inv_min * mins[j]));
    }
    pack_scale_min_k4(ls, lm, dmin_scales + 4);
    put_half(dmin_scales, max_scale / 63.0f);
    put_half(dmin_scales + 2, max_min / 63.0f);
    const float dh = half_round(max_scale / 63.0f), mh = half_round(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        const float d = dh * (float)ls[j];
        if (d == 0.0f) {
            continue;
        }
        const float dm = mh * (float)lm[j];
        for (int ii = 0; ii < 32; ii++) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void quant_q4_k(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[KG_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KG_QK_K, y += 144) {
        quant_k4_scales(x, 15, -1.0f, 20, y, L);
        uint8_t *q = y + 16;
        for (int j = 0; j < KG_QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) {
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            }
        }
    }
}

static void quant_q5_k(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[KG_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KG_QK_K, y += 176) {
        quant_k4_scales(x, 31, -0.5f, 15, y, L);
        uint8_t *qh = y + 16, *ql = y + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < KG_QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *y, int64_t nb) {
    int8_t L[KG_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += KG_QK_K, y += 210) {
        uint8_t *ql = y, *qh = y + 128;
        int8_t *sc = (int8_t *)(y + 192);
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            // ib < 16: the sub-block offset 16 * ib stays below KG_QK_K, no overflow
            // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
            scales[ib] = make_qx(16, 32, x + 16 * ib, L + 16 * ib);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_EPS) {
            memset(y, 0, 210);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        put_half(y + 208, 1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            sc[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
        }
        const float dh = half_round(1 / iscale);
        for (int j = 0; j < 16; j++) {
            const float d = dh * (float)sc[j];
            if (d == 0.0f) {
                continue;
            }
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }
        for (int j = 0; j < KG_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = (uint8_t)(L[j + l] & 0x0f);
                const uint8_t q2 = (uint8_t)(L[j + l + 32] & 0x0f);
                const uint8_t q3 = (uint8_t)(L[j + l + 64] & 0x0f);
                const uint8_t q4 = (uint8_t)(L[j + l + 96] & 0x0f);
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

// ---- non-linear 4-bit (IQ4_NL, IQ4_XS) ----

/* Index of the grid value nearest to x (ties to the lower one). */
static int best_index(const int8_t *val, float x) {
    if (x <= (float)val[0]) {
        return 0;
    }
    if (x >= (float)val[15]) {
        return 15;
    }
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < (float)val[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    return x - (float)val[mu - 1] < (float)val[mu] - x ? mu - 1 : mu;
}

/* One super-block of `sbs` elements in sub-blocks of 32, weights x^2, a
 * search over 15 scales per sub-block (ggml's quantize_row_iq4_nl_impl with
 * ntry 7, no importance matrix). sbs 32: IQ4_NL (one fp16 scale); sbs 256:
 * IQ4_XS (a fp16 super-scale and 6-bit sub-block scales). */
static void quant_iq4(const float *x, int sbs, uint8_t *dh, uint8_t *q4, uint8_t *scales_hl) {
    const int8_t *values = kg_iq4nl_values;
    const int ntry = 7, nsub = sbs / 32;
    uint8_t L[KG_QK_K];
    float weight[32], scales[8];
    memset(q4, 0, (size_t)sbs / 2);
    put_half(dh, 0.0f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nsub; ib++) {
        // ib < nsub <= KG_QK_K / 32: the offset ib * 32 stays below KG_QK_K, no overflow
        // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
        const float *xb = x + ib * 32;
        // NOLINTNEXTLINE(bugprone-implicit-widening-of-multiplication-result)
        uint8_t *Lb = L + ib * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            weight[j] = xb[j] * xb[j];
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / (float)values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = best_index(values, id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = (float)values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumqx / sumq2;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (float)(itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float q = (float)values[best_index(values, id * xb[j])], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    if (nsub > 1) {
        /* IQ4_XS: scales_h (u16, 2 bits per sub-block) then scales_l[4] (a
         * nibble per sub-block), 6-bit values biased by 32 */
        uint16_t scales_h = 0;
        uint8_t *scales_l = scales_hl + 2;
        memset(scales_l, 0, 4);
        const float d = -max_scale / 32;
        put_half(dh, d);
        const float id = d != 0.0f ? 1 / d : 0.0f;
        for (int ib = 0; ib < nsub; ib++) {
            int l = imax(-32, imin(31, nearest_int(id * scales[ib])));
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1 / dl : 0.0f;
            for (int j = 0; j < 32; j++) {
                L[ib * 32 + j] = (uint8_t)best_index(values, idl * x[ib * 32 + j]);
            }
            l += 32;
            if (ib % 2 == 0) {
                scales_l[ib / 2] = (uint8_t)(l & 0x0f);
            } else {
                scales_l[ib / 2] = (uint8_t)(scales_l[ib / 2] | ((l & 0x0f) << 4));
            }
            scales_h = (uint16_t)(scales_h | ((l >> 4) << (2 * ib)));
        }
        memcpy(scales_hl, &scales_h, sizeof(scales_h));
    } else {
        put_half(dh, scales[0]);
        const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
        for (int j = 0; j < 32; j++) {
            L[j] = (uint8_t)best_index(values, id * x[j]);
        }
    }
    for (int i = 0; i < sbs / 32; i++) {
        for (int j = 0; j < 16; j++) {
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
        }
    }
}

// ---- dispatch ----

bool kg_quantize(kg_ggml_type_t type, const float *src, void *dst, int64_t n) {
    uint8_t *y = dst;
    const int64_t blck = kg_type_block_elems(type);
    if (blck == 0 || n < 0 || n % blck != 0) {
        return false;
    }
    const int64_t nb = n / blck;
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
    case KG_GGML_TYPE_Q4_0:
        quant_q4_0(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q4_1:
        quant_q4_1(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q5_0:
        quant_q5_0(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q5_1:
        quant_q5_1(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q8_0:
        quant_q8_0(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q2_K:
        quant_q2_k(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q3_K:
        quant_q3_k(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q4_K:
        quant_q4_k(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q5_K:
        quant_q5_k(src, y, nb);
        return true;
    case KG_GGML_TYPE_Q6_K:
        quant_q6_k(src, y, nb);
        return true;
    case KG_GGML_TYPE_IQ4_NL:
        for (int64_t i = 0; i < nb; i++) {
            quant_iq4(src + 32 * i, 32, y + 18 * i, y + 18 * i + 2, NULL);
        }
        return true;
    case KG_GGML_TYPE_IQ4_XS:
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *b = y + 136 * i;
            quant_iq4(src + KG_QK_K * i, KG_QK_K, b, b + 8, b + 2);
        }
        return true;
    case KG_GGML_TYPE_MXFP4:
        kg_mxfp4_quantize(src, y, n);
        return true;
    }
    return false;
}
