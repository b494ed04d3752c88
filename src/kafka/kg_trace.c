/* kg_trace: a job's trace context (W3C traceparent, tracestate, baggage and
 * the headers --propagate-headers names) from its message to its events;
 * kg_trace.h says what is copied, how it is bounded, and why the events
 * carry the job's traceparent verbatim. */
#include "kg_trace.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

static const char *const w3c_names[] = {"traceparent", "tracestate", "baggage"};

// ---- names ----

static bool names_has(const kg_trace_names_t *tn, const char *name) {
    for (int i = 0; i < tn->n; i++) {
        if (strcmp(tn->name[i], name) == 0) {
            return true;
        }
    }
    return false;
}

kg_status_t
kg_trace_names_init(kg_trace_names_t *tn, const char *extra, char *errstr, size_t errstr_size) {
    memset(tn, 0, sizeof(*tn));
    for (size_t i = 0; i < sizeof(w3c_names) / sizeof(w3c_names[0]); i++) {
        snprintf(tn->name[tn->n++], sizeof(tn->name[0]), "%s", w3c_names[i]);
    }
    kg_header_names_t extra_names; /* the rules live in kg_parse, shared with kg_config */
    char why[256];
    if (!kg_parse_header_names(extra, &extra_names, why, sizeof(why))) {
        snprintf(errstr, errstr_size, "--propagate-headers: %s", why);
        return KG_ERR_INVALID;
    }
    for (int i = 0; i < extra_names.n; i++) {
        if (!names_has(tn, extra_names.name[i])) {
            snprintf(tn->name[tn->n++], sizeof(tn->name[0]), "%s", extra_names.name[i]);
        }
    }
    return KG_OK;
}

// ---- traceparent ----

/* n lowercase hex digits at s, copied to out (n + 1) when `out`; false when
 * any is not one, or (`nonzero`) all are '0'. */
static bool lower_hex(const char *s, size_t n, bool nonzero, char *out) {
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return false;
        }
        any |= c != '0';
    }
    if (nonzero && !any) {
        return false;
    }
    if (out) {
        memcpy(out, s, n);
        out[n] = '\0';
    }
    return true;
}

static int hex_val(char c) {
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

bool kg_trace_parse_traceparent(const void *v,
                                size_t n,
                                char trace_id[KG_TRACE_ID_HEX + 1],
                                char parent_id[KG_SPAN_ID_HEX + 1],
                                uint8_t *flags) {
    /* version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 */
    enum { LEN = 55 };
    const char *s = v;
    if (!s || n < LEN || s[2] != '-' || s[35] != '-' || s[52] != '-' ||
        !lower_hex(s, 2, false, NULL) || strncmp(s, "ff", 2) == 0) {
        return false;
    }
    bool v00 = strncmp(s, "00", 2) == 0;
    if ((v00 && n != LEN) || (!v00 && n > LEN && s[LEN] != '-')) {
        return false; /* 00 is exactly 55 bytes; a later version may add fields after a '-' */
    }
    char tid[KG_TRACE_ID_HEX + 1], pid[KG_SPAN_ID_HEX + 1];
    if (!lower_hex(s + 3, KG_TRACE_ID_HEX, true, tid) ||
        !lower_hex(s + 36, KG_SPAN_ID_HEX, true, pid) || !lower_hex(s + 53, 2, false, NULL)) {
        return false;
    }
    memcpy(trace_id, tid, sizeof(tid));
    memcpy(parent_id, pid, sizeof(pid));
    *flags = (uint8_t)(hex_val(s[53]) * 16 + hex_val(s[54]));
    return true;
}

// ---- a job's trace context ----

int64_t kg_trace_unix_nano(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

size_t kg_trace_headers_size(const rd_kafka_headers_t *h) {
    size_t total = 0;
    const char *name;
    const void *v;
    size_t n;
    for (size_t i = 0; h && rd_kafka_header_get_all(h, i, &name, &v, &n) == 0; i++) {
        total += strlen(name) + n + KG_TRACE_HEADER_OVERHEAD;
    }
    return total;
}

static void set_ids(kg_trace_t *t, const void *v, size_t n) {
    t->valid = kg_trace_parse_traceparent(v, n, t->trace_id, t->parent_id, &t->flags);
    if (t->valid) {
        snprintf(t->log_fields, sizeof(t->log_fields), " trace_id=%s", t->trace_id);
    }
}

kg_status_t kg_trace_take(kg_trace_t *t,
                          const rd_kafka_headers_t *src,
                          const kg_trace_names_t *tn,
                          size_t cap) {
    memset(t, 0, sizeof(*t));
    t->start_unix_nano = kg_trace_unix_nano();
    for (int i = 0; src && i < tn->n; i++) {
        const void *v = NULL;
        size_t n = 0;
        if (rd_kafka_header_get_last(src, tn->name[i], &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            continue;
        }
        size_t size = strlen(tn->name[i]) + n + KG_TRACE_HEADER_OVERHEAD;
        if (t->hdrs_size + size > cap) {
            if (t->n_dropped++ == 0) {
                snprintf(t->dropped, sizeof(t->dropped), "%s", tn->name[i]);
                t->dropped_size = size;
            }
            continue;
        }
        if (!t->hdrs && !(t->hdrs = rd_kafka_headers_new(4))) {
            kg_trace_clear(t);
            return KG_ERR_NOMEM;
        }
        rd_kafka_header_add(t->hdrs, tn->name[i], -1, v, v ? (ssize_t)n : 0);
        t->hdrs_size += size;
        if (i == 0) {
            set_ids(t, v, n); /* tn->name[0] is traceparent */
        }
    }
    return KG_OK;
}

kg_status_t kg_trace_copy(kg_trace_t *dst, const kg_trace_t *src) {
    *dst = *src;
    if (src->hdrs && !(dst->hdrs = rd_kafka_headers_copy(src->hdrs))) {
        memset(dst, 0, sizeof(*dst));
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

void kg_trace_clear(kg_trace_t *t) {
    if (!t) {
        return;
    }
    if (t->hdrs) {
        rd_kafka_headers_destroy(t->hdrs);
    }
    memset(t, 0, sizeof(*t));
}

/* 8 random bytes, not all zero (W3C: an all-zero span id is invalid), as hex. */
static void new_span_id(char out[KG_SPAN_ID_HEX + 1]) {
    uint64_t id = 0;
    while (id == 0) {
        if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
            /* no entropy source: the clock still differs between spans */
            id = (uint64_t)kg_trace_unix_nano() * 0x9e3779b97f4a7c15u;
        }
    }
    snprintf(out, KG_SPAN_ID_HEX + 1, "%016llx", (unsigned long long)id);
}

bool kg_trace_span(const kg_trace_t *t, int64_t end_unix_nano, kg_event_span_t *out) {
    if (!t || !t->valid) {
        return false;
    }
    memset(out, 0, sizeof(*out));
    memcpy(out->trace_id, t->trace_id, sizeof(out->trace_id));
    memcpy(out->parent_span_id, t->parent_id, sizeof(out->parent_span_id));
    new_span_id(out->span_id);
    out->start_unix_nano = t->start_unix_nano;
    out->end_unix_nano = end_unix_nano > t->start_unix_nano ? end_unix_nano : t->start_unix_nano;
    return true;
}

void kg_trace_log_fields_of(const rd_kafka_headers_t *h, char *out, size_t size) {
    const void *v = NULL;
    size_t n = 0;
    char tid[KG_TRACE_ID_HEX + 1], pid[KG_SPAN_ID_HEX + 1];
    uint8_t flags;
    out[0] = '\0';
    if (h && rd_kafka_header_get_last(h, "traceparent", &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        kg_trace_parse_traceparent(v, n, tid, pid, &flags)) {
        snprintf(out, size, " trace_id=%s", tid);
    }
}
