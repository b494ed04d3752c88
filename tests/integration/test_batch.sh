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
