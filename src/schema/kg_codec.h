/* kg_codec: JSON <-> C for the job and event contract (schemas/).
 *
 * This module (kg_codec.c, with kg_openai.c for the OpenAI shapes) and
 * kg_inflight.c (the poison-job journal's record) are the only code that
 * includes jansson.h; no json_t crosses their boundary. Jobs decode into
 * kg_job_t; events are encoded from the plain structs below into malloc'ed
 * JSON text, and can be decoded back (kgen-submit, tests).
 *
 * A job message may also be an OpenAI Batch API input line or a bare Chat
 * Completions / Completions request body (kg_openai.h): the decoder
 * recognises the shape (or is told it, kg_codec_opts_t.format), translates
 * the object into a kgen job object and decodes that as any job, so every
 * rule and message below applies to both.
 *
 * DESIGN
 * Decoding sorts bad input into the two outcomes of docs/DESIGN.md §3:
 *   - KG_CODEC_DLQ: the bytes are not a JSON object with a usable
 *     request_id (too large, not JSON, invalid UTF-8, duplicate keys, not an
 *     object, request_id missing or malformed). Nobody can be told, so the
 *     message goes to the dead-letter topic with err->message as reason.
 *   - KG_CODEC_INVALID: the request_id is usable but a field breaks the
 *     contract. The worker answers with an error event, code invalid_job,
 *     whose message names the field ("max_tokens: expected an integer >= 1,
 *     got -3"). The first bad field in schema order is reported.
 * Parsing choices, each matching the schema where it can say so:
 *   - the message size is checked before parsing (default 1 MiB);
 *   - jansson bounds nesting at 2048 levels itself ("maximum parsing depth
 *     reached"), so deep input cannot overflow the stack; our own scan of
 *     the metadata text is iterative;
 *   - duplicate keys are rejected (JSON_REJECT_DUPLICATES): readers disagree
 *     on which one wins, so a job must not mean different things to its
 *     producer and to us;
 *   - \u0000 is allowed in strings (JSON_ALLOW_NUL) so a prompt may hold
 *     any text, but request_id, stop strings and message contents, which
 *     are C strings downstream, must not contain it;
 *   - integers written as integral reals (3.0) are accepted, as JSON Schema
 *     does; 3.5 is not. Integer literals beyond 64 bits and reals beyond
 *     double range fail inside jansson and are dead-lettered;
 *   - booleans are strict (no 0/1, no "true"); null means "the default"
 *     for every optional field, as OpenAI-style clients send it.
 * Unknown fields are ignored (additive evolution within a major version).
 *
 * metadata is kept as the producer wrote it, compacted: the text of the
 * value is cut from the input and only whitespace outside strings is
 * dropped, so numbers keep their digits. Encoders re-parse it once to
 * check it is an object and then splice the text in verbatim.
 *
 * Reals are written with at most 15 significant digits; float fields are
 * written in their shortest round-trip form (0.7f as 0.7). A logprob of
 * minus infinity (or NaN) is written as -9999.0, as OpenAI does, since
 * JSON has no infinity.
 *
 * jansson seeds its hash function on first use, which is not thread-safe:
 * main calls kg_codec_global_init() (json_object_seed(0)) before starting
 * any thread. Everything else here is @thread any. */
#pragma once

#include "../core/kg_status.h"
#include "../model/kg_sampler.h"
#include "kg_job.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_CODEC_DEFAULT_MAX_MESSAGE_SIZE ((size_t)1 << 20)

/** Seed jansson's hash table once (json_object_seed(0)). Call from main
 * before any thread starts. @thread main */
void kg_codec_global_init(void);

// ---- jobs ----

/* What a job message is (the kgen-format header of a message, or
 * recognised from its fields when AUTO; see kg_openai.h). */
typedef enum kg_job_format {
    KG_JOB_FORMAT_AUTO = 0,          /* an OpenAI shape when it looks like one, else kgen */
    KG_JOB_FORMAT_KGEN,              /* "kgen": schemas/job.schema.json */
    KG_JOB_FORMAT_OPENAI,            /* "openai": a Batch line, else a bare body */
    KG_JOB_FORMAT_OPENAI_BATCH,      /* "openai-batch": {custom_id, method, url, body} */
    KG_JOB_FORMAT_OPENAI_CHAT,       /* "openai-chat": a Chat Completions body */
    KG_JOB_FORMAT_OPENAI_COMPLETION, /* "openai-completions": a Completions body */
} kg_job_format_t;

/** The format named `s` (`len` bytes: a header value): kgen, openai,
 * openai-batch, openai-chat or openai-completions. false otherwise. */
bool kg_codec_job_format_parse(const char *s, size_t len, kg_job_format_t *out);

typedef struct kg_codec_opts {
    size_t max_message_size;    /* bytes; larger messages are dead-lettered unparsed */
    int64_t default_max_tokens; /* max_tokens of a job that gives none (--default-max-tokens) */
    kg_job_format_t format;     /* default AUTO */
    /* the message key (borrowed, may be NULL): the request_id of a bare
     * OpenAI body, which has no field for it */
    const char *key;
    size_t key_len;
} kg_codec_opts_t;

/** Defaults: max_message_size 1 MiB, default_max_tokens 256, format AUTO,
 * no key. */
kg_codec_opts_t kg_codec_opts_default(void);

typedef enum kg_codec_error_kind {
    KG_CODEC_OK = 0,
    KG_CODEC_DLQ = 1,     /* to the dead-letter topic */
    KG_CODEC_INVALID = 2, /* error event with code invalid_job */
} kg_codec_error_kind_t;

typedef enum kg_codec_dlq_reason {
    KG_DLQ_NONE = 0,
    KG_DLQ_TOO_LARGE,
    KG_DLQ_INVALID_JSON, /* includes invalid UTF-8, duplicate keys, too deep */
    KG_DLQ_NOT_OBJECT,
    KG_DLQ_MISSING_REQUEST_ID,
    KG_DLQ_BAD_REQUEST_ID,
} kg_codec_dlq_reason_t;

/** "too_large", "invalid_json", "not_object", "missing_request_id",
 * "bad_request_id" ("none" for KG_DLQ_NONE): the short reason for a DLQ
 * header or a metric label. */
const char *kg_codec_dlq_reason_str(kg_codec_dlq_reason_t reason);

typedef struct kg_codec_error {
    kg_codec_error_kind_t kind;
    kg_codec_dlq_reason_t reason;               /* when kind is KG_CODEC_DLQ */
    char request_id[KG_JOB_REQUEST_ID_MAX + 1]; /* "" unless the request_id is usable */
    char message[256];                          /* human-readable, names the field */
} kg_codec_error_t;

/** Decode one job message (`len` bytes, not NUL-terminated, any content)
 * with the default options. See kg_codec_decode_job_opts. */
KG_NODISCARD kg_status_t kg_codec_decode_job(const char *buf,
                                             size_t len,
                                             kg_job_t **out,
                                             kg_codec_error_t *err);

/** Decode one job message. On KG_OK `*out` is a new job (free it with
 * kg_job_free) with every default filled in, partition/offset -1 and topic
 * NULL, and err->kind is KG_CODEC_OK. On KG_ERR_INVALID `*out` is NULL and
 * `err` says whether to dead-letter or answer invalid_job, and why.
 * KG_ERR_NOMEM when memory ran out (not the message's fault: do not
 * dead-letter). @thread any */
KG_NODISCARD kg_status_t kg_codec_decode_job_opts(const char *buf,
                                                  size_t len,
                                                  const kg_codec_opts_t *opts,
                                                  kg_job_t **out,
                                                  kg_codec_error_t *err);

/** Encode a job with every field explicit (defaults written out, stop as
 * an array, no origin fields): decoding the result gives the same job.
 * For kgen-submit and round-trip tests. Returns malloc'ed JSON text (the
 * caller frees) and its length in `*len` when `len` is not NULL; NULL when
 * memory ran out. @thread any */
char *kg_codec_encode_job(const kg_job_t *job, size_t *len);

// ---- events ----

typedef enum kg_event_type {
    KG_EVENT_TOKEN = 0,
    KG_EVENT_DONE = 1,
    KG_EVENT_ERROR = 2,
} kg_event_type_t;

typedef enum kg_finish_reason {
    KG_FINISH_REASON_STOP = 0,          /* an end-of-generation token */
    KG_FINISH_REASON_LENGTH = 1,        /* max_tokens or the context limit */
    KG_FINISH_REASON_STOP_SEQUENCE = 2, /* one of the job's stop strings */
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

/** "stop", "length", "stop_sequence"; "unknown" otherwise. */
const char *kg_finish_reason_str(kg_finish_reason_t reason);
/** The schema's code string ("invalid_job", ...); "internal" for a value
 * outside the enum. */
const char *kg_error_code_str(kg_error_code_t code);
/** "token", "done", "error"; "unknown" otherwise. */
const char *kg_event_type_str(kg_event_type_t type);

/* Fields every event carries. All pointers are borrowed when encoding. */
typedef struct kg_event_common {
    const char *request_id; /* required */
    const char *worker_id;  /* required */
    const char *topic;      /* NULL: not written */
    int32_t partition;      /* -1 when the job did not come from Kafka */
    int64_t offset;         /* -1 when the job did not come from Kafka */
    int64_t ts_ms;          /* epoch ms the event was made */
    int32_t schema_version; /* decoded value; encoders always write KG_SCHEMA_VERSION */
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

typedef struct kg_event_token {
    kg_event_common_t common;
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
    const char *stop; /* the matched stop string (STOP_SEQUENCE), else NULL */
    size_t stop_len;
    int32_t completion_tokens;
    const kg_token_logprobs_t *logprobs; /* (n_logprobs) per output token, or NULL */
    int32_t n_logprobs;
    bool text_truncated;    /* text is a prefix of the choice's text ... */
    int64_t text_bytes_cut; /* ... which was this many bytes longer */
} kg_event_choice_t;

typedef struct kg_event_done {
    kg_event_common_t common;
    kg_finish_reason_t finish_reason;
    const char *text; /* the whole output text */
    size_t text_len;
    const char *stop; /* the matched stop string (STOP_SEQUENCE), else NULL */
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
    /* What the event left out to fit the transport (kg_events); written only when set. */
    bool logprobs_truncated; /* the job asked for logprobs; they did not fit */
    bool metadata_truncated; /* the job's metadata is not echoed */
    bool text_truncated;     /* text is a prefix of the output text ... */
    int64_t text_bytes_cut;  /* ... which was this many bytes longer */
} kg_event_done_t;

typedef struct kg_event_error {
    kg_event_common_t common;
    kg_error_code_t code;
    const char *message;       /* NUL-terminated */
    const char *metadata_json; /* the job's metadata_json, or NULL */
    bool metadata_truncated;   /* the job's metadata is not echoed (it did not fit) */
} kg_event_error_t;

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
