/* kg_constraint: regex, choice and GBNF constraints to grammar IR. */
#include "kg_constraint.h"

#include "kg_gbnf.h"
#include "kg_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kg_constraint_kind_str(kg_constraint_kind_t kind) {
    switch (kind) {
    case KG_CONSTRAINT_JSON_OBJECT:
        return "json_object";
    case KG_CONSTRAINT_JSON_SCHEMA:
        return "json_schema";
    case KG_CONSTRAINT_REGEX:
        return "regex";
    case KG_CONSTRAINT_CHOICE:
        return "choice";
    case KG_CONSTRAINT_GRAMMAR:
        return "grammar";
    case KG_CONSTRAINT_TOOL_CALLS:
        return "tool_calls";
    default:
        return "none";
    }
}

kg_gir_t *kg_constraint_regex(const char *re, size_t len, char *errstr, size_t errstr_size) {
    kg_gir_t *g = kg_gir_new();
    if (!g) {
        snprintf(errstr, errstr_size, "regex: out of memory");
        return NULL;
    }
    kg_regex_opts_t o = {.search = false, .json_string = false};
    int32_t e = kg_regex_to_gir(g, re, len, &o, errstr, errstr_size);
    int32_t root = kg_gir_rule(g, "root", 4);
    if (e < 0 || !kg_gir_define(g, root, e) || !kg_gir_ok(g)) {
        if (e >= 0) {
            snprintf(errstr, errstr_size, "regex: out of memory");
        }
        kg_gir_free(g);
        return NULL;
    }
    kg_gir_set_root(g, root);
    return g;
}

kg_gir_t *kg_constraint_choice(
    const char *const *items, const size_t *lens, int32_t n, char *errstr, size_t errstr_size) {
    kg_gir_t *g = kg_gir_new();
    int32_t *alts = malloc((size_t)(n > 0 ? n : 1) * sizeof(*alts));
    if (!g || !alts || n < 1) {
        snprintf(errstr, errstr_size, n < 1 ? "choice: no strings" : "choice: out of memory");
        kg_gir_free(g);
        free(alts);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        alts[i] = kg_gir_bytes(g, items[i], lens[i]);
    }
    int32_t root = kg_gir_rule(g, "root", 4);
    bool ok = kg_gir_define(g, root, kg_gir_alt(g, alts, n)) && kg_gir_ok(g);
    free(alts);
    if (!ok) {
        snprintf(errstr, errstr_size, "choice: out of memory");
        kg_gir_free(g);
        return NULL;
    }
    kg_gir_set_root(g, root);
    return g;
}

kg_gir_t *kg_constraint_gbnf(const char *text, size_t len, char *errstr, size_t errstr_size) {
    kg_gir_t *g = kg_gir_new();
    if (!g) {
        snprintf(errstr, errstr_size, "grammar: out of memory");
        return NULL;
    }
    if (!kg_gbnf_parse(g, text, len, errstr, errstr_size)) {
        kg_gir_free(g);
        return NULL;
    }
    return g;
}

char *
kg_constraint_choice_encode(const char *const *items, const size_t *lens, int32_t n, size_t *len) {
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        total += 4 + lens[i];
    }
    char *out = malloc(total > 0 ? total : 1);
    if (!out) {
        return NULL;
    }
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)lens[i];
        for (int k = 0; k < 4; k++) {
            out[at++] = (char)((l >> (8 * k)) & 0xFF);
        }
        memcpy(out + at, items[i], lens[i]);
        at += lens[i];
    }
    *len = total;
    return out;
}

/* Split the encoded choice list; false when malformed. */
static bool choice_decode(
    const char *s, size_t len, const char **items, size_t *lens, int32_t cap, int32_t *n) {
    size_t at = 0;
    *n = 0;
    while (at < len) {
        if (len - at < 4 || *n == cap) {
            return false;
        }
        uint32_t l = 0;
        for (int k = 0; k < 4; k++) {
            l |= (uint32_t)(unsigned char)s[at + (size_t)k] << (8 * k);
        }
        at += 4;
        if (l > len - at) {
            return false;
        }
        items[*n] = s + at;
        lens[(*n)++] = l;
        at += l;
    }
    return true;
}

kg_gir_t *kg_constraint_build(const kg_constraint_t *c,
                              kg_gir_builder_fn json,
                              void *json_ctx,
                              char *errstr,
                              size_t errstr_size) {
    switch (c->kind) {
    case KG_CONSTRAINT_REGEX:
        return kg_constraint_regex(c->text, c->len, errstr, errstr_size);
    case KG_CONSTRAINT_GRAMMAR:
        return kg_constraint_gbnf(c->text, c->len, errstr, errstr_size);
    case KG_CONSTRAINT_CHOICE: {
        int32_t cap = (int32_t)(c->len / 4 + 1), n = 0;
        const char **items = malloc((size_t)cap * sizeof(*items));
        size_t *lens = malloc((size_t)cap * sizeof(*lens));
        kg_gir_t *g = NULL;
        if (!items || !lens) {
            snprintf(errstr, errstr_size, "choice: out of memory");
        } else if (!choice_decode(c->text, c->len, items, lens, cap, &n)) {
            snprintf(errstr, errstr_size, "choice: malformed list");
        } else {
            g = kg_constraint_choice(items, lens, n, errstr, errstr_size);
        }
        free(items);
        free(lens);
        return g;
    }
    case KG_CONSTRAINT_JSON_OBJECT:
    case KG_CONSTRAINT_JSON_SCHEMA:
    case KG_CONSTRAINT_TOOL_CALLS:
        if (json) {
            return json(c, errstr, errstr_size, json_ctx);
        }
        snprintf(errstr, errstr_size, "%s constraints are not available here",
                 kg_constraint_kind_str(c->kind));
        return NULL;
    default:
        snprintf(errstr, errstr_size, "no constraint");
        return NULL;
    }
}
