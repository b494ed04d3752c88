/* kv_copy: one launch per block pair; a fork copies at most n - 1 blocks,
 * once per request, so the launches cost nothing next to a step. */
#include "kg_cuda_ops.h"
#include "kv_copy.cuh"

/* grid.y: the plane; grid.x * block: the block's elements, as 16-bit words */
__global__ void
kv_copy_kernel(uint16_t *kv, size_t plane_elems, size_t block_elems, size_t from, size_t to) {
    uint16_t *plane = kv + (size_t)blockIdx.y * plane_elems;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < block_elems;
         i += (size_t)gridDim.x * blockDim.x) {
        plane[to + i] = plane[from + i];
    }
}

kg_status_t kg_cuda_kv_copy(cudaStream_t stream,
                            uint8_t *kv,
                            size_t plane_bytes,
                            int32_t n_planes,
                            size_t block_bytes,
                            const int32_t *src,
                            const int32_t *dst,
                            int32_t n) {
    if (n_planes <= 0 || block_bytes == 0) {
        return KG_OK;
    }
    const size_t plane_elems = plane_bytes / 2, block_elems = block_bytes / 2;
    size_t bx = (block_elems + 255) / 256;
    bx = bx > 1024 ? 1024 : bx;
    for (int32_t i = 0; i < n; i++) {
        kv_copy_kernel<<<dim3((unsigned)bx, (unsigned)n_planes), 256, 0, stream>>>(
            (uint16_t *)kv, plane_elems, block_elems, (size_t)src[i] * block_elems,
            (size_t)dst[i] * block_elems);
        KG_CUDA_CHECK_LAUNCH();
    }
    return KG_OK;
}

extern "C" kg_status_t kg_cuda_op_kv_copy(uint16_t *kv,
                                          int32_t n_planes,
                                          int32_t n_blocks,
                                          int32_t block_elems,
                                          const int32_t *src,
                                          const int32_t *dst,
                                          int32_t n) {
    const size_t plane = (size_t)n_blocks * (size_t)block_elems;
    const size_t bytes = plane * (size_t)n_planes * sizeof(uint16_t);
    uint8_t *d = NULL;
    kg_status_t st = KG_OK;
    KG_CUDA_CHECK(cudaMalloc((void **)&d, bytes));
    if (cudaMemcpy(d, kv, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        kg_cuda_kv_copy(0, d, plane * 2, n_planes, (size_t)block_elems * 2, src, dst, n) != KG_OK ||
        cudaMemcpy(kv, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        st = KG_ERR_BACKEND;
    }
    cudaFree(d);
    return st;
}
