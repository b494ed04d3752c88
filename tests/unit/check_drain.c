/* check_drain: the drain-time estimate behind kgen_estimated_drain_seconds: none before a job
 * time is known, lag x job time / slots, smoothing of both the job time and the estimate. */
#include "check_common.h"
#include "metrics/kg_drain.h"

START_TEST(no_estimate_without_a_job) {
    kg_drain_t d;
    kg_drain_init(&d);
    ck_assert(kg_drain_seconds(&d) < 0);
    ck_assert(kg_drain_update(&d, 1000, 4, 8) < 0);
    ck_assert(kg_drain_seconds(&d) < 0);
}
END_TEST

START_TEST(lag_times_job_time_over_slots) {
    kg_drain_t d;
    kg_drain_init(&d);
    kg_drain_observe_job(&d, 2000000); /* 2 s a job */
    /* (96 behind + 4 in flight) x 2 s / 8 slots = 25 s: the first update is taken as is */
    ck_assert_double_eq_tol(kg_drain_update(&d, 96, 4, 8), 25.0, 1e-9);
    ck_assert_double_eq_tol(kg_drain_seconds(&d), 25.0, 1e-3);
    /* an empty backlog: the smoothed estimate falls by 30% of the gap per update */
    ck_assert_double_eq_tol(kg_drain_update(&d, 0, 0, 8), 17.5, 1e-9);
    for (int i = 0; i < 60; i++) {
        kg_drain_update(&d, 0, 0, 8);
    }
    ck_assert(kg_drain_seconds(&d) < 0.01);
    /* zero slots and negative counts are read as 1 slot and nothing */
    kg_drain_t z;
    kg_drain_init(&z);
    kg_drain_observe_job(&z, 1000000);
    ck_assert_double_eq_tol(kg_drain_update(&z, 10, -5, 0), 10.0, 1e-9);
}
END_TEST

START_TEST(job_time_is_smoothed) {
    kg_drain_t d;
    kg_drain_init(&d);
    kg_drain_observe_job(&d, 1000000);
    kg_drain_observe_job(&d, 11000000); /* one slow job moves the mean by a tenth of the gap */
    ck_assert_double_eq_tol(d.job_s, 2.0, 1e-9);
    for (int i = 0; i < 200; i++) {
        kg_drain_observe_job(&d, 500000);
    }
    ck_assert_double_eq_tol(d.job_s, 0.5, 1e-6);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("drain");
    TCase *tc = tcase_create("estimate");
    tcase_add_test(tc, no_estimate_without_a_job);
    tcase_add_test(tc, lag_times_job_time_over_slots);
    tcase_add_test(tc, job_time_is_smoothed);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
