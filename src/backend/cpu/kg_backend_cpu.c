/* kg_backend_cpu: the reference backend. Runs one step batch through the
 * Llama graph with one GEMM per weight matrix over all the step's tokens.
 *
 * DESIGN
 * Weights. F32, F16 and BF16 matrices are packed once at load into
 * cpu_gemm's panels in their storage type (a decode step streams every
 * weight, so half-precision weights halve its bytes), and the file's pages
 * are released. Quantized matrices (every GGUF block type kg_quant reads)
 * stay where they are, in the read-only mapping of the file: cpu_vecdot
 * multiplies their blocks directly by activations quantized as ggml
 * quantizes them for that type (Q8_0, Q8_1 or Q8_K blocks), with exact
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
 * Step. x = embed(tokens); per layer: rmsnorm, Q/K/V GEMMs, RoPE, K/V rows
 * written to their blocks, attention of every token over its own sequence's
 * positions [0, pos] (parallel over tokens x heads), output GEMM + residual,
 * rmsnorm, gate/up GEMMs, SwiGLU, down GEMM + residual; then the final norm
 * and the head only for the rows that want logits. Each token's row is
 * computed independently of the others in the batch, so a sequence's
 * results do not depend on what shares its step. */
#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_quant.h"
#include "../kg_backend_impl.h"
#include "../kg_math.h"
#include "cpu_attn.h"
#include "cpu_gemm.h"
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
} cpu_layer_t;

typedef struct cpu_ctx {
    const kg_model_t *model;
    kg_hparams_t hp;
    int n_threads;
    kg_pool_t *pool; /* n_threads workers for attention */
    int32_t n_kv_blocks, block_size, max_tokens;
    cpu_layer_t *layers;      /* (n_layer) */
    cpu_weight_t output_norm; /* (n_embd) */
    cpu_weight_t output;      /* (n_vocab, n_embd) */
    float *rope_freqs;        /* (n_rot / 2) or NULL */
    uint16_t **k_cache; /* (n_layer) x (n_kv_blocks * block_size, n_head_kv * head_dim) fp16 */
    uint16_t **v_cache; /* same shape as k_cache */
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
    float *rope_cs;  /* (T, n_rot) cos | sin per token */
    float *scores;   /* (n_threads, n_kv_blocks * block_size) */
    cpu_qact_t qact; /* (T, widest) activations quantized for cpu_vecdot */
    cpu_qgemm_scratch_t *qscratch; /* cpu_vecdot's per-thread unpacked panels */
    size_t weights_size, kv_size, scratch_size;
} cpu_ctx_t;

// ---- weights ----

static bool weight_init(
    cpu_weight_t *w, const kg_gguf_tensor_t *t, cpu_ctx_t *ctx, char *errstr, size_t errstr_size) {
    w->n_in = t->ne[0];
    w->n_out = t->n_dims > 1 ? t->ne[1] : 1;
    w->type = t->type;
    if (t->n_dims > 1 && kg_type_is_quantized(t->type)) {
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

// ---- lifecycle ----

static void cpu_free(kg_backend_t *be) {
    cpu_ctx_t *ctx = be->ctx;
    if (ctx) {
        if (ctx->layers) {
            for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
                cpu_layer_t *L = &ctx->layers[il];
                cpu_weight_t *ws[] = {&L->attn_norm, &L->ffn_norm, &L->wq,   &L->wk,    &L->wv,
                                      &L->wo,        &L->w_gate,   &L->w_up, &L->w_down};
                for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
                    weight_clear(ws[i]);
                }
            }
        }
        weight_clear(&ctx->output_norm);
        weight_clear(&ctx->output);
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
        float *bufs[] = {ctx->x,   ctx->xn,   ctx->xr, ctx->q,   ctx->k,       ctx->v,
                         ctx->att, ctx->gate, ctx->up, ctx->tmp, ctx->rope_cs, ctx->scores};
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
 * their input, with in rounded (float types) or quantized (block types)
 * for their type: one hand-off to the pool when they share a path (Q, K
 * and V; gate and up). */
static void matmul_n(cpu_ctx_t *ctx,
                     int n,
                     const cpu_weight_t *const *ws,
                     const float *in,
                     float *const *outs,
                     int64_t T) {
    const cpu_gemm_weights_t *packed[CPU_GEMM_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        if (!same_path(ws[i], ws[0])) {
            for (int r = 0; r < n; r++) {
                matmul_n(ctx, 1, &ws[r], in, &outs[r], T);
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
        cpu_quant_act(ws[0]->q.tr->act, in, T, ws[0]->n_in, &ctx->qact);
        cpu_qgemm(ctx->pool, ctx->qscratch, &ctx->qact, n, qm, outs);
        return;
    }
    const float *a = in;
    if (cpu_round_activations(ws[0]->type, in, ctx->xr, T, ws[0]->n_in)) {
        a = ctx->xr;
    }
    cpu_gemm_multi(ctx->pool, a, T, n, packed, outs);
}

static void matmul(cpu_ctx_t *ctx, const cpu_weight_t *w, const float *in, float *out, int64_t T) {
    matmul_n(ctx, 1, &w, in, &out, T);
}

static void rope_rows(cpu_ctx_t *ctx, float *x, int64_t T, int32_t n_heads) {
    const int32_t hd = ctx->hp.head_dim, half = ctx->hp.n_rot / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = ctx->rope_cs + t * ctx->hp.n_rot;
        for (int32_t h = 0; h < n_heads; h++) {
            float *row = x + (t * n_heads + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                kg_rope_pair(&row[2 * i], &row[2 * i + 1], cs[i], cs[half + i]);
            }
        }
    }
}

/* Attention of every token over its sequence's cached positions [0, pos]:
 * softmax(q·k * scale) · v per head, with q and the probabilities rounded to
 * fp16 as ggml does before its fp16 K/V matmuls. One task = one (token, head). */
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
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t max_pos = (int64_t)ctx->n_kv_blocks * bs;

    const int64_t t = w / hp->n_head;
    const int32_t h = (int32_t)(w % hp->n_head), g = h / group;
    const int32_t n_pos = batch->pos[t] + 1;
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
    cpu_attn_head(q, &kv, n_pos, hd, scale, s, out);
}

static void attention(cpu_ctx_t *ctx, int32_t il, const kg_step_batch_t *batch) {
    attn_job_t job = {.ctx = ctx, .il = il, .batch = batch};
    const int64_t n_work = (int64_t)batch->n_tokens * ctx->hp.n_head;
    /* waking the pool costs microseconds: tiny attention runs inline */
    int64_t flops = 0;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        flops += (int64_t)(batch->pos[t] + 1) * ctx->hp.n_head * ctx->hp.head_dim;
    }
    if (flops < 65536) {
        for (int64_t w = 0; w < n_work; w++) {
            attention_task(&job, w, 0);
        }
        return;
    }
    kg_pool_run(ctx->pool, n_work, attention_task, &job);
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
    /* embeddings: dequantize each token's row */
    const kg_gguf_tensor_t *emb = ctx->model->tok_embd;
    const size_t row_size = kg_type_row_size(emb->type, E);
    for (int64_t t = 0; t < T; t++) {
        kg_dequantize(emb->type, (const char *)emb->data + (size_t)batch->token[t] * row_size,
                      ctx->x + t * E, E);
        kg_rope_cache(batch->pos[t], hp->n_rot, hp->rope_base, hp->rope_scale, ctx->rope_freqs,
                      ctx->rope_cs + t * hp->n_rot, ctx->rope_cs + t * hp->n_rot + hp->n_rot / 2);
    }

    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cpu_layer_t *L = &ctx->layers[il];
        cpu_rmsnorm_rows(ctx->x, L->attn_norm.data, ctx->xn, T, E, hp->norm_eps);
        const cpu_weight_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[3] = {ctx->q, ctx->k, ctx->v};
        matmul_n(ctx, 3, qkv, ctx->xn, qkv_out, T);
        rope_rows(ctx, ctx->q, T, hp->n_head);
        rope_rows(ctx, ctx->k, T, hp->n_head_kv);
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
        for (int64_t i = 0; i < T * E; i++) {
            ctx->x[i] += ctx->tmp[i];
        }

        cpu_rmsnorm_rows(ctx->x, L->ffn_norm.data, ctx->xn, T, E, hp->norm_eps);
        const cpu_weight_t *gate_up[2] = {&L->w_gate, &L->w_up};
        float *const gate_up_out[2] = {ctx->gate, ctx->up};
        matmul_n(ctx, 2, gate_up, ctx->xn, gate_up_out, T);
        for (int64_t i = 0; i < T * F; i++) {
            ctx->gate[i] = kg_silu(ctx->gate[i]) * ctx->up[i];
        }
        matmul(ctx, &L->w_down, ctx->gate, ctx->tmp, T);
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
            !weight_init(&L->wo, src->wo, ctx, errstr, errstr_size) ||
            !weight_init(&L->w_gate, src->w_gate, ctx, errstr, errstr_size) ||
            !weight_init(&L->w_up, src->w_up, ctx, errstr, errstr_size) ||
            !weight_init(&L->w_down, src->w_down, ctx, errstr, errstr_size)) {
            goto fail;
        }
    }
    if (!weight_init(&ctx->output_norm, model->output_norm, ctx, errstr, errstr_size) ||
        !weight_init(&ctx->output, model->output, ctx, errstr, errstr_size)) {
        goto fail;
    }
    if (model->rope_freqs) {
        ctx->rope_freqs = malloc((size_t)hp->n_rot / 2 * sizeof(float));
        if (!ctx->rope_freqs) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            goto fail;
        }
        kg_dequantize(model->rope_freqs->type, model->rope_freqs->data, ctx->rope_freqs,
                      hp->n_rot / 2);
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

    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    const size_t n_q = (size_t)hp->n_head * (size_t)hp->head_dim;
    size_t widest = E > F ? E : F;
    widest = widest > n_q ? widest : n_q;
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
    ctx->rope_cs = scratch(ctx, T * (size_t)hp->n_rot, &ok);
    ctx->scores = scratch(ctx, (size_t)ctx->n_threads * kv_rows, &ok);
    ok = ok && cpu_qact_init(&ctx->qact, (int64_t)T, (int64_t)widest);
    ctx->scratch_size += cpu_qact_size((int64_t)T, (int64_t)widest);
    ctx->qscratch = ok ? cpu_qgemm_scratch_new(ctx->n_threads, (int64_t)widest) : NULL;
    ok = ok && ctx->qscratch;
    if (ok) {
        ctx->scratch_size += cpu_qgemm_scratch_size(ctx->qscratch);
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
