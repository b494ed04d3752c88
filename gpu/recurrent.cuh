/* recurrent: the hybrid models' recurrent layers on the device (the CPU
 * backend's cpu_recurrent.c and cpu_deltanet.c), each slot's state in
 * device memory: (n_slots, per_slot) F32, a layer's part of a slot's state
 * at its offset, laid out as the CPU backend lays it out.
 *
 * Every kernel reads the step's real token count and each token's slot and
 * position from the uploaded inputs (so one captured graph serves every
 * decode step of its bucket, as the other kernels), and walks a slot's
 * tokens in batch order, which is position order within a slot: one
 * thread (or warp) owns one channel (or one row of a DeltaNet head's
 * matrix) and carries it from token to token, exactly as decode does, so
 * a token's result does not depend on its batch mates or on how its
 * prefill was chunked. */
#pragma once

#include "cuda_common.cuh"

/** Zero the state of every slot whose token in this step is at position
 * 0 (a sequence starting over), before the step's layers. */
kg_status_t kg_cuda_rec_reset(
    cudaStream_t stream, int32_t n_launch, kg_cuda_inputs_t in, float *state, int64_t per_slot);

/** LFM2's short convolution of one layer: bcx (rows, 3 E) is in_proj's
 * output, B | C | x; for every token in batch order and channel c,
 * y = C * kg_conv_step(window, kernel row c, L, B * x), the window the
 * layer's (L - 1) x E part of the token's slot state at `off`; y stored
 * as dt (out_proj's type) into out (rows, E). */
kg_status_t kg_cuda_shortconv(cudaStream_t stream,
                              kg_cuda_inputs_t in,
                              const float *bcx,
                              const float *kernel,
                              float *state,
                              int64_t per_slot,
                              int64_t off,
                              int32_t E,
                              int32_t L,
                              void *out,
                              kg_cuda_dtype_t dt);

/* The shape of a model's gated DeltaNet layers (cpu_deltanet.c): K heads
 * (ssm_n_group) and V heads (ssm_dt_rank) of d_state each; conv channels
 * q | k (K heads each) | v (V heads); v_grouped: V head h reads K head
 * h / (V / K) (qwen3next), else h mod K (qwen35); ba: the in-projection
 * gives qwen3next's ssm_ba (per K head its V heads' betas, then their
 * alphas) in place of beta | alpha. */
typedef struct kg_cuda_dn_shape {
    int32_t S, HK, HV, K; /* d_state, K heads, V heads, d_conv */
    bool v_grouped, ba;
    float eps; /* norm_eps */
} kg_cuda_dn_shape_t;

/* A DeltaNet layer's arrays and its state. The buffers: in (rows, CH +
 * VD + 2 HV) F32, the in-projection's output q|k|v, z, then the gate
 * inputs; gates (rows, 2 HV) F32, beta | g; o (rows, VD) F32; act (rows,
 * VD) in dt. */
typedef struct kg_cuda_dn_layer {
    const float *conv;     /* (CH, K) */
    const float *dt_b;     /* (HV) */
    const float *a;        /* (HV) ssm_a: -exp(A_log) */
    const float *norm;     /* (S) the gated RMSNorm's weight */
    float *state;          /* the slots' states */
    int64_t per_slot, off; /* a slot's floats; the layer's offset in one */
} kg_cuda_dn_layer_t;

/** One gated DeltaNet layer between its projections, as cpu_deltanet.c:
 * beta = sigmoid, g = softplus(alpha + dt_bias) * a; the causal conv and
 * SiLU of every channel (the window in the slot's state); q and k L2-normed
 * per K head; the delta rule of every V head row by row over the tokens in
 * batch order (the d_state x d_state matrix in the slot's state); each
 * head's output RMS-normed, times ssm_norm and silu(z), into act as dt. */
kg_status_t kg_cuda_deltanet(cudaStream_t stream,
                             int32_t n_launch,
                             kg_cuda_inputs_t in,
                             const kg_cuda_dn_shape_t *sh,
                             const kg_cuda_dn_layer_t *L,
                             float *buf,
                             float *gates,
                             float *o,
                             void *act,
                             kg_cuda_dtype_t dt);

/** qwen35's gated attention: att[t][i] *= sigmoid(gate[t][i]) for rows t <
 * hdr->n_tokens, gate row t at gate + t * stride (n_q wide), att (rows,
 * n_q) in dt. */
kg_status_t kg_cuda_attn_gate(cudaStream_t stream,
                              int32_t n_launch,
                              const kg_cuda_step_hdr_t *hdr,
                              const float *gate,
                              int64_t stride,
                              void *att,
                              kg_cuda_dtype_t dt,
                              int32_t n_q);

/* The shape of a model's Mamba-2 layers (cpu_mamba2.c): n_embd, d_inner,
 * d_state, heads (ssm_dt_rank), groups, d_conv; the in-projection gives z
 * (DI) | x, B, C (DI + 2 G DS: the conv channels) | dt (H) per token. */
typedef struct kg_cuda_m2_shape {
    int32_t DI, DS, H, G, K;
    float eps; /* norm_eps */
} kg_cuda_m2_shape_t;

/* A Mamba-2 layer's arrays and its state. */
typedef struct kg_cuda_m2_layer {
    const float *conv, *conv_b; /* (n_conv, K), (n_conv) or NULL */
    const float *dt_b, *a, *d;  /* (H) each */
    const float *norm;          /* (DI) */
    float *state;
    int64_t per_slot, off;
} kg_cuda_m2_layer_t;

/** One Mamba-2 mixer between its projections, as cpu_mamba2.c: the
 * causal conv (+ bias) and SiLU of x, B, C in place in buf (rows, n_proj);
 * the selective scan of every inner channel over the tokens in batch
 * order, (y + x D) silu(z) into y (rows, DI) F32; the grouped RMSNorm
 * times ssm_norm into act (rows, DI) as dt. */
kg_status_t kg_cuda_mamba2(cudaStream_t stream,
                           int32_t n_launch,
                           kg_cuda_inputs_t in,
                           const kg_cuda_m2_shape_t *sh,
                           const kg_cuda_m2_layer_t *L,
                           float *buf,
                           float *y,
                           void *act,
                           kg_cuda_dtype_t dt);
