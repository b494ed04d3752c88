/* kg_tokenizer_pre: the BPE pre-tokenizers, by their tokenizer.ggml.pre
 * name: the regexes llama.cpp's llm_tokenizer_bpe splits text with before
 * merging, each splitting the pieces of the one before, and the defaults
 * (BOS, ignore_merges) its vocabulary loader sets for them. A table, kept
 * apart so that a new pre-tokenizer is one entry here. */
#include "kg_tokenizer_int.h"

#include <string.h>

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
/* Qwen3.5's: qwen2's with combining marks (\p{M}) joining letter runs */
#define RE_QWEN35                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{"  \
    "M}]+|"                                                                                        \
    "\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"
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

static const kg_tokenizer_pre_t pre_default = {
    {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    false,
    false,
    false,
    false};
static const kg_tokenizer_pre_t pre_gpt2 = {{RE_GPT2}, false, false, false, false};
/* Gemma 4: no word split, only newline runs apart (merges never join across a
 * newline); BOS always (llama.cpp overrides add_bos_token false) */
static const kg_tokenizer_pre_t pre_gemma4 = {{"[^\\n]+|[\\n]+"}, false, true, false, true};
static const kg_tokenizer_pre_t pre_llama3 = {{RE_LLAMA3}, true, true, false, false};
static const kg_tokenizer_pre_t pre_dbrx = {{RE_LLAMA3}, false, false, false, false};
static const kg_tokenizer_pre_t pre_chatglm4 = {{RE_LLAMA3}, false, false, true, false};
static const kg_tokenizer_pre_t pre_qwen2 = {{RE_QWEN2}, false, false, false, false};
static const kg_tokenizer_pre_t pre_qwen35 = {{RE_QWEN35}, false, false, false, false};
static const kg_tokenizer_pre_t pre_falcon = {
    {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false, false, false};
static const kg_tokenizer_pre_t pre_starcoder = {{"\\p{N}", RE_GPT2}, false, false, false, false};
static const kg_tokenizer_pre_t pre_deepseek_llm = {
    {"[\\r\\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, SP "+$", RE_CJK, "\\p{N}+"},
    false,
    false,
    false,
    false};
static const kg_tokenizer_pre_t pre_deepseek_coder = {
    {"[\\r\\n]", SP "?\\p{L}+", SP "?\\p{P}+", RE_CJK, "\\p{N}"}, false, false, false, false};
/* DeepSeek V3 (LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM): digits in threes, CJK
 * runs, then words with their marks */
static const kg_tokenizer_pre_t pre_deepseek3 = {
    {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
     "[!\"#$%&'()*+,\\-./"
     ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
     "?[\\p{P}\\p{S}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"},
    false,
    false,
    false,
    false};
static const kg_tokenizer_pre_t pre_poro = {{RE_PORO}, false, false, false, false};
static const kg_tokenizer_pre_t pre_viking = {{RE_PORO, "\\p{N}"}, false, false, false, false};
static const kg_tokenizer_pre_t pre_tekken = {
    {RE_MIXED_CASE_LETTERS("") "|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP
                               "+(?!" NSP ")|" SP "+"},
    true,
    true,
    false,
    false};
static const kg_tokenizer_pre_t pre_gpt4o = {
    {RE_MIXED_CASE_LETTERS(RE_CONTRACTION) "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP
                                           "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"},
    false,
    false,
    false,
    false};
static const kg_tokenizer_pre_t pre_chameleon = {
    {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
     "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2},
    false,
    true,
    false,
    false};

/* tokenizer.ggml.pre names -> pre-tokenizer (llama_vocab::impl::load). */
static const struct {
    const char *name;
    const kg_tokenizer_pre_t *def;
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
    {"deepseek-v3", &pre_deepseek3},
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
    {"qwen35", &pre_qwen35},
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
    {"gemma4", &pre_gemma4},
};

const kg_tokenizer_pre_t *kg_tokenizer_find_pre(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
        if (strlen(pre_names[i].name) == n && memcmp(pre_names[i].name, s, n) == 0) {
            return pre_names[i].def;
        }
    }
    return NULL;
}
