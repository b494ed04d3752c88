/* kg_tokenizer_encode: text -> token ids, as llama.cpp's llama_tokenize
 * gives them. The tokenizer is read-only here; each call keeps its working
 * memory (symbols, the merge heap, regex spans) in a session of its own.
 *
 * The text is first cut at special-token texts (partition); raw fragments
 * then go through SPM (spaces as U+2581, best-scoring pair merged first,
 * byte fallback) or BPE (the pre-tokenizer regexes, the GPT-2 byte map,
 * lowest-ranked merge first). See kg_tokenizer.c for the design. */
#include "core/kg_log.h"
#include "core/kg_utf8.h"
#include "kg_tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

// ---- small helpers ----

static size_t utf8_len(unsigned char c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Grow *p to hold `need` elements of `elem` bytes. On success *p is
 * non-NULL (a nonzero *cap always comes with a buffer; saying so lets the
 * static analyzer see it too). */
static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap && *p) {
        return true;
    }
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need) {
        ncap *= 2;
    }
    void *np = realloc(*p, ncap * elem);
    if (!np) {
        return false;
    }
    *p = np;
    *cap = ncap;
    return true;
}

/* Rank of merging `l` and `r`, or -1 (llama_vocab::find_bpe_rank). */
static int32_t
merge_rank(const kg_tokenizer_t *tok, const char *l, size_t ln, const char *r, size_t rn) {
    if (!tok->merge_slots) {
        return -1;
    }
    uint32_t h =
        kg_tokenizer_hash(kg_tokenizer_hash(kg_tokenizer_hash(HASH_SEED, l, ln), " ", 1), r, rn);
    for (size_t i = kg_tokenizer_slot(h) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        uint64_t slot = tok->merge_slots[i];
        if (!slot) {
            return -1;
        }
        if ((uint32_t)(slot >> 32) != h) {
            continue;
        }
        int32_t rank = (int32_t)(uint32_t)slot - 1;
        const char *m = tok->merge_text + tok->merge_off[rank];
        size_t mlen = tok->merge_off[rank + 1] - tok->merge_off[rank];
        if (mlen == ln + 1 + rn && tok->merge_split[rank] == ln && memcmp(m, l, ln) == 0 &&
            memcmp(m + ln + 1, r, rn) == 0) {
            return rank;
        }
    }
}

// ---- encoding ----

typedef struct out {
    int32_t *ids;
    int64_t n_max;
    int64_t n;
} out_t;

static void emit(out_t *o, int32_t id) {
    if (o->n < o->n_max) {
        o->ids[o->n] = id;
    }
    o->n++;
}

typedef struct symbol {
    uint32_t start; /* into the session text */
    uint32_t n;     /* bytes; 0 once merged into its left neighbour */
    int32_t prev, next;
} symbol_t;

typedef struct bigram {
    float key; /* higher merges first: SPM score, or -rank for BPE */
    int32_t left, right;
    uint32_t size;
} bigram_t;

typedef struct fragment {
    int32_t token; /* -1: raw text */
    size_t off, len;
} fragment_t;

typedef struct span {
    size_t off, len;
} span_t;

/* Per-call working memory (the tokenizer itself stays read-only). */
typedef struct session {
    const kg_tokenizer_t *tok;
    symbol_t *sym;
    size_t sym_cap;
    bigram_t *heap;
    size_t heap_n, heap_cap;
    char *buf; /* escaped SPM text, or a byte-mapped BPE piece */
    size_t buf_cap;
    const char *view; /* BPE: the text as the regexes see it (text or view_buf) */
    char *view_buf;
    size_t view_cap;
    size_t *vmap; /* view offset -> text offset (when the view differs) */
    size_t vmap_cap;
    span_t *spans[2];
    size_t span_cap[2];
    char *esc; /* SentencePiece-style BPE: the fragment with its spaces as "▁" */
    size_t esc_cap;
    pcre2_match_data *md;
    bool failed;
} session_t;

static bool heap_better(const bigram_t *a, const bigram_t *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static bool heap_push(session_t *s, bigram_t b) {
    if (!grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof(bigram_t))) {
        return false;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_better(&b, &s->heap[p])) {
            break;
        }
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
    return true;
}

static bigram_t heap_pop(session_t *s) {
    bigram_t top = s->heap[0];
    bigram_t last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) {
            break;
        }
        if (c + 1 < n && heap_better(&s->heap[c + 1], &s->heap[c])) {
            c++;
        }
        if (!heap_better(&s->heap[c], &last)) {
            break;
        }
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) {
        s->heap[i] = last;
    }
    return top;
}

/* Split `text` into symbols of one UTF-8 character each: by the lead byte,
 * as llama.cpp (no validation), or with `valid` a byte that starts no valid
 * character a symbol alone. Returns the count, or -1 on no memory. */
static int64_t split_chars(session_t *s, const char *text, size_t len, bool valid) {
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        if (!grow((void **)&s->sym, &s->sym_cap, n + 1, sizeof(symbol_t))) {
            return -1;
        }
        size_t cl = utf8_len((unsigned char)text[off]);
        if (cl > len - off) {
            cl = len - off;
        }
        if (valid) {
            uint32_t cpt;
            cl = kg_tokenizer_lcpp_decode((const unsigned char *)text + off, len - off, &cpt);
            if (!kg_tokenizer_is_canonical(cpt, cl)) {
                cl = 1;
            }
        }
        s->sym[n] = (symbol_t){(uint32_t)off, (uint32_t)cl, (int32_t)n - 1, (int32_t)n + 1};
        off += cl;
    }
    if (n) {
        s->sym[n - 1].next = -1;
    }
    return (int64_t)n;
}

/* Merge adjacent symbols, best bigram first, until no bigram is left. */
static void merge_symbols(session_t *s,
                          const char *text,
                          bool (*pair)(session_t *, const char *, int32_t, int32_t)) {
    while (s->heap_n && !s->failed) {
        bigram_t b = heap_pop(s);
        symbol_t *l = &s->sym[b.left], *r = &s->sym[b.right];
        // stale: one side has been merged since the bigram was queued
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) {
            continue;
        }
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) {
            s->sym[r->next].prev = b.left;
        }
        if (l->prev >= 0 && !pair(s, text, l->prev, b.left)) {
            s->failed = true;
        }
        if (l->next >= 0 && !pair(s, text, b.left, l->next)) {
            s->failed = true;
        }
    }
}

static bool spm_pair(session_t *s, const char *text, int32_t left, int32_t right) {
    const symbol_t *l = &s->sym[left], *r = &s->sym[right];
    int32_t id = kg_tokenizer_find(s->tok, text + l->start, l->n + r->n);
    if (id < 0) {
        return true;
    }
    return heap_push(s, (bigram_t){s->tok->score[id], left, right, l->n + r->n});
}

/* llm_tokenizer_spm_session::tokenize on a segment of escaped text. */
static bool spm_segment(session_t *s, const char *text, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    int64_t n = split_chars(s, text, len, false);
    if (n < 0) {
        return false;
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < (int32_t)n; i++) {
        if (!spm_pair(s, text, i - 1, i)) {
            return false;
        }
    }
    merge_symbols(s, text, spm_pair);
    if (s->failed) {
        return false;
    }
    for (int32_t i = n ? 0 : -1; i != -1; i = s->sym[i].next) {
        const symbol_t *sym = &s->sym[i];
        int32_t id = kg_tokenizer_find(tok, text + sym->start, sym->n);
        if (id >= 0) {
            emit(o, id);
            continue;
        }
        // not a token (a merged symbol always is): its bytes as byte tokens
        for (uint32_t j = 0; j < sym->n; j++) {
            int32_t b = tok->byte_tok[(unsigned char)text[sym->start + j]];
            if (b < 0) {
                b = tok->unk;
            }
            if (b < 0) {
                return false;
            }
            emit(o, b);
        }
    }
    return true;
}

/* SPM on escaped text. A character that no multi-byte token contains (a
 * newline, in most vocabularies) can never merge with a neighbour, so the
 * text on either side merges independently: each segment gets its own,
 * small heap. The result is the one llama.cpp gets from the whole text. */
static bool spm_tokenize(session_t *s, const char *text, size_t len, out_t *o) {
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x80 && s->tok->isolated[c]) {
            if (!spm_segment(s, text + start, i - start, o) || !spm_segment(s, text + i, 1, o)) {
                return false;
            }
            start = i + 1;
        }
        i += utf8_len(c);
    }
    return start >= len || spm_segment(s, text + start, len - start, o);
}

static bool spm_fragment(session_t *s, const char *text, size_t len, bool prefix, out_t *o) {
    // escape: ' ' -> U+2581, with a leading one when asked
    size_t need = 3 * len + 3;
    if (!grow((void **)&s->buf, &s->buf_cap, need, 1)) {
        return false;
    }
    size_t m = 0;
    if (prefix) {
        memcpy(s->buf, LOW8, 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + m, LOW8, 3);
            m += 3;
        } else {
            s->buf[m++] = text[i];
        }
    }
    if (m > UINT32_MAX / 2) {
        return false;
    }
    // s->buf is owned by the session and freed at the end of kg_tokenizer_encode;
    // the analyzer loses it through grow's void ** out-parameter
    return spm_tokenize(s, s->buf, m, o); // NOLINT(clang-analyzer-unix.Malloc)
}

static bool bpe_pair(session_t *s, const char *word, int32_t left, int32_t right) {
    const symbol_t *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = merge_rank(s->tok, word + l->start, l->n, word + r->start, r->n);
    if (rank < 0) {
        return true;
    }
    return heap_push(s, (bigram_t){-(float)rank, left, right, l->n + r->n});
}

/* One piece of a SentencePiece-style BPE text (Gemma 4): merges over its
 * UTF-8 characters as they are, and a symbol no token spells goes out as
 * its bytes' <0xXX> tokens (llama.cpp's llm_tokenizer_bpe_session with
 * byte_encode false). */
static bool bpe_spm_piece(session_t *s, const char *p, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    size_t nl = 0;
    while (nl < len && p[nl] == '\n') {
        nl++;
    }
    if (nl == len) { /* a run of newlines is one token where there is one (llama.cpp PR 21343) */
        int32_t id = kg_tokenizer_find(tok, p, len);
        if (id >= 0) {
            emit(o, id);
            return true;
        }
    }
    /* symbols of one character each; a byte that starts no valid character is
     * a symbol alone (llama.cpp would have made it U+FFFD: kgen keeps the
     * bytes, which then go out as byte tokens, and the "▁" beside them stays
     * a space) */
    const int64_t n = split_chars(s, p, len, true);
    if (n < 0) {
        return false;
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < (int32_t)n; i++) {
        if (!bpe_pair(s, p, i - 1, i)) {
            return false;
        }
    }
    merge_symbols(s, p, bpe_pair);
    if (s->failed) {
        return false;
    }
    static const char hex[] = "0123456789ABCDEF";
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const symbol_t *sym = &s->sym[i];
        int32_t id = kg_tokenizer_find(tok, p + sym->start, sym->n);
        if (id >= 0) {
            emit(o, id);
            continue;
        }
        for (uint32_t j = 0; j < sym->n; j++) { /* misses are dropped, as llama.cpp does */
            const unsigned char b = (unsigned char)p[sym->start + j];
            const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            id = kg_tokenizer_find(tok, name, sizeof(name));
            if (id >= 0) {
                emit(o, id);
            }
        }
    }
    return true;
}

/* One pre-tokenized piece (raw bytes) of a BPE text: byte map, merges, ids. */
static bool bpe_piece(session_t *s, const char *p, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    if (len == 0) {
        return true;
    }
    if (tok->bpe_spm) {
        return bpe_spm_piece(s, p, len, o);
    }
    if (!grow((void **)&s->buf, &s->buf_cap, 2 * len, 1) ||
        !grow((void **)&s->sym, &s->sym_cap, len, sizeof(symbol_t))) {
        return false;
    }
    char *word = s->buf;
    size_t wlen = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)p[i];
        s->sym[i] = (symbol_t){(uint32_t)wlen, tok->bmap_len[b], (int32_t)i - 1, (int32_t)i + 1};
        memcpy(word + wlen, tok->bmap[b], tok->bmap_len[b]);
        wlen += tok->bmap_len[b];
    }
    s->sym[len - 1].next = -1;
    if (tok->ignore_merges) {
        int32_t id = kg_tokenizer_find(tok, word, wlen);
        if (id >= 0) {
            emit(o, id);
            return true;
        }
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < (int32_t)len; i++) {
        if (!bpe_pair(s, word, i - 1, i)) {
            return false;
        }
    }
    merge_symbols(s, word, bpe_pair);
    if (s->failed) {
        return false;
    }
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const symbol_t *sym = &s->sym[i];
        int32_t id = kg_tokenizer_find(tok, word + sym->start, sym->n);
        if (id >= 0) {
            emit(o, id);
            continue;
        }
        // llama.cpp looks up each byte of the mapped text alone and drops misses
        for (uint32_t j = 0; j < sym->n; j++) {
            id = kg_tokenizer_find(tok, word + sym->start + j, 1);
            if (id >= 0) {
                emit(o, id);
            }
        }
    }
    return true;
}

static bool push_span(session_t *s, int w, size_t *n, size_t off, size_t len) {
    if (!grow((void **)&s->spans[w], &s->span_cap[w], *n + 1, sizeof(span_t))) {
        return false;
    }
    s->spans[w][(*n)++] = (span_t){off, len};
    return true;
}

/* Split each span of spans[r] by `re` into spans[1 - r]: the matches and the
 * gaps between them, in order (unicode_regex_split_stl). */
static bool regex_split(session_t *s, const pcre2_code *re, int r, size_t n_in, size_t *n_out) {
    *n_out = 0;
    for (size_t k = 0; k < n_in; k++) {
        span_t sp = s->spans[r][k];
        const char *subj = s->view + sp.off;
        size_t cur = 0, gap = 0;
        while (cur < sp.len) {
            int rc = pcre2_match(re, (PCRE2_SPTR)subj, sp.len, cur, PCRE2_NO_UTF_CHECK, s->md,
                                 s->tok->mctx);
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
                // a JIT stack or match limit: the interpreter has larger ones
                rc = pcre2_match(re, (PCRE2_SPTR)subj, sp.len, cur,
                                 PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, s->tok->mctx);
            }
            if (rc == PCRE2_ERROR_NOMATCH) {
                break;
            }
            if (rc < 0) {
                KG_LOG_ERROR("tokenizer", "pre-tokenizer regex failed rc=%d", rc);
                return false;
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) {
                // an empty match cuts nothing; step over one character
                cur = ms + utf8_len((unsigned char)subj[ms]);
                continue;
            }
            if (ms > gap && !push_span(s, 1 - r, n_out, sp.off + gap, ms - gap)) {
                return false;
            }
            if (!push_span(s, 1 - r, n_out, sp.off + ms, me - ms)) {
                return false;
            }
            cur = gap = me;
        }
        if (gap < sp.len && !push_span(s, 1 - r, n_out, sp.off + gap, sp.len - gap)) {
            return false;
        }
    }
    return true;
}

/* llm_tokenizer_bpe_session::tokenize on one raw fragment. */
static bool bpe_fragment(session_t *s, const char *text, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    if (tok->bpe_spm) { /* llama_escape_whitespace: every ' ' becomes "▁" first */
        if (len > SIZE_MAX / 3 || !grow((void **)&s->esc, &s->esc_cap, 3 * len + 1, 1)) {
            return false;
        }
        size_t m = 0;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(s->esc + m, LOW8, 3);
                m += 3;
            } else {
                s->esc[m++] = text[i];
            }
        }
        if (m > (size_t)INT32_MAX) {
            return false;
        }
        text = s->esc;
        len = m;
    }
    // The regexes run on valid UTF-8 holding llama.cpp's code points: each
    // invalid byte becomes U+FFFD, overlong forms their code point. Pieces
    // are mapped back to the original bytes through vmap.
    bool same = true;
    for (size_t i = 0; i < len;) {
        uint32_t cpt;
        size_t n = kg_tokenizer_lcpp_decode((const unsigned char *)text + i, len - i, &cpt);
        if (!kg_tokenizer_is_canonical(cpt, n)) {
            same = false;
            break;
        }
        i += n;
    }
    if (same) {
        s->view = text;
    } else {
        if (!grow((void **)&s->view_buf, &s->view_cap, 3 * len + 4, 1) ||
            !grow((void **)&s->vmap, &s->vmap_cap, 3 * len + 4, sizeof(size_t))) {
            return false;
        }
        size_t v = 0;
        for (size_t i = 0; i < len;) {
            uint32_t cpt;
            size_t n = kg_tokenizer_lcpp_decode((const unsigned char *)text + i, len - i, &cpt);
            if (cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) {
                cpt = 0xFFFD;
            }
            s->vmap[v] = i;
            v += kg_utf8_put(cpt, s->view_buf + v);
            i += n;
        }
        s->vmap[v] = len;
        s->view = s->view_buf;
        len = v;
    }

    size_t n_spans = 0;
    int r = 0;
    bool ok = push_span(s, 0, &n_spans, 0, len);
    for (int i = 0; ok && i < tok->n_re; i++) {
        size_t n_out;
        ok = regex_split(s, tok->re[i], r, n_spans, &n_out);
        n_spans = n_out;
        r = 1 - r;
    }
    for (size_t k = 0; ok && k < n_spans; k++) {
        span_t sp = s->spans[r][k];
        if (same) {
            ok = bpe_piece(s, text + sp.off, sp.len, o);
        } else {
            size_t a = s->vmap[sp.off], b = s->vmap[sp.off + sp.len];
            ok = bpe_piece(s, text + a, b - a, o);
        }
    }
    return ok;
}

static int isspace_c(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* tokenizer_st_partition: cut the text at special-token texts, one token at
 * a time in cache order, every occurrence left to right. Returns the
 * fragment count in *n_frags (array in *frags), false on no memory. */
static bool partition(const kg_tokenizer_t *tok,
                      const char *text,
                      size_t len,
                      bool parse_special,
                      fragment_t **frags,
                      size_t *n_frags) {
    size_t n = 0, cap = 0, ncap = 0;
    fragment_t *cur = NULL, *next = NULL;
    bool ok = false;
    if (len == 0) {
        *frags = NULL;
        *n_frags = 0;
        return true;
    }
    if (!grow((void **)&cur, &cap, 1, sizeof(fragment_t))) {
        goto out;
    }
    cur[n++] = (fragment_t){-1, 0, len};
    for (int32_t k = 0; k < tok->n_special; k++) {
        int32_t id = tok->special[k];
        uint16_t a = tok->attr[id];
        if (!parse_special && (a & (ATTR_CONTROL | ATTR_UNKNOWN))) {
            continue; // user-defined tokens are matched either way
        }
        size_t tl;
        const char *t = kg_tokenizer_text(tok, id, &tl);
        size_t nn = 0;
        for (size_t f = 0; f < n; f++) {
            fragment_t fr = cur[f];
            const char *hit =
                fr.token < 0 ? kg_tokenizer_find_bytes(text + fr.off, fr.len, t, tl) : NULL;
            if (!hit) {
                if (!grow((void **)&next, &ncap, nn + 1, sizeof(fragment_t))) {
                    goto out;
                }
                next[nn++] = fr;
                continue;
            }
            size_t off = fr.off, flen = fr.len;
            while (flen > 0 && (hit = kg_tokenizer_find_bytes(text + off, flen, t, tl))) {
                size_t m = (size_t)(hit - text);
                size_t left = m - off;
                if ((a & ATTR_LSTRIP)) {
                    while (left > 0 && isspace_c(text[off + left - 1])) {
                        left--;
                    }
                }
                if (!grow((void **)&next, &ncap, nn + 2, sizeof(fragment_t))) {
                    goto out;
                }
                if (left > 0) {
                    next[nn++] = (fragment_t){-1, off, left};
                }
                next[nn++] = (fragment_t){id, m, tl};
                size_t roff = m + tl, rlen = off + flen - roff;
                if ((a & ATTR_RSTRIP)) {
                    while (rlen > 0 && isspace_c(text[roff])) {
                        roff++;
                        rlen--;
                    }
                }
                off = roff;
                flen = rlen;
            }
            if (flen > 0) {
                if (!grow((void **)&next, &ncap, nn + 1, sizeof(fragment_t))) {
                    goto out;
                }
                next[nn++] = (fragment_t){-1, off, flen};
            }
        }
        fragment_t *tmp = cur;
        size_t tcap = cap;
        cur = next;
        cap = ncap;
        next = tmp;
        ncap = tcap;
        n = nn;
    }
    ok = true;
out:
    free(next);
    if (!ok) {
        free(cur);
        cur = NULL;
        n = 0;
    }
    *frags = cur;
    *n_frags = n;
    return ok;
}

int64_t kg_tokenizer_encode(const kg_tokenizer_t *tok,
                            const char *text,
                            size_t len,
                            bool add_special,
                            bool parse_special,
                            int32_t *ids,
                            int64_t n_max) {
    if (len > (size_t)INT32_MAX) {
        return -1; // symbol offsets are 32-bit (llama.cpp takes an int32 length too)
    }
    out_t o = {ids, ids ? n_max : 0, 0};
    session_t s = {.tok = tok};
    fragment_t *frags = NULL;
    size_t n_frags = 0;
    bool ok = partition(tok, text, len, parse_special, &frags, &n_frags);
    if (ok && tok->kind == KG_TOKENIZER_BPE && tok->n_re > 0) {
        s.md = pcre2_match_data_create(16, NULL); // the overall match is all we read
        ok = s.md != NULL;
    }
    /* WordPiece starts every text with [CLS], whatever add_bos says (llama.cpp) */
    if (ok && add_special && (tok->add_bos || tok->kind == KG_TOKENIZER_WPM)) {
        emit(&o, tok->bos);
    }
    bool prev_special = true; // SPM: a leading space at the start and after special tokens
    for (size_t i = 0; ok && i < n_frags; i++) {
        const fragment_t *f = &frags[i];
        if (f->token >= 0) {
            emit(&o, f->token);
            prev_special = true;
        } else if (tok->kind == KG_TOKENIZER_WPM) {
            const int64_t n =
                kg_tokenizer_wpm_encode(tok, text + f->off, f->len, o.ids, o.n_max, o.n);
            ok = n >= 0;
            o.n = ok ? n : o.n;
        } else if (tok->kind == KG_TOKENIZER_UGM) {
            const int64_t n =
                kg_tokenizer_ugm_encode(tok, text + f->off, f->len, o.ids, o.n_max, o.n);
            ok = n >= 0;
            o.n = ok ? n : o.n;
        } else if (tok->kind == KG_TOKENIZER_SPM) {
            ok = spm_fragment(&s, text + f->off, f->len, tok->add_space_prefix && prev_special, &o);
            prev_special = false;
        } else {
            ok = bpe_fragment(&s, text + f->off, f->len, &o);
        }
    }
    if (ok && add_special && tok->add_eos) {
        emit(&o, tok->eos);
    }
    /* WordPiece ends every text with [SEP] (llama.cpp appends it whenever
     * special tokens are added) */
    if (ok && add_special && tok->kind == KG_TOKENIZER_WPM) {
        emit(&o, tok->sep);
    }
    pcre2_match_data_free(s.md);
    free(frags);
    free(s.sym);
    free(s.heap);
    free(s.buf);
    free(s.view_buf);
    free(s.vmap);
    free(s.spans[0]);
    free(s.spans[1]);
    free(s.esc);
    return ok ? o.n : -1;
}
