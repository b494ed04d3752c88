/* kg_jinja_parser: tokens into the syntax tree (kj_node_t), by recursive
 * descent with Jinja2's precedence, lowest first: `x if c else y`, or, and,
 * not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then a primary
 * with its postfixes (.attr, [i], [a:b:c], (args), |filter, is test). */
#include "kg_jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    kj_rs_t *rs;
    kj_arena_t *arena;
    kj_tok_t *tok;
    size_t n, i;
    int depth;
} parser_t;

static kj_node_t *parse_expr(parser_t *ps);
static kj_node_t *parse_body(parser_t *ps, const char *const *ends, const char **which);

// ---- helpers ----

static const kj_tok_t *peek(const parser_t *ps) {
    return &ps->tok[ps->i];
}

static const kj_tok_t *peek_at(const parser_t *ps, size_t k) {
    size_t j = ps->i + k;
    return &ps->tok[j < ps->n ? j : ps->n - 1];
}

_Noreturn static void syntax(parser_t *ps, const char *what) {
    const kj_tok_t *t = peek(ps);
    kj_node_t at = {.line = t->line, .col = t->col};
    if (t->kind == KJ_T_EOF) {
        kj_fail(ps->rs, &at, "syntax error: %s, found the end of the template", what);
    }
    kj_fail(ps->rs, &at, "syntax error: %s, found '%.40s'", what, t->text);
}

static void *alloc(parser_t *ps, size_t size) {
    void *p = kj_alloc(ps->arena, size);
    if (!p) {
        kj_fail(ps->rs, NULL, "template too large");
    }
    return p;
}

static kj_node_t *node(parser_t *ps, kj_kind_t kind, const kj_tok_t *t) {
    kj_node_t *nd = alloc(ps, sizeof(*nd));
    nd->kind = kind;
    nd->line = t->line;
    nd->col = t->col;
    return nd;
}

static bool is_op(const kj_tok_t *t, const char *op) {
    return t->kind == KJ_T_OP && strcmp(t->text, op) == 0;
}

static bool is_name(const kj_tok_t *t, const char *name) {
    return t->kind == KJ_T_NAME && strcmp(t->text, name) == 0;
}

static bool accept_op(parser_t *ps, const char *op) {
    if (is_op(peek(ps), op)) {
        ps->i++;
        return true;
    }
    return false;
}

static bool accept_name(parser_t *ps, const char *name) {
    if (is_name(peek(ps), name)) {
        ps->i++;
        return true;
    }
    return false;
}

static void expect_op(parser_t *ps, const char *op) {
    if (!accept_op(ps, op)) {
        char what[32];
        snprintf(what, sizeof(what), "expected '%s'", op);
        syntax(ps, what);
    }
}

static const char *expect_name(parser_t *ps) {
    const kj_tok_t *t = peek(ps);
    if (t->kind != KJ_T_NAME) {
        syntax(ps, "expected a name");
    }
    ps->i++;
    return t->text;
}

static void expect_close(parser_t *ps) {
    if (peek(ps)->kind != KJ_T_CLOSE_STMT) {
        syntax(ps, "expected %}");
    }
    ps->i++;
}

/* A growing array of node pointers in the arena. */
typedef struct nodes {
    kj_node_t **v;
    size_t n, cap;
} nodes_t;

static void push(parser_t *ps, nodes_t *a, kj_node_t *nd) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        kj_node_t **v = alloc(ps, cap * sizeof(kj_node_t *));
        if (a->n) {
            memcpy(v, a->v, a->n * sizeof(kj_node_t *));
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = nd;
}

static kg_jinja_value_t lit_str(parser_t *ps, const char *s, size_t len) {
    kg_jinja_str_t *str = alloc(ps, sizeof(*str) + len + 1);
    memcpy(str->s, s, len);
    str->len = len;
    return (kg_jinja_value_t){.type = KG_JINJA_STRING, .u.s = str};
}

// ---- expressions ----

/* Call arguments after '(' up to ')': positional into items, keywords into
 * names/items2. */
static void parse_args(parser_t *ps, kj_node_t *call) {
    nodes_t pos = {0}, kw = {0};
    nodes_t kwn = {0}; /* names as nodes' name */
    while (!accept_op(ps, ")")) {
        if (peek(ps)->kind == KJ_T_NAME && is_op(peek_at(ps, 1), "=")) {
            kj_node_t *nm = node(ps, KJ_E_NAME, peek(ps));
            nm->name = peek(ps)->text;
            ps->i += 2;
            push(ps, &kwn, nm);
            push(ps, &kw, parse_expr(ps));
        } else {
            if (accept_op(ps, "*")) {
                syntax(ps, "*args are not supported");
            }
            push(ps, &pos, parse_expr(ps));
        }
        if (!is_op(peek(ps), ")")) {
            expect_op(ps, ",");
        }
    }
    call->items = pos.v;
    call->n_items = pos.n;
    call->items2 = kw.v;
    call->n_items2 = kw.n;
    call->names = kwn.n ? alloc(ps, kwn.n * sizeof(char *)) : NULL;
    call->n_names = kwn.n;
    for (size_t i = 0; i < kwn.n; i++) {
        call->names[i] = kwn.v[i]->name;
    }
}

static kj_node_t *parse_primary(parser_t *ps) {
    const kj_tok_t *t = peek(ps);
    kj_node_t *nd;
    switch (t->kind) {
    case KJ_T_STRING: {
        /* adjacent literals concatenate, as in Python */
        size_t len = 0, k = 0;
        while (peek_at(ps, k)->kind == KJ_T_STRING) {
            len += peek_at(ps, k)->len;
            k++;
        }
        char *s = alloc(ps, len + 1);
        size_t off = 0;
        for (size_t j = 0; j < k; j++) {
            memcpy(s + off, peek_at(ps, j)->text, peek_at(ps, j)->len);
            off += peek_at(ps, j)->len;
        }
        nd = node(ps, KJ_E_LIT, t);
        nd->lit = lit_str(ps, s, len);
        ps->i += k;
        return nd;
    }
    case KJ_T_INT:
        nd = node(ps, KJ_E_LIT, t);
        nd->lit = kg_jinja_int(strtoll(t->text, NULL, 10));
        ps->i++;
        return nd;
    case KJ_T_FLOAT:
        nd = node(ps, KJ_E_LIT, t);
        nd->lit = kg_jinja_float(strtod(t->text, NULL));
        ps->i++;
        return nd;
    case KJ_T_NAME:
        ps->i++;
        nd = node(ps, KJ_E_LIT, t);
        if (!strcmp(t->text, "true") || !strcmp(t->text, "True")) {
            nd->lit = kg_jinja_bool(true);
        } else if (!strcmp(t->text, "false") || !strcmp(t->text, "False")) {
            nd->lit = kg_jinja_bool(false);
        } else if (!strcmp(t->text, "none") || !strcmp(t->text, "None")) {
            nd->lit = kg_jinja_none();
        } else {
            nd->kind = KJ_E_NAME;
            nd->name = t->text;
        }
        return nd;
    case KJ_T_OP:
        break;
    default:
        syntax(ps, "expected an expression");
    }
    if (accept_op(ps, "(")) {
        kj_node_t *first = parse_expr(ps);
        if (accept_op(ps, ")")) {
            return first;
        }
        nodes_t items = {0};
        push(ps, &items, first);
        while (accept_op(ps, ",")) {
            if (is_op(peek(ps), ")")) {
                break;
            }
            push(ps, &items, parse_expr(ps));
        }
        expect_op(ps, ")");
        nd = node(ps, KJ_E_TUPLE, t);
        nd->items = items.v;
        nd->n_items = items.n;
        return nd;
    }
    if (accept_op(ps, "[")) {
        nodes_t items = {0};
        while (!accept_op(ps, "]")) {
            push(ps, &items, parse_expr(ps));
            if (!is_op(peek(ps), "]")) {
                expect_op(ps, ",");
            }
        }
        nd = node(ps, KJ_E_LIST, t);
        nd->items = items.v;
        nd->n_items = items.n;
        return nd;
    }
    if (accept_op(ps, "{")) {
        nodes_t keys = {0}, vals = {0};
        while (!accept_op(ps, "}")) {
            push(ps, &keys, parse_expr(ps));
            expect_op(ps, ":");
            push(ps, &vals, parse_expr(ps));
            if (!is_op(peek(ps), "}")) {
                expect_op(ps, ",");
            }
        }
        nd = node(ps, KJ_E_DICT, t);
        nd->items = keys.v;
        nd->n_items = keys.n;
        nd->items2 = vals.v;
        nd->n_items2 = vals.n;
        return nd;
    }
    syntax(ps, "expected an expression");
}

static kj_node_t *parse_subscript(parser_t *ps, kj_node_t *target, const kj_tok_t *t) {
    kj_node_t *parts[3] = {NULL, NULL, NULL};
    int n_colon = 0;
    for (;;) {
        if (is_op(peek(ps), "]")) {
            break;
        }
        if (accept_op(ps, ":")) {
            if (++n_colon > 2) {
                syntax(ps, "too many ':' in a slice");
            }
            continue;
        }
        if (parts[n_colon]) {
            syntax(ps, "expected ':' or ']'");
        }
        parts[n_colon] = parse_expr(ps);
    }
    expect_op(ps, "]");
    kj_node_t *nd;
    if (n_colon == 0) {
        if (!parts[0]) {
            syntax(ps, "empty subscript");
        }
        nd = node(ps, KJ_E_INDEX, t);
        nd->a = target;
        nd->b = parts[0];
        return nd;
    }
    nd = node(ps, KJ_E_SLICE, t);
    nd->a = target;
    nd->items = alloc(ps, 3 * sizeof(kj_node_t *));
    memcpy(nd->items, parts, sizeof(parts));
    nd->n_items = 3;
    return nd;
}

/* A filter name with optional arguments; `target` may be NULL (filter blocks). */
static kj_node_t *parse_filter(parser_t *ps, kj_node_t *target) {
    const kj_tok_t *t = peek(ps);
    kj_node_t *nd = node(ps, KJ_E_FILTER, t);
    nd->name = expect_name(ps);
    while (accept_op(ps, ".")) { /* dotted filter names: keep the last part */
        nd->name = expect_name(ps);
    }
    nd->a = target;
    if (accept_op(ps, "(")) {
        parse_args(ps, nd);
    }
    return nd;
}

static kj_node_t *parse_postfix(parser_t *ps, kj_node_t *nd) {
    for (;;) {
        const kj_tok_t *t = peek(ps);
        if (accept_op(ps, ".")) {
            kj_node_t *a = node(ps, KJ_E_ATTR, t);
            a->a = nd;
            if (peek(ps)->kind == KJ_T_INT) { /* x.0 as x[0] */
                a->kind = KJ_E_INDEX;
                a->b = parse_primary(ps);
            } else {
                a->name = expect_name(ps);
            }
            nd = a;
        } else if (accept_op(ps, "[")) {
            nd = parse_subscript(ps, nd, t);
        } else if (accept_op(ps, "(")) {
            kj_node_t *c = node(ps, KJ_E_CALL, t);
            c->a = nd;
            parse_args(ps, c);
            nd = c;
        } else {
            return nd;
        }
    }
}

static kj_node_t *parse_filters_tests(parser_t *ps, kj_node_t *nd) {
    for (;;) {
        const kj_tok_t *t = peek(ps);
        if (accept_op(ps, "|")) {
            nd = parse_filter(ps, nd);
        } else if (is_name(t, "is")) {
            ps->i++;
            kj_node_t *te = node(ps, KJ_E_TEST, t);
            te->op = accept_name(ps, "not") ? 1 : 0;
            te->a = nd;
            const kj_tok_t *nt = peek(ps);
            if (nt->kind == KJ_T_NAME) {
                te->name = nt->text;
                ps->i++;
            } else {
                syntax(ps, "expected a test name");
            }
            if (accept_op(ps, "(")) {
                parse_args(ps, te);
            } else {
                /* one argument without parentheses: `is divisibleby 3`, `is sameas none` */
                const kj_tok_t *a = peek(ps);
                if (a->kind == KJ_T_STRING || a->kind == KJ_T_INT || a->kind == KJ_T_FLOAT ||
                    is_op(a, "[") || is_op(a, "{") ||
                    (a->kind == KJ_T_NAME && !is_name(a, "and") && !is_name(a, "or") &&
                     !is_name(a, "else") && !is_name(a, "if") && !is_name(a, "is") &&
                     !is_name(a, "in") && !is_name(a, "not"))) {
                    te->items = alloc(ps, sizeof(kj_node_t *));
                    te->items[0] = parse_postfix(ps, parse_primary(ps));
                    te->n_items = 1;
                }
            }
            nd = te;
        } else {
            return nd;
        }
    }
}

/* As Jinja2: `-x|f` is `(-x)|f`, the sign binds before filters and tests. */
static kj_node_t *parse_unary_inner(parser_t *ps, bool with_filter) {
    const kj_tok_t *t = peek(ps);
    kj_node_t *nd;
    if (is_op(t, "-") || is_op(t, "+")) {
        ps->i++;
        nd = node(ps, KJ_E_UNARY, t);
        nd->op = (unsigned char)t->text[0];
        nd->a = parse_unary_inner(ps, false);
    } else {
        nd = parse_postfix(ps, parse_primary(ps));
    }
    return with_filter ? parse_filters_tests(ps, nd) : nd;
}

static kj_node_t *parse_unary(parser_t *ps) {
    return parse_unary_inner(ps, true);
}

static kj_node_t *binary(parser_t *ps, const kj_tok_t *t, int op, kj_node_t *a, kj_node_t *b) {
    kj_node_t *nd = node(ps, KJ_E_BINARY, t);
    nd->op = op;
    nd->a = a;
    nd->b = b;
    return nd;
}

static kj_node_t *parse_pow(parser_t *ps) {
    kj_node_t *l = parse_unary(ps);
    while (is_op(peek(ps), "**")) {
        const kj_tok_t *t = &ps->tok[ps->i++];
        l = binary(ps, t, KJ_OP_POW, l, parse_unary(ps));
    }
    return l;
}

static kj_node_t *parse_mul(parser_t *ps) {
    kj_node_t *l = parse_pow(ps);
    for (;;) {
        const kj_tok_t *t = peek(ps);
        int op = is_op(t, "*")    ? '*'
                 : is_op(t, "/")  ? '/'
                 : is_op(t, "//") ? KJ_OP_FLOORDIV
                 : is_op(t, "%")  ? '%'
                                  : 0;
        if (!op) {
            return l;
        }
        ps->i++;
        l = binary(ps, t, op, l, parse_pow(ps));
    }
}

static kj_node_t *parse_concat(parser_t *ps) {
    kj_node_t *l = parse_mul(ps);
    while (is_op(peek(ps), "~")) {
        const kj_tok_t *t = &ps->tok[ps->i++];
        l = binary(ps, t, '~', l, parse_mul(ps));
    }
    return l;
}

static kj_node_t *parse_add(parser_t *ps) {
    kj_node_t *l = parse_concat(ps);
    for (;;) {
        const kj_tok_t *t = peek(ps);
        if (!is_op(t, "+") && !is_op(t, "-")) {
            return l;
        }
        ps->i++;
        l = binary(ps, t, t->text[0], l, parse_concat(ps));
    }
}

static kj_node_t *parse_compare(parser_t *ps) {
    kj_node_t *l = parse_add(ps);
    for (;;) {
        const kj_tok_t *t = peek(ps);
        int op = 0;
        if (t->kind == KJ_T_OP) {
            op = !strcmp(t->text, "==")   ? KJ_OP_EQ
                 : !strcmp(t->text, "!=") ? KJ_OP_NE
                 : !strcmp(t->text, "<=") ? KJ_OP_LE
                 : !strcmp(t->text, ">=") ? KJ_OP_GE
                 : !strcmp(t->text, "<")  ? '<'
                 : !strcmp(t->text, ">")  ? '>'
                                          : 0;
            if (op) {
                ps->i++;
            }
        } else if (is_name(t, "in")) {
            op = KJ_OP_IN;
            ps->i++;
        } else if (is_name(t, "not") && is_name(peek_at(ps, 1), "in")) {
            op = KJ_OP_NOTIN;
            ps->i += 2;
        }
        if (!op) {
            return l;
        }
        l = binary(ps, t, op, l, parse_add(ps));
    }
}

static kj_node_t *parse_not(parser_t *ps) {
    const kj_tok_t *t = peek(ps);
    if (is_name(t, "not")) {
        ps->i++;
        kj_node_t *nd = node(ps, KJ_E_UNARY, t);
        nd->op = '!';
        nd->a = parse_not(ps);
        return nd;
    }
    return parse_compare(ps);
}

static kj_node_t *parse_and(parser_t *ps) {
    kj_node_t *l = parse_not(ps);
    while (is_name(peek(ps), "and")) {
        kj_node_t *nd = node(ps, KJ_E_AND, &ps->tok[ps->i++]);
        nd->a = l;
        nd->b = parse_not(ps);
        l = nd;
    }
    return l;
}

static kj_node_t *parse_or(parser_t *ps) {
    kj_node_t *l = parse_and(ps);
    while (is_name(peek(ps), "or")) {
        kj_node_t *nd = node(ps, KJ_E_OR, &ps->tok[ps->i++]);
        nd->a = l;
        nd->b = parse_and(ps);
        l = nd;
    }
    return l;
}

static kj_node_t *parse_expr(parser_t *ps) {
    if (++ps->depth > 200) {
        syntax(ps, "expression nested too deeply");
    }
    kj_node_t *l = parse_or(ps);
    while (is_name(peek(ps), "if")) {
        kj_node_t *nd = node(ps, KJ_E_COND, &ps->tok[ps->i++]);
        nd->b = l;
        nd->a = parse_or(ps);
        if (accept_name(ps, "else")) {
            nd->c = parse_expr(ps);
        }
        l = nd;
    }
    ps->depth--;
    return l;
}

/* An expression list without brackets (`a, b`) is a tuple. */
static kj_node_t *parse_expr_tuple(parser_t *ps) {
    const kj_tok_t *t = peek(ps);
    kj_node_t *first = parse_expr(ps);
    if (!is_op(peek(ps), ",")) {
        return first;
    }
    nodes_t items = {0};
    push(ps, &items, first);
    while (accept_op(ps, ",")) {
        push(ps, &items, parse_expr(ps));
    }
    kj_node_t *nd = node(ps, KJ_E_TUPLE, t);
    nd->items = items.v;
    nd->n_items = items.n;
    return nd;
}

// ---- statements ----

static const char *const end_if[] = {"elif", "else", "endif", NULL};
static const char *const end_for[] = {"else", "endfor", NULL};

static kj_node_t *parse_if(parser_t *ps, const kj_tok_t *t) {
    kj_node_t *nd = node(ps, KJ_S_IF, t);
    nd->a = parse_expr(ps);
    expect_close(ps);
    const char *which = NULL;
    kj_node_t *body = parse_body(ps, end_if, &which);
    nd->items = body->items;
    nd->n_items = body->n_items;
    if (!strcmp(which, "elif")) {
        const kj_tok_t *et = &ps->tok[ps->i - 1];
        kj_node_t *elif = parse_if(ps, et);
        nd->items2 = alloc(ps, sizeof(kj_node_t *));
        nd->items2[0] = elif;
        nd->n_items2 = 1;
        return nd; /* the nested if consumed endif */
    }
    if (!strcmp(which, "else")) {
        expect_close(ps);
        static const char *const end_else[] = {"endif", NULL};
        kj_node_t *eb = parse_body(ps, end_else, &which);
        nd->items2 = eb->items;
        nd->n_items2 = eb->n_items;
    }
    expect_close(ps);
    return nd;
}

static kj_node_t *parse_for(parser_t *ps, const kj_tok_t *t) {
    kj_node_t *nd = node(ps, KJ_S_FOR, t);
    nodes_t names = {0};
    bool paren = accept_op(ps, "(");
    do {
        kj_node_t *nm = node(ps, KJ_E_NAME, peek(ps));
        nm->name = expect_name(ps);
        push(ps, &names, nm);
    } while (accept_op(ps, ","));
    if (paren) {
        expect_op(ps, ")");
    }
    nd->names = alloc(ps, names.n * sizeof(char *));
    nd->n_names = names.n;
    for (size_t i = 0; i < names.n; i++) {
        nd->names[i] = names.v[i]->name;
    }
    if (!accept_name(ps, "in")) {
        syntax(ps, "expected 'in'");
    }
    /* the iterable stops before a filtering `if` */
    nd->a = parse_or(ps);
    if (accept_name(ps, "if")) {
        nd->b = parse_expr(ps);
    }
    if (accept_name(ps, "recursive")) {
        syntax(ps, "recursive loops are not supported");
    }
    expect_close(ps);
    const char *which = NULL;
    kj_node_t *body = parse_body(ps, end_for, &which);
    nd->items = body->items;
    nd->n_items = body->n_items;
    if (!strcmp(which, "else")) {
        expect_close(ps);
        static const char *const end_else[] = {"endfor", NULL};
        kj_node_t *eb = parse_body(ps, end_else, &which);
        nd->items2 = eb->items;
        nd->n_items2 = eb->n_items;
    }
    expect_close(ps);
    return nd;
}

/* A chain of filters for {% filter %} and {% set x | f %}: a KJ_E_FILTER
 * list whose innermost target is NULL. */
static kj_node_t *parse_filter_chain(parser_t *ps) {
    kj_node_t *f = parse_filter(ps, NULL);
    while (accept_op(ps, "|")) {
        f = parse_filter(ps, f);
    }
    return f;
}

static kj_node_t *parse_set(parser_t *ps, const kj_tok_t *t) {
    kj_node_t *target = parse_postfix(ps, parse_primary(ps));
    if (is_op(peek(ps), ",")) {
        nodes_t items = {0};
        push(ps, &items, target);
        while (accept_op(ps, ",")) {
            push(ps, &items, parse_postfix(ps, parse_primary(ps)));
        }
        target = node(ps, KJ_E_TUPLE, t);
        target->items = items.v;
        target->n_items = items.n;
    }
    if (accept_op(ps, "=")) {
        kj_node_t *nd = node(ps, KJ_S_SET, t);
        nd->a = target;
        nd->b = parse_expr_tuple(ps);
        expect_close(ps);
        return nd;
    }
    if (target->kind != KJ_E_NAME) {
        syntax(ps, "a block set needs a plain name");
    }
    kj_node_t *nd = node(ps, KJ_S_SET_BLOCK, t);
    nd->name = target->name;
    if (accept_op(ps, "|")) {
        nd->c = parse_filter_chain(ps);
    }
    expect_close(ps);
    static const char *const ends[] = {"endset", NULL};
    const char *which = NULL;
    kj_node_t *body = parse_body(ps, ends, &which);
    nd->items = body->items;
    nd->n_items = body->n_items;
    expect_close(ps);
    return nd;
}

/* Macro and caller parameters: `(a, b=1)`. */
static void parse_params(parser_t *ps, kj_node_t *nd) {
    nodes_t names = {0}, defs = {0};
    expect_op(ps, "(");
    while (!accept_op(ps, ")")) {
        kj_node_t *nm = node(ps, KJ_E_NAME, peek(ps));
        nm->name = expect_name(ps);
        push(ps, &names, nm);
        push(ps, &defs, accept_op(ps, "=") ? parse_expr(ps) : NULL);
        if (!is_op(peek(ps), ")")) {
            expect_op(ps, ",");
        }
    }
    nd->names = names.n ? alloc(ps, names.n * sizeof(char *)) : NULL;
    nd->n_names = names.n;
    for (size_t i = 0; i < names.n; i++) {
        nd->names[i] = names.v[i]->name;
    }
    nd->items2 = defs.v;
    nd->n_items2 = defs.n;
}

static kj_node_t *parse_block_body(parser_t *ps, kj_node_t *nd, const char *end) {
    const char *const ends[] = {end, NULL};
    const char *which = NULL;
    kj_node_t *body = parse_body(ps, ends, &which);
    nd->items = body->items;
    nd->n_items = body->n_items;
    if (peek(ps)->kind == KJ_T_NAME) { /* {% endmacro name %} */
        ps->i++;
    }
    expect_close(ps);
    return nd;
}

static kj_node_t *parse_statement(parser_t *ps) {
    const kj_tok_t *t = peek(ps);
    const char *kw = expect_name(ps);
    kj_node_t *nd;
    if (!strcmp(kw, "if")) {
        return parse_if(ps, t);
    }
    if (!strcmp(kw, "for")) {
        return parse_for(ps, t);
    }
    if (!strcmp(kw, "set")) {
        return parse_set(ps, t);
    }
    if (!strcmp(kw, "macro")) {
        nd = node(ps, KJ_S_MACRO, t);
        nd->name = expect_name(ps);
        parse_params(ps, nd);
        expect_close(ps);
        return parse_block_body(ps, nd, "endmacro");
    }
    if (!strcmp(kw, "call")) {
        nd = node(ps, KJ_S_CALL, t);
        if (is_op(peek(ps), "(")) {
            parse_params(ps, nd);
        }
        nd->a = parse_postfix(ps, parse_primary(ps));
        if (nd->a->kind != KJ_E_CALL) {
            syntax(ps, "call needs a macro call");
        }
        expect_close(ps);
        return parse_block_body(ps, nd, "endcall");
    }
    if (!strcmp(kw, "filter")) {
        nd = node(ps, KJ_S_FILTER, t);
        nd->c = parse_filter_chain(ps);
        expect_close(ps);
        return parse_block_body(ps, nd, "endfilter");
    }
    if (!strcmp(kw, "generation")) {
        /* transformers marks the assistant's tokens with it; the text is unchanged */
        expect_close(ps);
        nd = node(ps, KJ_S_BODY, t);
        return parse_block_body(ps, nd, "endgeneration");
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        nd = node(ps, kw[0] == 'b' ? KJ_S_BREAK : KJ_S_CONTINUE, t);
        expect_close(ps);
        return nd;
    }
    ps->i--;
    syntax(ps, "unknown statement");
}

/* Statements until one of `ends` (NULL: the end of the template); on return
 * the end keyword is consumed and *which names it, its %} is not. */
static kj_node_t *parse_body(parser_t *ps, const char *const *ends, const char **which) {
    kj_node_t *body = node(ps, KJ_S_BODY, peek(ps));
    nodes_t items = {0};
    if (++ps->depth > 200) {
        syntax(ps, "blocks nested too deeply");
    }
    for (;;) {
        const kj_tok_t *t = peek(ps);
        if (t->kind == KJ_T_EOF) {
            if (ends) {
                char what[64];
                snprintf(what, sizeof(what), "expected {%% %s %%}", ends[0]);
                syntax(ps, what);
            }
            break;
        }
        if (t->kind == KJ_T_TEXT) {
            kj_node_t *nd = node(ps, KJ_S_TEXT, t);
            nd->lit = lit_str(ps, t->text, t->len);
            push(ps, &items, nd);
            ps->i++;
            continue;
        }
        if (t->kind == KJ_T_OPEN_EXPR) {
            ps->i++;
            kj_node_t *nd = node(ps, KJ_S_OUTPUT, t);
            nd->a = parse_expr_tuple(ps);
            if (peek(ps)->kind != KJ_T_CLOSE_EXPR) {
                syntax(ps, "expected }}");
            }
            ps->i++;
            push(ps, &items, nd);
            continue;
        }
        if (t->kind != KJ_T_OPEN_STMT) {
            syntax(ps, "expected text, {{ or {%");
        }
        const kj_tok_t *kw = peek_at(ps, 1);
        bool is_end = false;
        for (size_t k = 0; ends && ends[k]; k++) {
            if (is_name(kw, ends[k])) {
                *which = ends[k];
                is_end = true;
            }
        }
        if (is_end) {
            ps->i += 2;
            break;
        }
        if (kw->kind == KJ_T_NAME && (!strncmp(kw->text, "end", 3) || !strcmp(kw->text, "elif") ||
                                      !strcmp(kw->text, "else"))) {
            ps->i++;
            syntax(ps, "unexpected end of block");
        }
        ps->i++;
        push(ps, &items, parse_statement(ps));
    }
    ps->depth--;
    body->items = items.v;
    body->n_items = items.n;
    return body;
}

kj_node_t *kj_parse(kj_rs_t *rs, kj_arena_t *arena, const char *src, size_t len) {
    parser_t ps = {.rs = rs, .arena = arena};
    ps.tok = kj_lex(rs, arena, src, len, &ps.n);
    const char *which = NULL;
    return parse_body(&ps, NULL, &which);
}
