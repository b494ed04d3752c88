/* swiglu: h = silu(gate) * up, from the fused gate|up GEMM output. */
#pragma once

#include "cuda_common.cuh"

/** For rows t < hdr->n_tokens: h[t][f] = kg_silu(gu[t][f]) * gu[t][n_ff + f]
 * stored as dt (the down projection's type). gu is (rows, 2 * n_ff). */
kg_status_t kg_cuda_swiglu(cudaStream_t stream,
                           int32_t n_launch,
                           const kg_cuda_step_hdr_t *hdr,
                           const float *gu,
                           void *h,
                           kg_cuda_dtype_t dt,
                           int32_t n_ff);
