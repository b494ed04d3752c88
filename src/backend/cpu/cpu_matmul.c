/* cpu_matmul: the backend's projections, a leaf the forward, the bert
 * encoder and the recurrent layers share: weights that take one input
 * (Q, K, V; gate and up) in one hand-off, activations rounded or
 * quantized for the weight type as ggml does. */
#include "cpu_gemm.h"
#include "cpu_ops.h"
#include "cpu_quant.h"
#include "cpu_rows.h"
#include "kg_backend_cpu_int.h"

/* Whether two weights can share one hand-off: the same float type, or
 * quantized types whose dot products take the same activation blocks. */
static bool same_path(const cpu_weight_t *a, const cpu_weight_t *b) {
    if (a->q.tr || b->q.tr) {
        return a->q.tr && b->q.tr && a->q.tr->act == b->q.tr->act;
    }
    return a->type == b->type;
}

typedef struct act_job {
    const float *in;
    int64_t T, k;
    kg_ggml_type_t type; /* the weights' (rounding), or */
    cpu_qact_t *qa;      /* quantized activations of kind (NULL: rounding into xr) */
    cpu_act_kind_t kind;
    float *xr;
} act_job_t;

static void act_rows(cpu_ctx_t *ctx, const void *p, int64_t r0, int64_t n) {
    (void)ctx;
    const act_job_t *j = p;
    if (j->qa) {
        cpu_quant_act_rows(j->kind, j->in, j->T, j->k, j->qa, r0, r0 + n);
    } else {
        (void)cpu_round_activations(j->type, j->in + r0 * j->k, j->xr + r0 * j->k, n, j->k);
    }
}

/* The activations of T rows for the weights, rounded or quantized over the
 * pool (cpu_rows_run_on; each row's result is its own). Serial, this took
 * 3-5% of a quantized model's prefill while the other threads waited. */
static void prepare_act(cpu_ctx_t *ctx, kg_pool_t *pool, const act_job_t *j) {
    if (j->qa && j->T == 0) {
        cpu_quant_act(j->kind, j->in, 0, j->k, j->qa); /* the shape, for the GEMM */
        return;
    }
    cpu_rows_run_on(pool, ctx, j->T, act_rows, j);
}

/* (kg_backend_cpu_int.h says what it computes) */
void cpu_matmul_n_on(cpu_ctx_t *ctx,
                     kg_pool_t *pool,
                     int thread,
                     float *xr,
                     cpu_qact_t *qa,
                     int n,
                     const cpu_weight_t *const *ws,
                     const float *in,
                     float *const *outs,
                     int64_t T) {
    const cpu_gemm_weights_t *packed[CPU_GEMM_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        if (!same_path(ws[i], ws[0])) {
            for (int r = 0; r < n; r++) {
                cpu_matmul_n_on(ctx, pool, thread, xr, qa, 1, &ws[r], in, &outs[r], T);
            }
            return;
        }
        packed[i] = &ws[i]->packed;
    }
    if (ws[0]->q.tr) {
        const cpu_qmat_t *qm[CPU_QGEMM_MAX_W];
        for (int i = 0; i < n; i++) {
            qm[i] = &ws[i]->q;
        }
        const act_job_t aj = {
            .in = in, .T = T, .k = ws[0]->n_in, .qa = qa, .kind = ws[0]->q.tr->act};
        prepare_act(ctx, pool, &aj);
        if (pool) {
            cpu_qgemm(pool, ctx->qscratch, qa, n, qm, outs);
        } else {
            cpu_qgemm_serial(ctx->qscratch, thread, qa, n, qm, outs);
        }
        return;
    }
    const float *a = in;
    if (cpu_activations_rounded(ws[0]->type, ws[0]->n_in)) {
        const act_job_t aj = {.in = in, .T = T, .k = ws[0]->n_in, .type = ws[0]->type, .xr = xr};
        prepare_act(ctx, pool, &aj);
        a = xr;
    }
    cpu_gemm_multi(pool, a, T, n, packed, outs);
}

void cpu_matmul_n(cpu_ctx_t *ctx,
                  int n,
                  const cpu_weight_t *const *ws,
                  const float *in,
                  float *const *outs,
                  int64_t T) {
    cpu_matmul_n_on(ctx, ctx->pool, 0, ctx->xr, &ctx->qact, n, ws, in, outs, T);
}
