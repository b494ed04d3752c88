#!/usr/bin/env bash
# test_worker_lanes: priority lanes on a real broker. One worker reads two jobs topics,
# `--jobs-topic lanes.interactive:8,lanes.bulk:1`. A backlog of 420 bulk jobs and 12
# interactive jobs are on the broker before the worker starts (sending the interactive jobs
# while the bulk backlog ran made the result a race between kgen-submit's start-up and the
# machine's speed). Every job of both topics finishes once, each event names the topic its job
# came from, an unparseable message on the bulk topic goes to that topic's DLQ
# (lanes.bulk.dlq), and the group commits both topics (lag 0 on each). The interactive jobs
# jump the backlog: every one is answered before three quarters of the bulk jobs (the bulk lane
# is paused first and interactive jobs take 8 of every 9 free slots). A job's priority orders
# jobs within its lane: one bulk job in 21 has priority 5 and passes bulk jobs taken before it
# (in arrival order none could, as all are the same length). /metrics labels the lag of each
# partition with its topic. A cancel sent by a producer that knows only its lane
# (`kgen-submit --jobs-topic lanes.bulk --cancel ID`, which writes to lanes.bulk.cancel) reaches
# the worker, which reads every lane's `<topic>.cancel`: the job sent after it is answered
# `cancelled` on arrival. A slot without waiting: with the batch full of long bulk jobs (4,000
# tokens, seconds each), an interactive job preempts the newest of them and is answered while
# every one still runs (they are then cancelled, none having finished).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-lanes
kg_need_java

kg_broker_start
for t in lanes.interactive lanes.bulk; do
    kg_topic "$t" 2
    kg_topic "$t.dlq" 1
    kg_topic "$t.inflight" 2 --config cleanup.policy=compact
    kg_topic "$t.cancel" 1
done
kg_topic "$RESULTS" 4
kg_model "$T/model.gguf" --ctx 4096 # room for the long bulk jobs
port=$(kg_free_port)
JOBS=lanes.interactive:8,lanes.bulk:1

kg_jobs "$T/bulk.jsonl" 400 '{"max_tokens": 24, "ignore_eos": true, "stream": false}' bulk
# one job in 21 asks for priority 5: each passes the bulk jobs taken before it and still waiting
kg_jobs "$T/urgent.jsonl" 20 '{"max_tokens": 24, "ignore_eos": true, "stream": false, "priority": 5}' urgent
python3 - "$T/bulk.jsonl" "$T/urgent.jsonl" <<'PY'
import sys
bulk, urgent = open(sys.argv[1]).readlines(), open(sys.argv[2]).readlines()
with open(sys.argv[1], "w") as f:
    for i, line in enumerate(bulk):
        f.write(line)
        if i % 20 == 19:
            f.write(urgent[i // 20])
PY
echo 'not json at all' >>"$T/bulk.jsonl"
kg_jobs "$T/inter.jsonl" 12 '{"max_tokens": 8, "ignore_eos": true}' inter
kg_bg bulk "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic lanes.bulk --results-topic \
    "$RESULTS" --input "$T/bulk.jsonl" --output "$T/bulk.out" --events "$T/bulk.events" \
    --timeout 300 --no-progress
kg_bg inter "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic lanes.interactive \
    --results-topic "$RESULTS" --input "$T/inter.jsonl" --output "$T/inter.out" \
    --events "$T/inter.events" --timeout 300 --no-progress
kg_wait_log "$T/bulk.log" 'msg="produced 421 messages' 60
kg_wait_log "$T/inter.log" 'msg="produced 12 messages' 60
kg_worker w1 --max-batch-size 4 --max-queue-depth 16 --http-port "$port"
kg_wait_exit "$(kg_pid inter)" 300
((KG_RC == 0)) || kg_fail "the interactive kgen-submit exited $KG_RC"
kg_wait_exit "$(kg_pid bulk)" 300
((KG_RC == 0)) || kg_fail "the bulk kgen-submit exited $KG_RC"
kg_check_results "$T/bulk.jsonl" "$T/bulk.out" "$T/bulk.events"
kg_check_results "$T/inter.jsonl" "$T/inter.out" "$T/inter.events"
kg_expect_no_errors "$T/bulk.out"
kg_expect_no_errors "$T/inter.out"

python3 - "$T/bulk.out" "$T/inter.out" <<'PY'
import json, sys
bulk = [json.loads(l) for l in open(sys.argv[1])]
inter = [json.loads(l) for l in open(sys.argv[2])]
assert all(r["topic"] == "lanes.bulk" for r in bulk), "a bulk event names another topic"
assert all(r["topic"] == "lanes.interactive" for r in inter), "an interactive event names another topic"
ts = sorted(r["ts_ms"] for r in bulk)
last_inter = max(r["ts_ms"] for r in inter)
before = sum(1 for t in ts if t <= last_inter)
print(f"the last interactive answer came after {before} of the {len(ts)} bulk answers "
      f"({last_inter - ts[0]} ms into the bulk run, which took {ts[-1] - ts[0]} ms)")
assert before * 4 <= len(ts), "the interactive jobs did not jump the bulk backlog"
# priority within the lane: an urgent job is answered before bulk jobs of its partition that
# came before it in the log but were still waiting in the worker when it was taken
urgent = [r for r in bulk if r["request_id"].startswith("urgent-")]
plain = [r for r in bulk if r["request_id"].startswith("bulk-")]
passed = [sum(1 for b in plain if b["partition"] == u["partition"] and b["offset"] < u["offset"]
              and b["ts_ms"] > u["ts_ms"]) for u in urgent]
print(f"the 20 urgent bulk jobs passed {sum(passed)} earlier bulk jobs of their partitions "
      f"(per job: {sorted(passed)})")
# in arrival order none could pass: an earlier job of the same length is admitted no later
assert sum(passed) >= 10, "priority did not order jobs within the bulk lane"
PY
kg_read_topic lanes.bulk.dlq read_uncommitted "$T/dlq.txt" headers
grep -q 'kgen-source-topic:lanes.bulk' "$T/dlq.txt" || kg_fail "no DLQ copy on lanes.bulk.dlq"
# the lag of a partition shows once the worker has read its end offset (a periodic query)
lag_gauge() {
    curl -s "http://127.0.0.1:$port/metrics" |
        grep -q 'kgen_consumer_lag_messages{topic="lanes.interactive",partition="1"}'
}
kg_wait 30 "the per-topic lag gauge" lag_gauge

# a cancel on the bulk lane's own cancel topic, before its job
kg_wait_log "$T/w1.log" 'msg="reading cancels" topic=lanes.bulk.cancel' 60
kg_submit --jobs-topic lanes.bulk --cancel late-0 2>"$T/cancel.log" ||
    kg_fail "kgen-submit --cancel failed: $(cat "$T/cancel.log")"
grep -q 'sent 1 cancels to lanes.bulk.cancel' "$T/cancel.log" ||
    kg_fail "the cancel did not go to lanes.bulk.cancel: $(cat "$T/cancel.log")"
kg_jobs "$T/late.jsonl" 1 '{"max_tokens": 24, "ignore_eos": true}' late
kg_submit --jobs-topic lanes.bulk --input "$T/late.jsonl" --output "$T/late.out" \
    --timeout 60 --no-progress 2>"$T/late.log" || kg_fail "the cancelled job: $(cat "$T/late.log")"
python3 - "$T/late.out" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 1 and r[0]["type"] == "error" and r[0]["code"] == "cancelled", r
assert r[0]["text"] == "" and r[0]["topic"] == "lanes.bulk", r
print("a cancel sent to lanes.bulk.cancel answered its bulk job `cancelled` on arrival")
PY
# a slot without waiting: 6 long bulk jobs fill the 4 slots and the engine's slack of 2; an
# interactive job sent then takes the slot of the newest (the engine preempts a lower lane's
# tier for a higher one) and is answered while all run: each ends `cancelled`, with text,
# by the cancels sent after that answer. Without preemption it waited for a bulk job to finish.
kg_jobs "$T/long.jsonl" 6 '{"max_tokens": 4000, "ignore_eos": true, "stream": false}' long
kg_bg long "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic lanes.bulk --results-topic \
    "$RESULTS" --input "$T/long.jsonl" --output "$T/long.out" --timeout 120 --no-progress
full_batch() { test "$(kg_metric "$port" kgen_num_requests_running)" = 4; }
kg_wait 60 "a batch full of long bulk jobs" full_batch
kg_jobs "$T/now.jsonl" 1 '{"max_tokens": 8, "ignore_eos": true}' now
kg_submit --jobs-topic lanes.interactive --input "$T/now.jsonl" --output "$T/now.out" \
    --timeout 60 --no-progress 2>"$T/now.log" || kg_fail "the interactive job: $(cat "$T/now.log")"
# the preemption is counted where an operator sees it
lane_preemptions=$(kg_metric "$port" kgen_lane_preemptions_total)
((${lane_preemptions:-0} >= 1)) || kg_fail "kgen_lane_preemptions_total is ${lane_preemptions:-missing}"
kg_submit --jobs-topic lanes.bulk --cancel long-0 long-1 long-2 long-3 long-4 long-5 \
    2>"$T/cancel-long.log" || kg_fail "cancelling the long jobs: $(cat "$T/cancel-long.log")"
kg_wait_exit "$(kg_pid long)" 60
python3 - "$T/now.out" "$T/long.out" <<'PY'
import json, sys
now = [json.loads(l) for l in open(sys.argv[1])]
long = [json.loads(l) for l in open(sys.argv[2])]
assert len(now) == 1 and now[0]["type"] == "done", now
assert len(long) == 6, f"{len(long)} answers to the 6 long bulk jobs"
done = [r["request_id"] for r in long if r["type"] == "done"]
assert not done, f"bulk jobs {done} finished before the interactive job was answered"
assert all(r["type"] == "error" and r["code"] == "cancelled" for r in long), long
ran = sorted(len(r["text"]) for r in long)
assert sum(1 for n in ran if n > 0) >= 4, f"the batch was not full of bulk jobs: {ran}"
print(f"an interactive job sent to a batch full of long bulk jobs was answered in "
      f"{now[0]['timings']['ttft_ms']} ms to its first token while all ran (text so far: {ran} "
      f"bytes); they ended cancelled")
PY
kg_wait 60 "bulk lag 0" kg_lag_zero "$GROUP" lanes.bulk
kg_wait 60 "interactive lag 0" kg_lag_zero "$GROUP" lanes.interactive
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
kg_finish "two lanes: both topics answered and committed, interactive jobs jump a bulk backlog and preempt long bulk jobs, a lane's own cancel topic is read"
