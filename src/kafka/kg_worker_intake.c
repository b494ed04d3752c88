/* kg_worker_intake: a message off the jobs topic, up to the lanes' queues.
 * on_message (at the bottom) tracks its offset and asks the poison journal
 * (kg_journal) how often the job was present when a worker failed: a job
 * not journaled starts at once; one with no strike waits (is held) until
 * the snapshot that records it as running is acknowledged; a suspect (some
 * strikes) waits for its group's turn (kg_suspects.h: group testing); one
 * found poison is answered instead of run; while a suspect runs solo, every
 * job taken waits for it. Starting a job decodes it (an
 * unparseable one goes to the DLQ, an invalid one gets an error event),
 * prepares it (tokenize, check the limits) and queues it for the engine
 * (kg_worker_jobs.c). */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_suspects.h"
#include "kg_worker_int.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- starting a job ----

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
        kg_worker_fatal(w, "out of memory decoding a job");
    } else if (st != KG_OK && cerr.kind == KG_CODEC_DLQ) {
        kg_worker_dead_letter_job(w, m, &cerr);
    } else if (st != KG_OK) {
        kg_worker_produce_error(w, cerr.request_id, m->partition, m->offset, KG_ERROR_INVALID_JOB,
                                cerr.message, NULL, m->trace);
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
    if (!r || kg_trace_copy(&r->trace, m->trace) != KG_OK) {
        free(r);
        kg_job_free(job);
        kg_worker_fatal(w, "out of memory");
        return;
    }
    r->id = w->jobs.next_id++;
    kg_error_code_t code;
    char msg[256];
    kg_status_t st = kg_jobrun_start(&r->run, w->model, &w->intake.limits, job, kg_clock_epoch_ms(),
                                     m->taken_us, &code, msg, sizeof(msg));
    if (st != KG_OK) {
        if (st == KG_ERR_NOMEM) {
            kg_worker_fatal(w, "out of memory preparing a job");
        } else {
            kg_worker_produce_error(w, job->request_id, job->partition, job->offset, code, msg,
                                    job->metadata_json, m->trace);
        }
        kg_jobrun_clear(&r->run);
        kg_trace_clear(&r->trace);
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
        kg_worker_produce_terminal(w, r, KG_OK, kg_clock_us());
        kg_jobrun_clear(&r->run);
        kg_trace_clear(&r->trace);
        free(r);
        return;
    }
    kg_worker_rec_insert(w, r);
    kg_worker_pending_push(w, r, false);
    kg_worker_submit_pending(w);
}

// ---- poison jobs: held messages and suspects (see kg_journal.h, kg_suspects.h) ----

/* The suspect left the running group (answered or given back): when it was
 * the last, the next group may start. */
static void end_suspect(kg_worker_t *w, int32_t partition, int64_t offset) {
    for (int32_t i = 0; i < w->intake.n_round; i++) {
        if (w->intake.round[i].partition == partition && w->intake.round[i].offset == offset) {
            w->intake.round[i] = w->intake.round[--w->intake.n_round];
            break;
        }
    }
    atomic_store(&w->m.suspects, w->intake.n_round > 0 || w->intake.suspects_head != NULL);
}

/* The job was answered (its terminal event or DLQ copy produced): off the
 * journal's record; when it was the group's last suspect, the next may start. */
void kg_worker_job_answered(kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_journal_finish(w->intake.journal[lane_of(partition)], part_of(partition), offset);
    end_suspect(w, partition, offset);
}

/* The job was given back unfinished (revoke, drain): it keeps its strikes. */
void kg_worker_job_given_back(kg_worker_t *w, int32_t partition, int64_t offset) {
    kg_journal_release(w->intake.journal[lane_of(partition)], part_of(partition), offset);
    end_suspect(w, partition, offset);
}

static void update_inflight_gauge(kg_worker_t *w) {
    atomic_store(&w->m.inflight, w->jobs.n_inflight + w->intake.n_held);
}

static held_msg_t *held_new(const job_msg_t *m, const kg_journal_rec_t *rec) {
    held_msg_t *h = calloc(1, sizeof(*h));
    void *key = malloc(m->key_len ? m->key_len : 1);
    void *payload = malloc(m->len ? m->len : 1);
    if (!h || !key || !payload || kg_trace_copy(&h->trace, m->trace) != KG_OK) {
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
    h->m.trace = &h->trace;
    h->strikes = rec ? rec->strikes : 0;
    h->level = rec ? rec->level : 0;
    if (!m->key) {
        free(key);
    }
    if (!m->payload) {
        free(payload);
    }
    return h;
}

static void held_free(held_msg_t *h) {
    kg_trace_clear(&h->trace);
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

/* Unlink `h` (whose predecessor is `prev`) from a list. */
static void held_unlink(held_msg_t **head, held_msg_t **tail, held_msg_t *prev, held_msg_t *h) {
    if (prev) {
        prev->next = h->next;
    } else {
        *head = h->next;
    }
    if (*tail == h) {
        *tail = prev;
    }
    h->next = NULL;
}

/* Journal the message as running (solo: the only job on the worker) and hold it for the ack. */
static void hold_for_ack(kg_worker_t *w, held_msg_t *h, bool solo) {
    h->ticket = kg_journal_start(w->intake.journal[lane_of(h->m.partition)],
                                 part_of(h->m.partition), h->m.offset, solo);
    held_push(&w->intake.held_head, &w->intake.held_tail, h);
}

/* Hold a message that may not start at once: a job with no strike starts
 * once its snapshot is acknowledged (after the solo suspect, when one runs);
 * a suspect waits for its group. `rec` NULL: not journaled (it waits only
 * for a solo suspect). */
static void hold_message(kg_worker_t *w, const job_msg_t *m, const kg_journal_rec_t *rec) {
    held_msg_t *h = held_new(m, rec);
    if (!h) {
        kg_worker_fatal(w, "out of memory holding a job");
        return;
    }
    w->intake.n_held++;
    update_inflight_gauge(w);
    if (!rec || rec->strikes == 0) {
        if (w->intake.solo) {
            held_push(&w->intake.deferred_head, &w->intake.deferred_tail, h);
        } else {
            hold_for_ack(w, h, false);
        }
        return;
    }
    KG_LOG_WARN("worker",
                "suspect job: it was running when a worker failed, so it runs in a group of "
                "suspects that is split while it fails again topic=%s partition=%d offset=%lld "
                "strikes=%d level=%d alone=%d",
                topic_of(w, m->partition), part_of(m->partition), (long long)m->offset,
                rec->strikes, rec->level, rec->alone);
    held_push(&w->intake.suspects_head, &w->intake.suspects_tail, h);
    w->intake.last_suspect_us = kg_clock_us();
    atomic_store(&w->m.suspects, 1);
}

/* No suspect runs solo any more: the jobs deferred meanwhile go on. */
static void end_solo(kg_worker_t *w) {
    w->intake.solo = false;
    for (held_msg_t *h = w->intake.deferred_head, *next; h; h = next) {
        next = h->next;
        hold_for_ack(w, h, false);
    }
    w->intake.deferred_head = w->intake.deferred_tail = NULL;
}

/* Whether the worker holds every suspect its partitions' records list (the
 * group would differ otherwise); a second after the newest one came, it
 * goes on with what it has (a suspect's message may be gone: retention). */
static bool have_all_suspects(kg_worker_t *w) {
    if (kg_clock_us() - w->intake.last_suspect_us > 1000000) {
        return true;
    }
    held_msg_t *head = w->intake.suspects_head;
    for (held_msg_t *h = head; h; h = h->next) {
        held_msg_t *g = head;
        while (g->m.partition != h->m.partition) {
            g = g->next;
        }
        if (g != h) {
            continue; /* its partition was counted at its first suspect */
        }
        int n_held = 0;
        for (; g; g = g->next) {
            n_held += g->m.partition == h->m.partition;
        }
        if (n_held < kg_journal_n_waiting(w->intake.journal[lane_of(h->m.partition)],
                                          part_of(h->m.partition))) {
            return false;
        }
    }
    return true;
}

/* Start the picked suspects as the running group. */
static void start_round(kg_worker_t *w, const bool *pick, int level, bool solo) {
    int32_t n = 0;
    for (held_msg_t *h = w->intake.suspects_head; h; h = h->next) {
        n++;
    }
    if (w->intake.n_round + n > w->intake.cap_round) {
        int32_t cap = w->intake.n_round + n;
        round_slot_t *r = realloc(w->intake.round, (size_t)cap * sizeof(*r));
        if (!r) {
            kg_worker_fatal(w, "out of memory starting suspects");
            return;
        }
        w->intake.round = r;
        w->intake.cap_round = cap;
    }
    held_msg_t *prev = NULL;
    size_t i = 0;
    for (held_msg_t *h = w->intake.suspects_head, *next; h; h = next, i++) {
        next = h->next;
        if (!pick[i]) {
            prev = h;
            continue;
        }
        held_unlink(&w->intake.suspects_head, &w->intake.suspects_tail, prev, h);
        w->intake.round[w->intake.n_round++] =
            (round_slot_t){.partition = h->m.partition, .offset = h->m.offset};
        KG_LOG_INFO("worker",
                    "suspect starts topic=%s partition=%d offset=%lld level=%d group=%d solo=%d",
                    topic_of(w, h->m.partition), part_of(h->m.partition), (long long)h->m.offset,
                    level, w->intake.n_round, solo);
        hold_for_ack(w, h, solo);
    }
    w->intake.round_level = level;
}

/* The suspects run in groups (kg_suspects.h): the next group starts when the
 * last one is done; level-1 suspects that arrive while a level-1 group runs
 * join it; a group of one runs solo, once every other job is done. */
void kg_worker_start_next_suspect(kg_worker_t *w) {
    if (w->life.draining || w->life.fatal) {
        return;
    }
    size_t n = 0;
    for (held_msg_t *h = w->intake.suspects_head; h; h = h->next) {
        n++;
    }
    bool running = w->intake.n_round > 0;
    bool may_join = running && w->intake.round_level == 1 && !w->intake.solo;
    if (n == 0 && !running && w->intake.solo) {
        end_solo(w); /* the solo suspect is done, or was given back before it started */
    }
    if (n == 0 || (running && !may_join) || (!running && !have_all_suspects(w))) {
        return; /* (the loop's common case: no allocation) */
    }
    kg_suspect_t *s = malloc(n * sizeof(*s));
    bool *pick = malloc(n * sizeof(*pick));
    if (!s || !pick) {
        free(s);
        free(pick);
        kg_worker_fatal(w, "out of memory choosing suspects");
        return;
    }
    size_t i = 0;
    for (held_msg_t *h = w->intake.suspects_head; h; h = h->next, i++) {
        s[i] =
            (kg_suspect_t){.partition = h->m.partition, .offset = h->m.offset, .level = h->level};
        pick[i] = may_join && h->level <= 1; /* late level-1 suspects join the level-1 group */
    }
    if (may_join) {
        start_round(w, pick, 1, false);
    } else {
        kg_suspects_round_t r = kg_suspects_pick(s, n, pick);
        if (!r.alone && w->intake.solo) {
            end_solo(w);
        }
        if (r.alone) {
            /* from now on jobs taken wait; it starts when the others are done */
            w->intake.solo = true;
        }
        if (!r.alone || (w->jobs.n_inflight == 0 && !w->intake.held_head)) {
            start_round(w, pick, r.level, r.alone);
        }
    }
    free(s);
    free(pick);
}

/* Start every held job whose snapshot the broker has acknowledged. */
void kg_worker_release_held(kg_worker_t *w) {
    held_msg_t *prev = NULL;
    for (held_msg_t *h = w->intake.held_head, *next; h && !w->life.fatal; h = next) {
        next = h->next;
        if (!kg_journal_durable(w->intake.journal[lane_of(h->m.partition)], part_of(h->m.partition),
                                h->ticket)) {
            prev = h;
            continue;
        }
        held_unlink(&w->intake.held_head, &w->intake.held_tail, prev, h);
        w->intake.n_held--;
        const char *scope = kg_log_scope(h->trace.log_fields);
        start_message(w, &h->m);
        kg_log_scope(scope);
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
        held_unlink(head, tail, prev, h);
        w->intake.n_held--;
        kg_worker_job_given_back(w, h->m.partition, h->m.offset);
        held_free(h);
    }
}

void kg_worker_drop_held(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts) {
    drop_held_list(w, &w->intake.held_head, &w->intake.held_tail, parts);
    drop_held_list(w, &w->intake.suspects_head, &w->intake.suspects_tail, parts);
    drop_held_list(w, &w->intake.deferred_head, &w->intake.deferred_tail, parts);
    if (!parts) { /* the drain or the end: no group starts again */
        free(w->intake.round);
        w->intake.round = NULL;
        w->intake.n_round = w->intake.cap_round = 0;
        w->intake.solo = false;
    }
    update_inflight_gauge(w);
    atomic_store(&w->m.suspects, w->intake.n_round > 0 || w->intake.suspects_head);
}

/* A job found poison (kg_suspects_is_poison): not run again. It is answered
 * with an `internal` error event and copied to the DLQ. */
static void answer_poisoned(kg_worker_t *w, const job_msg_t *m, const kg_journal_rec_t *rec) {
    kg_job_t *job = decode_or_answer(w, m); /* the codec is fuzzed; the engine is what crashes */
    if (!job) {
        return;
    }
    char msg[320];
    snprintf(msg, sizeof(msg),
             "poisoned after %d attempts: the job was running each time a worker failed (a "
             "crash, a kill or a device fault), the last %d time%s as the only job on the "
             "worker, so it is not run again; a copy is on the dead-letter topic",
             rec->strikes, rec->alone, rec->alone == 1 ? "" : "s");
    dlq_copy_t c = {.key = m->key,
                    .key_len = m->key_len,
                    .payload = m->payload,
                    .len = m->len,
                    .payload_kind = "job",
                    .reason = "poisoned",
                    .message = msg,
                    .partition = m->partition,
                    .offset = m->offset,
                    .trace_hdrs = m->trace->hdrs};
    atomic_fetch_add(&w->m.jobs_poisoned, 1);
    KG_LOG_ERROR("worker",
                 "job poisoned, not run again request_id=%s topic=%s partition=%d offset=%lld "
                 "strikes=%d alone=%d",
                 job->request_id, topic_of(w, m->partition), part_of(m->partition),
                 (long long)m->offset, rec->strikes, rec->alone);
    kg_worker_dead_letter(w, &c, NULL);
    kg_worker_produce_error(w, job->request_id, m->partition, m->offset, KG_ERROR_INTERNAL, msg,
                            job->metadata_json, m->trace);
    kg_job_free(job);
}

// ---- a message off the jobs topic ----

void kg_worker_on_message(kg_worker_t *w, rd_kafka_message_t *rkm) {
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
    if (st == KG_OK && w->out.txn) {
        /* a partition with no committed offset: its transactions start at its first job */
        kg_txn_track(w->out.txn, w->lanes.lane[lane].topic, rkm->partition, rkm->offset);
    }
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
    if (kg_offsets_is_answered(w->parts.offsets, dense, rkm->offset)) {
        /* a previous owner answered it after an earlier job of the partition was still running
         * (kg_answered.h): done here without running it again */
        KG_LOG_INFO("worker",
                    "job answered by the previous owner: not run again topic=%s "
                    "partition=%d offset=%lld",
                    topic, rkm->partition, (long long)rkm->offset);
        if (kg_offsets_done(w->parts.offsets, dense, rkm->offset)) {
            kg_worker_store_offsets(w);
        }
        return;
    }
    /* the headers its events will carry (kg_trace), and its trace_id on every log line about it */
    kg_trace_t trace;
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        hdrs = NULL;
    }
    if (kg_trace_take(&trace, hdrs, &w->intake.trace_names, w->out.max_trace_bytes) != KG_OK) {
        kg_worker_fatal(w, "out of memory copying a job's headers");
        return;
    }
    const char *scope = kg_log_scope(trace.log_fields);
    if (trace.n_dropped > 0) {
        KG_LOG_WARN("worker",
                    "job headers not copied onto its events: over the %zu-byte cap topic=%s "
                    "partition=%d offset=%lld dropped=%d first=%s first_bytes=%zu",
                    w->out.max_trace_bytes, topic, rkm->partition, (long long)rkm->offset,
                    trace.n_dropped, trace.dropped, trace.dropped_size);
    }
    job_msg_t m = {.partition = dense,
                   .offset = rkm->offset,
                   .key = rkm->key,
                   .key_len = rkm->key_len,
                   .payload = rkm->payload,
                   .len = rkm->len,
                   .taken_us = kg_clock_us(),
                   .format = message_format(rkm),
                   .trace = &trace};
    kg_journal_rec_t rec;
    if (!kg_journal_lookup(w->intake.journal[lane], rkm->partition, m.offset, &rec)) {
        if (w->intake.solo) {
            hold_message(w, &m, NULL); /* not journaled, but a suspect runs solo */
        } else {
            start_message(w, &m); /* not journaled */
        }
    } else if (kg_suspects_is_poison(rec.strikes, rec.alone, w->cfg->poison_after)) {
        answer_poisoned(w, &m, &rec);
    } else {
        hold_message(w, &m, &rec);
    }
    kg_log_scope(scope);
    kg_trace_clear(&trace);
}
