/* bert: the kernels only the `bert` and `nomic-bert` encoders need on the
 * CUDA backend (kg_backend_cuda_bert.cu runs them): the summed embeddings'
 * LayerNorm, the post-norm residual LayerNorm, bias + GELU, nomic-bert's
 * biases + RoPE on Q and K, and the non-causal attention over one input's
 * tokens. Each follows cpu_bert.c's arithmetic
 * (built with --fmad=false), so the device's vectors stay within rounding
 * of the CPU backend's; every row's result depends on its own input only
 * (batch invariance). */
#pragma once

#include "cuda_common.cuh"

/* A bert step's inputs on the device, inside the backend's input buffer:
 * the header (n_tokens; n_outputs 0), then per token its id, its position
 * in its input, the index of its input's first token, and its input's
 * length (T each). */
typedef struct kg_cuda_bert_inputs {
    const kg_cuda_step_hdr_t *hdr;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *run0;
    const int32_t *run_n;
} kg_cuda_bert_inputs_t;

#define KG_CUDA_BERT_INPUT_ARRAYS 4

static inline kg_cuda_bert_inputs_t kg_cuda_bert_inputs_view(const int32_t *base, int32_t cap) {
    kg_cuda_bert_inputs_t in;
    in.hdr = (const kg_cuda_step_hdr_t *)base;
    in.token = base + 4;
    in.pos = in.token + cap;
    in.run0 = in.pos + cap;
    in.run_n = in.run0 + cap;
    return in;
}

/** x[t] = LN(tok_embd[token[t]] + type_row + pos_embd[pos[t]]) * w + b for
 * the T tokens (type_row may be NULL; pos_embd NULL: nomic-bert, whose
 * positions are RoPE's); also stored as dt into xn. LN is
 * ggml_norm as cpu_bert's layernorm_rows: the mean from a double sum, the
 * variance of the centred values in double, 1 / sqrtf(var + eps). */
kg_status_t kg_cuda_bert_embed(cudaStream_t stream,
                               int32_t T,
                               kg_cuda_bert_inputs_t in,
                               const void *tok_embd,
                               kg_cuda_dtype_t emb_dt,
                               const float *pos_embd,
                               const float *type_row,
                               const float *w,
                               const float *b,
                               float *x,
                               void *xn,
                               kg_cuda_dtype_t dt,
                               int32_t n,
                               float eps);

/** x[t] = LN((add[t] + add_b) + x[t]) * w + b for the T rows (add_b may be
 * NULL), also stored as dt into xn (xn NULL: not). */
kg_status_t kg_cuda_bert_add_norm(cudaStream_t stream,
                                  int32_t T,
                                  const float *add,
                                  const float *add_b,
                                  const float *w,
                                  const float *b,
                                  float *x,
                                  void *xn,
                                  kg_cuda_dtype_t dt,
                                  int32_t n,
                                  float eps);

/** h[t][f] = gelu(up[t][f] + up_b[f]) stored as dt, GELU as cpu_bert's
 * (0 at or below -10, x at or above 10, else the fp16 table's entry of x
 * rounded to fp16). up_b may be NULL. */
kg_status_t kg_cuda_bert_gelu(cudaStream_t stream,
                              int32_t T,
                              const float *up,
                              const float *up_b,
                              const uint16_t *table,
                              void *h,
                              kg_cuda_dtype_t dt,
                              int32_t n_ff);

/** nomic-bert: in place on the (T, 3 * n_embd) Q|K|V GEMM output, the
 * biases bqkv (may be NULL) added to Q, K and V, then Q and K rotated
 * (NeoX pairs (i, i + n_rot / 2) of each head's first n_rot dims, as
 * cpu_bert's rope_rows) by the angles of the token's position in its
 * input: rope_cs holds cos | sin (n_rot / 2 each) of positions 0, 1, ...
 * (n_rot per position). */
kg_status_t kg_cuda_bert_rope(cudaStream_t stream,
                              int32_t T,
                              kg_cuda_bert_inputs_t in,
                              float *qkv,
                              const float *bqkv,
                              const float *rope_cs,
                              int32_t n_head,
                              int32_t head_dim,
                              int32_t n_rot);

/** Per token t and head h: softmax(q · K^T / sqrt(hd)) · V over the
 * tokens of t's input (both ways: no causal cut), q, K and V read from the
 * (T, 3 * n_embd) Q|K|V GEMM output plus bqkv (may be NULL) and rounded to
 * fp16 as cpu_bert does, the probabilities rounded to fp16 after the
 * normalisation as cpu_attn_head does; out (T, n_embd) stored as dt.
 * head_dim <= 256. */
kg_status_t kg_cuda_bert_attention(cudaStream_t stream,
                                   int32_t T,
                                   kg_cuda_bert_inputs_t in,
                                   const float *qkv,
                                   const float *bqkv,
                                   int32_t n_head,
                                   int32_t head_dim,
                                   void *out,
                                   kg_cuda_dtype_t dt);
