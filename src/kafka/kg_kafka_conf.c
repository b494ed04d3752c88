/* kg_kafka_conf: shared librdkafka setup (kcat try_conf_set style). */
#include "kg_kafka_conf.h"

#include "../core/kg_log.h"

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
