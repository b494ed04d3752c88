/* rmsnorm: the residual add fused with RMSNorm and the weight multiply,
 * writing the normed rows in the element type of the GEMM that reads them. */
#pragma once

#include "cuda_common.cuh"

/** For output row i < count (count = hdr->n_outputs when `outputs`, else
 * hdr->n_tokens; the launch covers n_launch rows): r = map ? map[i] : i;
 * x[r] += add[r] when add; y[i] = x[r] / rms(x[r]) * w, stored as dt.
 * The norm is the CPU backend's (cpu_rmsnorm_rows): squares summed in
 * double, scale = 1 / sqrtf(mean + eps), (x * scale) * w. */
kg_status_t kg_cuda_add_rmsnorm(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                bool outputs,
                                const int32_t *map,
                                float *x,
                                const float *add,
                                const float *w,
                                void *y,
                                kg_cuda_dtype_t dt,
                                int32_t n,
                                float eps);
