/* kg_runner: the engine thread and its two queues. */
#include "kg_runner.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../core/kg_queue.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum cmd_kind { CMD_SUBMIT, CMD_CANCEL } cmd_kind_t;

typedef struct cmd {
    cmd_kind_t kind;
    kg_request_t req; /* CMD_SUBMIT: req.prompt is owned by the command (one block with
                         req.sampling.logit_bias and req.input_len after the prompt) */
    uint64_t id;      /* CMD_CANCEL */
    int32_t choice;   /* CMD_CANCEL: one choice, or -1 for all */
} cmd_t;

struct kg_runner {
    kg_engine_t *engine;
    kg_queue_t *cmds;   /* cmd_t, kafka -> engine */
    kg_queue_t *events; /* kg_runner_event_t, engine -> kafka */
    kg_completion_t *comps;
    int32_t comps_cap;
    pthread_t thread;
    bool started;
    _Atomic bool stop;
    _Atomic bool dead;
    kg_runner_gauges_t gauges;
};

static void push_event(kg_runner_t *r, const kg_runner_event_t *ev) {
    /* blocks only while the kafka thread is behind: the queue holds several
     * steps' worth of completions */
    while (kg_queue_push(r->events, ev, 100) != KG_OK) {
        if (atomic_load(&r->stop)) {
            return;
        }
    }
}

static void handle_cmd(kg_runner_t *r, cmd_t *c) {
    if (c->kind == CMD_CANCEL) {
        if (c->choice < 0) {
            kg_engine_cancel(r->engine, c->id);
        } else {
            kg_engine_cancel_choice(r->engine, c->id, c->choice);
        }
        return;
    }
    kg_status_t st = kg_engine_submit(r->engine, &c->req);
    free((void *)c->req.prompt);
    kg_grammar_unref(c->req.grammar); /* the engine took its own reference */
    if (st != KG_OK) {
        kg_runner_event_t ev = {.kind = KG_RUNNER_REJECTED, .status = st, .ts_us = kg_clock_us()};
        ev.c.id = c->req.id;
        ev.c.token = -1;
        push_event(r, &ev);
    }
}

static void update_gauges(kg_runner_t *r) {
    kg_engine_stats_t s;
    kg_engine_stats(r->engine, &s);
    kg_runner_gauges_t *g = &r->gauges;
    atomic_store(&g->n_waiting, s.n_waiting);
    atomic_store(&g->n_running, s.n_running);
    atomic_store(&g->kv_blocks_used, s.kv_blocks_used);
    atomic_store(&g->kv_blocks_total, s.kv_blocks_total);
    atomic_store(&g->kv_blocks_cached, s.kv_blocks_cached);
    atomic_store(&g->kv_bytes_per_token, s.kv_bytes_per_token);
    atomic_store(&g->state_bytes, s.state_bytes);
    atomic_store(&g->weight_bytes, s.weight_bytes);
    atomic_store(&g->snapshot_bytes, s.snapshot_bytes);
    atomic_store(&g->n_state_saves, s.n_state_saves);
    atomic_store(&g->n_state_restores, s.n_state_restores);
    atomic_store(&g->n_steps, s.n_steps);
    atomic_store(&g->n_prefill_tokens, s.n_prefill_tokens);
    atomic_store(&g->n_decode_tokens, s.n_decode_tokens);
    atomic_store(&g->n_prefix_hit_tokens, s.n_prefix_hit_tokens);
    atomic_store(&g->n_prompt_tokens, s.n_prompt_tokens);
    atomic_store(&g->n_preemptions, s.n_preemptions);
    atomic_store(&g->n_tier_preemptions, s.n_tier_preemptions);
    atomic_store(&g->last_batch_tokens, s.last_batch_tokens);
    atomic_store(&g->n_grammar_masks, s.n_grammar_masks);
    atomic_store(&g->grammar_mask_ns, s.grammar_mask_ns);
    atomic_store(&g->n_grammar_forced_tokens, s.n_grammar_forced_tokens);
    const int32_t n_exp = s.moe.n_per_expert ? s.moe.n_expert : 0;
    for (int32_t i = 0; i < n_exp && i < KG_MOE_MAX_EXPERTS; i++) {
        atomic_store(&g->moe_per_expert[i], s.moe.n_per_expert[i]);
    }
    atomic_store(&g->moe_routed, s.moe.n_routed);
    atomic_store(&g->moe_groups, s.moe.n_groups);
    atomic_store(&g->moe_n_expert, n_exp);
}

static void *run(void *arg) {
    kg_runner_t *r = arg;
    while (!atomic_load(&r->stop)) {
        atomic_store(&r->gauges.last_loop_us, kg_clock_us());
        bool busy = kg_engine_busy(r->engine) && !atomic_load(&r->dead);
        cmd_t c;
        /* take every queued command; sleep on the queue only when idle */
        int timeout = busy ? 0 : 100;
        while (kg_queue_pop(r->cmds, &c, timeout) == KG_OK) {
            handle_cmd(r, &c);
            timeout = 0;
        }
        if (atomic_load(&r->dead) || !kg_engine_busy(r->engine)) {
            update_gauges(r);
            continue;
        }
        int64_t t0 = kg_clock_us();
        int32_t n = kg_engine_step(r->engine, r->comps, r->comps_cap);
        int64_t t1 = kg_clock_us();
        int64_t step = atomic_fetch_add(&r->gauges.n_stepped, 1) + 1;
        atomic_fetch_add(&r->gauges.step_us_total, t1 - t0);
        kg_histogram_observe(&r->gauges.step, t1 - t0);
        if (n < 0) {
            KG_LOG_ERROR("engine", "backend failed: %s; stopping the engine",
                         kg_status_str((kg_status_t)n));
            atomic_store(&r->dead, true);
            kg_runner_event_t ev = {.kind = KG_RUNNER_FATAL, .status = (kg_status_t)n, .ts_us = t1};
            ev.c.token = -1;
            push_event(r, &ev);
            continue;
        }
        for (int32_t i = 0; i < n; i++) {
            kg_runner_event_t ev = {.kind = KG_RUNNER_COMPLETION,
                                    .status = KG_OK,
                                    .ts_us = t1,
                                    .step = step,
                                    .c = r->comps[i]};
            push_event(r, &ev);
        }
        update_gauges(r);
    }
    return NULL;
}

kg_runner_t *
kg_runner_new(kg_engine_t *engine, int32_t max_inflight, char *errstr, size_t errstr_size) {
    kg_runner_t *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(errstr, errstr_size, "runner: out of memory");
        return NULL;
    }
    r->engine = engine;
    kg_histogram_init(&r->gauges.step, KG_HIST_STEP);
    r->comps_cap = kg_engine_max_completions(engine);
    r->comps = malloc((size_t)r->comps_cap * sizeof(*r->comps));
    r->cmds = kg_queue_new((size_t)max_inflight * 2 + 16, sizeof(cmd_t));
    r->events = kg_queue_new((size_t)max_inflight * 8 + 64, sizeof(kg_runner_event_t));
    if (!r->comps || !r->cmds || !r->events) {
        snprintf(errstr, errstr_size, "runner: out of memory");
        kg_runner_free(r);
        return NULL;
    }
    if (pthread_create(&r->thread, NULL, run, r) != 0) {
        snprintf(errstr, errstr_size, "runner: pthread_create failed");
        kg_runner_free(r);
        return NULL;
    }
    r->started = true;
    return r;
}

void kg_runner_free(kg_runner_t *r) {
    if (!r) {
        return;
    }
    atomic_store(&r->stop, true);
    if (r->cmds) {
        kg_queue_wake(r->cmds);
    }
    if (r->started) {
        pthread_join(r->thread, NULL);
    }
    if (r->cmds) {
        cmd_t c;
        while (kg_queue_pop(r->cmds, &c, 0) == KG_OK) {
            if (c.kind == CMD_SUBMIT) {
                free((void *)c.req.prompt);
                kg_grammar_unref(c.req.grammar);
            }
        }
    }
    kg_queue_free(r->cmds);
    kg_queue_free(r->events);
    free(r->comps);
    free(r);
}

kg_status_t kg_runner_submit(kg_runner_t *r, const kg_request_t *req) {
    cmd_t c = {.kind = CMD_SUBMIT, .req = *req};
    size_t n_prompt = (size_t)(req->n_prompt > 0 ? req->n_prompt : 1);
    size_t n_bias = req->sampling.n_logit_bias > 0 ? (size_t)req->sampling.n_logit_bias : 0;
    size_t n_inputs = req->n_inputs > 0 && req->input_len ? (size_t)req->n_inputs : 0;
    /* the prompt, the logit bias and an embedding request's input lengths in
     * one block (all 4-byte aligned) */
    int32_t *copy = malloc(n_prompt * sizeof(int32_t) + n_bias * sizeof(kg_logit_bias_t) +
                           n_inputs * sizeof(int32_t));
    if (!copy) {
        return KG_ERR_NOMEM;
    }
    if (n_inputs > 0) {
        int32_t *lens = (int32_t *)(void *)((char *)copy + n_prompt * sizeof(int32_t) +
                                            n_bias * sizeof(kg_logit_bias_t));
        memcpy(lens, req->input_len, n_inputs * sizeof(int32_t));
        c.req.input_len = lens;
    }
    memcpy(copy, req->prompt, (size_t)req->n_prompt * sizeof(int32_t));
    c.req.prompt = copy;
    if (n_bias > 0) {
        kg_logit_bias_t *bias = (kg_logit_bias_t *)(void *)(copy + n_prompt);
        memcpy(bias, req->sampling.logit_bias, n_bias * sizeof(*bias));
        c.req.sampling.logit_bias = bias;
    }
    if (req->grammar) {
        c.req.grammar = kg_grammar_ref(req->grammar); /* the command holds one */
    }
    kg_status_t st = kg_queue_push(r->cmds, &c, 0);
    if (st != KG_OK) {
        free(copy);
        kg_grammar_unref(c.req.grammar);
    }
    return st;
}

kg_status_t kg_runner_cancel(kg_runner_t *r, uint64_t id) {
    cmd_t c = {.kind = CMD_CANCEL, .id = id, .choice = -1};
    return kg_queue_push(r->cmds, &c, 1000);
}

kg_status_t kg_runner_cancel_choice(kg_runner_t *r, uint64_t id, int32_t choice) {
    cmd_t c = {.kind = CMD_CANCEL, .id = id, .choice = choice};
    return kg_queue_push(r->cmds, &c, 1000);
}

int kg_runner_poll(kg_runner_t *r, kg_runner_event_t *out, int max, int timeout_ms) {
    int n = 0;
    while (n < max && kg_queue_pop(r->events, &out[n], n == 0 ? timeout_ms : 0) == KG_OK) {
        n++;
    }
    return n;
}

int64_t kg_runner_steps(const kg_runner_t *r) {
    return atomic_load(&r->gauges.n_stepped);
}

bool kg_runner_is_dead(const kg_runner_t *r) {
    return atomic_load(&r->dead);
}

const kg_runner_gauges_t *kg_runner_gauges(const kg_runner_t *r) {
    return &r->gauges;
}
