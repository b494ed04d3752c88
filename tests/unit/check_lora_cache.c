/* check_lora_cache: --lora-dir and --max-loras. The engine holds at most
 * max_resident adapters in the backend: the least recently used one that
 * no running sequence uses is evicted to load another (one no waiting
 * sequence uses first); with every one in use, a sequence for another
 * waits, failing nothing, until a running one ends. A job's ids are the
 * same before and after its adapter was evicted and loaded again (alone or
 * beside others, one adapter or two). A directory's file is read on its
 * first job: a corrupt or mismatched one answers that job and is read
 * again next time; names that are not plain file names are nobody's. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_adapters.h"
#include "engine/kg_engine.h"
#include "fakes/fake_backend.h"
#include "model/kg_lora.h"
#include "model/kg_mklora.h"
#include "model/kg_model.h"
#include "pipeline/kg_intake.h"
#include "pipeline/kg_loras.h"
#include "schema/kg_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BASE_ARGS  "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --seed 5"
#define OTHER_ARGS "--n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 64 --seed 6"
#define N_AD       4
#define MAX_OUT    10
#define BLOCK      16

/* kgen mkmodel --lora --base base --out out <args>, in process. */
static void make_lora(const char *base, const char *out, const char *args) {
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", args);
    char *argv[32] = {"mkmodel", "--lora", "--base", (char *)base, "--out", (char *)out};
    int argc = 6;
    for (char *save = NULL, *t = strtok_r(copy, " ", &save); t && argc < 31;
         t = strtok_r(NULL, " ", &save)) {
        argv[argc++] = t;
    }
    kg_mklora_opts_t o;
    char err[512];
    ck_assert_msg(kg_mklora_parse_args(argc, argv, &o, err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(kg_mklora_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
}

typedef struct fixture {
    char base[4096];
    kg_model_t *m;
    kg_lora_t *lora[N_AD];
} fixture_t;

/* The base and N_AD adapters of mixed types for it. */
static void fixture_init(fixture_t *f) {
    char path[4096], err[256], args[96];
    snprintf(f->base, sizeof(f->base), "%s.gguf", kg_test_tmp_path("lora-cache-base"));
    ck_assert(kg_test_mkmodel(f->base, BASE_ARGS) == 0);
    f->m = kg_model_load(f->base, err, sizeof(err));
    ck_assert_msg(f->m != NULL, "%s", err);
    static const char *const types[] = {"f32", "f16", "q8_0", "bf16"};
    for (int a = 0; a < N_AD; a++) {
        snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("lora-cache-ad"));
        snprintf(args, sizeof(args), "--rank %d --type %s --seed %d", a == 2 ? 32 : 4 + a, types[a],
                 300 + a);
        make_lora(f->base, path, args);
        f->lora[a] = kg_lora_load(path, f->m, err, sizeof(err));
        ck_assert_msg(f->lora[a] != NULL, "%s", err);
        remove(path);
    }
}

static void fixture_clear(fixture_t *f) {
    for (int a = 0; a < N_AD; a++) {
        kg_lora_free(f->lora[a]);
    }
    kg_model_free(f->m);
    remove(f->base);
}

typedef struct run {
    kg_backend_t *be;
    kg_adapters_t *ad;
    kg_engine_t *e;
    kg_completion_t *comps;
    int32_t cap;
    int32_t out[64][MAX_OUT], n_out[64];
    bool done[64];
} run_t;

/* An engine over a CPU backend holding at most max_resident of the
 * fixture's adapters (kg_adapters ids 0..N_AD-1, none loaded yet). */
static void run_start(run_t *r, const fixture_t *f, int32_t max_resident, bool prefix_cache) {
    memset(r, 0, sizeof(*r));
    kg_engine_params_t ep = kg_engine_params_default(f->m, 0);
    ep.max_batch_size = 8;
    ep.max_batch_tokens = 64;
    ep.max_seq_len = 64;
    ep.kv_block_size = BLOCK;
    ep.n_kv_blocks = 64;
    ep.prefix_cache = prefix_cache;
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = ep.n_kv_blocks,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = ep.max_batch_tokens,
                             .max_seq_len = ep.max_seq_len};
    char err[256];
    r->be = kg_backend_cpu_new(f->m, &p, err, sizeof(err));
    ck_assert_msg(r->be != NULL, "%s", err);
    r->ad = kg_adapters_new(r->be, max_resident);
    ck_assert_ptr_nonnull(r->ad);
    static const char *const names[] = {"a", "b", "c", "d"};
    for (int a = 0; a < N_AD; a++) {
        ck_assert_int_eq(kg_adapters_add(r->ad, f->lora[a], names[a]), a);
    }
    r->e = kg_engine_new(r->be, &ep, err, sizeof(err));
    ck_assert_msg(r->e != NULL, "%s", err);
    kg_engine_set_adapters(r->e, r->ad);
    r->cap = kg_engine_max_completions(r->e);
    r->comps = malloc((size_t)r->cap * sizeof(*r->comps));
}

static void run_stop(run_t *r) {
    free(r->comps);
    kg_engine_free(r->e);
    kg_adapters_free(r->ad);
    kg_backend_free(r->be);
}

/* Job `id` (1..63) on adapters ids[0..n) at scales 1, 0.5, ... */
static void
submit(run_t *r, int id, const int32_t *ids, int n, int32_t max_tokens, uint32_t prompt_seed) {
    int32_t prompt[24];
    for (int k = 0; k < 24; k++) {
        prompt[k] = 3 + (int32_t)((prompt_seed * 31 + (uint32_t)k * 17) % 240);
    }
    kg_request_t req = {.id = (uint64_t)id,
                        .prompt = prompt,
                        .n_prompt = 24,
                        .max_tokens = max_tokens,
                        .ignore_eos = true,
                        .sampling = kg_sampling_params_default()};
    for (int i = 0; i < n; i++) {
        req.lora.id[i] = ids[i];
        req.lora.scale[i] = i == 0 ? 1.0f : 0.5f;
    }
    req.lora.n = n;
    r->n_out[id] = 0;
    r->done[id] = false;
    ck_assert_int_eq(kg_engine_submit(r->e, &req), KG_OK);
}

static void step(run_t *r) {
    int32_t n = kg_engine_step(r->e, r->comps, r->cap);
    ck_assert_int_ge(n, 0);
    for (int32_t c = 0; c < n; c++) {
        const kg_completion_t *x = &r->comps[c];
        if (x->token >= 0 && r->n_out[x->id] < MAX_OUT) {
            r->out[x->id][r->n_out[x->id]++] = x->token;
        }
        if (x->finish != KG_FINISH_NONE) {
            ck_assert_msg(x->finish == KG_FINISH_LENGTH || x->finish == KG_FINISH_CANCELLED,
                          "job %llu finished %d", (unsigned long long)x->id, x->finish);
            r->done[x->id] = true;
        }
    }
}

static void drain(run_t *r) {
    for (int i = 0; i < 10000 && kg_engine_busy(r->e); i++) {
        step(r);
    }
    ck_assert(!kg_engine_busy(r->e));
}

static bool resident(const run_t *r, int32_t id) {
    return atomic_load(&kg_adapters_stats(r->ad, id)->resident) == 1;
}
static int64_t loads(const run_t *r, int32_t id) {
    return atomic_load(&kg_adapters_stats(r->ad, id)->n_loads);
}
static int64_t evictions(const run_t *r, int32_t id) {
    return atomic_load(&kg_adapters_stats(r->ad, id)->n_evictions);
}

enum { A = 0, B = 1, C = 2, D = 3 };

/* Two adapters resident and running: a job for a third waits (its adapter
 * is not loaded, nothing is evicted, it makes no token) until one running
 * job ends; then the idle one goes, never the one still running. */
START_TEST(in_use_never_evicted_and_waits) {
    fixture_t f;
    fixture_init(&f);
    run_t r;
    run_start(&r, &f, 2, false);
    submit(&r, 1, (int32_t[]){A}, 1, 1000, 1);
    submit(&r, 2, (int32_t[]){B}, 1, 1000, 2);
    step(&r);
    ck_assert(resident(&r, A) && resident(&r, B));
    ck_assert_int_eq(kg_adapters_n_resident(r.ad), 2);
    submit(&r, 3, (int32_t[]){C}, 1, MAX_OUT, 3);
    submit(&r, 4, NULL, 0, MAX_OUT, 4); /* behind it on the base: waits too (FIFO) */
    for (int i = 0; i < 8; i++) {
        step(&r);
    }
    ck_assert(!resident(&r, C));
    ck_assert(resident(&r, A) && resident(&r, B));
    ck_assert_int_eq(evictions(&r, A) + evictions(&r, B), 0);
    ck_assert_int_eq(r.n_out[3], 0);
    ck_assert_int_eq(r.n_out[4], 0);
    ck_assert(!r.done[3]);
    ck_assert_int_ge(r.n_out[1], 8); /* the running ones went on */
    ck_assert(kg_engine_cancel(r.e, 1));
    step(&r);
    ck_assert(r.done[1]);
    ck_assert(resident(&r, C));
    ck_assert(!resident(&r, A)); /* idle now: evicted */
    ck_assert(resident(&r, B));  /* running: kept */
    ck_assert_int_eq(evictions(&r, A), 1);
    ck_assert_int_eq(evictions(&r, B), 0);
    ck_assert(kg_engine_cancel(r.e, 2));
    drain(&r);
    ck_assert(r.done[3] && r.n_out[3] == MAX_OUT && r.done[4] && r.n_out[4] == MAX_OUT);
    ck_assert_int_eq(kg_adapters_n_resident(r.ad), 2);
    run_stop(&r);
    fixture_clear(&f);
}
END_TEST

/* With nothing running the least recently used resident adapter goes; an
 * adapter a waiting job needs is kept over an idle one even when it is
 * older; a job on more adapters than the cap is refused at submit. */
START_TEST(lru_order) {
    fixture_t f;
    fixture_init(&f);
    run_t r;
    run_start(&r, &f, 2, false);
    submit(&r, 1, (int32_t[]){A}, 1, 2, 1);
    drain(&r);
    submit(&r, 2, (int32_t[]){B}, 1, 2, 2);
    drain(&r);
    submit(&r, 3, (int32_t[]){A}, 1, 2, 3); /* A used after B now */
    drain(&r);
    submit(&r, 4, (int32_t[]){C}, 1, 2, 4);
    drain(&r);
    ck_assert(resident(&r, A) && resident(&r, C) && !resident(&r, B)); /* B was the LRU */
    ck_assert_int_eq(evictions(&r, B), 1);
    /* A is older than C, but the second waiting job needs A: C goes */
    submit(&r, 5, (int32_t[]){D}, 1, 2, 5);
    submit(&r, 6, (int32_t[]){A}, 1, 2, 6);
    drain(&r);
    ck_assert(resident(&r, A) && resident(&r, D) && !resident(&r, C));
    ck_assert_int_eq(loads(&r, A), 1); /* never evicted */
    ck_assert_int_eq(evictions(&r, C), 1);
    /* three adapters never fit two places; an id not in the table is no adapter */
    kg_request_t req = {.id = 9,
                        .prompt = (int32_t[]){5, 6, 7},
                        .n_prompt = 3,
                        .max_tokens = 2,
                        .sampling = kg_sampling_params_default(),
                        .lora = {.n = 3, .id = {A, B, C}, .scale = {1, 1, 1}}};
    ck_assert_int_eq(kg_engine_submit(r.e, &req), KG_ERR_INVALID);
    req.lora = (kg_lora_set_t){.n = 1, .id = {N_AD}, .scale = {1}};
    ck_assert_int_eq(kg_engine_submit(r.e, &req), KG_ERR_INVALID);
    run_stop(&r);
    fixture_clear(&f);
}
END_TEST

/* Batch invariance across an eviction: each job's ids are the same on an
 * engine with no cap, and on one with a cap of 2 before its adapter(s)
 * were evicted and after they were loaded again, alone and beside jobs on
 * other adapters and the base; with the prefix cache on (the reloaded
 * adapter keeps its id, so its cached prompt blocks serve it again). */
START_TEST(same_ids_after_reload) {
    fixture_t f;
    fixture_init(&f);
    static const int32_t sets[4][2] = {{A, -1}, {C, -1}, {A, C}, {D, B}};
    static const int n_set[4] = {1, 1, 2, 2};
    int32_t want[4][MAX_OUT];
    run_t r;
    run_start(&r, &f, 0, false); /* no cap: nothing is ever evicted */
    for (int s = 0; s < 4; s++) {
        submit(&r, 1 + s, sets[s], n_set[s], MAX_OUT, 10 + (uint32_t)s);
    }
    drain(&r);
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(r.n_out[1 + s], MAX_OUT);
        memcpy(want[s], r.out[1 + s], sizeof(want[s]));
    }
    ck_assert_int_eq(kg_adapters_n_resident(r.ad), 4);
    run_stop(&r);
    ck_assert(memcmp(want[0], want[2], sizeof(want[0])) != 0); /* the second adapter matters */

    for (int pc = 0; pc < 2; pc++) {
        run_start(&r, &f, 2, pc == 1);
        /* each set alone, twice, with the others between: every adapter is
         * evicted and loaded again in another order */
        int id = 1;
        for (int round = 0; round < 2; round++) {
            for (int s = 0; s < 4; s++) {
                int k = round == 0 ? s : 3 - s;
                submit(&r, id, sets[k], n_set[k], MAX_OUT, 10 + (uint32_t)k);
                drain(&r);
                ck_assert_msg(
                    r.n_out[id] == MAX_OUT && memcmp(r.out[id], want[k], sizeof(want[k])) == 0,
                    "set %d, round %d, prefix cache %d: ids differ after reloads", k, round, pc);
                id++;
            }
        }
        /* beside others: A with the base, then B and D (A evicted), then A again with C */
        submit(&r, id, sets[0], 1, MAX_OUT, 10);
        submit(&r, id + 1, NULL, 0, MAX_OUT, 50);
        drain(&r);
        ck_assert(memcmp(r.out[id], want[0], sizeof(want[0])) == 0);
        submit(&r, id + 2, sets[3], 2, MAX_OUT, 13);
        drain(&r);
        ck_assert(!resident(&r, A));
        submit(&r, id + 3, sets[0], 1, MAX_OUT, 10);
        submit(&r, id + 4, sets[1], 1, MAX_OUT, 11);
        drain(&r);
        ck_assert(memcmp(r.out[id + 3], want[0], sizeof(want[0])) == 0);
        ck_assert(memcmp(r.out[id + 4], want[1], sizeof(want[1])) == 0);
        ck_assert_int_ge(loads(&r, A), 3);
        ck_assert_int_ge(evictions(&r, A), 2);
        ck_assert_int_le(kg_adapters_n_resident(r.ad), 2);
        run_stop(&r);
    }
    fixture_clear(&f);
}
END_TEST

// ---- --lora-dir ----

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

static kg_job_t *job_of(const char *json) {
    kg_job_t *job = NULL;
    kg_codec_error_t e;
    ck_assert_msg(kg_codec_decode_job(json, strlen(json), &job, &e) == KG_OK, "%s", e.message);
    return job;
}

/* kg_intake_prepare of `json`: its status, code and message; when it is
 * accepted, it must run on `want_n` adapters. */
static kg_status_t prepare(const kg_model_t *m,
                           kg_loras_t *l,
                           const char *json,
                           kg_error_code_t *code,
                           char *msg,
                           int want_n) {
    const char *served[] = {"base"};
    kg_intake_limits_t lim = {
        .max_seq_len = 512, .max_tokens_limit = 1000, .served = served, .n_served = 1, .loras = l};
    kg_job_t *job = job_of(json);
    kg_prepared_t p;
    kg_status_t st = kg_intake_prepare(m, &lim, job, 0, &p, code, msg, 512);
    if (st == KG_OK) {
        ck_assert_int_eq(p.lora.n, want_n);
        kg_prepared_clear(&p);
    }
    kg_job_free(job);
    return st;
}

START_TEST(dir_first_use) {
    fixture_t f;
    fixture_init(&f);
    char dir[4096], path[4200], other[4200], err[512];
    snprintf(dir, sizeof(dir), "%s", kg_test_tmp_path("lora-dir"));
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof(path), "%s/good.gguf", dir);
    make_lora(f.base, path, "--rank 4 --type f16 --seed 1");
    snprintf(other, sizeof(other), "%s.gguf", kg_test_tmp_path("lora-other"));
    ck_assert(kg_test_mkmodel(other, OTHER_ARGS) == 0);
    snprintf(path, sizeof(path), "%s/wrong.gguf", dir);
    make_lora(other, path, "--rank 4 --seed 2"); /* for another base */
    snprintf(path, sizeof(path), "%s/trunc.gguf", dir);
    write_bytes(path, "GGUF\3\0\0\0\x1c\0\0\0\0\0\0\0", 16); /* a header and nothing more */
    snprintf(path, sizeof(path), "%s/notes.txt", dir);
    write_bytes(path, "hi", 2);

    kg_loras_t l;
    ck_assert_int_eq(kg_loras_parse(&l, "", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(kg_loras_set_dir(&l, path, err, sizeof(err)), KG_ERR_INVALID); /* a file */
    ck_assert_msg(strstr(err, "is not a directory") != NULL, "%s", err);
    ck_assert_int_eq(kg_loras_set_dir(&l, dir, err, sizeof(err)), KG_OK);
    kg_backend_params_t bp = {.n_threads = 1,
                              .n_kv_blocks = 8,
                              .kv_block_size = BLOCK,
                              .max_batch_tokens = 16,
                              .max_seq_len = 64};
    kg_backend_t *be = kg_backend_cpu_new(f.m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert_int_eq(kg_loras_load(&l, f.m, be, 2, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(l.n, 0); /* nothing read before a job names it */

    const kg_lora_entry_t *e = NULL;
    ck_assert_int_eq(kg_loras_resolve(&l, "good", &e, err, sizeof(err)), KG_OK);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->name, "good");
    ck_assert_int_eq(e->id, 0);
    ck_assert_float_eq(e->scale, 1.0f);
    const kg_lora_entry_t *again = NULL;
    ck_assert_int_eq(kg_loras_resolve(&l, "good", &again, err, sizeof(err)), KG_OK);
    ck_assert_ptr_eq(again, e); /* read once */
    ck_assert_int_eq(l.n, 1);
    ck_assert_int_eq(kg_adapters_n_resident(l.adapters), 0); /* the engine loads it */

    /* bad files answer the job, and are not kept */
    ck_assert_int_eq(kg_loras_resolve(&l, "wrong", &e, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_msg(strstr(err, "adapter \"wrong\"") && strstr(err, "wrong.gguf") &&
                      strstr(err, "'blk.0.attn_q.weight' has incorrect shape"),
                  "%s", err);
    ck_assert_int_eq(kg_loras_resolve(&l, "trunc", &e, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_msg(strstr(err, "adapter \"trunc\"") != NULL, "%s", err);
    ck_assert_int_eq(l.n, 1);
    /* not a plain file name of the directory: no adapter */
    const char *none[] = {"missing", "notes", "../good", "good/../good", ".good", "", "a\"b"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        e = (const kg_lora_entry_t *)1;
        ck_assert_int_eq(kg_loras_resolve(&l, none[i], &e, err, sizeof(err)), KG_OK);
        ck_assert_msg(e == NULL, "%s", none[i]);
    }

    /* through intake: the job gets model_not_found with the loader's words */
    kg_error_code_t code;
    char msg[512];
    ck_assert_int_eq(prepare(f.m, &l, "{\"request_id\":\"1\",\"prompt\":\"x\",\"model\":\"wrong\"}",
                             &code, msg, 1),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_MODEL_NOT_FOUND);
    ck_assert_msg(strstr(msg, "cannot be used") && strstr(msg, "incorrect shape"), "%s", msg);
    ck_assert_int_eq(prepare(f.m, &l, "{\"request_id\":\"1\",\"prompt\":\"x\",\"model\":\"nope\"}",
                             &code, msg, 1),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_MODEL_NOT_FOUND);
    ck_assert_msg(strstr(msg, "each NAME.gguf of") != NULL, "%s", msg);
    ck_assert_int_eq(
        prepare(f.m, &l, "{\"request_id\":\"1\",\"prompt\":\"x\",\"lora\":[{\"name\":\"nope\"}]}",
                &code, msg, 1),
        KG_ERR_INVALID);
    ck_assert_msg(strstr(msg, "--lora-dir") != NULL, "%s", msg);

    /* fixed on disk (a new file renamed over it): the next job reads it */
    snprintf(path, sizeof(path), "%s/fixed.tmp", dir);
    make_lora(f.base, path, "--rank 32 --type q8_0 --seed 3");
    char wrong[4200];
    snprintf(wrong, sizeof(wrong), "%s/wrong.gguf", dir);
    ck_assert_int_eq(rename(path, wrong), 0);
    kg_status_t st = prepare(f.m, &l, "{\"request_id\":\"1\",\"prompt\":\"x\",\"model\":\"wrong\"}",
                             &code, msg, 1);
    ck_assert_msg(st == KG_OK, "%s", msg);
    ck_assert_int_eq(l.n, 2);
    ck_assert_ptr_nonnull(kg_loras_find(&l, "wrong"));

    /* a served name is the base's, even with a file of that name in the directory */
    snprintf(path, sizeof(path), "%s/base.gguf", dir);
    make_lora(f.base, path, "--rank 4 --seed 5");
    st = prepare(f.m, &l, "{\"request_id\":\"1\",\"prompt\":\"x\",\"model\":\"base\"}", &code, msg,
                 0);
    ck_assert_msg(st == KG_OK, "%s", msg);
    ck_assert_ptr_null(kg_loras_find(&l, "base"));

    /* more adapters than --max-loras in one job: refused, not left waiting */
    snprintf(path, sizeof(path), "%s/third.gguf", dir);
    make_lora(f.base, path, "--rank 4 --seed 4");
    ck_assert_int_eq(
        prepare(f.m, &l,
                "{\"request_id\":\"1\",\"prompt\":\"x\",\"model\":\"good\",\"lora\":[{\"name\":"
                "\"wrong\"},{\"name\":\"third\"}]}",
                &code, msg, 1),
        KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_INVALID_JOB);
    ck_assert_msg(strstr(msg, "--max-loras") != NULL, "%s", msg);

    kg_loras_clear(&l);
    kg_backend_free(be);
    const char *files[] = {"good.gguf", "wrong.gguf", "trunc.gguf",
                           "notes.txt", "third.gguf", "base.gguf"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);
    remove(other);
    fixture_clear(&f);
}
END_TEST

/* --lora adapters beyond the cap are read and checked at start, loaded on
 * their first job, and evicted like a directory's. */
START_TEST(preloaded_count_in_the_cap) {
    fixture_t f;
    fixture_init(&f);
    char spec[3 * 4200], p[3][4096], err[512];
    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof(p[i]), "%s.gguf", kg_test_tmp_path("lora-pre"));
        make_lora(f.base, p[i], "--rank 4 --seed 7");
    }
    snprintf(spec, sizeof(spec), "x=%s,y=%s,z=%s", p[0], p[1], p[2]);
    kg_loras_t l;
    ck_assert_int_eq(kg_loras_parse(&l, spec, err, sizeof(err)), KG_OK);
    kg_backend_params_t bp = {.n_threads = 1,
                              .n_kv_blocks = 8,
                              .kv_block_size = BLOCK,
                              .max_batch_tokens = 16,
                              .max_seq_len = 64};
    kg_backend_t *be = kg_backend_cpu_new(f.m, &bp, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_memory_t c0, c1, c2;
    kg_backend_memory(be, &c0);
    ck_assert_int_eq(kg_loras_load(&l, f.m, be, 2, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(l.n, 3);
    ck_assert_int_eq(kg_adapters_n_resident(l.adapters), 2);
    ck_assert_int_eq(atomic_load(&kg_adapters_stats(l.adapters, l.e[2].id)->resident), 0);
    kg_backend_memory(be, &c1);
    ck_assert_uint_gt(c1.weights_size, c0.weights_size);
    kg_loras_clear(&l);
    kg_backend_memory(be, &c2); /* removed adapters give their bytes back */
    ck_assert_uint_eq(c2.weights_size, c0.weights_size);
    /* a bad --lora stops the start, naming it */
    snprintf(spec, sizeof(spec), "x=%s,bad=%s", p[0], f.base);
    ck_assert_int_eq(kg_loras_parse(&l, spec, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(kg_loras_load(&l, f.m, be, 1, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_msg(strstr(err, "--lora bad:") != NULL, "%s", err);
    kg_loras_clear(&l);
    kg_backend_free(be);
    for (int i = 0; i < 3; i++) {
        remove(p[i]);
    }
    fixture_clear(&f);
}
END_TEST

/* A backend that runs no adapters refuses --lora-dir (and --lora) at start,
 * not on each job. */
START_TEST(refused_by_a_backend_without_adapters) {
    kg_fake_backend_params_t fp = {
        .n_vocab = 16, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 8, .n_slots = 1};
    kg_backend_t *be = kg_fake_backend_new(&fp);
    kg_loras_t l;
    char err[256];
    ck_assert_int_eq(kg_loras_parse(&l, "", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(kg_loras_set_dir(&l, ".", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(kg_loras_load(&l, NULL, be, 0, err, sizeof(err)), KG_ERR_UNSUPPORTED);
    ck_assert_str_eq(
        err, "--lora-dir: the fake backend does not run LoRA adapters (the cpu and cuda ones do)");
    kg_loras_clear(&l);
    kg_backend_free(be);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("lora_cache");
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, in_use_never_evicted_and_waits);
    tcase_add_test(tc, lru_order);
    tcase_add_test(tc, same_ids_after_reload);
    tcase_add_test(tc, dir_first_use);
    tcase_add_test(tc, preloaded_count_in_the_cap);
    tcase_add_test(tc, refused_by_a_backend_without_adapters);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
