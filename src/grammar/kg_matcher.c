/* kg_matcher: stack sets and the run-time matcher (see kg_grammar.h).
 * The closure, the byte step and the token check are also what the
 * compiler uses to precompute masks (kg_grammar_int.h), so the two can
 * never disagree. */
#include "kg_grammar_int.h"

#include <stdlib.h>
#include <string.h>

struct kg_matcher {
    const kg_grammar_t *g;
    kg_gset_t sets[4]; /* the current set and three scratch sets */
    kg_gset_t *cur;
    kg_gwork_t w;
    bool overflowed;
};

// ---- stack sets ----

static bool same_stack(const int32_t *a, int32_t la, const int32_t *b, int32_t lb) {
    return la == lb && memcmp(a, b, (size_t)la * sizeof(*a)) == 0;
}

static void push_work(kg_gwork_t *w, const int32_t *f, int32_t len, bool *overflow) {
    if (w->n == KG_MATCHER_MAX_STACKS || len > KG_MATCHER_MAX_DEPTH || len < 1) {
        *overflow = true;
        return;
    }
    memcpy(w->fr[w->n], f, (size_t)len * sizeof(*f));
    w->len[w->n++] = len;
}

void kg_gset_close(const kg_grammar_t *g, kg_gwork_t *w, kg_gset_t *out, bool relative) {
    int32_t f[KG_MATCHER_MAX_DEPTH + 1];
    w->n_vis = 0;
    while (w->n > 0) {
        w->n--;
        const int32_t len = w->len[w->n];
        memcpy(f, w->fr[w->n], (size_t)len * sizeof(*f));
        const int32_t t = f[len - 1];
        const uint8_t fl = g->flags[t];
        bool seen = false;
        if (fl & GS_BYTES) {
            for (int32_t i = 0; i < out->n && !seen; i++) {
                seen = same_stack(out->fr[i], out->len[i], f, len);
            }
            if (seen) {
                continue;
            }
            if (out->n == KG_MATCHER_MAX_STACKS) {
                out->overflow = true;
                continue;
            }
            memcpy(out->fr[out->n], f, (size_t)len * sizeof(*f));
            out->len[out->n++] = len;
        } else {
            for (int32_t i = 0; i < w->n_vis && !seen; i++) {
                seen = same_stack(w->vis[i], w->vis_len[i], f, len);
            }
            if (seen) {
                continue;
            }
            if (w->n_vis == KG_MATCHER_MAX_STACKS) {
                out->overflow = true;
                continue;
            }
            memcpy(w->vis[w->n_vis], f, (size_t)len * sizeof(*f));
            w->vis_len[w->n_vis++] = len;
        }
        if (fl & GS_ACCEPT) {
            if (len > 1) {
                push_work(w, f, len - 1, &out->overflow); /* return to the caller */
            } else if (relative && (fl & GS_ESCAPABLE)) {
                out->esc = true;
            } else {
                out->can_end = true;
            }
        }
        if (fl & GS_CALLS) {
            for (int32_t k = g->call_off[t]; k < g->call_off[t + 1]; k++) {
                if (len + 1 > KG_MATCHER_MAX_DEPTH) {
                    out->overflow = true;
                    break;
                }
                f[len - 1] = g->calls[k].ret;
                f[len] = g->unit_start[g->calls[k].unit];
                push_work(w, f, len + 1, &out->overflow);
            }
            f[len - 1] = t;
        }
    }
}

void kg_gset_step(const kg_grammar_t *g,
                  const kg_gset_t *in,
                  uint8_t b,
                  kg_gwork_t *w,
                  kg_gset_t *out,
                  bool relative) {
    const int32_t c = g->cls[b];
    kg_gset_clear(out);
    if (in->n == 1) {
        /* the common case: one stack, and a state that only reads bytes */
        const int32_t len = in->len[0];
        const int32_t nt = g->next[(size_t)in->fr[0][len - 1] * (size_t)g->n_classes + (size_t)c];
        if (nt < 0) {
            return;
        }
        if (g->flags[nt] == GS_BYTES) {
            memcpy(out->fr[0], in->fr[0], (size_t)(len - 1) * sizeof(int32_t));
            out->fr[0][len - 1] = nt;
            out->len[0] = len;
            out->n = 1;
            return;
        }
    }
    w->n = 0;
    bool overflow = false;
    for (int32_t i = 0; i < in->n; i++) {
        const int32_t len = in->len[i];
        const int32_t nt = g->next[(size_t)in->fr[i][len - 1] * (size_t)g->n_classes + (size_t)c];
        if (nt >= 0 && w->n < KG_MATCHER_MAX_STACKS) {
            memcpy(w->fr[w->n], in->fr[i], (size_t)(len - 1) * sizeof(int32_t));
            w->fr[w->n][len - 1] = nt;
            w->len[w->n++] = len;
        } else if (nt >= 0) {
            overflow = true;
        }
    }
    kg_gset_close(g, w, out, relative);
    out->overflow = out->overflow || overflow;
}

// ---- the matcher ----

kg_matcher_t *kg_matcher_new(void) {
    return calloc(1, sizeof(kg_matcher_t));
}

void kg_matcher_free(kg_matcher_t *m) {
    free(m);
}

void kg_matcher_copy(kg_matcher_t *dst, const kg_matcher_t *src) {
    dst->g = src->g;
    dst->overflowed = src->overflowed;
    dst->cur = &dst->sets[0];
    const kg_gset_t *s = src->cur;
    dst->cur->n = s->n;
    dst->cur->can_end = s->can_end;
    dst->cur->esc = s->esc;
    dst->cur->overflow = s->overflow;
    for (int32_t i = 0; i < s->n; i++) {
        dst->cur->len[i] = s->len[i];
        memcpy(dst->cur->fr[i], s->fr[i], (size_t)s->len[i] * sizeof(int32_t));
    }
}

void kg_matcher_reset(kg_matcher_t *m, const kg_grammar_t *g) {
    m->g = g;
    m->overflowed = false;
    m->cur = &m->sets[0];
    kg_gset_clear(m->cur);
    m->w.n = 0;
    bool overflow = false;
    push_work(&m->w, &g->root_start, 1, &overflow);
    kg_gset_close(g, &m->w, m->cur, false);
}

/* The bytes of `tok` from the single stack `i` of the current set: accepted? */
static bool check_token(kg_matcher_t *m, int32_t i, int32_t tok) {
    const kg_grammar_t *g = m->g;
    const kg_gvocab_t *v = g->vocab;
    const uint8_t *p = v->bytes + v->off[tok];
    const int64_t n = v->off[tok + 1] - v->off[tok];
    kg_gset_t *spare[3];
    int ns = 0;
    for (int j = 0; j < 4; j++) {
        if (&m->sets[j] != m->cur) {
            spare[ns++] = &m->sets[j];
        }
    }
    kg_gset_t *a = spare[0], *b = spare[1];
    kg_gset_clear(a);
    memcpy(a->fr[0], m->cur->fr[i], (size_t)m->cur->len[i] * sizeof(int32_t));
    a->len[0] = m->cur->len[i];
    a->n = 1;
    for (int64_t k = 0; k < n; k++) {
        kg_gset_step(g, a, p[k], &m->w, b, false);
        if (b->n == 0 && !(k == n - 1 && b->can_end)) {
            return false;
        }
        kg_gset_t *t = a;
        a = b;
        b = t;
    }
    return n > 0;
}

bool kg_matcher_fill_mask(kg_matcher_t *m, uint32_t *mask) {
    const kg_grammar_t *g = m->g;
    const kg_gset_t *c = m->cur;
    const int32_t nw = g->n_words;
    bool any = false;
    if (c->n == 0) {
        memset(mask, 0, (size_t)nw * sizeof(*mask));
        return false;
    }
    for (int32_t i = 0; i < c->n; i++) {
        const kg_gstate_mask_t *sm = &g->mask[c->fr[i][c->len[i] - 1]];
        if (sm->acc_bitmap >= 0) {
            const uint32_t *bm = g->bitmaps + (size_t)sm->acc_bitmap * (size_t)nw;
            if (i == 0) {
                memcpy(mask, bm, (size_t)nw * sizeof(*mask));
            } else {
                for (int32_t k = 0; k < nw; k++) {
                    mask[k] |= bm[k];
                }
            }
        } else {
            if (i == 0) {
                memset(mask, 0, (size_t)nw * sizeof(*mask));
            }
            const int32_t *ids = g->ids + sm->acc_off;
            for (int32_t k = 0; k < sm->acc_n; k++) {
                mask[ids[k] >> 5] |= 1u << (ids[k] & 31);
            }
        }
        any = any || sm->acc_n > 0;
    }
    /* the uncertain tokens: only a stack with a caller below can take them */
    for (int32_t i = 0; i < c->n; i++) {
        const kg_gstate_mask_t *sm = &g->mask[c->fr[i][c->len[i] - 1]];
        if (c->len[i] < 2 || sm->unc_n == 0) {
            continue;
        }
        const int32_t *ids = g->ids + sm->unc_off;
        for (int32_t k = 0; k < sm->unc_n; k++) {
            const int32_t id = ids[k];
            if (!(mask[id >> 5] & (1u << (id & 31))) && check_token(m, i, id)) {
                mask[id >> 5] |= 1u << (id & 31);
                any = true;
            }
        }
    }
    return any;
}

/* the grammar's vocabulary is the matcher's byte source: here beside its one user */
const uint8_t *kg_grammar_token_bytes(const kg_grammar_t *g, int32_t tok, size_t *n) {
    const kg_gvocab_t *v = g->vocab;
    if (tok < 0 || tok >= v->n_vocab) {
        *n = 0;
        return v->bytes;
    }
    *n = (size_t)(v->off[tok + 1] - v->off[tok]);
    return v->bytes + v->off[tok];
}

bool kg_matcher_accept(kg_matcher_t *m, int32_t token) {
    size_t n;
    const uint8_t *p = kg_grammar_token_bytes(m->g, token, &n);
    return kg_matcher_accept_bytes(m, p, n);
}

bool kg_matcher_accept_bytes(kg_matcher_t *m, const uint8_t *p, size_t n) {
    const kg_grammar_t *g = m->g;
    if (n == 0) {
        return false;
    }
    kg_gset_t *a = m->cur;
    kg_gset_t *spare[3];
    int ns = 0;
    for (int i = 0; i < 4; i++) {
        if (&m->sets[i] != m->cur) {
            spare[ns++] = &m->sets[i];
        }
    }
    kg_gset_t *b = spare[0];
    bool overflow = false;
    for (size_t k = 0; k < n; k++) {
        kg_gset_step(g, a, p[k], &m->w, b, false);
        overflow = overflow || b->overflow;
        if (b->n == 0 && !(k == n - 1 && b->can_end)) {
            return false;
        }
        a = b;
        b = b == spare[0] ? spare[1] : spare[0];
    }
    m->cur = a;
    m->overflowed = m->overflowed || overflow;
    return true;
}

bool kg_matcher_can_end(const kg_matcher_t *m) {
    return m->cur->can_end;
}

bool kg_matcher_is_done(const kg_matcher_t *m) {
    return m->cur->n == 0 && m->cur->can_end;
}

int32_t kg_matcher_forced(const kg_matcher_t *m) {
    const kg_gset_t *c = m->cur;
    if (c->n != 1 || c->can_end) {
        return -1;
    }
    return m->g->mask[c->fr[0][c->len[0] - 1]].forced;
}

bool kg_matcher_overflowed(const kg_matcher_t *m) {
    return m->overflowed;
}
