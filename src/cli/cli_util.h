/* cli_util: small helpers shared by the programs' option parsing. */
#pragma once

#include "engine/kg_sizing.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

/** Parse a whole decimal integer in [min, max]; false on junk or range. */
bool kg_cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/** Parse a whole float in [min, max]. */
bool kg_cli_parse_f32(const char *s, float min, float max, float *out);

/** "kgen 0.1.0 (backends: cpu,cuda)" on stdout, for every program's --version. */
void kg_cmd_print_version(const char *prog);

/* ---- the engine options every program that runs the engine shares ----
 * Spelled and bounded as kgen-worker's options table (src/config) spells
 * them, so a flag means the same in kgen-worker, `kgen batch`, `kgen
 * generate` and kgen-bench. Put KG_CLI_ENGINE_LONGOPTS in the program's
 * getopt_long table and hand every option id to kg_cli_engine_option. */
enum {
    KG_CLI_O_MAX_BATCH_SIZE = 1000,
    KG_CLI_O_MAX_BATCH_TOKENS,
    KG_CLI_O_THREADS,
    KG_CLI_O_BACKEND,
    KG_CLI_O_CTX,
    KG_CLI_O_KV_MEMORY,
    KG_CLI_O_KV_BLOCK_SIZE,
    KG_CLI_O_KV_TYPE,
    KG_CLI_O_PREFIX_CACHE,
    KG_CLI_O_NO_PREFIX_CACHE,
};
#define KG_CLI_ENGINE_LONGOPTS                                                                     \
    {"max-batch-size", required_argument, 0, KG_CLI_O_MAX_BATCH_SIZE},                             \
        {"max-batch-tokens", required_argument, 0, KG_CLI_O_MAX_BATCH_TOKENS},                     \
        {"threads", required_argument, 0, KG_CLI_O_THREADS},                                       \
        {"backend", required_argument, 0, KG_CLI_O_BACKEND},                                       \
        {"ctx", required_argument, 0, KG_CLI_O_CTX},                                               \
        {"kv-memory", required_argument, 0, KG_CLI_O_KV_MEMORY},                                   \
        {"kv-block-size", required_argument, 0, KG_CLI_O_KV_BLOCK_SIZE},                           \
        {"kv-type", required_argument, 0, KG_CLI_O_KV_TYPE},                                       \
        {"prefix-cache", optional_argument, 0, KG_CLI_O_PREFIX_CACHE}, {                           \
        "no-prefix-cache", no_argument, 0, KG_CLI_O_NO_PREFIX_CACHE                                \
    }

/* The --help lines of those options. */
extern const char kg_cli_engine_help[];

/** Take one getopt_long result. Returns 1 when `id` was an engine option
 * and its value is good (stored in *o or *backend), 0 when `id` is not an
 * engine option, -1 when the value is bad (a message naming `prog` and the
 * flag is printed on stderr). argc/argv let "--prefix-cache false" take its
 * value from the next argument, as kgen-worker does. */
int kg_cli_engine_option(int id,
                         const char *arg,
                         int argc,
                         char **argv,
                         const char *prog,
                         kg_engine_options_t *o,
                         const char **backend);

/** Parse a boolean flag value (1/true/yes/on, 0/false/no/off). */
bool kg_cli_parse_bool(const char *s, bool *out);
