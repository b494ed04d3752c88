#!/usr/bin/env bash
# test_kafka_broker: scripts/kafka-broker runs a real single-node Kafka 4 broker that the
# Kafka CLI can use: a 4-partition topic is created, a message goes through the console
# producer and consumer, survives a broker restart on the same address, and stop leaves
# nothing running. Its SASL_PLAINTEXT listener (KGEN_KAFKA_SASL_USERS, PLAIN) lets kgen-worker in
# with the right password, and with a wrong one the worker exits 1 by itself within --auth-timeout
# (plus its start-up look-ups), saying why, without claiming its cancel and in-flight topics are
# missing and without the password in its log. kg-admin (the tests' admin calls) agrees with
# the Kafka CLI on topics, partitions, end offsets and a group's lag. Skips (77) only when java
# is missing.
set -euo pipefail

SRC=${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=${KG_TEST_TMP:-${TMPDIR:-/tmp}}
BROKER=$SRC/scripts/kafka-broker
BIN=${KG_BIN_DIR:-$SRC/build/bin}
DIR=$TMP/kafka-$$

if ! command -v "${JAVA_HOME:+$JAVA_HOME/bin/}java" >/dev/null 2>&1; then
    echo "SKIP: java not found"
    exit 77
fi

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

worker_pids=()
cleanup() {
    local rc=$? pid
    for pid in ${worker_pids[@]+"${worker_pids[@]}"}; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    if ((rc != 0)) && [[ -f "$DIR/server.log" ]]; then
        echo "---- last lines of $DIR/server.log ----" >&2
        tail -n 30 "$DIR/server.log" >&2 || true
    fi
    # Never leak a broker, whatever happened above.
    "$BROKER" stop --clean --dir "$DIR" >/dev/null 2>&1 || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$TMP"
"$BROKER" fetch

password="kgen-pw-$$-$RANDOM"
out=$(KGEN_KAFKA_SASL_USERS="kgen:$password" "$BROKER" start --dir "$DIR")
bootstrap=$(printf '%s\n' "$out" | tail -n 1)
[[ "$bootstrap" =~ ^127\.0\.0\.1:[0-9]+$ ]] || fail "start printed '$bootstrap', not 127.0.0.1:PORT"
[[ "$(cat "$DIR/bootstrap")" == "$bootstrap" ]] || fail "DIR/bootstrap differs from start's output"
"$BROKER" status --dir "$DIR" | grep -qF "bootstrap=$bootstrap" || fail "status misses the broker"
# A second start is a no-op that reports the same address.
again=$("$BROKER" start --dir "$DIR" 2>/dev/null | tail -n 1)
[[ "$again" == "$bootstrap" ]] || fail "second start said '$again', not $bootstrap"

tool() {
    "$BROKER" tool "$@"
}

topic=kgen-test-$$
tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create --topic "$topic" \
    --partitions 4 --replication-factor 1
desc=$(tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --describe \
    --topic "$topic")
echo "$desc"
grep -q "PartitionCount: 4" <<<"$desc" || fail "topic does not have 4 partitions"
(($(grep -c "Leader: 1" <<<"$desc") == 4)) || fail "not every partition has a leader"

payload="{\"request_id\":\"r-$$\",\"prompt\":\"hello $RANDOM\"}"
printf 'r-%s\t%s\n' "$$" "$payload" |
    tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$bootstrap" --topic "$topic" \
        --reader-property parse.key=true --reader-property 'key.separator=	' \
        --command-property acks=all

consume() {
    tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$bootstrap" \
        --topic "$topic" --from-beginning --max-messages 1 --timeout-ms 30000 \
        --formatter-property print.key=true --formatter-property 'key.separator=	' 2>/dev/null
}

got=$(consume)
[[ "$got" == "r-$$	$payload" ]] || fail "consumed '$got', expected key r-$$ and '$payload'"

# kg-admin, the integration tests' admin calls without a JVM each, agrees with Kafka's CLI:
# a topic with a config, created twice; partitions added; end offsets; a group's lag before
# and after its offsets are committed (by ConsumerGroupCommand --reset-offsets)
admin=$BIN/kg-admin
"$admin" create-topic "$bootstrap" "$topic.a" 2 cleanup.policy=compact ||
    fail "kg-admin create-topic failed"
"$admin" create-topic "$bootstrap" "$topic.a" 2 || fail "kg-admin create-topic of an existing topic failed"
"$admin" create-topic "$bootstrap" "$topic.b" 2 no.such.config=1 2>/dev/null &&
    fail "kg-admin create-topic took an unknown config"
"$admin" add-partitions "$bootstrap" "$topic.a" 3 || fail "kg-admin add-partitions failed"
desc=$(tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --describe \
    --topic "$topic.a")
grep -q "PartitionCount: 3" <<<"$desc" || fail "kg-admin's topic does not have 3 partitions: $desc"
grep -q "cleanup.policy=compact" <<<"$desc" || fail "kg-admin's topic is not compacted: $desc"
[[ "$("$admin" end-offsets "$bootstrap" "$topic")" == 1 ]] || fail "kg-admin end-offsets is not 1"
[[ "$("$admin" lag "$bootstrap" "g-admin" "$topic")" == unknown ]] ||
    fail "kg-admin lag of a group that committed nothing is not 'unknown'"
tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$bootstrap" \
    --reset-offsets --to-earliest --execute --group g-admin --topic "$topic" >/dev/null
[[ "$("$admin" lag "$bootstrap" "g-admin" "$topic")" == 1 ]] || fail "kg-admin lag is not 1"
tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$bootstrap" \
    --reset-offsets --to-latest --execute --group g-admin --topic "$topic" >/dev/null
[[ "$("$admin" lag "$bootstrap" "g-admin" "$topic")" == 0 ]] || fail "kg-admin lag is not 0"

# SASL: the right password logs in (the group assigns the topic's 4 partitions), a wrong one
# ends the worker. Both at once: the wrong one waits out its start-up look-ups (5 s each).
sasl=$(cat "$DIR/bootstrap-sasl")
"$BIN/kgen" mkmodel --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 1 \
    --out "$DIR/model.gguf" >/dev/null
worker() { # worker NAME PASSWORD [flags]: run in the background, its pid is the worker's (exec)
    local name=$1 pw=$2
    shift 2
    exec "$BIN/kgen-worker" --brokers "$sasl" --jobs-topic "$topic" --results-topic "$topic.results" \
        --group-id "g-$name" --worker-id "$name" --model "$DIR/model.gguf" --http-port 0 \
        --threads 1 -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
        -X sasl.username=kgen -X "sasl.password=$pw" "$@" >"$DIR/$name.log" 2>&1
}
t0=$(date +%s)
worker wrong "not-$password" --auth-timeout 3 &
wrong_pid=$!
worker_pids+=("$wrong_pid")
worker right "$password" &
right_pid=$!
worker_pids+=("$right_pid")
for ((i = 0; i < 300; i++)); do
    grep -q 'msg="partitions assigned" count=4' "$DIR/right.log" && break
    kill -0 "$right_pid" 2>/dev/null || break
    sleep 0.1
done
grep -q 'msg="partitions assigned" count=4' "$DIR/right.log" || {
    tail -n 20 "$DIR/right.log" >&2
    fail "the worker with the right password got no assignment in 30 s"
}
kill -TERM "$right_pid"
rc=0
wait "$right_pid" || rc=$?
((rc == 0)) || fail "the worker with the right password exited $rc on SIGTERM"
rc=0
wait "$wrong_pid" || rc=$?
took=$(($(date +%s) - t0))
wrong_log=$(grep -v 'module=rdkafka' "$DIR/wrong.log")
((rc == 1)) || fail "the worker with a wrong password exited $rc, not 1: $wrong_log"
# 3 s from its start, which the look-ups (event budget, journal, cancel) hold up to 15 s
((took <= 25)) || fail "the worker with a wrong password took $took s to exit"
grep -q 'level=error module=worker msg="fatal: cannot log in to Kafka' <<<"$wrong_log" ||
    fail "no error says the login failed: $wrong_log"
if grep -E 'no cancel topic|in-flight topic is (not )?there' <<<"$wrong_log"; then
    fail "the worker that could not log in says its topics are missing"
fi
if grep -qF "$password" "$DIR/wrong.log" "$DIR/right.log"; then
    fail "a password is in a worker's log"
fi
echo "SASL: right password assigned, wrong password: exit 1 after $took s"

# Same address and data after a restart (what a broker-restart test relies on).
"$BROKER" restart --dir "$DIR" >/dev/null
[[ "$("$BROKER" bootstrap --dir "$DIR")" == "$bootstrap" ]] || fail "restart changed the address"
[[ "$(cat "$DIR/bootstrap-sasl")" == "$sasl" ]] || fail "restart changed the SASL address"
got=$(consume)
[[ "$got" == "r-$$	$payload" ]] || fail "after restart consumed '$got'"

pid=$(cat "$DIR/kafka.pid")
"$BROKER" stop --dir "$DIR"
if kill -0 "$pid" 2>/dev/null; then
    fail "broker pid $pid still alive after stop"
fi
if "$BROKER" status --dir "$DIR" >/dev/null; then
    fail "status says running after stop"
fi
port=${bootstrap##*:}
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port still accepts connections after stop"
fi
[[ -d "$DIR/data" ]] || fail "stop without --clean removed the data"
echo "PASS: kafka broker start/topic/produce/consume/SASL login and --auth-timeout/restart/stop"
