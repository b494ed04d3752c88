#!/usr/bin/env python3
"""gemma4-vocab-mini.py: a small Gemma 4 vocabulary for the tokenizer tests, cut from llama.cpp's
models/ggml-vocab-gemma-4.gguf (15.8 MB: 262,144 tokens, 514,906 merges) so that the repository
carries 1% of it, and its test vectors made by llama.cpp's own tokenizer on the cut file.

Gemma 4 tokenizes as SentencePiece-style BPE (spaces written U+2581, merges over raw UTF-8
characters, newline runs apart, <0xXX> byte fallback). The cut keeps, for the strings of the
.inp file: every merge llama.cpp's algorithm applies to them (found by running that algorithm,
lowest rank first, leftmost on ties, over the full merge list, and checked: its ids must equal
llama.cpp's .out for the full vocabulary), every token those merges make or the strings end
in, every single character the strings hold, and every byte, control and user-defined token.
A merge that is never applied to these strings cannot change their tokens (at each step the
applied merge is the lowest-ranked pair present, and dropping others leaves it lowest), so the
cut vocabulary tokenizes them as the full one does, through the id map; that is checked too,
against llama-tokenize on the cut file, whose output becomes the committed .out.

Usage (the llama.cpp source tree of node-llama-cpp 3.22.1's bundle, with llama-tokenize built):
  python3 scripts/goldens/gemma4-vocab-mini.py --llama /work/ref/llama.cpp \
      --out tests/data/tokenizer-vectors/ggml-vocab-gemma-4-mini.gguf
"""
import argparse
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--llama", required=True, help="llama.cpp source tree with build/bin/llama-tokenize")
ap.add_argument("--out", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(args.llama, "gguf-py"))
import gguf  # noqa: E402

full = os.path.join(args.llama, "models", "ggml-vocab-gemma-4.gguf")
r = gguf.GGUFReader(full)
f = r.fields
tokens = f["tokenizer.ggml.tokens"].contents()
scores = f["tokenizer.ggml.scores"].contents()
types = f["tokenizer.ggml.token_type"].contents()
merges = f["tokenizer.ggml.merges"].contents()
tok_id = {t: i for i, t in enumerate(tokens)}
rank = {}
for i, m in enumerate(merges):
    pos = m.find(" ", 1)
    rank.setdefault((m[:pos], m[pos + 1:]), i)

texts = open(full + ".inp", encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")
if texts and texts[-1] == "":
    texts.pop()
want_full = [line.split() for line in open(full + ".out").read().split("\n")[: len(texts)]]

CONTROL, USER, BYTE = 3, 4, 6
applied, made = set(), set()


def encode(text):
    """llama.cpp's llm_tokenizer_bpe_session for Gemma 4 (no special-token text in the .inp)."""
    text = text.replace(" ", "\u2581")
    ids = []
    # the pre-tokenizer: runs of newlines and runs of anything else
    pieces, cur = [], ""
    for ch in text:
        if cur and (ch == "\n") != (cur[-1] == "\n"):
            pieces.append(cur)
            cur = ""
        cur += ch
    if cur:
        pieces.append(cur)
    for p in pieces:
        if p.strip("\n") == "" and p in tok_id:
            ids.append(tok_id[p])
            made.add(p)
            continue
        sym = list(p)
        while True:
            best = None
            for i in range(len(sym) - 1):
                rk = rank.get((sym[i], sym[i + 1]))
                if rk is not None and (best is None or rk < best[0]):
                    best = (rk, i)
            if best is None:
                break
            i = best[1]
            applied.add(best[0])
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
            made.add(sym[i])
        for s in sym:
            if s in tok_id:
                ids.append(tok_id[s])
                made.add(s)
            else:
                for b in s.encode("utf-8"):
                    bt = f"<0x{b:02X}>"
                    if bt in tok_id:
                        ids.append(tok_id[bt])
    return ids


for t, w in zip(texts, want_full):
    got = [str(i) for i in encode(t)]
    if got != w:
        sys.exit(f"the simulation differs from llama.cpp's .out on {t!r}: {got} != {w}")
print(f"simulation equals llama.cpp on {len(texts)} strings; {len(applied)} merges applied")

keep = set(made)
for t in texts:
    keep.update(ch for ch in t.replace(" ", "\u2581") if ch in tok_id)
keep_ids = sorted({tok_id[k] for k in keep} | {i for i, ty in enumerate(types) if ty in (CONTROL, USER, BYTE)}
                  | {0, 1, 2, 3, 4})
new_id = {old: new for new, old in enumerate(keep_ids)}
kept_merges = [merges[i] for i in sorted(applied)]

w = gguf.GGUFWriter(args.out, "gemma4")
for k, fld in f.items():
    if k.startswith("GGUF.") or k.startswith("tokenizer.") or k == "general.architecture":
        continue
    v = fld.contents()
    vt = fld.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        continue
    w.add_key_value(k, v, vt)
w.add_string("general.description", "a cut of llama.cpp's ggml-vocab-gemma-4.gguf for kgen's tokenizer "
             "tests (scripts/goldens/gemma4-vocab-mini.py)")
w.add_tokenizer_model("gemma4")
w.add_token_list([tokens[i] for i in keep_ids])
w.add_token_scores([scores[i] for i in keep_ids])
w.add_token_types([types[i] for i in keep_ids])
w.add_token_merges(kept_merges)
for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id", "mask_token_id"):
    fk = "tokenizer.ggml." + key
    if fk in f:
        w.add_uint32(fk, new_id[f[fk].contents()])
for key in ("add_space_prefix", "add_bos_token"):
    fk = "tokenizer.ggml." + key
    if fk in f:
        w.add_bool(fk, f[fk].contents())
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

# llama.cpp on the cut file: the committed vectors, and equal to the full file's through the map
tool = os.path.join(args.llama, "build", "bin", "llama-tokenize")
out_lines = []
for t, wf in zip(texts, want_full):
    res = subprocess.run([tool, "-m", args.out, "--stdin", "--ids", "--no-bos", "--log-disable"],
                         input=t.encode("utf-8"), capture_output=True, check=True)
    ids = [int(x) for x in res.stdout.decode().strip().strip("[]").split(",") if x.strip()]
    if ids != [new_id[int(x)] for x in wf]:
        sys.exit(f"llama.cpp on the cut vocabulary differs on {t!r}: {ids}")
    out_lines.append(" ".join(str(i) for i in ids))
with open(args.out + ".inp", "w", encoding="utf-8", newline="") as fh:
    # llama.cpp's strings, each closed by the separator (as the other .inp files here are)
    fh.write("".join(t + "\n__ggml_vocab_test__\n" for t in texts))
with open(args.out + ".out", "w") as fh:
    fh.write("\n".join(out_lines) + "\n")
print(f"{args.out}: {len(keep_ids)} tokens, {len(kept_merges)} merges, {os.path.getsize(args.out)} bytes; "
      f"llama-tokenize on it equals the full vocabulary on all {len(texts)} strings")
