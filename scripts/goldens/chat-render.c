/* chat-render: llama.cpp's own rendering of chat templates, for the chat
 * goldens (tests/data/chat/llama-cpp-render.golden). It loads the libllama
 * of a llama.cpp build (node-llama-cpp's prebuilt one) with dlopen and calls
 * llama_chat_apply_template for every built-in template name llama.cpp
 * lists, and for the Jinja texts given as arguments (files), over two
 * conversations, with and without the assistant prompt.
 *
 * Build and run: see scripts/goldens/chat-goldens. Output: one record per
 * rendering:
 *   render <name-or-file> <conversation 0|1> <add_ass 0|1> <JSON string>
 * or "error <name> <conv> <add_ass> <code>" when llama.cpp refuses. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct llama_chat_message {
    const char *role;
    const char *content;
};

typedef int32_t (*apply_fn)(const char *tmpl,
                            const struct llama_chat_message *chat,
                            size_t n_msg,
                            bool add_ass,
                            char *buf,
                            int32_t length);
typedef int32_t (*builtin_fn)(const char **output, size_t len);

static const struct llama_chat_message conv0[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
static const struct llama_chat_message conv1[] = {
    {"user", "What is 2+2?"},
    {"assistant", "4"},
    {"user", "And in words,\nplease?"},
};

static void put_json(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c == '\n') {
            printf("\\n");
        } else if (c == '\t') {
            printf("\\t");
        } else if (c < 0x20) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

static void render(apply_fn apply, const char *label, const char *tmpl) {
    static char buf[1 << 16];
    for (int c = 0; c < 2; c++) {
        const struct llama_chat_message *conv = c == 0 ? conv0 : conv1;
        size_t n = c == 0 ? sizeof(conv0) / sizeof(conv0[0]) : sizeof(conv1) / sizeof(conv1[0]);
        for (int add = 0; add < 2; add++) {
            int32_t r = apply(tmpl, conv, n, add != 0, buf, (int32_t)sizeof(buf));
            if (r < 0 || r >= (int32_t)sizeof(buf)) {
                printf("error %s %d %d %d\n", label, c, add, r);
                continue;
            }
            buf[r] = '\0';
            printf("render %s %d %d ", label, c, add);
            put_json(buf);
            putchar('\n');
        }
    }
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    char *s = malloc(1 << 20);
    size_t n = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (s) {
        s[n] = '\0';
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: chat-render LIBLLAMA.so [name=template-file ...]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "chat-render: %s\n", dlerror());
        return 1;
    }
    apply_fn apply = (apply_fn)(uintptr_t)dlsym(lib, "llama_chat_apply_template");
    builtin_fn builtin = (builtin_fn)(uintptr_t)dlsym(lib, "llama_chat_builtin_templates");
    if (!apply || !builtin) {
        fprintf(stderr, "chat-render: %s lacks the chat API\n", argv[1]);
        return 1;
    }
    const char *names[256];
    int32_t n = builtin(names, 256);
    for (int32_t i = 0; i < n && i < 256; i++) {
        render(apply, names[i], names[i]);
    }
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        char *text = eq ? read_file(eq + 1) : NULL;
        if (!text) {
            fprintf(stderr, "chat-render: bad argument '%s'\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        render(apply, argv[i], text);
        free(text);
    }
    return 0;
}
