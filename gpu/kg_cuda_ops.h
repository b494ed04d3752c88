/* kg_cuda_ops: single CUDA kernels driven from host memory, for the tests
 * (tests/unit/check_cuda.c compares each with the CPU ops). Each call
 * allocates, copies, runs one kernel family on the default stream and
 * copies back: slow by design, never used by the backend. Compiles as C11
 * and as CUDA C++. */
#pragma once

#include "../src/backend/kg_backend.h"
#include "../src/core/kg_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the 16/32-bit activations (kg_cuda_dtype_t). */
enum { KG_CUDA_OP_BF16 = 0, KG_CUDA_OP_F16 = 1, KG_CUDA_OP_F32 = 2 };

typedef struct kg_cuda_op_attn {
    int32_t n_head, n_head_kv, head_dim, n_rot, block_size;
    float rope_base, rope_scale;
    int32_t n_tokens;
    const int32_t *pos;     /* (n_tokens) */
    const int32_t *tbl_off; /* (n_tokens) offset of the token's block list in table */
    const int32_t *table;   /* (n_table) physical block ids */
    int32_t n_table;
    int32_t n_cache_rows; /* rows of the K/V cache (blocks * block_size) */
} kg_cuda_op_attn_t;

/** x (rows, n) += add (when not NULL); y = rmsnorm(x) * w stored as dtype
 * and returned as floats. x is updated in place. */
kg_status_t kg_cuda_op_add_rmsnorm(float *x,
                                   const float *add,
                                   const float *w,
                                   float *y,
                                   int32_t rows,
                                   int32_t n,
                                   float eps,
                                   int dtype);

/** RoPE angles of a->pos, rotation of q|k in qkv (n_tokens, n_q + 2 n_kv),
 * q rounded to fp16 into q_out (n_tokens, n_q); k and v stored as fp16 in
 * the caches (n_cache_rows, n_kv), which are read back as floats (rows the
 * step does not write keep their input values). */
kg_status_t kg_cuda_op_rope_store(
    const kg_cuda_op_attn_t *a, const float *qkv, float *q_out, float *k_cache, float *v_cache);

/* How kg_cuda_op_attention cuts the work (kg_backend_cuda.cu makes the
 * same choices; any choice must give the same bits per row). */
typedef struct kg_cuda_op_attn_cut {
    int32_t split_len; /* positions per split; 0: the backend's for n_cache_rows */
    bool tiles;        /* share tiles between a sequence's consecutive tokens */
    int32_t pair_cap;  /* (token, split) partials per launch group; 0: no limit */
} kg_cuda_op_attn_cut_t;

/** Paged attention: q (n_tokens, n_q) and the caches (n_cache_rows, n_kv)
 * are rounded to fp16 on the way in; out (n_tokens, n_q) as dtype. */
kg_status_t kg_cuda_op_attention(const kg_cuda_op_attn_t *a,
                                 const float *q,
                                 const float *k_cache,
                                 const float *v_cache,
                                 const kg_cuda_op_attn_cut_t *cut,
                                 float *out,
                                 int dtype);

/** h (rows, n_ff) = silu(gu[:, :n_ff]) * gu[:, n_ff:] stored as dtype. */
kg_status_t kg_cuda_op_swiglu(const float *gu, float *h, int32_t rows, int32_t n_ff, int dtype);

/** y (rows, n_out) = x (rows, n_in) · w (n_out, n_in)^T with w and x
 * rounded to dtype, through the batch-invariant kernels or (cublas) cuBLAS. */
kg_status_t kg_cuda_op_gemm(const float *w,
                            const float *x,
                            float *y,
                            int32_t rows,
                            int32_t n_out,
                            int32_t n_in,
                            int dtype,
                            bool cublas,
                            char *errstr,
                            size_t errstr_size);

/** The device sampler on host logits (rows, n_vocab), reqs[i] for row i. */
kg_status_t kg_cuda_op_sample(const float *logits,
                              int32_t rows,
                              int32_t n_vocab,
                              const kg_sample_request_t *reqs,
                              kg_sample_result_t *out);

/** kv_copy.cu: KV blocks src[i] -> dst[i] of kv (n_planes planes of n_blocks
 * blocks of block_elems fp16 values, host memory), on the device. */
kg_status_t kg_cuda_op_kv_copy(uint16_t *kv,
                               int32_t n_planes,
                               int32_t n_blocks,
                               int32_t block_elems,
                               const int32_t *src,
                               const int32_t *dst,
                               int32_t n);

/** logit_bias.cu: reqs[i].params' logit_bias on row i of logits (rows,
 * n_vocab), host memory, on the device. */
kg_status_t kg_cuda_op_logit_bias(float *logits,
                                  int32_t rows,
                                  int32_t n_vocab,
                                  const kg_sample_request_t *reqs);

#ifdef __cplusplus
}
#endif
