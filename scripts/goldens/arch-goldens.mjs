// arch-goldens.mjs: llama.cpp's outputs for kgen's random-weight models of
// every supported architecture, written as golden files that
// tests/unit/check_arch.c compares kgen with (CI never needs node).
//
// For each model of tests/data/arch/models.tsv and each weight type asked
// for, the script writes the model with `kgen mkmodel`, loads it in
// llama.cpp through node-llama-cpp (CPU, flash attention off, context 512,
// one sequence) and records, for each prompt: the input ids (BOS as the
// vocabulary asks, then model.tokenize(prompt)), the logits of the last
// prompt position, up to N_GEN greedy ids (the first maximum of each
// step's logits, one token per controlledEvaluate step, stopping at an
// end-of-generation token as evaluate() does), each step's runner-up and
// its logit margin, and the logits after the last id. It also records the tokenization of a set of test
// strings with each family's built-in vocabulary, with and without special
// token parsing.
//
// Usage (from the repository root; see tests/data/arch/README.md):
//   node scripts/goldens/arch-goldens.mjs --nlc /path/to/node_modules \
//        --kgen build/bin/kgen --out tests/data/arch --types f32,f16,q8_0 \
//        [--models qwen3moe,gpt-oss]
// --models limits the run to those names of models.tsv (default: all).
// A weight type is passed to kgen mkmodel as --type NAME when its --help
// lists --type, else as --NAME (the flags of this branch).
import {execFileSync} from "node:child_process";
import {createHash} from "node:crypto";
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const PROMPTS = [
    "Once upon a time",
    "The engine keeps the keys and values of each sequence in blocks of sixteen positions, and " +
        "blocks that hold the same prefix are shared between jobs. When the queue is empty, it " +
        "waits; when it is full, it pauses. Numbers like 3.14 and 42 appear here too.",
];
// A third prompt for the families named here: a multi-turn chat (system, user, assistant, user)
// in the family's real template, as llama.cpp's own chat code renders it (the "multi_turn" case
// of tests/data/chat/jinja/goldens.json, made by scripts/goldens/jinja-goldens.sh), tokenized
// with special tokens parsed, as a chat job's prompt is. A leading BOS text is left out: the
// input starts with the BOS id as the other prompts do.
const CHAT_TEMPLATES = {
    "lfm2": "LFM2.5-Instruct.jinja",
    "lfm2-swa": "LFM2.5-Instruct.jinja",
    "qwen35": "Qwen3.5-4B.jinja",
    "qwen35moe": "Qwen3.5-4B.jinja",
    "qwen3next": "Qwen3.5-4B.jinja",
    "qwen35-wide": "Qwen3.5-4B.jinja",
    "granitehybrid": "ibm-granite-granite-4.0.jinja",
    "granitehybrid-moe": "ibm-granite-granite-4.0.jinja",
    "nemotron_h": "NVIDIA-Nemotron-Nano-v2.jinja",
    "nemotron_h_moe": "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "lfm2moe": "LFM2-8B-A1B.jinja",
};
// Families whose real template is not among llama.cpp's models/templates (so not in
// goldens.json): the same multi_turn conversation rendered from the model file's own
// tokenizer.chat_template (its models.tsv row writes one) by @huggingface/jinja
// (transformers' Jinja engine in JavaScript, a node-llama-cpp dependency), with goldens.json's
// multi_turn context; kgen's render of it is checked against this text by check_arch's input.
const CHAT_FROM_FILE = {
    "llama4": "meta-llama Llama-4-Scout-17B-16E-Instruct (kgen mkmodel --chat-template llama4)",
};
const CHAT_CASE = "multi_turn";
// Models whose second prompt is long: PROMPTS[1] repeated (joined by a space) until it passes
// `tokens` ids, run in a context of `context` (written as a `context` line). llama4's chunked
// attention has chunks of 8192 and its NoPE layers' temperature steps at position 8191, both
// fixed in llama.cpp's code, so only a prompt past 8192 positions crosses them.
const LONG = {"llama4-long": {tokens: 8300, context: 8704}};
const N_GEN = 24;
const CONTEXT = 512;

// Strings for the tokenizer goldens (one per line in the file: JSON-escaped).
const TOKENIZER_TEXTS = [
    "", " ", "  ", "Hello world", " Hello world", "Hello  world  ", "hello\nworld", "a\n\nb\t c",
    "The quick brown fox jumps over the lazy dog.", "tokenizer, generation and attention!",
    "3.14159 and 1234567 apples", "don't can't I'll we're", "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "emoji \ud83d\ude42 ok", "   leading and trailing   ",
    "<|im_start|>user\nhi<|im_end|>", "<start_of_turn>model\nyes<end_of_turn>",
    "<|user|>\nQuestion?<|end|>\n<|assistant|>", "<s>[INST] x [/INST]", "UPPER lower MiXeD 99bottles",
    "ab\u0301c \u00a0nbsp", "x=1;y=2;print(x+y)",
];
const TOKENIZER_MODELS = ["llama", "qwen2", "gemma2", "phi3", "gpt-oss", "glm4moe", "deepseek2", "qwen35",
                          "llama4"];

function arg(name, def) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const nlc = arg("--nlc", process.env.NLC_MODULES);
const kgen = arg("--kgen", "build/bin/kgen");
const outDir = arg("--out", "tests/data/arch");
const types = arg("--types", "f32,f16,q8_0").split(",").filter(Boolean);
const only = arg("--models", "").split(",").filter(Boolean);
if (!nlc) {
    console.error("usage: arch-goldens.mjs --nlc NODE_MODULES [--kgen BIN] [--out DIR] [--types LIST] " +
                  "[--models LIST]");
    process.exit(2);
}

const {getLlama} = await import(pathToFileURL(join(nlc, "node-llama-cpp/dist/index.js")).href);
const nlcVersion = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/package.json"), "utf8")).version;
const llamaTag = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/llama/llama.cpp.info.json"), "utf8")).tag;

const kgenHelp = execFileSync(kgen, ["mkmodel", "--help"], {encoding: "utf8"});
const typeFlag = (t) => (kgenHelp.includes("--type") ? ["--type", t] : ["--" + t]);

// FNV-1a 64 of the model file: check_arch recomputes it, so a golden made
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
for (const name of only) {
    if (!models.some((m) => m.name === name)) {
        console.error(`arch-goldens.mjs: no model '${name}' in models.tsv`);
        process.exit(2);
    }
}

const jinjaGoldens = JSON.parse(readFileSync("tests/data/chat/jinja/goldens.json", "utf8"));
const {Template} = await import(pathToFileURL(join(nlc, "@huggingface/jinja/dist/index.js")).href);
function chatPrompt(name, model) {
    if (CHAT_FROM_FILE[name]) {
        const c = jinjaGoldens.cases.find((x) => x.case === CHAT_CASE && x.output != null);
        const ctx = jinjaGoldens.contexts[c.context];
        const text = model.fileInfo.metadata.tokenizer.chat_template;
        const out = new Template(text).render({...ctx});
        return out.startsWith(ctx.bos_token) ? out.slice(ctx.bos_token.length) : out;
    }
    const tmpl = CHAT_TEMPLATES[name];
    if (!tmpl) {
        return null;
    }
    const c = jinjaGoldens.cases.find((x) => x.template === tmpl && x.case === CHAT_CASE && x.output != null);
    if (!c) {
        console.error(`arch-goldens.mjs: no ${CHAT_CASE} render of ${tmpl} in goldens.json`);
        process.exit(2);
    }
    return c.output.replace(/^<s>/, "");
}

function longPrompt(model, tokens) {
    let text = PROMPTS[1];
    while (model.tokenize(text).length <= tokens) {
        text += " " + PROMPTS[1];
    }
    return text;
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const tmp = mkdtempSync(join(tmpdir(), "kgen-goldens-"));
const date = new Date().toISOString().slice(0, 10);
const provenance =
    `node-llama-cpp ${nlcVersion} (llama.cpp ${llamaTag} prebuilt, CPU, flash attention off, ` +
    `context ${CONTEXT}, one sequence), made by scripts/goldens/arch-goldens.mjs on ${date}`;

try {
    for (const m of models) {
        for (const type of types) {
            const path = join(tmp, `${m.name}.${type}.gguf`);
            const mkArgs = [...m.args, ...typeFlag(type)];
            execFileSync(kgen, ["mkmodel", "--out", path, ...mkArgs], {stdio: "ignore"});
            const model = await llama.loadModel({modelPath: path});
            // llama.cpp's end-of-generation set (llama_vocab_is_eog). The
            // public model.isEogToken also counts node-llama-cpp's EOT token,
            // which for a Harmony vocabulary (gpt-oss) is <|end|>: llama.cpp
            // ends a message there, not the generation.
            const isEog = (t) => model._model.isEogToken(t);
            const lines = [
                `# ${provenance}`,
                `# kgen mkmodel ${mkArgs.join(" ")}`,
                `model ${m.name} ${type} fnv64 ${fnv64(readFileSync(path))}`,
            ];
            const chat = chatPrompt(m.name, model);
            const long = LONG[m.name];
            const prompts = long ? [PROMPTS[0], longPrompt(model, long.tokens)]
                            : chat == null ? PROMPTS : [...PROMPTS, chat];
            if (long) {
                lines.push(`context ${long.context}`);
            }
            for (let p = 0; p < prompts.length; p++) {
                const special = p >= PROMPTS.length; // the chat prompt: special tokens parsed
                const input = [
                    ...(model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : []),
                    ...model.tokenize(prompts[p], special),
                ];
                // greedy, one token per step: the logits after the prompt,
                // each step's top two (so a divergence can be told from a
                // near-tie), and the logits after the last id
                const ctx = await model.createContext({contextSize: long ? long.context : CONTEXT,
                                                       flashAttention: false, threads: 2});
                const seq = ctx.getSequence();
                const toArray = (map) => {
                    const a = new Array(map.size);
                    for (const [t, v] of map) {
                        a[t] = v;
                    }
                    return a;
                };
                let res = await seq.controlledEvaluate([
                    ...input.slice(0, -1),
                    [input[input.length - 1], {generateNext: {logits: true}}],
                ]);
                let lg = toArray(res[res.length - 1].next.logits);
                const logits = lg;
                const ids = [], tops = [];
                for (let k = 0; k < N_GEN; k++) {
                    // llama.cpp's greedy sampler: the first maximum
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
                lines.push(`prompt ${p} ${JSON.stringify(prompts[p])}`);
                if (special) {
                    lines.push(`special ${p} ${CHAT_TEMPLATES[m.name] ?? CHAT_FROM_FILE[m.name]} ${CHAT_CASE}`);
                }
                lines.push(`input ${p} ${input.join(" ")}`);
                lines.push(`ids ${p} ${ids.join(" ")}`);
                lines.push(`second ${p} ${tops.join(" ")}`);
                const fmt = (a) => `${a.length} ${a.map((v) => Number(v).toPrecision(9)).join(" ")}`;
                lines.push(`logits ${p} ${fmt(logits)}`);
                lines.push(`logits_end ${p} ${fmt(lend)}`);
            }
            if (type === types[0] && TOKENIZER_MODELS.includes(m.name)) {
                const tl = [`# ${provenance}`, `# the built-in vocabulary of: kgen mkmodel ${m.args.join(" ")}`,
                            `# text (JSON), then the ids of model.tokenize(text) and of tokenize(text, true)`];
                const n_vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
                const eog = [];
                for (let t = 0; t < n_vocab; t++) {
                    if (isEog(t)) {
                        eog.push(t);
                    }
                }
                tl.push(`eog ${eog.join(" ")}`);
                tl.push(`bos ${model.tokens.bos ?? -1} add_bos ${model.tokens.shouldPrependBosToken ? 1 : 0}`);
                for (const text of TOKENIZER_TEXTS) {
                    tl.push(`text ${JSON.stringify(text)}`);
                    tl.push(`plain ${model.tokenize(text).join(" ")}`);
                    tl.push(`special ${model.tokenize(text, true).join(" ")}`);
                }
                writeFileSync(join(outDir, `tokenizer-${m.name}.golden`), tl.join("\n") + "\n");
            }
            await model.dispose();
            writeFileSync(join(outDir, `${m.name}.${type}.golden`), lines.join("\n") + "\n");
            console.log(`${m.name} ${type}: done`);
        }
    }
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
