/* kg-admin: the Kafka admin calls the integration tests make (create a topic, add partitions,
 * a group's lag, a topic's end offsets), through librdkafka.
 *
 * The tests made these calls with Kafka's own CLI classes, a JVM each: about 2 s of CPU and
 * 3 s of wall time per call, and the waits for a group's lag polled one JVM after another.
 * Across the broker suite that was minutes of CI's two cores. This is one C call each.
 *
 * Usage:
 *   kg-admin create-topic BROKERS TOPIC PARTITIONS [NAME=VALUE]...   (an existing topic is fine)
 *   kg-admin add-partitions BROKERS TOPIC TOTAL
 *   kg-admin lag BROKERS GROUP TOPIC     the sum over TOPIC's partitions of end offset minus
 *                                        GROUP's committed offset (a partition without one
 *                                        counts whole); "unknown" when GROUP has committed
 *                                        nothing on TOPIC and TOPIC has messages
 *   kg-admin end-offsets BROKERS TOPIC   the sum of the partitions' end offsets
 * Exit 0 on success, 1 on a Kafka error (said on stderr), 2 on a usage error. */
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TIMEOUT_MS = 30000 };

static int usage(void) {
    fprintf(stderr, "usage: kg-admin create-topic BROKERS TOPIC PARTITIONS [NAME=VALUE]...\n"
                    "       kg-admin add-partitions BROKERS TOPIC TOTAL\n"
                    "       kg-admin lag BROKERS GROUP TOPIC\n"
                    "       kg-admin end-offsets BROKERS TOPIC\n");
    return 2;
}

static bool parse_count(const char *s, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 1 || v > 100000) {
        fprintf(stderr, "kg-admin: '%s' is not a partition count\n", s);
        return false;
    }
    *out = (int)v;
    return true;
}

/* A client of TYPE on BROKERS; GROUP (may be NULL) for a consumer's committed offsets. */
static rd_kafka_t *client(rd_kafka_type_t type, const char *brokers, const char *group) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err)) ||
        (group && (rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err)) ||
                   rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err))))) {
        fprintf(stderr, "kg-admin: %s\n", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof(err));
    if (!rk) {
        fprintf(stderr, "kg-admin: %s\n", err);
    }
    return rk;
}

/* Wait for the admin result on Q; 0 when every topic result is ok (or ALLOWED). */
static int admin_result(rd_kafka_queue_t *q, rd_kafka_resp_err_t allowed, const char *what) {
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, TIMEOUT_MS + 5000);
    int rc = 0;
    if (!ev) {
        fprintf(stderr, "kg-admin: %s: no answer within %d ms\n", what, TIMEOUT_MS);
        return 1;
    }
    if (rd_kafka_event_error(ev)) {
        fprintf(stderr, "kg-admin: %s: %s\n", what, rd_kafka_event_error_string(ev));
        rd_kafka_event_destroy(ev);
        return 1;
    }
    const rd_kafka_topic_result_t **res = NULL;
    size_t n = 0;
    if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_CREATETOPICS_RESULT) {
        res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    } else {
        res =
            rd_kafka_CreatePartitions_result_topics(rd_kafka_event_CreatePartitions_result(ev), &n);
    }
    for (size_t i = 0; i < n; i++) {
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(res[i]);
        if (e && e != allowed) {
            fprintf(stderr, "kg-admin: %s %s: %s\n", what, rd_kafka_topic_result_name(res[i]),
                    rd_kafka_topic_result_error_string(res[i])
                        ? rd_kafka_topic_result_error_string(res[i])
                        : rd_kafka_err2str(e));
            rc = 1;
        }
    }
    rd_kafka_event_destroy(ev);
    return rc;
}

static int
create_topic(const char *brokers, const char *topic, int parts, char **configs, int n_configs) {
    char err[512];
    rd_kafka_t *rk = client(RD_KAFKA_PRODUCER, brokers, NULL);
    if (!rk) {
        return 1;
    }
    int rc = 1;
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, parts, 1, err, sizeof(err));
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    if (!nt) {
        fprintf(stderr, "kg-admin: %s\n", err);
        goto out;
    }
    for (int i = 0; i < n_configs; i++) {
        char *eq = strchr(configs[i], '=');
        if (!eq || eq == configs[i]) {
            fprintf(stderr, "kg-admin: a topic config is NAME=VALUE, not '%s'\n", configs[i]);
            rc = 2;
            goto out;
        }
        *eq = '\0';
        if (rd_kafka_NewTopic_set_config(nt, configs[i], eq + 1)) {
            fprintf(stderr, "kg-admin: config %s refused\n", configs[i]);
            goto out;
        }
    }
    rd_kafka_AdminOptions_set_operation_timeout(opts, TIMEOUT_MS, err, sizeof(err));
    rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
    rc = admin_result(q, RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS, "create topic");
out:
    if (nt) {
        rd_kafka_NewTopic_destroy(nt);
    }
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

static int add_partitions(const char *brokers, const char *topic, int total) {
    char err[512];
    rd_kafka_t *rk = client(RD_KAFKA_PRODUCER, brokers, NULL);
    if (!rk) {
        return 1;
    }
    rd_kafka_NewPartitions_t *np =
        rd_kafka_NewPartitions_new(topic, (size_t)total, err, sizeof(err));
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opts =
        rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATEPARTITIONS);
    int rc = 1;
    if (np) {
        rd_kafka_AdminOptions_set_operation_timeout(opts, TIMEOUT_MS, err, sizeof(err));
        rd_kafka_CreatePartitions(rk, &np, 1, opts, q);
        rc = admin_result(q, RD_KAFKA_RESP_ERR_NO_ERROR, "add partitions");
        rd_kafka_NewPartitions_destroy(np);
    } else {
        fprintf(stderr, "kg-admin: %s\n", err);
    }
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

/* TOPIC's partition count on RK (the topic must exist), or -1. */
static int partition_count(rd_kafka_t *rk, const char *topic) {
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    int n = -1;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, t, &md, TIMEOUT_MS);
    if (e) {
        fprintf(stderr, "kg-admin: metadata of %s: %s\n", topic, rd_kafka_err2str(e));
    } else if (md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, "kg-admin: topic %s: %s\n", topic,
                md->topic_cnt == 1 ? rd_kafka_err2str(md->topics[0].err) : "not in the metadata");
    } else {
        n = md->topics[0].partition_cnt;
    }
    if (md) {
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(t);
    return n;
}

/* The sum of TOPIC's end offsets and, with GROUP, of its lag (see the usage above). */
static int offsets(const char *brokers, const char *group, const char *topic) {
    rd_kafka_t *rk = client(RD_KAFKA_CONSUMER, brokers, group);
    if (!rk) {
        return 1;
    }
    int rc = 1;
    int n = partition_count(rk, topic);
    rd_kafka_topic_partition_list_t *list = NULL;
    if (n < 0) {
        goto out;
    }
    list = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++) {
        rd_kafka_topic_partition_list_add(list, topic, p);
    }
    if (group) {
        rd_kafka_resp_err_t e = rd_kafka_committed(rk, list, TIMEOUT_MS);
        if (e) {
            fprintf(stderr, "kg-admin: committed offsets of %s: %s\n", group, rd_kafka_err2str(e));
            goto out;
        }
    }
    int64_t end_sum = 0, lag = 0;
    bool any_commit = false;
    for (int p = 0; p < n; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e =
            rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, TIMEOUT_MS);
        if (e) {
            fprintf(stderr, "kg-admin: end offset of %s[%d]: %s\n", topic, p, rd_kafka_err2str(e));
            goto out;
        }
        end_sum += hi;
        const rd_kafka_topic_partition_t *tp = &list->elems[p];
        if (group && tp->err == RD_KAFKA_RESP_ERR_NO_ERROR && tp->offset >= 0) {
            any_commit = true;
            lag += hi > tp->offset ? hi - tp->offset : 0;
        } else {
            lag += hi;
        }
    }
    if (!group) {
        printf("%lld\n", (long long)end_sum);
    } else if (!any_commit && end_sum > 0) {
        printf("unknown\n");
    } else {
        printf("%lld\n", (long long)lag);
    }
    rc = 0;
out:
    if (list) {
        rd_kafka_topic_partition_list_destroy(list);
    }
    rd_kafka_destroy(rk);
    return rc;
}

int main(int argc, char **argv) {
    int n = 0;
    if (argc >= 5 && strcmp(argv[1], "create-topic") == 0) {
        return parse_count(argv[4], &n) ? create_topic(argv[2], argv[3], n, argv + 5, argc - 5) : 2;
    }
    if (argc == 5 && strcmp(argv[1], "add-partitions") == 0) {
        return parse_count(argv[4], &n) ? add_partitions(argv[2], argv[3], n) : 2;
    }
    if (argc == 5 && strcmp(argv[1], "lag") == 0) {
        return offsets(argv[2], argv[3], argv[4]);
    }
    if (argc == 4 && strcmp(argv[1], "end-offsets") == 0) {
        return offsets(argv[2], NULL, argv[3]);
    }
    return usage();
}
