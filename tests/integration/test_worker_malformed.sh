#!/usr/bin/env bash
# test_worker_malformed (acceptance 3): 1,000 malformed messages interleaved with 100 valid jobs
# on a real broker: truncated and byte-mutated JSON, valid JSON that is not a job (arrays,
# scalars, missing or bad request_id), random binary, 5 values of ~2 MB (over the worker's
# 1 MiB --max-message-bytes; the topics and clients allow 4 MiB so they can be produced and
# dead-lettered), 200 jobs with wrong field types and 2 prompts of ~900 kB. The worker stays up;
# every message without a usable request_id is in the DLQ (counted with the console consumer,
# by kgen-error-reason header), every other malformed one has an error event (invalid_job or
# prompt_too_long), every valid job is done, and the group's committed offsets reach the end
# of the jobs topic (kg-admin: lag 0) while the worker still runs. Then, on the same
# broker, embedding, rerank and score jobs through a second worker (see below).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-malformed
kg_need_java

kg_broker_start
big=(--config max.message.bytes=4194304)
kg_topic "$JOBS" 4 "${big[@]}"
kg_topic "$RESULTS" 4
kg_topic "$JOBS.dlq" 1 "${big[@]}"
kg_model

python3 - "$T/jobs.jsonl" "$T/expect.json" <<'PY'
import json, random, sys
rng = random.Random(20261202)
valid, lines = [], []
def job(i, prefix="ok"):
    return {"request_id": f"{prefix}-{i}", "prompt": f"Once upon a time {i}", "max_tokens": 4 + i % 5,
            "temperature": 0.7, "seed": i}
def nl_free(b):
    return b.replace(b"\n", b" ")
cats = {}
def add(cat, b):
    assert b"\n" not in b
    lines.append((cat, b))
    cats[cat] = cats.get(cat, 0) + 1
# truncated JSON: a strict prefix of a job object is never valid JSON
for i in range(300):
    s = json.dumps(job(i, "trunc")).encode()
    add("dlq", s[: rng.randrange(1, len(s) - 1)])
# byte mutations that Python's strict parser also rejects (no NUL: jansson skips a NUL after
# a number, so "4\0," would still be a job)
while cats.get("dlq", 0) < 600:
    s = bytearray(json.dumps(job(rng.randrange(10**6), "mut")).encode())
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(s))
        op = rng.randrange(3)
        if op == 0:
            s[pos] = rng.choice(b'{}[]":,\\\xff\xc3 tfn0')
        elif op == 1:
            del s[pos]
        else:
            s.insert(pos, rng.choice(b'{}[]":,\\\xff\xc3'))
    b = nl_free(bytes(s))
    try:
        json.loads(b)
        continue  # still valid: not what this category is for
    except ValueError:
        add("dlq", b)
# valid JSON, but not a job with a usable request_id ({"prompt": "x"} is no longer one of
# these: kgen-submit keys it line-<N> and the worker runs it as a bare OpenAI body)
notjobs = ['[]', '[1,2]', '"a string"', '42', 'null', 'true', '{}', '{"max_tokens":3}',
           '{"request_id":""}', '{"request_id":"has space","prompt":"x"}',
           '{"request_id":"a/b","prompt":"x"}', '{"request_id":7,"prompt":"x"}',
           '{"request_id":null,"prompt":"x"}', '{"request_id":"' + "x" * 129 + '","prompt":"x"}',
           '{"request_id":"dup","request_id":"dup2","prompt":"x"}', '{"request_id":"n\\u0000ul"}']
for i in range(100):
    add("dlq", notjobs[i % len(notjobs)].encode())
# binary
for i in range(93):
    add("dlq", nl_free(bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000)))))
# ~2 MB values: one looks like a job, but size is checked first
for i in range(5):
    pad = "x" * (2 * 1024 * 1024 + i)
    add("dlq", json.dumps({"request_id": f"huge-{i}", "prompt": pad}).encode())
# wrong types / values with a good request_id: error events
wrong = [("prompt", 123), ("max_tokens", "ten"), ("max_tokens", -1), ("temperature", -1),
         ("messages", "hi"), ("stop", 5), ("top_p", 0), ("seed", "s"), ("stream", "yes"),
         ("logprobs", 21), ("priority", 10**12), ("metadata", [1])]
for i in range(200):
    k, v = wrong[i % len(wrong)]
    j = {"request_id": f"bad-{i}", "prompt": "x"}
    j[k] = v
    add("error", json.dumps(j).encode())
# big but under the limit: decoded, then refused as too long a prompt
for i in range(2):
    add("error", json.dumps({"request_id": f"long-{i}", "prompt": "word " * 180000}).encode())
assert len(lines) == 1000, len(lines)
rng.shuffle(lines)
out = []
v = 0
for n, (cat, b) in enumerate(lines):
    out.append(b)
    if n % 10 == 9:  # interleave: a valid job after every 10 malformed ones
        out.append(json.dumps(job(v)).encode())
        v += 1
assert v == 100
with open(sys.argv[1], "wb") as f:
    f.write(b"\n".join(out) + b"\n")
# the request_ids that must get a terminal event
ids = [f"ok-{i}" for i in range(v)] + [f"bad-{i}" for i in range(200)] + ["long-0", "long-1"]
open(sys.argv[1] + ".ids", "w").write("\n".join(ids) + "\n")
json.dump({"dlq": cats["dlq"], "error": cats["error"], "valid": v}, open(sys.argv[2], "w"))
print(f"input: {len(out)} messages: {cats['dlq']} without a usable request_id, "
      f"{cats['error']} invalid jobs, {v} valid")
PY

port=$(kg_free_port)
kg_worker w1 --http-port "$port" -X message.max.bytes=4194304
kg_wait_assigned 60 4 w1
kg_submit_timed 150 -X message.max.bytes=4194304
ms=$KG_MS
cat "$T/submit.log"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl" "$T/jobs.jsonl.ids"
kg_alive "$(kg_pid w1)" || kg_fail "the worker died"

n_dlq=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["dlq"])' "$T/expect.json")
# The DLQ: headers only (values are binary or 2 MB), one line per message.
kg_tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$BROKERS" \
    --topic "$JOBS.dlq" --from-beginning --max-messages "$n_dlq" --timeout-ms 20000 \
    --consumer-property max.partition.fetch.bytes=8388608 \
    --formatter-property print.value=false --formatter-property print.headers=true \
    --formatter-property print.offset=true >"$T/dlq.txt" 2>"$T/dlq-consumer.log" || true

python3 - "$T/results.jsonl" "$T/dlq.txt" "$T/expect.json" <<'PY'
import collections, json, re, sys
res = [json.loads(l) for l in open(sys.argv[1])]
exp = json.load(open(sys.argv[3]))
by = collections.Counter((r["type"], r.get("code")) for r in res)
ok = [r for r in res if r["request_id"].startswith("ok-")]
assert len(ok) == exp["valid"] and all(r["type"] == "done" for r in ok), by
bad = [r for r in res if not r["request_id"].startswith("ok-")]
assert len(bad) == exp["error"] and all(r["type"] == "error" for r in bad), by
codes = collections.Counter(r["code"] for r in bad)
assert codes == {"invalid_job": 200, "prompt_too_long": 2}, codes
reasons, sources = collections.Counter(), set()
for line in open(sys.argv[2], errors="replace"):
    h = dict(re.findall(r"(kgen-[a-z-]+):([^,\t]*)", line))
    if "kgen-error-reason" not in h:
        continue
    reasons[h["kgen-error-reason"]] += 1
    assert h["kgen-source-topic"] == "jobs", h
    sources.add((h["kgen-source-partition"], h["kgen-source-offset"]))
n = sum(reasons.values())
print(f"dlq: {n} messages ({len(sources)} distinct source offsets) by reason {dict(reasons)}; "
      f"error events {dict(codes)}; {len(ok)} valid jobs done")
assert n == exp["dlq"] and len(sources) == n, (n, exp["dlq"], len(sources))
assert reasons["too_large"] == 5, reasons
PY

# Offsets: auto-committed every 5 s, so the lag reaches 0 while the worker still runs.
kg_wait 40 "group lag 0 on $JOBS" kg_lag_zero "$GROUP" "$JOBS"
kg_note "group $GROUP: lag 0 on $JOBS (1,100 messages) with the worker up"
dlq_metric=$(kg_metric "$port" 'kgen_jobs_total{outcome="dead_letter"}')
kg_note "worker metrics: dead_letter=$dlq_metric; 1100 messages handled in ${ms} ms"
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
if grep -q 'fatal' "$T/w1.log"; then
    kg_fail "the worker logged a fatal error: $(grep -m1 fatal "$T/w1.log")"
fi
t_embed=$(date +%s)

# Embedding, rerank and score jobs (issue 26) on the same broker, beside malformed ones: a worker
# serving a tiny Qwen3-Reranker-shaped model (kgen mkmodel --rerank: it embeds with its last
# token and ranks with its yes/no head) answers embed jobs (strings, token ids, base64,
# dimensions, mean pooling, an OpenAI /v1/embeddings Batch line), a rerank and a score job and
# two bad ones; every vector is finite, of the asked length and unit norm, results sorted and
# cut to top_n, and the group's lag on the topic reaches 0.
JOBS=embed.jobs
RESULTS=embed.results
GROUP=kgen-embed
kg_topics 2
kg_model "$T/rerank.gguf" --arch qwen3 --head-dim 32 --rerank
python3 - "$T/jobs.jsonl" <<'PY'
import json, sys
docs = ["the engine keeps keys and values in blocks", "a queue of jobs", "stock prices fell",
        "blocks of sixteen positions"]
J = [{"request_id": f"emb-{i}", "task": "embed",
      "input": [f"input {k} of job {i}: " + "word " * (3 * k + i) for k in range(1 + i % 4)]}
     for i in range(8)]
J[1].update(input=[[1, 2, 3, 4], [5, 6]], pooling="mean")
J[2].update(encoding_format="base64", dimensions=16)
J[3].update(dimensions=8, normalize=True)
J += [{"request_id": "rr-1", "task": "rerank", "query": "what does the engine keep?",
       "documents": docs, "top_n": 2},
      {"request_id": "sc-1", "task": "score", "text_1": "what does the engine keep?",
       "text_2": docs[:3]},
      {"custom_id": "oa-emb", "method": "POST", "url": "/v1/embeddings",
       "body": {"input": ["one", "two"], "dimensions": 32}},
      {"request_id": "emb-bad", "task": "embed", "input": []},
      {"request_id": "emb-dims", "task": "embed", "input": "x", "dimensions": 65}]
open(sys.argv[1], "w").write("".join(json.dumps(j) + "\n" for j in J))
PY
kg_worker e1
kg_wait_assigned 60 2 e1
kg_submit_timed 60
printf '%s\n' emb-{0..7} rr-1 sc-1 oa-emb emb-bad emb-dims >"$T/embed.ids"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl" "$T/embed.ids"
python3 - "$T/results.jsonl" <<'PY'
import base64, json, math, struct, sys
by = {r["request_id"]: r for r in map(json.loads, open(sys.argv[1]))}
def vecs(r):
    return [list(struct.unpack(f"<{len(base64.b64decode(v)) // 4}f", base64.b64decode(v)))
            if isinstance(v, str) else v for v in r["embeddings"]]
n = 0
for rid, r in by.items():
    if rid.startswith("emb-") and rid not in ("emb-bad", "emb-dims") or rid == "oa-emb":
        assert r["type"] == "done", r
        want = {"emb-2": 16, "emb-3": 8, "oa-emb": 32}.get(rid, 64)
        for v in vecs(r):
            assert len(v) == want and all(math.isfinite(x) for x in v), (rid, len(v))
            assert abs(math.fsum(x * x for x in v) - 1) < 1e-4, rid
            n += 1
assert len(by["emb-0"]["embeddings"]) == 1 and len(by["emb-3"]["embeddings"]) == 4
res = by["rr-1"]["results"]
assert len(res) == 2 and res[0]["relevance_score"] >= res[1]["relevance_score"], res
assert [x["index"] for x in by["sc-1"]["results"]] == [0, 1, 2], by["sc-1"]
assert all(0 < x["relevance_score"] < 1 for x in res + by["sc-1"]["results"])
assert by["emb-bad"]["code"] == "invalid_job" and by["emb-dims"]["code"] == "invalid_job"
print(f"embed: {n} unit vectors, rerank top 2 of 4, score of 3, 2 bad jobs refused")
PY
kg_wait 40 "group lag 0 on $JOBS" kg_lag_zero "$GROUP" "$JOBS"
kg_stop_pid "$(kg_pid e1)" 30
grep -q 'msg="stopped" rc=0' "$T/e1.log" || kg_fail "the embedding worker did not stop cleanly"
kg_note "embed, rerank and score jobs: done, lag 0 ($(($(date +%s) - t_embed)) s)"
echo "PASS: 1,000 malformed messages dead-lettered or failed, 100 valid done, lag 0; embed, rerank and score jobs answered ($(kg_elapsed) s)"
