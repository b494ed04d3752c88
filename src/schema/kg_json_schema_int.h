/* kg_json_schema_int: the state of one JSON Schema conversion and the
 * grammar pieces for JSON text it is built from, shared by the schema walk
 * (kg_json_schema.c) and the pieces (kg_json_rules.c). It passes json_t,
 * which never leaves src/schema/. */
#pragma once

#include "kg_json_schema.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAX_POINTER 512

typedef struct ref {
    char *ptr;
    int32_t rule;
} ref_t;

typedef struct conv {
    kg_gir_t *g;
    json_t *root;
    char *errstr;
    size_t errstr_size;
    bool failed;
    char ptr[MAX_POINTER + 64]; /* JSON pointer of the schema being built */
    size_t ptr_len;
    int depth;
    ref_t *refs;
    int32_t n_refs, cap_refs;
    /* shared rules, made on first use */
    int32_t r_ws, r_char, r_string, r_number, r_value;
} conv_t;

// ---- failing and where (static inline: both files use them everywhere) ----

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int32_t
fail(conv_t *c, const char *fmt, ...) {
    if (!c->failed) {
        char msg[300];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        snprintf(c->errstr, c->errstr_size, "%s", msg);
        c->failed = true;
    }
    return -1;
}

static inline int32_t oom(conv_t *c, int32_t h) {
    if (h < 0 && !c->failed) {
        fail(c, "schema: out of memory");
    }
    return h;
}

/* JSON pointers */

static inline size_t ptr_push(conv_t *c, const char *key) {
    size_t saved = c->ptr_len;
    if (c->ptr_len < MAX_POINTER) {
        c->ptr[c->ptr_len++] = '/';
        for (const char *p = key; *p && c->ptr_len < MAX_POINTER; p++) {
            if (*p == '~' || *p == '/') {
                c->ptr[c->ptr_len++] = '~';
                c->ptr[c->ptr_len++] = *p == '~' ? '0' : '1';
            } else {
                c->ptr[c->ptr_len++] = *p;
            }
        }
    }
    c->ptr[c->ptr_len] = '\0';
    return saved;
}

static inline size_t ptr_push_index(conv_t *c, size_t i) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%zu", i);
    return ptr_push(c, buf);
}

static inline void ptr_pop(conv_t *c, size_t saved) {
    c->ptr_len = saved;
    c->ptr[saved] = '\0';
}

static inline const char *here(const conv_t *c) {
    return c->ptr_len ? c->ptr : "(root)";
}

static inline int32_t lit(conv_t *c, const char *s) {
    return oom(c, kg_gir_bytes(c->g, s, strlen(s)));
}

// ---- the pieces (kg_json_rules.c) ----

/** The rule for pattern `re` (kg_regex syntax; json_string: inside a JSON
 * string). */
int32_t kg_json_rules_regex(conv_t *c, const char *re, bool json_string);
/** References to the shared rules, each made on first use: whitespace
 * between tokens, one character of a string body, any string, any number,
 * any JSON value (object and array rules come with it). */
int32_t kg_json_rules_ws(conv_t *c);
int32_t kg_json_rules_char(conv_t *c);
int32_t kg_json_rules_string(conv_t *c);
int32_t kg_json_rules_number(conv_t *c);
int32_t kg_json_rules_value(conv_t *c);
/** Exactly the JSON text of value v (const, enum). */
int32_t kg_json_rules_literal(conv_t *c, json_t *v);
/** Integers lo..hi with INT64_MIN / INT64_MAX meaning unbounded; fails
 * (naming the schema location) when the range is empty. */
int32_t kg_json_rules_int_range(conv_t *c, int64_t lo, int64_t hi);

// ---- strings (kg_json_string.c) ----

/** A string schema s: `pattern`, `format` and the length bounds min..max
 * (max -1: none) together, as the quoted JSON string. */
int32_t kg_json_string(conv_t *c, json_t *s, int64_t min, int64_t max);
