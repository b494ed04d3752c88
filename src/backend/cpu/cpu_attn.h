/* cpu_attn: attention of one query head over a sequence's paged fp16 KV
 * cache, the CPU backend's attention kernel (llama.cpp's soft_max path;
 * embedding inputs take cpu_attn_flash's, llama.cpp's flash attention).
 *
 * The arithmetic is fixed per element and does not depend on how many
 * positions there are or how they are grouped: a score is one 8-lane FMA
 * chain over the head dimension, summed across lanes in a fixed order and
 * scaled; the softmax runs in position order with a double sum; the
 * probabilities are rounded to fp16 (ggml multiplies them with fp16 V); each
 * output element is one FMA chain over the positions in order. The vector
 * paths only reorder independent work (four positions at a time, outputs
 * held in registers), so they give the bits the scalar loops give. */
#pragma once

#include <stdint.h>

/** Where a sequence's cached rows are: position p is row
 * table[p / block_size] * block_size + p % block_size of a cache whose rows
 * are `stride` halves apart; this head's vector starts `offset` halves into
 * its row. */
typedef struct cpu_kv_view {
    const uint16_t *k, *v; /* the layer's K and V caches (fp16) */
    int64_t stride, offset;
    const int32_t *table;
    int32_t block_size;
} cpu_kv_view_t;

/** s[p - p0] = (q · K[p]) * scale for p0 <= p < n_pos: the scores
 * cpu_attn_head starts from. With softcap > 0 a score is
 * softcap * tanh((q · K[p]) / softcap) * scale instead (ggml's order:
 * soft-capping, then the softmax's scale). */
void cpu_attn_scores(const float *q,
                     const cpu_kv_view_t *kv,
                     int32_t p0,
                     int32_t n_pos,
                     int32_t hd,
                     float scale,
                     float softcap,
                     float *s);

/** out(hd) = softmax(scores) · V over positions [p0, n_pos) (p0 > 0: a
 * sliding window; the positions before it are masked out, as llama.cpp
 * masks them with -inf); `s` is scratch for n_pos - p0 floats. hd need not
 * be a multiple of 8. */
void cpu_attn_head(const float *q,
                   const cpu_kv_view_t *kv,
                   int32_t p0,
                   int32_t n_pos,
                   int32_t hd,
                   float scale,
                   float softcap,
                   float *s,
                   float *out);

/** cpu_attn_head with an attention sink (gpt-oss): one more logit `sink`
 * per head that takes part in the softmax's max and sum but has no value,
 * so the probabilities of the positions sum to less than 1 (ggml_soft_max
 * with sinks). sink = -INFINITY gives cpu_attn_head's bits. */
void cpu_attn_head_sink(const float *q,
                        const cpu_kv_view_t *kv,
                        int32_t p0,
                        int32_t n_pos,
                        int32_t hd,
                        float scale,
                        float softcap,
                        float sink,
                        float *s,
                        float *out);

/** Multi-head latent attention's absorbed head (deepseek2): the scores
 * are q · K over hd_k dims of each cached latent row (the latent, then the
 * RoPE'd key dims), the values its first hd_v dims (the latent itself), so
 * out is hd_v wide; positions [0, n_pos), no window, no soft-capping. */
void cpu_attn_head_mla(const float *q,
                       const cpu_kv_view_t *kv,
                       int32_t n_pos,
                       int32_t hd_k,
                       int32_t hd_v,
                       float scale,
                       float *s,
                       float *out);

/** "avx2" or "scalar": which kernel this build runs. */
const char *cpu_attn_kernel_name(void);
