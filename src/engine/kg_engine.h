/* kg_engine: continuous batching over a paged KV cache.
 *
 * DESIGN
 * The engine is owned by one thread and knows nothing of Kafka. Callers
 * submit requests (token ids + sampling parameters + limits) and call
 * kg_engine_step() in a loop; each step
 *   1. finishes cancelled requests and those past their deadline (waiting
 *      ones without ever running);
 *   2. with a model whose every layer is windowed (kv_window > 0), gives
 *      back each running sequence's blocks wholly before the window of its
 *      next token; then makes sure every running sequence has a block for
 *      its next token;
 *      when the pool (free plus evictable cached blocks) has none, it
 *      preempts the most recently admitted sequence (frees its blocks, keeps
 *      its tokens, requeues it at the very front of the queue to be
 *      recomputed later) until the block is there or the needy sequence was
 *      itself the newest and got preempted. A sequence alone in a pool it
 *      has filled cannot grow: it finishes LENGTH rather than hang;
 *   2b. when the head of the queue is of a higher tier than some running
 *      sequence and finds no free slot or too few blocks, preempts the
 *      newest running sequence of the lowest tier below the head's (as in
 *      2: blocks freed, tokens kept, the full blocks left in the prefix
 *      cache, so taking it back recomputes its last partial block), until
 *      the head fits or no lower tier runs. So a high tier (an interactive
 *      lane) gets a slot within a step instead of waiting for a long
 *      low-tier job to finish; all tiers 0 (the default) never do this.
 *      A preempted request waits at the front of its own tier;
 *   3. builds one batch: one decode token for every running sequence whose
 *      prompt is done, then prefill chunks in admission order up to
 *      max_batch_tokens (a long prompt is split over steps; decodes never
 *      wait behind it);
 *   4. admits waiting requests (tier, then preempted ones, then priority,
 *      then FIFO)
 *      into free slots while the step still has token budget and the pool
 *      can supply blocks for the part of the tokens the prefix cache does
 *      not hold plus a headroom of max(1, n_kv_blocks / 100) blocks (none
 *      when nothing runs). The head of the queue is never skipped for a
 *      smaller request behind it, so no request starves. Nothing is
 *      admitted in a step that preempted. Admission takes blocks for all of
 *      the prompt, never a max_seq_len reservation;
 *   5. runs one kg_backend_forward for the whole batch, registers every
 *      newly computed full block in the prefix cache (prompt and generated
 *      tokens), samples every sequence that produced logits with its own
 *      RNG, and reports each new token and each finish as a completion;
 *   6. frees the slot and blocks of every finished sequence the same step.
 * Prefix cache: full blocks are hashed with the prefix before them (kg_kv);
 * a new request reuses the longest cached run of its leading blocks
 * (always leaving its last token to compute, so there are logits to
 * sample), and a preempted one finds most of its own blocks again.
 * Nothing in kg_engine_submit, kg_engine_cancel or kg_engine_step
 * allocates: request records with their token buffers, slots, block tables,
 * batch arrays, logits and sampler scratch are sized at kg_engine_new.
 * A job's tokens depend only on (backend, prompt, parameters, seed): each
 * request has its own RNG, seeded at submit, and the backend computes every
 * row independently of the rest of the batch.
 *
 * CHOICES (n > 1)
 * A request with n_choices = n runs as n sequences that share the prompt:
 * choice 0 (the leader) is queued and admitted like any request, with n - 1
 * slots held for the others and one block each; they wait, without a place
 * in the queue, until the leader has computed its prompt. Then they fork
 * (kg_kv_seq_fork): each references the prompt's full blocks and gets a copy
 * of the block holding the last prompt token (kg_backend_kv_copy; a backend
 * without it recomputes that block's tokens instead), and computes that last
 * token itself as a decode row, for logits of its own. So the prompt is
 * prefilled once (n_prefill_tokens counts it once) and the shared blocks are
 * never written. From the fork on every choice is an ordinary sequence:
 * its own RNG (seeded with kg_sampler_choice_seed(seed, choice)), its own
 * finish, preempted and resumed alone. A fork that finds no free block
 * sends that choice to the front of the queue as an ordinary request (the
 * prefix cache still serves it the shared blocks). Choices report their own
 * completions (kg_completion_t.choice); a cancel or deadline of the leader
 * before the fork finishes the waiting choices with it.
 *
 * COMPLETIONS
 * A step reports, per request, at most one completion:
 *   - token >= 0, finish NONE: a new output token (index = its position in
 *     the output, from 0);
 *   - token >= 0, finish LENGTH: a new output token that is also the last
 *     (max_tokens reached, or the context reached max_seq_len);
 *   - token -1: a finish without a new token (index = the output length):
 *     STOP (the sampled end-of-generation token is not part of the output;
 *     `sample` still describes it), DEADLINE, CANCELLED, LENGTH when the
 *     KV pool is too small for the context to grow, or ERROR when the
 *     backend failed on this request alone (kg_backend_last_fault).
 * Every request gets exactly one completion with finish != NONE.
 *
 * CONSTRAINED REQUESTS
 * A request with a compiled grammar (kg_grammar_t, from the grammar
 * cache) gets its own matcher. Every step the engine builds the
 * allowed-token bitmask of every constrained row (end-of-generation
 * tokens only where the grammar may end, never with ignore_eos) and the
 * sampler, on the CPU or the device, applies it; the sampled token then
 * advances the matcher. A grammar that is complete (nothing more can
 * follow) finishes the request STOP without sampling an EOS. Where the
 * grammar allows exactly one continuation, its tokens are appended without
 * sampling (jump-forward, up to KG_ENGINE_MAX_FORCED per step; no RNG draw,
 * logprob 0) and reported like sampled ones, so a step may report several
 * completions for one request; they are fed to the model together in the
 * next step. A request whose grammar allows no token here (the vocabulary
 * cannot spell what it needs) finishes GRAMMAR: its output does not match,
 * so it must not look like a normal end. Masks depend only on the
 * request's own tokens, so batch invariance holds. Masks are built after
 * the forward pass is launched and before sampling, so on a device backend
 * (whose forward returns before the logits are ready) they overlap it; at
 * a microsecond or two per sequence-step (precomputed per grammar state)
 * building them on more threads would not pay.
 *
 * EMBEDDINGS
 * A request with n_inputs > 0 runs each input as a sequence of its own
 * (choice i is input i: queued, admitted, preempted like any request) that
 * is prefill only: its tokens are computed in chunks as any prompt's, but
 * none asks for logits; the backend returns the final hidden states
 * (kg_step_batch_t.want_hidden) of the positions its pooling reads, which
 * the engine keeps per slot (the mean sums rows in position order, so the
 * result does not depend on how the prompt was chunked or what shared its
 * steps). When the last token is computed the pooled row goes to
 * req->embd, the finish (STOP, token -1) is reported and the slot and
 * blocks are freed the same step. These sequences never take blocks from
 * the prefix cache (the hidden states of cached positions are not kept).
 * Submit refuses them (KG_ERR_UNSUPPORTED) on a backend without
 * kg_backend_has_hidden or with n_embd 0. */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../grammar/kg_grammar.h"
#include "../model/kg_sampler.h"
#include "kg_adapters.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_engine kg_engine_t;

#define KG_MAX_EOG     16
#define KG_MAX_CHOICES 16 /* n of one request at most */

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
    int32_t kv_window;    /* > 0: no token reads a position more than kv_window - 1 before its
                             own (every layer windowed: kg_model_kv_window), so blocks wholly
                             before that are given back as a sequence advances; 0: none */
    bool no_jump_forward; /* constrained requests: sample every token, even a forced one */
    int32_t n_embd;       /* the model's hidden width (embedding requests); 0: none run */
    /* an encoder (bert) or a non-causal decoder stack (gemma-embedding): an
     * input attends both ways, so it is scheduled whole in one step (an input
     * longer than max_batch_tokens is refused) and nothing else (generation)
     * runs; kg_model_non_causal */
    bool non_causal;
    /* a hybrid (recurrent) model's prefix cache: how many states saved at
     * shared prefixes' ends the engine keeps (the backend's
     * kg_backend_state_snapshots at most; kg_engine_state.c); 0: none, and
     * such a model computes every prompt from position 0 */
    int32_t n_state_snapshots;
} kg_engine_params_t;

typedef enum kg_finish {
    KG_FINISH_NONE = 0,  /* still running: the completion carries a token */
    KG_FINISH_STOP,      /* an end-of-generation token (not reported as text) */
    KG_FINISH_LENGTH,    /* max_tokens or the context limit */
    KG_FINISH_DEADLINE,  /* deadline passed while running or waiting */
    KG_FINISH_CANCELLED, /* kg_engine_cancel */
    KG_FINISH_ERROR,     /* the backend could not run this request (see kg_engine_step) */
    KG_FINISH_GRAMMAR,   /* its grammar allows no token of this vocabulary here: a dead end */
} kg_finish_t;

const char *kg_finish_str(kg_finish_t f);

/* Which hidden states an embedding request keeps (see EMBEDDINGS). */
typedef enum kg_engine_pool {
    KG_ENGINE_POOL_MEAN = 0, /* the mean over every position */
    KG_ENGINE_POOL_FIRST,    /* position 0 (cls) */
    KG_ENGINE_POOL_LAST,     /* the last position (last, and qwen3's rank) */
} kg_engine_pool_t;

/* A lazy grammar's text triggers (kg_request_t.lazy_texts): how many, how long. */
#define KG_ENGINE_MAX_LAZY_TEXTS  4
#define KG_ENGINE_MAX_LAZY_TEXT   48
#define KG_ENGINE_LAZY_TOKEN_ROOM 1024

typedef struct kg_request {
    uint64_t id;           /* caller's handle, unique among live requests */
    const int32_t *prompt; /* copied at submit */
    int32_t n_prompt;
    int32_t max_tokens;  /* > 0 */
    int32_t priority;    /* higher runs first; FIFO within a priority */
    int32_t tier;        /* >= 0, default 0. Higher tiers wait ahead of lower ones whatever
                            their priority, and one that finds no slot (or too few blocks)
                            takes those of the newest running request of the lowest tier
                            below its own, which is preempted (see step 2b) */
    int64_t deadline_us; /* kg_clock_us() deadline, 0 = none */
    bool ignore_eos;
    kg_sampling_params_t sampling; /* its logit_bias is copied at submit */
    kg_grammar_t *grammar;         /* NULL, or the output's grammar (borrowed: submit takes its own
                                      reference) */
    int32_t n_choices;             /* 1..min(KG_MAX_CHOICES, max_batch_size); 0 means 1 */
    kg_lora_set_t lora; /* the LoRA adapters it runs with (kg_backend_lora_add ids, or with
                           kg_engine_set_adapters kg_adapters ids; n = 0: the base); its prefix
                           is cached apart from other adapter sets' */
    /* An embedding request (see EMBEDDINGS) when n_inputs > 0: `prompt` holds
     * the inputs one after another, input_len[i] tokens each (copied at
     * submit); max_tokens, sampling, grammar and n_choices are not used. */
    int32_t n_inputs;
    const int32_t *input_len;
    kg_engine_pool_t pool;
    float *embd; /* (n_inputs, n_embd) out: input i's pooled row is written before its
                    finish is reported; borrowed until the request's last completion */
    /* A reasoning model's thought (all zero: none). While the output is
     * inside the thought the grammar is not applied (it starts at the token
     * after the closing tokens; only EOG is masked out, so the answer comes), and after
     * think_budget thought tokens the engine appends the closing tokens itself (a sampled token is
     * dropped for them; they are reported with logprob 0). The thought is open from the first
     * output token (think KG_THINK_REQ_OPEN: the prompt opened it) or opens when the first output
     * token is think_open (KG_THINK_REQ_MAY_OPEN: with a grammar, that token is allowed beside the
     * grammar's first ones; any other first token starts the answer). */
    int32_t think;              /* KG_THINK_REQ_* */
    int32_t think_open;         /* MAY_OPEN: the token that opens the thought */
    const int32_t *think_close; /* (n_think_close) the tokens that close it; copied */
    int32_t n_think_close;      /* 1..KG_ENGINE_MAX_THINK_CLOSE */
    int32_t think_budget;       /* thought tokens before it is closed; < 0: no budget */
    /* A lazy grammar (llama.cpp's, triggered by a token): with `lazy` the
     * output is unconstrained (EOG allowed) until lazy_token is sampled; the
     * grammar takes that token as its first and constrains the rest (a tool
     * call's opening marker, then the call). Needs a grammar. With
     * lazy_opens the trigger is not the grammar's: the grammar starts at the
     * token after it (a control token, which no grammar spells: Mistral's
     * [TOOL_CALLS]). */
    bool lazy;
    bool lazy_opens;
    int32_t lazy_token;
    /* Text triggers (llama.cpp's pattern triggers), for a call whose opening is text inside a
     * header rather than a token (gpt-oss's `<|start|>assistant<|channel|>commentary to=`):
     * with `lazy` and n_lazy_texts > 0 (lazy_token and lazy_opens unused) the output is free
     * until its text, read on from the prompt's last bytes, holds lazy_texts[i] ending inside
     * the token just sampled; the grammar then starts at byte lazy_from[i] of that trigger and
     * takes the text from there to the token's end (a trigger may begin in the prompt or in
     * earlier tokens). Text the grammar refuses there is no trigger: the output stays free.
     * Tokens are read as the grammar's vocabulary spells them (control tokens as nothing); a
     * token of more than KG_ENGINE_LAZY_TOKEN_ROOM bytes never triggers. */
    int32_t n_lazy_texts;                             /* 0..KG_ENGINE_MAX_LAZY_TEXTS */
    const char *lazy_texts[KG_ENGINE_MAX_LAZY_TEXTS]; /* each 1..KG_ENGINE_MAX_LAZY_TEXT - 1
                                                         bytes; copied at submit */
    int32_t lazy_from[KG_ENGINE_MAX_LAZY_TEXTS];      /* 0..its length - 1 */
} kg_request_t;

enum { KG_THINK_REQ_NONE = 0, KG_THINK_REQ_MAY_OPEN, KG_THINK_REQ_OPEN };
#define KG_ENGINE_MAX_THINK_CLOSE 8

/* Jump-forward tokens appended per request and step at most. */
#define KG_ENGINE_MAX_FORCED 16

typedef struct kg_completion {
    uint64_t id;
    int32_t choice; /* which of the request's n_choices (0 when n_choices is 1) */
    int32_t index;  /* index of this token in the output, or the output length when finishing */
    int32_t token;  /* -1 when the completion only reports a finish */
    kg_finish_t finish;
    int32_t n_prompt;
    int32_t n_cached;          /* prompt tokens served by the prefix cache (at first admission) */
    kg_sample_result_t sample; /* token and logprobs when token >= 0, or the EOG token on STOP */
} kg_completion_t;

/* Buckets of the mask-build histogram (0.25 us each: up to 128 us). */
#define KG_ENGINE_MASK_HIST 512

typedef struct kg_engine_stats {
    int32_t n_waiting;
    int32_t n_running;
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;   /* referenced by a running sequence */
    int32_t kv_blocks_cached; /* unreferenced but holding a cached prefix */
    /* the backend's KV pool bytes per cached token (all layers): what a
     * token costs, measured from the allocation (MLA: its latent row) */
    int64_t kv_bytes_per_token;
    /* a hybrid model's recurrent states, every slot's (0: attention only) */
    int64_t state_bytes;
    int64_t snapshot_bytes; /* its prefix cache's saved states (kg_engine_state.c) */
    /* the backend's weights in its memory (the GPU's for CUDA: quantized
     * GEMM weights as their GGUF blocks, the rest expanded; LoRA adapters
     * while loaded) */
    int64_t weight_bytes;
    int64_t n_steps;
    int64_t n_prefill_tokens; /* tokens computed as prefill (including recomputation) */
    int64_t n_decode_tokens;
    int64_t n_prefix_hit_tokens; /* prompt tokens served from the cache */
    int64_t n_state_saves;       /* a hybrid's states saved at a shared prefix's end */
    int64_t n_state_restores;    /* ... and restored into a sequence that shares it */
    int64_t n_prompt_tokens;     /* prompt tokens of admitted requests */
    int64_t n_preemptions;       /* for lack of blocks (step 2) */
    int64_t n_tier_preemptions;  /* to give a higher tier a slot or blocks (step 2b) */
    int64_t n_forks;             /* choices started from their leader's prompt blocks */
    int32_t last_batch_tokens;
    /* constrained decoding */
    int64_t n_grammar_masks;         /* masks built (one per constrained sequence-step) */
    int64_t grammar_mask_ns;         /* their total build time */
    int64_t n_grammar_forced_tokens; /* tokens appended by jump-forward */
    int64_t mask_hist[KG_ENGINE_MASK_HIST + 1]; /* build times in 0.25 us buckets, last: more */
    kg_moe_stats_t moe; /* the backend's expert load (n_expert 0: a dense model) */
} kg_engine_stats_t;

/** Create an engine over `be` (borrowed; must outlive the engine). */
kg_engine_t *
kg_engine_new(kg_backend_t *be, const kg_engine_params_t *params, char *errstr, size_t errstr_size);
void kg_engine_free(kg_engine_t *e);

/** Let the engine keep the backend's adapters through `a` (borrowed; must
 * outlive the engine; before the first step): requests then name
 * kg_adapters ids, and admission loads a waiting request's adapters that
 * are not resident, evicting the least recently used one no running
 * request uses when max_resident are (one no waiting request uses either
 * first); with none to evict the request waits at the head of the queue,
 * nobody overtaking it, until a running one ends. Submit refuses
 * (KG_ERR_INVALID) an id not in `a` or more adapters than max_resident. */
void kg_engine_set_adapters(kg_engine_t *e, kg_adapters_t *a);

/** Queue a request; the prompt and the logit_bias are copied.
 * KG_QUEUE_FULL when max_queue_depth are waiting or fewer than n_choices
 * request records are free (every running or waiting choice holds one).
 * KG_ERR_INVALID when the prompt is empty, leaves no room in max_seq_len,
 * does not fit the whole KV pool, holds a token id outside the vocabulary,
 * when max_tokens < 1 or tier < 0, when n_logprobs, n_choices or the logit_bias (count, a
 * token id, a token listed twice) is out of range, or the id belongs to a
 * live request.
 * @thread engine */
KG_NODISCARD kg_status_t kg_engine_submit(kg_engine_t *e, const kg_request_t *req);

/** Cancel a waiting or running request, all its choices; each finish
 * (CANCELLED) is reported by the next step. Returns false when the id is
 * unknown. @thread engine */
bool kg_engine_cancel(kg_engine_t *e, uint64_t id);

/** Cancel one choice of a request (a choice that matched a stop string);
 * the others go on. Returns false when there is no such live choice.
 * @thread engine */
bool kg_engine_cancel_choice(kg_engine_t *e, uint64_t id, int32_t choice);
/** The most completions one step can report: size the `out` array of
 * kg_engine_step with it. */
int32_t kg_engine_max_completions(const kg_engine_t *e);

/** Run one step. Writes up to `cap` completions (cap must be at least
 * kg_engine_max_completions, else KG_ERR_INVALID) and returns how
 * many (0 when idle or when the step only prefilled), or a negative
 * kg_status_t when the backend failed device-wide (KG_FAULT_DEVICE). After
 * such a failure nothing has advanced: the finishes already decided in that
 * step are kept and reported by the next successful step, which retries the
 * work. A failure the backend pins to one request (KG_FAULT_SEQ) ends that
 * request with KG_FINISH_ERROR, and one of the step as a whole
 * (KG_FAULT_STEP) ends every request of the step so; the step then returns
 * those finishes and the next one runs the others again. @thread engine */
int32_t kg_engine_step(kg_engine_t *e, kg_completion_t *out, int32_t cap);

/** Whether any request is waiting or running, or a finish is still to be
 * reported. */
bool kg_engine_busy(const kg_engine_t *e);

void kg_engine_stats(const kg_engine_t *e, kg_engine_stats_t *out);

/** Replace the clock used for deadlines (default: kg_clock_us), e.g. with
 * a fake clock in tests. @thread engine */
void kg_engine_set_clock(kg_engine_t *e, int64_t (*now_us)(void *ctx), void *ctx);

/** Default parameters for a model on a backend: batch sizes, a KV pool of
 * `kv_memory_size` bytes (0: enough for max_batch_size full contexts). */
kg_engine_params_t kg_engine_params_default(const kg_model_t *model, size_t kv_memory_size);
