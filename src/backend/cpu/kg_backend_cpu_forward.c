/* kg_backend_cpu_forward: the CPU backend's step, one step batch through
 * every layer with one GEMM per weight matrix over all the step's tokens
 * (the weights, the KV pool and the buffers it uses are kg_backend_cpu.c's).
 *
 * DESIGN
 * Step. x = embed(tokens) (times the embedding scale: gemma, granite); per
 * layer: rmsnorm (none: olmo2), Q/K/V GEMMs (+ biases: qwen2), per-head
 * Q/K RMSNorm (qwen3, gemma3, apertus; over all heads: olmo2), RoPE with
 * the layer's base and scale (normal or NeoX pairs, YaRN, LongRoPE factors;
 * none in a NoPE layer: smollm3), Q/K L2 norms after it (llama4), the attention
 * temperature (mistral3; llama4 on its NoPE layers), the query scale (gemma, phi3), K/V rows
 * written to their blocks, attention of every token over its own sequence's positions [0, pos], or
 * the last n_swa of them in a windowed layer (llama4: its chunk) (a non-causal model,
 * gemma-embedding: over its whole input, which the engine runs in one step, or within n_swa / 2
 * either side in a windowed layer) (with llama.cpp's soft_max arithmetic, cpu_attn.h; an embedding
 * input's tokens with ggml-cpu's flash attention arithmetic, cpu_attn_flash.h,
 * as llama.cpp computes embeddings) (soft-capped scores: gemma2; granite's attention scale;
 * parallel over tokens x heads; times sigmoid of the query's output gate: qwen35, whose attn_q
 * gives each head's query and gate), output GEMM (+ post-norm: gemma, olmo2) (x residual scale:
 * granite) + residual, rmsnorm, gate/up GEMMs, SwiGLU or GeGLU (or the up GEMM alone and xIELU:
 * apertus), down GEMM (+ post-norm) + residual; then the final norm and the head only for the rows
 * that want logits (+ bias, / logit scale: granite, soft-capping); the normed rows themselves for
 * those that want hidden states. Each token's row is computed independently of the others in the
 * batch, so a sequence's results do not depend on what shares its step. The llama.cpp ops each step
 * mirrors are named where they are done.
 *
 * Experts. A mixture-of-experts layer replaces the gate/up/down GEMMs with
 * cpu_moe's plan: the router's logits (one GEMM; + bias: gpt-oss), each
 * token's k experts and weights, the rows gathered by expert, then per
 * active expert one gate/up GEMM and one down GEMM over its group (its
 * packed matrices are weights like any other: cpu_matmul_n_on, so the
 * activation rounding and the kernels are the dense path's; many small
 * groups run side by side, one pool task each), the expert biases and
 * the gate (SwiGLU, or gpt-oss's clamped one), and the weighted sum in rank
 * order (see cpu_moe.h for why a token's bits do not depend on its
 * neighbours; llama4 weighs each expert's input instead); glm4moe's shared expert, a dense
 * SwiGLU FFN on the same input, adds its output to that sum. Gemma 4's MoE layers keep their
 * dense MLP beside the experts, each branch with its own norms, and route
 * on a scaled, unweighted RMSNorm of the residual (gemma4_moe_ffn). LoRA adapters add their deltas
 * after the q/k/v, output, gate/up and down GEMMs (cpu_lora.h). Attention sinks (gpt-oss) add one
 * logit per head to the softmax. The expert load is counted for kg_backend_moe_stats. */
#include "../../core/kg_log.h"
#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_attn.h"
#include "cpu_attn_flash.h"
#include "cpu_lora.h"
#include "cpu_ops.h"
#include "cpu_recurrent.h"
#include "cpu_rows.h"
#include "kg_backend_cpu_int.h"

#include <math.h>
#include <string.h>

// ---- forward ----

/* cpu_matmul_n (cpu_matmul.c) over the backend's pool and scratch. */
static void matmul_n(cpu_ctx_t *ctx,
                     int n,
                     const cpu_weight_t *const *ws,
                     const float *in,
                     float *const *outs,
                     int64_t T) {
    cpu_matmul_n(ctx, n, ws, in, outs, T);
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

/* RoPE (ggml_rope_ext) on the first n_rot dims of every head of hd; the
 * rest of a head passes through. Normal mode rotates adjacent pairs (2i,
 * 2i+1), NeoX mode pairs i with i + n_rot/2; pair i takes angle i of the
 * cache (rope_stride floats per token). */
static void rope_rows(cpu_ctx_t *ctx,
                      float *x,
                      int64_t T,
                      int32_t n_heads,
                      int32_t hd,
                      int32_t n_rot,
                      const float *cs_all) {
    const int32_t half = n_rot / 2;
    const bool neox = ctx->hp.rope_mode == KG_ROPE_MODE_NEOX;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cs_all + t * ctx->rope_stride;
        for (int32_t h = 0; h < n_heads; h++) {
            float *row = x + (t * n_heads + h) * hd;
            for (int64_t i = 0; i < half; i++) {
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

/* One past the last position of token t's input in this step: a non-causal
 * model's input is one run of consecutive tokens from position 0
 * (cpu_backend_forward checks it), so the run's remaining tokens say. */
static int32_t input_end(const kg_step_batch_t *batch, int64_t t) {
    int64_t u = t + 1;
    while (u < batch->n_tokens && batch->seq[u] == batch->seq[t]) {
        u++;
    }
    return batch->pos[t] + (int32_t)(u - t);
}

static void attention_task(void *arg, int64_t w, int thread) {
    const attn_job_t *job = arg;
    cpu_ctx_t *ctx = job->ctx;
    const kg_step_batch_t *batch = job->batch;
    const kg_hparams_t *hp = &ctx->hp;
    const kg_layer_weights_t *ML = &ctx->model->layers[job->il];
    const int32_t hd = ML->head_dim, n_kv_dim = ML->n_head_kv * hd;
    const int32_t group = hp->n_head / ML->n_head_kv, bs = ctx->block_size;
    /* llama scales the scores (by attention.scale where granite's file gives
     * one); gemma and phi3 scaled q already (kq_scale 1) */
    const float scale = hp->q_scale != 0.0f    ? 1.0f
                        : hp->kq_scale != 0.0f ? hp->kq_scale
                                               : 1.0f / sqrtf((float)hd);
    const int32_t n_swa = ctx->model->layers[job->il].n_swa;
    const int64_t max_pos = (int64_t)ctx->n_kv_blocks * bs;

    const int64_t t = w / hp->n_head;
    const int32_t h = (int32_t)(w % hp->n_head), g = h / group;
    int32_t n_pos = batch->pos[t] + 1;
    int32_t p0 = n_swa > 0 && n_pos > n_swa ? n_pos - n_swa : 0;
    if (hp->swa_chunked && n_swa > 0) { /* llama4: the token's own chunk */
        p0 = batch->pos[t] - batch->pos[t] % n_swa;
    }
    if (hp->non_causal) {
        /* the whole input, in this step (the engine runs it whole): every
         * position up to its last token's, or within n_swa / 2 either side
         * in a windowed layer (llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC) */
        const int32_t half = n_swa / 2, pos = batch->pos[t];
        n_pos = input_end(batch, t);
        p0 = n_swa > 0 && pos > half ? pos - half : 0;
        n_pos = n_swa > 0 && n_pos > pos + half + 1 ? pos + half + 1 : n_pos;
    }
    const int32_t *table = batch->block_table + (int64_t)batch->seq[t] * batch->max_blocks_per_seq;
    float *s = ctx->scores + (int64_t)thread * max_pos;
    float *q = ctx->q + (t * hp->n_head + h) * hd;
    float *out = ctx->att + (t * hp->n_head + h) * hd;

    /* a Gemma 4 shared-KV layer reads an earlier layer's cache */
    const cpu_kv_view_t kv = {.k = ctx->k_cache[ML->kv_layer],
                              .v = ctx->v_cache[ML->kv_layer],
                              .stride = n_kv_dim,
                              .offset = (int64_t)g * hd,
                              .table = table,
                              .block_size = bs};
    const cpu_weight_t *sinks = &ctx->layers[job->il].sinks;
    const int32_t flash_len = batch->flash_len ? batch->flash_len[t] : 0;
    if (flash_len > 0 && !sinks->data) {
        /* an embedding input: llama.cpp's flash attention arithmetic, its
         * kernel chosen by the input's length as llama.cpp's by the ubatch's
         * (the input's one ubatch) */
        cpu_attn_head_flash(
            q, &kv, p0, n_pos, hd, scale, hp->attn_softcap, flash_len >= CPU_FLASH_TILE,
            ctx->flash + (int64_t)thread * cpu_attn_flash_scratch(ctx->max_head_dim), out);
        return;
    }
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
                 ctx->model->layers[il].head_dim;
    }
    if (flops < 65536) {
        for (int64_t w = 0; w < n_work; w++) {
            attention_task(&job, w, 0);
        }
        return;
    }
    kg_pool_run(ctx->pool, n_work, attention_task, &job);
}

/* RoPE on the n_rot dims at `off` of each of a token's n_heads rows of
 * `hs` floats (MLA: the rope part of a query head, the latent row's key
 * dims). */
static void rope_part(cpu_ctx_t *ctx,
                      float *x,
                      int64_t T,
                      int32_t n_heads,
                      int64_t hs,
                      int64_t off,
                      const float *cs_all) {
    const int32_t half = ctx->hp.n_rot / 2;
    const bool neox = ctx->hp.rope_mode == KG_ROPE_MODE_NEOX;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cs_all + t * ctx->hp.n_rot;
        for (int32_t h = 0; h < n_heads; h++) {
            float *row = x + (t * n_heads + h) * hs + off;
            for (int64_t i = 0; i < half; i++) {
                float *a = neox ? &row[i] : &row[2 * i];
                float *b = neox ? &row[i + half] : &row[2 * i + 1];
                kg_rope_pair(a, b, cs[i], cs[half + i]);
            }
        }
    }
}

/* One (token, head) of the absorbed MLA attention: the head's latent query
 * (ctx->q, head_dim = n_lora_kv + n_rot) over the layer's latent rows, the
 * latent-space values into ctx->att (n_lora_kv per head). */
static void mla_attention_task(void *arg, int64_t w, int thread) {
    const attn_job_t *job = arg;
    cpu_ctx_t *ctx = job->ctx;
    const kg_step_batch_t *batch = job->batch;
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t D = hp->head_dim, R = hp->n_lora_kv, H = hp->n_head;
    const int64_t t = w / H;
    const int32_t h = (int32_t)(w % H);
    const int32_t *table = batch->block_table + (int64_t)batch->seq[t] * batch->max_blocks_per_seq;
    const cpu_kv_view_t kv = {.k = ctx->k_cache[job->il],
                              .v = ctx->k_cache[job->il],
                              .stride = D,
                              .offset = 0,
                              .table = table,
                              .block_size = ctx->block_size};
    float *s = ctx->scores + (int64_t)thread * ctx->n_kv_blocks * ctx->block_size;
    cpu_attn_head_mla(ctx->q + (t * H + h) * D, &kv, batch->pos[t] + 1, D, R, hp->mla_kq_scale, s,
                      ctx->att + (t * H + h) * R);
}

/* One GEMM per head: y[t, h] (n_out) = w[h] · x[t, h] (n_in), x and y
 * rows at the given strides (floats per token, per head). */
typedef struct mla_heads_job {
    cpu_ctx_t *ctx;
    const cpu_weight_t *w; /* (n_head) */
    const float *x;
    float *y;
    int64_t T, n_in, n_out, x_tok, x_head, y_tok, y_head;
} mla_heads_job_t;

/* Head h's GEMM on `pool` (NULL: this thread alone, in head h's own rows
 * of mla_hin / mla_hout and this thread's rounding buffers). */
static void mla_head(const mla_heads_job_t *j, kg_pool_t *pool, int thread, int64_t h) {
    cpu_ctx_t *ctx = j->ctx;
    const kg_hparams_t *hp = &ctx->hp;
    int64_t W = hp->mla_k - hp->n_rot > hp->n_lora_kv ? hp->mla_k - hp->n_rot : hp->n_lora_kv;
    W = W > hp->mla_v ? W : hp->mla_v;
    float *in = ctx->mla_hin + h * j->T * W, *out = ctx->mla_hout + h * j->T * W;
    for (int64_t t = 0; t < j->T; t++) {
        memcpy(in + t * j->n_in, j->x + t * j->x_tok + h * j->x_head,
               (size_t)j->n_in * sizeof(float));
    }
    const cpu_weight_t *w = &j->w[h];
    if (pool) {
        matmul_n(ctx, 1, &w, in, &out, j->T);
    } else {
        cpu_matmul_n_on(ctx, NULL, thread, ctx->mla_xr + (int64_t)thread * j->T * W,
                        &ctx->mla_qact[thread], 1, &w, in, &out, j->T);
    }
    for (int64_t t = 0; t < j->T; t++) {
        memcpy(j->y + t * j->y_tok + h * j->y_head, out + t * j->n_out,
               (size_t)j->n_out * sizeof(float));
    }
}

static void mla_head_task(void *arg, int64_t h, int thread) {
    mla_head(arg, NULL, thread, h);
}

/* Every head's GEMM: side by side, one pool task each, when the heads
 * keep every thread busy (decode: GEMMs of a few rows), else one after
 * another over the pool; the bits are the same either way. */
static void mla_heads(const mla_heads_job_t *j) {
    const int64_t H = j->ctx->hp.n_head;
    if (H >= j->ctx->n_threads) {
        kg_pool_run(j->ctx->pool, H, mla_head_task, (void *)j);
        return;
    }
    for (int64_t h = 0; h < H; h++) {
        mla_head(j, j->ctx->pool, 0, h);
    }
}

/* Multi-head latent attention (llama.cpp's deepseek2 graph with MLA, the
 * absorbed form for prefill and decode alike) of layer il on ctx->xn into
 * ctx->tmp: the queries (attn_q, or attn_q_a, its norm and attn_q_b), the
 * latent (attn_kv_a_mqa: kv_lora_rank normed dims, then the shared key's
 * RoPE dims), RoPE on the queries' last n_rot dims; each head's nope query
 * taken into the latent space through its k_b (one GEMM per head), the
 * latent row cached (fp16: one row per token and layer is the whole
 * cache), attention of every head over the latent rows as one shared KV
 * head, each head's result out through its v_b, then attn_output. */
static void mla_attention(cpu_ctx_t *ctx,
                          const cpu_layer_t *L,
                          int32_t il,
                          const kg_step_batch_t *batch,
                          const float *cs) {
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t T = batch->n_tokens, H = hp->n_head, D = hp->head_dim, R = hp->n_lora_kv;
    const int64_t K = hp->mla_k, nope = hp->mla_k - hp->n_rot, MV = hp->mla_v;
    const int32_t bs = ctx->block_size;
    const cpu_weight_t *ws[2] = {L->wq_a.n_out > 0 ? &L->wq_a : &L->wq, &L->wkv_a};
    float *const outs[2] = {L->wq_a.n_out > 0 ? ctx->mla_qa : ctx->mla_q, ctx->k};
    matmul_n(ctx, 2, ws, ctx->xn, outs, T);
    if (L->wq_a.n_out > 0) {
        cpu_rmsnorm_rows(ctx->mla_qa, L->q_a_norm.data, ctx->mla_qa, T, hp->n_lora_q, hp->norm_eps);
        matmul(ctx, &L->wq_b, ctx->mla_qa, ctx->mla_q, T);
    }
    for (int64_t t = 0; t < T; t++) { /* kv_cmpr = build_norm(view of the first R) */
        cpu_rmsnorm_rows(ctx->k + t * D, L->kv_a_norm.data, ctx->k + t * D, 1, R, hp->norm_eps);
    }
    rope_part(ctx, ctx->k, T, 1, D, R, cs);
    rope_part(ctx, ctx->mla_q, T, (int32_t)H, K, nope, cs);
    /* Qcur = concat(k_b · q_nope, q_pe) per head */
    const mla_heads_job_t kb = {.ctx = ctx,
                                .w = L->k_b,
                                .x = ctx->mla_q,
                                .y = ctx->q,
                                .T = T,
                                .n_in = nope,
                                .n_out = R,
                                .x_tok = H * K,
                                .x_head = K,
                                .y_tok = H * D,
                                .y_head = D};
    mla_heads(&kb);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            memcpy(ctx->q + (t * H + h) * D + R, ctx->mla_q + (t * H + h) * K + nope,
                   (size_t)hp->n_rot * sizeof(float));
        }
    }
    cpu_round_fp16(ctx->q, T * H * D); /* ggml converts q to fp16 for the K matmul */
    for (int64_t t = 0; t < T; t++) {
        const int32_t pos = batch->pos[t];
        const int32_t blk =
            batch->block_table[(int64_t)batch->seq[t] * batch->max_blocks_per_seq + pos / bs];
        const int64_t row = (int64_t)blk * bs + pos % bs;
        cpu_fp32_to_fp16(ctx->k + t * D, ctx->k_cache[il] + row * D, D);
    }
    attn_job_t job = {.ctx = ctx, .il = il, .batch = batch};
    int64_t flops = 0;
    for (int64_t t = 0; t < T; t++) {
        flops += (int64_t)(batch->pos[t] + 1) * H * D;
    }
    if (flops < 65536) { /* waking the pool costs microseconds */
        for (int64_t w = 0; w < T * H; w++) {
            mla_attention_task(&job, w, 0);
        }
    } else {
        kg_pool_run(ctx->pool, T * H, mla_attention_task, &job);
    }
    /* kqv_mla = v_b · kqv per head, then attn_output */
    const mla_heads_job_t vb = {.ctx = ctx,
                                .w = L->v_b,
                                .x = ctx->att,
                                .y = ctx->mla_att,
                                .T = T,
                                .n_in = R,
                                .n_out = MV,
                                .x_tok = H * R,
                                .x_head = R,
                                .y_tok = H * MV,
                                .y_head = MV};
    mla_heads(&vb);
    matmul(ctx, &L->wo, ctx->mla_att, ctx->tmp, T);
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
    const cpu_weight_t *gate_up[2] = {L->exp_gate ? &L->exp_gate[e] : NULL, &L->exp_up[e]};
    float *const gate_up_out[2] = {g, u};
    /* on the pool: the backend's quantized activations; alone on a pool
     * thread: that thread's own */
    cpu_qact_t *qa = pool ? &ctx->qact : &ctx->moe_qact[thread];
    const int gated = hp->ffn_act != KG_FFN_RELU_SQR; /* nemotron_h_moe: up only */
    cpu_matmul_n_on(ctx, pool, thread, xr, qa, 1 + gated, gate_up + 1 - gated, ctx->moe_x + r0 * E,
                    gate_up_out + 1 - gated, n);
    add_expert_bias(u, &L->exp_up_b, e, n, FX);
    add_expert_bias(g, &L->exp_gate_b, e, n, FX);
    if (!gated) {
        for (int64_t i = 0; i < n * FX; i++) {
            g[i] = kg_relu_sqr(u[i]);
        }
    } else if (hp->ffn_act == KG_FFN_SWIGLU_OAI) {
        cpu_moe_swiglu_oai(g, u, g, n * FX);
    } else if (hp->ffn_act == KG_FFN_GELU) { /* Gemma 4: ggml_geglu_split */
        cpu_geglu(ctx->gelu_table, g, u, g, n * FX);
    } else {
        for (int64_t i = 0; i < n * FX; i++) {
            g[i] = kg_silu(g[i]) * u[i];
        }
    }
    const cpu_weight_t *down = &L->exp_down[e];
    cpu_matmul_n_on(ctx, pool, thread, xr, qa, 1, &down, g, &y, n);
    add_expert_bias(y, &L->exp_down_b, e, n, E);
    if (L->exp_down_s.data) { /* Gemma 4's per-expert scale (build_lora_mm_id's w_s) */
        scale_rows(y, n * E, L->exp_down_s.data[e]);
    }
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

/* The routed experts of layer L on ctx->xn (T, n_embd) by the router's
 * logits in ctx->moe_logits, into ctx->tmp (T, n_embd) (llama.cpp's
 * build_moe_ffn after the logits): route, group, one
 * gate/up and one down GEMM per active expert over its rows, weigh and
 * add. With enough active experts to keep every thread busy (decode: many
 * experts of a few rows each) the experts run side by side, one pool task
 * each, largest group first; otherwise one after another, each GEMM split
 * over the pool by columns. Either way every row's bits are the same: the
 * GEMM's per-element chain does not depend on threads or row counts. */
static void moe_experts(cpu_ctx_t *ctx, const cpu_layer_t *L, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    cpu_moe_plan_t *plan = &ctx->plan;
    kg_moe_stats_t *st = &ctx->moe_stats;
    cpu_moe_route(plan, hp, ctx->moe_logits, L->exp_probs_b.data, T);
    if (hp->moe_w_before) { /* llama4: each row times its weight, the outputs summed */
        cpu_moe_gather_weighted(plan, ctx->xn, hp->n_embd, ctx->moe_x, T);
    } else {
        cpu_moe_gather(plan, ctx->xn, hp->n_embd, ctx->moe_x, T);
    }
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

/* The mixture-of-experts FFN of layer L on ctx->xn (T, n_embd) into
 * ctx->tmp: the router's logits (+ bias: gpt-oss) on the same input as
 * the experts, the experts, and glm4moe's shared expert. */
static void moe_ffn(cpu_ctx_t *ctx, const cpu_layer_t *L, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    matmul(ctx, &L->gate_inp, ctx->xn, ctx->moe_logits, T);
    add_bias(ctx->moe_logits, &L->gate_inp_b, T, hp->n_expert);
    moe_experts(ctx, L, T);
    if (L->sh_up.n_out > 0) {
        /* the shared expert on the same normed input, added to the routed
         * experts' sum (glm4moe: ggml_add(routed_out, shared_out));
         * nemotron_h_moe's: up, squared ReLU, down */
        const int64_t FS = L->sh_up.n_out;
        const cpu_weight_t *gate_up[2] = {&L->sh_gate, &L->sh_up};
        float *const gate_up_out[2] = {ctx->gate, ctx->up};
        if (L->sh_gate.n_out == 0) {
            matmul(ctx, &L->sh_up, ctx->xn, ctx->up, T);
            for (int64_t i = 0; i < T * FS; i++) {
                ctx->gate[i] = kg_relu_sqr(ctx->up[i]);
            }
        } else {
            matmul_n(ctx, 2, gate_up, ctx->xn, gate_up_out, T);
            for (int64_t i = 0; i < T * FS; i++) {
                ctx->gate[i] = kg_silu(ctx->gate[i]) * ctx->up[i];
            }
        }
        matmul(ctx, &L->sh_down, ctx->gate, ctx->shexp, T);
        for (int64_t t = 0; L->sh_gate_inp.data && t < T; t++) {
            /* qwen35moe: times sigmoid(ffn_gate_inp_shexp . x) (ggml_mul_mat
             * of the vector, ggml_sigmoid, ggml_mul) */
            const float *x = ctx->xn + t * hp->n_embd;
            float s = 0.0f;
            for (int64_t i = 0; i < hp->n_embd; i++) {
                s += L->sh_gate_inp.data[i] * x[i];
            }
            scale_rows(ctx->shexp + t * hp->n_embd, hp->n_embd, 1.0f / (1.0f + expf(-s)));
        }
        for (int64_t i = 0; i < T * hp->n_embd; i++) {
            ctx->tmp[i] = ctx->tmp[i] + ctx->shexp[i];
        }
    }
}

/* qwen35's attn_q rows, (n_heads) x [query (hd), gate (hd)], parted: the
 * queries packed in place at the front of qg, the gates into gate
 * (llama.cpp's two views of Qcur_full). A head's query moves only toward
 * the front, over what was read already. */
static void part_query_gate(float *qg, float *gate, int64_t n_heads, int64_t hd) {
    for (int64_t i = 0; i < n_heads; i++) {
        memcpy(gate + i * hd, qg + i * 2 * hd + hd, (size_t)hd * sizeof(float));
        memmove(qg + i * hd, qg + i * 2 * hd, (size_t)hd * sizeof(float));
    }
}

/* Gemma 4's per-layer inputs of every token and layer into ctx->pl_in
 * (T, n_layer, P) (llama.cpp's build_inp_per_layer and
 * project_per_layer_inputs): the scaled embeddings x projected, times
 * 1/sqrt(n_embd), RMS-normed per layer slice, plus the token's row of
 * per_layer_token_embd times sqrt(P), times 1/sqrt(2). */
static void per_layer_inputs(cpu_ctx_t *ctx, const kg_step_batch_t *batch, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t P = hp->n_embd_per_layer, NP = (int64_t)hp->n_layer * P;
    const kg_gguf_tensor_t *emb = ctx->model->pl_tok_embd;
    const size_t row_size = kg_type_row_size(emb->type, NP);
    const float proj_scale = 1.0f / sqrtf((float)hp->n_embd);
    const float tok_scale = sqrtf((float)P), in_scale = 1.0f / sqrtf(2.0f);
    matmul(ctx, &ctx->pl_model_proj, ctx->x, ctx->pl_in, T);
    scale_rows(ctx->pl_in, T * NP, proj_scale);
    cpu_rmsnorm_rows(ctx->pl_in, ctx->pl_proj_norm.data, ctx->pl_in, T * hp->n_layer, P,
                     hp->norm_eps);
    float *row = ctx->xr; /* free between GEMMs; at least NP wide */
    for (int64_t t = 0; t < T; t++) {
        kg_dequantize(emb->type, (const char *)emb->data + (size_t)batch->token[t] * row_size, row,
                      NP);
        float *in = ctx->pl_in + t * NP;
        for (int64_t i = 0; i < NP; i++) {
            in[i] = (in[i] + row[i] * tok_scale) * in_scale;
        }
    }
}

/* Gemma 4's per-layer input of layer il, added to the residual stream x:
 * gelu(inp_gate x) * the layer's input, proj, post-norm. */
static void per_layer_add(cpu_ctx_t *ctx, const cpu_layer_t *L, int32_t il, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t P = hp->n_embd_per_layer, NP = (int64_t)hp->n_layer * P, E = hp->n_embd;
    matmul(ctx, &L->pe_gate, ctx->x, ctx->pl_gate, T);
    for (int64_t t = 0; t < T; t++) { /* ggml_gelu then ggml_mul: GeGLU's bits */
        float *g = ctx->pl_gate + t * P;
        cpu_geglu(ctx->gelu_table, g, ctx->pl_in + t * NP + (int64_t)il * P, g, P);
    }
    matmul(ctx, &L->pe_proj, ctx->pl_gate, ctx->tmp, T);
    cpu_rows_residual(ctx, ctx->x, ctx->tmp, L->pe_post_norm.data, T, E, 0.0f, hp->norm_eps);
}

/* The dense FFN of layer il on ctx->xn (T, n_embd) into ctx->tmp:
 * gate/up GEMMs, SwiGLU or GeGLU, the down GEMM (LoRA deltas after each). */
static void dense_ffn(cpu_ctx_t *ctx, const cpu_layer_t *L, int32_t il, int64_t F, int64_t T) {
    const cpu_weight_t *gate_up[2] = {&L->w_gate, &L->w_up};
    float *const gate_up_out[2] = {ctx->gate, ctx->up};
    matmul_n(ctx, 2, gate_up, ctx->xn, gate_up_out, T);
    cpu_lora_apply(ctx, il, KG_LORA_GATE, 2, ctx->xn, gate_up_out, T);
    cpu_rows_glu(ctx, ctx->gate, ctx->up, T, F, ctx->hp.ffn_act == KG_FFN_GELU);
    matmul(ctx, &L->w_down, ctx->gate, ctx->tmp, T);
    cpu_lora_apply(ctx, il, KG_LORA_DOWN, 1, ctx->gate, &ctx->tmp, T);
}

/* Gemma 4's MoE block on the residual stream x (T, n_embd), ctx->xn
 * holding x normed by ffn_norm, into ctx->tmp (llama_model_gemma4's graph
 * with a router): the dense MLP on xn, normed by post_ffw_norm_1; the
 * router's logits from x RMS-normed without a weight, times 1/sqrt(n_embd)
 * (ggml_scale), times ffn_gate_inp.scale (ggml_mul); the experts (GeGLU,
 * each output times its expert's scale) on x normed by pre_ffw_norm_2,
 * their weighted sum normed by post_ffw_norm_2; the two added. */
static void gemma4_moe_ffn(cpu_ctx_t *ctx, const cpu_layer_t *L, int32_t il, int64_t F, int64_t T) {
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t E = hp->n_embd;
    dense_ffn(ctx, L, il, F, T);
    cpu_rmsnorm_rows(ctx->tmp, L->ffn_post_norm_1.data, ctx->shexp, T, E, hp->norm_eps);
    cpu_rmsnorm_rows(ctx->x, NULL, ctx->xn, T, E, hp->norm_eps);
    scale_rows(ctx->xn, T * E, 1.0f / sqrtf((float)E));
    for (int64_t t = 0; t < T; t++) {
        float *r = ctx->xn + t * E;
        for (int64_t i = 0; i < E; i++) {
            r[i] *= L->gate_inp_s.data[i];
        }
    }
    matmul(ctx, &L->gate_inp, ctx->xn, ctx->moe_logits, T);
    cpu_rmsnorm_rows(ctx->x, L->ffn_pre_norm_2.data, ctx->xn, T, E, hp->norm_eps);
    moe_experts(ctx, L, T);
    cpu_rmsnorm_rows(ctx->tmp, L->ffn_post_norm_2.data, ctx->tmp, T, E, hp->norm_eps);
    for (int64_t i = 0; i < T * E; i++) {
        ctx->tmp[i] = ctx->shexp[i] + ctx->tmp[i]; /* ggml_add(cur_mlp, cur_moe) */
    }
}

/* The stage between the Q/K/V GEMMs and attention, on tokens [t0, t0 + T)
 * (cpu_rows_run): biases (qwen2), the Q/K norms per head (qwen3, gemma3;
 * over all heads: olmo2) and Gemma 4's V norm, RoPE, the attention
 * temperature (mistral3) and query scale (gemma, phi3), q rounded to fp16
 * as ggml converts it for the K matmul, and the K/V rows written to their
 * blocks. Every op is the token's own, so any split gives the same bits. */
typedef struct qkv_arg {
    const cpu_layer_t *L;
    const kg_layer_weights_t *ML;
    const kg_step_batch_t *batch;
    const float *cs; /* the layer's RoPE angles, (T, rope_stride) */
    int32_t il;
} qkv_arg_t;

static void qkv_rows(cpu_ctx_t *ctx, const void *p, int64_t t0, int64_t T) {
    const qkv_arg_t *a = p;
    const kg_hparams_t *hp = &ctx->hp;
    const cpu_layer_t *L = a->L;
    const kg_layer_weights_t *ML = a->ML;
    const kg_step_batch_t *batch = a->batch;
    const int32_t hd = ML->head_dim, n_rot = ML->n_rot, bs = ctx->block_size, il = a->il;
    const int64_t n_q = (int64_t)hp->n_head * hd, n_kv = (int64_t)ML->n_head_kv * hd;
    const bool own_kv = ML->kv_layer == il;
    float *q = ctx->q + t0 * n_q, *k = ctx->k + t0 * n_kv, *v = ctx->v + t0 * n_kv;
    add_bias(q, &L->bq, T, n_q);
    add_bias(k, &L->bk, T, n_kv);
    add_bias(v, &L->bv, T, n_kv);
    if (L->q_norm.data && hp->qk_norm_full) { /* build_norm on (n_q, T): olmo2 */
        cpu_rmsnorm_rows(q, L->q_norm.data, q, T, n_q, hp->norm_eps);
        cpu_rmsnorm_rows(k, L->k_norm.data, k, T, n_kv, hp->norm_eps);
    } else if (L->q_norm.data) { /* build_norm on (head_dim, n_head, T) */
        cpu_rmsnorm_rows(q, L->q_norm.data, q, T * hp->n_head, hd, hp->norm_eps);
        if (own_kv) {
            cpu_rmsnorm_rows(k, L->k_norm.data, k, T * ML->n_head_kv, hd, hp->norm_eps);
        }
    }
    if (hp->v_norm && own_kv) { /* Gemma 4: ggml_rms_norm of each V head, no weight */
        cpu_rmsnorm_rows(v, NULL, v, T * ML->n_head_kv, hd, hp->norm_eps);
    }
    if (!ML->no_rope) {
        const float *cs = a->cs + t0 * ctx->rope_stride;
        rope_rows(ctx, q, T, hp->n_head, hd, n_rot, cs);
        if (own_kv) {
            rope_rows(ctx, k, T, ML->n_head_kv, hd, n_rot, cs);
        }
        if (hp->qk_l2_norm) { /* llama4: ggml_rms_norm of each RoPE'd head, no weight */
            cpu_rmsnorm_rows(q, NULL, q, T * hp->n_head, hd, hp->norm_eps);
            cpu_rmsnorm_rows(k, NULL, k, T * ML->n_head_kv, hd, hp->norm_eps);
        }
    }
    /* mistral3: ggml_mul by the per-token scale; llama4: on the NoPE layers, at pos + 1 */
    if (hp->attn_temp_scale != 0.0f && (!hp->attn_temp_nope || ML->no_rope)) {
        for (int64_t t = 0; t < T; t++) {
            const int32_t pos = batch->pos[t0 + t] + (hp->attn_temp_nope ? 1 : 0);
            scale_rows(q + t * n_q, n_q,
                       kg_attn_temp(hp->attn_temp_scale, hp->attn_temp_floor, pos));
        }
    }
    if (hp->q_scale != 0.0f) {
        scale_rows(q, T * n_q, hp->q_scale);
    }
    cpu_round_fp16(q, T * n_q); /* ggml converts q to fp16 for the K matmul */
    for (int64_t t = t0; own_kv && t < t0 + T; t++) {
        const int32_t pos = batch->pos[t];
        const int32_t blk =
            batch->block_table[(int64_t)batch->seq[t] * batch->max_blocks_per_seq + pos / bs];
        const int64_t row = (int64_t)blk * bs + pos % bs;
        cpu_fp32_to_fp16(ctx->k + t * n_kv, ctx->k_cache[il] + row * n_kv, n_kv);
        cpu_fp32_to_fp16(ctx->v + t * n_kv, ctx->v_cache[il] + row * n_kv, n_kv);
    }
}

kg_status_t cpu_backend_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    cpu_ctx_t *ctx = be->ctx;
    ctx->fault = (kg_backend_fault_t){.scope = KG_FAULT_NONE, .seq = -1, .row = -1};
    const kg_hparams_t *hp = &ctx->hp;
    const int64_t T = batch->n_tokens, E = hp->n_embd;
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
    for (int64_t t = 0; hp->non_causal && t < T; t++) {
        /* every token sees its whole input, so the input must be here
         * whole: one run from position 0 */
        const bool first = t == 0 || batch->seq[t] != batch->seq[t - 1];
        if (batch->pos[t] != (first ? 0 : batch->pos[t - 1] + 1)) {
            KG_LOG_ERROR("cpu",
                         "non-causal step: token %lld (seq %d pos %d) is not its input's "
                         "next; an input must run whole in one step",
                         (long long)t, batch->seq[t], batch->pos[t]);
            return KG_ERR_INVALID;
        }
    }
    if (!batch_blocks_ok(ctx, batch) || !cpu_lora_plan(ctx, batch)) {
        return KG_ERR_INVALID;
    }
    int32_t bad_seq;
    const kg_status_t rst = cpu_recurrent_begin(ctx, batch, &bad_seq);
    if (rst != KG_OK) {
        if (bad_seq >= 0) { /* that sequence alone: its state cannot take this token */
            ctx->fault = (kg_backend_fault_t){.scope = KG_FAULT_SEQ, .seq = bad_seq, .row = -1};
            snprintf(ctx->fault.message, sizeof(ctx->fault.message),
                     "cpu: slot %d's recurrent state does not continue at this token", bad_seq);
        }
        return rst;
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
            float *cs = ctx->rope_cs + (r * T + t) * ctx->rope_stride;
            kg_rope_cache_yarn(batch->pos[t], rp->n_rot, rp->base, rp->scale,
                               rp->freqs ? rp->freqs : ctx->rope_freqs, hp->yarn_ext_factor,
                               hp->yarn_attn_factor, rp->corr_dims, cs, cs + rp->n_rot / 2);
        }
    }
    if (ctx->model->pl_tok_embd) {
        per_layer_inputs(ctx, batch, T);
    }

    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cpu_layer_t *L = &ctx->layers[il];
        /* the layer's own shape (Gemma 4's windowed and global layers differ) */
        const kg_layer_weights_t *ML = &ctx->model->layers[il];
        const int32_t hd = ML->head_dim;
        const int64_t n_q = (int64_t)hp->n_head * hd, F = ML->n_ff;
        /* a Gemma 4 shared-KV layer computes Q only and reads kv_layer's cache */
        const bool own_kv = ML->kv_layer == il;
        const float *cs = ctx->rope_cs + (int64_t)L->rope * T * ctx->rope_stride;
        if (ML->kind == KG_LAYER_FFN) { /* no mixer: its FFN normed by attn_norm (nemotron_h) */
            goto ffn;
        }
        cpu_rows_norm(ctx, ctx->x, L->attn_norm.data, ctx->xn, T, E, hp->norm_eps);
        if (ML->kind != KG_LAYER_ATTN) { /* a hybrid's recurrent layer (cpu_recurrent.c) */
            cpu_recurrent_mixer(ctx, il, batch);
            cpu_rows_residual(ctx, ctx->x, ctx->tmp, NULL, T, E, hp->residual_scale, 0.0f);
            goto ffn;
        }
        if (L->wkv_a.n_out > 0) { /* deepseek2: no biases, post-norms or LoRA there */
            mla_attention(ctx, L, il, batch, cs);
            cpu_rows_residual(ctx, ctx->x, ctx->tmp, NULL, T, E, hp->residual_scale, 0.0f);
            goto ffn;
        }
        const cpu_weight_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[3] = {ctx->q, ctx->k, ctx->v};
        matmul_n(ctx, own_kv ? 3 : 1, qkv, ctx->xn, qkv_out, T);
        cpu_lora_apply(ctx, il, KG_LORA_Q, 3, ctx->xn, qkv_out, T);
        if (ctx->qgate) { /* qwen35: each head's query, then its output gate */
            part_query_gate(ctx->q, ctx->qgate, T * hp->n_head, hd);
        }
        const qkv_arg_t qa = {.L = L, .ML = ML, .batch = batch, .cs = cs, .il = il};
        cpu_rows_run(ctx, T, qkv_rows, &qa);
        attention(ctx, il, batch);
        for (int64_t i = 0; ctx->qgate && i < T * n_q; i++) { /* ggml_sigmoid, ggml_mul */
            ctx->att[i] *= 1.0f / (1.0f + expf(-ctx->qgate[i]));
        }
        matmul(ctx, &L->wo, ctx->att, ctx->tmp, T);
        cpu_lora_apply(ctx, il, KG_LORA_O, 1, ctx->att, &ctx->tmp, T);
        add_bias(ctx->tmp, &L->bo, T, E);
        cpu_rows_residual(ctx, ctx->x, ctx->tmp, L->attn_post_norm.data, T, E, hp->residual_scale,
                          hp->norm_eps);

    ffn:
        if (F == 0) {
            continue; /* a mixer alone (nemotron_h) */
        }
        cpu_rows_norm(ctx, ctx->x, L->ffn_norm.data, ctx->xn, T, E, hp->norm_eps);
        if (L->ffn_pre_norm_2.data) {
            gemma4_moe_ffn(ctx, L, il, F, T);
        } else if (L->moe) {
            moe_ffn(ctx, L, T);
        } else if (hp->ffn_act == KG_FFN_RELU_SQR) { /* nemotron_h: up, relu^2, down */
            matmul(ctx, &L->w_up, ctx->xn, ctx->up, T);
            cpu_lora_apply(ctx, il, KG_LORA_UP, 1, ctx->xn, &ctx->up, T);
            for (int64_t i = 0; i < T * F; i++) {
                ctx->gate[i] = kg_relu_sqr(ctx->up[i]);
            }
            matmul(ctx, &L->w_down, ctx->gate, ctx->tmp, T);
            cpu_lora_apply(ctx, il, KG_LORA_DOWN, 1, ctx->gate, &ctx->tmp, T);
        } else if (hp->ffn_act == KG_FFN_XIELU) { /* apertus: up, xIELU, down */
            matmul(ctx, &L->w_up, ctx->xn, ctx->up, T);
            cpu_lora_apply(ctx, il, KG_LORA_UP, 1, ctx->xn, &ctx->up, T); /* build_lora_mm */
            for (int64_t i = 0; i < T * F; i++) {
                ctx->gate[i] =
                    kg_xielu(ctx->up[i], ML->xielu_an, ML->xielu_ap, ML->xielu_beta, ML->xielu_eps);
            }
            matmul(ctx, &L->w_down, ctx->gate, ctx->tmp, T);
            cpu_lora_apply(ctx, il, KG_LORA_DOWN, 1, ctx->gate, &ctx->tmp, T);
        } else {
            dense_ffn(ctx, L, il, F, T);
        }
        cpu_rows_residual(ctx, ctx->x, ctx->tmp, L->ffn_post_norm.data, T, E, hp->residual_scale,
                          hp->norm_eps);
        if (L->pe_gate.n_out > 0) {
            per_layer_add(ctx, L, il, T);
        }
        if (ML->out_scale != 0.0f) { /* Gemma 4's layer_output_scale: ggml_mul */
            scale_rows(ctx->x, T * E, ML->out_scale);
        }
    }

    cpu_recurrent_end(ctx, batch);
    /* hidden states for embedding jobs: the final norm of the rows that
     * want them, in token order (llama.cpp's t_embd, what pooling reads) */
    if (batch->want_hidden) {
        int64_t n_hid = 0;
        for (int64_t t = 0; t < T; t++) {
            if (batch->want_hidden[t]) {
                if (n_hid == batch->n_hidden) {
                    break;
                }
                cpu_rmsnorm_rows(ctx->x + t * E, ctx->output_norm.data, batch->hidden + n_hid * E,
                                 1, E, hp->norm_eps);
                n_hid++;
            }
        }
        if (n_hid != batch->n_hidden) {
            KG_LOG_ERROR("cpu", "batch says %d hidden rows, want_hidden has more or fewer",
                         batch->n_hidden);
            return KG_ERR_INVALID;
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
        if (hp->logit_scale != 0.0f) { /* granite: ggml_scale by 1 / logit_scale */
            scale_rows(logits, n_out * hp->n_vocab, 1.0f / hp->logit_scale);
        }
        if (hp->final_softcap != 0.0f) {
            for (int64_t i = 0; i < n_out * hp->n_vocab; i++) {
                logits[i] = kg_softcap(logits[i], hp->final_softcap);
            }
        }
    }
    return KG_OK;
}
