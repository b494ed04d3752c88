/* cpu_bert: the CPU backend's forward pass for the `bert` and `nomic-bert`
 * encoders (kg_model_bert.h), which embedding and rerank jobs run.
 *
 * DESIGN
 * A bert step is whole inputs: every token attends to every token of its
 * own input, before and after it (llama.cpp's no-cache, non-causal
 * attention), so an input's tokens must all be in the step, contiguous and
 * in position order from 0; a step that would make one attend causally
 * (an input cut into chunks) is refused, not computed wrong. The engine
 * schedules bert inputs whole (kg_engine_params_t.non_causal). Nothing is
 * kept between steps: no KV cache is allocated.
 *
 * Per step, as llama.cpp's graph: x = tok_embd[token] + token_types[0] +
 * position_embd[pos]; x = LN(x) (ggml_norm: a double sum for the mean and
 * the variance, then * w + b); per layer: Q/K/V GEMMs + biases, attention
 * over the input's own rows with ggml-cpu's flash attention arithmetic (K
 * and V cast to fp16; under 64 tokens its one-chunk kernel with q in fp16
 * and an fp16 accumulator, from 64 its tiled one in F32: see
 * BERT_FA_TILE; matching it, not only its rounding of K and V, is what
 * brings Q8_0 scores onto llama.cpp's, whose activations round to Q8
 * blocks at every matmul and carry any difference on), output GEMM + bias,
 * x = LN(x + attn); up GEMM + bias, GELU (ggml's fp16 table), down GEMM +
 * bias, x = LN(x + ffn). The hidden rows asked for are the last layer's
 * output (bert has no output norm). Each row's arithmetic does not depend
 * on what else is in the step, so an input's vector is the same alone or
 * among others.
 *
 * nomic-bert, the same graph in llama.cpp, differs in three places: no
 * position rows are added (x = tok_embd[token] + token_types[0]); q and k
 * are rotated (ggml_rope_ext, NeoX pairs) after their biases and before
 * the fp16 rounding, with angles for positions 0..max_tokens-1 made once
 * at init (an input's positions start at 0 in every step); and the FFN is
 * gate and up GEMMs, silu(gate) * up, down, without biases. */
#include "cpu_bert.h"

#include "../../core/kg_log.h"
#include "../../model/kg_model_bert.h"
#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_expf.h"
#include "cpu_ops.h"
#include "cpu_rows.h"

#include <math.h>
#include <stdio.h>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define BERT_F16C 1
#endif
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#define BERT_AVX2 1 /* the attention's vector paths: the scalar loops' bits */
#endif
#include <stdlib.h>
#include <string.h>

/* llama.cpp runs bert's attention as ggml_flash_attn_ext with K and V
 * cast to fp16, and ggml-cpu computes it one of two ways by how many
 * queries the ubatch has (GGML_FA_TILE_Q, 64): a ubatch of one input
 * (node-llama-cpp embeds one at a time) takes the first under 64 tokens
 * and the second from 64. kgen goes by the input's own length, so an
 * input's arithmetic stays its own (batch invariance). */
#define BERT_FA_TILE 64

struct cpu_bert {
    cpu_weight_t tok_norm, tok_norm_b;
    float *type_row;      /* (n_embd) token type 0's row, or NULL */
    cpu_weight_t *ln1_b;  /* (n_layer) attn_output_norm.bias */
    cpu_weight_t *ln2_b;  /* (n_layer) layer_output_norm.bias */
    cpu_weight_t *up_b;   /* (n_layer) or data NULL */
    cpu_weight_t *down_b; /* (n_layer) or data NULL */
    float *kt; /* (T, n_embd) this layer's K (fp16 values) by dimension, for the attention's
                  eight-keys-at-once scores: an input of n rows from batch row s keeps its
                  (n_embd, n) block at s * n_embd; V is rounded in place */
    int32_t *run_start;  /* (T) the batch index of the token's input's first token */
    int32_t *run_len;    /* (T) its input's length */
    bool nomic;          /* nomic-bert: RoPE, SwiGLU, no position rows */
    float *rope_cs;      /* nomic-bert: (max_tokens, n_rot) cos | sin of position p */
    float *attn_scratch; /* (n_threads, 2 * head_dim + 64) the attention's per-thread scratch */
};

/* y = (x - mean) / sqrt(var + eps) * w + b for n_rows rows (ggml_norm,
 * then build_norm's ggml_mul and ggml_add). x and y may alias. */
static void layernorm_rows(const float *x,
                           const float *w,
                           const float *b,
                           float *y,
                           int64_t n_rows,
                           int64_t n,
                           float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            sum += (double)xr[i];
        }
        const float mean = (float)sum / (float)n;
        double sum2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float d = xr[i] - mean;
            yr[i] = d;
            sum2 += (double)(d * d);
        }
        const float variance = (float)(sum2 / (double)n);
        const float scale = 1.0f / sqrtf(variance + eps);
        for (int64_t i = 0; i < n; i++) {
            yr[i] = yr[i] * scale * w[i] + b[i];
        }
    }
}

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

static float *bert_scratch(cpu_ctx_t *ctx, size_t n, bool *ok) {
    float *p = calloc(n ? n : 1, sizeof(float));
    *ok = *ok && p;
    ctx->scratch_size += n * sizeof(float);
    return p;
}

bool cpu_bert_init(cpu_ctx_t *ctx, char *errstr, size_t errstr_size) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    const struct kg_bert_weights *bw = model->bert;
    const int32_t NL = hp->n_layer;
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    struct cpu_bert *b = calloc(1, sizeof(*b));
    ctx->bert = b;
    ctx->layers = calloc((size_t)NL, sizeof(*ctx->layers));
    if (!b || !ctx->layers) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    b->ln1_b = calloc((size_t)NL, sizeof(*b->ln1_b));
    b->ln2_b = calloc((size_t)NL, sizeof(*b->ln2_b));
    b->up_b = calloc((size_t)NL, sizeof(*b->up_b));
    b->down_b = calloc((size_t)NL, sizeof(*b->down_b));
    if (!b->ln1_b || !b->ln2_b || !b->up_b || !b->down_b) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    for (int32_t il = 0; il < NL; il++) {
        const kg_layer_weights_t *src = &model->layers[il];
        const kg_bert_layer_t *bl = &bw->layers[il];
        cpu_layer_t *L = &ctx->layers[il];
        const kg_gguf_tensor_t *srcs[] = {src->wq,
                                          src->wk,
                                          src->wv,
                                          src->wo,
                                          src->w_up,
                                          src->w_down,
                                          src->w_gate,
                                          src->bq,
                                          src->bk,
                                          src->bv,
                                          src->bo,
                                          bl->attn_out_norm,
                                          bl->layer_out_norm,
                                          bl->attn_out_norm_b,
                                          bl->layer_out_norm_b,
                                          bl->ffn_up_b,
                                          bl->ffn_down_b};
        cpu_weight_t *dsts[] = {
            &L->wq,       &L->wk,        &L->wv,        &L->wo,       &L->w_up,      &L->w_down,
            &L->w_gate,   &L->bq,        &L->bk,        &L->bv,       &L->bo,        &L->attn_norm,
            &L->ffn_norm, &b->ln1_b[il], &b->ln2_b[il], &b->up_b[il], &b->down_b[il]};
        for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); i++) {
            if (srcs[i] && !cpu_weight_init(dsts[i], srcs[i], ctx, errstr, errstr_size)) {
                return false;
            }
        }
    }
    if (!cpu_weight_init(&b->tok_norm, bw->tok_norm, ctx, errstr, errstr_size) ||
        !cpu_weight_init(&b->tok_norm_b, bw->tok_norm_b, ctx, errstr, errstr_size)) {
        return false;
    }
    b->nomic = hp->arch == KG_ARCH_NOMIC_BERT;
    bool ok = true;
    if (!b->nomic) {
        ctx->gelu_table = malloc(65536 * sizeof(uint16_t));
        ok = ctx->gelu_table != NULL;
        if (ok) {
            cpu_gelu_table_init(ctx->gelu_table);
        }
    } else {
        ctx->gate = bert_scratch(ctx, T * F, &ok);
        b->rope_cs = bert_scratch(ctx, T * (size_t)hp->n_rot, &ok);
        if (b->rope_cs) {
            /* llama_context's cparams: no YaRN ramp unless rope.scaling.type
             * says yarn (then ext_factor 1 over ggml_rope_yarn_corr_dims) */
            float corr[2];
            kg_rope_yarn_corr_dims(hp->n_rot, hp->n_ctx_orig, hp->rope_base, hp->yarn_beta_fast,
                                   hp->yarn_beta_slow, corr);
            for (size_t p = 0; p < T; p++) {
                float *cs = b->rope_cs + p * (size_t)hp->n_rot;
                kg_rope_cache_yarn((int32_t)p, hp->n_rot, hp->rope_base, hp->rope_scale, NULL,
                                   hp->yarn_ext_factor, hp->yarn_attn_factor, corr, cs,
                                   cs + hp->n_rot / 2);
            }
        }
    }
    if (bw->type_embd) {
        b->type_row = bert_scratch(ctx, E, &ok);
        if (b->type_row) {
            kg_dequantize(bw->type_embd->type, bw->type_embd->data, b->type_row, (int64_t)E);
        }
    }
    const size_t widest = E > F ? E : F;
    ctx->x = bert_scratch(ctx, T * E, &ok);
    ctx->xn = bert_scratch(ctx, T * E, &ok);
    ctx->xr = bert_scratch(ctx, T * widest, &ok);
    ctx->q = bert_scratch(ctx, T * E, &ok);
    ctx->k = bert_scratch(ctx, T * E, &ok);
    ctx->v = bert_scratch(ctx, T * E, &ok);
    ctx->att = bert_scratch(ctx, T * E, &ok);
    ctx->up = bert_scratch(ctx, T * F, &ok);
    ctx->tmp = bert_scratch(ctx, T * E, &ok);
    b->attn_scratch =
        bert_scratch(ctx, (size_t)ctx->n_threads * (2 * (size_t)hp->head_dim + T), &ok);
    /* T and E are > 0 (the backend checks max_tokens, the model n_embd) */
    b->kt = bert_scratch(ctx, T * E, &ok);
    b->run_start = calloc(T, sizeof(int32_t));
    b->run_len = calloc(T, sizeof(int32_t));
    ok = ok && b->run_start && b->run_len;
    ctx->scratch_size += 2 * T * sizeof(int32_t);
    ok = ok && cpu_qact_init(&ctx->qact, (int64_t)T, (int64_t)widest);
    ctx->scratch_size += cpu_qact_size((int64_t)T, (int64_t)widest);
    ctx->qscratch = ok ? cpu_qgemm_scratch_new(ctx->n_threads, (int64_t)widest) : NULL;
    ok = ok && ctx->qscratch;
    if (!ok) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory for scratch buffers");
        return false;
    }
    ctx->scratch_size += cpu_qgemm_scratch_size(ctx->qscratch);
    return true;
}

void cpu_bert_free(cpu_ctx_t *ctx) {
    struct cpu_bert *b = ctx->bert;
    if (!b) {
        return;
    }
    cpu_weight_t *vecs[] = {b->ln1_b, b->ln2_b, b->up_b, b->down_b};
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
        for (int32_t il = 0; vecs[i] && il < ctx->hp.n_layer; il++) {
            free(vecs[i][il].owned); /* vectors: nothing packed */
        }
        free(vecs[i]);
    }
    free(b->tok_norm.owned);
    free(b->tok_norm_b.owned);
    free(b->type_row);
    free(b->rope_cs);
    free(b->attn_scratch);
    free(b->kt);
    free(b->run_start);
    free(b->run_len);
    free(b);
    ctx->bert = NULL;
}

/* Every input whole: a run of one sequence's tokens at positions 0, 1,
 * ..., n-1, and no sequence in two runs. Fills run_start and run_len. */
static bool whole_inputs(const cpu_ctx_t *ctx, const kg_step_batch_t *batch) {
    struct cpu_bert *b = ctx->bert;
    const int32_t T = batch->n_tokens;
    for (int32_t t = 0; t < T;) {
        const int32_t seq = batch->seq[t];
        int32_t n = 0;
        while (t + n < T && batch->seq[t + n] == seq && batch->pos[t + n] == n) {
            n++;
        }
        if (n == 0) {
            KG_LOG_ERROR("cpu",
                         "bert: token %d (seq %d pos %d) is not part of a whole input "
                         "(an encoder attends both ways: inputs come whole, from "
                         "position 0)",
                         t, seq, batch->pos[t]);
            return false;
        }
        for (int32_t u = 0; u < t; u++) {
            if (batch->seq[u] == seq) {
                KG_LOG_ERROR("cpu", "bert: seq %d comes twice in one step", seq);
                return false;
            }
        }
        for (int32_t k = 0; k < n; k++) {
            b->run_start[t + k] = t;
            b->run_len[t + k] = n;
        }
        t += n;
    }
    return true;
}

/* fp16 rounding of 8 floats (to nearest even, as ggml's casts) */
#ifdef BERT_AVX2
static inline __m256 round_h8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

static inline float round_h(float x) {
    return kg_fp16_to_fp32(kg_fp32_to_fp16(x));
}

#ifdef BERT_AVX2
/* The attention's inner loops with several independent chains in
 * registers: each lane is still one element's chain in the scalar loop's
 * order, so the bits are the scalar loops', only the FMA latency is hidden
 * (one chain of 8 keys ran at one FMA per 4 cycles). */
#define BERT_X8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* sc[p] = (q · kt[., p]) * scale for keys p0 .. p0+nt-1 (nt <= 64): each
 * key's FMA chain over d in order, 8 keys per register, G registers (G 4
 * or 8, >= nt / 8) side by side; the lanes past nt are loaded masked (no
 * read past the keys) and their scores, zeros, are written but not used. */
static inline __attribute__((always_inline)) void scores_tile(const float *q,
                                                              const float *kt,
                                                              int64_t kt_stride,
                                                              int32_t p0,
                                                              int32_t nt,
                                                              int32_t hd,
                                                              float scale,
                                                              float *sc,
                                                              const int G) {
    __m256i mk[8];
    for (int i = 0; i < 8; i++) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        mk[i] = _mm256_cmpgt_epi32(_mm256_set1_epi32(nt - 8 * i), lane);
    }
    const bool full = nt == 8 * G;
#define BERT_S_DECL(i) __m256 a##i = _mm256_setzero_ps();
#define BERT_S_FMA(i)                                                                              \
    if ((i) < G) {                                                                                 \
        const __m256 k = full ? _mm256_loadu_ps(kr + 8 * (int64_t)(i))                             \
                              : _mm256_maskload_ps(kr + 8 * (int64_t)(i), mk[i]);                  \
        a##i = _mm256_fmadd_ps(k, qd, a##i);                                                       \
    }
#define BERT_S_STORE(i)                                                                            \
    if ((i) < G) {                                                                                 \
        _mm256_storeu_ps(sc + 8 * (int64_t)(i), _mm256_mul_ps(a##i, sv));                          \
    }
    BERT_X8(BERT_S_DECL)
    for (int32_t d = 0; d < hd; d++) {
        const float *kr = kt + d * kt_stride + p0;
        const __m256 qd = _mm256_set1_ps(q[d]);
        BERT_X8(BERT_S_FMA)
    }
    const __m256 sv = _mm256_set1_ps(scale);
    BERT_X8(BERT_S_STORE)
#undef BERT_S_DECL
#undef BERT_S_FMA
#undef BERT_S_STORE
}

/* out[0..63] = fma(v[p][.], sc[p], out) for p = 0 .. nt-1 in order, the 64
 * accumulators in 8 registers (through memory, each step waited on a
 * store and a reload). */
static inline void vacc64(float *out, const float *v, int64_t stride, const float *sc, int32_t nt) {
#define BERT_V_DECL(i)  __m256 o##i = _mm256_loadu_ps(out + 8 * (int64_t)(i));
#define BERT_V_FMA(i)   o##i = _mm256_fmadd_ps(_mm256_loadu_ps(vr + 8 * (int64_t)(i)), w, o##i);
#define BERT_V_STORE(i) _mm256_storeu_ps(out + 8 * (int64_t)(i), o##i);
    BERT_X8(BERT_V_DECL)
    for (int32_t p = 0; p < nt; p++) {
        const float *vr = v + (int64_t)p * stride;
        const __m256 w = _mm256_set1_ps(sc[p]);
        BERT_X8(BERT_V_FMA)
    }
    BERT_X8(BERT_V_STORE)
#undef BERT_V_DECL
#undef BERT_V_FMA
#undef BERT_V_STORE
}

/* The one-chunk kernel's fp16 accumulator over keys 0 .. n-1 for dims
 * out[0..63], in 8 registers: per key, scaled by ms[p] and rounded when
 * the maximum moved, then the value row added by FMA and rounded, as
 * ggml_vec_scale_f16 and ggml_vec_mad_f16 do in memory. */
static inline void
vacc64_h(float *out, const float *v, int64_t stride, const float *ms, const float *vs, int32_t n) {
#define BERT_H_DECL(i)  __m256 o##i = _mm256_loadu_ps(out + 8 * (int64_t)(i));
#define BERT_H_SCALE(i) o##i = round_h8(_mm256_mul_ps(o##i, msv));
#define BERT_H_FMA(i)                                                                              \
    o##i = round_h8(_mm256_fmadd_ps(_mm256_loadu_ps(vr + 8 * (int64_t)(i)), vsv, o##i));
#define BERT_H_STORE(i) _mm256_storeu_ps(out + 8 * (int64_t)(i), o##i);
    BERT_X8(BERT_H_DECL)
    for (int32_t p = 0; p < n; p++) {
        const float *vr = v + (int64_t)p * stride;
        if (ms[p] != 1.0f) {
            const __m256 msv = _mm256_set1_ps(ms[p]);
            BERT_X8(BERT_H_SCALE)
        }
        const __m256 vsv = _mm256_set1_ps(vs[p]);
        BERT_X8(BERT_H_FMA)
    }
    BERT_X8(BERT_H_STORE)
#undef BERT_H_DECL
#undef BERT_H_SCALE
#undef BERT_H_FMA
#undef BERT_H_STORE
}

/* The one-chunk kernel's scores for keys p .. p+31 (qh already fp16
 * values): each an fp16 · fp16 product summed in double in d order, four
 * groups of eight keys side by side. */
static inline void
scores32_f64(const float *qh, const float *kt, int64_t kt_stride, int32_t p, int32_t hd, float *s) {
#define BERT_X4(X)     X(0) X(1) X(2) X(3)
#define BERT_D_DECL(i) __m256d l##i = _mm256_setzero_pd(), h##i = _mm256_setzero_pd();
#define BERT_D_ADD(i)                                                                              \
    {                                                                                              \
        const __m256 pr = _mm256_mul_ps(_mm256_loadu_ps(kr + 8 * (int64_t)(i)), qd);               \
        l##i = _mm256_add_pd(l##i, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));                   \
        h##i = _mm256_add_pd(h##i, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));                 \
    }
#define BERT_D_STORE(i)                                                                            \
    _mm_storeu_ps(s + p + 8 * (int64_t)(i), _mm256_cvtpd_ps(l##i));                                \
    _mm_storeu_ps(s + p + 8 * (int64_t)(i) + 4, _mm256_cvtpd_ps(h##i));
    BERT_X4(BERT_D_DECL)
    for (int32_t d = 0; d < hd; d++) {
        const float *kr = kt + d * kt_stride + p;
        const __m256 qd = _mm256_set1_ps(qh[d]);
        BERT_X4(BERT_D_ADD)
    }
    BERT_X4(BERT_D_STORE)
#undef BERT_D_DECL
#undef BERT_D_ADD
#undef BERT_D_STORE
#undef BERT_X4
}
#endif

/* ggml's flash_attn_ext_f16_one_chunk for one query row: q converted to
 * fp16, each score an fp16 · fp16 dot product summed in double (ggml's
 * order for heads under 32 wide, the products summed one by one), then the
 * online softmax in float whose V accumulator is fp16, rounded at every
 * step (ggml_vec_scale_f16 on a new maximum, ggml_vec_mad_f16 for the
 * row); the output the accumulator over the sum. kt: the input's keys by
 * head dimension (kt[d * kt_stride + p]); v: its value rows. qh and acc:
 * hd floats of scratch each, s: n. */
static void attn_one_chunk(const float *q,
                           const float *kt,
                           int64_t kt_stride,
                           const float *v,
                           int64_t stride,
                           int32_t n,
                           int32_t hd,
                           float scale,
                           float *qh,
                           float *acc,
                           float *s) {
    for (int32_t d = 0; d < hd; d++) {
        qh[d] = round_h(q[d]);
        acc[d] = 0.0f;
    }
    int32_t p = 0;
#ifdef BERT_AVX2
    for (; p + 32 <= n; p += 32) {
        scores32_f64(qh, kt, kt_stride, p, hd, s);
    }
    for (; p + 8 <= n; p += 8) { /* eight keys' sums side by side, each in order */
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 pr =
                _mm256_mul_ps(_mm256_loadu_ps(kt + d * kt_stride + p), _mm256_set1_ps(qh[d]));
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
        }
        _mm_storeu_ps(s + p, _mm256_cvtpd_ps(lo));
        _mm_storeu_ps(s + p + 4, _mm256_cvtpd_ps(hi));
    }
#endif
    for (; p < n; p++) {
        double dot = 0.0;
        for (int32_t d = 0; d < hd; d++) {
            dot += (double)(qh[d] * kt[d * kt_stride + p]);
        }
        s[p] = (float)dot;
    }
    /* the online softmax's factors first (they depend on the scores
     * only), then the accumulator in registers; n < BERT_FA_TILE here */
    float M = -INFINITY, S = 0.0f, ms_p[BERT_FA_TILE], vs_p[BERT_FA_TILE];
    for (p = 0; p < n; p++) {
        const float sc = s[p] * scale, m_old = M;
        float ms = 1.0f, vs = 1.0f;
        if (sc > M) {
            M = sc;
            ms = expf(m_old - M);
        } else {
            vs = expf(sc - M);
        }
        ms_p[p] = ms;
        vs_p[p] = vs;
        S = S * ms + vs;
    }
    int32_t d0 = 0;
#ifdef BERT_AVX2
    for (; d0 + 64 <= hd; d0 += 64) {
        vacc64_h(acc + d0, v + d0, stride, ms_p, vs_p, n);
    }
#endif
    for (p = 0; p < n && d0 < hd; p++) {
        const float *vr = v + (int64_t)p * stride;
        const float ms = ms_p[p], vs = vs_p[p];
        int32_t d = d0;
#ifdef BERT_AVX2
        const __m256 msv = _mm256_set1_ps(ms), vsv = _mm256_set1_ps(vs);
        for (; d + 8 <= hd; d += 8) {
            __m256 a = _mm256_loadu_ps(acc + d);
            if (ms != 1.0f) {
                a = round_h8(_mm256_mul_ps(a, msv));
            }
            _mm256_storeu_ps(acc + d, round_h8(_mm256_fmadd_ps(_mm256_loadu_ps(vr + d), vsv, a)));
        }
#endif
        for (; d < hd; d++) {
            const float a = ms != 1.0f ? round_h(acc[d] * ms) : acc[d];
            acc[d] = round_h(fmaf(vr[d], vs, a));
        }
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hd; d++) {
        acc[d] *= inv;
    }
}

/* ggml's flash_attn_ext_tiled for one query row: q in F32, the keys and
 * values (fp16) in tiles of 64; a score is one FMA chain over the head,
 * then scaled; per tile the running maximum moves (the F32 accumulator and
 * the sum scaled by expf of the step), the tile's exponentials and their
 * sum are ggml_vec_soft_max_f32's in its AVX2 form (cpu_softmax8_sum: what a
 * llama.cpp built for AVX2 computes, bit for bit; its AVX-512 build rounds
 * the exponentials a little differently), and each value row is added to
 * the accumulator by FMA in position order; the output the accumulator
 * over the sum. kt, v as for attn_one_chunk; sc: 64 floats of scratch. */
static void attn_tiled(const float *q,
                       const float *kt,
                       int64_t kt_stride,
                       const float *v,
                       int64_t stride,
                       int32_t n,
                       int32_t hd,
                       float scale,
                       float *sc,
                       float *out) {
    float M = -INFINITY, S = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        out[d] = 0.0f;
    }
    for (int32_t p0 = 0; p0 < n; p0 += BERT_FA_TILE) {
        const int32_t nt = n - p0 < BERT_FA_TILE ? n - p0 : BERT_FA_TILE;
        int32_t p = 0;
#ifdef BERT_AVX2
        if (nt > 32) {
            scores_tile(q, kt, kt_stride, p0, nt, hd, scale, sc, 8);
        } else {
            scores_tile(q, kt, kt_stride, p0, nt, hd, scale, sc, 4);
        }
        p = nt;
#endif
        for (; p < nt; p++) {
            float a = 0.0f;
            for (int32_t d = 0; d < hd; d++) {
                a = fmaf(kt[d * kt_stride + p0 + p], q[d], a);
            }
            sc[p] = a * scale;
        }
        float tile_max = -INFINITY;
        for (p = 0; p < nt; p++) {
            tile_max = sc[p] > tile_max ? sc[p] : tile_max;
        }
        const float m_new = fmaxf(M, tile_max);
        if (m_new > M) {
            const float ms = expf(M - m_new);
            cpu_vec_scale_f32(out, hd, ms);
            S *= ms;
        }
        M = m_new;
        const int32_t nt8 = (nt + 7) / 8 * 8;
        for (p = nt; p < nt8; p++) {
            sc[p] = -INFINITY;
        }
        S = (float)((double)S + cpu_softmax8_sum(sc, nt8, M));
        int32_t d0 = 0;
#ifdef BERT_AVX2
        for (; d0 + 64 <= hd; d0 += 64) {
            vacc64(out + d0, v + (int64_t)p0 * stride + d0, stride, sc, nt);
        }
#endif
        for (p = 0; p < nt && d0 < hd; p++) {
            const float *vr = v + (int64_t)(p0 + p) * stride;
            int32_t d = d0;
#ifdef BERT_AVX2
            const __m256 w = _mm256_set1_ps(sc[p]);
            for (; d + 8 <= hd; d += 8) {
                _mm256_storeu_ps(
                    out + d, _mm256_fmadd_ps(_mm256_loadu_ps(vr + d), w, _mm256_loadu_ps(out + d)));
            }
#endif
            for (; d < hd; d++) {
                out[d] = fmaf(vr[d], sc[p], out[d]);
            }
        }
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hd; d++) {
        out[d] *= inv;
    }
}

typedef struct bert_attn_job {
    cpu_ctx_t *ctx;
} bert_attn_job_t;

/* One (token, head): softmax(q · K / sqrt(hd)) · V over the token's input,
 * with the arithmetic of ggml's flash attention for an input of its length. */
static void bert_attn_task(void *arg, int64_t w, int thread) {
    const bert_attn_job_t *job = arg;
    cpu_ctx_t *ctx = job->ctx;
    const struct cpu_bert *b = ctx->bert;
    const int32_t H = ctx->hp.n_head, hd = ctx->hp.head_dim;
    const int64_t E = ctx->hp.n_embd, T = ctx->max_tokens;
    const int64_t t = w / H;
    const int32_t h = (int32_t)(w % H);
    const int32_t start = b->run_start[t], n = b->run_len[t];
    const float *q = ctx->q + t * E + (int64_t)h * hd;
    const float *kt = b->kt + (int64_t)start * E + (int64_t)h * hd * n;
    const float *v = ctx->v + (int64_t)start * E + (int64_t)h * hd;
    float *out = ctx->att + t * E + (int64_t)h * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *s = b->attn_scratch + (int64_t)thread * (2 * (int64_t)hd + T);
    if (n < BERT_FA_TILE) {
        attn_one_chunk(q, kt, n, v, E, n, hd, scale, s, s + hd, s + 2 * (int64_t)hd);
        memcpy(out, s + hd, (size_t)hd * sizeof(float));
    } else {
        attn_tiled(q, kt, n, v, E, n, hd, scale, s, out);
    }
}

/* The elementwise work between the GEMMs, by chunks of rows on the pool
 * (each row's arithmetic is its own, so the chunking changes no bits). */
typedef enum rows_stage {
    ROWS_QKV,      /* Q/K/V biases; q rounded to fp16, K and V stored as fp16 */
    ROWS_ATTN_OUT, /* x = LN(attn_out + bias + x) */
    ROWS_GELU,     /* up = gelu(up + bias) */
    ROWS_SWIGLU,   /* up = silu(gate) * up (nomic-bert) */
    ROWS_FFN_OUT,  /* x = LN(down + bias + x) */
} rows_stage_t;

/* RoPE on n rows (every head) of x, the first of them batch row t0: row
 * t is position t - run_start[t] of its input (whole inputs from 0). NeoX
 * pairs (i, i + n_rot/2) of each head's first n_rot dims, as ggml_rope_ext
 * with LLAMA_ROPE_TYPE_NEOX; the rest of a head passes through. */
static void
rope_rows(const cpu_ctx_t *ctx, float *x, int64_t n, const int32_t *run_start, int64_t t0) {
    const struct cpu_bert *b = ctx->bert;
    const int32_t H = ctx->hp.n_head, hd = ctx->hp.head_dim, R = ctx->hp.n_rot, half = R / 2;
    for (int64_t r = 0; r < n; r++) {
        const float *cs = b->rope_cs + (t0 + r - run_start[r]) * R;
        for (int32_t h = 0; h < H; h++) {
            float *row = x + (r * H + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                kg_rope_pair(&row[i], &row[i + half], cs[i], cs[half + i]);
            }
        }
    }
}

typedef struct rows_job {
    int32_t il;
    rows_stage_t stage;
} rows_job_t;

/* A stage on batch rows [t0, t0 + n) (a cpu_rows_fn). */
static void rows_stage(cpu_ctx_t *ctx, const void *arg, int64_t t0, int64_t n) {
    const rows_job_t *job = arg;
    struct cpu_bert *b = ctx->bert;
    const cpu_layer_t *L = &ctx->layers[job->il];
    const int64_t E = ctx->hp.n_embd, F = ctx->hp.n_ff;
    const float eps = ctx->hp.norm_eps;
    switch (job->stage) {
    case ROWS_QKV:
        add_bias(ctx->q + t0 * E, &L->bq, n, E);
        add_bias(ctx->k + t0 * E, &L->bk, n, E);
        add_bias(ctx->v + t0 * E, &L->bv, n, E);
        if (b->nomic) {
            rope_rows(ctx, ctx->q + t0 * E, n, b->run_start + t0, t0);
            rope_rows(ctx, ctx->k + t0 * E, n, b->run_start + t0, t0);
        }
        /* flash attention casts K and V to fp16 (q: by the path, below);
         * K goes by dimension for the scores */
        cpu_round_fp16(ctx->k + t0 * E, n * E);
        cpu_round_fp16(ctx->v + t0 * E, n * E);
        for (int64_t r = 0; r < n; r++) {
            const int64_t t = t0 + r, start = b->run_start[t], len = b->run_len[t];
            float *kt = b->kt + start * E + (t - start);
            for (int64_t i = 0; i < E; i++) {
                kt[i * len] = ctx->k[t * E + i];
            }
        }
        break;
    case ROWS_ATTN_OUT:
    case ROWS_FFN_OUT: {
        const bool attn = job->stage == ROWS_ATTN_OUT;
        float *y = ctx->tmp + t0 * E;
        const float *x = ctx->x + t0 * E;
        add_bias(y, attn ? &L->bo : &b->down_b[job->il], n, E);
        for (int64_t i = 0; i < n * E; i++) {
            y[i] = y[i] + x[i];
        }
        layernorm_rows(y, attn ? L->attn_norm.data : L->ffn_norm.data,
                       attn ? b->ln1_b[job->il].data : b->ln2_b[job->il].data, ctx->x + t0 * E, n,
                       E, eps);
        break;
    }
    case ROWS_SWIGLU: {
        /* ggml_swiglu_split(gate, up) */
        float *u = ctx->up + t0 * F;
        const float *g = ctx->gate + t0 * F;
        for (int64_t i = 0; i < n * F; i++) {
            u[i] = kg_silu(g[i]) * u[i];
        }
        break;
    }
    case ROWS_GELU: {
        float *u = ctx->up + t0 * F;
        add_bias(u, &b->up_b[job->il], n, F);
        int64_t i = 0;
#ifdef BERT_F16C
        /* the same rounding (to nearest even) as kg_fp32_to_fp16, 8 at a time */
        for (; i + 8 <= n * F; i += 8) {
            const __m256 v = _mm256_loadu_ps(u + i);
            uint16_t h[8] __attribute__((aligned(16)));
            _mm_store_si128((__m128i *)(void *)h, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
            for (int k = 0; k < 8; k++) {
                h[k] = ctx->gelu_table[h[k]];
            }
            const __m256 g = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)h));
            const __m256 lo = _mm256_cmp_ps(v, _mm256_set1_ps(-10.0f), _CMP_LE_OQ);
            const __m256 hi = _mm256_cmp_ps(v, _mm256_set1_ps(10.0f), _CMP_GE_OQ);
            __m256 r = _mm256_blendv_ps(g, v, hi);
            r = _mm256_blendv_ps(r, _mm256_setzero_ps(), lo);
            _mm256_storeu_ps(u + i, r);
        }
#endif
        for (; i < n * F; i++) { /* ggml_vec_gelu_f32 with its fp16 table */
            const float v = u[i];
            u[i] = v <= -10.0f  ? 0.0f
                   : v >= 10.0f ? v
                                : kg_fp16_to_fp32(ctx->gelu_table[kg_fp32_to_fp16(v)]);
        }
        break;
    }
    }
}

static void rows_run(cpu_ctx_t *ctx, int32_t il, rows_stage_t stage, int64_t T) {
    const rows_job_t job = {.il = il, .stage = stage};
    cpu_rows_run(ctx, T, rows_stage, &job);
}

kg_status_t cpu_bert_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    (void)logits;
    cpu_ctx_t *ctx = be->ctx;
    struct cpu_bert *b = ctx->bert;
    const kg_hparams_t *hp = &ctx->hp;
    const kg_model_t *model = ctx->model;
    const int64_t T = batch->n_tokens, E = hp->n_embd;
    if (T <= 0 || T > ctx->max_tokens) {
        KG_LOG_ERROR("cpu", "step of %lld tokens (max %d)", (long long)T, ctx->max_tokens);
        return KG_ERR_INVALID;
    }
    if (batch->n_outputs > 0) {
        KG_LOG_ERROR("cpu", "bert has no LM head: a step asked for %d logits rows",
                     batch->n_outputs);
        return KG_ERR_UNSUPPORTED;
    }
    for (int64_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], pos = batch->pos[t], seq = batch->seq[t];
        if (tok < 0 || tok >= hp->n_vocab || pos < 0 || pos >= hp->n_ctx_train || seq < 0 ||
            seq >= batch->n_slots) {
            KG_LOG_ERROR("cpu", "bad batch entry %lld: token %d pos %d seq %d", (long long)t, tok,
                         pos, seq);
            return KG_ERR_INVALID;
        }
    }
    if (!whole_inputs(ctx, batch)) {
        return KG_ERR_INVALID;
    }
    /* embeddings: token + type 0 (+ position for bert) (ggml_get_rows,
     * ggml_add), LN */
    const struct kg_bert_weights *bw = model->bert;
    const kg_gguf_tensor_t *emb = model->tok_embd, *pe = bw->pos_embd;
    const size_t row_size = kg_type_row_size(emb->type, E);
    const size_t pos_row_size = pe ? kg_type_row_size(pe->type, E) : 0;
    for (int64_t t = 0; t < T; t++) {
        float *x = ctx->x + t * E, *p = ctx->xn + t * E;
        kg_dequantize(emb->type, (const char *)emb->data + (size_t)batch->token[t] * row_size, x,
                      E);
        if (pe) {
            kg_dequantize(pe->type, (const char *)pe->data + (size_t)batch->pos[t] * pos_row_size,
                          p, E);
        }
        for (int64_t i = 0; i < E; i++) {
            const float tt = b->type_row ? x[i] + b->type_row[i] : x[i];
            x[i] = pe ? p[i] + tt : tt;
        }
    }
    layernorm_rows(ctx->x, b->tok_norm.data, b->tok_norm_b.data, ctx->x, T, E, hp->norm_eps);

    const bert_attn_job_t job = {.ctx = ctx};
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cpu_layer_t *L = &ctx->layers[il];
        const cpu_weight_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[3] = {ctx->q, ctx->k, ctx->v};
        cpu_matmul_n(ctx, 3, qkv, ctx->x, qkv_out, T);
        rows_run(ctx, il, ROWS_QKV, T);
        if (T * hp->n_head >= 64) {
            kg_pool_run(ctx->pool, T * hp->n_head, bert_attn_task, (void *)&job);
        } else {
            for (int64_t w = 0; w < T * hp->n_head; w++) {
                bert_attn_task((void *)&job, w, 0);
            }
        }
        const cpu_weight_t *wo = &L->wo;
        float *const o_out[1] = {ctx->tmp};
        cpu_matmul_n(ctx, 1, &wo, ctx->att, o_out, T);
        rows_run(ctx, il, ROWS_ATTN_OUT, T);

        const cpu_weight_t *down = &L->w_down;
        if (b->nomic) {
            const cpu_weight_t *gate_up[2] = {&L->w_gate, &L->w_up};
            float *const gu_out[2] = {ctx->gate, ctx->up};
            cpu_matmul_n(ctx, 2, gate_up, ctx->x, gu_out, T);
            rows_run(ctx, il, ROWS_SWIGLU, T);
        } else {
            const cpu_weight_t *up = &L->w_up;
            float *const up_out[1] = {ctx->up};
            cpu_matmul_n(ctx, 1, &up, ctx->x, up_out, T);
            rows_run(ctx, il, ROWS_GELU, T);
        }
        float *const down_out[1] = {ctx->tmp};
        cpu_matmul_n(ctx, 1, &down, ctx->up, down_out, T);
        rows_run(ctx, il, ROWS_FFN_OUT, T);
    }

    if (batch->want_hidden) {
        int64_t n_hid = 0;
        for (int64_t t = 0; t < T; t++) {
            if (batch->want_hidden[t]) {
                if (n_hid == batch->n_hidden) {
                    break;
                }
                memcpy(batch->hidden + n_hid * E, ctx->x + t * E, (size_t)E * sizeof(float));
                n_hid++;
            }
        }
        if (n_hid != batch->n_hidden) {
            KG_LOG_ERROR("cpu", "batch says %d hidden rows, want_hidden has more or fewer",
                         batch->n_hidden);
            return KG_ERR_INVALID;
        }
    }
    return KG_OK;
}
