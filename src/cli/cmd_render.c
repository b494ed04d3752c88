/* cmd_render: `kgen render`, the prompt a job becomes, for users debugging
 * chat templates. Reads one job (a kgen job, an OpenAI Batch line or a bare
 * Chat Completions body, as kgen batch and the worker decode them) from
 * stdin and prints the prompt exactly as the model will see it: a chat job
 * rendered through the model's own template with the Jinja engine (or the
 * recognised-family renderer when the template does not compile), a text
 * prompt as it is; with --ids, the token ids the engine would get, from the
 * same intake as kgen batch and kgen-worker. */
#include "cmd.h"
#include "model/kg_model.h"
#include "pipeline/kg_intake.h"
#include "schema/kg_chat.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f, "usage: kgen render --model FILE [--ids] < job.json\n"
               "\n"
               "Print the prompt one job becomes, exactly as the model sees it: a chat job\n"
               "(messages) rendered with the model's chat template, a text prompt as is.\n"
               "stdin holds one kgen job, OpenAI Batch line or Chat Completions body.\n"
               "\n"
               "  --model FILE   GGUF model (its tokenizer and tokenizer.chat_template)\n"
               "  --ids          print the prompt's token ids (BOS included) on one line instead\n"
               "  --template FILE  use this Jinja chat template instead of the model's own\n"
               "  --bench N      render (and tokenize) the job N times; print the median times\n"
               "                 to stderr (scripts/bench-chat-template)\n"
               "  --help, --version\n");
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int print_ids(const kg_model_t *model, const kg_intake_limits_t *lim, const kg_job_t *job) {
    kg_prepared_t prep;
    kg_error_code_t code = KG_ERROR_INVALID_JOB;
    char msg[600] = "";
    kg_status_t st = kg_intake_prepare(model, lim, job, 0, &prep, &code, msg, sizeof(msg));
    if (st != KG_OK) {
        fprintf(stderr, "kgen render: %s: %s\n", kg_error_code_str(code),
                st == KG_ERR_NOMEM ? "out of memory" : msg);
        return 1;
    }
    for (int32_t i = 0; i < prep.n_tokens; i++) {
        printf(i ? " %d" : "%d", prep.tokens[i]);
    }
    putchar('\n');
    kg_prepared_clear(&prep);
    return 0;
}

static int print_text(const kg_model_t *model, const kg_intake_limits_t *lim, const kg_job_t *job) {
    if (job->prompt_kind == KG_PROMPT_TEXT) {
        fwrite(job->prompt, 1, job->prompt_len, stdout);
        return 0;
    }
    if (job->prompt_kind != KG_PROMPT_MESSAGES) {
        fprintf(stderr, "kgen render: the job gives prompt_tokens; --ids prints them checked\n");
        return 1;
    }
    char *text = NULL, msg[600] = "";
    bool has_bos = false;
    kg_error_code_t code = KG_ERROR_INVALID_JOB;
    kg_status_t st =
        kg_intake_render_chat(model, lim, job, &text, &has_bos, &code, msg, sizeof(msg));
    if (st != KG_OK) {
        fprintf(stderr, "kgen render: %s: %s\n", kg_error_code_str(code),
                st == KG_ERR_NOMEM ? "out of memory" : msg);
        return 1;
    }
    fputs(text, stdout);
    free(text);
    return 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Median of `n` timings (sorted in place). */
static int64_t median(int64_t *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_i64);
    return v[n / 2];
}

/* What rendering costs a chat job: the render alone and the whole intake
 * (kg_intake_prepare: render + tokenize), `n` times each, medians in
 * microseconds. */
static int
run_bench(const kg_model_t *model, const kg_intake_limits_t *lim, const kg_job_t *job, int n) {
    int64_t *r = calloc((size_t)n, sizeof(int64_t)), *p = calloc((size_t)n, sizeof(int64_t));
    int rc = 1, n_tokens = 0;
    size_t text_len = 0;
    if (!r || !p || job->prompt_kind != KG_PROMPT_MESSAGES) {
        fprintf(stderr, "kgen render: --bench needs a chat job\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char *text = NULL, msg[600] = "";
        bool has_bos = false;
        kg_error_code_t code;
        int64_t t0 = now_ns();
        kg_status_t st =
            kg_intake_render_chat(model, lim, job, &text, &has_bos, &code, msg, sizeof(msg));
        int64_t t1 = now_ns();
        text_len = text ? strlen(text) : 0;
        free(text);
        kg_prepared_t prep;
        if (st == KG_OK) {
            st = kg_intake_prepare(model, lim, job, 0, &prep, &code, msg, sizeof(msg));
        }
        int64_t t2 = now_ns();
        if (st != KG_OK) {
            fprintf(stderr, "kgen render: %s: %s\n", kg_error_code_str(code), msg);
            goto out;
        }
        n_tokens = prep.n_tokens;
        kg_prepared_clear(&prep);
        r[i] = t1 - t0;
        p[i] = t2 - t1;
    }
    fprintf(stderr, "render_us=%.1f prepare_us=%.1f prompt_bytes=%zu prompt_tokens=%d runs=%d\n",
            (double)median(r, n) / 1e3, (double)median(p, n) / 1e3, text_len, n_tokens, n);
    rc = 0;
out:
    free(r);
    free(p);
    return rc;
}

int kg_cmd_render(int argc, char **argv) {
    const char *model_path = NULL, *template_path = NULL;
    bool ids = false;
    int bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            kg_cmd_print_version("kgen");
            return 0;
        }
        if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kgen render: %s needs a value\n", a);
                return 2;
            }
            model_path = argv[++i];
        } else if (strncmp(a, "--model=", 8) == 0) {
            model_path = a + 8;
        } else if (strcmp(a, "--ids") == 0) {
            ids = true;
        } else if (strcmp(a, "--template") == 0 && i + 1 < argc) {
            template_path = argv[++i];
        } else if (strcmp(a, "--bench") == 0 && i + 1 < argc) {
            bench = (int)strtol(argv[++i], NULL, 10);
            if (bench < 1) {
                fprintf(stderr, "kgen render: --bench needs a positive count\n");
                return 2;
            }
        } else {
            fprintf(stderr, "kgen render: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!model_path || !*model_path) {
        fprintf(stderr, "kgen render: --model FILE is required (see --help)\n");
        return 2;
    }
    int rc = 1;
    char err[512];
    char *in = NULL;
    kg_job_t *job = NULL;
    kg_chat_jinja_t *chat = NULL;
    kg_model_t *model = kg_model_load(model_path, err, sizeof(err));
    if (!model) {
        fprintf(stderr, "kgen render: %s\n", err);
        goto out;
    }
    size_t len = 0;
    if (template_path) {
        FILE *f = fopen(template_path, "rb");
        char *src = f ? read_all(f, &len) : NULL;
        if (f) {
            fclose(f);
        }
        if (!src) {
            fprintf(stderr, "kgen render: cannot read %s: %s\n", template_path, strerror(errno));
            goto out;
        }
        chat = kg_chat_jinja_new(src, len, err, sizeof(err));
        free(src);
        if (!chat) {
            fprintf(stderr, "kgen render: %s: %s\n", template_path, err);
            goto out;
        }
    } else {
        chat = kg_chat_jinja_compile(model->chat_template);
    }
    in = read_all(stdin, &len);
    if (!in) {
        fprintf(stderr, "kgen render: cannot read stdin: %s\n", strerror(errno));
        goto out;
    }
    kg_codec_error_t ce;
    kg_codec_opts_t co = kg_codec_opts_default();
    co.max_message_size = len + 1; /* a file here, not a Kafka message */
    co.key = "render";             /* a bare OpenAI body has no request_id of its own */
    co.key_len = strlen(co.key);
    if (kg_codec_decode_job_opts(in, len, &co, &job, &ce) != KG_OK) {
        fprintf(stderr, "kgen render: not a job: %s\n", ce.message);
        goto out;
    }
    /* no worker limits: the model's context bounds the prompt */
    int32_t ctx = model->hp.n_ctx_train > 1 ? model->hp.n_ctx_train : INT32_MAX;
    kg_intake_limits_t lim = {
        .max_seq_len = ctx, .max_tokens_limit = INT32_MAX, .chat_template = chat};
    if (bench > 0) {
        rc = run_bench(model, &lim, job, bench);
        goto out;
    }
    rc = ids ? print_ids(model, &lim, job) : print_text(model, &lim, job);
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "kgen render: cannot write stdout: %s\n", strerror(errno));
        rc = 1;
    }
out:
    kg_job_free(job);
    free(in);
    kg_chat_jinja_free(chat);
    kg_model_free(model);
    return rc;
}
