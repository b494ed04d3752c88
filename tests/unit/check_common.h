/* check_common: the runner and helpers every Check test shares
 * (postsrsd tests/unit/common.h). A test file defines
 *     static Suite *make_suite(void) { ... }
 * and ends with KG_CHECK_MAIN(make_suite). */
#pragma once

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define KG_CHECK_MAIN(make)                                                                        \
    int main(void) {                                                                               \
        SRunner *sr = srunner_create(make());                                                      \
        srunner_run_all(sr, CK_NORMAL);                                                            \
        int failed = srunner_ntests_failed(sr);                                                    \
        srunner_free(sr);                                                                          \
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;                                          \
    }

/** Path under tests/data (KG_DATA_DIR), in a static buffer per call site
 * style: the caller copies it if it needs two. */
const char *kg_test_data(const char *rel);
/** Whether a file exists. */
bool kg_test_exists(const char *path);
/** A fresh path under the build's test-tmp folder: "<tmp>/<name>-<pid>-<n>". */
const char *kg_test_tmp_path(const char *name);
/** Read a whole file; the caller frees. NULL when it cannot be read. */
char *kg_test_read_file(const char *path, size_t *len);
/** Run a shell command, capturing stdout into a malloc'ed string (caller
 * frees); *status gets the exit status (or -1). */
char *kg_test_run(const char *cmd, int *status);

/** Options of a random model for tests (see kgen mkmodel). */
typedef struct kg_test_model_opts {
    int n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, ctx;
    float rope_base;
    bool tied;
    const char *type;       /* NULL/"f32" or a kgen mkmodel --type ("f16", "q4_k_m", ...) */
    const char *vocab_from; /* NULL: built-in byte vocabulary */
    uint64_t seed;
} kg_test_model_opts_t;

/** Write a random-weight model (kg_mkmodel_write, what `kgen mkmodel`
 * does) into a temp file and return its path (static storage per call:
 * copy it to keep it). */
const char *kg_test_make_model(const kg_test_model_opts_t *o);

/** `kgen mkmodel --out OUT ARGS` in this process: the command's own parser
 * and checks (kg_mkmodel_parse_args, src/model/kg_mkmodel_args.c), then
 * kg_mkmodel_write, without running the binary. ARGS are split at whitespace (no quoting). Returns
 * kgen's exit code; its error message goes to stderr. */
int kg_test_mkmodel(const char *out, const char *args);

// ---- golden files made by llama.cpp (check_arch, check_lora, check_embed) ----

/** FNV-1a 64 of a file's bytes: the goldens name the model file they were made from. */
uint64_t kg_test_fnv64_file(const char *path);
/** Normalised mean squared error of `got` against `want` (n values). */
double kg_test_nmse(const float *want, const float *got, int n);
/** The logits NMSE a weight type's forward may reach against llama.cpp's. */
double kg_test_nmse_bound(const char *type);
/** The logit margin under which a greedy pick may be llama.cpp's runner-up (a near-tie). */
float kg_test_tie_bound(const char *type);
/** The index of the first maximum. */
int32_t kg_test_argmax(const float *v, int32_t n);
/** "N v1 ... vN" into a new array (the caller frees it); *n_out = N. */
float *kg_test_parse_floats(const char *s, int32_t *n_out);
/** Space-separated ids into ids (at most cap); their count. */
int32_t kg_test_parse_ids(const char *s, int32_t *ids, int32_t cap);
/** qsort comparator of NUL-terminated names (char arrays). */
int kg_test_cmp_name(const void *a, const void *b);
