/* logits: what follows the head GEMM in some families: the output bias
 * (qwen2's output.bias), granite's logit scale and the final soft-capping
 * (Gemma 2). */
#pragma once

#include "cuda_common.cuh"

/** For the first n_rows rows of logits (rows, n_vocab):
 * logits = softcap((logits + bias) * mul) as the CPU backend computes it
 * (the bias when not NULL; mul when not 0; kg_softcap with cap when
 * cap > 0). */
kg_status_t kg_cuda_logits_post(cudaStream_t stream,
                                float *logits,
                                int32_t n_rows,
                                int32_t n_vocab,
                                const float *bias,
                                float cap,
                                float mul);
