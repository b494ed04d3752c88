/* logit_bias: the entries of every row go up in one copy and one launch,
 * a thread per entry (rows rarely carry more than a few). */
#include "kg_cuda_ops.h"
#include "logit_bias.cuh"

__global__ void
logit_bias_kernel(float *logits, int64_t n_vocab, const kg_cuda_bias_entry_t *ent, int32_t n) {
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
         i += (int32_t)(gridDim.x * blockDim.x)) {
        float *l = logits + (int64_t)ent[i].row * n_vocab + ent[i].token;
        const float b = ent[i].bias;
        *l = b <= KG_LOGIT_BIAS_BAN ? -INFINITY : *l + b;
    }
}

kg_status_t kg_cuda_bias_init(kg_cuda_bias_t *b, int32_t max_rows) {
    memset(b, 0, sizeof(*b));
    b->cap = max_rows * KG_MAX_LOGIT_BIAS;
    KG_CUDA_CHECK(cudaMallocHost((void **)&b->h_ent, (size_t)b->cap * sizeof(*b->h_ent)));
    KG_CUDA_CHECK(cudaMalloc((void **)&b->d_ent, (size_t)b->cap * sizeof(*b->d_ent)));
    return KG_OK;
}

void kg_cuda_bias_clear(kg_cuda_bias_t *b) {
    cudaFreeHost(b->h_ent);
    cudaFree(b->d_ent);
    memset(b, 0, sizeof(*b));
}

size_t kg_cuda_bias_device_size(const kg_cuda_bias_t *b) {
    return (size_t)b->cap * sizeof(kg_cuda_bias_entry_t);
}

kg_status_t kg_cuda_bias_apply(kg_cuda_bias_t *b,
                               cudaStream_t stream,
                               float *d_logits,
                               int32_t n_vocab,
                               const kg_sample_request_t *reqs,
                               int32_t n) {
    int32_t m = 0;
    for (int32_t r = 0; r < n; r++) {
        const kg_sampling_params_t *p = reqs[r].params;
        for (int32_t k = 0; k < p->n_logit_bias && m < b->cap; k++) {
            const kg_logit_bias_t *e = &p->logit_bias[k];
            if (e->token < 0 || e->token >= n_vocab) {
                continue; /* ignored, as kg_sampler_sample does */
            }
            b->h_ent[m++] = (kg_cuda_bias_entry_t){r, e->token, e->bias};
        }
    }
    if (m == 0) {
        return KG_OK;
    }
    KG_CUDA_CHECK(cudaMemcpyAsync(b->d_ent, b->h_ent, (size_t)m * sizeof(*b->h_ent),
                                  cudaMemcpyHostToDevice, stream));
    const int32_t blocks = (m + 127) / 128;
    logit_bias_kernel<<<(unsigned)blocks, 128, 0, stream>>>(d_logits, n_vocab, b->d_ent, m);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

extern "C" kg_status_t kg_cuda_op_logit_bias(float *logits,
                                             int32_t rows,
                                             int32_t n_vocab,
                                             const kg_sample_request_t *reqs) {
    kg_cuda_bias_t b;
    float *d = NULL;
    const size_t bytes = (size_t)rows * (size_t)n_vocab * sizeof(float);
    kg_status_t st = kg_cuda_bias_init(&b, rows);
    if (st == KG_OK && cudaMalloc((void **)&d, bytes) == cudaSuccess &&
        cudaMemcpy(d, logits, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
        kg_cuda_bias_apply(&b, 0, d, n_vocab, reqs, rows) == KG_OK &&
        cudaMemcpy(logits, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
        st = KG_OK;
    } else {
        st = KG_ERR_BACKEND;
    }
    cudaFree(d);
    kg_cuda_bias_clear(&b);
    return st;
}
