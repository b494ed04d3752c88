/* kg_backend_cuda_step: the CUDA backend's step: the inputs packed and
 * sent, the layers' kernels, CUDA graphs per batch-size bucket, the device
 * sampler's glue, KV block copies and what a failed call hit.
 *
 * DESIGN
 * Step. All buffers are allocated at start for max_batch_tokens tokens
 * (logits for at most out_cap rows at a time), the input buffer sized again
 * once at the first step, when the engine's block-table shape is known; a
 * step makes no allocation after that.
 * The host packs the step's tokens, positions, output rows, attention tiles
 * and the block tables of the step's sequences (compacted: each sequence's
 * blocks up to its last position) into one pinned buffer, sent with one
 * cudaMemcpyAsync; then on one stream: embedding gather and RoPE angles,
 * per layer add+RMSNorm, QKV GEMM, RoPE + KV store, paged attention, output
 * GEMM, add+RMSNorm, gate|up GEMM, SwiGLU, down GEMM (a hybrid's recurrent
 * layer runs its mixer, kg_backend_cuda_recurrent.cu, in place of the
 * attention, after zeroing the states of the slots at position 0; a
 * nemotron_h layer lacks the mixer or the FFN); the final add+RMSNorm
 * of the rows that want logits, and the head GEMM over those rows, out_cap
 * rows at a time: a step with more output rows than the logits buffer
 * holds (--max-batch-size above KGEN_CUDA_MAX_OUTPUTS) runs the head and
 * the sampler chunk by chunk, so any batch size works. forward(logits !=
 * NULL) copies the logits to the host; forward(NULL) leaves them on the
 * device for sample(), which runs the device sampler (sample.cu) and
 * returns only the picks.
 *
 * Hidden states. A step with want_hidden rows (embedding and rerank jobs)
 * runs eagerly: the last residual add and the final RMSNorm run on every
 * row into hid (F32, the CPU backend's hidden rows), the logits rows' norm
 * then reads the sums already made (the same bits as without), and the
 * wanted rows are copied back, one copy per run of consecutive rows. A
 * bert model's steps are kg_backend_cuda_bert.cu's.
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
#include "kg_backend_cuda_int.cuh"

#include <string.h>

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
        KG_TRY(cuda_alloc_inputs(ctx));
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
    int32_t *tile_tok0 = out_row + cap, *tile_n = tile_tok0 + cap, *pos_end = tile_n + cap;
    int32_t *seqs = pos_end + cap;
    int32_t *table = seqs + cap;
    kg_status_t st = KG_OK;
    int32_t n_dist = 0, n_out = 0;
    bool multi = false;

    for (int32_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], p = batch->pos[t], seq = batch->seq[t];
        if (seq < 0 || seq >= batch->n_slots) {
            st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                            "bad batch entry %d: slot %d of %d", t, seq, batch->n_slots);
            goto out;
        }
        if (tok < 0 || tok >= hp->n_vocab) {
            st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                            "slot %d: token id %d outside the model's vocabulary of %d", seq, tok,
                            hp->n_vocab);
            goto out;
        }
        if (p < 0 || p >= ctx->max_ctx || p / bs >= batch->max_blocks_per_seq) {
            st = cuda_fault(
                ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                "slot %d: position %d outside the context of %d the backend was set up for", seq, p,
                ctx->max_ctx);
            goto out;
        }
        token[t] = tok;
        pos[t] = p;
        seqs[t] = seq;
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
        st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                        "batch says %d outputs, want_logits has %d", batch->n_outputs, n_out);
        goto out;
    }
    /* each token's input end: a non-causal model's tokens see their whole
     * input, so it must be here whole, one run from position 0 (as the
     * CPU backend checks); a causal model's is unread */
    for (int32_t t = T - 1; t >= 0; t--) {
        const bool last = t == T - 1 || batch->seq[t + 1] != batch->seq[t];
        pos_end[t] = last ? batch->pos[t] + 1 : pos_end[t + 1];
        const bool first = t == 0 || batch->seq[t - 1] != batch->seq[t];
        if (hp->non_causal && batch->pos[t] != (first ? 0 : batch->pos[t - 1] + 1)) {
            st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, batch->seq[t], -1,
                            "non-causal step: token %d (slot %d position %d) is not its "
                            "input's next; an input must run whole in one step",
                            t, batch->seq[t], batch->pos[t]);
            goto out;
        }
    }
    {
        int64_t n_table = 0;
        for (int32_t d = 0; d < n_dist; d++) {
            ctx->dist_off[d] = (int32_t)n_table;
            n_table += ctx->dist_max_pos[d] / bs + 1;
        }
        if (n_table > ctx->table_cap) {
            st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
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
                    st = cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, ctx->dist_seq[d], -1,
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
        const int32_t qt = single || ctx->plan.rt == 1 ? 1 : ctx->prefill_qt;
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

/* The K and V planes layer il reads (a Gemma 4 shared-KV layer's are an
 * earlier layer's). */
static kg_cuda_kv_t layer_kv(const cuda_ctx_t *ctx, int32_t il) {
    const cuda_layer_t *L = &ctx->layers[il];
    kg_cuda_kv_t kv;
    kv.k = ctx->kv + L->kv_off;
    kv.v = ctx->kv + L->kv_off + L->kv_plane;
    kv.q8 = ctx->kv_type == KG_KV_Q8_0;
    return kv;
}

/* Attention of one layer: graph steps (single) cut their `rows` one-token
 * tiles into fixed groups, so the captured launches fit any later step of
 * the bucket; eager steps use the groups pack_inputs made. */
static kg_status_t attention(cuda_ctx_t *ctx, int32_t il, int32_t rows, bool single) {
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const cuda_layer_t *L = &ctx->layers[il];
    const kg_layer_weights_t *ML = &ctx->model->layers[il];
    /* the layer's own shape (Gemma 4's windowed and global layers differ);
     * a prefill launch takes its own rows per tile, every tile holding at
     * most prefill_qt tokens, which fit every layer's */
    const kg_cuda_attn_shape_t ash = {ctx->hp.n_head, ML->n_head_kv, ML->head_dim, ctx->block_size};
    kg_cuda_attn_plan_t lplan = ctx->plan;
    lplan.rt = lplan.rt == 1 ? 1 : kg_cuda_attention_prefill_rt(&ash);
    /* llama scales the scores (by attention.scale where granite's file gives
     * one); gemma and phi3 scaled q already */
    kg_cuda_attn_layer_t lay;
    lay.scale = ctx->hp.q_scale != 0.0f    ? 1.0f
                : ctx->hp.kq_scale != 0.0f ? ctx->hp.kq_scale
                                           : 1.0f / sqrtf((float)ML->head_dim);
    lay.softcap = ctx->hp.attn_softcap;
    lay.n_swa = L->n_swa;
    lay.chunked = ctx->hp.swa_chunked; /* llama4: n_swa is its chunk */
    lay.sinks = L->sinks;
    lay.non_causal = ctx->hp.non_causal;
    if (single) {
        kg_cuda_attn_plan_t plan = ctx->plan;
        plan.rt = 1;
        const int32_t group = ATT_PAIR_CAP / plan.max_splits;
        for (int32_t t0 = 0; t0 < rows; t0 += group) {
            const int32_t n = rows - t0 < group ? rows - t0 : group;
            KG_TRY(kg_cuda_attention(ctx->stream, in, &ash, &plan, &lay, t0, n, t0, n, ctx->q16,
                                     layer_kv(ctx, il), ctx->split, ctx->att, L->wo.dt));
        }
        return KG_OK;
    }
    for (int32_t g = 0; g < ctx->n_groups; g++) {
        KG_TRY(kg_cuda_attention(ctx->stream, in, &ash, &lplan, &lay, ctx->grp_tile0[g],
                                 ctx->grp_ntiles[g], ctx->grp_tok0[g], ctx->grp_ntok[g], ctx->q16,
                                 layer_kv(ctx, il), ctx->split, ctx->att, L->wo.dt));
    }
    return KG_OK;
}

/* The head GEMM for output rows [row0, row0 + n) (n <= out_cap) into
 * `logits`. */
static kg_status_t run_head(cuda_ctx_t *ctx, int32_t row0, int32_t n) {
    const size_t es = kg_cuda_dtype_size(ctx->head.dt);
    const char *xo = (const char *)ctx->xo + (size_t)row0 * (size_t)ctx->hp.n_embd * es;
    KG_TRY(kg_cuda_gemm(&ctx->blas, ctx->stream, &ctx->head, xo, ctx->logits, n));
    const float mul = ctx->hp.logit_scale != 0.0f ? 1.0f / ctx->hp.logit_scale : 0.0f;
    KG_TRY(kg_cuda_logits_post(ctx->stream, ctx->logits, n, ctx->hp.n_vocab, ctx->out_b,
                               ctx->hp.final_softcap, mul));
    ctx->head_row0 = row0;
    return KG_OK;
}

/* The dense FFN of layer il over `rows` token slots, on xn (in wgu's
 * type) into tmp: gate|up GEMM, the activation (SwiGLU, GeGLU, or on the
 * up projection alone apertus's xIELU and nemotron_h's squared ReLU), the
 * down GEMM, the adapters' deltas after each. */
static kg_status_t dense_ffn(cuda_ctx_t *ctx, int32_t il, int32_t rows) {
    const kg_hparams_t *hp = &ctx->hp;
    const cuda_layer_t *L = &ctx->layers[il];
    const kg_layer_weights_t *ML = &ctx->model->layers[il];
    cudaStream_t st = ctx->stream;
    const kg_cuda_step_hdr_t *hdr = kg_cuda_inputs_view(ctx->d_in, rows).hdr;
    const int32_t F = ML->n_ff; /* the layer's own width (Gemma 4's may differ) */
    const int32_t gu_col[2] = {0, F}, gu_n[2] = {F, F}, zero[1] = {0};
    const bool up_only = hp->ffn_act == KG_FFN_XIELU || hp->ffn_act == KG_FFN_RELU_SQR;
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wgu, ctx->xn, ctx->gu, rows));
    if (!up_only) {
        KG_TRY(cuda_lora_apply(ctx, il, KG_LORA_GATE, 2, ctx->xn, L->wgu.dt, hp->n_embd, ctx->gu,
                               2 * F, gu_col, gu_n));
    } else { /* gu is the up projection alone */
        KG_TRY(cuda_lora_apply(ctx, il, KG_LORA_UP, 1, ctx->xn, L->wgu.dt, hp->n_embd, ctx->gu, F,
                               zero, &F));
    }
    if (hp->ffn_act == KG_FFN_XIELU) {
        const float xp[4] = {ML->xielu_an, ML->xielu_ap, ML->xielu_beta, ML->xielu_eps};
        KG_TRY(kg_cuda_xielu(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, F, xp));
    } else if (hp->ffn_act == KG_FFN_RELU_SQR) {
        KG_TRY(kg_cuda_relu_sqr(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, F));
    } else if (hp->ffn_act == KG_FFN_GELU) {
        KG_TRY(kg_cuda_geglu(st, rows, hdr, ctx->gu, ctx->gelu_table, ctx->h, L->wdown.dt, F));
    } else {
        KG_TRY(kg_cuda_swiglu(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, F));
    }
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wdown, ctx->h, ctx->tmp, rows));
    return cuda_lora_apply(ctx, il, KG_LORA_DOWN, 1, ctx->h, L->wdown.dt, F, ctx->tmp, hp->n_embd,
                           zero, &hp->n_embd);
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
    KG_TRY(kg_cuda_moe_route(st, rows, hdr, &ctx->router, ctx->moe_logits, L->router_b, L->probs_b,
                             &plan));
    KG_TRY(kg_cuda_moe_align(st, hdr, &ctx->router, &plan));
    /* nemotron_h_moe's experts have no gate: up, squared ReLU, down */
    const bool gated = hp->ffn_act != KG_FFN_RELU_SQR;
    if (gated) {
        KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_gate.data, L->exp_gate_b, ctx->xe, 1, ctx->moe_g,
                                FX, E, L->exp_gate.dt, L->exp_gate.qtype,
                                kg_cuda_mat_tail(&L->exp_gate)));
    }
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_up.data, L->exp_up_b, ctx->xe, 1, ctx->moe_u, FX, E,
                            L->exp_up.dt, L->exp_up.qtype, kg_cuda_mat_tail(&L->exp_up)));
    const int act = !gated                             ? KG_CUDA_MOE_ACT_RELU_SQR
                    : hp->ffn_act == KG_FFN_SWIGLU_OAI ? KG_CUDA_MOE_ACT_OAI
                                                       : KG_CUDA_MOE_ACT_SWIGLU;
    KG_TRY(kg_cuda_moe_act(st, &plan, ctx->moe_g, ctx->moe_u, ctx->moe_h, L->exp_down.dt, FX, act));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_down.data, L->exp_down_b, ctx->moe_h, 0, ctx->moe_y,
                            E, FX, L->exp_down.dt, L->exp_down.qtype,
                            kg_cuda_mat_tail(&L->exp_down)));
    if (L->n_ff_shexp > 0) {
        /* the shared expert (glm4moe): a SwiGLU FFN on the experts' input
         * (nemotron_h_moe's: up, squared ReLU, down), its output added to
         * their weighted sum in combine */
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wgu, ctx->xe, ctx->gu, rows));
        if (gated) {
            KG_TRY(kg_cuda_swiglu(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, L->n_ff_shexp));
        } else {
            KG_TRY(kg_cuda_relu_sqr(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, L->n_ff_shexp));
        }
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wdown, ctx->h, ctx->shexp, rows));
        if (L->shexp_gate) { /* qwen35moe, qwen3next: times sigmoid(gate . x) */
            KG_TRY(kg_cuda_moe_shexp_gate(st, rows, hdr, L->shexp_gate, ctx->xe, L->exp_up.dt,
                                          ctx->shexp, E));
        }
    }
    return kg_cuda_moe_combine(st, rows, hdr, &ctx->router, &plan, ctx->moe_y,
                               L->n_ff_shexp > 0 ? ctx->shexp : NULL, ctx->tmp, E);
}

/* What layer il's last block left in tmp, to join the residual at the
 * next add: its FFN's output (after its post-norm), or for a layer without
 * FFN (nemotron_h's mixer and attention layers) the mixer's or the
 * attention's (+ bias, post-norm). */
static kg_cuda_residual_t block_out(const cuda_ctx_t *ctx, int32_t il) {
    const cuda_layer_t *L = &ctx->layers[il];
    if (ctx->g4) { /* Gemma 4's layers join the residual themselves (cuda_g4_layer_end) */
        return kg_cuda_residual_t{NULL, NULL, NULL, 0.0f};
    }
    if (ctx->model->layers[il].n_ff == 0 && !L->moe) {
        return kg_cuda_residual_t{ctx->tmp, L->bo, L->attn_post_norm, ctx->hp.residual_scale};
    }
    return kg_cuda_residual_t{ctx->tmp, NULL, L->ffn_post_norm, ctx->hp.residual_scale};
}

/* Every kernel of one step over `rows` token slots (the real count is in
 * the device header) and `out_rows` output rows, plus the head of the first
 * out_cap of them when `head`. Also what a graph captures. */
static kg_status_t
run_step(cuda_ctx_t *ctx, int32_t rows, int32_t out_rows, bool single, bool head, bool hidden) {
    const kg_hparams_t *hp = &ctx->hp;
    cudaStream_t st = ctx->stream;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const kg_cuda_step_hdr_t *hdr = in.hdr;
    const size_t rope_stride = (size_t)ctx->max_tokens * (size_t)ctx->max_rot;
    const int32_t zero[1] = {0};

    KG_TRY(kg_cuda_embed(st, rows, in, ctx->emb.data, ctx->emb.dt, ctx->emb.qtype, hp->n_embd,
                         ctx->emb.n_out, hp->embd_scale, ctx->x));
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        KG_TRY(kg_cuda_rope_cache(st, rows, in, ctx->rope_cs + (size_t)r * rope_stride,
                                  &ctx->ropes[r],
                                  ctx->ropes[r].freqs ? ctx->ropes[r].freqs : ctx->rope_freqs));
    }
    if (ctx->g4) {
        KG_TRY(cuda_g4_inputs(ctx, rows)); /* Gemma 4's per-layer inputs */
    }
    KG_TRY(cuda_rec_reset(ctx, rows)); /* a hybrid's slots that start over */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        const kg_layer_weights_t *ML = &ctx->model->layers[il];
        const bool attn = ML->kind == KG_LAYER_ATTN;
        /* the layer's own attention shape (Gemma 4's windowed and global
         * layers differ); a Gemma 4 shared-KV layer computes its queries
         * alone and stores nothing (rope_store with no K/V heads); where each
         * adapted projection's delta goes (lora.cu): Q|K|V is one fused
         * matrix, one output row each (gate|up: dense_ffn); qwen35's rows
         * hold each head's output gate after v (kg_backend_cuda_weights.cu) */
        const bool own_kv = ML->kv_layer == il;
        const int32_t n_q = hp->n_head * ML->head_dim;
        const int32_t n_kv = own_kv ? ML->n_head_kv * ML->head_dim : 0;
        const int32_t qkv_w = n_q + 2 * n_kv + (hp->attn_out_gate ? n_q : 0);
        const kg_cuda_rope_shape_t rsh = {hp->n_head,      own_kv ? ML->n_head_kv : 0,
                                          ML->head_dim,    ML->n_rot,
                                          ctx->block_size, qkv_w};
        const int32_t qkv_col[3] = {0, n_q, n_q + n_kv}, qkv_n[3] = {n_q, n_kv, n_kv};
        /* the previous layer's output (its FFN's, after its post-norm)
         * joins the residual here */
        const kg_cuda_residual_t res_prev =
            il > 0 ? block_out(ctx, il - 1) : kg_cuda_residual_t{NULL, NULL, NULL, 0.0f};
        if (ML->kind == KG_LAYER_FFN && L->moe) {
            /* no mixer, experts (nemotron_h_moe's MoE layers): the normed
             * residual twice, for the router and for the experts */
            KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_prev, L->ffn_norm,
                                       ctx->xn, L->router.dt, ctx->xe, L->exp_up.dt, hp->n_embd,
                                       hp->norm_eps));
            KG_TRY(moe_ffn(ctx, L, rows));
            continue;
        }
        if (ML->kind == KG_LAYER_FFN) {
            /* no mixer (nemotron_h's MLP layers): the FFN on the residual
             * normed by attn_norm (the model's ffn_norm here) */
            KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_prev, L->ffn_norm,
                                       ctx->xn, L->wgu.dt, NULL, KG_CUDA_F32, hp->n_embd,
                                       hp->norm_eps));
            KG_TRY(dense_ffn(ctx, il, rows));
            continue;
        }
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_prev, L->attn_norm,
                                   ctx->xn, attn ? L->wqkv.dt : L->rin.dt, NULL, KG_CUDA_F32,
                                   hp->n_embd, hp->norm_eps));
        if (!attn) { /* a hybrid's recurrent mixer, into tmp */
            KG_TRY(cuda_rec_mixer(ctx, il, rows));
        } else if (ctx->mla) { /* deepseek2's latent attention, into tmp */
            KG_TRY(cuda_mla_attention(ctx, il, rows));
        } else {
            KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wqkv, ctx->xn, ctx->qkv, rows));
            KG_TRY(cuda_lora_apply(ctx, il, KG_LORA_Q, 3, ctx->xn, L->wqkv.dt, hp->n_embd, ctx->qkv,
                                   qkv_w, qkv_col, qkv_n));
            /* llama4: its RoPE layers' Q/K L2 norms after the rotation (llama4.cu, which
             * rotates them), its NoPE layers' temperature at pos + 1 */
            const bool l2 = hp->qk_l2_norm && !ML->no_rope;
            const float *cs = ctx->rope_cs + (size_t)L->rope * rope_stride;
            if (l2) {
                KG_TRY(kg_cuda_rope_l2norm(st, rows, in, &rsh, hp->rope_mode == KG_ROPE_MODE_NEOX,
                                           ctx->qkv, cs, hp->norm_eps));
            }
            const kg_cuda_qkv_ops_t ops = {L->bqkv,
                                           L->q_norm,
                                           L->k_norm,
                                           hp->norm_eps,
                                           hp->rope_mode == KG_ROPE_MODE_NEOX,
                                           hp->q_scale,
                                           ML->no_rope || l2,
                                           hp->qk_norm_full,
                                           hp->attn_temp_nope && !ML->no_rope ? 0.0f
                                                                              : hp->attn_temp_scale,
                                           hp->attn_temp_floor,
                                           hp->attn_temp_nope ? 1 : 0,
                                           hp->v_norm};
            KG_TRY(kg_cuda_rope_store(st, rows, in, &rsh, &ops, ctx->qkv, cs, ctx->q16,
                                      layer_kv(ctx, il)));
            KG_TRY(attention(ctx, il, rows, single));
            if (hp->attn_out_gate) { /* qwen35: times sigmoid of the query's gate */
                KG_TRY(kg_cuda_attn_gate(st, rows, hdr, ctx->qkv + n_q + 2 * n_kv, qkv_w, ctx->att,
                                         L->wo.dt, n_q));
            }
            KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wo, ctx->att, ctx->tmp, rows));
            KG_TRY(cuda_lora_apply(ctx, il, KG_LORA_O, 1, ctx->att, L->wo.dt, n_q, ctx->tmp,
                                   hp->n_embd, zero, &hp->n_embd));
        }
        if (ML->n_ff == 0) {
            continue; /* a mixer alone (nemotron_h): block_out adds it next */
        }
        /* the attention (or mixer) output (+ bias, post-norm) joins the
         * residual */
        const kg_cuda_residual_t res_attn = {ctx->tmp, L->bo, L->attn_post_norm,
                                             hp->residual_scale};
        if (ctx->g4) {
            /* Gemma 4: the dense MLP (beside the experts in a MoE layer),
             * then the layer's end (kg_backend_cuda_gemma4.cu) */
            KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_attn, L->ffn_norm,
                                       ctx->xn, L->wgu.dt, NULL, KG_CUDA_F32, hp->n_embd,
                                       hp->norm_eps));
            KG_TRY(dense_ffn(ctx, il, rows));
            if (L->moe) {
                KG_TRY(cuda_g4_moe(ctx, il, rows));
            }
            KG_TRY(cuda_g4_layer_end(ctx, il, rows));
            continue;
        }
        if (L->moe) {
            /* the normed input twice: for the router, and for the experts */
            KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_attn, L->ffn_norm,
                                       ctx->xn, L->router.dt, ctx->xe, L->exp_up.dt, hp->n_embd,
                                       hp->norm_eps));
            KG_TRY(moe_ffn(ctx, L, rows));
            continue;
        }
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_attn, L->ffn_norm,
                                   ctx->xn, L->wgu.dt, NULL, KG_CUDA_F32, hp->n_embd,
                                   hp->norm_eps));
        KG_TRY(dense_ffn(ctx, il, rows));
    }
    /* the last residual add and the final norm, only for the rows that want
     * logits; a step that wants hidden states adds it on every row first
     * and norms them all into hid (F32, as the CPU backend's), then the
     * logits rows' norm reads the sums made (the same bits either way) */
    const kg_cuda_residual_t res_last = block_out(ctx, hp->n_layer - 1);
    const kg_cuda_residual_t res_none = {NULL, NULL, NULL, 0.0f};
    if (hidden) {
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res_last, ctx->out_norm,
                                   ctx->hid, KG_CUDA_F32, NULL, KG_CUDA_F32, hp->n_embd,
                                   hp->norm_eps));
    }
    KG_TRY(kg_cuda_add_rmsnorm(st, out_rows, hdr, true, in.out_row, ctx->x,
                               hidden ? &res_none : &res_last, ctx->out_norm, ctx->xo, ctx->head.dt,
                               NULL, KG_CUDA_F32, hp->n_embd, hp->norm_eps));
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
        st = run_step(ctx, rows, rows, true, rows <= ctx->out_cap, false);
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
static kg_status_t device_step(
    cuda_ctx_t *ctx, int32_t T, int32_t rows, int b, int32_t n_out, size_t n_ints, bool hidden) {
    KG_CUDA_CHECK(cudaMemcpyAsync(ctx->d_in, ctx->h_in, n_ints * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KG_CUDA_CHECK(cudaEventRecord(ctx->ev_in, ctx->stream));
    ctx->head_row0 = -1;
    if (b < 0) {
        count(&ctx->cnt.eager_steps);
        return run_step(ctx, T, n_out, false, true, hidden);
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
        return run_step(ctx, T, n_out, true, true, false);
    }
    /* first step of the bucket: the warm-up runs exactly the launches the
     * graph will hold (and computes this step), then the capture */
    KG_TRY(run_step(ctx, rows, rows, true, rows <= ctx->out_cap, false));
    if (rows <= ctx->out_cap) {
        ctx->head_row0 = 0;
    }
    return capture(ctx, b);
}

kg_status_t cuda_mark_dead(cuda_ctx_t *ctx, const char *what) {
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

kg_status_t cuda_copy_hidden(cuda_ctx_t *ctx, const kg_step_batch_t *batch, const float *rows) {
    const size_t E = (size_t)ctx->hp.n_embd;
    int32_t n = 0;
    for (int32_t t = 0; t < batch->n_tokens;) {
        if (!batch->want_hidden[t]) {
            t++;
            continue;
        }
        int32_t run = 1; /* consecutive rows wanted: one copy (mean pooling wants them all) */
        while (t + run < batch->n_tokens && batch->want_hidden[t + run]) {
            run++;
        }
        KG_CUDA_CHECK(cudaMemcpyAsync(batch->hidden + (size_t)n * E, rows + (size_t)t * E,
                                      (size_t)run * E * sizeof(float), cudaMemcpyDeviceToHost,
                                      ctx->stream));
        n += run;
        t += run;
    }
    KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    return KG_OK;
}

kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    ctx->last_n_outputs = 0;
    const int32_t T = batch->n_tokens, n_out = batch->n_outputs;
    if (T <= 0 || T > ctx->max_tokens || n_out < 0 || n_out > T) {
        return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                          "step of %d tokens and %d outputs (max %d tokens)", T, n_out,
                          ctx->max_tokens);
    }
    if (batch->n_hidden < 0 || (batch->n_hidden > 0 && (!batch->want_hidden || !batch->hidden))) {
        return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                          "step asks for %d hidden rows without their flags or buffer",
                          batch->n_hidden);
    }
    if (ctx->bert) {
        if (cudaSetDevice(ctx->device) != cudaSuccess ||
            cudaEventSynchronize(ctx->ev_in) != cudaSuccess) {
            return cuda_mark_dead(ctx, "the input upload");
        }
        return cuda_bert_forward(ctx, batch);
    }
    int32_t n_hid = 0;
    for (int32_t t = 0; batch->want_hidden && t < T; t++) {
        n_hid += batch->want_hidden[t] ? 1 : 0;
    }
    if (n_hid != batch->n_hidden) {
        return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                          "batch says %d hidden rows, want_hidden has %d", batch->n_hidden, n_hid);
    }
    if (ctx->max_ctx == 0 && fix_attention(ctx, batch) != KG_OK) {
        return cuda_mark_dead(ctx, "sizing the step inputs");
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        cudaEventSynchronize(ctx->ev_in) != cudaSuccess) {
        return cuda_mark_dead(ctx,
                              "the input upload"); /* the pinned inputs may still be in flight */
    }
    /* the adapters' plan (lora.cu); a step that uses one runs eagerly */
    bool lora_used = false;
    const kg_status_t lst = cuda_lora_plan(ctx, batch, &lora_used);
    if (lst == KG_ERR_INVALID) {
        return lst;
    }
    if (lst != KG_OK) {
        return cuda_mark_dead(ctx, "the LoRA plan's upload");
    }
    /* a hybrid's states: each token continues its slot, room for every slot
     * (before the bucket is chosen: growing them drops the graphs) */
    const kg_status_t rst = cuda_rec_begin(ctx, batch);
    if (rst == KG_ERR_INVALID) {
        return rst;
    }
    if (rst != KG_OK) {
        return cuda_mark_dead(ctx, "growing the recurrent states");
    }
    /* a decode-only step runs as the graph of its bucket (one that wants
     * hidden states eagerly: the graphs norm the logits rows only) */
    int b = -1;
    int32_t rows = T;
    if (ctx->use_graphs && n_out == T && !lora_used && n_hid == 0) {
        b = cuda_bucket_for(ctx, T);
        rows = b >= 0 && ctx->buckets[b].state != BUCKET_EAGER ? ctx->buckets[b].rows : T;
    }
    size_t n_ints = 0;
    const kg_status_t st = pack_inputs(ctx, batch, rows, b >= 0, &n_ints);
    if (st != KG_OK) {
        return st;
    }
    if (device_step(ctx, T, rows, b, n_out, n_ints, n_hid > 0) != KG_OK) {
        return cuda_mark_dead(ctx, "a step");
    }
    cuda_rec_end(ctx, batch);
    if (n_hid > 0 && cuda_copy_hidden(ctx, batch, ctx->hid) != KG_OK) {
        return cuda_mark_dead(ctx, "reading the hidden states");
    }
    ctx->last_n_outputs = n_out;
    if (logits && n_out > 0 && copy_logits(ctx, logits, n_out) != KG_OK) {
        return cuda_mark_dead(ctx, "reading the logits");
    }
    return KG_OK;
}

kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    if (n < 0 || n > ctx->last_n_outputs) {
        return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                          "sample of %d rows, the last step produced %d", n, ctx->last_n_outputs);
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess) {
        return cuda_mark_dead(ctx, "sampling");
    }
    /* one logits chunk at a time: the head of a chunk, then its rows */
    for (int32_t r0 = 0; r0 < n; r0 += ctx->out_cap) {
        const int32_t rows = n - r0 < ctx->out_cap ? n - r0 : ctx->out_cap;
        int32_t bad = -1;
        if (ensure_rows(ctx, r0) != KG_OK) {
            return cuda_mark_dead(ctx, "the head GEMM");
        }
        /* the requests' logit_bias first (logit_bias.cu), then the constrained
         * rows' masks (mask.cu), then the usual sampler: a masked token stays
         * -inf either way, and a row whose allowed tokens are all banned comes
         * out uniform over them, as in kg_sampler_sample_masked */
        if (kg_cuda_bias_apply(&ctx->bias, ctx->stream, ctx->logits, ctx->hp.n_vocab, reqs + r0,
                               rows) != KG_OK) {
            return cuda_mark_dead(ctx, "the logit bias");
        }
        if (kg_cuda_mask_apply(&ctx->mask, ctx->stream, ctx->logits, ctx->sampler.n_vocab,
                               reqs + r0, rows) != KG_OK) {
            return cuda_mark_dead(ctx, "applying token masks");
        }
        const kg_status_t st = kg_cuda_sampler_run(&ctx->sampler, ctx->stream, ctx->logits,
                                                   reqs + r0, rows, out + r0, &bad);
        if (st == KG_ERR_INVALID && bad >= 0) {
            ctx->last_n_outputs = 0;
            return cuda_fault(ctx, st, KG_FAULT_SEQ, -1, r0 + bad,
                              "sampling output row %d failed (token %d outside the vocabulary)",
                              r0 + bad, out[r0 + bad].token);
        }
        if (st != KG_OK) {
            return cuda_mark_dead(ctx, "sampling");
        }
        /* this chunk's logits are consumed (penalties are applied in place) */
        ctx->head_row0 = -1;
    }
    ctx->last_n_outputs = 0;
    return KG_OK;
}

/* KV blocks for the n choices of one prompt (kv_copy.cu). */
kg_status_t cuda_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
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
    if (cudaSetDevice(ctx->device) != cudaSuccess) {
        return cuda_mark_dead(ctx, "the KV block copy");
    }
    /* each layer that keeps K/V, by its own row width (Gemma 4's layers
     * differ; its shared-KV layers keep none: their source's blocks are
     * copied) */
    for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        const kg_layer_weights_t *ML = &ctx->model->layers[il];
        if (L->kv_il < 0) {
            continue;
        }
        const size_t block = kg_kv_block_bytes(ctx->kv_type == KG_KV_Q8_0, ctx->block_size,
                                               (int64_t)ML->n_head_kv * ML->head_dim);
        if (kg_cuda_kv_copy(ctx->stream, ctx->kv + L->kv_off, L->kv_plane, ctx->kv_caches, block,
                            src, dst, n) != KG_OK) {
            return cuda_mark_dead(ctx, "the KV block copy");
        }
    }
    return KG_OK;
}

void cuda_last_fault(const kg_backend_t *be, kg_backend_fault_t *out) {
    *out = ((const cuda_ctx_t *)be->ctx)->fault;
}

/* The expert load, read back from the align kernel's counters (one small
 * copy, after the work queued so far). */
void cuda_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out) {
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

void cuda_counters(const kg_backend_t *be, kg_backend_counters_t *out) {
    const cuda_ctx_t *ctx = (const cuda_ctx_t *)be->ctx;
    out->graphs_captured = __atomic_load_n(&ctx->cnt.graphs_captured, __ATOMIC_RELAXED);
    out->graph_fallbacks = __atomic_load_n(&ctx->cnt.graph_fallbacks, __ATOMIC_RELAXED);
    out->graph_steps = __atomic_load_n(&ctx->cnt.graph_steps, __ATOMIC_RELAXED);
    out->eager_steps = __atomic_load_n(&ctx->cnt.eager_steps, __ATOMIC_RELAXED);
}
