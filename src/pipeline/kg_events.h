/* kg_events: the events of one job, encoded (token, done, error), shared
 * by `kgen batch` and kgen-worker so both write the same contract.
 *
 * Every event is made to fit a byte budget (max_bytes: what one message on
 * the results topic may carry; 0 = no limit). An event that would be
 * larger sheds, in this order, until it fits:
 *   done    logprobs (logprobs_truncated), then the metadata echo
 *           (metadata_truncated), then the end of the reasoning
 *           (reasoning_truncated, reasoning_bytes_cut; with n > 1 every
 *           choice's reasoning at once), then the end of the text
 *           (text_truncated, text_bytes_cut; a streamed job's token events
 *           still carry all of both);
 *   token   logprobs (logprobs_truncated), then the end of its text;
 *   error   the metadata echo (metadata_truncated), then the end of its text
 *           (a cancelled job's text so far; text_truncated, text_bytes_cut).
 * The rest of an event (ids, usage, timings, the stop string, the message)
 * is small and bounded, so an event always fits a budget of a few KiB. */
#pragma once

#include "../model/kg_tokenizer.h"
#include "../schema/kg_codec_event.h"
#include "../schema/kg_job.h"
#include "kg_output.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where an event comes from: the worker id and the job's source. */
typedef struct kg_event_origin {
    const char *worker_id;
    const char *topic; /* NULL outside Kafka */
    int32_t partition; /* -1 outside Kafka */
    int64_t offset;    /* -1 outside Kafka */
    const char *model; /* the worker's first served model name, or NULL */
    /* this run of the job, unique across runs and workers (kg_events_attempt_id); NULL outside
     * Kafka, where a job runs once */
    const char *attempt;
    /* the worker's span of the job (terminal events of a job with a traceparent); NULL: none */
    const kg_event_span_t *span;
} kg_event_origin_t;

/* Bytes of an attempt id with its NUL: 16 hex digits, '-', a 64-bit decimal. */
#define KG_ATTEMPT_ID_SIZE 40

/** Write the id of one run of a job into out (KG_ATTEMPT_ID_SIZE bytes): the worker process's
 * 64-bit random incarnation and the run's number in that process, "9f0c2a7d41e3b865-17". Two runs
 * of one job (a redelivery to another worker, or to the same worker after a rebalance or a broker
 * outage, where worker_id, partition and offset are all equal) never share it. @thread any */
void kg_events_attempt_id(uint64_t incarnation, uint64_t run, char *out, size_t size);

/* What an event left out to fit its budget. */
typedef struct kg_events_fit {
    bool logprobs_dropped;
    bool metadata_dropped;
    size_t text_bytes_cut;
    size_t reasoning_bytes_cut; /* a reasoning job's thought, cut before its answer */
    bool over_budget;           /* still larger than max_bytes with everything shed */
} kg_events_fit_t;

typedef struct kg_job_timing {
    int64_t taken_us, submitted_us, first_token_us, finished_us; /* kg_clock_us() */
    int32_t n_prompt, n_cached;
} kg_job_timing_t;

/** A token event for `ev` of `out`, the output of choice `choice` (written
 * when the job has n > 1), at most max_bytes long where it can be made that
 * small (see above; `fit`, which may be NULL, says what was left out).
 * Returns malloc'ed JSON (caller frees); NULL on out of memory. */
char *kg_events_token(const kg_event_origin_t *o,
                      const kg_tokenizer_t *tok,
                      const kg_job_t *job,
                      int32_t choice,
                      const kg_output_t *out,
                      const kg_output_event_t *ev,
                      size_t max_bytes,
                      size_t *len,
                      kg_events_fit_t *fit);

/** The done event: full text, finish reason, usage, timings, and per-token
 * logprobs when the job asked for them (`samples`, n_samples; may be NULL),
 * fitted to max_bytes as above. */
char *kg_events_done(const kg_event_origin_t *o,
                     const kg_tokenizer_t *tok,
                     const kg_job_t *job,
                     const kg_output_t *out,
                     kg_finish_reason_t reason,
                     const kg_job_timing_t *t,
                     const kg_sample_result_t *samples,
                     int32_t n_samples,
                     size_t max_bytes,
                     size_t *len,
                     kg_events_fit_t *fit);

/* One finished completion of a job, for kg_events_done_choices. */
typedef struct kg_events_choice {
    const kg_output_t *out;
    kg_finish_reason_t reason;
    const kg_sample_result_t *samples; /* (n_samples) or NULL */
    int32_t n_samples;
    kg_toolfmt_t toolfmt; /* the answer's tool-call syntax (kg_toolcall); NONE: not parsed */
} kg_events_choice_t;

/** The done event of a job with n = `n` completions: for n = 1 as
 * kg_events_done; for n > 1 with every completion in `choices`, choice 0's
 * text and finish at the top and completion_tokens summed. Fitted to
 * max_bytes as above; with n > 1 the last resort cuts every choice's text
 * to an equal share (each choice says what it lost). */
char *kg_events_done_choices(const kg_event_origin_t *o,
                             const kg_tokenizer_t *tok,
                             const kg_job_t *job,
                             const kg_events_choice_t *ch,
                             int32_t n,
                             const kg_job_timing_t *t,
                             size_t max_bytes,
                             size_t *len,
                             kg_events_fit_t *fit);

/* What an embedding, rerank or score job's done event carries. */
typedef struct kg_events_answer {
    const float *embd; /* embed: (n_embd, dim) final vectors, or NULL */
    int32_t n_embd, dim;
    const kg_rank_result_t *results; /* rerank/score: (n_results), or NULL */
    int32_t n_results;
} kg_events_answer_t;

/** The done event of an embedding, rerank or score job: `embeddings` or
 * `results`, usage (prompt_tokens), timings. Fitted to max_bytes by shedding
 * the metadata echo only: the answer itself is never cut, so when it alone
 * is over the budget this returns NULL with *too_big set (the caller sends
 * an error that says so). NULL with *too_big false: out of memory. */
char *kg_events_done_answer(const kg_event_origin_t *o,
                            const kg_job_t *job,
                            const kg_events_answer_t *a,
                            const kg_job_timing_t *t,
                            size_t max_bytes,
                            size_t *len,
                            kg_events_fit_t *fit,
                            bool *too_big);

/** An error event; request_id and metadata_json may come from a job or not.
 * Fitted to max_bytes as above. */
char *kg_events_error(const kg_event_origin_t *o,
                      const char *request_id,
                      kg_error_code_t code,
                      const char *message,
                      const char *metadata_json,
                      size_t max_bytes,
                      size_t *len,
                      kg_events_fit_t *fit);

/** An error event that also carries the text generated so far (`text`,
 * text_len bytes; a cancelled job's), fitted to max_bytes as above. */
char *kg_events_error_text(const kg_event_origin_t *o,
                           const char *request_id,
                           kg_error_code_t code,
                           const char *message,
                           const char *metadata_json,
                           const char *text,
                           size_t text_len,
                           size_t max_bytes,
                           size_t *len,
                           kg_events_fit_t *fit);
