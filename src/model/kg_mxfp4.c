/* kg_mxfp4: MXFP4 blocks (see kg_mxfp4.h). */
#include "kg_mxfp4.h"

#include <math.h>
#include <string.h>

const int8_t kg_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float kg_mxfp4_scale(uint8_t e) {
    /* e < 2: the subnormals 2^-128 (0x00200000) and 2^-127 (0x00400000);
     * else the normal number with exponent field e - 1 */
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

void kg_mxfp4_dequantize(const void *src, float *dst, int64_t n) {
    const uint8_t *x = src;
    for (int64_t b = 0; b < n / KG_MXFP4_BLOCK_ELEMS; b++, x += KG_MXFP4_BLOCK_SIZE) {
        const float d = kg_mxfp4_scale(x[0]);
        const uint8_t *qs = x + 1;
        float *y = dst + b * KG_MXFP4_BLOCK_ELEMS;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)kg_mxfp4_values[qs[j] & 0x0f] * d;
            y[j + 16] = (float)kg_mxfp4_values[qs[j] >> 4] * d;
        }
    }
}

/* The code whose value times d is nearest x; the lowest code on a tie
 * (ggml's best_index_mxfp4). */
static uint8_t best_code(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)kg_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)kg_mxfp4_values[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

void kg_mxfp4_quantize(const float *src, void *dst, int64_t n) {
    uint8_t *y = dst;
    for (int64_t b = 0; b < n / KG_MXFP4_BLOCK_ELEMS; b++, y += KG_MXFP4_BLOCK_SIZE) {
        const float *x = src + b * KG_MXFP4_BLOCK_ELEMS;
        float amax = 0.0f;
        for (int j = 0; j < KG_MXFP4_BLOCK_ELEMS; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
            }
        }
        /* d = 2^(floor(log2 amax) - 3): amax / d lies in [8, 16), so the
         * largest element takes the value 8 or 12 (E2M1's 4 or 6) */
        const uint8_t e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = kg_mxfp4_scale(e);
        y[0] = e;
        for (int j = 0; j < 16; j++) {
            y[1 + j] = (uint8_t)(best_code(x[j], d) | (best_code(x[j + 16], d) << 4));
        }
    }
}
