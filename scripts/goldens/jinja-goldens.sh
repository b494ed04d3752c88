#!/usr/bin/env bash
# jinja-goldens: the goldens of kgen's Jinja engine (tests/data/chat/jinja/goldens.json), made by
# llama.cpp's own chat code (common_chat_templates_apply with --jinja semantics) through the small
# harness scripts/goldens/jinja-render.cpp, for every template of llama.cpp's models/templates/
# and every conversation of tests/data/chat/jinja/conversations.json. The templates are copied to
# tests/data/chat/jinja/templates/ (MIT-licensed test data from llama.cpp).
#
# usage: scripts/goldens/jinja-goldens.sh [LLAMA_CPP_SOURCE [LLAMA_CPP_BUILD]]
#   defaults: /work/ref/llama.cpp and its build/ (a CPU build with the `llama-common` target:
#   cmake -B build -DBUILD_SHARED_LIBS=OFF && cmake --build build --target llama-common)
# Run in UTC (TZ=UTC is set here): strftime_now and date_string use the local time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:-/work/ref/llama.cpp}
build=${2:-$src/build}
out=$root/tests/data/chat/jinja
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

sym=_ZN5jinja16global_from_jsonI11common_jsonEEvRNS_7contextERKT_b
g++ -std=c++17 -O1 -o "$tmp/jinja-render" "$here/jinja-render.cpp" \
    -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
    -Wl,--wrap="$sym" \
    "$build/common/libllama-common.a" "$build/common/libllama-common-base.a" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -lgomp -lpthread -ldl -lm

mkdir -p "$out/templates"
rm -f "$out"/templates/*.jinja
cp "$src"/models/templates/*.jinja "$out/templates/"
TZ=UTC "$tmp/jinja-render" "$out/conversations.json" "$out"/templates/*.jinja > "$out/goldens.json"
python3 - "$out/goldens.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
ok = [c for c in doc["cases"] if "output" in c]
bad = [c for c in doc["cases"] if "error" in c]
print(f"{len(ok)} golden renders, {len(doc['contexts'])} contexts; llama.cpp refused {len(bad)}:")
for c in bad:
    print(f"  {c['template']} / {c['case']}: {c['error'][:160]}")
PY
