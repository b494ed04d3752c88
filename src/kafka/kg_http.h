/* kg_http: /metrics, /healthz and /readyz over libmicrohttpd. It lives
 * beside the worker because it serves the worker's and the engine's
 * figures; src/metrics holds only the counters and histograms.
 *
 * Served from libmicrohttpd's own thread, reading only atomics of the
 * worker and the engine runner (docs/DESIGN.md §1), so a scrape never waits on a
 * forward step or a Kafka poll.
 *   /metrics  Prometheus text format, kgen_ prefix, units in names
 *   /healthz  200 while both loops are turning (each turned within 30 s)
 *   /readyz   200 once the model is loaded and partitions are assigned */
#pragma once

#include "kg_worker.h"

#include <stddef.h>

typedef struct kg_http kg_http_t;

/** Listen on `address` (an IPv4 or IPv6 literal; "0.0.0.0", the worker's
 * default, is every interface, so Prometheus in another container can
 * scrape it) and `port`. NULL with errstr set when the address is not an IP
 * literal or the port cannot be bound. */
kg_http_t *
kg_http_new(const char *address, int port, kg_worker_t *w, char *errstr, size_t errstr_size);
void kg_http_free(kg_http_t *http);

/** The /metrics text (malloc'ed; the caller frees). For tests. */
char *kg_http_metrics_text(kg_worker_t *w, size_t *len);
