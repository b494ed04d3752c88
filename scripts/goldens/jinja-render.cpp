// jinja-render: goldens for kgen's Jinja engine (tests/data/chat/jinja/), made
// by llama.cpp's own chat code. For each template file and each conversation
// of conversations.json it calls common_chat_templates_apply (use_jinja, as
// llama-server --jinja) and keeps the prompt it returns. To test the engine
// and not llama.cpp's input massaging (caps probes, workarounds, normalized
// content), it also records the exact variables llama.cpp's Jinja runtime got
// for that prompt: jinja::global_from_json is wrapped at link time
// (-Wl,--wrap), every context it receives is kept, and the one whose direct
// render equals the prompt is written beside it.
//
// Build and run: scripts/goldens/jinja-goldens.sh (it links the `common`
// library of a llama.cpp build). Output: one JSON document on stdout,
//   {"now": <epoch s>, "contexts": [...], "cases": [{"template", "case",
//    "context": <index>, "output"} | {"template", "case", "error"}]}
#include "chat.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/value.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define WRAPPED    _ZN5jinja16global_from_jsonI11common_jsonEEvRNS_7contextERKT_b
#define CAT2(a, b) a##b
#define CAT(a, b)  CAT2(a, b)

extern "C" void CAT(__real_, WRAPPED)(jinja::context &ctx, const common_json &j, bool mark);

static std::vector<std::string> g_captured;
static bool g_capture = true;

extern "C" void CAT(__wrap_, WRAPPED)(jinja::context &ctx, const common_json &j, bool mark) {
    if (g_capture) {
        g_captured.push_back(j.dump());
    }
    CAT(__real_, WRAPPED)(ctx, j, mark);
}

static std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

static bool render_direct(const std::string &src, const std::string &ctx_json, std::string &out) {
    try {
        jinja::lexer lx;
        auto lr = lx.tokenize(src);
        jinja::program prog = jinja::parse_from_tokens(lr);
        jinja::context ctx(lr.source);
        g_capture = false;
        jinja::global_from_json(ctx, common_json::parse(ctx_json), false);
        g_capture = true;
        jinja::runtime rt(ctx);
        auto results = rt.execute(prog);
        out = jinja::runtime::gather_string_parts(results)->as_string().str();
        return true;
    } catch (const std::exception &) {
        g_capture = true;
        return false;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: jinja-render conversations.json template.jinja...\n");
        return 2;
    }
    common_json convs = common_json::parse(slurp(argv[1]));
    common_json doc = common_json::object();
    doc["now"] = (int64_t)std::time(nullptr);
    common_json contexts = common_json::array();
    common_json cases = common_json::array();
    std::map<std::string, size_t> ctx_index;
    for (int t = 2; t < argc; t++) {
        std::string path = argv[t];
        std::string name = path.substr(path.find_last_of('/') + 1);
        std::string src = slurp(path);
        common_chat_templates_ptr tmpls;
        try {
            tmpls = common_chat_templates_init(nullptr, src, "<s>", "</s>");
        } catch (const std::exception &e) {
            common_json c = common_json::object();
            c["template"] = name;
            c["case"] = "*";
            c["error"] = std::string("init: ") + e.what();
            cases.push_back(c);
            continue;
        }
        for (size_t i = 0; i < convs.size(); i++) {
            const common_json &conv = convs[i];
            common_json c = common_json::object();
            c["template"] = name;
            c["case"] = conv["name"].get<std::string>();
            common_chat_templates_inputs in;
            in.use_jinja = true;
            in.messages = common_chat_msgs_parse_oaicompat(conv["messages"]);
            if (conv.contains("tools")) {
                in.tools = common_chat_tools_parse_oaicompat(conv["tools"]);
            }
            in.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
            in.enable_thinking = conv["enable_thinking"].get<bool>();
            in.chat_template_kwargs["enable_thinking"] = in.enable_thinking ? "true" : "false";
            g_captured.clear();
            std::string prompt;
            try {
                prompt = common_chat_templates_apply(tmpls.get(), in).prompt;
            } catch (const std::exception &e) {
                c["error"] = std::string("apply: ") + e.what();
                cases.push_back(c);
                continue;
            }
            std::string found;
            for (size_t k = g_captured.size(); k-- > 0;) {
                std::string out;
                if (render_direct(src, g_captured[k], out) && out == prompt) {
                    found = g_captured[k];
                    break;
                }
            }
            if (found.empty()) {
                c["error"] = "no captured context renders the prompt common_chat_templates_apply "
                             "returned (it post-processes the render)";
                c["prompt"] = prompt;
                cases.push_back(c);
                continue;
            }
            auto it = ctx_index.find(found);
            if (it == ctx_index.end()) {
                it = ctx_index.emplace(found, contexts.size()).first;
                contexts.push_back(common_json::parse(found));
            }
            c["context"] = (int64_t)it->second;
            c["output"] = prompt;
            cases.push_back(c);
        }
    }
    doc["contexts"] = contexts;
    doc["cases"] = cases;
    printf("%s\n", doc.dump(1).c_str());
    return 0;
}
