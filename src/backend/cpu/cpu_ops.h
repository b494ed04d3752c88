/* cpu_ops: the CPU backend's row operations (norms, activation rounding,
 * fp16 conversion); the GEMM is in cpu_gemm. */
#pragma once

#include "../../model/kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** y[r] = x[r] / rms(x[r]) * w for n_rows rows of n floats (ggml rms_norm
 * followed by the weight multiply; w NULL: none). x and y may alias. */
void cpu_rmsnorm_rows(
    const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);

/** Round activations the way ggml converts them before a matmul with
 * weights of `type` (F16 and BF16: to that precision; Q8_0, Q4_0 and MXFP4: to
 * Q8_0 blocks; K-quants: to Q8_K blocks; F32: copy), so the products we
 * compute equal llama.cpp's. Returns false when `type` needs no rounding
 * (dst untouched). */
bool cpu_round_activations(
    kg_ggml_type_t type, const float *x, float *dst, int64_t n_rows, int64_t n);

/** Whether cpu_round_activations rounds rows of n for weights of `type`
 * (what it returns), without doing it. */
bool cpu_activations_rounded(kg_ggml_type_t type, int64_t n);

/** ggml's GELU table: table[h] = fp16(gelu_tanh(fp16 value h)) for every
 * fp16 bit pattern h (ggml_table_gelu_f16). */
void cpu_gelu_table_init(uint16_t *table);

/** out = gelu(gate) * up for n floats, as ggml's CPU GeGLU computes it
 * (GGML_GELU_FP16): gate <= -10 gives 0, gate >= 10 gives gate * up, else
 * gate is rounded to fp16 and looked up in `table`. out may alias gate. */
void cpu_geglu(const uint16_t *table, const float *gate, const float *up, float *out, int64_t n);

/** Round floats to fp16 precision in place. */
void cpu_round_fp16(float *x, int64_t n);
/** fp32 -> fp16 storage and back. */
void cpu_fp32_to_fp16(const float *x, uint16_t *y, int64_t n);
void cpu_fp16_to_fp32(const uint16_t *x, float *y, int64_t n);

/** Ask for transparent huge pages over the 2 MiB-aligned interior of
 * [p, p + size) (THP "madvise" mode; a no-op where the kernel offers none).
 * For the big buffers touched for the first time while a step runs (the
 * KV cache as blocks are first handed out, the packed weights at load):
 * on 4 KiB pages each first write faults, 6% of a Qwen3-0.6B prefill. */
void cpu_advise_huge(void *p, size_t size);
