/* kg_json_schema: JSON Schema -> grammar IR (src/grammar/kg_gir.h).
 *
 * Supported: type (all, and lists of types), properties, required,
 * additionalProperties, items, prefixItems, enum, const, anyOf, oneOf
 * (as anyOf: keep branches disjoint), allOf of object schemas, $ref to
 * "#..." JSON pointers ($defs, definitions, recursion included),
 * minItems/maxItems, minLength/maxLength, pattern, format (date, time,
 * date-time, uuid, email; pattern, format and length bounds combine as
 * the intersection of their languages), minimum/maximum/exclusiveMinimum/
 * exclusiveMaximum on integers (on numbers: integers in the range), and
 * the annotations (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly). Any other keyword is refused
 * with its name and JSON pointer, never ignored.
 *
 * The grammar produces a subset of the valid documents: properties in the
 * order required first, then optional, each in schema order; no
 * properties beyond `properties` unless additionalProperties says so (as
 * OpenAI's strict mode and XGrammar do; an object schema that declares no
 * properties takes any); whitespace between tokens is at
 * most one space, or a newline and up to 20 spaces or tabs; numbers have
 * at most 16 integer digits, 16 fraction digits and a 3-digit exponent;
 * string escapes never produce lone surrogates.
 *
 * This is the only grammar code that walks JSON, so it lives with the
 * codec (jansson stays in src/schema). @thread any */
#pragma once

#include "../grammar/kg_constraint.h"
#include "../grammar/kg_gir.h"

#include <stddef.h>

/* The largest minLength/maxLength that can be combined with a pattern or
 * format (when the pattern or format does not imply it already): the
 * grammar holds about one copy of the pattern's automaton per length, and
 * the compiler precomputes token masks for each of its states. */
#define KG_JSON_MAX_LENGTH_WITH_PATTERN 1000

/** The grammar of documents valid against `schema` (len bytes of JSON).
 * NULL with a message naming the keyword and its JSON pointer. */
kg_gir_t *kg_json_schema_gir(const char *schema, size_t len, char *errstr, size_t errstr_size);

/** Any JSON object (response_format json_object). */
kg_gir_t *kg_json_object_gir(char *errstr, size_t errstr_size);

/** Builds the root of a grammar from the expressions of several documents
 * (kg_json_schemas_gir): -1 on failure (with its own message in errstr). */
typedef int32_t (*kg_json_schema_wrap_fn)(
    kg_gir_t *g, const int32_t *docs, int32_t n, void *ctx, char *errstr, size_t errstr_size);

/** One grammar for the `n` JSON Schemas of the JSON array `schemas` (len
 * bytes), each document an expression of the same IR (its $refs resolved in
 * its own schema), joined by `wrap` into the root: how tool calls put each
 * tool's arguments inside their call syntax. NULL with a message naming the
 * schema (`what`[i].function.parameters: "tools[1].function.parameters") and the keyword. */
kg_gir_t *kg_json_schemas_gir(const char *schemas,
                              size_t len,
                              const char *what,
                              kg_json_schema_wrap_fn wrap,
                              void *ctx,
                              char *errstr,
                              size_t errstr_size);

/** The kg_gir_builder_fn for the grammar cache: KG_CONSTRAINT_JSON_SCHEMA
 * and KG_CONSTRAINT_JSON_OBJECT. */
kg_gir_t *
kg_json_schema_builder(const kg_constraint_t *c, char *errstr, size_t errstr_size, void *ctx);
