/* kg_grammar_compile_int: the compiler's working state, shared by its two
 * files: kg_grammar.c (IR to automaton) and kg_grammar_mask.c (the token
 * masks of each state). Not for the matcher or other modules. */
#pragma once

#include "kg_grammar_int.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* One NFA state: Thompson's construction over bytes, with calls of other
 * units and the final state of a unit. */
enum { N_EPS = 0, N_BYTE, N_CALL, N_MATCH };

typedef struct nst {
    uint8_t kind;
    uint8_t lo, hi;
    int32_t out, out2; /* -1: none */
    int32_t unit;      /* N_CALL */
} nst_t;

/* A piece of NFA under construction. */
typedef struct frag {
    int32_t start, end; /* end: an N_EPS whose out is patched by the user */
} frag_t;

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

/** Append an NFA state; returns its index (0, with the failure recorded,
 * beyond KG_GRAMMAR_MAX_NFA_STATES or on OOM). */
int32_t
kg_grammar_nfa_add(cc_t *c, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2);
/** An N_EPS fan-out to every start in `alts` (n 0: a state leading nowhere). */
int32_t kg_grammar_nfa_fan_out(cc_t *c, const int32_t *alts, int32_t n);
/** The intersection of two NFA pieces (a KG_GX_AND, kg_grammar_and.c):
 * both were just built, so their states are ns[first .. n_ns); they are
 * replaced by their product, which is returned. */
frag_t kg_grammar_nfa_and(
    cc_t *c, int32_t first, int32_t a_start, int32_t a_end, int32_t b_start, int32_t b_end);

/** Precompute every state's token masks and forced token from a walk of
 * the vocabulary trie (kg_grammar_mask.c). false when it failed (errstr
 * set through the context). */
bool kg_grammar_build_masks(cc_t *c);
