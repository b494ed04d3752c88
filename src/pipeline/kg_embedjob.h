/* kg_embedjob: embed, rerank and score jobs between the decoded job and
 * its done event, for kg_intake (the inputs become token sequences) and
 * kg_jobrun (the engine's pooled rows become vectors or scores).
 *
 * DESIGN
 * Every input is one engine sequence (kg_request_t.n_inputs): an embed
 * job's inputs; a rerank job's documents, each paired with the query as
 * llama.cpp's server builds the pair (the model's rerank template,
 * tokenizer.chat_template.rerank with {query} and {document}, tokenized
 * with special tokens parsed; else BOS? query EOS? document EOS?, the
 * marks the vocabulary asks for); a score job's text_2 entries paired with
 * text_1 the same way. Text inputs of an embed job are tokenized with the
 * vocabulary's BOS/EOS (as llama.cpp's embedding tools do); token ids are
 * used as given. Pooling: the job's, else the model's
 * (kg_embed_model_pooling); rerank and score jobs pool the last token and
 * score it with the model's classification head (kg_embed_rank_score), so
 * they need a reranker (qwen3 with cls.output.weight). The vector a job
 * gets is the pooled row cut to `dimensions` and L2-normalised unless
 * `normalize` is false (kg_embed_finish). */
#pragma once

#include "../core/kg_status.h"
#include "../model/kg_model.h"
#include "../schema/kg_codec_event.h"
#include "../schema/kg_job.h"
#include "kg_events.h"
#include "kg_intake.h"

#include <stdbool.h>
#include <stddef.h>

/** The token sequences of a task != GENERATE job into `out` (tokens,
 * input_len, n_inputs, pooling), after kg_intake_prepare's common checks.
 * KG_ERR_INVALID with *code and `msg` (an input too long, too many
 * inputs, a token outside the vocabulary, a rerank job for a model that
 * cannot rank, dimensions above the model's width); KG_ERR_NOMEM.
 * @thread any */
KG_NODISCARD kg_status_t kg_embedjob_prepare(const kg_model_t *model,
                                             const kg_intake_limits_t *lim,
                                             const kg_job_t *job,
                                             kg_prepared_t *out,
                                             kg_error_code_t *code,
                                             char *msg,
                                             size_t msg_size);

/** The engine pooling (kg_engine_pool_t's value) for prepared pooling
 * `pooling` (KG_EMBED_POOL_*). */
int kg_embedjob_engine_pool(const kg_model_t *model, int32_t pooling);

/** The done event of a finished job whose engine rows (`pooled`, n_inputs
 * rows of n_embd floats) are all there, made into vectors or scores; fitted to max_bytes
 * (kg_events_done_answer). When the answer cannot fit, an error event (invalid_job) that says how
 * large it is, with *is_error set. NULL on out of memory. */
char *kg_embedjob_terminal(const kg_model_t *model,
                           const kg_job_t *job,
                           const kg_prepared_t *prep,
                           const float *pooled,
                           const kg_event_origin_t *o,
                           const kg_job_timing_t *t,
                           size_t max_bytes,
                           size_t *len,
                           bool *is_error,
                           kg_events_fit_t *fit);
