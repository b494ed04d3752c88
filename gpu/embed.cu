/* embed: token embedding gather (one block per token), times the
 * embedding scale (Gemma). Built with --fmad=false. */
#include "embed.cuh"
#include "qblocks.cuh"

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

/* A native table: each thread expands 8 weights of the token's row (a row
 * is whole blocks), rounded to BF16 as the expansion stores them. */
template <int QT>
__global__ void embed_blocks_kernel(kg_cuda_inputs_t in,
                                    const uint8_t *__restrict__ body,
                                    const uint8_t *__restrict__ tail,
                                    int32_t n_embd,
                                    float scale,
                                    float *__restrict__ x) {
    constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t blk0 = (int64_t)in.token[t] * (n_embd / L.elems);
    float *dst = x + (int64_t)t * n_embd;
    for (int32_t e = threadIdx.x * 8; e < n_embd; e += blockDim.x * 8) {
        qpiece<QT> p;
        p.load(body, tail, blk0 + e / L.elems, e % L.elems);
        float f[8];
        p.expand(e % L.elems, f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float v = __uint_as_float((uint32_t)kg_q_bf16(f[i]) << 16);
            dst[e + i] = scale != 0.0f ? v * scale : v;
        }
    }
}

template <int QT>
static kg_status_t embed_blocks(cudaStream_t stream,
                                int32_t n_launch,
                                kg_cuda_inputs_t in,
                                const void *emb,
                                int32_t n_embd,
                                int64_t n_vocab_rows,
                                float scale,
                                float *x) {
    constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
    const uint8_t *body = (const uint8_t *)emb;
    const uint8_t *tail = body + (size_t)n_vocab_rows * (size_t)(n_embd / L.elems) * (size_t)L.body;
    embed_blocks_kernel<QT><<<n_launch, 128, 0, stream>>>(in, body, tail, n_embd, scale, x);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

kg_status_t kg_cuda_embed(cudaStream_t stream,
                          int32_t n_launch,
                          kg_cuda_inputs_t in,
                          const void *emb,
                          kg_cuda_dtype_t dt,
                          int qtype,
                          int32_t n_embd,
                          int64_t n_vocab,
                          float scale,
                          float *x) {
    if (qtype == 0) {
        embed_kernel<<<n_launch, 256, 0, stream>>>(in, emb, (int)dt, n_embd, scale, x);
        KG_CUDA_CHECK_LAUNCH();
        return KG_OK;
    }
    return kg_q_dispatch(qtype, [&](auto qt) {
        constexpr int QT = decltype(qt)::value;
        if constexpr (QT == 0) {
            return KG_ERR_INVALID; /* handled above */
        } else {
            return embed_blocks<QT>(stream, n_launch, in, emb, n_embd, n_vocab, scale, x);
        }
    });
}
