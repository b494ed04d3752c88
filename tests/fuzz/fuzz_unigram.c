/* fuzz_unigram: libFuzzer target for the SentencePiece unigram ("t5")
 * tokenizer: its reading of `tokenizer.ggml.precompiled_charsmap` (outside
 * input: any model file carries one) and its encoder on any text.
 *
 * Input: a little-endian u32 length, that many charsmap bytes (absent when
 * the length runs past the input), one flag byte (add_space_prefix,
 * remove_extra_whitespaces, add_special, parse_special), then the text.
 * The vocabulary around the charsmap is fixed: specials, an unused and a
 * user-defined entry, "▁", letters and a few multi-byte pieces. A charsmap
 * must load or be refused with an error; a text must encode or give -1,
 * never a crash or an out-of-bounds read; a text encodes to the same ids
 * counted and written, each a valid id. The seed corpus holds the real
 * XLM-RoBERTa charsmap (from llama.cpp's ggml-vocab-nomic-bert-moe.gguf). */
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const toks[] = {
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
    "<mask>",
    "[PAD1]",
    "\xe2\x96\x81kgen",
    "\xe2\x96\x81",
    "a",
    "b",
    "c",
    "ab",
    "\342\226\201a",
    "\342\226\201ab",
    "\xe4\xb8\xad",
    "\xe6\x96\x87",
    "\xe4\xb8\xad\xe6\x96\x87",
    "\xc3\xa9",
    "e",
    "\xef\xbf\xbd",
    "\xe2\x96\x81\xe2\x96\x81",
};
#define N_TOKS ((int)(sizeof(toks) / sizeof(toks[0])))

static kg_tokenizer_t *
make(const uint8_t *charsmap, size_t charsmap_len, bool prefix, bool merge_ws) {
    static float scores[N_TOKS];
    static int32_t types[N_TOKS];
    kg_gguf_str_t strs[N_TOKS];
    for (int i = 0; i < N_TOKS; i++) {
        strs[i] = (kg_gguf_str_t){toks[i], strlen(toks[i])};
        scores[i] = -1.0f - (float)(i % 7) * 0.75f;
        types[i] = i == 3 ? 2 : i < 5 ? 3 : i == 5 ? 5 : i == 6 ? 4 : 1;
    }
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, N_TOKS);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, N_TOKS);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, N_TOKS);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", prefix);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.remove_extra_whitespaces", merge_ws);
    if (charsmap) {
        kg_gguf_writer_set_arr(w, "tokenizer.ggml.precompiled_charsmap", KG_GGUF_TYPE_UINT8,
                               charsmap, charsmap_len);
    }
    uint8_t *buf = NULL;
    size_t n = 0;
    kg_tokenizer_t *tok = NULL;
    if (kg_gguf_writer_to_memory(w, &buf, &n) == KG_OK) {
        char err[256];
        kg_gguf_t *g = kg_gguf_open_memory(buf, n, err, sizeof(err));
        if (!g) {
            abort(); // the file is ours: it must open
        }
        tok = kg_tokenizer_new(g, err, sizeof(err));
        kg_gguf_free(g);
    }
    kg_gguf_writer_free(w);
    free(buf);
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) {
        return 0;
    }
    const uint32_t cl = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                        (uint32_t)data[3] << 24;
    const uint8_t *charsmap = NULL;
    size_t off = 4;
    if (cl <= size - off - 1) {
        charsmap = data + off;
        off += cl;
    }
    const uint8_t flags = data[off++];
    kg_tokenizer_t *tok = make(charsmap, charsmap ? cl : 0, flags & 1, flags & 2);
    if (!tok) {
        return 0; // a refused charsmap
    }
    const char *text = (const char *)data + off;
    const size_t len = size - off;
    const bool add = flags & 4, parse = flags & 8;
    const int64_t need = kg_tokenizer_encode(tok, text, len, add, parse, NULL, 0);
    if (need >= 0) {
        int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
        if (!ids || kg_tokenizer_encode(tok, text, len, add, parse, ids, need) != need) {
            abort();
        }
        for (int64_t i = 0; i < need; i++) {
            if (ids[i] < 0 || ids[i] >= kg_tokenizer_n_vocab(tok)) {
                abort();
            }
        }
        free(ids);
    }
    kg_tokenizer_free(tok);
    return 0;
}
