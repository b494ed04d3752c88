#!/usr/bin/env bash
# ugm-embed: the golden of a bert encoder with the XLM-RoBERTa unigram
# vocabulary (tests/data/tokenizer-vectors/xlm-r-bert.golden): kgen mkmodel
# writes a small random bert around tests/data/tokenizer-vectors/
# ggml-vocab-xlm-r.gguf, llama.cpp's llama-embedding gives its CLS vectors
# (not normalized) for a few multilingual texts. check_unigram remakes the
# model and compares kgen's vectors with these.
#
# Usage (as run for the committed file):
#   scripts/goldens/ugm-embed.sh build/bin/kgen /work/ref/llama.cpp/build/bin/llama-embedding
set -euo pipefail
kgen=${1:?kgen binary}
embedding=${2:?llama-embedding binary}
cd "$(dirname "$0")/../.."
vocab=tests/data/tokenizer-vectors/ggml-vocab-xlm-r.gguf
out=tests/data/tokenizer-vectors/xlm-r-bert.golden
args="--arch bert --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 4 --n-ff 128 --ctx 512 --pooling cls --seed 44 --type f32"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086 # args is a list of arguments
"$kgen" mkmodel $args --vocab-from "$vocab" --out "$tmp/m.gguf" >/dev/null
texts=("Hello world" "Ｈｅｌｌｏ　Ｗｏｒｌｄ！ Café naïve ﬁnance" "東京は日本の首都です。 👍🏽 北京欢迎你"
       "  Привет,   мир!  <mask> x")
{
    printf '%s' "${texts[0]}"
    for t in "${texts[@]:1}"; do printf '<#sep#>%s' "$t"; done
} >"$tmp/in.txt"
"$embedding" -m "$tmp/m.gguf" -f "$tmp/in.txt" --embd-separator '<#sep#>' \
    --embd-output-format array --embd-normalize -1 -c 512 --pooling cls -t 1 \
    >"$tmp/vec.json" 2>"$tmp/log.txt" || { cat "$tmp/log.txt" >&2; exit 1; }
{
    echo "# llama.cpp llama-embedding ($embedding, CPU), made by scripts/goldens/ugm-embed.sh on $(date -u +%F)"
    echo "# kgen mkmodel $args --vocab-from $vocab"
    python3 - "$tmp/vec.json" "${texts[@]}" <<'PY'
import re, sys
# llama-embedding's "array" output: [[v, ...],[v, ...]] (7 decimals)
vecs = [[float(x) for x in g.split(",")]
        for g in re.findall(r"\[([^\[\]]*)\]", open(sys.argv[1]).read())]
texts = sys.argv[2:]
assert len(vecs) == len(texts), (len(vecs), len(texts))
for i, (t, v) in enumerate(zip(texts, vecs)):
    print(f"text {i} {t}")
    print(f"vec {i} {len(v)} " + " ".join(f"{x:.9g}" for x in v))
PY
} >"$out"
echo "wrote $out"
