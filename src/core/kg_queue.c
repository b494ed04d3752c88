/* kg_queue: bounded FIFO over a ring buffer, mutex + condition variables. */
#include "kg_queue.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kg_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    size_t capacity, item_size;
    size_t head, len;     /* head: index of the oldest item */
    unsigned wake_gen;    /* bumped by kg_queue_wake so waiters return */
    unsigned char *items; /* (capacity, item_size) */
};

kg_queue_t *kg_queue_new(size_t capacity, size_t item_size) {
    if (capacity == 0 || item_size == 0) {
        return NULL;
    }
    kg_queue_t *q = calloc(1, sizeof(*q));
    if (!q) {
        return NULL;
    }
    q->items = malloc(capacity * item_size);
    if (!q->items) {
        free(q);
        return NULL;
    }
    q->capacity = capacity;
    q->item_size = item_size;
    pthread_mutex_init(&q->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&q->not_empty, &attr);
    pthread_cond_init(&q->not_full, &attr);
    pthread_condattr_destroy(&attr);
    return q;
}

void kg_queue_free(kg_queue_t *q) {
    if (!q) {
        return;
    }
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    free(q->items);
    free(q);
}

static void deadline_after(struct timespec *ts, int timeout_ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Wait on `cond` until `ready` holds, the deadline passes or a wake. */
static bool
wait_for(kg_queue_t *q, pthread_cond_t *cond, bool (*ready)(const kg_queue_t *), int timeout_ms) {
    if (ready(q)) {
        return true;
    }
    if (timeout_ms == 0) {
        return false;
    }
    struct timespec ts;
    if (timeout_ms > 0) {
        deadline_after(&ts, timeout_ms);
    }
    unsigned gen = q->wake_gen;
    while (!ready(q) && gen == q->wake_gen) {
        int rc = timeout_ms > 0 ? pthread_cond_timedwait(cond, &q->lock, &ts)
                                : pthread_cond_wait(cond, &q->lock);
        if (rc == ETIMEDOUT) {
            break;
        }
    }
    return ready(q);
}

static bool has_room(const kg_queue_t *q) {
    return q->len < q->capacity;
}

static bool has_item(const kg_queue_t *q) {
    return q->len > 0;
}

kg_status_t kg_queue_push(kg_queue_t *q, const void *item, int timeout_ms) {
    pthread_mutex_lock(&q->lock);
    if (!wait_for(q, &q->not_full, has_room, timeout_ms)) {
        pthread_mutex_unlock(&q->lock);
        return KG_QUEUE_FULL;
    }
    size_t tail = (q->head + q->len) % q->capacity;
    memcpy(q->items + tail * q->item_size, item, q->item_size);
    q->len++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return KG_OK;
}

kg_status_t kg_queue_pop(kg_queue_t *q, void *item, int timeout_ms) {
    pthread_mutex_lock(&q->lock);
    if (!wait_for(q, &q->not_empty, has_item, timeout_ms)) {
        pthread_mutex_unlock(&q->lock);
        return KG_AGAIN;
    }
    memcpy(item, q->items + q->head * q->item_size, q->item_size);
    q->head = (q->head + 1) % q->capacity;
    q->len--;
    pthread_cond_signal(&q->not_full);
    pthread_mutex_unlock(&q->lock);
    return KG_OK;
}

size_t kg_queue_len(kg_queue_t *q) {
    pthread_mutex_lock(&q->lock);
    size_t n = q->len;
    pthread_mutex_unlock(&q->lock);
    return n;
}

size_t kg_queue_capacity(const kg_queue_t *q) {
    return q->capacity;
}

void kg_queue_wake(kg_queue_t *q) {
    pthread_mutex_lock(&q->lock);
    q->wake_gen++;
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->lock);
}
