/* rope: RoPE angles per token, and the kernel that rotates q and k, rounds
 * q to fp16 and stores k and v in the paged fp16 KV cache. */
#pragma once

#include "cuda_common.cuh"

/** rope_cs[t] = cos | sin of every pair at position pos[t] (n_rot floats:
 * n_rot/2 cosines then n_rot/2 sines), from kg_rope_cache itself, one
 * thread per token: the same angles as the CPU backend. */
kg_status_t kg_cuda_rope_cache(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               float *rope_cs,
                               int32_t n_rot,
                               float base,
                               float freq_scale,
                               const float *freq_factors);

typedef struct kg_cuda_rope_shape {
    int32_t n_head, n_head_kv, head_dim, n_rot, block_size;
} kg_cuda_rope_shape_t;

/** For t < hdr->n_tokens, with qkv(t) = [q (n_head*hd) | k (n_kv*hd) | v (n_kv*hd)]:
 * rotate the first n_rot/2 adjacent pairs of every q and k head
 * (kg_rope_pair), write q as fp16 into q16 (t, n_head*hd), and k, v as fp16
 * into row table[tbl_off[t] + pos/bs]*bs + pos%bs of k_cache, v_cache. */
kg_status_t kg_cuda_rope_store(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               const kg_cuda_rope_shape_t *sh,
                               const float *qkv,
                               const float *rope_cs,
                               __half *q16,
                               __half *k_cache,
                               __half *v_cache);
