// embed-goldens.mjs: llama.cpp's embeddings and rerank scores for kgen's
// random-weight models, written as golden files that
// tests/unit/check_embed.c compares kgen with (CI never needs node).
//
// For each model of tests/data/embed/models.tsv and each weight type, the
// script writes the model with `kgen mkmodel`, loads it in llama.cpp
// through node-llama-cpp (CPU, context 512) and records:
//   - embedding models: for each input text, the ids node-llama-cpp
//     evaluates (model.tokenize(text), then BOS/EOS as its embedding
//     context adds them) and the vector of
//     LlamaEmbeddingContext.getEmbeddingFor(ids): llama.cpp's pooled
//     embedding for the pooling the file names (<arch>.pooling_type), or the
//     last token's hidden state when it names none; not normalised;
//   - rerank models (kgen mkmodel --rerank): for a query and each document,
//     the ids LlamaRankingContext evaluates for the pair and the score of
//     rank(query, document) (llama.cpp's LLAMA_POOLING_TYPE_RANK: qwen3's
//     classification head over the last token, softmax, p of the first
//     label; bert's head over the CLS token, whose first logit
//     node-llama-cpp turns into a probability with a sigmoid); a model's
//     own query and documents where RERANK_TEXTS names it.
//
// Usage (from the repository root; see tests/data/embed/README.md):
//   node scripts/goldens/embed-goldens.mjs --nlc /path/to/node_modules \
//        --kgen build/bin/kgen --out tests/data/embed --types f32,f16,q8_0 [--models a,b]
import {execFileSync} from "node:child_process";
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const INPUTS = [
    "Once upon a time",
    "The engine keeps the keys and values of each sequence in blocks of sixteen positions.",
    "hello",
    "Numbers like 3.14 and 42, and a question?",
];
const QUERY = "what does the engine keep?";
const DOCUMENTS = [
    "The engine keeps the keys and values of each sequence in blocks.",
    "Once upon a time there was a queue.",
    "stocks fell",
];
// A reranker's own query and documents where the defaults do not suit:
// the XLM-RoBERTa vocabulary in tests/data (ggml-vocab-xlm-r.gguf) is a cut
// that holds only the pieces of its tokenizer test strings
// (scripts/goldens/ugm-vectors.py), which tokenize there as with the real
// vocabulary; its reranker ranks some of those.
const RERANK_TEXTS = {
    "xlmr-rerank": {
        query: "東京は日本の首都です。",
        documents: ["北京欢迎你，世界！", "Привет, мир! Straße STRASSE", "Café naïve résumé"],
    },
};
const CONTEXT = 512;

function arg(name, def) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const nlc = arg("--nlc", process.env.NLC_MODULES);
const kgen = arg("--kgen", "build/bin/kgen");
const outDir = arg("--out", "tests/data/embed");
const types = arg("--types", "f32,f16,q8_0").split(",").filter(Boolean);
// --models a,b: remake only these rows of models.tsv (the others' goldens stay as they are)
const only = arg("--models", "").split(",").filter(Boolean);
if (!nlc) {
    console.error("usage: embed-goldens.mjs --nlc NODE_MODULES [--kgen BIN] [--out DIR] [--types LIST]");
    process.exit(2);
}

const {getLlama} = await import(pathToFileURL(join(nlc, "node-llama-cpp/dist/index.js")).href);
const nlcVersion = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/package.json"), "utf8")).version;
const llamaTag = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/llama/llama.cpp.info.json"), "utf8")).tag;

// FNV-1a 64 of the model file: check_embed recomputes it, so a golden made
// from a different model (a changed generator) fails loudly.
function fnv64(buf) {
    let h = 0xcbf29ce484222325n;
    for (const b of buf) {
        h ^= BigInt(b);
        h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
    }
    return h.toString(16).padStart(16, "0");
}

const models = readFileSync(join(outDir, "models.tsv"), "utf8")
    .split("\n")
    .filter((l) => l.trim() && !l.startsWith("#"))
    .map((l) => {
        const [name, args] = l.split("\t");
        return {name, args: args.trim().split(/\s+/)};
    })
    .filter((m) => only.length === 0 || only.includes(m.name));

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const tmp = mkdtempSync(join(tmpdir(), "kgen-embed-goldens-"));
const date = new Date().toISOString().slice(0, 10);
const provenance =
    `node-llama-cpp ${nlcVersion} (llama.cpp ${llamaTag} prebuilt, CPU, context ${CONTEXT}), ` +
    `made by scripts/goldens/embed-goldens.mjs on ${date}`;
const fmt = (a) => `${a.length} ${Array.from(a, (v) => Number(v).toPrecision(9)).join(" ")}`;

try {
    for (const m of models) {
        const rerank = m.args.includes("--rerank");
        for (const type of types) {
            const path = join(tmp, `${m.name}.${type}.gguf`);
            const mkArgs = [...m.args, "--type", type];
            execFileSync(kgen, ["mkmodel", "--out", path, ...mkArgs], {stdio: "ignore"});
            const model = await llama.loadModel({modelPath: path});
            const lines = [
                `# ${provenance}`,
                `# kgen mkmodel ${mkArgs.join(" ")}`,
                `model ${m.name} ${type} fnv64 ${fnv64(readFileSync(path))}`,
            ];
            if (rerank) {
                const ctx = await model.createRankingContext({contextSize: CONTEXT, threads: 2});
                const {query, documents} = RERANK_TEXTS[m.name] ?? {query: QUERY, documents: DOCUMENTS};
                const q = model.tokenize(query, false, "trimLeadingSpace");
                lines.push(`query ${JSON.stringify(query)}`);
                for (let i = 0; i < documents.length; i++) {
                    const d = model.tokenize(documents[i], false, "trimLeadingSpace");
                    const ids = ctx._getEvaluationInput(q, d);
                    const score = await ctx.rank(query, documents[i]);
                    lines.push(`text ${i} ${JSON.stringify(documents[i])}`);
                    lines.push(`ids ${i} ${ids.join(" ")}`);
                    lines.push(`score ${i} ${Number(score).toPrecision(9)}`);
                }
                await ctx.dispose();
            } else {
                const ctx = await model.createEmbeddingContext({contextSize: CONTEXT, threads: 2});
                for (let i = 0; i < INPUTS.length; i++) {
                    const ids = model.tokenize(INPUTS[i]);
                    ctx._prepareInput(ids); // BOS/EOS as getEmbeddingFor adds them
                    const e = await ctx.getEmbeddingFor(ids.slice());
                    lines.push(`text ${i} ${JSON.stringify(INPUTS[i])}`);
                    lines.push(`ids ${i} ${ids.join(" ")}`);
                    lines.push(`vec ${i} ${fmt(e.vector)}`);
                }
                await ctx.dispose();
            }
            await model.dispose();
            writeFileSync(join(outDir, `${m.name}.${type}.golden`), lines.join("\n") + "\n");
            console.log(`${m.name} ${type}: done`);
        }
    }
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
