#!/usr/bin/env bash
# test_worker_hybrid (issue 23): a hybrid model through a real Kafka broker. A kgen-worker on a
# random qwen35moe model (gated DeltaNet layers beside gated attention, experts with a shared
# one) serves 24 chat jobs that share a system prompt: every job ends with one done event, the
# recurrent states are reported (kgen_recurrent_state_bytes), the prefix cache starts jobs
# from a saved state instead of computing the system prompt again (kgen_state_restores_total
# above 0), and after the worker stops the group's offsets reach the end of the jobs topic.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-hybrid
kg_need_java

kg_broker_start
kg_topics 2
kg_model "$T/model.gguf" --arch qwen35moe --n-layer 4 --n-expert 4 --n-expert-used 2 \
    --n-ff-exp 64 --chat-template chatml
python3 - "$T/jobs.jsonl" <<'PY'
import json, sys
system = ("You are the assistant of a small library. You answer questions about opening hours, "
          "loans, renewals and the reading room, in two sentences at most, politely.")
with open(sys.argv[1], "w") as f:
    for i in range(24):
        f.write(json.dumps({"request_id": f"hyb-{i}", "max_tokens": 6, "temperature": 0,
                            "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": f"Question number {i}?"}]})
                + "\n")
PY
port=$(kg_free_port)
kg_worker w1 --max-batch-size 8 --http-port "$port"
kg_wait_assigned 60 2 w1
kg_submit --input "$T/jobs.jsonl" --output "$T/results.jsonl" --timeout 120 --no-progress \
    2>"$T/submit.log" || kg_fail "kgen-submit: $(tail -3 "$T/submit.log")"
kg_expect_no_errors "$T/results.jsonl"
python3 - "$T/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
done = {r["request_id"] for r in rows if r.get("type") == "done"}
assert len(done) == 24, f"{len(done)} of 24 jobs done"
print("24 chat jobs done on qwen35moe")
PY
metrics=$(curl -s "http://127.0.0.1:$port/metrics")
metric() { awk -v m="$1" '$1 == m {print $2}' <<<"$metrics"; }
state=$(metric kgen_recurrent_state_bytes)
restores=$(metric kgen_state_restores_total)
kg_note "kgen_recurrent_state_bytes $state, kgen_state_snapshots_total" \
    "$(metric kgen_state_snapshots_total), kgen_state_restores_total $restores"
[[ -n "$state" && "$state" != 0 ]] || kg_fail "no recurrent state reported ($state)"
[[ -n "$restores" && "$restores" != 0 ]] || kg_fail "the prefix cache restored no saved state"
kg_stop_pid "$(kg_pid w1)" 30
lag=$(kg_group_lag "$GROUP" "$JOBS")
[[ "$lag" == 0 ]] || kg_fail "committed offsets do not reach the end of $JOBS (lag $lag)"
kg_finish "qwen35moe served 24 chat jobs through the broker, the system prompt's state restored"
