/* gemma4: the kernels of what Gemma 4 adds to a gemma3 layer on the
 * device (kg_backend_cuda_gemma4.cu runs them): the per-layer inputs (E2B's
 * per_layer_token_embd, per_layer_model_proj and their norm), a layer's
 * per-layer gate, the residual join with the layer output scale, and the
 * MoE layers' router input, per-expert output scales and the join of the
 * dense MLP with the experts. Every op is the CPU backend's
 * (kg_backend_cpu_forward.c: per_layer_inputs, per_layer_add,
 * gemma4_moe_ffn, expert_ffn) in its order of roundings. */
#pragma once

#include "cuda_common.cuh"
#include "moe.cuh"

/** For tokens t < hdr->n_tokens and layers l < n_layer, the P-wide slice
 * s = pl_in[t][l * P, (l + 1) * P) (F32, the per_layer_model_proj GEMM's
 * output): s = s * proj_scale, RMS-normed with weight norm_w (P), then
 * (s + emb[token[t]][l * P + i] * tok_scale) * in_scale, in place. emb is
 * the (n_vocab, n_layer * P) per-layer token embeddings of type dt, or
 * (qtype not 0) a native type's GGUF blocks, tails at emb_tail (qblocks.cuh;
 * P a multiple of 8), each weight the BF16 value the expansion stores. */
kg_status_t kg_cuda_g4_pl_inputs(cudaStream_t stream,
                                 int32_t n_launch,
                                 kg_cuda_inputs_t in,
                                 float *pl_in,
                                 const float *norm_w,
                                 const void *emb,
                                 kg_cuda_dtype_t dt,
                                 int qtype,
                                 const void *emb_tail,
                                 int32_t n_layer,
                                 int32_t P,
                                 float proj_scale,
                                 float tok_scale,
                                 float in_scale,
                                 float eps);

/** h[t][i] = GeGLU(gate[t][i], pl_in[t][il * P + i]) (cpu_geglu's table
 * lookup) stored as dt, for t < hdr->n_tokens, i < P; gate (rows, P) F32,
 * pl_in (rows, n_layer * P). */
kg_status_t kg_cuda_g4_pl_gate(cudaStream_t stream,
                               int32_t n_launch,
                               const kg_cuda_step_hdr_t *hdr,
                               const float *gate,
                               const float *pl_in,
                               const uint16_t *table,
                               int32_t il,
                               int32_t n_layer,
                               int32_t P,
                               void *h,
                               kg_cuda_dtype_t dt);

/** x[t] += rmsnorm(add[t]) * w, then x[t] *= out_scale when it is not 0
 * (the layer_output_scale), for t < hdr->n_tokens, rows n wide. */
kg_status_t kg_cuda_g4_residual(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                float *x,
                                const float *add,
                                const float *w,
                                float out_scale,
                                int32_t n,
                                float eps);

/** The router's input: y[t] = ((x[t] / rms(x[t])) * (1 / sqrtf(n))) * s
 * (the unweighted RMSNorm, ggml_scale, then ggml_mul by
 * ffn_gate_inp.scale), stored as dt. */
kg_status_t kg_cuda_g4_router_in(cudaStream_t stream,
                                 int32_t n_launch,
                                 const kg_cuda_step_hdr_t *hdr,
                                 const float *x,
                                 const float *s,
                                 void *y,
                                 kg_cuda_dtype_t dt,
                                 int32_t n,
                                 float eps);

/** Each grouped row of the plan (expert e's) of y (rows_cap, n) times
 * scale[e]: the per-expert output scale (ffn_down_exps.scale). */
kg_status_t kg_cuda_g4_expert_scale(
    cudaStream_t stream, const kg_cuda_moe_plan_t *plan, float *y, const float *scale, int32_t n);

/** moe[t] = dense[t] + rmsnorm(moe[t]) * w (post_ffw_norm_2 on the
 * experts' sum, then the dense MLP's normed output added). */
kg_status_t kg_cuda_g4_moe_join(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                float *moe,
                                const float *w,
                                const float *dense,
                                int32_t n,
                                float eps);
