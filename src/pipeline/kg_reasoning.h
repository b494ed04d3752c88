/* kg_reasoning: a reasoning model's output split into its thought and its
 * answer, for the <think>...</think> format (Qwen3, QwQ, DeepSeek-R1 and
 * its distills), with the markers and cases llama.cpp's chat parser and
 * vLLM's reasoning parsers know (facts from llama.cpp's common/chat*.cpp,
 * not its code).
 *
 * DESIGN
 * The split works on the output text as it grows (kg_output scans after
 * every token), so each token can say which part it belongs to, and the
 * done event gets both parts at the end:
 *   - a thought opens with <think> at the start of the output (after
 *     whitespace), or the prompt opened it: a rendered prompt that ends in
 *     <think> and whitespace (Qwen3 Thinking, QwQ, DeepSeek-R1 templates
 *     write it into the generation prompt), so the output starts inside it;
 *   - it closes at the first </think>; the answer is everything after it,
 *     unchanged (no whitespace trimmed, as vLLM does; llama.cpp trims);
 *   - an output that does not open a thought is all answer, with no
 *     reasoning; a thought that never closes (max_tokens, a stop string) is
 *     all reasoning, with an empty answer (vLLM's DeepSeek-R1 parser does
 *     the same; llama.cpp returns it as content), so a consumer of the
 *     answer never gets half a thought.
 * A token belongs to the reasoning when its text ends at or before the end
 * of </think> (so <think> and </think> tokens are reasoning tokens), and to
 * the answer after. Markers are plain text here: a vocabulary without
 * single <think> tokens splits the same way. gpt-oss's Harmony channels
 * get token parts by the same rules (kg_think_init_harmony). */
#pragma once

#include "../schema/kg_codec_event.h"

#include <stdbool.h>
#include <stddef.h>

#define KG_THINK_OPEN  "<think>"
#define KG_THINK_CLOSE "</think>"

typedef enum kg_think_state {
    KG_THINK_OFF = 0,   /* not parsed: the raw text is the answer */
    KG_THINK_UNDECIDED, /* only whitespace, or a prefix of <think>, so far */
    KG_THINK_IN,        /* inside the thought */
    KG_THINK_CLOSED,    /* the thought closed; the answer follows */
    KG_THINK_NONE,      /* the output opened no thought: all answer */
} kg_think_state_t;

/* gpt-oss's Harmony channels, for token parts only (the done event's split is the tool-call
 * parse's, kg_toolcall_parse_answer): where the output is. */
typedef enum kg_harmony_state {
    KG_HARMONY_START = 0, /* the output's first bytes: a header may open it */
    KG_HARMONY_HEADER,    /* a message's header, up to its <|message|> */
    KG_HARMONY_BODY,      /* its body, up to <|end|>, <|call|> or <|return|> */
    KG_HARMONY_NONE,      /* the output is not in channels: all answer */
} kg_harmony_state_t;

typedef struct kg_think {
    kg_think_state_t state;
    size_t r_off;   /* the thought's first byte (after <think>) */
    size_t r_end;   /* KG_THINK_CLOSED: where </think> starts */
    size_t a_off;   /* KG_THINK_CLOSED: the answer's first byte (after </think>) */
    size_t scanned; /* KG_THINK_IN: text before this has no </think> start (Harmony: no marker) */
    bool partial;   /* KG_THINK_UNDECIDED: a prefix of <think> follows the whitespace (Harmony,
                       KG_HARMONY_START: the text is a prefix of a header) */

    /* the Harmony scan (kg_think_init_harmony), not the <think> one */
    bool harmony;
    kg_harmony_state_t hs;
    size_t h_off;        /* KG_HARMONY_HEADER: the header's first byte */
    size_t b_off;        /* KG_HARMONY_BODY: the body's first byte */
    bool body_reasoning; /* KG_HARMONY_BODY: an analysis message's (no call) */
    bool body_call;      /* KG_HARMONY_BODY: a call's arguments, JSON: an end marker inside */
    bool in_str, esc;    /* one of its strings is no end (where the scan is in them) */
    size_t seen;         /* the text's length at the last scan (a stop's cut rescans) */
} kg_think_t;

/** Start a split: `on` false keeps the raw text; `opened`: the prompt
 * opened the thought. */
void kg_think_init(kg_think_t *t, bool on, bool opened);

/** Start the token parts of gpt-oss's Harmony channels: only the bodies of final and
 * commentary messages (a preamble, a call's arguments) are the answer's; an analysis message
 * and every header and end marker (`<|start|>assistant<|channel|>final<|message|>`,
 * `<|end|>`) are the reasoning's, as the <think> markers are. An output that does not open
 * with a header (`<|channel|>` or ` to=`) is all answer, a partial one the reasoning's until
 * it breaks. kg_think_split leaves the text whole: the parse splits it. */
void kg_think_init_harmony(kg_think_t *t);

/** Scan the output text [0, len) (it only grows between calls, but for a
 * stop string's cut, which never reaches text already scanned as closed). */
void kg_think_scan(kg_think_t *t, const char *text, size_t len);

/** The part of a token whose text ends at byte `end` (after a scan that
 * covered it). KG_PART_NONE when not parsed. */
kg_token_part_t kg_think_part(const kg_think_t *t, size_t end);

/** The final split of text [0, len): the answer, and the reasoning
 * (*reasoning NULL when the output had no thought or is not parsed). */
void kg_think_split(const kg_think_t *t,
                    const char *text,
                    size_t len,
                    const char **answer,
                    size_t *answer_len,
                    const char **reasoning,
                    size_t *reasoning_len);

/** Whether a rendered prompt opens the thought itself: it ends with <think>
 * followed only by whitespace. */
bool kg_think_prompt_opens(const char *prompt, size_t len);
