/* kg_cancel: the cancel topic's reader and the memo of recent cancels; see kg_cancel.h. */
#include "kg_cancel.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../schema/kg_cancelmsg.h"
#include "kg_acl.h"
#include "kg_kafka_conf.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOOKUP_US   (30 * 1000000LL) /* the topic's partitions are looked up this often */
#define METADATA_MS 5000
/* The periodic look-up must not run on the worker's loop thread, which also feeds the engine:
 * its blocking metadata call stalled generation for METADATA_MS every LOOKUP_US while the broker
 * was away (measured: 4.6 s token pauses every 30 s in a broker outage). It runs on a thread of
 * its own, its answer taken by a later poll. (librdkafka's asynchronous DescribeTopics would
 * do too, but its mock cluster never answers it, and it needs 2.3.) */

// ---- memo ----

typedef struct entry {
    char rid[KG_JOB_REQUEST_ID_MAX + 1];
    int64_t t_ms;
    int32_t next; /* next entry in its bucket, -1 at the end */
    bool live;
} entry_t;

struct kg_cancel_memo {
    entry_t *e;       /* (cap) a ring: head is the next one written (the oldest when full) */
    int32_t *buckets; /* (n_buckets) first entry of each chain, -1 when empty */
    int32_t cap, head, n, n_buckets;
    int64_t ttl_ms;
};

static uint32_t hash_rid(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 16777619u;
    }
    return h;
}

kg_cancel_memo_t *kg_cancel_memo_new(int32_t capacity, int64_t ttl_ms) {
    kg_cancel_memo_t *m = calloc(1, sizeof(*m));
    if (!m || capacity <= 0) {
        free(m);
        return NULL;
    }
    m->cap = capacity;
    m->ttl_ms = ttl_ms;
    m->n_buckets = 16;
    while (m->n_buckets < capacity) {
        m->n_buckets <<= 1;
    }
    m->e = calloc((size_t)capacity, sizeof(*m->e));
    m->buckets = malloc((size_t)m->n_buckets * sizeof(*m->buckets));
    if (!m->e || !m->buckets) {
        kg_cancel_memo_free(m);
        return NULL;
    }
    memset(m->buckets, 0xff, (size_t)m->n_buckets * sizeof(*m->buckets));
    return m;
}

void kg_cancel_memo_free(kg_cancel_memo_t *m) {
    if (m) {
        free(m->e);
        free(m->buckets);
        free(m);
    }
}

static int32_t *chain_of(const kg_cancel_memo_t *m, const char *rid) {
    return &m->buckets[hash_rid(rid) & (uint32_t)(m->n_buckets - 1)];
}

static int32_t find(const kg_cancel_memo_t *m, const char *rid) {
    for (int32_t i = *chain_of(m, rid); i >= 0; i = m->e[i].next) {
        if (strcmp(m->e[i].rid, rid) == 0) {
            return i;
        }
    }
    return -1;
}

static void unlink_entry(kg_cancel_memo_t *m, int32_t i) {
    int32_t *p = chain_of(m, m->e[i].rid);
    while (*p != i) {
        p = &m->e[*p].next;
    }
    *p = m->e[i].next;
    m->e[i].live = false;
    m->n--;
}

void kg_cancel_memo_add(kg_cancel_memo_t *m, const char *rid, int64_t now_ms) {
    if (!m || strlen(rid) > KG_JOB_REQUEST_ID_MAX) {
        return;
    }
    int32_t old = find(m, rid);
    if (old >= 0) {
        unlink_entry(m, old); /* written again at the head: it is the newest now */
    }
    int32_t i = m->head;
    if (m->e[i].live) {
        unlink_entry(m, i); /* full: the oldest goes */
    }
    entry_t *x = &m->e[i];
    snprintf(x->rid, sizeof(x->rid), "%s", rid);
    x->t_ms = now_ms;
    x->live = true;
    int32_t *chain = chain_of(m, rid);
    x->next = *chain;
    *chain = i;
    m->n++;
    m->head = (m->head + 1) % m->cap;
}

bool kg_cancel_memo_has(const kg_cancel_memo_t *m, const char *rid, int64_t now_ms) {
    int32_t i = m ? find(m, rid) : -1;
    return i >= 0 && now_ms - m->e[i].t_ms <= m->ttl_ms;
}

int32_t kg_cancel_memo_size(const kg_cancel_memo_t *m) {
    return m ? m->n : 0;
}

// ---- reader ----

typedef struct cancel_topic {
    char name[KG_CANCEL_NAME_MAX];
    int32_t n_parts; /* partitions assigned so far: 0 .. n_parts-1 */
    bool missing;    /* the topic was not there (or not ours to read) at the last look-up */
} cancel_topic_t;

struct kg_cancel {
    cancel_topic_t topics[KG_CANCEL_TOPICS_MAX];
    int n_topics;
    rd_kafka_t *rk;
    kg_cancel_memo_t *memo; /* NULL with capacity 0 */
    int64_t ttl_ms;
    int64_t next_lookup_us;
    pthread_t lookup_thread; /* the periodic look-up, while lookup_running */
    bool lookup_running;     /* (loop thread only) a look-up thread was started */
    atomic_bool lookup_done; /* set by that thread once found_n/found_err are written */
    int32_t found_n[KG_CANCEL_TOPICS_MAX];
    rd_kafka_resp_err_t found_err[KG_CANCEL_TOPICS_MAX];
    int64_t n_read;
    char group[600];    /* the reader's group.id: FindCoordinator needs Describe on it */
    bool denied_logged; /* a group authorization error was said once already */
};

/* The partitions of topic t, 0 when it is not there. */
static int32_t topic_partitions(kg_cancel_t *c, const cancel_topic_t *t, rd_kafka_resp_err_t *err) {
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(c->rk, t->name, NULL);
    const struct rd_kafka_metadata *md = NULL;
    int32_t n = 0;
    *err =
        rkt ? rd_kafka_metadata(c->rk, 0, rkt, &md, METADATA_MS) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (!*err && md->topic_cnt == 1) {
        *err = md->topics[0].err;
        n = *err ? 0 : md->topics[0].partition_cnt;
    }
    if (md) {
        rd_kafka_metadata_destroy(md);
    }
    if (rkt) {
        rd_kafka_topic_destroy(rkt);
    }
    return n;
}

/* Assign partitions [t->n_parts, n) of topic t from the first cancel within the TTL (the
 * end when none); incremental, so the other topics' partitions stay assigned. */
static void assign_new(kg_cancel_t *c, cancel_topic_t *t, int32_t n) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n - t->n_parts);
    int64_t since = kg_clock_epoch_ms() - c->ttl_ms;
    for (int32_t p = t->n_parts; p < n; p++) {
        rd_kafka_topic_partition_list_add(l, t->name, p)->offset = since;
    }
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(c->rk, l, METADATA_MS);
    for (int i = 0; i < l->cnt; i++) {
        if (err || l->elems[i].err || l->elems[i].offset < 0) {
            l->elems[i].offset = RD_KAFKA_OFFSET_END;
        }
    }
    rd_kafka_error_t *e = rd_kafka_incremental_assign(c->rk, l);
    if (e) {
        KG_LOG_WARN("cancel", "cannot read the cancel topic topic=%s error=\"%s\"", t->name,
                    rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
    } else {
        KG_LOG_INFO("cancel", "reading cancels topic=%s partitions=%d", t->name, n);
        t->n_parts = n;
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* What a look-up found for topic t: n partitions, or none with err. */
static void found(kg_cancel_t *c, cancel_topic_t *t, int32_t n, rd_kafka_resp_err_t err) {
    if (n == 0 && kg_kafka_err_no_broker(err)) {
        /* not a missing topic: no broker answered (down, or the login refused, which the
         * rdkafka errors say); whether it exists is known at the next look-up */
        KG_LOG_DEBUG("cancel", "cannot look the cancel topic up yet topic=%s error=\"%s\"", t->name,
                     rd_kafka_err2str(err));
        return;
    }
    if (n == 0 && kg_acl_denied(err)) {
        if (!t->missing) {
            char hint[320];
            KG_LOG_WARN("cancel", "cancellation is off for this topic: the worker %s topic=%s",
                        kg_acl_hint(err, "Read", t->name, hint, sizeof(hint)), t->name);
        }
        t->missing = true;
        return;
    }
    if (n == 0) {
        if (!t->missing) {
            KG_LOG_WARN("cancel",
                        "no cancel topic: its cancels are not read until it exists (it is "
                        "looked up again every 30 s) topic=%s error=\"%s\"",
                        t->name, rd_kafka_err2str(err));
        }
        t->missing = true;
        return;
    }
    t->missing = false;
    if (n > t->n_parts) {
        assign_new(c, t, n);
    }
}

/* At start: every topic looked up, blocking (the worker is not serving yet). */
static void look_up(kg_cancel_t *c) {
    c->next_lookup_us = kg_clock_us() + LOOKUP_US;
    for (int i = 0; i < c->n_topics; i++) {
        rd_kafka_resp_err_t err;
        int32_t n = topic_partitions(c, &c->topics[i], &err);
        found(c, &c->topics[i], n, err);
    }
}

/* The look-up thread: the topics' partitions into found_n/found_err, then lookup_done. */
static void *lookup_main(void *arg) {
    kg_cancel_t *c = arg;
    for (int i = 0; i < c->n_topics; i++) {
        c->found_n[i] = topic_partitions(c, &c->topics[i], &c->found_err[i]);
    }
    atomic_store(&c->lookup_done, true);
    return NULL;
}

/* Start a periodic look-up; a later poll takes its answer (take_lookup). */
static void send_lookup(kg_cancel_t *c) {
    c->next_lookup_us = kg_clock_us() + LOOKUP_US;
    atomic_store(&c->lookup_done, false);
    if (pthread_create(&c->lookup_thread, NULL, lookup_main, c) == 0) {
        c->lookup_running = true;
    } else {
        KG_LOG_DEBUG("cancel", "cannot start the cancel topics' look-up (tried again later)");
    }
}

/* The answer of the look-up send_lookup started, once it has come. */
static void take_lookup(kg_cancel_t *c) {
    if (!atomic_load(&c->lookup_done)) {
        return;
    }
    pthread_join(c->lookup_thread, NULL);
    c->lookup_running = false;
    for (int i = 0; i < c->n_topics; i++) {
        found(c, &c->topics[i], c->found_n[i], c->found_err[i]);
    }
}

int kg_cancel_topic_names(const kg_config_t *cfg,
                          const kg_lanes_t *lanes,
                          char names[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX]) {
    _Static_assert(KG_CANCEL_TOPICS_MAX >= KG_LANES_MAX, "a cancel topic per lane");
    if (strcmp(cfg->cancel_topic, "none") == 0) {
        return 0;
    }
    int n = *cfg->cancel_topic ? 1 : lanes->n;
    for (int l = 0; l < n; l++) {
        if (*cfg->cancel_topic) {
            snprintf(names[l], KG_CANCEL_NAME_MAX, "%s", cfg->cancel_topic);
        } else {
            snprintf(names[l], KG_CANCEL_NAME_MAX, "%s.cancel", lanes->lane[l].topic);
        }
    }
    return n;
}

kg_cancel_t *kg_cancel_new(const kg_config_t *cfg,
                           const char *const *topics,
                           int n_topics,
                           const char *worker_id,
                           int32_t capacity,
                           int64_t ttl_ms,
                           char *errstr,
                           size_t errstr_size) {
    kg_cancel_t *c = calloc(1, sizeof(*c));
    rd_kafka_conf_t *conf = NULL;
    if (!c) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    if (n_topics < 1 || n_topics > KG_CANCEL_TOPICS_MAX) {
        snprintf(errstr, errstr_size, "cancel reader: %d topics (1 to %d)", n_topics,
                 KG_CANCEL_TOPICS_MAX);
        goto fail;
    }
    for (int i = 0; i < n_topics; i++) {
        snprintf(c->topics[i].name, sizeof(c->topics[i].name), "%s", topics[i]);
    }
    c->n_topics = n_topics;
    c->ttl_ms = ttl_ms;
    if (capacity > 0 && !(c->memo = kg_cancel_memo_new(capacity, ttl_ms))) {
        snprintf(errstr, errstr_size, "out of memory for %d remembered cancels", capacity);
        goto fail;
    }
    conf = kg_kafka_conf_new(cfg, errstr, errstr_size);
    if (!conf) {
        goto fail;
    }
    char client_id[160], group[600];
    snprintf(client_id, sizeof(client_id), "%s-cancel", worker_id);
    snprintf(group, sizeof(group), "%s.cancel-reader", cfg->group_id);
    snprintf(c->group, sizeof(c->group), "%s", group);
    /* assign-only: the group id is required by the consumer API, never joined or committed */
    const char *props[] = {"group.id",
                           group,
                           "enable.auto.commit",
                           "false",
                           "enable.auto.offset.store",
                           "false",
                           "auto.offset.reset",
                           "latest",
                           "client.id",
                           client_id,
                           NULL};
    for (int i = 0; props[i]; i += 2) {
        if (kg_kafka_conf_set(conf, props[i], props[i + 1], errstr, errstr_size)) {
            goto fail;
        }
    }
    char err[512];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!c->rk) {
        snprintf(errstr, errstr_size, "cancel reader: %s", err);
        goto fail;
    }
    conf = NULL;
    rd_kafka_poll_set_consumer(c->rk);
    look_up(c);
    return c;
fail:
    if (conf) {
        rd_kafka_conf_destroy(conf);
    }
    kg_cancel_free(c);
    return NULL;
}

void kg_cancel_free(kg_cancel_t *c) {
    if (!c) {
        return;
    }
    if (c->lookup_running) {
        pthread_join(c->lookup_thread, NULL); /* up to METADATA_MS, at shutdown only */
    }
    if (c->rk) {
        rd_kafka_consumer_close(c->rk);
        rd_kafka_destroy(c->rk);
    }
    kg_cancel_memo_free(c->memo);
    free(c);
}

int kg_cancel_poll(kg_cancel_t *c, char (*rids)[KG_JOB_REQUEST_ID_MAX + 1], int max) {
    if (!c) {
        return 0;
    }
    if (c->lookup_running) {
        take_lookup(c);
    } else if (kg_clock_us() >= c->next_lookup_us) {
        send_lookup(c);
    }
    int n = 0;
    rd_kafka_message_t *rkm;
    while (n < max && (rkm = rd_kafka_consumer_poll(c->rk, 0)) != NULL) {
        char why[160];
        if (rkm->err) {
            if (kg_acl_denied(rkm->err)) {
                char hint[320];
                if (!c->denied_logged) {
                    bool group = rkm->err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
                    KG_LOG_WARN("cancel", "cancellation is off: the cancel reader %s error=\"%s\"",
                                kg_acl_hint(rkm->err, group ? "Describe" : "Read",
                                            group      ? c->group
                                            : rkm->rkt ? rd_kafka_topic_name(rkm->rkt)
                                                       : "",
                                            hint, sizeof(hint)),
                                rd_kafka_message_errstr(rkm));
                }
                c->denied_logged = true;
            } else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                KG_LOG_WARN("cancel", "reading cancels: %s", rd_kafka_message_errstr(rkm));
            }
        } else if (kg_cancelmsg_decode(rkm->key, rkm->key_len, rkm->payload, rkm->len, rids[n], why,
                                       sizeof(why)) != KG_OK) {
            KG_LOG_WARN("cancel", "skipping a cancel message partition=%d offset=%lld error=\"%s\"",
                        rkm->partition, (long long)rkm->offset, why);
        } else {
            kg_cancel_memo_add(c->memo, rids[n], kg_clock_epoch_ms());
            c->n_read++;
            n++;
        }
        rd_kafka_message_destroy(rkm);
    }
    return n;
}

bool kg_cancel_is_cancelled(const kg_cancel_t *c, const char *rid) {
    return c && kg_cancel_memo_has(c->memo, rid, kg_clock_epoch_ms());
}

int64_t kg_cancel_n_read(const kg_cancel_t *c) {
    return c ? c->n_read : 0;
}

int32_t kg_cancel_n_partitions(const kg_cancel_t *c) {
    int32_t n = 0;
    for (int i = 0; c && i < c->n_topics; i++) {
        n += c->topics[i].n_parts;
    }
    return n;
}

void kg_cancel_look_up_soon(kg_cancel_t *c) {
    if (c) {
        c->next_lookup_us = 0;
    }
}

bool kg_cancel_lookup_pending(const kg_cancel_t *c) {
    return c && c->lookup_running;
}

rd_kafka_resp_err_t
kg_cancel_send(rd_kafka_t *producer, const char *topic, const char *request_id) {
    char rid[KG_JOB_REQUEST_ID_MAX + 1], why[160];
    size_t n = strlen(request_id), len = 0;
    if (kg_cancelmsg_decode(request_id, n, NULL, 0, rid, why, sizeof(why)) != KG_OK) {
        return RD_KAFKA_RESP_ERR__INVALID_ARG;
    }
    char *value = kg_cancelmsg_encode(rid, &len);
    if (!value) {
        return RD_KAFKA_RESP_ERR__FAIL;
    }
    rd_kafka_resp_err_t err;
    do {
        err = rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(rid, n),
                                RD_KAFKA_V_VALUE(value, len),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(producer, 50);
        }
    } while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL);
    free(value);
    return err;
}
