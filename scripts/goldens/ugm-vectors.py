#!/usr/bin/env python3
"""Make the SentencePiece-unigram ("t5", llama.cpp's UGM) tokenizer vectors
of tests/data/tokenizer-vectors from a real XLM-RoBERTa vocabulary.

The real vocabulary (llama.cpp's models/ggml-vocab-nomic-bert-moe.gguf:
250,048 pieces, 6.8 MB) is too big to commit, so this writes a small one
that keeps every tokenizer.* key of the real file, its precompiled charsmap
byte for byte, its special and unused tokens, its lowest-scoring piece
(the unknown token's score is derived from it) and every piece that occurs
in the test strings (as written, NFKC-folded and with spaces as U+2581), in
the real order with the ids renumbered and the special-token ids remapped,
plus one made-up user-defined token ("\u2581kgen") to reach that path.

Then, with llama.cpp's llama-tokenize:
  X.inp          the test strings: the base .inp given (llama.cpp's own
                 set), then multilingual lines (CJK, accents, emoji, odd
                 whitespace, full-width and compatibility characters the
                 charsmap folds, invalid UTF-8, unknown characters);
  X.out          one line of ids per string (no BOS/EOS, no special parsing),
                 as test-tokenizer-0 writes them;
  X.out-special  the same with BOS/EOS added and special tokens parsed.
Every string is also tokenized with the real vocabulary and its pieces
compared with those of the small vocabulary without the made-up token (a
temporary file): the cut tokenizes these strings exactly as the real file
does, or the script fails. (The made-up token changes more than the strings
that hold it: llama.cpp passes through unnormalized any bytes that begin a
user-defined token, so a text starting with U+2581's first byte, as "①"
does, is not folded in the committed file.)

Usage (as run for the committed files):
  PYTHONPATH=/work/ref/llama.cpp/gguf-py python3 scripts/goldens/ugm-vectors.py \\
      --full /work/ref/llama.cpp/models/ggml-vocab-nomic-bert-moe.gguf \\
      --base tests/data/tokenizer-vectors/ggml-vocab-phi-3.gguf.inp \\
      --tokenize /work/ref/llama.cpp/build/bin/llama-tokenize \\
      --out tests/data/tokenizer-vectors/ggml-vocab-xlm-r.gguf
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unicodedata

import gguf  # llama.cpp's gguf-py

SEP = b"\n__ggml_vocab_test__\n"
SP = "\u2581"

EXTRA = [
    "Ｈｅｌｌｏ　Ｗｏｒｌｄ！ ＡＢＣ１２３",
    "ﬁnance ﬂow ﬀ Ǆ",
    "Café naïve résumé",
    "Cafe\u0301 nai\u0308ve",
    "① ② ㍻ ℃ ㎏ ½ ™ Ⅻ",
    "東京は日本の首都です。",
    "北京欢迎你，世界！",
    "한국어 텍스트 ｶﾀｶﾅ",
    "Привет, мир! Straße STRASSE",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Γειά σου Κόσμε",
    "👍🏽 🇩🇪 👨\u200d👩\u200d👧 🧌🧌",
    "𓀀𓀁𓀂 x 𓀃",
    "a\u00a0b\u2003c\u3000d\u2009e",
    "tab\tand\nnewline\r\nend\u000b\u000c.",
    "   leading and trailing   ",
    "zero\u200bwidth soft\u00adhyphen",
    "kgen rocks \u2581kgen kgen",
    "<mask> and <s> or </s> [PAD250001]",
    "hello <mask>  world <s>x</s>",
    "ＨＥＬＬＯ\u3000\u3000ｗｏｒｌｄ",
]
# raw bytes: invalid UTF-8 (each bad byte reads as U+FFFD)
EXTRA_BYTES = [b"abc \xff\xfe def \xe3\x81 end", b"\xc3\x28 \xf0\x9f\x98"]


def field_str(r, key):
    f = r.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def read_full(path):
    r = gguf.GGUFReader(path)
    tf = r.fields["tokenizer.ggml.tokens"]
    toks = [bytes(tf.parts[i]).decode("utf-8") for i in tf.data]
    sf = r.fields["tokenizer.ggml.scores"]
    scores = [float(sf.parts[i][0]) for i in sf.data]
    yf = r.fields["tokenizer.ggml.token_type"]
    types = [int(yf.parts[i][0]) for i in yf.data]
    return r, toks, scores, types


def variants(s):
    out = set()
    for t in (s, unicodedata.normalize("NFKC", s)):
        out.add(SP + t.replace(" ", SP))
        out.add(SP + SP.join(t.split()))
    return out


def pick(toks, scores, types, strings):
    index = {t: i for i, t in enumerate(toks)}
    longest = max(len(t) for t in toks)
    keep = {i for i, ty in enumerate(types) if ty != 1}
    normal = [i for i, ty in enumerate(types) if ty == 1]
    keep.add(min(normal, key=lambda i: scores[i]))
    for s in strings:
        for v in variants(s):
            for a in range(len(v)):
                for b in range(a + 1, min(len(v), a + longest) + 1):
                    i = index.get(v[a:b])
                    if i is not None:
                        keep.add(i)
    return sorted(keep)


def write_small(r, toks, scores, types, ids, path, made_up=True):
    remap = {old: new for new, old in enumerate(ids)}
    w = gguf.GGUFWriter(path, field_str(r, "general.architecture"))
    skip = {
        "general.architecture",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
    }
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            elif sub == gguf.GGUFValueType.UINT8 or sub == gguf.GGUFValueType.INT8:
                val = bytes(f.parts[f.data[0]]) if len(f.data) == 1 else bytes(
                    int(f.parts[i][0]) & 0xFF for i in f.data)
            else:
                val = [f.parts[i][0].item() for i in f.data]
            if key == "tokenizer.ggml.precompiled_charsmap":
                w.add_precompiled_charsmap(val)
            else:
                w.add_key_value(key, val, vt, sub_type=sub)
            continue
        if vt == gguf.GGUFValueType.STRING:
            val = field_str(r, key)
        else:
            val = f.parts[f.data[0]][0].item()
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            val = remap[val]
        w.add_key_value(key, val, vt)
    extra = 1 if made_up else 0
    new_toks = [toks[i] for i in ids] + [SP + "kgen"][:extra]
    new_scores = [scores[i] for i in ids] + [0.0][:extra]
    new_types = [types[i] for i in ids] + [4][:extra]  # user-defined
    w.add_token_list(new_toks)
    w.add_token_scores(new_scores)
    w.add_token_types(new_types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return new_toks


def tokenize(exe, model, data, special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        name = f.name
    try:
        cmd = [exe, "-m", model, "-f", name, "--ids", "--no-escape", "--log-disable"]
        if not special:
            cmd += ["--no-bos", "--no-parse-special"]
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(name)
    line = out.strip().splitlines()[-1].strip()
    assert line.startswith("[") and line.endswith("]"), out
    return [int(x) for x in line[1:-1].split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    base = open(a.base, "rb").read()
    assert base.endswith(SEP)
    strings = base[: -len(SEP)].split(SEP)
    strings += [s.encode("utf-8") for s in EXTRA] + EXTRA_BYTES
    texts = [s.decode("utf-8", errors="replace") for s in strings]

    r, toks, scores, types = read_full(a.full)
    ids = pick(toks, scores, types, texts)
    small = write_small(r, toks, scores, types, ids, a.out)
    print(f"{a.out}: {len(small)} of {len(toks)} pieces", file=sys.stderr)
    plain_path = a.out + ".plain.tmp"
    plain = write_small(r, toks, scores, types, ids, plain_path, made_up=False)

    with open(a.out + ".inp", "wb") as f:
        for s in strings:
            f.write(s + SEP)
    bad = 0
    for suffix, special in ((".out", False), (".out-special", True)):
        with open(a.out + suffix, "w") as f:
            for k, s in enumerate(strings):
                got = tokenize(a.tokenize, a.out, s, special)
                cut = tokenize(a.tokenize, plain_path, s, special)
                full = tokenize(a.tokenize, a.full, s, special)
                if [plain[i] for i in cut] != [toks[i] for i in full]:
                    print(f"string {k}: the cut and the real vocabulary differ", file=sys.stderr)
                    bad += 1
                f.write("".join(f" {i}" for i in got) + "\n")
    os.unlink(plain_path)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
