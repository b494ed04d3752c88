/* kg_backend: what the engine calls to run the model.
 *
 * A backend owns the weights in its own layout, the paged KV pool and its
 * scratch buffers; the engine owns the block tables and decides which token
 * goes where. One call of kg_backend_forward runs one step: every token of
 * the step batch (decode tokens and prefill chunks of many sequences)
 * through every layer, with one GEMM per weight matrix for all tokens.
 * Creating a backend by name (auto/cpu/cuda) is kg_backend_new, in
 * engine/kg_backend_registry.h. */
#pragma once

#include "../core/kg_status.h"
#include "../model/kg_lora.h"
#include "../model/kg_model.h"
#include "../model/kg_sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_backend kg_backend_t;

/* One step's tokens, llama_batch-like. Token i belongs to slot seq[i] at
 * position pos[i]; its K and V are written to the slot's block
 * block_table[seq[i] * max_blocks_per_seq + pos[i] / block_size] at row
 * pos[i] % block_size, then it attends to positions [0, pos[i]] of its slot
 * (so a prefill chunk is causal by construction), or to the last n_swa of
 * them in a windowed layer. Tokens of one slot appear in increasing position
 * order. Table entries of blocks wholly before every layer's window may be
 * -1 (the engine freed them); they are never read.
 *
 * A recurrent (hybrid) model's backend also keeps a state per slot
 * (kg_backend_has_state): a slot's token at position 0 starts it from
 * zero, and every other token must be the one after the slot's last
 * computed token (the state cannot go back or skip), so the engine runs a
 * slot's tokens in order with no gap and never skips a prefix it cannot
 * restore. A token that breaks this fails its sequence (KG_FAULT_SEQ). */
/* The LoRA adapters a sequence runs with (kg_backend_lora_add's ids and
 * the user's scales; n = 0: the base model alone). */
#define KG_LORA_SET_MAX 4
typedef struct kg_lora_set {
    int32_t n;
    int32_t id[KG_LORA_SET_MAX];
    float scale[KG_LORA_SET_MAX];
} kg_lora_set_t;

typedef struct kg_step_batch {
    int32_t n_tokens;
    const int32_t *token;    /* (n_tokens) */
    const int32_t *pos;      /* (n_tokens) */
    const int32_t *seq;      /* (n_tokens) slot index, < n_slots */
    const bool *want_logits; /* (n_tokens) */
    int32_t n_outputs;       /* count of want_logits */
    int32_t n_slots;
    int32_t max_blocks_per_seq;
    const int32_t *block_table;     /* (n_slots, max_blocks_per_seq) physical block ids */
    const kg_lora_set_t *slot_lora; /* (n_slots) each slot's adapters, or NULL: none at all */
    /* Embedding jobs: the final hidden states (after the output norm, before
     * the head) of the tokens with want_hidden[i], n_hidden rows of n_embd
     * floats in token order, written into `hidden`. want_hidden NULL (and
     * n_hidden 0): none. Only a backend with kg_backend_has_hidden fills
     * them; the others refuse a step that asks. */
    const bool *want_hidden; /* (n_tokens) or NULL */
    int32_t n_hidden;        /* count of want_hidden */
    float *hidden;           /* (n_hidden, n_embd) out */
    /* Embedding inputs' attention: for a token of one, its input's whole
     * length (> 0), and the CPU backend computes its attention with
     * ggml-cpu's flash attention arithmetic, as llama.cpp computes
     * embeddings (cpu_attn_flash.h: the kernel goes by that length, so an
     * input's arithmetic is its own); 0: a generation token, llama.cpp's
     * soft_max path. NULL: every token 0. Other backends ignore it. */
    const int32_t *flash_len; /* (n_tokens) or NULL */
} kg_step_batch_t;

/* How the KV pool stores K and V (--kv-type). */
typedef enum kg_kv_type {
    KG_KV_F16 = 0, /* fp16, llama.cpp's default (every backend) */
    KG_KV_Q8_0,    /* GGUF's Q8_0 blocks: 32 int8 values and an fp16 scale (34 bytes for 64),
                      each token's rows quantized alone (CUDA backend) */
} kg_kv_type_t;

/** "f16" or "q8_0". */
const char *kg_kv_type_name(kg_kv_type_t t);

/** KG_OK and *t for "f16" or "q8_0"; KG_ERR_INVALID otherwise. */
KG_NODISCARD kg_status_t kg_kv_type_parse(const char *s, kg_kv_type_t *t);

typedef struct kg_backend_params {
    int32_t n_threads;         /* CPU threads; <= 0 means all cores */
    int32_t n_kv_blocks;       /* blocks in the KV pool */
    int32_t kv_block_size;     /* tokens per block */
    kg_kv_type_t kv_type;      /* the pool's element type (a backend refuses one it lacks) */
    int32_t max_batch_tokens;  /* most tokens in one step */
    int32_t max_seq_len;       /* per-sequence context (picks LongRoPE's short or long factors,
                                  as llama.cpp's n_ctx_seq does); <= 0: the model's n_ctx_train */
    int32_t n_seq_slots;       /* sequence slots (the engine's max_batch_size): a recurrent
                                  model's states are allocated for them up front; <= 0: as
                                  steps first name them */
    int32_t n_state_snapshots; /* a recurrent model's saved states for the prefix cache
                                  (kg_backend_state_save); 0: none */
} kg_backend_params_t;

typedef struct kg_backend_memory {
    size_t weights_size;
    size_t kv_size;
    size_t scratch_size;
    size_t state_size;    /* recurrent states, every slot (0: not a recurrent model) */
    size_t snapshot_size; /* saved states for the prefix cache, all of them */
} kg_backend_memory_t;

/* How a mixture-of-experts model's tokens spread over its experts since
 * the backend started, summed over layers and steps (what
 * kgen_moe_tokens_per_expert and kgen-bench show). A group is one expert's
 * rows in one layer of one step: one gate/up and one down GEMM. */
typedef struct kg_moe_stats {
    int32_t n_expert;            /* 0: not a mixture-of-experts model (the rest is zero) */
    int32_t n_expert_used;       /* k: experts per token */
    int64_t n_layer_steps;       /* (layer, step) pairs routed */
    int64_t n_routed;            /* rows through expert GEMMs: tokens * k per layer */
    int64_t n_groups;            /* expert GEMM groups run */
    int64_t max_group;           /* rows of the largest group */
    const int64_t *n_per_expert; /* (n_expert) rows each expert took; borrowed from the
                                    backend, valid until its next forward */
} kg_moe_stats_t;

/** The CPU backend (the reference). Converts weights as documented in
 * cpu/kg_backend_cpu.c. `model` must outlive the backend. */
kg_backend_t *kg_backend_cpu_new(const kg_model_t *model,
                                 const kg_backend_params_t *params,
                                 char *errstr,
                                 size_t errstr_size);

void kg_backend_free(kg_backend_t *be);
const char *kg_backend_name(const kg_backend_t *be);

/** Run one step. Writes n_outputs rows of n_vocab logits (in token order of
 * the tokens that want them) into `logits`. A backend that samples on its
 * device (kg_backend_has_sample) also accepts logits == NULL: the rows then
 * stay on the device for kg_backend_sample. @thread engine */
KG_NODISCARD kg_status_t kg_backend_forward(kg_backend_t *be,
                                            const kg_step_batch_t *batch,
                                            float *logits);

/* One output row's sampling request for kg_backend_sample: the same inputs
 * kg_sampler_sample takes, minus the logits (they are on the device). */
typedef struct kg_sample_request {
    const kg_sampling_params_t *params;
    kg_rng_t *rng;         /* in/out: advanced exactly as kg_sampler_sample does */
    const int32_t *prompt; /* (n_prompt) for the penalties */
    int32_t n_prompt;
    const int32_t *output; /* (n_output) tokens generated so far */
    int32_t n_output;
    const uint32_t *mask; /* NULL, or the allowed tokens ((n_vocab + 31) / 32 words, host
                             memory): constrained decoding, as kg_sampler_sample_masked */
} kg_sample_request_t;

/** Whether the backend samples on its own device (kg_backend_sample), so
 * the engine can skip copying logits to the host. @thread any */
bool kg_backend_has_sample(const kg_backend_t *be);

/** Sample the output rows of the last kg_backend_forward on the device:
 * reqs[i] belongs to output row i (n <= that step's n_outputs). Same rules,
 * filters and RNG use as kg_sampler_sample (one kg_rng_uniform per row when
 * temperature > 0, none when greedy), so greedy picks are identical and a
 * seeded draw matches the CPU sampler on the same logits. The rows' logits
 * are consumed (penalties are applied in place). KG_ERR_UNSUPPORTED when
 * the backend has no device sampler. @thread engine */
KG_NODISCARD kg_status_t kg_backend_sample(kg_backend_t *be,
                                           const kg_sample_request_t *reqs,
                                           int32_t n,
                                           kg_sample_result_t *out);

/** Whether the backend writes hidden states (kg_step_batch_t.want_hidden),
 * which embedding jobs need. @thread any */
bool kg_backend_has_hidden(const kg_backend_t *be);

/** Whether the backend copies KV blocks (kg_backend_kv_copy). @thread any */
bool kg_backend_has_kv_copy(const kg_backend_t *be);

/** Copy whole KV blocks, every layer's K and V rows: block src[i] into
 * block dst[i], i < n (distinct destinations, none of them a source). The
 * engine starts the n choices of one prompt from copies of the block that
 * holds the prompt's last token. Ordered with the steps: a later forward
 * sees the copies. KG_ERR_UNSUPPORTED when the backend has no copy.
 * @thread engine */
KG_NODISCARD kg_status_t kg_backend_kv_copy(kg_backend_t *be,
                                            const int32_t *src,
                                            const int32_t *dst,
                                            int32_t n);

/** Whether the backend keeps recurrent state per slot (the model is a
 * hybrid: kg_model_is_recurrent), so that forks copy it with
 * kg_backend_state_copy and a prefix must be recomputed, not looked up.
 * @thread any */
bool kg_backend_has_state(const kg_backend_t *be);

/** Copy slot src[i]'s recurrent state (and the position it has reached)
 * into slot dst[i], i < n: the n choices of a prompt start from its
 * state. Ordered with the steps. KG_ERR_UNSUPPORTED without state.
 * @thread engine */
KG_NODISCARD kg_status_t kg_backend_state_copy(kg_backend_t *be,
                                               const int32_t *src,
                                               const int32_t *dst,
                                               int32_t n);

/** How many saved states the backend holds (kg_backend_params_t's
 * n_state_snapshots; 0: none, or not a recurrent model). @thread any */
int32_t kg_backend_state_snapshots(const kg_backend_t *be);

/** Save slot `slot`'s recurrent state (and its position) as snapshot
 * `snap` (< kg_backend_state_snapshots), or restore snapshot `snap` into
 * `slot`: the prefix cache keeps the state at a shared prefix's end, and a
 * sequence that finds it continues from there. Ordered with the steps.
 * KG_ERR_INVALID for an index out of range, KG_ERR_UNSUPPORTED without
 * snapshots. @thread engine */
KG_NODISCARD kg_status_t kg_backend_state_save(kg_backend_t *be, int32_t slot, int32_t snap);
KG_NODISCARD kg_status_t kg_backend_state_restore(kg_backend_t *be, int32_t snap, int32_t slot);

/** Bytes of recurrent state one sequence slot takes (0 for a model with
 * attention layers only). */
size_t kg_backend_state_bytes_per_seq(const kg_model_t *model);

void kg_backend_memory(const kg_backend_t *be, kg_backend_memory_t *out);

/* What a failed kg_backend_forward or kg_backend_sample hit, so that the
 * engine fails only what the fault touches: one request whose input the
 * backend cannot run (a token id or position outside what it was built
 * for, a block outside its pool, a sampling failure on its row), the
 * step's requests when the step as a whole was refused but the backend
 * still works, or everything when the device is gone. */
typedef enum kg_fault_scope {
    KG_FAULT_NONE = 0,
    KG_FAULT_SEQ,    /* one sequence: `seq` (forward) or output row `row` (sample) */
    KG_FAULT_STEP,   /* the step's requests; the backend is still usable */
    KG_FAULT_DEVICE, /* the backend is unusable: stop */
} kg_fault_scope_t;

typedef struct kg_backend_fault {
    kg_fault_scope_t scope;
    int32_t seq; /* KG_FAULT_SEQ from forward: the slot, else -1 */
    int32_t row; /* KG_FAULT_SEQ from sample: the output row, else -1 */
    char message[160];
} kg_backend_fault_t;

/** What the last failed call (which returned `st`) hit. Backends that do
 * not say: KG_FAULT_STEP for KG_ERR_INVALID, KG_FAULT_DEVICE for every
 * other failure. @thread engine */
void kg_backend_last_fault(const kg_backend_t *be, kg_status_t st, kg_backend_fault_t *out);

/* Counters a backend keeps about itself (all 0 for the CPU backend). */
typedef struct kg_backend_counters {
    int64_t graphs_captured; /* CUDA graphs captured (one per batch-size bucket) */
    int64_t graph_fallbacks; /* buckets run eagerly because capturing failed */
    int64_t graph_steps;     /* steps run as a graph */
    int64_t eager_steps;     /* steps run kernel by kernel */
} kg_backend_counters_t;

/** Read the counters; safe from any thread (e.g. a metrics scrape). */
void kg_backend_counters(const kg_backend_t *be, kg_backend_counters_t *out);

/** The expert load so far (see kg_moe_stats_t); all zero for a dense
 * model or a backend that does not count it. @thread engine */
void kg_backend_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out);

/** Make the adapter `lora` (which must outlive it there) usable in step
 * batches: *id gets its id, never given to another adapter while this
 * backend lives (so the engine may key cached prefixes by it). *id >= 0 on
 * entry asks for that id (kg_adapters reloads an evicted adapter under its
 * old one; the caller keeps ids distinct); -1: the backend picks. The CPU
 * backend packs its pairs as it packs the model's weights.
 * KG_ERR_UNSUPPORTED (with errstr) from a backend that runs no adapters;
 * KG_ERR_NOMEM. @thread engine (or before the engine runs) */
KG_NODISCARD kg_status_t kg_backend_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size);

/** Why kg_backend_lora_add cannot succeed here, one line into errstr: the backend runs no
 * adapters, or none on this model (naming what of it). @thread any */
void kg_backend_no_lora_why(const kg_backend_t *be, char *errstr, size_t errstr_size);

/** Whether kg_backend_lora_add can succeed here (the backend runs adapters). */
bool kg_backend_has_lora(const kg_backend_t *be);

/** Forget adapter `id` (no running sequence may use it). @thread engine */
void kg_backend_lora_remove(kg_backend_t *be, int32_t id);

/** Bytes of KV cache one token takes when the pool holds `type` (to size
 * the pool; every backend lays its pool out at this size). */
size_t kg_backend_kv_bytes_per_token(const kg_model_t *model, kg_kv_type_t type);

/** Bytes of one pool block of `block_size` tokens, every layer's K and V:
 * block_size x kg_backend_kv_bytes_per_token, but for Q8_0 each layer's
 * plane pads a block to 16 bytes (gpu/kv_cache.cuh's layout: aligned
 * loads), which only odd block sizes of narrow models need. */
size_t
kg_backend_kv_bytes_per_block(const kg_model_t *model, kg_kv_type_t type, int32_t block_size);

/** Check that every tensor of `model` has one of the n_types types in
 * `types`: KG_OK, or KG_ERR_UNSUPPORTED with errstr naming the backend, the
 * first tensor that has another type, that type, and the types the backend
 * runs. */
KG_NODISCARD kg_status_t kg_backend_check_types(const char *backend,
                                                const kg_model_t *model,
                                                const kg_ggml_type_t *types,
                                                int n_types,
                                                char *errstr,
                                                size_t errstr_size);
