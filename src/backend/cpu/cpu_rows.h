/* cpu_rows: the decoder step's per-token stages on the backend's pool.
 *
 * Between its GEMMs a step runs ops that touch one token's row at a time
 * (RMSNorm, the residual add, RoPE, the K/V cache writes, SwiGLU). Run on
 * the calling thread they were 13% of a Qwen3-0.6B-shaped prefill while the
 * other threads waited (perf: their share on the engine thread alone); here
 * they run over the pool in chunks of tokens, as ggml splits its ops over
 * its threads. Each row is computed by the same code whoever runs it, so
 * the split changes no result. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct cpu_ctx;
struct kg_pool;

/** fn(ctx, arg, t0, n): the stage on tokens [t0, t0 + n). */
typedef void (*cpu_rows_fn)(struct cpu_ctx *ctx, const void *arg, int64_t t0, int64_t n);

/** fn over tokens [0, T) in chunks of 8, on pool when there are at least
 * 4 chunks (fewer do not pay for waking it), else on the calling thread;
 * pool NULL: on the calling thread (MoE groups running side by side). The
 * one row-split every row-local stage uses: the decoder's, bert's, the
 * activations' rounding before a GEMM. @thread engine or a pool task */
void cpu_rows_run_on(
    struct kg_pool *pool, struct cpu_ctx *ctx, int64_t T, cpu_rows_fn fn, const void *arg);

/** cpu_rows_run_on over the backend's pool. @thread engine */
void cpu_rows_run(struct cpu_ctx *ctx, int64_t T, cpu_rows_fn fn, const void *arg);

/** y[t] = RMSNorm(x[t]) * w for T rows of n (cpu_rmsnorm_rows), or a copy
 * of x when w is NULL (a family without the norm). @thread engine */
void cpu_rows_norm(
    struct cpu_ctx *ctx, const float *x, const float *w, float *y, int64_t T, int64_t n, float eps);

/** x[t] += s * b[t] (s 0: x[t] += b[t]) for T rows of n, b first normed in
 * place by post_w when that is not NULL (gemma's and olmo2's post-norms).
 * @thread engine */
void cpu_rows_residual(struct cpu_ctx *ctx,
                       float *x,
                       float *b,
                       const float *post_w,
                       int64_t T,
                       int64_t n,
                       float s,
                       float eps);

/** gate[t] = silu(gate[t]) * up[t] (ggml_swiglu_split), or GeGLU through
 * the backend's fp16 table (cpu_geglu) when geglu, for T rows of F.
 * @thread engine */
void cpu_rows_glu(
    struct cpu_ctx *ctx, float *gate, const float *up, int64_t T, int64_t F, bool geglu);
