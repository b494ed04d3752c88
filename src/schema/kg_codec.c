/* kg_codec: job messages into kg_job_t (the contract and its rules are in
 * kg_codec.h). What the worker's intake and kgen-submit call; the other
 * parts of the codec are listed there. */
#include "kg_codec.h"

#include "kg_codec_int.h"
#include "kg_openai_int.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

const char *kg_codec_dlq_reason_str(kg_codec_dlq_reason_t reason) {
    if ((int)reason < 0 || (size_t)reason >= sizeof(dlq_reason_names) / sizeof(char *)) {
        return "unknown";
    }
    return dlq_reason_names[reason];
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

// ---- job fields ----

/* Code points of a UTF-8 string known to be valid (jansson checked it). */
static size_t utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    }
    return n;
}

typedef struct dec {
    json_t *root;
    const char *buf;
    size_t len;
    kg_job_t *job;
    kg_codec_error_t *err;
} dec_t;

static kg_status_t bad_field(dec_t *d, const char *field, const char *expect, const json_t *got) {
    char what[64];
    kg_codec_describe_json(got, what, sizeof(what));
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
    } else if (!kg_codec_as_int(v, f->ilo, f->ihi, &i)) {
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
    d->job->prompt = kg_codec_dup_bytes(json_string_value(v), d->job->prompt_len);
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
        if (!kg_codec_as_int(json_array_get(v, i), 0, INT32_MAX, &id)) {
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
    json_t *extra = NULL;
    kg_status_t st = kg_codec_decode_message_tools(m, i, role_names[r], &extra, d->err->message,
                                                   sizeof(d->err->message));
    if (st != KG_OK) {
        return st;
    }
    if (extra && json_is_null(content)) {
        content = NULL; /* an assistant turn of tool calls only */
    } else if (!json_is_string(content) ||
               strlen(json_string_value(content)) != json_string_length(content)) {
        json_decref(extra);
        snprintf(field, sizeof(field), "messages[%zu].content", i);
        return bad_field(d, field, "a string without U+0000", content ? content : json_null());
    }
    out->role = role_names[r];
    if (extra) {
        if (!d->job->message_extra) {
            d->job->message_extra =
                calloc(json_array_size(json_object_get(d->root, "messages")), sizeof(char *));
        }
        char *xj = d->job->message_extra ? json_dumps(extra, JSON_COMPACT) : NULL;
        json_decref(extra);
        if (!xj) {
            return KG_ERR_NOMEM;
        }
        d->job->message_extra[i] = xj;
    }
    out->content = content
                       ? kg_codec_dup_bytes(json_string_value(content), json_string_length(content))
                       : kg_codec_dup_bytes("", 0);
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
        d->job->stop[i] = kg_codec_dup_bytes(json_string_value(s), json_string_length(s));
        if (!d->job->stop[i]) {
            return KG_ERR_NOMEM;
        }
        d->job->n_stop = (int32_t)i + 1;
    }
    return KG_OK;
}

static kg_status_t decode_schema_version(dec_t *d, const json_t *v) {
    int64_t ver;
    if (!kg_codec_as_int(v, INT64_MIN, INT64_MAX, &ver)) {
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
    d->job->model = kg_codec_dup_bytes(json_string_value(v), len);
    return d->job->model ? KG_OK : KG_ERR_NOMEM;
}

/* lora: [{"name": string, "scale": number?}], 1..KG_JOB_MAX_LORA entries
 * (llama.cpp's server takes [{"id", "scale"}]; kgen names adapters, as
 * --lora does). */
static kg_status_t decode_lora(dec_t *d, const json_t *v) {
    const char *expect = "an array of 1..4 {\"name\": string, \"scale\": number}";
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > KG_JOB_MAX_LORA) {
        return bad_field(d, "lora", expect, v);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        const json_t *name = json_object_get(e, "name");
        const json_t *scale = json_object_get(e, "scale");
        size_t len = json_string_length(name);
        if (!json_is_object(e) || !json_is_string(name) || len < 1 ||
            utf8_chars(json_string_value(name), len) > KG_JOB_MODEL_MAX ||
            strlen(json_string_value(name)) != len ||
            (scale && !json_is_null(scale) &&
             (!json_is_number(scale) || fabs(json_number_value(scale)) > 1e6))) {
            return bad_field(d, "lora", expect, e);
        }
        kg_job_lora_t *l = &d->job->lora[d->job->n_lora];
        l->name = kg_codec_dup_bytes(json_string_value(name), len);
        if (!l->name) {
            return KG_ERR_NOMEM;
        }
        d->job->n_lora++;
        l->has_scale = scale && !json_is_null(scale);
        l->scale = l->has_scale ? (float)json_number_value(scale) : 1.0f;
    }
    return KG_OK;
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
    d->job->metadata_json = kg_codec_metadata_text(d->root, v, d->buf, d->len);
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
    d->job->constraint_text = kg_codec_dup_bytes(s, n);
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
    d->job->schema_name = kg_codec_dup_bytes(json_string_value(name), json_string_length(name));
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
    if ((st = kg_codec_decode_task(d->root, d->job, d->err->message, sizeof(d->err->message))) !=
        KG_OK) {
        return st;
    }
    if (d->job->task == KG_TASK_GENERATE && (st = decode_prompt(d)) != KG_OK) {
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
    if ((v = given(d, "lora")) && (st = decode_lora(d, v)) != KG_OK) {
        return st;
    }
    if ((v = given(d, "logit_bias")) && (st = decode_logit_bias(d, v)) != KG_OK) {
        return st;
    }
    if ((v = given(d, "metadata")) && (st = decode_metadata(d, v)) != KG_OK) {
        return st;
    }
    if ((st = kg_codec_decode_reasoning(d->root, d->job, d->err->message,
                                        sizeof(d->err->message))) != KG_OK) {
        return st;
    }
    if ((st = decode_constraint(d)) != KG_OK) {
        return st;
    }
    return kg_codec_decode_tools(d->root, d->job, d->err->message, sizeof(d->err->message));
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
    if (!json_is_string(v) ||
        !kg_codec_is_request_id(json_string_value(v), json_string_length(v))) {
        kg_codec_describe_json(v, what, sizeof(what));
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
    job->request_id = kg_codec_dup_bytes(request_id, strlen(request_id));
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
