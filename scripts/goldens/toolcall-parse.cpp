// toolcall-parse: goldens for kgen's tool-call parser (tests/data/toolcall/),
// made by llama.cpp's own chat parser. For every group of
// tests/data/toolcall/outputs.json (a call syntax, the real templates that
// use it, and model outputs in that syntax) it renders a one-turn
// conversation with the group's tools through common_chat_templates_apply
// (use_jinja, tool_choice auto, parallel calls on, reasoning parsed as
// llama-server's default "deepseek" does; a group with "no_tools" renders
// the conversation without tools), takes the parser that call built
// for the template, and runs common_chat_parse (not partial) on each output.
//
// Build and run: scripts/goldens/toolcall-goldens.sh. Output: one JSON
// document on stdout, {"cases": [{"template", "output", "format",
//  "generation_prompt", "content", "reasoning_content", "tool_calls":
//  [{"name", "arguments", "id"}]} | {"template", "output", "error"}]}
#include "chat.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

static std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: toolcall-parse outputs.json TEMPLATE_DIR\n");
        return 2;
    }
    common_json doc = common_json::parse(slurp(argv[1]));
    std::string dir = argv[2];
    common_json cases = common_json::array();
    for (const auto &group : doc["groups"]) {
        for (const auto &tname : group["templates"]) {
            std::string name = tname.get<std::string>();
            common_json head = common_json::object();
            head["template"] = name;
            common_chat_params params;
            try {
                auto tmpls =
                    common_chat_templates_init(nullptr, slurp(dir + "/" + name), "<s>", "</s>");
                common_chat_templates_inputs in;
                in.use_jinja = true;
                in.messages = common_chat_msgs_parse_oaicompat(doc["messages"]);
                if (!group.value("no_tools", false)) {
                    in.tools = common_chat_tools_parse_oaicompat(doc["tools"]);
                }
                in.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
                in.parallel_tool_calls = true;
                in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
                in.enable_thinking = true;
                params = common_chat_templates_apply(tmpls.get(), in);
            } catch (const std::exception &e) {
                head["output"] = "*";
                head["error"] = std::string("apply: ") + e.what();
                cases.push_back(head);
                continue;
            }
            common_chat_parser_params pp(params);
            pp.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
            pp.parse_tool_calls = true;
            if (!params.parser.empty()) {
                pp.parser.load(params.parser);
            }
            for (const auto &out : group["outputs"]) {
                common_json c = head;
                c["output"] = out["name"];
                try {
                    common_chat_msg msg =
                        common_chat_parse(out["text"].get<std::string>(), false, pp);
                    c["format"] = common_chat_format_name(params.format);
                    c["generation_prompt"] = params.generation_prompt;
                    c["content"] = msg.content;
                    c["reasoning_content"] = msg.reasoning_content;
                    common_json calls = common_json::array();
                    for (const auto &tc : msg.tool_calls) {
                        calls.push_back(
                            {{"name", tc.name}, {"arguments", tc.arguments}, {"id", tc.id}});
                    }
                    c["tool_calls"] = calls;
                } catch (const std::exception &e) {
                    c["error"] = std::string("parse: ") + e.what();
                }
                cases.push_back(c);
            }
        }
    }
    common_json res = common_json::object();
    res["cases"] = cases;
    printf("%s\n", res.dump(1).c_str());
    return 0;
}
