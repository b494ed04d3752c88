/* cpu_rows: the decoder step's per-token stages on the pool (cpu_rows.h). */
#include "cpu_rows.h"

#include "../kg_math.h"
#include "cpu_ops.h"
#include "kg_backend_cpu_int.h"

#include <string.h>

/* Tokens per pool task: a few microseconds of work for a 1,024-wide row,
 * enough that handing out tasks costs little, small enough that the threads
 * finish together. */
#define ROWS_CHUNK 8

/* Below this many chunks the stage runs on the calling thread: waking a
 * sleeping pool worker (10-15 us here) costs more than a decode step's rows. */
#define ROWS_MIN_CHUNKS 4

typedef struct rows_job {
    cpu_ctx_t *ctx;
    cpu_rows_fn fn;
    const void *arg;
    int64_t T;
} rows_job_t;

static void rows_task(void *p, int64_t w, int thread) {
    (void)thread;
    const rows_job_t *j = p;
    const int64_t t0 = w * ROWS_CHUNK;
    j->fn(j->ctx, j->arg, t0, j->T - t0 < ROWS_CHUNK ? j->T - t0 : ROWS_CHUNK);
}

void cpu_rows_run_on(kg_pool_t *pool, cpu_ctx_t *ctx, int64_t T, cpu_rows_fn fn, const void *arg) {
    const int64_t n_chunks = (T + ROWS_CHUNK - 1) / ROWS_CHUNK;
    if (n_chunks < ROWS_MIN_CHUNKS || !pool) {
        if (T > 0) {
            fn(ctx, arg, 0, T);
        }
        return;
    }
    rows_job_t j = {.ctx = ctx, .fn = fn, .arg = arg, .T = T};
    kg_pool_run(pool, n_chunks, rows_task, &j);
}

void cpu_rows_run(cpu_ctx_t *ctx, int64_t T, cpu_rows_fn fn, const void *arg) {
    cpu_rows_run_on(ctx->pool, ctx, T, fn, arg);
}

// ---- norm ----

typedef struct norm_arg {
    const float *x, *w;
    float *y;
    int64_t n;
    float eps;
} norm_arg_t;

static void norm_rows(cpu_ctx_t *ctx, const void *p, int64_t t0, int64_t T) {
    (void)ctx;
    const norm_arg_t *a = p;
    if (a->w) {
        cpu_rmsnorm_rows(a->x + t0 * a->n, a->w, a->y + t0 * a->n, T, a->n, a->eps);
    } else if (a->y != a->x) {
        memcpy(a->y + t0 * a->n, a->x + t0 * a->n, (size_t)(T * a->n) * sizeof(float));
    }
}

void cpu_rows_norm(
    cpu_ctx_t *ctx, const float *x, const float *w, float *y, int64_t T, int64_t n, float eps) {
    const norm_arg_t a = {.x = x, .w = w, .y = y, .n = n, .eps = eps};
    cpu_rows_run(ctx, T, norm_rows, &a);
}

// ---- residual ----

typedef struct residual_arg {
    float *x, *b;
    const float *post_w;
    int64_t n;
    float s, eps;
} residual_arg_t;

static void residual_rows(cpu_ctx_t *ctx, const void *p, int64_t t0, int64_t T) {
    (void)ctx;
    const residual_arg_t *a = p;
    float *x = a->x + t0 * a->n, *b = a->b + t0 * a->n;
    const int64_t m = T * a->n;
    if (a->post_w) {
        cpu_rmsnorm_rows(b, a->post_w, b, T, a->n, a->eps);
    }
    if (a->s != 0.0f) { /* granite's ggml_scale of the block output, then ggml_add */
        for (int64_t i = 0; i < m; i++) {
            x[i] += b[i] * a->s;
        }
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        x[i] += b[i];
    }
}

void cpu_rows_residual(cpu_ctx_t *ctx,
                       float *x,
                       float *b,
                       const float *post_w,
                       int64_t T,
                       int64_t n,
                       float s,
                       float eps) {
    const residual_arg_t a = {.x = x, .b = b, .post_w = post_w, .n = n, .s = s, .eps = eps};
    cpu_rows_run(ctx, T, residual_rows, &a);
}

// ---- gated activations ----

typedef struct glu_arg {
    float *gate;
    const float *up;
    int64_t F;
    bool geglu;
} glu_arg_t;

static void glu_rows(cpu_ctx_t *ctx, const void *p, int64_t t0, int64_t T) {
    const glu_arg_t *a = p;
    float *g = a->gate + t0 * a->F;
    const float *u = a->up + t0 * a->F;
    const int64_t m = T * a->F;
    if (a->geglu) {
        cpu_geglu(ctx->gelu_table, g, u, g, m);
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        g[i] = kg_silu(g[i]) * u[i];
    }
}

void cpu_rows_glu(cpu_ctx_t *ctx, float *gate, const float *up, int64_t T, int64_t F, bool geglu) {
    const glu_arg_t a = {.gate = gate, .up = up, .F = F, .geglu = geglu};
    cpu_rows_run(ctx, T, glu_rows, &a);
}
