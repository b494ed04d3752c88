#!/usr/bin/env bash
# test_worker_trace (issue 30 §2): W3C trace context and named headers go from a job through the
# worker, on a real broker, produced and read with kcat (headers: -H, %h). Two workers in two
# groups read the same jobs: w1 plain, w2 --exactly-once (its answers and DLQ copies go through
# the transaction, its token events straight out) with its own results and DLQ topics, both with
# --propagate-headers x-tenant. The broker creates the topics as they are first used
# (auto.create.topics.enable, one partition): a JVM per topic would double this test's time. On each: a streamed job with traceparent, tracestate, baggage, x-tenant and x-other
# has all but x-other on every event (token and done), and its done event carries the worker's
# span under the job's trace; a job without headers gets none; an invalid job's error event and
# an unparseable job's DLQ copy carry the job's traceparent; a job with a malformed traceparent
# has it copied verbatim and no span. Every log line about a traced job carries its trace_id.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-trace
kg_need_java
command -v kcat >/dev/null || kg_fail "kcat is not installed (scripts/deps --test installs it)"

TRACE_ID=4bf92f3577b34da6a3ce929d0e0e4736
TP="00-$TRACE_ID-00f067aa0ba902b7-01"

kg_broker_start
kg_model

# produce TOPIC KEY VALUE [HEADER=VALUE]...: one job message with kcat
produce() {
    local topic=$1 key=$2 value=$3 h=()
    shift 3
    for kv in "$@"; do
        h+=(-H "$kv")
    done
    printf '%s\n' "$value" | kcat -P -b "$BROKERS" -t "$topic" -k "$key" "${h[@]}"
}
produce jobs traced "{\"request_id\":\"traced\",\"prompt\":\"Once\",\"max_tokens\":4,\
\"ignore_eos\":true,\"stream\":true}" "traceparent=$TP" "tracestate=congo=t61rcWkgMzE" \
    "baggage=userId=alice" "x-tenant=acme" "x-other=not-copied"
produce jobs plain "{\"request_id\":\"plain\",\"prompt\":\"Once\",\"max_tokens\":4,\
\"ignore_eos\":true,\"stream\":true}"
produce jobs invalid '{"request_id":"invalid","prompt":"Once","max_tokens":0}' "traceparent=$TP"
produce jobs unparseable '{not json' "traceparent=$TP" "x-tenant=acme"
produce jobs badtp '{"request_id":"badtp","prompt":"Once","max_tokens":2,"ignore_eos":true}' \
    "traceparent=not-a-traceparent"
# the workers start at the beginning of the topic (no committed offsets: earliest)
common=(--propagate-headers x-tenant --poison-after 0 --cancel-topic none)
kg_worker w1 "${common[@]}"
kg_worker w2 "${common[@]}" --exactly-once --results-topic results-eo --dlq-topic jobs-eo.dlq \
    --group-id kgen-workers-eo

# read_until TOPIC OUT N REGEX: read the whole topic (read_committed; one line a message: key,
# headers, value) into OUT until N lines match REGEX
read_until() {
    local topic=$1 out=$2 n=$3 re=$4
    kcat -C -b "$BROKERS" -t "$topic" -o beginning -e -q -X isolation.level=read_committed \
        -f '%k\t%h\t%s\n' >"$out" 2>/dev/null || return 1
    (($(grep -c "$re" "$out") >= n))
}
for r in results results-eo; do
    kg_wait 90 "4 terminal events on $r" read_until "$r" "$T/$r.tsv" 4 '"type":"\(done\|error\)"'
done
kg_wait 30 "the DLQ copies" read_until jobs.dlq "$T/dlq.tsv" 1 kgen-payload
kg_wait 30 "the DLQ copies" read_until jobs-eo.dlq "$T/dlq-eo.tsv" 1 kgen-payload
kg_note "events and DLQ copies read"

python3 - "$TP" "$T" <<'PY'
import json, re, sys
tp, t = sys.argv[1], sys.argv[2]
trace_id, parent = tp.split("-")[1], tp.split("-")[2]

def headers(s):
    # kcat's %h: name=value pairs joined by commas; a comma inside a value (the DLQ's
    # kgen-error-message) is not followed by a name and '='
    return dict(kv.split("=", 1) for kv in re.split(r",(?=[A-Za-z0-9_-]+=)", s)) if s else {}

for topic in ("results", "results-eo"):
    by = {}
    for line in open(f"{t}/{topic}.tsv"):
        key, h, value = line.rstrip("\n").split("\t", 2)
        by.setdefault(key, []).append((headers(h), json.loads(value)))
    assert set(by) == {"traced", "plain", "invalid", "badtp"}, (topic, sorted(by))
    traced = by["traced"]
    types = [e["type"] for _, e in traced]
    assert types == ["token"] * 4 + ["done"], (topic, types)
    want = {"traceparent": tp, "tracestate": "congo=t61rcWkgMzE", "baggage": "userId=alice",
            "x-tenant": "acme"}
    for h, e in traced:
        assert h == want, (topic, e["type"], h)
        assert ("span" in e) == (e["type"] == "done"), (topic, e)
    span = traced[-1][1]["span"]
    assert span["trace_id"] == trace_id and span["parent_span_id"] == parent, span
    assert len(span["span_id"]) == 16 and span["span_id"] not in ("0" * 16, parent), span
    assert 0 < span["start_unix_nano"] <= span["end_unix_nano"], span
    assert abs(span["end_unix_nano"] // 10**6 - traced[-1][1]["ts_ms"]) < 1000, span
    for h, e in by["plain"]:
        assert h == {} and "span" not in e, (topic, h, e)
    assert len(by["plain"]) == 5, (topic, len(by["plain"]))
    [(h, e)] = by["invalid"]
    assert e["type"] == "error" and e["code"] == "invalid_job", e
    assert h == {"traceparent": tp} and e["span"]["trace_id"] == trace_id, (h, e)
    assert [e["type"] for _, e in by["badtp"]] == ["token", "token", "done"], by["badtp"]
    for h, e in by["badtp"]:
        assert "span" not in e, e
        assert h == {"traceparent": "not-a-traceparent"}, h
for dlq in ("dlq", "dlq-eo"):
    lines = [l.rstrip("\n").split("\t")[:2] for l in open(f"{t}/{dlq}.tsv")]
    assert len(lines) == 1 and lines[0][0] == "unparseable", (dlq, lines)
    h = headers(lines[0][1])
    assert h["traceparent"] == tp and h["x-tenant"] == "acme", h
    assert h["kgen-payload"] == "job" and h["kgen-error-reason"] == "invalid_json", h
print("events and DLQ copies carry the job's headers on both workers")
PY

# The log lines about the traced jobs carry their trace_id; the plain job's do not.
for w in w1 w2; do
    grep -q "msg=\"job done\" request_id=traced .*trace_id=$TRACE_ID" "$T/$w.log" ||
        kg_fail "$w: no 'job done' line for the traced job with its trace_id"
    grep -q "msg=\"job failed\" request_id=invalid .*trace_id=$TRACE_ID" "$T/$w.log" ||
        kg_fail "$w: no 'job failed' line for the invalid job with its trace_id"
    grep -q "msg=\"dead-lettered\" .*trace_id=$TRACE_ID" "$T/$w.log" ||
        kg_fail "$w: the dead-letter line lacks the job's trace_id"
    if grep -E 'request_id=(plain|badtp) ' "$T/$w.log" | grep -q trace_id=; then
        kg_fail "$w: a job without a valid traceparent logged a trace_id"
    fi
done
kg_stop_pid "$(kg_pid w1)" 20
kg_stop_pid "$(kg_pid w2)" 20
kg_finish "trace context: headers on every event and DLQ copy, span on terminal events, trace_id in logs"
