/* kg_gbnf: llama.cpp's GBNF grammar text -> the grammar IR.
 *
 * The dialect is llama.cpp's (grammars/README.md there): rules
 * `name ::= alternatives` with names of [a-zA-Z0-9-], literals "..." and
 * character classes [...] / [^...] with the escapes \x \u \U \t \r \n \\
 * \" \[ \] \- \^, `.` (any character), grouping, | alternation, the
 * postfixes * + ? {m} {m,} {m,n}, # comments, and newlines ending a rule
 * except inside parentheses or after |. The start rule is `root`.
 * Token references (<...>) are not supported. Errors name the line and
 * column. @thread any */
#pragma once

#include "kg_gir.h"

#include <stddef.h>

/* Repetition counts above this are refused (each count is expanded). */
#define KG_GBNF_MAX_REPEAT 10000

/** Parse `len` bytes of GBNF into `g` (a fresh IR); sets the root rule.
 * False with a message in errstr on a syntax error, an undefined rule, a
 * rule defined twice or a missing root. */
bool kg_gbnf_parse(kg_gir_t *g, const char *text, size_t len, char *errstr, size_t errstr_size);
