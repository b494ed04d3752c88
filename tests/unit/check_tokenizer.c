/* check_tokenizer: the SPM and BPE tokenizers against llama.cpp's own test
 * vectors (tokenizer-vectors/: phi-3 SPM, gpt-2, falcon and mpt BPE, Gemma 4's
 * SentencePiece-style BPE on a cut of its vocabulary), the
 * stories260K prompt, decoding round trips (also for invalid UTF-8 and NUL
 * bytes), special-token parsing, the EOG set, hand-made vocabularies for
 * the merge order and error paths, and `kgen tokenize` end to end. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_tokenizer.h"

#include <stdio.h>
#include <string.h>

static char err[512];

static const char *const vocab_names[] = {"phi-3", "gpt-2", "falcon", "mpt", "gemma-4-mini"};
#define N_VOCABS 5

static const char *vocab_path(const char *name) {
    static char path[4096];
    char rel[256];
    snprintf(rel, sizeof(rel), "tokenizer-vectors/ggml-vocab-%s.gguf", name);
    snprintf(path, sizeof(path), "%s", kg_test_data(rel));
    return path;
}

static kg_tokenizer_t *load_path(const char *path) {
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", path, err);
    kg_tokenizer_t *tok = kg_tokenizer_new(g, err, sizeof(err));
    ck_assert_msg(tok != NULL, "%s: %s", path, err);
    kg_gguf_free(g); // the tokenizer keeps its own copy
    return tok;
}

static kg_tokenizer_t *load_vocab(const char *name) {
    return load_path(vocab_path(name));
}

/* Encode into a malloc'ed array; *n gets the count. */
static int32_t *encode(const kg_tokenizer_t *tok,
                       const char *text,
                       size_t len,
                       bool add_special,
                       bool parse_special,
                       int64_t *n) {
    int64_t need = kg_tokenizer_encode(tok, text, len, add_special, parse_special, NULL, 0);
    ck_assert_int_ge(need, 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    int64_t got = kg_tokenizer_encode(tok, text, len, add_special, parse_special, ids, need);
    ck_assert_int_eq(got, need);
    *n = got;
    return ids;
}

/* The pieces of `ids` one token at a time, concatenated; *len gets the size. */
static char *
decode(const kg_tokenizer_t *tok, const int32_t *ids, int64_t n, bool special, size_t *len) {
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    for (int64_t i = 0; i < n; i++) {
        size_t need = kg_tokenizer_piece(tok, ids[i], special, NULL, 0);
        if (o + need + 1 > cap) {
            cap = (o + need + 1) * 2;
            s = realloc(s, cap);
        }
        ck_assert_uint_eq(kg_tokenizer_piece(tok, ids[i], special, s + o, need), need);
        o += need;
    }
    s[o] = '\0';
    *len = o;
    return s;
}

// ---- llama.cpp's test vectors ----

typedef struct vectors {
    char *inp; /* the .inp file; strings point into it */
    char *out; /* the .out file */
    const char *str[128];
    size_t len[128];
    char *ids[128]; /* one line of the .out file each */
    int n;
} vectors_t;

/* X.gguf.inp holds each test string followed by "\n__ggml_vocab_test__\n";
 * X.gguf.out one line of ids per string (the empty string's line is empty). */
static void load_vectors(const char *name, vectors_t *v) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char path[4200];
    size_t n;
    memset(v, 0, sizeof(*v));
    snprintf(path, sizeof(path), "%s.inp", vocab_path(name));
    v->inp = kg_test_read_file(path, &n);
    ck_assert_msg(v->inp != NULL, "cannot read %s", path);
    char *p = v->inp, *end = v->inp + n;
    while (p < end) {
        char *s = strstr(p, sep);
        ck_assert_msg(s != NULL, "%s: text after the last separator", path);
        ck_assert_int_lt(v->n, 128);
        v->str[v->n] = p;
        v->len[v->n] = (size_t)(s - p);
        *s = '\0';
        v->n++;
        p = s + strlen(sep);
    }
    snprintf(path, sizeof(path), "%s.out", vocab_path(name));
    v->out = kg_test_read_file(path, &n);
    ck_assert_msg(v->out != NULL, "cannot read %s", path);
    int lines = 0;
    for (char *line = v->out; line < v->out + n; lines++) {
        char *nl = strchr(line, '\n');
        ck_assert_msg(nl != NULL, "%s: last line without newline", path);
        *nl = '\0';
        ck_assert_int_lt(lines, 128);
        v->ids[lines] = line;
        line = nl + 1;
    }
    ck_assert_msg(lines == v->n, "%s: %d id lines for %d strings", path, lines, v->n);
}

static void free_vectors(vectors_t *v) {
    free(v->inp);
    free(v->out);
}

/* Parse a line of ids; returns the count. */
static int64_t parse_ids(const char *line, int32_t *ids, int64_t cap) {
    int64_t n = 0;
    char *end;
    for (const char *p = line;;) {
        long v = strtol(p, &end, 10);
        if (end == p) {
            break;
        }
        ck_assert_int_lt(n, cap);
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

static bool ids_equal(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
}

START_TEST(vectors_match) {
    const char *name = vocab_names[_i];
    kg_tokenizer_t *tok = load_vocab(name);
    vectors_t v;
    load_vectors(name, &v);
    ck_assert_int_eq(v.n, 46);
    int pass = 0;
    for (int i = 0; i < v.n; i++) {
        int32_t want[1024];
        int64_t n_want = parse_ids(v.ids[i], want, 1024), n_got;
        int32_t *got = encode(tok, v.str[i], v.len[i], false, false, &n_got);
        if (ids_equal(got, n_got, want, n_want)) {
            pass++;
        } else {
            fprintf(stderr, "%s: string %d (%zu bytes) differs: %lld ids, want %lld\n", name, i,
                    v.len[i], (long long)n_got, (long long)n_want);
        }
        free(got);
    }
    printf("tokenizer vectors %s: %d/%d\n", name, pass, v.n);
    ck_assert_int_eq(pass, v.n);
    free_vectors(&v);
    kg_tokenizer_free(tok);
}
END_TEST

/* decode(encode(s)) == s, one piece at a time (SPM: plus its leading space). */
START_TEST(vectors_round_trip) {
    const char *name = vocab_names[_i];
    kg_tokenizer_t *tok = load_vocab(name);
    bool spm = kg_tokenizer_kind(tok) == KG_TOKENIZER_SPM;
    vectors_t v;
    load_vectors(name, &v);
    for (int i = 0; i < v.n; i++) {
        int64_t n;
        size_t len;
        int32_t *ids = encode(tok, v.str[i], v.len[i], false, false, &n);
        char *back = decode(tok, ids, n, false, &len);
        size_t skip = spm && v.len[i] > 0 ? 1 : 0;
        ck_assert_uint_eq(len, v.len[i] + skip);
        if (skip) {
            ck_assert_int_eq(back[0], ' ');
        }
        ck_assert_msg(memcmp(back + skip, v.str[i], v.len[i]) == 0, "%s: string %d", name, i);
        free(back);
        free(ids);
    }
    free_vectors(&v);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- the shared model ----

START_TEST(stories_prompt) {
    kg_tokenizer_t *tok = load_path(kg_test_data("models/stories260K.gguf"));
    ck_assert_int_eq(kg_tokenizer_kind(tok), KG_TOKENIZER_SPM);
    ck_assert_int_eq(kg_tokenizer_n_vocab(tok), 512);
    ck_assert_int_eq(kg_tokenizer_bos(tok), 1);
    ck_assert_int_eq(kg_tokenizer_eos(tok), 2);
    ck_assert(kg_tokenizer_add_bos(tok));
    ck_assert(!kg_tokenizer_add_eos(tok));
    const int32_t want[] = {1, 403, 407, 261, 378};
    int64_t n;
    int32_t *ids = encode(tok, "Once upon a time", 16, true, true, &n);
    ck_assert(ids_equal(ids, n, want, 5));
    free(ids);
    ids = encode(tok, "Once upon a time", 16, false, true, &n);
    ck_assert(ids_equal(ids, n, want + 1, 4));
    free(ids);
    // an empty text: only BOS (SentencePiece's encode('') with special tokens)
    ids = encode(tok, "", 0, true, true, &n);
    ck_assert(ids_equal(ids, n, want, 1));
    free(ids);
    ck_assert(kg_tokenizer_is_eog(tok, 2));
    ck_assert(!kg_tokenizer_is_eog(tok, 1));
    ck_assert(kg_tokenizer_is_control(tok, 1));
    // BOS prints nothing unless special pieces are asked for
    char buf[16];
    ck_assert_uint_eq(kg_tokenizer_piece(tok, 1, false, buf, sizeof(buf)), 0);
    ck_assert_uint_eq(kg_tokenizer_piece(tok, 1, true, buf, sizeof(buf)), 3);
    ck_assert(memcmp(buf, "<s>", 3) == 0);
    // the byte token of '\n'
    ck_assert_uint_eq(kg_tokenizer_piece(tok, 13, false, buf, sizeof(buf)), 1);
    ck_assert_int_eq(buf[0], '\n');
    kg_tokenizer_free(tok);
}
END_TEST

/* Writes at most n_max ids, and says how many the text needs. */
START_TEST(short_buffer) {
    kg_tokenizer_t *tok = load_path(kg_test_data("models/stories260K.gguf"));
    int32_t ids[3] = {-7, -7, -7};
    ck_assert_int_eq(kg_tokenizer_encode(tok, "Once upon a time", 16, true, true, ids, 2), 5);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 403);
    ck_assert_int_eq(ids[2], -7);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- bytes that are not clean UTF-8 ----

/* Replace each U+2581 by a space, in place; returns the new length. SPM
 * escapes spaces before it splits characters, so where an invalid lead
 * byte swallows an escaped space, or the vocabulary has no "▁" token, the
 * space comes back as the three byte tokens of U+2581 (as in llama.cpp). */
static size_t unescape_spaces(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            s[o++] = ' ';
            i += 3;
        } else {
            s[o++] = s[i++];
        }
    }
    return o;
}

/* Remove the bytes a BPE vocabulary has no token for (falcon and mpt lack
 * bytes such as 0xFF that valid UTF-8 never uses; llama.cpp drops them). */
static size_t drop_untokenizable(const kg_tokenizer_t *tok, char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (kg_tokenizer_encode(tok, s + i, 1, false, false, NULL, 0) > 0) {
            s[o++] = s[i];
        }
    }
    return o;
}

/* Whether s[0..n) is whole UTF-8 characters (structure only). */
static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
        if (len == 0 || i + len > n) {
            return false;
        }
        for (size_t j = 1; j < len; j++) {
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) {
                return false;
            }
        }
        i += len;
    }
    return true;
}

/* A text split into byte-level tokens decodes one token at a time to its
 * bytes even where a token ends inside a character. */
START_TEST(utf8_split_across_tokens) {
    static const char *const texts[] = {"\xf0\x9f\xa6\x99 llama \xe1\x9e\x80\xe1\x9e\xb6",
                                        "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8"};
    for (int v = 0; v < N_VOCABS; v++) {
        kg_tokenizer_t *tok = load_vocab(vocab_names[v]);
        bool spm = kg_tokenizer_kind(tok) == KG_TOKENIZER_SPM;
        int partial = 0;
        for (int t = 0; t < 2; t++) {
            int64_t n;
            size_t len, tl = strlen(texts[t]);
            int32_t *ids = encode(tok, texts[t], tl, false, false, &n);
            char *back = decode(tok, ids, n, false, &len);
            ck_assert_uint_eq(len, tl + spm);
            ck_assert(memcmp(back + spm, texts[t], tl) == 0);
            for (int64_t i = 0; i < n; i++) {
                char piece[64];
                size_t pl = kg_tokenizer_piece(tok, ids[i], false, piece, sizeof(piece));
                partial += !valid_utf8(piece, pl);
            }
            free(back);
            free(ids);
        }
        ck_assert_msg(partial > 0, "%s: no token split a character", vocab_names[v]);
        kg_tokenizer_free(tok);
    }
}
END_TEST

/* Any bytes tokenize, and decode back: for BPE exactly (llama.cpp would
 * turn invalid bytes into U+FFFD there) but for bytes the vocabulary has no
 * token for, for SPM up to spaces an invalid lead byte swallowed. gpt-2 has
 * all 256 byte tokens: there nothing may be lost. */
START_TEST(invalid_utf8_round_trip) {
    static const char text[] = "a\0b\xff\xfe c\xc3( \xe2\x82 z\xf0\x9f\x98 \x80\x80!\xc0\x80"
                               "\xed\xa0\x80\xf4\x90\x80\x80 end\xe2";
    size_t tl = sizeof(text) - 1;
    const char *paths[N_VOCABS + 1];
    for (int v = 0; v < N_VOCABS; v++) {
        char *p = malloc(4096);
        snprintf(p, 4096, "%s", vocab_path(vocab_names[v]));
        paths[v] = p;
    }
    paths[N_VOCABS] = kg_test_data("models/stories260K.gguf");
    for (int v = 0; v <= N_VOCABS; v++) {
        kg_tokenizer_t *tok = load_path(paths[v]);
        bool spm = kg_tokenizer_kind(tok) == KG_TOKENIZER_SPM;
        if (v == 1) {
            char all[256];
            for (int b = 0; b < 256; b++) {
                all[b] = (char)b;
            }
            ck_assert_uint_eq(drop_untokenizable(tok, all, 256), 256);
        }
        // every suffix, so that each invalid sequence is also cut at the end
        for (size_t start = 0; start < tl; start++) {
            int64_t n;
            size_t len;
            int32_t *ids = encode(tok, text + start, tl - start, false, true, &n);
            for (int64_t i = 0; i < n; i++) {
                ck_assert(ids[i] >= 0 && ids[i] < kg_tokenizer_n_vocab(tok));
            }
            char *back = decode(tok, ids, n, false, &len);
            char want[64];
            size_t wl = tl - start;
            memcpy(want, text + start, wl);
            if (spm) {
                len = unescape_spaces(back, len);
                wl = unescape_spaces(want, wl);
                ck_assert_int_eq(back[0], ' ');
            } else {
                wl = drop_untokenizable(tok, want, wl);
            }
            ck_assert_uint_eq(len, wl + spm);
            ck_assert_msg(memcmp(back + spm, want, wl) == 0, "%s from %zu", paths[v], start);
            free(back);
            free(ids);
        }
        kg_tokenizer_free(tok);
    }
    for (int v = 0; v < N_VOCABS; v++) {
        free((char *)paths[v]);
    }
}
END_TEST

// ---- special tokens ----

static bool contains(const int32_t *ids, int64_t n, int32_t id) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == id) {
            return true;
        }
    }
    return false;
}

START_TEST(special_parsing_bpe) {
    kg_tokenizer_t *tok = load_vocab("gpt-2");
    const char *text = "hi<|endoftext|>there";
    int32_t eot = kg_tokenizer_find(tok, "<|endoftext|>", 13);
    ck_assert_int_eq(eot, 50256);
    int64_t n;
    int32_t *ids = encode(tok, text, strlen(text), false, true, &n);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(ids[1], eot);
    size_t len;
    char *back = decode(tok, ids, n, true, &len);
    ck_assert_str_eq(back, text);
    free(back);
    back = decode(tok, ids, n, false, &len); // control tokens print nothing by default
    ck_assert_str_eq(back, "hithere");
    free(back);
    free(ids);
    // without parse_special the same text is plain text
    ids = encode(tok, text, strlen(text), false, false, &n);
    ck_assert_int_gt(n, 3);
    ck_assert(!contains(ids, n, eot));
    back = decode(tok, ids, n, false, &len);
    ck_assert_str_eq(back, text);
    free(back);
    free(ids);
    // BPE adds no BOS by default
    ck_assert(!kg_tokenizer_add_bos(tok));
    ids = encode(tok, "hi", 2, true, true, &n);
    ck_assert(!contains(ids, n, eot));
    free(ids);
    ck_assert(kg_tokenizer_is_eog(tok, eot));
    ck_assert(kg_tokenizer_is_control(tok, eot));
    ck_assert(!kg_tokenizer_is_eog(tok, 0));
    kg_tokenizer_free(tok);
}
END_TEST

/* mpt's user-defined whitespace tokens are cut out even without
 * parse_special; its control tokens only with it. */
START_TEST(special_user_defined) {
    kg_tokenizer_t *tok = load_vocab("mpt");
    int32_t four = kg_tokenizer_find(tok, "    ", 4);
    ck_assert_int_ge(four, 0);
    int64_t n;
    int32_t *ids = encode(tok, "a    b", 6, false, false, &n);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(ids[1], four);
    free(ids);
    ids = encode(tok, "x<|endoftext|>", 14, false, false, &n);
    ck_assert(!contains(ids, n, 0));
    free(ids);
    ids = encode(tok, "x<|endoftext|>", 14, false, true, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ids[1], 0);
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

/* phi-3: the SPM space prefix after a special token, llama.cpp's right-strip
 * of special tokens for Phi-3 files, and its EOG set. */
START_TEST(special_parsing_spm) {
    kg_tokenizer_t *tok = load_vocab("phi-3");
    int32_t user = kg_tokenizer_find(tok, "<|user|>", 8);
    int32_t end = kg_tokenizer_find(tok, "<|end|>", 7);
    ck_assert_int_ge(user, 0);
    ck_assert_int_ge(end, 0);
    const char *text = "<|user|>\nHi<|end|>";
    int64_t n;
    size_t len;
    int32_t *ids = encode(tok, text, strlen(text), true, true, &n);
    ck_assert_int_ge(n, 4);
    ck_assert_int_eq(ids[0], kg_tokenizer_bos(tok));
    ck_assert_int_eq(ids[1], user);
    ck_assert_int_eq(ids[n - 1], end);
    char *back = decode(tok, ids + 1, n - 1, true, &len);
    ck_assert_str_eq(back, "<|user|> Hi<|end|>"); // "\n" stripped, " " prefixed
    free(back);
    free(ids);
    ids = encode(tok, text, strlen(text), false, false, &n);
    ck_assert(!contains(ids, n, user) && !contains(ids, n, end));
    back = decode(tok, ids, n, false, &len);
    ck_assert_int_eq(back[0], ' ');
    ck_assert_str_eq(back + 1, text);
    free(back);
    free(ids);
    ck_assert(kg_tokenizer_add_bos(tok));
    ck_assert_int_eq(kg_tokenizer_eos(tok), 32000);
    ck_assert(kg_tokenizer_is_eog(tok, 32000));
    ck_assert(kg_tokenizer_is_eog(tok, end));
    ck_assert(kg_tokenizer_is_eog(tok, kg_tokenizer_find(tok, "</s>", 4)));
    ck_assert(!kg_tokenizer_is_eog(tok, user));
    ck_assert(!kg_tokenizer_is_eog(tok, -1));
    ck_assert(!kg_tokenizer_is_eog(tok, 1 << 30));
    kg_gguf_str_t t = kg_tokenizer_token_text(tok, user);
    ck_assert_uint_eq(t.len, 8);
    ck_assert(memcmp(t.data, "<|user|>", 8) == 0);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- hand-made vocabularies ----

typedef struct mini {
    const char *model, *pre;
    const char *const *tokens;
    const float *scores;
    const int32_t *types;
    const char *const *merges;
    int n_tokens, n_merges;
    int add_space_prefix; /* -1: not in the file */
    int bos;              /* tokenizer.ggml.bos_token_id; -1: not in the file */
} mini_t;

static kg_tokenizer_t *make_mini(const mini_t *m) {
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    kg_gguf_str_t strs[64];
    if (m->model) {
        kg_gguf_writer_set_str(w, "tokenizer.ggml.model", m->model);
    }
    if (m->pre) {
        kg_gguf_writer_set_str(w, "tokenizer.ggml.pre", m->pre);
    }
    if (m->tokens) {
        for (int i = 0; i < m->n_tokens; i++) {
            strs[i] = (kg_gguf_str_t){m->tokens[i], strlen(m->tokens[i])};
        }
        kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, (uint64_t)m->n_tokens);
    }
    if (m->scores) {
        kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", m->scores, (uint64_t)m->n_tokens);
    }
    if (m->types) {
        kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", m->types, (uint64_t)m->n_tokens);
    }
    if (m->merges) {
        for (int i = 0; i < m->n_merges; i++) {
            strs[i] = (kg_gguf_str_t){m->merges[i], strlen(m->merges[i])};
        }
        kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", strs, (uint64_t)m->n_merges);
    }
    if (m->bos >= 0) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos);
    }
    if (m->add_space_prefix >= 0) {
        kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", m->add_space_prefix != 0);
    }
    uint8_t *data;
    size_t size;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &data, &size), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_t *g = kg_gguf_open_memory(data, size, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    err[0] = '\0';
    kg_tokenizer_t *tok = kg_tokenizer_new(g, err, sizeof(err));
    kg_gguf_free(g);
    free(data);
    return tok;
}

/* Merges apply lowest rank first, and the leftmost pair among equals. */
START_TEST(bpe_merge_order) {
    static const char *const tokens[] = {"a", "b", "c", "ab", "bc", "abc", "aa", "x"};
    static const char *const by_bc[] = {"b c", "a b", "ab c", "a a"};
    static const char *const by_ab[] = {"a b", "b c", "ab c", "a a"};
    mini_t m = {"gpt2", "gpt-2", tokens, NULL, NULL, by_bc, 8, 4, -1, -1};
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    int64_t n;
    int32_t *ids = encode(tok, "abc", 3, true, true, &n);
    const int32_t want_bc[] = {0, 4}; // a + bc: "ab c" never gets a chance
    ck_assert(ids_equal(ids, n, want_bc, 2));
    free(ids);
    ids = encode(tok, "aaa", 3, false, false, &n);
    const int32_t want_aa[] = {6, 0}; // aa + a, not a + aa
    ck_assert(ids_equal(ids, n, want_aa, 2));
    free(ids);
    // a byte with no token of its own is dropped, as llama.cpp does
    ids = encode(tok, "az", 2, false, false, &n);
    ck_assert(ids_equal(ids, n, want_aa + 1, 1));
    free(ids);
    kg_tokenizer_free(tok);

    m.merges = by_ab;
    tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    ids = encode(tok, "abc", 3, false, false, &n);
    const int32_t want_abc[] = {5};
    ck_assert(ids_equal(ids, n, want_abc, 1));
    free(ids);
    // the gpt-2 pre-tokenizer cuts "abc" "!" "x" ("!" has no token: dropped)
    ids = encode(tok, "abc!x", 5, false, false, &n);
    const int32_t want_cut[] = {5, 7};
    ck_assert(ids_equal(ids, n, want_cut, 2));
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

#define LOW8 "\xe2\x96\x81"

/* The highest-scoring pair merges first; unknown characters fall back to
 * byte tokens, or to <unk> when there are none. */
START_TEST(spm_scores) {
    static const char *const tokens[] = {
        "<unk>", "<s>", "</s>", LOW8, "a", "b", "c", LOW8 "a", "ab", "bc", "<0x7A>",
    };
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6};
    float scores[] = {0, 0, 0, -1, -1, -1, -1, -5, -3, -2, 0};
    mini_t m = {"llama", NULL, tokens, scores, types, NULL, 11, 0, -1, -1};
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    int64_t n;
    // "▁abc": bc (-2) beats ab (-3) beats ▁a (-5)
    int32_t *ids = encode(tok, "abc", 3, true, false, &n);
    const int32_t want1[] = {1, 7, 9};
    ck_assert(ids_equal(ids, n, want1, 3));
    free(ids);
    scores[8] = -1.5f; // now ab wins: ▁ + ab + c
    kg_tokenizer_free(tok);
    tok = make_mini(&m);
    ids = encode(tok, "abc", 3, false, false, &n);
    const int32_t want2[] = {3, 8, 6};
    ck_assert(ids_equal(ids, n, want2, 3));
    free(ids);
    // 'z' has a byte token, 'q' does not: <unk>
    ids = encode(tok, "zq", 2, false, false, &n);
    const int32_t want3[] = {3, 10, 0};
    ck_assert(ids_equal(ids, n, want3, 3));
    free(ids);
    kg_tokenizer_free(tok);
    // no leading space when the file says so
    m.add_space_prefix = 0;
    tok = make_mini(&m);
    ids = encode(tok, "a b", 3, false, false, &n);
    const int32_t want5[] = {4, 3, 5}; // "a▁b": neither "a▁" nor "▁b" is a token
    ck_assert(ids_equal(ids, n, want5, 3));
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

START_TEST(bad_vocabularies) {
    static const char *const tokens[] = {"a", "b", "ab"};
    static const char *const dup[] = {"a", "b", "a"};
    static const char *const merges[] = {"a b"};
    mini_t m = {"bert", NULL, tokens, NULL, NULL, merges, 3, 1, -1, 0};
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "bert"));
    m.model = NULL;
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "tokenizer.ggml.model"));
    m.model = "gpt2";
    m.pre = "no-such-pre";
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "no-such-pre"));
    m.pre = "qwen2";
    m.merges = NULL;
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "merges"));
    m.merges = merges;
    m.tokens = NULL;
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "tokenizer.ggml.tokens"));
    m.tokens = dup;
    ck_assert_ptr_null(make_mini(&m));
    ck_assert_ptr_nonnull(strstr(err, "duplicate"));
    // and the good one: every supported pre-tokenizer compiles
    static const char *const pres[] = {
        "default",      "llama-bpe",      "qwen2",     "smollm",    "falcon",
        "mpt",          "starcoder",      "refact",    "command-r", "dbrx",
        "deepseek-llm", "deepseek-coder", "poro-chat", "viking",    "tekken",
        "chameleon",    "chatglm-bpe",    "gpt-4o",    "gpt-2",
    };
    m.tokens = tokens;
    for (size_t i = 0; i < sizeof(pres) / sizeof(pres[0]); i++) {
        m.pre = pres[i];
        kg_tokenizer_t *tok = make_mini(&m);
        ck_assert_msg(tok != NULL, "%s: %s", pres[i], err);
        int64_t n;
        const char *text = "ab 12345 \xce\xb1\xce\xb2 \xe4\xb8\xad\xe6\x96\x87 x!\n\n  y";
        int32_t *ids = encode(tok, text, strlen(text), false, false, &n);
        free(ids);
        kg_tokenizer_free(tok);
    }
}
END_TEST

/* llama-bpe's regex cuts "Hello world1234!!\n\n" into "Hello", " world",
 * "123", "4" and "!!\n\n"; with ignore_merges each piece that is a token
 * comes out whole, and the last one (not a token, no single-byte tokens for
 * its bytes) is dropped, as llama.cpp drops unknown bytes. The gpt-2 regex
 * would cut "1234" and "!!" "\n\n" differently. */
START_TEST(pretokenizer_cuts) {
    static const char *const tokens[] = {
        "Hello", "\xc4\xa0world", "123", "4", "!!", "\xc4\x8a\xc4\x8a", "H", "e", "l", "o"};
    mini_t m = {"gpt2", "llama-bpe", tokens, NULL, NULL, NULL, 10, 0, -1, 9};
    static const char *const merges[] = {"H e"};
    m.merges = merges;
    m.n_merges = 1;
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    int64_t n;
    const char *text = "Hello world1234!!\n\n";
    int32_t *ids = encode(tok, text, strlen(text), false, false, &n);
    const int32_t want[] = {0, 1, 2, 3};
    ck_assert(ids_equal(ids, n, want, 4));
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

/* A whitespace run longer than PCRE2's default match limit (10M steps:
 * `\s*[\r\n]+` backtracks once per space) still tokenizes. */
START_TEST(long_whitespace_run) {
    static const char *const tokens[] = {"\xc4\xa0", "a", "\xc4\xa0\xc4\xa0"};
    static const char *const merges[] = {"a a"};
    mini_t m = {"gpt2", "qwen2", tokens, NULL, NULL, merges, 3, 1, -1, -1};
    kg_tokenizer_t *tok = make_mini(&m);
    ck_assert_msg(tok != NULL, "%s", err);
    size_t n = 10500000;
    char *text = malloc(n + 1);
    memset(text, ' ', n);
    text[n] = 'a';
    // qwen2: n - 1 spaces, then " a" (no merge for it: "Ġ" "a")
    ck_assert_int_eq(kg_tokenizer_encode(tok, text, n + 1, false, false, NULL, 0), (int64_t)n + 1);
    free(text);
    kg_tokenizer_free(tok);
}
END_TEST

// ---- kgen tokenize ----

static char *run_tokenize(const char *args, const char *input, size_t len, int *status) {
    const char *in = kg_test_tmp_path("tok-in");
    FILE *f = fopen(in, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(input, 1, len, f), len);
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s/kgen tokenize %s < '%s' 2>/dev/null", KG_BIN_DIR, args, in);
    char *out = kg_test_run(cmd, status);
    remove(in);
    return out;
}

START_TEST(cli_vectors) {
    for (int v = 0; v < N_VOCABS; v++) {
        vectors_t vec;
        load_vectors(vocab_names[v], &vec);
        char args[4300];
        snprintf(args, sizeof(args), "--model '%s' --no-bos", vocab_path(vocab_names[v]));
        int pass = 0;
        for (int i = 0; i < vec.n; i++) {
            int status;
            char *out = run_tokenize(args, vec.str[i], vec.len[i], &status);
            ck_assert_int_eq(status, 0);
            // expected: the ids separated by single spaces, then a newline
            char want[8192];
            const char *p = vec.ids[i];
            while (*p == ' ') {
                p++;
            }
            snprintf(want, sizeof(want), "%s\n", p);
            if (strcmp(out, want) == 0) {
                pass++;
            } else {
                fprintf(stderr, "kgen tokenize %s string %d: got '%s'\n", vocab_names[v], i, out);
            }
            free(out);
        }
        printf("kgen tokenize vectors %s: %d/%d\n", vocab_names[v], pass, vec.n);
        ck_assert_int_eq(pass, vec.n);
        free_vectors(&vec);
    }
}
END_TEST

START_TEST(cli_flags) {
    int status;
    char args[4300];
    const char *stories = kg_test_data("models/stories260K.gguf");
    snprintf(args, sizeof(args), "--model '%s'", stories);
    char *out = run_tokenize(args, "Once upon a time", 16, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_str_eq(out, "1 403 407 261 378\n");
    free(out);
    snprintf(args, sizeof(args), "--model='%s' --no-bos", stories);
    out = run_tokenize(args, "Once upon a time", 16, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_str_eq(out, "403 407 261 378\n");
    free(out);
    // special tokens are parsed unless --no-parse-special
    snprintf(args, sizeof(args), "--model '%s' --no-bos", vocab_path("gpt-2"));
    out = run_tokenize(args, "<|endoftext|>", 13, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_str_eq(out, "50256\n");
    free(out);
    snprintf(args, sizeof(args), "--model '%s' --no-bos --no-parse-special", vocab_path("gpt-2"));
    out = run_tokenize(args, "<|endoftext|>", 13, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_ptr_null(strstr(out, "50256"));
    free(out);
    // NUL bytes and a trailing newline are input like any other byte
    out = run_tokenize(args, "a\0\n", 3, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_str_eq(out, "64 188 198\n");
    free(out);
    out = run_tokenize("--help", "", 0, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_ptr_nonnull(strstr(out, "--no-parse-special"));
    free(out);
    out = run_tokenize("--version", "", 0, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_ptr_nonnull(strstr(out, "kgen"));
    free(out);
    out = run_tokenize("--model", "", 0, &status);
    ck_assert_int_eq(status, 2);
    free(out);
    out = run_tokenize("--bogus", "", 0, &status);
    ck_assert_int_eq(status, 2);
    free(out);
    out = run_tokenize("", "", 0, &status);
    ck_assert_int_eq(status, 2);
    free(out);
    out = run_tokenize("--model /nonexistent/x.gguf", "x", 1, &status);
    ck_assert_int_eq(status, 1);
    ck_assert_str_eq(out, "");
    free(out);
}
END_TEST

/* A model from `kgen mkmodel` (its built-in byte vocabulary) tokenizes
 * any bytes and decodes them back. */
START_TEST(mkmodel_vocab) {
    kg_test_model_opts_t o = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 64, .seed = 7};
    const char *path = kg_test_make_model(&o);
    ck_assert_msg(path != NULL, "kgen mkmodel failed");
    kg_tokenizer_t *tok = load_path(path);
    char text[300];
    for (int i = 0; i < 256; i++) {
        text[i] = (char)i;
    }
    static const char tail[] = "Once upon a time \xe2\x96\x81 <s>";
    memcpy(text + 256, tail, sizeof(tail) - 1);
    size_t tl = 256 + sizeof(tail) - 1;
    int64_t n;
    int32_t *ids = encode(tok, text, tl, false, false, &n);
    ck_assert_int_gt(n, 0);
    for (int64_t i = 0; i < n; i++) {
        ck_assert(ids[i] >= 0 && ids[i] < kg_tokenizer_n_vocab(tok));
    }
    size_t len, wl = tl;
    char *back = decode(tok, ids, n, false, &len);
    if (kg_tokenizer_kind(tok) == KG_TOKENIZER_SPM) {
        // a byte vocabulary without "▁" gives spaces back as U+2581
        len = unescape_spaces(back, len);
        wl = unescape_spaces(text, wl);
        ck_assert_int_eq(back[0], ' ');
        ck_assert_uint_eq(len, wl + 1);
        ck_assert(memcmp(back + 1, text, wl) == 0);
    } else {
        ck_assert_uint_eq(len, wl);
        ck_assert(memcmp(back, text, wl) == 0);
    }
    free(back);
    free(ids);
    kg_tokenizer_free(tok);
    remove(path);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("vectors");
    tcase_add_loop_test(tc, vectors_match, 0, N_VOCABS);
    tcase_add_loop_test(tc, vectors_round_trip, 0, N_VOCABS);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    tc = tcase_create("spm");
    tcase_add_test(tc, stories_prompt);
    tcase_add_test(tc, short_buffer);
    tcase_add_test(tc, spm_scores);
    suite_add_tcase(s, tc);
    tc = tcase_create("bytes");
    tcase_add_test(tc, utf8_split_across_tokens);
    tcase_add_test(tc, invalid_utf8_round_trip);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    tc = tcase_create("special");
    tcase_add_test(tc, special_parsing_bpe);
    tcase_add_test(tc, special_user_defined);
    tcase_add_test(tc, special_parsing_spm);
    suite_add_tcase(s, tc);
    tc = tcase_create("bpe");
    tcase_add_test(tc, bpe_merge_order);
    tcase_add_test(tc, pretokenizer_cuts);
    tcase_add_test(tc, bad_vocabularies);
    suite_add_tcase(s, tc);
    tc = tcase_create("long");
    tcase_set_tags(tc, "slow");
    tcase_add_test(tc, long_whitespace_run);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_add_test(tc, cli_vectors);
    tcase_add_test(tc, cli_flags);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    tc = tcase_create("mkmodel");
    tcase_add_test(tc, mkmodel_vocab);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
