/* kg_tokenizer_wpm: the WordPiece tokenizer of bert vocabularies
 * (`tokenizer.ggml.model` = "bert"), equal to llama.cpp's
 * llm_tokenizer_wpm_session.
 *
 * DESIGN
 * Text is cut into words: whitespace ends a word; NUL, U+FFFD and control
 * characters are dropped; with strip_accents a character is replaced by
 * the first code point of its NFD form and marks are dropped; with
 * lowercase it is lowercased; punctuation, ASCII symbols and CJK
 * ideographs are words of their own. Each word, prefixed with "▁" (how
 * llama.cpp's converter marks a word start; "##" continuations are stored
 * without a marker), is matched greedily from the left, the longest
 * vocabulary entry first (by bytes, up to the longest token); a word with
 * any part that matches nothing becomes the unknown token whole. The
 * Unicode tables are kg_tokenizer_wpm_data.c (scripts/gen-wpm-unicode). */
#include "../core/kg_utf8.h"
#include "kg_tokenizer_int.h"
#include "kg_tokenizer_wpm_data.h"

#include <stdlib.h>
#include <string.h>

static bool is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* llama.cpp's is_chinese_char, its 0x2B920 included */
static bool is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int cpt_class(uint32_t c) {
    size_t lo = 0, hi = kg_wpm_n_classes;
    while (hi - lo > 1) { /* the last range starting at or before c */
        const size_t mid = (lo + hi) / 2;
        if (kg_wpm_classes[mid].start <= c) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return kg_wpm_classes[lo].cls;
}

static uint32_t map_cpt(const kg_wpm_map_t *m, size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (m[mid].from < c) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < n && m[lo].from == c ? m[lo].to : c;
}

typedef struct wpm_out {
    int32_t *ids;
    int64_t n_max, n;
} wpm_out_t;

static void put(wpm_out_t *o, int32_t id) {
    if (o->n < o->n_max) {
        o->ids[o->n] = id;
    }
    o->n++;
}

/* One word (with its "▁" prefix, `n` bytes): greedy longest matches, or
 * the unknown token when some position matches nothing. */
static void word_ids(const kg_tokenizer_t *tok, const char *w, size_t n, wpm_out_t *o) {
    const int64_t at = o->n;
    bool all = true;
    for (size_t i = 0; i < n && all;) {
        size_t j = i + tok->wpm_max_len + 1 < n ? i + tok->wpm_max_len + 1 : n;
        int32_t id = -1;
        for (; j > i; j--) {
            id = kg_tokenizer_find(tok, w + i, j - i);
            if (id >= 0) {
                break;
            }
        }
        if (id < 0) {
            all = false;
            break;
        }
        put(o, id);
        i = j;
    }
    if (!all) {
        o->n = at;
    }
    if (o->n == at) {
        put(o, tok->unk);
    }
}

int64_t kg_tokenizer_wpm_encode(const kg_tokenizer_t *tok,
                                const char *text,
                                size_t len,
                                int32_t *ids,
                                int64_t n_max,
                                int64_t n) {
    wpm_out_t o = {ids, n_max, n};
    /* a character's output is at most 4 bytes and its input at least 1 */
    char *w = malloc(3 + 4 * len + 4);
    if (!w) {
        return -1;
    }
    /* a byte buffer with its length in wn, never read as a C string */
    memcpy(w, LOW8, 3); // NOLINT(bugprone-not-null-terminated-result)
    size_t wn = 3;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        i += kg_tokenizer_lcpp_decode((const unsigned char *)text + i, len - i, &c);
        if (tok->wpm_strip_accents) {
            c = map_cpt(kg_wpm_nfd, kg_wpm_n_nfd, c);
        }
        if (is_whitespace(c)) {
            if (wn > 3) {
                word_ids(tok, w, wn, &o);
                wn = 3;
            }
            continue;
        }
        const int cls = cpt_class(c);
        if (c == 0 || c == 0xFFFD || cls == KG_WPM_CONTROL ||
            (tok->wpm_strip_accents && cls == KG_WPM_MARK)) {
            continue;
        }
        const uint32_t out = tok->wpm_lowercase ? map_cpt(kg_wpm_lower, kg_wpm_n_lower, c) : c;
        if (cls == KG_WPM_PUNCT || (c < 0x7F && cls == KG_WPM_SYMBOL) || is_chinese(c)) {
            if (wn > 3) {
                word_ids(tok, w, wn, &o);
            }
            wn = 3 + kg_utf8_put(out, w + 3);
            word_ids(tok, w, wn, &o);
            wn = 3;
        } else {
            wn += kg_utf8_put(out, w + wn);
        }
    }
    if (wn > 3) {
        word_ids(tok, w, wn, &o);
    }
    free(w);
    return o.n;
}
