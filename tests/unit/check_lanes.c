/* check_lanes: --jobs-topic parsing (a plain name is one lane, weights, errors), weighted fair
 * picking (shares by weight under backlog, no credit for idling, an arriving lane goes next,
 * no starvation), the pause thresholds (lowest weight first) and the room each lane has in the
 * engine by tier (the admission decision that lets a higher lane preempt). */
#include "check_common.h"
#include "kafka/kg_lanes.h"

#include <string.h>

static kg_lanes_t parse_ok(const char *spec) {
    kg_lanes_t l;
    char err[256] = "";
    ck_assert_msg(kg_lanes_parse(spec, &l, err, sizeof(err)) == KG_OK, "%s: %s", spec, err);
    return l;
}

START_TEST(parse) {
    kg_lanes_t l = parse_ok("kgen.jobs");
    ck_assert_int_eq(l.n, 1);
    ck_assert_str_eq(l.lane[0].topic, "kgen.jobs");
    ck_assert_int_eq(l.lane[0].weight, 1);
    l = parse_ok("kgen.jobs.interactive:8,kgen.jobs.bulk:1");
    ck_assert_int_eq(l.n, 2);
    ck_assert_str_eq(l.lane[1].topic, "kgen.jobs.bulk");
    ck_assert_int_eq(l.lane[0].weight, 8);
    ck_assert_int_eq(l.lane[0].rank, 0);
    ck_assert_int_eq(l.lane[1].rank, 1);
    l = parse_ok("a:1,b:5,c");
    ck_assert_int_eq(l.lane[1].rank, 0);
    ck_assert_int_eq(l.lane[0].rank, 1); /* equal weights: the order given */
    ck_assert_int_eq(l.lane[2].rank, 2);
    static const char *bad[] = {"",   "a,",    ",a",   "a:0", "a:1001", "a:x",
                                "a:", "a:1,a", "a:-1", ":3",  "a:1:2",  "1,2,3,4,5,6,7,8,9"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        ck_assert_msg(kg_lanes_parse(bad[i], &l, err, sizeof(err)) == KG_ERR_INVALID, "%s", bad[i]);
        ck_assert(err[0] != '\0');
    }
}
END_TEST

START_TEST(shares_by_weight) {
    kg_lanes_t l = parse_ok("hi:8,lo:1");
    bool both[2] = {true, true};
    int n[2] = {0, 0};
    for (int i = 0; i < 900; i++) {
        n[kg_lanes_pick(&l, both)]++;
    }
    ck_assert_int_eq(n[0], 800);
    ck_assert_int_eq(n[1], 100);
    /* in every window of 9 picks the low lane gets one: it never starves */
    int since_lo = 0;
    for (int i = 0; i < 90; i++) {
        since_lo = kg_lanes_pick(&l, both) == 1 ? 0 : since_lo + 1;
        ck_assert_int_le(since_lo, 8);
    }
}
END_TEST

START_TEST(arriving_lane_goes_next) {
    kg_lanes_t l = parse_ok("hi:8,lo:1");
    bool lo_only[2] = {false, true}, both[2] = {true, true}, none[2] = {false, false};
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_eq(kg_lanes_pick(&l, lo_only), 1); /* a bulk backlog alone */
    }
    /* an interactive job arrives: it goes next, and the idle time gave it no burst beyond its
     * share: with both backlogged, 8 of every 9 (one stride of the low lane in hand) */
    ck_assert_int_eq(kg_lanes_pick(&l, both), 0);
    int hi = 1;
    for (int i = 1; i < 90; i++) {
        hi += kg_lanes_pick(&l, both) == 0;
    }
    ck_assert_int_ge(hi, 80);
    ck_assert_int_le(hi, 81);
    ck_assert_int_eq(kg_lanes_pick(&l, none), -1);
    /* a low lane that idled while the high one ran does not get a burst either */
    bool hi_only[2] = {true, false};
    for (int i = 0; i < 1000; i++) {
        kg_lanes_pick(&l, hi_only);
    }
    int lo = 0;
    for (int i = 0; i < 18; i++) {
        lo += kg_lanes_pick(&l, both) == 1;
    }
    ck_assert_int_le(lo, 3);
}
END_TEST

START_TEST(pause_lowest_first) {
    kg_lanes_t l = parse_ok("bulk:1,interactive:8");
    ck_assert_int_eq(kg_lanes_pause_at(&l, 1, 80), 80); /* the highest pauses at the cap */
    ck_assert_int_eq(kg_lanes_pause_at(&l, 0, 80), 60); /* the lowest at 3/4 */
    l = parse_ok("a:4,b:2,c:1");
    ck_assert_int_eq(kg_lanes_pause_at(&l, 0, 80), 80);
    ck_assert_int_eq(kg_lanes_pause_at(&l, 1, 80), 70);
    ck_assert_int_eq(kg_lanes_pause_at(&l, 2, 80), 60);
    l = parse_ok("only");
    ck_assert_int_eq(kg_lanes_pause_at(&l, 0, 80), 80); /* one lane: as before */
}
END_TEST

/* The admission decision for the engine: tiers by distinct weight (the engine preempts lower
 * tiers for higher ones), and lower lanes' jobs in the engine do not keep a higher lane out. */
START_TEST(room_by_tier) {
    kg_lanes_t l = parse_ok("interactive:8,bulk:1");
    ck_assert_int_eq(l.lane[0].tier, 1);
    ck_assert_int_eq(l.lane[1].tier, 0);
    int32_t in_engine[2] = {0, 18}; /* a batch of 16 and the slack, all bulk */
    ck_assert(!kg_lanes_has_room(&l, 1, in_engine, 18));
    ck_assert(kg_lanes_has_room(&l, 0, in_engine, 18)); /* interactive goes in, to preempt */
    in_engine[0] = 17;
    ck_assert(kg_lanes_has_room(&l, 0, in_engine, 18));
    in_engine[0] = 18; /* interactive jobs alone fill the room: bulk waits too */
    ck_assert(!kg_lanes_has_room(&l, 0, in_engine, 18));
    in_engine[1] = 0;
    ck_assert(!kg_lanes_has_room(&l, 1, in_engine, 18));
    l = parse_ok("a:4,b:1,c:4,d:2,e:1");
    const int32_t tier[5] = {2, 0, 2, 1, 0}; /* equal weights share a tier */
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(l.lane[i].tier, tier[i]);
    }
    int32_t n[5] = {0, 9, 0, 0, 0}; /* b counts for e (same tier), not for d above it */
    ck_assert(!kg_lanes_has_room(&l, 4, n, 9));
    ck_assert(kg_lanes_has_room(&l, 3, n, 9));
    n[2] = 9; /* c counts for a (same tier) */
    ck_assert(!kg_lanes_has_room(&l, 0, n, 9));
    ck_assert(parse_ok("only").lane[0].tier == 0); /* one lane: tier 0, no preemption */
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("lanes");
    TCase *tc = tcase_create("lanes");
    tcase_add_test(tc, parse);
    tcase_add_test(tc, shares_by_weight);
    tcase_add_test(tc, arriving_lane_goes_next);
    tcase_add_test(tc, pause_lowest_first);
    tcase_add_test(tc, room_by_tier);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
