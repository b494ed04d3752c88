/* check_runner: the engine thread (kg_runner) and its two queues, driven
 * from the test's thread as the kafka thread drives it: submits in bursts
 * (the command queue pushes back), cancels, polls completions, a backend
 * failure, and teardown with work in flight. On the fake backend, so every
 * token is checked against the greedy continuation the fake defines. The
 * ThreadSanitizer pass of scripts/test runs this program. */
#include "check_common.h"
#include "core/kg_clock.h"
#include "engine/kg_engine.h"
#include "fakes/fake_backend.h"
#include "pipeline/kg_runner.h"

#include <stdio.h>
#include <string.h>

#define VOCAB   64
#define EOG     3
#define N_REQ   96
#define MAX_OUT 64

typedef struct env {
    kg_fake_backend_params_t fp;
    kg_backend_t *be;
    kg_engine_t *e;
    kg_runner_t *r;
} env_t;

typedef struct req_state {
    int32_t prompt[8];
    int32_t n_prompt;
    int32_t max_tokens;
    int32_t out[MAX_OUT];
    int32_t n_out;
    int n_finish;
    kg_finish_t finish;
    bool rejected;
} req_state_t;

static void env_init(env_t *env, int32_t max_inflight) {
    memset(env, 0, sizeof(*env));
    kg_engine_params_t p;
    memset(&p, 0, sizeof(p));
    p.max_batch_size = 8;
    p.max_queue_depth = max_inflight;
    p.max_batch_tokens = 64;
    p.max_seq_len = 128;
    p.kv_block_size = 4;
    p.n_kv_blocks = 8 * 32 + 8;
    p.prefix_cache = true;
    p.n_eog = 1;
    p.eog[0] = EOG;
    p.n_vocab = VOCAB;
    env->fp = (kg_fake_backend_params_t){.n_vocab = VOCAB,
                                         .n_kv_blocks = p.n_kv_blocks,
                                         .kv_block_size = p.kv_block_size,
                                         .max_batch_tokens = p.max_batch_tokens,
                                         .n_slots = p.max_batch_size,
                                         .salt = 7,
                                         .eog_token = EOG,
                                         .eog_at_len = 1 << 30};
    env->be = kg_fake_backend_new(&env->fp);
    ck_assert_ptr_nonnull(env->be);
    char err[256] = "";
    env->e = kg_engine_new(env->be, &p, err, sizeof(err));
    ck_assert_msg(env->e != NULL, "%s", err);
    env->r = kg_runner_new(env->e, max_inflight, err, sizeof(err));
    ck_assert_msg(env->r != NULL, "%s", err);
}

static void env_clear(env_t *env) {
    kg_runner_free(env->r); /* joins the engine thread first */
    kg_engine_free(env->e);
    kg_backend_free(env->be);
}

static kg_request_t make_req(req_state_t *s, uint64_t id) {
    s->n_prompt = 3 + (int32_t)(id % 5);
    for (int32_t i = 0; i < s->n_prompt; i++) {
        s->prompt[i] = 4 + (int32_t)((id * 7 + (uint64_t)i * 13) % (VOCAB - 4));
    }
    s->max_tokens = 4 + (int32_t)(id % 29);
    kg_request_t req = {.id = id,
                        .prompt = s->prompt,
                        .n_prompt = s->n_prompt,
                        .max_tokens = s->max_tokens,
                        .sampling = kg_sampling_params_default()};
    return req;
}

/* Take what the engine thread reports; returns how many requests finished. */
static int drain(env_t *env, req_state_t *st, int timeout_ms) {
    kg_runner_event_t evs[32];
    int n = kg_runner_poll(env->r, evs, 32, timeout_ms), n_done = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_int_ne(evs[i].kind, KG_RUNNER_FATAL);
        req_state_t *s = &st[evs[i].c.id];
        if (evs[i].kind == KG_RUNNER_REJECTED) {
            s->rejected = true;
            s->n_finish++;
            n_done++;
            continue;
        }
        const kg_completion_t *c = &evs[i].c;
        if (c->token >= 0) {
            ck_assert_int_eq(c->index, s->n_out); /* in order, none lost */
            ck_assert_int_lt(s->n_out, MAX_OUT);
            s->out[s->n_out++] = c->token;
        }
        if (c->finish != KG_FINISH_NONE) {
            s->n_finish++;
            s->finish = c->finish;
            n_done++;
        }
    }
    return n_done;
}

/* 96 requests through a runner sized for 24 in flight: the command queue
 * pushes back and the test keeps polling, as the worker does; every
 * request finishes exactly once with the fake's greedy tokens; cancels
 * sent from this thread end their requests early. */
START_TEST(submit_poll_cancel) {
    env_t env;
    env_init(&env, 24);
    static req_state_t st[N_REQ];
    memset(st, 0, sizeof(st));
    int next = 0, n_done = 0, n_inflight = 0;
    int64_t t0 = kg_clock_us();
    while (n_done < N_REQ) {
        while (next < N_REQ && n_inflight < 24) {
            kg_request_t req = make_req(&st[next], (uint64_t)next);
            kg_status_t s = kg_runner_submit(env.r, &req);
            if (s == KG_QUEUE_FULL) {
                break;
            }
            ck_assert_int_eq(s, KG_OK);
            if (next % 10 == 9) {
                ck_assert_int_eq(kg_runner_cancel(env.r, (uint64_t)next), KG_OK);
            }
            next++;
            n_inflight++;
        }
        int d = drain(&env, st, 5);
        n_done += d;
        n_inflight -= d;
        ck_assert_msg(kg_clock_us() - t0 < 120 * 1000000LL, "stuck at %d/%d", n_done, N_REQ);
    }
    int n_cancelled = 0;
    for (int i = 0; i < N_REQ; i++) {
        req_state_t *s = &st[i];
        ck_assert_int_eq(s->n_finish, 1);
        ck_assert(!s->rejected);
        int32_t hist[8 + MAX_OUT];
        memcpy(hist, s->prompt, (size_t)s->n_prompt * sizeof(int32_t));
        for (int32_t k = 0; k < s->n_out; k++) {
            int32_t want = kg_fake_backend_argmax(&env.fp, hist, s->n_prompt + k);
            ck_assert_msg(s->out[k] == want, "request %d token %d: %d, want %d", i, k, s->out[k],
                          want);
            hist[s->n_prompt + k] = s->out[k];
        }
        if (s->finish == KG_FINISH_CANCELLED) {
            ck_assert_int_eq(i % 10, 9);
            ck_assert_int_lt(s->n_out, s->max_tokens);
            n_cancelled++;
        } else {
            ck_assert_int_eq(s->finish, KG_FINISH_LENGTH);
            ck_assert_int_eq(s->n_out, s->max_tokens);
        }
    }
    ck_assert_int_gt(n_cancelled, 0);
    const kg_runner_gauges_t *g = kg_runner_gauges(env.r);
    ck_assert_int_gt(atomic_load(&g->n_steps), 0);
    ck_assert_int_gt(atomic_load(&g->n_decode_tokens), 0);
    ck_assert(!kg_runner_is_dead(env.r));
    env_clear(&env);
}
END_TEST

/* A request the engine refuses comes back as REJECTED with the status. */
START_TEST(rejected) {
    env_t env;
    env_init(&env, 8);
    static req_state_t st[2];
    memset(st, 0, sizeof(st));
    kg_request_t req = make_req(&st[0], 0);
    req.max_tokens = 0; /* invalid */
    ck_assert_int_eq(kg_runner_submit(env.r, &req), KG_OK);
    kg_runner_event_t ev;
    int64_t t0 = kg_clock_us();
    int n = 0;
    while (n == 0 && kg_clock_us() - t0 < 10 * 1000000LL) {
        n = kg_runner_poll(env.r, &ev, 1, 50);
    }
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ev.kind, KG_RUNNER_REJECTED);
    ck_assert_int_eq(ev.status, KG_ERR_INVALID);
    ck_assert_int_eq(ev.c.id, 0);
    env_clear(&env);
}
END_TEST

/* A failing backend stops the engine thread with one FATAL event; the
 * runner is then dead and still frees cleanly. */
START_TEST(backend_failure_is_fatal) {
    env_t env;
    env_init(&env, 8);
    static req_state_t st[4];
    memset(st, 0, sizeof(st));
    kg_fake_backend_fail_next(env.be, 1000);
    for (int i = 0; i < 4; i++) {
        kg_request_t req = make_req(&st[i], (uint64_t)i);
        ck_assert_int_eq(kg_runner_submit(env.r, &req), KG_OK);
    }
    kg_runner_event_t ev;
    int64_t t0 = kg_clock_us();
    bool fatal = false;
    while (!fatal && kg_clock_us() - t0 < 10 * 1000000LL) {
        if (kg_runner_poll(env.r, &ev, 1, 50) == 1) {
            ck_assert_int_eq(ev.kind, KG_RUNNER_FATAL);
            ck_assert_int_eq(ev.status, KG_ERR_BACKEND);
            fatal = true;
        }
    }
    ck_assert(fatal);
    ck_assert(kg_runner_is_dead(env.r));
    env_clear(&env);
}
END_TEST

/* Teardown while requests run and commands wait: no hang, nothing leaks
 * (the ASan pass checks the prompts owned by queued commands are freed). */
START_TEST(free_with_work_in_flight) {
    for (int round = 0; round < 20; round++) {
        env_t env;
        env_init(&env, 16);
        static req_state_t st[16];
        memset(st, 0, sizeof(st));
        for (int i = 0; i < 16; i++) {
            kg_request_t req = make_req(&st[i], (uint64_t)i);
            kg_status_t s = kg_runner_submit(env.r, &req);
            ck_assert(s == KG_OK || s == KG_QUEUE_FULL); /* a full queue is fine here */
        }
        if (round % 2) {
            kg_runner_event_t evs[8];
            (void)kg_runner_poll(env.r, evs, 8, 1);
        }
        env_clear(&env);
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("runner");
    TCase *tc = tcase_create("runner");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, submit_poll_cancel);
    tcase_add_test(tc, rejected);
    tcase_add_test(tc, backend_failure_is_fatal);
    tcase_add_test(tc, free_with_work_in_flight);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
