/* kg_embedjob: embed, rerank and score jobs (see kg_embedjob.h). */
#include "kg_embedjob.h"

#include "../engine/kg_engine.h"
#include "../model/kg_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing token array. */
typedef struct toks {
    int32_t *v;
    int64_t n, cap;
} toks_t;

static bool toks_room(toks_t *t, int64_t more) {
    if (t->n + more <= t->cap) {
        return true;
    }
    int64_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + more) {
        cap *= 2;
    }
    if (cap > INT32_MAX) {
        return false;
    }
    int32_t *v = realloc(t->v, (size_t)cap * sizeof(int32_t));
    if (!v) {
        return false;
    }
    t->v = v;
    t->cap = cap;
    return true;
}

static kg_status_t push_tok(toks_t *t, int32_t id) {
    if (!toks_room(t, 1)) {
        return KG_ERR_NOMEM;
    }
    t->v[t->n++] = id;
    return KG_OK;
}

/* Append the tokens of `len` bytes of text. */
static kg_status_t push_text(
    toks_t *t, const kg_tokenizer_t *tok, const char *s, size_t len, bool add_special, bool parse) {
    int64_t need = (int64_t)len + 16;
    if (!toks_room(t, need)) {
        return KG_ERR_NOMEM;
    }
    int64_t n = kg_tokenizer_encode(tok, s, len, add_special, parse, t->v + t->n, t->cap - t->n);
    if (n > t->cap - t->n) {
        if (!toks_room(t, n)) {
            return KG_ERR_NOMEM;
        }
        n = kg_tokenizer_encode(tok, s, len, add_special, parse, t->v + t->n, t->cap - t->n);
    }
    if (n < 0) {
        return KG_ERR_INVALID;
    }
    t->n += n;
    return KG_OK;
}

static kg_status_t push_ids(toks_t *t, const kg_job_input_t *in) {
    if (in->n_tokens <= 0) {
        return KG_OK;
    }
    if (!toks_room(t, in->n_tokens)) {
        return KG_ERR_NOMEM;
    }
    memcpy(t->v + t->n, in->tokens, (size_t)in->n_tokens * sizeof(int32_t));
    t->n += in->n_tokens;
    return KG_OK;
}

/* Replace every "{key}" of `tpl` with `val`, appending to a malloc'ed string. */
static char *fill_template(const char *tpl, const kg_job_input_t *q, const kg_job_input_t *d) {
    size_t cap = strlen(tpl) + 1, n = 0;
    for (const char *p = tpl; (p = strchr(p, '{')) != NULL; p++) {
        cap += q->len + d->len; /* at most once each per brace: enough */
    }
    char *out = malloc(cap);
    if (!out) {
        return NULL;
    }
    for (const char *p = tpl; *p;) {
        const kg_job_input_t *v = strncmp(p, "{query}", 7) == 0       ? q
                                  : strncmp(p, "{document}", 10) == 0 ? d
                                                                      : NULL;
        if (v) {
            memcpy(out + n, v->text, v->len);
            n += v->len;
            p += v == q ? 7 : 10;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return out;
}

/* One query/document pair as llama.cpp's server builds it (format_prompt_rerank). */
static kg_status_t push_pair(toks_t *t,
                             const kg_model_t *model,
                             const kg_job_input_t *q,
                             const kg_job_input_t *d,
                             char *msg,
                             size_t msg_size) {
    const kg_tokenizer_t *tok = model->tok;
    kg_status_t st;
    if (model->rerank_template) {
        if (!q->text || !d->text) {
            snprintf(msg, msg_size,
                     "this model ranks through its rerank template, which takes text, not token "
                     "ids");
            return KG_ERR_INVALID;
        }
        char *s = fill_template(model->rerank_template, q, d);
        if (!s) {
            return KG_ERR_NOMEM;
        }
        st = push_text(t, tok, s, strlen(s), false, true);
        free(s);
        return st;
    }
    /* EOS, or SEP where the vocabulary has no EOS (bert) */
    const int32_t eos = kg_tokenizer_eos(tok) >= 0 ? kg_tokenizer_eos(tok) : kg_tokenizer_sep(tok);
    const bool add_eos = kg_tokenizer_add_eos(tok) && eos >= 0;
    if (kg_tokenizer_add_bos(tok) && kg_tokenizer_bos(tok) >= 0 &&
        (st = push_tok(t, kg_tokenizer_bos(tok))) != KG_OK) {
        return st;
    }
    st = q->text ? push_text(t, tok, q->text, q->len, false, false) : push_ids(t, q);
    if (st == KG_OK && add_eos) {
        st = push_tok(t, eos);
    }
    if (st == KG_OK && kg_tokenizer_add_sep(tok)) {
        st = push_tok(t, kg_tokenizer_sep(tok));
    }
    if (st == KG_OK) {
        st = d->text ? push_text(t, tok, d->text, d->len, false, false) : push_ids(t, d);
    }
    if (st == KG_OK && add_eos) {
        st = push_tok(t, eos);
    }
    return st;
}

kg_status_t kg_embedjob_prepare(const kg_model_t *model,
                                const kg_intake_limits_t *lim,
                                const kg_job_t *job,
                                kg_prepared_t *out,
                                kg_error_code_t *code,
                                char *msg,
                                size_t msg_size) {
    const bool rank = job->task != KG_TASK_EMBED;
    const char *field = job->task == KG_TASK_EMBED    ? "input"
                        : job->task == KG_TASK_RERANK ? "documents"
                                                      : "text_2";
    const int32_t max_inputs = lim->max_inputs > 0 ? lim->max_inputs : KG_JOB_MAX_INPUTS;
    int32_t max_len = lim->max_prompt_tokens > 0 && lim->max_prompt_tokens < lim->max_seq_len
                          ? lim->max_prompt_tokens
                          : lim->max_seq_len - 1;
    /* an encoder's positions end at its trained context (position_embd),
     * and a non-causal model's input runs whole in one step */
    if (kg_model_non_causal(model) && max_len > model->hp.n_ctx_train) {
        max_len = model->hp.n_ctx_train;
    }
    if (kg_model_non_causal(model) && lim->max_step_tokens > 0 && max_len > lim->max_step_tokens) {
        max_len = lim->max_step_tokens;
    }
    *code = KG_ERROR_INVALID_JOB;
    if (job->n_inputs > max_inputs) {
        snprintf(msg, msg_size, "%s: %d entries; this worker takes at most %d per job", field,
                 job->n_inputs, max_inputs);
        return KG_ERR_INVALID;
    }
    if (rank && !kg_embed_can_rank(model)) {
        snprintf(msg, msg_size,
                 "task %s: this model has no reranking head (a qwen3 or bert reranker "
                 "with cls.output.weight)",
                 job->task == KG_TASK_RERANK ? "rerank" : "score");
        return KG_ERR_INVALID;
    }
    if (job->dimensions > model->hp.n_embd) {
        snprintf(msg, msg_size, "dimensions: %d is more than the model's %d", job->dimensions,
                 model->hp.n_embd);
        return KG_ERR_INVALID;
    }
    out->pooling = rank                               ? KG_EMBED_POOL_RANK
                   : job->pooling != KG_POOLING_MODEL ? (int32_t)job->pooling
                                                      : kg_embed_model_pooling(model);
    if (!rank && out->pooling == KG_EMBED_POOL_RANK) {
        out->pooling = KG_EMBED_POOL_LAST; /* a reranker asked for embeddings: its hidden state */
    }
    out->input_len = malloc((size_t)job->n_inputs * sizeof(int32_t));
    if (!out->input_len) {
        return KG_ERR_NOMEM;
    }
    toks_t t = {0};
    kg_status_t st = KG_OK;
    for (int32_t i = 0; i < job->n_inputs && st == KG_OK; i++) {
        const kg_job_input_t *in = &job->inputs[i];
        const int64_t at = t.n;
        if (rank) {
            st = push_pair(&t, model, &job->query, in, msg, msg_size);
        } else {
            st = in->text ? push_text(&t, model->tok, in->text, in->len, true, true)
                          : push_ids(&t, in);
        }
        if (st == KG_ERR_INVALID && !msg[0]) {
            snprintf(msg, msg_size, "%s[%d]: could not be tokenized", field, (int)i);
        }
        const int64_t n = t.n - at;
        for (int64_t k = at; st == KG_OK && k < t.n; k++) {
            if (t.v[k] < 0 || t.v[k] >= model->hp.n_vocab) {
                snprintf(msg, msg_size, "%s[%d]: token %d is not in the vocabulary of %d", field,
                         (int)i, t.v[k], model->hp.n_vocab);
                st = KG_ERR_INVALID;
            }
        }
        if (st == KG_OK && n == 0) {
            snprintf(msg, msg_size, "%s[%d]: no tokens", field, (int)i);
            st = KG_ERR_INVALID;
        }
        if (st == KG_OK && n > max_len) {
            *code = KG_ERROR_PROMPT_TOO_LONG;
            snprintf(msg, msg_size, "%s[%d]: %lld tokens; this worker takes at most %d", field,
                     (int)i, (long long)n, max_len);
            st = KG_ERR_INVALID;
        }
        if (st == KG_OK) {
            out->input_len[i] = (int32_t)n;
        }
    }
    if (st != KG_OK) {
        /* a refused job leaves nothing to clear: callers answer it and drop `out` */
        free(t.v);
        free(out->input_len);
        out->input_len = NULL;
        return st;
    }
    out->tokens = t.v;
    out->n_tokens = (int32_t)t.n;
    out->n_inputs = job->n_inputs;
    out->max_tokens = 1;
    return KG_OK;
}

int kg_embedjob_engine_pool(const kg_model_t *model, int32_t pooling) {
    switch (pooling) {
    case KG_EMBED_POOL_MEAN:
        return KG_ENGINE_POOL_MEAN;
    case KG_EMBED_POOL_CLS:
        return KG_ENGINE_POOL_FIRST;
    case KG_EMBED_POOL_RANK: /* llama.cpp's rank reads the CLS row, the last for qwen3 */
        return model && kg_model_embed_only(model) ? KG_ENGINE_POOL_FIRST : KG_ENGINE_POOL_LAST;
    default: /* last */
        return KG_ENGINE_POOL_LAST;
    }
}

static int by_score(const void *a, const void *b) {
    const kg_rank_result_t *x = a, *y = b;
    if (x->relevance_score != y->relevance_score) {
        return x->relevance_score < y->relevance_score ? 1 : -1;
    }
    return x->index - y->index; /* ties keep the documents' order */
}

char *kg_embedjob_terminal(const kg_model_t *model,
                           const kg_job_t *job,
                           const kg_prepared_t *prep,
                           const float *pooled,
                           const kg_event_origin_t *o,
                           const kg_job_timing_t *t,
                           size_t max_bytes,
                           size_t *len,
                           bool *is_error,
                           kg_events_fit_t *fit) {
    const int32_t E = model->hp.n_embd, n = prep->n_inputs;
    kg_events_answer_t a = {0};
    kg_rank_result_t *res = NULL;
    *is_error = false;
    /* the engine's rows stay as they are: a terminal event made twice is the same */
    float *rows = malloc((size_t)(n > 0 ? n : 1) * (size_t)E * sizeof(float));
    if (!rows) {
        return NULL;
    }
    memcpy(rows, pooled, (size_t)n * (size_t)E * sizeof(float));
    if (job->task == KG_TASK_EMBED) {
        int32_t dim = E;
        for (int32_t i = 0; i < n; i++) {
            if (!kg_embed_dense(model, rows + (size_t)i * (size_t)E)) {
                free(rows);
                return NULL;
            }
            dim = kg_embed_finish(rows + (size_t)i * (size_t)E, E, job->dimensions, job->normalize);
        }
        /* rows cut to `dim` are packed so the codec reads (n, dim) */
        for (int32_t i = 1; dim < E && i < n; i++) {
            memmove(rows + (size_t)i * (size_t)dim, rows + (size_t)i * (size_t)E,
                    (size_t)dim * sizeof(float));
        }
        a = (kg_events_answer_t){.embd = rows, .n_embd = n, .dim = dim};
    } else {
        res = malloc((size_t)(n > 0 ? n : 1) * sizeof(*res));
        if (!res) {
            free(rows);
            return NULL;
        }
        for (int32_t i = 0; i < n; i++) {
            res[i].index = i;
            res[i].relevance_score = kg_embed_rank_score(model, rows + (size_t)i * (size_t)E);
        }
        int32_t keep = n;
        if (job->task == KG_TASK_RERANK) {
            qsort(res, (size_t)n, sizeof(*res), by_score);
            keep = job->top_n > 0 && job->top_n < n ? job->top_n : n;
        }
        a = (kg_events_answer_t){.results = res, .n_results = keep};
    }
    bool too_big = false;
    char *json = kg_events_done_answer(o, job, &a, t, max_bytes, len, fit, &too_big);
    if (too_big) {
        char m[320];
        snprintf(m, sizeof(m),
                 "the answer (%d %s, %zu bytes as an event) does not fit the %zu bytes an event "
                 "may carry here (max-event-bytes); ask for fewer inputs per job%s",
                 a.embd ? a.n_embd : a.n_results, a.embd ? "vectors" : "results", *len, max_bytes,
                 a.embd ? ", fewer dimensions or encoding_format \"base64\" (about half the size)"
                        : "");
        *is_error = true;
        json = kg_events_error(o, job->request_id, KG_ERROR_INVALID_JOB, m, job->metadata_json,
                               max_bytes, len, fit);
    }
    free(res);
    free(rows);
    return json;
}
