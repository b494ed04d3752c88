/* check_txn: which answers an exactly-once transaction may carry (kg_txn.h), on librdkafka's
 * mock cluster (it runs the transactional protocol, but keeps no offsets a transaction commits,
 * so the offsets and their metadata are read back from kg_txn itself). A job that finished
 * behind a running one of its partition commits at the next transaction, named in the offset
 * commit's metadata as answered above the offset; the list shrinks as the offset passes its
 * jobs; what the metadata has no room for waits for the prefix; a previous owner's list is
 * carried on, and the offset steps over a job it names once the prefix reaches it. */
#include "check_common.h"
#include "config/kg_config.h"
#include "core/kg_log.h"
#include "kafka/kg_answered.h"
#include "kafka/kg_txn.h"

#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    rd_kafka_t *mock_rk, *consumer;
    rd_kafka_mock_cluster_t *mc;
    kg_config_t cfg;
    kg_txn_t *txn;
    int n_committed, n_dropped;
    int64_t committed_offsets[64];
} fixture_t;

static void on_committed(void *ctx, void *opaque, const void *key, size_t key_len) {
    (void)key;
    (void)key_len;
    fixture_t *f = ctx;
    if (f->n_committed < 64) {
        f->committed_offsets[f->n_committed] = (int64_t)(intptr_t)opaque;
    }
    f->n_committed++;
}

static void on_refused(void *ctx,
                       const char *topic,
                       const void *key,
                       size_t key_len,
                       const void *value,
                       size_t len,
                       const rd_kafka_headers_t *hdrs,
                       void *opaque,
                       rd_kafka_resp_err_t err) {
    (void)ctx, (void)topic, (void)key, (void)key_len, (void)value, (void)len, (void)hdrs;
    (void)opaque, (void)err;
    ck_abort_msg("no answer is refused here");
}

static void on_dropped(void *ctx, void *opaque) {
    (void)opaque;
    ((fixture_t *)ctx)->n_dropped++;
}

static bool no_fault(rd_kafka_resp_err_t err) {
    (void)err;
    return false;
}

static void setup(fixture_t *f) {
    memset(f, 0, sizeof(*f));
    kg_log_setup(getenv("KG_TEST_DEBUG") ? KG_LOG_LEVEL_DEBUG : KG_LOG_LEVEL_WARN,
                 KG_LOG_FORMAT_LOGFMT);
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    ck_assert(rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err)) == 0);
    f->mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    ck_assert_msg(f->mock_rk != NULL, "%s", err);
    f->mc = rd_kafka_mock_cluster_new(f->mock_rk, 1);
    ck_assert(f->mc != NULL);
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(f->mc);
    ck_assert(rd_kafka_mock_topic_create(f->mc, "jobs", 1, 1) == 0);
    ck_assert(rd_kafka_mock_topic_create(f->mc, "results", 1, 1) == 0);
    kg_config_init(&f->cfg);
    ck_assert(kg_config_set(&f->cfg, "brokers", bootstrap, err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set(&f->cfg, "group-id", "txn-test", err, sizeof(err)) == KG_OK);

    rd_kafka_conf_t *cc = rd_kafka_conf_new();
    ck_assert(rd_kafka_conf_set(cc, "bootstrap.servers", bootstrap, err, sizeof(err)) == 0);
    ck_assert(rd_kafka_conf_set(cc, "group.id", "txn-test", err, sizeof(err)) == 0);
    ck_assert(rd_kafka_conf_set(cc, "log_level", "3", err, sizeof(err)) == 0);
    f->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cc, err, sizeof(err));
    ck_assert_msg(f->consumer != NULL, "%s", err);

    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    ck_assert(rd_kafka_conf_set(pc, "bootstrap.servers", bootstrap, err, sizeof(err)) == 0);
    ck_assert(rd_kafka_conf_set(pc, "log_level", "3", err, sizeof(err)) == 0);
    kg_txn_callbacks_t cb = {.ctx = f,
                             .committed = on_committed,
                             .refused = on_refused,
                             .dropped = on_dropped,
                             .is_message_fault = no_fault};
    f->txn = kg_txn_new(&f->cfg, pc, "w1", &cb, err, sizeof(err));
    ck_assert_msg(f->txn != NULL, "%s", err);
}

static void teardown(fixture_t *f) {
    kg_txn_free(f->txn);
    rd_kafka_consumer_close(f->consumer);
    rd_kafka_destroy(f->consumer);
    kg_config_clear(&f->cfg);
    rd_kafka_mock_cluster_destroy(f->mc);
    rd_kafka_destroy(f->mock_rk);
}

/* The answer of the job at `offset` of jobs[0] (its offset travels as the opaque). */
static void answer(fixture_t *f, int64_t offset) {
    char value[64];
    int len = snprintf(value, sizeof(value), "{\"offset\":%lld}", (long long)offset);
    ck_assert(kg_txn_add(f->txn, "results", "k", 1, value, (size_t)len, NULL, "jobs", 0, offset,
                         (void *)(intptr_t)offset) == KG_OK);
}

static void commit(fixture_t *f) {
    for (int tries = 0; tries < 50; tries++) {
        kg_status_t st = kg_txn_commit(f->txn, NULL, f->consumer, 0, true);
        ck_assert(st != KG_ERR_KAFKA);
        if (st == KG_OK) {
            return;
        }
    }
    ck_abort_msg("the transaction never committed");
}

/* The list the last committed transaction named, as "committed:a,b,c". */
static const char *named(fixture_t *f, char *buf, size_t cap) {
    int64_t out[64], committed;
    size_t n = kg_txn_answered_above(f->txn, "jobs", 0, &committed, out, 64);
    int w = snprintf(buf, cap, "%lld:", (long long)committed);
    for (size_t i = 0; i < n && w > 0 && (size_t)w < cap; i++) {
        w += snprintf(buf + w, cap - (size_t)w, i ? ",%lld" : "%lld", (long long)out[i]);
    }
    return buf;
}

START_TEST(answers_behind_a_running_job_commit_at_the_next_transaction) {
    fixture_t f;
    setup(&f);
    char buf[256];
    /* the job at offset 0 runs; 1, 2 and 4 finished (3 runs too): the prefix is empty, and
     * the partition's offset is where its first job was (no offset was committed before) */
    answer(&f, 2);
    commit(&f);
    ck_assert_int_eq(f.n_committed, 0); /* nothing says where the partition starts */
    kg_txn_track(f.txn, "jobs", 0, 0);
    kg_txn_track(f.txn, "jobs", 0, 3); /* only the first job counts */
    answer(&f, 1);
    answer(&f, 4);
    commit(&f);
    ck_assert_int_eq(f.n_committed, 3);
    ck_assert_uint_eq(kg_txn_n_pending(f.txn), 0);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "0:1,2,4");
    /* 0 finishes: the offset passes 0, 1 and 2; 4 stays named above it */
    answer(&f, 0);
    kg_txn_set_offset(f.txn, "jobs", 0, 3);
    commit(&f);
    ck_assert_int_eq(f.n_committed, 4);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "3:4");
    /* 3 finishes: the prefix passes 4 as well, and nothing is left to name */
    answer(&f, 3);
    kg_txn_set_offset(f.txn, "jobs", 0, 5);
    commit(&f);
    ck_assert_int_eq(f.n_committed, 5);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "5:");
    /* an offset never moves back */
    kg_txn_set_offset(f.txn, "jobs", 0, 2);
    commit(&f);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "5:");
    teardown(&f);
}
END_TEST

START_TEST(what_the_metadata_cannot_name_waits_for_the_prefix) {
    fixture_t f;
    setup(&f);
    char buf[256];
    kg_txn_set_offset(f.txn, "jobs", 0, 0);
    /* offsets far above the running job take 11 bytes each in the metadata: about 185 fit in
     * KG_ANSWERED_MAX_BYTES, the rest wait */
    int64_t base = 1000000000;
    int n = 400, fit = (KG_ANSWERED_MAX_BYTES - (int)strlen(KG_ANSWERED_PREFIX)) / 11;
    for (int i = 0; i < n; i++) {
        answer(&f, base + i);
    }
    commit(&f);
    ck_assert_int_ge(f.n_committed, fit - 1);
    ck_assert_int_lt(f.n_committed, n);
    size_t waiting = kg_txn_n_pending(f.txn);
    ck_assert_uint_eq(waiting, (size_t)(n - f.n_committed));
    /* the committed ones are the lowest offsets, each named */
    int64_t out[1024], committed;
    size_t named_n = kg_txn_answered_above(f.txn, "jobs", 0, &committed, out, 1024);
    ck_assert_uint_eq(named_n, (size_t)f.n_committed);
    ck_assert(out[0] == base && out[named_n - 1] == base + (int64_t)named_n - 1);
    /* once the prefix passes them all, the rest commit with it */
    kg_txn_set_offset(f.txn, "jobs", 0, base + n);
    commit(&f);
    ck_assert_int_eq(f.n_committed, n);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "1000000400:");
    teardown(&f);
}
END_TEST

START_TEST(a_previous_owners_list_is_carried_on) {
    fixture_t f;
    setup(&f);
    char buf[256];
    /* committed 10 by the previous owner, which answered 12 and 15 above it */
    int64_t prev[] = {12, 15};
    ck_assert(kg_txn_seed_answered(f.txn, "jobs", 0, 10, prev, 2) == KG_OK);
    /* this owner answers 13 while 10 runs: the list names all three */
    answer(&f, 13);
    commit(&f);
    ck_assert_int_eq(f.n_committed, 1);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "10:12,13,15");
    /* 10 and 11 finish: the prefix reaches 12, which this owner has not skipped yet; the
     * offset steps over 12 and 13 (answered), up to 14 */
    answer(&f, 10);
    answer(&f, 11);
    kg_txn_set_offset(f.txn, "jobs", 0, 12);
    commit(&f);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "14:15");
    /* a revoke forgets the partition: nothing is named for it any more */
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, "jobs", 0);
    answer(&f, 16);
    kg_txn_drop(f.txn, "jobs", parts);
    rd_kafka_topic_partition_list_destroy(parts);
    ck_assert_int_eq(f.n_dropped, 1);
    ck_assert_str_eq(named(&f, buf, sizeof(buf)), "-1:");
    teardown(&f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("txn");
    TCase *tc = tcase_create("txn");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, answers_behind_a_running_job_commit_at_the_next_transaction);
    tcase_add_test(tc, what_the_metadata_cannot_name_waits_for_the_prefix);
    tcase_add_test(tc, a_previous_owners_list_is_carried_on);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(suite)
