#!/usr/bin/env bash
# test_worker_oversized: no job can make an event the broker refuses, on a real broker.
# Phase 1 (default topics; the event budget is the producer's message.max.bytes, 1,000,000,
# less 512): a job with 1 MB of metadata (under --max-message-bytes, so it is accepted) is
# answered at intake with invalid_job and no metadata echo; a job whose done event would carry
# ~5 MB of logprobs ends with a done event without them (logprobs_truncated); a job with a
# 900 KB stop string is answered with invalid_job; a job with 999.2 KB of metadata (just under the budget) ends with a
# done event without the echo (metadata_truncated); a streamed job keeps its logprobs in its
# token events and drops them from the done event; a 1.2 MB message goes to the DLQ cut to the
# DLQ's limit with kgen-payload-truncated-from. Every event fits; the worker keeps running and
# finishes ordinary jobs after them.
# Phase 2 (a results topic with max.message.bytes=8192, read by the worker with DescribeConfigs):
# long outputs end with done events cut to fit (text_truncated, text_bytes_cut); streamed, the
# token events still carry the whole text; nothing is refused.
# Phase 3 (the worker told --max-event-bytes 100000, the results topic takes 20000): the broker
# refuses the done event; the job is answered with a small internal error event and a DLQ copy
# of the refused event, the log says so and never says "job done" for it, and the worker goes on.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-oversized
kg_need_java

kg_broker_start
kg_topic "$JOBS" 4 --config max.message.bytes=3000000
kg_topic "$RESULTS" 4
kg_topic "$JOBS.dlq" 1
kg_topic "$JOBS.inflight" 4 --config cleanup.policy=compact
kg_model "$T/model.gguf" --ctx 8192
big=(--ctx 8192 --max-tokens-limit 8192 --max-batch-size 4)

# ---- phase 1: the default budget ----
python3 - "$T/jobs.jsonl" "$T/huge.txt" <<'PY'
import json, sys
jobs = [
    {"request_id": "meta-1mb", "prompt": "Hi", "max_tokens": 1, "metadata": {"b": "m" * 1_000_000}},
    {"request_id": "logprobs-5mb", "prompt": "Hi", "max_tokens": 5000, "ignore_eos": True,
     "logprobs": 20, "stream": False},
    {"request_id": "stop-900kb", "prompt": "Hi", "max_tokens": 4, "stop": ["y" * 900_000]},
    {"request_id": "meta-999kb", "prompt": "Hi", "max_tokens": 8, "metadata": {"b": "m" * 999_200}},
    {"request_id": "stream-logprobs", "prompt": "Hi", "max_tokens": 1500, "ignore_eos": True,
     "logprobs": 20},
]
jobs += [{"request_id": f"ok-{i}", "prompt": "Once upon a time", "max_tokens": 16} for i in range(4)]
with open(sys.argv[1], "w") as f:
    for j in jobs:
        f.write(json.dumps(j) + "\n")
# 1.2 MB: over --max-message-bytes (1 MiB), so it is dead-lettered; over the DLQ topic's limit too
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({"request_id": "huge", "prompt": "h" * 1_200_000}) + "\n")
PY
kg_worker w1 "${big[@]}"
kg_wait_log "$T/w1.log" 'partitions assigned' 60
kg_tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$BROKERS" --topic "$JOBS" \
    --producer-property max.request.size=3000000 <"$T/huge.txt" >/dev/null 2>&1
kg_submit_timed 240 -X message.max.bytes=3000000
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_alive "$(kg_pid w1)" || kg_fail "w1 died"
python3 - "$T/results.jsonl" "$T/events.jsonl" 999488 <<'PY'
import json, sys
budget = int(sys.argv[3])
res = {r["request_id"]: r for r in map(json.loads, open(sys.argv[1], "rb"))}
sizes = [len(l) - 1 for l in open(sys.argv[2], "rb")]
assert max(sizes) <= budget, f"an event of {max(sizes)} bytes (budget {budget})"
m = res["meta-1mb"]
assert m["type"] == "error" and m["code"] == "invalid_job", m
assert m["message"].startswith("metadata: ") and m.get("metadata_truncated") and "metadata" not in m, m
lp = res["logprobs-5mb"]
assert lp["type"] == "done" and lp.get("logprobs_truncated") and "logprobs" not in lp, lp.keys()
assert lp["usage"]["completion_tokens"] == 5000 and not lp.get("text_truncated"), lp["usage"]
st = res["stop-900kb"]
assert st["type"] == "error" and st["code"] == "invalid_job" and "stop" in st["message"], st
m9 = res["meta-999kb"]
assert m9["type"] == "done" and m9.get("metadata_truncated") and "metadata" not in m9, m9.keys()
sl = res["stream-logprobs"]
assert sl["type"] == "done" and sl.get("logprobs_truncated"), sl.keys()
tok = [json.loads(l) for l in open(sys.argv[2], "rb") if b'"stream-logprobs"' in l[:200]]
tok = [e for e in tok if e["type"] == "token"]
assert len(tok) == 1500 and all("logprobs" in e for e in tok), len(tok)
for i in range(4):
    assert res[f"ok-{i}"]["type"] == "done", res[f"ok-{i}"]
big = sorted(((s, i) for i, s in enumerate(sizes)), reverse=True)[:3]
print(f"phase 1: {len(sizes)} events, the largest {big[0][0]} bytes (budget {budget}); "
      f"meta-1mb -> invalid_job '{m['message'][:70]}...'; logprobs-5mb -> done without logprobs "
      f"({len(json.dumps(lp))} bytes); stop-900kb -> invalid_job; meta-999kb -> done, "
      f"metadata_truncated; stream-logprobs -> 1500 token events with logprobs, done without")
PY
grep -q 'msg="event budget" max_event_bytes=999488 .*results_topic_max_message_bytes=1048588' \
    "$T/w1.log" || kg_fail "w1 did not log the event budget it read"
kg_read_topic "$JOBS.dlq" read_uncommitted "$T/dlq.txt" headers
python3 - "$T/dlq.txt" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1], "rb") if b"kgen-error-reason:too_large" in l]
assert len(lines) == 1, f"{len(lines)} too_large DLQ copies"
m = re.search(rb"kgen-payload-truncated-from:(\d+)", lines[0])
assert m and int(m.group(1)) > 1_200_000, lines[0][:400]
payload = lines[0].rstrip(b"\n").split(b"\t")[-1]
assert len(payload) < 1_048_588 - 2048 and payload.startswith(b'{"request_id": "huge"'), len(payload)
print(f"phase 1: the 1.2 MB job is on the DLQ cut to {len(payload)} bytes, "
      f"kgen-payload-truncated-from:{int(m.group(1))}")
PY
kg_stop_pid "$(kg_pid w1)" 20

# ---- phase 2: a results topic that takes 8 KiB, read with DescribeConfigs ----
JOBS=jobs2 RESULTS=results2 GROUP=g2
kg_topic "$JOBS" 2
kg_topic "$RESULTS" 2 --config max.message.bytes=8192
kg_topic "$JOBS.dlq" 1
kg_topic "$JOBS.inflight" 2 --config cleanup.policy=compact
python3 - "$T/jobs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i, stream in enumerate([True, False, True]):
        f.write(json.dumps({"request_id": f"long-{i}", "prompt": "Hi", "max_tokens": 6000,
                            "ignore_eos": True, "stream": stream}) + "\n")
PY
kg_worker w2 "${big[@]}"
kg_wait_log "$T/w2.log" 'partitions assigned' 60
kg_submit_timed 240
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
grep -q 'max_event_bytes=7680 .*results_topic_max_message_bytes=8192' "$T/w2.log" ||
    kg_fail "w2 did not size its events to the topic's max.message.bytes"
((!$(kg_log_count "$T/w2.log" 'refused'))) || kg_fail "the broker refused an event of w2"
python3 - "$T/results.jsonl" "$T/events.jsonl" <<'PY'
import json, sys
res = [json.loads(l) for l in open(sys.argv[1], "rb")]
sizes = [len(l) - 1 for l in open(sys.argv[2], "rb")]
assert max(sizes) <= 7680, max(sizes)
for r in res:
    assert r["type"] == "done" and r.get("text_truncated") and r["text_bytes_cut"] > 0, r.keys()
print(f"phase 2: {len(sizes)} events, the largest {max(sizes)} bytes (topic takes 8192); done "
      f"events keep {[len(r['text'].encode()) for r in res]} bytes of text and say "
      f"text_bytes_cut {[r['text_bytes_cut'] for r in res]}")
PY
kg_stop_pid "$(kg_pid w2)" 20

# ---- phase 3: the broker refuses a done event ----
JOBS=jobs3 RESULTS=results3 GROUP=g3
kg_topic "$JOBS" 1
kg_topic "$RESULTS" 1 --config max.message.bytes=20000
kg_topic "$JOBS.dlq" 1
kg_topic "$JOBS.inflight" 1 --config cleanup.policy=compact
kg_worker w3 "${big[@]}" --max-event-bytes 100000
kg_wait_log "$T/w3.log" 'partitions assigned' 60
python3 -c 'import json; print(json.dumps({"request_id": "refused", "prompt": "Hi", "max_tokens": 8,
    "stream": False, "metadata": {"b": "m" * 50000}}))' >"$T/jobs.jsonl"
kg_submit_timed 120
python3 - "$T/results.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["type"] == "error" and r["code"] == "internal", r
assert "could not be delivered" in r["message"] and "dead-letter" in r["message"], r["message"]
print(f"phase 3: refused -> internal error '{r['message']}'")
PY
kg_wait_log "$T/w3.log" 'msg="job result not delivered, answered with an internal error" request_id=refused' 10
kg_wait_log "$T/w3.log" 'msg="job failed" request_id=refused .*code=internal' 10
((!$(kg_log_count "$T/w3.log" 'msg="job done" request_id=refused'))) ||
    kg_fail "the log says job done for a job whose done event was refused"
kg_jobs "$T/jobs.jsonl" 4
kg_submit_timed 120
kg_expect_no_errors "$T/results.jsonl"
kg_alive "$(kg_pid w3)" || kg_fail "w3 died"
kg_read_topic "$JOBS.dlq" read_uncommitted "$T/dlq3.txt" headers
grep -q 'kgen-error-reason:undeliverable.*kgen-payload:event' "$T/dlq3.txt" ||
    kg_fail "no DLQ copy of the refused event"
kg_note "phase 3: the refused done event is on the DLQ; w3 finished 4 more jobs"
kg_finish "every event fits; a refused event is answered; the workers kept running"
