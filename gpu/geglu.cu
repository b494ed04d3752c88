/* geglu: elementwise, one thread per output element. Built with
 * --fmad=false, like the CPU's table lookup times up. */
#include "geglu.cuh"

extern "C" {
#include "../src/model/kg_quant.h"
}

void kg_cuda_gelu_table_fill(uint16_t *table) {
    for (uint32_t h = 0; h < 65536; h++) {
        table[h] = kg_fp32_to_fp16(kg_gelu_tanh(kg_fp16_to_fp32((uint16_t)h)));
    }
}

__global__ void geglu_kernel(const kg_cuda_step_hdr_t *hdr,
                             const float *__restrict__ gu,
                             const uint16_t *__restrict__ table,
                             void *__restrict__ h,
                             int dt,
                             int32_t n_ff,
                             int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * n_ff;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n_ff, f = i % n_ff;
        kg_st(h, i, kg_cuda_geglu1(table, gu[t * 2 * n_ff + f], gu[t * 2 * n_ff + n_ff + f]), dt);
    }
}

kg_status_t kg_cuda_geglu(cudaStream_t stream,
                          int32_t n_launch,
                          const kg_cuda_step_hdr_t *hdr,
                          const float *gu,
                          const uint16_t *table,
                          void *h,
                          kg_cuda_dtype_t dt,
                          int32_t n_ff) {
    const int64_t total = (int64_t)n_launch * n_ff;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    geglu_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, gu, table, h, (int)dt, n_ff, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
