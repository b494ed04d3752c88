/* kg_regex: a regular expression -> a grammar IR expression.
 *
 * The syntax is the common core of ECMAScript, PCRE and Python: literals,
 * `.`, classes [...] / [^...] with ranges, the escapes \d \D \w \W \s \S
 * \n \r \t \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation, groups
 * (...) (?:...) (?<name>...) (?P<name>...), alternation, the quantifiers
 * * + ? {n} {n,} {n,m} (lazy forms mean the same language), and ^ / $ at
 * the start / end of a top-level alternative. Lookaround, backreferences,
 * word boundaries, \p{..}, inline flags and possessive quantifiers are
 * refused with a message naming them.
 *
 * The generated language is always a subset of what PCRE2 and Python's re
 * match, so a constrained output always passes the checker: `.` is any
 * character but \n; \d is [0-9]; \w is [A-Za-z0-9_]; \s is ASCII white
 * space; \D and \W are their complements within ASCII, \S excludes Unicode
 * white space as well.
 *
 * Two modes: full match (the `regex` job field: the output is the match)
 * or search (JSON Schema `pattern`: a match anywhere, so an unanchored side
 * gets any text). In json_string mode the characters are produced as they
 * are written inside a JSON string literal: ", \ and control characters as
 * escapes, everything else as itself. @thread any */
#pragma once

#include "kg_gir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_regex_opts {
    bool search;      /* unanchored sides match any text (JSON Schema pattern) */
    bool json_string; /* produce the characters as a JSON string's body writes them */
} kg_regex_opts_t;

/** Build `re` (len bytes, UTF-8) into `g`; returns the expression, or -1
 * with a message in errstr. */
int32_t kg_regex_to_gir(kg_gir_t *g,
                        const char *re,
                        size_t len,
                        const kg_regex_opts_t *opts,
                        char *errstr,
                        size_t errstr_size);

/** The JSON-string body form of one code-point set expression: a CHARS
 * expression becomes raw characters plus escapes for ", \ and controls.
 * Used by the JSON Schema converter for its own classes. */
int32_t kg_regex_json_chars(kg_gir_t *g, int32_t chars_expr);
