/* kg_mkmodel_args: `kgen mkmodel`'s flags -> a kg_mkmodel_opts_t, and the
 * line that reports the written model. The command (src/cli/cmd_mkmodel.c)
 * and the tests' in-process maker (kg_test_mkmodel) both go through here,
 * so a test's model is made by exactly the flags and checks a user's is.
 *
 * The checks are the command line's: each value's bounds, the required
 * flags, and the combinations a family does not have (an --n-rot below the
 * head width for llama, --n-expert without experts, the gemma-only
 * sliding-window keys, ...). kg_mkmodel_write trusts what passes here. */
#include "kg_mkmodel_args.h"

#include "../core/kg_parse.h"
#include "kg_mkmodel_int.h"
#include "kg_quant.h"
#include "kg_quant_mix.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- numbers ----

/* Integers and floats follow every program's strict rules (core/kg_parse); a seed is any
 * unsigned 64-bit number. */
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

/* A usage error: the message into errstr. */
__attribute__((format(printf, 3, 4))) static kg_mkmodel_args_t
bad(char *errstr, size_t errstr_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    // clang 14's valist checker misses the va_start just above (a known false positive)
    vsnprintf(errstr, errstr_size, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    return KG_MKMODEL_ARGS_INVALID;
}

// ---- the flags ----

kg_mkmodel_args_t kg_mkmodel_parse_args(
    int argc, char **argv, kg_mkmodel_opts_t *o, char *errstr, size_t errstr_size) {
    int64_t n_vocab = 0;
    static const struct {
        const char *flag;
        size_t off;
        int64_t min, max;
    } ints[] = {
        {"--n-embd", offsetof(kg_mkmodel_opts_t, n_embd), 1, 1 << 16},
        {"--n-layer", offsetof(kg_mkmodel_opts_t, n_layer), 1, 1024},
        {"--n-head", offsetof(kg_mkmodel_opts_t, n_head), 1, 1024},
        {"--n-head-kv", offsetof(kg_mkmodel_opts_t, n_head_kv), 1, 1024},
        {"--n-ff", offsetof(kg_mkmodel_opts_t, n_ff), 1, 1 << 20},
        {"--head-dim", offsetof(kg_mkmodel_opts_t, head_dim), 2, 1 << 12},
        {"--ctx", offsetof(kg_mkmodel_opts_t, ctx), 1, 1 << 24},
        {"--n-rot", offsetof(kg_mkmodel_opts_t, n_rot), 2, 1 << 12},
        {"--sliding-window", offsetof(kg_mkmodel_opts_t, sliding_window), 1, 1 << 24},
        {"--swa-pattern", offsetof(kg_mkmodel_opts_t, swa_pattern), 0, 1024},
        {"--rope-orig-ctx", offsetof(kg_mkmodel_opts_t, rope_orig_ctx), 1, 1 << 24},
        {"--n-expert", offsetof(kg_mkmodel_opts_t, n_expert), 1, 1024},
        {"--n-expert-used", offsetof(kg_mkmodel_opts_t, n_expert_used), 1, 1024},
        {"--n-ff-exp", offsetof(kg_mkmodel_opts_t, n_ff_exp), 1, 1 << 20},
        {"--n-expert-shared", offsetof(kg_mkmodel_opts_t, n_expert_shared), 0, 64},
        {"--n-dense-lead", offsetof(kg_mkmodel_opts_t, n_layer_dense), 0, 1024},
        {"--n-nextn", offsetof(kg_mkmodel_opts_t, n_nextn), 0, 4},
        {"--n-expert-groups", offsetof(kg_mkmodel_opts_t, n_expert_groups), 2, 64},
        {"--n-group-used", offsetof(kg_mkmodel_opts_t, n_group_used), 1, 63},
        {"--q-lora-rank", offsetof(kg_mkmodel_opts_t, q_lora_rank), 0, 1 << 16},
        {"--kv-lora-rank", offsetof(kg_mkmodel_opts_t, kv_lora_rank), 1, 4096},
        {"--v-head-dim", offsetof(kg_mkmodel_opts_t, v_head_dim), 1, 1024},
        {"--n-embd-per-layer", offsetof(kg_mkmodel_opts_t, n_embd_per_layer), 1, 4096},
        {"--n-kv-shared", offsetof(kg_mkmodel_opts_t, n_kv_shared), 1, 1024},
        {"--ssm-state", offsetof(kg_mkmodel_opts_t, ssm_state), 2, 1024},
        {"--ssm-groups", offsetof(kg_mkmodel_opts_t, ssm_groups), 1, 1024},
        {"--ssm-heads", offsetof(kg_mkmodel_opts_t, ssm_heads), 1, 1024},
        {"--attn-every", offsetof(kg_mkmodel_opts_t, attn_every), 1, 1024},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return KG_MKMODEL_ARGS_HELP;
        }
        if (strcmp(a, "--version") == 0) {
            return KG_MKMODEL_ARGS_VERSION;
        }
        if (strcmp(a, "--rerank") == 0) {
            o->rerank = true;
            continue;
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
                ok = ok && kg_parse_i64(val, ints[k].min, ints[k].max,
                                        (int64_t *)((char *)o + ints[k].off));
                if (val && !ok) {
                    return bad(errstr, errstr_size, "%s: '%s' is not an integer in %lld..%lld",
                               flag, val, (long long)ints[k].min, (long long)ints[k].max);
                }
            }
        }
        if (strcmp(flag, "--type") == 0) {
            known = true;
            if (val && !kg_ftype_from_name(val, &o->ftype)) {
                return bad(errstr, errstr_size, "--type: unknown type '%s' (one of: %s)", val,
                           kg_ftype_list());
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
                return bad(errstr, errstr_size, "--seed: '%s' is not an integer in 0..2^64-1", val);
            }
        } else if (strcmp(flag, "--rope-base") == 0) {
            known = true;
            ok = ok && kg_parse_f32(val, 1.0f, 1e9f, &o->rope_base);
            if (val && !ok) {
                return bad(errstr, errstr_size, "--rope-base: '%s' is not a number in 1..1e9", val);
            }
        } else if (strcmp(flag, "--arch") == 0) {
            known = true;
            o->arch = val;
            if (val && !kg_mkmodel_arch_is_known(val)) {
                return bad(errstr, errstr_size,
                           "--arch: unknown '%s' (known: " KG_MKMODEL_ARCHS ")", val);
            }
        } else if (strcmp(flag, "--pooling") == 0) {
            known = true;
            static const char *const pools[] = {"none", "mean", "cls", "last", "rank"};
            o->pooling = -2;
            for (int k = 0; val && k < 5; k++) {
                o->pooling = strcmp(val, pools[k]) == 0 ? k : o->pooling;
            }
            if (val && o->pooling < 0) {
                return bad(errstr, errstr_size,
                           "--pooling: unknown '%s' (known: none, mean, cls, last, rank)", val);
            }
        } else if (strcmp(flag, "--chat-template") == 0) {
            known = true;
            o->chat_template = val;
            const char *names;
            if (val && !kg_mkmodel_chat_template(val, &names)) {
                return bad(errstr, errstr_size, "--chat-template: unknown '%s' (known: %s)", val,
                           names);
            }
        } else if (strcmp(flag, "--chat-template-file") == 0) {
            known = true;
            o->chat_template_file = val;
            ok = ok && *val;
        } else if (strcmp(flag, "--rope-scaling") == 0) {
            known = true;
            o->rope_scaling = val;
            if (val && strcmp(val, "none") != 0 && strcmp(val, "linear") != 0 &&
                strcmp(val, "yarn") != 0 && strcmp(val, "longrope") != 0) {
                return bad(errstr, errstr_size,
                           "--rope-scaling: unknown '%s' (known: none, linear, yarn, "
                           "longrope)",
                           val);
            }
        } else {
            static const struct {
                const char *flag;
                size_t off;
                float min, max;
            } floats[] = {
                {"--rope-base-swa", offsetof(kg_mkmodel_opts_t, rope_base_swa), 1.0f, 1e9f},
                {"--rope-factor", offsetof(kg_mkmodel_opts_t, rope_factor), 1.0f, 1e6f},
                {"--attn-softcap", offsetof(kg_mkmodel_opts_t, attn_softcap), 0.01f, 1e6f},
                {"--final-softcap", offsetof(kg_mkmodel_opts_t, final_softcap), 0.01f, 1e6f},
            };
            for (size_t k = 0; k < sizeof(floats) / sizeof(floats[0]); k++) {
                if (strcmp(flag, floats[k].flag) == 0) {
                    known = true;
                    ok = ok && kg_parse_f32(val, floats[k].min, floats[k].max,
                                            (float *)((char *)o + floats[k].off));
                    if (val && !ok) {
                        return bad(errstr, errstr_size, "%s: '%s' is not a number in %g..%g", flag,
                                   val, (double)floats[k].min, (double)floats[k].max);
                    }
                }
            }
        }
        if (!known) {
            return bad(errstr, errstr_size, "unknown option '%s' (see --help)", a);
        }
        if (!ok) {
            return bad(errstr, errstr_size, "%s needs a value", flag);
        }
    }

    static const struct {
        const char *flag;
        size_t off;
    } required[] = {
        {"--n-embd", offsetof(kg_mkmodel_opts_t, n_embd)},
        {"--n-layer", offsetof(kg_mkmodel_opts_t, n_layer)},
        {"--n-head", offsetof(kg_mkmodel_opts_t, n_head)},
        {"--n-head-kv", offsetof(kg_mkmodel_opts_t, n_head_kv)},
        {"--n-ff", offsetof(kg_mkmodel_opts_t, n_ff)},
    };
    if (!o->out) {
        return bad(errstr, errstr_size, "--out FILE is required (see --help)");
    }
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
        if (*(int64_t *)((char *)o + required[k].off) == 0) {
            return bad(errstr, errstr_size, "%s is required (see --help)", required[k].flag);
        }
    }
    if (!o->have_seed) {
        return bad(errstr, errstr_size, "--seed S is required (see --help)");
    }
    if (o->n_head % o->n_head_kv != 0) {
        return bad(errstr, errstr_size, "--n-head %lld is not a multiple of --n-head-kv %lld",
                   (long long)o->n_head, (long long)o->n_head_kv);
    }
    if (o->head_dim == 0) {
        if (o->n_embd % o->n_head != 0) {
            return bad(errstr, errstr_size,
                       "--n-embd %lld is not a multiple of --n-head %lld; "
                       "give --head-dim",
                       (long long)o->n_embd, (long long)o->n_head);
        }
        o->head_dim = o->n_embd / o->n_head;
    }
    if (o->head_dim % 2 != 0) {
        return bad(errstr, errstr_size, "head dim %lld must be even (RoPE rotates pairs)",
                   (long long)o->head_dim);
    }
    const char *arch = o->arch ? o->arch : "llama";
    const bool gemma4 = strcmp(arch, "gemma4") == 0;
    const bool gemma = strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0 || gemma4 ||
                       strcmp(arch, "gemma-embedding") == 0;
    if (!gemma4 && (o->n_embd_per_layer > 0 || o->n_kv_shared > 0)) {
        return bad(errstr, errstr_size, "--n-embd-per-layer and --n-kv-shared are for gemma4");
    }
    if (gemma4 && o->n_rot > 0) {
        return bad(errstr, errstr_size,
                   "gemma4 rotates its windowed layers' whole head and a quarter of its global "
                   "layers' (proportional RoPE): no --n-rot");
    }
    const bool phi3 = strcmp(arch, "phi3") == 0, oss = strcmp(arch, "gpt-oss") == 0;
    const bool ds2 = strcmp(arch, "deepseek2") == 0;
    const bool glm = strcmp(arch, "glm4moe") == 0;
    const bool qwen35 = strcmp(arch, "qwen35") == 0 || strcmp(arch, "qwen35moe") == 0 ||
                        strcmp(arch, "qwen3next") == 0;
    /* gemma4, granitehybrid: the MoE variants (26B-A4B; 4.0-H Tiny, Small) when --n-expert
     * asks for experts */
    const bool granite_h = strcmp(arch, "granitehybrid") == 0;
    const bool moe = oss || glm || ds2 || strcmp(arch, "qwen3moe") == 0 ||
                     strcmp(arch, "mixtral") == 0 || ((gemma4 || granite_h) && o->n_expert > 0) ||
                     strcmp(arch, "qwen35moe") == 0 || strcmp(arch, "qwen3next") == 0 ||
                     strcmp(arch, "nemotron_h_moe") == 0 || strcmp(arch, "llama4") == 0 ||
                     strcmp(arch, "lfm2moe") == 0;
    const bool dense_lead_ok = ds2 || strcmp(arch, "lfm2moe") == 0;
    if (!glm &&
        (o->n_nextn >= 0 || (o->n_layer_dense >= 0 && !dense_lead_ok) ||
         (!ds2 && (o->n_expert_shared >= 0 || o->n_expert_groups > 0 || o->n_group_used > 0)))) {
        return bad(errstr, errstr_size,
                   "--n-expert-shared, --n-dense-lead, --n-nextn, --n-expert-groups and "
                   "--n-group-used are for glm4moe (deepseek2: all but --n-nextn; lfm2moe: "
                   "--n-dense-lead)");
    }
    if (!qwen35 &&
        (o->ssm_state > 0 || o->ssm_groups > 0 || o->ssm_heads > 0 || o->attn_every > 0)) {
        return bad(errstr, errstr_size,
                   "--ssm-state, --ssm-groups, --ssm-heads and --attn-every are for qwen35, "
                   "qwen35moe and qwen3next");
    }
    if (qwen35 && (o->ssm_heads > 0 ? o->ssm_heads : o->n_head) %
                          (o->ssm_groups > 0 ? o->ssm_groups : o->n_head_kv) !=
                      0) {
        return bad(errstr, errstr_size,
                   "%s: the DeltaNet V heads (--ssm-heads, default --n-head) must be a multiple "
                   "of its K heads (--ssm-groups, default --n-head-kv)",
                   arch);
    }
    if (!ds2 && (o->q_lora_rank >= 0 || o->kv_lora_rank > 0 || o->v_head_dim > 0)) {
        return bad(errstr, errstr_size,
                   "--q-lora-rank, --kv-lora-rank and --v-head-dim are for deepseek2");
    }
    if (ds2 && (o->n_head_kv != 1 || (o->n_rot > 0 && o->n_rot >= o->head_dim))) {
        return bad(errstr, errstr_size,
                   "deepseek2: --n-head-kv must be 1 (MLA's one latent head) and --n-rot below "
                   "--head-dim (a head's nope + rope dims)");
    }
    if ((o->n_expert_groups > 0) != (o->n_group_used > 0)) {
        return bad(errstr, errstr_size, "--n-expert-groups and --n-group-used come together");
    }
    if (o->n_rot > 0 &&
        (o->n_rot % 2 != 0 || o->n_rot > o->head_dim ||
         (!gemma && !phi3 && !glm && !ds2 && !qwen35 && strcmp(arch, "qwen2") != 0 &&
          strcmp(arch, "qwen3") != 0 && o->n_rot != o->head_dim))) {
        return bad(errstr, errstr_size,
                   "--n-rot %lld must be even and at most the head width %lld (%s: "
                   "equal)",
                   (long long)o->n_rot, (long long)o->head_dim, arch);
    }
    const bool olmo2 = strcmp(arch, "olmo2") == 0, lfm2 = strcmp(arch, "lfm2") == 0;
    if ((o->sliding_window > 0 && !gemma && !phi3 && !oss && !olmo2 && !lfm2) ||
        (o->swa_pattern >= 0 && !gemma) || (o->rope_base_swa > 0.0f && !gemma)) {
        return bad(errstr, errstr_size,
                   "--sliding-window, --swa-pattern and --rope-base-swa are "
                   "for gemma2, gemma3 and gemma4, and gemma-embedding (phi3, gpt-oss, olmo2, "
                   "lfm2: --sliding-window only)");
    }
    if (!moe && (o->n_expert > 0 || o->n_expert_used > 0 || o->n_ff_exp > 0 ||
                 o->ftype == KG_FTYPE_MOSTLY_MXFP4_MOE)) {
        return bad(errstr, errstr_size,
                   "--n-expert, --n-expert-used, --n-ff-exp and --mxfp4_moe "
                   "are for qwen3moe, mixtral, gpt-oss, glm4moe, deepseek2, qwen35moe, "
                   "qwen3next, nemotron_h_moe, lfm2moe and llama4, and gemma4 and granitehybrid "
                   "with --n-expert");
    }
    if ((strcmp(arch, "bert") == 0 || strcmp(arch, "nomic-bert") == 0) &&
        (o->n_head_kv != o->n_head || o->head_dim * o->n_head != o->n_embd)) {
        return bad(errstr, errstr_size,
                   "%s: --n-head-kv must equal --n-head, and --n-embd be --n-head x the head "
                   "width",
                   arch);
    }
    if (o->rerank && strcmp(arch, "qwen3") != 0 && strcmp(arch, "bert") != 0) {
        return bad(errstr, errstr_size,
                   "--rerank is for qwen3 (a Qwen3-Reranker head) and bert (a classification "
                   "head)");
    }
    if (o->n_ff_exp > 0 && strcmp(arch, "mixtral") == 0) {
        return bad(errstr, errstr_size, "mixtral has no --n-ff-exp: --n-ff is each expert's width");
    }
    if ((o->attn_softcap > 0.0f && strcmp(arch, "gemma2") != 0) ||
        (o->final_softcap > 0.0f && !gemma)) {
        return bad(errstr, errstr_size,
                   "--attn-softcap is for gemma2, --final-softcap for gemma2, "
                   "gemma3 and gemma4");
    }
    if (o->rope_scaling && strcmp(o->rope_scaling, "longrope") == 0 &&
        (!phi3 || o->rope_orig_ctx <= 0 || o->rope_orig_ctx >= o->ctx)) {
        return bad(errstr, errstr_size,
                   "--rope-scaling longrope needs --arch phi3 and "
                   "--rope-orig-ctx below --ctx");
    }
    if (o->rope_scaling &&
        (strcmp(o->rope_scaling, "linear") == 0 || strcmp(o->rope_scaling, "yarn") == 0) &&
        o->rope_factor <= 0.0f) {
        return bad(errstr, errstr_size, "--rope-scaling %s needs --rope-factor", o->rope_scaling);
    }
    if (o->chat_template && o->chat_template_file) {
        return bad(errstr, errstr_size, "--chat-template and --chat-template-file: one of them");
    }
    if (n_vocab > 0) {
        const int64_t base = kg_mkmodel_builtin_vocab_size(arch);
        if (o->vocab_from || n_vocab < base) {
            return bad(errstr, errstr_size,
                       "--n-vocab %lld: the built-in %s vocabulary has %lld tokens "
                       "(at least that many; not with --vocab-from)",
                       (long long)n_vocab, arch, (long long)base);
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
        return bad(errstr, errstr_size,
                   "--type %s%s needs --n-embd, --n-ff and n_head * head_dim to be "
                   "multiples of %lld",
                   kg_ftype_name(o->ftype), o->pure ? " --pure" : "", (long long)blck);
    }
    return KG_MKMODEL_ARGS_OK;
}

// ---- the report ----

void kg_mkmodel_summary(const kg_mkmodel_opts_t *o, int64_t n_vocab, char *buf, size_t size) {
    int64_t hd = o->head_dim;
    const bool gemma_embd = strcmp(o->arch, "gemma-embedding") == 0;
    const bool tied = o->tied || strcmp(o->arch, "gemma2") == 0 || gemma_embd;
    const bool moe = strcmp(o->arch, "qwen3moe") == 0 || strcmp(o->arch, "mixtral") == 0 ||
                     strcmp(o->arch, "gpt-oss") == 0 || strcmp(o->arch, "glm4moe") == 0 ||
                     strcmp(o->arch, "deepseek2") == 0 || strcmp(o->arch, "qwen35moe") == 0 ||
                     strcmp(o->arch, "qwen3next") == 0 || strcmp(o->arch, "llama4") == 0 ||
                     strcmp(o->arch, "lfm2moe") == 0 ||
                     (strcmp(o->arch, "granitehybrid") == 0 && o->n_expert > 0);
    const int64_t n_exp = o->n_expert > 0 ? o->n_expert : 8;
    const int64_t ff_exp = o->n_ff_exp > 0 ? o->n_ff_exp : o->n_ff;
    /* the FFN's weights: dense, or the router and every expert */
    const int64_t ffn =
        moe ? o->n_embd * n_exp + 3 * o->n_embd * ff_exp * n_exp : 3 * o->n_embd * o->n_ff;
    int64_t per_layer = 2 * o->n_embd + o->n_embd * (o->n_head + 2 * o->n_head_kv) * hd +
                        o->n_head * hd * o->n_embd + ffn;
    int64_t params = n_vocab * o->n_embd * (tied ? 1 : 2) + o->n_embd + o->n_layer * per_layer;
    params += gemma_embd ? 8 * o->n_embd * o->n_embd : 0; /* the dense projections */
    FILE *f = fopen(o->out, "rb");
    long bytes = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        bytes = ftell(f);
    }
    if (f) {
        fclose(f);
    }
    snprintf(buf, size,
             "wrote %s: %s n_embd=%lld n_layer=%lld n_head=%lld n_head_kv=%lld "
             "head_dim=%lld n_ff=%lld n_vocab=%lld ctx=%lld rope_base=%g type=%s%s tied=%s "
             "seed=%llu params=%lld bytes=%ld",
             o->out, o->arch, (long long)o->n_embd, (long long)o->n_layer, (long long)o->n_head,
             (long long)o->n_head_kv, (long long)hd, (long long)o->n_ff, (long long)n_vocab,
             (long long)o->ctx, (double)o->rope_base, kg_ftype_name(o->ftype),
             o->pure ? " (pure)" : "", tied ? "yes" : "no", (unsigned long long)o->seed,
             (long long)params, bytes);
}

// ---- --chat-template-file ----

char *kg_mkmodel_read_template(const char *path, char *errstr, size_t errstr_size) {
    enum { MAX_TEMPLATE = 1 << 20 };
    FILE *f = fopen(path, "rb");
    char *text = f ? malloc(MAX_TEMPLATE + 1) : NULL;
    size_t n = text ? fread(text, 1, MAX_TEMPLATE + 1, f) : 0;
    bool ok = text && !ferror(f) && n > 0 && n <= MAX_TEMPLATE && !memchr(text, '\0', n);
    if (!ok) {
        snprintf(errstr, errstr_size, "--chat-template-file %s: %s", path,
                 !f                 ? strerror(errno)
                 : !text            ? "out of memory"
                 : n == 0           ? "empty or unreadable"
                 : n > MAX_TEMPLATE ? "over 1 MiB"
                                    : "not text (a NUL byte)");
        free(text);
        text = NULL;
    } else {
        text[n] = '\0';
    }
    if (f) {
        fclose(f);
    }
    return text;
}
