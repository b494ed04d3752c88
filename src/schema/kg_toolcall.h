/* kg_toolcall: tool calls parsed out of a chat model's output, in the call
 * syntax its chat template teaches it, for the formats llama.cpp's chat
 * parser knows (facts from llama.cpp's common/chat*.cpp, not its code;
 * checked against that parser's own results in tests/data/toolcall/).
 *
 * DESIGN
 * The format is chosen once per model from its template source by the
 * markers that template writes (as llama.cpp's specialised-template checks
 * do; for the formats its differential autoparser derives, the markers that
 * analysis finds in these templates): kg_toolfmt_detect. The parse runs once
 * on the finished answer (after the <think> split of kg_reasoning, which
 * already took a thought out): text before the first call is content; each
 * call keeps its arguments as the model wrote them (a JSON value's own text,
 * as llama.cpp does), except the tagged parameters of Qwen3-Coder, GLM and
 * MiniMax-M2, which become a compact JSON object (string-typed parameters, by
 * the tool's schema, as JSON strings; others as written when they are JSON).
 *   - A call the output ends inside (max_tokens) is kept with the arguments
 *     written so far, as llama.cpp does; a consumer sees finish_reason
 *     "length" beside it.
 *   - An output with a call marker that does not follow the syntax is all
 *     content, with no calls (llama.cpp throws "does not match the expected
 *     format" there): `malformed` says so, nothing is lost.
 *   - Command R7B, gpt-oss and Gemma 4 carry their reasoning in their own
 *     markers (<|START_THINKING|>, the analysis channel, <|channel>thought),
 *     and Kimi K2 a <think> block
 *     its Instruct templates do not close: the parse returns it.
 *   - Kimi K2's call ids (functions.N:I) are the model's own: kept as `id`.
 *   - Gemma 4's and LFM2's arguments are no JSON as written (<|"|> strings
 *     and bare keys; Python literals): converted to a compact JSON object as
 *     llama.cpp's mappers do (kg_toolcall_convert.c). Gemma 4's parse, like
 *     llama.cpp's, has no end: a call that breaks or names no tool of the
 *     job ends the calls and what follows is dropped (not malformed). */
#pragma once

#include "../core/kg_status.h"
#include "../grammar/kg_constraint.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum kg_toolfmt {
    KG_TOOLFMT_NONE = 0,     /* no call syntax known: all content */
    KG_TOOLFMT_HERMES,       /* <tool_call>\n{"name", "arguments"}\n</tool_call> (Hermes, Qwen2.5/3,
                                Granite 4) */
    KG_TOOLFMT_QWEN3_CODER,  /* <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>... */
    KG_TOOLFMT_LLAMA3,       /* {"name", "parameters"}, optionally after <|python_tag|> */
    KG_TOOLFMT_MISTRAL,      /* [TOOL_CALLS][{"name", "arguments", "id"}, ...] (Nemo) */
    KG_TOOLFMT_MISTRAL_ARGS, /* [TOOL_CALLS]name[ARGS]{...}, repeated (Devstral, Magistral) */
    KG_TOOLFMT_DEEPSEEK_R1, /* <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nA\n```... */
    KG_TOOLFMT_DEEPSEEK_V3, /* <｜tool▁call▁begin｜>N<｜tool▁sep｜>A<｜tool▁call▁end｜> (V3.1) */
    KG_TOOLFMT_COMMAND_R7B, /* <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]... */
    KG_TOOLFMT_FUNCTIONARY, /* v3.2: after the prompt's ">>>", "all\n" content or "name\n{...}" */
    KG_TOOLFMT_GPT_OSS, /* Harmony: <|channel|>commentary to=functions.N ...<|message|>A<|call|> */
    KG_TOOLFMT_GLM,     /* GLM-4.5/4.6/4.7: <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>
                           ...</tool_call> (newlines between in 4.5/4.6) */
    KG_TOOLFMT_KIMI_K2, /* <|tool_calls_section_begin|><|tool_call_begin|>functions.N:I
                           <|tool_call_argument_begin|>A<|tool_call_end|>...<|tool_calls_section_end|>
                         */
    KG_TOOLFMT_MINIMAX_M2,      /* <minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V
                                   </parameter>\n...</invoke>\n...</minimax:tool_call> */
    KG_TOOLFMT_GEMMA4,          /* <|tool_call>call:N{k:<|"|>v<|"|>,n:1}<tool_call|>, repeated */
    KG_TOOLFMT_LFM2,            /* <|tool_call_start|>[N(k="v", n=1), ...]<|tool_call_end|> */
    KG_TOOLFMT_FUNCTIONARY_V31, /* v3.1 (Llama 3.1 based): <function=N>{...}</function>, repeated
                                   (<|python_tag|> is no call: content, as llama.cpp has it) */
    KG_TOOLFMT_LAST = KG_TOOLFMT_FUNCTIONARY_V31,
} kg_toolfmt_t;

typedef struct kg_toolcall {
    char *name;
    char *arguments; /* JSON text (partial when the output ended inside it) */
    char *id;        /* the model's own id (Mistral, Command R, Kimi K2), else "" */
} kg_toolcall_t;

typedef struct kg_toolparse {
    char *content;      /* the answer without the calls (malloc'ed, never NULL after a parse) */
    size_t content_len; /* its bytes (model output may hold a NUL) */
    char *reasoning;    /* the format's own reasoning (Command R7B, gpt-oss, Kimi K2, Gemma 4), else
                           NULL */
    size_t reasoning_len;
    kg_toolcall_t *calls;
    size_t n_calls;
    bool malformed; /* a call marker was there but the syntax was not: all content */
} kg_toolparse_t;

/** The call syntax a chat template teaches, from its source. @thread any */
kg_toolfmt_t kg_toolfmt_detect(const char *tmpl_src);

/** A format's name for logs and goldens ("hermes", "qwen3_coder", ...). */
const char *kg_toolfmt_name(kg_toolfmt_t f);

/** Parse a finished answer text [0, len). `tools_json` (the job's tools as
 * a JSON array, or NULL) gives the tagged formats' parameter types. On KG_OK the
 * caller owns `out` (kg_toolparse_clear); KG_ERR_NOMEM leaves it cleared. */
kg_status_t kg_toolcall_parse(kg_toolfmt_t f,
                              const char *text,
                              size_t len,
                              const char *tools_json,
                              kg_toolparse_t *out) KG_NODISCARD;

/** kg_toolcall_parse for a job with reasoning_format none: a format's own
 * reasoning (gpt-oss's analysis messages) stays in the content, markers and
 * all, as llama.cpp keeps it; calls are parsed as usual. */
kg_status_t kg_toolcall_parse_keep_reasoning(kg_toolfmt_t f,
                                             const char *text,
                                             size_t len,
                                             const char *tools_json,
                                             kg_toolparse_t *out) KG_NODISCARD;

/** Whether format f carries its reasoning in markers of its own that only its
 * parse splits out, with tools or without (gpt-oss's Harmony channels; the
 * <think> formats are split by kg_reasoning). */
bool kg_toolfmt_own_reasoning(kg_toolfmt_t f);

/** The answer of a job without tools, in a format with its own reasoning
 * (kg_toolfmt_own_reasoning; else all content): its reasoning and content
 * split as kg_toolcall_parse does, never a call (a call the model writes
 * anyway is dropped, as llama.cpp drops it). */
kg_status_t kg_toolcall_parse_answer(kg_toolfmt_t f,
                                     const char *text,
                                     size_t len,
                                     kg_toolparse_t *out) KG_NODISCARD;

void kg_toolparse_clear(kg_toolparse_t *p);

// ---- required calls (kg_toolcall_grammar.c) ----

/** The constraint text (KG_CONSTRAINT_TOOL_CALLS) of a required call in
 * format f: any of the tools (`tools_json`, checked by the job decoder) or,
 * `only` not NULL, that one; more than one call when `parallel` and the
 * syntax has room for several (the tagged syntaxes of Qwen3-Coder, GLM and
 * MiniMax-M2: one expression a parameter, string-typed ones free text).
 * Malloc'ed, *len its length; NULL with a message for no format. */
char *kg_toolcall_constraint(kg_toolfmt_t f,
                             const char *tools_json,
                             const char *only,
                             bool parallel,
                             size_t *len,
                             char *msg,
                             size_t msg_size);

/* How an `auto` call is constrained once it opens (llama.cpp's lazy grammar). */
typedef enum kg_toolauto {
    KG_TOOLAUTO_MARKER, /* lazy: the marker is one text token, the grammar's first */
    KG_TOOLAUTO_OPENED, /* lazy: the marker is a control token, the grammar starts after it
                           (Mistral Nemo's [TOOL_CALLS]) */
    KG_TOOLAUTO_FREE,   /* no marker: one grammar from the first token, the calls or free
                           text (Llama 3.x's bare JSON, Functionary's recipient line) */
    KG_TOOLAUTO_TEXT,   /* lazy: the call opens with text, no token (gpt-oss's
                           `<|channel|>commentary to=` inside a message header, Functionary
                           v3.1's `<function=`): the grammar starts at a text trigger
                           (kg_toolfmt_triggers) */
} kg_toolauto_t;

/** The constraint text of an `auto` call in format f, constrained `how`;
 * NULL with a message where the format has no grammar of that kind (the
 * call then stays as the model writes it). */
char *kg_toolcall_auto_constraint(kg_toolfmt_t f,
                                  const char *tools_json,
                                  bool parallel,
                                  kg_toolauto_t how,
                                  size_t *len,
                                  char *msg,
                                  size_t msg_size);

/** The markers format f's parse reads that a vocabulary may hold as control
 * tokens (written as nothing unless kept: kg_output_keep), as llama.cpp's
 * preserved tokens: up to `cap` into `out`; returns how many. */
size_t kg_toolfmt_markers(kg_toolfmt_t f, const char **out, size_t cap);

/** The marker a call opens with in format f, where the call grammar starts
 * with it (so an `auto` job's grammar can wait for it: a lazy grammar), or
 * NULL (Llama 3.x's bare JSON, Functionary's name; gpt-oss's header and Functionary v3.1's
 * `<function=`, which are text: kg_toolfmt_triggers). */
const char *kg_toolfmt_marker(kg_toolfmt_t f);

/** The text triggers of format f's `auto` calls where a call opens with text, no token
 * (KG_TOOLAUTO_TEXT; Functionary v3.1: `<function=`, its grammar from the trigger's first byte;
 * gpt-oss: `<|start|>assistant` and then `<|channel|>commentary to`,
 * `<|channel|>analysis to` or ` to`, as llama.cpp's grammar triggers for it), each with the
 * byte its grammar starts at (after `<|start|>assistant`, which the prompt's generation prompt
 * or an earlier message wrote): up to `cap` into `text` and `from`; returns how many (0: the
 * format has none). */
size_t kg_toolfmt_triggers(kg_toolfmt_t f, const char **text, int32_t *from, size_t cap);

/** The grammar cache's builder for KG_CONSTRAINT_TOOL_CALLS (other kinds go
 * to kg_json_schema_builder). */
kg_gir_t *
kg_toolcall_builder(const kg_constraint_t *c, char *errstr, size_t errstr_size, void *ctx);
