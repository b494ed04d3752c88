/* kg_jinja_filters: the filters of strings and scalars (tojson, string,
 * default, length, int, ...). A filter is also a method of the types its
 * table entry names (`x|upper` and `x.upper()` are one function, as in
 * llama.cpp's engine); lists and dicts are kg_jinja_lists.c.
 *
 * A filter gets its receiver as `self` and the call's arguments; keyword
 * arguments are found by name or by position. */
#include "kg_jinja_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UNDEF ((kg_jinja_value_t){0})

/* Argument `i` (0 = the first after self) or the keyword `name`. */
kg_jinja_value_t kj_arg(const kj_args_t *a, size_t i, const char *name) {
    for (size_t k = 0; name && k < a->n_kw; k++) {
        if (!strcmp(a->kw_names[k], name)) {
            return a->kw[k];
        }
    }
    return i < a->n_pos ? a->pos[i] : UNDEF;
}

static kg_jinja_value_t
need_str(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, const char *what) {
    if (v.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "%s: expected a string, got %s", what, kj_type_name(v));
    }
    return v;
}

// ---- strings ----

static const char *const WS = " \t\n\r\v\f";

static kg_jinja_value_t strip_common(
    kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t self, kj_args_t *a, bool left, bool right) {
    need_str(rs, at, self, "strip");
    kg_jinja_value_t cv = kj_arg(a, 0, "chars");
    const char *chars = cv.type == KG_JINJA_STRING ? cv.u.s->s : WS;
    size_t b = 0, e = self.u.s->len;
    while (left && b < e && strchr(chars, self.u.s->s[b]) && self.u.s->s[b]) {
        b++;
    }
    while (right && e > b && strchr(chars, self.u.s->s[e - 1]) && self.u.s->s[e - 1]) {
        e--;
    }
    return kj_str(rs, self.u.s->s + b, e - b);
}

static kg_jinja_value_t
f_strip(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return strip_common(rs, at, s, a, true, true);
}

static kg_jinja_value_t
f_lstrip(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return strip_common(rs, at, s, a, true, false);
}

static kg_jinja_value_t
f_rstrip(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return strip_common(rs, at, s, a, false, true);
}

/* mode 0 upper, 1 lower, 2 title, 3 capitalize (ASCII, as llama.cpp) */
static kg_jinja_value_t recase(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, int mode) {
    need_str(rs, at, s, "case");
    kg_jinja_value_t o = kj_str(rs, s.u.s->s, s.u.s->len);
    char *p = o.u.s->s;
    bool word_start = true;
    for (size_t i = 0; i < o.u.s->len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (mode == 0) {
            p[i] = (char)toupper(c);
        } else if (mode == 1) {
            p[i] = (char)tolower(c);
        } else if (mode == 2) {
            p[i] = (char)(word_start ? toupper(c) : tolower(c));
            word_start = isspace(c) || c == '-' || c == '_' || c == '(' || c == '[' || c == '{';
        } else {
            p[i] = (char)(i == 0 ? toupper(c) : tolower(c));
        }
    }
    return o;
}

static kg_jinja_value_t
f_upper(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    return recase(rs, at, s, 0);
}

static kg_jinja_value_t
f_lower(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    return recase(rs, at, s, 1);
}

static kg_jinja_value_t
f_title(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    return recase(rs, at, s, 2);
}

static kg_jinja_value_t
f_capitalize(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    return recase(rs, at, s, 3);
}

static bool has_affix(kg_jinja_value_t s, kg_jinja_value_t x, bool prefix) {
    if (x.type != KG_JINJA_STRING || x.u.s->len > s.u.s->len) {
        return false;
    }
    const char *p = prefix ? s.u.s->s : s.u.s->s + s.u.s->len - x.u.s->len;
    return memcmp(p, x.u.s->s, x.u.s->len) == 0;
}

static kg_jinja_value_t
affix(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a, bool prefix) {
    need_str(rs, at, s, prefix ? "startswith" : "endswith");
    kg_jinja_value_t x = kj_arg(a, 0, NULL);
    if (x.type == KG_JINJA_LIST) { /* a tuple of choices */
        for (size_t i = 0; i < x.u.l->n; i++) {
            if (has_affix(s, x.u.l->v[i], prefix)) {
                return kg_jinja_bool(true);
            }
        }
        return kg_jinja_bool(false);
    }
    need_str(rs, at, x, prefix ? "startswith" : "endswith");
    return kg_jinja_bool(has_affix(s, x, prefix));
}

static kg_jinja_value_t
f_startswith(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return affix(rs, at, s, a, true);
}

static kg_jinja_value_t
f_endswith(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return affix(rs, at, s, a, false);
}

static const char *find(const char *h, size_t hl, const char *n, size_t nl, bool last) {
    if (nl > hl) {
        return NULL;
    }
    if (last) {
        for (size_t i = hl - nl + 1; i-- > 0;) {
            if (!memcmp(h + i, n, nl)) {
                return h + i;
            }
        }
        return NULL;
    }
    for (size_t i = 0; i + nl <= hl; i++) {
        if (!memcmp(h + i, n, nl)) {
            return h + i;
        }
    }
    return NULL;
}

static kg_jinja_value_t
split_common(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a, bool from_right) {
    need_str(rs, at, s, "split");
    kg_jinja_value_t d = kj_arg(a, 0, "sep");
    kg_jinja_value_t m = kj_arg(a, 1, "maxsplit");
    int64_t maxsplit = m.type == KG_JINJA_INT ? m.u.i : -1;
    kg_jinja_value_t out = kj_list(rs);
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    if (d.type != KG_JINJA_STRING) { /* Python: runs of whitespace, no empty parts */
        size_t i = 0;
        while (i < len) {
            while (i < len && isspace((unsigned char)p[i])) {
                i++;
            }
            if (i >= len) {
                break;
            }
            size_t j = i;
            if (maxsplit == 0) {
                j = len;
                while (j > i && isspace((unsigned char)p[j - 1])) {
                    j--;
                }
            } else {
                while (j < len && !isspace((unsigned char)p[j])) {
                    j++;
                }
            }
            kj_step(rs, at, 1);
            kj_list_push(rs, out, kj_str(rs, p + i, j - i));
            maxsplit--;
            i = j;
        }
        return out;
    }
    if (d.u.s->len == 0) {
        kj_fail(rs, at, "split: empty separator");
    }
    const char *sep = d.u.s->s;
    size_t sl = d.u.s->len;
    if (!from_right) {
        const char *q;
        while (maxsplit != 0 && (q = find(p, len, sep, sl, false))) {
            kj_step(rs, at, 1);
            kj_list_push(rs, out, kj_str(rs, p, (size_t)(q - p)));
            len -= (size_t)(q - p) + sl;
            p = q + sl;
            maxsplit--;
        }
        kj_list_push(rs, out, kj_str(rs, p, len));
        return out;
    }
    kg_jinja_value_t rev = kj_list(rs);
    const char *q;
    while (maxsplit != 0 && (q = find(p, len, sep, sl, true))) {
        kj_step(rs, at, 1);
        kj_list_push(rs, rev, kj_str(rs, q + sl, len - (size_t)(q - p) - sl));
        len = (size_t)(q - p);
        maxsplit--;
    }
    kj_list_push(rs, rev, kj_str(rs, p, len));
    for (size_t i = rev.u.l->n; i-- > 0;) {
        kj_list_push(rs, out, rev.u.l->v[i]);
    }
    return out;
}

static kg_jinja_value_t
f_split(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return split_common(rs, at, s, a, false);
}

static kg_jinja_value_t
f_rsplit(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    return split_common(rs, at, s, a, true);
}

static kg_jinja_value_t
f_replace(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    need_str(rs, at, s, "replace");
    kg_jinja_value_t o = need_str(rs, at, kj_arg(a, 0, "old"), "replace");
    kg_jinja_value_t n = need_str(rs, at, kj_arg(a, 1, "new"), "replace");
    kg_jinja_value_t c = kj_arg(a, 2, "count");
    int64_t count = c.type == KG_JINJA_INT ? c.u.i : -1;
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    if (o.u.s->len == 0) {
        for (size_t i = 0; i <= len; i++) {
            kj_step(rs, at, 1);
            if (count < 0 || (int64_t)i < count) {
                kj_buf_put(rs, &b, n.u.s->s, n.u.s->len);
            }
            if (i < len) {
                kj_buf_put(rs, &b, p + i, 1);
            }
        }
        return kj_buf_value(rs, &b);
    }
    const char *q;
    while (count != 0 && (q = find(p, len, o.u.s->s, o.u.s->len, false))) {
        kj_step(rs, at, 1);
        kj_buf_put(rs, &b, p, (size_t)(q - p));
        kj_buf_put(rs, &b, n.u.s->s, n.u.s->len);
        len -= (size_t)(q - p) + o.u.s->len;
        p = q + o.u.s->len;
        count--;
    }
    kj_buf_put(rs, &b, p, len);
    return kj_buf_value(rs, &b);
}

static kg_jinja_value_t
f_indent(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    need_str(rs, at, s, "indent");
    kg_jinja_value_t w = kj_arg(a, 0, "width");
    bool first = kj_truthy(kj_arg(a, 1, "first")), blank = kj_truthy(kj_arg(a, 2, "blank"));
    char pad[256];
    const char *ind = "    ";
    size_t il = 4;
    if (w.type == KG_JINJA_INT) {
        il = w.u.i < 0 ? 0 : w.u.i > 255 ? 255 : (size_t)w.u.i;
        memset(pad, ' ', il);
        ind = pad;
    } else if (w.type == KG_JINJA_STRING) {
        ind = w.u.s->s;
        il = w.u.s->len;
    }
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    bool any = false;
    while (p < end) { /* std::getline: lines without their '\n' */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        kj_step(rs, at, 1);
        if (any) {
            kj_buf_put(rs, &b, "\n", 1);
        }
        if (!any ? first : (ll > 0 || blank)) {
            kj_buf_put(rs, &b, ind, il);
        }
        kj_buf_put(rs, &b, p, ll);
        any = true;
        p += ll + (nl ? 1 : 0);
    }
    if (s.u.s->len && s.u.s->s[s.u.s->len - 1] == '\n') {
        kj_buf_put(rs, &b, "\n", 1);
        if (blank) {
            kj_buf_put(rs, &b, ind, il);
        }
    }
    return kj_buf_value(rs, &b);
}

static kg_jinja_value_t
f_escape(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    (void)at;
    s = kj_to_string(rs, s);
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '"'  ? "&#34;"
                        : c == '\'' ? "&#39;"
                                    : NULL;
        if (e) {
            kj_buf_put(rs, &b, e, strlen(e));
        } else {
            kj_buf_put(rs, &b, &c, 1);
        }
    }
    return kj_buf_value(rs, &b);
}

static kg_jinja_value_t
f_wordcount(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    (void)a;
    need_str(rs, at, s, "wordcount");
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s.u.s->len; i++) {
        bool w = !isspace((unsigned char)s.u.s->s[i]);
        n += w && !in;
        in = w;
    }
    return kg_jinja_int(n);
}

/* "{}" placeholders (str.format) or, with a '%', printf style (the filter). */
static kg_jinja_value_t
f_format(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t s, kj_args_t *a) {
    need_str(rs, at, s, "format");
    if (memchr(s.u.s->s, '%', s.u.s->len)) {
        kg_jinja_value_t l = kj_list(rs);
        for (size_t i = 0; i < a->n_pos; i++) {
            kj_list_push(rs, l, a->pos[i]);
        }
        return kj_percent_format(rs, at, s, l);
    }
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    size_t k = 0;
    for (size_t i = 0; i < s.u.s->len; i++) {
        if (s.u.s->s[i] == '{' && i + 1 < s.u.s->len && s.u.s->s[i + 1] == '}') {
            kj_buf_put_value(rs, &b, kj_arg(a, k++, NULL));
            i++;
        } else {
            kj_buf_put(rs, &b, s.u.s->s + i, 1);
        }
    }
    return kj_buf_value(rs, &b);
}

kg_jinja_value_t
kj_percent_format(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t fmt, kg_jinja_value_t args) {
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    size_t k = 0;
    for (size_t i = 0; i < fmt.u.s->len; i++) {
        char c = fmt.u.s->s[i];
        if (c != '%' || i + 1 >= fmt.u.s->len) {
            kj_buf_put(rs, &b, &c, 1);
            continue;
        }
        char conv = fmt.u.s->s[++i];
        if (conv == '%') {
            kj_buf_put(rs, &b, "%", 1);
            continue;
        }
        kg_jinja_value_t v = args.type == KG_JINJA_LIST ? (k < args.u.l->n ? args.u.l->v[k] : UNDEF)
                                                        : (k == 0 ? args : UNDEF);
        k++;
        char tmp[64];
        if (conv == 'd' || conv == 'i') {
            snprintf(tmp, sizeof(tmp), "%lld",
                     (long long)(v.type == KG_JINJA_FLOAT ? (int64_t)v.u.f : v.u.i));
            kj_buf_put(rs, &b, tmp, strlen(tmp));
        } else if (conv == 'f') {
            snprintf(tmp, sizeof(tmp), "%f", v.type == KG_JINJA_INT ? (double)v.u.i : v.u.f);
            kj_buf_put(rs, &b, tmp, strlen(tmp));
        } else if (conv == 's' || conv == 'r') {
            kj_buf_put_value(rs, &b, v);
        } else {
            kj_fail(rs, at, "unsupported format conversion '%%%c'", conv);
        }
    }
    return kj_buf_value(rs, &b);
}

// ---- any value ----

static kg_jinja_value_t
f_tojson(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)at;
    kg_jinja_value_t ind = kj_arg(a, 1, "indent"), sep = kj_arg(a, 2, "separators");
    if (a->n_pos == 1 && kj_arg(a, 0, NULL).type == KG_JINJA_INT) { /* tojson(2) */
        ind = a->pos[0];
    }
    int indent = ind.type == KG_JINJA_INT ? (int)(ind.u.i < 0    ? -1
                                                  : ind.u.i > 64 ? 64
                                                                 : ind.u.i)
                                          : -1;
    const char *item_sep = indent < 0 ? ", " : ",", *key_sep = ": ";
    if (sep.type == KG_JINJA_LIST) {
        if (sep.u.l->n > 0 && sep.u.l->v[0].type == KG_JINJA_STRING) {
            item_sep = sep.u.l->v[0].u.s->s;
        }
        if (sep.u.l->n > 1 && sep.u.l->v[1].type == KG_JINJA_STRING) {
            key_sep = sep.u.l->v[1].u.s->s;
        }
    }
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    kj_buf_put_json(rs, &b, v, indent, 0, item_sep, key_sep);
    if (kj_truthy(kj_arg(a, 0, "ensure_ascii")) &&
        !(a->n_pos == 1 && a->pos[0].type == KG_JINJA_INT)) {
        kj_buf_t e = {0};
        kj_buf_put(rs, &e, "", 0);
        for (size_t i = 0; i < b.len;) {
            unsigned char c = (unsigned char)b.p[i];
            if (c < 0x80) {
                kj_buf_put(rs, &e, b.p + i, 1);
                i++;
                continue;
            }
            size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            uint32_t cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0f : 0x1f);
            for (size_t k = 1; k < n && i + k < b.len; k++) {
                cp = (cp << 6) | ((unsigned char)b.p[i + k] & 0x3f);
            }
            char tmp[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof(tmp), "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                         0xdc00 + (cp & 0x3ff));
            } else {
                snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
            }
            kj_buf_put(rs, &e, tmp, strlen(tmp));
            i += n;
        }
        return kj_buf_value(rs, &e);
    }
    return kj_buf_value(rs, &b);
}

static kg_jinja_value_t
f_string(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)at;
    (void)a;
    if (v.type == KG_JINJA_UNDEFINED) {
        return kj_str(rs, "", 0);
    }
    return kj_to_string(rs, v);
}

static kg_jinja_value_t f_safe(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    if (v.type == KG_JINJA_INT || v.type == KG_JINJA_FLOAT) {
        return f_tojson(rs, at, v, a);
    }
    return f_string(rs, at, v, a);
}

static kg_jinja_value_t
f_default(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)at;
    kg_jinja_value_t d = kj_arg(a, 0, "default_value");
    if (d.type == KG_JINJA_UNDEFINED) {
        d = kj_str(rs, "", 0);
    }
    bool boolean = kj_truthy(kj_arg(a, 1, "boolean"));
    if (v.type == KG_JINJA_UNDEFINED || (boolean && !kj_truthy(v))) {
        return d;
    }
    return v;
}

static kg_jinja_value_t
f_length(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)a;
    switch (v.type) {
    case KG_JINJA_STRING:
        return kg_jinja_int((int64_t)v.u.s->len);
    case KG_JINJA_LIST:
        return kg_jinja_int((int64_t)v.u.l->n);
    case KG_JINJA_DICT:
        return kg_jinja_int((int64_t)v.u.d->n);
    case KG_JINJA_UNDEFINED:
        return kg_jinja_int(0);
    default:
        kj_fail(rs, at, "length: a %s has no length", kj_type_name(v));
    }
}

static kg_jinja_value_t to_list(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v) {
    kg_jinja_value_t l = kj_list(rs);
    if (v.type == KG_JINJA_LIST) {
        for (size_t i = 0; i < v.u.l->n; i++) {
            kj_list_push(rs, l, v.u.l->v[i]);
        }
    } else if (v.type == KG_JINJA_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) {
            kj_list_push(rs, l, v.u.d->kv[i]);
        }
    } else if (v.type == KG_JINJA_STRING) {
        for (size_t i = 0; i < v.u.s->len; i++) {
            kj_list_push(rs, l, kj_str(rs, v.u.s->s + i, 1));
        }
    } else if (v.type != KG_JINJA_UNDEFINED) {
        kj_fail(rs, at, "list: cannot make a list of a %s", kj_type_name(v));
    }
    kj_step(rs, at, l.u.l->n);
    return l;
}

static kg_jinja_value_t f_list(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)a;
    return to_list(rs, at, v);
}

static kg_jinja_value_t
f_first(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)a;
    kg_jinja_value_t l = to_list(rs, at, v);
    return l.u.l->n ? l.u.l->v[0] : UNDEF;
}

static kg_jinja_value_t f_last(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)a;
    kg_jinja_value_t l = to_list(rs, at, v);
    return l.u.l->n ? l.u.l->v[l.u.l->n - 1] : UNDEF;
}

static kg_jinja_value_t f_int(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)rs;
    (void)at;
    kg_jinja_value_t d = kj_arg(a, 0, "default");
    switch (v.type) {
    case KG_JINJA_INT:
        return v;
    case KG_JINJA_BOOL:
        return kg_jinja_int(v.u.b);
    case KG_JINJA_FLOAT:
        return kg_jinja_int((int64_t)v.u.f);
    case KG_JINJA_STRING: {
        char *end = NULL;
        long long x = strtoll(v.u.s->s, &end, 10);
        if (end != v.u.s->s) {
            return kg_jinja_int(x);
        }
        break;
    }
    default:
        break;
    }
    return d.type == KG_JINJA_INT ? d : kg_jinja_int(0);
}

static kg_jinja_value_t
f_float(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)rs;
    (void)at;
    switch (v.type) {
    case KG_JINJA_INT:
        return kg_jinja_float((double)v.u.i);
    case KG_JINJA_BOOL:
        return kg_jinja_float(v.u.b);
    case KG_JINJA_FLOAT:
        return v;
    case KG_JINJA_STRING: {
        char *end = NULL;
        double x = strtod(v.u.s->s, &end);
        if (end != v.u.s->s) {
            return kg_jinja_float(x);
        }
        break;
    }
    default:
        break;
    }
    kg_jinja_value_t d = kj_arg(a, 0, "default");
    return d.type == KG_JINJA_FLOAT ? d : kg_jinja_float(0.0);
}

static kg_jinja_value_t f_abs(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    (void)a;
    if (v.type == KG_JINJA_INT) {
        return kg_jinja_int(v.u.i < 0 ? (int64_t)(0 - (uint64_t)v.u.i) : v.u.i);
    }
    if (v.type == KG_JINJA_FLOAT) {
        return kg_jinja_float(v.u.f < 0 ? -v.u.f : v.u.f);
    }
    kj_fail(rs, at, "abs: expected a number");
}

static kg_jinja_value_t
f_round(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kj_args_t *a) {
    if (v.type == KG_JINJA_INT) {
        return kg_jinja_float((double)v.u.i);
    }
    if (v.type != KG_JINJA_FLOAT) {
        kj_fail(rs, at, "round: expected a number");
    }
    kg_jinja_value_t p = kj_arg(a, 0, "precision"), m = kj_arg(a, 1, "method");
    int64_t prec = p.type == KG_JINJA_INT ? p.u.i : 0;
    double scale = 1.0;
    for (int64_t i = 0; i < prec && i < 15; i++) {
        scale *= 10.0;
    }
    double x = v.u.f * scale;
    const char *method = m.type == KG_JINJA_STRING ? m.u.s->s : "common";
    double r = (double)(int64_t)x;
    if (!strcmp(method, "ceil")) {
        r += r < x ? 1.0 : 0.0;
    } else if (!strcmp(method, "floor")) {
        r -= r > x ? 1.0 : 0.0;
    } else {
        double frac = x - r;
        r += frac >= 0.5 ? 1.0 : frac <= -0.5 ? -1.0 : 0.0;
    }
    return kg_jinja_float(r / scale);
}

const kj_filter_def_t kj_scalar_filters[] = {
    {"strip", KJ_T_STR, f_strip},
    {"trim", KJ_T_STR, f_strip},
    {"lstrip", KJ_T_STR, f_lstrip},
    {"rstrip", KJ_T_STR, f_rstrip},
    {"upper", KJ_T_STR, f_upper},
    {"lower", KJ_T_STR, f_lower},
    {"title", KJ_T_STR, f_title},
    {"capitalize", KJ_T_STR, f_capitalize},
    {"startswith", KJ_T_STR, f_startswith},
    {"endswith", KJ_T_STR, f_endswith},
    {"split", KJ_T_STR, f_split},
    {"rsplit", KJ_T_STR, f_rsplit},
    {"replace", KJ_T_STR, f_replace},
    {"indent", KJ_T_STR, f_indent},
    {"escape", KJ_T_ANY, f_escape},
    {"e", KJ_T_ANY, f_escape},
    {"wordcount", KJ_T_STR, f_wordcount},
    {"format", KJ_T_STR, f_format},
    {"tojson", KJ_T_ANY, f_tojson},
    {"string", KJ_T_ANY & ~(KJ_T_LIST | KJ_T_DICT), f_string},
    {"safe", KJ_T_ANY & ~(KJ_T_LIST | KJ_T_DICT), f_safe},
    {"default", KJ_T_ANY, f_default},
    {"d", KJ_T_ANY, f_default},
    {"length", KJ_T_ANY, f_length},
    {"count", KJ_T_ANY & ~KJ_T_STR, f_length},
    {"list", KJ_T_ANY, f_list},
    {"first", KJ_T_ANY, f_first},
    {"last", KJ_T_ANY, f_last},
    {"int", KJ_T_ANY, f_int},
    {"float", KJ_T_ANY, f_float},
    {"abs", KJ_T_NUM, f_abs},
    {"round", KJ_T_NUM, f_round},
    {NULL, 0, NULL},
};
