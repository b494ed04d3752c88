/* attention: paged attention over the fp16 KV pool, for prefill chunks and
 * decode tokens alike. */
#pragma once

#include "cuda_common.cuh"

#define KG_CUDA_ATT_MAX_SPLIT 16

typedef struct kg_cuda_attn_shape {
    int32_t n_head, n_head_kv, head_dim, block_size;
} kg_cuda_attn_shape_t;

/** How many pieces to split each token's positions into (flash decoding):
 * enough blocks to fill the GPU when the step has few tokens, 1 when it
 * has many, and never more than max_split_rows / n_launch. Depends only on
 * the launch size, so a captured graph stays valid as sequences grow. */
int32_t kg_cuda_attention_splits(int32_t n_launch,
                                 const kg_cuda_attn_shape_t *sh,
                                 int32_t n_sm,
                                 int32_t max_split_rows);

/** Bytes of split scratch for max_split_rows token-splits. */
size_t kg_cuda_attention_scratch_size(const kg_cuda_attn_shape_t *sh, int32_t max_split_rows);

/** out[t] (n_head*hd, stored as dt) = softmax(q k^T / sqrt(hd)) v over the
 * positions [0, pos[t]] of token t's sequence, for t < hdr->n_tokens. q16
 * is (rows, n_head*hd) fp16; k_cache and v_cache (rows of the pool,
 * n_head_kv*hd) fp16. Query heads sharing a KV head are done by one block,
 * which reads each K/V row once for all of them (GQA); with n_split > 1 the
 * positions are split over blocks and merged by a second kernel, using
 * `scratch` (kg_cuda_attention_scratch_size). */
kg_status_t kg_cuda_attention(cudaStream_t stream,
                              int32_t n_launch,
                              kg_cuda_inputs_t in,
                              const kg_cuda_attn_shape_t *sh,
                              int32_t n_split,
                              const __half *q16,
                              const __half *k_cache,
                              const __half *v_cache,
                              float *scratch,
                              void *out,
                              kg_cuda_dtype_t dt);
