/* check_inflight: the poison-job journal's record (schema/kg_inflight):
 * snapshots round-trip, malformed ones are refused with a reason, version 1
 * records are still read, and the strikes a new owner takes over follow the
 * rule: a failed owner's running jobs get one more (and a level; alone when
 * solo), waiting ones keep theirs (back to level 1 when their level ran), a
 * clean hand-over adds none, finished (below the committed offset) and
 * strike-free jobs drop out. */
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
                                {.offset = 20, .count = 1, .strikes = 1, .started = false},
                                {.offset = 30,
                                 .count = 1,
                                 .strikes = 4,
                                 .started = true,
                                 .level = 3,
                                 .alone = 1,
                                 .solo = true}};
    kg_inflight_t s = {.jobs_topic = "kgen.jobs",
                       .partition = 5,
                       .worker_id = "w-1",
                       .epoch = 1718000000123,
                       .seq = 42,
                       .clean = false,
                       .runs = runs,
                       .n_runs = 3};
    size_t len;
    char *text = kg_inflight_encode(&s, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_str_eq(text, "{\"v\":2,\"jobs_topic\":\"kgen.jobs\",\"partition\":5,\"worker_id\":"
                           "\"w-1\",\"epoch\":1718000000123,\"seq\":42,\"clean\":false,\"runs\":"
                           "[[10,3,0,true,0,0,false],[20,1,1,false,0,0,false],"
                           "[30,1,4,true,3,1,true]]}");
    kg_inflight_t d = decode_ok(text);
    ck_assert_str_eq(d.jobs_topic, "kgen.jobs");
    ck_assert_str_eq(d.worker_id, "w-1");
    ck_assert_int_eq(d.partition, 5);
    ck_assert_int_eq(d.epoch, 1718000000123LL);
    ck_assert_int_eq(d.seq, 42);
    ck_assert(!d.clean);
    ck_assert_uint_eq(d.n_runs, 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert(d.runs[i].offset == runs[i].offset && d.runs[i].count == runs[i].count &&
                  d.runs[i].strikes == runs[i].strikes && d.runs[i].started == runs[i].started &&
                  d.runs[i].level == runs[i].level && d.runs[i].alone == runs[i].alone &&
                  d.runs[i].solo == runs[i].solo);
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
        "{\"v\":3,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[]}",
        /* a version-2 run in a version-1 record, and the other way round */
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,0,true,0,0,false]]}",
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,0,true]]}",
        /* level or alone above the strikes, solo while waiting, a level that is no integer */
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,2,true,3,0,false]]}",
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,2,true,1,3,false]]}",
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,2,false,1,0,true]]}",
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":1,\"seq\":1,"
        "\"clean\":false,\"runs\":[[5,1,2,true,true,0,false]]}",
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

/* A version-1 record (kgen before group testing): level = strikes, never
 * alone or solo. */
START_TEST(version_one_is_read) {
    kg_inflight_t s = decode_ok(
        "{\"v\":1,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":false,\"runs\":[[100,1,1,true],[101,2,2,false]]}");
    ck_assert_uint_eq(s.n_runs, 2);
    ck_assert(s.runs[0].level == 1 && s.runs[0].alone == 0 && !s.runs[0].solo);
    ck_assert(s.runs[1].level == 2 && s.runs[1].alone == 0);
    kg_inflight_clear(&s);
}
END_TEST

/* The search goes on across owners: the half that ran (level 3) goes up, the
 * solo job gets its alone failure, the waiting half of level 3 goes back to
 * level 1, waiting jobs of another level and fresh ones keep theirs/start. */
START_TEST(inherit_moves_the_search) {
    kg_inflight_t s = decode_ok(
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":false,\"runs\":[[100,2,3,true,3,0,false],[102,2,3,false,3,0,false],"
        "[104,1,2,false,2,0,false],[105,1,0,true,0,0,false]]}");
    kg_inflight_run_t *runs;
    size_t n;
    ck_assert_int_eq(kg_inflight_inherit(&s, -1, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert(runs[0].offset == 100 && runs[0].strikes == 4 && runs[0].level == 4 &&
              runs[0].alone == 0);
    ck_assert(runs[1].offset == 102 && runs[1].strikes == 3 && runs[1].level == 1);
    ck_assert(runs[2].offset == 104 && runs[2].strikes == 2 && runs[2].level == 2);
    ck_assert(runs[3].offset == 105 && runs[3].strikes == 1 && runs[3].level == 1);
    free(runs);
    kg_inflight_clear(&s);

    s = decode_ok(
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":false,\"runs\":[[100,1,5,true,5,0,true],[101,1,5,false,5,0,false]]}");
    ck_assert_int_eq(kg_inflight_inherit(&s, -1, &runs, &n), KG_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert(runs[0].strikes == 6 && runs[0].level == 6 && runs[0].alone == 1 && !runs[0].solo);
    ck_assert(runs[1].level == 1);
    free(runs);
    kg_inflight_clear(&s);

    /* clean: nothing moves */
    s = decode_ok(
        "{\"v\":2,\"jobs_topic\":\"j\",\"partition\":0,\"worker_id\":\"w\",\"epoch\":9,\"seq\":3,"
        "\"clean\":true,\"runs\":[[100,1,5,true,5,0,true],[101,1,5,false,5,0,false]]}");
    ck_assert_int_eq(kg_inflight_inherit(&s, -1, &runs, &n), KG_OK);
    ck_assert(n == 2 && runs[0].level == 5 && runs[0].alone == 0 && runs[1].level == 5);
    free(runs);
    kg_inflight_clear(&s);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("inflight");
    TCase *tc = tcase_create("inflight");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, version_one_is_read);
    tcase_add_test(tc, inherit_moves_the_search);
    tcase_add_test(tc, malformed_is_refused);
    tcase_add_test(tc, inherit_after_a_failure);
    tcase_add_test(tc, inherit_after_a_clean_handover);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
