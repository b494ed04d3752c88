/* kg_backend_cuda: the CUDA backend (vtable glue, weights, buffers, steps,
 * graphs).
 *
 * DESIGN
 * Weights. Uploaded once at start. Per layer, Q|K|V are fused into one
 * (n_q + 2 n_kv, n_embd) matrix and gate|up into one (2 n_ff, n_embd)
 * matrix, so a step runs 4 GEMMs per layer. A matrix is stored BF16 unless
 * all its parts are F16 (kept F16) or F32 (kept F32: tiny test models and
 * exact parity with the CPU backend, which computes those in F32); Q8_0,
 * Q4_0 and K-quants are dequantized with kg_dequantize on the host and
 * converted to BF16. The activation entering a GEMM is written in the
 * weight's type by the kernel that produces it, as the CPU backend rounds
 * activations to the weight type. Norm weights are F32. A tied head reuses
 * the embedding matrix.
 *
 * KV pool. F16 in device memory, the CPU backend's layout: per layer K and
 * V of (n_kv_blocks * kv_block_size rows, n_head_kv * head_dim).
 *
 * Step. All buffers are allocated at start for max_batch_tokens tokens
 * (logits for at most out_cap rows); a step makes no allocation. The host
 * packs the step's tokens, positions, output rows and the block tables of
 * the step's sequences (compacted: each sequence's blocks up to its last
 * position) into one pinned buffer, sent with one cudaMemcpyAsync; then on
 * one stream: embedding gather and RoPE angles, per layer add+RMSNorm,
 * QKV GEMM, RoPE + KV store, paged attention, output GEMM, add+RMSNorm,
 * gate|up GEMM, SwiGLU, down GEMM; final add+RMSNorm of the rows that want
 * logits only, and the head GEMM over those rows. forward(logits != NULL)
 * copies the logits to the host; forward(NULL) leaves them on the device
 * for sample(), which runs the device sampler (sample.cu) and returns only
 * the picks.
 *
 * Graphs. A decode-only step (every token wants logits) runs as a CUDA
 * graph captured once per batch-size bucket (1, 2, 4, ... 512, capped by
 * max_batch_tokens and the logits rows): the step is padded to the bucket,
 * kernels read the real token count and positions from the uploaded
 * header (padding rows write no KV and are never read back), and the
 * attention split count depends on the bucket only, so one graph serves
 * every later step of that size whatever the sequence lengths. The input
 * copy stays outside the graph (its size varies). Set KGEN_CUDA_GRAPHS=0
 * to run every step eagerly.
 *
 * Errors. Every CUDA and cuBLAS call is checked. Any device-side failure
 * marks the backend dead: that call and every later one return
 * KG_ERR_BACKEND, since a sticky CUDA error poisons the context and the
 * KV pool may be half-written (docs/CONVENTIONS.md §4: the worker exits and
 * Kafka redelivers). Bad batches from the caller return KG_ERR_INVALID
 * and leave the backend alive. */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "embed.cuh"
#include "gemm.cuh"
#include "kg_backend_cuda.h"
#include "kv_copy.cuh"
#include "logit_bias.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sample.cuh"
#include "swiglu.cuh"

#include <string.h>

extern "C" {
#include "../src/backend/kg_backend_impl.h"
#include "../src/model/kg_quant.h"
}

#define N_BUCKETS      10 /* graph buckets 1, 2, 4, ..., 512 */
#define MAX_OUTPUTS    512
#define STAGE_SIZE     ((size_t)32 << 20)
#define BLAS_WORKSPACE ((size_t)32 << 20)
#define MAX_SPLIT_ROWS 2048

typedef struct cuda_layer {
    float *attn_norm, *ffn_norm; /* (n_embd) */
    kg_cuda_mat_t wqkv;          /* (n_q + 2 n_kv, n_embd) */
    kg_cuda_mat_t wo;            /* (n_embd, n_q) */
    kg_cuda_mat_t wgu;           /* (2 n_ff, n_embd): gate rows, then up rows */
    kg_cuda_mat_t wdown;         /* (n_embd, n_ff) */
} cuda_layer_t;

typedef struct cuda_ctx {
    const kg_model_t *model;
    kg_hparams_t hp;
    int device, n_sm;
    bool dead;
    cudaStream_t stream;
    kg_cuda_blas_t blas;
    void *blas_ws;
    int32_t n_kv_blocks, block_size, max_tokens, out_cap, table_cap;

    cuda_layer_t *layers;  /* (n_layer) */
    kg_cuda_mat_t emb;     /* (n_vocab, n_embd) */
    kg_cuda_mat_t head;    /* (n_vocab, n_embd); data == emb.data when tied */
    float *out_norm;       /* (n_embd) */
    float *rope_freqs;     /* (n_rot / 2) or NULL */
    __half *kv;            /* (n_layer, 2, n_kv_blocks * block_size, n_kv) */
    size_t kv_layer_elems; /* elements of one layer's K (or V) */

    /* activations, T = max_tokens rows; 16-bit ones sized for 4-byte elements
     * when any weight is F32 */
    float *x;       /* (T, n_embd) residual stream */
    float *qkv;     /* (T, n_q + 2 n_kv) */
    float *tmp;     /* (T, n_embd) projection output before the residual add */
    float *gu;      /* (T, 2 n_ff) */
    float *rope_cs; /* (T, n_rot) */
    float *split;   /* attention split scratch */
    float *logits;  /* (out_cap, n_vocab) */
    __half *q16;    /* (T, n_q) */
    void *xn;       /* (T, n_embd) normed input of a block, in the next GEMM's type */
    void *att;      /* (T, n_q) in wo's type */
    void *h;        /* (T, n_ff) in wdown's type */
    void *xo;       /* (out_cap, n_embd) in the head's type */

    /* the step's inputs */
    int32_t *h_in, *d_in; /* pinned / device: header, token, pos, tbl_off, out_row, table */
    size_t in_cap;        /* int32s */
    cudaEvent_t ev_in;    /* the last input copy has been read */
    /* host scratch for compacting block tables */
    int32_t *hash_seq, *hash_idx; /* (hash_cap) open addressing: seq -> distinct index */
    int32_t hash_cap;
    int32_t *dist_seq, *dist_max_pos, *dist_off, *dist_slot, *tok_dist; /* (max_tokens) */

    bool use_graphs;
    cudaGraphExec_t graphs[N_BUCKETS];
    int32_t last_n_outputs;
    kg_cuda_sampler_t sampler;
    bool sampler_ready;
    kg_cuda_bias_t bias; /* logit_bias.cu: the requests' logit_bias before sampling */

    size_t weights_size, kv_size, scratch_size;
} cuda_ctx_t;

// ---- availability ----

bool kg_backend_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the error so later calls do not see it */
        return false;
    }
    return n > 0;
}

static void cuda_free(kg_backend_t *be);
static kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits);
static void cuda_memory(const kg_backend_t *be, kg_backend_memory_t *out);
static kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out);

static const struct kg_backend_i cuda_iface = {
    /* .name    = */ "cuda",
    /* .free    = */ cuda_free,
    /* .forward = */ cuda_forward,
    /* .memory  = */ cuda_memory,
};

bool kg_backend_is_cuda(const kg_backend_t *be) {
    return be && be->iface.free == cuda_free;
}

// ---- weights ----

static kg_cuda_dtype_t pick_dtype(const kg_gguf_tensor_t *const *parts, int n) {
    for (int i = 1; i < n; i++) {
        if (parts[i]->type != parts[0]->type) {
            return KG_CUDA_BF16;
        }
    }
    switch (parts[0]->type) {
    case KG_GGML_TYPE_F32:
        return KG_CUDA_F32;
    case KG_GGML_TYPE_F16:
        return KG_CUDA_F16;
    default:
        return KG_CUDA_BF16;
    }
}

/* Staging for uploads: two pinned buffers so the conversion of one chunk
 * overlaps the copy of the previous one. */
typedef struct stage {
    void *buf[2];
    cudaEvent_t ev[2];
    float *f32; /* host scratch for dequantized rows */
    int cur;
} stage_t;

static kg_status_t stage_init(stage_t *s) {
    memset(s, 0, sizeof(*s));
    KG_CUDA_CHECK(cudaMallocHost(&s->buf[0], STAGE_SIZE));
    KG_CUDA_CHECK(cudaMallocHost(&s->buf[1], STAGE_SIZE));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev[0], cudaEventDisableTiming));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev[1], cudaEventDisableTiming));
    s->f32 = (float *)malloc(STAGE_SIZE);
    if (!s->f32) {
        KG_LOG_ERROR("cuda", "out of host memory for the upload buffer");
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

static void stage_clear(stage_t *s) {
    for (int i = 0; i < 2; i++) {
        if (s->ev[i]) {
            cudaEventSynchronize(s->ev[i]);
            cudaEventDestroy(s->ev[i]);
        }
        cudaFreeHost(s->buf[i]);
    }
    free(s->f32);
}

/* Copy `n_rows` rows of tensor t (starting at row r0) into device memory
 * `dst` as type dt. */
static kg_status_t upload_rows(cuda_ctx_t *ctx,
                               stage_t *s,
                               const kg_gguf_tensor_t *t,
                               int64_t r0,
                               int64_t n_rows,
                               kg_cuda_dtype_t dt,
                               char *dst) {
    const int64_t n_in = t->ne[0];
    const size_t es = kg_cuda_dtype_size(dt);
    const bool same = (dt == KG_CUDA_F32 && t->type == KG_GGML_TYPE_F32) ||
                      (dt == KG_CUDA_F16 && t->type == KG_GGML_TYPE_F16) ||
                      (dt == KG_CUDA_BF16 && t->type == KG_GGML_TYPE_BF16);
    const int64_t per_chunk = (int64_t)(STAGE_SIZE / ((size_t)n_in * 4)) > 0
                                  ? (int64_t)(STAGE_SIZE / ((size_t)n_in * 4))
                                  : 1;
    const size_t src_row = kg_type_row_size(t->type, n_in);
    for (int64_t r = 0; r < n_rows; r += per_chunk) {
        const int64_t nr = n_rows - r < per_chunk ? n_rows - r : per_chunk;
        const int64_t n = nr * n_in;
        const char *src = (const char *)t->data + (size_t)(r0 + r) * src_row;
        void *buf = s->buf[s->cur];
        KG_CUDA_CHECK(cudaEventSynchronize(s->ev[s->cur])); /* its previous copy is done */
        if (same) {
            memcpy(buf, src, (size_t)n * es);
        } else {
            kg_dequantize(t->type, src, s->f32, n);
            if (dt == KG_CUDA_F32) {
                memcpy(buf, s->f32, (size_t)n * 4);
            } else {
                uint16_t *o = (uint16_t *)buf;
                for (int64_t i = 0; i < n; i++) {
                    o[i] =
                        dt == KG_CUDA_F16 ? kg_fp32_to_fp16(s->f32[i]) : kg_fp32_to_bf16(s->f32[i]);
                }
            }
        }
        KG_CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)r * (size_t)n_in * es, buf, (size_t)n * es,
                                      cudaMemcpyHostToDevice, ctx->stream));
        KG_CUDA_CHECK(cudaEventRecord(s->ev[s->cur], ctx->stream));
        s->cur ^= 1;
    }
    return KG_OK;
}

/* One device matrix from the row-concatenation of `parts` (same n_in). */
static kg_status_t upload_mat(cuda_ctx_t *ctx,
                              stage_t *s,
                              const kg_gguf_tensor_t *const *parts,
                              int n_parts,
                              kg_cuda_mat_t *m) {
    m->dt = pick_dtype(parts, n_parts);
    m->n_in = (int32_t)parts[0]->ne[0];
    m->n_out = 0;
    for (int i = 0; i < n_parts; i++) {
        m->n_out += (int32_t)(parts[i]->n_dims > 1 ? parts[i]->ne[1] : 1);
    }
    const size_t es = kg_cuda_dtype_size(m->dt);
    const size_t size = (size_t)m->n_out * (size_t)m->n_in * es;
    KG_CUDA_CHECK(cudaMalloc(&m->data, size));
    ctx->weights_size += size;
    int64_t row = 0;
    for (int i = 0; i < n_parts; i++) {
        const int64_t rows = parts[i]->n_dims > 1 ? parts[i]->ne[1] : 1;
        KG_TRY(upload_rows(ctx, s, parts[i], 0, rows, m->dt,
                           (char *)m->data + (size_t)row * (size_t)m->n_in * es));
        row += rows;
    }
    return KG_OK;
}

/* A small F32 vector (norm weights, rope factors): dequantize and copy. */
static kg_status_t upload_vec(cuda_ctx_t *ctx, const kg_gguf_tensor_t *t, int64_t n, float **out) {
    float *h = (float *)malloc((size_t)n * sizeof(float));
    if (!h) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    kg_dequantize(t->type, t->data, h, n);
    cudaError_t err = cudaMalloc((void **)out, (size_t)n * sizeof(float));
    if (err == cudaSuccess) {
        err = cudaMemcpy(*out, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(h);
    KG_CUDA_CHECK(err);
    ctx->weights_size += (size_t)n * sizeof(float);
    return KG_OK;
}

static kg_status_t upload_weights(cuda_ctx_t *ctx) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    stage_t s;
    kg_status_t st = stage_init(&s);
    for (int32_t il = 0; st == KG_OK && il < hp->n_layer; il++) {
        const kg_layer_weights_t *src = &model->layers[il];
        cuda_layer_t *L = &ctx->layers[il];
        const kg_gguf_tensor_t *qkv[3] = {src->wq, src->wk, src->wv};
        const kg_gguf_tensor_t *gu[2] = {src->w_gate, src->w_up};
        if ((st = upload_vec(ctx, src->attn_norm, hp->n_embd, &L->attn_norm)) != KG_OK ||
            (st = upload_vec(ctx, src->ffn_norm, hp->n_embd, &L->ffn_norm)) != KG_OK ||
            (st = upload_mat(ctx, &s, qkv, 3, &L->wqkv)) != KG_OK ||
            (st = upload_mat(ctx, &s, &src->wo, 1, &L->wo)) != KG_OK ||
            (st = upload_mat(ctx, &s, gu, 2, &L->wgu)) != KG_OK ||
            (st = upload_mat(ctx, &s, &src->w_down, 1, &L->wdown)) != KG_OK) {
            break;
        }
    }
    if (st == KG_OK) {
        st = upload_vec(ctx, model->output_norm, hp->n_embd, &ctx->out_norm);
    }
    if (st == KG_OK) {
        st = upload_mat(ctx, &s, &model->tok_embd, 1, &ctx->emb);
    }
    if (st == KG_OK) {
        if (model->output == model->tok_embd) {
            ctx->head = ctx->emb;
        } else {
            st = upload_mat(ctx, &s, &model->output, 1, &ctx->head);
        }
    }
    if (st == KG_OK && model->rope_freqs) {
        st = upload_vec(ctx, model->rope_freqs, hp->n_rot / 2, &ctx->rope_freqs);
    }
    stage_clear(&s);
    if (st == KG_OK) {
        KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    }
    return st;
}

// ---- buffers ----

static kg_status_t dev_alloc(cuda_ctx_t *ctx, void **p, size_t size) {
    KG_CUDA_CHECK(cudaMalloc(p, size ? size : 1));
    KG_CUDA_CHECK(cudaMemset(*p, 0, size ? size : 1));
    ctx->scratch_size += size;
    return KG_OK;
}

static kg_cuda_attn_shape_t attn_shape(const cuda_ctx_t *ctx) {
    kg_cuda_attn_shape_t sh = {ctx->hp.n_head, ctx->hp.n_head_kv, ctx->hp.head_dim,
                               ctx->block_size};
    return sh;
}

static kg_status_t alloc_buffers(cuda_ctx_t *ctx) {
    const kg_hparams_t *hp = &ctx->hp;
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    const size_t n_q = (size_t)hp->n_head * hp->head_dim,
                 n_kv = (size_t)hp->n_head_kv * hp->head_dim;
    size_t es = 2;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        if (L->wqkv.dt == KG_CUDA_F32 || L->wo.dt == KG_CUDA_F32 || L->wgu.dt == KG_CUDA_F32 ||
            L->wdown.dt == KG_CUDA_F32) {
            es = 4;
        }
    }
    const size_t es_head = kg_cuda_dtype_size(ctx->head.dt);

    /* KV pool */
    ctx->kv_layer_elems = (size_t)ctx->n_kv_blocks * (size_t)ctx->block_size * n_kv;
    ctx->kv_size = 2 * ctx->kv_layer_elems * (size_t)hp->n_layer * sizeof(__half);
    KG_CUDA_CHECK(cudaMalloc((void **)&ctx->kv, ctx->kv_size));
    KG_CUDA_CHECK(cudaMemset(ctx->kv, 0, ctx->kv_size));

    const kg_cuda_attn_shape_t ash = attn_shape(ctx);
    KG_TRY(dev_alloc(ctx, (void **)&ctx->x, T * E * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->qkv, T * (n_q + 2 * n_kv) * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->tmp, T * E * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->gu, T * 2 * F * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->rope_cs, T * (size_t)hp->n_rot * 4));
    KG_TRY(
        dev_alloc(ctx, (void **)&ctx->split, kg_cuda_attention_scratch_size(&ash, MAX_SPLIT_ROWS)));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->logits, (size_t)ctx->out_cap * (size_t)hp->n_vocab * 4));
    KG_TRY(dev_alloc(ctx, (void **)&ctx->q16, T * n_q * 2));
    KG_TRY(dev_alloc(ctx, &ctx->xn, T * E * es));
    KG_TRY(dev_alloc(ctx, &ctx->att, T * n_q * es));
    KG_TRY(dev_alloc(ctx, &ctx->h, T * F * es));
    KG_TRY(dev_alloc(ctx, &ctx->xo, (size_t)ctx->out_cap * E * es_head));

    /* step inputs: header (4), token, pos, tbl_off, out_row (T each), table */
    ctx->in_cap = 4 + 4 * T + (size_t)ctx->table_cap;
    KG_CUDA_CHECK(cudaMallocHost((void **)&ctx->h_in, ctx->in_cap * sizeof(int32_t)));
    KG_CUDA_CHECK(cudaMalloc((void **)&ctx->d_in, ctx->in_cap * sizeof(int32_t)));
    KG_CUDA_CHECK(cudaMemset(ctx->d_in, 0, ctx->in_cap * sizeof(int32_t)));
    ctx->scratch_size += ctx->in_cap * sizeof(int32_t);
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->ev_in, cudaEventDisableTiming));

    ctx->hash_cap = 1;
    while (ctx->hash_cap < 2 * ctx->max_tokens) {
        ctx->hash_cap <<= 1;
    }
    ctx->hash_seq = (int32_t *)malloc((size_t)ctx->hash_cap * sizeof(int32_t));
    ctx->hash_idx = (int32_t *)malloc((size_t)ctx->hash_cap * sizeof(int32_t));
    ctx->dist_seq = (int32_t *)malloc(T * sizeof(int32_t));
    ctx->dist_max_pos = (int32_t *)malloc(T * sizeof(int32_t));
    ctx->dist_off = (int32_t *)malloc(T * sizeof(int32_t));
    ctx->dist_slot = (int32_t *)malloc(T * sizeof(int32_t));
    ctx->tok_dist = (int32_t *)malloc(T * sizeof(int32_t));
    if (!ctx->hash_seq || !ctx->hash_idx || !ctx->dist_seq || !ctx->dist_max_pos ||
        !ctx->dist_off || !ctx->dist_slot || !ctx->tok_dist) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t i = 0; i < ctx->hash_cap; i++) {
        ctx->hash_seq[i] = -1;
    }

    KG_TRY(kg_cuda_sampler_init(&ctx->sampler, hp->n_vocab, ctx->out_cap));
    ctx->sampler_ready = true;
    ctx->scratch_size += kg_cuda_sampler_device_size(&ctx->sampler);
    KG_TRY(kg_cuda_bias_init(&ctx->bias, ctx->out_cap));
    ctx->scratch_size += kg_cuda_bias_device_size(&ctx->bias);
    return KG_OK;
}

// ---- the step ----

static int32_t hash_slot(const cuda_ctx_t *ctx, int32_t seq) {
    uint32_t h = (uint32_t)seq * 2654435761u;
    int32_t i = (int32_t)(h & (uint32_t)(ctx->hash_cap - 1));
    while (ctx->hash_seq[i] != -1 && ctx->hash_seq[i] != seq) {
        i = (i + 1) & (ctx->hash_cap - 1);
    }
    return i;
}

/* Check the batch and pack it for `cap` slots into h_in; *n_ints gets the
 * size to copy. KG_ERR_INVALID for a batch the CPU backend would refuse
 * too, or block ids outside the pool. */
static kg_status_t
pack_inputs(cuda_ctx_t *ctx, const kg_step_batch_t *batch, int32_t cap, size_t *n_ints) {
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t T = batch->n_tokens, bs = ctx->block_size;
    int32_t *hdr = ctx->h_in;
    int32_t *token = hdr + 4, *pos = token + cap, *tbl_off = pos + cap, *out_row = tbl_off + cap;
    int32_t *table = out_row + cap;
    kg_status_t st = KG_OK;
    int32_t n_dist = 0, n_out = 0;

    for (int32_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], p = batch->pos[t], seq = batch->seq[t];
        if (tok < 0 || tok >= hp->n_vocab || p < 0 || seq < 0 || seq >= batch->n_slots ||
            p / bs >= batch->max_blocks_per_seq) {
            KG_LOG_ERROR("cuda", "bad batch entry %d: token %d pos %d seq %d", t, tok, p, seq);
            st = KG_ERR_INVALID;
            goto out;
        }
        token[t] = tok;
        pos[t] = p;
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
            ctx->dist_slot[n_dist] = slot;
            n_dist++;
        }
        const int32_t d = ctx->hash_idx[slot];
        ctx->dist_max_pos[d] = p > ctx->dist_max_pos[d] ? p : ctx->dist_max_pos[d];
        ctx->tok_dist[t] = d;
    }
    if (n_out != batch->n_outputs) {
        KG_LOG_ERROR("cuda", "batch says %d outputs, want_logits has %d", batch->n_outputs, n_out);
        st = KG_ERR_INVALID;
        goto out;
    }
    {
        int64_t n_table = 0;
        for (int32_t d = 0; d < n_dist; d++) {
            ctx->dist_off[d] = (int32_t)n_table;
            n_table += ctx->dist_max_pos[d] / bs + 1;
        }
        if (n_table > ctx->table_cap) {
            KG_LOG_ERROR("cuda", "step needs %lld block-table entries, capacity %d",
                         (long long)n_table, ctx->table_cap);
            st = KG_ERR_INVALID;
            goto out;
        }
        for (int32_t d = 0; d < n_dist && st == KG_OK; d++) {
            const int32_t *src =
                batch->block_table + (int64_t)ctx->dist_seq[d] * batch->max_blocks_per_seq;
            const int32_t n_blk = ctx->dist_max_pos[d] / bs + 1;
            for (int32_t b = 0; b < n_blk; b++) {
                if (src[b] < 0 || src[b] >= ctx->n_kv_blocks) {
                    KG_LOG_ERROR("cuda", "seq %d block %d is %d, outside the pool of %d blocks",
                                 ctx->dist_seq[d], b, src[b], ctx->n_kv_blocks);
                    st = KG_ERR_INVALID;
                    break;
                }
                table[ctx->dist_off[d] + b] = src[b];
            }
        }
        for (int32_t t = 0; t < T; t++) {
            tbl_off[t] = ctx->dist_off[ctx->tok_dist[t]];
        }
        hdr[0] = T;
        hdr[1] = n_out;
        hdr[2] = 0;
        hdr[3] = 0;
        *n_ints = 4 + 4 * (size_t)cap + (size_t)n_table;
    }
out:
    /* empty the slots we filled (not by lookup: clearing one slot of a
     * probe chain would hide the entries after it) */
    for (int32_t d = 0; d < n_dist; d++) {
        ctx->hash_seq[ctx->dist_slot[d]] = -1;
    }
    return st;
}

static __half *k_cache(const cuda_ctx_t *ctx, int32_t il) {
    return ctx->kv + (size_t)(2 * il) * ctx->kv_layer_elems;
}

static __half *v_cache(const cuda_ctx_t *ctx, int32_t il) {
    return ctx->kv + (size_t)(2 * il + 1) * ctx->kv_layer_elems;
}

/* Every kernel of one step over `rows` token slots (the real count is in
 * the device header) and `head_rows` logits rows. Also what a graph
 * captures. */
static kg_status_t run_step(cuda_ctx_t *ctx, int32_t rows, int32_t head_rows) {
    const kg_hparams_t *hp = &ctx->hp;
    cudaStream_t st = ctx->stream;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    const kg_cuda_step_hdr_t *hdr = in.hdr;
    const kg_cuda_rope_shape_t rsh = {hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot,
                                      ctx->block_size};
    const kg_cuda_attn_shape_t ash = attn_shape(ctx);
    const int32_t n_split = kg_cuda_attention_splits(rows, &ash, ctx->n_sm, MAX_SPLIT_ROWS);

    KG_TRY(kg_cuda_embed(st, rows, in, ctx->emb.data, ctx->emb.dt, hp->n_embd, ctx->x));
    KG_TRY(kg_cuda_rope_cache(st, rows, in, ctx->rope_cs, hp->n_rot, hp->rope_base, hp->rope_scale,
                              ctx->rope_freqs));
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        /* the previous layer's down projection joins the residual here */
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, il > 0 ? ctx->tmp : NULL,
                                   L->attn_norm, ctx->xn, L->wqkv.dt, hp->n_embd, hp->norm_eps));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wqkv, ctx->xn, ctx->qkv, rows));
        KG_TRY(kg_cuda_rope_store(st, rows, in, &rsh, ctx->qkv, ctx->rope_cs, ctx->q16,
                                  k_cache(ctx, il), v_cache(ctx, il)));
        KG_TRY(kg_cuda_attention(st, rows, in, &ash, n_split, ctx->q16, k_cache(ctx, il),
                                 v_cache(ctx, il), ctx->split, ctx->att, L->wo.dt));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wo, ctx->att, ctx->tmp, rows));
        KG_TRY(kg_cuda_add_rmsnorm(st, rows, hdr, false, NULL, ctx->x, ctx->tmp, L->ffn_norm,
                                   ctx->xn, L->wgu.dt, hp->n_embd, hp->norm_eps));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wgu, ctx->xn, ctx->gu, rows));
        KG_TRY(kg_cuda_swiglu(st, rows, hdr, ctx->gu, ctx->h, L->wdown.dt, hp->n_ff));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wdown, ctx->h, ctx->tmp, rows));
    }
    /* the last residual add and the final norm, only for the rows that want logits */
    KG_TRY(kg_cuda_add_rmsnorm(st, head_rows, hdr, true, in.out_row, ctx->x, ctx->tmp,
                               ctx->out_norm, ctx->xo, ctx->head.dt, hp->n_embd, hp->norm_eps));
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &ctx->head, ctx->xo, ctx->logits, head_rows));
    return KG_OK;
}

/* Capture run_step for `rows` slots into graphs[b]. */
static kg_status_t capture(cuda_ctx_t *ctx, int b, int32_t rows) {
    cudaGraph_t graph = NULL;
    KG_CUDA_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    const kg_status_t st = run_step(ctx, rows, rows);
    const cudaError_t err = cudaStreamEndCapture(ctx->stream, &graph);
    if (st != KG_OK || err != cudaSuccess) {
        if (err != cudaSuccess) {
            KG_LOG_ERROR("cuda", "cudaStreamEndCapture failed: %s", cudaGetErrorString(err));
        }
        if (graph) {
            cudaGraphDestroy(graph);
        }
        return KG_ERR_BACKEND;
    }
    const cudaError_t ierr = cudaGraphInstantiate(&ctx->graphs[b], graph, 0);
    cudaGraphDestroy(graph);
    KG_CUDA_CHECK(ierr);
    KG_LOG_DEBUG("cuda", "captured the decode graph for %d rows", rows);
    return KG_OK;
}

/* The device part of a step, inputs already packed for `cap` slots. */
static kg_status_t
device_step(cuda_ctx_t *ctx, int32_t cap, int bucket, int32_t n_out, size_t n_ints, float *logits) {
    KG_CUDA_CHECK(cudaMemcpyAsync(ctx->d_in, ctx->h_in, n_ints * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KG_CUDA_CHECK(cudaEventRecord(ctx->ev_in, ctx->stream));
    if (bucket >= 0) {
        if (!ctx->graphs[bucket]) {
            KG_TRY(capture(ctx, bucket, cap));
        }
        KG_CUDA_CHECK(cudaGraphLaunch(ctx->graphs[bucket], ctx->stream));
    } else {
        KG_TRY(run_step(ctx, cap, n_out));
    }
    if (logits && n_out > 0) {
        KG_CUDA_CHECK(cudaMemcpyAsync(logits, ctx->logits,
                                      (size_t)n_out * (size_t)ctx->hp.n_vocab * sizeof(float),
                                      cudaMemcpyDeviceToHost, ctx->stream));
    }
    if (logits) {
        KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    }
    return KG_OK;
}

static kg_status_t mark_dead(cuda_ctx_t *ctx) {
    if (!ctx->dead) {
        KG_LOG_ERROR("cuda", "device error: the CUDA backend is dead, every later call fails");
    }
    ctx->dead = true;
    return KG_ERR_BACKEND;
}

static kg_status_t cuda_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    const int32_t T = batch->n_tokens, n_out = batch->n_outputs;
    if (T <= 0 || T > ctx->max_tokens) {
        KG_LOG_ERROR("cuda", "step of %d tokens (max %d)", T, ctx->max_tokens);
        return KG_ERR_INVALID;
    }
    if (n_out < 0 || n_out > ctx->out_cap) {
        KG_LOG_ERROR("cuda", "step wants %d logits rows (max %d; KGEN_CUDA_MAX_OUTPUTS)", n_out,
                     ctx->out_cap);
        return KG_ERR_INVALID;
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        cudaEventSynchronize(ctx->ev_in) != cudaSuccess) {
        return mark_dead(ctx); /* the pinned inputs may still be in flight */
    }
    /* a decode-only step runs as the graph of its bucket */
    int bucket = -1;
    int32_t cap = T;
    if (ctx->use_graphs && n_out == T) {
        int32_t b = 1;
        int i = 0;
        while (b < T) {
            b <<= 1;
            i++;
        }
        if (i < N_BUCKETS && b <= ctx->max_tokens && b <= ctx->out_cap) {
            bucket = i;
            cap = b;
        }
    }
    size_t n_ints = 0;
    const kg_status_t st = pack_inputs(ctx, batch, cap, &n_ints);
    if (st != KG_OK) {
        return st;
    }
    if (device_step(ctx, cap, bucket, n_out, n_ints, logits) != KG_OK) {
        return mark_dead(ctx);
    }
    ctx->last_n_outputs = n_out;
    return KG_OK;
}

static kg_status_t
cuda_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    if (n < 0 || n > ctx->last_n_outputs) {
        KG_LOG_ERROR("cuda", "sample of %d rows, the last step produced %d", n,
                     ctx->last_n_outputs);
        return KG_ERR_INVALID;
    }
    if (n == 0) {
        return KG_OK;
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        kg_cuda_bias_apply(&ctx->bias, ctx->stream, ctx->logits, ctx->hp.n_vocab, reqs, n) !=
            KG_OK ||
        kg_cuda_sampler_run(&ctx->sampler, ctx->stream, ctx->logits, reqs, n, out) != KG_OK) {
        return mark_dead(ctx);
    }
    ctx->last_n_outputs = 0; /* the rows are consumed */
    return KG_OK;
}

/* KV blocks for the n choices of one prompt (kv_copy.cu). */
static kg_status_t
cuda_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
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
    const size_t block = (size_t)ctx->block_size * (size_t)ctx->hp.n_head_kv * ctx->hp.head_dim;
    if (cudaSetDevice(ctx->device) != cudaSuccess ||
        kg_cuda_kv_copy(ctx->stream, ctx->kv, ctx->kv_layer_elems, 2 * ctx->hp.n_layer, block, src,
                        dst, n) != KG_OK) {
        return mark_dead(ctx);
    }
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
        for (int i = 0; i < N_BUCKETS; i++) {
            if (ctx->graphs[i]) {
                cudaGraphExecDestroy(ctx->graphs[i]);
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
            }
            free(ctx->layers);
        }
        if (ctx->head.data != ctx->emb.data) {
            free_mat(&ctx->head);
        }
        free_mat(&ctx->emb);
        cudaFree(ctx->out_norm);
        cudaFree(ctx->rope_freqs);
        cudaFree(ctx->kv);
        void *bufs[] = {ctx->x,     ctx->qkv,    ctx->tmp,  ctx->gu,     ctx->rope_cs,
                        ctx->split, ctx->logits, ctx->q16,  ctx->xn,     ctx->att,
                        ctx->h,     ctx->xo,     ctx->d_in, ctx->blas_ws};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            cudaFree(bufs[i]);
        }
        cudaFreeHost(ctx->h_in);
        if (ctx->ev_in) {
            cudaEventDestroy(ctx->ev_in);
        }
        if (ctx->sampler_ready) {
            kg_cuda_sampler_clear(&ctx->sampler);
        }
        kg_cuda_bias_clear(&ctx->bias);
        kg_cuda_blas_clear(&ctx->blas);
        if (ctx->stream) {
            cudaStreamDestroy(ctx->stream);
        }
        free(ctx->hash_seq);
        free(ctx->hash_idx);
        free(ctx->dist_seq);
        free(ctx->dist_max_pos);
        free(ctx->dist_off);
        free(ctx->dist_slot);
        free(ctx->tok_dist);
        free(ctx);
    }
    free(be);
}

static void cuda_memory(const kg_backend_t *be, kg_backend_memory_t *out) {
    const cuda_ctx_t *ctx = (const cuda_ctx_t *)be->ctx;
    out->weights_size = ctx->weights_size;
    out->kv_size = ctx->kv_size;
    out->scratch_size = ctx->scratch_size;
}

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : def;
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
    if (!be || !ctx) {
        free(be);
        free(ctx);
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        return NULL;
    }
    be->iface = cuda_iface;
    be->ctx = ctx;
    be->sample = cuda_sample;
    be->kv_copy = cuda_kv_copy;
    ctx->model = model;
    ctx->hp = *hp;
    ctx->n_kv_blocks = params->n_kv_blocks;
    ctx->block_size = params->kv_block_size;
    ctx->max_tokens = params->max_batch_tokens;
    if (ctx->n_kv_blocks <= 0 || ctx->block_size <= 0 || ctx->max_tokens <= 0) {
        snprintf(errstr, errstr_size,
                 "cuda backend: KV blocks, block size and batch tokens must be > 0");
        goto fail;
    }
    if (hp->head_dim % 2 != 0 || hp->head_dim > 256 || hp->n_rot % 2 != 0 ||
        hp->n_rot > hp->head_dim || hp->n_head % hp->n_head_kv != 0) {
        snprintf(errstr, errstr_size,
                 "cuda backend: unsupported attention shape (head_dim %d, n_rot %d, heads %d/%d; "
                 "head_dim must be even and <= 256)",
                 hp->head_dim, hp->n_rot, hp->n_head, hp->n_head_kv);
        goto fail;
    }
    ctx->out_cap = env_int("KGEN_CUDA_MAX_OUTPUTS", MAX_OUTPUTS);
    ctx->out_cap = ctx->out_cap < 1 ? 1 : ctx->out_cap;
    ctx->out_cap = ctx->out_cap > ctx->max_tokens ? ctx->max_tokens : ctx->out_cap;
    {
        int64_t cap = (int64_t)ctx->n_kv_blocks * 4 + (int64_t)ctx->max_tokens * 64;
        ctx->table_cap = (int32_t)(cap > (1 << 28) ? (1 << 28) : cap < 65536 ? 65536 : cap);
    }
    ctx->use_graphs = env_int("KGEN_CUDA_GRAPHS", 1) != 0;

    err = cudaSetDevice(ctx->device);
    if (err == cudaSuccess) {
        err = cudaGetDeviceProperties(&prop, ctx->device);
    }
    if (err != cudaSuccess) {
        snprintf(errstr, errstr_size, "cuda backend: no usable device: %s",
                 cudaGetErrorString(err));
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
    if (err == cudaSuccess) {
        err = cudaMalloc(&ctx->blas_ws, BLAS_WORKSPACE);
    }
    if (err != cudaSuccess) {
        snprintf(errstr, errstr_size, "cuda backend: %s", cudaGetErrorString(err));
        goto fail;
    }
    if (kg_cuda_blas_init(&ctx->blas, ctx->stream, ctx->blas_ws, BLAS_WORKSPACE, errstr,
                          errstr_size) != KG_OK) {
        if (errstr[0] == '\0') {
            snprintf(errstr, errstr_size, "cuda backend: cuBLAS setup failed (see the log)");
        }
        goto fail;
    }

    ctx->layers = (cuda_layer_t *)calloc((size_t)hp->n_layer, sizeof(*ctx->layers));
    if (!ctx->layers) {
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        goto fail;
    }
    if (upload_weights(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: uploading the weights failed (%zu MiB so far; see the log)",
                 ctx->weights_size >> 20);
        goto fail;
    }
    if (alloc_buffers(ctx) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: allocating the KV pool (%zu MiB) and buffers failed (see the log)",
                 ctx->kv_size >> 20);
        goto fail;
    }
    KG_LOG_INFO("cuda",
                "backend ready device=\"%s\" sm=%d weights_mib=%zu kv_mib=%zu scratch_mib=%zu "
                "graphs=%d cublas=%s",
                prop.name, ctx->n_sm, ctx->weights_size >> 20, ctx->kv_size >> 20,
                ctx->scratch_size >> 20, ctx->use_graphs ? 1 : 0, ctx->blas.api->lib_name);
    return be;
fail:
    cuda_free(be);
    return NULL;
}
