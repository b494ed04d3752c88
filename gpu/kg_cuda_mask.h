/* kg_cuda_mask: masked device sampling driven from host memory, for the
 * tests (tests/unit/check_cuda.c compares it with kg_sampler_sample_masked).
 * Compiles as C11 and as CUDA C++. */
#pragma once

#include "../src/backend/kg_backend.h"
#include "../src/core/kg_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Upload `rows` rows of logits, apply each request's mask (mask.cu), run
 * the device sampler, and return its results. */
kg_status_t kg_cuda_op_sample_masked(const float *logits,
                                     int32_t rows,
                                     int32_t n_vocab,
                                     const kg_sample_request_t *reqs,
                                     kg_sample_result_t *out);

#ifdef __cplusplus
}
#endif
