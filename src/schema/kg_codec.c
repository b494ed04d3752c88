/* kg_codec: jobs and events between JSON text and plain C structs.
 * With kg_openai.c, the only code of kgen that includes jansson.h (see
 * kg_codec.h). */
#include "kg_codec.h"

#include "../core/kg_log.h"
#include "kg_openai_int.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Our reals have at most 9 (floats) or ~13 (rounded timings) significant
 * digits; 15 prints them short and exact. jansson's default (17) would
 * print 0.7 as 0.69999999999999996. */
#define KG_DUMP_FLAGS      (JSON_COMPACT | JSON_REAL_PRECISION(15))
#define KG_LOAD_FLAGS      (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)
#define KG_LOGPROB_NEG_INF (-9999.0)

void kg_codec_global_init(void) {
    json_object_seed(0);
}

kg_codec_opts_t kg_codec_opts_default(void) {
    kg_codec_opts_t opts = {.max_message_size = KG_CODEC_DEFAULT_MAX_MESSAGE_SIZE,
                            .default_max_tokens = KG_JOB_DEFAULT_MAX_TOKENS,
                            .format = KG_JOB_FORMAT_AUTO};
    return opts;
}

bool kg_codec_job_format_parse(const char *s, size_t len, kg_job_format_t *out) {
    static const struct {
        const char *name;
        kg_job_format_t format;
    } names[] = {{"kgen", KG_JOB_FORMAT_KGEN},
                 {"openai", KG_JOB_FORMAT_OPENAI},
                 {"openai-batch", KG_JOB_FORMAT_OPENAI_BATCH},
                 {"openai-chat", KG_JOB_FORMAT_OPENAI_CHAT},
                 {"openai-completions", KG_JOB_FORMAT_OPENAI_COMPLETION}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strlen(names[i].name) == len && memcmp(names[i].name, s, len) == 0) {
            *out = names[i].format;
            return true;
        }
    }
    return false;
}

// ---- names ----

static const char *const dlq_reason_names[] = {
    [KG_DLQ_NONE] = "none",
    [KG_DLQ_TOO_LARGE] = "too_large",
    [KG_DLQ_INVALID_JSON] = "invalid_json",
    [KG_DLQ_NOT_OBJECT] = "not_object",
    [KG_DLQ_MISSING_REQUEST_ID] = "missing_request_id",
    [KG_DLQ_BAD_REQUEST_ID] = "bad_request_id",
};

static const char *const error_code_names[KG_ERROR_CODE_COUNT_] = {
    [KG_ERROR_INVALID_JOB] = "invalid_job",
    [KG_ERROR_PROMPT_TOO_LONG] = "prompt_too_long",
    [KG_ERROR_MAX_TOKENS_TOO_LARGE] = "max_tokens_too_large",
    [KG_ERROR_EXPIRED] = "expired",
    [KG_ERROR_CANCELLED] = "cancelled",
    [KG_ERROR_UNSUPPORTED_CHAT_TEMPLATE] = "unsupported_chat_template",
    [KG_ERROR_INTERNAL] = "internal",
    [KG_ERROR_QUEUE_FULL] = "queue_full",
    [KG_ERROR_SHUTDOWN] = "shutdown",
    [KG_ERROR_INVALID_SCHEMA] = "invalid_schema",
    [KG_ERROR_MODEL_NOT_FOUND] = "model_not_found",
};

static const char *const finish_reason_names[] = {"stop", "length", "stop_sequence"};
static const char *const event_type_names[] = {"token", "done", "error"};
static const char *const role_names[] = {"system", "user", "assistant", "tool"};

const char *kg_codec_dlq_reason_str(kg_codec_dlq_reason_t reason) {
    if ((int)reason < 0 || (size_t)reason >= sizeof(dlq_reason_names) / sizeof(char *)) {
        return "unknown";
    }
    return dlq_reason_names[reason];
}

const char *kg_error_code_str(kg_error_code_t code) {
    if ((int)code < 0 || code >= KG_ERROR_CODE_COUNT_) {
        return "internal";
    }
    return error_code_names[code];
}

const char *kg_finish_reason_str(kg_finish_reason_t reason) {
    if ((int)reason < 0 || reason > KG_FINISH_REASON_STOP_SEQUENCE) {
        return "unknown";
    }
    return finish_reason_names[reason];
}

const char *kg_event_type_str(kg_event_type_t type) {
    if ((int)type < 0 || type > KG_EVENT_ERROR) {
        return "unknown";
    }
    return event_type_names[type];
}

/* Index of `s` in `names`, or -1. */
static int name_index(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], s) == 0) {
            return i;
        }
    }
    return -1;
}

// ---- small helpers ----

/* A short description of a JSON value for error messages: numbers and
 * short strings verbatim (non-printable bytes as '?'), others by type. */
static void describe(const json_t *v, char *out, size_t size) {
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
    } else {
        snprintf(out, size, "%s", json_is_array(v) ? "an array" : "an object");
    }
}

/* An integer in [lo, hi]; integral reals (3.0) count, as in JSON Schema. */
static bool as_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
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

/* Code points of a UTF-8 string known to be valid (jansson checked it). */
static size_t utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    }
    return n;
}

/* malloc'ed copy of `len` bytes plus a NUL. */
static char *dup_bytes(const char *s, size_t len) {
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

static bool is_request_id(const char *s, size_t len) {
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

void kg_codec_describe_json(const json_t *v, char *out, size_t size) {
    describe(v, out, size);
}

bool kg_codec_is_request_id(const char *s, size_t len) {
    return is_request_id(s, len);
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
static char *metadata_text(json_t *root, json_t *meta, const char *buf, size_t len) {
    const char *vs = NULL;
    const char *ve = NULL;
    long idx = buf ? member_index(root, "metadata") : -1;
    if (idx >= 0 && member_span(buf, len, idx, &vs, &ve) && *vs == '{') {
        return compact_copy(vs, ve);
    }
    return json_dumps(meta, JSON_COMPACT | JSON_ENCODE_ANY);
}

// ---- job fields ----

typedef struct dec {
    json_t *root;
    const char *buf;
    size_t len;
    kg_job_t *job;
    kg_codec_error_t *err;
} dec_t;

static kg_status_t bad_field(dec_t *d, const char *field, const char *expect, const json_t *got) {
    char what[64];
    describe(got, what, sizeof(what));
    snprintf(d->err->message, sizeof(d->err->message), "%s: expected %s, got %s", field, expect,
             what);
    return KG_ERR_INVALID;
}

typedef enum field_kind {
    FK_INT32, /* saturates at INT32_MAX */
    FK_INT64,
    FK_REAL, /* stored as float, saturating at FLT_MAX */
    FK_BOOL,
} field_kind_t;

typedef struct field_spec {
    const char *name;
    field_kind_t kind;
    size_t offset; /* in kg_job_t */
    int64_t ilo, ihi;
    double rlo, rhi;
    bool lo_open; /* FK_REAL: exclusive lower bound */
    const char *expect;
} field_spec_t;

#define JOB_OFF(m) offsetof(kg_job_t, m)
#define INT_F(n, k, m, lo, hi, e)                                                                  \
    { n, k, JOB_OFF(m), lo, hi, 0, 0, false, e }
#define REAL_F(n, m, lo, hi, open, e)                                                              \
    { n, FK_REAL, JOB_OFF(m), 0, 0, lo, hi, open, e }
#define BOOL_F(n, m)                                                                               \
    { n, FK_BOOL, JOB_OFF(m), 0, 0, 0, 0, false, "true or false" }

/* Simple fields in schema order (the first bad one is reported). */
static const field_spec_t job_fields[] = {
    INT_F("max_tokens", FK_INT64, max_tokens, 1, INT64_MAX, "an integer >= 1"),
    REAL_F("temperature", sampling.temperature, 0, 2, false, "a number in 0..2"),
    INT_F("top_k", FK_INT32, sampling.top_k, -1, INT32_MAX, "an integer >= -1 (-1 or 0: off)"),
    REAL_F("top_p", sampling.top_p, 0, 1, true, "a number in (0, 1]"),
    REAL_F("min_p", sampling.min_p, 0, 1, false, "a number in 0..1"),
    REAL_F("repetition_penalty", sampling.repetition_penalty, 0, HUGE_VAL, true, "a number > 0"),
    REAL_F("frequency_penalty", sampling.frequency_penalty, -2, 2, false, "a number in -2..2"),
    REAL_F("presence_penalty", sampling.presence_penalty, -2, 2, false, "a number in -2..2"),
    INT_F("seed", FK_INT64, sampling.seed, 0, INT64_MAX, "an integer in 0..9223372036854775807"),
    BOOL_F("stream", stream),
    INT_F("logprobs", FK_INT32, sampling.n_logprobs, 0, KG_MAX_LOGPROBS, "an integer in 0..20"),
    INT_F(
        "deadline_ms", FK_INT64, deadline_ms, 1, INT64_MAX, "an integer >= 1 (epoch milliseconds)"),
    INT_F("priority", FK_INT32, priority, INT32_MIN, INT32_MAX, "a 32-bit integer"),
    BOOL_F("ignore_eos", ignore_eos),
    INT_F("n", FK_INT32, n, 1, KG_JOB_MAX_N, "an integer in 1..16"),
};

static kg_status_t decode_simple(dec_t *d, const field_spec_t *f, const json_t *v) {
    char *dst = (char *)d->job + f->offset;
    int64_t i;
    if (f->kind == FK_BOOL) {
        if (!json_is_boolean(v)) {
            return bad_field(d, f->name, f->expect, v);
        }
        *(bool *)dst = json_is_true(v);
    } else if (f->kind == FK_REAL) {
        double x = json_number_value(v);
        bool lo_ok = f->lo_open ? x > f->rlo : x >= f->rlo;
        if (!json_is_number(v) || !lo_ok || x > f->rhi) {
            return bad_field(d, f->name, f->expect, v);
        }
        *(float *)dst = x > FLT_MAX ? FLT_MAX : (float)x;
    } else if (!as_int(v, f->ilo, f->ihi, &i)) {
        return bad_field(d, f->name, f->expect, v);
    } else if (f->kind == FK_INT32) {
        *(int32_t *)dst = i > INT32_MAX ? INT32_MAX : (int32_t)i;
    } else {
        memcpy(dst, &i, sizeof(i)); // int64_t or uint64_t (seed), both 8 bytes
    }
    return KG_OK;
}

static kg_status_t decode_prompt_text(dec_t *d, const json_t *v) {
    if (!json_is_string(v) || json_string_length(v) == 0) {
        return bad_field(d, "prompt", "a non-empty string", v);
    }
    d->job->prompt_len = json_string_length(v);
    d->job->prompt = dup_bytes(json_string_value(v), d->job->prompt_len);
    return d->job->prompt ? KG_OK : KG_ERR_NOMEM;
}

static kg_status_t decode_prompt_tokens(dec_t *d, const json_t *v) {
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0) {
        return bad_field(d, "prompt_tokens", "a non-empty array of token ids", v);
    }
    if (n > INT32_MAX) {
        return bad_field(d, "prompt_tokens", "at most 2^31-1 ids", v);
    }
    d->job->prompt_tokens = malloc(n * sizeof(int32_t));
    if (!d->job->prompt_tokens) {
        return KG_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        if (!as_int(json_array_get(v, i), 0, INT32_MAX, &id)) {
            char field[48];
            snprintf(field, sizeof(field), "prompt_tokens[%zu]", i);
            return bad_field(d, field, "an integer in 0..2147483647", json_array_get(v, i));
        }
        d->job->prompt_tokens[i] = (int32_t)id;
    }
    d->job->n_prompt_tokens = (int32_t)n;
    return KG_OK;
}

static kg_status_t decode_message(dec_t *d, size_t i, const json_t *m) {
    char field[64];
    kg_chat_message_t *out = &d->job->messages[i];
    if (!json_is_object(m)) {
        snprintf(field, sizeof(field), "messages[%zu]", i);
        return bad_field(d, field, "an object with role and content", m);
    }
    const json_t *role = json_object_get(m, "role");
    const json_t *content = json_object_get(m, "content");
    int r = json_is_string(role) ? name_index(role_names, 4, json_string_value(role)) : -1;
    if (r < 0 || strlen(json_string_value(role)) != json_string_length(role)) {
        snprintf(field, sizeof(field), "messages[%zu].role", i);
        return bad_field(d, field, "one of system, user, assistant, tool",
                         role ? role : json_null());
    }
    if (!json_is_string(content) ||
        strlen(json_string_value(content)) != json_string_length(content)) {
        snprintf(field, sizeof(field), "messages[%zu].content", i);
        return bad_field(d, field, "a string without U+0000", content ? content : json_null());
    }
    out->role = role_names[r];
    out->content = dup_bytes(json_string_value(content), json_string_length(content));
    return out->content ? KG_OK : KG_ERR_NOMEM;
}

static kg_status_t decode_messages(dec_t *d, const json_t *v) {
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0) {
        return bad_field(d, "messages", "a non-empty array of {role, content}", v);
    }
    if (n > INT32_MAX) {
        return bad_field(d, "messages", "at most 2^31-1 messages", v);
    }
    d->job->messages = calloc(n, sizeof(kg_chat_message_t));
    if (!d->job->messages) {
        return KG_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kg_status_t st = decode_message(d, i, json_array_get(v, i));
        d->job->n_messages = (int32_t)i + 1; // kg_job_free frees what was filled
        if (st != KG_OK) {
            return st;
        }
    }
    return KG_OK;
}

/* Exactly one of prompt, prompt_tokens, messages (null counts as given:
 * it is a type error, not an absence). */
static kg_status_t decode_prompt(dec_t *d) {
    static const char *const keys[] = {"prompt", "prompt_tokens", "messages"};
    const json_t *vals[3];
    int n_given = 0;
    int which = -1;
    for (int k = 0; k < 3; k++) {
        vals[k] = json_object_get(d->root, keys[k]);
        if (vals[k]) {
            n_given++;
            which = k;
        }
    }
    if (n_given != 1) {
        snprintf(d->err->message, sizeof(d->err->message),
                 "prompt: expected exactly one of prompt, prompt_tokens or messages, got %d",
                 n_given);
        return KG_ERR_INVALID;
    }
    d->job->prompt_kind = (kg_prompt_kind_t)which;
    if (which == KG_PROMPT_TEXT) {
        return decode_prompt_text(d, vals[which]);
    }
    if (which == KG_PROMPT_TOKENS) {
        return decode_prompt_tokens(d, vals[which]);
    }
    return decode_messages(d, vals[which]);
}

static bool is_stop_string(const json_t *s) {
    size_t len = json_string_length(s);
    size_t chars = json_is_string(s) ? utf8_chars(json_string_value(s), len) : 0;
    return json_is_string(s) && chars >= 1 && chars <= KG_JOB_STOP_MAX_CHARS &&
           strlen(json_string_value(s)) == len;
}

static kg_status_t decode_stop(dec_t *d, const json_t *v) {
    static const char expect[] = "a string or an array of at most 8 strings, each 1..256 "
                                 "characters without U+0000";
    bool one = json_is_string(v);
    size_t n = one ? 1 : json_array_size(v);
    if ((!one && !json_is_array(v)) || n > KG_JOB_MAX_STOP) {
        return bad_field(d, "stop", expect, v);
    }
    d->job->stop = calloc(n ? n : 1, sizeof(char *));
    if (!d->job->stop) {
        return KG_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *s = one ? v : json_array_get(v, i);
        char field[32];
        if (!is_stop_string(s) && one) {
            return bad_field(d, "stop", expect, s);
        }
        if (!is_stop_string(s)) {
            snprintf(field, sizeof(field), "stop[%zu]", i);
            return bad_field(d, field, "a string of 1..256 characters without U+0000", s);
        }
        d->job->stop[i] = dup_bytes(json_string_value(s), json_string_length(s));
        if (!d->job->stop[i]) {
            return KG_ERR_NOMEM;
        }
        d->job->n_stop = (int32_t)i + 1;
    }
    return KG_OK;
}

static kg_status_t decode_schema_version(dec_t *d, const json_t *v) {
    int64_t ver;
    if (!as_int(v, INT64_MIN, INT64_MAX, &ver)) {
        return bad_field(d, "schema_version", "an integer", v);
    }
    if (ver != KG_SCHEMA_VERSION) {
        snprintf(d->err->message, sizeof(d->err->message),
                 "schema_version: unsupported version %lld (this worker reads %d)", (long long)ver,
                 KG_SCHEMA_VERSION);
        return KG_ERR_INVALID;
    }
    d->job->schema_version = KG_SCHEMA_VERSION;
    return KG_OK;
}

static kg_status_t decode_model(dec_t *d, const json_t *v) {
    size_t len = json_string_length(v);
    if (!json_is_string(v) || len < 1 || utf8_chars(json_string_value(v), len) > KG_JOB_MODEL_MAX ||
        strlen(json_string_value(v)) != len) {
        return bad_field(d, "model", "a string of 1..256 characters without U+0000", v);
    }
    d->job->model = dup_bytes(json_string_value(v), len);
    return d->job->model ? KG_OK : KG_ERR_NOMEM;
}

/* A token id as OpenAI writes logit_bias keys: decimal digits, no sign, no
 * leading zero (so one token cannot appear under two keys). */
static bool parse_token_key(const char *k, int32_t *out) {
    int64_t v = 0;
    size_t n = strlen(k);
    if (n == 0 || n > 10 || (k[0] == '0' && n > 1)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') {
            return false;
        }
        v = v * 10 + (k[i] - '0');
    }
    if (v > INT32_MAX) {
        return false;
    }
    *out = (int32_t)v;
    return true;
}

static kg_status_t decode_logit_bias(dec_t *d, json_t *v) {
    size_t n = json_object_size(v);
    if (!json_is_object(v) || n > KG_MAX_LOGIT_BIAS) {
        return bad_field(d, "logit_bias",
                         "an object of at most 300 token ids (\"50256\") to numbers in -100..100",
                         v);
    }
    if (n == 0) {
        return KG_OK;
    }
    kg_logit_bias_t *lb = calloc(n, sizeof(*lb));
    if (!lb) {
        return KG_ERR_NOMEM;
    }
    d->job->sampling.logit_bias = lb; // kg_job_free frees it
    const char *k;
    json_t *b;
    int32_t i = 0;
    json_object_foreach(v, k, b) {
        char field[48];
        snprintf(field, sizeof(field), "logit_bias[\"%.20s\"]", k);
        if (!parse_token_key(k, &lb[i].token)) {
            json_t *key = json_string(k);
            kg_status_t st = bad_field(d, "logit_bias", "keys that are token ids (\"50256\")",
                                       key ? key : json_null());
            json_decref(key);
            return st;
        }
        double x = json_number_value(b);
        if (!json_is_number(b) || x < -100.0 || x > 100.0) {
            return bad_field(d, field, "a number in -100..100", b);
        }
        lb[i].bias = (float)x;
        i++;
    }
    d->job->sampling.n_logit_bias = i;
    return KG_OK;
}

static kg_status_t decode_metadata(dec_t *d, json_t *v) {
    if (!json_is_object(v)) {
        return bad_field(d, "metadata", "an object", v);
    }
    d->job->metadata_json = metadata_text(d->root, v, d->buf, d->len);
    return d->job->metadata_json ? KG_OK : KG_ERR_NOMEM;
}

/* Absent and null both mean: keep the default. */
static json_t *given(dec_t *d, const char *key) {
    json_t *v = json_object_get(d->root, key);
    return json_is_null(v) ? NULL : v;
}

// ---- constrained output ----

/* The constraint's text, owned by the job (a NUL after it for convenience). */
static kg_status_t set_constraint(dec_t *d, kg_constraint_kind_t kind, const char *s, size_t n) {
    d->job->constraint = kind;
    d->job->constraint_text = dup_bytes(s, n);
    d->job->constraint_len = n;
    return d->job->constraint_text ? KG_OK : KG_ERR_NOMEM;
}

static bool is_schema_name(const json_t *v) {
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (!json_is_string(v) || n < 1 || n > 64) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-')) {
            return false;
        }
    }
    return true;
}

/* OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}}. The schema itself is checked when it is compiled (at
 * intake, through the grammar cache), which answers invalid_schema. */
static kg_status_t decode_response_format(dec_t *d, json_t *v) {
    json_t *type = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(type)) {
        return bad_field(d, "response_format", "an object with a type", v);
    }
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0) {
        return KG_OK;
    }
    if (strcmp(t, "json_object") == 0) {
        return set_constraint(d, KG_CONSTRAINT_JSON_OBJECT, "", 0);
    }
    if (strcmp(t, "json_schema") != 0) {
        return bad_field(d, "response_format.type", "\"text\", \"json_object\" or \"json_schema\"",
                         type);
    }
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js)) {
        return bad_field(d, "response_format.json_schema", "an object", js);
    }
    json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
    json_t *strict = json_object_get(js, "strict"), *desc = json_object_get(js, "description");
    if (!is_schema_name(name)) {
        return bad_field(d, "response_format.json_schema.name", "1..64 characters of [A-Za-z0-9_-]",
                         name);
    }
    if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
        return bad_field(d, "response_format.json_schema.strict", "true or false", strict);
    }
    if (desc && !json_is_null(desc) && !json_is_string(desc)) {
        return bad_field(d, "response_format.json_schema.description", "a string", desc);
    }
    if (schema && !json_is_null(schema) && !json_is_object(schema)) {
        return bad_field(d, "response_format.json_schema.schema", "an object (a JSON Schema)",
                         schema);
    }
    d->job->schema_name = dup_bytes(json_string_value(name), json_string_length(name));
    d->job->schema_strict = json_is_true(strict);
    if (!d->job->schema_name) {
        return KG_ERR_NOMEM;
    }
    if (!schema || json_is_null(schema)) {
        /* no schema: any JSON object, as json_object */
        return set_constraint(d, KG_CONSTRAINT_JSON_OBJECT, "", 0);
    }
    char *text = json_dumps(schema, JSON_COMPACT);
    if (!text) {
        return KG_ERR_NOMEM;
    }
    kg_status_t st = set_constraint(d, KG_CONSTRAINT_JSON_SCHEMA, text, strlen(text));
    free(text);
    return st;
}

static kg_status_t decode_choice(dec_t *d, json_t *v) {
    static const char expect[] = "a non-empty array of at most 1024 non-empty strings";
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > 1024) {
        return bad_field(d, "choice", expect, v);
    }
    const char **items = malloc(n * sizeof(*items));
    size_t *lens = malloc(n * sizeof(*lens));
    kg_status_t st = KG_ERR_NOMEM;
    if (items && lens) {
        st = KG_OK;
        for (size_t i = 0; i < n && st == KG_OK; i++) {
            json_t *s = json_array_get(v, i);
            if (!json_is_string(s) || json_string_length(s) == 0) {
                char field[32];
                snprintf(field, sizeof(field), "choice[%zu]", i);
                st = bad_field(d, field, "a non-empty string", s);
            } else {
                items[i] = json_string_value(s);
                lens[i] = json_string_length(s);
            }
        }
        if (st == KG_OK) {
            size_t len;
            char *enc = kg_constraint_choice_encode(items, lens, (int32_t)n, &len);
            st = enc ? set_constraint(d, KG_CONSTRAINT_CHOICE, enc, len) : KG_ERR_NOMEM;
            free(enc);
        }
    }
    free(items);
    free(lens);
    return st;
}

/* response_format, regex, choice, grammar: at most one of them. */
static kg_status_t decode_constraint(dec_t *d) {
    static const char *const keys[] = {"response_format", "regex", "choice", "grammar"};
    json_t *vals[4];
    int n = 0, which = -1;
    for (int i = 0; i < 4; i++) {
        if ((vals[i] = given(d, keys[i]))) {
            n++;
            which = i;
        }
    }
    if (n > 1) {
        snprintf(d->err->message, sizeof(d->err->message),
                 "at most one of response_format, regex, choice and grammar may be given");
        return KG_ERR_INVALID;
    }
    json_t *v = which >= 0 ? vals[which] : NULL;
    switch (which) {
    case 0:
        return decode_response_format(d, v);
    case 1:
    case 3:
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            return bad_field(
                d, keys[which],
                which == 1 ? "a non-empty regular expression" : "a non-empty GBNF grammar", v);
        }
        return set_constraint(d, which == 1 ? KG_CONSTRAINT_REGEX : KG_CONSTRAINT_GRAMMAR,
                              json_string_value(v), json_string_length(v));
    case 2:
        return decode_choice(d, v);
    default:
        return KG_OK;
    }
}

static kg_status_t decode_fields(dec_t *d) {
    kg_status_t st = KG_OK;
    json_t *v;
    if ((v = given(d, "schema_version")) && (st = decode_schema_version(d, v)) != KG_OK) {
        return st;
    }
    if ((st = decode_prompt(d)) != KG_OK) {
        return st;
    }
    for (size_t i = 0; i < sizeof(job_fields) / sizeof(job_fields[0]); i++) {
        if ((v = given(d, job_fields[i].name)) && (st = decode_simple(d, &job_fields[i], v))) {
            return st;
        }
        // stop sits between seed and stream in the schema
        if (strcmp(job_fields[i].name, "seed") == 0 && (v = given(d, "stop")) &&
            (st = decode_stop(d, v)) != KG_OK) {
            return st;
        }
    }
    if ((v = given(d, "model")) && (st = decode_model(d, v)) != KG_OK) {
        return st;
    }
    if ((v = given(d, "logit_bias")) && (st = decode_logit_bias(d, v)) != KG_OK) {
        return st;
    }
    if ((v = given(d, "metadata")) && (st = decode_metadata(d, v)) != KG_OK) {
        return st;
    }
    return decode_constraint(d);
}

// ---- job decode ----

static kg_status_t dlq(kg_codec_error_t *err, kg_codec_dlq_reason_t reason) {
    err->kind = KG_CODEC_DLQ;
    err->reason = reason;
    return KG_ERR_INVALID;
}

static kg_status_t read_request_id(json_t *root, kg_codec_error_t *err) {
    json_t *v = json_object_get(root, "request_id");
    char what[64];
    if (!v) {
        snprintf(err->message, sizeof(err->message), "request_id: missing");
        return dlq(err, KG_DLQ_MISSING_REQUEST_ID);
    }
    if (!json_is_string(v) || !is_request_id(json_string_value(v), json_string_length(v))) {
        describe(v, what, sizeof(what));
        snprintf(err->message, sizeof(err->message),
                 "request_id: expected 1..128 characters of [A-Za-z0-9._:-], got %s", what);
        return dlq(err, KG_DLQ_BAD_REQUEST_ID);
    }
    memcpy(err->request_id, json_string_value(v), json_string_length(v) + 1);
    return KG_OK;
}

static kg_job_t *job_new_defaults(const char *request_id, int64_t default_max_tokens) {
    kg_job_t *job = calloc(1, sizeof(*job));
    if (!job) {
        return NULL;
    }
    job->request_id = dup_bytes(request_id, strlen(request_id));
    if (!job->request_id) {
        free(job);
        return NULL;
    }
    job->schema_version = KG_SCHEMA_VERSION;
    job->max_tokens = default_max_tokens > 0 ? default_max_tokens : KG_JOB_DEFAULT_MAX_TOKENS;
    job->sampling = kg_job_sampling_defaults();
    job->sampling.seed = kg_job_default_seed(request_id);
    job->stream = true;
    job->n = 1;
    job->partition = -1;
    job->offset = -1;
    return job;
}

kg_status_t
kg_codec_decode_job(const char *buf, size_t len, kg_job_t **out, kg_codec_error_t *err) {
    kg_codec_opts_t opts = kg_codec_opts_default();
    return kg_codec_decode_job_opts(buf, len, &opts, out, err);
}

kg_status_t kg_codec_decode_job_opts(const char *buf,
                                     size_t len,
                                     const kg_codec_opts_t *opts,
                                     kg_job_t **out,
                                     kg_codec_error_t *err) {
    kg_status_t st;
    json_error_t jerr;
    json_t *root = NULL;
    dec_t d = {.buf = buf, .len = len, .err = err};
    memset(err, 0, sizeof(*err));
    *out = NULL;
    if (len > opts->max_message_size) {
        snprintf(err->message, sizeof(err->message), "message too large: %zu bytes (limit %zu)",
                 len, opts->max_message_size);
        st = dlq(err, KG_DLQ_TOO_LARGE);
        goto fail;
    }
    root = json_loadb(buf, len, KG_LOAD_FLAGS, &jerr);
    if (!root) {
        snprintf(err->message, sizeof(err->message), "invalid json: %s (line %d, column %d)",
                 jerr.text, jerr.line, jerr.column);
        st = dlq(err, KG_DLQ_INVALID_JSON);
        goto fail;
    }
    if (!json_is_object(root)) {
        snprintf(err->message, sizeof(err->message), "not a JSON object");
        st = dlq(err, KG_DLQ_NOT_OBJECT);
        goto fail;
    }
    kg_openai_shape_t shape = kg_openai_detect(root, opts->format);
    if (shape != KG_OPENAI_SHAPE_NONE) {
        /* an OpenAI shape: decode the kgen job it translates to; there is no
         * producer text for that object (metadata comes from jansson) */
        json_t *job = NULL;
        if ((st = kg_openai_to_job(root, shape, opts->key, opts->key_len, &job, err)) != KG_OK) {
            goto fail;
        }
        json_decref(root);
        root = job;
        d.buf = NULL;
        d.len = 0;
    }
    if ((st = read_request_id(root, err)) != KG_OK) {
        goto fail;
    }
    d.root = root;
    d.job = job_new_defaults(err->request_id, opts->default_max_tokens);
    if (!d.job) {
        st = KG_ERR_NOMEM;
        goto fail;
    }
    if ((st = decode_fields(&d)) != KG_OK) {
        goto fail;
    }
    json_decref(root);
    *out = d.job;
    return KG_OK;
fail:
    if (st == KG_ERR_NOMEM) {
        snprintf(err->message, sizeof(err->message), "out of memory");
        err->kind = KG_CODEC_OK;
    } else if (err->kind == KG_CODEC_OK) {
        err->kind = KG_CODEC_INVALID;
    }
    kg_job_free(d.job);
    json_decref(root);
    return st;
}

// ---- writing JSON ----

/* Length of the well-formed UTF-8 sequence at s, or 0 with *bad set to
 * the length of its maximal ill-formed prefix (Unicode's "maximal subpart",
 * which becomes one U+FFFD). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    unsigned lo = 0x80;
    unsigned hi = 0xBF;
    size_t need;
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* A copy of s with every ill-formed sequence replaced by U+FFFD. */
static char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    char *out = malloc(len * 3 + 1); // each bad byte may become 3 bytes
    size_t o = 0;
    if (!out) {
        return NULL;
    }
    for (size_t i = 0; i < len;) {
        size_t bad = 0;
        size_t k = utf8_seq((const unsigned char *)s + i, len - i, &bad);
        if (k > 0) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += bad;
        }
    }
    *out_len = o;
    return out;
}

size_t kg_codec_text_prefix(const char *s, size_t len, size_t room, size_t *text_bytes) {
    size_t used = 0, decoded = 0, i = 0;
    while (i < len) {
        size_t bad = 0;
        size_t k = utf8_seq((const unsigned char *)s + i, len - i, &bad);
        size_t written, read = k, out = k;
        if (k == 0) { /* one U+FFFD for the maximal ill-formed subpart */
            written = out = 3;
            read = bad;
        } else if (k == 1) { /* jansson: \" \\ \b \f \n \r \t, \u00XX for other controls */
            unsigned char c = (unsigned char)s[i];
            bool short_escape = c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' ||
                                c == '\r' || c == '\t';
            written = short_escape ? 2 : c < 0x20 ? 6 : 1;
        } else {
            written = k;
        }
        if (used + written > room) {
            break;
        }
        used += written;
        decoded += out;
        i += read;
    }
    if (text_bytes) {
        *text_bytes = decoded;
    }
    return i;
}

/* A JSON string of any bytes: NULL is "", invalid UTF-8 becomes U+FFFD.
 * NULL only when memory ran out. */
static json_t *text_json(const char *s, size_t len) {
    if (!s) {
        return json_string("");
    }
    json_t *v = json_stringn(s, len);
    if (v) {
        return v;
    }
    size_t clean_len;
    char *clean = utf8_sanitize(s, len, &clean_len);
    if (clean) {
        v = json_stringn(clean, clean_len);
        free(clean);
    }
    return v;
}

static json_t *cstr_json(const char *s) {
    return text_json(s, s ? strlen(s) : 0);
}

/* The shortest decimal that reads back as the same float, as a double
 * (0.7f -> 0.7, not 0.699999988079071). */
static double float_shortest(float f) {
    char tmp[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(tmp, sizeof(tmp), "%.*g", p, (double)f);
        double d = strtod(tmp, NULL);
        if ((float)d == f) {
            return d;
        }
    }
    return (double)f;
}

static json_t *float_json(float f) {
    return json_real(float_shortest(f));
}

static json_t *logprob_json(float lp) {
    if (isnan(lp) || isinf(lp)) {
        return json_real(KG_LOGPROB_NEG_INF);
    }
    return json_real(
        float_shortest(lp < (float)KG_LOGPROB_NEG_INF ? (float)KG_LOGPROB_NEG_INF : lp));
}

/* A duration or rate rounded to 3 decimals (microseconds for ms); negative
 * values (a clock step) and non-finite ones are written as 0. */
static json_t *nonneg_json(double x) {
    if (!(x > 0) || isinf(x)) {
        return json_real(0.0);
    }
    return json_real(round(x * 1000.0) / 1000.0);
}

/* Set a fresh value; a NULL value or a failed set marks the build failed. */
static void put(json_t *obj, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(obj, key, v) != 0) {
        *ok = false;
    }
}

static void append(json_t *arr, json_t *v, bool *ok) {
    if (!v || json_array_append_new(arr, v) != 0) {
        *ok = false;
    }
}

/* Dump `obj` and splice in `"metadata": <metadata_json>` when given and it
 * is a JSON object; the text goes in verbatim, so numbers keep their digits. */
static char *dump_with_metadata(json_t *obj, const char *metadata_json, size_t *len) {
    char *text = json_dumps(obj, KG_DUMP_FLAGS);
    json_t *check = NULL;
    if (!text || !metadata_json) {
        goto out;
    }
    check = json_loads(metadata_json, KG_LOAD_FLAGS, NULL);
    if (!json_is_object(check)) {
        KG_LOG_WARN("codec", "metadata is not a JSON object; left out of the event");
        goto out;
    }
    size_t n = strlen(text);
    size_t m = strlen(metadata_json);
    char *joined = realloc(text, n + m + sizeof(",\"metadata\":"));
    if (!joined) {
        free(text);
        text = NULL;
        goto out;
    }
    text = joined;
    // text ends with the object's '}'; it always holds other members.
    memcpy(text + n - 1, ",\"metadata\":", 12);
    memcpy(text + n + 11, metadata_json, m);
    memcpy(text + n + 11 + m, "}", 2);
out:
    json_decref(check);
    if (text && len) {
        *len = strlen(text);
    }
    return text;
}

// ---- job encode ----

static json_t *messages_json(const kg_job_t *job) {
    json_t *arr = json_array();
    bool ok = arr != NULL;
    for (int32_t i = 0; ok && i < job->n_messages; i++) {
        json_t *m = json_object();
        append(arr, m, &ok);
        if (ok) {
            put(m, "role", cstr_json(job->messages[i].role), &ok);
            put(m, "content", cstr_json(job->messages[i].content), &ok);
        }
    }
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *tokens_json(const int32_t *ids, int32_t n) {
    json_t *arr = json_array();
    bool ok = arr != NULL;
    for (int32_t i = 0; ok && i < n; i++) {
        append(arr, json_integer(ids[i]), &ok);
    }
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *prompt_json(const kg_job_t *job) {
    switch (job->prompt_kind) {
    case KG_PROMPT_TOKENS:
        return tokens_json(job->prompt_tokens, job->n_prompt_tokens);
    case KG_PROMPT_MESSAGES:
        return messages_json(job);
    default:
        return text_json(job->prompt, job->prompt_len);
    }
}

static void put_sampling(json_t *o, const kg_sampling_params_t *sp, bool *ok) {
    put(o, "temperature", float_json(sp->temperature), ok);
    put(o, "top_k", json_integer(sp->top_k), ok);
    put(o, "top_p", float_json(sp->top_p), ok);
    put(o, "min_p", float_json(sp->min_p), ok);
    put(o, "repetition_penalty", float_json(sp->repetition_penalty), ok);
    put(o, "frequency_penalty", float_json(sp->frequency_penalty), ok);
    put(o, "presence_penalty", float_json(sp->presence_penalty), ok);
    put(o, "seed", json_integer((json_int_t)(sp->seed & 0x7fffffffffffffffULL)), ok);
}

/* The job's constraint in its own field (decoding it gives the same job). */
static void put_constraint(json_t *o, const kg_job_t *job, bool *ok) {
    const char *text = job->constraint_text;
    size_t len = job->constraint_len;
    switch (job->constraint) {
    case KG_CONSTRAINT_JSON_OBJECT:
    case KG_CONSTRAINT_JSON_SCHEMA: {
        json_t *rf = json_object();
        put(o, "response_format", rf, ok);
        if (job->constraint == KG_CONSTRAINT_JSON_OBJECT && !job->schema_name) {
            put(rf, "type", json_string("json_object"), ok);
            break;
        }
        json_t *js = json_object();
        put(rf, "type", json_string("json_schema"), ok);
        put(rf, "json_schema", js, ok);
        put(js, "name", cstr_json(job->schema_name ? job->schema_name : "schema"), ok);
        put(js, "strict", json_boolean(job->schema_strict), ok);
        if (job->constraint == KG_CONSTRAINT_JSON_SCHEMA) {
            json_error_t jerr;
            put(js, "schema", json_loadb(text, len, 0, &jerr), ok);
        }
        break;
    }
    case KG_CONSTRAINT_REGEX:
        put(o, "regex", text_json(text, len), ok);
        break;
    case KG_CONSTRAINT_GRAMMAR:
        put(o, "grammar", text_json(text, len), ok);
        break;
    case KG_CONSTRAINT_CHOICE: {
        json_t *arr = json_array();
        put(o, "choice", arr, ok);
        for (size_t at = 0; arr && at + 4 <= len;) {
            uint32_t l = 0;
            for (int k = 0; k < 4; k++) {
                l |= (uint32_t)(unsigned char)text[at + (size_t)k] << (8 * k);
            }
            at += 4;
            append(arr, text_json(text + at, l), ok);
            at += l;
        }
        break;
    }
    default:
        break;
    }
}

char *kg_codec_encode_job(const kg_job_t *job, size_t *len) {
    static const char *const prompt_keys[] = {"prompt", "prompt_tokens", "messages"};
    char *text = NULL;
    json_t *o = json_object();
    json_t *stop = json_array();
    bool ok = o && stop;
    put(o, "schema_version", json_integer(KG_SCHEMA_VERSION), &ok);
    put(o, "request_id", cstr_json(job->request_id), &ok);
    put(o, prompt_keys[job->prompt_kind <= KG_PROMPT_MESSAGES ? job->prompt_kind : 0],
        prompt_json(job), &ok);
    put(o, "max_tokens", json_integer(job->max_tokens), &ok);
    put_sampling(o, &job->sampling, &ok);
    for (int32_t i = 0; stop && i < job->n_stop; i++) {
        append(stop, cstr_json(job->stop[i]), &ok);
    }
    put(o, "stop", json_incref(stop), &ok);
    put(o, "stream", json_boolean(job->stream), &ok);
    put(o, "logprobs", json_integer(job->sampling.n_logprobs), &ok);
    if (job->deadline_ms > 0) {
        put(o, "deadline_ms", json_integer(job->deadline_ms), &ok);
    }
    put(o, "priority", json_integer(job->priority), &ok);
    put(o, "ignore_eos", json_boolean(job->ignore_eos), &ok);
    put(o, "n", json_integer(job->n), &ok);
    if (job->model) {
        put(o, "model", cstr_json(job->model), &ok);
    }
    if (job->sampling.n_logit_bias > 0) {
        json_t *lb = json_object();
        put(o, "logit_bias", lb, &ok);
        for (int32_t i = 0; lb && i < job->sampling.n_logit_bias; i++) {
            char key[16];
            snprintf(key, sizeof(key), "%d", job->sampling.logit_bias[i].token);
            put(lb, key, float_json(job->sampling.logit_bias[i].bias), &ok);
        }
    }
    put_constraint(o, job, &ok);
    if (ok) {
        text = dump_with_metadata(o, job->metadata_json, len);
    }
    json_decref(stop);
    json_decref(o);
    return text;
}

// ---- event encode ----

static json_t *event_new(const char *type, const kg_event_common_t *c, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    put(o, "type", json_string(type), ok);
    put(o, "request_id", cstr_json(c->request_id), ok);
    put(o, "worker_id", cstr_json(c->worker_id), ok);
    if (c->topic) {
        put(o, "topic", cstr_json(c->topic), ok);
    }
    put(o, "partition", json_integer(c->partition < -1 ? -1 : c->partition), ok);
    put(o, "offset", json_integer(c->offset < -1 ? -1 : c->offset), ok);
    put(o, "schema_version", json_integer(KG_SCHEMA_VERSION), ok);
    put(o, "ts_ms", json_integer(c->ts_ms < 0 ? 0 : c->ts_ms), ok);
    return o;
}

static json_t *candidate_json(const kg_logprob_entry_t *e, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    put(o, "token_id", json_integer(e->token_id), ok);
    put(o, "text", text_json(e->text, e->text_len), ok);
    put(o, "logprob", logprob_json(e->logprob), ok);
    return o;
}

static json_t *top_json(const kg_token_logprobs_t *lp, bool *ok) {
    json_t *arr = json_array();
    int32_t n = lp->n_top < 0 ? 0 : lp->n_top > KG_MAX_LOGPROBS ? KG_MAX_LOGPROBS : lp->n_top;
    if (!arr) {
        *ok = false;
    }
    for (int32_t i = 0; arr && i < n; i++) {
        append(arr, candidate_json(&lp->top[i], ok), ok);
    }
    return arr;
}

static char *finish_event(json_t *o, bool ok, const char *metadata_json, size_t *len) {
    char *text = ok ? dump_with_metadata(o, metadata_json, len) : NULL;
    json_decref(o);
    return text;
}

/* The markers of what an event left out to fit (written only when set). */
static void put_truncation(json_t *o, bool logprobs, bool metadata, int64_t text_cut, bool *ok) {
    if (logprobs) {
        put(o, "logprobs_truncated", json_true(), ok);
    }
    if (metadata) {
        put(o, "metadata_truncated", json_true(), ok);
    }
    if (text_cut > 0) {
        put(o, "text_truncated", json_true(), ok);
        put(o, "text_bytes_cut", json_integer(text_cut), ok);
    }
}

char *kg_codec_encode_token(const kg_event_token_t *ev, size_t *len) {
    bool ok = true;
    json_t *o = event_new("token", &ev->common, &ok);
    if (o && ev->has_choice) {
        put(o, "choice", json_integer(ev->choice), &ok);
    }
    if (o) {
        put(o, "index", json_integer(ev->index), &ok);
        put(o, "token_id", json_integer(ev->token_id), &ok);
        put(o, "text", text_json(ev->text, ev->text_len), &ok);
        put_truncation(o, ev->logprobs_truncated, false,
                       ev->text_truncated ? ev->text_bytes_cut : 0, &ok);
    }
    if (o && ev->has_logprobs) {
        json_t *lp = json_object();
        put(o, "logprobs", lp, &ok);
        if (lp) {
            put(lp, "logprob", logprob_json(ev->logprobs.token.logprob), &ok);
            put(lp, "top", top_json(&ev->logprobs, &ok), &ok);
        }
    }
    return finish_event(o, ok, NULL, len);
}

static json_t *done_logprobs_json(const kg_token_logprobs_t *lps, int32_t n, bool *ok) {
    json_t *arr = json_array();
    if (!arr) {
        *ok = false;
    }
    for (int32_t i = 0; arr && i < n; i++) {
        json_t *e = candidate_json(&lps[i].token, ok);
        append(arr, e, ok);
        if (e) {
            put(e, "top", top_json(&lps[i], ok), ok);
        }
    }
    return arr;
}

static json_t *choices_json(const kg_event_done_t *ev, bool *ok) {
    json_t *arr = json_array();
    if (!arr) {
        *ok = false;
    }
    for (int32_t i = 0; arr && i < ev->n_choices; i++) {
        const kg_event_choice_t *c = &ev->choices[i];
        json_t *o = json_object();
        append(arr, o, ok);
        if (!o) {
            break;
        }
        put(o, "index", json_integer(c->index), ok);
        put(o, "finish_reason", json_string(kg_finish_reason_str(c->finish_reason)), ok);
        put(o, "text", text_json(c->text, c->text_len), ok);
        if (c->stop) {
            put(o, "stop", text_json(c->stop, c->stop_len), ok);
        }
        put(o, "completion_tokens", json_integer(c->completion_tokens), ok);
        if (c->logprobs && c->n_logprobs > 0) {
            put(o, "logprobs", done_logprobs_json(c->logprobs, c->n_logprobs, ok), ok);
        }
        if (c->text_truncated) {
            put(o, "text_truncated", json_true(), ok);
            put(o, "text_bytes_cut", json_integer(c->text_bytes_cut), ok);
        }
    }
    return arr;
}

static void put_usage_timings(json_t *o, const kg_event_done_t *ev, bool *ok) {
    json_t *usage = json_object();
    json_t *timings = json_object();
    put(o, "usage", usage, ok);
    put(o, "timings", timings, ok);
    if (!usage || !timings) {
        return;
    }
    put(usage, "prompt_tokens", json_integer(ev->prompt_tokens), ok);
    put(usage, "completion_tokens", json_integer(ev->completion_tokens), ok);
    put(usage, "cached_tokens", json_integer(ev->cached_tokens), ok);
    put(timings, "queue_ms", nonneg_json(ev->queue_ms), ok);
    put(timings, "ttft_ms", nonneg_json(ev->ttft_ms), ok);
    put(timings, "total_ms", nonneg_json(ev->total_ms), ok);
    put(timings, "tokens_per_s", nonneg_json(ev->tokens_per_s), ok);
}

char *kg_codec_encode_done(const kg_event_done_t *ev, size_t *len) {
    bool ok = true;
    json_t *o = event_new("done", &ev->common, &ok);
    if (o) {
        put(o, "finish_reason", json_string(kg_finish_reason_str(ev->finish_reason)), &ok);
        put(o, "text", text_json(ev->text, ev->text_len), &ok);
        if (ev->stop) {
            put(o, "stop", text_json(ev->stop, ev->stop_len), &ok);
        }
        put_usage_timings(o, ev, &ok);
        if (ev->logprobs && ev->n_logprobs > 0) {
            put(o, "logprobs", done_logprobs_json(ev->logprobs, ev->n_logprobs, &ok), &ok);
        }
        if (ev->choices && ev->n_choices > 0) {
            put(o, "choices", choices_json(ev, &ok), &ok);
        }
        if (ev->model) {
            put(o, "model", cstr_json(ev->model), &ok);
        }
        put_truncation(o, ev->logprobs_truncated, ev->metadata_truncated,
                       ev->text_truncated ? ev->text_bytes_cut : 0, &ok);
    }
    return finish_event(o, ok, ev->metadata_json, len);
}

char *kg_codec_encode_error(const kg_event_error_t *ev, size_t *len) {
    bool ok = true;
    json_t *o = event_new("error", &ev->common, &ok);
    if (o) {
        put(o, "code", json_string(kg_error_code_str(ev->code)), &ok);
        put(o, "message", cstr_json(ev->message), &ok);
        put_truncation(o, false, ev->metadata_truncated, 0, &ok);
    }
    return finish_event(o, ok, ev->metadata_json, len);
}

// ---- event decode ----

typedef struct evdec {
    json_t *root;
    const char *buf;
    size_t len;
    char *errstr;
    size_t errstr_size;
    bool nomem;
} evdec_t;

static bool ev_bad(evdec_t *d, const char *field, const char *expect) {
    snprintf(d->errstr, d->errstr_size, "%s: expected %s", field, expect);
    return false;
}

static bool ev_int(evdec_t *d, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    if (!as_int(json_object_get(o, key), lo, hi, out)) {
        return ev_bad(d, key, "an integer in range");
    }
    return true;
}

static bool ev_int32(evdec_t *d, json_t *o, const char *key, int64_t lo, int32_t *out) {
    int64_t v;
    if (!ev_int(d, o, key, lo, INT32_MAX, &v)) {
        return false;
    }
    *out = (int32_t)v;
    return true;
}

static bool ev_num(evdec_t *d, json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        return ev_bad(d, key, "a number");
    }
    *out = json_number_value(v);
    return true;
}

/* A string member copied with its length; absent is an error unless
 * `optional` (then *s stays NULL). */
static bool
ev_str(evdec_t *d, json_t *o, const char *key, bool optional, const char **s, size_t *len) {
    json_t *v = json_object_get(o, key);
    if (!v && optional) {
        return true;
    }
    if (!json_is_string(v)) {
        return ev_bad(d, key, "a string");
    }
    char *copy = dup_bytes(json_string_value(v), json_string_length(v));
    if (!copy) {
        d->nomem = true;
        return false;
    }
    *s = copy;
    if (len) {
        *len = json_string_length(v);
    }
    return true;
}

static bool ev_common(evdec_t *d, kg_event_common_t *c) {
    json_t *r = d->root;
    return ev_str(d, r, "request_id", false, &c->request_id, NULL) &&
           ev_str(d, r, "worker_id", false, &c->worker_id, NULL) &&
           ev_str(d, r, "topic", true, &c->topic, NULL) &&
           ev_int32(d, r, "partition", -1, &c->partition) &&
           ev_int(d, r, "offset", -1, INT64_MAX, &c->offset) &&
           ev_int(d, r, "ts_ms", 0, INT64_MAX, &c->ts_ms) &&
           ev_int32(d, r, "schema_version", 1, &c->schema_version);
}

/* An optional boolean member of the event (absent: false). */
static bool ev_flag(evdec_t *d, const char *key, bool *out) {
    json_t *v = json_object_get(d->root, key);
    if (!v) {
        return true;
    }
    if (!json_is_boolean(v)) {
        return ev_bad(d, key, "true or false");
    }
    *out = json_is_true(v);
    return true;
}

/* text_truncated and, with it, text_bytes_cut (>= 1). */
static bool ev_text_cut(evdec_t *d, bool *truncated, int64_t *cut) {
    if (!ev_flag(d, "text_truncated", truncated)) {
        return false;
    }
    return !*truncated || ev_int(d, d->root, "text_bytes_cut", 1, INT64_MAX, cut);
}

static bool ev_candidate(evdec_t *d, json_t *o, kg_logprob_entry_t *e) {
    double lp;
    if (!json_is_object(o)) {
        return ev_bad(d, "logprobs", "objects of token_id, text, logprob");
    }
    if (!ev_int32(d, o, "token_id", 0, &e->token_id) ||
        !ev_str(d, o, "text", false, &e->text, &e->text_len) || !ev_num(d, o, "logprob", &lp)) {
        return false;
    }
    e->logprob = (float)lp;
    return true;
}

static bool ev_top(evdec_t *d, json_t *o, kg_token_logprobs_t *lp) {
    json_t *top = json_object_get(o, "top");
    if (!json_is_array(top) || json_array_size(top) > KG_MAX_LOGPROBS) {
        return ev_bad(d, "top", "an array of at most 20 candidates");
    }
    for (size_t i = 0; i < json_array_size(top); i++) {
        if (!ev_candidate(d, json_array_get(top, i), &lp->top[i])) {
            return false;
        }
        lp->n_top = (int32_t)i + 1;
    }
    return true;
}

static bool ev_token(evdec_t *d, kg_event_token_t *t) {
    json_t *lp = json_object_get(d->root, "logprobs");
    double x;
    if (!ev_common(d, &t->common) || !ev_int32(d, d->root, "index", 0, &t->index) ||
        !ev_int32(d, d->root, "token_id", 0, &t->token_id) ||
        !ev_str(d, d->root, "text", false, &t->text, &t->text_len) ||
        !ev_flag(d, "logprobs_truncated", &t->logprobs_truncated) ||
        !ev_text_cut(d, &t->text_truncated, &t->text_bytes_cut)) {
        return false;
    }
    if (json_object_get(d->root, "choice")) {
        t->has_choice = true;
        if (!ev_int32(d, d->root, "choice", 0, &t->choice)) {
            return false;
        }
    }
    if (!lp) {
        return true;
    }
    if (!json_is_object(lp)) {
        return ev_bad(d, "logprobs", "an object");
    }
    t->has_logprobs = true;
    t->logprobs.token.token_id = t->token_id;
    if (!ev_num(d, lp, "logprob", &x) || !ev_top(d, lp, &t->logprobs)) {
        return false;
    }
    t->logprobs.token.logprob = (float)x;
    return true;
}

static bool
ev_done_logprobs(evdec_t *d, json_t *o, const kg_token_logprobs_t **out, int32_t *n_out) {
    json_t *arr = json_object_get(o, "logprobs");
    if (!arr) {
        return true;
    }
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n > INT32_MAX) {
        return ev_bad(d, "logprobs", "an array");
    }
    kg_token_logprobs_t *lps = calloc(n ? n : 1, sizeof(*lps));
    if (!lps) {
        d->nomem = true;
        return false;
    }
    *out = lps;
    for (size_t i = 0; i < n; i++) {
        *n_out = (int32_t)i + 1; // freed up to here on failure
        json_t *item = json_array_get(arr, i);
        if (!ev_candidate(d, item, &lps[i].token) || !ev_top(d, item, &lps[i])) {
            return false;
        }
    }
    return true;
}

static bool ev_choices(evdec_t *d, kg_event_done_t *e) {
    json_t *arr = json_object_get(d->root, "choices");
    if (!arr) {
        return true;
    }
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n < 1 || n > KG_JOB_MAX_N) {
        return ev_bad(d, "choices", "an array of 1..16 completions");
    }
    kg_event_choice_t *cs = calloc(n, sizeof(*cs));
    if (!cs) {
        d->nomem = true;
        return false;
    }
    e->choices = cs;
    for (size_t i = 0; i < n; i++) {
        e->n_choices = (int32_t)i + 1; // freed up to here on failure
        json_t *c = json_array_get(arr, i);
        json_t *fr = json_object_get(c, "finish_reason");
        int f = json_is_string(fr) ? name_index(finish_reason_names, 3, json_string_value(fr)) : -1;
        if (!json_is_object(c) || f < 0) {
            return ev_bad(d, "choices", "objects with index, finish_reason, text");
        }
        cs[i].finish_reason = (kg_finish_reason_t)f;
        if (!ev_int32(d, c, "index", 0, &cs[i].index) ||
            !ev_str(d, c, "text", false, &cs[i].text, &cs[i].text_len) ||
            !ev_str(d, c, "stop", true, &cs[i].stop, &cs[i].stop_len) ||
            !ev_int32(d, c, "completion_tokens", 0, &cs[i].completion_tokens) ||
            !ev_done_logprobs(d, c, &cs[i].logprobs, &cs[i].n_logprobs)) {
            return false;
        }
        cs[i].text_truncated = json_is_true(json_object_get(c, "text_truncated"));
        json_t *cut = json_object_get(c, "text_bytes_cut");
        cs[i].text_bytes_cut = json_is_integer(cut) ? json_integer_value(cut) : 0;
    }
    return true;
}

static bool ev_metadata(evdec_t *d, const char **out) {
    json_t *m = json_object_get(d->root, "metadata");
    if (!m) {
        return true;
    }
    if (!json_is_object(m)) {
        return ev_bad(d, "metadata", "an object");
    }
    *out = metadata_text(d->root, m, d->buf, d->len);
    d->nomem = *out == NULL;
    return *out != NULL;
}

static bool ev_done(evdec_t *d, kg_event_done_t *e) {
    json_t *r = d->root;
    json_t *fr = json_object_get(r, "finish_reason");
    json_t *usage = json_object_get(r, "usage");
    json_t *tm = json_object_get(r, "timings");
    int f = json_is_string(fr) ? name_index(finish_reason_names, 3, json_string_value(fr)) : -1;
    if (!ev_common(d, &e->common)) {
        return false;
    }
    if (f < 0) {
        return ev_bad(d, "finish_reason", "stop, length or stop_sequence");
    }
    if (!json_is_object(usage) || !json_is_object(tm)) {
        return ev_bad(d, "usage/timings", "objects");
    }
    e->finish_reason = (kg_finish_reason_t)f;
    return ev_str(d, r, "text", false, &e->text, &e->text_len) &&
           ev_str(d, r, "stop", true, &e->stop, &e->stop_len) &&
           ev_int32(d, usage, "prompt_tokens", 0, &e->prompt_tokens) &&
           ev_int32(d, usage, "completion_tokens", 0, &e->completion_tokens) &&
           ev_int32(d, usage, "cached_tokens", 0, &e->cached_tokens) &&
           ev_num(d, tm, "queue_ms", &e->queue_ms) && ev_num(d, tm, "ttft_ms", &e->ttft_ms) &&
           ev_num(d, tm, "total_ms", &e->total_ms) &&
           ev_num(d, tm, "tokens_per_s", &e->tokens_per_s) &&
           ev_done_logprobs(d, r, &e->logprobs, &e->n_logprobs) && ev_choices(d, e) &&
           ev_str(d, r, "model", true, &e->model, NULL) && ev_metadata(d, &e->metadata_json) &&
           ev_flag(d, "logprobs_truncated", &e->logprobs_truncated) &&
           ev_flag(d, "metadata_truncated", &e->metadata_truncated) &&
           ev_text_cut(d, &e->text_truncated, &e->text_bytes_cut);
}

static bool ev_error(evdec_t *d, kg_event_error_t *e) {
    json_t *code = json_object_get(d->root, "code");
    int c = json_is_string(code)
                ? name_index(error_code_names, KG_ERROR_CODE_COUNT_, json_string_value(code))
                : -1;
    if (!ev_common(d, &e->common)) {
        return false;
    }
    if (c < 0) {
        return ev_bad(d, "code", "one of the schema's error codes");
    }
    e->code = (kg_error_code_t)c;
    return ev_str(d, d->root, "message", false, &e->message, NULL) &&
           ev_metadata(d, &e->metadata_json) &&
           ev_flag(d, "metadata_truncated", &e->metadata_truncated);
}

kg_status_t kg_codec_decode_event(
    const char *buf, size_t len, kg_event_t **out, char *errstr, size_t errstr_size) {
    json_error_t jerr;
    evdec_t d = {.buf = buf, .len = len, .errstr = errstr, .errstr_size = errstr_size};
    kg_event_t *ev = calloc(1, sizeof(*ev));
    json_t *type;
    bool ok = false;
    *out = NULL;
    d.root = json_loadb(buf, len, KG_LOAD_FLAGS, &jerr);
    if (!ev || !d.root) {
        d.nomem = !ev;
        snprintf(errstr, errstr_size, "invalid json: %s", ev ? jerr.text : "out of memory");
        goto out;
    }
    type = json_object_get(d.root, "type");
    int t = json_is_string(type) ? name_index(event_type_names, 3, json_string_value(type)) : -1;
    if (!json_is_object(d.root) || t < 0) {
        ev_bad(&d, "type", "token, done or error");
        goto out;
    }
    ev->type = (kg_event_type_t)t;
    ok = t == KG_EVENT_TOKEN  ? ev_token(&d, &ev->token)
         : t == KG_EVENT_DONE ? ev_done(&d, &ev->done)
                              : ev_error(&d, &ev->error);
out:
    json_decref(d.root);
    if (!ok) {
        kg_event_free(ev);
        return d.nomem ? KG_ERR_NOMEM : KG_ERR_INVALID;
    }
    *out = ev;
    return KG_OK;
}

static void free_common(kg_event_common_t *c) {
    free((void *)c->request_id);
    free((void *)c->worker_id);
    free((void *)c->topic);
}

static void free_logprobs(kg_token_logprobs_t *lp) {
    free((void *)lp->token.text);
    for (int32_t i = 0; i < lp->n_top; i++) {
        free((void *)lp->top[i].text);
    }
}

void kg_event_free(kg_event_t *ev) {
    if (!ev) {
        return;
    }
    // A decoded event owns every pointer; const is only for the encoders.
    free_common(&ev->token.common);
    free((void *)ev->token.text);
    free_logprobs(&ev->token.logprobs);
    free_common(&ev->done.common);
    free((void *)ev->done.text);
    free((void *)ev->done.stop);
    for (int32_t i = 0; i < ev->done.n_logprobs; i++) {
        free_logprobs((kg_token_logprobs_t *)&ev->done.logprobs[i]);
    }
    free((void *)ev->done.logprobs);
    for (int32_t c = 0; c < ev->done.n_choices; c++) {
        const kg_event_choice_t *ch = &ev->done.choices[c];
        free((void *)ch->text);
        free((void *)ch->stop);
        for (int32_t i = 0; i < ch->n_logprobs; i++) {
            free_logprobs((kg_token_logprobs_t *)&ch->logprobs[i]);
        }
        free((void *)ch->logprobs);
    }
    free((void *)ev->done.choices);
    free((void *)ev->done.model);
    free((void *)ev->done.metadata_json);
    free_common(&ev->error.common);
    free((void *)ev->error.message);
    free((void *)ev->error.metadata_json);
    free(ev);
}
