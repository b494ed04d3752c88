/* cpu_moe: the mixture-of-experts FFN of the CPU backend, less its GEMMs:
 * routing a step's tokens to their experts, grouping the rows by expert,
 * the experts' gated activation and the weighted sum of their outputs.
 *
 * DESIGN
 * One batched forward per step stays the rule with experts: per layer the
 * backend routes every token of the step (its router logits are one GEMM),
 * gathers the rows each expert received into one contiguous group, and
 * runs one gate/up GEMM and one down GEMM per active expert over its group
 * (kg_backend_cpu.c, through the same matmul entry points as the dense
 * weights), never one per token. llama.cpp's build_moe_ffn is the
 * reference for every step: the router's softmax (or sigmoid: glm4moe), the
 * selection bias and group limit that only choose, the top-k (descending),
 * the renormalisation (sum clamped to 2^-14) and scale, the expert
 * outputs times their weights, then added in rank order.
 *
 * Batch invariance. A token's route depends only on its own logits (ties
 * go to the lower expert index); a group is a set of rows each computed by
 * cpu_gemm's fixed per-element FMA chain, so a row's result does not
 * depend on how many other rows share its expert or where in the group it
 * sits; activation rounding (Q8_0/Q8_K blocks, fp16) is per row; and the
 * weighted sum runs over the token's own k outputs in rank order. So a job
 * gets the same bits alone or in a batch of any size, whatever the experts
 * its neighbours pick.
 *
 * Plan layout. Grouped row r (0 <= r < T * k) belongs to token row_tok[r];
 * expert e's rows are [offset[e], offset[e + 1]), in token order; token t's
 * j-th expert (by rank) is sel[t * k + j] with weight w[t * k + j], and its
 * output is grouped row slot[t * k + j]. */
#pragma once

#include "../../model/kg_model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cpu_moe_plan {
    int32_t n_expert, k;
    int64_t max_tokens;
    int32_t *sel;     /* (max_tokens, k) expert of each token, by rank */
    float *w;         /* (max_tokens, k) its weight */
    int32_t *slot;    /* (max_tokens, k) grouped row of that expert's output */
    int32_t *count;   /* (n_expert) rows routed to each expert in this layer */
    int32_t *offset;  /* (n_expert + 1) first grouped row of each expert */
    int32_t *row_tok; /* (max_tokens * k) token of each grouped row */
    float *probs;     /* (n_expert) one token's probabilities (scratch) */
    float *sel_v;     /* (n_expert) the values that choose its experts (scratch) */
} cpu_moe_plan_t;

/** Allocate a plan for up to max_tokens tokens; false when out of memory
 * (then cleared). */
bool cpu_moe_plan_init(cpu_moe_plan_t *p, int32_t n_expert, int32_t k, int64_t max_tokens);
void cpu_moe_plan_clear(cpu_moe_plan_t *p);

/** Route T tokens by their router logits (T, n_expert) (biases added) as
 * hp's gating, groups, renormalisation and scale say, choosing by the
 * probabilities plus probs_b (n_expert; NULL: none), then group the rows
 * by expert: fills every field of the plan for these T tokens. */
void cpu_moe_route(cpu_moe_plan_t *p,
                   const kg_hparams_t *hp,
                   const float *logits,
                   const float *probs_b,
                   int64_t T);

/** dst(T * k, n) = the rows of src (T, n) in grouped order. */
void cpu_moe_gather(const cpu_moe_plan_t *p, const float *src, int64_t n, float *dst, int64_t T);

/** cpu_moe_gather with each row times its token's weight for that expert (llama4's
 * weight_before_ffn), the weights then set to 1 so cpu_moe_combine adds the experts'
 * outputs unweighted. */
void cpu_moe_gather_weighted(cpu_moe_plan_t *p, const float *src, int64_t n, float *dst, int64_t T);

/** out(T, n) = sum over ranks j in order of w[t][j] * y[slot[t][j]]: each
 * product rounded, then added (ggml_mul, then ggml_add of the k views). */
void cpu_moe_combine(const cpu_moe_plan_t *p, const float *y, int64_t n, float *out, int64_t T);

/** y[i] = softmax(x)[i] over n values as ggml_soft_max computes it: exp of
 * x - max, summed in double, times the float reciprocal of the sum. */
void cpu_moe_softmax(const float *x, float *y, int32_t n);

/** gpt-oss's gate (ggml_swiglu_oai with alpha 1.702, limit 7): for n
 * floats, x = min(gate, 7), y = clamp(up, -7, 7),
 * out = x / (1 + exp(1.702 * -x)) * (y + 1). out may alias gate. */
void cpu_moe_swiglu_oai(const float *gate, const float *up, float *out, int64_t n);
