/* cpu_deltanet: Qwen3.5's gated DeltaNet layer (see the header). */
#include "cpu_deltanet.h"

#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_ops.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cpu_deltanet_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    cpu_deltanet_layer_t *dn = calloc(1, sizeof(*dn));
    L->dn = dn;
    const size_t n = (size_t)src->ssm_conv1d->ne[0] * (size_t)src->ssm_conv1d->ne[1];
    if (!dn || !(dn->conv = malloc(n * sizeof(float)))) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    kg_dequantize(src->ssm_conv1d->type, src->ssm_conv1d->data, dn->conv, (int64_t)n);
    ctx->weights_size += n * sizeof(float);
    const kg_gguf_tensor_t *ts[] = {src->ssm_in,    src->ssm_gate, src->ssm_beta,
                                    src->ssm_alpha, src->ssm_ba,   src->ssm_out,
                                    src->ssm_dt_b,  src->ssm_a,    src->ssm_norm};
    cpu_weight_t *ws[] = {&dn->qkv, &dn->z,    &dn->beta, &dn->alpha, &dn->ba,
                          &dn->out, &dn->dt_b, &dn->a,    &dn->norm};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
        if (ts[i] && !cpu_weight_init(ws[i], ts[i], ctx, errstr, errstr_size)) {
            return false;
        }
    }
    return true;
}

void cpu_deltanet_layer_clear(cpu_layer_t *L) {
    cpu_deltanet_layer_t *dn = L->dn;
    if (!dn) {
        return;
    }
    cpu_weight_t *ws[] = {&dn->qkv, &dn->z,    &dn->beta, &dn->alpha, &dn->ba,
                          &dn->out, &dn->dt_b, &dn->a,    &dn->norm};
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
        free(ws[i]->owned);
        cpu_gemm_clear(&ws[i]->packed);
    }
    free(dn->conv);
    free(dn);
    L->dn = NULL;
}

/* Conv channels: q and k (K heads x d_state each), then v (d_inner). */
static int64_t channels(const kg_hparams_t *hp) {
    return 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
}

int64_t cpu_deltanet_scratch_floats(const kg_hparams_t *hp, int64_t T) {
    /* qkv (channels), z and o (d_inner each), beta and g (V heads each) */
    return T * (channels(hp) + 2 * (int64_t)hp->ssm_d_inner + 2 * (int64_t)hp->ssm_dt_rank);
}

typedef struct dn_job {
    const cpu_ctx_t *ctx;
    const kg_step_batch_t *batch;
    const cpu_deltanet_layer_t *dn;
    float *states;
    int64_t per_slot, off;
    float *qkv, *z, *o, *beta, *g; /* the step's rows */
    int64_t n_chunks;
} dn_job_t;

/* The convolution and SiLU of channels [c0, c1) of every token, in batch
 * order (position order within a slot), in place in qkv: the window is
 * the slot's d_conv - 1 previous inputs, then the token's (ggml_ssm_conv:
 * one float sum, ascending). */
static void conv_task(void *arg, int64_t w, int thread) {
    (void)thread;
    const dn_job_t *j = arg;
    const kg_hparams_t *hp = &j->ctx->hp;
    const int64_t CH = channels(hp), K = hp->ssm_d_conv, T = j->batch->n_tokens;
    const int64_t c0 = CH * w / j->n_chunks, c1 = CH * (w + 1) / j->n_chunks;
    for (int64_t t = 0; t < T; t++) {
        float *row = j->qkv + t * CH;
        float *st = j->states + (int64_t)j->batch->seq[t] * j->per_slot + j->off;
        for (int64_t c = c0; c < c1; c++) {
            float *win = st + c * (K - 1); /* oldest first */
            const float *k = j->dn->conv + c * K;
            row[c] = kg_silu(kg_conv_step(win, k, K, row[c]));
        }
    }
}

/* The delta rule's two passes over one row m of a head's matrix, each a
 * dot product in eight running sums (lane l takes the elements i = l mod
 * 8, the tail lane 0; then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 +
 * s7))): the AVX2 form below is that order exactly (no fused multiply-add,
 * as the scalar one has none), so both give the same bits. */
static float lanes_sum(const float s[8]) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* m *= eg, then m . k */
static float decay_dot(float *m, float eg, const float *k, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    const __m256 e = _mm256_set1_ps(eg);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(m + i), e);
        _mm256_storeu_ps(m + i, x);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, _mm256_loadu_ps(k + i)));
    }
    _mm256_storeu_ps(s, acc);
#else
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) {
            m[i + l] *= eg;
            s[l] += m[i + l] * k[i + l];
        }
    }
#endif
    for (; i < n; i++) {
        m[i] *= eg;
        s[0] += m[i] * k[i];
    }
    return lanes_sum(s);
}

/* m += k * d, then m . q */
static float update_dot(float *m, const float *k, float d, const float *q, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    const __m256 dd = _mm256_set1_ps(d);
    for (; i + 8 <= n; i += 8) {
        const __m256 x =
            _mm256_add_ps(_mm256_loadu_ps(m + i), _mm256_mul_ps(_mm256_loadu_ps(k + i), dd));
        _mm256_storeu_ps(m + i, x);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, _mm256_loadu_ps(q + i)));
    }
    _mm256_storeu_ps(s, acc);
#else
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) {
            m[i + l] += k[i + l] * d;
            s[l] += m[i + l] * q[i + l];
        }
    }
#endif
    for (; i < n; i++) {
        m[i] += k[i] * d;
        s[0] += m[i] * q[i];
    }
    return lanes_sum(s);
}

/* The delta rule of V heads [h0, h1) over every token in batch order, then
 * each head's gated RMSNorm: o = rmsnorm(S^T q / sqrt(d)) * ssm_norm *
 * silu(z). The state is stored as ggml_gated_delta_net keeps it: row j of
 * a head's matrix is column j of S (the weights of value j). */
static void delta_task(void *arg, int64_t w, int thread) {
    (void)thread;
    const dn_job_t *j = arg;
    const kg_hparams_t *hp = &j->ctx->hp;
    const int64_t S = hp->ssm_d_state, HV = hp->ssm_dt_rank, HK = hp->ssm_n_group;
    const int64_t CH = channels(hp), VD = hp->ssm_d_inner, T = j->batch->n_tokens;
    const int64_t conv_floats = (int64_t)(hp->ssm_d_conv - 1) * CH;
    const int64_t h0 = HV * w / j->n_chunks, h1 = HV * (w + 1) / j->n_chunks;
    const float scale = 1.0f / sqrtf((float)S);
    for (int64_t t = 0; t < T; t++) {
        const float *row = j->qkv + t * CH;
        float *st = j->states + (int64_t)j->batch->seq[t] * j->per_slot + j->off + conv_floats;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t kh = hp->ssm_v_grouped ? h / (HV / HK) : h % HK;
            const float *q = row + kh * S;
            const float *k = row + HK * S + kh * S;
            const float *v = row + 2 * HK * S + h * S;
            const float b = j->beta[t * HV + h], eg = expf(j->g[t * HV + h]);
            float *M = st + h * S * S;
            float *o = j->o + t * VD + h * S;
            /* one pass per row of M (value r's weights): a row's decay,
             * delta, update and output read that row alone, so this is
             * ggml_gated_delta_net's whole-matrix order, row by row */
            for (int64_t r = 0; r < S; r++) {
                float *m = M + r * S;
                const float delta = (v[r] - decay_dot(m, eg, k, S)) * b;
                o[r] = update_dot(m, k, delta, q, S) * scale;
            }
            /* build_norm_gated: rms_norm * ssm_norm, times silu(z) */
            cpu_rmsnorm_rows(o, j->dn->norm.data, o, 1, S, hp->norm_eps);
            const float *z = j->z + t * VD + h * S;
            for (int64_t r = 0; r < S; r++) {
                o[r] *= kg_silu(z[r]);
            }
        }
    }
}

void cpu_deltanet_mixer(cpu_ctx_t *ctx,
                        int32_t il,
                        const kg_step_batch_t *batch,
                        float *states,
                        int64_t per_slot,
                        int64_t off,
                        float *scratch) {
    const kg_hparams_t *hp = &ctx->hp;
    const cpu_deltanet_layer_t *dn = ctx->layers[il].dn;
    const int64_t T = batch->n_tokens, CH = channels(hp), VD = hp->ssm_d_inner;
    const int64_t S = hp->ssm_d_state, HV = hp->ssm_dt_rank, HK = hp->ssm_n_group;
    dn_job_t job = {.ctx = ctx,
                    .batch = batch,
                    .dn = dn,
                    .states = states,
                    .per_slot = per_slot,
                    .off = off,
                    .qkv = scratch,
                    .z = scratch + T * CH,
                    .o = scratch + T * (CH + VD),
                    .beta = scratch + T * (CH + 2 * VD),
                    .g = scratch + T * (CH + 2 * VD + HV)};
    /* the projections: qkv_mixed, z, beta, alpha (build_qkvz, ssm_beta,
     * ssm_alpha) */
    const bool fused = dn->ba.n_out > 0;
    const cpu_weight_t *ws[4] = {&dn->qkv, &dn->z, fused ? &dn->ba : &dn->beta, &dn->alpha};
    /* qwen3next's ssm_ba into o (free until the delta rule; d_inner >=
     * 2 V heads), then parted per K head: r betas, then r alphas */
    float *const outs[4] = {job.qkv, job.z, fused ? job.o : job.beta, job.g};
    cpu_matmul_n(ctx, fused ? 3 : 4, ws, ctx->xn, outs, T);
    for (int64_t t = 0; fused && t < T; t++) {
        const int64_t r = HV / HK;
        for (int64_t h = 0; h < HV; h++) {
            const float *ba = job.o + t * 2 * HV + (h / r) * 2 * r;
            job.beta[t * HV + h] = ba[h % r];
            job.g[t * HV + h] = ba[r + h % r];
        }
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < HV; h++) {
            float *b = job.beta + t * HV + h, *g = job.g + t * HV + h;
            *b = 1.0f / (1.0f + expf(-*b)); /* ggml_sigmoid */
            /* ggml_softplus (x above 20: x) of alpha + dt bias, times ssm_a
             * (-exp(A_log), stored negated) */
            const float x = *g + dn->dt_b.data[h];
            *g = (x > 20.0f ? x : logf(1.0f + expf(x))) * dn->a.data[h];
        }
    }
    int64_t n_chunks = (int64_t)ctx->n_threads * 4;
    job.n_chunks = n_chunks > CH ? CH : n_chunks;
    kg_pool_run(ctx->pool, job.n_chunks, conv_task, &job);
    /* q and k L2-normed per K head (build_gdn_l2_norm: rms_norm with eps /
     * n, then times 1 / sqrt(n)) */
    const float l2_scale = 1.0f / sqrtf((float)S);
    for (int64_t t = 0; t < T; t++) {
        float *qk = job.qkv + t * CH;
        cpu_rmsnorm_rows(qk, NULL, qk, 2 * HK, S, hp->norm_eps / (float)S);
        for (int64_t i = 0; i < 2 * HK * S; i++) {
            qk[i] *= l2_scale;
        }
    }
    job.n_chunks = (int64_t)ctx->n_threads > HV ? HV : (int64_t)ctx->n_threads;
    if (T * HV * S * S < 65536) { /* waking the pool costs microseconds */
        const int64_t n = job.n_chunks;
        job.n_chunks = 1;
        delta_task(&job, 0, 0);
        job.n_chunks = n;
    } else {
        kg_pool_run(ctx->pool, job.n_chunks, delta_task, &job);
    }
    const cpu_weight_t *o[1] = {&dn->out};
    float *const oo[1] = {ctx->tmp};
    cpu_matmul_n(ctx, 1, o, job.o, oo, T);
}
