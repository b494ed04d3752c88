/* kg_grammar_mask: the token masks of a compiled grammar. For every state
 * that reads bytes, one walk of the vocabulary trie sorts each token into
 * accepted (its bytes lead on from the state), uncertain (only a caller
 * could go on: the matcher decides at run time) or rejected, and finds the
 * jump-forward token. The automaton it walks is built by kg_grammar.c. */
#include "kg_grammar_compile_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- token masks ----

typedef struct mb {
    cc_t *c;
    uint32_t *acc; /* (n_words) scratch: accepted bits of the current state */
    int32_t acc_n;
    int32_t *unc; /* uncertain ids of the current state */
    int64_t n_unc, cap_unc;
    int32_t *cur;    /* (max_len + 1) FAST walk: state at each depth */
    kg_gset_t *sets; /* (max_len + 1) SLOW walk: the set at each depth */
    bool *esc;       /* (max_len + 1) an escape at or above this depth */
    kg_gwork_t *w;
    int64_t cap_ids;
    int32_t *bm_htab; /* bitmap dedup: open addressing, -1 empty */
    int32_t bm_hcap;
    int64_t cap_bitmaps;
    int64_t visits; /* trie nodes walked so far (the compile's cost) */
} mb_t;

static void mark_acc(mb_t *b, const kg_gvocab_t *v, int32_t tok) {
    for (int32_t t = tok; t >= 0; t = v->dup_next[t]) {
        if (!(b->acc[t >> 5] & (1u << (t & 31)))) {
            b->acc[t >> 5] |= 1u << (t & 31);
            b->acc_n++;
        }
    }
}

static void mark_unc(mb_t *b, const kg_gvocab_t *v, int32_t tok) {
    for (int32_t t = tok; t >= 0; t = v->dup_next[t]) {
        if (grow(b->c, (void **)&b->unc, &b->cap_unc, b->n_unc + 1, sizeof(int32_t))) {
            b->unc[b->n_unc++] = t;
        }
    }
}

/* Node i (state t after its byte needs the closure) and its subtree. */
static void walk_slow(mb_t *b, int32_t i, int32_t t) {
    const kg_grammar_t *g = b->c->g;
    const kg_gvocab_t *v = g->vocab;
    const int32_t d = v->depth[i];
    kg_gset_t *s = &b->sets[d];
    kg_gset_clear(s);
    b->w->n = 1;
    b->w->len[0] = 1;
    b->w->fr[0][0] = t;
    kg_gset_close(g, b->w, s, true);
    b->esc[d] = s->esc;
    if (v->tok[i] >= 0) {
        mark_acc(b, v, v->tok[i]); /* t was reached: the token is complete and valid */
    }
    for (int32_t k = i + 1; k < v->end[i];) {
        const int32_t dd = v->depth[k];
        const kg_gset_t *prev = &b->sets[dd - 1];
        kg_gset_t *cur = &b->sets[dd];
        if (prev->n == 0) {
            if (!b->esc[dd - 1]) {
                k = v->end[k];
                continue;
            }
            /* only the caller could go on: everything below is uncertain */
            kg_gset_clear(cur);
            b->esc[dd] = true;
            if (v->tok[k] >= 0) {
                mark_unc(b, v, v->tok[k]);
            }
            k++;
            continue;
        }
        kg_gset_step(g, prev, v->byte[k], b->w, cur, true);
        b->visits += 4; /* a closure step costs a few plain ones */
        b->esc[dd] = b->esc[dd - 1] || cur->esc;
        if (v->tok[k] >= 0) {
            if (cur->n > 0 || cur->can_end || cur->esc) {
                mark_acc(b, v, v->tok[k]);
            } else if (b->esc[dd - 1]) {
                mark_unc(b, v, v->tok[k]);
            }
        }
        if (cur->n == 0 && !b->esc[dd]) {
            k = v->end[k];
        } else {
            k++;
        }
    }
}

/* Sort every token for a state read from its own edges (a stack [s]). */
static void walk_state(mb_t *b, int32_t s) {
    const kg_grammar_t *g = b->c->g;
    const kg_gvocab_t *v = g->vocab;
    const int32_t nc = g->n_classes;
    const uint8_t special = GS_CALLS | GS_ESCAPABLE;
    b->cur[0] = s;
    for (int32_t i = 0; i < v->n_nodes;) {
        const int32_t d = v->depth[i];
        const int32_t t = g->next[(size_t)b->cur[d - 1] * (size_t)nc + g->cls[v->byte[i]]];
        if (t < 0) {
            i = v->end[i];
            continue;
        }
        b->visits++;
        if (g->flags[t] & special) {
            walk_slow(b, i, t);
            i = v->end[i];
            continue;
        }
        b->cur[d] = t;
        if (v->tok[i] >= 0) {
            mark_acc(b, v, v->tok[i]);
        }
        i++;
    }
}

static uint64_t hash_words(const uint32_t *w, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) {
        h = (h ^ w[i]) * 1099511628211ull;
    }
    return h ^ (h >> 31);
}

/* The index of the current state's accepted bitmap (b->acc) in g->bitmaps, stored if new. */
static int32_t store_bitmap(mb_t *b) {
    const uint32_t *bm = b->acc;
    kg_grammar_t *g = b->c->g;
    const int32_t nw = g->n_words;
    if (!b->bm_htab || (g->n_bitmaps + 1) * 2 > b->bm_hcap) {
        int32_t nc = b->bm_hcap ? b->bm_hcap * 2 : 64;
        int32_t *t = malloc((size_t)nc * sizeof(*t));
        if (!t) {
            cfail(b->c, "grammar: out of memory");
            return -1;
        }
        for (int32_t i = 0; i < nc; i++) {
            t[i] = -1;
        }
        for (int32_t i = 0; i < g->n_bitmaps; i++) {
            uint64_t h = hash_words(g->bitmaps + (size_t)i * (size_t)nw, nw);
            int32_t k = (int32_t)(h & (uint64_t)(nc - 1));
            while (t[k] >= 0) {
                k = (k + 1) & (nc - 1);
            }
            t[k] = i;
        }
        free(b->bm_htab);
        b->bm_htab = t;
        b->bm_hcap = nc;
    }
    uint64_t h = hash_words(bm, nw);
    int32_t k = (int32_t)(h & (uint64_t)(b->bm_hcap - 1));
    while (b->bm_htab[k] >= 0) {
        int32_t i = b->bm_htab[k];
        if (memcmp(g->bitmaps + (size_t)i * (size_t)nw, bm, (size_t)nw * sizeof(*bm)) == 0) {
            return i;
        }
        k = (k + 1) & (b->bm_hcap - 1);
    }
    if (!grow(b->c, (void **)&g->bitmaps, &b->cap_bitmaps, ((int64_t)g->n_bitmaps + 1) * nw,
              sizeof(uint32_t))) {
        return -1;
    }
    memcpy(g->bitmaps + (size_t)g->n_bitmaps * (size_t)nw, bm, (size_t)nw * sizeof(*bm));
    b->bm_htab[k] = g->n_bitmaps;
    return g->n_bitmaps++;
}

static bool push_ids(mb_t *b, const int32_t *ids, int64_t n, int32_t *off) {
    kg_grammar_t *g = b->c->g;
    if (g->n_ids + n > INT32_MAX ||
        !grow(b->c, (void **)&g->ids, &b->cap_ids, g->n_ids + n + 1, sizeof(int32_t))) {
        cfail(b->c, "grammar: too many token lists");
        return false;
    }
    memcpy(g->ids + g->n_ids, ids, (size_t)n * sizeof(*ids));
    *off = (int32_t)g->n_ids;
    g->n_ids += n;
    return true;
}

/* The jump-forward token of state s: the longest token spelling a prefix
 * of the one byte string the grammar allows from s, or -1. */
static int32_t forced_token(const kg_grammar_t *g, int32_t s) {
    const kg_gvocab_t *v = g->vocab;
    const int32_t nc = g->n_classes;
    uint8_t f[256];
    int32_t n = 0;
    int32_t q = s;
    while (n < (int32_t)sizeof(f) && g->flags[q] == GS_BYTES) {
        int32_t only = -1, count = 0;
        for (int bb = 0; bb < 256 && count < 2; bb++) {
            if (g->next[(size_t)q * (size_t)nc + g->cls[bb]] >= 0) {
                only = bb;
                count++;
            }
        }
        if (count != 1) {
            break;
        }
        f[n++] = (uint8_t)only;
        q = g->next[(size_t)q * (size_t)nc + g->cls[only]];
    }
    int32_t best = -1;
    int32_t i = 0, end = v->n_nodes; /* siblings of the current level are in [i, end) */
    for (int32_t k = 0; k < n; k++) {
        while (i < end && v->byte[i] != f[k]) {
            i = v->end[i];
        }
        if (i >= end) {
            break;
        }
        if (v->tok[i] >= 0) {
            best = v->tok[i];
        }
        end = v->end[i];
        i++;
    }
    return best;
}

bool kg_grammar_build_masks(cc_t *c) {
    kg_grammar_t *g = c->g;
    const kg_gvocab_t *v = g->vocab;
    const int32_t nw = g->n_words;
    mb_t b = {.c = c};
    bool ok = false;
    b.acc = calloc((size_t)nw, sizeof(uint32_t));
    b.cur = malloc(((size_t)v->max_len + 2) * sizeof(int32_t));
    b.esc = calloc((size_t)v->max_len + 2, sizeof(bool));
    b.sets = malloc(((size_t)v->max_len + 2) * sizeof(kg_gset_t));
    b.w = malloc(sizeof(kg_gwork_t));
    g->mask = calloc((size_t)g->n_states, sizeof(kg_gstate_mask_t));
    if (!b.acc || !b.cur || !b.esc || !b.sets || !b.w || !g->mask) {
        cfail(c, "grammar: out of memory");
        goto out;
    }
    for (int32_t s = 0; s < g->n_states && !c->failed; s++) {
        kg_gstate_mask_t *m = &g->mask[s];
        m->acc_bitmap = -1;
        m->forced = -1;
        if (!(g->flags[s] & GS_BYTES)) {
            continue; /* never the top of a closed stack */
        }
        memset(b.acc, 0, (size_t)nw * sizeof(uint32_t));
        b.acc_n = 0;
        b.n_unc = 0;
        walk_state(&b, s);
        if (b.visits > KG_GRAMMAR_MAX_WORK) {
            char msg[200];
            snprintf(msg, sizeof(msg),
                     "grammar too large: precomputing its token masks takes more than %.0e steps "
                     "(%d automaton states; large repetition counts or lengths multiply them)",
                     (double)KG_GRAMMAR_MAX_WORK, g->n_states);
            cfail(c, msg);
            goto out;
        }
        m->acc_n = b.acc_n;
        if (b.acc_n >= nw) {
            m->acc_bitmap = store_bitmap(&b);
        } else {
            /* few: a list (extracted in id order) */
            int32_t *list = b.cur; /* reuse as scratch only if large enough */
            int32_t *tmp = NULL;
            if (b.acc_n > v->max_len + 2) {
                /* acc_n >= 3 here (max_len >= 0, the longest token); the analyzer does not
                 * know max_len's sign and tries acc_n == 0 */
                // NOLINTNEXTLINE(clang-analyzer-optin.portability.UnixAPI)
                tmp = malloc((size_t)b.acc_n * sizeof(int32_t));
                if (!tmp) {
                    cfail(c, "grammar: out of memory");
                    goto out;
                }
                list = tmp;
            }
            int32_t k = 0;
            for (int32_t w = 0; w < nw; w++) {
                for (uint32_t bits = b.acc[w]; bits; bits &= bits - 1) {
                    list[k++] = w * 32 + __builtin_ctz(bits);
                }
            }
            bool pushed = push_ids(&b, list, k, &m->acc_off);
            free(tmp);
            if (!pushed) {
                goto out;
            }
        }
        if (b.n_unc > 0 && !push_ids(&b, b.unc, b.n_unc, &m->unc_off)) {
            goto out;
        }
        m->unc_n = (int32_t)b.n_unc;
        m->forced = forced_token(g, s);
    }
    ok = !c->failed;
    g->work = b.visits;
out:
    free(b.acc);
    free(b.cur);
    free(b.esc);
    free(b.sets);
    free(b.w);
    free(b.unc);
    free(b.bm_htab);
    return ok;
}
