/* kg_loras: the LoRA adapters a program serves (--lora NAME=PATH[:SCALE]
 * and --lora-dir DIR), checked against the model, kept resident in the
 * backend through kg_adapters (at most --max-loras at once), and how a
 * job's choice of them (its model, or its lora list) becomes an engine
 * request's adapter set.
 *
 * A job picks adapters one of two ways: `model` naming an adapter (vLLM's
 * convention: the adapter at its --lora scale), or `lora: [{"name",
 * "scale"}]` (llama.cpp's server convention, several at once, the scale
 * given or the --lora one). A name neither served nor an adapter is
 * model_not_found (kg_intake).
 *
 * --lora adapters are read and checked at start (a bad one stops the
 * program) and loaded into the backend while the cap allows. An adapter of
 * --lora-dir is DIR/NAME.gguf for a job naming NAME: read and checked on
 * the first job that names it (kg_loras_resolve, on the thread that takes
 * jobs; a bad file answers that job, and the next job naming it tries
 * again), then kept (mapped, not copied) for the program's life, while the
 * engine loads it into the backend and evicts it as jobs need (kg_adapters).
 * --lora adapters are evicted like the directory's (vLLM's preloaded
 * adapters are too). */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../engine/kg_adapters.h"
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
/* (loads, evictions and residency: kg_adapters_stats of the entry's id) */

typedef struct kg_lora_entry {
    char *name;             /* owned */
    char *path;             /* owned */
    float scale;            /* the default scale (1 unless :SCALE) */
    kg_lora_t *lora;        /* NULL until read (a --lora-dir one before its first job) */
    int32_t id;             /* its kg_adapters id (the backend's while resident); -1 before */
    kg_lora_stats_t *stats; /* owned */
} kg_lora_entry_t;

typedef struct kg_loras {
    kg_lora_entry_t *e; /* (KG_LORAS_MAX) allocated once: a scrape reads while one is added */
    _Atomic int32_t n;  /* entries in use (the directory's are added on first use) */
    char *dir;          /* --lora-dir; NULL: none */
    const kg_model_t *model;
    kg_adapters_t *adapters; /* owned; NULL before kg_loras_load */
} kg_loras_t;

/** Parse `spec`, a comma list of NAME=PATH[:SCALE] (NULL or "": none),
 * into `l` (names distinct, non-empty; SCALE a float, the last ':'
 * followed by one). KG_ERR_INVALID with errstr. Clear with kg_loras_clear
 * whatever the result. @thread any */
KG_NODISCARD kg_status_t kg_loras_parse(kg_loras_t *l,
                                        const char *spec,
                                        char *errstr,
                                        size_t errstr_size);

/** Serve every DIR/NAME.gguf as NAME too (kg_loras_resolve): DIR must be a
 * directory we can read. KG_ERR_INVALID with errstr. */
KG_NODISCARD kg_status_t kg_loras_set_dir(kg_loras_t *l,
                                          const char *dir,
                                          char *errstr,
                                          size_t errstr_size);

/** Read and check every --lora adapter for `model`, make the adapter table
 * over `be` with at most max_loras resident (0: no cap), and load the
 * --lora adapters into it while the cap allows (before the engine runs).
 * The first failure's message names the adapter. */
KG_NODISCARD kg_status_t kg_loras_load(kg_loras_t *l,
                                       const kg_model_t *model,
                                       kg_backend_t *be,
                                       int32_t max_loras,
                                       char *errstr,
                                       size_t errstr_size);

/** The adapter named `name` that has been read, or NULL. @thread any */
const kg_lora_entry_t *kg_loras_find(const kg_loras_t *l, const char *name);

/** The adapter named `name`: a --lora one, or DIR/NAME.gguf, read and
 * checked now if this is its first job. KG_OK with *out, NULL when there
 * is none (no such file, or a name that cannot be a file of DIR, or
 * KG_LORAS_MAX adapters already); KG_ERR_INVALID with errstr when the file is not an adapter for
 * this model (the loader's message, naming the tensor); KG_ERR_NOMEM.
 * @thread the one that takes jobs (one at a time) */
KG_NODISCARD kg_status_t kg_loras_resolve(
    kg_loras_t *l, const char *name, const kg_lora_entry_t **out, char *errstr, size_t errstr_size);

/** Count `jobs` jobs and `tokens` generated tokens for every adapter of
 * `set` (l may be NULL). @thread any (atomics) */
void kg_loras_count(const kg_loras_t *l, const kg_lora_set_t *set, int64_t jobs, int64_t tokens);

/** Free the adapters (removing the resident ones from the backend, which
 * must still be there; the engine must be gone) and the names. */
void kg_loras_clear(kg_loras_t *l);
