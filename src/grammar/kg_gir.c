/* kg_gir: the grammar IR (see kg_gir.h). Nodes, child lists, code-point
 * ranges and literal bytes live in four growing arrays; handles are
 * indices, so growing never invalidates them. */
#include "kg_gir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rule {
    char *name;
    int32_t expr; /* -1: undefined */
} rule_t;

struct kg_gir {
    kg_gx_t *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *kids;
    int32_t n_kids, cap_kids;
    uint32_t *ranges; /* (n_ranges, 2) lo, hi */
    int32_t n_ranges, cap_ranges;
    char *bytes;
    int32_t n_bytes, cap_bytes;
    rule_t *rules;
    int32_t n_rules, cap_rules;
    int32_t root;
    int32_t n_generated; /* for unique generated rule names */
    bool oom;
};

/* Grow `*p` (elements of `size` bytes) to hold `need`; false on OOM. */
static bool grow(kg_gir_t *g, void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) {
        return true;
    }
    if (need > INT32_MAX / 4) {
        g->oom = true;
        return false;
    }
    int32_t nc = *cap ? *cap : 16;
    while (nc < need) {
        nc *= 2;
    }
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) {
        g->oom = true;
        return false;
    }
    *p = q;
    *cap = nc;
    return true;
}

kg_gir_t *kg_gir_new(void) {
    kg_gir_t *g = calloc(1, sizeof(*g));
    if (g) {
        g->root = -1;
    }
    return g;
}

void kg_gir_free(kg_gir_t *g) {
    if (!g) {
        return;
    }
    for (int32_t i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
    }
    free(g->rules);
    free(g->nodes);
    free(g->kids);
    free(g->ranges);
    free(g->bytes);
    free(g);
}

bool kg_gir_ok(const kg_gir_t *g) {
    return !g->oom;
}

// ---- rules ----

int32_t kg_gir_rule(kg_gir_t *g, const char *name, size_t len) {
    for (int32_t i = 0; i < g->n_rules; i++) {
        if (strlen(g->rules[i].name) == len && memcmp(g->rules[i].name, name, len) == 0) {
            return i;
        }
    }
    if (!grow(g, (void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof(rule_t))) {
        return -1;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        g->oom = true;
        return -1;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    g->rules[g->n_rules] = (rule_t){.name = copy, .expr = -1};
    return g->n_rules++;
}

int32_t kg_gir_rule_new(kg_gir_t *g, const char *hint) {
    char name[96];
    for (;;) {
        snprintf(name, sizeof(name), "%.60s-%d", hint, g->n_generated++);
        bool taken = false;
        for (int32_t i = 0; i < g->n_rules && !taken; i++) {
            taken = strcmp(g->rules[i].name, name) == 0;
        }
        if (!taken) {
            return kg_gir_rule(g, name, strlen(name));
        }
    }
}

bool kg_gir_define(kg_gir_t *g, int32_t rule, int32_t expr) {
    if (rule < 0 || expr < 0) {
        g->oom = g->oom || expr < 0 || rule < 0;
        return true; /* reported through kg_gir_ok */
    }
    if (g->rules[rule].expr >= 0) {
        return false;
    }
    g->rules[rule].expr = expr;
    return true;
}

void kg_gir_set_root(kg_gir_t *g, int32_t rule) {
    g->root = rule;
}

int32_t kg_gir_n_rules(const kg_gir_t *g) {
    return g->n_rules;
}

int32_t kg_gir_root(const kg_gir_t *g) {
    return g->root;
}

const char *kg_gir_rule_name(const kg_gir_t *g, int32_t rule) {
    return g->rules[rule].name;
}

int32_t kg_gir_rule_expr(const kg_gir_t *g, int32_t rule) {
    return g->rules[rule].expr;
}

// ---- expressions ----

static int32_t add_node(kg_gir_t *g, kg_gx_kind_t kind, int32_t a, int32_t b, int32_t c) {
    if (!grow(g, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(kg_gx_t))) {
        return -1;
    }
    g->nodes[g->n_nodes] = (kg_gx_t){.kind = kind, .a = a, .b = b, .c = c};
    return g->n_nodes++;
}

int32_t kg_gir_empty(kg_gir_t *g) {
    return add_node(g, KG_GX_EMPTY, 0, 0, 0);
}

int32_t kg_gir_bytes(kg_gir_t *g, const char *s, size_t len) {
    if (len == 0) {
        return kg_gir_empty(g);
    }
    if (len > (size_t)INT32_MAX / 4 ||
        !grow(g, (void **)&g->bytes, &g->cap_bytes, g->n_bytes + (int32_t)len, 1)) {
        g->oom = true;
        return -1;
    }
    memcpy(g->bytes + g->n_bytes, s, len);
    int32_t at = g->n_bytes;
    g->n_bytes += (int32_t)len;
    return add_node(g, KG_GX_BYTES, at, (int32_t)len, 0);
}

typedef struct span {
    uint32_t lo, hi;
} span_t;

static int cmp_span(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

int32_t kg_gir_chars(kg_gir_t *g, const uint32_t *lo, const uint32_t *hi, int32_t n, bool negate) {
    /* normalise: clip, sort, merge; then complement; then cut out the
     * surrogates (they have no UTF-8 form) */
    span_t *s = malloc(((size_t)n + 2) * 2 * sizeof(*s));
    if (!s) {
        g->oom = true;
        return -1;
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t a = lo[i], b = hi[i] > KG_GIR_MAX_CP ? KG_GIR_MAX_CP : hi[i];
        if (a <= b) {
            s[m++] = (span_t){a, b};
        }
    }
    qsort(s, (size_t)m, sizeof(*s), cmp_span);
    int32_t k = 0;
    for (int32_t i = 0; i < m; i++) {
        if (k > 0 && s[i].lo <= s[k - 1].hi + 1) {
            if (s[i].hi > s[k - 1].hi) {
                s[k - 1].hi = s[i].hi;
            }
        } else {
            s[k++] = s[i];
        }
    }
    span_t *t = s + (size_t)n + 2; /* second half of the buffer */
    int32_t nt = 0;
    if (negate) {
        uint32_t next = 0;
        for (int32_t i = 0; i < k; i++) {
            if (s[i].lo > next) {
                t[nt++] = (span_t){next, s[i].lo - 1};
            }
            next = s[i].hi + 1;
        }
        if (next <= KG_GIR_MAX_CP) {
            t[nt++] = (span_t){next, KG_GIR_MAX_CP};
        }
    } else {
        memcpy(t, s, (size_t)k * sizeof(*t));
        nt = k;
    }
    /* remove 0xD800..0xDFFF; may split one span into two (room: n + 2) */
    int32_t nr = 0;
    span_t out[2];
    int32_t at = g->n_ranges;
    for (int32_t i = 0; i < nt; i++) {
        int32_t no = 0;
        if (t[i].hi < 0xD800 || t[i].lo > 0xDFFF) {
            out[no++] = t[i];
        } else {
            if (t[i].lo < 0xD800) {
                out[no++] = (span_t){t[i].lo, 0xD7FF};
            }
            if (t[i].hi > 0xDFFF) {
                out[no++] = (span_t){0xE000, t[i].hi};
            }
        }
        for (int32_t j = 0; j < no; j++) {
            if (!grow(g, (void **)&g->ranges, &g->cap_ranges, (g->n_ranges + 1) * 2,
                      sizeof(uint32_t))) {
                free(s);
                return -1;
            }
            g->ranges[2 * (size_t)g->n_ranges] = out[j].lo;
            g->ranges[2 * (size_t)g->n_ranges + 1] = out[j].hi;
            g->n_ranges++;
            nr++;
        }
    }
    free(s);
    return add_node(g, KG_GX_CHARS, at, nr, 0);
}

int32_t kg_gir_char_range(kg_gir_t *g, uint32_t lo, uint32_t hi) {
    return kg_gir_chars(g, &lo, &hi, 1, false);
}

static int32_t add_list(kg_gir_t *g, kg_gx_kind_t kind, const int32_t *items, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (items[i] < 0) {
            g->oom = true;
            return -1;
        }
    }
    if (!grow(g, (void **)&g->kids, &g->cap_kids, g->n_kids + n, sizeof(int32_t))) {
        return -1;
    }
    memcpy(g->kids + g->n_kids, items, (size_t)n * sizeof(int32_t));
    int32_t at = g->n_kids;
    g->n_kids += n;
    return add_node(g, kind, at, n, 0);
}

int32_t kg_gir_seq(kg_gir_t *g, const int32_t *items, int32_t n) {
    if (n == 1) {
        return items[0];
    }
    return n == 0 ? kg_gir_empty(g) : add_list(g, KG_GX_SEQ, items, n);
}

int32_t kg_gir_seq2(kg_gir_t *g, int32_t a, int32_t b) {
    int32_t v[2] = {a, b};
    return kg_gir_seq(g, v, 2);
}

int32_t kg_gir_seq3(kg_gir_t *g, int32_t a, int32_t b, int32_t c) {
    int32_t v[3] = {a, b, c};
    return kg_gir_seq(g, v, 3);
}

int32_t kg_gir_alt(kg_gir_t *g, const int32_t *items, int32_t n) {
    if (n == 1) {
        return items[0];
    }
    if (n == 0) {
        return kg_gir_chars(g, NULL, NULL, 0, false); /* matches nothing */
    }
    return add_list(g, KG_GX_ALT, items, n);
}

int32_t kg_gir_alt2(kg_gir_t *g, int32_t a, int32_t b) {
    int32_t v[2] = {a, b};
    return kg_gir_alt(g, v, 2);
}

int32_t kg_gir_repeat(kg_gir_t *g, int32_t expr, int32_t min, int32_t max) {
    if (expr < 0 || min < 0 || (max != KG_GIR_UNBOUNDED && max < min)) {
        if (expr < 0) {
            g->oom = true;
        }
        return -1;
    }
    if (min == 1 && max == 1) {
        return expr;
    }
    return add_node(g, KG_GX_REPEAT, expr, min, max);
}

int32_t kg_gir_opt(kg_gir_t *g, int32_t expr) {
    return kg_gir_repeat(g, expr, 0, 1);
}

int32_t kg_gir_ref(kg_gir_t *g, int32_t rule) {
    if (rule < 0) {
        g->oom = true;
        return -1;
    }
    return add_node(g, KG_GX_REF, rule, 0, 0);
}

int32_t kg_gir_and(kg_gir_t *g, int32_t a, int32_t b) {
    if (a < 0 || b < 0) {
        g->oom = true;
        return -1;
    }
    return add_node(g, KG_GX_AND, a, b, 0);
}

/* Lengths beyond this are taken as that many (a minimum) or unbounded (a
 * maximum), which keeps the range true and the arithmetic from overflowing
 * (nested counted repetitions multiply). */
#define BIG_LENGTH 1000000000000000LL

static void clamp(int64_t *min, int64_t *max) {
    *min = *min > BIG_LENGTH ? BIG_LENGTH : *min;
    *max = *max > BIG_LENGTH ? -1 : *max;
}

/* The text lengths of e (see kg_gir.h); depth guards the C stack. */
static bool text_length(const kg_gir_t *g, int32_t e, int64_t *min, int64_t *max, int depth) {
    const kg_gx_t *x = &g->nodes[e];
    if (depth > 2000) {
        return false;
    }
    switch (x->kind) {
    case KG_GX_EMPTY:
        *min = *max = 0;
        return true;
    case KG_GX_CHARS:
        *min = *max = 1;
        return true;
    case KG_GX_BYTES: {
        int64_t n = 0;
        for (int32_t i = 0; i < x->b; i++) {
            n += ((unsigned char)g->bytes[x->a + i] & 0xC0) != 0x80; /* lead bytes */
        }
        *min = *max = n;
        return true;
    }
    case KG_GX_SEQ:
    case KG_GX_ALT: {
        bool seq = x->kind == KG_GX_SEQ;
        *min = seq ? 0 : INT64_MAX;
        *max = 0;
        for (int32_t i = 0; i < x->b; i++) {
            int64_t lo, hi;
            if (!text_length(g, g->kids[x->a + i], &lo, &hi, depth + 1)) {
                return false;
            }
            *min = seq ? *min + lo : (lo < *min ? lo : *min);
            if (*max >= 0) {
                *max = hi < 0 ? -1 : seq ? *max + hi : (hi > *max ? hi : *max);
            }
            clamp(min, max);
        }
        return true;
    }
    case KG_GX_REPEAT: {
        int64_t lo, hi;
        if (!text_length(g, x->a, &lo, &hi, depth + 1)) {
            return false;
        }
        /* lo and hi are at most BIG_LENGTH: a product beyond it is BIG_LENGTH */
        *min = x->b > 0 && lo > BIG_LENGTH / x->b ? BIG_LENGTH : lo * x->b;
        *max = hi == 0                              ? 0
               : hi < 0 || x->c == KG_GIR_UNBOUNDED ? -1
               : x->c > 0 && hi > BIG_LENGTH / x->c ? -1
                                                    : hi * x->c;
        clamp(min, max);
        return true;
    }
    case KG_GX_AND: {
        int64_t lo, hi;
        if (!text_length(g, x->a, min, max, depth + 1) ||
            !text_length(g, x->b, &lo, &hi, depth + 1)) {
            return false;
        }
        *min = lo > *min ? lo : *min;
        *max = *max < 0 ? hi : hi < 0 || *max < hi ? *max : hi;
        return true;
    }
    case KG_GX_REF:
        break;
    }
    return false;
}

bool kg_gir_text_length(const kg_gir_t *g, int32_t expr, int64_t *min, int64_t *max) {
    return expr >= 0 && text_length(g, expr, min, max, 0);
}

const kg_gx_t *kg_gir_node(const kg_gir_t *g, int32_t expr) {
    return &g->nodes[expr];
}

int32_t kg_gir_kid(const kg_gir_t *g, const kg_gx_t *x, int32_t i) {
    return g->kids[x->a + i];
}

void kg_gir_range(const kg_gir_t *g, const kg_gx_t *x, int32_t i, uint32_t *lo, uint32_t *hi) {
    *lo = g->ranges[2 * (size_t)(x->a + i)];
    *hi = g->ranges[2 * (size_t)(x->a + i) + 1];
}

const char *kg_gir_byte_data(const kg_gir_t *g, const kg_gx_t *x) {
    return g->bytes + x->a;
}

// ---- GBNF text ----

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n) {
    if (b->oom) {
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) {
            nc *= 2;
        }
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(sbuf_t *b, const char *s) {
    put(b, s, strlen(s));
}

/* One code point as GBNF writes it inside "..." or [...]. */
static void put_cp(sbuf_t *b, uint32_t c, bool in_class) {
    char tmp[16];
    if (c == '"' || c == '\\' || (in_class && (c == ']' || c == '-' || c == '^'))) {
        snprintf(tmp, sizeof(tmp), "\\%c", (char)c);
    } else if (c == '\n') {
        snprintf(tmp, sizeof(tmp), "\\n");
    } else if (c == '\t') {
        snprintf(tmp, sizeof(tmp), "\\t");
    } else if (c == '\r') {
        snprintf(tmp, sizeof(tmp), "\\r");
    } else if (c < 0x20 || c == 0x7f) {
        snprintf(tmp, sizeof(tmp), "\\x%02X", c);
    } else if (c < 0x80) {
        snprintf(tmp, sizeof(tmp), "%c", (char)c);
    } else if (c <= 0xFFFF) {
        snprintf(tmp, sizeof(tmp), "\\u%04X", c);
    } else {
        snprintf(tmp, sizeof(tmp), "\\U%08X", c);
    }
    puts_(b, tmp);
}

static void put_expr(sbuf_t *b, const kg_gir_t *g, int32_t e, int depth) {
    const kg_gx_t *x = &g->nodes[e];
    switch (x->kind) {
    case KG_GX_EMPTY:
        puts_(b, "\"\"");
        break;
    case KG_GX_BYTES:
        /* literal bytes: code points as GBNF writes them (the literals the
         * builders make are UTF-8) */
        puts_(b, "\"");
        for (int32_t i = 0; i < x->b;) {
            const unsigned char *s = (const unsigned char *)g->bytes + x->a + i;
            int32_t left = x->b - i, n = 1;
            uint32_t c = s[0];
            if (c >= 0xC0 && c < 0xE0 && left >= 2) {
                c = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu), n = 2;
            } else if (c >= 0xE0 && c < 0xF0 && left >= 3) {
                c = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu), n = 3;
            } else if (c >= 0xF0 && left >= 4) {
                c = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) |
                    (s[3] & 0x3Fu);
                n = 4;
            }
            put_cp(b, c, false);
            i += n;
        }
        puts_(b, "\"");
        break;
    case KG_GX_CHARS:
        puts_(b, "[");
        for (int32_t i = 0; i < x->b; i++) {
            uint32_t lo, hi;
            kg_gir_range(g, x, i, &lo, &hi);
            put_cp(b, lo, true);
            if (hi != lo) {
                puts_(b, "-");
                put_cp(b, hi, true);
            }
        }
        puts_(b, "]");
        break;
    case KG_GX_SEQ:
    case KG_GX_ALT:
        if (depth > 0) {
            puts_(b, "(");
        }
        for (int32_t i = 0; i < x->b; i++) {
            if (i > 0) {
                puts_(b, x->kind == KG_GX_ALT ? " | " : " ");
            }
            put_expr(b, g, g->kids[x->a + i], depth + 1);
        }
        if (depth > 0) {
            puts_(b, ")");
        }
        break;
    case KG_GX_REPEAT: {
        puts_(b, "(");
        put_expr(b, g, x->a, 0);
        char tmp[48];
        if (x->c == KG_GIR_UNBOUNDED) {
            snprintf(tmp, sizeof(tmp), "){%d,}", x->b);
        } else {
            snprintf(tmp, sizeof(tmp), "){%d,%d}", x->b, x->c);
        }
        puts_(b, tmp);
        break;
    }
    case KG_GX_REF:
        puts_(b, g->rules[x->a].name);
        break;
    case KG_GX_AND:
        /* GBNF has no intersection: this form is for reading only */
        puts_(b, "((");
        put_expr(b, g, x->a, 0);
        puts_(b, ") & (");
        put_expr(b, g, x->b, 0);
        puts_(b, "))");
        break;
    }
}

char *kg_gir_to_gbnf(const kg_gir_t *g) {
    sbuf_t b = {0};
    puts_(&b, "");
    for (int32_t r = 0; r < g->n_rules; r++) {
        if (g->rules[r].expr < 0) {
            continue;
        }
        puts_(&b, g->rules[r].name);
        puts_(&b, " ::= ");
        put_expr(&b, g, g->rules[r].expr, 0);
        puts_(&b, "\n");
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
