/* kg_journal: in-flight snapshots on Kafka (see kg_journal.h). */
#include "kg_journal.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../schema/kg_inflight.h"
#include "kg_acl.h"
#include "kg_kafka_conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAIL_RECORDS   16             /* records read back on assignment */
#define READ_MS        10000          /* at most, to read them */
#define FLUSH_MS       10000          /* at most, for the clean snapshots on revoke */
#define GRACE_EXTRA_MS 2000           /* beyond a heartbeat, for an evicted owner's revoke */
#define BACKOFF_MAX_MS 10000          /* librdkafka's reconnect.backoff.max.ms */
#define LAZY_US        (200 * 1000LL) /* finished jobs leave the record within this */
#define MAX_ENTRIES    KG_INFLIGHT_MAX_JOBS

typedef enum jstate {
    J_WAITING, /* carries strikes, not running here */
    J_STARTED, /* running (or about to) */
    J_SOLO,    /* running (or about to) as the only job on the worker */
} jstate_t;

typedef struct jentry {
    int64_t offset;
    uint8_t strikes;
    uint8_t level; /* kg_suspects.h */
    uint8_t alone; /* failures it was the only job running in */
    uint8_t state; /* jstate_t */
} jentry_t;

/* One jobs partition this worker owns. */
typedef struct jpart {
    bool active;     /* assigned */
    bool protected_; /* journaled: a counterpart partition exists and writes succeed */
    bool pruned;     /* entries below the first offset taken were dropped */
    int64_t epoch;
    uint64_t seq_written, seq_acked;
    int32_t n_in_flight; /* snapshots on their way */
    bool dirty, urgent;
    int64_t dirty_since_us;
    jentry_t *e; /* (n) sorted by offset */
    size_t n, cap;
} jpart_t;

/* The opaque of a snapshot message, for its delivery report. */
typedef struct jticket {
    int32_t partition;
    int64_t epoch;
    uint64_t seq;
} jticket_t;

struct kg_journal {
    const kg_config_t *cfg;
    char worker_id[128];
    char jobs_topic[256]; /* the jobs topic it records */
    char topic[512];
    bool off;       /* the in-flight topic is not there: nothing is journaled */
    bool no_broker; /* the last look-up found no broker that answered (down, login refused) */
    rd_kafka_resp_err_t denied; /* the last look-up's authorization error (kg_acl.h), or 0 */
    char reader_group[600];     /* FindCoordinator needs Describe on it */
    bool reader_denied_logged;
    int32_t n_topic_parts; /* partitions of the in-flight topic */
    rd_kafka_t *producer, *reader;
    rd_kafka_topic_t *reader_rkt; /* keeps the topic's leaders known to the reader */
    jpart_t *parts;               /* (n_parts) by jobs partition */
    int32_t n_parts;
    int64_t grace_us;         /* how long a new owner waits for a live predecessor's clean record */
    int64_t verdict_grace_us; /* the same, where the failure would decide a verdict */
};

// ---- entries ----

/* Index of the first entry with offset >= `offset`. */
static size_t lower_bound(const jpart_t *jp, int64_t offset) {
    size_t lo = 0, hi = jp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (jp->e[mid].offset < offset) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static jentry_t *find(jpart_t *jp, int64_t offset) {
    size_t i = lower_bound(jp, offset);
    return i < jp->n && jp->e[i].offset == offset ? &jp->e[i] : NULL;
}

static jentry_t *insert(jpart_t *jp, int64_t offset) {
    size_t i = lower_bound(jp, offset);
    if (i < jp->n && jp->e[i].offset == offset) {
        return &jp->e[i];
    }
    if (jp->n == MAX_ENTRIES) {
        return NULL;
    }
    if (jp->n == jp->cap) {
        size_t cap = jp->cap ? jp->cap * 2 : 64;
        jentry_t *e = realloc(jp->e, cap * sizeof(*e));
        if (!e) {
            return NULL;
        }
        jp->e = e;
        jp->cap = cap;
    }
    memmove(&jp->e[i + 1], &jp->e[i], (jp->n - i) * sizeof(*jp->e));
    jp->n++;
    jp->e[i] = (jentry_t){.offset = offset};
    return &jp->e[i];
}

static void erase(jpart_t *jp, jentry_t *x) {
    size_t i = (size_t)(x - jp->e);
    memmove(&jp->e[i], &jp->e[i + 1], (jp->n - i - 1) * sizeof(*jp->e));
    jp->n--;
}

static void mark_dirty(jpart_t *jp, bool urgent) {
    if (!jp->dirty) {
        jp->dirty_since_us = kg_clock_us();
    }
    jp->dirty = true;
    jp->urgent |= urgent;
}

static jpart_t *part(const kg_journal_t *j, int32_t partition) {
    if (!j || partition < 0 || partition >= j->n_parts || !j->parts[partition].active) {
        return NULL;
    }
    return &j->parts[partition];
}

// ---- writing ----

/* The entries as runs of consecutive offsets with equal strikes and state;
 * jobs that wait with no strike are not worth a record. */
static kg_inflight_run_t *entries_to_runs(const jpart_t *jp, size_t *n_runs) {
    kg_inflight_run_t *runs = malloc((jp->n ? jp->n : 1) * sizeof(*runs));
    size_t k = 0;
    for (size_t i = 0; runs && i < jp->n; i++) {
        const jentry_t *x = &jp->e[i];
        bool started = x->state != J_WAITING, solo = x->state == J_SOLO;
        if (!started && x->strikes == 0) {
            continue;
        }
        kg_inflight_run_t *last = k ? &runs[k - 1] : NULL;
        if (last && last->offset + last->count == x->offset && last->strikes == x->strikes &&
            last->started == started && last->level == x->level && last->alone == x->alone &&
            last->solo == solo) {
            last->count++;
        } else {
            runs[k++] = (kg_inflight_run_t){.offset = x->offset,
                                            .count = 1,
                                            .strikes = x->strikes,
                                            .started = started,
                                            .level = x->level,
                                            .alone = x->alone,
                                            .solo = solo};
        }
    }
    *n_runs = k;
    return runs;
}

static void unprotect(kg_journal_t *j, int32_t partition, const char *why) {
    jpart_t *jp = &j->parts[partition];
    if (jp->protected_) {
        KG_LOG_ERROR("journal",
                     "poison-job protection is off for this partition until it is assigned "
                     "again partition=%d reason=\"%s\"",
                     partition, why);
    }
    jp->protected_ = false;
}

static void write_snapshot(kg_journal_t *j, int32_t partition, bool clean) {
    jpart_t *jp = &j->parts[partition];
    size_t n_runs;
    kg_inflight_run_t *runs = entries_to_runs(jp, &n_runs);
    kg_inflight_t s = {.jobs_topic = (char *)j->jobs_topic,
                       .partition = partition,
                       .worker_id = j->worker_id,
                       .epoch = jp->epoch,
                       .seq = (int64_t)jp->seq_written + 1,
                       .clean = clean,
                       .runs = runs,
                       .n_runs = n_runs};
    size_t len;
    char *json = runs ? kg_inflight_encode(&s, &len) : NULL;
    jticket_t *t = malloc(sizeof(*t));
    free(runs);
    if (!json || !t) {
        free(json);
        free(t);
        unprotect(j, partition, "out of memory");
        return;
    }
    *t = (jticket_t){.partition = partition, .epoch = jp->epoch, .seq = jp->seq_written + 1};
    char key[600];
    int kl = snprintf(key, sizeof(key), "%s/%d", j->jobs_topic, partition);
    rd_kafka_vu_t vus[6] = {
        {.vtype = RD_KAFKA_VTYPE_TOPIC, .u.cstr = j->topic},
        {.vtype = RD_KAFKA_VTYPE_PARTITION, .u.i32 = partition},
        {.vtype = RD_KAFKA_VTYPE_KEY, .u.mem = {key, (size_t)kl}},
        {.vtype = RD_KAFKA_VTYPE_VALUE, .u.mem = {json, len}},
        {.vtype = RD_KAFKA_VTYPE_MSGFLAGS, .u.i = RD_KAFKA_MSG_F_FREE},
        {.vtype = RD_KAFKA_VTYPE_OPAQUE, .u.ptr = t},
    };
    rd_kafka_error_t *e = rd_kafka_produceva(j->producer, vus, 6);
    if (e) {
        char why[256];
        snprintf(why, sizeof(why), "cannot produce a snapshot: %s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        free(json);
        free(t);
        unprotect(j, partition, why);
        return;
    }
    /* the ticket t travels as the message's opaque and the delivery report frees it: clang-tidy
     * cannot follow it there */
    jp->seq_written++; // NOLINT(clang-analyzer-unix.Malloc)
    jp->n_in_flight++;
    jp->dirty = jp->urgent = false;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    kg_journal_t *j = opaque;
    jticket_t *t = rkm->_private;
    jpart_t *jp = part(j, t->partition);
    if (jp && jp->epoch == t->epoch) { /* else: a partition given up since */
        jp->n_in_flight--;
        if (rkm->err) {
            char why[256];
            snprintf(why, sizeof(why), "snapshot not delivered: %s", rd_kafka_err2str(rkm->err));
            unprotect(j, t->partition, why);
        } else if (t->seq > jp->seq_acked) {
            jp->seq_acked = t->seq;
        }
    }
    free(t);
}

void kg_journal_poll(kg_journal_t *j, int64_t now_us, int timeout_ms) {
    if (!j) {
        return;
    }
    /* A job waiting to start is written at once, even with an earlier
     * snapshot still on its way (the idempotent producer keeps them in
     * order, so an ack for seq n means every seq up to n is on the broker);
     * finished jobs wait for a quiet moment and ride along. */
    for (int32_t p = 0; p < j->n_parts; p++) {
        jpart_t *jp = &j->parts[p];
        if (jp->active && jp->protected_ && jp->dirty &&
            (jp->urgent || (jp->n_in_flight == 0 && now_us - jp->dirty_since_us >= LAZY_US))) {
            write_snapshot(j, p, false);
        }
    }
    rd_kafka_poll(j->producer, timeout_ms);
}

// ---- per job ----

bool kg_journal_lookup(kg_journal_t *j, int32_t partition, int64_t offset, kg_journal_rec_t *rec) {
    jpart_t *jp = part(j, partition);
    *rec = (kg_journal_rec_t){0};
    if (!jp || !jp->protected_) {
        return false;
    }
    if (!jp->pruned) {
        /* the first offset taken is where the committed prefix ends: the
         * jobs below it are finished, whatever their record says */
        size_t k = lower_bound(jp, offset);
        if (k > 0) {
            memmove(jp->e, jp->e + k, (jp->n - k) * sizeof(*jp->e));
            jp->n -= k;
        }
        jp->pruned = true;
    }
    const jentry_t *x = find(jp, offset);
    if (x) {
        *rec = (kg_journal_rec_t){.strikes = x->strikes, .level = x->level, .alone = x->alone};
    }
    return true;
}

int kg_journal_strikes(kg_journal_t *j, int32_t partition, int64_t offset) {
    kg_journal_rec_t rec;
    return kg_journal_lookup(j, partition, offset, &rec) ? rec.strikes : -1;
}

int kg_journal_n_waiting(const kg_journal_t *j, int32_t partition) {
    const jpart_t *jp = part(j, partition);
    int n = 0;
    for (size_t i = 0; jp && jp->protected_ && i < jp->n; i++) {
        n += jp->e[i].state == J_WAITING && jp->e[i].strikes > 0;
    }
    return n;
}

uint64_t kg_journal_start(kg_journal_t *j, int32_t partition, int64_t offset, bool solo) {
    jpart_t *jp = part(j, partition);
    if (!jp || !jp->protected_) {
        return 0;
    }
    jentry_t *x = insert(jp, offset);
    if (!x) {
        unprotect(j, partition, "too many jobs in flight to record");
        return 0;
    }
    x->state = solo ? J_SOLO : J_STARTED; /* its strikes, level and alone stay as taken over */
    mark_dirty(jp, true);
    return jp->seq_written + 1;
}

bool kg_journal_durable(const kg_journal_t *j, int32_t partition, uint64_t ticket) {
    const jpart_t *jp = part(j, partition);
    return !jp || !jp->protected_ || jp->seq_acked >= ticket;
}

void kg_journal_finish(kg_journal_t *j, int32_t partition, int64_t offset) {
    jpart_t *jp = part(j, partition);
    jentry_t *x = jp ? find(jp, offset) : NULL;
    if (x) {
        erase(jp, x);
        mark_dirty(jp, false);
    }
}

void kg_journal_release(kg_journal_t *j, int32_t partition, int64_t offset) {
    jpart_t *jp = part(j, partition);
    jentry_t *x = jp ? find(jp, offset) : NULL;
    if (x && x->state != J_WAITING) {
        x->state = J_WAITING;
        mark_dirty(jp, false);
    }
}

/* Look the in-flight topic up: its partitions, or `off` when it is not
 * there. At startup and again at every assignment: the broker may have been
 * down at startup, the topic created or grown since. */
static void look_up_topic(kg_journal_t *j) {
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(j->producer, j->topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    int32_t n_parts = 0;
    rd_kafka_resp_err_t err =
        rkt ? rd_kafka_metadata(j->producer, 0, rkt, &md, 5000) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (!err && md->topic_cnt == 1 && !md->topics[0].err) {
        n_parts = md->topics[0].partition_cnt;
    } else {
        err = err ? err : md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    }
    if (md) {
        rd_kafka_metadata_destroy(md);
    }
    if (rkt) {
        rd_kafka_topic_destroy(rkt);
    }
    bool found = !err && n_parts > 0;
    /* whether the topic is there is unknown then: no warning says it is missing */
    j->no_broker = !found && kg_kafka_err_no_broker(err);
    j->denied = !found && kg_acl_denied(err) ? err : RD_KAFKA_RESP_ERR_NO_ERROR;
    if (found && (j->off || n_parts != j->n_topic_parts)) {
        KG_LOG_INFO("journal", "poison-job protection on topic=%s partitions=%d", j->topic,
                    n_parts);
    } else if (!found && !j->off && j->no_broker) {
        KG_LOG_WARN("journal",
                    "poison-job protection is off until a broker answers (down, or the login "
                    "refused) topic=%s error=\"%s\"",
                    j->topic, rd_kafka_err2str(err));
    } else if (!found && !j->off && j->denied) {
        char hint[320];
        KG_LOG_WARN("journal", "poison-job protection is off: the worker %s topic=%s",
                    kg_acl_hint(err, "Read and Write", j->topic, hint, sizeof(hint)), j->topic);
    } else if (!found && !j->off) {
        KG_LOG_WARN("journal",
                    "poison-job protection is off: the in-flight topic is not there (create it "
                    "with cleanup.policy=compact and as many partitions as the jobs topic) "
                    "topic=%s error=\"%s\"",
                    j->topic, rd_kafka_err2str(err));
    }
    j->off = !found;
    j->n_topic_parts = found ? n_parts : 0;
    if (found && !j->reader_rkt) {
        /* a reader that does not know the topic's leaders yet waits a
         * second-long offset-query backoff on the first assignment: learn
         * them now and keep them fresh (a topic handle keeps it known) */
        j->reader_rkt = rd_kafka_topic_new(j->reader, j->topic, NULL);
        if (j->reader_rkt && rd_kafka_metadata(j->reader, 0, j->reader_rkt, &md, 5000) ==
                                 RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_metadata_destroy(md);
        }
    }
}

// ---- assignment ----

static bool grow_parts(kg_journal_t *j, int32_t partition) {
    if (partition < j->n_parts) {
        return true;
    }
    jpart_t *p = realloc(j->parts, (size_t)(partition + 1) * sizeof(*p));
    if (!p) {
        return false;
    }
    memset(p + j->n_parts, 0, (size_t)(partition + 1 - j->n_parts) * sizeof(*p));
    j->parts = p;
    j->n_parts = partition + 1;
    return true;
}

/* Whether snapshot `a` supersedes `b`: a larger epoch, or the same owner's later one. */
static bool newer(const kg_inflight_t *a, const kg_inflight_t *b) {
    return a->epoch > b->epoch || (a->epoch == b->epoch && a->seq > b->seq);
}

/* The index of partition `p` in parts[0 .. n-1], or n. */
static int index_of(const int32_t *parts, int n, int32_t p) {
    int i = 0;
    while (i < n && parts[i] != p) {
        i++;
    }
    return i;
}

/* Whether the owner of snapshot `s` may have failed with jobs running. */
static bool left_running(const kg_inflight_t *s) {
    for (size_t r = 0; s->epoch > 0 && !s->clean && r < s->n_runs; r++) {
        if (s->runs[r].started) {
            return true;
        }
    }
    return false;
}

/* Whether counting the failure of the owner of `s` could answer a job: one ran solo in it (its
 * alone count is what the verdict reads, kg_suspects.h), or every failure answers
 * (--poison-after 1). Any other failure only moves jobs in the search for the culprit. */
static bool decides_a_verdict(const kg_journal_t *j, const kg_inflight_t *s) {
    if (!left_running(s)) {
        return false;
    }
    for (size_t r = 0; r < s->n_runs; r++) {
        if (s->runs[r].started && (s->runs[r].solo || j->cfg->poison_after == 1)) {
            return true;
        }
    }
    return false;
}

/* An owner whose last snapshot is not clean may still be alive: evicted from the group (its
 * session timed out while the broker restarted, say), not dead. It learns so at its next
 * heartbeat and revokes, which writes a clean snapshot. Wait for one before its running jobs
 * are counted in a failure. A dead owner writes nothing: its strikes stand after the wait.
 * How long: a heartbeat + 2 s (grace_us) covers an owner that can reach the broker; one cut
 * off by a broker restart reconnects only after its reconnect back-off, which doubles up to
 * reconnect.backoff.max.ms while the broker is down (an 8 s restart left an owner 5 s behind
 * the new one, and test_worker_exactly_once saw an innocent suspect poisoned by it). Waiting
 * that long at every take-over would stall the new owner's loop after every crash, and most
 * failures cannot hurt an innocent job any more: a strike only moves it in the search, and only
 * a failure it was alone in (solo) counts toward a verdict. So the long wait (verdict_grace_us)
 * is paid where such a failure is on record: a solo job was running, or --poison-after 1. The
 * reader is still assigned to the tails, so new records arrive here. */
static void wait_for_evicted(kg_journal_t *j, const int32_t *parts, int n, kg_inflight_t *best) {
    int n_wait = 0;
    bool verdict = false;
    for (int i = 0; i < n; i++) {
        n_wait += left_running(&best[i]);
        verdict |= decides_a_verdict(j, &best[i]);
    }
    int64_t t0 = kg_clock_us();
    int64_t deadline = t0 + (verdict ? j->verdict_grace_us : j->grace_us);
    while (n_wait > 0 && kg_clock_us() < deadline) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(j->reader, 100);
        if (!rkm) {
            continue;
        }
        int i = index_of(parts, n, rkm->partition);
        kg_inflight_t s = {0};
        char why[256];
        if (i < n && !rkm->err && left_running(&best[i]) &&
            kg_inflight_decode(rkm->payload, rkm->len, &s, why, sizeof(why)) == KG_OK &&
            s.partition == parts[i] && strcmp(s.jobs_topic, j->jobs_topic) == 0 &&
            newer(&s, &best[i])) {
            if (s.clean) {
                KG_LOG_INFO("journal",
                            "the previous owner was alive and let the partition go: a hand-over, "
                            "not a failure partition=%d from=%s",
                            parts[i], s.worker_id);
            }
            kg_inflight_clear(&best[i]);
            best[i] = s;
            n_wait -= !left_running(&best[i]);
        } else {
            kg_inflight_clear(&s);
        }
        rd_kafka_message_destroy(rkm);
    }
    if (verdict) {
        KG_LOG_INFO("journal",
                    "waited for a clean record where a failure decides a verdict ms=%.0f "
                    "handed_over=%d",
                    (double)(kg_clock_us() - t0) / 1e3, n_wait == 0);
    }
}

/* Read the tail of each listed in-flight partition; best[i] gets the newest
 * snapshot of parts[i] (epoch 0 and no runs when there is none). Returns
 * false when the read did not finish (the best found so far are kept). */
static bool read_tails(kg_journal_t *j, const int32_t *parts, int n, kg_inflight_t *best) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        rd_kafka_topic_partition_list_add(l, j->topic, parts[i])->offset =
            RD_KAFKA_OFFSET_TAIL(TAIL_RECORDS);
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(j->reader, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        KG_LOG_WARN("journal", "cannot read the in-flight topic error=\"%s\"",
                    rd_kafka_err2str(err));
        return false;
    }
    bool *at_end = calloc((size_t)n, sizeof(*at_end));
    int n_left = n;
    int64_t deadline = kg_clock_us() + READ_MS * 1000LL;
    while (at_end && n_left > 0 && kg_clock_us() < deadline) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(j->reader, 100);
        if (!rkm) {
            continue;
        }
        int i = index_of(parts, n, rkm->partition);
        if (i == n) {
            /* not ours */
        } else if (rkm->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            n_left -= !at_end[i];
            at_end[i] = true;
        } else if (rkm->err && kg_acl_denied(rkm->err)) {
            char hint[320];
            bool group = rkm->err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
            if (!j->reader_denied_logged) {
                KG_LOG_WARN("journal",
                            "poison-job protection cannot read the in-flight topic: the reader %s "
                            "error=\"%s\"",
                            kg_acl_hint(rkm->err, group ? "Describe" : "Read",
                                        group ? j->reader_group : j->topic, hint, sizeof(hint)),
                            rd_kafka_message_errstr(rkm));
            }
            j->reader_denied_logged = true;
        } else if (rkm->err) {
            KG_LOG_WARN("journal", "reading the in-flight topic partition=%d error=\"%s\"",
                        rkm->partition, rd_kafka_message_errstr(rkm));
        } else {
            kg_inflight_t s;
            char why[256];
            if (kg_inflight_decode(rkm->payload, rkm->len, &s, why, sizeof(why)) != KG_OK) {
                KG_LOG_WARN("journal", "skipping a record partition=%d offset=%lld error=\"%s\"",
                            rkm->partition, (long long)rkm->offset, why);
            } else if (s.partition == parts[i] && strcmp(s.jobs_topic, j->jobs_topic) == 0 &&
                       newer(&s, &best[i])) {
                kg_inflight_clear(&best[i]);
                best[i] = s;
            } else {
                kg_inflight_clear(&s);
            }
        }
        rd_kafka_message_destroy(rkm);
    }
    free(at_end);
    bool done = n_left == 0;
    wait_for_evicted(j, parts, n, best);
    rd_kafka_assign(j->reader, NULL);
    return done;
}

/* Take over the strikes of `snap` into partition p's entries. */
static void take_over(kg_journal_t *j, int32_t p, const kg_inflight_t *snap) {
    jpart_t *jp = &j->parts[p];
    kg_inflight_run_t *runs = NULL;
    size_t n_runs = 0, n_suspects = 0;
    if (kg_inflight_inherit(snap, -1, &runs, &n_runs) != KG_OK) {
        unprotect(j, p, "out of memory");
        return;
    }
    for (size_t r = 0; r < n_runs; r++) {
        for (int64_t k = 0; k < runs[r].count; k++) {
            jentry_t *x = insert(jp, runs[r].offset + k);
            if (!x) {
                break;
            }
            x->strikes = (uint8_t)runs[r].strikes;
            x->level = (uint8_t)runs[r].level;
            x->alone = (uint8_t)runs[r].alone;
            x->state = J_WAITING;
            n_suspects++;
        }
    }
    free(runs);
    if (snap->epoch > 0 && (!snap->clean || n_suspects > 0)) {
        KG_LOG_WARN("journal",
                    "took over a partition from a worker that failed or left suspects "
                    "partition=%d from=%s clean=%d suspects=%zu epoch=%lld",
                    p, snap->worker_id, snap->clean, n_suspects, (long long)jp->epoch);
    } else if (snap->epoch > 0) {
        KG_LOG_DEBUG("journal", "took over partition=%d from=%s epoch=%lld", p, snap->worker_id,
                     (long long)jp->epoch);
    }
    if (n_suspects > 0) {
        mark_dirty(jp, true); /* the new epoch carries the strikes from now on */
    }
}

void kg_journal_assign(kg_journal_t *j, const rd_kafka_topic_partition_list_t *parts) {
    if (!j) {
        return;
    }
    look_up_topic(j);
    int32_t *ps = malloc((size_t)(parts->cnt ? parts->cnt : 1) * sizeof(*ps));
    kg_inflight_t *best = calloc((size_t)(parts->cnt ? parts->cnt : 1), sizeof(*best));
    int n = 0;
    for (int i = 0; ps && best && i < parts->cnt; i++) {
        int32_t p = parts->elems[i].partition;
        if (p < 0 || !grow_parts(j, p)) {
            continue;
        }
        jpart_t *jp = &j->parts[p];
        free(jp->e);
        memset(jp, 0, sizeof(*jp));
        jp->active = true;
        if (j->off) {
            continue;
        }
        if (p >= j->n_topic_parts) {
            KG_LOG_WARN("journal",
                        "no in-flight partition for this jobs partition: poison-job protection "
                        "is off for it (give %s at least as many partitions as %s) partition=%d",
                        j->topic, j->jobs_topic, p);
            continue;
        }
        jp->protected_ = true;
        ps[n++] = p;
    }
    int64_t t0 = kg_clock_us();
    if (n > 0 && !read_tails(j, ps, n, best)) {
        KG_LOG_WARN("journal",
                    "the in-flight records were not all read within %d ms: some "
                    "strikes may be missed",
                    READ_MS);
    }
    KG_LOG_DEBUG("journal", "read the in-flight records partitions=%d ms=%.1f", n,
                 (double)(kg_clock_us() - t0) / 1e3);
    int64_t now_ms = kg_clock_epoch_ms();
    for (int i = 0; i < n; i++) {
        jpart_t *jp = &j->parts[ps[i]];
        jp->epoch = best[i].epoch + 1 > now_ms ? best[i].epoch + 1 : now_ms;
        take_over(j, ps[i], &best[i]);
        kg_inflight_clear(&best[i]);
    }
    free(ps);
    free(best);
}

void kg_journal_revoke(kg_journal_t *j, const rd_kafka_topic_partition_list_t *parts, bool clean) {
    if (!j) {
        return;
    }
    bool wrote = false;
    for (int i = 0; clean && i < parts->cnt; i++) {
        jpart_t *jp = part(j, parts->elems[i].partition);
        if (jp && jp->protected_) {
            write_snapshot(j, parts->elems[i].partition, true);
            wrote = true;
        }
    }
    if (wrote && rd_kafka_flush(j->producer, FLUSH_MS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        KG_LOG_WARN("journal",
                    "the clean in-flight records were not all acknowledged within %d "
                    "ms: the next owner may count this hand-over as a failure",
                    FLUSH_MS);
    }
    rd_kafka_poll(j->producer, 0);
    for (int i = 0; i < parts->cnt; i++) {
        jpart_t *jp = part(j, parts->elems[i].partition);
        if (jp) {
            free(jp->e);
            memset(jp, 0, sizeof(*jp));
        }
    }
}

// ---- lifecycle ----

static rd_kafka_t *make_client(const kg_config_t *cfg,
                               rd_kafka_type_t type,
                               const char *const *props,
                               void *opaque,
                               char *errstr,
                               size_t errstr_size) {
    rd_kafka_conf_t *conf = kg_kafka_conf_new(cfg, errstr, errstr_size);
    if (!conf) {
        return NULL;
    }
    for (int i = 0; props[i]; i += 2) {
        if (kg_kafka_conf_set(conf, props[i], props[i + 1], errstr, errstr_size)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    rd_kafka_conf_set_opaque(conf, opaque);
    if (type == RD_KAFKA_PRODUCER) {
        rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    }
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof(err));
    if (!rk) {
        snprintf(errstr, errstr_size, "journal client: %s", err);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

kg_journal_t *kg_journal_new(const kg_config_t *cfg,
                             const char *jobs_topic,
                             const char *inflight_topic,
                             const char *worker_id,
                             char *errstr,
                             size_t errstr_size) {
    kg_journal_t *j = calloc(1, sizeof(*j));
    if (!j) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    j->cfg = cfg;
    /* a live owner that was evicted hears of it at its next heartbeat, then revokes: the
     * classic protocol's is librdkafka's heartbeat.interval.ms (3 s), the consumer protocol's
     * (KIP-848, which --group-protocol auto may pick) the broker's
     * group.consumer.heartbeat.interval.ms (5 s by default) */
    int64_t heartbeat_ms =
        cfg->group_protocol && strcmp(cfg->group_protocol, "classic") == 0 ? 3000 : 5000;
    int64_t backoff_max_ms = BACKOFF_MAX_MS;
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        /* librdkafka checked them */
        if (strcmp(cfg->kafka_keys[i], "heartbeat.interval.ms") == 0) {
            heartbeat_ms = strtoll(cfg->kafka_values[i], NULL, 10);
        } else if (strcmp(cfg->kafka_keys[i], "reconnect.backoff.max.ms") == 0) {
            backoff_max_ms = strtoll(cfg->kafka_values[i], NULL, 10);
        }
    }
    j->grace_us = (heartbeat_ms + GRACE_EXTRA_MS) * 1000;
    j->verdict_grace_us = (heartbeat_ms + backoff_max_ms + GRACE_EXTRA_MS) * 1000;
    snprintf(j->worker_id, sizeof(j->worker_id), "%s", worker_id);
    snprintf(j->jobs_topic, sizeof(j->jobs_topic), "%s", jobs_topic);
    if (inflight_topic && *inflight_topic) {
        snprintf(j->topic, sizeof(j->topic), "%s", inflight_topic);
    } else {
        snprintf(j->topic, sizeof(j->topic), "%s.inflight", jobs_topic);
    }
    char client_id[160], group[600];
    snprintf(client_id, sizeof(client_id), "%s-journal", worker_id);
    snprintf(group, sizeof(group), "%s.journal-reader", cfg->group_id);
    snprintf(j->reader_group, sizeof(j->reader_group), "%s", group);
    /* linger 0: a job waits for this ack before it starts */
    const char *const pprops[] = {
        "enable.idempotence",       "true",  "acks",      "all",     "linger.ms", "0",
        "allow.auto.create.topics", "false", "client.id", client_id, NULL};
    /* assign-only: the group id is required by the consumer API, never
     * joined or committed; consumers do not auto-create topics */
    const char *const rprops[] = {"group.id",
                                  group,
                                  "enable.auto.commit",
                                  "false",
                                  "enable.auto.offset.store",
                                  "false",
                                  "enable.partition.eof",
                                  "true",
                                  "fetch.wait.max.ms",
                                  "10",
                                  "auto.offset.reset",
                                  "earliest",
                                  "client.id",
                                  client_id,
                                  NULL};
    j->producer = make_client(cfg, RD_KAFKA_PRODUCER, pprops, j, errstr, errstr_size);
    j->reader =
        j->producer ? make_client(cfg, RD_KAFKA_CONSUMER, rprops, j, errstr, errstr_size) : NULL;
    if (!j->producer || !j->reader) {
        kg_journal_free(j);
        return NULL;
    }
    rd_kafka_poll_set_consumer(j->reader);
    j->off = true; /* until found: look_up_topic logs the change */
    j->n_topic_parts = -1;
    look_up_topic(j);
    if (j->off && j->no_broker) {
        KG_LOG_WARN("journal",
                    "poison-job protection is off until a broker answers (down, or the login "
                    "refused: see the rdkafka errors); the in-flight topic is looked up again at "
                    "every assignment topic=%s",
                    j->topic);
    } else if (j->off && j->denied) {
        char hint[320];
        KG_LOG_WARN("journal",
                    "poison-job protection is off: the worker %s (looked up again at every "
                    "assignment) topic=%s",
                    kg_acl_hint(j->denied, "Read and Write", j->topic, hint, sizeof(hint)),
                    j->topic);
    } else if (j->off) {
        KG_LOG_WARN("journal",
                    "poison-job protection is off until the in-flight topic is there (create it "
                    "with cleanup.policy=compact and as many partitions as the jobs topic; it "
                    "is looked up again at every assignment) topic=%s",
                    j->topic);
    }
    return j;
}

void kg_journal_free(kg_journal_t *j) {
    if (!j) {
        return;
    }
    if (j->reader_rkt) {
        rd_kafka_topic_destroy(j->reader_rkt);
    }
    if (j->reader) {
        rd_kafka_consumer_close(j->reader);
        rd_kafka_destroy(j->reader);
    }
    if (j->producer) {
        rd_kafka_flush(j->producer, 1000);
        rd_kafka_purge(j->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(j->producer, 0);
        rd_kafka_destroy(j->producer);
    }
    for (int32_t p = 0; p < j->n_parts; p++) {
        free(j->parts[p].e);
    }
    free(j->parts);
    free(j);
}
