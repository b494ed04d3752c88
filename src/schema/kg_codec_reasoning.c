/* kg_codec_reasoning: the job fields that reach the chat template or shape
 * reasoning (chat_template_kwargs, reasoning_effort, tools,
 * reasoning_format, thinking_token_budget), decoded, encoded back and
 * turned into the template's variables. Kept apart from kg_codec.c so the
 * job codec's other fields and these merge independently. */
#include "kg_codec.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REASONING_EFFORT_MAX 64 /* bytes: a template variable, not free text */

static kg_status_t bad(char *msg, size_t size, const char *field, const char *expect, json_t *v) {
    char what[64];
    kg_codec_describe_json(v, what, sizeof(what));
    snprintf(msg, size, "%s: expected %s, got %s", field, expect, what);
    return KG_ERR_INVALID;
}

static json_t *given(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static kg_status_t compact(json_t *v, char **out) {
    *out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    return *out ? KG_OK : KG_ERR_NOMEM;
}

kg_status_t kg_codec_decode_reasoning(json_t *root, kg_job_t *job, char *msg, size_t msg_size) {
    json_t *v;
    kg_status_t st;
    if ((v = given(root, "chat_template_kwargs"))) {
        if (!json_is_object(v)) {
            return bad(msg, msg_size, "chat_template_kwargs", "an object", v);
        }
        if ((st = compact(v, &job->template_kwargs_json)) != KG_OK) {
            return st;
        }
    }
    if ((v = given(root, "reasoning_effort"))) {
        size_t n = json_string_length(v);
        if (!json_is_string(v) || n == 0 || n > REASONING_EFFORT_MAX ||
            memchr(json_string_value(v), 0, n)) {
            return bad(msg, msg_size, "reasoning_effort",
                       "a string of 1..64 bytes (\"low\", \"medium\", \"high\")", v);
        }
        job->reasoning_effort = kg_codec_dup_bytes(json_string_value(v), n);
        if (!job->reasoning_effort) {
            return KG_ERR_NOMEM;
        }
    }
    if ((v = given(root, "tools"))) {
        if (!json_is_array(v)) {
            return bad(msg, msg_size, "tools", "an array of tool definitions", v);
        }
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (!json_is_object(json_array_get(v, i))) {
                char field[32];
                snprintf(field, sizeof(field), "tools[%zu]", i);
                return bad(msg, msg_size, field, "an object", json_array_get(v, i));
            }
        }
        if (json_array_size(v) > 0 && (st = compact(v, &job->tools_json)) != KG_OK) {
            return st;
        }
    }
    if ((v = given(root, "reasoning_format"))) {
        static const char *const names[] = {"auto", "none", "deepseek"};
        int found = -1;
        for (int i = 0; i < 3 && json_is_string(v); i++) {
            found = strcmp(json_string_value(v), names[i]) == 0 ? i : found;
        }
        if (found < 0) {
            return bad(msg, msg_size, "reasoning_format", "\"auto\", \"none\" or \"deepseek\"", v);
        }
        job->reasoning_format = (kg_reasoning_format_t)found;
    }
    if ((v = given(root, "thinking_token_budget"))) {
        int64_t b;
        if (!kg_codec_as_int(v, 0, INT32_MAX, &b)) {
            return bad(msg, msg_size, "thinking_token_budget", "an integer in 0..2147483647", v);
        }
        job->has_thinking_budget = true;
        job->thinking_token_budget = (int32_t)b;
    }
    return KG_OK;
}

void kg_codec_encode_reasoning(json_t *o, const kg_job_t *job, bool *ok) {
    static const char *const formats[] = {"auto", "none", "deepseek"};
    if (job->template_kwargs_json) {
        kg_codec_put(o, "chat_template_kwargs",
                     json_loads(job->template_kwargs_json, KG_LOAD_FLAGS, NULL), ok);
    }
    if (job->reasoning_effort) {
        kg_codec_put(o, "reasoning_effort", kg_codec_cstr_json(job->reasoning_effort), ok);
    }
    if (job->tools_json) {
        kg_codec_put(o, "tools", json_loads(job->tools_json, KG_LOAD_FLAGS, NULL), ok);
    }
    if (job->reasoning_format != KG_REASONING_AUTO) {
        kg_codec_put(o, "reasoning_format", json_string(formats[job->reasoning_format]), ok);
    }
    if (job->has_thinking_budget) {
        kg_codec_put(o, "thinking_token_budget", json_integer(job->thinking_token_budget), ok);
    }
}

void kg_codec_copy_reasoning(const json_t *body, json_t *job, bool chat, bool *ok) {
    static const char *const same[] = {"chat_template_kwargs", "reasoning_effort",
                                       "reasoning_format", "thinking_token_budget"};
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        json_t *v = json_object_get(body, same[i]);
        if (v) {
            kg_codec_put(job, same[i], json_incref(v), ok);
        }
    }
    /* a chat body's tools reach the template (and, unless tool_choice is
     * "none", the call parse: kg_codec_tools.c) */
    json_t *tools = json_object_get(body, "tools");
    if (chat && json_array_size(tools) > 0) {
        kg_codec_put(job, "tools", json_incref(tools), ok);
    }
}

char *kg_job_template_vars(const kg_job_t *job, bool *oom) {
    *oom = false;
    if (!job->template_kwargs_json && !job->reasoning_effort && !job->tools_json) {
        return NULL;
    }
    json_t *o = json_object();
    bool ok = o != NULL;
    if (job->reasoning_effort) {
        kg_codec_put(o, "reasoning_effort", kg_codec_cstr_json(job->reasoning_effort), &ok);
    }
    if (job->tools_json) {
        kg_codec_put(o, "tools", json_loads(job->tools_json, KG_LOAD_FLAGS, NULL), &ok);
    }
    json_t *kw = job->template_kwargs_json
                     ? json_loads(job->template_kwargs_json, KG_LOAD_FLAGS, NULL)
                     : NULL;
    if (ok && kw && json_object_update(o, kw) != 0) {
        ok = false;
    }
    json_decref(kw);
    char *text = ok ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    *oom = text == NULL;
    return text;
}
