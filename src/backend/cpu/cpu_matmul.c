/* cpu_matmul: the backend's projections, a leaf the forward, the bert
 * encoder and the recurrent layers share: weights that take one input
 * (Q, K, V; gate and up) in one hand-off, activations rounded or
 * quantized for the weight type as ggml does. */
#include "cpu_gemm.h"
#include "cpu_ops.h"
#include "cpu_quant.h"
#include "kg_backend_cpu_int.h"

/* Whether two weights can share one hand-off: the same float type, or
 * quantized types whose dot products take the same activation blocks. */
static bool same_path(const cpu_weight_t *a, const cpu_weight_t *b) {
    if (a->q.tr || b->q.tr) {
        return a->q.tr && b->q.tr && a->q.tr->act == b->q.tr->act;
    }
    return a->type == b->type;
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
        cpu_quant_act(ws[0]->q.tr->act, in, T, ws[0]->n_in, qa);
        if (pool) {
            cpu_qgemm(pool, ctx->qscratch, qa, n, qm, outs);
        } else {
            cpu_qgemm_serial(ctx->qscratch, thread, qa, n, qm, outs);
        }
        return;
    }
    const float *a = in;
    if (cpu_round_activations(ws[0]->type, in, xr, T, ws[0]->n_in)) {
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
