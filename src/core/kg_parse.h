/* kg_parse: strict numbers from text (a flag's value, a file's field): the whole string is the
 * number, in range, finite, or the parse fails. One rule for every program and layer (kgen
 * mkmodel's flags in src/model, the programs' flags in src/cli). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/** A decimal integer in [min, max]; false (out untouched) otherwise. @thread any */
bool kg_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/** A finite float in [min, max]; false (out untouched) otherwise. @thread any */
bool kg_parse_f32(const char *s, float min, float max, float *out);
