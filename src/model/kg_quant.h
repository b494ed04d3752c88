/* kg_quant: tensor element types: the table of GGUF block formats (sizes,
 * names), half-precision conversion and dequantization of every block
 * format kgen reads (ggml's layouts and formulas, bit for bit). The
 * quantizers are in kg_quantize.h. */
#pragma once

#include "kg_gguf.h"
#include "kg_quantize.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Elements per K-quant super-block (ggml's QK_K). */
#define KG_QK_K 256

/** Elements per block (1 for F32/F16/BF16, 32 for the Q*_0/Q*_1/IQ4_NL
 * formats, 256 for K-quants and IQ4_XS). 0 for a type kgen does not know. */
int64_t kg_type_block_elems(kg_ggml_type_t type);
/** Bytes per block. 0 for a type kgen does not know. */
size_t kg_type_block_size(kg_ggml_type_t type);
/** Bytes of a row of `n` elements; n must be a multiple of the block size. */
size_t kg_type_row_size(kg_ggml_type_t type, int64_t n);
/** True for the types kgen reads (the named kg_ggml_type_t values). */
bool kg_type_is_known(uint32_t type);
/** True for the block-quantized types (everything but F32, F16, BF16). */
bool kg_type_is_quantized(kg_ggml_type_t type);
/** ggml's name of any ggml type id ("q4_k", "iq2_xxs", ...), known to kgen
 * or not; NULL for an id ggml never assigned. */
const char *kg_type_name(uint32_t type);
/** The type named `name` (ggml's spelling, any case) when kgen knows it. */
bool kg_type_from_name(const char *name, kg_ggml_type_t *out);
/** The names of every type kgen reads, comma-separated (for messages). */
const char *kg_type_list(void);

/* The 16 values of the IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml's
 * kvalues_iq4nl). */
extern const int8_t kg_iq4nl_values[16];

float kg_fp16_to_fp32(uint16_t h);
uint16_t kg_fp32_to_fp16(float f); /* round to nearest even */
float kg_bf16_to_fp32(uint16_t h);
uint16_t kg_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/** Dequantize `n` elements of `type` at `src` into `dst`. `n` is a multiple
 * of the block size. Every format follows ggml-quants.c dequantize_row_*
 * operation for operation (no contraction into FMAs), so the floats equal
 * ggml's reference path bit for bit. @thread any */
void kg_dequantize(kg_ggml_type_t type, const void *src, float *dst, int64_t n);
