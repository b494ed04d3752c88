/* kg_regex: regular expressions to grammar IR (see kg_regex.h), by
 * recursive descent straight into kg_gir expressions. */
#include "kg_regex.h"

#include "../core/kg_utf8.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_NESTING  200
#define MAX_RANGES   512
#define MAX_QUANTITY 10000

typedef struct rx {
    kg_gir_t *g;
    const char *src, *s, *end;
    const kg_regex_opts_t *o;
    char *errstr;
    size_t errstr_size;
    int nesting;
    jmp_buf fail;
} rx_t;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static _Noreturn void
fail(rx_t *r, const char *at, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(r->errstr, r->errstr_size, "regex at offset %d: %s", (int)(at - r->src), msg);
    longjmp(r->fail, 1);
}

static int32_t ok(rx_t *r, int32_t h) {
    if (h < 0) {
        snprintf(r->errstr, r->errstr_size, "regex: out of memory");
        longjmp(r->fail, 1);
    }
    return h;
}

// ---- characters ----

/* A JSON escape of a character that cannot appear raw in a string. */
static size_t json_escape(uint32_t c, char *out) {
    switch (c) {
    case '"':
        return (size_t)snprintf(out, 8, "\\\"");
    case '\\':
        return (size_t)snprintf(out, 8, "\\\\");
    case '\n':
        return (size_t)snprintf(out, 8, "\\n");
    case '\t':
        return (size_t)snprintf(out, 8, "\\t");
    case '\r':
        return (size_t)snprintf(out, 8, "\\r");
    default:
        return (size_t)snprintf(out, 8, "\\u%04x", c);
    }
}

static bool json_special(uint32_t c) {
    return c == '"' || c == '\\' || c < 0x20;
}

int32_t kg_regex_json_chars(kg_gir_t *g, int32_t chars_expr) {
    if (chars_expr < 0) {
        return -1;
    }
    const kg_gx_t *x = kg_gir_node(g, chars_expr);
    int32_t n = x->b;
    uint32_t lo[2 * MAX_RANGES + 4], hi[2 * MAX_RANGES + 4];
    int32_t m = 0;
    if (n > 2 * MAX_RANGES) {
        return -1;
    }
    bool has[0x60] = {0}; /* which specials (< 0x60) the set holds */
    bool any_special = false;
    for (int32_t i = 0; i < n; i++) {
        uint32_t a, b;
        kg_gir_range(g, kg_gir_node(g, chars_expr), i, &a, &b);
        /* cut out the specials: 0..0x1F, '"' (0x22), '\\' (0x5C) */
        for (uint32_t c = a; c <= b && c < 0x60; c++) {
            if (json_special(c)) {
                has[c] = true;
                any_special = true;
            }
        }
        uint32_t cuts[3][2] = {{0, 0x1F}, {0x22, 0x22}, {0x5C, 0x5C}};
        uint32_t from = a;
        for (int k = 0; k < 3 && from <= b; k++) {
            if (cuts[k][1] < from) {
                continue;
            }
            if (cuts[k][0] > b) {
                break;
            }
            if (cuts[k][0] > from) {
                lo[m] = from, hi[m++] = cuts[k][0] - 1;
            }
            from = cuts[k][1] + 1;
        }
        if (from <= b) {
            lo[m] = from, hi[m++] = b;
        }
    }
    int32_t raw = kg_gir_chars(g, lo, hi, m, false);
    if (!any_special) {
        return raw;
    }
    int32_t alts[40];
    int32_t na = 0;
    alts[na++] = raw;
    bool all_controls = true;
    for (uint32_t c = 0; c < 0x20; c++) {
        all_controls = all_controls && has[c];
    }
    if (all_controls) {
        /* \u0000..\u001f in one go: \u00 [01] hex */
        uint32_t dl[3] = {'0', 'a', 'A'}, dh[3] = {'9', 'f', 'F'};
        uint32_t zl = '0', zh = '1';
        int32_t parts[3] = {kg_gir_bytes(g, "\\u00", 4), kg_gir_chars(g, &zl, &zh, 1, false),
                            kg_gir_chars(g, dl, dh, 3, false)};
        alts[na++] = kg_gir_seq(g, parts, 3);
    }
    for (uint32_t c = 0; c < 0x60; c++) {
        if (has[c] && !(all_controls && c < 0x20)) {
            char buf[8];
            size_t len = json_escape(c, buf);
            alts[na++] = kg_gir_bytes(g, buf, len);
        }
    }
    return kg_gir_alt(g, alts, na);
}

/* One code point as an expression in the current mode. */
static int32_t char_expr(rx_t *r, uint32_t c) {
    char buf[8];
    size_t n = r->o->json_string && json_special(c) ? json_escape(c, buf) : kg_utf8_put(c, buf);
    return ok(r, kg_gir_bytes(r->g, buf, n));
}

/* A set of ranges as an expression in the current mode. */
static int32_t set_expr(rx_t *r, const uint32_t *lo, const uint32_t *hi, int32_t n, bool negate) {
    int32_t e = ok(r, kg_gir_chars(r->g, lo, hi, n, negate));
    return r->o->json_string ? ok(r, kg_regex_json_chars(r->g, e)) : e;
}

// ---- parsing ----

static uint32_t hex(rx_t *r, const char *s, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        char c = s + i < r->end ? s[i] : '\0';
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            fail(r, s, "expecting %d hex digits", n);
        }
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

static uint32_t utf8(rx_t *r) {
    const unsigned char *u = (const unsigned char *)r->s;
    size_t left = (size_t)(r->end - r->s);
    int n = u[0] < 0x80   ? 1
            : u[0] < 0xC2 ? 0
            : u[0] < 0xE0 ? 2
            : u[0] < 0xF0 ? 3
            : u[0] < 0xF5 ? 4
                          : 0;
    if (n == 0 || (size_t)n > left) {
        fail(r, r->s, "invalid UTF-8");
    }
    uint32_t c = n == 1 ? u[0] : n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            fail(r, r->s, "invalid UTF-8");
        }
        c = (c << 6) | (u[i] & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_cp[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        fail(r, r->s, "invalid UTF-8");
    }
    r->s += n;
    return c;
}

/* Shorthand classes, as ranges appended to (lo, hi). */
enum { SH_NONE = 0, SH_D, SH_ND, SH_W, SH_NW, SH_S, SH_NS };

static int32_t shorthand_ranges(int kind, uint32_t *lo, uint32_t *hi) {
    static const uint32_t d[][2] = {{'0', '9'}};
    static const uint32_t nd[][2] = {{0, '0' - 1}, {'9' + 1, 0x7F}};
    static const uint32_t w[][2] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const uint32_t nw[][2] = {
        {0, '0' - 1}, {'9' + 1, 'A' - 1}, {'Z' + 1, '_' - 1}, {'_' + 1, 'a' - 1}, {'z' + 1, 0x7F}};
    static const uint32_t s[][2] = {{'\t', '\r'}, {' ', ' '}};
    /* not white space for anyone: ASCII and Unicode white space (and the
     * separators Python counts) excluded */
    static const uint32_t ns[][2] = {{0, 0x08},        {0x0E, 0x1B},     {0x21, 0x84},
                                     {0x86, 0x9F},     {0xA1, 0x167F},   {0x1681, 0x1FFF},
                                     {0x200B, 0x2027}, {0x202A, 0x202E}, {0x2030, 0x205E},
                                     {0x2060, 0x2FFF}, {0x3001, 0xFEFE}, {0xFF00, 0x10FFFF}};
    const uint32_t(*t)[2];
    int32_t n;
    switch (kind) {
    case SH_D:
        t = d, n = 1;
        break;
    case SH_ND:
        t = nd, n = 2;
        break;
    case SH_W:
        t = w, n = 4;
        break;
    case SH_NW:
        t = nw, n = 5;
        break;
    case SH_S:
        t = s, n = 2;
        break;
    default:
        t = ns, n = 12;
        break;
    }
    for (int32_t i = 0; i < n; i++) {
        lo[i] = t[i][0];
        hi[i] = t[i][1];
    }
    return n;
}

/* An escape after '\'. Returns a shorthand kind, or SH_NONE with *cp set. */
static int parse_escape(rx_t *r, uint32_t *cp, bool in_class) {
    const char *at = r->s - 1;
    if (r->s >= r->end) {
        fail(r, at, "trailing backslash");
    }
    char c = *r->s++;
    switch (c) {
    case 'd':
        return SH_D;
    case 'D':
        return SH_ND;
    case 'w':
        return SH_W;
    case 'W':
        return SH_NW;
    case 's':
        return SH_S;
    case 'S':
        return SH_NS;
    case 'n':
        *cp = '\n';
        return SH_NONE;
    case 'r':
        *cp = '\r';
        return SH_NONE;
    case 't':
        *cp = '\t';
        return SH_NONE;
    case 'f':
        *cp = '\f';
        return SH_NONE;
    case 'v':
        *cp = '\v';
        return SH_NONE;
    case '0':
        *cp = 0;
        return SH_NONE;
    case 'x':
        *cp = hex(r, r->s, 2);
        r->s += 2;
        return SH_NONE;
    case 'u':
        if (r->s < r->end && *r->s == '{') {
            const char *e = memchr(r->s, '}', (size_t)(r->end - r->s));
            if (!e || e - r->s < 2 || e - r->s > 7) {
                fail(r, at, "bad \\u{...} escape");
            }
            *cp = hex(r, r->s + 1, (int)(e - r->s - 1));
            r->s = e + 1;
        } else {
            *cp = hex(r, r->s, 4);
            r->s += 4;
        }
        if (*cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) {
            fail(r, at, "\\u escape of a surrogate or beyond U+10FFFF");
        }
        return SH_NONE;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return SH_NONE;
        }
        fail(r, at, "word boundaries (\\b) are not supported");
    case 'B':
        fail(r, at, "word boundaries (\\B) are not supported");
    case 'p':
    case 'P':
        fail(r, at, "Unicode property classes (\\%c) are not supported", c);
    case 'A':
    case 'Z':
    case 'z':
    case 'G':
        fail(r, at, "anchor \\%c is not supported", c);
    default:
        if (c >= '1' && c <= '9') {
            fail(r, at, "backreferences are not supported");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            fail(r, at, "unknown escape \\%c", c);
        }
        r->s--;
        *cp = utf8(r); /* escaped punctuation or any other character: itself */
        return SH_NONE;
    }
}

static int32_t parse_class(rx_t *r) {
    const char *at = r->s - 1;
    bool negate = false;
    if (r->s < r->end && *r->s == '^') {
        negate = true;
        r->s++;
    }
    uint32_t lo[MAX_RANGES], hi[MAX_RANGES];
    int32_t n = 0;
    bool first = true;
    while (r->s < r->end && (*r->s != ']' || first)) {
        first = false;
        uint32_t a = 0;
        int sh = SH_NONE;
        if (*r->s == '\\') {
            r->s++;
            sh = parse_escape(r, &a, true);
        } else if (*r->s == '[' && r->s + 1 < r->end && r->s[1] == ':') {
            fail(r, r->s, "POSIX classes ([:name:]) are not supported");
        } else {
            a = utf8(r);
        }
        if (n + 16 > MAX_RANGES) {
            fail(r, at, "character class too large");
        }
        if (sh != SH_NONE) {
            n += shorthand_ranges(sh, lo + n, hi + n);
            continue;
        }
        uint32_t b = a;
        if (r->s + 1 < r->end && *r->s == '-' && r->s[1] != ']') {
            r->s++;
            if (*r->s == '\\') {
                r->s++;
                if (parse_escape(r, &b, true) != SH_NONE) {
                    fail(r, at, "a class shorthand cannot end a range");
                }
            } else {
                b = utf8(r);
            }
            if (b < a) {
                fail(r, at, "character range out of order");
            }
        }
        lo[n] = a;
        hi[n++] = b;
    }
    if (r->s >= r->end) {
        fail(r, at, "unterminated character class");
    }
    r->s++;
    return set_expr(r, lo, hi, n, negate);
}

/* any character but \n */
static int32_t dot_expr(rx_t *r) {
    uint32_t lo[2] = {0, '\n' + 1}, hi[2] = {'\n' - 1, KG_GIR_MAX_CP};
    return set_expr(r, lo, hi, 2, false);
}

static int32_t parse_alt(rx_t *r, bool top);

/* A quantifier {n}, {n,}, {n,m} at r->s ('{' already seen); false (and
 * nothing consumed) when the brace is not one, as JS and Python then take
 * it literally. */
static bool parse_braces(rx_t *r, int32_t *min, int32_t *max) {
    const char *s = r->s + 1;
    long a = 0, b = -1;
    int nd = 0;
    while (s < r->end && *s >= '0' && *s <= '9' && nd < 7) {
        a = a * 10 + (*s++ - '0'), nd++;
    }
    if (nd == 0) {
        return false;
    }
    if (s < r->end && *s == '}') {
        b = a;
    } else if (s < r->end && *s == ',') {
        s++;
        int nb = 0;
        long v = 0;
        while (s < r->end && *s >= '0' && *s <= '9' && nb < 7) {
            v = v * 10 + (*s++ - '0'), nb++;
        }
        if (s >= r->end || *s != '}') {
            return false;
        }
        b = nb ? v : -1;
    } else {
        return false;
    }
    if (a > MAX_QUANTITY || b > MAX_QUANTITY) {
        fail(r, r->s, "repetition count above %d", MAX_QUANTITY);
    }
    if (b >= 0 && b < a) {
        fail(r, r->s, "repetition {%ld,%ld}: max below min", a, b);
    }
    *min = (int32_t)a;
    *max = b < 0 ? KG_GIR_UNBOUNDED : (int32_t)b;
    r->s = s + 1;
    return true;
}

static int32_t parse_atom(rx_t *r) {
    const char *at = r->s;
    char c = *r->s;
    if (c == '(') {
        r->s++;
        if (r->s < r->end && *r->s == '?') {
            r->s++;
            if (r->s < r->end && *r->s == ':') {
                r->s++;
            } else if (r->s < r->end && (*r->s == '<' || *r->s == 'P') &&
                       !(r->s + 1 < r->end && *r->s == '<' && (r->s[1] == '=' || r->s[1] == '!'))) {
                if (*r->s == 'P') {
                    r->s++;
                }
                if (r->s >= r->end || *r->s != '<') {
                    fail(r, at, "unsupported group syntax");
                }
                const char *e = memchr(r->s, '>', (size_t)(r->end - r->s));
                if (!e) {
                    fail(r, at, "unterminated group name");
                }
                r->s = e + 1;
            } else if (r->s < r->end && (*r->s == '=' || *r->s == '!' || *r->s == '<')) {
                fail(r, at, "lookaround assertions are not supported");
            } else {
                fail(r, at, "inline flags and special groups (?...) are not supported");
            }
        }
        if (++r->nesting > MAX_NESTING) {
            fail(r, at, "groups nested deeper than %d", MAX_NESTING);
        }
        int32_t e = parse_alt(r, false);
        r->nesting--;
        if (r->s >= r->end || *r->s != ')') {
            fail(r, at, "missing )");
        }
        r->s++;
        return e;
    }
    if (c == '[') {
        r->s++;
        return parse_class(r);
    }
    if (c == '.') {
        r->s++;
        return dot_expr(r);
    }
    if (c == '\\') {
        r->s++;
        uint32_t cp = 0;
        int sh = parse_escape(r, &cp, false);
        if (sh != SH_NONE) {
            uint32_t lo[16], hi[16];
            int32_t n = shorthand_ranges(sh, lo, hi);
            return set_expr(r, lo, hi, n, false);
        }
        return char_expr(r, cp);
    }
    if (c == '^' || c == '$') {
        fail(r, at, "anchors are supported only at the start and end of the pattern");
    }
    if (c == '*' || c == '+' || c == '?') {
        fail(r, at, "nothing to repeat before '%c'", c);
    }
    if (c == ')') {
        fail(r, at, "unmatched )");
    }
    return char_expr(r, utf8(r));
}

static int32_t parse_seq(rx_t *r, bool top, bool *end_anchor) {
    int32_t items[64];
    int32_t n = 0;
    while (r->s < r->end && *r->s != '|' && *r->s != ')') {
        if (top && *r->s == '$' && (r->s + 1 == r->end || r->s[1] == '|')) {
            r->s++;
            *end_anchor = true;
            break;
        }
        int32_t atom = parse_atom(r);
        /* quantifiers (several in a row apply in turn, as in JS) */
        for (;;) {
            if (r->s >= r->end) {
                break;
            }
            int32_t min, max;
            char q = *r->s;
            if (q == '*' || q == '+' || q == '?') {
                r->s++;
                min = q == '+' ? 1 : 0;
                max = q == '?' ? 1 : KG_GIR_UNBOUNDED;
            } else if (q == '{' && parse_braces(r, &min, &max)) {
            } else {
                break;
            }
            if (r->s < r->end && *r->s == '?') {
                r->s++; /* lazy: the same language */
            } else if (r->s < r->end && *r->s == '+') {
                fail(r, r->s, "possessive quantifiers are not supported");
            }
            atom = ok(r, kg_gir_repeat(r->g, atom, min, max));
        }
        if (n == 64) {
            items[0] = ok(r, kg_gir_seq(r->g, items, n));
            n = 1;
        }
        items[n++] = atom;
    }
    return ok(r, kg_gir_seq(r->g, items, n));
}

/* Any text (for an unanchored side in search mode). */
static int32_t any_text(rx_t *r) {
    uint32_t lo = 0, hi = KG_GIR_MAX_CP;
    return ok(r, kg_gir_repeat(r->g, set_expr(r, &lo, &hi, 1, false), 0, KG_GIR_UNBOUNDED));
}

static int32_t parse_alt(rx_t *r, bool top) {
    int32_t alts[64];
    int32_t n = 0;
    for (;;) {
        bool start_anchor = false, end_anchor = false;
        if (top && r->s < r->end && *r->s == '^') {
            r->s++;
            start_anchor = true;
        }
        int32_t e = parse_seq(r, top, &end_anchor);
        if (top && r->o->search) {
            if (!start_anchor) {
                e = ok(r, kg_gir_seq2(r->g, any_text(r), e));
            }
            if (!end_anchor) {
                e = ok(r, kg_gir_seq2(r->g, e, any_text(r)));
            }
        }
        if (n == 64) {
            alts[0] = ok(r, kg_gir_alt(r->g, alts, n));
            n = 1;
        }
        alts[n++] = e;
        if (r->s < r->end && *r->s == '|') {
            r->s++;
            continue;
        }
        break;
    }
    return ok(r, kg_gir_alt(r->g, alts, n));
}

int32_t kg_regex_to_gir(kg_gir_t *g,
                        const char *re,
                        size_t len,
                        const kg_regex_opts_t *opts,
                        char *errstr,
                        size_t errstr_size) {
    rx_t r = {.g = g,
              .src = re,
              .s = re,
              .end = re + len,
              .o = opts,
              .errstr = errstr,
              .errstr_size = errstr_size};
    if (setjmp(r.fail) != 0) {
        return -1;
    }
    if (memchr(re, '\0', len) != NULL) {
        fail(&r, (const char *)memchr(re, '\0', len), "NUL byte in the pattern");
    }
    int32_t e = parse_alt(&r, true);
    if (r.s < r.end) {
        fail(&r, r.s, "unmatched )");
    }
    return e;
}
