#!/usr/bin/env bash
# A mixture-of-experts model through the worker: kgen-worker --demo 0 on a
# random gpt-oss model (MXFP4 experts) runs jobs from kgen-submit, and its
# /metrics show the expert load: kgen_moe_tokens_per_expert_total per
# expert adds up to kgen_moe_routed_tokens_total (tokens x 2 experts x 2
# layers), grouped into kgen_moe_expert_gemms_total expert GEMMs.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/moe-metrics.XXXXXX")
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

"$bin/kgen" mkmodel --out "$tmp/oss.gguf" --arch gpt-oss --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 2 --head-dim 16 --n-ff 64 --n-expert 8 --n-expert-used 2 --sliding-window 16 \
    --ctx 256 --mxfp4_moe --seed 9 >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/kgen-worker" --demo 0 --model "$tmp/oss.gguf" --backend cpu --http-port "$port" \
    --max-batch-size 8 >"$tmp/out" 2>"$tmp/err" &
pid=$!

metrics() { curl -s "http://127.0.0.1:$port/metrics"; }
for _ in $(seq 1 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz" || true)
    [[ "$code" == 200 ]] && break
    sleep 0.1
done
[[ "$code" == 200 ]] || { echo "/readyz never turned 200"; cat "$tmp/err"; exit 1; }

brokers=$(grep -o 'brokers=[^ ]*' "$tmp/err" | head -1 | cut -d= -f2)
python3 - "$tmp/jobs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(12):
        f.write(json.dumps({"request_id": f"moe-{i}", "prompt": f"experts, job {i}",
                            "max_tokens": 10, "temperature": 0}) + "\n")
PY
"$bin/kgen-submit" --brokers "$brokers" --input "$tmp/jobs.jsonl" --output "$tmp/results.jsonl" \
    --timeout 120 --no-progress

metrics >"$tmp/metrics"
python3 - "$tmp/metrics" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
per = {int(m.group(1)): int(m.group(2))
       for m in re.finditer(r'^kgen_moe_tokens_per_expert_total\{expert="(\d+)"\} (\d+)$', text, re.M)}
def one(name):
    m = re.search(r"^%s (\d+)$" % name, text, re.M)
    assert m, f"no {name}"
    return int(m.group(1))
routed, gemms = one("kgen_moe_routed_tokens_total"), one("kgen_moe_expert_gemms_total")
prefill, decode = one("kgen_prefill_tokens_total"), one("kgen_decode_tokens_total")
print(f"experts {sorted(per)}: {per}; routed {routed}, expert GEMMs {gemms}, "
      f"tokens {prefill + decode}")
assert sorted(per) == list(range(8)), per
assert sum(per.values()) == routed, (sum(per.values()), routed)
assert routed == (prefill + decode) * 2 * 2, (routed, prefill, decode)
assert 0 < gemms <= routed, gemms
assert "# TYPE kgen_moe_tokens_per_expert_total counter" in text
PY

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ "$rc" == 0 ]] || { echo "kgen-worker exited $rc after SIGTERM"; tail -20 "$tmp/err"; exit 1; }
echo "moe metrics test passed"
