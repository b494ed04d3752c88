/* cmd_mkmodel: `kgen mkmodel`, a random-weight Llama model of any shape.
 *
 * The file is what llama.cpp's converter would write for a Llama model:
 * the llama.* hyperparameter keys, a tokenizer, and tensors with
 * llama.cpp's names and ggml shapes (ne[0] is the input dimension). Norm
 * weights stay F32, as llama.cpp keeps 1-D tensors; every 2-D weight takes
 * the chosen type.
 *
 * Weights are deterministic: each tensor draws from its own xoshiro256**
 * stream seeded from (--seed, tensor name), so the same arguments give the
 * same bytes, and changing one tensor's shape leaves the others alone. The
 * scales keep activations sane through many layers: every projection is
 * uniform with variance 1/fan_in (unit-variance outputs for unit-RMS
 * inputs), the two projections that add into the residual stream are
 * further scaled by 1/sqrt(2 n_layer) (GPT-2's init), and norm weights are
 * 1 +- 0.1. The result is a model whose greedy output varies with the
 * prompt, not a constant. */
#include "cmd.h"
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_mkmodel.h"
#include "model/kg_quant.h"
#include "model/kg_quant_mix.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef kg_mkmodel_opts_t mk_opts_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen mkmodel --out FILE --n-embd N --n-layer L --n-head H --n-head-kv K\n"
            "                    --n-ff F --seed S [options]\n"
            "\n"
            "Write a random-weight Llama model (GGUF v3) that llama.cpp and kgen load.\n"
            "The same arguments always give the same bytes.\n"
            "\n"
            "  --out FILE          the GGUF file to write\n"
            "  --n-embd N          embedding width\n"
            "  --n-layer L         number of blocks\n"
            "  --n-head H          query heads\n"
            "  --n-head-kv K       key/value heads (H must be a multiple of K)\n"
            "  --n-ff F            feed-forward width (SwiGLU)\n"
            "  --seed S            weight seed (0 .. 2^64-1)\n"
            "  --head-dim D        head width (default N / H; even, for RoPE)\n"
            "  --rope-base B       RoPE frequency base (default 10000)\n"
            "  --ctx C             llama.context_length (default 2048)\n"
            "  --tied              no output.weight: the head reuses token_embd\n"
            "  --type T            weight types as llama-quantize's type T writes them (default\n"
            "                      f32; norms stay f32): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,\n"
            "                      q5_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s,\n"
            "                      q5_k_m, q6_k, iq4_nl, iq4_xs (q3_k, q4_k, q5_k: the _m mixes).\n"
            "                      The mixes give some tensors more bits (output q6_k, attn_v and\n"
            "                      ffn_down of some layers) and fall back to 32-blocks where a\n"
            "                      row is not a multiple of 256, exactly as llama-quantize does\n"
            "  --pure              every 2-D weight in T's base type (llama-quantize --pure)\n"
            "  --f16 | --bf16 | --q8_0 | --q4_0\n"
            "                      short for --type f16 (bf16, q8_0, q4_0)\n"
            "  --vocab-from FILE   copy every tokenizer.* key of FILE (n_vocab: its token count);\n"
            "                      default: a 259-token SentencePiece byte vocabulary\n"
            "  --n-vocab N         built-in vocabulary of N tokens (>= 259): the byte vocabulary\n"
            "                      plus N - 259 made-up words (benchmarks at a real model's size)\n"
            "  --name NAME         general.name (default \"kgen-random\")\n"
            "  --help, --version\n");
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') {
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *out = v;
    return true;
}

/** Parse argv into o; 0 to go on, else the exit status (help, version, usage error). */
static int parse_args(int argc, char **argv, mk_opts_t *o) {
    static const struct {
        const char *flag;
        size_t off;
        int64_t min, max;
    } ints[] = {
        {"--n-embd", offsetof(mk_opts_t, n_embd), 1, 1 << 16},
        {"--n-layer", offsetof(mk_opts_t, n_layer), 1, 1024},
        {"--n-head", offsetof(mk_opts_t, n_head), 1, 1024},
        {"--n-head-kv", offsetof(mk_opts_t, n_head_kv), 1, 1024},
        {"--n-ff", offsetof(mk_opts_t, n_ff), 1, 1 << 20},
        {"--head-dim", offsetof(mk_opts_t, head_dim), 2, 1 << 12},
        {"--ctx", offsetof(mk_opts_t, ctx), 1, 1 << 24},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--version") == 0) {
            kg_cmd_print_version("kgen");
            return -1;
        }
        if (strcmp(a, "--tied") == 0) {
            o->tied = true;
            continue;
        }
        if (strcmp(a, "--pure") == 0) {
            o->pure = true;
            continue;
        }
        static const char *const type_flags[] = {"--f32", "--f16", "--bf16", "--q8_0", "--q4_0"};
        bool is_type = false;
        for (size_t t = 0; t < sizeof(type_flags) / sizeof(type_flags[0]); t++) {
            if (strcmp(a, type_flags[t]) == 0) {
                is_type = kg_ftype_from_name(a + 2, &o->ftype);
            }
        }
        if (is_type) {
            continue;
        }
        // every other option takes a value: "--flag VALUE" or "--flag=VALUE"
        char flag[64];
        const char *val;
        const char *eq = strchr(a, '=');
        if (eq && (size_t)(eq - a) < sizeof(flag)) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = '\0';
            val = eq + 1;
        } else {
            snprintf(flag, sizeof(flag), "%s", a);
            if (strncmp(a, "--", 2) != 0 || i + 1 >= argc) {
                val = NULL;
            } else {
                val = argv[++i];
            }
        }
        bool known = false, ok = val != NULL;
        for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
            if (strcmp(flag, ints[k].flag) == 0) {
                known = true;
                ok = ok && kg_cli_parse_i64(val, ints[k].min, ints[k].max,
                                            (int64_t *)((char *)o + ints[k].off));
                if (val && !ok) {
                    fprintf(stderr, "kgen mkmodel: %s: '%s' is not an integer in %lld..%lld\n",
                            flag, val, (long long)ints[k].min, (long long)ints[k].max);
                    return 2;
                }
            }
        }
        if (strcmp(flag, "--type") == 0) {
            known = true;
            if (val && !kg_ftype_from_name(val, &o->ftype)) {
                fprintf(stderr, "kgen mkmodel: --type: unknown type '%s' (one of: %s)\n", val,
                        kg_ftype_list());
                return 2;
            }
        } else if (strcmp(flag, "--out") == 0) {
            known = true;
            o->out = val;
            ok = ok && *val;
        } else if (strcmp(flag, "--name") == 0) {
            known = true;
            o->name = val;
        } else if (strcmp(flag, "--vocab-from") == 0) {
            known = true;
            o->vocab_from = val;
            ok = ok && *val;
        } else if (strcmp(flag, "--n-vocab") == 0) {
            known = true;
            uint64_t nv = 0;
            ok = ok && parse_u64(val, &nv) && nv >= 259 && nv <= 3000000;
            o->n_words = (int32_t)(nv - 259);
        } else if (strcmp(flag, "--seed") == 0) {
            known = true;
            o->have_seed = ok && parse_u64(val, &o->seed);
            if (val && !o->have_seed) {
                fprintf(stderr, "kgen mkmodel: --seed: '%s' is not an integer in 0..2^64-1\n", val);
                return 2;
            }
        } else if (strcmp(flag, "--rope-base") == 0) {
            known = true;
            ok = ok && kg_cli_parse_f32(val, 1.0f, 1e9f, &o->rope_base);
            if (val && !ok) {
                fprintf(stderr, "kgen mkmodel: --rope-base: '%s' is not a number in 1..1e9\n", val);
                return 2;
            }
        }
        if (!known) {
            fprintf(stderr, "kgen mkmodel: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kgen mkmodel: %s needs a value\n", flag);
            return 2;
        }
    }

    static const struct {
        const char *flag;
        size_t off;
    } required[] = {
        {"--n-embd", offsetof(mk_opts_t, n_embd)}, {"--n-layer", offsetof(mk_opts_t, n_layer)},
        {"--n-head", offsetof(mk_opts_t, n_head)}, {"--n-head-kv", offsetof(mk_opts_t, n_head_kv)},
        {"--n-ff", offsetof(mk_opts_t, n_ff)},
    };
    if (!o->out) {
        fprintf(stderr, "kgen mkmodel: --out FILE is required (see --help)\n");
        return 2;
    }
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
        if (*(int64_t *)((char *)o + required[k].off) == 0) {
            fprintf(stderr, "kgen mkmodel: %s is required (see --help)\n", required[k].flag);
            return 2;
        }
    }
    if (!o->have_seed) {
        fprintf(stderr, "kgen mkmodel: --seed S is required (see --help)\n");
        return 2;
    }
    if (o->n_head % o->n_head_kv != 0) {
        fprintf(stderr, "kgen mkmodel: --n-head %lld is not a multiple of --n-head-kv %lld\n",
                (long long)o->n_head, (long long)o->n_head_kv);
        return 2;
    }
    if (o->head_dim == 0) {
        if (o->n_embd % o->n_head != 0) {
            fprintf(stderr,
                    "kgen mkmodel: --n-embd %lld is not a multiple of --n-head %lld; "
                    "give --head-dim\n",
                    (long long)o->n_embd, (long long)o->n_head);
            return 2;
        }
        o->head_dim = o->n_embd / o->n_head;
    }
    if (o->head_dim % 2 != 0) {
        fprintf(stderr, "kgen mkmodel: head dim %lld must be even (RoPE rotates pairs)\n",
                (long long)o->head_dim);
        return 2;
    }
    /* the mixes fall back to 32-blocks where a row is not a multiple of 256, as
     * llama-quantize does; rows that fit no block of the chosen types are refused */
    int64_t blck = kg_type_is_quantized(kg_ftype_base_type(o->ftype)) ? 32 : 1;
    if (o->pure) {
        blck = kg_type_block_elems(kg_ftype_base_type(o->ftype));
    }
    if (o->n_embd % blck != 0 || (o->n_head * o->head_dim) % blck != 0 || o->n_ff % blck != 0) {
        fprintf(stderr,
                "kgen mkmodel: --type %s%s needs --n-embd, --n-ff and n_head * head_dim to be "
                "multiples of %lld\n",
                kg_ftype_name(o->ftype), o->pure ? " --pure" : "", (long long)blck);
        return 2;
    }
    return 0;
}

int kg_cmd_mkmodel(int argc, char **argv) {
    mk_opts_t o = {
        .name = "kgen-random", .ctx = 2048, .rope_base = 10000.0f, .type = KG_GGML_TYPE_F32};
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }

    char err[512];
    int64_t n_vocab = 0;
    if (kg_mkmodel_write(&o, &n_vocab, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        return 1;
    }
    int64_t hd = o.head_dim;
    int64_t per_layer = 2 * o.n_embd + o.n_embd * (o.n_head + 2 * o.n_head_kv) * hd +
                        o.n_head * hd * o.n_embd + 3 * o.n_embd * o.n_ff;
    int64_t params = n_vocab * o.n_embd * (o.tied ? 1 : 2) + o.n_embd + o.n_layer * per_layer;
    FILE *f = fopen(o.out, "rb");
    long bytes = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        bytes = ftell(f);
    }
    if (f) {
        fclose(f);
    }
    printf("kgen mkmodel: wrote %s: llama n_embd=%lld n_layer=%lld n_head=%lld n_head_kv=%lld "
           "head_dim=%lld n_ff=%lld n_vocab=%lld ctx=%lld rope_base=%g type=%s%s tied=%s "
           "seed=%llu params=%lld bytes=%ld\n",
           o.out, (long long)o.n_embd, (long long)o.n_layer, (long long)o.n_head,
           (long long)o.n_head_kv, (long long)hd, (long long)o.n_ff, (long long)n_vocab,
           (long long)o.ctx, (double)o.rope_base, kg_ftype_name(o.ftype), o.pure ? " (pure)" : "",
           o.tied ? "yes" : "no", (unsigned long long)o.seed, (long long)params, bytes);
    return 0;
}
