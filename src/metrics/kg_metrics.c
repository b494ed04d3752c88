/* kg_metrics: histogram buckets and their Prometheus text. */
#include "kg_metrics.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double tpot_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0, 15.0,
                                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
static const double step_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,    0.25,  0.5,    1.0,   2.5,  5.0};

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

void kg_histogram_init(kg_histogram_t *h, kg_hist_kind_t kind) {
    switch (kind) {
    case KG_HIST_TTFT:
        h->bounds = ttft_bounds;
        h->n_buckets = LEN(ttft_bounds);
        break;
    case KG_HIST_TPOT:
        h->bounds = tpot_bounds;
        h->n_buckets = LEN(tpot_bounds);
        break;
    case KG_HIST_E2E:
        h->bounds = e2e_bounds;
        h->n_buckets = LEN(e2e_bounds);
        break;
    case KG_HIST_STEP:
        h->bounds = step_bounds;
        h->n_buckets = LEN(step_bounds);
        break;
    }
    for (int i = 0; i <= KG_HIST_MAX_BUCKETS; i++) {
        atomic_store(&h->counts[i], 0);
    }
    atomic_store(&h->count, 0);
    atomic_store(&h->sum_us, 0);
}

void kg_histogram_observe(kg_histogram_t *h, int64_t us) {
    if (us < 0) {
        us = 0;
    }
    double s = (double)us / 1e6;
    int b = 0;
    while (b < h->n_buckets && s > h->bounds[b]) {
        b++;
    }
    atomic_fetch_add_explicit(&h->counts[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us, memory_order_relaxed);
}

void kg_histogram_write(const kg_histogram_t *h, FILE *f, const char *name, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n_buckets; b++) {
        cum += atomic_load_explicit(&h->counts[b], memory_order_relaxed);
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], (unsigned long long)cum);
    }
    cum += atomic_load_explicit(&h->counts[h->n_buckets], memory_order_relaxed);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    fprintf(f, "%s_sum %.6f\n%s_count %llu\n", name,
            (double)atomic_load_explicit(&h->sum_us, memory_order_relaxed) / 1e6, name,
            (unsigned long long)cum);
}
