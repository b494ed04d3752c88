/* kg_trace: a job's trace context, from its message's headers to its events.
 *
 * Pipelines trace a request across services with W3C trace context in Kafka
 * headers (OpenTelemetry's messaging conventions): `traceparent`,
 * `tracestate` and `baggage`. The worker copies those (and the headers
 * --propagate-headers names) from a job message onto every message it makes
 * for that job: its token, done and error events and its dead-letter copies,
 * so a trace goes on through the worker. The copy is bounded (a hostile
 * producer must not blow up the events): the last instance of each name is
 * taken, in the order traceparent, tracestate, baggage, then the named ones,
 * while the copied bytes stay within the worker's cap (kg_trace_take); a
 * header that would go over is left out whole, never cut, and said in
 * `dropped`.
 *
 * A valid traceparent (version 00 as W3C defines it, or a later version's
 * first four fields) gives the job's trace_id, which every log line about
 * the job carries (kg_log_scope), and the parent of the worker's own span,
 * which the terminal event carries (kg_trace_span). An invalid one is still
 * copied verbatim: it is the producer's header, not the worker's to judge.
 *
 * The events carry the job's traceparent verbatim rather than one naming
 * the worker's span (as an OpenTelemetry producer span would): kgen exports
 * no spans itself, so a parent id only a done event's reader could resolve
 * would leave every downstream span with a missing parent in a backend that
 * sees only the headers. Copied verbatim, downstream spans hang under the
 * job's producer like the worker's span does, and the trace stays whole
 * (docs/CONTRACT.md). @thread kafka */
#pragma once

#include "../core/kg_parse.h"
#include "../core/kg_status.h"
#include "../schema/kg_codec_event.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_TRACE_MAX_NAMES                                                                         \
    (3 + KG_HEADER_NAMES_MAX)                       /* traceparent, tracestate, baggage, 13 named */
#define KG_TRACE_NAME_MAX        KG_HEADER_NAME_MAX /* bytes of a name --propagate-headers may give */
#define KG_TRACE_BYTES_MAX       16384 /* copied bytes (kg_trace_headers_size) of one job, at most */
#define KG_TRACE_HEADER_OVERHEAD 8     /* a header's framing in a record, counted per header */

/* The header names copied, in order. */
typedef struct kg_trace_names {
    int n;
    char name[KG_TRACE_MAX_NAMES][KG_TRACE_NAME_MAX + 1];
} kg_trace_names_t;

/* One job's trace context. */
typedef struct kg_trace {
    rd_kafka_headers_t *hdrs; /* owned: the headers to copy onto its messages; NULL: none */
    size_t hdrs_size;         /* kg_trace_headers_size(hdrs) */
    bool valid;               /* a valid traceparent: the ids below are set */
    char trace_id[KG_TRACE_ID_HEX + 1];
    char parent_id[KG_SPAN_ID_HEX + 1];
    uint8_t flags;
    int64_t start_unix_nano; /* when the worker took the message: its span's start */
    char log_fields[48];     /* " trace_id=<32 hex>" for kg_log_scope; "" without a valid one */
    int n_dropped;           /* headers over the cap, not copied */
    char dropped[KG_TRACE_NAME_MAX + 1]; /* the first of them */
    size_t dropped_size;                 /* its bytes */
} kg_trace_t;

/** The names to copy: traceparent, tracestate, baggage, then those of
 * `extra` (a comma-separated list, spaces around names ignored; "" for none;
 * duplicates kept once). KG_ERR_INVALID with errstr for an empty, too long
 * (KG_TRACE_NAME_MAX) or non-token name (RFC 9110 tchar), a kgen-* name (the
 * worker's own headers), or too many (KG_TRACE_MAX_NAMES in all). */
KG_NODISCARD kg_status_t kg_trace_names_init(kg_trace_names_t *tn,
                                             const char *extra,
                                             char *errstr,
                                             size_t errstr_size);

/** Whether (v, n) is a valid W3C traceparent; on true the ids (lowercase
 * hex, NUL-terminated) and the flags are set. Version 00 must be exactly
 * 55 bytes; a later version (not ff) at least that, its first fields read
 * as 00's and a '-' after them when longer. Ids that are all zero, upper
 * case hex or any other deviation make it invalid. @thread any */
bool kg_trace_parse_traceparent(const void *v,
                                size_t n,
                                char trace_id[KG_TRACE_ID_HEX + 1],
                                char parent_id[KG_SPAN_ID_HEX + 1],
                                uint8_t *flags);

/** Fill `t` from a job message's headers (`src` may be NULL): the named
 * headers, each at most once (its last instance), while their bytes stay
 * within `cap`; the traceparent's ids when it is valid. start_unix_nano is
 * set to now. KG_ERR_NOMEM leaves `t` empty (clear it either way). */
KG_NODISCARD kg_status_t kg_trace_take(kg_trace_t *t,
                                       const rd_kafka_headers_t *src,
                                       const kg_trace_names_t *tn,
                                       size_t cap);

/** A deep copy (for a held message). KG_ERR_NOMEM leaves `dst` empty. */
KG_NODISCARD kg_status_t kg_trace_copy(kg_trace_t *dst, const kg_trace_t *src);

/** Free the headers; `t` is empty after. NULL does nothing. */
void kg_trace_clear(kg_trace_t *t);

/** The worker's span of the job, ending at end_unix_nano, with a new random
 * span id; false (nothing set) when the job had no valid traceparent. */
bool kg_trace_span(const kg_trace_t *t, int64_t end_unix_nano, kg_event_span_t *out);

/** The bytes headers take as kg_trace counts them: names, values and
 * KG_TRACE_HEADER_OVERHEAD each. NULL: 0. @thread any */
size_t kg_trace_headers_size(const rd_kafka_headers_t *h);

/** " trace_id=<hex>" (out: 48 bytes) from the traceparent among `h` (may be
 * NULL), or "" when there is no valid one: for the log lines about a
 * message the worker made (a delivery report). @thread any */
void kg_trace_log_fields_of(const rd_kafka_headers_t *h, char *out, size_t size);

/** Nanoseconds since the Unix epoch (CLOCK_REALTIME). @thread any */
int64_t kg_trace_unix_nano(void);
