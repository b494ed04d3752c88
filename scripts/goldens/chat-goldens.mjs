// chat-goldens.mjs: llama.cpp's rendering of chat templates (its built-in
// llama_chat_apply_template), as golden data for tests/unit/check_chat.c.
//
// It compiles scripts/goldens/chat-render.c, which loads node-llama-cpp's
// prebuilt libllama with dlopen, and runs it over every built-in template
// name llama.cpp lists and over the Jinja text of every template `kgen
// mkmodel --chat-template` writes (read back from a model file with
// node-llama-cpp's readGgufFileInfo), each over two conversations with and
// without the assistant prompt.
//
// Usage (from the repository root; see tests/data/chat/README.md):
//   node scripts/goldens/chat-goldens.mjs --nlc /path/to/node_modules \
//        --kgen build/bin/kgen --out tests/data/chat/llama-cpp-render.golden
import {execFileSync} from "node:child_process";
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

function arg(name, def) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const nlc = arg("--nlc", process.env.NLC_MODULES);
const kgen = arg("--kgen", "build/bin/kgen");
const out = arg("--out", "tests/data/chat/llama-cpp-render.golden");
if (!nlc) {
    console.error("usage: chat-goldens.mjs --nlc NODE_MODULES [--kgen BIN] [--out FILE]");
    process.exit(2);
}
const {readGgufFileInfo} = await import(pathToFileURL(join(nlc, "node-llama-cpp/dist/index.js")).href);
const nlcVersion = JSON.parse(readFileSync(join(nlc, "node-llama-cpp/package.json"), "utf8")).version;
const lib = join(nlc, "@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so");

const tmp = mkdtempSync(join(tmpdir(), "kgen-chat-"));
try {
    const bin = join(tmp, "chat-render");
    execFileSync("cc", ["-O1", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-o", bin,
                        "scripts/goldens/chat-render.c", "-ldl"]);
    const help = execFileSync(kgen, ["mkmodel", "--help"], {encoding: "utf8"});
    const names = help.match(/--chat-template T +tokenizer\.chat_template: ([^\n]+)\n +([^(\n]+)/);
    const list = (names[1] + " " + names[2]).replace(/ or /g, ", ").split(/[ ,]+/).filter(Boolean);
    const args = [lib];
    for (const name of list) {
        const model = join(tmp, `${name}.gguf`);
        execFileSync(kgen, ["mkmodel", "--out", model, "--n-embd", "32", "--n-layer", "1",
                            "--n-head", "2", "--n-head-kv", "2", "--n-ff", "32", "--seed", "1",
                            "--chat-template", name], {stdio: "ignore"});
        const info = await readGgufFileInfo(model);
        const file = join(tmp, `${name}.jinja`);
        writeFileSync(file, info.metadata.tokenizer.chat_template);
        args.push(`jinja:${name}=${file}`);
    }
    const rendered = execFileSync(bin, args, {encoding: "utf8"});
    const header =
        `# llama.cpp's llama_chat_apply_template (node-llama-cpp ${nlcVersion} prebuilt libllama, ` +
        `llama.cpp de3ff81), made by scripts/goldens/chat-goldens.mjs on ${new Date().toISOString().slice(0, 10)}\n` +
        `# render <template name, or jinja:<kgen mkmodel --chat-template name>> <conversation> <add_ass> <output as JSON>\n`;
    writeFileSync(out, header + rendered);
    console.log(`${out}: ${rendered.split("\n").length - 1} renderings`);
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
