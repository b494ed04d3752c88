/* kg_kafka_conf: shared librdkafka setup (kcat try_conf_set style). */
#include "kg_kafka_conf.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* librdkafka's syslog levels -> ours; its log lines keep their facility */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    kg_log_level_t lvl = level <= 3   ? KG_LOG_LEVEL_ERROR
                         : level == 4 ? KG_LOG_LEVEL_WARN
                         : level <= 6 ? KG_LOG_LEVEL_INFO
                                      : KG_LOG_LEVEL_DEBUG;
    KG_LOG_(lvl, "rdkafka", "%s client=%s facility=%s", buf, rd_kafka_name(rk), fac);
}

/* librdkafka's error events. While a broker is down they are "N/N brokers are down" at every
 * failed reconnect of every client (without an error callback librdkafka logs each: 508 lines
 * from one journal reader in a 50 s outage; the worker's producer said it every second).
 * Connectivity errors are said once per client per NO_BROKER_EVERY_US, with a count of the ones
 * held back; the rest as they come. */
#define NO_BROKER_EVERY_US (30 * 1000000LL)
#define QUIET_SLOTS        16

static struct {
    const rd_kafka_t *rk;
    int64_t said_us;
    int64_t unsaid;
} quiet[QUIET_SLOTS];
static pthread_mutex_t quiet_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether to say this connectivity error of rk now; *unsaid: how many were held back since. */
static bool say_no_broker(const rd_kafka_t *rk, int64_t *unsaid) {
    int64_t now = kg_clock_us();
    bool say = true;
    *unsaid = 0;
    pthread_mutex_lock(&quiet_mu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < QUIET_SLOTS; i++) {
        if (quiet[i].rk == rk) {
            slot = i;
            break;
        }
        if (quiet[i].said_us < quiet[oldest].said_us) {
            oldest = i;
        }
    }
    if (slot >= 0 && now - quiet[slot].said_us < NO_BROKER_EVERY_US) {
        quiet[slot].unsaid++;
        say = false;
    } else {
        slot = slot >= 0 ? slot : oldest; /* a handle gone long ago gives its slot up */
        *unsaid = quiet[slot].rk == rk ? quiet[slot].unsaid : 0;
        quiet[slot].rk = rk;
        quiet[slot].said_us = now;
        quiet[slot].unsaid = 0;
    }
    pthread_mutex_unlock(&quiet_mu);
    return say;
}

void kg_kafka_log_error(rd_kafka_t *rk, int err, const char *reason) {
    rd_kafka_resp_err_t e = (rd_kafka_resp_err_t)err;
    int64_t unsaid = 0;
    if ((e == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || e == RD_KAFKA_RESP_ERR__TRANSPORT) &&
        !say_no_broker(rk, &unsaid)) {
        return;
    }
    /* informational: librdkafka retries by itself (a broker that went away) */
    KG_LOG_WARN("rdkafka", "%s client=%s error=%s held_back=%lld", reason, rd_kafka_name(rk),
                rd_kafka_err2name(e), (long long)unsaid);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char why[512];
        rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, why, sizeof(why));
        KG_LOG_ERROR("rdkafka", "%s client=%s error=%s", why, rd_kafka_name(rk),
                     rd_kafka_err2name(orig));
        return;
    }
    kg_kafka_log_error(rk, err, reason);
}

const char *kg_kafka_version(void) {
    return rd_kafka_version_str();
}

bool kg_kafka_err_no_broker(rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR__TRANSPORT || err == RD_KAFKA_RESP_ERR__TIMED_OUT ||
           err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
           err == RD_KAFKA_RESP_ERR__RESOLVE;
}

int kg_kafka_conf_set(
    rd_kafka_conf_t *conf, const char *key, const char *value, char *errstr, size_t errstr_size) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "librdkafka property %s: %s", key, err);
        return -1;
    }
    return 0;
}

rd_kafka_conf_t *kg_kafka_conf_new(const kg_config_t *cfg, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, log_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb); /* the worker's clients set their own */
    if (kg_kafka_conf_set(conf, "bootstrap.servers", cfg->brokers, errstr, errstr_size) != 0) {
        goto fail;
    }
    /* librdkafka refreshes topic metadata every 5 minutes by default, so a
     * partition added to the jobs topic would wait up to that long for a
     * consumer; 30 s costs the brokers one small Metadata request per client
     * and half-minute. -X (applied below) overrides it. */
    if (kg_kafka_conf_set(conf, "topic.metadata.refresh.interval.ms", "30000", errstr,
                          errstr_size) != 0) {
        goto fail;
    }
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        if (kg_kafka_conf_set(conf, cfg->kafka_keys[i], cfg->kafka_values[i], errstr,
                              errstr_size) != 0) {
            goto fail;
        }
    }
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}
