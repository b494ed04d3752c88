/* kg_toolcall_tagged: the call syntaxes of GLM-4.5/4.6/4.7, MiniMax-M2 and
 * Kimi K2 (see kg_toolcall.h). GLM and MiniMax write each argument in tags
 * of its own, so their arguments become a JSON object typed by the tool's
 * schema, as Qwen3-Coder's do; Kimi K2 writes JSON arguments behind an id
 * of its own (functions.NAME:INDEX) that the call keeps. Facts from
 * llama.cpp's common/chat*.cpp and the models' templates; checked against
 * llama.cpp's parser in tests/data/toolcall/. */
#include "kg_toolcall_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* One argument, key [k0, k1) and value [v0, v1), into the object being built. */
static void put_arg(kg_tcparse_t *p,
                    json_t *tools,
                    const char *fname,
                    kg_tcbuf_t *args,
                    size_t k0,
                    size_t k1,
                    size_t v0,
                    size_t v1,
                    bool closed) {
    char *key = kg_tc_dup_n(p->s + k0, k1 - k0);
    if (!key) {
        p->oom = true;
        return;
    }
    if (args->n > 1) {
        kg_tcbuf_puts(args, ",");
    }
    kg_tcbuf_puts(args, "\"");
    kg_tcbuf_put_json_chars(args, key, k1 - k0);
    kg_tcbuf_puts(args, "\":");
    kg_tc_put_value(p, args, kg_tc_param_type(tools, fname, key), v0, v1, closed);
    free(key);
}

/* Arguments written as OPEN_KEY K CLOSE_KEY [ws] OPEN_VAL V CLOSE_VAL, whitespace
 * between, until something else comes: the object (closed unless the output
 * ended inside a value: *cut then). False: an argument broke the syntax. */
typedef struct tags {
    const char *open_key, *close_key, *open_val, *close_val;
} tags_t;

static bool tagged_args(
    kg_tcparse_t *p, json_t *tools, const char *fname, const tags_t *t, char **out, bool *cut) {
    kg_tcbuf_t args = {0};
    kg_tcbuf_puts(&args, "{");
    bool ok = true;
    *cut = false;
    for (;;) {
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, t->open_key)) {
            break;
        }
        size_t k0 = p->i, k1 = kg_tc_find(p, k0, t->close_key);
        if (k1 == p->len) {
            /* the output ended inside the key: the arguments so far */
            p->i = p->len;
            break;
        }
        p->i = k1 + strlen(t->close_key);
        if (t->open_val) {
            kg_tc_skip_ws(p);
            if (!kg_tc_eat(p, t->open_val)) {
                ok = kg_tc_end_or_cut(p, t->open_val);
                p->i = ok ? p->len : p->i;
                break;
            }
        }
        size_t v0 = p->i, v1 = kg_tc_find(p, v0, t->close_val);
        put_arg(p, tools, fname, &args, k0, k1, v0, v1, v1 < p->len);
        if (v1 == p->len) {
            *cut = true;
            p->i = p->len;
            break;
        }
        p->i = v1 + strlen(t->close_val);
    }
    if (!*cut) {
        kg_tcbuf_puts(&args, "}");
    }
    *out = kg_tcbuf_take(&args);
    if (!*out) {
        p->oom = true;
    }
    return ok;
}

static json_t *load_tools(const kg_tcparse_t *p) {
    return p->tools_json ? json_loads(p->tools_json, 0, NULL) : NULL;
}

/* GLM: content<tool_call>N[\n](<arg_key>K</arg_key>[\n]<arg_value>V</arg_value>[\n])*
 * </tool_call>, calls with whitespace between. */
bool kg_tc_parse_glm(kg_tcparse_t *p) {
    static const tags_t t = {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
    size_t first = kg_tc_find(p, 0, "<tool_call>");
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    json_t *tools = load_tools(p);
    bool ok = true;
    while (ok && !p->oom && kg_tc_eat(p, "<tool_call>")) {
        size_t n0 = p->i;
        while (p->i < p->len && p->s[p->i] != '<' && p->s[p->i] != '\n') {
            p->i++;
        }
        size_t n1 = p->i;
        while (n1 > n0 && (p->s[n1 - 1] == ' ' || p->s[n1 - 1] == '\t' || p->s[n1 - 1] == '\r')) {
            n1--;
        }
        if (p->i == p->len) {
            break; /* the output ended inside the name: no call yet */
        }
        if (n1 == n0) {
            ok = false;
            break;
        }
        char *name = kg_tc_dup_n(p->s + n0, n1 - n0), *args = NULL;
        bool cut = false;
        ok = name && tagged_args(p, tools, name, &t, &args, &cut);
        kg_tc_add_call(p, name, args, kg_tc_dup_n("", 0));
        if (!ok || cut || p->oom) {
            break;
        }
        if (!kg_tc_eat(p, "</tool_call>")) {
            ok = kg_tc_end_or_cut(p, "</tool_call>") || kg_tc_end_or_cut(p, "<arg_key>");
            p->i = p->len;
            break;
        }
        kg_tc_skip_ws(p);
    }
    json_decref(tools);
    return ok && kg_tc_end_or_cut(p, "<tool_call>");
}

/* MiniMax-M2: content<minimax:tool_call>\n(<invoke name="N">\n(<parameter name="K">V
 * </parameter>\n)*</invoke>\n)+</minimax:tool_call>, blocks with whitespace between. */
bool kg_tc_parse_minimax(kg_tcparse_t *p) {
    static const tags_t t = {"<parameter name=\"", "\">", NULL, "</parameter>"};
    size_t first = kg_tc_find(p, 0, "<minimax:tool_call>");
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    json_t *tools = load_tools(p);
    bool ok = true, done = false;
    while (!done && kg_tc_eat(p, "<minimax:tool_call>")) {
        for (;;) {
            kg_tc_skip_ws(p);
            if (!kg_tc_eat(p, "<invoke name=\"")) {
                break;
            }
            size_t n0 = p->i, n1 = kg_tc_find(p, n0, "\">");
            if (n1 == p->len) {
                done = true; /* the output ended inside the name: no call yet */
                break;
            }
            p->i = n1 + 2;
            char *name = kg_tc_dup_n(p->s + n0, n1 - n0), *args = NULL;
            bool cut = false;
            ok = name && tagged_args(p, tools, name, &t, &args, &cut);
            kg_tc_add_call(p, name, args, kg_tc_dup_n("", 0));
            if (!ok || cut || p->oom) {
                done = true;
                break;
            }
            if (!kg_tc_eat(p, "</invoke>")) {
                ok = kg_tc_end_or_cut(p, "</invoke>") || kg_tc_end_or_cut(p, "<parameter name=\"");
                done = true;
                break;
            }
        }
        if (done) {
            break;
        }
        if (!kg_tc_eat(p, "</minimax:tool_call>")) {
            ok = kg_tc_end_or_cut(p, "</minimax:tool_call>") ||
                 kg_tc_end_or_cut(p, "<invoke name=\"");
            done = true;
            break;
        }
        kg_tc_skip_ws(p);
    }
    json_decref(tools);
    return ok && (done || kg_tc_end_or_cut(p, "<minimax:tool_call>"));
}

#define KIMI_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define KIMI_SECTION_END   "<|tool_calls_section_end|>"
#define KIMI_CALL_BEGIN    "<|tool_call_begin|>"
#define KIMI_ARGS_BEGIN    "<|tool_call_argument_begin|>"
#define KIMI_CALL_END      "<|tool_call_end|>"

static size_t min_z(size_t a, size_t b) {
    return a < b ? a : b;
}

/* Kimi K2: [<think>R</think>]content[<|tool_calls_section_begin|>](<|tool_call_begin|>
 * functions.N:I<|tool_call_argument_begin|>A[<|tool_call_end|>])+[<|tool_calls_section_end|>].
 * The section markers and the call's end are optional, as llama.cpp reads them (the model
 * drops them); a thought may end at the first call without its </think>. */
bool kg_tc_parse_kimi(kg_tcparse_t *p) {
    if (kg_tc_eat(p, "<think>")) {
        size_t e =
            min_z(kg_tc_find(p, p->i, "</think>"), min_z(kg_tc_find(p, p->i, KIMI_SECTION_BEGIN),
                                                         kg_tc_find(p, p->i, KIMI_CALL_BEGIN)));
        kg_tc_add_reasoning(p, p->s + p->i, e - p->i);
        p->i = e;
        kg_tc_eat(p, "</think>");
    }
    size_t c0 = p->i;
    size_t first = min_z(kg_tc_find(p, c0, KIMI_SECTION_BEGIN), kg_tc_find(p, c0, KIMI_CALL_BEGIN));
    kg_tc_set_content(p, c0, first);
    if (first == p->len) {
        return true;
    }
    p->i = first;
    kg_tc_eat(p, KIMI_SECTION_BEGIN);
    for (;;) {
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, KIMI_CALL_BEGIN)) {
            break;
        }
        size_t id0 = p->i, a = kg_tc_find(p, id0, KIMI_ARGS_BEGIN);
        if (a == p->len) {
            return true; /* the output ended inside the id: no call yet */
        }
        /* the id: functions.NAME:DIGITS */
        const char *pre = "functions.";
        size_t colon = a;
        while (colon > id0 && p->s[colon - 1] >= '0' && p->s[colon - 1] <= '9') {
            colon--;
        }
        size_t n0 = id0 + strlen(pre);
        if (!kg_tc_at(p, pre) || colon == a || colon <= n0 + 1 || p->s[colon - 1] != ':') {
            return false;
        }
        p->i = a + strlen(KIMI_ARGS_BEGIN);
        kg_jspan_t v = kg_tc_value(p);
        if (v.bad) {
            return false;
        }
        kg_tc_add_call_n(p, p->s + n0, colon - 1 - n0, p->s + v.start, v.end - v.start, p->s + id0,
                         a - id0);
        if (v.partial) {
            return true;
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, KIMI_CALL_END) && kg_tc_end_or_cut(p, KIMI_CALL_END)) {
            return true;
        }
    }
    if (!kg_tc_eat(p, KIMI_SECTION_END)) {
        return kg_tc_end_or_cut(p, KIMI_SECTION_END) || kg_tc_end_or_cut(p, KIMI_CALL_BEGIN);
    }
    kg_tc_skip_ws(p);
    return kg_tc_at_end(p);
}
