/* check_queue: the bounded FIFO between the kafka and engine threads. */
#include "check_common.h"
#include "core/kg_queue.h"

#include <pthread.h>
#include <stdatomic.h>

START_TEST(fifo_and_bounds) {
    kg_queue_t *q = kg_queue_new(3, sizeof(int));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kg_queue_push(q, &i, 0), KG_OK);
    }
    int x = 99;
    ck_assert_int_eq(kg_queue_push(q, &x, 0), KG_QUEUE_FULL);
    ck_assert_int_eq(kg_queue_push(q, &x, 20), KG_QUEUE_FULL); /* times out */
    ck_assert_uint_eq(kg_queue_len(q), 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kg_queue_pop(q, &x, 0), KG_OK);
        ck_assert_int_eq(x, i);
    }
    ck_assert_int_eq(kg_queue_pop(q, &x, 0), KG_AGAIN);
    ck_assert_int_eq(kg_queue_pop(q, &x, 10), KG_AGAIN);
    /* wrap-around */
    for (int round = 0; round < 10; round++) {
        ck_assert_int_eq(kg_queue_push(q, &round, 0), KG_OK);
        ck_assert_int_eq(kg_queue_pop(q, &x, 0), KG_OK);
        ck_assert_int_eq(x, round);
    }
    kg_queue_free(q);
    kg_queue_free(NULL);
}
END_TEST

#define N_ITEMS 20000

static void *producer(void *arg) {
    kg_queue_t *q = arg;
    for (int i = 0; i < N_ITEMS; i++) {
        ck_assert_int_eq(kg_queue_push(q, &i, -1), KG_OK);
    }
    return NULL;
}

START_TEST(two_threads_in_order) {
    kg_queue_t *q = kg_queue_new(16, sizeof(int));
    pthread_t th;
    pthread_create(&th, NULL, producer, q);
    for (int i = 0; i < N_ITEMS; i++) {
        int x;
        ck_assert_int_eq(kg_queue_pop(q, &x, -1), KG_OK);
        ck_assert_int_eq(x, i);
    }
    pthread_join(th, NULL);
    kg_queue_free(q);
}
END_TEST

/* A wake is not sticky (it releases pops already waiting), so the waker
 * repeats it every 20 ms until the pop has returned: a main thread held up
 * on a loaded machine must not miss the only one. */
typedef struct waker_arg {
    kg_queue_t *q;
    atomic_bool returned;
} waker_arg_t;

static void *waker(void *arg) {
    waker_arg_t *w = arg;
    while (!atomic_load(&w->returned)) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
        kg_queue_wake(w->q);
    }
    return NULL;
}

START_TEST(wake_releases_a_blocked_pop) {
    waker_arg_t w = {.q = kg_queue_new(4, sizeof(int))};
    atomic_init(&w.returned, false);
    pthread_t th;
    pthread_create(&th, NULL, waker, &w);
    int x;
    ck_assert_int_eq(kg_queue_pop(w.q, &x, -1), KG_AGAIN);
    atomic_store(&w.returned, true);
    pthread_join(th, NULL);
    kg_queue_free(w.q);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("queue");
    TCase *tc = tcase_create("queue");
    tcase_add_test(tc, fifo_and_bounds);
    tcase_add_test(tc, two_threads_in_order);
    tcase_add_test(tc, wake_releases_a_blocked_pop);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
