/* kg_toolcall: tool calls out of a model's answer, per call syntax (see
 * kg_toolcall.h). One parser a format; each reads the text left to right and
 * either ends at the text's end (calls found) or gives up (malformed: all
 * content). */
#include "kg_toolcall_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

// ---- detection ----

static bool has(const char *s, const char *needle) {
    return strstr(s, needle) != NULL;
}

kg_toolfmt_t kg_toolfmt_detect(const char *t) {
    if (!t) {
        return KG_TOOLFMT_NONE;
    }
    /* the specialised checks first, in llama.cpp's order */
    if (has(t, "[TOOL_CALLS]") && has(t, "[ARGS]")) {
        return KG_TOOLFMT_MISTRAL_ARGS;
    }
    if (has(t, "<|channel|>")) {
        return KG_TOOLFMT_GPT_OSS;
    }
    if (has(t, ">>>all") && has(t, ">>>${recipient}")) {
        return KG_TOOLFMT_FUNCTIONARY;
    }
    if (has(t, "<|tool_calls_section_begin|>") && has(t, "<|tool_call_begin|>")) {
        return KG_TOOLFMT_KIMI_K2;
    }
    /* LFM2 (its tool list in <|tool_list_start|>) and LFM2.5 (a plain "List of tools: [") */
    if ((has(t, "<|tool_list_start|>") && has(t, "<|tool_list_end|>")) ||
        has(t, "List of tools: [")) {
        return KG_TOOLFMT_LFM2;
    }
    if (has(t, "'<|tool_call>call:'")) {
        return KG_TOOLFMT_GEMMA4;
    }
    if (has(t, "<tool_call>") && has(t, "<function=") && has(t, "<parameter=")) {
        return KG_TOOLFMT_QWEN3_CODER;
    }
    /* GLM's tagged arguments (llama.cpp's autoparser finds them; Ling 3.0, which also writes
     * <arg_key>, has its own specialised parser there and none here) */
    if (has(t, "<tool_call>") && has(t, "<arg_key>") && has(t, "<arg_value>") &&
        !has(t, "<role>ASSISTANT</role>")) {
        return KG_TOOLFMT_GLM;
    }
    /* MiniMax-M2's invoke blocks (M3 writes them inside <tool_call> with its own namespace
     * token, a different syntax) */
    if (has(t, "<minimax:tool_call>") && has(t, "<invoke name=")) {
        return KG_TOOLFMT_MINIMAX_M2;
    }
    /* then what the autoparser finds in the templates that write these markers */
    if (has(t, "<|START_ACTION|>") && has(t, "<|START_THINKING|>")) {
        return KG_TOOLFMT_COMMAND_R7B;
    }
    if (has(t, "<｜tool▁calls▁begin｜>") || has(t, "tool▁calls▁begin")) {
        return has(t, "```json") ? KG_TOOLFMT_DEEPSEEK_R1 : KG_TOOLFMT_DEEPSEEK_V3;
    }
    if (has(t, "[TOOL_CALLS]")) {
        return KG_TOOLFMT_MISTRAL;
    }
    if (has(t, "<tool_call>")) {
        return KG_TOOLFMT_HERMES;
    }
    /* Functionary v3.1: a Llama 3.1 template that teaches <function=N>{...}</function> (the
     * check of llama.cpp's "Functionary 3.1" autoparser patch) */
    if (has(t, "set has_code_interpreter = tools | selectattr(\"type\", \"equalto\", "
               "\"code_interpreter\") | list | length > 0")) {
        return KG_TOOLFMT_FUNCTIONARY_V31;
    }
    if (has(t, "<|start_header_id|>") && (has(t, "ipython") || has(t, "<|python_tag|>"))) {
        return KG_TOOLFMT_LLAMA3;
    }
    return KG_TOOLFMT_NONE;
}

const char *kg_toolfmt_name(kg_toolfmt_t f) {
    static const char *const names[] = {"none",        "hermes",          "qwen3_coder",
                                        "llama3",      "mistral",         "mistral_args",
                                        "deepseek_r1", "deepseek_v3",     "command_r7b",
                                        "functionary", "gpt_oss",         "glm",
                                        "kimi_k2",     "minimax_m2",      "gemma4",
                                        "lfm2",        "functionary_v3_1"};
    return (unsigned)f < sizeof(names) / sizeof(names[0]) ? names[f] : "?";
}

// ---- results ----

void kg_toolparse_clear(kg_toolparse_t *p) {
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
        free(p->calls[i].id);
    }
    free(p->calls);
    free(p->content);
    free(p->reasoning);
    memset(p, 0, sizeof(*p));
}

typedef kg_tcparse_t parse_t;

char *kg_tc_dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

void kg_tc_add_call(parse_t *p, char *name, char *args, char *id) {
    kg_toolparse_t *o = p->out;
    kg_toolcall_t *c = name && args && id ? realloc(o->calls, (o->n_calls + 1) * sizeof(*c)) : NULL;
    if (!c) {
        free(name), free(args), free(id);
        p->oom = true;
        return;
    }
    o->calls = c;
    c[o->n_calls++] = (kg_toolcall_t){name, args, id};
}

void kg_tc_add_call_n(parse_t *p,
                      const char *name,
                      size_t name_n,
                      const char *args,
                      size_t args_n,
                      const char *id,
                      size_t id_n) {
    kg_tc_add_call(p, kg_tc_dup_n(name, name_n), kg_tc_dup_n(args, args_n),
                   kg_tc_dup_n(id ? id : "", id ? id_n : 0));
}

void kg_tc_set_content(parse_t *p, size_t from, size_t to) {
    free(p->out->content);
    p->out->content = kg_tc_dup_n(p->s + from, to - from);
    p->out->content_len = to - from;
    if (!p->out->content) {
        p->oom = true;
    }
}

void kg_tc_add_reasoning(parse_t *p, const char *s, size_t n) {
    kg_tcbuf_t b = {0};
    if (p->out->reasoning) {
        kg_tcbuf_put(&b, p->out->reasoning, p->out->reasoning_len);
        free(p->out->reasoning);
    }
    kg_tcbuf_put(&b, s, n);
    p->out->reasoning_len = b.n;
    p->out->reasoning = kg_tcbuf_take(&b);
    if (!p->out->reasoning) {
        p->oom = true;
    }
}

/* Whether `lit` starts at byte i of the text, within [0, end) (the text has
 * no NUL after it: model output is bytes with a length). */
static bool has_at(const parse_t *p, size_t i, size_t end, const char *lit) {
    size_t n = strlen(lit);
    return i <= end && end - i >= n && memcmp(p->s + i, lit, n) == 0;
}

bool kg_tc_at(const parse_t *p, const char *lit) {
    size_t n = strlen(lit);
    return p->len - p->i >= n && memcmp(p->s + p->i, lit, n) == 0;
}

bool kg_tc_eat(parse_t *p, const char *lit) {
    if (!kg_tc_at(p, lit)) {
        return false;
    }
    p->i += strlen(lit);
    return true;
}

/* Where `lit` next starts at or after `from`, or len. */
size_t kg_tc_find(const parse_t *p, size_t from, const char *lit) {
    size_t n = strlen(lit);
    for (size_t i = from; i + n <= p->len; i++) {
        if (memcmp(p->s + i, lit, n) == 0) {
            return i;
        }
    }
    return p->len;
}

/* The text ends inside `lit` (a proper prefix of it is all that is left):
 * the output was cut there (max_tokens), which is no syntax error. */
static bool kg_tc_cut_in(parse_t *p, const char *lit) {
    size_t rest = p->len - p->i;
    return rest > 0 && rest < strlen(lit) && memcmp(p->s + p->i, lit, rest) == 0;
}

/* The end of the text, or a cut inside what had to come next. */
bool kg_tc_end_or_cut(parse_t *p, const char *lit) {
    return p->i >= p->len || kg_tc_cut_in(p, lit);
}

void kg_tc_skip_ws(parse_t *p) {
    p->i = kg_tc_ws(p->s, p->len, p->i);
}

bool kg_tc_at_end(parse_t *p) {
    return p->i >= p->len;
}

/* A JSON value at the cursor; the cursor moves past it. */
kg_jspan_t kg_tc_value(parse_t *p) {
    kg_jspan_t v = kg_tc_json_value(p->s, p->len, p->i);
    if (!v.bad) {
        p->i = v.end;
    }
    return v;
}

/* A call from an object's name and arguments members (and an id member when
 * `id_key`): false when the object is not a call. The arguments may be cut by
 * the end of the text. */
static bool object_call(parse_t *p,
                        const kg_jspan_t *obj,
                        const char *name_key,
                        const char *args_key,
                        const char *id_key) {
    kg_jspan_t nv, av, iv;
    if (!kg_tc_json_member(p->s, obj, name_key, &nv) ||
        !kg_tc_json_member(p->s, obj, args_key, &av)) {
        return false;
    }
    char *name = kg_tc_json_string(p->s, &nv);
    if (!name) {
        return false;
    }
    char *id = NULL;
    if (id_key && kg_tc_json_member(p->s, obj, id_key, &iv)) {
        id = kg_tc_json_string(p->s, &iv);
    }
    kg_tc_add_call(p, name, kg_tc_dup_n(p->s + av.start, av.end - av.start),
                   id ? id : kg_tc_dup_n("", 0));
    return true;
}

// ---- the formats ----

/* Hermes: <tool_call>\n{json}\n</tool_call>, repeated with whitespace between. */
static bool parse_hermes(parse_t *p) {
    const char *open = "<tool_call>\n";
    size_t first = kg_tc_find(p, 0, open);
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    while (kg_tc_eat(p, open)) {
        kg_jspan_t obj = kg_tc_value(p);
        if (obj.bad || !object_call(p, &obj, "name", "arguments", NULL)) {
            return obj.partial; /* cut before its name and arguments: no call yet */
        }
        if (obj.partial) {
            return true;
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, "</tool_call>")) {
            return kg_tc_end_or_cut(p, "</tool_call>");
        }
        kg_tc_skip_ws(p);
    }
    return kg_tc_end_or_cut(p, open);
}

/* The schema type of parameter `key` of tool `name`, or NULL. */
const char *kg_tc_param_type(json_t *tools, const char *name, const char *key) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f) {
            f = t;
        }
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && strcmp(n, name) == 0) {
            json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
            return json_string_value(json_object_get(json_object_get(props, key), "type"));
        }
    }
    return NULL;
}

void kg_tc_put_value(
    const parse_t *p, kg_tcbuf_t *args, const char *type, size_t v0, size_t v1, bool closed) {
    kg_jspan_t raw = kg_tc_json_value(p->s, v1, v0);
    /* a number running to the value's end scans as partial (it could go on): it is whole here */
    bool whole = !raw.partial ||
                 (raw.end == v1 && v1 > v0 && p->s[v1 - 1] >= '0' && p->s[v1 - 1] <= '9' &&
                  p->s[raw.start] != '"' && p->s[raw.start] != '[' && p->s[raw.start] != '{');
    bool as_json = (!type || strcmp(type, "string") != 0) && !raw.bad && whole &&
                   kg_tc_ws(p->s, v1, raw.end) == v1 && closed;
    if (as_json) {
        kg_tcbuf_put(args, p->s + v0, v1 - v0);
    } else {
        kg_tcbuf_puts(args, "\"");
        kg_tcbuf_put_json_chars(args, p->s + v0, v1 - v0);
        if (closed) {
            kg_tcbuf_puts(args, "\"");
        }
    }
}

/* One <parameter=K>\nV\n</parameter> into the arguments object being built. */
static bool coder_param(parse_t *p, json_t *tools, const char *fname, kg_tcbuf_t *args, bool *cut) {
    size_t kend = kg_tc_find(p, p->i, ">");
    if (kend == p->len) {
        *cut = true;
        return true;
    }
    char *key = kg_tc_dup_n(p->s + p->i, kend - p->i);
    if (!key) {
        p->oom = true;
        return false;
    }
    p->i = kend + 1;
    kg_tc_eat(p, "\n");
    size_t vend = kg_tc_find(p, p->i, "</parameter>");
    size_t v0 = p->i, v1 = vend;
    if (vend < p->len && v1 > v0 && p->s[v1 - 1] == '\n') {
        v1--; /* the newline before </parameter> is the syntax's */
    }
    if (args->n > 1) {
        kg_tcbuf_puts(args, ",");
    }
    kg_tcbuf_puts(args, "\"");
    kg_tcbuf_put_json_chars(args, key, strlen(key));
    kg_tcbuf_puts(args, "\":");
    kg_tc_put_value(p, args, kg_tc_param_type(tools, fname, key), v0, v1, vend < p->len);
    free(key);
    if (vend == p->len) {
        *cut = true;
        p->i = p->len;
        return true;
    }
    p->i = vend + strlen("</parameter>");
    kg_tc_eat(p, "\n");
    return true;
}

/* Qwen3-Coder:
 * <tool_call>\n<function=N>\n(<parameter=K>\nV\n</parameter>\n)*</function>\n</tool_call> */
static bool parse_qwen3_coder(parse_t *p) {
    const char *open = "<tool_call>\n<function=";
    size_t first = kg_tc_find(p, 0, open);
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    json_t *tools = p->tools_json ? json_loads(p->tools_json, 0, NULL) : NULL;
    bool ok = true;
    while (ok && kg_tc_eat(p, open)) {
        size_t nend = kg_tc_find(p, p->i, ">");
        if (nend == p->len) {
            ok = false;
            break;
        }
        char *name = kg_tc_dup_n(p->s + p->i, nend - p->i);
        p->i = nend + 1;
        kg_tc_eat(p, "\n");
        kg_tcbuf_t args = {0};
        kg_tcbuf_puts(&args, "{");
        bool cut = false;
        while (ok && !cut && name && kg_tc_eat(p, "<parameter=")) {
            ok = coder_param(p, tools, name, &args, &cut);
        }
        if (!cut) {
            kg_tcbuf_puts(&args, "}");
        }
        kg_tc_add_call(p, name, kg_tcbuf_take(&args), kg_tc_dup_n("", 0));
        if (!ok || cut || p->oom) {
            break;
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, "</function>")) {
            ok = kg_tc_end_or_cut(p, "</function>");
            p->i = ok ? p->len : p->i;
            break;
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, "</tool_call>")) {
            ok = kg_tc_end_or_cut(p, "</tool_call>");
            p->i = ok ? p->len : p->i;
            break;
        }
        kg_tc_skip_ws(p);
    }
    json_decref(tools);
    return ok && (kg_tc_end_or_cut(p, open));
}

/* Llama 3.x: the answer is one {"name", "parameters"} object, perhaps after
 * <|python_tag|> (which llama.cpp leaves in the content). */
static bool parse_llama3(parse_t *p) {
    size_t c0 = p->i;
    kg_tc_eat(p, "<|python_tag|>");
    size_t c1 = p->i;
    kg_tc_skip_ws(p);
    if (kg_tc_at_end(p) || p->s[p->i] != '{') {
        p->i = 0;
        return true;
    }
    kg_jspan_t obj = kg_tc_value(p);
    if (obj.bad || !object_call(p, &obj, "name", "parameters", NULL)) {
        if (obj.bad && c1 > c0) {
            return false;
        }
        return true; /* JSON that is no call: an answer */
    }
    kg_tc_set_content(p, c0, c1);
    kg_tc_skip_ws(p);
    return kg_tc_at_end(p);
}

/* A JSON array of call objects at p->i, up to the end of the output: `[{NAME: ..., ARGS: ...,
 * ID: ...}, ...]` and then `close` (NULL: none) if the format ends with one. Mistral's
 * [TOOL_CALLS] and Command R7B's action list share it. */
static bool call_array(
    parse_t *p, const char *name_key, const char *args_key, const char *id_key, const char *close) {
    kg_tc_skip_ws(p);
    if (!kg_tc_eat(p, "[")) {
        return false;
    }
    for (;;) {
        kg_tc_skip_ws(p);
        kg_jspan_t obj = kg_tc_value(p);
        if (obj.bad || !object_call(p, &obj, name_key, args_key, id_key)) {
            return obj.partial;
        }
        if (obj.partial) {
            return true;
        }
        kg_tc_skip_ws(p);
        if (kg_tc_eat(p, "]")) {
            kg_tc_skip_ws(p);
            if (close) {
                kg_tc_eat(p, close);
                kg_tc_skip_ws(p);
            }
            return kg_tc_at_end(p);
        }
        if (!kg_tc_eat(p, ",")) {
            return kg_tc_at_end(p);
        }
    }
}

/* Mistral Nemo: content[TOOL_CALLS][{"name", "arguments", "id"}, ...] */
static bool parse_mistral(parse_t *p) {
    size_t first = kg_tc_find(p, 0, "[TOOL_CALLS]");
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first + strlen("[TOOL_CALLS]");
    return call_array(p, "name", "arguments", "id", NULL);
}

/* Devstral, Magistral: content([TOOL_CALLS]name[ARGS]{...})+ */
static bool parse_mistral_args(parse_t *p) {
    size_t first = kg_tc_find(p, 0, "[TOOL_CALLS]");
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    while (kg_tc_eat(p, "[TOOL_CALLS]")) {
        size_t a = kg_tc_find(p, p->i, "[ARGS]");
        if (a == p->len || kg_tc_find(p, p->i, "[") < a) {
            return false;
        }
        size_t n0 = p->i;
        p->i = a + strlen("[ARGS]");
        kg_jspan_t v = kg_tc_value(p);
        if (v.bad) {
            return false;
        }
        kg_tc_add_call_n(p, p->s + n0, a - n0, p->s + v.start, v.end - v.start, NULL, 0);
        if (v.partial) {
            return true;
        }
    }
    kg_tc_skip_ws(p);
    return kg_tc_at_end(p);
}

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END   "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN  "<｜tool▁call▁begin｜>"
#define DS_CALL_END    "<｜tool▁call▁end｜>"
#define DS_SEP         "<｜tool▁sep｜>"

/* DeepSeek R1 (`r1`: function<sep>name\n```json\nA\n```) and V3.1 (name<sep>A). */
static bool parse_deepseek(parse_t *p, bool r1) {
    size_t first = kg_tc_find(p, 0, DS_CALLS_BEGIN);
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first + strlen(DS_CALLS_BEGIN);
    kg_tc_skip_ws(p);
    while (kg_tc_eat(p, DS_CALL_BEGIN)) {
        if (r1 && !kg_tc_eat(p, "function")) {
            return false;
        }
        size_t n0 = p->i, n1;
        if (r1) {
            if (!kg_tc_eat(p, DS_SEP)) {
                return false;
            }
            n0 = p->i;
            n1 = kg_tc_find(p, p->i, "\n");
            if (n1 == p->len) {
                return false;
            }
            p->i = n1 + 1;
            if (!kg_tc_eat(p, "```json")) {
                return false;
            }
        } else {
            n1 = kg_tc_find(p, p->i, DS_SEP);
            if (n1 == p->len) {
                return false;
            }
            p->i = n1 + strlen(DS_SEP);
        }
        kg_jspan_t v = kg_tc_value(p);
        if (v.bad) {
            return false;
        }
        kg_tc_add_call_n(p, p->s + n0, n1 - n0, p->s + v.start, v.end - v.start, NULL, 0);
        if (v.partial) {
            return true;
        }
        kg_tc_skip_ws(p);
        if (r1 && !kg_tc_eat(p, "```")) {
            return kg_tc_end_or_cut(p, "```");
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, DS_CALL_END)) {
            return kg_tc_end_or_cut(p, DS_CALL_END);
        }
        kg_tc_skip_ws(p);
    }
    if (!kg_tc_eat(p, DS_CALLS_END)) {
        return kg_tc_end_or_cut(p, DS_CALLS_END) || kg_tc_end_or_cut(p, DS_CALL_BEGIN);
    }
    kg_tc_skip_ws(p);
    return kg_tc_at_end(p);
}

/* Command R7B: [<|START_THINKING|>R<|END_THINKING|>] then <|START_RESPONSE|>C<|END_RESPONSE|>
 * or <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>. */
static bool parse_command_r7b(parse_t *p) {
    if (kg_tc_eat(p, "<|START_THINKING|>")) {
        size_t e = kg_tc_find(p, p->i, "<|END_THINKING|>");
        kg_tc_add_reasoning(p, p->s + p->i, e - p->i);
        p->i = e == p->len ? e : e + strlen("<|END_THINKING|>");
        kg_tc_skip_ws(p);
    }
    size_t c0 = p->i;
    if (kg_tc_eat(p, "<|START_RESPONSE|>")) {
        size_t e = kg_tc_find(p, p->i, "<|END_RESPONSE|>");
        kg_tc_set_content(p, p->i, e);
        return true;
    }
    size_t a = kg_tc_find(p, p->i, "<|START_ACTION|>");
    kg_tc_set_content(p, c0, a);
    if (a == p->len) {
        return true;
    }
    p->i = a + strlen("<|START_ACTION|>");
    return call_array(p, "tool_name", "parameters", "tool_call_id", "<|END_ACTION|>");
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* Functionary v3.2, after the prompt's ">>>": "all\n" and the content, or a
 * function's name, a newline and its JSON arguments (one call). */
static bool parse_functionary(parse_t *p) {
    if (kg_tc_eat(p, "all\n")) {
        kg_tc_set_content(p, p->i, p->len);
        return true;
    }
    size_t n0 = p->i;
    while (!kg_tc_at_end(p) && is_name_char(p->s[p->i])) {
        p->i++;
    }
    size_t n1 = p->i;
    if (n1 == n0 || !kg_tc_eat(p, "\n")) {
        p->i = 0;
        return true; /* no recipient line: an answer */
    }
    kg_jspan_t v = kg_tc_value(p);
    if (v.bad) {
        return false;
    }
    kg_tc_add_call_n(p, p->s + n0, n1 - n0, p->s + v.start, v.end - v.start, NULL, 0);
    kg_tc_skip_ws(p);
    return kg_tc_at_end(p);
}

/* Functionary v3.1 (llama.cpp's autoparser with its "Functionary 3.1" patch): content up to
 * the first <function=, then calls <function=N>{...}</function> with whitespace between and
 * nothing after. `<|python_tag|>` code is no call there (that parser has no python tool):
 * content. */
static bool parse_functionary_v31(parse_t *p) {
    const char *open = "<function=";
    size_t first = kg_tc_find(p, 0, open);
    if (first == p->len) {
        return true;
    }
    kg_tc_set_content(p, 0, first);
    p->i = first;
    while (kg_tc_eat(p, open)) {
        size_t n0 = p->i;
        while (!kg_tc_at_end(p) && is_name_char(p->s[p->i])) {
            p->i++;
        }
        size_t n1 = p->i;
        if (kg_tc_at_end(p)) {
            return true; /* cut inside the name: no call yet */
        }
        if (n1 == n0 || !kg_tc_eat(p, ">")) {
            return false;
        }
        kg_tc_skip_ws(p);
        if (kg_tc_at_end(p)) {
            return true; /* cut before the arguments: no call yet */
        }
        kg_jspan_t v = kg_tc_value(p);
        if (v.bad) {
            return false;
        }
        kg_tc_add_call_n(p, p->s + n0, n1 - n0, p->s + v.start, v.end - v.start, NULL, 0);
        if (v.partial) {
            return true;
        }
        kg_tc_skip_ws(p);
        if (!kg_tc_eat(p, "</function>")) {
            return kg_tc_end_or_cut(p, "</function>");
        }
        kg_tc_skip_ws(p);
    }
    return kg_tc_end_or_cut(p, open);
}

/* Where a Harmony message's body that goes on from `from` ends: its first <|end|>, <|call|> or
 * <|return|>, or the text's end. */
static size_t end_of_body(const parse_t *p, size_t from) {
    size_t e = from;
    while (e < p->len && !(has_at(p, e, p->len, "<|end|>") || has_at(p, e, p->len, "<|call|>") ||
                           has_at(p, e, p->len, "<|return|>"))) {
        e++;
    }
    return e;
}

/* gpt-oss Harmony, after the prompt's <|start|>assistant: messages of a
 * header (<|channel|>C, " to=functions.N", <|constrain|>json) and a body up
 * to <|end|>, <|call|> or <|return|>; analysis is reasoning, final the
 * content, a functions recipient a call. */
static bool parse_gpt_oss(parse_t *p) {
    if (!kg_tc_at(p, "<|channel|>") && !kg_tc_at(p, " to=")) {
        return true;
    }
    kg_tcbuf_t content = {0};
    bool ok = true;
    while (!kg_tc_at_end(p)) {
        size_t h = p->i;
        size_t m = kg_tc_find(p, h, "<|message|>");
        if (m == p->len) {
            ok = false;
            break;
        }
        size_t body = m + strlen("<|message|>");
        size_t e = end_of_body(p, body);
        /* the header's recipient and channel */
        parse_t hp = *p;
        hp.len = m;
        size_t to = kg_tc_find(&hp, h, "to=functions.");
        /* the last channel: gpt-oss-20b may prefix one with a stray <|channel|>commentary */
        size_t ch = kg_tc_find(&hp, h, "<|channel|>");
        for (size_t c2 = ch; c2 < m; c2 = kg_tc_find(&hp, c2 + 1, "<|channel|>")) {
            ch = c2;
        }
        if (to < m && p->no_calls) {
            /* an unsolicited call (a built-in tool's): dropped, as llama.cpp drops it */
        } else if (to < m) {
            size_t n0 = to + strlen("to=functions."), n1 = n0;
            while (n1 < m && is_name_char(p->s[n1])) {
                n1++;
            }
            /* the arguments are a JSON value, read as one (a string may hold an <|end|>, as
             * llama.cpp's parser reads it); the message ends after it */
            kg_jspan_t v = kg_tc_json_value(p->s, p->len, body);
            if (!v.bad && !v.partial) {
                e = end_of_body(p, v.end);
            } else {
                v = kg_tc_json_value(p->s, e, body);
            }
            size_t a0 = v.bad ? body : v.start, a1 = v.bad ? e : v.end;
            kg_tc_add_call_n(p, p->s + n0, n1 - n0, p->s + a0, a1 - a0, NULL, 0);
        } else if (ch < m && has_at(p, ch + strlen("<|channel|>"), m, "analysis") &&
                   p->keep_reasoning) {
            /* reasoning_format none: the analysis message stays in the content, header and
             * end marker and all (without its <|start|>assistant), as llama.cpp keeps it */
            size_t end = e;
            if (has_at(p, e, p->len, "<|end|>")) {
                end += strlen("<|end|>");
            }
            kg_tcbuf_put(&content, p->s + h, end - h);
        } else if (ch < m && has_at(p, ch + strlen("<|channel|>"), m, "analysis")) {
            kg_tc_add_reasoning(p, p->s + body, e - body);
        } else if (ch < m) {
            kg_tcbuf_put(&content, p->s + body, e - body);
        }
        p->i = e;
        if (!kg_tc_eat(p, "<|end|>") && !kg_tc_eat(p, "<|call|>") && !kg_tc_eat(p, "<|return|>")) {
            break;
        }
        if (!kg_tc_at_end(p) && !kg_tc_eat(p, "<|start|>assistant")) {
            ok = false;
            break;
        }
    }
    size_t c_len = content.n;
    char *c = kg_tcbuf_take(&content);
    if (!c) {
        p->oom = true;
        return true;
    }
    free(p->out->content);
    p->out->content = c;
    p->out->content_len = c_len;
    return ok;
}

static kg_status_t parse(kg_toolfmt_t f,
                         const char *text,
                         size_t len,
                         const char *tools_json,
                         bool no_calls,
                         bool keep_reasoning,
                         kg_toolparse_t *out) {
    memset(out, 0, sizeof(*out));
    parse_t p = {text, len, 0, out, tools_json, no_calls, false, keep_reasoning};
    bool ok = true;
    switch (f) {
    case KG_TOOLFMT_HERMES:
        ok = parse_hermes(&p);
        break;
    case KG_TOOLFMT_QWEN3_CODER:
        ok = parse_qwen3_coder(&p);
        break;
    case KG_TOOLFMT_LLAMA3:
        ok = parse_llama3(&p);
        break;
    case KG_TOOLFMT_MISTRAL:
        ok = parse_mistral(&p);
        break;
    case KG_TOOLFMT_MISTRAL_ARGS:
        ok = parse_mistral_args(&p);
        break;
    case KG_TOOLFMT_DEEPSEEK_R1:
        ok = parse_deepseek(&p, true);
        break;
    case KG_TOOLFMT_DEEPSEEK_V3:
        ok = parse_deepseek(&p, false);
        break;
    case KG_TOOLFMT_COMMAND_R7B:
        ok = parse_command_r7b(&p);
        break;
    case KG_TOOLFMT_FUNCTIONARY:
        ok = parse_functionary(&p);
        break;
    case KG_TOOLFMT_GPT_OSS:
        ok = parse_gpt_oss(&p);
        break;
    case KG_TOOLFMT_GLM:
        ok = kg_tc_parse_glm(&p);
        break;
    case KG_TOOLFMT_KIMI_K2:
        ok = kg_tc_parse_kimi(&p);
        break;
    case KG_TOOLFMT_MINIMAX_M2:
        ok = kg_tc_parse_minimax(&p);
        break;
    case KG_TOOLFMT_GEMMA4:
        ok = kg_tc_parse_gemma4(&p);
        break;
    case KG_TOOLFMT_LFM2:
        ok = kg_tc_parse_lfm2(&p);
        break;
    case KG_TOOLFMT_FUNCTIONARY_V31:
        ok = parse_functionary_v31(&p);
        break;
    default:
        break;
    }
    if (p.oom) {
        kg_toolparse_clear(out);
        return KG_ERR_NOMEM;
    }
    if (!ok || out->n_calls == 0) {
        /* no calls, or a syntax that broke: the whole text is the answer */
        bool had_reasoning = out->reasoning != NULL && ok;
        char *reasoning = had_reasoning ? out->reasoning : NULL;
        size_t reasoning_len = had_reasoning ? out->reasoning_len : 0;
        char *content = ok ? out->content : NULL;
        size_t content_len = content ? out->content_len : len;
        if (had_reasoning) {
            out->reasoning = NULL;
        }
        if (content) {
            out->content = NULL;
        }
        kg_toolparse_clear(out);
        out->malformed = !ok;
        out->reasoning = reasoning;
        out->reasoning_len = reasoning_len;
        out->content = content ? content : kg_tc_dup_n(text, len);
        out->content_len = content_len;
        if (!out->content) {
            free(out->reasoning);
            out->reasoning = NULL;
            return KG_ERR_NOMEM;
        }
        return KG_OK;
    }
    if (!out->content) {
        out->content_len = 0;
        out->content = kg_tc_dup_n(text, 0);
        if (!out->content) {
            kg_toolparse_clear(out);
            return KG_ERR_NOMEM;
        }
    }
    return KG_OK;
}

kg_status_t kg_toolcall_parse(
    kg_toolfmt_t f, const char *text, size_t len, const char *tools_json, kg_toolparse_t *out) {
    return parse(f, text, len, tools_json, false, false, out);
}

kg_status_t kg_toolcall_parse_keep_reasoning(
    kg_toolfmt_t f, const char *text, size_t len, const char *tools_json, kg_toolparse_t *out) {
    return parse(f, text, len, tools_json, false, true, out);
}

bool kg_toolfmt_own_reasoning(kg_toolfmt_t f) {
    return f == KG_TOOLFMT_GPT_OSS;
}

kg_status_t
kg_toolcall_parse_answer(kg_toolfmt_t f, const char *text, size_t len, kg_toolparse_t *out) {
    return parse(kg_toolfmt_own_reasoning(f) ? f : KG_TOOLFMT_NONE, text, len, NULL, true, false,
                 out);
}
