/* llama4: the RoPE layers' rotation and Q/K L2 norms (see llama4.cuh).
 * Built with --fmad=false so a*cos - b*sin and the norm round as the CPU
 * backend's do (rope.cu's rotation, the same bits). */
#include "llama4.cuh"

#define L2_THREADS 128

/* One block per token: phase 1 rotates every q and k pair in place, phase 2
 * norms each q and k head, a warp per head. */
__global__ void __launch_bounds__(L2_THREADS) rope_l2norm_kernel(kg_cuda_inputs_t in,
                                                                 kg_cuda_rope_shape_t sh,
                                                                 int neox,
                                                                 float *__restrict__ qkv,
                                                                 const float *__restrict__ rope_cs,
                                                                 float eps) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int32_t hd = sh.head_dim, half_rot = sh.n_rot / 2;
    const int64_t n_q = (int64_t)sh.n_head * hd, n_kv = (int64_t)sh.n_head_kv * hd;
    float *src = qkv + (int64_t)t * (sh.stride > 0 ? (int64_t)sh.stride : n_q + 2 * n_kv);
    const float *cs = rope_cs + (int64_t)t * sh.n_rot;
    /* the rotated pairs of a head: (2i, 2i+1), or NeoX's (i, i + n_rot/2) */
    const int32_t n_pairs = (sh.n_head + sh.n_head_kv) * half_rot;
    for (int32_t j = threadIdx.x; j < n_pairs; j += blockDim.x) {
        const int32_t h = j / half_rot, i = j % half_rot;
        const int32_t ia = neox ? i : 2 * i, ib = neox ? i + half_rot : 2 * i + 1;
        float *x = src + (int64_t)h * hd;
        float a = x[ia], b = x[ib];
        kg_rope_pair(&a, &b, cs[i], cs[half_rot + i]);
        x[ia] = a;
        x[ib] = b;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int32_t h = warp; h < sh.n_head + sh.n_head_kv; h += n_warps) {
        float *x = src + (int64_t)h * hd;
        double sum = 0.0;
        for (int32_t e = lane; e < hd; e += 32) {
            sum += (double)(x[e] * x[e]);
        }
        sum = kg_warp_sum_d(sum);
        const float mean = (float)(sum / (double)hd);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int32_t e = lane; e < hd; e += 32) {
            x[e] = x[e] * scale;
        }
    }
}

kg_status_t kg_cuda_rope_l2norm(cudaStream_t stream,
                                int32_t n_launch,
                                kg_cuda_inputs_t in,
                                const kg_cuda_rope_shape_t *sh,
                                int neox,
                                float *qkv,
                                const float *rope_cs,
                                float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    rope_l2norm_kernel<<<n_launch, L2_THREADS, 0, stream>>>(in, *sh, neox, qkv, rope_cs, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
