#!/usr/bin/env bash
# test_kafka_broker: scripts/kafka-broker runs a real single-node Kafka 4 broker that the
# Kafka CLI can use: a 4-partition topic is created, a message goes through the console
# producer and consumer, survives a broker restart on the same address, and stop leaves
# nothing running. Skips (77) only when java is missing.
set -euo pipefail

SRC=${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=${KG_TEST_TMP:-${TMPDIR:-/tmp}}
BROKER=$SRC/scripts/kafka-broker
DIR=$TMP/kafka-$$

if ! command -v "${JAVA_HOME:+$JAVA_HOME/bin/}java" >/dev/null 2>&1; then
    echo "SKIP: java not found"
    exit 77
fi

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

cleanup() {
    local rc=$?
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

out=$("$BROKER" start --dir "$DIR")
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

# Same address and data after a restart (what a broker-restart test relies on).
"$BROKER" restart --dir "$DIR" >/dev/null
[[ "$("$BROKER" bootstrap --dir "$DIR")" == "$bootstrap" ]] || fail "restart changed the address"
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
echo "PASS: kafka broker start/topic/produce/consume/restart/stop"
