/* kg_jobrun: from completions to events, once for every program. */
#include "kg_jobrun.h"

#include "../core/kg_clock.h"
#include "kg_embedjob.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kg_status_t kg_jobrun_start(kg_jobrun_t *r,
                            const kg_model_t *model,
                            const kg_intake_limits_t *lim,
                            kg_job_t *job,
                            int64_t now_ms,
                            int64_t taken_us,
                            kg_error_code_t *code,
                            char *msg,
                            size_t msg_size) {
    memset(r, 0, sizeof(*r));
    r->job = job;
    r->t.taken_us = taken_us;
    kg_status_t st = kg_intake_prepare(model, lim, job, now_ms, &r->prep, code, msg, msg_size);
    if (st != KG_OK) {
        return st;
    }
    if (r->prep.lora.n > 0) {
        r->loras = lim->loras;
        kg_loras_count(r->loras, &r->prep.lora, 1, 0);
    }
    r->model = model;
    r->n_choices = r->prep.n_inputs > 0 ? r->prep.n_inputs : job->n > 1 ? job->n : 1;
    if (r->prep.n_inputs > 0) {
        r->embd = malloc((size_t)r->prep.n_inputs * (size_t)model->hp.n_embd * sizeof(float));
        if (!r->embd) {
            return KG_ERR_NOMEM;
        }
    }
    r->choices = calloc((size_t)r->n_choices, sizeof(*r->choices));
    if (!r->choices) {
        r->n_choices = 0;
        return KG_ERR_NOMEM;
    }
    for (int32_t c = 0; c < r->n_choices; c++) {
        kg_jobrun_choice_t *ch = &r->choices[c];
        kg_output_init(&ch->out, model->tok, (const char *const *)job->stop, job->n_stop);
        kg_output_keep(&ch->out, r->prep.keep, r->prep.n_keep);
        if (r->prep.think) {
            kg_output_think(&ch->out, r->prep.think_opened);
        } else if (kg_toolfmt_own_reasoning(r->prep.toolfmt) &&
                   job->reasoning_format != KG_REASONING_NONE) {
            /* gpt-oss, parsed (the done event splits its channels): they give the parts; with
             * reasoning_format none its analysis stays in the text, and tokens have no part */
            kg_output_harmony(&ch->out);
        }
        if (job->sampling.n_logprobs > 0 && r->prep.n_inputs == 0) {
            ch->samples = malloc((size_t)r->prep.max_tokens * sizeof(*ch->samples));
            if (!ch->samples) {
                return KG_ERR_NOMEM;
            }
        }
    }
    r->t.n_prompt = r->prep.n_tokens;
    return KG_OK;
}

void kg_jobrun_clear(kg_jobrun_t *r) {
    for (int32_t c = 0; c < r->n_choices; c++) {
        kg_output_clear(&r->choices[c].out);
        free(r->choices[c].samples);
    }
    free(r->choices);
    free(r->embd);
    kg_prepared_clear(&r->prep);
    kg_job_free(r->job);
    memset(r, 0, sizeof(*r));
}

kg_request_t kg_jobrun_request(const kg_jobrun_t *r, uint64_t id) {
    const kg_job_t *job = r->job;
    kg_request_t req = {.id = id,
                        .prompt = r->prep.tokens,
                        .n_prompt = r->prep.n_tokens,
                        .max_tokens = r->prep.max_tokens,
                        .priority = job->priority,
                        .ignore_eos = job->ignore_eos,
                        .sampling = job->sampling,
                        .grammar = r->prep.grammar, /* the engine takes its own reference */
                        .n_choices = r->n_choices,
                        .lora = r->prep.lora};
    if (r->prep.n_inputs > 0) {
        req.n_inputs = r->prep.n_inputs;
        req.input_len = r->prep.input_len;
        req.pool = (kg_engine_pool_t)kg_embedjob_engine_pool(r->model, r->prep.pooling);
        req.embd = r->embd;
        req.n_choices = 0;
    }
    req.lazy = r->prep.lazy;
    req.lazy_token = r->prep.lazy_token;
    req.lazy_opens = r->prep.lazy_opens;
    req.n_lazy_texts = r->prep.n_lazy_texts;
    for (int32_t i = 0; i < r->prep.n_lazy_texts; i++) {
        req.lazy_texts[i] = r->prep.lazy_texts[i];
        req.lazy_from[i] = r->prep.lazy_from[i];
    }
    /* the thought, for the engine: a budget to enforce, a grammar to defer */
    const kg_prepared_t *p = &r->prep;
    if ((p->think || job->has_thinking_budget) && p->n_think_close > 0) {
        req.think = p->think_opened            ? KG_THINK_REQ_OPEN
                    : p->think_open_token >= 0 ? KG_THINK_REQ_MAY_OPEN
                                               : KG_THINK_REQ_NONE;
        req.think_open = p->think_open_token;
        req.think_close = p->think_close;
        req.n_think_close = p->n_think_close;
        req.think_budget = job->has_thinking_budget ? job->thinking_token_budget : -1;
    }
    if (job->deadline_ms > 0) {
        req.deadline_us = kg_clock_us() + (job->deadline_ms - kg_clock_epoch_ms()) * 1000;
    }
    return req;
}

void kg_jobrun_submitted(kg_jobrun_t *r, int64_t now_us) {
    r->t.submitted_us = now_us;
}

/* Keep the samples of released token events for the done event. */
static void
keep_samples(kg_jobrun_t *r, kg_jobrun_choice_t *ch, const kg_output_event_t *evs, int n) {
    for (int i = 0; i < n && ch->samples && ch->n_samples < r->prep.max_tokens; i++) {
        ch->samples[ch->n_samples++] = evs[i].sample;
    }
}

kg_status_t kg_jobrun_on_completion(kg_jobrun_t *r,
                                    const kg_completion_t *c,
                                    int64_t ts_us,
                                    kg_jobrun_step_t *st) {
    memset(st, 0, sizeof(*st));
    if (c->choice < 0 || c->choice >= r->n_choices) {
        return KG_OK; /* not a choice of this job: nothing to do */
    }
    kg_jobrun_choice_t *ch = &r->choices[c->choice];
    st->choice = c->choice;
    /* after a stop string matched, the tokens the engine made before it saw
     * the cancel are not part of the output */
    if (c->token >= 0 && !ch->stop_hit && !r->cancelled) {
        if (!r->t.first_token_us) {
            r->t.first_token_us = ts_us;
            r->t.n_cached = c->n_cached;
        }
        if (r->loras) {
            kg_loras_count(r->loras, &r->prep.lora, 0, 1);
        }
        int n = kg_output_push(&ch->out, c->token, &c->sample, st->evs);
        if (n < 0) {
            return KG_ERR_NOMEM;
        }
        keep_samples(r, ch, st->evs, n);
        st->n_evs = n;
        if (kg_output_stopped(&ch->out)) {
            ch->stop_hit = true;
            st->cancel = c->finish == KG_FINISH_NONE;
        }
    }
    if (c->finish == KG_FINISH_NONE) {
        return KG_OK;
    }
    int n = kg_output_finish(&ch->out, st->evs + st->n_evs);
    keep_samples(r, ch, st->evs + st->n_evs, n);
    st->n_evs += n;
    st->cancel = false;
    ch->finish = c->finish;
    r->n_finished++;
    st->finished = r->n_finished == r->n_choices;
    if (st->finished) {
        r->t.finished_us = ts_us;
    }
    return KG_OK;
}

char *kg_jobrun_token_event(const kg_jobrun_t *r,
                            const kg_jobrun_step_t *st,
                            int i,
                            const kg_event_origin_t *o,
                            const kg_tokenizer_t *tok,
                            size_t max_bytes,
                            size_t *len,
                            kg_events_fit_t *fit) {
    return kg_events_token(o, tok, r->job, st->choice, &r->choices[st->choice].out, &st->evs[i],
                           max_bytes, len, fit);
}

int32_t kg_jobrun_n_generated(const kg_jobrun_t *r) {
    int32_t n = 0;
    for (int32_t c = 0; c < r->n_choices; c++) {
        n += r->choices[c].out.n_tokens;
    }
    return n;
}

bool kg_jobrun_finish_seen(kg_jobrun_t *r, const kg_completion_t *c) {
    if (c->finish != KG_FINISH_NONE) {
        r->n_finished++;
    }
    return r->n_finished >= r->n_choices;
}

static kg_finish_reason_t reason_of(const kg_jobrun_choice_t *ch) {
    return ch->stop_hit                   ? KG_FINISH_REASON_STOP_SEQUENCE
           : ch->finish == KG_FINISH_STOP ? KG_FINISH_REASON_STOP
                                          : KG_FINISH_REASON_LENGTH;
}

static char *done_event(const kg_jobrun_t *r,
                        const kg_event_origin_t *o,
                        const kg_tokenizer_t *tok,
                        size_t max_bytes,
                        size_t *len,
                        kg_events_fit_t *fit) {
    kg_events_choice_t ch[KG_JOB_MAX_N];
    for (int32_t c = 0; c < r->n_choices && c < KG_JOB_MAX_N; c++) {
        const kg_jobrun_choice_t *x = &r->choices[c];
        ch[c] = (kg_events_choice_t){.out = &x->out,
                                     .reason = reason_of(x),
                                     .samples = x->samples,
                                     .n_samples = x->n_samples,
                                     .toolfmt = r->prep.toolfmt};
    }
    return kg_events_done_choices(o, tok, r->job, ch, r->n_choices, &r->t, max_bytes, len, fit);
}

char *kg_jobrun_terminal(const kg_jobrun_t *r,
                         const kg_event_origin_t *o,
                         const kg_tokenizer_t *tok,
                         size_t max_bytes,
                         size_t *len,
                         kg_jobrun_outcome_t *outcome) {
    memset(outcome, 0, sizeof(*outcome));
    const kg_job_t *job = r->job;
    if (r->cancelled) {
        /* a user's cancel wins over a finish the engine reached before it
         * saw the cancel: the output stopped at the cancel */
        outcome->is_error = true;
        outcome->code = KG_ERROR_CANCELLED;
        char msg[96];
        snprintf(msg, sizeof(msg), "the job was cancelled after %d tokens",
                 kg_jobrun_n_generated(r));
        size_t tlen = 0;
        const char *text = r->n_choices > 0 ? kg_output_text(&r->choices[0].out, &tlen) : NULL;
        return kg_events_error_text(o, job->request_id, outcome->code, msg, job->metadata_json,
                                    text ? text : "", text ? tlen : 0, max_bytes, len,
                                    &outcome->fit);
    }
    /* a choice that ran out of time, failed in the backend, reached a dead
     * end of its grammar or was cancelled (not by its stop string) leaves
     * the job without a result; a deadline names the error, else the last
     * backend failure or dead end, else the cancel */
    kg_finish_t failed = KG_FINISH_NONE;
    for (int32_t c = 0; c < r->n_choices; c++) {
        const kg_jobrun_choice_t *ch = &r->choices[c];
        bool ok = ch->stop_hit || ch->finish == KG_FINISH_STOP || ch->finish == KG_FINISH_LENGTH;
        if (ok || failed == KG_FINISH_DEADLINE) {
            continue;
        }
        if (ch->finish == KG_FINISH_DEADLINE || ch->finish == KG_FINISH_ERROR ||
            ch->finish == KG_FINISH_GRAMMAR) {
            failed = ch->finish;
        } else if (failed == KG_FINISH_NONE) {
            failed = KG_FINISH_CANCELLED;
        }
    }
    if (failed == KG_FINISH_NONE && r->prep.n_inputs > 0) {
        outcome->reason = KG_FINISH_REASON_STOP;
        char *json = kg_embedjob_terminal(r->model, job, &r->prep, r->embd, o, &r->t, max_bytes,
                                          len, &outcome->is_error, &outcome->fit);
        outcome->code = KG_ERROR_INVALID_JOB;
        return json;
    }
    if (failed == KG_FINISH_NONE) {
        outcome->reason = reason_of(&r->choices[0]);
        /* logprobs of a long output, a large metadata echo or a long text can
         * outgrow a message: the done event sheds them rather than not go */
        return done_event(r, o, tok, max_bytes, len, &outcome->fit);
    }
    outcome->is_error = true;
    const char *msg;
    if (failed == KG_FINISH_DEADLINE) {
        outcome->code = KG_ERROR_EXPIRED;
        msg = "the deadline passed before the job finished";
    } else if (failed == KG_FINISH_ERROR) {
        /* the backend could not run this job; the worker and its other jobs go on */
        outcome->code = KG_ERROR_INTERNAL;
        msg = "the backend failed on this job (the worker log has the reason)";
    } else if (failed == KG_FINISH_GRAMMAR) {
        /* not a done event: its text would not match the constraint it asked for */
        outcome->code = KG_ERROR_INVALID_SCHEMA;
        msg = "the output cannot satisfy the job's constraint: no token of this model's "
              "vocabulary continues it (the token events have the text so far)";
    } else {
        outcome->code = KG_ERROR_CANCELLED;
        msg = "the job was cancelled";
    }
    return kg_events_error(o, job->request_id, outcome->code, msg, job->metadata_json, max_bytes,
                           len, &outcome->fit);
}

bool kg_jobrun_cancel(kg_jobrun_t *r) {
    if (r->cancelled) {
        return false;
    }
    bool live = false; /* a choice still making tokens that count */
    for (int32_t c = 0; c < r->n_choices; c++) {
        live |= !r->choices[c].stop_hit && r->choices[c].finish == KG_FINISH_NONE;
    }
    if (!live) {
        return false;
    }
    r->cancelled = true;
    return true;
}

void kg_jobrun_end_cancelled(kg_jobrun_t *r, int64_t now_us) {
    for (int32_t c = 0; c < r->n_choices; c++) {
        if (r->choices[c].finish == KG_FINISH_NONE) {
            r->choices[c].finish = KG_FINISH_CANCELLED;
        }
    }
    r->n_finished = r->n_choices;
    r->t.finished_us = now_us;
}

char *kg_jobrun_refused(const kg_jobrun_t *r,
                        const kg_event_origin_t *o,
                        kg_status_t status,
                        size_t max_bytes,
                        size_t *len,
                        kg_jobrun_outcome_t *outcome) {
    memset(outcome, 0, sizeof(*outcome));
    outcome->is_error = true;
    outcome->code = KG_ERROR_INTERNAL;
    char msg[160];
    if (status == KG_ERR_UNSUPPORTED && r->prep.n_inputs > 0) {
        /* a backend that returns no hidden states (kg_backend_has_hidden) */
        snprintf(msg, sizeof(msg),
                 "this worker's backend does not run embed, rerank or score jobs (the CPU "
                 "backend does)");
    } else {
        snprintf(msg, sizeof(msg), "the engine refused the request: %s", kg_status_str(status));
    }
    return kg_events_error(o, r->job->request_id, outcome->code, msg, r->job->metadata_json,
                           max_bytes, len, &outcome->fit);
}
