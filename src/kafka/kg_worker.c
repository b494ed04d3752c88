/* kg_worker: the worker's life. kg_worker_new builds it from the config
 * (lanes and topics, the engine stack, the offsets tracker, the producer and
 * the event budget, the poison journal, the cancel reader, the consumer);
 * kg_worker_run is the kafka thread's loop, one turn at a time: cancels,
 * backpressure, messages and rebalances, held jobs, the engine's
 * completions, delivery reports and transactions, lag; after
 * kg_worker_stop the same loop drains, then the producer is flushed, the
 * offsets committed and the consumer closed; kg_worker_free undoes
 * kg_worker_new in reverse. A fatal error (kg_worker_fatal) ends the loop at
 * once. The rest of the worker is in the files kg_worker_int.h lists; the
 * design is in kg_worker.h. */
#include "kg_worker.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_acl.h"
#include "kg_kafka_conf.h"
#include "kg_worker_int.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

// ---- fatal errors ----

void kg_worker_fatal(kg_worker_t *w, const char *what) {
    if (!w->life.fatal) {
        KG_LOG_ERROR("worker", "fatal: %s; stopping without storing unfinished offsets", what);
    }
    w->life.fatal = 1;
}

/* A fatal error of the broker or a topic: no job can have caused it, so
 * the journal hands the partitions over as clean (kg_journal_revoke). */
void kg_worker_fatal_kafka(kg_worker_t *w, const char *what) {
    w->life.fatal_kafka = !w->life.fatal;
    kg_worker_fatal(w, what);
}

/* librdkafka's fatal error on `rk` (the producer's reaches error_cb, the consumer's comes as
 * a message error): the worker stops, unless the consumer protocol was refused under
 * --group-protocol auto before anything was assigned (then the poll loop switches). */
static void on_fatal(kg_worker_t *w, rd_kafka_t *rk) {
    char buf[512];
    rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof(buf));
    if (rk == w->parts.consumer && w->parts.may_fall_back && !w->parts.ever_assigned &&
        kg_assignment_refused(orig)) {
        KG_LOG_WARN("rdkafka", "%s client=%s", buf, rd_kafka_name(rk));
        w->parts.fall_back = true; /* kg_worker_fall_back_to_classic */
        return;
    }
    char hint[320] = "";
    if (kg_acl_denied(orig)) {
        /* an idempotent or transactional producer refused its id by the authorizer */
        char id[600];
        snprintf(id, sizeof(id), "kgen-%s-", w->cfg->group_id);
        kg_acl_hint(orig, "Write", id, hint + 2, sizeof(hint) - 2);
        hint[0] = ':';
        hint[1] = ' ';
    }
    char what[900];
    snprintf(what, sizeof(what), "librdkafka fatal error: %s%s", buf, hint);
    kg_worker_fatal_kafka(w, what);
}

void kg_worker_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    kg_worker_t *w = opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        on_fatal(w, rk);
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION) {
        /* retried by librdkafka too, but for ever: kg_worker_check_auth ends it */
        kg_auth_failed(&w->life.auth, kg_clock_us() / 1000, reason);
    }
    kg_kafka_log_error(rk, err, reason); /* librdkafka retries by itself */
}

/* The jobs consumer was refused by the broker's authorizer: its group or a jobs topic lacks an
 * ACL. Said once per streak with the ACL to add; the streak ends the worker as a failing login
 * does (kg_auth_denied). */
static void worker_denied(kg_worker_t *w, const rd_kafka_message_t *rkm) {
    bool group = rkm->err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
    char hint[320];
    kg_acl_hint(rkm->err, "Read",
                group      ? w->cfg->group_id
                : rkm->rkt ? rd_kafka_topic_name(rkm->rkt)
                           : w->cfg->jobs_topic,
                hint, sizeof(hint));
    if (!w->life.auth.denied || kg_auth_failing_ms(&w->life.auth, kg_clock_us() / 1000) == 0) {
        KG_LOG_ERROR("worker", "no job can be read: the worker %s", hint);
    }
    kg_auth_denied(&w->life.auth, kg_clock_us() / 1000, hint);
}

/* --auth-timeout: a login failing that long ends the worker (kg_auth.h says why) */
static void check_auth(kg_worker_t *w, int64_t now_us) {
    int64_t ms = kg_auth_failing_ms(&w->life.auth, now_us / 1000);
    if (w->cfg->auth_timeout_s > 0 && ms >= (int64_t)(w->cfg->auth_timeout_s * 1000)) {
        char what[640];
        if (w->life.auth.denied) {
            snprintf(what, sizeof(what),
                     "not authorized by Kafka for %.0f s (--auth-timeout %g): %s",
                     (double)ms / 1000, w->cfg->auth_timeout_s, w->life.auth.reason);
        } else {
            snprintf(what, sizeof(what),
                     "cannot log in to Kafka: authentication failing for %.0f s (--auth-timeout "
                     "%g; check the -X sasl.* properties): %s",
                     (double)ms / 1000, w->cfg->auth_timeout_s, w->life.auth.reason);
        }
        kg_worker_fatal_kafka(w, what);
    }
}

// ---- new, run, stop, free ----

kg_worker_t *
kg_worker_new(const kg_config_t *cfg, const kg_model_t *model, char *errstr, size_t errstr_size) {
    kg_worker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    w->cfg = cfg;
    w->model = model;
    kg_auth_start(&w->life.auth, kg_clock_us() / 1000);
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
    if (getrandom(&w->incarnation, sizeof(w->incarnation), 0) != (ssize_t)sizeof(w->incarnation)) {
        /* no entropy source: the clock and the pid still differ between two processes */
        w->incarnation = (uint64_t)kg_clock_epoch_ms() * 1000003u ^ (uint64_t)getpid();
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
    /* 0: deep enough that tiny jobs do not make the consumer pause and resume
     * every few jobs (librdkafka refetches from scratch after each resume),
     * except with lanes, where bulk messages taken in longer bursts made
     * interactive answers slower (docs/PERFORMANCE.md, Default queue depth) */
    w->queue_depth = cfg->max_queue_depth > 0 ? (int32_t)cfg->max_queue_depth
                     : w->lanes.n > 1         ? 64
                                              : 1024;
    w->max_inflight = (int32_t)cfg->max_batch_size + w->queue_depth;
    w->intake.codec_opts = kg_codec_opts_default();
    w->intake.codec_opts.max_message_size = (size_t)cfg->max_message_bytes;
    w->intake.codec_opts.default_max_tokens = cfg->default_max_tokens;
    if (kg_trace_names_init(&w->intake.trace_names, cfg->propagate_headers, errstr, errstr_size) !=
        KG_OK) {
        goto fail;
    }

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
    so.lora = cfg->lora;
    so.lora_dir = cfg->lora_dir;
    so.max_loras = (int32_t)cfg->max_loras;
    so.engine.max_batch_size = cfg->max_batch_size;
    so.engine.max_queue_depth = (int32_t)cfg->max_batch_size + w->queue_depth;
    so.engine.max_batch_tokens = cfg->max_batch_tokens;
    so.engine.ctx = cfg->ctx;
    so.engine.kv_block_size = cfg->kv_block_size;
    so.engine.kv_memory_mib = cfg->kv_memory_mib;
    if (kg_kv_type_parse(cfg->kv_type, &so.engine.kv_type) != KG_OK) {
        snprintf(errstr, errstr_size, "--kv-type: expected f16 or q8_0, got '%s'", cfg->kv_type);
        goto fail;
    }
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
    w->intake.limits.loras = kg_stack_loras(w->stack);
    w->intake.limits.chat_template = kg_stack_chat_template(w->stack);
    w->intake.limits.max_choices =
        ep->max_batch_size < KG_JOB_MAX_N ? ep->max_batch_size : KG_JOB_MAX_N;
    w->intake.limits.max_inputs = ep->max_queue_depth; /* one engine request each */
    w->intake.limits.max_step_tokens = ep->max_batch_tokens;
    w->jobs.n_engine_recs = ep->max_batch_size + ep->max_queue_depth;
    w->jobs.table_size = 1;
    while (w->jobs.table_size < (size_t)w->max_inflight * 2) {
        w->jobs.table_size <<= 1;
    }
    w->jobs.table = calloc(w->jobs.table_size, sizeof(job_rec_t *));
    /* the fetch queue can hand us a few messages after a pause: room for them */
    w->parts.offsets = kg_offsets_new((size_t)w->max_inflight * 4 + 4096);
    if (!w->jobs.table || !w->parts.offsets) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    if (kg_worker_size_messages(w, errstr, errstr_size) != KG_OK) {
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
    /* TEST-ONLY: the coordinator watchdog's two minutes, shortened (check_worker_mock) */
    const char *stuck_env = getenv("KGEN_TEST_COORD_STUCK_MS");
    const long long stuck_ms = stuck_env ? strtoll(stuck_env, NULL, 10) : 0;
    w->parts.coord_stuck_us = stuck_ms > 0 ? stuck_ms * 1000 : 120 * 1000000LL;
    w->intake.crash_request_id = getenv("KGEN_TEST_CRASH_ON_REQUEST_ID");
    if (w->intake.crash_request_id && *w->intake.crash_request_id) {
        KG_LOG_WARN("worker",
                    "TEST-ONLY fault injection armed: this worker abort()s when it starts the "
                    "job request_id=%s (KGEN_TEST_CRASH_ON_REQUEST_ID; never in production)",
                    w->intake.crash_request_id);
    } else {
        w->intake.crash_request_id = NULL;
    }
    if (kg_worker_start_consumer(w, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    char lora_desc[600] = ""; /* the adapters' source and cap, when any are served */
    const kg_loras_t *loras = kg_stack_loras(w->stack);
    if (loras->n > 0 || loras->dir) {
        snprintf(lora_desc, sizeof(lora_desc), " lora_adapters=%d lora_dir=%.512s max_loras=%d",
                 (int)loras->n, loras->dir ? loras->dir : "-", (int)cfg->max_loras);
    }
    KG_LOG_INFO("worker",
                "started worker_id=%s backend=%s jobs_topic=%s results_topic=%s "
                "max_batch_size=%d max_queue_depth=%d max_inflight=%d kv_blocks=%d "
                "librdkafka=%s%s",
                w->worker_id, kg_stack_backend_name(w->stack), cfg->jobs_topic, cfg->results_topic,
                ep->max_batch_size, w->queue_depth, w->max_inflight, ep->n_kv_blocks,
                kg_kafka_version(), lora_desc);
    return w;
fail:
    kg_worker_free(w);
    return NULL;
}

void kg_worker_stop(kg_worker_t *w) {
    atomic_store(&w->life.stop_requested, 1); /* lock-free: async-signal-safe */
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
                    kg_worker_pending_unlink(w, r);
                    kg_worker_job_given_back(w, r->run.job->partition, r->run.job->offset);
                    kg_worker_rec_free(w, r);
                }
            }
            kg_worker_drop_held(w, NULL);
            /* so are jobs the engine has not started streaming (waiting for
             * a slot, or in their first prefill step): the drain is for the
             * running ones, and the next owner can start these at once */
            kg_worker_abandon_jobs(w, NULL, true);
        }
        if (w->life.draining) {
            if (w->jobs.n_inflight == 0 && w->intake.n_held == 0) {
                break;
            }
            if (now > w->life.drain_deadline_us) {
                KG_LOG_WARN("worker", "drain timeout: cancelling inflight=%d (not committed)",
                            w->jobs.n_inflight);
                kg_worker_abandon_jobs(w, NULL, false);
                w->life.drain_deadline_us = INT64_MAX;
            }
        }
        kg_worker_poll_cancels(w);
        kg_worker_check_backpressure(w);
        /* consumer: messages and rebalances. It waits (5 ms) only while no job is in the
         * worker: with jobs running, the wait is for the engine's completions below, which wake
         * it as they come; waiting here instead held every completion up to 5 ms, and under a
         * backlog (the partitions paused, nothing to take) drained 64 of them per 5 ms, which
         * both capped the engine's speed and kept an interactive job's first token queued
         * behind hundreds of bulk completions (scripts/bench-lanes) */
        const int consumer_wait = w->jobs.n_inflight == 0 && !w->intake.held_head ? 5 : 0;
        int n_taken = 0;
        rd_kafka_message_t *rkm;
        while (n_taken < POLL_BATCH && !w->life.fatal && !w->parts.fall_back &&
               (rkm = rd_kafka_consumer_poll(w->parts.consumer,
                                             n_taken == 0 ? consumer_wait : 0)) != NULL) {
            n_taken++;
            if (rkm->err == RD_KAFKA_RESP_ERR__FATAL) {
                on_fatal(w, w->parts.consumer);
            } else if (rkm->err) {
                if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                    KG_LOG_WARN("worker", "consumer: %s", rd_kafka_message_errstr(rkm));
                }
                if (kg_acl_denied(rkm->err)) {
                    /* no job can run without it: ended by --auth-timeout as a login is */
                    worker_denied(w, rkm);
                }
            } else if (w->life.draining) {
                /* after the stop: not taken, not committed; the next owner runs it */
                kg_auth_ok(&w->life.auth);
            } else {
                kg_auth_ok(&w->life.auth);
                kg_worker_on_message(w, rkm);
            }
            rd_kafka_message_destroy(rkm);
            kg_worker_check_backpressure(w);
        }
        if (w->parts.fall_back) {
            kg_worker_fall_back_to_classic(w);
        }
        kg_worker_check_group(w, now);
        kg_worker_check_coordinator(w, now);
        kg_worker_start_next_suspect(w);
        /* while jobs wait for their snapshot, wait here for its ack */
        for (int l = 0; l < w->lanes.n; l++) {
            kg_journal_poll(w->intake.journal[l], now, w->intake.held_head && l == 0 ? 2 : 0);
        }
        kg_worker_release_held(w);
        kg_worker_submit_pending(w);
        kg_worker_drain_engine_events(w, n_taken ? 0 : 2);
        rd_kafka_poll(w->out.producer, 0);
        kg_worker_commit_txn(w, false);
        kg_worker_update_lag(w);
        check_auth(w, now);
        if (kg_runner_is_dead(w->runner)) {
            kg_worker_drain_engine_events(w, 0);
            kg_worker_fatal(w, "the backend failed");
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
            for (int i = 0; i < 5 && !kg_worker_commit_txn(w, true) && !w->life.fatal; i++) {
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
                kg_worker_rec_free(w, w->jobs.table[i]);
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
    kg_worker_drop_held(w, NULL);
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

// ---- for the metrics and health endpoints (kg_http) ----

const kg_grammar_cache_t *kg_worker_grammar_cache(const kg_worker_t *w) {
    return kg_stack_grammars(w->stack);
}

const kg_worker_metrics_t *kg_worker_metrics(const kg_worker_t *w) {
    return &w->m;
}

const struct kg_runner_gauges *kg_worker_engine_gauges(const kg_worker_t *w) {
    return kg_runner_gauges(w->runner);
}

const kg_loras_t *kg_worker_loras(const kg_worker_t *w) {
    return kg_stack_loras(w->stack);
}

void kg_worker_backend_counters(const kg_worker_t *w, kg_backend_counters_t *out) {
    kg_stack_backend_counters(w->stack, out);
}
