#!/usr/bin/env bash
# test_worker_acl: a worker on a secured cluster, as a managed one is set up: it logs in with
# SCRAM-SHA-512 over SASL_SSL (the broker's self-signed certificate checked against its PEM) and
# the broker's authorizer allows only the ACLs that docs/OPERATIONS.md lists, applied by running
# that page's commands as written. With them every feature works: the event budget reads the
# topics' max.message.bytes, the poison-job journal and the cancel reader are on, jobs are
# answered, a running job is cancelled, the group's lag ends at 0. A user with no ACLs ends
# with exit 1 within --auth-timeout and a log line naming the ACL it lacks; a wrong password
# ends the same way, saying the login failed. No password is in any log or in --print-config.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-acl
kg_need_java
# the names docs/OPERATIONS.md's commands use
JOBS=kgen.jobs
RESULTS=kgen.results
GROUP=kgen-workers

pw="kgen-pw-$$-$RANDOM"
KGEN_KAFKA_SCRAM_USERS="kgen:$pw noacl:noacl-$pw" kg_broker_start
scram=$(cat "$BROKER_DIR/bootstrap-scram")
kg_topics 2
kg_topic "$JOBS.inflight" 2 --config cleanup.policy=compact
kg_topic "$JOBS.cancel" 1

# The page's commands, run as written: kafka-acls.sh is the broker's AclCommand, on its
# PLAINTEXT listener (a super user, as an operator's admin client is); one JVM each, all at once.
acl_pids=()
kafka-acls.sh() {
    kg_tool org.apache.kafka.tools.AclCommand "$@" >>"$T/acls.log" 2>&1 &
    acl_pids+=($!)
}
: >"$T/admin.properties"
block=$(sed -n '/<!-- BEGIN acl-example -->/,/<!-- END acl-example -->/p' \
    "$KG_SRC/docs/OPERATIONS.md" | sed -e '/<!--/d' -e '/```/d' -e 's/^  //')
[[ "$block" == *"acl --operation"* ]] || kg_fail "no ACL commands between the markers of docs/OPERATIONS.md"
cd "$T"
eval "$block"
cd - >/dev/null
for pid in "${acl_pids[@]}"; do
    wait "$pid" || kg_fail "an ACL command of docs/OPERATIONS.md failed: $(cat "$T/acls.log")"
done
kg_note "ACLs of docs/OPERATIONS.md applied ($(grep -c '^acl ' <<<"$block") commands)"

# wide enough that the long job (4,000 tokens) still runs when its cancel comes
kg_model "$T/model.gguf" --n-embd 256 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 512 --ctx 8192
scram_worker() { # scram_worker NAME USER PASSWORD [flags]: a worker on the SASL_SSL listener
    local name=$1 user=$2 pass=$3
    shift 3
    kg_bg "$name" env "KGEN_RDKAFKA_SASL_PASSWORD=$pass" "$KG_BIN/kgen-worker" \
        --brokers "$scram" --jobs-topic "$JOBS" --results-topic "$RESULTS" --group-id "$GROUP" \
        --model "$MODEL" --worker-id "$name" --http-port 0 --threads 1 \
        -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 -X "sasl.username=$user" \
        -X "ssl.ca.location=$BROKER_DIR/ca.pem" "$@"
}
t0=$(date +%s)
scram_worker noacl noacl "noacl-$pw" --auth-timeout 5
scram_worker wrong kgen "not-$pw" --auth-timeout 5
port=$(kg_free_port)
scram_worker w1 kgen "$pw" --http-port "$port" --max-batch-size 4
kg_wait_assigned 60 2 w1
kg_wait_log "$T/w1.log" 'msg="reading cancels"' 30
kg_log_has "$T/w1.log" 'msg="poison-job protection on"' 1 ||
    kg_fail "the journal is off with the documented ACLs: $(grep module=journal "$T/w1.log")"
grep -q 'msg="event budget".*results_topic_max_message_bytes=[0-9]' "$T/w1.log" ||
    kg_fail "the event budget did not read the results topic: $(grep 'event budget' "$T/w1.log")"
if grep -E 'needs the ACL|authorization failed' "$T/w1.log"; then
    kg_fail "the worker with the documented ACLs lacks one"
fi

# jobs answered, and a running job cancelled
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
jobs = [{"request_id": f"short-{i}", "prompt": f"Once upon a time {i}", "max_tokens": 8,
         "temperature": 0} for i in range(6)]
jobs.append({"request_id": "long-0", "prompt": "Once", "max_tokens": 4000, "ignore_eos": True,
             "temperature": 0})
open(f"{t}/jobs.jsonl", "w").write("".join(json.dumps(j) + "\n" for j in jobs))
PY
kg_submit_bg 120
kg_wait 60 "the long job running" kg_metric_ge "$port" kgen_num_requests_running 1
kg_wait 60 "the short jobs answered" kg_metric_ge "$port" kgen_jobs_total 6
kg_submit --cancel long-0 >/dev/null
kg_wait_exit "$(kg_pid submit)" 60
grep -q '"request_id":"long-0".*"cancelled"' "$T/results.jsonl" ||
    kg_fail "the long job was not cancelled: $(grep long-0 "$T/results.jsonl")"
(($(grep -c '"type":"done"' "$T/results.jsonl") == 6)) || kg_fail "not 6 done events"
kg_wait 30 "group lag 0" kg_lag_zero "$GROUP" "$JOBS"

# no ACLs and a wrong password: exit 1, by themselves, saying why
for name in noacl wrong; do
    kg_wait_exit "$(kg_pid "$name")" 60
    ((KG_RC == 1)) || kg_fail "the $name worker exited $KG_RC, not 1: $(tail -n 5 "$T/$name.log")"
done
took=$(($(date +%s) - t0))
# 5 s from their start, which the look-ups (event budget, journal, cancel) hold up to 15 s
((took <= 60)) || kg_fail "the refused workers took $took s to exit"
grep -q 'level=error module=worker msg="fatal: .*needs the ACL' "$T/noacl.log" ||
    kg_fail "the worker without ACLs does not name the one it lacks: $(grep level=error "$T/noacl.log")"
grep -q 'msg="fatal: cannot log in to Kafka' "$T/wrong.log" ||
    kg_fail "the worker with a wrong password does not say the login failed"

# the password never shows, not even in --print-config
KGEN_RDKAFKA_SASL_PASSWORD=$pw "$KG_BIN/kgen-worker" --print-config --brokers "$scram" \
    -X security.protocol=SASL_SSL -X sasl.username=kgen >"$T/print-config.txt" 2>&1
grep -q 'sasl.password' "$T/print-config.txt" || kg_fail "--print-config does not list sasl.password"
kg_stop_pid "$(kg_pid w1)" 30
if grep -lF "$pw" "$T"/*.log "$T/print-config.txt"; then
    kg_fail "a password is in the files above"
fi
kg_finish "SCRAM-SHA-512 over SASL_SSL with the documented ACLs: budget, journal, cancel, 6 jobs, lag 0; no ACLs and a wrong password: exit 1 in $took s"
