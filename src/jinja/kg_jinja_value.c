/* kg_jinja_value: the arena, strings, lists and dicts of a render, and how
 * values compare, print and become JSON (as llama.cpp's engine prints them:
 * Python's True/False/None, floats with trailing zeros dropped, lists and
 * dicts in Python's repr, tojson with its indent and separators). */
#include "kg_jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- arena ----

struct kj_chunk {
    kj_chunk_t *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *kj_alloc(kj_arena_t *a, size_t size) {
    if (size > KJ_ALLOC_MAX) {
        return NULL; /* and the rounding below cannot wrap */
    }
    size = (size + 15) & ~(size_t)15;
    if (size == 0) {
        size = 16;
    }
    if (a->cap && a->used + size > a->cap) {
        return NULL;
    }
    kj_chunk_t *c = a->head;
    if (!c || c->size - c->used < size) {
        size_t cs = size > 32768 ? size : 32768;
        c = malloc(sizeof(*c) + cs);
        if (!c) {
            return NULL;
        }
        c->size = cs;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    a->used += size;
    memset(p, 0, size);
    return p;
}

void kj_arena_clear(kj_arena_t *a) {
    kj_chunk_t *c = a->head;
    while (c) {
        kj_chunk_t *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

static void rs_out_of_memory(kj_rs_t *rs) {
    kj_fail(rs, NULL, "the template used more than its memory limit of %zu bytes", rs->arena->cap);
}

static void *rs_alloc(kj_rs_t *rs, size_t size) {
    void *p = kj_alloc(rs->arena, size);
    if (!p) {
        rs_out_of_memory(rs);
    }
    return p;
}

// ---- strings and containers ----

kg_jinja_str_t *kj_str_new(kj_rs_t *rs, const char *s, size_t len) {
    kg_jinja_str_t *str = rs_alloc(rs, sizeof(*str) + len + 1);
    if (len) {
        memcpy(str->s, s, len);
    }
    str->len = len;
    return str;
}

kg_jinja_value_t kj_str(kj_rs_t *rs, const char *s, size_t len) {
    return (kg_jinja_value_t){.type = KG_JINJA_STRING, .u.s = kj_str_new(rs, s, len)};
}

kg_jinja_value_t kj_cstr(kj_rs_t *rs, const char *s) {
    return kj_str(rs, s, strlen(s));
}

kg_jinja_value_t kj_list(kj_rs_t *rs) {
    return (kg_jinja_value_t){.type = KG_JINJA_LIST, .u.l = rs_alloc(rs, sizeof(kg_jinja_list_t))};
}

kg_jinja_value_t kj_dict(kj_rs_t *rs) {
    return (kg_jinja_value_t){.type = KG_JINJA_DICT, .u.d = rs_alloc(rs, sizeof(kg_jinja_dict_t))};
}

static bool list_push(kj_arena_t *a, kg_jinja_list_t *l, kg_jinja_value_t v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        kg_jinja_value_t *nv = kj_alloc(a, cap * sizeof(*nv));
        if (!nv) {
            return false;
        }
        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof(*nv));
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

kg_jinja_value_t *kj_dict_get(const kg_jinja_dict_t *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i]->len == len && memcmp(d->k[i]->s, key, len) == 0) {
            return &d->v[i];
        }
    }
    return NULL;
}

static bool dict_set(kj_arena_t *a,
                     kg_jinja_dict_t *d,
                     kg_jinja_str_t *key,
                     kg_jinja_value_t key_val,
                     kg_jinja_value_t v) {
    kg_jinja_value_t *old = kj_dict_get(d, key->s, key->len);
    if (old) {
        *old = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        kg_jinja_str_t **nk = kj_alloc(a, cap * sizeof(kg_jinja_str_t *));
        kg_jinja_value_t *nkv = kj_alloc(a, cap * sizeof(*nkv));
        kg_jinja_value_t *nv = kj_alloc(a, cap * sizeof(*nv));
        if (!nk || !nkv || !nv) {
            return false;
        }
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(kg_jinja_str_t *));
            memcpy(nkv, d->kv, d->n * sizeof(*nkv));
            memcpy(nv, d->v, d->n * sizeof(*nv));
        }
        d->k = nk;
        d->kv = nkv;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->kv[d->n] = key_val.type == KG_JINJA_UNDEFINED
                      ? (kg_jinja_value_t){.type = KG_JINJA_STRING, .u.s = key}
                      : key_val;
    d->v[d->n++] = v;
    return true;
}

void kj_list_push(kj_rs_t *rs, kg_jinja_value_t list, kg_jinja_value_t v) {
    if (!list_push(rs->arena, list.u.l, v)) {
        rs_out_of_memory(rs);
    }
}

void kj_dict_set(kj_rs_t *rs, kg_jinja_value_t dict, kg_jinja_str_t *key, kg_jinja_value_t v) {
    if (!dict_set(rs->arena, dict.u.d, key, (kg_jinja_value_t){0}, v)) {
        rs_out_of_memory(rs);
    }
}

void kj_dict_set_key(kj_rs_t *rs, kg_jinja_value_t dict, kg_jinja_value_t key, kg_jinja_value_t v) {
    kg_jinja_value_t ks = kj_to_string(rs, key);
    if (!dict_set(rs->arena, dict.u.d, ks.u.s,
                  key.type == KG_JINJA_STRING ? (kg_jinja_value_t){0} : key, v)) {
        rs_out_of_memory(rs);
    }
}

// ---- the public constructors ----

kg_jinja_value_t kg_jinja_none(void) {
    return (kg_jinja_value_t){.type = KG_JINJA_NONE};
}

kg_jinja_value_t kg_jinja_bool(bool b) {
    return (kg_jinja_value_t){.type = KG_JINJA_BOOL, .u.b = b};
}

kg_jinja_value_t kg_jinja_int(int64_t i) {
    return (kg_jinja_value_t){.type = KG_JINJA_INT, .u.i = i};
}

kg_jinja_value_t kg_jinja_float(double f) {
    return (kg_jinja_value_t){.type = KG_JINJA_FLOAT, .u.f = f};
}

kg_jinja_value_t kg_jinja_string(kg_jinja_ctx_t *ctx, const char *s, size_t len) {
    kg_jinja_str_t *str = kj_alloc(&ctx->arena, sizeof(*str) + len + 1);
    if (!str) {
        ctx->failed = true;
        return (kg_jinja_value_t){0};
    }
    if (len) {
        memcpy(str->s, s, len);
    }
    str->len = len;
    return (kg_jinja_value_t){.type = KG_JINJA_STRING, .u.s = str};
}

kg_jinja_value_t kg_jinja_list_new(kg_jinja_ctx_t *ctx) {
    kg_jinja_list_t *l = kj_alloc(&ctx->arena, sizeof(*l));
    if (!l) {
        ctx->failed = true;
        return (kg_jinja_value_t){0};
    }
    return (kg_jinja_value_t){.type = KG_JINJA_LIST, .u.l = l};
}

kg_jinja_value_t kg_jinja_dict_new(kg_jinja_ctx_t *ctx) {
    kg_jinja_dict_t *d = kj_alloc(&ctx->arena, sizeof(*d));
    if (!d) {
        ctx->failed = true;
        return (kg_jinja_value_t){0};
    }
    return (kg_jinja_value_t){.type = KG_JINJA_DICT, .u.d = d};
}

kg_status_t kg_jinja_list_push(kg_jinja_ctx_t *ctx, kg_jinja_value_t list, kg_jinja_value_t v) {
    if (list.type != KG_JINJA_LIST || ctx->failed) {
        return KG_ERR_INVALID;
    }
    if (!list_push(&ctx->arena, list.u.l, v)) {
        ctx->failed = true;
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

kg_status_t
kg_jinja_dict_set(kg_jinja_ctx_t *ctx, kg_jinja_value_t dict, const char *key, kg_jinja_value_t v) {
    if (dict.type != KG_JINJA_DICT || ctx->failed) {
        return KG_ERR_INVALID;
    }
    kg_jinja_value_t k = kg_jinja_string(ctx, key, strlen(key));
    if (k.type != KG_JINJA_STRING ||
        !dict_set(&ctx->arena, dict.u.d, k.u.s, (kg_jinja_value_t){0}, v)) {
        ctx->failed = true;
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

bool kg_jinja_ctx_failed(const kg_jinja_ctx_t *ctx) {
    return ctx->failed;
}

// ---- truth, equality, order ----

bool kj_truthy(kg_jinja_value_t v) {
    switch (v.type) {
    case KG_JINJA_BOOL:
        return v.u.b;
    case KG_JINJA_INT:
        return v.u.i != 0;
    case KG_JINJA_FLOAT:
        return v.u.f != 0.0;
    case KG_JINJA_STRING:
        return v.u.s->len > 0;
    case KG_JINJA_LIST:
        return v.u.l->n > 0;
    case KG_JINJA_DICT:
        return v.u.d->n > 0;
    case KG_JINJA_CALLABLE:
        return true;
    default:
        return false;
    }
}

static bool is_num(kg_jinja_value_t v) {
    return v.type == KG_JINJA_INT || v.type == KG_JINJA_FLOAT || v.type == KG_JINJA_BOOL;
}

static double num(kg_jinja_value_t v) {
    return v.type == KG_JINJA_FLOAT ? v.u.f : v.type == KG_JINJA_INT ? (double)v.u.i : v.u.b;
}

bool kj_equal(kg_jinja_value_t a, kg_jinja_value_t b) {
    if (is_num(a) && is_num(b)) {
        if (a.type == KG_JINJA_INT && b.type == KG_JINJA_INT) {
            return a.u.i == b.u.i;
        }
        return num(a) == num(b);
    }
    if (a.type != b.type) {
        return false;
    }
    switch (a.type) {
    case KG_JINJA_UNDEFINED:
    case KG_JINJA_NONE:
        return true;
    case KG_JINJA_STRING:
        return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case KG_JINJA_LIST:
        if (a.u.l->n != b.u.l->n) {
            return false;
        }
        for (size_t i = 0; i < a.u.l->n; i++) {
            if (!kj_equal(a.u.l->v[i], b.u.l->v[i])) {
                return false;
            }
        }
        return true;
    case KG_JINJA_DICT:
        if (a.u.d->n != b.u.d->n) {
            return false;
        }
        for (size_t i = 0; i < a.u.d->n; i++) {
            kg_jinja_value_t *o = kj_dict_get(b.u.d, a.u.d->k[i]->s, a.u.d->k[i]->len);
            if (!o || !kj_equal(a.u.d->v[i], *o)) {
                return false;
            }
        }
        return true;
    default:
        return a.u.fn == b.u.fn;
    }
}

int kj_compare(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t a, kg_jinja_value_t b) {
    if (is_num(a) && is_num(b)) {
        if (a.type == KG_JINJA_INT && b.type == KG_JINJA_INT) {
            return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        }
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a.type == KG_JINJA_STRING && b.type == KG_JINJA_STRING) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c) {
            return c < 0 ? -1 : 1;
        }
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.type == KG_JINJA_LIST && b.type == KG_JINJA_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            int c = kj_compare(rs, at, a.u.l->v[i], b.u.l->v[i]);
            if (c) {
                return c;
            }
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    kj_fail(rs, at, "cannot compare %s with %s", kj_type_name(a), kj_type_name(b));
}

const char *kj_type_name(kg_jinja_value_t v) {
    static const char *const names[] = {"undefined", "none", "bool", "int",     "float",
                                        "string",    "list", "dict", "callable"};
    return names[v.type];
}

// ---- printing ----

void kj_buf_put(kj_rs_t *rs, kj_buf_t *b, const char *s, size_t len) {
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1) {
            cap *= 2;
        }
        char *p;
        if (b->heap) {
            p = realloc(b->p, cap);
            if (!p) {
                kj_fail(rs, NULL, "out of memory for the template's output");
            }
        } else {
            p = rs_alloc(rs, cap);
            if (b->len) {
                memcpy(p, b->p, b->len);
            }
        }
        b->p = p;
        b->cap = cap;
    }
    if (len) {
        memcpy(b->p + b->len, s, len);
    }
    b->len += len;
    b->p[b->len] = '\0';
}

static void put_s(kj_rs_t *rs, kj_buf_t *b, const char *s) {
    kj_buf_put(rs, b, s, strlen(s));
}

static void put_float(kj_rs_t *rs, kj_buf_t *b, double f) {
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%f", f); /* std::to_string, then trailing zeros dropped */
    size_t n = strlen(tmp);
    if (strchr(tmp, '.')) {
        while (n > 0 && tmp[n - 1] == '0') {
            n--;
        }
        if (n > 0 && tmp[n - 1] == '.') {
            tmp[n++] = '0';
        }
    }
    kj_buf_put(rs, b, tmp, n);
}

static void put_repr(kj_rs_t *rs, kj_buf_t *b, kg_jinja_value_t v) {
    if (v.type == KG_JINJA_STRING) {
        if (memchr(v.u.s->s, '\'', v.u.s->len)) {
            kj_buf_put_json(rs, b, v, -1, 0, ", ", ": ");
        } else {
            put_s(rs, b, "'");
            kj_buf_put(rs, b, v.u.s->s, v.u.s->len);
            put_s(rs, b, "'");
        }
    } else if (v.type == KG_JINJA_UNDEFINED) {
        put_s(rs, b, "Undefined");
    } else {
        kj_buf_put_value(rs, b, v);
    }
}

void kj_buf_put_value(kj_rs_t *rs, kj_buf_t *b, kg_jinja_value_t v) {
    char tmp[32];
    switch (v.type) {
    case KG_JINJA_UNDEFINED:
        return;
    case KG_JINJA_NONE:
        put_s(rs, b, "None");
        return;
    case KG_JINJA_BOOL:
        put_s(rs, b, v.u.b ? "True" : "False");
        return;
    case KG_JINJA_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i);
        put_s(rs, b, tmp);
        return;
    case KG_JINJA_FLOAT:
        put_float(rs, b, v.u.f);
        return;
    case KG_JINJA_STRING:
        kj_buf_put(rs, b, v.u.s->s, v.u.s->len);
        return;
    case KG_JINJA_LIST:
        put_s(rs, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            kj_step(rs, NULL, 1);
            if (i) {
                put_s(rs, b, ", ");
            }
            put_repr(rs, b, v.u.l->v[i]);
        }
        put_s(rs, b, "]");
        return;
    case KG_JINJA_DICT:
        put_s(rs, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            kj_step(rs, NULL, 1);
            if (i) {
                put_s(rs, b, ", ");
            }
            put_repr(rs, b, v.u.d->kv[i]);
            put_s(rs, b, ": ");
            put_repr(rs, b, v.u.d->v[i]);
        }
        put_s(rs, b, "}");
        return;
    case KG_JINJA_CALLABLE:
        put_s(rs, b, "<function>");
        return;
    }
}

kg_jinja_value_t kj_buf_value(kj_rs_t *rs, kj_buf_t *b) {
    if (!b->p) {
        return kj_str(rs, "", 0);
    }
    kg_jinja_str_t *s = rs_alloc(rs, sizeof(*s) + b->len + 1);
    memcpy(s->s, b->p, b->len);
    s->len = b->len;
    return (kg_jinja_value_t){.type = KG_JINJA_STRING, .u.s = s};
}

kg_jinja_value_t kj_to_string(kj_rs_t *rs, kg_jinja_value_t v) {
    if (v.type == KG_JINJA_STRING) {
        return v;
    }
    kj_buf_t b = {0}; /* an arena buffer (heap false): nothing to free */
    kj_buf_put_value(rs, &b, v);
    return kj_buf_value(rs, &b); // NOLINT(clang-analyzer-unix.Malloc): b.p is the arena's
}

static void put_indent(kj_rs_t *rs, kj_buf_t *b, int indent, int level) {
    for (int i = 0; indent > 0 && i < indent * level; i++) {
        put_s(rs, b, " ");
    }
}

static void put_json_string(kj_rs_t *rs, kj_buf_t *b, const char *s, size_t len) {
    put_s(rs, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f"
                          : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                                      : NULL;
        char u[8];
        if (!esc && c < 0x20) {
            snprintf(u, sizeof(u), "\\u%04x", c);
            esc = u;
        }
        if (esc) {
            kj_buf_put(rs, b, s + run, i - run);
            put_s(rs, b, esc);
            run = i + 1;
        }
    }
    kj_buf_put(rs, b, s + run, len - run);
    put_s(rs, b, "\"");
}

void kj_buf_put_json(kj_rs_t *rs,
                     kj_buf_t *b,
                     kg_jinja_value_t v,
                     int indent,
                     int level,
                     const char *item_sep,
                     const char *key_sep) {
    const char *nl = indent >= 0 ? "\n" : "";
    char tmp[64];
    kj_step(rs, NULL, 1);
    if (level > 200) {
        kj_fail(rs, NULL, "tojson: value nested too deeply");
    }
    switch (v.type) {
    case KG_JINJA_BOOL:
        put_s(rs, b, v.u.b ? "true" : "false");
        return;
    case KG_JINJA_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i);
        put_s(rs, b, tmp);
        return;
    case KG_JINJA_FLOAT:
        snprintf(tmp, sizeof(tmp), "%g", v.u.f); /* ostream << double */
        put_s(rs, b, tmp);
        return;
    case KG_JINJA_STRING:
        put_json_string(rs, b, v.u.s->s, v.u.s->len);
        return;
    case KG_JINJA_LIST:
        put_s(rs, b, "[");
        if (v.u.l->n) {
            put_s(rs, b, nl);
            for (size_t i = 0; i < v.u.l->n; i++) {
                put_indent(rs, b, indent, level + 1);
                kj_buf_put_json(rs, b, v.u.l->v[i], indent, level + 1, item_sep, key_sep);
                if (i + 1 < v.u.l->n) {
                    put_s(rs, b, item_sep);
                }
                put_s(rs, b, nl);
            }
            put_indent(rs, b, indent, level);
        }
        put_s(rs, b, "]");
        return;
    case KG_JINJA_DICT:
        put_s(rs, b, "{");
        if (v.u.d->n) {
            put_s(rs, b, nl);
            for (size_t i = 0; i < v.u.d->n; i++) {
                put_indent(rs, b, indent, level + 1);
                put_json_string(rs, b, v.u.d->k[i]->s, v.u.d->k[i]->len);
                put_s(rs, b, key_sep);
                kj_buf_put_json(rs, b, v.u.d->v[i], indent, level + 1, item_sep, key_sep);
                if (i + 1 < v.u.d->n) {
                    put_s(rs, b, item_sep);
                }
                put_s(rs, b, nl);
            }
            put_indent(rs, b, indent, level);
        }
        put_s(rs, b, "}");
        return;
    default:
        put_s(rs, b, "null");
        return;
    }
}
