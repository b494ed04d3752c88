#!/usr/bin/env bash
# test_worker_options: --http-address binds the metrics port to one address (the kernel's table of
# listening sockets shows 127.0.0.1, not 0.0.0.0, and /healthz answers there), the default still
# listens on every interface, a bad address is a startup error (exit 2), two jobs topics (lanes)
# may share a --dlq-topic but not an --inflight-topic, --print-config works without --model, and
# --dry-run prints the memory plan (exit 1 when --device-memory is too small).
# On the demo's mock cluster: no broker needed.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-options

# The local address of the TCP socket listening on PORT, from /proc/net/tcp (hex, as the kernel
# writes it: 0100007F is 127.0.0.1, 00000000 is 0.0.0.0); empty while nothing listens.
listen_addr() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print substr($2, 1, 8) }' \
        /proc/net/tcp
}

port=$(kg_free_port)
kg_bg one env TMPDIR="$T" "$KG_BIN/kgen-worker" --demo 0 --http-port "$port" \
    --http-address 127.0.0.1 --threads 1
kg_wait 60 "/healthz on 127.0.0.1:$port" curl -sf "http://127.0.0.1:$port/healthz"
[[ "$(listen_addr "$port")" == 0100007F ]] ||
    kg_fail "--http-address 127.0.0.1 listens on $(listen_addr "$port")"
kg_stop_pid "$(kg_pid one)" 20

port=$(kg_free_port)
kg_bg all env TMPDIR="$T" "$KG_BIN/kgen-worker" --demo 0 --http-port "$port" --threads 1
kg_wait 60 "/healthz on port $port" curl -sf "http://127.0.0.1:$port/healthz"
[[ "$(listen_addr "$port")" == 00000000 ]] ||
    kg_fail "the default address listens on $(listen_addr "$port"), not 0.0.0.0"
kg_stop_pid "$(kg_pid all)" 20
kg_note "--http-address 127.0.0.1 binds 127.0.0.1 only; the default binds 0.0.0.0"

rc=0
"$KG_BIN/kgen-worker" --demo 0 --http-address eth0 >"$T/bad.out" 2>&1 || rc=$?
((rc == 2)) || kg_fail "--http-address eth0 exited $rc (want 2)"
grep -q "http-address: expected an IPv4 or IPv6 address" "$T/bad.out" || kg_fail "$(cat "$T/bad.out")"

# lanes: one --dlq-topic shared by two jobs topics works; one --inflight-topic for two is refused
# (the lanes' snapshots would crowd each other out of the tail a new owner reads)
env TMPDIR="$T" "$KG_BIN/kgen-worker" --demo 4 --threads 1 --http-port 0 \
    --jobs-topic a:8,b:1 --dlq-topic shared.dlq >"$T/lanes.out" 2>&1 ||
    kg_fail "two lanes with one --dlq-topic: $(tail -3 "$T/lanes.out")"
rc=0
env TMPDIR="$T" "$KG_BIN/kgen-worker" --demo 4 --threads 1 --http-port 0 \
    --jobs-topic a:8,b:1 --inflight-topic shared.inflight >"$T/lanes2.out" 2>&1 || rc=$?
((rc == 1)) || kg_fail "two lanes with one --inflight-topic exited $rc (want 1)"
grep -q "inflight-topic names one topic; with several jobs topics leave it empty" "$T/lanes2.out" ||
    kg_fail "$(tail -3 "$T/lanes2.out")"

"$KG_BIN/kgen-worker" --print-config -X sasl.password=s3cret >"$T/config.txt"
grep -q '^model=$' "$T/config.txt" || kg_fail "--print-config without --model: $(head -3 "$T/config.txt")"
grep -q '^kafka.sasl.password=\[redacted\]$' "$T/config.txt" || kg_fail "a secret was printed"
grep -q '^http-address=0.0.0.0$' "$T/config.txt" || kg_fail "no http-address in --print-config"
# --dry-run: the memory plan of a Q4_K_M model, no Kafka: its matrices stay GGUF blocks on the
# GPU (1.00x the file), the KV pool as the flags size it; --device-memory too small exits 1
"$KG_BIN/kgen" mkmodel --out "$T/q4km.gguf" --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 \
    --n-ff 512 --seed 3 --type q4_k_m >/dev/null
"$KG_BIN/kgen-worker" --model "$T/q4km.gguf" --dry-run --max-batch-size 4 --ctx 512 \
    --device-memory 64 >"$T/plan.txt" || kg_fail "--dry-run: $(cat "$T/plan.txt")"
grep -q '^cuda        weights .* (1.00x the file; ' "$T/plan.txt" || kg_fail "plan: $(cat "$T/plan.txt")"
# 2 layers x 2 (K, V) x 2 heads x 64 dims x 2 bytes = 1 KiB a token; 4 x 512 tokens and the
# engine's admission headroom
grep -q '^kv cache    .* x 1.0 KiB a token (4 sequences, context 512)$' "$T/plan.txt" ||
    kg_fail "plan: $(cat "$T/plan.txt")"
grep -q '^device      64.0 MiB: fits' "$T/plan.txt" || kg_fail "plan: $(cat "$T/plan.txt")"
# --kv-type q8_0 with --kv-memory: 34 bytes per 32 values (544 B a token), so the same 16 MiB
# hold 1.88x the blocks: 16 MiB / (16 x 544 B) = 1927 blocks (f16: 1024)
"$KG_BIN/kgen-worker" --model "$T/q4km.gguf" --dry-run --kv-memory 16 --kv-type q8_0 \
    >"$T/plan_q8.txt" || kg_fail "--dry-run --kv-type q8_0: $(cat "$T/plan_q8.txt")"
grep -q '^kv cache    .* of q8_0: 1927 blocks of 16 tokens x 0.5 KiB a token' "$T/plan_q8.txt" ||
    kg_fail "plan: $(cat "$T/plan_q8.txt")"
grep -q '^cpu         --kv-type q8_0: the cpu backend keeps K/V in f16 only$' "$T/plan_q8.txt" ||
    kg_fail "plan: $(cat "$T/plan_q8.txt")"
rc=0
"$KG_BIN/kgen-worker" --model "$T/q4km.gguf" --dry-run --device-memory 1 >"$T/plan2.txt" \
    2>"$T/plan2.err" || rc=$?
((rc == 1)) || kg_fail "--dry-run --device-memory 1 exited $rc (want 1)"
grep -q "do not fit in --device-memory 1 MiB" "$T/plan2.err" || kg_fail "$(cat "$T/plan2.err")"
kg_note "--dry-run: $(grep '^cuda        weights' "$T/plan.txt")"
kg_finish "--http-address binds one address; lanes share a DLQ, not a journal; --print-config needs no model; --dry-run plans memory"
