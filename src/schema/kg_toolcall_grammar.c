/* kg_toolcall_grammar: the grammar of a required tool call (tool_choice
 * "required" or a named function): each tool's arguments constrained by its
 * parameters' JSON Schema (kg_json_schemas_gir, the structured-output
 * engine's), inside the call syntax of the model's template, so a model must
 * call and every call's arguments validate. The constraint's text (the cache
 * key) is a small JSON spec: {"format", "names", "params", "only",
 * "parallel"}. */
#include "kg_json_schema.h"
#include "kg_toolcall.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END   "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN  "<｜tool▁call▁begin｜>"
#define DS_CALL_END    "<｜tool▁call▁end｜>"
#define DS_SEP         "<｜tool▁sep｜>"

#define KIMI_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define KIMI_SECTION_END   "<|tool_calls_section_end|>"

/* The tagged parameters (Qwen3-Coder, GLM, MiniMax-M2) are no JSON document the schema engine
 * can constrain. */
static bool constrainable(kg_toolfmt_t f) {
    return f != KG_TOOLFMT_NONE && f != KG_TOOLFMT_QWEN3_CODER && f != KG_TOOLFMT_GLM &&
           f != KG_TOOLFMT_MINIMAX_M2;
}

char *kg_toolcall_constraint(kg_toolfmt_t f,
                             const char *tools_json,
                             const char *only,
                             bool parallel,
                             size_t *len,
                             char *msg,
                             size_t msg_size) {
    if (!constrainable(f)) {
        snprintf(msg, msg_size,
                 "tool_choice: a required call cannot be constrained in this model's call "
                 "syntax (%s); send tool_choice \"auto\"",
                 kg_toolfmt_name(f));
        return NULL;
    }
    json_t *tools = json_loads(tools_json, 0, NULL);
    json_t *spec = json_object(), *names = json_array(), *params = json_array();
    bool ok = tools && spec && names && params;
    int64_t at = -1;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *name = json_object_get(fn, "name");
        json_t *p = json_object_get(fn, "parameters");
        ok = ok && json_array_append(names, name) == 0;
        /* no parameters: an object with any members, as OpenAI reads it */
        ok = ok && json_array_append_new(params, p && !json_is_null(p)
                                                     ? json_incref(p)
                                                     : json_pack("{s:s}", "type", "object")) == 0;
        if (only && strcmp(json_string_value(name), only) == 0) {
            at = (int64_t)i;
        }
    }
    ok = ok && json_object_set_new(spec, "format", json_string(kg_toolfmt_name(f))) == 0 &&
         json_object_set(spec, "names", names) == 0 &&
         json_object_set(spec, "params", params) == 0 &&
         json_object_set_new(spec, "only", json_integer(at)) == 0 &&
         json_object_set_new(spec, "parallel", json_boolean(parallel && !only)) == 0;
    char *text = ok ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(tools), json_decref(spec), json_decref(names), json_decref(params);
    if (!text) {
        snprintf(msg, msg_size, "tool_choice: out of memory");
        return NULL;
    }
    *len = strlen(text);
    return text;
}

const char *kg_toolfmt_marker(kg_toolfmt_t f) {
    switch (f) {
    case KG_TOOLFMT_HERMES:
        return "<tool_call>";
    case KG_TOOLFMT_MISTRAL:
    case KG_TOOLFMT_MISTRAL_ARGS:
        return "[TOOL_CALLS]";
    case KG_TOOLFMT_DEEPSEEK_R1:
    case KG_TOOLFMT_DEEPSEEK_V3:
        return DS_CALLS_BEGIN;
    case KG_TOOLFMT_COMMAND_R7B:
        return "<|START_ACTION|>";
    case KG_TOOLFMT_KIMI_K2:
        return KIMI_SECTION_BEGIN;
    default:
        return NULL;
    }
}

// ---- the wrap: call syntax around each tool's arguments ----

typedef struct wrap_ctx {
    kg_toolfmt_t f;
    json_t *names;
    int64_t only;
    bool parallel;
} wrap_ctx_t;

static int32_t lit(kg_gir_t *g, const char *s) {
    return kg_gir_bytes(g, s, strlen(s));
}

/* One call of tool i in the format's syntax; `index` numbers Command R7B's ids. */
static int32_t one_call(kg_gir_t *g, const wrap_ctx_t *w, int32_t i, int32_t args) {
    const char *name = json_string_value(json_array_get(w->names, (size_t)i));
    char head[512];
    switch (w->f) {
    case KG_TOOLFMT_HERMES:
        snprintf(head, sizeof(head), "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "}\n</tool_call>"));
    case KG_TOOLFMT_LLAMA3:
        snprintf(head, sizeof(head), "{\"name\": \"%s\", \"parameters\": ", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "}"));
    case KG_TOOLFMT_MISTRAL:
        snprintf(head, sizeof(head), "{\"name\": \"%s\", \"arguments\": ", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "}"));
    case KG_TOOLFMT_MISTRAL_ARGS:
        snprintf(head, sizeof(head), "[TOOL_CALLS]%s[ARGS]", name);
        return kg_gir_seq2(g, lit(g, head), args);
    case KG_TOOLFMT_DEEPSEEK_R1:
        snprintf(head, sizeof(head), DS_CALL_BEGIN "function" DS_SEP "%s\n```json\n", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "\n```" DS_CALL_END));
    case KG_TOOLFMT_DEEPSEEK_V3:
        snprintf(head, sizeof(head), DS_CALL_BEGIN "%s" DS_SEP, name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, DS_CALL_END));
    case KG_TOOLFMT_COMMAND_R7B: {
        int32_t id = kg_gir_repeat(g, kg_gir_char_range(g, '0', '9'), 1, 3);
        snprintf(head, sizeof(head), "\", \"tool_name\": \"%s\", \"parameters\": ", name);
        int32_t parts[] = {lit(g, "{\"tool_call_id\": \""), id, lit(g, head), args, lit(g, "}")};
        return kg_gir_seq(g, parts, 5);
    }
    case KG_TOOLFMT_FUNCTIONARY:
        snprintf(head, sizeof(head), "%s\n", name);
        return kg_gir_seq2(g, lit(g, head), args);
    case KG_TOOLFMT_GPT_OSS:
        snprintf(head, sizeof(head),
                 "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "<|call|>"));
    case KG_TOOLFMT_KIMI_K2: {
        /* the id's index counts the conversation's calls: any number */
        int32_t index = kg_gir_repeat(g, kg_gir_char_range(g, '0', '9'), 1, 3);
        snprintf(head, sizeof(head), "<|tool_call_begin|>functions.%s:", name);
        int32_t parts[] = {lit(g, head), index, lit(g, "<|tool_call_argument_begin|>"), args,
                           lit(g, "<|tool_call_end|>")};
        return kg_gir_seq(g, parts, 5);
    }
    default:
        return -1;
    }
}

/* calls: one, or with `sep` between, more */
static int32_t some(kg_gir_t *g, int32_t call, const char *sep, bool many) {
    if (!many) {
        return call;
    }
    return kg_gir_seq2(g, call,
                       kg_gir_repeat(g, kg_gir_seq2(g, lit(g, sep), call), 0, KG_GIR_UNBOUNDED));
}

static int32_t
wrap(kg_gir_t *g, const int32_t *docs, int32_t n, void *ctx, char *errstr, size_t errstr_size) {
    const wrap_ctx_t *w = ctx;
    int32_t *calls = malloc((size_t)(n > 0 ? n : 1) * sizeof(*calls));
    if (!calls) {
        snprintf(errstr, errstr_size, "tool_calls: out of memory");
        return -1;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (w->only < 0 || w->only == i) {
            /* each tool's arguments once, as a rule: calls share it */
            int32_t rule = kg_gir_rule_new(g, "args");
            kg_gir_define(g, rule, docs[i]);
            calls[k++] = one_call(g, w, i, kg_gir_ref(g, rule));
        }
    }
    int32_t call = k > 0 ? kg_gir_alt(g, calls, k) : -1;
    free(calls);
    if (call < 0) {
        snprintf(errstr, errstr_size, "tool_calls: no tool to call");
        return -1;
    }
    bool many = w->parallel;
    switch (w->f) {
    case KG_TOOLFMT_HERMES:
        return some(g, call, "\n", many);
    case KG_TOOLFMT_MISTRAL:
        return kg_gir_seq3(g, lit(g, "[TOOL_CALLS]["), some(g, call, ", ", many), lit(g, "]"));
    case KG_TOOLFMT_MISTRAL_ARGS:
        return some(g, call, "", many);
    case KG_TOOLFMT_DEEPSEEK_R1:
    case KG_TOOLFMT_DEEPSEEK_V3:
        return kg_gir_seq3(g, lit(g, DS_CALLS_BEGIN), some(g, call, "", many),
                           lit(g, DS_CALLS_END));
    case KG_TOOLFMT_COMMAND_R7B:
        return kg_gir_seq3(g, lit(g, "<|START_ACTION|>[\n    "), some(g, call, ",\n    ", many),
                           lit(g, "\n]<|END_ACTION|>"));
    case KG_TOOLFMT_KIMI_K2:
        return kg_gir_seq3(g, lit(g, KIMI_SECTION_BEGIN), some(g, call, "", many),
                           lit(g, KIMI_SECTION_END));
    default: /* one call a turn: Llama 3.x, Functionary, gpt-oss (<|call|> ends the turn) */
        return call;
    }
}

kg_gir_t *
kg_toolcall_builder(const kg_constraint_t *c, char *errstr, size_t errstr_size, void *ctx) {
    if (c->kind != KG_CONSTRAINT_TOOL_CALLS) {
        return kg_json_schema_builder(c, errstr, errstr_size, ctx);
    }
    json_t *spec = json_loadb(c->text, c->len, 0, NULL);
    wrap_ctx_t w = {KG_TOOLFMT_NONE, json_object_get(spec, "names"),
                    json_integer_value(json_object_get(spec, "only")),
                    json_is_true(json_object_get(spec, "parallel"))};
    const char *fname = json_string_value(json_object_get(spec, "format"));
    for (int f = KG_TOOLFMT_NONE; fname && f <= KG_TOOLFMT_LAST; f++) {
        if (strcmp(kg_toolfmt_name((kg_toolfmt_t)f), fname) == 0) {
            w.f = (kg_toolfmt_t)f;
        }
    }
    char *params = json_dumps(json_object_get(spec, "params"), JSON_COMPACT);
    kg_gir_t *g = NULL;
    if (!spec || !params || !constrainable(w.f)) {
        snprintf(errstr, errstr_size, "tool_calls: a malformed constraint");
    } else {
        g = kg_json_schemas_gir(params, strlen(params), "tools", wrap, &w, errstr, errstr_size);
    }
    free(params);
    json_decref(spec);
    return g;
}
