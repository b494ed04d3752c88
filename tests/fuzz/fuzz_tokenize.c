/* fuzz_tokenize: libFuzzer target for tokenizing a job's text (outside input:
 * every prompt and message goes through it) with the real vocabularies the
 * tests carry: SentencePiece (phi-3), byte-level BPE (gpt-2, falcon's
 * pre-tokenizer regexes), Gemma 4's SentencePiece-style BPE (the cut
 * vocabulary) and WordPiece (bge). Input: one flag byte (add_special,
 * parse_special, which vocabulary), then the text. A text must encode or
 * give -1, never a crash or an out-of-bounds read; the count asked for
 * equals the ids written; every id is in range and prints as a piece; and
 * gpt-2 and Gemma 4, which have a token for every byte, give the text back
 * byte for byte when special-token text is not parsed. The vocabularies
 * are read once from tests/data (KG_DATA_DIR, set by tests/CMakeLists.txt). */
#define _GNU_SOURCE /* memmem */
#include "model/kg_gguf.h"
#include "model/kg_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {"phi-3", "gpt-2", "falcon", "gemma-4-mini", "bert-bge"};
#define N_VOCABS ((int)(sizeof(names) / sizeof(names[0])))
static kg_tokenizer_t *toks[N_VOCABS];

static void load_all(void) {
    for (int v = 0; v < N_VOCABS; v++) {
        char path[4096], err[256];
        snprintf(path, sizeof(path), "%s/tokenizer-vectors/ggml-vocab-%s.gguf", KG_DATA_DIR,
                 names[v]);
        kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
        toks[v] = g ? kg_tokenizer_new(g, err, sizeof(err)) : NULL;
        kg_gguf_free(g);
        if (!toks[v]) {
            fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, err);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!toks[0]) {
        load_all();
    }
    if (size < 1 || size > 4096) {
        return 0;
    }
    const uint8_t flags = data[0];
    const bool add_special = flags & 1, parse_special = flags & 2;
    const int v = (flags >> 2) % N_VOCABS;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const kg_tokenizer_t *tok = toks[v];
    const int64_t n = kg_tokenizer_encode(tok, text, len, add_special, parse_special, NULL, 0);
    if (n < 0) {
        return 0;
    }
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!ids) {
        return 0;
    }
    if (kg_tokenizer_encode(tok, text, len, add_special, parse_special, ids, n) != n) {
        abort();
    }
    /* every byte has a token in gpt-2 and Gemma 4: nothing may be lost or
     * changed (Gemma 4 writes spaces as U+2581 and prints that back as a
     * space, so a text holding U+2581 itself does not come back) */
    bool whole = !add_special && !parse_special &&
                 (v == 1 || (v == 3 && !memmem(text, len, "\xe2\x96\x81", 3)));
    char *back = malloc(len + 1);
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= kg_tokenizer_n_vocab(tok)) {
            abort();
        }
        char piece[1024];
        const size_t pl = kg_tokenizer_piece(tok, ids[i], false, piece, sizeof(piece));
        if (!back || pl > sizeof(piece) || off + pl > len) {
            if (whole) {
                abort(); /* longer than the text it came from */
            }
            continue;
        }
        memcpy(back + off, piece, pl);
        off += pl;
    }
    if (whole && back && (off != len || memcmp(back, text, len) != 0)) {
        abort();
    }
    free(back);
    free(ids);
    return 0;
}
