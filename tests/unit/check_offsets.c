/* check_offsets: the storable offset per partition under in-order, out-of-order and gapped
 * completion, revocation, many partitions, the in-flight cap, and a long random run checked
 * against a naive model. */
#include "check_common.h"
#include "kafka/kg_offsets.h"

#include <stdio.h>
#include <string.h>

static kg_offsets_t *o;

static void setup(void) {
    o = kg_offsets_new(1000);
    ck_assert_ptr_nonnull(o);
}

static void teardown(void) {
    kg_offsets_free(o);
    o = NULL;
}

static void track(int32_t part, int64_t off) {
    ck_assert_int_eq(kg_offsets_track(o, part, off), KG_OK);
}

/* The storable offset now, or -1 when it did not advance. */
static int64_t committable(int32_t part) {
    int64_t next = -42;
    if (!kg_offsets_committable(o, part, &next)) {
        ck_assert_int_eq(next, -42); /* untouched when there is nothing new */
        return -1;
    }
    return next;
}

// ---- basic orders ----

START_TEST(in_order) {
    for (int64_t off = 100; off < 110; off++) {
        track(0, off);
    }
    ck_assert_int_eq(committable(0), -1);
    for (int64_t off = 100; off < 110; off++) {
        ck_assert(kg_offsets_done(o, 0, off));
        ck_assert_int_eq(committable(0), off + 1);
        ck_assert_int_eq(committable(0), -1); /* once per advance */
    }
    ck_assert_uint_eq(kg_offsets_n_held(o), 0);
    ck_assert_uint_eq(kg_offsets_n_pending(o, 0), 0);
}
END_TEST

START_TEST(out_of_order) {
    for (int64_t off = 0; off < 5; off++) {
        track(0, off);
    }
    ck_assert(kg_offsets_done(o, 0, 3));
    ck_assert_int_eq(committable(0), -1); /* 0 still runs */
    ck_assert_uint_eq(kg_offsets_n_pending(o, 0), 4);
    ck_assert(kg_offsets_done(o, 0, 0));
    ck_assert_int_eq(committable(0), 1);
    ck_assert(kg_offsets_done(o, 0, 1));
    ck_assert_int_eq(committable(0), 2);
    ck_assert(kg_offsets_done(o, 0, 2));
    ck_assert_int_eq(committable(0), 4); /* 3 was already done */
    ck_assert_uint_eq(kg_offsets_n_held(o), 1);
    ck_assert(kg_offsets_done(o, 0, 4));
    ck_assert_int_eq(committable(0), 5);
    ck_assert_uint_eq(kg_offsets_n_held(o), 0);
}
END_TEST

START_TEST(reverse_order) {
    for (int64_t off = 0; off < 300; off++) { /* more than the initial ring */
        track(0, off);
    }
    for (int64_t off = 299; off > 0; off--) {
        ck_assert(kg_offsets_done(o, 0, off));
        ck_assert_int_eq(committable(0), -1);
    }
    ck_assert_uint_eq(kg_offsets_n_held(o), 300);
    ck_assert(kg_offsets_done(o, 0, 0));
    ck_assert_int_eq(committable(0), 300);
    ck_assert_uint_eq(kg_offsets_n_held(o), 0);
}
END_TEST

START_TEST(iterator_reports_once) {
    /* partition 1 advances 20 times and 4 once before anyone drains: one report each, with
     * the latest value, in the order they first advanced */
    for (int64_t off = 0; off < 20; off++) {
        track(1, off);
    }
    track(4, 7);
    for (int64_t off = 0; off < 10; off++) {
        ck_assert(kg_offsets_done(o, 1, off));
    }
    ck_assert(kg_offsets_done(o, 4, 7));
    for (int64_t off = 10; off < 20; off++) {
        ck_assert(kg_offsets_done(o, 1, off));
    }
    int32_t part = -1;
    int64_t next = -1;
    ck_assert(kg_offsets_next_committable(o, &part, &next));
    ck_assert_int_eq(part, 1);
    ck_assert_int_eq(next, 20);
    ck_assert(kg_offsets_next_committable(o, &part, &next));
    ck_assert_int_eq(part, 4);
    ck_assert_int_eq(next, 8);
    ck_assert(!kg_offsets_next_committable(o, &part, &next));
    /* a value already taken with kg_offsets_committable is not reported again */
    track(1, 20);
    ck_assert(kg_offsets_done(o, 1, 20));
    ck_assert_int_eq(committable(1), 21);
    ck_assert(!kg_offsets_next_committable(o, &part, &next));
    /* a drained partition is queued again by its next advance */
    track(4, 9);
    ck_assert(kg_offsets_done(o, 4, 9));
    ck_assert(kg_offsets_next_committable(o, &part, &next));
    ck_assert_int_eq(part, 4);
    ck_assert_int_eq(next, 10);
    ck_assert(!kg_offsets_next_committable(o, &part, &next));
}
END_TEST

START_TEST(gaps) {
    /* 11, 13, 14 are transaction markers or compacted away: never tracked, never waited for */
    track(0, 10);
    track(0, 12);
    track(0, 15);
    ck_assert(kg_offsets_done(o, 0, 12));
    ck_assert_int_eq(committable(0), -1);
    ck_assert(kg_offsets_done(o, 0, 10));
    ck_assert_int_eq(committable(0), 13);
    ck_assert(!kg_offsets_done(o, 0, 11)); /* untracked */
    ck_assert(!kg_offsets_done(o, 0, 14));
    ck_assert(kg_offsets_done(o, 0, 15));
    ck_assert_int_eq(committable(0), 16);
    /* the next tracked offset may jump far ahead */
    track(0, 1000000);
    ck_assert_int_eq(committable(0), -1);
    ck_assert(kg_offsets_done(o, 0, 1000000));
    ck_assert_int_eq(committable(0), 1000001);
}
END_TEST

START_TEST(bad_calls) {
    ck_assert_int_eq(kg_offsets_track(o, -1, 0), KG_ERR_INVALID);
    ck_assert_int_eq(kg_offsets_track(o, KG_OFFSETS_MAX_PARTITIONS, 0), KG_ERR_INVALID);
    ck_assert_int_eq(kg_offsets_track(o, 0, -1), KG_ERR_INVALID);
    ck_assert_int_eq(kg_offsets_track(o, 0, INT64_MAX), KG_ERR_INVALID);
    ck_assert_int_eq(kg_offsets_assign(o, -5), KG_ERR_INVALID);
    track(0, 5);
    ck_assert_int_eq(kg_offsets_track(o, 0, 5), KG_ERR_INVALID); /* not increasing */
    ck_assert_int_eq(kg_offsets_track(o, 0, 4), KG_ERR_INVALID);
    ck_assert(!kg_offsets_done(o, 0, 4));
    ck_assert(!kg_offsets_done(o, 0, 6));
    ck_assert(!kg_offsets_done(o, 0, -1));
    ck_assert(!kg_offsets_done(o, 1, 5)); /* never assigned */
    ck_assert(!kg_offsets_done(o, 70000, 5));
    int64_t next;
    ck_assert(!kg_offsets_committable(o, 3, &next));
    ck_assert(!kg_offsets_committable(o, -3, &next));
    kg_offsets_revoke(o, 9);  /* unknown: ignored */
    kg_offsets_revoke(o, -9); /* invalid: ignored */
    ck_assert(kg_offsets_done(o, 0, 5));
    ck_assert(!kg_offsets_done(o, 0, 5)); /* twice */
    ck_assert_int_eq(committable(0), 6);
    ck_assert_ptr_null(kg_offsets_new(0));
    kg_offsets_free(NULL);
}
END_TEST

// ---- revoke ----

START_TEST(revoke) {
    ck_assert_int_eq(kg_offsets_assign(o, 2), KG_OK);
    ck_assert_int_eq(kg_offsets_assign(o, 2), KG_OK); /* idempotent */
    for (int64_t off = 0; off < 10; off++) {
        track(2, off);
        track(3, off);
    }
    ck_assert(kg_offsets_done(o, 2, 0));
    ck_assert(kg_offsets_done(o, 2, 5));
    ck_assert(kg_offsets_done(o, 3, 0));
    ck_assert_uint_eq(kg_offsets_n_held(o), 18);
    kg_offsets_revoke(o, 2);
    ck_assert_uint_eq(kg_offsets_n_held(o), 9);
    ck_assert_uint_eq(kg_offsets_n_pending(o, 2), 0);
    ck_assert_int_eq(committable(2), -1); /* nothing to store for a revoked partition */
    ck_assert(!kg_offsets_done(o, 2, 1)); /* late completion of a revoked job: ignored */
    /* only partition 3 is reported, and partition 2 is gone from the dirty list */
    int32_t part = -1;
    int64_t next = -1;
    ck_assert(kg_offsets_next_committable(o, &part, &next));
    ck_assert_int_eq(part, 3);
    ck_assert_int_eq(next, 1);
    ck_assert(!kg_offsets_next_committable(o, &part, &next));

    /* reassigned, the partition is redelivered from the committed offset: lower offsets again */
    track(2, 1);
    track(2, 2);
    ck_assert(kg_offsets_done(o, 2, 1));
    ck_assert(kg_offsets_next_committable(o, &part, &next));
    ck_assert_int_eq(part, 2);
    ck_assert_int_eq(next, 2);
    ck_assert(!kg_offsets_next_committable(o, &part, &next));
    ck_assert_uint_eq(kg_offsets_n_pending(o, 2), 1);
    ck_assert_uint_eq(kg_offsets_n_pending(o, 3), 9);
}
END_TEST

START_TEST(cap) {
    kg_offsets_t *small = kg_offsets_new(4);
    ck_assert_ptr_nonnull(small);
    ck_assert_int_eq(kg_offsets_track(small, 0, 0), KG_OK);
    ck_assert_int_eq(kg_offsets_track(small, 0, 1), KG_OK);
    ck_assert_int_eq(kg_offsets_track(small, 1, 0), KG_OK);
    ck_assert_int_eq(kg_offsets_track(small, 1, 1), KG_OK);
    ck_assert_int_eq(kg_offsets_track(small, 0, 2), KG_QUEUE_FULL);
    /* a done entry behind a running one is still held */
    ck_assert(kg_offsets_done(small, 0, 1));
    ck_assert_int_eq(kg_offsets_track(small, 0, 2), KG_QUEUE_FULL);
    ck_assert(kg_offsets_done(small, 0, 0));
    ck_assert_uint_eq(kg_offsets_n_held(small), 2);
    ck_assert_int_eq(kg_offsets_track(small, 0, 2), KG_OK); /* nothing was recorded before */
    ck_assert_int_eq(kg_offsets_track(small, 2, 7), KG_OK);
    ck_assert_int_eq(kg_offsets_track(small, 2, 8), KG_QUEUE_FULL);
    kg_offsets_revoke(small, 1);
    ck_assert_int_eq(kg_offsets_track(small, 2, 8), KG_OK);
    kg_offsets_free(small);
}
END_TEST

// ---- scale ----

START_TEST(many_partitions) {
    enum { N_PART = 1024, N_OFF = 90 };
    kg_offsets_t *big = kg_offsets_new(N_PART * N_OFF);
    ck_assert_ptr_nonnull(big);
    /* interleaved as a consumer sees them: partition by partition per fetch */
    for (int64_t i = 0; i < N_OFF; i++) {
        for (int32_t part = 0; part < N_PART; part++) {
            ck_assert_int_eq(kg_offsets_track(big, part, 1000 * part + 3 * i), KG_OK);
        }
    }
    ck_assert_uint_eq(kg_offsets_n_held(big), N_PART * N_OFF);
    /* finish everything but each partition's first job, newest first */
    for (int64_t i = N_OFF - 1; i > 0; i--) {
        for (int32_t part = N_PART - 1; part >= 0; part--) {
            ck_assert(kg_offsets_done(big, part, 1000 * part + 3 * i));
        }
    }
    int32_t part;
    int64_t next;
    ck_assert(!kg_offsets_next_committable(big, &part, &next));
    /* the first jobs finish in a scrambled order; each partition is reported once, in that
     * order, with its whole range */
    static bool seen[N_PART];
    memset(seen, 0, sizeof(seen));
    for (int32_t k = 0; k < N_PART; k++) {
        int32_t p = (k * 389) % N_PART; /* 389 is prime: a permutation */
        ck_assert(kg_offsets_done(big, p, 1000 * p));
    }
    for (int32_t k = 0; k < N_PART; k++) {
        ck_assert(kg_offsets_next_committable(big, &part, &next));
        ck_assert_int_eq(part, (k * 389) % N_PART);
        ck_assert(!seen[part]);
        seen[part] = true;
        ck_assert_int_eq(next, 1000 * part + 3 * (N_OFF - 1) + 1);
    }
    ck_assert(!kg_offsets_next_committable(big, &part, &next));
    ck_assert_uint_eq(kg_offsets_n_held(big), 0);
    kg_offsets_free(big);
}
END_TEST

START_TEST(many_in_flight) {
    enum { N = 100000 };
    kg_offsets_t *big = kg_offsets_new(N);
    ck_assert_ptr_nonnull(big);
    for (int64_t off = 0; off < N; off++) {
        ck_assert_int_eq(kg_offsets_track(big, 5, off), KG_OK);
    }
    ck_assert_int_eq(kg_offsets_track(big, 5, N), KG_QUEUE_FULL);
    /* done in a scrambled order (a multiplicative permutation), 0 last */
    for (int64_t k = 1; k < N; k++) {
        int64_t off = (k * 7919) % N;
        if (off != 0) {
            ck_assert(kg_offsets_done(big, 5, off));
        }
    }
    int64_t next;
    ck_assert(!kg_offsets_committable(big, 5, &next));
    ck_assert(kg_offsets_done(big, 5, 0));
    ck_assert(kg_offsets_committable(big, 5, &next));
    ck_assert_int_eq(next, N);
    kg_offsets_free(big);
}
END_TEST

// ---- random run against a naive model ----

enum { M_PART = 6, M_MAX = 300 };

/* The model: per partition a plain list of tracked (offset, done), and the storable offset
 * recomputed from scratch after every change. */
typedef struct model_part {
    int64_t off[M_MAX * 2];
    bool done[M_MAX * 2];
    int n;          /* entries in off/done */
    int64_t last;   /* last tracked, -1 */
    int64_t stored; /* last storable reported, -1 */
    bool assigned;
} model_part_t;

static model_part_t model[M_PART];

static int model_held(void) {
    int held = 0;
    for (int p = 0; p < M_PART; p++) {
        held += model[p].n;
    }
    return held;
}

/* One past the longest done prefix, or -1 when the first entry is not done (or none). */
static int64_t model_prefix(model_part_t *mp) {
    int64_t next = -1;
    for (int i = 0; i < mp->n && mp->done[i]; i++) {
        next = mp->off[i] + 1;
    }
    return next;
}

/* Drop the done prefix, as the tracker does once it has passed it. */
static void model_compact(model_part_t *mp) {
    int k = 0;
    while (k < mp->n && mp->done[k]) {
        k++;
    }
    memmove(mp->off, mp->off + k, (size_t)(mp->n - k) * sizeof(mp->off[0]));
    memmove(mp->done, mp->done + k, (size_t)(mp->n - k) * sizeof(mp->done[0]));
    mp->n -= k;
}

static uint64_t rng_state;

static uint64_t rng(void) { /* xorshift64*: deterministic across platforms */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

START_TEST(random_vs_model) {
    kg_offsets_t *t = kg_offsets_new(M_MAX);
    ck_assert_ptr_nonnull(t);
    memset(model, 0, sizeof(model));
    for (int p = 0; p < M_PART; p++) {
        model[p].last = model[p].stored = -1;
    }
    rng_state = 0x9E3779B97F4A7C15ULL;
    /* prefix: storable offset the model computes before it drops entries it passed */
    int64_t prefix_next[M_PART];
    for (int p = 0; p < M_PART; p++) {
        prefix_next[p] = -1;
    }
    for (int step = 0; step < 200000; step++) {
        int32_t p = (int32_t)(rng() % M_PART);
        model_part_t *mp = &model[p];
        unsigned op = (unsigned)(rng() % 100);
        if (op < 45) { /* track, sometimes with a gap */
            int64_t off = mp->last + 1 + (rng() % 4 == 0 ? (int64_t)(rng() % 5) : 0);
            kg_status_t st = kg_offsets_track(t, p, off);
            if (model_held() >= M_MAX) {
                ck_assert_int_eq(st, KG_QUEUE_FULL);
            } else {
                ck_assert_int_eq(st, KG_OK);
                mp->off[mp->n] = off;
                mp->done[mp->n] = false;
                mp->n++;
                mp->last = off;
                mp->assigned = true;
            }
        } else if (op < 90) { /* done: a random held entry (maybe already done) or a stray */
            int64_t off;
            int idx = -1;
            if (mp->n > 0 && rng() % 8 != 0) {
                idx = (int)(rng() % (uint64_t)mp->n);
                off = mp->off[idx];
            } else {
                off = (int64_t)(rng() % 2000);
                for (int i = 0; i < mp->n; i++) {
                    if (mp->off[i] == off) {
                        idx = i;
                    }
                }
            }
            bool expect = idx >= 0 && !mp->done[idx];
            ck_assert_msg(kg_offsets_done(t, p, off) == expect, "step %d part %d off %lld", step, p,
                          (long long)off);
            if (expect) {
                mp->done[idx] = true;
            }
            int64_t pre = model_prefix(mp);
            if (pre >= 0) {
                prefix_next[p] = pre;
            }
            model_compact(mp);
        } else if (op < 93) { /* store every advanced partition, through the iterator */
            int32_t part;
            int64_t next;
            bool seen[M_PART] = {false};
            while (kg_offsets_next_committable(t, &part, &next)) {
                ck_assert(part >= 0 && part < M_PART && !seen[part]);
                seen[part] = true;
                ck_assert(model[part].assigned);
                ck_assert_int_eq(next, prefix_next[part]);
                ck_assert_int_gt(next, model[part].stored);
                model[part].stored = next;
            }
            for (int q = 0; q < M_PART; q++) { /* nothing left behind */
                ck_assert(!model[q].assigned || prefix_next[q] <= model[q].stored);
            }
        } else if (op < 98) { /* store one partition */
            int64_t next = -7;
            bool adv = kg_offsets_committable(t, p, &next);
            bool expect = mp->assigned && prefix_next[p] > mp->stored;
            ck_assert_msg(adv == expect, "step %d part %d", step, p);
            if (adv) {
                ck_assert_int_eq(next, prefix_next[p]);
                mp->stored = next;
            }
        } else { /* revoke: forget everything of the partition */
            kg_offsets_revoke(t, p);
            mp->n = 0;
            mp->assigned = false;
            mp->stored = -1;
            prefix_next[p] = -1;
            /* redelivery starts somewhere at or below what was tracked */
            mp->last = mp->last > 50 ? mp->last - (int64_t)(rng() % 50) : -1;
        }
        ck_assert_uint_eq(kg_offsets_n_held(t), (size_t)model_held());
        int pending = 0;
        for (int i = 0; i < mp->n; i++) {
            pending += !mp->done[i];
        }
        ck_assert_uint_eq(kg_offsets_n_pending(t, p), (size_t)pending);
    }
    /* drain through the iterator: every partition with news, exactly its value */
    int32_t part;
    int64_t next;
    while (kg_offsets_next_committable(t, &part, &next)) {
        ck_assert(model[part].assigned);
        ck_assert_int_eq(next, prefix_next[part]);
        ck_assert_int_gt(next, model[part].stored);
        model[part].stored = next;
    }
    for (int p = 0; p < M_PART; p++) {
        ck_assert(!model[p].assigned || prefix_next[p] <= model[p].stored);
    }
    kg_offsets_free(t);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("offsets");
    TCase *tc = tcase_create("order");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, in_order);
    tcase_add_test(tc, out_of_order);
    tcase_add_test(tc, reverse_order);
    tcase_add_test(tc, iterator_reports_once);
    tcase_add_test(tc, gaps);
    tcase_add_test(tc, bad_calls);
    suite_add_tcase(s, tc);

    tc = tcase_create("revoke");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, revoke);
    tcase_add_test(tc, cap);
    suite_add_tcase(s, tc);

    tc = tcase_create("scale");
    tcase_add_test(tc, many_partitions);
    tcase_add_test(tc, many_in_flight);
    suite_add_tcase(s, tc);

    tc = tcase_create("model");
    tcase_add_test(tc, random_vs_model);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
