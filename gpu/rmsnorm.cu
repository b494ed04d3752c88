/* rmsnorm: residual add + RMSNorm, one block per row. Built with
 * --fmad=false so the products round as the CPU backend's do. */
#include "rmsnorm.cuh"

__global__ void __launch_bounds__(256) add_rmsnorm_kernel(const kg_cuda_step_hdr_t *hdr,
                                                          bool outputs,
                                                          const int32_t *map,
                                                          float *__restrict__ x,
                                                          kg_cuda_residual_t res,
                                                          const float *__restrict__ w,
                                                          void *__restrict__ y,
                                                          int dt,
                                                          void *__restrict__ y2,
                                                          int dt2,
                                                          int32_t n,
                                                          float eps) {
    __shared__ double red[32];
    const int32_t i = blockIdx.x;
    if (i >= (outputs ? hdr->n_outputs : hdr->n_tokens)) {
        return;
    }
    const int64_t r = map ? map[i] : i;
    float *xr = x + r * n;
    const float *add = res.add ? res.add + r * n : NULL;
    /* the block output's own norm (Gemma's post-attention / post-FFN norm),
     * after its bias */
    float add_scale = 1.0f;
    if (add && res.add_w) {
        double sum = 0.0;
        for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
            const float a = res.add_b ? add[e] + res.add_b[e] : add[e];
            sum += (double)(a * a);
        }
        sum = kg_block_sum_d(sum, red);
        add_scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    }
    double sum = 0.0;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        float v = xr[e];
        if (add) {
            float a = res.add_b ? add[e] + res.add_b[e] : add[e];
            if (res.add_w) {
                a = (a * add_scale) * res.add_w[e];
            }
            if (res.scale != 0.0f) {
                a = a * res.scale;
            }
            v += a;
            xr[e] = v;
        }
        sum += (double)(v * v);
    }
    sum = kg_block_sum_d(sum, red);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        /* no weight: the row itself (olmo2's blocks have no input norm) */
        const float v = w ? (xr[e] * scale) * w[e] : xr[e];
        kg_st(y, (int64_t)i * n + e, v, dt);
        if (y2) {
            kg_st(y2, (int64_t)i * n + e, v, dt2);
        }
    }
}

kg_status_t kg_cuda_add_rmsnorm(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                bool outputs,
                                const int32_t *map,
                                float *x,
                                const kg_cuda_residual_t *res,
                                const float *w,
                                void *y,
                                kg_cuda_dtype_t dt,
                                void *y2,
                                kg_cuda_dtype_t dt2,
                                int32_t n,
                                float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    add_rmsnorm_kernel<<<n_launch, 256, 0, stream>>>(hdr, outputs, map, x, *res, w, y, (int)dt, y2,
                                                     (int)dt2, n, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
