/* check_cancel: the memo of recent cancels (TTL, renewal, the bound forgets the oldest first,
 * hash chains stay consistent under churn), the cancel message (value, key-only, rejects), and
 * the reader's periodic look-up on librdkafka's mock cluster (a topic made after start is
 * found; with the broker away the look-up never blocks the loop that polls it). */
#include "check_common.h"
#include "config/kg_config.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "kafka/kg_cancel.h"
#include "kafka/kg_lanes.h"
#include "schema/kg_cancelmsg.h"

#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

START_TEST(memo_ttl) {
    kg_cancel_memo_t *m = kg_cancel_memo_new(8, 1000);
    ck_assert_ptr_nonnull(m);
    ck_assert(!kg_cancel_memo_has(m, "a", 0));
    kg_cancel_memo_add(m, "a", 100);
    ck_assert(kg_cancel_memo_has(m, "a", 100));
    ck_assert(kg_cancel_memo_has(m, "a", 1100));
    ck_assert(!kg_cancel_memo_has(m, "a", 1101)); /* expired */
    kg_cancel_memo_add(m, "a", 1050);             /* a second cancel renews it */
    ck_assert(kg_cancel_memo_has(m, "a", 2000));
    ck_assert_int_eq(kg_cancel_memo_size(m), 1);
    ck_assert(!kg_cancel_memo_has(m, "b", 100));
    kg_cancel_memo_free(m);
    ck_assert_ptr_null(kg_cancel_memo_new(0, 1000));
}
END_TEST

START_TEST(memo_bound) {
    kg_cancel_memo_t *m = kg_cancel_memo_new(3, 1000000);
    kg_cancel_memo_add(m, "a", 1);
    kg_cancel_memo_add(m, "b", 2);
    kg_cancel_memo_add(m, "c", 3);
    kg_cancel_memo_add(m, "a", 4); /* renewed: now the newest */
    kg_cancel_memo_add(m, "d", 5); /* full: b, the oldest, goes */
    ck_assert(kg_cancel_memo_has(m, "a", 6));
    ck_assert(!kg_cancel_memo_has(m, "b", 6));
    ck_assert(kg_cancel_memo_has(m, "c", 6));
    ck_assert(kg_cancel_memo_has(m, "d", 6));
    ck_assert_int_eq(kg_cancel_memo_size(m), 3);
    kg_cancel_memo_free(m);
}
END_TEST

/* Many ids through a small memo: exactly the last `cap` distinct ids are known. */
START_TEST(memo_churn) {
    const int cap = 100, n = 5000;
    kg_cancel_memo_t *m = kg_cancel_memo_new(cap, 1000000);
    char id[32];
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "job-%d", i);
        kg_cancel_memo_add(m, id, i);
    }
    ck_assert_int_eq(kg_cancel_memo_size(m), cap);
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "job-%d", i);
        ck_assert_msg(kg_cancel_memo_has(m, id, n) == (i >= n - cap), "%s", id);
    }
    kg_cancel_memo_free(m);
}
END_TEST

static kg_status_t decode(const char *key, const char *value, char *rid) {
    char why[160] = "";
    kg_status_t st = kg_cancelmsg_decode(key, key ? strlen(key) : 0, value,
                                         value ? strlen(value) : 0, rid, why, sizeof(why));
    ck_assert(st == KG_OK || why[0] != '\0');
    return st;
}

START_TEST(message) {
    char rid[KG_JOB_REQUEST_ID_MAX + 1];
    ck_assert_int_eq(decode("k", "{\"request_id\":\"req-42\",\"schema_version\":1}", rid), KG_OK);
    ck_assert_str_eq(rid, "req-42"); /* the value wins over the key */
    ck_assert_int_eq(decode("by-key.1", NULL, rid), KG_OK);
    ck_assert_str_eq(rid, "by-key.1");
    ck_assert_int_eq(decode("x", "{\"request_id\":\"a\",\"extra\":[1]}", rid), KG_OK);
    ck_assert_int_eq(decode("bad key", NULL, rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode(NULL, NULL, rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "not json", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "[\"req\"]", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":\"a b\"}", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":7}", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":\"a\",\"schema_version\":2}", rid),
                     KG_ERR_INVALID);
    char long_id[200];
    memset(long_id, 'x', 129);
    long_id[129] = '\0';
    ck_assert_int_eq(decode(long_id, NULL, rid), KG_ERR_INVALID);
    size_t len;
    char *enc = kg_cancelmsg_encode("req-42", &len);
    ck_assert_str_eq(enc, "{\"request_id\":\"req-42\",\"schema_version\":1}");
    ck_assert_uint_eq(len, strlen(enc));
    free(enc);
}
END_TEST

/* Which cancel topics a worker reads: each lane's <topic>.cancel by default,
 * --cancel-topic for all lanes, none with "none". */
START_TEST(topic_names) {
    kg_config_t cfg;
    kg_config_init(&cfg);
    kg_lanes_t lanes;
    char err[256], names[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX];
    ck_assert(kg_lanes_parse("jobs.hi:4,jobs.bulk:1", &lanes, err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 2);
    ck_assert_str_eq(names[0], "jobs.hi.cancel");
    ck_assert_str_eq(names[1], "jobs.bulk.cancel");
    ck_assert(kg_config_set(&cfg, "cancel-topic", "stop", err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 1);
    ck_assert_str_eq(names[0], "stop");
    ck_assert(kg_config_set(&cfg, "cancel-topic", "none", err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 0);
    kg_config_clear(&cfg);
}
END_TEST

/* Poll c until cond holds (up to 20 s). */
#define POLL_UNTIL(c, cond)                                                                        \
    do {                                                                                           \
        char rids_[4][KG_JOB_REQUEST_ID_MAX + 1];                                                  \
        int64_t end_ = kg_clock_us() + 20 * 1000000LL;                                             \
        while (!(cond) && kg_clock_us() < end_) {                                                  \
            int got_ = kg_cancel_poll(c, rids_, 4);                                                \
            n_got += got_;                                                                         \
            for (int g_ = 0; g_ < got_; g_++) {                                                    \
                memcpy(last, rids_[g_], sizeof(last));                                             \
            }                                                                                      \
            struct timespec ts_ = {0, 20 * 1000000L};                                              \
            nanosleep(&ts_, NULL);                                                                 \
        }                                                                                          \
    } while (0)

/* A cancel topic made after the reader started is found by a later look-up, and its cancels
 * read; with the broker down, polls that start a look-up or find one outstanding return
 * without waiting for it (the blocking look-up took 5 s each, on the loop that feeds the
 * engine). */
START_TEST(lookup_later_and_not_blocking) {
    kg_log_setup(getenv("KG_TEST_DEBUG") ? KG_LOG_LEVEL_DEBUG : KG_LOG_LEVEL_ERROR,
                 KG_LOG_FORMAT_LOGFMT);
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    ck_assert(rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err)) == 0);
    rd_kafka_t *mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    ck_assert_msg(mock_rk != NULL, "%s", err);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mock_rk, 1);
    ck_assert(mc != NULL);
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(mc);
    ck_assert(rd_kafka_mock_topic_create(mc, "jobs", 1, 1) == 0);
    kg_config_t cfg;
    kg_config_init(&cfg);
    ck_assert(kg_config_set(&cfg, "brokers", bootstrap, err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set(&cfg, "group-id", "cancel-test", err, sizeof(err)) == KG_OK);
    const char *topics[] = {"jobs.cancel"};
    kg_cancel_t *c = kg_cancel_new(&cfg, topics, 1, "w1", 16, 60000, err, sizeof(err));
    ck_assert_msg(c != NULL, "%s", err);
    ck_assert_int_eq(kg_cancel_n_partitions(c), 0); /* not there yet */

    ck_assert(rd_kafka_mock_topic_create(mc, "jobs.cancel", 2, 1) == 0);
    int n_got = 0;
    char last[KG_JOB_REQUEST_ID_MAX + 1] = "";
    kg_cancel_look_up_soon(c);
    POLL_UNTIL(c, kg_cancel_n_partitions(c) == 2);
    ck_assert_int_eq(kg_cancel_n_partitions(c), 2);

    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    ck_assert(rd_kafka_conf_set(pc, "bootstrap.servers", bootstrap, err, sizeof(err)) == 0);
    ck_assert(rd_kafka_conf_set(pc, "log_level", "0", err, sizeof(err)) == 0);
    rd_kafka_t *producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof(err));
    ck_assert_msg(producer != NULL, "%s", err);
    ck_assert_int_eq(kg_cancel_send(producer, "jobs.cancel", "req-7"), RD_KAFKA_RESP_ERR_NO_ERROR);
    ck_assert_int_eq(rd_kafka_flush(producer, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
    POLL_UNTIL(c, n_got >= 1);
    ck_assert_int_eq(n_got, 1);
    ck_assert_str_eq(last, "req-7");
    ck_assert(kg_cancel_is_cancelled(c, "req-7"));

    /* the broker away: look-ups are sent and time out in the background, and the loop's
     * polls return while one is outstanding (a look-up on the loop's thread would hold its
     * poll for up to 5 s, and no look-up would ever be seen pending at a poll's return) */
    ck_assert_int_eq(rd_kafka_mock_broker_set_down(mc, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
    int returned_pending = 0, lookups_seen = 0;
    int64_t until = kg_clock_us() + 7 * 1000000LL;
    for (int round = 0; kg_clock_us() < until; round++) {
        if (round % 25 == 0) {
            kg_cancel_look_up_soon(c); /* about every 0.5 s */
        }
        char one[1][KG_JOB_REQUEST_ID_MAX + 1];
        const bool before = kg_cancel_lookup_pending(c);
        n_got += kg_cancel_poll(c, one, 1);
        const bool after = kg_cancel_lookup_pending(c);
        lookups_seen += !before && after;
        returned_pending += before && after;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(lookups_seen >= 1, "no look-up was started with the broker down");
    ck_assert_msg(returned_pending >= 1,
                  "no poll returned while a look-up was outstanding (%d look-ups)", lookups_seen);
    ck_assert_int_eq(kg_cancel_n_partitions(c), 2); /* nothing forgotten */

    rd_kafka_destroy(producer);
    kg_cancel_free(c);
    kg_config_clear(&cfg);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mock_rk);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cancel");
    TCase *tc = tcase_create("memo");
    tcase_add_test(tc, memo_ttl);
    tcase_add_test(tc, memo_bound);
    tcase_add_test(tc, memo_churn);
    suite_add_tcase(s, tc);
    tc = tcase_create("message");
    tcase_add_test(tc, message);
    tcase_add_test(tc, topic_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("reader");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lookup_later_and_not_blocking);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
