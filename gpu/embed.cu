/* embed: token embedding gather (one block per token), times the
 * embedding scale (Gemma). Built with --fmad=false. */
#include "embed.cuh"

__global__ void embed_kernel(kg_cuda_inputs_t in,
                             const void *__restrict__ emb,
                             int dt,
                             int32_t n_embd,
                             float scale,
                             float *__restrict__ x) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t src = (int64_t)in.token[t] * n_embd;
    float *dst = x + (int64_t)t * n_embd;
    for (int32_t e = threadIdx.x; e < n_embd; e += blockDim.x) {
        const float v = kg_ld(emb, src + e, dt);
        dst[e] = scale != 0.0f ? v * scale : v; /* ggml_scale after ggml_get_rows */
    }
}

kg_status_t kg_cuda_embed(cudaStream_t stream,
                          int32_t n_launch,
                          kg_cuda_inputs_t in,
                          const void *emb,
                          kg_cuda_dtype_t dt,
                          int32_t n_embd,
                          float scale,
                          float *x) {
    embed_kernel<<<n_launch, 256, 0, stream>>>(in, emb, (int)dt, n_embd, scale, x);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
