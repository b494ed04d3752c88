/* cli_util: strict number parsing for command-line flags. */
#include "cli_util.h"

#include "backend/kg_backend.h"
#include "core/kg_parse.h"
#include "engine/kg_backend_registry.h"
#include "kafka/kg_kafka_conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

bool kg_cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    return kg_parse_i64(s, min, max, out);
}

bool kg_cli_parse_f32(const char *s, float min, float max, float *out) {
    return kg_parse_f32(s, min, max, out);
}

void kg_cmd_print_version(const char *prog) {
    printf("%s %s (backends: %s; librdkafka %s)\n", prog, KGEN_VERSION, kg_backend_list(),
           kg_kafka_version());
}

const char kg_cli_engine_help[] =
    "  --max-batch-size N     running sequences at most (default 16)\n"
    "  --max-batch-tokens T   tokens per step: decode tokens + prefill chunks (default 512)\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --backend auto|cpu|cuda (default auto)\n"
    "  --ctx N                context per sequence (default: the model's, at most 4096)\n"
    "  --kv-memory MIB        KV pool size (default: max-batch-size full contexts)\n"
    "  --kv-block-size N      tokens per KV block (default 16)\n"
    "  --kv-type f16|q8_0     K/V element type (default f16; q8_0: cuda backend, 1.88x the\n"
    "                         tokens in the same --kv-memory)\n"
    "  --prefix-cache[=BOOL]  share KV blocks of common prompt prefixes (default true);\n"
    "                         --no-prefix-cache is --prefix-cache=false\n";

bool kg_cli_parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
            *out = strcasecmp(s, yes[i]) == 0;
            return true;
        }
    }
    return false;
}

int kg_cli_engine_option(int id,
                         const char *arg,
                         int argc,
                         char **argv,
                         const char *prog,
                         kg_engine_options_t *o,
                         const char **backend) {
    /* the same bounds as kgen-worker's options table */
    struct {
        int id;
        const char *flag;
        int64_t *field;
        int64_t min, max;
    } ints[] = {
        {KG_CLI_O_MAX_BATCH_SIZE, "--max-batch-size", &o->max_batch_size, 1, 4096},
        {KG_CLI_O_MAX_BATCH_TOKENS, "--max-batch-tokens", &o->max_batch_tokens, 1, 1 << 20},
        {KG_CLI_O_THREADS, "--threads", &o->threads, 0, 1024},
        {KG_CLI_O_CTX, "--ctx", &o->ctx, 0, 1 << 24},
        {KG_CLI_O_KV_MEMORY, "--kv-memory", &o->kv_memory_mib, 0, 1 << 30},
        {KG_CLI_O_KV_BLOCK_SIZE, "--kv-block-size", &o->kv_block_size, 1, 1024},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (ints[i].id == id) {
            if (!kg_cli_parse_i64(arg, ints[i].min, ints[i].max, ints[i].field)) {
                fprintf(stderr, "%s: %s: expected an integer in [%lld, %lld], got '%s'\n", prog,
                        ints[i].flag, (long long)ints[i].min, (long long)ints[i].max, arg);
                return -1;
            }
            return 1;
        }
    }
    switch (id) {
    case KG_CLI_O_BACKEND:
        *backend = arg;
        return 1;
    case KG_CLI_O_KV_TYPE:
        if (kg_kv_type_parse(arg, &o->kv_type) != KG_OK) {
            fprintf(stderr, "%s: --kv-type: expected f16 or q8_0, got '%s'\n", prog, arg);
            return -1;
        }
        return 1;
    case KG_CLI_O_PREFIX_CACHE:
        if (arg && !kg_cli_parse_bool(arg, &o->prefix_cache)) {
            fprintf(stderr, "%s: --prefix-cache: expected true or false, got '%s'\n", prog, arg);
            return -1;
        }
        if (!arg) {
            /* "--prefix-cache false" as kgen-worker takes it; a bare flag is true */
            o->prefix_cache = true;
            if (optind < argc && kg_cli_parse_bool(argv[optind], &o->prefix_cache)) {
                optind++;
            }
        }
        return 1;
    case KG_CLI_O_NO_PREFIX_CACHE:
        o->prefix_cache = false;
        return 1;
    default:
        return 0;
    }
}
