#!/usr/bin/env bash
# test_worker_throughput (acceptance 8, numbers for the README): the same 400 jobs (64 tokens
# each, ignore_eos, streamed) through `kgen batch` (offline, no Kafka) and through a real
# broker (kgen-submit + one kgen-worker), same model, --max-batch-size and --threads, then
# once more through Kafka with stream false (no token events). Prints
# jobs/s and generated tokens/s both ways, wall clock from start to the last result (model
# load included for kgen batch; producing the jobs included for Kafka). Not a pass/fail
# comparison: it fails only if a job does not finish or the token counts differ.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-throughput
kg_need_java

N=${KG_THROUGHPUT_JOBS:-400}
TOKENS=64
BATCH=16
THREADS=2
kg_broker_start
kg_topics 4
kg_model
kg_jobs "$T/jobs.jsonl" "$N" "{\"max_tokens\": $TOKENS, \"ignore_eos\": true}"

t0=$(date +%s%N)
"$KG_BIN/kgen" batch --model "$MODEL" --input "$T/jobs.jsonl" --output "$T/batch.jsonl" \
    --max-batch-size "$BATCH" --threads "$THREADS" 2>"$T/batch.log"
batch_ms=$((($(date +%s%N) - t0) / 1000000))

# --max-queue-depth above N, like kgen batch that holds the whole file.
kg_worker w1 --max-batch-size "$BATCH" --threads "$THREADS" --max-queue-depth 1024
kg_wait_assigned 60 4 w1
kg_submit_timed 170
kafka_ms=$KG_MS
kg_check_results "$T/jobs.jsonl" "$T/results.jsonl" "$T/events.jsonl"
kg_expect_no_errors "$T/results.jsonl"
# The same jobs without token events (stream false): the cost of one event per token.
kg_jobs "$T/jobs-ns.jsonl" "$N" "{\"max_tokens\": $TOKENS, \"ignore_eos\": true, \"stream\": false}" ns
t0=$(date +%s%N)
kg_submit --input "$T/jobs-ns.jsonl" --output "$T/results-ns.jsonl" --timeout 170 --no-progress \
    2>"$T/submit-ns.log" || kg_fail "kgen-submit (stream false): not every job finished"
ns_ms=$((($(date +%s%N) - t0) / 1000000))
kg_expect_no_errors "$T/results-ns.jsonl"

python3 - "$T/batch.jsonl" "$T/results.jsonl" "$batch_ms" "$kafka_ms" "$N" "$BATCH" "$THREADS" \
    "$T/results-ns.jsonl" "$ns_ms" <<'PY'
import json, sys
b = [json.loads(l) for l in open(sys.argv[1])]
k = [json.loads(l) for l in open(sys.argv[2])]
bms, kms, n, batch, threads = map(int, sys.argv[3:8])
ns = [json.loads(l) for l in open(sys.argv[8])]
nsms = int(sys.argv[9])
tns = sum(x["usage"]["completion_tokens"] for x in ns)
assert len(b) == len(k) == n and all(x["type"] == "done" for x in b + k)
tb = sum(x["usage"]["completion_tokens"] for x in b)
tk = sum(x["usage"]["completion_tokens"] for x in k)
assert tb == tk == tns, (tb, tk, tns)
assert len(ns) == n and all(x["type"] == "done" for x in ns)
# same seeds and sampling: the texts are the same both ways
same = sum(1 for x, y in zip(sorted(b, key=lambda r: r["request_id"]),
                             sorted(k, key=lambda r: r["request_id"])) if x["text"] == y["text"])
print(f"throughput ({n} jobs x {tb // n} tokens, --max-batch-size {batch}, --threads {threads}):")
print(f"  {'kgen batch':20} {bms / 1e3:7.2f} s  {n / (bms / 1e3):8.1f} jobs/s  {tb / (bms / 1e3):9.0f} tokens/s")
print(f"  {'Kafka (1 worker)':20} {kms / 1e3:7.2f} s  {n / (kms / 1e3):8.1f} jobs/s  {tk / (kms / 1e3):9.0f} tokens/s")
print(f"  {'Kafka, stream=false':20} {nsms / 1e3:7.2f} s  {n / (nsms / 1e3):8.1f} jobs/s  {tns / (nsms / 1e3):9.0f} tokens/s")
print(f"  Kafka / batch: {bms / kms:.2f}x (stream), {bms / nsms:.2f}x (no token events); "
      f"identical texts: {same}/{n}")
PY
grep -E 'jobs finished in' "$T/submit.log" || true
kg_stop_pid "$(kg_pid w1)" 30
kg_finish "throughput measured ($N jobs both ways)"
