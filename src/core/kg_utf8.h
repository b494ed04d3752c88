/* kg_utf8: the one UTF-8 encoder, shared by the tokenizer, the grammar
 * compilers (GBNF, regex, the DFA builder) and the vocabulary maker. No
 * range checks: callers pass code points they have already validated
 * (<= 0x10FFFF). */
#pragma once

#include <stddef.h>
#include <stdint.h>

/** Bytes UTF-8 takes for code point `cp` (1 to 4). */
static inline size_t kg_utf8_len(uint32_t cp) {
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/** Write `cp` as UTF-8 to `out` (room for 4 bytes); returns the bytes written. */
static inline size_t kg_utf8_put(uint32_t cp, char *out) {
    size_t n = kg_utf8_len(cp);
    switch (n) {
    case 1:
        out[0] = (char)cp;
        break;
    case 2:
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        break;
    case 3:
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        break;
    default:
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        break;
    }
    return n;
}
