/* moe: the mixture-of-experts kernels (see moe.cuh). Built with
 * --fmad=false so the router's and the combination's products round as the
 * C code's do; the grouped GEMM's chains call fmaf explicitly. */
#include "geglu.cuh"
#include "gemm.cuh"
#include "kg_cuda_ops.h"
#include "moe.cuh"
#include "moe_ops.h"
#include "qblocks.cuh"

#include <mma.h>
#include <string.h>

using namespace nvcuda;

extern "C" {
#include "../src/model/kg_quant.h"
#include "../src/model/kg_quantize.h"
}

/* The most experts the align kernel lays out (kg_model's KG_MOE_MAX_EXPERTS). */
#define MOE_MAX_EXPERTS 1024
/* Grouped GEMM: output columns per block (one per thread) and inputs per
 * shared-memory chunk. */
#define GEMM_COLS  64
#define GEMM_CHUNK 32

// ---- route ----

/* Insert (v, e) into the descending list (val, idx) of at most k entries;
 * of equal values the earlier one stays first (cpu_moe.c's top_k). */
__device__ __forceinline__ void
top_k_insert(float *val, int32_t *idx, int32_t *count, int32_t k, float v, int32_t e) {
    if (*count == k && !(v > val[k - 1])) {
        return;
    }
    int32_t i = *count < k ? (*count)++ : k - 1;
    while (i > 0 && v > val[i - 1]) {
        val[i] = val[i - 1];
        idx[i] = idx[i - 1];
        i--;
    }
    val[i] = v;
    idx[i] = e;
}

/* A router logit plus the router's bias (ggml_add), recomputed where it is
 * needed: the same float each time. */
__device__ __forceinline__ float router_logit(const float *lg, const float *bias, int32_t e) {
    return bias ? lg[e] + bias[e] : lg[e];
}

/* Expert e's probability, the value that weighs it: its logit (gpt-oss,
 * softmaxed after the choice), its sigmoid, or its softmax share (m the
 * largest logit, inv the reciprocal of the sum). Recomputed where needed:
 * the same float each time. */
__device__ __forceinline__ float router_prob(const kg_cuda_moe_router_t &r,
                                             const float *lg,
                                             const float *bias,
                                             int32_t e,
                                             float m,
                                             float inv) {
    const float x = router_logit(lg, bias, e);
    if (r.top_k_then_softmax) {
        return x;
    }
    if (r.sigmoid) {
        return 1.0f / (1.0f + expf(-x)); /* ggml_vec_sigmoid_f32 */
    }
    return expf(x - m) * inv;
}

/* The value that chooses expert e: its probability (llama4: its logit)
 * plus the selection bias (exp_probs_b; NULL: none). */
__device__ __forceinline__ float router_choice(const kg_cuda_moe_router_t &r,
                                               const float *lg,
                                               const float *bias,
                                               const float *probs_b,
                                               int32_t e,
                                               float m,
                                               float inv) {
    const float p = r.w_on_input ? router_logit(lg, bias, e) : router_prob(r, lg, bias, e, m, inv);
    return probs_b ? p + probs_b[e] : p;
}

__global__ void moe_route_kernel(const kg_cuda_step_hdr_t *hdr,
                                 kg_cuda_moe_router_t r,
                                 const float *__restrict__ logits,
                                 const float *__restrict__ bias,
                                 const float *__restrict__ probs_b,
                                 int32_t *__restrict__ sel,
                                 float *__restrict__ wout,
                                 int32_t n_launch) {
    const int32_t t = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= hdr->n_tokens || t >= n_launch) {
        return;
    }
    const float *lg = logits + (int64_t)t * r.n_expert;
    float val[KG_CUDA_MOE_MAX_K], w[KG_CUDA_MOE_MAX_K];
    int32_t idx[KG_CUDA_MOE_MAX_K], count = 0;
    /* the softmax's max and reciprocal sum (unused by the other rules) */
    float m = -INFINITY, inv = 1.0f;
    if (!r.top_k_then_softmax && !r.sigmoid) {
        for (int32_t e = 0; e < r.n_expert; e++) {
            m = fmaxf(m, router_logit(lg, bias, e));
        }
        double sum = 0.0;
        for (int32_t e = 0; e < r.n_expert; e++) {
            sum += (double)expf(router_logit(lg, bias, e) - m);
        }
        inv = (float)(1.0 / sum);
    }
    /* group-limited top-k: each group scored by its two best choices, the
     * n_group_used best groups kept (cpu_moe.c's mask_groups) */
    uint64_t keep = ~0ull;
    if (r.n_groups > 1) {
        const int32_t per = r.n_expert / r.n_groups;
        float gval[KG_CUDA_MOE_MAX_GROUPS], top[2];
        int32_t gidx[KG_CUDA_MOE_MAX_GROUPS], tidx[2], gcount = 0;
        for (int32_t gi = 0; gi < r.n_groups; gi++) {
            int32_t tc = 0;
            for (int32_t e = 0; e < per; e++) {
                top_k_insert(top, tidx, &tc, 2,
                             router_choice(r, lg, bias, probs_b, gi * per + e, m, inv), e);
            }
            top_k_insert(gval, gidx, &gcount, r.n_group_used, top[0] + top[1], gi);
        }
        keep = 0;
        for (int32_t j = 0; j < r.n_group_used; j++) {
            keep |= 1ull << gidx[j];
        }
    }
    const int32_t per = r.n_groups > 1 ? r.n_expert / r.n_groups : r.n_expert;
    for (int32_t e = 0; e < r.n_expert; e++) {
        const float v =
            keep >> (e / per) & 1ull ? router_choice(r, lg, bias, probs_b, e, m, inv) : -INFINITY;
        top_k_insert(val, idx, &count, r.k, v, e);
    }
    for (int32_t j = 0; j < r.k; j++) {
        w[j] = router_prob(r, lg, bias, idx[j], m, inv);
    }
    if (r.top_k_then_softmax) {
        /* gpt-oss: a softmax over the k chosen logits */
        float mk = -INFINITY;
        for (int32_t j = 0; j < r.k; j++) {
            mk = fmaxf(mk, w[j]);
        }
        double sum = 0.0;
        for (int32_t j = 0; j < r.k; j++) {
            w[j] = expf(w[j] - mk);
            sum += (double)w[j];
        }
        const float ik = (float)(1.0 / sum);
        for (int32_t j = 0; j < r.k; j++) {
            w[j] *= ik;
        }
    }
    if (r.norm_w) {
        double sum = 0.0;
        for (int32_t j = 0; j < r.k; j++) {
            sum += (double)w[j];
        }
        float s = (float)sum;
        s = s < 6.103515625e-5f ? 6.103515625e-5f : s;
        for (int32_t j = 0; j < r.k; j++) {
            w[j] = w[j] / s;
        }
    }
    for (int32_t j = 0; j < r.k; j++) {
        sel[(int64_t)t * r.k + j] = idx[j];
        wout[(int64_t)t * r.k + j] =
            r.w_scale != 0.0f && r.w_scale != 1.0f ? w[j] * r.w_scale : w[j];
    }
}

kg_status_t kg_cuda_moe_route(cudaStream_t stream,
                              int32_t n_launch,
                              const kg_cuda_step_hdr_t *hdr,
                              const kg_cuda_moe_router_t *r,
                              const float *logits,
                              const float *bias,
                              const float *probs_b,
                              const kg_cuda_moe_plan_t *plan) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    const unsigned blocks = (unsigned)((n_launch + 127) / 128);
    moe_route_kernel<<<blocks, 128, 0, stream>>>(hdr, *r, logits, bias, probs_b, plan->sel, plan->w,
                                                 n_launch);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

// ---- align ----

__global__ void moe_align_kernel(const kg_cuda_step_hdr_t *hdr,
                                 kg_cuda_moe_router_t r,
                                 const int32_t *__restrict__ sel,
                                 int32_t *__restrict__ offset,
                                 int32_t *__restrict__ row_tok,
                                 int32_t *__restrict__ slot,
                                 int32_t *__restrict__ tile_expert,
                                 const float *__restrict__ w,
                                 float *__restrict__ row_w,
                                 int32_t rows_cap,
                                 long long *__restrict__ stats) {
    __shared__ int32_t start[MOE_MAX_EXPERTS + 1];
    __shared__ int32_t count[MOE_MAX_EXPERTS];
    const int32_t n = hdr->n_tokens * r.k, T = KG_CUDA_MOE_TILE;
    for (int32_t e = (int32_t)threadIdx.x; e < r.n_expert; e += (int32_t)blockDim.x) {
        int32_t c = 0;
        for (int32_t i = 0; i < n; i++) {
            c += sel[i] == e;
        }
        count[e] = c;
        start[e + 1] = (c + T - 1) / T * T;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0;
        for (int32_t e = 0; e < r.n_expert; e++) {
            start[e + 1] += start[e];
        }
        offset[r.n_expert] = start[r.n_expert];
        if (stats) { /* kg_moe_stats_t's sums; one thread, so no atomics */
            stats[0] += 1;
            stats[1] += n;
            for (int32_t e = 0; e < r.n_expert; e++) {
                stats[2] += count[e] > 0;
                stats[3] = count[e] > stats[3] ? count[e] : stats[3];
                stats[4 + e] += count[e];
            }
        }
    }
    __syncthreads();
    for (int32_t e = (int32_t)threadIdx.x; e < r.n_expert; e += (int32_t)blockDim.x) {
        int32_t row = start[e];
        offset[e] = row;
        for (int32_t i = 0; i < n; i++) { /* token order within the group */
            if (sel[i] == e) {
                row_tok[row] = i / r.k;
                if (row_w) {
                    row_w[row] = w[i];
                }
                slot[i] = row++;
            }
        }
        for (; row < start[e + 1]; row++) {
            row_tok[row] = -1;
            if (row_w) {
                row_w[row] = 0.0f;
            }
        }
        for (int32_t tl = start[e] / T; tl < start[e + 1] / T; tl++) {
            tile_expert[tl] = e;
        }
    }
    for (int32_t tl = start[r.n_expert] / T + (int32_t)threadIdx.x; tl < rows_cap / T;
         tl += (int32_t)blockDim.x) {
        tile_expert[tl] = -1;
    }
}

kg_status_t kg_cuda_moe_align(cudaStream_t stream,
                              const kg_cuda_step_hdr_t *hdr,
                              const kg_cuda_moe_router_t *r,
                              const kg_cuda_moe_plan_t *plan) {
    if (r->n_expert > MOE_MAX_EXPERTS) {
        KG_LOG_ERROR("cuda", "moe: %d experts, at most %d", r->n_expert, MOE_MAX_EXPERTS);
        return KG_ERR_INVALID;
    }
    moe_align_kernel<<<1, 256, 0, stream>>>(hdr, *r, plan->sel, plan->offset, plan->row_tok,
                                            plan->slot, plan->tile_expert, plan->w, plan->row_w,
                                            plan->rows_cap, plan->stats);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

// ---- grouped GEMM ----

/* F32 experts (test models, exact parity with the CPU): block (column tile,
 * row tile), GEMM_COLS threads, thread c owns output column blockIdx.x *
 * GEMM_COLS + c of the tile's KG_CUDA_MOE_TILE rows. The tile's inputs and
 * the expert's weights go through shared memory a chunk of GEMM_CHUNK
 * inputs at a time (weights loaded row-contiguous, so a warp reads 32
 * consecutive elements of one weight row); the chain of each output
 * element runs over the inputs in order from +0. */
__global__ void moe_gemm_kernel(const int32_t *__restrict__ tile_expert,
                                const int32_t *__restrict__ row_tok,
                                const float *__restrict__ row_w,
                                const float *__restrict__ w,
                                const float *__restrict__ bias,
                                const float *__restrict__ x,
                                int gather,
                                float *__restrict__ y,
                                int32_t n_out,
                                int32_t n_in) {
    const int32_t tile = (int32_t)blockIdx.y, e = tile_expert[tile];
    if (e < 0) {
        return; /* past the last expert's rows: the whole block leaves */
    }
    __shared__ float xs[KG_CUDA_MOE_TILE][GEMM_CHUNK];
    __shared__ float ws[GEMM_COLS][GEMM_CHUNK + 1]; /* +1: no bank conflicts reading a row */
    const int c = (int)threadIdx.x;
    const int32_t col = (int32_t)blockIdx.x * GEMM_COLS + c, r0 = tile * KG_CUDA_MOE_TILE;
    const int64_t wbase = (int64_t)e * n_out * n_in;
    float acc[KG_CUDA_MOE_TILE];
    for (int r = 0; r < KG_CUDA_MOE_TILE; r++) {
        acc[r] = 0.0f;
    }
    for (int32_t k0 = 0; k0 < n_in; k0 += GEMM_CHUNK) {
        const int32_t kn = n_in - k0 < GEMM_CHUNK ? n_in - k0 : GEMM_CHUNK;
        for (int i = c; i < KG_CUDA_MOE_TILE * GEMM_CHUNK; i += GEMM_COLS) {
            const int rr = i / GEMM_CHUNK, kk = i % GEMM_CHUNK;
            const int32_t tok = row_tok[r0 + rr];
            const int32_t src = tok < 0 ? -1 : (gather ? tok : r0 + rr);
            float v = src >= 0 && kk < kn ? x[(int64_t)src * n_in + k0 + kk] : 0.0f;
            if (row_w && gather && src >= 0) { /* llama4: the row times its weight */
                v = v * row_w[r0 + rr];
            }
            xs[rr][kk] = v;
        }
        for (int i = c; i < GEMM_COLS * GEMM_CHUNK; i += GEMM_COLS) {
            const int cc = i / GEMM_CHUNK, kk = i % GEMM_CHUNK;
            const int32_t oc = (int32_t)blockIdx.x * GEMM_COLS + cc;
            ws[cc][kk] = oc < n_out && kk < kn ? w[wbase + (int64_t)oc * n_in + k0 + kk] : 0.0f;
        }
        __syncthreads();
        for (int32_t kk = 0; kk < kn; kk++) {
            const float wv = ws[c][kk];
            for (int r = 0; r < KG_CUDA_MOE_TILE; r++) {
                acc[r] = fmaf(xs[r][kk], wv, acc[r]);
            }
        }
        __syncthreads();
    }
    if (col >= n_out) {
        return;
    }
    for (int r = 0; r < KG_CUDA_MOE_TILE; r++) {
        if (row_tok[r0 + r] >= 0) {
            const float b = bias ? bias[(int64_t)e * n_out + col] : 0.0f;
            y[(int64_t)(r0 + r) * n_out + col] = bias ? acc[r] + b : acc[r];
        }
    }
}

/* 16-bit or native (QT: its GGUF type) experts, on tensor cores: block
 * (column tile of MMA_COLS, row tile of KG_CUDA_MOE_TILE rows of one
 * expert), one warp per 16 columns, each a 16 x 16 fragment whose rows 8-15
 * are zero; k in stages of MMA_K through shared memory, the inputs rounded
 * to T (llama4's gathered rows times their weight first, as the CPU rounds
 * x * w), a native matrix's weights expanded 8 a thread as the upload would
 * have stored them. Each output is the chain of 16-wide steps over k
 * ascending whatever the group: a row's result does not depend on the
 * rows beside it. */
#define MMA_COLS 32
#define MMA_K    64
#define MMA_LD   (MMA_K + 8) /* halves a shared row: 16 bytes of padding keep WMMA's ldm legal */

__device__ __forceinline__ uint16_t moe_to16(float v, bool f16) {
    return f16 ? __half_as_ushort(__float2half_rn(v))
               : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <class T, int QT>
__global__ void __launch_bounds__(MMA_COLS * 2)
    moe_mma_kernel(const int32_t *__restrict__ tile_expert,
                   const int32_t *__restrict__ row_tok,
                   const float *__restrict__ row_w,
                   const void *__restrict__ w,
                   const uint8_t *__restrict__ w_tail,
                   const float *__restrict__ bias,
                   const void *__restrict__ x,
                   int gather,
                   float *__restrict__ y,
                   int32_t n_out,
                   int32_t n_in,
                   int dt) {
    constexpr int NT = MMA_COLS * 2; /* 2 warps */
    const int32_t tile = (int32_t)blockIdx.y, e = tile_expert[tile];
    if (e < 0) {
        return;
    }
    __shared__ __align__(32) uint16_t xs[16][MMA_LD];
    __shared__ __align__(32) uint16_t ws[MMA_COLS][MMA_LD];
    __shared__ __align__(32) float patch[2][256];
    const int tid = (int)threadIdx.x, warp = tid >> 5;
    const int32_t r0 = tile * KG_CUDA_MOE_TILE, n0 = (int32_t)blockIdx.x * MMA_COLS;
    const bool f16 = dt == KG_CUDA_F16;
    for (int i = tid; i < (16 - KG_CUDA_MOE_TILE) * MMA_LD; i += NT) { /* rows 8-15: zero */
        xs[KG_CUDA_MOE_TILE + i / MMA_LD][i % MMA_LD] = 0;
    }
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int32_t k0 = 0; k0 < n_in; k0 += MMA_K) {
        const int32_t kn = n_in - k0 < MMA_K ? n_in - k0 : MMA_K;
        for (int i = tid; i < KG_CUDA_MOE_TILE * MMA_K; i += NT) {
            const int rr = i / MMA_K, kk = i % MMA_K;
            const int32_t tok = row_tok[r0 + rr];
            const int32_t src = tok < 0 ? -1 : (gather ? tok : r0 + rr);
            float v = src >= 0 && kk < kn ? kg_ld(x, (int64_t)src * n_in + k0 + kk, dt) : 0.0f;
            if (row_w && gather && src >= 0) { /* llama4: the row times its weight */
                v = v * row_w[r0 + rr];
            }
            xs[rr][kk] = moe_to16(v, f16);
        }
        if constexpr (QT == 0) {
            const uint16_t *w16 = (const uint16_t *)w;
            for (int i = tid; i < MMA_COLS * MMA_K; i += NT) {
                const int cc = i / MMA_K, kk = i % MMA_K;
                const int32_t oc = n0 + cc;
                ws[cc][kk] = oc < n_out && kk < kn ? w16[((int64_t)e * n_out + oc) * n_in + k0 + kk]
                                                   : (uint16_t)0;
            }
        } else { /* n_in is whole blocks, so kn is a multiple of 8 */
            constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
            for (int i = tid; i < MMA_COLS * MMA_K / 8; i += NT) {
                const int cc = i / (MMA_K / 8), kk = (i % (MMA_K / 8)) * 8;
                const int32_t oc = n0 + cc;
                float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                if (oc < n_out && kk < kn) {
                    const int64_t k = k0 + kk, row = (int64_t)e * n_out + oc;
                    qpiece<QT> p;
                    p.load((const uint8_t *)w, w_tail, row * (n_in / L.elems) + k / L.elems,
                           (int)(k % L.elems));
                    p.expand((int)(k % L.elems), f);
                }
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    ws[cc][kk + j] = kg_q_bf16(f[j]);
                }
            }
        }
        __syncthreads();
        for (int kk = 0; kk < kn; kk += 16) { /* past kn: zeros, the same steps for every row */
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
            wmma::load_matrix_sync(fa, (const T *)&xs[0][kk], MMA_LD);
            wmma::load_matrix_sync(fb, (const T *)&ws[warp * 16][kk], MMA_LD);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(patch[warp], acc, 16, wmma::mem_row_major);
    __syncwarp(); /* each lane reads what the others stored */
    for (int i = tid & 31; i < KG_CUDA_MOE_TILE * 16; i += 32) {
        const int r = i / 16;
        const int32_t col = n0 + warp * 16 + i % 16;
        if (col < n_out && row_tok[r0 + r] >= 0) {
            const float v = patch[warp][i];
            y[(int64_t)(r0 + r) * n_out + col] = bias ? v + bias[(int64_t)e * n_out + col] : v;
        }
    }
}

template <int QT>
static kg_status_t moe_mma_launch(cudaStream_t stream,
                                  const kg_cuda_moe_plan_t *plan,
                                  const void *w,
                                  const uint8_t *w_tail,
                                  const float *bias,
                                  const void *x,
                                  int gather,
                                  float *y,
                                  int32_t n_out,
                                  int32_t n_in,
                                  kg_cuda_dtype_t dt) {
    const dim3 grid((unsigned)((n_out + MMA_COLS - 1) / MMA_COLS),
                    (unsigned)(plan->rows_cap / KG_CUDA_MOE_TILE));
    if constexpr (QT == 0) {
        if (dt == KG_CUDA_F16) {
            moe_mma_kernel<__half, 0><<<grid, MMA_COLS * 2, 0, stream>>>(
                plan->tile_expert, plan->row_tok, plan->row_w, w, w_tail, bias, x, gather, y, n_out,
                n_in, (int)dt);
            KG_CUDA_CHECK_LAUNCH();
            return KG_OK;
        }
    }
    if (dt != KG_CUDA_BF16) {
        return KG_ERR_INVALID; /* blocks expand to BF16 */
    }
    moe_mma_kernel<__nv_bfloat16, QT>
        <<<grid, MMA_COLS * 2, 0, stream>>>(plan->tile_expert, plan->row_tok, plan->row_w, w,
                                            w_tail, bias, x, gather, y, n_out, n_in, (int)dt);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

kg_status_t kg_cuda_moe_gemm(cudaStream_t stream,
                             const kg_cuda_moe_plan_t *plan,
                             const void *w,
                             const float *bias,
                             const void *x,
                             int gather,
                             float *y,
                             int32_t n_out,
                             int32_t n_in,
                             kg_cuda_dtype_t dt,
                             int qtype,
                             const void *w_tail) {
    if (dt == KG_CUDA_F32) {
        if (qtype != 0) {
            return KG_ERR_INVALID;
        }
        const dim3 grid((unsigned)((n_out + GEMM_COLS - 1) / GEMM_COLS),
                        (unsigned)(plan->rows_cap / KG_CUDA_MOE_TILE));
        moe_gemm_kernel<<<grid, GEMM_COLS, 0, stream>>>(plan->tile_expert, plan->row_tok,
                                                        plan->row_w, (const float *)w, bias,
                                                        (const float *)x, gather, y, n_out, n_in);
        KG_CUDA_CHECK_LAUNCH();
        return KG_OK;
    }
    const uint8_t *t = (const uint8_t *)w_tail;
    return kg_q_dispatch(qtype, [&](auto qt) {
        return moe_mma_launch<decltype(qt)::value>(stream, plan, w, t, bias, x, gather, y, n_out,
                                                   n_in, dt);
    });
}

// ---- activation and combination ----

__global__ void moe_act_kernel(const int32_t *__restrict__ row_tok,
                               const float *__restrict__ g,
                               const float *__restrict__ u,
                               void *__restrict__ h,
                               int dt,
                               int32_t n_ff,
                               int act,
                               const uint16_t *__restrict__ table,
                               int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (row_tok[i / n_ff] < 0) {
            continue;
        }
        const float v = act == KG_CUDA_MOE_ACT_GEGLU      ? kg_cuda_geglu1(table, g[i], u[i])
                        : act == KG_CUDA_MOE_ACT_RELU_SQR ? kg_relu_sqr(u[i])
                        : act == KG_CUDA_MOE_ACT_OAI      ? kg_swiglu_oai(g[i], u[i], 1.702f, 7.0f)
                                                          : kg_silu(g[i]) * u[i];
        kg_st(h, i, v, dt);
    }
}

kg_status_t kg_cuda_moe_act(cudaStream_t stream,
                            const kg_cuda_moe_plan_t *plan,
                            const float *g,
                            const float *u,
                            void *h,
                            kg_cuda_dtype_t dt,
                            int32_t n_ff,
                            int act) {
    const int64_t total = (int64_t)plan->rows_cap * n_ff;
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    moe_act_kernel<<<(unsigned)blocks, 256, 0, stream>>>(plan->row_tok, g, u, h, (int)dt, n_ff, act,
                                                         (const uint16_t *)NULL, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

kg_status_t kg_cuda_moe_act_geglu(cudaStream_t stream,
                                  const kg_cuda_moe_plan_t *plan,
                                  const float *g,
                                  const float *u,
                                  const uint16_t *table,
                                  void *h,
                                  kg_cuda_dtype_t dt,
                                  int32_t n_ff) {
    const int64_t total = (int64_t)plan->rows_cap * n_ff;
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    moe_act_kernel<<<(unsigned)blocks, 256, 0, stream>>>(plan->row_tok, g, u, h, (int)dt, n_ff,
                                                         KG_CUDA_MOE_ACT_GEGLU, table, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void moe_combine_kernel(const kg_cuda_step_hdr_t *hdr,
                                   int32_t k,
                                   int unweighted,
                                   const int32_t *__restrict__ slot,
                                   const float *__restrict__ w,
                                   const float *__restrict__ y,
                                   const float *__restrict__ add,
                                   float *__restrict__ out,
                                   int32_t n,
                                   int64_t total) {
    const int64_t end = (int64_t)hdr->n_tokens * n < total ? (int64_t)hdr->n_tokens * n : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n, c = i % n;
        /* unweighted (llama4): the weight was on the input; y * 1 would be y */
        float acc = y[(int64_t)slot[t * k] * n + c] * (unweighted ? 1.0f : w[t * k]);
        for (int32_t j = 1; j < k; j++) {
            const float prod =
                y[(int64_t)slot[t * k + j] * n + c] * (unweighted ? 1.0f : w[t * k + j]);
            acc = acc + prod;
        }
        out[i] = add ? acc + add[i] : acc;
    }
}

kg_status_t kg_cuda_moe_combine(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                const kg_cuda_moe_router_t *r,
                                const kg_cuda_moe_plan_t *plan,
                                const float *y,
                                const float *add,
                                float *out,
                                int32_t n) {
    const int64_t total = (int64_t)n_launch * n;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    moe_combine_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, r->k, r->w_on_input, plan->slot,
                                                             plan->w, y, add, out, n, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* One warp per token. */
__global__ void moe_shexp_gate_kernel(const kg_cuda_step_hdr_t *hdr,
                                      const float *__restrict__ w,
                                      const void *__restrict__ x,
                                      int dt,
                                      float *y,
                                      int32_t n) {
    const int32_t t = blockIdx.x, lane = threadIdx.x;
    if (t >= hdr->n_tokens) {
        return;
    }
    float s = 0.0f;
    for (int32_t i = lane; i < n; i += 32) {
        s += w[i] * kg_ld(x, (int64_t)t * n + i, dt);
    }
    const float g = 1.0f / (1.0f + expf(-kg_warp_sum(s)));
    for (int32_t i = lane; i < n; i += 32) {
        y[(int64_t)t * n + i] *= g;
    }
}

kg_status_t kg_cuda_moe_shexp_gate(cudaStream_t stream,
                                   int32_t n_launch,
                                   const kg_cuda_step_hdr_t *hdr,
                                   const float *w,
                                   const void *x,
                                   kg_cuda_dtype_t dt,
                                   float *y,
                                   int32_t n) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    moe_shexp_gate_kernel<<<(unsigned)n_launch, 32, 0, stream>>>(hdr, w, x, (int)dt, y, n);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

// ---- the test entry point (moe_ops.h) ----

/* Up to 24 device buffers freed together. */
typedef struct moe_bufs {
    void *p[24];
    int n;
} moe_bufs_t;

static kg_status_t moe_alloc(moe_bufs_t *b, void **d, size_t size) {
    *d = NULL;
    KG_CUDA_CHECK(cudaMalloc(d, size ? size : 1));
    b->p[b->n++] = *d;
    return KG_OK;
}

/* Host floats (rows of n_in) quantized to GGUF `qtype` (kg_quantize, as a
 * file would hold them) into a new device buffer: native, split into
 * bodies and tails (*tail set); else expanded to BF16 as the upload does
 * for types it keeps no blocks of. */
static kg_status_t moe_put_quant(moe_bufs_t *b,
                                 void **d,
                                 const void **tail,
                                 const float *h,
                                 int64_t rows,
                                 int32_t n_in,
                                 int qtype,
                                 bool native) {
    const size_t row = kg_type_row_size((kg_ggml_type_t)qtype, n_in), n = (size_t)rows * n_in;
    uint8_t *q = (uint8_t *)malloc(row * (size_t)rows);
    uint8_t *out = (uint8_t *)malloc(native ? row * (size_t)rows : n * 2);
    float *f = (float *)malloc(n * sizeof(float));
    kg_status_t st = q && out && f ? KG_OK : KG_ERR_NOMEM;
    for (int64_t r = 0; st == KG_OK && r < rows; r++) {
        if (!kg_quantize((kg_ggml_type_t)qtype, h + r * n_in, q + row * r, n_in)) {
            st = KG_ERR_INVALID;
        }
    }
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(qtype);
    const int64_t blocks = L.elems > 0 ? (int64_t)(n / (size_t)L.elems) : 0;
    if (st == KG_OK && native) {
        kg_cuda_qsplit(qtype, q, blocks, out, out + blocks * L.body);
    } else if (st == KG_OK) { /* the upload's own expansion */
        kg_cuda_weight_convert((kg_ggml_type_t)qtype, q, (int64_t)n, KG_CUDA_BF16, out, f);
    }
    const size_t size = native ? row * (size_t)rows : n * 2;
    if (st == KG_OK) {
        st = moe_alloc(b, d, size);
    }
    if (st == KG_OK && cudaMemcpy(*d, out, size, cudaMemcpyHostToDevice) != cudaSuccess) {
        st = KG_ERR_BACKEND;
    }
    *tail = native && st == KG_OK ? (const char *)*d + blocks * L.body : NULL;
    free(q), free(out), free(f);
    return st;
}

/* Host floats into a new device buffer of type dt (rounded to it). */
static kg_status_t moe_put(moe_bufs_t *b, void **d, const float *h, size_t n, int dt) {
    const size_t es = dt == KG_CUDA_OP_F32 ? 4 : 2;
    void *tmp = malloc(n * es + 1);
    if (!tmp) {
        return KG_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (dt == KG_CUDA_OP_F32) {
            ((float *)tmp)[i] = h[i];
        } else if (dt == KG_CUDA_OP_F16) {
            ((uint16_t *)tmp)[i] = kg_fp32_to_fp16(h[i]);
        } else {
            ((uint16_t *)tmp)[i] = kg_fp32_to_bf16(h[i]);
        }
    }
    kg_status_t st = moe_alloc(b, d, n * es);
    if (st == KG_OK && cudaMemcpy(*d, tmp, n * es, cudaMemcpyHostToDevice) != cudaSuccess) {
        st = KG_ERR_BACKEND;
    }
    free(tmp);
    return st;
}

#define MOE_TRY(expr)                                                                              \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != KG_OK) {                                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define MOE_CUDA(expr)                                                                             \
    do {                                                                                           \
        if ((expr) != cudaSuccess) {                                                               \
            KG_LOG_ERROR("cuda", "%s failed (%s:%d)", #expr, __FILE__, __LINE__);                  \
            st = KG_ERR_BACKEND;                                                                   \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

extern "C" kg_status_t kg_cuda_op_moe_ffn(const kg_cuda_op_moe_t *m,
                                          const float *x,
                                          const float *logits,
                                          float *out,
                                          int32_t *sel,
                                          float *w) {
    moe_bufs_t b;
    memset(&b, 0, sizeof(b));
    kg_status_t st = KG_OK;
    const int32_t T = m->n_tokens, E = m->n_embd, F = m->n_ff, X = m->n_expert, k = m->k;
    const kg_cuda_dtype_t dt = (kg_cuda_dtype_t)m->dtype;
    const kg_cuda_moe_router_t r = {
        X,          k,           m->top_k_then_softmax, m->norm_w,    m->w_scale,
        m->sigmoid, m->n_groups, m->n_group_used,       m->w_on_input};
    kg_cuda_moe_plan_t plan;
    memset(&plan, 0, sizeof(plan));
    plan.rows_cap = kg_cuda_moe_rows_cap(T, k, X);
    const int32_t R = plan.rows_cap;
    const int32_t hdr_h[4] = {T, T, 0, 0};
    void *hdr = NULL, *dx = NULL, *dl = NULL, *dg = NULL, *du = NULL, *dd = NULL, *gb = NULL,
         *ub = NULL, *db = NULL, *g = NULL, *u = NULL, *h = NULL, *y = NULL, *dout = NULL,
         *pb = NULL;
    const void *tg = NULL, *tu = NULL, *td = NULL; /* native blocks' tails */
    const int qt = m->qtype != 0 && m->native ? m->qtype : 0;
    if (k < 1 || k > KG_CUDA_MOE_MAX_K || k > X || X > MOE_MAX_EXPERTS || T < 1 ||
        m->n_groups > KG_CUDA_MOE_MAX_GROUPS ||
        (m->qtype != 0 && (dt != KG_CUDA_BF16 || !kg_cuda_gemm_native(m->qtype, E) ||
                           !kg_cuda_gemm_native(m->qtype, F)))) {
        return KG_ERR_INVALID;
    }
    MOE_TRY(moe_alloc(&b, &hdr, sizeof(hdr_h)));
    MOE_CUDA(cudaMemcpy(hdr, hdr_h, sizeof(hdr_h), cudaMemcpyHostToDevice));
    MOE_TRY(moe_put(&b, &dx, x, (size_t)T * E, m->dtype));
    MOE_TRY(moe_put(&b, &dl, logits, (size_t)T * X, KG_CUDA_OP_F32));
    if (m->qtype != 0) {
        MOE_TRY(moe_put_quant(&b, &dg, &tg, m->gate, (int64_t)X * F, E, m->qtype, m->native));
        MOE_TRY(moe_put_quant(&b, &du, &tu, m->up, (int64_t)X * F, E, m->qtype, m->native));
        MOE_TRY(moe_put_quant(&b, &dd, &td, m->down, (int64_t)X * E, F, m->qtype, m->native));
    } else {
        MOE_TRY(moe_put(&b, &dg, m->gate, (size_t)X * F * E, m->dtype));
        MOE_TRY(moe_put(&b, &du, m->up, (size_t)X * F * E, m->dtype));
        MOE_TRY(moe_put(&b, &dd, m->down, (size_t)X * E * F, m->dtype));
    }
    if (m->gate_b) {
        MOE_TRY(moe_put(&b, &gb, m->gate_b, (size_t)X * F, KG_CUDA_OP_F32));
        MOE_TRY(moe_put(&b, &ub, m->up_b, (size_t)X * F, KG_CUDA_OP_F32));
        MOE_TRY(moe_put(&b, &db, m->down_b, (size_t)X * E, KG_CUDA_OP_F32));
    }
    if (m->probs_b) {
        MOE_TRY(moe_put(&b, &pb, m->probs_b, (size_t)X, KG_CUDA_OP_F32));
    }
    MOE_TRY(moe_alloc(&b, (void **)&plan.sel, (size_t)T * k * sizeof(int32_t)));
    MOE_TRY(moe_alloc(&b, (void **)&plan.w, (size_t)T * k * sizeof(float)));
    MOE_TRY(moe_alloc(&b, (void **)&plan.slot, (size_t)T * k * sizeof(int32_t)));
    MOE_TRY(moe_alloc(&b, (void **)&plan.offset, (size_t)(X + 1) * sizeof(int32_t)));
    MOE_TRY(moe_alloc(&b, (void **)&plan.row_tok, (size_t)R * sizeof(int32_t)));
    if (m->w_on_input) {
        MOE_TRY(moe_alloc(&b, (void **)&plan.row_w, (size_t)R * sizeof(float)));
    }
    MOE_TRY(moe_alloc(&b, (void **)&plan.tile_expert,
                      (size_t)(R / KG_CUDA_MOE_TILE) * sizeof(int32_t)));
    MOE_TRY(moe_alloc(&b, &g, (size_t)R * F * sizeof(float)));
    MOE_TRY(moe_alloc(&b, &u, (size_t)R * F * sizeof(float)));
    MOE_TRY(moe_alloc(&b, &h, (size_t)R * F * 4));
    MOE_TRY(moe_alloc(&b, &y, (size_t)R * E * sizeof(float)));
    MOE_TRY(moe_alloc(&b, &dout, (size_t)T * E * sizeof(float)));

    {
        const kg_cuda_step_hdr_t *dh = (const kg_cuda_step_hdr_t *)hdr;
        MOE_TRY(kg_cuda_moe_route(0, T, dh, &r, (const float *)dl, NULL, (const float *)pb, &plan));
        MOE_TRY(kg_cuda_moe_align(0, dh, &r, &plan));
        MOE_TRY(
            kg_cuda_moe_gemm(0, &plan, dg, (const float *)gb, dx, 1, (float *)g, F, E, dt, qt, tg));
        MOE_TRY(
            kg_cuda_moe_gemm(0, &plan, du, (const float *)ub, dx, 1, (float *)u, F, E, dt, qt, tu));
        MOE_TRY(kg_cuda_moe_act(0, &plan, (const float *)g, (const float *)u, h, dt, F, m->oai));
        MOE_TRY(
            kg_cuda_moe_gemm(0, &plan, dd, (const float *)db, h, 0, (float *)y, E, F, dt, qt, td));
        MOE_TRY(kg_cuda_moe_combine(0, T, dh, &r, &plan, (const float *)y, NULL, (float *)dout, E));
    }
    MOE_CUDA(cudaStreamSynchronize(0));
    MOE_CUDA(cudaMemcpy(out, dout, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(sel, plan.sel, (size_t)T * k * sizeof(int32_t), cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(w, plan.w, (size_t)T * k * sizeof(float), cudaMemcpyDeviceToHost));
out:
    for (int i = 0; i < b.n; i++) {
        cudaFree(b.p[i]);
    }
    return st;
}
