#!/usr/bin/env bash
# test_worker_backpressure (acceptance 4): 5,000 jobs already waiting in the jobs topic when one
# worker starts with --max-batch-size 8 and --max-queue-depth 64: the worker
# takes at most what it may hold, pauses its partitions, resumes as jobs finish (both logged
# at debug level with the in-flight count: every pause is seen), and every job completes. A
# sampler reads /metrics (kgen_consumer_paused, kgen_jobs_inflight) and /proc/PID/status every
# 0.2 s: in-flight peak, paused samples, samples with nothing in flight while jobs still wait
# (the worker waiting for the fetch after a resume) and peak RSS (VmHWM) are printed; the peak
# RSS after all 5,000 jobs stays near the peak after the first 500 (no growth with the
# backlog).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-backpressure
kg_need_java

N=5000
BATCH=8
DEPTH=64
kg_broker_start
kg_topics 4
kg_model
kg_jobs "$T/jobs.jsonl" "$N" '{"max_tokens": 3}'

kg_submit_bg 170
kg_wait_log "$T/submit.log" "produced $N messages" 60
kg_note "$N jobs waiting in $JOBS"

port=$(kg_free_port)
kg_worker w1 --max-batch-size "$BATCH" --max-queue-depth "$DEPTH" --http-port "$port" \
    --log-level debug
wpid=$(kg_pid w1)
# (a background command's stdin is /dev/null: the sampler goes through a file)
cat >"$T/sampler.py" <<'PY'
import json, os, re, sys, time, urllib.request
port, pid, results, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
samples = []
def status(field):
    try:
        m = re.search(field + r":\s*(\d+) kB", open(f"/proc/{pid}/status").read())
        return int(m.group(1)) if m else None
    except OSError:
        return None
while True:
    hwm = status("VmHWM")
    if hwm is None:
        break
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        m = dict(re.findall(r"^(kgen_consumer_paused|kgen_jobs_inflight) (\d+)", text, re.M))
    except OSError:
        m = {}
    try:
        done = sum(1 for _ in open(results))
    except OSError:
        done = 0
    samples.append({"paused": int(m.get("kgen_consumer_paused", -1)),
                    "inflight": int(m.get("kgen_jobs_inflight", -1)),
                    "hwm_kib": hwm, "rss_kib": status("VmRSS"), "done": done})
    with open(out + ".tmp", "w") as f:
        json.dump(samples, f)
    os.replace(out + ".tmp", out)
    time.sleep(0.2)
PY
kg_bg sampler python3 "$T/sampler.py" "$port" "$wpid" "$T/results.jsonl" "$T/samples.json"

kg_wait_exit "$(kg_pid submit)" 180
((KG_RC == 0)) || kg_fail "kgen-submit exited $KG_RC (not every job finished)"
cat "$T/submit.log" | tail -n 1
sleep 0.5
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"

# ASan's quarantine keeps freed memory (256 MiB by default): no RSS bound in a sanitizer build.
asan=0
if ldd "$KG_BIN/kgen-worker" 2>/dev/null | grep -q libasan; then
    asan=1
fi
python3 - "$T/samples.json" "$BATCH" "$DEPTH" "$T/w1.log" "$N" "$asan" <<'PY'
import json, re, sys
s = [x for x in json.load(open(sys.argv[1])) if x["inflight"] >= 0]
cap = int(sys.argv[2]) + int(sys.argv[3])
n = int(sys.argv[5])
log = open(sys.argv[4]).read()
pauses = [int(v) for v in re.findall(r'msg="paused partitions" inflight=(\d+)', log)]
resumes = [int(v) for v in re.findall(r'msg="resumed partitions" inflight=(\d+)', log)]
assert len(s) >= 5, f"only {len(s)} metric samples"
paused = sum(1 for x in s if x["paused"] == 1)
idle = sum(1 for x in s if x["inflight"] == 0 and 0 < x["done"] < n)
peak = max([x["inflight"] for x in s] + pauses)
hwm_end = max(x["hwm_kib"] for x in s)
early = [x["hwm_kib"] for x in s if x["done"] <= 500]
hwm_500 = max(early) if early else None
print(f"backpressure: {len(pauses)} pauses (at inflight {min(pauses, default=0)}.."
      f"{max(pauses, default=0)}), {len(resumes)} resumes (at {min(resumes, default=0)}.."
      f"{max(resumes, default=0)}); {len(s)} samples: paused in {paused}, nothing in flight "
      f"while jobs waited in {idle}; peak inflight {peak} (cap {cap}), "
      f"peak RSS {hwm_end / 1024:.1f} MiB (after <= 500 jobs: "
      f"{hwm_500 / 1024 if hwm_500 else float('nan'):.1f} MiB), last RSS {s[-1]['rss_kib'] / 1024:.1f} MiB")
assert pauses and resumes, "the consumer never paused and resumed"
assert all(p >= cap for p in pauses) and all(r <= cap * 3 // 4 for r in resumes), (pauses, resumes)
# the fetch queue may hand over a poll batch (64) after the pause
assert peak <= cap + 64, f"inflight peaked at {peak}, cap {cap}"
if hwm_500 and sys.argv[6] == "0":
    assert hwm_end <= hwm_500 + 64 * 1024, "peak RSS grew by more than 64 MiB with the backlog"
PY
kg_stop_pid "$(kg_pid w1)" 30
grep -q 'msg="stopped" rc=0' "$T/w1.log" || kg_fail "the worker did not stop cleanly"
kg_finish "$N waiting jobs through --max-batch-size $BATCH with pauses, all done"
