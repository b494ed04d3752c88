/* embed: the token embedding gather that starts every step. */
#pragma once

#include "cuda_common.cuh"

/** x[t] = emb[token[t]] as F32 for t < hdr->n_tokens (launch covers
 * `n_launch` rows; emb is (n_vocab, n_embd) of type dt), times `scale`
 * unless it is 0. */
kg_status_t kg_cuda_embed(cudaStream_t stream,
                          int32_t n_launch,
                          kg_cuda_inputs_t in,
                          const void *emb,
                          kg_cuda_dtype_t dt,
                          int32_t n_embd,
                          float scale,
                          float *x);
