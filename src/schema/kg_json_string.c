/* kg_json_string: the grammar of a JSON Schema string, from `pattern`,
 * `format` and `minLength`/`maxLength`, alone or together.
 *
 * Together they are the intersection of their languages (kg_gir_and: the
 * grammar compiler builds the product of the automata): the string bodies
 * the format and the pattern allow, and "minLength..maxLength characters
 * of a JSON string body" (the shared char rule repeated), where a
 * character is a code point of the decoded string as JSON Schema counts
 * it, so `\"`, `\u00e9` and a raw 'é' are one each. A bound the pattern or
 * format already implies is left out (a date is always 10 characters, an
 * email at most 72), so those cost nothing; a bound that has to be
 * intersected is limited to KG_JSON_MAX_LENGTH_WITH_PATTERN, because the
 * product holds about one copy of the pattern's automaton per length. */
#include "../grammar/kg_regex.h"
#include "kg_json_schema_int.h"

#include <inttypes.h>

static const struct {
    const char *name, *re;
} formats[] = {
    {"date", "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|"
             "(0[13578]|1[02])-31)"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|"
             "2[0-3]):[0-5][0-9])"},
    {"date-time", "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|"
                  "(0[13578]|1[02])-31)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?"
                  "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", "[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,32}\\.[A-Za-z]{2,6}"},
};

/* The lengths in characters of the strings regex re allows (with any text
 * around an unanchored side in search mode): a range holding them all,
 * read from a code-point parse (the JSON-string form the grammar uses
 * writes some characters as several-byte escapes). 0..unbounded when it
 * cannot tell, which only costs an intersection that was not needed. */
static void text_range(const char *re, size_t len, bool search, int64_t *lo, int64_t *hi) {
    *lo = 0;
    *hi = -1;
    kg_gir_t *g = kg_gir_new();
    if (!g) {
        return;
    }
    kg_regex_opts_t o = {.search = search, .json_string = false};
    char err[200];
    int32_t e = kg_regex_to_gir(g, re, len, &o, err, sizeof(err));
    if (e < 0 || !kg_gir_text_length(g, e, lo, hi)) {
        *lo = 0;
        *hi = -1;
    }
    kg_gir_free(g);
}

static int32_t gen_format(conv_t *c, json_t *format, int64_t *lo, int64_t *hi) {
    const char *name = json_string_value(format);
    for (size_t i = 0; name && i < sizeof(formats) / sizeof(*formats); i++) {
        if (strcmp(name, formats[i].name) == 0) {
            text_range(formats[i].re, strlen(formats[i].re), false, lo, hi);
            return kg_json_rules_regex(c, formats[i].re, true);
        }
    }
    size_t saved = ptr_push(c, "format");
    fail(c, "unsupported format '%s' at %s (supported: date, time, date-time, uuid, email)",
         name ? name : "?", here(c));
    ptr_pop(c, saved);
    return -1;
}

static int32_t gen_pattern(conv_t *c, json_t *pattern, int64_t *lo, int64_t *hi) {
    if (!json_is_string(pattern)) {
        return fail(c, "pattern at %s: expected a string", here(c));
    }
    const char *re = json_string_value(pattern);
    size_t len = json_string_length(pattern);
    kg_regex_opts_t o = {.search = true, .json_string = true};
    char err[256];
    int32_t body = kg_regex_to_gir(c->g, re, len, &o, err, sizeof(err));
    if (body < 0) {
        size_t saved = ptr_push(c, "pattern");
        fail(c, "pattern at %s: %s", here(c), err);
        ptr_pop(c, saved);
        return -1;
    }
    text_range(re, len, true, lo, hi);
    return body;
}

int32_t kg_json_string(conv_t *c, json_t *s, int64_t min, int64_t max) {
    json_t *pattern = json_object_get(s, "pattern"), *format = json_object_get(s, "format");
    int32_t body = -1;
    int64_t lo = 0, hi = -1; /* the lengths the format and pattern allow */
    if (format && (body = gen_format(c, format, &lo, &hi)) < 0) {
        return -1;
    }
    if (pattern) {
        int64_t plo = 0, phi = -1;
        int32_t p = gen_pattern(c, pattern, &plo, &phi);
        if (p < 0) {
            return -1;
        }
        if (body >= 0) {
            /* both: the format's strings that match the pattern */
            body = oom(c, kg_gir_and(c->g, body, p));
            lo = plo > lo ? plo : lo;
            hi = hi < 0 ? phi : phi >= 0 && phi < hi ? phi : hi;
        } else {
            body = p, lo = plo, hi = phi;
        }
    }
    int32_t chars;
    if (body < 0) {
        chars = oom(c, kg_gir_repeat(c->g, kg_json_rules_char(c), (int32_t)min,
                                     max < 0 ? KG_GIR_UNBOUNDED : (int32_t)max));
        return oom(c, kg_gir_seq3(c->g, lit(c, "\""), chars, lit(c, "\"")));
    }
    const char *what = pattern && format ? "pattern and format" : pattern ? "pattern" : "format";
    if ((hi >= 0 && hi < min) || (max >= 0 && lo > max)) {
        char has[48];
        snprintf(has, sizeof(has), hi < 0 ? "%" PRId64 " or more" : "%" PRId64 " to %" PRId64, lo,
                 hi);
        return fail(c,
                    "minLength/maxLength at %s leave no string the %s allows (its strings have %s "
                    "characters)",
                    here(c), what, has);
    }
    /* only the bounds the pattern and format do not imply already */
    bool need_min = min > lo, need_max = max >= 0 && (hi < 0 || hi > max);
    if (need_min || need_max) {
        int64_t bound = need_max ? max : min;
        if (bound > KG_JSON_MAX_LENGTH_WITH_PATTERN) {
            return fail(c,
                        "%s %" PRId64 " together with %s at %s: at most %d is supported (the "
                        "grammar holds a copy of the %s's automaton for every length up to it)",
                        need_max ? "maxLength" : "minLength", bound, what, here(c),
                        KG_JSON_MAX_LENGTH_WITH_PATTERN, format ? "format" : "pattern");
        }
        chars = oom(c, kg_gir_repeat(c->g, kg_json_rules_char(c), need_min ? (int32_t)min : 0,
                                     need_max ? (int32_t)max : KG_GIR_UNBOUNDED));
        body = oom(c, kg_gir_and(c->g, body, chars));
    }
    return oom(c, kg_gir_seq3(c->g, lit(c, "\""), body, lit(c, "\"")));
}
