/* kg_jinja: a Jinja2 interpreter for chat templates (tokenizer.chat_template).
 *
 * It covers what Hugging Face chat templates use, with the semantics of
 * llama.cpp's own engine (common/jinja, its --jinja path), which in turn
 * follows transformers: trim_blocks and lstrip_blocks on, a single trailing
 * newline of the source dropped, undefined values rendering as "".
 *
 * A template is compiled once (kg_jinja_compile) and is then read-only, so
 * one compiled template can be rendered from any thread. A render works in a
 * kg_jinja_ctx_t: an arena holding the variables the caller sets
 * (messages, tools, bos_token, ...) and every value the template makes,
 * freed at once with the context. Bad templates cannot hang or exhaust the
 * worker: a render stops with an error when it passes the output cap, the
 * evaluation-step cap (loops, filters, calls), the call-depth cap or the
 * memory cap of its arena. Errors are messages with the template's
 * line:column, never aborts. */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_jinja_template kg_jinja_template_t;
typedef struct kg_jinja_ctx kg_jinja_ctx_t;
typedef struct kg_jinja_str kg_jinja_str_t;   /* immutable string (arena) */
typedef struct kg_jinja_list kg_jinja_list_t; /* mutable list (arena) */
typedef struct kg_jinja_dict kg_jinja_dict_t; /* insertion-ordered dict (arena) */
typedef struct kg_jinja_fn kg_jinja_fn_t;     /* macro, builtin or bound method */

typedef enum kg_jinja_type {
    KG_JINJA_UNDEFINED = 0,
    KG_JINJA_NONE,
    KG_JINJA_BOOL,
    KG_JINJA_INT,
    KG_JINJA_FLOAT,
    KG_JINJA_STRING,
    KG_JINJA_LIST,
    KG_JINJA_DICT,
    KG_JINJA_CALLABLE,
} kg_jinja_type_t;

/* A value, passed by value; containers and strings point into a context's
 * arena (or, for literals, into the compiled template). */
typedef struct kg_jinja_value {
    kg_jinja_type_t type;
    union {
        bool b;
        int64_t i;
        double f;
        kg_jinja_str_t *s;
        kg_jinja_list_t *l;
        kg_jinja_dict_t *d;
        kg_jinja_fn_t *fn;
    } u;
} kg_jinja_value_t;

/* What one render may use. Zero fields take the defaults below. */
typedef struct kg_jinja_limits {
    size_t max_output_bytes; /* default 4 MiB */
    size_t max_memory_bytes; /* arena bytes, default 64 MiB */
    uint64_t max_steps;      /* nodes evaluated + loop iterations + items filtered; 10M */
    int32_t max_depth;       /* nested macro calls and expression depth; default 100 */
} kg_jinja_limits_t;

// ---- templates ----

/** Compile template source (not NUL-terminated: `len` bytes). NULL with
 * errstr "line:col: message" on a syntax error or allocation failure.
 * @thread any */
kg_jinja_template_t *
kg_jinja_compile(const char *src, size_t len, char *errstr, size_t errstr_size);

/** Free a compiled template; NULL does nothing. */
void kg_jinja_template_free(kg_jinja_template_t *tmpl);

// ---- render contexts ----

/** A context for one render; `lim` may be NULL (defaults). NULL on ENOMEM. */
kg_jinja_ctx_t *kg_jinja_ctx_new(const kg_jinja_limits_t *lim);

/** Free a context and every value in it; NULL does nothing. */
void kg_jinja_ctx_free(kg_jinja_ctx_t *ctx);

/* Constructors. The allocating ones return KG_JINJA_UNDEFINED when the
 * context's memory cap is reached (kg_jinja_ctx_failed then says so). */
kg_jinja_value_t kg_jinja_none(void);
kg_jinja_value_t kg_jinja_bool(bool b);
kg_jinja_value_t kg_jinja_int(int64_t i);
kg_jinja_value_t kg_jinja_float(double f);
kg_jinja_value_t kg_jinja_string(kg_jinja_ctx_t *ctx, const char *s, size_t len);
kg_jinja_value_t kg_jinja_list_new(kg_jinja_ctx_t *ctx);
kg_jinja_value_t kg_jinja_dict_new(kg_jinja_ctx_t *ctx);

/** Append `v` to the list `list`. KG_ERR_NOMEM past the memory cap. */
KG_NODISCARD kg_status_t kg_jinja_list_push(kg_jinja_ctx_t *ctx,
                                            kg_jinja_value_t list,
                                            kg_jinja_value_t v);

/** Set `key` (NUL-terminated) in the dict `dict`, replacing an old value in
 * place. KG_ERR_NOMEM past the memory cap. */
KG_NODISCARD kg_status_t kg_jinja_dict_set(kg_jinja_ctx_t *ctx,
                                           kg_jinja_value_t dict,
                                           const char *key,
                                           kg_jinja_value_t v);

/** Set a top-level variable of the render (messages, bos_token, ...). */
KG_NODISCARD kg_status_t kg_jinja_ctx_set(kg_jinja_ctx_t *ctx,
                                          const char *name,
                                          kg_jinja_value_t v);

/** Whether a constructor ran past the memory cap. */
bool kg_jinja_ctx_failed(const kg_jinja_ctx_t *ctx);

/** Set the clock strftime_now reads (seconds since the epoch, UTC); 0, the
 * default, reads the system clock. For reproducible renders (goldens). */
void kg_jinja_ctx_set_time(kg_jinja_ctx_t *ctx, int64_t epoch_s);

// ---- rendering ----

/** Render `tmpl` with the variables of `ctx`. KG_OK: `*out` is a malloc'ed
 * NUL-terminated string of `*out_len` bytes (the caller frees).
 * KG_ERR_INVALID: the template failed (raise_exception, a type error, a
 * limit passed); errstr says why and where ("line:col: ..."). KG_ERR_NOMEM.
 * A context is rendered once. @thread any */
KG_NODISCARD kg_status_t kg_jinja_render(const kg_jinja_template_t *tmpl,
                                         kg_jinja_ctx_t *ctx,
                                         char **out,
                                         size_t *out_len,
                                         char *errstr,
                                         size_t errstr_size);
