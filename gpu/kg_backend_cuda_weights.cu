/* kg_backend_cuda_weights: the CUDA backend's weights: which device type
 * each GGUF type becomes (the type table), the host-side conversion, and
 * the upload, staged through pinned memory, of every layer's matrices and
 * vectors.
 *
 * DESIGN
 * Weights. Uploaded once at start. Per layer, Q|K|V are fused into one
 * (n_q + 2 n_kv, n_embd) matrix and gate|up into one (2 n_ff, n_embd)
 * matrix, so a step runs 4 GEMMs per layer. A matrix is stored BF16 unless
 * all its parts are F16 (kept F16) or F32 (kept F32: tiny test models and
 * exact parity with the CPU backend, which computes those in F32). A
 * matrix only kg_cuda_gemm, moe.cu or an embedding gather reads keeps its
 * GGUF blocks when its type has a native kernel (qblocks.cuh: the file's
 * bytes; parts of different types as segments); the other quantized
 * matrices (routers, deepseek2's per-head latent matrices, bert's
 * embeddings, Gemma 4's experts, types without a kernel) are dequantized
 * with kg_dequantize on the host and converted to BF16. The activation
 * entering a GEMM is written in the weight's type by the kernel that
 * produces it, as the CPU backend rounds activations to the weight type
 * (BF16 for blocks). Norm weights are F32. A tied head reuses the
 * embedding matrix. */
#include "kg_backend_cuda_int.cuh"
#include "qblocks.cuh"

#include <string.h>

extern "C" {
#include "../src/model/kg_model_bert.h"
}

// ---- weights ----

kg_cuda_dtype_t kg_cuda_weight_dtype(kg_ggml_type_t type) {
    switch (type) {
    case KG_GGML_TYPE_F32:
        return KG_CUDA_F32;
    case KG_GGML_TYPE_F16:
        return KG_CUDA_F16;
    default:
        return KG_CUDA_BF16;
    }
}

void kg_cuda_weight_convert(
    kg_ggml_type_t type, const void *src, int64_t n, kg_cuda_dtype_t dt, void *dst, float *f32) {
    const bool same = (dt == KG_CUDA_F32 && type == KG_GGML_TYPE_F32) ||
                      (dt == KG_CUDA_F16 && type == KG_GGML_TYPE_F16) ||
                      (dt == KG_CUDA_BF16 && type == KG_GGML_TYPE_BF16);
    if (same) {
        memcpy(dst, src, (size_t)n * kg_cuda_dtype_size(dt));
        return;
    }
    kg_dequantize(type, src, f32, n);
    if (dt == KG_CUDA_F32) {
        memcpy(dst, f32, (size_t)n * 4);
        return;
    }
    uint16_t *o = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) {
        o[i] = dt == KG_CUDA_F16 ? kg_fp32_to_fp16(f32[i]) : kg_fp32_to_bf16(f32[i]);
    }
}

/* One matrix from parts of one type keeps that type's kg_cuda_weight_dtype;
 * parts of different types meet in BF16. */
static kg_cuda_dtype_t pick_dtype(const kg_gguf_tensor_t *const *parts, int n) {
    for (int i = 1; i < n; i++) {
        if (parts[i]->type != parts[0]->type) {
            return KG_CUDA_BF16;
        }
    }
    return kg_cuda_weight_dtype(parts[0]->type);
}

/* Staging for uploads: two pinned buffers so the conversion of one chunk
 * overlaps the copy of the previous one. */
struct stage {
    void *buf[2];
    cudaEvent_t ev[2];
    float *f32; /* host scratch for dequantized rows */
    int cur;
};

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

/* Rows of a weight: ne[1] * ne[2] * ... (an expert tensor's matrices are
 * stacked: expert e's rows follow expert e - 1's). */
static int64_t tensor_rows(const kg_gguf_tensor_t *t) {
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) {
        rows *= t->ne[d];
    }
    return rows;
}

/* Whether the upload can convert t's type: F32 and F16 as they are, every
 * other type kg_dequantize reads (the CPU backend's dequantizer, so every
 * type kgen loads: kg_gguf refuses the others) dequantized into BF16. A
 * type that kg_quant does not describe is refused, the message naming the
 * tensor and the type. */
kg_status_t cuda_check_type(const kg_gguf_tensor_t *t, char *errstr, size_t errstr_size) {
    if (kg_type_block_size(t->type) != 0 && kg_type_block_elems(t->type) > 0 &&
        t->ne[0] % kg_type_block_elems(t->type) == 0) {
        return KG_OK;
    }
    const char *name = kg_ggml_type_name(t->type);
    snprintf(errstr, errstr_size,
             "cuda backend: tensor '%.*s' has type %s (%d), which the CUDA backend cannot "
             "convert (it runs the types kgen's dequantizer reads, as GGUF blocks or in BF16)",
             (int)t->name.len, t->name.data, name && name[0] != '?' ? name : "unknown",
             (int)t->type);
    KG_LOG_ERROR("cuda", "%s", errstr);
    return KG_ERR_UNSUPPORTED;
}

/* Rows [r0, r0 + n_rows) of tensor t, of a native type, into rows from
 * dst_row of the native matrix m: bodies and tails split in the staging
 * buffer, each copied to its array. */
static kg_status_t upload_rows_native(cuda_ctx_t *ctx,
                                      stage_t *s,
                                      const kg_gguf_tensor_t *t,
                                      int64_t r0,
                                      int64_t n_rows,
                                      const kg_cuda_mat_t *m,
                                      int64_t dst_row) {
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(m->qtype);
    const int64_t nb = m->n_in / L.elems; /* blocks a row */
    const size_t src_row = kg_type_row_size(t->type, m->n_in);
    const int64_t per_chunk =
        (int64_t)(STAGE_SIZE / src_row) > 0 ? (int64_t)(STAGE_SIZE / src_row) : 1;
    char *bodies = (char *)m->data;
    char *tails = bodies + (size_t)m->n_out * (size_t)nb * (size_t)L.body;
    for (int64_t r = 0; r < n_rows; r += per_chunk) {
        const int64_t nr = n_rows - r < per_chunk ? n_rows - r : per_chunk;
        const int64_t blocks = nr * nb, first = (dst_row + r) * nb;
        char *buf = (char *)s->buf[s->cur];
        KG_CUDA_CHECK(cudaEventSynchronize(s->ev[s->cur])); /* its previous copy is done */
        kg_cuda_qsplit(m->qtype, (const char *)t->data + (size_t)(r0 + r) * src_row, blocks, buf,
                       buf + (size_t)blocks * (size_t)L.body);
        KG_CUDA_CHECK(cudaMemcpyAsync(bodies + (size_t)first * (size_t)L.body, buf,
                                      (size_t)blocks * (size_t)L.body, cudaMemcpyHostToDevice,
                                      ctx->stream));
        if (L.tail > 0) {
            KG_CUDA_CHECK(cudaMemcpyAsync(
                tails + (size_t)first * (size_t)L.tail, buf + (size_t)blocks * (size_t)L.body,
                (size_t)blocks * (size_t)L.tail, cudaMemcpyHostToDevice, ctx->stream));
        }
        KG_CUDA_CHECK(cudaEventRecord(s->ev[s->cur], ctx->stream));
        s->cur ^= 1;
    }
    return KG_OK;
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
        kg_cuda_weight_convert(t->type, src, n, dt, buf, s->f32);
        KG_CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)r * (size_t)n_in * es, buf, (size_t)n * es,
                                      cudaMemcpyHostToDevice, ctx->stream));
        KG_CUDA_CHECK(cudaEventRecord(s->ev[s->cur], ctx->stream));
        s->cur ^= 1;
    }
    return KG_OK;
}

/* Rows [r0, r0 + n_rows) of t into m from row dst_row, in m's form (its
 * blocks, or elements of m->dt; a segmented matrix: the segment holding
 * those rows, which come from one part). */
static kg_status_t put_rows(cuda_ctx_t *ctx,
                            stage_t *s,
                            const kg_gguf_tensor_t *t,
                            int64_t r0,
                            int64_t n_rows,
                            const kg_cuda_mat_t *m,
                            int64_t dst_row) {
    for (int i = 0; i < m->n_seg; i++) {
        if (dst_row >= m->seg[i].row0 && dst_row < m->seg[i].row0 + m->seg[i].n_out) {
            const kg_cuda_mat_t seg = kg_cuda_mat_seg(m, i);
            return put_rows(ctx, s, t, r0, n_rows, &seg, dst_row - m->seg[i].row0);
        }
    }
    if (m->qtype != 0) {
        return upload_rows_native(ctx, s, t, r0, n_rows, m, dst_row);
    }
    const size_t row = (size_t)m->n_in * kg_cuda_dtype_size(m->dt);
    return upload_rows(ctx, s, t, r0, n_rows, m->dt, (char *)m->data + (size_t)dst_row * row);
}

/* The rows of a matrix come in runs, each from one tensor: run i has
 * rows[i] rows of GGUF type types[i]. */
typedef struct runs {
    int n;
    int types[KG_CUDA_MAT_SEGS];
    int64_t rows[KG_CUDA_MAT_SEGS];
} runs_t;

static bool is_quantized(int type) {
    return type != KG_GGML_TYPE_F32 && type != KG_GGML_TYPE_F16 && type != KG_GGML_TYPE_BF16;
}

/* m's form for its runs (m->dt and n_in set): a matrix only kg_cuda_gemm
 * reads (gemm), in BF16, with native blocks allowed (the MMA kernels,
 * KGEN_CUDA_NATIVE_QUANT) keeps its runs' blocks: one native type for all,
 * or segments (adjacent runs of one form merged), each native or BF16;
 * anything else is elements of dt. Then allocate it and count it. */
static kg_status_t alloc_mat(cuda_ctx_t *ctx, const runs_t *r, bool gemm, kg_cuda_mat_t *m) {
    m->qtype = 0;
    m->n_seg = 0;
    m->n_out = 0;
    int q[KG_CUDA_MAT_SEGS];
    bool any = false, same = true;
    for (int i = 0; i < r->n; i++) {
        m->n_out += (int32_t)r->rows[i];
        q[i] = kg_cuda_gemm_native(r->types[i], m->n_in) ? r->types[i] : 0;
        any = any || q[i] != 0;
        same = same && q[i] == q[0];
    }
    size_t size = (size_t)m->n_out * (size_t)m->n_in * kg_cuda_dtype_size(m->dt);
    const size_t bf16_row = (size_t)m->n_in * 2;
    if (gemm && ctx->native_q && m->dt == KG_CUDA_BF16 && any) {
        if (same) {
            m->qtype = q[0];
            size = kg_cuda_native_size(q[0], m->n_out, m->n_in);
        } else {
            size = 0;
            for (int i = 0, row0 = 0; i < r->n; row0 += (int32_t)r->rows[i], i++) {
                if (m->n_seg > 0 && m->seg[m->n_seg - 1].qtype == q[i]) {
                    m->seg[m->n_seg - 1].n_out += (int32_t)r->rows[i];
                } else {
                    m->seg[m->n_seg].row0 = row0;
                    m->seg[m->n_seg].n_out = (int32_t)r->rows[i];
                    m->seg[m->n_seg].qtype = q[i];
                    m->seg[m->n_seg].offset = 0;
                    m->n_seg++;
                }
            }
            for (int i = 0; i < m->n_seg; i++) {
                /* each segment 16-byte aligned for its loads (the sizes of
                 * real shapes are multiples already: rows of 8 or 16) */
                size = (size + 15) / 16 * 16;
                m->seg[i].offset = size;
                size += m->seg[i].qtype != 0
                            ? kg_cuda_native_size(m->seg[i].qtype, m->seg[i].n_out, m->n_in)
                            : (size_t)m->seg[i].n_out * bf16_row;
            }
        }
    }
    KG_CUDA_CHECK(cudaMalloc(&m->data, size));
    ctx->weights_size += size;
    for (int i = 0; i < r->n; i++) { /* what the log line says of each run */
        const size_t native = m->qtype != 0 || (m->n_seg > 0 && q[i] != 0)
                                  ? kg_cuda_native_size(q[i], (int32_t)r->rows[i], m->n_in)
                                  : 0;
        if (native > 0) {
            ctx->native_types |= 1ull << (q[i] & 63);
            ctx->native_bytes += native;
        } else if (r->types[i] >= 0 && is_quantized(r->types[i]) && m->dt == KG_CUDA_BF16) {
            ctx->expanded_types |= 1ull << (r->types[i] & 63);
            ctx->expanded_bytes += (size_t)r->rows[i] * bf16_row;
        }
    }
    return KG_OK;
}

/* One device matrix of type dt from the row-concatenation of `parts`
 * (same n_in); gemm: read by kg_cuda_gemm alone, so it may keep native
 * types' blocks. */
static kg_status_t upload_mat_in(cuda_ctx_t *ctx,
                                 stage_t *s,
                                 const kg_gguf_tensor_t *const *parts,
                                 int n_parts,
                                 kg_cuda_dtype_t dt,
                                 bool gemm,
                                 kg_cuda_mat_t *m) {
    runs_t r;
    memset(&r, 0, sizeof(r));
    m->dt = dt;
    m->n_in = (int32_t)parts[0]->ne[0];
    /* more parts than segments (deepseek2's k_b, a part per head): one
     * run, of their type if they share one (else -1: no native form) */
    r.n = n_parts <= KG_CUDA_MAT_SEGS ? n_parts : 1;
    for (int i = 0; i < n_parts; i++) {
        const int k = i < r.n ? i : 0;
        const int type = (int)parts[i]->type;
        r.types[k] = i == k || r.types[k] == type ? type : -1;
        r.rows[k] += tensor_rows(parts[i]);
    }
    KG_TRY(alloc_mat(ctx, &r, gemm, m));
    int64_t row = 0;
    for (int i = 0; i < n_parts; i++) {
        const int64_t rows = tensor_rows(parts[i]);
        KG_TRY(put_rows(ctx, s, parts[i], 0, rows, m, row));
        row += rows;
    }
    return KG_OK;
}

static kg_status_t upload_mat_as(cuda_ctx_t *ctx,
                                 stage_t *s,
                                 const kg_gguf_tensor_t *const *parts,
                                 int n_parts,
                                 kg_cuda_dtype_t dt,
                                 kg_cuda_mat_t *m) {
    return upload_mat_in(ctx, s, parts, n_parts, dt, false, m);
}

/* One device matrix from the row-concatenation of `parts`, in the type
 * pick_dtype gives them. */
static kg_status_t upload_mat(cuda_ctx_t *ctx,
                              stage_t *s,
                              const kg_gguf_tensor_t *const *parts,
                              int n_parts,
                              kg_cuda_mat_t *m) {
    return upload_mat_as(ctx, s, parts, n_parts, pick_dtype(parts, n_parts), m);
}

/* upload_mat for a matrix only kg_cuda_gemm (and embed.cu's gather) reads:
 * projections, FFNs, the head, the token embeddings; a native type keeps
 * its blocks. */
static kg_status_t upload_gemm(cuda_ctx_t *ctx,
                               stage_t *s,
                               const kg_gguf_tensor_t *const *parts,
                               int n_parts,
                               kg_cuda_mat_t *m) {
    return upload_mat_in(ctx, s, parts, n_parts, pick_dtype(parts, n_parts), true, m);
}

/* A small F32 vector from the concatenation of `parts` (norm weights, rope
 * factors, biases; every element of a part, whatever its shape):
 * dequantize and copy. */
static kg_status_t
upload_vec_parts(cuda_ctx_t *ctx, const kg_gguf_tensor_t *const *parts, int n_parts, float **out) {
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) {
        n += parts[i]->ne[0] * tensor_rows(parts[i]);
    }
    float *h = (float *)malloc((size_t)n * sizeof(float));
    if (!h) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int64_t i = 0, off = 0; i < n_parts; i++) {
        const int64_t ni = parts[i]->ne[0] * tensor_rows(parts[i]);
        kg_dequantize(parts[i]->type, parts[i]->data, h + off, ni);
        off += ni;
    }
    cudaError_t err = cudaMalloc((void **)out, (size_t)n * sizeof(float));
    if (err == cudaSuccess) {
        err = cudaMemcpy(*out, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(h);
    KG_CUDA_CHECK(err);
    ctx->weights_size += (size_t)n * sizeof(float);
    return KG_OK;
}

/* upload_vec_parts of one tensor; t NULL leaves *out NULL. */
static kg_status_t upload_vec(cuda_ctx_t *ctx, const kg_gguf_tensor_t *t, float **out) {
    return t ? upload_vec_parts(ctx, &t, 1, out) : KG_OK;
}

kg_status_t cuda_upload_mat(cuda_ctx_t *ctx,
                            stage_t *s,
                            const kg_gguf_tensor_t *const *parts,
                            int n_parts,
                            kg_cuda_mat_t *m) {
    return upload_mat(ctx, s, parts, n_parts, m);
}

kg_status_t cuda_upload_gemm(cuda_ctx_t *ctx,
                             stage_t *s,
                             const kg_gguf_tensor_t *const *parts,
                             int n_parts,
                             kg_cuda_mat_t *m) {
    return upload_gemm(ctx, s, parts, n_parts, m);
}

kg_status_t cuda_upload_vec(cuda_ctx_t *ctx, const kg_gguf_tensor_t *t, float **out) {
    return upload_vec(ctx, t, out);
}

/* The index of layer src's RoPE (base, scale, dims and divisors) in
 * ctx->ropes, added when new (the CPU backend's add_rope); Gemma 4's global
 * layers have their own dims and divisors (rope_freqs, *freqs). */
static kg_status_t add_rope(cuda_ctx_t *ctx, const kg_layer_weights_t *src, int32_t *index) {
    const kg_hparams_t *hp = &ctx->hp;
    const float base = src->rope_base, scale = src->rope_scale;
    for (int32_t r = 0; r < ctx->n_ropes; r++) {
        if (ctx->ropes[r].base == base && ctx->ropes[r].freq_scale == scale &&
            ctx->ropes[r].n_rot == src->n_rot && ctx->ropes[r].freqs_src == src->rope_freqs) {
            *index = r;
            return KG_OK;
        }
    }
    kg_cuda_rope_t *grown =
        (kg_cuda_rope_t *)realloc(ctx->ropes, (size_t)(ctx->n_ropes + 1) * sizeof(*grown));
    if (!grown) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    ctx->ropes = grown;
    kg_cuda_rope_t *r = &ctx->ropes[ctx->n_ropes];
    r->n_rot = src->n_rot;
    r->base = base;
    r->freq_scale = scale;
    r->ext_factor = hp->yarn_ext_factor;
    r->attn_factor = hp->yarn_attn_factor;
    kg_rope_yarn_corr_dims(src->n_rot, hp->n_ctx_orig, base, hp->yarn_beta_fast, hp->yarn_beta_slow,
                           r->corr_dims);
    r->freqs = NULL;
    r->freqs_src = src->rope_freqs;
    *index = ctx->n_ropes++;
    ctx->max_rot = src->n_rot > ctx->max_rot ? src->n_rot : ctx->max_rot;
    return upload_vec(ctx, src->rope_freqs, &r->freqs);
}

kg_status_t cuda_upload_gate_up(cuda_ctx_t *ctx,
                                stage_t *s,
                                const kg_gguf_tensor_t *const *gate,
                                const kg_gguf_tensor_t *const *up,
                                int n_parts,
                                kg_cuda_mat_t *g,
                                kg_cuda_mat_t *u) {
    const int n = gate ? 2 * n_parts : n_parts;
    const kg_gguf_tensor_t **all = (const kg_gguf_tensor_t **)malloc((size_t)n * sizeof(*all));
    if (!all) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int i = 0; i < n_parts; i++) {
        all[i] = up[i];
        if (gate) {
            all[n_parts + i] = gate[i];
        }
    }
    const kg_cuda_dtype_t dt = pick_dtype(all, n);
    free(all);
    if (gate) {
        KG_TRY(upload_mat_in(ctx, s, gate, n_parts, dt, true, g));
    }
    return upload_mat_in(ctx, s, up, n_parts, dt, true, u);
}

/* The router, the experts' stacked matrices (gate and up in one type, so
 * one normed input feeds both) and the expert biases of one layer. */
static kg_status_t
upload_experts(cuda_ctx_t *ctx, stage_t *s, const kg_layer_weights_t *src, cuda_layer_t *L) {
    L->moe = true;
    KG_TRY(upload_mat(ctx, s, &src->ffn_gate_inp, 1, &L->router));
    /* nemotron_h_moe's experts have no gate (up alone) */
    KG_TRY(cuda_upload_gate_up(ctx, s, src->gate_exps ? &src->gate_exps : NULL, &src->up_exps, 1,
                               &L->exp_gate, &L->exp_up));
    KG_TRY(upload_gemm(ctx, s, &src->down_exps, 1, &L->exp_down));
    KG_TRY(upload_vec(ctx, src->ffn_gate_inp_b, &L->router_b));
    KG_TRY(upload_vec(ctx, src->gate_exps_b, &L->exp_gate_b));
    KG_TRY(upload_vec(ctx, src->up_exps_b, &L->exp_up_b));
    KG_TRY(upload_vec(ctx, src->down_exps_b, &L->exp_down_b));
    KG_TRY(upload_vec(ctx, src->exp_probs_b, &L->probs_b));
    if (src->up_shexp) {
        /* the shared expert: gate|up (up alone without a gate:
         * nemotron_h_moe) in the experts' type, so it reads the experts'
         * normed input */
        const kg_gguf_tensor_t *sgu[2] = {src->gate_shexp, src->up_shexp};
        const int n_sgu = src->gate_shexp ? 2 : 1;
        KG_TRY(upload_mat_in(ctx, s, sgu + 2 - n_sgu, n_sgu, L->exp_up.dt, true, &L->wgu));
        KG_TRY(upload_gemm(ctx, s, &src->down_shexp, 1, &L->wdown));
        L->n_ff_shexp = (int32_t)src->up_shexp->ne[1];
        KG_TRY(upload_vec(ctx, src->gate_inp_shexp, &L->shexp_gate));
    }
    return KG_OK;
}

/* qwen35's fused Q|K|V: attn_q holds each head's query then its output
 * gate (hd rows each, head by head); on the device the queries come first,
 * then K and V, then the gates (the step's qkv rows: rope_store reads
 * the first n_q + 2 n_kv, the gate kernel the rest). */
static kg_status_t
upload_gated_qkv(cuda_ctx_t *ctx, stage_t *s, const kg_layer_weights_t *src, kg_cuda_mat_t *m) {
    const kg_hparams_t *hp = &ctx->hp;
    const kg_gguf_tensor_t *parts[3] = {src->wq, src->wk, src->wv};
    const int64_t hd = src->head_dim, n_q = (int64_t)hp->n_head * hd;
    const int64_t n_kv = tensor_rows(src->wk);
    m->dt = pick_dtype(parts, 3);
    m->n_in = (int32_t)src->wq->ne[0];
    const runs_t r = {
        4,
        {(int)src->wq->type, (int)src->wk->type, (int)src->wv->type, (int)src->wq->type},
        {n_q, n_kv, n_kv, n_q}};
    KG_TRY(alloc_mat(ctx, &r, true, m));
    for (int64_t h = 0; h < hp->n_head; h++) {
        KG_TRY(put_rows(ctx, s, src->wq, 2 * h * hd, hd, m, h * hd));
        KG_TRY(put_rows(ctx, s, src->wq, 2 * h * hd + hd, hd, m, n_q + 2 * n_kv + h * hd));
    }
    KG_TRY(put_rows(ctx, s, src->wk, 0, n_kv, m, n_q));
    return put_rows(ctx, s, src->wv, 0, n_kv, m, n_q + n_kv);
}

/* A hybrid's recurrent mixer (recurrent.cuh): its in-projection (the
 * DeltaNet's four, or qwen3next's three, fused into one GEMM: their rows
 * side by side in each token's output), out-projection, and the small F32
 * arrays its kernels read. */
static kg_status_t
upload_recurrent(cuda_ctx_t *ctx, stage_t *s, const kg_layer_weights_t *src, cuda_layer_t *L) {
    switch (src->kind) {
    case KG_LAYER_SHORTCONV:
        KG_TRY(upload_gemm(ctx, s, &src->sc_in_proj, 1, &L->rin));
        KG_TRY(upload_gemm(ctx, s, &src->sc_out_proj, 1, &L->rout));
        return upload_vec(ctx, src->sc_conv, &L->rconv);
    case KG_LAYER_DELTANET: {
        const kg_gguf_tensor_t *sep[4] = {src->ssm_in, src->ssm_gate, src->ssm_beta,
                                          src->ssm_alpha};
        const kg_gguf_tensor_t *fused[3] = {src->ssm_in, src->ssm_gate, src->ssm_ba};
        KG_TRY(src->ssm_ba ? upload_gemm(ctx, s, fused, 3, &L->rin)
                           : upload_gemm(ctx, s, sep, 4, &L->rin));
        KG_TRY(upload_gemm(ctx, s, &src->ssm_out, 1, &L->rout));
        KG_TRY(upload_vec(ctx, src->ssm_conv1d, &L->rconv));
        KG_TRY(upload_vec(ctx, src->ssm_dt_b, &L->dt_b));
        KG_TRY(upload_vec(ctx, src->ssm_a, &L->ssm_a));
        return upload_vec(ctx, src->ssm_norm, &L->ssm_norm);
    }
    case KG_LAYER_MAMBA2:
        KG_TRY(upload_gemm(ctx, s, &src->ssm_in, 1, &L->rin));
        KG_TRY(upload_gemm(ctx, s, &src->ssm_out, 1, &L->rout));
        KG_TRY(upload_vec(ctx, src->ssm_conv1d, &L->rconv));
        KG_TRY(upload_vec(ctx, src->ssm_conv1d_b, &L->conv_b));
        KG_TRY(upload_vec(ctx, src->ssm_dt_b, &L->dt_b));
        KG_TRY(upload_vec(ctx, src->ssm_a, &L->ssm_a));
        KG_TRY(upload_vec(ctx, src->ssm_d, &L->ssm_d));
        return upload_vec(ctx, src->ssm_norm, &L->ssm_norm);
    case KG_LAYER_FFN: /* no mixer */
        return KG_OK;
    case KG_LAYER_ATTN:
        break;
    }
    KG_LOG_ERROR("cuda", "no CUDA kernels for this recurrent layer kind (%d)", (int)src->kind);
    return KG_ERR_UNSUPPORTED;
}

/* deepseek2's latent attention (kg_backend_cuda_mla.cu): attn_q_a (or
 * V2-Lite's attn_q) and attn_kv_a_mqa side by side in wqkv (one GEMM on
 * the normed input), attn_q_b, the norms, and k_b and v_b with one
 * matrix per head stacked (head h's rows after head h - 1's). */
static kg_status_t
upload_mla(cuda_ctx_t *ctx, stage_t *s, const kg_layer_weights_t *src, cuda_layer_t *L) {
    const int32_t H = ctx->hp.n_head;
    const kg_gguf_tensor_t *a[2] = {src->wq_a ? src->wq_a : src->wq, src->wkv_a_mqa};
    KG_TRY(upload_gemm(ctx, s, a, 2, &L->wqkv));
    KG_TRY(upload_gemm(ctx, s, &src->wo, 1, &L->wo));
    if (src->wq_a) {
        KG_TRY(upload_gemm(ctx, s, &src->wq_b, 1, &L->wq_b));
        KG_TRY(upload_vec(ctx, src->q_a_norm, &L->q_a_norm));
    }
    KG_TRY(upload_vec(ctx, src->kv_a_norm, &L->kv_a_norm));
    const kg_gguf_tensor_t **heads = (const kg_gguf_tensor_t **)malloc((size_t)H * sizeof(*heads));
    if (!heads) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    kg_status_t st = KG_OK;
    for (int32_t h = 0; h < H; h++) {
        heads[h] = &src->k_b[h];
    }
    st = upload_mat(ctx, s, heads, H, &L->k_b);
    for (int32_t h = 0; st == KG_OK && h < H; h++) {
        heads[h] = &src->v_b[h];
    }
    if (st == KG_OK) {
        st = upload_mat(ctx, s, heads, H, &L->v_b);
    }
    free(heads);
    return st;
}

/* Everything of layer il. */
static kg_status_t upload_layer(cuda_ctx_t *ctx, stage_t *s, int32_t il) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    cuda_layer_t *L = &ctx->layers[il];
    const kg_gguf_tensor_t *qkv[3] = {src->wq, src->wk, src->wv};
    KG_TRY(upload_vec(ctx, src->attn_norm, &L->attn_norm));
    KG_TRY(upload_vec(ctx, src->ffn_norm, &L->ffn_norm));
    if (src->wkv_a_mqa) {
        KG_TRY(upload_mla(ctx, s, src, L));
    } else if (src->kind == KG_LAYER_ATTN) {
        /* a Gemma 4 shared-KV layer computes its queries alone */
        KG_TRY(ctx->hp.attn_out_gate
                   ? upload_gated_qkv(ctx, s, src, &L->wqkv)
                   : upload_gemm(ctx, s, qkv, src->kv_layer == il ? 3 : 1, &L->wqkv));
        KG_TRY(upload_gemm(ctx, s, &src->wo, 1, &L->wo));
    } else {
        KG_TRY(upload_recurrent(ctx, s, src, L));
    }
    if (src->ffn_gate_inp && ctx->hp.arch != KG_ARCH_GEMMA4) {
        KG_TRY(upload_experts(ctx, s, src, L));
    } else if (src->w_up) {
        /* (Gemma 4's experts beside it: cuda_g4_upload) */ /* (nemotron_h's mixer and attention
                                                               layers have no FFN) */
        /* gate|up fused, or up alone (apertus's ungated xIELU) */
        const kg_gguf_tensor_t *gu[2] = {src->w_gate, src->w_up};
        KG_TRY(src->w_gate ? upload_gemm(ctx, s, gu, 2, &L->wgu)
                           : upload_gemm(ctx, s, &src->w_up, 1, &L->wgu));
        KG_TRY(upload_gemm(ctx, s, &src->w_down, 1, &L->wdown));
    }
    if (src->bq) { /* the model has all three or none */
        const kg_gguf_tensor_t *b[3] = {src->bq, src->bk, src->bv};
        KG_TRY(upload_vec_parts(ctx, b, 3, &L->bqkv));
    }
    KG_TRY(upload_vec(ctx, src->bo, &L->bo));
    KG_TRY(upload_vec(ctx, src->q_norm, &L->q_norm));
    KG_TRY(upload_vec(ctx, src->k_norm, &L->k_norm));
    KG_TRY(upload_vec(ctx, src->attn_post_norm, &L->attn_post_norm));
    KG_TRY(upload_vec(ctx, src->ffn_post_norm, &L->ffn_post_norm));
    KG_TRY(upload_vec(ctx, src->attn_sinks, &L->sinks));
    L->n_swa = src->n_swa > 0 ? src->n_swa : 0;
    if (ctx->bert) { /* its post-norms, with biases, and the FFN's biases */
        const kg_bert_layer_t *bl = &ctx->model->bert->layers[il];
        KG_TRY(upload_vec(ctx, bl->attn_out_norm, &L->attn_norm));
        KG_TRY(upload_vec(ctx, bl->attn_out_norm_b, &L->attn_norm_b));
        KG_TRY(upload_vec(ctx, bl->layer_out_norm, &L->ffn_norm));
        KG_TRY(upload_vec(ctx, bl->layer_out_norm_b, &L->ffn_norm_b));
        KG_TRY(upload_vec(ctx, bl->ffn_up_b, &L->up_b));
        KG_TRY(upload_vec(ctx, bl->ffn_down_b, &L->down_b));
    }
    return add_rope(ctx, src, &L->rope);
}

/* bert's embeddings' parts beside tok_embd: positions and token types
 * dequantized to F32 (added to the token's row before the LayerNorm, as
 * cpu_bert does), the LayerNorm's weight and bias. */
static kg_status_t upload_bert(cuda_ctx_t *ctx) {
    const struct kg_bert_weights *bw = ctx->model->bert;
    KG_TRY(upload_vec(ctx, bw->pos_embd, &ctx->pos_embd));
    KG_TRY(upload_vec(ctx, bw->type_embd, &ctx->type_embd));
    KG_TRY(upload_vec(ctx, bw->tok_norm, &ctx->tok_norm));
    return upload_vec(ctx, bw->tok_norm_b, &ctx->tok_norm_b);
}

kg_status_t cuda_upload_weights(cuda_ctx_t *ctx) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    stage_t s;
    kg_status_t st = stage_init(&s);
    for (int32_t il = 0; st == KG_OK && il < hp->n_layer; il++) {
        st = upload_layer(ctx, &s, il);
    }
    if (st == KG_OK) {
        st = upload_vec(ctx, model->output_norm, &ctx->out_norm);
    }
    if (st == KG_OK) {
        st = upload_vec(ctx, model->output_b, &ctx->out_b);
    }
    if (st == KG_OK) {
        /* embed.cu gathers rows of native blocks too (bert's embedding
         * kernel reads elements) */
        st = ctx->bert ? upload_mat(ctx, &s, &model->tok_embd, 1, &ctx->emb)
                       : upload_gemm(ctx, &s, &model->tok_embd, 1, &ctx->emb);
    }
    if (st == KG_OK) {
        if (model->output == model->tok_embd) {
            ctx->head = ctx->emb;
        } else if (model->output) { /* an encoder has no LM head */
            st = upload_gemm(ctx, &s, &model->output, 1, &ctx->head);
        }
    }
    if (st == KG_OK && ctx->bert) {
        st = upload_bert(ctx);
    }
    if (st == KG_OK) { /* rope_freqs, or LongRoPE's factors for this context */
        st = upload_vec(ctx, kg_model_rope_factors(model, ctx->max_seq_len), &ctx->rope_freqs);
    }
    if (st == KG_OK && hp->arch == KG_ARCH_GEMMA4) {
        st = cuda_g4_upload(ctx, &s);
    }
    if (st == KG_OK && hp->ffn_act == KG_FFN_GELU) {
        uint16_t *table = (uint16_t *)malloc(65536 * sizeof(uint16_t));
        cudaError_t err = cudaErrorMemoryAllocation;
        if (table) {
            kg_cuda_gelu_table_fill(table);
            err = cudaMalloc((void **)&ctx->gelu_table, 65536 * sizeof(uint16_t));
            if (err == cudaSuccess) {
                err = cudaMemcpy(ctx->gelu_table, table, 65536 * sizeof(uint16_t),
                                 cudaMemcpyHostToDevice);
            }
            free(table);
        }
        if (err != cudaSuccess) {
            KG_LOG_ERROR("cuda", "the GELU table: %s", cudaGetErrorName(err));
            st = KG_ERR_BACKEND;
        }
    }
    stage_clear(&s);
    if (st == KG_OK) {
        KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    }
    return st;
}

/* "Q4_K Q6_K" from a type mask */
static void type_names(uint64_t mask, char *out, size_t size) {
    size_t n = 0;
    out[0] = '\0';
    for (int t = 0; t < 64 && n + 1 < size; t++) {
        if (mask >> t & 1) {
            const int w = snprintf(out + n, size - n, "%s%s", n ? " " : "",
                                   kg_ggml_type_name((kg_ggml_type_t)t));
            n += w > 0 ? (size_t)w : 0;
        }
    }
}

void cuda_log_weight_types(const cuda_ctx_t *ctx) {
    char kept[160], expanded[160];
    type_names(ctx->native_types, kept, sizeof(kept));
    type_names(ctx->expanded_types, expanded, sizeof(expanded));
    if (ctx->native_types) {
        KG_LOG_INFO("cuda", "weights: GEMM matrices kept as GGUF blocks: %s, %.1f MiB", kept,
                    (double)ctx->native_bytes / 1048576.0);
    }
    if (ctx->expanded_types) {
        KG_LOG_INFO(
            "cuda", "weights: quantized matrices expanded to BF16 at load: %s, %.1f MiB (%s)",
            expanded, (double)ctx->expanded_bytes / 1048576.0,
            !ctx->native_q ? (ctx->blas.mode == KG_CUDA_GEMM_CUBLAS
                                  ? "cuBLAS GEMMs read no GGUF blocks"
                                  : "native blocks turned off by KGEN_CUDA_NATIVE_QUANT")
                           : "routers, latent heads, encoder embeddings, Gemma 4's experts, or "
                             "a type without a native kernel");
    }
}
