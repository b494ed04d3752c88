/* cpu_ops: the CPU backend's row operations (norms, activation rounding,
 * fp16 conversion, GEMM through OpenBLAS, paged attention). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../model/kg_gguf.h"

/** y[r] = x[r] / rms(x[r]) * w for n_rows rows of n floats (ggml rms_norm
 * followed by the weight multiply). x and y may alias. */
void cpu_rmsnorm_rows(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);

/** Round activations the way ggml converts them before a matmul with
 * weights of `type` (F16 and BF16: to that precision; Q8_0 and Q4_0: to
 * Q8_0 blocks; K-quants: to Q8_K blocks; F32: copy), so the products we
 * compute equal llama.cpp's. Returns false when `type` needs no rounding
 * (dst untouched). */
bool cpu_round_activations(kg_ggml_type_t type, const float *x, float *dst, int64_t n_rows,
                           int64_t n);

/** Round floats to fp16 precision in place. */
void cpu_round_fp16(float *x, int64_t n);
/** fp32 -> fp16 storage and back. */
void cpu_fp32_to_fp16(const float *x, uint16_t *y, int64_t n);
void cpu_fp16_to_fp32(const uint16_t *x, float *y, int64_t n);
/** Dot product of a float vector with an fp16 vector. */
float cpu_dot_f32_f16(const float *x, const uint16_t *y, int64_t n);
/** y += a * x for an fp16 vector x. */
void cpu_axpy_f16(float a, const uint16_t *x, float *y, int64_t n);

/* Rows of a GEMM are computed in tiles of this many (see cpu_matmul). */
#define KG_CPU_ROW_TILE 12

/** Round a row count up to whole tiles. */
static inline int64_t cpu_rows_padded(int64_t m) {
    return (m + KG_CPU_ROW_TILE - 1) / KG_CPU_ROW_TILE * KG_CPU_ROW_TILE;
}

struct kg_pool;

/** C(m, n) = A(m, k) · W(n, k)^T, all row-major F32: every output row is one
 * input row times the weight matrix in ggml layout (rows = outputs).
 *
 * Batch invariance: OpenBLAS computes the rows of a partial row tile with
 * edge kernels whose summation order differs from the full tiles' (measured:
 * a row's result changes with m unless m is a multiple of 12), and its
 * threads split the rows. So the GEMM always runs on cpu_rows_padded(m)
 * rows (A and C must have that many; the extra rows are ignored scratch)
 * and is parallelised over the output columns instead: each pool thread runs
 * a single-threaded sgemm on its slice of W. A row's result then depends on
 * its own input only, never on how many tokens share the step. */
void cpu_matmul(struct kg_pool *pool, const float *a, const float *w, float *c, int64_t m,
                int64_t n, int64_t k);
