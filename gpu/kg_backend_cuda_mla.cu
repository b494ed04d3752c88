/* kg_backend_cuda_mla: deepseek2's multi-head latent attention on the
 * CUDA backend (DeepSeek V2/V3/R1, Kimi K2), the CPU backend's
 * mla_attention step for step; the kernels are mla.cu's.
 *
 * DESIGN
 * KV pool. One plane per attention layer (kg_backend_cuda.cu sets
 * kv_caches to 1): each token's row is its latent, kv_lora_rank normed
 * dims, then the n_rot RoPE'd key dims every head shares, fp16; the values
 * are the rows' first kv_lora_rank dims. So a token costs (kv_lora_rank +
 * n_rot) x layers x 2 bytes, as on the CPU backend
 * (kg_backend_kv_bytes_per_token), and a KV block copy (forks, the prefix
 * cache) copies that plane.
 *
 * A layer. wqkv holds attn_q_a (or V2-Lite's attn_q) and attn_kv_a_mqa
 * side by side (kg_backend_cuda_weights.cu), one GEMM on the normed input;
 * the latent is normed, its key dims rotated and the row stored
 * (kv_store, which also norms the compressed query into attn_q_b's
 * input); attn_q_b's GEMM; each head's RoPE dims rotated into its latent
 * query row (q_rope) and its nope dims taken into the latent space
 * through its k_b (one small GEMM per head, heads); attention of every
 * head over the latent rows as one shared KV head; each head's latent
 * result out through its v_b (heads again) in attn_output's type; the
 * attn_output GEMM into tmp. Prefill runs this absorbed form too, as the
 * CPU backend does: one code path, and a token's bits do not depend on
 * how its prompt was chunked or on its batch mates.
 *
 * Buffers. Allocated at start for max_batch_tokens tokens: the first
 * GEMM's output, the normed compressed query and attn_q_b's output (with
 * q_lora_rank), each head's latent attention result, and v_b's output; the
 * latent queries use the step's qkv buffer (n_head x head_dim floats a
 * token, head_dim being kv_lora_rank + n_rot here). */
#include "kg_backend_cuda_int.cuh"

struct cuda_mla {
    kg_cuda_mla_shape_t sh;
    float *g1;   /* (T, wqkv.n_out): the compressed (or whole) query, then the latent row */
    void *qa;    /* (T, n_lora_q) the normed compressed query, in wq_b's type */
    float *q;    /* (T, n_head * mla_k) attn_q_b's output */
    float *qlat; /* (T, n_head, R + n_rot) the latent queries (ctx->qkv) */
    float *lat;  /* (T, n_head, R) each head's attention result in the latent space */
    void *att;   /* (T, n_head * mla_v) v_b's output, in wo's type */
    bool own_att;
};

kg_status_t cuda_mla_check(const kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    const int32_t nope = hp->mla_k - hp->n_rot;
    if (hp->n_lora_kv > KG_CUDA_MLA_MAX_DIM || nope > KG_CUDA_MLA_MAX_DIM || nope <= 0 ||
        hp->mla_v > KG_CUDA_MLA_MAX_DIM || hp->n_rot % 2 != 0 || hp->n_rot <= 0 ||
        hp->n_rot > KG_CUDA_MLA_MAX_ROT || (hp->n_lora_kv + hp->n_rot) % 8 != 0 ||
        hp->n_head_kv != 1 || hp->head_dim != hp->n_lora_kv + hp->n_rot) {
        snprintf(errstr, errstr_size,
                 "cuda backend: unsupported latent attention shape (kv_lora_rank %d, rope dims "
                 "%d, nope dims %d, value dims %d; the CUDA kernels take up to %d of each but "
                 "rope dims, an even number up to %d, and a latent row of a multiple of 8 dims)",
                 hp->n_lora_kv, hp->n_rot, nope, hp->mla_v, KG_CUDA_MLA_MAX_DIM,
                 KG_CUDA_MLA_MAX_ROT);
        return KG_ERR_UNSUPPORTED;
    }
    return KG_OK;
}

static kg_status_t mla_alloc(cuda_ctx_t *ctx, void **p, size_t size) {
    KG_CUDA_CHECK(cudaMalloc(p, size));
    ctx->scratch_size += size;
    return KG_OK;
}

kg_status_t cuda_mla_init(cuda_ctx_t *ctx) {
    const kg_hparams_t *hp = &ctx->hp;
    cuda_mla_t *m = (cuda_mla_t *)calloc(1, sizeof(*m));
    if (!m) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    ctx->mla = m;
    m->sh.n_head = hp->n_head;
    m->sh.rank = hp->n_lora_kv;
    m->sh.n_rot = hp->n_rot;
    m->sh.nope = hp->mla_k - hp->n_rot;
    m->sh.block_size = ctx->block_size;
    m->sh.neox = hp->rope_mode == KG_ROPE_MODE_NEOX;
    const size_t T = (size_t)ctx->max_tokens, H = (size_t)hp->n_head, R = (size_t)hp->n_lora_kv;
    const size_t D = R + (size_t)hp->n_rot, MV = (size_t)hp->mla_v;
    size_t w1 = 0, es_qa = 0, es_att = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        if (L->kv_il < 0) {
            continue;
        }
        w1 = (size_t)L->wqkv.n_out > w1 ? (size_t)L->wqkv.n_out : w1;
        const size_t eq = L->wq_b.data ? kg_cuda_dtype_size(L->wq_b.dt) : 0;
        const size_t ea = kg_cuda_dtype_size(L->wo.dt);
        es_qa = eq > es_qa ? eq : es_qa;
        es_att = ea > es_att ? ea : es_att;
    }
    KG_TRY(mla_alloc(ctx, (void **)&m->g1, T * w1 * sizeof(float)));
    if (hp->n_lora_q > 0) {
        KG_TRY(mla_alloc(ctx, &m->qa, T * (size_t)hp->n_lora_q * es_qa));
        KG_TRY(mla_alloc(ctx, (void **)&m->q, T * H * (size_t)hp->mla_k * sizeof(float)));
    }
    KG_TRY(mla_alloc(ctx, (void **)&m->lat, T * H * R * sizeof(float)));
    /* the step's qkv holds T x (n_head + 2) x head_dim floats: the latent
     * queries fit; its att holds T x n_head x head_dim of wo's type or
     * wider, so v_b's output fits when a head's values are no wider than
     * a latent row */
    m->qlat = ctx->qkv;
    m->own_att = MV > D;
    if (m->own_att) {
        KG_TRY(mla_alloc(ctx, &m->att, T * H * MV * es_att));
    } else {
        m->att = ctx->att;
    }
    return KG_OK;
}

void cuda_mla_free(cuda_ctx_t *ctx) {
    for (int32_t il = 0; ctx->layers && il < ctx->hp.n_layer; il++) {
        cuda_layer_t *L = &ctx->layers[il];
        kg_cuda_mat_t *mats[] = {&L->wq_b, &L->k_b, &L->v_b};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            cudaFree(mats[i]->data);
            mats[i]->data = NULL;
        }
        cudaFree(L->q_a_norm);
        cudaFree(L->kv_a_norm);
        L->q_a_norm = L->kv_a_norm = NULL;
    }
    cuda_mla_t *m = ctx->mla;
    if (!m) {
        return;
    }
    cudaFree(m->g1);
    cudaFree(m->qa);
    cudaFree(m->q);
    cudaFree(m->lat);
    if (m->own_att) {
        cudaFree(m->att);
    }
    free(m);
    ctx->mla = NULL;
}

kg_status_t cuda_mla_attention(cuda_ctx_t *ctx, int32_t il, int32_t rows) {
    const kg_hparams_t *hp = &ctx->hp;
    const cuda_layer_t *L = &ctx->layers[il];
    cuda_mla_t *m = ctx->mla;
    cudaStream_t st = ctx->stream;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const int32_t H = hp->n_head, R = hp->n_lora_kv, D = R + hp->n_rot, K = hp->mla_k;
    const int32_t MV = hp->mla_v, w1 = L->wqkv.n_out;
    const float *cs =
        ctx->rope_cs + (size_t)L->rope * (size_t)ctx->max_tokens * (size_t)ctx->max_rot;
    __half *cache = (__half *)(ctx->kv + L->kv_off); /* f16 always (cuda_create) */
    const bool q_lora = L->wq_b.data != NULL;
    /* the compressed query (or the whole one) and the latent row, one GEMM */
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wqkv, ctx->xn, m->g1, rows));
    KG_TRY(kg_cuda_mla_kv_store(st, rows, in, &m->sh, m->g1, w1, w1 - D, L->kv_a_norm, cs, cache,
                                q_lora ? L->q_a_norm : NULL, hp->n_lora_q, m->qa,
                                q_lora ? L->wq_b.dt : KG_CUDA_F32, hp->norm_eps));
    const float *q = m->g1;
    int32_t q_stride = w1;
    if (q_lora) {
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wq_b, m->qa, m->q, rows));
        q = m->q;
        q_stride = H * K;
    }
    /* each head's latent query: its RoPE dims rotated, its nope dims
     * through k_b (Qcur = concat(k_b . q_nope, q_pe)) */
    KG_TRY(kg_cuda_mla_q_rope(st, rows, in.hdr, &m->sh, q, q_stride, cs, m->qlat));
    KG_TRY(kg_cuda_mla_heads(st, rows, in.hdr, H, L->k_b.data, L->k_b.dt, R, K - hp->n_rot, q,
                             q_stride, K, m->qlat, KG_CUDA_F32, (int64_t)H * D, D));
    KG_TRY(kg_cuda_mla_attention(st, rows, in, &m->sh, hp->mla_kq_scale, m->qlat, cache, m->lat));
    /* kqv_mla = v_b . kqv per head, then attn_output */
    KG_TRY(kg_cuda_mla_heads(st, rows, in.hdr, H, L->v_b.data, L->v_b.dt, MV, R, m->lat,
                             (int64_t)H * R, R, m->att, L->wo.dt, (int64_t)H * MV, MV));
    return kg_cuda_gemm(&ctx->blas, st, &L->wo, m->att, ctx->tmp, rows);
}
