/* check_chat: chat templates are recognised and rendered as llama.cpp's
 * built-in renderer does (src/llama-chat.cpp). The conversation and most
 * expected strings are those of llama.cpp's tests/test-chat-template.cpp;
 * formats it has no case for are written out from llm_chat_apply_template. */
#include "check_common.h"
#include "model/kg_mkmodel.h"
#include "schema/kg_chat.h"

#include <stdio.h>
#include <string.h>

static const kg_chat_message_t conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV (sizeof(conv) / sizeof(conv[0]))

typedef struct chat_case {
    const char *name;     /* llama.cpp's name of the format the text must map to */
    const char *tmpl;     /* template text (marker snippets) or a name */
    const char *expected; /* rendering of conv with the generation prompt */
} chat_case_t;

#define FW     "\xef\xbd\x9c"
#define EOS_DS "<" FW "end\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"

static const chat_case_t cases[] = {
    {"chatml",
     "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
     "'<|im_end|>' + '\\n'}}{% endfor %}",
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>"
     "\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
     "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
     "question<|im_end|>\n<|im_start|>assistant\n"},
    {"llama2",
     "{{ bos_token }}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}",
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I "
     "am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys", "{{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who "
     "are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys-bos",
     "{{- bos_token + '[INST] ' + m['content'] + ' [/INST]' -}}{{- '[INST] <<SYS>>\\n' -}}",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] "
     "Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
    {"llama2-sys-strip", "{{ '[INST] ' + content.strip() + ' [/INST]' }}<<SYS>>",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who "
     "are you [/INST]I am an assistant</s>[INST] Another question [/INST]"},
    {"mistral-v1", "{{- ' [INST] ' + system_message + '\\n\\n' + m['content'] + ' [/INST]' }}",
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]"
     "    I am an assistant   </s> [INST] Another question [/INST]"},
    {"mistral-v3",
     "{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + m[\"content\"] + \"[/INST]\" }}",
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I "
     "am an assistant</s>[INST] Another question[/INST]"},
    {"mistral-v3-tekken",
     "{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + m[\"content\"] + \"[/INST]\" }}",
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am "
     "an assistant   </s>[INST]Another question[/INST]"},
    {"mistral-v7",
     "{{ '[SYSTEM_PROMPT] ' + c + '[/SYSTEM_PROMPT]' }}{{ '[INST] ' + c + '[/INST]' }}",
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>"
     "[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
    {"mistral-v7-tekken", "mistral-v7-tekken",
     "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
     "[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"phi3", "{{'<|user|>' + '\\n' + c + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}",
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi "
     "there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n"
     "<|user|>\nAnother question<|end|>\n<|assistant|>\n"},
    {"phi4", "{{'<|im_start|>user<|im_sep|>' + c + '<|im_end|>'}}",
     "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>"
     "Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>"
     "Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|>"
     "<|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>"},
    {"falcon3", "{{ '<|user|>\\n' + c }}{{ '<|assistant|>\\n' + c + '</s>' }}",
     "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\n"
     "Who are you\n<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n"
     "<|assistant|>\n"},
    {"zephyr", "{{ '<|user|>\\n' + c + '<|endoftext|>' }}",
     "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n"
     "<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n"
     "   I am an assistant   <|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n"
     "<|assistant|>\n"},
    {"monarch", "{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}",
     "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n"
     "<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother "
     "question</s>\n<s>assistant\n"},
    {"gemma",
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>' }}",
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model"
     "\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model"
     "\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
     "<start_of_turn>model\n"},
    {"orion", "{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}",
     "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you"
     "\n\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"},
    {"openchat", "{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] }}",
     "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 "
     "Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 "
     "Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another "
     "question<|end_of_turn|>GPT4 Correct Assistant:"},
    {"vicuna", "{{-'USER: ' + c + '\\n'-}}{{-'ASSISTANT: ' + c + '</s>\\n' -}}",
     "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
     "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"vicuna-orca", "{{-'SYSTEM: ' + c -}}{{-'USER: ' + c + '\\n'-}}{{-'ASSISTANT: ' + c -}}",
     "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you"
     "\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"deepseek",
     "{{'### Instruction:\\n' + c + '\\n'}}{{'### Response:\\n' + c + '\\n<|EOT|>\\n'}}",
     "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### "
     "Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### "
     "Instruction:\nAnother question\n### Response:\n"},
    {"command-r", "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() }}",
     "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
     "<|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are "
     "you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant"
     "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question"
     "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"llama3",
     "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
     "message['content'] | trim + '<|eot_id|>' %}",
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
     "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
     "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>"
     "assistant<|end_header_id|>\n\n"},
    {"chatglm3", "{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\\n {{ c }}{% endif %}",
     "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there"
     "<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question"
     "<|assistant|>"},
    {"chatglm4", "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>{% endfor %}",
     "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there"
     "<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question"
     "<|assistant|>\n"},
    {"glmedge", "{% if r == 'user' %}<|user|>\\n{{ c }}{% endif %}<|assistant|>",
     "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho "
     "are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"},
    {"minicpm", "{{'<\xe7\x94\xa8\xe6\x88\xb7>' + message['content'].strip() + '<AI>'}}",
     "You are a helpful assistant<\xe7\x94\xa8\xe6\x88\xb7>Hello<AI>Hi there<\xe7\x94\xa8\xe6\x88"
     "\xb7>Who are you<AI>I am an assistant<\xe7\x94\xa8\xe6\x88\xb7>Another question<AI>"},
    {"deepseek2", "{{ 'Assistant: ' + message['content'] + eos_token }}",
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there" EOS_DS "User: Who are you"
     "\n\nAssistant:    I am an assistant   " EOS_DS "User: Another question\n\nAssistant:"},
    {"deepseek3", "<" FW "User" FW "><" FW "Assistant" FW ">" EOS_DS,
     "You are a helpful assistant\n\n<" FW "User" FW ">Hello<" FW "Assistant" FW ">Hi there" EOS_DS
     "<" FW "User" FW ">Who are you<" FW "Assistant" FW ">   I am an assistant   " EOS_DS "<" FW
     "User" FW ">Another question<" FW "Assistant" FW ">"},
    {"exaone3", "[|system|] [|assistant|] [|endofturn|]",
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there"
     "[|endofturn|]\n[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]"
     "Another question\n[|assistant|]"},
    {"exaone4", "[|system|] [|assistant|] [|endofturn|] [|tool|]",
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there"
     "[|endofturn|]\n[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]"
     "Another question\n[|assistant|]"},
    {"granite", "{{- '<|start_of_role|>user<|end_of_role|>' + c + '<|end_of_text|>\\n' }}",
     "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n"
     "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant"
     "<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you"
     "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   "
     "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n"
     "<|start_of_role|>assistant<|end_of_role|>"},
    {"megrez", "{{ '<|role_start|>' + message['role'] + '<|role_end|>' }}",
     "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user"
     "<|role_end|>Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|>"
     "<|role_start|>user<|role_end|>Who are you<|turn_end|><|role_start|>assistant<|role_end|>   I "
     "am an assistant   <|turn_end|><|role_start|>user<|role_end|>Another question<|turn_end|>"
     "<|role_start|>assistant<|role_end|>"},
    {"bailing", "{% set role = 'HUMAN' %}{{ '<role>ASSISTANT</role>' }}",
     "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>"
     "Hi there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   "
     "<role>HUMAN</role>Another question<role>ASSISTANT</role>"},
    {"bailing-think", "{% set role = \"HUMAN\" %}{{ '<role>ASSISTANT</role>' + '<think>' }}",
     "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>"
     "Hi there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   "
     "<role>HUMAN</role>Another question<role>ASSISTANT</role><think>"},
    {"bailing2", "<role>HUMAN</role>{{ c }}<|role_end|><role>ASSISTANT</role>",
     "<role>SYSTEM</role>You are a helpful assistant<|role_end|><role>HUMAN</role>Hello"
     "<|role_end|><role>ASSISTANT</role>Hi there<|role_end|><role>HUMAN</role>Who are you"
     "<|role_end|><role>ASSISTANT</role>   I am an assistant   <|role_end|><role>HUMAN</role>"
     "Another question<|role_end|><role>ASSISTANT</role>"},
    {"llama4", "{{ '<|header_start|>' + role + '<|header_end|>\\n\\n' }}",
     "<|header_start|>system<|header_end|>\n\nYou are a helpful assistant<|eot|><|header_start|>"
     "user<|header_end|>\n\nHello<|eot|><|header_start|>assistant<|header_end|>\n\nHi there<|eot|>"
     "<|header_start|>user<|header_end|>\n\nWho are you<|eot|><|header_start|>assistant"
     "<|header_end|>\n\nI am an assistant<|eot|><|header_start|>user<|header_end|>\n\nAnother "
     "question<|eot|><|header_start|>assistant<|header_end|>\n\n"},
    {"smolvlm", "<|im_start|>{{ 'User: ' + c + '<end_of_utterance>\\n' }}",
     "<|im_start|>You are a helpful assistant\n\nUser: Hello<end_of_utterance>\nAssistant: Hi there"
     "<end_of_utterance>\nUser: Who are you<end_of_utterance>\nAssistant:    I am an assistant   "
     "<end_of_utterance>\nUser: Another question<end_of_utterance>\nAssistant:"},
    {"dots1", "<|userprompt|>{{ c }}<|endofuserprompt|>",
     "<|system|>You are a helpful assistant<|endofsystem|><|userprompt|>Hello<|endofuserprompt|>"
     "<|response|>Hi there<|endofresponse|><|userprompt|>Who are you<|endofuserprompt|>"
     "<|response|>   I am an assistant   <|endofresponse|><|userprompt|>Another question"
     "<|endofuserprompt|><|response|>"},
    {"gpt-oss", "<|start|>{{ role }}<|channel|>final<|message|>",
     "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello"
     "<|end|><|start|>assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you"
     "<|end|><|start|>assistant<|message|>   I am an assistant   <|return|><|start|>user"
     "<|message|>Another question<|end|><|start|>assistant"},
    {"kimi-k2", "{{'<|im_assistant|>assistant<|im_middle|>'}}",
     "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user"
     "<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>Hi there<|im_end|>"
     "<|im_user|>user<|im_middle|>Who are you<|im_end|><|im_assistant|>assistant<|im_middle|>   I "
     "am an assistant   <|im_end|><|im_user|>user<|im_middle|>Another question<|im_end|>"
     "<|im_assistant|>assistant<|im_middle|>"},
    {"seed_oss", "{# <seed:bos> #}{{ bos_token + message.role + \"\\n\" }}",
     "<seed:bos>system\nYou are a helpful assistant<seed:eos><seed:bos>user\nHello<seed:eos>"
     "<seed:bos>assistant\nHi there<seed:eos><seed:bos>user\nWho are you<seed:eos><seed:bos>"
     "assistant\nI am an assistant<seed:eos><seed:bos>user\nAnother question<seed:eos><seed:bos>"
     "assistant\n"},
    {"grok-2", "{{ 'Assistant: '  + message['content'] + '<|separator|>\\n\\n' }}",
     "System: You are a helpful assistant<|separator|>\n\nHuman: Hello<|separator|>\n\nAssistant: "
     "Hi there<|separator|>\n\nHuman: Who are you<|separator|>\n\nAssistant:    I am an assistant"
     "   <|separator|>\n\nHuman: Another question<|separator|>\n\nAssistant:"},
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static char *
render(const char *tmpl, const kg_chat_message_t *msgs, size_t n, bool add_ass, kg_status_t *st) {
    char err[128] = "";
    char *out = NULL;
    *st = kg_chat_render(tmpl, msgs, n, add_ass, "<s>", "</s>", &out, err, sizeof(err));
    return out;
}

START_TEST(detect_each_format) {
    const chat_case_t *c = &cases[_i];
    kg_chat_template_t t = kg_chat_detect(c->tmpl);
    ck_assert_msg(strcmp(kg_chat_template_name(t), c->name) == 0, "%s detected as %s", c->name,
                  kg_chat_template_name(t));
    ck_assert(kg_chat_template_is_supported(t));
    // Every name is also accepted as the template text itself, as llama.cpp
    // does (dots1 has no name in llama.cpp's table).
    if (t != KG_CHAT_TEMPLATE_DOTS1) {
        ck_assert_int_eq(kg_chat_detect(c->name), t);
    }
}
END_TEST

START_TEST(render_each_format) {
    const chat_case_t *c = &cases[_i];
    kg_status_t st;
    char *out = render(c->tmpl, conv, N_CONV, true, &st);
    ck_assert_msg(st == KG_OK, "%s: status %d", c->name, st);
    ck_assert_msg(strcmp(out, c->expected) == 0, "%s:\n got: [%s]\nwant: [%s]", c->name, out,
                  c->expected);
    free(out);
}
END_TEST

START_TEST(detection_order) {
    // ChatML's marker wins over everything after it.
    ck_assert_int_eq(kg_chat_detect("<|im_start|> [INST] <|start_header_id|><|end_header_id|>"),
                     KG_CHAT_TEMPLATE_CHATML);
    ck_assert_int_eq(kg_chat_detect("<|im_start|>x<|im_sep|>"), KG_CHAT_TEMPLATE_PHI_4);
    ck_assert_int_eq(kg_chat_detect("<|im_start|><end_of_utterance>"), KG_CHAT_TEMPLATE_SMOLVLM);
    // Phi-3 before the <|user|>/<|assistant|> families.
    ck_assert_int_eq(kg_chat_detect("<|user|><|assistant|><|end|></s>"), KG_CHAT_TEMPLATE_PHI_3);
    ck_assert_int_eq(kg_chat_detect("<|user|><|assistant|>"), KG_CHAT_TEMPLATE_GLMEDGE);
    // A Zephyr text with <|assistant|> literally in it is Falcon 3 or GLM-Edge to llama.cpp.
    ck_assert_int_eq(kg_chat_detect("<|user|><|endoftext|><|assistant|></s>"),
                     KG_CHAT_TEMPLATE_FALCON_3);
    // A template text starting with "mistral" takes the [INST] branch.
    ck_assert_int_eq(kg_chat_detect("mistral-something"), KG_CHAT_TEMPLATE_LLAMA_2);
    ck_assert_int_eq(kg_chat_detect("Xmistral"), KG_CHAT_TEMPLATE_UNKNOWN);
    // Strip beats BOS-in-history beats <<SYS>>.
    ck_assert_int_eq(kg_chat_detect("[INST] <<SYS>> bos_token + '[INST] content.strip()"),
                     KG_CHAT_TEMPLATE_LLAMA_2_SYS_STRIP);
    // Gemma's marker comes after Monarch's.
    ck_assert_int_eq(kg_chat_detect("<start_of_turn> bos_token + message['role']"),
                     KG_CHAT_TEMPLATE_MONARCH);
}
END_TEST

START_TEST(unsupported_templates) {
    kg_status_t st;
    char err[128] = "";
    char *out = (char *)"untouched";
    st = kg_chat_render(NULL, conv, N_CONV, true, NULL, NULL, &out, err, sizeof(err));
    ck_assert_int_eq(st, KG_ERR_UNSUPPORTED);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(err, "no chat template"));
    // Unknown text: no ChatML fallback.
    ck_assert_int_eq(kg_chat_detect(""), KG_CHAT_TEMPLATE_UNKNOWN);
    ck_assert_int_eq(kg_chat_detect(NULL), KG_CHAT_TEMPLATE_UNKNOWN);
    out = render("{% for m in messages %}{{ m.content }}{% endfor %}", conv, N_CONV, true, &st);
    ck_assert_int_eq(st, KG_ERR_UNSUPPORTED);
    ck_assert_ptr_null(out);
    // Recognised by llama.cpp but not rendered by kgen: refused by name.
    const char *refused[] = {"rwkv-world",  "gigachat",      "yandex",
                             "hunyuan-moe", "hunyuan-dense", "pangu-embedded"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        kg_chat_template_t t = kg_chat_detect(refused[i]);
        ck_assert_str_eq(kg_chat_template_name(t), refused[i]);
        ck_assert(!kg_chat_template_is_supported(t));
        err[0] = '\0';
        st = kg_chat_render(refused[i], conv, N_CONV, true, NULL, NULL, &out, err, sizeof(err));
        ck_assert_int_eq(st, KG_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(err, refused[i]));
    }
}
END_TEST

START_TEST(generation_prompt_and_empty) {
    kg_status_t st;
    char *out = render("chatml", conv, 2, false, &st);
    ck_assert_int_eq(st, KG_OK);
    ck_assert_str_eq(out, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                          "<|im_start|>user\nHello<|im_end|>\n");
    free(out);
    out = render("chatml", conv, 0, true, &st);
    ck_assert_str_eq(out, "<|im_start|>assistant\n");
    free(out);
    out = render("chatml", conv, 0, false, &st);
    ck_assert_int_eq(st, KG_OK);
    ck_assert_str_eq(out, "");
    free(out);
    // Llama 2 has no generation prompt: the flag changes nothing.
    char *with = render("llama2", conv, N_CONV, true, &st);
    char *without = render("llama2", conv, N_CONV, false, &st);
    ck_assert_str_eq(with, without);
    free(with);
    free(without);
}
END_TEST

START_TEST(trim_is_ascii_only) {
    // llama.cpp's trim() uses isspace on bytes: U+3000 (ideographic space)
    // and other multi-byte characters stay, ASCII whitespace goes.
    const kg_chat_message_t msgs[] = {{"user", " \t\xe3\x80\x80hi\xe3\x80\x80\r\n "}};
    kg_status_t st;
    char *out = render("llama3", msgs, 1, false, &st);
    ck_assert_int_eq(st, KG_OK);
    ck_assert_str_eq(out, "<|start_header_id|>user<|end_header_id|>\n\n\xe3\x80\x80hi\xe3\x80\x80"
                          "<|eot_id|>");
    free(out);
    const kg_chat_message_t blank[] = {{"user", "  \n "}};
    out = render("gemma", blank, 1, false, &st);
    ck_assert_str_eq(out, "<start_of_turn>user\n<end_of_turn>\n");
    free(out);
}
END_TEST

START_TEST(system_folding) {
    // Gemma has no system turn: the system text opens the next user turn,
    // and a system message with no user after it disappears.
    const kg_chat_message_t msgs[] = {
        {"system", " be brief "}, {"assistant", "ok"}, {"user", "go"}, {"system", "unused"}};
    kg_status_t st;
    char *out = render("gemma", msgs, 4, true, &st);
    ck_assert_str_eq(out, "<start_of_turn>model\nok<end_of_turn>\n<start_of_turn>user\nbe brief"
                          "\n\ngo<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    // Bailing 2 adds its own system turn when the conversation has none.
    out = render("bailing2", &msgs[2], 1, true, &st);
    ck_assert_str_eq(out, "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>"
                          "go<|role_end|><role>ASSISTANT</role>");
    free(out);
}
END_TEST

START_TEST(names_are_distinct) {
    for (int a = 1; a < KG_CHAT_TEMPLATE_COUNT_; a++) {
        ck_assert_ptr_nonnull(kg_chat_template_name((kg_chat_template_t)a));
        ck_assert_str_ne(kg_chat_template_name((kg_chat_template_t)a), "unknown");
        for (int b = a + 1; b < KG_CHAT_TEMPLATE_COUNT_; b++) {
            ck_assert_str_ne(kg_chat_template_name((kg_chat_template_t)a),
                             kg_chat_template_name((kg_chat_template_t)b));
        }
    }
    ck_assert_str_eq(kg_chat_template_name((kg_chat_template_t)999), "unknown");
    ck_assert(!kg_chat_template_is_supported((kg_chat_template_t)999));
}
END_TEST

// ---- against the llama.cpp build the other goldens come from ----

/* A JSON string (as chat-render writes it) into out. */
static bool unjson(const char *s, char *out, size_t cap) {
    size_t n = 0;
    if (*s++ != '"') {
        return false;
    }
    while (*s && *s != '"' && n + 2 < cap) {
        if (*s == '\\') {
            s++;
            char c = *s++;
            unsigned cp = 0;
            if (c == 'n') {
                out[n++] = '\n';
            } else if (c == 't') {
                out[n++] = '\t';
            } else if (c == 'u' && sscanf(s, "%4x", &cp) == 1) {
                out[n++] = (char)cp; /* chat-render escapes only control bytes */
                s += 4;
            } else {
                out[n++] = c;
            }
        } else {
            out[n++] = *s++;
        }
    }
    out[n] = '\0';
    return *s == '"';
}

/* tests/data/chat/llama-cpp-render.golden (scripts/goldens/chat-goldens.mjs):
 * llama_chat_apply_template of llama.cpp de3ff81 for every built-in name and
 * for the Jinja text of every `kgen mkmodel --chat-template`. Every format
 * kgen renders must render the same; the families' formats must be among
 * them. */
START_TEST(renders_as_llama_cpp_today) {
    static const kg_chat_message_t conv1[] = {
        {"user", "What is 2+2?"},
        {"assistant", "4"},
        {"user", "And in words,\nplease?"},
    };
    size_t len;
    char *text = kg_test_read_file(kg_test_data("chat/llama-cpp-render.golden"), &len);
    ck_assert_ptr_nonnull(text);
    static char want[1 << 16];
    int n_same = 0, n_unsupported = 0, n_jinja = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128];
        int c = 0, add = 0, off = 0;
        if (sscanf(line, "render %127s %d %d %n", name, &c, &add, &off) != 3) {
            continue;
        }
        ck_assert(unjson(line + off, want, sizeof(want)));
        const kg_chat_message_t *msgs = c == 0 ? conv : conv1;
        size_t n = c == 0 ? N_CONV : 3;
        char *out = NULL, err[256];
        kg_status_t st;
        if (strncmp(name, "jinja:", 6) == 0) {
            const char *tmpl = kg_mkmodel_chat_template(name + 6, NULL);
            ck_assert_ptr_nonnull(tmpl);
            st = kg_chat_render(tmpl, msgs, n, add != 0, NULL, NULL, &out, err, sizeof(err));
            ck_assert_msg(st == KG_OK, "%s: %s", name, err);
            n_jinja++;
        } else {
            kg_chat_template_t t = kg_chat_detect(name);
            if (t == KG_CHAT_TEMPLATE_UNKNOWN || !kg_chat_template_is_supported(t)) {
                n_unsupported++;
                continue;
            }
            st = kg_chat_render_template(t, msgs, n, add != 0, &out, err, sizeof(err));
            ck_assert_msg(st == KG_OK, "%s: %s", name, err);
        }
        ck_assert_msg(strcmp(out, want) == 0, "%s conv %d add %d:\n got: [%s]\nwant: [%s]", name, c,
                      add, out, want);
        free(out);
        n_same++;
    }
    free(text);
    fprintf(stderr,
            "chat: %d renderings equal llama.cpp's (%d of Jinja texts), %d of formats "
            "kgen does not render\n",
            n_same, n_jinja, n_unsupported);
    ck_assert_int_eq(n_jinja, 7 * 4);
    ck_assert_int_gt(n_same, 100);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("detect");
    tcase_add_loop_test(tc, detect_each_format, 0, (int)N_CASES);
    tcase_add_test(tc, detection_order);
    tcase_add_test(tc, names_are_distinct);
    suite_add_tcase(s, tc);
    tc = tcase_create("render");
    tcase_add_loop_test(tc, render_each_format, 0, (int)N_CASES);
    tcase_add_test(tc, generation_prompt_and_empty);
    tcase_add_test(tc, trim_is_ascii_only);
    tcase_add_test(tc, system_folding);
    tcase_add_test(tc, renders_as_llama_cpp_today);
    suite_add_tcase(s, tc);
    tc = tcase_create("unsupported");
    tcase_add_test(tc, unsupported_templates);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
