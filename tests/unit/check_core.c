/* check_core: status names, the logger's line format and the thread pool
 * (every task once per run, results visible on return, whether the workers
 * were polling or asleep when the run came). */
#include "check_common.h"
#include "core/kg_log.h"
#include "core/kg_parse.h"
#include "core/kg_pool.h"
#include "core/kg_status.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

START_TEST(status_names) {
    ck_assert_str_eq(kg_status_str(KG_OK), "ok");
    ck_assert_str_eq(kg_status_str(KG_KV_FULL), "kv cache full");
    ck_assert_str_eq(kg_status_str(KG_ERR_INVALID), "invalid argument");
    ck_assert_str_eq(kg_status_str((kg_status_t)12345), "unknown status");
}
END_TEST

/* Capture what one log call writes to stderr. */
static char *capture_log(kg_log_format_t fmt, const char *msg) {
    fflush(stderr);
    int saved = dup(2);
    const char *path = kg_test_tmp_path("log");
    FILE *f = fopen(path, "w");
    dup2(fileno(f), 2);
    kg_log_setup(KG_LOG_LEVEL_DEBUG, fmt);
    KG_LOG_INFO("engine", "%s", msg);
    KG_LOG_DEBUG("engine", "hidden? %d", 1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    kg_log_setup(KG_LOG_LEVEL_INFO, KG_LOG_FORMAT_LOGFMT);
    return kg_test_read_file(path, NULL);
}

START_TEST(logfmt_line) {
    char *out = capture_log(KG_LOG_FORMAT_LOGFMT, "job done request_id=r1 partition=3");
    ck_assert_ptr_nonnull(
        strstr(out, "level=info module=engine msg=\"job done\" request_id=r1 partition=3\n"));
    ck_assert_ptr_nonnull(strstr(out, "msg=\"hidden? 1\""));
    free(out);
}
END_TEST

/* A message whose text has a '=' in the middle keeps it in msg (issue 30: a line broke its own
 * quoting), and only a tail that is all pairs becomes fields; values that are not plain words
 * are quoted. */
START_TEST(logfmt_text_with_equals) {
    char *out = capture_log(KG_LOG_FORMAT_LOGFMT,
                            "protection is off (create it with cleanup.policy=compact and as many "
                            "partitions as the jobs topic) topic=kgen.jobs.inflight");
    ck_assert_ptr_nonnull(strstr(out, "msg=\"protection is off (create it with "
                                      "cleanup.policy=compact and as many partitions as the jobs "
                                      "topic)\" topic=kgen.jobs.inflight\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "a=b c d=\"e f\" g=h=i j=");
    ck_assert_ptr_nonnull(strstr(out, "msg=\"a=b c\" d=\"e f\" g=\"h=i\" j=\"\"\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "no pairs = here x=\"unclosed");
    ck_assert_ptr_nonnull(strstr(out, "msg=\"no pairs = here x=\\\"unclosed\"\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_JSON, "create with cleanup.policy=compact and more n=2");
    ck_assert_ptr_nonnull(
        strstr(out, "\"msg\":\"create with cleanup.policy=compact and more\",\"n\":\"2\"}\n"));
    free(out);
}
END_TEST

/* A message longer than a line still ends in a closed quote and a newline. */
START_TEST(logfmt_long_line_closes) {
    char big[3000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    char *out = capture_log(KG_LOG_FORMAT_LOGFMT, big);
    char *nl = strchr(out, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert_int_eq(nl[-1], '"');
    free(out);
}
END_TEST

/* Strict numbers: the whole string, in range, finite; a failure leaves the output alone. */
START_TEST(strict_numbers) {
    int64_t i = 7;
    ck_assert(kg_parse_i64("42", 0, 100, &i) && i == 42);
    ck_assert(kg_parse_i64("-5", -10, 10, &i) && i == -5);
    ck_assert(!kg_parse_i64("101", 0, 100, &i) && i == -5);
    ck_assert(!kg_parse_i64("4x", 0, 100, &i));
    ck_assert(!kg_parse_i64("", 0, 100, &i));
    ck_assert(!kg_parse_i64("99999999999999999999", INT64_MIN, INT64_MAX, &i));
    float f = 1.0f;
    ck_assert(kg_parse_f32("0.5", 0.0f, 1.0f, &f) && f == 0.5f);
    ck_assert(!kg_parse_f32("nan", -1e9f, 1e9f, &f) && f == 0.5f);
    ck_assert(!kg_parse_f32("inf", -1e9f, 1e9f, &f));
    ck_assert(!kg_parse_f32("1e40", -1e9f, 1e9f, &f));
    ck_assert(!kg_parse_f32("2", 0.0f, 1.0f, &f));
    ck_assert(!kg_parse_f32("0.5 ", 0.0f, 1.0f, &f));
}
END_TEST

START_TEST(json_line) {
    char *out = capture_log(KG_LOG_FORMAT_JSON, "said \"hi\" request_id=r1 reason=\"bad json\"");
    ck_assert_ptr_nonnull(
        strstr(out, "\"msg\":\"said \\\"hi\\\"\",\"request_id\":\"r1\",\"reason\":\"bad json\"}"));
    free(out);
}
END_TEST

/* A thread's scope fields (a job's trace_id) follow every line's own pairs, in both formats,
 * once: a key the line already has is not repeated; scopes nest and clear. */
START_TEST(log_scope_fields) {
    const char *prev = kg_log_scope(" trace_id=4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_ptr_null(prev);
    char *out = capture_log(KG_LOG_FORMAT_LOGFMT, "job done request_id=r1");
    ck_assert_ptr_nonnull(
        strstr(out, "msg=\"job done\" request_id=r1 trace_id=4bf92f3577b34da6a3ce929d0e0e4736\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "no pairs here");
    ck_assert_ptr_nonnull(
        strstr(out, "msg=\"no pairs here\" trace_id=4bf92f3577b34da6a3ce929d0e0e4736\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "given trace_id=x");
    ck_assert_ptr_nonnull(strstr(out, "msg=\"given\" trace_id=x\n"));
    free(out);
    out = capture_log(KG_LOG_FORMAT_JSON, "job done request_id=r1");
    ck_assert_ptr_nonnull(
        strstr(out, "\"request_id\":\"r1\",\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\"}"));
    free(out);
    const char *outer = kg_log_scope(" trace_id=inner");
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "x");
    ck_assert_ptr_nonnull(strstr(out, "msg=\"x\" trace_id=inner\n"));
    free(out);
    kg_log_scope(outer);
    kg_log_scope(prev);
    out = capture_log(KG_LOG_FORMAT_LOGFMT, "cleared");
    ck_assert_ptr_null(strstr(out, "trace_id"));
    free(out);
}
END_TEST

START_TEST(level_parse) {
    ck_assert_int_eq(kg_log_level_parse("debug"), KG_LOG_LEVEL_DEBUG);
    ck_assert_int_eq(kg_log_level_parse("warn"), KG_LOG_LEVEL_WARN);
    ck_assert_int_eq(kg_log_level_parse("loud"), -1);
}
END_TEST

// ---- kg_pool ----

#define POOL_TASKS 257

typedef struct pool_run {
    int32_t hits[POOL_TASKS]; /* plain ints: the pool must publish them */
    int n_threads;
    _Atomic int bad_thread;
} pool_run_t;

static void count_task(void *ctx, int64_t task, int thread) {
    pool_run_t *r = ctx;
    r->hits[task]++;
    if (thread < 0 || thread >= r->n_threads) {
        atomic_store(&r->bad_thread, 1);
    }
}

/* Many runs back to back (the workers are still polling when the next one
 * comes) and runs after a pause (they have gone to sleep): every task runs
 * exactly once per run, on a valid thread index, and its writes are visible
 * when kg_pool_run returns. 4 threads oversubscribe this 2-core machine. */
START_TEST(pool_runs_every_task_once) {
    static const int threads[] = {1, 2, 4};
    for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
        kg_pool_t *pool = kg_pool_new(threads[ti]);
        ck_assert_ptr_nonnull(pool);
        ck_assert_int_eq(kg_pool_n_threads(pool), threads[ti]);
        static pool_run_t r;
        for (int run = 0; run < 2000; run++) {
            memset(r.hits, 0, sizeof(r.hits));
            r.n_threads = threads[ti];
            atomic_store(&r.bad_thread, 0);
            const int64_t n = 1 + run % POOL_TASKS;
            kg_pool_run(pool, n, count_task, &r);
            for (int64_t t = 0; t < POOL_TASKS; t++) {
                ck_assert_msg(r.hits[t] == (t < n ? 1 : 0), "threads %d run %d task %lld: %d hits",
                              threads[ti], run, (long long)t, r.hits[t]);
            }
            ck_assert_int_eq(atomic_load(&r.bad_thread), 0);
            if (run % 100 == 99) {
                usleep(2000); /* well past the polling window: the workers sleep */
            }
        }
        kg_pool_free(pool);
    }
}
END_TEST

/* Freeing a pool right after a run (workers polling) and after a pause
 * (workers asleep) joins every thread. */
START_TEST(pool_free_polling_or_asleep) {
    for (int i = 0; i < 50; i++) {
        kg_pool_t *pool = kg_pool_new(3);
        ck_assert_ptr_nonnull(pool);
        static pool_run_t r;
        memset(r.hits, 0, sizeof(r.hits));
        r.n_threads = 3;
        kg_pool_run(pool, 64, count_task, &r);
        if (i % 2) {
            usleep(1000);
        }
        kg_pool_free(pool);
    }
    kg_pool_free(NULL);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("status");
    tcase_add_test(tc, status_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("log");
    tcase_add_test(tc, logfmt_line);
    tcase_add_test(tc, json_line);
    tcase_add_test(tc, strict_numbers);
    tcase_add_test(tc, logfmt_text_with_equals);
    tcase_add_test(tc, logfmt_long_line_closes);
    tcase_add_test(tc, level_parse);
    tcase_add_test(tc, log_scope_fields);
    suite_add_tcase(s, tc);
    tc = tcase_create("pool");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, pool_runs_every_task_once);
    tcase_add_test(tc, pool_free_polling_or_asleep);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
