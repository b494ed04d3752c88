/* kg_openai_int: the OpenAI request shapes inside the job decoder. Shared by
 * kg_codec.c and kg_openai.c only: it passes json_t, which never leaves
 * src/schema/ (see kg_openai.h for the contract). */
#pragma once

#include "kg_codec.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum kg_openai_shape {
    KG_OPENAI_SHAPE_NONE = 0,   /* a kgen job */
    KG_OPENAI_SHAPE_BATCH,      /* {custom_id, method, url, body} */
    KG_OPENAI_SHAPE_CHAT,       /* a Chat Completions request body */
    KG_OPENAI_SHAPE_COMPLETION, /* a Completions request body */
    KG_OPENAI_SHAPE_EMBED,      /* an Embeddings request body (kg_openai_embed.c) */
    KG_OPENAI_SHAPE_RERANK,     /* a rerank body: query, documents, top_n */
    KG_OPENAI_SHAPE_SCORE,      /* a score body: text_1, text_2 */
} kg_openai_shape_t;

/** The shape of the job object `root` under `format` (kg_codec_opts_t). */
kg_openai_shape_t kg_openai_detect(const json_t *root, kg_job_format_t format);

/** Translate `root` (of `shape`, not NONE) into a new kgen job object in
 * *out (the caller decrefs it). KG_ERR_INVALID with `err` filled as the
 * decoder does: DLQ when no request id can be had (no custom_id, no key),
 * else INVALID with err->request_id set and a message naming the OpenAI
 * field. KG_ERR_NOMEM when memory ran out. */
KG_NODISCARD kg_status_t kg_openai_to_job(const json_t *root,
                                          kg_openai_shape_t shape,
                                          const char *key,
                                          size_t key_len,
                                          json_t **out,
                                          kg_codec_error_t *err);

// ---- embeddings, rerank and score (kg_openai_embed.c) ----

/** The shape a Batch line's url names: EMBED, RERANK, SCORE, or NONE for
 * any other url. */
kg_openai_shape_t kg_openai_answer_url(const json_t *url);
/** The shape of a bare body that is not Chat or Completions: EMBED (input),
 * RERANK (query and documents), SCORE (text_1), else NONE. */
kg_openai_shape_t kg_openai_answer_detect(const json_t *body);
/** Translate an EMBED, RERANK or SCORE body into the kgen job object `job`
 * (request_id already set). KG_ERR_NOMEM only: the job decoder checks the
 * fields. */
KG_NODISCARD kg_status_t kg_openai_answer_to_job(const json_t *body,
                                                 kg_openai_shape_t shape,
                                                 json_t *job,
                                                 kg_codec_error_t *err);
/** The response body for a done event with "embeddings" or "results" (the
 * input line `in` says whether results are a rerank's or a score's), or
 * NULL when the event carries neither; clears *ok when memory ran out. */
json_t *
kg_openai_answer_body(const json_t *in, const json_t *ev, const char *default_model, bool *ok);
