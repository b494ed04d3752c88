/* kg_codec_int: what the codec's files (kg_codec*.c) and kg_openai.c share
 * inside src/schema/. It passes json_t, which never leaves src/schema/ (see
 * kg_codec.h).
 *
 * Two groups, each in a file that calls nothing else of src/schema/, so
 * the decoders, the encoders and kg_openai.c all lean on them and never on
 * each other in a loop:
 *   - kg_codec_util.c: how the decoders read values (the request_id rule,
 *     integers, a bad value's description in messages, metadata text);
 *   - kg_codec_writer.c: how the encoders write values (any bytes as a
 *     JSON string, reals, logprobs, building an object, the metadata
 *     splice). */
#pragma once

#include "../core/kg_status.h"
#include "kg_codec_event.h"
#include "kg_job.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How every message is parsed: duplicate keys rejected, \u0000 allowed in
 * strings, any value at the top (the decoders say what they expected). */
#define KG_LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

// ---- reading values (kg_codec_util.c) ----

/** A short description of a JSON value for error messages ("-3",
 * "\"abc\"", "an array"; NULL: "nothing"), as the job decoder and the
 * OpenAI translation write it after "got". */
void kg_codec_describe_json(const json_t *v, char *out, size_t size);

/** The request_id rule: 1..128 characters of [A-Za-z0-9._:-]. */
bool kg_codec_is_request_id(const char *s, size_t len);

/** An integer in [lo, hi] into *out; integral reals (3.0) count, as in
 * JSON Schema. false otherwise. */
bool kg_codec_as_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out);

/** malloc'ed copy of `len` bytes plus a NUL; NULL when memory ran out. */
char *kg_codec_dup_bytes(const char *s, size_t len);

/** The text of member "metadata" (`meta`) of the object `root` parsed from
 * `buf` (`len` bytes), compacted: only whitespace outside strings is
 * dropped, so numbers keep their digits. jansson's serialization when
 * there is no text (buf NULL) or the scan disagrees. malloc'ed; NULL when
 * memory ran out. */
char *kg_codec_metadata_text(json_t *root, json_t *meta, const char *buf, size_t len);

// ---- writing values (kg_codec_writer.c) ----

/** A JSON string of any bytes: NULL is "", invalid UTF-8 becomes U+FFFD.
 * NULL only when memory ran out. */
json_t *kg_codec_text_json(const char *s, size_t len);
/** kg_codec_text_json of a C string (NULL: ""). */
json_t *kg_codec_cstr_json(const char *s);
/** A float in its shortest round-trip form (0.7f as 0.7). */
json_t *kg_codec_float_json(float f);
/** A logprob; minus infinity and NaN (and anything below) as -9999.0. */
json_t *kg_codec_logprob_json(float lp);
/** A duration or rate rounded to 3 decimals; negative or non-finite as 0. */
json_t *kg_codec_nonneg_json(double x);

/** Set (append) a fresh value; a NULL value or a failed set (append)
 * clears *ok, so a builder checks once at the end. */
void kg_codec_put(json_t *obj, const char *key, json_t *v, bool *ok);
void kg_codec_append(json_t *arr, json_t *v, bool *ok);

/** Dump `obj` compactly (reals with at most 15 significant digits) and
 * splice in "metadata": <metadata_json> when given and a JSON object (else
 * left out with a warning). malloc'ed text, length in *len when not NULL;
 * NULL when memory ran out. */
char *kg_codec_dump_with_metadata(json_t *obj, const char *metadata_json, size_t *len);

// ---- embedding, rerank and score fields (kg_codec_embed.c) ----

/** "task" and, for a task other than generate, its fields (input, pooling,
 * normalize, dimensions, encoding_format; query, documents, top_n; text_1,
 * text_2) into `job`; sets their defaults either way. KG_ERR_INVALID with
 * the message in `msg`; KG_ERR_NOMEM. */
kg_status_t kg_codec_decode_task(json_t *root, kg_job_t *job, char *msg, size_t size);
/** The encoding of those fields (nothing for a generate job): "task", its
 * inputs as a list, and the options that differ from the defaults. */
void kg_codec_put_task(json_t *o, const kg_job_t *job, bool *ok);

/** The "embeddings" value of a done event: n rows of dim floats, each an
 * array of numbers or (base64) a base64 string of its little-endian
 * float32 bytes. NULL when memory ran out. */
json_t *kg_codec_embeddings_json(const float *v, int32_t n, int32_t dim, bool base64);
/** The "results" value: [{"index", "relevance_score"}...]. */
json_t *kg_codec_results_json(const kg_rank_result_t *r, int32_t n);
/** A done event's "embeddings" and "results" (when there) into `e`, which
 * then owns e->embeddings and e->results (kg_event_free frees them).
 * KG_ERR_INVALID with the message in `msg`; KG_ERR_NOMEM. */
kg_status_t kg_codec_decode_answer(json_t *root, kg_event_done_t *e, char *msg, size_t size);
// ---- chat template variables and reasoning fields (kg_codec_reasoning.c) ----

/** chat_template_kwargs, reasoning_effort, tools, reasoning_format and
 * thinking_token_budget of the job object `root` into `job`; KG_ERR_INVALID
 * with msg set (the field and what was expected), or KG_ERR_NOMEM. */
kg_status_t kg_codec_decode_reasoning(json_t *root, kg_job_t *job, char *msg, size_t msg_size);
/** The same fields, when not their defaults, into the job object `o`. */
void kg_codec_encode_reasoning(json_t *o, const kg_job_t *job, bool *ok);
/** An OpenAI body's copies of them (vLLM's extensions) into the kgen job
 * object `job`, and its tools for a chat body (kg_openai.c has refused
 * them on other bodies unless tool_choice is "none"). */
void kg_codec_copy_reasoning(const json_t *body, json_t *job, bool chat, bool *ok);

// ---- tool_choice and parallel_tool_calls (kg_codec_tools.c) ----

/** tool_choice and parallel_tool_calls of the job object `root` (its tools
 * already decoded into job->tools_json), and the tools' definitions checked
 * when the output is to be parsed for calls. KG_ERR_INVALID with msg set. */
kg_status_t kg_codec_decode_tools(json_t *root, kg_job_t *job, char *msg, size_t msg_size);
/** The same fields, when not their defaults, into the job object `o`. */
void kg_codec_encode_tools(json_t *o, const kg_job_t *job, bool *ok);
/** An OpenAI body's tool_choice and parallel_tool_calls (functions and
 * function_call, the deprecated names, as tools and tool_choice) into the
 * kgen job object `job`. */
void kg_codec_copy_tools(const json_t *body, json_t *job, bool *ok);
/** Message i's tool_calls (an assistant turn's), tool_call_id and name (a
 * tool turn's), checked, as a new JSON object in *extra (NULL when it has
 * none); KG_ERR_INVALID with msg set. */
kg_status_t kg_codec_decode_message_tools(
    const json_t *m, size_t i, const char *role, json_t **extra, char *msg, size_t msg_size);
