/* cpu_attn_flash: one query head's attention over its paged fp16 KV rows
 * with the arithmetic of ggml-cpu's flash attention (ggml_flash_attn_ext),
 * which llama.cpp runs when flash attention is on: its default ("auto")
 * turns it on for the CPU, so that is how llama.cpp computes embeddings
 * and rerank scores. kgen's generation path keeps cpu_attn's arithmetic
 * (llama.cpp's soft_max path, which the generation goldens were made
 * with); the decoder's embedding inputs take this one, which carries their
 * Q8_0 results onto llama.cpp's (its activations round to Q8 blocks at
 * every matmul, so any difference in the attention output moves them).
 *
 * ggml-cpu has two kernels and picks one by the number of query rows in
 * the ubatch (GGML_FA_TILE_Q, 64); node-llama-cpp evaluates an embedding
 * input alone, as one ubatch (up to its micro-batch), so kgen picks by the
 * input's own length (batch invariance: an input's arithmetic never
 * depends on what shares its step). That is llama.cpp's arithmetic for an
 * input evaluated alone: where llama.cpp packs several inputs into one
 * ubatch (llama-embedding, the server) it takes the tiled kernel for all of
 * them, with tiles from where each input's cache cells begin:
 *   - one chunk (under 64): q rounded to fp16, each score an fp16 · fp16
 *     dot product summed in double in dimension order (ggml's order for
 *     heads narrower than its F16 SIMD step: every head under 64 wide on
 *     the AVX-512 build the goldens ran, under 32 on AVX2; wider heads sum
 *     in SIMD lanes there, an ulp or so apart), then scaled; an online
 *     softmax over the positions in order whose V accumulator is fp16,
 *     rounded at every step; the output the accumulator over the sum;
 *   - tiled (from 64): q in F32, positions in tiles of 64 from position 0;
 *     a score one FMA chain over the head, then scaled; per tile the
 *     running maximum moves (the F32 accumulator and the sum scaled by expf
 *     of the step), the tile's exponentials and their sum those of
 *     ggml_vec_soft_max_f32 built for AVX2 (ggml_v_expf on 8 positions at a
 *     time, summed pairwise, into a double: cpu_expf.h; its AVX-512 build
 *     rounds the exponentials a little differently), each value row added
 *     by FMA in position order.
 * Positions before p0 (a window) are masked out, as llama.cpp masks them
 * with -inf: the one-chunk kernel skips them, the tiled one gives them no
 * weight. Soft-capping: the score is softcap * tanh(q · k * scale /
 * softcap), ggml's order. */
#pragma once

#include "cpu_attn.h"

#include <stdbool.h>
#include <stdint.h>

/** Query rows from which ggml-cpu's tiled kernel runs (GGML_FA_TILE_Q),
 * and its KV tile (GGML_FA_TILE_KV). */
#define CPU_FLASH_TILE 64

/** Floats of scratch cpu_attn_head_flash needs for a head of hd. */
static inline int64_t cpu_attn_flash_scratch(int32_t hd) {
    return 2 * (int64_t)hd + CPU_FLASH_TILE;
}

/** out(hd) = softmax(q · K * scale) · V over positions [p0, n_pos) with
 * ggml-cpu's flash attention arithmetic: its tiled kernel when `is_tiled`,
 * else its one-chunk kernel. scratch: cpu_attn_flash_scratch(hd) floats. */
void cpu_attn_head_flash(const float *q,
                         const cpu_kv_view_t *kv,
                         int32_t p0,
                         int32_t n_pos,
                         int32_t hd,
                         float scale,
                         float softcap,
                         bool is_tiled,
                         float *scratch,
                         float *out);
