/* kg_events: the events of one job, encoded (token, done, error), shared
 * by `kgen batch` and kgen-worker so both write the same contract. */
#pragma once

#include "../model/kg_tokenizer.h"
#include "../schema/kg_codec.h"
#include "../schema/kg_job.h"
#include "kg_output.h"

#include <stddef.h>
#include <stdint.h>

/* Where an event comes from: the worker id and the job's source. */
typedef struct kg_event_origin {
    const char *worker_id;
    const char *topic; /* NULL outside Kafka */
    int32_t partition; /* -1 outside Kafka */
    int64_t offset;    /* -1 outside Kafka */
    const char *model; /* the worker's first served model name, or NULL */
} kg_event_origin_t;

typedef struct kg_job_timing {
    int64_t taken_us, submitted_us, first_token_us, finished_us; /* kg_clock_us() */
    int32_t n_prompt, n_cached;
} kg_job_timing_t;

/** A token event for `ev` of `out`, the output of choice `choice` (written
 * when the job has n > 1). Returns malloc'ed JSON (caller frees). */
char *kg_events_token(const kg_event_origin_t *o,
                      const kg_tokenizer_t *tok,
                      const kg_job_t *job,
                      int32_t choice,
                      const kg_output_t *out,
                      const kg_output_event_t *ev,
                      size_t *len);

/* One finished completion of a job, for kg_events_done_choices. */
typedef struct kg_events_choice {
    const kg_output_t *out;
    kg_finish_reason_t reason;
    const kg_sample_result_t *samples; /* (n_samples) or NULL */
    int32_t n_samples;
} kg_events_choice_t;

/** The done event of a job with n = `n` completions: for n = 1 as
 * kg_events_done; for n > 1 with every completion in `choices`, choice 0's
 * text and finish at the top and completion_tokens summed. */
char *kg_events_done_choices(const kg_event_origin_t *o,
                             const kg_tokenizer_t *tok,
                             const kg_job_t *job,
                             const kg_events_choice_t *ch,
                             int32_t n,
                             const kg_job_timing_t *t,
                             size_t *len);

/** The done event: full text, finish reason, usage, timings, and per-token
 * logprobs when the job asked for them (`samples`, n_samples; may be NULL). */
char *kg_events_done(const kg_event_origin_t *o,
                     const kg_tokenizer_t *tok,
                     const kg_job_t *job,
                     const kg_output_t *out,
                     kg_finish_reason_t reason,
                     const kg_job_timing_t *t,
                     const kg_sample_result_t *samples,
                     int32_t n_samples,
                     size_t *len);

/** An error event; request_id and metadata_json may come from a job or not. */
char *kg_events_error(const kg_event_origin_t *o,
                      const char *request_id,
                      kg_error_code_t code,
                      const char *message,
                      const char *metadata_json,
                      size_t *len);
