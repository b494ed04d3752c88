#!/usr/bin/env bash
# toolcall-goldens: the goldens of kgen's tool-call parser (tests/data/toolcall/goldens.json),
# made by llama.cpp's own chat parser (common_chat_parse with the parser common_chat_templates_apply
# builds for a template) through the harness scripts/goldens/toolcall-parse.cpp, for every group of
# model outputs in tests/data/toolcall/outputs.json against the real templates of that group
# (tests/data/chat/jinja/templates/, copied from llama.cpp's models/templates/).
#
# usage: scripts/goldens/toolcall-goldens.sh [LLAMA_CPP_SOURCE [LLAMA_CPP_BUILD]]
#   defaults: /work/ref/llama.cpp and its build/ (a CPU build with the `llama-common` target:
#   cmake -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF && cmake --build build --target llama-common,
#   static or shared libraries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:-/work/ref/llama.cpp}
build=${2:-$src/build}
out=$root/tests/data/toolcall
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# a static build (-DBUILD_SHARED_LIBS=OFF) or the default shared one (libraries in bin/)
if [ -f "$build/common/libllama-common.a" ]; then
    libs=("$build/common/libllama-common.a" "$build/common/libllama-common-base.a"
        "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a"
        "$build/ggml/src/libggml-base.a")
else
    libs=("-L$build/bin" "-Wl,-rpath,$build/bin" "$build/common/libllama-common-base.a"
        -lllama-common -lllama -lggml -lggml-cpu -lggml-base)
fi
g++ -std=c++17 -O1 -o "$tmp/toolcall-parse" "$here/toolcall-parse.cpp" \
    -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
    "${libs[@]}" -lgomp -lpthread -ldl -lm

python3 "$here/toolcall-outputs.py" "$out/outputs.json"
TZ=UTC "$tmp/toolcall-parse" "$out/outputs.json" "$root/tests/data/chat/jinja/templates" \
    > "$out/goldens.json"
python3 - "$out/goldens.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [c for c in doc["cases"] if "error" in c]
print(f"{len(doc['cases']) - len(bad)} parses; llama.cpp refused {len(bad)}:")
for c in bad:
    print(f"  {c['template']} / {c['output']}: {c['error'][:160]}")
PY
