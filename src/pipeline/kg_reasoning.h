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
 * single <think> tokens splits the same way. */
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

typedef struct kg_think {
    kg_think_state_t state;
    size_t r_off;   /* the thought's first byte (after <think>) */
    size_t r_end;   /* KG_THINK_CLOSED: where </think> starts */
    size_t a_off;   /* KG_THINK_CLOSED: the answer's first byte (after </think>) */
    size_t scanned; /* KG_THINK_IN: text before this has no </think> start */
    bool partial;   /* KG_THINK_UNDECIDED: a prefix of <think> follows the whitespace */
} kg_think_t;

/** Start a split: `on` false keeps the raw text; `opened`: the prompt
 * opened the thought. */
void kg_think_init(kg_think_t *t, bool on, bool opened);

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
