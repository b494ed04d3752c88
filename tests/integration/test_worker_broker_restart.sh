#!/usr/bin/env bash
# test_worker_broker_restart (acceptance 5): the Kafka broker is restarted (stopped, then started
# on the same address with the same data) while a worker runs 160 jobs. The worker reconnects
# by itself, keeps or rejoins its group and finishes everything: every job has exactly one line
# in kgen-submit's output, token streams stay in order per attempt, the worker never hit a
# fatal error and stops cleanly. Prints the outage and how many jobs ran twice.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-restart
kg_need_java

N=160
kg_broker_start
kg_topics 4
kg_model
# 400 tokens a job: three quarters of the work is still ahead when the broker goes down, even on
# a machine several times faster than a 2-core one (asserted below from the answers' times: an
# answer's ts_ms is when the worker made it, delivered or queued)
kg_jobs "$T/jobs.jsonl" "$N" '{"max_tokens": 400, "ignore_eos": true}'

port=$(kg_free_port)
kg_worker w1 --max-batch-size 8 --http-port "$port"
kg_wait_assigned 60 4 w1
kg_submit_bg 170
kg_wait 90 "a quarter of the jobs done" kg_metric_ge "$port" kgen_jobs_total $((N / 4))
before=$(kg_metric "$port" kgen_jobs_total)
t0=$(date +%s%N)
"$KG_BROKER" restart --dir "$BROKER_DIR" >"$T/restart.log" 2>&1 || {
    cat "$T/restart.log" >&2
    kg_fail "broker restart failed"
}
outage=$((($(date +%s%N) - t0) / 1000000))
[[ "$("$KG_BROKER" bootstrap --dir "$BROKER_DIR")" == "$BROKERS" ]] || kg_fail "address changed"
kg_note "broker restarted in ${outage} ms with $before of $N jobs done"
kg_alive "$(kg_pid w1)" || kg_fail "the worker died while the broker was down"

kg_wait_exit "$(kg_pid submit)" 180
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC (not every job finished)"
tail -n 1 "$T/submit.log"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"
python3 - "$T/results.jsonl" "$((t0 / 1000000))" <<'PY'
import json, sys
down = int(sys.argv[2])
after = sum(1 for l in open(sys.argv[1]) if json.loads(l)["ts_ms"] > down)
print(f"{after} answers made after the restart began")
assert after >= 1, "every job was answered before the restart began: the outage hit nothing"
PY
kg_note "after the restart: $(kg_summary jobs_with_2plus_attempts) jobs ran twice" \
    "($(kg_summary jobs_rerun_in_place) on the same worker, partition and offset, told apart" \
    "by attempt), $(kg_summary jobs_with_2plus_terminal_events) with two terminal events;" \
    "$(kg_log_count "$T/w1.log" 'partitions revoked') revokes," \
    "$(kg_log_count "$T/w1.log" 'level=(warn|error) module=rdkafka') librdkafka warnings"
if grep -q 'fatal' "$T/w1.log"; then
    kg_fail "the worker logged a fatal error: $(grep -m1 fatal "$T/w1.log")"
fi
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
kg_finish "broker restart mid-run: the worker reconnected, $N jobs finished"
