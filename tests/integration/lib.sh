# shellcheck shell=bash
# Variables set here (JOBS, KG_MS, RUNNING, KG_RC, ...) are read by the scripts that source it.
# shellcheck disable=SC2034
# lib.sh: shared helpers of the kgen-worker integration tests (tests/integration/test_worker_*.sh).
# Source it after `set -euo pipefail`. It gives a private folder under KG_TEST_TMP, a real Kafka
# broker from scripts/kafka-broker, a tiny model, background processes that are always stopped
# (an EXIT trap), waits with timeouts and python3 checks of kgen-submit's output.
#
#   kg_setup NAME              private folder $T, cleanup trap; skips (77) without python3
#                              (on failure the trap prints the logs, then runs $KG_ON_FAIL,
#                              a function of the test, while the broker still runs)
#   kg_need_java               skip (77) when java is missing
#   kg_broker_start            start a broker in $T/kafka; sets $BROKERS (127.0.0.1:PORT)
#   kg_topic NAME PARTS [--config k=v]...   create a topic
#   kg_model [OUT] [mkmodel flags]          the small random model ($MODEL)
#   kg_bg NAME CMD...          run CMD in the background, output in $T/NAME.log; pid in PID_NAME
#   kg_worker NAME [flags]     kgen-worker on $BROKERS, $JOBS/$RESULTS/$GROUP, --worker-id NAME
#   kg_submit_bg SECS          kgen-submit of $T/jobs.jsonl in the background, results/events in $T
#   kg_submit_timed SECS [flags]            the same in the foreground, fails unless all finish; KG_MS
#   kg_worker_counts PORT      RUNNING, INFLIGHT, FINISHED from a worker's /metrics
#   kg_wait SECS WHAT CMD...   poll CMD every 0.2 s until it succeeds, fail after SECS
#   kg_wait_log FILE REGEX SECS [COUNT]     wait until REGEX matches COUNT (1) lines of FILE
#   kg_stop_pid PID [SECS]     TERM, wait, then KILL
#   kg_check_results IN OUT EVENTS [EXPECTED_IDS_FILE]   invariants; prints a summary line
#   kg_group_lag GROUP TOPIC   sum of LAG over the topic's partitions (kg-admin lag)
#   kg_lag_zero GROUP TOPIC    true when that lag is 0 (for kg_wait)
#   kg_free_port               a free TCP port on 127.0.0.1
#   kg_metric PORT NAME        a worker's /metrics value (kg_metric_ge PORT NAME MIN to wait on)
#   kg_read_topic TOPIC ISOLATION OUT [headers] [key]   every message of a topic, to its end (kcat)
#   kg_read_results ISOLATION OUT [key]     the whole results topic (read_committed or not)
#   kg_jobs FILE N [json fields]            N valid jobs (request_id job-0..), one per line

KG_BIN=${KG_BIN_DIR:?KG_BIN_DIR is not set (run through ctest)}
KG_SRC=${KG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
KG_BROKER=$KG_SRC/scripts/kafka-broker
KG_PIDS=()
BROKER_DIR=
T=

kg_fail() {
    echo "FAIL: $*" >&2
    exit 1
}

kg_note() {
    echo "[$(date +%T)] $*"
}

kg_need_java() {
    if ! command -v "${JAVA_HOME:+$JAVA_HOME/bin/}java" >/dev/null 2>&1; then
        echo "SKIP: java not found (the real-broker tests need Java 17+)"
        exit 77
    fi
}

# Every kgen log line (those that start with ts=) of the test's logs is one logfmt record:
# key=value pairs, values bare words or "quoted" with \" \\ \n \uXXXX escapes. Prints the
# lines that are not and fails (issue 30: a message with a '=' in it broke its own quoting).
kg_check_logfmt() {
    python3 - "$@" <<'PY'
import re, sys
pair = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\["\\nu/bfrt])*"|[^\s="]*)(?: |$)')
bad, n = [], 0
for path in sys.argv[1:]:
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if not line.startswith("ts="):
            continue
        n += 1
        pos, keys = 0, []
        while pos < len(line):
            m = pair.match(line, pos)
            if not m:
                break
            keys.append(m.group(1))
            pos = m.end()
        if pos != len(line) or keys[:4] != ["ts", "level", "module", "msg"]:
            bad.append(f"{path}: {line}")
if bad:
    print(f"log lines that are not one logfmt record ({len(bad)} of {n}):")
    print("\n".join(bad[:20]))
    sys.exit(1)
PY
}

kg_cleanup() {
    local rc=$? pid
    trap - EXIT
    # Every process this test started, newest first, whatever happened.
    for ((i = ${#KG_PIDS[@]} - 1; i >= 0; i--)); do
        pid=${KG_PIDS[i]}
        kg_stop_pid "$pid" 5 2>/dev/null || true
    done
    if ((rc == 0)) && [[ -n "$T" && -d "$T" ]] && compgen -G "$T/*.log" >/dev/null; then
        kg_check_logfmt "$T"/*.log >&2 || rc=1
    fi
    if ((rc != 0 && rc != 77)) && [[ -n "$T" && -d "$T" ]]; then
        local f
        for f in "$T"/*.log; do
            [[ -f "$f" ]] || continue
            # kgen's own warnings first: what went wrong is often long before the last lines
            if grep -q 'level=\(warn\|error\)' "$f" 2>/dev/null; then
                echo "---- kgen warnings and errors in $f (the last 20) ----" >&2
                grep 'level=\(warn\|error\)' "$f" | grep -v 'module=rdkafka' | tail -n 20 >&2 || true
            fi
            echo "---- last lines of $f ----" >&2
            tail -n 15 "$f" >&2 || true
        done
        if [[ -n "$BROKER_DIR" && -f "$BROKER_DIR/server.log" ]]; then
            echo "---- last lines of $BROKER_DIR/server.log ----" >&2
            tail -n 15 "$BROKER_DIR/server.log" >&2 || true
        fi
        # a test's own diagnosis (KG_ON_FAIL: a function), while the broker still runs
        if [[ -n "${KG_ON_FAIL:-}" ]]; then
            echo "---- $KG_ON_FAIL ----" >&2
            "$KG_ON_FAIL" >&2 || true
        fi
    fi
    if [[ -n "$BROKER_DIR" ]]; then
        "$KG_BROKER" stop --clean --dir "$BROKER_DIR" >/dev/null 2>&1 || true
    fi
    if ((rc == 0 || rc == 77)) && [[ -n "$T" ]]; then
        rm -rf "$T"
    elif [[ -n "$T" ]]; then
        echo "(kept $T for inspection)" >&2
    fi
    exit "$rc"
}

kg_setup() {
    command -v python3 >/dev/null 2>&1 || {
        echo "SKIP: python3 not found"
        exit 77
    }
    mkdir -p "${KG_TEST_TMP:-/tmp}"
    T=$(mktemp -d "${KG_TEST_TMP:-/tmp}/$1.XXXXXX")
    T=$(cd "$T" && pwd)
    trap kg_cleanup EXIT
    trap 'exit 130' INT TERM
    KG_T0=$(date +%s)
    JOBS="jobs"
    RESULTS=results
    GROUP=kgen-workers
}

kg_elapsed() {
    echo $(($(date +%s) - KG_T0))
}

kg_broker_start() {
    BROKER_DIR=$T/kafka
    "$KG_BROKER" fetch
    local out
    out=$("$KG_BROKER" start --dir "$BROKER_DIR")
    BROKERS=$(printf '%s\n' "$out" | tail -n 1)
    [[ "$BROKERS" =~ ^127\.0\.0\.1:[0-9]+$ ]] || kg_fail "broker start printed '$BROKERS'"
    kg_note "broker up at $BROKERS"
}

kg_tool() {
    "$KG_BROKER" tool --dir "$BROKER_DIR" "$@"
}

kg_topic() { # kg_topic NAME PARTITIONS [--config k=v]...
    local name=$1 parts=$2 configs=()
    shift 2
    while (($# >= 2)) && [[ $1 == --config ]]; do
        configs+=("$2")
        shift 2
    done
    (($# == 0)) || kg_fail "kg_topic: unexpected arguments: $*"
    "$KG_BIN/kg-admin" create-topic "$BROKERS" "$name" "$parts" "${configs[@]}" >/dev/null
}

# The three topics of a standard run: $JOBS (P partitions), $RESULTS (4), $JOBS.dlq (1).
kg_topics() {
    kg_topic "$JOBS" "${1:-4}"
    kg_topic "$RESULTS" 4
    kg_topic "$JOBS.dlq" 1
}

kg_model() { # kg_model [OUT] [extra mkmodel flags]: the small byte-vocabulary model
    MODEL=${1:-$T/model.gguf}
    shift || true
    "$KG_BIN/kgen" mkmodel --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 1 \
        "$@" --out "$MODEL" >/dev/null
}

kg_bg() { # kg_bg NAME CMD...: background process; pid in PID_NAME, output in $T/NAME.log
    local name=$1
    shift
    "$@" >"$T/$name.log" 2>&1 &
    local pid=$!
    KG_PIDS+=("$pid")
    printf -v "PID_${name//[^A-Za-z0-9_]/_}" '%s' "$pid"
}

kg_pid() { # kg_pid NAME: the pid kg_bg recorded
    local v="PID_${1//[^A-Za-z0-9_]/_}"
    echo "${!v}"
}

kg_worker() { # kg_worker NAME [flags...]
    local name=$1
    shift
    kg_bg "$name" "$KG_BIN/kgen-worker" --brokers "$BROKERS" --jobs-topic "$JOBS" \
        --results-topic "$RESULTS" --group-id "$GROUP" --model "$MODEL" --worker-id "$name" \
        --http-port 0 --threads 1 "$@"
}

kg_submit() { # kg_submit [flags...]: kgen-submit on $BROKERS/$JOBS/$RESULTS
    "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" --results-topic "$RESULTS" "$@"
}

kg_submit_bg() { # kg_submit_bg SECS: kgen-submit of $T/jobs.jsonl in the background (pid: kg_pid submit)
    kg_bg submit "$KG_BIN/kgen-submit" --brokers "$BROKERS" --jobs-topic "$JOBS" \
        --results-topic "$RESULTS" --input "$T/jobs.jsonl" --output "$T/results.jsonl" \
        --events "$T/events.jsonl" --timeout "$1" --no-progress
}

kg_submit_timed() { # kg_submit_timed SECS [flags]: kgen-submit of $T/jobs.jsonl; fails unless all finish; KG_MS
    local secs=$1 t0
    shift
    t0=$(date +%s%N)
    kg_submit --input "$T/jobs.jsonl" --output "$T/results.jsonl" --events "$T/events.jsonl" \
        --timeout "$secs" --no-progress "$@" 2>"$T/submit.log" || {
        cat "$T/submit.log" >&2
        kg_fail "kgen-submit: not every job finished"
    }
    KG_MS=$((($(date +%s%N) - t0) / 1000000))
}

kg_worker_counts() { # kg_worker_counts PORT: RUNNING, INFLIGHT and FINISHED from a worker's /metrics
    RUNNING=$(kg_metric "$1" kgen_num_requests_running)
    INFLIGHT=$(kg_metric "$1" kgen_jobs_inflight)
    FINISHED=$(kg_metric "$1" kgen_jobs_total)
}

kg_wait() { # kg_wait SECS WHAT CMD...
    local secs=$1 what=$2
    shift 2
    local deadline=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        if (($(date +%s) >= deadline)); then
            kg_fail "timed out after ${secs}s waiting for: $what"
        fi
        sleep 0.2
    done
}

kg_log_count() { # kg_log_count FILE REGEX
    grep -cE "$2" "$1" 2>/dev/null || true
}

kg_log_has() { # kg_log_has FILE REGEX COUNT
    (($(kg_log_count "$1" "$2") >= ${3:-1}))
}

kg_wait_log() { # kg_wait_log FILE REGEX SECS [COUNT]
    kg_wait "$3" "'$2' in $(basename "$1")" kg_log_has "$1" "$2" "${4:-1}"
}

kg_alive() {
    kill -0 "$1" 2>/dev/null
}

kg_stop_pid() { # kg_stop_pid PID [SECS]
    local pid=$1 secs=${2:-10} i
    kg_alive "$pid" || {
        wait "$pid" 2>/dev/null || true
        return 0
    }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < secs * 10; i++)); do
        kg_alive "$pid" || break
        sleep 0.1
    done
    if kg_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

kg_wait_exit() { # kg_wait_exit PID SECS: wait for PID to exit; sets KG_RC to its exit status
    local pid=$1 secs=$2
    local deadline=$(($(date +%s) + secs))
    while kg_alive "$pid"; do
        if (($(date +%s) >= deadline)); then
            kg_fail "pid $pid still running after ${secs}s"
        fi
        sleep 0.1
    done
    KG_RC=0
    wait "$pid" || KG_RC=$?
}

# The partitions a worker holds: the count of its last "partitions assigned" line, or the held=
# of its last "partitions revoked" line (an incremental revoke keeps the others; 0 when none).
kg_assigned() {
    local n
    n=$(grep -E 'msg="partitions (assigned|revoked)"' "$T/$1.log" 2>/dev/null | tail -n 1 |
        sed -n -e 's/.*msg="partitions assigned" count=\([0-9]*\).*/\1/p' \
            -e 's/.*msg="partitions revoked" .*held=\([0-9]*\).*/\1/p')
    echo "${n:-0}"
}

# Wait until the workers named in the arguments hold TOTAL partitions together, each >= 1.
kg_wait_assigned() { # kg_wait_assigned SECS TOTAL NAME...
    local secs=$1 total=$2
    shift 2
    kg_wait "$secs" "$* assigned $total partitions" kg_assigned_sum "$total" "$@"
}

kg_assigned_sum() {
    local total=$1 sum=0 n name
    shift
    for name in "$@"; do
        n=$(kg_assigned "$name")
        ((n >= 1)) || return 1
        sum=$((sum + n))
    done
    ((sum == total))
}

kg_free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

kg_jobs() { # kg_jobs FILE N [JSON object of extra fields] [PREFIX]
    python3 - "$1" "$2" "${3:-{\}}" "${4:-job}" <<'PY'
import json, sys
path, n, extra, prefix = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
prompts = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a cat"]
with open(path, "w") as f:
    for i in range(n):
        j = {"request_id": f"{prefix}-{i}", "prompt": f"{prompts[i % 4]} {i}",
             "max_tokens": 8 + i % 9, "temperature": 0.8, "seed": i}
        j.update(extra)
        f.write(json.dumps(j) + "\n")
PY
}

kg_read_topic() { # kg_read_topic TOPIC ISOLATION OUT [headers] [key]: every message, to the end
    # kcat stops at the end of every partition (-e), where Kafka's console consumer waits out an
    # idle timeout in a JVM; the lines are the console consumer's (print.headers: "name:value,...
    # <tab>", print.key: "key<tab>", then the value), which the scenarios parse
    local topic=$1 iso=$2 out=$3 hdr=0 key=0 a
    for a in "${@:4}"; do
        case $a in headers) hdr=1 ;; key) key=1 ;; *) kg_fail "kg_read_topic: unknown '$a'" ;; esac
    done
    kcat -C -b "$BROKERS" -t "$topic" -o beginning -e -q -J -X "isolation.level=$iso" \
        -X fetch.message.max.bytes=16777216 2>/dev/null |
        python3 -c '
import json, sys
hdr, key = sys.argv[1] == "1", sys.argv[2] == "1"
for line in sys.stdin:
    m = json.loads(line)
    out = ""
    if hdr:
        h = m.get("headers") or []
        out += ",".join(f"{h[i]}:{h[i + 1]}" for i in range(0, len(h), 2)) or "NO_HEADERS"
        out += "\t"
    if key:
        out += ("null" if m.get("key") is None else m["key"]) + "\t"
    sys.stdout.write(out + (m.get("payload") or "") + "\n")
' "$hdr" "$key" >"$out" || true
}

kg_read_results() { # kg_read_results ISOLATION OUT [key]: the whole results topic
    kg_read_topic "$RESULTS" "$1" "$2" "${@:3}"
}

kg_metric() { # kg_metric PORT NAME: the value of a /metrics series (summed over labels); "" if down
    curl -s --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null |
        awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF; f = 1 } END { if (f) printf "%.0f\n", s }'
}

kg_metric_ge() { # kg_metric_ge PORT NAME MIN: succeeds when the metric is >= MIN
    local v
    v=$(kg_metric "$1" "$2")
    [[ -n "$v" ]] && ((v >= $3))
}

kg_rss_kib() { # kg_rss_kib PID FIELD: VmHWM / VmRSS in KiB
    sed -n "s/^$2:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$1/status" 2>/dev/null
}

# Sum of LAG of GROUP over TOPIC's partitions (end offset minus the committed one; a partition
# without a committed offset counts whole), or "unknown" when the group committed nothing there.
kg_group_lag() { # kg_group_lag GROUP TOPIC
    "$KG_BIN/kg-admin" lag "$BROKERS" "$1" "$2" 2>/dev/null || echo unknown
}

# Whether GROUP's lag on TOPIC is 0 now: for kg_wait, which runs its command again each try
# (a `test "$(kg_group_lag ...)" = 0` there would expand the lag once, before the first try).
kg_lag_zero() { # kg_lag_zero GROUP TOPIC
    [[ "$(kg_group_lag "$1" "$2")" == 0 ]]
}

# The checks every scenario shares, on kgen-submit's --output (OUT) and --events (EVENTS):
#  - OUT has exactly one line per expected request_id (the lines of IN with a valid
#    request_id, or the ids listed in EXPECTED_IDS_FILE), each a done or error event, and no
#    other line;
#  - in EVENTS, per attempt (request_id, worker_id, partition, offset) the token events arrive
#    in index order 0, 1, 2, ... with no gap or repeat, and an attempt that ends with done
#    (stream jobs) has token texts that join to the done text and one token event per
#    completion token;
#  - every OUT line is one of the terminal events in EVENTS.
# Prints one summary line of key=value; writes it as JSON to $T/summary.json too.
kg_check_results() { # kg_check_results IN OUT EVENTS [EXPECTED_IDS_FILE]
    python3 - "$@" "$T/summary.json" <<'PY'
import collections, json, re, sys
inp, out, evp = sys.argv[1:4]
ids_file = sys.argv[4] if len(sys.argv) > 5 else None
summary_path = sys.argv[-1]
RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
stream = {}
if ids_file:
    expected = set(l.strip() for l in open(ids_file) if l.strip())
else:
    expected = set()
    for raw in open(inp, "rb"):
        try:
            j = json.loads(raw)
        except ValueError:
            continue
        if isinstance(j, dict) and isinstance(j.get("request_id"), str) and RID.match(j["request_id"]):
            expected.add(j["request_id"])
            stream[j["request_id"]] = j.get("stream", True) is not False
errors = []
res = [json.loads(l) for l in open(out) if l.strip()]
seen = collections.Counter(r["request_id"] for r in res)
dups = [k for k, v in seen.items() if v > 1]
missing = sorted(expected - set(seen))
extra = sorted(set(seen) - expected)
if dups:
    errors.append(f"{len(dups)} request_ids twice in the output, e.g. {dups[:3]}")
if missing:
    errors.append(f"{len(missing)} jobs without a terminal event, e.g. {missing[:5]}")
if extra:
    errors.append(f"{len(extra)} unexpected request_ids in the output, e.g. {extra[:3]}")
for r in res:
    if r.get("type") not in ("done", "error"):
        errors.append(f"output line is not terminal: {r}")
        break

events = [json.loads(l) for l in open(evp) if l.strip()]
attempts = collections.OrderedDict()
terminals = collections.defaultdict(list)
run_of = {}
for e in events:
    # every run of a job has its own attempt id, also when the same worker reruns the same
    # message (a rebalance back, a broker outage): one run, one terminal event at most, and one
    # (worker_id, partition, offset)
    if "attempt" not in e:
        errors.append(f"event without an attempt id: {e}")
        break
    where = (e["worker_id"], e["partition"], e["offset"])
    if run_of.setdefault(e["attempt"], (e["request_id"],) + where) != (e["request_id"],) + where:
        errors.append(f"attempt {e['attempt']} names two runs: {run_of[e['attempt']]} and "
                      f"{(e['request_id'],) + where}")
    key = (e["request_id"],) + where + (e["attempt"],)
    a = attempts.setdefault(key, {"tokens": [], "terminal": []})
    if e["type"] == "token":
        # the same worker may rerun the same message after a rebalance: it restarts at 0
        if a["terminal"] and e["index"] != 0 and not a.get("rerun"):
            errors.append(f"token event after the terminal event in attempt {key}")
        if a["terminal"] and e["index"] == 0:
            a["rerun"] = True
        a["tokens"].append(e)
    else:
        if a["terminal"]:
            errors.append(f"attempt {e['attempt']} of {e['request_id']} has two terminal events")
        a["terminal"].append(e)
        terminals[e["request_id"]].append(e)
bad_order = bad_join = 0
n_tok = 0
for key, a in attempts.items():
    idx = [t["index"] for t in a["tokens"]]
    n_tok += len(idx)
    # A re-run in the same worker (rebalance back) repeats an attempt key: split on index 0.
    runs, cur = [], []
    for t in a["tokens"]:
        if t["index"] == 0 and cur:
            runs.append(cur)
            cur = []
        cur.append(t)
    if cur:
        runs.append(cur)
    for run in runs:
        if [t["index"] for t in run] != list(range(len(run))):
            bad_order += 1
            if bad_order <= 3:
                errors.append(f"token indexes out of order in {key}: {[t['index'] for t in run][:20]}")
    done = [t for t in a["terminal"] if t["type"] == "done"]
    if done and runs and stream.get(key[0], True):
        d = done[0]
        last = runs[-1]
        text = "".join(t["text"] for t in last)
        if d.get("text_truncated"):
            # the done event carries the beginning of the text (it would not fit the topic
            # otherwise); the token events carry all of it
            ok = (text.startswith(d["text"]) and len(text.encode()) ==
                  len(d["text"].encode()) + d["text_bytes_cut"])
        else:
            ok = text == d["text"]
        if not ok or len(last) != d["usage"]["completion_tokens"]:
            bad_join += 1
            if bad_join <= 3:
                errors.append(f"tokens of {key} join to {text!r} ({len(last)} events), done "
                              f"says {d['text']!r} ({d['usage']['completion_tokens']} tokens)")
for r in res:
    if r not in terminals.get(r["request_id"], []):
        errors.append(f"output line of {r['request_id']} is not among its events")
        break
multi_attempt = sum(1 for rid in expected if len({k[4] for k in attempts if k[0] == rid}) > 1)
# reruns a (worker_id, partition, offset) key could not have told apart (issue 30)
same_place = sum(1 for rid in expected
                 if len({k[4] for k in attempts if k[0] == rid}) >
                 len({k[1:4] for k in attempts if k[0] == rid}))
dup_terminal = sum(1 for rid, t in terminals.items() if len(t) > 1)
s = {
    "jobs": len(expected), "results": len(res),
    "done": sum(1 for r in res if r["type"] == "done"),
    "error": sum(1 for r in res if r["type"] == "error"),
    "events": len(events), "token_events": n_tok,
    "completion_tokens": sum(r.get("usage", {}).get("completion_tokens", 0) for r in res),
    "attempts": len(attempts), "jobs_with_2plus_attempts": multi_attempt,
    "jobs_rerun_in_place": same_place,
    "jobs_with_2plus_terminal_events": dup_terminal,
    "workers": sorted({r["worker_id"] for r in res}),
}
json.dump(s, open(summary_path, "w"))
print("results: " + " ".join(f"{k}={v}" for k, v in s.items()))
if errors:
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    sys.exit(1)
PY
}

# Every job must end in a done event: any error event fails the scenario. (This once caught
# the worker turning jobs the engine's full queue refused into `internal` errors instead of
# retrying them.)
kg_expect_no_errors() { # kg_expect_no_errors RESULTS
    local other
    other=$(python3 - "$1" <<'PY'
import json, sys
other = 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["type"] != "error":
        continue
    other += 1
    if other == 1:
        print(f"first unexpected error: {r}", file=sys.stderr)
print(other)
PY
)
    ((other == 0)) || kg_fail "$other jobs ended with an unexpected error event"
}

# End a scenario.
kg_finish() { # kg_finish MESSAGE
    echo "PASS: $1 ($(kg_elapsed) s)"
}

kg_summary() { # kg_summary KEY: a field of the last kg_check_results summary
    python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print(v if not isinstance(v, list) else " ".join(v))' \
        "$T/summary.json" "$1"
}
