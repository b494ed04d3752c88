/* kg_config: the options table and its parsers (nginx ngx_command_t,
 * librdkafka rd_kafka_properties[]). */
#include "kg_config.h"

#include "../core/kg_parse.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

typedef enum opt_type { OPT_STR, OPT_INT, OPT_FLOAT, OPT_BOOL } opt_type_t;

typedef struct opt {
    const char *name; /* flag without "--"; env KGEN_<NAME with - as _> */
    opt_type_t type;
    size_t offset;
    const char *def;
    double min, max;
    const char *section;
    const char *help;
} opt_t;

#define OFF(f) offsetof(kg_config_t, f)

static const opt_t options[] = {
    {"brokers", OPT_STR, OFF(brokers), "127.0.0.1:9092", 0, 0, "Kafka",
     "bootstrap servers (librdkafka bootstrap.servers)"},
    {"jobs-topic", OPT_STR, OFF(jobs_topic), "kgen.jobs", 0, 0, "Kafka",
     "topic the jobs are read from"},
    {"results-topic", OPT_STR, OFF(results_topic), "kgen.results", 0, 0, "Kafka",
     "topic the token, done and error events go to (key = request_id)"},
    {"dlq-topic", OPT_STR, OFF(dlq_topic), "", 0, 0, "Kafka",
     "dead-letter topic for unparseable jobs (default: <jobs-topic>.dlq)"},
    {"group-id", OPT_STR, OFF(group_id), "kgen-workers", 0, 0, "Kafka",
     "consumer group of the workers"},
    {"group-instance-id", OPT_STR, OFF(group_instance_id), "", 0, 0, "Kafka",
     "static membership id (a restart within session.timeout.ms keeps the assignment)"},
    {"group-protocol", OPT_STR, OFF(group_protocol), "auto", 0, 0, "Kafka",
     "consumer group protocol: consumer (KIP-848: the broker assigns, incrementally), classic "
     "(--assignment-strategy), or auto (consumer, falling back to classic at startup when the "
     "broker refuses it; classic with --group-instance-id, where a member restarted after a "
     "crash gets its partitions back at once, and when settings only classic takes are given: a "
     "non-default --assignment-strategy, -X session.timeout.ms or heartbeat.interval.ms); see "
     "docs/DELIVERY.md, Rebalances"},
    {"assignment-strategy", OPT_STR, OFF(assignment_strategy), "cooperative-sticky", 0, 0, "Kafka",
     "partition.assignment.strategy of the classic protocol: cooperative-sticky (only the "
     "partitions that move are revoked) or eager range, roundrobin (every partition is revoked "
     "at every rebalance); the consumer protocol assigns on the broker (-X group.remote.assignor)"},
    {"worker-id", OPT_STR, OFF(worker_id), "", 0, 0, "Kafka",
     "id written into every event (default: <hostname>-<pid>)"},
    {"max-message-bytes", OPT_INT, OFF(max_message_bytes), "1048576", 64, 1 << 30, "Kafka",
     "larger job messages go to the dead-letter topic"},
    {"max-event-bytes", OPT_INT, OFF(max_event_bytes), "0", 0, 1 << 30, "Kafka",
     "bytes one event may take; larger ones shed logprobs, then the metadata echo, then the end "
     "of the text (0 = the smaller of the producer's message.max.bytes and the results topic's "
     "max.message.bytes, read at startup, less 512 for the key and record framing; at least "
     "4096)"},
    {"inflight-topic", OPT_STR, OFF(inflight_topic), "", 0, 0, "Kafka",
     "compacted topic where workers record the jobs they run, for --poison-after (default: "
     "<jobs-topic>.inflight; as many partitions as the jobs topic)"},
    {"poison-after", OPT_INT, OFF(poison_after), "2", 0, 100, "Kafka",
     "the jobs running when a worker failed (crash, kill, device fault) are rerun in groups, "
     "halved while they fail; a job that was the only one running on a failed worker this "
     "many times minus one is answered with an internal error and a DLQ copy instead of being "
     "run again (1 = at its first failure, 0 = off)"},
    {"cancel-topic", OPT_STR, OFF(cancel_topic), "", 0, 0, "Kafka",
     "topic of cancel messages ({\"request_id\": ...}), read by every worker from the "
     "cancels of the last --cancel-ttl (default: <jobs-topic>.cancel, each lane's with "
     "several jobs topics; none = no cancellation). Costs one idle consumer; a missing topic "
     "only warns"},
    {"cancel-remember", OPT_INT, OFF(cancel_remember), "10000", 0, 10000000, "Kafka",
     "cancels remembered for jobs not here yet (not consumed, redelivered, moved here), about "
     "160 bytes each (0 = a cancel reaches only jobs here when it arrives)"},
    {"cancel-ttl", OPT_FLOAT, OFF(cancel_ttl_s), "600", 1, 604800, "Kafka",
     "seconds a cancel is remembered"},
    {"exactly-once", OPT_BOOL, OFF(exactly_once), "false", 0, 0, "Kafka",
     "write terminal events, DLQ copies and the consumed offsets in Kafka transactions, so a "
     "read_committed reader sees one terminal event per job (token events stay at least "
     "once); see docs/DELIVERY.md for the cost"},
    {"txn-interval-ms", OPT_INT, OFF(txn_interval_ms), "100", 1, 60000, "Kafka",
     "with --exactly-once: commit a transaction this often, or at 1000 terminal events; "
     "results become visible to read_committed readers then"},
    {"propagate-headers", OPT_STR, OFF(propagate_headers), "", 0, 0, "Kafka",
     "job headers copied onto every event and DLQ copy of the job, comma-separated, besides "
     "traceparent, tracestate and baggage, which always are (at most 13 names; a job's copied "
     "headers are capped at 16 KiB, or a quarter of --max-event-bytes when smaller; kgen-* "
     "names are refused)"},
    {"model", OPT_STR, OFF(model), "", 0, 0, "Model", "GGUF model file"},
    {"lora", OPT_STR, OFF(lora), "", 0, 0, "Model",
     "LoRA adapters for the model, NAME=PATH[:SCALE], comma-separated or repeated (GGUF as "
     "llama.cpp writes them; cpu backend); a job picks one by model (its NAME) or by lora"},
    {"lora-dir", OPT_STR, OFF(lora_dir), "", 0, 0, "Model",
     "a directory of LoRA adapters: a job naming NAME gets DIR/NAME.gguf, read and checked "
     "against the model on the first job that names it (a bad file answers that job)"},
    {"max-loras", OPT_INT, OFF(max_loras), "0", 0, 256, "Model",
     "LoRA adapters held in the backend at once (vLLM's name; 0: no cap): to load another, "
     "the least recently used one no running job uses is evicted (--lora ones too); with "
     "every one in use, a job for another waits"},
    {"served-model-name", OPT_STR, OFF(served_model_name), "", 0, 0, "Model",
     "names jobs may give as model, comma-separated or repeated (default: the GGUF's "
     "general.name and the file stem); other names get model_not_found"},
    {"backend", OPT_STR, OFF(backend), "auto", 0, 0, "Model", "auto, cpu or cuda"},
    {"threads", OPT_INT, OFF(threads), "0", 0, 1024, "Model", "CPU threads (0 = all cores)"},
    {"max-batch-size", OPT_INT, OFF(max_batch_size), "16", 1, 4096, "Engine",
     "running sequences (slots) at most"},
    {"max-queue-depth", OPT_INT, OFF(max_queue_depth), "0", 0, 1 << 20, "Engine",
     "jobs taken from Kafka and waiting for a slot at most; beyond, the consumer pauses (0 = "
     "1024 with one jobs topic, 64 with several, logged at start; each costs its message and "
     "prompt tokens, see docs/PERFORMANCE.md)"},
    {"max-batch-tokens", OPT_INT, OFF(max_batch_tokens), "512", 1, 1 << 20, "Engine",
     "tokens per step: one decode token per running sequence plus prefill chunks"},
    {"kv-memory", OPT_INT, OFF(kv_memory_mib), "0", 0, 1 << 30, "Engine",
     "KV cache pool in MiB (0 = enough for max-batch-size full contexts)"},
    {"kv-block-size", OPT_INT, OFF(kv_block_size), "16", 1, 1024, "Engine", "tokens per KV block"},
    {"kv-type", OPT_STR, OFF(kv_type), "f16", 0, 0, "Engine",
     "how K and V are stored: f16, or q8_0 (cuda backend: GGUF's Q8_0 blocks, 34 bytes per 32 "
     "values, so --kv-memory holds 1.88x the tokens; logits within the NMSE bound of "
     "gpu/README.md)"},
    {"ctx", OPT_INT, OFF(ctx), "0", 0, 1 << 24, "Engine",
     "context per sequence, prompt + output (0 = the model's, at most 4096)"},
    {"max-prompt-tokens", OPT_INT, OFF(max_prompt_tokens), "0", 0, 1 << 24, "Limits",
     "longer prompts get a prompt_too_long error (0 = the context minus one)"},
    {"max-tokens-limit", OPT_INT, OFF(max_tokens_limit), "4096", 1, 1 << 24, "Limits",
     "jobs asking for more max_tokens get a max_tokens_too_large error"},
    {"default-max-tokens", OPT_INT, OFF(default_max_tokens), "256", 1, 1 << 24, "Limits",
     "max_tokens of a job that does not say"},
    {"prefix-cache", OPT_BOOL, OFF(prefix_cache), "true", 0, 0, "Engine",
     "share KV blocks of common prompt prefixes between jobs"},
    {"http-port", OPT_INT, OFF(http_port), "9400", 0, 65535, "Operations",
     "port of /metrics, /healthz and /readyz (0 = off)"},
    {"http-address", OPT_STR, OFF(http_address), "0.0.0.0", 0, 0, "Operations",
     "address the HTTP port listens on (0.0.0.0 = every interface, as containers need; "
     "127.0.0.1 or one interface's address on a shared host; IPv6 too)"},
    {"log-level", OPT_STR, OFF(log_level), "info", 0, 0, "Operations",
     "debug, info, warn or error"},
    {"log-format", OPT_STR, OFF(log_format), "logfmt", 0, 0, "Operations", "logfmt or json"},
    {"drain-timeout", OPT_FLOAT, OFF(drain_timeout_s), "30", 0, 86400, "Operations",
     "seconds running jobs may take to finish after SIGTERM"},
    {"handoff-timeout", OPT_FLOAT, OFF(handoff_timeout_s), "30", 0, 86400, "Operations",
     "seconds the running jobs of a partition taken away in a rebalance may take to finish "
     "before it is released (intake from it stops at once; 0 = abandon them at once, the new "
     "owner runs them again)"},
    {"auth-timeout", OPT_FLOAT, OFF(auth_timeout_s), "60", 0, 86400, "Operations",
     "seconds a failing Kafka login (a wrong SASL password) may go on before the worker exits "
     "with an error (0 = retry for ever)"},
    {"demo", OPT_INT, OFF(demo), "-1", -1, 1000000, "Operations",
     "run on librdkafka's in-process mock cluster with N sample jobs (0 = until a signal)"},
    {"print-config", OPT_BOOL, OFF(print_config), "false", 0, 0, "Operations",
     "print the effective configuration (secrets redacted) and exit"},
    {"dry-run", OPT_BOOL, OFF(dry_run), "false", 0, 0, "Operations",
     "load the model, print what its weights and the KV pool these flags size take on the "
     "CUDA backend's GPU and on the CPU, and exit (no Kafka, no GPU needed)"},
    {"device-memory", OPT_INT, OFF(device_memory_mib), "0", 0, 1 << 30, "Operations",
     "with --dry-run: the GPU memory in MiB to check the plan against; exit 1 when the weights "
     "and the KV pool do not fit (0 = no check)"},
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static const opt_t *find_opt(const char *name) {
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (strcmp(options[i].name, name) == 0) {
            return &options[i];
        }
    }
    return NULL;
}

static bool parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

static kg_status_t
set_opt(kg_config_t *cfg, const opt_t *o, const char *value, char *errstr, size_t errstr_size) {
    char *field = (char *)cfg + o->offset;
    char *end;
    errno = 0;
    switch (o->type) {
    case OPT_STR: {
        char *dup = strdup(value);
        if (!dup) {
            snprintf(errstr, errstr_size, "out of memory");
            return KG_ERR_NOMEM;
        }
        free(*(char **)(void *)field);
        *(char **)(void *)field = dup;
        return KG_OK;
    }
    case OPT_INT: {
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end || (double)v < o->min || (double)v > o->max) {
            snprintf(errstr, errstr_size, "--%s: expected an integer in [%.0f, %.0f], got '%s'",
                     o->name, o->min, o->max, value);
            return KG_ERR_INVALID;
        }
        *(int64_t *)(void *)field = v;
        return KG_OK;
    }
    case OPT_FLOAT: {
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v) || v < o->min || v > o->max) {
            snprintf(errstr, errstr_size, "--%s: expected a number in [%g, %g], got '%s'", o->name,
                     o->min, o->max, value);
            return KG_ERR_INVALID;
        }
        *(double *)(void *)field = v;
        return KG_OK;
    }
    case OPT_BOOL:
        if (!parse_bool(value, (bool *)(void *)field)) {
            snprintf(errstr, errstr_size, "--%s: expected true or false, got '%s'", o->name, value);
            return KG_ERR_INVALID;
        }
        return KG_OK;
    }
    return KG_ERR_INVALID;
}

void kg_config_init(kg_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    char err[256];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        kg_status_t st = set_opt(cfg, &options[i], options[i].def, err, sizeof(err));
        (void)st; /* the defaults are valid by construction (tested) */
    }
}

void kg_config_clear(kg_config_t *cfg) {
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (options[i].type == OPT_STR) {
            char **p = (char **)(void *)((char *)cfg + options[i].offset);
            free(*p);
            *p = NULL;
        }
    }
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        free(cfg->kafka_keys[i]);
        free(cfg->kafka_values[i]);
    }
    cfg->n_kafka_props = 0;
}

kg_status_t kg_config_set(
    kg_config_t *cfg, const char *name, const char *value, char *errstr, size_t errstr_size) {
    const opt_t *o = find_opt(name);
    if (!o) {
        snprintf(errstr, errstr_size, "unknown option '--%s' (see --help)", name);
        return KG_ERR_INVALID;
    }
    return set_opt(cfg, o, value, errstr, errstr_size);
}

kg_status_t kg_config_set_kafka(
    kg_config_t *cfg, const char *key, const char *value, char *errstr, size_t errstr_size) {
    if (!*key) {
        snprintf(errstr, errstr_size, "empty librdkafka property name");
        return KG_ERR_INVALID;
    }
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        if (strcmp(cfg->kafka_keys[i], key) == 0) {
            char *v = strdup(value);
            if (!v) {
                return KG_ERR_NOMEM;
            }
            free(cfg->kafka_values[i]);
            cfg->kafka_values[i] = v;
            return KG_OK;
        }
    }
    if (cfg->n_kafka_props == KG_CONFIG_MAX_KAFKA_PROPS) {
        snprintf(errstr, errstr_size, "more than %d librdkafka properties",
                 KG_CONFIG_MAX_KAFKA_PROPS);
        return KG_ERR_INVALID;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return KG_ERR_NOMEM;
    }
    cfg->kafka_keys[cfg->n_kafka_props] = k;
    cfg->kafka_values[cfg->n_kafka_props++] = v;
    return KG_OK;
}

/* "key=value" -> librdkafka property */
static kg_status_t
set_kafka_kv(kg_config_t *cfg, const char *kv, char *errstr, size_t errstr_size) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        snprintf(errstr, errstr_size, "-X expects key=value, got '%s'", kv);
        return KG_ERR_INVALID;
    }
    char key[256];
    snprintf(key, sizeof(key), "%.*s", (int)(eq - kv), kv);
    return kg_config_set_kafka(cfg, key, eq + 1, errstr, errstr_size);
}

bool kg_config_is_secret(const char *key) {
    static const char *marks[] = {"password", "secret",     "sasl.oauthbearer.config",
                                  ".pem",     "token",      "ssl.key",
                                  "ssl_key",  "credentials"};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        if (strstr(key, marks[i])) {
            return true;
        }
    }
    return false;
}

/* key=value lines; '#' comments; "kafka.X=v" lines are librdkafka properties */
static kg_status_t load_file(kg_config_t *cfg, const char *path, char *errstr, size_t errstr_size) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(errstr, errstr_size, "--config %s: %s", path, strerror(errno));
        return KG_ERR_INVALID;
    }
    char line[4096];
    int lineno = 0;
    kg_status_t st = KG_OK;
    while (st == KG_OK && fgets(line, sizeof(line), f)) {
        lineno++;
        char *p = line;
        while (isspace((unsigned char)*p)) {
            p++;
        }
        size_t n = strlen(p);
        while (n > 0 && isspace((unsigned char)p[n - 1])) {
            p[--n] = '\0';
        }
        if (*p == '\0' || *p == '#') {
            continue;
        }
        char *eq = strchr(p, '=');
        if (!eq) {
            snprintf(errstr, errstr_size, "%s:%d: expected key=value", path, lineno);
            st = KG_ERR_INVALID;
            break;
        }
        /* trim around '=' */
        char *key_end = eq;
        while (key_end > p && isspace((unsigned char)key_end[-1])) {
            key_end--;
        }
        *key_end = '\0';
        char *value = eq + 1;
        while (isspace((unsigned char)*value)) {
            value++;
        }
        if (strncmp(p, "kafka.", 6) == 0) {
            st = kg_config_set_kafka(cfg, p + 6, value, errstr, errstr_size);
        } else {
            st = kg_config_set(cfg, p, value, errstr, errstr_size);
        }
    }
    fclose(f);
    return st;
}

static kg_status_t load_env(kg_config_t *cfg, char **envp, char *errstr, size_t errstr_size) {
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, "KGEN_", 5) != 0) {
            continue;
        }
        const char *eq = strchr(*e, '=');
        if (!eq) {
            continue;
        }
        char name[256];
        size_t n = (size_t)(eq - *e) - 5;
        if (n == 0 || n >= sizeof(name)) {
            continue;
        }
        kg_status_t st;
        if (strncmp(*e + 5, "RDKAFKA_", 8) == 0 && n > 8) {
            /* KGEN_RDKAFKA_SASL_PASSWORD -> sasl.password */
            for (size_t i = 0; i < n - 8; i++) {
                char c = (*e)[13 + i];
                name[i] = c == '_' ? '.' : (char)tolower((unsigned char)c);
            }
            name[n - 8] = '\0';
            st = kg_config_set_kafka(cfg, name, eq + 1, errstr, errstr_size);
        } else {
            for (size_t i = 0; i < n; i++) {
                char c = (*e)[5 + i];
                name[i] = c == '_' ? '-' : (char)tolower((unsigned char)c);
            }
            name[n] = '\0';
            if (!find_opt(name)) {
                continue; /* KGEN_* variables of the scripts (KGEN_KAFKA_CACHE, ...) */
            }
            st = kg_config_set(cfg, name, eq + 1, errstr, errstr_size);
        }
        if (st != KG_OK) {
            size_t len = strlen(errstr);
            snprintf(errstr + len, errstr_size - len, " (from the environment)");
            return st;
        }
    }
    return KG_OK;
}

kg_status_t kg_config_parse(
    kg_config_t *cfg, int argc, char **argv, char **envp, char *errstr, size_t errstr_size) {
    const char *prog = argc > 0 ? argv[0] : "kgen-worker";
    /* --config first, whatever its position, so flags override the file (the NOLINT: clang-tidy
     * supposes argv[i] may be NULL; below argc it never is) */
    for (int i = 1; i < argc; i++) {
        const char *file = NULL;
        if (strcmp(argv[i], "--config") == 0 && // NOLINT(clang-analyzer-core.NonNullParamChecker)
            i + 1 < argc) {
            file = argv[i + 1];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
        }
        if (file) {
            kg_status_t st = load_file(cfg, file, errstr, errstr_size);
            if (st != KG_OK) {
                return st;
            }
        }
    }
    kg_status_t st = load_env(cfg, envp ? envp : environ, errstr, errstr_size);
    if (st != KG_OK) {
        return st;
    }
    bool served_seen = false; /* --served-model-name given earlier on the command line */
    bool lora_seen = false;   /* --lora given earlier */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            kg_config_print_help(stdout, prog);
            return KG_AGAIN;
        }
        if (strcmp(a, "--help-markdown") == 0) {
            kg_config_print_markdown(stdout);
            return KG_AGAIN;
        }
        if (strcmp(a, "-X") == 0 || strcmp(a, "--kafka") == 0) {
            if (i + 1 >= argc) {
                snprintf(errstr, errstr_size, "%s needs key=value", a);
                return KG_ERR_INVALID;
            }
            st = set_kafka_kv(cfg, argv[++i], errstr, errstr_size);
        } else if (strncmp(a, "-X", 2) == 0) {
            st = set_kafka_kv(cfg, a + 2, errstr, errstr_size);
        } else if (strcmp(a, "--config") == 0) {
            i++; /* already loaded */
            continue;
        } else if (strncmp(a, "--config=", 9) == 0) {
            continue;
        } else if (strncmp(a, "--", 2) == 0) {
            char name[128];
            const char *eq = strchr(a + 2, '=');
            size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            snprintf(name, sizeof(name), "%.*s", (int)n, a + 2);
            const opt_t *o = find_opt(name);
            bool negated = false;
            if (!o && strncmp(name, "no-", 3) == 0 && !eq) {
                /* --no-NAME for a boolean, as the other programs spell it */
                o = find_opt(name + 3);
                negated = o && o->type == OPT_BOOL;
                o = negated ? o : NULL;
            }
            if (!o) {
                snprintf(errstr, errstr_size, "unknown option '%s' (see --help)", a);
                return KG_ERR_INVALID;
            }
            const char *value;
            if (negated) {
                value = "false";
            } else if (eq) {
                value = eq + 1;
            } else if (o->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "-", 1) == 0 ||
                                               !parse_bool(argv[i + 1], &(bool){false}))) {
                value = "true"; /* a bare boolean flag */
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                snprintf(errstr, errstr_size, "option '%s' needs a value", a);
                return KG_ERR_INVALID;
            }
            if ((o->offset == OFF(served_model_name) && served_seen) ||
                (o->offset == OFF(lora) && lora_seen)) {
                /* repeated on the command line: the names add up */
                char **field = (char **)((char *)cfg + o->offset);
                char *joined = malloc(strlen(*field) + strlen(value) + 2);
                if (!joined) {
                    snprintf(errstr, errstr_size, "out of memory");
                    return KG_ERR_NOMEM;
                }
                sprintf(joined, "%s,%s", *field, value);
                free(*field);
                *field = joined;
                st = KG_OK;
            } else {
                st = set_opt(cfg, o, value, errstr, errstr_size);
            }
            served_seen |= o->offset == OFF(served_model_name);
            lora_seen |= o->offset == OFF(lora);
        } else {
            snprintf(errstr, errstr_size, "unexpected argument '%s' (see --help)", a);
            return KG_ERR_INVALID;
        }
        if (st != KG_OK) {
            return st;
        }
    }
    /* cross-field checks */
    if (!*cfg->jobs_topic || !*cfg->results_topic) {
        snprintf(errstr, errstr_size, "--jobs-topic and --results-topic must not be empty");
        return KG_ERR_INVALID;
    }
    if (strcmp(cfg->backend, "auto") != 0 && strcmp(cfg->backend, "cpu") != 0 &&
        strcmp(cfg->backend, "cuda") != 0) {
        snprintf(errstr, errstr_size, "--backend: expected auto, cpu or cuda, got '%s'",
                 cfg->backend);
        return KG_ERR_INVALID;
    }
    /* kg_kv_type_parse's names (the backend layer's; config sits below it) */
    if (strcmp(cfg->kv_type, "f16") != 0 && strcmp(cfg->kv_type, "q8_0") != 0) {
        snprintf(errstr, errstr_size, "--kv-type: expected f16 or q8_0, got '%s'", cfg->kv_type);
        return KG_ERR_INVALID;
    }
    if (strcmp(cfg->kv_type, "f16") != 0 && strcmp(cfg->backend, "cpu") == 0) {
        snprintf(errstr, errstr_size,
                 "--kv-type %s needs the cuda backend (the cpu backend keeps K/V in f16)",
                 cfg->kv_type);
        return KG_ERR_INVALID;
    }
    if (strcmp(cfg->group_protocol, "auto") != 0 && strcmp(cfg->group_protocol, "consumer") != 0 &&
        strcmp(cfg->group_protocol, "classic") != 0) {
        snprintf(errstr, errstr_size,
                 "--group-protocol: expected auto, consumer or classic, got '%s'",
                 cfg->group_protocol);
        return KG_ERR_INVALID;
    }
    if (strcmp(cfg->log_format, "logfmt") != 0 && strcmp(cfg->log_format, "json") != 0) {
        snprintf(errstr, errstr_size, "--log-format: expected logfmt or json, got '%s'",
                 cfg->log_format);
        return KG_ERR_INVALID;
    }
    static const char *levels[] = {"debug", "info", "warn", "warning", "error", "off"};
    bool level_ok = false;
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
        level_ok |= strcmp(cfg->log_level, levels[i]) == 0;
    }
    if (!level_ok) {
        snprintf(errstr, errstr_size, "--log-level: expected debug, info, warn or error, got '%s'",
                 cfg->log_level);
        return KG_ERR_INVALID;
    }
    if (cfg->default_max_tokens > cfg->max_tokens_limit) {
        snprintf(errstr, errstr_size, "--default-max-tokens %lld exceeds --max-tokens-limit %lld",
                 (long long)cfg->default_max_tokens, (long long)cfg->max_tokens_limit);
        return KG_ERR_INVALID;
    }
    if (cfg->max_event_bytes != 0 && cfg->max_event_bytes < 4096) {
        snprintf(errstr, errstr_size,
                 "--max-event-bytes: expected 0 or at least 4096, got %lld (a done event with "
                 "everything shed still needs about a KiB)",
                 (long long)cfg->max_event_bytes);
        return KG_ERR_INVALID;
    }
    kg_header_names_t names;
    char why[256];
    if (!kg_parse_header_names(cfg->propagate_headers, &names, why, sizeof(why))) {
        snprintf(errstr, errstr_size, "--propagate-headers: %s", why);
        return KG_ERR_INVALID;
    }
    unsigned char addr[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, cfg->http_address, addr) != 1 &&
        inet_pton(AF_INET6, cfg->http_address, addr) != 1) {
        snprintf(errstr, errstr_size,
                 "--http-address: expected an IPv4 or IPv6 address (0.0.0.0: every interface), "
                 "got '%s'",
                 cfg->http_address);
        return KG_ERR_INVALID;
    }
    /* --print-config shows what a worker would run with; it needs no model */
    if (!*cfg->model && cfg->demo < 0 && !cfg->print_config) {
        snprintf(errstr, errstr_size,
                 "--model is required (or --demo N, which makes its own model)");
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

static const char *type_name(opt_type_t t) {
    switch (t) {
    case OPT_STR:
        return "string";
    case OPT_INT:
        return "int";
    case OPT_FLOAT:
        return "number";
    case OPT_BOOL:
        return "bool";
    }
    return "?";
}

static void env_name(const char *name, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "KGEN_");
    for (const char *p = name; *p && n + 1 < cap; p++) {
        out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    }
    out[n] = '\0';
}

void kg_config_print_help(FILE *f, const char *prog) {
    fprintf(f, "usage: %s [options] [-X librdkafka.property=value ...]\n", prog);
    const char *section = "";
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_t *o = &options[i];
        if (strcmp(section, o->section) != 0) {
            section = o->section;
            fprintf(f, "\n%s:\n", section);
        }
        char flag[64], env[64];
        snprintf(flag, sizeof(flag), "--%s %s", o->name, o->type == OPT_BOOL ? "[BOOL]" : "VALUE");
        env_name(o->name, env, sizeof(env));
        fprintf(f, "  %-32s %s\n  %-32s (default: %s; env %s)\n", flag, o->help, "",
                *o->def ? o->def : "\"\"", env);
    }
    fprintf(f,
            "\nOther:\n"
            "  -X key=value, --kafka key=value  librdkafka property, passed through unchanged\n"
            "                                   (env KGEN_RDKAFKA_<KEY>, '_' read as '.')\n"
            "  --config FILE                    key=value lines (kafka.<key>=... for librdkafka)\n"
            "  --help, --help-markdown, --version\n");
}

void kg_config_print_markdown(FILE *f) {
    fprintf(f, "| flag | environment | type | default | meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_t *o = &options[i];
        char env[64];
        env_name(o->name, env, sizeof(env));
        fprintf(f, "| `--%s` | `%s` | %s | `%s` | %s |\n", o->name, env, type_name(o->type),
                *o->def ? o->def : "\"\"", o->help);
    }
    fprintf(
        f,
        "| `-X key=value` | `KGEN_RDKAFKA_<KEY>` | string | | librdkafka property, unchanged |\n");
}

void kg_config_print(const kg_config_t *cfg, FILE *f) {
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_t *o = &options[i];
        const char *field = (const char *)cfg + o->offset;
        switch (o->type) {
        case OPT_STR:
            fprintf(f, "%s=%s\n", o->name, *(char *const *)(const void *)field);
            break;
        case OPT_INT:
            fprintf(f, "%s=%lld\n", o->name, (long long)*(const int64_t *)(const void *)field);
            break;
        case OPT_FLOAT:
            fprintf(f, "%s=%g\n", o->name, *(const double *)(const void *)field);
            break;
        case OPT_BOOL:
            fprintf(f, "%s=%s\n", o->name, *(const bool *)(const void *)field ? "true" : "false");
            break;
        }
    }
    for (int i = 0; i < cfg->n_kafka_props; i++) {
        fprintf(f, "kafka.%s=%s\n", cfg->kafka_keys[i],
                kg_config_is_secret(cfg->kafka_keys[i]) ? "[redacted]" : cfg->kafka_values[i]);
    }
}
