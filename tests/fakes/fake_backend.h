/* fake_backend: a recording backend for engine tests.
 *
 * It implements the backend vtable without a model. The "KV cache" is one
 * token id per (block, row): forward writes each batch token's id where the
 * block table says, then builds every logits row from the token ids it
 * reads back through the block table for positions 0..pos of that slot (the
 * last `window` of them for a sliding-window model).
 * Logits are a pure function of that history (kg_fake_backend_logits), so
 * a wrong block table entry, a prefix block shared by mistake or a token
 * written into the wrong row changes the output, and tests can compare a
 * job's tokens across batch compositions or against the function itself.
 *
 * It also checks the batch contract (bounds, increasing positions per
 * slot, n_outputs, that a written block belongs to the writing slot only,
 * that only written rows are read) and counts violations; it records the
 * size of every step and can be told to fail steps. Nothing allocates in
 * forward. */
#pragma once

#include "backend/kg_backend.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kg_fake_backend_params {
    int32_t n_vocab;
    int32_t n_kv_blocks;
    int32_t kv_block_size;
    int32_t max_batch_tokens;
    int32_t n_slots;
    uint64_t salt;      /* changes the logits function */
    int32_t eog_token;  /* with eog_at_len > 0: this token wins once the history... */
    int32_t eog_at_len; /* ...has at least this many tokens; 0: off */
    int32_t window;     /* > 0: a row reads only the last `window` positions (a sliding-window
                           model: blocks before that may be gone), and its logits are a
                           function of those tokens (and the history's length) only */
    bool device_sample; /* keep logits "on the device" and sample them (kg_backend_sample) */
    bool no_kv_copy;    /* offer no kv_copy (the engine then recomputes forked blocks) */
} kg_fake_backend_params_t;

#define KG_FAKE_MAX_STEPS 8192

typedef struct kg_fake_backend_stats {
    int64_t n_steps;          /* forward calls that succeeded */
    int64_t n_failed;         /* forward calls failed on request */
    int64_t n_tokens;         /* tokens over all steps */
    int64_t n_outputs;        /* logits rows over all steps */
    int32_t max_step_tokens;  /* largest batch */
    int32_t max_step_outputs; /* most logits rows in one step */
    int64_t n_violations;     /* broken batch contract; 0 in a correct engine */
    int64_t n_kv_copies;      /* blocks copied by kv_copy */
    char first_violation[256];
    int32_t step_tokens[KG_FAKE_MAX_STEPS]; /* per step, for the first KG_FAKE_MAX_STEPS */
    int32_t step_outputs[KG_FAKE_MAX_STEPS];
} kg_fake_backend_stats_t;

/** Create a fake backend. NULL on a bad parameter. */
kg_backend_t *kg_fake_backend_new(const kg_fake_backend_params_t *params);

/** The next `n` forward calls fail with KG_ERR_BACKEND (writing nothing). */
void kg_fake_backend_fail_next(kg_backend_t *be, int32_t n);

/** The next forward call that runs slot `seq` (KG_FAULT_SEQ), or the next
 * one at all (STEP, DEVICE), fails as a backend would: KG_ERR_INVALID with
 * that fault for SEQ and STEP, KG_ERR_BACKEND for DEVICE, writing nothing. */
void kg_fake_backend_fault_next(kg_backend_t *be, kg_fault_scope_t scope, int32_t seq);

/** With device_sample: the next kg_backend_sample call draws every row (as
 * a device sampler does, advancing each row's RNG) and then fails with
 * KG_ERR_INVALID and a KG_FAULT_SEQ fault naming output row `row`. */
void kg_fake_backend_fail_sample_row(kg_backend_t *be, int32_t row);

/** Counters since creation. Borrowed; lives as long as `be`. */
const kg_fake_backend_stats_t *kg_fake_backend_stats(const kg_backend_t *be);

/** The logits the fake produces after `history` (n >= 1 tokens, the last
 * one being the token fed at position n - 1). */
void kg_fake_backend_logits(const kg_fake_backend_params_t *params,
                            const int32_t *history,
                            int32_t n,
                            float *logits);

/** Greedy continuation as the fake defines it: argmax of the logits. */
int32_t
kg_fake_backend_argmax(const kg_fake_backend_params_t *params, const int32_t *history, int32_t n);
