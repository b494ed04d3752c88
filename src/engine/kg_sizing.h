/* kg_sizing: from what a program's options ask (batch size, context, KV
 * memory, ...) to the engine's and the backend's parameters. One function
 * for kgen-worker, `kgen batch`, `kgen generate` and kgen-bench, so the
 * same flags size the same engine in every program. */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../model/kg_model.h"
#include "kg_engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The options, as the programs' flags spell them. 0 means the default. */
typedef struct kg_engine_options {
    int64_t max_batch_size;   /* --max-batch-size: running sequences (default 16) */
    int64_t max_queue_depth;  /* requests waiting inside the engine (default max_batch_size) */
    int64_t max_batch_tokens; /* --max-batch-tokens: tokens per step (default 512) */
    int64_t ctx;              /* --ctx: prompt + output per sequence (default the model's,
                                 at most 4096) */
    int64_t kv_block_size;    /* --kv-block-size: tokens per KV block (default 16) */
    int64_t kv_memory_mib;    /* --kv-memory: KV pool in MiB (default: max_batch_size full
                                 contexts at once) */
    kg_kv_type_t kv_type;     /* --kv-type: the pool's element type (default f16) */
    bool prefix_cache;        /* --prefix-cache (kg_engine_options_default: true) */
    int64_t threads;          /* --threads: CPU threads (default all cores) */
} kg_engine_options_t;

/** Every field 0 but prefix_cache (true). */
kg_engine_options_t kg_engine_options_default(void);

/** Size the engine and the backend for `model`. The KV pool is
 * kv_memory_mib of blocks, or enough blocks for max_batch_size sequences
 * at full context together with the engine's admission headroom. A pool
 * smaller than one full context shortens the context to what it holds (so
 * intake refuses, as prompt_too_long, the prompts the pool could never
 * take) and *ctx_clamped (may be NULL) says so. KG_ERR_INVALID with a
 * message for options that cannot work together (a pool of fewer than 2
 * tokens, fewer tokens per step than running sequences). @thread any */
KG_NODISCARD kg_status_t kg_engine_size(const kg_model_t *model,
                                        const kg_engine_options_t *o,
                                        kg_engine_params_t *ep,
                                        kg_backend_params_t *bp,
                                        bool *ctx_clamped,
                                        char *errstr,
                                        size_t errstr_size);
