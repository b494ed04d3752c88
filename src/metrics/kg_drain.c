/* kg_drain: the drain-time estimate; see kg_drain.h. */
#include "kg_drain.h"

#define JOB_ALPHA      0.1
#define ESTIMATE_ALPHA 0.3

void kg_drain_init(kg_drain_t *d) {
    d->job_s = 0;
    d->estimate_s = 0;
    d->has_estimate = false;
    atomic_store(&d->seconds_milli, -1);
}

void kg_drain_observe_job(kg_drain_t *d, int64_t job_us) {
    double s = job_us > 0 ? (double)job_us / 1e6 : 0.0;
    d->job_s = d->job_s > 0 ? d->job_s + JOB_ALPHA * (s - d->job_s) : (s > 0 ? s : 1e-6);
}

double kg_drain_update(kg_drain_t *d, int64_t lag, int64_t inflight, int32_t slots) {
    if (d->job_s <= 0) {
        return -1;
    }
    int64_t backlog = (lag > 0 ? lag : 0) + (inflight > 0 ? inflight : 0);
    double raw = (double)backlog * d->job_s / (double)(slots > 0 ? slots : 1);
    d->estimate_s = d->has_estimate ? d->estimate_s + ESTIMATE_ALPHA * (raw - d->estimate_s) : raw;
    d->has_estimate = true;
    atomic_store(&d->seconds_milli, (int64_t)(d->estimate_s * 1000.0 + 0.5));
    return d->estimate_s;
}

double kg_drain_seconds(const kg_drain_t *d) {
    int64_t ms = atomic_load(&d->seconds_milli);
    return ms < 0 ? -1.0 : (double)ms / 1000.0;
}
