/* kg_worker_partitions: the consumer and the partitions it is given.
 * Backpressure pauses the lanes' partitions at the in-flight cap and
 * resumes them at 3/4. On assign the journal and the offsets tracker learn
 * the new partitions; on revoke their running jobs get --handoff-timeout to
 * finish (handoff), the finished work is flushed and committed, then the
 * jobs still running are cancelled quietly and handed over (the new owner
 * runs them again). Assign and revoke are incremental with the consumer
 * protocol and cooperative-sticky, eager otherwise (kg_assignment.h). Lag is
 * read once a second for the gauges. At the bottom: the consumer itself
 * (offsets stored by hand, committed by librdkafka or, with --exactly-once,
 * by the transactions) and its group protocol. */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_answered.h"
#include "kg_kafka_conf.h"
#include "kg_worker_int.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

// ---- pause and resume ----

/* The assigned partitions of one lane (NULL when there are none). */
static rd_kafka_topic_partition_list_t *
lane_parts(const kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts, int lane) {
    rd_kafka_topic_partition_list_t *l = NULL;
    for (int i = 0; parts && i < parts->cnt; i++) {
        if (strcmp(parts->elems[i].topic, w->lanes.lane[lane].topic) == 0) {
            if (!l) {
                l = rd_kafka_topic_partition_list_new(parts->cnt);
            }
            rd_kafka_topic_partition_list_add(l, parts->elems[i].topic, parts->elems[i].partition);
        }
    }
    return l;
}

static void update_paused_gauge(kg_worker_t *w) {
    int n = 0;
    for (int l = 0; l < w->lanes.n; l++) {
        n += w->parts.lane_paused[l];
    }
    atomic_store(&w->m.paused, n);
}

static void set_lane_paused(kg_worker_t *w, int lane, bool pause) {
    rd_kafka_topic_partition_list_t *l = lane_parts(w, w->parts.assigned, lane);
    w->parts.lane_paused[lane] = pause;
    update_paused_gauge(w);
    if (!l) {
        return;
    }
    rd_kafka_resp_err_t err = pause ? rd_kafka_pause_partitions(w->parts.consumer, l)
                                    : rd_kafka_resume_partitions(w->parts.consumer, l);
    if (err) {
        KG_LOG_WARN("worker", "%s partitions: %s topic=%s", pause ? "pause" : "resume",
                    rd_kafka_err2str(err), w->lanes.lane[lane].topic);
    }
    KG_LOG_DEBUG("worker", "%s partitions inflight=%d topic=%s", pause ? "paused" : "resumed",
                 w->jobs.n_inflight, w->lanes.lane[lane].topic);
    rd_kafka_topic_partition_list_destroy(l);
}

/* Pause at the in-flight cap and resume at 3/4 of it; with lanes, the
 * lowest lanes pause first (kg_lanes_pause_at), so a bulk backlog leaves
 * room for interactive jobs. */
void kg_worker_check_backpressure(kg_worker_t *w) {
    int32_t taken = w->jobs.n_inflight + w->intake.n_held +
                    (w->out.txn ? (int32_t)kg_txn_n_pending(w->out.txn) : 0);
    for (int l = 0; l < w->lanes.n; l++) {
        int32_t at = kg_lanes_pause_at(&w->lanes, l, w->max_inflight);
        if (w->life.draining) {
            if (!w->parts.lane_paused[l]) {
                set_lane_paused(w, l, true);
            }
        } else if (!w->parts.lane_paused[l] && taken >= at) {
            set_lane_paused(w, l, true);
        } else if (w->parts.lane_paused[l] && taken <= at * 3 / 4) {
            set_lane_paused(w, l, false);
        }
    }
}

// ---- rebalance ----

/* Cancel quietly every job of the listed partitions (NULL: all), or only
 * those that have not streamed a token yet. */
void kg_worker_abandon_jobs(kg_worker_t *w,
                            const rd_kafka_topic_partition_list_t *parts,
                            bool unstarted_only) {
    for (size_t i = 0; i < w->jobs.table_size; i++) {
        for (job_rec_t *r = w->jobs.table[i], *next; r; r = next) {
            next = r->hnext;
            if (!in_parts(w, parts, r->run.job->partition) || r->state == REC_REVOKED ||
                (unstarted_only && r->run.t.first_token_us != 0)) {
                continue;
            }
            if (r->state == REC_PENDING) {
                /* never reached the engine: unlink from the FIFO and drop */
                kg_worker_pending_unlink(w, r);
                atomic_fetch_add(&w->m.jobs_cancelled, 1);
                kg_worker_job_given_back(w, r->run.job->partition, r->run.job->offset);
                kg_worker_rec_free(w, r);
                continue;
            }
            r->state = REC_REVOKED;
            atomic_fetch_add(&w->m.jobs_cancelled, 1);
            kg_worker_job_given_back(w, r->run.job->partition, r->run.job->offset);
            if (kg_runner_cancel(w->runner, r->id) != KG_OK) {
                kg_worker_fatal(w, "engine command queue stuck");
            }
        }
    }
}

/* The jobs the previous owner of a partition answered above its committed offset, named in
 * the commit's metadata (kg_answered.h): skipped when consumed (kg_offsets), and under
 * --exactly-once named again by this worker's transactions until its offset passes them
 * (kg_txn), so that no owner after this one runs them either. */
static void take_answered(kg_worker_t *w, const rd_kafka_topic_partition_t *e) {
    static int64_t offs[KG_ANSWERED_MAX_BYTES / 2];
    int lane = kg_lanes_find(&w->lanes, e->topic);
    if (e->err || lane < 0 || e->partition >= LANE_STRIDE) {
        return;
    }
    size_t n = e->metadata ? kg_answered_decode(e->metadata, e->metadata_size, e->offset, offs,
                                                sizeof(offs) / sizeof(offs[0]))
                           : 0;
    /* the transactions start from the committed offset, with or without a list */
    if ((w->out.txn && e->offset >= 0 &&
         kg_txn_seed_answered(w->out.txn, w->lanes.lane[lane].topic, e->partition, e->offset, offs,
                              n) != KG_OK) ||
        (n > 0 && kg_offsets_set_answered(w->parts.offsets, dense_of(lane, e->partition), e->offset,
                                          offs, n) != KG_OK)) {
        kg_worker_fatal(w, "out of memory keeping the answered offsets");
        return;
    }
    if (n > 0) {
        KG_LOG_INFO("worker",
                    "jobs answered above the committed offset by the previous owner "
                    "topic=%s partition=%d committed=%lld answered=%zu",
                    e->topic, e->partition, (long long)e->offset, n);
    }
}

/* --exactly-once: the committed offsets of newly assigned partitions, read
 * here and assigned explicitly. librdkafka 2.0.2 falls back to
 * auto.offset.reset when its own fetch fails (a coordinator still loading
 * after a broker restart), which would run every job of the partition again
 * and show its results twice; so fetch until every partition has an answer
 * (pending transactions of a dead worker answer UNSTABLE_OFFSET_COMMIT until
 * the broker aborts them). Partitions with no committed offset start at the
 * beginning (auto.offset.reset=earliest). The metadata names the jobs answered
 * above the offsets (take_answered). */
static void
fetch_committed(kg_worker_t *w, rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts) {
    for (int attempt = 1;; attempt++) {
        rd_kafka_topic_partition_list_t *c = rd_kafka_topic_partition_list_copy(parts);
        rd_kafka_resp_err_t err = rd_kafka_committed(rk, c, 10000);
        for (int i = 0; !err && i < c->cnt; i++) {
            err = c->elems[i].err;
        }
        if (!err) {
            for (int i = 0; i < c->cnt; i++) {
                parts->elems[i].offset =
                    c->elems[i].offset >= 0 ? c->elems[i].offset : RD_KAFKA_OFFSET_BEGINNING;
                take_answered(w, &c->elems[i]);
            }
            rd_kafka_topic_partition_list_destroy(c);
            return;
        }
        rd_kafka_topic_partition_list_destroy(c);
        KG_LOG_WARN("worker", "reading the committed offsets: %s; trying again attempt=%d",
                    rd_kafka_err2str(err), attempt);
        if (atomic_load(&w->life.stop_requested) || attempt >= 120) {
            kg_worker_fatal_kafka(w,
                                  "cannot read the committed offsets of the assigned partitions");
            return;
        }
        usleep(500 * 1000);
    }
}

/* Whether librdkafka hands this consumer incremental lists (KIP-848 and cooperative-sticky):
 * then only rd_kafka_incremental_assign/unassign are accepted (kg_assignment.h). */
static bool is_incremental(rd_kafka_t *rk) {
    return strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
}

static const char *protocol_name(const kg_worker_t *w) {
    return w->parts.protocol == KG_GROUP_CONSUMER ? "consumer" : "classic";
}

/* The jobs of `parts` that still run for their answer (not given back). */
static int32_t n_running_in(const kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts) {
    int32_t n = 0;
    for (size_t i = 0; i < w->jobs.table_size; i++) {
        for (const job_rec_t *r = w->jobs.table[i]; r; r = r->hnext) {
            n += r->state != REC_REVOKED && in_parts(w, parts, r->run.job->partition);
        }
    }
    return n;
}

/* Graceful handoff (docs/DELIVERY.md, Rebalances), in the revoke callback before the
 * partitions are released. Intake has stopped: the callback runs inside consumer_poll, and
 * no message is taken until it returns. Jobs of `parts` that have not streamed a token are
 * given back at once (the new owner can start them as soon as it has the partition); the
 * others run on for up to --handoff-timeout while this loop serves everything the poll loop
 * does but intake: the engine's events, deliveries, cancels, held jobs, transactions. Jobs of
 * the partitions that stay keep running and streaming meanwhile. librdkafka keeps the group
 * membership alive (heartbeats are its own thread's) and waits for the callback: with
 * KIP-848 and cooperative-sticky the new owner gets these partitions once they are released;
 * eager, the whole group waits. */
static void handoff(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts) {
    kg_worker_abandon_jobs(w, parts, true);
    kg_worker_drop_held(w, parts);
    int32_t n0 = n_running_in(w, parts), n = n0;
    if (n == 0 || w->cfg->handoff_timeout_s <= 0) {
        return;
    }
    int64_t t0 = kg_clock_us();
    int64_t deadline = t0 + (int64_t)(w->cfg->handoff_timeout_s * 1e6);
    KG_LOG_INFO("worker", "handoff: waiting for running jobs count=%d timeout_s=%g", n,
                w->cfg->handoff_timeout_s);
    for (int64_t now = t0; n > 0 && !w->life.fatal && now < deadline; now = kg_clock_us()) {
        atomic_store(&w->m.last_loop_us, now);
        kg_worker_poll_cancels(w);
        for (int l = 0; l < w->lanes.n; l++) {
            kg_journal_poll(w->intake.journal[l], now, 0);
        }
        kg_worker_release_held(w);
        kg_worker_submit_pending(w);
        kg_worker_drain_engine_events(w, 5);
        rd_kafka_poll(w->out.producer, 0);
        kg_worker_commit_txn(w, false);
        if (kg_runner_is_dead(w->runner)) {
            kg_worker_drain_engine_events(w, 0);
            kg_worker_fatal(w, "the backend failed");
        }
        n = n_running_in(w, parts);
    }
    KG_LOG_INFO("worker", "handoff: done finished=%d abandoned=%d waited_ms=%lld", n0 - n, n,
                (long long)((kg_clock_us() - t0) / 1000));
}

/* Without --exactly-once: the jobs the previous owners of `parts` answered
 * above their committed offsets (kg_answered.h), read once on assignment.
 * Failing to read them only reruns those jobs. */
static void
read_answered(kg_worker_t *w, rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts) {
    rd_kafka_topic_partition_list_t *c = rd_kafka_topic_partition_list_copy(parts);
    rd_kafka_resp_err_t err = rd_kafka_committed(rk, c, 5000);
    if (err) {
        KG_LOG_WARN("worker",
                    "reading the committed offsets' metadata: %s; jobs answered above "
                    "them by the previous owner may run again",
                    rd_kafka_err2str(err));
    }
    for (int i = 0; !err && i < c->cnt; i++) {
        take_answered(w, &c->elems[i]);
    }
    rd_kafka_topic_partition_list_destroy(c);
}

/* Commit, for the partitions given up, the offset and the jobs answered above
 * it (done here after a still-running one, or named by the previous owner and
 * not reached yet), so the next owner runs none of them again (kg_answered.h).
 * An explicit commit: librdkafka's commits of stored offsets skip an offset
 * already committed, metadata and all. */
static void
commit_answered(kg_worker_t *w, rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts) {
    static int64_t offs[KG_ANSWERED_MAX_BYTES / 2];
    char md[KG_ANSWERED_MAX_BYTES + 1];
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(parts->cnt > 0 ? parts->cnt : 1);
    size_t total = 0;
    for (int i = 0; i < parts->cnt; i++) {
        int lane = kg_lanes_find(&w->lanes, parts->elems[i].topic);
        int64_t pos;
        if (lane < 0 || parts->elems[i].partition >= LANE_STRIDE) {
            continue;
        }
        size_t n =
            kg_offsets_answered_above(w->parts.offsets, dense_of(lane, parts->elems[i].partition),
                                      &pos, offs, sizeof(offs) / sizeof(offs[0]));
        n = n > 0 ? kg_answered_encode(pos, offs, n, md, sizeof(md)) : 0;
        if (n == 0) {
            continue;
        }
        rd_kafka_topic_partition_t *e =
            rd_kafka_topic_partition_list_add(l, parts->elems[i].topic, parts->elems[i].partition);
        e->offset = pos;
        e->metadata_size = strlen(md);
        e->metadata = malloc(e->metadata_size); /* the list frees it */
        if (!e->metadata) {
            e->metadata_size = 0;
            continue;
        }
        memcpy(e->metadata, md, e->metadata_size);
        total += n;
    }
    if (l->cnt > 0) {
        /* stored too (librdkafka keeps a stored offset's metadata since 2.1): a later commit
         * of the stored offsets (auto-commit, the close) must not replace this one by the
         * same offset without the list, which the next owner would then run again */
        (void)rd_kafka_offsets_store(rk, l); /* best effort: the commit below is what counts */
        rd_kafka_resp_err_t err = rd_kafka_commit(rk, l, 0);
        if (err) {
            KG_LOG_WARN("worker",
                        "committing the jobs answered above the committed offsets: %s; "
                        "the next owner runs them again",
                        rd_kafka_err2str(err));
        } else {
            KG_LOG_INFO("worker",
                        "committed the jobs answered above the committed offsets "
                        "partitions=%d answered=%zu",
                        l->cnt, total);
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
}

static void log_assign_error(kg_worker_t *w, const char *what, rd_kafka_error_t *e) {
    if (e) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s: %s", what, rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        kg_worker_fatal_kafka(w, msg);
    }
}

static void on_assign(kg_worker_t *w, rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts) {
    for (int l = 0; l < w->lanes.n; l++) {
        /* the strikes of their jobs, before any is taken */
        rd_kafka_topic_partition_list_t *lp = lane_parts(w, parts, l);
        if (lp) {
            kg_journal_assign(w->intake.journal[l], lp);
            rd_kafka_topic_partition_list_destroy(lp);
        }
    }
    for (int i = 0; i < parts->cnt; i++) {
        int lane = kg_lanes_find(&w->lanes, parts->elems[i].topic);
        if (lane < 0 || parts->elems[i].partition >= LANE_STRIDE ||
            kg_offsets_assign(w->parts.offsets, dense_of(lane, parts->elems[i].partition)) !=
                KG_OK) {
            kg_worker_fatal(w, "cannot track an assigned partition");
        }
    }
    if (w->out.txn && parts->cnt > 0) {
        fetch_committed(w, rk, parts);
    } else if (parts->cnt > 0) {
        read_answered(w, rk, parts);
    }
    if (is_incremental(rk)) {
        log_assign_error(w, "incremental assign", rd_kafka_incremental_assign(rk, parts));
    } else {
        rd_kafka_assign(rk, parts);
    }
    kg_assignment_add(&w->parts.assigned, parts);
    int held = w->parts.assigned->cnt;
    atomic_store(&w->m.assigned_partitions, held);
    atomic_store(&w->m.ready, 1);
    w->parts.ever_assigned = true; /* the protocol works, even if it gave this worker nothing */
    KG_LOG_INFO("worker", "partitions assigned count=%d added=%d protocol=%s/%s", held, parts->cnt,
                protocol_name(w), rd_kafka_rebalance_protocol(rk));
    /* Say the state of every new partition explicitly: librdkafka keeps a
     * partition's pause flag across unassign and a later assign, so one
     * paused under an earlier assignment (and since "resumed" while it was
     * not assigned, which reached no partition) would never fetch again
     * (librdkafka #1849, #5591; seen after a broker restart). */
    for (int l = 0; l < w->lanes.n; l++) {
        set_lane_paused(w, l, w->parts.lane_paused[l]);
    }
}

static void on_revoke(kg_worker_t *w, rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts) {
    /* lost (the session expired, the member was fenced): another member may run them already,
     * and no commit of ours would count */
    bool lost = rd_kafka_assignment_lost(rk);
    KG_LOG_INFO("worker", "partitions revoked count=%d held=%d inflight=%d lost=%s", parts->cnt,
                (w->parts.assigned ? w->parts.assigned->cnt : 0) - parts->cnt, w->jobs.n_inflight,
                lost ? "true" : "false");
    if (!lost && !w->life.fatal) {
        handoff(w, parts);
    }
    /* let acks of finished jobs land and their offsets be committed first */
    rd_kafka_flush(w->out.producer, 10000);
    rd_kafka_poll(w->out.producer, 0);
    if (!w->life.fatal && !w->out.txn && !lost) {
        rd_kafka_commit(rk, NULL, 0);
        commit_answered(w, rk, parts);
    }
    if (w->out.txn) {
        if (!w->life.fatal) {
            (void)kg_worker_commit_txn(w, true);
        }
        /* what did not commit (the transaction failed, or answers waiting for an
         * earlier job of their partition) was never visible: the jobs run again on the
         * new owner */
        for (int l = 0; l < w->lanes.n; l++) {
            kg_txn_drop(w->out.txn, w->lanes.lane[l].topic, parts);
        }
    }
    kg_worker_abandon_jobs(w, parts, false);
    kg_worker_drop_held(w, parts);
    /* a hand-over is no failure, unless the worker stops for a reason
     * that may be a job's (then the last snapshot stands) */
    for (int l = 0; l < w->lanes.n; l++) {
        rd_kafka_topic_partition_list_t *lp = lane_parts(w, parts, l);
        if (lp) {
            kg_journal_revoke(w->intake.journal[l], lp, !w->life.fatal || w->life.fatal_kafka);
            rd_kafka_topic_partition_list_destroy(lp);
        }
    }
    for (int i = 0; i < parts->cnt; i++) {
        int lane = kg_lanes_find(&w->lanes, parts->elems[i].topic);
        int32_t p = parts->elems[i].partition;
        if (lane < 0 || p < 0 || p >= LANE_STRIDE) {
            continue;
        }
        kg_offsets_revoke(w->parts.offsets, dense_of(lane, p));
        if (p < MAX_PARTITIONS) {
            atomic_store(&w->parts.lag_valid[lane][p], 0);
        }
    }
    /* leave no pause flag behind on partitions that go (see the assign case) */
    rd_kafka_resume_partitions(rk, parts);
    if (is_incremental(rk)) {
        log_assign_error(w, "incremental unassign", rd_kafka_incremental_unassign(rk, parts));
    } else {
        rd_kafka_assign(rk, NULL);
    }
    kg_assignment_remove(&w->parts.assigned, parts);
    atomic_store(&w->m.assigned_partitions, w->parts.assigned ? w->parts.assigned->cnt : 0);
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque) {
    kg_worker_t *w = opaque;
    kg_auth_ok(&w->life.auth); /* a rebalance is an answer of the group coordinator */
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        on_assign(w, rk, parts);
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        on_revoke(w, rk, parts);
    } else {
        KG_LOG_ERROR("worker", "rebalance error: %s", rd_kafka_err2str(err));
        if (!is_incremental(rk)) {
            rd_kafka_assign(rk, NULL);
        }
    }
}

// ---- lag ----

void kg_worker_update_lag(kg_worker_t *w) {
    int64_t now = kg_clock_us();
    if (!w->parts.assigned || now - w->parts.last_lag_us < 1000000) {
        return;
    }
    w->parts.last_lag_us = now;
    rd_kafka_topic_partition_list_t *pos = rd_kafka_topic_partition_list_copy(w->parts.assigned);
    rd_kafka_position(w->parts.consumer, pos);
    int64_t total = 0;
    for (int i = 0; i < pos->cnt; i++) {
        int32_t p = pos->elems[i].partition;
        int lane = kg_lanes_find(&w->lanes, pos->elems[i].topic);
        int64_t lo, hi;
        if (p < 0 || p >= MAX_PARTITIONS || lane < 0 ||
            rd_kafka_get_watermark_offsets(w->parts.consumer, pos->elems[i].topic, p, &lo, &hi) !=
                0 ||
            hi < 0) {
            continue;
        }
        int64_t at = pos->elems[i].offset >= 0 ? pos->elems[i].offset : lo;
        atomic_store(&w->parts.lag[lane][p], hi > at ? hi - at : 0);
        atomic_store(&w->parts.lag_valid[lane][p], 1);
        total += hi > at ? hi - at : 0;
    }
    rd_kafka_topic_partition_list_destroy(pos);
    kg_drain_update(&w->m.drain, total, w->jobs.n_inflight + w->intake.n_held,
                    (int32_t)w->cfg->max_batch_size);
}

int kg_worker_partition_lag(
    kg_worker_t *w, const char **topics, int32_t *partitions, int64_t *lags, int max) {
    int n = 0;
    for (int l = 0; l < w->lanes.n; l++) {
        for (int32_t p = 0; p < MAX_PARTITIONS && n < max; p++) {
            if (atomic_load(&w->parts.lag_valid[l][p])) {
                topics[n] = w->lanes.lane[l].topic;
                partitions[n] = p;
                lags[n++] = atomic_load(&w->parts.lag[l][p]);
            }
        }
    }
    return n;
}

// ---- the consumer ----

/* The -X value of `key`, or NULL when none was given. */
static const char *x_value(const kg_config_t *cfg, const char *key) {
    const char *v = NULL;
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        if (strcmp(cfg->kafka_keys[i], key) == 0) {
            v = cfg->kafka_values[i];
        }
    }
    return v;
}

/* The coordinator watchdog. After a broker restart a librdkafka 2.12 consumer was seen to log
 * "Waiting for coordinator" at every auto-commit for as long as it ran (12 minutes, until it
 * was stopped), while its producer delivered: the broker gave its partitions to another worker
 * once its session expired, and it went on running their jobs, which the other worker ran
 * too, never to commit. Commits that fail for want of a coordinator for coord_stuck_us (two
 * minutes: well past any session timeout, so the group has moved on), while the brokers take
 * this worker's events, end the worker with a clear error; a restart rejoins the group. In a
 * broker outage the deliveries stop too, and the worker waits. */
static bool coordinator_missing(rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR__WAIT_COORD ||
           err == RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE ||
           err == RD_KAFKA_RESP_ERR_NOT_COORDINATOR || err == RD_KAFKA_RESP_ERR__TRANSPORT;
}

/* Offset commits' results (the auto-commit timer's; served by the consumer poll, kafka thread). */
static void offset_commit_cb(rd_kafka_t *rk,
                             rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *offsets,
                             void *opaque) {
    (void)rk;
    (void)offsets;
    kg_worker_t *w = opaque;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        w->parts.coord_lost_us = 0;
    } else if (coordinator_missing(err) && w->parts.coord_lost_us == 0) {
        w->parts.coord_lost_us = kg_clock_us();
    }
}

static rd_kafka_t *make_consumer(kg_worker_t *w, char *errstr, size_t errstr_size) {
    const kg_config_t *cfg = w->cfg;
    rd_kafka_conf_t *conf = kg_kafka_conf_new(cfg, errstr, errstr_size);
    if (!conf) {
        return NULL;
    }
    bool consumer = w->parts.protocol == KG_GROUP_CONSUMER;
    /* ours first, so an explicit -X of the same key (set again below) wins; the consumer
     * protocol refuses the classic one's assignor and session keys (the broker has them) */
    struct {
        const char *k, *v;
    } ours[] = {{"group.id", cfg->group_id},
                {"group.protocol", consumer ? "consumer" : "classic"},
                {"enable.auto.offset.store", "false"},
                /* --exactly-once: only transactions move the offsets */
                {"enable.auto.commit", cfg->exactly_once ? "false" : "true"},
                /* librdkafka's 5 s default reruns up to 5 s of finished jobs
                 * after a crash; a commit a second costs the coordinator little */
                {"auto.commit.interval.ms", "1000"},
                {"auto.offset.reset", "earliest"},
                {"queued.max.messages.kbytes", "8192"},
                /* after a resume the next fetch answers within this, not
                 * librdkafka's 500 ms default (measured: 133 -> 797 jobs/s
                 * with pause/resume cycling) */
                {"fetch.wait.max.ms", "50"},
                {"client.id", w->worker_id},
                {consumer ? NULL : "partition.assignment.strategy", cfg->assignment_strategy}};
    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
        if (ours[i].k && kg_kafka_conf_set(conf, ours[i].k, ours[i].v, errstr, errstr_size) != 0) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    if (*cfg->group_instance_id &&
        kg_kafka_conf_set(conf, "group.instance.id", cfg->group_instance_id, errstr, errstr_size)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        if (kg_kafka_conf_set(conf, cfg->kafka_keys[i], cfg->kafka_values[i], errstr,
                              errstr_size)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    rd_kafka_conf_set_opaque(conf, w);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf, offset_commit_cb);
    rd_kafka_conf_set_error_cb(conf, kg_worker_error_cb);
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!rk) {
        snprintf(errstr, errstr_size, "consumer: %s", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

kg_status_t kg_worker_start_consumer(kg_worker_t *w, char *errstr, size_t errstr_size) {
    const kg_config_t *cfg = w->cfg;
    /* static members too: under the consumer protocol a member restarted after a crash is
     * refused its instance id (UNRELEASED_INSTANCE_ID, fatal) until the dead one's session
     * expires, 45 s of crash loop, where the classic protocol hands it the partitions at once */
    bool classic_settings =
        *cfg->group_instance_id || strcmp(cfg->assignment_strategy, "cooperative-sticky") != 0 ||
        x_value(cfg, "session.timeout.ms") || x_value(cfg, "heartbeat.interval.ms") ||
        x_value(cfg, "partition.assignment.strategy") || x_value(cfg, "group.protocol.type");
    if (!w->parts.fall_back) {
        w->parts.protocol =
            kg_assignment_protocol(cfg->group_protocol, x_value(cfg, "group.protocol"),
                                   classic_settings, &w->parts.may_fall_back);
    }
    if (w->parts.protocol == KG_GROUP_CONSUMER &&
        strcmp(cfg->assignment_strategy, "cooperative-sticky") != 0) {
        KG_LOG_WARN("worker",
                    "--assignment-strategy %s is for the classic group protocol; the consumer "
                    "protocol assigns on the broker (-X group.remote.assignor=uniform|range)",
                    cfg->assignment_strategy);
    }
    w->parts.consumer = make_consumer(w, errstr, errstr_size);
    if (!w->parts.consumer) {
        return KG_ERR_INVALID;
    }
    w->parts.started_us = kg_clock_us();
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    for (int l = 0; l < w->lanes.n; l++) {
        rd_kafka_topic_partition_list_add(sub, w->lanes.lane[l].topic, RD_KAFKA_PARTITION_UA);
    }
    rd_kafka_resp_err_t err = rd_kafka_subscribe(w->parts.consumer, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (err) {
        snprintf(errstr, errstr_size, "subscribe to %s: %s", cfg->jobs_topic,
                 rd_kafka_err2str(err));
        return KG_ERR_INVALID;
    }
    KG_LOG_INFO("worker", "joining group_id=%s group_protocol=%s assignment_strategy=%s",
                cfg->group_id, protocol_name(w),
                w->parts.protocol == KG_GROUP_CLASSIC ? cfg->assignment_strategy : "broker");
    return KG_OK;
}

void kg_worker_fall_back_to_classic(kg_worker_t *w) {
    /* nothing was assigned (kg_worker_error_cb checks), so nothing is handed over; the
     * consumer in fatal state cannot leave the group properly, nor need it: it never joined */
    KG_LOG_WARN("worker", "the broker does not offer the consumer group protocol (KIP-848, "
                          "Kafka 4.0+): joining with the classic protocol and "
                          "--assignment-strategy instead (--group-protocol classic skips the try)");
    rd_kafka_destroy_flags(w->parts.consumer, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    w->parts.consumer = NULL;
    w->parts.protocol = KG_GROUP_CLASSIC;
    w->parts.may_fall_back = false;
    char errstr[512];
    if (kg_worker_start_consumer(w, errstr, sizeof(errstr)) != KG_OK) {
        kg_worker_fatal_kafka(w, errstr);
    }
    w->parts.fall_back = false;
}

void kg_worker_check_coordinator(kg_worker_t *w, int64_t now_us) {
    const int64_t since = w->parts.coord_lost_us;
    if (since == 0 || w->life.fatal || now_us - since < w->parts.coord_stuck_us ||
        now_us - w->out.delivered_us > 10 * 1000000LL) {
        return;
    }
    char what[320];
    snprintf(what, sizeof(what),
             "the jobs consumer has reached no group coordinator for %.0f s while the brokers "
             "take this worker's events (a client that did not recover after a broker restart); "
             "exiting so that a restart rejoins the group",
             (double)(now_us - since) / 1e6);
    kg_worker_fatal_kafka(w, what);
}

void kg_worker_check_group(kg_worker_t *w, int64_t now_us) {
    if (w->parts.protocol != KG_GROUP_CONSUMER || w->parts.ever_assigned ||
        w->parts.warned_unassigned || now_us - w->parts.started_us < 30 * 1000000LL) {
        return;
    }
    w->parts.warned_unassigned = true;
    /* librdkafka retries silently when the broker lists no ConsumerGroupHeartbeat at all
     * (before Kafka 3.7; 3.7-3.9 unless enabled), so say what may be wrong */
    KG_LOG_WARN("worker", "no partitions assigned after 30 s with the consumer group protocol "
                          "(KIP-848): a broker before Kafka 4.0 may not offer it (use "
                          "--group-protocol classic), or the group has more workers than "
                          "partitions");
}
