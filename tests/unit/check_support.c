/* check_support: helpers shared by the Check tests. */
#include "check_common.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *kg_test_data(const char *rel) {
    static char buf[4][4096];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof(buf[0]), "%s/%s", KG_DATA_DIR, rel);
    return b;
}

bool kg_test_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

const char *kg_test_tmp_path(const char *name) {
    static char buf[8][4096];
    static int next;
    static int counter;
    char *b = buf[next++ % 8];
    mkdir(KG_TEST_TMP, 0755);
    snprintf(b, sizeof(buf[0]), "%s/%s-%d-%d", KG_TEST_TMP, name, (int)getpid(), counter++);
    return b;
}

char *kg_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *data = malloc(cap + 1);
    size_t got;
    while ((got = fread(data + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            data = realloc(data, cap + 1);
        }
    }
    fclose(f);
    data[n] = '\0';
    if (len) {
        *len = n;
    }
    return data;
}

char *kg_test_run(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) {
        *status = -1;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap + 1);
    size_t got;
    while ((got = fread(out + n, 1, cap - n, p)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            out = realloc(out, cap + 1);
        }
    }
    out[n] = '\0';
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

const char *kg_test_make_model(const kg_test_model_opts_t *o) {
    static char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("model"));
    char cmd[8192];
    int n = snprintf(cmd, sizeof(cmd),
                     "%s/kgen mkmodel --out '%s' --n-embd %d --n-layer %d --n-head %d "
                     "--n-head-kv %d --n-ff %d --seed %llu",
                     KG_BIN_DIR, path, o->n_embd, o->n_layer, o->n_head, o->n_head_kv, o->n_ff,
                     (unsigned long long)o->seed);
    if (o->head_dim) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --head-dim %d", o->head_dim);
    }
    if (o->ctx) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --ctx %d", o->ctx);
    }
    if (o->rope_base > 0) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --rope-base %g", (double)o->rope_base);
    }
    if (o->tied) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --tied");
    }
    if (o->type && strcmp(o->type, "f32") != 0) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --type %s", o->type);
    }
    if (o->vocab_from) {
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --vocab-from '%s'", o->vocab_from);
    }
    snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >/dev/null");
    if (system(cmd) != 0) {
        fprintf(stderr, "kg_test_make_model: failed: %s\n", cmd);
        return NULL;
    }
    return path;
}
