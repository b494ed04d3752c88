/* kg_metrics: lock-free counters and histograms for /metrics.
 *
 * Written by the kafka and engine threads with relaxed atomics, read by the
 * HTTP thread; a scrape may see a histogram mid-update (a count one ahead of
 * its sum), which Prometheus tolerates. Buckets follow vLLM's choices for
 * the same series where one exists. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#define KG_HIST_MAX_BUCKETS 24

typedef struct kg_histogram {
    int n_buckets;
    const double *bounds;                             /* (n_buckets) upper bounds, seconds */
    _Atomic uint64_t counts[KG_HIST_MAX_BUCKETS + 1]; /* last: +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us; /* sum of observations in microseconds */
} kg_histogram_t;

typedef enum kg_hist_kind {
    KG_HIST_TTFT = 0, /* time to first token */
    KG_HIST_TPOT,     /* time per output token */
    KG_HIST_E2E,      /* end-to-end request latency */
    KG_HIST_STEP,     /* one engine step */
} kg_hist_kind_t;

void kg_histogram_init(kg_histogram_t *h, kg_hist_kind_t kind);
/** Record one observation of `us` microseconds. @thread any */
void kg_histogram_observe(kg_histogram_t *h, int64_t us);
/** Write the Prometheus text of a histogram (with HELP and TYPE lines). */
void kg_histogram_write(const kg_histogram_t *h, FILE *f, const char *name, const char *help);
