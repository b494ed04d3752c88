/* kg_engine_embed: embedding requests in the engine (EMBEDDINGS in
 * kg_engine.h): submitting one sequence per input, gathering the hidden
 * rows each step returns into per-slot pooled rows, and writing a finished
 * input's row out. The scheduling itself is kg_engine_step.c's, which asks
 * here only for the parts that differ from a generation request. */
#include "kg_engine_int.h"

#include <stdlib.h>
#include <string.h>

/* The per-step buffers, on the first embedding request: an engine that
 * never runs one does not pay for them. */
static kg_status_t ensure_buffers(kg_engine_t *e) {
    if (e->hidden) {
        return KG_OK;
    }
    const size_t E = (size_t)e->p.n_embd;
    e->hidden = malloc((size_t)e->p.max_batch_tokens * E * sizeof(float));
    e->pool_acc = malloc((size_t)e->p.max_batch_size * E * sizeof(float));
    if (!e->hidden || !e->pool_acc) {
        free(e->hidden);
        free(e->pool_acc);
        e->hidden = e->pool_acc = NULL;
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

kg_status_t kg_engine_embed_submit(kg_engine_t *e, const kg_request_t *req) {
    const kg_engine_params_t *p = &e->p;
    const int32_t n = req->n_inputs;
    if (p->n_embd <= 0 || !kg_backend_has_hidden(e->be)) {
        return KG_ERR_UNSUPPORTED;
    }
    /* more inputs than the queue holds could never all be queued */
    if (n < 0 || n > p->max_queue_depth || !req->input_len || !req->embd || !req->prompt ||
        req->tier < 0 || (unsigned)req->pool > KG_ENGINE_POOL_LAST) {
        return KG_ERR_INVALID;
    }
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t len = req->input_len[i];
        if (len < 1 || len >= p->max_seq_len || (p->non_causal && len > p->max_batch_tokens) ||
            (len + p->kv_block_size - 1) / p->kv_block_size > p->n_kv_blocks) {
            return KG_ERR_INVALID;
        }
        total += len;
    }
    if (total != req->n_prompt) {
        return KG_ERR_INVALID;
    }
    for (int32_t i = 0; i < req->n_prompt; i++) {
        if (req->prompt[i] < 0 || req->prompt[i] >= p->n_vocab) {
            return KG_ERR_INVALID;
        }
    }
    for (int32_t i = 0; i < e->n_recs; i++) {
        if (e->recs[i].live && e->recs[i].id == req->id) {
            return KG_ERR_INVALID;
        }
    }
    if (e->n_wait + n > p->max_queue_depth || e->n_free_recs < n) {
        return KG_QUEUE_FULL;
    }
    if (ensure_buffers(e) != KG_OK) {
        return KG_ERR_NOMEM;
    }
    const int32_t *tok = req->prompt;
    for (int32_t i = 0; i < n; i++) {
        const int32_t r = e->free_recs[--e->n_free_recs];
        kg_seq_t *seq = &e->recs[r];
        int32_t *tokens = seq->tokens;
        kg_logit_bias_t *bias = seq->bias;
        kg_matcher_t *matcher = seq->matcher;
        memset(seq, 0, sizeof(*seq));
        seq->tokens = tokens;
        seq->bias = bias;
        seq->matcher = matcher;
        seq->live = true;
        seq->id = req->id;
        seq->priority = req->priority;
        seq->tier = req->tier;
        seq->deadline_us = req->deadline_us;
        seq->max_tokens = 1;
        seq->sampling.logit_bias = bias;
        memcpy(seq->tokens, tok, (size_t)req->input_len[i] * sizeof(*tok));
        tok += req->input_len[i];
        seq->n_prompt = seq->n_tokens = req->input_len[i];
        seq->slot = -1;
        seq->choice = i;
        seq->leader = -1;
        seq->embed = true;
        seq->pool = req->pool;
        seq->embd_out = req->embd + (size_t)i * (size_t)p->n_embd;
        kg_engine_wait_insert(e, r);
    }
    e->n_submitted++;
    return KG_OK;
}

void kg_engine_embed_admit(kg_engine_t *e, const kg_seq_t *seq) {
    const size_t E = (size_t)e->p.n_embd;
    memset(e->pool_acc + (size_t)seq->slot * E, 0, E * sizeof(float));
}

void kg_engine_embed_collect(kg_engine_t *e, int32_t nt) {
    const size_t E = (size_t)e->p.n_embd;
    int32_t row = 0;
    /* Only the positions a sequence's pooling reads are wanted, so every row
     * is added to its slot's sum, which admission set to zero: a mean sums
     * them in position order (tokens of a slot come in that order, step after
     * step), whatever the chunking; cls and last add their one row to 0. */
    for (int32_t t = 0; t < nt; t++) {
        if (!e->b_hid[t]) {
            continue;
        }
        const float *h = e->hidden + (size_t)row++ * E;
        float *acc = e->pool_acc + (size_t)e->b_seq[t] * E;
        for (size_t k = 0; k < E; k++) {
            acc[k] += h[k];
        }
    }
}

void kg_engine_embed_finish(kg_engine_t *e, kg_seq_t *seq) {
    const size_t E = (size_t)e->p.n_embd;
    const float *acc = e->pool_acc + (size_t)seq->slot * E;
    if (seq->pool == KG_ENGINE_POOL_MEAN) {
        /* llama.cpp's mean multiplies by 1/n (its inp_mean) */
        const float inv = 1.0f / (float)seq->n_tokens;
        for (size_t k = 0; k < E; k++) {
            seq->embd_out[k] = acc[k] * inv;
        }
    } else {
        memcpy(seq->embd_out, acc, E * sizeof(float));
    }
}
