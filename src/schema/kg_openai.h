/* kg_openai: OpenAI's request and result shapes at the edge of the kgen
 * contract.
 *
 * DESIGN
 * Jobs in. A job message may be an OpenAI Batch API input line
 * ({"custom_id", "method": "POST", "url", "body"}) or a bare Chat
 * Completions / Completions request body. kg_codec_decode_job recognises
 * the shape (kg_job_format_t) and translates the object into a kgen job
 * object, which the one job decoder then reads, so limits, defaults and
 * messages are the same for every shape:
 *   - request_id: the line's request_id if any, else its custom_id when
 *     that is a valid request_id, else "cid-" and 32 hex digits of a hash
 *     of the custom_id; a bare body takes the message key;
 *   - url /v1/chat/completions (messages) or /v1/completions (prompt);
 *     /v1/embeddings, /v1/rerank and /v1/score become embed, rerank and
 *     score jobs (kg_openai_embed.c, which says how); any other url is an
 *     invalid_job error; a bare body with input (and no prompt or messages)
 *     is an Embeddings body, with query and documents a rerank one, with
 *     text_1 a score one;
 *   - messages: string content, or an array of text parts joined with a
 *     newline (as vLLM does); role developer is read as system;
 *   - prompt: a string, token ids, or a list holding one of those;
 *   - max_completion_tokens, else max_tokens (a Completions body without
 *     either gets OpenAI's 16); stream defaults to false, as in OpenAI;
 *   - logprobs (Chat: true with top_logprobs; Completions: an integer) ask
 *     the job for max(1, top) alternatives; the result translation below
 *     gives back exactly as many as were asked;
 *   - model, temperature, top_p, n, stop, seed, presence_penalty,
 *     frequency_penalty, logit_bias, response_format, metadata, and the
 *     vLLM-style extras kgen also has (top_k, min_p, repetition_penalty,
 *     ignore_eos, priority, deadline_ms) are copied unchanged;
 *   - tools, tool_choice, parallel_tool_calls and the messages' tool_calls,
 *     tool_call_id and (tool turns) name are copied (kg_codec_tools.c
 *     checks them); tools need a chat body;
 *   - fields OpenAI defines that kgen cannot honour are invalid_job
 *     errors, never dropped: the deprecated functions / function_call
 *     unless "none", non-text content parts, audio output,
 *     web_search_options, echo, suffix, best_of other than n, several
 *     prompts in one request, top_logprobs above 20;
 *   - user, store, service_tier, stream_options, prediction and other
 *     fields that do not change the output are ignored, as are unknown
 *     fields.
 * Results out. kg_openai_batch_output turns a job's terminal event (done
 * or error) and its input line into one OpenAI Batch API output line, as
 * OpenAI writes them: {"id": "batch_req_...", "custom_id", "response":
 * {"status_code", "request_id", "body"}, "error"} with a chat.completion or
 * text_completion body (choices, usage), an embedding list, a rerank or a
 * score body (for a done event with embeddings or results), or an error: an HTTP-style error
 * body ({"error": {"message", "type", "param", "code"}}, status 400, 404
 * for model_not_found, 500/503 for the worker's own failures) or, for
 * expired and cancelled jobs, response null and error {"code":
 * "batch_expired" | "batch_cancelled", "message"}.
 * schemas/openai-batch-output.schema.json describes the output objects.
 *
 * Everything here is @thread any. */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct kg_openai_output_opts {
    /* body.model when the request named none: the worker's first served
     * name (a request that named another model got model_not_found) */
    const char *default_model;
} kg_openai_output_opts_t;

/** The OpenAI Batch output line for one job: `input` (`input_len` bytes)
 * is its input line (an OpenAI Batch line, a bare body or a kgen job;
 * what it asked decides chat.completion or text_completion, custom_id and
 * how many top logprobs), `event` its terminal event (schemas/event). On
 * KG_OK *out is malloc'ed JSON text of *out_len bytes (no newline) and
 * *is_error says whether it belongs in an error file. KG_ERR_INVALID with
 * errstr when `event` is not a done or error event (an input that is not
 * JSON still gets a line: custom_id then comes from the event).
 * KG_ERR_NOMEM. */
KG_NODISCARD kg_status_t kg_openai_batch_output(const char *input,
                                                size_t input_len,
                                                const char *event,
                                                size_t event_len,
                                                const kg_openai_output_opts_t *opts,
                                                char **out,
                                                size_t *out_len,
                                                bool *is_error,
                                                char *errstr,
                                                size_t errstr_size);

/** The id a JSONL line goes by: its custom_id when it is a string (an
 * OpenAI Batch input or output line), else its request_id (a kgen job or
 * event), copied into `out` (NUL-terminated, `size` bytes at most). false
 * when the line is not a JSON object with either. For resuming from a
 * partly written output file (kgen-submit). */
bool kg_openai_line_id(const char *line, size_t len, char *out, size_t size);
