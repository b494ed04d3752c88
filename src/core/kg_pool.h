/* kg_pool: a small thread pool for the CPU backend's parallel loops.
 *
 * Why not OpenMP: libgomp's idle threads spin (OMP_WAIT_POLICY is read
 * from the environment once, before main), and on a 2-core machine that
 * spinning starves OpenBLAS's own threads and the worker's kafka thread:
 * measured 260 tok/s with spinning vs 2300 with sleeping threads on
 * stories260K. Here idle workers sleep on a condition variable. */
#pragma once

#include <stdint.h>

typedef struct kg_pool kg_pool_t;

/** `fn(ctx, task, thread)` runs once for every task in [0, n_tasks). */
typedef void (*kg_pool_fn)(void *ctx, int64_t task, int thread);

/** A pool of n_threads (the caller counts as one; n_threads - 1 are started). */
kg_pool_t *kg_pool_new(int n_threads);
void kg_pool_free(kg_pool_t *pool);
int kg_pool_n_threads(const kg_pool_t *pool);

/** Run n_tasks tasks over the pool and wait for all of them. Tasks are
 * handed out one at a time (dynamic schedule). With one thread or one task
 * it runs inline. Not reentrant. */
void kg_pool_run(kg_pool_t *pool, int64_t n_tasks, kg_pool_fn fn, void *ctx);
