#!/usr/bin/env bash
# moe-quantize.sh: llama.cpp's own quantization of kgen's random-weight expert models, as
# per-tensor hashes that tests/unit/check_moe.c compares `kgen mkmodel --mxfp4_moe` and
# `--q8_0` with (CI needs neither llama.cpp nor this script).
#
# For each model of tests/data/arch/models.tsv whose name is qwen3moe, mixtral or gpt-oss, it
# writes the F32 model with kgen, quantizes it with libllama's llama_model_quantize (ftype
# MOSTLY_MXFP4_MOE = 38 and MOSTLY_Q8_0 = 7: the experts MXFP4 or Q8_0, every other matrix
# Q8_0, the router, norms, biases and sinks F32), and records each tensor's name, type and
# FNV-1a 64 hash of its bytes in tests/data/arch/quantize-moe.txt.
#
# Usage (from the repository root):
#   scripts/goldens/moe-quantize.sh --llama-src DIR --llama-lib DIR [--kgen BIN] [--out FILE]
# --llama-src: a llama.cpp source tree (its include/ and ggml/include/); --llama-lib: the
# folder with the libllama.so built from it (cmake --build B --target llama).
set -euo pipefail
src="" lib="" kgen=build/bin/kgen out=tests/data/arch/quantize-moe.txt
while (($#)); do
    [[ $# -ge 2 ]] || { echo "moe-quantize.sh: $1 needs a value" >&2; exit 2; }
    case $1 in
    --llama-src) src=$2 ;;
    --llama-lib) lib=$2 ;;
    --kgen) kgen=$2 ;;
    --out) out=$2 ;;
    *) echo "moe-quantize.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
    shift 2
done
[[ -n $src && -n $lib ]] || { echo "usage: moe-quantize.sh --llama-src DIR --llama-lib DIR" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/q.c" <<'C'
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc != 4) {
        return 2;
    }
    llama_backend_init();
    llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = (enum llama_ftype)atoi(argv[3]);
    p.nthread = 1;
    return llama_model_quantize(argv[1], argv[2], &p) != 0;
}
C
cc -O1 "$tmp/q.c" -I"$src/include" -I"$src/ggml/include" -L"$lib" -lllama -Wl,-rpath,"$lib" \
    -o "$tmp/q"
commit=$(git -C "$src" log -1 --format=%h 2>/dev/null || echo unknown)
{
    echo "# llama.cpp $commit (libllama built from source, CPU) llama_model_quantize of kgen's F32"
    echo "# expert models, made by scripts/goldens/moe-quantize.sh on $(date -u +%Y-%m-%d)"
    echo "# model NAME TYPE (kgen mkmodel flag), then: ARGS (mkmodel arguments), then one line per"
    echo "# tensor: NAME TYPE FNV64 of its bytes"
} >"$out"
while IFS=$'\t' read -r name args; do
    [[ $name == qwen3moe || $name == mixtral || $name == gpt-oss ]] || continue
    # shellcheck disable=SC2086
    "$kgen" mkmodel --out "$tmp/f32.gguf" $args >/dev/null
    for t in "mxfp4_moe 38" "q8_0 7"; do
        read -r type ftype <<<"$t"
        "$tmp/q" "$tmp/f32.gguf" "$tmp/q.gguf" "$ftype" >/dev/null 2>&1
        { echo "model $name $type"; echo "args $args"; } >>"$out"
        python3 - "$tmp/q.gguf" >>"$out" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
pos = 0
def take(fmt):
    global pos
    v = struct.unpack_from("<" + fmt, data, pos)
    pos += struct.calcsize("<" + fmt)
    return v[0] if len(v) == 1 else v
def string():
    global pos
    n = take("Q"); s = data[pos:pos + n].decode(); pos += n
    return s
SIZES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def value(t):
    if t == 8:
        return string()
    if t == 9:
        et, n = take("I"), take("Q")
        return [value(et) for _ in range(n)]
    return take(SIZES[t])
magic, version, n_tensors, n_kv = take("4s"), take("I"), take("Q"), take("Q")
align = 32
for _ in range(n_kv):
    key, t = string(), take("I")
    v = value(t)
    if key == "general.alignment":
        align = v
infos = []
for _ in range(n_tensors):
    name, nd = string(), take("I")
    ne = [take("Q") for _ in range(nd)]
    infos.append((name, ne, take("I"), take("Q")))
base = (pos + align - 1) // align * align
TYPES = {0: "f32", 1: "f16", 8: "q8_0", 39: "mxfp4"}
BLOCK = {0: (1, 4), 1: (1, 2), 8: (32, 34), 39: (32, 17)}
for name, ne, t, off in infos:
    n = 1
    for d in ne:
        n *= d
    size = n // BLOCK[t][0] * BLOCK[t][1]
    h = 0xcbf29ce484222325
    for b in data[base + off:base + off + size]:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    print(f"tensor {name} {TYPES[t]} {h:016x}")
PY
    done
done <tests/data/arch/models.tsv
echo "wrote $out"
