/* check_kafka_conf: the shared librdkafka setup. A client made from it with no broker to reach
 * (the journal's and cancel reader's clients set no error callback of their own) says that no
 * broker is up once, not at every failed reconnect, and logs nothing at librdkafka's ERROR
 * facility (how librdkafka logs errors when no callback takes them). */
#include "check_common.h"
#include "config/kg_config.h"
#include "core/kg_log.h"
#include "kafka/kg_kafka_conf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Lines of file f that contain needle. */
static int count_lines(FILE *f, const char *needle) {
    char line[4096];
    int n = 0;
    rewind(f);
    while (fgets(line, sizeof(line), f)) {
        n += strstr(line, needle) != NULL;
    }
    return n;
}

START_TEST(no_broker_said_once) {
    kg_log_setup(KG_LOG_LEVEL_INFO, KG_LOG_FORMAT_LOGFMT);
    FILE *log = tmpfile();
    ck_assert_ptr_nonnull(log);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(log), STDERR_FILENO), 0);

    kg_config_t cfg;
    kg_config_init(&cfg);
    char err[512];
    /* a closed port: every connect is refused at once, so the reconnects come fast (100 ms
     * back-off at first, doubling) */
    ck_assert(kg_config_set(&cfg, "brokers", "127.0.0.1:1", err, sizeof(err)) == KG_OK);
    ck_assert(kg_config_set_kafka(&cfg, "reconnect.backoff.max.ms", "200", err, sizeof(err)) ==
              KG_OK);
    rd_kafka_conf_t *conf = kg_kafka_conf_new(&cfg, err, sizeof(err));
    ck_assert_msg(conf != NULL, "%s", err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    ck_assert_msg(rk != NULL, "%s", err);
    for (int i = 0; i < 40; i++) { /* 4 s: some 20 reconnects */
        rd_kafka_poll(rk, 100);
    }
    rd_kafka_destroy(rk);
    kg_config_clear(&cfg);

    fflush(stderr);
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);
    int down = count_lines(log, "error=_ALL_BROKERS_DOWN");
    int transport = count_lines(log, "error=_TRANSPORT");
    int as_log = count_lines(log, "facility=ERROR");
    fclose(log);
    ck_assert_int_eq(as_log, 0);
    ck_assert_int_le(down, 1);
    ck_assert_int_le(transport, 1);
    ck_assert_int_ge(down + transport, 1); /* said, once */
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("kafka_conf");
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, no_broker_said_once);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
