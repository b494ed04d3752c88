/* logits: elementwise over a chunk of the head's output. Built with
 * --fmad=false. */
#include "logits.cuh"

__global__ void logits_post_kernel(float *__restrict__ logits,
                                   int32_t n_vocab,
                                   const float *__restrict__ bias,
                                   float cap,
                                   float mul,
                                   int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = logits[i];
        if (bias) {
            v = v + bias[i % n_vocab];
        }
        if (mul != 0.0f) {
            v = v * mul;
        }
        if (cap > 0.0f) {
            v = kg_softcap(v, cap);
        }
        logits[i] = v;
    }
}

kg_status_t kg_cuda_logits_post(cudaStream_t stream,
                                float *logits,
                                int32_t n_rows,
                                int32_t n_vocab,
                                const float *bias,
                                float cap,
                                float mul) {
    const int64_t total = (int64_t)n_rows * n_vocab;
    if (total <= 0 || (!bias && !(cap > 0.0f) && mul == 0.0f)) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    logits_post_kernel<<<(unsigned)blocks, 256, 0, stream>>>(logits, n_vocab, bias, cap, mul,
                                                             total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
