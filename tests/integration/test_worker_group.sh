#!/usr/bin/env bash
# test_worker_group (acceptance 1): 200 jobs over 4 partitions of a real Kafka broker, two
# kgen-workers in one consumer group (different --worker-id, same --group-id). Every job gets
# exactly one terminal event; per attempt the token events arrive in index order and their
# texts join to the done text; both workers did part of the work; the group's committed
# offsets reach the end of the jobs topic. Prints jobs/s, tokens/s and the split per worker.
# Then prefix-affinity routing: 40 chat jobs over 4 system prompts sent with
# `kgen-submit --key prefix` all finish, the jobs of one system prompt share one partition (so
# one worker and its prefix cache), the prompts spread over several partitions, and the results
# are still keyed by request id.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-group
kg_need_java

kg_broker_start
kg_topics 4
kg_model "$T/model.gguf" --chat-template chatml
kg_jobs "$T/jobs.jsonl" 200

kg_worker w1 --max-batch-size 8
kg_worker w2 --max-batch-size 8
kg_wait_assigned 60 4 w1 w2
kg_note "both workers hold partitions: w1=$(kg_assigned w1) w2=$(kg_assigned w2)"

revokes_before=$(($(kg_log_count "$T/w1.log" 'partitions revoked') + $(kg_log_count "$T/w2.log" 'partitions revoked')))
kg_submit_timed 120
ms=$KG_MS
cat "$T/submit.log"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"

kg_expect_no_errors "$T/results.jsonl"
n1=$(grep -c '"worker_id":"w1"' "$T/results.jsonl" || true)
n2=$(grep -c '"worker_id":"w2"' "$T/results.jsonl" || true)
((n1 > 0 && n2 > 0)) || kg_fail "one worker did nothing: w1=$n1 w2=$n2"
# Without a rebalance during the run no job may run twice.
revokes=$(($(kg_log_count "$T/w1.log" 'partitions revoked') + $(kg_log_count "$T/w2.log" 'partitions revoked') - revokes_before))
dup=$(kg_summary jobs_with_2plus_terminal_events)
kg_note "rebalances during the run: $revokes revokes; jobs with 2+ terminal events: $dup"
if ((revokes == 0)); then
    ((dup == 0)) || kg_fail "$dup jobs have two terminal events without a rebalance"
fi
tokens=$(kg_summary completion_tokens)
kg_note "measured: 200 jobs in ${ms} ms through Kafka with 2 workers:" \
    "$(python3 -c "print(f'{200 / ($ms / 1e3):.1f} jobs/s, {$tokens / ($ms / 1e3):.0f} tokens/s')")," \
    "w1=$n1 w2=$n2 jobs"

# prefix-affinity routing
python3 - "$T/aff.jsonl" <<'PY'
import json, sys
systems = [f"You are assistant number {k}. Answer briefly and politely." for k in range(4)]
with open(sys.argv[1], "w") as f:
    for i in range(40):
        f.write(json.dumps({"request_id": f"aff-{i}", "max_tokens": 4, "messages": [
            {"role": "system", "content": systems[i % 4]},
            {"role": "user", "content": f"Question {i}?"}]}) + "\n")
PY
kg_submit --input "$T/aff.jsonl" --output "$T/aff.out.jsonl" --key prefix --timeout 120 \
    --no-progress 2>"$T/aff.log" || kg_fail "kgen-submit --key prefix: $(cat "$T/aff.log")"
kg_read_results read_uncommitted "$T/keyed.txt" key
python3 - "$T/aff.out.jsonl" "$T/keyed.txt" <<'PY'
import collections, json, sys
res = [json.loads(l) for l in open(sys.argv[1])]
assert len(res) == 40 and all(r["type"] == "done" for r in res), [r for r in res if r["type"] != "done"][:2]
parts = collections.defaultdict(set)
for r in res:
    parts[int(r["request_id"].split("-")[1]) % 4].add(r["partition"])
assert all(len(p) == 1 for p in parts.values()), f"a system prompt's jobs on several partitions: {dict(parts)}"
used = {next(iter(p)) for p in parts.values()}
assert len(used) >= 2, f"the 4 system prompts all on partition {used}"
keys = {}
for line in open(sys.argv[2]):
    key, _, value = line.rstrip("\n").partition("\t")
    if value.startswith("{") and '"aff-' in value:
        keys[json.loads(value)["request_id"]] = key
assert len(keys) == 40 and all(k == v for k, v in keys.items()), "results not keyed by request id"
print(f"--key prefix: each system prompt's 10 jobs on one partition ({dict((k, sorted(v)) for k, v in sorted(parts.items()))}), "
      f"results keyed by request id")
PY

# Offsets are committed every 5 s (auto commit) and at shutdown: stop both, then the lag is 0.
kg_stop_pid "$(kg_pid w1)" 30
kg_stop_pid "$(kg_pid w2)" 30
lag=$(kg_group_lag "$GROUP" "$JOBS")
kg_note "group $GROUP lag on $JOBS after the workers stopped: $lag"
[[ "$lag" == 0 ]] || kg_fail "committed offsets do not reach the end of $JOBS (lag $lag)"
kg_finish "200 jobs, 2 workers, one terminal event each, ordered tokens"
