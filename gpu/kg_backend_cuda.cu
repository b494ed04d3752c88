/* kg_backend_cuda: the CUDA backend (vtable glue, weights, buffers, steps,
 * graphs, faults).
 *
 * DESIGN
 * Weights. Uploaded once at start. Per layer, Q|K|V are fused into one
 * (n_q + 2 n_kv, n_embd) matrix and gate|up into one (2 n_ff, n_embd)
 * matrix, so a step runs 4 GEMMs per layer. A matrix is stored BF16 unless
 * all its parts are F16 (kept F16) or F32 (kept F32: tiny test models and
 * exact parity with the CPU backend, which computes those in F32); Q8_0,
 * Q4_0 and K-quants are dequantized with kg_dequantize on the host and
 * converted to BF16. The activation entering a GEMM is written in the
 * weight's type by the kernel that produces it, as the CPU backend rounds
 * activations to the weight type. Norm weights are F32. A tied head reuses
 * the embedding matrix.
 *
 * KV pool. F16 in device memory, the CPU backend's layout: per layer K and
 * V of (n_kv_blocks * kv_block_size rows, n_head_kv * head_dim).
 *
 * Step. All buffers are allocated at start for max_batch_tokens tokens
 * (logits for at most out_cap rows at a time), the input buffer sized again
 * once at the first step, when the engine's block-table shape is known; a
 * step makes no allocation after that.
 * The host packs the step's tokens, positions, output rows, attention tiles
 * and the block tables of the step's sequences (compacted: each sequence's
 * blocks up to its last position) into one pinned buffer, sent with one
 * cudaMemcpyAsync; then on one stream: embedding gather and RoPE angles,
 * per layer add+RMSNorm, QKV GEMM, RoPE + KV store, paged attention, output
 * GEMM, add+RMSNorm, gate|up GEMM, SwiGLU, down GEMM; the final add+RMSNorm
 * of the rows that want logits, and the head GEMM over those rows, out_cap
 * rows at a time: a step with more output rows than the logits buffer
 * holds (--max-batch-size above KGEN_CUDA_MAX_OUTPUTS) runs the head and
 * the sampler chunk by chunk, so any batch size works. forward(logits !=
 * NULL) copies the logits to the host; forward(NULL) leaves them on the
 * device for sample(), which runs the device sampler (sample.cu) and
 * returns only the picks.
 *
 * Batch invariance. A job's logits do not depend on its batch mates: the
 * GEMMs (gemm.cu) and attention (attention.cu) compute every row with the
 * same reduction order whatever the row count, the bucket, the tile or the
 * split of other tokens; eager steps run exactly their rows, graphs a
 * padded bucket, and both give the same bits per row.
 *
 * Graphs. A decode-only step (every token wants logits) runs as a CUDA
 * graph of its batch-size bucket (1, 2, 4, 8, then multiples of 8 to 128,
 * of 16 to 512, of 64 to 1024): the step is padded to the bucket, kernels
 * read the real token count and positions from the uploaded header
 * (padding rows write no KV and are never read back), and the attention
 * cut depends on positions only, so one graph serves every later step of
 * that size whatever the sequence lengths. The first step of a bucket runs
 * eagerly with exactly the launches the graph will hold (so lazy module
 * loading and first launches happen outside capture), then the bucket is
 * captured. If capturing fails without poisoning the context, the bucket
 * runs eagerly from then on, with a warning and the graph_fallbacks
 * counter (kgen_backend_graph_fallbacks_total). The input copy stays
 * outside the graph (its size varies). KGEN_CUDA_GRAPHS=0 runs every step
 * eagerly.
 *
 * Faults. Every CUDA call is checked. A batch entry the backend cannot run
 * (a token id outside the vocabulary, a position past the context it was
 * set up for, a block outside its pool) fails the call with
 * KG_ERR_INVALID and a fault naming that sequence, so the engine ends that
 * request with an error and keeps the others; a malformed step as a whole
 * is KG_FAULT_STEP. Any device-side failure marks the backend dead: that
 * call and every later one return KG_ERR_BACKEND with KG_FAULT_DEVICE,
 * since a sticky CUDA error poisons the context and the KV pool may be
 * half-written (the worker stops and Kafka redelivers). */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "embed.cuh"
#include "geglu.cuh"
#include "gemm.cuh"
#include "kg_backend_cuda.h"
#include "kv_copy.cuh"
#include "logit_bias.cuh"
#include "logits.cuh"
#include "mask.cuh"
#include "moe.cuh"
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
    kg_cuda_mat_t wgu;           /* (2 n_ff, embd): gate rows, then up rows (dense layers) */
    kg_cuda_mat_t wdown;         /* (n_embd, n_ff) (dense layers) */
    /* what a family adds; NULL when it has none */
    float *bqkv;                           /* (n_q + 2 n_kv) Q|K|V biases */
    float *bo;                             /* (n_embd) attention output bias */
    float *q_norm, *k_norm;                /* (head_dim) per-head RMSNorm weights */
    float *attn_post_norm, *ffn_post_norm; /* (n_embd) */
    float *sinks;                          /* (n_head) attention sinks */
    int32_t rope;                          /* index into cuda_ctx_t.ropes */
    int32_t n_swa;                         /* window; 0: global */
    /* mixture of experts (moe: no wgu, wdown) */
    bool moe;
    kg_cuda_mat_t router;           /* (n_expert, n_embd) */
    float *router_b;                /* (n_expert) */
    kg_cuda_mat_t exp_gate, exp_up; /* (n_expert * n_ff_exp, n_embd), one type */
    kg_cuda_mat_t exp_down;         /* (n_expert * n_embd, n_ff_exp) */
    float *exp_gate_b, *exp_up_b;   /* (n_expert, n_ff_exp) */
    float *exp_down_b;              /* (n_expert, n_embd) */
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

typedef struct cuda_ctx {
    const kg_model_t *model;
    kg_hparams_t hp;
    int device, n_sm;
    bool dead;
    cudaStream_t stream;
    kg_cuda_blas_t blas;
    void *blas_ws;
    int32_t n_kv_blocks, block_size, max_tokens, out_cap, table_cap;

    cuda_layer_t *layers;  /* (n_layer) */
    kg_cuda_mat_t emb;     /* (n_vocab, n_embd) */
    kg_cuda_mat_t head;    /* (n_vocab, n_embd); data == emb.data when tied */
    float *out_norm;       /* (n_embd) */
    float *out_b;          /* (n_vocab) output bias or NULL */
    float *rope_freqs;     /* (n_rot / 2) frequency factors (rope_freqs or LongRoPE's) or NULL */
    kg_cuda_rope_t *ropes; /* (n_ropes) the distinct RoPEs of the layers */
    int32_t n_ropes;
    uint16_t *gelu_table;  /* (65536) fp16 GELU of every fp16 input (GeGLU models) */
    int32_t max_seq_len;   /* picks LongRoPE's factors, as the CPU backend does */
    int32_t kv_window;     /* kg_model_kv_window: blocks before it may be freed */
    __half *kv;            /* (n_layer, 2, n_kv_blocks * block_size, n_kv) */
    size_t kv_layer_elems; /* elements of one layer's K (or V) */

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

    /* mixture of experts (n_expert > 0), k = n_expert_used, R = the plan's
     * rows for T tokens (kg_cuda_moe_rows_cap) */
    kg_cuda_moe_router_t router;
    kg_cuda_moe_plan_t moe_plan; /* buffers for T tokens */
    float *moe_logits;           /* (T, n_expert) router logits */
    void *xe;                    /* (T, n_embd) normed input in the experts' gate/up type */
    float *moe_g, *moe_u;        /* (R, n_ff_exp) */
    void *moe_h;                 /* (R, n_ff_exp) in the down experts' type */
    float *moe_y;                /* (R, n_embd) */
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
} cuda_ctx_t;

static void cuda_free(kg_backend_t *be);
static kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits);
static void cuda_memory(const kg_backend_t *be, kg_backend_memory_t *out);
static kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out);

static const struct kg_backend_i cuda_iface = {
    /* .name    = */ "cuda",
    /* .free    = */ cuda_free,
    /* .forward = */ cuda_forward,
    /* .memory  = */ cuda_memory,
};

bool kg_backend_is_cuda(const kg_backend_t *be) {
    return be && be->iface.free == cuda_free;
}

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : def;
}

static void count(int64_t *c) {
    __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
}

/* Record what the current call failed on; returns st. */
static kg_status_t fault(cuda_ctx_t *ctx,
                         kg_status_t st,
                         kg_fault_scope_t scope,
                         int32_t seq,
                         int32_t row,
                         const char *fmt,
                         ...) __attribute__((format(printf, 6, 7)));

static kg_status_t fault(cuda_ctx_t *ctx,
                         kg_status_t st,
                         kg_fault_scope_t scope,
                         int32_t seq,
                         int32_t row,
                         const char *fmt,
                         ...) {
    kg_backend_fault_t *f = &ctx->fault;
    f->scope = scope;
    f->seq = seq;
    f->row = row;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof(f->message), fmt, ap);
    va_end(ap);
    KG_LOG_ERROR("cuda", "%s", f->message);
    return st;
}

// ---- weights ----

kg_cuda_dtype_t kg_cuda_weight_dtype(kg_ggml_type_t type) {
    switch (type) {
    case KG_GGML_TYPE_F32:
        return KG_CUDA_F32;
    case KG_GGML_TYPE_F16:
        return KG_CUDA_F16;
    default:
        return KG_CUDA_BF16;
    }
}

void kg_cuda_weight_convert(
    kg_ggml_type_t type, const void *src, int64_t n, kg_cuda_dtype_t dt, void *dst, float *f32) {
    const bool same = (dt == KG_CUDA_F32 && type == KG_GGML_TYPE_F32) ||
                      (dt == KG_CUDA_F16 && type == KG_GGML_TYPE_F16) ||
                      (dt == KG_CUDA_BF16 && type == KG_GGML_TYPE_BF16);
    if (same) {
        memcpy(dst, src, (size_t)n * kg_cuda_dtype_size(dt));
        return;
    }
    kg_dequantize(type, src, f32, n);
    if (dt == KG_CUDA_F32) {
        memcpy(dst, f32, (size_t)n * 4);
        return;
    }
    uint16_t *o = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) {
        o[i] = dt == KG_CUDA_F16 ? kg_fp32_to_fp16(f32[i]) : kg_fp32_to_bf16(f32[i]);
    }
}

/* One matrix from parts of one type keeps that type's kg_cuda_weight_dtype;
 * parts of different types meet in BF16. */
static kg_cuda_dtype_t pick_dtype(const kg_gguf_tensor_t *const *parts, int n) {
    for (int i = 1; i < n; i++) {
        if (parts[i]->type != parts[0]->type) {
            return KG_CUDA_BF16;
        }
    }
    return kg_cuda_weight_dtype(parts[0]->type);
}

/* Staging for uploads: two pinned buffers so the conversion of one chunk
 * overlaps the copy of the previous one. */
typedef struct stage {
    void *buf[2];
    cudaEvent_t ev[2];
    float *f32; /* host scratch for dequantized rows */
    int cur;
} stage_t;

static kg_status_t stage_init(stage_t *s) {
    memset(s, 0, sizeof(*s));
    KG_CUDA_CHECK(cudaMallocHost(&s->buf[0], STAGE_SIZE));
    KG_CUDA_CHECK(cudaMallocHost(&s->buf[1], STAGE_SIZE));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev[0], cudaEventDisableTiming));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev[1], cudaEventDisableTiming));
    s->f32 = (float *)malloc(STAGE_SIZE);
    if (!s->f32) {
        KG_LOG_ERROR("cuda", "out of host memory for the upload buffer");
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

static void stage_clear(stage_t *s) {
    for (int i = 0; i < 2; i++) {
        if (s->ev[i]) {
            cudaEventSynchronize(s->ev[i]);
            cudaEventDestroy(s->ev[i]);
        }
        cudaFreeHost(s->buf[i]);
    }
    free(s->f32);
}

/* Rows of a weight: ne[1] * ne[2] * ... (an expert tensor's matrices are
 * stacked: expert e's rows follow expert e - 1's). */
static int64_t tensor_rows(const kg_gguf_tensor_t *t) {
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) {
        rows *= t->ne[d];
    }
    return rows;
}

/* Whether the upload can convert t's type: F32 and F16 as they are, every
 * other type kg_dequantize reads (the CPU backend's dequantizer, so every
 * type kgen loads: kg_gguf refuses the others) dequantized into BF16. A
 * type that kg_quant does not describe is refused, the message naming the
 * tensor and the type. */
static kg_status_t check_type(const kg_gguf_tensor_t *t, char *errstr, size_t errstr_size) {
    if (kg_type_block_size(t->type) != 0 && kg_type_block_elems(t->type) > 0 &&
        t->ne[0] % kg_type_block_elems(t->type) == 0) {
        return KG_OK;
    }
    const char *name = kg_ggml_type_name(t->type);
    snprintf(errstr, errstr_size,
             "cuda backend: tensor '%.*s' has type %s (%d), which the CUDA backend cannot "
             "convert (it runs the types kgen's dequantizer reads, converted to BF16 at upload)",
             (int)t->name.len, t->name.data, name && name[0] != '?' ? name : "unknown",
             (int)t->type);
    KG_LOG_ERROR("cuda", "%s", errstr);
    return KG_ERR_UNSUPPORTED;
}

/* Copy `n_rows` rows of tensor t (starting at row r0) into device memory
 * `dst` as type dt. */
static kg_status_t upload_rows(cuda_ctx_t *ctx,
                               stage_t *s,
                               const kg_gguf_tensor_t *t,
                               int64_t r0,
                               int64_t n_rows,
                               kg_cuda_dtype_t dt,
                               char *dst) {
    const int64_t n_in = t->ne[0];
    const size_t es = kg_cuda_dtype_size(dt);
    const int64_t per_chunk = (int64_t)(STAGE_SIZE / ((size_t)n_in * 4)) > 0
                                  ? (int64_t)(STAGE_SIZE / ((size_t)n_in * 4))
                                  : 1;
    const size_t src_row = kg_type_row_size(t->type, n_in);
    for (int64_t r = 0; r < n_rows; r += per_chunk) {
        const int64_t nr = n_rows - r < per_chunk ? n_rows - r : per_chunk;
        const int64_t n = nr * n_in;
        const char *src = (const char *)t->data + (size_t)(r0 + r) * src_row;
        void *buf = s->buf[s->cur];
        KG_CUDA_CHECK(cudaEventSynchronize(s->ev[s->cur])); /* its previous copy is done */
        kg_cuda_weight_convert(t->type, src, n, dt, buf, s->f32);
        KG_CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)r * (size_t)n_in * es, buf, (size_t)n * es,
                                      cudaMemcpyHostToDevice, ctx->stream));
        KG_CUDA_CHECK(cudaEventRecord(s->ev[s->cur], ctx->stream));
        s->cur ^= 1;
    }
    return KG_OK;
}

/* One device matrix of type dt from the row-concatenation of `parts`
 * (same n_in). */
static kg_status_t upload_mat_as(cuda_ctx_t *ctx,
                                 stage_t *s,
                                 const kg_gguf_tensor_t *const *parts,
                                 int n_parts,
                                 kg_cuda_dtype_t dt,
                                 kg_cuda_mat_t *m) {
    m->dt = dt;
    m->n_in = (int32_t)parts[0]->ne[0];
    m->n_out = 0;
    for (int i = 0; i < n_parts; i++) {
        m->n_out += (int32_t)tensor_rows(parts[i]);
    }
    const size_t es = kg_cuda_dtype_size(m->dt);
    const size_t size = (size_t)m->n_out * (size_t)m->n_in * es;
    KG_CUDA_CHECK(cudaMalloc(&m->data, size));
    ctx->weights_size += size;
    int64_t row = 0;
    for (int i = 0; i < n_parts; i++) {
        const int64_t rows = tensor_rows(parts[i]);
        KG_TRY(upload_rows(ctx, s, parts[i], 0, rows, m->dt,
                           (char *)m->data + (size_t)row * (size_t)m->n_in * es));
        row += rows;
    }
    return KG_OK;
}

/* One device matrix from the row-concatenation of `parts`, in the type
 * pick_dtype gives them. */
static kg_status_t upload_mat(cuda_ctx_t *ctx,
                              stage_t *s,
                              const kg_gguf_tensor_t *const *parts,
                              int n_parts,
                              kg_cuda_mat_t *m) {
    return upload_mat_as(ctx, s, parts, n_parts, pick_dtype(parts, n_parts), m);
}

/* A small F32 vector from the concatenation of `parts` (norm weights, rope
 * factors, biases; every element of a part, whatever its shape):
 * dequantize and copy. */
static kg_status_t
upload_vec_parts(cuda_ctx_t *ctx, const kg_gguf_tensor_t *const *parts, int n_parts, float **out) {
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) {
        n += parts[i]->ne[0] * tensor_rows(parts[i]);
    }
    float *h = (float *)malloc((size_t)n * sizeof(float));
    if (!h) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int64_t i = 0, off = 0; i < n_parts; i++) {
        const int64_t ni = parts[i]->ne[0] * tensor_rows(parts[i]);
        kg_dequantize(parts[i]->type, parts[i]->data, h + off, ni);
        off += ni;
    }
    cudaError_t err = cudaMalloc((void **)out, (size_t)n * sizeof(float));
    if (err == cudaSuccess) {
        err = cudaMemcpy(*out, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(h);
    KG_CUDA_CHECK(err);
    ctx->weights_size += (size_t)n * sizeof(float);
    return KG_OK;
}

/* upload_vec_parts of one tensor; t NULL leaves *out NULL. */
static kg_status_t upload_vec(cuda_ctx_t *ctx, const kg_gguf_tensor_t *t, float **out) {
    return t ? upload_vec_parts(ctx, &t, 1, out) : KG_OK;
}

/* The index of the RoPE (base, scale) in ctx->ropes, added when new (the
 * CPU backend's add_rope). */
static kg_status_t add_rope(cuda_ctx_t *ctx, float base, float scale, int32_t *index) {
    const kg_hparams_t *hp = &ctx->hp;
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        if (ctx->ropes[r].base == base && ctx->ropes[r].freq_scale == scale) {
            *index = r;
            return KG_OK;
        }
    }
    kg_cuda_rope_t *grown =
        (kg_cuda_rope_t *)realloc(ctx->ropes, (size_t)(ctx->n_ropes + 1) * sizeof(*grown));
    if (!grown) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    ctx->ropes = grown;
    kg_cuda_rope_t *r = &ctx->ropes[ctx->n_ropes];
    r->n_rot = hp->n_rot;
    r->base = base;
    r->freq_scale = scale;
    r->ext_factor = hp->yarn_ext_factor;
    r->attn_factor = hp->yarn_attn_factor;
    kg_rope_yarn_corr_dims(hp->n_rot, hp->n_ctx_orig, base, hp->yarn_beta_fast, hp->yarn_beta_slow,
                           r->corr_dims);
    *index = ctx->n_ropes++;
    return KG_OK;
}

/* The router, the experts' stacked matrices (gate and up in one type, so
 * one normed input feeds both) and the expert biases of one layer. */
static kg_status_t
upload_experts(cuda_ctx_t *ctx, stage_t *s, const kg_layer_weights_t *src, cuda_layer_t *L) {
    const kg_gguf_tensor_t *gu[2] = {src->gate_exps, src->up_exps};
    const kg_cuda_dtype_t dt_gu = pick_dtype(gu, 2);
    L->moe = true;
    KG_TRY(upload_mat(ctx, s, &src->ffn_gate_inp, 1, &L->router));
    KG_TRY(upload_mat_as(ctx, s, &src->gate_exps, 1, dt_gu, &L->exp_gate));
    KG_TRY(upload_mat_as(ctx, s, &src->up_exps, 1, dt_gu, &L->exp_up));
    KG_TRY(upload_mat(ctx, s, &src->down_exps, 1, &L->exp_down));
    KG_TRY(upload_vec(ctx, src->ffn_gate_inp_b, &L->router_b));
    KG_TRY(upload_vec(ctx, src->gate_exps_b, &L->exp_gate_b));
    KG_TRY(upload_vec(ctx, src->up_exps_b, &L->exp_up_b));
    KG_TRY(upload_vec(ctx, src->down_exps_b, &L->exp_down_b));
    return KG_OK;
}

/* Everything of layer il. */
static kg_status_t upload_layer(cuda_ctx_t *ctx, stage_t *s, int32_t il) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    cuda_layer_t *L = &ctx->layers[il];
    const kg_gguf_tensor_t *qkv[3] = {src->wq, src->wk, src->wv};
    KG_TRY(upload_vec(ctx, src->attn_norm, &L->attn_norm));
    KG_TRY(upload_vec(ctx, src->ffn_norm, &L->ffn_norm));
    KG_TRY(upload_mat(ctx, s, qkv, 3, &L->wqkv));
    KG_TRY(upload_mat(ctx, s, &src->wo, 1, &L->wo));
    if (src->ffn_gate_inp) {
        KG_TRY(upload_experts(ctx, s, src, L));
    } else {
        const kg_gguf_tensor_t *gu[2] = {src->w_gate, src->w_up};
        KG_TRY(upload_mat(ctx, s, gu, 2, &L->wgu));
        KG_TRY(upload_mat(ctx, s, &src->w_down, 1, &L->wdown));
    }
    if (src->bq) { /* the model has all three or none */
        const kg_gguf_tensor_t *b[3] = {src->bq, src->bk, src->bv};
        KG_TRY(upload_vec_parts(ctx, b, 3, &L->bqkv));
    }
    KG_TRY(upload_vec(ctx, src->bo, &L->bo));
    KG_TRY(upload_vec(ctx, src->q_norm, &L->q_norm));
    KG_TRY(upload_vec(ctx, src->k_norm, &L->k_norm));
    KG_TRY(upload_vec(ctx, src->attn_post_norm, &L->attn_post_norm));
    KG_TRY(upload_vec(ctx, src->ffn_post_norm, &L->ffn_post_norm));
    KG_TRY(upload_vec(ctx, src->attn_sinks, &L->sinks));
    L->n_swa = src->n_swa > 0 ? src->n_swa : 0;
    return add_rope(ctx, src->rope_base, src->rope_scale, &L->rope);
}

static kg_status_t upload_weights(cuda_ctx_t *ctx) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    stage_t s;
    kg_status_t st = stage_init(&s);
    for (int32_t il = 0; st == KG_OK && il < hp->n_layer; il++) {
        st = upload_layer(ctx, &s, il);
    }
    if (st == KG_OK) {
        st = upload_vec(ctx, model->output_norm, &ctx->out_norm);
    }
    if (st == KG_OK) {
        st = upload_vec(ctx, model->output_b, &ctx->out_b);
    }
    if (st == KG_OK) {
        st = upload_mat(ctx, &s, &model->tok_embd, 1, &ctx->emb);
    }
    if (st == KG_OK) {
        if (model->output == model->tok_embd) {
            ctx->head = ctx->emb;
        } else {
            st = upload_mat(ctx, &s, &model->output, 1, &ctx->head);
        }
    }
    if (st == KG_OK) { /* rope_freqs, or LongRoPE's factors for this context */
        st = upload_vec(ctx, kg_model_rope_factors(model, ctx->max_seq_len), &ctx->rope_freqs);
    }
    if (st == KG_OK && hp->ffn_act == KG_FFN_GELU) {
        uint16_t *table = (uint16_t *)malloc(65536 * sizeof(uint16_t));
        cudaError_t err = cudaErrorMemoryAllocation;
        if (table) {
            kg_cuda_gelu_table_fill(table);
            err = cudaMalloc((void **)&ctx->gelu_table, 65536 * sizeof(uint16_t));
            if (err == cudaSuccess) {
                err = cudaMemcpy(ctx->gelu_table, table, 65536 * sizeof(uint16_t),
                                 cudaMemcpyHostToDevice);
            }
            free(table);
        }
        if (err != cudaSuccess) {
            KG_LOG_ERROR("cuda", "the GELU table: %s", cudaGetErrorName(err));
            st = KG_ERR_BACKEND;
        }
    }
    stage_clear(&s);
    if (st == KG_OK) {
        KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    }
    return st;
}

// ---- buffers ----

static kg_status_t dev_alloc(cuda_ctx_t *ctx, void **p, size_t size) {
    KG_CUDA_CHECK(cudaMalloc(p, size ? size : 1));
    KG_CUDA_CHECK(cudaMemset(*p, 0, size ? size : 1));
    ctx->scratch_size += size;
    return KG_OK;
}

/* Graph buckets: 1, 2, 4, 8, multiples of 8 to 128, of 16 to 512, of 64 to
 * GRAPH_MAX_ROWS, never above max_tokens (the last one is max_tokens
 * itself when that falls between two). Finer than powers of two so a
 * step's padding stays small (at most 7, 15 or 63 rows). */
static void make_buckets(cuda_ctx_t *ctx) {
    const int32_t top = ctx->max_tokens < GRAPH_MAX_ROWS ? ctx->max_tokens : GRAPH_MAX_ROWS;
    int32_t b = 1;
    ctx->n_buckets = 0;
    while (b <= top && ctx->n_buckets < MAX_BUCKETS) {
        ctx->buckets[ctx->n_buckets++].rows = b;
        b = b < 8 ? 2 * b : b < 128 ? b + 8 : b < 512 ? b + 16 : b + 64;
    }
    if (ctx->n_buckets > 0 && ctx->buckets[ctx->n_buckets - 1].rows < top &&
        ctx->n_buckets < MAX_BUCKETS) {
        ctx->buckets[ctx->n_buckets++].rows = top;
    }
}

static int bucket_for(const cuda_ctx_t *ctx, int32_t rows) {
    for (int i = 0; i < ctx->n_buckets; i++) {
        if (ctx->buckets[i].rows >= rows) {
            return i;
        }
    }
    return -1;
}

/* The step's input buffers for table_cap block-table entries. */
static kg_status_t alloc_inputs(cuda_ctx_t *ctx) {
    cudaFreeHost(ctx->h_in);
    cudaFree(ctx->d_in);
    ctx->h_in = NULL;
    ctx->d_in = NULL;
    ctx->scratch_size -= ctx->in_cap * sizeof(int32_t);
    ctx->in_cap = 4 + KG_CUDA_INPUT_ARRAYS * (size_t)ctx->max_tokens + (size_t)ctx->table_cap;
    ctx->scratch_size += ctx->in_cap * sizeof(int32_t);
    KG_CUDA_CHECK(cudaMallocHost((void **)&ctx->h_in, ctx->in_cap * sizeof(int32_t)));
    KG_CUDA_CHECK(cudaMalloc((void **)&ctx->d_in, ctx->in_cap * sizeof(int32_t)));
    KG_CUDA_CHECK(cudaMemset(ctx->d_in, 0, ctx->in_cap * sizeof(int32_t)));
    return KG_OK;
}

/* The buffers of the expert layers: the plan for max_tokens tokens, the
 * router's logits, the experts' inputs and outputs, the load counters. */
static kg_status_t alloc_moe(cuda_ctx_t *ctx, size_t es) {
    const kg_hparams_t *hp = &ctx->hp;
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd, FX = (size_t)hp->n_ff_exp;
    const size_t X = (size_t)hp->n_expert, k = (size_t)hp->n_expert_used;
    kg_cuda_moe_plan_t *p = &ctx->moe_plan;
    ctx->router.n_expert = hp->n_expert;
    ctx->router.k = hp->n_expert_used;
    ctx->router.top_k_then_softmax = hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT;
    ctx->router.norm_w = hp->moe_norm_w;
    ctx->router.w_scale = hp->moe_w_scale;
    p->rows_cap = kg_cuda_moe_rows_cap(ctx->max_tokens, hp->n_expert_used, hp->n_expert);
    const size_t R = (size_t)p->rows_cap;
    KG_TRY(dev_alloc(ctx, (void **)&p->sel, T * k * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->w, T * k * sizeof(float)));
    KG_TRY(dev_alloc(ctx, (void **)&p->slot, T * k * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->offset, (X + 1) * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->row_tok, R * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->tile_expert, R / KG_CUDA_MOE_TILE * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->stats, (4 + X) * sizeof(long long)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_logits, T * X * sizeof(float)));
    KG_TRY(dev_alloc(ctx, &ctx->xe, T * E * es));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_g, R * FX * sizeof(float)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_u, R * FX * sizeof(float)));
    KG_TRY(dev_alloc(ctx, &ctx->moe_h, R * FX * es));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_y, R * E * sizeof(float)));
    KG_CUDA_CHECK(cudaMallocHost((void **)&ctx->moe_stats_h, (4 + X) * sizeof(long long)));
    ctx->moe_tokens = (int64_t *)calloc(X, sizeof(int64_t));
    if (!ctx->moe_tokens) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

static kg_status_t alloc_buffers(cuda_ctx_t *ctx) {
    const kg_hparams_t *hp = &ctx->hp;
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd;
    const size_t n_q = (size_t)hp->n_head * hp->head_dim,
                 n_kv = (size_t)hp->n_head_kv * hp->head_dim;
    /* 16-bit activations unless some GEMM reads F32; the dense FFN's width
     * (0 when every layer has experts) */
    size_t es = 2, F = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        const kg_cuda_mat_t *mats[] = {&L->wqkv,   &L->wo,       &L->wgu,    &L->wdown,
                                       &L->router, &L->exp_gate, &L->exp_up, &L->exp_down};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (mats[i]->data && mats[i]->dt == KG_CUDA_F32) {
                es = 4;
            }
        }
        F = L->moe ? F : (size_t)hp->n_ff;
    }
    const size_t es_head = kg_cuda_dtype_size(ctx->head.dt);

    /* KV pool */
    ctx->kv_layer_elems = (size_t)ctx->n_kv_blocks * (size_t)ctx->block_size * n_kv;
    ctx->kv_size = 2 * ctx->kv_layer_elems * (size_t)hp->n_layer * sizeof(__half);
    KG_CUDA_CHECK(cudaMalloc((void **)&ctx->kv, ctx->kv_size));
    KG_CUDA_CHECK(cudaMemset(ctx->kv, 0, ctx->kv_size));

    KG_TRY(dev_alloc(ctx, (void **)&ctx->x, T * E * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->qkv, T * (n_q + 2 * n_kv) * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->tmp, T * E * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->gu, T * 2 * F * 4));
    KG_TRY(
        dev_alloc(ctx, (void **)&ctx->rope_cs, (size_t)ctx->n_ropes * T * (size_t)hp->n_rot * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->split,
                     kg_cuda_attention_scratch_size(&ctx->ash, ATT_PAIR_CAP)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->logits, (size_t)ctx->out_cap * (size_t)hp->n_vocab * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->q16, T * n_q * 2));
    KG_TRY(dev_alloc(ctx, &ctx->xn, T * E * es));
    KG_TRY(dev_alloc(ctx, &ctx->att, T * n_q * es));
    KG_TRY(dev_alloc(ctx, &ctx->h, T * F * es));
    KG_TRY(dev_alloc(ctx, &ctx->xo, T * E * es_head));
    if (hp->n_expert > 0) {
        KG_TRY(alloc_moe(ctx, es));
    }

    /* step inputs: header (4), the per-token arrays (T each), table */
    KG_TRY(alloc_inputs(ctx));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->ev_in, cudaEventDisableTiming));

    ctx->hash_cap = 1;
    while (ctx->hash_cap < 2 * ctx->max_tokens) {
        ctx->hash_cap <<= 1;
    }
    ctx->hash_seq = (int32_t *)malloc((size_t)ctx->hash_cap * sizeof(int32_t));
    ctx->hash_idx = (int32_t *)malloc((size_t)ctx->hash_cap * sizeof(int32_t));
    int32_t **host[] = {&ctx->dist_seq, &ctx->dist_max_pos, &ctx->dist_off,   &ctx->dist_slot,
                        &ctx->tok_dist, &ctx->grp_tile0,    &ctx->grp_ntiles, &ctx->grp_tok0,
                        &ctx->grp_ntok, &ctx->dist_min_pos};
    bool ok = ctx->hash_seq && ctx->hash_idx;
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) {
        *host[i] = (int32_t *)malloc(T * sizeof(int32_t));
        ok = ok && *host[i];
    }
    if (!ok) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t i = 0; i < ctx->hash_cap; i++) {
        ctx->hash_seq[i] = -1;
    }

    KG_TRY(kg_cuda_sampler_init(&ctx->sampler, hp->n_vocab, ctx->out_cap));
    ctx->sampler_ready = true;
    KG_TRY(kg_cuda_mask_init(&ctx->mask, hp->n_vocab, ctx->out_cap));
    ctx->scratch_size += kg_cuda_mask_device_size(&ctx->mask);
    ctx->scratch_size += kg_cuda_sampler_device_size(&ctx->sampler);
    KG_TRY(kg_cuda_bias_init(&ctx->bias, ctx->out_cap));
    ctx->scratch_size += kg_cuda_bias_device_size(&ctx->bias);
    return KG_OK;
}

// ---- the step ----

static int32_t hash_slot(const cuda_ctx_t *ctx, int32_t seq) {
    uint32_t h = (uint32_t)seq * 2654435761u;
    int32_t i = (int32_t)(h & (uint32_t)(ctx->hash_cap - 1));
    while (ctx->hash_seq[i] != -1 && ctx->hash_seq[i] != seq) {
        i = (i + 1) & (ctx->hash_cap - 1);
    }
    return i;
}

/* The attention cut, fixed at the first step: the context size is the
 * engine's (max_blocks_per_seq blocks), so every later step splits
 * positions the same way (batch invariance, and valid graphs). */
static kg_status_t fix_attention(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    int64_t ctx_len = (int64_t)batch->max_blocks_per_seq * ctx->block_size;
    ctx_len = ctx_len > 0 ? ctx_len : DEFAULT_MAX_CTX;
    ctx_len = ctx_len < (int64_t)ctx->n_kv_blocks * ctx->block_size
                  ? ctx_len
                  : (int64_t)ctx->n_kv_blocks * ctx->block_size;
    ctx->max_ctx = (int32_t)ctx_len;
    ctx->plan.split_len = kg_cuda_attention_split_len(ctx->max_ctx);
    /* KGEN_CUDA_ATTN_SPLIT: positions per split (a multiple of 32; fewer
     * positions, more parallel blocks, more partials to merge) */
    const int32_t forced = (int32_t)env_int("KGEN_CUDA_ATTN_SPLIT", 0) & ~31;
    if (forced > 0 && (int64_t)forced * (ATT_PAIR_CAP / 64) >= ctx_len) {
        ctx->plan.split_len = forced;
    }
    ctx->plan.max_splits = (ctx->max_ctx + ctx->plan.split_len - 1) / ctx->plan.split_len;
    KG_LOG_DEBUG("cuda", "attention context=%d split_len=%d max_splits=%d", ctx->max_ctx,
                 ctx->plan.split_len, ctx->plan.max_splits);
    /* A step's compacted block tables hold at most min(tokens, slots)
     * sequences' tables of max_blocks_per_seq entries (shared prefix blocks
     * appear in every table that holds them): size the inputs for that now
     * that the engine's shape is known, once, before any graph holds them. */
    const int64_t seqs = batch->n_slots < ctx->max_tokens ? batch->n_slots : ctx->max_tokens;
    const int64_t need = seqs * (int64_t)batch->max_blocks_per_seq;
    if (need > ctx->table_cap && need <= (1 << 28)) {
        ctx->table_cap = (int32_t)need;
        KG_TRY(alloc_inputs(ctx));
    }
    return KG_OK;
}

/* Check the batch and pack it for `cap` slots into h_in; *n_ints gets the
 * size to copy. single: one attention tile per token (graph steps), else
 * runs of a sequence's consecutive tokens share a tile, and the tiles are
 * cut into launch groups whose partial results fit the scratch.
 * KG_ERR_INVALID with the fault recorded: KG_FAULT_SEQ for an entry of one
 * sequence the backend cannot run, KG_FAULT_STEP for a malformed step. */
static kg_status_t pack_inputs(
    cuda_ctx_t *ctx, const kg_step_batch_t *batch, int32_t cap, bool single, size_t *n_ints) {
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t T = batch->n_tokens, bs = ctx->block_size;
    int32_t *hdr = ctx->h_in;
    int32_t *token = hdr + 4, *pos = token + cap, *tbl_off = pos + cap, *out_row = tbl_off + cap;
    int32_t *tile_tok0 = out_row + cap, *tile_n = tile_tok0 + cap, *table = tile_n + cap;
    kg_status_t st = KG_OK;
    int32_t n_dist = 0, n_out = 0;
    bool multi = false;

    for (int32_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], p = batch->pos[t], seq = batch->seq[t];
        if (seq < 0 || seq >= batch->n_slots) {
            st = fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                       "bad batch entry %d: slot %d of %d", t, seq, batch->n_slots);
            goto out;
        }
        if (tok < 0 || tok >= hp->n_vocab) {
            st = fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                       "slot %d: token id %d outside the model's vocabulary of %d", seq, tok,
                       hp->n_vocab);
            goto out;
        }
        if (p < 0 || p >= ctx->max_ctx || p / bs >= batch->max_blocks_per_seq) {
            st = fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                       "slot %d: position %d outside the context of %d the backend was set up for",
                       seq, p, ctx->max_ctx);
            goto out;
        }
        token[t] = tok;
        pos[t] = p;
        if (batch->want_logits[t]) {
            if (n_out < cap) {
                out_row[n_out] = t;
            }
            n_out++;
        }
        const int32_t slot = hash_slot(ctx, seq);
        if (ctx->hash_seq[slot] == -1) {
            ctx->hash_seq[slot] = seq;
            ctx->hash_idx[slot] = n_dist;
            ctx->dist_seq[n_dist] = seq;
            ctx->dist_max_pos[n_dist] = p;
            ctx->dist_min_pos[n_dist] = p;
            ctx->dist_slot[n_dist] = slot;
            n_dist++;
        }
        const int32_t d = ctx->hash_idx[slot];
        ctx->dist_max_pos[d] = p > ctx->dist_max_pos[d] ? p : ctx->dist_max_pos[d];
        ctx->dist_min_pos[d] = p < ctx->dist_min_pos[d] ? p : ctx->dist_min_pos[d];
        ctx->tok_dist[t] = d;
        multi = multi || (t > 0 && batch->seq[t - 1] == seq && batch->pos[t - 1] + 1 == p);
    }
    if (n_out != batch->n_outputs) {
        st = fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                   "batch says %d outputs, want_logits has %d", batch->n_outputs, n_out);
        goto out;
    }
    {
        int64_t n_table = 0;
        for (int32_t d = 0; d < n_dist; d++) {
            ctx->dist_off[d] = (int32_t)n_table;
            n_table += ctx->dist_max_pos[d] / bs + 1;
        }
        if (n_table > ctx->table_cap) {
            st = fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                       "step needs %lld block-table entries, capacity %d", (long long)n_table,
                       ctx->table_cap);
            goto out;
        }
        for (int32_t d = 0; d < n_dist; d++) {
            const int32_t *src =
                batch->block_table + (int64_t)ctx->dist_seq[d] * batch->max_blocks_per_seq;
            const int32_t n_blk = ctx->dist_max_pos[d] / bs + 1;
            /* blocks wholly before the window of the sequence's first token
             * here (every layer windowed) are never read: the engine may
             * have freed them (-1); they become block 0 */
            const int32_t w = ctx->kv_window, p_min = ctx->dist_min_pos[d];
            const int32_t first = w > 0 && p_min + 1 > w ? (p_min + 1 - w) / bs : 0;
            for (int32_t b = 0; b < n_blk; b++) {
                if (b < first) {
                    table[ctx->dist_off[d] + b] =
                        src[b] >= 0 && src[b] < ctx->n_kv_blocks ? src[b] : 0;
                    continue;
                }
                if (src[b] < 0 || src[b] >= ctx->n_kv_blocks) {
                    st = fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, ctx->dist_seq[d], -1,
                               "slot %d: block %d is %d, outside the pool of %d blocks",
                               ctx->dist_seq[d], b, src[b], ctx->n_kv_blocks);
                    goto out;
                }
                table[ctx->dist_off[d] + b] = src[b];
            }
        }
        for (int32_t t = 0; t < T; t++) {
            tbl_off[t] = ctx->dist_off[ctx->tok_dist[t]];
        }
        /* attention tiles and launch groups */
        ctx->plan.rt = single || !multi ? 1 : ctx->prefill_rt;
        const int32_t qt = single ? 1 : kg_cuda_attention_tile_tokens(&ctx->ash, ctx->plan.rt);
        const int32_t group_tok = ATT_PAIR_CAP / ctx->plan.max_splits;
        int32_t n_tiles = 0;
        ctx->n_groups = 0;
        for (int32_t t = 0; t < T;) {
            int32_t n = 1;
            while (t + n < T && n < qt && batch->seq[t + n] == batch->seq[t] &&
                   batch->pos[t + n] == batch->pos[t] + n) {
                n++;
            }
            int32_t g = ctx->n_groups - 1;
            if (g < 0 || ctx->grp_ntok[g] + n > group_tok) {
                g = ctx->n_groups++;
                ctx->grp_tile0[g] = n_tiles;
                ctx->grp_ntiles[g] = 0;
                ctx->grp_tok0[g] = t;
                ctx->grp_ntok[g] = 0;
            }
            ctx->grp_ntiles[g]++;
            ctx->grp_ntok[g] += n;
            tile_tok0[n_tiles] = t;
            tile_n[n_tiles] = n;
            n_tiles++;
            t += n;
        }
        hdr[0] = T;
        hdr[1] = n_out;
        hdr[2] = n_tiles;
        hdr[3] = 0;
        *n_ints = 4 + KG_CUDA_INPUT_ARRAYS * (size_t)cap + (size_t)n_table;
    }
out:
    /* empty the slots we filled (not by lookup: clearing one slot of a
     * probe chain would hide the entries after it) */
    for (int32_t d = 0; d < n_dist; d++) {
        ctx->hash_seq[ctx->dist_slot[d]] = -1;
    }
    return st;
}

static __half *k_cache(const cuda_ctx_t *ctx, int32_t il) {
    return ctx->kv + (size_t)(2 * il) * ctx->kv_layer_elems;
}

static __half *v_cache(const cuda_ctx_t *ctx, int32_t il) {
    return ctx->kv + (size_t)(2 * il + 1) * ctx->kv_layer_elems;
}

/* Attention of one layer: graph steps (single) cut their `rows` one-token
 * tiles into fixed groups, so the captured launches fit any later step of
 * the bucket; eager steps use the groups pack_inputs made. */
static kg_status_t attention(cuda_ctx_t *ctx, int32_t il, int32_t rows, bool single) {
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const cuda_layer_t *L = &ctx->layers[il];
    /* llama scales the scores; gemma and phi3 scaled q already */
    kg_cuda_attn_layer_t lay;
    lay.scale = ctx->hp.q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)ctx->hp.head_dim);
    lay.softcap = ctx->hp.attn_softcap;
    lay.n_swa = L->n_swa;
    lay.sinks = L->sinks;
    if (single) {
        kg_cuda_attn_plan_t plan = ctx->plan;
        plan.rt = 1;
        const int32_t group = ATT_PAIR_CAP / plan.max_splits;
        for (int32_t t0 = 0; t0 < rows; t0 += group) {
            const int32_t n = rows - t0 < group ? rows - t0 : group;
            KG_TRY(kg_cuda_attention(ctx->stream, in, &ctx->ash, &plan, &lay, t0, n, t0, n,
                                     ctx->q16, k_cache(ctx, il), v_cache(ctx, il), ctx->split,
                                     ctx->att, L->wo.dt));
        }
        return KG_OK;
    }
    for (int32_t g = 0; g < ctx->n_groups; g++) {
        KG_TRY(kg_cuda_attention(ctx->stream, in, &ctx->ash, &ctx->plan, &lay, ctx->grp_tile0[g],
                                 ctx->grp_ntiles[g], ctx->grp_tok0[g], ctx->grp_ntok[g], ctx->q16,
                                 k_cache(ctx, il), v_cache(ctx, il), ctx->split, ctx->att,
                                 L->wo.dt));
    }
    return KG_OK;
}

/* The head GEMM for output rows [row0, row0 + n) (n <= out_cap) into
 * `logits`. */
static kg_status_t run_head(cuda_ctx_t *ctx, int32_t row0, int32_t n) {
    const size_t es = kg_cuda_dtype_size(ctx->head.dt);
    const char *xo = (const char *)ctx->xo + (size_t)row0 * (size_t)ctx->hp.n_embd * es;
    KG_TRY(kg_cuda_gemm(&ctx->blas, ctx->stream, &ctx->head, xo, ctx->logits, n));
    KG_TRY(kg_cuda_logits_post(ctx->stream, ctx->logits, n, ctx->hp.n_vocab, ctx->out_b,
                               ctx->hp.final_softcap));
    ctx->head_row0 = row0;
    return KG_OK;
}

/* The mixture-of-experts FFN of layer L over `rows` token slots (cpu's
 * moe_ffn): the router GEMM on xn, route, the grouped layout, the
 * grouped gate, up and down GEMMs (expert biases inside), the gate, and
 * the weighted sum into tmp. */
static kg_status_t moe_ffn(cuda_ctx_t *ctx, const cuda_layer_t *L, int32_t rows) {
    const kg_hparams_t *hp = &ctx->hp;
    cudaStream_t st = ctx->stream;
    const kg_cuda_step_hdr_t *hdr = kg_cuda_inputs_view(ctx->d_in, rows).hdr;
    kg_cuda_moe_plan_t plan = ctx->moe_plan;
    plan.rows_cap = kg_cuda_moe_rows_cap(rows, hp->n_expert_used, hp->n_expert);
    const int32_t E = hp->n_embd, FX = hp->n_ff_exp;
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->router, ctx->xn, ctx->moe_logits, rows));
    KG_TRY(kg_cuda_moe_route(st, rows, hdr, &ctx->router, ctx->moe_logits, L->router_b, &plan));
    KG_TRY(kg_cuda_moe_align(st, hdr, &ctx->router, &plan));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_gate.data, L->exp_gate_b, ctx->xe, 1, ctx->moe_g, FX,
                            E, L->exp_gate.dt));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_up.data, L->exp_up_b, ctx->xe, 1, ctx->moe_u, FX, E,
                            L->exp_up.dt));
    KG_TRY(kg_cuda_moe_act(st, &plan, ctx->moe_g, ctx->moe_u, ctx->moe_h, L->exp_down.dt, FX,
                           hp->ffn_act == KG_FFN_SWIGLU_OAI));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_down.data, L->exp_down_b, ctx->moe_h, 0, ctx->moe_y,
                            E, FX, L->exp_down.dt));
    return kg_cuda_moe_combine(st, rows, hdr, &ctx->router, &plan, ctx->moe_y, ctx->tmp, E);
}

/* Every kernel of one step over `rows` token slots (the real count is in
 * the device header) and `out_rows` output rows, plus the head of the first
 * out_cap of them when `head`. Also what a graph captures. */
static kg_status_t
run_step(cuda_ctx_t *ctx, int32_t rows, int32_t out_rows, bool single, bool head) {
    const kg_hparams_t *hp = &ctx->hp;
    cudaStream_t st = ctx->stream;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const kg_cuda_step_hdr_t *hdr = in.hdr;
    const kg_cuda_rope_shape_t rsh = {hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot,
                                      ctx->block_size};
    const size_t rope_stride = (size_t)ctx->max_tokens * (size_t)hp->n_rot;

    KG_TRY(kg_cuda_embed(st, rows, in, ctx->emb.data, ctx->emb.dt, hp->n_embd, hp->embd_scale,
                         ctx->x));
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        KG_TRY(kg_cuda_rope_cache(st, rows, in, ctx->rope_cs + (size_t)r * rope_stride,
                                  &ctx->ropes[r], ctx->rope_freqs));
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        /* the previous layer's FFN output (after its post-norm) joins the
         * residual here */
        const kg_cuda_residual_t res_ffn = {il > 0 ? ctx->tmp : NULL, NULL,
                                            il > 0 ? ctx->layers[il - 1].ffn_post_norm : NULL};
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_ffn, L->attn_norm,
                                   ctx->xn, L->wqkv.dt, NULL, KG_CUDA_F32, hp->n_embd,
                                   hp->norm_eps));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wqkv, ctx->xn, ctx->qkv, rows));
        const kg_cuda_qkv_ops_t ops = {
            L->bqkv,    L->q_norm, L->k_norm, hp->norm_eps, hp->rope_mode == KG_ROPE_MODE_NEOX,
            hp->q_scale};
        KG_TRY(kg_cuda_rope_store(st, rows, in, &rsh, &ops, ctx->qkv,
                                  ctx->rope_cs + (size_t)L->rope * rope_stride, ctx->q16,
                                  k_cache(ctx, il), v_cache(ctx, il)));
        KG_TRY(attention(ctx, il, rows, single));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wo, ctx->att, ctx->tmp, rows));
        /* the attention output (+ bias, post-norm) joins the residual */
        const kg_cuda_residual_t res_attn = {ctx->tmp, L->bo, L->attn_post_norm};
        if (L->moe) {
            /* the normed input twice: for the router, and for the experts */
            KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_attn, L->ffn_norm,
                                       ctx->xn, L->router.dt, ctx->xe, L->exp_gate.dt, hp->n_embd,
                                       hp->norm_eps));
            KG_TRY(moe_ffn(ctx, L, rows));
            continue;
        }
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_attn, L->ffn_norm,
                                   ctx->xn, L->wgu.dt, NULL, KG_CUDA_F32, hp->n_embd,
                                   hp->norm_eps));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wgu, ctx->xn, ctx->gu, rows));
        if (hp->ffn_act == KG_FFN_GELU) {
            KG_TRY(kg_cuda_geglu(st, rows, hdr, ctx->gu, ctx->gelu_table, ctx->h, L->wdown.dt,
                                 hp->n_ff));
        } else {
            KG_TRY(kg_cuda_swiglu(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, hp->n_ff));
        }
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wdown, ctx->h, ctx->tmp, rows));
    }
    /* the last residual add and the final norm, only for the rows that want logits */
    const kg_cuda_residual_t res_last = {ctx->tmp, NULL,
                                         ctx->layers[hp->n_layer - 1].ffn_post_norm};
    KG_TRY(kg_cuda_add_rmsnorm(st, out_rows, hdr, true, in.out_row, ctx->x, &res_last,
                               ctx->out_norm, ctx->xo, ctx->head.dt, NULL, KG_CUDA_F32, hp->n_embd,
                               hp->norm_eps));
    if (head && out_rows > 0) {
        KG_TRY(run_head(ctx, 0, out_rows < ctx->out_cap ? out_rows : ctx->out_cap));
    }
    return KG_OK;
}

/* Capture bucket b (its warm-up ran just before). A failure that leaves the
 * context healthy makes the bucket eager for good (warning + counter); a
 * sticky one is a device fault. */
static kg_status_t capture(cuda_ctx_t *ctx, int b) {
    bucket_t *bk = &ctx->buckets[b];
    const int32_t rows = bk->rows;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    kg_status_t st = KG_OK;
    cudaError_t err = cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal);
    if (err == cudaSuccess) {
        st = run_step(ctx, rows, rows, true, rows <= ctx->out_cap);
        /* always end what was begun, whatever run_step did */
        err = cudaStreamEndCapture(ctx->stream, &graph);
    }
    if (err == cudaSuccess && st == KG_OK) {
        err = cudaGraphInstantiate(&exec, graph, 0);
    }
    if (graph) {
        cudaGraphDestroy(graph);
    }
    if (err == cudaSuccess && st == KG_OK) {
        bk->exec = exec;
        bk->state = BUCKET_GRAPH;
        count(&ctx->cnt.graphs_captured);
        KG_LOG_DEBUG("cuda", "captured the decode graph for %d rows", rows);
        return KG_OK;
    }
    const cudaError_t last = cudaGetLastError(); /* clears an error that is not sticky */
    const cudaError_t why = err != cudaSuccess ? err : last;
    if (kg_cuda_error_is_sticky((int)why) || kg_cuda_error_is_sticky((int)last) ||
        cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        KG_LOG_ERROR("cuda", "capturing the graph for %d rows hit a device fault: %s", rows,
                     cudaGetErrorName(why));
        return KG_ERR_BACKEND;
    }
    bk->state = BUCKET_EAGER;
    count(&ctx->cnt.graph_fallbacks);
    KG_LOG_WARN("cuda",
                "capturing the CUDA graph for %d rows failed (%s: %s); steps of that size run "
                "eagerly from now on",
                rows, cudaGetErrorName(why), cudaGetErrorString(why));
    return KG_OK;
}

/* The device part of a step, inputs already packed: T tokens (rows slots,
 * padded to the bucket's size when b >= 0), n_out output rows. */
static kg_status_t
device_step(cuda_ctx_t *ctx, int32_t T, int32_t rows, int b, int32_t n_out, size_t n_ints) {
    KG_CUDA_CHECK(cudaMemcpyAsync(ctx->d_in, ctx->h_in, n_ints * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KG_CUDA_CHECK(cudaEventRecord(ctx->ev_in, ctx->stream));
    ctx->head_row0 = -1;
    if (b < 0) {
        count(&ctx->cnt.eager_steps);
        return run_step(ctx, T, n_out, false, true);
    }
    bucket_t *bk = &ctx->buckets[b];
    if (bk->state == BUCKET_GRAPH) {
        KG_CUDA_CHECK(cudaGraphLaunch(bk->exec, ctx->stream));
        count(&ctx->cnt.graph_steps);
        if (rows <= ctx->out_cap) {
            ctx->head_row0 = 0;
        }
        return KG_OK;
    }
    count(&ctx->cnt.eager_steps);
    if (bk->state == BUCKET_EAGER) {
        return run_step(ctx, T, n_out, true, true);
    }
    /* first step of the bucket: the warm-up runs exactly the launches the
     * graph will hold (and computes this step), then the capture */
    KG_TRY(run_step(ctx, rows, rows, true, rows <= ctx->out_cap));
    if (rows <= ctx->out_cap) {
        ctx->head_row0 = 0;
    }
    return capture(ctx, b);
}

static kg_status_t mark_dead(cuda_ctx_t *ctx, const char *what) {
    if (!ctx->dead) {
        KG_LOG_ERROR("cuda", "device error in %s: the CUDA backend is dead, every later call fails",
                     what);
    }
    ctx->dead = true;
    ctx->fault.scope = KG_FAULT_DEVICE;
    ctx->fault.seq = -1;
    ctx->fault.row = -1;
    snprintf(ctx->fault.message, sizeof(ctx->fault.message),
             "the CUDA device failed in %s (see the log); the backend is dead", what);
    return KG_ERR_BACKEND;
}

/* Make output rows [row0, row0 + n) the ones in `logits`. */
static kg_status_t ensure_rows(cuda_ctx_t *ctx, int32_t row0) {
    if (ctx->head_row0 == row0) {
        return KG_OK;
    }
    const int32_t left = ctx->last_n_outputs - row0;
    return run_head(ctx, row0, left < ctx->out_cap ? left : ctx->out_cap);
}

static kg_status_t copy_logits(cuda_ctx_t *ctx, float *logits, int32_t n_out) {
    const size_t V = (size_t)ctx->hp.n_vocab;
    for (int32_t r0 = 0; r0 < n_out; r0 += ctx->out_cap) {
        const int32_t n = n_out - r0 < ctx->out_cap ? n_out - r0 : ctx->out_cap;
        KG_TRY(ensure_rows(ctx, r0));
        KG_CUDA_CHECK(cudaMemcpyAsync(logits + (size_t)r0 * V, ctx->logits,
                                      (size_t)n * V * sizeof(float), cudaMemcpyDeviceToHost,
                                      ctx->stream));
    }
    KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    return KG_OK;
}

static kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    ctx->last_n_outputs = 0;
    const int32_t T = batch->n_tokens, n_out = batch->n_outputs;
    if (T <= 0 || T > ctx->max_tokens || n_out < 0 || n_out > T) {
        return fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                     "step of %d tokens and %d outputs (max %d tokens)", T, n_out, ctx->max_tokens);
    }
    if (ctx->max_ctx == 0 && fix_attention(ctx, batch) != KG_OK) {
        return mark_dead(ctx, "sizing the step inputs");
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        cudaEventSynchronize(ctx->ev_in) != cudaSuccess) {
        return mark_dead(ctx, "the input upload"); /* the pinned inputs may still be in flight */
    }
    /* a decode-only step runs as the graph of its bucket */
    int b = -1;
    int32_t rows = T;
    if (ctx->use_graphs && n_out == T) {
        b = bucket_for(ctx, T);
        rows = b >= 0 && ctx->buckets[b].state != BUCKET_EAGER ? ctx->buckets[b].rows : T;
    }
    size_t n_ints = 0;
    const kg_status_t st = pack_inputs(ctx, batch, rows, b >= 0, &n_ints);
    if (st != KG_OK) {
        return st;
    }
    if (device_step(ctx, T, rows, b, n_out, n_ints) != KG_OK) {
        return mark_dead(ctx, "a step");
    }
    ctx->last_n_outputs = n_out;
    if (logits && n_out > 0 && copy_logits(ctx, logits, n_out) != KG_OK) {
        return mark_dead(ctx, "reading the logits");
    }
    return KG_OK;
}

static kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    if (n < 0 || n > ctx->last_n_outputs) {
        return fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                     "sample of %d rows, the last step produced %d", n, ctx->last_n_outputs);
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess) {
        return mark_dead(ctx, "sampling");
    }
    /* one logits chunk at a time: the head of a chunk, then its rows */
    for (int32_t r0 = 0; r0 < n; r0 += ctx->out_cap) {
        const int32_t rows = n - r0 < ctx->out_cap ? n - r0 : ctx->out_cap;
        int32_t bad = -1;
        if (ensure_rows(ctx, r0) != KG_OK) {
            return mark_dead(ctx, "the head GEMM");
        }
        /* the requests' logit_bias first (logit_bias.cu), then the constrained
         * rows' masks (mask.cu), then the usual sampler: a masked token stays
         * -inf either way, and a row whose allowed tokens are all banned comes
         * out uniform over them, as in kg_sampler_sample_masked */
        if (kg_cuda_bias_apply(&ctx->bias, ctx->stream, ctx->logits, ctx->hp.n_vocab, reqs + r0,
                               rows) != KG_OK) {
            return mark_dead(ctx, "the logit bias");
        }
        if (kg_cuda_mask_apply(&ctx->mask, ctx->stream, ctx->logits, ctx->sampler.n_vocab,
                               reqs + r0, rows) != KG_OK) {
            return mark_dead(ctx, "applying token masks");
        }
        const kg_status_t st = kg_cuda_sampler_run(&ctx->sampler, ctx->stream, ctx->logits,
                                                   reqs + r0, rows, out + r0, &bad);
        if (st == KG_ERR_INVALID && bad >= 0) {
            ctx->last_n_outputs = 0;
            return fault(ctx, st, KG_FAULT_SEQ, -1, r0 + bad,
                         "sampling output row %d failed (token %d outside the vocabulary)",
                         r0 + bad, out[r0 + bad].token);
        }
        if (st != KG_OK) {
            return mark_dead(ctx, "sampling");
        }
        /* this chunk's logits are consumed (penalties are applied in place) */
        ctx->head_row0 = -1;
    }
    ctx->last_n_outputs = 0;
    return KG_OK;
}

/* KV blocks for the n choices of one prompt (kv_copy.cu). */
static kg_status_t
cuda_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= ctx->n_kv_blocks || dst[i] < 0 || dst[i] >= ctx->n_kv_blocks ||
            src[i] == dst[i]) {
            return KG_ERR_INVALID;
        }
    }
    const size_t block = (size_t)ctx->block_size * (size_t)ctx->hp.n_head_kv * ctx->hp.head_dim;
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        kg_cuda_kv_copy(ctx->stream, ctx->kv, ctx->kv_layer_elems, 2 * ctx->hp.n_layer, block, src,
                        dst, n) != KG_OK) {
        return mark_dead(ctx, "the KV block copy");
    }
    return KG_OK;
}

static void cuda_last_fault(const kg_backend_t *be, kg_backend_fault_t *out) {
    *out = ((const cuda_ctx_t *)be->ctx)->fault;
}

/* The expert load, read back from the align kernel's counters (one small
 * copy, after the work queued so far). */
static void cuda_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    const int32_t X = ctx->hp.n_expert;
    out->n_expert = X;
    out->n_expert_used = ctx->hp.n_expert_used;
    out->n_per_expert = ctx->moe_tokens;
    if (!ctx->dead && ctx->moe_plan.stats &&
        cudaMemcpyAsync(ctx->moe_stats_h, ctx->moe_plan.stats, (4 + (size_t)X) * sizeof(long long),
                        cudaMemcpyDeviceToHost, ctx->stream) == cudaSuccess &&
        cudaStreamSynchronize(ctx->stream) == cudaSuccess) {
        for (int32_t e = 0; e < X; e++) {
            ctx->moe_tokens[e] = ctx->moe_stats_h[4 + e];
        }
        out->n_layer_steps = ctx->moe_stats_h[0];
        out->n_routed = ctx->moe_stats_h[1];
        out->n_groups = ctx->moe_stats_h[2];
        out->max_group = ctx->moe_stats_h[3];
    }
}

static void cuda_counters(const kg_backend_t *be, kg_backend_counters_t *out) {
    const cuda_ctx_t *ctx = (const cuda_ctx_t *)be->ctx;
    out->graphs_captured = __atomic_load_n(&ctx->cnt.graphs_captured, __ATOMIC_RELAXED);
    out->graph_fallbacks = __atomic_load_n(&ctx->cnt.graph_fallbacks, __ATOMIC_RELAXED);
    out->graph_steps = __atomic_load_n(&ctx->cnt.graph_steps, __ATOMIC_RELAXED);
    out->eager_steps = __atomic_load_n(&ctx->cnt.eager_steps, __ATOMIC_RELAXED);
}

// ---- lifecycle ----

static void free_mat(kg_cuda_mat_t *m) {
    cudaFree(m->data);
    m->data = NULL;
}

static void cuda_free(kg_backend_t *be) {
    if (!be) {
        return;
    }
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx) {
        if (ctx->stream) {
            cudaStreamSynchronize(ctx->stream);
        }
        for (int i = 0; i < ctx->n_buckets; i++) {
            if (ctx->buckets[i].exec) {
                cudaGraphExecDestroy(ctx->buckets[i].exec);
            }
        }
        if (ctx->layers) {
            for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
                cuda_layer_t *L = &ctx->layers[il];
                cudaFree(L->attn_norm);
                cudaFree(L->ffn_norm);
                free_mat(&L->wqkv);
                free_mat(&L->wo);
                free_mat(&L->wgu);
                free_mat(&L->wdown);
                free_mat(&L->router);
                free_mat(&L->exp_gate);
                free_mat(&L->exp_up);
                free_mat(&L->exp_down);
                float *vecs[] = {
                    L->bqkv,          L->bo,    L->q_norm,   L->k_norm,     L->attn_post_norm,
                    L->ffn_post_norm, L->sinks, L->router_b, L->exp_gate_b, L->exp_up_b,
                    L->exp_down_b};
                for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
                    cudaFree(vecs[i]);
                }
            }
            free(ctx->layers);
        }
        if (ctx->head.data != ctx->emb.data) {
            free_mat(&ctx->head);
        }
        free_mat(&ctx->emb);
        cudaFree(ctx->out_norm);
        cudaFree(ctx->out_b);
        cudaFree(ctx->rope_freqs);
        cudaFree(ctx->gelu_table);
        cudaFree(ctx->kv);
        const kg_cuda_moe_plan_t *mp = &ctx->moe_plan;
        void *bufs[] = {ctx->x,     ctx->qkv,        ctx->tmp,   ctx->gu,      ctx->rope_cs,
                        ctx->split, ctx->logits,     ctx->q16,   ctx->xn,      ctx->att,
                        ctx->h,     ctx->xo,         ctx->d_in,  ctx->blas_ws, mp->sel,
                        mp->w,      mp->slot,        mp->offset, mp->row_tok,  mp->tile_expert,
                        mp->stats,  ctx->moe_logits, ctx->xe,    ctx->moe_g,   ctx->moe_u,
                        ctx->moe_h, ctx->moe_y};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            cudaFree(bufs[i]);
        }
        cudaFreeHost(ctx->h_in);
        cudaFreeHost(ctx->moe_stats_h);
        if (ctx->ev_in) {
            cudaEventDestroy(ctx->ev_in);
        }
        if (ctx->sampler_ready) {
            kg_cuda_sampler_clear(&ctx->sampler);
            kg_cuda_mask_clear(&ctx->mask);
        }
        kg_cuda_bias_clear(&ctx->bias);
        kg_cuda_blas_clear(&ctx->blas);
        if (ctx->stream) {
            cudaStreamDestroy(ctx->stream);
        }
        void *host[] = {ctx->hash_seq,   ctx->hash_idx,  ctx->dist_seq, ctx->dist_max_pos,
                        ctx->dist_off,   ctx->dist_slot, ctx->tok_dist, ctx->grp_tile0,
                        ctx->grp_ntiles, ctx->grp_tok0,  ctx->grp_ntok, ctx->dist_min_pos,
                        ctx->ropes,      ctx->moe_tokens};
        for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) {
            free(host[i]);
        }
        free(ctx);
    }
    free(be);
}

static void cuda_memory(const kg_backend_t *be, kg_backend_memory_t *out) {
    const cuda_ctx_t *ctx = (const cuda_ctx_t *)be->ctx;
    out->weights_size = ctx->weights_size;
    out->kv_size = ctx->kv_size;
    out->scratch_size = ctx->scratch_size;
}

kg_backend_t *kg_backend_cuda_new(const kg_model_t *model,
                                  const kg_backend_params_t *params,
                                  char *errstr,
                                  size_t errstr_size) {
    kg_backend_t *be = (kg_backend_t *)calloc(1, sizeof(*be));
    cuda_ctx_t *ctx = (cuda_ctx_t *)calloc(1, sizeof(*ctx));
    const kg_hparams_t *hp = &model->hp;
    cudaDeviceProp prop;
    cudaError_t err;
    kg_cuda_probe_t probe;
    const char *gemm = getenv("KGEN_CUDA_GEMM");
    char blas_desc[160] = "none";
    if (!be || !ctx) {
        free(be);
        free(ctx);
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        return NULL;
    }
    be->iface = cuda_iface;
    be->ctx = ctx;
    be->sample = cuda_sample;
    be->last_fault = cuda_last_fault;
    be->counters = cuda_counters;
    be->moe_stats = hp->n_expert > 0 ? cuda_moe_stats : NULL;
    be->kv_copy = cuda_kv_copy;
    ctx->model = model;
    ctx->hp = *hp;
    ctx->n_kv_blocks = params->n_kv_blocks;
    ctx->block_size = params->kv_block_size;
    ctx->max_tokens = params->max_batch_tokens;
    ctx->head_row0 = -1;
    if (ctx->n_kv_blocks <= 0 || ctx->block_size <= 0 || ctx->max_tokens <= 0) {
        snprintf(errstr, errstr_size,
                 "cuda backend: KV blocks, block size and batch tokens must be > 0");
        goto fail;
    }
    if (hp->head_dim % 8 != 0 || hp->head_dim > 256 || hp->n_rot % 2 != 0 ||
        hp->n_rot > hp->head_dim || hp->n_head % hp->n_head_kv != 0) {
        snprintf(errstr, errstr_size,
                 "cuda backend: unsupported attention shape (head_dim %d, n_rot %d, heads %d/%d; "
                 "head_dim must be a multiple of 8 up to 256)",
                 hp->head_dim, hp->n_rot, hp->n_head, hp->n_head_kv);
        goto fail;
    }
    ctx->ash.n_head = hp->n_head;
    ctx->ash.n_head_kv = hp->n_head_kv;
    ctx->ash.head_dim = hp->head_dim;
    ctx->ash.block_size = ctx->block_size;
    ctx->prefill_rt = kg_cuda_attention_prefill_rt(&ctx->ash);
    ctx->prefill_qt = kg_cuda_attention_tile_tokens(&ctx->ash, ctx->prefill_rt);
    ctx->out_cap = env_int("KGEN_CUDA_MAX_OUTPUTS", MAX_OUTPUTS);
    ctx->out_cap = ctx->out_cap < 1 ? 1 : ctx->out_cap;
    ctx->out_cap = ctx->out_cap > ctx->max_tokens ? ctx->max_tokens : ctx->out_cap;
    {
        int64_t cap = (int64_t)ctx->n_kv_blocks * 4 + (int64_t)ctx->max_tokens * 64;
        ctx->table_cap = (int32_t)(cap > (1 << 28) ? (1 << 28) : cap < 65536 ? 65536 : cap);
    }
    ctx->use_graphs = env_int("KGEN_CUDA_GRAPHS", 1) != 0;
    make_buckets(ctx);
    ctx->max_seq_len = params->max_seq_len > 0 ? params->max_seq_len : hp->n_ctx_train;
    ctx->kv_window = kg_model_kv_window(model);
    if (hp->n_expert > 0 && (hp->n_expert_used > KG_CUDA_MOE_MAX_K || hp->n_expert > 1024)) {
        snprintf(errstr, errstr_size,
                 "cuda backend: %d experts with %d per token; the CUDA backend runs up to 1024 "
                 "experts and %d per token",
                 hp->n_expert, hp->n_expert_used, KG_CUDA_MOE_MAX_K);
        goto fail;
    }
    /* every weight's type, before anything is uploaded (a loaded model has
     * no tensor the graph does not use) */
    for (int64_t i = 0; i < kg_gguf_n_tensors(model->gguf); i++) {
        if (check_type(kg_gguf_tensor(model->gguf, i), errstr, errstr_size) != KG_OK) {
            goto fail;
        }
    }

    kg_cuda_probe(&probe);
    if (probe.kind != KG_CUDA_PROBE_OK) {
        snprintf(errstr, errstr_size, "cuda backend: %s", probe.message);
        goto fail;
    }
    err = cudaSetDevice(ctx->device);
    if (err == cudaSuccess) {
        err = cudaGetDeviceProperties(&prop, ctx->device);
    }
    if (err != cudaSuccess) {
        snprintf(errstr, errstr_size, "cuda backend: device %d unusable: %s (%s)", ctx->device,
                 cudaGetErrorName(err), cudaGetErrorString(err));
        goto fail;
    }
    if (prop.major < 8) {
        snprintf(errstr, errstr_size,
                 "cuda backend: %s has compute capability %d.%d; kgen needs 8.0 or newer (BF16)",
                 prop.name, prop.major, prop.minor);
        goto fail;
    }
    ctx->n_sm = prop.multiProcessorCount;
    err = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (err == cudaSuccess && gemm && strcmp(gemm, "cublas") == 0) {
        err = cudaMalloc(&ctx->blas_ws, BLAS_WORKSPACE);
    }
    if (err != cudaSuccess) {
        snprintf(errstr, errstr_size, "cuda backend: %s (%s)", cudaGetErrorName(err),
                 cudaGetErrorString(err));
        goto fail;
    }
    if (gemm && gemm[0] && strcmp(gemm, "cublas") != 0 && strcmp(gemm, "mma") != 0) {
        snprintf(errstr, errstr_size, "cuda backend: KGEN_CUDA_GEMM=%s (expected mma or cublas)",
                 gemm);
        goto fail;
    }
    if (kg_cuda_blas_init(&ctx->blas, ctx->blas_ws ? KG_CUDA_GEMM_CUBLAS : KG_CUDA_GEMM_MMA,
                          ctx->stream, ctx->blas_ws, BLAS_WORKSPACE, errstr,
                          errstr_size) != KG_OK) {
        if (errstr[0] == '\0') {
            snprintf(errstr, errstr_size, "cuda backend: cuBLAS setup failed (see the log)");
        }
        goto fail;
    }
    if (ctx->blas.mode == KG_CUDA_GEMM_CUBLAS) {
        snprintf(blas_desc, sizeof(blas_desc), "%s/%d.%d.%d", ctx->blas.api->lib_name,
                 ctx->blas.api->major, ctx->blas.api->minor, ctx->blas.api->patch);
        KG_LOG_WARN("cuda",
                    "KGEN_CUDA_GEMM=cublas: GEMMs through %s; a job's tokens may then "
                    "depend on its batch mates (cuBLAS picks algorithms by shape)",
                    blas_desc);
    }

    ctx->layers = (cuda_layer_t *)calloc((size_t)hp->n_layer, sizeof(*ctx->layers));
    if (!ctx->layers) {
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        goto fail;
    }
    if (upload_weights(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: uploading the weights failed (%zu MiB so far; see the log)",
                 ctx->weights_size >> 20);
        goto fail;
    }
    if (alloc_buffers(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: allocating the KV pool (%zu MiB) and buffers failed (see the log)",
                 ctx->kv_size >> 20);
        goto fail;
    }
    KG_LOG_INFO("cuda",
                "backend ready device=\"%s\" sm=%d cc=%d.%d driver_cuda=%d.%d runtime_cuda=%d.%d "
                "weights_mib=%zu kv_mib=%zu scratch_mib=%zu gemm=%s cublas=%s graphs=%d "
                "graph_buckets=%d max_outputs=%d",
                prop.name, ctx->n_sm, prop.major, prop.minor, probe.driver_version / 1000,
                (probe.driver_version % 1000) / 10, probe.runtime_version / 1000,
                (probe.runtime_version % 1000) / 10, ctx->weights_size >> 20, ctx->kv_size >> 20,
                ctx->scratch_size >> 20, ctx->blas.mode == KG_CUDA_GEMM_CUBLAS ? "cublas" : "mma",
                blas_desc, ctx->use_graphs ? 1 : 0, ctx->use_graphs ? ctx->n_buckets : 0,
                ctx->out_cap);
    return be;
fail:
    cuda_free(be);
    return NULL;
}
