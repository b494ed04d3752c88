/* kg_engine: the continuous-batching scheduler (see kg_engine.h for the
 * design and the completion convention).
 *
 * This file: the lifecycle, the waiting queue, submit and cancel, and the
 * queries. kg_engine_step.c: what happens in kg_engine_step (expiry,
 * admission, preemption, forks, sampling, finishing). kg_engine_int.h: the
 * state both read. */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_engine_int.h"
#include "kg_kv.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *kg_finish_str(kg_finish_t f) {
    switch (f) {
    case KG_FINISH_NONE:
        return "none";
    case KG_FINISH_STOP:
        return "stop";
    case KG_FINISH_LENGTH:
        return "length";
    case KG_FINISH_DEADLINE:
        return "deadline";
    case KG_FINISH_CANCELLED:
        return "cancelled";
    case KG_FINISH_ERROR:
        return "error";
    case KG_FINISH_GRAMMAR:
        return "grammar";
    }
    return "unknown";
}

static int64_t default_now_us(void *ctx) {
    (void)ctx;
    return kg_clock_us();
}

// ---- lifecycle ----

kg_engine_t *kg_engine_new(kg_backend_t *be,
                           const kg_engine_params_t *params,
                           char *errstr,
                           size_t errstr_size) {
    const kg_engine_params_t *p = params;
    if (p->max_batch_size < 1 || p->max_queue_depth < 1 || p->max_seq_len < 2 ||
        p->kv_block_size < 1 || p->n_kv_blocks < 1 || p->n_vocab < 1) {
        snprintf(errstr, errstr_size,
                 "engine: max_batch_size (%d), max_queue_depth (%d), kv_block_size (%d), "
                 "n_kv_blocks (%d) and n_vocab (%d) must be positive and max_seq_len (%d) at "
                 "least 2",
                 p->max_batch_size, p->max_queue_depth, p->kv_block_size, p->n_kv_blocks,
                 p->n_vocab, p->max_seq_len);
        return NULL;
    }
    /* Every running sequence must be able to put its decode token in a step. */
    if (p->max_batch_tokens < p->max_batch_size) {
        snprintf(errstr, errstr_size,
                 "engine: max_batch_tokens (%d) must be at least max_batch_size (%d)",
                 p->max_batch_tokens, p->max_batch_size);
        return NULL;
    }
    if (p->n_eog < 0 || p->n_eog > KG_MAX_EOG) {
        snprintf(errstr, errstr_size, "engine: n_eog (%d) must be in 0..%d", p->n_eog, KG_MAX_EOG);
        return NULL;
    }
    if ((int64_t)p->max_queue_depth + p->max_batch_size > INT32_MAX / 2) {
        snprintf(errstr, errstr_size, "engine: max_queue_depth (%d) is too large",
                 p->max_queue_depth);
        return NULL;
    }
    kg_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        snprintf(errstr, errstr_size, "engine: out of memory");
        return NULL;
    }
    e->be = be;
    e->p = *p;
    /* a recurrent model's state cannot be rebuilt from cached K/V blocks:
     * every sequence computes its prompt from position 0 */
    e->state = kg_backend_has_state(be);
    if (e->state && !kg_engine_state_init(e)) {
        snprintf(errstr, errstr_size, "engine: out of memory");
        kg_engine_state_free(e);
        free(e);
        return NULL;
    }
    if (e->state && e->p.prefix_cache && e->n_snaps == 0) {
        KG_LOG_INFO("engine", "recurrent (hybrid) model without state snapshots: the prefix cache "
                              "is off");
        e->p.prefix_cache = false;
    }
    e->max_blocks_per_seq = (p->max_seq_len + p->kv_block_size - 1) / p->kv_block_size;
    e->headroom = p->n_kv_blocks / 100 > 1 ? p->n_kv_blocks / 100 : 1;
    e->now_us = default_now_us;
    kg_kv_params_t kp = {.n_blocks = p->n_kv_blocks,
                         .block_size = p->kv_block_size,
                         .n_slots = p->max_batch_size,
                         .max_blocks_per_seq = e->max_blocks_per_seq,
                         .prefix_cache = e->p.prefix_cache};
    e->kv = kg_kv_new(&kp, errstr, errstr_size);
    if (!e->kv) {
        goto fail_quiet;
    }
    e->scratch = kg_sampler_scratch_new(p->n_vocab);
    e->n_recs = p->max_queue_depth + p->max_batch_size;
    size_t nr = (size_t)e->n_recs, nb = (size_t)p->max_batch_size;
    size_t nt = (size_t)p->max_batch_tokens;
    e->recs = calloc(nr, sizeof(*e->recs));
    e->arena = malloc(nr * (size_t)p->max_seq_len * sizeof(*e->arena));
    e->free_recs = malloc(nr * sizeof(*e->free_recs));
    e->wait = malloc(nr * sizeof(*e->wait));
    e->run = malloc(nb * sizeof(*e->run));
    e->free_slots = malloc(nb * sizeof(*e->free_slots));
    e->b_token = malloc(nt * sizeof(*e->b_token));
    e->b_pos = malloc(nt * sizeof(*e->b_pos));
    e->b_seq = malloc(nt * sizeof(*e->b_seq));
    e->b_want = malloc(nt * sizeof(*e->b_want));
    e->b_lora = calloc(nb, sizeof(*e->b_lora));
    e->b_hid = calloc(nt, sizeof(*e->b_hid));
    e->b_flash = calloc(nt, sizeof(*e->b_flash));
    e->b_row_rec = malloc(nb * sizeof(*e->b_row_rec));
    e->b_in_step = malloc(nb * sizeof(*e->b_in_step));
    e->logits = malloc(nb * (size_t)p->n_vocab * sizeof(*e->logits));
    /* per step: every record's finish, plus up to KG_ENGINE_MAX_FORCED + 1 more
     * tokens and a grammar-complete finish for each running sequence */
    e->max_done = e->n_recs + p->max_batch_size * (KG_ENGINE_MAX_FORCED + 2);
    e->done = calloc((size_t)e->max_done, sizeof(*e->done));
    e->mask_words = (p->n_vocab + 31) / 32;
    e->masks = malloc(nb * (size_t)e->mask_words * sizeof(*e->masks));
    e->row_any = calloc(nb, sizeof(*e->row_any));
    e->device_sample = kg_backend_has_sample(be);
    e->sreq = malloc(nb * sizeof(*e->sreq));
    e->sres = malloc(nb * sizeof(*e->sres));
    e->rng_save = malloc(nb * sizeof(*e->rng_save));
    e->bias_arena = malloc(nr * KG_MAX_LOGIT_BIAS * sizeof(*e->bias_arena));
    e->copy_src = malloc(nb * sizeof(*e->copy_src));
    e->copy_dst = malloc(nb * sizeof(*e->copy_dst));
    e->state_src = malloc(nb * sizeof(*e->state_src));
    e->state_dst = malloc(nb * sizeof(*e->state_dst));
    if (!e->sreq || !e->sres || !e->rng_save || !e->scratch || !e->recs || !e->arena ||
        !e->free_recs || !e->wait || !e->run || !e->free_slots || !e->b_token || !e->b_pos ||
        !e->b_seq || !e->b_want || !e->b_hid || !e->b_flash || !e->b_row_rec || !e->b_in_step ||
        !e->logits || !e->done || !e->masks || !e->row_any || !e->bias_arena || !e->copy_src ||
        !e->copy_dst || !e->state_src || !e->state_dst || !e->b_lora) {
        goto fail;
    }
    for (int32_t i = 0; i < e->n_recs; i++) {
        e->recs[i].tokens = e->arena + (size_t)i * (size_t)p->max_seq_len;
        e->recs[i].bias = e->bias_arena + (size_t)i * KG_MAX_LOGIT_BIAS;
        e->recs[i].slot = -1;
        e->recs[i].leader = -1;
        e->free_recs[i] = e->n_recs - 1 - i;
    }
    e->n_free_recs = e->n_recs;
    for (int32_t i = 0; i < p->max_batch_size; i++) {
        e->free_slots[i] = p->max_batch_size - 1 - i;
    }
    e->n_free_slots = p->max_batch_size;
    e->st.kv_blocks_total = p->n_kv_blocks;
    return e;
fail:
    snprintf(errstr, errstr_size,
             "engine: out of memory for %d requests of %d tokens and %d x %d logits", e->n_recs,
             p->max_seq_len, p->max_batch_size, p->n_vocab);
fail_quiet:
    kg_engine_free(e);
    return NULL;
}

void kg_engine_free(kg_engine_t *e) {
    if (!e) {
        return;
    }
    kg_kv_free(e->kv);
    kg_sampler_scratch_free(e->scratch);
    for (int32_t i = 0; e->recs && i < e->n_recs; i++) {
        kg_grammar_unref(e->recs[i].grammar);
        kg_matcher_free(e->recs[i].matcher);
    }
    free(e->recs);
    free(e->arena);
    free(e->free_recs);
    free(e->wait);
    free(e->run);
    free(e->free_slots);
    free(e->b_token);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
    free(e->b_lora);
    free(e->b_hid);
    free(e->b_flash);
    free(e->hidden);
    free(e->pool_acc);
    free(e->b_row_rec);
    free(e->b_in_step);
    free(e->logits);
    free(e->sreq);
    free(e->sres);
    free(e->rng_save);
    free(e->done);
    free(e->bias_arena);
    free(e->copy_src);
    free(e->copy_dst);
    free(e->state_src);
    free(e->state_dst);
    kg_engine_state_free(e);
    free(e->masks);
    free(e->row_any);
    free(e);
}

void kg_engine_set_clock(kg_engine_t *e, int64_t (*now_us)(void *ctx), void *ctx) {
    e->now_us = now_us ? now_us : default_now_us;
    e->now_ctx = now_us ? ctx : NULL;
}

// ---- the waiting queue ----

static void wait_insert_at(kg_engine_t *e, int32_t i, int32_t r) {
    memmove(e->wait + i + 1, e->wait + i, (size_t)(e->n_wait - i) * sizeof(*e->wait));
    e->wait[i] = r;
    e->n_wait++;
}

/* Preempted requests go to the front of their tier, most recent first:
 * requests are preempted newest first, so they come back in their
 * original order. */
void kg_engine_wait_push_front(kg_engine_t *e, int32_t r) {
    int32_t tier = e->recs[r].tier, i = 0;
    while (i < e->n_wait && e->recs[e->wait[i]].tier > tier) {
        i++;
    }
    wait_insert_at(e, i, r);
}

/* After every request of a higher tier, and in its own tier after the
 * preempted ones and every request of the same or a higher priority:
 * priority order, FIFO within a priority. */
void kg_engine_wait_insert(kg_engine_t *e, int32_t r) {
    int32_t prio = e->recs[r].priority, tier = e->recs[r].tier;
    int32_t i = 0;
    while (i < e->n_wait) {
        const kg_seq_t *w = &e->recs[e->wait[i]];
        if (w->tier < tier || (w->tier == tier && !w->front && w->priority < prio)) {
            break;
        }
        i++;
    }
    wait_insert_at(e, i, r);
}

void kg_engine_wait_remove_at(kg_engine_t *e, int32_t i) {
    memmove(e->wait + i, e->wait + i + 1, (size_t)(e->n_wait - i - 1) * sizeof(*e->wait));
    e->n_wait--;
}

void kg_engine_run_remove_at(kg_engine_t *e, int32_t i) {
    memmove(e->run + i, e->run + i + 1, (size_t)(e->n_run - i - 1) * sizeof(*e->run));
    e->n_run--;
}

// ---- submit and cancel ----

static bool id_is_live(const kg_engine_t *e, uint64_t id) {
    for (int32_t i = 0; i < e->n_recs; i++) {
        if (e->recs[i].live && e->recs[i].id == id) {
            return true;
        }
    }
    return false;
}

/* The prefix cache's key of an adapter set: FNV-1a over its ids and
 * scales' bits (0, the base's key, only for the empty set). */
static uint64_t lora_key(const kg_lora_set_t *set) {
    if (set->n == 0) {
        return 0;
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int32_t i = 0; i < set->n; i++) {
        uint32_t words[2] = {(uint32_t)set->id[i], 0};
        memcpy(&words[1], &set->scale[i], sizeof(float));
        for (int w = 0; w < 2; w++) {
            for (int b = 0; b < 4; b++) {
                h = (h ^ ((words[w] >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
            }
        }
    }
    return h ? h : 1;
}

/* Fill record r for choice `choice` of `req` (with a grammar, the record's
 * matcher is already there). */
static void seq_init(kg_engine_t *e, int32_t r, const kg_request_t *req, int32_t choice) {
    kg_seq_t *seq = &e->recs[r];
    int32_t *tokens = seq->tokens;
    kg_logit_bias_t *bias = seq->bias;
    kg_matcher_t *matcher = seq->matcher;
    memset(seq, 0, sizeof(*seq));
    seq->tokens = tokens;
    seq->bias = bias;
    seq->matcher = matcher;
    if (req->grammar) {
        seq->grammar = kg_grammar_ref(req->grammar);
        kg_matcher_reset(seq->matcher, seq->grammar);
    }
    seq->live = true;
    seq->id = req->id;
    seq->priority = req->priority;
    seq->tier = req->tier;
    seq->deadline_us = req->deadline_us;
    seq->max_tokens = req->max_tokens;
    seq->ignore_eos = req->ignore_eos;
    seq->sampling = req->sampling;
    seq->sampling.seed = kg_sampler_choice_seed(req->sampling.seed, choice);
    seq->sampling.logit_bias = bias;
    if (req->sampling.n_logit_bias > 0) {
        memcpy(bias, req->sampling.logit_bias, (size_t)req->sampling.n_logit_bias * sizeof(*bias));
    }
    kg_rng_seed(&seq->rng, seq->sampling.seed);
    memcpy(seq->tokens, req->prompt, (size_t)req->n_prompt * sizeof(*seq->tokens));
    seq->n_prompt = req->n_prompt;
    seq->n_tokens = req->n_prompt;
    seq->slot = -1;
    seq->choice = choice;
    seq->leader = -1;
    seq->snap_at = 0;
    seq->snap_use = -1;
    if (req->think != KG_THINK_REQ_NONE) {
        seq->think = req->think == KG_THINK_REQ_OPEN ? KG_SEQ_THINK_IN : KG_SEQ_THINK_START;
        seq->think_open = req->think_open;
        seq->n_think_close = req->n_think_close;
        memcpy(seq->think_close, req->think_close,
               (size_t)req->n_think_close * sizeof(*seq->think_close));
        seq->think_budget = req->think_budget;
    }
    seq->lazy_wait = req->lazy && req->grammar;
    seq->lazy_token = req->lazy_token;
    seq->lazy_opens = req->lazy_opens;
    seq->n_lazy_texts = req->lazy ? req->n_lazy_texts : 0;
    for (int32_t i = 0; i < seq->n_lazy_texts; i++) {
        size_t n = strlen(req->lazy_texts[i]);
        memcpy(seq->lazy_text[i], req->lazy_texts[i], n);
        seq->lazy_len[i] = (uint8_t)n;
        seq->lazy_from[i] = (uint8_t)req->lazy_from[i];
    }
    seq->lora = req->lora;
    seq->lora_key = lora_key(&req->lora);
}

static bool bias_is_valid(const kg_engine_t *e, const kg_sampling_params_t *sp) {
    if (sp->n_logit_bias < 0 || sp->n_logit_bias > KG_MAX_LOGIT_BIAS ||
        (sp->n_logit_bias > 0 && !sp->logit_bias)) {
        return false;
    }
    for (int32_t i = 0; i < sp->n_logit_bias; i++) {
        if (sp->logit_bias[i].token < 0 || sp->logit_bias[i].token >= e->p.n_vocab) {
            return false;
        }
        for (int32_t j = 0; j < i; j++) { /* at most 300: once per submit */
            if (sp->logit_bias[j].token == sp->logit_bias[i].token) {
                return false;
            }
        }
    }
    return true;
}

/* A lazy request's trigger: a token of the vocabulary, or text triggers within the limits. */
static bool lazy_is_valid(const kg_engine_params_t *p, const kg_request_t *req) {
    if (!req->grammar) {
        return false;
    }
    if (req->n_lazy_texts == 0) {
        return req->lazy_token >= 0 && req->lazy_token < p->n_vocab;
    }
    if (req->n_lazy_texts < 0 || req->n_lazy_texts > KG_ENGINE_MAX_LAZY_TEXTS || req->lazy_opens) {
        return false;
    }
    for (int32_t i = 0; i < req->n_lazy_texts; i++) {
        size_t n = req->lazy_texts[i] ? strlen(req->lazy_texts[i]) : 0;
        if (n == 0 || n >= KG_ENGINE_MAX_LAZY_TEXT || req->lazy_from[i] < 0 ||
            (size_t)req->lazy_from[i] >= n) {
            return false;
        }
    }
    return true;
}

kg_status_t kg_engine_submit(kg_engine_t *e, const kg_request_t *req) {
    const kg_engine_params_t *p = &e->p;
    if (req->n_inputs != 0) {
        return kg_engine_embed_submit(e, req);
    }
    if (p->non_causal) {
        return KG_ERR_UNSUPPORTED; /* an encoder has no LM head to generate with */
    }
    int32_t n = req->n_choices > 0 ? req->n_choices : 1;
    if (!req->prompt || req->n_prompt < 1 || req->n_prompt >= p->max_seq_len ||
        req->max_tokens < 1 || req->tier < 0 || req->sampling.n_logprobs < 0 ||
        req->sampling.n_logprobs > KG_MAX_LOGPROBS || n > KG_MAX_CHOICES || n > p->max_batch_size) {
        return KG_ERR_INVALID;
    }
    /* A prompt larger than the whole pool could never be admitted. */
    if ((req->n_prompt + p->kv_block_size - 1) / p->kv_block_size > p->n_kv_blocks) {
        return KG_ERR_INVALID;
    }
    for (int32_t i = 0; i < req->n_prompt; i++) {
        if (req->prompt[i] < 0 || req->prompt[i] >= p->n_vocab) {
            return KG_ERR_INVALID;
        }
    }
    if (id_is_live(e, req->id)) {
        return KG_ERR_INVALID;
    }
    if (req->grammar && kg_grammar_n_vocab(req->grammar) != p->n_vocab) {
        return KG_ERR_INVALID; /* compiled for another vocabulary */
    }
    if (req->lazy && !lazy_is_valid(p, req)) {
        return KG_ERR_INVALID;
    }
    if (req->think != KG_THINK_REQ_NONE) {
        bool ok = (req->think == KG_THINK_REQ_OPEN ||
                   (req->think == KG_THINK_REQ_MAY_OPEN && req->think_open >= 0 &&
                    req->think_open < p->n_vocab)) &&
                  req->think_close && req->n_think_close >= 1 &&
                  req->n_think_close <= KG_ENGINE_MAX_THINK_CLOSE;
        for (int32_t i = 0; ok && i < req->n_think_close; i++) {
            ok = req->think_close[i] >= 0 && req->think_close[i] < p->n_vocab;
        }
        if (!ok) {
            return KG_ERR_INVALID;
        }
    }
    /* With single-choice requests a record is always free (waiting <
     * max_queue_depth, running <= max_batch_size); choices waiting to fork
     * hold records outside both. */
    if (e->n_wait >= p->max_queue_depth || e->n_free_recs < n) {
        return KG_QUEUE_FULL;
    }
    /* after the queue check: callers retry a full queue every step */
    if (!bias_is_valid(e, &req->sampling) || req->lora.n < 0 || req->lora.n > KG_LORA_SET_MAX) {
        return KG_ERR_INVALID;
    }
    if (e->adapters) {
        const int32_t cap = kg_adapters_max_resident(e->adapters);
        for (int32_t i = 0; i < req->lora.n; i++) {
            if (!kg_adapters_has(e->adapters, req->lora.id[i])) {
                return KG_ERR_INVALID;
            }
        }
        if (cap > 0 && req->lora.n > cap) {
            return KG_ERR_INVALID; /* could never be admitted */
        }
    }
    if (req->grammar) {
        /* the records taken below: each choice has its own matcher, allocated
         * once per record, outside the step loop, and kept for the next job */
        for (int32_t c = 1; c <= n; c++) {
            kg_seq_t *s = &e->recs[e->free_recs[e->n_free_recs - c]];
            if (!s->matcher && !(s->matcher = kg_matcher_new())) {
                return KG_ERR_NOMEM;
            }
        }
    }
    int32_t r = e->free_recs[--e->n_free_recs];
    seq_init(e, r, req, 0);
    e->recs[r].n_pending = n - 1;
    for (int32_t c = 1; c < n; c++) {
        int32_t f = e->free_recs[--e->n_free_recs];
        seq_init(e, f, req, c);
        e->recs[f].leader = r;
    }
    e->n_submitted++;
    kg_engine_wait_insert(e, r);
    return KG_OK;
}

bool kg_engine_cancel(kg_engine_t *e, uint64_t id) {
    bool found = false;
    for (int32_t i = 0; i < e->n_recs; i++) {
        if (e->recs[i].live && e->recs[i].id == id) {
            e->recs[i].cancelled = true;
            found = true;
        }
    }
    return found;
}

bool kg_engine_cancel_choice(kg_engine_t *e, uint64_t id, int32_t choice) {
    for (int32_t i = 0; i < e->n_recs; i++) {
        if (e->recs[i].live && e->recs[i].id == id && e->recs[i].choice == choice) {
            e->recs[i].cancelled = true;
            return true;
        }
    }
    return false;
}

// ---- queries ----

bool kg_engine_busy(const kg_engine_t *e) {
    return e->n_wait > 0 || e->n_run > 0 || e->n_done > 0;
}

void kg_engine_stats(const kg_engine_t *e, kg_engine_stats_t *out) {
    *out = e->st;
    out->n_waiting = e->n_wait;
    out->n_running = e->n_run;
    out->kv_blocks_total = kg_kv_n_total(e->kv);
    out->kv_blocks_used = kg_kv_n_used(e->kv);
    out->kv_blocks_cached = kg_kv_n_cached(e->kv);
    kg_backend_memory_t mem = {0};
    kg_backend_memory(e->be, &mem);
    const int64_t kv_rows = (int64_t)e->p.n_kv_blocks * e->p.kv_block_size;
    out->kv_bytes_per_token = kv_rows > 0 ? (int64_t)mem.kv_size / kv_rows : 0;
    out->state_bytes = (int64_t)mem.state_size;
    out->snapshot_bytes = (int64_t)mem.snapshot_size;
    out->weight_bytes = (int64_t)mem.weights_size;
    kg_backend_moe_stats(e->be, &out->moe);
}

kg_engine_params_t kg_engine_params_default(const kg_model_t *model, size_t kv_memory_size) {
    kg_engine_params_t p;
    memset(&p, 0, sizeof(p));
    p.max_batch_size = 16;
    p.max_queue_depth = 256;
    p.max_batch_tokens = 512;
    p.max_seq_len =
        model->hp.n_ctx_train > 0 && model->hp.n_ctx_train < 4096 ? model->hp.n_ctx_train : 4096;
    p.kv_block_size = 16;
    p.prefix_cache = true;
    p.n_vocab = model->hp.n_vocab;
    p.kv_window = kg_model_kv_window(model);
    p.n_embd = model->hp.n_embd;
    p.non_causal = kg_model_non_causal(model);
    size_t n_blocks;
    if (kv_memory_size > 0) {
        size_t block_bytes =
            kg_backend_kv_bytes_per_token(model, KG_KV_F16) * (size_t)p.kv_block_size;
        n_blocks = block_bytes > 0 ? kv_memory_size / block_bytes : 0;
    } else {
        size_t n_tok = (size_t)p.max_batch_size * (size_t)p.max_seq_len;
        n_blocks = (n_tok + (size_t)p.kv_block_size - 1) / (size_t)p.kv_block_size;
    }
    p.n_kv_blocks = n_blocks > (size_t)(1 << 28) ? (1 << 28) : (int32_t)n_blocks;
    if (model->tok) {
        for (int32_t id = 0; id < p.n_vocab && p.n_eog < KG_MAX_EOG; id++) {
            if (kg_tokenizer_is_eog(model->tok, id)) {
                p.eog[p.n_eog++] = id;
            }
        }
    }
    return p;
}
