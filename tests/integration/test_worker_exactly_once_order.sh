#!/usr/bin/env bash
# test_worker_exactly_once_order: --exactly-once when jobs finish out of order and the partition
# moves. One partition: a long job at offset 0, eight short ones after it. The short ones finish
# first; the partition's offset cannot pass the long job, so their answers commit at the next
# transaction with the offset commit's metadata naming them as answered above it (kg_txn,
# kg_answered.h), not when the long job ends (issue 29). A second worker joins while the long job
# runs (a rebalance): the first worker gives the partition back, its long job is dropped, the
# new owner (either worker) reads the metadata, skips the eight answered jobs and runs only the
# long one, and a
# read_committed reader finds exactly one terminal event per job (committed early without the
# metadata, the eight short jobs showed two each).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-eos-order
kg_need_java

kg_broker_start
kg_topics 1
# slow enough (about 80 tokens/s on one thread) that the long job still runs at the rebalance
kg_model "$T/model.gguf" --n-embd 512 --n-layer 8 --n-head 8 --n-head-kv 4 --n-ff 1536
python3 - "$T/jobs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"request_id": "long-0", "prompt": "Once upon a time", "max_tokens": 1900,
                        "ignore_eos": True}) + "\n")
    for i in range(1, 9):
        f.write(json.dumps({"request_id": f"short-{i}", "prompt": f"Short {i}", "max_tokens": 4,
                            "ignore_eos": True}) + "\n")
PY
# eager assignment without the graceful handoff, so that the partition is revoked while the long
# job runs (cooperative-sticky would leave the one partition where it is, and the handoff would
# let the long job finish first: test_worker_rebalance covers those)
fast=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=500 --assignment-strategy "range,roundrobin"
    --handoff-timeout 0)
p1=$(kg_free_port)
kg_worker w1 --exactly-once --max-batch-size 10 --poison-after 0 --cancel-topic none \
    --http-port "$p1" "${fast[@]}"
kg_wait_assigned 60 1 w1
kg_submit_bg 300
# the short jobs are done in the engine (4 tokens each, beside the long one) well before this,
# and each transaction interval (100 ms) commits what finished
kg_wait 60 "the long job under way" kg_metric_ge "$p1" kgen_decode_tokens_total 150
kg_wait 5 "the eight short answers committed" kg_metric_ge "$p1" kgen_jobs_total 8
done_early=$(kg_metric "$p1" kgen_jobs_total)
((done_early == 8)) || kg_fail "$done_early answers committed while the long job runs (8 expected)"
kg_note "the 8 short answers committed while the long job runs"
kg_worker w2 --exactly-once --max-batch-size 10 --poison-after 0 --cancel-topic none "${fast[@]}"
kg_wait_log "$T/w1.log" 'msg="partitions revoked"' 60
kg_note "rebalance: $(grep -o 'answers of revoked partitions dropped.*' "$T/w1.log" || echo 'nothing dropped')"

kg_wait 60 "the new owner reading the eight answered jobs" grep -q \
    'msg="jobs answered above the committed offset by the previous owner" .*committed=0 answered=8' \
    "$T/w1.log" "$T/w2.log"
kg_wait_exit "$(kg_pid submit)" 300
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC (not every job finished)"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"
dup=$(kg_summary jobs_with_2plus_terminal_events)
((dup == 0)) || kg_fail "$dup jobs with two terminal events seen by a read_committed reader"
kg_read_results read_committed "$T/committed.jsonl"
python3 - "$T/committed.jsonl" <<'PY'
import collections, json, sys
c = collections.Counter(json.loads(l)["request_id"] for l in open(sys.argv[1])
                        if l.startswith("{") and json.loads(l)["type"] != "token")
assert len(c) == 9 and set(c.values()) == {1}, c
print("read_committed: one terminal event for each of the 9 jobs")
PY
kg_wait 60 "group lag 0" kg_lag_zero "$GROUP" "$JOBS"
skipped=$(cat "$T/w1.log" "$T/w2.log" | grep -c 'msg="job answered by the previous owner: not run again"')
answered=$(cat "$T/w1.log" "$T/w2.log" | grep -c 'msg="job done"')
((skipped == 8 && answered == 9)) ||
    kg_fail "$skipped jobs skipped by the new owner, $answered answers committed (8 and 9 expected)"
kg_note "terminal events committed: w1 $(kg_log_count "$T/w1.log" "msg=\"job done\"") w2 $(kg_log_count "$T/w2.log" "msg=\"job done\""); the new owner skipped $skipped"
kg_stop_pid "$(kg_pid w1)" 30
kg_stop_pid "$(kg_pid w2)" 30
kg_finish "exactly-once: answers that finish ahead of an earlier job commit at once, named above its offset"
