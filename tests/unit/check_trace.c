/* check_trace: a job's trace context (kg_trace): the W3C traceparent parser (valid, and every
 * way one is not), the --propagate-headers names, the bounded copy of a job's headers (which
 * names, the last instance, the cap, an invalid traceparent still copied), deep copies, the
 * worker's span and the log fields. */
#include "check_common.h"
#include "kafka/kg_trace.h"

#include <string.h>

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static bool parse(const char *s) {
    char tid[33], pid[17];
    uint8_t flags;
    return kg_trace_parse_traceparent(s, strlen(s), tid, pid, &flags);
}

START_TEST(traceparent_valid) {
    char tid[33], pid[17];
    uint8_t flags = 0;
    ck_assert(kg_trace_parse_traceparent(TP, strlen(TP), tid, pid, &flags));
    ck_assert_str_eq(tid, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(pid, "00f067aa0ba902b7");
    ck_assert_int_eq(flags, 1);
    ck_assert(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
    ck_assert(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff"));
    /* a later version: its first fields as 00's, more after a '-' */
    ck_assert(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    ck_assert(parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future"));
    /* not NUL-terminated: the length is what counts */
    char buf[80];
    memcpy(buf, TP "xyz", sizeof(TP "xyz"));
    ck_assert(kg_trace_parse_traceparent(buf, strlen(TP), tid, pid, &flags));
}
END_TEST

START_TEST(traceparent_invalid) {
    static const char *bad[] = {
        "",
        "00",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",   /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* 00 is exactly 55 */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ", /* trailing space */
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* leading space */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  /* upper case */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  /* zero parent id */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* version ff */
        "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* version not hex */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* separator */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  /* not hex */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",  /* flags not hex */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", /* later: no '-' after */
        "00-4bf92f3577b34da6a3ce929d0e0e47-3600f067aa0ba902b7-01",  /* fields shifted */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(!parse(bad[i]), "accepted [%s]", bad[i]);
    }
    char tid[33], pid[17];
    uint8_t flags;
    ck_assert(!kg_trace_parse_traceparent(NULL, 0, tid, pid, &flags));
}
END_TEST

START_TEST(names) {
    kg_trace_names_t tn;
    char err[256] = "";
    ck_assert_int_eq(kg_trace_names_init(&tn, "", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(tn.n, 3);
    ck_assert_str_eq(tn.name[0], "traceparent");
    ck_assert_str_eq(tn.name[1], "tracestate");
    ck_assert_str_eq(tn.name[2], "baggage");
    ck_assert_int_eq(
        kg_trace_names_init(&tn, " x-tenant , b3,traceparent,x-tenant", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(tn.n, 5); /* spaces trimmed, duplicates kept once */
    ck_assert_str_eq(tn.name[3], "x-tenant");
    ck_assert_str_eq(tn.name[4], "b3");
    ck_assert_int_eq(kg_trace_names_init(&tn, "a,b,c,d,e,f,g,h,i,j,k,l,m", err, sizeof(err)),
                     KG_OK);
    ck_assert_int_eq(tn.n, 16);
    char long_name[KG_TRACE_NAME_MAX + 2];
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    const char *bad[] = {"a,,b",        ",",      "a b",         "x;y",
                         "kgen-format", "KGEN-x", "caf\xc3\xa9", "a,b,c,d,e,f,g,h,i,j,k,l,m,n",
                         long_name};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(kg_trace_names_init(&tn, bad[i], err, sizeof(err)) == KG_ERR_INVALID, "%s",
                      bad[i]);
        ck_assert_ptr_nonnull(strstr(err, "--propagate-headers"));
    }
}
END_TEST

static kg_trace_names_t names_of(const char *extra) {
    kg_trace_names_t tn;
    char err[256];
    ck_assert_int_eq(kg_trace_names_init(&tn, extra, err, sizeof(err)), KG_OK);
    return tn;
}

static const char *hdr(const kg_trace_t *t, const char *name) {
    const void *v = NULL;
    size_t n = 0;
    static char buf[20000];
    if (!t->hdrs || rd_kafka_header_get_last(t->hdrs, name, &v, &n) != 0) {
        return NULL;
    }
    memcpy(buf, v, n);
    buf[n] = '\0';
    return buf;
}

START_TEST(take_copies_the_named) {
    kg_trace_names_t tn = names_of("x-tenant");
    rd_kafka_headers_t *src = rd_kafka_headers_new(8);
    rd_kafka_header_add(src, "traceparent", -1,
                        "00-ffffffffffffffffffffffffffffffff-"
                        "1111111111111111-00",
                        -1);
    rd_kafka_header_add(src, "traceparent", -1, TP, -1); /* the last instance counts */
    rd_kafka_header_add(src, "tracestate", -1, "congo=t61rcWkgMzE", -1);
    rd_kafka_header_add(src, "baggage", -1, "userId=alice", -1);
    rd_kafka_header_add(src, "x-tenant", -1, "acme", -1);
    rd_kafka_header_add(src, "kgen-format", -1, "openai", -1); /* not named: not copied */
    rd_kafka_header_add(src, "X-Tenant", -1, "other", -1);     /* names are case-sensitive */
    kg_trace_t t;
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, KG_TRACE_BYTES_MAX), KG_OK);
    ck_assert_ptr_nonnull(t.hdrs);
    ck_assert_int_eq((int)rd_kafka_header_cnt(t.hdrs), 4);
    ck_assert_str_eq(hdr(&t, "traceparent"), TP);
    ck_assert_str_eq(hdr(&t, "tracestate"), "congo=t61rcWkgMzE");
    ck_assert_str_eq(hdr(&t, "baggage"), "userId=alice");
    ck_assert_str_eq(hdr(&t, "x-tenant"), "acme");
    ck_assert_ptr_null(hdr(&t, "kgen-format"));
    ck_assert(t.valid);
    ck_assert_str_eq(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(t.parent_id, "00f067aa0ba902b7");
    ck_assert_str_eq(t.log_fields, " trace_id=4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_uint_eq(t.hdrs_size, kg_trace_headers_size(t.hdrs));
    ck_assert_uint_eq(t.hdrs_size, strlen("traceparent" TP "tracestate"
                                          "congo=t61rcWkgMzE"
                                          "baggage"
                                          "userId=alice"
                                          "x-tenant"
                                          "acme") +
                                       4 * KG_TRACE_HEADER_OVERHEAD);
    ck_assert_int_eq(t.n_dropped, 0);
    ck_assert(t.start_unix_nano > 1600000000LL * 1000000000LL);
    char f[48];
    kg_trace_log_fields_of(t.hdrs, f, sizeof(f));
    ck_assert_str_eq(f, t.log_fields);

    /* a deep copy outlives the original */
    kg_trace_t c;
    ck_assert_int_eq(kg_trace_copy(&c, &t), KG_OK);
    kg_trace_clear(&t);
    ck_assert_ptr_null(t.hdrs);
    ck_assert_str_eq(hdr(&c, "x-tenant"), "acme");
    ck_assert_str_eq(c.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    kg_trace_clear(&c);
    kg_trace_clear(NULL);
    rd_kafka_headers_destroy(src);
}
END_TEST

/* A job with no headers, or none of the named, copies nothing and has no trace. */
START_TEST(take_nothing) {
    kg_trace_names_t tn = names_of("");
    kg_trace_t t;
    ck_assert_int_eq(kg_trace_take(&t, NULL, &tn, KG_TRACE_BYTES_MAX), KG_OK);
    ck_assert_ptr_null(t.hdrs);
    ck_assert(!t.valid);
    ck_assert_str_eq(t.log_fields, "");
    ck_assert_uint_eq(kg_trace_headers_size(t.hdrs), 0);
    kg_event_span_t sp;
    ck_assert(!kg_trace_span(&t, kg_trace_unix_nano(), &sp));
    ck_assert(!kg_trace_span(NULL, 0, &sp));
    kg_trace_clear(&t);
    rd_kafka_headers_t *src = rd_kafka_headers_new(2);
    rd_kafka_header_add(src, "x-other", -1, "1", -1);
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, KG_TRACE_BYTES_MAX), KG_OK);
    ck_assert_ptr_null(t.hdrs);
    char f[48] = "junk";
    kg_trace_log_fields_of(src, f, sizeof(f));
    ck_assert_str_eq(f, "");
    kg_trace_clear(&t);
    rd_kafka_headers_destroy(src);
}
END_TEST

/* An invalid traceparent is copied verbatim but gives no trace_id and no span; not an error. */
START_TEST(take_invalid_traceparent) {
    kg_trace_names_t tn = names_of("");
    rd_kafka_headers_t *src = rd_kafka_headers_new(2);
    rd_kafka_header_add(src, "traceparent", -1, "not-a-traceparent", -1);
    kg_trace_t t;
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, KG_TRACE_BYTES_MAX), KG_OK);
    ck_assert_str_eq(hdr(&t, "traceparent"), "not-a-traceparent");
    ck_assert(!t.valid);
    ck_assert_str_eq(t.log_fields, "");
    kg_event_span_t sp;
    ck_assert(!kg_trace_span(&t, kg_trace_unix_nano(), &sp));
    kg_trace_clear(&t);
    rd_kafka_headers_destroy(src);
}
END_TEST

/* Over the cap a header is left out whole (never cut), the ones that fit are kept, and what was
 * dropped is said. */
START_TEST(take_bounded) {
    kg_trace_names_t tn = names_of("x-a,x-b");
    static char big[20000];
    memset(big, 'b', sizeof(big) - 1);
    rd_kafka_headers_t *src = rd_kafka_headers_new(4);
    rd_kafka_header_add(src, "traceparent", -1, TP, -1);
    rd_kafka_header_add(src, "baggage", -1, big, 5000);
    rd_kafka_header_add(src, "x-a", -1, big, 19000);
    rd_kafka_header_add(src, "x-b", -1, "small", -1);
    kg_trace_t t;
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, 8192), KG_OK);
    ck_assert_str_eq(hdr(&t, "traceparent"), TP);
    ck_assert_uint_eq(strlen(hdr(&t, "baggage")), 5000);
    ck_assert_ptr_null(hdr(&t, "x-a"));
    ck_assert_str_eq(hdr(&t, "x-b"), "small");
    ck_assert_int_eq(t.n_dropped, 1);
    ck_assert_str_eq(t.dropped, "x-a");
    ck_assert_uint_eq(t.dropped_size, 3 + 19000 + KG_TRACE_HEADER_OVERHEAD);
    ck_assert_uint_le(t.hdrs_size, 8192);
    ck_assert(t.valid);
    kg_trace_clear(&t);
    /* a cap smaller than the traceparent itself: nothing copied, no trace */
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, 40), KG_OK);
    ck_assert_ptr_null(hdr(&t, "traceparent"));
    ck_assert(!t.valid);
    ck_assert_int_eq(t.n_dropped, 3);
    ck_assert_str_eq(t.dropped, "traceparent");
    kg_trace_clear(&t);
    rd_kafka_headers_destroy(src);
}
END_TEST

/* The worker's span: under the job's trace, parented on its traceparent, a fresh non-zero id. */
START_TEST(span) {
    kg_trace_names_t tn = names_of("");
    rd_kafka_headers_t *src = rd_kafka_headers_new(2);
    rd_kafka_header_add(src, "traceparent", -1, TP, -1);
    kg_trace_t t;
    ck_assert_int_eq(kg_trace_take(&t, src, &tn, KG_TRACE_BYTES_MAX), KG_OK);
    kg_event_span_t a, b;
    int64_t end = t.start_unix_nano + 5000000;
    ck_assert(kg_trace_span(&t, end, &a));
    ck_assert(kg_trace_span(&t, end, &b));
    ck_assert_str_eq(a.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(a.parent_span_id, "00f067aa0ba902b7");
    ck_assert_uint_eq(strlen(a.span_id), 16);
    ck_assert_uint_eq(strspn(a.span_id, "0123456789abcdef"), 16);
    ck_assert_str_ne(a.span_id, "0000000000000000");
    ck_assert_str_ne(a.span_id, b.span_id);
    ck_assert_str_ne(a.span_id, a.parent_span_id);
    ck_assert_int_eq(a.start_unix_nano, t.start_unix_nano);
    ck_assert_int_eq(a.end_unix_nano, end);
    ck_assert(kg_trace_span(&t, t.start_unix_nano - 1, &a)); /* a clock step back: not negative */
    ck_assert_int_eq(a.end_unix_nano, a.start_unix_nano);
    kg_trace_clear(&t);
    rd_kafka_headers_destroy(src);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_add_test(tc, traceparent_valid);
    tcase_add_test(tc, traceparent_invalid);
    tcase_add_test(tc, names);
    tcase_add_test(tc, take_copies_the_named);
    tcase_add_test(tc, take_nothing);
    tcase_add_test(tc, take_invalid_traceparent);
    tcase_add_test(tc, take_bounded);
    tcase_add_test(tc, span);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
