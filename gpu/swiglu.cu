/* swiglu: elementwise, one thread per output element. Built with
 * --fmad=false, like the CPU's kg_silu(g) * u. */
#include "swiglu.cuh"

__global__ void swiglu_kernel(const kg_cuda_step_hdr_t *hdr,
                              const float *__restrict__ gu,
                              void *__restrict__ h,
                              int dt,
                              int32_t n_ff,
                              int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * n_ff;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n_ff, f = i % n_ff;
        const float g = gu[t * 2 * n_ff + f], u = gu[t * 2 * n_ff + n_ff + f];
        kg_st(h, i, kg_silu(g) * u, dt);
    }
}

kg_status_t kg_cuda_swiglu(cudaStream_t stream,
                           int32_t n_launch,
                           const kg_cuda_step_hdr_t *hdr,
                           const float *gu,
                           void *h,
                           kg_cuda_dtype_t dt,
                           int32_t n_ff) {
    const int64_t total = (int64_t)n_launch * n_ff;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    swiglu_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, gu, h, (int)dt, n_ff, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void xielu_kernel(const kg_cuda_step_hdr_t *hdr,
                             const float *__restrict__ u,
                             void *__restrict__ h,
                             int dt,
                             int32_t n_ff,
                             float an,
                             float ap,
                             float beta,
                             float eps,
                             int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * n_ff;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        kg_st(h, i, kg_xielu(u[i], an, ap, beta, eps), dt);
    }
}

kg_status_t kg_cuda_xielu(cudaStream_t stream,
                          int32_t n_launch,
                          const kg_cuda_step_hdr_t *hdr,
                          const float *u,
                          void *h,
                          kg_cuda_dtype_t dt,
                          int32_t n_ff,
                          const float params[4]) {
    const int64_t total = (int64_t)n_launch * n_ff;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    xielu_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, u, h, (int)dt, n_ff, params[0],
                                                       params[1], params[2], params[3], total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void relu_sqr_kernel(const kg_cuda_step_hdr_t *hdr,
                                const float *__restrict__ u,
                                void *__restrict__ h,
                                int dt,
                                int32_t n_ff,
                                int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * n_ff;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        kg_st(h, i, kg_relu_sqr(u[i]), dt);
    }
}

kg_status_t kg_cuda_relu_sqr(cudaStream_t stream,
                             int32_t n_launch,
                             const kg_cuda_step_hdr_t *hdr,
                             const float *u,
                             void *h,
                             kg_cuda_dtype_t dt,
                             int32_t n_ff) {
    const int64_t total = (int64_t)n_launch * n_ff;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    relu_sqr_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, u, h, (int)dt, n_ff, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
