/* kg_constraint: what a constrained job asks for, as plain data, and the
 * grammar IR of the kinds the engine library can build itself (regex,
 * choice, GBNF). JSON Schema and "any JSON object" are built by
 * src/schema/kg_json_schema.c (it walks JSON) and passed in as a builder.
 * @thread any */
#pragma once

#include "kg_gir.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kg_constraint_kind {
    KG_CONSTRAINT_NONE = 0,
    KG_CONSTRAINT_JSON_OBJECT = 1, /* response_format json_object: any JSON object */
    KG_CONSTRAINT_JSON_SCHEMA = 2, /* text: the schema, compact JSON */
    KG_CONSTRAINT_REGEX = 3,       /* text: the pattern (full match) */
    KG_CONSTRAINT_CHOICE = 4,      /* text: kg_constraint_choice_encode's form */
    KG_CONSTRAINT_GRAMMAR = 5,     /* text: GBNF */
    KG_CONSTRAINT_TOOL_CALLS = 6,  /* text: the call syntax and the tools (src/schema/
                                      kg_toolcall_grammar.c); never a job's own constraint */
} kg_constraint_kind_t;

typedef struct kg_constraint {
    kg_constraint_kind_t kind;
    const char *text; /* borrowed; len bytes, not NUL-terminated */
    size_t len;
} kg_constraint_t;

/** "json_object", "json_schema", "regex", "choice", "grammar" ("none"). */
const char *kg_constraint_kind_str(kg_constraint_kind_t kind);

/** A full-match regex as a grammar. NULL with a message on error. */
kg_gir_t *kg_constraint_regex(const char *re, size_t len, char *errstr, size_t errstr_size);
/** Exactly one of n strings (n >= 1). */
kg_gir_t *kg_constraint_choice(
    const char *const *items, const size_t *lens, int32_t n, char *errstr, size_t errstr_size);
/** GBNF text. */
kg_gir_t *kg_constraint_gbnf(const char *text, size_t len, char *errstr, size_t errstr_size);

/** A choice list as one byte string (each item: 4-byte little-endian
 * length, then its bytes), the form KG_CONSTRAINT_CHOICE carries. Malloc'ed;
 * *len gets its length. NULL on OOM. */
char *
kg_constraint_choice_encode(const char *const *items, const size_t *lens, int32_t n, size_t *len);

/** Builds the kinds this library cannot (JSON); returns NULL with a message. */
typedef kg_gir_t *(*kg_gir_builder_fn)(const kg_constraint_t *c,
                                       char *errstr,
                                       size_t errstr_size,
                                       void *ctx);

/** The IR of any kind: regex, choice and grammar here, the rest through
 * `json` (NULL: JSON kinds are refused). */
kg_gir_t *kg_constraint_build(const kg_constraint_t *c,
                              kg_gir_builder_fn json,
                              void *json_ctx,
                              char *errstr,
                              size_t errstr_size);
