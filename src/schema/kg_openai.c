/* kg_openai: OpenAI request bodies and Batch lines into kgen jobs, and
 * terminal events into OpenAI Batch output lines (see kg_openai.h). */
#include "kg_openai.h"

#include "kg_codec_int.h"
#include "kg_openai_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))
#define LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

/* OpenAI's Completions default when the body gives no max_tokens. */
#define COMPLETIONS_DEFAULT_MAX_TOKENS 16
/* The most top logprobs a job can ask (KG_MAX_LOGPROBS). */
#define MAX_TOP_LOGPROBS 20

static const char CHAT_URL[] = "/v1/chat/completions";
static const char COMPLETIONS_URL[] = "/v1/completions";

// ---- small helpers ----

/* Absent and null both mean "not given", as in the job decoder. */
static json_t *given(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static bool is_str(const json_t *v, const char *s) {
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* An integer in [lo, hi]; integral reals count, as in the job decoder. */
static bool int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    double d;
    if (json_is_integer(v)) {
        d = (double)json_integer_value(v);
    } else if (json_is_real(v)) {
        d = json_real_value(v);
    } else {
        return false;
    }
    if (d != floor(d) || d < (double)lo || d > (double)hi) {
        return false;
    }
    *out = (int64_t)d;
    return true;
}

/* Two 64-bit FNV-1a hashes of the bytes, as 32 hex digits. */
static void hex128(const char *s, size_t len, uint64_t salt, char out[33]) {
    uint64_t a = 0xcbf29ce484222325ULL ^ salt, b = 0x84222325cbf29ce4ULL + salt;
    for (size_t i = 0; i < len; i++) {
        a = (a ^ (unsigned char)s[i]) * 0x100000001b3ULL;
        b = (b ^ (unsigned char)s[i]) * 0x100000001b3ULL;
        b ^= b >> 29;
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

/* Set a fresh value; a NULL value or a failed set marks the build failed. */
static void put(json_t *o, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(o, key, v) != 0) {
        *ok = false;
    }
}

static void append(json_t *a, json_t *v, bool *ok) {
    if (!v || json_array_append_new(a, v) != 0) {
        *ok = false;
    }
}

// ---- shapes ----

kg_openai_shape_t kg_openai_detect(const json_t *root, kg_job_format_t format) {
    bool has_custom = json_object_get(root, "custom_id") != NULL;
    bool has_body = json_object_get(root, "body") != NULL;
    bool chat = json_object_get(root, "messages") != NULL;
    switch (format) {
    case KG_JOB_FORMAT_KGEN:
        return KG_OPENAI_SHAPE_NONE;
    case KG_JOB_FORMAT_OPENAI_BATCH:
        return KG_OPENAI_SHAPE_BATCH;
    case KG_JOB_FORMAT_OPENAI_CHAT:
        return KG_OPENAI_SHAPE_CHAT;
    case KG_JOB_FORMAT_OPENAI_COMPLETION:
        return KG_OPENAI_SHAPE_COMPLETION;
    case KG_JOB_FORMAT_OPENAI:
        return has_custom || has_body              ? KG_OPENAI_SHAPE_BATCH
               : chat                              ? KG_OPENAI_SHAPE_CHAT
               : kg_openai_answer_detect(root) > 0 ? kg_openai_answer_detect(root)
                                                   : KG_OPENAI_SHAPE_COMPLETION;
    case KG_JOB_FORMAT_AUTO:
    default:
        if (has_custom && has_body) {
            return KG_OPENAI_SHAPE_BATCH;
        }
        if (json_object_get(root, "request_id")) {
            return KG_OPENAI_SHAPE_NONE; /* a kgen job, also when it names a model */
        }
        if (chat) {
            return KG_OPENAI_SHAPE_CHAT;
        }
        return json_object_get(root, "prompt") ? KG_OPENAI_SHAPE_COMPLETION
                                               : kg_openai_answer_detect(root);
    }
}

// ---- jobs in ----

typedef struct tr {
    kg_codec_error_t *err;
    json_t *job; /* the kgen job object being built */
    bool ok;     /* false once memory ran out */
} tr_t;

static kg_status_t invalid(tr_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static kg_status_t invalid(tr_t *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* ap is initialized by va_start just above: clang 14's valist checker misses it */
    // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
    vsnprintf(t->err->message, sizeof(t->err->message), fmt, ap);
    va_end(ap);
    t->err->kind = KG_CODEC_INVALID;
    return KG_ERR_INVALID;
}

static kg_status_t bad(tr_t *t, const char *field, const char *expect, const json_t *got) {
    char what[64];
    kg_codec_describe_json(got, what, sizeof(what));
    return invalid(t, "%s: expected %s, got %s", field, expect, what);
}

static kg_status_t dlq(kg_codec_error_t *err, kg_codec_dlq_reason_t reason, const char *msg) {
    snprintf(err->message, sizeof(err->message), "%s", msg);
    err->kind = KG_CODEC_DLQ;
    err->reason = reason;
    return KG_ERR_INVALID;
}

/* A request id for the line: its request_id, else its custom_id when that
 * is one, else one derived from the custom_id. */
static kg_status_t batch_request_id(const json_t *root, kg_codec_error_t *err) {
    const json_t *rid = given(root, "request_id");
    const json_t *cid = given(root, "custom_id");
    char what[64], msg[256];
    if (rid) {
        if (!json_is_string(rid) ||
            !kg_codec_is_request_id(json_string_value(rid), json_string_length(rid))) {
            kg_codec_describe_json(rid, what, sizeof(what));
            snprintf(msg, sizeof(msg),
                     "request_id: expected 1..128 characters of [A-Za-z0-9._:-], got %s", what);
            return dlq(err, KG_DLQ_BAD_REQUEST_ID, msg);
        }
        memcpy(err->request_id, json_string_value(rid), json_string_length(rid) + 1);
        return KG_OK;
    }
    if (!cid) {
        return dlq(err, KG_DLQ_MISSING_REQUEST_ID,
                   "custom_id: missing (every OpenAI Batch line needs one)");
    }
    if (!json_is_string(cid) || json_string_length(cid) == 0) {
        kg_codec_describe_json(cid, what, sizeof(what));
        snprintf(msg, sizeof(msg), "custom_id: expected a non-empty string, got %s", what);
        return dlq(err, KG_DLQ_BAD_REQUEST_ID, msg);
    }
    const char *c = json_string_value(cid);
    size_t len = json_string_length(cid);
    if (kg_codec_is_request_id(c, len)) {
        memcpy(err->request_id, c, len + 1);
    } else {
        char hex[33];
        hex128(c, len, 0, hex);
        snprintf(err->request_id, sizeof(err->request_id), "cid-%s", hex);
    }
    return KG_OK;
}

/* A bare body: its own request_id (a kgen extension), else the key. */
static kg_status_t
body_request_id(const json_t *body, const char *key, size_t key_len, kg_codec_error_t *err) {
    if (given(body, "request_id")) {
        return batch_request_id(body, err); /* the same rule for a given request_id */
    }
    if (!key || key_len == 0) {
        return dlq(err, KG_DLQ_MISSING_REQUEST_ID,
                   "request_id: missing (a bare OpenAI request body takes it from the message "
                   "key, and the message has none)");
    }
    if (!kg_codec_is_request_id(key, key_len)) {
        return dlq(err, KG_DLQ_BAD_REQUEST_ID,
                   "request_id: the message key of a bare OpenAI request body must be 1..128 "
                   "characters of [A-Za-z0-9._:-]");
    }
    memcpy(err->request_id, key, key_len);
    err->request_id[key_len] = '\0';
    return KG_OK;
}

/* Fields OpenAI defines that kgen cannot honour: an error, never dropped. */
static kg_status_t refuse_unsupported(tr_t *t, const json_t *body, kg_openai_shape_t shape) {
    /* tools are called through chat bodies (the template shows them); the
     * deprecated functions / function_call are refused unless unused */
    const json_t *fn_choice = given(body, "function_call");
    if (json_array_size(given(body, "functions")) > 0 && !is_str(fn_choice, "none")) {
        return invalid(t, "functions: the deprecated functions are not supported: send tools "
                          "(and tool_choice) instead");
    }
    if (fn_choice && !is_str(fn_choice, "none") && !is_str(fn_choice, "auto")) {
        return invalid(t, "function_call: the deprecated function_call is not supported: send "
                          "tool_choice instead");
    }
    const json_t *choice = given(body, "tool_choice");
    if (shape != KG_OPENAI_SHAPE_CHAT && json_array_size(given(body, "tools")) > 0 &&
        !is_str(choice, "none")) {
        return invalid(t, "tools: tool calls need a chat completions body (messages)");
    }
    const json_t *mods = given(body, "modalities");
    for (size_t i = 0; i < json_array_size(mods); i++) {
        if (is_str(json_array_get(mods, i), "audio")) {
            return invalid(t, "modalities: audio output is not supported");
        }
    }
    if (given(body, "audio")) {
        return invalid(t, "audio: audio output is not supported");
    }
    if (given(body, "web_search_options")) {
        return invalid(t, "web_search_options: web search is not supported");
    }
    if (shape != KG_OPENAI_SHAPE_COMPLETION) {
        return KG_OK;
    }
    const json_t *echo = given(body, "echo");
    if (echo && !json_is_false(echo)) {
        return invalid(t, "echo: echoing the prompt is not supported");
    }
    const json_t *suffix = given(body, "suffix");
    if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0)) {
        return invalid(t, "suffix: insertion (a suffix) is not supported");
    }
    const json_t *best_of = given(body, "best_of");
    const json_t *n = given(body, "n");
    int64_t b, nv = 1;
    if (n && !int_in(n, 1, INT32_MAX, &nv)) {
        nv = -1; /* the job decoder reports n itself */
    }
    if (best_of && (!int_in(best_of, 1, INT32_MAX, &b) || (b != 1 && b != nv))) {
        return bad(t, "best_of", "1 or the same as n (every completion is returned)", best_of);
    }
    return KG_OK;
}

/* One message's content: a string, or text parts joined with a newline. */
static kg_status_t
message_content(tr_t *t, size_t i, const char *role, const json_t *c, json_t **out) {
    char field[64];
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return KG_OK;
    }
    if (!c && strcmp(role, "assistant") == 0) {
        *out = json_string(""); /* an assistant turn with no content */
        return KG_OK;
    }
    if (!json_is_array(c)) {
        *out = c ? json_incref((json_t *)c) : json_null(); /* the job decoder reports it */
        return KG_OK;
    }
    size_t total = 0, n = json_array_size(c);
    for (size_t k = 0; k < n; k++) {
        const json_t *part = json_array_get(c, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        snprintf(field, sizeof(field), "messages[%zu].content[%zu]", i, k);
        if (!json_is_object(part) || !json_is_string(type)) {
            return bad(t, field, "a content part {\"type\": \"text\", \"text\": ...}", part);
        }
        if (!is_str(type, "text")) {
            return invalid(t, "%s: \"%.32s\" parts are not supported (text only)", field,
                           json_string_value(type));
        }
        if (!json_is_string(text)) {
            return bad(t, field, "a text part with a string \"text\"", part);
        }
        total += json_string_length(text) + 1;
    }
    char *joined = malloc(total + 1);
    size_t at = 0;
    if (!joined) {
        return KG_ERR_NOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        const json_t *text = json_object_get(json_array_get(c, k), "text");
        if (k > 0) {
            joined[at++] = '\n';
        }
        memcpy(joined + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    *out = json_stringn(joined, at);
    free(joined);
    return *out ? KG_OK : KG_ERR_NOMEM;
}

static kg_status_t translate_messages(tr_t *t, const json_t *msgs) {
    if (!json_is_array(msgs)) {
        put(t->job, "messages", json_incref((json_t *)msgs), &t->ok);
        return KG_OK; /* the job decoder reports it */
    }
    json_t *arr = json_array();
    put(t->job, "messages", arr, &t->ok);
    for (size_t i = 0; arr && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            append(arr, json_incref((json_t *)m), &t->ok);
            continue;
        }
        const json_t *role = json_object_get(m, "role");
        if (is_str(role, "function")) {
            return invalid(t,
                           "messages[%zu].role: \"function\" messages are not supported (this "
                           "worker does not call tools)",
                           i);
        }
        if (given(m, "function_call")) {
            return invalid(t,
                           "messages[%zu].function_call: the deprecated function_call is not "
                           "supported: send tool_calls instead",
                           i);
        }
        json_t *content = NULL;
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        kg_status_t st = message_content(t, i, r, given(m, "content"), &content);
        if (st != KG_OK) {
            return st;
        }
        json_t *o = json_object();
        append(arr, o, &t->ok);
        if (o) {
            /* developer is OpenAI's newer name for the system turn */
            put(o, "role",
                is_str(role, "developer") ? json_string("system")
                : role                    ? json_incref((json_t *)role)
                                          : json_null(),
                &t->ok);
            put(o, "content", content, &t->ok);
            /* the turn's tool calls and a tool result's id, for the template (the job
             * decoder checks them) */
            static const char *const tool_keys[] = {"tool_calls", "tool_call_id", "name"};
            for (size_t k = 0; k < sizeof(tool_keys) / sizeof(tool_keys[0]); k++) {
                const json_t *v = given(m, tool_keys[k]);
                if (v && (k > 0 || json_array_size(v) > 0)) {
                    put(o, tool_keys[k], json_incref((json_t *)v), &t->ok);
                }
            }
        } else {
            json_decref(content);
        }
    }
    return KG_OK;
}

static bool all_ints(const json_t *a) {
    for (size_t i = 0; i < json_array_size(a); i++) {
        if (!json_is_integer(json_array_get(a, i))) {
            return false;
        }
    }
    return true;
}

static kg_status_t translate_prompt(tr_t *t, const json_t *p) {
    if (json_is_array(p) && json_array_size(p) == 1 && !all_ints(p)) {
        p = json_array_get(p, 0); /* a list of one prompt */
    }
    if (json_is_array(p) && all_ints(p)) {
        put(t->job, "prompt_tokens", json_incref((json_t *)p), &t->ok);
    } else if (json_is_array(p)) {
        return invalid(t, "prompt: several prompts in one request are not supported; send one "
                          "request per prompt");
    } else {
        put(t->job, "prompt", p ? json_incref((json_t *)p) : json_null(), &t->ok);
    }
    return KG_OK;
}

static kg_status_t translate_max_tokens(tr_t *t, const json_t *body, kg_openai_shape_t shape) {
    const json_t *mct = given(body, "max_completion_tokens");
    const json_t *mt = given(body, "max_tokens");
    const json_t *v = mct ? mct : mt;
    int64_t n;
    if (v && !int_in(v, 1, INT64_MAX, &n)) {
        return bad(t, mct ? "max_completion_tokens" : "max_tokens", "an integer >= 1", v);
    }
    if (v) {
        put(t->job, "max_tokens", json_incref((json_t *)v), &t->ok);
    } else if (shape == KG_OPENAI_SHAPE_COMPLETION) {
        put(t->job, "max_tokens", json_integer(COMPLETIONS_DEFAULT_MAX_TOKENS), &t->ok);
    }
    return KG_OK;
}

static kg_status_t translate_logprobs(tr_t *t, const json_t *body, kg_openai_shape_t shape) {
    const json_t *lp = given(body, "logprobs");
    int64_t top = 0;
    if (shape == KG_OPENAI_SHAPE_COMPLETION) {
        if (lp && !int_in(lp, 0, MAX_TOP_LOGPROBS, &top)) {
            return bad(t, "logprobs", "an integer in 0..20", lp);
        }
        if (lp) {
            put(t->job, "logprobs", json_integer(top > 1 ? top : 1), &t->ok);
        }
        return KG_OK;
    }
    const json_t *tl = given(body, "top_logprobs");
    if (lp && !json_is_boolean(lp)) {
        return bad(t, "logprobs", "true or false", lp);
    }
    if (tl && !int_in(tl, 0, MAX_TOP_LOGPROBS, &top)) {
        return bad(t, "top_logprobs", "an integer in 0..20", tl);
    }
    if (top > 0 && !json_is_true(lp)) {
        return invalid(t, "top_logprobs: needs logprobs: true");
    }
    if (json_is_true(lp)) {
        put(t->job, "logprobs", json_integer(top > 1 ? top : 1), &t->ok);
    }
    return KG_OK;
}

/* The output constraint: OpenAI's response_format and kgen's own regex,
 * choice and grammar are copied; vLLM's guided decoding extras become kgen's
 * fields (guided_json: a json_schema response_format; guided_regex, _choice,
 * _grammar: regex, choice, grammar), so a vLLM file that uses them is
 * constrained, not silently free. At most one may be given (the job decoder
 * says the same of the kgen fields). */
static kg_status_t translate_constraint(tr_t *t, const json_t *body) {
    static const struct {
        const char *from, *to;
    } map[] = {
        {"response_format", "response_format"},
        {"regex", "regex"},
        {"choice", "choice"},
        {"grammar", "grammar"},
        {"guided_json", NULL},
        {"guided_regex", "regex"},
        {"guided_choice", "choice"},
        {"guided_grammar", "grammar"},
    };
    const char *first = NULL;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        json_t *v = given(body, map[i].from);
        if (!v) {
            continue;
        }
        if (first) {
            return invalid(t, "%s: only one output constraint may be given (%s is already there)",
                           map[i].from, first);
        }
        first = map[i].from;
        if (map[i].to) {
            put(t->job, map[i].to, json_incref(v), &t->ok);
            continue;
        }
        /* guided_json: the schema, or its JSON text */
        json_t *schema =
            json_is_string(v) ? json_loads(json_string_value(v), 0, NULL) : json_incref(v);
        if (!json_is_object(schema)) {
            json_decref(schema);
            return bad(t, "guided_json", "a JSON Schema (an object or its JSON text)", v);
        }
        json_t *rf = json_pack("{s:s, s:{s:s, s:b, s:o}}", "type", "json_schema", "json_schema",
                               "name", "guided_json", "strict", 1, "schema", schema);
        put(t->job, "response_format", rf, &t->ok);
    }
    return KG_OK;
}

static kg_status_t translate_body(tr_t *t, const json_t *body, kg_openai_shape_t shape) {
    static const char *const same[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "n",
                                       "stop",
                                       "seed",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "logit_bias",
                                       "metadata",
                                       "top_k",
                                       "min_p",
                                       "repetition_penalty",
                                       "ignore_eos",
                                       "priority",
                                       "deadline_ms"};
    kg_status_t st;
    put(t->job, "request_id", json_string(t->err->request_id), &t->ok);
    if ((st = refuse_unsupported(t, body, shape)) != KG_OK) {
        return st;
    }
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        json_t *v = json_object_get(body, same[i]);
        if (v) {
            put(t->job, same[i], json_incref(v), &t->ok);
        }
    }
    kg_codec_copy_reasoning(body, t->job, shape == KG_OPENAI_SHAPE_CHAT, &t->ok);
    kg_codec_copy_tools(body, t->job, &t->ok);
    const json_t *stream = given(body, "stream");
    put(t->job, "stream", stream ? json_incref((json_t *)stream) : json_false(), &t->ok);
    if ((st = translate_max_tokens(t, body, shape)) != KG_OK ||
        (st = translate_logprobs(t, body, shape)) != KG_OK ||
        (st = translate_constraint(t, body)) != KG_OK) {
        return st;
    }
    if (shape == KG_OPENAI_SHAPE_CHAT) {
        const json_t *msgs = json_object_get(body, "messages");
        return msgs ? translate_messages(t, msgs) : KG_OK;
    }
    const json_t *p = json_object_get(body, "prompt");
    return p ? translate_prompt(t, p) : KG_OK;
}

kg_status_t kg_openai_to_job(const json_t *root,
                             kg_openai_shape_t shape,
                             const char *key,
                             size_t key_len,
                             json_t **out,
                             kg_codec_error_t *err) {
    tr_t t = {.err = err, .ok = true};
    const json_t *body = root;
    kg_status_t st;
    *out = NULL;
    if (shape == KG_OPENAI_SHAPE_BATCH) {
        if ((st = batch_request_id(root, err)) != KG_OK) {
            return st;
        }
        const json_t *method = given(root, "method");
        const json_t *url = given(root, "url");
        body = json_object_get(root, "body");
        if (method && !is_str(method, "POST")) {
            return bad(&t, "method", "\"POST\"", method);
        }
        if (!json_is_object(body)) {
            return bad(&t, "body", "an object (the request body)", body ? body : json_null());
        }
        if (url && !json_is_string(url)) {
            return bad(&t, "url", "\"/v1/chat/completions\" or \"/v1/completions\"", url);
        }
        if (is_str(url, CHAT_URL)) {
            shape = KG_OPENAI_SHAPE_CHAT;
        } else if (is_str(url, COMPLETIONS_URL)) {
            shape = KG_OPENAI_SHAPE_COMPLETION;
        } else if (kg_openai_answer_url(url) != KG_OPENAI_SHAPE_NONE) {
            shape = kg_openai_answer_url(url);
        } else if (url) {
            return invalid(&t,
                           "url: %.64s is not served here (this worker serves %s, %s, "
                           "/v1/embeddings, /v1/rerank and /v1/score)",
                           json_string_value(url), CHAT_URL, COMPLETIONS_URL);
        } else {
            shape = json_object_get(body, "messages") ? KG_OPENAI_SHAPE_CHAT
                                                      : KG_OPENAI_SHAPE_COMPLETION;
        }
    } else if ((st = body_request_id(root, key, key_len, err)) != KG_OK) {
        return st;
    }
    t.job = json_object();
    if (!t.job) {
        return KG_ERR_NOMEM;
    }
    if (shape >= KG_OPENAI_SHAPE_EMBED) {
        put(t.job, "request_id", json_string(err->request_id), &t.ok);
        st = kg_openai_answer_to_job(body, shape, t.job, err);
    } else {
        st = translate_body(&t, body, shape);
    }
    if (st == KG_OK && !t.ok) {
        st = KG_ERR_NOMEM;
    }
    if (st != KG_OK) {
        json_decref(t.job);
        return st;
    }
    *out = t.job;
    return KG_OK;
}

// ---- results out ----

/* What the input line asked, as far as the result's shape goes. */
typedef struct asked {
    bool chat;          /* chat.completion, else text_completion */
    int64_t top;        /* top logprobs per token; -1: no logprobs */
    const char *custom; /* custom_id (borrowed from `in` or the event) */
    const char *model;  /* the body's model, or NULL */
} asked_t;

static void read_asked(const json_t *in, const json_t *ev, asked_t *a) {
    const json_t *body = in;
    memset(a, 0, sizeof(*a));
    a->top = -1;
    a->chat = true;
    const json_t *url = json_object_get(in, "url");
    const json_t *cid = json_object_get(in, "custom_id");
    if (json_is_object(json_object_get(in, "body"))) {
        body = json_object_get(in, "body");
    }
    a->custom = json_is_string(cid) ? json_string_value(cid)
                : json_is_string(json_object_get(in, "request_id"))
                    ? json_string_value(json_object_get(in, "request_id"))
                    : json_string_value(json_object_get(ev, "request_id"));
    bool has_prompt = json_object_get(body, "prompt") || json_object_get(body, "prompt_tokens");
    a->chat = is_str(url, CHAT_URL)          ? true
              : is_str(url, COMPLETIONS_URL) ? false
                                             : json_object_get(body, "messages") || !has_prompt;
    const json_t *model = json_object_get(body, "model");
    a->model = json_is_string(model) ? json_string_value(model) : NULL;
    const json_t *lp = given(body, "logprobs");
    int64_t top = 0;
    bool kgen = body == in && json_object_get(in, "request_id") && !cid;
    if (kgen || !a->chat) {
        /* kgen jobs and Completions: logprobs is the count */
        if (int_in(lp, 0, MAX_TOP_LOGPROBS, &top) && (!kgen || top > 0)) {
            a->top = top;
        }
    } else if (json_is_true(lp)) {
        a->top = int_in(given(body, "top_logprobs"), 0, MAX_TOP_LOGPROBS, &top) ? top : 0;
    }
}

/* The token's bytes as written in the event (valid UTF-8 by then). */
static json_t *bytes_json(const char *s, size_t len, bool *ok) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++) {
        append(a, json_integer((unsigned char)s[i]), ok);
    }
    if (!a) {
        *ok = false;
    }
    return a;
}

static size_t utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    }
    return n;
}

/* Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}. */
static json_t *chat_logprobs(const json_t *lps, int64_t top, bool *ok) {
    json_t *o = json_object(), *content = json_array();
    put(o, "content", content, ok);
    put(o, "refusal", json_null(), ok);
    for (size_t i = 0; o && content && i < json_array_size(lps); i++) {
        const json_t *e = json_array_get(lps, i);
        const json_t *text = json_object_get(e, "text");
        json_t *c = json_object(), *tops = json_array();
        append(content, c, ok);
        if (!c) {
            json_decref(tops);
            break;
        }
        put(c, "token", json_incref(json_object_get(e, "text")), ok);
        put(c, "logprob", json_incref(json_object_get(e, "logprob")), ok);
        put(c, "bytes", bytes_json(json_string_value(text), json_string_length(text), ok), ok);
        put(c, "top_logprobs", tops, ok);
        const json_t *top_in = json_object_get(e, "top");
        for (size_t k = 0; tops && k < json_array_size(top_in) && (int64_t)k < top; k++) {
            const json_t *x = json_array_get(top_in, k);
            const json_t *xt = json_object_get(x, "text");
            json_t *y = json_object();
            append(tops, y, ok);
            if (y) {
                put(y, "token", json_incref((json_t *)xt), ok);
                put(y, "logprob", json_incref(json_object_get(x, "logprob")), ok);
                put(y, "bytes", bytes_json(json_string_value(xt), json_string_length(xt), ok), ok);
            }
        }
    }
    if (!o || !content) {
        *ok = false;
    }
    return o;
}

/* Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const json_t *lps, int64_t top, bool *ok) {
    json_t *o = json_object(), *tokens = json_array(), *lp = json_array(), *tops = json_array(),
           *off = json_array();
    put(o, "tokens", tokens, ok);
    put(o, "token_logprobs", lp, ok);
    put(o, "top_logprobs", tops, ok);
    put(o, "text_offset", off, ok);
    size_t at = 0;
    for (size_t i = 0; o && tokens && lp && tops && off && i < json_array_size(lps); i++) {
        const json_t *e = json_array_get(lps, i);
        const json_t *text = json_object_get(e, "text");
        append(tokens, json_incref((json_t *)text), ok);
        append(lp, json_incref(json_object_get(e, "logprob")), ok);
        append(off, json_integer((json_int_t)at), ok);
        at += utf8_chars(json_string_value(text), json_string_length(text));
        json_t *t = json_object();
        append(tops, t, ok);
        const json_t *top_in = json_object_get(e, "top");
        for (size_t k = 0; t && k < json_array_size(top_in) && (int64_t)k < top; k++) {
            const json_t *x = json_array_get(top_in, k);
            const char *xt = json_string_value(json_object_get(x, "text"));
            if (xt && !json_object_get(t, xt)) { /* the best of equal strings */
                put(t, xt, json_incref(json_object_get(x, "logprob")), ok);
            }
        }
    }
    if (!o || !tokens || !lp || !tops || !off) {
        *ok = false;
    }
    return o;
}

static const char *openai_finish(const json_t *fr) {
    return is_str(fr, "length")       ? "length"
           : is_str(fr, "tool_calls") ? "tool_calls"
                                      : "stop"; /* stop and stop_sequence */
}

/* One choice of the body from a done event's completion `c` (the event
 * itself for n = 1, else one of its choices). */
static json_t *choice_json(const asked_t *a, const json_t *c, int64_t index, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    const json_t *lps = json_object_get(c, "logprobs");
    json_t *lp = json_null();
    if (a->top >= 0 && json_is_array(lps)) {
        json_decref(lp);
        lp = a->chat ? chat_logprobs(lps, a->top, ok) : completion_logprobs(lps, a->top, ok);
    }
    put(o, "index", json_integer(index), ok);
    if (a->chat) {
        json_t *msg = json_object();
        put(o, "message", msg, ok);
        if (msg) {
            put(msg, "role", json_string("assistant"), ok);
            /* calls (already OpenAI's shape in the event); content null beside them when the
             * answer was only calls, as OpenAI writes it */
            const json_t *text = json_object_get(c, "text");
            const json_t *calls = json_object_get(c, "tool_calls");
            bool bare = json_array_size(calls) > 0 && json_string_length(text) == 0;
            put(msg, "content", bare ? json_null() : json_incref((json_t *)text), ok);
            if (json_array_size(calls) > 0) {
                put(msg, "tool_calls", json_incref((json_t *)calls), ok);
            }
            /* a parsed thought: vLLM's reasoning_content and its newer reasoning */
            json_t *thought = json_object_get(c, "reasoning");
            if (json_is_string(thought)) {
                put(msg, "reasoning_content", json_incref(thought), ok);
                put(msg, "reasoning", json_incref(thought), ok);
            }
            put(msg, "refusal", json_null(), ok);
        }
    } else {
        put(o, "text", json_incref(json_object_get(c, "text")), ok);
    }
    put(o, "logprobs", lp, ok);
    put(o, "finish_reason", json_string(openai_finish(json_object_get(c, "finish_reason"))), ok);
    return o;
}

static json_t *
done_body(const asked_t *a, const json_t *ev, const kg_openai_output_opts_t *opts, bool *ok) {
    json_t *body = json_object(), *choices = json_array(), *usage = json_object(),
           *details = json_object();
    const json_t *u = json_object_get(ev, "usage");
    const char *rid = json_string_value(json_object_get(ev, "request_id"));
    json_int_t ts = json_integer_value(json_object_get(ev, "ts_ms"));
    char id[160];
    snprintf(id, sizeof(id), "%s%s", a->chat ? "chatcmpl-" : "cmpl-", rid ? rid : "");
    put(body, "id", json_string(id), ok);
    put(body, "object", json_string(a->chat ? "chat.completion" : "text_completion"), ok);
    put(body, "created", json_integer(ts / 1000), ok);
    const json_t *em = json_object_get(ev, "model");
    put(body, "model",
        json_string(json_is_string(em)            ? json_string_value(em)
                    : a->model                    ? a->model
                    : opts && opts->default_model ? opts->default_model
                                                  : "kgen"),
        ok);
    put(body, "choices", choices, ok);
    const json_t *cs = json_object_get(ev, "choices");
    if (json_is_array(cs) && json_array_size(cs) > 0) {
        for (size_t i = 0; choices && i < json_array_size(cs); i++) {
            const json_t *c = json_array_get(cs, i);
            append(choices, choice_json(a, c, json_integer_value(json_object_get(c, "index")), ok),
                   ok);
        }
    } else if (choices) {
        append(choices, choice_json(a, ev, 0, ok), ok);
    }
    json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t ct = json_integer_value(json_object_get(u, "completion_tokens"));
    put(body, "usage", usage, ok);
    if (usage) {
        put(usage, "prompt_tokens", json_integer(pt), ok);
        put(usage, "completion_tokens", json_integer(ct), ok);
        put(usage, "total_tokens", json_integer(pt + ct), ok);
        put(usage, "prompt_tokens_details", details, ok);
        details = NULL;
        json_t *d = json_object_get(usage, "prompt_tokens_details");
        if (d) {
            put(d, "cached_tokens",
                json_integer(json_integer_value(json_object_get(u, "cached_tokens"))), ok);
        }
    }
    json_decref(details);
    put(body, "system_fingerprint", json_null(), ok);
    if (!body) {
        *ok = false;
    }
    return body;
}

kg_status_t kg_openai_batch_output(const char *input,
                                   size_t input_len,
                                   const char *event,
                                   size_t event_len,
                                   const kg_openai_output_opts_t *opts,
                                   char **out,
                                   size_t *out_len,
                                   bool *is_error,
                                   char *errstr,
                                   size_t errstr_size) {
    kg_status_t st = KG_ERR_NOMEM;
    json_t *in = json_loadb(input, input_len, LOAD_FLAGS, NULL);
    json_t *ev = json_loadb(event, event_len, LOAD_FLAGS, NULL);
    json_t *line = NULL;
    const json_t *type = json_object_get(ev, "type");
    const json_t *rid = json_object_get(ev, "request_id");
    bool ok = true;
    *out = NULL;
    if (!is_str(type, "done") && !is_str(type, "error")) {
        snprintf(errstr, errstr_size, "not a done or error event");
        st = KG_ERR_INVALID;
        goto out;
    }
    if (!json_is_string(rid)) {
        snprintf(errstr, errstr_size, "the event has no request_id");
        st = KG_ERR_INVALID;
        goto out;
    }
    asked_t a;
    read_asked(json_is_object(in) ? in : NULL, ev, &a);
    /* ids: stable for one event (its attempt and time), distinct per job */
    char hex[33], hex2[33], id[48], key[512];
    snprintf(key, sizeof(key), "%s/%s/%lld/%lld/%lld", a.custom ? a.custom : "",
             json_string_value(rid),
             (long long)json_integer_value(json_object_get(ev, "partition")),
             (long long)json_integer_value(json_object_get(ev, "offset")),
             (long long)json_integer_value(json_object_get(ev, "ts_ms")));
    hex128(key, strlen(key), 1, hex);
    hex128(key, strlen(key), 2, hex2);
    snprintf(id, sizeof(id), "batch_req_%s", hex);
    line = json_object();
    if (!line) {
        goto out;
    }
    put(line, "id", json_string(id), &ok);
    put(line, "custom_id", json_string(a.custom ? a.custom : json_string_value(rid)), &ok);
    *is_error = is_str(type, "error");
    if (!*is_error) {
        json_t *resp = json_object();
        put(line, "response", resp, &ok);
        if (resp) {
            put(resp, "status_code", json_integer(200), &ok);
            put(resp, "request_id", json_string(hex2), &ok);
            json_t *answer = kg_openai_answer_body(json_is_object(in) ? in : NULL, ev,
                                                   opts ? opts->default_model : NULL, &ok);
            put(resp, "body", answer ? answer : done_body(&a, ev, opts, &ok), &ok);
        }
        put(line, "error", json_null(), &ok);
    } else {
        const char *code = json_string_value(json_object_get(ev, "code"));
        const char *message = json_string_value(json_object_get(ev, "message"));
        const char *etype, *oa_code;
        code = code ? code : "internal";
        message = message ? message : "";
        int status = kg_openai_error_status(code, &etype, &oa_code);
        if (status == 0) {
            json_t *err = json_object();
            put(line, "response", json_null(), &ok);
            put(line, "error", err, &ok);
            if (err) {
                put(err, "code", json_string(oa_code), &ok);
                put(err, "message", json_string(message), &ok);
            }
        } else {
            json_t *resp = json_object(), *body = json_object(), *err = json_object();
            const char *param = kg_openai_error_param(code, a.chat, json_is_object(in) ? in : NULL);
            put(line, "response", resp, &ok);
            if (resp) {
                put(resp, "status_code", json_integer(status), &ok);
                put(resp, "request_id", json_string(hex2), &ok);
                put(resp, "body", body, &ok);
                body = NULL;
            }
            json_t *b = resp ? json_object_get(resp, "body") : NULL;
            if (b) {
                put(b, "error", err, &ok);
                err = NULL;
                json_t *e = json_object_get(b, "error");
                if (e) {
                    put(e, "message", json_string(message), &ok);
                    put(e, "type", json_string(etype), &ok);
                    put(e, "param", param ? json_string(param) : json_null(), &ok);
                    put(e, "code", json_string(oa_code), &ok);
                }
            }
            json_decref(body);
            json_decref(err);
            put(line, "error", json_null(), &ok);
        }
    }
    if (!ok) {
        goto out;
    }
    *out = json_dumps(line, DUMP_FLAGS);
    if (*out) {
        *out_len = strlen(*out);
        st = KG_OK;
    }
out:
    json_decref(line);
    json_decref(in);
    json_decref(ev);
    return st;
}

bool kg_openai_line_id(const char *line, size_t len, char *out, size_t size) {
    json_t *o = json_loadb(line, len, LOAD_FLAGS, NULL);
    const json_t *id = json_object_get(o, "custom_id");
    if (!json_is_string(id)) {
        id = json_object_get(o, "request_id");
    }
    bool ok = json_is_string(id) && json_string_length(id) < size &&
              strlen(json_string_value(id)) == json_string_length(id);
    if (ok) {
        memcpy(out, json_string_value(id), json_string_length(id) + 1);
    }
    json_decref(o);
    return ok;
}
