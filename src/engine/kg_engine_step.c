/* kg_engine_step: one step of the continuous-batching scheduler (see
 * kg_engine.h for the design and the completion convention): expire
 * deadlines, reserve KV blocks for the running sequences (preempting the
 * newest when the pool runs short), admit waiting requests into the rest of
 * the token budget, fork the choices of a request whose prompt is done, run
 * the forward pass, then sample, constrain and finish each row and report
 * the completions. The engine's state is in kg_engine_int.h. */
#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "kg_engine_int.h"
#include "kg_kv.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- finishing and preempting ----

static void report(kg_engine_t *e,
                   const kg_seq_t *seq,
                   int32_t token,
                   kg_finish_t finish,
                   const kg_sample_result_t *sample) {
    kg_completion_t *c = &e->done[e->n_done++];
    c->id = seq->id;
    c->choice = seq->choice;
    c->token = token;
    c->finish = finish;
    c->n_prompt = seq->n_prompt;
    c->n_cached = seq->n_cached;
    int32_t n_output = seq->n_tokens - seq->n_prompt;
    c->index = token >= 0 ? n_output - 1 : n_output;
    if (sample) {
        c->sample = *sample;
    } else {
        memset(&c->sample, 0, sizeof(c->sample));
        c->sample.token = -1;
    }
}

static void free_record(kg_engine_t *e, int32_t r) {
    e->recs[r].live = false;
    kg_grammar_unref(e->recs[r].grammar); /* the matcher stays with the record */
    e->recs[r].grammar = NULL;
    e->free_recs[e->n_free_recs++] = r;
}

/* A leader that ends before its fork ends its waiting choices with it. */
static void end_pending(kg_engine_t *e, int32_t r, kg_finish_t finish) {
    for (int32_t f = 0; f < e->n_recs && e->recs[r].n_pending > 0; f++) {
        if (e->recs[f].live && e->recs[f].leader == r) {
            e->recs[r].n_pending--;
            report(e, &e->recs[f], -1, finish, NULL);
            free_record(e, f);
        }
    }
}

/* Give back the slot and blocks of run[i] and take it off the run list. */
static void unschedule(kg_engine_t *e, int32_t i) {
    kg_seq_t *seq = &e->recs[e->run[i]];
    e->n_reserved_slots -= seq->n_reserved; /* a leader preempted or ended before its fork */
    seq->n_reserved = 0;
    kg_kv_seq_release(e->kv, seq->slot);
    e->free_slots[e->n_free_slots++] = seq->slot;
    seq->slot = -1;
    seq->n_sched = 0;
    kg_engine_run_remove_at(e, i);
}

static void finish_running(kg_engine_t *e, int32_t i, kg_finish_t finish) {
    int32_t r = e->run[i];
    report(e, &e->recs[r], -1, finish, NULL);
    unschedule(e, i);
    end_pending(e, r, finish);
    free_record(e, r);
}

static void preempt(kg_engine_t *e, int32_t i) {
    int32_t r = e->run[i];
    kg_seq_t *seq = &e->recs[r];
    unschedule(e, i);
    seq->n_computed = 0;
    seq->snap_at = 0;
    seq->front = true;
    kg_engine_wait_push_front(e, r);
    KG_LOG_DEBUG("engine", "preempted id=%llu tokens=%d", (unsigned long long)seq->id,
                 seq->n_tokens);
}

static kg_finish_t expiry(const kg_seq_t *seq, int64_t now) {
    if (seq->cancelled) {
        return KG_FINISH_CANCELLED;
    }
    if (seq->deadline_us > 0 && now >= seq->deadline_us) {
        return KG_FINISH_DEADLINE;
    }
    return KG_FINISH_NONE;
}

static bool is_eog(const kg_engine_t *e, int32_t tok) {
    for (int32_t i = 0; i < e->p.n_eog; i++) {
        if (e->p.eog[i] == tok) {
            return true;
        }
    }
    return false;
}

// ---- the step ----

/* Step phase 1: cancels and deadlines, running and waiting. */
static void expire(kg_engine_t *e) {
    int64_t now = e->now_us(e->now_ctx);
    for (int32_t i = 0; i < e->n_run;) {
        kg_finish_t f = expiry(&e->recs[e->run[i]], now);
        if (f != KG_FINISH_NONE) {
            finish_running(e, i, f);
        } else {
            i++;
        }
    }
    for (int32_t i = 0; i < e->n_wait;) {
        int32_t r = e->wait[i];
        kg_finish_t f = expiry(&e->recs[r], now);
        if (f != KG_FINISH_NONE) {
            report(e, &e->recs[r], -1, f, NULL);
            kg_engine_wait_remove_at(e, i);
            end_pending(e, r, f);
            free_record(e, r);
        } else {
            i++;
        }
    }
}

/* Step phase 2a: with a model whose every layer is windowed, give back
 * each running sequence's blocks that lie wholly before the window of the
 * first token it computes next: a long generation then holds about
 * kv_window / block_size blocks, not one per block_size tokens of it. */
static void drop_out_of_window(kg_engine_t *e) {
    const int32_t w = e->p.kv_window, bs = e->p.kv_block_size;
    if (w <= 0) {
        return;
    }
    for (int32_t i = 0; i < e->n_run; i++) {
        const kg_seq_t *seq = &e->recs[e->run[i]];
        const int32_t first = seq->n_computed - w + 1; /* first position still read */
        if (first >= bs) {
            kg_kv_seq_drop_front(e->kv, seq->slot, first / bs);
        }
    }
}

/* Step phase 2: a block for the next token of every running sequence,
 * oldest first. Returns whether anything was preempted. */
static bool reserve_blocks(kg_engine_t *e) {
    bool preempted = false;
    int32_t bs = e->p.kv_block_size;
    for (int32_t i = 0; i < e->n_run;) {
        kg_seq_t *seq = &e->recs[e->run[i]];
        int32_t need = (seq->n_tokens - 1) / bs + 1;
        bool gone = false;
        while (kg_kv_seq_n_blocks(e->kv, seq->slot) < need) {
            if (kg_kv_seq_grow(e->kv, seq->slot)) {
                continue;
            }
            if (e->n_run == 1) {
                /* Alone in a pool full of its own blocks: the context cannot
                 * grow here, ever. Waiting would hang. */
                finish_running(e, i, KG_FINISH_LENGTH);
                gone = true;
                break;
            }
            int32_t victim = e->n_run - 1;
            e->st.n_preemptions++;
            preempt(e, victim);
            preempted = true;
            if (victim == i) {
                gone = true;
                break;
            }
        }
        if (!gone) {
            i++;
        }
    }
    return preempted;
}

/* Where a sequence's computing stops for now: its tokens, or with a
 * recurrent model a leader's prompt but its last token until its choices
 * have forked (they copy the state from before that token). */
static int32_t compute_end(const kg_engine_t *e, const kg_seq_t *seq) {
    int32_t end =
        e->state && seq->n_pending > 0 && seq->n_prompt >= 2 ? seq->n_prompt - 1 : seq->n_tokens;
    /* a state to save at a shared prefix's end (kg_engine_state.c) */
    if (seq->snap_at > seq->n_computed && seq->snap_at < end) {
        end = seq->snap_at;
    }
    return end;
}

static int32_t schedule(kg_engine_t *e, int32_t r, int32_t n_max, int32_t nt, int32_t *n_rows) {
    kg_seq_t *seq = &e->recs[r];
    int32_t n = compute_end(e, seq) - seq->n_computed;
    if (n > n_max) {
        /* a non-causal input runs whole or waits for a step with room */
        n = e->p.non_causal && seq->embed ? 0 : n_max;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t pos = seq->n_computed + k;
        e->b_token[nt + k] = seq->tokens[pos];
        e->b_pos[nt + k] = pos;
        e->b_seq[nt + k] = seq->slot;
        e->b_want[nt + k] = !seq->embed && pos == seq->n_tokens - 1;
        e->b_hid[nt + k] =
            seq->embed &&
            (seq->pool == KG_ENGINE_POOL_MEAN || (seq->pool == KG_ENGINE_POOL_FIRST && pos == 0) ||
             (seq->pool == KG_ENGINE_POOL_LAST && pos == seq->n_tokens - 1));
        e->b_flash[nt + k] = seq->embed ? seq->n_tokens : 0;
    }
    if (n > 0 && !seq->embed && seq->n_computed + n == seq->n_tokens) {
        e->b_row_rec[(*n_rows)++] = r;
    }
    seq->n_sched = n;
    return n;
}

/* The common prefix of a and b, b's last token left to compute (its
 * logits are needed), in whole blocks. */
static int32_t shared_blocks_end(const kg_engine_t *e, const kg_seq_t *a, const kg_seq_t *b) {
    const int32_t n = a->n_tokens < b->n_tokens - 1 ? a->n_tokens : b->n_tokens - 1;
    int32_t c = 0;
    while (c < n && a->tokens[c] == b->tokens[c]) {
        c++;
    }
    return c / e->p.kv_block_size * e->p.kv_block_size;
}

/* A hybrid's sequence just admitted (n_computed tokens in): where the
 * waiting requests' prompts leave its own, past what it starts from, it
 * will stop its prefill and save its state (the nearest such point first),
 * so that they start there instead of computing the shared part again. */
static void plan_state_save(kg_engine_t *e, kg_seq_t *seq) {
    for (int32_t i = 0; i < e->n_wait; i++) {
        const kg_seq_t *w = &e->recs[e->wait[i]];
        if (w->lora_key != seq->lora_key || w->embed) {
            continue;
        }
        const int32_t c = shared_blocks_end(e, seq, w);
        if (c > seq->n_computed && (seq->snap_at <= seq->n_computed || c < seq->snap_at)) {
            seq->snap_at = c;
        }
    }
}

/* A hybrid's version (kg_engine_state.c): a running sequence that shares
 * more of w's prompt than w's saved state covers (hit blocks) and has not
 * passed the shared part's end: w waits, and that sequence stops there
 * and saves its state. */
static bool state_in_flight(kg_engine_t *e, const kg_seq_t *w, int32_t hit) {
    const int32_t bs = e->p.kv_block_size;
    for (int32_t i = 0; i < e->n_run; i++) {
        kg_seq_t *r = &e->recs[e->run[i]];
        if (r->lora_key != w->lora_key || r->embed) {
            continue;
        }
        const int32_t c = shared_blocks_end(e, r, w);
        if (c > hit * bs && r->n_computed < c) {
            if (r->snap_at <= r->n_computed || c < r->snap_at) {
                r->snap_at = c;
            }
            return true;
        }
    }
    return false;
}

/* Whether a running sequence is about to compute the block `w` would need
 * first (block `hit`, after those it finds cached) as part of the same
 * prefix. Then `w` is better off waiting a step or a few and taking those
 * blocks from the cache: jobs that share a system prompt compute it once,
 * not once per job admitted before the first copy was registered. The wait
 * ends when that sequence has passed the block or has left the batch. */
static bool prefix_in_flight(kg_engine_t *e, const kg_seq_t *w, int32_t hit) {
    if (e->state) {
        return e->n_snaps > 0 && state_in_flight(e, w, hit);
    }
    const int32_t bs = e->p.kv_block_size, end = (hit + 1) * bs;
    if (!e->p.prefix_cache || (w->n_tokens - 1) / bs <= hit) {
        return false; /* w could not take that block from the cache anyway */
    }
    for (int32_t i = 0; i < e->n_run; i++) {
        const kg_seq_t *r = &e->recs[e->run[i]];
        if (r->n_computed < end && r->n_tokens >= end && r->lora_key == w->lora_key &&
            memcmp(r->tokens, w->tokens, (size_t)end * sizeof(int32_t)) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether `seq` finds the slots (its own and one per choice waiting to
 * fork) and the blocks (those of its tokens the prefix cache does not
 * hold, a block per such choice, and the headroom when others run) to be
 * admitted now; *hit gets its cached leading blocks. */
static bool fits(kg_engine_t *e, kg_seq_t *seq, int32_t *hit) {
    const int32_t bs = e->p.kv_block_size;
    /* Leave at least the last token to compute: its logits are needed. An
     * embedding input computes all of them (its hidden states are not cached). */
    int32_t idle = 0;
    *hit = seq->embed ? 0
                      : kg_kv_match_key(e->kv, seq->lora_key, seq->tokens, (seq->n_tokens - 1) / bs,
                                        &idle);
    if (e->state) {
        /* a hybrid starts where a saved state does; cached blocks past it
         * prove a shared prefix: the sequence saves its state there */
        const int32_t kv_hit = *hit;
        seq->snap_use = *hit > 0 ? kg_engine_state_find(e, seq, *hit * bs, &seq->snap_tokens) : -1;
        *hit = seq->snap_use >= 0 ? seq->snap_tokens / bs : 0;
        seq->snap_at = kv_hit > *hit ? kv_hit * bs : 0;
    }
    const int32_t need = (seq->n_tokens - 1) / bs + 1;
    const int32_t headroom = e->n_run > 0 ? e->headroom : 0;
    const int32_t k = seq->n_pending;
    return e->n_free_slots - e->n_reserved_slots >= 1 + k &&
           need - *hit + headroom + k <= kg_kv_n_available(e->kv) - idle;
}

/* Step phase 2b: while the head of the queue does not fit and sequences of
 * a lower tier run, preempt the newest of the lowest of them (see
 * kg_engine.h). Before the batch is built, so no victim has a token in it. */
static void preempt_for_tier(kg_engine_t *e) {
    while (e->n_wait > 0) {
        const int32_t tier = e->recs[e->wait[0]].tier;
        int32_t victim = -1, hit;
        for (int32_t i = e->n_run - 1; i >= 0; i--) {
            const int32_t t = e->recs[e->run[i]].tier;
            if (t < tier && (victim < 0 || t < e->recs[e->run[victim]].tier)) {
                victim = i;
            }
        }
        /* (the cheap test first: with one tier this is all a step costs) */
        if (victim < 0 || fits(e, &e->recs[e->wait[0]], &hit)) {
            return;
        }
        e->st.n_tier_preemptions++;
        preempt(e, victim);
    }
}

/* Step phase 4: admit from the head of the queue while there is a slot,
 * token budget and blocks. Returns the new batch size. */
static int32_t admit(kg_engine_t *e, int32_t nt, int32_t *n_rows) {
    int32_t bs = e->p.kv_block_size;
    while (e->n_wait > 0 && e->n_free_slots > e->n_reserved_slots && nt < e->p.max_batch_tokens) {
        int32_t r = e->wait[0];
        kg_seq_t *seq = &e->recs[r];
        int32_t hit;
        int32_t need = (seq->n_tokens - 1) / bs + 1;
        /* choices waiting to fork: a slot and a block each, held from now */
        int32_t k = seq->n_pending;
        if (e->adapters && seq->lora.n > 0) {
            int ready = kg_engine_lora_ready(e, r);
            if (ready == 0) {
                break; /* the head waits for an adapter; nobody overtakes it */
            }
            if (ready < 0) {
                report(e, seq, -1, KG_FINISH_ERROR, NULL);
                kg_engine_wait_remove_at(e, 0);
                end_pending(e, r, KG_FINISH_ERROR);
                free_record(e, r);
                continue;
            }
        }
        if (!fits(e, seq, &hit) || (!seq->embed && prefix_in_flight(e, seq, hit))) {
            break; /* the head waits; nobody overtakes it */
        }
        seq->n_reserved = k;
        e->n_reserved_slots += k;
        int32_t slot = e->free_slots[--e->n_free_slots];
        seq->slot = slot;
        if (e->state && hit > 0 && !kg_engine_state_restore(e, seq, seq->snap_use)) {
            hit = 0; /* the backend could not: compute it all */
            seq->snap_at = 0;
        }
        kg_status_t st = kg_kv_seq_assign_key(e->kv, slot, seq->lora_key, seq->tokens, hit, need);
        KG_ASSERT(st == KG_OK);
        kg_engine_wait_remove_at(e, 0);
        e->run[e->n_run++] = r;
        seq->slot = slot;
        seq->front = false;
        seq->n_computed = hit * bs;
        if (seq->embed) {
            kg_engine_embed_admit(e, seq);
        } else if (e->state && e->n_snaps > 0) {
            plan_state_save(e, seq);
        }
        /* Recomputing a preempted sequence's tokens counts as prefill, but
         * its last token was sampled and never fed: that one is a decode. */
        seq->prefill_end = seq->n_tokens > seq->n_prompt ? seq->n_tokens - 1 : seq->n_tokens;
        if (!seq->admitted_once) {
            seq->admitted_once = true;
            seq->n_cached = hit * bs;
            e->st.n_prompt_tokens += seq->n_prompt;
            e->st.n_prefix_hit_tokens += (int64_t)hit * bs;
        }
        nt += schedule(e, r, e->p.max_batch_tokens - nt, nt, n_rows);
    }
    return nt;
}

/* The leader run[i] has computed its prompt: start its waiting choices
 * (see CHOICES in kg_engine.h). Their slots were held at admission. */
static void fork_choices(kg_engine_t *e, int32_t r) {
    kg_seq_t *lead = &e->recs[r];
    const int32_t bs = e->p.kv_block_size;
    const int32_t n_share = (lead->n_prompt - 1) / bs; /* full blocks before the last token's */
    const bool copy = kg_backend_has_kv_copy(e->be);
    /* a recurrent model forks from the state before the last prompt token
     * (compute_end), by copies only; a one-token prompt has no such state
     * apart from zero, and its choices start as requests */
    const bool state_fork = e->state && copy && lead->n_computed == lead->n_prompt - 1;
    int32_t n_copy = 0, n_state = 0;
    for (int32_t f = 0; f < e->n_recs && lead->n_pending > 0; f++) {
        kg_seq_t *seq = &e->recs[f];
        if (!seq->live || seq->leader != r) {
            continue;
        }
        seq->leader = -1;
        lead->n_pending--;
        lead->n_reserved--;
        e->n_reserved_slots--;
        if (seq->cancelled) {
            report(e, seq, -1, KG_FINISH_CANCELLED, NULL);
            free_record(e, f);
            continue;
        }
        int32_t slot = e->free_slots[--e->n_free_slots];
        int32_t src = -1, dst = -1;
        /* recomputing the copied block would read positions a windowed leader
         * may have given back already: then the choice starts as a request */
        if ((!copy && e->p.kv_window > 0) || (e->state && !state_fork) ||
            !kg_kv_seq_fork(e->kv, lead->slot, slot, n_share, &src, &dst)) {
            /* no block now: an ordinary request at the front of the queue */
            e->free_slots[e->n_free_slots++] = slot;
            seq->front = true;
            kg_engine_wait_push_front(e, f);
            continue;
        }
        seq->slot = slot;
        seq->admitted_once = true;
        seq->n_cached = lead->n_cached;
        /* with a copy only the last prompt token is left: a decode row of its
         * own; without, the copied block's tokens are recomputed (prefill) */
        seq->n_computed = copy ? lead->n_prompt - 1 : n_share * bs;
        seq->prefill_end = lead->n_prompt - 1;
        if (copy) {
            e->copy_src[n_copy] = src;
            e->copy_dst[n_copy++] = dst;
        }
        if (state_fork) {
            e->state_src[n_state] = lead->slot;
            e->state_dst[n_state++] = slot;
        }
        e->run[e->n_run++] = f;
        e->st.n_forks++;
    }
    if (n_state > 0 && kg_backend_state_copy(e->be, e->state_src, e->state_dst, n_state) != KG_OK) {
        /* the choices cannot continue a state they do not have: they
         * compute the prompt from position 0 (their blocks are theirs) */
        for (int32_t i = 0; i < e->n_run; i++) {
            kg_seq_t *seq = &e->recs[e->run[i]];
            if (seq->id == lead->id && seq != lead && seq->n_computed == lead->n_prompt - 1) {
                seq->n_computed = 0;
            }
        }
        n_copy = 0;
    }
    if (n_copy > 0 && kg_backend_kv_copy(e->be, e->copy_src, e->copy_dst, n_copy) != KG_OK) {
        /* the copies are not there: recompute those blocks instead (a dead
         * device fails the next forward anyway) */
        for (int32_t i = 0; i < e->n_run; i++) {
            kg_seq_t *seq = &e->recs[e->run[i]];
            if (seq->id == lead->id && seq != lead && seq->n_computed == lead->n_prompt - 1 &&
                seq->n_tokens == lead->n_prompt) {
                seq->n_computed = n_share * bs;
            }
        }
    }
}

/* Append a token to the output and report it; whether that ended the
 * sequence (max_tokens or the context). */
static bool
append_token(kg_engine_t *e, kg_seq_t *seq, int32_t tok, const kg_sample_result_t *res) {
    seq->tokens[seq->n_tokens++] = tok;
    kg_finish_t f = KG_FINISH_NONE;
    if (seq->n_tokens - seq->n_prompt >= seq->max_tokens || seq->n_tokens >= e->p.max_seq_len) {
        f = KG_FINISH_LENGTH;
    }
    report(e, seq, tok, f, res);
    return f != KG_FINISH_NONE;
}

/* A backend failure that is not device-wide: end the request(s) it touched
 * with KG_FINISH_ERROR (one sequence, or every request of the step) and
 * leave the rest to run again next step. in_step[i]: run[i] had tokens in
 * the failed batch. */
static void
fail_faulted(kg_engine_t *e, const kg_backend_fault_t *f, bool *in_step, int32_t n_rows) {
    int32_t only = -1; /* record of the one request the fault names */
    if (f->scope == KG_FAULT_SEQ && f->row >= 0 && f->row < n_rows) {
        only = e->b_row_rec[f->row];
    }
    for (int32_t i = 0; f->scope == KG_FAULT_SEQ && f->seq >= 0 && i < e->n_run; i++) {
        if (e->recs[e->run[i]].slot == f->seq) {
            only = e->run[i];
        }
    }
    for (int32_t i = 0; i < e->n_run;) {
        const int32_t r = e->run[i];
        if (only >= 0 ? r == only : in_step[i]) {
            KG_LOG_ERROR("engine", "request failed in the backend: %s id=%llu", f->message,
                         (unsigned long long)e->recs[r].id);
            finish_running(e, i, KG_FINISH_ERROR);
            memmove(in_step + i, in_step + i + 1, (size_t)(e->n_run - i) * sizeof(bool));
        } else {
            i++;
        }
    }
}

/* Append a token the matcher has just accepted; whether the sequence
 * ended. A token that completes the grammar ends it STOP (reported after
 * the token), even on its last allowed token: the document is whole. */
static bool
grammar_token(kg_engine_t *e, kg_seq_t *seq, int32_t tok, const kg_sample_result_t *res) {
    if (kg_matcher_is_done(seq->matcher)) {
        /* a running sequence has room for one more token (n_tokens < max_seq_len) */
        seq->tokens[seq->n_tokens++] = tok;
        report(e, seq, tok, KG_FINISH_NONE, res);
        report(e, seq, -1, KG_FINISH_STOP, NULL);
        return true;
    }
    return append_token(e, seq, tok, res);
}

/* Whether the sequence's next token is masked: a constrained sequence's
 * always (inside a thought only EOG is masked out, so that the answer the
 * grammar promises follows the thought). */
static bool masked(const kg_seq_t *seq) {
    return seq->grammar != NULL && !seq->lazy_wait;
}

/* Whether the grammar's forced tokens may be appended: not while a thought may still open. */
static bool jumps(const kg_engine_t *e, const kg_seq_t *seq) {
    return seq->grammar && !seq->lazy_wait && seq->think == KG_SEQ_THINK_ANSWER &&
           !e->p.no_jump_forward;
}

/* A token inside the thought: the budget spent, the sampled token gives
 * way to the closing tokens; else it is appended, and the thought ends when
 * the output ends with the closing tokens. Returns whether the sequence ended. */
static bool think_token(kg_engine_t *e, kg_seq_t *seq, int32_t tok, const kg_sample_result_t *res) {
    if (seq->think_budget >= 0 && seq->n_thought >= seq->think_budget) {
        seq->think = KG_SEQ_THINK_ANSWER;
        for (int32_t i = 0; i < seq->n_think_close; i++) {
            kg_sample_result_t fr = {.token = seq->think_close[i], .logprob = 0.0f, .n_top = 0};
            if (append_token(e, seq, fr.token, &fr)) {
                return true;
            }
        }
        return false;
    }
    bool ended = append_token(e, seq, tok, res);
    int32_t n = seq->n_think_close, n_out = seq->n_tokens - seq->n_prompt;
    bool closed = n_out >= n;
    for (int32_t i = 0; closed && i < n; i++) {
        closed = seq->tokens[seq->n_tokens - n + i] == seq->think_close[i];
    }
    if (closed) {
        seq->think = KG_SEQ_THINK_ANSWER;
    } else {
        seq->n_thought++;
    }
    return ended;
}

/* Whether the token `tok`, about to be appended to a lazy sequence, completes one of its text
 * triggers (kg_request_t.lazy_texts); if so the matcher has taken the text from the trigger's
 * feed point to the token's end. The window is the bytes before the token (back into the
 * prompt, as long as a trigger can reach) and the token's own; triggers are tried by where
 * they start, the first the grammar takes wins. */
static bool lazy_text_fires(kg_seq_t *seq, int32_t tok) {
    enum { BEFORE = KG_ENGINE_MAX_LAZY_TEXT - 1 };
    uint8_t win[BEFORE + KG_ENGINE_LAZY_TOKEN_ROOM];
    size_t tn;
    const uint8_t *tb = kg_grammar_token_bytes(seq->grammar, tok, &tn);
    if (tn == 0 || tn > KG_ENGINE_LAZY_TOKEN_ROOM) {
        return false;
    }
    memcpy(win + BEFORE, tb, tn);
    size_t w0 = BEFORE; /* the window's first byte: filled backwards from the token */
    for (int32_t i = seq->n_tokens - 1; i >= 0 && w0 > 0; i--) {
        size_t n;
        const uint8_t *b = kg_grammar_token_bytes(seq->grammar, seq->tokens[i], &n);
        size_t take = n < w0 ? n : w0;
        memcpy(win + w0 - take, b + n - take, take);
        w0 -= take;
    }
    const size_t end = BEFORE + tn;
    for (size_t at = w0; at < end; at++) {
        for (int32_t k = 0; k < seq->n_lazy_texts; k++) {
            size_t len = seq->lazy_len[k];
            /* it ends inside the token: earlier text was looked at with earlier tokens */
            if (at + len <= BEFORE || at + len > end ||
                memcmp(win + at, seq->lazy_text[k], len) != 0) {
                continue;
            }
            size_t from = at + seq->lazy_from[k];
            if (kg_matcher_accept_bytes(seq->matcher, win + from, end - from)) {
                return true;
            }
        }
    }
    return false;
}

/* Append a sampled token or finish; returns whether the sequence ended.
 * A constrained sequence advances its matcher, ends STOP when the grammar
 * is complete, and takes the forced tokens that follow (jump-forward);
 * inside a reasoning model's thought it is not constrained (think_token). */
static bool accept(kg_engine_t *e, int32_t r, const kg_sample_result_t *res) {
    kg_seq_t *seq = &e->recs[r];
    int32_t tok = res->token;
    /* a grammar's mask holds EOG only where it may end (and never with
     * ignore_eos), so an EOG token there is always the end */
    if ((!seq->ignore_eos || masked(seq)) && is_eog(e, tok)) {
        report(e, seq, -1, KG_FINISH_STOP, res);
        return true;
    }
    if (seq->think == KG_SEQ_THINK_START) {
        if (tok == seq->think_open) {
            seq->think = KG_SEQ_THINK_IN;
            return append_token(e, seq, tok, res);
        }
        seq->think = KG_SEQ_THINK_ANSWER; /* no thought: the answer starts here */
    }
    if (seq->think == KG_SEQ_THINK_IN) {
        return think_token(e, seq, tok, res);
    }
    bool fed = false; /* a text trigger fed the matcher this token's text */
    if (seq->lazy_wait) {
        fed = seq->n_lazy_texts > 0;
        if (fed ? !lazy_text_fires(seq, tok) : tok != seq->lazy_token) {
            return append_token(e, seq, tok, res);
        }
        seq->lazy_wait = false; /* triggered: the matcher takes the token below */
        if (seq->lazy_opens) {
            return append_token(e, seq, tok, res); /* or the next one */
        }
    }
    if (!seq->grammar) {
        return append_token(e, seq, tok, res);
    }
    kg_matcher_t *m = seq->matcher;
    if (!fed && !kg_matcher_accept(m, tok)) {
        /* the mask allowed it: a kgen bug, not the job's */
        KG_LOG_ERROR("engine", "grammar refused sampled token id=%llu token=%d",
                     (unsigned long long)seq->id, tok);
        report(e, seq, -1, KG_FINISH_ERROR, NULL);
        return true;
    }
    if (grammar_token(e, seq, tok, res)) {
        return true;
    }
    for (int32_t k = 0; k < KG_ENGINE_MAX_FORCED; k++) {
        int32_t f = jumps(e, seq) ? kg_matcher_forced(m) : -1;
        if (f < 0 || !kg_matcher_accept(m, f)) {
            break;
        }
        e->st.n_grammar_forced_tokens++;
        kg_sample_result_t fr = {.token = f, .logprob = 0.0f, .n_top = 0};
        if (grammar_token(e, seq, f, &fr)) {
            return true;
        }
    }
    return false;
}

/* Build the masks of this step's constrained rows (after the forward is
 * launched and before sampling: on a device backend they overlap). */
static void build_masks(kg_engine_t *e, int32_t n_rows) {
    for (int32_t row = 0; row < n_rows; row++) {
        kg_seq_t *seq = &e->recs[e->b_row_rec[row]];
        if (!masked(seq)) {
            continue;
        }
        int64_t t0 = now_ns();
        uint32_t *mask = e->masks + (size_t)row * (size_t)e->mask_words;
        if (seq->think == KG_SEQ_THINK_IN) {
            memset(mask, 0xff, (size_t)e->mask_words * sizeof(*mask));
            for (int32_t i = 0; i < e->p.n_eog; i++) {
                mask[e->p.eog[i] >> 5] &= ~(1u << (e->p.eog[i] & 31));
            }
            e->row_any[row] = true;
            continue;
        }
        bool any = kg_matcher_fill_mask(seq->matcher, mask);
        if (seq->think == KG_SEQ_THINK_START) {
            /* the first token may open the thought instead */
            mask[seq->think_open >> 5] |= 1u << (seq->think_open & 31);
            any = true;
        }
        if (kg_matcher_can_end(seq->matcher) && !seq->ignore_eos) {
            for (int32_t i = 0; i < e->p.n_eog; i++) {
                int32_t id = e->p.eog[i];
                mask[id >> 5] |= 1u << (id & 31);
            }
            any = any || e->p.n_eog > 0;
        }
        e->row_any[row] = any;
        int64_t dt = now_ns() - t0;
        e->st.n_grammar_masks++;
        e->st.grammar_mask_ns += dt;
        int64_t b = dt / 250;
        e->st.mask_hist[b < KG_ENGINE_MASK_HIST ? b : KG_ENGINE_MASK_HIST]++;
    }
}

static int32_t flush(kg_engine_t *e, kg_completion_t *out) {
    int32_t n = e->n_done;
    memcpy(out, e->done, (size_t)n * sizeof(*out));
    e->n_done = 0;
    return n;
}

int32_t kg_engine_max_completions(const kg_engine_t *e) {
    return e->max_done;
}

int32_t kg_engine_step(kg_engine_t *e, kg_completion_t *out, int32_t cap) {
    if (cap < e->max_done) {
        return KG_ERR_INVALID;
    }
    expire(e);
    drop_out_of_window(e);
    bool preempted = reserve_blocks(e);
    if (!preempted) {
        preempt_for_tier(e);
    }

    /* Phase 3: decode tokens first, then prefill chunks in admission order. */
    int32_t nt = 0, n_rows = 0, budget = e->p.max_batch_tokens;
    for (int32_t i = 0; i < e->n_run; i++) {
        kg_seq_t *seq = &e->recs[e->run[i]];
        seq->n_sched = 0;
        if (seq->n_tokens - seq->n_computed == 1) {
            nt += schedule(e, e->run[i], 1, nt, &n_rows);
        }
    }
    for (int32_t i = 0; i < e->n_run; i++) {
        kg_seq_t *seq = &e->recs[e->run[i]];
        if (seq->n_tokens - seq->n_computed > 1 && nt < budget) {
            nt += schedule(e, e->run[i], budget - nt, nt, &n_rows);
        }
    }
    /* A step that preempted is short of blocks: admitting now would only
     * preempt again. */
    if (!preempted) {
        nt = admit(e, nt, &n_rows);
    }
    if (nt == 0) {
        return flush(e, out);
    }

    /* each slot's adapters; none at all: NULL, the base's plain step */
    bool any_lora = false;
    for (int32_t i = 0; i < e->n_run; i++) {
        const kg_seq_t *seq = &e->recs[e->run[i]];
        if (seq->n_sched > 0) {
            e->b_lora[seq->slot] = seq->lora;
            any_lora = any_lora || seq->lora.n > 0;
            for (int32_t j = 0; e->adapters && j < seq->lora.n; j++) {
                kg_adapters_touch(e->adapters, seq->lora.id[j], e->st.n_steps);
            }
        }
    }
    int32_t n_hid = 0, n_flash = 0;
    for (int32_t t = 0; t < nt; t++) {
        n_hid += e->b_hid[t];
        n_flash += e->b_flash[t] > 0;
    }
    kg_step_batch_t batch = {
        .slot_lora = any_lora ? e->b_lora : NULL,
        .n_tokens = nt,
        .token = e->b_token,
        .pos = e->b_pos,
        .seq = e->b_seq,
        .want_logits = e->b_want,
        .n_outputs = n_rows,
        .n_slots = e->p.max_batch_size,
        .max_blocks_per_seq = e->max_blocks_per_seq,
        .block_table = kg_kv_block_table(e->kv),
        .want_hidden = n_hid > 0 ? e->b_hid : NULL,
        .n_hidden = n_hid,
        .hidden = e->hidden,
        .flash_len = n_flash > 0 ? e->b_flash : NULL,
    };
    kg_status_t st = kg_backend_forward(e->be, &batch, e->device_sample ? NULL : e->logits);
    /* A device backend that samples returns before its forward is done, so
     * the constrained rows' masks are built while the device computes. */
    if (st == KG_OK) {
        build_masks(e, n_rows);
    }
    if (st == KG_OK && e->device_sample && n_rows > 0) {
        /* only token ids (and logprobs) come back from the device */
        for (int32_t row = 0; row < n_rows; row++) {
            kg_seq_t *seq = &e->recs[e->b_row_rec[row]];
            /* a forced or stuck constrained row is not sampled: its draw comes
             * from a scratch RNG and is dropped */
            bool skip = masked(seq) && ((jumps(e, seq) && kg_matcher_forced(seq->matcher) >= 0) ||
                                        !e->row_any[row]);
            e->sreq[row] = (kg_sample_request_t){
                .params = &seq->sampling,
                .rng = skip ? &e->dummy_rng : &seq->rng,
                .prompt = seq->tokens,
                .n_prompt = seq->n_prompt,
                .output = seq->tokens + seq->n_prompt,
                .n_output = seq->n_tokens - seq->n_prompt,
                .mask = masked(seq) ? e->masks + (size_t)row * (size_t)e->mask_words : NULL};
            e->rng_save[row] = seq->rng;
        }
        st = kg_backend_sample(e->be, e->sreq, n_rows, e->sres);
        if (st != KG_OK) {
            /* the rows that were drawn draw the same again when the step reruns */
            for (int32_t row = 0; row < n_rows; row++) {
                e->recs[e->b_row_rec[row]].rng = e->rng_save[row];
            }
        }
    }
    if (st != KG_OK) {
        /* Nothing advanced; the next step schedules the same work again. */
        for (int32_t i = 0; i < e->n_run; i++) {
            e->b_in_step[i] = e->recs[e->run[i]].n_sched > 0;
            e->recs[e->run[i]].n_sched = 0;
        }
        kg_backend_fault_t f;
        kg_backend_last_fault(e->be, st, &f);
        if (f.scope == KG_FAULT_DEVICE) {
            KG_LOG_ERROR("engine", "forward failed: %s: %s tokens=%d", kg_status_str(st), f.message,
                         nt);
            return st < 0 ? (int32_t)st : (int32_t)KG_ERR_BACKEND;
        }
        fail_faulted(e, &f, e->b_in_step, n_rows);
        return flush(e, out);
    }
    e->st.n_steps++;
    e->st.last_batch_tokens = nt;
    if (n_hid > 0) {
        kg_engine_embed_collect(e, nt);
    }

    /* Phase 5: the K/V are in the cache now; register full blocks. */
    for (int32_t i = 0; i < e->n_run; i++) {
        kg_seq_t *seq = &e->recs[e->run[i]];
        if (seq->n_sched == 0) {
            continue;
        }
        int32_t from = seq->n_computed, to = from + seq->n_sched;
        int32_t n_prefill = to < seq->prefill_end ? to - from : seq->prefill_end - from;
        if (n_prefill < 0) {
            n_prefill = 0;
        }
        e->st.n_prefill_tokens += n_prefill;
        e->st.n_decode_tokens += seq->n_sched - n_prefill;
        seq->n_computed = to;
        seq->n_sched = 0;
        kg_kv_seq_commit(e->kv, seq->slot, seq->tokens, seq->n_computed);
        if (seq->snap_at > 0 && seq->n_computed == seq->snap_at) {
            kg_engine_state_save(e, seq); /* a shared prefix's end */
            seq->snap_at = 0;
        }
        if (seq->n_pending > 0 && seq->n_computed == compute_end(e, seq)) {
            fork_choices(e, e->run[i]);
        }
    }
    /* Embedding inputs whose every token is computed: pooled row out, done. */
    for (int32_t i = 0; i < e->n_run;) {
        kg_seq_t *seq = &e->recs[e->run[i]];
        if (seq->embed && seq->n_computed == seq->n_tokens) {
            const int32_t r = e->run[i];
            kg_engine_embed_finish(e, seq);
            report(e, seq, -1, KG_FINISH_STOP, NULL);
            unschedule(e, i);
            free_record(e, r);
        } else {
            i++;
        }
    }
    /* Sample every row, then end the finished sequences (the same step). */
    for (int32_t row = 0; row < n_rows; row++) {
        int32_t r = e->b_row_rec[row];
        kg_seq_t *seq = &e->recs[r];
        kg_sample_result_t res;
        const uint32_t *mask = NULL;
        bool ended = false;
        if (masked(seq)) {
            mask = e->masks + (size_t)row * (size_t)e->mask_words;
            int32_t forced = jumps(e, seq) ? kg_matcher_forced(seq->matcher) : -1;
            if (forced >= 0) {
                /* jump-forward at the start (or past the per-step limit) */
                e->st.n_grammar_forced_tokens++;
                res = (kg_sample_result_t){.token = forced, .logprob = 0.0f, .n_top = 0};
                ended = accept(e, r, &res);
                goto sampled;
            }
            if (!e->row_any[row]) {
                KG_LOG_WARN("engine", "grammar allows no token of this vocabulary id=%llu",
                            (unsigned long long)seq->id);
                report(e, seq, -1, KG_FINISH_GRAMMAR, NULL);
                ended = true;
                goto sampled;
            }
        }
        if (e->device_sample) {
            res = e->sres[row];
        } else {
            kg_sampler_sample_masked(
                &seq->sampling, &seq->rng, e->logits + (size_t)row * (size_t)e->p.n_vocab, mask,
                e->p.n_vocab, seq->tokens, seq->n_prompt, seq->tokens + seq->n_prompt,
                seq->n_tokens - seq->n_prompt, e->scratch, &res);
        }
        ended = accept(e, r, &res);
    sampled:
        if (ended) {
            for (int32_t i = 0; i < e->n_run; i++) {
                if (e->run[i] == r) {
                    unschedule(e, i);
                    break;
                }
            }
            free_record(e, r);
        }
    }
    return flush(e, out);
}
