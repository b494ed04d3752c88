/* check_engine: the continuous-batching scheduler on the fake backend.
 *
 * The fake backend's logits are a pure function of the token ids a row
 * reads back through the block tables, so every test also checks the block
 * tables and the prefix sharing: a wrong block changes the tokens. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "check_common.h"
#include "engine/kg_engine.h"
#include "engine/kg_sizing.h"
#include "fakes/fake_backend.h"
#include "grammar/kg_constraint.h"
#include "grammar/kg_grammar.h"

#include <pcre2.h>
#include <stdio.h>
#include <string.h>

// ---- counting allocator (not with ASan, which owns malloc) ----

#if defined(__SANITIZE_ADDRESS__)
#define KG_COUNT_ALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KG_COUNT_ALLOC 0
#endif
#endif
#ifndef KG_COUNT_ALLOC
#define KG_COUNT_ALLOC 1
#endif

#if KG_COUNT_ALLOC
static long g_n_allocs; /* malloc/calloc/realloc calls in this process */

/* glibc's own entry points: the overrides below count and forward. */
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void __libc_free(void *ptr);

void *malloc(size_t size) {
    g_n_allocs++;
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    g_n_allocs++;
    return __libc_calloc(n, size);
}

void *realloc(void *ptr, size_t size) {
    g_n_allocs++;
    return __libc_realloc(ptr, size);
}

void free(void *ptr) {
    __libc_free(ptr);
}
#endif

// ---- the test environment ----

#define EOG      3
#define VOCAB    64
#define MAX_JOBS 256
#define MAX_OUT  600
/* Outputs are kept by id + choice * CHOICE_STRIDE: tests with n > 1 use
 * ids below CHOICE_STRIDE. */
#define CHOICE_STRIDE 32

typedef struct job_out {
    int32_t tok[MAX_OUT];
    int32_t n;
    bool done;
    kg_finish_t finish;
    int64_t first_step; /* step that reported the first completion, -1 none */
    int64_t done_step;
    int32_t n_cached;
} job_out_t;

typedef struct env {
    kg_fake_backend_params_t fp;
    kg_engine_params_t ep;
    kg_backend_t *be;
    kg_engine_t *e;
    kg_completion_t *comps;
    int32_t cap;
    int64_t n_steps;
    int64_t now_us;  /* the fake clock */
    job_out_t *jobs; /* (MAX_JOBS) by request id */
    int32_t max_running;
    int32_t max_used;
} env_t;

static int64_t fake_clock(void *ctx) {
    return *(const int64_t *)ctx;
}

static kg_engine_params_t base_params(void) {
    kg_engine_params_t p;
    memset(&p, 0, sizeof(p));
    p.max_batch_size = 4;
    p.max_queue_depth = 64;
    p.max_batch_tokens = 64;
    p.max_seq_len = 256;
    p.kv_block_size = 4;
    p.n_kv_blocks = 512;
    p.prefix_cache = true;
    p.n_eog = 1;
    p.eog[0] = EOG;
    p.n_vocab = VOCAB;
    return p;
}

/* eog_at_len: history length from which the fake makes EOG win (0: never
 * on purpose; EOG is then suppressed so that lengths are exact). */
static void
env_init_with(env_t *env, const kg_engine_params_t *ep, int32_t eog_at_len, bool device_sample) {
    memset(env, 0, sizeof(*env));
    env->ep = *ep;
    env->fp = (kg_fake_backend_params_t){.n_vocab = ep->n_vocab,
                                         .n_kv_blocks = ep->n_kv_blocks,
                                         .kv_block_size = ep->kv_block_size,
                                         .max_batch_tokens = ep->max_batch_tokens,
                                         .n_slots = ep->max_batch_size,
                                         .salt = 1,
                                         .eog_token = EOG,
                                         .eog_at_len = eog_at_len > 0 ? eog_at_len : (1 << 30),
                                         .window = ep->kv_window,
                                         .device_sample = device_sample};
    env->be = kg_fake_backend_new(&env->fp);
    ck_assert_ptr_nonnull(env->be);
    char err[256] = "";
    env->e = kg_engine_new(env->be, ep, err, sizeof(err));
    ck_assert_msg(env->e != NULL, "kg_engine_new: %s", err);
    kg_engine_set_clock(env->e, fake_clock, &env->now_us);
    env->now_us = 1000000;
    env->cap = kg_engine_max_completions(env->e);
    env->comps = calloc((size_t)env->cap, sizeof(*env->comps));
    env->jobs = calloc(MAX_JOBS, sizeof(*env->jobs));
    for (int i = 0; i < MAX_JOBS; i++) {
        env->jobs[i].first_step = -1;
    }
}

static void env_init(env_t *env, const kg_engine_params_t *ep, int32_t eog_at_len) {
    env_init_with(env, ep, eog_at_len, false);
}

static void env_clear(env_t *env) {
    kg_engine_free(env->e);
    kg_backend_free(env->be);
    free(env->comps);
    free(env->jobs);
}

static void fill_prompt(int32_t *p, int32_t n, uint64_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (int32_t)((seed >> 33) % VOCAB);
    }
}

static kg_request_t make_req(uint64_t id, const int32_t *prompt, int32_t n, int32_t max_tokens) {
    kg_request_t r;
    memset(&r, 0, sizeof(r));
    r.id = id;
    r.prompt = prompt;
    r.n_prompt = n;
    r.max_tokens = max_tokens;
    r.sampling = kg_sampling_params_default();
    return r;
}

static void submit_ok(env_t *env, const kg_request_t *r) {
    kg_status_t st = kg_engine_submit(env->e, r);
    ck_assert_msg(st == KG_OK, "submit id=%llu: %s", (unsigned long long)r->id, kg_status_str(st));
}

/* Record one step's completions and check the completion convention. */
static void env_collect(env_t *env, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const kg_completion_t *c = &env->comps[i];
        uint64_t at = c->id + (uint64_t)c->choice * CHOICE_STRIDE;
        ck_assert(c->choice == 0 || c->id < CHOICE_STRIDE);
        ck_assert_uint_lt(at, MAX_JOBS);
        job_out_t *j = &env->jobs[at];
        ck_assert_msg(!j->done, "completion after the finish of id=%llu",
                      (unsigned long long)c->id);
        if (j->first_step < 0) {
            j->first_step = env->n_steps;
            j->n_cached = c->n_cached;
        }
        if (c->token >= 0) {
            ck_assert_int_lt(c->token, VOCAB);
            ck_assert_int_eq(c->index, j->n);
            ck_assert_int_eq(c->sample.token, c->token);
            ck_assert_int_lt(j->n, MAX_OUT);
            j->tok[j->n++] = c->token;
            ck_assert(c->finish == KG_FINISH_NONE || c->finish == KG_FINISH_LENGTH);
        } else {
            ck_assert_int_eq(c->index, j->n);
            ck_assert_int_ne(c->finish, KG_FINISH_NONE);
        }
        if (c->finish != KG_FINISH_NONE) {
            j->done = true;
            j->finish = c->finish;
            j->done_step = env->n_steps;
        }
    }
}

static int32_t env_step(env_t *env) {
    int32_t n = kg_engine_step(env->e, env->comps, env->cap);
    ck_assert_msg(n >= 0, "step: %s (%s)", kg_status_str((kg_status_t)n),
                  kg_fake_backend_stats(env->be)->first_violation);
    env->n_steps++;
    env_collect(env, n);
    const kg_fake_backend_stats_t *fs = kg_fake_backend_stats(env->be);
    ck_assert_msg(fs->n_violations == 0, "fake backend: %s", fs->first_violation);
    kg_engine_stats_t st;
    kg_engine_stats(env->e, &st);
    ck_assert_int_le(st.n_running, env->ep.max_batch_size);
    ck_assert_int_eq(st.kv_blocks_used + st.kv_blocks_cached <= st.kv_blocks_total, 1);
    if (st.n_running > env->max_running) {
        env->max_running = st.n_running;
    }
    if (st.kv_blocks_used > env->max_used) {
        env->max_used = st.kv_blocks_used;
    }
    return n;
}

static void env_run(env_t *env, int64_t max_steps) {
    int64_t start = env->n_steps;
    while (kg_engine_busy(env->e)) {
        env_step(env);
        ck_assert_msg(env->n_steps - start < max_steps, "not idle after %lld steps",
                      (long long)max_steps);
    }
    kg_engine_stats_t st;
    kg_engine_stats(env->e, &st);
    ck_assert_int_eq(st.n_running, 0);
    ck_assert_int_eq(st.n_waiting, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0); /* the pool is back to full when idle */
    ck_assert_int_eq(kg_engine_step(env->e, env->comps, env->cap), 0);
}

/* What the fake backend makes a greedy job say when it runs alone. */
static int32_t ref_greedy(const kg_fake_backend_params_t *fp,
                          const int32_t *prompt,
                          int32_t n_prompt,
                          int32_t max_tokens,
                          int32_t max_seq_len,
                          bool ignore_eos,
                          int32_t *out,
                          kg_finish_t *finish) {
    int32_t hist[1024];
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(*hist));
    int32_t n = n_prompt, n_out = 0;
    for (;;) {
        int32_t t = kg_fake_backend_argmax(fp, hist, n);
        if (t == EOG && !ignore_eos) {
            *finish = KG_FINISH_STOP;
            return n_out;
        }
        hist[n++] = t;
        out[n_out++] = t;
        if (n_out >= max_tokens || n >= max_seq_len) {
            *finish = KG_FINISH_LENGTH;
            return n_out;
        }
    }
}

static void check_greedy(const env_t *env,
                         uint64_t id,
                         const int32_t *prompt,
                         int32_t n_prompt,
                         int32_t max_tokens,
                         bool ignore_eos) {
    int32_t ref[MAX_OUT];
    kg_finish_t f;
    int32_t n = ref_greedy(&env->fp, prompt, n_prompt, max_tokens, env->ep.max_seq_len, ignore_eos,
                           ref, &f);
    const job_out_t *j = &env->jobs[id];
    ck_assert_msg(j->done, "id=%llu did not finish", (unsigned long long)id);
    ck_assert_int_eq(j->finish, f);
    ck_assert_int_eq(j->n, n);
    for (int32_t i = 0; i < n; i++) {
        ck_assert_msg(j->tok[i] == ref[i], "id=%llu token %d: %d, expected %d",
                      (unsigned long long)id, i, j->tok[i], ref[i]);
    }
}

// ---- parameters and submit ----

START_TEST(bad_params) {
    kg_engine_params_t p = base_params();
    p.max_batch_tokens = 2; /* less than max_batch_size */
    kg_fake_backend_params_t fp = {.n_vocab = VOCAB,
                                   .n_kv_blocks = 8,
                                   .kv_block_size = 4,
                                   .max_batch_tokens = 8,
                                   .n_slots = 4};
    kg_backend_t *be = kg_fake_backend_new(&fp);
    char err[256] = "";
    ck_assert_ptr_null(kg_engine_new(be, &p, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "max_batch_tokens"));
    p = base_params();
    p.n_kv_blocks = 0;
    ck_assert_ptr_null(kg_engine_new(be, &p, err, sizeof(err)));
    kg_backend_free(be);
}
END_TEST

START_TEST(submit_validation) {
    kg_engine_params_t p = base_params();
    p.max_seq_len = 32;
    p.n_kv_blocks = 6; /* 24 tokens */
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[64];
    fill_prompt(prompt, 64, 1);
    kg_request_t r = make_req(1, prompt, 0, 4);
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* empty */
    r.n_prompt = 32;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* no room for output */
    r.n_prompt = 25;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* larger than the pool */
    r.n_prompt = 24;
    r.max_tokens = 0;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r.max_tokens = 4;
    r.sampling.n_logprobs = KG_MAX_LOGPROBS + 1;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r.sampling.n_logprobs = 2;
    prompt[5] = VOCAB;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* not a token id */
    prompt[5] = 1;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_OK);
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* id is live */
    ck_assert_int_lt(kg_engine_step(env.e, env.comps, 1), 0);      /* cap too small */
    env_run(&env, 100);
    /* The prompt fills the pool: one token, then the context cannot grow. */
    check_greedy(&env, 1, prompt, 24, 1, false);
    ck_assert_int_eq(env.jobs[1].finish, KG_FINISH_LENGTH);
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_OK); /* the id is free again */
    memset(&env.jobs[1], 0, sizeof(env.jobs[1]));
    env.jobs[1].first_step = -1;
    env_run(&env, 100);
    /* Its prompt blocks came from the cache this time. */
    ck_assert_int_eq(env.jobs[1].n_cached, 20);
    check_greedy(&env, 1, prompt, 24, 1, false);
    env_clear(&env);
}
END_TEST

START_TEST(queue_full) {
    kg_engine_params_t p = base_params();
    p.max_queue_depth = 3;
    p.max_batch_size = 2;
    /* same prompts: with the cache, the second would wait a step for the
     * first one's blocks (system_prompt_prefilled_once tests that) */
    p.prefix_cache = false;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[8];
    fill_prompt(prompt, 8, 2);
    for (uint64_t id = 1; id <= 3; id++) {
        kg_request_t r = make_req(id, prompt, 8, 5);
        submit_ok(&env, &r);
    }
    kg_request_t r = make_req(4, prompt, 8, 5);
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_QUEUE_FULL);
    env_step(&env); /* admits two */
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.n_waiting, 1);
    ck_assert_int_eq(st.n_running, 2);
    submit_ok(&env, &r);
    r.id = 5;
    submit_ok(&env, &r);
    r.id = 6;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_QUEUE_FULL);
    env_run(&env, 200);
    for (uint64_t id = 1; id <= 5; id++) {
        check_greedy(&env, id, prompt, 8, 5, false);
    }
    ck_assert(!env.jobs[6].done);
    env_clear(&env);
}
END_TEST

// ---- scheduling ----

START_TEST(admission_limit) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompts[12][10];
    for (int i = 0; i < 12; i++) {
        fill_prompt(prompts[i], 10, 100 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 10, 6 + i);
        submit_ok(&env, &r);
    }
    env_run(&env, 500);
    ck_assert_int_eq(env.max_running, 4);
    ck_assert_int_le(kg_fake_backend_stats(env.be)->max_step_outputs, 4);
    for (int i = 0; i < 12; i++) {
        check_greedy(&env, (uint64_t)i + 1, prompts[i], 10, 6 + i, false);
    }
    env_clear(&env);
}
END_TEST

START_TEST(priority_order) {
    kg_engine_params_t p = base_params();
    p.max_batch_size = 1;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 3);
    const int32_t prio[6] = {0, 5, 0, 5, 1, -2};
    for (int i = 0; i < 6; i++) {
        kg_request_t r = make_req((uint64_t)i + 1, prompt, 6, 3);
        r.priority = prio[i];
        submit_ok(&env, &r);
    }
    env_run(&env, 200);
    /* Higher priority first, FIFO within a priority: ids 2 4 5 1 3 6. */
    const uint64_t order[6] = {2, 4, 5, 1, 3, 6};
    for (int i = 1; i < 6; i++) {
        ck_assert_int_lt(env.jobs[order[i - 1]].first_step, env.jobs[order[i]].first_step);
        /* One slot: each job ran to the end before the next started. */
        ck_assert_int_lt(env.jobs[order[i - 1]].done_step, env.jobs[order[i]].first_step);
    }
    env_clear(&env);
}
END_TEST

/* Tiers (step 2b): a higher tier that finds the batch full takes the slot of
 * the newest running request of a lower tier, within one step; a high
 * priority of the same tier does not preempt; the victim waits at the front
 * of its tier and loses no token. */
START_TEST(tier_preemption) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t low[6][10], hi[6], urgent[6];
    for (int i = 0; i < 6; i++) {
        fill_prompt(low[i], 10, 900 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, low[i], 10, 40);
        submit_ok(&env, &r);
    }
    for (int i = 0; i < 5; i++) {
        env_step(&env); /* 1..4 run, 5 and 6 wait */
    }
    int32_t n4 = env.jobs[4].n;
    /* the same tier with a high priority: waits for a slot like anyone */
    fill_prompt(urgent, 6, 990);
    kg_request_t u = make_req(8, urgent, 6, 3);
    u.priority = 9;
    submit_ok(&env, &u);
    env_step(&env);
    ck_assert_int_lt(env.jobs[8].first_step, 0);
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.n_tier_preemptions, 0);
    /* a higher tier, priority 0: its first token comes in the next step */
    fill_prompt(hi, 6, 991);
    kg_request_t h = make_req(7, hi, 6, 3);
    h.tier = 1;
    submit_ok(&env, &h);
    n4 = env.jobs[4].n;
    int64_t at = env.n_steps;
    env_step(&env);
    ck_assert_int_eq(env.jobs[7].first_step, at + 1);
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.n_tier_preemptions, 1);
    ck_assert_int_eq(st.n_preemptions, 0);
    ck_assert_int_eq(st.n_running, 4);
    ck_assert_int_eq(env.jobs[4].n, n4); /* the newest low one made room */
    for (int i = 1; i <= 3; i++) {
        ck_assert_int_eq(env.jobs[i].n, n4 + 1);
    }
    env_run(&env, 500);
    /* the victim takes the first slot to free (7's, ahead of priority 9), then 8, 5, 6 */
    ck_assert_int_lt(env.jobs[7].done_step, env.jobs[8].first_step);
    ck_assert_int_le(env.jobs[1].done_step, env.jobs[8].first_step);
    ck_assert_int_le(env.jobs[8].first_step, env.jobs[5].first_step);
    ck_assert_int_le(env.jobs[5].first_step, env.jobs[6].first_step);
    for (int i = 0; i < 6; i++) {
        check_greedy(&env, (uint64_t)i + 1, low[i], 10, 40, false);
    }
    check_greedy(&env, 7, hi, 6, 3, false);
    check_greedy(&env, 8, urgent, 6, 3, false);
    /* its prompt blocks stayed in the prefix cache: only the tail was computed again */
    kg_engine_stats(env.e, &st);
    ck_assert_int_le(st.n_prefill_tokens, 6 * 10 + 6 + 6 + 4);
    env_clear(&env);

    /* blocks: a free slot, but the low ones hold the pool */
    p.n_kv_blocks = 12;
    env_init(&env, &p, 0);
    int32_t big[2][16];
    for (int i = 0; i < 2; i++) {
        fill_prompt(big[i], 16, 950 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, big[i], 16, 8);
        submit_ok(&env, &r);
    }
    env_step(&env);
    h = make_req(3, hi, 6, 3);
    h.tier = 2;
    submit_ok(&env, &h);
    at = env.n_steps;
    env_step(&env);
    ck_assert_int_eq(env.jobs[3].first_step, at + 1);
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.n_tier_preemptions, 1);
    env_run(&env, 500);
    check_greedy(&env, 1, big[0], 16, 8, false);
    check_greedy(&env, 2, big[1], 16, 8, false);
    check_greedy(&env, 3, hi, 6, 3, false);
    /* a negative tier is refused */
    h.id = 9;
    h.tier = -1;
    ck_assert_int_eq(kg_engine_submit(env.e, &h), KG_ERR_INVALID);
    env_clear(&env);
}
END_TEST

START_TEST(chunked_prefill) {
    kg_engine_params_t p = base_params();
    p.max_batch_tokens = 16;
    env_t env;
    env_init(&env, &p, 0);
    int32_t shorts[3][4], longp[100];
    for (int i = 0; i < 3; i++) {
        fill_prompt(shorts[i], 4, 10 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, shorts[i], 4, 60);
        submit_ok(&env, &r);
    }
    env_step(&env);
    for (int i = 1; i <= 3; i++) {
        ck_assert_int_eq(env.jobs[i].n, 1); /* 12 prompt tokens fit one step */
    }
    fill_prompt(longp, 100, 77);
    kg_request_t r = make_req(9, longp, 100, 4);
    submit_ok(&env, &r);
    int64_t start = env.n_steps;
    const kg_fake_backend_stats_t *fs = kg_fake_backend_stats(env.be);
    while (env.jobs[9].n == 0) {
        int32_t before[3] = {env.jobs[1].n, env.jobs[2].n, env.jobs[3].n};
        env_step(&env);
        /* Decodes are not stalled by the long prompt: one token each per step. */
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(env.jobs[i + 1].n, before[i] + 1);
        }
        int32_t tokens = fs->step_tokens[fs->n_steps - 1];
        ck_assert_int_le(tokens, 16);
        if (env.jobs[9].n == 0) {
            ck_assert_int_eq(tokens, 16); /* the prefill fills the budget */
        }
        ck_assert_int_lt(env.n_steps - start, 50);
    }
    /* 100 prompt tokens at 13 per step next to 3 decodes. */
    ck_assert_int_eq(env.n_steps - start, (100 + 12) / 13);
    ck_assert_int_eq(fs->max_step_tokens, 16);
    env_run(&env, 200);
    check_greedy(&env, 9, longp, 100, 4, false);
    for (int i = 0; i < 3; i++) {
        check_greedy(&env, (uint64_t)i + 1, shorts[i], 4, 60, false);
    }
    env_clear(&env);
}
END_TEST

START_TEST(preemption_same_tokens) {
    /* 12 blocks of 4 tokens for 4 slots: jobs reach 30 tokens (8 blocks). */
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 12;
    env_t env;
    env_init(&env, &p, 0);
    enum { N = 10 };
    int32_t prompts[N][10];
    for (int i = 0; i < N; i++) {
        fill_prompt(prompts[i], 6 + i % 4, 300 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 6 + i % 4, 20);
        submit_ok(&env, &r);
    }
    env_run(&env, 2000);
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_gt(st.n_preemptions, 0);
    for (int i = 0; i < N; i++) {
        check_greedy(&env, (uint64_t)i + 1, prompts[i], 6 + i % 4, 20, false);
    }
    /* The newest are preempted: job 1, admitted first, ran without a pause. */
    ck_assert_int_eq(env.jobs[1].done_step - env.jobs[1].first_step, 20 - 1);
    fprintf(stderr, "preemption: %d jobs, %lld preemptions, %lld prefill tokens, %lld steps\n", N,
            (long long)st.n_preemptions, (long long)st.n_prefill_tokens, (long long)st.n_steps);
    env_clear(&env);
}
END_TEST

/* n_jobs jobs whose prompts are one shared prefix plus some tokens of their
 * own, each generating max_tokens greedily; run to the end. */
typedef struct shared_run {
    kg_engine_params_t p;
    int n_jobs, n_shared, n_own, max_tokens;
    uint64_t shared_seed, own_seed;
} shared_run_t;

#define SHARED_MAX_JOBS   100
#define SHARED_MAX_PROMPT 520

static void run_shared_prefix(const shared_run_t *sr,
                              kg_engine_stats_t *st,
                              int32_t *max_used,
                              job_out_t *outs) {
    const int n_prompt = sr->n_shared + sr->n_own;
    ck_assert(sr->n_jobs <= SHARED_MAX_JOBS && n_prompt <= SHARED_MAX_PROMPT);
    env_t env;
    env_init(&env, &sr->p, 0);
    static int32_t prompts[SHARED_MAX_JOBS][SHARED_MAX_PROMPT];
    for (int i = 0; i < sr->n_jobs; i++) {
        fill_prompt(prompts[i], sr->n_shared, sr->shared_seed); /* the system prompt */
        fill_prompt(prompts[i] + sr->n_shared, sr->n_own, sr->own_seed + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], n_prompt, sr->max_tokens);
        submit_ok(&env, &r);
    }
    env_run(&env, 5000);
    for (int i = 0; i < sr->n_jobs; i++) {
        check_greedy(&env, (uint64_t)i + 1, prompts[i], n_prompt, sr->max_tokens, false);
        if (outs) {
            outs[i] = env.jobs[i + 1];
        }
    }
    kg_engine_stats(env.e, st);
    if (max_used) {
        *max_used = env.max_used;
    }
    env_clear(&env);
}

/* 32 jobs share a 200-token prefix; with and without the cache. */
static void run_32_shared(bool cache, kg_engine_stats_t *st, int32_t *max_used, job_out_t *outs) {
    shared_run_t sr = {.p = base_params(),
                       .n_jobs = 32,
                       .n_shared = 200,
                       .n_own = 16,
                       .max_tokens = 8,
                       .shared_seed = 5,
                       .own_seed = 1000};
    sr.p.max_batch_size = 16;
    sr.p.max_batch_tokens = 512;
    sr.p.kv_block_size = 16;
    sr.p.n_kv_blocks = 400;
    sr.p.prefix_cache = cache;
    run_shared_prefix(&sr, st, max_used, outs);
}

START_TEST(prefix_sharing) {
    static job_out_t with[32], without[32];
    kg_engine_stats_t a, b;
    int32_t used_a, used_b;
    run_32_shared(true, &a, &used_a, with);
    run_32_shared(false, &b, &used_b, without);
    fprintf(stderr,
            "prefix sharing, 32 jobs x (200 shared + 16 own) prompt tokens: prefill tokens "
            "%lld with the cache, %lld without; cache hits %lld of %lld prompt tokens; peak "
            "blocks in use %d vs %d; steps %lld vs %lld\n",
            (long long)a.n_prefill_tokens, (long long)b.n_prefill_tokens,
            (long long)a.n_prefix_hit_tokens, (long long)a.n_prompt_tokens, used_a, used_b,
            (long long)a.n_steps, (long long)b.n_steps);
    ck_assert_int_eq(b.n_prefill_tokens, 32 * 216);
    ck_assert_int_eq(b.n_prefix_hit_tokens, 0);
    ck_assert_int_eq(a.n_prompt_tokens, 32 * 216);
    ck_assert_int_eq(a.n_prefill_tokens + a.n_prefix_hit_tokens, 32 * 216);
    /* One job computes the 12 shared full blocks; every other job takes them
     * from the cache, including those admitted while the first one was
     * still computing them (they wait for it). */
    ck_assert_int_eq(a.n_prefill_tokens, 32 * 216 - 31 * 192);
    ck_assert_int_lt(used_a, used_b);
    int32_t n_hit_jobs = 0;
    for (int i = 0; i < 32; i++) {
        ck_assert_int_eq(with[i].n, without[i].n);
        ck_assert_mem_eq(with[i].tok, without[i].tok, (size_t)with[i].n * sizeof(int32_t));
        ck_assert_int_eq(without[i].n_cached, 0);
        ck_assert_int_eq(with[i].n_cached % 16, 0);
        ck_assert_int_le(with[i].n_cached, 208);
        n_hit_jobs += with[i].n_cached == 192; /* 12 full blocks of the 200 shared */
    }
    ck_assert_int_eq(n_hit_jobs, 31);
    /* Idle: blocks holding prefixes stay cached, none in use. */
    ck_assert_int_gt(a.kv_blocks_cached, 12);
    ck_assert_int_eq(b.kv_blocks_cached, 0);
}
END_TEST

/* The case: 100 jobs with one 500-token system prompt, chunked
 * prefill (128 tokens a step, so the first copy takes four steps to
 * compute): the prompt is computed once. */
START_TEST(system_prompt_prefilled_once) {
    shared_run_t sr = {.p = base_params(),
                       .n_jobs = 100,
                       .n_shared = 500,
                       .n_own = 20,
                       .max_tokens = 4,
                       .shared_seed = 9,
                       .own_seed = 5000};
    sr.p.max_batch_size = 16;
    sr.p.max_batch_tokens = 128;
    sr.p.max_queue_depth = 128;
    sr.p.max_seq_len = 600;
    sr.p.kv_block_size = 16;
    sr.p.n_kv_blocks = 600;
    kg_engine_stats_t st;
    run_shared_prefix(&sr, &st, NULL, NULL);
    fprintf(stderr,
            "system prompt, 100 jobs x (500 shared + 20 own) tokens: %lld prefilled, %lld "
            "from the cache, %lld steps\n",
            (long long)st.n_prefill_tokens, (long long)st.n_prefix_hit_tokens,
            (long long)st.n_steps);
    /* 31 full blocks (496 tokens) of the system prompt computed once; every
     * job computes its last 4 system tokens (they share a block with its
     * own) and its 20 own tokens */
    ck_assert_int_eq(st.n_prefix_hit_tokens, 99 * 496);
    ck_assert_int_eq(st.n_prefill_tokens, 100 * 520 - 99 * 496);
}
END_TEST

START_TEST(lru_eviction) {
    /* A pool of 16 blocks: a finished job's prompt stays cached until other
     * jobs need the blocks. */
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 16;
    p.max_batch_size = 2;
    env_t env;
    env_init(&env, &p, 0);
    int32_t a[20], other[40];
    fill_prompt(a, 20, 50);
    kg_request_t r = make_req(1, a, 20, 2);
    submit_ok(&env, &r);
    env_run(&env, 100);
    ck_assert_int_eq(env.jobs[1].n_cached, 0);
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.kv_blocks_cached, 5); /* 21 computed tokens: 5 full blocks */
    r.id = 2;
    submit_ok(&env, &r);
    env_run(&env, 100);
    ck_assert_int_eq(env.jobs[2].n_cached, 16); /* 4 blocks; the last token is recomputed */
    check_greedy(&env, 2, a, 20, 2, false);
    /* A job that grows to all 16 blocks evicts every cached block of a. */
    fill_prompt(other, 40, 51);
    r = make_req(3, other, 40, 25);
    submit_ok(&env, &r);
    env_run(&env, 100);
    r = make_req(4, a, 20, 2);
    submit_ok(&env, &r);
    env_run(&env, 100);
    ck_assert_int_eq(env.jobs[4].n_cached, 0);
    check_greedy(&env, 4, a, 20, 2, false);
    env_clear(&env);
}
END_TEST

START_TEST(no_starvation) {
    /* A long job behind a stream of short ones: the shorts submitted after
     * it must not be admitted before it, however many keep coming. */
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 40;
    env_t env;
    env_init(&env, &p, 0);
    int32_t shortp[8], longp[120];
    fill_prompt(shortp, 8, 60);
    fill_prompt(longp, 120, 61);
    uint64_t id = 1;
    for (; id <= 4; id++) {
        /* They end at different steps, freeing slots while the long one
         * still does not fit: that is when a short one could overtake it. */
        kg_request_t r = make_req(id, shortp, 8, 2 + 3 * (int32_t)id);
        submit_ok(&env, &r);
    }
    env_step(&env);
    kg_request_t lr = make_req(100, longp, 120, 8);
    submit_ok(&env, &lr);
    uint64_t first_after = id;
    for (int s = 0; s < 80; s++) {
        kg_request_t r = make_req(id, shortp, 8, 8);
        if (id < 100 && kg_engine_submit(env.e, &r) == KG_OK) {
            id++;
        }
        env_step(&env);
    }
    env_run(&env, 2000);
    ck_assert(env.jobs[100].done);
    check_greedy(&env, 100, longp, 120, 8, false);
    for (uint64_t i = first_after; i < id; i++) {
        ck_assert_int_ge(env.jobs[i].first_step, env.jobs[100].first_step);
        check_greedy(&env, i, shortp, 8, 8, false);
    }
    ck_assert_uint_gt(id - first_after, 10);
    env_clear(&env);
}
END_TEST

START_TEST(no_deadlock_tiny_pool) {
    /* 3 blocks of 4 tokens: every job outgrows the pool. Each must end with
     * LENGTH once it is alone and cannot grow, never hang. */
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 3;
    p.max_seq_len = 64;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompts[6][5];
    for (int i = 0; i < 6; i++) {
        fill_prompt(prompts[i], 5, 70 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 5, 40);
        submit_ok(&env, &r);
    }
    env_run(&env, 500);
    int32_t ref[MAX_OUT];
    kg_finish_t f;
    for (int i = 0; i < 6; i++) {
        const job_out_t *j = &env.jobs[i + 1];
        ck_assert(j->done);
        ck_assert_int_eq(j->finish, KG_FINISH_LENGTH);
        /* 12 token rows: the 13th token is sampled, then there is no room. */
        ck_assert_int_eq(j->n, 13 - 5);
        ref_greedy(&env.fp, prompts[i], 5, 40, 64, false, ref, &f);
        ck_assert_mem_eq(j->tok, ref, (size_t)j->n * sizeof(int32_t));
    }
    env_clear(&env);
}
END_TEST

// ---- finishing ----

START_TEST(cancel_waiting_and_running) {
    kg_engine_params_t p = base_params();
    p.max_batch_size = 1;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[9];
    fill_prompt(prompt, 9, 80);
    kg_request_t r = make_req(1, prompt, 9, 50);
    submit_ok(&env, &r);
    r.id = 2;
    submit_ok(&env, &r);
    ck_assert(!kg_engine_cancel(env.e, 99));
    for (int i = 0; i < 3; i++) {
        env_step(&env);
    }
    ck_assert_int_eq(env.jobs[1].n, 3);
    ck_assert(kg_engine_cancel(env.e, 2)); /* waiting */
    ck_assert(kg_engine_cancel(env.e, 1)); /* running */
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_gt(st.kv_blocks_used, 0);
    int64_t tokens_before = kg_fake_backend_stats(env.be)->n_tokens;
    env_step(&env);
    ck_assert(env.jobs[1].done && env.jobs[2].done);
    ck_assert_int_eq(env.jobs[1].finish, KG_FINISH_CANCELLED);
    ck_assert_int_eq(env.jobs[2].finish, KG_FINISH_CANCELLED);
    ck_assert_int_eq(env.jobs[1].n, 3);
    ck_assert_int_eq(env.jobs[2].n, 0);
    ck_assert_int_eq(kg_fake_backend_stats(env.be)->n_tokens, tokens_before);
    kg_engine_stats(env.e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert(!kg_engine_busy(env.e));
    ck_assert(!kg_engine_cancel(env.e, 1));
    env_clear(&env);
}
END_TEST

START_TEST(deadline) {
    kg_engine_params_t p = base_params();
    p.max_batch_size = 1;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[9];
    fill_prompt(prompt, 9, 81);
    kg_request_t r = make_req(1, prompt, 9, 50);
    r.deadline_us = env.now_us + 3000;
    submit_ok(&env, &r);
    r.id = 2;
    r.deadline_us = env.now_us + 1000; /* passes while it waits behind job 1 */
    submit_ok(&env, &r);
    r.id = 3;
    r.deadline_us = 0;
    r.max_tokens = 2;
    submit_ok(&env, &r);
    env_step(&env);
    env_step(&env);
    env.now_us += 1000;
    env_step(&env);
    ck_assert(env.jobs[2].done);
    ck_assert_int_eq(env.jobs[2].finish, KG_FINISH_DEADLINE);
    ck_assert_int_eq(env.jobs[2].n, 0);
    ck_assert(!env.jobs[1].done);
    ck_assert_int_eq(env.jobs[1].n, 3);
    env.now_us += 2000;
    env_step(&env);
    ck_assert(env.jobs[1].done);
    ck_assert_int_eq(env.jobs[1].finish, KG_FINISH_DEADLINE);
    ck_assert_int_eq(env.jobs[1].n, 3);
    env_run(&env, 50);
    check_greedy(&env, 3, prompt, 9, 2, false);
    env_clear(&env);
}
END_TEST

START_TEST(max_tokens) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[7];
    fill_prompt(prompt, 7, 82);
    for (int32_t m = 1; m <= 5; m++) {
        kg_request_t r = make_req((uint64_t)m, prompt, 7, m);
        submit_ok(&env, &r);
    }
    env_run(&env, 50);
    for (int32_t m = 1; m <= 5; m++) {
        const job_out_t *j = &env.jobs[m];
        ck_assert_int_eq(j->n, m);
        ck_assert_int_eq(j->finish, KG_FINISH_LENGTH);
        /* The last token and the finish arrive in one completion. */
        ck_assert_int_eq(j->done_step, j->first_step + m - 1);
        check_greedy(&env, (uint64_t)m, prompt, 7, m, false);
    }
    env_clear(&env);
}
END_TEST

START_TEST(eog) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 10 + 3); /* EOG wins once the history has 13 tokens */
    int32_t prompt[10];
    fill_prompt(prompt, 10, 83);
    kg_request_t r = make_req(1, prompt, 10, 20);
    submit_ok(&env, &r);
    r.id = 2;
    r.ignore_eos = true;
    submit_ok(&env, &r);
    env_run(&env, 50);
    const job_out_t *j = &env.jobs[1];
    ck_assert_int_eq(j->finish, KG_FINISH_STOP);
    ck_assert_int_eq(j->n, 3); /* the EOG token itself is not an output token */
    for (int i = 0; i < j->n; i++) {
        ck_assert_int_ne(j->tok[i], EOG);
    }
    check_greedy(&env, 1, prompt, 10, 20, false);
    j = &env.jobs[2];
    ck_assert_int_eq(j->finish, KG_FINISH_LENGTH);
    ck_assert_int_eq(j->n, 20);
    ck_assert_int_eq(j->tok[3], EOG);
    check_greedy(&env, 2, prompt, 10, 20, true);
    env_clear(&env);
}
END_TEST

START_TEST(context_limit) {
    kg_engine_params_t p = base_params();
    p.max_seq_len = 32;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[31];
    fill_prompt(prompt, 31, 84);
    kg_request_t r = make_req(1, prompt, 28, 100);
    submit_ok(&env, &r);
    r = make_req(2, prompt, 31, 100);
    submit_ok(&env, &r);
    env_run(&env, 50);
    ck_assert_int_eq(env.jobs[1].n, 4);
    ck_assert_int_eq(env.jobs[1].finish, KG_FINISH_LENGTH);
    ck_assert_int_eq(env.jobs[2].n, 1);
    ck_assert_int_eq(env.jobs[2].finish, KG_FINISH_LENGTH);
    check_greedy(&env, 1, prompt, 28, 100, false);
    check_greedy(&env, 2, prompt, 31, 100, false);
    env_clear(&env);
}
END_TEST

// ---- invariance and failure ----

enum { INV_JOBS = 24 };

typedef struct inv_job {
    int32_t prompt[48];
    int32_t n_prompt;
    kg_request_t req;
} inv_job_t;

static void make_inv_jobs(inv_job_t *jobs) {
    uint64_t s = 99;
    for (int i = 0; i < INV_JOBS; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        inv_job_t *j = &jobs[i];
        j->n_prompt = 1 + (int32_t)((s >> 33) % 40);
        /* Half share a 16-token start so the prefix cache takes part. */
        fill_prompt(j->prompt, j->n_prompt, i % 2 ? 7 : 200 + (uint64_t)i);
        if (i % 2 && j->n_prompt > 16) {
            fill_prompt(j->prompt + 16, j->n_prompt - 16, 300 + (uint64_t)i);
        }
        j->req = make_req((uint64_t)i + 1, j->prompt, j->n_prompt, 1 + (int32_t)((s >> 45) % 30));
        j->req.ignore_eos = i % 5 == 0;
        if (i % 3 != 0) {
            kg_sampling_params_t *sp = &j->req.sampling;
            sp->temperature = 0.8f + 0.1f * (float)(i % 4);
            sp->top_k = i % 2 ? 20 : 0;
            sp->top_p = 0.95f;
            sp->min_p = i % 4 == 1 ? 0.02f : 0.0f;
            sp->repetition_penalty = i % 3 == 1 ? 1.1f : 1.0f;
            sp->presence_penalty = i % 3 == 2 ? 0.3f : 0.0f;
            sp->seed = 1000 + (uint64_t)i;
            sp->n_logprobs = i % 4;
        }
    }
}

static int32_t g_inv_window; /* kv_window of run_inv's engine (and the fake's window) */

static void run_inv(inv_job_t *jobs,
                    int32_t batch,
                    int32_t n_blocks,
                    bool cache,
                    job_out_t *out,
                    int64_t *n_preempt) {
    kg_engine_params_t p = base_params();
    p.kv_window = g_inv_window;
    p.max_batch_size = batch;
    p.max_batch_tokens = batch > 8 ? 64 : 16;
    p.n_kv_blocks = n_blocks;
    p.prefix_cache = cache;
    env_t env;
    env_init(&env, &p, 40);
    for (int i = 0; i < INV_JOBS; i++) {
        submit_ok(&env, &jobs[i].req);
    }
    env_run(&env, 5000);
    for (int i = 0; i < INV_JOBS; i++) {
        ck_assert(env.jobs[i + 1].done);
        out[i] = env.jobs[i + 1];
        if (jobs[i].req.sampling.temperature == 0.0f) {
            check_greedy(&env, (uint64_t)i + 1, jobs[i].prompt, jobs[i].n_prompt,
                         jobs[i].req.max_tokens, jobs[i].req.ignore_eos);
        }
    }
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    *n_preempt = st.n_preemptions;
    env_clear(&env);
}

/* The attention shapes the invariance runs cover (a new family is one row
 * here): the same jobs in other batch sizes, pools and with or without the
 * prefix cache say what they say alone (batch 1, 512 blocks, cached).
 *  - full attention: the small pools preempt, and some jobs stop at EOG;
 *  - a sliding-window model (every layer sees the last 9 positions): blocks
 *    wholly before the window are given back as jobs advance, under
 *    preemption, prefix caching and eviction. */
typedef struct inv_cfg {
    int32_t batch, n_blocks;
    bool cache;
} inv_cfg_t;

static const struct inv_family {
    const char *name;
    int32_t window;      /* kv_window of the engine and the fake (0: none) */
    inv_cfg_t cfg[5];    /* the configurations compared with the job alone */
    bool expect_preempt; /* the small pools did preempt, and some job stopped at EOG */
} k_inv_families[] = {
    {"full attention",
     0,
     {{16, 512, true}, {16, 512, false}, {4, 512, true}, {16, 24, true}, {3, 20, false}},
     true},
    {"sliding window 9",
     9,
     {{16, 512, true}, {16, 512, false}, {16, 24, true}, {3, 20, false}, {5, 16, true}},
     false},
};

START_TEST(batch_invariance) {
    const struct inv_family *f = &k_inv_families[_i];
    static inv_job_t jobs[INV_JOBS];
    static job_out_t ref[INV_JOBS], got[INV_JOBS];
    make_inv_jobs(jobs);
    g_inv_window = f->window;
    int64_t np;
    run_inv(jobs, 1, 512, true, ref, &np);
    int64_t total_preempt = 0;
    for (size_t c = 0; c < sizeof(f->cfg) / sizeof(f->cfg[0]); c++) {
        run_inv(jobs, f->cfg[c].batch, f->cfg[c].n_blocks, f->cfg[c].cache, got, &np);
        total_preempt += np;
        for (int i = 0; i < INV_JOBS; i++) {
            ck_assert_int_eq(got[i].finish, ref[i].finish);
            ck_assert_msg(got[i].n == ref[i].n, "%s config %zu job %d: %d tokens, alone %d",
                          f->name, c, i, got[i].n, ref[i].n);
            ck_assert_mem_eq(got[i].tok, ref[i].tok, (size_t)ref[i].n * sizeof(int32_t));
        }
    }
    if (f->expect_preempt) {
        ck_assert_int_gt(total_preempt, 0); /* the small pools did preempt */
        int32_t n_stop = 0;
        for (int i = 0; i < INV_JOBS; i++) {
            n_stop += ref[i].finish == KG_FINISH_STOP;
        }
        ck_assert_int_gt(n_stop, 0);
    }
    g_inv_window = 0;
}
END_TEST

/* A long generation with a sliding window holds about window / block_size
 * blocks, not one per block_size tokens; the tokens are the (windowed)
 * fake's greedy ones, and the fake never read a block given back. */
static int32_t run_long_window(int32_t window, job_out_t *out) {
    kg_engine_params_t p = base_params(); /* 4-token blocks */
    p.kv_window = window;
    p.max_seq_len = 400;
    env_t env;
    env_init(&env, &p, 0);
    env.fp.window = 10; /* the model's window, whatever the engine is told */
    kg_backend_free(env.be);
    kg_engine_free(env.e);
    env.be = kg_fake_backend_new(&env.fp);
    char err[256];
    env.e = kg_engine_new(env.be, &p, err, sizeof(err));
    ck_assert_ptr_nonnull(env.e);
    static int32_t prompt[20];
    fill_prompt(prompt, 20, 77);
    kg_request_t r = make_req(1, prompt, 20, 300);
    submit_ok(&env, &r);
    env_run(&env, 1000);
    check_greedy(&env, 1, prompt, 20, 300, false);
    *out = env.jobs[1];
    int32_t used = env.max_used;
    env_clear(&env);
    return used;
}

START_TEST(window_frees_blocks) {
    static job_out_t a, b;
    int32_t used_window = run_long_window(10, &a);
    int32_t used_all = run_long_window(0, &b);
    fprintf(stderr,
            "sliding window 10, 4-token blocks, 20 + 300 tokens: peak blocks in use %d with the "
            "window, %d without\n",
            used_window, used_all);
    ck_assert_int_eq(a.n, 300);
    ck_assert_mem_eq(a.tok, b.tok, 300 * sizeof(int32_t));
    ck_assert_int_eq(used_all, 80);
    /* the window's 10 positions span at most 4 blocks, plus the one being filled */
    ck_assert_int_le(used_window, 5);
}
END_TEST

/* Jobs sharing a prefix longer than the window: blocks are dropped from
 * the front while later jobs still find the shared prefix in the cache. */
START_TEST(window_prefix_cache) {
    kg_engine_params_t p = base_params();
    p.kv_window = 12;
    p.max_batch_size = 4;
    p.n_kv_blocks = 48;
    env_t env;
    env_init(&env, &p, 0);
    static int32_t prompts[12][64];
    for (int i = 0; i < 12; i++) {
        fill_prompt(prompts[i], 40, 5);                     /* shared: 10 full blocks */
        fill_prompt(prompts[i] + 40, 8, 100 + (uint64_t)i); /* own */
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 48, 40);
        submit_ok(&env, &r);
    }
    env_run(&env, 5000);
    int32_t n_hit = 0;
    for (int i = 0; i < 12; i++) {
        check_greedy(&env, (uint64_t)i + 1, prompts[i], 48, 40, false);
        n_hit += env.jobs[i + 1].n_cached > 0;
    }
    ck_assert_int_gt(n_hit, 0);
    env_clear(&env);
}
END_TEST

START_TEST(backend_error) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompts[3][12];
    for (int i = 0; i < 3; i++) {
        fill_prompt(prompts[i], 12, 90 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 12, 10);
        submit_ok(&env, &r);
    }
    env_step(&env);
    env_step(&env);
    ck_assert(kg_engine_cancel(env.e, 3));
    kg_fake_backend_fail_next(env.be, 2);
    ck_assert_int_eq(kg_engine_step(env.e, env.comps, env.cap), KG_ERR_BACKEND);
    ck_assert_int_eq(kg_engine_step(env.e, env.comps, env.cap), KG_ERR_BACKEND);
    ck_assert(kg_engine_busy(env.e));
    /* The engine resumes: the cancel decided in the failed step is reported
     * and the others continue with the tokens they would have had. */
    env_step(&env);
    ck_assert(env.jobs[3].done);
    ck_assert_int_eq(env.jobs[3].finish, KG_FINISH_CANCELLED);
    ck_assert_int_eq(env.jobs[3].n, 2);
    env_run(&env, 100);
    check_greedy(&env, 1, prompts[0], 12, 10, false);
    check_greedy(&env, 2, prompts[1], 12, 10, false);
    ck_assert_int_eq(kg_fake_backend_stats(env.be)->n_failed, 2);
    env_clear(&env);
}
END_TEST

/* A fault the backend pins to one sequence ends that request alone with
 * KG_FINISH_ERROR; the others keep their tokens. A fault of the step as a
 * whole ends the step's requests; a device fault stays fatal. */
START_TEST(backend_fault_scopes) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompts[3][12];
    for (int i = 0; i < 3; i++) {
        fill_prompt(prompts[i], 12, 190 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 12, 10);
        submit_ok(&env, &r);
    }
    env_step(&env);
    env_step(&env);
    /* request 2 was admitted second: slot 1 */
    kg_fake_backend_fault_next(env.be, KG_FAULT_SEQ, 1);
    env_step(&env);
    ck_assert(env.jobs[2].done);
    ck_assert_int_eq(env.jobs[2].finish, KG_FINISH_ERROR);
    ck_assert(!env.jobs[1].done && !env.jobs[3].done);
    env_run(&env, 100);
    check_greedy(&env, 1, prompts[0], 12, 10, false);
    check_greedy(&env, 3, prompts[2], 12, 10, false);

    /* a step fault: every request of that step; a later one runs */
    for (int i = 0; i < 2; i++) {
        kg_request_t r = make_req((uint64_t)i + 4, prompts[i], 12, 10);
        submit_ok(&env, &r);
    }
    env_step(&env);
    kg_fake_backend_fault_next(env.be, KG_FAULT_STEP, -1);
    env_step(&env);
    ck_assert_int_eq(env.jobs[4].finish, KG_FINISH_ERROR);
    ck_assert_int_eq(env.jobs[5].finish, KG_FINISH_ERROR);
    kg_request_t r = make_req(6, prompts[2], 12, 10);
    submit_ok(&env, &r);
    env_run(&env, 100);
    check_greedy(&env, 6, prompts[2], 12, 10, false);

    /* a device fault is the caller's to handle */
    r = make_req(7, prompts[0], 12, 10);
    submit_ok(&env, &r);
    kg_fake_backend_fault_next(env.be, KG_FAULT_DEVICE, -1);
    ck_assert_int_eq(kg_engine_step(env.e, env.comps, env.cap), KG_ERR_BACKEND);
    ck_assert(kg_engine_busy(env.e));
    env_run(&env, 100);
    check_greedy(&env, 7, prompts[0], 12, 10, false);
    ck_assert_str_eq(kg_finish_str(KG_FINISH_ERROR), "error");
    env_clear(&env);
}
END_TEST

/* A sampling failure on one row of a device sampler (which drew every
 * row before it failed) ends that request alone; the others draw the same
 * numbers again when the step reruns, so their seeded tokens are what they
 * would have been without the failure. */
START_TEST(sample_row_fault_keeps_rng) {
    kg_engine_params_t p = base_params();
    env_t a, b;
    int32_t prompts[3][10];
    for (int i = 0; i < 3; i++) {
        fill_prompt(prompts[i], 10, 290 + (uint64_t)i);
    }
    for (int k = 0; k < 2; k++) {
        env_t *env = k == 0 ? &a : &b;
        env_init_with(env, &p, 0, true);
        for (int i = 0; i < 3; i++) {
            kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 10, 12);
            r.sampling.temperature = 1.0f;
            r.sampling.seed = 500 + (uint64_t)i;
            submit_ok(env, &r);
        }
        env_step(env);
        env_step(env);
        if (k == 1) {
            kg_fake_backend_fail_sample_row(env->be, 1); /* request 2's row */
        }
        env_run(env, 100);
    }
    ck_assert_int_eq(b.jobs[2].finish, KG_FINISH_ERROR);
    ck_assert_int_eq(a.jobs[2].finish, KG_FINISH_LENGTH);
    for (uint64_t id = 1; id <= 3; id += 2) {
        ck_assert_int_eq(b.jobs[id].n, 12);
        ck_assert_mem_eq(b.jobs[id].tok, a.jobs[id].tok, 12 * sizeof(int32_t));
    }
    env_clear(&a);
    env_clear(&b);
}
END_TEST

START_TEST(stats_add_up) {
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 14;
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompts[8][20];
    for (int i = 0; i < 8; i++) {
        fill_prompt(prompts[i], 20, 400 + (uint64_t)i);
        kg_request_t r = make_req((uint64_t)i + 1, prompts[i], 20, 12);
        submit_ok(&env, &r);
    }
    env_run(&env, 1000);
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    const kg_fake_backend_stats_t *fs = kg_fake_backend_stats(env.be);
    ck_assert_int_eq(st.n_prefill_tokens + st.n_decode_tokens, fs->n_tokens);
    ck_assert_int_eq(st.n_steps, fs->n_steps);
    ck_assert_int_eq(st.n_prompt_tokens, 8 * 20);
    /* Every output token but the last of each job is fed back once (more
     * with recomputation after preemption, counted as prefill). */
    ck_assert_int_eq(st.n_decode_tokens, 8 * (12 - 1));
    ck_assert_int_gt(st.n_preemptions, 0);
    ck_assert_int_gt(st.n_prefill_tokens, 8 * 20 - st.n_prefix_hit_tokens);
    env_clear(&env);
}
END_TEST

// ---- n choices and logit_bias ----

#define CH_PROMPT 23 /* 5 full blocks of 4 and 3 tokens: the last block is partial */

typedef struct ch_job {
    int32_t prompt[40];
    kg_request_t req;
} ch_job_t;

static void ch_job(ch_job_t *j, uint64_t id, int32_t n_prompt, int32_t n, float temp) {
    fill_prompt(j->prompt, n_prompt, 77);
    j->req = make_req(id, j->prompt, n_prompt, 20);
    j->req.ignore_eos = true;
    j->req.n_choices = n;
    j->req.sampling.temperature = temp;
    j->req.sampling.seed = 4242;
}

static bool same_out(const job_out_t *a, const job_out_t *b) {
    return a->n == b->n && memcmp(a->tok, b->tok, (size_t)a->n * sizeof(int32_t)) == 0;
}

START_TEST(choices_prefill_once) {
    for (int cache = 0; cache < 2; cache++) {
        kg_engine_params_t p = base_params();
        p.prefix_cache = cache;
        env_t env;
        env_init(&env, &p, 0);
        ch_job_t j;
        ch_job(&j, 1, CH_PROMPT, 4, 0.9f);
        submit_ok(&env, &j.req);
        env_run(&env, 200);
        kg_engine_stats_t st;
        kg_engine_stats(env.e, &st);
        /* the prompt once; each other choice adds one decode row for its own
         * logits of the last prompt token, from a copied block */
        ck_assert_int_eq(st.n_prefill_tokens, CH_PROMPT);
        ck_assert_int_eq(st.n_prompt_tokens, CH_PROMPT);
        ck_assert_int_eq(st.n_forks, 3);
        ck_assert_int_eq(kg_fake_backend_stats(env.be)->n_kv_copies, 3);
        ck_assert_int_eq(st.n_decode_tokens, 4 * (20 - 1) + 3);
        int n_distinct = 0;
        for (int c = 0; c < 4; c++) {
            const job_out_t *o = &env.jobs[1 + c * CHOICE_STRIDE];
            ck_assert(o->done);
            ck_assert_int_eq(o->n, 20);
            ck_assert_int_eq(o->finish, KG_FINISH_LENGTH);
            bool dup = false;
            for (int d = 0; d < c; d++) {
                dup |= same_out(o, &env.jobs[1 + d * CHOICE_STRIDE]);
            }
            n_distinct += !dup;
        }
        ck_assert_int_eq(n_distinct, 4); /* independent draws */
        /* choice 0 is the request as it would run with n = 1 */
        job_out_t c0 = env.jobs[1];
        env_clear(&env);
        env_init(&env, &p, 0);
        j.req.n_choices = 1;
        submit_ok(&env, &j.req);
        env_run(&env, 200);
        ck_assert(same_out(&env.jobs[1], &c0));
        env_clear(&env);
    }
}
END_TEST

START_TEST(choices_greedy_share_kv) {
    /* greedy choices must all say what the prompt says alone: the fake's
     * logits are a function of the history read through the block tables,
     * so a wrong shared or copied block changes the tokens */
    const int32_t lens[] = {1, 4, 5, 8, CH_PROMPT};
    for (int no_copy = 0; no_copy < 2; no_copy++) {
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            kg_engine_params_t p = base_params();
            env_t env;
            env_init(&env, &p, 0);
            kg_backend_free(env.be);
            kg_engine_free(env.e);
            env.fp.no_kv_copy = no_copy;
            env.be = kg_fake_backend_new(&env.fp);
            char err[128];
            env.e = kg_engine_new(env.be, &p, err, sizeof(err));
            ch_job_t j;
            ch_job(&j, 2, lens[li], 3, 0.0f);
            submit_ok(&env, &j.req);
            env_run(&env, 200);
            for (int c = 0; c < 3; c++) {
                env.jobs[2] = env.jobs[2 + c * CHOICE_STRIDE];
                check_greedy(&env, 2, j.prompt, lens[li], 20, true);
            }
            kg_engine_stats_t st;
            kg_engine_stats(env.e, &st);
            ck_assert_int_eq(st.n_forks, 2);
            if (!no_copy) {
                ck_assert_int_eq(st.n_prefill_tokens, lens[li]);
            } else { /* the block of the last token is recomputed */
                ck_assert_int_eq(st.n_prefill_tokens,
                                 lens[li] + 2 * ((lens[li] - 1) % p.kv_block_size));
            }
            env_clear(&env);
        }
    }
}
END_TEST

START_TEST(choices_cancel_and_deadline) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    ch_job_t a, b, c;
    ch_job(&a, 1, CH_PROMPT, 3, 0.7f);
    ch_job(&b, 2, CH_PROMPT, 2, 0.7f);
    ch_job(&c, 3, 10, 2, 0.7f);
    c.req.deadline_us = env.now_us + 10;
    submit_ok(&env, &a.req);
    submit_ok(&env, &b.req); /* waits: a holds 3 of the 4 slots */
    submit_ok(&env, &c.req);
    env_step(&env); /* a: prompt computed, choices forked */
    env_step(&env);
    ck_assert(kg_engine_cancel_choice(env.e, 1, 1));
    ck_assert(!kg_engine_cancel_choice(env.e, 1, 7));
    ck_assert(kg_engine_cancel(env.e, 2)); /* both choices, one of them not forked */
    env.now_us += 100;                     /* c's deadline passes before it runs */
    env_run(&env, 200);
    ck_assert_int_eq(env.jobs[1 + CHOICE_STRIDE].finish, KG_FINISH_CANCELLED);
    ck_assert_int_eq(env.jobs[1].finish, KG_FINISH_LENGTH);
    ck_assert_int_eq(env.jobs[1 + 2 * CHOICE_STRIDE].finish, KG_FINISH_LENGTH);
    for (int ch = 0; ch < 2; ch++) {
        ck_assert_int_eq(env.jobs[2 + ch * CHOICE_STRIDE].finish, KG_FINISH_CANCELLED);
        ck_assert_int_eq(env.jobs[2 + ch * CHOICE_STRIDE].n, 0);
        ck_assert_int_eq(env.jobs[3 + ch * CHOICE_STRIDE].finish, KG_FINISH_DEADLINE);
    }
    env_clear(&env);
}
END_TEST

START_TEST(choices_submit_limits) {
    kg_engine_params_t p = base_params();
    p.max_queue_depth = 2; /* 6 records */
    env_t env;
    env_init(&env, &p, 0);
    ch_job_t j;
    ch_job(&j, 1, 8, 5, 0.5f);
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_ERR_INVALID); /* > max_batch_size */
    j.req.n_choices = KG_MAX_CHOICES + 1;
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_ERR_INVALID);
    kg_logit_bias_t bias[KG_MAX_LOGIT_BIAS + 1];
    for (int i = 0; i <= KG_MAX_LOGIT_BIAS; i++) {
        bias[i] = (kg_logit_bias_t){i % VOCAB, 1.0f};
    }
    j.req.n_choices = 4;
    j.req.sampling.logit_bias = bias;
    j.req.sampling.n_logit_bias = KG_MAX_LOGIT_BIAS + 1;
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_ERR_INVALID);
    j.req.sampling.n_logit_bias = 2;
    bias[1].token = bias[0].token;
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_ERR_INVALID); /* a token twice */
    j.req.sampling.n_logit_bias = 1;
    bias[0].token = VOCAB;
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_ERR_INVALID);
    bias[0].token = 1;
    submit_ok(&env, &j.req); /* 4 records of 6 */
    j.req.id = 2;
    ck_assert_int_eq(kg_engine_submit(env.e, &j.req), KG_QUEUE_FULL);
    j.req.n_choices = 2;
    submit_ok(&env, &j.req);
    env_run(&env, 200);
    env_clear(&env);
}
END_TEST

/* A mix of single and multi-choice jobs (some with a bias) in different
 * batch sizes and pools, with and without the cache: every choice says the
 * same whatever shares its steps, also when forks find no block and
 * choices are preempted. */
START_TEST(choices_batch_invariance) {
    enum { N = 10 };
    static ch_job_t jobs[N];
    static const kg_logit_bias_t bias[3] = {{7, KG_LOGIT_BIAS_BAN}, {11, 1.5f}, {EOG, -3.0f}};
    for (int i = 0; i < N; i++) {
        ch_job(&jobs[i], (uint64_t)i + 1, 3 + 4 * i % 29, 1 + i % 4, i % 3 ? 0.8f : 0.0f);
        fill_prompt(jobs[i].prompt, jobs[i].req.n_prompt, i % 2 ? 5 : 50 + (uint64_t)i);
        jobs[i].req.max_tokens = 4 + i % 9;
        jobs[i].req.sampling.seed = 900 + (uint64_t)i;
        jobs[i].req.ignore_eos = i % 2 == 0;
        if (i % 3 == 1) {
            jobs[i].req.sampling.logit_bias = bias;
            jobs[i].req.sampling.n_logit_bias = 3;
        }
    }
    static job_out_t ref[MAX_JOBS];
    const struct {
        int32_t batch, n_blocks;
        bool cache, device_sample;
    } cfg[] = {{4, 512, true, false}, {16, 512, false, false}, {5, 14, true, false},
               {8, 20, false, false}, {4, 12, true, false},    {6, 30, true, true}};
    int64_t n_preempt = 0, n_forks = 0;
    for (size_t k = 0; k < sizeof(cfg) / sizeof(cfg[0]); k++) {
        kg_engine_params_t p = base_params();
        p.max_batch_size = cfg[k].batch;
        p.max_batch_tokens = 16;
        p.n_kv_blocks = cfg[k].n_blocks;
        p.prefix_cache = cfg[k].cache;
        env_t env;
        env_init_with(&env, &p, 12, cfg[k].device_sample);
        for (int i = 0; i < N; i++) {
            submit_ok(&env, &jobs[i].req);
        }
        env_run(&env, 5000);
        kg_engine_stats_t st;
        kg_engine_stats(env.e, &st);
        n_preempt += st.n_preemptions;
        n_forks += st.n_forks;
        for (int i = 0; i < N; i++) {
            for (int c = 0; c < jobs[i].req.n_choices; c++) {
                int at = i + 1 + c * CHOICE_STRIDE;
                ck_assert(env.jobs[at].done);
                for (int t = 0; t < env.jobs[at].n; t++) {
                    ck_assert_int_ne(env.jobs[at].tok[t], i % 3 == 1 ? 7 : -1); /* banned */
                }
                if (k == 0) {
                    ref[at] = env.jobs[at];
                } else {
                    ck_assert_msg(same_out(&env.jobs[at], &ref[at]) &&
                                      env.jobs[at].finish == ref[at].finish,
                                  "config %zu job %d choice %d differs", k, i, c);
                }
            }
        }
        env_clear(&env);
    }
    ck_assert_int_gt(n_preempt, 0);
    ck_assert_int_gt(n_forks, 0);
}
END_TEST

/* Choices of a sliding-window model (every layer sees the last 9
 * positions): the leader gives back blocks before the window while it
 * prefills, the fork shares only what is left, and every choice still says
 * the same in other batch sizes and pools. */
START_TEST(choices_window) {
    enum { N = 6 };
    static ch_job_t jobs[N];
    for (int i = 0; i < N; i++) {
        ch_job(&jobs[i], (uint64_t)i + 1, 9 + 6 * i, 1 + i % 3, i % 2 ? 0.8f : 0.0f);
        fill_prompt(jobs[i].prompt, jobs[i].req.n_prompt, 60 + (uint64_t)i);
        jobs[i].req.sampling.seed = 300 + (uint64_t)i;
    }
    static job_out_t ref[MAX_JOBS];
    const struct {
        int32_t batch, n_blocks;
        bool cache;
    } cfg[] = {{4, 512, true}, {8, 40, false}, {4, 16, true}};
    for (size_t k = 0; k < sizeof(cfg) / sizeof(cfg[0]); k++) {
        kg_engine_params_t p = base_params();
        p.max_batch_size = cfg[k].batch;
        p.max_batch_tokens = 16;
        p.n_kv_blocks = cfg[k].n_blocks;
        p.prefix_cache = cfg[k].cache;
        p.kv_window = 9;
        env_t env;
        env_init(&env, &p, 0);
        for (int i = 0; i < N; i++) {
            submit_ok(&env, &jobs[i].req);
        }
        env_run(&env, 5000);
        for (int i = 0; i < N; i++) {
            for (int c = 0; c < jobs[i].req.n_choices; c++) {
                int at = i + 1 + c * CHOICE_STRIDE;
                ck_assert(env.jobs[at].done);
                if (jobs[i].req.sampling.temperature == 0.0f) {
                    ck_assert(same_out(&env.jobs[at], &env.jobs[i + 1]));
                }
                if (k == 0) {
                    ref[at] = env.jobs[at];
                } else {
                    ck_assert_msg(same_out(&env.jobs[at], &ref[at]),
                                  "config %zu job %d choice %d differs", k, i, c);
                }
            }
        }
        env_clear(&env);
    }
}
END_TEST

START_TEST(logit_bias_ban_and_force) {
    kg_engine_params_t p = base_params();
    env_t env;
    env_init(&env, &p, 0);
    int32_t prompt[12];
    fill_prompt(prompt, 12, 31);
    /* the greedy continuation's first token, banned, never appears even
     * when sampling; a +100 token is always the greedy pick */
    int32_t first = kg_fake_backend_argmax(&env.fp, prompt, 12);
    kg_logit_bias_t ban = {first, -100.0f}, force = {13, 100.0f};
    kg_request_t r1 = make_req(1, prompt, 12, 60);
    r1.ignore_eos = true;
    r1.sampling.temperature = 1.5f;
    r1.sampling.seed = 3;
    r1.sampling.logit_bias = &ban;
    r1.sampling.n_logit_bias = 1;
    kg_request_t r2 = make_req(2, prompt, 12, 30);
    r2.sampling.logit_bias = &force;
    r2.sampling.n_logit_bias = 1;
    submit_ok(&env, &r1);
    submit_ok(&env, &r2);
    env_run(&env, 200);
    ck_assert_int_eq(env.jobs[1].n, 60);
    for (int t = 0; t < 60; t++) {
        ck_assert_int_ne(env.jobs[1].tok[t], first);
    }
    ck_assert_int_eq(env.jobs[2].n, 30);
    for (int t = 0; t < 30; t++) {
        ck_assert_int_eq(env.jobs[2].tok[t], 13);
    }
    env_clear(&env);
}
END_TEST

/* Built into its own program, unit_engine_alloc (this file compiled with
 * KG_ENGINE_ALLOC_ONLY): it replaces malloc, which AddressSanitizer owns, so
 * under ASan that program reports a skip (exit 77) instead of a pass. */
#ifdef KG_ENGINE_ALLOC_ONLY
START_TEST(no_alloc_in_step) {
#if KG_COUNT_ALLOC
    kg_engine_params_t p = base_params();
    p.n_kv_blocks = 24; /* small enough to preempt and evict */
    env_t env;
    env_init(&env, &p, 30);
    static inv_job_t jobs[INV_JOBS];
    make_inv_jobs(jobs);
    long n_allocs = 0;
    for (int i = 0; i < INV_JOBS; i++) {
        long before = g_n_allocs;
        kg_status_t st = kg_engine_submit(env.e, &jobs[i].req);
        n_allocs += g_n_allocs - before;
        ck_assert_int_eq(st, KG_OK);
    }
    /* and three choices of one prompt, with a logit bias */
    const kg_logit_bias_t bias[2] = {{5, KG_LOGIT_BIAS_BAN}, {9, 2.5f}};
    kg_request_t cr = jobs[0].req;
    cr.id = INV_JOBS + 1;
    cr.n_choices = 3;
    cr.sampling.temperature = 0.9f;
    cr.sampling.logit_bias = bias;
    cr.sampling.n_logit_bias = 2;
    long before_c = g_n_allocs;
    kg_status_t cst = kg_engine_submit(env.e, &cr);
    n_allocs += g_n_allocs - before_c;
    ck_assert_int_eq(cst, KG_OK);
    int64_t steps = 0;
    bool cancelled = false;
    while (kg_engine_busy(env.e)) {
        long before = g_n_allocs;
        if (steps == 5) {
            cancelled = kg_engine_cancel(env.e, INV_JOBS - 1) && kg_engine_cancel(env.e, INV_JOBS);
        }
        int32_t n = kg_engine_step(env.e, env.comps, env.cap);
        n_allocs += g_n_allocs - before;
        ck_assert_int_ge(n, 0);
        env_collect(&env, n);
        ck_assert_int_lt(++steps, 5000);
    }
    ck_assert(cancelled);
    kg_engine_stats_t st;
    kg_engine_stats(env.e, &st);
    ck_assert_int_gt(st.n_forks, 0);
    ck_assert_int_gt(st.n_preemptions, 0);
    ck_assert_int_gt(st.n_prefix_hit_tokens, 0);
    ck_assert_int_eq(n_allocs, 0);
    /* The counter works: creating an engine allocates. */
    long before = g_n_allocs;
    env_t env2;
    env_init(&env2, &p, 0);
    ck_assert_int_gt(g_n_allocs, before);
    env_clear(&env2);
    env_clear(&env);
#endif
}
END_TEST
#endif

START_TEST(params_default_from_model) {
    const char *path = kg_test_data("models/stories260K.gguf");
    char err[256] = "";
    kg_model_t *model = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(model != NULL, "%s", err);
    kg_engine_params_t p = kg_engine_params_default(model, 0);
    int32_t ctx = model->hp.n_ctx_train < 4096 ? model->hp.n_ctx_train : 4096;
    ck_assert_int_eq(p.max_batch_size, 16);
    ck_assert_int_eq(p.max_queue_depth, 256);
    ck_assert_int_eq(p.max_batch_tokens, 512);
    ck_assert_int_eq(p.max_seq_len, ctx);
    ck_assert_int_eq(p.kv_block_size, 16);
    ck_assert_int_eq(p.n_kv_blocks, (16 * ctx + 15) / 16);
    ck_assert_int_eq(p.n_vocab, model->hp.n_vocab);
    ck_assert(p.prefix_cache);
    ck_assert_int_ge(p.n_eog, 1); /* </s> */
    for (int i = 0; i < p.n_eog; i++) {
        ck_assert(kg_tokenizer_is_eog(model->tok, p.eog[i]));
    }
    ck_assert(kg_tokenizer_is_eog(model->tok, kg_tokenizer_eos(model->tok)));
    size_t per_block = kg_backend_kv_bytes_per_token(model, KG_KV_F16) * 16;
    p = kg_engine_params_default(model, per_block * 100 + per_block / 2);
    ck_assert_int_eq(p.n_kv_blocks, 100);
    kg_model_free(model);
}
END_TEST

// ---- constrained requests ----

/* Token texts for the fake's 64 ids: 0-2 and EOG have none; then letters,
 * digits, punctuation and a few multi-byte tokens. */
static kg_gvocab_t *fake_vocab(void) {
    static const char *const t[VOCAB] = {
        "",   "",   "",    "",     "a",     "b",  "c",   "d",   "e",   "f",  "g",  "h",   "l",
        "o",  "p",  "x",   "y",    "z",     "0",  "1",   "2",   "3",   "4",  "5",  "6",   "7",
        "8",  "9",  "{",   "}",    "[",     "]",  ",",   ":",   "\"",  " ",  "\n", "-",   "+",
        "ab", "ba", "hel", "help", "hello", "lo", "{\"", "\":", "\",", "ok", "12", "xyz", "q",
        "r",  "s",  "t",   "u",    "v",     "w",  "(",   ")",   "*",   "/",  ".",  "!"};
    size_t lens[VOCAB];
    for (int i = 0; i < VOCAB; i++) {
        lens[i] = strlen(t[i]);
    }
    char err[128];
    kg_gvocab_t *v = kg_gvocab_new_raw(t, lens, VOCAB, err, sizeof(err));
    ck_assert_msg(v != NULL, "%s", err);
    return v;
}

static kg_grammar_t *fake_grammar(kg_gvocab_t *v, kg_constraint_kind_t kind, const char *text) {
    char err[256];
    kg_constraint_t k = {.kind = kind, .text = text, .len = strlen(text)};
    kg_gir_t *ir = kg_constraint_build(&k, NULL, NULL, err, sizeof(err));
    ck_assert_msg(ir != NULL, "%s", err);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gir_free(ir);
    return g;
}

/* Whether the job's tokens spell a complete match (checked by a fresh
 * matcher, token by token). */
static bool spells_match(kg_grammar_t *g, const job_out_t *j) {
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, g);
    bool ok = true;
    for (int32_t i = 0; i < j->n && ok; i++) {
        ok = kg_matcher_accept(m, j->tok[i]);
    }
    ok = ok && kg_matcher_can_end(m);
    kg_matcher_free(m);
    return ok;
}

/* Whether PCRE2 full-matches the job's text (its tokens' bytes) with `re`. */
static bool pcre2_full_match(const kg_gvocab_t *v, const char *re, const job_out_t *j) {
    char text[4096];
    size_t n = 0;
    for (int32_t i = 0; i < j->n; i++) {
        size_t len = (size_t)(v->off[j->tok[i] + 1] - v->off[j->tok[i]]);
        ck_assert_uint_lt(n + len, sizeof(text));
        memcpy(text + n, v->bytes + v->off[j->tok[i]], len);
        n += len;
    }
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *code =
        pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &errcode, &erroff, NULL);
    ck_assert(code != NULL);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)text, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return rc > 0;
}

/* Sampled and greedy constrained jobs: every output is a complete match
 * (EOG only where the grammar may end, a complete grammar ends STOP),
 * forced tokens are appended (several completions in one step), a job
 * cut by max_tokens ends LENGTH, the steps do not allocate, and each
 * constrained job's tokens are the same alone and among unconstrained
 * jobs. */
START_TEST(constrained_jobs) {
    kg_gvocab_t *v = fake_vocab();
    static const char *const res[3] = {NULL, "(hello|help) [xyz]+!?", "[a-c]+"};
    kg_grammar_t *gs[3] = {
        fake_grammar(v, KG_CONSTRAINT_GRAMMAR,
                     "root ::= \"{\" ( item (\",\" item)* )? \"}\"\nitem ::= [a-h] [0-9]{0,2}\n"),
        fake_grammar(v, KG_CONSTRAINT_REGEX, "(hello|help) [xyz]+!?"),
        fake_grammar(v, KG_CONSTRAINT_REGEX, "[a-c]+"),
    };
    const int32_t NJ = 24;
    int32_t prompts[24][6];
    job_out_t alone[24];
    for (int pass = 0; pass < 2; pass++) {
        env_t env;
        kg_engine_params_t ep = base_params();
        env_init(&env, &ep, 14); /* EOG wins from 14 tokens on, where it is allowed */
        for (int32_t i = 0; i < NJ; i++) {
            fill_prompt(prompts[i], 6, 100 + (uint64_t)i);
            kg_request_t r = make_req((uint64_t)i, prompts[i], 6, i == 5 ? 3 : 40);
            r.grammar = gs[i % 3];
            r.sampling.temperature = i % 2 ? 1.0f : 0.0f;
            r.sampling.seed = 7 + (uint64_t)i;
            submit_ok(&env, &r);
            if (pass == 1) {
                /* unconstrained jobs around it */
                kg_request_t u = make_req((uint64_t)(100 + i), prompts[i], 5, 20);
                u.sampling.temperature = 1.0f;
                u.sampling.seed = (uint64_t)i;
                submit_ok(&env, &u);
            }
            if (pass == 0) {
                env_run(&env, 5000); /* alone */
            }
        }
        long n_allocs = 0;
        for (int64_t k = 0; kg_engine_busy(env.e); k++) {
            ck_assert_int_lt(k, 20000);
#if KG_COUNT_ALLOC
            long before = g_n_allocs;
#endif
            int32_t n = kg_engine_step(env.e, env.comps, env.cap);
#if KG_COUNT_ALLOC
            n_allocs += g_n_allocs - before;
#endif
            ck_assert_int_ge(n, 0);
            env.n_steps++;
            env_collect(&env, n);
        }
        ck_assert_int_eq(n_allocs, 0); /* the step loop never allocates */
        kg_engine_stats_t st;
        kg_engine_stats(env.e, &st);
        int n_stop = 0;
        for (int32_t i = 0; i < NJ; i++) {
            job_out_t *j = &env.jobs[i];
            ck_assert(j->done);
            if (i == 5) {
                ck_assert_int_eq(j->finish, KG_FINISH_LENGTH);
                ck_assert_int_eq(j->n, 3);
            } else if (j->finish == KG_FINISH_LENGTH) {
                ck_assert_int_eq(j->n, 40);
            } else {
                ck_assert_msg(j->finish == KG_FINISH_STOP, "job %d finish %d", i, j->finish);
                ck_assert_msg(spells_match(gs[i % 3], j), "job %d does not match", i);
                if (res[i % 3]) {
                    ck_assert_msg(pcre2_full_match(v, res[i % 3], j), "job %d: PCRE2", i);
                }
                n_stop++;
            }
            for (int32_t k = 0; k < j->n; k++) {
                ck_assert_int_ne(j->tok[k], EOG);
            }
            if (pass == 0) {
                alone[i] = *j;
            } else {
                ck_assert_int_eq(j->n, alone[i].n);
                ck_assert(memcmp(j->tok, alone[i].tok, (size_t)j->n * sizeof(int32_t)) == 0);
            }
        }
        ck_assert_int_ge(n_stop, NJ / 2);
        ck_assert_int_gt(st.n_grammar_forced_tokens, 0);
        ck_assert_int_gt(st.n_grammar_masks, 0);
        env_clear(&env);
    }
    for (int i = 0; i < 3; i++) {
        kg_grammar_unref(gs[i]);
    }
    kg_gvocab_unref(v);
}
END_TEST

// ---- reasoning: the thinking budget and the grammar after the thought ----

#define THINK_OPEN  1 /* the fake's <think> and </think> (tokens without text) */
#define THINK_CLOSE 2

static const int32_t think_close[1] = {THINK_CLOSE};

static kg_request_t think_req(uint64_t id, const int32_t *prompt, int32_t mode, int32_t budget) {
    kg_request_t r = make_req(id, prompt, 6, 40);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1000 + id;
    r.think = mode;
    r.think_open = THINK_OPEN;
    r.think_close = think_close;
    r.n_think_close = 1;
    r.think_budget = budget;
    return r;
}

/* Index of the first `tok` in the job's output at or after `from`, or -1. */
static int32_t find_tok(const job_out_t *j, int32_t tok, int32_t from) {
    for (int32_t i = from; i < j->n; i++) {
        if (j->tok[i] == tok) {
            return i;
        }
    }
    return -1;
}

/* A thought opened by the prompt closes after think_budget tokens (the
 * closing token appended by the engine) or earlier when the model closes
 * it; budget 0 closes it at once; no budget leaves the thought alone; a
 * thought the first token opens counts from the token after it. */
START_TEST(thinking_budget) {
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 0);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 77);
    const int32_t NJ = 40;
    for (int32_t i = 0; i < NJ; i++) {
        int32_t budget = i % 4 == 0 ? 0 : i % 4 == 1 ? -1 : 3 + i % 5;
        kg_request_t r = think_req((uint64_t)i, prompt, KG_THINK_REQ_OPEN, budget);
        if (i >= 30) {
            r.think = KG_THINK_REQ_MAY_OPEN;
        }
        submit_ok(&env, &r);
    }
    env_run(&env, 5000);
    int n_forced = 0;
    for (int32_t i = 0; i < NJ; i++) {
        const job_out_t *j = &env.jobs[i];
        int32_t budget = i % 4 == 0 ? 0 : i % 4 == 1 ? -1 : 3 + i % 5;
        int32_t from = 0;
        if (i >= 30) {
            if (j->tok[0] != THINK_OPEN) {
                continue; /* no thought opened: nothing to close */
            }
            from = 1;
        }
        int32_t close = find_tok(j, THINK_CLOSE, from);
        if (budget < 0) {
            continue; /* the model closes it, or max_tokens ends it */
        }
        ck_assert_msg(close >= 0 && close - from <= budget, "job %d: close at %d, budget %d", i,
                      close, budget);
        n_forced += close - from == budget;
    }
    ck_assert_int_gt(n_forced, 10);
    env_clear(&env);
}
END_TEST

/* With a grammar, the thought is not constrained and the grammar starts at
 * the token after the closing token: the answer matches it, the thought
 * holds tokens the grammar would refuse. MAY_OPEN: the first token is the
 * opening token or the grammar's (the mask allows both). The same jobs
 * give the same tokens among unconstrained jobs. */
START_TEST(grammar_after_thought) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *g = fake_grammar(v, KG_CONSTRAINT_REGEX, "[a-c]+");
    int32_t prompt[6];
    fill_prompt(prompt, 6, 78);
    const int32_t NJ = 32;
    job_out_t alone[32];
    for (int pass = 0; pass < 2; pass++) {
        env_t env;
        kg_engine_params_t ep = base_params();
        env_init(&env, &ep, 20);
        for (int32_t i = 0; i < NJ; i++) {
            kg_request_t r = think_req((uint64_t)i, prompt,
                                       i < 24 ? KG_THINK_REQ_OPEN : KG_THINK_REQ_MAY_OPEN, 4);
            r.grammar = g;
            /* MAY_OPEN: half the jobs prefer the opening token, half never take it */
            static const kg_logit_bias_t open_bias[2] = {{THINK_OPEN, 100.0f},
                                                         {THINK_OPEN, -100.0f}};
            if (i >= 24) {
                r.sampling.logit_bias = &open_bias[i % 2];
                r.sampling.n_logit_bias = 1;
            }
            submit_ok(&env, &r);
            if (pass == 1) {
                kg_request_t u = make_req((uint64_t)(100 + i), prompt, 5, 12);
                u.sampling.temperature = 1.0f;
                submit_ok(&env, &u);
            } else {
                env_run(&env, 5000);
            }
        }
        env_run(&env, 20000);
        int n_refused_in_thought = 0, n_opened = 0, n_matched = 0;
        for (int32_t i = 0; i < NJ; i++) {
            const job_out_t *j = &env.jobs[i];
            ck_assert(j->done);
            int32_t from = i < 24 ? 0 : j->tok[0] == THINK_OPEN ? 1 : -1;
            int32_t close = from >= 0 ? find_tok(j, THINK_CLOSE, from) : -1;
            ck_assert(from < 0 || (close >= 0 && close - from <= 4));
            n_opened += i >= 24 && from == 1;
            for (int32_t k = from >= 0 ? from : 0; k < close; k++) {
                n_refused_in_thought += j->tok[k] < 4 || j->tok[k] > 6;
            }
            job_out_t answer = {.n = 0};
            for (int32_t k = close + 1; k < j->n; k++) {
                answer.tok[answer.n++] = j->tok[k];
            }
            if (j->finish == KG_FINISH_STOP) {
                ck_assert_msg(spells_match(g, &answer), "job %d: the answer does not match", i);
                n_matched++;
            }
            if (pass == 0) {
                alone[i] = *j;
            } else {
                ck_assert_int_eq(j->n, alone[i].n);
                ck_assert(memcmp(j->tok, alone[i].tok, (size_t)j->n * sizeof(int32_t)) == 0);
            }
        }
        ck_assert_int_gt(n_refused_in_thought, 0);
        ck_assert_int_gt(n_matched, NJ / 2);
        if (pass == 0) {
            ck_assert_msg(n_opened == 4, "MAY_OPEN opened %d of 8", n_opened);
        }
        env_clear(&env);
    }
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

/* A lazy grammar (an auto tool call's): the output is free until the
 * trigger token, which the grammar takes as its first; from there it matches
 * the grammar and ends when it is complete. Jobs that never sample the
 * trigger end as unconstrained ones do (EOG allowed). A lazy request needs a
 * grammar and a trigger of the vocabulary. */
START_TEST(lazy_grammar) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *g = fake_grammar(v, KG_CONSTRAINT_REGEX, "hel[lo]{3}");
    const int32_t HEL = 41;
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 30);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 79);
    const int32_t NJ = 40;
    for (int32_t i = 0; i < NJ; i++) {
        kg_request_t r = make_req((uint64_t)i, prompt, 6, 80);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = 3000 + (uint64_t)i;
        r.grammar = g;
        r.lazy = true;
        r.lazy_token = HEL;
        submit_ok(&env, &r);
    }
    env_run(&env, 20000);
    int n_triggered = 0, n_free = 0, n_eog = 0;
    for (int32_t i = 0; i < NJ; i++) {
        const job_out_t *j = &env.jobs[i];
        ck_assert(j->done);
        int32_t t = find_tok(j, HEL, 0);
        for (int32_t k = 0; k < (t >= 0 ? t : j->n); k++) {
            n_free += j->tok[k] != 12 && j->tok[k] != 13 && j->tok[k] != 44;
        }
        if (t < 0) {
            n_eog += j->finish == KG_FINISH_STOP;
            continue;
        }
        n_triggered++;
        job_out_t call = {.n = 0};
        for (int32_t k = t; k < j->n; k++) {
            call.tok[call.n++] = j->tok[k];
        }
        ck_assert_msg(j->finish == KG_FINISH_STOP && spells_match(g, &call),
                      "job %d: after the trigger the output is not the grammar's", i);
    }
    ck_assert_int_gt(n_triggered, 3);
    ck_assert_int_gt(n_free, 0);
    ck_assert_int_gt(n_eog, 0);
    kg_request_t r = make_req(100, prompt, 6, 8);
    r.lazy = true;
    r.lazy_token = HEL;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID); /* no grammar */
    r.grammar = g;
    r.lazy_token = VOCAB;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    env_clear(&env);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

/* A lazy grammar the trigger opens (lazy_opens: a control token, which no
 * grammar spells): the trigger is appended as it is, and the output after
 * it matches the grammar from its first token. Token 2 has no text, as a
 * control token has none in the grammar's vocabulary. */
START_TEST(lazy_grammar_opens) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *g = fake_grammar(v, KG_CONSTRAINT_REGEX, "hel[lo]{3}");
    const int32_t TRIGGER = 2;
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 30);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 79);
    const int32_t NJ = 40;
    for (int32_t i = 0; i < NJ; i++) {
        kg_request_t r = make_req((uint64_t)i, prompt, 6, 80);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = 5000 + (uint64_t)i;
        r.grammar = g;
        r.lazy = true;
        r.lazy_opens = true;
        r.lazy_token = TRIGGER;
        submit_ok(&env, &r);
    }
    env_run(&env, 20000);
    int n_triggered = 0;
    for (int32_t i = 0; i < NJ; i++) {
        const job_out_t *j = &env.jobs[i];
        ck_assert(j->done);
        int32_t t = find_tok(j, TRIGGER, 0);
        if (t < 0) {
            continue;
        }
        n_triggered++;
        job_out_t call = {.n = 0};
        for (int32_t k = t + 1; k < j->n; k++) {
            call.tok[call.n++] = j->tok[k];
        }
        ck_assert_msg(j->finish == KG_FINISH_STOP && spells_match(g, &call),
                      "job %d: after the trigger the output is not the grammar's", i);
    }
    ck_assert_int_gt(n_triggered, 3);
    env_clear(&env);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

/* A request's thought must name valid markers. */
START_TEST(thinking_submit_validation) {
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 0);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 79);
    kg_request_t r = think_req(1, prompt, KG_THINK_REQ_OPEN, 3);
    r.n_think_close = 0;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r = think_req(1, prompt, KG_THINK_REQ_MAY_OPEN, 3);
    r.think_open = VOCAB;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    static const int32_t bad_close[1] = {-1};
    r = think_req(1, prompt, KG_THINK_REQ_OPEN, 3);
    r.think_close = bad_close;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    env_clear(&env);
}
END_TEST

/* A grammar the vocabulary cannot finish: after "a" the regex a[ij] needs
 * an i or a j, and the fake vocabulary has neither. The request ends
 * KG_FINISH_GRAMMAR after its one token (it used to end STOP, which made
 * an output that does not match look like a normal end). */
START_TEST(constrained_dead_end) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *g = fake_grammar(v, KG_CONSTRAINT_REGEX, "a[ij]");
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 14);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 3);
    kg_request_t r = make_req(0, prompt, 6, 10);
    r.grammar = g;
    submit_ok(&env, &r);
    env_run(&env, 1000);
    ck_assert(env.jobs[0].done);
    ck_assert_int_eq(env.jobs[0].finish, KG_FINISH_GRAMMAR);
    ck_assert_int_eq(env.jobs[0].n, 1);
    ck_assert_str_eq(kg_finish_str(KG_FINISH_GRAMMAR), "grammar");
    env_clear(&env);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

/* n choices of a constrained prompt: each choice has its own matcher (every
 * output matches, the choices differ), the prompt is still prefilled once,
 * and each choice says the same with and without other jobs around it and
 * with n = 1 for choice 0. */
START_TEST(constrained_choices) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *gs[2] = {
        fake_grammar(v, KG_CONSTRAINT_GRAMMAR,
                     "root ::= \"{\" ( item (\",\" item)* )? \"}\"\nitem ::= [a-h] [0-9]{0,2}\n"),
        fake_grammar(v, KG_CONSTRAINT_REGEX, "[a-c]+"),
    };
    for (int g = 0; g < 2; g++) {
        job_out_t first[4];
        for (int pass = 0; pass < 3; pass++) {
            kg_engine_params_t p = base_params();
            p.prefix_cache = pass != 1;
            env_t env;
            env_init(&env, &p, 14);
            ch_job_t j;
            ch_job(&j, 1, CH_PROMPT, pass == 2 ? 1 : 4, 1.0f);
            j.req.ignore_eos = false;
            j.req.max_tokens = 40;
            j.req.grammar = gs[g];
            submit_ok(&env, &j.req);
            int32_t other[6];
            fill_prompt(other, 6, 5);
            kg_request_t u = make_req(2, other, 6, 30);
            u.sampling.temperature = 1.0f;
            if (pass == 1) {
                submit_ok(&env, &u); /* an unconstrained job around it */
            }
            env_run(&env, 5000);
            kg_engine_stats_t st;
            kg_engine_stats(env.e, &st);
            if (pass == 0) {
                ck_assert_int_eq(st.n_forks, 3);
                ck_assert_int_eq(st.n_prefill_tokens, CH_PROMPT);
            }
            int n_distinct = 0;
            for (int c = 0; c < j.req.n_choices; c++) {
                const job_out_t *o = &env.jobs[1 + c * CHOICE_STRIDE];
                ck_assert(o->done);
                if (o->finish == KG_FINISH_LENGTH) {
                    ck_assert_int_eq(o->n, 40);
                } else {
                    ck_assert_int_eq(o->finish, KG_FINISH_STOP);
                    ck_assert_msg(spells_match(gs[g], o), "grammar %d choice %d", g, c);
                }
                if (pass == 0) {
                    first[c] = *o;
                    bool dup = false;
                    for (int d = 0; d < c; d++) {
                        dup |= same_out(o, &first[d]);
                    }
                    n_distinct += !dup;
                } else {
                    ck_assert_msg(same_out(o, &first[c]), "grammar %d pass %d choice %d", g, pass,
                                  c);
                }
            }
            if (pass == 0) {
                ck_assert_int_ge(n_distinct, 2);
            }
            env_clear(&env);
        }
    }
    for (int i = 0; i < 2; i++) {
        kg_grammar_unref(gs[i]);
    }
    kg_gvocab_unref(v);
}
END_TEST

/* kg_engine_size: the one sizing every program uses */
START_TEST(sizing_from_options) {
    char err[256] = "";
    kg_model_t *model = kg_model_load(kg_test_data("models/stories260K.gguf"), err, sizeof(err));
    ck_assert_msg(model != NULL, "%s", err);
    kg_engine_options_t o = kg_engine_options_default();
    kg_engine_params_t ep;
    kg_backend_params_t bp;
    bool clamped = true;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)), KG_OK);
    ck_assert(!clamped);
    ck_assert_int_eq(ep.max_batch_size, 16);
    ck_assert_int_eq(ep.max_queue_depth, 16);
    ck_assert_int_eq(ep.max_seq_len, model->hp.n_ctx_train); /* 128 < 4096 */
    /* every slot at full context, beyond the admission headroom */
    int32_t full = 16 * ((ep.max_seq_len + 15) / 16);
    ck_assert_int_ge(ep.n_kv_blocks - (ep.n_kv_blocks / 100 > 1 ? ep.n_kv_blocks / 100 : 1), full);
    ck_assert_int_eq(bp.n_kv_blocks, ep.n_kv_blocks);
    ck_assert_int_eq(bp.kv_block_size, ep.kv_block_size);
    ck_assert_int_eq(bp.max_batch_tokens, ep.max_batch_tokens);
    ck_assert(ep.prefix_cache);

    /* explicit values pass through */
    o.max_batch_size = 4;
    o.max_queue_depth = 10;
    o.max_batch_tokens = 64;
    o.ctx = 96;
    o.kv_block_size = 8;
    o.prefix_cache = false;
    o.threads = 3;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(ep.max_batch_size, 4);
    ck_assert_int_eq(ep.max_queue_depth, 10);
    ck_assert_int_eq(ep.max_seq_len, 96);
    ck_assert_int_eq(ep.kv_block_size, 8);
    ck_assert(!ep.prefix_cache);
    ck_assert_int_eq(bp.n_threads, 3);

    /* a pool smaller than one context cuts the context to what it holds */
    o = kg_engine_options_default();
    o.kv_memory_mib = 1;
    size_t per_block = kg_backend_kv_bytes_per_token(model, KG_KV_F16) * 16;
    int64_t blocks = (1 << 20) / (int64_t)per_block;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(ep.n_kv_blocks, blocks);
    if (blocks * 16 < model->hp.n_ctx_train) {
        ck_assert(clamped);
        ck_assert_int_eq(ep.max_seq_len, blocks * 16);
    }
    ck_assert_int_eq(bp.kv_type, KG_KV_F16);
    /* --kv-type q8_0: the same MiB hold 64/34 the tokens (a 32-value row:
     * 34 bytes instead of 64), and the backend is told */
    ck_assert_uint_eq(kg_backend_kv_bytes_per_token(model, KG_KV_Q8_0) * 64,
                      kg_backend_kv_bytes_per_token(model, KG_KV_F16) * 34);
    o.kv_type = KG_KV_Q8_0;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(ep.n_kv_blocks,
                     (1 << 20) / (int64_t)(kg_backend_kv_bytes_per_token(model, KG_KV_Q8_0) * 16));
    ck_assert_int_gt(ep.n_kv_blocks, blocks);
    ck_assert_int_eq(bp.kv_type, KG_KV_Q8_0);

    /* a file whose layers are all recurrent keeps no KV: --kv-memory sizes
     * nothing (once a division by zero) and the default count stands */
    kg_layer_kind_t kinds[64];
    ck_assert_int_le(model->hp.n_layer, 64);
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        kinds[il] = model->layers[il].kind;
        model->layers[il].kind = KG_LAYER_MAMBA2;
    }
    ck_assert_uint_eq(kg_backend_kv_bytes_per_block(model, KG_KV_Q8_0, 16), 0);
    o = kg_engine_options_default();
    o.kv_memory_mib = 1;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)), KG_OK);
    ck_assert_int_gt(ep.n_kv_blocks, 0);
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        model->layers[il].kind = kinds[il];
    }

    /* options that cannot work together */
    o = kg_engine_options_default();
    o.max_batch_size = 32;
    o.max_batch_tokens = 16;
    ck_assert_int_eq(kg_engine_size(model, &o, &ep, &bp, NULL, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "--max-batch-tokens"));
    kg_model_free(model);
}
END_TEST

#ifdef KG_ENGINE_ALLOC_ONLY
static Suite *make_suite(void) {
    Suite *s = suite_create("engine_alloc");
    TCase *tc = tcase_create("invariance");
    tcase_add_test(tc, no_alloc_in_step);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    if (!KG_COUNT_ALLOC) {
        fprintf(stderr, "no_alloc_in_step: skipped under AddressSanitizer (it owns malloc)\n");
        return 77;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
#else
/* Where a text trigger fires in job j as the engine reads it (the prompt's bytes, then the
 * output's token by token; the first trigger occurrence ending inside a token whose feed the
 * grammar takes): the token's index, and `m` advanced by the feed; -1 when none fires. */
static int32_t text_trigger_at(kg_grammar_t *g,
                               const int32_t *prompt,
                               int32_t n_prompt,
                               const job_out_t *j,
                               const char *trigger,
                               size_t from,
                               kg_matcher_t *m) {
    uint8_t text[2048];
    size_t len = 0, n;
    for (int32_t i = 0; i < n_prompt; i++) {
        const uint8_t *b = kg_grammar_token_bytes(g, prompt[i], &n);
        memcpy(text + len, b, n);
        len += n;
    }
    const size_t tl = strlen(trigger);
    for (int32_t k = 0; k < j->n; k++) {
        size_t before = len;
        const uint8_t *b = kg_grammar_token_bytes(g, j->tok[k], &n);
        memcpy(text + len, b, n);
        len += n;
        for (size_t at = 0; at + tl <= len; at++) {
            if (at + tl > before && memcmp(text + at, trigger, tl) == 0) {
                kg_matcher_reset(m, g);
                if (kg_matcher_accept_bytes(m, text + at + from, len - at - from)) {
                    return k;
                }
            }
        }
    }
    return -1;
}

/* A lazy grammar with a text trigger (gpt-oss's call header): the output is free until its
 * text, read on from the prompt, holds the trigger ending inside a token; the grammar takes
 * the text from the trigger's feed point to that token's end, and constrains the rest. A
 * trigger that spans tokens or begins in the prompt fires; one the grammar refuses ("zaba":
 * the token after "za" is "ba") does not, and the output stays free. */
START_TEST(lazy_grammar_text) {
    kg_gvocab_t *v = fake_vocab();
    kg_grammar_t *g = fake_grammar(v, KG_CONSTRAINT_REGEX, "ab[0-9]{4}");
    const int32_t Z = 17, A = 4, B = 5, AB = 39, BA = 40;
    env_t env;
    kg_engine_params_t ep = base_params();
    env_init(&env, &ep, 30);
    int32_t prompt[6];
    fill_prompt(prompt, 6, 81);
    prompt[5] = Z; /* the prompt ends in "z": a first token "ab" completes the trigger */
    const int32_t NJ = 48;
    static const kg_logit_bias_t near[5] = {
        {17, 3.5f}, {4, 4.0f}, {5, 4.0f}, {39, 2.5f}, {40, 3.0f}};
    static const kg_logit_bias_t first_ab[1] = {{39, 100.0f}};
    for (int32_t i = 0; i < NJ; i++) {
        kg_request_t r = make_req((uint64_t)i, prompt, i < 4 ? 6 : 5, 60);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = 7000 + (uint64_t)i;
        r.sampling.logit_bias = i < 4 ? first_ab : near;
        r.sampling.n_logit_bias = i < 4 ? 1 : 5;
        r.grammar = g;
        r.lazy = true;
        r.n_lazy_texts = 1;
        r.lazy_texts[0] = "zab";
        r.lazy_from[0] = 1;
        submit_ok(&env, &r);
    }
    env_run(&env, 20000);
    kg_matcher_t *m = kg_matcher_new();
    int n_triggered = 0, n_refused = 0, n_spanning = 0;
    for (int32_t i = 0; i < NJ; i++) {
        const job_out_t *j = &env.jobs[i];
        ck_assert(j->done);
        int32_t k = text_trigger_at(g, prompt, i < 4 ? 6 : 5, j, "zab", 1, m);
        if (i < 4) {
            ck_assert_msg(k == 0 && j->tok[0] == AB, "job %d: the prompt's z did not trigger", i);
        }
        for (int32_t t = 0; t + 2 < (k >= 0 ? k : j->n); t++) {
            n_refused += j->tok[t] == Z && j->tok[t + 1] == A && j->tok[t + 2] == BA;
        }
        if (k < 0) {
            continue;
        }
        n_triggered++;
        n_spanning += k >= 2 && j->tok[k] == B && j->tok[k - 1] == A && j->tok[k - 2] == Z;
        bool ok = true;
        for (int32_t t = k + 1; t < j->n && ok; t++) {
            ok = kg_matcher_accept(m, j->tok[t]);
        }
        ck_assert_msg(ok && j->finish == KG_FINISH_STOP && kg_matcher_can_end(m),
                      "job %d: after the trigger the output is not the grammar's", i);
    }
    kg_matcher_free(m);
    ck_assert_int_gt(n_triggered, 8);
    ck_assert_int_gt(n_spanning, 0);
    ck_assert_int_gt(n_refused, 0);
    /* text triggers: within the limits, and not with lazy_opens */
    kg_request_t r = make_req(100, prompt, 6, 8);
    r.grammar = g;
    r.lazy = true;
    r.n_lazy_texts = 1;
    r.lazy_texts[0] = "";
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r.lazy_texts[0] = "zab";
    r.lazy_from[0] = 3;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r.lazy_from[0] = 0;
    r.lazy_opens = true;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    r.lazy_opens = false;
    r.n_lazy_texts = KG_ENGINE_MAX_LAZY_TEXTS + 1;
    ck_assert_int_eq(kg_engine_submit(env.e, &r), KG_ERR_INVALID);
    env_clear(&env);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("setup");
    tcase_add_test(tc, bad_params);
    tcase_add_test(tc, submit_validation);
    tcase_add_test(tc, queue_full);
    tcase_add_test(tc, params_default_from_model);
    tcase_add_test(tc, sizing_from_options);
    suite_add_tcase(s, tc);
    tc = tcase_create("schedule");
    tcase_add_test(tc, admission_limit);
    tcase_add_test(tc, priority_order);
    tcase_add_test(tc, tier_preemption);
    tcase_add_test(tc, chunked_prefill);
    tcase_add_test(tc, no_starvation);
    suite_add_tcase(s, tc);
    tc = tcase_create("kv");
    tcase_add_test(tc, preemption_same_tokens);
    tcase_add_test(tc, prefix_sharing);
    tcase_add_test(tc, system_prompt_prefilled_once);
    tcase_add_test(tc, lru_eviction);
    tcase_add_test(tc, no_deadlock_tiny_pool);
    tcase_add_test(tc, stats_add_up);
    suite_add_tcase(s, tc);
    tc = tcase_create("finish");
    tcase_add_test(tc, cancel_waiting_and_running);
    tcase_add_test(tc, deadline);
    tcase_add_test(tc, max_tokens);
    tcase_add_test(tc, eog);
    tcase_add_test(tc, context_limit);
    suite_add_tcase(s, tc);
    tc = tcase_create("invariance");
    tcase_add_loop_test(tc, batch_invariance, 0,
                        (int)(sizeof(k_inv_families) / sizeof(k_inv_families[0])));
    tcase_add_test(tc, window_frees_blocks);
    tcase_add_test(tc, window_prefix_cache);
    tcase_add_test(tc, backend_error);
    tcase_add_test(tc, backend_fault_scopes);
    tcase_add_test(tc, sample_row_fault_keeps_rng);
    suite_add_tcase(s, tc);
    tc = tcase_create("choices");
    tcase_add_test(tc, choices_prefill_once);
    tcase_add_test(tc, choices_greedy_share_kv);
    tcase_add_test(tc, choices_cancel_and_deadline);
    tcase_add_test(tc, choices_submit_limits);
    tcase_add_test(tc, choices_batch_invariance);
    tcase_add_test(tc, choices_window);
    tcase_add_test(tc, logit_bias_ban_and_force);
    suite_add_tcase(s, tc);
    tc = tcase_create("grammar");
    tcase_add_test(tc, constrained_jobs);
    tcase_add_test(tc, constrained_dead_end);
    tcase_add_test(tc, thinking_budget);
    tcase_add_test(tc, grammar_after_thought);
    tcase_add_test(tc, lazy_grammar);
    tcase_add_test(tc, lazy_grammar_opens);
    tcase_add_test(tc, lazy_grammar_text);
    tcase_add_test(tc, thinking_submit_validation);
    tcase_add_test(tc, constrained_choices);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
#endif
