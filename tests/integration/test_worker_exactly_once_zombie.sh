#!/usr/bin/env bash
# test_worker_exactly_once_zombie: --exactly-once with a zombie. w1 answers jobs but holds the
# answers (--txn-interval-ms 60000: its commit turns come every 60 s from its start, long after
# the freeze; only a revoke or a stop commits sooner) and is frozen (SIGSTOP, as a long GC
# pause or a stalled VM would) before it commits any. Its session times out; w2, another
# worker id (so no transactional id fences w1), takes both partitions over, runs every job
# again and commits. Then w1 is thawed (SIGCONT) with its answers
# for partitions it no longer owns: they must never become visible. Either it learns of the lost
# assignment first and drops them, or it tries to commit them, and the broker refuses its
# offsets (an old group generation: send_offsets_to_transaction with the group metadata) and the
# transaction is aborted; the log says which. A read_committed read of the whole results topic
# finds exactly one terminal event per job, every one from w2; w1 goes on as a member of the
# group and stops cleanly; the topic is read after both stopped, so a commit at w1's shutdown
# would show too.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-eos-zombie
kg_need_java

N=40
kg_broker_start
kg_topics 2
kg_model
kg_jobs "$T/jobs.jsonl" "$N" '{"max_tokens": 64, "ignore_eos": true}'
fast=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=500)
common=(--exactly-once --max-batch-size 4 --poison-after 0 --cancel-topic none "${fast[@]}")
p1=$(kg_free_port)
kg_worker w1 "${common[@]}" --txn-interval-ms 60000 --http-port "$p1"
kg_wait_assigned 60 2 w1
kg_submit_bg 300
# four jobs generated in full (64 tokens each), none committed: freeze w1 at once
kg_wait 60 "w1 answered jobs" kg_metric_ge "$p1" kgen_decode_tokens_total 256
committed=$(kg_metric "$p1" kgen_jobs_total)
kill -STOP "$(kg_pid w1)"
kg_note "froze w1 with four or more answers held and ${committed:-0} committed"
[[ "${committed:-0}" == 0 ]] || kg_fail "w1 committed answers before the freeze"
w1_thaw() { kill -CONT "$(kg_pid w1)" 2>/dev/null || true; }
KG_ON_FAIL=w1_thaw # a frozen process would outlive the test

kg_worker w2 "${common[@]}"
kg_wait_exit "$(kg_pid submit)" 120
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC (not every job finished)"
kg_note "w2 answered every job while w1 was frozen"
kill -CONT "$(kg_pid w1)"
# w1 rejoins the group (a new generation) once it has dealt with the old one
kg_wait_log "$T/w1.log" 'partitions (revoked|lost)' 60
kg_wait 60 "w1 back in the group" bash -c \
    "[[ \$(grep -c 'partitions assigned' '$T/w1.log') -ge 2 ]]"
kg_stop_pid "$(kg_pid w1)" 30
kg_stop_pid "$(kg_pid w2)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "w1 did not stop cleanly"
grep -q 'msg="stopped" rc=0' "$T/w2.log" || kg_fail "w2 did not stop cleanly"

kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"
kg_read_results read_committed "$T/committed.jsonl"
kg_read_results read_uncommitted "$T/uncommitted.jsonl"
python3 - "$T/committed.jsonl" "$T/uncommitted.jsonl" "$N" <<'PY'
import collections, json, sys
def terminals(path):
    by = collections.defaultdict(list)
    for l in open(path):
        l = l.strip()
        if l.startswith("{"):
            e = json.loads(l)
            if e["type"] != "token":
                by[e["request_id"]].append(e["worker_id"])
    return by
committed, uncommitted = terminals(sys.argv[1]), terminals(sys.argv[2])
n = int(sys.argv[3])
assert len(committed) == n, f"{len(committed)} jobs with a committed terminal event, want {n}"
bad = {k: v for k, v in committed.items() if v != ["w2"]}
assert not bad, f"committed terminal events not exactly one from w2: {list(bad.items())[:5]}"
aborted = sum(v.count("w1") for v in uncommitted.values())
print(f"read_committed: exactly one terminal event for each of {n} jobs, all from w2; the log "
      f"holds {aborted} answers of w1 from aborted transactions")
PY
if kg_log_has "$T/w1.log" 'send_offsets_to_transaction failed|commit_transaction failed'; then
    kg_note "w1 tried to commit as a zombie and was refused: $(grep -o -m 1 'send_offsets_to_transaction failed[^"]*\|commit_transaction failed[^"]*' "$T/w1.log")"
else
    kg_note "w1 learned of its lost assignment before its commit turn and dropped its answers"
fi
kg_finish "exactly-once: a frozen worker's held answers never become visible; one committed terminal event per job"
