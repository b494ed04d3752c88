/* kg_jinja_lexer: template source into tokens: text runs (with Jinja's
 * whitespace control applied) and the tokens inside {% %} and {{ }}.
 *
 * Whitespace rules, as transformers configures Jinja (trim_blocks and
 * lstrip_blocks on) and as llama.cpp's lexer applies them: CRLF and CR
 * become LF and one trailing newline of the source is dropped; a newline
 * right after a block or comment tag (%} #} -}) is removed; spaces and tabs
 * between a line start and a {% or {# are removed; a '-' inside a tag strips
 * all whitespace on that side. Comments vanish. */
#include "kg_jinja_int.h"

#include <ctype.h>
#include <string.h>

typedef struct lexer {
    kj_rs_t *rs;
    kj_arena_t *arena;
    char *src; /* normalized copy */
    size_t len, pos;
    kj_tok_t *tok;
    size_t n, cap;
    /* position cache for line:col */
    size_t at_pos;
    int at_line, at_col;
} lexer_t;

static void where(lexer_t *lx, size_t pos, int *line, int *col) {
    if (pos < lx->at_pos) {
        lx->at_pos = 0;
        lx->at_line = 1;
        lx->at_col = 1;
    }
    for (; lx->at_pos < pos && lx->at_pos < lx->len; lx->at_pos++) {
        if (lx->src[lx->at_pos] == '\n') {
            lx->at_line++;
            lx->at_col = 1;
        } else {
            lx->at_col++;
        }
    }
    *line = lx->at_line;
    *col = lx->at_col;
}

_Noreturn static void lex_fail(lexer_t *lx, size_t pos, const char *msg) {
    kj_node_t at = {0};
    where(lx, pos, &at.line, &at.col);
    kj_fail(lx->rs, &at, "%s", msg);
}

static void emit(lexer_t *lx, kj_tok_kind_t kind, size_t pos, const char *text, size_t len) {
    if (lx->n + 1 >= lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        kj_tok_t *t = kj_alloc(lx->arena, cap * sizeof(*t));
        if (!t) {
            lex_fail(lx, pos, "template too large");
        }
        if (lx->n) {
            memcpy(t, lx->tok, lx->n * sizeof(*t));
        }
        lx->tok = t;
        lx->cap = cap;
    }
    char *copy = kj_alloc(lx->arena, len + 1);
    if (!copy) {
        lex_fail(lx, pos, "template too large");
    }
    if (len) {
        memcpy(copy, text, len);
    }
    kj_tok_t *t = &lx->tok[lx->n++];
    t->kind = kind;
    t->text = copy;
    t->len = len;
    where(lx, pos, &t->line, &t->col);
}

static bool at(const lexer_t *lx, size_t pos, const char *s) {
    size_t n = strlen(s);
    return pos + n <= lx->len && memcmp(lx->src + pos, s, n) == 0;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool tag_open_at(const lexer_t *lx, size_t pos) {
    return pos + 1 < lx->len && lx->src[pos] == '{' &&
           (lx->src[pos + 1] == '%' || lx->src[pos + 1] == '{' || lx->src[pos + 1] == '#');
}

/* The text from lx->pos to the next tag, with the whitespace rules. */
static void lex_text(lexer_t *lx) {
    size_t p = lx->pos, start = p;
    bool rstrip_prev = false, can_rm_newline = false;
    if (p > 3) {
        char c0 = lx->src[p - 3], c1 = lx->src[p - 2], c2 = lx->src[p - 1];
        rstrip_prev = c0 == '-' && (c1 == '%' || c1 == '}' || c1 == '#') && c2 == '}';
        can_rm_newline = (c1 == '#' || c1 == '%' || c1 == '-') && c2 == '}';
    }
    while (p < lx->len && !tag_open_at(lx, p)) {
        p++;
    }
    size_t end = p;
    /* lstrip_blocks: blanks from the line start up to a {% or {# */
    if (p + 1 < lx->len && lx->src[p] == '{' &&
        (lx->src[p + 1] == '%' || lx->src[p + 1] == '#' || lx->src[p + 1] == '-')) {
        size_t cur = end;
        while (cur > start) {
            char c = lx->src[cur - 1];
            if (cur == 1) {
                end = 0; /* llama.cpp: at the very start of the source */
                break;
            }
            if (c == '\n') {
                end = cur;
                break;
            }
            if (!isspace((unsigned char)c)) {
                break;
            }
            cur--;
        }
    }
    const char *t = lx->src + start;
    size_t tl = end > start ? end - start : 0;
    if (can_rm_newline && tl > 0 && t[0] == '\n') {
        t++;
        tl--;
    }
    if (rstrip_prev) {
        while (tl > 0 && (t[0] == ' ' || t[0] == '\t' || t[0] == '\r' || t[0] == '\n')) {
            t++;
            tl--;
        }
    }
    if (p + 2 < lx->len && tag_open_at(lx, p) && lx->src[p + 2] == '-') {
        while (tl > 0 &&
               (t[tl - 1] == ' ' || t[tl - 1] == '\t' || t[tl - 1] == '\r' || t[tl - 1] == '\n')) {
            tl--;
        }
    }
    if (tl > 0) {
        emit(lx, KJ_T_TEXT, start, t, tl);
    }
    lx->pos = p;
}

static char unescape(lexer_t *lx, size_t pos, char c) {
    switch (c) {
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'r':
        return '\r';
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case '\\':
    case '\'':
    case '"':
        return c;
    default:
        lex_fail(lx, pos, "unknown escape in a string literal");
    }
}

static void lex_string(lexer_t *lx) {
    size_t start = lx->pos;
    char q = lx->src[lx->pos++];
    size_t cap = 64, n = 0;
    char *buf = kj_alloc(lx->arena, cap);
    for (;;) {
        if (!buf) {
            lex_fail(lx, start, "template too large");
        }
        if (lx->pos >= lx->len) {
            lex_fail(lx, start, "unterminated string literal");
        }
        char c = lx->src[lx->pos++];
        if (c == q) {
            break;
        }
        if (c == '\\') {
            if (lx->pos >= lx->len) {
                lex_fail(lx, start, "unterminated string literal");
            }
            c = unescape(lx, lx->pos, lx->src[lx->pos]);
            lx->pos++;
        }
        if (n + 1 >= cap) {
            char *nb = kj_alloc(lx->arena, cap * 2);
            if (nb) {
                memcpy(nb, buf, n);
            }
            buf = nb;
            cap *= 2;
            if (!buf) {
                continue;
            }
        }
        buf[n++] = c;
    }
    emit(lx, KJ_T_STRING, start, buf, n);
}

/* Punctuation, longest first. */
static const char *const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                  "/",  "%",  "<",  ">",  "(",  ")",  "[", "]", "{",
                                  "}",  ",",  ".",  ":",  "|",  "~",  "=", "?", "!"};

/* Tokens inside a tag until its close. */
static void lex_tag(lexer_t *lx, bool is_stmt) {
    int depth = 0; /* open { of dict literals */
    for (;;) {
        while (lx->pos < lx->len && is_ws(lx->src[lx->pos])) {
            lx->pos++;
        }
        size_t p = lx->pos;
        if (p >= lx->len) {
            lex_fail(lx, p,
                     is_stmt ? "missing %} at the end of the template"
                             : "missing }} at the end of the template");
        }
        const char *close = is_stmt ? "%}" : "}}";
        bool dash = lx->src[p] == '-' && at(lx, p + 1, close);
        if ((dash || at(lx, p, close)) && (is_stmt || depth == 0)) {
            emit(lx, is_stmt ? KJ_T_CLOSE_STMT : KJ_T_CLOSE_EXPR, p, close, 2);
            lx->pos = p + (dash ? 3 : 2);
            return;
        }
        char c = lx->src[p];
        if (c == '\'' || c == '"') {
            lex_string(lx);
            continue;
        }
        if (isdigit((unsigned char)c)) {
            size_t e = p;
            while (e < lx->len && isdigit((unsigned char)lx->src[e])) {
                e++;
            }
            bool is_float = false;
            if (e + 1 < lx->len && lx->src[e] == '.' && isdigit((unsigned char)lx->src[e + 1])) {
                is_float = true;
                e++;
                while (e < lx->len && isdigit((unsigned char)lx->src[e])) {
                    e++;
                }
            }
            emit(lx, is_float ? KJ_T_FLOAT : KJ_T_INT, p, lx->src + p, e - p);
            lx->pos = e;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t e = p;
            while (e < lx->len && (isalnum((unsigned char)lx->src[e]) || lx->src[e] == '_')) {
                e++;
            }
            emit(lx, KJ_T_NAME, p, lx->src + p, e - p);
            lx->pos = e;
            continue;
        }
        bool matched = false;
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
            if (at(lx, p, ops[i])) {
                size_t n = strlen(ops[i]);
                emit(lx, KJ_T_OP, p, ops[i], n);
                depth += c == '{' ? 1 : c == '}' ? -1 : 0;
                lx->pos = p + n;
                matched = true;
                break;
            }
        }
        if (!matched) {
            lex_fail(lx, p, "unexpected character in a tag");
        }
    }
}

kj_tok_t *kj_lex(kj_rs_t *rs, kj_arena_t *arena, const char *src, size_t len, size_t *n_tok) {
    lexer_t lx = {.rs = rs, .arena = arena, .at_line = 1, .at_col = 1};
    lx.src = kj_alloc(arena, len + 1);
    if (!lx.src) {
        kj_fail(rs, NULL, "template too large");
    }
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            lx.src[lx.len++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') {
                i++;
            }
        } else {
            lx.src[lx.len++] = src[i];
        }
    }
    if (lx.len > 0 && lx.src[lx.len - 1] == '\n') {
        lx.len--;
    }
    while (lx.pos < lx.len) {
        lex_text(&lx);
        if (lx.pos >= lx.len) {
            break;
        }
        size_t p = lx.pos;
        if (at(&lx, p, "{#")) {
            const char *e = NULL;
            for (size_t q = p + 2; q + 1 < lx.len; q++) {
                if (lx.src[q] == '#' && lx.src[q + 1] == '}') {
                    e = lx.src + q;
                    break;
                }
            }
            if (!e) {
                lex_fail(&lx, p, "missing #} at the end of a comment");
            }
            lx.pos = (size_t)(e - lx.src) + 2;
            continue;
        }
        bool is_stmt = at(&lx, p, "{%");
        emit(&lx, is_stmt ? KJ_T_OPEN_STMT : KJ_T_OPEN_EXPR, p, lx.src + p, 2);
        lx.pos = p + 2;
        if (lx.pos < lx.len && (lx.src[lx.pos] == '-' || lx.src[lx.pos] == '+')) {
            lx.pos++;
        }
        lex_tag(&lx, is_stmt);
    }
    emit(&lx, KJ_T_EOF, lx.len, "", 0);
    *n_tok = lx.n;
    return lx.tok;
}
