/* kg_worker: the kafka thread's loop, the job records and the callbacks.
 * See kg_worker.h for the design. */
#include "kg_worker.h"

#include "../backend/kg_backend.h"
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../engine/kg_engine.h"
#include "../engine/kg_sizing.h"
#include "../pipeline/kg_events.h"
#include "../pipeline/kg_intake.h"
#include "../pipeline/kg_jobrun.h"
#include "../pipeline/kg_runner.h"
#include "../pipeline/kg_served.h"
#include "../schema/kg_codec.h"
#include "kg_kafka_conf.h"
#include "kg_offsets.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PARTITIONS 1024
#define POLL_BATCH     64

// ---- job records ----

typedef enum rec_state {
    REC_PENDING,   /* prepared, waiting for room in the engine */
    REC_SUBMITTED, /* in the engine */
    REC_REVOKED,   /* partition revoked or shutdown: finish quietly */
} rec_state_t;

typedef struct job_rec {
    uint64_t id;
    kg_jobrun_t run; /* the job from intake to its terminal event (kg_jobrun) */
    rec_state_t state;
    struct job_rec *hnext; /* id hash chain */
    struct job_rec *qnext; /* pending FIFO */
} job_rec_t;

/* What a delivery report needs to mark a message done. */
typedef struct ack {
    int32_t partition;
    int64_t offset;
} ack_t;

struct kg_worker {
    const kg_config_t *cfg;
    const kg_model_t *model;
    char worker_id[128];
    char dlq_topic[512];
    kg_backend_t *be;
    kg_engine_t *engine;
    kg_runner_t *runner;
    rd_kafka_t *consumer, *producer;
    kg_offsets_t *offsets;
    kg_intake_limits_t limits;
    kg_served_t served; /* the model's names (limits.served points into it) */
    kg_codec_opts_t codec_opts;
    int32_t max_inflight;
    int32_t n_engine_recs;    /* engine request records: one per choice (kg_engine_submit) */
    int32_t n_engine_seqs;    /* choices of the jobs in the engine */
    size_t max_produce_bytes; /* payload bytes one produced message may carry */
    int32_t n_inflight;       /* records alive: pending + submitted + revoked awaiting finish */
    int32_t n_pending;
    uint64_t next_id;
    job_rec_t **table; /* (table_size) id -> record */
    size_t table_size;
    job_rec_t *pending_head, *pending_tail;
    rd_kafka_topic_partition_list_t *assigned; /* owned copy of the assignment */
    bool paused;
    _Atomic int stop_requested; /* set by a signal handler or another thread (the demo) */
    bool draining;
    int64_t drain_deadline_us;
    int fatal; /* non-zero: stop at once, exit non-zero */
    _Atomic int64_t lag[MAX_PARTITIONS];
    _Atomic int32_t lag_valid[MAX_PARTITIONS];
    int64_t last_lag_us;
    kg_worker_metrics_t m;
};

static job_rec_t *rec_find(kg_worker_t *w, uint64_t id) {
    for (job_rec_t *r = w->table[id & (w->table_size - 1)]; r; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void rec_insert(kg_worker_t *w, job_rec_t *r) {
    job_rec_t **slot = &w->table[r->id & (w->table_size - 1)];
    r->hnext = *slot;
    *slot = r;
    w->n_inflight++;
    atomic_store(&w->m.inflight, w->n_inflight);
}

static void rec_free(kg_worker_t *w, job_rec_t *r) {
    job_rec_t **p = &w->table[r->id & (w->table_size - 1)];
    while (*p && *p != r) {
        p = &(*p)->hnext;
    }
    if (*p) {
        *p = r->hnext;
        w->n_inflight--;
        atomic_store(&w->m.inflight, w->n_inflight);
    }
    if (r->state != REC_PENDING) {
        w->n_engine_seqs -= r->run.n_choices; /* its engine records are free again */
    }
    kg_jobrun_clear(&r->run);
    free(r);
}

// ---- producing ----

static void fatal(kg_worker_t *w, const char *what) {
    if (!w->fatal) {
        KG_LOG_ERROR("worker", "fatal: %s; stopping without storing unfinished offsets", what);
    }
    w->fatal = 1;
}

/* Produce one event (or DLQ copy). `ack` (may be NULL) travels as the
 * message opaque and is freed by the delivery report. */
static bool produce(kg_worker_t *w,
                    const char *topic,
                    const char *key,
                    size_t key_len,
                    const void *value,
                    size_t len,
                    ack_t *ack,
                    rd_kafka_headers_t *hdrs) {
    rd_kafka_resp_err_t err;
    for (int attempt = 0;; attempt++) {
        /* produceva rather than the producev macros: the varargs list cannot
         * take an optional element, and clang -Wpedantic flags the macros */
        rd_kafka_headers_t *h = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
        rd_kafka_vu_t vus[6];
        size_t n = 0;
        vus[n].vtype = RD_KAFKA_VTYPE_TOPIC;
        vus[n++].u.cstr = topic;
        vus[n].vtype = RD_KAFKA_VTYPE_KEY;
        vus[n].u.mem.ptr = (void *)key;
        vus[n++].u.mem.size = key_len;
        vus[n].vtype = RD_KAFKA_VTYPE_VALUE;
        vus[n].u.mem.ptr = (void *)value;
        vus[n++].u.mem.size = len;
        vus[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vus[n++].u.i = RD_KAFKA_MSG_F_COPY;
        vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
        vus[n++].u.ptr = ack;
        if (h) {
            vus[n].vtype = RD_KAFKA_VTYPE_HEADERS;
            vus[n++].u.headers = h;
        }
        rd_kafka_error_t *e = rd_kafka_produceva(w->producer, vus, n);
        err = e ? rd_kafka_error_code(e) : RD_KAFKA_RESP_ERR_NO_ERROR;
        if (e) {
            rd_kafka_error_destroy(e);
        }
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            atomic_fetch_add(&w->m.events_produced, 1);
            return true;
        }
        if (h) {
            rd_kafka_headers_destroy(h);
        }
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || attempt > 600) {
            break;
        }
        rd_kafka_poll(w->producer, 100); /* the local queue drains as the broker acks */
    }
    KG_LOG_ERROR("worker", "produce to %s failed: %s", topic, rd_kafka_err2str(err));
    free(ack);
    fatal(w, "could not produce an event");
    return false;
}

static ack_t *ack_new(int32_t partition, int64_t offset) {
    ack_t *a = malloc(sizeof(*a));
    if (a) {
        a->partition = partition;
        a->offset = offset;
    }
    return a;
}

static void store_offsets(kg_worker_t *w) {
    int32_t part;
    int64_t next;
    while (kg_offsets_next_committable(w->offsets, &part, &next)) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, w->cfg->jobs_topic, part)->offset = next;
        rd_kafka_resp_err_t err = rd_kafka_offsets_store(w->consumer, l);
        if (err) {
            KG_LOG_WARN("worker", "offsets_store failed: %s partition=%d offset=%lld",
                        rd_kafka_err2str(err), part, (long long)next);
        }
        rd_kafka_topic_partition_list_destroy(l);
    }
}

/* Delivery report (called from rd_kafka_poll on the producer, kafka thread). */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    kg_worker_t *w = opaque;
    ack_t *ack = rkm->_private;
    if (rkm->err) {
        char what[256];
        snprintf(what, sizeof(what), "delivery to %s failed: %s", rd_kafka_topic_name(rkm->rkt),
                 rd_kafka_err2str(rkm->err));
        fatal(w, what);
    } else if (ack && !w->fatal) {
        if (kg_offsets_done(w->offsets, ack->partition, ack->offset)) {
            store_offsets(w);
        }
    }
    free(ack);
}

static kg_event_origin_t origin(const kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_event_origin_t o = {.worker_id = w->worker_id,
                           .topic = w->cfg->jobs_topic,
                           .partition = partition,
                           .offset = offset,
                           .model = w->served.n > 0 ? w->served.names[0] : NULL};
    return o;
}

static void produce_error(kg_worker_t *w,
                          const char *request_id,
                          int32_t partition,
                          int64_t offset,
                          kg_error_code_t code,
                          const char *message,
                          const char *metadata_json) {
    kg_event_origin_t o = origin(w, partition, offset);
    size_t len;
    char *json = kg_events_error(&o, request_id, code, message, metadata_json, &len);
    if (!json) {
        fatal(w, "out of memory encoding an error event");
        return;
    }
    atomic_fetch_add(&w->m.jobs_error, 1);
    if ((unsigned)code < 16) {
        atomic_fetch_add(&w->m.jobs_by_error[code], 1);
    }
    KG_LOG_INFO("worker", "job failed request_id=%s partition=%d offset=%lld code=%s", request_id,
                partition, (long long)offset, kg_error_code_str(code));
    produce(w, w->cfg->results_topic, request_id, strlen(request_id), json, len,
            ack_new(partition, offset), NULL);
    free(json);
}

static void emit_token_events(kg_worker_t *w, job_rec_t *r, const kg_jobrun_step_t *js) {
    const kg_job_t *job = r->run.job;
    if (!job->stream) {
        return;
    }
    kg_event_origin_t o = origin(w, job->partition, job->offset);
    for (int i = 0; i < js->n_evs; i++) {
        size_t len;
        char *json = kg_jobrun_token_event(&r->run, js, i, &o, w->model->tok, &len);
        if (!json) {
            fatal(w, "out of memory encoding a token event");
            return;
        }
        produce(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len, NULL,
                NULL);
        free(json);
    }
}

/* The terminal event of a finished job (or of one the engine refused),
 * with its metrics and log line; the delivery report stores its offset. */
static void produce_terminal(kg_worker_t *w, job_rec_t *r, kg_status_t refused, int64_t now_us) {
    const kg_job_t *job = r->run.job;
    kg_event_origin_t o = origin(w, job->partition, job->offset);
    kg_jobrun_outcome_t oc;
    size_t len;
    char *json = refused != KG_OK ? kg_jobrun_refused(&r->run, &o, refused, &len, &oc)
                                  : kg_jobrun_terminal(&r->run, &o, w->model->tok,
                                                       w->max_produce_bytes, &len, &oc);
    if (!json) {
        fatal(w, "out of memory encoding a terminal event");
        return;
    }
    if (oc.logprobs_dropped) {
        KG_LOG_WARN("worker", "done event too large; sent without logprobs request_id=%s",
                    job->request_id);
    }
    if (oc.is_error) {
        atomic_fetch_add(&w->m.jobs_error, 1);
        atomic_fetch_add(&w->m.jobs_by_error[oc.code], 1);
        KG_LOG_INFO("worker", "job failed request_id=%s partition=%d offset=%lld code=%s",
                    job->request_id, job->partition, (long long)job->offset,
                    kg_error_code_str(oc.code));
    } else {
        const kg_job_timing_t *t = &r->run.t;
        int32_t n_gen = kg_jobrun_n_generated(&r->run);
        int64_t first = t->first_token_us ? t->first_token_us : now_us;
        kg_histogram_observe(&w->m.ttft, first - t->taken_us);
        kg_histogram_observe(&w->m.e2e, now_us - t->taken_us);
        if (n_gen > 1) {
            kg_histogram_observe(&w->m.tpot, (now_us - first) / (n_gen - 1));
        }
        atomic_fetch_add(&w->m.jobs_done, 1);
        atomic_fetch_add(&w->m.jobs_by_finish[oc.reason], 1);
        atomic_fetch_add(&w->m.prompt_tokens, r->run.prep.n_tokens);
        atomic_fetch_add(&w->m.generated_tokens, n_gen);
        KG_LOG_INFO("worker",
                    "job done request_id=%s partition=%d offset=%lld finish=%s tokens=%d "
                    "total_ms=%.1f",
                    job->request_id, job->partition, (long long)job->offset,
                    kg_finish_reason_str(oc.reason), n_gen, (double)(now_us - t->taken_us) / 1e3);
    }
    produce(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len,
            ack_new(job->partition, job->offset), NULL);
    free(json);
}

// ---- completions from the engine ----

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
        r->state = REC_PENDING;
        w->n_engine_seqs -= r->run.n_choices;
        r->qnext = w->pending_head;
        w->pending_head = r;
        if (!w->pending_tail) {
            w->pending_tail = r;
        }
        w->n_pending++;
        return;
    }
    if (re->kind == KG_RUNNER_REJECTED) {
        if (r->state != REC_REVOKED) {
            produce_terminal(w, r, re->status, re->ts_us);
        }
        rec_free(w, r);
        return;
    }
    if (r->state == REC_REVOKED) {
        if (kg_jobrun_finish_seen(&r->run, &re->c)) {
            rec_free(w, r); /* quietly: no events, the offset is not stored */
        }
        return;
    }
    kg_jobrun_step_t js;
    if (kg_jobrun_on_completion(&r->run, &re->c, re->ts_us, &js) != KG_OK) {
        fatal(w, "out of memory assembling output");
        return;
    }
    emit_token_events(w, r, &js);
    if (js.cancel && kg_runner_cancel_choice(w->runner, r->id, js.choice) != KG_OK) {
        fatal(w, "engine command queue stuck");
        return;
    }
    if (js.finished) {
        produce_terminal(w, r, KG_OK, re->ts_us);
        rec_free(w, r);
    }
}

// ---- intake ----

static void submit_pending(kg_worker_t *w) {
    int32_t cap = (int32_t)(w->cfg->max_batch_size + w->cfg->max_queue_depth);
    while (w->pending_head && w->n_inflight - w->n_pending < cap &&
           w->n_engine_seqs + w->pending_head->run.n_choices <= w->n_engine_recs) {
        job_rec_t *r = w->pending_head;
        kg_request_t req = kg_jobrun_request(&r->run, r->id);
        kg_status_t st = kg_runner_submit(w->runner, &req);
        if (st == KG_QUEUE_FULL) {
            return;
        }
        if (st != KG_OK) {
            fatal(w, "out of memory submitting a job");
            return;
        }
        w->pending_head = r->qnext;
        if (!w->pending_head) {
            w->pending_tail = NULL;
        }
        r->qnext = NULL;
        w->n_pending--;
        r->state = REC_SUBMITTED;
        w->n_engine_seqs += r->run.n_choices;
        kg_jobrun_submitted(&r->run, kg_clock_us());
    }
}

static void
dead_letter(kg_worker_t *w, const rd_kafka_message_t *rkm, const kg_codec_error_t *err) {
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    /* a copy the producer cannot send would stop the worker and then every
     * restart (the offset is never stored): keep the head of the payload and
     * say how long the original was */
    size_t len = rkm->len;
    if (len > w->max_produce_bytes) {
        char orig[24];
        len = w->max_produce_bytes;
        snprintf(orig, sizeof(orig), "%zu", rkm->len);
        rd_kafka_header_add(h, "kgen-payload-truncated-from", -1, orig, -1);
    }
    char part[16], off[24];
    snprintf(part, sizeof(part), "%d", rkm->partition);
    snprintf(off, sizeof(off), "%lld", (long long)rkm->offset);
    rd_kafka_header_add(h, "kgen-error-reason", -1, kg_codec_dlq_reason_str(err->reason), -1);
    rd_kafka_header_add(h, "kgen-error-message", -1, err->message, -1);
    rd_kafka_header_add(h, "kgen-source-topic", -1, rd_kafka_topic_name(rkm->rkt), -1);
    rd_kafka_header_add(h, "kgen-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "kgen-source-offset", -1, off, -1);
    rd_kafka_header_add(h, "kgen-worker-id", -1, w->worker_id, -1);
    atomic_fetch_add(&w->m.jobs_dlq, 1);
    KG_LOG_WARN("worker", "dead-lettered partition=%d offset=%lld reason=%s", rkm->partition,
                (long long)rkm->offset, kg_codec_dlq_reason_str(err->reason));
    produce(w, w->dlq_topic, rkm->key, rkm->key_len, rkm->payload, len,
            ack_new(rkm->partition, rkm->offset), h);
    rd_kafka_headers_destroy(h);
}

static void on_message(kg_worker_t *w, rd_kafka_message_t *rkm) {
    atomic_fetch_add(&w->m.messages_consumed, 1);
    kg_status_t st = kg_offsets_track(w->offsets, rkm->partition, rkm->offset);
    if (st != KG_OK) {
        /* cannot happen while we pause at the in-flight cap; never drop a job silently */
        KG_LOG_ERROR("worker", "cannot track partition=%d offset=%lld: %s; seeking back",
                     rkm->partition, (long long)rkm->offset, kg_status_str(st));
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, w->cfg->jobs_topic, rkm->partition)->offset =
            rkm->offset;
        rd_kafka_error_t *e = rd_kafka_seek_partitions(w->consumer, l, 1000);
        if (e) {
            rd_kafka_error_destroy(e);
        }
        rd_kafka_topic_partition_list_destroy(l);
        return;
    }
    kg_job_t *job = NULL;
    kg_codec_error_t cerr;
    kg_codec_opts_t copts = w->codec_opts;
    copts.key = rkm->key; /* the request_id of a bare OpenAI body */
    copts.key_len = rkm->key_len;
    rd_kafka_headers_t *hdrs = NULL;
    const void *fmt = NULL;
    size_t fmt_len = 0;
    if (rd_kafka_message_headers(rkm, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, "kgen-format", &fmt, &fmt_len) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        fmt && !kg_codec_job_format_parse(fmt, fmt_len, &copts.format)) {
        KG_LOG_WARN("worker", "unknown kgen-format header (%.*s) partition=%d offset=%lld",
                    (int)(fmt_len < 32 ? fmt_len : 32), (const char *)fmt, rkm->partition,
                    (long long)rkm->offset);
    }
    st = kg_codec_decode_job_opts(rkm->payload ? rkm->payload : "", rkm->len, &copts, &job, &cerr);
    if (st == KG_ERR_NOMEM) {
        fatal(w, "out of memory decoding a job");
        return;
    }
    if (st != KG_OK) {
        if (cerr.kind == KG_CODEC_DLQ) {
            dead_letter(w, rkm, &cerr);
        } else {
            produce_error(w, cerr.request_id, rkm->partition, rkm->offset, KG_ERROR_INVALID_JOB,
                          cerr.message, NULL);
        }
        return;
    }
    job->partition = rkm->partition;
    job->offset = rkm->offset;
    job_rec_t *r = calloc(1, sizeof(*r));
    if (!r) {
        kg_job_free(job);
        fatal(w, "out of memory");
        return;
    }
    r->id = w->next_id++;
    kg_error_code_t code;
    char msg[256];
    st = kg_jobrun_start(&r->run, w->model, &w->limits, job, kg_clock_epoch_ms(), kg_clock_us(),
                         &code, msg, sizeof(msg));
    if (st != KG_OK) {
        if (st == KG_ERR_NOMEM) {
            fatal(w, "out of memory preparing a job");
        } else {
            produce_error(w, job->request_id, job->partition, job->offset, code, msg,
                          job->metadata_json);
        }
        kg_jobrun_clear(&r->run);
        free(r);
        return;
    }
    r->state = REC_PENDING;
    rec_insert(w, r);
    if (w->pending_tail) {
        w->pending_tail->qnext = r;
    } else {
        w->pending_head = r;
    }
    w->pending_tail = r;
    w->n_pending++;
    submit_pending(w);
}

// ---- partitions: pause, resume, rebalance ----

static void set_paused(kg_worker_t *w, bool pause) {
    if (w->paused == pause || !w->assigned) {
        w->paused = pause;
        atomic_store(&w->m.paused, pause);
        return;
    }
    rd_kafka_resp_err_t err = pause ? rd_kafka_pause_partitions(w->consumer, w->assigned)
                                    : rd_kafka_resume_partitions(w->consumer, w->assigned);
    if (err) {
        KG_LOG_WARN("worker", "%s partitions: %s", pause ? "pause" : "resume",
                    rd_kafka_err2str(err));
    }
    KG_LOG_DEBUG("worker", "%s partitions inflight=%d", pause ? "paused" : "resumed",
                 w->n_inflight);
    w->paused = pause;
    atomic_store(&w->m.paused, pause);
}

static void check_backpressure(kg_worker_t *w) {
    if (w->draining) {
        set_paused(w, true);
        return;
    }
    if (!w->paused && w->n_inflight >= w->max_inflight) {
        set_paused(w, true);
    } else if (w->paused && w->n_inflight <= w->max_inflight * 3 / 4) {
        set_paused(w, false);
    }
}

/* Cancel quietly every job of the listed partitions (NULL: all), or only
 * those that have not streamed a token yet. */
static void
abandon_jobs(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts, bool unstarted_only) {
    for (size_t i = 0; i < w->table_size; i++) {
        for (job_rec_t *r = w->table[i], *next; r; r = next) {
            next = r->hnext;
            bool hit = parts == NULL;
            for (int k = 0; parts && k < parts->cnt && !hit; k++) {
                hit = parts->elems[k].partition == r->run.job->partition;
            }
            if (!hit || r->state == REC_REVOKED ||
                (unstarted_only && r->run.t.first_token_us != 0)) {
                continue;
            }
            if (r->state == REC_PENDING) {
                /* never reached the engine: unlink from the FIFO and drop */
                job_rec_t **p = &w->pending_head, *prev = NULL;
                while (*p && *p != r) {
                    prev = *p;
                    p = &(*p)->qnext;
                }
                if (*p) {
                    *p = r->qnext;
                    if (w->pending_tail == r) {
                        w->pending_tail = prev;
                    }
                    w->n_pending--;
                }
                atomic_fetch_add(&w->m.jobs_cancelled, 1);
                rec_free(w, r);
                continue;
            }
            r->state = REC_REVOKED;
            atomic_fetch_add(&w->m.jobs_cancelled, 1);
            if (kg_runner_cancel(w->runner, r->id) != KG_OK) {
                fatal(w, "engine command queue stuck");
            }
        }
    }
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque) {
    kg_worker_t *w = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            if (kg_offsets_assign(w->offsets, parts->elems[i].partition) != KG_OK) {
                fatal(w, "cannot track an assigned partition");
            }
        }
        rd_kafka_assign(rk, parts);
        if (w->assigned) {
            rd_kafka_topic_partition_list_destroy(w->assigned);
        }
        w->assigned = rd_kafka_topic_partition_list_copy(parts);
        atomic_store(&w->m.assigned_partitions, parts->cnt);
        atomic_store(&w->m.ready, 1);
        KG_LOG_INFO("worker", "partitions assigned count=%d", parts->cnt);
        if (w->paused) {
            rd_kafka_pause_partitions(rk, w->assigned);
        }
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        KG_LOG_INFO("worker", "partitions revoked count=%d inflight=%d", parts->cnt, w->n_inflight);
        /* let acks of finished jobs land and their offsets be committed first */
        rd_kafka_flush(w->producer, 10000);
        rd_kafka_poll(w->producer, 0);
        if (!w->fatal) {
            rd_kafka_commit(rk, NULL, 0);
        }
        abandon_jobs(w, parts, false);
        for (int i = 0; i < parts->cnt; i++) {
            kg_offsets_revoke(w->offsets, parts->elems[i].partition);
            if (parts->elems[i].partition >= 0 && parts->elems[i].partition < MAX_PARTITIONS) {
                atomic_store(&w->lag_valid[parts->elems[i].partition], 0);
            }
        }
        rd_kafka_assign(rk, NULL);
        if (w->assigned) {
            rd_kafka_topic_partition_list_destroy(w->assigned);
            w->assigned = NULL;
        }
        atomic_store(&w->m.assigned_partitions, 0);
        return;
    }
    KG_LOG_ERROR("worker", "rebalance error: %s", rd_kafka_err2str(err));
    rd_kafka_assign(rk, NULL);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    kg_worker_t *w = opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[512];
        rd_kafka_fatal_error(rk, buf, sizeof(buf));
        char what[640];
        snprintf(what, sizeof(what), "librdkafka fatal error: %s", buf);
        fatal(w, what);
        return;
    }
    /* informational: librdkafka retries by itself (a broker that went away) */
    KG_LOG_WARN("rdkafka", "%s client=%s error=%s", reason, rd_kafka_name(rk),
                rd_kafka_err2name((rd_kafka_resp_err_t)err));
}

static void update_lag(kg_worker_t *w) {
    int64_t now = kg_clock_us();
    if (!w->assigned || now - w->last_lag_us < 1000000) {
        return;
    }
    w->last_lag_us = now;
    rd_kafka_topic_partition_list_t *pos = rd_kafka_topic_partition_list_copy(w->assigned);
    rd_kafka_position(w->consumer, pos);
    for (int i = 0; i < pos->cnt; i++) {
        int32_t p = pos->elems[i].partition;
        int64_t lo, hi;
        if (p < 0 || p >= MAX_PARTITIONS ||
            rd_kafka_get_watermark_offsets(w->consumer, w->cfg->jobs_topic, p, &lo, &hi) != 0 ||
            hi < 0) {
            continue;
        }
        int64_t at = pos->elems[i].offset >= 0 ? pos->elems[i].offset : lo;
        atomic_store(&w->lag[p], hi > at ? hi - at : 0);
        atomic_store(&w->lag_valid[p], 1);
    }
    rd_kafka_topic_partition_list_destroy(pos);
}

// ---- lifecycle ----

static rd_kafka_t *make_consumer(kg_worker_t *w, char *errstr, size_t errstr_size) {
    const kg_config_t *cfg = w->cfg;
    rd_kafka_conf_t *conf = kg_kafka_conf_new(cfg, errstr, errstr_size);
    if (!conf) {
        return NULL;
    }
    /* ours first, so an explicit -X of the same key (set again below) wins */
    struct {
        const char *k, *v;
    } ours[] = {{"group.id", cfg->group_id},
                {"enable.auto.offset.store", "false"},
                {"enable.auto.commit", "true"},
                /* librdkafka's 5 s default reruns up to 5 s of finished jobs
                 * after a crash; a commit a second costs the coordinator little */
                {"auto.commit.interval.ms", "1000"},
                {"auto.offset.reset", "earliest"},
                {"partition.assignment.strategy", cfg->assignment_strategy},
                {"queued.max.messages.kbytes", "8192"},
                /* after a resume the next fetch answers within this, not
                 * librdkafka's 500 ms default (measured: 133 -> 797 jobs/s
                 * with pause/resume cycling) */
                {"fetch.wait.max.ms", "50"},
                {"client.id", w->worker_id}};
    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
        if (kg_kafka_conf_set(conf, ours[i].k, ours[i].v, errstr, errstr_size) != 0) {
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
    rd_kafka_conf_set_error_cb(conf, error_cb);
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

static rd_kafka_t *make_producer(kg_worker_t *w, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = kg_kafka_conf_new(w->cfg, errstr, errstr_size);
    if (!conf) {
        return NULL;
    }
    if (kg_kafka_conf_set(conf, "enable.idempotence", "true", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "acks", "all", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "linger.ms", "5", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "client.id", w->worker_id, errstr, errstr_size)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    for (int i = 0; i < w->cfg->n_kafka_props; i++) {
        /* re-apply -X so they win over our defaults (linger.ms, ...) */
        if (kg_kafka_conf_set(conf, w->cfg->kafka_keys[i], w->cfg->kafka_values[i], errstr,
                              errstr_size)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    rd_kafka_conf_set_opaque(conf, w);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        snprintf(errstr, errstr_size, "producer: %s", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return rk;
}

kg_worker_t *
kg_worker_new(const kg_config_t *cfg, const kg_model_t *model, char *errstr, size_t errstr_size) {
    kg_worker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    w->cfg = cfg;
    w->model = model;
    kg_histogram_init(&w->m.ttft, KG_HIST_TTFT);
    kg_histogram_init(&w->m.tpot, KG_HIST_TPOT);
    kg_histogram_init(&w->m.e2e, KG_HIST_E2E);
    if (*cfg->worker_id) {
        snprintf(w->worker_id, sizeof(w->worker_id), "%s", cfg->worker_id);
    } else {
        char host[64] = "kgen";
        gethostname(host, sizeof(host) - 1);
        snprintf(w->worker_id, sizeof(w->worker_id), "%s-%d", host, (int)getpid());
    }
    snprintf(w->dlq_topic, sizeof(w->dlq_topic), "%s", *cfg->dlq_topic ? cfg->dlq_topic : "");
    if (!*cfg->dlq_topic) {
        snprintf(w->dlq_topic, sizeof(w->dlq_topic), "%s.dlq", cfg->jobs_topic);
    }
    w->max_inflight = (int32_t)(cfg->max_batch_size + cfg->max_queue_depth);
    w->codec_opts = kg_codec_opts_default();
    w->codec_opts.max_message_size = (size_t)cfg->max_message_bytes;

    /* engine: every job the worker lets in may wait inside the engine while
     * the running ones finish, so the engine's queue holds all of them */
    kg_engine_options_t eo = kg_engine_options_default();
    eo.max_batch_size = cfg->max_batch_size;
    eo.max_queue_depth = cfg->max_batch_size + cfg->max_queue_depth;
    eo.max_batch_tokens = cfg->max_batch_tokens;
    eo.ctx = cfg->ctx;
    eo.kv_block_size = cfg->kv_block_size;
    eo.kv_memory_mib = cfg->kv_memory_mib;
    eo.prefix_cache = cfg->prefix_cache;
    eo.threads = cfg->threads;
    kg_engine_params_t ep;
    kg_backend_params_t bp;
    bool clamped;
    if (kg_engine_size(model, &eo, &ep, &bp, &clamped, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    if (clamped) {
        KG_LOG_WARN("worker", "the KV pool holds %d tokens: the context is cut to that",
                    ep.max_seq_len);
    }
    w->limits.max_seq_len = ep.max_seq_len;
    w->limits.max_prompt_tokens = (int32_t)cfg->max_prompt_tokens;
    w->limits.max_tokens_limit = (int32_t)cfg->max_tokens_limit;
    w->limits.max_choices = ep.max_batch_size < KG_JOB_MAX_N ? ep.max_batch_size : KG_JOB_MAX_N;
    w->n_engine_recs = ep.max_batch_size + ep.max_queue_depth;
    if (kg_served_init(&w->served, cfg->served_model_name, model, cfg->model, errstr,
                       errstr_size) != KG_OK) {
        goto fail;
    }
    w->limits.served = (const char *const *)w->served.names;
    w->limits.n_served = w->served.n;
    {
        char names[512];
        kg_served_describe(&w->served, names, sizeof(names));
        KG_LOG_INFO("worker", "serving model names=\"%s\"", names);
    }

    w->be = kg_backend_new(cfg->backend, model, &bp, errstr, errstr_size);
    if (!w->be) {
        goto fail;
    }
    w->engine = kg_engine_new(w->be, &ep, errstr, errstr_size);
    if (!w->engine) {
        goto fail;
    }
    w->runner = kg_runner_new(w->engine, w->max_inflight, errstr, errstr_size);
    if (!w->runner) {
        goto fail;
    }
    w->table_size = 1;
    while (w->table_size < (size_t)w->max_inflight * 2) {
        w->table_size <<= 1;
    }
    w->table = calloc(w->table_size, sizeof(*w->table));
    /* the fetch queue can hand us a few messages after a pause: room for them */
    w->offsets = kg_offsets_new((size_t)w->max_inflight * 4 + 4096);
    if (!w->table || !w->offsets) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    w->producer = make_producer(w, errstr, errstr_size);
    if (!w->producer) {
        goto fail;
    }
    {
        char buf[32];
        size_t bl = sizeof(buf);
        long mmb = 1000000;
        if (rd_kafka_conf_get(rd_kafka_conf(w->producer), "message.max.bytes", buf, &bl) ==
            RD_KAFKA_CONF_OK) {
            mmb = atol(buf);
        }
        /* room for the key, headers and record overhead */
        w->max_produce_bytes = mmb > 16384 ? (size_t)mmb - 8192 : (size_t)mmb / 2;
    }
    w->consumer = make_consumer(w, errstr, errstr_size);
    if (!w->consumer) {
        goto fail;
    }
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, cfg->jobs_topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(w->consumer, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (err) {
        snprintf(errstr, errstr_size, "subscribe to %s: %s", cfg->jobs_topic,
                 rd_kafka_err2str(err));
        goto fail;
    }
    KG_LOG_INFO("worker",
                "started worker_id=%s backend=%s jobs_topic=%s results_topic=%s "
                "max_batch_size=%d kv_blocks=%d",
                w->worker_id, kg_backend_name(w->be), cfg->jobs_topic, cfg->results_topic,
                ep.max_batch_size, ep.n_kv_blocks);
    return w;
fail:
    kg_worker_free(w);
    return NULL;
}

void kg_worker_stop(kg_worker_t *w) {
    atomic_store(&w->stop_requested, 1); /* lock-free: async-signal-safe */
}

static void drain_engine_events(kg_worker_t *w, int timeout_ms) {
    kg_runner_event_t evs[POLL_BATCH];
    int n = kg_runner_poll(w->runner, evs, POLL_BATCH, timeout_ms);
    for (int i = 0; i < n; i++) {
        if (evs[i].kind == KG_RUNNER_FATAL) {
            fatal(w, "the backend failed; running jobs are not committed and will be redelivered");
            continue;
        }
        on_completion(w, &evs[i]);
    }
}

int kg_worker_run(kg_worker_t *w) {
    while (!w->fatal) {
        int64_t now = kg_clock_us();
        atomic_store(&w->m.last_loop_us, now);
        if (atomic_load(&w->stop_requested) && !w->draining) {
            w->draining = true;
            w->drain_deadline_us = now + (int64_t)(w->cfg->drain_timeout_s * 1e6);
            KG_LOG_INFO("worker", "stopping: draining inflight=%d timeout_s=%g", w->n_inflight,
                        w->cfg->drain_timeout_s);
            /* jobs not yet in the engine are given back (not committed) */
            for (job_rec_t *r = w->pending_head; r; r = w->pending_head) {
                w->pending_head = r->qnext;
                w->n_pending--;
                rec_free(w, r);
            }
            w->pending_tail = NULL;
            /* so are jobs the engine has not started streaming (waiting for
             * a slot, or in their first prefill step): the drain is for the
             * running ones, and the next owner can start these at once */
            abandon_jobs(w, NULL, true);
        }
        if (w->draining) {
            if (w->n_inflight == 0) {
                break;
            }
            if (now > w->drain_deadline_us) {
                KG_LOG_WARN("worker", "drain timeout: cancelling inflight=%d (not committed)",
                            w->n_inflight);
                abandon_jobs(w, NULL, false);
                w->drain_deadline_us = INT64_MAX;
            }
        }
        check_backpressure(w);
        /* consumer: messages and rebalances; short timeout so completions flow */
        int n_taken = 0;
        rd_kafka_message_t *rkm;
        while (n_taken < POLL_BATCH && !w->fatal &&
               (rkm = rd_kafka_consumer_poll(w->consumer, n_taken == 0 ? 5 : 0)) != NULL) {
            n_taken++;
            if (rkm->err) {
                if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                    KG_LOG_WARN("worker", "consumer: %s", rd_kafka_message_errstr(rkm));
                }
            } else if (w->draining) {
                /* after the stop: not taken, not committed; the next owner runs it */
            } else {
                on_message(w, rkm);
            }
            rd_kafka_message_destroy(rkm);
            check_backpressure(w);
        }
        submit_pending(w);
        drain_engine_events(w, n_taken ? 0 : 2);
        rd_kafka_poll(w->producer, 0);
        update_lag(w);
        if (kg_runner_is_dead(w->runner)) {
            drain_engine_events(w, 0);
            fatal(w, "the backend failed");
        }
    }
    /* flush what was produced, store and commit offsets, leave the group */
    int rc = w->fatal ? 1 : 0;
    if (!w->fatal) {
        rd_kafka_flush(w->producer, 30000);
        rd_kafka_poll(w->producer, 0);
        if (rd_kafka_outq_len(w->producer) > 0) {
            KG_LOG_ERROR("worker", "%d events not delivered at shutdown",
                         rd_kafka_outq_len(w->producer));
            rc = 1;
        }
        rd_kafka_commit(w->consumer, NULL, 0);
    }
    rd_kafka_consumer_close(w->consumer);
    KG_LOG_INFO("worker", "stopped rc=%d", rc);
    return rc;
}

void kg_worker_free(kg_worker_t *w) {
    if (!w) {
        return;
    }
    kg_runner_free(w->runner); /* stops the engine thread first */
    if (w->table) {
        for (size_t i = 0; i < w->table_size; i++) {
            while (w->table[i]) {
                rec_free(w, w->table[i]);
            }
        }
    }
    if (w->assigned) {
        rd_kafka_topic_partition_list_destroy(w->assigned);
    }
    if (w->consumer) {
        rd_kafka_destroy(w->consumer);
    }
    if (w->producer) {
        rd_kafka_purge(w->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(w->producer, 0);
        rd_kafka_destroy(w->producer);
    }
    kg_offsets_free(w->offsets);
    free(w->table);
    kg_engine_free(w->engine);
    kg_backend_free(w->be);
    kg_served_clear(&w->served);
    free(w);
}

const kg_worker_metrics_t *kg_worker_metrics(const kg_worker_t *w) {
    return &w->m;
}

const struct kg_runner_gauges *kg_worker_engine_gauges(const kg_worker_t *w) {
    return kg_runner_gauges(w->runner);
}

int kg_worker_partition_lag(kg_worker_t *w, int32_t *partitions, int64_t *lags, int max) {
    int n = 0;
    for (int32_t p = 0; p < MAX_PARTITIONS && n < max; p++) {
        if (atomic_load(&w->lag_valid[p])) {
            partitions[n] = p;
            lags[n++] = atomic_load(&w->lag[p]);
        }
    }
    return n;
}
