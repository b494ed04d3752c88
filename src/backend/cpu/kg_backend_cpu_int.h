/* kg_backend_cpu_int: what the CPU backend's two files share: its
 * weights, layers and context (the buffers the forward pass works in),
 * built by kg_backend_cpu.c and run by kg_backend_cpu_forward.c. */
#pragma once

#include "../../core/kg_pool.h"
#include "../kg_backend_impl.h"
#include "cpu_gemm.h"
#include "cpu_moe.h"
#include "cpu_quant.h"
#include "cpu_vecdot.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cpu_weight {
    const float *data;         /* vectors only: (n_in) F32 */
    float *owned;              /* non-NULL when a vector was dequantized at load */
    cpu_gemm_weights_t packed; /* F32/F16/BF16 matrices: (n_out, n_in) packed for cpu_gemm */
    cpu_qmat_t q;              /* quantized matrices: (n_out, n_in) blocks in the mapping */
    int64_t n_in, n_out;
    kg_ggml_type_t type; /* type in the file: decides activation rounding */
} cpu_weight_t;

typedef struct cpu_layer {
    cpu_weight_t attn_norm, ffn_norm; /* (n_embd) as (1, n_embd) */
    cpu_weight_t wq, wk, wv, wo, w_gate, w_up, w_down;
    /* optional vectors (data NULL when the family has none) */
    cpu_weight_t bq, bk, bv, bo;                /* biases: (n_q), (n_kv), (n_kv), (n_embd) */
    cpu_weight_t q_norm, k_norm;                /* (head_dim) */
    cpu_weight_t attn_post_norm, ffn_post_norm; /* (n_embd) */
    int32_t rope;                               /* index into cpu_ctx_t.ropes */
    /* mixture of experts (moe false: the dense w_gate, w_up, w_down) */
    bool moe;
    cpu_weight_t gate_inp;                         /* (n_expert, n_embd) the router */
    cpu_weight_t gate_inp_b;                       /* (n_expert) or data NULL */
    cpu_weight_t *exp_gate, *exp_up, *exp_down;    /* (n_expert) expert e's matrices */
    cpu_weight_t exp_gate_b, exp_up_b, exp_down_b; /* (n_expert, n_ff_exp) x 2,
                                                      (n_expert, n_embd); or data NULL */
    cpu_weight_t sinks;                            /* (n_head) or data NULL */
    cpu_weight_t exp_probs_b;                      /* (n_expert) selection bias or data NULL */
    /* the shared expert (glm4moe), FS = n_expert_shared * n_ff_exp wide;
     * sh_gate.n_out 0: none */
    cpu_weight_t sh_gate, sh_up, sh_down;
    /* Gemma 4's MoE layers (ffn_pre_norm_2 data NULL: none), whose dense
     * MLP (w_gate, w_up, w_down) runs beside the experts: the router
     * input's scale, each expert's output scale (data NULL: none), and
     * the norms of the experts' input, the MLP's output and the experts' */
    cpu_weight_t gate_inp_s, exp_down_s;                           /* (n_embd), (n_expert) */
    cpu_weight_t ffn_pre_norm_2, ffn_post_norm_1, ffn_post_norm_2; /* (n_embd) */
    cpu_weight_t sh_gate_inp; /* (n_embd) qwen35moe's shared-expert gate, or data NULL */
    /* multi-head latent attention (deepseek2; wkv_a.n_out 0: none): wq, or
     * wq_a, q_a_norm and wq_b; k_b[h], v_b[h] are head h's absorption
     * matrices, (n_lora_kv, nope) and (mla_v, n_lora_kv) */
    cpu_weight_t wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm;
    cpu_weight_t *k_b, *v_b; /* (n_head) each */
    /* Gemma 4's per-layer input: gate (P, n_embd), proj (n_embd, P), post
     * norm (n_embd); gate n_out 0: none */
    cpu_weight_t pe_gate, pe_proj, pe_post_norm;
    /* a hybrid's recurrent mixer (cpu_recurrent.c; kind in the model's
     * layer): LFM2's short convolution, in_proj (3 n_embd, n_embd),
     * out_proj (n_embd, n_embd), the kernel F32 (n_embd, l_cache) */
    cpu_weight_t sc_in, sc_out;
    float *sc_conv;
    struct cpu_deltanet_layer *dn; /* Qwen3.5's gated DeltaNet (cpu_deltanet.h), else NULL */
    /* Mamba-2 (cpu_mamba2.c): in_proj, out_proj, and its F32 arrays (the
     * kernel, biases, A, D, the norm) in one block */
    cpu_weight_t ssm_in, ssm_out;
    float *ssm_f32;
} cpu_layer_t;

/* One distinct RoPE among the layers (Gemma: local and global). */
typedef struct cpu_rope {
    float base, scale;
    int32_t n_rot;                   /* dims it rotates (Gemma 4: the layer kind's) */
    const kg_gguf_tensor_t *factors; /* the layer's own divisors (Gemma 4) or NULL */
    float *freqs;                    /* factors as F32 (owned), or NULL: the model's rope_freqs */
    float corr_dims[2];              /* YaRN's blend range for this base */
} cpu_rope_t;

typedef struct cpu_ctx {
    const kg_model_t *model;
    kg_hparams_t hp;
    int n_threads;
    kg_pool_t *pool; /* n_threads workers for attention */
    int32_t n_kv_blocks, block_size, max_tokens;
    cpu_layer_t *layers;      /* (n_layer) */
    cpu_weight_t output_norm; /* (n_embd) */
    cpu_weight_t output;      /* (n_vocab, n_embd) */
    cpu_weight_t output_b;    /* (n_vocab) or data NULL */
    float *rope_freqs;        /* (n_rot / 2) frequency divisors (rope_freqs or LongRoPE) or NULL */
    cpu_rope_t *ropes;        /* (n_ropes) */
    int32_t n_ropes;
    int32_t rope_stride;  /* floats per token in rope_cs: the largest n_rot */
    int32_t max_window;   /* largest layer window, 0 when some layer is global */
    uint16_t *gelu_table; /* (65536) GeGLU models only */
    uint16_t **k_cache;   /* (n_layer) x (n_kv_blocks * block_size, n_head_kv * head_dim) fp16,
                             the layer's own shape; NULL for a layer reading another's */
    uint16_t **v_cache;   /* same shape as k_cache; NULL rows for MLA, whose values are
                             the first n_lora_kv dims of the K rows (one latent row per token:
                             head_dim = n_lora_kv + n_rot, n_head_kv 1) */
    /* scratch for max_tokens tokens */
    float *x;       /* (T, n_embd) residual stream */
    float *xn;      /* (T, n_embd) normed input of a block */
    float *xr;      /* (T, max(n_embd, n_ff, n_q)) activations rounded for a weight type */
    float *q;       /* (T, n_head * head_dim) */
    float *k;       /* (T, n_head_kv * head_dim) */
    float *v;       /* (T, n_head_kv * head_dim) */
    float *att;     /* (T, n_head * head_dim) attention output */
    float *qgate;   /* (T, n_head * head_dim) qwen35's output gate, else NULL */
    float *gate;    /* (T, max(n_ff, FS)) FS: the shared expert's width */
    float *up;      /* (T, max(n_ff, FS)) */
    float *shexp;   /* (T, n_embd) the shared expert's output, or Gemma 4's MLP beside its
                       experts (NULL: none) */
    float *tmp;     /* (T, n_embd) projection output before the residual add */
    float *rope_cs; /* (n_ropes, T, rope_stride) cos | sin per token */
    /* Gemma 4's per-layer inputs (P > 0): the projected and looked-up
     * inputs of every layer, (T, n_layer * P), and one layer's gate (T, P) */
    cpu_weight_t pl_model_proj, pl_proj_norm;
    float *pl_in, *pl_gate;
    float *scores;        /* (n_threads, n_kv_blocks * block_size) */
    float *flash;         /* (n_threads, cpu_attn_flash_scratch(max_head_dim)) embedding inputs'
                             attention (cpu_attn_flash.h) */
    int32_t max_head_dim; /* the widest layer's head_dim */
    cpu_qact_t qact;      /* (T, widest) activations quantized for cpu_vecdot */
    cpu_qgemm_scratch_t *qscratch; /* cpu_vecdot's per-thread unpacked panels */
    /* mixture of experts (n_expert > 0), k = n_expert_used */
    cpu_moe_plan_t plan;
    float *moe_logits;    /* (T, n_expert) router logits */
    float *moe_x;         /* (T * k, n_embd) normed inputs grouped by expert */
    float *moe_g;         /* (T * k, n_ff_exp) gate, then the gated activation */
    float *moe_u;         /* (T * k, n_ff_exp) up */
    float *moe_y;         /* (T * k, n_embd) expert outputs */
    float *moe_xr;        /* (T * k, max(n_embd, n_ff_exp)) activations rounded for an expert */
    int32_t *moe_active;  /* (n_expert) this layer's active experts, largest group first */
    int64_t *moe_tokens;  /* (n_expert) rows each expert took, all layers and steps */
    cpu_qact_t *moe_qact; /* (n_threads) x (T, max(n_embd, n_ff_exp)): expert groups that run
                             side by side quantize their activations into their thread's own */
    kg_moe_stats_t moe_stats;
    /* multi-head latent attention (n_lora_kv > 0) */
    float *mla_q;   /* (T, n_head * mla_k) the queries before absorption */
    float *mla_qa;  /* (T, n_lora_q) the compressed queries */
    float *mla_att; /* (T, n_head * mla_v) the heads' values, attn_output's input */
    /* the per-head GEMMs side by side (n_head >= n_threads), W = max(nope, n_lora_kv,
     * mla_v): each head's gathered rows and output, each thread's rounding and
     * quantized activations */
    float *mla_hin;              /* (n_head, T, W) */
    float *mla_hout;             /* (n_head, T, W) */
    float *mla_xr;               /* (n_threads, T, W) */
    cpu_qact_t *mla_qact;        /* (n_threads) x (T, W) */
    struct cpu_lora_state *lora; /* LoRA adapters (cpu_lora.c), NULL until one is added */
    struct cpu_bert *bert;       /* the bert encoder's own parts (cpu_bert.c), else NULL */
    struct cpu_rec *rec;         /* recurrent states per slot (cpu_recurrent.c), else NULL */
    size_t weights_size, kv_size, scratch_size;
    kg_backend_fault_t fault; /* what the last failed forward hit (kg_backend_last_fault) */
} cpu_ctx_t;

/** One tensor into `w` (kg_backend_cpu_weight.c): F32/F16/BF16 matrices
 * packed for cpu_gemm (the file's pages let go), quantized ones used in
 * place from the mapping, vectors F32 in place or dequantized into
 * w->owned. ctx->weights_size counts what it takes. False with errstr set. */
bool cpu_weight_init(
    cpu_weight_t *w, const kg_gguf_tensor_t *t, cpu_ctx_t *ctx, char *errstr, size_t errstr_size);

/** Run one step (the vtable's forward; see kg_backend_forward).
 * @thread engine */
KG_NODISCARD kg_status_t cpu_backend_forward(kg_backend_t *be,
                                             const kg_step_batch_t *batch,
                                             float *logits);

/** outs[i](T, ws[i].n_out) = in(T, n_in) · ws[i]^T for n weights sharing
 * their input (cpu_matmul.c), in rounded into xr (T, n_in) (float types)
 * or quantized into qa (block types) for their type: one hand-off to
 * `pool` when they share a path (Q, K and V; gate and up). pool NULL: the
 * calling thread only, pool thread `thread`, whose unpacking buffers it
 * uses. */
void cpu_matmul_n_on(cpu_ctx_t *ctx,
                     kg_pool_t *pool,
                     int thread,
                     float *xr,
                     cpu_qact_t *qa,
                     int n,
                     const cpu_weight_t *const *ws,
                     const float *in,
                     float *const *outs,
                     int64_t T);

/** outs[i](T, ws[i].n_out) = in(T, n_in) · ws[i]^T on the backend's pool,
 * activations rounded as ggml rounds them for the weight type (the
 * forward's matmul_n). @thread engine */
void cpu_matmul_n(cpu_ctx_t *ctx,
                  int n,
                  const cpu_weight_t *const *ws,
                  const float *in,
                  float *const *outs,
                  int64_t T);
