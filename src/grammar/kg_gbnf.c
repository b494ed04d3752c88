/* kg_gbnf: a recursive-descent parser of llama.cpp's GBNF (see kg_gbnf.h).
 * It follows llama.cpp's grammar-parser in what it accepts, so existing
 * grammars work, and builds kg_gir expressions directly. */
#include "kg_gbnf.h"

#include "../core/kg_utf8.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nesting of parentheses beyond this is refused (the parser recurses). */
#define MAX_NESTING 256

typedef struct parser {
    kg_gir_t *g;
    const char *src, *end;
    char *errstr;
    size_t errstr_size;
    int nesting;
    jmp_buf fail;
    int32_t *rule_line; /* line of the first reference of each rule (for messages) */
    int32_t cap_rule_line;
    char *lit; /* the literal being parsed (owned here so a failure cannot leak it) */
    size_t lit_cap;
} parser_t;

static void where(const parser_t *p, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *s = p->src; s < at && s < p->end; s++) {
        if (*s == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static _Noreturn void
fail(parser_t *p, const char *at, const char *fmt, ...) {
    int line, col;
    where(p, at, &line, &col);
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    /* ap is initialized by va_start just above: clang 14's valist checker misses it */
    vsnprintf(msg, sizeof(msg), fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    snprintf(p->errstr, p->errstr_size, "grammar line %d column %d: %s", line, col, msg);
    longjmp(p->fail, 1);
}

/* An allocation failed: the parse ends here (longjmp to kg_gbnf_parse). */
static _Noreturn void out_of_memory(parser_t *p) {
    snprintf(p->errstr, p->errstr_size, "grammar: out of memory");
    longjmp(p->fail, 1);
}

/* A kg_gir constructor's result: a negative handle means out of memory. */
static void check(parser_t *p, int32_t handle) {
    if (handle < 0) {
        out_of_memory(p);
    }
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* Spaces, tabs and comments; newlines too when newline_ok. */
static const char *skip_space(const parser_t *p, const char *s, bool newline_ok) {
    while (s < p->end) {
        if (*s == ' ' || *s == '\t' || (newline_ok && (*s == '\n' || *s == '\r'))) {
            s++;
        } else if (*s == '#') {
            while (s < p->end && *s != '\n' && *s != '\r') {
                s++;
            }
        } else {
            break;
        }
    }
    return s;
}

static const char *parse_name(parser_t *p, const char *s) {
    const char *e = s;
    while (e < p->end && is_word(*e)) {
        e++;
    }
    if (e == s) {
        fail(p, s, "expecting a rule name");
    }
    return e;
}

static uint32_t hex_value(parser_t *p, const char *s, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        char c = s + i < p->end ? s[i] : '\0';
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            fail(p, s, "expecting %d hex digits", n);
        }
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

/* One UTF-8 character of the source (the grammar text is UTF-8). */
static const char *decode_utf8(parser_t *p, const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    size_t left = (size_t)(p->end - s);
    int n = u[0] < 0x80   ? 1
            : u[0] < 0xC2 ? 0
            : u[0] < 0xE0 ? 2
            : u[0] < 0xF0 ? 3
            : u[0] < 0xF5 ? 4
                          : 0;
    if (n == 0 || (size_t)n > left) {
        fail(p, s, "invalid UTF-8 in the grammar");
    }
    uint32_t c = n == 1 ? u[0] : n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            fail(p, s, "invalid UTF-8 in the grammar");
        }
        c = (c << 6) | (u[i] & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_cp[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        fail(p, s, "invalid UTF-8 in the grammar");
    }
    *cp = c;
    return s + n;
}

/* One character of a literal or class, escapes resolved. */
static const char *parse_char(parser_t *p, const char *s, uint32_t *cp) {
    if (s >= p->end) {
        fail(p, s, "unexpected end of input");
    }
    if (*s != '\\') {
        return decode_utf8(p, s, cp);
    }
    if (s + 1 >= p->end) {
        fail(p, s, "unexpected end of input after \\");
    }
    switch (s[1]) {
    case 'x':
        *cp = hex_value(p, s + 2, 2);
        return s + 4;
    case 'u':
        *cp = hex_value(p, s + 2, 4);
        return s + 6;
    case 'U':
        *cp = hex_value(p, s + 2, 8);
        if (*cp > 0x10FFFF) {
            fail(p, s, "code point beyond U+10FFFF");
        }
        return s + 10;
    case 't':
        *cp = '\t';
        return s + 2;
    case 'r':
        *cp = '\r';
        return s + 2;
    case 'n':
        *cp = '\n';
        return s + 2;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
        *cp = (unsigned char)s[1];
        return s + 2;
    default:
        fail(p, s, "unknown escape \\%c", s[1]);
    }
}

static int32_t rule_ref(parser_t *p, const char *name, size_t len) {
    int32_t r = kg_gir_rule(p->g, name, len);
    check(p, r);
    if (r >= p->cap_rule_line) {
        int32_t nc = p->cap_rule_line ? p->cap_rule_line * 2 : 64;
        while (nc <= r) {
            nc *= 2;
        }
        int32_t *l = realloc(p->rule_line, (size_t)nc * sizeof(*l));
        if (!l) {
            out_of_memory(p);
        }
        p->rule_line = l;
        for (int32_t i = p->cap_rule_line; i < nc; i++) {
            p->rule_line[i] = -1;
        }
        p->cap_rule_line = nc;
    }
    if (p->rule_line[r] < 0) {
        p->rule_line[r] = (int32_t)(name - p->src);
    }
    return r;
}

static const char *parse_alternates(parser_t *p, const char *s, bool nested, int32_t *out);

static int32_t parse_int(parser_t *p, const char **ps) {
    const char *s = *ps;
    if (s >= p->end || !is_digit(*s)) {
        fail(p, s, "expecting an integer");
    }
    long v = 0;
    while (s < p->end && is_digit(*s)) {
        v = v * 10 + (*s - '0');
        if (v > KG_GBNF_MAX_REPEAT) {
            fail(p, *ps, "repetition count above %d", KG_GBNF_MAX_REPEAT);
        }
        s++;
    }
    *ps = s;
    return (int32_t)v;
}

static const char *parse_sequence(parser_t *p, const char *s, bool nested, int32_t *out) {
    /* Long sequences fold their first 64 items into a nested sequence (the
     * same language); the last item stays on its own for a postfix. */
    int32_t items[64];
    int32_t n = 0;
    for (;;) {
        if (s >= p->end) {
            break;
        }
        int32_t elem = -1;
        const char *start = s;
        if (*s == '"') {
            s++;
            size_t len = 0;
            while (s < p->end && *s != '"') {
                uint32_t c;
                s = parse_char(p, s, &c);
                if (len + 4 > p->lit_cap) {
                    size_t cap = p->lit_cap ? p->lit_cap * 2 : 64;
                    char *nb = realloc(p->lit, cap);
                    if (!nb) {
                        out_of_memory(p);
                    }
                    p->lit = nb;
                    p->lit_cap = cap;
                }
                len += kg_utf8_put(c, p->lit + len);
            }
            if (s >= p->end) {
                fail(p, start, "unterminated literal");
            }
            elem = kg_gir_bytes(p->g, p->lit ? p->lit : "", len);
            s = skip_space(p, s + 1, nested);
        } else if (*s == '[') {
            s++;
            bool negate = false;
            if (s < p->end && *s == '^') {
                negate = true;
                s++;
            }
            uint32_t lo[256], hi[256];
            int32_t nr = 0;
            while (s < p->end && *s != ']') {
                uint32_t a, b;
                s = parse_char(p, s, &a);
                b = a;
                if (s + 1 < p->end && *s == '-' && s[1] != ']') {
                    s = parse_char(p, s + 1, &b);
                    if (b < a) {
                        fail(p, start, "character range out of order");
                    }
                }
                if (nr == 256) {
                    fail(p, start, "more than 256 ranges in one character class");
                }
                lo[nr] = a;
                hi[nr++] = b;
            }
            if (s >= p->end) {
                fail(p, start, "unterminated character class");
            }
            elem = kg_gir_chars(p->g, lo, hi, nr, negate);
            s = skip_space(p, s + 1, nested);
        } else if (is_word(*s)) {
            const char *e = parse_name(p, s);
            elem = kg_gir_ref(p->g, rule_ref(p, s, (size_t)(e - s)));
            s = skip_space(p, e, nested);
        } else if (*s == '(') {
            if (++p->nesting > MAX_NESTING) {
                fail(p, s, "parentheses nested deeper than %d", MAX_NESTING);
            }
            s = skip_space(p, s + 1, true);
            s = parse_alternates(p, s, true, &elem);
            if (s >= p->end || *s != ')') {
                fail(p, start, "expecting ')'");
            }
            p->nesting--;
            s = skip_space(p, s + 1, nested);
        } else if (*s == '.') {
            uint32_t lo = 0, hi = KG_GIR_MAX_CP;
            elem = kg_gir_chars(p->g, &lo, &hi, 1, false);
            s = skip_space(p, s + 1, nested);
        } else if (*s == '<') {
            fail(p, s, "token references (<...>) are not supported");
        } else if (*s == '*' || *s == '+' || *s == '?' || *s == '{') {
            if (n == 0) {
                fail(p, s, "expecting an item before '%c'", *s);
            }
            int32_t min = 0, max = KG_GIR_UNBOUNDED;
            if (*s == '*') {
                s++;
            } else if (*s == '+') {
                min = 1;
                s++;
            } else if (*s == '?') {
                max = 1;
                s++;
            } else {
                s = skip_space(p, s + 1, nested);
                min = parse_int(p, &s);
                s = skip_space(p, s, nested);
                if (s < p->end && *s == '}') {
                    max = min;
                } else if (s < p->end && *s == ',') {
                    s = skip_space(p, s + 1, nested);
                    if (s < p->end && is_digit(*s)) {
                        max = parse_int(p, &s);
                        s = skip_space(p, s, nested);
                        if (max < min) {
                            fail(p, start, "repetition {%d,%d}: max below min", min, max);
                        }
                    }
                    if (s >= p->end || *s != '}') {
                        fail(p, s, "expecting '}'");
                    }
                } else {
                    fail(p, s, "expecting ',' or '}'");
                }
                s++;
            }
            items[n - 1] = kg_gir_repeat(p->g, items[n - 1], min, max);
            check(p, items[n - 1]);
            s = skip_space(p, s, nested);
            continue;
        } else {
            break;
        }
        check(p, elem);
        if (n == 64) {
            items[0] = kg_gir_seq(p->g, items, n);
            check(p, items[0]);
            n = 1;
        }
        items[n++] = elem;
    }
    *out = kg_gir_seq(p->g, items, n);
    check(p, *out);
    return s;
}

static const char *parse_alternates(parser_t *p, const char *s, bool nested, int32_t *out) {
    int32_t alts[256];
    int32_t n = 0;
    int32_t acc = -1; /* alternatives beyond 256 fold into a nested ALT */
    for (;;) {
        int32_t seq;
        s = parse_sequence(p, s, nested, &seq);
        if (n == 256) {
            acc = kg_gir_alt(p->g, alts, n);
            check(p, acc);
            alts[0] = acc;
            n = 1;
        }
        alts[n++] = seq;
        if (s < p->end && *s == '|') {
            s = skip_space(p, s + 1, true);
            continue;
        }
        break;
    }
    *out = kg_gir_alt(p->g, alts, n);
    check(p, *out);
    return s;
}

static const char *parse_rule(parser_t *p, const char *s) {
    const char *name_end = parse_name(p, s);
    int32_t r = rule_ref(p, s, (size_t)(name_end - s));
    const char *t = skip_space(p, name_end, false);
    if (p->end - t < 3 || memcmp(t, "::=", 3) != 0) {
        fail(p, t, "expecting ::=");
    }
    t = skip_space(p, t + 3, true);
    int32_t expr;
    t = parse_alternates(p, t, false, &expr);
    if (!kg_gir_define(p->g, r, expr)) {
        fail(p, s, "rule '%s' is defined twice", kg_gir_rule_name(p->g, r));
    }
    if (t < p->end) {
        if (*t == '\r') {
            t += (t + 1 < p->end && t[1] == '\n') ? 2 : 1;
        } else if (*t == '\n') {
            t++;
        } else {
            fail(p, t, "expecting a newline or the end, got '%c'", *t);
        }
    }
    return skip_space(p, t, true);
}

bool kg_gbnf_parse(kg_gir_t *g, const char *text, size_t len, char *errstr, size_t errstr_size) {
    parser_t p = {
        .g = g, .src = text, .end = text + len, .errstr = errstr, .errstr_size = errstr_size};
    bool ok = false;
    if (setjmp(p.fail) != 0) {
        goto out;
    }
    if (memchr(text, '\0', len) != NULL) {
        fail(&p, (const char *)memchr(text, '\0', len), "NUL byte in the grammar");
    }
    const char *s = skip_space(&p, text, true);
    while (s < p.end) {
        s = parse_rule(&p, s);
    }
    for (int32_t r = 0; r < kg_gir_n_rules(g); r++) {
        if (kg_gir_rule_expr(g, r) < 0) {
            fail(&p, p.src + (r < p.cap_rule_line && p.rule_line[r] >= 0 ? p.rule_line[r] : 0),
                 "undefined rule '%s'", kg_gir_rule_name(g, r));
        }
    }
    int32_t root = -1;
    for (int32_t r = 0; r < kg_gir_n_rules(g); r++) {
        if (strcmp(kg_gir_rule_name(g, r), "root") == 0) {
            root = r;
        }
    }
    if (root < 0) {
        snprintf(errstr, errstr_size, "grammar: no rule named 'root'");
        goto out;
    }
    if (!kg_gir_ok(g)) {
        snprintf(errstr, errstr_size, "grammar: out of memory");
        goto out;
    }
    kg_gir_set_root(g, root);
    ok = true;
out:
    free(p.rule_line);
    free(p.lit);
    return ok;
}
