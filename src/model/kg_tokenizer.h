/* kg_tokenizer: the tokenizers of GGUF files, equal to llama.cpp's.
 *
 * SentencePiece-style (`tokenizer.ggml.model = llama`): score-driven merges
 * of UTF-8 characters, byte fallback to <0xXX> tokens, the leading space
 * ("▁") added before the text. Byte-level BPE (`gpt2`): the pre-tokenizer
 * regexes named by `tokenizer.ggml.pre` (through PCRE2), the GPT-2
 * byte-to-unicode map and rank-ordered merges. WordPiece (`bert`) and the
 * SentencePiece unigram (`t5`: the charsmap's normalization, then the
 * best-scoring split by Viterbi). Control tokens in the text
 * are matched as wholes when `parse_special` is set; user-defined tokens
 * always (as llama.cpp does).
 *
 * Any bytes can be tokenized. One deliberate difference from llama.cpp: in
 * BPE, invalid UTF-8 bytes are cut as llama.cpp cuts them (as U+FFFD) but
 * keep their own bytes, so decoding gives the input back where llama.cpp
 * would give U+FFFD; valid UTF-8 gives llama.cpp's ids exactly. */
#pragma once

#include "kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_tokenizer kg_tokenizer_t;

typedef enum kg_tokenizer_kind {
    KG_TOKENIZER_SPM = 0, /* "llama" */
    KG_TOKENIZER_BPE = 1, /* "gpt2" */
    KG_TOKENIZER_WPM = 2, /* "bert": WordPiece (kg_tokenizer_wpm.c) */
    KG_TOKENIZER_UGM = 3, /* "t5": SentencePiece unigram (kg_tokenizer_ugm.c) */
} kg_tokenizer_kind_t;

/** Build from the metadata of `g` (copies what it needs; `g` may be freed
 * afterwards). NULL with errstr set on an unsupported or broken vocabulary. */
kg_tokenizer_t *kg_tokenizer_new(const kg_gguf_t *g, char *errstr, size_t errstr_size);
void kg_tokenizer_free(kg_tokenizer_t *tok);

kg_tokenizer_kind_t kg_tokenizer_kind(const kg_tokenizer_t *tok);
int32_t kg_tokenizer_n_vocab(const kg_tokenizer_t *tok);
int32_t kg_tokenizer_bos(const kg_tokenizer_t *tok); /* -1 when none */
int32_t kg_tokenizer_eos(const kg_tokenizer_t *tok); /* -1 when none */
/** Whether the metadata (or llama.cpp's default for the kind) asks for BOS/EOS. */
bool kg_tokenizer_add_bos(const kg_tokenizer_t *tok);
bool kg_tokenizer_add_eos(const kg_tokenizer_t *tok);
/** The separator token (bert's [SEP]), -1 when none, and whether the
 * vocabulary appends it (llama.cpp's add_sep: rerank pairs put it between
 * query and document). */
int32_t kg_tokenizer_sep(const kg_tokenizer_t *tok);
bool kg_tokenizer_add_sep(const kg_tokenizer_t *tok);
/** End of generation: EOS, EOT, EOM and other tokens llama.cpp treats as such. */
bool kg_tokenizer_is_eog(const kg_tokenizer_t *tok, int32_t id);
/** Control tokens (type 3) are not printed when decoding. */
bool kg_tokenizer_is_control(const kg_tokenizer_t *tok, int32_t id);

/** Tokenize `len` bytes of `text` (not NUL-terminated; any bytes). Adds
 * BOS/EOS when `add_special` and the vocabulary asks for them. Writes at
 * most `n_max` ids; returns the number of ids the text needs (so a result
 * larger than n_max means: call again with a bigger buffer), or -1 when
 * `text` could not be tokenized. @thread any (the tokenizer is read-only) */
int64_t kg_tokenizer_encode(const kg_tokenizer_t *tok,
                            const char *text,
                            size_t len,
                            bool add_special,
                            bool parse_special,
                            int32_t *ids,
                            int64_t n_max);

/** The bytes of one token as they appear in text (leading-space marker and
 * byte tokens resolved; control and unknown tokens give "" unless
 * `special`; user-defined tokens their text). A token can end inside a
 * UTF-8 character: concatenate pieces before treating them as text. Writes
 * min(length, cap) bytes; returns the length. @thread any */
size_t
kg_tokenizer_piece(const kg_tokenizer_t *tok, int32_t id, bool special, char *buf, size_t cap);

/** The raw vocabulary string of a token (as stored in the file). */
kg_gguf_str_t kg_tokenizer_token_text(const kg_tokenizer_t *tok, int32_t id);

/** Find a token by its exact vocabulary text; -1 when absent. O(len). */
int32_t kg_tokenizer_find(const kg_tokenizer_t *tok, const char *text, size_t len);
