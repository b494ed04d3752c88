/* cuda_common: what every file of the CUDA backend shares: error checks,
 * the 16/32-bit element helpers and block-wide reductions.
 *
 * Plain CUDA C++ (docs/CONVENTIONS.md §3): no exceptions, no STL, no `new`.
 * Every CUDA and cuBLAS call goes through KG_CUDA_CHECK / KG_CUBLAS_CHECK,
 * which log the statement, the place and the error text and make the
 * enclosing function return KG_ERR_BACKEND (ggml's CUDA_CHECK_GEN, minus
 * the abort): the backend then marks itself dead (kg_backend_cuda_step.cu). */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "../src/backend/kg_math.h"
#include "../src/core/kg_log.h"
#include "../src/core/kg_status.h"
}

#include "cublas_shim.h"

#define KG_CUDA_CHECK(expr)                                                                        \
    do {                                                                                           \
        cudaError_t kg_cuda_err_ = (expr);                                                         \
        if (kg_cuda_err_ != cudaSuccess) {                                                         \
            KG_LOG_ERROR("cuda", "%s failed: %s: %s (%s:%d)", #expr,                               \
                         cudaGetErrorName(kg_cuda_err_), cudaGetErrorString(kg_cuda_err_),         \
                         __FILE__, __LINE__);                                                      \
            return KG_ERR_BACKEND;                                                                 \
        }                                                                                          \
    } while (0)

#define KG_CUBLAS_CHECK(expr)                                                                      \
    do {                                                                                           \
        kg_cublas_status_t kg_cublas_st_ = (expr);                                                 \
        if (kg_cublas_st_ != KG_CUBLAS_STATUS_SUCCESS) {                                           \
            KG_LOG_ERROR("cuda", "%s failed: cuBLAS status %d: %s (%s:%d)", #expr,                 \
                         (int)kg_cublas_st_, kg_cublas_status_str(kg_cublas_st_), __FILE__,        \
                         __LINE__);                                                                \
            return KG_ERR_BACKEND;                                                                 \
        }                                                                                          \
    } while (0)

/* A status-returning call inside a status-returning function. */
#define KG_TRY(expr)                                                                               \
    do {                                                                                           \
        kg_status_t kg_try_st_ = (expr);                                                           \
        if (kg_try_st_ != KG_OK) {                                                                 \
            return kg_try_st_;                                                                     \
        }                                                                                          \
    } while (0)

/* Launch errors (bad configuration, no kernel image for this GPU) show up
 * in cudaGetLastError right after the launch. */
#define KG_CUDA_CHECK_LAUNCH() KG_CUDA_CHECK(cudaGetLastError())

// ---- element types of weights and activations ----

/* How a weight matrix is stored on the device; the activation entering a
 * GEMM is stored in the same type (cuBLAS needs A and B of one type, and
 * it matches the CPU backend, which rounds activations to the weight type). */
typedef enum kg_cuda_dtype {
    KG_CUDA_BF16 = 0,
    KG_CUDA_F16 = 1,
    KG_CUDA_F32 = 2,
} kg_cuda_dtype_t;

static inline size_t kg_cuda_dtype_size(int dt) {
    return dt == KG_CUDA_F32 ? 4 : 2;
}

/** Element i of a buffer of type dt, as float. */
__device__ __forceinline__ float kg_ld(const void *p, int64_t i, int dt) {
    if (dt == KG_CUDA_F32) {
        return ((const float *)p)[i];
    }
    const uint16_t u = ((const uint16_t *)p)[i];
    return dt == KG_CUDA_F16 ? __half2float(__ushort_as_half(u))
                             : __bfloat162float(__ushort_as_bfloat16(u));
}

/** Store x (rounded to nearest even for the 16-bit types) as element i. */
__device__ __forceinline__ void kg_st(void *p, int64_t i, float x, int dt) {
    if (dt == KG_CUDA_F32) {
        ((float *)p)[i] = x;
    } else if (dt == KG_CUDA_F16) {
        ((uint16_t *)p)[i] = __half_as_ushort(__float2half_rn(x));
    } else {
        ((uint16_t *)p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
}

// ---- the step's inputs on the device ----

/* The per-step scalars kernels read from device memory rather than from
 * launch arguments, so one captured CUDA graph serves every decode step of
 * its batch-size bucket (kg_backend_cuda_step.cu, "Graphs"). */
typedef struct kg_cuda_step_hdr {
    int32_t n_tokens;  /* real tokens; launches may cover a padded bucket */
    int32_t n_outputs; /* rows that want logits */
    int32_t n_tiles;   /* attention query tiles (attention.cuh) */
    int32_t pad;
} kg_cuda_step_hdr_t;

/* Device views of one step's inputs, all inside one buffer uploaded with
 * one copy. Token t's K/V row for position p is
 * table[tbl_off[t] + p / block_size] * block_size + p % block_size. An
 * attention tile is a run of consecutive tokens of one sequence at
 * consecutive positions (a decode token alone, or part of a prefill chunk):
 * tokens tile_tok0[i] .. tile_tok0[i] + tile_n[i] - 1. */
typedef struct kg_cuda_inputs {
    const kg_cuda_step_hdr_t *hdr;
    const int32_t *token;     /* (cap) */
    const int32_t *pos;       /* (cap) */
    const int32_t *tbl_off;   /* (cap) offset of the token's sequence in `table` */
    const int32_t *out_row;   /* (cap) token index of output row i */
    const int32_t *tile_tok0; /* (cap) first token of tile i */
    const int32_t *tile_n;    /* (cap) tokens of tile i */
    const int32_t *pos_end;   /* (cap) a non-causal model's (gemma-embedding): one past the last
                                 position of the token's input, which the step holds whole;
                                 read only by such a model's attention */
    const int32_t *seq;       /* (cap) the token's slot (a hybrid's recurrent state) */
    const int32_t *table;     /* compacted block tables of the step's sequences */
} kg_cuda_inputs_t;

#define KG_CUDA_INPUT_ARRAYS 8 /* per-slot arrays after the header */

/* The inputs packed for `cap` token slots at `base`: header (4 ints),
 * token, pos, tbl_off, out_row, tile_tok0, tile_n, pos_end, seq (cap
 * each), then the table. */
static inline kg_cuda_inputs_t kg_cuda_inputs_view(const int32_t *base, int32_t cap) {
    kg_cuda_inputs_t in;
    in.hdr = (const kg_cuda_step_hdr_t *)base;
    in.token = base + 4;
    in.pos = in.token + cap;
    in.tbl_off = in.pos + cap;
    in.out_row = in.tbl_off + cap;
    in.tile_tok0 = in.out_row + cap;
    in.tile_n = in.tile_tok0 + cap;
    in.pos_end = in.tile_n + cap;
    in.seq = in.pos_end + cap;
    in.table = in.seq + cap;
    return in;
}

// ---- reductions ----

__device__ __forceinline__ float kg_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

__device__ __forceinline__ double kg_warp_sum_d(double x) {
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

__device__ __forceinline__ float kg_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    }
    return x;
}

/** Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result. `red` is 32 doubles of shared memory. */
__device__ __forceinline__ double kg_block_sum_d(double x, double *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    x = kg_warp_sum_d(x);
    __syncthreads(); /* red may still be read by a previous reduction */
    if (lane == 0) {
        red[warp] = x;
    }
    __syncthreads();
    x = lane < n_warps ? red[lane] : 0.0;
    return kg_warp_sum_d(x);
}
