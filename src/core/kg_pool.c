/* kg_pool: workers sleep on a condition variable between runs; tasks are
 * claimed with an atomic counter. */
#include "kg_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct kg_pool {
    int n_threads;
    pthread_t *threads; /* (n_threads - 1) */
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    uint64_t generation; /* bumped per run */
    bool quit;
    int n_active; /* workers still in the current run */
    /* the current run */
    kg_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    _Atomic int64_t next;
};

typedef struct worker_arg {
    kg_pool_t *pool;
    int index;
} worker_arg_t;

static void work(kg_pool_t *pool, int thread) {
    int64_t t;
    while ((t = atomic_fetch_add(&pool->next, 1)) < pool->n_tasks) {
        pool->fn(pool->ctx, t, thread);
    }
}

static void *worker_main(void *p) {
    worker_arg_t *arg = p;
    kg_pool_t *pool = arg->pool;
    int index = arg->index;
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->quit && pool->generation == seen) {
            pthread_cond_wait(&pool->start, &pool->lock);
        }
        if (pool->quit) {
            break;
        }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        work(pool, index);
        pthread_mutex_lock(&pool->lock);
        if (--pool->n_active == 0) {
            pthread_cond_signal(&pool->done);
        }
    }
    pthread_mutex_unlock(&pool->lock);
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
    pool->quit = true;
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
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store(&pool->next, 0);
    pool->n_active = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);
    work(pool, 0);
    pthread_mutex_lock(&pool->lock);
    while (pool->n_active > 0) {
        pthread_cond_wait(&pool->done, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
}
