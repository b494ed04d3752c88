/* cpu_deltanet: Qwen3.5's gated DeltaNet layer on the CPU (a hybrid
 * model's KG_LAYER_DELTANET; cpu_recurrent.c keeps the per-slot states
 * and dispatches here).
 *
 * As llama.cpp's qwen35.cpp builds it: attn_qkv gives the conv channels
 * q | k | v (K heads x d_state twice, then d_inner), attn_gate gives z,
 * ssm_beta and ssm_alpha one value per V head. A causal depthwise
 * convolution of length d_conv over the channels (ggml_ssm_conv: the
 * state's d_conv - 1 inputs, then the token's), SiLU; q and k L2-normed
 * per head (ggml_rms_norm with eps / n, times 1 / sqrt(n)); beta =
 * sigmoid(beta x), g = softplus(alpha x + ssm_dt.bias) * ssm_a (qwen3next:
 * beta and alpha from ssm_ba, per K head its V heads' betas then alphas).
 * Then per V head h (reading K head h mod K heads, as ggml_gated_delta_net
 * broadcasts; qwen3next: h / (V heads / K heads), its repeat-interleave) the
 * delta rule on its d_state x d_state matrix S (ggml_gated_delta_net's
 * order): S *= exp(g); d = (v - S^T k) * beta; S += k d^T; o = S^T q /
 * sqrt(d_state). o is RMS-normed per head with ssm_norm, times SiLU(z),
 * and ssm_out projects it back to n_embd.
 *
 * llama.cpp's CPU build runs that recurrence token by token in prefill as
 * in decode (its fused op); so does this file: a token's update reads only
 * its own slot's state and inputs, threads split the channels (the
 * convolution) and the V heads (the recurrence), never one slot's tokens,
 * so neither batch mates nor prefill chunking can change a bit. */
#pragma once

#include "kg_backend_cpu_int.h"

/* A DeltaNet layer's weights (cpu_layer_t.dn). */
typedef struct cpu_deltanet_layer {
    cpu_weight_t qkv, z, beta, alpha, out; /* attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out */
    cpu_weight_t ba;                       /* qwen3next's ssm_ba (beta, alpha n_out 0) */
    cpu_weight_t dt_b, a, norm;            /* (V heads), (V heads), (d_state) */
    float *conv;                           /* (channels, d_conv) F32 */
} cpu_deltanet_layer_t;

/** Layer il's weights into L->dn. False with errstr set. */
bool cpu_deltanet_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size);

/** Free L->dn (NULL: nothing). */
void cpu_deltanet_layer_clear(cpu_layer_t *L);

/** Floats of the step scratch a DeltaNet layer needs for T tokens. */
int64_t cpu_deltanet_scratch_floats(const kg_hparams_t *hp, int64_t T);

/** Layer il on ctx->xn (T, n_embd) into ctx->tmp (T, n_embd). Token t's
 * state is states + seq[t] * per_slot + off (the conv inputs, then the V
 * heads' matrices: kg_model_state_floats), advanced in batch order;
 * scratch holds cpu_deltanet_scratch_floats(T) floats. */
void cpu_deltanet_mixer(cpu_ctx_t *ctx,
                        int32_t il,
                        const kg_step_batch_t *batch,
                        float *states,
                        int64_t per_slot,
                        int64_t off,
                        float *scratch);
