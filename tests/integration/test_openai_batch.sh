#!/usr/bin/env bash
# test_openai_batch: OpenAI's shapes through `kgen batch` (no broker).
#  - OpenAI's published Batch API examples (chat and completions) and vLLM's run-batch example
#    file (tests/data/openai/), mixed with kgen jobs and bare request bodies, give one OpenAI
#    Batch output line each, every line valid against schemas/openai-batch-output.schema.json
#    (OpenAI's own published output line is checked against the schema too);
#  - errors as OpenAI writes them, in --error-file: model_not_found (404), fields kgen cannot
#    honour (tools with tool_choice "required", image parts, n > 16, top_logprobs > 20,
#    an unserved url: /v1/moderations), a JSON Schema kgen cannot enforce (invalid_schema), expired
#    (batch_expired);
#  - /v1/embeddings: OpenAI's embedding list, unit vectors cut to dimensions;
#  - response_format copied into the job: json_schema gives a document of the schema,
#    json_object is accepted; vLLM's guided_choice gives one of its strings;
#  - n = 4 with a seed: four different texts, the same four in a second run with other jobs
#    around them and another batch size (redelivery determinism), prompt prefilled once;
#  - logit_bias: -100 on a token means it never appears; +100 at temperature 0 means every token
#    is that one.
# The model is a tiny random one with Phi-3's vocabulary and chat template (kgen mkmodel
# --vocab-from), named "tiny-chat".
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup openai-batch
DATA="${KG_DATA_DIR:?}/openai"
SCHEMA="$KG_SRC/schemas/openai-batch-output.schema.json"
python3 -c 'import jsonschema' 2>/dev/null || kg_fail "python3-jsonschema is not installed"

kg_model "$T/chat.gguf" --n-embd 32 --n-head 2 --n-head-kv 1 --n-ff 64 --name tiny-chat \
    --vocab-from "$KG_DATA_DIR/tokenizer-vectors/ggml-vocab-phi-3.gguf"
NAMES=(--served-model-name "gpt-3.5-turbo-0125,gpt-4o-mini" --served-model-name VAR_completion_model_id
    --served-model-name meta-llama/Meta-Llama-3-8B-Instruct --served-model-name tiny-chat)

python3 - "$T/extra.jsonl" <<'PY'
import json, sys
L = []
def batch(cid, url, body):
    L.append({"custom_id": cid, "method": "POST", "url": url, "body": body})
chat = "/v1/chat/completions"
msgs = [{"role": "user", "content": "Write a haiku about queues"}]
batch("n4", chat, {"model": "tiny-chat", "messages": msgs, "n": 4, "temperature": 1.0, "seed": 42,
                   "max_completion_tokens": 12})
batch("parts", chat, {"model": "tiny-chat", "max_tokens": 5, "temperature": 0, "logprobs": True,
                      "top_logprobs": 3, "messages": [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]})
batch("cmpl-tokens", "/v1/completions", {"model": "tiny-chat", "prompt": [[450, 4996, 3348]],
                                         "max_tokens": 4, "logprobs": 0, "stop": "\n"})
batch("other-model", chat, {"model": "gpt-4o", "messages": msgs})
batch("tools-required", chat, {"model": "tiny-chat", "messages": msgs, "tool_choice": "required",
                               "tools": [{"type": "function", "function": {"name": "f"}}]})
batch("image", chat, {"model": "tiny-chat", "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]})
batch("n17", chat, {"model": "tiny-chat", "messages": msgs, "n": 17})
batch("top21", chat, {"model": "tiny-chat", "messages": msgs, "logprobs": True, "top_logprobs": 21})
batch("json-mode", chat, {"model": "tiny-chat", "messages": msgs, "max_tokens": 8,
                          "response_format": {"type": "json_object"}})
batch("json-schema", chat, {"model": "tiny-chat", "messages": msgs, "max_tokens": 64,
                            "response_format": {"type": "json_schema", "json_schema": {
                                "name": "flag", "strict": True, "schema": {
                                    "type": "object", "properties": {"a": {"type": "boolean"}},
                                    "required": ["a"], "additionalProperties": False}}}})
batch("guided-choice", chat, {"model": "tiny-chat", "messages": msgs, "seed": 5,
                              "guided_choice": ["alpha", "beta", "gamma"]})
batch("bad-schema", chat, {"model": "tiny-chat", "messages": msgs,
                           "response_format": {"type": "json_schema", "json_schema": {
                               "name": "n", "schema": {"type": "object", "not": {}}}}})
batch("moderations", "/v1/moderations", {"model": "tiny-chat", "input": "hi"})
batch("embeddings", "/v1/embeddings", {"model": "tiny-chat", "input": ["hi", "there"],
                                       "dimensions": 8})
batch("expired", chat, {"model": "tiny-chat", "messages": msgs, "deadline_ms": 1000})
L.append({"request_id": "kgen-job", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
L.append({"model": "tiny-chat", "prompt": "A bare Completions body", "max_tokens": 3})
with open(sys.argv[1], "w") as f:
    for x in L:
        f.write(json.dumps(x) + "\n")
PY
cp "$T/extra.jsonl" "$T/all.jsonl"

run_batch() { # run_batch IN OUT [flags]
    local in=$1 out=$2
    shift 2
    "$KG_BIN/kgen" batch --model "$T/chat.gguf" --input "$in" --output "$out" --threads 2 \
        "${NAMES[@]}" "$@" 2>>"$T/batch.log"
}
# each published file as it is (they reuse custom_ids), then ours
for f in openai_batch_guide_chat openai_batch_request_input openai_batch_completions \
    vllm_openai_example_batch; do
    run_batch "$DATA/$f.jsonl" "$T/$f.out.jsonl" --output-format openai
done
run_batch "$T/all.jsonl" "$T/out.jsonl" --output-format openai --error-file "$T/err.jsonl"

python3 - "$SCHEMA" "$T" "$DATA" <<'PY'
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
T, DATA = sys.argv[2], sys.argv[3]
def lines(p):
    return [json.loads(l) for l in open(p) if l.strip()]
def check(o, where):
    errs = sorted(v.iter_errors(o), key=lambda e: list(e.path))
    assert not errs, f"{where}: {errs[0].message} at {list(errs[0].path)}\n{json.dumps(o)[:800]}"
for o in lines(f"{DATA}/openai_batch_output_example.jsonl"):
    check(o, "OpenAI's published output example")
# OpenAI's and vLLM's published lines: every one a 200 with the object its url asks for
published = {"openai_batch_guide_chat": ("chat.completion", "gpt-3.5-turbo-0125", 2),
             "openai_batch_request_input": ("chat.completion", "gpt-4o-mini", 1),
             "openai_batch_completions": ("text_completion", "VAR_completion_model_id", 1),
             "vllm_openai_example_batch": ("chat.completion", "meta-llama/Meta-Llama-3-8B-Instruct", 2)}
for name, (obj, model, n) in published.items():
    res = lines(f"{T}/{name}.out.jsonl")
    ins = lines(f"{DATA}/{name}.jsonl")
    assert [o["custom_id"] for o in res] == [x["custom_id"] for x in ins], name
    assert len(res) == n
    for o in res:
        check(o, f"{name} {o['custom_id']}")
        b = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and o["error"] is None, o
        assert b["object"] == obj and b["model"] == model, b
        u = b["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0, u
    print(f"  {name}: {n} x {obj}")
out, err = lines(f"{T}/out.jsonl"), lines(f"{T}/err.jsonl")
for o in out + err:
    check(o, o["custom_id"])
inputs = lines(f"{T}/all.jsonl")
want = [x.get("custom_id") or x.get("request_id") or "line-%d" % (i + 1) for i, x in enumerate(inputs)]
got = [o["custom_id"] for o in out + err]
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
assert len(set(o["id"] for o in out + err)) == len(got), "batch_req ids are not unique"
by = {o["custom_id"]: o for o in out + err}
assert [o["custom_id"] for o in out] == [c for c in want if c in {o["custom_id"] for o in out}]
assert by["cmpl-tokens"]["response"]["body"]["object"] == "text_completion"
assert by["kgen-job"]["response"]["body"]["object"] == "text_completion"
assert by["line-%d" % len(inputs)]["response"]["body"]["choices"][0]["finish_reason"] == "length"
assert all(o in out for o in (by["n4"], by["parts"], by["kgen-job"], by["line-%d" % len(inputs)]))
lp = by["parts"]["response"]["body"]["choices"][0]["logprobs"]["content"]
assert len(lp) >= 1 and all(len(t["top_logprobs"]) == 3 for t in lp), lp
c = by["cmpl-tokens"]["response"]["body"]["choices"][0]["logprobs"]
assert c["top_logprobs"] and all(t == {} for t in c["top_logprobs"]), c  # logprobs 0: no alternatives
# errors, as OpenAI writes them
status = {o["custom_id"]: (o["response"] or {}).get("status_code") for o in err}
codes = {o["custom_id"]: ((o["response"] or {}).get("body") or {}).get("error", {}).get("code")
         or o["error"]["code"] for o in err}
assert status["other-model"] == 404 and codes["other-model"] == "model_not_found", by["other-model"]
for cid in ("tools-required", "image", "n17", "top21", "moderations"):
    assert status[cid] == 400 and codes[cid] == "invalid_job", (cid, by[cid])
    print(f"  {cid}: {by[cid]['response']['body']['error']['message']}")
assert status["expired"] is None and codes["expired"] == "batch_expired", by["expired"]
assert status["bad-schema"] == 400 and codes["bad-schema"] == "invalid_schema", by["bad-schema"]
assert by["bad-schema"]["response"]["body"]["error"]["param"] == "response_format"
assert set(status) == {"other-model", "tools-required", "image", "n17", "top21", "moderations",
                       "bad-schema", "expired"}, sorted(status)
# /v1/embeddings: OpenAI's embedding list, one unit vector of `dimensions` per input
emb = by["embeddings"]["response"]["body"]
assert emb["object"] == "list" and [d["index"] for d in emb["data"]] == [0, 1], emb
for d in emb["data"]:
    assert d["object"] == "embedding" and len(d["embedding"]) == 8, d
    assert abs(sum(x * x for x in d["embedding"]) - 1) < 1e-5, d
assert emb["usage"]["prompt_tokens"] == emb["usage"]["total_tokens"] > 0, emb
# response_format: json_object runs; json_schema gives a document of the schema
assert by["json-mode"] in out
js = by["json-schema"]["response"]["body"]["choices"][0]
doc = json.loads(js["message"]["content"])
assert js["finish_reason"] == "stop" and set(doc) == {"a"} and isinstance(doc["a"], bool), js
print(f"  json-schema: {js['message']['content']}")
# vLLM's guided_choice constrains the output too
gc = by["guided-choice"]["response"]["body"]["choices"][0]
assert gc["message"]["content"] in ("alpha", "beta", "gamma") and gc["finish_reason"] == "stop", gc
# n = 4: four different texts
texts = [c["message"]["content"] for c in by["n4"]["response"]["body"]["choices"]]
assert len(texts) == 4 and len(set(texts)) == 4, texts
json.dump(texts, open(f"{T}/n4.json", "w"))
print(f"{len(out)} output lines and {len(err)} error lines: schema-valid")
PY

# n = 4 again, alone and in another batch size: the same four texts
grep '"custom_id": "n4"' "$T/all.jsonl" >"$T/n4.jsonl"
run_batch "$T/n4.jsonl" "$T/n4-out.jsonl" --output-format openai --max-batch-size 4
run_batch "$T/n4.jsonl" "$T/n4-events.jsonl" --max-batch-size 4 --no-prefix-cache
python3 - "$T" <<'PY'
import json, sys
T = sys.argv[1]
first = json.load(open(f"{T}/n4.json"))
again = [c["message"]["content"] for c in json.loads(open(f"{T}/n4-out.jsonl").read())["response"]["body"]["choices"]]
assert again == first, (again, first)
ev = json.loads(open(f"{T}/n4-events.jsonl").read())
assert [c["text"] for c in ev["choices"]] == first and ev["text"] == first[0], ev
assert ev["usage"]["completion_tokens"] == sum(c["completion_tokens"] for c in ev["choices"])
print("n = 4: the same four texts in every run")
PY
# logit_bias on kgen jobs with logprobs (the done event lists every token id); the greedy
# continuation's first token is the one to ban
echo '{"request_id": "greedy", "prompt": "Once upon a time", "logprobs": 1, "ignore_eos": true, "max_tokens": 8, "temperature": 0}' >"$T/bias.jsonl"
run_batch "$T/bias.jsonl" "$T/greedy.jsonl"
python3 - "$T/greedy.jsonl" "$T/bias.jsonl" <<'PY'
import json, sys
g = json.loads(open(sys.argv[1]).read())
ids = [t["token_id"] for t in g["logprobs"]]
ban, force = ids[0], ids[1] if ids[1] != ids[0] else ids[2]
base = {"prompt": "Once upon a time", "logprobs": 1, "ignore_eos": True}
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({**base, "request_id": "ban", "max_tokens": 200, "temperature": 1.0, "seed": 3,
                        "n": 4, "logit_bias": {str(ban): -100}}) + "\n")
    f.write(json.dumps({**base, "request_id": "ban-greedy", "max_tokens": 50, "temperature": 0,
                        "logit_bias": {str(ban): -100}}) + "\n")
    f.write(json.dumps({**base, "request_id": "force", "max_tokens": 50, "temperature": 0,
                        "logit_bias": {str(force): 100}}) + "\n")
open(sys.argv[2] + ".ids", "w").write(f"{ban} {force}\n")
PY
run_batch "$T/bias.jsonl" "$T/bias-out.jsonl"
python3 - "$T/bias-out.jsonl" "$T/bias.jsonl.ids" <<'PY'
import json, sys
ev = {e["request_id"]: e for e in map(json.loads, open(sys.argv[1]))}
ban, force = map(int, open(sys.argv[2]).read().split())
n = 0
for c in ev["ban"]["choices"]:
    ids = [t["token_id"] for t in c["logprobs"]]
    assert ban not in ids, f"banned token {ban} appeared"
    n += len(ids)
ids = [t["token_id"] for t in ev["ban-greedy"]["logprobs"]]
assert ids[0] != ban and ban not in ids
ids = [t["token_id"] for t in ev["force"]["logprobs"]]
assert len(ids) == 50 and set(ids) == {force}, ids[:10]
print(f"logit_bias: token {ban} banned in {n} sampled tokens; token {force} forced 50 times")
PY
echo "PASS: OpenAI shapes through kgen batch in $(kg_elapsed) s"
