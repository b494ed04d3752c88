/* kgen batch: offline mode on the worker's contract (like vLLM's
 * run-batch). Every line of the input is a job: a kgen job
 * (schemas/job.schema.json), an OpenAI Batch API input line or a bare
 * OpenAI request body (kg_openai.h), mixed as they come; every job gets
 * exactly one line in the output, in input order: its done or error event
 * (schemas/event.schema.json), or with --output-format openai the OpenAI
 * Batch output line of it (schemas/openai-batch-output.schema.json), errors
 * optionally to --error-file. Jobs go through the same intake, engine and
 * output code as kgen-worker, on one thread. A line that is not a job with
 * a usable request_id gets an error event with request_id "line-<N>"
 * (1-based), which is also the request_id of a bare body. */
#include "cmd.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "engine/kg_backend_registry.h"
#include "engine/kg_engine.h"
#include "model/kg_model.h"
#include "pipeline/kg_events.h"
#include "pipeline/kg_intake.h"
#include "pipeline/kg_jobrun.h"
#include "pipeline/kg_served.h"
#include "pipeline/kg_stack.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"
#include "schema/kg_openai.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct batch_job {
    kg_jobrun_t run; /* the job from intake to its terminal event (kg_jobrun) */
    bool ready;      /* run was started: it goes to the engine */
    char *result;    /* the final event line (owned) */
    size_t result_len;
    const char *line; /* the input line (in the input buffer) */
    size_t line_len;
} batch_job_t;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: kgen batch --model FILE --input jobs.jsonl --output results.jsonl [options]\n"
        "%s"
        "  --max-tokens-limit N   larger max_tokens are refused (default 4096)\n"
        "  --max-event-bytes N    fit every event into N bytes as kgen-worker does for its\n"
        "                         results topic (0 = no limit, the default; at least 4096)\n"
        "  --served-model-name N  names jobs may give as model, comma-separated or repeated\n"
        "                         (default: the GGUF's general.name and the file stem)\n"
        "  --lora NAME=PATH[:SCALE]  a LoRA adapter jobs pick by model or lora (repeatable)\n"
        "  --lora-dir DIR         adapters by name: DIR/NAME.gguf, read on the first job naming "
        "it\n"
        "  --max-loras N          adapters held at once (0 = no cap, the default); the least\n"
        "                         recently used idle one is evicted to load another\n"
        "  --output-format F      kgen (events, default) or openai (OpenAI Batch output lines)\n"
        "  --error-file FILE      with openai: the lines of failed requests go here\n"
        "  --version, --help\n",
        kg_cli_engine_help);
}

/* Write the result of every job, in input order: its event, or its OpenAI
 * Batch output line (to `err` when it failed and `err` is given). */
static bool write_results(const batch_job_t *jobs,
                          int n_jobs,
                          bool openai,
                          const char *default_model,
                          FILE *out,
                          FILE *err) {
    kg_openai_output_opts_t oo = {.default_model = default_model};
    for (int i = 0; i < n_jobs; i++) {
        const batch_job_t *bj = &jobs[i];
        if (!bj->result) {
            fprintf(stderr, "kgen batch: out of memory encoding job %d\n", i);
            return false;
        }
        if (!openai) {
            fwrite(bj->result, 1, bj->result_len, out);
            fputc('\n', out);
            continue;
        }
        char *line = NULL, msg[128];
        size_t len = 0;
        bool is_error = false;
        if (kg_openai_batch_output(bj->line, bj->line_len, bj->result, bj->result_len, &oo, &line,
                                   &len, &is_error, msg, sizeof(msg)) != KG_OK) {
            fprintf(stderr, "kgen batch: job %d: no OpenAI output: %s\n", i + 1, msg);
            return false;
        }
        FILE *f = is_error && err ? err : out;
        fwrite(line, 1, len, f);
        fputc('\n', f);
        free(line);
    }
    return true;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap * 2 + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    if (f != stdin) {
        fclose(f);
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

static void progress(int done, int total, int64_t tokens, int64_t t0) {
    double s = (double)(kg_clock_us() - t0) / 1e6;
    int width = 30, fill = total ? done * width / total : width;
    fprintf(stderr, "\r[%.*s%*s] %d/%d jobs  %.1f tok/s ", fill, "##############################",
            width - fill, "", done, total, s > 0 ? (double)tokens / s : 0.0);
    fflush(stderr);
}

static void set_result(batch_job_t *bj, char *json, size_t len) {
    free(bj->result);
    bj->result = json;
    bj->result_len = len;
}

int kg_cmd_batch(int argc, char **argv) {
    const char *model_path = NULL, *in_path = NULL, *out_path = NULL;
    const char *err_path = NULL;
    char served_spec[1024] = "";
    char lora_spec[8192] = "";
    bool openai = false;
    int64_t max_tokens_limit = 4096;
    int64_t max_event_bytes = 0;
    kg_stack_options_t so = kg_stack_options_default();
    enum {
        O_MODEL = 256,
        O_IN,
        O_OUT,
        O_MTL,
        O_MEB,
        O_SERVED,
        O_LORA,
        O_LORA_DIR,
        O_MAX_LORAS,
        O_FORMAT,
        O_ERRFILE,
        O_VERSION,
        O_HELP
    };
    static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                         {"input", required_argument, 0, O_IN},
                                         {"output", required_argument, 0, O_OUT},
                                         {"max-tokens-limit", required_argument, 0, O_MTL},
                                         {"served-model-name", required_argument, 0, O_SERVED},
                                         {"lora", required_argument, 0, O_LORA},
                                         {"lora-dir", required_argument, 0, O_LORA_DIR},
                                         {"max-loras", required_argument, 0, O_MAX_LORAS},
                                         {"output-format", required_argument, 0, O_FORMAT},
                                         {"error-file", required_argument, 0, O_ERRFILE},
                                         {"max-event-bytes", required_argument, 0, O_MEB},
                                         {"version", no_argument, 0, O_VERSION},
                                         {"help", no_argument, 0, O_HELP},
                                         KG_CLI_ENGINE_LONGOPTS,
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int taken =
            kg_cli_engine_option(c, optarg, argc, argv, "kgen batch", &so.engine, &so.backend);
        if (taken < 0) {
            return 2;
        }
        if (taken > 0) {
            continue;
        }
        bool ok = true;
        switch (c) {
        case O_MODEL:
            model_path = optarg;
            break;
        case O_IN:
            in_path = optarg;
            break;
        case O_OUT:
            out_path = optarg;
            break;
        case O_MTL:
            ok = kg_cli_parse_i64(optarg, 1, 1 << 24, &max_tokens_limit);
            break;
        case O_SERVED: {
            size_t at = strlen(served_spec);
            ok = at + strlen(optarg) + 2 < sizeof(served_spec) && *optarg;
            if (ok) {
                snprintf(served_spec + at, sizeof(served_spec) - at, "%s%s", at ? "," : "", optarg);
            }
            break;
        }
        case O_LORA: {
            size_t at = strlen(lora_spec);
            ok = at + strlen(optarg) + 2 < sizeof(lora_spec) && *optarg;
            if (ok) {
                snprintf(lora_spec + at, sizeof(lora_spec) - at, "%s%s", at ? "," : "", optarg);
            }
            break;
        }
        case O_LORA_DIR:
            so.lora_dir = optarg;
            break;
        case O_MAX_LORAS: {
            int64_t v = 0;
            ok = kg_cli_parse_i64(optarg, 0, 256, &v);
            so.max_loras = (int32_t)v;
            break;
        }
        case O_FORMAT:
            ok = strcmp(optarg, "openai") == 0 || strcmp(optarg, "kgen") == 0;
            openai = strcmp(optarg, "openai") == 0;
            break;
        case O_ERRFILE:
            err_path = optarg;
            break;
        case O_MEB:
            ok = kg_cli_parse_i64(optarg, 0, (int64_t)1 << 30, &max_event_bytes) &&
                 (max_event_bytes == 0 || max_event_bytes >= 4096);
            break;
        case O_VERSION:
            kg_cmd_print_version("kgen");
            return 0;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "kgen batch: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kgen batch: bad value '%s' for %s\n", optarg, argv[optind - 1]);
            return 2;
        }
    }
    if (err_path && !openai) {
        fprintf(stderr, "kgen batch: --error-file goes with --output-format openai\n");
        return 2;
    }
    if (optind < argc || !model_path || !in_path || !out_path) {
        fprintf(stderr, "kgen batch: --model, --input and --output are required\n");
        usage(stderr);
        return 2;
    }
    kg_codec_global_init();

    int rc = 1;
    char err[512] = "";
    size_t in_len = 0;
    char *input = read_all(in_path, &in_len);
    kg_model_t *model = NULL;
    kg_stack_t *stack = NULL;
    kg_engine_t *engine = NULL; /* the stack's */
    batch_job_t *jobs = NULL;
    kg_completion_t *comps = NULL;
    FILE *out = NULL, *errf = NULL;
    kg_served_t served = {0};
    int n_jobs = 0;
    if (!input) {
        fprintf(stderr, "kgen batch: cannot read %s\n", in_path);
        goto out;
    }
    model = kg_model_load(model_path, err, sizeof(err));
    if (!model) {
        fprintf(stderr, "kgen batch: %s\n", err);
        goto out;
    }
    so.grammar_bytes = KG_GRAMMAR_CACHE_DEFAULT_BYTES;
    so.lora = lora_spec;
    stack = kg_stack_new(model, &so, err, sizeof(err));
    if (!stack) {
        fprintf(stderr, "kgen batch: %s\n", err);
        goto out;
    }
    engine = kg_stack_engine(stack);
    const kg_engine_params_t *ep = kg_stack_params(stack);
    if (kg_stack_ctx_clamped(stack)) {
        fprintf(stderr, "kgen batch: the KV pool holds %d tokens: the context is cut to that\n",
                ep->max_seq_len);
    }
    if (kg_served_init(&served, served_spec, model, model_path, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen batch: %s\n", err);
        goto out;
    }
    out = strcmp(out_path, "-") == 0 ? stdout : fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "kgen batch: cannot write %s\n", out_path);
        goto out;
    }
    if (err_path && !(errf = fopen(err_path, "wb"))) {
        fprintf(stderr, "kgen batch: cannot write %s\n", err_path);
        goto out;
    }

    /* split lines (blank lines are skipped) */
    int cap_jobs = 64;
    jobs = calloc((size_t)cap_jobs, sizeof(*jobs));
    size_t budget = (size_t)max_event_bytes;
    kg_intake_limits_t lim = {.max_seq_len = ep->max_seq_len,
                              .max_tokens_limit = (int32_t)max_tokens_limit,
                              .max_event_bytes = budget,
                              .grammars = kg_stack_grammars(stack),
                              .chat_template = kg_stack_chat_template(stack),
                              .max_choices = ep->max_batch_size < KG_JOB_MAX_N ? ep->max_batch_size
                                                                               : KG_JOB_MAX_N,
                              .served = (const char *const *)served.names,
                              .n_served = served.n,
                              .loras = kg_stack_loras(stack),
                              .max_inputs = ep->max_queue_depth,
                              .max_step_tokens = ep->max_batch_tokens};
    kg_event_origin_t origin = {.worker_id = "kgen-batch",
                                .partition = -1,
                                .offset = -1,
                                .model = served.n > 0 ? served.names[0] : NULL};
    int64_t t0 = kg_clock_us();
    int line_no = 0;
    for (char *p = input, *end = input + in_len; jobs && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line_no++;
        char *line = p;
        p += len + 1;
        size_t sp = 0;
        while (sp < len && (line[sp] == ' ' || line[sp] == '\t' || line[sp] == '\r')) {
            sp++;
        }
        if (sp == len) {
            continue;
        }
        if (n_jobs == cap_jobs) {
            batch_job_t *j = realloc(jobs, (size_t)cap_jobs * 2 * sizeof(*jobs));
            if (!j) {
                break;
            }
            memset(j + cap_jobs, 0, (size_t)cap_jobs * sizeof(*jobs));
            jobs = j;
            cap_jobs *= 2;
        }
        batch_job_t *bj = &jobs[n_jobs++];
        bj->line = line;
        bj->line_len = len;
        kg_codec_error_t cerr;
        int64_t taken_us = kg_clock_us();
        kg_job_t *job = NULL;
        char rid[32];
        snprintf(rid, sizeof(rid), "line-%d", line_no);
        kg_codec_opts_t copts = kg_codec_opts_default();
        copts.key = rid; /* the request_id of a bare OpenAI body */
        copts.key_len = strlen(rid);
        if (kg_codec_decode_job_opts(line, len, &copts, &job, &cerr) != KG_OK) {
            size_t jl;
            char *json =
                kg_events_error(&origin, *cerr.request_id ? cerr.request_id : rid,
                                KG_ERROR_INVALID_JOB, cerr.message, NULL, budget, &jl, NULL);
            set_result(bj, json, jl);
            continue;
        }
        kg_error_code_t code;
        char msg[256];
        kg_status_t st = kg_jobrun_start(&bj->run, model, &lim, job, kg_clock_epoch_ms(), taken_us,
                                         &code, msg, sizeof(msg));
        if (st == KG_ERR_INVALID) {
            size_t jl;
            char *json = kg_events_error(&origin, job->request_id, code, msg, job->metadata_json,
                                         budget, &jl, NULL);
            set_result(bj, json, jl);
        } else if (st != KG_OK) {
            fprintf(stderr, "kgen batch: out of memory preparing line %d\n", line_no);
            goto out;
        } else {
            bj->ready = true;
        }
    }
    if (!jobs) {
        fprintf(stderr, "kgen batch: out of memory\n");
        goto out;
    }

    int32_t comps_cap = kg_engine_max_completions(engine);
    comps = malloc((size_t)comps_cap * sizeof(*comps));
    bool tty = isatty(2);
    int next = 0, n_done = 0;
    int64_t n_tokens = 0;
    for (int i = 0; i < n_jobs; i++) {
        n_done += jobs[i].result != NULL;
    }
    while (comps && n_done < n_jobs) {
        /* keep the engine's queue topped up, in input order */
        while (next < n_jobs) {
            batch_job_t *bj = &jobs[next];
            if (!bj->ready) {
                next++;
                continue;
            }
            kg_request_t req = kg_jobrun_request(&bj->run, (uint64_t)next);
            kg_status_t st = kg_engine_submit(engine, &req);
            if (st == KG_QUEUE_FULL) {
                break;
            }
            kg_jobrun_submitted(&bj->run, kg_clock_us());
            if (st != KG_OK) {
                size_t jl;
                kg_jobrun_outcome_t oc;
                char *json = kg_jobrun_refused(&bj->run, &origin, st, budget, &jl, &oc);
                set_result(bj, json, jl);
                bj->ready = false;
                n_done++;
            }
            next++;
        }
        int32_t n = kg_engine_step(engine, comps, comps_cap);
        if (n < 0) {
            fprintf(stderr, "kgen batch: the backend failed: %s\n", kg_status_str((kg_status_t)n));
            goto out;
        }
        int64_t now = kg_clock_us();
        for (int32_t i = 0; i < n; i++) {
            const kg_completion_t *cp = &comps[i];
            batch_job_t *bj = &jobs[cp->id];
            kg_jobrun_step_t js;
            int32_t before = kg_jobrun_n_generated(&bj->run);
            if (kg_jobrun_on_completion(&bj->run, cp, now, &js) != KG_OK) {
                fprintf(stderr, "kgen batch: out of memory assembling output\n");
                goto out;
            }
            n_tokens += kg_jobrun_n_generated(&bj->run) - before;
            if (js.cancel) {
                kg_engine_cancel_choice(engine, cp->id, js.choice);
            }
            if (!js.finished) {
                continue;
            }
            size_t jl;
            kg_jobrun_outcome_t oc;
            char *json = kg_jobrun_terminal(&bj->run, &origin, model->tok, budget, &jl, &oc);
            set_result(bj, json, jl);
            n_done++;
        }
        if (tty) {
            progress(n_done, n_jobs, n_tokens, t0);
        }
    }
    if (tty) {
        fprintf(stderr, "\n");
    }
    if (!write_results(jobs, n_jobs, openai, served.n > 0 ? served.names[0] : NULL, out, errf)) {
        goto out;
    }
    double secs = (double)(kg_clock_us() - t0) / 1e6;
    kg_engine_stats_t es;
    kg_engine_stats(engine, &es);
    fprintf(stderr,
            "kgen batch: %d jobs, %lld tokens generated in %.2f s (%.1f tok/s); prefill %lld "
            "tokens, %lld from the prefix cache\n",
            n_jobs, (long long)n_tokens, secs, secs > 0 ? (double)n_tokens / secs : 0.0,
            (long long)es.n_prefill_tokens, (long long)es.n_prefix_hit_tokens);
    rc = fflush(out) == 0 && (!errf || fflush(errf) == 0) ? 0 : 1;
out:
    if (out && out != stdout) {
        fclose(out);
    }
    if (errf) {
        fclose(errf);
    }
    kg_served_clear(&served);
    for (int i = 0; jobs && i < n_jobs; i++) {
        kg_jobrun_clear(&jobs[i].run);
        free(jobs[i].result);
    }
    free(jobs);
    free(comps);
    kg_stack_free(stack);
    kg_model_free(model);
    free(input);
    return rc;
}
