/* kg_toolcall_json: a raw JSON scanner for the tool-call parser. It finds
 * where a value ends without building it, so a call's arguments keep the
 * exact text the model wrote (spacing and key order, as llama.cpp returns
 * them), and tells a value cut by the output's end (partial) from one that
 * is not JSON (bad). Strict RFC 8259 but for the depth limit below. */
#include "kg_toolcall_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Model output is outside input: nesting deeper than this is refused rather
 * than recursed into (a fuzzer's [[[[... would otherwise blow the stack). */
#define MAX_DEPTH 128

size_t kg_tc_ws(const char *s, size_t len, size_t i) {
    while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) {
        i++;
    }
    return i;
}

static kg_jspan_t span(size_t start, size_t end, bool partial, bool bad) {
    kg_jspan_t v = {start, end, partial, bad};
    return v;
}

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static kg_jspan_t scan_string(const char *s, size_t len, size_t i) {
    size_t start = i++;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') {
            return span(start, i + 1, false, false);
        }
        if (c < 0x20) {
            return span(start, i, false, true);
        }
        if (c == '\\') {
            if (i + 1 >= len) {
                break;
            }
            char e = s[i + 1];
            if (e == 'u') {
                for (size_t k = 2; k < 6; k++) {
                    if (i + k >= len) {
                        return span(start, len, true, false);
                    }
                    if (!is_hex(s[i + k])) {
                        return span(start, i, false, true);
                    }
                }
                i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) {
                return span(start, i, false, true);
            }
            i += 2;
            continue;
        }
        i++;
    }
    return span(start, len, true, false);
}

static kg_jspan_t scan_number(const char *s, size_t len, size_t i) {
    size_t start = i;
    if (i < len && s[i] == '-') {
        i++;
    }
    if (i >= len) {
        return span(start, len, true, false);
    }
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
    } else {
        return span(start, i, false, true);
    }
    if (i < len && s[i] == '.') {
        size_t d = ++i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
        if (i == d) {
            return i >= len ? span(start, len, true, false) : span(start, i, false, true);
        }
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-')) {
            i++;
        }
        size_t d = i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
        if (i == d) {
            return i >= len ? span(start, len, true, false) : span(start, i, false, true);
        }
    }
    /* a number the text ends on may go on: partial, as llama.cpp's lenient parse keeps it */
    return span(start, i, i >= len, false);
}

static kg_jspan_t scan_value(const char *s, size_t len, size_t i, int depth);

/* An array or an object from its opening bracket. */
static kg_jspan_t scan_container(const char *s, size_t len, size_t i, int depth) {
    size_t start = i;
    char close = s[i] == '{' ? '}' : ']';
    bool obj = close == '}';
    if (depth >= MAX_DEPTH) {
        return span(start, i, false, true);
    }
    i = kg_tc_ws(s, len, i + 1);
    if (i < len && s[i] == close) {
        return span(start, i + 1, false, false);
    }
    for (;;) {
        if (i >= len) {
            return span(start, len, true, false);
        }
        if (obj) {
            if (s[i] != '"') {
                return span(start, i, false, true);
            }
            kg_jspan_t k = scan_string(s, len, i);
            if (k.bad || k.partial) {
                return span(start, k.end, k.partial, k.bad);
            }
            i = kg_tc_ws(s, len, k.end);
            if (i >= len) {
                return span(start, len, true, false);
            }
            if (s[i] != ':') {
                return span(start, i, false, true);
            }
            i = kg_tc_ws(s, len, i + 1);
        }
        kg_jspan_t v = scan_value(s, len, i, depth + 1);
        if (v.bad || v.partial) {
            return span(start, v.end, v.partial, v.bad);
        }
        i = kg_tc_ws(s, len, v.end);
        if (i >= len) {
            return span(start, len, true, false);
        }
        if (s[i] == close) {
            return span(start, i + 1, false, false);
        }
        if (s[i] != ',') {
            return span(start, i, false, true);
        }
        i = kg_tc_ws(s, len, i + 1);
    }
}

static kg_jspan_t scan_literal(const char *s, size_t len, size_t i, const char *word) {
    size_t n = strlen(word);
    size_t have = len - i < n ? len - i : n;
    if (memcmp(s + i, word, have) != 0) {
        return span(i, i, false, true);
    }
    return have < n ? span(i, len, true, false) : span(i, i + n, false, false);
}

static kg_jspan_t scan_value(const char *s, size_t len, size_t i, int depth) {
    if (i >= len) {
        return span(i, len, true, false);
    }
    switch (s[i]) {
    case '{':
    case '[':
        return scan_container(s, len, i, depth);
    case '"':
        return scan_string(s, len, i);
    case 't':
        return scan_literal(s, len, i, "true");
    case 'f':
        return scan_literal(s, len, i, "false");
    case 'n':
        return scan_literal(s, len, i, "null");
    default:
        return scan_number(s, len, i);
    }
}

kg_jspan_t kg_tc_json_value(const char *s, size_t len, size_t i) {
    return scan_value(s, len, kg_tc_ws(s, len, i), 0);
}

/* Whether the complete string token at [k.start, k.end) spells `key`
 * (keys with escapes never match: no call syntax escapes its own keys). */
static bool key_is(const char *s, const kg_jspan_t *k, const char *key) {
    size_t n = strlen(key);
    return k->end - k->start == n + 2 && memcmp(s + k->start + 1, key, n) == 0;
}

bool kg_tc_json_member(const char *s, const kg_jspan_t *obj, const char *key, kg_jspan_t *val) {
    size_t len = obj->end;
    size_t i = obj->start;
    if (obj->bad || i >= len || s[i] != '{') {
        return false;
    }
    i = kg_tc_ws(s, len, i + 1);
    while (i < len && s[i] == '"') {
        kg_jspan_t k = scan_string(s, len, i);
        if (k.bad || k.partial) {
            return false;
        }
        i = kg_tc_ws(s, len, k.end);
        if (i >= len || s[i] != ':') {
            return false;
        }
        kg_jspan_t v = kg_tc_json_value(s, len, i + 1);
        if (v.bad) {
            return false;
        }
        if (key_is(s, &k, key)) {
            *val = v;
            return true;
        }
        if (v.partial) {
            return false;
        }
        i = kg_tc_ws(s, len, v.end);
        if (i >= len || s[i] != ',') {
            return false;
        }
        i = kg_tc_ws(s, len, i + 1);
    }
    return false;
}

static unsigned hex4(const char *p) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static void put_utf8(kg_tcbuf_t *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        u[0] = (char)(0xf0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    kg_tcbuf_put(b, u, n);
}

char *kg_tc_json_string(const char *s, const kg_jspan_t *v) {
    if (v->bad || v->partial || v->end - v->start < 2 || s[v->start] != '"') {
        return NULL;
    }
    kg_tcbuf_t b = {0};
    for (size_t i = v->start + 1; i + 1 < v->end; i++) {
        if (s[i] != '\\') {
            kg_tcbuf_put(&b, s + i, 1);
            continue;
        }
        char e = s[++i];
        if (e == 'u') {
            unsigned cp = hex4(s + i + 1);
            i += 4;
            /* a surrogate pair joins; a lone surrogate becomes U+FFFD */
            if (cp >= 0xd800 && cp < 0xdc00 && i + 6 < v->end && s[i + 1] == '\\' &&
                s[i + 2] == 'u') {
                unsigned lo = hex4(s + i + 3);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    i += 6;
                }
            }
            put_utf8(&b, cp >= 0xd800 && cp < 0xe000 ? 0xfffd : cp);
            continue;
        }
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        kg_tcbuf_put(&b, to + (strchr(from, e) - from), 1);
    }
    return kg_tcbuf_take(&b);
}

void kg_tcbuf_put(kg_tcbuf_t *b, const char *s, size_t n) {
    if (b->oom) {
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void kg_tcbuf_puts(kg_tcbuf_t *b, const char *s) {
    kg_tcbuf_put(b, s, strlen(s));
}

void kg_tcbuf_put_json_chars(kg_tcbuf_t *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"':
            kg_tcbuf_put(b, "\\\"", 2);
            break;
        case '\\':
            kg_tcbuf_put(b, "\\\\", 2);
            break;
        case '\b':
            kg_tcbuf_put(b, "\\b", 2);
            break;
        case '\f':
            kg_tcbuf_put(b, "\\f", 2);
            break;
        case '\n':
            kg_tcbuf_put(b, "\\n", 2);
            break;
        case '\r':
            kg_tcbuf_put(b, "\\r", 2);
            break;
        case '\t':
            kg_tcbuf_put(b, "\\t", 2);
            break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", c);
                kg_tcbuf_put(b, esc, 6);
            } else {
                kg_tcbuf_put(b, s + i, 1);
            }
        }
    }
}

char *kg_tcbuf_take(kg_tcbuf_t *b) {
    if (b->oom) {
        free(b->p);
        memset(b, 0, sizeof(*b));
        return NULL;
    }
    if (!b->p) {
        kg_tcbuf_put(b, "", 0);
        if (b->oom) {
            return NULL;
        }
        b->p[0] = '\0';
    }
    char *p = b->p;
    memset(b, 0, sizeof(*b));
    return p;
}
