#!/usr/bin/env bash
# kgen-worker --demo 0 --http-port P: /readyz turns 200 after assignment,
# /healthz is 200, /metrics series move as jobs run (kgen-submit against the
# demo's mock cluster), the grammar cache and mask counters move for constrained jobs,
# and SIGTERM exits 0.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/metrics.XXXXXX")
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/kgen-worker" --demo 0 --http-port "$port" --max-batch-size 4 >"$tmp/out" 2>"$tmp/err" &
pid=$!

get() { curl -s -o "$tmp/body" -w '%{http_code}' "http://127.0.0.1:$port$1" || true; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# readiness: 503 until partitions are assigned, then 200
for _ in $(seq 1 200); do
    code=$(get /readyz)
    [[ "$code" == 200 ]] && break
    [[ "$code" == 503 || "$code" == 000 ]] || { echo "unexpected /readyz $code"; exit 1; }
    sleep 0.1
done
[[ "$code" == 200 ]] || { echo "/readyz never turned 200"; cat "$tmp/err"; exit 1; }
[[ "$(get /healthz)" == 200 ]] || { echo "/healthz not 200"; exit 1; }
[[ "$(get /nope)" == 404 ]] || { echo "unknown path not 404"; exit 1; }

before=$(metric 'kgen_generation_tokens_total')
[[ "$before" == 0 ]] || { echo "generation tokens before any job: $before"; exit 1; }
grep -q '^# TYPE kgen_time_to_first_token_seconds histogram' <(curl -s "http://127.0.0.1:$port/metrics")

brokers=$(grep -o 'brokers=[^ ]*' "$tmp/err" | head -1 | cut -d= -f2)
python3 - "$tmp/jobs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(20):
        f.write(json.dumps({"request_id": f"m-{i}", "prompt": "hello metrics", "max_tokens": 12,
                            "temperature": 0}) + "\n")
    # three constrained jobs with one choice list: one compile, two cache hits
    for i in range(3):
        f.write(json.dumps({"request_id": f"c-{i}", "prompt": "yes or no", "max_tokens": 8,
                            "choice": ["yes", "no"]}) + "\n")
    f.write("garbage\n")
PY
"$bin/kgen-submit" --brokers "$brokers" --input "$tmp/jobs.jsonl" --output "$tmp/results.jsonl" --timeout 120 --no-progress

# A job is counted when the broker acknowledges its terminal event, which can come after
# kgen-submit has already read that event: wait for the counters to settle.
for _ in $(seq 1 100); do
    done_len=$(metric 'kgen_jobs_total{outcome="done",finish_reason="length"}')
    done_stop=$(metric 'kgen_jobs_total{outcome="done",finish_reason="stop"}')
    dlq=$(metric 'kgen_jobs_total{outcome="dead_letter"}')
    [[ "$done_len" == 20 && "$done_stop" == 3 && "$dlq" == 1 ]] && break
    sleep 0.1
done
# the constrained jobs: one compile, two cache hits, masks built for them
misses=$(metric 'kgen_grammar_cache_misses_total')
hits=$(metric 'kgen_grammar_cache_hits_total')
masks=$(metric 'kgen_grammar_masks_total')
echo "constrained: done(stop) $done_stop, grammar cache misses $misses, hits $hits, masks $masks"
[[ "$done_stop" == 3 && "$misses" == 1 && "$hits" == 2 ]] ||
    { echo "the grammar metrics did not move as expected"; exit 1; }
python3 -c 'import sys; assert float(sys.argv[1]) > 0' "${masks:-0}" ||
    { echo "kgen_grammar_masks_total is ${masks:-missing}"; exit 1; }
after=$(metric 'kgen_generation_tokens_total')
ttft=$(metric 'kgen_time_to_first_token_seconds_count')
steps=$(metric 'kgen_engine_steps_total')
echo "generation tokens $before -> $after, done(length) $done_len, dead-lettered $dlq, ttft count $ttft, steps $steps"
[[ "$after" -ge 20 ]] && [[ "$done_len" == 20 ]] && [[ "$dlq" == 1 ]] && [[ "$ttft" == 23 ]] && [[ "$steps" -gt 0 ]] \
    || { echo "metrics did not move as expected"; exit 1; }

# the autoscaling signal: present once a job has finished (lag and jobs in flight are 0 here, so
# it falls towards 0 within a few seconds)
drain=""
for _ in $(seq 1 50); do
    drain=$(metric 'kgen_estimated_drain_seconds')
    [[ -n "$drain" ]] && break
    sleep 0.1
done
[[ -n "$drain" ]] || { echo "no kgen_estimated_drain_seconds after 20 jobs"; exit 1; }
python3 -c 'import sys; v = float(sys.argv[1]); assert 0 <= v < 60, v' "$drain" ||
    { echo "kgen_estimated_drain_seconds out of range: $drain"; exit 1; }
echo "estimated drain seconds: $drain"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ "$rc" == 0 ]] || { echo "kgen-worker exited $rc after SIGTERM"; tail -20 "$tmp/err"; exit 1; }
echo "metrics test passed"
