/* kg_output: one job's generated tokens turned into streamed text.
 *
 * DESIGN
 * Token ids become bytes through the tokenizer; text is released to the
 * stream only when it is (a) whole UTF-8 characters and (b) cannot be the
 * start of one of the job's stop strings. When a stop string appears, the
 * text is cut where it starts (the stop string is not part of the output,
 * as in vLLM and the OpenAI API) and the job is over.
 *
 * Every token gets one token event, in index order, and the token events'
 * texts joined equal the done event's text. Text held back at the end of
 * the job (a possible stop prefix that never completed, an incomplete
 * character) must go somewhere: so a token event whose text left bytes
 * held back is kept pending until the next token or the finish, and the
 * finish appends the tail to it. Events are only delayed while text is
 * held back, which the reader could not have seen anyway. */
#pragma once

#include "../model/kg_sampler.h"
#include "../model/kg_tokenizer.h"
#include "kg_reasoning.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_output_event {
    int32_t index; /* position of the token in the output */
    int32_t token_id;
    size_t text_off; /* the event's text is kg_output_text()[text_off, text_off + text_len) */
    size_t text_len;
    kg_sample_result_t sample;
    kg_token_part_t part; /* reasoning or answer, when the reasoning is parsed */
} kg_output_event_t;

#define KG_OUTPUT_MAX_KEEP 8

typedef struct kg_output {
    const kg_tokenizer_t *tok;
    const char *const *stop; /* borrowed from the job */
    int32_t n_stop;
    char *text; /* (len) bytes of output so far, cut at a stop; owned */
    size_t len, cap;
    size_t released;    /* bytes handed out in events */
    int32_t n_tokens;   /* tokens pushed */
    int32_t stop_index; /* -1, or which stop string matched */
    bool has_pending;
    kg_output_event_t pending;
    kg_think_t think; /* the reasoning split (off unless kg_output_think) */
    /* control tokens written as their text (kg_output_keep): a call
     * syntax's markers, which its parse reads */
    int32_t keep[KG_OUTPUT_MAX_KEEP];
    int32_t n_keep;
} kg_output_t;

/** Set up for a job; `stop` (n_stop strings) is borrowed for the lifetime. */
void kg_output_init(kg_output_t *out,
                    const kg_tokenizer_t *tok,
                    const char *const *stop,
                    int32_t n_stop);
void kg_output_clear(kg_output_t *out);

/** Write these control tokens (at most KG_OUTPUT_MAX_KEEP, the rest
 * ignored) as their text rather than as nothing: the markers of a call
 * syntax that are control tokens (Mistral's [TOOL_CALLS], gpt-oss's
 * <|channel|>), as llama.cpp's preserved tokens. Before the first push. */
void kg_output_keep(kg_output_t *out, const int32_t *ids, int32_t n);

/** Parse the output's reasoning (kg_reasoning): before the first push.
 * `opened`: the prompt opened the thought. */
void kg_output_think(kg_output_t *out, bool opened);

/** Give the tokens parts by gpt-oss's Harmony channels (kg_think_init_harmony): before the
 * first push. The text stays whole (its parse splits it). */
void kg_output_harmony(kg_output_t *out);

/** The final text split into answer and reasoning (reasoning NULL when
 * there was no thought or it is not parsed). */
void kg_output_split(const kg_output_t *out,
                     const char **answer,
                     size_t *answer_len,
                     const char **reasoning,
                     size_t *reasoning_len);

/** Add one generated token. Writes 0, 1 or 2 events that are ready to be
 * sent into `ready` and returns how many; -1 on out of memory. After a stop
 * string matched (kg_output_stopped), further tokens are ignored. */
int kg_output_push(kg_output_t *out,
                   int32_t token,
                   const kg_sample_result_t *sample,
                   kg_output_event_t ready[2]);

/** The job ended: release everything held back. Writes 0 or 1 event. */
int kg_output_finish(kg_output_t *out, kg_output_event_t ready[1]);

bool kg_output_stopped(const kg_output_t *out);
/** The whole output text so far (after finish: the final text). */
const char *kg_output_text(const kg_output_t *out, size_t *len);
