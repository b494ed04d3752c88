/* rope: angles and the attention inputs. Built with --fmad=false so the
 * bias add, the norm, a*cos - b*sin and the query scale round as the CPU
 * backend's do. */
#include "rope.cuh"

#define ROPE_THREADS 128

__global__ void rope_cache_kernel(kg_cuda_inputs_t in,
                                  float *__restrict__ rope_cs,
                                  kg_cuda_rope_t r,
                                  const float *freq_factors,
                                  int32_t n_launch) {
    const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_launch || t >= in.hdr->n_tokens) {
        return;
    }
    float *cs = rope_cs + (int64_t)t * r.n_rot;
    kg_rope_cache_yarn(in.pos[t], r.n_rot, r.base, r.freq_scale, freq_factors, r.ext_factor,
                       r.attn_factor, r.corr_dims, cs, cs + r.n_rot / 2);
}

kg_status_t kg_cuda_rope_cache(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               float *rope_cs,
                               const kg_cuda_rope_t *rope,
                               const float *freq_factors) {
    const int threads = 64;
    rope_cache_kernel<<<(n_launch + threads - 1) / threads, threads, 0, stream>>>(
        in, rope_cs, *rope, freq_factors, n_launch);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* One block per token. Phase 1 (families with biases or Q/K norms) works in
 * place on the token's qkv row in global memory, which the block's threads
 * see after __syncthreads; phase 2 rotates, scales and stores. */
__global__ void __launch_bounds__(ROPE_THREADS) rope_store_kernel(kg_cuda_inputs_t in,
                                                                  kg_cuda_rope_shape_t sh,
                                                                  kg_cuda_qkv_ops_t ops,
                                                                  float *__restrict__ qkv,
                                                                  const float *__restrict__ rope_cs,
                                                                  __half *__restrict__ q16,
                                                                  kg_cuda_kv_t kv) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int32_t hd = sh.head_dim, half_hd = hd / 2, half_rot = sh.n_rot / 2;
    const int64_t n_q = (int64_t)sh.n_head * hd, n_kv = (int64_t)sh.n_head_kv * hd;
    float *src = qkv + (int64_t)t * (sh.stride > 0 ? (int64_t)sh.stride : n_q + 2 * n_kv);
    const float *cs = rope_cs + (int64_t)t * sh.n_rot;
    const int32_t pos = in.pos[t];
    const int64_t row = (int64_t)in.table[in.tbl_off[t] + pos / sh.block_size] * sh.block_size +
                        pos % sh.block_size;

    /* 1. biases (ggml_add), then RMSNorm of each q and k head (build_norm
     * on (head_dim, n_head, T)): a warp per head, squares summed in double
     * as cpu_rmsnorm_rows does */
    if (ops.bias) {
        for (int64_t e = threadIdx.x; e < n_q + 2 * n_kv; e += blockDim.x) {
            src[e] = src[e] + ops.bias[e];
        }
        __syncthreads();
    }
    if (ops.q_norm || ops.v_norm) {
        /* a unit is a head, or with norm_full all of q, then all of k; then
         * with v_norm each v head (no weight: ggml_rms_norm alone) */
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
        const int32_t n_qk = !ops.q_norm ? 0 : ops.norm_full ? 2 : sh.n_head + sh.n_head_kv;
        const int32_t n_units = n_qk + (ops.v_norm ? sh.n_head_kv : 0);
        for (int32_t h = warp; h < n_units; h += n_warps) {
            const bool is_v = h >= n_qk;
            const bool is_q = !is_v && (ops.norm_full ? h == 0 : h < sh.n_head);
            const int64_t width = is_v || !ops.norm_full ? hd : is_q ? n_q : n_kv;
            float *x = is_v ? src + n_q + n_kv + (int64_t)(h - n_qk) * hd
                            : src + (ops.norm_full ? (is_q ? 0 : n_q) : (int64_t)h * hd);
            const float *w = is_v ? NULL : is_q ? ops.q_norm : ops.k_norm;
            double sum = 0.0;
            for (int64_t e = lane; e < width; e += 32) {
                sum += (double)(x[e] * x[e]);
            }
            sum = kg_warp_sum_d(sum);
            const float mean = (float)(sum / (double)width);
            const float scale = 1.0f / sqrtf(mean + ops.norm_eps);
            for (int64_t e = lane; e < width; e += 32) {
                x[e] = w ? (x[e] * scale) * w[e] : x[e] * scale;
            }
        }
        __syncthreads();
    }

    /* 2. q and k: pair i of a head is (2i, 2i+1) in normal mode; in NeoX
     * mode (i, i + n_rot/2) for i < n_rot/2, and the dims past n_rot pass
     * through two at a time; heads 0..n_head-1 are q, the next n_head_kv k */
    const int32_t n_pairs = (sh.n_head + sh.n_head_kv) * half_hd;
    const float temp = ops.temp_scale != 0.0f
                           ? kg_attn_temp(ops.temp_scale, ops.temp_floor, pos + ops.temp_offset)
                           : 1.0f;
    for (int32_t j = threadIdx.x; j < n_pairs; j += blockDim.x) {
        const int32_t h = j / half_hd, i = j % half_hd;
        int32_t ia = 2 * i, ib = 2 * i + 1;
        if (ops.neox) {
            ia = i < half_rot ? i : sh.n_rot + 2 * (i - half_rot);
            ib = i < half_rot ? i + half_rot : ia + 1;
        }
        float a = src[(int64_t)h * hd + ia], b = src[(int64_t)h * hd + ib];
        if (i < half_rot && !ops.no_rope) {
            kg_rope_pair(&a, &b, cs[i], cs[half_rot + i]);
        }
        if (h < sh.n_head) {
            if (ops.temp_scale != 0.0f) {
                a = a * temp;
                b = b * temp;
            }
            if (ops.q_scale != 0.0f) {
                a = a * ops.q_scale;
                b = b * ops.q_scale;
            }
            __half *dst = q16 + (int64_t)t * n_q + (int64_t)h * hd;
            dst[ia] = __float2half_rn(a);
            dst[ib] = __float2half_rn(b);
        } else if (kv.q8) { /* quantized below, a block of 32 at a time */
            src[(int64_t)h * hd + ia] = a;
            src[(int64_t)h * hd + ib] = b;
        } else {
            __half *dst = (__half *)kv.k + row * n_kv + (int64_t)(h - sh.n_head) * hd;
            dst[ia] = __float2half_rn(a);
            dst[ib] = __float2half_rn(b);
        }
    }
    if (!kv.q8) {
        for (int64_t e = threadIdx.x; e < n_kv; e += blockDim.x) {
            ((__half *)kv.v)[row * n_kv + e] = __float2half_rn(src[n_q + n_kv + e]);
        }
        return;
    }
    /* 3. Q8_0: the rotated k and v rows, a warp per block of 32 (k's
     * blocks, then v's: they follow each other in src) */
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int32_t kb = (int32_t)(n_kv / 32);
    for (int32_t b = warp; b < 2 * kb; b += n_warps) {
        void *plane = b < kb ? kv.k : kv.v;
        const int32_t bb = b < kb ? b : b - kb;
        kg_kv_q8_store32(src[n_q + (int64_t)b * 32 + lane], lane,
                         kg_kv_q8_vals(plane, row, sh.block_size, n_kv) + bb * 32,
                         kg_kv_q8_scales(plane, row, sh.block_size, n_kv) + bb);
    }
}

kg_status_t kg_cuda_rope_store(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               const kg_cuda_rope_shape_t *sh,
                               const kg_cuda_qkv_ops_t *ops,
                               float *qkv,
                               const float *rope_cs,
                               __half *q16,
                               kg_cuda_kv_t kv) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    rope_store_kernel<<<n_launch, ROPE_THREADS, 0, stream>>>(in, *sh, *ops, qkv, rope_cs, q16, kv);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
