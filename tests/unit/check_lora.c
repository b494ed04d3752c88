/* check_lora: LoRA adapters against llama.cpp, and what kgen promises
 * about them.
 *
 * tests/data/lora holds golden files made by scripts/goldens/lora-goldens.mjs
 * with llama.cpp (node-llama-cpp, the adapters on the context): a Llama
 * and a Qwen3 base, F16, Q8_0 and F32 adapters at scales 1 and 0.5, and
 * two adapters at once. Each test remakes the base and the adapters with
 * kgen mkmodel's code (their bytes must hash as the golden says), then
 * checks the logits (NMSE, as check_arch) and the greedy ids on the CPU
 * backend, and that the base alone is far from those logits (the adapter
 * matters). Then: the loader refuses a mismatched or malformed adapter by
 * name; 64 jobs over 8 adapters and the base in one batch give the ids
 * each job gives alone; the prefix cache keeps a prompt per adapter set;
 * --lora specs and a job's choice of adapters (model, lora). */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_engine.h"
#include "fakes/fake_backend.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_lora.h"
#include "model/kg_mklora.h"
#include "model/kg_model.h"
#include "pipeline/kg_intake.h"
#include "pipeline/kg_loras.h"
#include "schema/kg_codec.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GOLDENS 16
#define MAX_IDS     512
#define MAX_LORAS   4
#define CTX         512
#define BLOCK       16

// ---- golden files ----

static char g_files[MAX_GOLDENS][256];
static int g_n_files;

static void find_goldens(void) {
    DIR *d = opendir(kg_test_data("lora"));
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n > 7 && n < 256 && strcmp(de->d_name + n - 7, ".golden") == 0 &&
            g_n_files < MAX_GOLDENS) {
            snprintf(g_files[g_n_files++], 256, "%s", de->d_name);
        }
    }
    if (d) {
        closedir(d);
    }
    qsort(g_files, (size_t)g_n_files, sizeof(g_files[0]), kg_test_cmp_name);
}

typedef struct golden_prompt {
    int32_t input[MAX_IDS], n_input;
    int32_t ids[64], n_ids;
    int32_t second[64];
    float margin[64];
    float *logits, *logits_end;
    int32_t n_logits;
} golden_prompt_t;

typedef struct golden {
    char name[64], type[16];
    uint64_t base_fnv;
    char base_args[1024];
    int n_loras;
    float scale[MAX_LORAS];
    uint64_t lora_fnv[MAX_LORAS];
    char lora_args[MAX_LORAS][256];
    golden_prompt_t p[2];
    int n_prompts;
} golden_t;

static void golden_load(const char *file, golden_t *g) {
    char rel[300];
    snprintf(rel, sizeof(rel), "lora/%s", file);
    size_t len;
    char *text = kg_test_read_file(kg_test_data(rel), &len);
    ck_assert_msg(text != NULL, "cannot read %s", rel);
    memset(g, 0, sizeof(*g));
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int idx = 0, off = 0;
        unsigned long long h = 0;
        if (sscanf(line, "case %63s %15s", g->name, g->type) == 2) {
            continue;
        }
        if (sscanf(line, "base fnv64 %llx %n", &h, &off) == 1 && off > 0) {
            g->base_fnv = h;
            snprintf(g->base_args, sizeof(g->base_args), "%s", line + off);
        } else if (g->n_loras < MAX_LORAS &&
                   sscanf(line, "lora %f fnv64 %llx %n", &g->scale[g->n_loras], &h, &off) == 2 &&
                   off > 0) {
            g->lora_fnv[g->n_loras] = h;
            snprintf(g->lora_args[g->n_loras], sizeof(g->lora_args[0]), "%s", line + off);
            g->n_loras++;
        } else if (sscanf(line, "input %d %n", &idx, &off) == 1 && idx >= 0 && idx < 2) {
            g->p[idx].n_input = kg_test_parse_ids(line + off, g->p[idx].input, MAX_IDS);
            g->n_prompts = idx + 1 > g->n_prompts ? idx + 1 : g->n_prompts;
        } else if (sscanf(line, "ids %d %n", &idx, &off) == 1 && idx >= 0 && idx < 2) {
            g->p[idx].n_ids = kg_test_parse_ids(line + off, g->p[idx].ids, 64);
        } else if (sscanf(line, "second %d %n", &idx, &off) == 1 && idx >= 0 && idx < 2) {
            const char *q = line + off;
            int k = 0, used = 0;
            while (k < 64 &&
                   sscanf(q, "%d:%f%n", &g->p[idx].second[k], &g->p[idx].margin[k], &used) == 2) {
                q += used;
                k++;
            }
        } else if (sscanf(line, "logits_end %d %n", &idx, &off) == 1 && idx >= 0 && idx < 2) {
            g->p[idx].logits_end = kg_test_parse_floats(line + off, &g->p[idx].n_logits);
        } else if (sscanf(line, "logits %d %n", &idx, &off) == 1 && idx >= 0 && idx < 2) {
            g->p[idx].logits = kg_test_parse_floats(line + off, &g->p[idx].n_logits);
        }
    }
    free(text);
    ck_assert_msg(g->base_args[0] && g->n_loras > 0 && g->n_prompts == 2, "%s is incomplete", rel);
}

static void golden_clear(golden_t *g) {
    for (int i = 0; i < 2; i++) {
        free(g->p[i].logits);
        free(g->p[i].logits_end);
    }
}

// ---- models and adapters ----

/* kgen mkmodel --lora --base base --out out <args>, in process. */
static void make_lora(const char *base, const char *out, const char *args) {
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", args);
    char *argv[64] = {"mkmodel", "--lora", "--base", (char *)base, "--out", (char *)out};
    int argc = 6;
    for (char *save = NULL, *t = strtok_r(copy, " ", &save); t && argc < 63;
         t = strtok_r(NULL, " ", &save)) {
        argv[argc++] = t;
    }
    kg_mklora_opts_t o;
    char err[512];
    ck_assert_msg(kg_mklora_parse_args(argc, argv, &o, err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(kg_mklora_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
}

typedef struct loaded {
    kg_model_t *model;
    kg_lora_t *lora[MAX_LORAS];
    int n;
} loaded_t;

/* The golden's base and adapters, hashes checked. */
static void load_golden(const golden_t *g, loaded_t *l) {
    char base[4096], path[4096], err[512];
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("lora-base"));
    ck_assert(kg_test_mkmodel(base, g->base_args) == 0);
    ck_assert_msg(kg_test_fnv64_file(base) == g->base_fnv,
                  "%s: kgen mkmodel wrote another base than the golden's: remake the goldens",
                  g->name);
    l->model = kg_model_load(base, err, sizeof(err));
    ck_assert_msg(l->model != NULL, "%s", err);
    l->n = g->n_loras;
    for (int i = 0; i < g->n_loras; i++) {
        snprintf(path, sizeof(path), "%s.%d.gguf", kg_test_tmp_path("lora-adapter"), i);
        make_lora(base, path, g->lora_args[i]);
        ck_assert_msg(kg_test_fnv64_file(path) == g->lora_fnv[i],
                      "%s: adapter %d differs from the golden's: remake the goldens", g->name, i);
        l->lora[i] = kg_lora_load(path, l->model, err, sizeof(err));
        ck_assert_msg(l->lora[i] != NULL, "%s", err);
        remove(path);
    }
    remove(base);
}

static void loaded_clear(loaded_t *l) {
    for (int i = 0; i < l->n; i++) {
        kg_lora_free(l->lora[i]);
    }
    kg_model_free(l->model);
}

static kg_backend_t *make_cpu(const kg_model_t *m, int32_t n_blocks, int32_t max_tokens) {
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = n_blocks,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = max_tokens,
                             .max_seq_len = CTX};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    return be;
}

static int32_t add_lora(kg_backend_t *be, const kg_lora_t *lora) {
    int32_t id = -1;
    char err[256];
    ck_assert_msg(kg_backend_lora_add(be, lora, &id, err, sizeof(err)) == KG_OK, "%s", err);
    return id;
}

/* check_arch's bounds: the adapters' products round activations as the
 * base's do, so the errors are of the same kind. */
/* Prefill prompt p in one step on a fresh backend, with the golden's
 * adapters (with_lora) or none; logits into `logits`. */
static kg_backend_t *prefill(const loaded_t *l,
                             const golden_t *g,
                             const golden_prompt_t *gp,
                             bool with_lora,
                             kg_lora_set_t *set,
                             int32_t *table,
                             float *logits) {
    kg_backend_t *be = make_cpu(l->model, CTX / BLOCK, CTX);
    memset(set, 0, sizeof(*set));
    for (int i = 0; with_lora && i < l->n; i++) {
        set->id[set->n] = add_lora(be, l->lora[i]);
        set->scale[set->n++] = g->scale[i];
    }
    for (int32_t b = 0; b < CTX / BLOCK; b++) {
        table[b] = CTX / BLOCK - 1 - b;
    }
    static int32_t pos[CTX], seq[CTX];
    static bool want[CTX];
    for (int32_t i = 0; i < gp->n_input; i++) {
        pos[i] = i;
        seq[i] = 0;
        want[i] = i == gp->n_input - 1;
    }
    kg_step_batch_t b = {.n_tokens = gp->n_input,
                         .token = gp->input,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = 1,
                         .n_slots = 1,
                         .max_blocks_per_seq = CTX / BLOCK,
                         .block_table = table,
                         .slot_lora = set};
    ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_OK);
    return be;
}

START_TEST(matches_llama_cpp) {
    golden_t g;
    golden_load(g_files[_i], &g);
    loaded_t l;
    load_golden(&g, &l);
    const int32_t V = l.model->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    for (int p = 0; p < g.n_prompts; p++) {
        const golden_prompt_t *gp = &g.p[p];
        ck_assert_int_eq(gp->n_logits, V);
        kg_lora_set_t set;
        int32_t table[CTX / BLOCK];
        /* the base alone is far from llama.cpp's adapted logits */
        kg_backend_free(prefill(&l, &g, gp, false, &set, table, logits));
        double e_base = kg_test_nmse(gp->logits, logits, V);
        kg_backend_t *be = prefill(&l, &g, gp, true, &set, table, logits);
        double e = kg_test_nmse(gp->logits, logits, V);
        if (getenv("KG_LORA_VERBOSE")) {
            fprintf(stderr, "%s prompt %d: nmse %.3g (base alone %.3g)\n", g.name, p, e, e_base);
        }
        ck_assert_msg(e < kg_test_nmse_bound(g.type), "%s prompt %d: logits nmse %g >= %g", g.name,
                      p, e, kg_test_nmse_bound(g.type));
        ck_assert_msg(e_base > 100 * kg_test_nmse_bound(g.type),
                      "%s prompt %d: the base alone is as close (nmse %g): the adapter does "
                      "nothing",
                      g.name, p, e_base);
        int32_t n_pos = gp->n_input;
        bool tied = false;
        for (int32_t k = 0; k < gp->n_ids; k++) {
            int32_t next = kg_test_argmax(logits, V);
            if (next != gp->ids[k]) {
                ck_assert_msg(next == gp->second[k] && gp->margin[k] < kg_test_tie_bound(g.type),
                              "%s prompt %d: id %d is %d, llama.cpp's %d (runner-up %d, margin %g)",
                              g.name, p, k, next, gp->ids[k], gp->second[k], (double)gp->margin[k]);
                tied = true;
                break;
            }
            int32_t tok = gp->ids[k], ps = n_pos++, sq = 0;
            bool w = true;
            kg_step_batch_t d = {.n_tokens = 1,
                                 .token = &tok,
                                 .pos = &ps,
                                 .seq = &sq,
                                 .want_logits = &w,
                                 .n_outputs = 1,
                                 .n_slots = 1,
                                 .max_blocks_per_seq = CTX / BLOCK,
                                 .block_table = table,
                                 .slot_lora = &set};
            ck_assert_int_eq(kg_backend_forward(be, &d, logits), KG_OK);
        }
        if (!tied) {
            e = kg_test_nmse(gp->logits_end, logits, V);
            ck_assert_msg(e < kg_test_nmse_bound(g.type),
                          "%s prompt %d: logits after the ids: nmse %g", g.name, p, e);
        }
        kg_backend_free(be);
    }
    free(logits);
    loaded_clear(&l);
    golden_clear(&g);
}
END_TEST

// ---- the loader's refusals ----

#define BASE_ARGS "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 5"

static kg_model_t *small_base(void) {
    char path[4096], err[256];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("lora-small"));
    ck_assert(kg_test_mkmodel(path, BASE_ARGS) == 0);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    return m;
}

/* An adapter in memory: header keys, then one pair (or half) per call. */
static kg_gguf_writer_t *adapter_writer(const char *type, const char *arch) {
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    kg_gguf_writer_set_str(w, "general.architecture", arch);
    kg_gguf_writer_set_str(w, "general.type", type);
    kg_gguf_writer_set_str(w, "adapter.type", "lora");
    kg_gguf_writer_set_f32(w, "adapter.lora.alpha", 8.0f);
    return w;
}

static void
add_half(kg_gguf_writer_t *w, const char *name, kg_ggml_type_t t, int64_t ne0, int64_t ne1) {
    float *v = calloc((size_t)(ne0 * ne1), sizeof(float));
    const int64_t ne[2] = {ne0, ne1};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, name, t, 2, ne, v), KG_OK);
    free(v);
}

/* Load w's bytes as an adapter for m: NULL (and the message) or the adapter. */
static kg_lora_t *
load_mem(kg_gguf_writer_t *w, const kg_model_t *m, char *err, size_t size, uint8_t **bytes) {
    size_t n;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, bytes, &n), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_t *g = kg_gguf_open_memory(*bytes, n, err, size);
    ck_assert_msg(g != NULL, "%s", err);
    return kg_lora_load_gguf(g, "mem.gguf", m, err, size);
}

START_TEST(refuses_mismatches) {
    kg_model_t *m = small_base();
    const kg_ggml_type_t F = KG_GGML_TYPE_F32;
    struct {
        const char *type, *arch;
        const char *a, *b; /* tensor names (NULL: none) */
        int64_t a0, a1, b0, b1;
        kg_ggml_type_t t;
        const char *want; /* in the message; NULL: loads */
    } cases[] = {
        {"adapter", "llama", "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", 64, 8, 8,
         64, F, NULL},
        {"model", "llama", "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", 64, 8, 8, 64,
         F, "general.type is not \"adapter\""},
        {"adapter", "qwen3", "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", 64, 8, 8,
         64, F, "adapter for architecture \"qwen3\", the base model is \"llama\""},
        {"adapter", "llama", "blk.1.ffn_up.weight.lora_a", "blk.1.ffn_up.weight.lora_b", 64, 8, 8,
         64, F, "tensor 'blk.1.ffn_up.weight' has incorrect shape"},
        {"adapter", "llama", "blk.0.attn_k.weight.lora_a", NULL, 64, 8, 0, 0, F,
         "tensor 'blk.0.attn_k.weight' has only its lora_a"},
        {"adapter", "llama", "blk.7.attn_q.weight.lora_a", "blk.7.attn_q.weight.lora_b", 64, 8, 8,
         64, F, "tensor 'blk.7.attn_q.weight' does not exist in the base model"},
        {"adapter", "llama", "output.weight.lora_a", "output.weight.lora_b", 64, 8, 8, 259, F,
         "tensor 'output.weight': kgen adapts only"},
        {"adapter", "llama", "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", 64, 32, 32,
         64, KG_GGML_TYPE_Q4_0, "tensor 'blk.0.attn_q.weight.lora_a' is 2D q4_0"},
        {"adapter", "llama", "blk.0.attn_q.weight.lora_x", NULL, 64, 8, 0, 0, F,
         "neither a .lora_a nor a .lora_b"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_gguf_writer_t *w = adapter_writer(cases[i].type, cases[i].arch);
        add_half(w, cases[i].a, cases[i].t, cases[i].a0, cases[i].a1);
        if (cases[i].b) {
            add_half(w, cases[i].b, cases[i].t, cases[i].b0, cases[i].b1);
        }
        char err[512] = "";
        uint8_t *bytes = NULL;
        kg_lora_t *lora = load_mem(w, m, err, sizeof(err), &bytes);
        if (!cases[i].want) {
            ck_assert_msg(lora != NULL, "case %zu: %s", i, err);
            ck_assert_int_eq(lora->n_pairs, 1);
            ck_assert_int_eq(lora->max_rank, 8);
            ck_assert_float_eq(kg_lora_pair_scale(lora, &lora->pairs[0][KG_LORA_Q], 0.5f), 0.5f);
        } else {
            ck_assert_msg(lora == NULL, "case %zu loaded", i);
            ck_assert_msg(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err,
                          cases[i].want);
        }
        kg_lora_free(lora);
        free(bytes);
    }
    kg_model_free(m);
}
END_TEST

/* A backend that runs no adapters (here the fake) refuses
 * one by name, so a worker with --lora stops at start, saying why. */
/* kgen mkmodel --lora --type q8_0 below rank 32: lora_a in q8_0, lora_b
 * (rows rank wide, under one block) in f16, as llama.cpp's converter falls
 * back; the adapter loads and its pairs say so. */
START_TEST(mklora_q8_0_small_rank) {
    char base[4096], path[4096], err[256];
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("lora-q8"));
    snprintf(path, sizeof(path), "%s.a.gguf", kg_test_tmp_path("lora-q8"));
    ck_assert(kg_test_mkmodel(base, BASE_ARGS) == 0);
    kg_model_t *m = kg_model_load(base, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    make_lora(base, path, "--rank 16 --type q8_0 --seed 3");
    kg_lora_t *lora = kg_lora_load(path, m, err, sizeof(err));
    ck_assert_msg(lora != NULL, "%s", err);
    ck_assert_int_eq(lora->n_pairs, 14); /* 2 layers of 7 */
    for (int32_t il = 0; il < lora->n_layer; il++) {
        for (int p = 0; p < KG_LORA_N_PROJ; p++) {
            ck_assert_int_eq(lora->pairs[il][p].a->type, KG_GGML_TYPE_Q8_0);
            ck_assert_int_eq(lora->pairs[il][p].b->type, KG_GGML_TYPE_F16);
            ck_assert_int_eq(lora->pairs[il][p].rank, 16);
        }
    }
    kg_lora_free(lora);
    kg_model_free(m);
    remove(path);
    remove(base);
}
END_TEST

START_TEST(backend_without_adapters_refuses) {
    kg_model_t *m = small_base();
    char path[4096], base[4096], err[256];
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("lora-refuse"));
    ck_assert(kg_test_mkmodel(base, BASE_ARGS) == 0);
    snprintf(path, sizeof(path), "%s.a.gguf", kg_test_tmp_path("lora-refuse"));
    make_lora(base, path, "--rank 4 --seed 1");
    kg_lora_t *lora = kg_lora_load(path, m, err, sizeof(err));
    ck_assert_msg(lora != NULL, "%s", err);
    kg_fake_backend_params_t fp = {
        .n_vocab = 16, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 8, .n_slots = 1};
    kg_backend_t *be = kg_fake_backend_new(&fp);
    int32_t id = -1;
    ck_assert_int_eq(kg_backend_lora_add(be, lora, &id, err, sizeof(err)), KG_ERR_UNSUPPORTED);
    ck_assert_str_eq(err, "the fake backend does not run LoRA adapters (the cpu and cuda ones do)");
    kg_backend_free(be);
    kg_lora_free(lora);
    kg_model_free(m);
    remove(path);
    remove(base);
}
END_TEST

// ---- batch invariance through the engine ----

#define N_JOBS     64
#define N_ADAPT    8
#define MAX_OUT    12
#define MAX_PROMPT 40

typedef struct engine_run {
    kg_backend_t *be;
    kg_engine_t *e;
    int32_t ids[N_ADAPT];
} engine_run_t;

static void engine_start(
    engine_run_t *r, const kg_model_t *m, kg_lora_t **loras, int batch, bool prefix_cache) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = batch;
    ep.max_batch_tokens = 96; /* prompts are chunked over steps */
    ep.max_seq_len = 64;
    ep.kv_block_size = BLOCK;
    ep.n_kv_blocks = N_JOBS * 64 / BLOCK;
    ep.prefix_cache = prefix_cache;
    r->be = make_cpu(m, ep.n_kv_blocks, ep.max_batch_tokens);
    for (int a = 0; a < N_ADAPT; a++) {
        r->ids[a] = add_lora(r->be, loras[a]);
    }
    char err[256];
    r->e = kg_engine_new(r->be, &ep, err, sizeof(err));
    ck_assert_msg(r->e != NULL, "%s", err);
}

static void engine_stop(engine_run_t *r) {
    kg_engine_free(r->e);
    kg_backend_free(r->be);
}

/* Job j's adapters: j % 9 == 8 the base; every fifth job two at once. */
static kg_lora_set_t job_set(const engine_run_t *r, int j) {
    kg_lora_set_t s = {0};
    int a = j % (N_ADAPT + 1);
    if (a < N_ADAPT) {
        s.id[s.n] = r->ids[a];
        s.scale[s.n++] = 1.0f;
        if (j % 5 == 0) {
            s.id[s.n] = r->ids[(a + 3) % N_ADAPT];
            s.scale[s.n++] = 0.5f;
        }
    }
    return s;
}

/* Submit jobs [j0, j1) and run them to the end; ids into out, the first
 * completion's n_cached into cached (may be NULL). */
static void run_jobs(engine_run_t *r,
                     const int32_t (*prompts)[MAX_PROMPT],
                     const int32_t *n_prompt,
                     int j0,
                     int j1,
                     int32_t (*out)[MAX_OUT],
                     int32_t *n_out,
                     int32_t *cached) {
    const int32_t cap = kg_engine_max_completions(r->e);
    kg_completion_t *comps = malloc((size_t)cap * sizeof(*comps));
    for (int j = j0; j < j1; j++) {
        kg_request_t req = {.id = (uint64_t)j + 1,
                            .prompt = prompts[j],
                            .n_prompt = n_prompt[j],
                            .max_tokens = MAX_OUT,
                            .ignore_eos = true,
                            .sampling = kg_sampling_params_default(),
                            .lora = job_set(r, j)};
        ck_assert_int_eq(kg_engine_submit(r->e, &req), KG_OK);
        n_out[j] = 0;
    }
    while (kg_engine_busy(r->e)) {
        int32_t n = kg_engine_step(r->e, comps, cap);
        ck_assert_int_ge(n, 0);
        for (int32_t c = 0; c < n; c++) {
            int j = (int)comps[c].id - 1;
            if (comps[c].token >= 0 && n_out[j] < MAX_OUT) {
                if (n_out[j] == 0 && cached) {
                    cached[j] = comps[c].n_cached;
                }
                out[j][n_out[j]++] = comps[c].token;
            }
        }
    }
    free(comps);
}

static void make_adapters(const kg_model_t *m, kg_lora_t **loras) {
    char base[4096], path[4096], err[256], args[128];
    snprintf(base, sizeof(base), "%s.gguf", kg_test_tmp_path("lora-inv"));
    ck_assert(kg_test_mkmodel(base, BASE_ARGS) == 0);
    static const char *const types[] = {"f32", "f16", "bf16", "q8_0"};
    for (int a = 0; a < N_ADAPT; a++) {
        snprintf(path, sizeof(path), "%s.%d.gguf", kg_test_tmp_path("lora-inv"), a);
        snprintf(args, sizeof(args), "--rank %d --type %s --seed %d", a % 4 == 3 ? 32 : 4 + a,
                 types[a % 4], 100 + a);
        make_lora(base, path, args);
        loras[a] = kg_lora_load(path, m, err, sizeof(err));
        ck_assert_msg(loras[a] != NULL, "%s", err);
        remove(path);
    }
    remove(base);
}

START_TEST(batch_invariant) {
    kg_model_t *m = small_base();
    kg_lora_t *loras[N_ADAPT];
    make_adapters(m, loras);
    static int32_t prompts[N_JOBS][MAX_PROMPT], n_prompt[N_JOBS];
    static int32_t alone[N_JOBS][MAX_OUT], batched[N_JOBS][MAX_OUT], n_alone[N_JOBS],
        n_batched[N_JOBS];
    uint64_t x = 7;
    for (int j = 0; j < N_JOBS; j++) {
        n_prompt[j] = 3 + j % (MAX_PROMPT - 3);
        for (int32_t k = 0; k < n_prompt[j]; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            prompts[j][k] = (int32_t)((x >> 33) % 250) + 3;
        }
    }
    engine_run_t r;
    engine_start(&r, m, loras, 1, false);
    for (int j = 0; j < N_JOBS; j++) {
        run_jobs(&r, (const int32_t(*)[MAX_PROMPT])prompts, n_prompt, j, j + 1, alone, n_alone,
                 NULL);
    }
    engine_stop(&r);
    engine_start(&r, m, loras, N_JOBS, false);
    run_jobs(&r, (const int32_t(*)[MAX_PROMPT])prompts, n_prompt, 0, N_JOBS, batched, n_batched,
             NULL);
    kg_engine_stats_t st;
    kg_engine_stats(r.e, &st);
    engine_stop(&r);
    int n_differ_from_base = 0;
    for (int j = 0; j < N_JOBS; j++) {
        ck_assert_int_eq(n_alone[j], MAX_OUT);
        ck_assert_msg(n_batched[j] == MAX_OUT &&
                          memcmp(alone[j], batched[j], sizeof(alone[j])) == 0,
                      "job %d (adapters of set %d) differs alone and in a batch of %d", j,
                      j % (N_ADAPT + 1), N_JOBS);
        /* the same prompt on the base: job j - j % 9 + 8 shares no prompt,
         * so compare against the base's run of this prompt below */
    }
    /* the adapters change what is generated: each prompt on the base */
    engine_start(&r, m, loras, N_JOBS, false);
    static int32_t base_out[N_JOBS][MAX_OUT], n_base[N_JOBS];
    for (int j = 0; j < N_JOBS; j++) {
        kg_request_t req = {.id = (uint64_t)j + 1,
                            .prompt = prompts[j],
                            .n_prompt = n_prompt[j],
                            .max_tokens = MAX_OUT,
                            .ignore_eos = true,
                            .sampling = kg_sampling_params_default()};
        ck_assert_int_eq(kg_engine_submit(r.e, &req), KG_OK);
        n_base[j] = 0;
    }
    const int32_t cap = kg_engine_max_completions(r.e);
    kg_completion_t *comps = malloc((size_t)cap * sizeof(*comps));
    while (kg_engine_busy(r.e)) {
        int32_t n = kg_engine_step(r.e, comps, cap);
        for (int32_t c = 0; c < n; c++) {
            int j = (int)comps[c].id - 1;
            if (comps[c].token >= 0 && n_base[j] < MAX_OUT) {
                base_out[j][n_base[j]++] = comps[c].token;
            }
        }
    }
    free(comps);
    engine_stop(&r);
    for (int j = 0; j < N_JOBS; j++) {
        bool same = memcmp(base_out[j], alone[j], sizeof(alone[j])) == 0;
        if (j % (N_ADAPT + 1) == N_ADAPT) {
            ck_assert_msg(same, "job %d runs on the base but differs from it", j);
        } else {
            n_differ_from_base += !same;
        }
    }
    /* 57 jobs on adapters: nearly all must differ from the base */
    ck_assert_int_ge(n_differ_from_base, 50);
    for (int a = 0; a < N_ADAPT; a++) {
        kg_lora_free(loras[a]);
    }
    kg_model_free(m);
}
END_TEST

/* A prompt computed under one adapter set is not served from the cache to
 * another: adapter 0, then adapter 1 (nothing cached), then adapter 0 again
 * (its full blocks cached), then the base (nothing). */
/* One prefill step of N_SIDE slots of 9 tokens on a fresh 2-thread backend
 * holding every adapter; slot i on sets[i]. The last token's logits of
 * each slot in slot order. */
#define N_SIDE 6
static void side_step(const kg_model_t *m,
                      kg_lora_t **loras,
                      int n_slots,
                      const int *slot_of,
                      const kg_lora_set_t *sets,
                      float *logits) {
    enum { LEN = 9, MAXB = 2 };
    kg_backend_t *be = make_cpu(m, N_SIDE * MAXB, N_SIDE * LEN);
    int32_t ids[N_ADAPT];
    for (int a = 0; a < N_ADAPT; a++) {
        ids[a] = add_lora(be, loras[a]);
    }
    kg_lora_set_t set[N_SIDE];
    int32_t table[N_SIDE * MAXB], tok[N_SIDE * LEN], pos[N_SIDE * LEN], seq[N_SIDE * LEN];
    bool want[N_SIDE * LEN];
    for (int i = 0; i < n_slots; i++) {
        set[i] = sets[i];
        for (int k = 0; k < set[i].n; k++) {
            set[i].id[k] = ids[sets[i].id[k]]; /* sets name adapters by index */
        }
        const int32_t b0 = i * MAXB;
        table[b0] = b0;
        table[b0 + 1] = b0 + 1;
        for (int t = 0; t < LEN; t++) {
            const int32_t r = i * LEN + t;
            tok[r] = 3 + (slot_of[i] * 37 + t * 11) % 250; /* the prompt goes with the slot's job */
            pos[r] = t;
            seq[r] = i;
            want[r] = t == LEN - 1;
        }
    }
    kg_step_batch_t b = {.n_tokens = n_slots * LEN,
                         .token = tok,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = n_slots,
                         .n_slots = n_slots,
                         .max_blocks_per_seq = MAXB,
                         .block_table = table,
                         .slot_lora = set};
    ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_OK);
    kg_backend_free(be);
}

/* With one adapter per row the adapters' groups run side by side on the
 * pool's threads (cpu_lora_apply); with a row on two they run one after
 * another. Either way a row's logits are bit for bit those it has alone. */
START_TEST(groups_side_by_side) {
    kg_model_t *m = small_base();
    kg_lora_t *loras[N_ADAPT];
    make_adapters(m, loras);
    const int64_t V = m->hp.n_vocab;
    /* adapters of four types (make_adapters: f32, f16, bf16, q8_0 in turn),
     * the base, and one adapter twice */
    kg_lora_set_t sets[N_SIDE] = {{.n = 1, .id = {0}, .scale = {1.0f}},
                                  {.n = 1, .id = {1}, .scale = {0.5f}},
                                  {.n = 0},
                                  {.n = 1, .id = {3}, .scale = {1.0f}},
                                  {.n = 1, .id = {2}, .scale = {1.0f}},
                                  {.n = 1, .id = {0}, .scale = {2.0f}}};
    const int slot_of[N_SIDE] = {0, 1, 2, 3, 4, 5};
    float *together = malloc((size_t)(N_SIDE * V) * sizeof(float));
    float *mixed = malloc((size_t)(N_SIDE * V) * sizeof(float));
    float *alone = malloc((size_t)V * sizeof(float));
    side_step(m, loras, N_SIDE, slot_of, sets, together);
    /* slot 2 on two adapters: the step is no longer one adapter a row */
    kg_lora_set_t two[N_SIDE];
    memcpy(two, sets, sizeof(two));
    two[2] = (kg_lora_set_t){.n = 2, .id = {5, 6}, .scale = {1.0f, 0.5f}};
    side_step(m, loras, N_SIDE, slot_of, two, mixed);
    for (int i = 0; i < N_SIDE; i++) {
        side_step(m, loras, 1, &slot_of[i], &sets[i], alone);
        ck_assert_msg(memcmp(alone, together + i * V, (size_t)V * sizeof(float)) == 0,
                      "slot %d: logits alone and beside other adapters' groups differ", i);
        if (i != 2) {
            ck_assert_msg(memcmp(alone, mixed + i * V, (size_t)V * sizeof(float)) == 0,
                          "slot %d: logits alone and in a step with a two-adapter row differ", i);
        }
    }
    /* and the adapters did something: slot 0's logits are not the base's */
    kg_lora_set_t none = {.n = 0};
    side_step(m, loras, 1, &slot_of[0], &none, alone);
    ck_assert(memcmp(alone, together, (size_t)V * sizeof(float)) != 0);
    free(together);
    free(mixed);
    free(alone);
    for (int a = 0; a < N_ADAPT; a++) {
        kg_lora_free(loras[a]);
    }
    kg_model_free(m);
}
END_TEST

START_TEST(prefix_cache_per_adapter) {
    kg_model_t *m = small_base();
    kg_lora_t *loras[N_ADAPT];
    make_adapters(m, loras);
    static int32_t prompts[N_JOBS][MAX_PROMPT], n_prompt[N_JOBS];
    static int32_t out[N_JOBS][MAX_OUT], n_out[N_JOBS], cached[N_JOBS];
    /* jobs 9 (adapter 0), 1 (adapter 1), 18 (adapter 0), 8 (base), 0
     * (adapters 0 and 3): one prompt */
    const int jobs[] = {9, 1, 18, 8, 0};
    for (size_t i = 0; i < 5; i++) {
        n_prompt[jobs[i]] = 36;
        for (int k = 0; k < 36; k++) {
            prompts[jobs[i]][k] = 3 + (k * 17) % 200;
        }
    }
    engine_run_t r;
    engine_start(&r, m, loras, 4, true);
    for (size_t i = 0; i < 5; i++) {
        run_jobs(&r, (const int32_t(*)[MAX_PROMPT])prompts, n_prompt, jobs[i], jobs[i] + 1, out,
                 n_out, cached);
    }
    engine_stop(&r);
    ck_assert_int_eq(cached[9], 0);
    ck_assert_int_eq(cached[1], 0);   /* another adapter: not adapter 0's blocks */
    ck_assert_int_eq(cached[18], 32); /* adapter 0 again: its two full blocks */
    ck_assert_int_eq(cached[8], 0);   /* the base */
    ck_assert_int_eq(cached[0], 0);   /* adapter 0 with another: another set */
    ck_assert(memcmp(out[9], out[18], sizeof(out[0])) == 0);
    ck_assert(memcmp(out[9], out[1], sizeof(out[0])) != 0);
    for (int a = 0; a < N_ADAPT; a++) {
        kg_lora_free(loras[a]);
    }
    kg_model_free(m);
}
END_TEST

// ---- --lora specs and a job's choice ----

START_TEST(specs) {
    kg_loras_t l;
    char err[256];
    ck_assert_int_eq(kg_loras_parse(&l, "a=/x/a.gguf,b=b.gguf:0.5,c=c:d.gguf", err, sizeof(err)),
                     KG_OK);
    ck_assert_int_eq(l.n, 3);
    ck_assert_str_eq(l.e[0].path, "/x/a.gguf");
    ck_assert_float_eq(l.e[0].scale, 1.0f);
    ck_assert_str_eq(l.e[1].path, "b.gguf");
    ck_assert_float_eq(l.e[1].scale, 0.5f);
    ck_assert_str_eq(l.e[2].path, "c:d.gguf"); /* not a scale after the colon: part of the path */
    ck_assert_ptr_eq(kg_loras_find(&l, "b"), &l.e[1]);
    ck_assert_ptr_null(kg_loras_find(&l, "d"));
    kg_loras_clear(&l);
    const char *bad[] = {"a", "=p", "a=", "a=p,,b=q", "a=p,a=q"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(kg_loras_parse(&l, bad[i], err, sizeof(err)) == KG_ERR_INVALID, "%s", bad[i]);
        kg_loras_clear(&l);
    }
}
END_TEST

static kg_job_t *job_of(const char *json) {
    kg_job_t *job = NULL;
    kg_codec_error_t e;
    ck_assert_msg(kg_codec_decode_job(json, strlen(json), &job, &e) == KG_OK, "%s", e.message);
    return job;
}

START_TEST(job_picks_adapters) {
    kg_model_t *m = small_base();
    kg_loras_t l;
    char err[256];
    ck_assert_int_eq(kg_loras_parse(&l, "sql=a.gguf:0.75,chat=b.gguf", err, sizeof(err)), KG_OK);
    l.e[0].id = 4; /* as the backend numbered them */
    l.e[1].id = 9;
    const char *served[] = {"base"};
    kg_intake_limits_t lim = {
        .max_seq_len = 64, .max_tokens_limit = 100, .served = served, .n_served = 1, .loras = &l};
    struct {
        const char *job;
        kg_error_code_t code; /* KG_ERROR_INTERNAL: accepted */
        int n;
        int32_t id0, id1;
        float s0, s1;
    } cases[] = {
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4}", KG_ERROR_INTERNAL, 0, 0, 0, 0,
         0},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4,\"model\":\"base\"}",
         KG_ERROR_INTERNAL, 0, 0, 0, 0, 0},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4,\"model\":\"sql\"}",
         KG_ERROR_INTERNAL, 1, 4, 0, 0.75f, 0},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4,\"lora\":[{\"name\":\"chat\"},"
         "{\"name\":\"sql\",\"scale\":0.25}]}",
         KG_ERROR_INTERNAL, 2, 9, 4, 1.0f, 0.25f},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4,\"model\":\"sql\",\"lora\":[{"
         "\"name\":\"chat\",\"scale\":2}]}",
         KG_ERROR_INTERNAL, 2, 4, 9, 0.75f, 2.0f},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"model\":\"nope\"}", KG_ERROR_MODEL_NOT_FOUND, 0,
         0, 0, 0, 0},
        {"{\"request_id\":\"a\",\"prompt\":\"x\",\"lora\":[{\"name\":\"nope\"}]}",
         KG_ERROR_MODEL_NOT_FOUND, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_job_t *job = job_of(cases[i].job);
        kg_prepared_t prep;
        kg_error_code_t code = KG_ERROR_INTERNAL;
        char msg[256] = "";
        kg_status_t st = kg_intake_prepare(m, &lim, job, 1, &prep, &code, msg, sizeof(msg));
        if (cases[i].code == KG_ERROR_INTERNAL) {
            ck_assert_msg(st == KG_OK, "case %zu: %s", i, msg);
            ck_assert_int_eq(prep.lora.n, cases[i].n);
            if (cases[i].n > 0) {
                ck_assert_int_eq(prep.lora.id[0], cases[i].id0);
                ck_assert_float_eq(prep.lora.scale[0], cases[i].s0);
            }
            if (cases[i].n > 1) {
                ck_assert_int_eq(prep.lora.id[1], cases[i].id1);
                ck_assert_float_eq(prep.lora.scale[1], cases[i].s1);
            }
        } else {
            ck_assert_int_eq(st, KG_ERR_INVALID);
            ck_assert_int_eq(code, cases[i].code);
            ck_assert_msg(strstr(msg, "nope"), "case %zu: %s", i, msg);
        }
        kg_prepared_clear(&prep);
        kg_job_free(job);
    }
    /* the schema's bounds on the field */
    const char *bad[] = {
        "[]", "[{}]", "[{\"name\":\"\"}]", "[{\"name\":\"a\",\"scale\":\"x\"}]",
        /* five: one too many */
        "[{\"name\":\"a\"},{\"name\":\"a\"},{\"name\":\"a\"},{\"name\":\"a\"},{\"name\":\"a\"}]",
        "{\"name\":\"a\"}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char json[512];
        snprintf(json, sizeof(json), "{\"request_id\":\"a\",\"prompt\":\"x\",\"lora\":%s}", bad[i]);
        kg_job_t *job = NULL;
        kg_codec_error_t e;
        ck_assert_msg(kg_codec_decode_job(json, strlen(json), &job, &e) == KG_ERR_INVALID, "%s",
                      bad[i]);
        ck_assert_msg(strstr(e.message, "lora"), "%s", e.message);
    }
    kg_loras_clear(&l);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    find_goldens();
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("llama_cpp");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, matches_llama_cpp, 0, g_n_files);
    suite_add_tcase(s, tc);
    tc = tcase_create("adapters");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, refuses_mismatches);
    tcase_add_test(tc, backend_without_adapters_refuses);
    tcase_add_test(tc, mklora_q8_0_small_rank);
    tcase_add_test(tc, batch_invariant);
    tcase_add_test(tc, groups_side_by_side);
    tcase_add_test(tc, prefix_cache_per_adapter);
    tcase_add_test(tc, specs);
    tcase_add_test(tc, job_picks_adapters);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
