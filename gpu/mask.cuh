/* mask: constrained decoding on the device. The engine builds each
 * constrained row's allowed-token bitmask on the host (src/grammar); this
 * applies it to the row's logits on the device before the sampler runs, with
 * the CPU sampler's rule (kg_sampler_sample_masked): a disallowed token's
 * logit becomes -inf, and when no allowed token has a usable logit the
 * allowed ones count as 0. The device sampler then needs no change. */
#pragma once

#include "cuda_common.cuh"

extern "C" {
#include "../src/backend/kg_backend.h"
}

typedef struct kg_cuda_mask {
    int32_t n_words, max_rows;
    uint32_t *h_bits, *d_bits; /* (max_rows, n_words) pinned / device */
    int32_t *h_rows, *d_rows;  /* (max_rows) logits row of each mask */
} kg_cuda_mask_t;

/** Buffers for up to max_rows masked rows of n_vocab tokens. */
kg_status_t kg_cuda_mask_init(kg_cuda_mask_t *m, int32_t n_vocab, int32_t max_rows);
void kg_cuda_mask_clear(kg_cuda_mask_t *m);
size_t kg_cuda_mask_device_size(const kg_cuda_mask_t *m);

/** Apply reqs[i].mask (NULL: row i untouched) to row i of d_logits (n,
 * n_vocab), on `stream` (asynchronous; the host buffers are reused by the
 * next call, so the caller synchronizes in between, as the sampler does). */
kg_status_t kg_cuda_mask_apply(kg_cuda_mask_t *m,
                               cudaStream_t stream,
                               float *d_logits,
                               int32_t n_vocab,
                               const kg_sample_request_t *reqs,
                               int32_t n);
