/* kg_worker: jobs from Kafka through the engine to keyed events.
 *
 * DESIGN
 * The kafka thread (the caller of kg_worker_run) owns the consumer, the
 * producer, the codec, the tokenizer side of the model and the offsets;
 * the engine thread (kg_runner) owns the engine. Per message:
 *   intake   decode -> DLQ (unparseable) | error event (invalid) | job;
 *            tokenize / render chat, check limits -> error event | request
 *            to the runner (or a local FIFO while the engine is full);
 *   output   completions -> detokenized, held-back text -> token events
 *            (stream=true) and one terminal event (done or error), keyed by
 *            request_id, each with worker_id and the source partition/offset;
 *   offsets  a message's offset is tracked when taken and marked done when
 *            its terminal event (or DLQ copy) is acknowledged by the broker
 *            (idempotent producer, acks=all); the contiguous finished prefix
 *            (+1) is stored, and librdkafka's auto-commit commits it. A
 *            delivery that fails after retries is fatal (the worker stops
 *            and exits non-zero without storing that offset), unless the
 *            broker refused that one message for its own sake (its size):
 *            then the job is answered with a small internal error event and
 *            the refused event is copied to the DLQ;
 *   size     every event is fitted to a byte budget read at startup (the
 *            producer's message.max.bytes, the results topic's
 *            max.message.bytes; pipeline/kg_events sheds logprobs, the
 *            metadata echo, then text), and `job done` is logged when the
 *            broker has the done event;
 *   poison   with --poison-after, a job waits until the in-flight journal
 *            records it as running (kg_journal); a job that was running in
 *            that many consecutive worker failures is answered instead of
 *            run, and jobs with a strike run one at a time.
 * Backpressure: at most max_batch_size running plus max_queue_depth waiting
 * jobs; at that level every assigned partition is paused (polling goes on,
 * so the worker stays in the group) and resumed at 3/4.
 * Rebalance (eager range/roundrobin by default): on revoke the producer is
 * flushed and offsets committed first, so finished work is not redone; the
 * revoked partitions' in-flight jobs are then cancelled quietly (no more
 * events, offsets not stored) and run again on the new owner.
 * Shutdown (kg_worker_stop, e.g. on SIGTERM): intake stops (partitions
 * paused), running jobs get drain_timeout_s to finish, the rest are
 * cancelled uncommitted, the producer is flushed, offsets committed, and the
 * consumer closes (leaves the group). */
#pragma once

#include "../config/kg_config.h"
#include "../core/kg_status.h"
#include "../metrics/kg_drain.h"
#include "../metrics/kg_metrics.h"
#include "../model/kg_model.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_worker kg_worker_t;

/* Counters and gauges for /metrics (read from any thread). */
typedef struct kg_worker_metrics {
    _Atomic int64_t jobs_done, jobs_error, jobs_dlq, jobs_cancelled;
    _Atomic int64_t jobs_by_finish[3]; /* stop, length, stop_sequence */
    _Atomic int64_t jobs_by_error[16]; /* by kg_error_code_t */
    _Atomic int64_t prompt_tokens, generated_tokens, messages_consumed, events_produced;
    _Atomic int64_t events_refused; /* refused by the broker for their own sake, answered */
    _Atomic int64_t jobs_poisoned;  /* not run again: present in --poison-after failures */
    _Atomic int32_t suspects;       /* 1 while jobs with a strike wait or run (kg_journal) */
    _Atomic int32_t inflight, paused, assigned_partitions, ready;
    _Atomic int64_t last_loop_us;
    kg_histogram_t ttft, tpot, e2e; /* per finished job */
    kg_drain_t drain;               /* kgen_estimated_drain_seconds (kg_drain) */
} kg_worker_metrics_t;

/** Build the worker: backend, engine, runner, consumer, producer. `model`
 * is borrowed and must outlive the worker. NULL with errstr set. */
kg_worker_t *
kg_worker_new(const kg_config_t *cfg, const kg_model_t *model, char *errstr, size_t errstr_size);

/** Run the kafka loop until kg_worker_stop and the drain are over, or a
 * fatal error. Returns 0 on a clean stop, non-zero on a fatal error.
 * @thread kafka */
int kg_worker_run(kg_worker_t *w);

/** Ask the worker to stop (async-signal-safe: sets a flag). */
void kg_worker_stop(kg_worker_t *w);

void kg_worker_free(kg_worker_t *w);

const kg_worker_metrics_t *kg_worker_metrics(const kg_worker_t *w);
/** Engine gauges (kg_runner_gauges_t) for metrics. */
const struct kg_runner_gauges *kg_worker_engine_gauges(const kg_worker_t *w);
struct kg_backend_counters;
/** The backend's own counters (CUDA graphs and their fallbacks); any thread. */
void kg_worker_backend_counters(const kg_worker_t *w, struct kg_backend_counters *out);
struct kg_loras;
/** The served LoRA adapters (their counters are atomics, readable from any thread). */
const struct kg_loras *kg_worker_loras(const kg_worker_t *w);
/** The grammar cache (its stats are atomics, readable from any thread). */
const struct kg_grammar_cache *kg_worker_grammar_cache(const kg_worker_t *w);
/** Per-partition lag: fills up to `max` (topic, partition, lag) triples (the
 * topic names are borrowed from the worker); returns count. */
int kg_worker_partition_lag(
    kg_worker_t *w, const char **topics, int32_t *partitions, int64_t *lags, int max);
