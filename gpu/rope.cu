/* rope: angles and rotation. Built with --fmad=false so a*cos - b*sin
 * rounds as the CPU's kg_rope_pair does. */
#include "rope.cuh"

__global__ void rope_cache_kernel(kg_cuda_inputs_t in,
                                  float *__restrict__ rope_cs,
                                  int32_t n_rot,
                                  float base,
                                  float freq_scale,
                                  const float *freq_factors,
                                  int32_t n_launch) {
    const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_launch || t >= in.hdr->n_tokens) {
        return;
    }
    float *cs = rope_cs + (int64_t)t * n_rot;
    kg_rope_cache(in.pos[t], n_rot, base, freq_scale, freq_factors, cs, cs + n_rot / 2);
}

kg_status_t kg_cuda_rope_cache(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               float *rope_cs,
                               int32_t n_rot,
                               float base,
                               float freq_scale,
                               const float *freq_factors) {
    const int threads = 64;
    rope_cache_kernel<<<(n_launch + threads - 1) / threads, threads, 0, stream>>>(
        in, rope_cs, n_rot, base, freq_scale, freq_factors, n_launch);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void rope_store_kernel(kg_cuda_inputs_t in,
                                  kg_cuda_rope_shape_t sh,
                                  const float *__restrict__ qkv,
                                  const float *__restrict__ rope_cs,
                                  __half *__restrict__ q16,
                                  __half *__restrict__ k_cache,
                                  __half *__restrict__ v_cache) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int32_t hd = sh.head_dim, half_hd = hd / 2, half_rot = sh.n_rot / 2;
    const int64_t n_q = (int64_t)sh.n_head * hd, n_kv = (int64_t)sh.n_head_kv * hd;
    const float *src = qkv + (int64_t)t * (n_q + 2 * n_kv);
    const float *cs = rope_cs + (int64_t)t * sh.n_rot;
    const int32_t pos = in.pos[t];
    const int64_t row = (int64_t)in.table[in.tbl_off[t] + pos / sh.block_size] * sh.block_size +
                        pos % sh.block_size;

    /* q and k pairs: heads 0..n_head-1 are q, the next n_head_kv are k */
    const int32_t n_pairs = (sh.n_head + sh.n_head_kv) * half_hd;
    for (int32_t j = threadIdx.x; j < n_pairs; j += blockDim.x) {
        const int32_t h = j / half_hd, i = j % half_hd;
        const int64_t off = (int64_t)h * hd + 2 * i; /* within q|k of this token */
        float a = src[off], b = src[off + 1];
        if (i < half_rot) {
            kg_rope_pair(&a, &b, cs[i], cs[half_rot + i]);
        }
        __half *dst =
            h < sh.n_head ? q16 + (int64_t)t * n_q + off : k_cache + row * n_kv + (off - n_q);
        dst[0] = __float2half_rn(a);
        dst[1] = __float2half_rn(b);
    }
    for (int64_t e = threadIdx.x; e < n_kv; e += blockDim.x) {
        v_cache[row * n_kv + e] = __float2half_rn(src[n_q + n_kv + e]);
    }
}

kg_status_t kg_cuda_rope_store(cudaStream_t stream,
                               int32_t n_launch,
                               kg_cuda_inputs_t in,
                               const kg_cuda_rope_shape_t *sh,
                               const float *qkv,
                               const float *rope_cs,
                               __half *q16,
                               __half *k_cache,
                               __half *v_cache) {
    rope_store_kernel<<<n_launch, 128, 0, stream>>>(in, *sh, qkv, rope_cs, q16, k_cache, v_cache);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
