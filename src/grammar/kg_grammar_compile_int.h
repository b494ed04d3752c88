/* kg_grammar_compile_int: the compiler's working state, shared by its two
 * files: kg_grammar.c (IR to automaton) and kg_grammar_mask.c (the token
 * masks of each state). Not for the matcher or other modules. */
#pragma once

#include "kg_grammar_int.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* One NFA state (defined in kg_grammar.c, where the NFA is built). */
typedef struct nst nst_t;

typedef struct cc {
    const kg_gir_t *ir;
    kg_grammar_t *g;
    char *errstr;
    size_t errstr_size;
    bool failed;
    /* rules -> units */
    int32_t n_rules;
    int32_t *unit_of_rule; /* (n_rules) unit, or -1 when inlined */
    int32_t *unit_rule;    /* (n_units) */
    /* NFA */
    nst_t *ns;
    int32_t n_ns, cap_ns;
    int32_t *unit_nfa; /* (n_units) start */
    int depth;
    /* DFA construction */
    int32_t *pool; /* sets of NFA states, by DFA state */
    int64_t n_pool, cap_pool;
    int64_t *set_off; /* (cap_states + 1) */
    int32_t *set_len;
    int32_t cap_states;
    int32_t *htab; /* open addressing over DFA states, -1 empty */
    int32_t hcap;
    uint32_t *stamp; /* (n_ns) closure marks */
    uint32_t gen;
    int32_t *stack, *clos; /* (n_ns) scratch */
    int32_t n_calls, cap_calls;
} cc_t;

/* Record the first failure in errstr; later ones are dropped. */
static inline void cfail(cc_t *c, const char *msg) {
    if (!c->failed) {
        snprintf(c->errstr, c->errstr_size, "%s", msg);
        c->failed = true;
    }
}

static inline bool grow(cc_t *c, void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) {
        return true;
    }
    int64_t nc = *cap ? *cap : 64;
    while (nc < need) {
        nc *= 2;
    }
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) {
        cfail(c, "grammar: out of memory");
        return false;
    }
    *p = q;
    *cap = nc;
    return true;
}

/** Precompute every state's token masks and forced token from a walk of
 * the vocabulary trie (kg_grammar_mask.c). false when it failed (errstr
 * set through the context). */
bool kg_grammar_build_masks(cc_t *c);
