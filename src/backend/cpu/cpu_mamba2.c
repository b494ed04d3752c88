/* cpu_mamba2: the Mamba-2 mixer (see the header). The arithmetic follows
 * ggml's CPU ops: the convolution is one float sum over the window in
 * ascending order (ggml_compute_forward_ssm_conv_f32), then a separate
 * bias add and SiLU; the scan takes softplus with ggml's threshold of 20,
 * dA = expf(dt A) once per head and token, state = s dA + B (x dt) and y
 * as the sum of state C over d_state in ascending order (ggml's scalar
 * form of ggml_compute_forward_ssm_scan_f32; its SIMD form sums in lanes,
 * a rounding apart); the skip is y + x D, then silu(z) y as
 * ggml_swiglu_split; the norm is ggml's rms_norm (kg cpu_rmsnorm_rows) of
 * each group times ssm_norm's row of that group. */
#include "cpu_mamba2.h"

#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shape of the model's Mamba-2 layers. */
typedef struct m2_shape {
    int64_t E, DI, DS, H, G, K; /* n_embd, d_inner, d_state, heads, groups, d_conv */
    int64_t hd, n_conv, n_proj; /* head_dim, conv channels (x, B, C), in_proj's width */
} m2_shape_t;

static m2_shape_t shape_of(const kg_hparams_t *hp) {
    m2_shape_t s = {.E = hp->n_embd,
                    .DI = hp->ssm_d_inner,
                    .DS = hp->ssm_d_state,
                    .H = hp->ssm_dt_rank,
                    .G = hp->ssm_n_group,
                    .K = hp->ssm_d_conv};
    s.hd = s.DI / s.H;
    s.n_conv = s.DI + 2 * s.G * s.DS;
    s.n_proj = s.DI + s.n_conv + s.H;
    return s;
}

/* The F32 arrays of a layer, one block: the kernel (n_conv, K), its bias
 * (n_conv; zeros when the file has none), dt's bias, A, D (H each), the
 * norm (DI). */
typedef struct m2_arrays {
    float *conv, *conv_b, *dt_b, *a, *d, *norm;
} m2_arrays_t;

static int64_t arrays_floats(const m2_shape_t *s) {
    return s->n_conv * s->K + s->n_conv + 3 * s->H + s->DI;
}

static m2_arrays_t arrays_of(float *block, const m2_shape_t *s) {
    m2_arrays_t a;
    a.conv = block;
    a.conv_b = a.conv + s->n_conv * s->K;
    a.dt_b = a.conv_b + s->n_conv;
    a.a = a.dt_b + s->H;
    a.d = a.a + s->H;
    a.norm = a.d + s->H;
    return a;
}

bool cpu_mamba2_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    const m2_shape_t s = shape_of(&ctx->hp);
    if (!cpu_weight_init(&L->ssm_in, src->ssm_in, ctx, errstr, errstr_size) ||
        !cpu_weight_init(&L->ssm_out, src->ssm_out, ctx, errstr, errstr_size)) {
        return false;
    }
    const int64_t n = arrays_floats(&s);
    float *block = calloc((size_t)n, sizeof(float));
    if (!block) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    L->ssm_f32 = block;
    const m2_arrays_t a = arrays_of(block, &s);
    /* the loader checked every shape and that these are F32/F16/BF16 */
    const kg_gguf_tensor_t *from[6] = {src->ssm_conv1d, src->ssm_conv1d_b, src->ssm_dt_b,
                                       src->ssm_a,      src->ssm_d,        src->ssm_norm};
    float *const to[6] = {a.conv, a.conv_b, a.dt_b, a.a, a.d, a.norm};
    const int64_t count[6] = {s.n_conv * s.K, s.n_conv, s.H, s.H, s.H, s.DI};
    for (int i = 0; i < 6; i++) {
        if (from[i]) { /* the convolution's bias is optional: zeros */
            kg_dequantize(from[i]->type, from[i]->data, to[i], count[i]);
        }
    }
    ctx->weights_size += (size_t)n * sizeof(float);
    return true;
}

void cpu_mamba2_layer_clear(cpu_layer_t *L) {
    free(L->ssm_f32);
    L->ssm_f32 = NULL;
}

int64_t cpu_mamba2_scratch_floats(const kg_hparams_t *hp, int64_t T) {
    const m2_shape_t s = shape_of(hp);
    return T * (s.n_proj + s.DI); /* in_proj's rows, then y */
}

typedef struct m2_job {
    const kg_step_batch_t *batch;
    m2_shape_t s;
    m2_arrays_t a;
    float *proj;  /* (T, n_proj): z | xBC | dt; xBC becomes silu(conv(xBC) + b) */
    float *y;     /* (T, DI) the scan's output, times silu(z) */
    float *state; /* slot 0's state of this layer */
    int64_t per_slot;
    int64_t n_chunks;
} m2_job_t;

/* ggml_compute_softplus_f32 */
static inline float softplus(float x) {
    return x > 20.0f ? x : logf(1.0f + expf(x));
}

/* Convolution channels [c0, c1) of every token, in batch order: the window
 * is the slot's K - 1 earlier inputs (oldest first), then the token's. */
static void conv_task(void *arg, int64_t w, int thread) {
    (void)thread;
    const m2_job_t *j = arg;
    const m2_shape_t *s = &j->s;
    const int64_t K = s->K, c0 = s->n_conv * w / j->n_chunks,
                  c1 = s->n_conv * (w + 1) / j->n_chunks;
    for (int64_t t = 0; t < j->batch->n_tokens; t++) {
        float *xbc = j->proj + t * s->n_proj + s->DI;
        float *win0 = j->state + (int64_t)j->batch->seq[t] * j->per_slot;
        for (int64_t c = c0; c < c1; c++) {
            float *win = win0 + c * (K - 1);
            const float *k = j->a.conv + c * K;
            /* ggml_ssm_conv, ggml_add of the bias, then ggml_silu */
            xbc[c] = kg_silu(kg_conv_step(win, k, K, xbc[c]) + j->a.conv_b[c]);
        }
    }
}

/* Heads [h0, h1) of every token, in batch order. */
static void scan_task(void *arg, int64_t w, int thread) {
    (void)thread;
    const m2_job_t *j = arg;
    const m2_shape_t *s = &j->s;
    const int64_t DS = s->DS, hd = s->hd, heads_per_group = s->H / s->G;
    const int64_t h0 = s->H * w / j->n_chunks, h1 = s->H * (w + 1) / j->n_chunks;
    const int64_t conv_floats = (s->K - 1) * s->n_conv;
    for (int64_t t = 0; t < j->batch->n_tokens; t++) {
        const float *row = j->proj + t * s->n_proj;
        const float *z = row, *x = row + s->DI, *B = x + s->DI, *C = B + s->G * DS;
        const float *dt = row + s->DI + s->n_conv;
        float *y = j->y + t * s->DI;
        float *st = j->state + (int64_t)j->batch->seq[t] * j->per_slot + conv_floats;
        for (int64_t h = h0; h < h1; h++) {
            const float dt_sp = softplus(dt[h] + j->a.dt_b[h]);
            const float dA = expf(dt_sp * j->a.a[h]);
            const int64_t g = h / heads_per_group;
            const float *Bg = B + g * DS, *Cg = C + g * DS;
            for (int64_t i1 = 0; i1 < hd; i1++) {
                const int64_t ii = h * hd + i1;
                const float x_dt = x[ii] * dt_sp;
                float *si = st + ii * DS;
                float sum = 0.0f;
                for (int64_t i0 = 0; i0 < DS; i0++) {
                    const float v = (si[i0] * dA) + (Bg[i0] * x_dt);
                    sum += v * Cg[i0];
                    si[i0] = v;
                }
                const float xd = x[ii] * j->a.d[h]; /* ggml_mul, then ggml_add */
                const float yd = sum + xd;
                y[ii] = kg_silu(z[ii]) * yd; /* ggml_swiglu_split(z, y) */
            }
        }
    }
}

void cpu_mamba2_mixer(cpu_ctx_t *ctx,
                      int32_t il,
                      const kg_step_batch_t *batch,
                      float *scratch,
                      float *state,
                      int64_t per_slot) {
    const cpu_layer_t *L = &ctx->layers[il];
    const m2_shape_t s = shape_of(&ctx->hp);
    const int64_t T = batch->n_tokens;
    m2_job_t job = {.batch = batch,
                    .s = s,
                    .a = arrays_of(L->ssm_f32, &s),
                    .proj = scratch,
                    .y = scratch + T * s.n_proj,
                    .state = state,
                    .per_slot = per_slot};
    const cpu_weight_t *in[1] = {&L->ssm_in};
    float *const in_out[1] = {job.proj};
    cpu_matmul_n(ctx, 1, in, ctx->xn, in_out, T);

    const int64_t n_threads = (int64_t)ctx->n_threads;
    job.n_chunks = n_threads * 4 < s.n_conv ? n_threads * 4 : s.n_conv;
    kg_pool_run(ctx->pool, job.n_chunks, conv_task, &job);
    job.n_chunks = n_threads < s.H ? n_threads : s.H;
    kg_pool_run(ctx->pool, job.n_chunks, scan_task, &job);

    /* the grouped RMS norm: each group's d_inner / n_group channels by
     * themselves, times that group's row of ssm_norm */
    const int64_t gs = s.DI / s.G;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t g = 0; g < s.G; g++) {
            float *yg = job.y + t * s.DI + g * gs;
            cpu_rmsnorm_rows(yg, job.a.norm + g * gs, yg, 1, gs, ctx->hp.norm_eps);
        }
    }
    const cpu_weight_t *o[1] = {&L->ssm_out};
    float *const oo[1] = {ctx->tmp};
    cpu_matmul_n(ctx, 1, o, job.y, oo, T);
}
