/* logit_bias: each sampling request's logit_bias on its logits row, before
 * the device sampler (kg_sampler.h rule 0: bias added, -100 or less bans the
 * token), so the device picks as kg_sampler_sample does on the CPU. */
#pragma once

#include "cuda_common.cuh"

extern "C" {
#include "../src/backend/kg_backend.h"
#include "../src/model/kg_sampler.h"
}

typedef struct kg_cuda_bias_entry {
    int32_t row, token;
    float bias;
} kg_cuda_bias_entry_t;

typedef struct kg_cuda_bias {
    int32_t cap;                 /* entries: max rows * KG_MAX_LOGIT_BIAS */
    kg_cuda_bias_entry_t *h_ent; /* (cap) pinned */
    kg_cuda_bias_entry_t *d_ent; /* (cap) device */
} kg_cuda_bias_t;

/** Buffers for up to `max_rows` rows of biases (allocated once: steps
 * allocate nothing). */
kg_status_t kg_cuda_bias_init(kg_cuda_bias_t *b, int32_t max_rows);
void kg_cuda_bias_clear(kg_cuda_bias_t *b);
size_t kg_cuda_bias_device_size(const kg_cuda_bias_t *b);

/** Rows 0..n-1 of d_logits (n, n_vocab) get reqs[i].params' logit_bias (its
 * token ids distinct, kg_sampler.h), in place, on `stream`. Nothing happens
 * (no copy, no launch) when no request has one. */
kg_status_t kg_cuda_bias_apply(kg_cuda_bias_t *b,
                               cudaStream_t stream,
                               float *d_logits,
                               int32_t n_vocab,
                               const kg_sample_request_t *reqs,
                               int32_t n);
