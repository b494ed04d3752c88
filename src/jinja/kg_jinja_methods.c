/* kg_jinja_methods: dispatch of filters and methods by name and receiver
 * type, the `is` tests, and the global functions templates call (range,
 * namespace, dict, raise_exception, strftime_now). */
#include "kg_jinja_int.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define UNDEF ((kg_jinja_value_t){0})

static const kj_filter_def_t *lookup(const char *name, kg_jinja_type_t type, bool *name_known) {
    const kj_filter_def_t *tables[] = {kj_scalar_filters, kj_list_filters};
    for (size_t t = 0; t < 2; t++) {
        for (const kj_filter_def_t *f = tables[t]; f->name; f++) {
            if (!strcmp(f->name, name)) {
                *name_known = true;
                if (f->types & KJ_T(type)) {
                    return f;
                }
            }
        }
    }
    return NULL;
}

/* What a filter gives for an undefined receiver, as llama.cpp's engine does:
 * empty results rather than errors, so `x|default(...)`, `x|length` and
 * loops over missing lists behave. */
static bool undefined_filter(kj_rs_t *rs, const char *name, kg_jinja_value_t *out) {
    static const char *const to_list[] = {"list",       "items",   "map",        "select",
                                          "selectattr", "reject",  "rejectattr", "unique",
                                          "sort",       "reverse", "batch",      NULL};
    static const char *const to_str[] = {
        "join", "lower",      "upper", "trim",   "strip", "lstrip", "rstrip",  "string",
        "safe", "capitalize", "title", "escape", "e",     "indent", "replace", NULL};
    for (size_t i = 0; to_list[i]; i++) {
        if (!strcmp(name, to_list[i])) {
            *out = kj_list(rs);
            return true;
        }
    }
    for (size_t i = 0; to_str[i]; i++) {
        if (!strcmp(name, to_str[i])) {
            *out = kj_str(rs, "", 0);
            return true;
        }
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        *out = UNDEF;
        return true;
    }
    return false;
}

/* None gives empty lists to the list filters (llama.cpp's none builtins). */
static bool none_filter(kj_rs_t *rs, const char *name, kg_jinja_value_t *out) {
    static const char *const to_list[] = {"items",  "map",        "reject", "rejectattr",
                                          "select", "selectattr", "unique", NULL};
    for (size_t i = 0; to_list[i]; i++) {
        if (!strcmp(name, to_list[i])) {
            *out = kj_list(rs);
            return true;
        }
    }
    return false;
}

kg_jinja_value_t kj_filter_find_apply(kj_rs_t *rs,
                                      const kj_node_t *at,
                                      const char *name,
                                      kg_jinja_value_t v,
                                      kj_args_t *args,
                                      bool *found) {
    bool known = false;
    const kj_filter_def_t *f = lookup(name, v.type, &known);
    *found = f != NULL;
    if (!f) {
        return UNDEF;
    }
    kj_step(rs, at, 1);
    return f->fn(rs, at, v, args);
}

kg_jinja_value_t
kj_filter(kj_rs_t *rs, const kj_node_t *at, const char *name, kg_jinja_value_t v, kj_args_t *args) {
    bool known = false;
    const kj_filter_def_t *f = lookup(name, v.type, &known);
    if (f) {
        kj_step(rs, at, 1);
        return f->fn(rs, at, v, args);
    }
    kg_jinja_value_t out;
    if (v.type == KG_JINJA_UNDEFINED && undefined_filter(rs, name, &out)) {
        return out;
    }
    if (v.type == KG_JINJA_NONE && none_filter(rs, name, &out)) {
        return out;
    }
    if (!known) {
        kj_fail(rs, at, "unknown filter '%s'", name);
    }
    kj_fail(rs, at, "filter '%s' does not apply to a %s", name, kj_type_name(v));
}

/* The attributes that are methods: Python's own for each type. Filters
 * such as default or length are not attributes (`spec.default is defined`
 * must be false for a dict without that key). */
static bool is_method(kg_jinja_type_t type, const char *name) {
    static const char *const str_methods[] = {"strip",      "lstrip",   "rstrip", "split", "rsplit",
                                              "startswith", "endswith", "upper",  "lower", "title",
                                              "capitalize", "replace",  "format", NULL};
    static const char *const list_methods[] = {"append", "pop",  "insert", "extend",
                                               "index",  "copy", NULL};
    static const char *const dict_methods[] = {"get",        "keys",   "values", "items", "pop",
                                               "setdefault", "update", "copy",   NULL};
    const char *const *m = type == KG_JINJA_STRING ? str_methods
                           : type == KG_JINJA_LIST ? list_methods
                           : type == KG_JINJA_DICT ? dict_methods
                                                   : NULL;
    for (size_t i = 0; m && m[i]; i++) {
        if (!strcmp(m[i], name)) {
            return true;
        }
    }
    return false;
}

kg_jinja_value_t kj_method(kj_rs_t *rs, kg_jinja_value_t self, const char *name) {
    bool known = false;
    if (!is_method(self.type, name) || !lookup(name, self.type, &known)) {
        return UNDEF;
    }
    kg_jinja_fn_t *fn = kj_alloc(rs->arena, sizeof(*fn));
    if (!fn) {
        kj_fail(rs, NULL, "the template used more than its memory limit");
    }
    fn->kind = KJ_FN_METHOD;
    fn->self = self;
    fn->name = name;
    return (kg_jinja_value_t){.type = KG_JINJA_CALLABLE, .u.fn = fn};
}

kg_jinja_value_t
kj_call_method(kj_rs_t *rs, const kj_node_t *at, kg_jinja_fn_t *fn, kj_args_t *args) {
    return kj_filter(rs, at, fn->name, fn->self, args);
}

// ---- tests ----

static bool is_int(kg_jinja_value_t v) {
    return v.type == KG_JINJA_INT;
}

static bool str_all(kg_jinja_value_t v, int (*pred)(int), int (*other)(int)) {
    if (v.type != KG_JINJA_STRING) {
        return false;
    }
    for (size_t i = 0; i < v.u.s->len; i++) {
        unsigned char c = (unsigned char)v.u.s->s[i];
        if (other(c)) {
            return false;
        }
        (void)pred;
    }
    return true;
}

bool kj_test(
    kj_rs_t *rs, const kj_node_t *at, const char *name, kg_jinja_value_t v, kj_args_t *args) {
    kg_jinja_value_t x = kj_arg(args, 0, NULL);
    kj_step(rs, at, 1);
    if (!strcmp(name, "defined")) {
        return v.type != KG_JINJA_UNDEFINED;
    }
    if (!strcmp(name, "undefined")) {
        return v.type == KG_JINJA_UNDEFINED;
    }
    if (!strcmp(name, "none")) {
        return v.type == KG_JINJA_NONE;
    }
    if (!strcmp(name, "string")) {
        return v.type == KG_JINJA_STRING;
    }
    if (!strcmp(name, "number")) {
        return v.type == KG_JINJA_INT || v.type == KG_JINJA_FLOAT;
    }
    if (!strcmp(name, "integer")) {
        return v.type == KG_JINJA_INT;
    }
    if (!strcmp(name, "float")) {
        return v.type == KG_JINJA_FLOAT;
    }
    if (!strcmp(name, "boolean")) {
        return v.type == KG_JINJA_BOOL;
    }
    if (!strcmp(name, "true")) {
        return v.type == KG_JINJA_BOOL && v.u.b;
    }
    if (!strcmp(name, "false")) {
        return v.type == KG_JINJA_BOOL && !v.u.b;
    }
    if (!strcmp(name, "mapping")) {
        return v.type == KG_JINJA_DICT;
    }
    if (!strcmp(name, "iterable") || !strcmp(name, "sequence")) {
        return v.type == KG_JINJA_LIST || v.type == KG_JINJA_STRING ||
               v.type == KG_JINJA_UNDEFINED || (name[0] == 'i' && v.type == KG_JINJA_DICT);
    }
    if (!strcmp(name, "callable")) {
        return v.type == KG_JINJA_CALLABLE;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_int(v)) {
            kj_fail(rs, at, "test '%s' needs an integer", name);
        }
        return (v.u.i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        if (!is_int(v) || !is_int(x) || x.u.i == 0) {
            kj_fail(rs, at, "divisibleby needs integers and a non-zero divisor");
        }
        return x.u.i == -1 || v.u.i % x.u.i == 0;
    }
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) {
        return kj_equal(v, x);
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        return !kj_equal(v, x);
    }
    if (!strcmp(name, "sameas")) {
        return v.type == x.type && kj_equal(v, x);
    }
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) {
        return kj_compare(rs, at, v, x) < 0;
    }
    if (!strcmp(name, "le") || !strcmp(name, "<=")) {
        return kj_compare(rs, at, v, x) <= 0;
    }
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) {
        return kj_compare(rs, at, v, x) > 0;
    }
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) {
        return kj_compare(rs, at, v, x) >= 0;
    }
    if (!strcmp(name, "in")) {
        if (x.type == KG_JINJA_LIST) {
            for (size_t i = 0; i < x.u.l->n; i++) {
                if (kj_equal(x.u.l->v[i], v)) {
                    return true;
                }
            }
            return false;
        }
        if (x.type == KG_JINJA_DICT && v.type == KG_JINJA_STRING) {
            return kj_dict_get(x.u.d, v.u.s->s, v.u.s->len) != NULL;
        }
        if (x.type == KG_JINJA_STRING && v.type == KG_JINJA_STRING) {
            return v.u.s->len == 0 || strstr(x.u.s->s, v.u.s->s) != NULL;
        }
        return false;
    }
    if (!strcmp(name, "lower")) {
        return str_all(v, islower, isupper);
    }
    if (!strcmp(name, "upper")) {
        return str_all(v, isupper, islower);
    }
    if (!strcmp(name, "filter")) {
        bool known = false;
        return v.type == KG_JINJA_STRING && (lookup(v.u.s->s, KG_JINJA_STRING, &known), known);
    }
    if (!strcmp(name, "test")) {
        return v.type == KG_JINJA_STRING && kj_test_exists(v.u.s->s);
    }
    if (!strcmp(name, "escaped")) {
        return false;
    }
    kj_fail(rs, at, "unknown test '%s'", name);
}

bool kj_test_exists(const char *name) {
    static const char *const names[] = {
        "defined", "undefined", "none",        "string",  "number",      "integer",  "float",
        "boolean", "true",      "false",       "mapping", "iterable",    "sequence", "callable",
        "odd",     "even",      "divisibleby", "equalto", "eq",          "ne",       "sameas",
        "lt",      "lessthan",  "le",          "gt",      "greaterthan", "ge",       "in",
        "lower",   "upper",     "filter",      "test",    "escaped",     NULL};
    for (size_t i = 0; names[i]; i++) {
        if (!strcmp(names[i], name)) {
            return true;
        }
    }
    return false;
}

// ---- global functions ----

static kg_jinja_value_t g_range(kj_rs_t *rs, const kj_node_t *at, kj_args_t *a) {
    int64_t start = 0, stop, step = 1;
    for (size_t i = 0; i < a->n_pos; i++) {
        if (a->pos[i].type != KG_JINJA_INT) {
            kj_fail(rs, at, "range: arguments must be integers");
        }
    }
    if (a->n_pos == 1) {
        stop = a->pos[0].u.i;
    } else if (a->n_pos == 2 || a->n_pos == 3) {
        start = a->pos[0].u.i;
        stop = a->pos[1].u.i;
        step = a->n_pos == 3 ? a->pos[2].u.i : 1;
    } else {
        kj_fail(rs, at, "range: takes 1 to 3 arguments");
    }
    if (step == 0) {
        kj_fail(rs, at, "range: step must not be zero");
    }
    kg_jinja_value_t out = kj_list(rs);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        kj_step(rs, at, 1);
        kj_list_push(rs, out, kg_jinja_int(i));
        if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) {
            break;
        }
    }
    return out;
}

static kg_jinja_value_t g_dict(kj_rs_t *rs, const kj_node_t *at, kj_args_t *a) {
    kg_jinja_value_t d = kj_dict(rs);
    for (size_t i = 0; i < a->n_pos; i++) {
        if (a->pos[i].type != KG_JINJA_DICT) {
            kj_fail(rs, at, "dict/namespace: positional arguments must be dicts");
        }
        for (size_t k = 0; k < a->pos[i].u.d->n; k++) {
            kj_dict_set_key(rs, d, a->pos[i].u.d->kv[k], a->pos[i].u.d->v[k]);
        }
    }
    for (size_t i = 0; i < a->n_kw; i++) {
        kj_dict_set(rs, d, kj_str_new(rs, a->kw_names[i], strlen(a->kw_names[i])), a->kw[i]);
    }
    return d;
}

static kg_jinja_value_t g_namespace(kj_rs_t *rs, const kj_node_t *at, kj_args_t *a) {
    kg_jinja_value_t d = g_dict(rs, at, a);
    d.u.d->is_namespace = true;
    return d;
}

static kg_jinja_value_t g_raise(kj_rs_t *rs, const kj_node_t *at, kj_args_t *a) {
    kg_jinja_value_t m = kj_arg(a, 0, NULL);
    kg_jinja_value_t s = kj_to_string(rs, m);
    kj_fail(rs, at, "the template raised an exception: %.300s", s.u.s->s);
}

static kg_jinja_value_t g_strftime_now(kj_rs_t *rs, const kj_node_t *at, kj_args_t *a) {
    kg_jinja_value_t f = kj_arg(a, 0, NULL);
    if (f.type != KG_JINJA_STRING) {
        kj_fail(rs, at, "strftime_now: expected a format string");
    }
    time_t now = rs->ctx->now_s ? (time_t)rs->ctx->now_s : time(NULL);
    struct tm tm;
    char buf[256];
    if (!gmtime_r(&now, &tm) || strftime(buf, sizeof(buf), f.u.s->s, &tm) == 0) {
        kj_fail(rs, at, "strftime_now: failed to format the time");
    }
    return kj_cstr(rs, buf);
}

kg_jinja_value_t kj_global_fn(kj_rs_t *rs, const char *name) {
    static const struct {
        const char *name;
        kj_builtin_fn fn;
    } globals[] = {
        {"range", g_range},
        {"dict", g_dict},
        {"namespace", g_namespace},
        {"raise_exception", g_raise},
        {"strftime_now", g_strftime_now},
    };
    for (size_t i = 0; i < sizeof(globals) / sizeof(globals[0]); i++) {
        if (!strcmp(globals[i].name, name)) {
            kg_jinja_fn_t *fn = kj_alloc(rs->arena, sizeof(*fn));
            if (!fn) {
                kj_fail(rs, NULL, "the template used more than its memory limit");
            }
            fn->kind = KJ_FN_BUILTIN;
            fn->builtin = globals[i].fn;
            fn->name = globals[i].name;
            return (kg_jinja_value_t){.type = KG_JINJA_CALLABLE, .u.fn = fn};
        }
    }
    return UNDEF;
}
