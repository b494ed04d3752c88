/* gemm: the step's matrix products. Y(rows, n_out) = X(rows, n_in) · W^T
 * with W stored row-major as ggml does (one row per output), X in W's
 * element type, Y in F32.
 *
 * Batch invariance: a job's logits must not depend on what shares its step
 * (README, design notes). So by default every product goes through one
 * kernel family (gemm.cu) whose configurations differ only in how output
 * tiles and K slices are spread over warps and blocks: each output element
 * is always the same sum, in slice order, of the same chains of 16-wide
 * tensor-core steps over k ascending within each slice (16-bit weights;
 * the slices are the weight's, kg_cuda_gemm_slice), or one chain of FMAs
 * over k in order (F32 weights), whatever the row count. cuBLAS picks algorithms (and split-K) by
 * shape, so a row's result changes with the number of rows; it stays
 * available as KGEN_CUDA_GEMM=cublas (faster prefill on Hopper, not
 * batch-invariant). */
#pragma once

#include "cuda_common.cuh"

extern "C" {
#include "../src/model/kg_gguf.h"
}

#define KG_CUDA_MAT_SEGS 4 /* qwen35's gated Q|K|V: queries, K, V, gates */

typedef struct kg_cuda_mat {
    void *data; /* (n_out, n_in) row-major, element type dt; a native matrix: its
                   blocks' bodies, then their tails (qblocks.cuh) */
    int32_t n_out, n_in;
    kg_cuda_dtype_t dt; /* the elements', and the activation's, type (BF16 when native) */
    int32_t qtype;      /* 0: elements of dt; else the GGUF block type (kg_ggml_type_t) kept
                           on the device, read by kg_cuda_gemm only */
    /* A fused matrix (Q|K|V, gate|up) whose parts have different types
     * (Q4_K_M's Q6_K attn_v beside Q4_K Q and K): n_seg row ranges stored
     * one after another from data, each in its own form (a native type's
     * blocks, or BF16), dt BF16 and qtype 0 for the whole; 0 otherwise. */
    int32_t n_seg;
    struct {
        int32_t row0, n_out, qtype;
        size_t offset; /* bytes from data */
    } seg[KG_CUDA_MAT_SEGS];
} kg_cuda_mat_t;

/** Where a native matrix's tails start (NULL for one of elements). */
const void *kg_cuda_mat_tail(const kg_cuda_mat_t *m);

/** Segment i of m as a matrix of its own. */
kg_cuda_mat_t kg_cuda_mat_seg(const kg_cuda_mat_t *m, int i);

/** Whether kg_cuda_gemm's MMA kernels read GGUF blocks of `type` as they are
 * (Q8_0, Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4) for a matrix of n_in
 * columns (a whole number of blocks a row). */
bool kg_cuda_gemm_native(int type, int32_t n_in);

/** Device bytes of a native (n_out, n_in) matrix of `type`: the file's. */
size_t kg_cuda_native_size(int type, int32_t n_out, int32_t n_in);

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

/* The partial sums of a decode GEMM's K slices (rows <= 16): at most
 * PART_COLS slices x output columns (kg_cuda_gemm_slice keeps to it). */
#define KG_CUDA_GEMM_PART_ROWS 16
#define KG_CUDA_GEMM_PART_COLS 16384

/** The K slice of a (n_out, n_in) weight: a multiple of 64 elements, the
 * same for every call on that weight whatever its row count (a property
 * of the weight, so a row's bits never depend on its batch). Slices make
 * decode (<= 16 rows) launch about 264 blocks (two waves of an H100's or
 * H200's 132 SMs) where the column tiles alone are fewer, each slice at
 * least 256 weights long, at most 16 of them and slices x n_out <=
 * KG_CUDA_GEMM_PART_COLS; n_in rounded up to 64 (one slice) otherwise. */
int32_t kg_cuda_gemm_slice(int32_t n_out, int32_t n_in);

typedef struct kg_cuda_blas {
    kg_cuda_gemm_mode_t mode;
    float *part;                /* MMA mode: the slices' partials (PART_ROWS x PART_COLS floats) */
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

/** y(rows, w->n_out) = x(rows, w->n_in) · w^T on `stream`. A native matrix
 * (w->qtype) needs the MMA mode; its result has the bits of the same
 * product on the BF16 matrix kg_cuda_weight_convert makes of its blocks. */
kg_status_t kg_cuda_gemm(const kg_cuda_blas_t *blas,
                         cudaStream_t stream,
                         const kg_cuda_mat_t *w,
                         const void *x,
                         float *y,
                         int32_t rows);
