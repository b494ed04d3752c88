/* kg_codec_event_decode: event messages back into the structs of
 * kg_codec_event.h, for readers of the events topic (kgen-submit, the
 * demo, tests). The worker itself never decodes events. Errors go into an
 * errstr (kg_codec_event.h says why not a kg_codec_error_t). */
#include "kg_codec_event.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- names ----
/* The value whose name the encoder writes (kg_*_str) is `s`, or -1. */

static int finish_reason_named(const char *s) {
    for (int i = 0; i <= KG_FINISH_REASON_TOOL_CALLS; i++) {
        if (strcmp(kg_finish_reason_str((kg_finish_reason_t)i), s) == 0) {
            return i;
        }
    }
    return -1;
}

static int error_code_named(const char *s) {
    for (int i = 0; i < KG_ERROR_CODE_COUNT_; i++) {
        if (strcmp(kg_error_code_str((kg_error_code_t)i), s) == 0) {
            return i;
        }
    }
    return -1;
}

static int event_type_named(const char *s) {
    for (int i = 0; i <= KG_EVENT_ERROR; i++) {
        if (strcmp(kg_event_type_str((kg_event_type_t)i), s) == 0) {
            return i;
        }
    }
    return -1;
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
    if (!kg_codec_as_int(json_object_get(o, key), lo, hi, out)) {
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
    char *copy = kg_codec_dup_bytes(json_string_value(v), json_string_length(v));
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

/* A lowercase hex id of exactly n digits, not all zero (W3C trace context), into out (n + 1). */
static bool ev_hex_id(evdec_t *d, json_t *o, const char *key, size_t n, char *out) {
    json_t *v = json_object_get(o, key);
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    bool ok = s && json_string_length(v) == n;
    bool nonzero = false;
    for (size_t i = 0; ok && i < n; i++) {
        ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
        nonzero |= s[i] != '0';
    }
    if (!ok || !nonzero) {
        return ev_bad(d, key,
                      n == KG_TRACE_ID_HEX ? "32 lowercase hex digits, not all zero"
                                           : "16 lowercase hex digits, not all zero");
    }
    memcpy(out, s, n + 1);
    return true;
}

/* The worker's span (optional): ids as W3C writes them, end not before start. */
static bool ev_span(evdec_t *d, kg_event_common_t *c) {
    json_t *sp = json_object_get(d->root, "span");
    if (!sp) {
        return true;
    }
    if (!json_is_object(sp)) {
        return ev_bad(d, "span", "an object");
    }
    kg_event_span_t *s = &c->span;
    if (!ev_hex_id(d, sp, "trace_id", KG_TRACE_ID_HEX, s->trace_id) ||
        !ev_hex_id(d, sp, "span_id", KG_SPAN_ID_HEX, s->span_id) ||
        !ev_hex_id(d, sp, "parent_span_id", KG_SPAN_ID_HEX, s->parent_span_id) ||
        !ev_int(d, sp, "start_unix_nano", 0, INT64_MAX, &s->start_unix_nano) ||
        !ev_int(d, sp, "end_unix_nano", s->start_unix_nano, INT64_MAX, &s->end_unix_nano)) {
        return false;
    }
    c->has_span = true;
    return true;
}

static bool ev_common(evdec_t *d, kg_event_common_t *c) {
    json_t *r = d->root;
    return ev_span(d, c) && ev_str(d, r, "request_id", false, &c->request_id, NULL) &&
           ev_str(d, r, "worker_id", false, &c->worker_id, NULL) &&
           ev_str(d, r, "topic", true, &c->topic, NULL) &&
           ev_int32(d, r, "partition", -1, &c->partition) &&
           ev_int(d, r, "offset", -1, INT64_MAX, &c->offset) &&
           ev_str(d, r, "attempt", true, &c->attempt, NULL) &&
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

/* reasoning and its truncation markers, all optional, from object o. */
static bool ev_reasoning(evdec_t *d, json_t *o, kg_event_reasoning_t *r) {
    if (!ev_str(d, o, "reasoning", true, &r->reasoning, &r->reasoning_len)) {
        return false;
    }
    json_t *t = json_object_get(o, "reasoning_truncated");
    r->reasoning_truncated = json_is_true(t);
    if (t && !json_is_boolean(t)) {
        return ev_bad(d, "reasoning_truncated", "true or false");
    }
    return !r->reasoning_truncated ||
           ev_int(d, o, "reasoning_bytes_cut", 1, INT64_MAX, &r->reasoning_bytes_cut);
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

static bool is_str_eq(const json_t *v, const char *s) {
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
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
    json_t *part = json_object_get(d->root, "part");
    if (part) {
        bool r = is_str_eq(part, "reasoning");
        if (!r && !is_str_eq(part, "answer")) {
            return ev_bad(d, "part", "\"reasoning\" or \"answer\"");
        }
        t->part = r ? KG_PART_REASONING : KG_PART_ANSWER;
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

/* tool_calls (optional) of object o, owned by the event. */
static bool ev_tool_calls(evdec_t *d, json_t *o, const kg_toolcall_t **out, size_t *n_out) {
    json_t *arr = json_object_get(o, "tool_calls");
    if (!arr) {
        return true;
    }
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n == 0) {
        return ev_bad(d, "tool_calls", "a non-empty array of calls");
    }
    kg_toolcall_t *cs = calloc(n, sizeof(*cs));
    if (!cs) {
        d->nomem = true;
        return false;
    }
    *out = cs;
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(arr, i);
        json_t *f = json_object_get(c, "function");
        json_t *id = json_object_get(c, "id"), *name = json_object_get(f, "name");
        json_t *args = json_object_get(f, "arguments");
        if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args)) {
            return ev_bad(d, "tool_calls",
                          "{\"id\", \"function\": {\"name\", \"arguments\"}} objects");
        }
        *n_out = i + 1; // freed up to here on failure
        cs[i].id = strdup(json_string_value(id));
        cs[i].name = strdup(json_string_value(name));
        cs[i].arguments = strdup(json_string_value(args));
        if (!cs[i].id || !cs[i].name || !cs[i].arguments) {
            d->nomem = true;
            return false;
        }
    }
    return true;
}

static void free_tool_calls(const kg_toolcall_t *cs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(cs[i].id);
        free(cs[i].name);
        free(cs[i].arguments);
    }
    free((void *)cs);
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
        int f = json_is_string(fr) ? finish_reason_named(json_string_value(fr)) : -1;
        if (!json_is_object(c) || f < 0) {
            return ev_bad(d, "choices", "objects with index, finish_reason, text");
        }
        cs[i].finish_reason = (kg_finish_reason_t)f;
        if (!ev_int32(d, c, "index", 0, &cs[i].index) ||
            !ev_str(d, c, "text", false, &cs[i].text, &cs[i].text_len) ||
            !ev_reasoning(d, c, &cs[i].r) ||
            !ev_tool_calls(d, c, &cs[i].tool_calls, &cs[i].n_tool_calls) ||
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
    *out = kg_codec_metadata_text(d->root, m, d->buf, d->len);
    d->nomem = *out == NULL;
    return *out != NULL;
}

/* An embed job's embeddings, a rerank or score job's results. */
static bool ev_answer(evdec_t *d, kg_event_done_t *e) {
    kg_status_t st = kg_codec_decode_answer(d->root, e, d->errstr, d->errstr_size);
    d->nomem = st == KG_ERR_NOMEM;
    return st == KG_OK;
}

static bool ev_done(evdec_t *d, kg_event_done_t *e) {
    json_t *r = d->root;
    json_t *fr = json_object_get(r, "finish_reason");
    json_t *usage = json_object_get(r, "usage");
    json_t *tm = json_object_get(r, "timings");
    int f = json_is_string(fr) ? finish_reason_named(json_string_value(fr)) : -1;
    if (!ev_common(d, &e->common)) {
        return false;
    }
    if (f < 0) {
        return ev_bad(d, "finish_reason", "stop, length, stop_sequence or tool_calls");
    }
    if (!json_is_object(usage) || !json_is_object(tm)) {
        return ev_bad(d, "usage/timings", "objects");
    }
    e->finish_reason = (kg_finish_reason_t)f;
    return ev_str(d, r, "text", false, &e->text, &e->text_len) && ev_reasoning(d, r, &e->r) &&
           ev_tool_calls(d, r, &e->tool_calls, &e->n_tool_calls) &&
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
           ev_text_cut(d, &e->text_truncated, &e->text_bytes_cut) && ev_answer(d, e);
}

static bool ev_error(evdec_t *d, kg_event_error_t *e) {
    json_t *code = json_object_get(d->root, "code");
    int c = json_is_string(code) ? error_code_named(json_string_value(code)) : -1;
    if (!ev_common(d, &e->common)) {
        return false;
    }
    if (c < 0) {
        return ev_bad(d, "code", "one of the schema's error codes");
    }
    e->code = (kg_error_code_t)c;
    return ev_str(d, d->root, "message", false, &e->message, NULL) &&
           ev_metadata(d, &e->metadata_json) &&
           ev_flag(d, "metadata_truncated", &e->metadata_truncated) &&
           ev_str(d, d->root, "text", true, &e->text, &e->text_len) &&
           ev_text_cut(d, &e->text_truncated, &e->text_bytes_cut);
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
    int t = json_is_string(type) ? event_type_named(json_string_value(type)) : -1;
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
    free((void *)c->attempt);
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
    free((void *)ev->done.r.reasoning);
    free_tool_calls(ev->done.tool_calls, ev->done.n_tool_calls);
    free((void *)ev->done.stop);
    for (int32_t i = 0; i < ev->done.n_logprobs; i++) {
        free_logprobs((kg_token_logprobs_t *)&ev->done.logprobs[i]);
    }
    free((void *)ev->done.logprobs);
    for (int32_t c = 0; c < ev->done.n_choices; c++) {
        const kg_event_choice_t *ch = &ev->done.choices[c];
        free((void *)ch->text);
        free((void *)ch->r.reasoning);
        free_tool_calls(ch->tool_calls, ch->n_tool_calls);
        free((void *)ch->stop);
        for (int32_t i = 0; i < ch->n_logprobs; i++) {
            free_logprobs((kg_token_logprobs_t *)&ch->logprobs[i]);
        }
        free((void *)ch->logprobs);
    }
    free((void *)ev->done.choices);
    free((void *)ev->done.embeddings);
    free((void *)ev->done.results);
    free((void *)ev->done.model);
    free((void *)ev->done.metadata_json);
    free_common(&ev->error.common);
    free((void *)ev->error.message);
    free((void *)ev->error.metadata_json);
    free((void *)ev->error.text);
    free(ev);
}
