/* bert: the bert encoders' own kernels (bert.cuh): LayerNorms, bias +
 * GELU, nomic-bert's RoPE, non-causal attention. Built with --fmad=false, so the products
 * round as cpu_bert.c's do. */
#include "bert.cuh"

#define BERT_NORM_THREADS 128
#define BERT_ATT_DIMS     8 /* head_dim / 32 dims per lane, head_dim <= 256 */

static __device__ __forceinline__ float round16(float x) {
    return __half2float(__float2half_rn(x));
}

/* Row r of x (n wide), its values already in place: x = LN(x) * w + b,
 * also as dt into xn (NULL: not). cpu_bert's layernorm_rows: the mean from
 * a double sum, the centred values' squares summed in double. */
static __device__ void layernorm_row(float *xr,
                                     const float *w,
                                     const float *b,
                                     void *xn,
                                     int64_t r,
                                     int dt,
                                     int32_t n,
                                     float eps,
                                     double *red) {
    double sum = 0.0;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        sum += (double)xr[e];
    }
    sum = kg_block_sum_d(sum, red);
    const float mean = (float)sum / (float)n;
    double sum2 = 0.0;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float d = xr[e] - mean;
        xr[e] = d;
        sum2 += (double)(d * d);
    }
    sum2 = kg_block_sum_d(sum2, red);
    const float variance = (float)(sum2 / (double)n);
    const float scale = 1.0f / sqrtf(variance + eps);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float y = xr[e] * scale * w[e] + b[e];
        xr[e] = y;
        if (xn) {
            kg_st(xn, r * n + e, y, dt);
        }
    }
}

__global__ void __launch_bounds__(BERT_NORM_THREADS)
    bert_embed_kernel(kg_cuda_bert_inputs_t in,
                      const void *__restrict__ tok_embd,
                      int emb_dt,
                      const float *__restrict__ pos_embd,
                      const float *__restrict__ type_row,
                      const float *__restrict__ w,
                      const float *__restrict__ b,
                      float *__restrict__ x,
                      void *__restrict__ xn,
                      int dt,
                      int32_t n,
                      float eps) {
    __shared__ double red[32];
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t tok = (int64_t)in.token[t] * n, pos = (int64_t)in.pos[t] * n;
    float *xr = x + (int64_t)t * n;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float v = kg_ld(tok_embd, tok + e, emb_dt);
        const float tt = type_row ? v + type_row[e] : v;
        xr[e] = pos_embd ? pos_embd[pos + e] + tt : tt;
    }
    layernorm_row(xr, w, b, xn, t, dt, n, eps, red);
}

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
                               float eps) {
    bert_embed_kernel<<<T, BERT_NORM_THREADS, 0, stream>>>(in, tok_embd, (int)emb_dt, pos_embd,
                                                           type_row, w, b, x, xn, (int)dt, n, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void __launch_bounds__(BERT_NORM_THREADS)
    bert_add_norm_kernel(const float *__restrict__ add,
                         const float *__restrict__ add_b,
                         const float *__restrict__ w,
                         const float *__restrict__ b,
                         float *__restrict__ x,
                         void *__restrict__ xn,
                         int dt,
                         int32_t n,
                         float eps) {
    __shared__ double red[32];
    const int64_t t = blockIdx.x;
    float *xr = x + t * n;
    const float *ar = add + t * n;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float a = add_b ? ar[e] + add_b[e] : ar[e];
        xr[e] = a + xr[e];
    }
    layernorm_row(xr, w, b, xn, t, dt, n, eps, red);
}

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
                                  float eps) {
    bert_add_norm_kernel<<<T, BERT_NORM_THREADS, 0, stream>>>(add, add_b, w, b, x, xn, (int)dt, n,
                                                              eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void __launch_bounds__(256) bert_gelu_kernel(const float *__restrict__ up,
                                                        const float *__restrict__ up_b,
                                                        const uint16_t *__restrict__ table,
                                                        void *__restrict__ h,
                                                        int dt,
                                                        int32_t n_ff,
                                                        int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = up_b ? up[i] + up_b[i % n_ff] : up[i];
        float g;
        if (v <= -10.0f) {
            g = 0.0f;
        } else if (v >= 10.0f) {
            g = v;
        } else {
            g = __half2float(__ushort_as_half(table[__half_as_ushort(__float2half_rn(v))]));
        }
        kg_st(h, i, g, dt);
    }
}

kg_status_t kg_cuda_bert_gelu(cudaStream_t stream,
                              int32_t T,
                              const float *up,
                              const float *up_b,
                              const uint16_t *table,
                              void *h,
                              kg_cuda_dtype_t dt,
                              int32_t n_ff) {
    const int64_t total = (int64_t)T * n_ff;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    bert_gelu_kernel<<<(unsigned)blocks, 256, 0, stream>>>(up, up_b, table, h, (int)dt, n_ff,
                                                           total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* One block per token; thread i walks the token's E * 3 values (biases)
 * and then its heads' pairs (RoPE), each element its own arithmetic. */
__global__ void __launch_bounds__(128) bert_rope_kernel(kg_cuda_bert_inputs_t in,
                                                        float *__restrict__ qkv,
                                                        const float *__restrict__ bqkv,
                                                        const float *__restrict__ rope_cs,
                                                        int32_t n_head,
                                                        int32_t hd,
                                                        int32_t n_rot) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t E = (int64_t)n_head * hd;
    float *row = qkv + (int64_t)t * 3 * E;
    if (bqkv) {
        for (int64_t e = threadIdx.x; e < 3 * E; e += blockDim.x) {
            row[e] += bqkv[e];
        }
        __syncthreads();
    }
    const int32_t half = n_rot / 2;
    const float *cs = rope_cs + (int64_t)in.pos[t] * n_rot;
    /* Q's heads, then K's: 2 * n_head rows of hd, half pairs each */
    for (int64_t i = threadIdx.x; i < 2 * (int64_t)n_head * half; i += blockDim.x) {
        const int64_t hh = i / half;
        const int32_t k = (int32_t)(i % half);
        float *hr = row + hh * hd;
        kg_rope_pair(&hr[k], &hr[k + half], cs[k], cs[half + k]);
    }
}

kg_status_t kg_cuda_bert_rope(cudaStream_t stream,
                              int32_t T,
                              kg_cuda_bert_inputs_t in,
                              float *qkv,
                              const float *bqkv,
                              const float *rope_cs,
                              int32_t n_head,
                              int32_t head_dim,
                              int32_t n_rot) {
    bert_rope_kernel<<<T, 128, 0, stream>>>(in, qkv, bqkv, rope_cs, n_head, head_dim, n_rot);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* One warp per (token, head); lane l holds dims l, l + 32, ... The scores
 * are recomputed in each of three passes (max, sum, values) instead of
 * kept: no scratch whatever the input's length, and the same steps as
 * cpu_attn_head (max, exp, a double sum, probabilities * (1 / sum) rounded
 * to fp16, then the fp16 values weighted by them). */
__global__ void __launch_bounds__(32) bert_attention_kernel(kg_cuda_bert_inputs_t in,
                                                            const float *__restrict__ qkv,
                                                            const float *__restrict__ bqkv,
                                                            int32_t n_head,
                                                            int32_t hd,
                                                            void *__restrict__ out,
                                                            int dt) {
    const int32_t t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t E = (int64_t)n_head * hd, W = 3 * E;
    const int32_t j0 = in.run0[t], n = in.run_n[t];
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t col = (int64_t)h * hd;
    float q[BERT_ATT_DIMS], acc[BERT_ATT_DIMS];
    for (int k = 0; k < BERT_ATT_DIMS; k++) {
        const int64_t d = lane + 32 * k;
        const float v = d < hd ? qkv[t * W + col + d] : 0.0f;
        q[k] = d < hd ? round16(bqkv ? v + bqkv[col + d] : v) : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY;
    double sum = 0.0;
    for (int pass = 0; pass < 3; pass++) {
        const float inv = pass == 2 ? (float)(1.0 / sum) : 0.0f;
        for (int32_t j = 0; j < n; j++) {
            const float *kr = qkv + (int64_t)(j0 + j) * W + E + col;
            float dot = 0.0f;
            for (int k = 0; k < BERT_ATT_DIMS; k++) {
                const int64_t d = lane + 32 * k;
                if (d < hd) {
                    const float kv = bqkv ? kr[d] + bqkv[E + col + d] : kr[d];
                    dot += q[k] * round16(kv);
                }
            }
            const float s = kg_warp_sum(dot) * scale;
            if (pass == 0) {
                m = fmaxf(m, s);
            } else if (pass == 1) {
                sum += (double)expf(s - m);
            } else {
                const float p = round16(expf(s - m) * inv);
                const float *vr = kr + E;
                for (int k = 0; k < BERT_ATT_DIMS; k++) {
                    const int64_t d = lane + 32 * k;
                    if (d < hd) {
                        const float vv = bqkv ? vr[d] + bqkv[2 * E + col + d] : vr[d];
                        acc[k] += p * round16(vv);
                    }
                }
            }
        }
    }
    for (int k = 0; k < BERT_ATT_DIMS; k++) {
        const int64_t d = lane + 32 * k;
        if (d < hd) {
            kg_st(out, t * E + col + d, acc[k], dt);
        }
    }
}

kg_status_t kg_cuda_bert_attention(cudaStream_t stream,
                                   int32_t T,
                                   kg_cuda_bert_inputs_t in,
                                   const float *qkv,
                                   const float *bqkv,
                                   int32_t n_head,
                                   int32_t head_dim,
                                   void *out,
                                   kg_cuda_dtype_t dt) {
    if (head_dim > 32 * BERT_ATT_DIMS) {
        KG_LOG_ERROR("cuda", "bert attention: head_dim %d above %d", head_dim, 32 * BERT_ATT_DIMS);
        return KG_ERR_UNSUPPORTED;
    }
    bert_attention_kernel<<<dim3((unsigned)T, (unsigned)n_head), 32, 0, stream>>>(
        in, qkv, bqkv, n_head, head_dim, out, (int)dt);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
