#!/usr/bin/env bash
# test_batch_vs_worker: one completion path. The same jobs go through `kgen batch` and through
# kgen-worker (on librdkafka's in-process mock cluster, fed by kgen-submit); every terminal event
# must be the same field by field, except the fields that name the worker and the attempt
# (worker_id, topic, partition, offset, attempt), the event time (ts_ms) and the measured timings.
# The jobs cover every way a job ends: done (stop, length, stop_sequence; a choice job makes
# sure of stop), logprobs streamed and not, intake errors (invalid_job, prompt_too_long,
# max_tokens_too_large, expired, unsupported_chat_template, model_not_found), OpenAI Batch lines
# and a bare Completions body, n > 1 (with per-choice stop strings and logprobs), logit_bias,
# embed jobs (their vectors bit for bit, an OpenAI /v1/embeddings line among them) and LoRA
# adapters (--lora; picked by model and by lora, two at once, an unknown one; kgen generate
# --lora gives the same greedy text).
# The prefix cache is off on both sides so usage.cached_tokens cannot differ by scheduling.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup batch-vs-worker
MODEL="${KG_DATA_DIR:?}/models/stories260K.gguf"
"$KG_BIN/kgen" mkmodel --lora --base "$MODEL" --rank 8 --type f16 --seed 1 --out "$T/sql.gguf" >/dev/null
"$KG_BIN/kgen" mkmodel --lora --base "$MODEL" --rank 4 --seed 2 --targets q,v --out "$T/chat.gguf" >/dev/null

python3 - "$T/jobs.jsonl" <<'PY'
import json, random, sys
random.seed(11)
prompts = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a cat",
           "The sun was", "There was a big tree", "Mom said", "The boy wanted"]
jobs = []
for i in range(24):
    j = {"request_id": f"cmp-{i}", "prompt": prompts[i % 8], "max_tokens": random.randint(4, 60)}
    if i % 3 == 0:
        j["temperature"] = 0
    else:
        j.update({"temperature": 0.8, "top_k": 40, "seed": 500 + i})
    if i % 4 == 1:
        j["stop"] = [". ", "\n"]
    if i % 5 == 2:
        j["logprobs"] = 3
        j["stream"] = i % 2 == 0
    if i % 6 == 5:
        j["metadata"] = {"n": i, "tag": "cmp"}
    if i % 7 == 3:
        j["stream"] = False
    jobs.append(j)
jobs += [
    {"request_id": "cmp-bad-max", "prompt": "x", "max_tokens": -1},
    {"request_id": "cmp-too-long", "prompt": "word " * 400, "max_tokens": 8},
    {"request_id": "cmp-limit", "prompt": "x", "max_tokens": 100000},
    {"request_id": "cmp-expired", "prompt": "x", "deadline_ms": 1000, "metadata": {"k": 1}},
    {"request_id": "cmp-chat", "messages": [{"role": "user", "content": "hi"}]},
    {"request_id": "cmp-ignore-eos", "prompt": "The end.", "max_tokens": 40, "temperature": 0,
     "ignore_eos": True},
    {"request_id": "cmp-model", "prompt": "x", "model": "another-model"},
    {"request_id": "cmp-lora-base", "prompt": "The sun was", "max_tokens": 24, "temperature": 0},
    {"request_id": "cmp-lora-model", "prompt": "The sun was", "max_tokens": 24, "temperature": 0,
     "model": "sql"},
    {"request_id": "cmp-lora-two", "prompt": "The sun was", "max_tokens": 24, "temperature": 0.7,
     "seed": 4, "lora": [{"name": "sql", "scale": 0.5}, {"name": "chat"}]},
    {"request_id": "cmp-lora-unknown", "prompt": "x", "lora": [{"name": "nope"}]},
    # ends "stop" whatever the model samples: the grammar completes
    {"request_id": "cmp-choice", "prompt": "Is it red?", "choice": ["yes", "no"],
     "temperature": 0.8, "seed": 9},
    {"request_id": "cmp-n3", "prompt": "Once upon a time", "n": 3, "max_tokens": 30,
     "temperature": 0.9, "seed": 77, "stop": [". "], "logprobs": 2},
    {"request_id": "cmp-n4-stream", "prompt": "The little dog", "n": 4, "max_tokens": 20,
     "temperature": 1.0, "seed": 78, "logit_bias": {"13": -100, "300": 5}},
    {"custom_id": "cmp-openai-cmpl", "method": "POST", "url": "/v1/completions",
     "body": {"model": "stories260K", "prompt": "Lily and Tom went", "max_tokens": 12, "n": 2,
              "seed": 3, "logprobs": 1}},
    {"custom_id": "cmp openai chat", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "hi"}]}},
    {"request_id": "cmp-embed", "task": "embed", "input": ["Once upon a time", "The little dog"]},
    {"request_id": "cmp-embed-mean", "task": "embed", "input": [[1, 2, 3], [4, 5]],
     "pooling": "mean", "encoding_format": "base64"},
    {"custom_id": "cmp-openai-embed", "method": "POST", "url": "/v1/embeddings",
     "body": {"input": "Lily", "dimensions": 16}},
    {"custom_id": "cmp-openai-tools", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
              "tools": [{"type": "function", "function": {"name": "f"}}]}},
]
with open(sys.argv[1], "w") as f:
    for j in jobs:
        f.write(json.dumps(j) + "\n")
PY

common=(--threads 2 --max-batch-size 8 --prefix-cache false --lora "sql=$T/sql.gguf"
        --lora "chat=$T/chat.gguf:0.8")
"$KG_BIN/kgen" batch --model "$MODEL" --input "$T/jobs.jsonl" --output "$T/batch.jsonl" \
    "${common[@]}" 2>"$T/batch.log"

# kgen generate --lora: the same greedy text as the job on that adapter
"$KG_BIN/kgen" generate --model "$MODEL" --prompt "The sun was" --n-predict 24 --temp 0 --quiet \
    --threads 2 --lora "$T/sql.gguf" >"$T/generate-lora.txt"

kg_bg worker "$KG_BIN/kgen-worker" --demo 0 --model "$MODEL" --http-port 0 "${common[@]}"
kg_wait_log "$T/worker.log" 'partitions assigned' 60
BROKERS=$(sed -n 's/.*mock cluster up.* brokers=\([^ ]*\).*/\1/p' "$T/worker.log" | head -n 1)
JOBS=kgen.jobs
RESULTS=kgen.results
kg_submit_timed 120
kg_stop_pid "$(kg_pid worker)" 10

python3 - "$T/batch.jsonl" "$T/results.jsonl" "$T/events.jsonl" "$T/generate-lora.txt" <<'PY'
import collections, json, re, sys
batch = {e["request_id"]: e for e in map(json.loads, open(sys.argv[1]))}
gen = open(sys.argv[4], encoding="utf-8", errors="replace").read()
assert gen == batch["cmp-lora-model"]["text"] + "\n", (gen, batch["cmp-lora-model"]["text"])
worker = {e["request_id"]: e for e in map(json.loads, open(sys.argv[2]))}
assert set(batch) == set(worker), (sorted(set(batch) ^ set(worker)))
skip = {"worker_id", "topic", "partition", "offset", "attempt", "ts_ms", "timings"}
n = {"done": 0, "error": 0}
for rid, b in sorted(batch.items()):
    w = worker[rid]
    fb = {k: v for k, v in b.items() if k not in skip}
    fw = {k: v for k, v in w.items() if k not in skip}
    if b.get("code") == "expired":  # "passed N ms before the job was taken": a clock reading
        fb["message"], fw["message"] = (re.sub(r"passed \d+ ms", "passed N ms", x["message"])
                                        for x in (fb, fw))
    assert fb == fw, f"{rid}:\n batch  {json.dumps(fb)[:600]}\n worker {json.dumps(fw)[:600]}"
    assert set(b["timings"]) == set(w["timings"]) if "timings" in b else "timings" not in w, rid
    n[b["type"]] += 1
codes = sorted(e["code"] for e in batch.values() if e["type"] == "error")
# (the tools job: a chat job, and this model has no chat template to teach a call syntax)
assert codes == sorted(["invalid_job", "prompt_too_long", "max_tokens_too_large", "expired",
                        "unsupported_chat_template", "unsupported_chat_template",
                        "model_not_found", "model_not_found", "unsupported_chat_template"]), codes
# an adapter changes what the model writes
assert batch["cmp-lora-model"]["text"] != batch["cmp-lora-base"]["text"], batch["cmp-lora-model"]
assert "nope" in batch["cmp-lora-unknown"]["message"], batch["cmp-lora-unknown"]
for rid, k in (("cmp-n3", 3), ("cmp-n4-stream", 4), ("cmp-openai-cmpl", 2)):
    ch = batch[rid]["choices"]
    assert [c["index"] for c in ch] == list(range(k)), rid
    assert len({c["text"] for c in ch}) > 1 or rid == "cmp-openai-cmpl", rid
# the streamed n = 4 job: each choice's token events carry its index, count from 0 without a
# gap, and join to that choice's text in the done event
toks = collections.defaultdict(list)
for e in map(json.loads, open(sys.argv[3])):
    if e["type"] == "token" and e["request_id"] == "cmp-n4-stream":
        toks[e.get("choice", 0)].append(e)
assert sorted(toks) == [0, 1, 2, 3], sorted(toks)
for c in worker["cmp-n4-stream"]["choices"]:
    evs = toks[c["index"]]
    assert [t["index"] for t in evs] == list(range(len(evs))), c["index"]
    assert "".join(t["text"] for t in evs) == c["text"], c["index"]
n_choices = sum(len(e.get("choices", [])) for e in batch.values())
reasons = {e["finish_reason"] for e in batch.values() if e["type"] == "done"}
assert reasons == {"stop", "length", "stop_sequence"}, reasons
assert batch["cmp-choice"]["finish_reason"] == "stop", batch["cmp-choice"]
assert batch["cmp-choice"]["text"] in ("yes", "no"), batch["cmp-choice"]
assert sum("logprobs" in e for e in batch.values()) >= 4
# embed jobs: the same vectors, bit for bit (written in shortest round-trip form)
assert len(batch["cmp-embed"]["embeddings"]) == 2 and len(batch["cmp-openai-embed"]["embeddings"][0]) == 16
assert all(isinstance(v, str) for v in batch["cmp-embed-mean"]["embeddings"])
print(f"{len(batch)} jobs: terminal events identical in kgen batch and kgen-worker "
      f"({n['done']} done, {n['error']} errors, {n_choices} choices of n > 1 jobs; "
      f"finish reasons {sorted(reasons)})")
PY
echo "PASS: kgen batch and kgen-worker agree in $(kg_elapsed) s"
