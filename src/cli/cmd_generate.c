/* kgen generate: one prompt, one sequence, straight through the backend
 * (like llama-simple). The prompt is prefilled in chunks of the batch token
 * budget, then one token per step; the sequence's KV blocks are simply
 * blocks 0, 1, 2, ... of a pool sized for the context (kg_engine_size, as
 * every program sizes it). */
#include "backend/kg_backend.h"
#include "cli_util.h"
#include "cmd.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "engine/kg_backend_registry.h"
#include "engine/kg_sizing.h"
#include "model/kg_model.h"
#include "model/kg_sampler.h"
#include "model/kg_tokenizer.h"
#include "pipeline/kg_loras.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen generate --model FILE --prompt TEXT [options]\n"
            "  --model FILE       GGUF model\n"
            "  --prompt TEXT      prompt text (BOS added as the model's metadata says)\n"
            "  --n-predict N      tokens to generate (default 128)\n"
            "  --temp T           temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K          (default 40; 0 = off)\n"
            "  --top-p P          (default 0.95)\n"
            "  --min-p M          (default 0.05)\n"
            "  --repeat-penalty R (default 1.0 = off)\n"
            "  --seed S           RNG seed (default: random)\n"
            "  --lora PATH[:SCALE] a LoRA adapter (repeatable, at most 4: their deltas\n"
            "                     add; llama-cli's --lora, --lora-scaled; cpu backend)\n"
            "  --lora-dir DIR     --lora NAME[:SCALE] is DIR/NAME.gguf when NAME has no '/'\n"
            "  --print-ids        print the generated ids on one line instead of text\n"
            "  --quiet            no timing line on stderr\n"
            "  engine options as in kgen-worker (one sequence; --max-batch-tokens is the\n"
            "  prefill chunk, also spelled --batch-tokens; default backend cpu):\n"
            "%s"
            "  --version, --help\n",
            kg_cli_engine_help);
}

int kg_cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL;
    const char *backend = "cpu";
    int64_t n_predict = 128, seed = -1;
    kg_engine_options_t eo = kg_engine_options_default();
    eo.max_batch_size = 1;
    bool print_ids = false, quiet = false;
    kg_sampling_params_t sp = kg_sampling_params_default();
    char lora_spec[4096] = ""; /* "#1=PATH[:SCALE],#2=..." for kg_loras_parse */
    int n_lora = 0;
    const char *lora_arg[KG_LORA_SET_MAX]; /* --lora as given (--lora-dir may follow it) */
    const char *lora_dir = NULL;
    kg_loras_t loras = {0};
    kg_lora_set_t lora_set = {0};
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;

    enum {
        O_MODEL = 256,
        O_PROMPT,
        O_NPRED,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_REP,
        O_SEED,
        O_IDS,
        O_LORA,
        O_LORA_DIR,
        O_QUIET,
        O_VERSION,
        O_HELP
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},
        {"prompt", required_argument, 0, O_PROMPT},
        {"n-predict", required_argument, 0, O_NPRED},
        {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"repeat-penalty", required_argument, 0, O_REP},
        {"seed", required_argument, 0, O_SEED},
        {"batch-tokens", required_argument, 0, KG_CLI_O_MAX_BATCH_TOKENS},
        {"print-ids", no_argument, 0, O_IDS},
        {"lora", required_argument, 0, O_LORA},
        {"lora-dir", required_argument, 0, O_LORA_DIR},
        {"quiet", no_argument, 0, O_QUIET},
        {"version", no_argument, 0, O_VERSION},
        {"help", no_argument, 0, O_HELP},
        KG_CLI_ENGINE_LONGOPTS,
        {0, 0, 0, 0}};
    int c;
    int64_t iv;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int taken = kg_cli_engine_option(c, optarg, argc, argv, "kgen generate", &eo, &backend);
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
        case O_PROMPT:
            prompt = optarg;
            break;
        case O_NPRED:
            ok = kg_cli_parse_i64(optarg, 0, 1 << 20, &n_predict);
            break;
        case O_TEMP:
            ok = kg_cli_parse_f32(optarg, 0.0f, 100.0f, &sp.temperature);
            break;
        case O_TOPK:
            ok = kg_cli_parse_i64(optarg, 0, INT32_MAX, &iv);
            sp.top_k = (int32_t)iv;
            break;
        case O_TOPP:
            ok = kg_cli_parse_f32(optarg, 0.0f, 1.0f, &sp.top_p);
            break;
        case O_MINP:
            ok = kg_cli_parse_f32(optarg, 0.0f, 1.0f, &sp.min_p);
            break;
        case O_REP:
            ok = kg_cli_parse_f32(optarg, 0.01f, 100.0f, &sp.repetition_penalty);
            break;
        case O_SEED:
            ok = kg_cli_parse_i64(optarg, 0, INT64_MAX, &seed);
            break;
        case O_LORA:
            ok = *optarg && n_lora < KG_LORA_SET_MAX && !strchr(optarg, ',');
            if (ok) {
                lora_arg[n_lora++] = optarg;
            }
            break;
        case O_LORA_DIR:
            lora_dir = optarg;
            break;
        case O_IDS:
            print_ids = true;
            break;
        case O_QUIET:
            quiet = true;
            break;
        case O_VERSION:
            kg_cmd_print_version("kgen");
            return 0;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "kgen generate: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kgen generate: bad value '%s' for %s\n", optarg, argv[optind - 1]);
            return 2;
        }
    }
    for (int i = 0; i < n_lora; i++) {
        /* with --lora-dir, a bare name is a file of it (as kgen-worker reads one) */
        size_t at = strlen(lora_spec);
        bool in_dir = lora_dir && !strchr(lora_arg[i], '/');
        int w = snprintf(lora_spec + at, sizeof(lora_spec) - at, "%s#%d=%s%s%s", at ? "," : "",
                         i + 1, in_dir ? lora_dir : "", in_dir ? "/" : "", lora_arg[i]);
        if (w < 0 || (size_t)w >= sizeof(lora_spec) - at) {
            fprintf(stderr, "kgen generate: --lora: too long\n");
            return 2;
        }
        if (in_dir) {
            /* NAME[:SCALE] -> DIR/NAME.gguf[:SCALE] */
            char *entry = lora_spec + at + (at ? 1 : 0);
            char *name = strchr(entry, '=') + 1 + strlen(lora_dir) + 1;
            char *colon = strrchr(name, ':');
            char tail[64] = "";
            if (colon) {
                snprintf(tail, sizeof(tail), "%s", colon);
                *colon = '\0';
            }
            size_t used = strlen(lora_spec);
            w = snprintf(lora_spec + used, sizeof(lora_spec) - used, ".gguf%s", tail);
            if (w < 0 || (size_t)w >= sizeof(lora_spec) - used) {
                fprintf(stderr, "kgen generate: --lora: too long\n");
                return 2;
            }
        }
    }
    if (optind < argc || !model_path || !prompt) {
        fprintf(stderr, "kgen generate: %s\n",
                optind < argc ? "unexpected argument" : "--model and --prompt are required");
        usage(stderr);
        return 2;
    }
    sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)kg_clock_us() << 20);

    int rc = 1;
    char err[512] = "";
    kg_model_t *model = NULL;
    kg_backend_t *be = NULL;
    kg_sampler_scratch_t *sc = NULL;
    int32_t *ids = NULL, *table = NULL;
    float *logits = NULL;
    int32_t *pos = NULL, *seq = NULL;
    bool *want = NULL;

    model = kg_model_load(model_path, err, sizeof(err));
    if (!model) {
        fprintf(stderr, "kgen generate: %s\n", err);
        goto out;
    }
    const kg_hparams_t *hp = &model->hp;
    kg_engine_params_t ep;
    kg_backend_params_t bp;
    if (kg_engine_size(model, &eo, &ep, &bp, NULL, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen generate: %s\n", err);
        goto out;
    }
    const int64_t n_ctx = ep.max_seq_len, batch_tokens = ep.max_batch_tokens;
    const kg_tokenizer_t *tok = model->tok;
    size_t plen = strlen(prompt);
    int64_t n_cap = (int64_t)plen + 8;
    ids = malloc((size_t)(n_cap + n_predict + 1) * sizeof(int32_t));
    if (!ids) {
        fprintf(stderr, "kgen generate: out of memory\n");
        goto out;
    }
    int64_t n_prompt = kg_tokenizer_encode(tok, prompt, plen, true, true, ids, n_cap);
    if (n_prompt > n_cap) {
        /* byte-fallback vocabularies can need several tokens per byte */
        n_cap = n_prompt;
        int32_t *bigger = realloc(ids, (size_t)(n_cap + n_predict + 1) * sizeof(int32_t));
        if (!bigger) {
            fprintf(stderr, "kgen generate: out of memory\n");
            goto out;
        }
        ids = bigger;
        n_prompt = kg_tokenizer_encode(tok, prompt, plen, true, true, ids, n_cap);
    }
    if (n_prompt < 0 || n_prompt > n_cap) {
        fprintf(stderr, "kgen generate: could not tokenize the prompt\n");
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "kgen generate: the prompt is empty and the model adds no BOS\n");
        goto out;
    }
    if (n_prompt + n_predict > n_ctx) {
        if (n_prompt >= n_ctx) {
            fprintf(stderr,
                    "kgen generate: prompt of %lld tokens does not fit the context of %lld\n",
                    (long long)n_prompt, (long long)n_ctx);
            goto out;
        }
        n_predict = n_ctx - n_prompt;
    }

    const int32_t n_blocks = (int32_t)((n_ctx + ep.kv_block_size - 1) / ep.kv_block_size);
    be = kg_backend_new(backend, model, &bp, err, sizeof(err));
    if (!be) {
        fprintf(stderr, "kgen generate: %s\n", err);
        goto out;
    }
    if (kg_loras_parse(&loras, lora_spec, err, sizeof(err)) != KG_OK ||
        kg_loras_load(&loras, model, be, 0, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen generate: %s\n", err);
        goto out;
    }
    for (int32_t i = 0; i < loras.n; i++) {
        lora_set.id[lora_set.n] = loras.e[i].id;
        lora_set.scale[lora_set.n++] = loras.e[i].scale;
    }
    sc = kg_sampler_scratch_new(hp->n_vocab);
    table = malloc((size_t)n_blocks * sizeof(int32_t));
    logits = malloc((size_t)hp->n_vocab * sizeof(float));
    pos = malloc((size_t)batch_tokens * sizeof(int32_t));
    seq = calloc((size_t)batch_tokens, sizeof(int32_t));
    want = calloc((size_t)batch_tokens, sizeof(bool));
    if (!sc || !table || !logits || !pos || !seq || !want) {
        fprintf(stderr, "kgen generate: out of memory\n");
        goto out;
    }
    for (int32_t i = 0; i < n_blocks; i++) {
        table[i] = i;
    }

    kg_rng_t rng;
    kg_rng_seed(&rng, sp.seed);
    int64_t n_past = 0, n_gen = 0;
    int64_t t_start = kg_clock_us(), t_first = 0;
    char piece[256];
    while (n_gen < n_predict) {
        /* next chunk: the rest of the prompt (budget-limited) or the last token */
        int64_t n_total = n_prompt + n_gen;
        int64_t n = n_total - n_past;
        if (n > batch_tokens) {
            n = batch_tokens;
        }
        for (int64_t i = 0; i < n; i++) {
            pos[i] = (int32_t)(n_past + i);
            want[i] = false;
        }
        bool last = n_past + n == n_total;
        want[n - 1] = last;
        kg_step_batch_t batch = {.n_tokens = (int32_t)n,
                                 .token = ids + n_past,
                                 .pos = pos,
                                 .seq = seq,
                                 .want_logits = want,
                                 .n_outputs = last ? 1 : 0,
                                 .n_slots = 1,
                                 .max_blocks_per_seq = n_blocks,
                                 .block_table = table,
                                 .slot_lora = lora_set.n > 0 ? &lora_set : NULL};
        kg_status_t st = kg_backend_forward(be, &batch, logits);
        if (st != KG_OK) {
            fprintf(stderr, "kgen generate: forward failed: %s\n", kg_status_str(st));
            goto out;
        }
        n_past += n;
        if (!last) {
            continue;
        }
        kg_sample_result_t res;
        kg_sampler_sample(&sp, &rng, logits, hp->n_vocab, ids, (int32_t)n_prompt, ids + n_prompt,
                          (int32_t)n_gen, sc, &res);
        if (n_gen == 0) {
            t_first = kg_clock_us();
        }
        if (kg_tokenizer_is_eog(tok, res.token)) {
            break;
        }
        ids[n_prompt + n_gen++] = res.token;
        if (print_ids) {
            printf(n_gen > 1 ? " %d" : "%d", res.token);
        } else {
            size_t len = kg_tokenizer_piece(tok, res.token, false, piece, sizeof(piece));
            fwrite(piece, 1, len < sizeof(piece) ? len : sizeof(piece), stdout);
        }
        fflush(stdout);
    }
    printf("\n");
    fflush(stdout);
    int64_t t_end = kg_clock_us();
    if (!quiet) {
        double pp_s = t_first > t_start ? (double)(t_first - t_start) / 1e6 : 0.0;
        double tg_s = (double)(t_end - t_first) / 1e6;
        fprintf(stderr,
                "kgen generate: prompt %lld tokens in %.3f s (%.1f t/s); generated %lld tokens "
                "in %.3f s (%.2f t/s)\n",
                (long long)n_prompt, pp_s, pp_s > 0 ? (double)n_prompt / pp_s : 0.0,
                (long long)n_gen, tg_s, n_gen > 1 && tg_s > 0 ? (double)(n_gen - 1) / tg_s : 0.0);
    }
    rc = 0;
out:
    free(want);
    free(seq);
    free(pos);
    free(logits);
    free(table);
    free(ids);
    kg_sampler_scratch_free(sc);
    kg_loras_clear(&loras);
    kg_backend_free(be);
    kg_model_free(model);
    return rc;
}
