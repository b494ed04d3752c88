/* kg_tokenizer_build: kg_tokenizer_new and kg_tokenizer_free: a tokenizer
 * from a GGUF file's tokenizer.* keys, built the way llama.cpp's
 * llama_vocab::impl::load builds its vocabulary, so that the ids, special
 * tokens and attributes match.
 *
 * In order: the token texts, scores and types go into one text pool and a
 * text -> id hash table; BPE merges into a "left right" -> rank table; the
 * special token ids from the keys, then llama.cpp's text-based fix-ups
 * (EOT/EOM/FIM/EOG detection, "unused" control tokens, the Phi-3 right-strip
 * rule); the SPM byte-fallback and GPT-2 byte maps; each token's decoded
 * piece; the special tokens longest first (for encoding's partition pass);
 * the pre-tokenizer regexes, compiled once. After this the tokenizer is
 * read-only. */
#include "core/kg_log.h"
#include "core/kg_utf8.h"
#include "kg_tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- small helpers ----

static void set_err(char *errstr, size_t errstr_size, const char *fmt, const char *arg) {
    if (errstr && errstr_size) {
        snprintf(errstr, errstr_size, fmt, arg);
    }
}

static size_t table_size_for(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) {
        cap <<= 1;
    }
    return cap;
}

static int32_t find_cstr(const kg_tokenizer_t *tok, const char *s) {
    return kg_tokenizer_find(tok, s, strlen(s));
}

// ---- special-token texts llama.cpp recognises (llama_vocab::impl::load) ----

#define FW_BAR "\xef\xbd\x9c" /* U+FF5C, DeepSeek's "｜" */

static const char *const eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<" FW_BAR "end" LOW8 "of" LOW8 "sentence" FW_BAR ">",
    "<end_of_utterance>",
    NULL,
};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<" FW_BAR "fim" LOW8 "begin" FW_BAR ">",
    "<PRE>",
    LOW8 "<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    NULL,
};
static const char *const fim_suf_texts[] = {
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<" FW_BAR "fim" LOW8 "hole" FW_BAR ">",
    "<SUF>",
    LOW8 "<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    NULL,
};
static const char *const fim_mid_texts[] = {
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<" FW_BAR "fim" LOW8 "end" FW_BAR ">",
    "<MID>",
    LOW8 "<MID>",
    "<|code_middle|>",
    "<|middle|>",
    NULL,
};
static const char *const fim_pad_texts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL,
};
static const char *const fim_rep_texts[] = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL,
};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<" FW_BAR "end" LOW8 "of" LOW8 "sentence" FW_BAR ">",
    "[e~[",
    NULL,
};

/* The lowest id among `texts` present in the vocabulary, or -1. */
static int32_t find_first_of(const kg_tokenizer_t *tok, const char *const *texts) {
    int32_t best = -1;
    for (size_t i = 0; texts[i]; i++) {
        int32_t id = find_cstr(tok, texts[i]);
        if (id >= 0 && (best < 0 || id < best)) {
            best = id;
        }
    }
    return best;
}

/* When `*id` is unset, take the first token named in `texts` and make it a
 * control token, as llama.cpp does for EOT/EOM/FIM tokens. */
static void detect_special(kg_tokenizer_t *tok, int32_t *id, const char *const *texts) {
    if (*id >= 0) {
        return;
    }
    *id = find_first_of(tok, texts);
    if (*id >= 0) {
        tok->attr[*id] |= ATTR_CONTROL;
    }
}

// ---- building ----

/* Read a token id key; llama.cpp keeps the default for an out-of-range id. */
static void read_id(const kg_gguf_t *g, const char *key, int32_t n_vocab, int32_t *id) {
    if (*id >= n_vocab) {
        *id = -1;
    }
    uint32_t v;
    if (kg_gguf_get_u32(g, key, &v)) {
        if (v < (uint32_t)n_vocab) {
            *id = (int32_t)v;
        } else {
            KG_LOG_DEBUG("tokenizer", "bad special token id, keeping the default key=%s id=%u", key,
                         v);
        }
    }
}

static bool build_token_table(kg_tokenizer_t *tok) {
    size_t cap = table_size_for((size_t)tok->n_vocab);
    tok->tok_slots = calloc(cap, sizeof(uint64_t));
    if (!tok->tok_slots) {
        return false;
    }
    tok->tok_mask = cap - 1;
    return true;
}

/* Insert id; returns the id already holding the same text, or -1. */
static int32_t insert_token(kg_tokenizer_t *tok, int32_t id) {
    size_t len;
    const char *t = kg_tokenizer_text(tok, id, &len);
    uint32_t h = kg_tokenizer_hash(HASH_SEED, t, len);
    for (size_t i = kg_tokenizer_slot(h) & tok->tok_mask;; i = (i + 1) & tok->tok_mask) {
        uint64_t slot = tok->tok_slots[i];
        if (!slot) {
            tok->tok_slots[i] = ((uint64_t)h << 32) | (uint32_t)(id + 1);
            return -1;
        }
        if ((uint32_t)(slot >> 32) == h) {
            int32_t other = (int32_t)(uint32_t)slot - 1;
            size_t olen;
            const char *o = kg_tokenizer_text(tok, other, &olen);
            if (olen == len && memcmp(o, t, len) == 0) {
                return other;
            }
        }
    }
}

static bool load_tokens(kg_tokenizer_t *tok, const kg_gguf_t *g, char *errstr, size_t errstr_size) {
    kg_gguf_type_t et;
    uint64_t n;
    if (!kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n)) {
        set_err(errstr, errstr_size, "%s", "tokenizer.ggml.tokens is missing (no vocabulary)");
        return false;
    }
    if (et != KG_GGUF_TYPE_STRING || n == 0 || n > (uint64_t)INT32_MAX - 1) {
        set_err(errstr, errstr_size, "%s",
                "tokenizer.ggml.tokens is not a non-empty array of strings");
        return false;
    }
    tok->n_vocab = (int32_t)n;
    kg_gguf_str_t *strs = malloc(n * sizeof(kg_gguf_str_t));
    if (!strs) {
        set_err(errstr, errstr_size, "%s", "out of memory loading the vocabulary");
        return false;
    }
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        strs[i] = kg_gguf_arr_str(g, "tokenizer.ggml.tokens", i);
        total += strs[i].len ? strs[i].len : 32; // room for "[EMPTY_i]"
    }
    if (total >= UINT32_MAX) {
        free(strs);
        set_err(errstr, errstr_size, "%s", "tokenizer.ggml.tokens is too large");
        return false;
    }
    tok->text = malloc(total + 1);
    tok->text_off = malloc((n + 1) * sizeof(uint32_t));
    tok->score = calloc(n, sizeof(float));
    tok->attr = malloc(n * sizeof(uint16_t));
    if (!tok->text || !tok->text_off || !tok->score || !tok->attr || !build_token_table(tok)) {
        free(strs);
        set_err(errstr, errstr_size, "%s", "out of memory loading the vocabulary");
        return false;
    }
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        kg_gguf_str_t s = strs[i];
        tok->text_off[i] = off;
        if (s.len == 0) {
            // llama.cpp renames empty tokens so that they stay distinct
            off += (uint32_t)snprintf(tok->text + off, 32, "[EMPTY_%llu]", (unsigned long long)i);
        } else {
            memcpy(tok->text + off, s.data, s.len);
            off += (uint32_t)s.len;
        }
    }
    tok->text_off[n] = off;
    free(strs);
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        int32_t dup = insert_token(tok, i);
        if (dup >= 0) {
            char buf[128];
            snprintf(buf, sizeof(buf), "duplicate token in vocabulary: ids %d and %d", dup, i);
            set_err(errstr, errstr_size, "%s", buf);
            return false;
        }
    }

    // scores: f32 (or i32) per token, optional
    if (kg_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n)) {
        if ((et != KG_GGUF_TYPE_FLOAT32 && et != KG_GGUF_TYPE_INT32) ||
            n < (uint64_t)tok->n_vocab) {
            set_err(errstr, errstr_size, "%s",
                    "tokenizer.ggml.scores is not an f32 array with one score per token");
            return false;
        }
        float *all = malloc(n * sizeof(float));
        if (!all || !kg_gguf_arr_f32(g, "tokenizer.ggml.scores", all, n)) {
            free(all);
            set_err(errstr, errstr_size, "%s", "cannot read tokenizer.ggml.scores");
            return false;
        }
        memcpy(tok->score, all, (size_t)tok->n_vocab * sizeof(float));
        free(all);
    }

    // token types, optional (all normal without them)
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        tok->attr[i] = ATTR_NORMAL;
    }
    if (kg_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n)) {
        int32_t *types = NULL;
        if (et != KG_GGUF_TYPE_INT32 || n < (uint64_t)tok->n_vocab ||
            !(types = malloc(n * sizeof(int32_t))) ||
            !kg_gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n)) {
            free(types);
            set_err(errstr, errstr_size, "%s",
                    "tokenizer.ggml.token_type is not an i32 array with one type per token");
            return false;
        }
        for (int32_t i = 0; i < tok->n_vocab; i++) {
            switch (types[i]) {
            case TYPE_NORMAL:
                tok->attr[i] = ATTR_NORMAL;
                break;
            case TYPE_UNKNOWN:
                tok->attr[i] = ATTR_UNKNOWN;
                break;
            case TYPE_CONTROL:
                tok->attr[i] = ATTR_CONTROL;
                break;
            case TYPE_USER_DEFINED:
                tok->attr[i] = ATTR_USER_DEFINED;
                break;
            case TYPE_UNUSED:
                tok->attr[i] = ATTR_UNUSED;
                break;
            case TYPE_BYTE:
                tok->attr[i] = ATTR_BYTE;
                break;
            default:
                tok->attr[i] = ATTR_UNDEFINED;
                break;
            }
        }
        free(types);
    }
    return true;
}

static bool load_merges(kg_tokenizer_t *tok, const kg_gguf_t *g, char *errstr, size_t errstr_size) {
    static const char *key = "tokenizer.ggml.merges";
    kg_gguf_type_t et;
    uint64_t n;
    if (!kg_gguf_get_arr(g, key, &et, &n)) {
        set_err(errstr, errstr_size, "%s",
                "tokenizer.ggml.merges is missing (a BPE vocabulary needs it)");
        return false;
    }
    if (et != KG_GGUF_TYPE_STRING || n > (uint64_t)INT32_MAX - 1) {
        set_err(errstr, errstr_size, "%s", "tokenizer.ggml.merges is not an array of strings");
        return false;
    }
    kg_gguf_str_t *strs = malloc((n + 1) * sizeof(kg_gguf_str_t));
    if (!strs) {
        set_err(errstr, errstr_size, "%s", "out of memory loading the merges");
        return false;
    }
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        strs[i] = kg_gguf_arr_str(g, key, i);
        total += strs[i].len;
    }
    if (total >= UINT32_MAX) {
        free(strs);
        set_err(errstr, errstr_size, "%s", "tokenizer.ggml.merges is too large");
        return false;
    }
    size_t cap = table_size_for(n);
    tok->merge_text = malloc(total + 1);
    tok->merge_off = malloc((n + 1) * sizeof(uint32_t));
    tok->merge_split = malloc((n + 1) * sizeof(uint32_t));
    tok->merge_slots = calloc(cap, sizeof(uint64_t));
    if (!tok->merge_text || !tok->merge_off || !tok->merge_split || !tok->merge_slots) {
        free(strs);
        set_err(errstr, errstr_size, "%s", "out of memory loading the merges");
        return false;
    }
    tok->merge_mask = cap - 1;
    tok->n_merges = (int32_t)n;
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        kg_gguf_str_t s = strs[i];
        tok->merge_off[i] = off;
        memcpy(tok->merge_text + off, s.data, s.len);
        off += (uint32_t)s.len;
        // llama.cpp splits at the first space after the first byte
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            tok->merge_split[i] = UINT32_MAX; // can never match a lookup
            continue;
        }
        size_t ln = (size_t)(sp - s.data);
        tok->merge_split[i] = (uint32_t)ln;
        uint32_t h = kg_tokenizer_hash(HASH_SEED, s.data, s.len);
        for (size_t j = kg_tokenizer_slot(h) & tok->merge_mask;; j = (j + 1) & tok->merge_mask) {
            uint64_t slot = tok->merge_slots[j];
            if (!slot) {
                tok->merge_slots[j] = ((uint64_t)h << 32) | (uint32_t)(i + 1);
                break;
            }
            int32_t other = (int32_t)(uint32_t)slot - 1;
            size_t olen = tok->merge_off[other + 1] - tok->merge_off[other];
            if ((uint32_t)(slot >> 32) == h && olen == s.len &&
                memcmp(tok->merge_text + tok->merge_off[other], s.data, s.len) == 0) {
                break; // a repeated merge keeps its first (lowest) rank
            }
        }
    }
    tok->merge_off[n] = off;
    free(strs);
    return true;
}

static void build_byte_map(kg_tokenizer_t *tok) {
    // GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the
    // other 68 bytes to U+0100.. in byte order
    memset(tok->bmap_inv, 0xff, sizeof(tok->bmap_inv));
    int next = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cpt = keep ? (uint32_t)b : (uint32_t)(256 + next++);
        tok->bmap_len[b] = (uint8_t)kg_utf8_put(cpt, tok->bmap[b]);
        tok->bmap_inv[cpt] = (int16_t)b;
    }
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* The byte of a <0xXX> token (strtol of text[3..5), as llama.cpp). */
static unsigned char byte_of_token(const char *t, size_t len) {
    int v = 0;
    for (size_t i = 3; i < 5 && i < len; i++) {
        int d = hex_val(t[i]);
        if (d < 0) {
            break;
        }
        v = v * 16 + d;
    }
    return (unsigned char)v;
}

/* Write token `id` as printed with special = true (llama.cpp's
 * token_to_piece cache); returns its length, at most the text's. */
static size_t render_piece(const kg_tokenizer_t *tok, int32_t id, char *dst) {
    size_t len;
    const char *t = kg_tokenizer_text(tok, id, &len);
    uint16_t a = tok->attr[id];
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        memcpy(dst, t, len);
        return len;
    }
    if (a & ATTR_NORMAL) {
        size_t o = 0;
        if (tok->kind != KG_TOKENIZER_BPE || tok->bpe_spm) { /* SPM, WordPiece: "▁" a space */
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && memcmp(t + i, LOW8, 3) == 0) {
                    dst[o++] = ' ';
                    i += 3;
                } else {
                    dst[o++] = t[i++];
                }
            }
            return o;
        }
        // BPE: back through the byte map; a code point outside it keeps its
        // UTF-8 (llama.cpp prints an "[UNK_BYTE_0x..]" marker instead)
        for (size_t i = 0; i < len;) {
            uint32_t cpt;
            size_t n = kg_tokenizer_lcpp_decode((const unsigned char *)t + i, len - i, &cpt);
            if (cpt < 324 && tok->bmap_inv[cpt] >= 0 && kg_tokenizer_is_canonical(cpt, n)) {
                dst[o++] = (char)tok->bmap_inv[cpt];
            } else {
                memcpy(dst + o, t + i, n);
                o += n;
            }
            i += n;
        }
        return o;
    }
    if (a & ATTR_BYTE) {
        dst[0] = (char)byte_of_token(t, len);
        return 1;
    }
    return 0; // unused and undefined tokens print nothing
}

static bool build_pieces(kg_tokenizer_t *tok) {
    // a piece is never longer than its token text (U+2581 -> ' ' and the
    // byte map only shrink; a byte token gives 1 byte), so the pieces fit in
    // a pool the size of the texts and piece i starts at or before text i
    tok->piece = malloc((size_t)tok->text_off[tok->n_vocab] + 1);
    tok->piece_off = malloc(((size_t)tok->n_vocab + 1) * sizeof(uint32_t));
    if (!tok->piece || !tok->piece_off) {
        return false;
    }
    uint32_t off = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        tok->piece_off[id] = off;
        off += (uint32_t)render_piece(tok, id, tok->piece + off);
    }
    tok->piece_off[tok->n_vocab] = off;
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Special-token texts: control, user-defined and unknown tokens, longest
 * first (llama.cpp cache_special_tokens; ties here by id, deterministic). */
static bool build_special(kg_tokenizer_t *tok) {
    uint64_t *keys = malloc((size_t)tok->n_vocab * sizeof(uint64_t));
    tok->special = malloc((size_t)tok->n_vocab * sizeof(int32_t));
    if (!keys || !tok->special) {
        free(keys);
        return false;
    }
    size_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        if (tok->attr[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) {
            uint32_t len = tok->text_off[id + 1] - tok->text_off[id];
            keys[n++] = ((uint64_t)(UINT32_MAX - len) << 32) | (uint32_t)id;
        }
    }
    qsort(keys, n, sizeof(uint64_t), cmp_u64);
    for (size_t i = 0; i < n; i++) {
        tok->special[i] = (int32_t)(uint32_t)keys[i];
    }
    tok->n_special = (int32_t)n;
    free(keys);
    return true;
}

static void set_eog(kg_tokenizer_t *tok, int32_t id) {
    if (id >= 0 && id < tok->n_vocab) {
        tok->attr[id] |= ATTR_EOG;
    }
}

/* llama.cpp's special-token fix-ups: EOT/EOM/FIM detection by text, unused
 * control tokens, the end-of-generation set and its exceptions. */
static void mark_specials(kg_tokenizer_t *tok, const kg_gguf_t *g) {
    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
    read_id(g, "tokenizer.ggml.eot_token_id", tok->n_vocab, &tok->eot);
    read_id(g, "tokenizer.ggml.eom_token_id", tok->n_vocab, &tok->eom);
    read_id(g, "tokenizer.ggml.fim_pre_token_id", tok->n_vocab, &fim_pre);
    read_id(g, "tokenizer.ggml.fim_suf_token_id", tok->n_vocab, &fim_suf);
    read_id(g, "tokenizer.ggml.fim_mid_token_id", tok->n_vocab, &fim_mid);
    read_id(g, "tokenizer.ggml.fim_pad_token_id", tok->n_vocab, &fim_pad);
    read_id(g, "tokenizer.ggml.fim_rep_token_id", tok->n_vocab, &fim_rep);
    read_id(g, "tokenizer.ggml.fim_sep_token_id", tok->n_vocab, &fim_sep);
    read_id(g, "tokenizer.ggml.prefix_token_id", tok->n_vocab, &fim_pre);
    read_id(g, "tokenizer.ggml.suffix_token_id", tok->n_vocab, &fim_suf);
    read_id(g, "tokenizer.ggml.middle_token_id", tok->n_vocab, &fim_mid);

    detect_special(tok, &tok->eot, eot_texts);
    detect_special(tok, &tok->eom, eom_texts);
    detect_special(tok, &fim_pre, fim_pre_texts);
    detect_special(tok, &fim_suf, fim_suf_texts);
    detect_special(tok, &fim_mid, fim_mid_texts);
    detect_special(tok, &fim_pad, fim_pad_texts);
    detect_special(tok, &fim_rep, fim_rep_texts);
    detect_special(tok, &fim_sep, fim_sep_texts);

    for (int32_t id = 0; id < tok->n_vocab; id++) {
        size_t len;
        const char *t = kg_tokenizer_text(tok, id, &len);
        if ((tok->attr[id] & ATTR_CONTROL) && kg_tokenizer_find_bytes(t, len, "unused", 6)) {
            tok->attr[id] |= ATTR_UNUSED;
        }
    }

    set_eog(tok, fim_pad);
    set_eog(tok, fim_rep);
    set_eog(tok, fim_sep);
    for (size_t i = 0; eog_texts[i]; i++) {
        int32_t id = find_cstr(tok, eog_texts[i]);
        if (id >= 0) {
            set_eog(tok, id);
            tok->attr[id] |= ATTR_CONTROL;
        }
    }
    // gpt-oss: these are always rendered
    static const char *const rendered[] = {"<|channel|>", "<|message|>", "<|start|>",
                                           "<|constrain|>"};
    for (size_t i = 0; i < sizeof(rendered) / sizeof(rendered[0]); i++) {
        int32_t id = find_cstr(tok, rendered[i]);
        if (id >= 0) {
            tok->attr[id] = (uint16_t)((tok->attr[id] & ATTR_EOG) | ATTR_USER_DEFINED);
        }
    }
    set_eog(tok, tok->eos);
    set_eog(tok, tok->eot);
    set_eog(tok, tok->eom);

    // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation
    int32_t ret = find_cstr(tok, "<|return|>"), call = find_cstr(tok, "<|call|>");
    int32_t calls = find_cstr(tok, "<|calls|>"), flush = find_cstr(tok, "<|flush|>");
    int32_t end = find_cstr(tok, "<|end|>");
    bool has_call = kg_tokenizer_is_eog(tok, call) || kg_tokenizer_is_eog(tok, calls);
    bool has_ret = kg_tokenizer_is_eog(tok, ret), has_flush = kg_tokenizer_is_eog(tok, flush);
    if (kg_tokenizer_is_eog(tok, end) && has_call && (has_ret || has_flush)) {
        tok->attr[end] = ATTR_USER_DEFINED;
    }
    // gemma4: "</s>" is not an end of generation next to "<|tool_response>"
    int32_t tool = find_cstr(tok, "<|tool_response>"), s_end = find_cstr(tok, "</s>");
    if (kg_tokenizer_is_eog(tok, tool) && kg_tokenizer_is_eog(tok, s_end)) {
        tok->attr[s_end] = ATTR_NORMAL;
    }
}

/* Whether the string key `key` contains one of `subs` (llama.cpp's
 * _contains_any). */
static bool key_contains(const kg_gguf_t *g, const char *key, const char *const *subs) {
    kg_gguf_str_t v;
    if (!kg_gguf_get_str(g, key, &v)) {
        return false;
    }
    for (size_t i = 0; subs[i]; i++) {
        if (kg_tokenizer_find_bytes(v.data, v.len, subs[i], strlen(subs[i]))) {
            return true;
        }
    }
    return false;
}

static void set_lstrip(kg_tokenizer_t *tok, const char *text) {
    int32_t id = find_cstr(tok, text);
    if (id >= 0) {
        tok->attr[id] |= ATTR_LSTRIP;
    }
}

/* llama.cpp's attributes by model name: the mask token of the Jina v2 and
 * nomic-bert-moe (XLM-R) vocabularies takes the spaces before it; Phi-3
 * GGUFs strip the whitespace after special tokens; ModernBERT's [MASK]
 * takes the spaces before it. */
static void apply_name_rules(kg_tokenizer_t *tok, const kg_gguf_t *g) {
    static const char *const jina_pre[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code", NULL};
    static const char *const mask_arch[] = {"nomic-bert-moe", "jina-bert-v3", NULL};
    if (key_contains(g, "tokenizer.ggml.pre", jina_pre) ||
        key_contains(g, "general.architecture", mask_arch)) {
        set_lstrip(tok, "<mask>");
        return;
    }
    kg_gguf_str_t name;
    if (!kg_gguf_get_str(g, "general.name", &name)) {
        return;
    }
    char lower[256];
    size_t n = name.len < sizeof(lower) - 1 ? (size_t)name.len : sizeof(lower) - 1;
    for (size_t i = 0; i < n; i++) {
        char c = name.data[i];
        lower[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    lower[n] = '\0';
    if (!strstr(lower, "phi-3") && !strstr(lower, "phi3")) {
        if (strstr(lower, "modern-bert")) {
            set_lstrip(tok, "[MASK]");
        }
        return;
    }
    for (int32_t i = 0; i < tok->n_special; i++) {
        tok->attr[tok->special[i]] |= ATTR_RSTRIP;
    }
    int32_t id = find_cstr(tok, "</s>");
    if (id >= 0) {
        tok->attr[id] |= ATTR_RSTRIP;
    }
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++) {
        id = find_cstr(tok, keep[i]);
        if (id >= 0) {
            tok->attr[id] &= (uint16_t)~ATTR_RSTRIP;
        }
    }
}

static bool compile_regexes(kg_tokenizer_t *tok,
                            const kg_tokenizer_pre_t *pre,
                            char *errstr,
                            size_t errstr_size) {
    // PCRE2 stops after 10M backtracking steps by default; a long run of
    // spaces costs one step per space in `\s*[\r\n]+` before `\s+(?!\S)`
    // takes it whole. Every regex here is linear in the text, so the limit
    // only breaks long inputs.
    tok->mctx = pcre2_match_context_create(NULL);
    if (!tok->mctx) {
        set_err(errstr, errstr_size, "%s", "out of memory");
        return false;
    }
    pcre2_set_match_limit(tok->mctx, UINT32_MAX);
    // pre is non-NULL: kg_tokenizer_new calls here only for BPE, whose branch
    // set it (the analyzer loses tok->kind across the calls in between)
    // NOLINTNEXTLINE(clang-analyzer-core.NullDereference)
    for (int i = 0; i < MAX_REGEX && pre->regex[i]; i++) {
        int err;
        PCRE2_SIZE erroff;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)pre->regex[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &erroff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof(msg));
            set_err(errstr, errstr_size, "cannot compile a pre-tokenizer regex: %s",
                    (const char *)msg);
            return false;
        }
        // JIT is an optimisation only: without it (no JIT support) pcre2_match interprets
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        tok->re[tok->n_re++] = re;
    }
    return true;
}

kg_tokenizer_t *kg_tokenizer_new(const kg_gguf_t *g, char *errstr, size_t errstr_size) {
    kg_tokenizer_t *tok = calloc(1, sizeof(*tok));
    if (!tok) {
        set_err(errstr, errstr_size, "%s", "out of memory");
        return NULL;
    }
    kg_gguf_str_t model;
    if (!kg_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        set_err(errstr, errstr_size, "%s", "tokenizer.ggml.model is missing (no tokenizer)");
        goto fail;
    }
    char mname[64];
    snprintf(mname, sizeof(mname), "%.*s", (int)(model.len < 60 ? model.len : 60), model.data);
    const kg_tokenizer_pre_t *pre = NULL;
    if (strcmp(mname, "llama") == 0 && model.len == 5) {
        tok->kind = KG_TOKENIZER_SPM;
        tok->bos = 1;
        tok->eos = 2;
        tok->unk = 0;
        tok->add_bos = true;
        tok->add_space_prefix = true;
    } else if ((strcmp(mname, "gpt2") == 0 && model.len == 4) ||
               (strcmp(mname, "gemma4") == 0 && model.len == 6)) {
        const bool gemma4 = mname[0] == 'g' && mname[1] == 'e';
        tok->kind = KG_TOKENIZER_BPE;
        tok->bos = gemma4 ? -1 : 11; // llama.cpp's defaults (from Falcon) when the file names none
        tok->eos = gemma4 ? -1 : 11;
        tok->unk = -1;
        kg_gguf_str_t p;
        if (gemma4) { /* its own pre-tokenizer, whatever tokenizer.ggml.pre says */
            pre = kg_tokenizer_find_pre("gemma4", strlen("gemma4"));
        } else if (!kg_gguf_get_str(g, "tokenizer.ggml.pre", &p)) {
            KG_LOG_WARN("tokenizer", "tokenizer.ggml.pre is missing, using 'default'");
            pre = kg_tokenizer_find_pre("default", strlen("default"));
        } else if (!(pre = kg_tokenizer_find_pre(p.data, (size_t)p.len))) {
            char pname[64];
            snprintf(pname, sizeof(pname), "%.*s", (int)(p.len < 60 ? p.len : 60), p.data);
            set_err(errstr, errstr_size, "unsupported pre-tokenizer type '%s'", pname);
            goto fail;
        }
        tok->ignore_merges = pre->ignore_merges;
        tok->add_bos = pre->add_bos;
        tok->bpe_spm = pre->spm_style;
        if (pre->no_bos_token) {
            tok->bos = -1;
        }
    } else if (strcmp(mname, "bert") == 0 && model.len == 4) {
        /* llama.cpp's defaults for WPM vocabularies */
        tok->kind = KG_TOKENIZER_WPM;
        tok->bos = 101;
        tok->eos = -1;
        tok->unk = 100;
        tok->add_bos = true;
        tok->add_sep = true;
        tok->wpm_lowercase = true;
        kg_gguf_get_bool(g, "tokenizer.ggml.normalizer.lowercase", &tok->wpm_lowercase);
        tok->wpm_strip_accents = tok->wpm_lowercase;
        kg_gguf_get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &tok->wpm_strip_accents);
    } else if (strcmp(mname, "t5") == 0 && model.len == 2) {
        /* llama.cpp's defaults for UGM vocabularies: EOS added, no BOS, no
         * space prefix unless the file asks */
        tok->kind = KG_TOKENIZER_UGM;
        tok->bos = -1;
        tok->eos = 1;
        tok->unk = 2;
        tok->add_eos = true;
        kg_gguf_get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &tok->ugm_remove_extra_ws);
    } else {
        set_err(errstr, errstr_size,
                "unsupported tokenizer model '%s' (kgen supports 'llama' (SPM), 'gpt2' and "
                "'gemma4' (BPE), 'bert' (WordPiece) and 't5' (SentencePiece unigram))",
                mname);
        goto fail;
    }
    tok->eot = tok->eom = -1;
    tok->pad = tok->kind == KG_TOKENIZER_UGM ? 0 : -1;
    tok->sep = tok->kind == KG_TOKENIZER_WPM ? 102 : -1;

    if (!load_tokens(tok, g, errstr, errstr_size)) {
        goto fail;
    }
    if (tok->kind == KG_TOKENIZER_BPE) {
        if (!load_merges(tok, g, errstr, errstr_size)) {
            goto fail;
        }
        build_byte_map(tok);
    }

    kg_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix);
    read_id(g, "tokenizer.ggml.bos_token_id", tok->n_vocab, &tok->bos);
    read_id(g, "tokenizer.ggml.eos_token_id", tok->n_vocab, &tok->eos);
    read_id(g, "tokenizer.ggml.unknown_token_id", tok->n_vocab, &tok->unk);
    read_id(g, "tokenizer.ggml.padding_token_id", tok->n_vocab, &tok->pad);
    read_id(g, "tokenizer.ggml.seperator_token_id", tok->n_vocab, &tok->sep);
    kg_gguf_get_bool(g, "tokenizer.ggml.add_sep_token", &tok->add_sep);
    if (tok->kind == KG_TOKENIZER_WPM &&
        (tok->bos < 0 || tok->bos >= tok->n_vocab || tok->sep < 0 || tok->sep >= tok->n_vocab ||
         tok->unk < 0 || tok->unk >= tok->n_vocab)) {
        set_err(errstr, errstr_size, "%s",
                "a bert (WordPiece) vocabulary needs its CLS (BOS), SEP and UNK tokens");
        goto fail;
    }
    if (tok->kind == KG_TOKENIZER_UGM && (tok->unk < 0 || tok->unk >= tok->n_vocab)) {
        set_err(errstr, errstr_size, "%s",
                "a t5 (SentencePiece unigram) vocabulary needs its unknown token");
        goto fail;
    }
    kg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &tok->add_bos);
    kg_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &tok->add_eos);
    if (tok->bpe_spm) { /* llama.cpp PR 21500: Gemma 4 always starts with BOS */
        tok->add_bos = true;
    }
    if (tok->add_bos && tok->bos < 0) {
        set_err(errstr, errstr_size, "%s",
                "tokenizer.ggml.add_bos_token is true, but there is no BOS token");
        goto fail;
    }
    if (tok->add_eos && tok->eos < 0) {
        set_err(errstr, errstr_size, "%s",
                "tokenizer.ggml.add_eos_token is true, but there is no EOS token");
        goto fail;
    }

    mark_specials(tok, g);
    if (!build_special(tok) || !build_pieces(tok)) {
        set_err(errstr, errstr_size, "%s", "out of memory building the tokenizer");
        goto fail;
    }
    apply_name_rules(tok, g);

    if (tok->kind == KG_TOKENIZER_SPM) {
        for (int c = 0; c < 128; c++) {
            tok->isolated[c] = true;
        }
        for (int32_t id = 0; id < tok->n_vocab; id++) {
            size_t len;
            const char *t = kg_tokenizer_text(tok, id, &len);
            for (size_t i = 0; len > 1 && i < len; i++) {
                if ((unsigned char)t[i] < 0x80) {
                    tok->isolated[(unsigned char)t[i]] = false;
                }
            }
        }
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
            tok->byte_tok[b] = kg_tokenizer_find(tok, name, 6);
            if (tok->byte_tok[b] < 0) {
                char c = (char)b;
                tok->byte_tok[b] = kg_tokenizer_find(tok, &c, 1);
            }
        }
    } else if (tok->kind == KG_TOKENIZER_WPM) {
        for (int32_t id = 0; id < tok->n_vocab; id++) {
            size_t len;
            (void)kg_tokenizer_text(tok, id, &len);
            tok->wpm_max_len = len > tok->wpm_max_len ? len : tok->wpm_max_len;
        }
    } else if (tok->kind == KG_TOKENIZER_UGM) {
        if (!kg_tokenizer_ugm_build(tok, g, errstr, errstr_size)) {
            goto fail;
        }
    } else if (!compile_regexes(tok, pre, errstr, errstr_size)) {
        goto fail;
    }
    return tok;

fail:
    kg_tokenizer_free(tok);
    return NULL;
}

void kg_tokenizer_free(kg_tokenizer_t *tok) {
    if (!tok) {
        return;
    }
    for (int i = 0; i < tok->n_re; i++) {
        pcre2_code_free(tok->re[i]);
    }
    pcre2_match_context_free(tok->mctx);
    free(tok->text);
    free(tok->text_off);
    free(tok->score);
    free(tok->attr);
    free(tok->tok_slots);
    free(tok->piece);
    free(tok->piece_off);
    free(tok->merge_text);
    free(tok->merge_off);
    free(tok->merge_split);
    free(tok->merge_slots);
    free(tok->special);
    free(tok->ugm_xcda);
    free(tok->ugm_repl);
    free(tok->ugm_bits);
    free(tok);
}
