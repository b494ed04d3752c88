/* cli_util: small helpers shared by the programs' option parsing. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/** Parse a whole decimal integer in [min, max]; false on junk or range. */
bool kg_cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/** Parse a whole float in [min, max]. */
bool kg_cli_parse_f32(const char *s, float min, float max, float *out);

/** "kgen 0.1.0 (backends: cpu,cuda)" on stdout, for every program's --version. */
void kg_cmd_print_version(const char *prog);
