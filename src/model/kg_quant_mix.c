/* kg_quant_mix: the per-tensor type policy of llama.cpp's file types.
 *
 * The rules are llama-quant.cpp's llama_tensor_get_type for the file types
 * kgen writes (the ones that need no importance matrix), with the rules of
 * 8-expert models (attn_k and attn_v in Q8_0, attn_output in Q5_K for the
 * low-bit mixes); the IQ1/IQ2/IQ3 mixes are left out because kgen writes
 * none. Expert tensors (blk.N.ffn_*_exps, one per layer) follow the rules
 * of their dense names, as in llama.cpp. Falcon's exceptions are kept
 * because they only depend on the architecture name. */
#include "kg_quant_mix.h"

#include "kg_quant.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    kg_ftype_t ftype;
    kg_ggml_type_t base;
} ftypes[] = {
    {"f32", KG_FTYPE_ALL_F32, KG_GGML_TYPE_F32},
    {"f16", KG_FTYPE_MOSTLY_F16, KG_GGML_TYPE_F16},
    {"bf16", KG_FTYPE_MOSTLY_BF16, KG_GGML_TYPE_BF16},
    {"q8_0", KG_FTYPE_MOSTLY_Q8_0, KG_GGML_TYPE_Q8_0},
    {"q4_0", KG_FTYPE_MOSTLY_Q4_0, KG_GGML_TYPE_Q4_0},
    {"q4_1", KG_FTYPE_MOSTLY_Q4_1, KG_GGML_TYPE_Q4_1},
    {"q5_0", KG_FTYPE_MOSTLY_Q5_0, KG_GGML_TYPE_Q5_0},
    {"q5_1", KG_FTYPE_MOSTLY_Q5_1, KG_GGML_TYPE_Q5_1},
    {"q2_k", KG_FTYPE_MOSTLY_Q2_K, KG_GGML_TYPE_Q2_K},
    {"q3_k_s", KG_FTYPE_MOSTLY_Q3_K_S, KG_GGML_TYPE_Q3_K},
    {"q3_k_m", KG_FTYPE_MOSTLY_Q3_K_M, KG_GGML_TYPE_Q3_K},
    {"q3_k_l", KG_FTYPE_MOSTLY_Q3_K_L, KG_GGML_TYPE_Q3_K},
    {"q4_k_s", KG_FTYPE_MOSTLY_Q4_K_S, KG_GGML_TYPE_Q4_K},
    {"q4_k_m", KG_FTYPE_MOSTLY_Q4_K_M, KG_GGML_TYPE_Q4_K},
    {"q5_k_s", KG_FTYPE_MOSTLY_Q5_K_S, KG_GGML_TYPE_Q5_K},
    {"q5_k_m", KG_FTYPE_MOSTLY_Q5_K_M, KG_GGML_TYPE_Q5_K},
    {"q6_k", KG_FTYPE_MOSTLY_Q6_K, KG_GGML_TYPE_Q6_K},
    {"iq4_nl", KG_FTYPE_MOSTLY_IQ4_NL, KG_GGML_TYPE_IQ4_NL},
    {"iq4_xs", KG_FTYPE_MOSTLY_IQ4_XS, KG_GGML_TYPE_IQ4_XS},
    {"mxfp4_moe", KG_FTYPE_MOSTLY_MXFP4_MOE, KG_GGML_TYPE_Q8_0},
    /* llama-quantize's aliases */
    {"q3_k", KG_FTYPE_MOSTLY_Q3_K_M, KG_GGML_TYPE_Q3_K},
    {"q4_k", KG_FTYPE_MOSTLY_Q4_K_M, KG_GGML_TYPE_Q4_K},
    {"q5_k", KG_FTYPE_MOSTLY_Q5_K_M, KG_GGML_TYPE_Q5_K},
};

#define N_FTYPES (sizeof(ftypes) / sizeof(ftypes[0]))

static bool eq_nocase(const char *a, const char *b) {
    while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b)) {
        a++, b++;
    }
    return *a == '\0' && *b == '\0';
}

bool kg_ftype_from_name(const char *name, kg_ftype_t *out) {
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (eq_nocase(ftypes[i].name, name)) {
            *out = ftypes[i].ftype;
            return true;
        }
    }
    return false;
}

const char *kg_ftype_name(kg_ftype_t ftype) {
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (ftypes[i].ftype == ftype) {
            return ftypes[i].name; /* the first entry is the canonical name */
        }
    }
    return "unknown";
}

const char *kg_ftype_list(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m (q3_k), q3_k_l, "
           "q4_k_s, q4_k_m (q4_k), q5_k_s, q5_k_m (q5_k), q6_k, iq4_nl, iq4_xs, mxfp4_moe";
}

kg_ggml_type_t kg_ftype_base_type(kg_ftype_t ftype) {
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (ftypes[i].ftype == ftype) {
            return ftypes[i].base;
        }
    }
    return KG_GGML_TYPE_F32;
}

// ---- the policy ----

static bool has(const char *name, const char *part) {
    return strstr(name, part) != NULL;
}

/* Whether llama-quantize quantizes this tensor at all. */
static bool is_quantizable(const char *name, int n_dims) {
    const size_t len = strlen(name);
    if (len < 6 || strcmp(name + len - 6, "weight") != 0 || n_dims < 2) {
        return false;
    }
    static const char *const never[] = {
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ssm_conv1d.weight",
        "shortconv.conv.weight",
        "time_mix_first.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
    };
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        if (has(name, never[i])) {
            return false;
        }
    }
    return strcmp(name, "position_embd.weight") != 0 && strcmp(name, "token_types.weight") != 0;
}

/* Layers that get more bits in the _M mixes: the first and last eighth,
 * and every third layer in between. */
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The layer number of "blk.N...", or -1 (as sscanf "blk.%d" read it, but
 * out-of-range numbers are -1 too). */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) {
        return -1;
    }
    char *end;
    errno = 0;
    long il = strtol(name + 4, &end, 10);
    if (end == name + 4 || errno != 0 || il < INT_MIN || il > INT_MAX) {
        return -1;
    }
    return (int)il;
}

/* llama_model's LLM_TYPE_70B for the architectures that have one. */
static bool is_70b(const kg_quant_mix_model_t *m) {
    if (m->n_layer != 80) {
        return false;
    }
    if (strcmp(m->arch, "llama") == 0) {
        return m->n_head != m->n_head_kv; /* equal heads: LLaMA-1 65B */
    }
    return strcmp(m->arch, "qwen2") == 0;
}

static kg_ggml_type_t mix_type(
    kg_ftype_t ft, const kg_quant_mix_model_t *m, const char *name, int64_t ne0, kg_ggml_type_t t) {
    const bool falcon = strcmp(m->arch, "falcon") == 0;
    const int n_gqa = m->n_head_kv > 0 ? m->n_head / m->n_head_kv : 1;
    const int n = m->n_layer, i = layer_of(name);
    if (strcmp(name, "output.weight") == 0 ||
        (!m->has_output && strcmp(name, "token_embd.weight") == 0)) {
        /* the head (or the embedding that doubles as it) */
        if (falcon || ne0 % kg_type_block_elems(t) != 0) {
            t = KG_GGML_TYPE_Q8_0;
        } else if (t != KG_GGML_TYPE_Q8_0) {
            t = KG_GGML_TYPE_Q6_K;
        }
        // The empty branches claim a tensor so that no later substring test
        // takes it; merging them would reorder the chain away from llama.cpp's.
        // NOLINTNEXTLINE(bugprone-branch-clone)
    } else if (strcmp(name, "token_embd.weight") == 0) {
        /* only the IQ1/IQ2/IQ3 and TQ mixes change it */
    } else if (has(name, "attn_v.weight")) {
        if (ft == KG_FTYPE_MOSTLY_Q2_K) {
            t = n_gqa >= 4 ? KG_GGML_TYPE_Q4_K : KG_GGML_TYPE_Q3_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q3_K_M) {
            t = i < 2 ? KG_GGML_TYPE_Q5_K : KG_GGML_TYPE_Q4_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q3_K_L ||
                   ((ft == KG_FTYPE_MOSTLY_IQ4_NL || ft == KG_FTYPE_MOSTLY_IQ4_XS) && n_gqa >= 4) ||
                   (ft == KG_FTYPE_MOSTLY_Q4_K_S && i < 4)) {
            t = KG_GGML_TYPE_Q5_K;
        } else if ((ft == KG_FTYPE_MOSTLY_Q4_K_M || ft == KG_FTYPE_MOSTLY_Q5_K_M) &&
                   use_more_bits(i, n)) {
            t = KG_GGML_TYPE_Q6_K;
        }
        if (is_70b(m) && (t == KG_GGML_TYPE_Q3_K || t == KG_GGML_TYPE_Q4_K)) {
            /* 8 query heads share each V head there: more bits cost little */
            t = KG_GGML_TYPE_Q5_K;
        }
        if (m->n_expert == 8) {
            t = KG_GGML_TYPE_Q8_0; /* "trades just ~128MB" */
        }
    } else if (has(name, "attn_k.weight")) {
        if (m->n_expert == 8) {
            t = KG_GGML_TYPE_Q8_0;
        }
    } else if (has(name, "attn_q.weight")) {
        /* only the IQ3 mixes change it */
    } else if (has(name, "ffn_down")) {
        if (ft == KG_FTYPE_MOSTLY_Q2_K) {
            t = KG_GGML_TYPE_Q3_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q3_K_M) {
            t = i < n / 16                       ? KG_GGML_TYPE_Q5_K
                : !falcon || use_more_bits(i, n) ? KG_GGML_TYPE_Q4_K
                                                 : KG_GGML_TYPE_Q3_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q3_K_L) {
            t = falcon ? KG_GGML_TYPE_Q4_K : KG_GGML_TYPE_Q5_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q4_K_M) {
            if (falcon) {
                t = i < n / 16            ? KG_GGML_TYPE_Q6_K
                    : use_more_bits(i, n) ? KG_GGML_TYPE_Q5_K
                                          : KG_GGML_TYPE_Q4_K;
            } else if (use_more_bits(i, n)) {
                t = KG_GGML_TYPE_Q6_K;
            }
        } else if (i < n / 8 && (ft == KG_FTYPE_MOSTLY_IQ4_NL || ft == KG_FTYPE_MOSTLY_IQ4_XS ||
                                 (ft == KG_FTYPE_MOSTLY_Q4_K_S && !falcon))) {
            t = KG_GGML_TYPE_Q5_K; /* IQ4: without an importance matrix */
        } else if (ft == KG_FTYPE_MOSTLY_Q5_K_M && use_more_bits(i, n)) {
            t = KG_GGML_TYPE_Q6_K;
        }
    } else if (has(name, "attn_output.weight")) {
        if (!falcon && m->n_expert == 8) {
            if (ft == KG_FTYPE_MOSTLY_Q2_K || ft == KG_FTYPE_MOSTLY_Q3_K_S ||
                ft == KG_FTYPE_MOSTLY_Q3_K_M || ft == KG_FTYPE_MOSTLY_IQ4_NL ||
                ft == KG_FTYPE_MOSTLY_Q4_K_S || ft == KG_FTYPE_MOSTLY_Q4_K_M ||
                ft == KG_FTYPE_MOSTLY_IQ4_XS) {
                t = KG_GGML_TYPE_Q5_K;
            }
        } else if (!falcon) {
            if (ft == KG_FTYPE_MOSTLY_Q2_K) {
                t = KG_GGML_TYPE_Q3_K;
            } else if (ft == KG_FTYPE_MOSTLY_Q3_K_M) {
                t = KG_GGML_TYPE_Q4_K;
            } else if (ft == KG_FTYPE_MOSTLY_Q3_K_L) {
                t = KG_GGML_TYPE_Q5_K;
            }
        } else if (ft == KG_FTYPE_MOSTLY_Q3_K_L) {
            t = KG_GGML_TYPE_Q4_K;
        }
    } else if (has(name, "attn_qkv.weight")) {
        if (ft == KG_FTYPE_MOSTLY_Q3_K_M || ft == KG_FTYPE_MOSTLY_Q3_K_L) {
            t = KG_GGML_TYPE_Q4_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q4_K_M) {
            t = KG_GGML_TYPE_Q5_K;
        } else if (ft == KG_FTYPE_MOSTLY_Q5_K_M) {
            t = KG_GGML_TYPE_Q6_K;
        }
    }
    /* rows that are not a multiple of the block: the nearest block-32 type */
    if (ne0 % kg_type_block_elems(t) != 0) {
        switch (t) {
        case KG_GGML_TYPE_Q2_K:
        case KG_GGML_TYPE_Q3_K:
        case KG_GGML_TYPE_IQ4_XS:
            t = KG_GGML_TYPE_IQ4_NL;
            break;
        case KG_GGML_TYPE_Q4_K:
            t = KG_GGML_TYPE_Q5_0;
            break;
        case KG_GGML_TYPE_Q5_K:
            t = KG_GGML_TYPE_Q5_1;
            break;
        case KG_GGML_TYPE_Q6_K:
            t = KG_GGML_TYPE_Q8_0;
            break;
        default:
            return t; /* llama-quantize refuses such a tensor; so does the caller */
        }
        if (ne0 % kg_type_block_elems(t) != 0) {
            t = KG_GGML_TYPE_F16;
        }
    }
    return t;
}

kg_ggml_type_t kg_quant_mix_type(kg_ftype_t ftype,
                                 bool pure,
                                 const kg_quant_mix_model_t *m,
                                 const char *name,
                                 int n_dims,
                                 int64_t ne0,
                                 kg_ggml_type_t src_type) {
    if (!is_quantizable(name, n_dims)) {
        return src_type;
    }
    const kg_ggml_type_t base = kg_ftype_base_type(ftype);
    if (ftype == KG_FTYPE_MOSTLY_MXFP4_MOE) {
        /* llama-quantize's MXFP4_MOE: the 3-D expert stacks MXFP4, the rest Q8_0 */
        return n_dims == 3 ? KG_GGML_TYPE_MXFP4 : KG_GGML_TYPE_Q8_0;
    }
    if (pure || !kg_type_is_quantized(base)) {
        return base;
    }
    return mix_type(ftype, m, name, ne0, base);
}
