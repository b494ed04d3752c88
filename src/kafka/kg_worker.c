/* kg_worker: the kafka thread's loop, the job records and the callbacks.
 * See kg_worker.h for the design. */
#include "kg_worker.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../pipeline/kg_events.h"
#include "../pipeline/kg_intake.h"
#include "../pipeline/kg_jobrun.h"
#include "../pipeline/kg_runner.h"
#include "../pipeline/kg_served.h"
#include "../pipeline/kg_stack.h"
#include "../schema/kg_codec.h"
#include "kg_cancel.h"
#include "kg_journal.h"
#include "kg_kafka_conf.h"
#include "kg_lanes.h"
#include "kg_offsets.h"
#include "kg_topic_config.h"
#include "kg_txn.h"
#include "kg_worker_int.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENGINE_SLACK 2 /* with lanes: jobs waiting in the engine beyond its slots */
/* Bytes of a produced message beyond its value: the key (a request_id,
 * <= 128 bytes), the record and the record-batch framing (~90 bytes). */
#define RECORD_OVERHEAD 512
/* The kgen-* headers of a dead-letter copy (an error message <= 256 bytes,
 * topic and worker names). */
#define DLQ_HEADER_ROOM 2048
/* A job's key on its headers-only DLQ copy is cut to this: a producer's key
 * is not bounded like a request_id, and alone it must not make that copy too big. */
#define DLQ_KEY_MAX 1024
/* The smallest message limit we run with: a done event with everything shed. */
#define MIN_MESSAGE_BYTES (4096 + RECORD_OVERHEAD)
#define TOPIC_LOOKUP_MS   5000

// ---- job records ----

static job_rec_t *rec_find(kg_worker_t *w, uint64_t id) {
    for (job_rec_t *r = w->jobs.table[id & (w->jobs.table_size - 1)]; r; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void rec_insert(kg_worker_t *w, job_rec_t *r) {
    job_rec_t **slot = &w->jobs.table[r->id & (w->jobs.table_size - 1)];
    r->hnext = *slot;
    *slot = r;
    w->jobs.n_inflight++;
    atomic_store(&w->m.inflight, w->jobs.n_inflight);
}

static void rec_free(kg_worker_t *w, job_rec_t *r) {
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
        w->jobs.n_engine_seqs -= r->run.n_choices; /* its engine records are free again */
    }
    kg_jobrun_clear(&r->run);
    free(r);
}

// ---- producing ----

static void fatal(kg_worker_t *w, const char *what) {
    if (!w->life.fatal) {
        KG_LOG_ERROR("worker", "fatal: %s; stopping without storing unfinished offsets", what);
    }
    w->life.fatal = 1;
}

/* A fatal error of the broker or a topic: no job can have caused it, so
 * the journal hands the partitions over as clean (kg_journal_revoke). */
static void fatal_kafka(kg_worker_t *w, const char *what) {
    w->life.fatal_kafka = !w->life.fatal;
    fatal(w, what);
}

static void end_suspect(kg_worker_t *w, int32_t partition, int64_t offset) {
    if (w->intake.suspect_busy && w->intake.suspect_partition == partition &&
        w->intake.suspect_offset == offset) {
        w->intake.suspect_busy = false;
        atomic_store(&w->m.suspects, w->intake.suspects_head != NULL);
    }
}

/* The job was answered (its terminal event or DLQ copy produced): off the
 * journal's record; when it was the running suspect, the next may start. */
static void job_answered(kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_journal_finish(w->intake.journal[lane_of(partition)], part_of(partition), offset);
    end_suspect(w, partition, offset);
}

/* The job was given back unfinished (revoke, drain): it keeps its strikes. */
static void job_given_back(kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_journal_release(w->intake.journal[lane_of(partition)], part_of(partition), offset);
    end_suspect(w, partition, offset);
}

/* Errors about one message rather than the broker or the topic: the
 * broker took the others and would refuse this one again, so the job gets
 * an answer instead of stopping the worker (and, after a restart, every
 * worker that gets the job). */
static bool is_message_fault(rd_kafka_resp_err_t err) {
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE: /* message.max.bytes or max.message.bytes */
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG: /* CORRUPT_MESSAGE */
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
        return true;
    default:
        return false;
    }
}

static void on_refused(kg_worker_t *w,
                       const char *topic,
                       const void *key,
                       size_t key_len,
                       const void *value,
                       size_t len,
                       const rd_kafka_headers_t *hdrs,
                       const ack_t *ack,
                       rd_kafka_resp_err_t err);

/* Produce one event (or DLQ copy) on w->out.producer. `ack` (may be NULL)
 * travels as the message opaque and is freed by the delivery report. A
 * message the producer refuses for its own sake is handled as a refused
 * delivery (on_refused); any other failure is fatal. */
static bool produce_now(kg_worker_t *w,
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
        rd_kafka_error_t *e = rd_kafka_produceva(w->out.producer, vus, n);
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
        rd_kafka_poll(w->out.producer, 100); /* the local queue drains as the broker acks */
    }
    if (is_message_fault(err)) {
        on_refused(w, topic, key, key_len, value, len, hdrs, ack, err);
        free(ack);
        return false;
    }
    KG_LOG_ERROR("worker", "produce to %s failed: %s", topic, rd_kafka_err2str(err));
    free(ack);
    fatal_kafka(w, "could not produce an event");
    return false;
}

static void store_offsets(kg_worker_t *w);

/* Produce an answer (a terminal event, a DLQ copy) or, with --exactly-once,
 * keep it for the next transaction (kg_txn), which carries the job's offset
 * too: the offset is marked done now, and `ack` is logged when the
 * transaction commits. Token events go through produce_now. */
static bool produce(kg_worker_t *w,
                    const char *topic,
                    const char *key,
                    size_t key_len,
                    const void *value,
                    size_t len,
                    ack_t *ack,
                    rd_kafka_headers_t *hdrs) {
    if (!w->out.txn) {
        return produce_now(w, topic, key, key_len, value, len, ack, hdrs);
    }
    if (kg_txn_add(w->out.txn, topic, key, key_len, value, len, hdrs,
                   ack ? topic_of(w, ack->partition) : "", ack ? part_of(ack->partition) : -1,
                   ack ? ack->offset : -1, ack) != KG_OK) {
        free(ack);
        fatal(w, "out of memory keeping an answer for the transaction");
        return false;
    }
    atomic_fetch_add(&w->m.events_produced, 1);
    if (ack && kg_offsets_done(w->parts.offsets, ack->partition, ack->offset)) {
        store_offsets(w);
    }
    return true;
}

static ack_t *ack_new(int32_t partition, int64_t offset, ack_kind_t kind) {
    ack_t *a = calloc(1, sizeof(*a));
    if (a) {
        a->partition = partition;
        a->offset = offset;
        a->kind = kind;
    }
    return a;
}

static void store_offsets(kg_worker_t *w) {
    int32_t part;
    int64_t next;
    while (kg_offsets_next_committable(w->parts.offsets, &part, &next)) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, topic_of(w, part), part_of(part))->offset = next;
        if (w->out.txn) {
            /* the next transaction commits it (kg_txn) */ kg_txn_set_offset(
                w->out.txn, topic_of(w, part), part_of(part), next);
            rd_kafka_topic_partition_list_destroy(l);
            continue;
        }
        rd_kafka_resp_err_t err = rd_kafka_offsets_store(w->parts.consumer, l);
        if (err) {
            KG_LOG_WARN("worker", "offsets_store failed: %s topic=%s partition=%d offset=%lld",
                        rd_kafka_err2str(err), topic_of(w, part), part_of(part), (long long)next);
        }
        rd_kafka_topic_partition_list_destroy(l);
    }
}

/* A job's answer is on the broker: count it and log it now, not when it
 * was produced, so the log never shows a job as done that was not. */
static void log_answered(kg_worker_t *w, const void *rkey, size_t key_len, const ack_t *ack) {
    int klen = (int)key_len;
    const char *key = rkey ? rkey : "";
    if (ack->kind == ACK_RESULT && !ack->is_error) {
        atomic_fetch_add(&w->m.jobs_done, 1);
        atomic_fetch_add(&w->m.jobs_by_finish[ack->reason], 1);
        KG_LOG_INFO(
            "worker",
            "job done request_id=%.*s topic=%s partition=%d offset=%lld finish=%s tokens=%d "
            "total_ms=%.1f",
            klen, key, topic_of(w, ack->partition), part_of(ack->partition), (long long)ack->offset,
            kg_finish_reason_str(ack->reason), ack->n_gen, ack->total_ms);
    } else if (ack->kind == ACK_RESULT || ack->kind == ACK_ANSWER) {
        kg_error_code_t code = ack->kind == ACK_ANSWER ? KG_ERROR_INTERNAL : ack->code;
        atomic_fetch_add(&w->m.jobs_error, 1);
        atomic_fetch_add(&w->m.jobs_by_error[code], 1);
        KG_LOG_INFO("worker",
                    "job failed request_id=%.*s topic=%s partition=%d offset=%lld code=%s", klen,
                    key, topic_of(w, ack->partition), part_of(ack->partition),
                    (long long)ack->offset, kg_error_code_str(code));
    }
}

/* Delivery report (called from rd_kafka_poll on the producer, kafka thread). */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    kg_worker_t *w = opaque;
    ack_t *ack = rkm->_private;
    if (rkm->err && is_message_fault(rkm->err) && !w->life.fatal) {
        rd_kafka_headers_t *h = NULL;
        if (rd_kafka_message_headers(rkm, &h) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            h = NULL;
        }
        on_refused(w, rd_kafka_topic_name(rkm->rkt), rkm->key, rkm->key_len, rkm->payload, rkm->len,
                   h, ack, rkm->err);
    } else if (rkm->err) {
        /* the broker or the topic is at fault, not this message; still say whose it was */
        char what[512], job[320] = "";
        int kl = rkm->key_len < KG_JOB_REQUEST_ID_MAX ? (int)rkm->key_len : KG_JOB_REQUEST_ID_MAX;
        if (ack && ack->partition >= 0) {
            snprintf(job, sizeof(job), "; its job: %s partition %d offset %lld",
                     topic_of(w, ack->partition), part_of(ack->partition), (long long)ack->offset);
        }
        snprintf(what, sizeof(what), "delivery to %s failed: %s (message key %.*s%s)",
                 rd_kafka_topic_name(rkm->rkt), rd_kafka_err2str(rkm->err), rkm->key ? kl : 0,
                 rkm->key ? (const char *)rkm->key : "", job);
        fatal_kafka(w, what);
    } else if (ack && !w->life.fatal) {
        log_answered(w, rkm->key, rkm->key_len, ack);
        if (kg_offsets_done(w->parts.offsets, ack->partition, ack->offset)) {
            store_offsets(w);
        }
    }
    free(ack);
}

static kg_event_origin_t origin(const kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_event_origin_t o = {.worker_id = w->worker_id,
                           .topic = partition >= 0 ? topic_of(w, partition) : NULL,
                           .partition = partition >= 0 ? part_of(partition) : -1,
                           .offset = offset,
                           .model = w->served.n > 0 ? w->served.names[0] : NULL};
    return o;
}

/* Copy a message to the dead-letter topic with headers that say why. A
 * copy the DLQ cannot take would stop the worker and then every restart
 * (the offset is never stored): the payload is cut to max_dlq_bytes and
 * kgen-payload-truncated-from says how long it was. */
static void dead_letter(kg_worker_t *w, const dlq_copy_t *c, ack_t *ack) {
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    size_t len = c->len;
    if (len > w->out.max_dlq_bytes) {
        char orig[24];
        len = w->out.max_dlq_bytes;
        snprintf(orig, sizeof(orig), "%zu", c->len);
        rd_kafka_header_add(h, "kgen-payload-truncated-from", -1, orig, -1);
    }
    char part[16], off[24];
    snprintf(part, sizeof(part), "%d", c->partition >= 0 ? part_of(c->partition) : -1);
    snprintf(off, sizeof(off), "%lld", (long long)c->offset);
    rd_kafka_header_add(h, "kgen-error-reason", -1, c->reason, -1);
    rd_kafka_header_add(h, "kgen-error-message", -1, c->message, -1);
    int lane = c->partition >= 0 ? lane_of(c->partition) : 0;
    rd_kafka_header_add(h, "kgen-source-topic", -1, w->lanes.lane[lane].topic, -1);
    rd_kafka_header_add(h, "kgen-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "kgen-source-offset", -1, off, -1);
    rd_kafka_header_add(h, "kgen-worker-id", -1, w->worker_id, -1);
    rd_kafka_header_add(h, "kgen-payload", -1, c->payload_kind, -1);
    produce(w, w->out.dlq_topic[lane], c->key, c->key_len, c->payload, len, ack, h);
    rd_kafka_headers_destroy(h);
}

/* An unparseable job's DLQ copy was refused (the DLQ takes less than we
 * were told, or the job's key alone is too big): send the headers alone,
 * which still say where the job is, with the key cut to DLQ_KEY_MAX bytes
 * (kgen-key-truncated-from says how long it was), so that this copy fits. */
static void dead_letter_bare(kg_worker_t *w,
                             const void *key,
                             size_t key_len,
                             size_t len,
                             const rd_kafka_headers_t *hdrs,
                             const ack_t *ack) {
    ack_t *again = ack_new(ack->partition, ack->offset, ACK_DLQ);
    rd_kafka_headers_t *h = hdrs ? rd_kafka_headers_copy(hdrs) : rd_kafka_headers_new(2);
    char orig[24];
    snprintf(orig, sizeof(orig), "%zu", len);
    rd_kafka_header_remove(h, "kgen-payload-truncated-from");
    rd_kafka_header_add(h, "kgen-payload-truncated-from", -1, orig, -1);
    if (key_len > DLQ_KEY_MAX) {
        snprintf(orig, sizeof(orig), "%zu", key_len);
        rd_kafka_header_remove(h, "kgen-key-truncated-from");
        rd_kafka_header_add(h, "kgen-key-truncated-from", -1, orig, -1);
        key_len = DLQ_KEY_MAX;
    }
    produce(w, w->out.dlq_topic[ack->partition >= 0 ? lane_of(ack->partition) : 0], key, key_len,
            "", 0, again, h);
    rd_kafka_headers_destroy(h);
}

/* The broker (or the producer) refused this one message for its own sake
 * (is_message_fault). The job gets an answer and the worker goes on:
 *   a terminal event  -> a copy to the DLQ, and a small `internal` error
 *                        event in its place (its delivery stores the offset);
 *   a token event     -> a copy to the DLQ (the done event has the text);
 *   a DLQ copy of a job -> the headers alone;
 * a DLQ copy of an event is dropped with a log line. Only when even the
 * small error event or an empty DLQ message is refused is the topic at
 * fault: that stays fatal. */
static void on_refused(kg_worker_t *w,
                       const char *topic,
                       const void *key,
                       size_t key_len,
                       const void *value,
                       size_t len,
                       const rd_kafka_headers_t *hdrs,
                       const ack_t *ack,
                       rd_kafka_resp_err_t err) {
    char rid[KG_JOB_REQUEST_ID_MAX + 1];
    snprintf(rid, sizeof(rid), "%.*s", (int)(key_len < sizeof(rid) ? key_len : sizeof(rid) - 1),
             key ? (const char *)key : "");
    atomic_fetch_add(&w->m.events_refused, 1);
    bool to_dlq = false;
    for (int l = 0; l < w->lanes.n; l++) {
        to_dlq |= strcmp(topic, w->out.dlq_topic[l]) == 0;
    }
    KG_LOG_WARN("worker",
                "the broker refused one message for its own sake topic=%s bytes=%zu "
                "error=\"%s\" request_id=%s",
                topic, len, rd_kafka_err2str(err), rid);
    if (ack && ack->kind == ACK_DLQ && len > 0) {
        dead_letter_bare(w, key, key_len, len, hdrs, ack);
        return;
    }
    if ((ack && ack->kind != ACK_RESULT) || (!ack && to_dlq)) {
        if (ack) {
            fatal_kafka(w, "the topic refuses even a small message");
        }
        return; /* a DLQ copy of an event: the job was answered otherwise */
    }
    /* a token or terminal event of the results topic */
    int32_t part = ack ? ack->partition : -1;
    int64_t off = ack ? ack->offset : -1;
    char msg[256];
    snprintf(msg, sizeof(msg), "the broker refused this %s event: %s", ack ? "terminal" : "token",
             rd_kafka_err2str(err));
    dlq_copy_t c = {.key = key,
                    .key_len = key_len,
                    .payload = value,
                    .len = len,
                    .payload_kind = "event",
                    .reason = "undeliverable",
                    .message = msg,
                    .partition = part,
                    .offset = off};
    dead_letter(w, &c, NULL);
    if (!ack) {
        return;
    }
    KG_LOG_WARN("worker",
                "job result not delivered, answered with an internal error request_id=%s "
                "topic=%s partition=%d offset=%lld",
                rid, topic_of(w, part), part_of(part), (long long)off);
    kg_event_origin_t o = origin(w, part, off);
    snprintf(msg, sizeof(msg),
             "the job's %s event (%zu bytes) could not be delivered: %s; a copy is on the "
             "dead-letter topic",
             ack->is_error ? "error" : "done", len, rd_kafka_err2str(err));
    size_t elen;
    char *json =
        kg_events_error(&o, rid, KG_ERROR_INTERNAL, msg, NULL, w->out.max_event_bytes, &elen, NULL);
    if (!json) {
        fatal(w, "out of memory encoding an error event");
        return;
    }
    produce(w, w->cfg->results_topic, key, key_len, json, elen, ack_new(part, off, ACK_ANSWER),
            NULL);
    free(json);
}

/* An error event for a job that never reached the engine (invalid, or
 * refused at intake); its delivery stores the offset. */
static void produce_error(kg_worker_t *w,
                          const char *request_id,
                          int32_t partition,
                          int64_t offset,
                          kg_error_code_t code,
                          const char *message,
                          const char *metadata_json) {
    kg_event_origin_t o = origin(w, partition, offset);
    size_t len;
    char *json = kg_events_error(&o, request_id, code, message, metadata_json,
                                 w->out.max_event_bytes, &len, NULL);
    if (!json) {
        fatal(w, "out of memory encoding an error event");
        return;
    }
    ack_t *ack = ack_new(partition, offset, ACK_RESULT);
    if (ack) {
        ack->is_error = true;
        ack->code = code;
    }
    job_answered(w, partition, offset);
    produce(w, w->cfg->results_topic, request_id, strlen(request_id), json, len, ack, NULL);
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
        char *json = kg_jobrun_token_event(&r->run, js, i, &o, w->model->tok,
                                           w->out.max_event_bytes, &len, NULL);
        if (!json) {
            fatal(w, "out of memory encoding a token event");
            return;
        }
        produce_now(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len,
                    NULL, NULL);
        free(json);
    }
}

static void log_shed(const kg_job_t *job, const kg_events_fit_t *fit, size_t budget) {
    if (fit->logprobs_dropped || fit->metadata_dropped || fit->text_bytes_cut > 0) {
        KG_LOG_WARN("worker",
                    "terminal event over the %zu-byte budget request_id=%s logprobs_dropped=%d "
                    "metadata_dropped=%d text_bytes_cut=%zu",
                    budget, job->request_id, fit->logprobs_dropped, fit->metadata_dropped,
                    fit->text_bytes_cut);
    }
}

/* The terminal event of a finished job (or of one the engine refused),
 * fitted to the event budget, with its latency metrics; the delivery
 * report logs it and stores its offset. */
static void produce_terminal(kg_worker_t *w, job_rec_t *r, kg_status_t refused, int64_t now_us) {
    const kg_job_t *job = r->run.job;
    kg_event_origin_t o = origin(w, job->partition, job->offset);
    kg_jobrun_outcome_t oc;
    size_t len;
    char *json =
        refused != KG_OK
            ? kg_jobrun_refused(&r->run, &o, refused, w->out.max_event_bytes, &len, &oc)
            : kg_jobrun_terminal(&r->run, &o, w->model->tok, w->out.max_event_bytes, &len, &oc);
    ack_t *ack = ack_new(job->partition, job->offset, ACK_RESULT);
    if (!json || !ack) {
        free(json);
        free(ack);
        fatal(w, "out of memory encoding a terminal event");
        return;
    }
    log_shed(job, &oc.fit, w->out.max_event_bytes);
    ack->is_error = oc.is_error;
    ack->code = oc.code;
    ack->reason = oc.reason;
    if (!oc.is_error) {
        const kg_job_timing_t *t = &r->run.t;
        int32_t n_gen = kg_jobrun_n_generated(&r->run);
        int64_t first = t->first_token_us ? t->first_token_us : now_us;
        kg_histogram_observe(&w->m.ttft, first - t->taken_us);
        kg_histogram_observe(&w->m.e2e, now_us - t->taken_us);
        if (n_gen > 1) {
            kg_histogram_observe(&w->m.tpot, (now_us - first) / (n_gen - 1));
        }
        kg_drain_observe_job(&w->m.drain,
                             now_us - (t->submitted_us ? t->submitted_us : t->taken_us));
        atomic_fetch_add(&w->m.prompt_tokens, r->run.prep.n_tokens);
        atomic_fetch_add(&w->m.generated_tokens, n_gen);
        ack->n_gen = n_gen;
        ack->total_ms = (double)(now_us - t->taken_us) / 1e3;
    }
    job_answered(w, job->partition, job->offset);
    produce(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len, ack,
            NULL);
    free(json);
}

// ---- the lanes' queues of prepared jobs (kg_lanes) ----

/* Queue a prepared record in its lane: after those of its priority or
 * higher (the job's priority orders jobs within a lane), or at the very
 * front (a job the engine handed back). */
static void pending_push(kg_worker_t *w, job_rec_t *r, bool front) {
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
static void pending_unlink(kg_worker_t *w, job_rec_t *r) {
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
 * it (max_batch_size running + ENGINE_SLACK waiting) and from the lane the
 * weighted fair choice names. NULL when none may go now. */
static job_rec_t *pending_next(kg_worker_t *w) {
    int lane = 0;
    if (w->lanes.n == 1) {
        int32_t cap = (int32_t)(w->cfg->max_batch_size + w->cfg->max_queue_depth);
        if (!w->jobs.q[0].head || w->jobs.n_inflight - w->jobs.n_pending >= cap) {
            return NULL;
        }
    } else {
        bool has_work[KG_LANES_MAX];
        for (int l = 0; l < w->lanes.n; l++) {
            has_work[l] = w->jobs.q[l].head != NULL;
        }
        if (w->jobs.n_in_engine >= w->cfg->max_batch_size + ENGINE_SLACK ||
            (lane = kg_lanes_pick(&w->lanes, has_work)) < 0) {
            return NULL;
        }
    }
    job_rec_t *r = w->jobs.q[lane].head;
    if (w->jobs.n_engine_seqs + r->run.n_choices > w->jobs.n_engine_recs) {
        return NULL; /* its n choices need that many engine records: wait for them */
    }
    pending_unlink(w, r);
    return r;
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
        w->jobs.n_in_engine--;
        w->jobs.n_engine_seqs -= r->run.n_choices;
        pending_push(w, r, true);
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
        if (r->run.cancelled) {
            KG_LOG_INFO("worker",
                        "job cancelled request_id=%s topic=%s partition=%d offset=%lld tokens=%d "
                        "steps_after_cancel=%lld",
                        r->run.job->request_id, topic_of(w, r->run.job->partition),
                        part_of(r->run.job->partition), (long long)r->run.job->offset,
                        kg_jobrun_n_generated(&r->run), (long long)(re->step - r->cancel_step));
        }
        produce_terminal(w, r, KG_OK, re->ts_us);
        rec_free(w, r);
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
            r->cancel_step = kg_runner_steps(w->runner);
            KG_LOG_INFO("worker",
                        "cancel received request_id=%s topic=%s partition=%d offset=%lld state=%s",
                        rid, topic_of(w, r->run.job->partition), part_of(r->run.job->partition),
                        (long long)r->run.job->offset,
                        r->state == REC_PENDING        ? "pending"
                        : r->run.t.first_token_us == 0 ? "waiting"
                                                       : "running");
            if (r->state == REC_PENDING) {
                pending_unlink(w, r);
                kg_jobrun_end_cancelled(&r->run, kg_clock_us());
                KG_LOG_INFO(
                    "worker",
                    "job cancelled request_id=%s topic=%s partition=%d offset=%lld tokens=0 "
                    "steps_after_cancel=0",
                    rid, topic_of(w, r->run.job->partition), part_of(r->run.job->partition),
                    (long long)r->run.job->offset);
                produce_terminal(w, r, KG_OK, kg_clock_us());
                rec_free(w, r);
            } else if (kg_runner_cancel(w->runner, r->id) != KG_OK) {
                fatal(w, "engine command queue stuck");
            }
        }
    }
}

static void poll_cancels(kg_worker_t *w) {
    char rids[32][KG_JOB_REQUEST_ID_MAX + 1];
    int n = kg_cancel_poll(w->jobs.cancel, rids, 32);
    for (int i = 0; i < n && !w->life.fatal; i++) {
        apply_cancel(w, rids[i]);
    }
}

// ---- intake ----

static void submit_pending(kg_worker_t *w) {
    job_rec_t *r;
    while (!w->life.fatal && (r = pending_next(w)) != NULL) {
        kg_request_t req = kg_jobrun_request(&r->run, r->id);
        kg_status_t st = kg_runner_submit(w->runner, &req);
        if (st == KG_QUEUE_FULL) {
            pending_push(w, r, true);
            return;
        }
        if (st != KG_OK) {
            pending_push(w, r, true);
            fatal(w, "out of memory submitting a job");
            return;
        }
        w->jobs.n_in_engine++;
        r->state = REC_SUBMITTED;
        w->jobs.n_engine_seqs += r->run.n_choices;
        kg_jobrun_submitted(&r->run, kg_clock_us());
    }
}

/* An unparseable job: its DLQ copy is its answer (the delivery stores the offset). */
static void dead_letter_job(kg_worker_t *w, const job_msg_t *m, const kg_codec_error_t *err) {
    dlq_copy_t c = {.key = m->key,
                    .key_len = m->key_len,
                    .payload = m->payload,
                    .len = m->len,
                    .payload_kind = "job",
                    .reason = kg_codec_dlq_reason_str(err->reason),
                    .message = err->message,
                    .partition = m->partition,
                    .offset = m->offset};
    atomic_fetch_add(&w->m.jobs_dlq, 1);
    KG_LOG_WARN("worker", "dead-lettered topic=%s partition=%d offset=%lld reason=%s",
                topic_of(w, m->partition), part_of(m->partition), (long long)m->offset, c.reason);
    job_answered(w, m->partition, m->offset);
    dead_letter(w, &c, ack_new(m->partition, m->offset, ACK_DLQ));
}

/* The kgen-format header of a message: what its payload is (an OpenAI shape
 * or a kgen job); AUTO, recognised from the fields, when it has none or an
 * unknown one (which is logged). */
static kg_job_format_t message_format(const rd_kafka_message_t *rkm) {
    kg_job_format_t f = KG_JOB_FORMAT_AUTO;
    rd_kafka_headers_t *hdrs = NULL;
    const void *v = NULL;
    size_t n = 0;
    if (rd_kafka_message_headers(rkm, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, "kgen-format", &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR && v &&
        !kg_codec_job_format_parse(v, n, &f)) {
        KG_LOG_WARN("worker", "unknown kgen-format header (%.*s) partition=%d offset=%lld",
                    (int)(n < 32 ? n : 32), (const char *)v, rkm->partition,
                    (long long)rkm->offset);
        f = KG_JOB_FORMAT_AUTO;
    }
    return f;
}

/* Decode a job; one that does not decode is answered (DLQ or invalid_job)
 * and NULL returned. */
static kg_job_t *decode_or_answer(kg_worker_t *w, const job_msg_t *m) {
    kg_job_t *job = NULL;
    kg_codec_error_t cerr;
    kg_codec_opts_t copts = w->intake.codec_opts;
    copts.key = m->key; /* the request_id of a bare OpenAI body */
    copts.key_len = m->key_len;
    copts.format = m->format;
    kg_status_t st =
        kg_codec_decode_job_opts(m->payload ? m->payload : "", m->len, &copts, &job, &cerr);
    if (st == KG_ERR_NOMEM) {
        fatal(w, "out of memory decoding a job");
    } else if (st != KG_OK && cerr.kind == KG_CODEC_DLQ) {
        dead_letter_job(w, m, &cerr);
    } else if (st != KG_OK) {
        produce_error(w, cerr.request_id, m->partition, m->offset, KG_ERROR_INVALID_JOB,
                      cerr.message, NULL);
    }
    if (job) {
        job->partition = m->partition;
        job->offset = m->offset;
    }
    return job;
}

/* TEST-ONLY fault injection: with KGEN_TEST_CRASH_ON_REQUEST_ID set (read
 * at startup, announced with a warning), the worker abort()s when it starts
 * that job, so the poison-job journal can be tested with a real crash
 * (tests/integration/test_worker_poison.sh). Never set it in production. */
static void crash_if_test_target(const kg_worker_t *w, const kg_job_t *job) {
    if (w->intake.crash_request_id && strcmp(job->request_id, w->intake.crash_request_id) == 0) {
        KG_LOG_ERROR("worker",
                     "TEST-ONLY fault injection: abort() request_id=%s topic=%s partition=%d "
                     "offset=%lld",
                     job->request_id, topic_of(w, job->partition), part_of(job->partition),
                     (long long)job->offset);
        abort();
    }
}

/* Start a job: decode, prepare (tokenize, check the limits) and queue it
 * for the engine; a job that cannot run is answered at once. */
static void start_message(kg_worker_t *w, const job_msg_t *m) {
    kg_job_t *job = decode_or_answer(w, m);
    if (!job) {
        return;
    }
    crash_if_test_target(w, job);
    job_rec_t *r = calloc(1, sizeof(*r));
    if (!r) {
        kg_job_free(job);
        fatal(w, "out of memory");
        return;
    }
    r->id = w->jobs.next_id++;
    kg_error_code_t code;
    char msg[256];
    kg_status_t st = kg_jobrun_start(&r->run, w->model, &w->intake.limits, job, kg_clock_epoch_ms(),
                                     m->taken_us, &code, msg, sizeof(msg));
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
    if (kg_cancel_is_cancelled(w->jobs.cancel, job->request_id) && kg_jobrun_cancel(&r->run)) {
        /* cancelled before it arrived (or before this attempt): answered, not run */
        kg_jobrun_end_cancelled(&r->run, kg_clock_us());
        KG_LOG_INFO("worker",
                    "job cancelled request_id=%s topic=%s partition=%d offset=%lld tokens=0 "
                    "steps_after_cancel=0 on_arrival=1",
                    job->request_id, topic_of(w, job->partition), part_of(job->partition),
                    (long long)job->offset);
        produce_terminal(w, r, KG_OK, kg_clock_us());
        kg_jobrun_clear(&r->run);
        free(r);
        return;
    }
    rec_insert(w, r);
    pending_push(w, r, false);
    submit_pending(w);
}

// ---- poison jobs: held messages and suspects (see kg_journal.h) ----

static void update_inflight_gauge(kg_worker_t *w) {
    atomic_store(&w->m.inflight, w->jobs.n_inflight + w->intake.n_held);
}

static held_msg_t *held_new(const job_msg_t *m, int strikes) {
    held_msg_t *h = calloc(1, sizeof(*h));
    void *key = malloc(m->key_len ? m->key_len : 1);
    void *payload = malloc(m->len ? m->len : 1);
    if (!h || !key || !payload) {
        free(h);
        free(key);
        free(payload);
        return NULL;
    }
    if (m->key_len) {
        memcpy(key, m->key, m->key_len);
    }
    if (m->len) {
        memcpy(payload, m->payload, m->len);
    }
    h->m = *m;
    h->m.key = m->key ? key : NULL;
    h->m.payload = m->payload ? payload : NULL;
    h->strikes = strikes;
    if (!m->key) {
        free(key);
    }
    if (!m->payload) {
        free(payload);
    }
    return h;
}

static void held_free(held_msg_t *h) {
    free((void *)h->m.key);
    free((void *)h->m.payload);
    free(h);
}

static void held_push(held_msg_t **head, held_msg_t **tail, held_msg_t *h) {
    h->next = NULL;
    if (*tail) {
        (*tail)->next = h;
    } else {
        *head = h;
    }
    *tail = h;
}

/* Hold a journaled message: a job with no strike starts once its snapshot
 * is acknowledged; a suspect waits for its turn. */
static void hold_message(kg_worker_t *w, const job_msg_t *m, int strikes) {
    held_msg_t *h = held_new(m, strikes);
    if (!h) {
        fatal(w, "out of memory holding a job");
        return;
    }
    w->intake.n_held++;
    update_inflight_gauge(w);
    if (strikes == 0) {
        h->ticket = kg_journal_start(w->intake.journal[lane_of(m->partition)],
                                     part_of(m->partition), m->offset, 0);
        held_push(&w->intake.held_head, &w->intake.held_tail, h);
        return;
    }
    KG_LOG_WARN("worker",
                "suspect job: it was running when a worker failed, so it runs alone among "
                "suspects topic=%s partition=%d offset=%lld strikes=%d",
                topic_of(w, m->partition), part_of(m->partition), (long long)m->offset, strikes);
    held_push(&w->intake.suspects_head, &w->intake.suspects_tail, h);
    atomic_store(&w->m.suspects, 1);
}

/* At most one suspect runs at a time: when a worker then fails, it is the
 * only job present in two failures in a row (kg_journal.h). */
static void start_next_suspect(kg_worker_t *w) {
    held_msg_t *h = w->intake.suspects_head;
    if (w->intake.suspect_busy || !h || w->life.draining) {
        return;
    }
    w->intake.suspects_head = h->next;
    if (!w->intake.suspects_head) {
        w->intake.suspects_tail = NULL;
    }
    w->intake.suspect_busy = true;
    w->intake.suspect_partition = h->m.partition;
    w->intake.suspect_offset = h->m.offset;
    h->ticket = kg_journal_start(w->intake.journal[lane_of(h->m.partition)],
                                 part_of(h->m.partition), h->m.offset, h->strikes);
    held_push(&w->intake.held_head, &w->intake.held_tail, h);
}

/* Start every held job whose snapshot the broker has acknowledged. */
static void release_held(kg_worker_t *w) {
    held_msg_t *prev = NULL;
    for (held_msg_t *h = w->intake.held_head, *next; h && !w->life.fatal; h = next) {
        next = h->next;
        if (!kg_journal_durable(w->intake.journal[lane_of(h->m.partition)], part_of(h->m.partition),
                                h->ticket)) {
            prev = h;
            continue;
        }
        if (prev) {
            prev->next = next;
        } else {
            w->intake.held_head = next;
        }
        if (w->intake.held_tail == h) {
            w->intake.held_tail = prev;
        }
        w->intake.n_held--;
        start_message(w, &h->m);
        held_free(h);
    }
    update_inflight_gauge(w);
}

/* Give back (uncommitted) the held messages of the listed partitions (NULL: all). */
static void drop_held_list(kg_worker_t *w,
                           held_msg_t **head,
                           held_msg_t **tail,
                           const rd_kafka_topic_partition_list_t *parts) {
    held_msg_t *prev = NULL;
    for (held_msg_t *h = *head, *next; h; h = next) {
        next = h->next;
        if (!in_parts(w, parts, h->m.partition)) {
            prev = h;
            continue;
        }
        if (prev) {
            prev->next = next;
        } else {
            *head = next;
        }
        if (*tail == h) {
            *tail = prev;
        }
        w->intake.n_held--;
        job_given_back(w, h->m.partition, h->m.offset);
        held_free(h);
    }
}

static void drop_held(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts) {
    drop_held_list(w, &w->intake.held_head, &w->intake.held_tail, parts);
    drop_held_list(w, &w->intake.suspects_head, &w->intake.suspects_tail, parts);
    update_inflight_gauge(w);
    atomic_store(&w->m.suspects, w->intake.suspect_busy || w->intake.suspects_head);
}

/* A job present in poison_after consecutive worker failures: not run again.
 * It is answered with an `internal` error event and copied to the DLQ. */
static void answer_poisoned(kg_worker_t *w, const job_msg_t *m, int strikes) {
    kg_job_t *job = decode_or_answer(w, m); /* the codec is fuzzed; the engine is what crashes */
    if (!job) {
        return;
    }
    char msg[256];
    snprintf(msg, sizeof(msg),
             "poisoned after %d attempts: the job was running each time a worker failed (a "
             "crash, a kill or a device fault), so it is not run again; a copy is on the "
             "dead-letter topic",
             strikes);
    dlq_copy_t c = {.key = m->key,
                    .key_len = m->key_len,
                    .payload = m->payload,
                    .len = m->len,
                    .payload_kind = "job",
                    .reason = "poisoned",
                    .message = msg,
                    .partition = m->partition,
                    .offset = m->offset};
    atomic_fetch_add(&w->m.jobs_poisoned, 1);
    KG_LOG_ERROR("worker",
                 "job poisoned, not run again request_id=%s topic=%s partition=%d offset=%lld "
                 "strikes=%d",
                 job->request_id, topic_of(w, m->partition), part_of(m->partition),
                 (long long)m->offset, strikes);
    dead_letter(w, &c, NULL);
    produce_error(w, job->request_id, m->partition, m->offset, KG_ERROR_INTERNAL, msg,
                  job->metadata_json);
    kg_job_free(job);
}

static void on_message(kg_worker_t *w, rd_kafka_message_t *rkm) {
    atomic_fetch_add(&w->m.messages_consumed, 1);
    const char *topic = rd_kafka_topic_name(rkm->rkt);
    int lane = kg_lanes_find(&w->lanes, topic);
    if (lane < 0 || rkm->partition < 0 || rkm->partition >= LANE_STRIDE) {
        KG_LOG_ERROR("worker",
                     "a message of a topic or partition not read here topic=%s "
                     "partition=%d offset=%lld",
                     topic, rkm->partition, (long long)rkm->offset);
        return;
    }
    int32_t dense = dense_of(lane, rkm->partition);
    kg_status_t st = kg_offsets_track(w->parts.offsets, dense, rkm->offset);
    if (st != KG_OK) {
        /* cannot happen while we pause at the in-flight cap; never drop a job silently */
        KG_LOG_ERROR("worker", "cannot track topic=%s partition=%d offset=%lld: %s; seeking back",
                     topic, rkm->partition, (long long)rkm->offset, kg_status_str(st));
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, topic, rkm->partition)->offset = rkm->offset;
        rd_kafka_error_t *e = rd_kafka_seek_partitions(w->parts.consumer, l, 1000);
        if (e) {
            rd_kafka_error_destroy(e);
        }
        rd_kafka_topic_partition_list_destroy(l);
        return;
    }
    job_msg_t m = {.partition = dense,
                   .offset = rkm->offset,
                   .key = rkm->key,
                   .key_len = rkm->key_len,
                   .payload = rkm->payload,
                   .len = rkm->len,
                   .taken_us = kg_clock_us(),
                   .format = message_format(rkm)};
    int strikes = kg_journal_strikes(w->intake.journal[lane], rkm->partition, m.offset);
    if (strikes < 0) {
        start_message(w, &m); /* not journaled */
    } else if (strikes >= w->cfg->poison_after) {
        answer_poisoned(w, &m, strikes);
    } else {
        hold_message(w, &m, strikes);
    }
}

static bool commit_txn(kg_worker_t *w, bool force);

// ---- partitions: pause, resume, rebalance ----

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
static void check_backpressure(kg_worker_t *w) {
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

/* Cancel quietly every job of the listed partitions (NULL: all), or only
 * those that have not streamed a token yet. */
static void
abandon_jobs(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts, bool unstarted_only) {
    for (size_t i = 0; i < w->jobs.table_size; i++) {
        for (job_rec_t *r = w->jobs.table[i], *next; r; r = next) {
            next = r->hnext;
            if (!in_parts(w, parts, r->run.job->partition) || r->state == REC_REVOKED ||
                (unstarted_only && r->run.t.first_token_us != 0)) {
                continue;
            }
            if (r->state == REC_PENDING) {
                /* never reached the engine: unlink from the FIFO and drop */
                pending_unlink(w, r);
                atomic_fetch_add(&w->m.jobs_cancelled, 1);
                job_given_back(w, r->run.job->partition, r->run.job->offset);
                rec_free(w, r);
                continue;
            }
            r->state = REC_REVOKED;
            atomic_fetch_add(&w->m.jobs_cancelled, 1);
            job_given_back(w, r->run.job->partition, r->run.job->offset);
            if (kg_runner_cancel(w->runner, r->id) != KG_OK) {
                fatal(w, "engine command queue stuck");
            }
        }
    }
}

/* --exactly-once: the committed offsets of newly assigned partitions, read
 * here and assigned explicitly. librdkafka 2.0.2 falls back to
 * auto.offset.reset when its own fetch fails (a coordinator still loading
 * after a broker restart), which would run every job of the partition again
 * and show its results twice; so fetch until every partition has an answer
 * (pending transactions of a dead worker answer UNSTABLE_OFFSET_COMMIT until
 * the broker aborts them). Partitions with no committed offset start at the
 * beginning (auto.offset.reset=earliest). */
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
            }
            rd_kafka_topic_partition_list_destroy(c);
            return;
        }
        rd_kafka_topic_partition_list_destroy(c);
        KG_LOG_WARN("worker", "reading the committed offsets: %s; trying again attempt=%d",
                    rd_kafka_err2str(err), attempt);
        if (atomic_load(&w->life.stop_requested) || attempt >= 120) {
            fatal_kafka(w, "cannot read the committed offsets of the assigned partitions");
            return;
        }
        usleep(500 * 1000);
    }
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque) {
    kg_worker_t *w = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
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
                fatal(w, "cannot track an assigned partition");
            }
        }
        if (w->out.txn) {
            fetch_committed(w, rk, parts);
        }
        rd_kafka_assign(rk, parts);
        if (w->parts.assigned) {
            rd_kafka_topic_partition_list_destroy(w->parts.assigned);
        }
        w->parts.assigned = rd_kafka_topic_partition_list_copy(parts);
        atomic_store(&w->m.assigned_partitions, parts->cnt);
        atomic_store(&w->m.ready, 1);
        KG_LOG_INFO("worker", "partitions assigned count=%d", parts->cnt);
        /* Say the state of every new partition explicitly: librdkafka keeps a
         * partition's pause flag across unassign and a later assign, so one
         * paused under an earlier assignment (and since "resumed" while it was
         * not assigned, which reached no partition) would never fetch again
         * (librdkafka #1849, #5591; seen after a broker restart). */
        for (int l = 0; l < w->lanes.n; l++) {
            set_lane_paused(w, l, w->parts.lane_paused[l]);
        }
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        KG_LOG_INFO("worker", "partitions revoked count=%d inflight=%d", parts->cnt,
                    w->jobs.n_inflight);
        /* let acks of finished jobs land and their offsets be committed first */
        rd_kafka_flush(w->out.producer, 10000);
        rd_kafka_poll(w->out.producer, 0);
        if (!w->life.fatal && !w->out.txn) {
            rd_kafka_commit(rk, NULL, 0);
        }
        if (w->out.txn) {
            if (!w->life.fatal) {
                (void)commit_txn(w, true);
            }
            /* what did not commit (the transaction failed, or answers waiting for an
             * earlier job of their partition) was never visible: the jobs run again on the
             * new owner */
            for (int l = 0; l < w->lanes.n; l++) {
                kg_txn_drop(w->out.txn, w->lanes.lane[l].topic, parts);
            }
        }
        abandon_jobs(w, parts, false);
        drop_held(w, parts);
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
        rd_kafka_assign(rk, NULL);
        if (w->parts.assigned) {
            rd_kafka_topic_partition_list_destroy(w->parts.assigned);
            w->parts.assigned = NULL;
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
        fatal_kafka(w, what);
        return;
    }
    /* informational: librdkafka retries by itself (a broker that went away) */
    KG_LOG_WARN("rdkafka", "%s client=%s error=%s", reason, rd_kafka_name(rk),
                rd_kafka_err2name((rd_kafka_resp_err_t)err));
}

static void update_lag(kg_worker_t *w) {
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
                /* --exactly-once: only transactions move the offsets */
                {"enable.auto.commit", cfg->exactly_once ? "false" : "true"},
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

/* The producer. `topic_max` (0 = unknown) is the smallest max.message.bytes
 * of the topics it writes: a batch of small events must not outgrow it
 * either, so batch.size (librdkafka's default is 1,000,000) is cut to it
 * unless -X sets batch.size. */
static rd_kafka_conf_t *
producer_conf(kg_worker_t *w, int64_t topic_max, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = kg_kafka_conf_new(w->cfg, errstr, errstr_size);
    if (!conf) {
        return NULL;
    }
    /* One Produce request in flight per broker: with 2 to 5, a retriable error on one
     * request answers the ones behind it OUT_OF_ORDER_SEQUENCE, and librdkafka (2.0.2,
     * still open upstream: confluentinc/librdkafka#4953) bumps the producer epoch and
     * sends them again, which can put a job's token events out of order or twice
     * (check_worker_mock's test_request_errors saw it). Requests still carry every
     * event lingered for them, so throughput stays (README, Kafka path). */
    if (kg_kafka_conf_set(conf, "enable.idempotence", "true", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "max.in.flight.requests.per.connection", "1", errstr,
                          errstr_size) ||
        kg_kafka_conf_set(conf, "acks", "all", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "linger.ms", "5", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "client.id", w->worker_id, errstr, errstr_size)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    char buf[32];
    size_t bl = sizeof(buf);
    if (topic_max > RECORD_OVERHEAD &&
        rd_kafka_conf_get(conf, "batch.size", buf, &bl) == RD_KAFKA_CONF_OK &&
        atoll(buf) > topic_max - RECORD_OVERHEAD) {
        snprintf(buf, sizeof(buf), "%lld", (long long)(topic_max - RECORD_OVERHEAD));
        if (kg_kafka_conf_set(conf, "batch.size", buf, errstr, errstr_size)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    for (int i = 0; i < w->cfg->n_kafka_props; i++) {
        /* re-apply -X so they win over our defaults (linger.ms, ...) */
        if (kg_kafka_conf_set(conf, w->cfg->kafka_keys[i], w->cfg->kafka_values[i], errstr,
                              errstr_size)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    return conf;
}

static rd_kafka_t *
make_producer(kg_worker_t *w, int64_t topic_max, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = producer_conf(w, topic_max, errstr, errstr_size);
    if (!conf) {
        return NULL;
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

// ---- exactly-once (kg_txn) ----

/* An answer is visible: log and count it as a delivery report would. */
static void txn_committed(void *ctx, void *opaque, const void *key, size_t key_len) {
    kg_worker_t *w = ctx;
    if (opaque && !w->life.fatal) {
        log_answered(w, key, key_len, opaque);
    }
    free(opaque);
}

/* The broker refused an answer for its own sake: answered as on_refused does. */
static void txn_refused(void *ctx,
                        const char *topic,
                        const void *key,
                        size_t key_len,
                        const void *value,
                        size_t len,
                        const rd_kafka_headers_t *hdrs,
                        void *opaque,
                        rd_kafka_resp_err_t err) {
    on_refused(ctx, topic, key, key_len, value, len, hdrs, opaque, err);
    free(opaque);
}

static void txn_dropped(void *ctx, void *opaque) {
    (void)ctx;
    free(opaque);
}

/* The transactional producer (its batch.size cut like the other's). */
static kg_status_t
start_transactions(kg_worker_t *w, int64_t topic_max, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = producer_conf(w, topic_max > 0 ? topic_max : 0, errstr, errstr_size);
    if (!conf) {
        return KG_ERR_INVALID;
    }
    kg_txn_callbacks_t cb = {.ctx = w,
                             .committed = txn_committed,
                             .refused = txn_refused,
                             .dropped = txn_dropped,
                             .is_message_fault = is_message_fault};
    w->out.txn = kg_txn_new(w->cfg, conf, w->worker_id, &cb, errstr, errstr_size);
    return w->out.txn ? KG_OK : KG_ERR_KAFKA;
}

/* Commit the transaction when it is due (or now, with `force`); a fatal
 * transactional error stops the worker. */
static bool commit_txn(kg_worker_t *w, bool force) {
    if (!w->out.txn) {
        return true;
    }
    kg_status_t st =
        kg_txn_commit(w->out.txn, w->out.producer, w->parts.consumer, kg_clock_us(), force);
    if (st == KG_ERR_KAFKA) {
        fatal_kafka(w, "the transactional producer failed (fenced by a newer instance?)");
    }
    return st == KG_OK;
}

/* The bytes a message may take: the producer's message.max.bytes, and the
 * topic's max.message.bytes (read at startup) when that is smaller, or
 * --max-event-bytes. Makes the producer (its batch.size depends on it) and
 * sets max_event_bytes and max_dlq_bytes. */
static kg_status_t size_messages(kg_worker_t *w, char *errstr, size_t errstr_size) {
    const kg_config_t *cfg = w->cfg;
    int64_t topic_max[2] = {-1, -1}; /* results, DLQ */
    if (cfg->max_event_bytes == 0) {
        const char *topics[2] = {cfg->results_topic, w->out.dlq_topic[0]};
        char why[512];
        int n = strcmp(topics[0], topics[1]) == 0 ? 1 : 2;
        if (kg_topic_max_message_bytes(cfg, topics, n, TOPIC_LOOKUP_MS, topic_max, why,
                                       sizeof(why)) < n) {
            KG_LOG_WARN("worker",
                        "cannot read max.message.bytes of the results and DLQ topics, so events "
                        "are sized to the producer's message.max.bytes (set --max-event-bytes if "
                        "a topic takes less) error=\"%s\"",
                        why);
        }
        topic_max[1] = n == 1 ? topic_max[0] : topic_max[1];
    }
    int64_t smallest = topic_max[0] > 0 && (topic_max[1] <= 0 || topic_max[0] < topic_max[1])
                           ? topic_max[0]
                           : topic_max[1];
    w->out.producer = make_producer(w, smallest > 0 ? smallest : 0, errstr, errstr_size);
    if (!w->out.producer) {
        return KG_ERR_INVALID;
    }
    if (cfg->exactly_once && start_transactions(w, smallest, errstr, errstr_size) != KG_OK) {
        return KG_ERR_INVALID;
    }
    char buf[32];
    size_t bl = sizeof(buf);
    int64_t producer_max = 1000000;
    if (rd_kafka_conf_get(rd_kafka_conf(w->out.producer), "message.max.bytes", buf, &bl) ==
        RD_KAFKA_CONF_OK) {
        producer_max = atoll(buf);
    }
    int64_t results = topic_max[0] > 0 && topic_max[0] < producer_max ? topic_max[0] : producer_max;
    int64_t dlq = topic_max[1] > 0 && topic_max[1] < producer_max ? topic_max[1] : producer_max;
    if (cfg->max_event_bytes > 0) {
        /* a configured budget stands for the topics' limits we did not read */
        results = cfg->max_event_bytes + RECORD_OVERHEAD < results
                      ? cfg->max_event_bytes + RECORD_OVERHEAD
                      : results;
        dlq = results;
    }
    if (results < MIN_MESSAGE_BYTES || dlq < MIN_MESSAGE_BYTES) {
        snprintf(errstr, errstr_size,
                 "messages of at most %lld bytes (results) and %lld bytes (DLQ) are too small "
                 "for events; need %d (message.max.bytes, max.message.bytes)",
                 (long long)results, (long long)dlq, MIN_MESSAGE_BYTES);
        return KG_ERR_INVALID;
    }
    w->out.max_event_bytes = (size_t)(results - RECORD_OVERHEAD);
    w->out.max_dlq_bytes = (size_t)(dlq - RECORD_OVERHEAD - DLQ_HEADER_ROOM);
    KG_LOG_INFO(
        "worker",
        "event budget max_event_bytes=%zu max_dlq_bytes=%zu producer_message_max_bytes=%lld "
        "results_topic_max_message_bytes=%lld dlq_topic_max_message_bytes=%lld",
        w->out.max_event_bytes, w->out.max_dlq_bytes, (long long)producer_max,
        (long long)topic_max[0], (long long)topic_max[1]);
    return KG_OK;
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
    kg_drain_init(&w->m.drain);
    if (*cfg->worker_id) {
        snprintf(w->worker_id, sizeof(w->worker_id), "%s", cfg->worker_id);
    } else {
        char host[64] = "kgen";
        gethostname(host, sizeof(host) - 1);
        snprintf(w->worker_id, sizeof(w->worker_id), "%s-%d", host, (int)getpid());
    }
    if (kg_lanes_parse(cfg->jobs_topic, &w->lanes, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    if (w->lanes.n > 1 && *cfg->inflight_topic) {
        snprintf(errstr, errstr_size,
                 "--inflight-topic names one topic; with several jobs topics leave it empty "
                 "(each uses <topic>.inflight)");
        goto fail;
    }
    for (int l = 0; l < w->lanes.n; l++) {
        /* one DLQ for all (--dlq-topic), or <topic>.dlq for each */
        snprintf(w->out.dlq_topic[l], sizeof(w->out.dlq_topic[l]), "%s%s",
                 *cfg->dlq_topic ? cfg->dlq_topic : w->lanes.lane[l].topic,
                 *cfg->dlq_topic ? "" : ".dlq");
    }
    w->max_inflight = (int32_t)(cfg->max_batch_size + cfg->max_queue_depth);
    w->intake.codec_opts = kg_codec_opts_default();
    w->intake.codec_opts.max_message_size = (size_t)cfg->max_message_bytes;
    w->intake.codec_opts.default_max_tokens = cfg->default_max_tokens;

    if (kg_served_init(&w->served, cfg->served_model_name, model, cfg->model, errstr,
                       errstr_size) != KG_OK) {
        goto fail;
    }
    w->intake.limits.served = (const char *const *)w->served.names;
    w->intake.limits.n_served = w->served.n;
    {
        char names[512];
        kg_served_describe(&w->served, names, sizeof(names));
        KG_LOG_INFO("worker", "serving model names=\"%s\"", names);
    }

    /* engine: every job the worker lets in may wait inside the engine while
     * the running ones finish, so the engine's queue holds all of them;
     * constrained jobs compile here, on the kafka thread, once per schema */
    kg_stack_options_t so = kg_stack_options_default();
    so.backend = cfg->backend;
    so.engine.max_batch_size = cfg->max_batch_size;
    so.engine.max_queue_depth = cfg->max_batch_size + cfg->max_queue_depth;
    so.engine.max_batch_tokens = cfg->max_batch_tokens;
    so.engine.ctx = cfg->ctx;
    so.engine.kv_block_size = cfg->kv_block_size;
    so.engine.kv_memory_mib = cfg->kv_memory_mib;
    so.engine.prefix_cache = cfg->prefix_cache;
    so.engine.threads = cfg->threads;
    so.grammar_bytes = KG_GRAMMAR_CACHE_DEFAULT_BYTES;
    so.runner_inflight = w->max_inflight;
    w->stack = kg_stack_new(model, &so, errstr, errstr_size);
    if (!w->stack) {
        goto fail;
    }
    w->runner = kg_stack_runner(w->stack);
    const kg_engine_params_t *ep = kg_stack_params(w->stack);
    if (kg_stack_ctx_clamped(w->stack)) {
        KG_LOG_WARN("worker", "the KV pool holds %d tokens: the context is cut to that",
                    ep->max_seq_len);
    }
    w->intake.limits.max_seq_len = ep->max_seq_len;
    w->intake.limits.max_prompt_tokens = (int32_t)cfg->max_prompt_tokens;
    w->intake.limits.max_tokens_limit = (int32_t)cfg->max_tokens_limit;
    w->intake.limits.grammars = kg_stack_grammars(w->stack);
    w->intake.limits.max_choices =
        ep->max_batch_size < KG_JOB_MAX_N ? ep->max_batch_size : KG_JOB_MAX_N;
    w->jobs.n_engine_recs = ep->max_batch_size + ep->max_queue_depth;
    w->jobs.table_size = 1;
    while (w->jobs.table_size < (size_t)w->max_inflight * 2) {
        w->jobs.table_size <<= 1;
    }
    w->jobs.table = calloc(w->jobs.table_size, sizeof(*w->jobs.table));
    /* the fetch queue can hand us a few messages after a pause: room for them */
    w->parts.offsets = kg_offsets_new((size_t)w->max_inflight * 4 + 4096);
    if (!w->jobs.table || !w->parts.offsets) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    if (size_messages(w, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    w->intake.limits.max_event_bytes = w->out.max_event_bytes;
    if (cfg->poison_after > 0) {
        for (int l = 0; l < w->lanes.n; l++) {
            w->intake.journal[l] = kg_journal_new(cfg, w->lanes.lane[l].topic, cfg->inflight_topic,
                                                  w->worker_id, errstr, errstr_size);
            if (!w->intake.journal[l]) {
                goto fail;
            }
        }
    }
    char names[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX];
    int n_topics = kg_cancel_topic_names(cfg, &w->lanes, names);
    if (n_topics > 0) {
        const char *topics[KG_CANCEL_TOPICS_MAX];
        for (int l = 0; l < n_topics; l++) {
            topics[l] = names[l];
        }
        w->jobs.cancel =
            kg_cancel_new(cfg, topics, n_topics, w->worker_id, (int32_t)cfg->cancel_remember,
                          (int64_t)(cfg->cancel_ttl_s * 1000), errstr, errstr_size);
        if (!w->jobs.cancel) {
            goto fail;
        }
    }
    w->intake.crash_request_id = getenv("KGEN_TEST_CRASH_ON_REQUEST_ID");
    if (w->intake.crash_request_id && *w->intake.crash_request_id) {
        KG_LOG_WARN("worker",
                    "TEST-ONLY fault injection armed: this worker abort()s when it starts the "
                    "job request_id=%s (KGEN_TEST_CRASH_ON_REQUEST_ID; never in production)",
                    w->intake.crash_request_id);
    } else {
        w->intake.crash_request_id = NULL;
    }
    w->parts.consumer = make_consumer(w, errstr, errstr_size);
    if (!w->parts.consumer) {
        goto fail;
    }
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    for (int l = 0; l < w->lanes.n; l++) {
        rd_kafka_topic_partition_list_add(sub, w->lanes.lane[l].topic, RD_KAFKA_PARTITION_UA);
    }
    rd_kafka_resp_err_t err = rd_kafka_subscribe(w->parts.consumer, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (err) {
        snprintf(errstr, errstr_size, "subscribe to %s: %s", cfg->jobs_topic,
                 rd_kafka_err2str(err));
        goto fail;
    }
    KG_LOG_INFO("worker",
                "started worker_id=%s backend=%s jobs_topic=%s results_topic=%s "
                "max_batch_size=%d kv_blocks=%d",
                w->worker_id, kg_stack_backend_name(w->stack), cfg->jobs_topic, cfg->results_topic,
                ep->max_batch_size, ep->n_kv_blocks);
    return w;
fail:
    kg_worker_free(w);
    return NULL;
}

void kg_worker_stop(kg_worker_t *w) {
    atomic_store(&w->life.stop_requested, 1); /* lock-free: async-signal-safe */
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
    while (!w->life.fatal) {
        int64_t now = kg_clock_us();
        atomic_store(&w->m.last_loop_us, now);
        if (atomic_load(&w->life.stop_requested) && !w->life.draining) {
            w->life.draining = true;
            w->life.drain_deadline_us = now + (int64_t)(w->cfg->drain_timeout_s * 1e6);
            KG_LOG_INFO("worker", "stopping: draining inflight=%d timeout_s=%g", w->jobs.n_inflight,
                        w->cfg->drain_timeout_s);
            /* jobs not yet in the engine are given back (not committed) */
            for (int l = 0; l < w->lanes.n; l++) {
                for (job_rec_t *r = w->jobs.q[l].head; r; r = w->jobs.q[l].head) {
                    pending_unlink(w, r);
                    job_given_back(w, r->run.job->partition, r->run.job->offset);
                    rec_free(w, r);
                }
            }
            drop_held(w, NULL);
            /* so are jobs the engine has not started streaming (waiting for
             * a slot, or in their first prefill step): the drain is for the
             * running ones, and the next owner can start these at once */
            abandon_jobs(w, NULL, true);
        }
        if (w->life.draining) {
            if (w->jobs.n_inflight == 0 && w->intake.n_held == 0) {
                break;
            }
            if (now > w->life.drain_deadline_us) {
                KG_LOG_WARN("worker", "drain timeout: cancelling inflight=%d (not committed)",
                            w->jobs.n_inflight);
                abandon_jobs(w, NULL, false);
                w->life.drain_deadline_us = INT64_MAX;
            }
        }
        poll_cancels(w);
        check_backpressure(w);
        /* consumer: messages and rebalances; short timeout so completions flow */
        int n_taken = 0;
        rd_kafka_message_t *rkm;
        while (n_taken < POLL_BATCH && !w->life.fatal &&
               (rkm = rd_kafka_consumer_poll(
                    w->parts.consumer, n_taken == 0 && !w->intake.held_head ? 5 : 0)) != NULL) {
            n_taken++;
            if (rkm->err) {
                if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                    KG_LOG_WARN("worker", "consumer: %s", rd_kafka_message_errstr(rkm));
                }
            } else if (w->life.draining) {
                /* after the stop: not taken, not committed; the next owner runs it */
            } else {
                on_message(w, rkm);
            }
            rd_kafka_message_destroy(rkm);
            check_backpressure(w);
        }
        start_next_suspect(w);
        /* while jobs wait for their snapshot, wait here for its ack */
        for (int l = 0; l < w->lanes.n; l++) {
            kg_journal_poll(w->intake.journal[l], now, w->intake.held_head && l == 0 ? 2 : 0);
        }
        release_held(w);
        submit_pending(w);
        drain_engine_events(w, n_taken ? 0 : 2);
        rd_kafka_poll(w->out.producer, 0);
        commit_txn(w, false);
        update_lag(w);
        if (kg_runner_is_dead(w->runner)) {
            drain_engine_events(w, 0);
            fatal(w, "the backend failed");
        }
    }
    /* flush what was produced, store and commit offsets, leave the group */
    int rc = w->life.fatal ? 1 : 0;
    if (!w->life.fatal) {
        rd_kafka_flush(w->out.producer, 30000);
        rd_kafka_poll(w->out.producer, 0);
        if (rd_kafka_outq_len(w->out.producer) > 0) {
            KG_LOG_ERROR("worker", "%d events not delivered at shutdown",
                         rd_kafka_outq_len(w->out.producer));
            rc = 1;
        }
        if (w->out.txn) {
            for (int i = 0; i < 5 && !commit_txn(w, true) && !w->life.fatal; i++) {
                rd_kafka_poll(w->out.producer, 1000);
            }
            if (kg_txn_n_pending(w->out.txn) > 0) {
                KG_LOG_ERROR("worker", "%zu answers not committed at shutdown",
                             kg_txn_n_pending(w->out.txn));
                rc = 1;
            }
        } else {
            rd_kafka_commit(w->parts.consumer, NULL, 0);
        }
    }
    rd_kafka_consumer_close(w->parts.consumer);
    KG_LOG_INFO("worker", "stopped rc=%d", rc);
    return rc;
}

void kg_worker_free(kg_worker_t *w) {
    if (!w) {
        return;
    }
    if (w->stack) {
        kg_stack_stop(w->stack); /* stops the engine thread first */
    }
    if (w->jobs.table) {
        for (size_t i = 0; i < w->jobs.table_size; i++) {
            while (w->jobs.table[i]) {
                rec_free(w, w->jobs.table[i]);
            }
        }
    }
    if (w->parts.assigned) {
        rd_kafka_topic_partition_list_destroy(w->parts.assigned);
    }
    if (w->parts.consumer) {
        rd_kafka_destroy(w->parts.consumer);
    }
    kg_txn_free(w->out.txn);
    if (w->out.producer) {
        rd_kafka_purge(w->out.producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(w->out.producer, 0);
        rd_kafka_destroy(w->out.producer);
    }
    drop_held(w, NULL);
    kg_cancel_free(w->jobs.cancel);
    for (int l = 0; l < KG_LANES_MAX; l++) {
        kg_journal_free(w->intake.journal[l]);
    }
    kg_offsets_free(w->parts.offsets);
    free(w->jobs.table);
    kg_stack_free(w->stack); /* engine, backend, grammar cache */
    kg_served_clear(&w->served);
    free(w);
}

const kg_grammar_cache_t *kg_worker_grammar_cache(const kg_worker_t *w) {
    return kg_stack_grammars(w->stack);
}

const kg_worker_metrics_t *kg_worker_metrics(const kg_worker_t *w) {
    return &w->m;
}

const struct kg_runner_gauges *kg_worker_engine_gauges(const kg_worker_t *w) {
    return kg_runner_gauges(w->runner);
}

void kg_worker_backend_counters(const kg_worker_t *w, kg_backend_counters_t *out) {
    kg_stack_backend_counters(w->stack, out);
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
