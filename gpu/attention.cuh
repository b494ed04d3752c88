/* attention: paged attention over the KV pool (f16 or Q8_0 rows), one kernel family for
 * prefill chunks and decode tokens alike. */
#pragma once

#include "cuda_common.cuh"
#include "kv_cache.cuh"

typedef struct kg_cuda_attn_shape {
    int32_t n_head, n_head_kv, head_dim, block_size;
} kg_cuda_attn_shape_t;

/* One launch plan: how the step's tiles are cut into launches and where
 * the splits go. Fixed per backend: split_len and max_splits; per launch:
 * the rows per tile (rt) and the group of tiles. */
typedef struct kg_cuda_attn_plan {
    int32_t split_len;  /* positions per split: a multiple of the KV tile */
    int32_t max_splits; /* splits of the longest context */
    int32_t rt;         /* 16-row fragments per tile: 1 (decode) or kg_cuda_attention_prefill_rt */
} kg_cuda_attn_plan_t;

/* What a layer adds to plain causal attention; zeros and NULL: none. */
typedef struct kg_cuda_attn_layer {
    float scale;        /* scores are multiplied by it (1/sqrt(hd); 1 where q was scaled) */
    float softcap;      /* scores = softcap * tanh(q.k / softcap) * scale; 0: off (gemma2) */
    int32_t n_swa;      /* a token sees its last n_swa positions, itself included; 0: all */
    bool chunked;       /* with n_swa: a token sees the positions of its own chunk of n_swa
                           (pos - pos % n_swa to pos) instead (llama4) */
    const float *sinks; /* (n_head) one more logit per head in the softmax's sum (gpt-oss) */
    bool non_causal;    /* a token sees its whole input (in.pos_end), or in a windowed layer the
                           positions within n_swa / 2 either side (gemma-embedding) */
} kg_cuda_attn_layer_t;

/** Positions per split for contexts of up to max_ctx: 256, or more when
 * that would make more than 16 splits. Every token's positions are split
 * at multiples of it, whatever else is in the step (batch invariance). */
int32_t kg_cuda_attention_split_len(int32_t max_ctx);

/** Rows (16-row fragments) per tile of a prefill launch for this shape. */
int32_t kg_cuda_attention_prefill_rt(const kg_cuda_attn_shape_t *sh);

/** Tokens one tile of `rt` fragments holds (1 when a KV head's query heads
 * alone fill it). */
int32_t kg_cuda_attention_tile_tokens(const kg_cuda_attn_shape_t *sh, int32_t rt);

/** Bytes of scratch for `pair_cap` (token, split) partial results. */
size_t kg_cuda_attention_scratch_size(const kg_cuda_attn_shape_t *sh, int32_t pair_cap);

/** out[t] (n_head*hd, stored as dt) = softmax(scores) v over the positions
 * [0, pos[t]] of token t's sequence (the last n_swa of them in a windowed
 * layer, whose earlier blocks are never read; a non-causal layer's: see
 * kg_cuda_attn_layer_t), the scores q k^T * scale
 * (soft-capped first when the layer says so), a sink logit joining the
 * softmax's max and sum when the layer has sinks, for the tokens of tiles
 * tile0 .. tile0 + n_tiles - 1 (those below hdr->n_tiles), whose first
 * token is tok0. q16 is (rows, n_head*hd) fp16; kv the layer's K and V
 * planes (rows of the pool, n_head_kv*hd), f16 or Q8_0 (kv_cache.cuh: Q8_0
 * rows are expanded to fp16 as they are loaded). The tiles' tokens times
 * plan->max_splits must fit `scratch` (kg_cuda_attention_scratch_size). */
kg_status_t kg_cuda_attention(cudaStream_t stream,
                              kg_cuda_inputs_t in,
                              const kg_cuda_attn_shape_t *sh,
                              const kg_cuda_attn_plan_t *plan,
                              const kg_cuda_attn_layer_t *layer,
                              int32_t tile0,
                              int32_t n_tiles,
                              int32_t tok0,
                              int32_t n_tok,
                              const __half *q16,
                              kg_cuda_kv_t kv,
                              float *scratch,
                              void *out,
                              kg_cuda_dtype_t dt);
