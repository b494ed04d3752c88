/* kg_intake: tokenize or render a job and check it against the limits. */
#include "kg_intake.h"

#include "../schema/kg_chat.h"
#include "../schema/kg_json_schema.h"
#include "kg_embedjob.h"
#include "kg_reasoning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kg_prepared_clear(kg_prepared_t *p) {
    free(p->tokens);
    p->tokens = NULL;
    p->n_tokens = 0;
    kg_grammar_unref(p->grammar);
    p->grammar = NULL;
    free(p->input_len);
    p->input_len = NULL;
    p->n_inputs = 0;
}

/* The compiled grammar of a constrained job, through the cache. */
static kg_status_t compile_constraint(const kg_intake_limits_t *lim,
                                      const kg_job_t *job,
                                      kg_prepared_t *out,
                                      kg_error_code_t *code,
                                      char *msg,
                                      size_t msg_size) {
    *code = job->constraint == KG_CONSTRAINT_JSON_SCHEMA ? KG_ERROR_INVALID_SCHEMA
                                                         : KG_ERROR_INVALID_JOB;
    if (!lim->grammars) {
        *code = KG_ERROR_INVALID_JOB;
        snprintf(msg, msg_size, "%s: constrained output is not available here",
                 kg_constraint_kind_str(job->constraint));
        return KG_ERR_INVALID;
    }
    kg_constraint_t k = {
        .kind = job->constraint, .text = job->constraint_text, .len = job->constraint_len};
    out->grammar = kg_grammar_cache_get(lim->grammars, &k, kg_json_schema_builder, msg, msg_size);
    return out->grammar ? KG_OK : KG_ERR_INVALID;
}

/* An auto call constrained once it opens (llama.cpp's lazy grammar), where
 * the job has no constraint of its own: where the call's opening marker is
 * one token, the answer is free until the model samples it (a text token, as
 * Qwen's <tool_call> is, is the grammar's first; a control token, as
 * Mistral's [TOOL_CALLS] is, opens the grammar that follows it); where the
 * call opens with text (gpt-oss's header, Functionary v3.1's <function=), the answer is free until
 * its text holds a trigger; where the syntax has no marker (Llama 3.x,
 * Functionary), one grammar holds from the first token whose other branch is
 * free text. A format with no grammar of that kind, or a marker that is no
 * one token, leaves the answer unconstrained (its calls parsed as written). */
static kg_status_t lazy_tools(const kg_tokenizer_t *tok,
                              const kg_intake_limits_t *lim,
                              const kg_job_t *job,
                              kg_prepared_t *out) {
    if (!lim->grammars || out->grammar || job->constraint != KG_CONSTRAINT_NONE) {
        return KG_OK;
    }
    const char *marker = kg_toolfmt_marker(out->toolfmt);
    int32_t id = marker ? kg_tokenizer_find(tok, marker, strlen(marker)) : -1;
    if (marker && (id < 0 || kg_tokenizer_is_eog(tok, id))) {
        return KG_OK;
    }
    size_t n_texts = kg_toolfmt_triggers(out->toolfmt, out->lazy_texts, out->lazy_from,
                                         KG_ENGINE_MAX_LAZY_TEXTS);
    kg_toolauto_t how = n_texts > 0                        ? KG_TOOLAUTO_TEXT
                        : !marker                          ? KG_TOOLAUTO_FREE
                        : kg_tokenizer_is_control(tok, id) ? KG_TOOLAUTO_OPENED
                                                           : KG_TOOLAUTO_MARKER;
    char msg[256];
    size_t len = 0;
    char *text = kg_toolcall_auto_constraint(
        out->toolfmt, job->tools_json, !job->no_parallel_tool_calls, how, &len, msg, sizeof(msg));
    if (!text) {
        return KG_OK;
    }
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    out->grammar = kg_grammar_cache_get(lim->grammars, &k, kg_toolcall_builder, msg, sizeof(msg));
    free(text);
    /* a tool schema the grammar cannot hold leaves the call unconstrained, as before */
    out->lazy = out->grammar != NULL && how != KG_TOOLAUTO_FREE;
    out->lazy_opens = how == KG_TOOLAUTO_OPENED;
    out->lazy_token = id;
    out->n_lazy_texts = out->lazy ? (int32_t)n_texts : 0;
    return KG_OK;
}

/* The call syntax's markers that are control tokens of this vocabulary (not
 * end-of-generation ones, which end the output anyway): kept in the output
 * text, or the parse could not see them. */
static void keep_markers(const kg_tokenizer_t *tok, kg_prepared_t *out) {
    const char *m[KG_OUTPUT_MAX_KEEP];
    size_t n = kg_toolfmt_markers(out->toolfmt, m, KG_OUTPUT_MAX_KEEP);
    out->n_keep = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = kg_tokenizer_find(tok, m[i], strlen(m[i]));
        if (id >= 0 && kg_tokenizer_is_control(tok, id) && !kg_tokenizer_is_eog(tok, id)) {
            out->keep[out->n_keep++] = id;
        }
    }
}

/* A chat job with tools: the call syntax its answer is parsed in and, for a
 * required call, the grammar that makes the model call. */
static kg_status_t prepare_tools(const kg_model_t *model,
                                 const kg_intake_limits_t *lim,
                                 const kg_job_t *job,
                                 kg_prepared_t *out,
                                 kg_error_code_t *code,
                                 char *msg,
                                 size_t msg_size) {
    *code = KG_ERROR_INVALID_JOB;
    bool required =
        job->tool_choice == KG_TOOL_CHOICE_REQUIRED || job->tool_choice == KG_TOOL_CHOICE_FUNCTION;
    if (job->prompt_kind != KG_PROMPT_MESSAGES) {
        if (!required) {
            return KG_OK; /* a plain prompt shows no tools: nothing to parse */
        }
        snprintf(msg, msg_size, "tool_choice: tool calls need a chat job (messages)");
        return KG_ERR_INVALID;
    }
    out->toolfmt = kg_toolfmt_detect(model->chat_template);
    if (!required) {
        return lazy_tools(model->tok, lim, job, out);
    }
    if (out->toolfmt == KG_TOOLFMT_NONE) {
        snprintf(msg, msg_size,
                 "tool_choice: this model's chat template teaches no tool-call syntax kgen knows, "
                 "so a call cannot be required");
        return KG_ERR_INVALID;
    }
    if (!lim->grammars) {
        snprintf(msg, msg_size, "tool_choice: constrained output is not available here");
        return KG_ERR_INVALID;
    }
    size_t len = 0;
    char *text = kg_toolcall_constraint(out->toolfmt, job->tools_json, job->tool_choice_name,
                                        !job->no_parallel_tool_calls, &len, msg, msg_size);
    if (!text) {
        return KG_ERR_INVALID;
    }
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    out->grammar = kg_grammar_cache_get(lim->grammars, &k, kg_toolcall_builder, msg, msg_size);
    free(text);
    /* a tool's parameters schema kgen cannot enforce */
    *code = KG_ERROR_INVALID_SCHEMA;
    return out->grammar ? KG_OK : KG_ERR_INVALID;
}

/* Tokenize text into a fresh array (grows once if the guess was short). */
static kg_status_t tokenize(
    const kg_tokenizer_t *tok, const char *text, size_t len, bool add_special, kg_prepared_t *out) {
    int64_t cap = (int64_t)len + 16;
    out->tokens = malloc((size_t)cap * sizeof(int32_t));
    if (!out->tokens) {
        return KG_ERR_NOMEM;
    }
    int64_t n = kg_tokenizer_encode(tok, text, len, add_special, true, out->tokens, cap);
    if (n > cap) {
        int32_t *t = realloc(out->tokens, (size_t)n * sizeof(int32_t));
        if (!t) {
            return KG_ERR_NOMEM;
        }
        out->tokens = t;
        n = kg_tokenizer_encode(tok, text, len, add_special, true, out->tokens, n);
    }
    if (n < 0) {
        return KG_ERR_INVALID;
    }
    out->n_tokens = (int32_t)n;
    return KG_OK;
}

/* Whether the job's output is parsed for reasoning (see kg_prepared_t). */
static bool think_on(const kg_model_t *model, const kg_job_t *job) {
    switch (job->reasoning_format) {
    case KG_REASONING_NONE:
        return false;
    case KG_REASONING_DEEPSEEK:
        return true;
    default:
        return job->prompt_kind == KG_PROMPT_MESSAGES && model->chat_template &&
               strstr(model->chat_template, KG_THINK_CLOSE) != NULL;
    }
}

/* The markers as tokens, and whether a token prompt's last tokens open the thought. */
static void think_tokens(const kg_tokenizer_t *tok, const kg_job_t *job, kg_prepared_t *out) {
    int32_t ids[KG_THINK_MAX_CLOSE];
    int64_t n = kg_tokenizer_encode(tok, KG_THINK_OPEN, sizeof(KG_THINK_OPEN) - 1, false, true, ids,
                                    KG_THINK_MAX_CLOSE);
    out->think_open_token = n == 1 ? ids[0] : -1;
    n = kg_tokenizer_encode(tok, KG_THINK_CLOSE, sizeof(KG_THINK_CLOSE) - 1, false, true,
                            out->think_close, KG_THINK_MAX_CLOSE);
    out->n_think_close = n > 0 && n <= KG_THINK_MAX_CLOSE ? (int32_t)n : 0;
    if (job->prompt_kind == KG_PROMPT_TOKENS) {
        char tail[256];
        size_t at = 0;
        for (int32_t i = out->n_tokens > 8 ? out->n_tokens - 8 : 0; i < out->n_tokens; i++) {
            at += kg_tokenizer_piece(tok, out->tokens[i], true, tail + at, sizeof(tail) - at);
            at = at < sizeof(tail) ? at : sizeof(tail) - 1;
        }
        out->think_opened = kg_think_prompt_opens(tail, at);
    } else if (job->prompt_kind == KG_PROMPT_TEXT) {
        out->think_opened = kg_think_prompt_opens(job->prompt, job->prompt_len);
    }
}

static const char *token_text(const kg_tokenizer_t *tok, int32_t id, char *buf, size_t cap) {
    buf[0] = '\0';
    if (id >= 0) {
        kg_gguf_str_t s = kg_tokenizer_token_text(tok, id);
        snprintf(buf, cap, "%.*s", (int)s.len, s.data);
    }
    return buf;
}

/* The model check and the job's adapters: its model must be a served name
 * or an adapter's (that adapter at its --lora scale), and each name of its
 * lora list an adapter's (--lora, or a file of --lora-dir, read on its
 * first job). model_not_found otherwise, naming what is served, or why an
 * adapter file cannot be used. */
static kg_status_t pick_loras(const kg_intake_limits_t *lim,
                              const kg_job_t *job,
                              kg_lora_set_t *set,
                              kg_error_code_t *code,
                              char *msg,
                              size_t msg_size) {
    memset(set, 0, sizeof(*set));
    bool served = false;
    for (int32_t i = 0; job->model && i < lim->n_served && !served; i++) {
        served = strcmp(job->model, lim->served[i]) == 0;
    }
    /* a --lora name first (as before --lora-dir); a served name is the base's, never a
     * directory file's (and costs no file lookup) */
    const kg_lora_entry_t *by_model = kg_loras_find(lim->loras, job->model);
    if (!by_model && !served &&
        kg_loras_resolve(lim->loras, job->model, &by_model, msg, msg_size) != KG_OK) {
        *code = KG_ERROR_MODEL_NOT_FOUND;
        return KG_ERR_INVALID;
    }
    if (by_model) {
        set->id[set->n] = by_model->id;
        set->scale[set->n++] = by_model->scale;
    } else if (job->model && lim->n_served > 0) {
        if (!served) {
            *code = KG_ERROR_MODEL_NOT_FOUND;
            int at =
                snprintf(msg, msg_size,
                         "model \"%.64s\" is not served here (this worker serves:", job->model);
            for (int32_t i = 0; i < lim->n_served && at > 0 && (size_t)at < msg_size; i++) {
                at += snprintf(msg + at, msg_size - (size_t)at, "%s \"%.48s\"", i ? "," : "",
                               lim->served[i]);
            }
            for (int32_t i = 0; lim->loras && i < lim->loras->n && at > 0 && (size_t)at < msg_size;
                 i++) {
                at += snprintf(msg + at, msg_size - (size_t)at, "%s \"%.48s\"",
                               i ? "," : "; LoRA adapters:", lim->loras->e[i].name);
            }
            if (lim->loras && lim->loras->dir && at > 0 && (size_t)at < msg_size) {
                at += snprintf(msg + at, msg_size - (size_t)at, "; and each NAME.gguf of %.128s",
                               lim->loras->dir);
            }
            if (at > 0 && (size_t)at < msg_size) {
                snprintf(msg + at, msg_size - (size_t)at, ")");
            }
            return KG_ERR_INVALID;
        }
    }
    for (int32_t i = 0; i < job->n_lora; i++) {
        const kg_lora_entry_t *e = NULL;
        if (kg_loras_resolve(lim->loras, job->lora[i].name, &e, msg, msg_size) != KG_OK) {
            *code = KG_ERROR_MODEL_NOT_FOUND;
            return KG_ERR_INVALID;
        }
        if (!e) {
            *code = KG_ERROR_MODEL_NOT_FOUND;
            snprintf(msg, msg_size, "lora: no adapter \"%.64s\" here (%d served; see --lora%s)",
                     job->lora[i].name, lim->loras ? lim->loras->n : 0,
                     lim->loras && lim->loras->dir ? " and --lora-dir" : "");
            return KG_ERR_INVALID;
        }
        if (set->n == KG_LORA_SET_MAX) {
            snprintf(msg, msg_size, "lora: more than %d adapters with model's", KG_LORA_SET_MAX);
            return KG_ERR_INVALID;
        }
        set->id[set->n] = e->id;
        set->scale[set->n++] = job->lora[i].has_scale ? job->lora[i].scale : e->scale;
    }
    const int32_t cap =
        lim->loras && lim->loras->adapters ? kg_adapters_max_resident(lim->loras->adapters) : 0;
    if (cap > 0 && set->n > cap) {
        snprintf(msg, msg_size,
                 "lora: the job runs with %d adapters; this worker holds at most %d at once "
                 "(--max-loras)",
                 set->n, cap);
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

kg_status_t kg_intake_render_chat(const kg_model_t *model,
                                  const kg_intake_limits_t *lim,
                                  const kg_job_t *job,
                                  char **text,
                                  bool *has_bos,
                                  kg_error_code_t *code,
                                  char *msg,
                                  size_t msg_size) {
    char bos[256], eos[256], err[512] = "";
    const kg_tokenizer_t *tok = model->tok;
    *text = NULL;
    token_text(tok, kg_tokenizer_bos(tok), bos, sizeof(bos));
    token_text(tok, kg_tokenizer_eos(tok), eos, sizeof(eos));
    kg_status_t st;
    bool oom = false;
    char *vars = kg_job_template_vars(job, &oom);
    if (oom) {
        return KG_ERR_NOMEM;
    }
    if (lim->chat_template) {
        kg_chat_jinja_opts_t co = {.add_generation_prompt = true,
                                   .bos_text = bos,
                                   .eos_text = eos,
                                   .extra_json = vars,
                                   .extra_json_len = vars ? strlen(vars) : 0,
                                   .message_extra = (const char *const *)job->message_extra};
        st = kg_chat_render_jinja(lim->chat_template, job->messages, (size_t)job->n_messages, &co,
                                  text, err, sizeof(err));
    } else if (job->tools_json || job->message_extra) {
        /* the recognised-family renderer has no place for tool definitions */
        st = KG_ERR_UNSUPPORTED;
        snprintf(err, sizeof(err),
                 "tools: this model's chat template is not rendered by the Jinja engine, so "
                 "tool definitions cannot be shown to it");
    } else {
        st = kg_chat_render(model->chat_template, job->messages, (size_t)job->n_messages, true, bos,
                            eos, text, err, sizeof(err));
    }
    free(vars);
    if (st == KG_ERR_UNSUPPORTED || (st != KG_OK && st != KG_ERR_NOMEM)) {
        *code =
            st == KG_ERR_UNSUPPORTED ? KG_ERROR_UNSUPPORTED_CHAT_TEMPLATE : KG_ERROR_INVALID_JOB;
        snprintf(msg, msg_size, "%s", *err ? err : "the model has no usable chat template");
        return KG_ERR_INVALID;
    }
    if (st != KG_OK) {
        return st;
    }
    /* the template may already start with the BOS text: tokenizing must not add a second */
    size_t bl = strlen(bos);
    *has_bos = bl > 0 && strncmp(*text, bos, bl) == 0;
    return KG_OK;
}

kg_status_t kg_intake_prepare(const kg_model_t *model,
                              const kg_intake_limits_t *lim,
                              const kg_job_t *job,
                              int64_t now_ms,
                              kg_prepared_t *out,
                              kg_error_code_t *code,
                              char *msg,
                              size_t msg_size) {
    memset(out, 0, sizeof(*out));
    const kg_tokenizer_t *tok = model->tok;
    kg_status_t st = KG_OK;
    *code = KG_ERROR_INVALID_JOB;

    if (job->deadline_ms > 0 && job->deadline_ms <= now_ms) {
        *code = KG_ERROR_EXPIRED;
        snprintf(msg, msg_size, "deadline_ms %lld passed %lld ms before the job was taken",
                 (long long)job->deadline_ms, (long long)(now_ms - job->deadline_ms));
        return KG_ERR_INVALID;
    }
    if (pick_loras(lim, job, &out->lora, code, msg, msg_size) != KG_OK) {
        return KG_ERR_INVALID;
    }
    int32_t max_n = lim->max_choices > 0 ? lim->max_choices : KG_JOB_MAX_N;
    if (job->n > max_n) {
        snprintf(msg, msg_size, "n: %d completions exceed this worker's max-batch-size of %d",
                 job->n, max_n);
        return KG_ERR_INVALID;
    }
    for (int32_t i = 0; i < job->sampling.n_logit_bias; i++) {
        if (job->sampling.logit_bias[i].token >= model->hp.n_vocab) {
            snprintf(msg, msg_size,
                     "logit_bias: %d is not a token of this model (vocabulary of %d)",
                     job->sampling.logit_bias[i].token, model->hp.n_vocab);
            return KG_ERR_INVALID;
        }
    }
    if (job->max_tokens > lim->max_tokens_limit) {
        *code = KG_ERROR_MAX_TOKENS_TOO_LARGE;
        /* the value the job sent, not a clamped one */
        snprintf(msg, msg_size, "max_tokens %lld exceeds this worker's limit of %d",
                 (long long)job->max_tokens, lim->max_tokens_limit);
        return KG_ERR_INVALID;
    }
    size_t meta_len = job->metadata_json ? strlen(job->metadata_json) : 0;
    if (lim->max_event_bytes > 0 && meta_len > lim->max_event_bytes) {
        snprintf(msg, msg_size,
                 "metadata: %zu bytes; the events of this worker carry at most %zu bytes, so it "
                 "could never be echoed",
                 meta_len, lim->max_event_bytes);
        return KG_ERR_INVALID;
    }

    if (job->task != KG_TASK_GENERATE) {
        return kg_embedjob_prepare(model, lim, job, out, code, msg, msg_size);
    }
    if (kg_model_non_causal(model)) {
        snprintf(msg, msg_size,
                 kg_model_embed_only(model)
                     ? "this model (%s) is an encoder: it runs embed, rerank and score jobs, not "
                       "generation"
                     : "this model (%s) is an embedding model (non-causal attention): it runs "
                       "embed jobs, not generation",
                 kg_arch_name(model->hp.arch));
        return KG_ERR_INVALID;
    }
    switch (job->prompt_kind) {
    case KG_PROMPT_TEXT:
        st = tokenize(tok, job->prompt, job->prompt_len, true, out);
        break;
    case KG_PROMPT_TOKENS:
        out->tokens =
            malloc((size_t)(job->n_prompt_tokens > 0 ? job->n_prompt_tokens : 1) * sizeof(int32_t));
        if (!out->tokens) {
            return KG_ERR_NOMEM;
        }
        for (int32_t i = 0; i < job->n_prompt_tokens; i++) {
            if (job->prompt_tokens[i] < 0 || job->prompt_tokens[i] >= model->hp.n_vocab) {
                snprintf(msg, msg_size,
                         "prompt_tokens[%d]: %d is not a token of this model "
                         "(vocabulary of %d)",
                         i, job->prompt_tokens[i], model->hp.n_vocab);
                kg_prepared_clear(out);
                return KG_ERR_INVALID;
            }
            out->tokens[i] = job->prompt_tokens[i];
        }
        out->n_tokens = job->n_prompt_tokens;
        break;
    case KG_PROMPT_MESSAGES: {
        char *text = NULL;
        bool has_bos = false;
        st = kg_intake_render_chat(model, lim, job, &text, &has_bos, code, msg, msg_size);
        if (st != KG_OK) {
            return st;
        }
        st = tokenize(tok, text, strlen(text), !has_bos, out);
        out->think_opened = kg_think_prompt_opens(text, strlen(text));
        free(text);
        break;
    }
    }
    if (st == KG_ERR_INVALID) {
        snprintf(msg, msg_size, "the prompt could not be tokenized");
    }
    if (st != KG_OK) {
        kg_prepared_clear(out);
        return st;
    }
    if (out->n_tokens == 0) {
        snprintf(msg, msg_size, "the prompt is empty and this model adds no BOS token");
        kg_prepared_clear(out);
        return KG_ERR_INVALID;
    }
    int32_t max_prompt = lim->max_prompt_tokens > 0 && lim->max_prompt_tokens < lim->max_seq_len
                             ? lim->max_prompt_tokens
                             : lim->max_seq_len - 1;
    if (out->n_tokens > max_prompt) {
        *code = KG_ERROR_PROMPT_TOO_LONG;
        snprintf(msg, msg_size, "the prompt has %d tokens; this worker takes at most %d",
                 out->n_tokens, max_prompt);
        kg_prepared_clear(out);
        return KG_ERR_INVALID;
    }
    out->think = think_on(model, job);
    if (out->think || job->has_thinking_budget) {
        think_tokens(tok, job, out);
    } else {
        out->think_opened = false;
    }
    int32_t room = lim->max_seq_len - out->n_tokens;
    out->max_tokens = job->max_tokens < room ? (int32_t)job->max_tokens : room;
    if (job->constraint != KG_CONSTRAINT_NONE &&
        compile_constraint(lim, job, out, code, msg, msg_size) != KG_OK) {
        kg_prepared_clear(out);
        return KG_ERR_INVALID;
    }
    bool tools = job->tools_json && job->tool_choice != KG_TOOL_CHOICE_NONE;
    if (tools && prepare_tools(model, lim, job, out, code, msg, msg_size) != KG_OK) {
        kg_prepared_clear(out);
        return KG_ERR_INVALID;
    }
    /* without tools, a chat answer in a syntax with its own reasoning markers (gpt-oss's
     * channels) is still parsed for its reasoning, as llama.cpp parses it */
    if (!tools && job->prompt_kind == KG_PROMPT_MESSAGES &&
        job->reasoning_format != KG_REASONING_NONE) {
        kg_toolfmt_t own = kg_toolfmt_detect(model->chat_template);
        out->toolfmt = kg_toolfmt_own_reasoning(own) ? own : KG_TOOLFMT_NONE;
    }
    keep_markers(tok, out);
    return KG_OK;
}
