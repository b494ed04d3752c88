/* kg_chat_render: a conversation written in a chat template's format,
 * byte for byte as llama.cpp writes it (src/llama-chat.cpp). Every renderer
 * below mirrors one branch of llm_chat_apply_template; the comments name
 * the model family. Recognising the format is kg_chat.c. */
#include "kg_chat.h"
#include "kg_chat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- output buffer ----

typedef struct sbuf {
    char *p;
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed; later appends do nothing */
} sbuf_t;

static void sb_add(sbuf_t *sb, const char *s, size_t n) {
    if (sb->failed) {
        return;
    }
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 256;
        while (cap < sb->len + n + 1) {
            cap *= 2;
        }
        char *p = realloc(sb->p, cap);
        if (!p) {
            sb->failed = true;
            return;
        }
        sb->p = p;
        sb->cap = cap;
    }
    memcpy(sb->p + sb->len, s, n);
    sb->len += n;
    sb->p[sb->len] = '\0';
}

static void sb_puts(sbuf_t *sb, const char *s) {
    sb_add(sb, s, strlen(s));
}

/* The whitespace of C's isspace in the "C" locale (what std::isspace sees
 * in llama.cpp); bytes of multi-byte UTF-8 characters are never trimmed. */
static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* llama.cpp's trim(): strip ASCII whitespace at both ends. */
static void sb_trimmed(sbuf_t *sb, const char *s) {
    size_t start = 0;
    size_t end = strlen(s);
    while (start < end && is_space(s[start])) {
        start++;
    }
    while (end > start && is_space(s[end - 1])) {
        end--;
    }
    sb_add(sb, s + start, end - start);
}

static bool role_is(const kg_chat_message_t *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

// ---- renderers (one per llm_chat_apply_template branch) ----

typedef struct chat_in {
    const kg_chat_message_t *msgs;
    size_t n;
    bool add_ass; /* append the assistant generation prompt */
} chat_in_t;

static void render_chatml(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, "<|im_start|>");
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, "\n");
        sb_puts(sb, in->msgs[i].content);
        sb_puts(sb, "<|im_end|>\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|im_start|>assistant\n");
    }
}

/* Mistral v7 (Mistral Large 2411) and v7-tekken (Mistral Small 3.1). */
static void render_mistral_v7(sbuf_t *sb, const chat_in_t *in, bool tekken) {
    const char *sp = tekken ? "" : " ";
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, "[SYSTEM_PROMPT]");
            sb_puts(sb, sp);
            sb_puts(sb, m->content);
            sb_puts(sb, "[/SYSTEM_PROMPT]");
        } else if (role_is(m, "user")) {
            sb_puts(sb, "[INST]");
            sb_puts(sb, sp);
            sb_puts(sb, m->content);
            sb_puts(sb, "[/INST]");
        } else {
            sb_puts(sb, sp);
            sb_puts(sb, m->content);
            sb_puts(sb, "</s>");
        }
    }
}

/* Mistral's official v1, v3 and v3-tekken templates. */
static void render_mistral_v1_v3(sbuf_t *sb, const chat_in_t *in, kg_chat_template_t t) {
    const char *lead = t == KG_CHAT_TEMPLATE_MISTRAL_V1 ? " " : "";
    const char *trail = t == KG_CHAT_TEMPLATE_MISTRAL_V3_TEKKEN ? "" : " ";
    bool trim_assistant = t == KG_CHAT_TEMPLATE_MISTRAL_V3;
    bool inside_turn = false;
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (!inside_turn) {
            sb_puts(sb, lead);
            sb_puts(sb, "[INST]");
            sb_puts(sb, trail);
            inside_turn = true;
        }
        if (role_is(m, "system")) {
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\n");
        } else if (role_is(m, "user")) {
            sb_puts(sb, m->content);
            sb_puts(sb, lead);
            sb_puts(sb, "[/INST]");
        } else {
            sb_puts(sb, trail);
            if (trim_assistant) {
                sb_trimmed(sb, m->content);
            } else {
                sb_puts(sb, m->content);
            }
            sb_puts(sb, "</s>");
            inside_turn = false;
        }
    }
}

/* Llama 2 and the variants llama.cpp tells apart. */
static void render_llama2(sbuf_t *sb, const chat_in_t *in, kg_chat_template_t t) {
    bool system_ok = t != KG_CHAT_TEMPLATE_LLAMA_2;
    bool bos_inside = t == KG_CHAT_TEMPLATE_LLAMA_2_SYS_BOS;
    bool strip = t == KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP;
    bool inside_turn = true; // the first [INST] goes without BOS
    sb_puts(sb, "[INST] ");
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (!inside_turn) {
            inside_turn = true;
            sb_puts(sb, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (role_is(m, "system") && system_ok) {
            sb_puts(sb, "<<SYS>>\n");
        }
        if (strip) {
            sb_trimmed(sb, m->content);
        } else {
            sb_puts(sb, m->content);
        }
        if (role_is(m, "system")) {
            // Without <<SYS>> the system text still leads the first message.
            sb_puts(sb, system_ok ? "\n<</SYS>>\n\n" : "\n");
        } else if (role_is(m, "user")) {
            sb_puts(sb, " [/INST]");
        } else {
            sb_puts(sb, "</s>");
            inside_turn = false;
        }
    }
}

/* Phi-3, Falcon 3, Zephyr, GLM-Edge, ChatGLM 4: "<|role|>\n" + content + tail. */
static void render_role_bars(sbuf_t *sb,
                             const chat_in_t *in,
                             const char *after_role,
                             const char *tail,
                             const char *gen_prompt) {
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, "<|");
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, "|>");
        sb_puts(sb, after_role);
        sb_puts(sb, in->msgs[i].content);
        sb_puts(sb, tail);
    }
    if (in->add_ass) {
        sb_puts(sb, gen_prompt);
    }
}

static void render_phi4(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, "<|im_start|>");
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, "<|im_sep|>");
        sb_puts(sb, in->msgs[i].content);
        sb_puts(sb, "<|im_end|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|im_start|>assistant<|im_sep|>");
    }
}

/* mlabonne/AlphaMonarch-7B: BOS inside the history, not before the first turn. */
static void render_monarch(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, i == 0 ? "" : "<s>");
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, "\n");
        sb_puts(sb, in->msgs[i].content);
        sb_puts(sb, "</s>\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "<s>assistant\n");
    }
}

/* google/gemma-7b-it: no system role; system text joins the next user turn. */
static void render_gemma(sbuf_t *sb, const chat_in_t *in) {
    sbuf_t sys = {0};
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_trimmed(&sys, m->content);
            continue;
        }
        const char *role = role_is(m, "assistant") ? "model" : m->role;
        sb_puts(sb, "<start_of_turn>");
        sb_puts(sb, role);
        sb_puts(sb, "\n");
        if (sys.len > 0 && strcmp(role, "model") != 0) {
            sb_add(sb, sys.p, sys.len);
            sb_puts(sb, "\n\n");
            sys.len = 0;
        }
        sb_trimmed(sb, m->content);
        sb_puts(sb, "<end_of_turn>\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "<start_of_turn>model\n");
    }
    sb->failed = sb->failed || sys.failed;
    free(sys.p);
}

/* OrionStarAI/Orion-14B-Chat: system text joins the next user turn. */
static void render_orion(sbuf_t *sb, const chat_in_t *in) {
    sbuf_t sys = {0};
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(&sys, m->content);
        } else if (role_is(m, "user")) {
            sb_puts(sb, "Human: ");
            if (sys.len > 0) {
                sb_add(sb, sys.p, sys.len);
                sb_puts(sb, "\n\n");
                sys.len = 0;
            }
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\nAssistant: </s>");
        } else {
            sb_puts(sb, m->content);
            sb_puts(sb, "</s>");
        }
    }
    sb->failed = sb->failed || sys.failed;
    free(sys.p);
}

/* openchat/openchat-3.5-0106 */
static void render_openchat(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (!role_is(m, "system")) {
            char first = m->role[0];
            sb_puts(sb, "GPT4 Correct ");
            if (first >= 'a' && first <= 'z') {
                first = (char)(first - 'a' + 'A');
            }
            sb_add(sb, &first, m->role[0] ? 1 : 0);
            sb_puts(sb, m->role[0] ? m->role + 1 : "");
            sb_puts(sb, ": ");
        }
        sb_puts(sb, m->content);
        sb_puts(sb, "<|end_of_turn|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "GPT4 Correct Assistant:");
    }
}

/* eachadea/vicuna-13b-1.1 and the Orca-Vicuna variant. */
static void render_vicuna(sbuf_t *sb, const chat_in_t *in, bool orca) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, orca ? "SYSTEM: " : "");
            sb_puts(sb, m->content);
            sb_puts(sb, orca ? "\n" : "\n\n");
        } else if (role_is(m, "user")) {
            sb_puts(sb, "USER: ");
            sb_puts(sb, m->content);
            sb_puts(sb, "\n");
        } else if (role_is(m, "assistant")) {
            sb_puts(sb, "ASSISTANT: ");
            sb_puts(sb, m->content);
            sb_puts(sb, "</s>\n");
        }
    }
    if (in->add_ass) {
        sb_puts(sb, "ASSISTANT:");
    }
}

/* deepseek-ai/deepseek-coder-33b-instruct */
static void render_deepseek(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, m->content);
        } else if (role_is(m, "user")) {
            sb_puts(sb, "### Instruction:\n");
            sb_puts(sb, m->content);
            sb_puts(sb, "\n");
        } else if (role_is(m, "assistant")) {
            sb_puts(sb, "### Response:\n");
            sb_puts(sb, m->content);
            sb_puts(sb, "\n<|EOT|>\n");
        }
    }
    if (in->add_ass) {
        sb_puts(sb, "### Response:\n");
    }
}

/* DeepSeek-V2 */
static void render_deepseek2(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\n");
        } else if (role_is(m, "user")) {
            sb_puts(sb, "User: ");
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\n");
        } else if (role_is(m, "assistant")) {
            sb_puts(sb, "Assistant: ");
            sb_puts(sb, m->content);
            sb_puts(sb, EOS_DEEPSEEK);
        }
    }
    if (in->add_ass) {
        sb_puts(sb, "Assistant:");
    }
}

/* DeepSeek-V3: "<｜User｜>" / "<｜Assistant｜>" turns. */
static void render_deepseek3(sbuf_t *sb, const chat_in_t *in) {
    static const char user[] = "<" FW_BAR "User" FW_BAR ">";
    static const char assistant[] = "<" FW_BAR "Assistant" FW_BAR ">";
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\n");
        } else if (role_is(m, "user")) {
            sb_puts(sb, user);
            sb_puts(sb, m->content);
        } else if (role_is(m, "assistant")) {
            sb_puts(sb, assistant);
            sb_puts(sb, m->content);
            sb_puts(sb, EOS_DEEPSEEK);
        }
    }
    if (in->add_ass) {
        sb_puts(sb, assistant);
    }
}

/* CohereForAI/c4ai-command-r-plus */
static void render_command_r(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        const char *tok = role_is(m, "system")      ? "<|SYSTEM_TOKEN|>"
                          : role_is(m, "user")      ? "<|USER_TOKEN|>"
                          : role_is(m, "assistant") ? "<|CHATBOT_TOKEN|>"
                                                    : NULL;
        if (!tok) {
            continue;
        }
        sb_puts(sb, "<|START_OF_TURN_TOKEN|>");
        sb_puts(sb, tok);
        sb_trimmed(sb, m->content);
        sb_puts(sb, "<|END_OF_TURN_TOKEN|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
    }
}

/* Llama 3 and Llama 4: header-wrapped roles, trimmed content. */
static void render_llama3(sbuf_t *sb, const chat_in_t *in, bool llama4) {
    const char *hs = llama4 ? "<|header_start|>" : "<|start_header_id|>";
    const char *he = llama4 ? "<|header_end|>\n\n" : "<|end_header_id|>\n\n";
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, hs);
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, he);
        sb_trimmed(sb, in->msgs[i].content);
        sb_puts(sb, llama4 ? "<|eot|>" : "<|eot_id|>");
    }
    if (in->add_ass) {
        sb_puts(sb, hs);
        sb_puts(sb, "assistant");
        sb_puts(sb, he);
    }
}

/* MiniCPM-3B-OpenHermes-2.5-v2: "<用户>" user turns, no generation prompt. */
static void render_minicpm(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        bool user = role_is(m, "user");
        sb_puts(sb, user ? USER_CN : "");
        sb_trimmed(sb, m->content);
        sb_puts(sb, user ? "<AI>" : "");
    }
}

/* EXAONE 3 and 4: "[|role|]" turns with trimmed content. */
static void render_exaone(sbuf_t *sb, const chat_in_t *in, bool v4) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        bool user = role_is(m, "user");
        if (!user && !role_is(m, "system") && !role_is(m, "assistant") &&
            !(v4 && role_is(m, "tool"))) {
            continue;
        }
        sb_puts(sb, "[|");
        sb_puts(sb, m->role);
        sb_puts(sb, "|]");
        sb_trimmed(sb, m->content);
        sb_puts(sb, user ? "\n" : "[|endofturn|]\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "[|assistant|]");
    }
}

/* IBM Granite 3.x */
static void render_granite(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        sb_puts(sb, "<|start_of_role|>");
        sb_puts(sb, m->role);
        sb_puts(sb, "<|end_of_role|>");
        if (role_is(m, "assistant_tool_call")) {
            sb_puts(sb, "<|tool_call|>");
        }
        sb_puts(sb, m->content);
        sb_puts(sb, "<|end_of_text|>\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|start_of_role|>assistant<|end_of_role|>");
    }
}

/* Infinigence/Megrez-3B-Instruct */
static void render_megrez(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        sb_puts(sb, "<|role_start|>");
        sb_puts(sb, in->msgs[i].role);
        sb_puts(sb, "<|role_end|>");
        sb_puts(sb, in->msgs[i].content);
        sb_puts(sb, "<|turn_end|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|role_start|>assistant<|role_end|>");
    }
}

/* inclusionAI Ling/Ring (Bailing, Bailing-think) and Ling 2.0 (Bailing2):
 * upper-cased roles, user becomes HUMAN. */
static void render_bailing(sbuf_t *sb, const chat_in_t *in, kg_chat_template_t t) {
    bool v2 = t == KG_CHAT_TEMPLATE_BAILING2;
    if (v2 && (in->n == 0 || !role_is(&in->msgs[0], "system"))) {
        sb_puts(sb, "<role>SYSTEM</role>detailed thinking off<|role_end|>");
    }
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        sb_puts(sb, "<role>");
        if (role_is(m, "user")) {
            sb_puts(sb, "HUMAN");
        } else {
            for (const char *c = m->role; *c; c++) {
                char u = (*c >= 'a' && *c <= 'z') ? (char)(*c - 'a' + 'A') : *c;
                sb_add(sb, &u, 1);
            }
        }
        sb_puts(sb, "</role>");
        sb_puts(sb, m->content);
        sb_puts(sb, v2 ? "<|role_end|>" : "");
    }
    if (in->add_ass) {
        sb_puts(sb, "<role>ASSISTANT</role>");
        sb_puts(sb, t == KG_CHAT_TEMPLATE_BAILING_THINK ? "<think>" : "");
    }
}

/* dots.llm1.inst */
static void render_dots1(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        bool sys = role_is(m, "system");
        bool user = role_is(m, "user");
        sb_puts(sb, sys ? "<|system|>" : user ? "<|userprompt|>" : "<|response|>");
        sb_puts(sb, m->content);
        sb_puts(sb, sys ? "<|endofsystem|>" : user ? "<|endofuserprompt|>" : "<|endofresponse|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|response|>");
    }
}

/* gpt-oss (OpenAI MoE, Harmony format without channels). */
static void render_gpt_oss(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        sb_puts(sb, "<|start|>");
        sb_puts(sb, m->role);
        sb_puts(sb, "<|message|>");
        sb_puts(sb, m->content);
        sb_puts(sb, role_is(m, "assistant") ? "<|return|>" : "<|end|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|start|>assistant");
    }
}

/* moonshotai/Kimi-K2-Instruct */
static void render_kimi_k2(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        sb_puts(sb, role_is(m, "system")      ? "<|im_system|>system<|im_middle|>"
                    : role_is(m, "user")      ? "<|im_user|>user<|im_middle|>"
                    : role_is(m, "assistant") ? "<|im_assistant|>assistant<|im_middle|>"
                    : role_is(m, "tool")      ? "<|im_system|>tool<|im_middle|>"
                                              : "");
        sb_puts(sb, m->content);
        sb_puts(sb, "<|im_end|>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<|im_assistant|>assistant<|im_middle|>");
    }
}

/* ByteDance-Seed/Seed-OSS: assistant turns trimmed. */
static void render_seed_oss(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        sb_puts(sb, "<seed:bos>");
        sb_puts(sb, m->role);
        sb_puts(sb, "\n");
        if (role_is(m, "assistant")) {
            sb_trimmed(sb, m->content);
        } else {
            sb_puts(sb, m->content);
        }
        sb_puts(sb, "<seed:eos>");
    }
    if (in->add_ass) {
        sb_puts(sb, "<seed:bos>assistant\n");
    }
}

/* xai-org/grok-2: system and user trimmed, assistant as given. */
static void render_grok2(sbuf_t *sb, const chat_in_t *in) {
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "assistant")) {
            sb_puts(sb, "Assistant: ");
            sb_puts(sb, m->content);
        } else if (role_is(m, "system") || role_is(m, "user")) {
            sb_puts(sb, role_is(m, "system") ? "System: " : "Human: ");
            sb_trimmed(sb, m->content);
        } else {
            continue;
        }
        sb_puts(sb, "<|separator|>\n\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "Assistant:");
    }
}

/* SmolVLM: <|im_start|> is only its BOS; turns are "User:" / "Assistant:". */
static void render_smolvlm(sbuf_t *sb, const chat_in_t *in) {
    sb_puts(sb, "<|im_start|>");
    for (size_t i = 0; i < in->n; i++) {
        const kg_chat_message_t *m = &in->msgs[i];
        if (role_is(m, "system")) {
            sb_puts(sb, m->content);
            sb_puts(sb, "\n\n");
            continue;
        }
        sb_puts(sb, role_is(m, "user") ? "User: " : "Assistant: ");
        sb_puts(sb, m->content);
        sb_puts(sb, "<end_of_utterance>\n");
    }
    if (in->add_ass) {
        sb_puts(sb, "Assistant:");
    }
}

/* ChatGLM 3: "[gMASK]sop", then "<|role|>\n " + content. */
static void render_chatglm3(sbuf_t *sb, const chat_in_t *in) {
    sb_puts(sb, "[gMASK]sop");
    render_role_bars(sb, in, "\n ", "", "<|assistant|>");
}

static void render_chatglm4(sbuf_t *sb, const chat_in_t *in) {
    sb_puts(sb, "[gMASK]<sop>");
    render_role_bars(sb, in, "\n", "", "<|assistant|>\n");
}

/* Returns false when kgen has no renderer for the format. */
static bool render_more(sbuf_t *sb, const chat_in_t *in, kg_chat_template_t t) {
    switch (t) {
    case KG_CHAT_TEMPLATE_COMMAND_R:
        render_command_r(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_LLAMA_3:
    case KG_CHAT_TEMPLATE_LLAMA4:
        render_llama3(sb, in, t == KG_CHAT_TEMPLATE_LLAMA4);
        return true;
    case KG_CHAT_TEMPLATE_CHATGLM_3:
        render_chatglm3(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_CHATGLM_4:
        render_chatglm4(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_GLMEDGE:
        render_role_bars(sb, in, "\n", "", "<|assistant|>");
        return true;
    case KG_CHAT_TEMPLATE_MINICPM:
        render_minicpm(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_EXAONE_3:
    case KG_CHAT_TEMPLATE_EXAONE_4:
        render_exaone(sb, in, t == KG_CHAT_TEMPLATE_EXAONE_4);
        return true;
    case KG_CHAT_TEMPLATE_GRANITE:
        render_granite(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_MEGREZ:
        render_megrez(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_BAILING:
    case KG_CHAT_TEMPLATE_BAILING_THINK:
    case KG_CHAT_TEMPLATE_BAILING2:
        render_bailing(sb, in, t);
        return true;
    case KG_CHAT_TEMPLATE_DOTS1:
        render_dots1(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_OPENAI_MOE:
        render_gpt_oss(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_KIMI_K2:
        render_kimi_k2(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_SEED_OSS:
        render_seed_oss(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_GROK_2:
        render_grok2(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_SMOLVLM:
        render_smolvlm(sb, in);
        return true;
    default:
        return false;
    }
}

static bool render_any(sbuf_t *sb, const chat_in_t *in, kg_chat_template_t t) {
    switch (t) {
    case KG_CHAT_TEMPLATE_CHATML:
        render_chatml(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_MISTRAL_V7:
    case KG_CHAT_TEMPLATE_MISTRAL_V7_TEKKEN:
        render_mistral_v7(sb, in, t == KG_CHAT_TEMPLATE_MISTRAL_V7_TEKKEN);
        return true;
    case KG_CHAT_TEMPLATE_MISTRAL_V1:
    case KG_CHAT_TEMPLATE_MISTRAL_V3:
    case KG_CHAT_TEMPLATE_MISTRAL_V3_TEKKEN:
        render_mistral_v1_v3(sb, in, t);
        return true;
    case KG_CHAT_TEMPLATE_LLAMA_2:
    case KG_CHAT_TEMPLATE_LLAMA_2_SYS:
    case KG_CHAT_TEMPLATE_LLAMA_2_SYS_BOS:
    case KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP:
        render_llama2(sb, in, t);
        return true;
    case KG_CHAT_TEMPLATE_PHI_3:
        render_role_bars(sb, in, "\n", "<|end|>\n", "<|assistant|>\n");
        return true;
    case KG_CHAT_TEMPLATE_PHI_4:
        render_phi4(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_FALCON_3:
        render_role_bars(sb, in, "\n", "\n", "<|assistant|>\n");
        return true;
    case KG_CHAT_TEMPLATE_ZEPHYR:
        render_role_bars(sb, in, "\n", "<|endoftext|>\n", "<|assistant|>\n");
        return true;
    case KG_CHAT_TEMPLATE_MONARCH:
        render_monarch(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_GEMMA:
        render_gemma(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_ORION:
        render_orion(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_OPENCHAT:
        render_openchat(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_VICUNA:
    case KG_CHAT_TEMPLATE_VICUNA_ORCA:
        render_vicuna(sb, in, t == KG_CHAT_TEMPLATE_VICUNA_ORCA);
        return true;
    case KG_CHAT_TEMPLATE_DEEPSEEK:
        render_deepseek(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_DEEPSEEK_2:
        render_deepseek2(sb, in);
        return true;
    case KG_CHAT_TEMPLATE_DEEPSEEK_3:
        render_deepseek3(sb, in);
        return true;
    default:
        return render_more(sb, in, t);
    }
}

bool kg_chat_template_is_supported(kg_chat_template_t tmpl) {
    switch (tmpl) {
    case KG_CHAT_TEMPLATE_UNKNOWN:
    case KG_CHAT_TEMPLATE_RWKV_WORLD:
    case KG_CHAT_TEMPLATE_GIGACHAT:
    case KG_CHAT_TEMPLATE_YANDEX:
    case KG_CHAT_TEMPLATE_HUNYUAN_MOE:
    case KG_CHAT_TEMPLATE_HUNYUAN_DENSE:
    case KG_CHAT_TEMPLATE_PANGU_EMBED:
    case KG_CHAT_TEMPLATE_COUNT_:
        return false;
    default:
        return (int)tmpl > 0 && tmpl < KG_CHAT_TEMPLATE_COUNT_;
    }
}

// ---- entry points ----

kg_status_t kg_chat_render_template(kg_chat_template_t tmpl,
                                    const kg_chat_message_t *msgs,
                                    size_t n,
                                    bool add_generation_prompt,
                                    char **out,
                                    char *errstr,
                                    size_t errstr_size) {
    kg_status_t st = KG_OK;
    sbuf_t sb = {0};
    chat_in_t in = {.msgs = msgs, .n = n, .add_ass = add_generation_prompt};
    *out = NULL;
    if (!kg_chat_template_is_supported(tmpl)) {
        snprintf(errstr, errstr_size, "chat template %s is not supported",
                 tmpl == KG_CHAT_TEMPLATE_UNKNOWN ? "(unrecognised)" : kg_chat_template_name(tmpl));
        st = KG_ERR_UNSUPPORTED;
        goto fail;
    }
    sb_add(&sb, "", 0); // an empty conversation still yields a string
    if (!render_any(&sb, &in, tmpl)) {
        snprintf(errstr, errstr_size, "chat template %s is not supported",
                 kg_chat_template_name(tmpl));
        st = KG_ERR_UNSUPPORTED;
        goto fail;
    }
    if (sb.failed) {
        snprintf(errstr, errstr_size, "out of memory rendering the chat template");
        st = KG_ERR_NOMEM;
        goto fail;
    }
    *out = sb.p;
    return KG_OK;
fail:
    free(sb.p);
    return st;
}

kg_status_t kg_chat_render(const char *template_text,
                           const kg_chat_message_t *msgs,
                           size_t n,
                           bool add_generation_prompt,
                           const char *bos_text,
                           const char *eos_text,
                           char **out,
                           char *errstr,
                           size_t errstr_size) {
    (void)bos_text; // see the header: the rendered formats write their tokens literally
    (void)eos_text;
    *out = NULL;
    if (!template_text) {
        snprintf(errstr, errstr_size, "the model has no chat template");
        return KG_ERR_UNSUPPORTED;
    }
    return kg_chat_render_template(kg_chat_detect(template_text), msgs, n, add_generation_prompt,
                                   out, errstr, errstr_size);
}
