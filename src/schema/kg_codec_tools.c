/* kg_codec_tools: the job fields that ask for tool calls (tool_choice,
 * parallel_tool_calls) and the check of the tools they call, decoded,
 * encoded back and copied from OpenAI bodies. Apart from the reasoning
 * fields' file (which decodes `tools` itself, for the template) so each
 * merges on its own. */
#include "kg_codec.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL_NAME_MAX 256 /* bytes of a function name (OpenAI allows 64 of [a-zA-Z0-9_-]) */

static json_t *given(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static kg_status_t bad(char *msg, size_t size, const char *field, const char *expect, json_t *v) {
    char what[64];
    kg_codec_describe_json(v, what, sizeof(what));
    snprintf(msg, size, "%s: expected %s, got %s", field, expect, what);
    return KG_ERR_INVALID;
}

/* A function's name: what a call names and the call syntaxes write bare. */
static bool good_name(json_t *v) {
    size_t n = json_string_length(v);
    if (!json_is_string(v) || n == 0 || n > TOOL_NAME_MAX) {
        return false;
    }
    const char *s = json_string_value(v);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
        if (!ok) {
            return false;
        }
    }
    return true;
}

/* Each tool, when calls are parsed: {"type": "function", "function": {"name",
 * "parameters"?}}, names distinct (a call names its tool). */
static kg_status_t check_tools(json_t *tools, char *msg, size_t size) {
    char field[48];
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *type = json_object_get(t, "type");
        json_t *f = json_object_get(t, "function");
        snprintf(field, sizeof(field), "tools[%zu]", i);
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_object(f)) {
            return bad(msg, size, field, "{\"type\": \"function\", \"function\": {...}}", t);
        }
        snprintf(field, sizeof(field), "tools[%zu].function.name", i);
        json_t *name = json_object_get(f, "name");
        if (!good_name(name)) {
            return bad(msg, size, field, "1..256 characters of [a-zA-Z0-9_.-]", name);
        }
        json_t *params = given(f, "parameters");
        snprintf(field, sizeof(field), "tools[%zu].function.parameters", i);
        if (params && !json_is_object(params) && !json_is_boolean(params)) {
            return bad(msg, size, field, "a JSON Schema (an object)", params);
        }
        for (size_t k = 0; k < i; k++) {
            json_t *other =
                json_object_get(json_object_get(json_array_get(tools, k), "function"), "name");
            if (json_equal(other, name)) {
                snprintf(msg, size, "tools[%zu].function.name: \"%s\" is also tools[%zu]'s", i,
                         json_string_value(name), k);
                return KG_ERR_INVALID;
            }
        }
    }
    return KG_OK;
}

/* Whether tool `name` is among the tools. */
static bool has_tool(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && strcmp(n, name) == 0) {
            return true;
        }
    }
    return false;
}

kg_status_t kg_codec_decode_tools(json_t *root, kg_job_t *job, char *msg, size_t msg_size) {
    json_t *v;
    json_t *tools = given(root, "tools");
    if ((v = given(root, "tool_choice"))) {
        static const char *const names[] = {"auto", "none", "required"};
        const char *s = json_string_value(v);
        int found = -1;
        for (int i = 0; i < 3 && s; i++) {
            found = strcmp(s, names[i]) == 0 ? i : found;
        }
        json_t *fname = json_object_get(json_object_get(v, "function"), "name");
        if (found >= 0) {
            job->tool_choice = (kg_tool_choice_t)found;
        } else if (json_is_object(v) && good_name(fname)) {
            job->tool_choice = KG_TOOL_CHOICE_FUNCTION;
            job->tool_choice_name =
                kg_codec_dup_bytes(json_string_value(fname), json_string_length(fname));
            if (!job->tool_choice_name) {
                return KG_ERR_NOMEM;
            }
        } else {
            return bad(msg, msg_size, "tool_choice",
                       "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}",
                       v);
        }
    }
    if ((v = given(root, "parallel_tool_calls"))) {
        if (!json_is_boolean(v)) {
            return bad(msg, msg_size, "parallel_tool_calls", "true or false", v);
        }
        job->no_parallel_tool_calls = json_is_false(v);
    }
    if (job->tool_choice == KG_TOOL_CHOICE_NONE) {
        return KG_OK; /* tools shown to the model only, as they are */
    }
    if (json_array_size(tools) == 0) {
        if (job->tool_choice == KG_TOOL_CHOICE_AUTO) {
            return KG_OK;
        }
        snprintf(msg, msg_size, "tool_choice: %s needs tools to call",
                 job->tool_choice == KG_TOOL_CHOICE_REQUIRED ? "\"required\"" : "a function");
        return KG_ERR_INVALID;
    }
    kg_status_t st = check_tools(tools, msg, msg_size);
    if (st != KG_OK) {
        return st;
    }
    if (job->tool_choice == KG_TOOL_CHOICE_FUNCTION && !has_tool(tools, job->tool_choice_name)) {
        snprintf(msg, msg_size, "tool_choice: \"%s\" is not one of the tools",
                 job->tool_choice_name);
        return KG_ERR_INVALID;
    }
    if (job->tool_choice >= KG_TOOL_CHOICE_REQUIRED && job->constraint != KG_CONSTRAINT_NONE) {
        snprintf(msg, msg_size,
                 "tool_choice: a required call is constrained by the tools' schemas, so it cannot "
                 "be combined with %s",
                 kg_constraint_kind_str(job->constraint));
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

void kg_codec_encode_tools(json_t *o, const kg_job_t *job, bool *ok) {
    static const char *const names[] = {"auto", "none", "required"};
    if (job->tool_choice == KG_TOOL_CHOICE_FUNCTION) {
        json_t *f = json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name",
                              job->tool_choice_name);
        kg_codec_put(o, "tool_choice", f, ok);
    } else if (job->tool_choice != KG_TOOL_CHOICE_AUTO) {
        kg_codec_put(o, "tool_choice", json_string(names[job->tool_choice]), ok);
    }
    if (job->no_parallel_tool_calls) {
        kg_codec_put(o, "parallel_tool_calls", json_false(), ok);
    }
}

void kg_codec_copy_tools(const json_t *body, json_t *job, bool *ok) {
    json_t *v = json_object_get(body, "tool_choice");
    if (v && !json_is_null(v)) {
        kg_codec_put(job, "tool_choice", json_incref(v), ok);
    }
    v = json_object_get(body, "parallel_tool_calls");
    if (v && !json_is_null(v)) {
        kg_codec_put(job, "parallel_tool_calls", json_incref(v), ok);
    }
}

/* One entry of an assistant turn's tool_calls: {"id"?, "type": "function",
 * "function": {"name", "arguments": a string (OpenAI's) or an object}}. */
static bool good_call(json_t *c) {
    json_t *f = json_object_get(c, "function");
    json_t *id = json_object_get(c, "id");
    json_t *type = json_object_get(c, "type");
    json_t *args = json_object_get(f, "arguments");
    return json_is_object(c) && json_is_object(f) && good_name(json_object_get(f, "name")) &&
           (!id || json_is_string(id)) &&
           (!type || (json_is_string(type) && strcmp(json_string_value(type), "function") == 0)) &&
           (json_is_string(args) || json_is_object(args));
}

kg_status_t kg_codec_decode_message_tools(
    const json_t *m, size_t i, const char *role, json_t **extra, char *msg, size_t msg_size) {
    *extra = NULL;
    json_t *calls = given((json_t *)m, "tool_calls");
    json_t *call_id = given((json_t *)m, "tool_call_id");
    /* a tool result's function name; other turns' names (OpenAI's participant names) stay
     * unused, as llama.cpp leaves them */
    json_t *name = strcmp(role, "tool") == 0 ? given((json_t *)m, "name") : NULL;
    char field[64];
    if (calls) {
        snprintf(field, sizeof(field), "messages[%zu].tool_calls", i);
        if (strcmp(role, "assistant") != 0) {
            snprintf(msg, msg_size, "%s: only an assistant turn makes tool calls", field);
            return KG_ERR_INVALID;
        }
        bool ok = json_is_array(calls);
        for (size_t k = 0; ok && k < json_array_size(calls); k++) {
            ok = good_call(json_array_get(calls, k));
        }
        if (!ok) {
            return bad(msg, msg_size, field,
                       "an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                       "\"arguments\"}}",
                       calls);
        }
    }
    if (call_id && !json_is_string(call_id)) {
        snprintf(field, sizeof(field), "messages[%zu].tool_call_id", i);
        return bad(msg, msg_size, field, "a string", call_id);
    }
    if (name && !json_is_string(name)) {
        snprintf(field, sizeof(field), "messages[%zu].name", i);
        return bad(msg, msg_size, field, "a string", name);
    }
    if (json_array_size(calls) == 0 && !call_id && !name) {
        return KG_OK;
    }
    json_t *o = json_object();
    if (!o) {
        return KG_ERR_NOMEM;
    }
    bool ok = true;
    if (json_array_size(calls) > 0) {
        kg_codec_put(o, "tool_calls", json_incref(calls), &ok);
    }
    if (call_id) {
        kg_codec_put(o, "tool_call_id", json_incref(call_id), &ok);
    }
    if (name) {
        kg_codec_put(o, "name", json_incref(name), &ok);
    }
    if (!ok) {
        json_decref(o);
        return KG_ERR_NOMEM;
    }
    *extra = o;
    return KG_OK;
}
