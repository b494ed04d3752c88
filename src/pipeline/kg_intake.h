/* kg_intake: a decoded job becomes an engine request, or an error event.
 *
 * Shared by `kgen batch` and kgen-worker so both enforce one contract:
 * the prompt is tokenized (BOS as the model says, special tokens parsed as
 * llama.cpp's server and vLLM do) or rendered with the model's chat
 * template; prompt_tokens are checked against the vocabulary; the prompt
 * must fit the context and max_prompt_tokens; max_tokens must not exceed
 * the limit (it is clamped to the room left in the context, as llama.cpp's
 * server does); a job whose deadline has passed is not run; a job whose
 * metadata alone is larger than an event may be can never be answered with
 * it, so it is refused (invalid_job) rather than run; a job naming a model
 * the worker does not serve gets model_not_found; n must fit the engine's
 * slots and logit_bias must name tokens of the vocabulary. A constrained job
 * (response_format, regex, choice, grammar) gets its compiled grammar from
 * the worker's grammar cache here, on the kafka thread, never on the engine
 * thread: a schema keyword we cannot enforce answers invalid_schema, a
 * malformed regex, choice or grammar invalid_job. */
#pragma once

#include "../backend/kg_backend.h"
#include "../core/kg_status.h"
#include "../engine/kg_engine.h"
#include "../grammar/kg_grammar_cache.h"
#include "../model/kg_model.h"
#include "../schema/kg_chat.h"
#include "../schema/kg_codec_event.h"
#include "../schema/kg_job.h"
#include "../schema/kg_toolcall.h"
#include "kg_loras.h"
#include "kg_output.h"

/* Tokens </think> may take (one in Qwen3's and DeepSeek's vocabularies). */
#define KG_THINK_MAX_CLOSE 8

#include <stddef.h>
#include <stdint.h>

typedef struct kg_intake_limits {
    int32_t max_seq_len;          /* prompt + output per sequence */
    int32_t max_prompt_tokens;    /* 0 = max_seq_len - 1 */
    int32_t max_tokens_limit;     /* jobs asking more get max_tokens_too_large */
    size_t max_event_bytes;       /* bytes one event may have (kg_events); 0 = no limit */
    kg_grammar_cache_t *grammars; /* compiles constrained jobs; NULL: they are refused */
    int32_t max_choices;          /* n above it (the engine's slots) is invalid_job; 0 = 16 */
    int32_t max_inputs;           /* inputs (documents) of an embed/rerank/score job at most (the
                                     engine's queue depth); 0 = KG_JOB_MAX_INPUTS */
    int32_t max_step_tokens;      /* the engine's max_batch_tokens: an encoder's (bert's) inputs
                                     run whole in one step, so longer ones are prompt_too_long;
                                     0 = no such bound */
    /* the names the model is served under (borrowed); a job naming another
     * gets model_not_found; n_served 0 accepts any name */
    const char *const *served;
    int32_t n_served;
    /* the LoRA adapters served (borrowed; NULL: none): a job's model may
     * name one, its lora list names them; one of --lora-dir is read on its
     * first job (kg_loras_resolve), so intake runs on one thread at a time */
    kg_loras_t *loras;
    /* the model's chat template compiled (kg_stack_chat_template; borrowed): chat jobs render
     * through it; a render error is invalid_job. NULL: the recognised-family renderer */
    const kg_chat_jinja_t *chat_template;
} kg_intake_limits_t;

typedef struct kg_prepared {
    int32_t *tokens; /* (n_tokens) owned; free with kg_prepared_clear */
    int32_t n_tokens;
    int32_t max_tokens;    /* after clamping to the context */
    kg_grammar_t *grammar; /* a reference for a constrained job (kg_prepared_clear drops it) */
    kg_lora_set_t lora;    /* the adapters the job runs with (n 0: the base) */
    /* embed, rerank and score jobs (kg_embedjob): `tokens` holds the inputs one after another */
    int32_t *input_len; /* (n_inputs) owned */
    int32_t n_inputs;   /* 0: a generation job */
    int32_t pooling;    /* KG_EMBED_POOL_* the job runs with */
    /* reasoning (kg_reasoning): whether the output's <think>...</think> is
     * parsed (reasoning_format deepseek; auto: a chat job on a model whose
     * chat template mentions </think>), whether the prompt opened the
     * thought, and the markers as tokens for the engine (thinking budget,
     * grammar after the thought) */
    bool think;
    bool think_opened;        /* also set (with the tokens) for a job with a thinking budget */
    int32_t think_open_token; /* <think> as one token, else -1 */
    int32_t think_close[KG_THINK_MAX_CLOSE];
    int32_t n_think_close; /* 0: </think> is more tokens than that */
    /* tool calls (kg_toolcall): the call syntax parsed out of the answer of a
     * chat job with tools (tool_choice not "none"), or of one without tools
     * whose syntax has its own reasoning markers (gpt-oss: parsed for its
     * reasoning only); NONE: not parsed. A required call's grammar is
     * `grammar` (kg_toolcall_grammar) */
    kg_toolfmt_t toolfmt;
    /* the call syntax's markers that are control tokens of this vocabulary,
     * written into the output as text (kg_output_keep) so the parse sees them */
    int32_t keep[KG_OUTPUT_MAX_KEEP];
    int32_t n_keep;
    /* an auto call's lazy grammar (`grammar`): unconstrained until the call's
     * opening marker, one token of this vocabulary, is sampled, or until the
     * output's text holds one of lazy_texts (gpt-oss's header: static strings
     * of kg_toolfmt_triggers) */
    bool lazy;
    bool lazy_opens; /* the marker is a control token: the grammar starts after it */
    int32_t lazy_token;
    int32_t n_lazy_texts;
    const char *lazy_texts[KG_ENGINE_MAX_LAZY_TEXTS];
    int32_t lazy_from[KG_ENGINE_MAX_LAZY_TEXTS];
} kg_prepared_t;

/** Prepare `job`. KG_OK fills `out`; KG_ERR_INVALID sets *code and a
 * message for the error event; KG_ERR_NOMEM on allocation failure.
 * `now_ms` is the epoch time used for the deadline check. @thread any */
KG_NODISCARD kg_status_t kg_intake_prepare(const kg_model_t *model,
                                           const kg_intake_limits_t *lim,
                                           const kg_job_t *job,
                                           int64_t now_ms,
                                           kg_prepared_t *out,
                                           kg_error_code_t *code,
                                           char *msg,
                                           size_t msg_size);

void kg_prepared_clear(kg_prepared_t *p);

/** The prompt text of a chat job (job->prompt_kind KG_PROMPT_MESSAGES) as
 * kg_intake_prepare renders it: through lim->chat_template when set, else the
 * recognised-family renderer; `*has_bos` says whether it starts with the BOS
 * text (then tokenizing adds none). KG_OK: `*text` malloc'ed (caller frees);
 * KG_ERR_INVALID sets *code and msg; KG_ERR_NOMEM. kgen render prints it.
 * @thread any */
KG_NODISCARD kg_status_t kg_intake_render_chat(const kg_model_t *model,
                                               const kg_intake_limits_t *lim,
                                               const kg_job_t *job,
                                               char **text,
                                               bool *has_bos,
                                               kg_error_code_t *code,
                                               char *msg,
                                               size_t msg_size);
