/* kg_toolcall_int.h: what the tool-call parser's files share: the raw JSON
 * scanner (kg_toolcall_json.c) and the result builder. */
#pragma once

#include "kg_toolcall.h"

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
