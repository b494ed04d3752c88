/* kg_cuda_ops: one kernel family at a time from host memory, for tests. */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "gemm.cuh"
#include "kg_cuda_ops.h"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sample.cuh"
#include "swiglu.cuh"

#include <string.h>

extern "C" {
#include "../src/model/kg_quant.h"
}

// ---- helpers ----

/* Up to 16 device buffers freed together. */
typedef struct dev_pool {
    void *p[16];
    int n;
} dev_pool_t;

static kg_status_t dalloc(dev_pool_t *dp, void **d, size_t size) {
    *d = NULL;
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

static size_t esize(int dt) {
    return dt == KG_CUDA_OP_F32 ? 4 : 2;
}

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

/* Step inputs for the attention-shaped ops: header, pos, tbl_off, table. */
static kg_status_t put_inputs(dev_pool_t *dp, const kg_cuda_op_attn_t *a, kg_cuda_inputs_t *in) {
    const int32_t cap = a->n_tokens;
    const size_t n = 4 + 4 * (size_t)cap + (size_t)a->n_table;
    int32_t *h = (int32_t *)calloc(n, sizeof(int32_t));
    if (!h) {
        return KG_ERR_NOMEM;
    }
    h[0] = cap;
    h[1] = cap;
    memcpy(h + 4 + cap, a->pos, (size_t)cap * sizeof(int32_t));
    memcpy(h + 4 + 2 * cap, a->tbl_off, (size_t)cap * sizeof(int32_t));
    for (int32_t i = 0; i < cap; i++) {
        h[4 + 3 * cap + i] = i;
    }
    memcpy(h + 4 + 4 * cap, a->table, (size_t)a->n_table * sizeof(int32_t));
    void *d = NULL;
    const kg_status_t st = dup(dp, &d, h, n * sizeof(int32_t));
    free(h);
    if (st == KG_OK) {
        *in = kg_cuda_inputs_view((const int32_t *)d, cap);
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
                                   const float *w,
                                   float *y,
                                   int32_t rows,
                                   int32_t n,
                                   float eps,
                                   int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    void *dx = NULL, *dadd = NULL, *dw = NULL, *dy = NULL, *dh = NULL;
    const int32_t hdr[4] = {rows, rows, 0, 0};
    const size_t sz = (size_t)rows * n * sizeof(float);
    TRY_OUT(dup(&dp, &dx, x, sz));
    if (add) {
        TRY_OUT(dup(&dp, &dadd, add, sz));
    }
    TRY_OUT(dup(&dp, &dw, w, (size_t)n * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dy, (size_t)rows * n * esize(dtype)));
    TRY_OUT(dup(&dp, &dh, hdr, sizeof(hdr)));
    TRY_OUT(kg_cuda_add_rmsnorm(0, rows, (const kg_cuda_step_hdr_t *)dh, false, NULL, (float *)dx,
                                (const float *)dadd, (const float *)dw, dy, (kg_cuda_dtype_t)dtype,
                                n, eps));
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
    void *dqkv = NULL, *dcs = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    const int32_t T = a->n_tokens;
    const size_t n_q = (size_t)a->n_head * a->head_dim, n_kv = (size_t)a->n_head_kv * a->head_dim;
    const size_t cache = (size_t)a->n_cache_rows * n_kv;
    const kg_cuda_rope_shape_t sh = {a->n_head, a->n_head_kv, a->head_dim, a->n_rot, a->block_size};
    TRY_OUT(put_inputs(&dp, a, &in));
    TRY_OUT(dup(&dp, &dqkv, qkv, (size_t)T * (n_q + 2 * n_kv) * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dcs, (size_t)T * a->n_rot * sizeof(float)));
    TRY_OUT(dalloc(&dp, &dq, (size_t)T * n_q * 2));
    TRY_OUT(put(&dp, &dk, k_cache, cache, KG_CUDA_OP_F16));
    TRY_OUT(put(&dp, &dv, v_cache, cache, KG_CUDA_OP_F16));
    TRY_OUT(
        kg_cuda_rope_cache(0, T, in, (float *)dcs, a->n_rot, a->rope_base, a->rope_scale, NULL));
    TRY_OUT(kg_cuda_rope_store(0, T, in, &sh, (const float *)dqkv, (const float *)dcs, (__half *)dq,
                               (__half *)dk, (__half *)dv));
    TRY_OUT(fetch(q_out, dq, (size_t)T * n_q, KG_CUDA_OP_F16));
    TRY_OUT(fetch(k_cache, dk, cache, KG_CUDA_OP_F16));
    TRY_OUT(fetch(v_cache, dv, cache, KG_CUDA_OP_F16));
out:
    dfree(&dp);
    return st;
}

kg_status_t kg_cuda_op_attention(const kg_cuda_op_attn_t *a,
                                 const float *q,
                                 const float *k_cache,
                                 const float *v_cache,
                                 int32_t n_split,
                                 float *out,
                                 int dtype) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_inputs_t in;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dscr = NULL, *dout = NULL;
    const int32_t T = a->n_tokens;
    const size_t n_q = (size_t)a->n_head * a->head_dim, n_kv = (size_t)a->n_head_kv * a->head_dim;
    const size_t cache = (size_t)a->n_cache_rows * n_kv;
    const kg_cuda_attn_shape_t sh = {a->n_head, a->n_head_kv, a->head_dim, a->block_size};
    int n_sm = 0;
    TRY_OUT(put_inputs(&dp, a, &in));
    TRY_OUT(put(&dp, &dq, q, (size_t)T * n_q, KG_CUDA_OP_F16));
    TRY_OUT(put(&dp, &dk, k_cache, cache, KG_CUDA_OP_F16));
    TRY_OUT(put(&dp, &dv, v_cache, cache, KG_CUDA_OP_F16));
    if (n_split <= 0) {
        if (cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
            st = KG_ERR_BACKEND;
            goto out;
        }
        n_split = kg_cuda_attention_splits(T, &sh, n_sm, T * KG_CUDA_ATT_MAX_SPLIT);
    }
    TRY_OUT(dalloc(&dp, &dscr, kg_cuda_attention_scratch_size(&sh, T * n_split)));
    TRY_OUT(dalloc(&dp, &dout, (size_t)T * n_q * esize(dtype)));
    TRY_OUT(kg_cuda_attention(0, T, in, &sh, n_split, (const __half *)dq, (const __half *)dk,
                              (const __half *)dv, (float *)dscr, dout, (kg_cuda_dtype_t)dtype));
    TRY_OUT(fetch(out, dout, (size_t)T * n_q, dtype));
out:
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

kg_status_t kg_cuda_op_gemm(const float *w,
                            const float *x,
                            float *y,
                            int32_t rows,
                            int32_t n_out,
                            int32_t n_in,
                            int dtype,
                            bool gemv,
                            char *errstr,
                            size_t errstr_size) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_blas_t blas;
    kg_cuda_mat_t m;
    void *dw = NULL, *dx = NULL, *dy = NULL, *ws = NULL;
    memset(&blas, 0, sizeof(blas));
    TRY_OUT(dalloc(&dp, &ws, (size_t)4 << 20));
    TRY_OUT(kg_cuda_blas_init(&blas, 0, ws, (size_t)4 << 20, errstr, errstr_size));
    blas.gemv = gemv;
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

kg_status_t kg_cuda_op_sample(const float *logits,
                              int32_t rows,
                              int32_t n_vocab,
                              const kg_sample_request_t *reqs,
                              kg_sample_result_t *out) {
    dev_pool_t dp = {{NULL}, 0};
    kg_status_t st = KG_OK;
    kg_cuda_sampler_t s;
    void *dl = NULL;
    memset(&s, 0, sizeof(s));
    TRY_OUT(dup(&dp, &dl, logits, (size_t)rows * n_vocab * sizeof(float)));
    TRY_OUT(kg_cuda_sampler_init(&s, n_vocab, rows));
    TRY_OUT(kg_cuda_sampler_run(&s, 0, (float *)dl, reqs, rows, out));
out:
    kg_cuda_sampler_clear(&s);
    dfree(&dp);
    return st;
}
