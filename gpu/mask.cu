/* mask: token bitmasks applied to logits on the device (see mask.cuh).
 * One block per masked row: a first pass asks whether any allowed token has
 * a usable logit, a second writes -inf over the disallowed ones (and 0 over
 * the allowed ones when none was usable). A few microseconds for a 152k
 * vocabulary; the bitmask upload is 19 KB per row. */
#include "kg_cuda_mask.h"
#include "mask.cuh"
#include "sample.cuh"

#include <math.h>
#include <string.h>

#define M_THREADS 256

__global__ void mask_rows_kernel(
    float *logits, int32_t n_vocab, const uint32_t *bits, const int32_t *rows, int32_t n_words) {
    float *row = logits + (size_t)rows[blockIdx.x] * (size_t)n_vocab;
    const uint32_t *m = bits + (size_t)blockIdx.x * (size_t)n_words;
    __shared__ int usable;
    if (threadIdx.x == 0) {
        usable = 0;
    }
    __syncthreads();
    int found = 0;
    for (int32_t i = (int32_t)threadIdx.x; i < n_vocab; i += (int32_t)blockDim.x) {
        const float v = row[i];
        if (((m[i >> 5] >> (i & 31)) & 1u) && v == v && v > -INFINITY) {
            found = 1;
        }
    }
    if (found) {
        usable = 1; /* every writer writes the same value */
    }
    __syncthreads();
    const int any = usable;
    for (int32_t i = (int32_t)threadIdx.x; i < n_vocab; i += (int32_t)blockDim.x) {
        if (!((m[i >> 5] >> (i & 31)) & 1u)) {
            row[i] = -INFINITY;
        } else if (!any) {
            row[i] = 0.0f;
        }
    }
}

kg_status_t kg_cuda_mask_init(kg_cuda_mask_t *m, int32_t n_vocab, int32_t max_rows) {
    memset(m, 0, sizeof(*m));
    m->n_words = (n_vocab + 31) / 32;
    m->max_rows = max_rows;
    const size_t bits = (size_t)max_rows * (size_t)m->n_words * sizeof(uint32_t);
    KG_CUDA_CHECK(cudaMallocHost((void **)&m->h_bits, bits));
    KG_CUDA_CHECK(cudaMalloc((void **)&m->d_bits, bits));
    KG_CUDA_CHECK(cudaMallocHost((void **)&m->h_rows, (size_t)max_rows * sizeof(int32_t)));
    KG_CUDA_CHECK(cudaMalloc((void **)&m->d_rows, (size_t)max_rows * sizeof(int32_t)));
    return KG_OK;
}

void kg_cuda_mask_clear(kg_cuda_mask_t *m) {
    cudaFreeHost(m->h_bits);
    cudaFree(m->d_bits);
    cudaFreeHost(m->h_rows);
    cudaFree(m->d_rows);
    memset(m, 0, sizeof(*m));
}

size_t kg_cuda_mask_device_size(const kg_cuda_mask_t *m) {
    return (size_t)m->max_rows * ((size_t)m->n_words * sizeof(uint32_t) + sizeof(int32_t));
}

kg_status_t kg_cuda_mask_apply(kg_cuda_mask_t *m,
                               cudaStream_t stream,
                               float *d_logits,
                               int32_t n_vocab,
                               const kg_sample_request_t *reqs,
                               int32_t n) {
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (reqs[i].mask == NULL) {
            continue;
        }
        if (k == m->max_rows || (n_vocab + 31) / 32 != m->n_words) {
            KG_LOG_ERROR("cuda", "mask: %d masked rows of %d tokens, room for %d of %d", k + 1,
                         n_vocab, m->max_rows, m->n_words * 32);
            return KG_ERR_INVALID;
        }
        memcpy(m->h_bits + (size_t)k * (size_t)m->n_words, reqs[i].mask,
               (size_t)m->n_words * sizeof(uint32_t));
        m->h_rows[k++] = i;
    }
    if (k == 0) {
        return KG_OK;
    }
    KG_CUDA_CHECK(cudaMemcpyAsync(m->d_bits, m->h_bits,
                                  (size_t)k * (size_t)m->n_words * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, stream));
    KG_CUDA_CHECK(cudaMemcpyAsync(m->d_rows, m->h_rows, (size_t)k * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream));
    mask_rows_kernel<<<k, M_THREADS, 0, stream>>>(d_logits, n_vocab, m->d_bits, m->d_rows,
                                                  m->n_words);
    KG_CUDA_CHECK(cudaGetLastError());
    return KG_OK;
}

extern "C" kg_status_t kg_cuda_op_sample_masked(const float *logits,
                                                int32_t rows,
                                                int32_t n_vocab,
                                                const kg_sample_request_t *reqs,
                                                kg_sample_result_t *out) {
    kg_status_t st = KG_ERR_BACKEND;
    int32_t bad = -1; /* a row the sampler could not draw (the result says which) */
    kg_cuda_mask_t m;
    kg_cuda_sampler_t s;
    float *d = NULL;
    memset(&m, 0, sizeof(m));
    memset(&s, 0, sizeof(s));
    const size_t bytes = (size_t)rows * (size_t)n_vocab * sizeof(float);
    if (cudaMalloc((void **)&d, bytes) != cudaSuccess ||
        cudaMemcpy(d, logits, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        goto out;
    }
    if ((st = kg_cuda_mask_init(&m, n_vocab, rows)) != KG_OK ||
        (st = kg_cuda_sampler_init(&s, n_vocab, rows)) != KG_OK ||
        (st = kg_cuda_mask_apply(&m, 0, d, n_vocab, reqs, rows)) != KG_OK) {
        goto out;
    }
    st = kg_cuda_sampler_run(&s, 0, d, reqs, rows, out, &bad);
out:
    kg_cuda_sampler_clear(&s);
    kg_cuda_mask_clear(&m);
    cudaFree(d);
    return st;
}
