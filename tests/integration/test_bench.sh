#!/usr/bin/env bash
# test_bench: kgen-bench, as a user runs it, on stories260K (1 thread, a second or two):
# - the batched table has one row per -npl entry, N_KV = (PP + TG) x B, every time and speed > 0,
#   and --json gives the same rows as JSON;
# - constrained mode (--json-schema, --regex) runs each B, and with jump-forward a JSON Schema
#   with fixed keys forces tokens (and needs fewer steps), with --no-jump-forward none;
# - arrivals mode (--json) answers every request and counts tokens;
# - --metrics runs; a bad flag or a missing model exits non-zero with a message.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
model="${KG_DATA_DIR:?}/models/stories260K.gguf"
schema="${KG_SOURCE_DIR:?}/scripts/bench-data/order.schema.json"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
bench() { "$bin/kgen-bench" -m "$model" -t 1 "$@"; }

bench -npp 16 -ntg 8 -npl 1,3,4 >"$tmp/table.md" 2>"$tmp/table.log"
bench -npp 16 -ntg 8 -npl 1,3,4 --json >"$tmp/table.json" 2>>"$tmp/table.log"
bench -npp 8 -ntg 16 -npl 1,2 --json-schema "$schema" --reps 1 >"$tmp/schema.md" 2>>"$tmp/table.log"
bench -npp 8 -ntg 16 -npl 1 --json-schema "$schema" --reps 1 --no-jump-forward \
    >"$tmp/schema-nojf.md" 2>>"$tmp/table.log"
bench -npp 8 -ntg 8 -npl 1,2 --regex '[a-z ]+' --reps 1 >"$tmp/regex.md" 2>>"$tmp/table.log"
bench -npp 8 -ntg 8 --arrivals 200 --n-requests 12 --json >"$tmp/arrivals.json" 2>>"$tmp/table.log"
bench -npp 8 -ntg 8 -npl 2 --metrics >"$tmp/metrics.md" 2>>"$tmp/table.log"

python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def rows(name):
    out = []
    for line in open(f"{d}/{name}"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].replace(".", "").isdigit():
            out.append(cells)
    return out
def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)

t = rows("table.md")
check([int(r[2]) for r in t] == [1, 3, 4], f"one row per -npl entry: {t}")
for pp, tg, b, nkv, *rest in t:
    check(int(nkv) == (int(pp) + int(tg)) * int(b), f"N_KV = (PP + TG) x B: {pp} {tg} {b} {nkv}")
    check(all(float(x) >= 0 for x in rest) and float(rest[-1]) > 0, f"times and speeds: {rest}")
j = json.load(open(f"{d}/table.json"))
check([r["b"] for r in j] == [1, 3, 4] and all(r["n_kv"] == (r["pp"] + r["tg"]) * r["b"] and
      r["speed"] > 0 for r in j), f"--json rows: {j}")

s = rows("schema.md")
check([int(r[0]) for r in s] == [1, 2], f"constrained rows per B: {s}")
forced = [int(r[2]) for r in s]
steps = [r[3].split("/") for r in s]
check(all(f > 0 for f in forced), f"jump-forward forces tokens of the schema's fixed keys: {s}")
check(all(int(c) < int(u) for c, u in steps), f"and needs fewer steps than unconstrained: {s}")
n = rows("schema-nojf.md")
check(len(n) == 1 and int(n[0][2]) == 0, f"--no-jump-forward forces nothing: {n}")
r = rows("regex.md")
check([int(x[0]) for x in r] == [1, 2] and all(int(x[1]) > 0 for x in r), f"regex rows: {r}")

a = json.load(open(f"{d}/arrivals.json"))
check(a["mode"] == "arrivals" and a["requests"] == 12 and a["tokens"] > 0 and a["wall_s"] > 0,
      f"arrivals: {a}")
m = rows("metrics.md")
check(len(m) == 1 and int(m[0][2]) == 2, f"--metrics row: {m}")
print(f"kgen-bench: {len(t)} batched rows, {len(s) + len(n) + len(r)} constrained rows, "
      f"{a['requests']} arrivals, metrics mode")
PY

if bench --bogus >"$tmp/out" 2>&1; then
    echo "FAIL: an unknown flag was accepted"
    exit 1
fi
grep -q "unknown or incomplete option '--bogus'" "$tmp/out" || { cat "$tmp/out"; exit 1; }
if "$bin/kgen-bench" -m "$tmp/missing.gguf" >"$tmp/out" 2>&1; then
    echo "FAIL: a missing model was accepted"
    exit 1
fi
grep -q "cannot open" "$tmp/out" || { cat "$tmp/out"; exit 1; }
echo "kgen-bench: bad flag and missing model refused"
