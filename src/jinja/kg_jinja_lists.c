/* kg_jinja_lists: the filters and methods of lists and dicts: join, map,
 * select/reject(attr), sort, dictsort, unique, items/keys/values, get,
 * append, pop, update, ... */
#include "kg_jinja_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define UNDEF ((kg_jinja_value_t){0})

static kg_jinja_value_t
as_list(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, const char *what) {
    if (v.type == KG_JINJA_LIST) {
        return v;
    }
    if (v.type == KG_JINJA_UNDEFINED || v.type == KG_JINJA_NONE) {
        return kj_list(rs);
    }
    if (v.type == KG_JINJA_DICT || v.type == KG_JINJA_STRING) {
        kg_jinja_value_t l = kj_list(rs);
        if (v.type == KG_JINJA_DICT) {
            for (size_t i = 0; i < v.u.d->n; i++) {
                kj_list_push(rs, l, v.u.d->kv[i]);
            }
        } else {
            for (size_t i = 0; i < v.u.s->len; i++) {
                kj_list_push(rs, l, kj_str(rs, v.u.s->s + i, 1));
            }
        }
        return l;
    }
    kj_fail(rs, at, "%s: expected a list, got %s", what, kj_type_name(v));
}

/* item.attr, with dotted paths and integer parts ("a.0.b"). */
static kg_jinja_value_t
attr_path(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kg_jinja_value_t attr) {
    if (attr.type == KG_JINJA_INT) {
        if (v.type == KG_JINJA_LIST) {
            int64_t i = attr.u.i < 0 ? attr.u.i + (int64_t)v.u.l->n : attr.u.i;
            return i >= 0 && (size_t)i < v.u.l->n ? v.u.l->v[i] : UNDEF;
        }
        return UNDEF;
    }
    if (attr.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "attribute names must be strings");
    }
    const char *p = attr.u.s->s;
    while (v.type != KG_JINJA_UNDEFINED) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        char part[128];
        if (n >= sizeof(part)) {
            return UNDEF;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        if (v.type == KG_JINJA_LIST && n > 0 && isdigit((unsigned char)part[0])) {
            size_t i = (size_t)strtoull(part, NULL, 10);
            v = i < v.u.l->n ? v.u.l->v[i] : UNDEF;
        } else if (v.type == KG_JINJA_DICT) {
            kg_jinja_value_t *f = kj_dict_get(v.u.d, part, n);
            v = f ? *f : UNDEF;
        } else {
            return UNDEF;
        }
        if (!dot) {
            break;
        }
        p = dot + 1;
    }
    return v;
}

static kg_jinja_value_t
f_join(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "join");
    kg_jinja_value_t sep = kj_arg(a, 0, "d"), attr = kj_arg(a, 1, "attribute");
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        kj_step(rs, at, 1);
        if (i && sep.type != KG_JINJA_UNDEFINED) {
            kj_buf_put_value(rs, &b, sep);
        }
        kg_jinja_value_t v = l.u.l->v[i];
        kj_buf_put_value(rs, &b, attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, v, attr) : v);
    }
    return kj_buf_value(rs, &b);
}

static kg_jinja_value_t
f_map(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "map");
    kg_jinja_value_t attr = kj_arg(a, 99, "attribute"), dflt = kj_arg(a, 99, "default");
    kg_jinja_value_t out = kj_list(rs);
    if (attr.type == KG_JINJA_UNDEFINED && a->n_pos == 0) {
        kj_fail(rs, at, "map: needs a filter name or attribute=");
    }
    for (size_t i = 0; i < l.u.l->n; i++) {
        kj_step(rs, at, 1);
        kg_jinja_value_t v;
        if (attr.type != KG_JINJA_UNDEFINED) {
            v = attr_path(rs, at, l.u.l->v[i], attr);
            if (v.type == KG_JINJA_UNDEFINED && dflt.type != KG_JINJA_UNDEFINED) {
                v = dflt;
            }
        } else {
            if (a->pos[0].type != KG_JINJA_STRING) {
                kj_fail(rs, at, "map: the filter name must be a string");
            }
            kj_args_t rest = {.pos = a->pos + 1, .n_pos = a->n_pos - 1};
            v = kj_filter(rs, at, a->pos[0].u.s->s, l.u.l->v[i], &rest);
        }
        kj_list_push(rs, out, v);
    }
    return out;
}

/* select / reject (by_attr false) and selectattr / rejectattr (true). */
static kg_jinja_value_t select_common(kj_rs_t *rs,
                                      const kj_node_t *at,
                                      kg_jinja_value_t self,
                                      kj_args_t *a,
                                      bool by_attr,
                                      bool reject) {
    kg_jinja_value_t l = as_list(rs, at, self, "select");
    size_t k = 0;
    kg_jinja_value_t attr = by_attr ? kj_arg(a, k++, NULL) : UNDEF;
    kg_jinja_value_t test = kj_arg(a, k++, NULL);
    if (test.type != KG_JINJA_UNDEFINED && test.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "select: the test name must be a string");
    }
    kj_args_t rest = {.pos = a->n_pos > k ? a->pos + k : NULL,
                      .n_pos = a->n_pos > k ? a->n_pos - k : 0};
    kg_jinja_value_t out = kj_list(rs);
    for (size_t i = 0; i < l.u.l->n; i++) {
        kj_step(rs, at, 1);
        kg_jinja_value_t v = by_attr ? attr_path(rs, at, l.u.l->v[i], attr) : l.u.l->v[i];
        bool ok =
            test.type == KG_JINJA_STRING ? kj_test(rs, at, test.u.s->s, v, &rest) : kj_truthy(v);
        if (ok != reject) {
            kj_list_push(rs, out, l.u.l->v[i]);
        }
    }
    return out;
}

static kg_jinja_value_t
f_select(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return select_common(rs, at, s, a, false, false);
}

static kg_jinja_value_t
f_reject(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return select_common(rs, at, s, a, false, true);
}

static kg_jinja_value_t
f_selectattr(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return select_common(rs, at, s, a, true, false);
}

static kg_jinja_value_t
f_rejectattr(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return select_common(rs, at, s, a, true, true);
}

// ---- ordering ----

typedef struct sort_key {
    kg_jinja_value_t key, item;
} sort_key_t;

static int key_cmp(
    kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t a, kg_jinja_value_t b, bool case_sensitive) {
    if (!case_sensitive && a.type == KG_JINJA_STRING && b.type == KG_JINJA_STRING) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        for (size_t i = 0; i < n; i++) {
            int x = tolower((unsigned char)a.u.s->s[i]), y = tolower((unsigned char)b.u.s->s[i]);
            if (x != y) {
                return x < y ? -1 : 1;
            }
        }
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    return kj_compare(rs, at, a, b);
}

/* A stable merge sort (kj_compare may fail and unwind, so no qsort). */
static void sort_keys(kj_rs_t *rs,
                      const kj_node_t *at,
                      sort_key_t *v,
                      sort_key_t *tmp,
                      size_t n,
                      bool cs,
                      bool reverse) {
    if (n < 2) {
        return;
    }
    size_t h = n / 2;
    sort_keys(rs, at, v, tmp, h, cs, reverse);
    sort_keys(rs, at, v + h, tmp, n - h, cs, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        kj_step(rs, at, 1);
        int c = key_cmp(rs, at, v[i].key, v[j].key, cs);
        tmp[k++] = (reverse ? c < 0 : c > 0) ? v[j++] : v[i++];
    }
    while (i < h) {
        tmp[k++] = v[i++];
    }
    while (j < n) {
        tmp[k++] = v[j++];
    }
    memcpy(v, tmp, n * sizeof(*v));
}

static kg_jinja_value_t sorted(kj_rs_t *rs,
                               const kj_node_t *at,
                               kg_jinja_value_t l,
                               kg_jinja_value_t attr,
                               bool by_value_of_pair,
                               bool cs,
                               bool reverse) {
    size_t n = l.u.l->n;
    sort_key_t *v = kj_alloc(rs->arena, (n + 1) * sizeof(*v));
    sort_key_t *tmp = kj_alloc(rs->arena, (n + 1) * sizeof(*tmp));
    if (!v || !tmp) {
        kj_fail(rs, at, "the template used more than its memory limit");
    }
    for (size_t i = 0; i < n; i++) {
        kg_jinja_value_t it = l.u.l->v[i];
        v[i].item = it;
        v[i].key = attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, it, attr)
                   : by_value_of_pair && it.type == KG_JINJA_LIST && it.u.l->n == 2 ? it.u.l->v[1]
                                                                                    : it;
    }
    sort_keys(rs, at, v, tmp, n, cs, reverse);
    kg_jinja_value_t out = kj_list(rs);
    for (size_t i = 0; i < n; i++) {
        kj_list_push(rs, out, v[i].item);
    }
    return out;
}

static kg_jinja_value_t
f_sort(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "sort");
    return sorted(rs, at, l, kj_arg(a, 2, "attribute"), false,
                  kj_truthy(kj_arg(a, 1, "case_sensitive")), kj_truthy(kj_arg(a, 0, "reverse")));
}

static kg_jinja_value_t items_of(kj_rs_t *rs, kg_jinja_value_t d) {
    kg_jinja_value_t out = kj_list(rs);
    for (size_t i = 0; i < d.u.d->n; i++) {
        kg_jinja_value_t pair = kj_list(rs);
        kj_list_push(rs, pair, d.u.d->kv[i]);
        kj_list_push(rs, pair, d.u.d->v[i]);
        kj_list_push(rs, out, pair);
    }
    return out;
}

static kg_jinja_value_t
f_dictsort(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    if (self.type != KG_JINJA_DICT) {
        kj_fail(rs, at, "dictsort: expected a dict");
    }
    kg_jinja_value_t by = kj_arg(a, 1, "by");
    bool by_value = by.type == KG_JINJA_STRING && !strcmp(by.u.s->s, "value");
    kg_jinja_value_t items = items_of(rs, self);
    if (!by_value) {
        return sorted(rs, at, items, kg_jinja_int(0), false,
                      kj_truthy(kj_arg(a, 0, "case_sensitive")),
                      kj_truthy(kj_arg(a, 2, "reverse")));
    }
    return sorted(rs, at, items, UNDEF, true, kj_truthy(kj_arg(a, 0, "case_sensitive")),
                  kj_truthy(kj_arg(a, 2, "reverse")));
}

static kg_jinja_value_t
f_reverse(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)a;
    if (self.type == KG_JINJA_STRING) {
        kg_jinja_value_t o = kj_str(rs, self.u.s->s, self.u.s->len);
        for (size_t i = 0; i < o.u.s->len; i++) {
            o.u.s->s[i] = self.u.s->s[self.u.s->len - 1 - i];
        }
        return o;
    }
    kg_jinja_value_t l = as_list(rs, at, self, "reverse"), out = kj_list(rs);
    for (size_t i = l.u.l->n; i-- > 0;) {
        kj_list_push(rs, out, l.u.l->v[i]);
    }
    return out;
}

static kg_jinja_value_t
f_unique(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "unique"), out = kj_list(rs);
    kg_jinja_value_t attr = kj_arg(a, 1, "attribute");
    for (size_t i = 0; i < l.u.l->n; i++) {
        kg_jinja_value_t k =
            attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, l.u.l->v[i], attr) : l.u.l->v[i];
        bool seen = false;
        for (size_t j = 0; j < out.u.l->n && !seen; j++) {
            kj_step(rs, at, 1);
            kg_jinja_value_t o = out.u.l->v[j];
            seen = kj_equal(k, attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, o, attr) : o);
        }
        if (!seen) {
            kj_list_push(rs, out, l.u.l->v[i]);
        }
    }
    return out;
}

static kg_jinja_value_t
minmax(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a, int sign) {
    kg_jinja_value_t l = as_list(rs, at, self, "min/max"), attr = kj_arg(a, 1, "attribute");
    bool cs = kj_truthy(kj_arg(a, 0, "case_sensitive"));
    kg_jinja_value_t best = UNDEF, best_key = UNDEF;
    for (size_t i = 0; i < l.u.l->n; i++) {
        kg_jinja_value_t k =
            attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, l.u.l->v[i], attr) : l.u.l->v[i];
        if (i == 0 || key_cmp(rs, at, k, best_key, cs) * sign > 0) {
            best = l.u.l->v[i];
            best_key = k;
        }
    }
    return best;
}

static kg_jinja_value_t f_min(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return minmax(rs, at, s, a, -1);
}

static kg_jinja_value_t f_max(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return minmax(rs, at, s, a, 1);
}

static kg_jinja_value_t
f_sum(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "sum"), attr = kj_arg(a, 0, "attribute");
    kg_jinja_value_t acc = kj_arg(a, 1, "start");
    if (acc.type == KG_JINJA_UNDEFINED) {
        acc = kg_jinja_int(0);
    }
    for (size_t i = 0; i < l.u.l->n; i++) {
        kg_jinja_value_t v =
            attr.type != KG_JINJA_UNDEFINED ? attr_path(rs, at, l.u.l->v[i], attr) : l.u.l->v[i];
        if (acc.type == KG_JINJA_INT && v.type == KG_JINJA_INT) {
            acc.u.i = (int64_t)((uint64_t)acc.u.i + (uint64_t)v.u.i);
        } else if ((acc.type == KG_JINJA_INT || acc.type == KG_JINJA_FLOAT) &&
                   (v.type == KG_JINJA_INT || v.type == KG_JINJA_FLOAT)) {
            double x = acc.type == KG_JINJA_INT ? (double)acc.u.i : acc.u.f;
            double y = v.type == KG_JINJA_INT ? (double)v.u.i : v.u.f;
            acc = kg_jinja_float(x + y);
        } else {
            kj_fail(rs, at, "sum: cannot add %s", kj_type_name(v));
        }
    }
    return acc;
}

static kg_jinja_value_t
f_batch(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t l = as_list(rs, at, self, "batch"), n = kj_arg(a, 0, "linecount");
    kg_jinja_value_t fill = kj_arg(a, 1, "fill_with");
    if (n.type != KG_JINJA_INT || n.u.i <= 0) {
        kj_fail(rs, at, "batch: needs a positive count");
    }
    kg_jinja_value_t out = kj_list(rs), cur = UNDEF;
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i % (size_t)n.u.i == 0) {
            cur = kj_list(rs);
            kj_list_push(rs, out, cur);
        }
        kj_list_push(rs, cur, l.u.l->v[i]);
    }
    while (fill.type != KG_JINJA_UNDEFINED && cur.type == KG_JINJA_LIST &&
           cur.u.l->n < (size_t)n.u.i) {
        kj_list_push(rs, cur, fill);
    }
    return out;
}

static kg_jinja_value_t
f_repr(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    (void)a;
    return kj_to_string(rs, self);
}

// ---- list methods ----

static kg_jinja_value_t
f_append(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    kj_list_push(rs, self, kj_arg(a, 0, NULL));
    return kg_jinja_none();
}

static kg_jinja_value_t
f_extend(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t o = as_list(rs, at, kj_arg(a, 0, NULL), "extend");
    for (size_t i = 0; i < o.u.l->n; i++) {
        kj_list_push(rs, self, o.u.l->v[i]);
    }
    return kg_jinja_none();
}

static kg_jinja_value_t
f_insert(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t iv = kj_arg(a, 0, NULL);
    if (iv.type != KG_JINJA_INT) {
        kj_fail(rs, at, "insert: the index must be an integer");
    }
    kg_jinja_list_t *l = self.u.l;
    int64_t i = iv.u.i < 0 ? iv.u.i + (int64_t)l->n : iv.u.i;
    size_t at_i = i < 0 ? 0 : (size_t)i > l->n ? l->n : (size_t)i;
    kj_list_push(rs, self, UNDEF);
    memmove(l->v + at_i + 1, l->v + at_i, (l->n - 1 - at_i) * sizeof(*l->v));
    l->v[at_i] = kj_arg(a, 1, NULL);
    return kg_jinja_none();
}

static kg_jinja_value_t
f_index(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t x = kj_arg(a, 0, NULL);
    for (size_t i = 0; i < self.u.l->n; i++) {
        if (kj_equal(self.u.l->v[i], x)) {
            return kg_jinja_int((int64_t)i);
        }
    }
    kj_fail(rs, at, "index: value not in list");
}

static kg_jinja_value_t
f_pop(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t k = kj_arg(a, 0, NULL);
    if (self.type == KG_JINJA_LIST) {
        kg_jinja_list_t *l = self.u.l;
        if (l->n == 0) {
            kj_fail(rs, at, "pop from an empty list");
        }
        int64_t i = k.type == KG_JINJA_INT ? k.u.i : -1;
        i = i < 0 ? i + (int64_t)l->n : i;
        if (i < 0 || (size_t)i >= l->n) {
            kj_fail(rs, at, "pop index out of range");
        }
        kg_jinja_value_t v = l->v[i];
        memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof(*l->v));
        l->n--;
        return v;
    }
    if (k.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "pop: dict keys are strings");
    }
    kg_jinja_dict_t *d = self.u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i]->len == k.u.s->len && !memcmp(d->k[i]->s, k.u.s->s, k.u.s->len)) {
            kg_jinja_value_t v = d->v[i];
            memmove(d->k + i, d->k + i + 1, (d->n - i - 1) * sizeof(kg_jinja_str_t *));
            memmove(d->kv + i, d->kv + i + 1, (d->n - i - 1) * sizeof(*d->kv));
            memmove(d->v + i, d->v + i + 1, (d->n - i - 1) * sizeof(*d->v));
            d->n--;
            return v;
        }
    }
    if (a->n_pos > 1) {
        return a->pos[1];
    }
    kj_fail(rs, at, "pop: key '%s' not found", k.u.s->s);
}

// ---- dict methods ----

static kg_jinja_value_t
f_items(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    (void)a;
    if (self.type != KG_JINJA_DICT) {
        return kj_list(rs);
    }
    return items_of(rs, self);
}

static kg_jinja_value_t
f_keys(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    (void)a;
    kg_jinja_value_t out = kj_list(rs);
    for (size_t i = 0; i < self.u.d->n; i++) {
        kj_list_push(rs, out, self.u.d->kv[i]);
    }
    return out;
}

static kg_jinja_value_t
f_values(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    (void)a;
    kg_jinja_value_t out = kj_list(rs);
    for (size_t i = 0; i < self.u.d->n; i++) {
        kj_list_push(rs, out, self.u.d->v[i]);
    }
    return out;
}

static kg_jinja_value_t
f_get(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)rs;
    kg_jinja_value_t k = kj_arg(a, 0, "key"), d = kj_arg(a, 1, "default");
    if (k.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "get: dict keys are strings");
    }
    kg_jinja_value_t *v = kj_dict_get(self.u.d, k.u.s->s, k.u.s->len);
    return v ? *v : d.type == KG_JINJA_UNDEFINED ? kg_jinja_none() : d;
}

static kg_jinja_value_t
f_setdefault(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t k = kj_arg(a, 0, NULL), d = kj_arg(a, 1, NULL);
    if (k.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "setdefault: dict keys are strings");
    }
    kg_jinja_value_t *v = kj_dict_get(self.u.d, k.u.s->s, k.u.s->len);
    if (v) {
        return *v;
    }
    d = d.type == KG_JINJA_UNDEFINED ? kg_jinja_none() : d;
    kj_dict_set(rs, self, k.u.s, d);
    return d;
}

static kg_jinja_value_t
f_update(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    kg_jinja_value_t o = kj_arg(a, 0, NULL);
    if (o.type == KG_JINJA_DICT) {
        for (size_t i = 0; i < o.u.d->n; i++) {
            kj_dict_set_key(rs, self, o.u.d->kv[i], o.u.d->v[i]);
        }
    } else if (o.type != KG_JINJA_UNDEFINED) {
        kj_fail(rs, at, "update: expected a dict");
    }
    for (size_t i = 0; i < a->n_kw; i++) {
        kj_dict_set(rs, self, kj_str_new(rs, a->kw_names[i], strlen(a->kw_names[i])), a->kw[i]);
    }
    return kg_jinja_none();
}

static kg_jinja_value_t
f_copy(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a) {
    (void)at;
    (void)a;
    if (self.type == KG_JINJA_LIST) {
        kg_jinja_value_t out = kj_list(rs);
        for (size_t i = 0; i < self.u.l->n; i++) {
            kj_list_push(rs, out, self.u.l->v[i]);
        }
        return out;
    }
    kg_jinja_value_t out = kj_dict(rs);
    for (size_t i = 0; i < self.u.d->n; i++) {
        kj_dict_set_key(rs, out, self.u.d->kv[i], self.u.d->v[i]);
    }
    return out;
}

const kj_filter_def_t kj_list_filters[] = {
    {"join", KJ_T_LIST | KJ_T_DICT | KJ_T_STR, f_join},
    {"map", KJ_T_LIST | KJ_T_DICT, f_map},
    {"select", KJ_T_LIST | KJ_T_DICT | KJ_T_STR, f_select},
    {"reject", KJ_T_LIST | KJ_T_DICT | KJ_T_STR, f_reject},
    {"selectattr", KJ_T_LIST | KJ_T_DICT, f_selectattr},
    {"rejectattr", KJ_T_LIST | KJ_T_DICT, f_rejectattr},
    {"sort", KJ_T_LIST | KJ_T_DICT | KJ_T_STR, f_sort},
    {"dictsort", KJ_T_DICT, f_dictsort},
    {"reverse", KJ_T_LIST | KJ_T_STR | KJ_T_DICT, f_reverse},
    {"unique", KJ_T_LIST | KJ_T_STR, f_unique},
    {"min", KJ_T_LIST | KJ_T_STR, f_min},
    {"max", KJ_T_LIST | KJ_T_STR, f_max},
    {"sum", KJ_T_LIST, f_sum},
    {"batch", KJ_T_LIST, f_batch},
    {"string", KJ_T_LIST | KJ_T_DICT, f_repr},
    {"safe", KJ_T_LIST | KJ_T_DICT, f_repr},
    {"append", KJ_T_LIST, f_append},
    {"extend", KJ_T_LIST, f_extend},
    {"insert", KJ_T_LIST, f_insert},
    {"index", KJ_T_LIST, f_index},
    {"pop", KJ_T_LIST | KJ_T_DICT, f_pop},
    {"items", KJ_T_DICT, f_items},
    {"keys", KJ_T_DICT, f_keys},
    {"values", KJ_T_DICT, f_values},
    {"get", KJ_T_DICT, f_get},
    {"setdefault", KJ_T_DICT, f_setdefault},
    {"update", KJ_T_DICT, f_update},
    {"copy", KJ_T_LIST | KJ_T_DICT, f_copy},
    {NULL, 0, NULL},
};
