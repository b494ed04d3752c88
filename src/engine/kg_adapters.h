/* kg_adapters: the LoRA adapters an engine may run, and which of them its
 * backend holds now (--lora, --lora-dir, --max-loras).
 *
 * An adapter is added once (kg_adapters_add: its checked kg_lora_t, from
 * --lora at start or from --lora-dir on first use) and keeps its id for
 * the program's life: jobs name it by that id (kg_lora_set_t), the backend
 * holds it under that id while it is resident, and the prefix cache keys
 * its blocks by it, so an adapter evicted and loaded again finds its cached
 * prefixes, and a row with several adapters adds their deltas in the same
 * order (the backend's id order) before and after.
 *
 * Residency is the engine thread's business: at admission the engine loads
 * a waiting sequence's adapters that are not resident, and with
 * max_resident of them resident it first evicts the least recently used
 * one that no running sequence uses (see kg_engine_step's admit). This
 * module keeps the table and counts; the policy is the engine's. vLLM's
 * LRU cache of --max-loras adapters works the same way (adapters are
 * loaded on the step path, the least recently used idle one goes).
 *
 * Threads: kg_adapters_add on one thread at a time (the one that takes
 * jobs), the engine thread for the rest, and the stats from any thread. */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../model/kg_lora.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_ADAPTERS_MAX 256 /* adapters one program may add */

/* Per adapter, for metrics: written by the engine thread, read by any. */
typedef struct kg_adapter_stats {
    _Atomic int32_t resident; /* 1 while the backend holds it */
    _Atomic int64_t n_loads;  /* times it was loaded into the backend */
    _Atomic int64_t n_evictions;
    _Atomic int64_t load_us; /* the last load's duration */
} kg_adapter_stats_t;

typedef struct kg_adapters kg_adapters_t;

/** A table over `be` (borrowed; must outlive it) holding at most
 * max_resident adapters in the backend at once (0: no cap). */
kg_adapters_t *kg_adapters_new(kg_backend_t *be, int32_t max_resident);

/** Remove every resident adapter from the backend and free the table
 * (the kg_lora_t are the caller's). NULL does nothing. */
void kg_adapters_free(kg_adapters_t *a);

/** Add `lora` (borrowed; must outlive the table) under `name` (copied, for
 * logs): its id, or -1 when the table is full or out of memory. Not loaded.
 * @thread one at a time, while the engine runs */
int32_t kg_adapters_add(kg_adapters_t *a, const kg_lora_t *lora, const char *name);

/** The cap (0: none). @thread any */
int32_t kg_adapters_max_resident(const kg_adapters_t *a);
/** Adapters the backend holds now. @thread any */
int32_t kg_adapters_n_resident(const kg_adapters_t *a);
/** Adapter `id`'s counters. @thread any */
const kg_adapter_stats_t *kg_adapters_stats(const kg_adapters_t *a, int32_t id);

/** Whether `id` is an added adapter. @thread any (after the add) */
bool kg_adapters_has(const kg_adapters_t *a, int32_t id);
/** Whether the backend holds `id`. @thread engine */
bool kg_adapters_is_resident(const kg_adapters_t *a, int32_t id);
/** Load `id` into the backend (it is not resident; the cap is the
 * caller's to keep). KG_OK, or the backend's error with errstr.
 * @thread engine (or before it runs) */
KG_NODISCARD kg_status_t kg_adapters_load(kg_adapters_t *a,
                                          int32_t id,
                                          char *errstr,
                                          size_t errstr_size);
/** Remove resident `id` from the backend (no running sequence may use it).
 * @thread engine */
void kg_adapters_evict(kg_adapters_t *a, int32_t id);
/** Mark `id` used at `tick` (the engine's step count): eviction takes the
 * resident adapter with the oldest tick. @thread engine */
void kg_adapters_touch(kg_adapters_t *a, int32_t id, int64_t tick);
/** The tick of `id`'s last use. @thread engine */
int64_t kg_adapters_last_used(const kg_adapters_t *a, int32_t id);
/** The name `id` was added under. @thread any (after the add) */
const char *kg_adapters_name(const kg_adapters_t *a, int32_t id);
