/* cpu_mamba2: the CPU backend's Mamba-2 mixer (granitehybrid, nemotron_h),
 * as llama.cpp's build_mamba2_layer computes it with ggml's CPU ssm_conv and
 * ssm_scan.
 *
 * For each token: ssm_in gives z, xBC and dt; the causal depthwise
 * convolution of length d_conv runs over xBC (the slot's last d_conv - 1
 * inputs, then the token's), plus its bias, then SiLU; the selective scan
 * advances each head's d_state x head_dim state with dt = softplus(dt +
 * dt_bias), dA = exp(dt A), state = state dA + B x dt and reads y = C .
 * state, plus the skip D x; y times silu(z), an RMS norm per group of
 * d_inner / n_group channels times ssm_norm, and ssm_out.
 *
 * The recurrence runs token by token in batch order (position order within
 * a slot), in prefill as in decode: a token's update reads only its slot's
 * state and its own inputs, so chunking and batch mates cannot change a bit.
 * Threads split the convolution over channels and the scan over heads,
 * never over the tokens of a slot. */
#pragma once

#include "kg_backend_cpu_int.h"

/** Layer il's Mamba-2 weights into L (ssm_in, ssm_out, and the F32 arrays:
 * the kernel, its bias, dt's bias, A, D, the norm). False with errstr set. */
bool cpu_mamba2_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size);

/** Free the F32 arrays cpu_mamba2_layer_init took (ssm_in and ssm_out are
 * cleared with the layer's other weights). */
void cpu_mamba2_layer_clear(cpu_layer_t *L);

/** Floats of scratch the mixer needs for a step of up to T tokens. */
int64_t cpu_mamba2_scratch_floats(const kg_hparams_t *hp, int64_t T);

/** Layer il on ctx->xn (T, n_embd) into ctx->tmp (T, n_embd). Slot s's
 * state for this layer is at state + s * per_slot (the convolution's
 * window, then the SSM state: kg_model_mamba2_state_floats); scratch holds
 * cpu_mamba2_scratch_floats(hp, T) floats. */
void cpu_mamba2_mixer(cpu_ctx_t *ctx,
                      int32_t il,
                      const kg_step_batch_t *batch,
                      float *scratch,
                      float *state,
                      int64_t per_slot);
