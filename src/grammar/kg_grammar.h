/* kg_grammar: a grammar compiled against one vocabulary, and the matcher
 * that walks it one token at a time.
 *
 * DESIGN
 * Compilation (kg_grammar_compile, on the kafka thread through the cache)
 * turns the IR into a recursive transition network over bytes: every rule
 * that is not part of a recursion is inlined where it is used, and every
 * unit left (the root and the recursive rules) becomes one DFA whose edges
 * are byte classes or calls of other units. Code-point classes become UTF-8
 * byte sequences, so tokens that end inside a character work. Left
 * recursion, grammars that can never end and rules that cannot be matched
 * are refused.
 *
 * For every DFA state the compiler then walks the vocabulary's token trie
 * and sorts every token into accepted (valid whatever is below the state
 * on the stack), rejected, or uncertain (it would have to leave the rule
 * and continue in the caller, which only the run-time stack knows). For a
 * grammar without recursion there are no uncertain tokens at all: the mask
 * of a step is a copy of a precomputed one. Identical masks are stored
 * once. The state's forced token (jump-forward: the grammar allows exactly
 * one byte string from here, and this is the longest token that starts
 * it) is precomputed as well.
 *
 * The matcher (kg_matcher_t) holds a set of stacks of DFA states (a
 * nondeterministic grammar may be in several places at once); it builds
 * the allowed-token bitmask of a step from the precomputed masks plus a
 * run-time check of the uncertain tokens, and advances by a token's bytes.
 * A compiled grammar is immutable and shared by every job that uses it
 * (reference-counted); each job has its own matcher. Nothing here knows of
 * JSON, Kafka or the engine. */
#pragma once

#include "../core/kg_status.h"
#include "kg_gir.h"
#include "kg_gvocab.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_grammar kg_grammar_t;

/* Compile limits: beyond them compilation fails with a message. */
#define KG_GRAMMAR_MAX_NFA_STATES 2000000
#define KG_GRAMMAR_MAX_DFA_STATES 100000
/* Trie nodes the mask precomputation may walk (20-80 ns each on the build
 * machine: docs/PERFORMANCE.md's benchmark schema walks 87 M on a 152k vocabulary
 * in about 2 s). Bounds the time one grammar can hold the kafka thread to
 * about a minute. */
#define KG_GRAMMAR_MAX_WORK 1000000000LL
/* Matcher limits: stacks in the set, frames per stack (nesting of the
 * grammar's recursive rules). A path that would exceed them is dropped. */
#define KG_MATCHER_MAX_STACKS 32
#define KG_MATCHER_MAX_DEPTH  64

/** Compile `ir` for `vocab` (a reference is kept). NULL with a message in
 * errstr when the grammar is unusable (undefined root, left recursion,
 * matches nothing, too large) or memory ran out. @thread any */
kg_grammar_t *
kg_grammar_compile(const kg_gir_t *ir, kg_gvocab_t *vocab, char *errstr, size_t errstr_size);
kg_grammar_t *kg_grammar_ref(kg_grammar_t *g);
/** Drop a reference; the last one frees. NULL does nothing. @thread any */
void kg_grammar_unref(kg_grammar_t *g);

/** Bytes the compiled grammar holds (for the cache's budget). */
size_t kg_grammar_memory(const kg_grammar_t *g);
int32_t kg_grammar_n_states(const kg_grammar_t *g);
/** Width of the token bitmask: n_vocab bits in (n_vocab + 31) / 32 words;
 * bit (id % 32) of word id / 32 is token id. */
int32_t kg_grammar_n_vocab(const kg_grammar_t *g);
int32_t kg_grammar_mask_words(const kg_grammar_t *g);
/** Milliseconds the compilation took (the mask precomputation mostly). */
double kg_grammar_compile_ms(const kg_grammar_t *g);
/** Trie nodes the mask precomputation walked (at most KG_GRAMMAR_MAX_WORK). */
int64_t kg_grammar_compile_work(const kg_grammar_t *g);

// ---- the matcher ----

typedef struct kg_matcher kg_matcher_t;

/** A matcher's storage (about 26 KB), allocated once; reset it for a job.
 * NULL on OOM. @thread any */
kg_matcher_t *kg_matcher_new(void);
void kg_matcher_free(kg_matcher_t *m);

/** Make `dst` a copy of `src` (same grammar, same position). @thread any */
void kg_matcher_copy(kg_matcher_t *dst, const kg_matcher_t *src);

/** Start `g` (borrowed: the caller keeps a reference while the matcher
 * uses it) from its beginning. @thread any */
void kg_matcher_reset(kg_matcher_t *m, const kg_grammar_t *g);

/** Fill `mask` (kg_grammar_mask_words words) with the tokens allowed next.
 * End-of-generation tokens are not in it: see kg_matcher_can_end. Returns
 * whether any token is allowed. Never allocates. @thread any */
bool kg_matcher_fill_mask(kg_matcher_t *m, uint32_t *mask);

/** Advance by one token's bytes. False (and no change) when the grammar
 * does not allow it. @thread any */
bool kg_matcher_accept(kg_matcher_t *m, int32_t token);

/** Advance by bytes that are no whole token: a lazy grammar's text trigger
 * (the grammar starts inside the text the tokens wrote). False (and no
 * change) when the grammar does not allow them, or n is 0. @thread any */
bool kg_matcher_accept_bytes(kg_matcher_t *m, const uint8_t *p, size_t n);

/** The bytes token `tok` spells in the grammar's vocabulary (*n 0 for one
 * that spells none: a control or end-of-generation token, or an id out of
 * range). @thread any */
const uint8_t *kg_grammar_token_bytes(const kg_grammar_t *g, int32_t tok, size_t *n);

/** Whether the text so far is a complete match (end of generation allowed). */
bool kg_matcher_can_end(const kg_matcher_t *m);
/** Whether the match is complete and nothing more can follow. */
bool kg_matcher_is_done(const kg_matcher_t *m);
/** The token to append without sampling when the grammar allows exactly
 * one continuation here (jump-forward), or -1. */
int32_t kg_matcher_forced(const kg_matcher_t *m);
/** Whether a stack had to be dropped (nesting beyond KG_MATCHER_MAX_DEPTH
 * or more than KG_MATCHER_MAX_STACKS alternatives): the matcher then
 * allows less than the grammar does. */
bool kg_matcher_overflowed(const kg_matcher_t *m);
