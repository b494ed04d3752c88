/* kg_engine: continuous batching over a paged KV cache.
 *
 * DESIGN
 * The engine is owned by one thread and knows nothing of Kafka. Callers
 * submit requests (token ids + sampling parameters + limits) and call
 * kg_engine_step() in a loop; each step
 *   1. admits waiting requests into free slots (at most max_batch_size
 *      running) while the KV pool has blocks for their prompt plus headroom,
 *      reusing cached prefix blocks (full prompt blocks hashed with the
 *      prefix before them, shared read-only with reference counts);
 *   2. builds one batch: one decode token for every running sequence, then
 *      prefill chunks of admitted sequences up to max_batch_tokens;
 *   3. when a sequence needs a block and none is free, preempts the most
 *      recently admitted sequence (frees its blocks, keeps its tokens,
 *      requeues it at the front to be recomputed later);
 *   4. runs one kg_backend_forward for the whole batch, samples every
 *      sequence that produced logits with its own RNG, and reports each new
 *      token and each finish as a completion;
 *   5. frees the slot and blocks of every finished sequence the same step.
 * Nothing in the step allocates: slots, block tables, batch arrays, logits
 * and sampler scratch are sized at kg_engine_new. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../model/kg_sampler.h"

typedef struct kg_engine kg_engine_t;

#define KG_MAX_EOG 16

typedef struct kg_engine_params {
    int32_t max_batch_size;   /* running sequences at most */
    int32_t max_queue_depth;  /* waiting requests at most; submit beyond -> KG_QUEUE_FULL */
    int32_t max_batch_tokens; /* tokens per step (decode + prefill chunks) */
    int32_t max_seq_len;      /* prompt + generated tokens per sequence (context) */
    int32_t kv_block_size;    /* tokens per KV block */
    int32_t n_kv_blocks;      /* blocks in the pool */
    bool prefix_cache;
    int32_t n_eog;
    int32_t eog[KG_MAX_EOG]; /* end-of-generation token ids */
    int32_t n_vocab;
} kg_engine_params_t;

typedef enum kg_finish {
    KG_FINISH_NONE = 0,  /* still running: the completion carries a token */
    KG_FINISH_STOP,      /* an end-of-generation token (not reported as text) */
    KG_FINISH_LENGTH,    /* max_tokens or the context limit */
    KG_FINISH_DEADLINE,  /* deadline passed while running or waiting */
    KG_FINISH_CANCELLED, /* kg_engine_cancel */
} kg_finish_t;

const char *kg_finish_str(kg_finish_t f);

typedef struct kg_request {
    uint64_t id;           /* caller's handle, unique among live requests */
    const int32_t *prompt; /* copied at submit */
    int32_t n_prompt;
    int32_t max_tokens;   /* > 0 */
    int32_t priority;     /* higher runs first; FIFO within a priority */
    int64_t deadline_us;  /* kg_clock_us() deadline, 0 = none */
    bool ignore_eos;
    kg_sampling_params_t sampling;
} kg_request_t;

typedef struct kg_completion {
    uint64_t id;
    int32_t index;  /* index of this token in the output, or the output length when finishing */
    int32_t token;  /* -1 when the completion only reports a finish */
    kg_finish_t finish;
    int32_t n_prompt;
    int32_t n_cached;  /* prompt tokens served by the prefix cache (at first admission) */
    kg_sample_result_t sample; /* token and logprobs when token >= 0 */
} kg_completion_t;

typedef struct kg_engine_stats {
    int32_t n_waiting;
    int32_t n_running;
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;   /* referenced by a running sequence */
    int32_t kv_blocks_cached; /* unreferenced but holding a cached prefix */
    int64_t n_steps;
    int64_t n_prefill_tokens;  /* tokens computed as prefill (including recomputation) */
    int64_t n_decode_tokens;
    int64_t n_prefix_hit_tokens; /* prompt tokens served from the cache */
    int64_t n_prompt_tokens;     /* prompt tokens of admitted requests */
    int64_t n_preemptions;
    int32_t last_batch_tokens;
} kg_engine_stats_t;

/** Create an engine over `be` (borrowed; must outlive the engine). */
kg_engine_t *kg_engine_new(kg_backend_t *be, const kg_engine_params_t *params, char *errstr,
                           size_t errstr_size);
void kg_engine_free(kg_engine_t *e);

/** Queue a request. KG_QUEUE_FULL when max_queue_depth are waiting,
 * KG_ERR_INVALID when the prompt is empty or leaves no room in max_seq_len.
 * @thread engine */
KG_NODISCARD kg_status_t kg_engine_submit(kg_engine_t *e, const kg_request_t *req);

/** Cancel a waiting or running request; its finish (CANCELLED) is reported
 * by the next step. Returns false when the id is unknown. @thread engine */
bool kg_engine_cancel(kg_engine_t *e, uint64_t id);

/** Run one step. Writes up to `cap` completions (cap must be at least
 * 2 * (max_batch_size + max_queue_depth)) and returns how many, or a negative
 * kg_status_t on a backend error. Returns 0 when idle. @thread engine */
int32_t kg_engine_step(kg_engine_t *e, kg_completion_t *out, int32_t cap);

/** Whether any request is waiting or running. */
bool kg_engine_busy(const kg_engine_t *e);

void kg_engine_stats(const kg_engine_t *e, kg_engine_stats_t *out);

/** Default parameters for a model on a backend: batch sizes, a KV pool of
 * `kv_memory_size` bytes (0: enough for max_batch_size full contexts). */
kg_engine_params_t kg_engine_params_default(const kg_model_t *model, size_t kv_memory_size);
