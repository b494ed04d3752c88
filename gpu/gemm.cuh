/* gemm: the step's matrix products. Y(rows, n_out) = X(rows, n_in) · W^T
 * with W stored row-major as ggml does (one row per output), X in W's
 * element type, Y in F32.
 *
 * Batch invariance: a job's logits must not depend on what shares its step
 * (README, design notes). So by default every product goes through one
 * kernel family (gemm.cu) whose configurations differ only in how output
 * tiles are spread over warps and blocks: each output element is always
 * the same chain of 16-wide tensor-core steps over k in ascending order
 * (16-bit weights) or of FMAs over k in order (F32 weights), never split
 * over k, whatever the row count. cuBLAS picks algorithms (and split-K) by
 * shape, so a row's result changes with the number of rows; it stays
 * available as KGEN_CUDA_GEMM=cublas (faster prefill on Hopper, not
 * batch-invariant). */
#pragma once

#include "cuda_common.cuh"

extern "C" {
#include "../src/model/kg_gguf.h"
}

typedef struct kg_cuda_mat {
    void *data; /* (n_out, n_in) row-major, element type dt */
    int32_t n_out, n_in;
    kg_cuda_dtype_t dt;
} kg_cuda_mat_t;

/** The device type of a matrix of GGUF type `type` alone: F32 and F16 stay
 * (F32: exact parity with the CPU on test models), every other type is
 * dequantized (kg_dequantize) into BF16. */
kg_cuda_dtype_t kg_cuda_weight_dtype(kg_ggml_type_t type);

/** Convert n elements of `type` at src into dst as dt on the host: a copy
 * when the types agree, else kg_dequantize into f32 (n floats of scratch)
 * and rounding to nearest even (the weight upload's conversion). */
void kg_cuda_weight_convert(
    kg_ggml_type_t type, const void *src, int64_t n, kg_cuda_dtype_t dt, void *dst, float *f32);

typedef enum kg_cuda_gemm_mode {
    KG_CUDA_GEMM_MMA = 0, /* gemm.cu's batch-invariant kernels */
    KG_CUDA_GEMM_CUBLAS,  /* cuBLAS GemmEx */
} kg_cuda_gemm_mode_t;

typedef struct kg_cuda_blas {
    kg_cuda_gemm_mode_t mode;
    const kg_cublas_api_t *api; /* KG_CUDA_GEMM_CUBLAS only */
    kg_cublas_handle_t handle;
} kg_cuda_blas_t;

/** Set up the GEMMs. KG_CUDA_GEMM_CUBLAS loads cuBLAS and creates a handle
 * bound to `stream` with a fixed workspace (so that stream capture never
 * makes cuBLAS allocate) and default math (no TF32); the MMA mode needs
 * nothing. errstr gets one line on failure. */
kg_status_t kg_cuda_blas_init(kg_cuda_blas_t *blas,
                              kg_cuda_gemm_mode_t mode,
                              cudaStream_t stream,
                              void *workspace,
                              size_t workspace_size,
                              char *errstr,
                              size_t errstr_size);
void kg_cuda_blas_clear(kg_cuda_blas_t *blas);

/** y(rows, w->n_out) = x(rows, w->n_in) · w^T on `stream`. */
kg_status_t kg_cuda_gemm(const kg_cuda_blas_t *blas,
                         cudaStream_t stream,
                         const kg_cuda_mat_t *w,
                         const void *x,
                         float *y,
                         int32_t rows);
