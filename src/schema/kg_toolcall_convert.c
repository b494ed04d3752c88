/* kg_toolcall_convert: the call syntaxes whose arguments are not JSON as the
 * model writes them, converted to a JSON object the way llama.cpp's mappers
 * do (facts from its common/parsers/gemma4.cpp, lfm2.cpp and
 * chat-peg-parser.cpp, not its code):
 *   - Gemma 4: <|tool_call>call:NAME{key:VALUE,...}<tool_call|>, strings
 *     between <|"|> quotes, bare keys; thoughts in <|channel>thought ...
 *     <channel|> blocks. Its parser has no end: a call that breaks ends the
 *     calls (what follows is dropped, no error), as llama.cpp's does.
 *   - LFM2 / LFM2.5: <|tool_call_start|>[name(k="v", n=1), ...]<|tool_call_end|>,
 *     Python-style literals ('single quotes', True, None) rewritten to JSON;
 *     the whole answer must follow the syntax (else malformed).
 * Both know the job's tools: a call names one of them, and LFM2's arguments
 * name that tool's properties (a string-typed one takes a quoted string). */
#include "kg_toolcall_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Nesting deeper than this is refused (model output is outside input). */
#define MAX_DEPTH 128

typedef enum conv { CONV_OK, CONV_PARTIAL, CONV_BAD } conv_t;

static bool at(const kg_tcparse_t *p, size_t i, const char *lit) {
    size_t n = strlen(lit);
    return i <= p->len && p->len - i >= n && memcmp(p->s + i, lit, n) == 0;
}

/* The text from i ends inside `lit` (a proper prefix of it is all that is left). */
static bool cut_in(const kg_tcparse_t *p, size_t i, const char *lit) {
    size_t rest = p->len - i;
    return i >= p->len || (rest < strlen(lit) && memcmp(p->s + i, lit, rest) == 0);
}

/* The tool of that name in the job's tools (an array), or NULL. Without tools any name goes:
 * the parse then cannot check names (tests, kgen render). */
static json_t *tool_named(json_t *tools, const char *s, size_t n, bool *known) {
    size_t i;
    json_t *t;
    *known = tools == NULL;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(f ? f : t, "name"));
        if (name && strlen(name) == n && memcmp(name, s, n) == 0) {
            *known = true;
            return f ? f : t;
        }
    }
    return NULL;
}

// ---- Gemma 4 ----

#define G4_QUOTE "<|\"|>"

static conv_t g4_value(kg_tcparse_t *p, size_t *i, kg_tcbuf_t *out, int depth);

/* A number, true, false or null: their JSON text as written. */
static conv_t g4_scalar(kg_tcparse_t *p, size_t *i, kg_tcbuf_t *out) {
    char c = p->s[*i];
    if (c != '-' && (c < '0' || c > '9') && c != 't' && c != 'f' && c != 'n') {
        return CONV_BAD;
    }
    kg_jspan_t v = kg_tc_json_value(p->s, p->len, *i);
    if (v.bad || v.start != *i) {
        return CONV_BAD;
    }
    if (v.partial) {
        return CONV_PARTIAL; /* a number or word the text ends in may go on: not committed */
    }
    kg_tcbuf_put(out, p->s + v.start, v.end - v.start);
    *i = v.end;
    return CONV_OK;
}

static conv_t g4_string(kg_tcparse_t *p, size_t *i, kg_tcbuf_t *out) {
    size_t s0 = *i + strlen(G4_QUOTE);
    size_t e = kg_tc_find(p, s0, G4_QUOTE);
    kg_tcbuf_puts(out, "\"");
    kg_tcbuf_put_json_chars(out, p->s + s0, e - s0);
    if (e == p->len) {
        *i = p->len;
        return CONV_PARTIAL;
    }
    kg_tcbuf_puts(out, "\"");
    *i = e + strlen(G4_QUOTE);
    return CONV_OK;
}

/* `{` ws (`}` | key:value (`,` ws key:value)* ws `}`), keys any run of characters but `:` and
 * `}`; or `[` ws (`]` | value (`,` ws value)* ws `]`). */
static conv_t g4_container(kg_tcparse_t *p, size_t *i, kg_tcbuf_t *out, int depth) {
    bool dict = p->s[*i] == '{';
    char close = dict ? '}' : ']';
    if (depth >= MAX_DEPTH) {
        return CONV_BAD;
    }
    kg_tcbuf_put(out, p->s + *i, 1);
    size_t k = kg_tc_ws(p->s, p->len, *i + 1);
    if (k < p->len && p->s[k] == close) {
        kg_tcbuf_put(out, &close, 1);
        *i = k + 1;
        return CONV_OK;
    }
    for (bool first = true;; first = false) {
        if (!first) {
            kg_tcbuf_puts(out, ",");
        }
        if (dict) {
            size_t k0 = k;
            while (k < p->len && p->s[k] != ':' && p->s[k] != '}') {
                k++;
            }
            kg_tcbuf_puts(out, "\"");
            kg_tcbuf_put_json_chars(out, p->s + k0, k - k0);
            if (k >= p->len) {
                return CONV_PARTIAL;
            }
            if (k == k0 || p->s[k] != ':') {
                return CONV_BAD;
            }
            kg_tcbuf_puts(out, "\":");
            k = kg_tc_ws(p->s, p->len, k + 1);
        }
        conv_t v = g4_value(p, &k, out, depth + 1);
        if (v != CONV_OK) {
            return v;
        }
        if (k < p->len && p->s[k] == ',') {
            k = kg_tc_ws(p->s, p->len, k + 1);
            continue;
        }
        k = kg_tc_ws(p->s, p->len, k);
        if (k >= p->len) {
            return CONV_PARTIAL;
        }
        if (p->s[k] != close) {
            return CONV_BAD;
        }
        kg_tcbuf_put(out, &close, 1);
        *i = k + 1;
        return CONV_OK;
    }
}

static conv_t g4_value(kg_tcparse_t *p, size_t *i, kg_tcbuf_t *out, int depth) {
    if (*i >= p->len || cut_in(p, *i, G4_QUOTE)) {
        return CONV_PARTIAL;
    }
    if (at(p, *i, G4_QUOTE)) {
        return g4_string(p, i, out);
    }
    if (p->s[*i] == '{' || p->s[*i] == '[') {
        return g4_container(p, i, out, depth);
    }
    return g4_scalar(p, i, out);
}

/* One <|tool_call>call:NAME{...}<tool_call|> at the cursor: false when it is not one (the
 * calls end there). A call the text ends inside is kept with its arguments so far. */
static bool g4_call(kg_tcparse_t *p, json_t *tools) {
    size_t n0 = p->i + strlen("<|tool_call>call:");
    if (!at(p, p->i, "<|tool_call>call:")) {
        return false;
    }
    size_t b = kg_tc_find(p, n0, "{");
    bool known;
    if (b == p->len || b == n0 || (tool_named(tools, p->s + n0, b - n0, &known), !known)) {
        return false;
    }
    kg_tcbuf_t args = {0};
    size_t k = b;
    conv_t c = g4_container(p, &k, &args, 0);
    if (c == CONV_OK && !at(p, k, "<tool_call|>") && !cut_in(p, k, "<tool_call|>")) {
        c = CONV_BAD;
    }
    if (c == CONV_BAD) {
        free(kg_tcbuf_take(&args));
        return false;
    }
    kg_tc_add_call(p, kg_tc_dup_n(p->s + n0, b - n0), kg_tcbuf_take(&args), kg_tc_dup_n("", 0));
    p->i = c == CONV_OK && at(p, k, "<tool_call|>") ? k + strlen("<tool_call|>") : p->len;
    return c == CONV_OK && p->i < p->len;
}

/* Gemma 4: ([<|channel>thought R<channel|>] content)* then the calls. Content runs to the
 * next <|channel>, <channel|> or <|tool_call>; what is neither content nor a call (a stray
 * <channel|>, text after the calls) is dropped, as llama.cpp's parser drops it. */
bool kg_tc_parse_gemma4(kg_tcparse_t *p) {
    json_t *tools = p->tools_json ? json_loads(p->tools_json, 0, NULL) : NULL;
    kg_tcbuf_t content = {0};
    if (at(p, p->i, "<|turn>model\n")) {
        p->i += strlen("<|turn>model\n");
    }
    for (;;) {
        size_t start = p->i;
        if (at(p, p->i, "<|channel>")) {
            size_t k = p->i;
            while (at(p, k, "<|channel>") && !at(p, k + strlen("<|channel>"), "thought")) {
                k += strlen("<|channel>"); /* empty channels */
            }
            if (!at(p, k, "<|channel>thought")) {
                break;
            }
            size_t r0 = kg_tc_ws(p->s, p->len, k + strlen("<|channel>thought"));
            size_t r1 = kg_tc_find(p, r0, "<channel|>");
            kg_tc_add_reasoning(p, p->s + r0, r1 - r0);
            p->i = r1 == p->len ? r1 : r1 + strlen("<channel|>");
        }
        size_t e = p->i;
        while (e < p->len && !at(p, e, "<|channel>") && !at(p, e, "<channel|>") &&
               !at(p, e, "<|tool_call>")) {
            e++;
        }
        kg_tcbuf_put(&content, p->s + p->i, e - p->i);
        p->i = e;
        if (p->i == start || !at(p, p->i, "<|channel>")) {
            break;
        }
    }
    size_t c_len = content.n;
    char *c = kg_tcbuf_take(&content);
    free(p->out->content);
    p->out->content = c;
    p->out->content_len = c_len;
    p->oom = p->oom || !c;
    p->i = kg_tc_find(p, p->i, "<|tool_call>");
    while (!p->oom && g4_call(p, tools)) {
    }
    json_decref(tools);
    return true;
}

// ---- LFM2 ----

/* A quoted string ("..." or '...', escapes \q \\ / b f n r t uXXXX); its end in *i. */
static conv_t py_string(const kg_tcparse_t *p, size_t *i) {
    char q = p->s[*i];
    size_t k = *i + 1;
    while (k < p->len && p->s[k] != q) {
        if (p->s[k] == '\\') {
            if (k + 1 >= p->len) {
                return CONV_PARTIAL;
            }
            char e = p->s[k + 1];
            if (e == 'u') {
                for (size_t h = 2; h < 6; h++) {
                    if (k + h >= p->len) {
                        return CONV_PARTIAL;
                    }
                    if (!strchr("0123456789abcdefABCDEF", p->s[k + h])) {
                        return CONV_BAD;
                    }
                }
                k += 6;
                continue;
            }
            if (e != q && !strchr("\\/bfnrt", e)) {
                return CONV_BAD;
            }
            k += 2;
            continue;
        }
        k++;
    }
    if (k >= p->len) {
        return CONV_PARTIAL;
    }
    *i = k + 1;
    return CONV_OK;
}

static conv_t py_value(const kg_tcparse_t *p, size_t *i, int depth);

/* A dict (`{` ws (`}` | str ws `:` ws v (ws `,` ws str ws `:` ws v)* ws `}`) ws) or an array
 * (`[` ws (`]` | v (`,` ws v)* ws `]`) ws): the trailing whitespace is the container's. */
static conv_t py_container(const kg_tcparse_t *p, size_t *i, int depth) {
    bool dict = p->s[*i] == '{';
    char close = dict ? '}' : ']';
    if (depth >= MAX_DEPTH) {
        return CONV_BAD;
    }
    size_t k = kg_tc_ws(p->s, p->len, *i + 1);
    if (k < p->len && p->s[k] == close) {
        *i = kg_tc_ws(p->s, p->len, k + 1);
        return CONV_OK;
    }
    for (;;) {
        conv_t c;
        if (dict) {
            if (k >= p->len) {
                return CONV_PARTIAL;
            }
            if (p->s[k] != '"' && p->s[k] != '\'') {
                return CONV_BAD;
            }
            if ((c = py_string(p, &k)) != CONV_OK) {
                return c;
            }
            k = kg_tc_ws(p->s, p->len, k);
            if (k >= p->len) {
                return CONV_PARTIAL;
            }
            if (p->s[k] != ':') {
                return CONV_BAD;
            }
            k = kg_tc_ws(p->s, p->len, k + 1);
        }
        if ((c = py_value(p, &k, depth + 1)) != CONV_OK) {
            return c;
        }
        size_t after = kg_tc_ws(p->s, p->len, k);
        size_t comma = dict ? after : k;
        if (comma < p->len && p->s[comma] == ',') {
            k = kg_tc_ws(p->s, p->len, comma + 1);
            continue;
        }
        if (after >= p->len) {
            return CONV_PARTIAL;
        }
        if (p->s[after] != close) {
            return CONV_BAD;
        }
        *i = kg_tc_ws(p->s, p->len, after + 1);
        return CONV_OK;
    }
}

/* A word literal (True, none, ...) at *i, not cut. */
static conv_t py_word(const kg_tcparse_t *p, size_t *i) {
    static const char *const words[] = {"True", "False", "None", "true", "false", "null"};
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++) {
        if (at(p, *i, words[w])) {
            *i += strlen(words[w]);
            return CONV_OK;
        }
        if (cut_in(p, *i, words[w])) {
            return CONV_PARTIAL;
        }
    }
    return CONV_BAD;
}

static conv_t py_value(const kg_tcparse_t *p, size_t *i, int depth) {
    if (*i >= p->len) {
        return CONV_PARTIAL;
    }
    char c = p->s[*i];
    if (c == '{' || c == '[') {
        return py_container(p, i, depth);
    }
    if (c == '"' || c == '\'') {
        return py_string(p, i);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        kg_jspan_t v = kg_tc_json_value(p->s, p->len, *i);
        if (v.bad) {
            return CONV_BAD;
        }
        *i = v.end;
        return v.partial ? CONV_PARTIAL : CONV_OK;
    }
    return py_word(p, i);
}

/* A Python-style value's text as JSON: single-quoted strings double-quoted (\' unescaped, a bare
 * " escaped), True/False/None outside strings as true/false/null (llama.cpp's rewrite). */
static void py_to_json(kg_tcbuf_t *out, const char *s, size_t n) {
    bool sq = false, dq = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            if (sq && s[i + 1] == '\'') {
                kg_tcbuf_puts(out, "'");
            } else {
                kg_tcbuf_put(out, s + i, 2);
            }
            i++;
        } else if (c == '"') {
            kg_tcbuf_puts(out, sq ? "\\\"" : "\"");
            dq = sq ? dq : !dq;
        } else if (c == '\'' && !dq) {
            sq = !sq;
            kg_tcbuf_puts(out, "\"");
        } else if (!sq && !dq && (c == 'T' || c == 'F' || c == 'N') &&
                   (i == 0 || !(s[i - 1] == '_' || (s[i - 1] >= '0' && s[i - 1] <= '9') ||
                                ((s[i - 1] | 0x20) >= 'a' && (s[i - 1] | 0x20) <= 'z')))) {
            const char *py = c == 'T' ? "True" : c == 'F' ? "False" : "None";
            const char *js = c == 'T' ? "true" : c == 'F' ? "false" : "null";
            size_t w = 0;
            while (i + w < n && (s[i + w] == '_' || (s[i + w] >= '0' && s[i + w] <= '9') ||
                                 ((s[i + w] | 0x20) >= 'a' && (s[i + w] | 0x20) <= 'z'))) {
                w++;
            }
            if (w <= strlen(py) && memcmp(s + i, py, w) == 0) {
                kg_tcbuf_put(out, js, w);
                i += w - 1;
            } else {
                kg_tcbuf_put(out, &c, 1);
            }
        } else {
            kg_tcbuf_put(out, &c, 1);
        }
    }
}

/* name(k=v, ...) of a known tool at p->i into a call; CONV_PARTIAL: the text ended in it. */
static conv_t lfm2_call(kg_tcparse_t *p, json_t *tools) {
    size_t n0 = p->i, n1 = kg_tc_find(p, n0, "(");
    if (n1 == p->len) {
        return CONV_PARTIAL; /* the name is not all there: no call yet */
    }
    bool known = false;
    json_t *fn = tool_named(tools, p->s + n0, n1 - n0, &known);
    if (!known || n1 == n0) {
        return CONV_BAD;
    }
    json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
    kg_tcbuf_t args = {0};
    kg_tcbuf_puts(&args, "{");
    size_t k = kg_tc_ws(p->s, p->len, n1 + 1);
    conv_t c = CONV_OK;
    /* a tool with properties takes one argument at least (llama.cpp's grammar) */
    bool want_args = tools ? json_object_size(props) > 0 : k < p->len && p->s[k] != ')';
    for (size_t n_args = 0; want_args; n_args++) {
        size_t a0 = k;
        while (k < p->len && p->s[k] != '=' && p->s[k] != ')' && p->s[k] != ',') {
            k++;
        }
        json_t *prop = json_object_getn(props, p->s + a0, k - a0);
        if (k >= p->len) {
            c = CONV_PARTIAL;
            break;
        }
        if (p->s[k] != '=' || k == a0 || (tools && !prop)) {
            c = CONV_BAD;
            break;
        }
        kg_tcbuf_puts(&args, n_args ? ",\"" : "\"");
        kg_tcbuf_put_json_chars(&args, p->s + a0, k - a0);
        kg_tcbuf_puts(&args, "\":");
        size_t v0 = ++k;
        const char *type = json_string_value(json_object_get(prop, "type"));
        if (type && strcmp(type, "string") == 0 && k < p->len && p->s[k] != '"' &&
            p->s[k] != '\'') {
            c = CONV_BAD;
            break;
        }
        c = py_value(p, &k, 0);
        py_to_json(&args, p->s + v0, (c == CONV_PARTIAL ? p->len : k) - v0);
        if (c != CONV_OK) {
            break;
        }
        if (k < p->len && p->s[k] == ',') {
            k = kg_tc_ws(p->s, p->len, k + 1);
            continue;
        }
        break;
    }
    if (c == CONV_OK) {
        k = kg_tc_ws(p->s, p->len, k);
        c = k >= p->len ? CONV_PARTIAL : p->s[k] == ')' ? CONV_OK : CONV_BAD;
    }
    if (c == CONV_OK) {
        kg_tcbuf_puts(&args, "}");
    }
    if (c == CONV_BAD) {
        free(kg_tcbuf_take(&args));
        return CONV_BAD;
    }
    kg_tc_add_call(p, kg_tc_dup_n(p->s + n0, n1 - n0), kg_tcbuf_take(&args), kg_tc_dup_n("", 0));
    p->i = c == CONV_OK ? k + 1 : p->len;
    return c;
}

/* LFM2: content<|tool_call_start|>[call(, call)*]<|tool_call_end|> and nothing after. */
bool kg_tc_parse_lfm2(kg_tcparse_t *p) {
    size_t first = kg_tc_find(p, 0, "<|tool_call_start|>");
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first + strlen("<|tool_call_start|>");
    if (!kg_tc_eat(p, "[")) {
        return kg_tc_end_or_cut(p, "[");
    }
    json_t *tools = p->tools_json ? json_loads(p->tools_json, 0, NULL) : NULL;
    bool ok = true;
    for (;;) {
        kg_tc_skip_ws(p);
        conv_t c = lfm2_call(p, tools);
        if (c != CONV_OK) {
            ok = c == CONV_PARTIAL;
            break;
        }
        if (kg_tc_eat(p, ",")) {
            continue;
        }
        kg_tc_skip_ws(p);
        ok = kg_tc_eat(p, "]") ? kg_tc_eat(p, "<|tool_call_end|>")
                                     ? kg_tc_at_end(p)
                                     : kg_tc_end_or_cut(p, "<|tool_call_end|>")
                               : kg_tc_at_end(p);
        break;
    }
    json_decref(tools);
    return ok;
}
