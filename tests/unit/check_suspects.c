/* check_suspects: the group-testing rules for suspects (kafka/kg_suspects)
 * and, with kg_inflight_inherit (the take-over rule), whole searches: a
 * simulated fleet whose workers crash whenever a poison job runs, with the
 * record as the only state carried from one failure to the next. */
#include "check_common.h"
#include "kafka/kg_suspects.h"
#include "schema/kg_inflight.h"

#include <stdlib.h>
#include <string.h>

/* One level-1 group: everything at level 1, beside anything else, at once. */
START_TEST(level_one_runs_together) {
    kg_suspect_t s[5] = {{0, 10, 1}, {0, 11, 1}, {1, 3, 2}, {2, 7, 1}, {0, 12, 0}};
    bool pick[5];
    kg_suspects_round_t r = kg_suspects_pick(s, 5, pick);
    ck_assert_uint_eq(r.n, 4);
    ck_assert_int_eq(r.level, 1);
    ck_assert(!r.alone);
    ck_assert(pick[0] && pick[1] && !pick[2] && pick[3] && pick[4]); /* level 0 counts as 1 */
}
END_TEST

/* Above level 1: the first half of the highest level, by (partition, offset)
 * whatever the order given; one suspect alone runs solo. */
START_TEST(highest_level_is_halved) {
    kg_suspect_t s[7] = {{1, 5, 3}, {0, 9, 3}, {0, 2, 3}, {2, 1, 2},
                         {1, 4, 3}, {0, 3, 3}, {0, 1, 2}};
    bool pick[7];
    kg_suspects_round_t r = kg_suspects_pick(s, 7, pick);
    ck_assert_uint_eq(r.n, 3); /* 5 at level 3: ceil(5/2) */
    ck_assert_int_eq(r.level, 3);
    ck_assert(!r.alone);
    /* level 3 in order: (0,2) (0,3) (0,9) (1,4) (1,5) */
    ck_assert(pick[2] && pick[5] && pick[1] && !pick[4] && !pick[0] && !pick[3] && !pick[6]);

    kg_suspect_t two[2] = {{0, 8, 4}, {0, 7, 4}};
    r = kg_suspects_pick(two, 2, pick);
    ck_assert(r.n == 1 && r.alone && pick[1] && !pick[0]);

    kg_suspect_t one[1] = {{3, 8, 1}};
    r = kg_suspects_pick(one, 1, pick);
    ck_assert(r.n == 1 && r.alone && r.level == 1 && pick[0]);

    r = kg_suspects_pick(NULL, 0, pick);
    ck_assert_uint_eq(r.n, 0);
}
END_TEST

START_TEST(verdict) {
    ck_assert(!kg_suspects_is_poison(9, 9, 0)); /* off */
    ck_assert(kg_suspects_is_poison(1, 0, 1));  /* the first failure, no proof asked */
    ck_assert(!kg_suspects_is_poison(0, 0, 1));
    /* 2: one failure alone on its worker; any number in groups is not enough */
    ck_assert(!kg_suspects_is_poison(7, 0, 2));
    ck_assert(kg_suspects_is_poison(2, 1, 2));
    ck_assert(!kg_suspects_is_poison(3, 1, 3));
    ck_assert(kg_suspects_is_poison(4, 2, 3));
}
END_TEST

// ---- whole searches, the record as the only state ----

#define MAX_JOBS 64

/* The record of one partition, one run per job (offset = index). */
typedef struct sim {
    kg_inflight_run_t run[MAX_JOBS];
    bool gone[MAX_JOBS]; /* answered: done or poisoned */
    bool poisoned[MAX_JOBS];
    int n, poison_after;
    int failures;
} sim_t;

static void sim_init(sim_t *m, int n, int poison_after) {
    memset(m, 0, sizeof(*m));
    m->n = n;
    m->poison_after = poison_after;
    for (int i = 0; i < n; i++) {
        m->run[i] = (kg_inflight_run_t){.offset = i, .count = 1, .started = true};
    }
}

/* The owner dies: its snapshot (not clean) goes through the take-over rule. */
static void sim_fail(sim_t *m) {
    kg_inflight_t s = {.epoch = 1, .clean = false, .n_runs = 0};
    kg_inflight_run_t runs[MAX_JOBS];
    for (int i = 0; i < m->n; i++) {
        if (!m->gone[i] && (m->run[i].started || m->run[i].strikes > 0)) {
            runs[s.n_runs++] = m->run[i];
        }
    }
    s.runs = runs;
    kg_inflight_run_t *out;
    size_t n_out;
    ck_assert(kg_inflight_inherit(&s, -1, &out, &n_out) == KG_OK);
    for (int i = 0; i < m->n; i++) {
        m->run[i].started = m->run[i].solo = false;
    }
    for (size_t k = 0; k < n_out; k++) {
        ck_assert_int_eq(out[k].count, 1);
        m->run[out[k].offset] = out[k];
    }
    free(out);
    m->failures++;
}

/* Run the search to its end: `poison` (a set) crashes every worker that
 * runs it, `kills` more failures with no culprit hit the first groups.
 * Returns the groups run. */
static int sim_search(sim_t *m, const bool *poison, int kills) {
    int n_groups = 0;
    for (int guard = 0; guard < 1000; guard++) {
        kg_suspect_t s[MAX_JOBS];
        int idx[MAX_JOBS];
        size_t n = 0;
        for (int i = 0; i < m->n; i++) {
            if (m->gone[i]) {
                continue;
            }
            if (kg_suspects_is_poison(m->run[i].strikes, m->run[i].alone, m->poison_after)) {
                m->gone[i] = m->poisoned[i] = true;
                continue;
            }
            s[n] = (kg_suspect_t){.partition = 0, .offset = i, .level = m->run[i].level};
            idx[n++] = i;
        }
        if (n == 0) {
            return n_groups;
        }
        bool pick[MAX_JOBS];
        kg_suspects_round_t r = kg_suspects_pick(s, n, pick);
        ck_assert_uint_gt(r.n, 0);
        n_groups++;
        bool crash = kills-- > 0;
        for (size_t k = 0; k < n; k++) {
            if (pick[k]) {
                m->run[idx[k]].started = true;
                m->run[idx[k]].solo = r.alone;
                crash |= poison[idx[k]];
            }
        }
        if (crash) {
            sim_fail(m);
        } else {
            for (size_t k = 0; k < n; k++) {
                m->gone[idx[k]] |= pick[k]; /* done */
            }
        }
    }
    ck_abort_msg("the search did not end");
    return -1;
}

/* 32 jobs running, one of them poison: it is answered after at most
 * 2 + log2(32) failures (the first, the level-1 group, five halvings, the
 * last of them solo);
 * the 31 others finish, most of them in groups. */
START_TEST(one_poison_in_32) {
    for (int p = 0; p < 32; p++) {
        sim_t m;
        sim_init(&m, 32, 2);
        bool poison[MAX_JOBS] = {false};
        poison[p] = true;
        sim_fail(&m); /* the crash that made them suspects */
        int groups = sim_search(&m, poison, 0);
        for (int i = 0; i < 32; i++) {
            ck_assert_msg(m.poisoned[i] == (i == p), "job %d (poison %d)", i, p);
        }
        ck_assert_int_le(m.failures, 2 + 5);
        ck_assert_int_ge(m.failures, 2 + 1);
        ck_assert_int_le(groups, 16); /* one at a time would take 32 */
    }
}
END_TEST

/* A kill of a batch of innocents: one level-1 group, no further failure. */
START_TEST(innocent_batch_runs_once) {
    sim_t m;
    sim_init(&m, 32, 2);
    bool poison[MAX_JOBS] = {false};
    sim_fail(&m);
    ck_assert_int_eq(sim_search(&m, poison, 0), 1);
    ck_assert_int_eq(m.failures, 1);
    for (int i = 0; i < 32; i++) {
        ck_assert(!m.poisoned[i]);
    }
}
END_TEST

/* No innocent is ever answered poisoned because of another job: any two
 * poison jobs among 12, with --poison-after 2 and 3, each with up to two
 * kills with no culprit on top; every poison job is found. */
START_TEST(innocents_never_poisoned) {
    for (int after = 2; after <= 3; after++) {
        for (int kills = 0; kills <= 2; kills++) {
            for (int a = 0; a < 12; a++) {
                for (int b = a; b < 12; b++) {
                    sim_t m;
                    sim_init(&m, 12, after);
                    bool poison[MAX_JOBS] = {false};
                    poison[a] = poison[b] = true;
                    sim_fail(&m);
                    sim_search(&m, poison, kills);
                    for (int i = 0; i < 12; i++) {
                        ck_assert_msg(m.poisoned[i] == poison[i],
                                      "after=%d kills=%d poison %d,%d: job %d", after, kills, a, b,
                                      i);
                    }
                }
            }
        }
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("suspects");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, level_one_runs_together);
    tcase_add_test(tc, highest_level_is_halved);
    tcase_add_test(tc, verdict);
    suite_add_tcase(s, tc);
    TCase *sim = tcase_create("search");
    tcase_add_test(sim, one_poison_in_32);
    tcase_add_test(sim, innocent_batch_runs_once);
    tcase_add_test(sim, innocents_never_poisoned);
    suite_add_tcase(s, sim);
    return s;
}

KG_CHECK_MAIN(make_suite)
