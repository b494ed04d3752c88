/* mla: DeepSeek's multi-head latent attention (deepseek2) in its absorbed
 * form, the CPU backend's mla_attention (src/backend/cpu/
 * kg_backend_cpu_forward.c): the KV pool holds one latent row per token and
 * layer (kv_lora_rank normed dims, then the n_rot RoPE'd key dims every head
 * shares, fp16), each query head is taken into the latent space through its
 * k_b, attends the latent rows as one shared KV head, and its latent result
 * goes out through its v_b. The host side is kg_backend_cuda_mla.cu. */
#pragma once

#include "cuda_common.cuh"

/* The widest latent (kv_lora_rank), nope query and value head, and the most
 * RoPE dims, the kernels hold (registers and shared memory);
 * kg_backend_cuda_mla.cu refuses a model beyond them. DeepSeek V2/V3 and
 * Kimi K2: 512, 128, 128 and 64. */
#define KG_CUDA_MLA_MAX_DIM 1024
#define KG_CUDA_MLA_MAX_ROT 128

/* The latent attention's shape. */
typedef struct kg_cuda_mla_shape {
    int32_t n_head;     /* H query heads */
    int32_t rank;       /* R: kv_lora_rank, the latent's dims (and the values') */
    int32_t n_rot;      /* the RoPE dims after the latent in a cached row */
    int32_t nope;       /* a query head's dims before its RoPE part (mla_k - n_rot) */
    int32_t block_size; /* the pool's rows per block */
    int neox;           /* RoPE pairs (i, i + n_rot/2), else (2i, 2i+1) */
} kg_cuda_mla_shape_t;

/** For t < hdr->n_tokens, kv(t) = src + t * stride + kv_off ((R + n_rot)
 * floats: the latent, then the shared key's RoPE dims): RMSNorm of the
 * latent with kv_norm (R) and the rotation of the RoPE dims by rope_cs(t)
 * (n_rot floats: cosines, then sines), stored fp16 as the token's row
 * table[tbl_off[t] + pos / bs] * bs + pos % bs of `cache` (rows of R +
 * n_rot halves). When q_norm is not NULL, the first n_q of the row (the
 * compressed query) are RMSNormed with it into qa (t, n_q) as qa_dt. Norms
 * as cpu_rmsnorm_rows: squares summed in double, 1 / sqrtf(mean + eps),
 * (x * scale) * w. */
kg_status_t kg_cuda_mla_kv_store(cudaStream_t stream,
                                 int32_t n_launch,
                                 kg_cuda_inputs_t in,
                                 const kg_cuda_mla_shape_t *sh,
                                 const float *src,
                                 int32_t stride,
                                 int32_t kv_off,
                                 const float *kv_norm,
                                 const float *rope_cs,
                                 __half *cache,
                                 const float *q_norm,
                                 int32_t n_q,
                                 void *qa,
                                 kg_cuda_dtype_t qa_dt,
                                 float eps);

/** For t < hdr->n_tokens and every head h, the query's RoPE part
 * (q + t * stride + h * (nope + n_rot) + nope, n_rot floats) rotated by
 * rope_cs(t) into qlat + (t * H + h) * (R + n_rot) + R (F32): the rows the
 * latent attention reads, whose first R dims kg_cuda_mla_heads writes. */
kg_status_t kg_cuda_mla_q_rope(cudaStream_t stream,
                               int32_t n_launch,
                               const kg_cuda_step_hdr_t *hdr,
                               const kg_cuda_mla_shape_t *sh,
                               const float *q,
                               int32_t stride,
                               const float *rope_cs,
                               float *qlat);

/** One small GEMM per head: for t < hdr->n_tokens, h < n_head, n < N,
 * y(t, h, n) = sum over k < K of w[(h * N + n) * K + k] * x(t, h, k), x(t,
 * h, k) = x[t * x_tok + h * x_head + k] (F32, rounded to w_dt first as the
 * GEMMs' inputs are), y stored at y[t * y_tok + h * y_head + n] as y_dt;
 * F32 sums. A token's result does not depend on the other tokens of the
 * launch. K <= KG_CUDA_MLA_MAX_DIM. */
kg_status_t kg_cuda_mla_heads(cudaStream_t stream,
                              int32_t n_launch,
                              const kg_cuda_step_hdr_t *hdr,
                              int32_t n_head,
                              const void *w,
                              kg_cuda_dtype_t w_dt,
                              int32_t N,
                              int32_t K,
                              const float *x,
                              int64_t x_tok,
                              int64_t x_head,
                              void *y,
                              kg_cuda_dtype_t y_dt,
                              int64_t y_tok,
                              int64_t y_head);

/** The latent attention of every (token, head), t < hdr->n_tokens: q =
 * qlat(t, h) (R + n_rot floats, rounded to fp16 as ggml's K matmul does)
 * against the cached rows of positions 0 .. pos[t] of the token's sequence,
 * scores (q . row) * scale, the softmax as cpu_attn_head's (max, exp, a
 * double sum, probabilities rounded to fp16), out(t, h) = sum of p * the
 * rows' first R dims, F32 at out + (t * H + h) * R. */
kg_status_t kg_cuda_mla_attention(cudaStream_t stream,
                                  int32_t n_launch,
                                  kg_cuda_inputs_t in,
                                  const kg_cuda_mla_shape_t *sh,
                                  float scale,
                                  const float *qlat,
                                  const __half *cache,
                                  float *out);
