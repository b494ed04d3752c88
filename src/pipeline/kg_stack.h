/* kg_stack: the engine stack a program runs jobs on, wired in one place.
 *
 * kgen-worker, `kgen batch` and kgen-bench all need the same pieces, built
 * from the same flags in the same order: the engine's and the backend's
 * sizes (kg_engine_size), the grammar cache constrained jobs compile into,
 * the backend (which uploads the model's weights), the engine, and, for a
 * program whose Kafka thread must never wait on a step, the runner that
 * steps the engine on its own thread. kg_stack_new builds them in that
 * order and kg_stack_free frees them in reverse, so a program names what it
 * wants (kg_stack_options_t) rather than knowing how the layers fit
 * together, and the Kafka layer needs no backend or engine calls of its own.
 * The model itself is the caller's: loaded before, freed after. */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../engine/kg_engine.h"
#include "../engine/kg_sizing.h"
#include "../grammar/kg_grammar_cache.h"
#include "../model/kg_model.h"
#include "../schema/kg_chat.h"
#include "kg_loras.h"
#include "kg_runner.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_stack kg_stack_t;

/* What to build. */
typedef struct kg_stack_options {
    const char *backend;        /* --backend: "auto", "cpu" or "cuda" */
    kg_engine_options_t engine; /* the programs' engine flags (kg_sizing) */
    bool no_jump_forward;       /* kg_engine_params_t.no_jump_forward (kgen-bench) */
    size_t grammar_bytes;       /* the grammar cache's budget; 0: no cache */
    const char *lora;           /* --lora: NAME=PATH[:SCALE],... adapters (kg_loras); NULL: none */
    const char *lora_dir;       /* --lora-dir: adapters by file name, read on first use; NULL */
    int32_t max_loras;          /* --max-loras: adapters resident at once; 0: no cap */
    int32_t runner_inflight;    /* > 0: a runner (the engine thread) with queues for this many
                                   requests; 0: none, the caller steps the engine itself */
} kg_stack_options_t;

/** Every option 0 (no cache, no runner) but the engine's defaults
 * (kg_engine_options_default) and backend "auto". */
kg_stack_options_t kg_stack_options_default(void);

/** Size, then build the grammar cache, the backend (over `model`, borrowed:
 * it must outlive the stack), the engine and the runner. NULL with errstr
 * set (kg_engine_size's message for options that cannot work together).
 * @thread any (the runner's thread starts here) */
kg_stack_t *kg_stack_new(const kg_model_t *model,
                         const kg_stack_options_t *o,
                         char *errstr,
                         size_t errstr_size);

/** Stop the engine thread (free the runner) ahead of kg_stack_free, for a
 * caller that must release requests the thread may still be using first.
 * Does nothing without a runner or the second time. */
void kg_stack_stop(kg_stack_t *stack);

/** Free in reverse: runner (if still running), engine, backend, grammar
 * cache. NULL does nothing. */
void kg_stack_free(kg_stack_t *stack);

/* Getters: borrowed, live as long as the stack (the runner until
 * kg_stack_stop). */
kg_engine_t *kg_stack_engine(const kg_stack_t *stack);
kg_backend_t *kg_stack_backend(const kg_stack_t *stack);
/** The served LoRA adapters (none: n 0); kg_loras_resolve adds to them. */
kg_loras_t *kg_stack_loras(kg_stack_t *stack);
/** NULL when built without one (runner_inflight 0). */
kg_runner_t *kg_stack_runner(const kg_stack_t *stack);
/** NULL when built without one (grammar_bytes 0). */
kg_grammar_cache_t *kg_stack_grammars(const kg_stack_t *stack);
/** The model's chat template compiled by the Jinja engine; NULL when the
 * model has none or it did not compile (chat jobs then use kg_chat_render). */
const kg_chat_jinja_t *kg_stack_chat_template(const kg_stack_t *stack);
/** The engine's parameters as sized (max_seq_len, max_batch_size, ...). */
const kg_engine_params_t *kg_stack_params(const kg_stack_t *stack);
/** Whether the KV pool was too small for one full context, so max_seq_len
 * was cut to what it holds (the caller says so in its own words). */
bool kg_stack_ctx_clamped(const kg_stack_t *stack);
/** The backend's name ("cpu", "cuda"). */
const char *kg_stack_backend_name(const kg_stack_t *stack);
/** The backend's own counters (kg_backend_counters); any thread. */
void kg_stack_backend_counters(const kg_stack_t *stack, kg_backend_counters_t *out);
