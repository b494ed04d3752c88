// llama.cpp's constrained decoding on the same GGUF, for the README's
// side-by-side with `kgen-bench --json-schema`: node-llama-cpp (3.22.1, the
// prebuilt llama.cpp, CPU) with createGrammarForJsonSchema, greedy. Like
// kgen-bench, each of B sequences first runs under the grammar (up to TG
// tokens), then the same prompt runs unconstrained for exactly as many
// tokens; the TG-phase times give the constrained/unconstrained ratio, by
// the wall clock and by CPU time (steadier on a shared machine).
//
// usage: NODE_MODULES=/path/to/node_modules \
//   node llamacpp-structured.mjs MODEL.gguf SCHEMA.json [B=1] [TG=64] [PP=32] [REPS=3] [THREADS=2]
import {readFileSync} from "node:fs";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const nm = process.env.NODE_MODULES;
if (!nm) {
    console.error("set NODE_MODULES to the node_modules folder holding node-llama-cpp");
    process.exit(2);
}
const {getLlama, LlamaGrammarEvaluationState} =
    await import(pathToFileURL(join(nm, "node-llama-cpp/dist/index.js")).href);

const [modelPath, schemaPath, bArg, tgArg, ppArg, repsArg, thArg] = process.argv.slice(2);
const B = Number(bArg ?? 1), TG = Number(tgArg ?? 64), PP = Number(ppArg ?? 32);
const REPS = Number(repsArg ?? 3), THREADS = Number(thArg ?? 2);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
const grammar = await llama.createGrammarForJsonSchema(schema);
const ctx = await model.createContext({sequences: B, contextSize: B * (PP + TG + 8), threads: THREADS,
                                       batchSize: Math.max(512, B * PP)});
const n_vocab = model.fileInfo.metadata.llama?.vocab_size ?? model.tokens?.length;

// random prompts, as kgen-bench makes them (ids that are not special)
let s = 12345n;
function rnd() { s = (s * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n); return Number(s >> 33n); }
const prompts = [];
for (let b = 0; b < B; b++) {
    const p = [model.tokens.bos];
    while (p.length < PP) { const t = 3 + 256 + (rnd() % (Number(n_vocab ?? 151936) - 259)); p.push(t); }
    prompts.push(p);
}

// one sequence per prompt, reused by every pass (cleared in between)
const seqs = prompts.map(() => ctx.getSequence());

async function run(seqIndex, prompt, maxTokens, useGrammar, marks) {
    const seq = seqs[seqIndex];
    const opts = {temperature: 0};
    if (useGrammar) opts.grammarEvaluationState = new LlamaGrammarEvaluationState({model, grammar});
    let n = 0;
    for await (const t of seq.evaluate(prompt, opts)) {
        if (n === 0) {
            marks.first.push(performance.now());
            if (marks.first.length === B) marks.cpu0 = process.cpuUsage();
        }
        n++;
        if (n >= maxTokens || model.isEogToken?.(t)) break;
    }
    await seq.clearHistory();
    return n;
}

async function pass(useGrammar, counts) {
    const marks = {first: []};
    const t0 = performance.now();
    const made = await Promise.all(prompts.map((p, i) => run(i, p, useGrammar ? TG + 1 : counts[i], useGrammar, marks)));
    const t1 = performance.now();
    const cpu = process.cpuUsage(marks.cpu0);
    const tFirst = Math.max(...marks.first);
    return {made, tg: (t1 - tFirst) / 1000, cpu: (cpu.user + cpu.system) / 1e6};
}

const ratios = [], tcs = [], tus = [], ccs = [], cus = [];
let made = null;
for (let r = 0; r < REPS; r++) {
    const con = await pass(true, null);
    made = con.made;
    const unc = await pass(false, made);
    tcs.push(con.tg); tus.push(unc.tg); ratios.push(unc.tg / con.tg);
    ccs.push(con.cpu); cus.push(unc.cpu);
}
const med = (v) => { const a = [...v].sort((x, y) => x - y); return a.length % 2 ? a[(a.length - 1) / 2] : (a[a.length / 2 - 1] + a[a.length / 2]) / 2; };
const tokens = made.reduce((a, b) => a + b, 0);
console.log(JSON.stringify({B, tokens, t_tg_con: med(tcs), t_tg_unc: med(tus),
                            s_tg_con: (tokens - B) / med(tcs), s_tg_unc: (tokens - B) / med(tus),
                            con_over_unc: med(tus) / med(tcs), con_over_unc_cpu: med(cus) / med(ccs),
                            ratios}));
process.exit(0);
