/* check_arch: every supported architecture against llama.cpp.
 *
 * tests/data/arch holds golden files made by scripts/goldens/arch-goldens.mjs
 * with llama.cpp (node-llama-cpp; see the README there): for a random-weight
 * model of each family and weight type, the prompt's ids, llama.cpp's logits
 * after the prompt and after its greedy continuation, and the greedy ids.
 * Each test remakes the model with `kgen mkmodel` and the arguments the
 * golden records (its bytes must hash as the golden says), then checks
 * kgen's tokenizer, its logits (NMSE) and its greedy ids (equal) on the CPU
 * backend, prefill in one step and decode one token per step. The
 * tokenizer goldens compare each built-in vocabulary's tokenization of a
 * set of strings. The batch test runs every family's model through the
 * engine: each job alone and the same jobs 16 at a time give the same ids. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_engine.h"
#include "model/kg_model.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GOLDENS 192
#define MAX_IDS     512
#define CTX         512   /* the goldens' context (phi3 picks its LongRoPE factors by it) */
#define MAX_CTX     16384 /* a golden's own context (`context N`: llama4-long's 8704) */
#define BLOCK       16

// ---- golden files ----

static char g_files[MAX_GOLDENS][256]; /* model goldens: "<model>.<type>.golden" */
static int g_n_files;
static char g_tok_files[16][256]; /* "tokenizer-<model>.golden" */
static int g_n_tok_files;

/* KG_ARCH_ONLY=a,b,...: only the goldens of those models (a new family's
 * rows checked alone). */
static bool model_selected(const char *file) {
    const char *only = getenv("KG_ARCH_ONLY");
    if (!only || !*only) {
        return true;
    }
    const char *start = strncmp(file, "tokenizer-", 10) == 0 ? file + 10 : file;
    const char *dot = strchr(start, '.');
    const size_t len = dot ? (size_t)(dot - start) : strlen(start);
    for (const char *p = only; *p;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && strncmp(p, start, n) == 0) {
            return true;
        }
        p += n + (comma ? 1 : 0);
    }
    return false;
}

/* KG_ARCH_TYPES=f32,...: only the model goldens of those weight types (the
 * sanitizer run takes f32 alone: the quantized types' kernels have their
 * own tests, and every family's graph runs in f32). */
static bool type_selected(const char *file) {
    const char *types = getenv("KG_ARCH_TYPES");
    const char *dot = strchr(file, '.');
    if (!types || !*types || strncmp(file, "tokenizer-", 10) == 0 || !dot) {
        return true;
    }
    const char *end = strchr(dot + 1, '.');
    const size_t len = end ? (size_t)(end - dot - 1) : strlen(dot + 1);
    for (const char *p = types; *p;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && strncmp(p, dot + 1, n) == 0) {
            return true;
        }
        p += n + (comma ? 1 : 0);
    }
    return false;
}

static void find_goldens(void) {
    DIR *d = opendir(kg_test_data("arch"));
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 8 || strcmp(de->d_name + n - 7, ".golden") != 0 || n >= 256 ||
            !model_selected(de->d_name) || !type_selected(de->d_name)) {
            continue;
        }
        if (strncmp(de->d_name, "tokenizer-", 10) == 0) {
            if (g_n_tok_files < 16) {
                snprintf(g_tok_files[g_n_tok_files++], 256, "%s", de->d_name);
            }
        } else if (g_n_files < MAX_GOLDENS) {
            snprintf(g_files[g_n_files++], 256, "%s", de->d_name);
        }
    }
    if (d) {
        closedir(d);
    }
    qsort(g_files, (size_t)g_n_files, sizeof(g_files[0]), kg_test_cmp_name);
    qsort(g_tok_files, (size_t)g_n_tok_files, sizeof(g_tok_files[0]), kg_test_cmp_name);
}

#define MAX_PROMPTS 3 /* a short one, one past every window, and (hybrids) a multi-turn chat */

typedef struct golden_prompt {
    char *text;              /* owned */
    bool special;            /* the chat prompt: tokenized with special tokens parsed */
    int32_t *input, n_input; /* owned */
    int32_t ids[64], n_ids;
    int32_t second[64];         /* llama.cpp's runner-up at each step */
    float margin[64];           /* its logit margin: top minus runner-up */
    float *logits, *logits_end; /* (n_vocab) */
    int32_t n_logits;
} golden_prompt_t;

typedef struct golden {
    char model[64], type[32];
    uint64_t fnv;
    char args[1024]; /* kgen mkmodel arguments */
    int32_t ctx;     /* the context llama.cpp ran in (CTX unless a `context` line says) */
    golden_prompt_t p[MAX_PROMPTS];
    int n_prompts;
} golden_t;

/* A JSON string (as JSON.stringify writes it) into NUL-terminated UTF-8. */
static bool parse_json_string(const char *s, char *out, size_t cap) {
    size_t n = 0;
    if (*s++ != '"') {
        return false;
    }
    while (*s && *s != '"' && n + 4 < cap) {
        if (*s != '\\') {
            out[n++] = *s++;
            continue;
        }
        s++;
        char c = *s++;
        switch (c) {
        case 'n':
            out[n++] = '\n';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'u': {
            unsigned cp = 0;
            if (sscanf(s, "%4x", &cp) != 1) {
                return false;
            }
            s += 4;
            if (cp < 0x80) {
                out[n++] = (char)cp;
            } else if (cp < 0x800) {
                out[n++] = (char)(0xC0 | (cp >> 6));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[n++] = (char)(0xE0 | (cp >> 12));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            out[n++] = c;
        }
    }
    out[n] = '\0';
    return *s == '"';
}

static void golden_load(const char *file, golden_t *g) {
    char rel[300];
    snprintf(rel, sizeof(rel), "arch/%s", file);
    size_t len;
    char *text = kg_test_read_file(kg_test_data(rel), &len);
    ck_assert_msg(text != NULL, "cannot read %s", rel);
    memset(g, 0, sizeof(*g));
    g->ctx = CTX;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int idx = 0, off = 0;
        if (strncmp(line, "# kgen mkmodel ", 15) == 0) {
            snprintf(g->args, sizeof(g->args), "%s", line + 15);
        } else if (strncmp(line, "model ", 6) == 0) {
            unsigned long long h = 0;
            ck_assert_int_eq(sscanf(line, "model %63s %31s fnv64 %llx", g->model, g->type, &h), 3);
            g->fnv = h;
        } else if (sscanf(line, "context %d", &g->ctx) == 1) {
            ck_assert(g->ctx >= CTX && g->ctx <= MAX_CTX && g->ctx % BLOCK == 0);
        } else if (sscanf(line, "prompt %d %n", &idx, &off) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            const size_t cap = strlen(line + off) + 8; /* parse_json_string keeps 4 spare */
            free(g->p[idx].text);
            g->p[idx].text = malloc(cap);
            ck_assert(g->p[idx].text && parse_json_string(line + off, g->p[idx].text, cap));
            g->n_prompts = idx + 1 > g->n_prompts ? idx + 1 : g->n_prompts;
        } else if (sscanf(line, "special %d", &idx) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            g->p[idx].special = true;
        } else if (sscanf(line, "input %d %n", &idx, &off) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            int32_t n = 1; /* ids: one more than the spaces */
            for (const char *c = line + off; *c; c++) {
                n += *c == ' ';
            }
            free(g->p[idx].input);
            g->p[idx].input = malloc((size_t)n * sizeof(int32_t));
            ck_assert_ptr_nonnull(g->p[idx].input);
            g->p[idx].n_input = kg_test_parse_ids(line + off, g->p[idx].input, n);
        } else if (sscanf(line, "ids %d %n", &idx, &off) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            g->p[idx].n_ids = kg_test_parse_ids(line + off, g->p[idx].ids, 64);
        } else if (sscanf(line, "second %d %n", &idx, &off) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            const char *q = line + off;
            int k = 0, used = 0;
            while (k < 64 &&
                   sscanf(q, "%d:%f%n", &g->p[idx].second[k], &g->p[idx].margin[k], &used) == 2) {
                q += used;
                k++;
            }
        } else if (sscanf(line, "logits_end %d %n", &idx, &off) == 1 && idx >= 0 &&
                   idx < MAX_PROMPTS) {
            g->p[idx].logits_end = kg_test_parse_floats(line + off, &g->p[idx].n_logits);
        } else if (sscanf(line, "logits %d %n", &idx, &off) == 1 && idx >= 0 && idx < MAX_PROMPTS) {
            g->p[idx].logits = kg_test_parse_floats(line + off, &g->p[idx].n_logits);
        }
    }
    free(text);
    ck_assert_msg(g->args[0] && g->model[0] && g->n_prompts >= 2, "%s is incomplete", rel);
    for (int p = 0; p < g->n_prompts; p++) {
        ck_assert_msg(g->p[p].text && g->p[p].n_input > 0 && g->p[p].n_input < g->ctx - 64 &&
                          g->p[p].logits && g->p[p].logits_end,
                      "%s: prompt %d is incomplete", rel, p);
    }
}

static void golden_clear(golden_t *g) {
    for (int i = 0; i < MAX_PROMPTS; i++) {
        free(g->p[i].logits);
        free(g->p[i].logits_end);
        free(g->p[i].text);
        free(g->p[i].input);
    }
}

// ---- models ----

/* `kgen mkmodel --out <tmp> <args>`, in process; the path (static). */
static const char *make_model(const char *args) {
    static char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("arch"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    return path;
}

static kg_model_t *load_golden_model(const golden_t *g) {
    const char *path = make_model(g->args);
    ck_assert_msg(kg_test_fnv64_file(path) == g->fnv,
                  "%s %s: kgen mkmodel wrote a different file than the golden's (FNV %016llx, "
                  "golden %016llx): the generator changed; remake the goldens",
                  g->model, g->type, (unsigned long long)kg_test_fnv64_file(path),
                  (unsigned long long)g->fnv);
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    return m;
}

static kg_backend_t *
make_cpu_ctx(const kg_model_t *m, int32_t n_blocks, int32_t max_tokens, int32_t ctx) {
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = n_blocks,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = max_tokens,
                             .max_seq_len = ctx};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    return be;
}

static kg_backend_t *make_cpu(const kg_model_t *m, int32_t n_blocks, int32_t max_tokens) {
    return make_cpu_ctx(m, n_blocks, max_tokens, CTX);
}

/* NMSE bound of the logits against llama.cpp's: both sides compute the same
 * products; the sums run in other orders (and ggml's SIMD exp/silu are
 * approximations), so the error is a few float roundings, more where
 * activations are rounded to fp16 or Q8 blocks (a rounding of an input near
 * a rounding boundary can go either way). */
/* A greedy step may go the other way only at a near-tie: kgen's pick is
 * llama.cpp's runner-up, and llama.cpp's margin between the two is below
 * this, about twice the RMS logit error the NMSE bound allows (the models'
 * logits have a spread of about 1). */
// ---- the golden test ----

START_TEST(matches_llama_cpp) {
    golden_t g;
    golden_load(g_files[_i], &g);
    kg_model_t *m = load_golden_model(&g);
    const int32_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    for (int p = 0; p < g.n_prompts; p++) {
        const golden_prompt_t *gp = &g.p[p];
        ck_assert_int_eq(gp->n_logits, V);
        /* the tokenizer: BOS as the vocabulary asks, then the prompt */
        const int32_t C = g.ctx, NB = C / BLOCK;
        int32_t *ids = malloc((size_t)C * sizeof(int32_t));
        ck_assert_ptr_nonnull(ids);
        int64_t n =
            kg_tokenizer_encode(m->tok, gp->text, strlen(gp->text), true, gp->special, ids, C);
        ck_assert_msg(n == gp->n_input && memcmp(ids, gp->input, (size_t)n * 4) == 0,
                      "%s %s prompt %d: kgen tokenizes to %lld ids, llama.cpp to %d", g.model,
                      g.type, p, (long long)n, gp->n_input);
        free(ids);

        /* prefill in one step, then one token per step */
        kg_backend_t *be = make_cpu_ctx(m, NB, C, C);
        static int32_t table[MAX_CTX / BLOCK];
        for (int32_t b = 0; b < NB; b++) {
            table[b] = NB - 1 - b; /* out of order on purpose */
        }
        static int32_t pos[MAX_CTX], seq[MAX_CTX];
        static bool want[MAX_CTX];
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
                             .max_blocks_per_seq = NB,
                             .block_table = table};
        ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_OK);
        double e = kg_test_nmse(gp->logits, logits, V);
        if (getenv("KG_ARCH_VERBOSE")) {
            fprintf(stderr, "%s %s prompt %d: nmse %.3g", g.model, g.type, p, e);
        }
        ck_assert_msg(e < kg_test_nmse_bound(g.type), "%s %s prompt %d: logits nmse %g >= %g",
                      g.model, g.type, p, e, kg_test_nmse_bound(g.type));
        int32_t n_pos = gp->n_input;
        bool tied = false;
        for (int32_t k = 0; k <= gp->n_ids; k++) {
            int32_t next = kg_test_argmax(logits, V);
            if (k == gp->n_ids) {
                /* llama.cpp stopped early: it sampled an end-of-generation token */
                ck_assert_msg(gp->n_ids == 24 || kg_tokenizer_is_eog(m->tok, next),
                              "%s %s prompt %d: llama.cpp stopped after %d ids, kgen goes on "
                              "with %d",
                              g.model, g.type, p, gp->n_ids, next);
                break;
            }
            if (next != gp->ids[k]) {
                ck_assert_msg(next == gp->second[k] && gp->margin[k] < kg_test_tie_bound(g.type),
                              "%s %s prompt %d: id %d is %d, llama.cpp's %d (its runner-up %d, "
                              "margin %g)",
                              g.model, g.type, p, k, next, gp->ids[k], gp->second[k],
                              (double)gp->margin[k]);
                /* a near-tie: the continuations differ from here on */
                fprintf(stderr,
                        "check_arch: %s %s prompt %d: id %d is llama.cpp's runner-up %d at a "
                        "near-tie (margin %g); ids compared up to there\n",
                        g.model, g.type, p, k, next, (double)gp->margin[k]);
                tied = true;
                break;
            }
            int32_t tok = gp->ids[k], ps = n_pos++, sq = 0;
            bool w = true;
            kg_step_batch_t d = b;
            d.n_tokens = 1;
            d.token = &tok;
            d.pos = &ps;
            d.seq = &sq;
            d.want_logits = &w;
            ck_assert_int_eq(kg_backend_forward(be, &d, logits), KG_OK);
        }
        if (!tied) {
            e = kg_test_nmse(gp->logits_end, logits, V);
            if (getenv("KG_ARCH_VERBOSE")) {
                fprintf(stderr, ", after %d ids %.3g\n", gp->n_ids, e);
            }
            ck_assert_msg(e < kg_test_nmse_bound(g.type),
                          "%s %s prompt %d: logits after the ids: nmse %g", g.model, g.type, p, e);
        }
        kg_backend_free(be);
    }
    free(logits);
    kg_model_free(m);
    golden_clear(&g);
}
END_TEST

// ---- tokenizers ----

START_TEST(tokenizer_matches_llama_cpp) {
    char rel[300];
    snprintf(rel, sizeof(rel), "arch/%s", g_tok_files[_i]);
    size_t len;
    char *text = kg_test_read_file(kg_test_data(rel), &len);
    ck_assert_ptr_nonnull(text);
    /* the model: the first model golden of the same name gives the args */
    char name[64];
    snprintf(name, sizeof(name), "%s", g_tok_files[_i] + 10);
    *strstr(name, ".golden") = '\0';
    golden_t g;
    bool found = false;
    for (int i = 0; i < g_n_files && !found; i++) {
        golden_load(g_files[i], &g);
        found = strcmp(g.model, name) == 0;
        if (!found) {
            golden_clear(&g);
        }
    }
    ck_assert_msg(found, "no model golden for %s", name);
    kg_model_t *m = load_golden_model(&g);
    golden_clear(&g);
    char s[1024] = "";
    int n_checked = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        bool plain = strncmp(line, "plain", 5) == 0, special = strncmp(line, "special", 7) == 0;
        if (strncmp(line, "eog ", 4) == 0) {
            /* the end-of-generation set: exactly llama.cpp's */
            int32_t eog[64];
            int32_t n_eog = kg_test_parse_ids(line + 4, eog, 64), n_kgen = 0;
            for (int32_t id = 0; id < m->hp.n_vocab; id++) {
                if (kg_tokenizer_is_eog(m->tok, id)) {
                    ck_assert_msg(n_kgen < n_eog && eog[n_kgen] == id,
                                  "%s: kgen ends generation at %d, llama.cpp does not", name, id);
                    n_kgen++;
                }
            }
            ck_assert_int_eq(n_kgen, n_eog);
            n_checked++;
        } else if (strncmp(line, "bos ", 4) == 0) {
            int bos = 0, add_bos = 0;
            ck_assert_int_eq(sscanf(line, "bos %d add_bos %d", &bos, &add_bos), 2);
            ck_assert_int_eq(kg_tokenizer_bos(m->tok), bos);
            ck_assert_int_eq(kg_tokenizer_add_bos(m->tok), add_bos);
        } else if (strncmp(line, "text ", 5) == 0) {
            ck_assert(parse_json_string(line + 5, s, sizeof(s)));
        } else if (plain || special) {
            int32_t want[MAX_IDS], got[MAX_IDS];
            int32_t n_want = kg_test_parse_ids(line + (plain ? 5 : 7), want, MAX_IDS);
            int64_t n = kg_tokenizer_encode(m->tok, s, strlen(s), false, special, got, MAX_IDS);
            ck_assert_msg(n == n_want && memcmp(got, want, (size_t)n * 4) == 0,
                          "%s: \"%s\" (%s): kgen %lld ids, llama.cpp %d", name, s,
                          special ? "special" : "plain", (long long)n, n_want);
            n_checked++;
        }
    }
    ck_assert_int_gt(n_checked, 20);
    free(text);
    kg_model_free(m);
}
END_TEST

// ---- batch invariance ----

#define N_JOBS 16

/* Run the jobs through the engine `batch` at a time; ids into out. */
static void run_engine(kg_model_t *m,
                       const int32_t (*prompts)[64],
                       const int32_t *n_prompt,
                       int n_jobs,
                       int batch,
                       int32_t (*out)[32],
                       int32_t *n_out) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = batch;
    ep.max_batch_tokens = 48; /* prompts are chunked over steps */
    ep.max_seq_len = 128;
    ep.kv_block_size = BLOCK;
    ep.n_kv_blocks = N_JOBS * 128 / BLOCK;
    kg_backend_t *be = make_cpu(m, ep.n_kv_blocks, ep.max_batch_tokens);
    char err[256];
    kg_engine_t *e = kg_engine_new(be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    const int32_t cap = kg_engine_max_completions(e);
    kg_completion_t *comps = malloc((size_t)cap * sizeof(*comps));
    ck_assert_ptr_nonnull(comps);
    for (int i = 0; i < n_jobs; i++) {
        n_out[i] = 0;
    }
    for (int start = 0; start < n_jobs; start += batch) {
        for (int i = start; i < start + batch && i < n_jobs; i++) {
            kg_request_t r = {.id = (uint64_t)i + 1,
                              .prompt = prompts[i],
                              .n_prompt = n_prompt[i],
                              .max_tokens = 24,
                              .ignore_eos = true,
                              .sampling = kg_sampling_params_default()};
            ck_assert_int_eq(kg_engine_submit(e, &r), KG_OK);
        }
        while (kg_engine_busy(e)) {
            int32_t n = kg_engine_step(e, comps, cap);
            ck_assert_int_ge(n, 0);
            for (int32_t c = 0; c < n; c++) {
                int j = (int)comps[c].id - 1;
                if (comps[c].token >= 0) {
                    out[j][n_out[j]++] = comps[c].token;
                }
            }
        }
    }
    free(comps);
    kg_engine_free(e);
    kg_backend_free(be);
}

START_TEST(batch_invariant) {
    golden_t g;
    golden_load(g_files[_i], &g);
    if (strcmp(g.type, "f32") != 0) {
        golden_clear(&g);
        return; /* one model per family */
    }
    kg_model_t *m = load_golden_model(&g);
    static int32_t prompts[N_JOBS][64], n_prompt[N_JOBS];
    static int32_t alone[N_JOBS][32], batched[N_JOBS][32], n_alone[N_JOBS], n_batched[N_JOBS];
    /* windows of the long golden prompt: shared starts, lengths 5..64 */
    const golden_prompt_t *gp = &g.p[1];
    for (int i = 0; i < N_JOBS; i++) {
        n_prompt[i] = 5 + (i * 37) % 60;
        for (int32_t k = 0; k < n_prompt[i]; k++) {
            prompts[i][k] = gp->input[(k + (i % 3) * 7) % gp->n_input];
        }
    }
    /* under a sanitizer, the first jobs alone: the same code at batch size 1 sixteen times
     * over is minutes there, and the release run compares all sixteen */
#ifdef KG_TEST_SANITIZED
    const int n_alone_jobs = 4;
#else
    const int n_alone_jobs = N_JOBS;
#endif
    run_engine(m, (const int32_t(*)[64])prompts, n_prompt, n_alone_jobs, 1, alone, n_alone);
    run_engine(m, (const int32_t(*)[64])prompts, n_prompt, N_JOBS, N_JOBS, batched, n_batched);
    for (int i = 0; i < N_JOBS; i++) {
        ck_assert_int_eq(n_batched[i], 24);
    }
    for (int i = 0; i < n_alone_jobs; i++) {
        ck_assert_int_eq(n_alone[i], 24);
        ck_assert_msg(memcmp(alone[i], batched[i], 24 * 4) == 0,
                      "%s: job %d differs alone and in a batch of %d", g.model, i, N_JOBS);
    }
    kg_model_free(m);
    golden_clear(&g);
}
END_TEST

/* One job (n_choices choices, greedy) through the engine with prefill
 * chunks of `chunk` tokens; each choice's ids into out, the engine's
 * counters into st. */
static void run_chunked(kg_model_t *m,
                        const int32_t *prompt,
                        int32_t n_prompt,
                        int32_t chunk,
                        int32_t n_choices,
                        int32_t (*out)[32],
                        int32_t *n_out,
                        kg_engine_stats_t *st) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = 4;
    ep.max_batch_tokens = chunk;
    ep.max_seq_len = 128;
    ep.kv_block_size = BLOCK;
    ep.n_kv_blocks = 4 * 128 / BLOCK;
    kg_backend_t *be = make_cpu(m, ep.n_kv_blocks, ep.max_batch_tokens);
    char err[256];
    kg_engine_t *e = kg_engine_new(be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    const int32_t cap = kg_engine_max_completions(e);
    kg_completion_t *comps = malloc((size_t)cap * sizeof(*comps));
    ck_assert_ptr_nonnull(comps);
    kg_request_t r = {.id = 1,
                      .prompt = prompt,
                      .n_prompt = n_prompt,
                      .max_tokens = 24,
                      .ignore_eos = true,
                      .n_choices = n_choices,
                      .sampling = kg_sampling_params_default()};
    ck_assert_int_eq(kg_engine_submit(e, &r), KG_OK);
    for (int c = 0; c < n_choices; c++) {
        n_out[c] = 0;
    }
    while (kg_engine_busy(e)) {
        int32_t n = kg_engine_step(e, comps, cap);
        ck_assert_int_ge(n, 0);
        for (int32_t c = 0; c < n; c++) {
            ck_assert_int_ne(comps[c].finish, KG_FINISH_ERROR);
            if (comps[c].token >= 0) {
                out[comps[c].choice][n_out[comps[c].choice]++] = comps[c].token;
            }
        }
    }
    kg_engine_stats(e, st);
    free(comps);
    kg_engine_free(e);
    kg_backend_free(be);
}

/* A hybrid model's recurrent state makes the cut of a prompt into prefill
 * chunks and the fork of n choices visible unless the state is carried
 * exactly: one job prefilled in chunks of 7, 64 and 512 tokens says the
 * same ids, and 3 greedy choices (forked from the state before the
 * prompt's last token, not recomputed) each say them too. */
START_TEST(recurrent_chunks_and_forks) {
    golden_t g;
    golden_load(g_files[_i], &g);
    kg_model_t *m = load_golden_model(&g);
    if (strcmp(g.type, "f32") != 0 || !kg_model_is_recurrent(m)) {
        kg_model_free(m);
        golden_clear(&g);
        return;
    }
    const golden_prompt_t *gp = &g.p[1];
    const int32_t n = gp->n_input < 64 ? gp->n_input : 64;
    int32_t ref[3][32], got[3][32], n_ref[3], n_got[3];
    kg_engine_stats_t st;
    const int32_t chunks[] = {7, 64, 512};
    run_chunked(m, gp->input, n, 48, 1, ref, n_ref, &st);
    ck_assert_int_eq(n_ref[0], 24);
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        run_chunked(m, gp->input, n, chunks[c], 1, got, n_got, &st);
        ck_assert_msg(n_got[0] == 24 && memcmp(ref[0], got[0], 24 * 4) == 0,
                      "%s: prefill in chunks of %d differs from chunks of 48", g.model, chunks[c]);
    }
    run_chunked(m, gp->input, n, 48, 3, got, n_got, &st);
    ck_assert_int_eq(st.n_forks, 2);
    /* the prompt is prefilled once (the leader's last token after the
     * fork); each choice computes that token as its first decode row */
    ck_assert_int_eq(st.n_prefill_tokens, n);
    for (int c = 0; c < 3; c++) {
        ck_assert_msg(n_got[c] == 24 && memcmp(ref[0], got[c], 24 * 4) == 0,
                      "%s: choice %d of 3 differs from the job alone", g.model, c);
    }
    /* the backend's contract: a slot's tokens continue its state in order
     * (within a step and from one step to the next), or that slot alone
     * fails; position 0 starts it over */
    kg_backend_t *be = make_cpu(m, 8, 64);
    int32_t pos[4], seq[4] = {0, 0, 0, 0}, table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    bool want[4] = {false, false, false, false};
    kg_step_batch_t b = {.token = gp->input,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_slots = 2,
                         .max_blocks_per_seq = 4,
                         .block_table = table};
    const int32_t steps[][4] = {{0, 1, 2, -1}, {3, -1}, {5, -1}, {4, 5, 7, -1}, {0, -1}};
    const kg_status_t expect[] = {KG_OK, KG_OK, KG_ERR_INVALID, KG_ERR_INVALID, KG_OK};
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        for (b.n_tokens = 0; steps[k][b.n_tokens] >= 0; b.n_tokens++) {
            pos[b.n_tokens] = steps[k][b.n_tokens];
        }
        ck_assert_int_eq(kg_backend_forward(be, &b, NULL), expect[k]);
        if (expect[k] != KG_OK) {
            kg_backend_fault_t f;
            kg_backend_last_fault(be, expect[k], &f);
            ck_assert_int_eq(f.scope, KG_FAULT_SEQ);
            ck_assert_int_eq(f.seq, 0);
        }
    }
    kg_backend_free(be);
    kg_model_free(m);
    golden_clear(&g);
}
END_TEST

#define SYS_LEN  400 /* the shared system prompt: 25 blocks */
#define TAIL_LEN 9
#define N_SYS    16

/* The jobs of recurrent_prefix_cache through one engine: `together` (all
 * submitted at once) or one after another; each job's 8 ids into out. */
static void run_system_prompt(kg_model_t *m,
                              const int32_t (*prompts)[SYS_LEN + TAIL_LEN],
                              bool cache,
                              bool together,
                              int32_t (*out)[8],
                              kg_engine_stats_t *st) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = N_SYS;
    ep.max_batch_tokens = 512;
    ep.max_seq_len = CTX;
    ep.kv_block_size = BLOCK;
    ep.n_kv_blocks = N_SYS * CTX / BLOCK;
    ep.prefix_cache = cache;
    ep.n_state_snapshots = N_SYS;
    kg_backend_params_t bp = {.n_threads = 2,
                              .n_kv_blocks = ep.n_kv_blocks,
                              .kv_block_size = BLOCK,
                              .max_batch_tokens = ep.max_batch_tokens,
                              .max_seq_len = CTX,
                              .n_seq_slots = N_SYS,
                              .n_state_snapshots = N_SYS};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert_int_eq(kg_backend_state_snapshots(be), N_SYS);
    kg_engine_t *e = kg_engine_new(be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    const int32_t cap = kg_engine_max_completions(e);
    kg_completion_t *comps = malloc((size_t)cap * sizeof(*comps));
    ck_assert_ptr_nonnull(comps);
    int32_t n_out[N_SYS] = {0};
    for (int i = 0; i < N_SYS; i++) {
        kg_request_t r = {.id = (uint64_t)i + 1,
                          .prompt = prompts[i],
                          .n_prompt = SYS_LEN + TAIL_LEN,
                          .max_tokens = 8,
                          .ignore_eos = true,
                          .sampling = kg_sampling_params_default()};
        ck_assert_int_eq(kg_engine_submit(e, &r), KG_OK);
        while (kg_engine_busy(e) && (!together || i == N_SYS - 1)) {
            int32_t n = kg_engine_step(e, comps, cap);
            ck_assert_int_ge(n, 0);
            for (int32_t c = 0; c < n; c++) {
                ck_assert_int_ne(comps[c].finish, KG_FINISH_ERROR);
                const int j = (int)comps[c].id - 1;
                if (comps[c].token >= 0) {
                    out[j][n_out[j]++] = comps[c].token;
                }
            }
        }
    }
    for (int i = 0; i < N_SYS; i++) {
        ck_assert_int_eq(n_out[i], 8);
    }
    kg_engine_stats(e, st);
    free(comps);
    kg_engine_free(e);
    kg_backend_free(be);
}

/* A hybrid's prefix cache (kg_engine_state.c): 16 jobs that share a
 * 400-token system prompt, sent together, compute it once (the first job
 * stops its prefill at the shared part's end and saves its state there; the
 * others wait for it, then restore it) and say what they say with the
 * cache off. Sent one after another, the second finds the first's cached
 * blocks but no saved state: it computes them and saves the state at
 * their end, and the 14 after it restore it. */
START_TEST(recurrent_prefix_cache) {
    golden_t g;
    golden_load(g_files[_i], &g);
    kg_model_t *m = load_golden_model(&g);
    if (strcmp(g.type, "f32") != 0 || !kg_model_is_recurrent(m)) {
        kg_model_free(m);
        golden_clear(&g);
        return;
    }
    static int32_t prompts[N_SYS][SYS_LEN + TAIL_LEN];
    static int32_t off[N_SYS][8], on[N_SYS][8];
    const int32_t V = m->hp.n_vocab;
    for (int i = 0; i < N_SYS; i++) {
        for (int k = 0; k < SYS_LEN; k++) {
            prompts[i][k] = (int32_t)((k * 7919 + 13) % V);
        }
        for (int k = 0; k < TAIL_LEN; k++) {
            prompts[i][SYS_LEN + k] = (int32_t)((i * 131 + k * 17 + 5) % V);
        }
    }
    kg_engine_stats_t st;
    run_system_prompt(m, (const int32_t(*)[SYS_LEN + TAIL_LEN]) prompts, false, true, off, &st);
    ck_assert_int_eq(st.n_prefill_tokens, N_SYS * (SYS_LEN + TAIL_LEN));
    ck_assert_int_eq(st.n_state_saves, 0);
    for (int together = 1; together >= 0; together--) {
        run_system_prompt(m, (const int32_t(*)[SYS_LEN + TAIL_LEN]) prompts, true, together, on,
                          &st);
        const int32_t n_full = together ? 1 : 2; /* jobs that compute the system prompt */
        ck_assert_msg(st.n_prefill_tokens == n_full * SYS_LEN + N_SYS * TAIL_LEN,
                      "%s together=%d: %lld tokens prefilled", g.model, together,
                      (long long)st.n_prefill_tokens);
        ck_assert_int_eq(st.n_state_restores, N_SYS - n_full);
        ck_assert_int_eq(st.n_prefix_hit_tokens, (int64_t)(N_SYS - n_full) * SYS_LEN);
        for (int i = 0; i < N_SYS; i++) {
            ck_assert_msg(memcmp(off[i], on[i], sizeof(off[i])) == 0,
                          "%s together=%d: job %d differs with the prefix cache", g.model, together,
                          i);
        }
    }
    kg_model_free(m);
    golden_clear(&g);
}
END_TEST

/* A model whose every layer is windowed (gemma3-swa, window 32) reads no
 * block before the window: with those entries -1 (given back by the engine)
 * the logits are the same bits; a missing block inside the window is
 * refused, not read. */
START_TEST(window_reads_only_the_window) {
    golden_t g;
    bool found = false;
    if (!model_selected("gemma3-swa.f32.golden")) {
        return; /* KG_ARCH_ONLY left it out */
    }
    for (int i = 0; i < g_n_files && !found; i++) {
        golden_load(g_files[i], &g);
        found = strcmp(g.model, "gemma3-swa") == 0 && strcmp(g.type, "f32") == 0;
        if (!found) {
            golden_clear(&g);
        }
    }
    ck_assert(found);
    kg_model_t *m = load_golden_model(&g);
    ck_assert_int_eq(kg_model_kv_window(m), 32);
    const int32_t V = m->hp.n_vocab, n = 61; /* positions 0..60: the window is 29..60 */
    ck_assert_int_ge(g.p[1].n_input, n);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    int32_t pos[64], seq[64];
    bool want[64];
    for (int32_t i = 0; i < n; i++) {
        pos[i] = i;
        seq[i] = 0;
        want[i] = false;
    }
    for (int variant = 0; variant < 3; variant++) {
        kg_backend_t *be = make_cpu(m, 8, 64);
        int32_t table[4] = {3, 0, 6, 1};
        kg_step_batch_t batch = {.n_tokens = n - 1,
                                 .token = g.p[1].input,
                                 .pos = pos,
                                 .seq = seq,
                                 .want_logits = want,
                                 .n_outputs = 0,
                                 .n_slots = 1,
                                 .max_blocks_per_seq = 4,
                                 .block_table = table};
        ck_assert_int_eq(kg_backend_forward(be, &batch, NULL), KG_OK);
        /* the last token alone, after the engine gave back block 0 (and,
         * wrongly, block 1 in variant 2) */
        if (variant >= 1) {
            table[0] = -1;
        }
        if (variant == 2) {
            table[1] = -1;
        }
        bool w = true;
        kg_step_batch_t d = batch;
        d.n_tokens = 1;
        d.token = g.p[1].input + n - 1;
        d.pos = pos + n - 1;
        d.want_logits = &w;
        d.n_outputs = 1;
        kg_status_t st = kg_backend_forward(be, &d, variant == 0 ? a : b);
        ck_assert_int_eq(st, variant == 2 ? KG_ERR_INVALID : KG_OK);
        kg_backend_free(be);
    }
    ck_assert_mem_eq(a, b, (size_t)V * sizeof(float));
    free(a);
    free(b);
    kg_model_free(m);
    golden_clear(&g);
}
END_TEST

static Suite *make_suite(void) {
    find_goldens();
    Suite *s = suite_create("arch");
    TCase *tc = tcase_create("llama_cpp");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, matches_llama_cpp, 0, g_n_files);
    tcase_add_loop_test(tc, tokenizer_matches_llama_cpp, 0, g_n_tok_files);
    suite_add_tcase(s, tc);
    tc = tcase_create("batch");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, batch_invariant, 0, g_n_files);
    tcase_add_test(tc, window_reads_only_the_window);
    tcase_add_loop_test(tc, recurrent_chunks_and_forks, 0, g_n_files);
    tcase_add_loop_test(tc, recurrent_prefix_cache, 0, g_n_files);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
