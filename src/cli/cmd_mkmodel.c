/* cmd_mkmodel: `kgen mkmodel`, a random-weight model of any supported
 * family (llama, qwen2, qwen3, gemma2, gemma3, phi3, and the mixtures of
 * experts qwen3moe, mixtral, gpt-oss) and shape.
 *
 * The file is what llama.cpp's converter would write for that family: its
 * <arch>.* hyperparameter keys, a tokenizer, and tensors with llama.cpp's
 * names and ggml shapes (ne[0] is the input dimension); see kg_mkmodel.c.
 * Norm weights and biases stay F32, as llama.cpp keeps 1-D tensors; every
 * 2-D weight takes the chosen type.
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
            "Write a random-weight model (GGUF v3) of a supported family that llama.cpp and\n"
            "kgen load, with the tensors and keys llama.cpp's converter writes for it.\n"
            "The same arguments always give the same bytes.\n"
            "\n"
            "  --out FILE          the GGUF file to write\n"
            "  --arch A            llama (default), qwen2, qwen3, gemma2, gemma3, phi3, or the\n"
            "                      mixtures of experts qwen3moe, mixtral (llama with experts)\n"
            "                      and gpt-oss\n"
            "  --n-embd N          embedding width\n"
            "  --n-layer L         number of blocks\n"
            "  --n-head H          query heads\n"
            "  --n-head-kv K       key/value heads (H must be a multiple of K)\n"
            "  --n-ff F            feed-forward width (the gated FFN's gate and up; mixtral:\n"
            "                      each expert's)\n"
            "  --seed S            weight seed (0 .. 2^64-1)\n"
            "  --head-dim D        head width (default N / H; even, for RoPE)\n"
            "  --rope-base B       RoPE frequency base (default 10000)\n"
            "  --ctx C             <arch>.context_length (default 2048)\n"
            "  --tied              no output.weight: the head reuses token_embd (gemma2: always)\n"
            "  --type T            weight types as llama-quantize's type T writes them (default\n"
            "                      f32; norms, biases and the expert router stay f32): f32,\n"
            "                      f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m,\n"
            "                      q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs\n"
            "                      (q3_k, q4_k, q5_k: the _m mixes), mxfp4_moe (experts MXFP4,\n"
            "                      the rest q8_0: the form gpt-oss ships in). The mixes give\n"
            "                      some tensors more bits (output q6_k, attn_v and ffn_down of\n"
            "                      some layers; 8-expert models attn_k/attn_v q8_0) and fall\n"
            "                      back to 32-blocks where a row is not a multiple of 256,\n"
            "                      exactly as llama-quantize does\n"
            "  --pure              every 2-D weight in T's base type (llama-quantize --pure)\n"
            "  --f16 | --bf16 | --q8_0 | --q4_0 | --mxfp4_moe\n"
            "                      short for --type f16 (bf16, q8_0, q4_0, mxfp4_moe)\n");
    fprintf(
        f, "  --n-expert N        qwen3moe, mixtral, gpt-oss: expert_count (default 8)\n"
           "  --n-expert-used K   experts per token, expert_used_count (default 2)\n"
           "  --n-ff-exp F        qwen3moe, gpt-oss: each expert's width (default --n-ff)\n"
           "  --vocab-from FILE   copy every tokenizer.* key of FILE (n_vocab: its token count);\n"
           "                      default: the family's built-in vocabulary (llama: 259-token\n"
           "                      SentencePiece bytes; qwen: byte-level BPE, pre qwen2; gemma,\n"
           "                      phi3: SentencePiece pieces; see the README)\n"
           "  --n-vocab N         built-in vocabulary of N tokens (at least the built-in size):\n"
           "                      made-up words fill the rest (benchmarks at a real model's size)\n"
           "  --chat-template T   tokenizer.chat_template: chatml, llama2, llama3, gemma, phi3,\n"
           "                      phi4 or mistral-v7 (the family's real Jinja text)\n"
           "  --n-rot R           rope.dimension_count (llama, phi3; phi3 may rotate part of a\n"
           "                      head; default the head width)\n"
           "  --sliding-window W  gemma2, gemma3, gpt-oss: the local layers' window (default\n"
           "                      4096, 512, 128); phi3 writes the key, which llama.cpp ignores\n"
           "  --swa-pattern N     gemma: attention.sliding_window_pattern (every layer il with\n"
           "                      il %% N < N - 1 is local; 0: all; default: not written, so\n"
           "                      llama.cpp's 2 for gemma2, 6 for gemma3)\n"
           "  --rope-base-swa B   gemma: rope.freq_base_swa, the local layers' RoPE base\n"
           "  --rope-scaling S    none, linear, yarn (with --rope-factor; yarn also\n"
           "                      --rope-orig-ctx) or longrope (phi3: LongRoPE factor tensors\n"
           "                      and attn_factor for --ctx over --rope-orig-ctx)\n"
           "  --rope-factor F     rope.scaling.factor\n"
           "  --rope-orig-ctx N   rope.scaling.original_context_length\n"
           "  --attn-softcap C    gemma2: attn_logit_softcapping (default 50)\n"
           "  --final-softcap C   gemma2, gemma3: final_logit_softcapping (gemma2 default 30)\n"
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
    int64_t n_vocab = 0;
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
        {"--n-rot", offsetof(mk_opts_t, n_rot), 2, 1 << 12},
        {"--sliding-window", offsetof(mk_opts_t, sliding_window), 1, 1 << 24},
        {"--swa-pattern", offsetof(mk_opts_t, swa_pattern), 0, 1024},
        {"--rope-orig-ctx", offsetof(mk_opts_t, rope_orig_ctx), 1, 1 << 24},
        {"--n-expert", offsetof(mk_opts_t, n_expert), 1, 1024},
        {"--n-expert-used", offsetof(mk_opts_t, n_expert_used), 1, 1024},
        {"--n-ff-exp", offsetof(mk_opts_t, n_ff_exp), 1, 1 << 20},
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
        if (strcmp(a, "--mxfp4_moe") == 0) {
            is_type = kg_ftype_from_name("mxfp4_moe", &o->ftype);
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
            ok = ok && parse_u64(val, &nv) && nv >= 1 && nv <= 3000000;
            n_vocab = (int64_t)nv; /* the built-in size depends on --arch: checked below */
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
        } else if (strcmp(flag, "--arch") == 0) {
            known = true;
            o->arch = val;
            if (val && !kg_mkmodel_arch_is_known(val)) {
                fprintf(stderr,
                        "kgen mkmodel: --arch: unknown '%s' (known: llama, qwen2, qwen3, gemma2, "
                        "gemma3, phi3, qwen3moe, mixtral, gpt-oss)\n",
                        val);
                return 2;
            }
        } else if (strcmp(flag, "--chat-template") == 0) {
            known = true;
            o->chat_template = val;
            const char *names;
            if (val && !kg_mkmodel_chat_template(val, &names)) {
                fprintf(stderr, "kgen mkmodel: --chat-template: unknown '%s' (known: %s)\n", val,
                        names);
                return 2;
            }
        } else if (strcmp(flag, "--rope-scaling") == 0) {
            known = true;
            o->rope_scaling = val;
            if (val && strcmp(val, "none") != 0 && strcmp(val, "linear") != 0 &&
                strcmp(val, "yarn") != 0 && strcmp(val, "longrope") != 0) {
                fprintf(stderr,
                        "kgen mkmodel: --rope-scaling: unknown '%s' (known: none, linear, yarn, "
                        "longrope)\n",
                        val);
                return 2;
            }
        } else {
            static const struct {
                const char *flag;
                size_t off;
                float min, max;
            } floats[] = {
                {"--rope-base-swa", offsetof(mk_opts_t, rope_base_swa), 1.0f, 1e9f},
                {"--rope-factor", offsetof(mk_opts_t, rope_factor), 1.0f, 1e6f},
                {"--attn-softcap", offsetof(mk_opts_t, attn_softcap), 0.01f, 1e6f},
                {"--final-softcap", offsetof(mk_opts_t, final_softcap), 0.01f, 1e6f},
            };
            for (size_t k = 0; k < sizeof(floats) / sizeof(floats[0]); k++) {
                if (strcmp(flag, floats[k].flag) == 0) {
                    known = true;
                    ok = ok && kg_cli_parse_f32(val, floats[k].min, floats[k].max,
                                                (float *)((char *)o + floats[k].off));
                    if (val && !ok) {
                        fprintf(stderr, "kgen mkmodel: %s: '%s' is not a number in %g..%g\n", flag,
                                val, (double)floats[k].min, (double)floats[k].max);
                        return 2;
                    }
                }
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
    const char *arch = o->arch ? o->arch : "llama";
    const bool gemma = strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0;
    const bool phi3 = strcmp(arch, "phi3") == 0, oss = strcmp(arch, "gpt-oss") == 0;
    const bool moe = oss || strcmp(arch, "qwen3moe") == 0 || strcmp(arch, "mixtral") == 0;
    if (o->n_rot > 0 && (o->n_rot % 2 != 0 || o->n_rot > o->head_dim ||
                         ((strcmp(arch, "llama") == 0 || moe) && o->n_rot != o->head_dim))) {
        fprintf(stderr,
                "kgen mkmodel: --n-rot %lld must be even and at most the head width %lld (%s: "
                "equal)\n",
                (long long)o->n_rot, (long long)o->head_dim, moe ? arch : "llama");
        return 2;
    }
    if ((o->sliding_window > 0 && !gemma && !phi3 && !oss) || (o->swa_pattern >= 0 && !gemma) ||
        (o->rope_base_swa > 0.0f && !gemma)) {
        fprintf(stderr, "kgen mkmodel: --sliding-window, --swa-pattern and --rope-base-swa are "
                        "for gemma2 and gemma3 (phi3, gpt-oss: --sliding-window only)\n");
        return 2;
    }
    if (!moe && (o->n_expert > 0 || o->n_expert_used > 0 || o->n_ff_exp > 0 ||
                 o->ftype == KG_FTYPE_MOSTLY_MXFP4_MOE)) {
        fprintf(stderr, "kgen mkmodel: --n-expert, --n-expert-used, --n-ff-exp and --mxfp4_moe "
                        "are for qwen3moe, mixtral and gpt-oss\n");
        return 2;
    }
    if (o->n_ff_exp > 0 && strcmp(arch, "mixtral") == 0) {
        fprintf(stderr, "kgen mkmodel: mixtral has no --n-ff-exp: --n-ff is each expert's width\n");
        return 2;
    }
    if ((o->attn_softcap > 0.0f && strcmp(arch, "gemma2") != 0) ||
        (o->final_softcap > 0.0f && !gemma)) {
        fprintf(stderr, "kgen mkmodel: --attn-softcap is for gemma2, --final-softcap for gemma2 "
                        "and gemma3\n");
        return 2;
    }
    if (o->rope_scaling && strcmp(o->rope_scaling, "longrope") == 0 &&
        (!phi3 || o->rope_orig_ctx <= 0 || o->rope_orig_ctx >= o->ctx)) {
        fprintf(stderr, "kgen mkmodel: --rope-scaling longrope needs --arch phi3 and "
                        "--rope-orig-ctx below --ctx\n");
        return 2;
    }
    if (o->rope_scaling &&
        (strcmp(o->rope_scaling, "linear") == 0 || strcmp(o->rope_scaling, "yarn") == 0) &&
        o->rope_factor <= 0.0f) {
        fprintf(stderr, "kgen mkmodel: --rope-scaling %s needs --rope-factor\n", o->rope_scaling);
        return 2;
    }
    if (n_vocab > 0) {
        const int64_t base = kg_mkmodel_builtin_vocab_size(arch);
        if (o->vocab_from || n_vocab < base) {
            fprintf(stderr,
                    "kgen mkmodel: --n-vocab %lld: the built-in %s vocabulary has %lld tokens "
                    "(at least that many; not with --vocab-from)\n",
                    (long long)n_vocab, arch, (long long)base);
            return 2;
        }
        o->n_words = (int32_t)(n_vocab - base);
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
    mk_opts_t o = kg_mkmodel_opts_default();
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
    const bool tied = o.tied || strcmp(o.arch, "gemma2") == 0;
    const bool moe = strcmp(o.arch, "qwen3moe") == 0 || strcmp(o.arch, "mixtral") == 0 ||
                     strcmp(o.arch, "gpt-oss") == 0;
    const int64_t n_exp = o.n_expert > 0 ? o.n_expert : 8;
    const int64_t ff_exp = o.n_ff_exp > 0 ? o.n_ff_exp : o.n_ff;
    /* the FFN's weights: dense, or the router and every expert */
    const int64_t ffn =
        moe ? o.n_embd * n_exp + 3 * o.n_embd * ff_exp * n_exp : 3 * o.n_embd * o.n_ff;
    int64_t per_layer = 2 * o.n_embd + o.n_embd * (o.n_head + 2 * o.n_head_kv) * hd +
                        o.n_head * hd * o.n_embd + ffn;
    int64_t params = n_vocab * o.n_embd * (tied ? 1 : 2) + o.n_embd + o.n_layer * per_layer;
    FILE *f = fopen(o.out, "rb");
    long bytes = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        bytes = ftell(f);
    }
    if (f) {
        fclose(f);
    }
    printf("kgen mkmodel: wrote %s: %s n_embd=%lld n_layer=%lld n_head=%lld n_head_kv=%lld "
           "head_dim=%lld n_ff=%lld n_vocab=%lld ctx=%lld rope_base=%g type=%s%s tied=%s "
           "seed=%llu params=%lld bytes=%ld\n",
           o.out, o.arch, (long long)o.n_embd, (long long)o.n_layer, (long long)o.n_head,
           (long long)o.n_head_kv, (long long)hd, (long long)o.n_ff, (long long)n_vocab,
           (long long)o.ctx, (double)o.rope_base, kg_ftype_name(o.ftype), o.pure ? " (pure)" : "",
           tied ? "yes" : "no", (unsigned long long)o.seed, (long long)params, bytes);
    return 0;
}
