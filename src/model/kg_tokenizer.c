/* kg_tokenizer: the SPM and byte-level BPE tokenizers of GGUF files, giving
 * the same ids as llama.cpp (src/llama-vocab.cpp, src/unicode.cpp).
 *
 * DESIGN
 * Everything is built once in kg_tokenizer_new and read-only afterwards, so
 * one tokenizer serves any number of threads; kg_tokenizer_encode keeps its
 * working memory in a per-call session.
 *
 * - The vocabulary is copied into one text pool; a token text -> id hash
 *   table (open addressing) and, for BPE, a merge "left right" -> rank table
 *   make every lookup O(length of the string).
 * - Token attributes follow llama.cpp: the file's token types, then the
 *   same text-based fix-ups (EOT/EOM/FIM/EOG tokens become control tokens,
 *   "unused" control tokens, the Phi-3 right-strip rule), because they decide
 *   which texts the special-token pass matches and what decoding prints.
 * - Encoding first cuts the text at special tokens (longest token first,
 *   then every occurrence left to right, as llama.cpp's
 *   tokenizer_st_partition): control and unknown tokens only with
 *   parse_special, user-defined tokens always.
 * - SPM: spaces become U+2581, a leading one is added at the start and
 *   after each special token, then the highest-scoring adjacent pair is
 *   merged while one exists (a heap; ties go to the leftmost pair); pieces
 *   that are not tokens fall back to <0xXX> byte tokens.
 * - BPE: the pre-tokenizer regexes of `tokenizer.ggml.pre` (PCRE2, compiled
 *   once, JIT when available) split the text, each regex splitting the
 *   pieces of the one before and keeping the unmatched gaps as pieces;
 *   `\s` is spelled out as llama.cpp's whitespace set. Each piece's bytes go
 *   through the GPT-2 byte-to-unicode map and the lowest-ranked adjacent
 *   merge is applied while one exists (ties: leftmost).
 * - Invalid UTF-8: llama.cpp reads each invalid byte as U+FFFD. The regexes
 *   here see exactly that (so the cuts are llama.cpp's), but the pieces keep
 *   the original bytes, so that decode(encode(text)) == text for any bytes;
 *   llama.cpp instead encodes the three bytes of U+FFFD there. */
#include "kg_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/kg_log.h"
#include "core/kg_utf8.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

// ---- small helpers ----

static void set_err(char *errstr, size_t errstr_size, const char *fmt, const char *arg) {
    if (errstr && errstr_size) {
        snprintf(errstr, errstr_size, fmt, arg);
    }
}

static uint32_t hash_bytes(uint32_t h, const char *s, size_t n) {
    // FNV-1a: short strings, and it composes: hash("a b") == hash(hash(hash("a"), " "), "b")
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

#define HASH_SEED 2166136261u

/* Table slot of a hash: FNV-1a mixes only upwards, so its low bits (the
 * ones a mask keeps) need the murmur3 finaliser to spread. */
static size_t slot_of(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

static size_t table_size_for(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) {
        cap <<= 1;
    }
    return cap;
}

static size_t utf8_len(unsigned char c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* One code point read the way llama.cpp's unicode_cpt_from_utf8 reads it
 * (no overlong or range checks); an invalid sequence gives U+FFFD and
 * consumes one byte. Returns the bytes consumed. */
static size_t lcpp_decode(const unsigned char *s, size_t n, uint32_t *cpt) {
    unsigned char c = s[0];
    if (!(c & 0x80)) {
        *cpt = c;
        return 1;
    }
    if ((c & 0x40) && !(c & 0x20)) {
        if (n >= 2 && (s[1] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
            return 2;
        }
    } else if ((c & 0x40) && !(c & 0x10)) {
        if (n >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
            return 3;
        }
    } else if ((c & 0x40) && !(c & 0x08)) {
        if (n >= 4 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80) {
            *cpt = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                   ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
            return 4;
        }
    }
    *cpt = 0xFFFD;
    return 1;
}

/* First occurrence of `needle` in `hay` (memmem is a GNU extension). */
static const char *find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn) {
        return NULL;
    }
    const char *end = hay + (hn - nn);
    for (const char *p = hay; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p) {
            return NULL;
        }
        if (memcmp(p, needle, nn) == 0) {
            return p;
        }
        p++;
    }
    return NULL;
}

static size_t canonical_len(uint32_t cpt) {
    return cpt < 0x80 ? 1 : cpt < 0x800 ? 2 : cpt < 0x10000 ? 3 : 4;
}

/* Whether `len` bytes decoded to `cpt` are exactly its UTF-8 form, which is
 * what PCRE2 accepts (no overlong forms, surrogates or values > U+10FFFF). */
static bool is_canonical(uint32_t cpt, size_t len) {
    return len == canonical_len(cpt) && cpt <= 0x10FFFF && !(cpt >= 0xD800 && cpt <= 0xDFFF) &&
           !(cpt == 0xFFFD && len == 1);
}

/* Grow *p to hold `need` elements of `elem` bytes. */
static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) {
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

// ---- vocabulary lookups ----

static const char *tok_text(const kg_tokenizer_t *tok, int32_t id, size_t *len) {
    *len = tok->text_off[id + 1] - tok->text_off[id];
    return tok->text + tok->text_off[id];
}

static int32_t find_token(const kg_tokenizer_t *tok, const char *s, size_t n) {
    uint32_t h = hash_bytes(HASH_SEED, s, n);
    for (size_t i = slot_of(h) & tok->tok_mask;; i = (i + 1) & tok->tok_mask) {
        uint64_t slot = tok->tok_slots[i];
        if (!slot) {
            return -1;
        }
        if ((uint32_t)(slot >> 32) == h) {
            int32_t id = (int32_t)(uint32_t)slot - 1;
            size_t len;
            const char *t = tok_text(tok, id, &len);
            if (len == n && memcmp(t, s, n) == 0) {
                return id;
            }
        }
    }
}

static int32_t find_cstr(const kg_tokenizer_t *tok, const char *s) {
    return find_token(tok, s, strlen(s));
}

/* Rank of merging `l` and `r`, or -1 (llama_vocab::find_bpe_rank). */
static int32_t
merge_rank(const kg_tokenizer_t *tok, const char *l, size_t ln, const char *r, size_t rn) {
    if (!tok->merge_slots) {
        return -1;
    }
    uint32_t h = hash_bytes(hash_bytes(hash_bytes(HASH_SEED, l, ln), " ", 1), r, rn);
    for (size_t i = slot_of(h) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
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

// ---- pre-tokenizers (llm_tokenizer_bpe) ----

/* llama.cpp's whitespace set (unicode_set_whitespace: the Unicode White_Space
 * property). PCRE2's own \s also takes U+180E, so `\s` is spelled out. */
#define WS                                                                                         \
    "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"  \
    "\\x{205f}\\x{3000}"
#define SP  "[" WS "]"
#define NSP "[^" WS "]"

#define RE_GPT2                                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SP "+(?!" NSP ")"
#define RE_LLAMA3                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"
#define RE_QWEN2                                                                                   \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"
#define RE_CJK  "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"
#define RE_PORO " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+"
#define RE_DEEPSEEK_LETTERS                                                                        \
    SP "?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"            \
       "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"      \
       "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"               \
       "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}"                    \
       "\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"              \
       "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}"              \
       "\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}"              \
       "\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}"      \
       "\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}"     \
       "\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"               \
       "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"                \
       "\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"     \
       "\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"      \
       "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}"               \
       "\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}"              \
       "\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"            \
       "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"      \
       "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+"
#define RE_DEEPSEEK_PUNCT                                                                          \
    SP "?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+"
#define RE_MIXED_CASE_LETTERS(extra)                                                               \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" extra                   \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" extra
#define RE_CONTRACTION "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"

typedef struct pre_def {
    const char *regex[MAX_REGEX];
    bool ignore_merges; /* a piece that is a whole token is used as is */
    bool add_bos;       /* llama.cpp's default when the file does not say */
    bool no_bos_token;  /* no default BOS id (ChatGLM) */
} pre_def_t;

static const pre_def_t pre_default = {
    {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false, false};
static const pre_def_t pre_gpt2 = {{RE_GPT2}, false, false, false};
static const pre_def_t pre_llama3 = {{RE_LLAMA3}, true, true, false};
static const pre_def_t pre_dbrx = {{RE_LLAMA3}, false, false, false};
static const pre_def_t pre_chatglm4 = {{RE_LLAMA3}, false, false, true};
static const pre_def_t pre_qwen2 = {{RE_QWEN2}, false, false, false};
static const pre_def_t pre_falcon = {
    {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false, false};
static const pre_def_t pre_starcoder = {{"\\p{N}", RE_GPT2}, false, false, false};
static const pre_def_t pre_deepseek_llm = {
    {"[\\r\\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, SP "+$", RE_CJK, "\\p{N}+"},
    false,
    false,
    false};
static const pre_def_t pre_deepseek_coder = {
    {"[\\r\\n]", SP "?\\p{L}+", SP "?\\p{P}+", RE_CJK, "\\p{N}"}, false, false, false};
static const pre_def_t pre_poro = {{RE_PORO}, false, false, false};
static const pre_def_t pre_viking = {{RE_PORO, "\\p{N}"}, false, false, false};
static const pre_def_t pre_tekken = {
    {RE_MIXED_CASE_LETTERS("") "|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP
                               "+(?!" NSP ")|" SP "+"},
    true,
    true,
    false};
static const pre_def_t pre_gpt4o = {
    {RE_MIXED_CASE_LETTERS(RE_CONTRACTION) "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP
                                           "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"},
    false,
    false,
    false};
static const pre_def_t pre_chameleon = {{"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                                         "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]",
                                         RE_GPT2},
                                        false,
                                        true,
                                        false};

/* tokenizer.ggml.pre names -> pre-tokenizer (llama_vocab::impl::load). */
static const struct {
    const char *name;
    const pre_def_t *def;
} pre_names[] = {
    {"default", &pre_default},
    {"llama3", &pre_llama3},
    {"llama-v3", &pre_llama3},
    {"llama-bpe", &pre_llama3},
    {"falcon3", &pre_llama3},
    {"falcon-h1", &pre_llama3},
    {"pixtral", &pre_llama3},
    {"midm-2.0", &pre_llama3},
    {"lfm2", &pre_llama3},
    {"dbrx", &pre_dbrx},
    {"smaug-bpe", &pre_dbrx},
    {"deepseek-llm", &pre_deepseek_llm},
    {"deepseek-coder", &pre_deepseek_coder},
    {"falcon", &pre_falcon},
    {"mpt", &pre_gpt2},
    {"olmo", &pre_gpt2},
    {"jais", &pre_gpt2},
    {"trillion", &pre_gpt2},
    {"granite-docling", &pre_gpt2},
    {"gpt-2", &pre_gpt2},
    {"phi-2", &pre_gpt2},
    {"jina-es", &pre_gpt2},
    {"jina-de", &pre_gpt2},
    {"gigachat", &pre_gpt2},
    {"jina-v2-es", &pre_gpt2},
    {"jina-v2-de", &pre_gpt2},
    {"jina-v1-en", &pre_gpt2},
    {"jina-v2-code", &pre_gpt2},
    {"roberta-bpe", &pre_gpt2},
    {"a.x-4.0", &pre_gpt2},
    {"mellum", &pre_gpt2},
    {"exaone4", &pre_gpt2},
    {"starcoder", &pre_starcoder},
    {"refact", &pre_starcoder},
    {"command-r", &pre_starcoder},
    {"smollm", &pre_starcoder},
    {"codeshell", &pre_starcoder},
    {"exaone", &pre_starcoder},
    {"minerva-7b", &pre_starcoder},
    {"qwen2", &pre_qwen2},
    {"deepseek-r1-qwen", &pre_qwen2},
    {"megrez", &pre_qwen2},
    {"stablelm2", &pre_qwen2},
    {"poro-chat", &pre_poro},
    {"bloom", &pre_poro},
    {"gpt3-finnish", &pre_poro},
    {"viking", &pre_viking},
    {"chatglm-bpe", &pre_chatglm4},
    {"glm4", &pre_chatglm4},
    {"tekken", &pre_tekken},
    {"chameleon", &pre_chameleon},
    {"gpt-4o", &pre_gpt4o},
    {"llama4", &pre_gpt4o},
};

static const pre_def_t *find_pre(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
        if (strlen(pre_names[i].name) == n && memcmp(pre_names[i].name, s, n) == 0) {
            return pre_names[i].def;
        }
    }
    return NULL;
}

// ---- special-token texts llama.cpp recognises (llama_vocab::impl::load) ----

#define FW_BAR "\xef\xbd\x9c" /* U+FF5C, DeepSeek's "｜" */
#define LOW8   "\xe2\x96\x81" /* U+2581 "▁" */

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
    const char *t = tok_text(tok, id, &len);
    uint32_t h = hash_bytes(HASH_SEED, t, len);
    for (size_t i = slot_of(h) & tok->tok_mask;; i = (i + 1) & tok->tok_mask) {
        uint64_t slot = tok->tok_slots[i];
        if (!slot) {
            tok->tok_slots[i] = ((uint64_t)h << 32) | (uint32_t)(id + 1);
            return -1;
        }
        if ((uint32_t)(slot >> 32) == h) {
            int32_t other = (int32_t)(uint32_t)slot - 1;
            size_t olen;
            const char *o = tok_text(tok, other, &olen);
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
        uint32_t h = hash_bytes(HASH_SEED, s.data, s.len);
        for (size_t j = slot_of(h) & tok->merge_mask;; j = (j + 1) & tok->merge_mask) {
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
    const char *t = tok_text(tok, id, &len);
    uint16_t a = tok->attr[id];
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        memcpy(dst, t, len);
        return len;
    }
    if (a & ATTR_NORMAL) {
        size_t o = 0;
        if (tok->kind == KG_TOKENIZER_SPM) {
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
            size_t n = lcpp_decode((const unsigned char *)t + i, len - i, &cpt);
            if (cpt < 324 && tok->bmap_inv[cpt] >= 0 && is_canonical(cpt, n)) {
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
        const char *t = tok_text(tok, id, &len);
        if ((tok->attr[id] & ATTR_CONTROL) && find_bytes(t, len, "unused", 6)) {
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

/* Phi-3 GGUFs strip the whitespace after special tokens (llama.cpp keys
 * this on general.name). */
static void apply_name_rules(kg_tokenizer_t *tok, const kg_gguf_t *g) {
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

static bool
compile_regexes(kg_tokenizer_t *tok, const pre_def_t *pre, char *errstr, size_t errstr_size) {
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
    const pre_def_t *pre = NULL;
    if (strcmp(mname, "llama") == 0 && model.len == 5) {
        tok->kind = KG_TOKENIZER_SPM;
        tok->bos = 1;
        tok->eos = 2;
        tok->unk = 0;
        tok->add_bos = true;
        tok->add_space_prefix = true;
    } else if (strcmp(mname, "gpt2") == 0 && model.len == 4) {
        tok->kind = KG_TOKENIZER_BPE;
        tok->bos = 11; // llama.cpp's defaults (from Falcon) when the file names none
        tok->eos = 11;
        tok->unk = -1;
        kg_gguf_str_t p;
        if (!kg_gguf_get_str(g, "tokenizer.ggml.pre", &p)) {
            KG_LOG_WARN("tokenizer", "tokenizer.ggml.pre is missing, using 'default'");
            pre = &pre_default;
        } else if (!(pre = find_pre(p.data, (size_t)p.len))) {
            char pname[64];
            snprintf(pname, sizeof(pname), "%.*s", (int)(p.len < 60 ? p.len : 60), p.data);
            set_err(errstr, errstr_size, "unsupported pre-tokenizer type '%s'", pname);
            goto fail;
        }
        tok->ignore_merges = pre->ignore_merges;
        tok->add_bos = pre->add_bos;
        if (pre->no_bos_token) {
            tok->bos = -1;
        }
    } else {
        set_err(errstr, errstr_size,
                "unsupported tokenizer model '%s' (kgen supports 'llama' (SPM) and 'gpt2' (BPE))",
                mname);
        goto fail;
    }
    tok->eot = tok->eom = tok->pad = -1;

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
    kg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &tok->add_bos);
    kg_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &tok->add_eos);
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
            const char *t = tok_text(tok, id, &len);
            for (size_t i = 0; len > 1 && i < len; i++) {
                if ((unsigned char)t[i] < 0x80) {
                    tok->isolated[(unsigned char)t[i]] = false;
                }
            }
        }
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
            tok->byte_tok[b] = find_token(tok, name, 6);
            if (tok->byte_tok[b] < 0) {
                char c = (char)b;
                tok->byte_tok[b] = find_token(tok, &c, 1);
            }
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
    free(tok);
}

// ---- getters ----

kg_tokenizer_kind_t kg_tokenizer_kind(const kg_tokenizer_t *tok) {
    return tok->kind;
}

int32_t kg_tokenizer_n_vocab(const kg_tokenizer_t *tok) {
    return tok->n_vocab;
}

int32_t kg_tokenizer_bos(const kg_tokenizer_t *tok) {
    return tok->bos;
}

int32_t kg_tokenizer_eos(const kg_tokenizer_t *tok) {
    return tok->eos;
}

bool kg_tokenizer_add_bos(const kg_tokenizer_t *tok) {
    return tok->add_bos;
}

bool kg_tokenizer_add_eos(const kg_tokenizer_t *tok) {
    return tok->add_eos;
}

bool kg_tokenizer_is_eog(const kg_tokenizer_t *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab && (tok->attr[id] & ATTR_EOG);
}

bool kg_tokenizer_is_control(const kg_tokenizer_t *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab && (tok->attr[id] & ATTR_CONTROL);
}

kg_gguf_str_t kg_tokenizer_token_text(const kg_tokenizer_t *tok, int32_t id) {
    kg_gguf_str_t s = {"", 0};
    if (id >= 0 && id < tok->n_vocab) {
        size_t len;
        s.data = tok_text(tok, id, &len);
        s.len = len;
    }
    return s;
}

int32_t kg_tokenizer_find(const kg_tokenizer_t *tok, const char *text, size_t len) {
    return find_token(tok, text, len);
}

size_t
kg_tokenizer_piece(const kg_tokenizer_t *tok, int32_t id, bool special, char *buf, size_t cap) {
    if (id < 0 || id >= tok->n_vocab) {
        return 0;
    }
    if (!special && (tok->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) {
        return 0;
    }
    size_t len = tok->piece_off[id + 1] - tok->piece_off[id];
    if (cap > 0) {
        memcpy(buf, tok->piece + tok->piece_off[id], len < cap ? len : cap);
    }
    return len;
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

/* Split `text` into symbols of one UTF-8 character each (by the lead byte,
 * as llama.cpp: no validation). Returns the count, or -1 on no memory. */
static int64_t split_chars(session_t *s, const char *text, size_t len) {
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        if (!grow((void **)&s->sym, &s->sym_cap, n + 1, sizeof(symbol_t))) {
            return -1;
        }
        size_t cl = utf8_len((unsigned char)text[off]);
        if (cl > len - off) {
            cl = len - off;
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
    int32_t id = find_token(s->tok, text + l->start, l->n + r->n);
    if (id < 0) {
        return true;
    }
    return heap_push(s, (bigram_t){s->tok->score[id], left, right, l->n + r->n});
}

/* llm_tokenizer_spm_session::tokenize on a segment of escaped text. */
static bool spm_segment(session_t *s, const char *text, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    int64_t n = split_chars(s, text, len);
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
        int32_t id = find_token(tok, text + sym->start, sym->n);
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
    return spm_tokenize(s, s->buf, m, o);
}

static bool bpe_pair(session_t *s, const char *word, int32_t left, int32_t right) {
    const symbol_t *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = merge_rank(s->tok, word + l->start, l->n, word + r->start, r->n);
    if (rank < 0) {
        return true;
    }
    return heap_push(s, (bigram_t){-(float)rank, left, right, l->n + r->n});
}

/* One pre-tokenized piece (raw bytes) of a BPE text: byte map, merges, ids. */
static bool bpe_piece(session_t *s, const char *p, size_t len, out_t *o) {
    const kg_tokenizer_t *tok = s->tok;
    if (len == 0) {
        return true;
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
        int32_t id = find_token(tok, word, wlen);
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
        int32_t id = find_token(tok, word + sym->start, sym->n);
        if (id >= 0) {
            emit(o, id);
            continue;
        }
        // llama.cpp looks up each byte of the mapped text alone and drops misses
        for (uint32_t j = 0; j < sym->n; j++) {
            id = find_token(tok, word + sym->start + j, 1);
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
    // The regexes run on valid UTF-8 holding llama.cpp's code points: each
    // invalid byte becomes U+FFFD, overlong forms their code point. Pieces
    // are mapped back to the original bytes through vmap.
    bool same = true;
    for (size_t i = 0; i < len;) {
        uint32_t cpt;
        size_t n = lcpp_decode((const unsigned char *)text + i, len - i, &cpt);
        if (!is_canonical(cpt, n)) {
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
            size_t n = lcpp_decode((const unsigned char *)text + i, len - i, &cpt);
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
        const char *t = tok_text(tok, id, &tl);
        size_t nn = 0;
        for (size_t f = 0; f < n; f++) {
            fragment_t fr = cur[f];
            const char *hit = fr.token < 0 ? find_bytes(text + fr.off, fr.len, t, tl) : NULL;
            if (!hit) {
                if (!grow((void **)&next, &ncap, nn + 1, sizeof(fragment_t))) {
                    goto out;
                }
                next[nn++] = fr;
                continue;
            }
            size_t off = fr.off, flen = fr.len;
            while (flen > 0 && (hit = find_bytes(text + off, flen, t, tl))) {
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
    if (ok && add_special && tok->add_bos) {
        emit(&o, tok->bos);
    }
    bool prev_special = true; // SPM: a leading space at the start and after special tokens
    for (size_t i = 0; ok && i < n_frags; i++) {
        const fragment_t *f = &frags[i];
        if (f->token >= 0) {
            emit(&o, f->token);
            prev_special = true;
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
    pcre2_match_data_free(s.md);
    free(frags);
    free(s.sym);
    free(s.heap);
    free(s.buf);
    free(s.view_buf);
    free(s.vmap);
    free(s.spans[0]);
    free(s.spans[1]);
    return ok ? o.n : -1;
}
