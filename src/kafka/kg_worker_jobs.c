/* kg_worker_jobs: the jobs the worker has taken, from their record to
 * their end. Each job started gets a record (found by id when the engine
 * answers), waits in its lane's queue for room in the engine (kg_lanes
 * picks the lane), is submitted to the runner, and ends with its
 * completions: token events as they come, the terminal event at the finish
 * (kg_worker_produce.c). A user's cancel (kg_cancel) ends a waiting job at
 * once and one in the engine within a step. */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_worker_int.h"

#include <stdlib.h>
#include <string.h>

#define ENGINE_SLACK 2 /* with lanes: jobs waiting in the engine beyond its slots */

// ---- job records ----

static job_rec_t *rec_find(kg_worker_t *w, uint64_t id) {
    for (job_rec_t *r = w->jobs.table[id & (w->jobs.table_size - 1)]; r; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

void kg_worker_rec_insert(kg_worker_t *w, job_rec_t *r) {
    job_rec_t **slot = &w->jobs.table[r->id & (w->jobs.table_size - 1)];
    r->hnext = *slot;
    *slot = r;
    w->jobs.n_inflight++;
    atomic_store(&w->m.inflight, w->jobs.n_inflight);
}

void kg_worker_rec_free(kg_worker_t *w, job_rec_t *r) {
    job_rec_t **p = &w->jobs.table[r->id & (w->jobs.table_size - 1)];
    while (*p && *p != r) {
        p = &(*p)->hnext;
    }
    if (*p) {
        *p = r->hnext;
        w->jobs.n_inflight--;
        atomic_store(&w->m.inflight, w->jobs.n_inflight);
    }
    if (r->state != REC_PENDING) {
        w->jobs.n_in_engine--;
        w->jobs.n_in_engine_lane[lane_of(r->run.job->partition)]--;
        w->jobs.n_engine_seqs -= r->run.n_choices; /* its engine records are free again */
    }
    kg_jobrun_clear(&r->run);
    kg_trace_clear(&r->trace);
    free(r);
}

// ---- the lanes' queues of prepared jobs (kg_lanes) ----

/* Queue a prepared record in its lane: after those of its priority or
 * higher (the job's priority orders jobs within a lane), or at the very
 * front (a job the engine handed back). */
void kg_worker_pending_push(kg_worker_t *w, job_rec_t *r, bool front) {
    int lane = lane_of(r->run.job->partition);
    job_rec_t **p = &w->jobs.q[lane].head;
    while (!front && *p && (*p)->run.job->priority >= r->run.job->priority) {
        p = &(*p)->qnext;
    }
    r->qnext = *p;
    *p = r;
    if (!r->qnext) {
        w->jobs.q[lane].tail = r;
    }
    r->state = REC_PENDING;
    w->jobs.n_pending++;
}

/* Take a pending record off its lane's queue. */
void kg_worker_pending_unlink(kg_worker_t *w, job_rec_t *r) {
    int lane = lane_of(r->run.job->partition);
    job_rec_t **p = &w->jobs.q[lane].head, *prev = NULL;
    while (*p && *p != r) {
        prev = *p;
        p = &(*p)->qnext;
    }
    if (*p) {
        *p = r->qnext;
        if (w->jobs.q[lane].tail == r) {
            w->jobs.q[lane].tail = prev;
        }
        w->jobs.n_pending--;
    }
    r->qnext = NULL;
}

/* The next record for the engine, taken off its queue: with one lane the
 * head of its queue while the worker's in-flight cap allows (the engine
 * queues and orders them); with several, only as the engine has room for
 * it (max_batch_size running + ENGINE_SLACK waiting, counting the jobs of
 * its lane's tier and higher: kg_lanes_has_room) and from the lane the
 * weighted fair choice names. A job of a higher lane that enters an engine
 * full of lower ones preempts one of them there (its request tier). NULL
 * when none may go now. */
static job_rec_t *pending_next(kg_worker_t *w) {
    int lane = 0;
    if (w->lanes.n == 1) {
        if (!w->jobs.q[0].head || w->jobs.n_inflight - w->jobs.n_pending >= w->max_inflight) {
            return NULL;
        }
    } else {
        bool has_work[KG_LANES_MAX];
        int32_t room = (int32_t)w->cfg->max_batch_size + ENGINE_SLACK;
        for (int l = 0; l < w->lanes.n; l++) {
            has_work[l] = w->jobs.q[l].head != NULL &&
                          kg_lanes_has_room(&w->lanes, l, w->jobs.n_in_engine_lane, room);
        }
        /* the engine's queue holds max_batch_size + max_queue_depth waiting
         * (kg_worker_new): never more in it than that, running or not */
        if (w->jobs.n_in_engine >= w->jobs.n_engine_recs - w->cfg->max_batch_size ||
            (lane = kg_lanes_pick(&w->lanes, has_work)) < 0) {
            return NULL;
        }
    }
    job_rec_t *r = w->jobs.q[lane].head;
    if (w->jobs.n_engine_seqs + r->run.n_choices > w->jobs.n_engine_recs) {
        return NULL; /* its n choices need that many engine records: wait for them */
    }
    kg_worker_pending_unlink(w, r);
    return r;
}

void kg_worker_submit_pending(kg_worker_t *w) {
    job_rec_t *r;
    while (!w->life.fatal && (r = pending_next(w)) != NULL) {
        kg_request_t req = kg_jobrun_request(&r->run, r->id);
        const int lane = lane_of(r->run.job->partition);
        req.tier = w->lanes.lane[lane].tier;
        kg_status_t st = kg_runner_submit(w->runner, &req);
        if (st == KG_QUEUE_FULL) {
            kg_worker_pending_push(w, r, true);
            return;
        }
        if (st != KG_OK) {
            kg_worker_pending_push(w, r, true);
            kg_worker_fatal(w, "out of memory submitting a job");
            return;
        }
        w->jobs.n_in_engine++;
        w->jobs.n_in_engine_lane[lane]++;
        r->state = REC_SUBMITTED;
        w->jobs.n_engine_seqs += r->run.n_choices;
        kg_jobrun_submitted(&r->run, kg_clock_us());
    }
}

// ---- completions from the engine ----

static void on_completion(kg_worker_t *w, const kg_runner_event_t *re);

/* A completion, with the job's trace_id on every line it logs (the record may be freed inside,
 * so the scope is a copy). */
static void on_completion_scoped(kg_worker_t *w, const kg_runner_event_t *re) {
    job_rec_t *r = rec_find(w, re->c.id);
    if (!r) {
        return;
    }
    char fields[sizeof(r->trace.log_fields)];
    memcpy(fields, r->trace.log_fields, sizeof(fields));
    const char *scope = kg_log_scope(fields);
    on_completion(w, re);
    kg_log_scope(scope);
}

static void on_completion(kg_worker_t *w, const kg_runner_event_t *re) {
    job_rec_t *r = rec_find(w, re->c.id);
    if (!r) {
        return;
    }
    if (re->kind == KG_RUNNER_REJECTED && re->status == KG_QUEUE_FULL && r->state != REC_REVOKED) {
        /* The engine's queue is sized for everything the worker lets in
         * (kg_worker_new), so this is a sizing bug: say so, and keep the job
         * rather than fail it. It goes back to the front of the pending FIFO. */
        KG_LOG_WARN("worker", "engine queue full: job requeued (queue sizing bug) request_id=%s",
                    r->run.job->request_id);
        w->jobs.n_in_engine--;
        w->jobs.n_in_engine_lane[lane_of(r->run.job->partition)]--;
        w->jobs.n_engine_seqs -= r->run.n_choices;
        kg_worker_pending_push(w, r, true);
        return;
    }
    if (re->kind == KG_RUNNER_REJECTED) {
        if (r->state != REC_REVOKED) {
            kg_worker_produce_terminal(w, r, re->status, re->ts_us);
        }
        kg_worker_rec_free(w, r);
        return;
    }
    if (r->state == REC_REVOKED) {
        if (kg_jobrun_finish_seen(&r->run, &re->c)) {
            kg_worker_rec_free(w, r); /* quietly: no events, the offset is not stored */
        }
        return;
    }
    kg_jobrun_step_t js;
    if (kg_jobrun_on_completion(&r->run, &re->c, re->ts_us, &js) != KG_OK) {
        kg_worker_fatal(w, "out of memory assembling output");
        return;
    }
    kg_worker_emit_token_events(w, r, &js);
    if (js.cancel && kg_runner_cancel_choice(w->runner, r->id, js.choice) != KG_OK) {
        kg_worker_fatal(w, "engine command queue stuck");
        return;
    }
    if (js.finished) {
        if (r->run.cancelled) {
            KG_LOG_INFO("worker",
                        "job cancelled request_id=%s topic=%s partition=%d offset=%lld tokens=%d "
                        "steps_after_cancel=%lld",
                        r->run.job->request_id, topic_of(w, r->run.job->partition),
                        part_of(r->run.job->partition), (long long)r->run.job->offset,
                        kg_jobrun_n_generated(&r->run), (long long)(re->step - r->cancel_step));
        }
        kg_worker_produce_terminal(w, r, KG_OK, re->ts_us);
        kg_worker_rec_free(w, r);
    }
}

void kg_worker_drain_engine_events(kg_worker_t *w, int timeout_ms) {
    kg_runner_event_t evs[POLL_BATCH];
    /* every completion queued so far, in batches (a bound keeps the consumer served if the
     * engine outpaces this thread): a batch a loop left the rest to wait a whole loop */
    for (int batch = 0; batch < 64; batch++) {
        int n = kg_runner_poll(w->runner, evs, POLL_BATCH, batch == 0 ? timeout_ms : 0);
        for (int i = 0; i < n; i++) {
            if (evs[i].kind == KG_RUNNER_FATAL) {
                kg_worker_fatal(
                    w,
                    "the backend failed; running jobs are not committed and will be redelivered");
                continue;
            }
            on_completion_scoped(w, &evs[i]);
        }
        if (n < POLL_BATCH) {
            break;
        }
    }
}

// ---- cancellation (kg_cancel) ----

/* A cancel for `rid` arrived: a job of that id waiting in the worker ends at
 * once; one in the engine is cancelled there and ends within one step (its
 * CANCELLED completion produces the event). Either way the terminal event is
 * an error, code cancelled, with the text so far. A job not here is caught on
 * arrival by the memo (kg_cancel_is_cancelled in start_message). */
static void apply_cancel(kg_worker_t *w, const char *rid) {
    for (size_t i = 0; i < w->jobs.table_size; i++) {
        for (job_rec_t *r = w->jobs.table[i], *next; r; r = next) {
            next = r->hnext;
            if (r->state == REC_REVOKED || strcmp(r->run.job->request_id, rid) != 0 ||
                !kg_jobrun_cancel(&r->run)) {
                continue;
            }
            char fields[sizeof(r->trace.log_fields)];
            memcpy(fields, r->trace.log_fields, sizeof(fields));
            const char *scope = kg_log_scope(fields);
            r->cancel_step = kg_runner_steps(w->runner);
            KG_LOG_INFO("worker",
                        "cancel received request_id=%s topic=%s partition=%d offset=%lld state=%s",
                        rid, topic_of(w, r->run.job->partition), part_of(r->run.job->partition),
                        (long long)r->run.job->offset,
                        r->state == REC_PENDING        ? "pending"
                        : r->run.t.first_token_us == 0 ? "waiting"
                                                       : "running");
            if (r->state == REC_PENDING) {
                kg_worker_pending_unlink(w, r);
                kg_jobrun_end_cancelled(&r->run, kg_clock_us());
                KG_LOG_INFO(
                    "worker",
                    "job cancelled request_id=%s topic=%s partition=%d offset=%lld tokens=0 "
                    "steps_after_cancel=0",
                    rid, topic_of(w, r->run.job->partition), part_of(r->run.job->partition),
                    (long long)r->run.job->offset);
                kg_worker_produce_terminal(w, r, KG_OK, kg_clock_us());
                kg_worker_rec_free(w, r);
            } else if (kg_runner_cancel(w->runner, r->id) != KG_OK) {
                kg_worker_fatal(w, "engine command queue stuck");
            }
            kg_log_scope(scope);
        }
    }
}

void kg_worker_poll_cancels(kg_worker_t *w) {
    char rids[32][KG_JOB_REQUEST_ID_MAX + 1];
    int n = kg_cancel_poll(w->jobs.cancel, rids, 32);
    for (int i = 0; i < n && !w->life.fatal; i++) {
        apply_cancel(w, rids[i]);
    }
}
