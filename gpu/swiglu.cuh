/* swiglu: h = silu(gate) * up, from the fused gate|up GEMM output; and
 * Apertus's ungated xIELU of the up GEMM's output. */
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

/** For rows t < hdr->n_tokens: h[t][f] = kg_relu_sqr(u[t][f]) stored as
 * dt (nemotron_h's MLP: up, squared ReLU, down). u is (rows, n_ff). */
kg_status_t kg_cuda_relu_sqr(cudaStream_t stream,
                             int32_t n_launch,
                             const kg_cuda_step_hdr_t *hdr,
                             const float *u,
                             void *h,
                             kg_cuda_dtype_t dt,
                             int32_t n_ff);

/** For rows t < hdr->n_tokens: h[t][f] = kg_xielu(u[t][f], an, ap, beta, eps)
 * stored as dt. u is (rows, n_ff): the up projection alone. */
kg_status_t kg_cuda_xielu(cudaStream_t stream,
                          int32_t n_launch,
                          const kg_cuda_step_hdr_t *hdr,
                          const float *u,
                          void *h,
                          kg_cuda_dtype_t dt,
                          int32_t n_ff,
                          const float params[4]);
