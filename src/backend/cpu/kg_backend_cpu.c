/* kg_backend_cpu: the reference backend. Runs one step batch through the
 * model's graph (kg_model's switches: every supported family) with one GEMM
 * per weight matrix over all the step's tokens.
 *
 * DESIGN
 * Weights. F32, F16 and BF16 matrices are packed once at load into
 * cpu_gemm's panels in their storage type (a decode step streams every
 * weight, so half-precision weights halve its bytes), and the file's pages
 * are released. Quantized matrices (every GGUF block type kg_quant reads,
 * MXFP4 experts included) stay where they are, in the read-only mapping of
 * the file: cpu_vecdot multiplies their blocks directly by activations
 * quantized as ggml quantizes them for that type (Q8_0, Q8_1 or Q8_K
 * blocks; MXFP4 takes Q8_0, as ggml's vec_dot_mxfp4_q8_0 does), with exact
 * integer dot products per block, so nothing is expanded and the memory a
 * quantized model takes is its file. Norm vectors are used in place (F32)
 * or dequantized. For F16/BF16 the activations entering a matmul are
 * rounded the way ggml converts them for that weight type: the products
 * then equal ggml's; only the summation order differs.
 *
 * KV cache. One pool of n_kv_blocks blocks of kv_block_size rows per layer,
 * K and V in fp16 as llama.cpp keeps them: k_cache[layer] is
 * (n_kv_blocks * kv_block_size, n_head_kv * head_dim). The engine's block
 * tables say where each sequence's positions live.
 *
 * Step. x = embed(tokens) (times the embedding scale: gemma); per layer:
 * rmsnorm, Q/K/V GEMMs (+ biases: qwen2), per-head Q/K RMSNorm (qwen3,
 * gemma3), RoPE with the layer's base and scale (normal or NeoX pairs,
 * YaRN, LongRoPE factors), the query scale (gemma, phi3), K/V rows written
 * to their blocks, attention of every token over its own sequence's
 * positions [0, pos], or the last n_swa of them in a windowed layer
 * (soft-capped scores: gemma2; parallel over tokens x heads), output GEMM
 * (+ post-norm: gemma) + residual, rmsnorm, gate/up GEMMs, SwiGLU or
 * GeGLU, down GEMM (+ post-norm) + residual; then the final norm and the
 * head only for the rows that want logits (+ bias, soft-capping). Each
 * token's row is computed independently of the others in the batch, so a
 * sequence's results do not depend on what shares its step. The llama.cpp
 * ops each step mirrors are named where they are done.
 *
 * Experts. A mixture-of-experts layer replaces the gate/up/down GEMMs with
 * cpu_moe's plan: the router's logits (one GEMM; + bias: gpt-oss), each
 * token's k experts and weights, the rows gathered by expert, then per
 * active expert one gate/up GEMM and one down GEMM over its group (its
 * packed matrices are weights like any other: matmul_n_on, so the
 * activation rounding and the kernels are the dense path's; many small
 * groups run side by side, one pool task each), the expert biases and
 * the gate (SwiGLU, or gpt-oss's clamped one), and the weighted sum in rank
 * order (see cpu_moe.h for why a token's bits do not depend on its
 * neighbours). Attention sinks (gpt-oss) add one logit per head to the
 * softmax. The expert load is counted for kg_backend_moe_stats. */
#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_quant.h"
#include "../kg_backend_impl.h"
#include "../kg_math.h"
#include "cpu_attn.h"
#include "cpu_gemm.h"
#include "cpu_moe.h"
#include "cpu_ops.h"
#include "cpu_quant.h"
#include "cpu_vecdot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
} cpu_layer_t;

/* One distinct RoPE among the layers (Gemma: local and global). */
typedef struct cpu_rope {
    float base, scale;
    float corr_dims[2]; /* YaRN's blend range for this base */
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
    int32_t max_window;   /* largest layer window, 0 when some layer is global */
    uint16_t *gelu_table; /* (65536) GeGLU models only */
    uint16_t **k_cache;   /* (n_layer) x (n_kv_blocks * block_size, n_head_kv * head_dim) fp16 */
    uint16_t **v_cache;   /* same shape as k_cache */
    /* scratch for max_tokens tokens */
    float *x;        /* (T, n_embd) residual stream */
    float *xn;       /* (T, n_embd) normed input of a block */
    float *xr;       /* (T, max(n_embd, n_ff, n_q)) activations rounded for a weight type */
    float *q;        /* (T, n_head * head_dim) */
    float *k;        /* (T, n_head_kv * head_dim) */
    float *v;        /* (T, n_head_kv * head_dim) */
    float *att;      /* (T, n_head * head_dim) attention output */
    float *gate;     /* (T, n_ff) */
    float *up;       /* (T, n_ff) */
    float *tmp;      /* (T, n_embd) projection output before the residual add */
    float *rope_cs;  /* (n_ropes, T, n_rot) cos | sin per token */
    float *scores;   /* (n_threads, n_kv_blocks * block_size) */
    cpu_qact_t qact; /* (T, widest) activations quantized for cpu_vecdot */
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
    size_t weights_size, kv_size, scratch_size;
} cpu_ctx_t;

// ---- weights ----

static bool weight_init(
    cpu_weight_t *w, const kg_gguf_tensor_t *t, cpu_ctx_t *ctx, char *errstr, size_t errstr_size) {
    w->n_in = t->ne[0];
    w->n_out = t->n_dims > 1 ? t->ne[1] : 1;
    w->type = t->type;
    if (t->n_dims > 1 && cpu_qtraits(t->type)) {
        /* used in place: the mapped blocks are what cpu_vecdot reads */
        if (!cpu_qmat_init(&w->q, t->type, t->data, w->n_out, w->n_in)) {
            snprintf(errstr, errstr_size, "cpu backend: tensor '%.*s' of type %s has rows of %lld",
                     (int)t->name.len, t->name.data, kg_type_name(t->type), (long long)w->n_in);
            return false;
        }
        ctx->weights_size += t->size;
        return true;
    }
    if (t->n_dims > 1) {
        if (!cpu_gemm_pack(&w->packed, t->type, t->data, w->n_out, w->n_in)) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory packing '%.*s'",
                     (int)t->name.len, t->name.data);
            return false;
        }
        ctx->weights_size += w->packed.size;
        /* the panels are the copy we use: let the file's pages go */
        kg_gguf_release(ctx->model->gguf, t->data, t->size);
        return true;
    }
    if (t->type == KG_GGML_TYPE_F32) {
        w->data = t->data; /* in place from the mapping */
        ctx->weights_size += t->size;
        return true;
    }
    size_t n = (size_t)(w->n_in * w->n_out);
    w->owned = malloc(n * sizeof(float));
    if (!w->owned) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory dequantizing '%.*s' (%zu MiB)",
                 (int)t->name.len, t->name.data, n * sizeof(float) >> 20);
        return false;
    }
    kg_dequantize(t->type, t->data, w->owned, (int64_t)n);
    w->data = w->owned;
    ctx->weights_size += n * sizeof(float);
    return true;
}

static void weight_clear(cpu_weight_t *w) {
    free(w->owned);
    w->owned = NULL;
    cpu_gemm_clear(&w->packed);
}

/* The index of the RoPE (base, scale) in ctx->ropes, added when new;
 * false when out of memory. */
static bool add_rope(cpu_ctx_t *ctx, float base, float scale, int32_t *index) {
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        if (ctx->ropes[r].base == base && ctx->ropes[r].scale == scale) {
            *index = r;
            return true;
        }
    }
    cpu_rope_t *grown = realloc(ctx->ropes, (size_t)(ctx->n_ropes + 1) * sizeof(*grown));
    if (!grown) {
        return false;
    }
    ctx->ropes = grown;
    cpu_rope_t *rp = &ctx->ropes[ctx->n_ropes];
    rp->base = base;
    rp->scale = scale;
    kg_rope_yarn_corr_dims(ctx->hp.n_rot, ctx->hp.n_ctx_orig, base, ctx->hp.yarn_beta_fast,
                           ctx->hp.yarn_beta_slow, rp->corr_dims);
    *index = ctx->n_ropes++;
    return true;
}

/* A vector of any shape (the (n_ff_exp, n_expert) expert biases) as one
 * flat F32 vector. */
static bool vector_init(
    cpu_weight_t *w, const kg_gguf_tensor_t *t, cpu_ctx_t *ctx, char *errstr, size_t errstr_size) {
    kg_gguf_tensor_t flat = *t;
    for (uint32_t d = 1; d < t->n_dims; d++) {
        flat.ne[0] *= t->ne[d];
        flat.ne[d] = 1;
    }
    flat.n_dims = 1;
    return weight_init(w, &flat, ctx, errstr, errstr_size);
}

/* The router, every expert's three matrices (packed one by one from the
 * model's per-expert views) and the expert biases of one layer. */
static bool moe_layer_init(cpu_layer_t *L,
                           const kg_layer_weights_t *src,
                           cpu_ctx_t *ctx,
                           char *errstr,
                           size_t errstr_size) {
    const int32_t X = ctx->hp.n_expert;
    L->moe = true;
    L->exp_gate = calloc((size_t)X, sizeof(*L->exp_gate));
    L->exp_up = calloc((size_t)X, sizeof(*L->exp_up));
    L->exp_down = calloc((size_t)X, sizeof(*L->exp_down));
    if (!L->exp_gate || !L->exp_up || !L->exp_down) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    if (!weight_init(&L->gate_inp, src->ffn_gate_inp, ctx, errstr, errstr_size)) {
        return false;
    }
    for (int32_t e = 0; e < X; e++) {
        if (!weight_init(&L->exp_gate[e], &src->exp_gate[e], ctx, errstr, errstr_size) ||
            !weight_init(&L->exp_up[e], &src->exp_up[e], ctx, errstr, errstr_size) ||
            !weight_init(&L->exp_down[e], &src->exp_down[e], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    const kg_gguf_tensor_t *bsrc[] = {src->ffn_gate_inp_b, src->gate_exps_b, src->up_exps_b,
                                      src->down_exps_b};
    cpu_weight_t *bdst[] = {&L->gate_inp_b, &L->exp_gate_b, &L->exp_up_b, &L->exp_down_b};
    for (size_t i = 0; i < sizeof(bsrc) / sizeof(bsrc[0]); i++) {
        if (bsrc[i] && !vector_init(bdst[i], bsrc[i], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    return true;
}

// ---- lifecycle ----

static void cpu_free(kg_backend_t *be) {
    cpu_ctx_t *ctx = be->ctx;
    if (ctx) {
        if (ctx->layers) {
            for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
                cpu_layer_t *L = &ctx->layers[il];
                cpu_weight_t *ws[] = {
                    &L->attn_norm,    &L->ffn_norm, &L->wq,     &L->wk,
                    &L->wv,           &L->wo,       &L->w_gate, &L->w_up,
                    &L->w_down,       &L->bq,       &L->bk,     &L->bv,
                    &L->bo,           &L->q_norm,   &L->k_norm, &L->attn_post_norm,
                    &L->ffn_post_norm};
                for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
                    weight_clear(ws[i]);
                }
                cpu_weight_t *moe_ws[] = {&L->gate_inp, &L->gate_inp_b, &L->exp_gate_b,
                                          &L->exp_up_b, &L->exp_down_b, &L->sinks};
                for (size_t i = 0; i < sizeof(moe_ws) / sizeof(moe_ws[0]); i++) {
                    weight_clear(moe_ws[i]);
                }
                cpu_weight_t *exps[] = {L->exp_gate, L->exp_up, L->exp_down};
                for (size_t i = 0; i < 3; i++) {
                    for (int32_t e = 0; exps[i] && e < ctx->hp.n_expert; e++) {
                        weight_clear(&exps[i][e]);
                    }
                    free(exps[i]);
                }
            }
        }
        cpu_moe_plan_clear(&ctx->plan);
        for (int i = 0; ctx->moe_qact && i < ctx->n_threads; i++) {
            cpu_qact_clear(&ctx->moe_qact[i]);
        }
        free(ctx->moe_qact);
        free(ctx->moe_tokens);
        free(ctx->moe_active);
        weight_clear(&ctx->output_norm);
        weight_clear(&ctx->output);
        weight_clear(&ctx->output_b);
        if (ctx->k_cache) {
            for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
                free(ctx->k_cache[il]);
                free(ctx->v_cache[il]);
            }
        }
        free(ctx->k_cache);
        free(ctx->v_cache);
        kg_pool_free(ctx->pool);
        cpu_qact_clear(&ctx->qact);
        cpu_qgemm_scratch_free(ctx->qscratch);
        free(ctx->layers);
        free(ctx->rope_freqs);
        free(ctx->ropes);
        free(ctx->gelu_table);
        float *bufs[] = {ctx->x,       ctx->xn,     ctx->xr,         ctx->q,     ctx->k,
                         ctx->v,       ctx->att,    ctx->gate,       ctx->up,    ctx->tmp,
                         ctx->rope_cs, ctx->scores, ctx->moe_logits, ctx->moe_x, ctx->moe_g,
                         ctx->moe_u,   ctx->moe_y,  ctx->moe_xr};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            free(bufs[i]);
        }
        free(ctx);
    }
    free(be);
}

static void cpu_memory(const kg_backend_t *be, kg_backend_memory_t *out) {
    const cpu_ctx_t *ctx = be->ctx;
    out->weights_size = ctx->weights_size;
    out->kv_size = ctx->kv_size;
    out->scratch_size = ctx->scratch_size;
}

static float *scratch(cpu_ctx_t *ctx, size_t n_floats, bool *ok) {
    float *p = calloc(n_floats ? n_floats : 1, sizeof(float));
    if (!p) {
        *ok = false;
    }
    ctx->scratch_size += n_floats * sizeof(float);
    return p;
}

// ---- forward ----

/* Whether two weights can share one hand-off: the same float type, or
 * quantized types whose dot products take the same activation blocks. */
static bool same_path(const cpu_weight_t *a, const cpu_weight_t *b) {
    if (a->q.tr || b->q.tr) {
        return a->q.tr && b->q.tr && a->q.tr->act == b->q.tr->act;
    }
    return a->type == b->type;
}

/* outs[i](T, ws[i].n_out) = in(T, n_in) · ws[i]^T for n weights sharing
 * their input, with in rounded into xr (T, n_in) (float types) or
 * quantized into qa (block types) for their type: one hand-off to `pool`
 * when they share a path (Q, K and V; gate and up). pool NULL: the calling
 * thread only, pool thread `thread`, whose unpacking buffers it uses. */
static void matmul_n_on(cpu_ctx_t *ctx,
                        kg_pool_t *pool,
                        int thread,
                        float *xr,
                        cpu_qact_t *qa,
                        int n,
                        const cpu_weight_t *const *ws,
                        const float *in,
                        float *const *outs,
                        int64_t T) {
    const cpu_gemm_weights_t *packed[CPU_GEMM_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        if (!same_path(ws[i], ws[0])) {
            for (int r = 0; r < n; r++) {
                matmul_n_on(ctx, pool, thread, xr, qa, 1, &ws[r], in, &outs[r], T);
            }
            return;
        }
        packed[i] = &ws[i]->packed;
    }
    if (ws[0]->q.tr) {
        const cpu_qmat_t *qm[CPU_QGEMM_MAX_W];
        for (int i = 0; i < n; i++) {
            qm[i] = &ws[i]->q;
        }
        cpu_quant_act(ws[0]->q.tr->act, in, T, ws[0]->n_in, qa);
        if (pool) {
            cpu_qgemm(pool, ctx->qscratch, qa, n, qm, outs);
        } else {
            cpu_qgemm_serial(ctx->qscratch, thread, qa, n, qm, outs);
        }
        return;
    }
    const float *a = in;
    if (cpu_round_activations(ws[0]->type, in, xr, T, ws[0]->n_in)) {
        a = xr;
    }
    cpu_gemm_multi(pool, a, T, n, packed, outs);
}

/* matmul_n_on over the backend's pool and scratch. */
static void matmul_n(cpu_ctx_t *ctx,
                     int n,
                     const cpu_weight_t *const *ws,
                     const float *in,
                     float *const *outs,
                     int64_t T) {
    matmul_n_on(ctx, ctx->pool, 0, ctx->xr, &ctx->qact, n, ws, in, outs, T);
}

static void matmul(cpu_ctx_t *ctx, const cpu_weight_t *w, const float *in, float *out, int64_t T) {
    matmul_n(ctx, 1, &w, in, &out, T);
}

/* out[r] += b for every row (ggml_add of a bias vector). */
static void add_bias(float *x, const cpu_weight_t *b, int64_t T, int64_t n) {
    if (!b->data) {
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < n; i++) {
            x[t * n + i] += b->data[i];
        }
    }
}

static void scale_rows(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) {
        x[i] *= s; /* ggml_scale */
    }
}

/* RoPE (ggml_rope_ext) on the first n_rot dims of every head; the rest of
 * a head passes through. Normal mode rotates adjacent pairs (2i, 2i+1),
 * NeoX mode pairs i with i + n_rot/2; pair i takes angle i of the cache. */
static void rope_rows(cpu_ctx_t *ctx, float *x, int64_t T, int32_t n_heads, const float *cs_all) {
    const int32_t hd = ctx->hp.head_dim, half = ctx->hp.n_rot / 2;
    const bool neox = ctx->hp.rope_mode == KG_ROPE_MODE_NEOX;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cs_all + t * ctx->hp.n_rot;
        for (int32_t h = 0; h < n_heads; h++) {
            float *row = x + (t * n_heads + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                float *a = neox ? &row[i] : &row[2 * i];
                float *b = neox ? &row[i + half] : &row[2 * i + 1];
                kg_rope_pair(a, b, cs[i], cs[half + i]);
            }
        }
    }
}

/* Attention of every token over its sequence's cached positions [p0, pos]
 * (p0 = 0, or the start of the layer's window): softmax(q·k * scale) · v
 * per head, with q and the probabilities rounded to fp16 as ggml does
 * before its fp16 K/V matmuls. One task = one (token, head). */
typedef struct attn_job {
    cpu_ctx_t *ctx;
    int32_t il;
    const kg_step_batch_t *batch;
} attn_job_t;

static void attention_task(void *arg, int64_t w, int thread) {
    const attn_job_t *job = arg;
    cpu_ctx_t *ctx = job->ctx;
    const kg_step_batch_t *batch = job->batch;
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t hd = hp->head_dim, n_kv_dim = hp->n_head_kv * hd;
    const int32_t group = hp->n_head / hp->n_head_kv, bs = ctx->block_size;
    /* llama scales the scores; gemma and phi3 scaled q already (kq_scale 1) */
    const float scale = hp->q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)hd);
    const int32_t n_swa = ctx->model->layers[job->il].n_swa;
    const int64_t max_pos = (int64_t)ctx->n_kv_blocks * bs;

    const int64_t t = w / hp->n_head;
    const int32_t h = (int32_t)(w % hp->n_head), g = h / group;
    const int32_t n_pos = batch->pos[t] + 1;
    const int32_t p0 = n_swa > 0 && n_pos > n_swa ? n_pos - n_swa : 0;
    const int32_t *table = batch->block_table + (int64_t)batch->seq[t] * batch->max_blocks_per_seq;
    float *s = ctx->scores + (int64_t)thread * max_pos;
    float *q = ctx->q + (t * hp->n_head + h) * hd;
    float *out = ctx->att + (t * hp->n_head + h) * hd;

    const cpu_kv_view_t kv = {.k = ctx->k_cache[job->il],
                              .v = ctx->v_cache[job->il],
                              .stride = n_kv_dim,
                              .offset = (int64_t)g * hd,
                              .table = table,
                              .block_size = bs};
    const cpu_weight_t *sinks = &ctx->layers[job->il].sinks;
    cpu_attn_head_sink(q, &kv, p0, n_pos, hd, scale, hp->attn_softcap,
                       sinks->data ? sinks->data[h] : -INFINITY, s, out);
}

static void attention(cpu_ctx_t *ctx, int32_t il, const kg_step_batch_t *batch) {
    attn_job_t job = {.ctx = ctx, .il = il, .batch = batch};
    const int64_t n_work = (int64_t)batch->n_tokens * ctx->hp.n_head;
    const int32_t n_swa = ctx->model->layers[il].n_swa;
    /* waking the pool costs microseconds: tiny attention runs inline */
    int64_t flops = 0;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const int32_t n_pos = batch->pos[t] + 1;
        flops += (int64_t)(n_swa > 0 && n_pos > n_swa ? n_swa : n_pos) * ctx->hp.n_head *
                 ctx->hp.head_dim;
    }
    if (flops < 65536) {
        for (int64_t w = 0; w < n_work; w++) {
            attention_task(&job, w, 0);
        }
        return;
    }
    kg_pool_run(ctx->pool, n_work, attention_task, &job);
}

/* Every block a token reads must be a real block: the engine frees only
 * blocks wholly before every layer's window. Checked once per step for
 * the widest range any layer reads. */
static bool batch_blocks_ok(const cpu_ctx_t *ctx, const kg_step_batch_t *batch) {
    const int32_t bs = ctx->block_size;
    int32_t prev_seq = -1, prev_pos = -1;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const int32_t pos = batch->pos[t];
        const int32_t p0 =
            ctx->max_window > 0 && pos + 1 > ctx->max_window ? pos + 1 - ctx->max_window : 0;
        const int32_t *table =
            batch->block_table + (int64_t)batch->seq[t] * batch->max_blocks_per_seq;
        int32_t first = p0 / bs;
        /* the next token of a prefill chunk: its window starts no earlier
         * and the blocks up to the previous token's are checked already */
        if (batch->seq[t] == prev_seq && pos == prev_pos + 1 && prev_pos / bs + 1 > first) {
            first = prev_pos / bs + 1;
        }
        prev_seq = batch->seq[t];
        prev_pos = pos;
        for (int32_t b = first; b <= pos / bs; b++) {
            if (table[b] < 0 || table[b] >= ctx->n_kv_blocks) {
                KG_LOG_ERROR("cpu", "token %d (seq %d pos %d) reads block %d = %d (pool %d)", t,
                             batch->seq[t], pos, b, table[b], ctx->n_kv_blocks);
                return false;
            }
        }
    }
    return true;
}

/* x[r] += b[e] over the rows r of expert e's group (ggml_add_id): b is
 * (n_expert, n) flat, or data NULL for none. */
static void add_expert_bias(float *x, const cpu_weight_t *b, int32_t e, int64_t rows, int64_t n) {
    if (!b->data) {
        return;
    }
    const float *be = b->data + (int64_t)e * n;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++) {
            x[r * n + i] += be[i];
        }
    }
}

/* Expert e's FFN over its group of rows (grouped rows [r0, r0 + n)):
 * gate/up GEMMs, biases, the gate, the down GEMM and its bias, on `pool`
 * (NULL: this thread), rounding activations into the group's own rows of
 * ctx->moe_xr, so groups can run side by side. */
static void
expert_ffn(cpu_ctx_t *ctx, kg_pool_t *pool, int thread, const cpu_layer_t *L, int32_t e) {
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t E = hp->n_embd, FX = hp->n_ff_exp;
    const int64_t W = E > FX ? E : FX;
    const int64_t r0 = ctx->plan.offset[e], n = ctx->plan.offset[e + 1] - r0;
    float *g = ctx->moe_g + r0 * FX, *u = ctx->moe_u + r0 * FX, *y = ctx->moe_y + r0 * E;
    float *xr = ctx->moe_xr + r0 * W;
    const cpu_weight_t *gate_up[2] = {&L->exp_gate[e], &L->exp_up[e]};
    float *const gate_up_out[2] = {g, u};
    /* on the pool: the backend's quantized activations; alone on a pool
     * thread: that thread's own */
    cpu_qact_t *qa = pool ? &ctx->qact : &ctx->moe_qact[thread];
    matmul_n_on(ctx, pool, thread, xr, qa, 2, gate_up, ctx->moe_x + r0 * E, gate_up_out, n);
    add_expert_bias(u, &L->exp_up_b, e, n, FX);
    add_expert_bias(g, &L->exp_gate_b, e, n, FX);
    if (hp->ffn_act == KG_FFN_SWIGLU_OAI) {
        cpu_moe_swiglu_oai(g, u, g, n * FX);
    } else {
        for (int64_t i = 0; i < n * FX; i++) {
            g[i] = kg_silu(g[i]) * u[i];
        }
    }
    const cpu_weight_t *down = &L->exp_down[e];
    matmul_n_on(ctx, pool, thread, xr, qa, 1, &down, g, &y, n);
    add_expert_bias(y, &L->exp_down_b, e, n, E);
}

typedef struct expert_job {
    cpu_ctx_t *ctx;
    const cpu_layer_t *L;
} expert_job_t;

/* One pool task: one active expert's whole FFN on this thread. */
static void expert_task(void *arg, int64_t w, int thread) {
    const expert_job_t *job = arg;
    expert_ffn(job->ctx, NULL, thread, job->L, job->ctx->moe_active[w]);
}

/* The mixture-of-experts FFN of layer L on ctx->xn (T, n_embd) into
 * ctx->tmp (T, n_embd) (llama.cpp's build_moe_ffn): route, group, one
 * gate/up and one down GEMM per active expert over its rows, weigh and
 * add. With enough active experts to keep every thread busy (decode: many
 * experts of a few rows each) the experts run side by side, one pool task
 * each, largest group first; otherwise one after another, each GEMM split
 * over the pool by columns. Either way every row's bits are the same: the
 * GEMM's per-element chain does not depend on threads or row counts. */
static void moe_ffn(cpu_ctx_t *ctx, const cpu_layer_t *L, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    cpu_moe_plan_t *plan = &ctx->plan;
    kg_moe_stats_t *st = &ctx->moe_stats;
    matmul(ctx, &L->gate_inp, ctx->xn, ctx->moe_logits, T);
    add_bias(ctx->moe_logits, &L->gate_inp_b, T, hp->n_expert);
    cpu_moe_route(plan, hp, ctx->moe_logits, T);
    cpu_moe_gather(plan, ctx->xn, hp->n_embd, ctx->moe_x, T);
    int32_t n_active = 0;
    for (int32_t e = 0; e < hp->n_expert; e++) {
        const int32_t n = plan->offset[e + 1] - plan->offset[e];
        if (n == 0) {
            continue;
        }
        /* insertion by group size, descending (ties: lower expert first) */
        int32_t i = n_active++;
        while (i > 0 &&
               plan->offset[ctx->moe_active[i - 1] + 1] - plan->offset[ctx->moe_active[i - 1]] <
                   n) {
            ctx->moe_active[i] = ctx->moe_active[i - 1];
            i--;
        }
        ctx->moe_active[i] = e;
        ctx->moe_tokens[e] += n;
        st->max_group = n > st->max_group ? n : st->max_group;
    }
    if (n_active >= 2 * ctx->n_threads) {
        expert_job_t job = {.ctx = ctx, .L = L};
        kg_pool_run(ctx->pool, n_active, expert_task, &job);
    } else {
        for (int32_t i = 0; i < n_active; i++) {
            expert_ffn(ctx, ctx->pool, 0, L, ctx->moe_active[i]);
        }
    }
    cpu_moe_combine(plan, ctx->moe_y, hp->n_embd, ctx->tmp, T);
    st->n_groups += n_active;
    st->n_layer_steps++;
    st->n_routed += T * hp->n_expert_used;
}

static void cpu_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out) {
    const cpu_ctx_t *ctx = be->ctx;
    *out = ctx->moe_stats;
    out->n_per_expert = ctx->moe_tokens;
}

static kg_status_t cpu_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    cpu_ctx_t *ctx = be->ctx;
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t T = batch->n_tokens, E = hp->n_embd, F = hp->n_ff;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_kv = (int64_t)hp->n_head_kv * hp->head_dim;
    const int32_t bs = ctx->block_size;
    if (T <= 0 || T > ctx->max_tokens) {
        KG_LOG_ERROR("cpu", "step of %lld tokens (max %d)", (long long)T, ctx->max_tokens);
        return KG_ERR_INVALID;
    }
    for (int64_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], pos = batch->pos[t], seq = batch->seq[t];
        if (tok < 0 || tok >= hp->n_vocab || pos < 0 || seq < 0 || seq >= batch->n_slots ||
            pos / bs >= batch->max_blocks_per_seq) {
            KG_LOG_ERROR("cpu", "bad batch entry %lld: token %d pos %d seq %d", (long long)t, tok,
                         pos, seq);
            return KG_ERR_INVALID;
        }
    }
    if (!batch_blocks_ok(ctx, batch)) {
        return KG_ERR_INVALID;
    }
    /* embeddings: dequantize each token's row (ggml_get_rows), then scale */
    const kg_gguf_tensor_t *emb = ctx->model->tok_embd;
    const size_t row_size = kg_type_row_size(emb->type, E);
    for (int64_t t = 0; t < T; t++) {
        kg_dequantize(emb->type, (const char *)emb->data + (size_t)batch->token[t] * row_size,
                      ctx->x + t * E, E);
        if (hp->embd_scale != 0.0f) {
            scale_rows(ctx->x + t * E, E, hp->embd_scale);
        }
    }
    /* the angles of every distinct RoPE of the layers */
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        const cpu_rope_t *rp = &ctx->ropes[r];
        for (int64_t t = 0; t < T; t++) {
            float *cs = ctx->rope_cs + (r * T + t) * hp->n_rot;
            kg_rope_cache_yarn(batch->pos[t], hp->n_rot, rp->base, rp->scale, ctx->rope_freqs,
                               hp->yarn_ext_factor, hp->yarn_attn_factor, rp->corr_dims, cs,
                               cs + hp->n_rot / 2);
        }
    }

    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cpu_layer_t *L = &ctx->layers[il];
        const float *cs = ctx->rope_cs + (int64_t)L->rope * T * hp->n_rot;
        cpu_rmsnorm_rows(ctx->x, L->attn_norm.data, ctx->xn, T, E, hp->norm_eps);
        const cpu_weight_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[3] = {ctx->q, ctx->k, ctx->v};
        matmul_n(ctx, 3, qkv, ctx->xn, qkv_out, T);
        add_bias(ctx->q, &L->bq, T, n_q);
        add_bias(ctx->k, &L->bk, T, n_kv);
        add_bias(ctx->v, &L->bv, T, n_kv);
        if (L->q_norm.data) { /* build_norm on (head_dim, n_head, T) */
            cpu_rmsnorm_rows(ctx->q, L->q_norm.data, ctx->q, T * hp->n_head, hp->head_dim,
                             hp->norm_eps);
            cpu_rmsnorm_rows(ctx->k, L->k_norm.data, ctx->k, T * hp->n_head_kv, hp->head_dim,
                             hp->norm_eps);
        }
        rope_rows(ctx, ctx->q, T, hp->n_head, cs);
        rope_rows(ctx, ctx->k, T, hp->n_head_kv, cs);
        if (hp->q_scale != 0.0f) {
            scale_rows(ctx->q, T * n_q, hp->q_scale);
        }
        cpu_round_fp16(ctx->q, T * n_q); /* ggml converts q to fp16 for the K matmul */
        for (int64_t t = 0; t < T; t++) {
            const int32_t pos = batch->pos[t];
            const int32_t blk =
                batch->block_table[(int64_t)batch->seq[t] * batch->max_blocks_per_seq + pos / bs];
            const int64_t row = (int64_t)blk * bs + pos % bs;
            cpu_fp32_to_fp16(ctx->k + t * n_kv, ctx->k_cache[il] + row * n_kv, n_kv);
            cpu_fp32_to_fp16(ctx->v + t * n_kv, ctx->v_cache[il] + row * n_kv, n_kv);
        }
        attention(ctx, il, batch);
        matmul(ctx, &L->wo, ctx->att, ctx->tmp, T);
        add_bias(ctx->tmp, &L->bo, T, E);
        if (L->attn_post_norm.data) {
            cpu_rmsnorm_rows(ctx->tmp, L->attn_post_norm.data, ctx->tmp, T, E, hp->norm_eps);
        }
        for (int64_t i = 0; i < T * E; i++) {
            ctx->x[i] += ctx->tmp[i];
        }

        cpu_rmsnorm_rows(ctx->x, L->ffn_norm.data, ctx->xn, T, E, hp->norm_eps);
        if (L->moe) {
            moe_ffn(ctx, L, T);
        } else {
            const cpu_weight_t *gate_up[2] = {&L->w_gate, &L->w_up};
            float *const gate_up_out[2] = {ctx->gate, ctx->up};
            matmul_n(ctx, 2, gate_up, ctx->xn, gate_up_out, T);
            if (hp->ffn_act == KG_FFN_GELU) {
                cpu_geglu(ctx->gelu_table, ctx->gate, ctx->up, ctx->gate, T * F);
            } else {
                for (int64_t i = 0; i < T * F; i++) {
                    ctx->gate[i] = kg_silu(ctx->gate[i]) * ctx->up[i];
                }
            }
            matmul(ctx, &L->w_down, ctx->gate, ctx->tmp, T);
        }
        if (L->ffn_post_norm.data) {
            cpu_rmsnorm_rows(ctx->tmp, L->ffn_post_norm.data, ctx->tmp, T, E, hp->norm_eps);
        }
        for (int64_t i = 0; i < T * E; i++) {
            ctx->x[i] += ctx->tmp[i];
        }
    }

    /* head: only the rows that want logits, gathered in token order */
    int64_t n_out = 0;
    for (int64_t t = 0; t < T; t++) {
        if (batch->want_logits[t]) {
            memmove(ctx->xn + n_out * E, ctx->x + t * E, (size_t)E * sizeof(float));
            n_out++;
        }
    }
    if (n_out != batch->n_outputs) {
        KG_LOG_ERROR("cpu", "batch says %d outputs, want_logits has %lld", batch->n_outputs,
                     (long long)n_out);
        return KG_ERR_INVALID;
    }
    if (n_out > 0) {
        cpu_rmsnorm_rows(ctx->xn, ctx->output_norm.data, ctx->xn, n_out, E, hp->norm_eps);
        matmul(ctx, &ctx->output, ctx->xn, logits, n_out);
        add_bias(logits, &ctx->output_b, n_out, hp->n_vocab);
        if (hp->final_softcap != 0.0f) {
            for (int64_t i = 0; i < n_out * hp->n_vocab; i++) {
                logits[i] = kg_softcap(logits[i], hp->final_softcap);
            }
        }
    }
    return KG_OK;
}

/* KV blocks src[i] -> dst[i]: block_size rows of K and of V per layer. */
static kg_status_t
cpu_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    cpu_ctx_t *ctx = be->ctx;
    const size_t rows = (size_t)ctx->block_size;
    const size_t n_kv = (size_t)ctx->hp.n_head_kv * (size_t)ctx->hp.head_dim;
    const size_t block = rows * n_kv; /* fp16 values per block and layer */
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= ctx->n_kv_blocks || dst[i] < 0 || dst[i] >= ctx->n_kv_blocks ||
            src[i] == dst[i]) {
            return KG_ERR_INVALID;
        }
    }
    for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
        for (int32_t i = 0; i < n; i++) {
            memcpy(ctx->k_cache[il] + (size_t)dst[i] * block,
                   ctx->k_cache[il] + (size_t)src[i] * block, block * sizeof(uint16_t));
            memcpy(ctx->v_cache[il] + (size_t)dst[i] * block,
                   ctx->v_cache[il] + (size_t)src[i] * block, block * sizeof(uint16_t));
        }
    }
    return KG_OK;
}

static const struct kg_backend_i cpu_iface = {
    /* .name    = */ "cpu",
    /* .free    = */ cpu_free,
    /* .forward = */ cpu_forward,
    /* .memory  = */ cpu_memory,
};

kg_backend_t *kg_backend_cpu_new(const kg_model_t *model,
                                 const kg_backend_params_t *params,
                                 char *errstr,
                                 size_t errstr_size) {
    kg_backend_t *be = calloc(1, sizeof(*be));
    cpu_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (!be || !ctx) {
        free(be);
        free(ctx);
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return NULL;
    }
    be->iface = cpu_iface;
    be->ctx = ctx;
    be->kv_copy = cpu_kv_copy;
    const kg_hparams_t *hp = &model->hp;
    ctx->model = model;
    ctx->hp = *hp;
    ctx->n_threads = params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ctx->pool = kg_pool_new(ctx->n_threads);
    if (!ctx->pool) {
        snprintf(errstr, errstr_size, "cpu backend: cannot start %d threads", ctx->n_threads);
        goto fail;
    }
    ctx->n_kv_blocks = params->n_kv_blocks;
    ctx->block_size = params->kv_block_size;
    ctx->max_tokens = params->max_batch_tokens;
    if (ctx->n_kv_blocks <= 0 || ctx->block_size <= 0 || ctx->max_tokens <= 0) {
        snprintf(errstr, errstr_size,
                 "cpu backend: KV blocks, block size and batch tokens must be > 0");
        goto fail;
    }

    ctx->layers = calloc((size_t)hp->n_layer, sizeof(*ctx->layers));
    if (!ctx->layers) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *src = &model->layers[il];
        cpu_layer_t *L = &ctx->layers[il];
        if (!weight_init(&L->attn_norm, src->attn_norm, ctx, errstr, errstr_size) ||
            !weight_init(&L->ffn_norm, src->ffn_norm, ctx, errstr, errstr_size) ||
            !weight_init(&L->wq, src->wq, ctx, errstr, errstr_size) ||
            !weight_init(&L->wk, src->wk, ctx, errstr, errstr_size) ||
            !weight_init(&L->wv, src->wv, ctx, errstr, errstr_size) ||
            !weight_init(&L->wo, src->wo, ctx, errstr, errstr_size)) {
            goto fail;
        }
        if (src->ffn_gate_inp) {
            if (!moe_layer_init(L, src, ctx, errstr, errstr_size)) {
                goto fail;
            }
        } else if (!weight_init(&L->w_gate, src->w_gate, ctx, errstr, errstr_size) ||
                   !weight_init(&L->w_up, src->w_up, ctx, errstr, errstr_size) ||
                   !weight_init(&L->w_down, src->w_down, ctx, errstr, errstr_size)) {
            goto fail;
        }
        const kg_gguf_tensor_t *opt_src[] = {src->bq,
                                             src->bk,
                                             src->bv,
                                             src->bo,
                                             src->q_norm,
                                             src->k_norm,
                                             src->attn_post_norm,
                                             src->ffn_post_norm,
                                             src->attn_sinks};
        cpu_weight_t *opt_dst[] = {&L->bq,
                                   &L->bk,
                                   &L->bv,
                                   &L->bo,
                                   &L->q_norm,
                                   &L->k_norm,
                                   &L->attn_post_norm,
                                   &L->ffn_post_norm,
                                   &L->sinks};
        for (size_t i = 0; i < sizeof(opt_src) / sizeof(opt_src[0]); i++) {
            if (opt_src[i] && !weight_init(opt_dst[i], opt_src[i], ctx, errstr, errstr_size)) {
                goto fail;
            }
        }
        if (!add_rope(ctx, src->rope_base, src->rope_scale, &L->rope)) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            goto fail;
        }
        if (src->n_swa <= 0) {
            ctx->max_window = -1; /* a global layer: every position stays needed */
        } else if (ctx->max_window >= 0 && src->n_swa > ctx->max_window) {
            ctx->max_window = src->n_swa;
        }
    }
    ctx->max_window = ctx->max_window < 0 ? 0 : ctx->max_window;
    if (!weight_init(&ctx->output_norm, model->output_norm, ctx, errstr, errstr_size) ||
        !weight_init(&ctx->output, model->output, ctx, errstr, errstr_size)) {
        goto fail;
    }
    if (model->output_b &&
        !weight_init(&ctx->output_b, model->output_b, ctx, errstr, errstr_size)) {
        goto fail;
    }
    const kg_gguf_tensor_t *factors = kg_model_rope_factors(
        model, params->max_seq_len > 0 ? params->max_seq_len : hp->n_ctx_train);
    if (factors) {
        ctx->rope_freqs = malloc((size_t)hp->n_rot / 2 * sizeof(float));
        if (!ctx->rope_freqs) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            goto fail;
        }
        kg_dequantize(factors->type, factors->data, ctx->rope_freqs, hp->n_rot / 2);
    }
    if (hp->ffn_act == KG_FFN_GELU) {
        ctx->gelu_table = malloc(65536 * sizeof(uint16_t));
        if (!ctx->gelu_table) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            goto fail;
        }
        cpu_gelu_table_init(ctx->gelu_table);
    }

    const size_t kv_rows = (size_t)ctx->n_kv_blocks * (size_t)ctx->block_size;
    const size_t n_kv = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    ctx->k_cache = calloc((size_t)hp->n_layer, sizeof(uint16_t *));
    ctx->v_cache = calloc((size_t)hp->n_layer, sizeof(uint16_t *));
    if (!ctx->k_cache || !ctx->v_cache) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        ctx->k_cache[il] = calloc(kv_rows * n_kv, sizeof(uint16_t));
        ctx->v_cache[il] = calloc(kv_rows * n_kv, sizeof(uint16_t));
        if (!ctx->k_cache[il] || !ctx->v_cache[il]) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory for the KV cache (%zu MiB)",
                     (2 * kv_rows * n_kv * sizeof(uint16_t) * (size_t)hp->n_layer) >> 20);
            goto fail;
        }
        ctx->kv_size += 2 * kv_rows * n_kv * sizeof(uint16_t);
    }

    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd;
    /* the dense FFN's width; a model whose every layer has experts has none */
    size_t F = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        F = ctx->layers[il].moe ? F : (size_t)hp->n_ff;
    }
    const size_t FX = (size_t)hp->n_ff_exp, TK = T * (size_t)hp->n_expert_used;
    const size_t n_q = (size_t)hp->n_head * (size_t)hp->head_dim;
    size_t widest = E > F ? E : F;
    widest = widest > n_q ? widest : n_q;
    widest = widest > FX ? widest : FX;
    bool ok = true;
    ctx->x = scratch(ctx, T * E, &ok);
    ctx->xn = scratch(ctx, T * E, &ok);
    ctx->xr = scratch(ctx, T * widest, &ok);
    ctx->q = scratch(ctx, T * n_q, &ok);
    ctx->k = scratch(ctx, T * n_kv, &ok);
    ctx->v = scratch(ctx, T * n_kv, &ok);
    ctx->att = scratch(ctx, T * n_q, &ok);
    ctx->gate = scratch(ctx, T * F, &ok);
    ctx->up = scratch(ctx, T * F, &ok);
    ctx->tmp = scratch(ctx, T * E, &ok);
    ctx->rope_cs = scratch(ctx, (size_t)ctx->n_ropes * T * (size_t)hp->n_rot, &ok);
    ctx->scores = scratch(ctx, (size_t)ctx->n_threads * kv_rows, &ok);
    ok = ok && cpu_qact_init(&ctx->qact, (int64_t)T, (int64_t)widest);
    ctx->scratch_size += cpu_qact_size((int64_t)T, (int64_t)widest);
    ctx->qscratch = ok ? cpu_qgemm_scratch_new(ctx->n_threads, (int64_t)widest) : NULL;
    ok = ok && ctx->qscratch;
    if (ok) {
        ctx->scratch_size += cpu_qgemm_scratch_size(ctx->qscratch);
    }
    if (hp->n_expert > 0) {
        ctx->moe_logits = scratch(ctx, T * (size_t)hp->n_expert, &ok);
        ctx->moe_x = scratch(ctx, TK * E, &ok);
        ctx->moe_g = scratch(ctx, TK * FX, &ok);
        ctx->moe_u = scratch(ctx, TK * FX, &ok);
        ctx->moe_y = scratch(ctx, TK * E, &ok);
        ctx->moe_xr = scratch(ctx, TK * (E > FX ? E : FX), &ok);
        ctx->moe_active = calloc((size_t)hp->n_expert, sizeof(*ctx->moe_active));
        ok = ok && ctx->moe_active;
        ctx->moe_tokens = calloc((size_t)hp->n_expert, sizeof(*ctx->moe_tokens));
        ok = ok && ctx->moe_tokens &&
             cpu_moe_plan_init(&ctx->plan, hp->n_expert, hp->n_expert_used, ctx->max_tokens);
        ctx->moe_stats.n_expert = hp->n_expert;
        ctx->moe_stats.n_expert_used = hp->n_expert_used;
        be->moe_stats = cpu_moe_stats;
        ctx->moe_qact = calloc((size_t)ctx->n_threads, sizeof(*ctx->moe_qact));
        ok = ok && ctx->moe_qact;
        for (int i = 0; ok && i < ctx->n_threads; i++) {
            ok = cpu_qact_init(&ctx->moe_qact[i], (int64_t)T, (int64_t)(E > FX ? E : FX));
            ctx->scratch_size += cpu_qact_size((int64_t)T, (int64_t)(E > FX ? E : FX));
        }
    }
    if (!ok) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory for scratch buffers");
        goto fail;
    }
    KG_LOG_DEBUG("cpu", "backend ready threads=%d weights_mib=%zu kv_mib=%zu", ctx->n_threads,
                 ctx->weights_size >> 20, ctx->kv_size >> 20);
    return be;
fail:
    cpu_free(be);
    return NULL;
}
