/* kg_codec_util: how the decoders read JSON values, shared by the job
 * decoder (kg_codec.c), the event decoder (kg_codec_event_decode.c) and the
 * OpenAI translation (kg_openai.c). A leaf: it calls nothing else of
 * src/schema/, which is what keeps those files out of a call loop. */
#include "kg_codec_int.h"
#include "kg_job.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- values ----

/* A short description of a JSON value for error messages: numbers and
 * short strings verbatim (non-printable bytes as '?'), others by type. */
void kg_codec_describe_json(const json_t *v, char *out, size_t size) {
    if (!v) { /* a required member that is not there */
        snprintf(out, size, "nothing");
    } else if (json_is_integer(v)) {
        snprintf(out, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else if (json_is_real(v)) {
        snprintf(out, size, "%g", json_real_value(v));
    } else if (json_is_string(v)) {
        char preview[28];
        size_t n = json_string_length(v);
        size_t k = n < 24 ? n : 24;
        const char *s = json_string_value(v);
        for (size_t i = 0; i < k; i++) {
            unsigned char c = (unsigned char)s[i];
            preview[i] = (c >= 0x20 && c < 0x7f && c != '"') ? (char)c : '?';
        }
        preview[k] = '\0';
        snprintf(out, size, "\"%s\"%s", preview, n > k ? "..." : "");
    } else if (json_is_true(v) || json_is_false(v)) {
        snprintf(out, size, "%s", json_is_true(v) ? "true" : "false");
    } else if (json_is_null(v)) {
        snprintf(out, size, "null");
    } else if (json_is_array(v)) {
        /* "expected a non-empty array ..., got an array" told the sender nothing (issue 30) */
        size_t n = json_array_size(v);
        if (n == 0) {
            snprintf(out, size, "an empty array");
        } else {
            snprintf(out, size, "an array of %zu item%s", n, n == 1 ? "" : "s");
        }
    } else {
        snprintf(out, size, "%s", json_object_size(v) == 0 ? "an empty object" : "an object");
    }
}

/* An integer in [lo, hi]; integral reals (3.0) count, as in JSON Schema. */
bool kg_codec_as_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    int64_t i;
    if (json_is_integer(v)) {
        i = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        // 2^63 is the first double outside int64; check before converting.
        if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
            return false;
        }
        i = (int64_t)d;
    } else {
        return false;
    }
    if (i < lo || i > hi) {
        return false;
    }
    *out = i;
    return true;
}

/* malloc'ed copy of `len` bytes plus a NUL. */
char *kg_codec_dup_bytes(const char *s, size_t len) {
    char *p = malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

static bool is_id_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
}

bool kg_codec_is_request_id(const char *s, size_t len) {
    if (len < 1 || len > KG_JOB_REQUEST_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (!is_id_char(s[i])) {
            return false;
        }
    }
    return true;
}

// ---- raw metadata text ----
/* The input was already accepted by jansson, so these scanners can rely on
 * well-formed JSON. They loop instead of recursing. */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

/* p at an opening quote; returns the position after the closing one. */
static const char *skip_string(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\') {
            p++;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return end;
}

static const char *skip_value(const char *p, const char *end) {
    if (p < end && *p == '"') {
        return skip_string(p, end);
    }
    if (p < end && (*p == '{' || *p == '[')) {
        size_t depth = 0;
        while (p < end) {
            if (*p == '"') {
                p = skip_string(p, end);
                continue;
            }
            if (*p == '{' || *p == '[') {
                depth++;
            } else if ((*p == '}' || *p == ']') && --depth == 0) {
                return p + 1;
            }
            p++;
        }
        return end;
    }
    while (p < end && !strchr(",]} \t\n\r", *p)) {
        p++;
    }
    return p;
}

/* The text of the value of the `index`-th member of the top-level object. */
static bool member_span(const char *buf, size_t len, long index, const char **vs, const char **ve) {
    const char *end = buf + len;
    const char *p = skip_ws(buf, end);
    if (p >= end || *p != '{') {
        return false;
    }
    p++;
    for (long i = 0;; i++) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') {
            return false;
        }
        p = skip_ws(skip_string(p, end), end);
        if (p >= end || *p != ':') {
            return false;
        }
        *vs = skip_ws(p + 1, end);
        *ve = skip_value(*vs, end);
        if (i == index) {
            return *ve > *vs;
        }
        p = skip_ws(*ve, end);
        if (p >= end || *p != ',') {
            return false;
        }
        p++;
    }
}

/* Copy JSON text, dropping whitespace outside strings. */
static char *compact_copy(const char *s, const char *end) {
    char *out = malloc((size_t)(end - s) + 1);
    char *o = out;
    bool in_str = false;
    if (!out) {
        return NULL;
    }
    for (const char *p = s; p < end; p++) {
        if (in_str) {
            *o++ = *p;
            if (*p == '\\' && p + 1 < end) {
                *o++ = *++p;
            } else if (*p == '"') {
                in_str = false;
            }
        } else if (*p == '"') {
            in_str = true;
            *o++ = *p;
        } else if (!strchr(" \t\n\r", *p)) {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

/* Position of `key` among the members of `obj` in document order: jansson
 * keeps insertion order, and duplicate keys were rejected. */
static long member_index(json_t *obj, const char *key) {
    const char *k;
    json_t *v;
    long i = 0;
    json_object_foreach(obj, k, v) {
        if (strcmp(k, key) == 0) {
            return i;
        }
        i++;
    }
    return -1;
}

/* The producer's metadata text, compacted; falls back to jansson's
 * serialization should the scan ever disagree with the parser, or when
 * there is no text (buf NULL: a job translated from an OpenAI shape). */
char *kg_codec_metadata_text(json_t *root, json_t *meta, const char *buf, size_t len) {
    const char *vs = NULL;
    const char *ve = NULL;
    long idx = buf ? member_index(root, "metadata") : -1;
    if (idx >= 0 && member_span(buf, len, idx, &vs, &ve) && *vs == '{') {
        return compact_copy(vs, ve);
    }
    return json_dumps(meta, JSON_COMPACT | JSON_ENCODE_ANY);
}
