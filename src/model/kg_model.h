/* kg_model: a decoder-only transformer read from GGUF: hyperparameters,
 * the tokenizer and views of the weight tensors (still in the file's types;
 * each backend converts them as it needs at load).
 *
 * DESIGN
 * The families kgen runs (llama, mistral, qwen2, qwen3, gemma2, gemma3,
 * phi3, smollm3, granite, olmo2, mistral3, seed_oss, apertus, and the
 * mixture-of-experts qwen3moe, Mixtral (llama with experts), gpt-oss and
 * glm4moe)
 * differ in a handful of switches, so one description covers them:
 * model-wide switches in kg_hparams_t (RoPE mode and scaling, GELU or SiLU
 * gate, embedding scale, soft-capping, how queries are scaled) and
 * per-layer attributes in kg_layer_weights_t (sliding window, RoPE base and
 * scale, NoPE, optional tensors: Q/K/V biases, Q/K norms, input and
 * post-norms; granite's multipliers, mistral3's attention temperature,
 * apertus's xIELU constants). They are
 * filled at load from the GGUF keys exactly as llama.cpp reads them, with
 * the values llama.cpp fixes in its code rather than in the file (Gemma's
 * layer patterns and query scale, Gemma 3's local RoPE base, YaRN's
 * factors). Fused tensors (phi3's attn_qkv and gate+up ffn_up) are split
 * into row views at load, so a backend sees separate Q, K, V, gate and up
 * matrices for every family. One forward pass reads all of this.
 *
 * Experts. A mixture-of-experts layer has a router (ffn_gate_inp: one
 * logit per expert) and 3-D expert tensors (ffn_{gate,up,down}_exps:
 * n_expert matrices stacked along ne[2]); the loader cuts them into one 2-D
 * view per expert, so a backend packs and multiplies an expert's matrix as
 * it does any other weight. How the router's logits become the k experts
 * and their weights is kg_moe_gating_t, with llama.cpp's renormalisation
 * and scale (build_moe_ffn). GLM-4.5's layers add a shared expert (a dense
 * SwiGLU FFN beside the routed ones, its output added to theirs), a
 * selection bias (exp_probs_b: added to the sigmoid scores for choosing
 * the experts, not for weighing them), optionally group-limited top-k,
 * and leading dense layers (the first leading_dense_block_count layers
 * have a plain FFN). Its next-token-prediction blocks (the last
 * nextn_predict_layers of block_count, for speculative decoding) are not
 * part of the trunk: the loader takes their tensors as known and skips
 * them.
 *
 * DeepSeek V2/V3 (deepseek2) keep GLM's MoE (softmax or sigmoid router,
 * selection bias, groups, shared experts, leading dense layers) and
 * replace the attention with multi-head latent attention: see the MLA
 * fields of kg_hparams_t.
 *
 * Llama 4 (llama4) interleaves dense and MoE layers (a shared expert beside
 * one sigmoid-weighted routed expert that scales its input), attends in
 * chunks on three layers of four and without RoPE (with the attention
 * temperature) on the fourth, and L2-normalises the RoPE layers' Q/K. */
#pragma once

#include "kg_gguf.h"
#include "kg_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS). */
#define KG_MOE_MAX_EXPERTS 1024
/* The most expert groups group-limited top-k takes (DeepSeek V3 has 8). */
#define KG_MOE_MAX_GROUPS 64

/* general.architecture values kgen runs. */
typedef enum kg_arch {
    KG_ARCH_LLAMA = 0,
    KG_ARCH_MISTRAL,
    KG_ARCH_QWEN2,
    KG_ARCH_QWEN3,
    KG_ARCH_GEMMA2,
    KG_ARCH_GEMMA3,
    KG_ARCH_PHI3,
    KG_ARCH_QWEN3MOE,
    KG_ARCH_GPT_OSS, /* "gpt-oss" (llama.cpp's LLM_ARCH_OPENAI_MOE) */
    KG_ARCH_SMOLLM3,
    KG_ARCH_GRANITE,
    KG_ARCH_OLMO2,
    KG_ARCH_MISTRAL3,
    KG_ARCH_SEED_OSS,
    KG_ARCH_APERTUS,
    KG_ARCH_GLM4MOE,
    KG_ARCH_DEEPSEEK2, /* DeepSeek V2/V2.5/V3/R1, Kimi K2: multi-head latent attention */
    KG_ARCH_BERT,      /* an encoder for embedding jobs (kg_model_bert.h) */
    KG_ARCH_GEMMA4,
    KG_ARCH_GEMMA_EMBED,    /* "gemma-embedding" (EmbeddingGemma): gemma3's layers, non-causal */
    KG_ARCH_NOMIC_BERT,     /* nomic-embed-text: bert with RoPE and SwiGLU (kg_model_bert.h) */
    KG_ARCH_LFM2,           /* Liquid LFM2: gated short convolutions beside attention (hybrid) */
    KG_ARCH_QWEN35,         /* Qwen3.5: gated DeltaNet beside gated attention (hybrid) */
    KG_ARCH_QWEN35MOE,      /* Qwen3.5 MoE: the same with routed and gated shared experts */
    KG_ARCH_QWEN3NEXT,      /* Qwen3-Next: qwen35moe's layers, V heads grouped by K head */
    KG_ARCH_GRANITEHYBRID,  /* IBM Granite 4 (hybrid): Mamba-2 or attention, then the FFN */
    KG_ARCH_NEMOTRON_H,     /* NVIDIA Nemotron-H (hybrid): each layer Mamba-2, attention or MLP */
    KG_ARCH_NEMOTRON_H_MOE, /* Nemotron 3 (hybrid): nemotron_h with experts for its MLPs */
    KG_ARCH_LLAMA4,         /* Llama 4: chunked attention, NoPE layers, top-1 sigmoid experts */
    KG_ARCH_LFM2MOE,        /* Liquid LFM2-MoE (hybrid): lfm2 with experts after dense layers */
    KG_ARCH_COUNT_,
} kg_arch_t;

/* Which elements RoPE pairs up (ggml's rope modes). */
typedef enum kg_rope_mode {
    KG_ROPE_MODE_NORM = 0, /* adjacent pairs (2i, 2i+1): llama */
    KG_ROPE_MODE_NEOX = 2, /* halves (i, i + n_rot/2): qwen2, qwen3, gemma, phi3 */
} kg_rope_mode_t;

/* rope.scaling.type (llama_rope_scaling_type). */
typedef enum kg_rope_scaling {
    KG_ROPE_SCALING_NONE = 0,
    KG_ROPE_SCALING_LINEAR,
    KG_ROPE_SCALING_YARN,
    KG_ROPE_SCALING_LONGROPE,
} kg_rope_scaling_t;

/* The gate's activation in the gated FFN: act(gate) * up. */
typedef enum kg_ffn_act {
    KG_FFN_SILU = 0, /* SwiGLU */
    KG_FFN_GELU,     /* GeGLU with GELU's tanh approximation (gemma) */
    /* gpt-oss's clamped SwiGLU (ggml_swiglu_oai, alpha 1.702, limit 7):
     * x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1) */
    KG_FFN_SWIGLU_OAI,
    /* Apertus's xIELU on the up projection alone (no gate; ggml_xielu with
     * the layer's xielu_* values) */
    KG_FFN_XIELU,
    /* Nemotron-H's ungated MLP: down(relu(up(x))^2) (LLM_FFN_RELU_SQR; no
     * gate) */
    KG_FFN_RELU_SQR,
} kg_ffn_act_t;

/* How a router's logits pick the k experts of a token and weigh them
 * (llama_expert_gating_func_type). Ties go to the lower expert index. */
typedef enum kg_moe_gating {
    /* softmax over every expert, the k largest probabilities, their
     * probabilities as weights (then renormalised if moe_norm_w): qwen3moe,
     * Mixtral */
    KG_MOE_SOFTMAX = 0,
    /* the k largest logits, a softmax over those k as weights: gpt-oss */
    KG_MOE_SOFTMAX_WEIGHT,
    /* a sigmoid of each logit; the k largest of sigmoid + exp_probs_b (the
     * selection bias, when the layer has one) pick the experts, the
     * unbiased sigmoids weigh them: glm4moe (expert_gating_func 2) */
    KG_MOE_SIGMOID,
} kg_moe_gating_t;

/* What a layer mixes its tokens with (the block before its FFN). The
 * hybrid families (kg_model_recurrent.c) mix attention layers with
 * recurrent ones, which keep a fixed-size state per sequence instead of
 * K/V rows per token: the backend holds one state per sequence slot,
 * zeroed at a sequence's position 0 and carried from step to step. */
typedef enum kg_layer_kind {
    KG_LAYER_ATTN = 0,  /* attention over the paged KV cache (every non-hybrid layer) */
    KG_LAYER_SHORTCONV, /* LFM2's gated short convolution: conv state only */
    KG_LAYER_DELTANET,  /* Qwen3.5 / Qwen3-Next gated DeltaNet: conv and delta-rule states */
    KG_LAYER_MAMBA2,    /* Mamba-2 (nemotron_h, granitehybrid): conv and SSM states */
    /* no mixer: the layer is its FFN alone, normed by attn_norm (Nemotron-H's
     * MLP layers; its other layers are a mixer alone, n_ff 0) */
    KG_LAYER_FFN,
} kg_layer_kind_t;

typedef struct kg_hparams {
    int32_t n_vocab;
    int32_t n_ctx_train; /* <arch>.context_length */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* n_embd / n_head unless attention.key_length says otherwise */
    int32_t n_rot;    /* rope.dimension_count; == head_dim for llama, <= head_dim (even) else */
    int32_t n_ff;     /* gate/up width (phi3's fused ffn_up is 2 * n_ff wide) */
    float norm_eps;   /* attention.layer_norm_rms_epsilon */
    float rope_base;  /* rope.freq_base, default 10000 (global layers) */
    float rope_scale; /* 1 / rope.scaling.factor for linear/yarn scaling; 1 = none */
    bool tied;        /* no output.weight: the head is token_embd */

    kg_arch_t arch;
    kg_rope_mode_t rope_mode;
    kg_rope_scaling_t rope_scaling; /* llama.cpp's default without the key: linear */
    int32_t n_ctx_orig;             /* rope.scaling.original_context_length, else n_ctx_train */
    /* YaRN as llama_context derives it: ext_factor 1 for yarn (0 otherwise),
     * attn_factor the magnitude correction (times rope.scaling.attn_factor,
     * which LongRoPE files carry), beta_fast 32, beta_slow 1. */
    float yarn_ext_factor;
    float yarn_attn_factor;
    float yarn_beta_fast;
    float yarn_beta_slow;
    int32_t n_swa;        /* attention.sliding_window of the windowed layers; 0 = none */
    float embd_scale;     /* embeddings are multiplied by it after the lookup; 0 = not */
    float attn_softcap;   /* scores = c * tanh(scores / c) before the softmax; 0 = off */
    float final_softcap;  /* the same on the logits; 0 = off */
    float q_scale;        /* 0: scores are scaled by 1/sqrt(head_dim) (llama); else q is
                             multiplied by q_scale before attention, scores unscaled
                             (gemma's query_pre_attn_scalar rule, phi3) */
    float kq_scale;       /* with q_scale 0: the scores' scale instead of 1/sqrt(head_dim)
                             (granite's attention.scale); 0 = the default */
    float residual_scale; /* each block's output is multiplied by it before it joins the
                             residual stream (granite); 0 = not */
    float logit_scale;    /* the logits are multiplied by 1 / logit_scale (granite); 0 = not */
    bool qk_norm_full;    /* q_norm / k_norm are one RMSNorm over all the query (key) heads
                             of a token, not one per head (olmo2) */
    /* Llama 4's attention temperature (mistral3: attention.temperature_scale): after RoPE,
     * q at position p is multiplied by log(floor(p / attn_temp_floor) + 1) * attn_temp_scale
     * + 1; attn_temp_scale 0 = off */
    float attn_temp_scale;
    int32_t attn_temp_floor; /* llama.cpp's n_attn_temp_floor_scale: the original context */
    /* Llama 4 (llama4): the temperature on the NoPE layers alone (instead of RoPE), at
     * position p + 1 (f_attn_temp_offset 1); the windowed layers' window is a chunk, each
     * token attending to [p - p % n_swa, p] (LLAMA_SWA_TYPE_CHUNKED); the RoPE layers' q and
     * k RMS-normed per head without a weight after RoPE (use_kq_norm: Llama4TextL2Norm) */
    bool attn_temp_nope;
    bool swa_chunked;
    bool qk_l2_norm;
    kg_ffn_act_t ffn_act;

    /* mixture of experts (n_expert 0: a dense model) */
    int32_t n_expert;      /* <arch>.expert_count */
    int32_t n_expert_used; /* <arch>.expert_used_count: experts per token (k) */
    int32_t n_ff_exp;      /* an expert's gate/up width (expert_feed_forward_length) */
    kg_moe_gating_t moe_gating;
    bool moe_norm_w;   /* divide the k weights by their sum (clamped to >= 2^-14) */
    float moe_w_scale; /* then multiply them by this; 0 or 1 = not */
    /* group-limited top-k (expert_group_count > 1): the experts split into
     * n_expert_groups equal groups, each scored by the sum of its two best
     * selection values; only the n_group_used best groups' experts may be
     * picked; 0 = not */
    int32_t n_expert_groups;
    int32_t n_group_used;
    int32_t n_expert_shared; /* expert_shared_count: the shared expert is n_expert_shared x
                                n_ff_exp wide; 0 = none */
    int32_t n_layer_dense;   /* leading_dense_block_count: layers [0, n_layer_dense) have a
                                dense FFN of n_ff */
    int32_t n_layer_nextn;   /* nextn_predict_layers: blocks after the n_layer trunk ones
                                that kgen skips (block_count = n_layer + n_layer_nextn) */

    /* Multi-head latent attention (deepseek2; n_lora_kv 0: not MLA). Each
     * token caches one latent row per layer: the normed kv_lora_rank
     * compression of its keys and values, then n_rot RoPE'd key dims shared
     * by every head; head_dim is that row (n_lora_kv + n_rot) and
     * n_head_kv 1, as the converter writes them (key_length,
     * head_count_kv). A query head has mla_k nope + rope dims; it is
     * absorbed into the latent through attn_k_b (its nope part), attends
     * the latent rows as one shared head, and the result is projected
     * out through attn_v_b (mla_v dims per head) before attn_output. */
    int32_t n_lora_q;   /* attention.q_lora_rank: 0 = queries straight from attn_q
                           (V2-Lite) */
    int32_t n_lora_kv;  /* attention.kv_lora_rank */
    int32_t mla_k;      /* attention.key_length_mla: a query head's nope + rope dims */
    int32_t mla_v;      /* attention.value_length_mla: a head's value dims */
    float mla_kq_scale; /* the scores' scale: mscale^2 / sqrt(mla_k) with YaRN's
                           mscale as llama.cpp's deepseek2 graph makes it */
    /* Gemma 4 (kg_model_gemma4.c): the windowed layers' head size and RoPE
     * dims (key_length_swa, rope.dimension_count_swa; head_dim and n_rot are
     * the global layers'), the width of each layer's slice of the per-layer
     * token embeddings (embedding_length_per_layer_input; 0 = none), the
     * layers [0, n_layer_kv) that keep their own K/V (the others read an
     * earlier layer's: shared_kv_layers), and V's weightless RMSNorm */
    int32_t head_dim_swa;
    int32_t n_rot_swa;
    int32_t n_embd_per_layer;
    int32_t n_layer_kv;
    bool v_norm;

    /* embeddings: <arch>.pooling_type as llama.cpp numbers it (0 none, 1 mean,
     * 2 cls, 3 last, 4 rank); -1 when the file has no such key */
    int32_t pooling_type;
    /* every token of an input attends to every other (llama.cpp's causal_attn
     * false: gemma-embedding); a windowed layer's window is then symmetric,
     * |p - pos| <= n_swa / 2 (LLAMA_SWA_TYPE_SYMMETRIC). Such a model runs
     * embedding jobs only, each input whole in one step. */
    bool non_causal;

    /* hybrid models' recurrent layers (n_layer_recurrent > 0; kg_model_recurrent.c) */
    int32_t n_layer_recurrent; /* layers whose kind is not KG_LAYER_ATTN */
    int32_t shortconv_l_cache; /* shortconv.l_cache: the short convolution's length (LFM2) */
    /* ssm.*: DeltaNet's and Mamba-2's sizes, as llama.cpp names them */
    int32_t ssm_d_conv;  /* ssm.conv_kernel */
    int32_t ssm_d_inner; /* ssm.inner_size */
    int32_t ssm_d_state; /* ssm.state_size */
    int32_t ssm_dt_rank; /* ssm.time_step_rank (DeltaNet: V heads; Mamba-2: heads) */
    int32_t ssm_n_group; /* ssm.group_count (DeltaNet: K heads; Mamba-2: B/C groups) */
    /* Qwen3.5's gated attention: attn_q is twice as wide, each head's
     * query then its output gate; the attention's output is multiplied by
     * sigmoid(gate) before attn_output */
    bool attn_out_gate;
    /* DeltaNet V head h reads K head h / (V heads / K heads) (qwen3next: V
     * heads grouped by K head); else h mod K heads (qwen35: tiled) */
    bool ssm_v_grouped;
    /* Llama 4: layer il has experts when (il + 1) % n_moe_step == 0
     * (interleave_moe_layer_step; 0: every layer past n_layer_dense); the router's weight
     * multiplies each chosen expert's input instead of its output, and the logits choose */
    int32_t n_moe_step;
    bool moe_w_before;
    int32_t n_ff_shexp; /* qwen35moe's, nemotron_h_moe's, granitehybrid's and llama4's shared
                           expert width (expert_shared_feed_forward_length; qwen35moe's default
                           n_ff; granitehybrid's 0: none); 0: n_expert_shared x n_ff_exp
                           (glm4moe, deepseek2) */
} kg_hparams_t;

/* Views into the GGUF mapping. Shapes in ggml order: ne[0] is the row
 * (input) dimension, so a weight W of shape (ne0=in, ne1=out) computes
 * y[out] = sum_in W[out][in] x[in]. Optional tensors are NULL when the
 * family does not have them. */
typedef struct kg_layer_weights {
    const kg_gguf_tensor_t *attn_norm; /* (n_embd); NULL: none (olmo2 norms outputs only) */
    const kg_gguf_tensor_t *wq;        /* (n_embd, n_head * head_dim) */
    const kg_gguf_tensor_t *wk;        /* (n_embd, n_head_kv * head_dim) */
    const kg_gguf_tensor_t *wv;        /* (n_embd, n_head_kv * head_dim) */
    const kg_gguf_tensor_t *wo;        /* (n_head * head_dim, n_embd) */
    const kg_gguf_tensor_t *ffn_norm;  /* (n_embd); NULL: none (olmo2) */
    const kg_gguf_tensor_t *w_gate;    /* (n_embd, n_ff); NULL with KG_FFN_XIELU */
    const kg_gguf_tensor_t *w_up;      /* (n_embd, n_ff) */
    const kg_gguf_tensor_t *w_down;    /* (n_ff, n_embd) */

    const kg_gguf_tensor_t *bq, *bk, *bv;   /* (n_head * head_dim), (n_head_kv * head_dim) x 2 */
    const kg_gguf_tensor_t *bo;             /* (n_embd) attn_output.bias */
    const kg_gguf_tensor_t *q_norm;         /* (head_dim) RMSNorm of each query head, or
                                               (n_head * head_dim) of all (qk_norm_full) */
    const kg_gguf_tensor_t *k_norm;         /* (head_dim) RMSNorm of each key head, or
                                               (n_head_kv * head_dim) of all */
    const kg_gguf_tensor_t *attn_post_norm; /* (n_embd) on the attention output */
    const kg_gguf_tensor_t *ffn_post_norm;  /* (n_embd) on the FFN output */

    /* mixture of experts: a layer with a router has no dense FFN (w_gate,
     * w_up, w_down NULL) but in Gemma 4, where the dense MLP runs beside
     * the experts */
    const kg_gguf_tensor_t *ffn_gate_inp;   /* (n_embd, n_expert) router */
    const kg_gguf_tensor_t *ffn_gate_inp_b; /* (n_expert) router bias (gpt-oss) */
    const kg_gguf_tensor_t *gate_exps;      /* (n_embd, n_ff_exp, n_expert) */
    const kg_gguf_tensor_t *up_exps;        /* (n_embd, n_ff_exp, n_expert) */
    const kg_gguf_tensor_t *down_exps;      /* (n_ff_exp, n_embd, n_expert) */
    const kg_gguf_tensor_t *gate_exps_b;    /* (n_ff_exp, n_expert) expert biases (gpt-oss) */
    const kg_gguf_tensor_t *up_exps_b;      /* (n_ff_exp, n_expert) */
    const kg_gguf_tensor_t *down_exps_b;    /* (n_embd, n_expert) */
    /* expert e's matrices as 2-D views: exp_gate[e] is (n_embd, n_ff_exp),
     * exp_up[e] the same, exp_down[e] (n_ff_exp, n_embd); (n_expert) each */
    const kg_gguf_tensor_t *exp_gate, *exp_up, *exp_down;
    const kg_gguf_tensor_t *attn_sinks;  /* (n_head) one extra softmax logit per head (gpt-oss) */
    const kg_gguf_tensor_t *exp_probs_b; /* (n_expert) selection bias (glm4moe) */
    /* the shared expert (glm4moe): FS = n_expert_shared * n_ff_exp */
    const kg_gguf_tensor_t *gate_shexp; /* (n_embd, FS) */
    const kg_gguf_tensor_t *up_shexp;   /* (n_embd, FS) */
    const kg_gguf_tensor_t *down_shexp; /* (FS, n_embd) */
    /* (n_embd) qwen35moe: the shared expert's output times
     * sigmoid(gate_inp_shexp . x), NULL: ungated */
    const kg_gguf_tensor_t *gate_inp_shexp;

    /* multi-head latent attention (deepseek2): wq above is NULL when the
     * queries are compressed (wq_a, q_a_norm, wq_b); wk, wv are NULL */
    const kg_gguf_tensor_t *wq_a;      /* (n_embd, n_lora_q) */
    const kg_gguf_tensor_t *q_a_norm;  /* (n_lora_q) */
    const kg_gguf_tensor_t *wq_b;      /* (n_lora_q, n_head * mla_k) */
    const kg_gguf_tensor_t *wkv_a_mqa; /* (n_embd, n_lora_kv + n_rot) latent and k_pe */
    const kg_gguf_tensor_t *kv_a_norm; /* (n_lora_kv) */
    /* head h's absorption matrices as 2-D views of attn_k_b and attn_v_b:
     * k_b[h] is (mla_k - n_rot, n_lora_kv) (the nope query into the latent),
     * v_b[h] (n_lora_kv, mla_v) (the latent into the head's values) */
    const kg_gguf_tensor_t *k_b, *v_b;

    int32_t n_swa; /* this layer's window (it attends to the last n_swa positions,
                      itself included); 0 = global */
    bool no_rope;  /* no rotation of q and k in this layer (NoPE: smollm3's every
                      fourth layer, granite with rope.scaling.finetuned false) */
    /* xIELU's constants as ggml_xielu makes them from the file's per-layer
     * xielu.* values: alpha_n = beta + softplus(alpha_n), alpha_p =
     * softplus(alpha_p), beta, eps (KG_FFN_XIELU) */
    float xielu_an, xielu_ap, xielu_beta, xielu_eps;
    float rope_base; /* this layer's RoPE base and frequency scale */
    float rope_scale;

    /* this layer's attention and FFN shape: the model's for every family but
     * Gemma 4, whose windowed and global layers differ (and whose FFN width
     * may be a per-layer array); n_ff 0: no FFN (Nemotron-H's mixer
     * layers) */
    int32_t head_dim, n_head_kv, n_rot, n_ff;
    int32_t kv_layer; /* the layer whose K/V cache it reads: itself, or for a
                         Gemma 4 shared-KV layer the last earlier one of its kind */
    /* Gemma 4 */
    const kg_gguf_tensor_t *rope_freqs;   /* (n_rot / 2) this layer's RoPE divisors (the
                                             global layers' proportional RoPE) or NULL */
    float out_scale;                      /* layer_output_scale: the block's result times it;
                                             0 = none */
    const kg_gguf_tensor_t *pe_gate;      /* (n_embd, P) inp_gate */
    const kg_gguf_tensor_t *pe_proj;      /* (P, n_embd) proj */
    const kg_gguf_tensor_t *pe_post_norm; /* (n_embd) post_norm */
    /* Gemma 4's MoE layers (ffn_gate_inp set): the router reads the
     * unweighted RMSNorm of the residual times 1/sqrt(n_embd) times
     * ffn_gate_inp.scale; the dense MLP's output is normed by post_norm_1,
     * the experts' input by pre_norm_2 and their sum by post_norm_2 */
    const kg_gguf_tensor_t *ffn_gate_inp_s;  /* (n_embd) ffn_gate_inp.scale */
    const kg_gguf_tensor_t *down_exps_s;     /* (n_expert) each expert's output scale
                                                (ffn_down_exps.scale: per_expert_scale) or NULL */
    const kg_gguf_tensor_t *ffn_pre_norm_2;  /* (n_embd) pre_ffw_norm_2 */
    const kg_gguf_tensor_t *ffn_post_norm_1; /* (n_embd) post_ffw_norm_1 */
    const kg_gguf_tensor_t *ffn_post_norm_2; /* (n_embd) post_ffw_norm_2 */

    /* A hybrid model's recurrent layer (kind != KG_LAYER_ATTN) has none of
     * the attention tensors above; its own are below (llama.cpp's names). */
    kg_layer_kind_t kind;
    /* LFM2's short convolution: in_proj (n_embd, 3 n_embd) gives B, C and x;
     * y = out_proj(C * conv(B * x)), conv a causal depthwise convolution of
     * length shortconv_l_cache, (L, n_embd) */
    const kg_gguf_tensor_t *sc_in_proj, *sc_conv, *sc_out_proj;
    /* DeltaNet and Mamba-2 (llama.cpp's layer.ssm_* and wqkv_gate; NULL
     * where the kind has none) */
    const kg_gguf_tensor_t *ssm_in;       /* in_proj (Mamba-2) / attn_qkv (DeltaNet) */
    const kg_gguf_tensor_t *ssm_gate;     /* DeltaNet's attn_gate (z) */
    const kg_gguf_tensor_t *ssm_conv1d;   /* (d_conv, conv channels), F32 */
    const kg_gguf_tensor_t *ssm_conv1d_b; /* (conv channels) Mamba-2 */
    const kg_gguf_tensor_t *ssm_dt_b;     /* ssm_dt.bias */
    const kg_gguf_tensor_t *ssm_a;
    const kg_gguf_tensor_t *ssm_d;     /* Mamba-2 */
    const kg_gguf_tensor_t *ssm_beta;  /* DeltaNet */
    const kg_gguf_tensor_t *ssm_alpha; /* DeltaNet */
    const kg_gguf_tensor_t *ssm_ba;    /* qwen3next's beta and alpha in one: per K head, its
                                          V heads' betas then their alphas */
    const kg_gguf_tensor_t *ssm_norm;  /* the gated RMSNorm's weight */
    const kg_gguf_tensor_t *ssm_out;
} kg_layer_weights_t;

typedef struct kg_model {
    kg_gguf_t *gguf;     /* owned */
    kg_tokenizer_t *tok; /* owned */
    kg_hparams_t hp;
    const kg_gguf_tensor_t *tok_embd;    /* (n_embd, n_vocab) */
    const kg_gguf_tensor_t *output_norm; /* (n_embd) */
    const kg_gguf_tensor_t *output;      /* (n_embd, n_vocab); == tok_embd when tied */
    const kg_gguf_tensor_t *output_b;    /* (n_vocab) output.bias (qwen2) or NULL */
    const kg_gguf_tensor_t *rope_freqs;  /* (n_rot / 2) frequency divisors (Llama 3.1) or NULL */
    const kg_gguf_tensor_t *rope_long;   /* (n_rot / 2) LongRoPE factors or NULL */
    const kg_gguf_tensor_t *rope_short;  /* (n_rot / 2), present with rope_long */
    /* Gemma 4's per-layer inputs (P = n_embd_per_layer > 0), else NULL */
    const kg_gguf_tensor_t *pl_tok_embd;   /* (n_layer * P, n_vocab) per_layer_token_embd */
    const kg_gguf_tensor_t *pl_model_proj; /* (n_embd, n_layer * P) per_layer_model_proj */
    const kg_gguf_tensor_t *pl_proj_norm;  /* (P) per_layer_proj_norm */
    kg_layer_weights_t *layers;            /* (n_layer) */
    kg_gguf_tensor_t *views;               /* owned: row views of fused tensors */
    kg_gguf_tensor_t *expert_views;        /* owned: (n_layer, 3, n_expert) per-expert views */
    kg_gguf_tensor_t *mla_views; /* owned: (n_layer, 2, n_head) per-head k_b / v_b views */
    char *chat_template;         /* tokenizer.chat_template or NULL */
    /* a reranker's head (qwen3: cls.output.weight, (n_embd, n_cls_out), the
     * rows of its labels, Qwen3-Reranker's "yes" and "no") or NULL */
    const kg_gguf_tensor_t *cls_out;
    int32_t n_cls_out;
    char *rerank_template; /* tokenizer.chat_template.rerank ({query}, {document}) or NULL */
    /* owned: bert's own tensors (kg_model_bert.h), else NULL */
    struct kg_bert_weights *bert;
    /* Sentence-Transformers' dense projections after pooling (a file
     * converted with --sentence-transformers-dense-modules: gemma-embedding),
     * else NULL: dense_2 (n_embd, n_dense), then dense_3 (n_dense, n_embd) */
    const kg_gguf_tensor_t *dense_2;
    const kg_gguf_tensor_t *dense_3;
    int32_t n_dense;
} kg_model_t;

/* What a model needs beyond the plain Llama graph. A backend that lacks a
 * feature must refuse the model (kg_backend_new does, by these bits). */
enum {
    KG_MODEL_FEAT_QKV_BIAS = 1u << 0,       /* Q/K/V or attention-output biases, output bias */
    KG_MODEL_FEAT_QK_NORM = 1u << 1,        /* RMSNorm of each Q and K head */
    KG_MODEL_FEAT_POST_NORM = 1u << 2,      /* norms on the attention and FFN outputs */
    KG_MODEL_FEAT_GELU = 1u << 3,           /* GeGLU FFN */
    KG_MODEL_FEAT_EMBD_SCALE = 1u << 4,     /* scaled embeddings */
    KG_MODEL_FEAT_SOFTCAP = 1u << 5,        /* attention or final-logit soft-capping */
    KG_MODEL_FEAT_SLIDING_WINDOW = 1u << 6, /* windowed layers */
    KG_MODEL_FEAT_ROPE_NEOX = 1u << 7,      /* NeoX RoPE pairs */
    KG_MODEL_FEAT_ROPE_PARTIAL = 1u << 8,   /* n_rot < head_dim */
    KG_MODEL_FEAT_ROPE_PER_LAYER = 1u << 9, /* layers with their own RoPE base or scale */
    KG_MODEL_FEAT_ROPE_YARN = 1u << 10,     /* YaRN, or a magnitude factor (LongRoPE) */
    KG_MODEL_FEAT_ROPE_FACTORS = 1u << 11,  /* LongRoPE short/long factor tensors */
    KG_MODEL_FEAT_Q_SCALE = 1u << 12,       /* queries scaled before attention */
    KG_MODEL_FEAT_MOE = 1u << 13,           /* routed experts (softmax router, SwiGLU experts) */
    KG_MODEL_FEAT_MOE_OAI = 1u << 14,       /* gpt-oss's experts: top-k-then-softmax router, router
                                               and expert biases, clamped SwiGLU */
    KG_MODEL_FEAT_ATTN_SINKS = 1u << 15,    /* a per-head sink logit in the attention softmax */
    KG_MODEL_FEAT_NOPE = 1u << 16,          /* layers without RoPE */
    KG_MODEL_FEAT_SCALES = 1u << 17,        /* granite's multipliers: attention scale, residual
                                               and logit scales */
    KG_MODEL_FEAT_NO_PRE_NORM = 1u << 18,   /* layers without the attention / FFN input norms */
    KG_MODEL_FEAT_QK_NORM_FULL = 1u << 19,  /* Q/K RMSNorm over all heads of a token */
    KG_MODEL_FEAT_ATTN_TEMP = 1u << 20,     /* queries scaled by position (attention temperature) */
    KG_MODEL_FEAT_XIELU = 1u << 21,         /* xIELU FFN without a gate (apertus) */
    KG_MODEL_FEAT_MOE_SIGMOID = 1u << 22,   /* sigmoid router with a selection bias, group-
                                               limited top-k (glm4moe) */
    KG_MODEL_FEAT_SHARED_EXPERT = 1u << 23, /* a dense shared expert beside the routed ones */
    KG_MODEL_FEAT_MLA = 1u << 24,           /* multi-head latent attention with a latent KV
                                               cache (deepseek2) */
    KG_MODEL_FEAT_ENCODER = 1u << 25,       /* a non-causal encoder for embeddings only (bert) */
    KG_MODEL_FEAT_BIDIR = 1u << 26, /* a decoder's layers run non-causally (gemma-embedding) */
    /* Gemma 4 (the high bits, apart from the next families'): */
    KG_MODEL_FEAT_HEAD_PER_LAYER = 1u << 27, /* layers with their own head size, K/V heads,
                                                RoPE dims, RoPE divisors or FFN width */
    KG_MODEL_FEAT_KV_SHARED = 1u << 28,      /* layers reading an earlier layer's K/V */
    KG_MODEL_FEAT_PER_LAYER_EMBD = 1u << 29, /* per-layer token embeddings, gate and proj */
    KG_MODEL_FEAT_V_NORM = 1u << 30,         /* V's RMSNorm, layer output scales, and the
                                                MoE layers' MLP beside the experts with its
                                                own norms and scaled router input (the rest
                                                of Gemma 4's graph; no bit is left) */
};

/** Open a GGUF model file. Checks the architecture, every hyperparameter and
 * every tensor's presence, type and shape, and that the file has no tensor
 * the graph would not use. NULL with one line in errstr on failure (an
 * unknown architecture or rope.scaling.type is named, with what is
 * supported). */
kg_model_t *kg_model_load(const char *path, char *errstr, size_t errstr_size);

/** kg_model_load on an opened file (kg_gguf_open_memory for fuzzing);
 * takes `gguf` (freed on failure too). `path` names it in messages. */
kg_model_t *kg_model_load_gguf(kg_gguf_t *gguf, const char *path, char *errstr, size_t errstr_size);
void kg_model_free(kg_model_t *model);

/** The architecture's GGUF name ("qwen2", ...). */
const char *kg_arch_name(kg_arch_t arch);

/** Whether the model is an encoder that runs embedding jobs only (no LM
 * head, non-causal attention): bert (kg_model_bert.c). @thread any */
bool kg_model_embed_only(const kg_model_t *model);

/** Whether the model's attention is non-causal, so that it runs embedding
 * jobs only, each input whole in one step: an encoder (kg_model_embed_only)
 * or a decoder stack without the causal mask (gemma-embedding). @thread any */
bool kg_model_non_causal(const kg_model_t *model);

/** Whether some layer of the model is recurrent (a hybrid: LFM2), so that
 * a backend keeps a state per sequence slot (kg_model_state_floats) and
 * a sequence cannot start from cached K/V blocks alone. @thread any */
bool kg_model_is_recurrent(const kg_model_t *model);

/** Floats of recurrent state layer il keeps per sequence (0 for an
 * attention layer): LFM2's (l_cache - 1) x n_embd convolution window;
 * Mamba-2's (d_conv - 1) x (d_inner + 2 n_group d_state) window and its
 * d_state x d_inner SSM state. */
int64_t kg_model_state_floats(const kg_model_t *model, int32_t il);

/** KG_MODEL_FEAT_* bits the model uses. @thread any */
uint32_t kg_model_features(const kg_model_t *model);

/** Comma-separated names of the features in `mask` ("qkv_bias, gelu");
 * writes at most cap bytes (NUL-terminated) and returns buf. */
const char *kg_model_feature_names(uint32_t mask, char *buf, size_t cap);

/** The window that bounds what any future token can attend to: the largest
 * layer window when every layer is windowed, else 0 (some layer is global,
 * so every position stays needed). The engine frees KV blocks wholly
 * outside it. */
int32_t kg_model_kv_window(const kg_model_t *model);

/** The LongRoPE factors llama.cpp would use for a per-sequence context of
 * `n_ctx_seq` tokens (long when it exceeds n_ctx_orig), else rope_freqs
 * (or NULL). Per layer in llama.cpp, the same tensor for every layer here. */
const kg_gguf_tensor_t *kg_model_rope_factors(const kg_model_t *model, int32_t n_ctx_seq);
