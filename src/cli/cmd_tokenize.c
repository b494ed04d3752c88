/* cmd_tokenize: `kgen tokenize`, the token ids of stdin (like llama.cpp's
 * llama-tokenize --ids). Reads all of stdin byte for byte (nothing is
 * stripped, any bytes), prints the ids on one line separated by single
 * spaces. Only the GGUF metadata is used, so vocab-only files work. */
#include "cmd.h"
#include "model/kg_gguf.h"
#include "model/kg_tokenizer.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: kgen tokenize --model FILE [--no-bos] [--no-parse-special] < text\n"
               "\n"
               "Print the token ids of stdin (all of it, byte for byte) on one line.\n"
               "\n"
               "  --model FILE         GGUF file with a tokenizer (a vocab-only file is enough)\n"
               "  --no-bos             add no BOS/EOS token (by default the file decides)\n"
               "  --no-parse-special   treat special-token text such as <|endoftext|> as text\n"
               "  --help, --version\n");
}

/* All of stdin; *len gets its size. NULL on a read error or no memory. */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) {
            break;
        }
    }
    if (ferror(stdin)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int kg_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    bool add_special = true, parse_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            kg_cmd_print_version("kgen");
            return 0;
        }
        if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kgen tokenize: %s needs a value\n", a);
                return 2;
            }
            model = argv[++i];
        } else if (strncmp(a, "--model=", 8) == 0) {
            model = a + 8;
        } else if (strcmp(a, "--no-bos") == 0) {
            add_special = false;
        } else if (strcmp(a, "--no-parse-special") == 0) {
            parse_special = false;
        } else {
            fprintf(stderr, "kgen tokenize: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!model || !*model) {
        fprintf(stderr, "kgen tokenize: --model FILE is required (see --help)\n");
        return 2;
    }

    int rc = 1;
    char err[512];
    char *text = NULL;
    int32_t *ids = NULL;
    kg_tokenizer_t *tok = NULL;
    kg_gguf_t *g = kg_gguf_open(model, err, sizeof(err));
    if (!g) {
        fprintf(stderr, "kgen tokenize: %s\n", err);
        goto out;
    }
    tok = kg_tokenizer_new(g, err, sizeof(err));
    kg_gguf_free(g);
    if (!tok) {
        fprintf(stderr, "kgen tokenize: %s: %s\n", model, err);
        goto out;
    }
    size_t len = 0;
    text = read_stdin(&len);
    if (!text) {
        fprintf(stderr, "kgen tokenize: cannot read stdin: %s\n", strerror(errno));
        goto out;
    }
    // a first guess that fits most texts; the exact count comes back otherwise
    int64_t cap = (int64_t)len + 16, n;
    for (;;) {
        ids = malloc((size_t)cap * sizeof(int32_t));
        if (!ids) {
            fprintf(stderr, "kgen tokenize: out of memory\n");
            goto out;
        }
        n = kg_tokenizer_encode(tok, text, len, add_special, parse_special, ids, cap);
        if (n < 0) {
            fprintf(stderr, "kgen tokenize: the text could not be tokenized\n");
            goto out;
        }
        if (n <= cap) {
            break;
        }
        free(ids);
        cap = n;
    }
    for (int64_t i = 0; i < n; i++) {
        printf(i ? " %d" : "%d", ids[i]);
    }
    putchar('\n');
    if (fflush(stdout) != 0) {
        fprintf(stderr, "kgen tokenize: cannot write stdout: %s\n", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(ids);
    free(text);
    kg_tokenizer_free(tok);
    return rc;
}
