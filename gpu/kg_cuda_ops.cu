/* kg_cuda_ops: one kernel family at a time from host memory, for tests. */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "geglu.cuh"
#include "gemm.cuh"
#include "kg_cuda_ops.h"
#include "llama4.cuh"
#include "logits.cuh"
#include "qblocks.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sample.cuh"
#include "swiglu.cuh"

#include <string.h>

extern "C" {
#include "../src/model/kg_quant.h"
#include "../src/model/kg_quantize.h"
}

// ---- helpers ----

/* Up to DEV_POOL device buffers freed together. */
#define DEV_POOL 24
typedef struct dev_pool {
    void *p[DEV_POOL];
    int n;
} dev_pool_t;

static kg_status_t dalloc(dev_pool_t *dp, void **d, size_t size) {
    *d = NULL;
    if (dp->n == DEV_POOL) {
        KG_LOG_ERROR("cuda", "kg_cuda_ops: more than %d device buffers in one op", DEV_POOL);
        return KG_ERR_NOMEM;
    }
    KG_CUDA_CHECK(cudaMalloc(d, size ? size : 1));
    dp->p[dp->n++] = *d;
    KG_CUDA_CHECK(cudaMemset(*d, 0, size ? size : 1));
    return KG_OK;
}

static kg_status_t dup(dev_pool_t *dp, void **d, const void *h, size_t size) {
    KG_TRY(dalloc(dp, d, size));
    KG_CUDA_CHECK(cudaMemcpy(*d, h, size, cudaMemcpyHostToDevice));
    return KG_OK;
}

static void dfree(dev_pool_t *dp) {
    for (int i = 0; i < dp->n; i++) {
        cudaFree(dp->p[i]);
    }
    dp->n = 0;
}

/* the op element types are kg_cuda_dtype_t's */
static_assert((int)KG_CUDA_OP_BF16 == (int)KG_CUDA_BF16 &&
                  (int)KG_CUDA_OP_F16 == (int)KG_CUDA_F16 &&
                  (int)KG_CUDA_OP_F32 == (int)KG_CUDA_F32,
              "kg_cuda_ops.h and cuda_common.cuh disagree on element types");
#define esize kg_cuda_dtype_size

/* Floats in the 16/32-bit layout of dt (host side). */
static void *to_dtype(const float *x, size_t n, int dt) {
    void *out = malloc(n * esize(dt) + 1);
    if (!out) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (dt == KG_CUDA_OP_F32) {
            ((float *)out)[i] = x[i];
        } else if (dt == KG_CUDA_OP_F16) {
            ((uint16_t *)out)[i] = kg_fp32_to_fp16(x[i]);
        } else {
            ((uint16_t *)out)[i] = kg_fp32_to_bf16(x[i]);
        }
    }
    return out;
}

static void from_dtype(const void *in, float *x, size_t n, int dt) {
    for (size_t i = 0; i < n; i++) {
        if (dt == KG_CUDA_OP_F32) {
            x[i] = ((const float *)in)[i];
        } else if (dt == KG_CUDA_OP_F16) {
            x[i] = kg_fp16_to_fp32(((const uint16_t *)in)[i]);
        } else {
            x[i] = kg_bf16_to_fp32(((const uint16_t *)in)[i]);
        }
    }
}

/* Copy device memory of type dt back as floats. */
static kg_status_t fetch(float *x, const void *d, size_t n, int dt) {
    void *h = malloc(n * esize(dt) + 1);
    if (!h) {
        return KG_ERR_NOMEM;
    }
    const cudaError_t err = cudaMemcpy(h, d, n * esize(dt), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess) {
        from_dtype(h, x, n, dt);
    }
    free(h);
    KG_CUDA_CHECK(err);
    return KG_OK;
}

/* Upload floats as dt. */
static kg_status_t put(dev_pool_t *dp, void **d, const float *x, size_t n, int dt) {
    void *h = to_dtype(x, n, dt);
    if (!h) {
        return KG_ERR_NOMEM;
    }
    const kg_status_t st = dup(dp, d, h, n * esize(dt));
    free(h);
    return st;
}

/* A K or V cache of `rows` rows of n_kv floats onto the device: fp16 rows,
 * or (q8) the backend's Q8_0 layout (kv_cache.cuh) of kg_quantize's
 * blocks, ggml's reference quantizer: d, then 32 values. */
static kg_status_t
put_kv(dev_pool_t *dp, void **d, const float *x, int32_t rows, int32_t n_kv, int32_t bs, int q8) {
    if (!q8) {
        return put(dp, d, x, (size_t)rows * n_kv, KG_CUDA_OP_F16);
    }
    const int32_t nb = n_kv / 32;
    const size_t bb = kg_kv_block_bytes(1, bs, n_kv);
    uint8_t *h = (uint8_t *)calloc((size_t)(rows / bs) * bb + 1, 1);
    uint8_t *blk = (uint8_t *)malloc((size_t)nb * 34 + 1);
    kg_status_t st = h && blk ? KG_OK : KG_ERR_NOMEM;
    for (int32_t r = 0; st == KG_OK && r < rows; r++) {
        if (!kg_quantize(KG_GGML_TYPE_Q8_0, x + (size_t)r * n_kv, blk, n_kv)) {
            st = KG_ERR_INVALID;
            break;
        }
        uint8_t *base = h + (size_t)(r / bs) * bb;
        for (int32_t b = 0; b < nb; b++) {
            memcpy(base + (size_t)(r % bs) * n_kv + (size_t)b * 32, blk + (size_t)b * 34 + 2, 32);
            memcpy(base + (size_t)bs * n_kv + ((size_t)(r % bs) * nb + b) * 2, blk + (size_t)b * 34,
                   2);
        }
    }
    if (st == KG_OK) {
        st = dup(dp, d, h, (size_t)(rows / bs) * bb);
    }
    free(h), free(blk);
    return st;
}

/* put_kv's inverse: the cache's values as floats (Q8_0: d x q). */
static kg_status_t
fetch_kv(float *x, const void *d, int32_t rows, int32_t n_kv, int32_t bs, int q8) {
    if (!q8) {
        return fetch(x, d, (size_t)rows * n_kv, KG_CUDA_OP_F16);
    }
    const int32_t nb = n_kv / 32;
    const size_t bb = kg_kv_block_bytes(1, bs, n_kv), size = (size_t)(rows / bs) * bb;
    uint8_t *h = (uint8_t *)malloc(size + 1);
    if (!h) {
        return KG_ERR_NOMEM;
    }
    const cudaError_t err = cudaMemcpy(h, d, size, cudaMemcpyDeviceToHost);
    for (int32_t r = 0; err == cudaSuccess && r < rows; r++) {
        const uint8_t *base = h + (size_t)(r / bs) * bb;
        for (int32_t i = 0; i < n_kv; i++) {
            uint16_t dh;
            memcpy(&dh, base + (size_t)bs * n_kv + ((size_t)(r % bs) * nb + i / 32) * 2, 2);
            const int8_t q = (int8_t)base[(size_t)(r % bs) * n_kv + i];
            x[(size_t)r * n_kv + i] = kg_fp16_to_fp32(dh) * (float)q;
        }
    }
    free(h);
    KG_CUDA_CHECK(err);
    return KG_OK;
}

/* Step inputs for the attention-shaped ops: header, pos, tbl_off, tiles,
 * table. Tiles: one per token, or (tiles) runs of up to qt consecutive
 * positions of one sequence (same tbl_off). */
static kg_status_t put_inputs(dev_pool_t *dp,
                              const kg_cuda_op_attn_t *a,
                              bool tiles,
                              int32_t qt,
                              kg_cuda_inputs_t *in,
                              int32_t *tile_tok0,
                              int32_t *tile_n,
                              int32_t *n_tiles) {
    const int32_t cap = a->n_tokens;
    const size_t n = 4 + KG_CUDA_INPUT_ARRAYS * (size_t)cap + (size_t)a->n_table;
    int32_t *h = (int32_t *)calloc(n, sizeof(int32_t));
    if (!h) {
        return KG_ERR_NOMEM;
    }
    const kg_cuda_inputs_t v = kg_cuda_inputs_view(h, cap);
    int32_t nt = 0;
    for (int32_t t = 0; t < cap;) {
        int32_t k = 1;
        while (tiles && t + k < cap && k < qt && a->tbl_off[t + k] == a->tbl_off[t] &&
               a->pos[t + k] == a->pos[t] + k) {
            k++;
        }
        tile_tok0[nt] = t;
        tile_n[nt] = k;
        nt++;
        t += k;
    }
    h[0] = cap;
    h[1] = cap;
    h[2] = nt;
    memcpy((int32_t *)v.pos, a->pos, (size_t)cap * sizeof(int32_t));
    memcpy((int32_t *)v.tbl_off, a->tbl_off, (size_t)cap * sizeof(int32_t));
    for (int32_t i = 0; i < cap; i++) {
        ((int32_t *)v.out_row)[i] = i;
    }
    memcpy((int32_t *)v.tile_tok0, tile_tok0, (size_t)nt * sizeof(int32_t));
    memcpy((int32_t *)v.tile_n, tile_n, (size_t)nt * sizeof(int32_t));
    memcpy((int32_t *)v.table, a->table, (size_t)a->n_table * sizeof(int32_t));
    void *d = NULL;
    const kg_status_t st = dup(dp, &d, h, n * sizeof(int32_t));
    free(h);
    if (st == KG_OK) {
        *in = kg_cuda_inputs_view((const int32_t *)d, cap);
        *n_tiles = nt;
    }
    return st;
}

#define TRY_OUT(expr)                                                                              \
    do {                                                                                           \
        if ((st = (expr)) != KG_OK) {                                                              \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

// ---- ops ----

kg_status_t kg_cuda_op_add_rmsnorm(float *x,
                                   const float *add,
                                   const float *add_b,
                                   const float *add_w,
                                   const float *w,
                                   float *y,
                                   int32_t rows,
                                   int32_t n,
                                   float eps,
                                   int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    void *dx = NULL, *dadd = NULL, *dab = NULL, *daw = NULL, *dw = NULL, *dy = NULL, *dh = NULL;
    const int32_t hdr[4] = {rows, rows, 0, 0};
    const size_t sz = (size_t)rows * n * sizeof(float);
    kg_cuda_residual_t res;
    TRY_OUT(dup(&dp, &dx, x, sz));
    if (add) {
        TRY_OUT(dup(&dp, &dadd, add, sz));
    }
    if (add_b) {
        TRY_OUT(dup(&dp, &dab, add_b, (size_t)n * sizeof(float)));
    }
    if (add_w) {
        TRY_OUT(dup(&dp, &daw, add_w, (size_t)n * sizeof(float)));
    }
    TRY_OUT(dup(&dp, &dw, w, (size_t)n * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dy, (size_t)rows * n * esize(dtype)));
    TRY_OUT(dup(&dp, &dh, hdr, sizeof(hdr)));
    res.add = (const float *)dadd;
    res.add_b = (const float *)dab;
    res.add_w = (const float *)daw;
    res.scale = 0.0f;
    TRY_OUT(kg_cuda_add_rmsnorm(0, rows, (const kg_cuda_step_hdr_t *)dh, false, NULL, (float *)dx,
                                &res, (const float *)dw, dy, (kg_cuda_dtype_t)dtype, NULL,
                                KG_CUDA_F32, n, eps));
    TRY_OUT(fetch(y, dy, (size_t)rows * n, dtype));
    TRY_OUT(fetch(x, dx, (size_t)rows * n, KG_CUDA_OP_F32));
out:
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_rope_store(
    const kg_cuda_op_attn_t *a, const float *qkv, float *q_out, float *k_cache, float *v_cache) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_inputs_t in;
    void *dqkv = NULL, *dcs = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *db = NULL, *dqn = NULL,
         *dkn = NULL, *dff = NULL;
    const int32_t T = a->n_tokens;
    const size_t n_q = (size_t)a->n_head * a->head_dim, n_kv = (size_t)a->n_head_kv * a->head_dim;
    const kg_cuda_rope_shape_t sh = {a->n_head, a->n_head_kv,  a->head_dim,
                                     a->n_rot,  a->block_size, 0};
    kg_cuda_qkv_ops_t ops;
    kg_cuda_rope_t rope;
    memset(&ops, 0, sizeof(ops));
    memset(&rope, 0, sizeof(rope));
    rope.n_rot = a->n_rot;
    rope.base = a->rope_base;
    rope.freq_scale = a->rope_scale;
    rope.ext_factor = a->ext_factor;
    rope.attn_factor = a->attn_factor != 0.0f ? a->attn_factor : 1.0f;
    rope.corr_dims[0] = a->corr_dims[0];
    rope.corr_dims[1] = a->corr_dims[1];
    int32_t *t0 = (int32_t *)malloc((size_t)T * sizeof(int32_t) + 4);
    int32_t *tn = (int32_t *)malloc((size_t)T * sizeof(int32_t) + 4);
    int32_t n_tiles = 0;
    if (!t0 || !tn) {
        st = KG_ERR_NOMEM;
        goto out;
    }
    TRY_OUT(put_inputs(&dp, a, false, 1, &in, t0, tn, &n_tiles));
    TRY_OUT(dup(&dp, &dqkv, qkv, (size_t)T * (n_q + 2 * n_kv) * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dcs, (size_t)T * a->n_rot * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dq, (size_t)T * n_q * 2));
    TRY_OUT(put_kv(&dp, &dk, k_cache, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
    TRY_OUT(put_kv(&dp, &dv, v_cache, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
    if (a->bias) {
        TRY_OUT(dup(&dp, &db, a->bias, (n_q + 2 * n_kv) * sizeof(float)));
    }
    if (a->q_norm) {
        TRY_OUT(dup(&dp, &dqn, a->q_norm, (size_t)a->head_dim * sizeof(float)));
        TRY_OUT(dup(&dp, &dkn, a->k_norm, (size_t)a->head_dim * sizeof(float)));
    }
    if (a->freq_factors) {
        TRY_OUT(dup(&dp, &dff, a->freq_factors, (size_t)(a->n_rot / 2) * sizeof(float)));
    }
    ops.bias = (const float *)db;
    ops.q_norm = (const float *)dqn;
    ops.k_norm = (const float *)dkn;
    ops.norm_eps = a->norm_eps;
    ops.neox = a->neox;
    ops.q_scale = a->q_scale;
    ops.no_rope = a->no_rope || a->l2_norm; /* with l2_norm, llama4.cu rotates */
    ops.temp_scale = a->temp_scale;
    ops.temp_floor = a->temp_floor;
    ops.temp_offset = a->temp_offset;
    TRY_OUT(kg_cuda_rope_cache(0, T, in, (float *)dcs, &rope, (const float *)dff));
    if (a->l2_norm && !a->no_rope) {
        TRY_OUT(kg_cuda_rope_l2norm(0, T, in, &sh, a->neox, (float *)dqkv, (const float *)dcs,
                                    a->norm_eps));
    }
    TRY_OUT(kg_cuda_rope_store(0, T, in, &sh, &ops, (float *)dqkv, (const float *)dcs, (__half *)dq,
                               kg_cuda_kv_t{dk, dv, a->kv_q8}));
    TRY_OUT(fetch(q_out, dq, (size_t)T * n_q, KG_CUDA_OP_F16));
    TRY_OUT(fetch_kv(k_cache, dk, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
    TRY_OUT(fetch_kv(v_cache, dv, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
out:
    free(t0);
    free(tn);
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_attention(const kg_cuda_op_attn_t *a,
                                 const float *q,
                                 const float *k_cache,
                                 const float *v_cache,
                                 const kg_cuda_op_attn_cut_t *cut,
                                 float *out,
                                 int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_inputs_t in;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dscr = NULL, *dout = NULL, *dsinks = NULL;
    const int32_t T = a->n_tokens;
    const size_t n_q = (size_t)a->n_head * a->head_dim, n_kv = (size_t)a->n_head_kv * a->head_dim;
    const kg_cuda_attn_shape_t sh = {a->n_head, a->n_head_kv, a->head_dim, a->block_size};
    kg_cuda_attn_plan_t plan;
    kg_cuda_attn_layer_t lay;
    lay.scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    lay.softcap = a->softcap;
    lay.n_swa = a->n_swa;
    lay.chunked = a->chunked;
    lay.sinks = NULL;
    lay.non_causal = false;
    int32_t *t0 = (int32_t *)malloc((size_t)T * sizeof(int32_t) + 4);
    int32_t *tn = (int32_t *)malloc((size_t)T * sizeof(int32_t) + 4);
    int32_t n_tiles = 0, max_pos = 0;
    if (!t0 || !tn) {
        st = KG_ERR_NOMEM;
        goto out;
    }
    for (int32_t t = 0; t < T; t++) {
        max_pos = a->pos[t] > max_pos ? a->pos[t] : max_pos;
    }
    plan.split_len =
        cut->split_len > 0 ? cut->split_len : kg_cuda_attention_split_len(a->n_cache_rows);
    plan.max_splits = max_pos / plan.split_len + 1;
    plan.rt = cut->tiles ? kg_cuda_attention_prefill_rt(&sh) : 1;
    TRY_OUT(put_inputs(&dp, a, cut->tiles, kg_cuda_attention_tile_tokens(&sh, plan.rt), &in, t0, tn,
                       &n_tiles));
    TRY_OUT(put(&dp, &dq, q, (size_t)T * n_q, KG_CUDA_OP_F16));
    TRY_OUT(put_kv(&dp, &dk, k_cache, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
    TRY_OUT(put_kv(&dp, &dv, v_cache, a->n_cache_rows, (int32_t)n_kv, a->block_size, a->kv_q8));
    TRY_OUT(dalloc(&dp, &dscr, kg_cuda_attention_scratch_size(&sh, T * plan.max_splits)));
    TRY_OUT(dalloc(&dp, &dout, (size_t)T * n_q * esize(dtype)));
    if (a->sinks) {
        TRY_OUT(dup(&dp, &dsinks, a->sinks, (size_t)a->n_head * sizeof(float)));
        lay.sinks = (const float *)dsinks;
    }
    {
        /* launch groups of whole tiles whose partials fit pair_cap */
        const int32_t cap_tok = cut->pair_cap > 0 ? cut->pair_cap / plan.max_splits : T;
        int32_t g0 = 0;
        while (g0 < n_tiles) {
            int32_t g1 = g0, ntok = 0;
            while (g1 < n_tiles && (g1 == g0 || ntok + tn[g1] <= cap_tok)) {
                ntok += tn[g1++];
            }
            TRY_OUT(kg_cuda_attention(0, in, &sh, &plan, &lay, g0, g1 - g0, t0[g0], ntok,
                                      (const __half *)dq, kg_cuda_kv_t{dk, dv, a->kv_q8},
                                      (float *)dscr, dout, (kg_cuda_dtype_t)dtype));
            g0 = g1;
        }
    }
    TRY_OUT(fetch(out, dout, (size_t)T * n_q, dtype));
out:
    free(t0);
    free(tn);
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_swiglu(const float *gu, float *h, int32_t rows, int32_t n_ff, int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    void *dgu = NULL, *dh = NULL, *dhdr = NULL;
    const int32_t hdr[4] = {rows, rows, 0, 0};
    TRY_OUT(dup(&dp, &dgu, gu, (size_t)rows * 2 * n_ff * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dh, (size_t)rows * n_ff * esize(dtype)));
    TRY_OUT(dup(&dp, &dhdr, hdr, sizeof(hdr)));
    TRY_OUT(kg_cuda_swiglu(0, rows, (const kg_cuda_step_hdr_t *)dhdr, (const float *)dgu, dh,
                           (kg_cuda_dtype_t)dtype, n_ff));
    TRY_OUT(fetch(h, dh, (size_t)rows * n_ff, dtype));
out:
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_geglu(const float *gu, float *h, int32_t rows, int32_t n_ff, int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    void *dgu = NULL, *dh = NULL, *dhdr = NULL, *dtab = NULL;
    const int32_t hdr[4] = {rows, rows, 0, 0};
    uint16_t *table = (uint16_t *)malloc(65536 * sizeof(uint16_t));
    if (!table) {
        return KG_ERR_NOMEM;
    }
    kg_cuda_gelu_table_fill(table);
    TRY_OUT(dup(&dp, &dtab, table, 65536 * sizeof(uint16_t)));
    TRY_OUT(dup(&dp, &dgu, gu, (size_t)rows * 2 * n_ff * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dh, (size_t)rows * n_ff * esize(dtype)));
    TRY_OUT(dup(&dp, &dhdr, hdr, sizeof(hdr)));
    TRY_OUT(kg_cuda_geglu(0, rows, (const kg_cuda_step_hdr_t *)dhdr, (const float *)dgu,
                          (const uint16_t *)dtab, dh, (kg_cuda_dtype_t)dtype, n_ff));
    TRY_OUT(fetch(h, dh, (size_t)rows * n_ff, dtype));
out:
    free(table);
    dfree(&dp);
    return st;
}

kg_status_t
kg_cuda_op_logits_post(float *logits, int32_t rows, int32_t n_vocab, const float *bias, float cap) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    void *dl = NULL, *db = NULL;
    const size_t sz = (size_t)rows * n_vocab * sizeof(float);
    TRY_OUT(dup(&dp, &dl, logits, sz));
    if (bias) {
        TRY_OUT(dup(&dp, &db, bias, (size_t)n_vocab * sizeof(float)));
    }
    TRY_OUT(kg_cuda_logits_post(0, (float *)dl, rows, n_vocab, (const float *)db, cap, 0.0f));
    TRY_OUT(fetch(logits, dl, (size_t)rows * n_vocab, KG_CUDA_OP_F32));
out:
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_convert(int type, const void *src, int64_t n, float *out) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    const kg_ggml_type_t t = (kg_ggml_type_t)type;
    const kg_cuda_dtype_t dt = kg_cuda_weight_dtype(t);
    void *dd = NULL;
    void *host = malloc((size_t)n * 4 + 1);
    float *f32 = (float *)malloc((size_t)n * 4 + 1);
    if (!kg_type_is_known((uint32_t)type) || n % kg_type_block_elems(t) != 0) {
        st = KG_ERR_UNSUPPORTED;
        goto out;
    }
    if (!host || !f32) {
        st = KG_ERR_NOMEM;
        goto out;
    }
    /* the upload's conversion, through device memory and back */
    kg_cuda_weight_convert(t, src, n, dt, host, f32);
    TRY_OUT(dup(&dp, &dd, host, (size_t)n * esize(dt)));
    TRY_OUT(fetch(out, dd, (size_t)n, dt));
out:
    free(host);
    free(f32);
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_gemm(const float *w,
                            const float *x,
                            float *y,
                            int32_t rows,
                            int32_t n_out,
                            int32_t n_in,
                            int dtype,
                            bool cublas,
                            char *errstr,
                            size_t errstr_size) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_blas_t blas;
    kg_cuda_mat_t m;
    void *dw = NULL, *dx = NULL, *dy = NULL, *ws = NULL;
    memset(&blas, 0, sizeof(blas));
    memset(&m, 0, sizeof(m));
    TRY_OUT(dalloc(&dp, &ws, (size_t)4 << 20));
    TRY_OUT(kg_cuda_blas_init(&blas, cublas ? KG_CUDA_GEMM_CUBLAS : KG_CUDA_GEMM_MMA, 0, ws,
                              (size_t)4 << 20, errstr, errstr_size));
    TRY_OUT(put(&dp, &dw, w, (size_t)n_out * n_in, dtype));
    TRY_OUT(put(&dp, &dx, x, (size_t)rows * n_in, dtype));
    TRY_OUT(dalloc(&dp, &dy, (size_t)rows * n_out * sizeof(float)));
    m.data = dw;
    m.n_out = n_out;
    m.n_in = n_in;
    m.dt = (kg_cuda_dtype_t)dtype;
    TRY_OUT(kg_cuda_gemm(&blas, 0, &m, dx, (float *)dy, rows));
    TRY_OUT(fetch(y, dy, (size_t)rows * n_out, KG_CUDA_OP_F32));
out:
    kg_cuda_blas_clear(&blas);
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_gemm_quant(int type,
                                  const void *blocks,
                                  const float *x,
                                  float *y,
                                  int32_t rows,
                                  int32_t n_out,
                                  int32_t n_in,
                                  bool native) {
    if (!kg_cuda_gemm_native(type, n_in)) {
        return KG_ERR_UNSUPPORTED;
    }
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_blas_t blas;
    kg_cuda_mat_t m;
    const size_t n = (size_t)n_out * (size_t)n_in;
    const size_t qsize = kg_cuda_native_size(type, n_out, n_in);
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(type);
    void *dw = NULL, *dx = NULL, *dy = NULL;
    /* host: the split blocks (native), or the BF16 expansion and its f32 scratch */
    char *host = (char *)malloc(native ? qsize : n * 2);
    float *f32 = native ? NULL : (float *)malloc(n * sizeof(float));
    memset(&blas, 0, sizeof(blas));
    memset(&m, 0, sizeof(m));
    if (!host || (!native && !f32)) {
        st = KG_ERR_NOMEM;
        goto out;
    }
    TRY_OUT(kg_cuda_blas_init(&blas, KG_CUDA_GEMM_MMA, 0, NULL, 0, NULL, 0));
    if (native) {
        const int64_t n_blocks = (int64_t)n_out * (n_in / L.elems);
        kg_cuda_qsplit(type, blocks, n_blocks, host, host + n_blocks * L.body);
        TRY_OUT(dup(&dp, &dw, host, qsize));
        m.qtype = type;
    } else {
        kg_cuda_weight_convert((kg_ggml_type_t)type, blocks, (int64_t)n, KG_CUDA_BF16, host, f32);
        TRY_OUT(dup(&dp, &dw, host, n * 2));
    }
    TRY_OUT(put(&dp, &dx, x, (size_t)rows * n_in, KG_CUDA_OP_BF16));
    TRY_OUT(dalloc(&dp, &dy, (size_t)rows * n_out * sizeof(float)));
    m.data = dw;
    m.n_out = n_out;
    m.n_in = n_in;
    m.dt = KG_CUDA_BF16;
    TRY_OUT(kg_cuda_gemm(&blas, 0, &m, dx, (float *)dy, rows));
    TRY_OUT(fetch(y, dy, (size_t)rows * n_out, KG_CUDA_OP_F32));
out:
    kg_cuda_blas_clear(&blas);
    free(host);
    free(f32);
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_sample(const float *logits,
                              int32_t rows,
                              int32_t n_vocab,
                              const kg_sample_request_t *reqs,
                              kg_sample_result_t *out) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_sampler_t s;
    void *dl = NULL;
    int32_t bad = -1;
    memset(&s, 0, sizeof(s));
    TRY_OUT(dup(&dp, &dl, logits, (size_t)rows * n_vocab * sizeof(float)));
    TRY_OUT(kg_cuda_sampler_init(&s, n_vocab, rows));
    TRY_OUT(kg_cuda_sampler_run(&s, 0, (float *)dl, reqs, rows, out, &bad));
out:
    kg_cuda_sampler_clear(&s);
    dfree(&dp);
    return st;
}
