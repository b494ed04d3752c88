/* gemm: the step's matrix products. Y(rows, n_out) = X(rows, n_in) · W^T
 * with W stored row-major as ggml does (one row per output), X in W's
 * element type, Y in F32. cuBLAS (through cublas_shim.h) does the work;
 * a skinny GEMV kernel takes 1..8 rows of 16-bit weights (decode steps of
 * small batches), where a weight-streaming warp per output row beats a
 * GEMM tile. */
#pragma once

#include "cuda_common.cuh"

typedef struct kg_cuda_mat {
    void *data; /* (n_out, n_in) row-major, element type dt */
    int32_t n_out, n_in;
    kg_cuda_dtype_t dt;
} kg_cuda_mat_t;

typedef struct kg_cuda_blas {
    const kg_cublas_api_t *api;
    kg_cublas_handle_t handle;
    bool gemv; /* use the GEMV kernel for <= KG_CUDA_GEMV_MAX_ROWS rows */
} kg_cuda_blas_t;

#define KG_CUDA_GEMV_MAX_ROWS 8

/** Load cuBLAS, create a handle bound to `stream` with a fixed workspace
 * (so that stream capture never makes cuBLAS allocate), default math (no
 * TF32). errstr gets one line on failure. */
kg_status_t kg_cuda_blas_init(kg_cuda_blas_t *blas,
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
