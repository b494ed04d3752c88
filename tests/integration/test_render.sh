#!/usr/bin/env bash
# kgen render: a chat job, an OpenAI body and an OpenAI Batch line become the prompt the model's
# own chat template gives (the Jinja engine); --ids are the ids of that prompt, as kgen tokenize
# gives them; a system message to a template without a system role joins the next message; a
# template that raises ends with invalid_job and its message; a model without a
# template answers unsupported_chat_template; a text prompt prints as is. No broker (~1 s).
set -euo pipefail
bin="${KG_BIN_DIR:?}"
stories="${KG_DATA_DIR:?}/models/stories260K.gguf"
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/render.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
for t in chatml gemma; do
    "$bin/kgen" mkmodel --n-embd 64 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 128 --seed 1 \
        --chat-template "$t" --out "$tmp/$t.gguf" >/dev/null
done

job='{"request_id": "r1", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}]}'
want=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
got=$(printf '%s' "$job" | "$bin/kgen" render --model "$tmp/chatml.gguf"; echo x)
[ "${got%x}" = "$want" ] || fail "chat job rendered as [${got%x}]"

body='{"model": "m", "messages": [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": "Hi"}], "max_tokens": 4}'
got=$(printf '%s' "$body" | "$bin/kgen" render --model "$tmp/chatml.gguf"; echo x)
[ "${got%x}" = "$want" ] || fail "OpenAI body rendered as [${got%x}]"
line="{\"custom_id\": \"c1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": $body}"
got=$(printf '%s' "$line" | "$bin/kgen" render --model "$tmp/chatml.gguf"; echo x)
[ "${got%x}" = "$want" ] || fail "OpenAI Batch line rendered as [${got%x}]"

ids=$(printf '%s' "$job" | "$bin/kgen" render --model "$tmp/chatml.gguf" --ids)
tok=$(printf '%s' "$want" | "$bin/kgen" tokenize --model "$tmp/chatml.gguf")
[ -n "$ids" ] && [ "$ids" = "$tok" ] || fail "--ids [$ids] differ from kgen tokenize [$tok]"

# gemma's template has no system role: the system text goes before the user's, as llama.cpp does
got=$(printf '%s' "$job" | "$bin/kgen" render --model "$tmp/gemma.gguf"; echo x)
[ "${got%x}" = $'<s><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n' ] ||
    fail "gemma with a system message rendered [${got%x}]"
twice='{"request_id": "r3", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}'
if printf '%s' "$twice" | "$bin/kgen" render --model "$tmp/gemma.gguf" 2>"$tmp/err"; then
    fail "gemma's template accepted two user turns in a row"
fi
grep -q "invalid_job: chat template: 1:[0-9]*: .*roles must alternate" "$tmp/err" ||
    fail "gemma: $(cat "$tmp/err")"
user='{"request_id": "r2", "messages": [{"role": "user", "content": "Hi"}]}'
got=$(printf '%s' "$user" | "$bin/kgen" render --model "$tmp/gemma.gguf"; echo x)
[ "${got%x}" = $'<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n' ] ||
    fail "gemma rendered [${got%x}]"

if printf '%s' "$job" | "$bin/kgen" render --model "$stories" 2>"$tmp/err"; then
    fail "a model without a template rendered a chat job"
fi
grep -q "unsupported_chat_template" "$tmp/err" || fail "stories260K: $(cat "$tmp/err")"
got=$(printf '%s' '{"request_id": "t", "prompt": "Once upon"}' | "$bin/kgen" render --model "$stories")
[ "$got" = "Once upon" ] || fail "text prompt printed as [$got]"
if printf '{bad' | "$bin/kgen" render --model "$stories" 2>"$tmp/err"; then
    fail "bad JSON accepted"
fi
grep -q "not a job" "$tmp/err" || fail "bad JSON: $(cat "$tmp/err")"
echo "render: ok"
