# toolcall-outputs: the golden set of model outputs for the tool-call parser goldens
# (tests/data/toolcall/outputs.json): per call syntax, the real templates that teach it and
# outputs in it (plain answer, one call, parallel calls, content before a call, a call after
# reasoning, nested JSON and unicode arguments, cut and broken calls). Run by toolcall-goldens.sh.
import json
W = {"city": "Paris"}
W2 = {"city": "Tokyo", "unit": "celsius"}
S = {"query": "café ☕ 東京 \"quoted\"", "filters": {"tags": ["a", {"b": [1, 2.5, None, True]}], "nested": {"x": "line\nbreak"}}}
def j(o): return json.dumps(o, ensure_ascii=False)
tools = [
 {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
 {"type": "function", "function": {"name": "search", "description": "Search documents",
   "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}, "required": ["query"]}}},
 {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm",
   "parameters": {"type": "object", "properties": {"hour": {"type": "integer"}, "loud": {"type": "boolean"}, "label": {"type": "string"}, "days": {"type": "array", "items": {"type": "string"}}}, "required": ["hour"]}}},
]
# typed arguments for the XML-like syntaxes (GLM, MiniMax): the string label "7" stays a string
A = {"hour": 7, "loud": True, "label": "7", "days": ["mon", "tue"]}
groups = []
def hermes(n, a): return "<tool_call>\n" + j({"name": n, "arguments": a}) + "\n</tool_call>"
groups.append({"format": "hermes", "templates": [
  "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
  "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "ibm-granite-granite-4.0.jinja",
  "ibm-granite-granite-4.1.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": hermes("get_weather", W)},
  {"name": "parallel", "text": hermes("get_weather", W) + "\n" + hermes("get_weather", W2)},
  {"name": "content_then_call", "text": "Let me check.\n" + hermes("get_weather", W)},
  {"name": "reasoning_call", "text": "<think>\nThe user wants the weather.\n</think>\n\n" + hermes("get_weather", W)},
  {"name": "nested_unicode", "text": hermes("search", S)},
  {"name": "compact", "text": "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>"},
  {"name": "truncated", "text": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"},
  {"name": "bad_json", "text": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {city: Paris}}\n</tool_call>"},
 ]})
def coder(n, a):
    s = "<tool_call>\n<function=" + n + ">\n"
    for k, v in a.items():
        s += "<parameter=" + k + ">\n" + (v if isinstance(v, str) else j(v)) + "\n</parameter>\n"
    return s + "</function>\n</tool_call>"
groups.append({"format": "qwen3_coder", "templates": ["Qwen3-Coder.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": coder("get_weather", W)},
  {"name": "parallel", "text": coder("get_weather", W) + "\n" + coder("get_weather", W2)},
  {"name": "content_then_call", "text": "Let me check.\n" + coder("get_weather", W)},
  {"name": "reasoning_call", "text": "<think>\nThe user wants the weather.\n</think>\n\n" + coder("get_weather", W)},
  {"name": "nested_unicode", "text": coder("search", S)},
  {"name": "truncated", "text": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"},
 ]})
T = "The user wants the weather.\n</think>\n\n"
groups.append({"format": "qwen3_coder_thinking", "templates": ["NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "Qwen3.5-4B.jinja"],
 "outputs": [
  {"name": "plain", "text": T + "It is sunny in Paris."},
  {"name": "one_call", "text": T + coder("get_weather", W)},
  {"name": "parallel", "text": T + coder("get_weather", W) + "\n" + coder("get_weather", W2)},
  {"name": "content_then_call", "text": T + "Let me check.\n" + coder("get_weather", W)},
  {"name": "nested_unicode", "text": T + coder("search", S)},
  {"name": "unclosed_thought", "text": "The user wants"},
 ]})
def l3(n, a): return j({"name": n, "parameters": a})
groups.append({"format": "llama3", "templates": ["meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": l3("get_weather", W)},
  {"name": "python_tag", "text": "<|python_tag|>" + l3("get_weather", W)},
  {"name": "type_function", "text": j({"type": "function", "name": "get_weather", "parameters": W})},
  {"name": "parallel", "text": l3("get_weather", W) + "; " + l3("get_weather", W2)},
  {"name": "nested_unicode", "text": l3("search", S)},
  {"name": "truncated", "text": "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par"},
 ]})
groups.append({"format": "mistral_nemo", "templates": ["mistralai-Mistral-Nemo-Instruct-2407.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": "[TOOL_CALLS]" + j([{"name": "get_weather", "arguments": W, "id": "abc123def"}])},
  {"name": "parallel", "text": "[TOOL_CALLS]" + j([{"name": "get_weather", "arguments": W, "id": "abc123def"}, {"name": "get_weather", "arguments": W2, "id": "xyz987uvw"}])},
  {"name": "content_then_call", "text": "Let me check.[TOOL_CALLS]" + j([{"name": "get_weather", "arguments": W, "id": "abc123def"}])},
  {"name": "nested_unicode", "text": "[TOOL_CALLS]" + j([{"name": "search", "arguments": S, "id": "abc123def"}])},
  {"name": "truncated", "text": "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"},
 ]})
groups.append({"format": "mistral_small", "templates": ["Mistral-Small-3.2-24B-Instruct-2506.jinja", "unsloth-mistral-Devstral-Small-2507.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": "[TOOL_CALLS]get_weather[ARGS]" + j(W)},

  {"name": "parallel", "text": "[TOOL_CALLS]get_weather[ARGS]" + j(W) + "[TOOL_CALLS]get_weather[ARGS]" + j(W2)},
  {"name": "content_then_call", "text": "Let me check.[TOOL_CALLS]get_weather[ARGS]" + j(W)},
  {"name": "nested_unicode", "text": "[TOOL_CALLS]search[ARGS]" + j(S)},
  {"name": "truncated", "text": "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par"},
 ]})
def ds(n, a): return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + n + "\n```json\n" + j(a) + "\n```<｜tool▁call▁end｜>"
def dsw(*c): return "<｜tool▁calls▁begin｜>" + "".join(c) + "<｜tool▁calls▁end｜>"
groups.append({"format": "deepseek_r1", "templates": ["llama-cpp-deepseek-r1.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"],
 "outputs": [
  {"name": "plain", "text": "Easy.\n</think>\n\nIt is sunny in Paris."},
  {"name": "one_call", "text": T + dsw(ds("get_weather", W))},
  {"name": "parallel", "text": T + dsw(ds("get_weather", W), ds("get_weather", W2))},
  {"name": "content_then_call", "text": T + "Let me check." + dsw(ds("get_weather", W))},
  {"name": "nested_unicode", "text": T + dsw(ds("search", S))},
  {"name": "truncated", "text": T + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Par"},
 ]})
def ds3(n, a): return "<｜tool▁call▁begin｜>" + n + "<｜tool▁sep｜>" + j(a) + "<｜tool▁call▁end｜>"
groups.append({"format": "deepseek_v3_1", "templates": ["deepseek-ai-DeepSeek-V3.1.jinja"],
 "outputs": [
  {"name": "plain", "text": "Easy.</think>It is sunny in Paris."},
  {"name": "one_call", "text": "Weather.</think>" + dsw(ds3("get_weather", W))},
  {"name": "parallel", "text": "Weather.</think>" + dsw(ds3("get_weather", W), ds3("get_weather", W2))},
  {"name": "content_then_call", "text": "Weather.</think>Let me check." + dsw(ds3("get_weather", W))},
  {"name": "nested_unicode", "text": "Search.</think>" + dsw(ds3("search", S))},
 ]})
def cr(*c): return "<|START_ACTION|>[\n" + ",\n".join("    " + j({"tool_call_id": str(i), "tool_name": n, "parameters": a}) for i, (n, a) in enumerate(c)) + "\n]<|END_ACTION|>"
groups.append({"format": "command_r7b", "templates": ["CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"],
 "outputs": [
  {"name": "plain", "text": "<|START_RESPONSE|>It is sunny in Paris.<|END_RESPONSE|>"},
  {"name": "one_call", "text": cr(("get_weather", W))},
  {"name": "parallel", "text": cr(("get_weather", W), ("get_weather", W2))},
  {"name": "reasoning_call", "text": "<|START_THINKING|>The user wants the weather.<|END_THINKING|>" + cr(("get_weather", W))},
  {"name": "nested_unicode", "text": cr(("search", S))},
 ]})
groups.append({"format": "functionary_v3_2", "templates": ["meetkai-functionary-medium-v3.2.jinja"],
 "outputs": [
  {"name": "plain", "text": "all\nIt is sunny in Paris."},
  {"name": "one_call", "text": "get_weather\n" + j(W)},
  {"name": "content_then_call", "text": "all\nLet me check.\n>>>get_weather\n" + j(W)},
  {"name": "parallel", "text": "get_weather\n" + j(W) + "\n>>>get_weather\n" + j(W2)},
  {"name": "nested_unicode", "text": "search\n" + j(S)},
 ]})
def oss(n, a): return "<|start|>assistant<|channel|>commentary to=functions." + n + " <|constrain|>json<|message|>" + j(a) + "<|call|>"
groups.append({"format": "gpt_oss", "templates": ["openai-gpt-oss-120b.jinja"],
 "outputs": [
  {"name": "plain", "text": "<|channel|>final<|message|>It is sunny in Paris."},
  {"name": "reasoning_plain", "text": "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny in Paris."},
  {"name": "one_call", "text": "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + j(W) + "<|call|>"},
  {"name": "reasoning_call", "text": "<|channel|>analysis<|message|>The user wants the weather.<|end|>" + oss("get_weather", W)},
  {"name": "recipient_in_role", "text": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + j(W) + "<|call|>"},
  {"name": "nested_unicode", "text": "<|channel|>analysis<|message|>Search.<|end|>" + oss("search", S)},
 ]})
# gpt-oss without tools: the Harmony channels still split into reasoning and content
groups.append({"format": "gpt_oss_no_tools", "no_tools": True, "templates": ["openai-gpt-oss-120b.jinja"],
 "outputs": [
  {"name": "plain", "text": "<|channel|>final<|message|>It is sunny in Paris."},
  {"name": "reasoning_plain", "text": "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny in Paris."},
  {"name": "two_thoughts", "text": "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|><|start|>assistant<|channel|>final<|message|>Done."},
  {"name": "preamble", "text": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Working on it.<|end|><|start|>assistant<|channel|>final<|message|>Done."},
  {"name": "stray_commentary", "text": "<|channel|>commentary<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done."},
  {"name": "unclosed_thought", "text": "<|channel|>analysis<|message|>The user wants"},
  {"name": "unsolicited_call", "text": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + j(W) + "<|end|>"},
  {"name": "bare_text", "text": "It is sunny in Paris."},
 ]})
def xml_val(v): return v if isinstance(v, str) else j(v)
def glm(n, a, nl):
    sep = "\n" if nl else ""
    s = "<tool_call>" + n + sep
    for k, v in a.items():
        s += "<arg_key>" + k + "</arg_key>" + sep + "<arg_value>" + xml_val(v) + "</arg_value>" + sep
    return s + "</tool_call>"
groups.append({"format": "glm_4_6", "templates": ["GLM-4.6.jinja"],
 "outputs": [
  {"name": "plain", "text": "<think>Easy.</think>\nIt is sunny in Paris."},
  {"name": "one_call", "text": "<think></think>\n" + glm("get_weather", W, True)},
  {"name": "parallel", "text": "<think></think>\n" + glm("get_weather", W, True) + "\n" + glm("get_weather", W2, True)},
  {"name": "content_then_call", "text": "<think></think>\nLet me check.\n" + glm("get_weather", W, True)},
  {"name": "reasoning_call", "text": "<think>The user wants the weather.</think>\n" + glm("get_weather", W, True)},
  {"name": "nested_unicode", "text": "<think></think>\n" + glm("search", S, True)},
  {"name": "typed", "text": "<think></think>\n" + glm("set_alarm", A, True)},
  {"name": "truncated", "text": "<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"},
 ]})
groups.append({"format": "glm_4_7",
 "templates": ["GLM-4.7-Flash.jinja", "Spark2.5.jinja", "poolside-Laguna-S-2.1.jinja"],
 "outputs": [
  {"name": "plain", "text": "Easy.</think>It is sunny in Paris."},
  {"name": "one_call", "text": "Weather.</think>" + glm("get_weather", W, False)},
  {"name": "parallel", "text": "Weather.</think>" + glm("get_weather", W, False) + glm("get_weather", W2, False)},
  {"name": "content_then_call", "text": "Weather.</think>Let me check." + glm("get_weather", W, False)},
  {"name": "nested_unicode", "text": "Search.</think>" + glm("search", S, False)},
  {"name": "typed", "text": "Alarm.</think>" + glm("set_alarm", A, False)},
  {"name": "truncated", "text": "Weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Par"},
 ]})
def kimi(*c): return "<|tool_calls_section_begin|>" + "".join("<|tool_call_begin|>functions." + n + ":" + str(i) + "<|tool_call_argument_begin|>" + j(a) + "<|tool_call_end|>" for i, (n, a) in enumerate(c)) + "<|tool_calls_section_end|>"
groups.append({"format": "kimi_k2", "templates": ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": kimi(("get_weather", W))},
  {"name": "parallel", "text": kimi(("get_weather", W), ("get_weather", W2))},
  {"name": "content_then_call", "text": "Let me check." + kimi(("get_weather", W))},
  {"name": "reasoning_call", "text": "<think>The user wants the weather.</think>" + kimi(("get_weather", W))},
  {"name": "nested_unicode", "text": kimi(("search", S))},
  {"name": "no_section", "text": "<|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>" + j(W) + "<|tool_call_end|>"},
  {"name": "truncated", "text": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Par"},
 ]})
def mm(*c):
    s = "<minimax:tool_call>\n"
    for n, a in c:
        s += "<invoke name=\"" + n + "\">\n"
        for k, v in a.items():
            s += "<parameter name=\"" + k + "\">" + xml_val(v) + "</parameter>\n"
        s += "</invoke>\n"
    return s + "</minimax:tool_call>"
groups.append({"format": "minimax_m2", "templates": ["MiniMax-M2.jinja"],
 "outputs": [
  {"name": "plain", "text": "Easy.\n</think>\n\nIt is sunny in Paris."},
  {"name": "one_call", "text": T + mm(("get_weather", W))},
  {"name": "parallel", "text": T + mm(("get_weather", W), ("get_weather", W2))},
  {"name": "content_then_call", "text": T + "Let me check.\n" + mm(("get_weather", W))},
  {"name": "nested_unicode", "text": T + mm(("search", S))},
  {"name": "typed", "text": T + mm(("set_alarm", A))},
  {"name": "truncated", "text": T + "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Par"},
 ]})
def g4v(v):
    if isinstance(v, str): return '<|"|>' + v + '<|"|>'
    if isinstance(v, bool): return "true" if v else "false"
    if v is None: return "null"
    if isinstance(v, dict): return "{" + ",".join(k + ":" + g4v(x) for k, x in v.items()) + "}"
    if isinstance(v, list): return "[" + ",".join(g4v(x) for x in v) + "]"
    return j(v)
def g4(n, a): return "<|tool_call>call:" + n + g4v(a) + "<tool_call|>"
G4T = "<|channel>thought\nThe user wants the weather.<channel|>"
groups.append({"format": "gemma4", "templates": ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "reasoning_plain", "text": G4T + "It is sunny in Paris."},
  {"name": "one_call", "text": g4("get_weather", W)},
  {"name": "parallel", "text": g4("get_weather", W) + g4("get_weather", W2)},
  {"name": "content_then_call", "text": "Let me check." + g4("get_weather", W)},
  {"name": "reasoning_call", "text": G4T + g4("get_weather", W)},
  {"name": "nested_unicode", "text": g4("search", S)},
  {"name": "typed", "text": g4("set_alarm", A)},
  {"name": "spaced", "text": "<|tool_call>call:get_weather{ city: <|\"|>Tokyo<|\"|>, unit: <|\"|>celsius<|\"|> }<tool_call|>"},
  {"name": "empty_args", "text": "<|tool_call>call:get_weather{}<tool_call|>"},
  {"name": "call_then_text", "text": g4("get_weather", W) + "Done."},
  {"name": "unknown_tool", "text": "Let me see." + g4("get_time", W)},
  {"name": "truncated", "text": "<|tool_call>call:get_weather{city:<|\"|>Par"},
 ]})
def py(v):
    if isinstance(v, str): return "\"" + v.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") + "\""
    return j(v)
def lfm(*c, q=py): return "<|tool_call_start|>[" + ", ".join(n + "(" + ", ".join(k + "=" + q(v) for k, v in a.items()) + ")" for n, a in c) + "]<|tool_call_end|>"
def pyq(v):
    if isinstance(v, str): return "'" + v.replace("'", "\\'") + "'"
    if isinstance(v, bool): return "True" if v else "False"
    return j(v)
LFM = [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": lfm(("get_weather", W))},
  {"name": "parallel", "text": lfm(("get_weather", W), ("get_weather", W2))},
  {"name": "content_then_call", "text": "Let me check." + lfm(("get_weather", W))},
  {"name": "nested_unicode", "text": lfm(("search", S))},
  {"name": "typed", "text": lfm(("set_alarm", A))},
  {"name": "python_literals", "text": lfm(("set_alarm", {"hour": 7, "loud": False, "label": "it's", "days": ["mon"]}), q=pyq)},
  {"name": "python_dict", "text": "<|tool_call_start|>[search(query='x', filters={'a': True, 'b': None, 'c': \"d\"})]<|tool_call_end|>"},
  {"name": "call_then_text", "text": lfm(("get_weather", W)) + "Done."},
  {"name": "unknown_tool", "text": "<|tool_call_start|>[get_time(city=\"Paris\")]<|tool_call_end|>"},
  {"name": "truncated", "text": "<|tool_call_start|>[get_weather(city=\"Par"},
]
groups.append({"format": "lfm2", "templates": ["LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja"], "outputs": LFM})
groups.append({"format": "lfm2_thinking", "templates": ["LFM2.5-8B-A1B.jinja"], "outputs": LFM + [
  {"name": "reasoning_call", "text": "<think>The user wants the weather.</think>" + lfm(("get_weather", W))},
  {"name": "reasoning_plain", "text": "<think>Easy.</think>It is sunny in Paris."},
 ]})
def fv31(n, a): return "<function=" + n + ">" + j(a) + "</function>"
groups.append({"format": "functionary_v3_1", "templates": ["meetkai-functionary-medium-v3.1.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "one_call", "text": fv31("get_weather", W)},
  {"name": "parallel", "text": fv31("get_weather", W) + "\n" + fv31("get_weather", W2)},
  {"name": "content_then_call", "text": "Let me check.\n" + fv31("get_weather", W)},
  {"name": "nested_unicode", "text": fv31("search", S)},
  {"name": "python_tag", "text": "<|python_tag|>print(\"hi\")"},
  {"name": "truncated", "text": "<function=get_weather>{\"city\": \"Par"},
  {"name": "text_after", "text": fv31("get_weather", W) + " Done."},
  {"name": "bad_json", "text": "<function=get_weather>{city: Paris}</function>"},
 ]})
def gr(*c): return "<|tool_call|>" + j([{"name": n, "arguments": a} for n, a in c])
groups.append({"format": "granite_3_3", "templates": ["ibm-granite-granite-3.3-2B-Instruct.jinja"],
 "outputs": [
  {"name": "plain", "text": "It is sunny in Paris."},
  {"name": "reasoning_plain", "text": "<think>Easy.</think><response>It is sunny in Paris.</response>"},
  {"name": "one_call", "text": gr(("get_weather", W))},
  {"name": "parallel", "text": gr(("get_weather", W), ("get_weather", W2))},
  {"name": "content_then_call", "text": "Let me check." + gr(("get_weather", W))},
  {"name": "nested_unicode", "text": gr(("search", S))},
 ]})
doc = {"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "tools": tools, "groups": groups}
import sys
json.dump(doc, open(sys.argv[1] if len(sys.argv) > 1 else "tests/data/toolcall/outputs.json", "w"), ensure_ascii=False, indent=1)
