/* kg_tokenizer_ugm: the SentencePiece unigram tokenizer (`tokenizer.ggml.model`
 * = "t5", llama.cpp's LLAMA_VOCAB_TYPE_UGM) of T5 and of the XLM-RoBERTa
 * encoders (bge-m3, bge-reranker-v2-m3, multilingual-e5), equal to llama.cpp's
 * llm_tokenizer_ugm_session.
 *
 * DESIGN
 * - Normalization: at each input position the longest prefix found in the
 *   file's precompiled charsmap (SentencePiece's XOR-compressed double array
 *   of NFKC-style rewrites: full-width forms, ligatures, odd spaces) is
 *   replaced by its NUL-terminated replacement; otherwise one UTF-8
 *   character is copied (an invalid byte becomes U+FFFD). Spaces of the
 *   result become "▁": with remove_extra_whitespaces, runs of spaces fold
 *   into one "▁" before each word and leading and trailing ones go; else
 *   with add_space_prefix one "▁" leads.
 * - Viterbi over the normalized bytes: for every character start, every
 *   vocabulary entry (normal, user-defined and unused tokens) that begins
 *   there extends the best path to its end by its score (user-defined
 *   tokens score 0); a character that no one-character entry covers gets
 *   the unknown token at (lowest normal score - 10). Ties keep the earlier
 *   candidate, in llama.cpp's order (positions left to right, shorter
 *   entries first, the unknown last); sums are doubles as in llama.cpp.
 *   Runs of unknown tokens come out as one.
 * - Where the text starts like a user-defined token (any common prefix, as
 *   llama.cpp's trie walk counts it), those bytes are kept as they are.
 * - llama.cpp walks a byte trie of the entries; here the prefixes of all
 *   entries are bits of a filter (a hash per prefix) so the walk stops
 *   where no entry continues (a false positive only costs a lookup), and
 *   each prefix the filter keeps is looked up in the token table.
 * There is no byte fallback in llama.cpp's UGM encoder (only decoding
 * prints <0xXX> tokens as bytes), so none here. */
#include "core/kg_utf8.h"
#include "kg_tokenizer_int.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNK_PENALTY 10.0f

static void set_err(char *errstr, size_t errstr_size, const char *msg) {
    if (errstr && errstr_size) {
        snprintf(errstr, errstr_size, "%s", msg);
    }
}

static bool is_entry(const kg_tokenizer_t *tok, int32_t id) {
    return (tok->attr[id] & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED)) != 0;
}

/* Filter bit of a prefix hash; `salt` keeps the "an entry ends here" bits
 * apart from the "an entry continues" bits. */
static size_t filter_bit(const kg_tokenizer_t *tok, uint32_t h, uint32_t salt) {
    return kg_tokenizer_slot(h ^ salt) & tok->ugm_bits_mask;
}

#define SALT_END 0x9e3779b9u

static bool bit_get(const kg_tokenizer_t *tok, size_t b) {
    return (tok->ugm_bits[b >> 6] >> (b & 63)) & 1u;
}

static void bit_set(kg_tokenizer_t *tok, size_t b) {
    tok->ugm_bits[b >> 6] |= (uint64_t)1 << (b & 63);
}

bool kg_tokenizer_ugm_build(kg_tokenizer_t *tok,
                            const kg_gguf_t *g,
                            char *errstr,
                            size_t errstr_size) {
    static const char *key = "tokenizer.ggml.precompiled_charsmap";
    kg_gguf_type_t et;
    uint64_t n;
    if (kg_gguf_get_arr(g, key, &et, &n)) {
        if (et != KG_GGUF_TYPE_UINT8 && et != KG_GGUF_TYPE_INT8) {
            set_err(errstr, errstr_size,
                    "tokenizer.ggml.precompiled_charsmap is not an array of bytes");
            return false;
        }
        size_t raw_size;
        const unsigned char *raw = kg_gguf_kv_raw(g, kg_gguf_find_key(g, key), &raw_size);
        // raw: element type (u32), count (u64), then the bytes
        if (!raw || raw_size < 12 + n) {
            set_err(errstr, errstr_size, "tokenizer.ggml.precompiled_charsmap is truncated");
            return false;
        }
        uint32_t blob = 0;
        if (n >= 4) {
            const unsigned char *p = raw + 12;
            blob =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        }
        // llama.cpp's checks: a header, and replacement bytes after the array
        if (n < 4 || (uint64_t)blob + 4 >= n) {
            set_err(errstr, errstr_size,
                    "tokenizer.ggml.precompiled_charsmap: its array size runs past its end");
            return false;
        }
        tok->ugm_xcda_n = blob / 4;
        tok->ugm_xcda = malloc(tok->ugm_xcda_n * sizeof(uint32_t) + 1);
        tok->ugm_repl_n = (size_t)(n - 4 - blob);
        tok->ugm_repl = malloc(tok->ugm_repl_n);
        if (!tok->ugm_xcda || !tok->ugm_repl) {
            set_err(errstr, errstr_size, "out of memory loading the charsmap");
            return false;
        }
        const unsigned char *p = raw + 16;
        for (size_t i = 0; i < tok->ugm_xcda_n; i++) { // little-endian in the file
            tok->ugm_xcda[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                               (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        }
        memcpy(tok->ugm_repl, raw + 16 + blob, tok->ugm_repl_n);
    }

    float min_score = FLT_MAX;
    size_t total = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        if (tok->attr[id] & ATTR_NORMAL) {
            min_score = tok->score[id] < min_score ? tok->score[id] : min_score;
        }
        if (is_entry(tok, id)) {
            total += tok->text_off[id + 1] - tok->text_off[id];
        }
    }
    tok->ugm_unk_score = min_score - UNK_PENALTY;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        size_t len;
        const char *t = kg_tokenizer_text(tok, id, &len);
        if ((tok->attr[id] & ATTR_USER_DEFINED) && len > 0) {
            const unsigned char c = (unsigned char)t[0];
            tok->ugm_ud_first[c >> 6] |= (uint64_t)1 << (c & 63);
        }
    }

    // ~16 bits per prefix byte keeps false positives near 1 in 8
    size_t bits = 1024;
    while (bits < total * 16 && bits < ((size_t)1 << 31)) {
        bits <<= 1;
    }
    tok->ugm_bits = calloc(bits / 64, sizeof(uint64_t));
    if (!tok->ugm_bits) {
        set_err(errstr, errstr_size, "out of memory building the unigram tokenizer");
        return false;
    }
    tok->ugm_bits_mask = bits - 1;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        if (!is_entry(tok, id)) {
            continue;
        }
        size_t len;
        const char *t = kg_tokenizer_text(tok, id, &len);
        uint32_t h = HASH_SEED;
        for (size_t i = 0; i < len; i++) {
            h = kg_tokenizer_hash(h, t + i, 1);
            bit_set(tok, filter_bit(tok, h, 0));
        }
        bit_set(tok, filter_bit(tok, h, SALT_END));
    }
    return true;
}

// ---- normalization ----

typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static bool buf_put(buf_t *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) {
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (!np) {
            return false;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

/* The XCDA node `i`, or false when the charsmap points outside itself
 * (llama.cpp throws there; the text then cannot be tokenized). */
static bool node(const kg_tokenizer_t *tok, size_t i, uint32_t *out) {
    if (i >= tok->ugm_xcda_n) {
        return false;
    }
    *out = tok->ugm_xcda[i];
    return true;
}

static uint32_t node_base(uint32_t v) {
    return (v >> 10) << ((v & (1u << 9)) >> 6);
}

/* The longest charsmap rule matching text[0..len): its replacement in *repl
 * (*repl_len bytes) and the bytes it consumes, 0 when none; -1 on a broken
 * charsmap. */
static int64_t charsmap_match(const kg_tokenizer_t *tok,
                              const unsigned char *text,
                              size_t len,
                              const char **repl,
                              size_t *repl_len) {
    size_t best_len = 0;
    uint32_t best_off = 0, v;
    if (tok->ugm_xcda_n == 0) {
        return 0;
    }
    if (!node(tok, 0, &v)) {
        return -1;
    }
    size_t idx = node_base(v);
    for (size_t i = 0; i < len && text[i] != 0; i++) {
        const unsigned char c = text[i];
        idx ^= c;
        if (!node(tok, idx, &v)) {
            return -1;
        }
        if ((v & ((1u << 31) | 0xffu)) != c) {
            break; // not a child of the previous node
        }
        const bool leaf = (v >> 8) & 1u;
        idx ^= node_base(v);
        if (leaf) {
            if (!node(tok, idx, &v)) {
                return -1;
            }
            best_len = i + 1;
            best_off = v & ((1u << 31) - 1);
        }
    }
    if (best_len == 0) {
        return 0;
    }
    if (best_off >= tok->ugm_repl_n) {
        return -1;
    }
    const char *r = tok->ugm_repl + best_off;
    const char *nul = memchr(r, '\0', tok->ugm_repl_n - best_off);
    if (!nul) {
        return -1; // unterminated replacement
    }
    *repl = r;
    *repl_len = (size_t)(nul - r);
    return (int64_t)best_len;
}

/* How many bytes at text[0..len) llama.cpp passes through unnormalized
 * for its user-defined tokens: its trie's get_longest_prefix returns how
 * deep the walk went, whether or not a token ends there, so this is the
 * longest common prefix with any user-defined token (a whole token never
 * shows up here: the special-token partition cut those out). */
static size_t user_defined_prefix(const kg_tokenizer_t *tok, const char *text, size_t len) {
    const unsigned char c = (unsigned char)text[0];
    if (!(tok->ugm_ud_first[c >> 6] >> (c & 63) & 1u)) {
        return 0;
    }
    size_t best = 0;
    for (int32_t k = 0; k < tok->n_special; k++) {
        const int32_t id = tok->special[k];
        if (!(tok->attr[id] & ATTR_USER_DEFINED)) {
            continue;
        }
        size_t tl;
        const char *t = kg_tokenizer_text(tok, id, &tl);
        size_t i = 0;
        while (i < tl && i < len && t[i] == text[i]) {
            i++;
        }
        best = i > best ? i : best;
    }
    return best;
}

/* llm_tokenizer_ugm_session::normalize. */
static bool normalize(const kg_tokenizer_t *tok, const char *text, size_t len, buf_t *out) {
    const bool merge = tok->ugm_remove_extra_ws;
    bool prepended = false, in_word = false;
    out->n = 0;
    for (size_t off = 0; off < len;) {
        const char *r = text + off;
        size_t rn = user_defined_prefix(tok, text + off, len - off);
        int64_t used = (int64_t)rn;
        if (used == 0) {
            used = charsmap_match(tok, (const unsigned char *)text + off, len - off, &r, &rn);
        }
        if (used < 0) {
            return false;
        }
        if (used == 0) {
            uint32_t cpt;
            size_t cl =
                kg_tokenizer_lcpp_decode((const unsigned char *)text + off, len - off, &cpt);
            if (cl == 1 && (unsigned char)text[off] >= 0x80) {
                r = "\xef\xbf\xbd"; // invalid UTF-8: one byte read as U+FFFD
                rn = 3;
            } else {
                r = text + off;
                rn = cl;
            }
            used = (int64_t)cl;
        }
        for (size_t i = 0; i < rn; i++) {
            if (r[i] != ' ') {
                if (!in_word) {
                    in_word = true;
                    if (((tok->add_space_prefix && !prepended) || merge) &&
                        !buf_put(out, LOW8, 3)) {
                        return false;
                    }
                    prepended = true;
                }
                if (!buf_put(out, r + i, 1)) {
                    return false;
                }
            } else {
                in_word = false;
                if (!merge && !buf_put(out, LOW8, 3)) {
                    return false;
                }
            }
        }
        off += (size_t)used;
    }
    return true;
}

// ---- Viterbi ----

typedef struct best {
    double score;
    uint32_t from; /* where the last token starts */
    int32_t id;
} best_t;

/* The entry whose text is s[0..n) with hash h, or -1. */
static int32_t find_hashed(const kg_tokenizer_t *tok, uint32_t h, const char *s, size_t n) {
    for (size_t i = kg_tokenizer_slot(h) & tok->tok_mask;; i = (i + 1) & tok->tok_mask) {
        uint64_t slot = tok->tok_slots[i];
        if (!slot) {
            return -1;
        }
        if ((uint32_t)(slot >> 32) != h) {
            continue;
        }
        int32_t id = (int32_t)(uint32_t)slot - 1;
        size_t tl;
        const char *t = kg_tokenizer_text(tok, id, &tl);
        if (tl == n && memcmp(t, s, n) == 0) {
            return id;
        }
    }
}

static size_t utf8_len(unsigned char c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

int64_t kg_tokenizer_ugm_encode(const kg_tokenizer_t *tok,
                                const char *text,
                                size_t len,
                                int32_t *ids,
                                int64_t n_max,
                                int64_t n) {
    buf_t nb = {0};
    best_t *best = NULL;
    int32_t *rev = NULL;
    int64_t rc = -1;
    if (!normalize(tok, text, len, &nb)) {
        goto out;
    }
    const size_t m = nb.n;
    if (m == 0) {
        rc = n;
        goto out;
    }
    if (m >= UINT32_MAX || !(best = malloc((m + 1) * sizeof(best_t)))) {
        goto out;
    }
    const char *s = nb.p;
    best[0] = (best_t){0.0, 0, tok->unk};
    for (size_t i = 1; i <= m; i++) {
        best[i] = (best_t){-DBL_MAX, 0, tok->unk};
    }
    for (size_t off = 0; off < m;) {
        const size_t cl =
            utf8_len((unsigned char)s[off]) < m - off ? utf8_len((unsigned char)s[off]) : m - off;
        const double base = best[off].score;
        bool whole_char = false;
        uint32_t h = HASH_SEED;
        for (size_t end = off + 1; end <= m; end++) {
            h = kg_tokenizer_hash(h, s + end - 1, 1);
            if (!bit_get(tok, filter_bit(tok, h, 0))) {
                break; // no entry starts with s[off..end)
            }
            if (!bit_get(tok, filter_bit(tok, h, SALT_END))) {
                continue;
            }
            const int32_t id = find_hashed(tok, h, s + off, end - off);
            if (id < 0 || !is_entry(tok, id)) {
                continue;
            }
            whole_char = whole_char || end - off == cl;
            const double sc =
                base + ((tok->attr[id] & ATTR_USER_DEFINED) ? 0.0 : (double)tok->score[id]);
            if (sc > best[end].score) {
                best[end] = (best_t){sc, (uint32_t)off, id};
            }
        }
        if (!whole_char) {
            const double sc = base + (double)tok->ugm_unk_score;
            if (sc > best[off + cl].score) {
                best[off + cl] = (best_t){sc, (uint32_t)off, tok->unk};
            }
        }
        off += cl;
    }
    // back from the end; a run of unknowns is one unknown
    size_t nr = 0;
    if (!(rev = malloc((m + 1) * sizeof(int32_t)))) {
        goto out;
    }
    bool prev_unk = false;
    for (size_t at = m;;) {
        const best_t *b = &best[at];
        const bool unk = b->id == tok->unk;
        if (!(prev_unk && unk)) {
            rev[nr++] = b->id;
        }
        if (b->from == 0) {
            break;
        }
        prev_unk = unk;
        at = b->from;
    }
    for (size_t i = nr; i-- > 0;) {
        if (n < n_max) {
            ids[n] = rev[i];
        }
        n++;
    }
    rc = n;
out:
    free(nb.p);
    free(best);
    free(rev);
    return rc;
}
