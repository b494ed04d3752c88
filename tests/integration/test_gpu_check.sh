#!/usr/bin/env bash
# test_gpu_check: scripts/gpu-check without a GPU. --dry-run must list every
# step and the commands it would run (and need no nvidia-smi, nvcc or
# models); --report must turn a results file into the table, mark the goals
# and fail when the file holds a failed check. The results file here is a
# synthetic fixture written by this test (made-up numbers, for the format
# only; real figures come from a GPU run).
set -euo pipefail

src="${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="${KG_TEST_TMP:-/tmp}/gpu-check-test-$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "test_gpu_check: $*" >&2
    exit 1
}

# ---- --dry-run ----
# no GPU tools on the path: a dry run must not need them
out=$(PATH=/usr/bin:/bin "$src/scripts/gpu-check" --dry-run "$tmp/build") || fail "--dry-run exited $?"
for want in "1. build" "2. check_cuda (unforked)" "3. compute-sanitizer memcheck" \
    "4. read bandwidth" "5. parity" "6a. throughput, Llama-3.2-1B" "6b. throughput, Llama-3.1-8B" \
    "7. parity at the Llama-3.2-1B shape, F16 and Q8_0; BF16 with --kv-type q8_0" \
    "--nmse-max 2e-3 --kv-type q8_0" "8. compute-sanitizer racecheck and synccheck" \
    "9. Llama-3.2-1B with KGEN_CUDA_GEMM=cublas" "report" \
    "-DKGEN_CUDA=ON" "check_cuda_errors" "--tool memcheck" "--tool racecheck" "--tool synccheck" \
    "CK_RUN_CASE=short" "kgen-bandwidth 2048" "kgen-parity --model" "--contexts 4096" \
    "--n-vocab 128256" "--bf16" "--f16" "--q8_0" "-npl 1\\,8\\,32\\,96\\,128\\,256" "-npp 4096" \
    "KGEN_CUDA_GEMM=cublas" "dry run: nothing was run" "6c. Llama-3.1-8B shape, Q4_K_M and Q8_0" \
    "--type q4_k_m" "-npl 1\\,8 --json" "6d. Llama-3.2-1B shape (BF16), --kv-type f16 and q8_0" \
    "--kv-type q8_0 -npp 2048 -ntg 32 -npl 32 --json"; do
    grep -qF -- "$want" <<<"$out" || fail "--dry-run does not mention '$want'"
done
[[ ! -e "$tmp/build" ]] || fail "--dry-run created $tmp/build"

# ---- --report ----
res="$tmp/results.jsonl"
cat >"$res" <<'EOF'
{"kind":"bandwidth","read_gbps":4000.0,"copy_gbps":3800.0,"device":"synthetic"}
{"kind":"test","name":"check_cuda","ok":true}
{"kind":"sanitizer","tool":"memcheck","rc":0}
{"kind":"parity","type":"bf16","rc":0,"ok":true,"rows":80,"max_context":4096,"mixed_steps":9,"nmse_max":2e-5,"nmse_mean":1e-5,"nmse_bound":1e-3,"greedy_rows":48,"greedy_equal":48,"greedy_fail":0,"sampled_rows":32,"sampled_equal":32,"sampled_equal_e2e":30}
{"kind":"decode","shape":"Llama-3.2-1B","mode":"mma","dims":[2048,16,32,8,8192,128256],"npp":512,"ntg":64,"pp":512,"tg":64,"b":128,"n_kv":73728,"t_pp":0.5,"speed_pp":1,"t_tg":0.128,"speed_tg":64000.0,"t":1,"speed":1}
{"kind":"decode","shape":"Llama-3.1-8B","mode":"mma","dims":[4096,32,32,8,14336,128256],"npp":512,"ntg":64,"pp":512,"tg":64,"b":1,"n_kv":576,"t_pp":0.02,"speed_pp":1,"t_tg":0.4,"speed_tg":160.0,"t":1,"speed":1}
{"kind":"ttft","shape":"Llama-3.1-8B","mode":"mma","prompt":512,"pp":512,"tg":1,"b":1,"t_pp":0.015,"t_tg":0,"speed_tg":0}
{"kind":"qdecode","shape":"Llama-3.1-8B","type":"q4_k_m","pp":512,"tg":64,"b":1,"speed_tg":432.0}
{"kind":"qdecode","shape":"Llama-3.1-8B","type":"q8_0","pp":512,"tg":64,"b":1,"speed_tg":240.0}
{"kind":"kvdecode","shape":"Llama-3.2-1B","kv_type":"f16","pp":2048,"tg":32,"b":32,"speed_tg":10000.0}
{"kind":"kvdecode","shape":"Llama-3.2-1B","kv_type":"q8_0","pp":2048,"tg":32,"b":32,"speed_tg":13500.0}
EOF
out=$("$src/scripts/gpu-check" --report "$res") || fail "--report exited $? on a passing file"
for want in "| check_cuda | pass |" "| compute-sanitizer memcheck | clean |" "| parity bf16" \
    "| Llama-3.2-1B | mma | 128 | 64000 |" "| Llama-3.1-8B | mma | 1 | 160 |" \
    "goal: 1B decode at B = 128 >= 60k tok/s: 64000.0: met" \
    "goal: 8B decode at B = 1 >= 200 tok/s: 160.0: NOT met" \
    "goal: 8B TTFT at 512 tokens <= 16 ms: 15.0: met" \
    "goal: 8B decode at B = 128 >= 14k tok/s: not measured" \
    "| Llama-3.1-8B q4_k_m | mma | 1 | 432 | 2.70x BF16 |" \
    "goal: 8B Q4_K_M decode at B = 1 >= 2.5x BF16: 2.7: met" \
    "goal: 8B Q8_0 decode at B = 1 >= 1.6x BF16: 1.5: NOT met" \
    "| Llama-3.2-1B kv q8_0 (ctx 2048) | mma | 32 | 13500 | 1.35x f16 KV |"; do
    grep -qF -- "$want" <<<"$out" || fail "--report lacks '$want'; got:
$out"
done
# the 1B row's roofline: (weights + KV) / 4000 GB/s over 2 ms a step
python3 - "$out" <<'EOF' || fail "the 1B roofline fraction is wrong"
import re, sys
E, L, H, K, F, V = 2048, 16, 32, 8, 8192, 128256
hd = E // H
w = 2 * (L * (E * (H * hd + 2 * K * hd) + H * hd * E + 3 * E * F) + V * E) + 4 * (2 * L + 1) * E
kv = 128 * (512 + 32) * 2 * L * K * hd * 2
want = (w + kv) / 4000e9 / (0.128 / 64)
got = float(re.search(r"\| Llama-3.2-1B \| mma \| 128 \| 64000 \| ([0-9.]+) \|", sys.argv[1]).group(1))
sys.exit(0 if abs(got - want) < 0.006 else 1)
EOF
echo '{"kind":"parity","type":"q8_0","rc":1,"ok":false,"rows":4,"max_context":1024,"mixed_steps":1,"nmse_max":0.5,"nmse_mean":0.4,"nmse_bound":0.02,"greedy_rows":2,"greedy_equal":1,"greedy_fail":1,"sampled_rows":2,"sampled_equal":2,"sampled_equal_e2e":1}' >>"$res"
if out=$("$src/scripts/gpu-check" --report "$res"); then
    fail "--report exited 0 on a file with a failed parity check"
fi
grep -qF "| parity q8_0" <<<"$out" || fail "the failed parity row is missing"
grep -qF "FAIL" <<<"$out" || fail "the failed parity row is not marked FAIL"
echo "test_gpu_check: dry run lists every step; the report formats and fails as it should"
