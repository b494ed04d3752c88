#!/usr/bin/env bash
# test_worker_exactly_once: --exactly-once on a real broker. Two workers share 300 jobs; one is
# SIGKILLed mid-run, inside a transaction whose answers and offsets are already on the broker
# (the TEST-ONLY hook KGEN_TEST_KILL_BEFORE_COMMIT=N kills it before its N-th commit), and is
# restarted under the same --worker-id, as a supervisor would (its transactional id fences the
# dead instance and aborts the open transaction); then the broker is restarted. A read_committed reader (kgen-submit) finds exactly one terminal event for each
# of the 300 jobs, and so does a read_committed read of the whole results topic afterwards,
# although the uncommitted log holds the aborted attempts too (counted and printed: the test
# shows they happened). Token events stay at least once; per attempt they are in order. Every
# offset is committed (group lag 0).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-eos
kg_need_java

N=300
eos_diagnose() { # on failure: the broker's view of the transactions and of the group
    local txn=(timeout 60 "$KG_BROKER" tool --dir "$BROKER_DIR" org.apache.kafka.tools.TransactionsCommand
        --bootstrap-server "$BROKERS")
    "${txn[@]}" list
    "${txn[@]}" find-hanging --broker-id 1
    for id in w1 w2; do
        "${txn[@]}" describe --transactional-id "kgen-$GROUP-$id"
    done
    timeout 60 "$KG_BROKER" tool --dir "$BROKER_DIR" \
        org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$BROKERS" \
        --describe --group "$GROUP"
}
KG_ON_FAIL=eos_diagnose
kg_broker_start
kg_topics 4
kg_topic "$JOBS.inflight" 4 --config cleanup.policy=compact
kg_topic "$JOBS.cancel" 1
kg_model
kg_jobs "$T/jobs.jsonl" "$N" '{"max_tokens": 96, "ignore_eos": true}'

# The default --poison-after 2: the kill gives the jobs w1 was running a strike; a broker restart
# slower than the journal's grace (8 s were seen under load) can count the eviction of a live
# worker as a second failure, which used to poison an innocent job (job-62 once). Now such a
# failure only moves the jobs in the search (src/kafka/kg_suspects.h): only a failure a job ran
# solo in counts toward its verdict, and for those the new owner waits out the reconnect back-off.
fast=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=500)
# the 3rd transaction: early enough that w1 still has most of its ~150 jobs ahead however fast
# this machine answers (12 was too late once: the run took 3.5 s and w1 committed fewer)
p1=$(kg_free_port)
p2=$(kg_free_port)
KGEN_TEST_KILL_BEFORE_COMMIT=3 kg_worker w1 --exactly-once --max-batch-size 4 \
    --http-port "$p1" "${fast[@]}"
kg_worker w2 --exactly-once --max-batch-size 4 --http-port "$p2" "${fast[@]}"
kg_wait_assigned 60 4 w1 w2
kg_submit_bg 400

kg_wait_exit "$(kg_pid w1)" 120
((KG_RC == 137)) || kg_fail "w1 exited $KG_RC, want 137 (SIGKILL)"
kg_log_has "$T/w1.log" 'TEST-ONLY fault injection: SIGKILL before committing' ||
    kg_fail "w1 died, but not in its transaction"
kg_note "w1 SIGKILLed with an open transaction ($(grep -o 'answers=[0-9]*' "$T/w1.log")) after" \
    "$(kg_metric "$p2" kgen_jobs_total) jobs on w2"
sleep 1
# the same worker id: its transactional id fences the dead instance's open transaction at once
kg_bg w1b "$KG_BIN/kgen-worker" --brokers "$BROKERS" --jobs-topic "$JOBS" --results-topic \
    "$RESULTS" --group-id "$GROUP" --model "$MODEL" --worker-id w1 --http-port "$p1" --threads 1 \
    --exactly-once --max-batch-size 4 "${fast[@]}"
# w1b fences w1 (its open transaction is aborted) and joins before the broker restarts. Once
# the restart hit w1b's start on a fast machine, and then both workers waited minutes for the
# group's offsets (UNSTABLE_OFFSET_COMMIT; the cause is not known yet: eos_diagnose lists the
# broker's transactions should it happen here)
kg_wait_log "$T/w1b.log" 'msg="exactly-once results"' 90
kg_wait_log "$T/w1b.log" 'partitions assigned' 90
kg_note "w1b fenced w1 and has partitions; $(kg_metric "$p2" kgen_jobs_total) jobs answered on w2"
"$KG_BROKER" restart --dir "$BROKER_DIR" >"$T/restart.log" 2>&1 || {
    cat "$T/restart.log" >&2
    kg_fail "broker restart failed"
}
kg_note "broker restarted"

kg_wait_exit "$(kg_pid submit)" 400
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC (not every job finished)"
tail -n 1 "$T/submit.log"
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"
dup=$(kg_summary jobs_with_2plus_terminal_events)
((dup == 0)) || kg_fail "$dup jobs with two terminal events seen by a read_committed reader"

# the whole topic, committed and not
kg_read_results read_committed "$T/committed.jsonl"
kg_read_results read_uncommitted "$T/uncommitted.jsonl"
python3 - "$T/committed.jsonl" "$T/uncommitted.jsonl" "$N" <<'PY'
import collections, json, sys
def terminals(path):
    c = collections.Counter()
    for l in open(path):
        l = l.strip()
        if l.startswith("{"):
            e = json.loads(l)
            if e["type"] != "token":
                c[e["request_id"]] += 1
    return c
committed, uncommitted = terminals(sys.argv[1]), terminals(sys.argv[2])
n = int(sys.argv[3])
assert len(committed) == n, f"{len(committed)} jobs with a committed terminal event, want {n}"
bad = {k: v for k, v in committed.items() if v != 1}
assert not bad, f"jobs with more than one committed terminal event: {list(bad.items())[:5]}"
extra = sum(uncommitted.values()) - sum(committed.values())
assert extra > 0, "no aborted answers in the log: the kill did not catch an open transaction"
print(f"read_committed: exactly one terminal event for each of {n} jobs; the log also holds "
      f"{extra} terminal events of aborted transactions (invisible to read_committed)")
PY
kg_wait 60 "group lag 0" kg_lag_zero "$GROUP" "$JOBS"
kg_note "aborted transactions: $(kg_log_count "$T/w2.log" 'aborted') on w2;" \
    "$(kg_summary jobs_with_2plus_attempts) jobs ran twice"
kg_stop_pid "$(kg_pid w2)" 30
kg_stop_pid "$(kg_pid w1b)" 30
grep -q 'msg="stopped" rc=0' "$T/w2.log" || kg_fail "w2 did not stop cleanly"
kg_finish "exactly-once: one committed terminal event per job across SIGKILL and a broker restart"
