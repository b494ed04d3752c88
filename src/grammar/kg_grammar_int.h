/* kg_grammar_int: the compiled grammar's layout and the stack-set
 * operations shared by the compiler's mask precomputation (kg_grammar_mask.c)
 * and the run-time matcher (kg_matcher.c). Not for other modules. */
#pragma once

#include "kg_grammar.h"

#include <stdatomic.h>

/* State flags. */
#define GS_ACCEPT 1u /* the state's unit may end (return, or end the grammar for the root) */
#define GS_CALLS  2u /* the state calls units */
#define GS_BYTES  4u /* some byte leads on */
#define GS_ESCAPABLE                                                                               \
    8u /* ACCEPT and returning may continue in a caller (not a final root state)                   \
        */

typedef struct kg_gcall {
    int32_t unit; /* the callee */
    int32_t ret;  /* the caller's state after the callee returns */
} kg_gcall_t;

/* One state's precomputed token sets. */
typedef struct kg_gstate_mask {
    int32_t acc_bitmap; /* >= 0: accepted tokens are this bitmap; -1: a list */
    int32_t acc_off;    /* list: accepted ids at ids[acc_off .. acc_off + acc_n) */
    int32_t acc_n;      /* accepted tokens (either form) */
    int32_t unc_off;    /* uncertain ids at ids[unc_off .. unc_off + unc_n) */
    int32_t unc_n;
    int32_t forced; /* jump-forward token, -1 */
} kg_gstate_mask_t;

struct kg_grammar {
    _Atomic int32_t refs;
    kg_gvocab_t *vocab; /* a reference */
    int32_t n_vocab, n_words;
    uint8_t cls[256]; /* byte -> class */
    int32_t n_classes;
    int32_t n_states;
    int32_t *next;     /* (n_states, n_classes) next state, -1 */
    uint8_t *flags;    /* (n_states) GS_* */
    int32_t *unit_of;  /* (n_states) */
    int32_t *call_off; /* (n_states + 1) into calls */
    kg_gcall_t *calls; /* (n_calls) */
    int32_t n_units;
    int32_t *unit_start; /* (n_units) */
    int32_t root_start;
    bool root_called;       /* the root unit is also called (a recursive root) */
    kg_gstate_mask_t *mask; /* (n_states) */
    uint32_t *bitmaps;      /* (n_bitmaps, n_words) */
    int32_t n_bitmaps;
    int32_t *ids; /* accepted / uncertain id lists */
    int64_t n_ids;
    size_t memory;
    double compile_ms;
    int64_t work; /* trie nodes the mask precomputation walked */
};

/* A set of stacks. A stack is fr[i][0..len[i]): return states, bottom
 * first, then the current state on top. */
typedef struct kg_gset {
    int32_t n;
    bool can_end;  /* a path ended the whole grammar (or, relative, the bottom unit's end is
                      final) */
    bool esc;      /* relative mode: a path returned below the bottom (needs the caller) */
    bool overflow; /* a path was dropped for lack of room */
    int32_t len[KG_MATCHER_MAX_STACKS];
    int32_t fr[KG_MATCHER_MAX_STACKS][KG_MATCHER_MAX_DEPTH];
} kg_gset_t;

/* Work space of a closure: pending stacks, and the stacks already
 * expanded whose top reads no byte (the others are in the output). */
typedef struct kg_gwork {
    int32_t n;
    int32_t len[KG_MATCHER_MAX_STACKS];
    int32_t fr[KG_MATCHER_MAX_STACKS][KG_MATCHER_MAX_DEPTH];
    int32_t n_vis;
    int32_t vis_len[KG_MATCHER_MAX_STACKS];
    int32_t vis[KG_MATCHER_MAX_STACKS][KG_MATCHER_MAX_DEPTH];
} kg_gwork_t;

/** Close `w` (stacks not yet expanded) into `out`: calls push, finished
 * units return, and only stacks whose top reads bytes are kept. In
 * relative mode a return from the bottom frame sets out->esc instead of
 * can_end (unless the bottom is a final root state). `w` is consumed.
 * `out` must be empty (n 0, flags false) on entry. */
void kg_gset_close(const kg_grammar_t *g, kg_gwork_t *w, kg_gset_t *out, bool relative);

/** Step every stack of `in` over byte b and close into `out`. */
void kg_gset_step(const kg_grammar_t *g,
                  const kg_gset_t *in,
                  uint8_t b,
                  kg_gwork_t *w,
                  kg_gset_t *out,
                  bool relative);

static inline void kg_gset_clear(kg_gset_t *s) {
    s->n = 0;
    s->can_end = false;
    s->esc = false;
    s->overflow = false;
}
