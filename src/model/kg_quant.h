/* kg_quant: tensor element types: sizes, half-precision conversion and
 * dequantization of GGUF block formats (ggml's layouts, bit for bit). */
#pragma once

#include "kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Elements per block (1 for F32/F16/BF16, 32 for Q4_0/Q8_0, 256 for K-quants). */
int64_t kg_type_block_elems(kg_ggml_type_t type);
/** Bytes per block. 0 for an unknown type. */
size_t kg_type_block_size(kg_ggml_type_t type);
/** Bytes of a row of `n` elements; n must be a multiple of the block size. */
size_t kg_type_row_size(kg_ggml_type_t type, int64_t n);
bool kg_type_is_known(uint32_t type);

float kg_fp16_to_fp32(uint16_t h);
uint16_t kg_fp32_to_fp16(float f); /* round to nearest even */
float kg_bf16_to_fp32(uint16_t h);
uint16_t kg_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/** Dequantize `n` elements of `type` at `src` into `dst`. `n` is a multiple
 * of the block size. @thread any */
void kg_dequantize(kg_ggml_type_t type, const void *src, float *dst, int64_t n);

/** Quantize `n` floats into `type` (F32, F16, BF16, Q8_0, Q4_0, MXFP4). Used by the
 * GGUF writer and tests. Returns false for a type it cannot produce. */
bool kg_quantize(kg_ggml_type_t type, const float *src, void *dst, int64_t n);
