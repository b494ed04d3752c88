/* kgen: the offline tool: generate, tokenize, mkmodel, batch, render. */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", kg_cmd_generate, "generate text from a prompt with a GGUF model"},
    {"tokenize", kg_cmd_tokenize, "print the token ids of stdin"},
    {"mkmodel", kg_cmd_mkmodel, "write a random-weight Llama GGUF model of any shape"},
    {"batch", kg_cmd_batch, "run a JSONL file of jobs through the engine (offline mode)"},
    {"render", kg_cmd_render, "print the prompt a job becomes (the model's chat template)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kgen <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    }
    fprintf(f, "\n`kgen <command> --help` shows a command's options; `kgen --version`.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        kg_cmd_print_version("kgen");
        return 0;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            return commands[i].run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "kgen: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
