/* kg_jobrun: one job's way from a decoded job to its terminal event, the
 * same for kgen-worker and `kgen batch`.
 *
 * DESIGN
 * Both programs take a decoded job, prepare it (kg_intake), hand the engine
 * a request, feed every completion the engine reports back here, and send
 * what comes out: token events (when streaming) and exactly one terminal
 * event (done or error). Everything between the engine's completions and
 * the encoded events lives in this module, so the two programs cannot
 * drift apart: which finish becomes which finish_reason or error code and
 * message, when a stop string cancels the request, which logprobs the done
 * event carries, and how an event too large for the transport is cut (the
 * byte budget and the shedding order of kg_events: logprobs, then the
 * metadata echo, then the end of the text; a job whose metadata alone is
 * over the budget is refused at intake).
 * The caller keeps what is its own: the transport (Kafka, a file), the
 * engine handle (direct or through the runner), metrics and logs.
 *
 * The done event carries per-token logprobs whenever the job asked for
 * them, streamed or not, so a reader of terminal events alone sees the same
 * result from either program.
 *
 * A job with n > 1 runs as n engine choices of one request: each choice has
 * its own output (text held back, stop strings, logprobs); a stop string
 * cancels that choice only; the job is over when every choice has finished,
 * and its done event carries all of them (kg_event_done_t.choices). A
 * deadline or cancel of any choice makes the job's terminal event that
 * error, as for n = 1. */
#pragma once

#include "../core/kg_status.h"
#include "../engine/kg_engine.h"
#include "../model/kg_model.h"
#include "../schema/kg_codec_event.h"
#include "../schema/kg_job.h"
#include "kg_events.h"
#include "kg_intake.h"
#include "kg_output.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One of the job's n completions. */
typedef struct kg_jobrun_choice {
    kg_output_t out;
    kg_sample_result_t *samples; /* (prep.max_tokens) logprobs for the done event, or NULL */
    int32_t n_samples;
    bool stop_hit;      /* a stop string matched; the choice was (to be) cancelled */
    kg_finish_t finish; /* the engine's finish, once the choice's last completion came */
} kg_jobrun_choice_t;

typedef struct kg_jobrun {
    kg_job_t *job; /* owned */
    kg_prepared_t prep;
    kg_job_timing_t t;
    kg_jobrun_choice_t *choices; /* (n_choices) = job->n, owned */
    int32_t n_choices;
    int32_t n_finished;      /* choices whose last completion came */
    bool cancelled;          /* a user's cancel (kg_jobrun_cancel): tokens after it are dropped */
    const kg_loras_t *loras; /* the limits' adapters: their counters (NULL: none) */
    /* embed, rerank and score jobs (kg_embedjob): one choice per input */
    const kg_model_t *model; /* borrowed */
    float *embd;             /* (prep.n_inputs, n_embd) the engine's pooled rows, owned */
} kg_jobrun_t;

/* What one completion produced. */
typedef struct kg_jobrun_step {
    int32_t choice;           /* the completion's choice */
    kg_output_event_t evs[3]; /* text released for token events, in index order */
    int n_evs;
    bool cancel;   /* a stop string matched while the choice runs: cancel that choice */
    bool finished; /* the job is over: encode its terminal event (kg_jobrun_terminal) */
} kg_jobrun_step_t;

/* How a job ended, for the caller's metrics and logs. */
typedef struct kg_jobrun_outcome {
    bool is_error;
    kg_finish_reason_t reason; /* when !is_error */
    kg_error_code_t code;      /* when is_error */
    kg_events_fit_t fit;       /* what the terminal event left out to fit max_bytes */
} kg_jobrun_outcome_t;

/** Prepare `job` (kg_intake_prepare against `lim`, deadline checked against
 * now_ms) and set `r` up to run it; `taken_us` is when the job was taken
 * (kg_clock_us). Takes ownership of `job` whatever the result (kg_jobrun_clear
 * frees it). KG_ERR_INVALID: the job cannot run; *code and `msg` say why
 * (send kg_events_error with r->job's request id and metadata, and the
 * budget of lim->max_event_bytes).
 * KG_ERR_NOMEM on allocation failure. @thread any */
KG_NODISCARD kg_status_t kg_jobrun_start(kg_jobrun_t *r,
                                         const kg_model_t *model,
                                         const kg_intake_limits_t *lim,
                                         kg_job_t *job,
                                         int64_t now_ms,
                                         int64_t taken_us,
                                         kg_error_code_t *code,
                                         char *msg,
                                         size_t msg_size);

/** Release what `r` owns (the job too). Safe on a zeroed record. */
void kg_jobrun_clear(kg_jobrun_t *r);

/** The engine request of `r` under the caller's handle `id`; a deadline in
 * epoch ms becomes one on the kg_clock_us clock. @thread any */
kg_request_t kg_jobrun_request(const kg_jobrun_t *r, uint64_t id);

/** Record that the request went into the engine at `now_us`. */
void kg_jobrun_submitted(kg_jobrun_t *r, int64_t now_us);

/** Take one completion of this job's request, reported by a step that
 * ended at `ts_us`. Fills `st`. KG_ERR_NOMEM when the output could not
 * grow. @thread any (the caller's) */
KG_NODISCARD kg_status_t kg_jobrun_on_completion(kg_jobrun_t *r,
                                                 const kg_completion_t *c,
                                                 int64_t ts_us,
                                                 kg_jobrun_step_t *st);

/** Token event `i` of step `st` (for a job that streams), as malloc'ed
 * JSON of *len bytes, fitted to max_bytes as kg_events_token does (`fit`,
 * may be NULL, says what was left out); NULL on out of memory. */
char *kg_jobrun_token_event(const kg_jobrun_t *r,
                            const kg_jobrun_step_t *st,
                            int i,
                            const kg_event_origin_t *o,
                            const kg_tokenizer_t *tok,
                            size_t max_bytes,
                            size_t *len,
                            kg_events_fit_t *fit);

/** Tokens generated so far, over every choice (stop-string tails left out). */
int32_t kg_jobrun_n_generated(const kg_jobrun_t *r);

/** A user's cancel of this job (a cancel message): tokens the engine makes
 * after it are not part of the output, and the terminal event is an error
 * with code `cancelled` that carries the text so far (choice 0's). Returns
 * true the first time, when the caller must stop the job: cancel its engine
 * request (every choice's CANCELLED finish then comes as a completion) or,
 * when the job never reached the engine, end it with
 * kg_jobrun_end_cancelled. False when it was cancelled already or has
 * finished (every choice matched a stop string or ended): nothing to do.
 * @thread any (the caller's) */
bool kg_jobrun_cancel(kg_jobrun_t *r);

/** End a job that is not in the engine as cancelled at `now_us` (after
 * kg_jobrun_cancel): encode its terminal event next. */
void kg_jobrun_end_cancelled(kg_jobrun_t *r, int64_t now_us);

/** Count a completion of a job whose events are no longer wanted (its
 * partition was revoked): true once every choice has finished, when the
 * record can go. */
bool kg_jobrun_finish_seen(kg_jobrun_t *r, const kg_completion_t *c);

/** The terminal event of a finished job (after a step with `finished`), as
 * malloc'ed JSON of *len bytes, at most max_bytes where the event can be
 * made that small (0 = no limit; kg_events says what is shed, in which
 * order): a done event (stop, length or stop_sequence) or an error event
 * (expired, cancelled; internal when the backend could not run this job,
 * KG_FINISH_ERROR; invalid_schema when a choice's grammar reached a dead end,
 * KG_FINISH_GRAMMAR). `outcome` says which, and what was shed. NULL on out of
 * memory. A job a user cancelled gets a cancelled error event that carries
 * the text so far (`text`, shed last). */
char *kg_jobrun_terminal(const kg_jobrun_t *r,
                         const kg_event_origin_t *o,
                         const kg_tokenizer_t *tok,
                         size_t max_bytes,
                         size_t *len,
                         kg_jobrun_outcome_t *outcome);

/** The error event for a request the engine refused (`status` from
 * kg_engine_submit other than KG_QUEUE_FULL). Intake checks every limit the
 * engine checks, so a refusal is a mismatch between the two, not the job's
 * fault: code `internal`. Fitted to max_bytes. NULL on out of memory. */
char *kg_jobrun_refused(const kg_jobrun_t *r,
                        const kg_event_origin_t *o,
                        kg_status_t status,
                        size_t max_bytes,
                        size_t *len,
                        kg_jobrun_outcome_t *outcome);
