/* kg_job: one generation job as decoded from the jobs topic
 * (schemas/job.schema.json). Plain C, no JSON: kg_codec_decode_job fills
 * it, the intake tokenizes it and hands the engine a kg_request_t.
 *
 * Every pointer in a kg_job_t is owned by the job and released by
 * kg_job_free, including the message contents (kg_chat_message_t holds
 * them as const char * so the array can be passed to kg_chat_render
 * directly; the roles point to static strings). */
#pragma once

#include "../grammar/kg_constraint.h"
#include "../model/kg_sampler.h"
#include "kg_chat.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The major version of the job and event contract this build speaks. */
#define KG_SCHEMA_VERSION 1

/* Contract limits (the schema states the same numbers). */
#define KG_JOB_REQUEST_ID_MAX     128 /* bytes of [A-Za-z0-9._:-] */
#define KG_JOB_MAX_STOP           8   /* stop strings per job */
#define KG_JOB_STOP_MAX_CHARS     256 /* code points per stop string */
#define KG_JOB_DEFAULT_MAX_TOKENS 256
#define KG_JOB_MAX_N              16  /* choices per job (KG_MAX_CHOICES of the engine) */
#define KG_JOB_MODEL_MAX          256 /* code points of a model name */
#define KG_JOB_MAX_LORA           4   /* adapters one job names at most (KG_LORA_SET_MAX) */

typedef enum kg_prompt_kind {
    KG_PROMPT_TEXT = 0,     /* prompt / prompt_len */
    KG_PROMPT_TOKENS = 1,   /* prompt_tokens / n_prompt_tokens */
    KG_PROMPT_MESSAGES = 2, /* messages / n_messages */
} kg_prompt_kind_t;

/* One adapter of a job's lora list. */
typedef struct kg_job_lora {
    char *name;  /* owned, 1..256 code points */
    float scale; /* when has_scale; else the worker's --lora scale */
    bool has_scale;
} kg_job_lora_t;
/* What a job asks for (its "task"). */
typedef enum kg_task {
    KG_TASK_GENERATE = 0, /* text from a prompt (the default) */
    KG_TASK_EMBED,        /* one vector per input */
    KG_TASK_RERANK,       /* relevance of each document to the query, sorted, cut to top_n */
    KG_TASK_SCORE,        /* relevance of each text_2 to text_1, in input order */
} kg_task_t;

#define KG_JOB_MAX_INPUTS 2048 /* inputs (or documents) per job, as OpenAI allows */

/* Pooling as llama.cpp numbers it (<arch>.pooling_type). */
typedef enum kg_pooling {
    KG_POOLING_MODEL = -1, /* the job gave none: the model's, else last */
    KG_POOLING_NONE = 0,
    KG_POOLING_MEAN = 1,
    KG_POOLING_CLS = 2,
    KG_POOLING_LAST = 3,
    KG_POOLING_RANK = 4,
} kg_pooling_t;

/* One input of an embedding or rerank job: text, or token ids when text is NULL. */
typedef struct kg_job_input {
    char *text; /* owned, len bytes + a NUL, or NULL */
    size_t len;
    int32_t *tokens; /* owned (n_tokens) ids >= 0, when text is NULL */
    int32_t n_tokens;
} kg_job_input_t;
/* reasoning_format: how `<think>...</think>` in the output is reported. */
typedef enum kg_reasoning_format {
    KG_REASONING_AUTO = 0, /* parsed when the model's chat template is a thinking one */
    KG_REASONING_NONE,     /* never: the raw text, as before reasoning was parsed */
    KG_REASONING_DEEPSEEK, /* always (llama.cpp's name for the <think> format) */
} kg_reasoning_format_t;

/* tool_choice (with tools): whether and which tool calls the output holds. */
typedef enum kg_tool_choice {
    KG_TOOL_CHOICE_AUTO = 0, /* the model decides; its calls are parsed out of the answer */
    KG_TOOL_CHOICE_NONE,     /* tools are shown to the model, the output is not parsed */
    KG_TOOL_CHOICE_REQUIRED, /* one call or more, constrained to the tools' schemas */
    KG_TOOL_CHOICE_FUNCTION, /* a call of tool_choice_name, constrained */
} kg_tool_choice_t;

typedef struct kg_job {
    char *request_id;       /* NUL-terminated, 1..128 chars of [A-Za-z0-9._:-] */
    int32_t schema_version; /* always KG_SCHEMA_VERSION once decoded */

    /* ---- the prompt: exactly one kind ---- */
    kg_prompt_kind_t prompt_kind;
    char *prompt;           /* KG_PROMPT_TEXT: prompt_len bytes + a NUL; may contain NUL */
    size_t prompt_len;      /* bytes */
    int32_t *prompt_tokens; /* KG_PROMPT_TOKENS: (n_prompt_tokens) ids >= 0 */
    int32_t n_prompt_tokens;
    kg_chat_message_t *messages; /* KG_PROMPT_MESSAGES: (n_messages); contents have no NUL */
    int32_t n_messages;

    /* ---- generation ---- */
    int64_t max_tokens;            /* >= 1 as the job wrote it (the intake checks the limit and
                                      reports this value); default 256 */
    kg_sampling_params_t sampling; /* temperature 1, filters off, seed from request_id by
                                      default; n_logprobs is the job's "logprobs" */
    char **stop;                   /* (n_stop) NUL-terminated strings, each 1..256 code points */
    int32_t n_stop;
    bool stream;         /* default true: token events, then done */
    bool ignore_eos;     /* default false */
    int64_t deadline_ms; /* absolute epoch ms; 0 = none */
    int32_t priority;    /* higher runs first; default 0 */
    char *metadata_json; /* the metadata object as compact JSON text, NULL when absent */
    char *model;         /* the model the job names; NULL: whichever the worker serves */
    kg_job_lora_t lora[KG_JOB_MAX_LORA]; /* LoRA adapters by name (llama.cpp's lora field) */
    int32_t n_lora;
    int32_t n; /* choices: independent completions of the prompt, 1..16 (default 1) */
    /* sampling.logit_bias, when set, points to an array the job owns */

    /* ---- constrained output: at most one of response_format (json_object /
     * json_schema), regex, choice, grammar; KG_CONSTRAINT_NONE otherwise ---- */
    kg_constraint_kind_t constraint;
    char *constraint_text; /* owned, constraint_len bytes + a NUL: the schema as compact JSON,
                              the regex, the GBNF text, or kg_constraint_choice_encode's list */
    size_t constraint_len;
    char *schema_name;  /* json_schema: response_format.json_schema.name (owned) */
    bool schema_strict; /* json_schema: its strict flag (the output is constrained either way) */

    /* ---- embeddings and reranking (task != GENERATE; the prompt is then unused) ---- */
    kg_task_t task;
    kg_job_input_t *inputs; /* (n_inputs) embed: input; rerank: documents; score: text_2 */
    int32_t n_inputs;
    kg_job_input_t query; /* rerank: query; score: text_1 */
    int32_t top_n;        /* rerank: results kept, 0 = all */
    kg_pooling_t pooling; /* embed: KG_POOLING_MODEL unless the job says */
    bool normalize;       /* embed: L2-normalise (default true) */
    int32_t dimensions;   /* embed: keep the first n, then normalise; 0 = all */
    bool base64;          /* embed: encoding_format "base64" (little-endian float32) */
    /* ---- chat template variables and reasoning (kg_codec_reasoning.c) ---- */
    char *template_kwargs_json;   /* chat_template_kwargs: a JSON object as compact text, or NULL */
    char *reasoning_effort;       /* a template variable ("low", "medium", "high"), or NULL */
    char *tools_json;             /* tools: a JSON array as compact text, or NULL */
    char **message_extra;         /* NULL, or per message its tool_calls, tool_call_id and name
                                     as a JSON object's compact text (or NULL) */
    kg_tool_choice_t tool_choice; /* with tools; default auto (kg_codec_tools.c) */
    char *tool_choice_name;       /* KG_TOOL_CHOICE_FUNCTION: the function (owned) */
    bool no_parallel_tool_calls;  /* parallel_tool_calls false: one call at most */
    kg_reasoning_format_t reasoning_format; /* default KG_REASONING_AUTO */
    bool has_thinking_budget;               /* thinking_token_budget was given */
    int32_t thinking_token_budget;          /* reasoning tokens before the thought is closed */

    /* ---- where the job came from: set by the caller, not by the codec ---- */
    char *topic;       /* owned (strdup it); NULL when not from Kafka */
    int32_t partition; /* -1 when not from Kafka (the codec's default) */
    int64_t offset;    /* -1 when not from Kafka (the codec's default) */
} kg_job_t;

/** Free a job and everything it owns. kg_job_free(NULL) does nothing.
 * @thread any */
void kg_job_free(kg_job_t *job);

/** The seed a job gets when it gives none: 64-bit FNV-1a of the
 * request_id's bytes with the top bit cleared (so it fits the schema's
 * 0..2^63-1). A redelivered job therefore samples the same tokens.
 * @thread any */
uint64_t kg_job_default_seed(const char *request_id);

/** The sampling defaults of the contract (which differ from the sampler's
 * greedy defaults): temperature 1, top_k -1, top_p 1, min_p 0, penalties
 * off, repetition penalty over the whole sequence (penalty_last_n -1),
 * seed 0 (the decoder then derives it from the request_id), no logprobs.
 * @thread any */
kg_sampling_params_t kg_job_sampling_defaults(void);

/** The variables a job adds to its chat template, as a JSON object's text
 * (malloc'ed): reasoning_effort and tools when given, then every key of
 * chat_template_kwargs (which wins). NULL with *oom false when the job sets
 * none; NULL with *oom true when out of memory. @thread any */
char *kg_job_template_vars(const kg_job_t *job, bool *oom);
