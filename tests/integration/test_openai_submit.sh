#!/usr/bin/env bash
# test_openai_submit: OpenAI Batch files through a real Kafka broker with kgen-submit and
# kgen-worker.
#  - OpenAI's published Batch API examples (chat and completions) and vLLM's run-batch example
#    file go in; the output lines are OpenAI Batch output objects (schema-checked) with the same
#    completions `kgen batch` gives for the same lines;
#  - a job for another model gets model_not_found, in the error file, and is committed (the
#    group's lag reaches 0: not retried forever);
#  - n = 4 with a seed: four different texts, the same four as kgen batch (redelivery
#    determinism), and the worker's prefill counter grows by the prompt once;
#  - resuming: kgen-submit is killed (SIGKILL) while results arrive; rerun with the same input
#    and output, it sends nothing twice (the jobs topic holds each job once), keeps the lines it
#    had written and ends with exactly one line per job; killed as soon as its state file is
#    there, the rerun sends what is not in the jobs topic yet; the same resume with OpenAI lines
#    (custom_ids, --output-format openai, --error-file) keeps both files' lines;
#  - response_format: a strict json_schema with n = 2 gives documents of the schema, the same as
#    kgen batch; a schema kgen cannot enforce is invalid_schema (400, param response_format);
#  - kgen-submit --status prints request_counts (total, completed, failed) from the results topic;
#  - LoRA: a body whose model is an adapter's name (--lora, vLLM's convention) runs on the
#    adapter beside a job on the base, as in kgen batch, differs from the base, and is counted
#    in the adapter's metrics (jobs, tokens);
#  - --lora-dir with --max-loras 2 and four adapters (tiny-sql and three of the directory): two
#    rounds of jobs over all four, so adapters are evicted and loaded again while others' jobs
#    run; every job ends with the completion kgen batch gives and the first round gave (its
#    ids do not depend on the eviction); a corrupt file of the directory answers its job
#    model_not_found and the worker goes on; the metrics count the evictions and reloads.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup openai-submit
kg_need_java
DATA="${KG_DATA_DIR:?}/openai"
SCHEMA="$KG_SRC/schemas/openai-batch-output.schema.json"
python3 -c 'import jsonschema' 2>/dev/null || kg_fail "python3-jsonschema is not installed"

kg_model "$T/chat.gguf" --n-embd 32 --n-head 2 --n-head-kv 1 --n-ff 64 --name tiny-chat \
    --vocab-from "$KG_DATA_DIR/tokenizer-vectors/ggml-vocab-phi-3.gguf"
NAMES="gpt-3.5-turbo-0125,gpt-4o-mini,VAR_completion_model_id,meta-llama/Meta-Llama-3-8B-Instruct,tiny-chat"
"$KG_BIN/kgen" mkmodel --lora --base "$T/chat.gguf" --rank 4 --type f16 --seed 5 --out "$T/sql.gguf" \
    >/dev/null
mkdir -p "$T/loras"
for i in 1 2 3; do
    "$KG_BIN/kgen" mkmodel --lora --base "$T/chat.gguf" --rank $((2 + i)) --seed $((20 + i)) \
        --type "$(sed -n "${i}p" <<<$'f16\nbf16\nf32')" --out "$T/loras/d$i.gguf" >/dev/null
done
head -c 300 "$T/loras/d1.gguf" >"$T/loras/broken.gguf"
LORA=(--lora "tiny-sql=$T/sql.gguf" --lora-dir "$T/loras" --max-loras 2)
kg_broker_start
kg_topics 4
PORT=$(kg_free_port)
kg_worker w1 --max-batch-size 8 --threads 2 --served-model-name "$NAMES" --http-port "$PORT" \
    "${LORA[@]}"
kg_wait_assigned 60 4 w1

jobs_in_topic() { # messages ever produced to $JOBS (sum of the end offsets)
    "$KG_BIN/kg-admin" end-offsets "$BROKERS" "$JOBS" 2>/dev/null || echo 0
}
submit() { # submit NAME IN [flags]: kgen-submit --output-format openai of IN into $T/NAME.*
    local name=$1 in=$2
    shift 2
    kg_submit --input "$in" --output "$T/$name.out.jsonl" --output-format openai --timeout 120 \
        --no-progress "$@" 2>"$T/$name.submit.log" || {
        cat "$T/$name.submit.log" >&2
        kg_fail "kgen-submit $name: not every job finished"
    }
}
batch() { # batch NAME IN: the same lines through kgen batch
    "$KG_BIN/kgen" batch --model "$T/chat.gguf" --input "$2" --output "$T/$1.batch.jsonl" \
        --output-format openai --threads 2 --served-model-name "$NAMES" "${LORA[@]}" \
        2>>"$T/batch.log"
}

# 1. the published files, one submission each (they reuse custom_ids)
for f in openai_batch_guide_chat openai_batch_request_input openai_batch_completions \
    vllm_openai_example_batch; do
    submit "$f" "$DATA/$f.jsonl"
    batch "$f" "$DATA/$f.jsonl"
done
python3 - "$SCHEMA" "$T" <<'PY'
import json, sys
import jsonschema
v = jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))
T = sys.argv[2]
def content(o):
    c = o["response"]["body"]["choices"][0]
    return c.get("message", {}).get("content", c.get("text"))
for name in ("openai_batch_guide_chat", "openai_batch_request_input", "openai_batch_completions",
             "vllm_openai_example_batch"):
    k = {o["custom_id"]: o for o in map(json.loads, open(f"{T}/{name}.out.jsonl"))}
    b = {o["custom_id"]: o for o in map(json.loads, open(f"{T}/{name}.batch.jsonl"))}
    assert k.keys() == b.keys(), name
    for cid, o in k.items():
        errs = list(v.iter_errors(o))
        assert not errs, f"{name} {cid}: {errs[0].message}"
        assert o["response"]["status_code"] == 200, o
        assert content(o) == content(b[cid]), f"{name} {cid}: Kafka and kgen batch differ"
        u, ub = (dict(x["response"]["body"]["usage"]) for x in (o, b[cid]))
        u.pop("prompt_tokens_details"), ub.pop("prompt_tokens_details")  # cache hits differ
        assert u == ub, (u, ub)
    print(f"  {name}: {len(k)} lines, the same completions as kgen batch")
PY

# 2. model_not_found (committed) and n = 4 through Kafka
python3 - "$T/mixed.jsonl" <<'PY'
import json, sys
chat = "/v1/chat/completions"
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"custom_id": "wrong-model", "method": "POST", "url": chat, "body": {
        "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}}) + "\n")
    f.write(json.dumps({"custom_id": "n4", "method": "POST", "url": chat, "body": {
        "model": "tiny-chat", "n": 4, "seed": 42, "temperature": 1.0, "max_completion_tokens": 12,
        "messages": [{"role": "user", "content": "Four different haiku about Kafka, please"}]}}) + "\n")
PY
prefill0=$(kg_metric "$PORT" kgen_prefill_tokens_total)
submit mixed "$T/mixed.jsonl" --error-file "$T/mixed.err.jsonl"
prefill1=$(kg_metric "$PORT" kgen_prefill_tokens_total)
batch mixed "$T/mixed.jsonl"
python3 - "$SCHEMA" "$T" "$((prefill1 - prefill0))" <<'PY'
import json, sys
import jsonschema
v = jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))
T, prefill = sys.argv[2], int(sys.argv[3])
out = [json.loads(l) for l in open(f"{T}/mixed.out.jsonl")]
err = [json.loads(l) for l in open(f"{T}/mixed.err.jsonl")]
for o in out + err:
    assert not list(v.iter_errors(o)), o
assert [o["custom_id"] for o in err] == ["wrong-model"], err
e = err[0]["response"]
assert e["status_code"] == 404 and e["body"]["error"]["code"] == "model_not_found", e
assert [o["custom_id"] for o in out] == ["n4"], out
body = out[0]["response"]["body"]
texts = [c["message"]["content"] for c in body["choices"]]
assert len(texts) == 4 and len(set(texts)) == 4, texts
b = [json.loads(l) for l in open(f"{T}/mixed.batch.jsonl")]
bt = [c["message"]["content"] for o in b if o["custom_id"] == "n4" for c in o["response"]["body"]["choices"]]
assert bt == texts, (bt, texts)
prompt = body["usage"]["prompt_tokens"]
assert prefill == prompt, f"the worker prefilled {prefill} tokens for a {prompt}-token prompt with n = 4"
print(f"  n = 4: four different texts, the same as kgen batch; {prefill} prompt tokens prefilled once")
print(f"  model_not_found: {e['body']['error']['message']}")
PY

# 2a. LoRA through Kafka: the same question on the base and on the adapter, in one batch
python3 - "$T/lora.jsonl" <<'PY'
import json, sys
chat = "/v1/chat/completions"
with open(sys.argv[1], "w") as f:
    for cid, model in (("lora-base", "tiny-chat"), ("lora-sql", "tiny-sql")):
        f.write(json.dumps({"custom_id": cid, "method": "POST", "url": chat, "body": {
            "model": model, "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": "Write a query"}]}}) + "\n")
PY
submit lora "$T/lora.jsonl"
batch lora "$T/lora.jsonl"
[[ "$(kg_metric "$PORT" kgen_lora_jobs_total)" == 1 && "$(kg_metric "$PORT" kgen_lora_tokens_total)" == 16 &&
    "$(kg_metric "$PORT" kgen_lora_adapters_resident)" == 1 ]] ||
    kg_fail "LoRA metrics: $(curl -s "http://127.0.0.1:$PORT/metrics" | grep lora)"
python3 - "$T" <<'PY'
import json, sys
T = sys.argv[1]
def texts(path):
    return {o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
            for o in map(json.loads, open(path))}
k, b = texts(f"{T}/lora.out.jsonl"), texts(f"{T}/lora.batch.jsonl")
assert k == b and set(k) == {"lora-base", "lora-sql"}, (k, b)
assert k["lora-base"] != k["lora-sql"], k
print(f"  LoRA: the adapter's answer {k['lora-sql']!r}, the base's {k['lora-base']!r}")
PY

# 2c. --lora-dir, --max-loras 2, four adapters: two rounds, so adapters are evicted and loaded
# again while jobs on others run
python3 - "$T" <<'PY'
import json, sys
chat = "/v1/chat/completions"
for r in (1, 2):
    with open(f"{sys.argv[1]}/dir{r}.jsonl", "w") as f:
        for i, model in enumerate(["d1", "d2", "d3", "tiny-sql"] * 2 + ["broken"] * (r == 1)):
            f.write(json.dumps({"custom_id": f"{model}-{i // 4}", "method": "POST", "url": chat,
                "body": {"model": model, "temperature": 0, "max_tokens": 12 + 4 * (i // 4),
                         "messages": [{"role": "user", "content": f"Query {i // 4}"}]}}) + "\n")
PY
loads0=$(kg_metric "$PORT" kgen_lora_loads_total)
submit dir1 "$T/dir1.jsonl" --error-file "$T/dir1.err.jsonl"
submit dir2 "$T/dir2.jsonl"
batch dir1 "$T/dir1.jsonl"
loads=$(($(kg_metric "$PORT" kgen_lora_loads_total) - loads0))
evictions=$(kg_metric "$PORT" kgen_lora_evictions_total)
resident=$(kg_metric "$PORT" kgen_lora_adapters_resident)
((loads >= 5 && evictions >= 2 && resident <= 2)) ||
    kg_fail "--max-loras 2: $loads loads, $evictions evictions, $resident resident" \
        "$(curl -s "http://127.0.0.1:$PORT/metrics" | grep lora)"
python3 - "$T" "$loads" "$evictions" <<'PY'
import json, sys
T = sys.argv[1]
def texts(path):
    return {o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
            for o in map(json.loads, open(path)) if o["response"]["status_code"] == 200}
k1, k2, b = (texts(f"{T}/{n}") for n in ("dir1.out.jsonl", "dir2.out.jsonl", "dir1.batch.jsonl"))
want = {f"{m}-{j}" for m in ("d1", "d2", "d3", "tiny-sql") for j in (0, 1)}
assert set(k1) == set(k2) == want, (sorted(k1), sorted(k2))
assert k1 == k2, "a job's completion changed once its adapter was evicted and loaded again"
assert {c: t for c, t in b.items() if c in want} == k1, "Kafka and kgen batch differ"
assert len({k1[f"{m}-0"] for m in ("d1", "d2", "d3", "tiny-sql")}) == 4, k1
err = [json.loads(l) for l in open(f"{T}/dir1.err.jsonl")]
assert [o["custom_id"] for o in err] == ["broken-2"], err
e = err[0]["response"]["body"]["error"]
assert e["code"] == "model_not_found" and "cannot be used" in e["message"], e
print(f"  --lora-dir, --max-loras 2: 16 jobs over 4 adapters, {sys.argv[2]} loads and "
      f"{sys.argv[3]} evictions, the same completions in both rounds and in kgen batch; "
      f"broken.gguf: {e['message']}")
PY

# 2b. response_format through Kafka: a strict json_schema with n = 2 gives documents of the
# schema (the same as kgen batch), a schema kgen cannot enforce gets invalid_schema
python3 - "$T/schema.jsonl" <<'PY'
import json, sys
chat = "/v1/chat/completions"
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
msgs = [{"role": "user", "content": "A person as JSON"}]
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"custom_id": "person", "method": "POST", "url": chat, "body": {
        "model": "tiny-chat", "messages": msgs, "n": 2, "seed": 9, "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "strict": True, "schema": schema}}}}) + "\n")
    f.write(json.dumps({"custom_id": "bad-schema", "method": "POST", "url": chat, "body": {
        "model": "tiny-chat", "messages": msgs, "response_format": {"type": "json_schema",
        "json_schema": {"name": "p", "schema": {"type": "object", "not": {}}}}}}) + "\n")
PY
submit schema "$T/schema.jsonl" --error-file "$T/schema.err.jsonl"
batch schema "$T/schema.jsonl"
python3 - "$SCHEMA" "$T" <<'PY'
import json, sys
import jsonschema
v = jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))
T = sys.argv[2]
out = [json.loads(l) for l in open(f"{T}/schema.out.jsonl")]
err = [json.loads(l) for l in open(f"{T}/schema.err.jsonl")]
for o in out + err:
    assert not list(v.iter_errors(o)), o
assert [o["custom_id"] for o in out] == ["person"], out
choices = out[0]["response"]["body"]["choices"]
texts = [c["message"]["content"] for c in choices]
assert len(texts) == 2 and all(c["finish_reason"] == "stop" for c in choices), choices
for t in texts:
    d = json.loads(t)
    assert set(d) == {"name", "age"} and isinstance(d["name"], str) and len(d["name"]) <= 10, t
    assert isinstance(d["age"], int) and not isinstance(d["age"], bool) and 0 <= d["age"] <= 120, t
b = [json.loads(l) for l in open(f"{T}/schema.batch.jsonl")]
bt = [c["message"]["content"] for o in b if o["custom_id"] == "person"
      for c in o["response"]["body"]["choices"]]
assert bt == texts, (bt, texts)
assert [o["custom_id"] for o in err] == ["bad-schema"], err
e = err[0]["response"]
assert e["status_code"] == 400 and e["body"]["error"]["code"] == "invalid_schema", e
assert e["body"]["error"]["param"] == "response_format", e
print(f"  json_schema, n = 2: {texts}; invalid_schema: {e['body']['error']['message']}")
PY

# 3. resuming: kill kgen-submit while results arrive, run it again (400 tokens a job, so the 60
# results take seconds: with 40 an idle machine answered them all before the kill)
kg_jobs "$T/resume.jsonl" 60 '{"max_tokens": 400, "ignore_eos": true, "temperature": 0.7}' res
before=$(jobs_in_topic)
kg_bg submit1 "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
    --results-topic "$RESULTS" --input "$T/resume.jsonl" --output "$T/resume.out.jsonl" \
    --timeout 120 --no-progress
kg_wait 60 "some results written" bash -c "[[ \$(wc -l <'$T/resume.out.jsonl' 2>/dev/null || echo 0) -ge 10 ]]"
kill -9 "$(kg_pid submit1)"
kept=$(wc -l <"$T/resume.out.jsonl")
[[ -f "$T/resume.out.jsonl.kgen-state" ]] || kg_fail "no state file beside the output"
sent1=$(($(jobs_in_topic) - before))
kg_note "killed kgen-submit with $kept of 60 results written and $sent1 jobs sent"
kg_submit --input "$T/resume.jsonl" --output "$T/resume.out.jsonl" --timeout 120 --no-progress \
    2>"$T/resume.submit.log" || kg_fail "the resumed kgen-submit did not finish"
cat "$T/resume.submit.log"
sent2=$(($(jobs_in_topic) - before))
python3 - "$T/resume.jsonl" "$T/resume.out.jsonl" "$kept" "$sent1" "$sent2" <<'PY'
import json, sys
want = {json.loads(l)["request_id"] for l in open(sys.argv[1])}
lines = [json.loads(l) for l in open(sys.argv[2])]
kept, sent1, sent2 = map(int, sys.argv[3:6])
ids = [o["request_id"] for o in lines]
assert sorted(ids) == sorted(want), f"{len(ids)} lines for {len(want)} jobs"
assert all(o["type"] == "done" for o in lines)
assert kept < 60, "every result was written before the kill: the resume had nothing to do"
assert sent1 == 60, f"the first run sent {sent1} of 60 before it was killed"
assert sent2 == 60, f"the jobs topic got {sent2} messages for 60 jobs: something was sent twice"
print(f"  resume: {kept} lines kept, nothing sent twice, 60 results, one line each")
PY
# the same input and output once more: nothing to send, nothing to wait for
kg_submit --input "$T/resume.jsonl" --output "$T/resume.out.jsonl" --timeout 30 --no-progress \
    2>"$T/resume3.log" || kg_fail "a finished submission does not rerun cleanly"
(($(jobs_in_topic) - before == 60)) || kg_fail "a finished submission sent jobs again"
[[ $(wc -l <"$T/resume.out.jsonl") == 60 ]] || kg_fail "the output changed on a rerun"

# killed as soon as its state file is there (before or while it sends; usually before: sending
# takes milliseconds): the rerun sends each job that is not in the jobs topic yet, nothing twice
kg_jobs "$T/early.jsonl" 40 '{"max_tokens": 2}' early
before=$(jobs_in_topic)
kg_bg submit2 "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
    --results-topic "$RESULTS" --input "$T/early.jsonl" --output "$T/early.out.jsonl" \
    --timeout 120 --no-progress
# a busy wait: a poll with sleeps lets it finish first
until [[ -f "$T/early.out.jsonl.kgen-state" ]]; do ((SECONDS < 600)) || kg_fail "no state file"; done
kill -9 "$(kg_pid submit2)" 2>/dev/null || true # it may have finished already
sent1=$(($(jobs_in_topic) - before))
kg_submit --input "$T/early.jsonl" --output "$T/early.out.jsonl" --timeout 120 --no-progress \
    2>"$T/early.submit.log" || kg_fail "the resumed kgen-submit did not finish"
sent2=$(($(jobs_in_topic) - before))
((sent2 == 40)) || kg_fail "the jobs topic got $sent2 messages for 40 jobs ($sent1 before the kill)"
[[ $(wc -l <"$T/early.out.jsonl") == 40 ]] || kg_fail "not one line per job after the resume"
kg_note "killed at the state file with $sent1 of 40 jobs sent; the rerun sent the other $((sent2 - sent1))"

# the same with OpenAI lines: custom_ids, the openai output and an error file (two jobs for a
# model the worker does not serve); the rerun keeps both files' lines and writes the rest once
python3 - "$T/oa.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(40):
        model = "not-served" if i in (3, 30) else "tiny-chat"
        f.write(json.dumps({"custom_id": f"oa-{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": model, "prompt": f"Once upon a time {i}",
                                     "max_tokens": 400, "ignore_eos": True,
                                     "temperature": 0.7}}) + "\n")
PY
before=$(jobs_in_topic)
kg_bg submit3 "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
    --results-topic "$RESULTS" --input "$T/oa.jsonl" --output "$T/oa.out.jsonl" \
    --output-format openai --error-file "$T/oa.err.jsonl" --timeout 120 --no-progress
kg_wait 60 "some OpenAI results written" \
    bash -c "[[ \$(cat '$T/oa.out.jsonl' '$T/oa.err.jsonl' 2>/dev/null | wc -l) -ge 8 ]]"
kill -9 "$(kg_pid submit3)"
kept=$(cat "$T/oa.out.jsonl" "$T/oa.err.jsonl" 2>/dev/null | wc -l)
kg_submit --input "$T/oa.jsonl" --output "$T/oa.out.jsonl" --output-format openai \
    --error-file "$T/oa.err.jsonl" --timeout 120 --no-progress 2>"$T/oa.submit.log" ||
    kg_fail "the resumed OpenAI kgen-submit did not finish"
sent=$(($(jobs_in_topic) - before))
python3 - "$T/oa.out.jsonl" "$T/oa.err.jsonl" "$sent" "$kept" <<'PY'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
err = [json.loads(l) for l in open(sys.argv[2])]
sent, kept = int(sys.argv[3]), int(sys.argv[4])
assert kept < 40, "every line was written before the kill: the resume had nothing to do"
ids = sorted(o["custom_id"] for o in out)
assert ids == sorted(f"oa-{i}" for i in range(40) if i not in (3, 30)), f"{len(ids)} output lines"
assert all(o["response"]["status_code"] == 200 for o in out)
assert sorted(o["custom_id"] for o in err) == ["oa-3", "oa-30"], [o["custom_id"] for o in err]
assert all(o["response"]["body"]["error"]["code"] == "model_not_found" for o in err), err
assert sent == 40, f"the jobs topic got {sent} messages for 40 OpenAI lines"
PY
kg_note "OpenAI lines: killed with $kept of 40 lines written; the rerun ended with 38 + 2 errors, nothing sent twice"

# 4. --status: request_counts from the results topic
status=$(kg_submit --status --input "$T/resume.jsonl" --output "$T/resume.out.jsonl" --timeout 60)
[[ "$status" == '{"total": 60, "completed": 60, "failed": 0}' ]] || kg_fail "status: $status"
status=$(kg_submit --status --input "$T/mixed.jsonl" --output "$T/mixed.out.jsonl" --timeout 60)
[[ "$status" == '{"total": 2, "completed": 1, "failed": 1}' ]] || kg_fail "status: $status"
kg_note "status: $status"

# 5. every job committed, model_not_found included: the group's lag reaches 0
kg_stop_pid "$(kg_pid w1)" 30
lag=$(kg_group_lag "$GROUP" "$JOBS")
[[ "$lag" == 0 ]] || kg_fail "committed offsets do not reach the end of $JOBS (lag $lag)"
echo "PASS: OpenAI Batch files through Kafka in $(kg_elapsed) s"
