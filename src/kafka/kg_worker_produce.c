/* kg_worker_produce: everything the worker sends, and what the broker says
 * back. Answers (terminal events, dead-letter copies) go through produce:
 * straight to the idempotent producer, whose delivery report (dr_msg_cb)
 * logs the job and marks its offset done, or with --exactly-once into the
 * next transaction (kg_txn) with the offset; token events always go
 * straight out. A message the broker refuses for its own sake (its size)
 * is answered instead of stopping the worker (on_refused); any other
 * failed delivery is fatal. At the bottom: the producer itself and the
 * event budget read from the topics at startup. */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../pipeline/kg_events.h"
#include "kg_kafka_conf.h"
#include "kg_topic_config.h"
#include "kg_worker_int.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ---- producing ----

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

/* A message the broker refused for its own sake: counted, then refused() on the job's log
 * scope (its trace_id, read from the message's headers). */
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
                        const rd_kafka_headers_t *hdrs) {
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
    kg_worker_fatal_kafka(w, "could not produce an event");
    return false;
}

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
                    const rd_kafka_headers_t *hdrs) {
    if (!w->out.txn) {
        return produce_now(w, topic, key, key_len, value, len, ack, hdrs);
    }
    if (kg_txn_add(w->out.txn, topic, key, key_len, value, len, hdrs,
                   ack ? topic_of(w, ack->partition) : "", ack ? part_of(ack->partition) : -1,
                   ack ? ack->offset : -1, ack) != KG_OK) {
        free(ack);
        kg_worker_fatal(w, "out of memory keeping an answer for the transaction");
        return false;
    }
    atomic_fetch_add(&w->m.events_produced, 1);
    if (ack && kg_offsets_done(w->parts.offsets, ack->partition, ack->offset)) {
        kg_worker_store_offsets(w);
    }
    return true;
}

/* `log_fields` (may be NULL): the job's " trace_id=..." for the line that logs the answer. */
static ack_t *ack_new(int32_t partition, int64_t offset, ack_kind_t kind, const char *log_fields) {
    ack_t *a = calloc(1, sizeof(*a));
    if (a) {
        a->partition = partition;
        a->offset = offset;
        a->kind = kind;
        snprintf(a->log_fields, sizeof(a->log_fields), "%s", log_fields ? log_fields : "");
    }
    return a;
}

/* The bytes a value may take in a message of at most `max` bytes that also carries hdr_size
 * bytes of the job's headers (kg_trace: at most a quarter of the event budget, so an event keeps
 * three quarters or more; never less than half). */
static size_t room_beside(size_t max, size_t hdr_size) {
    return hdr_size < max / 2 ? max - hdr_size : max / 2;
}

static size_t event_budget(const kg_worker_t *w, size_t hdr_size) {
    return room_beside(w->out.max_event_bytes, hdr_size);
}

void kg_worker_store_offsets(kg_worker_t *w) {
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

// ---- delivery reports ----

/* A job's answer is on the broker: count it and log it now, not when it
 * was produced, so the log never shows a job as done that was not. */
static void log_answered(kg_worker_t *w, const void *rkey, size_t key_len, const ack_t *ack) {
    int klen = (int)key_len;
    const char *key = rkey ? rkey : "";
    const char *scope = kg_log_scope(ack->log_fields);
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
    kg_log_scope(scope);
}

/* Delivery report (called from rd_kafka_poll on the producer, kafka thread). */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    kg_worker_t *w = opaque;
    ack_t *ack = rkm->_private;
    if (!rkm->err) {
        w->out.delivered_us = kg_clock_us(); /* a broker takes our writes */
    }
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
        kg_worker_fatal_kafka(w, what);
    } else if (ack && !w->life.fatal) {
        log_answered(w, rkm->key, rkm->key_len, ack);
        if (kg_offsets_done(w->parts.offsets, ack->partition, ack->offset)) {
            kg_worker_store_offsets(w);
        }
    }
    free(ack);
}

// ---- dead letters and refused deliveries ----

/* Where an event comes from. run is the number of this run of the job in this process (its
 * record's id; a message answered at intake, or an answer that replaces a refused event, takes
 * a number of its own); attempt (KG_ATTEMPT_ID_SIZE bytes) receives the attempt id. */
static kg_event_origin_t
origin(kg_worker_t *w, int32_t partition, int64_t offset, uint64_t run, char *attempt) {
    kg_events_attempt_id(w->incarnation, run, attempt, KG_ATTEMPT_ID_SIZE);
    kg_event_origin_t o = {.worker_id = w->worker_id,
                           .topic = partition >= 0 ? topic_of(w, partition) : NULL,
                           .partition = partition >= 0 ? part_of(partition) : -1,
                           .offset = offset,
                           .model = w->served.n > 0 ? w->served.names[0] : NULL,
                           .attempt = attempt};
    return o;
}

/* Copy a message to the dead-letter topic with headers that say why. A
 * copy the DLQ cannot take would stop the worker and then every restart
 * (the offset is never stored): the payload is cut to max_dlq_bytes and
 * kgen-payload-truncated-from says how long it was. */
void kg_worker_dead_letter(kg_worker_t *w, const dlq_copy_t *c, ack_t *ack) {
    /* the job's own headers first (kg_trace: bounded), so a trace goes on through the DLQ too */
    rd_kafka_headers_t *h =
        c->trace_hdrs ? rd_kafka_headers_copy(c->trace_hdrs) : rd_kafka_headers_new(8);
    size_t trace_size = kg_trace_headers_size(c->trace_hdrs);
    size_t max = room_beside(w->out.max_dlq_bytes, trace_size);
    size_t len = c->len;
    if (len > max) {
        char orig[24];
        len = max;
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
    ack_t *again = ack_new(ack->partition, ack->offset, ACK_DLQ, ack->log_fields);
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
 * fault: that stays fatal. This is on_refused's body, run on the job's log
 * scope; rid is the key as a request_id. */
static void refused(kg_worker_t *w,
                    const char *topic,
                    const void *key,
                    size_t key_len,
                    const void *value,
                    size_t len,
                    const rd_kafka_headers_t *hdrs,
                    const ack_t *ack,
                    rd_kafka_resp_err_t err,
                    const char *rid) {
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
            kg_worker_fatal_kafka(w, "the topic refuses even a small message");
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
                    .offset = off,
                    .trace_hdrs = hdrs};
    kg_worker_dead_letter(w, &c, NULL);
    if (!ack) {
        return;
    }
    KG_LOG_WARN("worker",
                "job result not delivered, answered with an internal error request_id=%s "
                "topic=%s partition=%d offset=%lld",
                rid, topic_of(w, part), part_of(part), (long long)off);
    char attempt[KG_ATTEMPT_ID_SIZE];
    kg_event_origin_t o = origin(w, part, off, w->jobs.next_id++, attempt);
    snprintf(msg, sizeof(msg),
             "the job's %s event (%zu bytes) could not be delivered: %s; a copy is on the "
             "dead-letter topic",
             ack->is_error ? "error" : "done", len, rd_kafka_err2str(err));
    size_t elen;
    char *json = kg_events_error(&o, rid, KG_ERROR_INTERNAL, msg, NULL,
                                 event_budget(w, kg_trace_headers_size(hdrs)), &elen, NULL);
    if (!json) {
        kg_worker_fatal(w, "out of memory encoding an error event");
        return;
    }
    produce(w, w->cfg->results_topic, key, key_len, json, elen,
            ack_new(part, off, ACK_ANSWER, ack->log_fields), hdrs);
    free(json);
}

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
    char fields[48];
    kg_trace_log_fields_of(hdrs, fields, sizeof(fields));
    const char *scope = kg_log_scope(fields);
    refused(w, topic, key, key_len, value, len, hdrs, ack, err, rid);
    kg_log_scope(scope);
}

/* An unparseable job: its DLQ copy is its answer (the delivery stores the offset). */
void kg_worker_dead_letter_job(kg_worker_t *w, const job_msg_t *m, const kg_codec_error_t *err) {
    dlq_copy_t c = {.key = m->key,
                    .key_len = m->key_len,
                    .payload = m->payload,
                    .len = m->len,
                    .payload_kind = "job",
                    .reason = kg_codec_dlq_reason_str(err->reason),
                    .message = err->message,
                    .partition = m->partition,
                    .offset = m->offset,
                    .trace_hdrs = m->trace ? m->trace->hdrs : NULL};
    atomic_fetch_add(&w->m.jobs_dlq, 1);
    KG_LOG_WARN("worker", "dead-lettered topic=%s partition=%d offset=%lld reason=%s",
                topic_of(w, m->partition), part_of(m->partition), (long long)m->offset, c.reason);
    kg_worker_job_answered(w, m->partition, m->offset);
    kg_worker_dead_letter(
        w, &c, ack_new(m->partition, m->offset, ACK_DLQ, m->trace ? m->trace->log_fields : NULL));
}

// ---- events ----

/* An error event for a job that never reached the engine (invalid, or
 * refused at intake); its delivery stores the offset. */
void kg_worker_produce_error(kg_worker_t *w,
                             const char *request_id,
                             int32_t partition,
                             int64_t offset,
                             kg_error_code_t code,
                             const char *message,
                             const char *metadata_json,
                             const kg_trace_t *trace) {
    char attempt[KG_ATTEMPT_ID_SIZE];
    kg_event_origin_t o = origin(w, partition, offset, w->jobs.next_id++, attempt);
    kg_event_span_t span;
    o.span = kg_trace_span(trace, kg_trace_unix_nano(), &span) ? &span : NULL;
    size_t len;
    char *json = kg_events_error(&o, request_id, code, message, metadata_json,
                                 event_budget(w, trace ? trace->hdrs_size : 0), &len, NULL);
    if (!json) {
        kg_worker_fatal(w, "out of memory encoding an error event");
        return;
    }
    ack_t *ack = ack_new(partition, offset, ACK_RESULT, trace ? trace->log_fields : NULL);
    if (ack) {
        ack->is_error = true;
        ack->code = code;
    }
    kg_worker_job_answered(w, partition, offset);
    produce(w, w->cfg->results_topic, request_id, strlen(request_id), json, len, ack,
            trace ? trace->hdrs : NULL);
    free(json);
}

void kg_worker_emit_token_events(kg_worker_t *w, job_rec_t *r, const kg_jobrun_step_t *js) {
    const kg_job_t *job = r->run.job;
    if (!job->stream) {
        return;
    }
    char attempt[KG_ATTEMPT_ID_SIZE];
    kg_event_origin_t o = origin(w, job->partition, job->offset, r->id, attempt);
    for (int i = 0; i < js->n_evs; i++) {
        size_t len;
        char *json = kg_jobrun_token_event(&r->run, js, i, &o, w->model->tok,
                                           event_budget(w, r->trace.hdrs_size), &len, NULL);
        if (!json) {
            kg_worker_fatal(w, "out of memory encoding a token event");
            return;
        }
        produce_now(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len,
                    NULL, r->trace.hdrs);
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
void kg_worker_produce_terminal(kg_worker_t *w, job_rec_t *r, kg_status_t refused, int64_t now_us) {
    const kg_job_t *job = r->run.job;
    char attempt[KG_ATTEMPT_ID_SIZE];
    kg_event_origin_t o = origin(w, job->partition, job->offset, r->id, attempt);
    kg_event_span_t span;
    o.span = kg_trace_span(&r->trace, kg_trace_unix_nano(), &span) ? &span : NULL;
    kg_jobrun_outcome_t oc;
    size_t len, budget = event_budget(w, r->trace.hdrs_size);
    char *json = refused != KG_OK
                     ? kg_jobrun_refused(&r->run, &o, refused, budget, &len, &oc)
                     : kg_jobrun_terminal(&r->run, &o, w->model->tok, budget, &len, &oc);
    ack_t *ack = ack_new(job->partition, job->offset, ACK_RESULT, r->trace.log_fields);
    if (!json || !ack) {
        free(json);
        free(ack);
        kg_worker_fatal(w, "out of memory encoding a terminal event");
        return;
    }
    log_shed(job, &oc.fit, budget);
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
    kg_worker_job_answered(w, job->partition, job->offset);
    produce(w, w->cfg->results_topic, job->request_id, strlen(job->request_id), json, len, ack,
            r->trace.hdrs);
    free(json);
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

/* Commit the transaction when it is due (or now, with `force`); a fatal
 * transactional error stops the worker. */
bool kg_worker_commit_txn(kg_worker_t *w, bool force) {
    if (!w->out.txn) {
        return true;
    }
    kg_status_t st =
        kg_txn_commit(w->out.txn, w->out.producer, w->parts.consumer, kg_clock_us(), force);
    if (st == KG_ERR_KAFKA) {
        kg_worker_fatal_kafka(w, "the transactional producer failed (fenced by a newer instance?)");
    }
    return st == KG_OK;
}

// ---- the producer and the event budget ----

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
     * request answers the ones behind it OUT_OF_ORDER_SEQUENCE, and librdkafka bumps the
     * producer epoch and sends them again, which can put a job's token events out of order
     * or twice (check_worker_mock's test_request_errors saw it on 2.0.2). Still so in 2.12.0:
     * its CHANGELOG names no fix for confluentinc/librdkafka#4953, and rdkafka_request.c
     * still calls rd_kafka_idemp_drain_epoch_bump on "skipped sequence numbers" (the fix,
     * PR #4972, is not merged). Requests still carry every event lingered for them, so
     * throughput stays (docs/DELIVERY.md). */
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
        strtoll(buf, NULL, 10) > topic_max - RECORD_OVERHEAD) {
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
    rd_kafka_conf_set_error_cb(conf, kg_worker_error_cb);
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        snprintf(errstr, errstr_size, "producer: %s", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return rk;
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

/* The bytes a message may take: the producer's message.max.bytes, and the
 * topic's max.message.bytes (read at startup) when that is smaller, or
 * --max-event-bytes. Makes the producer (its batch.size depends on it) and
 * sets max_event_bytes and max_dlq_bytes. */
kg_status_t kg_worker_size_messages(kg_worker_t *w, char *errstr, size_t errstr_size) {
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
        producer_max = strtoll(buf, NULL, 10);
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
    /* a job's copied headers (kg_trace) take at most a quarter of what an event or a DLQ copy
     * may, so its events still fit with everything the job brought */
    size_t smaller = w->out.max_event_bytes < w->out.max_dlq_bytes ? w->out.max_event_bytes
                                                                   : w->out.max_dlq_bytes;
    w->out.max_trace_bytes = smaller / 4 < KG_TRACE_BYTES_MAX ? smaller / 4 : KG_TRACE_BYTES_MAX;
    KG_LOG_INFO("worker",
                "event budget max_event_bytes=%zu max_dlq_bytes=%zu max_trace_bytes=%zu "
                "producer_message_max_bytes=%lld results_topic_max_message_bytes=%lld "
                "dlq_topic_max_message_bytes=%lld",
                w->out.max_event_bytes, w->out.max_dlq_bytes, w->out.max_trace_bytes,
                (long long)producer_max, (long long)topic_max[0], (long long)topic_max[1]);
    return KG_OK;
}
