/* kg_grammar_and: the intersection of two regular pieces of a grammar
 * (KG_GX_AND) as the product of their byte NFAs, built in their place
 * while kg_grammar.c builds a unit's NFA. A JSON Schema string with a
 * pattern or format and length bounds is such an intersection: the
 * pattern's automaton times "min..max characters of a JSON string body"
 * (src/schema/kg_json_schema.c), so lengths count decoded characters
 * whatever their escapes and UTF-8 bytes, with no counting of our own.
 *
 * A product state is a pair of states, one of each side, that read a byte
 * (or are the side's end); only pairs reachable together are built, and a
 * pair whose byte ranges do not overlap is dropped at once, so the product
 * is usually far smaller than the product of the sizes. */
#include "kg_grammar_compile_int.h"

#include <string.h>

/* The product's own limit, below the NFA's: it grows as the product of the
 * sides, so it stops early with a message naming the construct at fault. */
#define MAX_AND_STATES 1000000

/* Pair keys: a pair of states to read from (tag 0) or the fan-out that
 * continues after both sides read a byte (tag 1, keyed by their outs). */
#define KEY(tag, p, q) (((uint64_t)(tag) << 63) | ((uint64_t)(uint32_t)(p) << 31) | (uint32_t)(q))

typedef struct and_ctx {
    cc_t *c;
    nst_t *t; /* the sides' states, indices relative to `first` */
    int32_t n_t, first;
    int32_t a_end, b_end, end; /* the sides' ends (relative) and the product's */
    uint32_t *stamp;           /* closure marks */
    uint32_t gen;
    int32_t *stack, *la, *lb; /* closure scratch and the two lists */
    int32_t *alts;
    int64_t cap_alts;
    uint64_t *keys; /* open addressing: key -> state, UINT64_MAX empty */
    int32_t *vals;
    int64_t cap_map, n_map;
    int32_t *work; /* (state, p, q) triples whose out is still to build */
    int64_t n_work, cap_work;
} and_t;

/* The states of x's closure that read a byte, and the side's end. */
static int32_t closure(and_t *x, int32_t from, int32_t end, int32_t *out) {
    if (from < 0) {
        return 0;
    }
    if (++x->gen == 0) {
        memset(x->stamp, 0, (size_t)x->n_t * sizeof(*x->stamp));
        x->gen = 1;
    }
    int32_t sp = 0, n = 0;
    x->stack[sp++] = from;
    while (sp > 0) {
        int32_t s = x->stack[--sp];
        if (s < 0 || x->stamp[s] == x->gen) {
            continue;
        }
        x->stamp[s] = x->gen;
        const nst_t *st = &x->t[s];
        if (st->kind == N_BYTE || s == end) {
            out[n++] = s;
        } else if (st->kind == N_EPS) {
            x->stack[sp++] = st->out2;
            x->stack[sp++] = st->out;
        }
    }
    return n;
}

static bool map_grow(and_t *x) {
    int64_t nc = x->cap_map ? x->cap_map * 2 : 4096;
    uint64_t *k = malloc((size_t)nc * sizeof(*k));
    int32_t *v = calloc((size_t)nc, sizeof(*v)); /* zeroed: read only where a key is */
    if (!k || !v) {
        free(k);
        free(v);
        cfail(x->c, "grammar: out of memory");
        return false;
    }
    memset(k, 0xFF, (size_t)nc * sizeof(*k));
    for (int64_t i = 0; i < x->cap_map; i++) {
        if (x->keys[i] != UINT64_MAX) {
            uint64_t h = (x->keys[i] * 0x9E3779B97F4A7C15ull) >> 20;
            int64_t j = (int64_t)(h & (uint64_t)(nc - 1));
            while (k[j] != UINT64_MAX) {
                j = (j + 1) & (nc - 1);
            }
            k[j] = x->keys[i];
            v[j] = x->vals[i];
        }
    }
    free(x->keys);
    free(x->vals);
    x->keys = k;
    x->vals = v;
    x->cap_map = nc;
    return true;
}

/* The slot of key: found (vals holds the state) or empty (keys holds
 * UINT64_MAX); -1 on OOM. */
static int64_t map_slot(and_t *x, uint64_t key) {
    if ((x->n_map + 1) * 2 > x->cap_map && !map_grow(x)) {
        return -1;
    }
    uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20;
    int64_t j = (int64_t)(h & (uint64_t)(x->cap_map - 1));
    while (x->keys[j] != UINT64_MAX && x->keys[j] != key) {
        j = (j + 1) & (x->cap_map - 1);
    }
    return j;
}

static bool too_big(and_t *x) {
    if (x->c->n_ns - x->first > MAX_AND_STATES) {
        cfail(x->c, "grammar too large: an intersection (a JSON Schema string's pattern or "
                    "format with length bounds) needs more than 1,000,000 automaton states; "
                    "lower the length bounds or simplify the pattern");
    }
    return x->c->failed;
}

/* The product state of the pair (p, q), made (and queued) if new; -1 when
 * the pair can never move on together. */
static int32_t pair_state(and_t *x, int32_t p, int32_t q) {
    bool pe = p == x->a_end, qe = q == x->b_end;
    if (pe || qe) {
        return pe && qe ? x->end : -1;
    }
    const nst_t *sp = &x->t[p], *sq = &x->t[q];
    uint8_t lo = sp->lo > sq->lo ? sp->lo : sq->lo, hi = sp->hi < sq->hi ? sp->hi : sq->hi;
    if (lo > hi) {
        return -1;
    }
    uint64_t key = KEY(0, p, q);
    int64_t j = map_slot(x, key);
    if (j < 0) {
        return -1;
    }
    if (x->keys[j] == key) {
        return x->vals[j];
    }
    int32_t s = kg_grammar_nfa_add(x->c, N_BYTE, lo, hi, -1, -1);
    if (x->c->failed || too_big(x) ||
        !grow(x->c, (void **)&x->work, &x->cap_work, x->n_work + 3, sizeof(int32_t))) {
        return -1;
    }
    x->keys[j] = key;
    x->vals[j] = s;
    x->n_map++;
    x->work[x->n_work++] = s;
    x->work[x->n_work++] = p;
    x->work[x->n_work++] = q;
    return s;
}

/* The state that continues from side states a and b (before their
 * closures): a fan-out to every pair of their closures that can move on. */
static int32_t after(and_t *x, int32_t a, int32_t b) {
    uint64_t key = KEY(1, a < 0 ? 0x7FFFFFFF : a, b < 0 ? 0x7FFFFFFF : b);
    int64_t j = map_slot(x, key);
    if (j < 0) {
        return 0;
    }
    if (x->keys[j] == key) {
        return x->vals[j];
    }
    int32_t na = closure(x, a, x->a_end, x->la);
    int32_t nb = closure(x, b, x->b_end, x->lb);
    int64_t n = 0;
    for (int32_t i = 0; i < na && !x->c->failed; i++) {
        for (int32_t k = 0; k < nb && !x->c->failed; k++) {
            int32_t s = pair_state(x, x->la[i], x->lb[k]);
            if (s >= 0) {
                if (!grow(x->c, (void **)&x->alts, &x->cap_alts, n + 1, sizeof(int32_t))) {
                    return 0;
                }
                x->alts[n++] = s;
            }
        }
    }
    int32_t s = kg_grammar_nfa_fan_out(x->c, x->alts, (int32_t)n);
    if (x->c->failed) {
        return 0;
    }
    /* pair_state may have grown the map: find the slot again */
    j = map_slot(x, key);
    if (j < 0) {
        return 0;
    }
    x->keys[j] = key;
    x->vals[j] = s;
    x->n_map++;
    return s;
}

frag_t kg_grammar_nfa_and(
    cc_t *c, int32_t first, int32_t a_start, int32_t a_end, int32_t b_start, int32_t b_end) {
    frag_t r = {0, 0};
    and_t x = {.c = c, .first = first, .n_t = c->n_ns - first};
    x.t = malloc((size_t)x.n_t * sizeof(*x.t));
    x.stamp = calloc((size_t)x.n_t, sizeof(*x.stamp));
    x.stack = malloc(((size_t)x.n_t * 2 + 2) * sizeof(*x.stack));
    x.la = malloc((size_t)x.n_t * sizeof(*x.la));
    x.lb = malloc((size_t)x.n_t * sizeof(*x.lb));
    if (!x.t || !x.stamp || !x.stack || !x.la || !x.lb) {
        cfail(c, "grammar: out of memory");
        goto out;
    }
    memcpy(x.t, c->ns + first, (size_t)x.n_t * sizeof(*x.t));
    for (int32_t i = 0; i < x.n_t; i++) {
        nst_t *s = &x.t[i];
        if (s->kind == N_CALL) {
            cfail(c, "grammar: an intersection cannot use a recursive rule");
            goto out;
        }
        s->out = s->out >= 0 ? s->out - first : -1;
        s->out2 = s->out2 >= 0 ? s->out2 - first : -1;
    }
    x.a_end = a_end - first;
    x.b_end = b_end - first;
    /* the sides' states are copied out: the product takes their place */
    c->n_ns = first;
    x.end = kg_grammar_nfa_add(c, N_EPS, 0, 0, -1, -1);
    int32_t start = after(&x, a_start - first, b_start - first);
    while (x.n_work > 0 && !c->failed) {
        x.n_work -= 3;
        int32_t s = x.work[x.n_work], p = x.work[x.n_work + 1], q = x.work[x.n_work + 2];
        int32_t next = after(&x, x.t[p].out, x.t[q].out);
        if (!c->failed) {
            c->ns[s].out = next;
        }
    }
    r = (frag_t){start, x.end};
out:
    free(x.t);
    free(x.stamp);
    free(x.stack);
    free(x.la);
    free(x.lb);
    free(x.alts);
    free(x.keys);
    free(x.vals);
    free(x.work);
    return r;
}
