/* kg_loras: the LoRA adapters a program serves (--lora NAME=PATH[:SCALE]),
 * loaded for the model and added to the backend when the stack is built,
 * and how a job's choice of them (its model, or its lora list) becomes an
 * engine request's adapter set.
 *
 * A job picks adapters one of two ways: `model` naming an adapter (vLLM's
 * convention: the adapter at its --lora scale), or `lora: [{"name",
 * "scale"}]` (llama.cpp's server convention, several at once, the scale
 * given or the --lora one). A name neither served nor an adapter is
 * model_not_found (kg_intake). */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../model/kg_lora.h"
#include "../model/kg_model.h"

#include <stddef.h>
#include <stdint.h>

#define KG_LORAS_MAX 256 /* adapters one program serves at most */

/* What jobs an adapter ran, for metrics: written on the thread that runs
 * jobs, read by a metrics scrape. */
typedef struct kg_lora_stats {
    _Atomic int64_t n_jobs;   /* jobs accepted that use the adapter */
    _Atomic int64_t n_tokens; /* tokens those jobs generated */
} kg_lora_stats_t;

typedef struct kg_lora_entry {
    char *name;  /* owned */
    char *path;  /* owned */
    float scale; /* the default scale (1 unless :SCALE) */
    kg_lora_t *lora;
    int32_t id;             /* the backend's id */
    kg_lora_stats_t *stats; /* owned */
} kg_lora_entry_t;

typedef struct kg_loras {
    kg_lora_entry_t *e; /* (n) */
    int32_t n;
} kg_loras_t;

/** Parse `spec`, a comma list of NAME=PATH[:SCALE] (NULL or "": none),
 * into `l` (names distinct, non-empty; SCALE a float, the last ':'
 * followed by one). KG_ERR_INVALID with errstr. Clear with kg_loras_clear
 * whatever the result. @thread any */
KG_NODISCARD kg_status_t kg_loras_parse(kg_loras_t *l,
                                        const char *spec,
                                        char *errstr,
                                        size_t errstr_size);

/** Load every adapter for `model` and add it to `be` (before the engine
 * runs). The first failure's message names the adapter. */
KG_NODISCARD kg_status_t kg_loras_load(
    kg_loras_t *l, const kg_model_t *model, kg_backend_t *be, char *errstr, size_t errstr_size);

/** The adapter named `name`, or NULL. @thread any */
const kg_lora_entry_t *kg_loras_find(const kg_loras_t *l, const char *name);

/** Count `jobs` jobs and `tokens` generated tokens for every adapter of
 * `set` (l may be NULL). @thread any (atomics) */
void kg_loras_count(const kg_loras_t *l, const kg_lora_set_t *set, int64_t jobs, int64_t tokens);

/** Free the adapters (removing them from `be`, which may be NULL when it
 * is already gone) and the names. */
void kg_loras_clear(kg_loras_t *l, kg_backend_t *be);
