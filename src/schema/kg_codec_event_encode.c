/* kg_codec_event_encode: the worker's events (token, done, error) from the
 * plain structs of kg_codec_event.h into JSON text, for pipeline/kg_events.
 * Also the event vocabulary's names (error codes, finish reasons, event
 * types), which the event decoder and the metrics read back. Values are
 * written by kg_codec_writer.c. */
#include "kg_codec_event.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <stdbool.h>

// ---- names ----

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

static const char *const finish_reason_names[] = {"stop", "length", "stop_sequence", "tool_calls"};
static const char *const event_type_names[] = {"token", "done", "error"};

const char *kg_error_code_str(kg_error_code_t code) {
    if ((int)code < 0 || code >= KG_ERROR_CODE_COUNT_) {
        return "internal";
    }
    return error_code_names[code];
}

const char *kg_finish_reason_str(kg_finish_reason_t reason) {
    if ((int)reason < 0 || reason > KG_FINISH_REASON_TOOL_CALLS) {
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

// ---- event encode ----

static json_t *span_json(const kg_event_span_t *sp, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    kg_codec_put(o, "trace_id", kg_codec_cstr_json(sp->trace_id), ok);
    kg_codec_put(o, "span_id", kg_codec_cstr_json(sp->span_id), ok);
    kg_codec_put(o, "parent_span_id", kg_codec_cstr_json(sp->parent_span_id), ok);
    kg_codec_put(o, "start_unix_nano", json_integer(sp->start_unix_nano), ok);
    kg_codec_put(o, "end_unix_nano", json_integer(sp->end_unix_nano), ok);
    return o;
}

static json_t *event_new(const char *type, const kg_event_common_t *c, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    kg_codec_put(o, "type", json_string(type), ok);
    kg_codec_put(o, "request_id", kg_codec_cstr_json(c->request_id), ok);
    kg_codec_put(o, "worker_id", kg_codec_cstr_json(c->worker_id), ok);
    if (c->topic) {
        kg_codec_put(o, "topic", kg_codec_cstr_json(c->topic), ok);
    }
    kg_codec_put(o, "partition", json_integer(c->partition < -1 ? -1 : c->partition), ok);
    kg_codec_put(o, "offset", json_integer(c->offset < -1 ? -1 : c->offset), ok);
    if (c->attempt) {
        kg_codec_put(o, "attempt", kg_codec_cstr_json(c->attempt), ok);
    }
    kg_codec_put(o, "schema_version", json_integer(KG_SCHEMA_VERSION), ok);
    kg_codec_put(o, "ts_ms", json_integer(c->ts_ms < 0 ? 0 : c->ts_ms), ok);
    if (c->has_span) {
        kg_codec_put(o, "span", span_json(&c->span, ok), ok);
    }
    return o;
}

static json_t *candidate_json(const kg_logprob_entry_t *e, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    kg_codec_put(o, "token_id", json_integer(e->token_id), ok);
    kg_codec_put(o, "text", kg_codec_text_json(e->text, e->text_len), ok);
    kg_codec_put(o, "logprob", kg_codec_logprob_json(e->logprob), ok);
    return o;
}

static json_t *top_json(const kg_token_logprobs_t *lp, bool *ok) {
    json_t *arr = json_array();
    int32_t n = lp->n_top < 0 ? 0 : lp->n_top > KG_MAX_LOGPROBS ? KG_MAX_LOGPROBS : lp->n_top;
    if (!arr) {
        *ok = false;
    }
    for (int32_t i = 0; arr && i < n; i++) {
        kg_codec_append(arr, candidate_json(&lp->top[i], ok), ok);
    }
    return arr;
}

static char *finish_event(json_t *o, bool ok, const char *metadata_json, size_t *len) {
    char *text = ok ? kg_codec_dump_with_metadata(o, metadata_json, len) : NULL;
    json_decref(o);
    return text;
}

static void put_reasoning(json_t *o, const kg_event_reasoning_t *r, bool *ok) {
    if (r->reasoning) {
        kg_codec_put(o, "reasoning", kg_codec_text_json(r->reasoning, r->reasoning_len), ok);
    }
    if (r->reasoning_truncated) {
        kg_codec_put(o, "reasoning_truncated", json_true(), ok);
        kg_codec_put(o, "reasoning_bytes_cut", json_integer(r->reasoning_bytes_cut), ok);
    }
}

/* The markers of what an event left out to fit (written only when set). */
static void put_truncation(json_t *o, bool logprobs, bool metadata, int64_t text_cut, bool *ok) {
    if (logprobs) {
        kg_codec_put(o, "logprobs_truncated", json_true(), ok);
    }
    if (metadata) {
        kg_codec_put(o, "metadata_truncated", json_true(), ok);
    }
    if (text_cut > 0) {
        kg_codec_put(o, "text_truncated", json_true(), ok);
        kg_codec_put(o, "text_bytes_cut", json_integer(text_cut), ok);
    }
}

char *kg_codec_encode_token(const kg_event_token_t *ev, size_t *len) {
    bool ok = true;
    json_t *o = event_new("token", &ev->common, &ok);
    if (o && ev->has_choice) {
        kg_codec_put(o, "choice", json_integer(ev->choice), &ok);
    }
    if (o) {
        kg_codec_put(o, "index", json_integer(ev->index), &ok);
        kg_codec_put(o, "token_id", json_integer(ev->token_id), &ok);
        kg_codec_put(o, "text", kg_codec_text_json(ev->text, ev->text_len), &ok);
        if (ev->part != KG_PART_NONE) {
            kg_codec_put(o, "part",
                         json_string(ev->part == KG_PART_REASONING ? "reasoning" : "answer"), &ok);
        }
        put_truncation(o, ev->logprobs_truncated, false,
                       ev->text_truncated ? ev->text_bytes_cut : 0, &ok);
    }
    if (o && ev->has_logprobs) {
        json_t *lp = json_object();
        kg_codec_put(o, "logprobs", lp, &ok);
        if (lp) {
            kg_codec_put(lp, "logprob", kg_codec_logprob_json(ev->logprobs.token.logprob), &ok);
            kg_codec_put(lp, "top", top_json(&ev->logprobs, &ok), &ok);
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
        kg_codec_append(arr, e, ok);
        if (e) {
            kg_codec_put(e, "top", top_json(&lps[i], ok), ok);
        }
    }
    return arr;
}

/* OpenAI's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}] */
static void put_tool_calls(json_t *o, const kg_toolcall_t *calls, size_t n, bool *ok) {
    if (n == 0) {
        return;
    }
    json_t *arr = json_array();
    kg_codec_put(o, "tool_calls", arr, ok);
    for (size_t i = 0; arr && i < n; i++) {
        json_t *c = json_object(), *f = json_object();
        kg_codec_append(arr, c, ok);
        if (!c) {
            json_decref(f);
            break;
        }
        kg_codec_put(c, "id", kg_codec_cstr_json(calls[i].id), ok);
        kg_codec_put(c, "type", json_string("function"), ok);
        kg_codec_put(c, "function", f, ok);
        if (f) {
            kg_codec_put(f, "name", kg_codec_cstr_json(calls[i].name), ok);
            kg_codec_put(f, "arguments", kg_codec_cstr_json(calls[i].arguments), ok);
        }
    }
}

static json_t *choices_json(const kg_event_done_t *ev, bool *ok) {
    json_t *arr = json_array();
    if (!arr) {
        *ok = false;
    }
    for (int32_t i = 0; arr && i < ev->n_choices; i++) {
        const kg_event_choice_t *c = &ev->choices[i];
        json_t *o = json_object();
        kg_codec_append(arr, o, ok);
        if (!o) {
            break;
        }
        kg_codec_put(o, "index", json_integer(c->index), ok);
        kg_codec_put(o, "finish_reason", json_string(kg_finish_reason_str(c->finish_reason)), ok);
        kg_codec_put(o, "text", kg_codec_text_json(c->text, c->text_len), ok);
        put_reasoning(o, &c->r, ok);
        put_tool_calls(o, c->tool_calls, c->n_tool_calls, ok);
        if (c->stop) {
            kg_codec_put(o, "stop", kg_codec_text_json(c->stop, c->stop_len), ok);
        }
        kg_codec_put(o, "completion_tokens", json_integer(c->completion_tokens), ok);
        if (c->logprobs && c->n_logprobs > 0) {
            kg_codec_put(o, "logprobs", done_logprobs_json(c->logprobs, c->n_logprobs, ok), ok);
        }
        if (c->text_truncated) {
            kg_codec_put(o, "text_truncated", json_true(), ok);
            kg_codec_put(o, "text_bytes_cut", json_integer(c->text_bytes_cut), ok);
        }
    }
    return arr;
}

static void put_usage_timings(json_t *o, const kg_event_done_t *ev, bool *ok) {
    json_t *usage = json_object();
    json_t *timings = json_object();
    kg_codec_put(o, "usage", usage, ok);
    kg_codec_put(o, "timings", timings, ok);
    if (!usage || !timings) {
        return;
    }
    kg_codec_put(usage, "prompt_tokens", json_integer(ev->prompt_tokens), ok);
    kg_codec_put(usage, "completion_tokens", json_integer(ev->completion_tokens), ok);
    kg_codec_put(usage, "cached_tokens", json_integer(ev->cached_tokens), ok);
    kg_codec_put(timings, "queue_ms", kg_codec_nonneg_json(ev->queue_ms), ok);
    kg_codec_put(timings, "ttft_ms", kg_codec_nonneg_json(ev->ttft_ms), ok);
    kg_codec_put(timings, "total_ms", kg_codec_nonneg_json(ev->total_ms), ok);
    kg_codec_put(timings, "tokens_per_s", kg_codec_nonneg_json(ev->tokens_per_s), ok);
}

char *kg_codec_encode_done(const kg_event_done_t *ev, size_t *len) {
    bool ok = true;
    json_t *o = event_new("done", &ev->common, &ok);
    if (o) {
        kg_codec_put(o, "finish_reason", json_string(kg_finish_reason_str(ev->finish_reason)), &ok);
        kg_codec_put(o, "text", kg_codec_text_json(ev->text, ev->text_len), &ok);
        put_reasoning(o, &ev->r, &ok);
        put_tool_calls(o, ev->tool_calls, ev->n_tool_calls, &ok);
        if (ev->stop) {
            kg_codec_put(o, "stop", kg_codec_text_json(ev->stop, ev->stop_len), &ok);
        }
        put_usage_timings(o, ev, &ok);
        if (ev->logprobs && ev->n_logprobs > 0) {
            kg_codec_put(o, "logprobs", done_logprobs_json(ev->logprobs, ev->n_logprobs, &ok), &ok);
        }
        if (ev->choices && ev->n_choices > 0) {
            kg_codec_put(o, "choices", choices_json(ev, &ok), &ok);
        }
        if (ev->model) {
            kg_codec_put(o, "model", kg_codec_cstr_json(ev->model), &ok);
        }
        if (ev->embeddings && ev->n_embeddings > 0) {
            kg_codec_put(o, "embeddings",
                         kg_codec_embeddings_json(ev->embeddings, ev->n_embeddings,
                                                  ev->embedding_dim, ev->embeddings_base64),
                         &ok);
        }
        if (ev->has_results) {
            kg_codec_put(o, "results", kg_codec_results_json(ev->results, ev->n_results), &ok);
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
        kg_codec_put(o, "code", json_string(kg_error_code_str(ev->code)), &ok);
        kg_codec_put(o, "message", kg_codec_cstr_json(ev->message), &ok);
        if (ev->text) {
            kg_codec_put(o, "text", kg_codec_text_json(ev->text, ev->text_len), &ok);
        }
        put_truncation(o, false, ev->metadata_truncated,
                       ev->text_truncated ? ev->text_bytes_cut : 0, &ok);
    }
    return finish_event(o, ok, ev->metadata_json, len);
}
