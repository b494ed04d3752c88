/* kg_grammar_cache: the LRU of compiled grammars (see kg_grammar_cache.h).
 * Entries are few (a worker sees a handful of schemas), so lookup is a
 * scan over (hash, length) with a memcmp on a match. */
#include "kg_grammar_cache.h"

#include "../core/kg_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t hash;
    kg_constraint_kind_t kind;
    char *key; /* the constraint text */
    size_t key_len;
    kg_grammar_t *g; /* a reference; NULL for a cached failure */
    char *error;     /* the failure's message */
    size_t size;     /* bytes charged to the budget */
    uint64_t used;   /* tick of the last use */
} entry_t;

struct kg_grammar_cache {
    kg_gvocab_t *vocab;        /* NULL until the first miss when built from tok */
    const kg_tokenizer_t *tok; /* borrowed */
    size_t budget;
    entry_t *e;
    int32_t n, cap;
    uint64_t tick;
    _Atomic int64_t hits, misses, evictions, errors, bytes, compile_us;
    _Atomic int64_t entries;
};

static uint64_t hash_key(kg_constraint_kind_t kind, const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    }
    return h;
}

kg_grammar_cache_t *kg_grammar_cache_new(kg_gvocab_t *vocab, size_t budget) {
    kg_grammar_cache_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return NULL;
    }
    c->vocab = kg_gvocab_ref(vocab);
    c->budget = budget;
    return c;
}

kg_grammar_cache_t *kg_grammar_cache_new_for(const kg_tokenizer_t *tok, size_t budget) {
    kg_grammar_cache_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return NULL;
    }
    c->tok = tok;
    c->budget = budget;
    return c;
}

static void drop(entry_t *e) {
    kg_grammar_unref(e->g);
    free(e->key);
    free(e->error);
}

void kg_grammar_cache_free(kg_grammar_cache_t *c) {
    if (!c) {
        return;
    }
    for (int32_t i = 0; i < c->n; i++) {
        drop(&c->e[i]);
    }
    free(c->e);
    kg_gvocab_unref(c->vocab);
    free(c);
}

/* Evict least recently used entries (never `keep`) until within budget. */
static void evict(kg_grammar_cache_t *c, int32_t keep) {
    for (;;) {
        size_t total = (size_t)atomic_load(&c->bytes);
        if ((total <= c->budget && c->n <= KG_GRAMMAR_CACHE_MAX_ENTRIES) || c->n <= 1) {
            return;
        }
        int32_t victim = -1;
        for (int32_t i = 0; i < c->n; i++) {
            if (i != keep && (victim < 0 || c->e[i].used < c->e[victim].used)) {
                victim = i;
            }
        }
        if (victim < 0) {
            return;
        }
        atomic_fetch_sub(&c->bytes, (int64_t)c->e[victim].size);
        drop(&c->e[victim]);
        c->e[victim] = c->e[c->n - 1];
        c->n--;
        atomic_fetch_add(&c->evictions, 1);
        atomic_store(&c->entries, c->n);
        if (keep == c->n) {
            keep = victim; /* the kept entry moved into the hole */
        }
    }
}

kg_grammar_t *kg_grammar_cache_get_with(kg_grammar_cache_t *c,
                                        const kg_constraint_t *k,
                                        kg_gir_builder_fn json,
                                        void *json_ctx,
                                        char *errstr,
                                        size_t errstr_size) {
    uint64_t h = hash_key(k->kind, k->text, k->len);
    c->tick++;
    for (int32_t i = 0; i < c->n; i++) {
        entry_t *e = &c->e[i];
        if (e->hash == h && e->kind == k->kind && e->key_len == k->len &&
            memcmp(e->key, k->text, k->len) == 0) {
            e->used = c->tick;
            atomic_fetch_add(&c->hits, 1);
            if (!e->g) {
                snprintf(errstr, errstr_size, "%s", e->error);
                return NULL;
            }
            return kg_grammar_ref(e->g);
        }
    }
    atomic_fetch_add(&c->misses, 1);
    int64_t t0 = kg_clock_us();
    kg_grammar_t *g = NULL;
    if (!c->vocab) {
        c->vocab = kg_gvocab_new(c->tok, errstr, errstr_size);
        if (!c->vocab) {
            return NULL; /* not cached: memory, not the constraint's fault */
        }
    }
    kg_gir_t *ir = kg_constraint_build(k, json, json_ctx, errstr, errstr_size);
    if (ir) {
        g = kg_grammar_compile(ir, c->vocab, errstr, errstr_size);
        kg_gir_free(ir);
    }
    atomic_fetch_add(&c->compile_us, kg_clock_us() - t0);
    if (!g) {
        atomic_fetch_add(&c->errors, 1);
    }
    /* remember it (a failure too); on OOM just return the result */
    if (c->n == c->cap) {
        int32_t nc = c->cap ? c->cap * 2 : 16;
        entry_t *ne = realloc(c->e, (size_t)nc * sizeof(*ne));
        if (!ne) {
            return g;
        }
        c->e = ne;
        c->cap = nc;
    }
    entry_t e = {.hash = h, .kind = k->kind, .key_len = k->len, .used = c->tick};
    e.key = malloc(k->len + 1);
    e.error = g ? NULL : strdup(errstr);
    if (!e.key || (!g && !e.error)) {
        free(e.key);
        free(e.error);
        return g;
    }
    memcpy(e.key, k->text, k->len);
    e.key[k->len] = '\0';
    e.g = g ? kg_grammar_ref(g) : NULL;
    e.size = k->len + (g ? kg_grammar_memory(g) : strlen(errstr)) + sizeof(entry_t);
    c->e[c->n++] = e;
    atomic_fetch_add(&c->bytes, (int64_t)e.size);
    atomic_store(&c->entries, c->n);
    evict(c, c->n - 1);
    return g;
}

kg_grammar_t *kg_grammar_cache_get(kg_grammar_cache_t *c,
                                   const kg_constraint_t *k,
                                   kg_gir_builder_fn json,
                                   char *errstr,
                                   size_t errstr_size) {
    return kg_grammar_cache_get_with(c, k, json, NULL, errstr, errstr_size);
}

void kg_grammar_cache_stats(const kg_grammar_cache_t *c, kg_grammar_cache_stats_t *out) {
    kg_grammar_cache_t *m = (kg_grammar_cache_t *)c; /* atomics are read only */
    out->hits = atomic_load(&m->hits);
    out->misses = atomic_load(&m->misses);
    out->evictions = atomic_load(&m->evictions);
    out->errors = atomic_load(&m->errors);
    out->bytes = atomic_load(&m->bytes);
    out->entries = atomic_load(&m->entries);
    out->compile_us = atomic_load(&m->compile_us);
}

kg_gvocab_t *kg_grammar_cache_vocab(const kg_grammar_cache_t *c) {
    return c->vocab;
}
