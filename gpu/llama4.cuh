/* llama4: what Llama 4's attention inputs add on the GPU. Its RoPE layers
 * normalize each query and key head after the rotation (ggml_rms_norm, no
 * weight: the "L2 norm" of llama.cpp's graph) and before the fp16 rounding,
 * so the rotation and the norm run here, in place on the F32 Q|K|V rows,
 * and rope_store (rope.cu) then only scales and stores them (no_rope). The
 * chunked attention is attention.cu's (kg_cuda_attn_layer_t.chunked), the
 * NoPE layers' temperature rope.cu's (temp_offset 1), the experts weighted
 * on their input moe.cu's (kg_cuda_moe_router_t.w_on_input). */
#pragma once

#include "rope.cuh"

/** For t < hdr->n_tokens: rotate the first n_rot dims of every q and k head
 * of qkv(t) in place (kg_rope_pair, normal or NeoX pairs as rope_store
 * would, angles rope_cs as kg_cuda_rope_cache made them), then RMSNorm each
 * of those heads without a weight (squares summed in double, scale 1 /
 * sqrtf(mean + eps): cpu_rmsnorm_rows with w NULL). v is left alone. */
kg_status_t kg_cuda_rope_l2norm(cudaStream_t stream,
                                int32_t n_launch,
                                kg_cuda_inputs_t in,
                                const kg_cuda_rope_shape_t *sh,
                                int neox,
                                float *qkv,
                                const float *rope_cs,
                                float eps);
