/* kg_codec_event: the events a job answers with (schemas/event.schema.json:
 * token, done, error), between the plain structs below and JSON text.
 *
 * Encoding (kg_codec_event_encode.c) is the worker's side (pipeline/
 * kg_events): it never fails on content. Text is (ptr, len) and any bytes;
 * invalid UTF-8 is written as U+FFFD. Reals are written with at most 15
 * significant digits; float fields in their shortest round-trip form (0.7f
 * as 0.7). A logprob of minus infinity (or NaN) is written as -9999.0, as
 * OpenAI does, since JSON has no infinity. The job's metadata goes in as
 * the text the job decoder kept (kg_codec.h), spliced in verbatim so
 * numbers keep their digits. The writing rules themselves are
 * kg_codec_writer.c's, shared with the job encoder.
 *
 * Decoding (kg_codec_event_decode.c) is the readers' side (kgen-submit, the
 * demo, tests): it checks the bytes are an event of this contract and says
 * what is wrong in an errstr, as setup and parse functions do, not in a
 * kg_codec_error_t: nobody answers a bad event, so there is nothing to sort
 * into dead-letter and invalid_job.
 *
 * Everything here is @thread any. */
#pragma once

#include "../core/kg_status.h"
#include "../model/kg_sampler.h"
#include "kg_job.h"
#include "kg_toolcall.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kg_event_type {
    KG_EVENT_TOKEN = 0,
    KG_EVENT_DONE = 1,
    KG_EVENT_ERROR = 2,
} kg_event_type_t;

typedef enum kg_finish_reason {
    KG_FINISH_REASON_STOP = 0,          /* an end-of-generation token */
    KG_FINISH_REASON_LENGTH = 1,        /* max_tokens or the context limit */
    KG_FINISH_REASON_STOP_SEQUENCE = 2, /* one of the job's stop strings */
    KG_FINISH_REASON_TOOL_CALLS = 3,    /* the model ended its turn with tool calls */
} kg_finish_reason_t;

typedef enum kg_error_code {
    KG_ERROR_INVALID_JOB = 0,
    KG_ERROR_PROMPT_TOO_LONG,
    KG_ERROR_MAX_TOKENS_TOO_LARGE,
    KG_ERROR_EXPIRED,
    KG_ERROR_CANCELLED,
    KG_ERROR_UNSUPPORTED_CHAT_TEMPLATE,
    KG_ERROR_INTERNAL,
    KG_ERROR_QUEUE_FULL,
    KG_ERROR_SHUTDOWN,
    KG_ERROR_INVALID_SCHEMA,  /* response_format's JSON Schema uses what kgen cannot enforce */
    KG_ERROR_MODEL_NOT_FOUND, /* the job names a model this worker does not serve */
    KG_ERROR_CODE_COUNT_,
} kg_error_code_t;

// ---- names (kg_codec_event_encode.c) ----

/** "stop", "length", "stop_sequence", "tool_calls"; "unknown" otherwise. */
const char *kg_finish_reason_str(kg_finish_reason_t reason);
/** The schema's code string ("invalid_job", ...); "internal" for a value
 * outside the enum. */
const char *kg_error_code_str(kg_error_code_t code);
/** "token", "done", "error"; "unknown" otherwise. */
const char *kg_event_type_str(kg_event_type_t type);

// ---- events ----

/* The worker's own span of a job (W3C trace context, OpenTelemetry): a new
 * span under the trace the job's traceparent header names, from when the
 * worker took the job off Kafka to when it made the terminal event. Ids are
 * lowercase hex; times are ns since the Unix epoch. */
#define KG_TRACE_ID_HEX 32
#define KG_SPAN_ID_HEX  16
typedef struct kg_event_span {
    char trace_id[KG_TRACE_ID_HEX + 1];      /* the job's trace */
    char span_id[KG_SPAN_ID_HEX + 1];        /* the worker's span: 8 random bytes */
    char parent_span_id[KG_SPAN_ID_HEX + 1]; /* the traceparent's parent-id: the producer's span */
    int64_t start_unix_nano;
    int64_t end_unix_nano;
} kg_event_span_t;

/* Fields every event carries. All pointers are borrowed when encoding. */
typedef struct kg_event_common {
    const char *request_id; /* required */
    const char *worker_id;  /* required */
    const char *topic;      /* NULL: not written */
    int32_t partition;      /* -1 when the job did not come from Kafka */
    int64_t offset;         /* -1 when the job did not come from Kafka */
    const char *attempt;    /* this run of the job (kg_events_attempt_id); NULL: not written */
    int64_t ts_ms;          /* epoch ms the event was made */
    int32_t schema_version; /* decoded value; encoders always write KG_SCHEMA_VERSION */
    bool has_span;          /* a terminal event of a job with a valid traceparent: `span` */
    kg_event_span_t span;
} kg_event_common_t;

/* One token and its log-probability. Text is (ptr, len) because a token's
 * bytes may be an incomplete character or contain NUL; invalid UTF-8 is
 * written as U+FFFD. */
typedef struct kg_logprob_entry {
    int32_t token_id;
    const char *text;
    size_t text_len;
    float logprob; /* -INFINITY allowed (written as -9999.0) */
} kg_logprob_entry_t;

typedef struct kg_token_logprobs {
    kg_logprob_entry_t token;                /* the sampled token */
    int32_t n_top;                           /* 0..KG_MAX_LOGPROBS */
    kg_logprob_entry_t top[KG_MAX_LOGPROBS]; /* most likely first */
} kg_token_logprobs_t;

/* Which part of a reasoning model's output a token belongs to (the job's
 * reasoning is parsed: kg_reasoning); NONE: not written. */
typedef enum kg_token_part {
    KG_PART_NONE = 0,
    KG_PART_REASONING, /* "reasoning": the thought, its <think> and </think> included */
    KG_PART_ANSWER,    /* "answer" */
} kg_token_part_t;

/* The reasoning of a completion, beside its text (the answer); a NULL
 * reasoning is not written. Cut like the text to fit the transport. */
typedef struct kg_event_reasoning {
    const char *reasoning;
    size_t reasoning_len;
    bool reasoning_truncated;    /* reasoning is a prefix of the thought ... */
    int64_t reasoning_bytes_cut; /* ... which was this many bytes longer */
} kg_event_reasoning_t;

typedef struct kg_event_token {
    kg_event_common_t common;
    kg_token_part_t part;
    bool has_choice; /* a job with n > 1: `choice` is written */
    int32_t choice;  /* which of the job's n completions the token belongs to */
    int32_t index;   /* position in that completion's output, from 0 */
    int32_t token_id;
    const char *text; /* valid UTF-8 released with this token (may be empty) */
    size_t text_len;
    bool has_logprobs;
    kg_token_logprobs_t logprobs; /* .token.logprob is written; .token id/text are not */
    /* What the event left out to fit the transport (kg_events); written only when set. */
    bool logprobs_truncated; /* the job asked for logprobs; they did not fit */
    bool text_truncated;     /* text is a prefix of the released text ... */
    int64_t text_bytes_cut;  /* ... which was this many bytes longer */
} kg_event_token_t;

/* One of the n completions of a job with n > 1 (the done event's choices). */
typedef struct kg_event_choice {
    int32_t index;
    kg_finish_reason_t finish_reason;
    const char *text;
    size_t text_len;
    kg_event_reasoning_t r;
    const char *stop; /* the matched stop string (STOP_SEQUENCE), else NULL */
    size_t stop_len;
    int32_t completion_tokens;
    const kg_token_logprobs_t *logprobs; /* (n_logprobs) per output token, or NULL */
    int32_t n_logprobs;
    bool text_truncated;             /* text is a prefix of the choice's text ... */
    int64_t text_bytes_cut;          /* ... which was this many bytes longer */
    const kg_toolcall_t *tool_calls; /* (n_tool_calls) the calls parsed out of the answer */
    size_t n_tool_calls;
} kg_event_choice_t;

/* One result of a rerank or score job. */
typedef struct kg_rank_result {
    int32_t index;         /* the document's (text_2's) position in the job */
    float relevance_score; /* the reranker's probability that it is relevant */
} kg_rank_result_t;

typedef struct kg_event_done {
    kg_event_common_t common;
    kg_finish_reason_t finish_reason;
    const char *text; /* the whole output text (the answer when reasoning is parsed) */
    size_t text_len;
    kg_event_reasoning_t r; /* choice 0's reasoning when n > 1 */
    const char *stop;       /* the matched stop string (STOP_SEQUENCE), else NULL */
    size_t stop_len;
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t cached_tokens;
    double queue_ms; /* written rounded to microseconds */
    double ttft_ms;
    double total_ms;
    double tokens_per_s;
    const kg_token_logprobs_t *logprobs; /* (n_logprobs) per output token, or NULL */
    int32_t n_logprobs;
    const char *metadata_json; /* the job's metadata_json, or NULL */
    const char *model;         /* the model name that answered (the job's, else the worker's
                                  first served name); NULL: not written */
    /* n > 1: every completion (finish_reason, text and stop above are
     * choice 0's; completion_tokens is their sum); n_choices 0: not written */
    const kg_event_choice_t *choices;
    int32_t n_choices;
    /* the calls parsed out of the answer (choice 0's when n > 1), written as
     * OpenAI's tool_calls: {"id", "type": "function", "function": {"name",
     * "arguments"}}; 0: not written */
    const kg_toolcall_t *tool_calls;
    size_t n_tool_calls;
    /* What the event left out to fit the transport (kg_events); written only when set. */
    bool logprobs_truncated; /* the job asked for logprobs; they did not fit */
    bool metadata_truncated; /* the job's metadata is not echoed */
    bool text_truncated;     /* text is a prefix of the output text ... */
    int64_t text_bytes_cut;  /* ... which was this many bytes longer */
    /* An embed job: n_embeddings vectors of embedding_dim floats, in input
     * order, as arrays of numbers or, embeddings_base64, as base64 strings of
     * their little-endian float32 bytes (OpenAI's encoding_format); 0: none */
    const float *embeddings;
    int32_t n_embeddings;
    int32_t embedding_dim;
    bool embeddings_base64;
    /* A rerank or score job: "results" (has_results), n_results of them */
    bool has_results;
    const kg_rank_result_t *results;
    int32_t n_results;
} kg_event_done_t;

typedef struct kg_event_error {
    kg_event_common_t common;
    kg_error_code_t code;
    const char *message;       /* NUL-terminated */
    const char *metadata_json; /* the job's metadata_json, or NULL */
    bool metadata_truncated;   /* the job's metadata is not echoed (it did not fit) */
    /* The text generated before the job ended (code cancelled); NULL: not written. */
    const char *text;
    size_t text_len;
    bool text_truncated;    /* text is a prefix of the generated text ... */
    int64_t text_bytes_cut; /* ... which was this many bytes longer */
} kg_event_error_t;

// ---- event encode (kg_codec_event_encode.c; kg_codec_text_prefix: kg_codec_writer.c) ----

/** Encode an event as compact JSON. Returns malloc'ed text (the caller
 * frees; length in `*len` when not NULL), or NULL when memory ran out.
 * Never fails on text content: invalid UTF-8 becomes U+FFFD. A
 * metadata_json that is not a JSON object is left out (with a warning)
 * rather than losing the event. @thread any */
char *kg_codec_encode_token(const kg_event_token_t *ev, size_t *len);

/** The longest prefix of the text (s, len) whose JSON string, as the
 * encoders write it (invalid UTF-8 as U+FFFD, '"', '\\' and control
 * characters escaped), takes at most `room` bytes between its quotes. It
 * ends on a character boundary. Returns its length in bytes of s;
 * *text_bytes (may be NULL) gets the UTF-8 bytes a reader decodes from it.
 * For cutting an event's text to fit a message (pipeline/kg_events).
 * @thread any */
size_t kg_codec_text_prefix(const char *s, size_t len, size_t room, size_t *text_bytes);
char *kg_codec_encode_done(const kg_event_done_t *ev, size_t *len);
char *kg_codec_encode_error(const kg_event_error_t *ev, size_t *len);

// ---- event decode (kg_codec_event_decode.c) ----

/* A decoded event: `type` says which member is filled. Every pointer in
 * it is owned by the event (strings NUL-terminated, lengths set). */
typedef struct kg_event {
    kg_event_type_t type;
    kg_event_token_t token;
    kg_event_done_t done;
    kg_event_error_t error;
} kg_event_t;

/** Decode one event message (for readers such as kgen-submit). On KG_OK
 * `*out` is a new event (free with kg_event_free); KG_ERR_INVALID with
 * errstr set when the bytes are not an event of this contract;
 * KG_ERR_NOMEM. @thread any */
KG_NODISCARD kg_status_t kg_codec_decode_event(
    const char *buf, size_t len, kg_event_t **out, char *errstr, size_t errstr_size);

/** Free a decoded event. NULL does nothing. */
void kg_event_free(kg_event_t *ev);
