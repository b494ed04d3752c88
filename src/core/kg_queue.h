/* kg_queue: a bounded multi-producer, multi-consumer FIFO of fixed-size
 * items (copied in and out), for the two long-lived threads to talk
 * through (redis bio.c). A mutex and two condition variables: the queues
 * carry a few thousand items a second, far below where a lock-free ring
 * would pay for its subtlety. Storage is allocated once at _new. */
#pragma once

#include "kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_queue kg_queue_t;

/** A queue of `capacity` items of `item_size` bytes. NULL on OOM. */
kg_queue_t *kg_queue_new(size_t capacity, size_t item_size);
void kg_queue_free(kg_queue_t *q);

/** Copy `item` in. KG_QUEUE_FULL when full and timeout_ms == 0; otherwise
 * waits up to timeout_ms (-1 = forever) for room. @thread any */
KG_NODISCARD kg_status_t kg_queue_push(kg_queue_t *q, const void *item, int timeout_ms);

/** Copy the oldest item out. KG_AGAIN when empty after waiting up to
 * timeout_ms (0 = do not wait, -1 = forever). @thread any */
KG_NODISCARD kg_status_t kg_queue_pop(kg_queue_t *q, void *item, int timeout_ms);

size_t kg_queue_len(kg_queue_t *q);
size_t kg_queue_capacity(const kg_queue_t *q);

/** Wake every waiter (used at shutdown); waits return KG_AGAIN/KG_QUEUE_FULL. */
void kg_queue_wake(kg_queue_t *q);
