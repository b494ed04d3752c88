/* kg_mkmodel_templates: the chat templates `kgen mkmodel --chat-template`
 * writes into a model (kg_mkmodel_chat_template), apart from kg_mkmodel.c
 * (the tensors and keys of each family) because a real template is long:
 * GLM-4.6's is 3 KiB. */
#include "kg_mkmodel.h"

#include <stddef.h>
#include <string.h>

/* Each family's chat template as its publisher ships it (the texts
 * llama.cpp's tests/test-chat-template.cpp carries for these models), so
 * kg_chat recognises the format the way llama.cpp does. */
#define QWEN3_TEMPLATE(gen)                                                                        \
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{- "      \
    "messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n\\n<tools>' }}{%- for tool in "   \
    "tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- "   \
    "elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "     \
    "'<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if message.role != 'system' " \
    "%}{%- set content = message.content %}{%- if message.role == 'assistant' and '</think>' in "  \
    "content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{{- "   \
    "'<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endif %}{%- endfor "  \
    "%}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}" gen "{%- endif %}"

static const struct {
    const char *name, *text;
} chat_templates[] = {
    {"chatml", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
               "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"llama2", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
               "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
               "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' "
               "%}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
               "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ "
               "raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% "
               "endfor %}"},
    {"llama3", "{% set loop_messages = messages %}{% for message in loop_messages %}{% set "
               "content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
               "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set "
               "content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ "
               "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"},
    {"gemma", "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System "
              "role not supported') }}{% endif %}{% for message in messages %}{% if "
              "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
              "raise_exception('Conversation roles must alternate "
              "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
              "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% "
              "endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
              "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt "
              "%}{{'<start_of_turn>model\\n'}}{% endif %}"},
    {"phi3", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') "
             "%}{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' "
             "+ '\\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + "
             "'<|end|>' + '\\n'}}{% endif %}{% endfor %}"},
    {"phi4", "{% for message in messages %}{% if (message['role'] == 'system') "
             "%}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
             "(message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] "
             "+ '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == "
             "'assistant') %}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"},
    {"mistral-v7",
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' "
     "+ message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ "
     "'[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == "
     "'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ "
     "raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% "
     "endfor %}"},
    /* Qwen3's thinking template, shortened (tools, the system turn, thoughts
     * dropped from past turns, enable_thinking: false closing an empty
     * thought), and the variant whose generation prompt opens the thought
     * itself (Qwen3 Thinking-2507, QwQ and DeepSeek-R1 distills do). With
     * --arch qwen3 or qwen2 either adds <think> and </think> to the vocabulary. */
    {"qwen3", QWEN3_TEMPLATE("{%- if enable_thinking is defined and enable_thinking is false %}{{- "
                             "'<think>\\n\\n</think>\\n\\n' }}{%- endif %}")},
    {"qwen3-thinking", QWEN3_TEMPLATE("{{- '<think>\\n' }}")},
    /* Qwen2.5-Instruct's template, unchanged: Hermes-style tool calls
     * (<tool_call>{"name", "arguments"}</tool_call>), for tool-call tests */
    {"qwen2.5",
     "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == '"
     "system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are"
     " Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n   "
     " {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user que"
     "ry.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<t"
     "ools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | toj"
     "son }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a j"
     "son object with function name and arguments within <tool_call></tool_call> XML tags:\\n<"
     "tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</"
     "tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}"
     "\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n   "
     " {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
     "You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for m"
     "essage in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"syste"
     "m\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}"
     "\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '"
     "\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + mes"
     "sage.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content"
     " }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n         "
     "   {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_cal"
     "l.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \""
     "' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n     "
     "       {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n     "
     "   {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" "
     "%}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}"
     "\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_res"
     "ponse>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n   "
     "     {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{"
     "- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_"
     "generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"},
    /* GLM-4.5/4.6's template as its publisher ships it (llama.cpp's
     * models/templates/GLM-4.6.jinja, verbatim): [gMASK]<sop>, the role
     * tokens, tools as XML, reasoning_content in <think> */
    {"glm4.6",
     "[gMASK]<sop>\n{%- if tools -%}\n<|system|>\n# Tools\n\nYou may call one or more func"
     "tions to assist with the user query.\n\nYou are provided with function signatures wi"
     "thin <tools></tools> XML tags:\n<tools>\n{% for tool in tools %}\n"
     "{{ tool | tojson(ensure_ascii=False) }}\n{% endfor %}\n</tools>\n"
     "\nFor each function call, output the function name and arguments within the followin"
     "g XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
     "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
     "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>{%- endif -%}\n"
     "{%- macro visible_text(content) -%}\n    {%- if content is string -%}\n"
     "        {{- content }}\n    {%- elif content is iterable and content is not mapping "
     "-%}\n        {%- for item in content -%}\n            {%- if item is mapping and ite"
     "m.type == 'text' -%}\n                {{- item.text }}\n            {%- elif item is"
     " string -%}\n                {{- item }}\n            {%- endif -%}\n"
     "        {%- endfor -%}\n    {%- else -%}\n        {{- content }}\n"
     "    {%- endif -%}\n{%- endmacro -%}\n{%- set ns = namespace(last_user_index=-1) %}\n"
     "{%- for m in messages %}\n    {%- if m.role == 'user' %}\n        {% set ns.last_use"
     "r_index = loop.index0 -%}\n    {%- endif %}\n{%- endfor %}\n{% for m in messages %}\n"
     "{%- if m.role == 'user' -%}<|user|>\n{{ visible_text(m.content) }}\n"
     "{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visibl"
     "e_text(m.content).endswith(\"/nothink\")) else '' -}}\n{%- elif m.role == 'assistant"
     "' -%}\n<|assistant|>\n{%- set reasoning_content = '' %}\n{%- set content = visible_t"
     "ext(m.content) %}\n{%- if m.reasoning_content is string %}\n    {%- set reasoning_co"
     "ntent = m.reasoning_content %}\n{%- else %}\n    {%- if '</think>' in content %}\n"
     "        {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split"
     "('<think>')[-1].lstrip('\\n') %}\n        {%- set content = content.split('</think>'"
     ")[-1].lstrip('\\n') %}\n    {%- endif %}\n{%- endif %}\n{%- if loop.index0 > ns.last"
     "_user_index and reasoning_content -%}\n{{ '\\n<think>' + reasoning_content.strip() +"
     "  '</think>'}}\n{%- else -%}\n{{ '\\n<think></think>' }}\n{%- endif -%}\n"
     "{%- if content.strip() -%}\n{{ '\\n' + content.strip() }}\n{%- endif -%}\n"
     "{% if m.tool_calls %}\n{% for tc in m.tool_calls %}\n{%- if tc.function %}\n"
     "    {%- set tc = tc.function %}\n{%- endif %}\n{{ '\\n<tool_call>' + tc.name }}\n"
     "{% set _args = tc.arguments or {} %}\n{% if _args is not mapping %}\n"
     "    {{ raise_exception(\"Invalid tool call arguments passed: \" + _args | string) }}"
     "\n{% endif %}\n{% for k, v in _args.items() %}\n<arg_key>{{ k }}</arg_key>\n"
     "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value"
     ">\n{% endfor %}\n</tool_call>{% endfor %}\n{% endif %}\n{%- elif m.role == 'tool' -%"
     "}\n{%- if m.content is string -%}\n{%- if loop.first or (messages[loop.index0 - 1].r"
     "ole != \"tool\") %}\n    {{- '<|observation|>' }}\n{%- endif %}\n"
     "{{- '\\n<tool_response>\\n' }}\n{{- m.content }}\n{{- '\\n</tool_response>' }}\n"
     "{%- else -%}\n<|observation|>{% for tr in m.content %}\n\n<tool_response>\n"
     "{{ tr.output if tr.output is defined else tr }}\n</tool_response>{% endfor -%}\n"
     "{% endif -%}\n{%- elif m.role == 'system' -%}\n<|system|>\n{{ visible_text(m.content"
     ") }}\n{%- endif -%}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n"
     "    <|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined and not ena"
     "ble_thinking) else '' -}}\n{%- endif -%}\n"},
    /* DeepSeek V3.1's template as its publisher ships it (llama.cpp's
     * models/templates/deepseek-ai-DeepSeek-V3.1.jinja, verbatim): BOS and
     * the system prompt, <｜User｜> and <｜Assistant｜> turns, <think> by
     * the thinking flag, tool calls between the tool tokens */
    {"deepseek-v3.1",
     "{% if not add_generation_prompt is defined -%}\n"
     "  {%- set add_generation_prompt = false -%}\n"
     "{%- endif -%}\n"
     "{%- if not thinking is defined -%}\n"
     "  {%- if enable_thinking is defined -%}\n"
     "    {%- set thinking = enable_thinking -%}\n"
     "    {%- else -%}\n"
     "    {%- set thinking = false -%}\n"
     "  {%- endif -%}\n"
     "{%- endif -%}\n"
     "{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='', is_first_"
     "sp=true, is_last_user=false) -%}\n"
     "{%- for message in messages -%}\n"
     "  {%- if message['role'] == 'system' -%}\n"
     "    {%- if ns.is_first_sp -%}\n"
     "      {%- set ns.system_prompt = ns.system_prompt + message['content'] -%}\n"
     "      {%- set ns.is_first_sp = false -%}\n"
     "      {%- else -%}\n"
     "      {%- set ns.system_prompt = ns.system_prompt + '\n"
     "\n"
     "' + message['content'] -%}\n"
     "    {%- endif -%}\n"
     "  {%- endif -%}\n"
     "{%- endfor -%}{{ bos_token }}{{ ns.system_prompt }}\n"
     "{%- for message in messages -%}\n"
     "  {%- if message['role'] == 'user' -%}\n"
     "    {%- set ns.is_tool = false -%}\n"
     "    {%- set ns.is_first = false -%}\n"
     "    {%- set ns.is_last_user = true -%}{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + messag"
     "e['content']}}\n"
     "  {%- endif -%}\n"
     "  {%- if message['role'] == 'assistant' and message['tool_calls'] -%}\n"
     "    {%- if ns.is_last_user -%}{{'<\xef\xbd\x9c"
     "Assistant\xef\xbd\x9c><think></think>'}}\n"
     "    {%- endif -%}\n"
     "    {%- set ns.is_last_user = false -%}\n"
     "    {%- set ns.is_first = false -%}\n"
     "    {%- set ns.is_tool = false -%}\n"
     "    {%- for tool in message['tool_calls'] -%}\n"
     "      {%- if not ns.is_first -%}\n"
     "        {%- if not message['content'] -%}{{'<\xef\xbd\x9ctool\xe2\x96\x81"
     "calls\xe2\x96\x81"
     "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "begin\xef\xbd\x9c>'+ tool['function']['name'] + '<\xef\xbd\x9ctool\xe2\x96\x81sep"
     "\xef\xbd\x9c>' + tool['function']['arguments'] | tojson + '<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "end\xef\xbd\x9c>'}}\n"
     "          {%- else -%}{{message['content'] + '<\xef\xbd\x9ctool\xe2\x96\x81"
     "calls\xe2\x96\x81"
     "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "begin\xef\xbd\x9c>' + tool['function']['name'] + '<\xef\xbd\x9ctool\xe2\x96\x81se"
     "p\xef\xbd\x9c>' + tool['function']['arguments'] | tojson + '<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "end\xef\xbd\x9c>'}}\n"
     "        {%- endif -%}\n"
     "        {%- set ns.is_first = true -%}\n"
     "        {%- else -%}{{'<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "begin\xef\xbd\x9c>'+ tool['function']['name'] + '<\xef\xbd\x9ctool\xe2\x96\x81sep"
     "\xef\xbd\x9c>' + tool['function']['arguments'] | tojson + '<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "end\xef\xbd\x9c>'}}\n"
     "      {%- endif -%}\n"
     "    {%- endfor -%}{{'<\xef\xbd\x9ctool\xe2\x96\x81"
     "calls\xe2\x96\x81"
     "end\xef\xbd\x9c><\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}\n"
     "  {%- endif -%}\n"
     "  {%- if message['role'] == 'assistant' and not message['tool_calls'] -%}\n"
     "    {%- if ns.is_last_user -%}{{'<\xef\xbd\x9c"
     "Assistant\xef\xbd\x9c>'}}\n"
     "      {%- if message['prefix'] is defined and message['prefix'] and thinking -%}{"
     "{'<think>'}}\n"
     "        {%- else -%}{{'<think></think>'}}\n"
     "      {%- endif -%}\n"
     "    {%- endif -%}\n"
     "    {%- set ns.is_last_user = false -%}\n"
     "    {%- if ns.is_tool -%}{{message['content'] + '<\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}\n"
     "      {%- set ns.is_tool = false -%}\n"
     "      {%- else -%}\n"
     "      {%- set content = message['content'] -%}\n"
     "      {%- if '</think>' in content -%}\n"
     "        {%- set content = content.split('</think>', 1)[1] -%}\n"
     "      {%- endif -%}{{content + '<\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}\n"
     "    {%- endif -%}\n"
     "  {%- endif -%}\n"
     "  {%- if message['role'] == 'tool' -%}\n"
     "    {%- set ns.is_last_user = false -%}\n"
     "    {%- set ns.is_tool = true -%}{{'<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
     "begin\xef\xbd\x9c>' + message['content'] + '<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
     "end\xef\xbd\x9c>'}}\n"
     "  {%- endif -%}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool -%}{{'<\xef\xbd\x9c"
     "Assistant\xef\xbd\x9c>'}}\n"
     "  {%- if not thinking -%}{{'<think></think>'}}\n"
     "  {%- else -%}{{'<think>'}}\n"
     "  {%- endif -%}\n"
     "{%- endif %}"},
};

const char *kg_mkmodel_chat_template(const char *name, const char **names) {
    if (names) {
        *names = "chatml, llama2, llama3, gemma, phi3, phi4, mistral-v7, qwen3, qwen3-thinking, "
                 "qwen2.5, glm4.6, deepseek-v3.1";
    }
    for (size_t i = 0; name && i < sizeof(chat_templates) / sizeof(chat_templates[0]); i++) {
        if (strcmp(name, chat_templates[i].name) == 0) {
            return chat_templates[i].text;
        }
    }
    return NULL;
}
