/* kg_backend_cuda: the CUDA backend: its creation (the checks, the
 * device, cuBLAS, the buffers), its vtable, and freeing it. The weights'
 * upload is kg_backend_cuda_weights.cu, the step (forward, graphs,
 * sampling, faults) kg_backend_cuda_step.cu; kg_backend_cuda_int.cuh holds
 * the context they share.
 *
 * DESIGN
 * KV pool. F16 in device memory, the CPU backend's layout: per layer K and
 * V of (n_kv_blocks * kv_block_size rows, n_head_kv * head_dim), each
 * layer's own shape (Gemma 4's windowed and global layers differ) and none
 * for a Gemma 4 shared-KV layer, which reads its source layer's planes;
 * deepseek2's latent attention keeps one plane per layer, its latent rows
 * (head_dim = kv_lora_rank + rope dims, kg_backend_cuda_mla.cu); none for
 * a bert encoder, which keeps nothing between steps.
 *
 * Buffers. Every activation buffer is allocated here at start for
 * max_batch_tokens tokens (see kg_backend_cuda_step.cu), so a step makes
 * no allocation. */
#include "kg_backend_cuda_int.cuh"

#include <stdarg.h>
#include <string.h>

static void cuda_free(kg_backend_t *be);
static void cuda_memory(const kg_backend_t *be, kg_backend_memory_t *out);

static const struct kg_backend_i cuda_iface = {
    /* .name    = */ "cuda",
    /* .free    = */ cuda_free,
    /* .forward = */ cuda_forward,
    /* .memory  = */ cuda_memory,
};

bool kg_backend_is_cuda(const kg_backend_t *be) {
    return be && be->iface.free == cuda_free;
}

kg_status_t cuda_fault(cuda_ctx_t *ctx,
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

int cuda_bucket_for(const cuda_ctx_t *ctx, int32_t rows) {
    for (int i = 0; i < ctx->n_buckets; i++) {
        if (ctx->buckets[i].rows >= rows) {
            return i;
        }
    }
    return -1;
}

/* The step's input buffers for table_cap block-table entries. */
kg_status_t cuda_alloc_inputs(cuda_ctx_t *ctx) {
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
    ctx->router.sigmoid = hp->moe_gating == KG_MOE_SIGMOID;
    ctx->router.n_groups = hp->n_expert_groups;
    ctx->router.n_group_used = hp->n_group_used;
    ctx->router.w_on_input = hp->moe_w_before;
    p->rows_cap = kg_cuda_moe_rows_cap(ctx->max_tokens, hp->n_expert_used, hp->n_expert);
    const size_t R = (size_t)p->rows_cap;
    KG_TRY(dev_alloc(ctx, (void **)&p->sel, T * k * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->w, T * k * sizeof(float)));
    KG_TRY(dev_alloc(ctx, (void **)&p->slot, T * k * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->offset, (X + 1) * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->row_tok, R * sizeof(int32_t)));
    KG_TRY(dev_alloc(ctx, (void **)&p->tile_expert, R / KG_CUDA_MOE_TILE * sizeof(int32_t)));
    if (hp->moe_w_before) { /* llama4: the weights go on the gathered rows */
        KG_TRY(dev_alloc(ctx, (void **)&p->row_w, R * sizeof(float)));
    }
    KG_TRY(dev_alloc(ctx, (void **)&p->stats, (4 + X) * sizeof(long long)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_logits, T * X * sizeof(float)));
    KG_TRY(dev_alloc(ctx, &ctx->xe, T * E * es));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_g, R * FX * sizeof(float)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_u, R * FX * sizeof(float)));
    KG_TRY(dev_alloc(ctx, &ctx->moe_h, R * FX * es));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->moe_y, R * E * sizeof(float)));
    bool shared = false; /* glm4moe's expert_shared_count, qwen35moe's shared expert */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        shared = shared || ctx->layers[il].n_ff_shexp > 0;
    }
    if (shared) {
        KG_TRY(dev_alloc(ctx, (void **)&ctx->shexp, T * E * sizeof(float)));
    }
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
    /* 16-bit activations unless some GEMM reads F32; the dense FFN's width
     * (0 when every layer has experts); the widest layer's Q and K/V rows */
    size_t es = 2, F = 0, n_q = 0, n_kv = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        const kg_layer_weights_t *ML = &ctx->model->layers[il];
        const size_t lq = (size_t)hp->n_head * (size_t)ML->head_dim;
        const size_t lkv = (size_t)ML->n_head_kv * (size_t)ML->head_dim;
        n_q = lq > n_q ? lq : n_q;
        n_kv = lkv > n_kv ? lkv : n_kv;
        const kg_cuda_mat_t *mats[] = {&L->wqkv,   &L->wo,       &L->wgu,
                                       &L->wdown,  &L->router,   &L->exp_gate,
                                       &L->exp_up, &L->exp_down, &L->rin};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (mats[i]->data && mats[i]->dt == KG_CUDA_F32) {
                es = 4;
            }
        }
        /* the shared expert runs in the dense FFN's buffers (Gemma 4's MoE
         * layers keep their dense MLP beside the experts) */
        const size_t FL = L->moe && !ctx->g4 ? (size_t)L->n_ff_shexp : (size_t)ML->n_ff;
        F = FL > F ? FL : F;
    }
    const size_t es_head = kg_cuda_dtype_size(ctx->head.dt);

    /* KV pool (none for an encoder: its steps keep nothing), for the
     * attention layers only (a hybrid's recurrent layers keep states) */
    ctx->n_kv_layers = 0;
    ctx->kv_caches = hp->n_lora_kv > 0 ? 1 : 2; /* MLA: the latent rows are K and V */
    size_t kv_bytes = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *ML = &ctx->model->layers[il];
        cuda_layer_t *L = &ctx->layers[il];
        const bool own = ML->kind == KG_LAYER_ATTN && ML->kv_layer == il;
        L->kv_il = own ? ctx->n_kv_layers++ : -1;
        if (own) {
            L->kv_plane = (size_t)ctx->n_kv_blocks *
                          kg_kv_block_bytes(ctx->kv_type == KG_KV_Q8_0, ctx->block_size,
                                            (int64_t)ML->n_head_kv * ML->head_dim);
            L->kv_off = kv_bytes;
            kv_bytes += (size_t)ctx->kv_caches * L->kv_plane;
        } else if (ML->kind == KG_LAYER_ATTN) { /* Gemma 4: an earlier layer's K/V */
            L->kv_plane = ctx->layers[ML->kv_layer].kv_plane;
            L->kv_off = ctx->layers[ML->kv_layer].kv_off;
        }
    }
    if (!ctx->bert) {
        ctx->kv_size = kv_bytes;
        KG_CUDA_CHECK(cudaMalloc((void **)&ctx->kv, ctx->kv_size));
        KG_CUDA_CHECK(cudaMemset(ctx->kv, 0, ctx->kv_size));
    }

    KG_TRY(dev_alloc(ctx, (void **)&ctx->x, T * E * 4));
    /* qwen35's rows hold each head's output gate after v */
    KG_TRY(dev_alloc(ctx, (void **)&ctx->qkv,
                     T * (n_q + 2 * n_kv + (hp->attn_out_gate ? n_q : 0)) * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->tmp, T * E * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->gu, T * 2 * F * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->rope_cs,
                     (size_t)ctx->n_ropes * T * (size_t)ctx->max_rot * 4));
    if (hp->n_lora_kv == 0) { /* attention.cu's (MLA's latent attention needs neither) */
        KG_TRY(dev_alloc(ctx, (void **)&ctx->split,
                         kg_cuda_attention_scratch_size(&ctx->ash, ATT_PAIR_CAP)));
        KG_TRY(dev_alloc(ctx, (void **)&ctx->q16, T * n_q * 2));
    }
    KG_TRY(dev_alloc(ctx, (void **)&ctx->logits, (size_t)ctx->out_cap * (size_t)hp->n_vocab * 4));
    KG_TRY(dev_alloc(ctx, &ctx->xn, T * E * es));
    KG_TRY(dev_alloc(ctx, &ctx->att, T * n_q * es));
    KG_TRY(dev_alloc(ctx, &ctx->h, T * F * es));
    KG_TRY(dev_alloc(ctx, &ctx->xo, T * E * es_head));
    /* a step's hidden rows: gu holds them when it is as large (gate|up
     * outputs are dead once the last layer's down GEMM has run) */
    if (2 * F >= E) {
        ctx->hid = ctx->gu;
    } else {
        KG_TRY(dev_alloc(ctx, (void **)&ctx->hid, T * E * 4));
    }
    if (hp->n_expert > 0) {
        KG_TRY(alloc_moe(ctx, es));
    }

    /* step inputs: header (4), the per-token arrays (T each), table */
    KG_TRY(cuda_alloc_inputs(ctx));
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
        cuda_lora_free(ctx);
        cuda_rec_free(ctx);
        cuda_mla_free(ctx);
        cuda_g4_free(ctx);
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
                free_mat(&L->rin);
                free_mat(&L->rout);
                float *vecs[] = {
                    L->bqkv,          L->bo,      L->q_norm,      L->k_norm,     L->attn_post_norm,
                    L->ffn_post_norm, L->sinks,   L->router_b,    L->exp_gate_b, L->exp_up_b,
                    L->exp_down_b,    L->probs_b, L->attn_norm_b, L->ffn_norm_b, L->up_b,
                    L->down_b,        L->rconv,   L->dt_b,        L->ssm_a,      L->ssm_norm,
                    L->shexp_gate,    L->conv_b,  L->ssm_d};
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
        cudaFree(ctx->pos_embd);
        cudaFree(ctx->type_embd);
        cudaFree(ctx->tok_norm);
        cudaFree(ctx->tok_norm_b);
        if (ctx->hid != ctx->gu) {
            cudaFree(ctx->hid);
        }
        cudaFree(ctx->rope_freqs);
        for (int32_t r = 0; ctx->ropes && r < ctx->n_ropes; r++) {
            cudaFree(ctx->ropes[r].freqs);
        }
        cudaFree(ctx->gelu_table);
        cudaFree(ctx->kv);
        const kg_cuda_moe_plan_t *mp = &ctx->moe_plan;
        void *bufs[] = {ctx->x,     ctx->qkv,        ctx->tmp,   ctx->gu,      ctx->rope_cs,
                        ctx->split, ctx->logits,     ctx->q16,   ctx->xn,      ctx->att,
                        ctx->h,     ctx->xo,         ctx->d_in,  ctx->blas_ws, mp->sel,
                        mp->w,      mp->slot,        mp->offset, mp->row_tok,  mp->tile_expert,
                        mp->stats,  ctx->moe_logits, ctx->xe,    ctx->moe_g,   ctx->moe_u,
                        ctx->moe_h, ctx->moe_y,      ctx->shexp, mp->row_w};
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
    out->state_size = cuda_rec_size(ctx, false);
    out->snapshot_size = cuda_rec_size(ctx, true);
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
    ctx->bert = kg_model_embed_only(model); /* bert, nomic-bert */
    /* an encoder keeps no KV and has no LM head: nothing to copy, sample or
     * adapt; every family returns hidden states (embedding jobs) */
    be->kv_copy = ctx->bert ? NULL : cuda_kv_copy;
    be->lora_add = ctx->bert ? NULL : cuda_lora_add;
    be->lora_remove = ctx->bert ? NULL : cuda_lora_remove;
    be->sample = ctx->bert ? NULL : cuda_sample;
    be->hidden = true;
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
    if (hp->n_lora_kv > 0 && cuda_mla_check(hp, errstr, errstr_size) != KG_OK) {
        goto fail; /* deepseek2: mla.cu's kernels, not attention.cu's */
    }
    ctx->kv_type = params->kv_type;
    if (ctx->kv_type == KG_KV_Q8_0 && hp->n_lora_kv > 0) {
        snprintf(errstr, errstr_size,
                 "cuda backend: --kv-type q8_0: multi-head latent attention keeps its latent "
                 "cache in f16");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer && ctx->kv_type == KG_KV_Q8_0; il++) {
        const kg_layer_weights_t *ML = &model->layers[il];
        if (ML->kind == KG_LAYER_ATTN && ML->head_dim % 32 != 0) {
            snprintf(errstr, errstr_size,
                     "cuda backend: --kv-type q8_0 needs heads of a multiple of 32 dims (Q8_0 "
                     "blocks of 32 values); layer %d has %d",
                     (int)il, ML->head_dim);
            goto fail;
        }
    }
    /* every layer's own shape (Gemma 4's windowed and global layers
     * differ): ash has the largest head for the scratch; a prefill tile
     * holds the tokens that fit every layer's tile (prefill_qt); the
     * latent attention's shape is cuda_mla_check's */
    ctx->ash.n_head = hp->n_head;
    ctx->ash.n_head_kv = hp->n_head_kv;
    ctx->ash.head_dim = hp->head_dim;
    ctx->ash.block_size = ctx->block_size;
    ctx->prefill_qt = 0;
    ctx->prefill_rt = 0;
    for (int32_t il = 0; il < hp->n_layer && hp->n_lora_kv == 0; il++) {
        const kg_layer_weights_t *ML = &model->layers[il];
        const int32_t max_hd = ctx->bert ? 256 : 512; /* bert.cu's; attention.cu's */
        if (ML->head_dim % 8 != 0 || ML->head_dim > max_hd || ML->n_rot % 2 != 0 ||
            ML->n_rot > ML->head_dim || hp->n_head % ML->n_head_kv != 0) {
            snprintf(errstr, errstr_size,
                     "cuda backend: unsupported attention shape in layer %d (head_dim %d, n_rot "
                     "%d, heads %d/%d; head_dim must be a multiple of 8 up to %d)",
                     (int)il, ML->head_dim, ML->n_rot, hp->n_head, ML->n_head_kv, (int)max_hd);
            goto fail;
        }
        const kg_cuda_attn_shape_t lsh = {hp->n_head, ML->n_head_kv, ML->head_dim, ctx->block_size};
        const int32_t rt = kg_cuda_attention_prefill_rt(&lsh);
        const int32_t qt = kg_cuda_attention_tile_tokens(&lsh, rt);
        ctx->prefill_qt = ctx->prefill_qt == 0 || qt < ctx->prefill_qt ? qt : ctx->prefill_qt;
        /* the largest: a prefill step's rt above 1 tiles its tokens; each
         * layer then takes its own (a 512-dim layer's is 1) */
        ctx->prefill_rt = rt > ctx->prefill_rt ? rt : ctx->prefill_rt;
        ctx->ash.head_dim = ML->head_dim > ctx->ash.head_dim ? ML->head_dim : ctx->ash.head_dim;
    }
    if (ctx->prefill_rt == 0) { /* MLA */
        ctx->prefill_rt = kg_cuda_attention_prefill_rt(&ctx->ash);
    }
    if (ctx->prefill_qt == 0) { /* MLA */
        ctx->prefill_qt = kg_cuda_attention_tile_tokens(&ctx->ash, ctx->prefill_rt);
    }
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
        if (cuda_check_type(kg_gguf_tensor(model->gguf, i), errstr, errstr_size) != KG_OK) {
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
    /* quantized GEMM weights stay GGUF blocks unless cuBLAS runs the GEMMs
     * or KGEN_CUDA_NATIVE_QUANT=0 asks for the BF16 expansion */
    ctx->native_q = ctx->blas.mode == KG_CUDA_GEMM_MMA && env_int("KGEN_CUDA_NATIVE_QUANT", 1) != 0;
    if (cuda_upload_weights(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: uploading the weights failed (%zu MiB so far; see the log)",
                 ctx->weights_size >> 20);
        goto fail;
    }
    cuda_log_weight_types(ctx);
    if (alloc_buffers(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: allocating the KV pool (%zu MiB) and buffers failed (see the log)",
                 ctx->kv_size >> 20);
        goto fail;
    }
    if (hp->n_lora_kv > 0 && cuda_mla_init(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: allocating the latent attention's buffers failed (see the log)");
        goto fail;
    }
    if (ctx->bert && cuda_bert_init(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: the encoder's RoPE table failed (see the log)");
        goto fail;
    }
    if (cuda_rec_init(ctx, params->n_seq_slots, params->n_state_snapshots, errstr, errstr_size) !=
        KG_OK) {
        goto fail;
    }
    if (ctx->rec) { /* a hybrid: its per-slot states (kg_backend_cuda_recurrent.cu) */
        be->state_copy = cuda_state_copy;
        be->state_save = cuda_state_save;
        be->n_snapshots = params->n_state_snapshots > 0 ? params->n_state_snapshots : 0;
    }
    KG_LOG_INFO("cuda",
                "backend ready device=\"%s\" sm=%d cc=%d.%d driver_cuda=%d.%d runtime_cuda=%d.%d "
                "weights_mib=%zu kv_mib=%zu kv_type=%s scratch_mib=%zu gemm=%s cublas=%s graphs=%d "
                "graph_buckets=%d max_outputs=%d",
                prop.name, ctx->n_sm, prop.major, prop.minor, probe.driver_version / 1000,
                (probe.driver_version % 1000) / 10, probe.runtime_version / 1000,
                (probe.runtime_version % 1000) / 10, ctx->weights_size >> 20, ctx->kv_size >> 20,
                kg_kv_type_name(ctx->kv_type), ctx->scratch_size >> 20,
                ctx->blas.mode == KG_CUDA_GEMM_CUBLAS ? "cublas" : "mma", blas_desc,
                ctx->use_graphs ? 1 : 0, ctx->use_graphs ? ctx->n_buckets : 0, ctx->out_cap);
    return be;
fail:
    cuda_free(be);
    return NULL;
}
