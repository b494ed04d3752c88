/* kg_gvocab: the bytes of every token of a vocabulary, as a trie.
 *
 * Grammars work on bytes; tokens are byte strings (kg_tokenizer_piece).
 * The trie is flattened in preorder so a walk is a linear scan that skips
 * a dead subtree in one jump: node i has its byte, its depth (1 = a first
 * byte), the first token whose bytes end there (or -1; others with the
 * same bytes follow through dup_next) and the index just past its subtree.
 * Tokens with no text (control tokens, end-of-generation tokens) are left
 * out: a grammar never allows them. One vocabulary serves every grammar
 * compiled for its model; it is reference-counted because compiled
 * grammars keep it for their run-time checks. @thread any (read-only). */
#pragma once

#include "../model/kg_tokenizer.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_gvocab {
    _Atomic int32_t refs;
    int32_t n_vocab;  /* ids 0..n_vocab-1 (bitmasks are this wide) */
    int32_t n_tokens; /* tokens in the trie */
    int32_t n_nodes;
    uint8_t *byte;     /* (n_nodes) */
    uint16_t *depth;   /* (n_nodes) 1-based */
    int32_t *tok;      /* (n_nodes) first token ending here, -1 */
    int32_t *end;      /* (n_nodes) index past the subtree */
    int32_t *dup_next; /* (n_vocab) next token with the same bytes, -1 */
    int64_t *off;      /* (n_vocab + 1) token bytes in `bytes`; empty for tokens left out */
    uint8_t *bytes;
    int32_t max_len; /* longest token, bytes */
} kg_gvocab_t;

/** Build from a tokenizer. NULL with errstr set on OOM or an empty vocabulary. */
kg_gvocab_t *kg_gvocab_new(const kg_tokenizer_t *tok, char *errstr, size_t errstr_size);
/** Build from explicit token byte strings (tests): token i is
 * (texts[i], lens[i]); a zero length leaves it out. */
kg_gvocab_t *kg_gvocab_new_raw(const char *const *texts,
                               const size_t *lens,
                               int32_t n_vocab,
                               char *errstr,
                               size_t errstr_size);
kg_gvocab_t *kg_gvocab_ref(kg_gvocab_t *v);
/** Drop a reference; the last one frees. NULL does nothing. */
void kg_gvocab_unref(kg_gvocab_t *v);
