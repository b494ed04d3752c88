/* kg_txn: answers and offsets in Kafka transactions; see kg_txn.h. */
#include "kg_txn.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_answered.h"
#include "kg_kafka_conf.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INIT_TRIES    6 /* init_transactions: 6 x 10 s while the coordinator is away */
#define INIT_MS       10000
#define API_TRIES     3     /* a retriable send_offsets / commit / abort is tried again */
#define TOKEN_WAIT_MS 10000 /* the token producer's flush before a commit */

typedef struct entry {
    const char *topic; /* borrowed from the worker (results or DLQ topic) */
    char *key, *value;
    size_t key_len, len;
    rd_kafka_headers_t *hdrs; /* owned, or NULL */
    const char *jobs_topic;   /* borrowed */
    int32_t partition;
    int64_t offset; /* the job's offset; -1 for an answer tied to no job */
    void *opaque;
    rd_kafka_resp_err_t refused; /* set by the delivery report: a message fault */
} entry_t;

/* The jobs answered above a partition's committed offset ride in the offset commit's metadata
 * (kg_answered.h), in the same transaction as their answers: `above` holds those of committed
 * transactions (and those a previous owner named), `sending` those the next or open transaction
 * names (what is left of `above` over the prefix, and its own answers above it). */
typedef struct offset {
    const char *topic; /* borrowed */
    int32_t partition;
    int64_t next, committed; /* -1 when none */
    int64_t sent;            /* what the open transaction carries for it, -1 when nothing */
    int64_t *above;          /* (n_above) ascending, all >= committed */
    int64_t *sending;        /* (n_sending, cap_sending) ascending, all >= next */
    uint32_t n_above, cap_above, n_sending, cap_sending;
    size_t sending_bytes; /* the items of `sending` in the metadata (kg_answered_item_bytes) */
    bool has_new;         /* sending names answers of this transaction above the prefix */
} offset_t;

struct kg_txn {
    rd_kafka_t *rk;
    kg_txn_callbacks_t cb;
    entry_t *e; /* (cap) */
    size_t n, cap;
    offset_t *offs; /* (n_offs) */
    size_t n_offs, cap_offs;
    uint64_t gen;     /* transactions begun, for the delivery reports */
    bool committing;  /* a commit timed out: it goes on in the background; call it again */
    size_t n_in_txn;  /* the first n_in_txn entries are in the open transaction */
    uint64_t kill_at; /* TEST-ONLY: SIGKILL this process before committing transaction n */
    int64_t interval_us, last_us;
    int64_t n_committed, n_aborted;
};

// ---- entries ----

static void entry_clear(entry_t *x) {
    free(x->key);
    free(x->value);
    if (x->hdrs) {
        rd_kafka_headers_destroy(x->hdrs);
    }
    memset(x, 0, sizeof(*x));
}

kg_status_t kg_txn_add(kg_txn_t *t,
                       const char *topic,
                       const void *key,
                       size_t key_len,
                       const void *value,
                       size_t len,
                       const rd_kafka_headers_t *hdrs,
                       const char *jobs_topic,
                       int32_t partition,
                       int64_t offset,
                       void *opaque) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        entry_t *e = realloc(t->e, cap * sizeof(*e));
        if (!e) {
            return KG_ERR_NOMEM;
        }
        t->e = e;
        t->cap = cap;
    }
    entry_t *x = &t->e[t->n];
    memset(x, 0, sizeof(*x));
    x->key = malloc(key_len ? key_len : 1);
    x->value = malloc(len ? len : 1);
    if (!x->key || !x->value) {
        entry_clear(x);
        return KG_ERR_NOMEM;
    }
    if (key_len) {
        memcpy(x->key, key, key_len);
    }
    if (len) {
        memcpy(x->value, value, len);
    }
    x->topic = topic;
    x->key_len = key_len;
    x->len = len;
    x->hdrs = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
    x->jobs_topic = jobs_topic;
    x->partition = partition;
    x->offset = partition >= 0 ? offset : -1;
    x->opaque = opaque;
    t->n++;
    return KG_OK;
}

size_t kg_txn_n_pending(const kg_txn_t *t) {
    return t->n;
}

static offset_t *find_offset(const kg_txn_t *t, const char *topic, int32_t partition) {
    for (size_t i = 0; i < t->n_offs; i++) {
        if (t->offs[i].partition == partition && strcmp(t->offs[i].topic, topic) == 0) {
            return &t->offs[i];
        }
    }
    return NULL;
}

/* The record of a partition, made with `next` when there is none; NULL when out of memory. */
static offset_t *
get_offset(kg_txn_t *t, const char *topic, int32_t partition, int64_t next, int64_t committed) {
    offset_t *o = find_offset(t, topic, partition);
    if (o) {
        return o;
    }
    if (t->n_offs == t->cap_offs) {
        size_t cap = t->cap_offs ? t->cap_offs * 2 : 64;
        offset_t *no = realloc(t->offs, cap * sizeof(*no));
        if (!no) {
            return NULL;
        }
        t->offs = no;
        t->cap_offs = cap;
    }
    o = &t->offs[t->n_offs++];
    *o = (offset_t){
        .topic = topic, .partition = partition, .next = next, .committed = committed, .sent = -1};
    return o;
}

static void offset_clear(offset_t *o) {
    free(o->above);
    free(o->sending);
    o->above = o->sending = NULL;
    o->n_above = o->cap_above = o->n_sending = o->cap_sending = 0;
    o->sending_bytes = 0;
}

size_t kg_txn_answered_above(const kg_txn_t *t,
                             const char *topic,
                             int32_t partition,
                             int64_t *committed,
                             int64_t *out,
                             size_t max) {
    const offset_t *o = find_offset(t, topic, partition);
    *committed = o ? o->committed : -1;
    size_t n = 0;
    for (uint32_t k = 0; o && k < o->n_above && n < max; k++) {
        if (o->above[k] > o->committed) {
            out[n++] = o->above[k];
        }
    }
    return n;
}

void kg_txn_set_offset(kg_txn_t *t, const char *topic, int32_t partition, int64_t next) {
    offset_t *o = get_offset(t, topic, partition, next, -1);
    if (o && next > o->next) {
        o->next = next; /* never back: front_eligible may have moved it over answered jobs */
    } /* out of memory: the offset is committed with a later one of the partition */
}

void kg_txn_track(kg_txn_t *t, const char *topic, int32_t partition, int64_t offset) {
    (void)get_offset(t, topic, partition, offset, -1); /* out of memory: answers wait */
}

kg_status_t kg_txn_seed_answered(kg_txn_t *t,
                                 const char *topic,
                                 int32_t partition,
                                 int64_t committed,
                                 const int64_t *offsets,
                                 size_t n) {
    offset_t *o = get_offset(t, topic, partition, committed, committed);
    int64_t *a = n ? malloc(n * sizeof(*a)) : NULL;
    if (!o || (n && !a)) {
        free(a);
        return KG_ERR_NOMEM;
    }
    if (n) {
        memcpy(a, offsets, n * sizeof(*a));
    }
    free(o->above);
    o->above = a;
    o->n_above = o->cap_above = (uint32_t)n;
    return KG_OK;
}

static bool
in_list(const rd_kafka_topic_partition_list_t *parts, const char *topic, int32_t partition) {
    for (int k = 0; parts && k < parts->cnt; k++) {
        if (parts->elems[k].partition == partition && strcmp(parts->elems[k].topic, topic) == 0) {
            return true;
        }
    }
    return parts == NULL;
}

void kg_txn_drop(kg_txn_t *t,
                 const char *jobs_topic,
                 const rd_kafka_topic_partition_list_t *parts) {
    size_t keep = 0, dropped = 0, in_txn = 0;
    for (size_t i = 0; i < t->n; i++) {
        entry_t *x = &t->e[i];
        if (strcmp(x->jobs_topic, jobs_topic) == 0 && in_list(parts, jobs_topic, x->partition)) {
            t->cb.dropped(t->cb.ctx, x->opaque);
            entry_clear(x);
            dropped++;
        } else {
            in_txn += i < t->n_in_txn; /* the open transaction's stay first */
            t->e[keep++] = *x;
        }
    }
    t->n = keep;
    t->n_in_txn = in_txn;
    for (size_t i = 0; i < t->n_offs;) {
        if (strcmp(t->offs[i].topic, jobs_topic) == 0 &&
            in_list(parts, jobs_topic, t->offs[i].partition)) {
            offset_clear(&t->offs[i]);
            if (i != --t->n_offs) {
                t->offs[i] = t->offs[t->n_offs];
                t->offs[t->n_offs] = (offset_t){0}; /* its lists live on at i */
            }
        } else {
            i++;
        }
    }
    if (dropped) {
        KG_LOG_WARN("txn",
                    "answers of revoked partitions dropped: their jobs run again on the new "
                    "owner count=%zu",
                    dropped);
    }
}

// ---- delivery reports ----

static void *pack(uint64_t gen, size_t i) {
    return (void *)(uintptr_t)((gen << 32) | (uint64_t)(i + 1));
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    kg_txn_t *t = opaque;
    uint64_t v = (uint64_t)(uintptr_t)rkm->_private;
    size_t i = (size_t)(v & 0xffffffffu);
    if (rkm->err && (v >> 32) == (t->gen & 0xffffffffu) && i >= 1 && i <= t->n &&
        t->cb.is_message_fault(rkm->err)) {
        t->e[i - 1].refused = rkm->err;
    }
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[512];
        rd_kafka_fatal_error(rk, buf, sizeof(buf));
        KG_LOG_ERROR("txn", "fatal: %s", buf);
        return;
    }
    kg_kafka_log_error(rk, err, reason);
}

// ---- committing ----

/* Answers the broker refused for their own sake are answered otherwise (the callback adds
 * their replacements, produced in this same loop when it runs during a transaction). */
static void replace_refused(kg_txn_t *t) {
    size_t keep = 0;
    size_t n = t->n;
    for (size_t i = 0; i < n; i++) {
        entry_t x = t->e[i];
        if (!x.refused) {
            t->e[keep++] = x;
            continue;
        }
        t->cb.refused(t->cb.ctx, x.topic, x.key, x.key_len, x.value, x.len, x.hdrs, x.opaque,
                      x.refused);
        entry_clear(&x);
    }
    /* replacements were appended after the first n: move them down */
    for (size_t i = n; i < t->n; i++) {
        t->e[keep++] = t->e[i];
    }
    t->n = keep;
}

/* Produce entry i into the open transaction. false: it cannot be (a local error other than
 * a message fault; the transaction is aborted). */
static bool produce_entry(kg_txn_t *t, size_t i) {
    for (int attempt = 0;; attempt++) {
        entry_t *x = &t->e[i];
        rd_kafka_headers_t *h = x->hdrs ? rd_kafka_headers_copy(x->hdrs) : NULL;
        rd_kafka_vu_t vus[6];
        size_t n = 0;
        vus[n].vtype = RD_KAFKA_VTYPE_TOPIC;
        vus[n++].u.cstr = x->topic;
        vus[n].vtype = RD_KAFKA_VTYPE_KEY;
        vus[n].u.mem.ptr = x->key;
        vus[n++].u.mem.size = x->key_len;
        vus[n].vtype = RD_KAFKA_VTYPE_VALUE;
        vus[n].u.mem.ptr = x->value;
        vus[n++].u.mem.size = x->len;
        vus[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vus[n++].u.i = RD_KAFKA_MSG_F_COPY;
        vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
        vus[n++].u.ptr = pack(t->gen, i);
        if (h) {
            vus[n].vtype = RD_KAFKA_VTYPE_HEADERS;
            vus[n++].u.headers = h;
        }
        rd_kafka_error_t *e = rd_kafka_produceva(t->rk, vus, n);
        if (!e) {
            return true;
        }
        rd_kafka_resp_err_t err = rd_kafka_error_code(e);
        rd_kafka_error_destroy(e);
        if (h) {
            rd_kafka_headers_destroy(h);
        }
        if (t->cb.is_message_fault(err)) {
            x->refused = err;
            return true;
        }
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || attempt > 600) {
            KG_LOG_WARN("txn", "cannot produce an answer: %s", rd_kafka_err2str(err));
            return false;
        }
        rd_kafka_poll(t->rk, 100);
    }
}

/* What to do after a failed transactional call. */
typedef enum verdict { V_RETRY, V_ABORT, V_FATAL } verdict_t;

static verdict_t judge(rd_kafka_error_t *e, const char *what) {
    verdict_t v = rd_kafka_error_is_fatal(e)             ? V_FATAL
                  : rd_kafka_error_txn_requires_abort(e) ? V_ABORT
                  : rd_kafka_error_is_retriable(e)       ? V_RETRY
                                                         : V_FATAL;
    KG_LOG_WARN("txn", "%s failed: %s (%s)", what, rd_kafka_error_string(e),
                v == V_FATAL   ? "fatal"
                : v == V_ABORT ? "the transaction is aborted; its answers are kept for the next"
                               : "retried");
    rd_kafka_error_destroy(e);
    return v;
}

/* Put `off` into o->sending (ascending, no repeats) if the metadata can still name every
 * offset there (counted as it grows, kg_answered_item_bytes, rather than encoded at each
 * answer); false when it cannot (or out of memory). */
static bool sending_add(offset_t *o, int64_t off) {
    if (off <= o->next) {
        return false; /* not above the offset (the prefix is about to pass it) */
    }
    uint32_t at = 0;
    while (at < o->n_sending && o->sending[at] < off) {
        at++;
    }
    if (at < o->n_sending && o->sending[at] == off) {
        return true; /* another answer of the same job (its DLQ copy) */
    }
    size_t bytes = kg_answered_item_bytes(o->next, off);
    if (strlen(KG_ANSWERED_PREFIX) + o->sending_bytes + bytes - 1 > KG_ANSWERED_MAX_BYTES) {
        return false; /* the metadata has no room left for it */
    }
    if (o->n_sending == o->cap_sending) {
        uint32_t cap = o->cap_sending ? o->cap_sending * 2 : 16;
        int64_t *s = realloc(o->sending, cap * sizeof(*s));
        if (!s) {
            return false;
        }
        o->sending = s;
        o->cap_sending = cap;
    }
    memmove(o->sending + at + 1, o->sending + at, (o->n_sending - at) * sizeof(*o->sending));
    o->sending[at] = off;
    o->n_sending++;
    o->sending_bytes += bytes;
    return true;
}

/* An answer may commit only in a transaction that also takes its job off the group's hands:
 * either the partition's offset passes the job (kg_txn_set_offset: its finished prefix does),
 * or the offset commit's metadata names the job as answered above that offset (kg_answered.h),
 * which the next owner reads and skips. Were it committed without either, it would be visible
 * while the group still has the job unconsumed, and a new owner would answer it again. So a
 * short job that finished behind a long one of its partition is visible at the next
 * transaction, not when the long one ends; one the metadata has no room left for waits. */
static bool eligible(kg_txn_t *t, const entry_t *x) {
    if (x->offset < 0) {
        return true;
    }
    offset_t *o = find_offset(t, x->jobs_topic, x->partition);
    if (!o) {
        return false;
    }
    if (x->offset < o->next) {
        return true;
    }
    if (sending_add(o, x->offset)) {
        o->has_new = true;
        return true;
    }
    return false;
}

/* Move the answers that may commit now to the front, each group in its order; returns how
 * many. Out of memory for the scratch copy: 0 (they commit at a later turn). */
static size_t front_eligible(kg_txn_t *t) {
    /* what the metadata names before this transaction's answers: the committed list over the
     * prefix (a job the prefix passed needs no naming) */
    for (size_t i = 0; i < t->n_offs; i++) {
        offset_t *o = &t->offs[i];
        o->n_sending = 0;
        o->sending_bytes = 0;
        o->has_new = false;
        uint32_t k = 0;
        while (k < o->n_above && o->above[k] < o->next) {
            k++;
        }
        /* the prefix reached a job a previous owner answered, before this worker came to skip
         * it: the offset may pass it already (and must, the list cannot name the offset) */
        while (k < o->n_above && o->above[k] == o->next) {
            o->next++;
            k++;
        }
        for (; k < o->n_above; k++) {
            if (!sending_add(o, o->above[k])) {
                break; /* cannot happen: the list was encoded from a lower base */
            }
        }
    }
    if (t->n == 0) {
        return 0;
    }
    entry_t *waiting = malloc(t->n * sizeof(*waiting)); /* (n) */
    if (!waiting) {
        return 0;
    }
    size_t n_ok = 0, n_wait = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (eligible(t, &t->e[i])) {
            t->e[n_ok++] = t->e[i];
        } else {
            waiting[n_wait++] = t->e[i];
        }
    }
    memcpy(t->e + n_ok, waiting, n_wait * sizeof(*waiting));
    free(waiting);
    return n_ok;
}

/* A partition's offset goes into the transaction when its prefix moved or the transaction
 * answers jobs above it; the metadata names what is answered above it (none: no metadata,
 * which also clears an earlier list the prefix has passed). */
static bool offset_pending(const offset_t *o) {
    return o->next > o->committed || o->has_new;
}

static bool any_offset_pending(const kg_txn_t *t) {
    for (size_t i = 0; i < t->n_offs; i++) {
        if (offset_pending(&t->offs[i])) {
            return true;
        }
    }
    return false;
}

/* The offsets to send; NULL when out of memory or when a list does not encode whole (a list
 * without its metadata would hand the jobs it names to the next owner again: the transaction
 * is aborted instead). */
static rd_kafka_topic_partition_list_t *pending_offsets(const kg_txn_t *t) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)t->n_offs + 1);
    char md[KG_ANSWERED_MAX_BYTES + 1];
    for (size_t i = 0; i < t->n_offs; i++) {
        const offset_t *o = &t->offs[i];
        if (!offset_pending(o)) {
            continue;
        }
        rd_kafka_topic_partition_t *e =
            rd_kafka_topic_partition_list_add(l, o->topic, o->partition);
        e->offset = o->next;
        if (o->n_sending > 0) {
            /* sending_add kept the list within the metadata's room: it encodes whole */
            bool whole = kg_answered_encode(o->next, o->sending, o->n_sending, md, sizeof(md)) ==
                         o->n_sending;
            e->metadata_size = strlen(md);
            e->metadata = whole ? malloc(e->metadata_size) : NULL; /* the list frees it */
            if (!e->metadata) {
                e->metadata_size = 0;
                rd_kafka_topic_partition_list_destroy(l);
                return NULL;
            }
            memcpy(e->metadata, md, e->metadata_size);
        }
    }
    return l;
}

/* Record what this transaction's offsets are (what a commit makes committed). */
static void mark_sent(kg_txn_t *t) {
    for (size_t i = 0; i < t->n_offs; i++) {
        t->offs[i].sent = offset_pending(&t->offs[i]) ? t->offs[i].next : -1;
    }
}

static verdict_t send_offsets(kg_txn_t *t, rd_kafka_t *consumer) {
    rd_kafka_topic_partition_list_t *l = pending_offsets(t);
    verdict_t v = V_RETRY;
    if (!l) {
        return V_ABORT;
    }
    if (l->cnt == 0) {
        rd_kafka_topic_partition_list_destroy(l);
        return V_RETRY; /* nothing to send: "retry" means go on */
    }
    rd_kafka_consumer_group_metadata_t *cgmd = rd_kafka_consumer_group_metadata(consumer);
    for (int tries = 0; tries < API_TRIES; tries++) {
        rd_kafka_error_t *e = rd_kafka_send_offsets_to_transaction(t->rk, l, cgmd, -1);
        if (!e) {
            v = V_RETRY;
            break;
        }
        v = judge(e, "send_offsets_to_transaction");
        if (v != V_RETRY) {
            break;
        }
        v = V_ABORT; /* still failing after the last try */
    }
    rd_kafka_consumer_group_metadata_destroy(cgmd);
    rd_kafka_topic_partition_list_destroy(l);
    return v;
}

static void abort_txn(kg_txn_t *t) {
    for (int tries = 0; tries < API_TRIES; tries++) {
        rd_kafka_error_t *e = rd_kafka_abort_transaction(t->rk, -1);
        if (!e || judge(e, "abort_transaction") != V_RETRY) {
            break;
        }
    }
    rd_kafka_poll(t->rk, 0); /* the purged answers' reports */
    for (size_t i = 0; i < t->n_offs; i++) {
        t->offs[i].sent = -1;
    }
    t->n_in_txn = 0;
    t->n_aborted++;
    replace_refused(t);
}

/* The open transaction committed: its answers are visible, its offsets committed; answers
 * added while it was committing wait for the next. */
static void committed(kg_txn_t *t) {
    size_t n = t->n_in_txn < t->n ? t->n_in_txn : t->n;
    for (size_t i = 0; i < n; i++) {
        t->cb.committed(t->cb.ctx, t->e[i].opaque, t->e[i].key, t->e[i].key_len);
        entry_clear(&t->e[i]);
    }
    memmove(t->e, t->e + n, (t->n - n) * sizeof(*t->e));
    t->n -= n;
    t->n_in_txn = 0;
    for (size_t i = 0; i < t->n_offs; i++) {
        offset_t *o = &t->offs[i];
        if (o->sent >= 0) {
            /* the metadata sent is what the broker now holds for the partition */
            int64_t *a = o->above;
            uint32_t cap = o->cap_above;
            o->above = o->sending;
            o->n_above = o->n_sending;
            o->cap_above = o->cap_sending;
            o->sending = a;
            o->cap_sending = cap;
            o->n_sending = 0;
            o->sending_bytes = 0;
            o->has_new = false;
            if (o->sent > o->committed) {
                o->committed = o->sent;
            }
        }
        o->sent = -1;
    }
    t->n_committed++;
}

/* TEST-ONLY fault injection (KGEN_TEST_KILL_BEFORE_COMMIT=N, announced at
 * startup): the N-th transaction's answers and offsets reach the broker, then
 * the process is SIGKILLed before the commit, so tests can show that an open
 * transaction of a dead worker stays invisible to read_committed readers. */
static void kill_before_commit(kg_txn_t *t) {
    rd_kafka_flush(t->rk, 10000);
    KG_LOG_ERROR("txn",
                 "TEST-ONLY fault injection: SIGKILL before committing transaction=%llu "
                 "answers=%zu",
                 (unsigned long long)t->gen, t->n);
    raise(SIGKILL);
}

/* commit_transaction, once: resumable after a timeout (the broker away), so a retriable
 * failure leaves the commit going on and the next turn calls it again. */
static kg_status_t finish_commit(kg_txn_t *t) {
    rd_kafka_error_t *e = rd_kafka_commit_transaction(t->rk, -1);
    if (!e) {
        t->committing = false;
        committed(t);
        return KG_OK;
    }
    verdict_t v = judge(e, "commit_transaction");
    if (v == V_RETRY) {
        return KG_AGAIN;
    }
    t->committing = false;
    if (v == V_FATAL) {
        return KG_ERR_KAFKA;
    }
    abort_txn(t);
    return KG_AGAIN;
}

kg_status_t
kg_txn_commit(kg_txn_t *t, rd_kafka_t *tokens, rd_kafka_t *consumer, int64_t now_us, bool force) {
    if (!force && t->n < KG_TXN_MAX_ENTRIES && now_us - t->last_us < t->interval_us) {
        return KG_OK;
    }
    t->last_us = now_us;
    if (t->committing) {
        return finish_commit(t);
    }
    size_t n_ok = front_eligible(t);
    if (n_ok == 0 && !any_offset_pending(t)) {
        return KG_OK;
    }
    /* a job's token events come before its terminal event in the partition: while some
     * are still on their way (a broker restarting), the commit waits for the next turn
     * rather than put answers ahead of them (committing anyway did, after a broker
     * restart in test_worker_exactly_once); they leave the queue within
     * message.timeout.ms, delivered or failed */
    if (tokens && rd_kafka_flush(tokens, TOKEN_WAIT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        KG_LOG_WARN("txn",
                    "token events still on their way after %d ms: the commit waits for them "
                    "answers=%zu",
                    TOKEN_WAIT_MS, t->n);
        return KG_AGAIN;
    }
    rd_kafka_error_t *e = rd_kafka_begin_transaction(t->rk);
    if (e) {
        return judge(e, "begin_transaction") == V_FATAL ? KG_ERR_KAFKA : KG_AGAIN;
    }
    t->gen++;
    verdict_t v = V_RETRY;
    for (size_t i = 0; i < n_ok; i++) {
        if (!produce_entry(t, i)) {
            v = V_ABORT;
            break;
        }
        if (t->e[i].refused) {
            /* refused by the producer itself: its replacement goes into this transaction */
            replace_refused(t);
            n_ok = front_eligible(t);
            i = (size_t)-1; /* produce from the start again: indices moved */
            rd_kafka_error_t *ae = rd_kafka_abort_transaction(t->rk, -1);
            if (ae) {
                return judge(ae, "abort_transaction") == V_FATAL ? KG_ERR_KAFKA : KG_AGAIN;
            }
            e = rd_kafka_begin_transaction(t->rk);
            if (e) {
                return judge(e, "begin_transaction") == V_FATAL ? KG_ERR_KAFKA : KG_AGAIN;
            }
            t->gen++;
        }
    }
    if (v == V_RETRY) {
        mark_sent(t);
        v = send_offsets(t, consumer);
    }
    if (v == V_RETRY && t->kill_at && t->gen == t->kill_at) {
        kill_before_commit(t);
    }
    if (v == V_RETRY) {
        t->n_in_txn = n_ok;
        t->committing = true;
        return finish_commit(t);
    }
    if (v == V_FATAL) {
        return KG_ERR_KAFKA;
    }
    abort_txn(t);
    return KG_AGAIN;
}

// ---- lifecycle ----

kg_txn_t *kg_txn_new(const kg_config_t *cfg,
                     rd_kafka_conf_t *conf,
                     const char *worker_id,
                     const kg_txn_callbacks_t *cb,
                     char *errstr,
                     size_t errstr_size) {
    kg_txn_t *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(errstr, errstr_size, "out of memory");
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    t->cb = *cb;
    t->interval_us = cfg->txn_interval_ms * 1000;
    char id[600], buf[32];
    snprintf(id, sizeof(id), "kgen-%s-%s", cfg->group_id, worker_id);
    size_t bl = sizeof(buf);
    bool timeout_given = false;
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        timeout_given |= strcmp(cfg->kafka_keys[i], "transaction.timeout.ms") == 0;
    }
    (void)bl;
    /* a dead worker's open transaction holds read_committed readers and the group's offsets
     * of its partitions back until the broker aborts it: 10 s rather than librdkafka's 60 */
    if (rd_kafka_conf_set(conf, "transactional.id", id, errstr, errstr_size) ||
        (!timeout_given &&
         rd_kafka_conf_set(conf, "transaction.timeout.ms", "10000", errstr, errstr_size))) {
        rd_kafka_conf_destroy(conf);
        free(t);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, t);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    char err[512];
    t->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!t->rk) {
        snprintf(errstr, errstr_size, "transactional producer: %s", err);
        rd_kafka_conf_destroy(conf);
        free(t);
        return NULL;
    }
    for (int tries = 0;; tries++) {
        rd_kafka_error_t *e = rd_kafka_init_transactions(t->rk, INIT_MS);
        if (!e) {
            break;
        }
        bool retry = rd_kafka_error_is_retriable(e) && tries + 1 < INIT_TRIES;
        snprintf(errstr, errstr_size, "init_transactions (transactional.id %s): %s", id,
                 rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        if (!retry) {
            kg_txn_free(t);
            return NULL;
        }
        KG_LOG_WARN("txn", "%s; trying again", errstr);
    }
    t->last_us = kg_clock_us();
    const char *kill_at = getenv("KGEN_TEST_KILL_BEFORE_COMMIT");
    if (kill_at && strtoll(kill_at, NULL, 10) > 0) {
        t->kill_at = (uint64_t)strtoll(kill_at, NULL, 10);
        KG_LOG_WARN(
            "txn",
            "TEST-ONLY fault injection armed: this worker SIGKILLs itself before "
            "committing transaction %llu (KGEN_TEST_KILL_BEFORE_COMMIT; never in production)",
            (unsigned long long)t->kill_at);
    }
    KG_LOG_INFO("txn", "exactly-once results transactional_id=%s interval_ms=%lld", id,
                (long long)cfg->txn_interval_ms);
    return t;
}

void kg_txn_free(kg_txn_t *t) {
    if (!t) {
        return;
    }
    for (size_t i = 0; i < t->n; i++) {
        t->cb.dropped(t->cb.ctx, t->e[i].opaque);
        entry_clear(&t->e[i]);
    }
    if (t->rk) {
        rd_kafka_purge(t->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(t->rk, 0);
        rd_kafka_destroy(t->rk);
    }
    free(t->e);
    for (size_t i = 0; i < t->n_offs; i++) {
        offset_clear(&t->offs[i]);
    }
    free(t->offs);
    free(t);
}

rd_kafka_t *kg_txn_producer(kg_txn_t *t) {
    return t->rk;
}

int64_t kg_txn_n_committed(const kg_txn_t *t) {
    return t->n_committed;
}

int64_t kg_txn_n_aborted(const kg_txn_t *t) {
    return t->n_aborted;
}
