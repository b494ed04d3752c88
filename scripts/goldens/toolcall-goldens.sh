#!/usr/bin/env bash
# toolcall-goldens: the goldens of kgen's tool-call parser (tests/data/toolcall/goldens.json),
# made by llama.cpp's own chat parser (common_chat_parse with the parser common_chat_templates_apply
# builds for a template) through the harness scripts/goldens/toolcall-parse.cpp, for every group of
# model outputs in tests/data/toolcall/outputs.json against the real templates of that group
# (tests/data/chat/jinja/templates/, copied from llama.cpp's models/templates/).
#
# usage: scripts/goldens/toolcall-goldens.sh [LLAMA_CPP_SOURCE [LLAMA_CPP_BUILD]]
#   defaults: /work/ref/llama.cpp and its build/ (a CPU build with the `llama-common` target).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:-/work/ref/llama.cpp}
build=${2:-$src/build}
out=$root/tests/data/toolcall
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

g++ -std=c++17 -O1 -o "$tmp/toolcall-parse" "$here/toolcall-parse.cpp" \
    -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
    "$build/common/libllama-common.a" "$build/common/libllama-common-base.a" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -lgomp -lpthread -ldl -lm

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
