/* kg_gvocab: the token trie (see kg_gvocab.h). Built by sorting the
 * tokens' byte strings and emitting the trie of the sorted list in one
 * pass (the longest common prefix with the previous token says how far to
 * climb back). */
#include "kg_gvocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tref {
    const uint8_t *p;
    int32_t len;
    int32_t id;
} tref_t;

static int cmp_tref(const void *a, const void *b) {
    const tref_t *x = a, *y = b;
    int32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, (size_t)n);
    if (c != 0) {
        return c;
    }
    if (x->len != y->len) {
        return x->len < y->len ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id ? 1 : 0;
}

/* Build the trie from off/bytes (already filled). */
static bool build_trie(kg_gvocab_t *v) {
    bool ok = false;
    tref_t *t = malloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1) * sizeof(*t));
    int32_t *path = NULL; /* node index at each depth of the current path */
    if (!t) {
        return false;
    }
    int32_t n = 0;
    int64_t total = 0;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        int64_t len = v->off[id + 1] - v->off[id];
        if (len > 0 && len <= 65535) {
            t[n++] = (tref_t){v->bytes + v->off[id], (int32_t)len, id};
            total += len;
            if (len > v->max_len) {
                v->max_len = (int32_t)len;
            }
        }
    }
    v->n_tokens = n;
    qsort(t, (size_t)n, sizeof(*t), cmp_tref);
    /* at most one node per byte of all tokens */
    size_t cap = (size_t)(total > 0 ? total : 1);
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof(*v->depth));
    v->tok = malloc(cap * sizeof(*v->tok));
    v->end = malloc(cap * sizeof(*v->end));
    path = malloc(((size_t)v->max_len + 1) * sizeof(*path));
    if (!v->byte || !v->depth || !v->tok || !v->end || !path) {
        goto out;
    }
    int32_t nn = 0, plen = 0;
    const tref_t *prev = NULL;
    for (int32_t k = 0; k < n; k++) {
        const tref_t *cur = &t[k];
        int32_t lcp = 0;
        if (prev) {
            int32_t m = prev->len < cur->len ? prev->len : cur->len;
            while (lcp < m && prev->p[lcp] == cur->p[lcp]) {
                lcp++;
            }
        }
        while (plen > lcp) { /* close the nodes below the common prefix */
            v->end[path[--plen]] = nn;
        }
        if (prev && lcp == cur->len && lcp == prev->len) {
            /* the same bytes as the previous token: chain it */
            int32_t last = v->tok[path[plen - 1]];
            while (v->dup_next[last] >= 0) {
                last = v->dup_next[last];
            }
            v->dup_next[last] = cur->id;
            prev = cur;
            continue;
        }
        for (int32_t d = plen; d < cur->len; d++) {
            v->byte[nn] = cur->p[d];
            v->depth[nn] = (uint16_t)(d + 1);
            v->tok[nn] = -1;
            path[plen++] = nn++;
        }
        /* plen >= 1: every token in t has 1 to 65535 bytes (filtered above) and the loop
         * just extended the path to cur->len; the analyzer loses the lengths through qsort */
        // NOLINTNEXTLINE(clang-analyzer-core.uninitialized.ArraySubscript)
        v->tok[path[plen - 1]] = cur->id;
        prev = cur;
    }
    while (plen > 0) {
        v->end[path[--plen]] = nn;
    }
    v->n_nodes = nn;
    ok = true;
out:
    free(path);
    free(t);
    return ok;
}

static kg_gvocab_t *alloc_vocab(int32_t n_vocab, int64_t n_bytes) {
    kg_gvocab_t *v = calloc(1, sizeof(*v));
    if (!v) {
        return NULL;
    }
    atomic_init(&v->refs, 1);
    v->n_vocab = n_vocab;
    v->off = calloc((size_t)n_vocab + 1, sizeof(*v->off));
    v->bytes = malloc((size_t)(n_bytes > 0 ? n_bytes : 1));
    v->dup_next = malloc((size_t)(n_vocab > 0 ? n_vocab : 1) * sizeof(*v->dup_next));
    if (!v->off || !v->bytes || !v->dup_next) {
        kg_gvocab_unref(v);
        return NULL;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        v->dup_next[i] = -1;
    }
    return v;
}

kg_gvocab_t *kg_gvocab_new_raw(const char *const *texts,
                               const size_t *lens,
                               int32_t n_vocab,
                               char *errstr,
                               size_t errstr_size) {
    int64_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        total += (int64_t)lens[i];
    }
    kg_gvocab_t *v = n_vocab > 0 ? alloc_vocab(n_vocab, total) : NULL;
    if (!v) {
        snprintf(errstr, errstr_size, "vocabulary: out of memory or empty");
        return NULL;
    }
    int64_t at = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = at;
        memcpy(v->bytes + at, texts[i], lens[i]);
        at += (int64_t)lens[i];
    }
    v->off[n_vocab] = at;
    if (!build_trie(v)) {
        snprintf(errstr, errstr_size, "vocabulary: out of memory");
        kg_gvocab_unref(v);
        return NULL;
    }
    return v;
}

kg_gvocab_t *kg_gvocab_new(const kg_tokenizer_t *tok, char *errstr, size_t errstr_size) {
    int32_t n_vocab = kg_tokenizer_n_vocab(tok);
    char buf[512];
    int64_t total = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        if (!kg_tokenizer_is_eog(tok, id) && !kg_tokenizer_is_control(tok, id)) {
            total += (int64_t)kg_tokenizer_piece(tok, id, false, buf, sizeof(buf));
        }
    }
    kg_gvocab_t *v = n_vocab > 0 ? alloc_vocab(n_vocab, total) : NULL;
    if (!v) {
        snprintf(errstr, errstr_size, "vocabulary: out of memory or empty");
        return NULL;
    }
    int64_t at = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        v->off[id] = at;
        if (kg_tokenizer_is_eog(tok, id) || kg_tokenizer_is_control(tok, id)) {
            continue;
        }
        size_t n = kg_tokenizer_piece(tok, id, false, buf, sizeof(buf));
        if (n > sizeof(buf)) {
            kg_tokenizer_piece(tok, id, false, (char *)v->bytes + at, n);
        } else {
            memcpy(v->bytes + at, buf, n);
        }
        at += (int64_t)n;
    }
    v->off[n_vocab] = at;
    if (!build_trie(v)) {
        snprintf(errstr, errstr_size, "vocabulary: out of memory");
        kg_gvocab_unref(v);
        return NULL;
    }
    return v;
}

kg_gvocab_t *kg_gvocab_ref(kg_gvocab_t *v) {
    atomic_fetch_add(&v->refs, 1);
    return v;
}

void kg_gvocab_unref(kg_gvocab_t *v) {
    if (!v || atomic_fetch_sub(&v->refs, 1) != 1) {
        return;
    }
    free(v->byte);
    free(v->depth);
    free(v->tok);
    free(v->end);
    free(v->dup_next);
    free(v->off);
    free(v->bytes);
    free(v);
}
