/* kg_config: every setting of kgen-worker, from one options table.
 *
 * Precedence: defaults < --config FILE (key=value lines) < KGEN_* environment
 * variables < command-line flags. librdkafka properties pass through
 * unchanged (`-X key=value`, `--kafka key=value`, `KGEN_RDKAFKA_<KEY>` with
 * `_` read as `.`), as kcat does, so SASL and TLS need no code of ours. The
 * table drives parsing, --help and docs/CONFIGURATION.md's option table; the
 * config is immutable once parsed (@thread any after startup). */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KG_CONFIG_MAX_KAFKA_PROPS 64

typedef struct kg_config {
    /* kafka */
    char *brokers;
    char *jobs_topic;
    char *results_topic;
    char *dlq_topic; /* "" = "<jobs_topic>.dlq" */
    char *group_id;
    char *group_instance_id; /* "" = dynamic membership */
    /* "auto", "consumer" (KIP-848) or "classic" */
    char *group_protocol;
    char *assignment_strategy;
    char *worker_id; /* "" = hostname-pid */
    int64_t max_message_bytes;
    int64_t max_event_bytes; /* 0 = from the producer's and the results topic's limits */
    char *inflight_topic;    /* "" = "<jobs_topic>.inflight" (the poison-job journal) */
    int64_t poison_after;    /* consecutive worker failures a job may be in; 0 = off */
    char *cancel_topic;      /* "" = "<first jobs topic>.cancel"; "none" = no cancellation */
    int64_t cancel_remember; /* cancels remembered for jobs not here (yet); 0 = none */
    double cancel_ttl_s;     /* how long a cancel is remembered */
    bool exactly_once;       /* terminal events, DLQ copies and offsets in transactions */
    int64_t txn_interval_ms; /* a transaction is committed this often (--exactly-once) */
    char *propagate_headers; /* comma list of job headers copied onto its events (kg_trace) */
    /* model and engine */
    char *model;
    char *served_model_name; /* comma list; "" = the model's general.name and file stem */
    char *lora;              /* comma list of NAME=PATH[:SCALE] LoRA adapters; "" = none */
    char *lora_dir;          /* --lora-dir: adapters by file name, read on first use; "" = none */
    int64_t max_loras;       /* --max-loras: adapters resident at once; 0 = no cap */
    char *backend;
    int64_t threads;
    int64_t max_batch_size;
    int64_t max_queue_depth;
    int64_t max_batch_tokens;
    int64_t kv_memory_mib;
    int64_t kv_block_size;
    char *kv_type;
    int64_t ctx;
    int64_t max_prompt_tokens;
    int64_t max_tokens_limit;
    int64_t default_max_tokens;
    bool prefix_cache;
    /* operations */
    int64_t http_port;
    char *http_address;
    char *log_level;
    char *log_format;
    double drain_timeout_s;
    /* a revoked partition's running jobs may finish this long */
    double handoff_timeout_s;
    double auth_timeout_s; /* 0 = retry a failing login for ever */
    int64_t demo;          /* -1 = off */
    bool print_config;
    bool dry_run;              /* print the model's memory plan and exit */
    int64_t device_memory_mib; /* with dry_run: the GPU memory to check it against (0: none) */
    /* librdkafka passthrough, in the order given */
    int n_kafka_props;
    char *kafka_keys[KG_CONFIG_MAX_KAFKA_PROPS];
    char *kafka_values[KG_CONFIG_MAX_KAFKA_PROPS];
} kg_config_t;

/** Fill `cfg` with the defaults (strings are owned; free with kg_config_clear). */
void kg_config_init(kg_config_t *cfg);
void kg_config_clear(kg_config_t *cfg);

/** Parse the environment (`envp`, NULL = environ) and argv. Returns KG_OK,
 * KG_AGAIN when --help or --version was handled (exit 0), or
 * KG_ERR_INVALID with one line in errstr (exit 2). */
KG_NODISCARD kg_status_t kg_config_parse(
    kg_config_t *cfg, int argc, char **argv, char **envp, char *errstr, size_t errstr_size);

/** Set one option by its table name ("max-batch-size") from a string. */
KG_NODISCARD kg_status_t kg_config_set(
    kg_config_t *cfg, const char *name, const char *value, char *errstr, size_t errstr_size);

/** Add or replace a librdkafka property. */
KG_NODISCARD kg_status_t kg_config_set_kafka(
    kg_config_t *cfg, const char *key, const char *value, char *errstr, size_t errstr_size);

/** Whether a librdkafka property holds a secret (passwords, keys, tokens). */
bool kg_config_is_secret(const char *key);

/** --help text, generated from the table. */
void kg_config_print_help(FILE *f, const char *prog);
/** The configuration table as Markdown (docs/CONFIGURATION.md, scripts/gen-config-doc). */
void kg_config_print_markdown(FILE *f);
/** Every setting as `key=value` lines, secrets replaced by "[redacted]". */
void kg_config_print(const kg_config_t *cfg, FILE *f);
