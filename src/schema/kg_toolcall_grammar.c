/* kg_toolcall_grammar: the grammar of a required tool call (tool_choice
 * "required" or a named function): each tool's arguments constrained by its
 * parameters' JSON Schema (kg_json_schemas_gir, the structured-output
 * engine's), inside the call syntax of the model's template, so a model must
 * call and every call's arguments validate. The constraint's text (the cache
 * key) is a small JSON spec: {"format", "names", "params", "only",
 * "parallel"}. The tagged syntaxes (Qwen3-Coder, GLM, MiniMax-M2) write one
 * tag pair a parameter, so their grammar is built from each property's own
 * schema (tagged_gir), after the whole schemas compile (their errors); so do
 * the keyed syntaxes of Gemma 4 (key:value, strings in <|"|> quotes) and LFM2
 * (name(key=value, ...)), with a separator between the pairs. */
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

static bool constrainable(kg_toolfmt_t f) {
    return f != KG_TOOLFMT_NONE;
}

/* The syntaxes that write each parameter in tags of its own rather than one JSON object. */
static bool tagged(kg_toolfmt_t f) {
    return f == KG_TOOLFMT_QWEN3_CODER || f == KG_TOOLFMT_GLM || f == KG_TOOLFMT_MINIMAX_M2 ||
           f == KG_TOOLFMT_GEMMA4 || f == KG_TOOLFMT_LFM2;
}

/* Of those, the ones that write key-value pairs with a separator between them. */
static bool keyed(kg_toolfmt_t f) {
    return f == KG_TOOLFMT_GEMMA4 || f == KG_TOOLFMT_LFM2;
}

/* The constraint's text: {"format", "names", "params", "only", "parallel", "mode"}, mode
 * "required" (the calls from their marker), "opened" (the calls after a marker the grammar
 * cannot spell), "free" (the calls or free text, from the first token) or "header" (a call
 * from a text trigger inside its header: gpt-oss). */
static char *spec_text(kg_toolfmt_t f,
                       const char *tools_json,
                       const char *only,
                       bool parallel,
                       const char *mode,
                       size_t *len,
                       char *msg,
                       size_t msg_size) {
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
         json_object_set_new(spec, "parallel", json_boolean(parallel && !only)) == 0 &&
         json_object_set_new(spec, "mode", json_string(mode)) == 0;
    char *text = ok ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(tools), json_decref(spec), json_decref(names), json_decref(params);
    if (!text) {
        snprintf(msg, msg_size, "tool_choice: out of memory");
        return NULL;
    }
    *len = strlen(text);
    return text;
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
    return spec_text(f, tools_json, only, parallel, "required", len, msg, msg_size);
}

char *kg_toolcall_auto_constraint(kg_toolfmt_t f,
                                  const char *tools_json,
                                  bool parallel,
                                  kg_toolauto_t how,
                                  size_t *len,
                                  char *msg,
                                  size_t msg_size) {
    /* the marker grammar is the required one: it starts with the marker */
    bool ok = how == KG_TOOLAUTO_MARKER   ? kg_toolfmt_marker(f) != NULL
              : how == KG_TOOLAUTO_OPENED ? f == KG_TOOLFMT_MISTRAL
              : how == KG_TOOLAUTO_TEXT ? f == KG_TOOLFMT_GPT_OSS || f == KG_TOOLFMT_FUNCTIONARY_V31
                                        : f == KG_TOOLFMT_LLAMA3 || f == KG_TOOLFMT_FUNCTIONARY;
    if (!ok) {
        snprintf(msg, msg_size, "tool_choice: no auto grammar of that kind for %s",
                 kg_toolfmt_name(f));
        return NULL;
    }
    /* Functionary v3.1's trigger is its call's first bytes: the grammar is the required one */
    const char *mode = how == KG_TOOLAUTO_MARKER || f == KG_TOOLFMT_FUNCTIONARY_V31 ? "required"
                       : how == KG_TOOLAUTO_OPENED                                  ? "opened"
                       : how == KG_TOOLAUTO_TEXT                                    ? "header"
                                                                                    : "free";
    return spec_text(f, tools_json, NULL, parallel, mode, len, msg, msg_size);
}

size_t kg_toolfmt_markers(kg_toolfmt_t f, const char **out, size_t cap) {
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    static const char *const llama3[] = {"<|python_tag|>"};
    static const char *const oss[] = {"<|channel|>", "<|constrain|>", "<|message|>", "<|start|>",
                                      "<|end|>"};
    static const char *const ds[] = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
                                     DS_SEP};
    static const char *const r7b[] = {"<|START_THINKING|>", "<|END_THINKING|>",
                                      "<|START_RESPONSE|>", "<|END_RESPONSE|>",
                                      "<|START_ACTION|>",   "<|END_ACTION|>"};
    static const char *const kimi[] = {KIMI_SECTION_BEGIN, KIMI_SECTION_END, "<|tool_call_begin|>",
                                       "<|tool_call_end|>", "<|tool_call_argument_begin|>"};
    static const char *const lfm2[] = {"<|tool_call_start|>", "<|tool_call_end|>"};
    const char *const *m = NULL;
    size_t n = 0;
#define MARKERS(a) (m = (a), n = sizeof(a) / sizeof((a)[0]))
    switch (f) {
    case KG_TOOLFMT_MISTRAL:
    case KG_TOOLFMT_MISTRAL_ARGS:
        MARKERS(mistral);
        break;
    case KG_TOOLFMT_LLAMA3:
        MARKERS(llama3);
        break;
    case KG_TOOLFMT_GPT_OSS:
        MARKERS(oss);
        break;
    case KG_TOOLFMT_DEEPSEEK_R1:
    case KG_TOOLFMT_DEEPSEEK_V3:
        MARKERS(ds);
        break;
    case KG_TOOLFMT_COMMAND_R7B:
        MARKERS(r7b);
        break;
    case KG_TOOLFMT_KIMI_K2:
        MARKERS(kimi);
        break;
    case KG_TOOLFMT_LFM2:
        MARKERS(lfm2);
        break;
    default: /* the others' markers are text tokens (Qwen's <tool_call>, Gemma 4's) or text */
        break;
    }
#undef MARKERS
    n = n < cap ? n : cap;
    for (size_t i = 0; i < n; i++) {
        out[i] = m[i];
    }
    return n;
}

/* gpt-oss's message start: the prompt's generation prompt ends with it, and the model writes
 * it before each message after its first */
#define OSS_START "<|start|>assistant"
/* Functionary v3.1's call opening */
#define FV31_OPEN "<function="

size_t kg_toolfmt_triggers(kg_toolfmt_t f, const char **text, int32_t *from, size_t cap) {
    static const char *const oss[] = {OSS_START "<|channel|>commentary to",
                                      OSS_START "<|channel|>analysis to", OSS_START " to"};
    if (f == KG_TOOLFMT_FUNCTIONARY_V31 && cap > 0) {
        /* llama.cpp's word trigger: `<function=` is text in a Llama 3 vocabulary */
        text[0] = FV31_OPEN;
        from[0] = 0;
        return 1;
    }
    size_t n = f == KG_TOOLFMT_GPT_OSS ? sizeof(oss) / sizeof(oss[0]) : 0;
    n = n < cap ? n : cap;
    for (size_t i = 0; i < n; i++) {
        text[i] = oss[i];
        from[i] = (int32_t)strlen(OSS_START);
    }
    return n;
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
    case KG_TOOLFMT_QWEN3_CODER:
    case KG_TOOLFMT_GLM:
        return "<tool_call>";
    case KG_TOOLFMT_MINIMAX_M2:
        return "<minimax:tool_call>";
    case KG_TOOLFMT_GEMMA4:
        return "<|tool_call>";
    case KG_TOOLFMT_LFM2:
        return "<|tool_call_start|>";
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
    const char *mode; /* "required", "opened", "free" or "header" (spec_text) */
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
    case KG_TOOLFMT_FUNCTIONARY_V31:
        snprintf(head, sizeof(head), FV31_OPEN "%s>", name);
        return kg_gir_seq3(g, lit(g, head), args, lit(g, "</function>"));
    case KG_TOOLFMT_GPT_OSS:
        /* the arguments end the grammar: <|call|> is an end-of-generation token, which no
         * grammar spells (the parse reads a body that ends with the text) */
        snprintf(head, sizeof(head),
                 "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", name);
        return kg_gir_seq2(g, lit(g, head), args);
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

/* gpt-oss's auto call of tool i, from its text trigger on (llama.cpp's two header forms): the
 * recipient in the channel header (`<|channel|>commentary to=functions.N`) or in the role
 * (` to=functions.N<|channel|>commentary`), on the commentary or analysis channel, an optional
 * content type (` json`, `<|constrain|>json`), then `<|message|>` and the arguments. */
static int32_t oss_header_call(kg_gir_t *g, const char *name, int32_t args) {
    /* the type is `json`; at most 16 characters, so that a model cannot wander off in it
     * (llama.cpp's grammar takes any length) */
    uint32_t lo[] = {'-', '0', 'A', '_', 'a'}, hi[] = {'-', '9', 'Z', '_', 'z'};
    int32_t type = kg_gir_repeat(g, kg_gir_chars(g, lo, hi, 5, false), 1, 16);
    int32_t spaces = kg_gir_repeat(g, lit(g, " "), 1, KG_GIR_UNBOUNDED);
    /* a space or <|constrain|> before the type, so that it cannot run on from the name */
    int32_t lead = kg_gir_alt2(g, kg_gir_seq2(g, spaces, kg_gir_opt(g, lit(g, "<|constrain|>"))),
                               lit(g, "<|constrain|>"));
    int32_t constraint = kg_gir_opt(g, kg_gir_seq2(g, lead, type));
    int32_t channel = kg_gir_seq2(g, lit(g, "<|channel|>"),
                                  kg_gir_alt2(g, lit(g, "commentary"), lit(g, "analysis")));
    char to[320];
    snprintf(to, sizeof(to), " to=functions.%s", name);
    int32_t in_channel[] = {channel, lit(g, to), constraint, lit(g, "<|message|>"), args};
    int32_t in_role[] = {lit(g, to), channel, constraint, lit(g, "<|message|>"), args};
    return kg_gir_alt2(g, kg_gir_seq(g, in_channel, 5), kg_gir_seq(g, in_role, 5));
}

/* calls: one, or with `sep` between, more */
static int32_t some(kg_gir_t *g, int32_t call, const char *sep, bool many) {
    if (!many) {
        return call;
    }
    return kg_gir_seq2(g, call,
                       kg_gir_repeat(g, kg_gir_seq2(g, lit(g, sep), call), 0, KG_GIR_UNBOUNDED));
}

/* An auto call of the syntaxes without a marker, from the first token: the call or free text.
 * Llama 3.x: the call is the whole answer (whitespace around it), and text is any answer
 * that does not start with `{` after its whitespace; Functionary v3.2: its `all` recipient and
 * any text, or a call. */
static int32_t free_or_call(kg_gir_t *g, kg_toolfmt_t f, int32_t call) {
    int32_t any = kg_gir_repeat(g, kg_gir_char_range(g, 0, KG_GIR_MAX_CP), 0, KG_GIR_UNBOUNDED);
    if (f == KG_TOOLFMT_FUNCTIONARY) {
        return kg_gir_alt2(g, kg_gir_seq2(g, lit(g, "all\n"), any), call);
    }
    uint32_t ws_lo[] = {'\t', '\r', ' '}, ws_hi[] = {'\n', '\r', ' '};
    uint32_t nb_lo[] = {'\t', '\r', ' ', '{'}, nb_hi[] = {'\n', '\r', ' ', '{'};
    int32_t ws = kg_gir_repeat(g, kg_gir_chars(g, ws_lo, ws_hi, 3, false), 0, KG_GIR_UNBOUNDED);
    int32_t text = kg_gir_seq3(g, ws, kg_gir_chars(g, nb_lo, nb_hi, 4, true), any);
    int32_t alts[] = {kg_gir_seq3(g, ws, call, ws), text, ws};
    return kg_gir_alt(g, alts, 3);
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
            const char *name = json_string_value(json_array_get(w->names, (size_t)i));
            calls[k++] = strcmp(w->mode, "header") == 0
                             ? oss_header_call(g, name, kg_gir_ref(g, rule))
                             : one_call(g, w, i, kg_gir_ref(g, rule));
        }
    }
    int32_t call = k > 0 ? kg_gir_alt(g, calls, k) : -1;
    free(calls);
    if (call < 0) {
        snprintf(errstr, errstr_size, "tool_calls: no tool to call");
        return -1;
    }
    bool many = w->parallel;
    if (strcmp(w->mode, "header") == 0) { /* one call a turn: <|call|> ends it */
        return call;
    }
    if (strcmp(w->mode, "opened") == 0) { /* Mistral's calls after [TOOL_CALLS] */
        return kg_gir_seq3(g, lit(g, "["), some(g, call, ", ", many), lit(g, "]"));
    }
    if (strcmp(w->mode, "free") == 0) {
        return free_or_call(g, w->f, call);
    }
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
    case KG_TOOLFMT_FUNCTIONARY_V31: /* calls back to back (llama.cpp's: whitespace between) */
        return some(g, call, "", many);
    case KG_TOOLFMT_KIMI_K2:
        return kg_gir_seq3(g, lit(g, KIMI_SECTION_BEGIN), some(g, call, "", many),
                           lit(g, KIMI_SECTION_END));
    default: /* one call a turn: Llama 3.x, Functionary, gpt-oss (<|call|> ends the turn) */
        return call;
    }
}

// ---- the tagged syntaxes: one expression a parameter ----

/* A tool's parameters as tagged syntaxes write them: per property its key, the index of its
 * schema among the flattened documents (-1: a string-typed one, written as raw text) and
 * whether it is required (-2 - GEMMA_*: Gemma 4's own value syntax, unconstrained but for the
 * schema's type, for the schemas it cannot write as JSON: objects, arrays, unions). */
typedef struct tag_ctx {
    kg_toolfmt_t f;
    json_t *names;
    json_t *props; /* per tool: [[key, doc, required], ...] */
    int64_t only;
    bool parallel;
} tag_ctx_t;

/* Raw text up to the closing tag: no '<' (the parser reads to the first closing tag). Its string
 * keywords (maxLength, pattern, enum) are not enforced. */
static int32_t raw_text(kg_gir_t *g) {
    uint32_t lt = '<';
    return kg_gir_repeat(g, kg_gir_chars(g, &lt, &lt, 1, true), 0, KG_GIR_UNBOUNDED);
}

static int32_t
tag_call(kg_gir_t *g, const tag_ctx_t *w, size_t t, const int32_t *doc_rules, int32_t raw) {
    const char *name = json_string_value(json_array_get(w->names, t));
    json_t *props = json_array_get(w->props, t);
    size_t n = json_array_size(props);
    int32_t *parts = malloc((n + 2) * sizeof(*parts));
    if (!parts) {
        return -1;
    }
    char buf[600];
    /* GLM-4.5/4.6 put a newline after the name and each tag pair, 4.7 none: either */
    int32_t nl = w->f == KG_TOOLFMT_GLM ? kg_gir_opt(g, lit(g, "\n")) : -1;
    const char *item_open, *item_mid, *item_close;
    switch (w->f) {
    case KG_TOOLFMT_GLM:
        snprintf(buf, sizeof(buf), "<tool_call>%s", name);
        item_open = "<arg_key>", item_mid = "</arg_key>", item_close = "</arg_value>";
        break;
    case KG_TOOLFMT_MINIMAX_M2:
        snprintf(buf, sizeof(buf), "<invoke name=\"%s\">\n", name);
        item_open = "<parameter name=\"", item_mid = "\">", item_close = "</parameter>\n";
        break;
    default: /* Qwen3-Coder */
        snprintf(buf, sizeof(buf), "<tool_call>\n<function=%s>\n", name);
        item_open = "<parameter=", item_mid = ">\n", item_close = "\n</parameter>\n";
        break;
    }
    parts[0] = nl < 0 ? lit(g, buf) : kg_gir_seq2(g, lit(g, buf), nl);
    for (size_t k = 0; k < n; k++) {
        json_t *p = json_array_get(props, k);
        json_int_t doc = json_integer_value(json_array_get(p, 1));
        snprintf(buf, sizeof(buf), "%s%s%s", item_open, json_string_value(json_array_get(p, 0)),
                 item_mid);
        int32_t head =
            nl < 0 ? lit(g, buf) : kg_gir_seq3(g, lit(g, buf), nl, lit(g, "<arg_value>"));
        int32_t tail = nl < 0 ? lit(g, item_close) : kg_gir_seq2(g, lit(g, item_close), nl);
        int32_t item = kg_gir_seq3(g, head, doc < 0 ? raw : kg_gir_ref(g, doc_rules[doc]), tail);
        parts[k + 1] = json_is_true(json_array_get(p, 2)) ? item : kg_gir_opt(g, item);
    }
    parts[n + 1] = lit(g, w->f == KG_TOOLFMT_GLM          ? "</tool_call>"
                          : w->f == KG_TOOLFMT_MINIMAX_M2 ? "</invoke>\n"
                                                          : "</function>\n</tool_call>");
    int32_t call = kg_gir_seq(g, parts, (int32_t)n + 2);
    free(parts);
    return call;
}

/* Gemma 4's value syntax as three rules, out[GEMMA_ANY] any value: <|"|>text<|"|>,
 * out[GEMMA_OBJECT] {key:value,...}, out[GEMMA_ARRAY] [value,...], or a JSON scalar (`scalar`,
 * a rule). Strings without '<' (as raw_text). */
enum { GEMMA_ANY, GEMMA_OBJECT, GEMMA_ARRAY };

static void gemma_rules(kg_gir_t *g, int32_t raw, int32_t scalar, int32_t out[3]) {
    int32_t v = kg_gir_rule_new(g, "gemma-value");
    int32_t d = kg_gir_rule_new(g, "gemma-object"), a = kg_gir_rule_new(g, "gemma-array");
    uint32_t lo[] = {'0', 'A', '_', 'a'}, hi[] = {'9', 'Z', '_', 'z'};
    int32_t key = kg_gir_repeat(g, kg_gir_chars(g, lo, hi, 4, false), 1, KG_GIR_UNBOUNDED);
    int32_t kv = kg_gir_seq3(g, key, lit(g, ":"), kg_gir_ref(g, v));
    int32_t kvs =
        kg_gir_seq2(g, kv, kg_gir_repeat(g, kg_gir_seq2(g, lit(g, ","), kv), 0, KG_GIR_UNBOUNDED));
    int32_t vs = kg_gir_seq2(
        g, kg_gir_ref(g, v),
        kg_gir_repeat(g, kg_gir_seq2(g, lit(g, ","), kg_gir_ref(g, v)), 0, KG_GIR_UNBOUNDED));
    kg_gir_define(g, d, kg_gir_seq3(g, lit(g, "{"), kg_gir_opt(g, kvs), lit(g, "}")));
    kg_gir_define(g, a, kg_gir_seq3(g, lit(g, "["), kg_gir_opt(g, vs), lit(g, "]")));
    int32_t alts[] = {
        kg_gir_seq3(g, lit(g, "<|\"|>"), raw, lit(g, "<|\"|>")),
        kg_gir_ref(g, d),
        kg_gir_ref(g, a),
        scalar,
    };
    kg_gir_define(g, v, kg_gir_alt(g, alts, 4));
    out[GEMMA_ANY] = v, out[GEMMA_OBJECT] = d, out[GEMMA_ARRAY] = a;
}

/* A keyed call: its pairs in the schema's order, required ones always, a separator between
 * two (so the chain of rules: `head[k]` nothing written yet, `tail[k]` something written,
 * from property k on). LFM2 takes one pair at least where the tool has properties. */
static int32_t keyed_call(kg_gir_t *g,
                          const tag_ctx_t *w,
                          size_t t,
                          const int32_t *doc_rules,
                          int32_t raw,
                          const int32_t *gem) {
    const char *name = json_string_value(json_array_get(w->names, t));
    json_t *props = json_array_get(w->props, t);
    size_t n = json_array_size(props);
    bool gemma = w->f == KG_TOOLFMT_GEMMA4;
    const char *sep = gemma ? "," : ", ";
    int32_t *head = malloc((n + 1) * sizeof(*head)), *tail = malloc((n + 1) * sizeof(*tail));
    if (!head || !tail) {
        free(head), free(tail);
        return -1;
    }
    head[n] = !gemma && n > 0 ? -1 : kg_gir_empty(g);
    tail[n] = kg_gir_empty(g);
    char buf[600];
    for (size_t k = n; k-- > 0;) {
        json_t *p = json_array_get(props, k);
        json_int_t doc = json_integer_value(json_array_get(p, 1));
        snprintf(buf, sizeof(buf), "%s%s", json_string_value(json_array_get(p, 0)),
                 gemma ? ":" : "=");
        int32_t value = doc >= 0    ? kg_gir_ref(g, doc_rules[doc])
                        : doc == -1 ? kg_gir_seq3(g, lit(g, "<|\"|>"), raw, lit(g, "<|\"|>"))
                                    : kg_gir_ref(g, gem[-2 - doc]);
        int32_t item = kg_gir_seq2(g, lit(g, buf), value);
        int32_t rt = kg_gir_rule_new(g, "pairs"), rh = kg_gir_rule_new(g, "pairs");
        int32_t sep_item = kg_gir_seq2(g, lit(g, sep), item);
        bool required = json_is_true(json_array_get(p, 2));
        kg_gir_define(g, rt,
                      kg_gir_seq2(g, required ? sep_item : kg_gir_opt(g, sep_item), tail[k + 1]));
        int32_t first = kg_gir_seq2(g, item, tail[k + 1]);
        kg_gir_define(g, rh,
                      required || head[k + 1] < 0 ? first : kg_gir_alt2(g, first, head[k + 1]));
        tail[k] = kg_gir_ref(g, rt);
        head[k] = kg_gir_ref(g, rh);
    }
    snprintf(buf, sizeof(buf), gemma ? "<|tool_call>call:%s{" : "%s(", name);
    int32_t call = kg_gir_seq3(g, lit(g, buf), head[0], lit(g, gemma ? "}<tool_call|>" : ")"));
    free(head), free(tail);
    return call;
}

static int32_t
tag_wrap(kg_gir_t *g, const int32_t *docs, int32_t n, void *ctx, char *errstr, size_t errstr_size) {
    const tag_ctx_t *w = ctx;
    size_t n_tools = json_array_size(w->names);
    int32_t *rules = malloc((size_t)(n > 0 ? n : 1) * sizeof(*rules));
    int32_t *calls = malloc((n_tools ? n_tools : 1) * sizeof(*calls));
    int32_t k = 0;
    if (rules && calls) {
        for (int32_t i = 0; i < n; i++) {
            rules[i] = kg_gir_rule_new(g, "value");
            kg_gir_define(g, rules[i], docs[i]);
        }
        int32_t raw = kg_gir_rule_new(g, "text");
        kg_gir_define(g, raw, raw_text(g));
        /* the last document is Gemma 4's scalar (flatten) */
        int32_t gem[3] = {-1, -1, -1};
        if (w->f == KG_TOOLFMT_GEMMA4) {
            gemma_rules(g, kg_gir_ref(g, raw), kg_gir_ref(g, rules[n - 1]), gem);
        }
        for (size_t t = 0; t < n_tools; t++) {
            if (w->only < 0 || w->only == (int64_t)t) {
                calls[k++] = keyed(w->f) ? keyed_call(g, w, t, rules, kg_gir_ref(g, raw), gem)
                                         : tag_call(g, w, t, rules, kg_gir_ref(g, raw));
            }
        }
    }
    int32_t call = k > 0 ? kg_gir_alt(g, calls, k) : -1;
    free(rules), free(calls);
    if (call < 0) {
        snprintf(errstr, errstr_size, "tool_calls: no tool to call");
        return -1;
    }
    if (w->f == KG_TOOLFMT_GEMMA4) {
        return some(g, call, "", w->parallel);
    }
    if (w->f == KG_TOOLFMT_LFM2) {
        return kg_gir_seq3(g, lit(g, "<|tool_call_start|>["), some(g, call, ", ", w->parallel),
                           lit(g, "]<|tool_call_end|>"));
    }
    if (w->f == KG_TOOLFMT_MINIMAX_M2) {
        return kg_gir_seq3(g, lit(g, "<minimax:tool_call>\n"), some(g, call, "", w->parallel),
                           lit(g, "</minimax:tool_call>"));
    }
    if (w->f == KG_TOOLFMT_GLM && w->parallel) { /* a newline between calls or none */
        return kg_gir_seq2(g, call,
                           kg_gir_repeat(g, kg_gir_seq2(g, kg_gir_opt(g, lit(g, "\n")), call), 0,
                                         KG_GIR_UNBOUNDED));
    }
    return some(g, call, "\n", w->parallel);
}

/* The validation pass's root: every document, so each tool's schema is compiled whole (its
 * errors name tools[i].function.parameters). */
static int32_t
any_doc(kg_gir_t *g, const int32_t *docs, int32_t n, void *ctx, char *errstr, size_t errstr_size) {
    (void)ctx, (void)errstr, (void)errstr_size;
    return kg_gir_alt(g, docs, n);
}

/* Whether Gemma 4 writes values of this schema as JSON does: scalars only. */
static bool gemma_scalar(json_t *ps) {
    static const char *const scalars[] = {"integer", "number", "boolean", "null"};
    const char *type = json_string_value(json_object_get(ps, "type"));
    for (size_t i = 0; type && i < sizeof(scalars) / sizeof(scalars[0]); i++) {
        if (strcmp(type, scalars[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Which of Gemma 4's own value rules a schema it cannot write as JSON takes (gemma_rules). */
static int gemma_kind(json_t *ps) {
    const char *type = json_string_value(json_object_get(ps, "type"));
    return !type                         ? GEMMA_ANY
           : strcmp(type, "object") == 0 ? GEMMA_OBJECT
           : strcmp(type, "array") == 0  ? GEMMA_ARRAY
                                         : GEMMA_ANY;
}

/* Each tool's properties split out: the schemas of those written as JSON (with the tool's $defs,
 * which their $refs name) as flat documents, and the per-tool list tag_ctx_t wants. LFM2 writes
 * every value as JSON (strings quoted), the other tagged syntaxes all but strings, Gemma 4 only
 * scalars. */
static bool flatten(json_t *params, json_t *flat, json_t *props, kg_toolfmt_t f) {
    size_t i;
    json_t *p;
    bool ok = true;
    json_array_foreach(params, i, p) {
        json_t *list = json_array();
        json_t *req = json_object_get(p, "required");
        const char *key;
        json_t *ps;
        ok = ok && list && json_array_append_new(props, list) == 0;
        json_object_foreach(json_object_get(p, "properties"), key, ps) {
            const char *type = json_string_value(json_object_get(ps, "type"));
            bool string = type && strcmp(type, "string") == 0;
            json_int_t doc =
                f == KG_TOOLFMT_GEMMA4 && !string && !gemma_scalar(ps) ? -2 - gemma_kind(ps) : -1;
            if (f == KG_TOOLFMT_LFM2 || (f == KG_TOOLFMT_GEMMA4 ? gemma_scalar(ps) : !string)) {
                json_t *copy = json_is_object(ps) ? json_deep_copy(ps) : json_object();
                static const char *const defs[] = {"$defs", "definitions"};
                for (int d = 0; copy && d < 2; d++) {
                    json_t *v = json_object_get(p, defs[d]);
                    ok = ok && (!v || json_object_set(copy, defs[d], v) == 0);
                }
                ok = ok && copy && json_array_append_new(flat, copy) == 0;
                doc = (json_int_t)json_array_size(flat) - 1;
            }
            bool required = false;
            size_t r;
            json_t *rv;
            json_array_foreach(req, r, rv) {
                required =
                    required || (json_is_string(rv) && strcmp(json_string_value(rv), key) == 0);
            }
            ok = ok && json_array_append_new(list, json_pack("[s,I,b]", key, doc, required)) == 0;
        }
    }
    /* one document more: Gemma 4's scalar inside its own values; else unused (and the engine
     * wants one document at least) */
    json_t *last = f == KG_TOOLFMT_GEMMA4
                       ? json_pack("{s:[s,s,s]}", "type", "number", "boolean", "null")
                       : json_object();
    return ok && json_array_append_new(flat, last) == 0;
}

static kg_gir_t *tagged_gir(json_t *spec, kg_toolfmt_t f, char *errstr, size_t errstr_size) {
    json_t *params = json_object_get(spec, "params");
    char *whole = json_dumps(params, JSON_COMPACT);
    kg_gir_t *g = whole ? kg_json_schemas_gir(whole, strlen(whole), "tools", any_doc, NULL, errstr,
                                              errstr_size)
                        : NULL;
    free(whole);
    if (!g) {
        return NULL;
    }
    kg_gir_free(g);
    json_t *flat = json_array(), *props = json_array();
    char *text = NULL;
    if (flat && props && flatten(params, flat, props, f)) {
        text = json_dumps(flat, JSON_COMPACT);
    }
    tag_ctx_t w = {f, json_object_get(spec, "names"), props,
                   json_integer_value(json_object_get(spec, "only")),
                   json_is_true(json_object_get(spec, "parallel"))};
    g = text ? kg_json_schemas_gir(text, strlen(text), "tools", tag_wrap, &w, errstr, errstr_size)
             : NULL;
    if (!text) {
        snprintf(errstr, errstr_size, "tool_calls: out of memory");
    }
    free(text);
    json_decref(flat), json_decref(props);
    return g;
}

kg_gir_t *
kg_toolcall_builder(const kg_constraint_t *c, char *errstr, size_t errstr_size, void *ctx) {
    if (c->kind != KG_CONSTRAINT_TOOL_CALLS) {
        return kg_json_schema_builder(c, errstr, errstr_size, ctx);
    }
    json_t *spec = json_loadb(c->text, c->len, 0, NULL);
    const char *mode = json_string_value(json_object_get(spec, "mode"));
    wrap_ctx_t w = {KG_TOOLFMT_NONE, json_object_get(spec, "names"),
                    json_integer_value(json_object_get(spec, "only")),
                    json_is_true(json_object_get(spec, "parallel")), mode ? mode : "required"};
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
    } else if (tagged(w.f)) {
        g = tagged_gir(spec, w.f, errstr, errstr_size);
    } else {
        g = kg_json_schemas_gir(params, strlen(params), "tools", wrap, &w, errstr, errstr_size);
    }
    free(params);
    json_decref(spec);
    return g;
}
