/* kg_parse: strict values from text (a flag's value, a file's field): the whole string is the
 * number, in range, finite, or the parse fails; a list of header names is all names or an
 * error. One rule for every program and layer (kgen mkmodel's flags in src/model, the
 * programs' flags in src/cli, --propagate-headers in src/config and src/kafka). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** A decimal integer in [min, max]; false (out untouched) otherwise. @thread any */
bool kg_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/** A finite float in [min, max]; false (out untouched) otherwise. @thread any */
bool kg_parse_f32(const char *s, float min, float max, float *out);

#define KG_HEADER_NAMES_MAX 13  /* names in one list */
#define KG_HEADER_NAME_MAX  128 /* bytes of one name */

/* Header names, in the order given, each once. */
typedef struct kg_header_names {
    int n;
    char name[KG_HEADER_NAMES_MAX][KG_HEADER_NAME_MAX + 1];
} kg_header_names_t;

/** A comma-separated list of Kafka header names ("" for none; spaces around a name ignored; a
 * name given twice kept once): each an RFC 9110 token of 1 to KG_HEADER_NAME_MAX bytes and not
 * kgen-* (the worker's own headers), at most KG_HEADER_NAMES_MAX of them. False with errstr
 * (no flag name in it) otherwise. @thread any */
bool kg_parse_header_names(const char *list,
                           kg_header_names_t *out,
                           char *errstr,
                           size_t errstr_size);
