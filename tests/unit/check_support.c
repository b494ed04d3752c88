/* check_support: helpers shared by the Check tests. */
#include "check_common.h"
#include "model/kg_mkmodel.h"
#include "model/kg_mkmodel_args.h"

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
    kg_mkmodel_opts_t mo = kg_mkmodel_opts_default();
    mo.out = path;
    mo.vocab_from = o->vocab_from;
    mo.n_embd = o->n_embd;
    mo.n_layer = o->n_layer;
    mo.n_head = o->n_head;
    mo.n_head_kv = o->n_head_kv;
    mo.n_ff = o->n_ff;
    mo.head_dim = o->head_dim ? o->head_dim : o->n_embd / o->n_head;
    if (o->ctx) {
        mo.ctx = o->ctx;
    }
    if (o->rope_base > 0) {
        mo.rope_base = o->rope_base;
    }
    mo.tied = o->tied;
    mo.have_seed = true;
    mo.seed = o->seed;
    /* a llama-quantize file type (f32, q8_0, q4_k_m, ...): the mix types each tensor */
    bool known = o->type == NULL || kg_ftype_from_name(o->type, &mo.ftype);
    char err[512];
    if (!known || kg_mkmodel_write(&mo, NULL, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kg_test_make_model: %s\n", known ? err : "unknown type");
        return NULL;
    }
    return path;
}

int kg_test_mkmodel(const char *out, const char *args) {
    char *copy = strdup(args);
    char *argv[128] = {"mkmodel", "--out", (char *)out};
    int argc = 3;
    for (char *save = NULL, *t = strtok_r(copy, " \t\n", &save); t && argc < 127;
         t = strtok_r(NULL, " \t\n", &save)) {
        argv[argc++] = t;
    }
    /* kgen mkmodel's own reading of the flags, then its write; its exit
     * statuses (2 a usage error, 1 a failed write) and messages */
    kg_mkmodel_opts_t mo = kg_mkmodel_opts_default();
    char err[1024 + 4096];
    int rc = 0;
    kg_mkmodel_args_t parsed = kg_mkmodel_parse_args(argc, argv, &mo, err, sizeof(err));
    if (parsed == KG_MKMODEL_ARGS_INVALID) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        rc = 2;
    } else if (parsed == KG_MKMODEL_ARGS_OK &&
               kg_mkmodel_write(&mo, NULL, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        rc = 1;
    }
    free(copy);
    return rc;
}

// ---- golden files made by llama.cpp ----

uint64_t kg_test_fnv64_file(const char *path) {
    size_t len;
    char *data = kg_test_read_file(path, &len);
    ck_assert_ptr_nonnull(data);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ (unsigned char)data[i]) * 0x100000001b3ULL;
    }
    free(data);
    return h;
}

double kg_test_nmse(const float *want, const float *got, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

double kg_test_nmse_bound(const char *type) {
    if (strcmp(type, "f32") == 0) {
        return 1e-6;
    }
    return strcmp(type, "f16") == 0 || strcmp(type, "bf16") == 0 ? 1e-5 : 5e-4;
}

float kg_test_tie_bound(const char *type) {
    if (strcmp(type, "f32") == 0) {
        return 1e-3f;
    }
    return strcmp(type, "f16") == 0 || strcmp(type, "bf16") == 0 ? 1e-2f : 5e-2f;
}

int32_t kg_test_argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

float *kg_test_parse_floats(const char *s, int32_t *n_out) {
    char *end;
    long n = strtol(s, &end, 10);
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    s = end;
    for (long i = 0; i < n; i++) {
        v[i] = strtof(s, &end);
        s = end;
    }
    *n_out = (int32_t)n;
    return v;
}

int32_t kg_test_parse_ids(const char *s, int32_t *ids, int32_t cap) {
    int32_t n = 0;
    char *end;
    for (long v = strtol(s, &end, 10); end != s && n < cap; v = strtol(s, &end, 10)) {
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

int kg_test_cmp_name(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}
