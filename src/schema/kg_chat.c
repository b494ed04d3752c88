/* kg_chat: which chat template a model has, recognised as llama.cpp does
 * (src/llama-chat.cpp: llm_chat_detect_template), and the formats' names.
 * Writing a conversation in the recognised format is kg_chat_render.c. */
#include "kg_chat.h"

#include "kg_chat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- names ----

static const char *const template_names[KG_CHAT_TEMPLATE_COUNT_] = {
    [KG_CHAT_TEMPLATE_UNKNOWN] = "unknown",
    [KG_CHAT_TEMPLATE_CHATML] = "chatml",
    [KG_CHAT_TEMPLATE_LLAMA_2] = "llama2",
    [KG_CHAT_TEMPLATE_LLAMA_2_SYS] = "llama2-sys",
    [KG_CHAT_TEMPLATE_LLAMA_2_SYS_BOS] = "llama2-sys-bos",
    [KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP] = "llama2-sys-strip",
    [KG_CHAT_TEMPLATE_MISTRAL_V1] = "mistral-v1",
    [KG_CHAT_TEMPLATE_MISTRAL_V3] = "mistral-v3",
    [KG_CHAT_TEMPLATE_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [KG_CHAT_TEMPLATE_MISTRAL_V7] = "mistral-v7",
    [KG_CHAT_TEMPLATE_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [KG_CHAT_TEMPLATE_PHI_3] = "phi3",
    [KG_CHAT_TEMPLATE_PHI_4] = "phi4",
    [KG_CHAT_TEMPLATE_FALCON_3] = "falcon3",
    [KG_CHAT_TEMPLATE_ZEPHYR] = "zephyr",
    [KG_CHAT_TEMPLATE_MONARCH] = "monarch",
    [KG_CHAT_TEMPLATE_GEMMA] = "gemma",
    [KG_CHAT_TEMPLATE_ORION] = "orion",
    [KG_CHAT_TEMPLATE_OPENCHAT] = "openchat",
    [KG_CHAT_TEMPLATE_VICUNA] = "vicuna",
    [KG_CHAT_TEMPLATE_VICUNA_ORCA] = "vicuna-orca",
    [KG_CHAT_TEMPLATE_DEEPSEEK] = "deepseek",
    [KG_CHAT_TEMPLATE_DEEPSEEK_2] = "deepseek2",
    [KG_CHAT_TEMPLATE_DEEPSEEK_3] = "deepseek3",
    [KG_CHAT_TEMPLATE_COMMAND_R] = "command-r",
    [KG_CHAT_TEMPLATE_LLAMA_3] = "llama3",
    [KG_CHAT_TEMPLATE_CHATGLM_3] = "chatglm3",
    [KG_CHAT_TEMPLATE_CHATGLM_4] = "chatglm4",
    [KG_CHAT_TEMPLATE_GLMEDGE] = "glmedge",
    [KG_CHAT_TEMPLATE_MINICPM] = "minicpm",
    [KG_CHAT_TEMPLATE_EXAONE_3] = "exaone3",
    [KG_CHAT_TEMPLATE_EXAONE_4] = "exaone4",
    [KG_CHAT_TEMPLATE_RWKV_WORLD] = "rwkv-world",
    [KG_CHAT_TEMPLATE_GRANITE] = "granite",
    [KG_CHAT_TEMPLATE_GIGACHAT] = "gigachat",
    [KG_CHAT_TEMPLATE_MEGREZ] = "megrez",
    [KG_CHAT_TEMPLATE_YANDEX] = "yandex",
    [KG_CHAT_TEMPLATE_BAILING] = "bailing",
    [KG_CHAT_TEMPLATE_BAILING_THINK] = "bailing-think",
    [KG_CHAT_TEMPLATE_BAILING2] = "bailing2",
    [KG_CHAT_TEMPLATE_LLAMA4] = "llama4",
    [KG_CHAT_TEMPLATE_SMOLVLM] = "smolvlm",
    [KG_CHAT_TEMPLATE_DOTS1] = "dots1",
    [KG_CHAT_TEMPLATE_HUNYUAN_MOE] = "hunyuan-moe",
    [KG_CHAT_TEMPLATE_OPENAI_MOE] = "gpt-oss",
    [KG_CHAT_TEMPLATE_HUNYUAN_DENSE] = "hunyuan-dense",
    [KG_CHAT_TEMPLATE_KIMI_K2] = "kimi-k2",
    [KG_CHAT_TEMPLATE_SEED_OSS] = "seed_oss",
    [KG_CHAT_TEMPLATE_GROK_2] = "grok-2",
    [KG_CHAT_TEMPLATE_PANGU_EMBED] = "pangu-embedded",
};

const char *kg_chat_template_name(kg_chat_template_t tmpl) {
    if ((int)tmpl < 0 || tmpl >= KG_CHAT_TEMPLATE_COUNT_) {
        return "unknown";
    }
    return template_names[tmpl];
}

// ---- detection (llm_chat_detect_template, same order) ----

static bool has(const char *tmpl, const char *needle) {
    return strstr(tmpl, needle) != NULL;
}

static kg_chat_template_t detect_by_name(const char *tmpl) {
    // "dots1" has no name in llama.cpp's table; "unknown" is not a name either.
    for (int t = KG_CHAT_TEMPLATE_CHATML; t < KG_CHAT_TEMPLATE_COUNT_; t++) {
        if (t != KG_CHAT_TEMPLATE_DOTS1 && strcmp(tmpl, template_names[t]) == 0) {
            return (kg_chat_template_t)t;
        }
    }
    return KG_CHAT_TEMPLATE_UNKNOWN;
}

static kg_chat_template_t detect_inst(const char *tmpl) {
    if (has(tmpl, "[SYSTEM_PROMPT]")) {
        return KG_CHAT_TEMPLATE_MISTRAL_V7;
    }
    // The official Mistral v1, v3 and v3-tekken templates.
    if (has(tmpl, "' [INST] ' + system_message") || has(tmpl, "[AVAILABLE_TOOLS]")) {
        if (has(tmpl, " [INST]")) {
            return KG_CHAT_TEMPLATE_MISTRAL_V1;
        }
        if (has(tmpl, "\"[INST]\"")) {
            return KG_CHAT_TEMPLATE_MISTRAL_V3_TEKKEN;
        }
        return KG_CHAT_TEMPLATE_MISTRAL_V3;
    }
    // Llama 2 and its variants.
    if (has(tmpl, "content.strip()")) {
        return KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP;
    }
    if (has(tmpl, "bos_token + '[INST]")) {
        return KG_CHAT_TEMPLATE_LLAMA_2_SYS_BOS;
    }
    if (has(tmpl, "<<SYS>>")) {
        return KG_CHAT_TEMPLATE_LLAMA_2_SYS;
    }
    return KG_CHAT_TEMPLATE_LLAMA_2;
}

/* A marker rule: the template has `a` (and `b`, `c` when set) -> `tmpl`. */
typedef struct marker_rule {
    const char *a;
    const char *b;
    const char *c;
    kg_chat_template_t tmpl;
} marker_rule_t;

/* The rules after the Phi-3 / GLM / Zephyr block, in llama.cpp's order. */
static const marker_rule_t late_rules[] = {
    {"bos_token + message['role']", NULL, NULL, KG_CHAT_TEMPLATE_MONARCH},
    {"<start_of_turn>", NULL, NULL, KG_CHAT_TEMPLATE_GEMMA},
    {"'\\n\\nAssistant: ' + eos_token", NULL, NULL, KG_CHAT_TEMPLATE_ORION},
    {"GPT4 Correct ", NULL, NULL, KG_CHAT_TEMPLATE_OPENCHAT},
    {"USER: ", "ASSISTANT: ", NULL, KG_CHAT_TEMPLATE_VICUNA}, /* ORCA with "SYSTEM: " */
    {"### Instruction:", "<|EOT|>", NULL, KG_CHAT_TEMPLATE_DEEPSEEK},
    {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", NULL, KG_CHAT_TEMPLATE_COMMAND_R},
    {"<|start_header_id|>", "<|end_header_id|>", NULL, KG_CHAT_TEMPLATE_LLAMA_3},
    {"[gMASK]sop", NULL, NULL, KG_CHAT_TEMPLATE_CHATGLM_3},
    {USER_CN, NULL, NULL, KG_CHAT_TEMPLATE_MINICPM},
    {"'Assistant: ' + message['content'] + eos_token", NULL, NULL, KG_CHAT_TEMPLATE_DEEPSEEK_2},
    {"<" FW_BAR "Assistant" FW_BAR ">", "<" FW_BAR "User" FW_BAR ">", EOS_DEEPSEEK,
     KG_CHAT_TEMPLATE_DEEPSEEK_3},
    {"[|system|]", "[|assistant|]", "[|endofturn|]", KG_CHAT_TEMPLATE_EXAONE_3}, /* 4: [|tool|] */
    {"rwkv-world", NULL, NULL, KG_CHAT_TEMPLATE_RWKV_WORLD},
    {"{{- 'User: ' + message['content']|trim + '\\n\\n' -}}", NULL, NULL,
     KG_CHAT_TEMPLATE_RWKV_WORLD},
    {"<|start_of_role|>", NULL, NULL, KG_CHAT_TEMPLATE_GRANITE},
    {"message['role'] + additional_special_tokens[0] + message['content'] + "
     "additional_special_tokens[1]",
     NULL, NULL, KG_CHAT_TEMPLATE_GIGACHAT},
    {"<|role_start|>", NULL, NULL, KG_CHAT_TEMPLATE_MEGREZ},
    {" \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd\xd1\x82:", NULL, NULL,
     KG_CHAT_TEMPLATE_YANDEX}, /* " Ассистент:" */
    {"<role>ASSISTANT</role>", "'HUMAN'", NULL, KG_CHAT_TEMPLATE_BAILING},
    {"<role>ASSISTANT</role>", "\"HUMAN\"", "<think>", KG_CHAT_TEMPLATE_BAILING_THINK},
    {"<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>", KG_CHAT_TEMPLATE_BAILING2},
    {"<|header_start|>", "<|header_end|>", NULL, KG_CHAT_TEMPLATE_LLAMA4},
    {"<|endofuserprompt|>", NULL, NULL, KG_CHAT_TEMPLATE_DOTS1},
    {"<|extra_0|>", "<|extra_4|>", NULL, KG_CHAT_TEMPLATE_HUNYUAN_MOE},
    {"<|start|>", "<|channel|>", NULL, KG_CHAT_TEMPLATE_OPENAI_MOE},
    {"<" FW_BAR "hy_Assistant" FW_BAR ">",
     "<" FW_BAR "hy_place" LOW_LINE "holder" LOW_LINE "no" LOW_LINE "3" FW_BAR ">", NULL,
     KG_CHAT_TEMPLATE_HUNYUAN_DENSE},
    {"<|im_assistant|>assistant<|im_middle|>", NULL, NULL, KG_CHAT_TEMPLATE_KIMI_K2},
    {"<seed:bos>", NULL, NULL, KG_CHAT_TEMPLATE_SEED_OSS},
    {"'Assistant: '  + message['content'] + '<|separator|>", NULL, NULL, KG_CHAT_TEMPLATE_GROK_2},
    {"[unused9]\xe7\xb3\xbb\xe7\xbb\x9f\xef\xbc\x9a[unused10]", NULL, NULL,
     KG_CHAT_TEMPLATE_PANGU_EMBED}, /* "[unused9]系统：[unused10]" */
};

static bool rule_matches(const char *tmpl, const marker_rule_t *r) {
    return has(tmpl, r->a) && (!r->b || has(tmpl, r->b)) && (!r->c || has(tmpl, r->c));
}

static kg_chat_template_t refine_late(const char *tmpl, kg_chat_template_t t) {
    if (t == KG_CHAT_TEMPLATE_VICUNA && has(tmpl, "SYSTEM: ")) {
        return KG_CHAT_TEMPLATE_VICUNA_ORCA;
    }
    if (t == KG_CHAT_TEMPLATE_EXAONE_3 && has(tmpl, "[|tool|]")) {
        return KG_CHAT_TEMPLATE_EXAONE_4;
    }
    return t;
}

static kg_chat_template_t detect_early(const char *tmpl) {
    if (has(tmpl, "<|im_start|>")) {
        if (has(tmpl, "<|im_sep|>")) {
            return KG_CHAT_TEMPLATE_PHI_4;
        }
        // SmolVLM uses <|im_start|> as BOS, but its turns are not ChatML.
        return has(tmpl, "<end_of_utterance>") ? KG_CHAT_TEMPLATE_SMOLVLM : KG_CHAT_TEMPLATE_CHATML;
    }
    if (strncmp(tmpl, "mistral", 7) == 0 || has(tmpl, "[INST]")) {
        return detect_inst(tmpl);
    }
    if (has(tmpl, "<|assistant|>") && has(tmpl, "<|end|>")) {
        return KG_CHAT_TEMPLATE_PHI_3;
    }
    if (has(tmpl, "[gMASK]<sop>")) {
        return KG_CHAT_TEMPLATE_CHATGLM_4;
    }
    if (has(tmpl, "<|assistant|>") && has(tmpl, "<|user|>")) {
        return has(tmpl, "</s>") ? KG_CHAT_TEMPLATE_FALCON_3 : KG_CHAT_TEMPLATE_GLMEDGE;
    }
    if (has(tmpl, "<|{{ item['role'] }}|>") && has(tmpl, "<|begin_of_image|>")) {
        return KG_CHAT_TEMPLATE_GLMEDGE;
    }
    if (has(tmpl, "<|user|>") && has(tmpl, "<|endoftext|>")) {
        return KG_CHAT_TEMPLATE_ZEPHYR;
    }
    return KG_CHAT_TEMPLATE_UNKNOWN;
}

kg_chat_template_t kg_chat_detect(const char *template_text) {
    if (!template_text) {
        return KG_CHAT_TEMPLATE_UNKNOWN;
    }
    kg_chat_template_t t = detect_by_name(template_text);
    if (t != KG_CHAT_TEMPLATE_UNKNOWN) {
        return t;
    }
    t = detect_early(template_text);
    if (t != KG_CHAT_TEMPLATE_UNKNOWN) {
        return t;
    }
    for (size_t i = 0; i < sizeof(late_rules) / sizeof(late_rules[0]); i++) {
        if (rule_matches(template_text, &late_rules[i])) {
            return refine_late(template_text, late_rules[i].tmpl);
        }
    }
    return KG_CHAT_TEMPLATE_UNKNOWN;
}
