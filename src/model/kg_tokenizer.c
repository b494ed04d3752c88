/* kg_tokenizer: the SPM and byte-level BPE tokenizers of GGUF files, giving
 * the same ids as llama.cpp (src/llama-vocab.cpp, src/unicode.cpp).
 *
 * DESIGN
 * Everything is built once in kg_tokenizer_new and read-only afterwards, so
 * one tokenizer serves any number of threads; kg_tokenizer_encode keeps its
 * working memory in a per-call session.
 *
 * - The vocabulary is copied into one text pool; a token text -> id hash
 *   table (open addressing) and, for BPE, a merge "left right" -> rank table
 *   make every lookup O(length of the string).
 * - Token attributes follow llama.cpp: the file's token types, then the
 *   same text-based fix-ups (EOT/EOM/FIM/EOG tokens become control tokens,
 *   "unused" control tokens, the Phi-3 right-strip rule), because they decide
 *   which texts the special-token pass matches and what decoding prints.
 * - Encoding first cuts the text at special tokens (longest token first,
 *   then every occurrence left to right, as llama.cpp's
 *   tokenizer_st_partition): control and unknown tokens only with
 *   parse_special, user-defined tokens always.
 * - SPM: spaces become U+2581, a leading one is added at the start and
 *   after each special token, then the highest-scoring adjacent pair is
 *   merged while one exists (a heap; ties go to the leftmost pair); pieces
 *   that are not tokens fall back to <0xXX> byte tokens.
 * - BPE: the pre-tokenizer regexes of `tokenizer.ggml.pre` (PCRE2, compiled
 *   once, JIT when available) split the text, each regex splitting the
 *   pieces of the one before and keeping the unmatched gaps as pieces;
 *   `\s` is spelled out as llama.cpp's whitespace set. Each piece's bytes go
 *   through the GPT-2 byte-to-unicode map and the lowest-ranked adjacent
 *   merge is applied while one exists (ties: leftmost).
 * - Invalid UTF-8: llama.cpp reads each invalid byte as U+FFFD. The regexes
 *   here see exactly that (so the cuts are llama.cpp's), but the pieces keep
 *   the original bytes, so that decode(encode(text)) == text for any bytes;
 *   llama.cpp instead encodes the three bytes of U+FFFD there.
 *
 * FILES
 * - kg_tokenizer.c (this file): the helpers the others share (hashing,
 *   llama.cpp's reading of UTF-8), the token lookups and the getters.
 * - kg_tokenizer_build.c: kg_tokenizer_new/free, everything read from the
 *   GGUF: tokens, merges, attributes, special tokens, byte maps, pieces.
 * - kg_tokenizer_pre.c: the BPE pre-tokenizer regexes by tokenizer.ggml.pre.
 * - kg_tokenizer_encode.c: kg_tokenizer_encode: the special-token partition,
 *   then SPM, BPE, WordPiece or unigram on each fragment.
 * - kg_tokenizer_wpm.c: WordPiece (bert); kg_tokenizer_ugm.c: the
 *   SentencePiece unigram (t5: XLM-RoBERTa encoders) with its charsmap.
 * - kg_tokenizer_int.h: the struct and the functions the files share. */
#include "kg_tokenizer_int.h"

#include <string.h>

// ---- hashing ----

uint32_t kg_tokenizer_hash(uint32_t h, const char *s, size_t n) {
    // FNV-1a: short strings, and it composes: hash("a b") == hash(hash(hash("a"), " "), "b")
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

/* Table slot of a hash: FNV-1a mixes only upwards, so its low bits (the
 * ones a mask keeps) need the murmur3 finaliser to spread. */
size_t kg_tokenizer_slot(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

// ---- UTF-8 as llama.cpp reads it ----

/* One code point read the way llama.cpp's unicode_cpt_from_utf8 reads it
 * (no overlong or range checks); an invalid sequence gives U+FFFD and
 * consumes one byte. Returns the bytes consumed. */
size_t kg_tokenizer_lcpp_decode(const unsigned char *s, size_t n, uint32_t *cpt) {
    unsigned char c = s[0];
    if (!(c & 0x80)) {
        *cpt = c;
        return 1;
    }
    if ((c & 0x40) && !(c & 0x20)) {
        if (n >= 2 && (s[1] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
            return 2;
        }
    } else if ((c & 0x40) && !(c & 0x10)) {
        if (n >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
            return 3;
        }
    } else if ((c & 0x40) && !(c & 0x08)) {
        if (n >= 4 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                   ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
            return 4;
        }
    }
    *cpt = 0xFFFD;
    return 1;
}

/* First occurrence of `needle` in `hay` (memmem is a GNU extension). */
const char *kg_tokenizer_find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn) {
        return NULL;
    }
    const char *end = hay + (hn - nn);
    for (const char *p = hay; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p) {
            return NULL;
        }
        if (memcmp(p, needle, nn) == 0) {
            return p;
        }
        p++;
    }
    return NULL;
}

static size_t canonical_len(uint32_t cpt) {
    return cpt < 0x80 ? 1 : cpt < 0x800 ? 2 : cpt < 0x10000 ? 3 : 4;
}

/* Whether `len` bytes decoded to `cpt` are exactly its UTF-8 form, which is
 * what PCRE2 accepts (no overlong forms, surrogates or values > U+10FFFF). */
bool kg_tokenizer_is_canonical(uint32_t cpt, size_t len) {
    return len == canonical_len(cpt) && cpt <= 0x10FFFF && !(cpt >= 0xD800 && cpt <= 0xDFFF) &&
           !(cpt == 0xFFFD && len == 1);
}

// ---- vocabulary lookups ----

const char *kg_tokenizer_text(const kg_tokenizer_t *tok, int32_t id, size_t *len) {
    *len = tok->text_off[id + 1] - tok->text_off[id];
    return tok->text + tok->text_off[id];
}

int32_t kg_tokenizer_find(const kg_tokenizer_t *tok, const char *s, size_t n) {
    uint32_t h = kg_tokenizer_hash(HASH_SEED, s, n);
    for (size_t i = kg_tokenizer_slot(h) & tok->tok_mask;; i = (i + 1) & tok->tok_mask) {
        uint64_t slot = tok->tok_slots[i];
        if (!slot) {
            return -1;
        }
        if ((uint32_t)(slot >> 32) == h) {
            int32_t id = (int32_t)(uint32_t)slot - 1;
            size_t len;
            const char *t = kg_tokenizer_text(tok, id, &len);
            if (len == n && memcmp(t, s, n) == 0) {
                return id;
            }
        }
    }
}

// ---- getters ----

kg_tokenizer_kind_t kg_tokenizer_kind(const kg_tokenizer_t *tok) {
    return tok->kind;
}

int32_t kg_tokenizer_n_vocab(const kg_tokenizer_t *tok) {
    return tok->n_vocab;
}

int32_t kg_tokenizer_bos(const kg_tokenizer_t *tok) {
    return tok->bos;
}

int32_t kg_tokenizer_eos(const kg_tokenizer_t *tok) {
    return tok->eos;
}

bool kg_tokenizer_add_bos(const kg_tokenizer_t *tok) {
    return tok->add_bos;
}

bool kg_tokenizer_add_eos(const kg_tokenizer_t *tok) {
    return tok->add_eos;
}

int32_t kg_tokenizer_sep(const kg_tokenizer_t *tok) {
    return tok->sep;
}

bool kg_tokenizer_add_sep(const kg_tokenizer_t *tok) {
    return tok->add_sep && tok->sep >= 0;
}

bool kg_tokenizer_is_eog(const kg_tokenizer_t *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab && (tok->attr[id] & ATTR_EOG);
}

bool kg_tokenizer_is_control(const kg_tokenizer_t *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab && (tok->attr[id] & ATTR_CONTROL);
}

kg_gguf_str_t kg_tokenizer_token_text(const kg_tokenizer_t *tok, int32_t id) {
    kg_gguf_str_t s = {"", 0};
    if (id >= 0 && id < tok->n_vocab) {
        size_t len;
        s.data = kg_tokenizer_text(tok, id, &len);
        s.len = len;
    }
    return s;
}

size_t
kg_tokenizer_piece(const kg_tokenizer_t *tok, int32_t id, bool special, char *buf, size_t cap) {
    if (id < 0 || id >= tok->n_vocab) {
        return 0;
    }
    if (!special && (tok->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) {
        return 0;
    }
    size_t len = tok->piece_off[id + 1] - tok->piece_off[id];
    if (cap > 0) {
        memcpy(buf, tok->piece + tok->piece_off[id], len < cap ? len : cap);
    }
    return len;
}
