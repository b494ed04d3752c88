/* kg_chat_jinja: chat rendering through the model's own template with the
 * Jinja engine (src/jinja): the variables a template expects, built from a
 * conversation or from JSON (jansson stays in src/schema), as llama.cpp's
 * --jinja path sets them: messages, bos_token, eos_token, enable_thinking
 * (true unless the job's chat_template_kwargs say otherwise),
 * add_generation_prompt (only when true), tools (only when given),
 * date_string / datetime, and every chat_template_kwargs key as a
 * top-level variable. */
#include "../core/kg_log.h"
#include "../jinja/kg_jinja.h"
#include "kg_chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- JSON -> values ----

static kg_jinja_value_t from_json(kg_jinja_ctx_t *ctx, const json_t *j, int depth) {
    if (depth > 64) {
        return kg_jinja_none();
    }
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        kg_jinja_value_t d = kg_jinja_dict_new(ctx);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            if (kg_jinja_dict_set(ctx, d, k, from_json(ctx, v, depth + 1)) != KG_OK) {
                break;
            }
        }
        return d;
    }
    case JSON_ARRAY: {
        kg_jinja_value_t l = kg_jinja_list_new(ctx);
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            if (kg_jinja_list_push(ctx, l, from_json(ctx, v, depth + 1)) != KG_OK) {
                break;
            }
        }
        return l;
    }
    case JSON_STRING:
        return kg_jinja_string(ctx, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return kg_jinja_int((int64_t)json_integer_value(j));
    case JSON_REAL:
        return kg_jinja_float(json_real_value(j));
    case JSON_TRUE:
        return kg_jinja_bool(true);
    case JSON_FALSE:
        return kg_jinja_bool(false);
    default:
        return kg_jinja_none();
    }
}

kg_status_t kg_chat_jinja_set_json(
    kg_jinja_ctx_t *ctx, const char *json, size_t len, char *errstr, size_t errstr_size) {
    json_error_t e;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &e);
    if (!root || !json_is_object(root)) {
        snprintf(errstr, errstr_size, "template variables: %s",
                 root ? "expected a JSON object" : e.text);
        json_decref(root);
        return KG_ERR_INVALID;
    }
    const char *k;
    json_t *v;
    kg_status_t st = KG_OK;
    json_object_foreach(root, k, v) {
        st = kg_jinja_ctx_set(ctx, k, from_json(ctx, v, 0));
        if (st != KG_OK) {
            break;
        }
    }
    json_decref(root);
    if (st != KG_OK || kg_jinja_ctx_failed(ctx)) {
        snprintf(errstr, errstr_size, "template variables: past the template's memory limit");
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

// ---- a conversation ----

static kg_status_t set_str(kg_jinja_ctx_t *ctx, const char *name, const char *s) {
    return kg_jinja_ctx_set(ctx, name, kg_jinja_string(ctx, s ? s : "", s ? strlen(s) : 0));
}

static kg_status_t set_dates(kg_jinja_ctx_t *ctx, int64_t now_s) {
    time_t now = now_s ? (time_t)now_s : time(NULL);
    struct tm tm;
    char datetime[64] = "", date[64] = "";
    if (gmtime_r(&now, &tm)) {
        strftime(datetime, sizeof(datetime), "%b %d %Y", &tm);
        strftime(date, sizeof(date), "%d %b %Y", &tm);
    }
    kg_status_t st = set_str(ctx, "datetime", datetime);
    return st != KG_OK ? st : set_str(ctx, "date_string", date);
}

/* A message's extra keys (tool_calls, tool_call_id, name) into dict m; with
 * `object_args`, calls' arguments strings become the objects they hold, as
 * llama.cpp passes them to templates that read arguments as an object (its
 * supports_object_arguments probe; kg_chat_jinja_new probes the same). */
static kg_status_t
set_extra(kg_jinja_ctx_t *ctx, kg_jinja_value_t m, const char *xj, bool object_args) {
    json_t *extra = xj ? json_loads(xj, 0, NULL) : NULL;
    json_t *calls = json_object_get(extra, "tool_calls");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *f = json_object_get(c, "function");
        json_t *args = json_object_get(f, "arguments");
        json_t *obj = object_args && json_is_string(args)
                          ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
                          : NULL;
        if (obj) {
            json_object_set_new(f, "arguments", obj);
        }
    }
    kg_status_t st = KG_OK;
    const char *k;
    json_t *v;
    json_object_foreach(extra, k, v) {
        if (st == KG_OK) {
            st = kg_jinja_dict_set(ctx, m, k, from_json(ctx, v, 0));
        }
    }
    json_decref(extra);
    return st;
}

static kg_status_t render(const kg_jinja_template_t *tmpl,
                          bool merge_system,
                          bool object_args,
                          const kg_chat_message_t *msgs,
                          size_t n,
                          const kg_chat_jinja_opts_t *o,
                          char **out,
                          char *errstr,
                          size_t errstr_size) {
    *out = NULL;
    kg_jinja_ctx_t *ctx = kg_jinja_ctx_new(o->limits);
    if (!ctx) {
        return KG_ERR_NOMEM;
    }
    kg_jinja_ctx_set_time(ctx, o->now_s);
    kg_status_t st = set_dates(ctx, o->now_s);
    kg_jinja_value_t list = kg_jinja_list_new(ctx);
    /* llama.cpp's workaround for templates without a system role: the system
     * text goes before the next message's, or is dropped when alone */
    bool merge = merge_system && n > 0 && strcmp(msgs[0].role, "system") == 0;
    for (size_t i = merge ? 1 : 0; st == KG_OK && i < n; i++) {
        kg_jinja_value_t m = kg_jinja_dict_new(ctx);
        st = kg_jinja_dict_set(ctx, m, "role",
                               kg_jinja_string(ctx, msgs[i].role, strlen(msgs[i].role)));
        kg_jinja_value_t content = kg_jinja_string(ctx, msgs[i].content, strlen(msgs[i].content));
        if (merge && i == 1) {
            size_t a = strlen(msgs[0].content), b = strlen(msgs[1].content);
            char *joined = malloc(a + b + 2);
            if (!joined) {
                st = KG_ERR_NOMEM;
                break;
            }
            memcpy(joined, msgs[0].content, a);
            joined[a] = '\n';
            memcpy(joined + a + 1, msgs[1].content, b + 1);
            content = kg_jinja_string(ctx, joined, a + b + 1);
            free(joined);
        }
        if (st == KG_OK) {
            st = kg_jinja_dict_set(ctx, m, "content", content);
        }
        if (st == KG_OK && o->message_extra && o->message_extra[i]) {
            st = set_extra(ctx, m, o->message_extra[i], object_args);
        }
        if (st == KG_OK) {
            st = kg_jinja_list_push(ctx, list, m);
        }
    }
    if (st == KG_OK) {
        st = kg_jinja_ctx_set(ctx, "messages", list);
    }
    if (st == KG_OK) {
        st = set_str(ctx, "bos_token", o->bos_text);
    }
    if (st == KG_OK) {
        st = set_str(ctx, "eos_token", o->eos_text);
    }
    if (st == KG_OK) {
        st = kg_jinja_ctx_set(ctx, "enable_thinking", kg_jinja_bool(true));
    }
    if (st == KG_OK && o->add_generation_prompt) {
        st = kg_jinja_ctx_set(ctx, "add_generation_prompt", kg_jinja_bool(true));
    }
    if (st != KG_OK) {
        kg_jinja_ctx_free(ctx);
        snprintf(errstr, errstr_size, "chat template: the conversation passed its memory limit");
        return st == KG_ERR_NOMEM ? st : KG_ERR_INVALID;
    }
    if (o->extra_json && o->extra_json_len > 0) {
        st = kg_chat_jinja_set_json(ctx, o->extra_json, o->extra_json_len, errstr, errstr_size);
        if (st != KG_OK) {
            kg_jinja_ctx_free(ctx);
            return st;
        }
    }
    size_t len = 0;
    char err[400] = "";
    st = kg_jinja_render(tmpl, ctx, out, &len, err, sizeof(err));
    kg_jinja_ctx_free(ctx);
    if (st == KG_ERR_INVALID) {
        snprintf(errstr, errstr_size, "chat template: %s", err);
    }
    return st;
}

// ---- compiled templates ----

struct kg_chat_jinja {
    kg_jinja_template_t *tmpl;
    bool system_role;
    bool object_args; /* tool calls' arguments go to the template as objects */
};

/* llama.cpp's supports_system_role probe: a system message the template
 * does not write (or that makes it raise) means it has no system role. */
static bool probe_system_role(const kg_jinja_template_t *tmpl) {
    static const char probe[] = "kgen-probe-system-7f3a";
    kg_chat_message_t msgs[] = {{"system", probe}, {"user", "User message"}};
    kg_chat_jinja_opts_t o = {.add_generation_prompt = true};
    char *out = NULL, err[64];
    if (render(tmpl, false, false, msgs, 2, &o, &out, err, sizeof(err)) != KG_OK) {
        return false;
    }
    bool used = strstr(out, probe) != NULL;
    free(out);
    return used;
}

/* llama.cpp's supports_object_arguments probe: an assistant turn whose call
 * has object arguments; a template that writes the argument's value (tojson,
 * or reading its member) takes objects, one that raises or leaves it out
 * takes the JSON text. */
static bool probe_object_args(const kg_jinja_template_t *tmpl) {
    static const char probe[] = "kgen-probe-args-5c1d";
    static const char tools[] =
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"tool_name\","
        "\"description\":\"Tool description\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"arg\":{\"type\":\"string\"}},\"required\":[\"arg\"]}}}]}";
    const char *extra[] = {NULL, "{\"tool_calls\":[{\"id\":\"call_1___\",\"type\":\"function\","
                                 "\"function\":{\"name\":\"tool_name\",\"arguments\":{\"arg\":"
                                 "\"kgen-probe-args-5c1d\"}}}]}"};
    kg_chat_message_t msgs[] = {{"user", "User message"}, {"assistant", ""}};
    kg_chat_jinja_opts_t o = {
        .extra_json = tools, .extra_json_len = sizeof(tools) - 1, .message_extra = extra};
    char *out = NULL, err[64];
    if (render(tmpl, false, false, msgs, 2, &o, &out, err, sizeof(err)) != KG_OK) {
        return false;
    }
    bool used = strstr(out, probe) != NULL;
    free(out);
    return used;
}

kg_chat_jinja_t *
kg_chat_jinja_new(const char *template_text, size_t len, char *errstr, size_t errstr_size) {
    kg_chat_jinja_t *chat = calloc(1, sizeof(*chat));
    if (!chat) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    chat->tmpl = kg_jinja_compile(template_text, len, errstr, errstr_size);
    if (!chat->tmpl) {
        free(chat);
        return NULL;
    }
    chat->system_role = probe_system_role(chat->tmpl);
    chat->object_args = probe_object_args(chat->tmpl);
    return chat;
}

kg_chat_jinja_t *kg_chat_jinja_compile(const char *template_text) {
    if (!template_text) {
        return NULL;
    }
    char err[400] = "";
    kg_chat_jinja_t *chat =
        kg_chat_jinja_new(template_text, strlen(template_text), err, sizeof(err));
    if (!chat) {
        KG_LOG_WARN("chat",
                    "the model's chat template does not compile, so chat jobs use the "
                    "recognised-family renderer: %s",
                    err);
    }
    return chat;
}

void kg_chat_jinja_free(kg_chat_jinja_t *chat) {
    if (!chat) {
        return;
    }
    kg_jinja_template_free(chat->tmpl);
    free(chat);
}

bool kg_chat_jinja_system_role(const kg_chat_jinja_t *chat) {
    return chat->system_role;
}

kg_status_t kg_chat_render_jinja(const kg_chat_jinja_t *chat,
                                 const kg_chat_message_t *msgs,
                                 size_t n,
                                 const kg_chat_jinja_opts_t *o,
                                 char **out,
                                 char *errstr,
                                 size_t errstr_size) {
    return render(chat->tmpl, !chat->system_role, chat->object_args, msgs, n, o, out, errstr,
                  errstr_size);
}
