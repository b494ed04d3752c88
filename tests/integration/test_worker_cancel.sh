#!/usr/bin/env bash
# test_worker_cancel: cancels on a real broker (the cancel topic, kgen-submit --cancel and
# --cancel-on-interrupt). One worker with two slots runs two jobs while a third waits for a slot;
# a cancel is sent for one running job, the waiting one, a job not sent yet, and an unknown id.
# The running job ends with error `cancelled` carrying the text so far (its token events join to
# it), the waiting one with an empty text, both within one engine step of the cancel's arrival
# (the worker logs steps_after_cancel: the step that may be running, then the next, which applies
# it); the job sent after its cancel is answered `cancelled` on arrival without running; the other
# running job finishes with done; the unknown id changes nothing. Then kgen-submit
# --cancel-on-interrupt gets a Ctrl-C while its jobs run: it cancels them, collects their
# `cancelled` answers and exits 130. Every offset is committed (group lag 0).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-cancel
kg_need_java

kg_broker_start
kg_topics 4
kg_topic "$JOBS.cancel" 1
# a model slow enough (about 80 tokens/s on one thread) that a long job is still running when
# its cancel arrives
kg_model "$T/model.gguf" --n-embd 512 --n-layer 8 --n-head 8 --n-head-kv 4 --n-ff 1536
port=$(kg_free_port)
kg_worker w1 --max-batch-size 2 --max-queue-depth 4 --http-port "$port" --poison-after 0
kg_wait_assigned 60 4 w1
kg_wait_log "$T/w1.log" 'msg="reading cancels"' 30

python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def job(rid, n):
    return json.dumps({"request_id": rid, "prompt": f"Once upon a time {rid}", "max_tokens": n,
                       "ignore_eos": True, "temperature": 0}) + "\n"
open(f"{t}/jobs.jsonl", "w").write(job("run-0", 1500) + job("run-1", 1000))
open(f"{t}/wait.jsonl", "w").write(job("wait-0", 1500))
open(f"{t}/late.jsonl", "w").write(job("late-0", 1500))
open(f"{t}/int.jsonl", "w").write(job("int-0", 1500) + job("int-1", 1500))
PY
kg_submit_bg 300
kg_wait 60 "two jobs running" kg_metric_ge "$port" kgen_num_requests_running 2
kg_wait 60 "tokens generated" kg_metric_ge "$port" kgen_decode_tokens_total 40
# the third job waits for a slot
kg_bg submitw "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
    --results-topic "$RESULTS" --input "$T/wait.jsonl" --output "$T/resultsw.jsonl" \
    --events "$T/eventsw.jsonl" --timeout 300 --no-progress
kg_wait 60 "a job waiting for a slot" kg_metric_ge "$port" kgen_num_requests_waiting 1
# run-1 (1,000 tokens) keeps wait-0 waiting: the cancels of running and waiting jobs go first,
# late-0's (its job is sent much later) after them
kg_submit --cancel run-0 wait-0 nobody-x 2>"$T/cancel2.log" ||
    kg_fail "kgen-submit --cancel failed: $(cat "$T/cancel2.log")"
grep -q 'sent 3 cancels' "$T/cancel2.log" || kg_fail "cancels not sent: $(cat "$T/cancel2.log")"
kg_submit --cancel late-0 2>"$T/cancel1.log" || kg_fail "kgen-submit --cancel failed: $(cat "$T/cancel1.log")"
kg_wait_exit "$(kg_pid submitw)" 200
((KG_RC == 0)) || kg_fail "kgen-submit (the waiting job) exited $KG_RC"
kg_wait_exit "$(kg_pid submit)" 200
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC"
cat "$T/resultsw.jsonl" >>"$T/results.jsonl"
cat "$T/wait.jsonl" >>"$T/jobs.jsonl"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
mv "$T/results.jsonl" "$T/results1.jsonl"
mv "$T/events.jsonl" "$T/events1.jsonl"

# the job whose cancel came first: answered on arrival, never run
kg_submit --input "$T/late.jsonl" --output "$T/results2.jsonl" --events "$T/events2.jsonl" \
    --timeout 60 --no-progress 2>"$T/submit2.log" || kg_fail "late job: $(cat "$T/submit2.log")"

# Ctrl-C in kgen-submit --cancel-on-interrupt: its running jobs are cancelled and answered
kg_bg submit3 "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
    --results-topic "$RESULTS" --input "$T/int.jsonl" --output "$T/results3.jsonl" \
    --events "$T/events3.jsonl" --timeout 300 --no-progress --cancel-on-interrupt
kg_wait 60 "the interrupt jobs running" kg_metric_ge "$port" kgen_num_requests_running 2
sleep 1
kill -INT "$(kg_pid submit3)"
kg_wait_exit "$(kg_pid submit3)" 60
((KG_RC == 130)) || kg_fail "kgen-submit --cancel-on-interrupt exited $KG_RC, want 130"
grep -q 'interrupted: cancelling 2 jobs' "$T/submit3.log" || kg_fail "no cancels on Ctrl-C"

python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
res = {}
for f in ("results1", "results2", "results3"):
    for l in open(f"{t}/{f}.jsonl"):
        r = json.loads(l)
        res[r["request_id"]] = r
events = [json.loads(l) for f in ("events1", "events2", "events3") for l in open(f"{t}/{f}.jsonl")]
def tokens(rid):
    return [e for e in events if e["request_id"] == rid and e["type"] == "token"]
want = {"run-0": "cancelled", "wait-0": "cancelled", "late-0": "cancelled", "int-0": "cancelled",
        "int-1": "cancelled", "run-1": "done"}
for rid, what in want.items():
    r = res.get(rid)
    assert r, f"no result for {rid}"
    got = r["type"] if r["type"] == "done" else r["code"]
    assert got == what, f"{rid}: {got}, want {what}: {r}"
r0 = res["run-0"]
text = "".join(e["text"] for e in tokens("run-0"))
assert r0["text"] == text and len(text) > 0, (r0, len(text))
n0 = int(r0["message"].split("after ")[1].split(" ")[0])
assert 0 < n0 < 1500, r0["message"]
assert res["wait-0"]["text"] == "" and not tokens("wait-0"), res["wait-0"]
assert res["late-0"]["text"] == "" and not tokens("late-0"), res["late-0"]
assert "nobody-x" not in res
assert res["run-1"]["usage"]["completion_tokens"] == 1000
print(f"cancelled: run-0 after {n0} tokens (its token events join to its text), wait-0, late-0 "
      f"on arrival, int-0 and int-1 on Ctrl-C; run-1 done with 1000 tokens")
PY

# within one step of arrival: every cancelled job ended at most 2 steps after its cancel arrived
python3 - "$T/w1.log" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1]) if 'msg="job cancelled"' in l]
steps = {re.search(r"request_id=(\S+)", l).group(1): int(re.search(r"steps_after_cancel=(\d+)", l).group(1))
         for l in lines}
arrival = [re.search(r"request_id=(\S+)", l).group(1) for l in lines if "on_arrival=1" in l]
assert set(steps) == {"run-0", "wait-0", "late-0", "int-0", "int-1"}, steps
assert all(v <= 2 for v in steps.values()), steps
assert arrival == ["late-0"], arrival
print("steps after the cancel arrived: " + " ".join(f"{k}={v}" for k, v in sorted(steps.items())))
PY
kg_wait 60 "group lag 0" kg_lag_zero "$GROUP" "$JOBS"
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
kg_finish "cancels of running, waiting and not-yet-sent jobs end in cancelled within one step; Ctrl-C cancels"
