/* sample: the device sampler. Same penalties, filters, order and draw as
 * the CPU's kg_sampler_sample (src/model/kg_sampler.c), on logits that are
 * already on the device. */
#pragma once

#include "cuda_common.cuh"

extern "C" {
#include "../src/backend/kg_backend.h"
#include "../src/model/kg_sampler.h"
}

/* One row's parameters as the kernels read them. */
typedef struct kg_cuda_sample_row {
    double u; /* the row's uniform draw (host RNG), unused when greedy */
    float temperature, top_p, min_p, rep, freq, pres;
    int32_t top_k, n_logprobs;
    int32_t pen_off, pen_n; /* the row's penalty entries */
} kg_cuda_sample_row_t;

/* One distinct token the penalties touch. */
typedef struct kg_cuda_pen {
    int32_t tok;
    int32_t count; /* occurrences in the output (frequency/presence); 0: none */
    int32_t rep;   /* in the repetition window */
    float raw;     /* written by the kernel: the logit before the penalties */
} kg_cuda_pen_t;

/* A row's state between the sampler's kernels (sample.cu). */
typedef struct kg_cuda_row_state kg_cuda_row_state_t;

typedef struct kg_cuda_sampler {
    int32_t n_vocab, max_rows, pen_cap;
    int32_t n_chunks, chunk;               /* the vocabulary cut for the per-chunk kernels */
    kg_cuda_sample_row_t *h_rows, *d_rows; /* (max_rows) pinned / device */
    kg_cuda_pen_t *h_pens, *d_pens;        /* (pen_cap) */
    kg_sample_result_t *h_res, *d_res;     /* (max_rows) */
    kg_cuda_row_state_t *d_state;          /* (max_rows) */
    void *d_chunk;                         /* (max_rows, n_chunks) per-chunk results */
    unsigned long long *d_hist;            /* (max_rows, KG_SAMPLER_HIST_BUCKETS) top-p mass */
    unsigned long long *d_cand;            /* (max_rows, n_chunks, SAMPLE_LOCAL_K) top-k */
    int32_t *idx;                          /* (n_vocab) host: entry of a token, -1 */
} kg_cuda_sampler_t;

/** Buffers for up to max_rows rows of n_vocab logits. */
kg_status_t kg_cuda_sampler_init(kg_cuda_sampler_t *s, int32_t n_vocab, int32_t max_rows);
void kg_cuda_sampler_clear(kg_cuda_sampler_t *s);
/** Bytes of device memory the sampler holds. */
size_t kg_cuda_sampler_device_size(const kg_cuda_sampler_t *s);

/** Sample rows 0..n-1 of d_logits (n, n_vocab) on `stream` (the logits are
 * modified in place), draw from each request's RNG as the CPU sampler does,
 * and write out[0..n) (synchronizes the stream). KG_ERR_INVALID with
 * *bad_row set when one row's result is unusable (a token outside the
 * vocabulary): that request alone failed; KG_ERR_BACKEND on a CUDA
 * error. */
kg_status_t kg_cuda_sampler_run(kg_cuda_sampler_t *s,
                                cudaStream_t stream,
                                float *d_logits,
                                const kg_sample_request_t *reqs,
                                int32_t n,
                                kg_sample_result_t *out,
                                int32_t *bad_row);
