/* kg_engine_int: the engine's state, shared by kg_engine.c (lifecycle,
 * the waiting queue, submit and cancel, queries) and kg_engine_step.c
 * (finishing, preemption, admission and the step), and by no one else. */
#pragma once

#include "kg_adapters.h"
#include "kg_engine.h"
#include "kg_kv.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One request from submit to finish: waiting (slot -1) or running. */
typedef struct kg_seq {
    bool live;
    bool cancelled;
    bool front;         /* preempted: stays ahead of every submitted request */
    bool admitted_once; /* n_cached is known */
    uint64_t id;
    int32_t priority;
    int32_t tier;        /* see kg_request_t */
    int64_t deadline_us; /* 0: none */
    int32_t max_tokens;
    bool ignore_eos;
    kg_sampling_params_t sampling;
    kg_rng_t rng;
    int32_t *tokens; /* (max_seq_len) the prompt, then the output */
    int32_t n_prompt;
    int32_t n_tokens;    /* prompt + output */
    int32_t n_computed;  /* leading tokens whose K/V are in the slot's blocks */
    int32_t prefill_end; /* tokens before it count as prefill (set at admission) */
    int32_t n_cached;    /* prompt tokens from the prefix cache at first admission */
    int32_t slot;        /* -1 while waiting */
    int32_t n_sched;     /* tokens in this step's batch */
    int32_t choice;      /* index among the request's choices */
    int32_t leader;      /* a choice waiting for its fork: the leader's record; else -1 */
    int32_t n_pending;   /* a leader: choices still waiting for the fork */
    int32_t n_reserved;  /* a running leader: slots held for them */
    /* a hybrid's prefix cache (kg_engine_state.c): save the slot's state
     * when n_computed reaches snap_at (0: no), and the snapshot fits()
     * picked for admission with the prompt tokens it covers */
    int32_t snap_at;
    int32_t snap_use;
    int32_t snap_tokens;
    kg_logit_bias_t *bias; /* (KG_MAX_LOGIT_BIAS) sampling.logit_bias points here */
    kg_grammar_t *grammar; /* a reference, NULL when unconstrained */
    kg_matcher_t *matcher; /* the record's matcher (allocated on first use, kept) */
    kg_lora_set_t lora;    /* its adapters (n = 0: the base) */
    uint64_t lora_key;     /* the prefix cache's key of that set (0: the base) */
    bool embed;            /* an embedding input: prefill only (see EMBEDDINGS) */
    kg_engine_pool_t pool;
    float *embd_out; /* embed: (n_embd) where the pooled row goes */
    /* the thought (kg_request_t.think): where the output is, and its markers */
    int32_t think; /* KG_SEQ_THINK_* */
    int32_t think_open;
    int32_t think_close[KG_ENGINE_MAX_THINK_CLOSE];
    int32_t n_think_close;
    int32_t think_budget; /* < 0: none */
    int32_t n_thought;    /* thought tokens so far */
    bool lazy_wait;       /* a lazy grammar not yet triggered (kg_request_t.lazy) */
    bool lazy_opens;      /* the trigger opens the grammar, it is not its first token */
    int32_t lazy_token;
    int32_t n_lazy_texts; /* text triggers (kg_request_t.lazy_texts), copied */
    uint8_t lazy_len[KG_ENGINE_MAX_LAZY_TEXTS];
    uint8_t lazy_from[KG_ENGINE_MAX_LAZY_TEXTS];
    char lazy_text[KG_ENGINE_MAX_LAZY_TEXTS][KG_ENGINE_MAX_LAZY_TEXT];
} kg_seq_t;

enum {
    KG_SEQ_THINK_ANSWER = 0, /* no thought, or it closed: the grammar applies */
    KG_SEQ_THINK_START,      /* the first output token may open the thought */
    KG_SEQ_THINK_IN,         /* inside the thought: unconstrained, counted */
};

struct kg_engine {
    kg_backend_t *be; /* borrowed */
    kg_engine_params_t p;
    int32_t max_blocks_per_seq;
    int32_t headroom; /* blocks kept free when admitting next to running sequences */
    kg_kv_t *kv;
    kg_sampler_scratch_t *scratch;

    // ---- requests ----
    int32_t n_recs;     /* max_queue_depth + max_batch_size */
    kg_seq_t *recs;     /* (n_recs) */
    int32_t *arena;     /* (n_recs, max_seq_len) token buffers */
    int32_t *free_recs; /* (n_recs) stack of unused record ids */
    int32_t n_free_recs;
    int32_t *wait; /* (n_recs) waiting record ids in admission order */
    int32_t n_wait;
    int32_t *run; /* (max_batch_size) running record ids, oldest admission first */
    int32_t n_run;
    int32_t *free_slots; /* (max_batch_size) stack of unused slot ids */
    int32_t n_free_slots;
    int32_t n_reserved_slots;    /* free slots held for choices waiting to fork */
    kg_logit_bias_t *bias_arena; /* (n_recs, KG_MAX_LOGIT_BIAS) */
    int32_t *copy_src;           /* (max_batch_size) KV blocks to copy at a fork */
    int32_t *copy_dst;           /* (max_batch_size) */
    /* the backend keeps recurrent state per slot (a hybrid model): no
     * prefix cache, and a leader stops one token short of its prompt so
     * that its choices fork from the state before that token */
    bool state;
    int32_t *state_src;          /* (max_batch_size) slots whose state a fork copies */
    int32_t *state_dst;          /* (max_batch_size) */
    struct kg_state_snap *snaps; /* (n_snaps) saved states (kg_engine_state.c) */
    int32_t n_snaps;
    int32_t *snap_toks; /* (n_snaps, max_seq_len) the tokens each one covers */
    uint64_t snap_clock;
    uint64_t n_submitted;

    // ---- the step ----
    int32_t *b_token;          /* (max_batch_tokens) */
    int32_t *b_pos;            /* (max_batch_tokens) */
    int32_t *b_seq;            /* (max_batch_tokens) slot of each token */
    kg_lora_set_t *b_lora;     /* (max_batch_size) each slot's adapters this step */
    bool *b_want;              /* (max_batch_tokens) */
    int32_t *b_row_rec;        /* (max_batch_size) record of each logits row */
    bool *b_in_step;           /* (max_batch_size) run[i] had tokens in a failed step */
    float *logits;             /* (max_batch_size, n_vocab) */
    bool device_sample;        /* the backend samples on its device: logits stay there */
    kg_sample_request_t *sreq; /* (max_batch_size) device sampling requests */
    kg_sample_result_t *sres;  /* (max_batch_size) their results */
    kg_rng_t *rng_save;        /* (max_batch_size) the rows' RNG states before sampling */
    kg_completion_t *done;     /* (max_done) finishes and tokens to report */
    int32_t n_done, max_done;
    /* constrained decoding */
    int32_t mask_words; /* (n_vocab + 31) / 32 */
    uint32_t *masks;    /* (max_batch_size, mask_words) this step's masks, by row */
    bool *row_any;      /* (max_batch_size) the row's mask allows a token or the end */
    kg_rng_t dummy_rng; /* what a forced row's device sample draws from (and drops) */
    /* embedding requests (kg_engine_embed.c) */
    bool *b_hid;      /* (max_batch_tokens) the token's hidden state is wanted */
    int32_t *b_flash; /* (max_batch_tokens) an embedding input's length, or 0 (flash_len) */
    float *hidden;    /* (max_batch_tokens, n_embd) the step's hidden rows; on first use */
    float *pool_acc;  /* (max_batch_size, n_embd) per slot: the pooled row so far */

    kg_adapters_t *adapters; /* NULL: requests name backend ids (kg_engine_set_adapters) */
    bool lora_blocked;       /* the head waits for an adapter (logged once) */

    int64_t (*now_us)(void *ctx);
    void *now_ctx;
    kg_engine_stats_t st;
};

// ---- the waiting queue (kg_engine.c) ----

/** Put a preempted request at the front of the waiting queue, behind the
 * requests of higher tiers. */
void kg_engine_wait_push_front(kg_engine_t *e, int32_t r);
/** Drop wait[i] (admitted or finished while waiting). */
void kg_engine_wait_remove_at(kg_engine_t *e, int32_t i);
/** Drop run[i] (finished or preempted). */
void kg_engine_run_remove_at(kg_engine_t *e, int32_t i);
/** Put record r in the waiting queue (priority order). */
void kg_engine_wait_insert(kg_engine_t *e, int32_t r);

// ---- adapters (kg_engine_lora.c) ----

/** Whether waiting record r's adapters are all resident now, after
 * evicting and loading what its admission needs: 1 yes, 0 it must wait (no
 * adapter can be evicted), -1 a load failed (the log says why; the caller
 * ends it). @thread engine */
int kg_engine_lora_ready(kg_engine_t *e, int32_t r);

// ---- embedding requests (kg_engine_embed.c) ----

/** kg_engine_submit for a request with n_inputs > 0. */
kg_status_t kg_engine_embed_submit(kg_engine_t *e, const kg_request_t *req);
/** A running embed sequence was admitted into its slot: its pooled row
 * starts from zero (it computes every token again). */
void kg_engine_embed_admit(kg_engine_t *e, const kg_seq_t *seq);
/** After a successful forward of `nt` tokens: add the step's hidden rows
 * to their slots' pooled rows. */
void kg_engine_embed_collect(kg_engine_t *e, int32_t nt);
/** Whether the running embed sequence `seq` (all computed) is done: writes
 * its pooled row out. */
void kg_engine_embed_finish(kg_engine_t *e, kg_seq_t *seq);

/* ---- a hybrid model's prefix cache (kg_engine_state.c) ---- */

/** The snapshots (e->p.n_state_snapshots, at most the backend's); false:
 * out of memory. */
bool kg_engine_state_init(kg_engine_t *e);
void kg_engine_state_free(kg_engine_t *e);

/** The saved state covering the most of seq's first max_tokens tokens
 * (whole blocks; lora key and tokens equal): its index, *n_tokens the
 * tokens it covers; -1 when none. */
int32_t
kg_engine_state_find(kg_engine_t *e, const kg_seq_t *seq, int32_t max_tokens, int32_t *n_tokens);

/** Restore snapshot `snap` into seq's slot; false when the backend fails
 * (the sequence then computes from position 0). */
bool kg_engine_state_restore(kg_engine_t *e, kg_seq_t *seq, int32_t snap);

/** Save seq's slot state (n_computed tokens in) in place of the least
 * recently used snapshot, unless one holds those tokens already. */
void kg_engine_state_save(kg_engine_t *e, kg_seq_t *seq);
