/* kg_mkvocab: the built-in vocabularies `kgen mkmodel` writes, one per
 * tokenizer path of the supported families (see kg_mkvocab.c). */
#pragma once

#include "kg_gguf_writer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kg_mkvocab_style {
    KG_MKVOCAB_LLAMA = 0,     /* SentencePiece: <unk> <s> </s> and the 256 byte tokens */
    KG_MKVOCAB_QWEN,          /* byte-level BPE, tokenizer.ggml.pre = qwen2, ChatML specials */
    KG_MKVOCAB_GEMMA,         /* SentencePiece without add_space_prefix, Gemma's specials */
    KG_MKVOCAB_PHI3,          /* SentencePiece (space prefix), Phi-3's specials after the pieces */
    KG_MKVOCAB_GPT_OSS,       /* byte-level BPE, tokenizer.ggml.pre = gpt-4o, Harmony's specials */
    KG_MKVOCAB_QWEN3,         /* KG_MKVOCAB_QWEN plus Qwen3's <think> and </think> (user-defined
                                 tokens, as Qwen3's converter writes them): for thinking templates */
    KG_MKVOCAB_QWEN_TOOLS,    /* KG_MKVOCAB_QWEN plus Qwen2.5's <tool_call> and </tool_call>
                                 (user-defined, as its converter writes them): for tool templates */
    KG_MKVOCAB_GLM,           /* byte-level BPE, tokenizer.ggml.pre = glm4, GLM-4.5's specials
                                 ([gMASK] as BOS, <|user|> EOT, <|observation|> EOM, <think>) */
    KG_MKVOCAB_DEEPSEEK,      /* byte-level BPE, tokenizer.ggml.pre = deepseek-v3, DeepSeek V3's
                                 specials (BOS 0, EOS 1, pad 2 first; the chat, think and tool
                                 tokens after the pieces), add_bos_token */
    KG_MKVOCAB_MISTRAL_TOOLS, /* KG_MKVOCAB_QWEN plus Mistral's [TOOL_CALLS] (a control token,
                                 as in Mistral's tekken vocabulary): for Mistral Nemo's tool
                                 template */
    KG_MKVOCAB_FN_TOOLS,      /* KG_MKVOCAB_QWEN plus <function= and </function> (user-defined
                                 text tokens): for Functionary v3.1's template, so that a
                                 random model writes its call opening as one token */
    KG_MKVOCAB_LLAMA4,        /* byte-level BPE, tokenizer.ggml.pre = llama4, Llama 4's specials
                                 after the pieces (<|begin_of_text|> BOS, <|eot|> EOS, the
                                 header and python tokens), add_bos_token */
} kg_mkvocab_style_t;

/** Write the tokenizer.* keys of a built-in vocabulary of `style`, with
 * `n_words` made-up word tokens added after the style's own ones (to reach
 * a real model's vocabulary size). Returns the vocabulary size, or -1 with
 * errstr set (out of memory). Deterministic: the same arguments give the
 * same keys. */
int64_t kg_mkvocab_add(kg_gguf_writer_t *w,
                       kg_mkvocab_style_t style,
                       int32_t n_words,
                       char *errstr,
                       size_t errstr_size);
