/* check_journal: the poison-job journal (kg_journal) on librdkafka's
 * in-process mock cluster. Two journals stand for two workers that own
 * jobs partition 0 in turn: what the second takes over from the first's
 * last snapshot decides whether a running job gets a strike. The worker
 * scenarios on a real broker are tests/integration/test_worker_poison*.sh. */
#include "check_common.h"
#include "config/kg_config.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "kafka/kg_journal.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define JOB_OFFSET 5

typedef struct fixture {
    rd_kafka_t *mock_rk; /* hosts the mock cluster */
    rd_kafka_mock_cluster_t *mc;
    kg_config_t cfg_a, cfg_b;
    kg_journal_t *a, *b; /* the first owner, the next */
    rd_kafka_topic_partition_list_t *parts;
    int revoke_after_ms; /* revoke_late */
} fixture_t;

static void config(kg_config_t *cfg, const char *bootstrap, const char *worker_id) {
    char err[256];
    kg_config_init(cfg);
    ck_assert(kg_config_set(cfg, "brokers", bootstrap, err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set(cfg, "jobs-topic", "jobs", err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set(cfg, "group-id", "journal-test", err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set(cfg, "worker-id", worker_id, err, sizeof(err)) == KG_OK);
    /* the grace for an evicted owner is a heartbeat + 2 s: 2.5 s here; where the failure would
     * decide a verdict (a solo job), a heartbeat + reconnect.backoff.max.ms + 2 s: 4.5 s */
    ck_assert(kg_config_set_kafka(cfg, "heartbeat.interval.ms", "500", err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set_kafka(cfg, "reconnect.backoff.max.ms", "2000", err, sizeof(err)) ==
              KG_OK);
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
    ck_assert(rd_kafka_mock_topic_create(f->mc, "jobs.inflight", 1, 1) == 0);
    config(&f->cfg_a, bootstrap, "a");
    config(&f->cfg_b, bootstrap, "b");
    f->a = kg_journal_new(&f->cfg_a, "jobs", NULL, "a", err, sizeof(err));
    ck_assert_msg(f->a != NULL, "%s", err);
    f->b = kg_journal_new(&f->cfg_b, "jobs", NULL, "b", err, sizeof(err));
    ck_assert_msg(f->b != NULL, "%s", err);
    f->parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(f->parts, "jobs", 0);
}

static void teardown(fixture_t *f) {
    kg_journal_free(f->a);
    kg_journal_free(f->b);
    rd_kafka_topic_partition_list_destroy(f->parts);
    kg_config_clear(&f->cfg_a);
    kg_config_clear(&f->cfg_b);
    rd_kafka_mock_cluster_destroy(f->mc);
    rd_kafka_destroy(f->mock_rk);
}

/* Journal `a` owns partition 0 and runs the job at JOB_OFFSET (solo: as the
 * only job on its worker): on record (acknowledged) as running. */
static void a_runs_the_job(fixture_t *f, bool solo) {
    kg_journal_assign(f->a, f->parts);
    ck_assert_int_eq(kg_journal_strikes(f->a, 0, JOB_OFFSET), 0);
    uint64_t ticket = kg_journal_start(f->a, 0, JOB_OFFSET, solo);
    int64_t deadline = kg_clock_us() + 10 * 1000000LL;
    while (!kg_journal_durable(f->a, 0, ticket) && kg_clock_us() < deadline) {
        kg_journal_poll(f->a, kg_clock_us(), 50);
    }
    ck_assert_msg(kg_journal_durable(f->a, 0, ticket), "the snapshot was not acknowledged");
}

/* The first owner, alive but evicted: it hears of it late and revokes. */
static void *revoke_late(void *arg) {
    fixture_t *f = arg;
    usleep((useconds_t)(f->revoke_after_ms ? f->revoke_after_ms : 700) * 1000);
    kg_journal_revoke(f->a, f->parts, true);
    return NULL;
}

/* The next owner takes the partition while the first, evicted from the
 * group (say its session timed out while the broker restarted), still
 * believes it owns it; the first revokes 0.7 s later and writes its clean
 * snapshot. A hand-over: the job it was running gets no strike (it used
 * to, and a job that was a suspect already was poisoned by it). */
START_TEST(evicted_owner_is_no_failure) {
    fixture_t f;
    setup(&f);
    a_runs_the_job(&f, false);
    pthread_t t;
    ck_assert(pthread_create(&t, NULL, revoke_late, &f) == 0);
    kg_journal_assign(f.b, f.parts);
    pthread_join(t, NULL);
    ck_assert_int_eq(kg_journal_strikes(f.b, 0, JOB_OFFSET), 0);
    teardown(&f);
}
END_TEST

/* The first owner dies with the job running (it writes nothing more): the
 * next owner waits out the grace (no clean snapshot comes), then the job
 * has a strike. */
START_TEST(dead_owner_gives_a_strike) {
    fixture_t f;
    setup(&f);
    a_runs_the_job(&f, false);
    kg_journal_free(f.a); /* flushes nothing: as a SIGKILL leaves it */
    f.a = NULL;
    kg_journal_assign(f.b, f.parts);
    ck_assert_int_eq(kg_journal_strikes(f.b, 0, JOB_OFFSET), 1);
    teardown(&f);
}
END_TEST

/* A revoke before the next owner comes: clean, no strike. */
START_TEST(revoked_owner_is_no_failure) {
    fixture_t f;
    setup(&f);
    a_runs_the_job(&f, false);
    kg_journal_revoke(f.a, f.parts, true);
    kg_journal_assign(f.b, f.parts);
    ck_assert_int_eq(kg_journal_strikes(f.b, 0, JOB_OFFSET), 0);
    teardown(&f);
}
END_TEST

/* The owner dies while its job runs solo: the failure is the job's own
 * (alone 1), after the longer wait a verdict asks for. */
START_TEST(dead_owner_of_a_solo_job) {
    fixture_t f;
    setup(&f);
    a_runs_the_job(&f, true);
    kg_journal_free(f.a);
    f.a = NULL;
    int64_t t0 = kg_clock_us();
    kg_journal_assign(f.b, f.parts);
    int64_t waited_ms = (kg_clock_us() - t0) / 1000;
    kg_journal_rec_t rec;
    ck_assert(kg_journal_lookup(f.b, 0, JOB_OFFSET, &rec));
    ck_assert(rec.strikes == 1 && rec.level == 1 && rec.alone == 1);
    ck_assert_int_ge(waited_ms, 4500);
    ck_assert_int_eq(kg_journal_n_waiting(f.b, 0), 1);
    teardown(&f);
}
END_TEST

/* An owner cut off by a broker restart reconnects only after its back-off:
 * its clean record comes 3.5 s late, past the short grace (2.5 s). With a
 * job running solo, whose failure would decide a verdict, the new owner
 * waits for it (4.5 s): no strike. With the short grace alone it got one, and
 * test_worker_exactly_once saw an innocent job poisoned this way. (A job
 * running beside others still gets the strike after the short grace: that
 * only moves it in the search, kg_suspects.h.) */
START_TEST(late_clean_record_of_a_solo_job) {
    fixture_t f;
    setup(&f);
    f.revoke_after_ms = 3500;
    a_runs_the_job(&f, true);
    pthread_t t;
    ck_assert(pthread_create(&t, NULL, revoke_late, &f) == 0);
    kg_journal_assign(f.b, f.parts);
    pthread_join(t, NULL);
    kg_journal_rec_t rec;
    ck_assert(kg_journal_lookup(f.b, 0, JOB_OFFSET, &rec));
    ck_assert(rec.strikes == 0 && rec.alone == 0);
    teardown(&f);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("journal");
    TCase *tc = tcase_create("takeover");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, evicted_owner_is_no_failure);
    tcase_add_test(tc, dead_owner_gives_a_strike);
    tcase_add_test(tc, revoked_owner_is_no_failure);
    tcase_add_test(tc, dead_owner_of_a_solo_job);
    tcase_add_test(tc, late_clean_record_of_a_solo_job);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
