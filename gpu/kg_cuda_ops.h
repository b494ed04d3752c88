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

    /* what a family adds (zeros and NULLs: the Llama graph) */
    int neox;         /* NeoX pairs (i, i + n_rot/2) */
    float q_scale;    /* q *= q_scale after RoPE; 0: not */
    int no_rope;      /* no rotation (a NoPE layer) */
    int l2_norm;      /* q and k heads RMSNormed without a weight after RoPE (llama4) */
    float temp_scale; /* q *= kg_attn_temp(temp_scale, temp_floor, pos + temp_offset)
                         after RoPE; 0: not (mistral3, llama4's NoPE layers) */
    int32_t temp_floor, temp_offset;
    const float *bias;            /* (n_q + 2 n_kv) Q|K|V biases */
    const float *q_norm, *k_norm; /* (head_dim) per-head RMSNorm weights */
    float norm_eps;
    float ext_factor, attn_factor; /* YaRN (attn_factor 0 means 1) */
    float corr_dims[2];
    const float *freq_factors; /* (n_rot / 2) */
    float scale;               /* attention: scores times it; 0: 1 / sqrt(head_dim) */
    float softcap;             /* scores soft-capped first; 0: not */
    int32_t n_swa;             /* window; 0: every position */
    bool chunked;              /* n_swa is a chunk: pos - pos % n_swa to pos (llama4) */
    const float *sinks;        /* (n_head) sink logits */
    int kv_q8;                 /* the caches as the backend's Q8_0 blocks (--kv-type q8_0):
                                  the ops quantize them with kg_quantize on the way in and
                                  hand back d x q; n_head_kv * head_dim a multiple of 32 */
} kg_cuda_op_attn_t;

/** x (rows, n) += add (when not NULL: + add_b, then RMSNorm'd with add_w,
 * each when not NULL); y = rmsnorm(x) * w stored as dtype and returned as
 * floats. x is updated in place. */
kg_status_t kg_cuda_op_add_rmsnorm(float *x,
                                   const float *add,
                                   const float *add_b,
                                   const float *add_w,
                                   const float *w,
                                   float *y,
                                   int32_t rows,
                                   int32_t n,
                                   float eps,
                                   int dtype);

/** RoPE angles of a->pos (with YaRN and frequency factors as a says), the
 * biases and Q/K norms, rotation of q|k in qkv (n_tokens, n_q + 2 n_kv)
 * (normal or NeoX pairs, the first n_rot dims; none with no_rope), the L2
 * norms (llama4.cu), the temperature and the query scale, q rounded
 * to fp16 into q_out (n_tokens, n_q); k and v stored as fp16 in the caches
 * (n_cache_rows, n_kv), which are read back as floats (rows the step does
 * not write keep their input values). */
kg_status_t kg_cuda_op_rope_store(
    const kg_cuda_op_attn_t *a, const float *qkv, float *q_out, float *k_cache, float *v_cache);

/* How kg_cuda_op_attention cuts the work (kg_backend_cuda_step.cu makes the
 * same choices; any choice must give the same bits per row). */
typedef struct kg_cuda_op_attn_cut {
    int32_t split_len; /* positions per split; 0: the backend's for n_cache_rows */
    bool tiles;        /* share tiles between a sequence's consecutive tokens */
    int32_t pair_cap;  /* (token, split) partials per launch group; 0: no limit */
} kg_cuda_op_attn_cut_t;

/** Paged attention (scale, soft-capping, window and sinks from a): q
 * (n_tokens, n_q) and the caches (n_cache_rows, n_kv) are rounded to fp16
 * on the way in; out (n_tokens, n_q) as dtype. Table entries before a
 * windowed token's window may be -1 (never read). */
kg_status_t kg_cuda_op_attention(const kg_cuda_op_attn_t *a,
                                 const float *q,
                                 const float *k_cache,
                                 const float *v_cache,
                                 const kg_cuda_op_attn_cut_t *cut,
                                 float *out,
                                 int dtype);

/** h (rows, n_ff) = silu(gu[:, :n_ff]) * gu[:, n_ff:] stored as dtype. */
kg_status_t kg_cuda_op_swiglu(const float *gu, float *h, int32_t rows, int32_t n_ff, int dtype);

/** h (rows, n_ff) = GeGLU(gu[:, :n_ff], gu[:, n_ff:]) (the fp16 GELU table)
 * stored as dtype. */
kg_status_t kg_cuda_op_geglu(const float *gu, float *h, int32_t rows, int32_t n_ff, int dtype);

/** logits (rows, n_vocab) = softcap(logits + bias) in place (bias NULL:
 * none; cap 0: none), the head's epilogue. */
kg_status_t
kg_cuda_op_logits_post(float *logits, int32_t rows, int32_t n_vocab, const float *bias, float cap);

/** Weights of `type` (n elements at src) as the backend converts them at
 * upload into out (n floats): the device element type it picks for a
 * matrix of that type alone (F32, F16 or BF16) read back as floats.
 * KG_ERR_UNSUPPORTED for a type kgen cannot dequantize. */
kg_status_t kg_cuda_op_convert(int type, const void *src, int64_t n, float *out);

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

/** y (rows, n_out) = x (rows, n_in, rounded to BF16) · w^T for w given as
 * GGUF blocks of `type` (n_out rows of n_in elements): native, kept as
 * blocks on the device (qblocks.cuh); else expanded to BF16 as the upload
 * does for types it keeps no blocks of. KG_ERR_UNSUPPORTED for a type (or
 * n_in) with no native kernel. */
kg_status_t kg_cuda_op_gemm_quant(int type,
                                  const void *blocks,
                                  const float *x,
                                  float *y,
                                  int32_t rows,
                                  int32_t n_out,
                                  int32_t n_in,
                                  bool native);

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
