#!/usr/bin/env bash
# kgen batch on stories260K: every line gets one event; 24 jobs (greedy and
# seeded sampling, different lengths, stop strings) give identical texts at
# --max-batch-size 1 and 16 (batch invariance); 32 jobs sharing a 200-token
# prefix prefill fewer tokens with the prefix cache than without.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
model="${KG_DATA_DIR:?}/models/stories260K.gguf"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/batch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp/jobs.jsonl" <<'PY'
import json, random, sys
random.seed(7)
prompts = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a cat",
           "The sun was", "There was a big tree", "Mom said", "The boy wanted"]
with open(sys.argv[1], "w") as f:
    for i in range(24):
        j = {"request_id": f"job-{i}", "prompt": prompts[i % 8], "max_tokens": random.randint(8, 100)}
        if i % 2 == 0:
            j["temperature"] = 0
        else:
            j.update({"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1000 + i})
        if i % 5 == 0:
            j["stop"] = [". "]
        if i % 7 == 0:
            j["logprobs"] = 2
        f.write(json.dumps(j) + "\n")
    f.write("this line is not json\n")
    f.write('{"request_id": "bad-1", "prompt": "x", "max_tokens": -3}\n')
    f.write('{"request_id": "long-1", "prompt": "' + "word " * 400 + '"}\n')
PY

"$bin/kgen" batch --model "$model" --input "$tmp/jobs.jsonl" --output "$tmp/b1.jsonl" --max-batch-size 1 --threads 2
"$bin/kgen" batch --model "$model" --input "$tmp/jobs.jsonl" --output "$tmp/b16.jsonl" --max-batch-size 16 --max-batch-tokens 64 --threads 2

python3 - "$tmp/b1.jsonl" "$tmp/b16.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 27, (len(a), len(b))
for x, y in zip(a, b):
    assert x["request_id"] == y["request_id"]
    assert x["type"] == y["type"], (x, y)
    if x["type"] == "done":
        assert x["text"] == y["text"], (x["request_id"], x["text"], y["text"])
        assert x["finish_reason"] == y["finish_reason"]
        assert x["usage"]["completion_tokens"] == y["usage"]["completion_tokens"]
        assert x["usage"]["completion_tokens"] >= 1
done = [x for x in a if x["type"] == "done"]
assert len(done) == 24, len(done)
assert any(x["finish_reason"] == "stop_sequence" for x in done)
assert all(". " not in x["text"] for x in done if x["finish_reason"] == "stop_sequence")
assert sum(1 for x in done if "logprobs" in x) == 4
codes = {x["request_id"]: x["code"] for x in a if x["type"] == "error"}
assert codes == {"line-25": "invalid_job", "bad-1": "invalid_job", "long-1": "prompt_too_long"}, codes
print("batch invariance: 24 jobs identical at --max-batch-size 1 and 16")
PY

# prefix caching: 32 jobs sharing a ~200-token prefix
python3 - "$tmp/prefix.jsonl" <<'PY'
import json, sys
prefix = "Once upon a time there was a little girl named Lily. " * 12
with open(sys.argv[1], "w") as f:
    for i in range(32):
        f.write(json.dumps({"request_id": f"p{i}", "prompt": prefix + f" Story {i}:",
                            "max_tokens": 4, "temperature": 0}) + "\n")
PY
"$bin/kgen" batch --model "$model" --input "$tmp/prefix.jsonl" --output "$tmp/p-on.jsonl" --max-batch-size 8 --ctx 256 --threads 2
"$bin/kgen" batch --model "$model" --input "$tmp/prefix.jsonl" --output "$tmp/p-off.jsonl" --max-batch-size 8 --ctx 256 --threads 2 --prefix-cache false
python3 - "$tmp/p-on.jsonl" "$tmp/p-off.jsonl" <<'PY'
import json, sys
on = [json.loads(l) for l in open(sys.argv[1])]
off = [json.loads(l) for l in open(sys.argv[2])]
assert all(x["type"] == "done" for x in on + off)
prompt = sum(x["usage"]["prompt_tokens"] for x in on)
cached_on = sum(x["usage"]["cached_tokens"] for x in on)
cached_off = sum(x["usage"]["cached_tokens"] for x in off)
assert cached_off == 0, cached_off
assert [x["text"] for x in on] == [x["text"] for x in off]
print(f"prefix cache: {prompt} prompt tokens, {cached_on} served from the cache, "
      f"{prompt - cached_on} prefilled (without the cache: {prompt})")
assert cached_on > prompt // 2, (cached_on, prompt)
PY

# bert, an encoder: embed, rerank and score jobs answered (unit vectors, scores in (0, 1),
# best first), a generation job and an input longer than a step answered with errors that
# say why, an OpenAI /v1/embeddings line; the same vectors with steps of 512 and of 64 tokens
# (inputs run whole in either)
"$bin/kgen" mkmodel --arch bert --out "$tmp/bert.gguf" --n-embd 64 --n-layer 2 --n-head 4 \
    --n-head-kv 4 --n-ff 128 --ctx 512 --pooling mean --rerank --seed 7 >/dev/null
cat >"$tmp/bert.jsonl" <<'J'
{"request_id": "be", "task": "embed", "input": ["Once upon a time", "The little dog ran.", "hi"]}
{"request_id": "br", "task": "rerank", "query": "a dog", "documents": ["The little dog ran.", "stocks fell", "cats"], "top_n": 2}
{"request_id": "bs", "task": "score", "text_1": "a dog", "text_2": ["The little dog ran.", "cats"]}
{"request_id": "bg", "prompt": "Once upon a time", "max_tokens": 4}
{"request_id": "bl", "task": "embed", "input": "one two three four five six seven"}
{"custom_id": "oe", "method": "POST", "url": "/v1/embeddings", "body": {"input": ["Once upon a time"], "model": "bert"}}
J
"$bin/kgen" batch --model "$tmp/bert.gguf" --input "$tmp/bert.jsonl" --output "$tmp/bert512.jsonl" --threads 2
"$bin/kgen" batch --model "$tmp/bert.gguf" --input "$tmp/bert.jsonl" --output "$tmp/bert64.jsonl" --threads 2 \
    --max-batch-size 4 --max-batch-tokens 64
python3 - "$tmp/bert512.jsonl" "$tmp/bert64.jsonl" <<'PY'
import json, math, sys
a = {x["request_id"]: x for x in map(json.loads, open(sys.argv[1]))}
b = {x["request_id"]: x for x in map(json.loads, open(sys.argv[2]))}
e = a["be"]
assert e["type"] == "done" and len(e["embeddings"]) == 3, e
assert all(abs(math.sqrt(sum(v * v for v in vec)) - 1) < 1e-5 for vec in e["embeddings"])
assert e["embeddings"] == b["be"]["embeddings"], "vectors differ with smaller steps"
r = a["br"]["results"]
assert len(r) == 2 and r[0]["relevance_score"] >= r[1]["relevance_score"], r
assert all(0 < x["relevance_score"] < 1 for x in r) and r == b["br"]["results"]
assert [x["index"] for x in a["bs"]["results"]] == [0, 1]
g = a["bg"]
assert g["type"] == "error" and g["code"] == "invalid_job" and "encoder" in g["message"], g
assert a["bl"]["type"] == "done" and a["bl"]["usage"]["prompt_tokens"] > 16
assert b["bl"]["embeddings"] == a["bl"]["embeddings"]
assert a["oe"]["type"] == "done" and len(a["oe"]["embeddings"]) == 1
print("bert: embed, rerank and score answered; generation refused:", g["message"])
PY
"$bin/kgen" batch --model "$tmp/bert.gguf" --input "$tmp/bert.jsonl" --output "$tmp/bert8.jsonl" --threads 2 \
    --max-batch-size 4 --max-batch-tokens 16
python3 - "$tmp/bert8.jsonl" <<'PY'
import json, sys
a = {x.get("request_id"): x for x in map(json.loads, open(sys.argv[1]))}
l = a["bl"]  # longer than a step of 16: it could only run cut, which an encoder cannot
assert l["type"] == "error" and l["code"] == "prompt_too_long", l
print("bert: an input longer than a step:", l["message"])
PY

# gemma-embedding (EmbeddingGemma's graph: non-causal, mean pooling, dense projections): the
# embed lines answered with unit vectors equal, up to the norm, to llama.cpp's for the
# tests/data/embed gemma-embd model (its golden), the same with steps of 64 tokens, a
# /v1/embeddings line cut to 16 dimensions, generation refused
ge_args=$(awk -F'\t' '$1 == "gemma-embd" {print $2}' "$KG_DATA_DIR/embed/models.tsv")
# shellcheck disable=SC2086 # the row's arguments, split as the golden script splits them
"$bin/kgen" mkmodel --out "$tmp/ge.gguf" $ge_args >/dev/null
cat >"$tmp/ge.jsonl" <<'J'
{"request_id": "ge", "task": "embed", "input": ["Once upon a time", "The engine keeps the keys and values of each sequence in blocks of sixteen positions.", "hello"]}
{"request_id": "gg", "prompt": "Once upon a time", "max_tokens": 4}
{"custom_id": "oe", "method": "POST", "url": "/v1/embeddings", "body": {"input": ["hello"], "model": "ge", "dimensions": 16}}
J
"$bin/kgen" batch --model "$tmp/ge.gguf" --input "$tmp/ge.jsonl" --output "$tmp/ge512.jsonl" --threads 2
"$bin/kgen" batch --model "$tmp/ge.gguf" --input "$tmp/ge.jsonl" --output "$tmp/ge64.jsonl" --threads 2 \
    --max-batch-size 4 --max-batch-tokens 64
python3 - "$tmp/ge512.jsonl" "$tmp/ge64.jsonl" "$KG_DATA_DIR/embed/gemma-embd.f32.golden" <<'PY'
import json, math, sys
a = {x.get("request_id"): x for x in map(json.loads, open(sys.argv[1]))}
b = {x.get("request_id"): x for x in map(json.loads, open(sys.argv[2]))}
want = {int(r[1]): [float(v) for v in r[3:]]
        for r in (l.split() for l in open(sys.argv[3])) if r and r[0] == "vec"}
def cos(x, y):
    return sum(p * q for p, q in zip(x, y)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))
e = a["ge"]
assert e["type"] == "done" and len(e["embeddings"]) == 3, e
assert all(abs(math.sqrt(sum(v * v for v in vec)) - 1) < 1e-5 for vec in e["embeddings"])
c = [cos(e["embeddings"][i], want[i]) for i in range(3)]
assert min(c) >= 0.9999, c
assert e["embeddings"] == b["ge"]["embeddings"], "vectors differ with smaller steps"
g = a["gg"]
assert g["type"] == "error" and g["code"] == "invalid_job" and "embedding model" in g["message"], g
o = a["oe"]
assert o["type"] == "done" and len(o["embeddings"]) == 1 and len(o["embeddings"][0]) == 16, o
print(f"gemma-embedding: cosine with llama.cpp {min(c):.7f}; generation refused:", g["message"])
PY
