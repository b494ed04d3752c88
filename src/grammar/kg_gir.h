/* kg_gir: the grammar IR every constraint is translated into.
 *
 * A grammar is a set of named rules, each one expression over Unicode code
 * points: literals, code-point classes, sequences, alternations, bounded or
 * unbounded repetitions and references to rules. GBNF text (kg_gbnf),
 * regular expressions (kg_regex), choice lists and JSON Schema
 * (src/schema/kg_json_schema.c) are all built with this API, and
 * kg_grammar_compile turns the result into automata over bytes.
 *
 * Expressions are int32 handles into the IR; they may be shared (a DAG):
 * the compiler expands each use. Builder calls never fail loudly: on out
 * of memory they return -1, any later call given -1 returns -1, and
 * kg_gir_ok() reports the failure once at the end. @thread any (one IR is
 * used by one thread at a time). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_gir kg_gir_t;

typedef enum kg_gx_kind {
    KG_GX_EMPTY = 0, /* matches "" */
    KG_GX_CHARS,     /* one code point out of a set of ranges (may be empty: matches nothing) */
    KG_GX_BYTES,     /* a literal byte string (UTF-8 text) */
    KG_GX_SEQ,       /* children in order */
    KG_GX_ALT,       /* one of the children */
    KG_GX_REPEAT,    /* child {min, max}; max -1 = unbounded */
    KG_GX_REF,       /* a rule */
    KG_GX_AND,       /* text both children match (intersection; regular children only) */
} kg_gx_kind_t;

/* The largest code point, and the repetition bound meaning "unbounded". */
#define KG_GIR_MAX_CP    0x10FFFFu
#define KG_GIR_UNBOUNDED (-1)

typedef struct kg_gx {
    kg_gx_kind_t kind;
    int32_t a; /* CHARS: first range; BYTES: first byte; SEQ/ALT: first child; REPEAT: child;
                  REF: rule; AND: first child */
    int32_t b; /* CHARS: ranges; BYTES: length; SEQ/ALT: children; REPEAT: min; AND: second
                  child */
    int32_t c; /* REPEAT: max */
} kg_gx_t;

kg_gir_t *kg_gir_new(void);
void kg_gir_free(kg_gir_t *g);
/** False once any builder call ran out of memory. */
bool kg_gir_ok(const kg_gir_t *g);

// ---- rules ----

/** The rule called `name` (len bytes), declared on first use. -1 on OOM. */
int32_t kg_gir_rule(kg_gir_t *g, const char *name, size_t len);
/** A fresh rule with a unique name made from `hint` (for generated rules). */
int32_t kg_gir_rule_new(kg_gir_t *g, const char *hint);
/** Define a rule; false when it was already defined. */
bool kg_gir_define(kg_gir_t *g, int32_t rule, int32_t expr);
void kg_gir_set_root(kg_gir_t *g, int32_t rule);

int32_t kg_gir_n_rules(const kg_gir_t *g);
int32_t kg_gir_root(const kg_gir_t *g); /* -1 when unset */
const char *kg_gir_rule_name(const kg_gir_t *g, int32_t rule);
int32_t kg_gir_rule_expr(const kg_gir_t *g, int32_t rule); /* -1 when undefined */

// ---- expressions ----

int32_t kg_gir_empty(kg_gir_t *g);
/** A literal (any bytes; meant to be UTF-8). */
int32_t kg_gir_bytes(kg_gir_t *g, const char *s, size_t len);
/** One code point from `n` inclusive ranges (lo[i]..hi[i]); negate takes the
 * complement within 0..KG_GIR_MAX_CP. Surrogates never match. */
int32_t kg_gir_chars(kg_gir_t *g, const uint32_t *lo, const uint32_t *hi, int32_t n, bool negate);
int32_t kg_gir_char_range(kg_gir_t *g, uint32_t lo, uint32_t hi);
int32_t kg_gir_seq(kg_gir_t *g, const int32_t *items, int32_t n);
int32_t kg_gir_seq2(kg_gir_t *g, int32_t a, int32_t b);
int32_t kg_gir_seq3(kg_gir_t *g, int32_t a, int32_t b, int32_t c);
int32_t kg_gir_alt(kg_gir_t *g, const int32_t *items, int32_t n);
int32_t kg_gir_alt2(kg_gir_t *g, int32_t a, int32_t b);
/** expr{min,max}; max KG_GIR_UNBOUNDED for no bound. -1 when min > max. */
int32_t kg_gir_repeat(kg_gir_t *g, int32_t expr, int32_t min, int32_t max);
int32_t kg_gir_opt(kg_gir_t *g, int32_t expr);
int32_t kg_gir_ref(kg_gir_t *g, int32_t rule);
/** The texts both a and b match: how a JSON Schema string's pattern, format
 * and length bounds combine. The compiler builds the product of the two
 * automata, so neither side may use a recursive rule (it refuses that);
 * the product's size is about the product of the sides' sizes. */
int32_t kg_gir_and(kg_gir_t *g, int32_t a, int32_t b);

/** Code points of the shortest and the longest text `expr` matches (*max
 * -1: unbounded), read from its structure: a literal counts its UTF-8 code
 * points, a class one (the range holds every match's length; it is wider
 * than the truth where a part can match nothing). Meant for expressions
 * built without JSON escapes (kg_regex with json_string false). False when
 * expr uses a rule. */
bool kg_gir_text_length(const kg_gir_t *g, int32_t expr, int64_t *min, int64_t *max);
/** Read an expression node (children through kg_gir_kid, ranges through
 * kg_gir_range, bytes through kg_gir_byte_data). */
const kg_gx_t *kg_gir_node(const kg_gir_t *g, int32_t expr);
int32_t kg_gir_kid(const kg_gir_t *g, const kg_gx_t *x, int32_t i);
void kg_gir_range(const kg_gir_t *g, const kg_gx_t *x, int32_t i, uint32_t *lo, uint32_t *hi);
const char *kg_gir_byte_data(const kg_gir_t *g, const kg_gx_t *x);

/** Write the grammar as GBNF text (for messages, tests and debugging);
 * malloc'ed, the caller frees. NULL on OOM. */
char *kg_gir_to_gbnf(const kg_gir_t *g);
