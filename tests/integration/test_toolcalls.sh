#!/usr/bin/env bash
# test_toolcalls: tool calls through `kgen batch` on a random-weight model with a Hermes-style chat
# template (Qwen2.5's, `kgen mkmodel --chat-template qwen2.5`), at temperature 1 (no broker).
#   - 200 jobs with tools and tool_choice "required" (one call each, or parallel calls): every job
#     finishes "tool_calls" (or "length", whose last call may be cut), every call names one of the
#     job's tools and, but for a cut last call, its arguments (a JSON string) validate against that
#     tool's parameters with python3-jsonschema; ids are unique within a job.
#   - 40 jobs naming a function: every call is that function's, valid.
#   - 10 jobs with n = 2: each choice carries its own calls (ids apart), valid.
#   - 100 jobs with tool_choice auto: the model's <tool_call> token (a user-defined token of the
#     model's vocabulary, as in Qwen's) starts a lazy grammar, so every call a job ends with is
#     valid; the others answer text with no calls.
#   - OpenAI Batch lines with tools (`--output-format openai`): message.tool_calls in OpenAI's
#     shape, content null beside them, finish_reason "tool_calls".
#   - a conversation with an assistant's tool calls and the tool's result renders through the
#     template (kgen render) with the call and the result in it.
#   - refusals: required without tools, a named function that is not a tool, required on a model
#     whose template has no call syntax (invalid_job, each naming the field).
#   - 40 required jobs on a random glm4moe model with GLM-4.6's own template (`--chat-template
#     glm4.6`): the tagged syntax (<arg_key>/<arg_value>), constrained one parameter at a time;
#     every finished call's arguments (typed back into JSON by the schema) validate.
#   - 40 required jobs on a random gemma4 model with Gemma 4's own template: its keyed syntax
#     (key:value, <|"|> strings), typed back into JSON; every finished call validates.
#   - 60 auto jobs on a random model with Mistral Nemo's template, [TOOL_CALLS] a control token:
#     the lazy grammar starts after it, the marker is kept in the text for the parse, and every
#     finished call validates.
#   - gpt-oss (Harmony) with its own template (llama.cpp's openai-gpt-oss-120b.jinja, through
#     `kgen mkmodel --chat-template-file`) on a random gpt-oss model: 40 required jobs (every
#     finished call valid), and 60 streamed auto jobs through kgen-worker on the mock cluster,
#     the lazy grammar started by a text trigger inside the call's header (` to` after the
#     prompt's `<|start|>assistant`, biased up so that about half call): every finished call
#     valid, and every token event says its part (headers reasoning, a call's arguments and a
#     final answer the answer's; the answer tokens join to the text, or to the arguments).
#   - Functionary v3.2 with its own template on a random llama model, tool_choice auto: one
#     grammar from the first token, `all` and free text or a call; both come (texts without
#     calls, calls valid against their schemas).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup toolcalls
bin=$KG_BIN
tmp=$T
templates=$KG_SRC/tests/data/chat/jinja/templates

"$bin/kgen" mkmodel --out "$tmp/m.gguf" --arch qwen2 --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --n-ff 128 --seed 11 --chat-template qwen2.5 >/dev/null
"$bin/kgen" mkmodel --out "$tmp/plain.gguf" --arch qwen2 --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --n-ff 128 --seed 11 --chat-template chatml >/dev/null

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
T = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"],
        "additionalProperties": False}},
    {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 12},
        "limit": {"type": "integer", "minimum": 1, "maximum": 20},
        "filters": {"type": "object", "properties": {
            "lang": {"type": "string", "pattern": "^[a-z]{2}$"},
            "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 6}}},
            "required": ["lang"]}},
        "required": ["query", "limit"]}},
    {"name": "book", "parameters": {"type": "object", "properties": {
        "day": {"type": "string", "format": "date"},
        "seats": {"type": "integer", "minimum": 1, "maximum": 8},
        "vip": {"type": "boolean"}}, "required": ["day", "seats", "vip"]}},
    {"name": "ping", "parameters": {"type": "object", "properties": {}}},
]
tools = [{"type": "function", "function": t} for t in T]
jobs = []
for i in range(200):
    k = 1 + i % 4  # 1..4 tools offered
    jobs.append({"request_id": f"r{i}", "messages": [{"role": "user", "content": f"task {i}"}],
                 "tools": tools[:k], "tool_choice": "required",
                 "parallel_tool_calls": i % 5 == 0, "max_tokens": 160, "temperature": 1.0})
for i in range(40):
    name = T[i % 3]["name"]
    jobs.append({"request_id": f"n{i}", "messages": [{"role": "user", "content": f"named {i}"}],
                 "tools": tools, "tool_choice": {"type": "function", "function": {"name": name}},
                 "max_tokens": 160, "temperature": 1.0})
for i in range(10):
    jobs.append({"request_id": f"c{i}", "messages": [{"role": "user", "content": f"two {i}"}],
                 "tools": tools, "tool_choice": "required", "parallel_tool_calls": False,
                 "n": 2, "max_tokens": 160, "temperature": 1.0})
for i in range(100):
    jobs.append({"request_id": f"a{i}", "messages": [{"role": "user", "content": f"auto {i}"}],
                 "tools": tools[:3], "max_tokens": 200, "temperature": 1.0})
with open(f"{tmp}/jobs.jsonl", "w") as f:
    for j in jobs:
        f.write(json.dumps(j) + "\n")
with open(f"{tmp}/openai.jsonl", "w") as f:
    for i in range(3):
        f.write(json.dumps({"custom_id": f"o{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                                     "tool_choice": "required", "parallel_tool_calls": False,
                                     "max_tokens": 160}}) + "\n")
bad = [
    ("b0", {"tool_choice": "required"}, "tool_choice: \"required\" needs tools"),
    ("b1", {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice: \"nope\" is not one of the tools"),
]
with open(f"{tmp}/bad.jsonl", "w") as f:
    for rid, extra, _ in bad:
        f.write(json.dumps({"request_id": rid, "messages": [{"role": "user", "content": "x"}], **extra}) + "\n")
json.dump({r: m for r, _, m in bad}, open(f"{tmp}/bad.want", "w"))
json.dump({"request_id": "p0", "messages": [{"role": "user", "content": "x"}], "tools": tools,
           "tool_choice": "required"}, open(f"{tmp}/plain.json", "w"))
json.dump({"request_id": "c0", "tools": tools, "messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"t\": 21}"}]},
    open(f"{tmp}/conv.json", "w"))
json.dump(T, open(f"{tmp}/tools.json", "w"))
PY

"$bin/kgen" batch --model "$tmp/m.gguf" --input "$tmp/jobs.jsonl" --output "$tmp/out.jsonl" \
    2>"$tmp/batch.log"
"$bin/kgen" batch --model "$tmp/m.gguf" --input "$tmp/openai.jsonl" --output "$tmp/openai.out" \
    --output-format openai --error-file "$tmp/openai.err" 2>>"$tmp/batch.log"
"$bin/kgen" batch --model "$tmp/m.gguf" --input "$tmp/bad.jsonl" --output "$tmp/bad.out" \
    2>>"$tmp/batch.log"
"$bin/kgen" batch --model "$tmp/plain.gguf" --input "$tmp/plain.json" --output "$tmp/plain.out" \
    2>>"$tmp/batch.log"
"$bin/kgen" render --model "$tmp/m.gguf" <"$tmp/conv.json" >"$tmp/conv.prompt"

python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/tools.json"))}
checker = jsonschema.FormatChecker()
jobs = {}
for line in open(f"{tmp}/jobs.jsonl"):
    j = json.loads(line)
    jobs[j["request_id"]] = j
done = {}
for line in open(f"{tmp}/out.jsonl"):
    e = json.loads(line)
    if e["type"] == "error":
        sys.exit(f"{e['request_id']}: error {e['code']}: {e['message']}")
    if e["type"] == "done":
        done[e["request_id"]] = e
assert set(done) == set(jobs), set(jobs) - set(done)
n_calls = n_cut = n_parallel = n_auto_calls = 0
for rid, e in done.items():
    job = jobs[rid]
    offered = {t["function"]["name"] for t in job["tools"]}
    if job.get("n", 1) > 1:
        # each choice its own calls, ids apart across choices; the top level is choice 0's
        assert len(e["choices"]) == 2 and e["tool_calls"] == e["choices"][0]["tool_calls"], rid
        ids = [c["id"] for ch in e["choices"] for c in ch["tool_calls"]]
        assert len(set(ids)) == len(ids), ids
        for ch in e["choices"][1:]:
            assert ch["finish_reason"] in ("tool_calls", "length"), ch
            for c in ch["tool_calls"]:
                if ch["finish_reason"] == "tool_calls":
                    jsonschema.validate(json.loads(c["function"]["arguments"]),
                                        T[c["function"]["name"]], format_checker=checker)
                    n_calls += 1
    calls = e.get("tool_calls", [])
    fr = e["finish_reason"]
    if "tool_choice" not in job:
        # auto: text, or calls constrained from their opening marker on (the lazy grammar)
        n_auto_calls += fr == "tool_calls"
        assert (fr == "tool_calls") == (fr != "length" and bool(calls)), (rid, fr, calls)
        for i, c in enumerate(calls):
            if fr == "length" and i == len(calls) - 1:
                continue  # may be cut
            jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]],
                                format_checker=checker)
            n_calls += 1
        continue
    assert fr in ("tool_calls", "length"), (rid, fr, e["text"][:200])
    assert calls, (rid, fr, e["text"][:200])
    assert len({c["id"] for c in calls}) == len(calls), rid
    if not job.get("parallel_tool_calls", True):
        assert len(calls) == 1, (rid, len(calls))
    n_parallel += len(calls) > 1
    if isinstance(job["tool_choice"], dict):
        offered = {job["tool_choice"]["function"]["name"]}
    for i, c in enumerate(calls):
        assert c["type"] == "function" and c["id"].startswith("call_"), c
        name = c["function"]["name"]
        assert name in offered, (rid, name, offered)
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            # only the last call of a job cut by max_tokens may be unfinished
            assert fr == "length" and i == len(calls) - 1, (rid, c)
            n_cut += 1
            continue
        jsonschema.validate(args, T[name], format_checker=checker)
        n_calls += 1
    if fr == "tool_calls":
        assert e["text"] == "", (rid, e["text"][:100])
finished = sum(e["finish_reason"] == "tool_calls" for e in done.values()) - n_auto_calls
assert finished >= 200, f"only {finished} of {len(done) - 100} required jobs ended with calls"
assert n_auto_calls >= 5, f"only {n_auto_calls} of 100 auto jobs called"
print(f"{len(done)} jobs: {n_calls} calls valid against their schemas, {n_cut} cut by max_tokens, "
      f"{finished} required jobs finished tool_calls, {n_parallel} with parallel calls, "
      f"{n_auto_calls} of 100 auto jobs called")

for line in open(f"{tmp}/openai.out"):
    o = json.loads(line)
    ch = o["response"]["body"]["choices"][0]
    m = ch["message"]
    assert ch["finish_reason"] == "tool_calls", ch
    assert m["content"] is None and len(m["tool_calls"]) == 1, m
    c = m["tool_calls"][0]
    assert set(c) == {"id", "type", "function"} and set(c["function"]) == {"name", "arguments"}, c
    jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]],
                        format_checker=checker)

want = json.load(open(f"{tmp}/bad.want"))
got = {}
for line in open(f"{tmp}/bad.out"):
    e = json.loads(line)
    got[e["request_id"]] = (e["code"], e["message"])
for rid, msg in want.items():
    assert got[rid][0] == "invalid_job" and got[rid][1].startswith(msg), (rid, got[rid])
e = json.loads(open(f"{tmp}/plain.out").readline())
assert e["type"] == "error" and e["code"] == "invalid_job" and "no tool-call syntax" in e["message"], e

prompt = open(f"{tmp}/conv.prompt").read()
assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt, prompt
assert '<tool_response>\n{"t": 21}\n</tool_response>' in prompt, prompt
assert '"name": "search"' in prompt, prompt
print("openai lines, refusals and the tool conversation's render: ok")
PY

# GLM's tagged calls: required, through the template's own syntax, typed back by the schema
"$bin/kgen" mkmodel --out "$tmp/glm.gguf" --arch glm4moe --n-layer 2 --n-ff-exp 64 --n-expert 8 \
    --n-expert-used 2 --n-expert-groups 4 --n-group-used 2 --n-embd 64 --n-head 4 --n-head-kv 2 \
    --n-ff 128 --seed 3 --chat-template glm4.6 >/dev/null
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
# string-typed parameters are free text in a tagged grammar: no string keywords here
T = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days"]}},
     {"name": "book", "parameters": {"type": "object", "properties": {
        "seats": {"type": "integer", "minimum": 1, "maximum": 8}, "vip": {"type": "boolean"},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "integer"}}},
        "required": ["seats", "vip"]}},
     {"name": "ping", "parameters": {"type": "object", "properties": {}}}]
json.dump(T, open(f"{tmp}/glm-tools.json", "w"))
with open(f"{tmp}/glm.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"request_id": f"g{i}", "messages": [{"role": "user", "content": f"task {i}"}],
                            "tools": [{"type": "function", "function": t} for t in T],
                            "tool_choice": "required", "parallel_tool_calls": i % 4 == 0,
                            "max_tokens": 120, "temperature": 1.0}) + "\n")
PY
"$bin/kgen" batch --model "$tmp/glm.gguf" --input "$tmp/glm.jsonl" --output "$tmp/glm.out" \
    2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/glm-tools.json"))}
n_done = n_calls = 0
for line in open(f"{tmp}/glm.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    fr, calls = e["finish_reason"], e.get("tool_calls", [])
    assert fr in ("tool_calls", "length"), (e["request_id"], fr)
    n_done += fr == "tool_calls"
    for i, c in enumerate(calls):
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        n_calls += 1
assert n_done >= 15, f"only {n_done} of 40 GLM jobs ended with calls"
print(f"GLM: {n_done} of 40 required jobs finished tool_calls, {n_calls} calls valid")
PY

# Gemma 4's keyed calls: required, through its own syntax (key:value pairs, strings in <|"|>
# quotes), typed back into JSON; its strings are free text and its objects its own syntax, so the
# schemas here constrain the scalars
"$bin/kgen" mkmodel --out "$tmp/g4.gguf" --arch gemma4 --n-embd 64 --n-head 4 --n-head-kv 2 \
    --n-ff 128 --n-layer 4 --swa-pattern 2 \
    --sliding-window 8 --n-embd-per-layer 16 --n-kv-shared 2 --seed 5 --chat-template gemma4 \
    >/dev/null
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
T = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"}}, "required": ["city", "days"]}},
     {"name": "book", "parameters": {"type": "object", "properties": {
        "seats": {"type": "integer", "minimum": 1, "maximum": 8}, "price": {"type": "number"},
        "extra": {"type": "object"}}, "required": ["seats"]}},
     {"name": "ping", "parameters": {"type": "object", "properties": {}}}]
json.dump(T, open(f"{tmp}/g4-tools.json", "w"))
with open(f"{tmp}/g4.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"request_id": f"m{i}", "messages": [{"role": "user", "content": f"task {i}"}],
                            "tools": [{"type": "function", "function": t} for t in T],
                            "tool_choice": "required", "parallel_tool_calls": i % 4 == 0,
                            "max_tokens": 120, "temperature": 1.0}) + "\n")
PY
"$bin/kgen" batch --model "$tmp/g4.gguf" --input "$tmp/g4.jsonl" --output "$tmp/g4.out" \
    2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/g4-tools.json"))}
n_done = n_calls = 0
for line in open(f"{tmp}/g4.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    fr, calls = e["finish_reason"], e.get("tool_calls", [])
    assert fr in ("tool_calls", "length"), (e["request_id"], fr, e.get("text"))
    n_done += fr == "tool_calls"
    for i, c in enumerate(calls):
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        n_calls += 1
assert n_done >= 15, f"only {n_done} of 40 Gemma 4 jobs ended with calls"
print(f"Gemma 4: {n_done} of 40 required jobs finished tool_calls, {n_calls} calls valid")
PY

# Mistral Nemo's auto calls: [TOOL_CALLS] is a control token of the vocabulary (as in Mistral's
# tekken), so the lazy grammar starts after it and the token is written into the text (a kept
# marker) for the parse; it is the vocabulary's last token, biased up so that most jobs call
mn_vocab=$("$bin/kgen" mkmodel --out "$tmp/mn.gguf" --arch qwen2 --n-embd 64 --n-layer 2 \
    --n-head 4 --n-head-kv 2 --n-ff 128 --seed 11 --chat-template mistral-nemo |
    sed -n 's/.* n_vocab=\([0-9]*\) .*/\1/p')
python3 - "$tmp" "$((mn_vocab - 1))" <<'PY'
import json, sys
tmp, marker = sys.argv[1], sys.argv[2]
T = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}},
     {"name": "ping", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}]
json.dump(T, open(f"{tmp}/mn-tools.json", "w"))
with open(f"{tmp}/mn.jsonl", "w") as f:
    for i in range(60):
        f.write(json.dumps({"request_id": f"n{i}", "messages": [{"role": "user", "content": f"auto {i}"}],
                            "tools": [{"type": "function", "function": t} for t in T],
                            "max_tokens": 100, "temperature": 1.0, "logit_bias": {marker: 2}}) + "\n")
PY
"$bin/kgen" batch --model "$tmp/mn.gguf" --input "$tmp/mn.jsonl" --output "$tmp/mn.out" \
    2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/mn-tools.json"))}
n_called = n_calls = 0
for line in open(f"{tmp}/mn.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    fr, calls = e["finish_reason"], e.get("tool_calls", [])
    assert "[TOOL_CALLS]" not in e["text"], e  # a call's marker never stays in the text
    n_called += fr == "tool_calls"
    for i, c in enumerate(calls):
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        n_calls += 1
assert n_called >= 5, f"only {n_called} of 60 Mistral auto jobs called"
print(f"Mistral Nemo auto: {n_called} of 60 jobs finished tool_calls, {n_calls} calls valid")
PY

# gpt-oss: Harmony's markers are tokens of its vocabulary, its call header text between them
"$bin/kgen" mkmodel --out "$tmp/oss.gguf" --arch gpt-oss --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --n-ff 64 --n-expert 4 --n-expert-used 2 --seed 7 \
    --chat-template-file "$templates/openai-gpt-oss-120b.jinja" >/dev/null
to_id=$(printf ' to' | "$bin/kgen" tokenize --model "$tmp/oss.gguf" --no-bos)
[[ "$to_id" =~ ^[0-9]+$ ]] || kg_fail "' to' is not one token of the gpt-oss vocabulary: $to_id"
python3 - "$tmp" "$to_id" <<'PY'
import json, sys
tmp, to_id = sys.argv[1], sys.argv[2]
T = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}},
     {"name": "ping", "parameters": {"type": "object", "properties": {},
                                      "additionalProperties": False}}]
json.dump(T, open(f"{tmp}/oss-tools.json", "w"))
tools = [{"type": "function", "function": t} for t in T]
with open(f"{tmp}/oss-required.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"request_id": f"q{i}", "messages": [{"role": "user", "content": f"task {i}"}],
                            "tools": tools, "tool_choice": "required", "max_tokens": 100,
                            "temperature": 1.0}) + "\n")
# auto: ` to` right after the prompt's <|start|>assistant opens a call whose recipient is in the
# role header (llama.cpp's trigger `^\s+to$`); biased up so that about half the jobs open one
with open(f"{tmp}/jobs.jsonl", "w") as f:
    for i in range(60):
        f.write(json.dumps({"request_id": f"h{i}", "messages": [{"role": "user", "content": f"auto {i}"}],
                            "tools": tools, "max_tokens": 100, "temperature": 1.0,
                            "logit_bias": {to_id: 6}}) + "\n")
PY
"$bin/kgen" batch --model "$tmp/oss.gguf" --input "$tmp/oss-required.jsonl" \
    --output "$tmp/oss-required.out" 2>>"$tmp/batch.log"
kg_bg worker "$bin/kgen-worker" --demo 0 --model "$tmp/oss.gguf" --http-port 0 --threads 2
kg_wait_log "$T/worker.log" 'partitions assigned' 60
BROKERS=$(sed -n 's/.*mock cluster up.* brokers=\([^ ]*\).*/\1/p' "$T/worker.log" | head -n 1)
JOBS=kgen.jobs
RESULTS=kgen.results
kg_submit_timed 120
kg_stop_pid "$(kg_pid worker)" 10
python3 - "$tmp" <<'PY'
import collections, json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/oss-tools.json"))}
def valid_calls(e):
    fr, calls = e["finish_reason"], e.get("tool_calls", [])
    n = 0
    for i, c in enumerate(calls):
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        n += 1
    return n
n_req = n_req_calls = 0
for line in open(f"{tmp}/oss-required.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    assert e["finish_reason"] in ("tool_calls", "length"), (e["request_id"], e["finish_reason"])
    n_req += e["finish_reason"] == "tool_calls"
    n_req_calls += valid_calls(e)
assert n_req >= 30, f"only {n_req} of 40 gpt-oss required jobs ended with calls"
done, toks = {}, collections.defaultdict(list)
for e in map(json.loads, open(f"{tmp}/events.jsonl")):
    if e["type"] == "token":
        toks[e["request_id"]].append(e)
    elif e["type"] == "done":
        done[e["request_id"]] = e
    else:
        sys.exit(f"{e['request_id']}: {e}")
assert len(done) == 60, len(done)
n_called = n_calls = n_joined = 0
for rid, e in done.items():
    n_calls += valid_calls(e)
    calls = e.get("tool_calls", [])
    n_called += e["finish_reason"] == "tool_calls"
    ts = toks[rid]
    assert [t["index"] for t in ts] == list(range(len(ts))), rid
    assert all(t.get("part") in ("reasoning", "answer") for t in ts), (rid, ts[:3])
    part = {p: "".join(t["text"] for t in ts if t["part"] == p) for p in ("reasoning", "answer")}
    if calls:
        # the header is markup (reasoning), the arguments the answer's (cut or whole)
        c = calls[0]["function"]
        assert part["reasoning"].startswith(" to=functions." + c["name"]), (rid, part)
        assert part["reasoning"].endswith("<|message|>"), (rid, part)
        assert part["answer"] == e["text"] + c["arguments"], (rid, part, e["text"])
        n_joined += 1
    elif not any(e["text"].startswith(h) for h in ("<|channel|>", " to=")) and "reasoning" not in e:
        # not in channels: all answer, joined to the text
        assert part["reasoning"] == "" and part["answer"] == e["text"], (rid, part)
        n_joined += 1
assert n_called >= 10, f"only {n_called} of 60 gpt-oss auto jobs called"
assert n_joined >= 40, f"only {n_joined} of 60 gpt-oss streams checked"
print(f"gpt-oss: {n_req} of 40 required jobs finished tool_calls ({n_req_calls} calls valid); "
      f"auto through kgen-worker: {n_called} of 60 called, {n_calls} calls valid, "
      f"token parts checked on {n_joined} streams")
PY
# reasoning_format none (llama.cpp's parser with reasoning extraction off): the same 60 auto jobs
# (the same seeds, so the same tokens) give the same calls and no reasoning field, and keep any
# analysis message in the text, markers and all
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    j["reasoning_format"] = "none"
    print(json.dumps(j))' "$tmp/jobs.jsonl" >"$tmp/oss-none.jsonl"
"$bin/kgen" batch --model "$tmp/oss.gguf" --input "$tmp/oss-none.jsonl" --output "$tmp/oss-none.out" \
    --threads 2 2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
split = {e["request_id"]: e for e in map(json.loads, open(f"{tmp}/events.jsonl")) if e["type"] == "done"}
n_kept = 0
for e in map(json.loads, open(f"{tmp}/oss-none.out")):
    rid, s = e["request_id"], split[e["request_id"]]
    assert e["type"] == "done" and "reasoning" not in e, (rid, e)
    assert e.get("tool_calls", []) == s.get("tool_calls", []), (rid, e, s)
    if "reasoning" in s:
        assert f"<|channel|>analysis<|message|>{s['reasoning']}" in e["text"], (rid, e["text"], s)
        n_kept += 1
    else:
        assert e["text"] == s["text"], (rid, e["text"], s["text"])
# (a random model seldom writes an analysis header: check_toolcall's test_keep_reasoning holds
# the kept text; this run holds the job field's way to the parser and the calls beside it)
print(f"gpt-oss reasoning_format none: 60 jobs, their calls as before, {n_kept} analysis messages kept in the text")
PY

# Functionary v3.2: the generation prompt ends in ">>>"; the model names a recipient, `all` (free
# text) or a tool (its JSON arguments), held by one grammar from the first token
"$bin/kgen" mkmodel --out "$tmp/fn.gguf" --arch llama --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --n-ff 128 --seed 5 \
    --chat-template-file "$templates/meetkai-functionary-medium-v3.2.jinja" >/dev/null
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
T = json.load(open(f"{tmp}/oss-tools.json"))
with open(f"{tmp}/fn.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"request_id": f"f{i}", "messages": [{"role": "user", "content": f"auto {i}"}],
                            "tools": [{"type": "function", "function": t} for t in T],
                            "max_tokens": 80, "temperature": 1.0}) + "\n")
PY
"$bin/kgen" render --model "$tmp/fn.gguf" <<<'{"request_id": "r", "messages": [{"role": "user", "content": "x"}], "tools": []}' |
    tail -c 3 | grep -q '>>>' || kg_fail "Functionary's generation prompt does not end in >>>"
"$bin/kgen" batch --model "$tmp/fn.gguf" --input "$tmp/fn.jsonl" --output "$tmp/fn.out" \
    2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/oss-tools.json"))}
n_text = n_called = n_calls = 0
for line in open(f"{tmp}/fn.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    fr, calls = e["finish_reason"], e.get("tool_calls", [])
    if not calls:
        # free text: the `all` recipient line is the syntax's, not the answer's
        assert fr in ("stop", "length") and not e["text"].startswith("all"), (e["request_id"], e)
        n_text += 1
        continue
    assert fr in ("tool_calls", "length") and e["text"] == "", (e["request_id"], e)
    n_called += fr == "tool_calls"
    for i, c in enumerate(calls):
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        n_calls += 1
assert n_text >= 5 and n_called >= 5, f"Functionary: {n_text} texts, {n_called} calls of 40"
print(f"Functionary v3.2 auto: {n_text} of 40 answered text, {n_called} called, "
      f"{n_calls} calls valid")
PY

# Functionary v3.1: a Llama 3.1 template that teaches <function=NAME>{...}</function>. Required
# and named jobs: the call grammar from the first token. Auto jobs: free text until the text
# holds `<function=` (a text trigger: no token opens the call), the grammar from its first byte.
# On a random qwen2 model, whose built-in vocabulary gains `<function=` as a user-defined text
# token for this template, so that a random model writes it at all (in one piece: the trigger is
# matched on the text, however the tokens split it).
"$bin/kgen" mkmodel --out "$tmp/fv31.gguf" --arch qwen2 --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --n-ff 128 --seed 9 \
    --chat-template-file "$templates/meetkai-functionary-medium-v3.1.jinja" >/dev/null
open_id=$(printf '<function=' | "$bin/kgen" tokenize --model "$tmp/fv31.gguf" --no-bos)
[[ "$open_id" =~ ^[0-9]+$ ]] || kg_fail "'<function=' is not one token of the model: $open_id"
python3 - "$tmp" "$open_id" <<'PY'
import json, sys
tmp, open_id = sys.argv[1], sys.argv[2]
T = json.load(open(f"{tmp}/oss-tools.json"))
tools = [{"type": "function", "function": t} for t in T]
with open(f"{tmp}/fv31.jsonl", "w") as f:
    # required: 20 one call, 10 parallel calls, 10 naming get_weather
    for i in range(40):
        choice = "required" if i < 30 else {"type": "function", "function": {"name": "get_weather"}}
        f.write(json.dumps({"request_id": f"r{i}", "messages": [{"role": "user", "content": f"task {i}"}],
                            "tools": tools, "tool_choice": choice, "max_tokens": 100,
                            "parallel_tool_calls": 20 <= i < 30, "temperature": 1.0}) + "\n")
    for i in range(60):
        f.write(json.dumps({"request_id": f"a{i}", "messages": [{"role": "user", "content": f"auto {i}"}],
                            "tools": tools, "max_tokens": 100, "temperature": 1.0,
                            "parallel_tool_calls": False, "logit_bias": {open_id: 1}}) + "\n")
PY
"$bin/kgen" render --model "$tmp/fv31.gguf" <<<'{"request_id": "r", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "ping", "parameters": {}}}]}' |
    grep -q 'start with <function=' || kg_fail "Functionary v3.1's prompt does not teach <function="
"$bin/kgen" batch --model "$tmp/fv31.gguf" --input "$tmp/fv31.jsonl" --output "$tmp/fv31.out" \
    2>>"$tmp/batch.log"
python3 - "$tmp" <<'PY'
import json, sys
import jsonschema
tmp = sys.argv[1]
T = {t["name"]: t["parameters"] for t in json.load(open(f"{tmp}/oss-tools.json"))}
n_req = n_req_calls = n_text = n_called = n_calls = n_before = 0
for line in open(f"{tmp}/fv31.out"):
    e = json.loads(line)
    assert e["type"] == "done", e
    rid, fr, calls = e["request_id"], e["finish_reason"], e.get("tool_calls", [])
    for i, c in enumerate(calls):
        if rid.startswith("r") and int(rid[1:]) >= 30:
            assert c["function"]["name"] == "get_weather", (rid, c)
        if fr == "length" and i == len(calls) - 1:
            continue  # may be cut
        jsonschema.validate(json.loads(c["function"]["arguments"]), T[c["function"]["name"]])
        if rid.startswith("r"):
            n_req_calls += 1
        else:
            n_calls += 1
    # the call syntax is never left in the answer's text
    assert "<function=" not in e["text"], (rid, e)
    if rid.startswith("r"):
        assert fr in ("tool_calls", "length"), (rid, e)
        assert fr == "length" or calls, (rid, e)
        n_req += fr == "tool_calls"
    elif calls:
        assert fr in ("tool_calls", "length"), (rid, e)
        n_called += fr == "tool_calls"
        n_before += e["text"] != ""  # the free text before the call, kept
    else:
        assert fr in ("stop", "length"), (rid, e)
        n_text += e["text"] != ""  # (a random model may end at once)
assert n_req >= 30, f"only {n_req} of 40 Functionary v3.1 required jobs ended with calls"
assert n_text >= 5 and n_called >= 5, f"Functionary v3.1 auto: {n_text} texts, {n_called} calls of 60"
assert n_before >= 3, f"Functionary v3.1 auto: only {n_before} calls after text of their own"
print(f"Functionary v3.1: {n_req} of 40 required/named jobs finished tool_calls ({n_req_calls} "
      f"calls valid); auto: {n_text} of 60 answered text, {n_called} called ({n_before} after "
      f"text of their own), {n_calls} calls valid")
PY
