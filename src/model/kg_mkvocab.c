/* kg_mkvocab: built-in vocabularies for random-weight models.
 *
 * llama: SentencePiece with <unk> <s> </s> and the 256 byte-fallback
 * tokens, so any text encodes (byte by byte). The others are trained at
 * write time on a short built-in English text, so ordinary text goes
 * through the real merge paths of each family's tokenizer:
 *   - qwen: byte-level BPE (GPT-2's byte map; rank-ordered merges),
 *     tokenizer.ggml.pre = qwen2, <|endoftext|> <|im_start|> <|im_end|>;
 *   - gemma: SentencePiece pieces (scores: earlier merges first) with
 *     add_space_prefix = false, <pad> <eos> <bos> <unk> <start_of_turn>
 *     <end_of_turn> and byte fallback;
 *   - phi3: SentencePiece with the space prefix, <unk> <s> </s>, byte
 *     fallback, and <|endoftext|> <|assistant|> <|system|> <|end|> <|user|>
 *     after the pieces;
 *   - gpt-oss: the qwen BPE with tokenizer.ggml.pre = gpt-4o (o200k's
 *     pre-tokenizer) and Harmony's specials: <|startoftext|> (bos)
 *     <|endoftext|> <|return|> (eos) <|constrain|> <|channel|> <|start|>
 *     <|end|> <|message|> <|call|>.
 * Made-up words can be added after any of them (benchmarks at a real
 * model's vocabulary size; readable demo output). */
#include "kg_mkvocab.h"

#include "../core/kg_utf8.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- llama ----

/** The built-in vocabulary: SentencePiece "llama" with <unk> <s> </s> and
 * the 256 byte-fallback tokens, what llama.cpp needs to encode any text. */
static int64_t
add_llama_vocab(kg_gguf_writer_t *w, int32_t n_words, char *errstr, size_t errstr_size) {
    /* <unk> <s> </s>, the 256 byte tokens, then n_words made-up words
     * ("\xe2\x96\x81" + 2-4 syllables) so a random model prints readable nonsense
     * instead of random bytes (the worker demo uses them) */
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ta", "ru", "so", "vi", "de", "po",
                                "ha", "li", "mo", "ze", "fa", "gu", "be", "ri", "no", "sa"};
    const int64_t N = 3 + 256 + n_words;
    kg_gguf_str_t *tokens = calloc((size_t)N, sizeof(*tokens));
    float *scores = calloc((size_t)N, sizeof(float));
    int32_t *types = calloc((size_t)N, sizeof(int32_t));
    char *text = calloc((size_t)N, 16);
    if (!tokens || !scores || !types || !text) {
        free(tokens), free(scores), free(types), free(text);
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    tokens[0] = (kg_gguf_str_t){"<unk>", 5};
    tokens[1] = (kg_gguf_str_t){"<s>", 3};
    tokens[2] = (kg_gguf_str_t){"</s>", 4};
    types[0] = 2; // unknown
    types[1] = 3; // control
    types[2] = 3;
    for (int b = 0; b < 256; b++) {
        char *t = text + (size_t)(3 + b) * 16;
        snprintf(t, 16, "<0x%02X>", b);
        tokens[3 + b] = (kg_gguf_str_t){t, 6};
        types[3 + b] = 6; // byte
    }
    for (int32_t k = 0; k < n_words; k++) {
        /* word k spells k + 20 in base 20 with syllables: distinct for every k */
        char *t = text + (size_t)(259 + k) * 16;
        int n = snprintf(t, 16, "\xe2\x96\x81"); /* SentencePiece's word-start mark */
        char digits[8];
        int nd = 0;
        for (uint32_t x = (uint32_t)k + 20; x > 0 && nd < 5; x /= 20) {
            digits[nd++] = (char)(x % 20);
        }
        while (nd > 0 && n + 2 < 16) {
            n += snprintf(t + n, (size_t)(16 - n), "%s", syl[(int)digits[--nd]]);
        }
        tokens[259 + k] = (kg_gguf_str_t){t, (uint64_t)n};
        types[259 + k] = 1; // normal
        scores[259 + k] = -(float)k;
    }
    const int64_t n_unique = N;
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n_unique);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n_unique);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n_unique);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    free(tokens), free(scores), free(types), free(text);
    return n_unique;
}

// ---- trained vocabularies (gemma, phi3, qwen) ----

/* Text the built-in BPE and SentencePiece vocabularies are trained on (a
 * few hundred merges), so that ordinary English text tokenizes into
 * multi-byte pieces through the real merge paths, not byte by byte. */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A small worker reads jobs from a queue, runs "
    "the model and writes the tokens back. When the queue is empty, it waits; when it is full, "
    "it pauses. Every job has an id, a prompt and a limit on how many tokens it may produce. "
    "The engine keeps the keys and values of each sequence in blocks of sixteen positions, and "
    "blocks that hold the same prefix are shared between jobs. There are 3 colours in the "
    "flag: red, white and blue. In 2024 the team counted 1234 apples, 56 pears and 7 plums! Is "
    "it raining today? No, the sun is shining and the birds are singing in the trees. She "
    "said: \"Let us go to the market before it closes.\" They walked along the river, talking "
    "about books, music and the weather. Numbers like 3.14 and 42 appear, as do words such as "
    "tokenizer, generation and attention. Once upon a time there was a little girl who loved "
    "to read stories about the sea, the stars and the old town where her grandmother lived.";

#define TOK_MAX 24 /* bytes of a trained token at most */

typedef struct trainer {
    char (*tok)[TOK_MAX]; /* (cap) token strings */
    int32_t n_tok, cap;
    int32_t n_init;      /* tokens before the first merge (bytes or characters) */
    int32_t (*merge)[2]; /* (n_merge) pairs of token ids, in order */
    int32_t n_merge;
    int32_t *words;  /* concatenated symbol ids of every word */
    int32_t *starts; /* (n_words + 1) word boundaries in `words` */
    int32_t n_words;
} trainer_t;

static int32_t trainer_add(trainer_t *tr, const char *s, size_t n) {
    for (int32_t i = 0; i < tr->n_tok; i++) {
        if (strlen(tr->tok[i]) == n && memcmp(tr->tok[i], s, n) == 0) {
            return i;
        }
    }
    if (tr->n_tok == tr->cap || n >= TOK_MAX) {
        return -1;
    }
    memcpy(tr->tok[tr->n_tok], s, n);
    tr->tok[tr->n_tok][n] = '\0';
    return tr->n_tok++;
}

/* GPT-2's byte-to-unicode map: printable bytes map to themselves, the
 * others to U+0100 onwards, so every byte is a visible character. */
static uint32_t byte_to_cpt(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        return (uint32_t)b;
    }
    int n = 0;
    for (int c = 0; c < b; c++) {
        n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
    }
    return 256u + (uint32_t)n;
}

static int char_class(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? 0 : (c >= '0' && c <= '9') ? 1 : 2;
}

/* Split the corpus into words and those into initial symbols. BPE: GPT-2
 * style pieces (an optional leading space, then letters, or one digit, or
 * other marks), each byte one symbol of the byte map. SentencePiece: words
 * between spaces with "▁" in front, each character one symbol. */
static bool trainer_words(trainer_t *tr, bool spm) {
    const size_t n = sizeof(corpus) - 1;
    tr->words = malloc((n * 2 + 16) * sizeof(int32_t));
    tr->starts = malloc((n + 2) * sizeof(int32_t));
    if (!tr->words || !tr->starts) {
        return false;
    }
    int32_t nw = 0, ns = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        if (spm) {
            while (j < n && corpus[j] == ' ') {
                j++;
            }
            i = j;
            if (i == n) {
                break;
            }
            while (j < n && corpus[j] != ' ') {
                j++;
            }
        } else {
            if (corpus[j] == ' ' && j + 1 < n && corpus[j + 1] != ' ') {
                j++;
            }
            int cls = char_class((unsigned char)corpus[j]);
            j++;
            while (cls != 1 && j < n && corpus[j] != ' ' &&
                   char_class((unsigned char)corpus[j]) == cls) {
                j++;
            }
        }
        tr->starts[nw++] = ns;
        if (spm) {
            tr->words[ns++] = trainer_add(tr, "\xe2\x96\x81", 3);
        }
        for (size_t k = i; k < j; k++) {
            char buf[4];
            size_t len = spm ? 1 : kg_utf8_put(byte_to_cpt((unsigned char)corpus[k]), buf);
            tr->words[ns++] = trainer_add(tr, spm ? &corpus[k] : buf, len);
        }
        i = j;
    }
    tr->starts[nw] = ns;
    tr->n_words = nw;
    tr->n_init = tr->n_tok;
    for (int32_t k = 0; k < ns; k++) {
        if (tr->words[k] < 0) {
            return false;
        }
    }
    return true;
}

/* Classic BPE training: merge the most frequent adjacent pair (ties: the
 * lowest ids) until n_merges merges or no pair occurs twice. */
static bool trainer_run(trainer_t *tr, int32_t n_merges) {
    const int32_t cap = tr->cap;
    int32_t *count = malloc((size_t)cap * (size_t)cap * sizeof(int32_t));
    tr->merge = malloc((size_t)n_merges * sizeof(*tr->merge));
    if (!count || !tr->merge) {
        free(count);
        return false;
    }
    while (tr->n_merge < n_merges) {
        memset(count, 0, (size_t)cap * (size_t)cap * sizeof(int32_t));
        int32_t best = -1, best_n = 1;
        for (int32_t wd = 0; wd < tr->n_words; wd++) {
            for (int32_t k = tr->starts[wd]; k + 1 < tr->starts[wd + 1]; k++) {
                int32_t c = ++count[tr->words[k] * cap + tr->words[k + 1]];
                int32_t idx = tr->words[k] * cap + tr->words[k + 1];
                if (c > best_n || (c == best_n && idx < best)) {
                    best_n = c;
                    best = idx;
                }
            }
        }
        if (best < 0) {
            break;
        }
        const int32_t a = best / cap, b = best % cap;
        char cat[2 * TOK_MAX];
        snprintf(cat, sizeof(cat), "%s%s", tr->tok[a], tr->tok[b]);
        /* (a merge may rebuild an existing token from another split) */
        const int32_t id = trainer_add(tr, cat, strlen(cat));
        if (id < 0) {
            break; /* too long or the table is full: enough */
        }
        tr->merge[tr->n_merge][0] = a;
        tr->merge[tr->n_merge][1] = b;
        tr->n_merge++;
        /* replace the pair in every word, left to right */
        for (int32_t wd = 0; wd < tr->n_words; wd++) {
            int32_t out = tr->starts[wd], k = tr->starts[wd];
            const int32_t end = tr->starts[wd + 1];
            while (k < end) {
                if (k + 1 < end && tr->words[k] == a && tr->words[k + 1] == b) {
                    tr->words[out++] = id;
                    k += 2;
                } else {
                    tr->words[out++] = tr->words[k++];
                }
            }
            /* pad the shortened word with -1 so the boundaries stay put */
            while (out < end) {
                tr->words[out++] = -1;
            }
        }
        /* drop the padding: compact words and boundaries */
        int32_t w_out = 0;
        for (int32_t wd = 0; wd < tr->n_words; wd++) {
            int32_t s0 = tr->starts[wd], s1 = tr->starts[wd + 1];
            tr->starts[wd] = w_out;
            for (int32_t k = s0; k < s1; k++) {
                if (tr->words[k] >= 0) {
                    tr->words[w_out++] = tr->words[k];
                }
            }
        }
        tr->starts[tr->n_words] = w_out;
    }
    free(count);
    return true;
}

static void trainer_free(trainer_t *tr) {
    free(tr->tok);
    free(tr->merge);
    free(tr->words);
    free(tr->starts);
}

/* A growing vocabulary being written: token strings, scores and types. */
typedef struct vocab {
    kg_gguf_str_t *tokens;
    float *scores;
    int32_t *types;
    char **owned;
    int64_t n, cap;
    bool oom;
} vocab_t;

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_BYTE = 6 };

static int64_t vocab_push(vocab_t *v, const char *text, size_t len, float score, int32_t type) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? v->cap * 2 : 1024;
        kg_gguf_str_t *t = realloc(v->tokens, (size_t)cap * sizeof(*t));
        if (t) {
            v->tokens = t;
        }
        float *s = realloc(v->scores, (size_t)cap * sizeof(*s));
        if (s) {
            v->scores = s;
        }
        int32_t *ty = realloc(v->types, (size_t)cap * sizeof(*ty));
        if (ty) {
            v->types = ty;
        }
        char **o = realloc(v->owned, (size_t)cap * sizeof(*o));
        if (o) {
            v->owned = o;
        }
        if (!t || !s || !ty || !o) {
            v->oom = true;
            return -1;
        }
        v->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        v->oom = true;
        return -1;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    v->owned[v->n] = copy;
    v->tokens[v->n] = (kg_gguf_str_t){copy, len};
    v->scores[v->n] = score;
    v->types[v->n] = type;
    return v->n++;
}

static void vocab_free(vocab_t *v) {
    for (int64_t i = 0; i < v->n; i++) {
        free(v->owned[i]);
    }
    free(v->tokens);
    free(v->scores);
    free(v->types);
    free(v->owned);
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* n_words made-up words ("<mark>" + three or more syllables) after the
 * vocabulary's own tokens, skipping any that already exist. */
static void vocab_add_words(vocab_t *v, const char *mark, int32_t n_words) {
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ta", "ru", "so", "vi", "de", "po",
                                "ha", "li", "mo", "ze", "fa", "gu", "be", "ri", "no", "sa"};
    const int64_t n_have = v->n;
    const char **sorted = malloc((size_t)(n_have > 0 ? n_have : 1) * sizeof(*sorted));
    if (!sorted) {
        v->oom = true;
        return;
    }
    for (int64_t i = 0; i < n_have; i++) {
        sorted[i] = v->owned[i];
    }
    qsort(sorted, (size_t)n_have, sizeof(*sorted), cmp_cstr);
    for (uint32_t k = 400, made = 0; made < (uint32_t)n_words && !v->oom; k++) {
        char t[32];
        int n = snprintf(t, sizeof(t), "%s", mark);
        char digits[8];
        int nd = 0;
        for (uint32_t x = k; x > 0 && nd < 7; x /= 20) {
            digits[nd++] = (char)(x % 20);
        }
        while (nd > 0) {
            n += snprintf(t + n, sizeof(t) - (size_t)n, "%s", syl[(int)digits[--nd]]);
        }
        const char *key = t;
        if (bsearch(&key, sorted, (size_t)n_have, sizeof(*sorted), cmp_cstr)) {
            continue;
        }
        vocab_push(v, t, (size_t)n, -1000.0f - (float)made, TT_NORMAL);
        made++;
    }
    free(sorted);
}

/** Gemma's, Phi-3's or Qwen's built-in vocabulary, trained on the corpus. */
static int64_t add_trained_vocab(kg_gguf_writer_t *w,
                                 kg_mkvocab_style_t style,
                                 int32_t n_words,
                                 char *errstr,
                                 size_t errstr_size) {
    trainer_t tr = {0};
    vocab_t v = {0};
    char **merges = NULL;
    int64_t rc = -1;
    const bool spm = style != KG_MKVOCAB_QWEN && style != KG_MKVOCAB_QWEN3 &&
                     style != KG_MKVOCAB_QWEN_TOOLS && style != KG_MKVOCAB_MISTRAL_TOOLS &&
                     style != KG_MKVOCAB_FN_TOOLS && style != KG_MKVOCAB_GPT_OSS &&
                     style != KG_MKVOCAB_GLM && style != KG_MKVOCAB_DEEPSEEK &&
                     style != KG_MKVOCAB_LLAMA4;
    int64_t eot = -1, eom = -1;
    tr.cap = spm ? 512 : 640;
    tr.tok = calloc((size_t)tr.cap, TOK_MAX);
    if (!tr.tok) {
        goto out;
    }
    if (!spm) {
        for (int b = 0; b < 256; b++) { /* byte tokens first, in byte order */
            char buf[4];
            trainer_add(&tr, buf, kg_utf8_put(byte_to_cpt(b), buf));
        }
    }
    if (!trainer_words(&tr, spm) || !trainer_run(&tr, spm ? 300 : 320)) {
        snprintf(errstr, errstr_size, "out of memory training the built-in vocabulary");
        goto out;
    }
    int64_t bos = -1, eos = -1, unk = -1, pad = -1;
    if (style == KG_MKVOCAB_GEMMA) {
        pad = vocab_push(&v, "<pad>", 5, 0.0f, TT_CONTROL);
        eos = vocab_push(&v, "<eos>", 5, 0.0f, TT_CONTROL);
        bos = vocab_push(&v, "<bos>", 5, 0.0f, TT_CONTROL);
        unk = vocab_push(&v, "<unk>", 5, 0.0f, TT_UNKNOWN);
        vocab_push(&v, "<start_of_turn>", 15, 0.0f, TT_CONTROL);
        vocab_push(&v, "<end_of_turn>", 13, 0.0f, TT_CONTROL);
    } else if (style == KG_MKVOCAB_DEEPSEEK) {
/* DeepSeek's fullwidth bar and SentencePiece space in its token names */
#define BAR "\xef\xbd\x9c"
#define SPC "\xe2\x96\x81"
        /* DeepSeek V3's first ids (its tokenizer.json's added tokens 0-2) */
        bos = vocab_push(&v, "<" BAR "begin" SPC "of" SPC "sentence" BAR ">",
                         strlen("<" BAR "begin" SPC "of" SPC "sentence" BAR ">"), 0.0f, TT_CONTROL);
        eos = vocab_push(&v, "<" BAR "end" SPC "of" SPC "sentence" BAR ">",
                         strlen("<" BAR "end" SPC "of" SPC "sentence" BAR ">"), 0.0f, TT_CONTROL);
        pad = vocab_push(&v, "<" BAR SPC "pad" SPC BAR ">", strlen("<" BAR SPC "pad" SPC BAR ">"),
                         0.0f, TT_CONTROL);
    } else if (style == KG_MKVOCAB_PHI3) {
        unk = vocab_push(&v, "<unk>", 5, 0.0f, TT_UNKNOWN);
        bos = vocab_push(&v, "<s>", 3, 0.0f, TT_CONTROL);
        eos = vocab_push(&v, "</s>", 4, 0.0f, TT_CONTROL);
    }
    if (spm) {
        for (int b = 0; b < 256; b++) {
            char t[8];
            snprintf(t, sizeof(t), "<0x%02X>", b);
            vocab_push(&v, t, 6, 0.0f, TT_BYTE);
        }
        /* characters (and "▁") first, then the merged pieces: the earlier a
         * merge, the higher its score, so SentencePiece takes it first */
        for (int32_t i = 0; i < tr.n_tok; i++) {
            const bool merged = i >= tr.n_init;
            vocab_push(&v, tr.tok[i], strlen(tr.tok[i]),
                       merged ? -(float)(i - tr.n_init) : -1000.0f, TT_NORMAL);
        }
        vocab_add_words(&v, "\xe2\x96\x81", n_words);
        if (style == KG_MKVOCAB_PHI3) {
            static const char *phi[] = {"<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>",
                                        "<|user|>"};
            for (size_t i = 0; i < sizeof(phi) / sizeof(phi[0]); i++) {
                int64_t id = vocab_push(&v, phi[i], strlen(phi[i]), 0.0f, TT_CONTROL);
                eos = i == 0 ? id : eos; /* Phi-3's eos is <|endoftext|>, <|end|> ends a turn */
            }
        }
    } else {
        for (int32_t i = 0; i < tr.n_tok; i++) {
            vocab_push(&v, tr.tok[i], strlen(tr.tok[i]), 0.0f, TT_NORMAL);
        }
        vocab_add_words(&v, "\xc4\xa0", n_words); /* "Ġ": the byte map's space */
        if (style == KG_MKVOCAB_GPT_OSS) {
            static const char *harmony[] = {"<|startoftext|>", "<|endoftext|>", "<|return|>",
                                            "<|constrain|>",   "<|channel|>",   "<|start|>",
                                            "<|end|>",         "<|message|>",   "<|call|>"};
            int64_t ids[9];
            for (size_t i = 0; i < sizeof(harmony) / sizeof(harmony[0]); i++) {
                ids[i] = vocab_push(&v, harmony[i], strlen(harmony[i]), 0.0f, TT_CONTROL);
            }
            bos = ids[0];
            pad = ids[1];
            eos = ids[2];
        } else if (style == KG_MKVOCAB_DEEPSEEK) {
            /* the tokens DeepSeek V3.1's template writes, user-defined as
             * its tokenizer.json has them (special: false) */
            static const char *ds[] = {
                "<" BAR "User" BAR ">",
                "<" BAR "Assistant" BAR ">",
                "<think>",
                "</think>",
                "<" BAR "tool" SPC "calls" SPC "begin" BAR ">",
                "<" BAR "tool" SPC "calls" SPC "end" BAR ">",
                "<" BAR "tool" SPC "call" SPC "begin" BAR ">",
                "<" BAR "tool" SPC "call" SPC "end" BAR ">",
                "<" BAR "tool" SPC "sep" BAR ">",
                "<" BAR "tool" SPC "output" SPC "begin" BAR ">",
                "<" BAR "tool" SPC "output" SPC "end" BAR ">",
            };
            for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++) {
                vocab_push(&v, ds[i], strlen(ds[i]), 0.0f, TT_USER_DEFINED);
            }
#undef BAR
#undef SPC
        } else if (style == KG_MKVOCAB_LLAMA4) {
            /* Llama 4's added tokens in their order (200000 on in its tokenizer.json), less
             * the reserved and image ones: <|eot|> ends a turn and is the EOS the converter
             * writes, <|end_of_text|> ends generation too (llama.cpp finds it by its text) */
            static const char *l4[] = {"<|begin_of_text|>",
                                       "<|end_of_text|>",
                                       "<|fim_prefix|>",
                                       "<|fim_middle|>",
                                       "<|fim_suffix|>",
                                       "<|header_start|>",
                                       "<|header_end|>",
                                       "<|eom|>",
                                       "<|eot|>",
                                       "<|step|>",
                                       "<|python_start|>",
                                       "<|python_end|>",
                                       "<|finetune_right_pad|>",
                                       "<|image|>"};
            int64_t ids[14];
            for (size_t i = 0; i < sizeof(l4) / sizeof(l4[0]); i++) {
                ids[i] = vocab_push(&v, l4[i], strlen(l4[i]), 0.0f, TT_CONTROL);
            }
            bos = ids[0];
            eos = ids[8];
            pad = ids[12];
        } else if (style == KG_MKVOCAB_GLM) {
            /* GLM-4.5's added tokens in their order, as _set_vocab_glm
             * names them: [gMASK] begins every prompt (its template writes
             * it), <|user|> ends a turn, <|observation|> a tool call */
            static const char *glm[] = {"<|endoftext|>", "[MASK]",         "[gMASK]",    "[sMASK]",
                                        "<sop>",         "<eop>",          "<|system|>", "<|user|>",
                                        "<|assistant|>", "<|observation|>"};
            int64_t ids[10];
            for (size_t i = 0; i < sizeof(glm) / sizeof(glm[0]); i++) {
                ids[i] = vocab_push(&v, glm[i], strlen(glm[i]), 0.0f, TT_CONTROL);
            }
            vocab_push(&v, "<think>", 7, 0.0f, TT_USER_DEFINED);
            vocab_push(&v, "</think>", 8, 0.0f, TT_USER_DEFINED);
            eos = unk = pad = ids[0];
            bos = ids[2];
            eot = ids[7];
            eom = ids[9];
        } else {
            bos = pad = vocab_push(&v, "<|endoftext|>", 13, 0.0f, TT_CONTROL);
            vocab_push(&v, "<|im_start|>", 12, 0.0f, TT_CONTROL);
            eos = vocab_push(&v, "<|im_end|>", 10, 0.0f, TT_CONTROL);
            if (style == KG_MKVOCAB_QWEN3) {
                vocab_push(&v, "<think>", 7, 0.0f, TT_USER_DEFINED);
                vocab_push(&v, "</think>", 8, 0.0f, TT_USER_DEFINED);
            }
            if (style == KG_MKVOCAB_QWEN_TOOLS) {
                vocab_push(&v, "<tool_call>", 11, 0.0f, TT_USER_DEFINED);
                vocab_push(&v, "</tool_call>", 12, 0.0f, TT_USER_DEFINED);
            }
            if (style == KG_MKVOCAB_MISTRAL_TOOLS) {
                vocab_push(&v, "[TOOL_CALLS]", 12, 0.0f, TT_CONTROL);
            }
            if (style == KG_MKVOCAB_FN_TOOLS) {
                vocab_push(&v, "<function=", 10, 0.0f, TT_USER_DEFINED);
                vocab_push(&v, "</function>", 11, 0.0f, TT_USER_DEFINED);
            }
        }
        merges = calloc((size_t)tr.n_merge + 1, sizeof(*merges));
        if (!merges) {
            v.oom = true;
        }
        for (int32_t m = 0; merges && m < tr.n_merge; m++) {
            merges[m] = malloc(2 * TOK_MAX + 2);
            if (!merges[m]) {
                v.oom = true;
                break;
            }
            snprintf(merges[m], 2 * TOK_MAX + 2, "%s %s", tr.tok[tr.merge[m][0]],
                     tr.tok[tr.merge[m][1]]);
        }
    }
    if (v.oom) {
        snprintf(errstr, errstr_size, "out of memory");
        goto out;
    }
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    kg_gguf_writer_set_str(w, "tokenizer.ggml.pre",
                           spm                            ? "default"
                           : style == KG_MKVOCAB_GPT_OSS  ? "gpt-4o"
                           : style == KG_MKVOCAB_GLM      ? "glm4"
                           : style == KG_MKVOCAB_DEEPSEEK ? "deepseek-v3"
                           : style == KG_MKVOCAB_LLAMA4   ? "llama4"
                                                          : "qwen2");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v.tokens, (uint64_t)v.n);
    if (spm) {
        kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v.scores, (uint64_t)v.n);
    }
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v.types, (uint64_t)v.n);
    if (!spm) {
        kg_gguf_str_t *ms = calloc((size_t)tr.n_merge + 1, sizeof(*ms));
        if (!ms) {
            snprintf(errstr, errstr_size, "out of memory");
            goto out;
        }
        for (int32_t m = 0; m < tr.n_merge; m++) {
            ms[m] = (kg_gguf_str_t){merges[m], strlen(merges[m])};
        }
        kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, (uint64_t)tr.n_merge);
        free(ms);
    }
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (unk >= 0) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk);
    }
    if (pad >= 0) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    }
    if (eot >= 0) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)eom);
    }
    /* Gemma and Phi-3 add BOS; Qwen and gpt-oss do not */
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token",
                            spm || style == KG_MKVOCAB_DEEPSEEK || style == KG_MKVOCAB_LLAMA4);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (style == KG_MKVOCAB_GEMMA) {
        kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    }
    rc = v.n;
out:
    if (merges) {
        for (int32_t m = 0; m < tr.n_merge; m++) {
            free(merges[m]);
        }
        free(merges);
    }
    vocab_free(&v);
    trainer_free(&tr);
    return rc;
}

int64_t kg_mkvocab_add(kg_gguf_writer_t *w,
                       kg_mkvocab_style_t style,
                       int32_t n_words,
                       char *errstr,
                       size_t errstr_size) {
    if (style == KG_MKVOCAB_LLAMA) {
        return add_llama_vocab(w, n_words, errstr, errstr_size);
    }
    return add_trained_vocab(w, style, n_words, errstr, errstr_size);
}
