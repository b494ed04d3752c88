#!/usr/bin/env bash
# test_worker_new_partitions: partitions added to the jobs topic while a worker runs are consumed
# without a restart, within the worker's default topic.metadata.refresh.interval.ms (30 s;
# librdkafka's own default is 5 minutes, longer than this test waits). Also on the real broker:
# an error message quotes what the job sent (max_tokens 10^12, not a clamped 2147483647).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-new-partitions
kg_need_java

kg_broker_start
kg_topics 1
kg_topic "$JOBS.inflight" 4 --config cleanup.policy=compact
kg_model
kg_worker w1
kg_wait_log "$T/w1.log" 'partitions assigned" count=1' 60

"$KG_BIN/kg-admin" add-partitions "$BROKERS" "$JOBS" 4
t0=$(date +%s)
kg_note "the jobs topic now has 4 partitions"
# The worker picks them up at its next metadata refresh (a rebalance follows).
kg_wait_log "$T/w1.log" 'partitions assigned" count=4' 90
kg_note "w1 took the new partitions after $(($(date +%s) - t0)) s"

kg_jobs "$T/jobs.jsonl" 24
echo '{"request_id": "too-many", "prompt": "x", "max_tokens": 1000000000000}' >>"$T/jobs.jsonl"
kg_submit_timed 120
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
python3 - "$T/results.jsonl" <<'PY'
import collections, json, sys
res = {r["request_id"]: r for r in map(json.loads, open(sys.argv[1]))}
tm = res.pop("too-many")
assert tm["type"] == "error" and tm["code"] == "max_tokens_too_large", tm
assert tm["message"] == "max_tokens 1000000000000 exceeds this worker's limit of 4096", tm["message"]
parts = collections.Counter(r["partition"] for r in res.values())
assert all(r["type"] == "done" for r in res.values())
assert set(parts) - {0}, f"no job came from a new partition: {dict(parts)}"
print(f"jobs by partition: {dict(sorted(parts.items()))}; too-many -> '{tm['message']}'")
PY
kg_finish "new partitions are consumed without a restart; errors quote the job"
