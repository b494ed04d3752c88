/* embed: the token embedding gather that starts every step. */
#pragma once

#include "cuda_common.cuh"

/** x[t] = emb[token[t]] as F32 for t < hdr->n_tokens (launch covers
 * `n_launch` rows; emb is (n_vocab, n_embd) of type dt, or of a native
 * type's GGUF blocks when qtype is not 0 (n_vocab rows; qblocks.cuh), each
 * weight read as the BF16 value the expansion would have stored), times
 * `scale` unless it is 0. */
kg_status_t kg_cuda_embed(cudaStream_t stream,
                          int32_t n_launch,
                          kg_cuda_inputs_t in,
                          const void *emb,
                          kg_cuda_dtype_t dt,
                          int qtype,
                          int32_t n_embd,
                          int64_t n_vocab,
                          float scale,
                          float *x);
