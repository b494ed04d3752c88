/* kg_chat: turns chat messages into one prompt string with the model's
 * chat template, the way llama.cpp's built-in renderer does
 * (src/llama-chat.cpp: llm_chat_detect_template + llm_chat_apply_template).
 *
 * It is not a Jinja engine. The template text from the GGUF metadata
 * (tokenizer.chat_template) is recognised by marker strings it contains,
 * in llama.cpp's order, and each known format is written by hand. A
 * template that matches no known format, or a format llama.cpp knows but
 * kgen does not render, is KG_ERR_UNSUPPORTED; the worker reports that as
 * an unsupported_chat_template error instead of guessing. In particular a
 * model without a template is not rendered as ChatML (llama.cpp's default):
 * a silently wrong prompt format produces plausible but bad output, which
 * is worse than an error the producer can see. */
#pragma once

#include "../core/kg_status.h"
#include "../jinja/kg_jinja.h"

#include <stdbool.h>
#include <stddef.h>

/* One chat turn, as llama.cpp's llama_chat_message. */
typedef struct kg_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool"; written as given */
    const char *content; /* NUL-terminated UTF-8 */
} kg_chat_message_t;

/* The formats llama.cpp tells apart, in its own naming. */
typedef enum kg_chat_template {
    KG_CHAT_TEMPLATE_UNKNOWN = 0,
    KG_CHAT_TEMPLATE_CHATML,
    KG_CHAT_TEMPLATE_LLAMA_2,
    KG_CHAT_TEMPLATE_LLAMA_2_SYS,
    KG_CHAT_TEMPLATE_LLAMA_2_SYS_BOS,
    KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP,
    KG_CHAT_TEMPLATE_MISTRAL_V1,
    KG_CHAT_TEMPLATE_MISTRAL_V3,
    KG_CHAT_TEMPLATE_MISTRAL_V3_TEKKEN,
    KG_CHAT_TEMPLATE_MISTRAL_V7,
    KG_CHAT_TEMPLATE_MISTRAL_V7_TEKKEN,
    KG_CHAT_TEMPLATE_PHI_3,
    KG_CHAT_TEMPLATE_PHI_4,
    KG_CHAT_TEMPLATE_FALCON_3,
    KG_CHAT_TEMPLATE_ZEPHYR,
    KG_CHAT_TEMPLATE_MONARCH,
    KG_CHAT_TEMPLATE_GEMMA,
    KG_CHAT_TEMPLATE_ORION,
    KG_CHAT_TEMPLATE_OPENCHAT,
    KG_CHAT_TEMPLATE_VICUNA,
    KG_CHAT_TEMPLATE_VICUNA_ORCA,
    KG_CHAT_TEMPLATE_DEEPSEEK,
    KG_CHAT_TEMPLATE_DEEPSEEK_2,
    KG_CHAT_TEMPLATE_DEEPSEEK_3,
    KG_CHAT_TEMPLATE_COMMAND_R,
    KG_CHAT_TEMPLATE_LLAMA_3,
    KG_CHAT_TEMPLATE_CHATGLM_3,
    KG_CHAT_TEMPLATE_CHATGLM_4,
    KG_CHAT_TEMPLATE_GLMEDGE,
    KG_CHAT_TEMPLATE_MINICPM,
    KG_CHAT_TEMPLATE_EXAONE_3,
    KG_CHAT_TEMPLATE_EXAONE_4,
    KG_CHAT_TEMPLATE_RWKV_WORLD,
    KG_CHAT_TEMPLATE_GRANITE,
    KG_CHAT_TEMPLATE_GIGACHAT,
    KG_CHAT_TEMPLATE_MEGREZ,
    KG_CHAT_TEMPLATE_YANDEX,
    KG_CHAT_TEMPLATE_BAILING,
    KG_CHAT_TEMPLATE_BAILING_THINK,
    KG_CHAT_TEMPLATE_BAILING2,
    KG_CHAT_TEMPLATE_LLAMA4,
    KG_CHAT_TEMPLATE_SMOLVLM,
    KG_CHAT_TEMPLATE_DOTS1,
    KG_CHAT_TEMPLATE_HUNYUAN_MOE,
    KG_CHAT_TEMPLATE_OPENAI_MOE,
    KG_CHAT_TEMPLATE_HUNYUAN_DENSE,
    KG_CHAT_TEMPLATE_KIMI_K2,
    KG_CHAT_TEMPLATE_SEED_OSS,
    KG_CHAT_TEMPLATE_GROK_2,
    KG_CHAT_TEMPLATE_PANGU_EMBED,
    KG_CHAT_TEMPLATE_COUNT_,
} kg_chat_template_t;

// ---- detection (kg_chat.c) ----

/** Recognise a template: either a llama.cpp template name ("chatml",
 * "llama3", "mistral-v7", ...) or Jinja template text, tested for marker
 * strings in the same order as llm_chat_detect_template. NULL or no match:
 * KG_CHAT_TEMPLATE_UNKNOWN. @thread any */
kg_chat_template_t kg_chat_detect(const char *template_text);

/** llama.cpp's name of a format ("chatml", "llama2-sys", ...); "unknown"
 * for KG_CHAT_TEMPLATE_UNKNOWN. Never NULL. @thread any */
const char *kg_chat_template_name(kg_chat_template_t tmpl);

// ---- rendering (kg_chat_render.c) ----

/** Whether kg_chat_render can write this format. @thread any */
bool kg_chat_template_is_supported(kg_chat_template_t tmpl);

/** Render `n` messages with the format recognised in `template_text`,
 * appending the assistant's generation prompt when `add_generation_prompt`
 * (formats without one, like llama.cpp's Llama 2 and Mistral, ignore it).
 * The output is byte-for-byte what llama.cpp's llm_chat_apply_template
 * writes, so it does not start with BOS: tokenize it with add_special as
 * for a plain prompt.
 *
 * `bos_text` / `eos_text` (the vocabulary's BOS/EOS token text, may be
 * NULL) are accepted so callers need not change when a format that uses
 * them is added; the formats rendered now write their special tokens
 * literally, exactly as llama.cpp does, and ignore them.
 *
 * Returns KG_OK with `*out` a malloc'ed NUL-terminated string (the caller
 * frees); KG_ERR_UNSUPPORTED when the template is NULL, unrecognised, or a
 * format kgen does not render (errstr says which); KG_ERR_NOMEM.
 * @thread any */
KG_NODISCARD kg_status_t kg_chat_render(const char *template_text,
                                        const kg_chat_message_t *msgs,
                                        size_t n,
                                        bool add_generation_prompt,
                                        const char *bos_text,
                                        const char *eos_text,
                                        char **out,
                                        char *errstr,
                                        size_t errstr_size);

/** Render with an already detected format (see kg_chat_render). */
KG_NODISCARD kg_status_t kg_chat_render_template(kg_chat_template_t tmpl,
                                                 const kg_chat_message_t *msgs,
                                                 size_t n,
                                                 bool add_generation_prompt,
                                                 char **out,
                                                 char *errstr,
                                                 size_t errstr_size);

// ---- the model's own template through the Jinja engine (kg_chat_jinja.c) ----

/* A chat template compiled for the Jinja engine, with what it supports
 * (read once, by probing it as llama.cpp does). Read-only after creation:
 * renders may run from any thread. */
typedef struct kg_chat_jinja kg_chat_jinja_t;

/** Compile template text. NULL with errstr ("line:col: why") when it does
 * not compile or memory ran out. @thread any */
kg_chat_jinja_t *
kg_chat_jinja_new(const char *template_text, size_t len, char *errstr, size_t errstr_size);

/** Compile a model's tokenizer.chat_template, once at model load. NULL when
 * the model has none or it does not compile; the latter logs one WARN line
 * saying why, and chat jobs then use the recognised-family renderer
 * (kg_chat_render). @thread any */
kg_chat_jinja_t *kg_chat_jinja_compile(const char *template_text);

/** Free; NULL does nothing. */
void kg_chat_jinja_free(kg_chat_jinja_t *chat);

/** Whether the template renders a system message (llama.cpp's
 * supports_system_role): when not, kg_chat_render_jinja merges a leading
 * system message into the next one ("system\nnext"), as llama.cpp does. */
bool kg_chat_jinja_system_role(const kg_chat_jinja_t *chat);

typedef struct kg_chat_jinja_opts {
    bool add_generation_prompt;
    const char *bos_text;   /* bos_token; NULL: "" */
    const char *eos_text;   /* eos_token; NULL: "" */
    const char *extra_json; /* a JSON object whose keys become variables
                               (chat_template_kwargs, tools); may be NULL */
    size_t extra_json_len;
    int64_t now_s;                   /* strftime_now and date_string; 0: the clock */
    const kg_jinja_limits_t *limits; /* NULL: the engine's defaults */
    /* per message (n of them) or NULL: a JSON object's text whose keys join
     * that message (tool_calls, tool_call_id, name), or NULL */
    const char *const *message_extra;
} kg_chat_jinja_opts_t;

/** Render `n` messages with a compiled template, setting the variables as
 * llama.cpp's --jinja path does (messages as {role, content}, a leading
 * system message merged into the next when the template has no system role,
 * bos_token, eos_token, enable_thinking true, add_generation_prompt when
 * set, date_string and datetime; then each key of `extra_json`, which may
 * override them). KG_OK: `*out` malloc'ed (the caller frees).
 * KG_ERR_INVALID: the template failed (errstr: "chat template: line:col:
 * why"). KG_ERR_NOMEM. @thread any */
KG_NODISCARD kg_status_t kg_chat_render_jinja(const kg_chat_jinja_t *chat,
                                              const kg_chat_message_t *msgs,
                                              size_t n,
                                              const kg_chat_jinja_opts_t *o,
                                              char **out,
                                              char *errstr,
                                              size_t errstr_size);

/** Set each key of the JSON object `json` as a top-level variable of `ctx`
 * (key order kept: tojson of a dict writes keys as the JSON had them).
 * KG_ERR_INVALID with errstr when it is not an object or passes the
 * context's memory limit. @thread any */
KG_NODISCARD kg_status_t kg_chat_jinja_set_json(
    kg_jinja_ctx_t *ctx, const char *json, size_t len, char *errstr, size_t errstr_size);
