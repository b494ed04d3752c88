/* kg_json_schema: JSON Schema to grammar IR (see kg_json_schema.h). One
 * recursive walk over the schema; $ref targets become named rules (so a
 * recursive schema becomes a recursive grammar), everything else builds
 * expressions in place, from the schema-independent pieces of
 * kg_json_rules.c (any value, literals, integer ranges). */
#include "../grammar/kg_regex.h"
#include "kg_json_schema_int.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

/* ---- keywords ---- */

static const char *const annotations[] = {
    "title",    "description", "default",  "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions",
};

static const char *const supported[] = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "uniqueItems",
};

static bool in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(k, list[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Refuse keywords we do not implement (naming them), and uniqueItems true. */
static bool check_keywords(conv_t *c, json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (in_list(k, annotations, sizeof(annotations) / sizeof(*annotations))) {
            continue;
        }
        if (!in_list(k, supported, sizeof(supported) / sizeof(*supported)) ||
            (strcmp(k, "uniqueItems") == 0 && json_is_true(v))) {
            size_t saved = ptr_push(c, k);
            fail(c, "unsupported JSON Schema keyword '%s' at %s", k, here(c));
            ptr_pop(c, saved);
            return false;
        }
    }
    return true;
}

static bool get_count(conv_t *c, json_t *s, const char *key, int64_t *out) {
    json_t *v = json_object_get(s, key);
    if (!v) {
        return true;
    }
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
    if (!json_is_number(v) || d < 0 || d != floor(d) || d > 100000) {
        size_t saved = ptr_push(c, key);
        fail(c, "%s at %s: expected a non-negative integer up to 100000", key, here(c));
        ptr_pop(c, saved);
        return false;
    }
    *out = (int64_t)d;
    return true;
}

/* The integer bounds of s (minimum, maximum, exclusive forms). */
static bool int_bounds(conv_t *c, json_t *s, int64_t *lo, int64_t *hi, bool *any) {
    *lo = INT64_MIN;
    *hi = INT64_MAX;
    *any = false;
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(s, keys[i]);
        if (!v) {
            continue;
        }
        if (!json_is_number(v)) {
            size_t saved = ptr_push(c, keys[i]);
            fail(c, "%s at %s: expected a number", keys[i], here(c));
            ptr_pop(c, saved);
            return false;
        }
        double d = json_number_value(v);
        if (d < -9e15 || d > 9e15) {
            size_t saved = ptr_push(c, keys[i]);
            fail(c, "%s at %s: beyond +-9e15 is not supported", keys[i], here(c));
            ptr_pop(c, saved);
            return false;
        }
        *any = true;
        if (i < 2) {
            int64_t b = i == 0 ? (int64_t)ceil(d) : (int64_t)floor(d) + 1;
            *lo = b > *lo ? b : *lo;
        } else {
            int64_t b = i == 2 ? (int64_t)floor(d) : (int64_t)ceil(d) - 1;
            *hi = b < *hi ? b : *hi;
        }
    }
    return true;
}

/* ---- the walk ---- */

static int32_t gen(conv_t *c, json_t *s);

static int32_t gen_at(conv_t *c, json_t *s, const char *key) {
    size_t saved = ptr_push(c, key);
    int32_t e = gen(c, s);
    ptr_pop(c, saved);
    return e;
}

static json_t *resolve(conv_t *c, const char *ref) {
    if (ref[0] != '#') {
        fail(c, "$ref '%s' at %s: only local references (#...) are supported", ref, here(c));
        return NULL;
    }
    json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        fail(c, "$ref '%s' at %s: anchors are not supported, use a JSON pointer", ref, here(c));
        return NULL;
    }
    char tok[256];
    while (*p == '/') {
        p++;
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof(tok)) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                tok[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else if (*p == '%' && p[1] && p[2]) {
                char hx[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(hx, NULL, 16);
                p += 3;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end == '\0' && i >= 0 ? json_array_get(cur, (size_t)i) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur) {
            fail(c, "$ref '%s' at %s: no such location in the schema", ref, here(c));
            return NULL;
        }
    }
    return cur;
}

static int32_t gen_ref(conv_t *c, const char *ref) {
    for (int32_t i = 0; i < c->n_refs; i++) {
        if (strcmp(c->refs[i].ptr, ref) == 0) {
            return oom(c, kg_gir_ref(c->g, c->refs[i].rule));
        }
    }
    json_t *target = resolve(c, ref);
    if (!target) {
        return -1;
    }
    if (c->n_refs == c->cap_refs) {
        int32_t nc = c->cap_refs ? c->cap_refs * 2 : 16;
        ref_t *r = realloc(c->refs, (size_t)nc * sizeof(*r));
        if (!r) {
            return oom(c, -1);
        }
        c->refs = r;
        c->cap_refs = nc;
    }
    int32_t rule = oom(c, kg_gir_rule_new(c->g, "ref"));
    char *dup = strdup(ref);
    if (rule < 0 || !dup) {
        free(dup);
        return oom(c, -1);
    }
    c->refs[c->n_refs++] = (ref_t){dup, rule};
    /* the rule exists before its body is built, so the body may refer to it */
    char saved_ptr[sizeof(c->ptr)];
    size_t saved_len = c->ptr_len;
    memcpy(saved_ptr, c->ptr, saved_len + 1);
    snprintf(c->ptr, sizeof(c->ptr), "%s", ref + 1);
    c->ptr_len = strlen(c->ptr);
    int32_t body = gen(c, target);
    memcpy(c->ptr, saved_ptr, saved_len + 1);
    c->ptr_len = saved_len;
    if (body < 0 || !kg_gir_define(c->g, rule, body)) {
        return oom(c, -1);
    }
    return oom(c, kg_gir_ref(c->g, rule));
}

static int32_t gen_string(conv_t *c, json_t *s) {
    int64_t min = 0, max = -1;
    if (!get_count(c, s, "minLength", &min) || !get_count(c, s, "maxLength", &max)) {
        return -1;
    }
    if (max >= 0 && max < min) {
        return fail(c, "maxLength below minLength at %s", here(c));
    }
    return kg_json_string(c, s, min, max);
}

static int32_t gen_number(conv_t *c, json_t *s, bool integer) {
    int64_t lo, hi;
    bool bounded;
    if (!int_bounds(c, s, &lo, &hi, &bounded)) {
        return -1;
    }
    if (!integer && !bounded) {
        return kg_json_rules_number(c);
    }
    /* integers (and bounded numbers, which take the integers in range) */
    if (!bounded) {
        return kg_json_rules_regex(c, "-?(0|[1-9][0-9]{0,15})", false);
    }
    if (lo > hi) {
        return fail(c, "minimum above maximum at %s", here(c));
    }
    return kg_json_rules_int_range(c, lo, hi);
}

static int32_t gen_array(conv_t *c, json_t *s) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    int64_t min = 0, max = -1;
    if (!get_count(c, s, "minItems", &min) || !get_count(c, s, "maxItems", &max)) {
        return -1;
    }
    if (max >= 0 && max < min) {
        return fail(c, "maxItems below minItems at %s", here(c));
    }
    if (prefix && !json_is_array(prefix)) {
        return fail(c, "prefixItems at %s: expected an array", here(c));
    }
    size_t n_prefix = prefix ? json_array_size(prefix) : 0;
    if (max >= 0 && (int64_t)n_prefix > max) {
        n_prefix = (size_t)max;
    }
    /* elements: the prefix items, then `items` (absent: any value; false: none) */
    int32_t parts[256];
    int np = 0;
    parts[np++] = lit(c, "[");
    parts[np++] = kg_json_rules_ws(c);
    if (n_prefix > 250) {
        return fail(c, "prefixItems at %s: more than 250 items", here(c));
    }
    for (size_t i = 0; i < n_prefix; i++) {
        size_t saved = ptr_push(c, "prefixItems");
        size_t saved2 = ptr_push_index(c, i);
        int32_t e = gen(c, json_array_get(prefix, i));
        ptr_pop(c, saved2);
        ptr_pop(c, saved);
        if (i > 0) {
            e = oom(c, kg_gir_seq3(c->g, lit(c, ","), kg_json_rules_ws(c), e));
        }
        parts[np++] = oom(c, kg_gir_seq2(c->g, e, kg_json_rules_ws(c)));
    }
    bool more_allowed = !(items && json_is_false(items)) && (max < 0 || (int64_t)n_prefix < max);
    if (more_allowed) {
        int32_t item = items ? gen_at(c, items, "items") : kg_json_rules_value(c);
        int32_t item_ws = oom(c, kg_gir_seq2(c->g, item, kg_json_rules_ws(c)));
        int64_t need = min > (int64_t)n_prefix ? min - (int64_t)n_prefix : 0;
        int64_t room = max < 0 ? -1 : max - (int64_t)n_prefix;
        int32_t sep_item = oom(c, kg_gir_seq3(c->g, lit(c, ","), kg_json_rules_ws(c), item_ws));
        if (n_prefix > 0) {
            /* every further item follows a comma */
            parts[np++] = oom(c, kg_gir_repeat(c->g, sep_item, (int32_t)need,
                                               room < 0 ? KG_GIR_UNBOUNDED : (int32_t)room));
        } else {
            int32_t rest = oom(c, kg_gir_repeat(c->g, sep_item, need > 0 ? (int32_t)need - 1 : 0,
                                                room < 0 ? KG_GIR_UNBOUNDED : (int32_t)room - 1));
            int32_t some = oom(c, kg_gir_seq2(c->g, item_ws, rest));
            parts[np++] = need > 0 ? some : oom(c, kg_gir_opt(c->g, some));
        }
    } else if ((int64_t)n_prefix < min) {
        return fail(c, "minItems at %s cannot be met with items false", here(c));
    }
    parts[np++] = lit(c, "]");
    return oom(c, kg_gir_seq(c->g, parts, np));
}

typedef struct member {
    const char *key;
    json_t *schema;
    bool required;
} member_t;

/* Collect properties and required of an object schema (and of allOf
 * parts, merged) into members; *extra gets additionalProperties. */
static bool collect_object(conv_t *c,
                           json_t *s,
                           member_t *m,
                           int *n,
                           int cap,
                           json_t **extra,
                           json_t **req_lists,
                           int *n_req) {
    json_t *props = json_object_get(s, "properties");
    if (props && !json_is_object(props)) {
        fail(c, "properties at %s: expected an object", here(c));
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        for (int i = 0; i < *n; i++) {
            if (strcmp(m[i].key, k) == 0) {
                fail(c, "property '%s' at %s is defined twice (allOf)", k, here(c));
                return false;
            }
        }
        if (*n == cap) {
            fail(c, "more than %d properties at %s", cap, here(c));
            return false;
        }
        m[(*n)++] = (member_t){k, v, false};
    }
    json_t *req = json_object_get(s, "required");
    if (req) {
        if (!json_is_array(req) || *n_req == 16) {
            fail(c, "required at %s: expected an array of property names", here(c));
            return false;
        }
        req_lists[(*n_req)++] = req;
    }
    json_t *ap = json_object_get(s, "additionalProperties");
    if (ap) {
        if (!json_is_boolean(ap) && !json_is_object(ap)) {
            fail(c, "additionalProperties at %s: expected a boolean or a schema", here(c));
            return false;
        }
        /* the strictest wins: false over a schema over true */
        if (!*extra || json_is_false(ap) || (json_is_true(*extra) && json_is_object(ap))) {
            *extra = ap;
        }
    }
    return true;
}

/* A key that is none of the declared ones: a string that leaves every
 * declared key's spelling at some character, or stops where no key ends,
 * or runs on past a key. Built over the keys' prefixes; keys must be
 * printable ASCII without " or \ (refused otherwise). */
static int32_t other_key(conv_t *c, const member_t *m, int n) {
    if (n == 0) {
        return kg_json_rules_string(c);
    }
    for (int i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)m[i].key; *p; p++) {
            if (*p < 0x20 || *p >= 0x7F || *p == '"' || *p == '\\') {
                return fail(c,
                            "additionalProperties at %s: property names must be printable "
                            "ASCII without quotes or backslashes",
                            here(c));
            }
        }
    }
    int32_t rest = oom(c, kg_gir_repeat(c->g, kg_json_rules_char(c), 0, KG_GIR_UNBOUNDED));
    int32_t *alts = NULL;
    int na = 0, cap = 0;
    for (int i = 0; i < n && !c->failed; i++) {
        size_t len = strlen(m[i].key);
        for (size_t plen = 0; plen <= len; plen++) {
            /* each distinct prefix once: at the first key that has it */
            bool first = true;
            for (int j = 0; j < i && first; j++) {
                first = !(strlen(m[j].key) >= plen && memcmp(m[j].key, m[i].key, plen) == 0);
            }
            if (!first) {
                continue;
            }
            uint32_t lo[128], hi[128];
            int nl = 0;
            bool exact = false;
            for (int j = 0; j < n; j++) {
                size_t lj = strlen(m[j].key);
                if (lj < plen || memcmp(m[j].key, m[i].key, plen) != 0) {
                    continue;
                }
                if (lj == plen) {
                    exact = true;
                } else {
                    lo[nl] = hi[nl] = (unsigned char)m[j].key[plen];
                    nl++;
                }
            }
            if (na + 2 > cap) {
                cap = cap ? cap * 2 : 64;
                int32_t *na_ = realloc(alts, (size_t)cap * sizeof(*alts));
                if (!na_) {
                    free(alts);
                    return oom(c, -1);
                }
                alts = na_;
            }
            int32_t pre = plen ? oom(c, kg_gir_bytes(c->g, m[i].key, plen)) : kg_gir_empty(c->g);
            /* leave here: a character no key continues this prefix with
             * (none continue it: any character) */
            int32_t diff =
                nl > 0 ? oom(c, kg_regex_json_chars(c->g, kg_gir_chars(c->g, lo, hi, nl, true)))
                       : kg_json_rules_char(c);
            alts[na++] = oom(c, kg_gir_seq3(c->g, pre, diff, rest));
            if (!exact && plen > 0) {
                alts[na++] = pre; /* stop where no key ends */
            }
        }
    }
    int32_t body = c->failed ? -1 : oom(c, kg_gir_alt(c->g, alts, na));
    free(alts);
    return oom(c, kg_gir_seq3(c->g, lit(c, "\""), body, lit(c, "\"")));
}

static int32_t gen_object(conv_t *c, json_t *s) {
    member_t m[128];
    int n = 0, n_req = 0;
    json_t *extra = NULL, *req_lists[16];
    if (!collect_object(c, s, m, &n, 128, &extra, req_lists, &n_req)) {
        return -1;
    }
    json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all)) {
            return fail(c, "allOf at %s: expected an array", here(c));
        }
        size_t i;
        json_t *part;
        json_array_foreach(all, i, part) {
            size_t saved = ptr_push(c, "allOf");
            size_t saved2 = ptr_push_index(c, i);
            json_t *p = part;
            json_t *ref = json_object_get(part, "$ref");
            if (json_is_string(ref)) {
                p = resolve(c, json_string_value(ref));
            }
            bool ok = p && json_is_object(p) && check_keywords(c, p);
            json_t *t = ok ? json_object_get(p, "type") : NULL;
            if (ok && ((t && !(json_is_string(t) && strcmp(json_string_value(t), "object") == 0)) ||
                       json_object_get(p, "anyOf") || json_object_get(p, "oneOf") ||
                       json_object_get(p, "allOf") || json_object_get(p, "enum") ||
                       json_object_get(p, "const"))) {
                fail(c,
                     "allOf at %s: only object schemas (properties, required, "
                     "additionalProperties) can be combined",
                     here(c));
                ok = false;
            }
            ok = ok && collect_object(c, p, m, &n, 128, &extra, req_lists, &n_req);
            ptr_pop(c, saved2);
            ptr_pop(c, saved);
            if (!ok) {
                return fail(c, "allOf at %s cannot be combined", here(c));
            }
        }
    }
    for (int r = 0; r < n_req; r++) {
        size_t i;
        json_t *name;
        json_array_foreach(req_lists[r], i, name) {
            if (!json_is_string(name)) {
                return fail(c, "required at %s: expected property names", here(c));
            }
            bool found = false;
            for (int j = 0; j < n; j++) {
                if (strcmp(m[j].key, json_string_value(name)) == 0) {
                    m[j].required = found = true;
                }
            }
            if (!found) {
                /* required but not described: any value under that key,
                 * unless additionalProperties forbids other keys */
                if (extra && json_is_false(extra)) {
                    return fail(c,
                                "required property '%s' at %s is not in properties and "
                                "additionalProperties is false",
                                json_string_value(name), here(c));
                }
                if (n == 128) {
                    return fail(c, "more than 128 properties at %s", here(c));
                }
                m[n++] = (member_t){json_string_value(name), json_true(), true};
            }
        }
    }
    /* members: key ws ":" ws value ws, required first */
    int32_t mem[128];
    int order[128], no = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            if (m[i].required == (pass == 0)) {
                order[no++] = i;
            }
        }
    }
    for (int k = 0; k < n; k++) {
        const member_t *mb = &m[order[k]];
        json_t *key = json_string(mb->key);
        int32_t key_lit = key ? kg_json_rules_literal(c, key) : oom(c, -1);
        json_decref(key);
        size_t saved = ptr_push(c, "properties");
        int32_t value = gen_at(c, mb->schema, mb->key);
        ptr_pop(c, saved);
        int32_t parts[] = {key_lit, kg_json_rules_ws(c), lit(c, ":"), kg_json_rules_ws(c),
                           value,   kg_json_rules_ws(c)};
        mem[k] = oom(c, kg_gir_seq(c->g, parts, 6));
    }
    /* additional members: as additionalProperties says; absent, none when
     * properties are declared (strict, as OpenAI and XGrammar do), any when
     * the schema declares none ({"type": "object"} means any object) */
    if (!extra && n == 0) {
        extra = json_true();
    }
    int32_t extra_member = -1;
    if (extra && !json_is_false(extra)) {
        int32_t value =
            json_is_true(extra) ? kg_json_rules_value(c) : gen_at(c, extra, "additionalProperties");
        int32_t parts[] = {
            other_key(c, m, n), kg_json_rules_ws(c), lit(c, ":"), kg_json_rules_ws(c), value,
            kg_json_rules_ws(c)};
        extra_member = oom(c, kg_gir_seq(c->g, parts, 6));
    }
    int32_t comma = oom(c, kg_gir_seq2(c->g, lit(c, ","), kg_json_rules_ws(c)));
    int32_t extras_rest = extra_member >= 0
                              ? oom(c, kg_gir_repeat(c->g, kg_gir_seq2(c->g, comma, extra_member),
                                                     0, KG_GIR_UNBOUNDED))
                              : oom(c, kg_gir_empty(c->g));
    /* rest[k]: members k.. after something was written (each after a comma) */
    int32_t rest[129], first[129];
    rest[n] = extras_rest;
    for (int k = n - 1; k >= 0; k--) {
        int32_t one = oom(c, kg_gir_seq2(c->g, comma, mem[k]));
        if (!m[order[k]].required) {
            one = oom(c, kg_gir_opt(c->g, one));
        }
        rest[k] = oom(c, kg_gir_seq2(c->g, one, rest[k + 1]));
    }
    /* first[k]: nothing written yet, members k.. to choose from */
    first[n] = extra_member >= 0
                   ? oom(c, kg_gir_opt(c->g, kg_gir_seq2(c->g, extra_member, extras_rest)))
                   : oom(c, kg_gir_empty(c->g));
    for (int k = n - 1; k >= 0; k--) {
        int32_t take = oom(c, kg_gir_seq2(c->g, mem[k], rest[k + 1]));
        first[k] = m[order[k]].required ? take : oom(c, kg_gir_alt2(c->g, take, first[k + 1]));
    }
    int32_t parts[] = {lit(c, "{"), kg_json_rules_ws(c), first[0], lit(c, "}")};
    return oom(c, kg_gir_seq(c->g, parts, 4));
}

/* The type named `t` for schema s. */
static int32_t gen_type(conv_t *c, json_t *s, const char *t) {
    if (strcmp(t, "string") == 0) {
        return gen_string(c, s);
    }
    if (strcmp(t, "integer") == 0) {
        return gen_number(c, s, true);
    }
    if (strcmp(t, "number") == 0) {
        return gen_number(c, s, false);
    }
    if (strcmp(t, "boolean") == 0) {
        return oom(c, kg_gir_alt2(c->g, lit(c, "true"), lit(c, "false")));
    }
    if (strcmp(t, "null") == 0) {
        return lit(c, "null");
    }
    if (strcmp(t, "object") == 0) {
        return gen_object(c, s);
    }
    if (strcmp(t, "array") == 0) {
        return gen_array(c, s);
    }
    size_t saved = ptr_push(c, "type");
    fail(c, "unknown type '%s' at %s", t, here(c));
    ptr_pop(c, saved);
    return -1;
}

/* Whether s has keywords that constrain the value besides `except`. */
static const char *constraint_besides(json_t *s, const char *except) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (strcmp(k, except) != 0 &&
            !in_list(k, annotations, sizeof(annotations) / sizeof(*annotations)) &&
            !(strcmp(k, "uniqueItems") == 0)) {
            return k;
        }
    }
    return NULL;
}

static int32_t gen(conv_t *c, json_t *s) {
    if (c->failed) {
        return -1;
    }
    if (json_is_true(s)) {
        return kg_json_rules_value(c);
    }
    if (json_is_false(s)) {
        return fail(c, "the schema at %s is false: nothing is valid", here(c));
    }
    if (!json_is_object(s)) {
        return fail(c, "the schema at %s is not an object or a boolean", here(c));
    }
    if (++c->depth > MAX_DEPTH) {
        c->depth--;
        return fail(c, "the schema at %s is nested deeper than %d levels", here(c), MAX_DEPTH);
    }
    int32_t e = -1;
    json_t *v;
    const char *other;
    if (!check_keywords(c, s)) {
        goto out;
    }
    if ((v = json_object_get(s, "$ref"))) {
        if (!json_is_string(v)) {
            e = fail(c, "$ref at %s: expected a string", here(c));
        } else if ((other = constraint_besides(s, "$ref"))) {
            e = fail(c, "'%s' beside $ref at %s is not supported (put it in the referenced schema)",
                     other, here(c));
        } else {
            e = gen_ref(c, json_string_value(v));
        }
        goto out;
    }
    if ((v = json_object_get(s, "const"))) {
        e = kg_json_rules_literal(c, v);
        goto out;
    }
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0) {
            e = fail(c, "enum at %s: expected a non-empty array", here(c));
            goto out;
        }
        size_t n = json_array_size(v);
        int32_t *alts = malloc(n * sizeof(*alts));
        if (!alts) {
            e = oom(c, -1);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            alts[i] = kg_json_rules_literal(c, json_array_get(v, i));
        }
        e = c->failed ? -1 : oom(c, kg_gir_alt(c->g, alts, (int32_t)n));
        free(alts);
        goto out;
    }
    json_t *any = json_object_get(s, "anyOf");
    const char *any_key = "anyOf";
    if (!any) {
        any = json_object_get(s, "oneOf");
        any_key = "oneOf";
    }
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0) {
            e = fail(c, "%s at %s: expected a non-empty array", any_key, here(c));
            goto out;
        }
        if ((other = constraint_besides(s, any_key))) {
            e = fail(c, "'%s' beside %s at %s is not supported (put it in each branch)", other,
                     any_key, here(c));
            goto out;
        }
        size_t n = json_array_size(any);
        int32_t *alts = malloc(n * sizeof(*alts));
        if (!alts) {
            e = oom(c, -1);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            size_t saved = ptr_push(c, any_key);
            size_t saved2 = ptr_push_index(c, i);
            alts[i] = gen(c, json_array_get(any, i));
            ptr_pop(c, saved2);
            ptr_pop(c, saved);
        }
        e = c->failed ? -1 : oom(c, kg_gir_alt(c->g, alts, (int32_t)n));
        free(alts);
        goto out;
    }
    json_t *type = json_object_get(s, "type");
    if (!type) {
        /* infer from the keywords present, else any value */
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties") || json_object_get(s, "allOf")) {
            e = gen_object(c, s);
        } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
                   json_object_get(s, "minItems") || json_object_get(s, "maxItems")) {
            e = gen_array(c, s);
        } else if (json_object_get(s, "pattern") || json_object_get(s, "format") ||
                   json_object_get(s, "minLength") || json_object_get(s, "maxLength")) {
            e = gen_string(c, s);
        } else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                   json_object_get(s, "exclusiveMinimum") ||
                   json_object_get(s, "exclusiveMaximum")) {
            e = gen_number(c, s, false);
        } else {
            e = kg_json_rules_value(c);
        }
        goto out;
    }
    if (json_is_string(type)) {
        e = gen_type(c, s, json_string_value(type));
        goto out;
    }
    if (json_is_array(type) && json_array_size(type) > 0) {
        int32_t alts[8];
        size_t n = json_array_size(type);
        if (n > 7) {
            e = fail(c, "type at %s: too many types", here(c));
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(type, i);
            if (!json_is_string(t)) {
                e = fail(c, "type at %s: expected type names", here(c));
                goto out;
            }
            alts[i] = gen_type(c, s, json_string_value(t));
        }
        e = c->failed ? -1 : oom(c, kg_gir_alt(c->g, alts, (int32_t)n));
        goto out;
    }
    e = fail(c, "type at %s: expected a string or an array of strings", here(c));
out:
    c->depth--;
    return c->failed ? -1 : e;
}

static kg_gir_t *finish(conv_t *c, int32_t body) {
    int32_t root = body >= 0 ? kg_gir_rule(c->g, "root", 4) : -1;
    if (body < 0 || root < 0 || !kg_gir_define(c->g, root, body) || !kg_gir_ok(c->g)) {
        if (!c->failed) {
            snprintf(c->errstr, c->errstr_size, "schema: out of memory");
        }
        kg_gir_free(c->g);
        c->g = NULL;
        return NULL;
    }
    kg_gir_set_root(c->g, root);
    return c->g;
}

static void conv_init(conv_t *c, char *errstr, size_t errstr_size) {
    memset(c, 0, sizeof(*c));
    c->errstr = errstr;
    c->errstr_size = errstr_size;
    c->r_ws = c->r_char = c->r_string = c->r_number = c->r_value = -1;
    c->g = kg_gir_new();
}

kg_gir_t *kg_json_schema_gir(const char *schema, size_t len, char *errstr, size_t errstr_size) {
    conv_t c;
    conv_init(&c, errstr, errstr_size);
    json_error_t jerr;
    c.root = json_loadb(schema, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    kg_gir_t *out = NULL;
    if (!c.g) {
        snprintf(errstr, errstr_size, "schema: out of memory");
    } else if (!c.root) {
        snprintf(errstr, errstr_size, "schema: not JSON: %s", jerr.text);
        kg_gir_free(c.g);
    } else {
        out = finish(&c, gen(&c, c.root));
    }
    json_decref(c.root);
    for (int32_t i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ptr);
    }
    free(c.refs);
    return out;
}

kg_gir_t *kg_json_schemas_gir(const char *schemas,
                              size_t len,
                              const char *what,
                              kg_json_schema_wrap_fn wrap,
                              void *ctx,
                              char *errstr,
                              size_t errstr_size) {
    conv_t c;
    conv_init(&c, errstr, errstr_size);
    json_error_t jerr;
    json_t *all = json_loadb(schemas, len, JSON_REJECT_DUPLICATES, &jerr);
    kg_gir_t *out = NULL;
    size_t n = json_array_size(all);
    int32_t *docs = calloc(n ? n : 1, sizeof(*docs));
    if (!c.g || !docs) {
        snprintf(errstr, errstr_size, "schema: out of memory");
        kg_gir_free(c.g);
    } else if (!json_is_array(all) || n > INT32_MAX) {
        snprintf(errstr, errstr_size, "schemas: not a JSON array: %s", all ? "" : jerr.text);
        kg_gir_free(c.g);
    } else {
        int32_t body = 0;
        for (size_t i = 0; i < n && body >= 0; i++) {
            /* each schema is a document of its own: its pointers, its $refs */
            c.root = json_array_get(all, i);
            for (int32_t r = 0; r < c.n_refs; r++) {
                free(c.refs[r].ptr);
            }
            c.n_refs = 0;
            int w = snprintf(c.ptr, MAX_POINTER, "%s[%zu].function.parameters", what, i);
            c.ptr_len = w > 0 && w < MAX_POINTER ? (size_t)w : 0;
            docs[i] = body = gen(&c, c.root);
        }
        c.ptr_len = 0;
        c.ptr[0] = '\0';
        if (body >= 0) {
            body = wrap(c.g, docs, (int32_t)n, ctx, errstr, errstr_size);
            c.failed |= body < 0;
        }
        out = finish(&c, body);
    }
    free(docs);
    json_decref(all);
    for (int32_t i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ptr);
    }
    free(c.refs);
    return out;
}

kg_gir_t *kg_json_object_gir(char *errstr, size_t errstr_size) {
    conv_t c;
    conv_init(&c, errstr, errstr_size);
    if (!c.g) {
        snprintf(errstr, errstr_size, "schema: out of memory");
        return NULL;
    }
    kg_json_rules_value(&c);
    int32_t obj = c.failed ? -1 : kg_gir_ref(c.g, kg_gir_rule(c.g, "object", 6));
    return finish(&c, obj);
}

kg_gir_t *
kg_json_schema_builder(const kg_constraint_t *k, char *errstr, size_t errstr_size, void *ctx) {
    (void)ctx;
    if (k->kind == KG_CONSTRAINT_JSON_OBJECT) {
        return kg_json_object_gir(errstr, errstr_size);
    }
    return kg_json_schema_gir(k->text, k->len, errstr, errstr_size);
}
