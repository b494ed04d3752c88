/* kg_runner: the engine thread.
 *
 * DESIGN
 * The runner owns the engine and runs it on its own thread, the only one
 * that touches the engine and the backend (and so the only one that makes
 * CUDA calls). The kafka thread talks to it through two bounded queues:
 * commands in (submit a request, cancel one), events out (completions, a
 * submit that was refused, a fatal backend error). Whatever is enqueued
 * changes owner: a submitted prompt array is freed by the runner (a grammar
 * travels with its own reference). The
 * engine thread never waits on Kafka except when the event queue is full,
 * which the caller prevents by draining it every loop; when there is no
 * work it sleeps on the command queue. */
#pragma once

#include "../engine/kg_engine.h"
#include "../metrics/kg_metrics.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct kg_runner kg_runner_t;

typedef enum kg_runner_event_kind {
    KG_RUNNER_COMPLETION = 0,
    KG_RUNNER_REJECTED = 1, /* kg_engine_submit refused the request: status says why */
    KG_RUNNER_FATAL = 2,    /* the backend failed; the runner has stopped stepping */
} kg_runner_event_kind_t;

typedef struct kg_runner_event {
    kg_runner_event_kind_t kind;
    kg_status_t status;
    int64_t ts_us; /* kg_clock_us() when the step that made it ended */
    int64_t step;  /* that step's number (kg_runner_steps once it ended) */
    kg_completion_t c;
} kg_runner_event_t;

/* Engine figures for metrics and health, updated by the engine thread
 * after every step, read by anyone. */
typedef struct kg_runner_gauges {
    _Atomic int32_t n_waiting, n_running, kv_blocks_used, kv_blocks_total, kv_blocks_cached;
    _Atomic int64_t n_steps, n_prefill_tokens, n_decode_tokens, n_prefix_hit_tokens,
        n_prompt_tokens, n_preemptions, n_tier_preemptions;
    _Atomic int64_t last_loop_us; /* kg_clock_us() of the last loop turn (liveness) */
    _Atomic int64_t step_us_total;
    _Atomic int64_t n_stepped; /* kg_engine_step calls that ended (kg_runner_steps) */
    _Atomic int32_t last_batch_tokens;
    _Atomic int64_t kv_bytes_per_token; /* kg_engine_stats_t's */
    _Atomic int64_t state_bytes;        /* kg_engine_stats_t's */
    _Atomic int64_t weight_bytes;       /* kg_engine_stats_t's */
    _Atomic int64_t snapshot_bytes, n_state_saves, n_state_restores;
    _Atomic int64_t n_grammar_masks, grammar_mask_ns, n_grammar_forced_tokens;
    kg_histogram_t step; /* duration of each step */
    /* mixture of experts (moe_n_expert 0: a dense model): rows each expert
     * took, rows through expert GEMMs and groups run, all layers and steps */
    _Atomic int32_t moe_n_expert;
    _Atomic int64_t moe_routed, moe_groups;
    _Atomic int64_t moe_per_expert[KG_MOE_MAX_EXPERTS];
} kg_runner_gauges_t;

/** A runner over `engine` (borrowed; must outlive the runner), with queues
 * sized for `max_inflight` requests. The thread starts here. */
kg_runner_t *
kg_runner_new(kg_engine_t *engine, int32_t max_inflight, char *errstr, size_t errstr_size);
/** Stop the thread (finishing the current step) and free. */
void kg_runner_free(kg_runner_t *r);

/** Hand a request to the engine; its prompt and logit bias are copied. KG_QUEUE_FULL when
 * the command queue is full. @thread kafka */
KG_NODISCARD kg_status_t kg_runner_submit(kg_runner_t *r, const kg_request_t *req);
/** Cancel a request by id (its CANCELLED finish comes back as an event).
 * @thread kafka */
KG_NODISCARD kg_status_t kg_runner_cancel(kg_runner_t *r, uint64_t id);
/** Cancel one choice of a request (kg_engine_cancel_choice). @thread kafka */
KG_NODISCARD kg_status_t kg_runner_cancel_choice(kg_runner_t *r, uint64_t id, int32_t choice);

/** Take up to `max` events, waiting up to timeout_ms for the first.
 * @thread kafka */
int kg_runner_poll(kg_runner_t *r, kg_runner_event_t *out, int max, int timeout_ms);

/** Steps the engine thread has finished so far: a command handed over now
 * takes effect in step kg_runner_steps() + 2 at the latest (the step that
 * may be running, then the next, which starts with the commands). @thread any */
int64_t kg_runner_steps(const kg_runner_t *r);

/** Whether the backend failed (a FATAL event was sent). */
bool kg_runner_is_dead(const kg_runner_t *r);

const kg_runner_gauges_t *kg_runner_gauges(const kg_runner_t *r);
