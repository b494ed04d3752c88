/* moe_ops: the mixture-of-experts kernels of moe.cu driven from host
 * memory, for tests/unit/check_cuda_moe.c (like kg_cuda_ops.h: each call
 * allocates, copies, runs on the default stream and copies back; never used
 * by the backend). Compiles as C11 and as CUDA C++. */
#pragma once

#include "../src/core/kg_status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kg_cuda_op_moe {
    int32_t n_tokens, n_embd, n_ff, n_expert, k;
    int top_k_then_softmax;     /* gpt-oss's router; else softmax (or sigmoid) then top-k */
    int sigmoid;                /* glm4moe's sigmoid scores */
    int n_groups, n_group_used; /* group-limited top-k (n_groups <= 1: not) */
    const float *probs_b;       /* (n_expert) selection bias, or NULL */
    int norm_w;                 /* renormalise the k weights */
    int w_on_input;             /* llama4: chosen by the logits, each input row times its weight */
    float w_scale;              /* then scale them (0 or 1: not) */
    int oai;                    /* gpt-oss's clamped SwiGLU; else SwiGLU */
    int dtype;                  /* KG_CUDA_OP_BF16/F16/F32 (kg_cuda_ops.h): the weights' type, and
                                   the activations entering each GEMM are rounded to it */
    const float *gate, *up;     /* (n_expert, n_ff, n_embd): expert e's (n_ff, n_embd) matrices */
    const float *down;          /* (n_expert, n_embd, n_ff) */
    int qtype; /* 0, or a GGUF block type (kg_ggml_type_t) with a native kernel: the expert
                  matrices quantized to it (kg_quantize), then kept as blocks on the device
                  (native) or expanded to BF16 as the upload does (dtype must be BF16) */
    int native;
    const float *gate_b, *up_b; /* (n_expert, n_ff) expert biases, or NULL */
    const float *down_b;        /* (n_expert, n_embd), or NULL */
} kg_cuda_op_moe_t;

/** The FFN of n_tokens tokens: x (n_tokens, n_embd) normed inputs, logits
 * (n_tokens, n_expert) the router's (bias added); out (n_tokens, n_embd),
 * and the route: sel and w (n_tokens, k). KG_ERR_INVALID for k above
 * KG_CUDA_MOE_MAX_K or more than 1024 experts. */
kg_status_t kg_cuda_op_moe_ffn(const kg_cuda_op_moe_t *m,
                               const float *x,
                               const float *logits,
                               float *out,
                               int32_t *sel,
                               float *w);

#ifdef __cplusplus
}
#endif
