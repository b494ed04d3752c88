/* kg_pool: workers spin briefly, then sleep on a condition variable
 * between runs; tasks are claimed with an atomic counter.
 *
 * A run waits only for the workers that took part in it. The claim counter
 * carries the run's generation beside the tasks left, so a worker that
 * wakes late (the OS gave its core to someone else) finds nothing to claim
 * and touches nothing; the caller does not wait for it. Waiting for every
 * worker to check in, as a barrier does, made a step as slow as the OS's
 * longest scheduling delay whenever other processes shared the cores. */
#include "kg_pool.h"

#include "kg_clock.h"
#include "kg_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

/* How long a worker polls for the next run, and the caller for the end of
 * this one, before sleeping. A decode step hands off several times per layer
 * with a few microseconds between runs; waking a sleeping thread costs
 * 10-15 us here, which at batch 1 was about a tenth of the step. 30 us
 * covers the gaps inside a forward pass and is short enough that the
 * worker's kafka thread or a neighbour loses little when the engine idles. */
#define POOL_SPIN_US 30

struct kg_pool {
    int n_threads;
    pthread_t *threads; /* (n_threads - 1) */
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    _Atomic uint64_t generation; /* bumped per run */
    _Atomic bool quit;
    _Atomic int busy; /* workers inside work() */
    /* the current run: read only by threads holding one of its tasks */
    kg_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    /* the run's generation (high 32 bits) and the tasks still unclaimed (low
     * 32 bits); task n_tasks - left is handed out next */
    _Atomic uint64_t claim;
};

typedef struct worker_arg {
    kg_pool_t *pool;
    int index;
} worker_arg_t;

/* Claim and run tasks of run `gen` until none is left. */
static void work(kg_pool_t *pool, int thread, uint32_t gen) {
    uint64_t v = atomic_load(&pool->claim);
    for (;;) {
        if ((uint32_t)(v >> 32) != gen || (uint32_t)v == 0) {
            return; /* another run, or this one's tasks are all taken */
        }
        if (atomic_compare_exchange_weak(&pool->claim, &v, v - 1)) {
            /* the claim orders these reads after the caller's writes */
            pool->fn(pool->ctx, pool->n_tasks - (int64_t)(uint32_t)v, thread);
            v = atomic_load(&pool->claim);
        }
    }
}

static void *worker_main(void *p) {
    worker_arg_t *arg = p;
    kg_pool_t *pool = arg->pool;
    int index = arg->index;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        /* poll a while: the next run usually comes within microseconds */
        const int64_t until = kg_clock_us() + POOL_SPIN_US;
        while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->quit) &&
               kg_clock_us() < until) {
            POOL_PAUSE();
        }
        pthread_mutex_lock(&pool->lock);
        while (!atomic_load(&pool->quit) && atomic_load(&pool->generation) == seen) {
            pthread_cond_wait(&pool->start, &pool->lock);
        }
        pthread_mutex_unlock(&pool->lock);
        if (atomic_load(&pool->quit)) {
            break;
        }
        seen = atomic_load(&pool->generation);
        /* counted before claiming: a caller that finds no task left then sees
         * every worker that holds one */
        atomic_fetch_add(&pool->busy, 1);
        work(pool, index, (uint32_t)seen);
        if (atomic_fetch_sub(&pool->busy, 1) == 1) {
            /* the lock orders this signal after the caller's check */
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
    return NULL;
}

kg_pool_t *kg_pool_new(int n_threads) {
    kg_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool) {
        return NULL;
    }
    pool->n_threads = n_threads > 0 ? n_threads : 1;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)pool->n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        pool->n_threads = 1; /* nothing started: nothing to join */
        kg_pool_free(pool);
        return NULL;
    }
    for (int i = 1; i < pool->n_threads; i++) {
        worker_arg_t *arg = malloc(sizeof(*arg));
        if (!arg) {
            pool->n_threads = i;
            break;
        }
        arg->pool = pool;
        arg->index = i;
        if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i; /* run with what started */
            break;
        }
    }
    return pool;
}

void kg_pool_free(kg_pool_t *pool) {
    if (!pool) {
        return;
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->quit, true);
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n_threads; i++) {
        pthread_join(pool->threads[i - 1], NULL);
    }
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->start);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool);
}

int kg_pool_n_threads(const kg_pool_t *pool) {
    return pool->n_threads;
}

void kg_pool_run(kg_pool_t *pool, int64_t n_tasks, kg_pool_fn fn, void *ctx) {
    if (pool->n_threads == 1 || n_tasks <= 1) {
        for (int64_t t = 0; t < n_tasks; t++) {
            fn(ctx, t, 0);
        }
        return;
    }
    KG_ASSERT(n_tasks <= UINT32_MAX);
    /* no worker holds a task of the previous run (the caller waited for them)
     * and none can claim one now, so the fields are free to write */
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    const uint32_t gen = (uint32_t)atomic_load(&pool->generation) + 1;
    atomic_store(&pool->claim, (uint64_t)gen << 32 | (uint64_t)n_tasks); /* publishes them */
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->generation, gen);
    pthread_cond_broadcast(&pool->start); /* cheap when every worker is polling */
    pthread_mutex_unlock(&pool->lock);
    work(pool, 0, gen);
    /* every task is claimed: wait for the workers still running one */
    const int64_t until = kg_clock_us() + POOL_SPIN_US;
    while (atomic_load(&pool->busy) > 0 && kg_clock_us() < until) {
        POOL_PAUSE();
    }
    if (atomic_load(&pool->busy) > 0) {
        pthread_mutex_lock(&pool->lock);
        while (atomic_load(&pool->busy) > 0) {
            pthread_cond_wait(&pool->done, &pool->lock);
        }
        pthread_mutex_unlock(&pool->lock);
    }
}
