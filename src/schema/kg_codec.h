/* kg_codec: the job and event contract (schemas/) between JSON text and
 * plain C structs. This header is the job side: a job message decodes into
 * a kg_job_t (kg_codec.c), and a kg_job_t encodes back into a job message
 * (kg_codec_job_encode.c, for kgen-submit, tests and fuzzing). The event
 * side is kg_codec_event.h. The files of the codec, by who calls them:
 *   - kg_codec.c: job decode (the worker's intake, kgen-submit);
 *   - kg_codec_job_encode.c: job encode (kgen-submit, tests, fuzzing);
 *   - kg_codec_event_encode.c: event encode (the worker, pipeline/kg_events);
 *   - kg_codec_event_decode.c: event decode (kgen-submit, the demo, tests);
 *   - kg_codec_writer.c and kg_codec_util.c: how values are written and
 *     read, shared by the others and by kg_openai.c (kg_codec_int.h);
 *     they call nothing else of src/schema/, so no two files call each
 *     other in a loop.
 * jansson.h is included only under src/schema/: by the codec's files
 * (kg_codec*.c, kg_codec_int.h), kg_openai.c (through kg_openai_int.h),
 * kg_json_schema.c and kg_json_rules.c (response_format's schemas, through
 * kg_json_schema_int.h), kg_inflight.c (the poison-job journal's record)
 * and kg_cancelmsg.c (the cancel topic's messages); no json_t crosses that
 * boundary.
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
 * check it is an object and then splice the text in verbatim. How values
 * are written (reals, text) is said in kg_codec_event.h.
 *
 * jansson seeds its hash function on first use, which is not thread-safe:
 * main calls kg_codec_global_init() (json_object_seed(0)) before starting
 * any thread. Everything else here is @thread any. */
#pragma once

#include "../core/kg_status.h"
#include "kg_job.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_CODEC_DEFAULT_MAX_MESSAGE_SIZE ((size_t)1 << 20)

/** Seed jansson's hash table once (json_object_seed(0)). Call from main
 * before any thread starts. @thread main */
void kg_codec_global_init(void);

// ---- job decode (kg_codec.c) ----

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

// ---- job encode (kg_codec_job_encode.c) ----

/** Encode a job with every field explicit (defaults written out, stop as
 * an array, no origin fields): decoding the result gives the same job.
 * For kgen-submit and round-trip tests. Returns malloc'ed JSON text (the
 * caller frees) and its length in `*len` when `len` is not NULL; NULL when
 * memory ran out. @thread any */
char *kg_codec_encode_job(const kg_job_t *job, size_t *len);
