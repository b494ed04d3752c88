/* mla: the latent attention's kernels (see mla.cuh). Built with
 * --fmad=false so the norms, rotations and sums round as the CPU backend's
 * do.
 *
 * Simple rather than fast: one block per (token, head) walks the token's
 * positions three times (max, sum, values), recomputing each score, as the
 * CPU's softmax needs its max and sum before the fp16 probabilities, in
 * the CPU's own arithmetic (its AVX2 score chains, a double sum in
 * position order, fused value chains), so the latent attention gives the
 * CPU backend's bits but for exp's rounding; the
 * per-head GEMMs read a head's matrix once per 8 tokens with one warp per
 * output. Prefill runs the same absorbed form as decode (one kernel
 * family, every token alike: a token's bits do not depend on its batch
 * mates or on how its prompt was chunked). */
#include "mla.cuh"

#define MLA_THREADS 128
#define MLA_WARPS   (MLA_THREADS / 32)
#define HEADS_TOK   8 /* tokens per block of the per-head GEMM */
#define ACC_PER_THR (KG_CUDA_MLA_MAX_DIM / MLA_THREADS)
#define PROB_TILE   32 /* positions whose probabilities a block holds at once */

/* Where token t's cached row for position p is. */
__device__ __forceinline__ int64_t cache_row(const kg_cuda_inputs_t &in,
                                             int32_t t,
                                             int32_t p,
                                             int32_t bs) {
    return (int64_t)in.table[in.tbl_off[t] + p / bs] * bs + p % bs;
}

/* The pair (ia, ib) of RoPE pair i of n_rot dims. */
__device__ __forceinline__ void
rope_idx(int neox, int32_t i, int32_t half, int32_t *ia, int32_t *ib) {
    *ia = neox ? i : 2 * i;
    *ib = neox ? i + half : 2 * i + 1;
}

/* x rounded to the element type dt (what a GEMM reading dt sees). */
__device__ __forceinline__ float round_to(float x, int dt) {
    if (dt == KG_CUDA_F16) {
        return __half2float(__float2half_rn(x));
    }
    if (dt == KG_CUDA_BF16) {
        return __bfloat162float(__float2bfloat16_rn(x));
    }
    return x;
}

/* 1 / rms of x (n floats) with eps, cpu_rmsnorm_rows's arithmetic; every
 * thread of the block gets it. */
__device__ __forceinline__ float rms_scale(const float *x, int32_t n, float eps, double *red) {
    double sum = 0.0;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        sum += (double)(x[e] * x[e]);
    }
    sum = kg_block_sum_d(sum, red);
    const float mean = (float)(sum / (double)n);
    return 1.0f / sqrtf(mean + eps);
}

__global__ void __launch_bounds__(MLA_THREADS) kv_store_kernel(kg_cuda_inputs_t in,
                                                               kg_cuda_mla_shape_t sh,
                                                               const float *__restrict__ src,
                                                               int32_t stride,
                                                               int32_t kv_off,
                                                               const float *__restrict__ kv_norm,
                                                               const float *__restrict__ rope_cs,
                                                               __half *__restrict__ cache,
                                                               const float *__restrict__ q_norm,
                                                               int32_t n_q,
                                                               void *__restrict__ qa,
                                                               int qa_dt,
                                                               float eps) {
    __shared__ double red[32];
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int32_t R = sh.rank, D = sh.rank + sh.n_rot, half = sh.n_rot / 2;
    const float *row = src + (int64_t)t * stride;
    const float *kv = row + kv_off;
    __half *dst = cache + cache_row(in, t, in.pos[t], sh.block_size) * D;
    /* kv_cmpr = build_norm(the latent), then k_pe's rotation */
    const float scale = rms_scale(kv, R, eps, red);
    for (int32_t e = threadIdx.x; e < R; e += blockDim.x) {
        dst[e] = __float2half_rn((kv[e] * scale) * kv_norm[e]);
    }
    const float *cs = rope_cs + (int64_t)t * sh.n_rot;
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        int32_t ia, ib;
        rope_idx(sh.neox, i, half, &ia, &ib);
        float a = kv[R + ia], b = kv[R + ib];
        kg_rope_pair(&a, &b, cs[i], cs[half + i]);
        dst[R + ia] = __float2half_rn(a);
        dst[R + ib] = __float2half_rn(b);
    }
    if (q_norm) { /* the compressed query's attn_q_a_norm, in wq_b's type */
        const float qs = rms_scale(row, n_q, eps, red);
        for (int32_t e = threadIdx.x; e < n_q; e += blockDim.x) {
            kg_st(qa, (int64_t)t * n_q + e, (row[e] * qs) * q_norm[e], qa_dt);
        }
    }
}

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
                                 float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    kv_store_kernel<<<n_launch, MLA_THREADS, 0, stream>>>(
        in, *sh, src, stride, kv_off, kv_norm, rope_cs, cache, q_norm, n_q, qa, (int)qa_dt, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void __launch_bounds__(MLA_THREADS) q_rope_kernel(const kg_cuda_step_hdr_t *hdr,
                                                             kg_cuda_mla_shape_t sh,
                                                             const float *__restrict__ q,
                                                             int32_t stride,
                                                             const float *__restrict__ rope_cs,
                                                             float *__restrict__ qlat) {
    const int32_t t = blockIdx.x;
    if (t >= hdr->n_tokens) {
        return;
    }
    const int32_t half = sh.n_rot / 2, K = sh.nope + sh.n_rot, D = sh.rank + sh.n_rot;
    const float *cs = rope_cs + (int64_t)t * sh.n_rot;
    for (int32_t j = threadIdx.x; j < sh.n_head * half; j += blockDim.x) {
        const int32_t h = j / half, i = j % half;
        int32_t ia, ib;
        rope_idx(sh.neox, i, half, &ia, &ib);
        const float *qh = q + (int64_t)t * stride + (int64_t)h * K + sh.nope;
        float a = qh[ia], b = qh[ib];
        kg_rope_pair(&a, &b, cs[i], cs[half + i]);
        float *o = qlat + ((int64_t)t * sh.n_head + h) * D + sh.rank;
        o[ia] = a;
        o[ib] = b;
    }
}

kg_status_t kg_cuda_mla_q_rope(cudaStream_t stream,
                               int32_t n_launch,
                               const kg_cuda_step_hdr_t *hdr,
                               const kg_cuda_mla_shape_t *sh,
                               const float *q,
                               int32_t stride,
                               const float *rope_cs,
                               float *qlat) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    q_rope_kernel<<<n_launch, MLA_THREADS, 0, stream>>>(hdr, *sh, q, stride, rope_cs, qlat);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* Block (token tile, head): the tile's inputs rounded into shared memory,
 * then one warp per output, lanes over k, each token's chain its own. */
__global__ void __launch_bounds__(MLA_THREADS) heads_kernel(const kg_cuda_step_hdr_t *hdr,
                                                            const void *__restrict__ w,
                                                            int w_dt,
                                                            int32_t N,
                                                            int32_t K,
                                                            const float *__restrict__ x,
                                                            int64_t x_tok,
                                                            int64_t x_head,
                                                            void *__restrict__ y,
                                                            int y_dt,
                                                            int64_t y_tok,
                                                            int64_t y_head) {
    __shared__ float xs[HEADS_TOK * KG_CUDA_MLA_MAX_DIM]; /* (HEADS_TOK, K) */
    const int32_t t0 = blockIdx.x * HEADS_TOK, h = blockIdx.y;
    const int32_t n_tok = hdr->n_tokens;
    if (t0 >= n_tok) {
        return;
    }
    const int32_t nt = n_tok - t0 < HEADS_TOK ? n_tok - t0 : HEADS_TOK;
    for (int32_t i = threadIdx.x; i < nt * K; i += blockDim.x) {
        const int32_t j = i / K, k = i % K;
        xs[i] = round_to(x[(int64_t)(t0 + j) * x_tok + (int64_t)h * x_head + k], w_dt);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int32_t n = warp; n < N; n += MLA_WARPS) {
        const int64_t w0 = ((int64_t)h * N + n) * K;
        float acc[HEADS_TOK];
#pragma unroll
        for (int j = 0; j < HEADS_TOK; j++) {
            acc[j] = 0.0f;
        }
        for (int32_t k = lane; k < K; k += 32) {
            const float wv = kg_ld(w, w0 + k, w_dt);
#pragma unroll
            for (int j = 0; j < HEADS_TOK; j++) {
                if (j < nt) {
                    acc[j] += wv * xs[j * K + k];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < HEADS_TOK; j++) {
            const float s = kg_warp_sum(acc[j]);
            if (j < nt && lane == 0) {
                kg_st(y, (int64_t)(t0 + j) * y_tok + (int64_t)h * y_head + n, s, y_dt);
            }
        }
    }
}

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
                              int64_t y_head) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    if (K <= 0 || K > KG_CUDA_MLA_MAX_DIM) {
        return KG_ERR_INVALID;
    }
    const dim3 grid((unsigned)((n_launch + HEADS_TOK - 1) / HEADS_TOK), (unsigned)n_head);
    heads_kernel<<<grid, MLA_THREADS, 0, stream>>>(hdr, w, (int)w_dt, N, K, x, x_tok, x_head, y,
                                                   (int)y_dt, y_tok, y_head);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* Scores of a tile of positions into sc[0 .. np): eight lanes a position
 * (four positions a warp at once), q (shared, fp16-rounded) . the cached
 * row as cpu_attn_scores's AVX2 path sums it: lane l's fused chain over
 * the dims l, l + 8, ..., then ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 +
 * a7)), then the scale (D is a multiple of 8). The same bits whichever
 * warp computes a position. */
__device__ __forceinline__ void tile_scores(const float *qs,
                                            const __half *cache,
                                            const kg_cuda_inputs_t &in,
                                            int32_t t,
                                            int32_t p0,
                                            int32_t np,
                                            int32_t bs,
                                            int32_t D,
                                            float scale,
                                            float *sc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 3, l = lane & 7;
    for (int32_t i0 = warp * 4; i0 < np; i0 += MLA_WARPS * 4) {
        const int32_t i = i0 + g;
        float a = 0.0f;
        if (i < np) {
            const __half *k = cache + cache_row(in, t, p0 + i, bs) * D;
            for (int32_t d = l; d < D; d += 8) {
                a = fmaf(qs[d], __half2float(k[d]), a);
            }
        }
        a = a + __shfl_xor_sync(0xffffffffu, a, 4);
        a = a + __shfl_xor_sync(0xffffffffu, a, 1);
        a = a + __shfl_xor_sync(0xffffffffu, a, 2);
        if (i < np && l == 0) {
            sc[i] = a * scale;
        }
    }
}

/* expf as glibc rounds it (correctly rounded but for rare cases), closer
 * to the CPU backend's than CUDA's 2-ulp expf */
__device__ __forceinline__ float exp_f(float x) {
    return (float)exp((double)x);
}

__global__ void __launch_bounds__(MLA_THREADS) attention_kernel(kg_cuda_inputs_t in,
                                                                kg_cuda_mla_shape_t sh,
                                                                float scale,
                                                                const float *__restrict__ qlat,
                                                                const __half *__restrict__ cache,
                                                                float *__restrict__ out) {
    __shared__ float qs[KG_CUDA_MLA_MAX_DIM + KG_CUDA_MLA_MAX_ROT]; /* (D) the query */
    __shared__ float ps[PROB_TILE]; /* a tile of positions: scores or probabilities */
    __shared__ float m_sh;
    __shared__ double sum_sh;
    const int32_t t = blockIdx.x, h = blockIdx.y;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int32_t R = sh.rank, D = sh.rank + sh.n_rot, bs = sh.block_size;
    const float *q = qlat + ((int64_t)t * sh.n_head + h) * D;
    for (int32_t d = threadIdx.x; d < D; d += blockDim.x) {
        qs[d] = __half2float(__float2half_rn(q[d])); /* ggml's fp16 q for the K matmul */
    }
    if (threadIdx.x == 0) {
        m_sh = -INFINITY;
        sum_sh = 0.0;
    }
    __syncthreads();
    const int32_t n_pos = in.pos[t] + 1;
    /* the max, then the sum of the exponentials in double in position
     * order (thread 0 adds each tile's), as cpu_attn_head */
    for (int32_t p0 = 0; p0 < n_pos; p0 += PROB_TILE) {
        const int32_t np = n_pos - p0 < PROB_TILE ? n_pos - p0 : PROB_TILE;
        tile_scores(qs, cache, in, t, p0, np, bs, D, scale, ps);
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int32_t i = 0; i < np; i++) {
                m_sh = fmaxf(m_sh, ps[i]);
            }
        }
        __syncthreads();
    }
    const float m = m_sh;
    for (int32_t p0 = 0; p0 < n_pos; p0 += PROB_TILE) {
        const int32_t np = n_pos - p0 < PROB_TILE ? n_pos - p0 : PROB_TILE;
        tile_scores(qs, cache, in, t, p0, np, bs, D, scale, ps);
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int32_t i = 0; i < np; i++) {
                sum_sh += (double)exp_f(ps[i] - m);
            }
        }
        __syncthreads();
    }
    const float inv = (float)(1.0 / sum_sh);
    /* the values: the first R dims of the rows, each output one fused chain
     * over the positions in order (values_chunk's) */
    float acc[ACC_PER_THR];
#pragma unroll
    for (int j = 0; j < ACC_PER_THR; j++) {
        acc[j] = 0.0f;
    }
    for (int32_t p0 = 0; p0 < n_pos; p0 += PROB_TILE) {
        const int32_t np = n_pos - p0 < PROB_TILE ? n_pos - p0 : PROB_TILE;
        tile_scores(qs, cache, in, t, p0, np, bs, D, scale, ps);
        __syncthreads();
        for (int32_t i = threadIdx.x; i < np; i += blockDim.x) {
            ps[i] = __half2float(__float2half_rn(exp_f(ps[i] - m) * inv));
        }
        __syncthreads();
        for (int32_t i = 0; i < np; i++) {
            const __half *v = cache + cache_row(in, t, p0 + i, bs) * D;
#pragma unroll
            for (int j = 0; j < ACC_PER_THR; j++) {
                const int32_t r = threadIdx.x + j * MLA_THREADS;
                if (r < R) {
                    acc[j] = fmaf(ps[i], __half2float(v[r]), acc[j]);
                }
            }
        }
        __syncthreads(); /* ps is rewritten by the next tile */
    }
    float *o = out + ((int64_t)t * sh.n_head + h) * R;
#pragma unroll
    for (int j = 0; j < ACC_PER_THR; j++) {
        const int32_t r = threadIdx.x + j * MLA_THREADS;
        if (r < R) {
            o[r] = acc[j];
        }
    }
}

kg_status_t kg_cuda_mla_attention(cudaStream_t stream,
                                  int32_t n_launch,
                                  kg_cuda_inputs_t in,
                                  const kg_cuda_mla_shape_t *sh,
                                  float scale,
                                  const float *qlat,
                                  const __half *cache,
                                  float *out) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    if (sh->rank <= 0 || sh->rank > KG_CUDA_MLA_MAX_DIM || sh->n_rot > KG_CUDA_MLA_MAX_ROT ||
        (sh->rank + sh->n_rot) % 8 != 0) {
        return KG_ERR_INVALID;
    }
    const dim3 grid((unsigned)n_launch, (unsigned)sh->n_head);
    attention_kernel<<<grid, MLA_THREADS, 0, stream>>>(in, *sh, scale, qlat, cache, out);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
