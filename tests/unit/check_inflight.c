/* check_inflight: the poison-job journal's record (schema/kg_inflight):
 * snapshots round-trip, malformed ones are refused with a reason, and the
 * strikes a new owner takes over follow the rule: a failed owner's running
 * jobs get one more, waiting ones keep theirs, a clean hand-over adds none,
 * finished (below the committed offset) and strike-free jobs drop out. */
#include "check_common.h"
#include "schema/kg_inflight.h"

#include <string.h>

static kg_inflight_t decode_ok(const char *text) {
    kg_inflight_t s;
    char err[256];
    ck_assert_msg(kg_inflight_decode(text, strlen(text), &s, err, sizeof(err)) == KG_OK, "%s: %s",
                  text, err);
    return s;
}

START_TEST(round_trip) {
    kg_inflight_run_t runs[] = {{.offset = 10, .count = 3, .strikes = 0, .started = true},
                                {.offset = 20, .count = 1, .strikes = 1, .started = false}};
    kg_inflight_t s = {.jobs_topic = "kgen.jobs",
                       .partition = 5,
                       .worker_id = "w-1",
                       .epoch = 1718000000123,
                       .seq = 42,
                       .clean = false,
                       .runs = runs,
                       .n_runs = 2};
    size_t len;
    char *text = kg_inflight_encode(&s, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_str_eq(text, "{\"v\":1,\"jobs_topic\":\"kgen.jobs\",\"partition\":5,\"worker_id\":"
                           "\"w-1\",\"epoch\":1718000000123,\"seq\":42,\"clean\":false,\"runs\":"
                           "[[10,3,0,true],[20,1,1,false]]}");
    kg_inflight_t d = decode_ok(text);
    ck_assert_str_eq(d.jobs_topic, "kgen.jobs");
    ck_assert_str_eq(d.worker_id, "w-1");
    ck_assert_int_eq(d.partition, 5);
    ck_assert_int_eq(d.epoch, 1718000000123LL);
    ck_assert_int_eq(d.seq, 42);
    ck_assert(!d.clean);
    ck_assert_uint_eq(d.n_runs, 2);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(d.runs[i].offset == runs[i].offset && d.runs[i].count == runs[i].count &&
                  d.runs[i].strikes == runs[i].strikes && d.runs[i].started == runs[i].started);
    }
    kg_inflight_clear(&d);
    free(text);

    s.n_runs = 0;
    s.clean = true;
    text = kg_inflight_encode(&s, &len);
    d = decode_ok(text);
    ck_assert(d.clean && d.n_runs == 0);
    kg_inflight_clear(&d);
    free(text);
}
END_TEST

START_TEST(malformed_is_refused) {
    static const char *const bad[] = {
        "",
        "not json",
        "[]",
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[]}",
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":-1,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[]}",
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":0,\"runs\":[]}",
        "{\"v\":1,\"jobs_topic\":7,\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[]}",
        /* not sorted */
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,0,true],[3,1,0,true]]}",
        /* overlapping */
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,3,0,true],[7,1,0,true]]}",
        /* count 0, strikes out of range, a run too long, offset overflow */
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,0,0,true]]}",
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,256,true]]}",
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1048577,0,true]]}",
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[9223372036854775807,2,0,true]]}",
        /* a duplicate key */
        "{\"v\":1,\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,"
        "\"seq\":1,\"clean\":false,\"runs\":[]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kg_inflight_t s;
        char err[256] = "";
        ck_assert_msg(kg_inflight_decode(bad[i], strlen(bad[i]), &s, err, sizeof(err)) ==
                          KG_ERR_INVALID,
                      "accepted: %s", bad[i]);
        ck_assert_msg(strncmp(err, "in-flight snapshot: ", 20) == 0, "%s", err);
        ck_assert_ptr_null(s.runs);
    }
}
END_TEST

/* A failed owner: running jobs get a strike; waiting ones keep theirs; no
 * strike, no record; below the committed offset, finished. */
START_TEST(inherit_after_a_failure) {
    kg_inflight_t s = decode_ok(
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":false,\"runs\":[[100,4,0,true],[104,1,1,true],[105,2,1,false],[107,1,0,false]]"
        "}");
    kg_inflight_run_t *runs;
    size_t n;
    ck_assert_int_eq(kg_inflight_inherit(&s, -1, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert(runs[0].offset == 100 && runs[0].count == 4 && runs[0].strikes == 1);
    ck_assert(runs[1].offset == 104 && runs[1].count == 1 && runs[1].strikes == 2);
    ck_assert(runs[2].offset == 105 && runs[2].count == 2 && runs[2].strikes == 1);
    for (size_t i = 0; i < n; i++) {
        ck_assert(!runs[i].started);
    }
    free(runs);

    /* committed at 102: 100 and 101 are finished */
    ck_assert_int_eq(kg_inflight_inherit(&s, 102, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert(runs[0].offset == 102 && runs[0].count == 2 && runs[0].strikes == 1);
    free(runs);
    kg_inflight_clear(&s);
}
END_TEST

/* A clean hand-over (revoke, SIGTERM) is no failure: nothing gains a strike. */
START_TEST(inherit_after_a_clean_handover) {
    kg_inflight_t s = decode_ok(
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":true,\"runs\":[[100,4,0,true],[104,1,1,true]]}");
    kg_inflight_run_t *runs;
    size_t n;
    ck_assert_int_eq(kg_inflight_inherit(&s, -1, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert(runs[0].offset == 104 && runs[0].strikes == 1 && !runs[0].started);
    free(runs);
    kg_inflight_clear(&s);

    /* nothing to take over */
    kg_inflight_t none = {0};
    ck_assert_int_eq(kg_inflight_inherit(&none, -1, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(runs);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("inflight");
    TCase *tc = tcase_create("inflight");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, malformed_is_refused);
    tcase_add_test(tc, inherit_after_a_failure);
    tcase_add_test(tc, inherit_after_a_clean_handover);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
