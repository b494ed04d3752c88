/* kg_topic_config: DescribeConfigs on our topics (librdkafka admin API). */
#include "kg_topic_config.h"

#include "kg_acl.h"
#include "kg_kafka_conf.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* max.message.bytes of one described resource, or -1 with errstr set. */
static int64_t read_max_bytes(const rd_kafka_ConfigResource_t *res, char *errstr, size_t size) {
    rd_kafka_resp_err_t err = rd_kafka_ConfigResource_error(res);
    if (err) {
        const char *why = rd_kafka_ConfigResource_error_string(res);
        char hint[256] = "";
        if (kg_acl_denied(err)) {
            kg_acl_hint(err, "DescribeConfigs", rd_kafka_ConfigResource_name(res), hint + 2,
                        sizeof(hint) - 2);
            hint[0] = ':';
            hint[1] = ' ';
        }
        snprintf(errstr, size, "%s: %s%s", rd_kafka_ConfigResource_name(res),
                 why && *why ? why : rd_kafka_err2str(err), hint);
        return -1;
    }
    size_t n;
    const rd_kafka_ConfigEntry_t **entries = rd_kafka_ConfigResource_configs(res, &n);
    for (size_t i = 0; i < n; i++) {
        const char *value = rd_kafka_ConfigEntry_value(entries[i]);
        if (strcmp(rd_kafka_ConfigEntry_name(entries[i]), "max.message.bytes") == 0 && value) {
            char *end;
            long long v = strtoll(value, &end, 10);
            if (*end == '\0' && v > 0) {
                return v;
            }
        }
    }
    snprintf(errstr, size, "%s: no max.message.bytes in its configuration",
             rd_kafka_ConfigResource_name(res));
    return -1;
}

int kg_topic_max_message_bytes(const kg_config_t *cfg,
                               const char *const *topics,
                               int n,
                               int timeout_ms,
                               int64_t *out,
                               char *errstr,
                               size_t errstr_size) {
    int n_read = 0;
    char err[512] = "";
    if (errstr_size > 0) {
        errstr[0] = '\0';
    }
    rd_kafka_t *rk = NULL;
    rd_kafka_queue_t *q = NULL;
    rd_kafka_AdminOptions_t *opts = NULL;
    rd_kafka_event_t *ev = NULL;
    /* an array of pointers: sizeof(*res) is a pointer's size, as meant */
    rd_kafka_ConfigResource_t **res =
        calloc((size_t)(n > 0 ? n : 1), sizeof(*res)); // NOLINT(bugprone-sizeof-expression)
    for (int i = 0; i < n; i++) {
        out[i] = -1;
    }
    rd_kafka_conf_t *conf = kg_kafka_conf_new(cfg, err, sizeof(err));
    if (!res || !conf) {
        snprintf(errstr, errstr_size, "%s", *err ? err : "out of memory");
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        goto out;
    }
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        snprintf(errstr, errstr_size, "admin client: %s", err);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        res[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topics[i]);
    }
    q = rd_kafka_queue_new(rk);
    opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
    if (rd_kafka_AdminOptions_set_request_timeout(opts, timeout_ms, err, sizeof(err))) {
        snprintf(errstr, errstr_size, "%s", err);
        goto out;
    }
    /* Any broker answers for a topic's configuration; librdkafka would wait
     * for the controller, which a cluster may not name (the mock cluster
     * does not, and does not know DescribeConfigs either: it should fail at
     * once, not after the timeout). Ask the broker that answers Metadata. */
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(rk, 0, NULL, &md, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errstr, errstr_size, "no broker answered within %d ms", timeout_ms);
        goto out;
    }
    int32_t broker = md->orig_broker_id;
    rd_kafka_metadata_destroy(md);
    if (broker >= 0 && rd_kafka_AdminOptions_set_broker(opts, broker, err, sizeof(err))) {
        snprintf(errstr, errstr_size, "%s", err);
        goto out;
    }
    rd_kafka_DescribeConfigs(rk, res, (size_t)n, opts, q);
    ev = rd_kafka_queue_poll(q, timeout_ms + 1000);
    if (!ev) {
        snprintf(errstr, errstr_size, "no answer to DescribeConfigs within %d ms", timeout_ms);
        goto out;
    }
    if (rd_kafka_event_error(ev)) {
        snprintf(errstr, errstr_size, "DescribeConfigs: %s", rd_kafka_event_error_string(ev));
        goto out;
    }
    size_t n_res;
    const rd_kafka_ConfigResource_t **got = rd_kafka_DescribeConfigs_result_resources(
        rd_kafka_event_DescribeConfigs_result(ev), &n_res);
    for (size_t k = 0; k < n_res; k++) {
        for (int i = 0; i < n; i++) {
            if (out[i] < 0 && strcmp(rd_kafka_ConfigResource_name(got[k]), topics[i]) == 0) {
                out[i] = read_max_bytes(got[k], err, sizeof(err));
                n_read += out[i] > 0;
                if (out[i] < 0 && !*errstr) {
                    snprintf(errstr, errstr_size, "%s", err);
                }
            }
        }
    }
out:
    if (ev) {
        rd_kafka_event_destroy(ev);
    }
    if (opts) {
        rd_kafka_AdminOptions_destroy(opts);
    }
    if (q) {
        rd_kafka_queue_destroy(q);
    }
    for (int i = 0; res && i < n; i++) {
        if (res[i]) {
            rd_kafka_ConfigResource_destroy(res[i]);
        }
    }
    free(res);
    if (rk) {
        rd_kafka_destroy(rk);
    }
    return n_read;
}
