/* kg_backend_cuda_int: what the CUDA backend's three files share: its
 * context (weights, KV pool, buffers, graph buckets) and the functions one
 * file gives another. kg_backend_cuda.cu builds and frees the backend
 * (and fills the vtable), kg_backend_cuda_weights.cu uploads the weights,
 * kg_backend_cuda_step.cu runs steps (forward, graphs, sampling, faults). */
#pragma once

#include "attention.cuh"
#include "bert.cuh"
#include "cuda_common.cuh"
#include "embed.cuh"
#include "geglu.cuh"
#include "gemm.cuh"
#include "kg_backend_cuda.h"
#include "kv_copy.cuh"
#include "llama4.cuh"
#include "logit_bias.cuh"
#include "logits.cuh"
#include "mask.cuh"
#include "mla.cuh"
#include "moe.cuh"
#include "recurrent.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sample.cuh"
#include "swiglu.cuh"

#include <stdarg.h>
#include <string.h>

extern "C" {
#include "../src/backend/kg_backend_impl.h"
#include "../src/model/kg_quant.h"
}

#define MAX_BUCKETS     64
#define GRAPH_MAX_ROWS  1024
#define MAX_OUTPUTS     512
#define STAGE_SIZE      ((size_t)32 << 20)
#define BLAS_WORKSPACE  ((size_t)32 << 20)
#define ATT_PAIR_CAP    2048 /* (token, split) partial results of attention */
#define DEFAULT_MAX_CTX 4096

typedef struct cuda_layer {
    float *attn_norm, *ffn_norm; /* (n_embd) */
    kg_cuda_mat_t wqkv;          /* (n_q + 2 n_kv, n_embd) */
    kg_cuda_mat_t wo;            /* (n_embd, n_q) */
    kg_cuda_mat_t wgu;           /* (2 n_ff, embd): gate rows, then up rows (dense layers; an expert
                                    layer's shared expert, 2 FS rows) */
    kg_cuda_mat_t wdown; /* (n_embd, n_ff) (dense layers; the shared expert's (n_embd, FS)) */
    /* what a family adds; NULL when it has none */
    float *bqkv;                           /* (n_q + 2 n_kv) Q|K|V biases */
    float *bo;                             /* (n_embd) attention output bias */
    float *q_norm, *k_norm;                /* (head_dim) per-head RMSNorm weights */
    float *attn_post_norm, *ffn_post_norm; /* (n_embd) */
    float *sinks;                          /* (n_head) attention sinks */
    int32_t rope;                          /* index into cuda_ctx_t.ropes */
    int32_t kv_il;                         /* its K/V in the pool's layers; -1: none (recurrent) */
    size_t kv_off, kv_plane;               /* the K plane it reads starts at kv + kv_off, V at
                                              kv_off + kv_plane (bytes): its own, or a Gemma 4
                                              shared-KV layer's source's */
    int32_t n_swa;                         /* window; 0: global */
    /* mixture of experts (moe: no wgu, wdown) */
    bool moe;
    kg_cuda_mat_t router;           /* (n_expert, n_embd) */
    float *router_b;                /* (n_expert) */
    kg_cuda_mat_t exp_gate, exp_up; /* (n_expert * n_ff_exp, n_embd), one type */
    kg_cuda_mat_t exp_down;         /* (n_expert * n_embd, n_ff_exp) */
    float *exp_gate_b, *exp_up_b;   /* (n_expert, n_ff_exp) */
    float *exp_down_b;              /* (n_expert, n_embd) */
    float *probs_b;                 /* (n_expert) selection bias (glm4moe) */
    int32_t n_ff_shexp;             /* FS: the shared expert's width; 0: none */
    float *shexp_gate;              /* (n_embd) its output gate's weights (qwen35moe), or NULL */
    /* bert and nomic-bert (attn_norm and ffn_norm hold their post-norms'
     * weights; wgu bert's up matrix alone, nomic-bert's gate|up): the
     * post-norms' biases, the FFN's biases (NULL: none) */
    float *attn_norm_b, *ffn_norm_b; /* (n_embd) */
    float *up_b;                     /* (n_ff) */
    float *down_b;                   /* (n_embd) */
    /* a hybrid's recurrent mixer (kind != KG_LAYER_ATTN: no wqkv, wo) */
    kg_cuda_mat_t rin;              /* LFM2's in_proj (3 n_embd: B | C | x); the DeltaNet's
                                       q|k|v, z, then beta and alpha (or qwen3next's ba) */
    kg_cuda_mat_t rout;             /* out_proj / ssm_out */
    float *rconv;                   /* (channels, K) the convolution's kernel */
    float *dt_b, *ssm_a, *ssm_norm; /* the DeltaNet's (V heads, V heads, d_state), Mamba-2's
                                       (heads, heads, d_inner) */
    float *conv_b, *ssm_d;          /* Mamba-2's conv bias (or NULL) and D (heads) */
    /* multi-head latent attention (deepseek2, kg_backend_cuda_mla.cu): wqkv
     * holds attn_q_a (or attn_q) then attn_kv_a_mqa; wq_b NULL without
     * q_lora_rank; k_b and v_b stack one matrix per head */
    kg_cuda_mat_t wq_b;          /* (n_head * mla_k, n_lora_q) */
    kg_cuda_mat_t k_b, v_b;      /* (n_head * n_lora_kv, nope), (n_head * mla_v, n_lora_kv) */
    float *q_a_norm, *kv_a_norm; /* (n_lora_q), (n_lora_kv) */
} cuda_layer_t;

typedef enum bucket_state {
    BUCKET_NEW = 0, /* not run yet: the next step warms it up and captures it */
    BUCKET_GRAPH,   /* captured */
    BUCKET_EAGER,   /* capturing failed: runs kernel by kernel */
} bucket_state_t;

typedef struct bucket {
    int32_t rows;
    bucket_state_t state;
    cudaGraphExec_t exec;
} bucket_t;

typedef struct cuda_lora cuda_lora_t; /* lora.cu */
typedef struct cuda_rec cuda_rec_t;   /* kg_backend_cuda_recurrent.cu */
typedef struct cuda_mla cuda_mla_t;   /* kg_backend_cuda_mla.cu */
typedef struct cuda_g4 cuda_g4_t;     /* kg_backend_cuda_gemma4.cu */
typedef struct stage stage_t;         /* kg_backend_cuda_weights.cu: the upload's staging */

typedef struct cuda_ctx {
    const kg_model_t *model;
    kg_hparams_t hp;
    int device, n_sm;
    bool dead;
    cudaStream_t stream;
    kg_cuda_blas_t blas;
    void *blas_ws;
    int32_t n_kv_blocks, block_size, max_tokens, out_cap, table_cap;

    cuda_layer_t *layers; /* (n_layer) */
    kg_cuda_mat_t emb;    /* (n_vocab, n_embd) */
    kg_cuda_mat_t head;   /* (n_vocab, n_embd); data == emb.data when tied */
    float *out_norm;      /* (n_embd) */
    float *out_b;         /* (n_vocab) output bias or NULL */
    /* bert and nomic-bert (kg_backend_cuda_bert.cu); NULL for the other
     * families (pos_embd for nomic-bert too, whose steps take their RoPE
     * angles from rope_cs, filled once at start) */
    bool bert;
    float *pos_embd;              /* (n_ctx_train, n_embd) */
    float *type_embd;             /* (n_types, n_embd): row 0 is what every token adds, or NULL */
    float *tok_norm, *tok_norm_b; /* (n_embd) LayerNorm of the summed embeddings */
    float *rope_freqs;     /* (n_rot / 2) frequency factors (rope_freqs or LongRoPE's) or NULL */
    kg_cuda_rope_t *ropes; /* (n_ropes) the distinct RoPEs of the layers */
    int32_t n_ropes;
    uint16_t *gelu_table; /* (65536) fp16 GELU of every fp16 input (GeGLU models) */
    int32_t max_seq_len;  /* picks LongRoPE's factors, as the CPU backend does */
    int32_t kv_window;    /* kg_model_kv_window: blocks before it may be freed */
    uint8_t *kv;          /* per layer that keeps K/V: its K, then its V, each
                             (n_kv_blocks * block_size, n_head_kv * head_dim) of its own
                             shape (cuda_layer_t's kv_off, kv_plane, in bytes) in kv_type's
                             layout (kv_cache.cuh); MLA's latent rows alone (kv_caches 1,
                             f16) */
    kg_kv_type_t kv_type; /* --kv-type */
    int32_t kv_caches;    /* planes per layer: K and V (2), or MLA's latent rows alone (1) */
    int32_t n_kv_layers;  /* layers with K/V of their own in the pool */
    int32_t max_rot;      /* the largest RoPE's n_rot: rope_cs holds max_tokens * max_rot
                             floats per RoPE */

    /* activations, T = max_tokens rows; 16-bit ones sized for 4-byte elements
     * when any weight is F32 */
    float *x;       /* (T, n_embd) residual stream */
    float *qkv;     /* (T, n_q + 2 n_kv) */
    float *tmp;     /* (T, n_embd) projection output before the residual add */
    float *gu;      /* (T, 2 n_ff) */
    float *rope_cs; /* (n_ropes, T, n_rot) */
    float *split;   /* (ATT_PAIR_CAP) attention partials */
    float *logits;  /* (out_cap, n_vocab) one chunk of output rows */
    __half *q16;    /* (T, n_q) */
    void *xn;       /* (T, n_embd) normed input of a block, in the next GEMM's type */
    void *att;      /* (T, n_q) in wo's type */
    void *h;        /* (T, n_ff) in wdown's type */
    void *xo;       /* (T, n_embd) normed output rows, in the head's type */
    float *hid;     /* (T, n_embd) every row's final norm, F32, for steps that want hidden
                       states (decoders); gu's memory when that is large enough */

    /* mixture of experts (n_expert > 0), k = n_expert_used, R = the plan's
     * rows for T tokens (kg_cuda_moe_rows_cap) */
    kg_cuda_moe_router_t router;
    kg_cuda_moe_plan_t moe_plan; /* buffers for T tokens */
    float *moe_logits;           /* (T, n_expert) router logits */
    void *xe;                    /* (T, n_embd) normed input in the experts' gate/up type */
    float *moe_g, *moe_u;        /* (R, n_ff_exp) */
    void *moe_h;                 /* (R, n_ff_exp) in the down experts' type */
    float *moe_y;                /* (R, n_embd) */
    float *shexp;                /* (T, n_embd) the shared expert's output (NULL: none) */
    long long *moe_stats_h;      /* (4 + n_expert) pinned copy of moe_plan.stats */
    int64_t *moe_tokens;         /* (n_expert) rows each expert took */

    /* attention: fixed at the first step from the batch's context size */
    kg_cuda_attn_shape_t ash;
    int32_t max_ctx;          /* positions per sequence; 0 until the first step */
    kg_cuda_attn_plan_t plan; /* split_len, max_splits; rt of the current step */
    int32_t prefill_rt, prefill_qt;
    /* the current eager step's attention launches: tile and token ranges */
    int32_t *grp_tile0, *grp_ntiles, *grp_tok0, *grp_ntok; /* (max_tokens) */
    int32_t n_groups;

    /* the step's inputs */
    int32_t *h_in, *d_in; /* pinned / device: header, per-token arrays, table */
    size_t in_cap;        /* int32s */
    cudaEvent_t ev_in;    /* the last input copy has been read */
    /* host scratch for compacting block tables */
    int32_t *hash_seq, *hash_idx; /* (hash_cap) open addressing: seq -> distinct index */
    int32_t hash_cap;
    int32_t *dist_seq, *dist_max_pos, *dist_off, *dist_slot, *tok_dist; /* (max_tokens) */
    int32_t *dist_min_pos;                                              /* (max_tokens) */

    bool use_graphs;
    bucket_t buckets[MAX_BUCKETS];
    int32_t n_buckets;

    /* the last step's output rows: [head_row0, head_row0 + out_cap) are in
     * `logits` (-1: none) */
    int32_t last_n_outputs, head_row0;
    kg_cuda_sampler_t sampler;
    bool sampler_ready;
    kg_cuda_bias_t bias; /* logit_bias.cu: the requests' logit_bias before sampling */
    kg_cuda_mask_t mask; /* constrained decoding: token masks applied before sampling */

    kg_backend_fault_t fault;
    kg_backend_counters_t cnt; /* updated with __atomic builtins, read from any thread */

    size_t weights_size, kv_size, scratch_size;
    /* GEMM matrices of quantized types: kept as GGUF blocks (native_q: the
     * MMA mode and KGEN_CUDA_NATIVE_QUANT unset or 1) or expanded to BF16;
     * the types of each (bit t: kg_ggml_type_t t) and their device bytes,
     * for the startup log */
    bool native_q;
    uint64_t native_types, expanded_types;
    size_t native_bytes, expanded_bytes;
    cuda_lora_t *lora; /* LoRA adapters (lora.cu), NULL until one is added */
    cuda_rec_t *rec;   /* a hybrid's recurrent states (kg_backend_cuda_recurrent.cu), or NULL */
    cuda_mla_t *mla;   /* deepseek2's latent attention buffers (kg_backend_cuda_mla.cu), or NULL */
    cuda_g4_t *g4;     /* Gemma 4's weights and buffers (kg_backend_cuda_gemma4.cu), or NULL */
} cuda_ctx_t;

static inline int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : def;
}

static inline void count(int64_t *c) {
    __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
}

// ---- kg_backend_cuda.cu ----

/* Record what the current call failed on; returns st. */
kg_status_t cuda_fault(cuda_ctx_t *ctx,
                       kg_status_t st,
                       kg_fault_scope_t scope,
                       int32_t seq,
                       int32_t row,
                       const char *fmt,
                       ...) __attribute__((format(printf, 6, 7)));

/* The step's input buffers for table_cap block-table entries. */
kg_status_t cuda_alloc_inputs(cuda_ctx_t *ctx);

/* The graph bucket of a step of `rows` rows, or -1 when none holds it. */
int cuda_bucket_for(const cuda_ctx_t *ctx, int32_t rows);

// ---- kg_backend_cuda_weights.cu ----

/* KG_OK when the CUDA backend runs tensor t's type, else
 * KG_ERR_UNSUPPORTED with one line in errstr. */
kg_status_t cuda_check_type(const kg_gguf_tensor_t *t, char *errstr, size_t errstr_size);

/* Every weight to the device (ctx->layers and the head). */
kg_status_t cuda_upload_weights(cuda_ctx_t *ctx);
/** One log line on the quantized GEMM matrices: the types kept as GGUF
 * blocks and those expanded to BF16 (why, and their MiB). */
void cuda_log_weight_types(const cuda_ctx_t *ctx);

/* One device matrix from the row-concatenation of `parts` (same n_in), in
 * the type their GGUF types give (kg_cuda_weight_dtype; BF16 when they
 * differ); and a small F32 vector (t NULL leaves *out NULL). */
kg_status_t cuda_upload_mat(cuda_ctx_t *ctx,
                            stage_t *s,
                            const kg_gguf_tensor_t *const *parts,
                            int n_parts,
                            kg_cuda_mat_t *m);
/** cuda_upload_mat for a matrix only kg_cuda_gemm or a block-aware gather
 * reads: a native type keeps its GGUF blocks (qblocks.cuh). */
kg_status_t cuda_upload_gemm(cuda_ctx_t *ctx,
                             stage_t *s,
                             const kg_gguf_tensor_t *const *parts,
                             int n_parts,
                             kg_cuda_mat_t *m);
/** The experts' gate and up matrices, each the row-concatenation of its
 * n_parts (gate NULL: up alone), in one type (so one normed input feeds
 * both) and read by moe.cu only: native types keep their GGUF blocks. */
kg_status_t cuda_upload_gate_up(cuda_ctx_t *ctx,
                                stage_t *s,
                                const kg_gguf_tensor_t *const *gate,
                                const kg_gguf_tensor_t *const *up,
                                int n_parts,
                                kg_cuda_mat_t *g,
                                kg_cuda_mat_t *u);
kg_status_t cuda_upload_vec(cuda_ctx_t *ctx, const kg_gguf_tensor_t *t, float **out);

// ---- kg_backend_cuda_step.cu: the vtable's slots ----

kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits);
kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out);
kg_status_t cuda_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n);
void cuda_last_fault(const kg_backend_t *be, kg_backend_fault_t *out);
void cuda_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out);
void cuda_counters(const kg_backend_t *be, kg_backend_counters_t *out);

/* Mark the backend dead after a device failure in `what` (every later
 * call fails); returns KG_ERR_BACKEND. */
kg_status_t cuda_mark_dead(cuda_ctx_t *ctx, const char *what);

/* Copy the rows of `rows` ((n_tokens, n_embd) F32 on the device) that
 * batch->want_hidden marks into batch->hidden, in token order, and wait. */
kg_status_t cuda_copy_hidden(cuda_ctx_t *ctx, const kg_step_batch_t *batch, const float *rows);

// ---- kg_backend_cuda_bert.cu ----

/* What a bert model's steps need beyond the buffers, once they are
 * allocated: nomic-bert's RoPE angles (into rope_cs). */
kg_status_t cuda_bert_init(cuda_ctx_t *ctx);

/* A bert step (the forward slot's work for a bert model): whole inputs,
 * hidden rows out, no logits. */
kg_status_t cuda_bert_forward(cuda_ctx_t *ctx, const kg_step_batch_t *batch);

// ---- lora.cu: LoRA adapters ----

/* The vtable's lora_add / lora_remove (see kg_backend_lora_add). */
kg_status_t cuda_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size);
void cuda_lora_remove(kg_backend_t *be, int32_t id);

/* Every adapter and the plan's buffers (ctx->lora NULL: nothing). */
void cuda_lora_free(cuda_ctx_t *ctx);

/* Group the step's (token, adapter) entries by adapter and send the plan;
 * *used: the step uses an adapter (it then runs eagerly). KG_ERR_INVALID
 * with a KG_FAULT_SEQ fault for a slot naming an adapter not loaded;
 * KG_ERR_BACKEND for a device failure. */
kg_status_t cuda_lora_plan(cuda_ctx_t *ctx, const kg_step_batch_t *batch, bool *used);

/* out(token, col[i] .. col[i] + n_out[i]) (row stride `stride`) += each
 * adapter's delta of projection first + i (i < n <= 3) of layer il on x
 * (n_in wide, type xdt), over the rows the last plan gave each adapter.
 * Nothing when the step uses no adapter. */
kg_status_t cuda_lora_apply(cuda_ctx_t *ctx,
                            int32_t il,
                            kg_lora_proj_t first,
                            int n,
                            const void *x,
                            kg_cuda_dtype_t xdt,
                            int32_t n_in,
                            float *out,
                            int32_t stride,
                            const int32_t *col,
                            const int32_t *n_out);

// ---- kg_backend_cuda_recurrent.cu: a hybrid model's recurrent layers ----

/* The states of n_slots slots (params' n_seq_slots; more as steps name
 * them), n_snaps snapshots, and the layers' step buffers; nothing for a
 * model without recurrent layers. errstr on failure. */
kg_status_t
cuda_rec_init(cuda_ctx_t *ctx, int32_t n_slots, int32_t n_snaps, char *errstr, size_t errstr_size);
void cuda_rec_free(cuda_ctx_t *ctx);

/* Before a step is packed: each token must continue its slot's state
 * (position 0 starts it over), else KG_ERR_INVALID with a KG_FAULT_SEQ
 * fault for that slot; room for batch->n_slots states (growing them drops
 * the captured graphs, which hold the old buffer). KG_ERR_BACKEND: the
 * device failed. */
kg_status_t cuda_rec_begin(cuda_ctx_t *ctx, const kg_step_batch_t *batch);

/* After a step ran: each slot's state has reached its last token. */
void cuda_rec_end(cuda_ctx_t *ctx, const kg_step_batch_t *batch);

/* In a step (and a graph): zero the states of the tokens at position 0. */
kg_status_t cuda_rec_reset(cuda_ctx_t *ctx, int32_t rows);

/* Recurrent layer il on ctx->xn (in rin's type) into ctx->tmp (F32). */
kg_status_t cuda_rec_mixer(cuda_ctx_t *ctx, int32_t il, int32_t rows);

/* The vtable's state_copy and state_save (kg_backend_state_copy, _save,
 * _restore). */
kg_status_t cuda_state_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n);
kg_status_t cuda_state_save(kg_backend_t *be, int32_t slot, int32_t snap, bool restore);

/* Bytes of the states (or of the snapshots) on the device. */
size_t cuda_rec_size(const cuda_ctx_t *ctx, bool snapshots);

// ---- kg_backend_cuda_mla.cu: deepseek2's multi-head latent attention ----

/* KG_OK when the latent attention's shape fits mla.cu's kernels, else
 * KG_ERR_UNSUPPORTED with one line in errstr. */
kg_status_t cuda_mla_check(const kg_hparams_t *hp, char *errstr, size_t errstr_size);

/* Its step buffers, once the weights and the step's buffers are there. */
kg_status_t cuda_mla_init(cuda_ctx_t *ctx);

/* Its buffers and the layers' MLA weights (nothing for another model). */
void cuda_mla_free(cuda_ctx_t *ctx);

/* Layer il's latent attention on ctx->xn (in wqkv's type) into ctx->tmp
 * (F32), its latent rows stored in the pool. */
kg_status_t cuda_mla_attention(cuda_ctx_t *ctx, int32_t il, int32_t rows);

// ---- kg_backend_cuda_gemma4.cu: what Gemma 4 adds to a gemma3 layer ----

/* Its weights beside ctx->layers' (the per-layer inputs, each layer's
 * per-layer gate and output scale, the MoE layers' router and experts)
 * and their step buffers for max_tokens tokens, into ctx->g4. */
kg_status_t cuda_g4_upload(cuda_ctx_t *ctx, stage_t *s);
void cuda_g4_free(cuda_ctx_t *ctx);

/* In a step, after the embeddings: every token's per-layer inputs. */
kg_status_t cuda_g4_inputs(cuda_ctx_t *ctx, int32_t rows);

/* Layer il's MoE block, the dense MLP's output in tmp: the experts beside
 * it, both normed and summed into tmp. */
kg_status_t cuda_g4_moe(cuda_ctx_t *ctx, int32_t il, int32_t rows);

/* The end of layer il, its FFN's output in tmp: the residual join, the
 * per-layer input and the output scale, all into x (the next layer's
 * first norm adds nothing: block_out). */
kg_status_t cuda_g4_layer_end(cuda_ctx_t *ctx, int32_t il, int32_t rows);
