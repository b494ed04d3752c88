#!/usr/bin/env bash
# The families of issues 23 and 24 through the worker: for each, kgen-worker --demo 0
# (librdkafka's mock cluster, no broker to start) on a small random model of
# that family serves two greedy jobs from kgen-submit, which must come back
# complete with their tokens. The graphs themselves are checked against
# llama.cpp by check_arch; this is the path a user takes.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/families.XXXXXX")
pid=""
cleanup() {
    for p in $pid; do
        kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

shape=(--n-embd 64 --n-head 4 --n-head-kv 2 --n-ff 128 --ctx 256 --seed 7)
families=(
    "smollm3 --n-layer 4"
    "granite --n-layer 2"
    "olmo2 --n-layer 4 --sliding-window 16"
    "mistral3 --n-layer 2 --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 16"
    "seed_oss --n-layer 2 --head-dim 32"
    "apertus --n-layer 2"
    "glm4moe --n-layer 2 --n-ff-exp 64 --n-expert 8 --n-expert-used 2 --n-expert-groups 4 --n-group-used 2"
    "deepseek2 --n-layer 2 --n-head-kv 1 --head-dim 48 --n-rot 16 --kv-lora-rank 32 --n-ff-exp 64 --n-expert 8 --n-expert-used 2 --chat-template deepseek-v3.1"
    "gemma4 --n-layer 4 --swa-pattern 2 --sliding-window 8 --n-embd-per-layer 16 --n-kv-shared 2"
    "lfm2 --n-layer 4"
    "qwen35 --n-layer 3"
    "qwen35moe --n-layer 3 --n-ff-exp 64 --n-expert 8 --n-expert-used 2"
    "qwen3next --n-layer 3 --n-ff-exp 64 --n-expert 8 --n-expert-used 2"
    "granitehybrid --n-layer 2"
    "nemotron_h --n-layer 5"
    "nemotron_h_moe --n-layer 5 --n-ff-exp 64 --n-expert 4 --n-expert-used 2"
    "llama4 --n-layer 4 --n-ff-exp 64 --n-expert 4 --n-expert-used 1 --chat-template llama4"
    "lfm2moe --n-layer 4 --n-ff-exp 64 --n-expert 4 --n-expert-used 2"
    "granitehybrid:moe --n-layer 2 --n-expert 4 --n-expert-used 2"
)
python3 - "$tmp/jobs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(2):
        f.write(json.dumps({"request_id": f"fam-{i}", "prompt": f"Once upon a time, job {i}",
                            "max_tokens": 8, "temperature": 0}) + "\n")
PY
# every family's worker starts at once (each on its own mock cluster): the
# joins overlap, so the test costs about one worker's start
pids=()
ports=()
names=()
for fam in "${families[@]}"; do
    read -r -a args <<<"$fam"
    # "arch:variant": another model of the family (granitehybrid:moe is granitehybrid-moe)
    arch=${args[0]%%:*}
    name=${args[0]/:/-}
    # the family's flags after the shared shape, so they may override it
    "$bin/kgen" mkmodel --out "$tmp/$name.gguf" --arch "$arch" "${shape[@]}" "${args[@]:1}" >/dev/null
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$bin/kgen-worker" --demo 0 --model "$tmp/$name.gguf" --backend cpu --http-port "$port" \
        --max-batch-size 4 >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=("$!")
    ports+=("$port")
    names+=("$name")
done
pid="${pids[*]}"
for i in "${!names[@]}"; do
    name=${names[$i]}
    code=""
    for _ in $(seq 1 300); do
        code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${ports[$i]}/readyz" || true)
        [[ "$code" == 200 ]] && break
        sleep 0.1
    done
    [[ "$code" == 200 ]] || { echo "$name: /readyz never turned 200"; cat "$tmp/$name.err"; exit 1; }
    brokers=$(grep -o 'brokers=[^ ]*' "$tmp/$name.err" | head -1 | cut -d= -f2)
    "$bin/kgen-submit" --brokers "$brokers" --input "$tmp/jobs.jsonl" \
        --output "$tmp/$name.results.jsonl" --timeout 60 --no-progress
    python3 - "$name" "$tmp/$name.results.jsonl" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(path) if line.strip()]
assert len(rows) == 2, (name, rows)
for r in rows:
    # a random model may end at its end-of-generation token before 8
    assert r.get("type") == "done" and r.get("finish_reason") in ("length", "stop"), (name, r)
    n = r["usage"]["completion_tokens"]
    assert 1 <= n <= 8 and (n == 8 or r["finish_reason"] == "stop"), (name, r)
print(f"{name}: 2 jobs served")
PY
    # the weights' bytes in the backend's memory: present and non-zero for every family
    wb=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" | awk '$1 == "kgen_device_weight_bytes" {print $2}')
    [[ "$wb" =~ ^[0-9.e+]+$ && "$wb" != 0 ]] || { echo "$name: kgen_device_weight_bytes is '$wb'"; exit 1; }
    if [[ "$name" == deepseek2 ]]; then
        # multi-head latent attention caches (kv_lora_rank 32 + rope dims 16) x 2 layers x fp16
        bpt=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" |
            awk '$1 == "kgen_kv_cache_bytes_per_token" {print $2}')
        [[ "$bpt" == 192 ]] || { echo "deepseek2: kgen_kv_cache_bytes_per_token is '$bpt', not 192"; exit 1; }
        echo "deepseek2: kgen_kv_cache_bytes_per_token 192"
    fi
    if [[ "$name" == lfm2 ]]; then
        # 3 convolution layers (attention is layer 2) x (l_cache 3 - 1) x 64 floats x 4 slots
        sb=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" |
            awk '$1 == "kgen_recurrent_state_bytes" {print $2}')
        [[ "$sb" == 6144 ]] || { echo "lfm2: kgen_recurrent_state_bytes is '$sb', not 6144"; exit 1; }
        echo "lfm2: kgen_recurrent_state_bytes 6144"
        # and one snapshot per slot for the prefix cache
        snb=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" |
            awk '$1 == "kgen_recurrent_snapshot_bytes" {print $2}')
        [[ "$snb" == 6144 ]] || { echo "lfm2: kgen_recurrent_snapshot_bytes is '$snb', not 6144"; exit 1; }
    fi
    if [[ "$name" == qwen35 ]]; then
        # 2 DeltaNet layers (attention is layer 2), each (conv 4 - 1) x (2 K heads x 16 + 64)
        # conv floats and 4 V heads x 16 x 16 delta-rule floats, x 4 bytes x 4 slots
        sb=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" |
            awk '$1 == "kgen_recurrent_state_bytes" {print $2}')
        [[ "$sb" == 45056 ]] || { echo "qwen35: kgen_recurrent_state_bytes is '$sb', not 45056"; exit 1; }
        echo "qwen35: kgen_recurrent_state_bytes 45056"
    fi
    if [[ "$name" == granitehybrid ]]; then
        # 1 Mamba-2 layer (attention is the last): the convolution's (4 - 1) x (d_inner 128 +
        # 2 groups x d_state 64) and the SSM's 64 x 128 floats, x 4 slots
        sb=$(curl -s "http://127.0.0.1:${ports[$i]}/metrics" |
            awk '$1 == "kgen_recurrent_state_bytes" {print $2}')
        [[ "$sb" == 149504 ]] || {
            echo "granitehybrid: kgen_recurrent_state_bytes is '$sb', not 149504"
            exit 1
        }
        echo "granitehybrid: kgen_recurrent_state_bytes 149504"
    fi
done
for i in "${!names[@]}"; do
    kill -TERM "${pids[$i]}"
done
for i in "${!names[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    [[ "$rc" == 0 ]] || {
        echo "${names[$i]}: kgen-worker exited $rc after SIGTERM"
        tail -20 "$tmp/${names[$i]}.err"
        exit 1
    }
done
pid=""
echo "families test passed"
