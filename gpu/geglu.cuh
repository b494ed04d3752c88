/* geglu: h = gelu(gate) * up (Gemma's gated FFN), from the fused gate|up
 * GEMM output, with GELU read from the table of fp16 inputs ggml's CPU
 * GeGLU uses, so it equals the CPU backend's to the bit. */
#pragma once

#include "cuda_common.cuh"

/** The table (65536 fp16 values): table[h] = fp16(kg_gelu_tanh(fp32(h))),
 * cpu_gelu_table_init's, built on the host. */
void kg_cuda_gelu_table_fill(uint16_t *table);

/** GeGLU of one element as cpu_geglu computes it: 0 for x <= -10, x * u
 * for x >= 10, else the table entry of x rounded to fp16, times u. */
__device__ __forceinline__ float kg_cuda_geglu1(const uint16_t *table, float x, float u) {
    if (x <= -10.0f) {
        return 0.0f;
    }
    if (x >= 10.0f) {
        return x * u;
    }
    return __half2float(__ushort_as_half(table[__half_as_ushort(__float2half_rn(x))])) * u;
}

/** For rows t < hdr->n_tokens: h[t][f] = GeGLU(gu[t][f], gu[t][n_ff + f])
 * as cpu_geglu computes it (0 below -10, x * up above 10, else the table
 * entry of x rounded to fp16, times up), stored as dt. gu is
 * (rows, 2 * n_ff); table the device copy of kg_cuda_gelu_table_fill's. */
kg_status_t kg_cuda_geglu(cudaStream_t stream,
                          int32_t n_launch,
                          const kg_cuda_step_hdr_t *hdr,
                          const float *gu,
                          const uint16_t *table,
                          void *h,
                          kg_cuda_dtype_t dt,
                          int32_t n_ff);
