#!/usr/bin/env bash
# test_worker_rebalance (issue 29 §2): a third worker joins two busy ones, under every group
# protocol the options accept: the consumer protocol (KIP-848, what --group-protocol auto picks
# on Kafka 4), classic cooperative-sticky and classic eager (range,roundrobin). 16 long jobs over 4
# partitions, all running. With the graceful handoff no running job is
# restarted: the partitions that stay keep their jobs (incremental protocols), the jobs of a
# partition that moves finish within --handoff-timeout before it is released (every protocol;
# eager revokes every partition, so the whole group waits for them), and the jobs not yet
# started go to the new owner at once. Checked per protocol: one terminal event per job, no job
# with two attempts (no token event repeated), every "handoff: done" line with abandoned=0, the
# third worker holds partitions and the group's lag reaches 0. With the consumer protocol the
# workers are static members (--group-instance-id): the third one stopped and started again
# gets its partitions back without a rebalance of the others. Prints, per protocol, token
# events per token generated and the longest handoff.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-rebalance
kg_need_java

N=16
kg_broker_start
kg_model "$T/model.gguf" --ctx 4096 --n-embd 256 --n-layer 4 --n-ff 512

# scenario NAME TOKENS [worker flags...]: jobs of TOKENS tokens, long enough to outlast the
# rebalance (up to two heartbeats)
scenario() {
    local name=$1 tokens=$2
    shift 2
    JOBS=jobs-$name RESULTS=results-$name GROUP=group-$name
    kg_topics 4
    kg_jobs "$T/jobs.jsonl" "$N" "{\"max_tokens\": $tokens, \"ignore_eos\": true}" "$name"
    # every job taken runs at once: each partition that moves has running jobs to hand off
    local flags=(--max-batch-size 8 --handoff-timeout 30 "$@")
    local p1 p3 static1=() static2=() static3=()
    p1=$(kg_free_port)
    p3=$(kg_free_port)
    if [[ "$name" == consumer ]]; then
        static1=(--group-instance-id "$name-1") static2=(--group-instance-id "$name-2")
        static3=(--group-instance-id "$name-3")
    fi
    kg_worker "$name-1" "${flags[@]}" "${static1[@]}" --http-port "$p1"
    kg_worker "$name-2" "${flags[@]}" "${static2[@]}"
    kg_wait_assigned 60 4 "$name-1" "$name-2"
    kg_submit_bg 150
    # the third worker joins while the first two run jobs (and have more waiting)
    kg_wait 60 "$name-1 running jobs" kg_metric_ge "$p1" kgen_num_requests_running 6
    kg_worker "$name-3" "${flags[@]}" "${static3[@]}" --http-port "$p3"
    kg_wait_assigned 60 4 "$name-1" "$name-2" "$name-3"
    kg_wait_exit "$(kg_pid submit)" 150
    ((KG_RC == 0)) || kg_fail "$name: kgen-submit exited $KG_RC (not every job finished)"
    kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
    kg_expect_no_errors "$T/results.jsonl"
    local restarted handoffs abandoned longest
    restarted=$(kg_summary jobs_with_2plus_attempts)
    handoffs=$(cat "$T/$name"-[123].log | grep -c 'msg="handoff: done"' || true)
    abandoned=$(cat "$T/$name"-[123].log | sed -n 's/.*msg="handoff: done".* abandoned=\([0-9]*\).*/\1/p' |
        awk '{s += $1} END {print s + 0}')
    longest=$(cat "$T/$name"-[123].log | sed -n 's/.*msg="handoff: done".* waited_ms=\([0-9]*\).*/\1/p' |
        sort -n | tail -n 1)
    kg_note "$name: jobs restarted $restarted of $N; $(kg_summary token_events) token events for" \
        "$(kg_summary completion_tokens) tokens; $handoffs handoffs, longest ${longest:-0} ms," \
        "$abandoned jobs abandoned; done by $(kg_summary workers)"
    ((handoffs >= 1)) || kg_fail "$name: no partition was handed off (did the third worker join late?)"
    ((abandoned == 0)) || kg_fail "$name: $abandoned jobs abandoned at the handoff deadline"
    ((restarted == 0)) || kg_fail "$name: $restarted jobs ran twice"
    if [[ "$name" == consumer ]]; then
        # static membership: a restart of the third worker moves nothing
        local before3 lines1 lines2
        before3=$(kg_assigned "$name-3")
        lines1=$(kg_log_count "$T/$name-1.log" 'msg="partitions (assigned|revoked)"')
        lines2=$(kg_log_count "$T/$name-2.log" 'msg="partitions (assigned|revoked)"')
        kg_stop_pid "$(kg_pid "$name-3")" 30
        mv "$T/$name-3.log" "$T/$name-3a.log"
        kg_worker "$name-3" "${flags[@]}" "${static3[@]}"
        kg_wait 60 "$name-3 back with its partitions" kg_assigned_sum "$before3" "$name-3"
        sleep 2
        (($(kg_log_count "$T/$name-1.log" 'msg="partitions (assigned|revoked)"') == lines1 &&
            $(kg_log_count "$T/$name-2.log" 'msg="partitions (assigned|revoked)"') == lines2)) ||
            kg_fail "$name: restarting a static member rebalanced the others"
        kg_note "$name: the static member restarted and got its $before3 partitions back, the others kept theirs"
    fi
    local w
    for w in 1 2 3; do
        kg_stop_pid "$(kg_pid "$name-$w")" 30
    done
    local lag
    lag=$(kg_group_lag "$GROUP" "$JOBS")
    [[ "$lag" == 0 ]] || kg_fail "$name: committed offsets do not reach the end of $JOBS (lag $lag)"
}

# The three protocols side by side (their own topics and groups on one broker, 9 workers on
# the machine's cores, which also makes the jobs longer than the rebalances): in subshells,
# each with its own folder and its own cleanup of the workers it started.
T0=$T
run() { # run NAME TOKENS [flags]: scenario in the background, output in $T0/NAME.out
    local name=$1
    (
        T=$T0/$name
        mkdir -p "$T"
        KG_PIDS=()
        trap 'rc=$?; for ((i = ${#KG_PIDS[@]} - 1; i >= 0; i--)); do kg_stop_pid "${KG_PIDS[i]}" 5; done; exit $rc' EXIT
        scenario "$@"
    ) >"$T0/$name.out" 2>&1 &
    printf -v "RUN_$name" '%s' "$!"
}
# Heartbeats of half a second (the test broker's consumer protocol beats once a second): the
# rebalance comes a second or two after the third worker starts, well inside the jobs (about
# 15 s here with nine workers on two busy cores; 4 s on a machine four times as fast).
run consumer 600 --group-protocol auto
run cooperative 600 --group-protocol classic --assignment-strategy cooperative-sticky \
    -X heartbeat.interval.ms=500
run eager 600 --group-protocol classic --assignment-strategy range,roundrobin \
    -X heartbeat.interval.ms=500
failed=()
for name in consumer cooperative eager; do
    pid_var=RUN_$name
    if ! wait "${!pid_var}"; then
        failed+=("$name")
    fi
done
for name in consumer cooperative eager; do
    grep -v '^ts=' "$T0/$name.out" || true
done
for name in "${failed[@]}"; do
    for f in "$T0/$name"/*.log; do
        echo "---- $f: kgen warnings, errors, partitions (the last 30) ----" >&2
        grep -E 'level=(warn|error)|partitions|handoff' "$f" | grep -v 'module=rdkafka' | tail -n 30 >&2 || true
    done
done
((${#failed[@]} == 0)) || kg_fail "failed: ${failed[*]}"
grep -q 'group_protocol=consumer' "$T0/consumer/consumer-1.log" ||
    kg_fail "auto did not pick the consumer protocol on Kafka 4"
kg_finish "a third worker joins two busy ones: no job restarted, consumer, cooperative and eager"
