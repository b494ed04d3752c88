/* kg_mxfp4: the MXFP4 block format (OCP microscaling FP4, ggml's
 * GGML_TYPE_MXFP4 = 39), the type gpt-oss ships its expert weights in.
 *
 * A block holds 32 elements in 17 bytes: one E8M0 scale byte e (a power of
 * two, 2^(e - 127)), then 16 bytes of 4-bit E2M1 codes, element j in the
 * low nibble of byte j and element j + 16 in the high nibble (the Q4_0
 * order). ggml stores the E2M1 values doubled as integers (0, 1, 2, 3, 4,
 * 6, 8, 12 and their negatives) and halves the scale instead, so an element
 * is kvalues[code] * 2^(e - 128): exact in F32 (a subnormal below e = 2).
 * Dequantization and quantization follow ggml-quants.c
 * (dequantize_row_mxfp4, quantize_row_mxfp4_ref) operation for operation. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_MXFP4_BLOCK_ELEMS 32
#define KG_MXFP4_BLOCK_SIZE  17

/* The doubled E2M1 values by 4-bit code (ggml's kvalues_mxfp4). */
extern const int8_t kg_mxfp4_values[16];

/** 2^(e - 128): the scale of a block with exponent byte e, halved as ggml
 * halves it (GGML_E8M0_TO_FP32_HALF), built from its bits. */
float kg_mxfp4_scale(uint8_t e);

/** Dequantize n elements (a multiple of 32) of MXFP4 blocks at src. */
void kg_mxfp4_dequantize(const void *src, float *dst, int64_t n);

/** Quantize n floats (a multiple of 32) into MXFP4 blocks as ggml's
 * reference quantizer does: the exponent floor(log2(amax)) - 2 + 127 (0
 * for an all-zero block), each element the code of least error (the first
 * on a tie). */
void kg_mxfp4_quantize(const float *src, void *dst, int64_t n);
