/* rmsnorm: the residual add fused with RMSNorm and the weight multiply,
 * writing the normed rows in the element type of the GEMM that reads them;
 * the added block output may first get its bias and its own norm (the
 * post-norms of Gemma). */
#pragma once

#include "cuda_common.cuh"

/* What joins the residual stream: add (rows, n) F32, plus add_b (n) when
 * not NULL, then RMSNorm'd with weight add_w (n) when not NULL, then times
 * scale when it is not 0 (granite's residual_scale). add NULL: nothing (the
 * first layer). */
typedef struct kg_cuda_residual {
    const float *add;
    const float *add_b;
    const float *add_w;
    float scale;
} kg_cuda_residual_t;

/** For output row i < count (count = hdr->n_outputs when `outputs`, else
 * hdr->n_tokens; the launch covers n_launch rows): r = map ? map[i] : i;
 * x[r] += res(r) as kg_cuda_residual_t says; y[i] = x[r] / rms(x[r]) * w
 * (y[i] = x[r] when w is NULL),
 * stored as dt, and again as dt2 into y2 when y2 is not NULL. Every norm is
 * the CPU backend's (cpu_rmsnorm_rows): squares summed in double, scale =
 * 1 / sqrtf(mean + eps), (x * scale) * w. */
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
                                float eps);
