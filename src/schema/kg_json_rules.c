/* kg_json_rules: the grammar pieces a JSON Schema's grammar is built from,
 * none of which depends on the schema: whitespace, strings, numbers and any
 * JSON value as llama.cpp's json-schema-to-grammar writes them, a value's
 * exact text, and the integers of a range digit by digit. The schema walk
 * that assembles them is kg_json_schema.c. */
#include "../grammar/kg_regex.h"
#include "kg_json_schema_int.h"

#include <inttypes.h>
#include <stdlib.h>

#define MAX_INT_DIGITS 16 /* unbounded integers: at most this many digits */

/* ---- shared rules ---- */

int32_t kg_json_rules_regex(conv_t *c, const char *re, bool json_string) {
    kg_regex_opts_t o = {.search = false, .json_string = json_string};
    char err[200];
    int32_t e = kg_regex_to_gir(c->g, re, strlen(re), &o, err, sizeof(err));
    if (e < 0) {
        return fail(c, "schema: internal pattern failed: %s", err);
    }
    return e;
}

static int32_t define(conv_t *c, int32_t *slot, const char *name, int32_t (*make)(conv_t *)) {
    if (*slot < 0) {
        *slot = oom(c, kg_gir_rule(c->g, name, strlen(name)));
        if (*slot < 0) {
            return -1;
        }
        int32_t e = make(c);
        if (e < 0 || !kg_gir_define(c->g, *slot, e)) {
            return oom(c, -1);
        }
    }
    return oom(c, kg_gir_ref(c->g, *slot));
}

/* llama.cpp's json-schema-to-grammar space: nothing, one space, or a
 * newline and up to 20 spaces or tabs */
static int32_t make_ws(conv_t *c) {
    return kg_json_rules_regex(c, "( |\\n[ \\t]{0,20})?", false);
}

int32_t kg_json_rules_ws(conv_t *c) {
    return define(c, &c->r_ws, "ws", make_ws);
}

/* one character of a JSON string body: raw, or an escape that decodes to
 * a code point that is not a lone surrogate */
static int32_t make_char(conv_t *c) {
    return kg_json_rules_regex(
        c,
        "[^\"\\\\\\x00-\\x1f]|\\\\([\"\\\\/bfnrt]|u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7]"
        "[0-9a-fA-F]{2}))",
        false);
}

int32_t kg_json_rules_char(conv_t *c) {
    return define(c, &c->r_char, "char", make_char);
}

static int32_t make_string(conv_t *c) {
    int32_t body = oom(c, kg_gir_repeat(c->g, kg_json_rules_char(c), 0, KG_GIR_UNBOUNDED));
    return oom(c, kg_gir_seq3(c->g, lit(c, "\""), body, lit(c, "\"")));
}

int32_t kg_json_rules_string(conv_t *c) {
    return define(c, &c->r_string, "string", make_string);
}

static int32_t make_number(conv_t *c) {
    return kg_json_rules_regex(c, "-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?([eE][-+]?[0-9]{1,3})?",
                               false);
}

int32_t kg_json_rules_number(conv_t *c) {
    return define(c, &c->r_number, "number", make_number);
}

int32_t kg_json_rules_value(conv_t *c);

/* "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}" */
static int32_t any_object_body(conv_t *c) {
    int32_t kv[] = {kg_json_rules_string(c), kg_json_rules_ws(c),    lit(c, ":"),
                    kg_json_rules_ws(c),     kg_json_rules_value(c), kg_json_rules_ws(c)};
    int32_t member = oom(c, kg_gir_seq(c->g, kv, 6));
    int32_t more =
        oom(c, kg_gir_repeat(c->g, kg_gir_seq3(c->g, lit(c, ","), kg_json_rules_ws(c), member), 0,
                             KG_GIR_UNBOUNDED));
    int32_t body = oom(c, kg_gir_opt(c->g, kg_gir_seq2(c->g, member, more)));
    int32_t parts[] = {lit(c, "{"), kg_json_rules_ws(c), body, lit(c, "}")};
    return oom(c, kg_gir_seq(c->g, parts, 4));
}

static int32_t any_array_body(conv_t *c) {
    int32_t item = oom(c, kg_gir_seq2(c->g, kg_json_rules_value(c), kg_json_rules_ws(c)));
    int32_t more =
        oom(c, kg_gir_repeat(c->g, kg_gir_seq3(c->g, lit(c, ","), kg_json_rules_ws(c), item), 0,
                             KG_GIR_UNBOUNDED));
    int32_t body = oom(c, kg_gir_opt(c->g, kg_gir_seq2(c->g, item, more)));
    int32_t parts[] = {lit(c, "["), kg_json_rules_ws(c), body, lit(c, "]")};
    return oom(c, kg_gir_seq(c->g, parts, 4));
}

static int32_t make_value(conv_t *c) {
    int32_t r_obj = oom(c, kg_gir_rule(c->g, "object", 6));
    int32_t r_arr = oom(c, kg_gir_rule(c->g, "array", 5));
    if (r_obj < 0 || r_arr < 0) {
        return -1;
    }
    int32_t alts[] = {kg_gir_ref(c->g, r_obj), kg_gir_ref(c->g, r_arr), kg_json_rules_string(c),
                      kg_json_rules_number(c), lit(c, "true"),          lit(c, "false"),
                      lit(c, "null")};
    int32_t v = oom(c, kg_gir_alt(c->g, alts, 7));
    /* the bodies refer back to value: define them once value's rule exists */
    return v;
}

int32_t kg_json_rules_value(conv_t *c) {
    if (c->r_value < 0) {
        int32_t ref = define(c, &c->r_value, "value", make_value);
        if (ref < 0) {
            return -1;
        }
        int32_t r_obj = kg_gir_rule(c->g, "object", 6), r_arr = kg_gir_rule(c->g, "array", 5);
        int32_t ob = any_object_body(c), ab = any_array_body(c);
        if (ob < 0 || ab < 0 || !kg_gir_define(c->g, r_obj, ob) ||
            !kg_gir_define(c->g, r_arr, ab)) {
            return oom(c, -1);
        }
        return ref;
    }
    return oom(c, kg_gir_ref(c->g, c->r_value));
}

/* ---- literals ---- */

int32_t kg_json_rules_literal(conv_t *c, json_t *v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        return fail(c, "schema: cannot write a value at %s", here(c));
    }
    int32_t e = lit(c, text);
    free(text);
    return e;
}

/* ---- integers in a range ---- */

/* Numbers of exactly n digits from lo to hi (same length, strings). */
static int32_t digits_range(conv_t *c, const char *lo, const char *hi, int n) {
    if (n == 0) {
        return oom(c, kg_gir_empty(c->g));
    }
    bool lo_zero = true, hi_nine = true;
    for (int i = 1; i < n; i++) {
        lo_zero = lo_zero && lo[i] == '0';
        hi_nine = hi_nine && hi[i] == '9';
    }
    uint32_t d0 = '0', d9 = '9';
    int32_t any_digit = oom(c, kg_gir_chars(c->g, &d0, &d9, 1, false));
    int32_t tail_any = oom(c, kg_gir_repeat(c->g, any_digit, n - 1, n - 1));
    if (lo[0] == hi[0]) {
        char one[2] = {lo[0], 0};
        return oom(c, kg_gir_seq2(c->g, lit(c, one), digits_range(c, lo + 1, hi + 1, n - 1)));
    }
    if (lo_zero && hi_nine) {
        uint32_t a = (uint32_t)lo[0], b = (uint32_t)hi[0];
        return oom(c, kg_gir_seq2(c->g, kg_gir_chars(c->g, &a, &b, 1, false), tail_any));
    }
    int32_t alts[3];
    int na = 0;
    char nines[24], zeros[24];
    memset(nines, '9', sizeof(nines));
    memset(zeros, '0', sizeof(zeros));
    char one[2] = {lo[0], 0};
    alts[na++] = oom(c, kg_gir_seq2(c->g, lit(c, one), digits_range(c, lo + 1, nines, n - 1)));
    if (lo[0] + 1 <= hi[0] - 1) {
        uint32_t a = (uint32_t)lo[0] + 1, b = (uint32_t)hi[0] - 1;
        alts[na++] = oom(c, kg_gir_seq2(c->g, kg_gir_chars(c->g, &a, &b, 1, false), tail_any));
    }
    one[0] = hi[0];
    alts[na++] = oom(c, kg_gir_seq2(c->g, lit(c, one), digits_range(c, zeros, hi + 1, n - 1)));
    return oom(c, kg_gir_alt(c->g, alts, na));
}

/* Non-negative integers lo..hi (hi < 0: unbounded, at most MAX_INT_DIGITS). */
static int32_t uint_range(conv_t *c, uint64_t lo, int64_t hi_in) {
    bool unbounded = hi_in < 0;
    uint64_t hi = unbounded ? 9999999999999999ull : (uint64_t)hi_in;
    if (lo > hi) {
        return -2; /* empty */
    }
    char a[24], b[24];
    int32_t alts[24];
    int na = 0;
    uint64_t from = lo;
    while (from <= hi) {
        int nd = snprintf(a, sizeof(a), "%" PRIu64, from);
        uint64_t top = 9; /* the largest number of nd digits */
        for (int i = 1; i < nd; i++) {
            top = top * 10 + 9;
        }
        uint64_t to = hi < top ? hi : top;
        snprintf(b, sizeof(b), "%" PRIu64, to);
        alts[na++] = digits_range(c, a, b, nd);
        if (to == hi || na == 23) {
            break;
        }
        from = to + 1;
    }
    return oom(c, kg_gir_alt(c->g, alts, na));
}

/* Integers lo..hi with INT64_MIN / INT64_MAX meaning unbounded. */
int32_t kg_json_rules_int_range(conv_t *c, int64_t lo, int64_t hi) {
    int32_t alts[2];
    int na = 0;
    if (lo < 0) {
        /* -(1 .. -lo), limited by hi when hi < 0 */
        uint64_t mag_hi = lo == INT64_MIN ? 0 : (uint64_t)(-lo);
        uint64_t mag_lo = hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 1;
        int32_t r = uint_range(c, mag_lo, lo == INT64_MIN ? -1 : (int64_t)mag_hi);
        if (r >= 0) {
            alts[na++] = oom(c, kg_gir_seq2(c->g, lit(c, "-"), r));
        }
    }
    if (hi >= 0) {
        int32_t r = uint_range(c, lo > 0 ? (uint64_t)lo : 0, hi == INT64_MAX ? -1 : hi);
        if (r >= 0) {
            alts[na++] = r;
        }
    }
    if (na == 0) {
        return fail(c, "minimum/maximum at %s leave no integer", here(c));
    }
    return oom(c, kg_gir_alt(c->g, alts, na));
}
