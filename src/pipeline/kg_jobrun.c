/* kg_jobrun: from completions to events, once for every program. */
#include "kg_jobrun.h"

#include "../core/kg_clock.h"

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
    kg_output_init(&r->out, model->tok, (const char *const *)job->stop, job->n_stop);
    r->t.n_prompt = r->prep.n_tokens;
    if (job->sampling.n_logprobs > 0) {
        r->samples = malloc((size_t)r->prep.max_tokens * sizeof(*r->samples));
        if (!r->samples) {
            return KG_ERR_NOMEM;
        }
    }
    return KG_OK;
}

void kg_jobrun_clear(kg_jobrun_t *r) {
    kg_output_clear(&r->out);
    kg_prepared_clear(&r->prep);
    kg_job_free(r->job);
    free(r->samples);
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
                        .grammar = r->prep.grammar}; /* the engine takes its own reference */
    if (job->deadline_ms > 0) {
        req.deadline_us = kg_clock_us() + (job->deadline_ms - kg_clock_epoch_ms()) * 1000;
    }
    return req;
}

void kg_jobrun_submitted(kg_jobrun_t *r, int64_t now_us) {
    r->t.submitted_us = now_us;
}

/* Keep the samples of released token events for the done event. */
static void keep_samples(kg_jobrun_t *r, const kg_output_event_t *evs, int n) {
    for (int i = 0; i < n && r->samples && r->n_samples < r->prep.max_tokens; i++) {
        r->samples[r->n_samples++] = evs[i].sample;
    }
}

kg_status_t kg_jobrun_on_completion(kg_jobrun_t *r,
                                    const kg_completion_t *c,
                                    int64_t ts_us,
                                    kg_jobrun_step_t *st) {
    memset(st, 0, sizeof(*st));
    /* after a stop string matched, the tokens the engine made before it saw
     * the cancel are not part of the output */
    if (c->token >= 0 && !r->stop_hit) {
        if (!r->t.first_token_us) {
            r->t.first_token_us = ts_us;
            r->t.n_cached = c->n_cached;
        }
        int n = kg_output_push(&r->out, c->token, &c->sample, st->evs);
        if (n < 0) {
            return KG_ERR_NOMEM;
        }
        keep_samples(r, st->evs, n);
        st->n_evs = n;
        if (kg_output_stopped(&r->out)) {
            r->stop_hit = true;
            st->cancel = c->finish == KG_FINISH_NONE;
        }
    }
    if (c->finish == KG_FINISH_NONE) {
        return KG_OK;
    }
    int n = kg_output_finish(&r->out, st->evs + st->n_evs);
    keep_samples(r, st->evs + st->n_evs, n);
    st->n_evs += n;
    st->cancel = false;
    st->finished = true;
    r->finish = c->finish;
    r->t.finished_us = ts_us;
    return KG_OK;
}

char *kg_jobrun_terminal(const kg_jobrun_t *r,
                         const kg_event_origin_t *o,
                         const kg_tokenizer_t *tok,
                         size_t max_bytes,
                         size_t *len,
                         kg_jobrun_outcome_t *outcome) {
    memset(outcome, 0, sizeof(*outcome));
    const kg_job_t *job = r->job;
    if (r->stop_hit || r->finish == KG_FINISH_STOP || r->finish == KG_FINISH_LENGTH) {
        kg_finish_reason_t reason = r->stop_hit                   ? KG_FINISH_REASON_STOP_SEQUENCE
                                    : r->finish == KG_FINISH_STOP ? KG_FINISH_REASON_STOP
                                                                  : KG_FINISH_REASON_LENGTH;
        outcome->reason = reason;
        /* logprobs of a long output, a large metadata echo or a long text can
         * outgrow a message: the done event sheds them rather than not go */
        return kg_events_done(o, tok, job, &r->out, reason, &r->t, r->samples, r->n_samples,
                              max_bytes, len, &outcome->fit);
    }
    outcome->is_error = true;
    const char *msg;
    if (r->finish == KG_FINISH_DEADLINE) {
        outcome->code = KG_ERROR_EXPIRED;
        msg = "the deadline passed before the job finished";
    } else if (r->finish == KG_FINISH_ERROR) {
        /* the backend could not run this job; the worker and its other jobs go on */
        outcome->code = KG_ERROR_INTERNAL;
        msg = "the backend failed on this job (the worker log has the reason)";
    } else {
        outcome->code = KG_ERROR_CANCELLED;
        msg = "the job was cancelled";
    }
    return kg_events_error(o, job->request_id, outcome->code, msg, job->metadata_json, max_bytes,
                           len, &outcome->fit);
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
    char msg[128];
    snprintf(msg, sizeof(msg), "the engine refused the request: %s", kg_status_str(status));
    return kg_events_error(o, r->job->request_id, outcome->code, msg, r->job->metadata_json,
                           max_bytes, len, &outcome->fit);
}
