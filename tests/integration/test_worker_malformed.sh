#!/usr/bin/env bash
# test_worker_malformed (acceptance 3): 1,000 malformed messages interleaved with 100 valid jobs
# on a real broker: truncated and byte-mutated JSON, valid JSON that is not a job (arrays,
# scalars, missing or bad request_id), random binary, 5 values of ~2 MB (over the worker's
# 1 MiB --max-message-bytes; the topics and clients allow 4 MiB so they can be produced and
# dead-lettered), 200 jobs with wrong field types and 2 prompts of ~900 kB. The worker stays up;
# every message without a usable request_id is in the DLQ (counted with the console consumer,
# by kgen-error-reason header), every other malformed one has an error event (invalid_job or
# prompt_too_long), every valid job is done, and the group's committed offsets reach the end
# of the jobs topic (ConsumerGroupCommand: lag 0) while the worker still runs.
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
kg_wait 40 "group lag 0 on $JOBS" test "$(kg_group_lag "$GROUP" "$JOBS")" = 0
kg_note "group $GROUP: lag 0 on $JOBS (1,100 messages) with the worker up"
dlq_metric=$(kg_metric "$port" 'kgen_jobs_total{outcome="dead_letter"}')
kg_note "worker metrics: dead_letter=$dlq_metric; 1100 messages handled in ${ms} ms"
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
if grep -q 'fatal' "$T/w1.log"; then
    kg_fail "the worker logged a fatal error: $(grep -m1 fatal "$T/w1.log")"
fi
echo "PASS: 1,000 malformed messages dead-lettered or failed, 100 valid done, lag 0 ($(kg_elapsed) s)"
