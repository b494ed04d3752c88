/* kg_backend_cuda_gemma4: what Gemma 4 adds to a gemma3 layer on the
 * device, beside the step's own per-layer shapes (kg_backend_cuda_step.cu:
 * each layer's head size, K/V heads, RoPE and FFN width; the shared-KV
 * layers' queries alone, reading their source layer's K/V planes; V's
 * RMSNorm in rope.cu): the per-layer inputs (E2B), each layer's end (the
 * residual join, the per-layer gate and projection, the output scale) and
 * the 26B-A4B's MoE blocks (the dense MLP beside GeGLU experts on moe.cu,
 * each branch with its own norms, routed on a scaled unweighted RMSNorm).
 * The CPU backend's graph (kg_backend_cpu_forward.c: per_layer_inputs,
 * per_layer_add, gemma4_moe_ffn) in its order of roundings; the kernels
 * are gemma4.cu's. */
#include "gemma4.cuh"
#include "kg_backend_cuda_int.cuh"

#include <math.h>

/* One layer's extras (NULL / empty: the layer has none). */
typedef struct cuda_g4_layer {
    kg_cuda_mat_t pe_gate; /* (P, n_embd) inp_gate */
    kg_cuda_mat_t pe_proj; /* (n_embd, P) proj */
    float *pe_post_norm;   /* (n_embd) */
    float out_scale;       /* layer_output_scale; 0: none */
    /* a MoE layer: the router's input scale, the experts' output scales,
     * the experts' input norm, the dense MLP's and the experts' output norms */
    float *router_s, *exp_s, *pre_norm_2, *post_norm_1, *post_norm_2;
} cuda_g4_layer_t;

struct cuda_g4 {
    int32_t P;               /* embedding_length_per_layer_input; 0: no per-layer inputs */
    kg_cuda_mat_t pl_proj;   /* (n_layer * P, n_embd) per_layer_model_proj */
    kg_cuda_mat_t pl_tok;    /* (n_vocab, n_layer * P) per_layer_token_embd */
    float *pl_norm;          /* (P) per_layer_proj_norm */
    cuda_g4_layer_t *layers; /* (n_layer) */
    /* step buffers, T = max_tokens rows */
    float *pl_in;   /* (T, n_layer * P) every layer's input */
    float *pl_gate; /* (T, P) a layer's gate GEMM output */
    void *pl_h;     /* (T, P) the gated input, in proj's type (4-byte elements) */
    void *xin;      /* (T, n_embd) input of pl_proj, inp_gate or the router, in its type */
    float *dense;   /* (T, n_embd) a MoE layer's dense MLP output after post_ffw_norm_1 */
};

static kg_status_t g4_alloc(cuda_ctx_t *ctx, void **p, size_t bytes) {
    KG_CUDA_CHECK(cudaMalloc(p, bytes));
    ctx->scratch_size += bytes;
    return KG_OK;
}

/* A MoE layer's router and experts (llama_model_gemma4's tensors): gate
 * and up stacked from the per-expert views (merged ffn_gate_up_exps or
 * apart), one type for both so that one normed input feeds them; the
 * experts keep their GGUF blocks where moe.cu reads the type. */
static kg_status_t upload_experts(cuda_ctx_t *ctx, stage_t *s, int32_t il) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    cuda_layer_t *L = &ctx->layers[il];
    cuda_g4_layer_t *G = &ctx->g4->layers[il];
    const int32_t X = ctx->hp.n_expert;
    const kg_gguf_tensor_t **gu = (const kg_gguf_tensor_t **)malloc(2 * (size_t)X * sizeof(*gu));
    if (!gu) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t e = 0; e < X; e++) {
        gu[e] = &src->exp_gate[e];
        gu[X + e] = &src->exp_up[e];
    }
    const kg_status_t st = cuda_upload_gate_up(ctx, s, gu, gu + X, X, &L->exp_gate, &L->exp_up);
    free(gu);
    KG_TRY(st);
    L->moe = true;
    KG_TRY(cuda_upload_mat(ctx, s, &src->ffn_gate_inp, 1, &L->router));
    KG_TRY(cuda_upload_gemm(ctx, s, &src->down_exps, 1, &L->exp_down));
    KG_TRY(cuda_upload_vec(ctx, src->ffn_gate_inp_s, &G->router_s));
    KG_TRY(cuda_upload_vec(ctx, src->down_exps_s, &G->exp_s));
    KG_TRY(cuda_upload_vec(ctx, src->ffn_pre_norm_2, &G->pre_norm_2));
    KG_TRY(cuda_upload_vec(ctx, src->ffn_post_norm_1, &G->post_norm_1));
    return cuda_upload_vec(ctx, src->ffn_post_norm_2, &G->post_norm_2);
}

kg_status_t cuda_g4_upload(cuda_ctx_t *ctx, stage_t *s) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    ctx->g4 = (cuda_g4_t *)calloc(1, sizeof(cuda_g4_t));
    cuda_g4_t *g = ctx->g4;
    if (!g || !(g->layers = (cuda_g4_layer_t *)calloc((size_t)hp->n_layer, sizeof(*g->layers)))) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    g->P = hp->n_embd_per_layer;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *src = &model->layers[il];
        cuda_g4_layer_t *G = &g->layers[il];
        G->out_scale = src->out_scale;
        if (g->P > 0) {
            KG_TRY(cuda_upload_gemm(ctx, s, &src->pe_gate, 1, &G->pe_gate));
            KG_TRY(cuda_upload_gemm(ctx, s, &src->pe_proj, 1, &G->pe_proj));
            KG_TRY(cuda_upload_vec(ctx, src->pe_post_norm, &G->pe_post_norm));
        }
        if (src->ffn_gate_inp) {
            KG_TRY(upload_experts(ctx, s, il));
        }
    }
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd;
    const size_t NP = (size_t)hp->n_layer * (size_t)g->P;
    KG_TRY(g4_alloc(ctx, &g->xin, T * E * 4));
    if (hp->n_expert > 0) {
        KG_TRY(g4_alloc(ctx, (void **)&g->dense, T * E * sizeof(float)));
    }
    if (g->P > 0) {
        KG_TRY(cuda_upload_gemm(ctx, s, &model->pl_model_proj, 1, &g->pl_proj));
        /* the per-layer token table (the largest matrix of the small Gemma 4
         * files) keeps its blocks where gemma4.cu reads them 8 at a time */
        KG_TRY(g->P % 8 == 0 ? cuda_upload_gemm(ctx, s, &model->pl_tok_embd, 1, &g->pl_tok)
                             : cuda_upload_mat(ctx, s, &model->pl_tok_embd, 1, &g->pl_tok));
        KG_TRY(cuda_upload_vec(ctx, model->pl_proj_norm, &g->pl_norm));
        KG_TRY(g4_alloc(ctx, (void **)&g->pl_in, T * NP * sizeof(float)));
        KG_TRY(g4_alloc(ctx, (void **)&g->pl_gate, T * (size_t)g->P * sizeof(float)));
        KG_TRY(g4_alloc(ctx, &g->pl_h, T * (size_t)g->P * 4));
    }
    return KG_OK;
}

void cuda_g4_free(cuda_ctx_t *ctx) {
    cuda_g4_t *g = ctx->g4;
    if (!g) {
        return;
    }
    for (int32_t il = 0; g->layers && il < ctx->hp.n_layer; il++) {
        cuda_g4_layer_t *G = &g->layers[il];
        void *bufs[] = {G->pe_gate.data, G->pe_proj.data, G->pe_post_norm, G->router_s,
                        G->exp_s,        G->pre_norm_2,   G->post_norm_1,  G->post_norm_2};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            cudaFree(bufs[i]);
        }
    }
    void *bufs[] = {g->pl_proj.data, g->pl_tok.data, g->pl_norm, g->pl_in,
                    g->pl_gate,      g->pl_h,        g->xin,     g->dense};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        cudaFree(bufs[i]);
    }
    free(g->layers);
    free(g);
    ctx->g4 = NULL;
}

kg_status_t cuda_g4_inputs(cuda_ctx_t *ctx, int32_t rows) {
    const cuda_g4_t *g = ctx->g4;
    const kg_hparams_t *hp = &ctx->hp;
    if (g->P == 0) {
        return KG_OK;
    }
    cudaStream_t st = ctx->stream;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const kg_cuda_residual_t none = {NULL, NULL, NULL, 0.0f};
    /* the scaled embeddings in the projection's type (no weight: the rows
     * themselves), projected */
    KG_TRY(kg_cuda_add_rmsnorm(st, rows, in.hdr, false, NULL, ctx->x, &none, NULL, g->xin,
                               g->pl_proj.dt, NULL, KG_CUDA_F32, hp->n_embd, hp->norm_eps));
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &g->pl_proj, g->xin, g->pl_in, rows));
    return kg_cuda_g4_pl_inputs(st, rows, in, g->pl_in, g->pl_norm, g->pl_tok.data, g->pl_tok.dt,
                                g->pl_tok.qtype, kg_cuda_mat_tail(&g->pl_tok), hp->n_layer, g->P,
                                1.0f / sqrtf((float)hp->n_embd), sqrtf((float)g->P),
                                1.0f / sqrtf(2.0f), hp->norm_eps);
}

kg_status_t cuda_g4_moe(cuda_ctx_t *ctx, int32_t il, int32_t rows) {
    const kg_hparams_t *hp = &ctx->hp;
    const cuda_layer_t *L = &ctx->layers[il];
    const cuda_g4_t *g = ctx->g4;
    const cuda_g4_layer_t *G = &g->layers[il];
    cudaStream_t st = ctx->stream;
    const kg_cuda_step_hdr_t *hdr = kg_cuda_inputs_view(ctx->d_in, rows).hdr;
    const kg_cuda_residual_t none = {NULL, NULL, NULL, 0.0f};
    const int32_t E = hp->n_embd, FX = hp->n_ff_exp;
    kg_cuda_moe_plan_t plan = ctx->moe_plan;
    plan.rows_cap = kg_cuda_moe_rows_cap(rows, hp->n_expert_used, hp->n_expert);
    /* the dense MLP's output (tmp) normed by post_ffw_norm_1 */
    KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->tmp, &none, G->post_norm_1,
                               g->dense, KG_CUDA_F32, NULL, KG_CUDA_F32, E, hp->norm_eps));
    /* the router on the residual's unweighted RMSNorm, scaled */
    KG_TRY(kg_cuda_g4_router_in(st, rows, hdr, ctx->x, G->router_s, g->xin, L->router.dt, E,
                                hp->norm_eps));
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->router, g->xin, ctx->moe_logits, rows));
    KG_TRY(kg_cuda_moe_route(st, rows, hdr, &ctx->router, ctx->moe_logits, NULL, NULL, &plan));
    KG_TRY(kg_cuda_moe_align(st, hdr, &ctx->router, &plan));
    /* the experts on the residual normed by pre_ffw_norm_2: GeGLU, each
     * output times its expert's scale, the weighted sum */
    KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &none, G->pre_norm_2, ctx->xe,
                               L->exp_up.dt, NULL, KG_CUDA_F32, E, hp->norm_eps));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_gate.data, NULL, ctx->xe, 1, ctx->moe_g, FX, E,
                            L->exp_gate.dt, L->exp_gate.qtype, kg_cuda_mat_tail(&L->exp_gate)));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_up.data, NULL, ctx->xe, 1, ctx->moe_u, FX, E,
                            L->exp_up.dt, L->exp_up.qtype, kg_cuda_mat_tail(&L->exp_up)));
    KG_TRY(kg_cuda_moe_act_geglu(st, &plan, ctx->moe_g, ctx->moe_u, ctx->gelu_table, ctx->moe_h,
                                 L->exp_down.dt, FX));
    KG_TRY(kg_cuda_moe_gemm(st, &plan, L->exp_down.data, NULL, ctx->moe_h, 0, ctx->moe_y, E, FX,
                            L->exp_down.dt, L->exp_down.qtype, kg_cuda_mat_tail(&L->exp_down)));
    if (G->exp_s) {
        KG_TRY(kg_cuda_g4_expert_scale(st, &plan, ctx->moe_y, G->exp_s, E));
    }
    KG_TRY(kg_cuda_moe_combine(st, rows, hdr, &ctx->router, &plan, ctx->moe_y, NULL, ctx->tmp, E));
    /* post_ffw_norm_2 on the experts' sum, plus the dense branch */
    return kg_cuda_g4_moe_join(st, rows, hdr, ctx->tmp, G->post_norm_2, g->dense, E, hp->norm_eps);
}

kg_status_t cuda_g4_layer_end(cuda_ctx_t *ctx, int32_t il, int32_t rows) {
    const kg_hparams_t *hp = &ctx->hp;
    const cuda_layer_t *L = &ctx->layers[il];
    const cuda_g4_t *g = ctx->g4;
    const cuda_g4_layer_t *G = &g->layers[il];
    cudaStream_t st = ctx->stream;
    const kg_cuda_step_hdr_t *hdr = kg_cuda_inputs_view(ctx->d_in, rows).hdr;
    const int32_t E = hp->n_embd;
    if (g->P == 0) { /* the FFN's output joins, then the output scale */
        return kg_cuda_g4_residual(st, rows, hdr, ctx->x, ctx->tmp, L->ffn_post_norm, G->out_scale,
                                   E, hp->norm_eps);
    }
    /* the FFN's output joins (the rows, unnormed, into inp_gate's type) */
    const kg_cuda_residual_t res = {ctx->tmp, NULL, L->ffn_post_norm, hp->residual_scale};
    KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, &res, NULL, g->xin,
                               G->pe_gate.dt, NULL, KG_CUDA_F32, E, hp->norm_eps));
    /* gelu(inp_gate x) * the layer's input, proj, post_norm, joined, scaled */
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &G->pe_gate, g->xin, g->pl_gate, rows));
    KG_TRY(kg_cuda_g4_pl_gate(st, rows, hdr, g->pl_gate, g->pl_in, ctx->gelu_table, il, hp->n_layer,
                              g->P, g->pl_h, G->pe_proj.dt));
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &G->pe_proj, g->pl_h, ctx->tmp, rows));
    return kg_cuda_g4_residual(st, rows, hdr, ctx->x, ctx->tmp, G->pe_post_norm, G->out_scale, E,
                               hp->norm_eps);
}
