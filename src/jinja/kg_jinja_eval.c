/* kg_jinja_eval: runs a compiled template: statements write to the output
 * buffer, expressions become values; scopes, loops, macros and calls; the
 * entry points kg_jinja_compile and kg_jinja_render with their limits.
 *
 * Scoping follows Jinja: a for loop's body and a macro's body get a scope of
 * their own (a `set` inside does not leak out, hence namespace()); if-bodies
 * share the enclosing scope; macros see the scope they were defined in. */
#include "kg_jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kg_jinja_value_t eval(kj_rs_t *rs, const kj_node_t *nd);
static void exec_body(kj_rs_t *rs, kj_scope_t *sc, kj_node_t **items, size_t n);

// ---- errors and limits ----

_Noreturn void kj_fail(kj_rs_t *rs, const kj_node_t *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (rs->err && rs->err_size) {
        if (at && at->line > 0) {
            snprintf(rs->err, rs->err_size, "%d:%d: %s", at->line, at->col, msg);
        } else {
            snprintf(rs->err, rs->err_size, "%s", msg);
        }
    }
    longjmp(rs->fail, 1);
}

void kj_step(kj_rs_t *rs, const kj_node_t *at, uint64_t n) {
    rs->steps += n;
    if (rs->ctx && rs->steps > rs->ctx->lim.max_steps) {
        kj_fail(rs, at, "the template ran more than %llu evaluation steps (a runaway loop?)",
                (unsigned long long)rs->ctx->lim.max_steps);
    }
}

static void emit(kj_rs_t *rs, const kj_node_t *at, const char *s, size_t len) {
    rs->total_out += len;
    if (rs->total_out > rs->ctx->lim.max_output_bytes) {
        kj_fail(rs, at, "the template wrote more than its output limit of %zu bytes",
                rs->ctx->lim.max_output_bytes);
    }
    kj_buf_put(rs, rs->out, s, len);
}

// ---- scopes ----

static kj_scope_t *scope_new(kj_rs_t *rs, kj_scope_t *parent) {
    kj_scope_t *sc = kj_alloc(rs->arena, sizeof(*sc));
    if (!sc) {
        kj_fail(rs, NULL, "the template used more than its memory limit");
    }
    sc->parent = parent;
    return sc;
}

static bool scope_put(kj_arena_t *a, kj_scope_t *sc, const char *name, kg_jinja_value_t v) {
    for (size_t i = 0; i < sc->n; i++) {
        if (!strcmp(sc->vars[i].name, name)) {
            sc->vars[i].v = v;
            return true;
        }
    }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 8;
        kj_var_t *nv = kj_alloc(a, cap * sizeof(*nv));
        if (!nv) {
            return false;
        }
        if (sc->n) {
            memcpy(nv, sc->vars, sc->n * sizeof(*nv));
        }
        sc->vars = nv;
        sc->cap = cap;
    }
    sc->vars[sc->n].name = name;
    sc->vars[sc->n++].v = v;
    return true;
}

static void scope_set(kj_rs_t *rs, kj_scope_t *sc, const char *name, kg_jinja_value_t v) {
    if (!scope_put(rs->arena, sc, name, v)) {
        kj_fail(rs, NULL, "the template used more than its memory limit");
    }
}

static kg_jinja_value_t *scope_find(kj_scope_t *sc, const char *name) {
    for (; sc; sc = sc->parent) {
        for (size_t i = 0; i < sc->n; i++) {
            if (!strcmp(sc->vars[i].name, name)) {
                return &sc->vars[i].v;
            }
        }
    }
    return NULL;
}

// ---- attributes, indexes, slices ----

kg_jinja_value_t
kj_getattr(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, const char *name) {
    (void)at;
    if (v.type == KG_JINJA_DICT) {
        kg_jinja_value_t *f = kj_dict_get(v.u.d, name, strlen(name));
        if (f) {
            return *f;
        }
    }
    return kj_method(rs, v, name);
}

static int64_t norm_index(int64_t i, size_t n) {
    return i < 0 ? i + (int64_t)n : i;
}

static kg_jinja_value_t
get_index(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, kg_jinja_value_t k) {
    if (v.type == KG_JINJA_DICT && k.type == KG_JINJA_STRING) {
        kg_jinja_value_t *f = kj_dict_get(v.u.d, k.u.s->s, k.u.s->len);
        return f ? *f : (kg_jinja_value_t){0};
    }
    if (v.type == KG_JINJA_DICT) {
        kg_jinja_value_t ks = kj_to_string(rs, k);
        kg_jinja_value_t *f = kj_dict_get(v.u.d, ks.u.s->s, ks.u.s->len);
        return f ? *f : (kg_jinja_value_t){0};
    }
    if ((v.type == KG_JINJA_LIST || v.type == KG_JINJA_STRING) &&
        (k.type == KG_JINJA_INT || k.type == KG_JINJA_BOOL)) {
        int64_t i = k.type == KG_JINJA_INT ? k.u.i : k.u.b;
        if (v.type == KG_JINJA_LIST) {
            i = norm_index(i, v.u.l->n);
            return i >= 0 && (size_t)i < v.u.l->n ? v.u.l->v[i] : (kg_jinja_value_t){0};
        }
        i = norm_index(i, v.u.s->len);
        return i >= 0 && (size_t)i < v.u.s->len ? kj_str(rs, v.u.s->s + i, 1)
                                                : (kg_jinja_value_t){0};
    }
    if (v.type == KG_JINJA_UNDEFINED || v.type == KG_JINJA_NONE) {
        return (kg_jinja_value_t){0};
    }
    if (k.type == KG_JINJA_STRING) {
        return kj_method(rs, v, k.u.s->s);
    }
    kj_fail(rs, at, "cannot index a %s with a %s", kj_type_name(v), kj_type_name(k));
}

static int64_t slice_bound(kj_rs_t *rs, const kj_node_t *nd, int64_t dflt) {
    if (!nd) {
        return dflt;
    }
    kg_jinja_value_t v = eval(rs, nd);
    if (v.type == KG_JINJA_NONE || v.type == KG_JINJA_UNDEFINED) {
        return dflt;
    }
    if (v.type != KG_JINJA_INT) {
        kj_fail(rs, nd, "slice bounds must be integers");
    }
    return v.u.i;
}

static kg_jinja_value_t eval_slice(kj_rs_t *rs, const kj_node_t *nd) {
    kg_jinja_value_t v = eval(rs, nd->a);
    if (v.type != KG_JINJA_LIST && v.type != KG_JINJA_STRING) {
        if (v.type == KG_JINJA_UNDEFINED || v.type == KG_JINJA_NONE) {
            return (kg_jinja_value_t){0};
        }
        kj_fail(rs, nd, "cannot slice a %s", kj_type_name(v));
    }
    int64_t n = v.type == KG_JINJA_LIST ? (int64_t)v.u.l->n : (int64_t)v.u.s->len;
    int64_t step = slice_bound(rs, nd->items[2], 1);
    if (step == 0) {
        kj_fail(rs, nd, "slice step cannot be zero");
    }
    int64_t lo = step > 0 ? 0 : n - 1, hi = step > 0 ? n : -1;
    int64_t start = slice_bound(rs, nd->items[0], lo), stop = slice_bound(rs, nd->items[1], hi);
    if (nd->items[0]) {
        start = start < 0 ? start + n : start;
        start = step > 0 ? (start < 0   ? 0
                            : start > n ? n
                                        : start)
                         : (start < -1      ? -1
                            : start > n - 1 ? n - 1
                                            : start);
    }
    if (nd->items[1] && stop != hi) {
        stop = stop < 0 ? stop + n : stop;
        stop = step > 0 ? (stop < 0   ? 0
                           : stop > n ? n
                                      : stop)
                        : (stop < -1      ? -1
                           : stop > n - 1 ? n - 1
                                          : stop);
    }
    if (v.type == KG_JINJA_LIST) {
        kg_jinja_value_t out = kj_list(rs);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            kj_step(rs, nd, 1);
            kj_list_push(rs, out, v.u.l->v[i]);
        }
        return out;
    }
    kj_buf_t b = {0};
    kj_buf_put(rs, &b, "", 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        kj_step(rs, nd, 1);
        kj_buf_put(rs, &b, v.u.s->s + i, 1);
    }
    return kj_buf_value(rs, &b);
}

// ---- operators ----

static bool is_number(kg_jinja_value_t v) {
    return v.type == KG_JINJA_INT || v.type == KG_JINJA_FLOAT || v.type == KG_JINJA_BOOL;
}

static double as_f(kg_jinja_value_t v) {
    return v.type == KG_JINJA_FLOAT ? v.u.f : v.type == KG_JINJA_INT ? (double)v.u.i : v.u.b;
}

static int64_t as_i(kg_jinja_value_t v) {
    return v.type == KG_JINJA_INT ? v.u.i : v.type == KG_JINJA_BOOL ? v.u.b : 0;
}

static bool contains(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t hay, kg_jinja_value_t x) {
    switch (hay.type) {
    case KG_JINJA_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++) {
            kj_step(rs, at, 1);
            if (kj_equal(hay.u.l->v[i], x)) {
                return true;
            }
        }
        return false;
    case KG_JINJA_DICT:
        return x.type == KG_JINJA_STRING && kj_dict_get(hay.u.d, x.u.s->s, x.u.s->len);
    case KG_JINJA_STRING:
        if (x.type != KG_JINJA_STRING) {
            kj_fail(rs, at, "'in <string>' needs a string on the left");
        }
        if (x.u.s->len == 0) {
            return true;
        }
        for (size_t i = 0; i + x.u.s->len <= hay.u.s->len; i++) {
            if (!memcmp(hay.u.s->s + i, x.u.s->s, x.u.s->len)) {
                return true;
            }
        }
        return false;
    case KG_JINJA_UNDEFINED:
    case KG_JINJA_NONE:
        return false;
    default:
        kj_fail(rs, at, "'in' needs a list, dict or string, not %s", kj_type_name(hay));
    }
}

static kg_jinja_value_t
arith(kj_rs_t *rs, const kj_node_t *nd, int op, kg_jinja_value_t a, kg_jinja_value_t b) {
    if (op == '+' && a.type == KG_JINJA_STRING && b.type == KG_JINJA_STRING) {
        kj_buf_t buf = {0};
        kj_buf_put(rs, &buf, a.u.s->s, a.u.s->len);
        kj_buf_put(rs, &buf, b.u.s->s, b.u.s->len);
        return kj_buf_value(rs, &buf);
    }
    if (op == '+' && a.type == KG_JINJA_LIST && b.type == KG_JINJA_LIST) {
        kg_jinja_value_t out = kj_list(rs);
        kj_step(rs, nd, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) {
            kj_list_push(rs, out, a.u.l->v[i]);
        }
        for (size_t i = 0; i < b.u.l->n; i++) {
            kj_list_push(rs, out, b.u.l->v[i]);
        }
        return out;
    }
    if (op == '*' && a.type == KG_JINJA_STRING && b.type == KG_JINJA_INT) {
        kj_buf_t buf = {0};
        kj_buf_put(rs, &buf, "", 0);
        for (int64_t i = 0; i < b.u.i; i++) {
            kj_step(rs, nd, 1);
            emit(rs, nd, "", 0);
            if (buf.len + a.u.s->len > rs->ctx->lim.max_output_bytes) {
                kj_fail(rs, nd, "string repetition past the output limit");
            }
            kj_buf_put(rs, &buf, a.u.s->s, a.u.s->len);
        }
        return kj_buf_value(rs, &buf);
    }
    if (op == '%' && a.type == KG_JINJA_STRING) {
        return kj_percent_format(rs, nd, a, b);
    }
    if (op == '+' && (a.type == KG_JINJA_STRING || b.type == KG_JINJA_STRING) &&
        (a.type != KG_JINJA_UNDEFINED && b.type != KG_JINJA_UNDEFINED)) {
        kj_fail(rs, nd, "cannot add %s and %s", kj_type_name(a), kj_type_name(b));
    }
    if (a.type == KG_JINJA_UNDEFINED && b.type == KG_JINJA_STRING && op == '+') {
        return b;
    }
    if (b.type == KG_JINJA_UNDEFINED && a.type == KG_JINJA_STRING && op == '+') {
        return a;
    }
    if (!is_number(a) || !is_number(b)) {
        kj_fail(rs, nd, "unsupported operand types for arithmetic: %s and %s", kj_type_name(a),
                kj_type_name(b));
    }
    bool ints = a.type != KG_JINJA_FLOAT && b.type != KG_JINJA_FLOAT;
    int64_t x = as_i(a), y = as_i(b);
    switch (op) {
    case '+':
        return ints ? kg_jinja_int((int64_t)((uint64_t)x + (uint64_t)y))
                    : kg_jinja_float(as_f(a) + as_f(b));
    case '-':
        return ints ? kg_jinja_int((int64_t)((uint64_t)x - (uint64_t)y))
                    : kg_jinja_float(as_f(a) - as_f(b));
    case '*':
        return ints ? kg_jinja_int((int64_t)((uint64_t)x * (uint64_t)y))
                    : kg_jinja_float(as_f(a) * as_f(b));
    case '/':
        if (as_f(b) == 0.0) {
            kj_fail(rs, nd, "division by zero");
        }
        return kg_jinja_float(as_f(a) / as_f(b));
    case KJ_OP_FLOORDIV:
    case '%':
        if (as_f(b) == 0.0) {
            kj_fail(rs, nd, "division by zero");
        }
        if (ints) {
            if (y == -1) {
                return kg_jinja_int(op == '%' ? 0 : (int64_t)(0 - (uint64_t)x));
            }
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                q--;
                r += y;
            }
            return kg_jinja_int(op == '%' ? r : q);
        } else {
            double fa = as_f(a), fb = as_f(b);
            double q = fa / fb;
            double fq = (double)(int64_t)q;
            if (fq > q) {
                fq -= 1.0;
            }
            return kg_jinja_float(op == '%' ? fa - fq * fb : fq);
        }
    case KJ_OP_POW: {
        if (ints && y >= 0) {
            int64_t r = 1;
            for (int64_t i = 0; i < y && i < 64; i++) {
                r = (int64_t)((uint64_t)r * (uint64_t)x);
            }
            return kg_jinja_int(r);
        }
        double r = 1.0, base = as_f(a);
        int64_t e = (int64_t)as_f(b);
        for (int64_t i = 0; i < (e < 0 ? -e : e) && i < 2048; i++) {
            r *= base;
        }
        return kg_jinja_float(e < 0 ? 1.0 / r : r);
    }
    default:
        kj_fail(rs, nd, "unknown operator");
    }
}

static kg_jinja_value_t eval_binary(kj_rs_t *rs, const kj_node_t *nd) {
    kg_jinja_value_t a = eval(rs, nd->a), b = eval(rs, nd->b);
    switch (nd->op) {
    case '~': {
        kj_buf_t buf = {0};
        kj_buf_put(rs, &buf, "", 0);
        kj_buf_put_value(rs, &buf, a);
        kj_buf_put_value(rs, &buf, b);
        return kj_buf_value(rs, &buf);
    }
    case KJ_OP_EQ:
        return kg_jinja_bool(kj_equal(a, b));
    case KJ_OP_NE:
        return kg_jinja_bool(!kj_equal(a, b));
    case '<':
        return kg_jinja_bool(kj_compare(rs, nd, a, b) < 0);
    case '>':
        return kg_jinja_bool(kj_compare(rs, nd, a, b) > 0);
    case KJ_OP_LE:
        return kg_jinja_bool(kj_compare(rs, nd, a, b) <= 0);
    case KJ_OP_GE:
        return kg_jinja_bool(kj_compare(rs, nd, a, b) >= 0);
    case KJ_OP_IN:
        return kg_jinja_bool(contains(rs, nd, b, a));
    case KJ_OP_NOTIN:
        return kg_jinja_bool(!contains(rs, nd, b, a));
    default:
        return arith(rs, nd, nd->op, a, b);
    }
}

// ---- calls ----

static void eval_args(kj_rs_t *rs, const kj_node_t *nd, kj_args_t *args, size_t extra_front) {
    args->n_pos = nd->n_items + extra_front;
    args->pos = kj_alloc(rs->arena, (args->n_pos + 1) * sizeof(kg_jinja_value_t));
    args->n_kw = nd->n_names;
    args->kw = kj_alloc(rs->arena, (args->n_kw + 1) * sizeof(kg_jinja_value_t));
    if (!args->pos || !args->kw) {
        kj_fail(rs, nd, "the template used more than its memory limit");
    }
    args->kw_names = nd->names;
    for (size_t i = 0; i < nd->n_items; i++) {
        args->pos[extra_front + i] = eval(rs, nd->items[i]);
    }
    for (size_t i = 0; i < nd->n_names; i++) {
        args->kw[i] = eval(rs, nd->items2[i]);
    }
}

static kg_jinja_value_t call_macro(
    kj_rs_t *rs, const kj_node_t *at, kg_jinja_fn_t *fn, kj_args_t *args, kg_jinja_value_t caller) {
    const kj_node_t *m = fn->macro;
    if (++rs->depth > rs->ctx->lim.max_depth) {
        kj_fail(rs, at, "macro calls nested deeper than %d (runaway recursion?)",
                rs->ctx->lim.max_depth);
    }
    kj_scope_t *sc = scope_new(rs, fn->closure);
    kj_scope_t *saved_scope = rs->scope;
    rs->scope = sc;
    kg_jinja_value_t kwargs = kj_dict(rs), varargs = kj_list(rs);
    for (size_t i = 0; i < m->n_names; i++) {
        kg_jinja_value_t v = {0};
        bool have = false;
        if (i < args->n_pos) {
            v = args->pos[i];
            have = true;
        }
        for (size_t k = 0; k < args->n_kw; k++) {
            if (!strcmp(args->kw_names[k], m->names[i])) {
                v = args->kw[k];
                have = true;
            }
        }
        if (!have && m->items2[i]) {
            v = eval(rs, m->items2[i]);
        }
        scope_set(rs, sc, m->names[i], v);
    }
    for (size_t i = m->n_names; i < args->n_pos; i++) {
        kj_list_push(rs, varargs, args->pos[i]);
    }
    for (size_t k = 0; k < args->n_kw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->n_names; i++) {
            known |= !strcmp(args->kw_names[k], m->names[i]);
        }
        if (!known) {
            kj_dict_set(rs, kwargs, kj_str_new(rs, args->kw_names[k], strlen(args->kw_names[k])),
                        args->kw[k]);
        }
    }
    scope_set(rs, sc, "varargs", varargs);
    scope_set(rs, sc, "kwargs", kwargs);
    if (caller.type != KG_JINJA_UNDEFINED) {
        scope_set(rs, sc, "caller", caller);
    } else if (fn->caller.type != KG_JINJA_UNDEFINED) {
        scope_set(rs, sc, "caller", fn->caller);
    }
    kj_buf_t buf = {0}, *saved_out = rs->out;
    kj_buf_put(rs, &buf, "", 0);
    rs->out = &buf;
    int saved_ctl = rs->loop_ctl;
    exec_body(rs, sc, m->items, m->n_items);
    rs->loop_ctl = saved_ctl;
    rs->out = saved_out;
    rs->scope = saved_scope;
    rs->depth--;
    return kj_buf_value(rs, &buf);
}

kg_jinja_value_t kj_call(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t fn, kj_args_t *args) {
    kj_step(rs, at, 1);
    if (fn.type != KG_JINJA_CALLABLE) {
        kj_fail(rs, at, "%s is not callable",
                fn.type == KG_JINJA_UNDEFINED ? "an undefined value" : kj_type_name(fn));
    }
    switch (fn.u.fn->kind) {
    case KJ_FN_MACRO:
        return call_macro(rs, at, fn.u.fn, args, (kg_jinja_value_t){0});
    case KJ_FN_BUILTIN:
        return fn.u.fn->builtin(rs, at, args);
    default:
        return kj_call_method(rs, at, fn.u.fn, args);
    }
}

static kg_jinja_value_t apply_filters(kj_rs_t *rs, const kj_node_t *f, kg_jinja_value_t input) {
    kg_jinja_value_t v = f->a ? apply_filters(rs, f->a, input) : input;
    kj_args_t args = {0};
    eval_args(rs, f, &args, 0);
    return kj_filter(rs, f, f->name, v, &args);
}

// ---- expressions ----

static kg_jinja_value_t eval(kj_rs_t *rs, const kj_node_t *nd) {
    kj_step(rs, nd, 1);
    switch (nd->kind) {
    case KJ_E_LIT:
        return nd->lit;
    case KJ_E_NAME: {
        kg_jinja_value_t *v = scope_find(rs->scope, nd->name);
        return v ? *v : kj_global_fn(rs, nd->name);
    }
    case KJ_E_ATTR:
        return kj_getattr(rs, nd, eval(rs, nd->a), nd->name);
    case KJ_E_INDEX: {
        kg_jinja_value_t v = eval(rs, nd->a);
        return get_index(rs, nd, v, eval(rs, nd->b));
    }
    case KJ_E_SLICE:
        return eval_slice(rs, nd);
    case KJ_E_CALL: {
        kg_jinja_value_t fn = eval(rs, nd->a);
        kj_args_t args = {0};
        eval_args(rs, nd, &args, 0);
        return kj_call(rs, nd, fn, &args);
    }
    case KJ_E_FILTER: {
        kg_jinja_value_t v = eval(rs, nd->a);
        kj_args_t args = {0};
        eval_args(rs, nd, &args, 0);
        return kj_filter(rs, nd, nd->name, v, &args);
    }
    case KJ_E_TEST: {
        kg_jinja_value_t v;
        if (nd->a->kind == KJ_E_NAME && !scope_find(rs->scope, nd->a->name)) {
            v = kj_global_fn(rs, nd->a->name);
        } else {
            v = eval(rs, nd->a);
        }
        kj_args_t args = {0};
        eval_args(rs, nd, &args, 0);
        bool r = kj_test(rs, nd, nd->name, v, &args);
        return kg_jinja_bool(nd->op ? !r : r);
    }
    case KJ_E_UNARY: {
        kg_jinja_value_t v = eval(rs, nd->a);
        if (nd->op == '!') {
            return kg_jinja_bool(!kj_truthy(v));
        }
        if (v.type == KG_JINJA_INT || v.type == KG_JINJA_BOOL) {
            int64_t i = as_i(v);
            return kg_jinja_int(nd->op == '-' ? (int64_t)(0 - (uint64_t)i) : i);
        }
        if (v.type == KG_JINJA_FLOAT) {
            return kg_jinja_float(nd->op == '-' ? -v.u.f : v.u.f);
        }
        kj_fail(rs, nd, "bad operand type for unary %c: %s", nd->op, kj_type_name(v));
    }
    case KJ_E_BINARY:
        return eval_binary(rs, nd);
    case KJ_E_AND: {
        kg_jinja_value_t a = eval(rs, nd->a);
        return kj_truthy(a) ? eval(rs, nd->b) : a;
    }
    case KJ_E_OR: {
        kg_jinja_value_t a = eval(rs, nd->a);
        return kj_truthy(a) ? a : eval(rs, nd->b);
    }
    case KJ_E_COND:
        if (kj_truthy(eval(rs, nd->a))) {
            return eval(rs, nd->b);
        }
        return nd->c ? eval(rs, nd->c) : (kg_jinja_value_t){0};
    case KJ_E_LIST:
    case KJ_E_TUPLE: {
        kg_jinja_value_t l = kj_list(rs);
        for (size_t i = 0; i < nd->n_items; i++) {
            kj_list_push(rs, l, eval(rs, nd->items[i]));
        }
        return l;
    }
    case KJ_E_DICT: {
        kg_jinja_value_t d = kj_dict(rs);
        for (size_t i = 0; i < nd->n_items; i++) {
            kg_jinja_value_t k = eval(rs, nd->items[i]);
            kj_dict_set_key(rs, d, k, eval(rs, nd->items2[i]));
        }
        return d;
    }
    default:
        kj_fail(rs, nd, "not an expression");
    }
}

// ---- statements ----

static void assign(kj_rs_t *rs, const kj_node_t *target, kg_jinja_value_t v) {
    if (target->kind == KJ_E_NAME) {
        scope_set(rs, rs->scope, target->name, v);
        return;
    }
    if (target->kind == KJ_E_ATTR) {
        kg_jinja_value_t obj = eval(rs, target->a);
        if (obj.type != KG_JINJA_DICT) {
            kj_fail(rs, target, "cannot set an attribute of a %s", kj_type_name(obj));
        }
        kj_dict_set(rs, obj, kj_str_new(rs, target->name, strlen(target->name)), v);
        return;
    }
    if (target->kind == KJ_E_INDEX) {
        kg_jinja_value_t obj = eval(rs, target->a), k = eval(rs, target->b);
        if (obj.type == KG_JINJA_DICT) {
            kj_dict_set(rs, obj, kj_to_string(rs, k).u.s, v);
            return;
        }
        kj_fail(rs, target, "cannot assign to an item of a %s", kj_type_name(obj));
    }
    if (target->kind == KJ_E_TUPLE) {
        if (v.type != KG_JINJA_LIST || v.u.l->n != target->n_items) {
            kj_fail(rs, target, "cannot unpack %s into %zu names", kj_type_name(v),
                    target->n_items);
        }
        for (size_t i = 0; i < target->n_items; i++) {
            assign(rs, target->items[i], v.u.l->v[i]);
        }
        return;
    }
    kj_fail(rs, target, "cannot assign to this expression");
}

/* What a for loop walks: a list's items, a dict's keys, a string's characters. */
static kg_jinja_value_t iterable(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v) {
    if (v.type == KG_JINJA_LIST) {
        return v;
    }
    kg_jinja_value_t l = kj_list(rs);
    if (v.type == KG_JINJA_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) {
            kj_list_push(rs, l, v.u.d->kv[i]);
        }
    } else if (v.type == KG_JINJA_STRING) {
        for (size_t i = 0; i < v.u.s->len;) {
            size_t n = 1;
            unsigned char c = (unsigned char)v.u.s->s[i];
            n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            n = i + n > v.u.s->len ? v.u.s->len - i : n;
            kj_list_push(rs, l, kj_str(rs, v.u.s->s + i, n));
            i += n;
        }
    } else if (v.type != KG_JINJA_UNDEFINED && v.type != KG_JINJA_NONE) {
        kj_fail(rs, at, "cannot loop over a %s", kj_type_name(v));
    }
    return l;
}

static void bind_targets(kj_rs_t *rs, const kj_node_t *nd, kj_scope_t *sc, kg_jinja_value_t item) {
    if (nd->n_names == 1) {
        scope_set(rs, sc, nd->names[0], item);
        return;
    }
    if (item.type != KG_JINJA_LIST || item.u.l->n != nd->n_names) {
        kj_fail(rs, nd, "cannot unpack %s into %zu loop variables", kj_type_name(item),
                nd->n_names);
    }
    for (size_t i = 0; i < nd->n_names; i++) {
        scope_set(rs, sc, nd->names[i], item.u.l->v[i]);
    }
}

static kg_jinja_value_t loop_cycle(kj_rs_t *rs, const kj_node_t *at, kj_args_t *args) {
    (void)at;
    kg_jinja_value_t *loop = scope_find(rs->scope, "loop");
    if (!loop || loop->type != KG_JINJA_DICT || args->n_pos == 0) {
        return (kg_jinja_value_t){0};
    }
    kg_jinja_value_t *i0 = kj_dict_get(loop->u.d, "index0", 6);
    int64_t i = i0 && i0->type == KG_JINJA_INT ? i0->u.i : 0;
    return args->pos[(size_t)i % args->n_pos];
}

static void exec_for(kj_rs_t *rs, const kj_node_t *nd) {
    kg_jinja_value_t seq = iterable(rs, nd, eval(rs, nd->a));
    kj_scope_t *sc = scope_new(rs, rs->scope);
    kj_scope_t *saved = rs->scope;
    rs->scope = sc;
    if (nd->b) { /* the loop's `if` filters before loop.length is known */
        kg_jinja_value_t kept = kj_list(rs);
        for (size_t i = 0; i < seq.u.l->n; i++) {
            kj_step(rs, nd, 1);
            bind_targets(rs, nd, sc, seq.u.l->v[i]);
            if (kj_truthy(eval(rs, nd->b))) {
                kj_list_push(rs, kept, seq.u.l->v[i]);
            }
        }
        seq = kept;
    }
    size_t n = seq.u.l->n;
    kg_jinja_fn_t *cyc = kj_alloc(rs->arena, sizeof(*cyc));
    if (!cyc) {
        kj_fail(rs, nd, "the template used more than its memory limit");
    }
    cyc->kind = KJ_FN_BUILTIN;
    cyc->builtin = loop_cycle;
    cyc->name = "cycle";
    /* one loop object and one scope, updated in place each iteration: a long
     * loop must not cost memory per iteration */
    static const char *const keys[] = {"index",    "index0", "revindex", "revindex0",
                                       "first",    "last",   "length",   "previtem",
                                       "nextitem", "depth",  "depth0",   "cycle"};
    kg_jinja_value_t loop = kj_dict(rs);
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        kj_dict_set(rs, loop, kj_str_new(rs, keys[k], strlen(keys[k])), (kg_jinja_value_t){0});
    }
    kj_scope_t *it = scope_new(rs, saved);
    for (size_t i = 0; i < n; i++) {
        kj_step(rs, nd, 1);
        it->n = 0;
        rs->scope = it;
        kg_jinja_value_t *f = loop.u.d->v;
        f[0] = kg_jinja_int((int64_t)i + 1);
        f[1] = kg_jinja_int((int64_t)i);
        f[2] = kg_jinja_int((int64_t)(n - i));
        f[3] = kg_jinja_int((int64_t)(n - i - 1));
        f[4] = kg_jinja_bool(i == 0);
        f[5] = kg_jinja_bool(i + 1 == n);
        f[6] = kg_jinja_int((int64_t)n);
        f[7] = i > 0 ? seq.u.l->v[i - 1] : (kg_jinja_value_t){0};
        f[8] = i + 1 < n ? seq.u.l->v[i + 1] : (kg_jinja_value_t){0};
        f[9] = kg_jinja_int(1);
        f[10] = kg_jinja_int(0);
        f[11] = (kg_jinja_value_t){.type = KG_JINJA_CALLABLE, .u.fn = cyc};
        scope_set(rs, it, "loop", loop);
        bind_targets(rs, nd, it, seq.u.l->v[i]);
        exec_body(rs, it, nd->items, nd->n_items);
        int ctl = rs->loop_ctl;
        rs->loop_ctl = 0;
        if (ctl == 1) {
            break;
        }
    }
    rs->scope = saved;
    if (n == 0 && nd->n_items2) {
        exec_body(rs, rs->scope, nd->items2, nd->n_items2);
    }
}

static void exec_stmt(kj_rs_t *rs, const kj_node_t *nd) {
    kj_step(rs, nd, 1);
    switch (nd->kind) {
    case KJ_S_TEXT:
        emit(rs, nd, nd->lit.u.s->s, nd->lit.u.s->len);
        return;
    case KJ_S_OUTPUT: {
        kg_jinja_value_t v = kj_to_string(rs, eval(rs, nd->a));
        emit(rs, nd, v.u.s->s, v.u.s->len);
        return;
    }
    case KJ_S_IF:
        if (kj_truthy(eval(rs, nd->a))) {
            exec_body(rs, rs->scope, nd->items, nd->n_items);
        } else {
            exec_body(rs, rs->scope, nd->items2, nd->n_items2);
        }
        return;
    case KJ_S_FOR:
        exec_for(rs, nd);
        return;
    case KJ_S_SET:
        assign(rs, nd->a, eval(rs, nd->b));
        return;
    case KJ_S_SET_BLOCK:
    case KJ_S_FILTER: {
        kj_buf_t buf = {0}, *saved = rs->out;
        kj_buf_put(rs, &buf, "", 0);
        rs->out = &buf;
        exec_body(rs, rs->scope, nd->items, nd->n_items);
        rs->out = saved;
        kg_jinja_value_t v = kj_buf_value(rs, &buf);
        if (nd->c) {
            v = apply_filters(rs, nd->c, v);
        }
        if (nd->kind == KJ_S_SET_BLOCK) {
            scope_set(rs, rs->scope, nd->name, v);
        } else {
            kj_buf_t tmp = {0};
            kj_buf_put_value(rs, &tmp, v);
            emit(rs, nd, tmp.p ? tmp.p : "", tmp.len);
        }
        return;
    }
    case KJ_S_MACRO: {
        kg_jinja_fn_t *fn = kj_alloc(rs->arena, sizeof(*fn));
        if (!fn) {
            kj_fail(rs, nd, "the template used more than its memory limit");
        }
        fn->kind = KJ_FN_MACRO;
        fn->macro = nd;
        fn->closure = rs->scope;
        fn->name = nd->name;
        scope_set(rs, rs->scope, nd->name,
                  (kg_jinja_value_t){.type = KG_JINJA_CALLABLE, .u.fn = fn});
        return;
    }
    case KJ_S_CALL: {
        kg_jinja_fn_t *caller = kj_alloc(rs->arena, sizeof(*caller));
        if (!caller) {
            kj_fail(rs, nd, "the template used more than its memory limit");
        }
        caller->kind = KJ_FN_MACRO;
        caller->macro = nd;
        caller->closure = rs->scope;
        caller->name = "caller";
        kg_jinja_value_t fn = eval(rs, nd->a->a);
        kj_args_t args = {0};
        eval_args(rs, nd->a, &args, 0);
        if (fn.type != KG_JINJA_CALLABLE || fn.u.fn->kind != KJ_FN_MACRO) {
            kj_fail(rs, nd, "call blocks need a macro");
        }
        kg_jinja_value_t v = call_macro(
            rs, nd, fn.u.fn, &args, (kg_jinja_value_t){.type = KG_JINJA_CALLABLE, .u.fn = caller});
        emit(rs, nd, v.u.s->s, v.u.s->len);
        return;
    }
    case KJ_S_BODY:
        exec_body(rs, rs->scope, nd->items, nd->n_items);
        return;
    case KJ_S_BREAK:
        rs->loop_ctl = 1;
        return;
    case KJ_S_CONTINUE:
        rs->loop_ctl = 2;
        return;
    default:
        kj_fail(rs, nd, "not a statement");
    }
}

static void exec_body(kj_rs_t *rs, kj_scope_t *sc, kj_node_t **items, size_t n) {
    kj_scope_t *saved = rs->scope;
    rs->scope = sc;
    for (size_t i = 0; i < n && !rs->loop_ctl; i++) {
        exec_stmt(rs, items[i]);
    }
    rs->scope = saved;
}

void kj_exec(kj_rs_t *rs, const kj_node_t *root, kj_scope_t *scope) {
    exec_body(rs, scope, root->items, root->n_items);
}

kj_scope_t *kj_scope_new(kj_rs_t *rs, kj_scope_t *parent) {
    return scope_new(rs, parent);
}

bool kj_scope_put(kj_arena_t *a, kj_scope_t *sc, const char *name, kg_jinja_value_t v) {
    return scope_put(a, sc, name, v);
}
