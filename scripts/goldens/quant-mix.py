#!/usr/bin/env python3
"""Goldens for `kgen mkmodel --type`: what llama-quantize writes.

For each test shape, `kgen mkmodel` writes an F32 model; llama-quantize then
quantizes it to every file type kgen writes (and --pure for the K types).
Each golden line lists a tensor of the result: its type and the FNV-1a 64
hash of its bytes. tests/unit/check_quant_mix.c writes the same files with
`kgen mkmodel --type T` and compares type and hash, tensor by tensor: the
mix policy and the quantizers must give llama-quantize's file exactly.

usage: scripts/goldens/quant-mix.py LLAMA_CPP_DIR [KGEN]
  LLAMA_CPP_DIR  a llama.cpp checkout with build/bin/llama-quantize and gguf-py
  KGEN           the kgen binary (default build/bin/kgen)
Writes tests/data/quant-mix/<shape>.txt.
"""
import os
import subprocess
import sys
import tempfile

# shape name -> mkmodel arguments (keep in sync with check_quant_mix.c)
SHAPES = {
    # rows of 256: every K type applies; GQA 4 and 8 layers exercise the rules
    "k256": "--n-embd 256 --n-layer 8 --n-head 4 --n-head-kv 1 --n-ff 512 --n-vocab 300 --seed 21",
    # rows of 96 and a tied head: the fallbacks to 32-blocks
    "r96tied": "--n-embd 96 --n-layer 4 --n-head 2 --n-head-kv 2 --n-ff 256 --n-vocab 280 "
               "--tied --seed 22",
}
FTYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
          "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"]
PURE = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS"]  # rows of 256 only


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def main():
    llama = os.path.abspath(sys.argv[1])
    kgen = sys.argv[2] if len(sys.argv) > 2 else "build/bin/kgen"
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    import types
    # gguf-py imports sentencepiece for its vocabulary helpers; the reader needs none
    sys.modules.setdefault("sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))
    from gguf import GGUFReader  # noqa: E402

    quantize = os.path.join(llama, "build", "bin", "llama-quantize")
    commit = subprocess.run(["git", "-C", llama, "log", "-1", "--format=%h %cs"],
                            capture_output=True, text=True).stdout.strip()
    out_dir = os.path.join("tests", "data", "quant-mix")
    with tempfile.TemporaryDirectory() as tmp:
        for shape, args in SHAPES.items():
            src = os.path.join(tmp, shape + "-f32.gguf")
            subprocess.run([kgen, "mkmodel", "--out", src] + args.split(), check=True,
                           stdout=subprocess.DEVNULL)
            lines = [f"# llama-quantize (llama.cpp {commit}) of `kgen mkmodel {args}`; "
                     f"made by scripts/goldens/quant-mix.py",
                     "# ftype pure tensor type fnv1a64"]
            pures = PURE if shape == "k256" else []
            for ft, pure in [(f, False) for f in FTYPES] + [(f, True) for f in pures]:
                dst = os.path.join(tmp, f"{shape}-{ft}.gguf")
                cmd = [quantize] + (["--pure"] if pure else []) + [src, dst, ft, "2"]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                for t in GGUFReader(dst).tensors:
                    lines.append(f"{ft.lower()} {int(pure)} {t.name} {t.tensor_type.name.lower()} "
                                 f"{fnv1a64(bytes(t.data.tobytes())):016x}")
                os.unlink(dst)
            with open(os.path.join(out_dir, shape + ".txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
            print(f"{shape}: {len(lines) - 2} tensors")


if __name__ == "__main__":
    main()
