/* check_toolcall: tool calls parsed out of model outputs (src/schema/
 * kg_toolcall*): the format a template teaches, each syntax, bad and cut
 * calls, and equality with llama.cpp's own parser on the golden outputs of
 * tests/data/toolcall/ (made by scripts/goldens/toolcall-goldens.sh). */
#include "check_common.h"
#include "grammar/kg_grammar.h"
#include "grammar/kg_gvocab.h"
#include "pipeline/kg_reasoning.h"
#include "schema/kg_toolcall.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kg_toolparse_t parse(kg_toolfmt_t f, const char *text) {
    kg_toolparse_t p;
    ck_assert_int_eq(kg_toolcall_parse(f, text, strlen(text), NULL, &p), KG_OK);
    ck_assert_ptr_nonnull(p.content);
    return p;
}

static char *template_src(const char *name) {
    char rel[512];
    snprintf(rel, sizeof(rel), "chat/jinja/templates/%s", name);
    char path[1024];
    snprintf(path, sizeof(path), "%s", kg_test_data(rel));
    size_t len;
    char *src = kg_test_read_file(path, &len);
    ck_assert_msg(src != NULL, "cannot read %s", path);
    return src;
}

START_TEST(test_detect) {
    static const struct {
        const char *tmpl;
        kg_toolfmt_t f;
    } cases[] = {
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", KG_TOOLFMT_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", KG_TOOLFMT_HERMES},
        {"Qwen-Qwen3-0.6B.jinja", KG_TOOLFMT_HERMES},
        {"ibm-granite-granite-4.0.jinja", KG_TOOLFMT_HERMES},
        {"Qwen3-Coder.jinja", KG_TOOLFMT_QWEN3_CODER},
        {"Qwen3.5-4B.jinja", KG_TOOLFMT_QWEN3_CODER},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", KG_TOOLFMT_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", KG_TOOLFMT_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", KG_TOOLFMT_MISTRAL},
        {"unsloth-mistral-Devstral-Small-2507.jinja", KG_TOOLFMT_MISTRAL_ARGS},
        {"llama-cpp-deepseek-r1.jinja", KG_TOOLFMT_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-V3.1.jinja", KG_TOOLFMT_DEEPSEEK_V3},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", KG_TOOLFMT_COMMAND_R7B},
        {"meetkai-functionary-medium-v3.2.jinja", KG_TOOLFMT_FUNCTIONARY},
        {"meetkai-functionary-medium-v3.1.jinja", KG_TOOLFMT_FUNCTIONARY_V31},
        {"openai-gpt-oss-120b.jinja", KG_TOOLFMT_GPT_OSS},
        {"GLM-4.6.jinja", KG_TOOLFMT_GLM},
        {"GLM-4.7-Flash.jinja", KG_TOOLFMT_GLM},
        {"poolside-Laguna-S-2.1.jinja", KG_TOOLFMT_GLM},
        {"Spark2.5.jinja", KG_TOOLFMT_GLM},
        {"Kimi-K2-Instruct.jinja", KG_TOOLFMT_KIMI_K2},
        {"Kimi-K2-Thinking.jinja", KG_TOOLFMT_KIMI_K2},
        {"moonshotai-Kimi-K2.jinja", KG_TOOLFMT_KIMI_K2},
        {"MiniMax-M2.jinja", KG_TOOLFMT_MINIMAX_M2},
        {"google-gemma-4-31B-it.jinja", KG_TOOLFMT_GEMMA4},
        {"google-gemma-4-31B-it-interleaved.jinja", KG_TOOLFMT_GEMMA4},
        {"LFM2-8B-A1B.jinja", KG_TOOLFMT_LFM2},
        {"LFM2.5-8B-A1B.jinja", KG_TOOLFMT_LFM2},
        {"LFM2.5-Instruct.jinja", KG_TOOLFMT_LFM2},
        {"ibm-granite-granite-4.1.jinja", KG_TOOLFMT_HERMES},
        {"google-gemma-2-2b-it.jinja", KG_TOOLFMT_NONE},
        {"microsoft-Phi-3.5-mini-instruct.jinja", KG_TOOLFMT_NONE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *src = template_src(cases[i].tmpl);
        ck_assert_msg(kg_toolfmt_detect(src) == cases[i].f, "%s: %s, expected %s", cases[i].tmpl,
                      kg_toolfmt_name(kg_toolfmt_detect(src)), kg_toolfmt_name(cases[i].f));
        free(src);
    }
    ck_assert_int_eq(kg_toolfmt_detect(NULL), KG_TOOLFMT_NONE);
    /* Ling 3.0 writes <arg_key> in its own syntax (llama.cpp's specialised parser): not GLM's */
    char *ling = template_src("inclusionai-ling-3.0-flash.jinja");
    ck_assert_int_ne(kg_toolfmt_detect(ling), KG_TOOLFMT_GLM);
    free(ling);
}
END_TEST

/* Model output is bytes with a length: a NUL a model writes stays in the content and the
 * reasoning (the done event's text once was cut there). */
START_TEST(test_nul_bytes) {
    static const char plain[] = "a\0b";
    static const char call[] =
        "a\0b<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    static const char oss[] = "<|channel|>analysis<|message|>x\0y<|end|><|start|>assistant"
                              "<|channel|>final<|message|>p\0q";
    kg_toolparse_t p;
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_HERMES, plain, 3, NULL, &p), KG_OK);
    ck_assert_uint_eq(p.content_len, 3);
    ck_assert(memcmp(p.content, plain, 3) == 0);
    kg_toolparse_clear(&p);
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_HERMES, call, sizeof(call) - 1, NULL, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_uint_eq(p.content_len, 3);
    kg_toolparse_clear(&p);
    ck_assert_int_eq(kg_toolcall_parse_answer(KG_TOOLFMT_GPT_OSS, oss, sizeof(oss) - 1, &p), KG_OK);
    ck_assert_uint_eq(p.content_len, 3);
    ck_assert(memcmp(p.content, "p\0q", 3) == 0);
    ck_assert_uint_eq(p.reasoning_len, 3);
    ck_assert(memcmp(p.reasoning, "x\0y", 3) == 0);
    kg_toolparse_clear(&p);
}
END_TEST

/* reasoning_format none with tools (llama.cpp's gpt-oss parser with reasoning extraction off):
 * the analysis message stays in the content with its header and end marker, the final message
 * follows it, and calls are parsed as usual */
START_TEST(test_keep_reasoning) {
    static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get\","
                                "\"parameters\":{\"type\":\"object\"}}}]";
    static const char call[] = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
                               "<|channel|>commentary to=functions.get <|constrain|>json"
                               "<|message|>{\"a\":1}";
    static const char answer[] = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
                                 "<|channel|>final<|message|>done";
    kg_toolparse_t p;
    ck_assert_int_eq(
        kg_toolcall_parse_keep_reasoning(KG_TOOLFMT_GPT_OSS, call, sizeof(call) - 1, tools, &p),
        KG_OK);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "get");
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\":1}");
    ck_assert_ptr_null(p.reasoning);
    ck_assert_str_eq(p.content, "<|channel|>analysis<|message|>think<|end|>");
    kg_toolparse_clear(&p);
    ck_assert_int_eq(
        kg_toolcall_parse_keep_reasoning(KG_TOOLFMT_GPT_OSS, answer, sizeof(answer) - 1, tools, &p),
        KG_OK);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_ptr_null(p.reasoning);
    ck_assert_str_eq(p.content, "<|channel|>analysis<|message|>think<|end|>done");
    kg_toolparse_clear(&p);
    /* the same texts split as usual */
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_GPT_OSS, answer, sizeof(answer) - 1, tools, &p),
                     KG_OK);
    ck_assert_str_eq(p.reasoning, "think");
    ck_assert_str_eq(p.content, "done");
    kg_toolparse_clear(&p);
}
END_TEST

START_TEST(test_hermes) {
    kg_toolparse_t p =
        parse(KG_TOOLFMT_HERMES,
              "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": "
              "\"\\u00e9\"}]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, "
              "\"name\": \"g\\u00e9\"}\n</tool_call>\n");
    ck_assert_str_eq(p.content, "Sure.\n");
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\": [1, {\"b\": \"\\u00e9\"}]}");
    ck_assert_str_eq(p.calls[1].name, "g\xc3\xa9");
    ck_assert_str_eq(p.calls[1].arguments, "{}");
    ck_assert_str_eq(p.calls[1].id, "");
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);

    /* a broken call: all content, nothing lost */
    const char *bad = "x<tool_call>\n{\"name\": \"f\", \"arguments\": {a}}\n</tool_call>";
    p = parse(KG_TOOLFMT_HERMES, bad);
    ck_assert_str_eq(p.content, bad);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert(p.malformed);
    kg_toolparse_clear(&p);

    /* text after the last call is not the syntax */
    p = parse(KG_TOOLFMT_HERMES,
              "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> and more");
    ck_assert(p.malformed);
    kg_toolparse_clear(&p);

    /* a call the output ends inside keeps the arguments written so far */
    p = parse(KG_TOOLFMT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\": 1");
    kg_toolparse_clear(&p);

    /* the object must be a call */
    p = parse(KG_TOOLFMT_HERMES, "<tool_call>\n{\"nom\": \"f\"}\n</tool_call>");
    ck_assert(p.malformed);
    kg_toolparse_clear(&p);

    /* deep nesting is refused, not recursed into */
    char deep[4096] = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
    size_t n = strlen(deep);
    for (int i = 0; i < 1000; i++) {
        deep[n++] = '[';
    }
    deep[n] = '\0';
    p = parse(KG_TOOLFMT_HERMES, deep);
    ck_assert(p.malformed);
    ck_assert_str_eq(p.content, deep);
    kg_toolparse_clear(&p);
}
END_TEST

START_TEST(test_formats) {
    kg_toolparse_t p =
        parse(KG_TOOLFMT_NONE, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);

    /* Qwen3-Coder: parameters typed by the tool's schema */
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"n\":{\"type\":"
        "\"integer\"}}}}}]";
    const char *coder =
        "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n"
        "</parameter>\n<parameter=o>\n{\"k\": \"a\\\"b\"}\n</parameter>\n"
        "<parameter=t>\nline\n\"two\"\n</parameter>\n</function>\n</tool_call>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_QWEN3_CODER, coder, strlen(coder), tools, &p),
                     KG_OK);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(
        p.calls[0].arguments,
        "{\"s\":\"42\",\"n\":42,\"o\":{\"k\": \"a\\\"b\"},\"t\":\"line\\n\\\"two\\\"\"}");
    kg_toolparse_clear(&p);

    /* Llama 3: a JSON answer that is no call stays an answer */
    p = parse(KG_TOOLFMT_LLAMA3, "{\"answer\": 42}");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, "{\"answer\": 42}");
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);

    /* Mistral: the model's ids */
    p = parse(KG_TOOLFMT_MISTRAL,
              "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abc123def\"}]");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].id, "abc123def");
    kg_toolparse_clear(&p);

    /* Command R7B: its own reasoning markers */
    p = parse(KG_TOOLFMT_COMMAND_R7B,
              "<|START_THINKING|>hm<|END_THINKING|><|START_RESPONSE|>Hi<|END_RESPONSE|>");
    ck_assert_str_eq(p.content, "Hi");
    ck_assert_str_eq(p.reasoning, "hm");
    kg_toolparse_clear(&p);

    /* Functionary v3.1 (llama.cpp's autoparser, "Functionary 3.1" patch): content before the
     * calls, several calls with whitespace between, the arguments as written */
    const char *fv31 = "Let me look.<function=f>{\"a\": 1}</function>\n<function=g> {\"b\": [2]}"
                       "</function>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_FUNCTIONARY_V31, fv31, strlen(fv31), NULL, &p),
                     KG_OK);
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.content, "Let me look.");
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\": 1}");
    ck_assert_str_eq(p.calls[1].name, "g");
    ck_assert_str_eq(p.calls[1].arguments, "{\"b\": [2]}");
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);
    /* no <function=: all content, <|python_tag|> code included (that parser maps no python tool) */
    p = parse(KG_TOOLFMT_FUNCTIONARY_V31, "<|python_tag|>print(1)");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, "<|python_tag|>print(1)");
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);
    /* cut inside the arguments (max_tokens): the call with what was written */
    p = parse(KG_TOOLFMT_FUNCTIONARY_V31, "<function=f>{\"a\": [1, ");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\": [1, ");
    kg_toolparse_clear(&p);
    /* cut inside the name: no call yet, the content before stands */
    p = parse(KG_TOOLFMT_FUNCTIONARY_V31, "Hi<function=ge");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);
    /* text after the calls, or arguments that are no JSON: malformed, all content */
    static const char *const fv31_bad[] = {"<function=f>{}</function> and more",
                                           "<function=f>not json</function>", "<function=>{}"};
    for (size_t i = 0; i < 3; i++) {
        p = parse(KG_TOOLFMT_FUNCTIONARY_V31, fv31_bad[i]);
        ck_assert_msg(p.malformed && p.n_calls == 0, "[%s]", fv31_bad[i]);
        ck_assert_str_eq(p.content, fv31_bad[i]);
        kg_toolparse_clear(&p);
    }
    /* its text trigger is the call's first bytes */
    {
        const char *tr[2];
        int32_t fr[2];
        ck_assert_uint_eq(kg_toolfmt_triggers(KG_TOOLFMT_FUNCTIONARY_V31, tr, fr, 2), 1);
        ck_assert_str_eq(tr[0], "<function=");
        ck_assert_int_eq(fr[0], 0);
        ck_assert_ptr_null(kg_toolfmt_marker(KG_TOOLFMT_FUNCTIONARY_V31));
    }

    /* gpt-oss: an unterminated header is all content */
    p = parse(KG_TOOLFMT_GPT_OSS, "<|channel|>final");
    ck_assert(p.malformed);
    ck_assert_str_eq(p.content, "<|channel|>final");
    kg_toolparse_clear(&p);

    /* GLM: tagged arguments typed by the schema (no schema: JSON where the value is JSON) */
    const char *glm = "Sure.\n<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>42</arg_value>\n"
                      "<arg_key>n</arg_key>\n<arg_value>42</arg_value>\n<arg_key>t</arg_key>\n"
                      "<arg_value>a \"b\"\nc</arg_value>\n</tool_call>\n<tool_call>g"
                      "<arg_key>x</arg_key><arg_value>[1, 2]</arg_value></tool_call>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_GLM, glm, strlen(glm), tools, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.content, "Sure.\n");
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":\"42\",\"n\":42,\"t\":\"a \\\"b\\\"\\nc\"}");
    ck_assert_str_eq(p.calls[1].name, "g");
    ck_assert_str_eq(p.calls[1].arguments, "{\"x\":[1, 2]}");
    kg_toolparse_clear(&p);
    p = parse(KG_TOOLFMT_GLM,
              "<tool_call>f<arg_key>s</arg_key><arg_value>42</arg_value></tool_call>");
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":42}");
    kg_toolparse_clear(&p);
    /* text after the last call, a call without a name: all content */
    const char *glm_bad[] = {
        "<tool_call>f<arg_key>s</arg_key><arg_value>1</arg_value></tool_call>x",
        "<tool_call><arg_key>s</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call>f<arg_key>s</arg_key>oops</tool_call>"};
    for (size_t i = 0; i < sizeof(glm_bad) / sizeof(glm_bad[0]); i++) {
        p = parse(KG_TOOLFMT_GLM, glm_bad[i]);
        ck_assert_msg(p.malformed && p.n_calls == 0, "%s", glm_bad[i]);
        ck_assert_str_eq(p.content, glm_bad[i]);
        kg_toolparse_clear(&p);
    }
    /* cut between two arguments: the arguments so far, a whole object */
    p = parse(KG_TOOLFMT_GLM,
              "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>1</arg_value>\n<arg_");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert(!p.malformed);
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":1}");
    kg_toolparse_clear(&p);

    /* MiniMax-M2: invokes in one block, typed as GLM's */
    const char *mm = "Ok.\n<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"s\">7"
                     "</parameter>\n<parameter name=\"n\">7</parameter>\n</invoke>\n<invoke "
                     "name=\"g\">\n</invoke>\n</minimax:tool_call>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_MINIMAX_M2, mm, strlen(mm), tools, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.content, "Ok.\n");
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":\"7\",\"n\":7}");
    ck_assert_str_eq(p.calls[1].name, "g");
    ck_assert_str_eq(p.calls[1].arguments, "{}");
    kg_toolparse_clear(&p);
    const char *mm_bad = "<minimax:tool_call>\n<invoke name=\"f\">\n<param></invoke>";
    p = parse(KG_TOOLFMT_MINIMAX_M2, mm_bad);
    ck_assert(p.malformed);
    ck_assert_str_eq(p.content, mm_bad);
    kg_toolparse_clear(&p);

    /* Kimi K2: the model's ids, a thought that ends at the call, no section markers */
    p = parse(KG_TOOLFMT_KIMI_K2,
              "<think>hm<|tool_call_begin|>functions.f.x:12<|tool_call_argument_begin|>{}"
              "<|tool_call_begin|>functions.g:13<|tool_call_argument_begin|>{\"a\": 1}"
              "<|tool_call_end|>");
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.reasoning, "hm");
    ck_assert_str_eq(p.content, "");
    ck_assert_str_eq(p.calls[0].name, "f.x");
    ck_assert_str_eq(p.calls[0].id, "functions.f.x:12");
    ck_assert_str_eq(p.calls[1].arguments, "{\"a\": 1}");
    ck_assert_str_eq(p.calls[1].id, "functions.g:13");
    kg_toolparse_clear(&p);
    const char *kimi_bad[] = {
        "<|tool_call_begin|>f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_call_begin|>functions.:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{x}<|tool_call_end|>",
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>x"};
    for (size_t i = 0; i < sizeof(kimi_bad) / sizeof(kimi_bad[0]); i++) {
        p = parse(KG_TOOLFMT_KIMI_K2, kimi_bad[i]);
        ck_assert_msg(p.malformed && p.n_calls == 0, "%s", kimi_bad[i]);
        ck_assert_str_eq(p.content, kimi_bad[i]);
        kg_toolparse_clear(&p);
    }

    /* Gemma 4: values converted to JSON, the thought its reasoning; a call that breaks ends the
     * calls (no error: what follows is dropped, as llama.cpp's parser drops it) */
    const char *g4 = "<|channel>thought\nhm<channel|>Ok.<|tool_call>call:f{s:<|\"|>a \"b\"\n"
                     "<|\"|>,n:-2.5e1,o:{k:[true,null,<|\"|>x<|\"|>]}}<tool_call|>"
                     "<|tool_call>call:g{}<tool_call|><|tool_call>call:h{x:1}<tool_call|>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_GEMMA4, g4, strlen(g4), NULL, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 3);
    ck_assert_str_eq(p.content, "Ok.");
    ck_assert_str_eq(p.reasoning, "hm");
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments,
                     "{\"s\":\"a \\\"b\\\"\\n\",\"n\":-2.5e1,\"o\":{\"k\":[true,null,\"x\"]}}");
    ck_assert_str_eq(p.calls[1].arguments, "{}");
    kg_toolparse_clear(&p);
    /* with the job's tools, h is no tool: the calls end before it */
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_GEMMA4, g4, strlen(g4), tools, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert(!p.malformed);
    kg_toolparse_clear(&p);
    p = parse(KG_TOOLFMT_GEMMA4, "<|tool_call>call:f{s:<|\"|>ab");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":\"ab");
    kg_toolparse_clear(&p);

    /* LFM2: Python-style arguments as JSON, by the tool's properties */
    const char *lfm = "Ok.<|tool_call_start|>[f(s='it\\'s \"x\"', n=3), f(n=1, s=\"a\", "
                      "o={'k': [True, None]})]<|tool_call_end|>";
    ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_LFM2, lfm, strlen(lfm), NULL, &p), KG_OK);
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.content, "Ok.");
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":\"it's \\\"x\\\"\",\"n\":3}");
    ck_assert_str_eq(p.calls[1].arguments, "{\"n\":1,\"s\":\"a\",\"o\":{\"k\": [true, null]}}");
    kg_toolparse_clear(&p);
    /* o is no property of f, n is no string, text after the calls: malformed, all content */
    const char *lfm_bad[] = {"<|tool_call_start|>[f(o=1)]<|tool_call_end|>",
                             "<|tool_call_start|>[f(s=1)]<|tool_call_end|>",
                             "<|tool_call_start|>[f(n=1)]<|tool_call_end|>x",
                             "<|tool_call_start|>[g(n=1)]<|tool_call_end|>"};
    for (size_t i = 0; i < sizeof(lfm_bad) / sizeof(lfm_bad[0]); i++) {
        ck_assert_int_eq(
            kg_toolcall_parse(KG_TOOLFMT_LFM2, lfm_bad[i], strlen(lfm_bad[i]), tools, &p), KG_OK);
        ck_assert_msg(p.malformed && p.n_calls == 0, "%s", lfm_bad[i]);
        ck_assert_str_eq(p.content, lfm_bad[i]);
        kg_toolparse_clear(&p);
    }

    /* every format, every prefix of a call: never a crash, content never NULL */
    const char *texts[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"\\u00e9\"}}\n</tool_call>",
        coder,
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": -1.5e3}}",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"x\"}]",
        "[TOOL_CALLS]f[ARGS]{\"a\": true}",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<"
        "｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<|START_THINKING|>x<|END_THINKING|><|START_ACTION|>[{\"tool_call_id\": \"0\", "
        "\"tool_name\": \"f\", \"parameters\": {}}]<|END_ACTION|>",
        "f\n{\"a\": null}",
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.f <|constrain|>json<|message|>{}<|call|>",
        glm,
        mm,
        "<think>x</think>y<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_"
        "call_argument_begin|>{\"a\": [1]}<|tool_call_end|><|tool_calls_section_end|>",
        g4,
        lfm,
    };
    for (int f = KG_TOOLFMT_NONE; f <= KG_TOOLFMT_LAST; f++) {
        for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
            for (size_t n = 0; n <= strlen(texts[t]); n++) {
                ck_assert_int_eq(kg_toolcall_parse((kg_toolfmt_t)f, texts[t], n, tools, &p), KG_OK);
                ck_assert_ptr_nonnull(p.content);
                kg_toolparse_clear(&p);
            }
        }
    }
}
END_TEST

// ---- required calls: the grammar and the parser agree ----

static kg_gvocab_t *byte_vocab(void) {
    static char bytes[256];
    const char *texts[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        texts[i] = &bytes[i];
        lens[i] = 1;
    }
    char err[128];
    kg_gvocab_t *v = kg_gvocab_new_raw(texts, lens, 256, err, sizeof(err));
    ck_assert_msg(v != NULL, "%s", err);
    return v;
}

static bool accepts(kg_grammar_t *g, const char *doc) {
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, g);
    bool ok = true;
    for (const unsigned char *p = (const unsigned char *)doc; *p && ok; p++) {
        ok = kg_matcher_accept(m, *p);
    }
    ok = ok && kg_matcher_can_end(m);
    kg_matcher_free(m);
    return ok;
}

static kg_grammar_t *
tool_grammar(kg_gvocab_t *v, kg_toolfmt_t f, const char *tools, const char *only, bool parallel) {
    char err[512] = "";
    size_t len = 0;
    char *text = kg_toolcall_constraint(f, tools, only, parallel, &len, err, sizeof(err));
    ck_assert_msg(text != NULL, "%s: %s", kg_toolfmt_name(f), err);
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    kg_gir_t *ir = kg_toolcall_builder(&k, err, sizeof(err), NULL);
    ck_assert_msg(ir != NULL, "%s: %s", kg_toolfmt_name(f), err);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", kg_toolfmt_name(f), err);
    kg_gir_free(ir);
    free(text);
    return g;
}

#define W_ARGS "{\"city\": \"Paris\"}"
#define S_ARGS "{\"q\": \"caf\u00e9\", \"n\": 3}"

START_TEST(test_required_grammar) {
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
        "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"search\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"},"
        "\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},\"required\":[\"q\",\"n\"]}}}]";
    /* per format: one call of get_weather, two calls (where the syntax holds several), a call
     * whose arguments break the schema */
    static const struct {
        kg_toolfmt_t f;
        const char *one, *two, *bad;
    } cases[] = {
        {KG_TOOLFMT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " W_ARGS "}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " W_ARGS "}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"search\", \"arguments\": " S_ARGS "}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n</tool_call>"},
        {KG_TOOLFMT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": " W_ARGS "}", NULL,
         "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris, France\"}}"},
        {KG_TOOLFMT_MISTRAL, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " W_ARGS "}]",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " W_ARGS
         "}, {\"name\": \"search\", \"arguments\": " S_ARGS "}]",
         "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": \"x\", \"n\": 10}}]"},
        {KG_TOOLFMT_MISTRAL_ARGS, "[TOOL_CALLS]get_weather[ARGS]" W_ARGS,
         "[TOOL_CALLS]get_weather[ARGS]" W_ARGS "[TOOL_CALLS]search[ARGS]" S_ARGS,
         "[TOOL_CALLS]search[ARGS]{\"q\": \"x\"}"},
        {KG_TOOLFMT_DEEPSEEK_R1,
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```"
         "json\n" W_ARGS "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         NULL,
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>nope\n```json\n{}\n```"
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
        {KG_TOOLFMT_DEEPSEEK_V3,
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" W_ARGS
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" W_ARGS
         "<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>" S_ARGS
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
         "<｜tool▁calls▁end｜>"},
        {KG_TOOLFMT_COMMAND_R7B,
         "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
         "\"parameters\": " W_ARGS "}\n]<|END_ACTION|>",
         "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
         "\"parameters\": " W_ARGS "},\n    {\"tool_call_id\": \"1\", \"tool_name\": \"search\", "
         "\"parameters\": " S_ARGS "}\n]<|END_ACTION|>",
         "<|START_ACTION|>[\n    {\"tool_call_id\": \"x\", \"tool_name\": \"get_weather\", "
         "\"parameters\": " W_ARGS "}\n]<|END_ACTION|>"},
        {KG_TOOLFMT_FUNCTIONARY, "get_weather\n" W_ARGS, NULL, "get_weather\n{\"town\": \"x\"}"},
        /* the arguments end it: <|call|> is an end-of-generation token */
        {KG_TOOLFMT_GPT_OSS,
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" W_ARGS, NULL,
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[]"},
        {KG_TOOLFMT_FUNCTIONARY_V31, "<function=get_weather>" W_ARGS "</function>",
         "<function=get_weather>" W_ARGS "</function><function=search>" S_ARGS "</function>",
         "<function=get_weather>{\"city\": \"Paris, France\"}</function>"},
        {KG_TOOLFMT_KIMI_K2,
         "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_"
         "argument_begin|>" W_ARGS "<|tool_call_end|><|tool_calls_section_end|>",
         "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_"
         "argument_begin|>" W_ARGS "<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_"
         "call_argument_begin|>" S_ARGS "<|tool_call_end|><|tool_calls_section_end|>",
         "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:x<|tool_call_"
         "argument_begin|>" W_ARGS "<|tool_call_end|><|tool_calls_section_end|>"},
    };
    kg_gvocab_t *v = byte_vocab();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *fn = kg_toolfmt_name(cases[i].f);
        kg_grammar_t *g = tool_grammar(v, cases[i].f, tools, NULL, true);
        ck_assert_msg(accepts(g, cases[i].one), "%s refuses one call", fn);
        ck_assert_msg(!accepts(g, cases[i].bad), "%s accepts a bad call", fn);
        ck_assert_msg(!accepts(g, "It is sunny."), "%s accepts no call", fn);
        if (cases[i].two) {
            ck_assert_msg(accepts(g, cases[i].two), "%s refuses two calls", fn);
        }
        kg_grammar_unref(g);
        /* one call only, and a named one */
        g = tool_grammar(v, cases[i].f, tools, NULL, false);
        ck_assert_msg(accepts(g, cases[i].one), "%s (single) refuses one call", fn);
        ck_assert_msg(!cases[i].two || !accepts(g, cases[i].two), "%s (single) takes two", fn);
        kg_grammar_unref(g);
        g = tool_grammar(v, cases[i].f, tools, "search", true);
        ck_assert_msg(!accepts(g, cases[i].one), "%s (named search) takes get_weather", fn);
        kg_grammar_unref(g);
        /* what the grammar makes, the parser reads back */
        const char *texts[] = {cases[i].one, cases[i].two};
        for (int t = 0; t < 2 && texts[t]; t++) {
            kg_toolparse_t p;
            ck_assert_int_eq(kg_toolcall_parse(cases[i].f, texts[t], strlen(texts[t]), tools, &p),
                             KG_OK);
            ck_assert_msg(p.n_calls == (size_t)t + 1 && !p.malformed, "%s: %zu calls", fn,
                          p.n_calls);
            ck_assert_str_eq(p.calls[0].name, "get_weather");
            ck_assert_str_eq(p.calls[0].arguments, W_ARGS);
            ck_assert_str_eq(p.content, "");
            kg_toolparse_clear(&p);
        }
    }
    kg_gvocab_unref(v);
    /* no call syntax: nothing to wrap */
    char err[256];
    size_t len;
    ck_assert_ptr_null(
        kg_toolcall_constraint(KG_TOOLFMT_NONE, tools, NULL, true, &len, err, sizeof(err)));
    /* a parameters schema kgen cannot enforce is named */
    const char *odd = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
                      "\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}}}]";
    char *text = kg_toolcall_constraint(KG_TOOLFMT_HERMES, odd, NULL, true, &len, err, sizeof(err));
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    ck_assert_ptr_null(kg_toolcall_builder(&k, err, sizeof(err), NULL));
    ck_assert_msg(strstr(err, "tools[0].function.parameters/properties/a") != NULL, "%s", err);
    free(text);
}
END_TEST

// ---- goldens ----

static char *trimmed(const char *s) {
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
        s++;
    }
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) {
        n--;
    }
    char *t = strndup(s, n);
    ck_assert_ptr_nonnull(t);
    return t;
}

/* One golden case through kgen: the <think> split (on when the template
 * closes thoughts, as kg_intake decides for reasoning_format auto), then the
 * call parse of the answer (a group without tools: the answer parse, as
 * kg_events makes it for such a job). Returns whether everything matched. */
static bool
check_case(json_t *out, json_t *gold, const char *tools, const char *src, bool no_tools) {
    const char *tmpl = json_string_value(json_object_get(gold, "template"));
    const char *name = json_string_value(json_object_get(gold, "output"));
    const char *text = json_string_value(json_object_get(out, "text"));
    const char *gen = json_string_value(json_object_get(gold, "generation_prompt"));
    size_t len = strlen(text);
    kg_think_t th;
    bool think = strstr(src, KG_THINK_CLOSE) != NULL;
    kg_think_init(&th, think, think && kg_think_prompt_opens(gen, strlen(gen)));
    kg_think_scan(&th, text, len);
    const char *ans, *rsn;
    size_t ans_n, rsn_n;
    kg_think_split(&th, text, len, &ans, &ans_n, &rsn, &rsn_n);
    kg_toolparse_t p;
    kg_toolfmt_t f = kg_toolfmt_detect(src);
    ck_assert_int_eq(no_tools ? kg_toolcall_parse_answer(f, ans, ans_n, &p)
                              : kg_toolcall_parse(f, ans, ans_n, tools, &p),
                     KG_OK);
    char *r_kgen = strndup(p.reasoning ? p.reasoning
                           : rsn       ? rsn
                                       : "",
                           p.reasoning ? strlen(p.reasoning) : rsn_n);
    char *r_a = trimmed(r_kgen),
         *r_b = trimmed(json_string_value(json_object_get(gold, "reasoning_content")));
    char *c_a = trimmed(p.content),
         *c_b = trimmed(json_string_value(json_object_get(gold, "content")));
    bool ok = strcmp(r_a, r_b) == 0 && strcmp(c_a, c_b) == 0;
    if (!think && strcmp(p.content, json_string_value(json_object_get(gold, "content"))) != 0) {
        ok = false; /* no thought split: the content is byte-equal, whitespace too */
    }
    json_t *calls = json_object_get(gold, "tool_calls");
    ok = ok && json_array_size(calls) == p.n_calls;
    for (size_t i = 0; ok && i < p.n_calls; i++) {
        json_t *c = json_array_get(calls, i);
        ok =
            strcmp(p.calls[i].name, json_string_value(json_object_get(c, "name"))) == 0 &&
            strcmp(p.calls[i].arguments, json_string_value(json_object_get(c, "arguments"))) == 0 &&
            strcmp(p.calls[i].id, json_string_value(json_object_get(c, "id"))) == 0;
    }
    if (!ok) {
        fprintf(stderr,
                "%s / %s: kgen content [%s] reasoning [%s] %zu calls%s%s%s; llama.cpp content "
                "[%s] reasoning [%s] %zu calls\n",
                tmpl, name, c_a, r_a, p.n_calls, p.n_calls ? " [" : "",
                p.n_calls ? p.calls[0].arguments : "", p.n_calls ? "]" : "", c_b, r_b,
                json_array_size(calls));
    }
    free(r_kgen), free(r_a), free(r_b), free(c_a), free(c_b);
    kg_toolparse_clear(&p);
    return ok;
}

START_TEST(test_goldens) {
    char path[1024];
    snprintf(path, sizeof(path), "%s", kg_test_data("toolcall/outputs.json"));
    json_t *outputs = json_load_file(path, 0, NULL);
    snprintf(path, sizeof(path), "%s", kg_test_data("toolcall/goldens.json"));
    json_t *goldens = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(outputs);
    ck_assert_ptr_nonnull(goldens);
    char *tools = json_dumps(json_object_get(outputs, "tools"), JSON_COMPACT);
    size_t n = 0, n_bad = 0, n_refused = 0, gi = 0;
    json_t *cases = json_object_get(goldens, "cases");
    json_t *group;
    size_t k;
    json_array_foreach(json_object_get(outputs, "groups"), k, group) {
        json_t *tn;
        size_t t;
        json_array_foreach(json_object_get(group, "templates"), t, tn) {
            char *src = template_src(json_string_value(tn));
            json_t *out;
            size_t o;
            json_array_foreach(json_object_get(group, "outputs"), o, out) {
                json_t *gold = json_array_get(cases, gi++);
                ck_assert_ptr_nonnull(gold);
                ck_assert_str_eq(json_string_value(json_object_get(gold, "template")),
                                 json_string_value(tn));
                ck_assert_str_eq(json_string_value(json_object_get(gold, "output")),
                                 json_string_value(json_object_get(out, "name")));
                if (json_object_get(gold, "error")) {
                    n_refused++; /* llama.cpp throws; kgen's answer to these is tested above */
                    continue;
                }
                n++;
                n_bad += !check_case(out, gold, tools, src,
                                     json_is_true(json_object_get(group, "no_tools")));
            }
            free(src);
        }
    }
    ck_assert_uint_eq(gi, json_array_size(cases));
    free(tools);
    json_decref(outputs);
    json_decref(goldens);
    ck_assert_msg(n > 250, "only %zu golden parses", n);
    ck_assert_msg(n_bad == 0, "%zu of %zu parses differ from llama.cpp's (%zu it refuses)", n_bad,
                  n, n_refused);
}
END_TEST

/* The tagged syntaxes: a grammar of one expression a parameter (string-typed ones raw text, the
 * others their schema's JSON), required ones always there, in the schema's order. */
START_TEST(test_tagged_grammar) {
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{"
        "\"$ref\":\"#/$defs/d\"}},\"required\":[\"city\"],\"$defs\":{\"d\":{\"type\":"
        "\"integer\",\"minimum\":1,\"maximum\":9}}}}},{\"type\":\"function\",\"function\":{"
        "\"name\":\"ping\"}}]";
    static const struct {
        kg_toolfmt_t f;
        const char *one, *two, *bad, *missing;
    } cases[] = {
        {KG_TOOLFMT_GLM,
         "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
         "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>ping\n"
         "</tool_call>",
         "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>10</arg_value>\n</tool_call>",
         "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
         "</tool_call>"},
        {KG_TOOLFMT_MINIMAX_M2,
         "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris"
         "</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>",
         "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris"
         "</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"ping\">"
         "\n</invoke>\n</minimax:tool_call>",
         "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris"
         "</parameter>\n<parameter name=\"days\">x</parameter>\n</invoke>\n</minimax:tool_call>",
         "<minimax:tool_call>\n<invoke name=\"get_weather\">\n</invoke>\n</minimax:tool_call>"},
        {KG_TOOLFMT_QWEN3_CODER,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
         "<function=ping>\n</function>\n</tool_call>",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n0\n</parameter>\n</function>\n</tool_call>",
         "<tool_call>\n<function=nope>\n</function>\n</tool_call>"},
    };
    kg_gvocab_t *v = byte_vocab();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *fn = kg_toolfmt_name(cases[i].f);
        kg_grammar_t *g = tool_grammar(v, cases[i].f, tools, NULL, true);
        ck_assert_msg(accepts(g, cases[i].one), "%s refuses one call", fn);
        ck_assert_msg(accepts(g, cases[i].two), "%s refuses two calls", fn);
        ck_assert_msg(!accepts(g, cases[i].bad), "%s accepts a bad value", fn);
        ck_assert_msg(!accepts(g, cases[i].missing), "%s accepts a call without city", fn);
        ck_assert_msg(!accepts(g, "It is sunny."), "%s accepts no call", fn);
        kg_grammar_unref(g);
        g = tool_grammar(v, cases[i].f, tools, NULL, false);
        ck_assert_msg(!accepts(g, cases[i].two), "%s (single) takes two", fn);
        kg_grammar_unref(g);
        g = tool_grammar(v, cases[i].f, tools, "ping", true);
        ck_assert_msg(!accepts(g, cases[i].one), "%s (named ping) takes get_weather", fn);
        kg_grammar_unref(g);
        /* what the grammar makes, the parser reads back, typed */
        kg_toolparse_t p;
        ck_assert_int_eq(
            kg_toolcall_parse(cases[i].f, cases[i].two, strlen(cases[i].two), tools, &p), KG_OK);
        ck_assert_msg(p.n_calls == 2 && !p.malformed, "%s: %zu calls", fn, p.n_calls);
        ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"Paris\",\"days\":3}");
        ck_assert_str_eq(p.calls[1].name, "ping");
        ck_assert_str_eq(p.calls[1].arguments, "{}");
        kg_toolparse_clear(&p);
    }
    /* GLM-4.7 writes no newlines between the tags */
    kg_grammar_t *g = tool_grammar(v, KG_TOOLFMT_GLM, tools, NULL, true);
    ck_assert(accepts(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
                         "</arg_value></tool_call><tool_call>ping</tool_call>"));
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
    /* a parameter schema kgen cannot enforce is named by its tool */
    char err[256];
    size_t len;
    const char *odd = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
                      "\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}}}]";
    char *text = kg_toolcall_constraint(KG_TOOLFMT_GLM, odd, NULL, true, &len, err, sizeof(err));
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    ck_assert_ptr_null(kg_toolcall_builder(&k, err, sizeof(err), NULL));
    ck_assert_msg(strstr(err, "tools[0].function.parameters/properties/a") != NULL, "%s", err);
    free(text);
}
END_TEST

/* The keyed syntaxes (Gemma 4, LFM2): pairs in the schema's order, a separator between two,
 * required ones always; Gemma 4's strings raw text in its quotes and its objects its own syntax,
 * LFM2's every value JSON (its string keywords enforced). */
START_TEST(test_keyed_grammar) {
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},"
        "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9},\"opts\":{\"type\":"
        "\"object\"}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{"
        "\"name\":\"ping\"}}]";
    static const struct {
        kg_toolfmt_t f;
        const char *one, *two, *bad, *missing, *args;
    } cases[] = {
        {KG_TOOLFMT_GEMMA4,
         "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,opts:{a:[1,<|\"|>b<|\"|>]}}"
         "<tool_call|>",
         "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,opts:{a:[1,<|\"|>b<|\"|>]}}"
         "<tool_call|><|tool_call>call:ping{}<tool_call|>",
         "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:10}<tool_call|>",
         "<|tool_call>call:get_weather{days:3}<tool_call|>",
         "{\"city\":\"Paris\",\"days\":3,\"opts\":{\"a\":[1,\"b\"]}}"},
        {KG_TOOLFMT_LFM2,
         "<|tool_call_start|>[get_weather(city=\"Paris\", days=3, opts={\"a\": [1, \"b\"]})]"
         "<|tool_call_end|>",
         "<|tool_call_start|>[get_weather(city=\"Paris\", days=3, opts={\"a\": [1, \"b\"]}), "
         "ping()]<|tool_call_end|>",
         "<|tool_call_start|>[get_weather(city=\"Paris, France\")]<|tool_call_end|>",
         "<|tool_call_start|>[get_weather(days=3)]<|tool_call_end|>",
         "{\"city\":\"Paris\",\"days\":3,\"opts\":{\"a\": [1, \"b\"]}}"},
    };
    kg_gvocab_t *v = byte_vocab();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *fn = kg_toolfmt_name(cases[i].f);
        kg_grammar_t *g = tool_grammar(v, cases[i].f, tools, NULL, true);
        ck_assert_msg(accepts(g, cases[i].one), "%s refuses one call", fn);
        ck_assert_msg(accepts(g, cases[i].two), "%s refuses two calls", fn);
        ck_assert_msg(!accepts(g, cases[i].bad), "%s accepts a bad value", fn);
        ck_assert_msg(!accepts(g, cases[i].missing), "%s accepts a call without city", fn);
        ck_assert_msg(!accepts(g, "It is sunny."), "%s accepts no call", fn);
        kg_grammar_unref(g);
        g = tool_grammar(v, cases[i].f, tools, NULL, false);
        ck_assert_msg(!accepts(g, cases[i].two), "%s (single) takes two", fn);
        kg_grammar_unref(g);
        g = tool_grammar(v, cases[i].f, tools, "ping", true);
        ck_assert_msg(!accepts(g, cases[i].one), "%s (named ping) takes get_weather", fn);
        kg_grammar_unref(g);
        /* what the grammar makes, the parser reads back */
        kg_toolparse_t p;
        ck_assert_int_eq(
            kg_toolcall_parse(cases[i].f, cases[i].two, strlen(cases[i].two), tools, &p), KG_OK);
        ck_assert_msg(p.n_calls == 2 && !p.malformed, "%s: %zu calls", fn, p.n_calls);
        ck_assert_str_eq(p.calls[0].arguments, cases[i].args);
        ck_assert_str_eq(p.calls[1].name, "ping");
        ck_assert_str_eq(p.calls[1].arguments, "{}");
        kg_toolparse_clear(&p);
    }
    /* optional pairs may go, the separator with them */
    kg_grammar_t *g = tool_grammar(v, KG_TOOLFMT_LFM2, tools, NULL, true);
    ck_assert(
        accepts(g, "<|tool_call_start|>[get_weather(city=\"Oslo\", opts={})]<|tool_call_end|>"));
    ck_assert(!accepts(g, "<|tool_call_start|>[get_weather(, city=\"Oslo\")]<|tool_call_end|>"));
    kg_grammar_unref(g);
    g = tool_grammar(v, KG_TOOLFMT_GEMMA4, tools, NULL, true);
    ck_assert(
        accepts(g, "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,opts:{}}<tool_call|>"));
    ck_assert(!accepts(g, "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,}<tool_call|>"));
    /* an object-typed property takes Gemma 4's objects only */
    ck_assert(
        !accepts(g, "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,opts:7}<tool_call|>"));
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

/* Auto calls: Mistral's grammar after a [TOOL_CALLS] the grammar cannot spell (a control
 * token), and the calls or free text from the first token where the syntax has no marker
 * (Llama 3.x, Functionary). */
START_TEST(test_auto_grammar) {
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
        "\"required\":[\"city\"]}}}]";
    kg_gvocab_t *v = byte_vocab();
    char err[256];
    size_t len;
    static const struct {
        kg_toolfmt_t f;
        kg_toolauto_t how;
        const char *yes[4], *no[4];
    } cases[] = {
        {KG_TOOLFMT_MISTRAL,
         KG_TOOLAUTO_OPENED,
         {"[{\"name\": \"get_weather\", \"arguments\": " W_ARGS "}]",
          "[{\"name\": \"get_weather\", \"arguments\": " W_ARGS
          "}, {\"name\": \"get_weather\", \"arguments\": " W_ARGS "}]"},
         {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " W_ARGS "}]",
          "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, France\"}}]",
          "It is sunny."}},
        {KG_TOOLFMT_LLAMA3,
         KG_TOOLAUTO_FREE,
         {"{\"name\": \"get_weather\", \"parameters\": " W_ARGS "}",
          "\n {\"name\": \"get_weather\", \"parameters\": " W_ARGS "}\n", "It is sunny {ok}.", ""},
         {"{\"answer\": 42}", "{\"name\": \"get_weather\", \"parameters\": {}}",
          " {\"name\": \"search\", \"parameters\": {}}"}},
        {KG_TOOLFMT_FUNCTIONARY,
         KG_TOOLAUTO_FREE,
         {"all\nIt is sunny.", "get_weather\n" W_ARGS, "all\n"},
         {"It is sunny.", "get_weather\n{\"town\": \"x\"}", "search\n{}"}},
        /* Functionary v3.1 from its `<function=` trigger on: the required grammar */
        {KG_TOOLFMT_FUNCTIONARY_V31,
         KG_TOOLAUTO_TEXT,
         {"<function=get_weather>" W_ARGS "</function>",
          "<function=get_weather>" W_ARGS "</function><function=get_weather>" W_ARGS "</function>"},
         {"It is sunny.", "<function=get_weather>{\"town\": \"x\"}</function>",
          "<function=search>{}</function>", "<function=get_weather>" W_ARGS}},
        /* gpt-oss from its text trigger: the recipient in the channel header or in the role,
         * commentary or analysis, with or without a content type */
        {KG_TOOLFMT_GPT_OSS,
         KG_TOOLAUTO_TEXT,
         {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" W_ARGS,
          " to=functions.get_weather<|channel|>commentary json<|message|>" W_ARGS,
          "<|channel|>analysis to=functions.get_weather<|message|>" W_ARGS,
          "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>" W_ARGS},
         {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "
          "7}",
          "<|channel|>final<|message|>It is sunny.",
          "<|channel|>commentary to=functions.get_weatherjson<|message|>" W_ARGS,
          "<|channel|>commentary to=functions.search<|message|>{}"}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *fn = kg_toolfmt_name(cases[i].f);
        char *text = kg_toolcall_auto_constraint(cases[i].f, tools, true, cases[i].how, &len, err,
                                                 sizeof(err));
        ck_assert_msg(text != NULL, "%s: %s", fn, err);
        kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
        kg_gir_t *ir = kg_toolcall_builder(&k, err, sizeof(err), NULL);
        ck_assert_msg(ir != NULL, "%s: %s", fn, err);
        kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
        ck_assert_msg(g != NULL, "%s: %s", fn, err);
        kg_gir_free(ir);
        free(text);
        for (int t = 0; t < 4 && cases[i].yes[t]; t++) {
            ck_assert_msg(accepts(g, cases[i].yes[t]), "%s refuses [%s]", fn, cases[i].yes[t]);
        }
        for (int t = 0; t < 4 && cases[i].no[t]; t++) {
            ck_assert_msg(!accepts(g, cases[i].no[t]), "%s accepts [%s]", fn, cases[i].no[t]);
        }
        kg_grammar_unref(g);
    }
    /* no grammar of a kind the format does not have */
    ck_assert_ptr_null(kg_toolcall_auto_constraint(KG_TOOLFMT_HERMES, tools, true,
                                                   KG_TOOLAUTO_OPENED, &len, err, sizeof(err)));
    ck_assert_ptr_null(kg_toolcall_auto_constraint(KG_TOOLFMT_GPT_OSS, tools, true,
                                                   KG_TOOLAUTO_FREE, &len, err, sizeof(err)));
    ck_assert_ptr_null(kg_toolcall_auto_constraint(KG_TOOLFMT_GPT_OSS, tools, true,
                                                   KG_TOOLAUTO_MARKER, &len, err, sizeof(err)));
    ck_assert_ptr_null(kg_toolcall_auto_constraint(KG_TOOLFMT_HERMES, tools, true, KG_TOOLAUTO_TEXT,
                                                   &len, err, sizeof(err)));
    /* gpt-oss's text triggers start its grammar: after <|start|>assistant, each one's rest is a
     * beginning the grammar takes (the engine feeds it from there) */
    const char *trig[4];
    int32_t from[4];
    ck_assert_uint_eq(kg_toolfmt_triggers(KG_TOOLFMT_HERMES, trig, from, 4), 0);
    size_t n_trig = kg_toolfmt_triggers(KG_TOOLFMT_GPT_OSS, trig, from, 4);
    ck_assert_uint_eq(n_trig, 3);
    char *text = kg_toolcall_auto_constraint(KG_TOOLFMT_GPT_OSS, tools, true, KG_TOOLAUTO_TEXT,
                                             &len, err, sizeof(err));
    kg_constraint_t k = {.kind = KG_CONSTRAINT_TOOL_CALLS, .text = text, .len = len};
    kg_gir_t *ir = kg_toolcall_builder(&k, err, sizeof(err), NULL);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_matcher_t *m = kg_matcher_new();
    for (size_t i = 0; i < n_trig; i++) {
        ck_assert_int_eq(from[i], (int32_t)strlen("<|start|>assistant"));
        ck_assert(strncmp(trig[i], "<|start|>assistant", (size_t)from[i]) == 0);
        kg_matcher_reset(m, g);
        const char *rest = trig[i] + from[i];
        ck_assert_msg(kg_matcher_accept_bytes(m, (const uint8_t *)rest, strlen(rest)),
                      "the grammar refuses [%s]", rest);
    }
    /* what the header grammar makes, the parser reads back (after the prompt's
     * <|start|>assistant, and after an analysis message) */
    static const char *const back[] = {
        " to=functions.get_weather<|channel|>commentary json<|message|>" W_ARGS,
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather<|message|>" W_ARGS,
        /* the grammar lets a string hold <|end|> (a text token): the arguments are read as
         * JSON, as llama.cpp's parser reads them, not cut there */
        "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"P<|end|>\"}"};
    static const char *const args[] = {W_ARGS, W_ARGS, "{\"city\": \"P<|end|>\"}"};
    for (size_t i = 0; i < 3; i++) {
        kg_toolparse_t p;
        ck_assert_int_eq(kg_toolcall_parse(KG_TOOLFMT_GPT_OSS, back[i], strlen(back[i]), tools, &p),
                         KG_OK);
        ck_assert_uint_eq(p.n_calls, 1);
        ck_assert_str_eq(p.calls[0].name, "get_weather");
        ck_assert_str_eq(p.calls[0].arguments, args[i]);
        kg_toolparse_clear(&p);
    }
    ck_assert(accepts(g, back[2]));
    kg_matcher_free(m);
    kg_grammar_unref(g);
    kg_gir_free(ir);
    free(text);
    kg_gvocab_unref(v);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("toolcall");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_detect);
    tcase_add_test(tc, test_hermes);
    tcase_add_test(tc, test_nul_bytes);
    tcase_add_test(tc, test_keep_reasoning);
    tcase_add_test(tc, test_formats);
    tcase_add_test(tc, test_required_grammar);
    tcase_add_test(tc, test_tagged_grammar);
    tcase_add_test(tc, test_keyed_grammar);
    tcase_add_test(tc, test_auto_grammar);
    suite_add_tcase(s, tc);
    TCase *gold = tcase_create("goldens");
    tcase_add_test(gold, test_goldens);
    suite_add_tcase(s, gold);
    return s;
}

KG_CHECK_MAIN(make_suite)
