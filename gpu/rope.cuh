/* rope: RoPE angles per token, and the kernel that prepares attention's
 * inputs from the fused Q|K|V GEMM output: biases, per-head Q/K RMSNorm,
 * the rotation (normal or NeoX pairs, partial), the query scale, q rounded
 * to fp16 and k, v stored in the paged fp16 KV cache. */
#pragma once

#include "cuda_common.cuh"
#include "kv_cache.cuh"

/* One RoPE of the model (llama.cpp's rope_ext arguments): the layers that
 * share a base and scale share one. */
typedef struct kg_cuda_rope {
    int32_t n_rot;
    float base, freq_scale;
    float ext_factor, attn_factor; /* YaRN (0 and 1: plain RoPE, the same bits) */
    float corr_dims[2];            /* YaRN's blend range for this base */
    float *freqs;          /* (n_rot / 2) its own divisors on the device (Gemma 4's global layers'
                              rope_freqs), or NULL: the model's */
    const void *freqs_src; /* the tensor they came from (layers share them) */
} kg_cuda_rope_t;

/** rope_cs[t] = cos | sin of every pair at position pos[t] (n_rot floats:
 * n_rot/2 cosines then n_rot/2 sines), from kg_rope_cache_yarn itself, one
 * thread per token: the same angles as the CPU backend. freq_factors
 * (n_rot / 2, Llama 3.1's rope_freqs or LongRoPE's) may be NULL. */
kg_status_t kg_cuda_rope_cache(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               float *rope_cs,
                               const kg_cuda_rope_t *rope,
                               const float *freq_factors);

typedef struct kg_cuda_rope_shape {
    int32_t n_head, n_head_kv, head_dim, n_rot, block_size;
    int32_t stride; /* floats from one token's qkv row to the next; 0: n_q + 2 n_kv (qwen35's
                       rows hold its output gates after v) */
} kg_cuda_rope_shape_t;

/* What a family adds to the Llama attention inputs; zeros and NULLs: none. */
typedef struct kg_cuda_qkv_ops {
    const float *bias;   /* (n_q + 2 n_kv) Q|K|V biases, or NULL */
    const float *q_norm; /* (head_dim) RMSNorm weight of every query head, or NULL */
    const float *k_norm; /* (head_dim) of every key head (with q_norm) */
    float norm_eps;
    int neox;         /* pair i with i + n_rot/2 (else 2i with 2i + 1) */
    float q_scale;    /* q *= q_scale after the rotation; 0: not */
    int no_rope;      /* no rotation in this layer (NoPE) */
    int norm_full;    /* q_norm (n_head*hd) and k_norm (n_kv*hd) norm all heads at once (olmo2) */
    float temp_scale; /* q *= kg_attn_temp(temp_scale, temp_floor, pos + temp_offset) after the
                         rotation (mistral3's attention temperature; llama4's on its NoPE
                         layers, offset 1); 0: not */
    int32_t temp_floor;
    int32_t temp_offset;
    int v_norm; /* RMSNorm of every v head without a weight, after the q and k norms (Gemma 4) */
} kg_cuda_qkv_ops_t;

/** For t < hdr->n_tokens, with qkv(t) = [q (n_head*hd) | k (n_kv*hd) | v (n_kv*hd)]
 * (at qkv + t * sh->stride, or t * (n_q + 2 n_kv) when stride is 0)
 * as the CPU backend does it: add the biases, RMSNorm every q and k head
 * (and v head: ops->v_norm) in place in qkv, rotate the first n_rot dims of every q and k head
 * (kg_rope_pair on the pairs of ops->neox's mode; the rest pass through),
 * scale q, write q as fp16 into q16 (t, n_head*hd), and k, v into row
 * table[tbl_off[t] + pos/bs]*bs + pos%bs of kv's planes, as fp16 or as
 * Q8_0 blocks (kv_cache.cuh; q8 writes the rotated k back into qkv). With
 * sh->n_head_kv 0 (a Gemma 4 shared-KV layer) only q: nothing is stored. */
kg_status_t kg_cuda_rope_store(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               const kg_cuda_rope_shape_t *sh,
                               const kg_cuda_qkv_ops_t *ops,
                               float *qkv,
                               const float *rope_cs,
                               __half *q16,
                               kg_cuda_kv_t kv);
