// lora-goldens.mjs: llama.cpp's outputs for kgen's random-weight models
// with random LoRA adapters applied, written as golden files that
// tests/unit/check_lora.c compares kgen with (CI never needs node).
//
// For each case below the script writes the base with `kgen mkmodel` and
// each adapter with `kgen mkmodel --lora --base ...`, loads the base in
// llama.cpp through node-llama-cpp (CPU, flash attention off, context 512,
// one sequence) with the adapters on the context (createContext's
// lora.adapters, each with its scale) and records, as arch-goldens.mjs
// does, per prompt: the input ids, the logits after the prompt, up to
// N_GEN greedy ids with each step's runner-up and margin, and the logits
// after the last id. The files' FNV-1a 64 hashes are recorded, so a
// changed generator fails the test instead of comparing other weights.
//
// Usage (from the repository root):
//   node scripts/goldens/lora-goldens.mjs --nlc /work/ref/nlc/node_modules \
//        --kgen build/bin/kgen --out tests/data/lora [--only NAME]
import {execFileSync} from "node:child_process";
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const PROMPTS = [
    "Once upon a time",
    "The engine keeps the keys and values of each sequence in blocks of sixteen positions, and " +
        "blocks that hold the same prefix are shared between jobs.",
];
const N_GEN = 16;
const CONTEXT = 512;

const LLAMA = "--arch llama --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 128 --ctx 512 --seed 21";
const QWEN3 = "--arch qwen3 --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 128 " +
              "--ctx 512 --rope-base 1000000 --seed 22";
const F16_R8 = "--rank 8 --alpha 16 --type f16 --seed 31";
const Q8_R32 = "--rank 32 --type q8_0 --seed 32";
const F32_QKV = "--rank 4 --type f32 --targets q,v,down --seed 33";
// apertus: an up, xIELU, down FFN (no gate): its up and down pairs adapted too
const APERTUS = "--arch apertus --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --ctx 512 " +
                "--rope-base 12000000 --seed 23";
// name, base args (with its type), adapters [mklora args, scale]; `type`
// picks check_lora's NMSE bound (the least precise of base and adapters)
const CASES = [
    {name: "llama-f16-lora-f16", type: "f16", base: `${LLAMA} --type f16`, loras: [[F16_R8, 1.0]]},
    {name: "llama-f16-lora-q8_0-half", type: "q8_0", base: `${LLAMA} --type f16`, loras: [[Q8_R32, 0.5]]},
    {name: "llama-f32-two", type: "q8_0", base: `${LLAMA} --type f32`, loras: [[F16_R8, 1.0], [Q8_R32, 0.5]]},
    {name: "qwen3-f16-lora-f16-half", type: "f16", base: `${QWEN3} --type f16`, loras: [[F16_R8, 0.5]]},
    {name: "qwen3-q8_0-lora-q8_0", type: "q8_0", base: `${QWEN3} --type q8_0`, loras: [[Q8_R32, 1.0]]},
    {name: "qwen3-f32-two", type: "q8_0", base: `${QWEN3} --type f32`,
     loras: [[F32_QKV, 1.0], [Q8_R32, 0.5]]},
    {name: "apertus-f32-lora-f16", type: "f16", base: `${APERTUS} --type f32`, loras: [[F16_R8, 1.0]]},
];

function arg(name, def) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const nlc = arg("--nlc", process.env.NLC_MODULES);
const kgen = arg("--kgen", "build/bin/kgen");
const outDir = arg("--out", "tests/data/lora");
const only = arg("--only", null);
if (!nlc) {
    console.error("usage: lora-goldens.mjs --nlc NODE_MODULES [--kgen BIN] [--out DIR]");
    process.exit(2);
}

const {getLlama} = await import(pathToFileURL(join(nlc, "node-llama-cpp/dist/index.js")).href);
const nlcVersion = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/package.json"), "utf8")).version;
const llamaTag = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/llama/llama.cpp.info.json"), "utf8")).tag;

function fnv64(buf) {
    let h = 0xcbf29ce484222325n;
    for (const b of buf) {
        h ^= BigInt(b);
        h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
    }
    return h.toString(16).padStart(16, "0");
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const tmp = mkdtempSync(join(tmpdir(), "kgen-lora-goldens-"));
const date = new Date().toISOString().slice(0, 10);
const provenance =
    `node-llama-cpp ${nlcVersion} (llama.cpp ${llamaTag} prebuilt, CPU, flash attention off, ` +
    `context ${CONTEXT}, one sequence, LoRA adapters on the context), made by ` +
    `scripts/goldens/lora-goldens.mjs on ${date}`;

const toArray = (map) => {
    const a = new Array(map.size);
    for (const [t, v] of map) {
        a[t] = v;
    }
    return a;
};

try {
    for (const c of CASES.filter((c) => !only || c.name === only)) {
        const basePath = join(tmp, `${c.name}.gguf`);
        execFileSync(kgen, ["mkmodel", "--out", basePath, ...c.base.split(" ")], {stdio: "ignore"});
        const lines = [`# ${provenance}`, `case ${c.name} ${c.type}`, `base fnv64 ${fnv64(readFileSync(basePath))} ${c.base}`];
        const adapters = [];
        for (let i = 0; i < c.loras.length; i++) {
            const [args, scale] = c.loras[i];
            const p = join(tmp, `${c.name}.lora${i}.gguf`);
            execFileSync(kgen, ["mkmodel", "--lora", "--base", basePath, "--out", p, ...args.split(" ")],
                         {stdio: "ignore"});
            adapters.push({filePath: p, scale});
            lines.push(`lora ${scale} fnv64 ${fnv64(readFileSync(p))} ${args}`);
        }
        const model = await llama.loadModel({modelPath: basePath});
        const isEog = (t) => model._model.isEogToken(t);
        for (let p = 0; p < PROMPTS.length; p++) {
            const input = [
                ...(model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : []),
                ...model.tokenize(PROMPTS[p]),
            ];
            const ctx = await model.createContext({contextSize: CONTEXT, flashAttention: false, threads: 2,
                                                   lora: {adapters}});
            const seq = ctx.getSequence();
            let res = await seq.controlledEvaluate([
                ...input.slice(0, -1),
                [input[input.length - 1], {generateNext: {logits: true}}],
            ]);
            let lg = toArray(res[res.length - 1].next.logits);
            const logits = lg;
            const ids = [], tops = [];
            for (let k = 0; k < N_GEN; k++) {
                let t1 = 0, t2 = -1;
                for (let v = 1; v < lg.length; v++) {
                    if (lg[v] > lg[t1]) {
                        t2 = t1;
                        t1 = v;
                    } else if (t2 < 0 || lg[v] > lg[t2]) {
                        t2 = v;
                    }
                }
                if (isEog(t1)) {
                    break;
                }
                ids.push(t1);
                tops.push(`${t2}:${(lg[t1] - lg[t2]).toPrecision(4)}`);
                res = await seq.controlledEvaluate([[t1, {generateNext: {logits: true}}]]);
                lg = toArray(res[res.length - 1].next.logits);
            }
            const lend = lg;
            await ctx.dispose();
            const fmt = (a) => `${a.length} ${a.map((v) => Number(v).toPrecision(9)).join(" ")}`;
            lines.push(`prompt ${p} ${JSON.stringify(PROMPTS[p])}`);
            lines.push(`input ${p} ${input.join(" ")}`);
            lines.push(`ids ${p} ${ids.join(" ")}`);
            lines.push(`second ${p} ${tops.join(" ")}`);
            lines.push(`logits ${p} ${fmt(logits)}`);
            lines.push(`logits_end ${p} ${fmt(lend)}`);
        }
        await model.dispose();
        writeFileSync(join(outDir, `${c.name}.golden`), lines.join("\n") + "\n");
        console.log(`${c.name}: done`);
    }
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
