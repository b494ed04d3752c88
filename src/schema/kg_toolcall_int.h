/* kg_toolcall_int.h: what the tool-call parser's files share: the raw JSON
 * scanner (kg_toolcall_json.c), the result builder, the cursor helpers of a
 * parse (kg_toolcall.c) and the parsers of kg_toolcall_tagged.c. */
#pragma once

#include "kg_toolcall.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A scan of one JSON value: where it ends, or that the text ended inside it
 * (`partial`), or that it is not JSON (`bad`). */
typedef struct kg_jspan {
    size_t start, end;
    bool partial;
    bool bad;
} kg_jspan_t;

/** Skip JSON whitespace from i. */
size_t kg_tc_ws(const char *s, size_t len, size_t i);

/** Scan the JSON value at s[i] (after whitespace). */
kg_jspan_t kg_tc_json_value(const char *s, size_t len, size_t i);

/** The value of member `key` of the object spanning `obj` (a complete or
 * partial scan); false when absent. A value cut by the text's end comes back
 * partial, running to `obj.end`. */
bool kg_tc_json_member(const char *s, const kg_jspan_t *obj, const char *key, kg_jspan_t *val);

/** A complete JSON string's value, unescaped (malloc'ed), or NULL. */
char *kg_tc_json_string(const char *s, const kg_jspan_t *v);

/* A growing byte buffer; `oom` latches a failed allocation. */
typedef struct kg_tcbuf {
    char *p;
    size_t n, cap;
    bool oom;
} kg_tcbuf_t;

void kg_tcbuf_put(kg_tcbuf_t *b, const char *s, size_t n);
void kg_tcbuf_puts(kg_tcbuf_t *b, const char *s);
/** Text as a JSON string's inside (no quotes), escaped as nlohmann::json
 * dumps it (", \, control characters; UTF-8 as is). */
void kg_tcbuf_put_json_chars(kg_tcbuf_t *b, const char *s, size_t n);
/** The buffer's text as a malloc'ed string (the buffer gives it up). */
char *kg_tcbuf_take(kg_tcbuf_t *b);

// ---- a parse in progress (kg_toolcall.c) ----

/* The text, the cursor and what it found; `oom` latches a failed allocation. */
typedef struct kg_tcparse {
    const char *s;
    size_t len, i;
    kg_toolparse_t *out;
    const char *tools_json;
    bool no_calls; /* the job has no tools: a call is not the answer's (kg_toolcall_parse_answer) */
    bool oom;
    bool keep_reasoning; /* reasoning_format none: a format's own reasoning stays in the content */
} kg_tcparse_t;

char *kg_tc_dup_n(const char *s, size_t n);
/** A call (takes the three strings; any NULL is out of memory). */
void kg_tc_add_call(kg_tcparse_t *p, char *name, char *args, char *id);
void kg_tc_add_call_n(kg_tcparse_t *p,
                      const char *name,
                      size_t name_n,
                      const char *args,
                      size_t args_n,
                      const char *id,
                      size_t id_n);
/** Content is the text [from, to). */
void kg_tc_set_content(kg_tcparse_t *p, size_t from, size_t to);
void kg_tc_add_reasoning(kg_tcparse_t *p, const char *s, size_t n);
/** Whether the text at the cursor starts with `lit` (kg_tc_eat: and step past it). */
bool kg_tc_at(const kg_tcparse_t *p, const char *lit);
bool kg_tc_eat(kg_tcparse_t *p, const char *lit);
/** Where `lit` next starts at or after `from`, or len. */
size_t kg_tc_find(const kg_tcparse_t *p, size_t from, const char *lit);
/** The end of the text, or a cut inside `lit` (what had to come next). */
bool kg_tc_end_or_cut(kg_tcparse_t *p, const char *lit);
void kg_tc_skip_ws(kg_tcparse_t *p);
bool kg_tc_at_end(kg_tcparse_t *p);
/** A JSON value at the cursor; the cursor moves past it unless it is bad. */
kg_jspan_t kg_tc_value(kg_tcparse_t *p);
/** The schema type of parameter `key` of tool `name` in `tools` (an array), or NULL. */
const char *kg_tc_param_type(json_t *tools, const char *name, const char *key);
/** A tagged parameter's value, text [v0, v1), into an arguments object: a JSON
 * string when its schema type is string, when it is no whole JSON value, or
 * when the output ended inside it (`closed` false: the string is left open);
 * else its JSON text as written. */
void kg_tc_put_value(
    const kg_tcparse_t *p, kg_tcbuf_t *args, const char *type, size_t v0, size_t v1, bool closed);

// ---- the tagged formats (kg_toolcall_tagged.c); false: the syntax broke ----

bool kg_tc_parse_glm(kg_tcparse_t *p);
bool kg_tc_parse_minimax(kg_tcparse_t *p);
bool kg_tc_parse_kimi(kg_tcparse_t *p);

// ---- the syntaxes converted to JSON (kg_toolcall_convert.c) ----

bool kg_tc_parse_gemma4(kg_tcparse_t *p);
bool kg_tc_parse_lfm2(kg_tcparse_t *p);
