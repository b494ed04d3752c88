/* kgen-bench: throughput of the engine, comparable row by row with
 * llama.cpp's llama-batched-bench.
 *
 * For each parallel count B: B sequences of PP random prompt tokens each,
 * submitted at once, then TG decode steps for all of them (max_tokens = TG+1:
 * the first token comes from the prefill logits, as in llama-batched-bench
 * where the prompt pass is followed by TG decode passes). T_PP runs until
 * every sequence has its first token, T_TG from there until all are done.
 * With the default token budget (2048, llama-batched-bench's -b) the prompts
 * of B*PP <= 2048 tokens go through in one step, so the two phases do not
 * overlap; beyond that the engine starts decoding early sequences while
 * later prompts prefill (that is what continuous batching is for) and T_PP
 * is the time until the last first token.
 *
 * For a mixture-of-experts model two more columns measure the grouping by
 * expert in the decode phase: the experts a layer runs per step (active
 * experts, of n_expert) and the token rows each expert GEMM takes (B * k
 * over the active experts; 1 would be one GEMM per token).
 *
 * --arrivals RATE replays Poisson arrivals (RATE requests/s) of mixed
 * prompt and output lengths and reports throughput, time to first token and
 * time per output token percentiles.
 *
 * --json-schema FILE, --grammar FILE or --regex RE measure constrained
 * decoding: for each B, the B sequences run greedy under the grammar (up to
 * TG tokens; a grammar may finish earlier), then the same prompts run
 * unconstrained for exactly the same number of tokens each, so the two
 * runs differ only by the constraint (masks, matcher, jump-forward); --reps
 * alternates the pair and reports medians, by the wall clock and by the
 * process's CPU time (steadier when other work shares the machine). The
 * mask-build time is measured inside the engine, per sequence-step. */
#include "backend/kg_backend.h"
#include "cli_util.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "engine/kg_backend_registry.h"
#include "engine/kg_engine.h"
#include "grammar/kg_grammar_cache.h"
#include "metrics/kg_metrics.h"
#include "model/kg_model.h"
#include "pipeline/kg_stack.h"
#include "schema/kg_json_schema.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MAX_NPL 32

typedef struct bench_opts {
    const char *model_path, *backend;
    kg_engine_options_t eo; /* the shared engine flags (--threads, --max-batch-tokens, ...) */
    int64_t npp, ntg, n_requests, seed;
    int32_t npl[MAX_NPL];
    int n_npl;
    double arrivals; /* requests per second; 0 = batched mode */
    bool json;
    bool metrics; /* record what the worker records (histograms, one log line per job) */
    kg_constraint_kind_t constraint; /* constrained mode: NONE, JSON_SCHEMA, GRAMMAR or REGEX */
    const char *constraint_arg;      /* the file (schema, grammar) or the regex */
    int64_t reps;                    /* constrained mode: alternating runs per B */
    bool no_jump_forward;            /* constrained mode: sample forced tokens too */
} bench_opts_t;

typedef struct bench_row {
    int64_t pp, tg, b, n_kv;
    double t_pp, t_tg;
    double cpu_tg; /* CPU seconds (all threads) of the TG phase */
    /* experts in the decode phase: (layer, step) pairs, groups, rows */
    int64_t moe_layer_steps, moe_groups, moe_routed;
} bench_row_t;

/* CPU time of the process (user + system, all threads), seconds. On a
 * shared machine this is steadier than the wall clock. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen-bench --model FILE [-npp P] [-ntg G] [-npl 1,4,16] [options]\n"
            "  -m, --model FILE          GGUF model\n"
            "  -npp P                    prompt tokens per sequence (default 128)\n"
            "  -ntg G                    generated tokens per sequence (default 64)\n"
            "  -npl LIST                 parallel sequence counts (default 1,4,16)\n"
            "  -t N, -b N                --threads N, --max-batch-tokens N (llama.cpp's names)\n"
            "  engine options as in kgen-worker (kv-memory default: what the runs need,\n"
            "  max-batch-tokens default 2048, prefix cache default off: prompts are random):\n"
            "%s"
            "  --arrivals RATE           Poisson arrivals mode, RATE requests/s\n"
            "  --n-requests N            requests in arrivals mode (default 64)\n"
            "  --seed S                  prompt/arrival RNG seed (default 1)\n"
            "  --json                    JSON output\n"
            "  --metrics                 also record the worker's metrics and job log lines\n"
            "                            (to measure what they cost)\n"
            "  --json-schema FILE        constrained decoding under this JSON Schema against\n"
            "                            the same token counts unconstrained\n"
            "  --grammar FILE            ... under this GBNF grammar\n"
            "  --regex RE                ... under this regular expression\n"
            "  --reps N                  constrained mode: alternating runs per B (default 3)\n"
            "  --no-jump-forward         constrained mode: sample forced tokens too\n"
            "  --version, --help\n",
            kg_cli_engine_help);
}

static bool parse_npl(const char *s, bench_opts_t *o) {
    o->n_npl = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (o->n_npl == MAX_NPL || !kg_cli_parse_i64(tok, 1, 4096, &v)) {
            return false;
        }
        o->npl[o->n_npl++] = (int32_t)v;
    }
    return o->n_npl > 0;
}

static int parse_args(int argc, char **argv, bench_opts_t *o) {
    /* llama-batched-bench spells its flags with one dash (-npp); accept both */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-npp") == 0 || strcmp(argv[i], "-ntg") == 0 ||
            strcmp(argv[i], "-npl") == 0) {
            static char spelled[3][8];
            int k = argv[i][3] == 'p' && argv[i][2] == 'p' ? 0 : (argv[i][2] == 't' ? 1 : 2);
            snprintf(spelled[k], sizeof(spelled[k]), "-%s", argv[i]);
            argv[i] = spelled[k];
        }
    }
    enum {
        O_NPP = 256,
        O_NTG,
        O_NPL,
        O_ARR,
        O_NREQ,
        O_SEED,
        O_JSON,
        O_VERSION,
        O_METRICS,
        O_SCHEMA,
        O_GRAMMAR,
        O_REGEX,
        O_REPS,
        O_NOJF
    };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"npp", required_argument, 0, O_NPP},
                                         {"ntg", required_argument, 0, O_NTG},
                                         {"npl", required_argument, 0, O_NPL},
                                         {"arrivals", required_argument, 0, O_ARR},
                                         {"n-requests", required_argument, 0, O_NREQ},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"json", no_argument, 0, O_JSON},
                                         {"metrics", no_argument, 0, O_METRICS},
                                         {"json-schema", required_argument, 0, O_SCHEMA},
                                         {"grammar", required_argument, 0, O_GRAMMAR},
                                         {"regex", required_argument, 0, O_REGEX},
                                         {"reps", required_argument, 0, O_REPS},
                                         {"no-jump-forward", no_argument, 0, O_NOJF},
                                         {"version", no_argument, 0, O_VERSION},
                                         {"help", no_argument, 0, 'h'},
                                         KG_CLI_ENGINE_LONGOPTS,
                                         {0, 0, 0, 0}};
    int c;
    float fv;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:t:b:h", opts, NULL)) != -1) {
        int id = c == 't' ? KG_CLI_O_THREADS : c == 'b' ? KG_CLI_O_MAX_BATCH_TOKENS : c;
        int taken = kg_cli_engine_option(id, optarg, argc, argv, "kgen-bench", &o->eo, &o->backend);
        if (taken < 0) {
            return 2;
        }
        if (taken > 0) {
            continue;
        }
        bool ok = true;
        switch (c) {
        case 'm':
            o->model_path = optarg;
            break;
        case O_NPP:
            ok = kg_cli_parse_i64(optarg, 1, 1 << 20, &o->npp);
            break;
        case O_NTG:
            ok = kg_cli_parse_i64(optarg, 1, 1 << 20, &o->ntg);
            break;
        case O_NPL:
            ok = parse_npl(optarg, o);
            break;
        case O_ARR:
            ok = kg_cli_parse_f32(optarg, 0.001f, 1e6f, &fv);
            o->arrivals = fv;
            break;
        case O_NREQ:
            ok = kg_cli_parse_i64(optarg, 1, 1 << 20, &o->n_requests);
            break;
        case O_SEED:
            ok = kg_cli_parse_i64(optarg, 0, INT64_MAX, &o->seed);
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_METRICS:
            o->metrics = true;
            break;
        case O_SCHEMA:
        case O_GRAMMAR:
        case O_REGEX:
            ok = o->constraint == KG_CONSTRAINT_NONE;
            o->constraint = c == O_SCHEMA    ? KG_CONSTRAINT_JSON_SCHEMA
                            : c == O_GRAMMAR ? KG_CONSTRAINT_GRAMMAR
                                             : KG_CONSTRAINT_REGEX;
            o->constraint_arg = optarg;
            break;
        case O_REPS:
            ok = kg_cli_parse_i64(optarg, 1, 1000, &o->reps);
            break;
        case O_NOJF:
            o->no_jump_forward = true;
            break;
        case O_VERSION:
            kg_cmd_print_version("kgen-bench");
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "kgen-bench: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kgen-bench: bad value '%s' for '%s'\n", optarg, argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc || !o->model_path) {
        fprintf(stderr, "kgen-bench: %s\n",
                optind < argc ? "unexpected argument" : "--model is required");
        usage(stderr);
        return 2;
    }
    return -1;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random prompt tokens that are not end-of-generation tokens. Each prompt
 * is different so the prefix cache does not serve any of it. */
static void random_prompt(const kg_model_t *model, uint64_t *rng, int32_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int32_t t;
        do {
            t = (int32_t)(splitmix(rng) % (uint64_t)model->hp.n_vocab);
        } while (kg_tokenizer_is_eog(model->tok, t) || kg_tokenizer_is_control(model->tok, t));
        out[i] = t;
    }
}

typedef struct bench_env {
    kg_model_t *model;
    kg_stack_t *stack;   /* backend, engine and, for constrained runs, the grammar cache */
    kg_backend_t *be;    /* the stack's */
    kg_engine_t *engine; /* the stack's */
    kg_engine_params_t ep;
    kg_completion_t *comps;
    int32_t comps_cap;
    bool metrics;
    kg_histogram_t step, ttft, tpot, e2e;
} bench_env_t;

/* What kgen-worker records per step and per finished job, so --metrics
 * shows their cost: histogram observations and one logfmt line per job. */
static int32_t bench_step(bench_env_t *env) {
    int64_t t0 = kg_clock_us();
    int32_t n = kg_engine_step(env->engine, env->comps, env->comps_cap);
    if (env->metrics) {
        int64_t t1 = kg_clock_us();
        kg_histogram_observe(&env->step, t1 - t0);
        for (int32_t i = 0; i < n; i++) {
            const kg_completion_t *c = &env->comps[i];
            if (c->finish != KG_FINISH_NONE) {
                kg_histogram_observe(&env->ttft, t1 - t0);
                kg_histogram_observe(&env->tpot, t1 - t0);
                kg_histogram_observe(&env->e2e, t1 - t0);
                KG_LOG_INFO("bench",
                            "job done request_id=%llu partition=0 offset=%llu finish=%s "
                            "tokens=%d",
                            (unsigned long long)c->id, (unsigned long long)c->id,
                            kg_finish_str(c->finish), c->index);
            }
        }
    }
    return n;
}

static bool env_open(bench_env_t *env,
                     const bench_opts_t *o,
                     int32_t max_seqs,
                     int64_t max_ctx,
                     char *err,
                     size_t err_size) {
    kg_stack_options_t so = {.backend = o->backend,
                             .engine = o->eo,
                             .no_jump_forward = o->no_jump_forward,
                             /* constrained runs compile their one grammar into it */
                             .grammar_bytes =
                                 o->constraint != KG_CONSTRAINT_NONE ? (size_t)1 << 30 : 0};
    so.engine.max_batch_size = max_seqs;
    so.engine.max_queue_depth = max_seqs;
    so.engine.ctx = max_ctx;
    env->stack = kg_stack_new(env->model, &so, err, err_size);
    if (!env->stack) {
        return false;
    }
    env->be = kg_stack_backend(env->stack);
    env->engine = kg_stack_engine(env->stack);
    env->ep = *kg_stack_params(env->stack);
    env->comps_cap = kg_engine_max_completions(env->engine);
    env->comps = malloc((size_t)env->comps_cap * sizeof(*env->comps));
    if (!env->comps) {
        snprintf(err, err_size, "out of memory");
        return false;
    }
    return true;
}

static void env_close(bench_env_t *env) {
    kg_stack_free(env->stack);
    free(env->comps);
    env->stack = NULL;
    env->engine = NULL;
    env->be = NULL;
    env->comps = NULL;
}

/* B sequences of npp random prompt tokens, greedy. With `g`, each under
 * the grammar; with `max_out`, sequence i makes max_out[i] tokens (else
 * ntg + 1). `got` (may be NULL) receives the tokens each made. */
static bool run_batched_with(bench_env_t *env,
                             const bench_opts_t *o,
                             int32_t B,
                             bench_row_t *row,
                             kg_grammar_t *g,
                             const int32_t *max_out,
                             int32_t *got) {
    kg_engine_t *e = env->engine;
    uint64_t rng = (uint64_t)o->seed * 7919u + (uint64_t)B;
    int32_t *prompt = malloc((size_t)o->npp * sizeof(int32_t));
    int32_t *n_out = calloc((size_t)B, sizeof(int32_t));
    bool ok = prompt && n_out;
    for (int32_t i = 0; ok && i < B; i++) {
        random_prompt(env->model, &rng, prompt, o->npp);
        kg_request_t req = {.id = (uint64_t)i,
                            .prompt = prompt,
                            .n_prompt = (int32_t)o->npp,
                            .max_tokens = max_out ? max_out[i] : (int32_t)o->ntg + 1,
                            .ignore_eos = true,
                            .sampling = kg_sampling_params_default(),
                            .grammar = g};
        if (kg_engine_submit(e, &req) != KG_OK) {
            fprintf(stderr, "kgen-bench: submit failed\n");
            ok = false;
        }
    }
    int64_t t0 = kg_clock_us(), t_pp_end = 0;
    double cpu_pp_end = 0.0;
    int32_t n_first = 0, n_done = 0;
    kg_moe_stats_t moe0 = {0}, moe1;
    while (ok && n_done < B) {
        int32_t n = bench_step(env);
        if (n < 0) {
            fprintf(stderr, "kgen-bench: step failed: %s\n", kg_status_str((kg_status_t)n));
            ok = false;
            break;
        }
        for (int32_t i = 0; i < n; i++) {
            const kg_completion_t *c = &env->comps[i];
            if (c->token >= 0 && n_out[c->id]++ == 0 && ++n_first == B) {
                t_pp_end = kg_clock_us();
                cpu_pp_end = cpu_seconds();
                kg_backend_moe_stats(env->be, &moe0);
            }
            if (c->finish != KG_FINISH_NONE) {
                n_done++;
            }
        }
    }
    int64_t t1 = kg_clock_us();
    kg_backend_moe_stats(env->be, &moe1);
    row->moe_layer_steps = moe1.n_layer_steps - moe0.n_layer_steps;
    row->moe_groups = moe1.n_groups - moe0.n_groups;
    row->moe_routed = moe1.n_routed - moe0.n_routed;
    row->pp = o->npp;
    row->tg = o->ntg;
    row->b = B;
    row->n_kv = (int64_t)B * (o->npp + o->ntg);
    row->t_pp = (double)(t_pp_end - t0) / 1e6;
    row->t_tg = (double)(t1 - t_pp_end) / 1e6;
    row->cpu_tg = cpu_seconds() - cpu_pp_end;
    if (got && n_out) { /* n_out is NULL when its calloc failed (ok is false then) */
        memcpy(got, n_out, (size_t)B * sizeof(int32_t));
    }
    free(prompt);
    free(n_out);
    return ok;
}

static bool run_batched(bench_env_t *env, const bench_opts_t *o, int32_t B, bench_row_t *row) {
    return run_batched_with(env, o, B, row, NULL, NULL, NULL);
}

// ---- constrained decoding ----

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

/* The mask-build time (us) at quantile q from the difference of two
 * engine histograms (0.25 us buckets). */
static double mask_quantile(const int64_t *after, const int64_t *before, double q) {
    int64_t total = 0;
    for (int i = 0; i <= KG_ENGINE_MASK_HIST; i++) {
        total += after[i] - before[i];
    }
    int64_t want = (int64_t)ceil(q * (double)total), cum = 0;
    for (int i = 0; i <= KG_ENGINE_MASK_HIST; i++) {
        cum += after[i] - before[i];
        if (cum >= want && cum > 0) {
            return (i + 0.5) * 0.25;
        }
    }
    return 0.0;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bool run_constrained(bench_env_t *env, const bench_opts_t *o) {
    char err[512] = "";
    size_t len = 0;
    char *text = NULL;
    if (o->constraint == KG_CONSTRAINT_REGEX) {
        text = strdup(o->constraint_arg);
        len = strlen(o->constraint_arg);
    } else {
        text = read_file(o->constraint_arg, &len);
    }
    if (!text) {
        fprintf(stderr, "kgen-bench: cannot read %s\n", o->constraint_arg);
        return false;
    }
    kg_grammar_cache_t *cache = kg_stack_grammars(env->stack);
    kg_constraint_t k = {.kind = o->constraint, .text = text, .len = len};
    int64_t t0 = kg_clock_us();
    kg_grammar_t *g =
        cache ? kg_grammar_cache_get(cache, &k, kg_json_schema_builder, err, sizeof(err)) : NULL;
    double compile_ms = (double)(kg_clock_us() - t0) / 1000.0;
    bool ok = g != NULL;
    if (!g) {
        fprintf(stderr, "kgen-bench: %s: %s\n", o->constraint_arg, *err ? err : "out of memory");
        goto out;
    }
    printf("%s %s: %d states, %.1f MiB of masks, compiled in %.0f ms (vocabulary trie "
           "included; %.0f M trie nodes walked)\n\n",
           kg_constraint_kind_str(o->constraint), o->constraint_arg, kg_grammar_n_states(g),
           (double)kg_grammar_memory(g) / (1 << 20), compile_ms,
           (double)kg_grammar_compile_work(g) / 1e6);
    printf("|    B | tokens | forced | steps con/unc | T_TG con s | T_TG unc s | S_TG con | "
           "S_TG unc | con/unc wall | con/unc CPU | mask p50 us | mask p99 us |\n");
    printf("|------|--------|--------|---------------|------------|------------|----------|------"
           "----|--------------|-------------|-------------|-------------|\n");
    kg_engine_stats_t *before = malloc(sizeof(*before)), *after = malloc(sizeof(*after));
    int64_t reps = o->reps > 0 ? o->reps : 3;
    double *tc = calloc((size_t)reps, sizeof(double)), *tu = calloc((size_t)reps, sizeof(double));
    double *p50 = calloc((size_t)reps, sizeof(double)), *p99 = calloc((size_t)reps, sizeof(double));
    double *cc = calloc((size_t)reps, sizeof(double)), *cu = calloc((size_t)reps, sizeof(double));
    ok = before && after && tc && tu && p50 && p99 && cc && cu;
    for (int i = 0; ok && i < o->n_npl; i++) {
        int32_t B = o->npl[i];
        int32_t *made = calloc((size_t)B, sizeof(int32_t));
        int64_t tokens = 0, forced = 0, steps_c = 0, steps_u = 0;
        ok = made != NULL;
        for (int64_t r = 0; ok && r < reps; r++) {
            bench_row_t rc = {0}, ru = {0};
            kg_engine_stats(env->engine, before);
            ok = run_batched_with(env, o, B, &rc, g, NULL, made);
            kg_engine_stats(env->engine, after);
            /* the same prompts, unconstrained, the same token count each */
            ok = ok && run_batched_with(env, o, B, &ru, NULL, made, NULL);
            kg_engine_stats_t *s2 = malloc(sizeof(*s2));
            if (s2) {
                kg_engine_stats(env->engine, s2);
                steps_c = after->n_steps - before->n_steps;
                steps_u = s2->n_steps - after->n_steps;
                free(s2);
            }
            tc[r] = rc.t_tg;
            tu[r] = ru.t_tg;
            cc[r] = rc.cpu_tg;
            cu[r] = ru.cpu_tg;
            p50[r] = mask_quantile(after->mask_hist, before->mask_hist, 0.5);
            p99[r] = mask_quantile(after->mask_hist, before->mask_hist, 0.99);
            tokens = 0;
            for (int32_t s = 0; s < B; s++) {
                tokens += made[s];
            }
            forced = after->n_grammar_forced_tokens - before->n_grammar_forced_tokens;
        }
        if (ok) {
            /* TG tokens: all but each sequence's first (the prefill's) */
            double tg_tokens = (double)(tokens - B);
            double mc = median_of(tc, reps), mu = median_of(tu, reps);
            printf("| %4d | %6lld | %6lld | %6lld/%-6lld | %10.3f | %10.3f | %8.2f | %8.2f | "
                   "%12.3f | %11.3f | %11.2f | %11.2f |\n",
                   B, (long long)tokens, (long long)forced, (long long)steps_c, (long long)steps_u,
                   mc, mu, tg_tokens / mc, tg_tokens / mu, mu / mc,
                   median_of(cu, reps) / median_of(cc, reps), median_of(p50, reps),
                   median_of(p99, reps));
            fflush(stdout);
        }
        free(made);
    }
    free(before);
    free(after);
    free(tc);
    free(tu);
    free(p50);
    free(p99);
    free(cc);
    free(cu);
out:
    kg_grammar_unref(g);
    free(text);
    return ok;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, int64_t n, double p) {
    if (n == 0) {
        return 0.0;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int64_t i = (int64_t)ceil(p * (double)n) - 1;
    return v[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

/* Poisson arrivals: exponential gaps, prompt lengths uniform in
 * [npp/4, 2*npp], output lengths uniform in [ntg/4, 2*ntg]. */
static bool run_arrivals(bench_env_t *env, const bench_opts_t *o) {
    const int64_t N = o->n_requests;
    uint64_t rng = (uint64_t)o->seed;
    int64_t *arrive = malloc((size_t)N * sizeof(int64_t)),
            *first = calloc((size_t)N, sizeof(int64_t));
    int64_t *last = calloc((size_t)N, sizeof(int64_t));
    int32_t *plen = malloc((size_t)N * sizeof(int32_t)),
            *olen = malloc((size_t)N * sizeof(int32_t));
    int32_t *ngen = calloc((size_t)N, sizeof(int32_t));
    int32_t *prompt = malloc((size_t)(2 * o->npp + 1) * sizeof(int32_t));
    double *ttft = malloc((size_t)N * sizeof(double)), *tpot = malloc((size_t)N * sizeof(double));
    bool ok = arrive && first && last && plen && olen && ngen && prompt && ttft && tpot;
    double t = 0.0;
    for (int64_t i = 0; ok && i < N; i++) {
        double u = ((double)(splitmix(&rng) >> 11) + 0.5) / 9007199254740992.0;
        t += -log(u) / o->arrivals;
        arrive[i] = (int64_t)(t * 1e6);
        int64_t lo = o->npp / 4 > 0 ? o->npp / 4 : 1, hi = 2 * o->npp;
        plen[i] = (int32_t)(lo + (int64_t)(splitmix(&rng) % (uint64_t)(hi - lo + 1)));
        lo = o->ntg / 4 > 0 ? o->ntg / 4 : 1;
        hi = 2 * o->ntg;
        olen[i] = (int32_t)(lo + (int64_t)(splitmix(&rng) % (uint64_t)(hi - lo + 1)));
    }
    int64_t t0 = kg_clock_us(), next = 0, n_done = 0, n_tokens = 0;
    while (ok && n_done < N) {
        int64_t now = kg_clock_us() - t0;
        while (next < N && arrive[next] <= now) {
            random_prompt(env->model, &rng, prompt, plen[next]);
            kg_request_t req = {.id = (uint64_t)next,
                                .prompt = prompt,
                                .n_prompt = plen[next],
                                .max_tokens = olen[next],
                                .ignore_eos = true,
                                .sampling = kg_sampling_params_default()};
            kg_status_t st = kg_engine_submit(env->engine, &req);
            if (st == KG_QUEUE_FULL) {
                break; /* retry next loop: the queue is a bounded resource */
            }
            if (st != KG_OK) {
                fprintf(stderr, "kgen-bench: submit failed: %s\n", kg_status_str(st));
                ok = false;
                break;
            }
            next++;
        }
        if (!kg_engine_busy(env->engine)) {
            /* idle until the next arrival */
            while (next < N && kg_clock_us() - t0 < arrive[next]) {
            }
            continue;
        }
        int32_t n = bench_step(env);
        if (n < 0) {
            ok = false;
            break;
        }
        int64_t ts = kg_clock_us() - t0;
        for (int32_t i = 0; i < n; i++) {
            const kg_completion_t *c = &env->comps[i];
            if (c->token >= 0) {
                if (ngen[c->id]++ == 0) {
                    first[c->id] = ts;
                }
                last[c->id] = ts;
                n_tokens++;
            }
            if (c->finish != KG_FINISH_NONE) {
                n_done++;
            }
        }
    }
    double wall = (double)(kg_clock_us() - t0) / 1e6;
    int64_t n_tpot = 0;
    for (int64_t i = 0; ok && i < N; i++) {
        ttft[i] = (double)(first[i] - arrive[i]) / 1e3;
        if (ngen[i] > 1) {
            tpot[n_tpot++] = (double)(last[i] - first[i]) / 1e3 / (ngen[i] - 1);
        }
    }
    if (ok) {
        double ttft50 = percentile(ttft, N, 0.5), ttft99 = percentile(ttft, N, 0.99);
        double tpot50 = percentile(tpot, n_tpot, 0.5), tpot99 = percentile(tpot, n_tpot, 0.99);
        if (o->json) {
            printf("{\"mode\":\"arrivals\",\"rate\":%g,\"requests\":%lld,\"wall_s\":%.3f,"
                   "\"tokens\":%lld,\"tokens_per_s\":%.2f,\"requests_per_s\":%.3f,"
                   "\"ttft_ms_p50\":%.2f,\"ttft_ms_p99\":%.2f,\"tpot_ms_p50\":%.2f,"
                   "\"tpot_ms_p99\":%.2f}\n",
                   o->arrivals, (long long)N, wall, (long long)n_tokens, (double)n_tokens / wall,
                   (double)N / wall, ttft50, ttft99, tpot50, tpot99);
        } else {
            printf("| rate req/s | requests | wall s | gen tokens | tok/s | req/s | TTFT p50 ms | "
                   "TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |\n");
            printf("|---|---|---|---|---|---|---|---|---|---|\n");
            printf("| %g | %lld | %.2f | %lld | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f |\n",
                   o->arrivals, (long long)N, wall, (long long)n_tokens, (double)n_tokens / wall,
                   (double)N / wall, ttft50, ttft99, tpot50, tpot99);
        }
    }
    free(arrive), free(first), free(last), free(plen), free(olen), free(ngen), free(prompt);
    free(ttft), free(tpot);
    return ok;
}

static void print_row(const bench_row_t *r, bool json, bool first, bool moe) {
    double t = r->t_pp + r->t_tg;
    double s_pp = r->t_pp > 0 ? (double)(r->b * r->pp) / r->t_pp : 0;
    double s_tg = r->t_tg > 0 ? (double)(r->b * r->tg) / r->t_tg : 0;
    double s = t > 0 ? (double)r->n_kv / t : 0;
    /* decode: experts run per layer and step, rows per expert GEMM */
    double act = r->moe_layer_steps > 0 ? (double)r->moe_groups / (double)r->moe_layer_steps : 0;
    double rows = r->moe_groups > 0 ? (double)r->moe_routed / (double)r->moe_groups : 0;
    if (json) {
        printf(
            "%s{\"pp\":%lld,\"tg\":%lld,\"b\":%lld,\"n_kv\":%lld,\"t_pp\":%.6f,\"speed_pp\":%.3f,"
            "\"t_tg\":%.6f,\"speed_tg\":%.3f,\"t\":%.6f,\"speed\":%.3f",
            first ? "" : ",\n", (long long)r->pp, (long long)r->tg, (long long)r->b,
            (long long)r->n_kv, r->t_pp, s_pp, r->t_tg, s_tg, t, s);
        if (moe) {
            printf(",\"tg_active_experts\":%.3f,\"tg_rows_per_expert_gemm\":%.3f", act, rows);
        }
        printf("}");
    } else {
        printf("| %6lld | %6lld | %4lld | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |",
               (long long)r->pp, (long long)r->tg, (long long)r->b, (long long)r->n_kv, r->t_pp,
               s_pp, r->t_tg, s_tg, t, s);
        if (moe) {
            printf(" %7.2f | %8.2f |", act, rows);
        }
        printf("\n");
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    bench_opts_t o = {.backend = "auto",
                      .eo = kg_engine_options_default(),
                      .npp = 128,
                      .ntg = 64,
                      .n_requests = 64,
                      .seed = 1,
                      .npl = {1, 4, 16},
                      .n_npl = 3};
    o.eo.max_batch_tokens = 2048; /* llama-batched-bench's -b */
    o.eo.prefix_cache = false;    /* random prompts share nothing */
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    /* with --metrics, job lines are logged at info as the worker does */
    kg_log_setup(o.metrics ? KG_LOG_LEVEL_INFO : KG_LOG_LEVEL_WARN, KG_LOG_FORMAT_LOGFMT);
    char err[512] = "";
    bench_env_t env = {0};
    env.metrics = o.metrics;
    kg_histogram_init(&env.step, KG_HIST_STEP);
    kg_histogram_init(&env.ttft, KG_HIST_TTFT);
    kg_histogram_init(&env.tpot, KG_HIST_TPOT);
    kg_histogram_init(&env.e2e, KG_HIST_E2E);
    env.model = kg_model_load(o.model_path, err, sizeof(err));
    if (!env.model) {
        fprintf(stderr, "kgen-bench: %s\n", err);
        return 1;
    }
    rc = 1;
    if (o.arrivals > 0) {
        int64_t ctx = 2 * o.npp + 2 * o.ntg + 1;
        int32_t seqs = o.n_npl == 1 ? o.npl[0] : 16;
        if (!env_open(&env, &o, seqs, ctx, err, sizeof(err))) {
            fprintf(stderr, "kgen-bench: %s\n", err);
            goto out;
        }
        if (!o.json) {
            printf("\nmodel %s, backend %s, max sequences %d, token budget %d\n\n", o.model_path,
                   kg_backend_name(env.be), seqs, env.ep.max_batch_tokens);
        }
        rc = run_arrivals(&env, &o) ? 0 : 1;
        goto out;
    }
    int32_t max_b = 0;
    for (int i = 0; i < o.n_npl; i++) {
        max_b = o.npl[i] > max_b ? o.npl[i] : max_b;
    }
    if (!env_open(&env, &o, max_b, o.npp + o.ntg + 1, err, sizeof(err))) {
        fprintf(stderr, "kgen-bench: %s\n", err);
        goto out;
    }
    if (o.constraint != KG_CONSTRAINT_NONE) {
        printf("\nmodel %s, backend %s, threads %lld, PP %lld, TG up to %lld, greedy\n\n",
               o.model_path, kg_backend_name(env.be), (long long)o.eo.threads, (long long)o.npp,
               (long long)o.ntg);
        rc = run_constrained(&env, &o) ? 0 : 1;
        goto out;
    }
    const bool moe = env.model->hp.n_expert > 0;
    if (o.json) {
        printf("[\n");
    } else {
        printf("\nmodel %s, backend %s, threads %lld, token budget %d\n\n", o.model_path,
               kg_backend_name(env.be), (long long)o.eo.threads, env.ep.max_batch_tokens);
        if (moe) {
            printf("experts %d, %d per token; TG exp.: experts a layer runs per decode step; "
                   "TG rows/: token rows per expert GEMM\n\n",
                   env.model->hp.n_expert, env.model->hp.n_expert_used);
        }
        printf("|     PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |    "
               "  T s |    S t/s |%s\n",
               moe ? " TG exp. | TG rows/ |" : "");
        printf("|--------|--------|------|--------|----------|----------|----------|----------|----"
               "------|----------|%s\n",
               moe ? "---------|----------|" : "");
    }
    for (int i = 0; i < o.n_npl; i++) {
        bench_row_t row;
        if (!run_batched(&env, &o, o.npl[i], &row)) {
            goto out;
        }
        print_row(&row, o.json, i == 0, moe);
    }
    if (o.json) {
        printf("\n]\n");
    }
    rc = 0;
out:
    env_close(&env);
    kg_model_free(env.model);
    return rc;
}
