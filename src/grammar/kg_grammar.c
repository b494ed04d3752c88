/* kg_grammar: compile a grammar IR for a vocabulary (see kg_grammar.h).
 *
 *   IR --(units: root + recursive rules; the rest inlined)--> byte NFA per
 *   unit --(byte classes, subset construction)--> one DFA per unit with
 *   call edges --(liveness, left-recursion check)--> per-state token masks
 *   from a walk of the vocabulary trie, and forced tokens.
 * The last step, the token masks, is kg_grammar_mask.c; this file builds
 * the automaton it walks. */
#include "../core/kg_clock.h"
#include "../core/kg_utf8.h"
#include "kg_grammar_compile_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inlining deeper than this is refused (protects the C stack). */
#define MAX_BUILD_DEPTH 2000

// ---- rules and units ----

typedef struct tarjan {
    int32_t *index, *low, *stack;
    bool *on;
    int32_t n_stack, next_index;
    int32_t *comp; /* component id per rule */
    int32_t *comp_size;
    int32_t n_comp;
    bool *self_ref;
} tarjan_t;

/* The rules an expression refers to, each once per call of fn. */
static void refs_of(const kg_gir_t *ir, int32_t e, void (*fn)(void *, int32_t), void *ctx, int d) {
    if (d > MAX_BUILD_DEPTH) {
        return;
    }
    const kg_gx_t *x = kg_gir_node(ir, e);
    switch (x->kind) {
    case KG_GX_SEQ:
    case KG_GX_ALT:
        for (int32_t i = 0; i < x->b; i++) {
            refs_of(ir, kg_gir_kid(ir, x, i), fn, ctx, d + 1);
        }
        break;
    case KG_GX_REPEAT:
        refs_of(ir, x->a, fn, ctx, d + 1);
        break;
    case KG_GX_AND:
        refs_of(ir, x->a, fn, ctx, d + 1);
        refs_of(ir, x->b, fn, ctx, d + 1);
        break;
    case KG_GX_REF:
        fn(ctx, x->a);
        break;
    default:
        break;
    }
}

typedef struct visit_ctx {
    cc_t *c;
    tarjan_t *t;
    int32_t from;
} visit_ctx_t;

static void strongconnect(cc_t *c, tarjan_t *t, int32_t v);

static void tarjan_edge(void *ctx, int32_t w) {
    visit_ctx_t *vc = ctx;
    tarjan_t *t = vc->t;
    int32_t v = vc->from;
    if (w == v) {
        t->self_ref[v] = true;
    }
    if (t->index[w] < 0) {
        strongconnect(vc->c, t, w);
        if (t->low[w] < t->low[v]) {
            t->low[v] = t->low[w];
        }
    } else if (t->on[w] && t->index[w] < t->low[v]) {
        t->low[v] = t->index[w];
    }
}

static void strongconnect(cc_t *c, tarjan_t *t, int32_t v) {
    t->index[v] = t->low[v] = t->next_index++;
    t->stack[t->n_stack++] = v;
    t->on[v] = true;
    visit_ctx_t vc = {c, t, v};
    int32_t e = kg_gir_rule_expr(c->ir, v);
    if (e >= 0) {
        refs_of(c->ir, e, tarjan_edge, &vc, 0);
    }
    if (t->low[v] == t->index[v]) {
        int32_t size = 0, w;
        do {
            w = t->stack[--t->n_stack];
            t->on[w] = false;
            t->comp[w] = t->n_comp;
            size++;
        } while (w != v);
        t->comp_size[t->n_comp++] = size;
    }
}

static bool find_units(cc_t *c) {
    const int32_t n = c->n_rules;
    tarjan_t t = {0};
    bool ok = false;
    t.index = malloc((size_t)n * sizeof(int32_t));
    t.low = malloc((size_t)n * sizeof(int32_t));
    t.stack = malloc((size_t)n * sizeof(int32_t));
    t.comp = malloc((size_t)n * sizeof(int32_t));
    t.comp_size = malloc((size_t)n * sizeof(int32_t));
    t.on = calloc((size_t)n, sizeof(bool));
    t.self_ref = calloc((size_t)n, sizeof(bool));
    c->unit_of_rule = malloc((size_t)n * sizeof(int32_t));
    c->unit_rule = malloc((size_t)n * sizeof(int32_t));
    if (!t.index || !t.low || !t.stack || !t.comp || !t.comp_size || !t.on || !t.self_ref ||
        !c->unit_of_rule || !c->unit_rule) {
        cfail(c, "grammar: out of memory");
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        t.index[i] = -1;
        c->unit_of_rule[i] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        if (t.index[i] < 0) {
            strongconnect(c, &t, i);
        }
    }
    /* unit 0 is the root; then every rule on a cycle */
    const int32_t root = kg_gir_root(c->ir);
    c->unit_of_rule[root] = 0;
    c->unit_rule[0] = root;
    c->g->n_units = 1;
    for (int32_t i = 0; i < n; i++) {
        /* t.comp[i] is set: every rule was visited above, and Tarjan's algorithm puts each
         * visited vertex in a component (a top-level strongconnect's root has low == index,
         * so it pops everything left on the stack); the analyzer cannot follow that. */
        // NOLINTNEXTLINE(clang-analyzer-core.uninitialized.ArraySubscript)
        if (i != root && (t.comp_size[t.comp[i]] > 1 || t.self_ref[i])) {
            c->unit_of_rule[i] = c->g->n_units;
            c->unit_rule[c->g->n_units++] = i;
        }
    }
    ok = true;
out:
    free(t.index);
    free(t.low);
    free(t.stack);
    free(t.comp);
    free(t.comp_size);
    free(t.on);
    free(t.self_ref);
    return ok;
}

// ---- NFA ----

int32_t
kg_grammar_nfa_add(cc_t *c, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2) {
    if (c->failed) {
        return 0;
    }
    if (c->n_ns >= KG_GRAMMAR_MAX_NFA_STATES) {
        cfail(c, "grammar too large: more than 2,000,000 automaton states (large repetition "
                 "counts or lengths multiply the grammar)");
        return 0;
    }
    int64_t cap = c->cap_ns;
    if (!grow(c, (void **)&c->ns, &cap, (int64_t)c->n_ns + 1, sizeof(nst_t))) {
        return 0;
    }
    c->cap_ns = (int32_t)cap;
    c->ns[c->n_ns] =
        (nst_t){.kind = kind, .lo = lo, .hi = hi, .out = out, .out2 = out2, .unit = -1};
    return c->n_ns++;
}

static int32_t nadd(cc_t *c, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2) {
    return kg_grammar_nfa_add(c, kind, lo, hi, out, out2);
}

static int32_t eps(cc_t *c, int32_t out, int32_t out2) {
    return nadd(c, N_EPS, 0, 0, out, out2);
}

static void patch(cc_t *c, int32_t end, int32_t to) {
    if (!c->failed) {
        c->ns[end].out = to;
    }
}

/* A chain of byte ranges ending at `end`: returns its first state. */
static int32_t byte_chain(cc_t *c, const uint8_t *lo, const uint8_t *hi, int n, int32_t end) {
    int32_t s = end;
    for (int i = n - 1; i >= 0; i--) {
        s = nadd(c, N_BYTE, lo[i], hi[i], s, -1);
    }
    return s;
}

/* The UTF-8 byte-range sequences of code points lo..hi (no surrogates
 * inside), each as a chain from a fresh alternative of `alt` to `end`
 * (regex-syntax's Utf8Sequences split). */
static void
utf8_seqs(cc_t *c, uint32_t lo, uint32_t hi, int32_t *alts, int32_t *n_alts, int cap, int32_t end) {
    if (lo > hi || c->failed) {
        return;
    }
    static const uint32_t max_of_len[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++) {
        if (lo <= max_of_len[i] && hi > max_of_len[i]) {
            utf8_seqs(c, lo, max_of_len[i], alts, n_alts, cap, end);
            utf8_seqs(c, max_of_len[i] + 1, hi, alts, n_alts, cap, end);
            return;
        }
    }
    int n = (int)kg_utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_seqs(c, lo, lo | m, alts, n_alts, cap, end);
                utf8_seqs(c, (lo | m) + 1, hi, alts, n_alts, cap, end);
                return;
            }
            if ((hi & m) != m) {
                utf8_seqs(c, lo, (hi & ~m) - 1, alts, n_alts, cap, end);
                utf8_seqs(c, hi & ~m, hi, alts, n_alts, cap, end);
                return;
            }
        }
    }
    /* lo and hi have the same length n here (the splits above ensure it); zeroed so that
     * is not needed to see that byte_chain reads only written bytes */
    uint8_t a[4] = {0}, b[4] = {0};
    kg_utf8_put(lo, (char *)a);
    kg_utf8_put(hi, (char *)b);
    if (*n_alts >= cap) {
        cfail(c, "grammar: character class too complex");
        return;
    }
    alts[(*n_alts)++] = byte_chain(c, a, b, n, end);
}

int32_t kg_grammar_nfa_fan_out(cc_t *c, const int32_t *alts, int32_t n) {
    if (n == 0) {
        return eps(c, -1, -1); /* leads nowhere: matches nothing */
    }
    int32_t s = alts[n - 1];
    for (int32_t i = n - 2; i >= 0; i--) {
        s = eps(c, alts[i], s);
    }
    return s;
}

static int32_t fan_out(cc_t *c, const int32_t *alts, int32_t n) {
    return kg_grammar_nfa_fan_out(c, alts, n);
}

static frag_t build(cc_t *c, int32_t e);

static frag_t build_repeat(cc_t *c, int32_t child, int32_t min, int32_t max) {
    int32_t start = eps(c, -1, -1);
    int32_t cur_end = start;
    for (int32_t i = 0; i < min && !c->failed; i++) {
        frag_t f = build(c, child);
        patch(c, cur_end, f.start);
        cur_end = f.end;
    }
    if (max == KG_GIR_UNBOUNDED) {
        int32_t loop_end = eps(c, -1, -1);
        frag_t f = build(c, child);
        int32_t loop = eps(c, f.start, loop_end);
        patch(c, f.end, loop);
        patch(c, cur_end, loop);
        return (frag_t){start, loop_end};
    }
    /* (x (x (x)?)?)? built inside out: each copy is optional after the last */
    int32_t tail_start = -1, tail_end = -1;
    for (int32_t i = 0; i < max - min && !c->failed; i++) {
        int32_t e = eps(c, -1, -1);
        frag_t f = build(c, child);
        int32_t s = eps(c, f.start, e);
        if (tail_start >= 0) {
            patch(c, f.end, tail_start);
            patch(c, tail_end, e);
        } else {
            patch(c, f.end, e);
        }
        tail_start = s;
        tail_end = e;
    }
    if (tail_start >= 0) {
        patch(c, cur_end, tail_start);
        cur_end = tail_end;
    }
    return (frag_t){start, cur_end};
}

static frag_t build(cc_t *c, int32_t e) {
    frag_t none = {0, 0};
    if (c->failed) {
        return none;
    }
    if (++c->depth > MAX_BUILD_DEPTH) {
        cfail(c, "grammar nested too deeply");
        c->depth--;
        return none;
    }
    const kg_gx_t *x = kg_gir_node(c->ir, e);
    frag_t r = none;
    switch (x->kind) {
    case KG_GX_EMPTY: {
        int32_t s = eps(c, -1, -1);
        r = (frag_t){s, s};
        break;
    }
    case KG_GX_BYTES: {
        int32_t end = eps(c, -1, -1);
        const uint8_t *b = (const uint8_t *)kg_gir_byte_data(c->ir, x);
        int32_t n = x->b;
        int32_t s = end;
        for (int32_t i = n - 1; i >= 0; i--) {
            s = nadd(c, N_BYTE, b[i], b[i], s, -1);
        }
        r = (frag_t){s, end};
        break;
    }
    case KG_GX_CHARS: {
        int32_t end = eps(c, -1, -1);
        enum { CAP = 4096 };
        int32_t *alts = malloc(CAP * sizeof(*alts));
        int32_t n = 0;
        if (!alts) {
            cfail(c, "grammar: out of memory");
            break;
        }
        for (int32_t i = 0; i < x->b; i++) {
            uint32_t lo, hi;
            kg_gir_range(c->ir, x, i, &lo, &hi);
            utf8_seqs(c, lo, hi, alts, &n, CAP, end);
        }
        r = (frag_t){fan_out(c, alts, n), end};
        free(alts);
        break;
    }
    case KG_GX_SEQ: {
        int32_t start = eps(c, -1, -1), cur = start;
        for (int32_t i = 0; i < x->b && !c->failed; i++) {
            frag_t f = build(c, kg_gir_kid(c->ir, kg_gir_node(c->ir, e), i));
            patch(c, cur, f.start);
            cur = f.end;
        }
        r = (frag_t){start, cur};
        break;
    }
    case KG_GX_ALT: {
        int32_t end = eps(c, -1, -1);
        int32_t n = x->b;
        int32_t *alts = malloc((size_t)n * sizeof(*alts));
        if (!alts) {
            cfail(c, "grammar: out of memory");
            break;
        }
        /* Stop at the first failure and fan out only what was built: the
         * later slots of alts were never written. */
        int32_t built = 0;
        for (; built < n && !c->failed; built++) {
            frag_t f = build(c, kg_gir_kid(c->ir, kg_gir_node(c->ir, e), built));
            patch(c, f.end, end);
            alts[built] = f.start;
        }
        r = (frag_t){fan_out(c, alts, built), end};
        free(alts);
        break;
    }
    case KG_GX_REPEAT:
        r = build_repeat(c, x->a, x->b, x->c);
        break;
    case KG_GX_REF: {
        int32_t rule = x->a;
        if (c->unit_of_rule[rule] >= 0) {
            int32_t end = eps(c, -1, -1);
            int32_t call = nadd(c, N_CALL, 0, 0, end, -1);
            if (!c->failed) {
                c->ns[call].unit = c->unit_of_rule[rule];
            }
            r = (frag_t){call, end};
        } else {
            r = build(c, kg_gir_rule_expr(c->ir, rule));
        }
        break;
    }
    case KG_GX_AND: {
        /* both sides into the NFA, then their product in their place */
        int32_t first = c->n_ns;
        frag_t fa = build(c, x->a);
        frag_t fb = build(c, x->b);
        if (!c->failed) {
            r = kg_grammar_nfa_and(c, first, fa.start, fa.end, fb.start, fb.end);
        }
        break;
    }
    }
    c->depth--;
    return c->failed ? none : r;
}

// ---- byte classes ----

static void byte_classes(cc_t *c) {
    bool cut[257] = {0};
    cut[0] = true;
    for (int32_t i = 0; i < c->n_ns; i++) {
        if (c->ns[i].kind == N_BYTE) {
            cut[c->ns[i].lo] = true;
            cut[c->ns[i].hi + 1] = true;
        }
    }
    int32_t k = -1;
    for (int b = 0; b < 256; b++) {
        if (cut[b]) {
            k++;
        }
        c->g->cls[b] = (uint8_t)k;
    }
    c->g->n_classes = k + 1;
}

// ---- subset construction ----

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The closure of seeds over N_EPS edges: the important states (byte,
 * call, match), sorted, into c->clos; returns how many. */
static int32_t closure(cc_t *c, const int32_t *seeds, int32_t n_seeds) {
    if (++c->gen == 0) {
        memset(c->stamp, 0, (size_t)c->n_ns * sizeof(*c->stamp));
        c->gen = 1;
    }
    int32_t sp = 0, n = 0;
    for (int32_t i = 0; i < n_seeds; i++) {
        c->stack[sp++] = seeds[i];
    }
    while (sp > 0) {
        int32_t s = c->stack[--sp];
        if (s < 0 || c->stamp[s] == c->gen) {
            continue;
        }
        c->stamp[s] = c->gen;
        const nst_t *x = &c->ns[s];
        if (x->kind == N_EPS) {
            if (x->out2 >= 0) {
                c->stack[sp++] = x->out2;
            }
            if (x->out >= 0) {
                c->stack[sp++] = x->out;
            }
        } else {
            c->clos[n++] = s;
        }
    }
    /* sort (insertion for short lists, else qsort) */
    for (int32_t i = 1; i < n && n <= 32; i++) {
        int32_t v = c->clos[i], j = i;
        while (j > 0 && c->clos[j - 1] > v) {
            c->clos[j] = c->clos[j - 1];
            j--;
        }
        c->clos[j] = v;
    }
    if (n > 32) {
        qsort(c->clos, (size_t)n, sizeof(int32_t), cmp_i32);
    }
    return n;
}

static uint64_t hash_set(const int32_t *s, int32_t n, int32_t unit) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)unit;
    for (int32_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uint32_t)s[i]) * 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static bool rehash(cc_t *c) {
    int32_t nc = c->hcap ? c->hcap * 2 : 1024;
    int32_t *t = malloc((size_t)nc * sizeof(*t));
    if (!t) {
        cfail(c, "grammar: out of memory");
        return false;
    }
    for (int32_t i = 0; i < nc; i++) {
        t[i] = -1;
    }
    kg_grammar_t *g = c->g;
    for (int32_t d = 0; d < g->n_states; d++) {
        uint64_t h = hash_set(c->pool + c->set_off[d], c->set_len[d], g->unit_of[d]);
        int32_t k = (int32_t)(h & (uint64_t)(nc - 1));
        while (t[k] >= 0) {
            k = (k + 1) & (nc - 1);
        }
        t[k] = d;
    }
    free(c->htab);
    c->htab = t;
    c->hcap = nc;
    return true;
}

/* The DFA state of closed set c->clos[0..n) in `unit`, created if new. */
static int32_t state_of(cc_t *c, int32_t n, int32_t unit) {
    kg_grammar_t *g = c->g;
    if (n == 0) {
        return -1;
    }
    if ((int64_t)(g->n_states + 1) * 2 > c->hcap && !rehash(c)) {
        return -1;
    }
    uint64_t h = hash_set(c->clos, n, unit);
    int32_t k = (int32_t)(h & (uint64_t)(c->hcap - 1));
    while (c->htab[k] >= 0) {
        int32_t d = c->htab[k];
        if (c->set_len[d] == n && g->unit_of[d] == unit &&
            memcmp(c->pool + c->set_off[d], c->clos, (size_t)n * sizeof(int32_t)) == 0) {
            return d;
        }
        k = (k + 1) & (c->hcap - 1);
    }
    if (g->n_states >= KG_GRAMMAR_MAX_DFA_STATES) {
        cfail(c, "grammar too large: more than 100,000 automaton states (large repetition "
                 "counts or lengths multiply the grammar)");
        return -1;
    }
    int32_t d = g->n_states;
    if (d + 1 >= c->cap_states) {
        int32_t nc = c->cap_states ? c->cap_states * 2 : 256;
        int64_t *so = realloc(c->set_off, ((size_t)nc + 1) * sizeof(*so));
        if (so) {
            c->set_off = so;
        }
        int32_t *sl = realloc(c->set_len, (size_t)nc * sizeof(*sl));
        if (sl) {
            c->set_len = sl;
        }
        int32_t *uo = realloc(g->unit_of, (size_t)nc * sizeof(*uo));
        if (uo) {
            g->unit_of = uo;
        }
        int32_t *nx = realloc(g->next, (size_t)nc * (size_t)g->n_classes * sizeof(*nx));
        if (nx) {
            g->next = nx;
        }
        uint8_t *fl = realloc(g->flags, (size_t)nc);
        if (fl) {
            g->flags = fl;
        }
        int32_t *co = realloc(g->call_off, ((size_t)nc + 1) * sizeof(*co));
        if (co) {
            g->call_off = co;
        }
        if (!so || !sl || !uo || !nx || !fl || !co) {
            cfail(c, "grammar: out of memory");
            return -1;
        }
        c->cap_states = nc;
    }
    if (!grow(c, (void **)&c->pool, &c->cap_pool, c->n_pool + n, sizeof(int32_t))) {
        return -1;
    }
    memcpy(c->pool + c->n_pool, c->clos, (size_t)n * sizeof(int32_t));
    c->set_off[d] = c->n_pool;
    c->set_len[d] = n;
    c->n_pool += n;
    g->unit_of[d] = unit;
    g->flags[d] = 0;
    g->n_states++;
    c->htab[k] = d;
    return d;
}

static bool add_call(cc_t *c, int32_t unit, int32_t ret) {
    kg_grammar_t *g = c->g;
    int64_t cap = c->cap_calls;
    if (!grow(c, (void **)&g->calls, &cap, (int64_t)c->n_calls + 1, sizeof(kg_gcall_t))) {
        return false;
    }
    c->cap_calls = (int32_t)cap;
    g->calls[c->n_calls++] = (kg_gcall_t){.unit = unit, .ret = ret};
    return true;
}

static bool determinize(cc_t *c) {
    kg_grammar_t *g = c->g;
    const int32_t nc = g->n_classes;
    int32_t *bucket_n = calloc((size_t)nc, sizeof(int32_t));
    int32_t *bucket_at = malloc(((size_t)nc + 1) * sizeof(int32_t));
    int32_t *targets = NULL;
    int64_t cap_targets = 0;
    int32_t *set = NULL;
    int64_t cap_set = 0;
    bool ok = false;
    c->stamp = calloc((size_t)c->n_ns, sizeof(*c->stamp));
    c->stack = malloc(((size_t)c->n_ns * 3 + 16) * sizeof(*c->stack));
    c->clos = malloc((size_t)c->n_ns * sizeof(*c->clos) + sizeof(int32_t));
    g->unit_start = malloc((size_t)g->n_units * sizeof(int32_t));
    if (!bucket_n || !bucket_at || !c->stamp || !c->stack || !c->clos || !g->unit_start) {
        cfail(c, "grammar: out of memory");
        goto out;
    }
    for (int32_t u = 0; u < g->n_units; u++) {
        int32_t n = closure(c, &c->unit_nfa[u], 1);
        g->unit_start[u] = state_of(c, n, u);
        if (c->failed) {
            goto out;
        }
    }
    for (int32_t d = 0; d < g->n_states && !c->failed; d++) {
        /* copy the set out: state_of may move the pool */
        int32_t n = c->set_len[d], unit = g->unit_of[d];
        if (!grow(c, (void **)&set, &cap_set, n, sizeof(int32_t))) {
            goto out;
        }
        memcpy(set, c->pool + c->set_off[d], (size_t)n * sizeof(int32_t));
        memset(bucket_n, 0, (size_t)nc * sizeof(int32_t));
        uint8_t flags = 0;
        for (int32_t i = 0; i < n; i++) {
            const nst_t *x = &c->ns[set[i]];
            if (x->kind == N_BYTE) {
                for (int32_t k = g->cls[x->lo]; k <= g->cls[x->hi]; k++) {
                    bucket_n[k]++;
                }
            } else if (x->kind == N_MATCH) {
                flags |= GS_ACCEPT;
            }
        }
        bucket_at[0] = 0;
        for (int32_t k = 0; k < nc; k++) {
            bucket_at[k + 1] = bucket_at[k] + bucket_n[k];
        }
        if (!grow(c, (void **)&targets, &cap_targets, bucket_at[nc] + 1, sizeof(int32_t))) {
            goto out;
        }
        memset(bucket_n, 0, (size_t)nc * sizeof(int32_t));
        for (int32_t i = 0; i < n; i++) {
            const nst_t *x = &c->ns[set[i]];
            if (x->kind == N_BYTE) {
                for (int32_t k = g->cls[x->lo]; k <= g->cls[x->hi]; k++) {
                    targets[bucket_at[k] + bucket_n[k]++] = x->out;
                }
            }
        }
        for (int32_t k = 0; k < nc && !c->failed; k++) {
            int32_t t = -1;
            if (bucket_n[k] > 0) {
                int32_t m = closure(c, targets + bucket_at[k], bucket_n[k]);
                t = state_of(c, m, unit);
            }
            g->next[(size_t)d * (size_t)nc + (size_t)k] = t;
        }
        g->call_off[d] = c->n_calls;
        for (int32_t i = 0; i < n && !c->failed; i++) {
            const nst_t *x = &c->ns[set[i]];
            if (x->kind == N_CALL) {
                int32_t m = closure(c, &x->out, 1);
                int32_t ret = state_of(c, m, unit);
                if (ret >= 0 && !add_call(c, x->unit, ret)) {
                    goto out;
                }
            }
        }
        g->flags[d] = flags;
    }
    if (!c->failed) {
        g->call_off[g->n_states] = c->n_calls;
        ok = true;
    }
out:
    free(bucket_n);
    free(bucket_at);
    free(targets);
    free(set);
    return ok && !c->failed;
}

// ---- analysis ----

/* Keep only states from which the unit can finish; drop edges and calls
 * into the others. */
static bool prune(cc_t *c) {
    kg_grammar_t *g = c->g;
    const int32_t ns = g->n_states, nc = g->n_classes;
    bool *live = calloc((size_t)ns, sizeof(bool));
    if (!live) {
        cfail(c, "grammar: out of memory");
        return false;
    }
    for (int32_t s = 0; s < ns; s++) {
        live[s] = (g->flags[s] & GS_ACCEPT) != 0;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = ns - 1; s >= 0; s--) {
            if (live[s]) {
                continue;
            }
            bool l = false;
            for (int32_t k = 0; k < nc && !l; k++) {
                int32_t t = g->next[(size_t)s * (size_t)nc + (size_t)k];
                l = t >= 0 && live[t];
            }
            for (int32_t k = g->call_off[s]; k < g->call_off[s + 1] && !l; k++) {
                l = live[g->unit_start[g->calls[k].unit]] && live[g->calls[k].ret];
            }
            if (l) {
                live[s] = true;
                changed = true;
            }
        }
    }
    /* unit 0 (the root) always exists (find_units starts n_units at 1) and determinize, which
     * ran first and succeeded, set unit_start[u] for every unit; the analyzer loses n_units
     * across the calls in between. */
    // NOLINTNEXTLINE(clang-analyzer-core.uninitialized.ArraySubscript)
    bool root_ok = live[g->unit_start[0]];
    /* drop dead edges and calls; compact the call list */
    int32_t w = 0;
    for (int32_t s = 0; s < ns; s++) {
        uint8_t fl = g->flags[s] & GS_ACCEPT;
        for (int32_t k = 0; k < nc; k++) {
            int32_t *t = &g->next[(size_t)s * (size_t)nc + (size_t)k];
            if (*t >= 0 && !live[*t]) {
                *t = -1;
            }
            if (*t >= 0) {
                fl |= GS_BYTES;
            }
        }
        int32_t from = g->call_off[s], to = g->call_off[s + 1];
        g->call_off[s] = w;
        for (int32_t k = from; k < to; k++) {
            kg_gcall_t cl = g->calls[k];
            if (live[g->unit_start[cl.unit]] && live[cl.ret]) {
                g->calls[w++] = cl;
                fl |= GS_CALLS;
                if (cl.unit == 0) {
                    g->root_called = true;
                }
            }
        }
        g->flags[s] = fl;
    }
    g->call_off[ns] = w;
    for (int32_t s = 0; s < ns; s++) {
        if ((g->flags[s] & GS_ACCEPT) && (g->unit_of[s] != 0 || g->root_called)) {
            g->flags[s] |= GS_ESCAPABLE;
        }
    }
    free(live);
    if (!root_ok) {
        cfail(c, "the grammar cannot match any text (a rule can never finish)");
        return false;
    }
    return true;
}

/* Refuse left recursion: a unit that can call itself (through others)
 * before reading a byte would make the matcher's closure endless. */
static bool check_left_recursion(cc_t *c) {
    kg_grammar_t *g = c->g;
    const int32_t ns = g->n_states, nu = g->n_units;
    bool ok = false;
    bool *reach = calloc((size_t)ns, sizeof(bool)); /* reachable from its unit's start on no byte */
    bool *nullable = calloc((size_t)nu, sizeof(bool));
    uint8_t *color = calloc((size_t)nu, 1);
    int32_t *stack = malloc((size_t)nu * 2 * sizeof(int32_t));
    int32_t *iter = malloc((size_t)nu * sizeof(int32_t));
    if (!reach || !nullable || !color || !stack || !iter) {
        cfail(c, "grammar: out of memory");
        goto out;
    }
    for (int32_t u = 0; u < nu; u++) {
        reach[g->unit_start[u]] = true;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = 0; s < ns; s++) {
            if (!reach[s]) {
                continue;
            }
            if ((g->flags[s] & GS_ACCEPT) && !nullable[g->unit_of[s]]) {
                nullable[g->unit_of[s]] = true;
                changed = true;
            }
            for (int32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
                if (nullable[g->calls[k].unit] && !reach[g->calls[k].ret]) {
                    reach[g->calls[k].ret] = true;
                    changed = true;
                }
            }
        }
    }
    /* DFS over "u calls v before any byte" looking for a cycle */
    for (int32_t root = 0; root < nu; root++) {
        if (color[root]) {
            continue;
        }
        int32_t sp = 0;
        stack[sp++] = root;
        color[root] = 1;
        iter[root] = 0;
        while (sp > 0) {
            int32_t u = stack[sp - 1];
            /* the next left call of u, counted over all its reachable states */
            int32_t idx = iter[u]++, v = -1, seen = 0;
            for (int32_t s = 0; s < ns && v < 0; s++) {
                if (!reach[s] || g->unit_of[s] != u) {
                    continue;
                }
                for (int32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
                    if (seen++ == idx) {
                        v = g->calls[k].unit;
                        break;
                    }
                }
            }
            if (v < 0) {
                color[u] = 2;
                sp--;
                continue;
            }
            if (color[v] == 1) {
                char msg[256];
                snprintf(msg, sizeof(msg),
                         "left recursion: rule '%s' can reach itself without reading any text",
                         kg_gir_rule_name(c->ir, c->unit_rule[v]));
                cfail(c, msg);
                goto out;
            }
            if (color[v] == 0) {
                color[v] = 1;
                iter[v] = 0;
                stack[sp++] = v;
            }
        }
    }
    ok = true;
out:
    free(reach);
    free(nullable);
    free(color);
    free(stack);
    free(iter);
    return ok;
}

// ---- public ----

kg_grammar_t *
kg_grammar_compile(const kg_gir_t *ir, kg_gvocab_t *vocab, char *errstr, size_t errstr_size) {
    int64_t t0 = kg_clock_us();
    cc_t c = {.ir = ir, .errstr = errstr, .errstr_size = errstr_size};
    kg_grammar_t *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(errstr, errstr_size, "grammar: out of memory");
        return NULL;
    }
    atomic_init(&g->refs, 1);
    g->vocab = kg_gvocab_ref(vocab);
    g->n_vocab = vocab->n_vocab;
    g->n_words = (vocab->n_vocab + 31) / 32;
    c.g = g;
    c.n_rules = kg_gir_n_rules(ir);
    if (!kg_gir_ok(ir)) {
        cfail(&c, "grammar: out of memory");
        goto fail;
    }
    if (kg_gir_root(ir) < 0) {
        cfail(&c, "grammar: no root rule");
        goto fail;
    }
    for (int32_t r = 0; r < c.n_rules; r++) {
        if (kg_gir_rule_expr(ir, r) < 0) {
            char msg[200];
            snprintf(msg, sizeof(msg), "grammar: undefined rule '%s'", kg_gir_rule_name(ir, r));
            cfail(&c, msg);
            goto fail;
        }
    }
    if (!find_units(&c)) {
        goto fail;
    }
    c.unit_nfa = malloc((size_t)g->n_units * sizeof(int32_t));
    if (!c.unit_nfa) {
        cfail(&c, "grammar: out of memory");
        goto fail;
    }
    for (int32_t u = 0; u < g->n_units && !c.failed; u++) {
        frag_t f = build(&c, kg_gir_rule_expr(ir, c.unit_rule[u]));
        int32_t m = nadd(&c, N_MATCH, 0, 0, -1, -1);
        patch(&c, f.end, m);
        c.unit_nfa[u] = f.start;
    }
    if (c.failed) {
        goto fail;
    }
    byte_classes(&c);
    if (!determinize(&c) || !prune(&c) || !check_left_recursion(&c)) {
        goto fail;
    }
    g->root_start = g->unit_start[0];
    if (!kg_grammar_build_masks(&c)) {
        goto fail;
    }
    g->memory =
        sizeof(*g) +
        (size_t)g->n_states * ((size_t)g->n_classes * 4 + 1 + 4 + 4 + sizeof(kg_gstate_mask_t)) +
        (size_t)g->call_off[g->n_states] * sizeof(kg_gcall_t) +
        (size_t)g->n_bitmaps * (size_t)g->n_words * 4 + (size_t)g->n_ids * 4;
    g->compile_ms = (double)(kg_clock_us() - t0) / 1000.0;
    goto done;
fail:
    kg_grammar_unref(g);
    g = NULL;
done:
    free(c.unit_of_rule);
    free(c.unit_rule);
    free(c.ns);
    free(c.unit_nfa);
    free(c.pool);
    free(c.set_off);
    free(c.set_len);
    free(c.htab);
    free(c.stamp);
    free(c.stack);
    free(c.clos);
    return g;
}

kg_grammar_t *kg_grammar_ref(kg_grammar_t *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void kg_grammar_unref(kg_grammar_t *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) {
        return;
    }
    kg_gvocab_unref(g->vocab);
    free(g->next);
    free(g->flags);
    free(g->unit_of);
    free(g->call_off);
    free(g->calls);
    free(g->unit_start);
    free(g->mask);
    free(g->bitmaps);
    free(g->ids);
    free(g);
}

size_t kg_grammar_memory(const kg_grammar_t *g) {
    return g->memory;
}

int32_t kg_grammar_n_states(const kg_grammar_t *g) {
    return g->n_states;
}

int32_t kg_grammar_n_vocab(const kg_grammar_t *g) {
    return g->n_vocab;
}

int32_t kg_grammar_mask_words(const kg_grammar_t *g) {
    return g->n_words;
}

double kg_grammar_compile_ms(const kg_grammar_t *g) {
    return g->compile_ms;
}

int64_t kg_grammar_compile_work(const kg_grammar_t *g) {
    return g->work;
}
