/* kg_tokenizer_int: what the tokenizer's files share, and no one else. The
 * tokenizer struct is built once by kg_tokenizer_build.c and only read
 * afterwards: by the lookups and getters (kg_tokenizer.c) and by encoding
 * (kg_tokenizer_encode.c); kg_tokenizer_pre.c holds the pre-tokenizer table
 * the build picks from. See kg_tokenizer.c for the design. */
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include "kg_tokenizer.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- attributes (llama_token_attr) ----

enum {
    ATTR_UNDEFINED = 0,
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
    ATTR_EOG = 1 << 15, /* ours: member of the end-of-generation set */
};

/* tokenizer.ggml.token_type values (llama_token_type) */
enum {
    TYPE_UNDEFINED = 0,
    TYPE_NORMAL = 1,
    TYPE_UNKNOWN = 2,
    TYPE_CONTROL = 3,
    TYPE_USER_DEFINED = 4,
    TYPE_UNUSED = 5,
    TYPE_BYTE = 6,
};

#define MAX_REGEX 8

struct kg_tokenizer {
    kg_tokenizer_kind_t kind;
    int32_t n_vocab;
    char *text;          /* (sum of token lengths) the token texts, back to back */
    uint32_t *text_off;  /* (n_vocab + 1) offsets into text */
    float *score;        /* (n_vocab) */
    uint16_t *attr;      /* (n_vocab) ATTR_* */
    uint64_t *tok_slots; /* (tok_mask + 1) hash << 32 | (id + 1); 0 = empty */
    size_t tok_mask;
    char *piece;         /* decoded bytes of each token (as printed with special = true) */
    uint32_t *piece_off; /* (n_vocab + 1) */

    /* BPE merges: "left right" strings, rank = index of first occurrence */
    char *merge_text;
    uint32_t *merge_off;   /* (n_merges + 1) */
    uint32_t *merge_split; /* (n_merges) position of the separating space */
    uint64_t *merge_slots; /* (merge_mask + 1) hash << 32 | (rank + 1) */
    size_t merge_mask;
    int32_t n_merges;

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    /* SentencePiece-style BPE (Gemma 4): merges over raw UTF-8 characters, no
     * GPT-2 byte map, spaces written "▁" first, <0xXX> byte fallback */
    bool bpe_spm;

    int32_t *special; /* control/user-defined/unknown tokens, longest text first */
    int32_t n_special;
    int32_t byte_tok[256]; /* SPM byte fallback: the <0xXX> token of each byte, or -1 */
    bool isolated[128];    /* SPM: no token longer than one byte contains this ASCII byte */

    pcre2_code *re[MAX_REGEX]; /* BPE pre-tokenizer, applied in order */
    int n_re;
    pcre2_match_context *mctx; /* no match limit; only read by pcre2_match */
    char bmap[256][2];         /* GPT-2 byte -> UTF-8 of its code point (1 or 2 bytes) */
    uint8_t bmap_len[256];
    int16_t bmap_inv[324]; /* code point (< 0x144) -> byte, or -1 */

    /* WordPiece (bert): the separator appended after the text, llama.cpp's
     * BertNormalizer options and the longest token in bytes */
    int32_t sep;
    bool add_sep, wpm_lowercase, wpm_strip_accents;
    size_t wpm_max_len;

    /* SentencePiece unigram (t5): the precompiled charsmap (its XOR-compressed
     * double array and the replacement strings), the unknown token's score,
     * and a filter of the entries' prefixes (kg_tokenizer_ugm.c) */
    uint32_t *ugm_xcda;
    size_t ugm_xcda_n;
    char *ugm_repl;
    size_t ugm_repl_n;
    float ugm_unk_score;
    bool ugm_remove_extra_ws;
    uint64_t *ugm_bits;
    size_t ugm_bits_mask;
    uint64_t ugm_ud_first[4]; /* first bytes of the user-defined tokens */
};

#define LOW8 "\xe2\x96\x81" /* U+2581 "▁", SentencePiece's space */

// ---- hashing (the token and merge tables) ----

#define HASH_SEED 2166136261u

/** FNV-1a of `n` bytes, continuing from `h` (HASH_SEED to start). */
uint32_t kg_tokenizer_hash(uint32_t h, const char *s, size_t n);
/** The table slot of a hash, before masking. */
size_t kg_tokenizer_slot(uint32_t h);

// ---- UTF-8 as llama.cpp reads it ----

/** One code point as llama.cpp's unicode_cpt_from_utf8 reads it; an invalid
 * sequence gives U+FFFD and consumes one byte. Returns the bytes consumed. */
size_t kg_tokenizer_lcpp_decode(const unsigned char *s, size_t n, uint32_t *cpt);
/** First occurrence of `needle` in `hay`, or NULL. */
const char *kg_tokenizer_find_bytes(const char *hay, size_t hn, const char *needle, size_t nn);
/** Whether `len` bytes decoded to `cpt` are exactly its UTF-8 form. */
bool kg_tokenizer_is_canonical(uint32_t cpt, size_t len);

// ---- vocabulary ----

/** Token `id`'s text (borrowed from the tokenizer) and its length. */
const char *kg_tokenizer_text(const kg_tokenizer_t *tok, int32_t id, size_t *len);

// ---- WordPiece (kg_tokenizer_wpm.c) ----

/** The ids of `len` bytes of raw text (no special tokens), appended to ids
 * at index n (written while below n_max); returns the new count, or -1
 * when out of memory. */
int64_t kg_tokenizer_wpm_encode(const kg_tokenizer_t *tok,
                                const char *text,
                                size_t len,
                                int32_t *ids,
                                int64_t n_max,
                                int64_t n);

// ---- SentencePiece unigram (kg_tokenizer_ugm.c) ----

/** Read the charsmap and build the unigram tables; false with errstr set. */
bool kg_tokenizer_ugm_build(kg_tokenizer_t *tok,
                            const kg_gguf_t *g,
                            char *errstr,
                            size_t errstr_size);
/** As kg_tokenizer_wpm_encode, for a unigram vocabulary; -1 also when the
 * charsmap points outside itself. */
int64_t kg_tokenizer_ugm_encode(const kg_tokenizer_t *tok,
                                const char *text,
                                size_t len,
                                int32_t *ids,
                                int64_t n_max,
                                int64_t n);

// ---- pre-tokenizers (kg_tokenizer_pre.c) ----

typedef struct kg_tokenizer_pre {
    const char *regex[MAX_REGEX];
    bool ignore_merges; /* a piece that is a whole token is used as is */
    bool add_bos;       /* llama.cpp's default when the file does not say */
    bool no_bos_token;  /* no default BOS id (ChatGLM) */
    bool spm_style;     /* SentencePiece-style BPE (see kg_tokenizer.bpe_spm) */
} kg_tokenizer_pre_t;

/** The pre-tokenizer named by tokenizer.ggml.pre (`n` bytes), or NULL for a
 * name llama.cpp does not know. */
const kg_tokenizer_pre_t *kg_tokenizer_find_pre(const char *s, size_t n);
