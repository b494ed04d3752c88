/* kg_drain: how long this worker needs to drain its share of the backlog,
 * the autoscaling signal `kgen_estimated_drain_seconds`.
 *
 * estimate = (lag + jobs in flight) x mean job time / slots, smoothed.
 *   lag        messages behind the end of the partitions this worker holds
 *              (the sum of kgen_consumer_lag_messages);
 *   in flight  jobs taken off Kafka and not answered yet;
 *   job time   an exponentially weighted mean (alpha 0.1, about the last 20
 *              jobs) of each job's time in the engine, from its submission
 *              to its last completion, so the wait in front of the engine is
 *              not counted twice;
 *   slots      --max-batch-size: with a backlog every slot runs.
 * The estimate itself is smoothed the same way (alpha 0.3 per update,
 * once a second) so one burst does not flap a scaler. Before the first job
 * has finished there is no job time and so no estimate (has_estimate is
 * false; the series is left out of /metrics rather than reported as 0).
 *
 * Not thread-safe: the kafka thread owns it; `seconds_milli` is the atomic
 * copy the HTTP thread reads. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct kg_drain {
    double job_s;      /* smoothed time of one job in the engine, seconds; 0 until known */
    double estimate_s; /* smoothed drain estimate, seconds */
    bool has_estimate;
    _Atomic int64_t seconds_milli; /* estimate_s x 1000, or -1 while there is none */
} kg_drain_t;

/** Start with no estimate. */
void kg_drain_init(kg_drain_t *d);

/** A job spent `job_us` microseconds in the engine (submitted -> finished). */
void kg_drain_observe_job(kg_drain_t *d, int64_t job_us);

/** Update the estimate from the backlog (`lag` messages behind plus
 * `inflight` taken jobs) and the `slots` that run them (>= 1). Returns the
 * smoothed estimate in seconds, or -1 while no job time is known. */
double kg_drain_update(kg_drain_t *d, int64_t lag, int64_t inflight, int32_t slots);

/** The last estimate in seconds, or -1 while there is none. @thread any */
double kg_drain_seconds(const kg_drain_t *d);
