/* kg_backend_cpu: the reference backend, which runs one step batch through
 * the model's graph (kg_model's switches: every supported family) with one
 * GEMM per weight matrix over all the step's tokens. This file builds it:
 * the weights converted at load, the KV pool, the step's buffers and the
 * vtable.
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
 * The forward pass (the step, and the experts) is kg_backend_cpu_forward.c;
 * the types both files share are in kg_backend_cpu_int.h. */
#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_model_bert.h"
#include "../../model/kg_quant.h"
#include "../kg_backend_impl.h"
#include "../kg_math.h"
#include "cpu_attn_flash.h"
#include "cpu_bert.h"
#include "cpu_gemm.h"
#include "cpu_lora.h"
#include "cpu_moe.h"
#include "cpu_ops.h"
#include "cpu_quant.h"
#include "cpu_recurrent.h"
#include "cpu_vecdot.h"
#include "kg_backend_cpu_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- weights ----

static void weight_clear(cpu_weight_t *w) {
    free(w->owned);
    w->owned = NULL;
    cpu_gemm_clear(&w->packed);
}

/* The index of layer L's RoPE (base, scale, dims, divisors) in
 * ctx->ropes, added when new; false when out of memory. */
static bool add_rope(cpu_ctx_t *ctx, const kg_layer_weights_t *L, int32_t *index) {
    const float base = L->rope_base, scale = L->rope_scale;
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        if (ctx->ropes[r].base == base && ctx->ropes[r].scale == scale &&
            ctx->ropes[r].n_rot == L->n_rot && ctx->ropes[r].factors == L->rope_freqs) {
            *index = r;
            return true;
        }
    }
    float *freqs = NULL;
    if (L->rope_freqs) {
        freqs = malloc((size_t)L->n_rot / 2 * sizeof(float));
        if (!freqs) {
            return false;
        }
        kg_dequantize(L->rope_freqs->type, L->rope_freqs->data, freqs, L->n_rot / 2);
    }
    cpu_rope_t *grown = realloc(ctx->ropes, (size_t)(ctx->n_ropes + 1) * sizeof(*grown));
    if (!grown) {
        free(freqs);
        return false;
    }
    ctx->ropes = grown;
    cpu_rope_t *rp = &ctx->ropes[ctx->n_ropes];
    rp->base = base;
    rp->scale = scale;
    rp->n_rot = L->n_rot;
    rp->factors = L->rope_freqs;
    rp->freqs = freqs;
    ctx->rope_stride = L->n_rot > ctx->rope_stride ? L->n_rot : ctx->rope_stride;
    kg_rope_yarn_corr_dims(L->n_rot, ctx->hp.n_ctx_orig, base, ctx->hp.yarn_beta_fast,
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
    return cpu_weight_init(w, &flat, ctx, errstr, errstr_size);
}

/* The router, every expert's three matrices (packed one by one from the
 * model's per-expert views) and the expert biases of one layer. */
/* Multi-head latent attention's weights of one layer (deepseek2): the
 * query path, the latent's down-projection and norm, and each head's k_b
 * and v_b matrices packed from the model's per-head views. */
static bool mla_layer_init(cpu_layer_t *L,
                           const kg_layer_weights_t *src,
                           cpu_ctx_t *ctx,
                           char *errstr,
                           size_t errstr_size) {
    const int32_t H = ctx->hp.n_head;
    L->k_b = calloc((size_t)H, sizeof(*L->k_b));
    L->v_b = calloc((size_t)H, sizeof(*L->v_b));
    if (!L->k_b || !L->v_b) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    if (src->wq_a ? !cpu_weight_init(&L->wq_a, src->wq_a, ctx, errstr, errstr_size) ||
                        !cpu_weight_init(&L->q_a_norm, src->q_a_norm, ctx, errstr, errstr_size) ||
                        !cpu_weight_init(&L->wq_b, src->wq_b, ctx, errstr, errstr_size)
                  : !cpu_weight_init(&L->wq, src->wq, ctx, errstr, errstr_size)) {
        return false;
    }
    if (!cpu_weight_init(&L->wkv_a, src->wkv_a_mqa, ctx, errstr, errstr_size) ||
        !cpu_weight_init(&L->kv_a_norm, src->kv_a_norm, ctx, errstr, errstr_size) ||
        !cpu_weight_init(&L->wo, src->wo, ctx, errstr, errstr_size)) {
        return false;
    }
    for (int32_t h = 0; h < H; h++) {
        if (!cpu_weight_init(&L->k_b[h], &src->k_b[h], ctx, errstr, errstr_size) ||
            !cpu_weight_init(&L->v_b[h], &src->v_b[h], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    return true;
}

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
    if (!cpu_weight_init(&L->gate_inp, src->ffn_gate_inp, ctx, errstr, errstr_size)) {
        return false;
    }
    for (int32_t e = 0; e < X; e++) {
        /* nemotron_h_moe's experts have no gate */
        if ((src->exp_gate &&
             !cpu_weight_init(&L->exp_gate[e], &src->exp_gate[e], ctx, errstr, errstr_size)) ||
            !cpu_weight_init(&L->exp_up[e], &src->exp_up[e], ctx, errstr, errstr_size) ||
            !cpu_weight_init(&L->exp_down[e], &src->exp_down[e], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    const kg_gguf_tensor_t *bsrc[] = {src->ffn_gate_inp_b, src->gate_exps_b, src->up_exps_b,
                                      src->down_exps_b, src->exp_probs_b};
    cpu_weight_t *bdst[] = {&L->gate_inp_b, &L->exp_gate_b, &L->exp_up_b, &L->exp_down_b,
                            &L->exp_probs_b};
    for (size_t i = 0; i < sizeof(bsrc) / sizeof(bsrc[0]); i++) {
        if (bsrc[i] && !vector_init(bdst[i], bsrc[i], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    const kg_gguf_tensor_t *g4src[] = {src->ffn_gate_inp_s, src->down_exps_s, src->ffn_pre_norm_2,
                                       src->ffn_post_norm_1, src->ffn_post_norm_2};
    cpu_weight_t *g4dst[] = {&L->gate_inp_s, &L->exp_down_s, &L->ffn_pre_norm_2,
                             &L->ffn_post_norm_1, &L->ffn_post_norm_2};
    for (size_t i = 0; i < sizeof(g4src) / sizeof(g4src[0]); i++) {
        if (g4src[i] && !cpu_weight_init(g4dst[i], g4src[i], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    if (src->up_shexp &&
        ((src->gate_shexp &&
          !cpu_weight_init(&L->sh_gate, src->gate_shexp, ctx, errstr, errstr_size)) ||
         !cpu_weight_init(&L->sh_up, src->up_shexp, ctx, errstr, errstr_size) ||
         !cpu_weight_init(&L->sh_down, src->down_shexp, ctx, errstr, errstr_size))) {
        return false;
    }
    if (src->gate_inp_shexp &&
        !vector_init(&L->sh_gate_inp, src->gate_inp_shexp, ctx, errstr, errstr_size)) {
        return false;
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
                cpu_weight_t *ws[] = {&L->attn_norm,
                                      &L->ffn_norm,
                                      &L->wq,
                                      &L->wk,
                                      &L->wv,
                                      &L->wo,
                                      &L->w_gate,
                                      &L->w_up,
                                      &L->w_down,
                                      &L->bq,
                                      &L->bk,
                                      &L->bv,
                                      &L->bo,
                                      &L->q_norm,
                                      &L->k_norm,
                                      &L->attn_post_norm,
                                      &L->ffn_post_norm,
                                      &L->pe_gate,
                                      &L->pe_proj,
                                      &L->pe_post_norm};
                for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
                    weight_clear(ws[i]);
                }
                cpu_weight_t *moe_ws[] = {
                    &L->gate_inp,       &L->gate_inp_b,      &L->exp_gate_b,      &L->exp_up_b,
                    &L->exp_down_b,     &L->sinks,           &L->exp_probs_b,     &L->sh_gate,
                    &L->sh_up,          &L->sh_down,         &L->gate_inp_s,      &L->exp_down_s,
                    &L->ffn_pre_norm_2, &L->ffn_post_norm_1, &L->ffn_post_norm_2, &L->sh_gate_inp};
                for (size_t i = 0; i < sizeof(moe_ws) / sizeof(moe_ws[0]); i++) {
                    weight_clear(moe_ws[i]);
                }
                cpu_weight_t *mla_ws[] = {&L->wq_a, &L->q_a_norm, &L->wq_b, &L->wkv_a,
                                          &L->kv_a_norm};
                for (size_t i = 0; i < sizeof(mla_ws) / sizeof(mla_ws[0]); i++) {
                    weight_clear(mla_ws[i]);
                }
                for (int32_t h = 0; L->k_b && L->v_b && h < ctx->hp.n_head; h++) {
                    weight_clear(&L->k_b[h]);
                    weight_clear(&L->v_b[h]);
                }
                free(L->k_b);
                free(L->v_b);
                weight_clear(&L->sc_in);
                weight_clear(&L->sc_out);
                weight_clear(&L->ssm_in);
                weight_clear(&L->ssm_out);
                cpu_recurrent_layer_clear(L);
                cpu_weight_t *exps[] = {L->exp_gate, L->exp_up, L->exp_down};
                for (size_t i = 0; i < 3; i++) {
                    for (int32_t e = 0; exps[i] && e < ctx->hp.n_expert; e++) {
                        weight_clear(&exps[i][e]);
                    }
                    free(exps[i]);
                }
            }
        }
        cpu_bert_free(ctx);
        cpu_moe_plan_clear(&ctx->plan);
        for (int i = 0; ctx->moe_qact && i < ctx->n_threads; i++) {
            cpu_qact_clear(&ctx->moe_qact[i]);
        }
        free(ctx->moe_qact);
        for (int i = 0; ctx->mla_qact && i < ctx->n_threads; i++) {
            cpu_qact_clear(&ctx->mla_qact[i]);
        }
        free(ctx->mla_qact);
        free(ctx->moe_tokens);
        free(ctx->moe_active);
        weight_clear(&ctx->output_norm);
        weight_clear(&ctx->output);
        weight_clear(&ctx->output_b);
        weight_clear(&ctx->pl_model_proj);
        weight_clear(&ctx->pl_proj_norm);
        for (int32_t r = 0; ctx->ropes && r < ctx->n_ropes; r++) {
            free(ctx->ropes[r].freqs);
        }
        if (ctx->k_cache) {
            for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
                free(ctx->k_cache[il]);
                free(ctx->v_cache[il]);
            }
        }
        free(ctx->k_cache);
        free(ctx->v_cache);
        cpu_lora_free(ctx);
        cpu_recurrent_free(ctx);
        kg_pool_free(ctx->pool);
        cpu_qact_clear(&ctx->qact);
        cpu_qgemm_scratch_free(ctx->qscratch);
        free(ctx->layers);
        free(ctx->rope_freqs);
        free(ctx->ropes);
        free(ctx->gelu_table);
        float *bufs[] = {ctx->x,       ctx->xn,      ctx->xr,         ctx->q,        ctx->k,
                         ctx->v,       ctx->att,     ctx->gate,       ctx->up,       ctx->tmp,
                         ctx->rope_cs, ctx->scores,  ctx->moe_logits, ctx->moe_x,    ctx->moe_g,
                         ctx->moe_u,   ctx->moe_y,   ctx->moe_xr,     ctx->shexp,    ctx->mla_q,
                         ctx->mla_qa,  ctx->mla_att, ctx->mla_hin,    ctx->mla_hout, ctx->mla_xr,
                         ctx->pl_in,   ctx->pl_gate, ctx->qgate,      ctx->flash};
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
    out->state_size = cpu_recurrent_size(ctx, false);
    out->snapshot_size = cpu_recurrent_size(ctx, true);
}

static void cpu_last_fault(const kg_backend_t *be, kg_backend_fault_t *out) {
    const cpu_ctx_t *ctx = be->ctx;
    *out = ctx->fault;
}

static float *scratch(cpu_ctx_t *ctx, size_t n_floats, bool *ok) {
    float *p = calloc(n_floats ? n_floats : 1, sizeof(float));
    if (!p) {
        *ok = false;
    }
    ctx->scratch_size += n_floats * sizeof(float);
    return p;
}

static void cpu_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out) {
    const cpu_ctx_t *ctx = be->ctx;
    *out = ctx->moe_stats;
    out->n_per_expert = ctx->moe_tokens;
}

/* KV blocks src[i] -> dst[i]: block_size rows of K and of V per layer. */
static kg_status_t
cpu_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    cpu_ctx_t *ctx = be->ctx;
    const size_t rows = (size_t)ctx->block_size;
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= ctx->n_kv_blocks || dst[i] < 0 || dst[i] >= ctx->n_kv_blocks ||
            src[i] == dst[i]) {
            return KG_ERR_INVALID;
        }
    }
    for (int32_t il = 0; il < ctx->hp.n_layer; il++) {
        const kg_layer_weights_t *L = &ctx->model->layers[il];
        /* fp16 values per block and layer, the layer's own shape */
        const size_t block = rows * (size_t)L->n_head_kv * (size_t)L->head_dim;
        for (int32_t i = 0; ctx->k_cache[il] && i < n; i++) {
            memcpy(ctx->k_cache[il] + (size_t)dst[i] * block,
                   ctx->k_cache[il] + (size_t)src[i] * block, block * sizeof(uint16_t));
            if (ctx->v_cache[il]) { /* MLA has none */
                memcpy(ctx->v_cache[il] + (size_t)dst[i] * block,
                       ctx->v_cache[il] + (size_t)src[i] * block, block * sizeof(uint16_t));
            }
        }
    }
    return KG_OK;
}

static const struct kg_backend_i cpu_iface = {
    /* .name    = */ "cpu",
    /* .free    = */ cpu_free,
    /* .forward = */ cpu_backend_forward,
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
    be->last_fault = cpu_last_fault;
    /* cpu_lora takes one Q/K/V/FFN shape for every layer (not Gemma 4's),
     * and the latent attention runs no adapter deltas: such a model takes
     * no adapters at all rather than some of their tensors */
    const bool lora_ok =
        model->hp.n_lora_kv == 0 &&
        !(kg_model_features(model) & (KG_MODEL_FEAT_HEAD_PER_LAYER | KG_MODEL_FEAT_KV_SHARED));
    be->lora_add = lora_ok ? cpu_lora_add : NULL;
    be->lora_remove = lora_ok ? cpu_lora_remove : NULL;
    be->no_lora_why = lora_ok                   ? NULL
                      : model->hp.n_lora_kv > 0 ? "multi-head latent attention"
                                                : "per-layer head sizes and shared K/V layers";
    be->hidden = true;
    const kg_hparams_t *hp = &model->hp;
    ctx->model = model;
    ctx->hp = *hp;
    ctx->n_threads = params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ctx->pool = kg_pool_new(ctx->n_threads);
    if (!ctx->pool) {
        snprintf(errstr, errstr_size, "cpu backend: cannot start %d threads", ctx->n_threads);
        goto fail;
    }
    if (params->kv_type != KG_KV_F16) {
        snprintf(errstr, errstr_size,
                 "cpu backend: --kv-type %s is a cuda backend option (the cpu backend keeps K/V "
                 "in f16)",
                 kg_kv_type_name(params->kv_type));
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
    if (kg_model_embed_only(model)) { /* bert: an encoder with its own forward */
        if (!cpu_bert_init(ctx, errstr, errstr_size)) {
            goto fail;
        }
        be->iface.forward = cpu_bert_forward;
        be->kv_copy = NULL;
        be->lora_add = NULL;
        be->lora_remove = NULL;
        be->no_lora_why = "an encoder";
        return be;
    }

    ctx->layers = calloc((size_t)hp->n_layer, sizeof(*ctx->layers));
    if (!ctx->layers) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *src = &model->layers[il];
        cpu_layer_t *L = &ctx->layers[il];
        /* a layer reading another's K/V (Gemma 4) projects no K or V */
        const bool own_kv = src->kv_layer == il;
        if (src->kind != KG_LAYER_ATTN) { /* a hybrid's recurrent layer */
            if (!cpu_recurrent_layer_init(ctx, il, L, errstr, errstr_size)) {
                goto fail;
            }
        } else if (src->wkv_a_mqa) {
            if (!mla_layer_init(L, src, ctx, errstr, errstr_size)) {
                goto fail;
            }
        } else if (!cpu_weight_init(&L->wq, src->wq, ctx, errstr, errstr_size) ||
                   (own_kv && !cpu_weight_init(&L->wk, src->wk, ctx, errstr, errstr_size)) ||
                   (own_kv && !cpu_weight_init(&L->wv, src->wv, ctx, errstr, errstr_size)) ||
                   !cpu_weight_init(&L->wo, src->wo, ctx, errstr, errstr_size)) {
            goto fail;
        }
        /* experts, a dense FFN, or both (Gemma 4's MoE layers) */
        if (src->ffn_gate_inp && !moe_layer_init(L, src, ctx, errstr, errstr_size)) {
            goto fail;
        }
        if (src->w_down &&
            ((src->w_gate && !cpu_weight_init(&L->w_gate, src->w_gate, ctx, errstr, errstr_size)) ||
             !cpu_weight_init(&L->w_up, src->w_up, ctx, errstr, errstr_size) ||
             !cpu_weight_init(&L->w_down, src->w_down, ctx, errstr, errstr_size))) {
            goto fail;
        }
        const kg_gguf_tensor_t *opt_src[] = {src->attn_norm,
                                             src->ffn_norm,
                                             src->bq,
                                             src->bk,
                                             src->bv,
                                             src->bo,
                                             src->q_norm,
                                             src->k_norm,
                                             src->attn_post_norm,
                                             src->ffn_post_norm,
                                             src->attn_sinks,
                                             src->pe_gate,
                                             src->pe_proj,
                                             src->pe_post_norm};
        cpu_weight_t *opt_dst[] = {&L->attn_norm,
                                   &L->ffn_norm,
                                   &L->bq,
                                   &L->bk,
                                   &L->bv,
                                   &L->bo,
                                   &L->q_norm,
                                   &L->k_norm,
                                   &L->attn_post_norm,
                                   &L->ffn_post_norm,
                                   &L->sinks,
                                   &L->pe_gate,
                                   &L->pe_proj,
                                   &L->pe_post_norm};
        for (size_t i = 0; i < sizeof(opt_src) / sizeof(opt_src[0]); i++) {
            if (opt_src[i] && (own_kv || opt_dst[i] != &L->k_norm) &&
                !cpu_weight_init(opt_dst[i], opt_src[i], ctx, errstr, errstr_size)) {
                goto fail;
            }
        }
        if (!add_rope(ctx, src, &L->rope)) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            goto fail;
        }
        if (src->kind != KG_LAYER_ATTN) {
            /* reads no K/V rows */
        } else if (src->n_swa <= 0) {
            ctx->max_window = -1; /* a global layer: every position stays needed */
        } else if (ctx->max_window >= 0 && src->n_swa > ctx->max_window) {
            ctx->max_window = src->n_swa;
        }
    }
    ctx->max_window = ctx->max_window < 0 ? 0 : ctx->max_window;
    if (!cpu_weight_init(&ctx->output_norm, model->output_norm, ctx, errstr, errstr_size) ||
        !cpu_weight_init(&ctx->output, model->output, ctx, errstr, errstr_size)) {
        goto fail;
    }
    if (model->output_b &&
        !cpu_weight_init(&ctx->output_b, model->output_b, ctx, errstr, errstr_size)) {
        goto fail;
    }
    if (model->pl_tok_embd &&
        (!cpu_weight_init(&ctx->pl_model_proj, model->pl_model_proj, ctx, errstr, errstr_size) ||
         !cpu_weight_init(&ctx->pl_proj_norm, model->pl_proj_norm, ctx, errstr, errstr_size))) {
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
    /* the widest layer's shapes size the step's buffers (Gemma 4's differ) */
    size_t n_kv = 0, n_q = 0, F = 0;
    bool shared = false;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *ML = &model->layers[il];
        const size_t kv_l = (size_t)ML->n_head_kv * (size_t)ML->head_dim;
        const size_t q_l = (size_t)hp->n_head * (size_t)ML->head_dim;
        n_kv = kv_l > n_kv ? kv_l : n_kv;
        n_q = q_l > n_q ? q_l : n_q;
        ctx->max_head_dim = ML->head_dim > ctx->max_head_dim ? ML->head_dim : ctx->max_head_dim;
        /* the dense FFN's width; a model whose every layer has experts has none */
        F = !ML->w_down || (size_t)ML->n_ff < F ? F : (size_t)ML->n_ff;
        /* the shared expert's output, or Gemma 4's MLP's beside the experts */
        shared = shared || ctx->layers[il].sh_up.n_out > 0 || (ctx->layers[il].moe && ML->w_down);
    }
    ctx->k_cache = calloc((size_t)hp->n_layer, sizeof(uint16_t *));
    ctx->v_cache = calloc((size_t)hp->n_layer, sizeof(uint16_t *));
    if (!ctx->k_cache || !ctx->v_cache) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        goto fail;
    }
    /* MLA caches the latent rows only: its values are their first dims */
    const bool mla = hp->n_lora_kv > 0;
    const size_t n_caches = mla ? 1 : 2;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *ML = &model->layers[il];
        if (ML->kv_layer != il || ML->kind != KG_LAYER_ATTN) {
            continue; /* reads layer kv_layer's, or a recurrent layer (no K/V) */
        }
        const size_t kv_l = (size_t)ML->n_head_kv * (size_t)ML->head_dim;
        if (kv_l == 0) { /* the loader checks the shapes; a cache of nothing is a bug */
            snprintf(errstr, errstr_size, "cpu backend: layer %d has no K/V width", (int)il);
            goto fail;
        }
        ctx->k_cache[il] = calloc(kv_rows * kv_l, sizeof(uint16_t));
        ctx->v_cache[il] = mla ? NULL : calloc(kv_rows * kv_l, sizeof(uint16_t));
        if (!ctx->k_cache[il] || (!mla && !ctx->v_cache[il])) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory for the KV cache (%zu MiB)",
                     (n_caches * kv_rows * kv_l * sizeof(uint16_t) * (size_t)hp->n_layer) >> 20);
            goto fail;
        }
        cpu_advise_huge(ctx->k_cache[il], kv_rows * kv_l * sizeof(uint16_t));
        cpu_advise_huge(ctx->v_cache[il], mla ? 0 : kv_rows * kv_l * sizeof(uint16_t));
        ctx->kv_size += n_caches * kv_rows * kv_l * sizeof(uint16_t);
    }

    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd;
    /* the shared expert runs in the dense FFN's buffers */
    const size_t FS = hp->n_ff_shexp > 0 ? (size_t)hp->n_ff_shexp
                                         : (size_t)hp->n_expert_shared * (size_t)hp->n_ff_exp;
    F = shared && FS > F ? FS : F;
    const size_t FX = (size_t)hp->n_ff_exp, TK = T * (size_t)hp->n_expert_used;
    size_t widest = E > F ? E : F;
    widest = widest > n_q ? widest : n_q;
    widest = widest > FX ? widest : FX;
    /* DeltaNet's ssm_out reads d_inner per token (cpu_deltanet.c) */
    widest = widest > (size_t)hp->ssm_d_inner ? widest : (size_t)hp->ssm_d_inner;
    /* MLA's GEMM inputs: the compressed queries, a head's nope query or
     * latent, the heads' values */
    const size_t H = (size_t)hp->n_head, R = (size_t)hp->n_lora_kv;
    const size_t nope = (size_t)(hp->mla_k - hp->n_rot), MV = (size_t)hp->mla_v;
    if (mla) {
        const size_t mla_w[] = {(size_t)hp->n_lora_q, nope, R, H * MV};
        for (size_t i = 0; i < sizeof(mla_w) / sizeof(mla_w[0]); i++) {
            widest = widest > mla_w[i] ? widest : mla_w[i];
        }
    }
    /* Gemma 4's per-layer input projection writes n_layer * P per token */
    const size_t NP = (size_t)hp->n_layer * (size_t)hp->n_embd_per_layer;
    widest = model->pl_tok_embd && NP > widest ? NP : widest;
    /* Mamba-2's out projection reads d_inner per token */
    widest = (size_t)hp->ssm_d_inner > widest ? (size_t)hp->ssm_d_inner : widest;
    bool ok = true;
    ctx->x = scratch(ctx, T * E, &ok);
    ctx->xn = scratch(ctx, T * E, &ok);
    ctx->xr = scratch(ctx, T * widest, &ok);
    /* qwen35: attn_q gives each head's query and output gate, parted into
     * q and qgate */
    ctx->q = scratch(ctx, T * n_q * (hp->attn_out_gate ? 2 : 1), &ok);
    ctx->qgate = hp->attn_out_gate ? scratch(ctx, T * n_q, &ok) : NULL;
    ctx->k = scratch(ctx, T * n_kv, &ok);
    ctx->v = scratch(ctx, T * n_kv, &ok);
    ctx->att = scratch(ctx, T * n_q, &ok);
    ctx->gate = scratch(ctx, T * F, &ok);
    ctx->up = scratch(ctx, T * F, &ok);
    ctx->tmp = scratch(ctx, T * E, &ok);
    ctx->shexp = shared ? scratch(ctx, T * E, &ok) : NULL;
    ctx->rope_cs = scratch(ctx, (size_t)ctx->n_ropes * T * (size_t)ctx->rope_stride, &ok);
    if (model->pl_tok_embd) {
        const size_t P = (size_t)hp->n_embd_per_layer;
        ctx->pl_in = scratch(ctx, T * (size_t)hp->n_layer * P, &ok);
        ctx->pl_gate = scratch(ctx, T * P, &ok);
    }
    ctx->scores = scratch(ctx, (size_t)ctx->n_threads * kv_rows, &ok);
    ctx->flash = scratch(
        ctx, (size_t)ctx->n_threads * (size_t)cpu_attn_flash_scratch(ctx->max_head_dim), &ok);
    if (mla) {
        ctx->mla_q = scratch(ctx, T * H * (size_t)hp->mla_k, &ok);
        ctx->mla_qa = scratch(ctx, T * (size_t)hp->n_lora_q, &ok);
        ctx->mla_att = scratch(ctx, T * H * MV, &ok);
        size_t W = nope > R ? nope : R;
        W = W > MV ? W : MV;
        const size_t NT = (size_t)ctx->n_threads;
        ctx->mla_hin = scratch(ctx, H * T * W, &ok);
        ctx->mla_hout = scratch(ctx, H * T * W, &ok);
        ctx->mla_xr = scratch(ctx, NT * T * W, &ok);
        ctx->mla_qact = calloc(NT, sizeof(*ctx->mla_qact));
        ok = ok && ctx->mla_qact;
        for (size_t i = 0; ok && i < NT; i++) {
            ok = cpu_qact_init(&ctx->mla_qact[i], (int64_t)T, (int64_t)W);
            ctx->scratch_size += cpu_qact_size((int64_t)T, (int64_t)W);
        }
    }
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
    if (!cpu_recurrent_init(ctx, params->n_seq_slots, params->n_state_snapshots, errstr,
                            errstr_size)) {
        goto fail;
    }
    if (ctx->rec) {
        be->state_copy = cpu_recurrent_copy;
        be->state_save = cpu_recurrent_save;
        be->n_snapshots = params->n_state_snapshots > 0 ? params->n_state_snapshots : 0;
        /* adapters: cpu_lora has no deltas for the recurrent projections */
        be->lora_add = NULL;
        be->lora_remove = NULL;
        be->no_lora_why = "recurrent (hybrid) layers";
    }
    KG_LOG_DEBUG("cpu", "backend ready threads=%d weights_mib=%zu kv_mib=%zu", ctx->n_threads,
                 ctx->weights_size >> 20, ctx->kv_size >> 20);
    return be;
fail:
    cpu_free(be);
    return NULL;
}
