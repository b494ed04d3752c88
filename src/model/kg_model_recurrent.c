/* kg_model_recurrent: the hybrid families' recurrent layers, read as
 * llama.cpp reads them: which layers are recurrent, the keys that size
 * them, their tensors, and the state each keeps per sequence.
 *
 * LFM2 (llama_model_lfm2): a layer whose attention.head_count_kv entry is
 * 0 is a gated short convolution (in_proj to B, C, x; a causal depthwise
 * convolution of length shortconv.l_cache over B * x; C times that;
 * out_proj), the others are attention with Q/K norms; every layer has the
 * SwiGLU FFN. Its state is the last l_cache - 1 inputs of the convolution.
 * LFM2-MoE (llama_model_lfm2moe, the same graph) has the same layers, its
 * FFNs experts after leading_dense_block_count dense ones.
 *
 * The Mamba-2 hybrids (granitehybrid, nemotron_h, nemotron_h_moe) are
 * kg_model_mamba2.c's.
 *
 * Qwen3.5 (llama_model_qwen35, qwen35moe): attention.recurrent_layers
 * (one flag per block) or, without it, full_attention_interval (default 4:
 * every fourth layer is attention) says which layers are gated DeltaNet.
 * Such a layer has attn_qkv (n_embd -> 2 K-heads x d_state + d_inner: q |
 * k | v, the conv channels), attn_gate (z, d_inner), the F32 kernel
 * ssm_conv1d (d_conv, channels), ssm_dt.bias and ssm_a (one per V head),
 * ssm_beta and ssm_alpha (n_embd -> V heads), ssm_norm (d_state) and
 * ssm_out (d_inner -> n_embd). Its state is the convolution's last
 * d_conv - 1 inputs of every channel and, per V head, the d_state x
 * d_state delta-rule matrix (llama.cpp: head_k_dim = head_v_dim =
 * d_state, d_inner = d_state x V heads, V heads a multiple of K heads).
 * Qwen3-Next (llama_model_qwen3next) has the same layers with ssm_ba in
 * place of ssm_beta and ssm_alpha (per K head, its V heads' betas, then
 * their alphas) and its V heads grouped by K head (V head h reads K head
 * h / (V heads / K heads); Qwen3.5's converter tiles them: h mod K heads).
 *
 * The backend keeps these states per sequence slot (kg_backend.h); the
 * attention layers use the paged KV cache as in every other family. */
#include "kg_model_int.h"
#include "kg_quant.h"

#include <stdlib.h>
#include <string.h>

/* Qwen3.5's layer kinds and DeltaNet sizes (llama_model_qwen35's
 * load_arch_hparams). */
static bool read_deltanet(const kg_gguf_t *g,
                          const char *arch,
                          kg_hparams_t *hp,
                          kg_layer_kind_t *kinds,
                          char *errstr,
                          size_t errstr_size) {
    char key[256];
    struct {
        const char *name;
        int32_t *v;
    } const req[] = {{"ssm.conv_kernel", &hp->ssm_d_conv},
                     {"ssm.inner_size", &hp->ssm_d_inner},
                     {"ssm.state_size", &hp->ssm_d_state},
                     {"ssm.time_step_rank", &hp->ssm_dt_rank},
                     {"ssm.group_count", &hp->ssm_n_group}};
    for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++) {
        if (!get_i32(g, akey(key, sizeof(key), arch, req[i].name), req[i].v) || *req[i].v <= 0 ||
            *req[i].v > (1 << 20)) {
            snprintf(errstr, errstr_size, "model: %s missing or outside 1..2^20", key);
            return false;
        }
    }
    /* qwen3next's files keep each K head's V heads together (its
     * converter does not reorder them to qwen35's tiled order) */
    hp->ssm_v_grouped = hp->arch == KG_ARCH_QWEN3NEXT;
    if (hp->ssm_d_conv < 2 || hp->ssm_d_conv > 64 || hp->ssm_d_state < 2 ||
        hp->ssm_d_state > 1024 || hp->ssm_dt_rank % hp->ssm_n_group != 0 ||
        (int64_t)hp->ssm_d_state * hp->ssm_dt_rank != hp->ssm_d_inner) {
        snprintf(errstr, errstr_size,
                 "model: bad %s.ssm.* sizes: conv_kernel %d (2..64), state_size %d (2..1024), "
                 "time_step_rank %d (V heads, a multiple of group_count %d), inner_size "
                 "%d (must be state_size x time_step_rank: a K head and a V head are both "
                 "state_size wide)",
                 arch, hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_dt_rank, hp->ssm_n_group,
                 hp->ssm_d_inner);
        return false;
    }
    /* attention.recurrent_layers: one bool (or integer) per block, the
     * next-token-prediction blocks included; else full_attention_interval */
    const uint64_t n_all = (uint64_t)hp->n_layer + (uint64_t)hp->n_layer_nextn;
    akey(key, sizeof(key), arch, "attention.recurrent_layers");
    const int64_t ki = kg_gguf_find_key(g, key);
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (ki >= 0) {
        size_t size = 0;
        const unsigned char *raw = kg_gguf_kv_raw(g, ki, &size);
        bool ok = kg_gguf_get_arr(g, key, &et, &n) && n == n_all;
        if (ok && et == KG_GGUF_TYPE_BOOL) { /* raw: element type, count, the bytes */
            ok = size >= 12 + n;
            for (int32_t il = 0; ok && il < hp->n_layer; il++) {
                kinds[il] = raw[12 + il] ? KG_LAYER_DELTANET : KG_LAYER_ATTN;
            }
        } else if (ok) {
            int32_t *flags = malloc((size_t)n * sizeof(*flags));
            ok = flags && kg_gguf_arr_i32(g, key, flags, n);
            for (int32_t il = 0; ok && il < hp->n_layer; il++) {
                kinds[il] = flags[il] ? KG_LAYER_DELTANET : KG_LAYER_ATTN;
            }
            free(flags);
        }
        if (!ok) {
            snprintf(errstr, errstr_size, "model: %s must be an array of block_count (%llu) flags",
                     key, (unsigned long long)n_all);
            return false;
        }
    } else {
        int32_t every = 4;
        get_i32(g, akey(key, sizeof(key), arch, "full_attention_interval"), &every);
        if (every < 1) {
            snprintf(errstr, errstr_size, "model: %s must be at least 1", key);
            return false;
        }
        for (int32_t il = 0; il < hp->n_layer; il++) {
            kinds[il] = (il + 1) % every != 0 ? KG_LAYER_DELTANET : KG_LAYER_ATTN;
        }
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        hp->n_layer_recurrent += kinds[il] == KG_LAYER_DELTANET;
    }
    if (hp->n_layer_recurrent == hp->n_layer) {
        /* a model of DeltaNet layers alone would run; kgen's K/V sizing
         * assumes an attention layer, and no Qwen3.5 file lacks one */
        snprintf(errstr, errstr_size, "model: %s: no attention layer", arch);
        return false;
    }
    return true;
}

bool kg_model_read_recurrent(const kg_gguf_t *g,
                             const char *arch,
                             kg_hparams_t *hp,
                             kg_layer_kind_t *kinds,
                             char *errstr,
                             size_t errstr_size) {
    char key[256];
    for (int32_t il = 0; il < hp->n_layer; il++) {
        kinds[il] = KG_LAYER_ATTN;
    }
    hp->n_layer_recurrent = 0;
    if (hp->arch == KG_ARCH_QWEN35 || hp->arch == KG_ARCH_QWEN35MOE ||
        hp->arch == KG_ARCH_QWEN3NEXT) {
        return read_deltanet(g, arch, hp, kinds, errstr, errstr_size);
    }
    if (hp->arch == KG_ARCH_GRANITEHYBRID || hp->arch == KG_ARCH_NEMOTRON_H ||
        hp->arch == KG_ARCH_NEMOTRON_H_MOE) {
        return kg_model_read_mamba2(g, arch, hp, kinds, errstr, errstr_size);
    }
    if (hp->arch != KG_ARCH_LFM2 && hp->arch != KG_ARCH_LFM2MOE) {
        return true;
    }
    /* LFM2: the short convolution's length, and head_count_kv per layer
     * (0: a convolution layer) */
    if (!get_i32(g, akey(key, sizeof(key), arch, "shortconv.l_cache"), &hp->shortconv_l_cache) ||
        hp->shortconv_l_cache < 2 || hp->shortconv_l_cache > 64) {
        snprintf(errstr, errstr_size, "model: %s missing or outside 2..64", key);
        return false;
    }
    akey(key, sizeof(key), arch, "attention.head_count_kv");
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (!kg_gguf_get_arr(g, key, &et, &n) || n != (uint64_t)hp->n_layer) {
        snprintf(errstr, errstr_size,
                 "model: %s must be an array of block_count (%d) values, 0 for a convolution "
                 "layer",
                 key, hp->n_layer);
        return false;
    }
    int32_t *kv = malloc((size_t)n * sizeof(*kv));
    if (!kv) {
        snprintf(errstr, errstr_size, "model: out of memory");
        return false;
    }
    if (!kg_gguf_arr_i32(g, key, kv, n)) {
        free(kv);
        snprintf(errstr, errstr_size, "model: %s must hold integers", key);
        return false;
    }
    int32_t n_kv = 0;
    bool ok = true;
    for (int32_t il = 0; il < hp->n_layer && ok; il++) {
        if (kv[il] == 0) {
            kinds[il] = KG_LAYER_SHORTCONV;
            hp->n_layer_recurrent++;
        } else if (kv[il] < 0 || (n_kv != 0 && kv[il] != n_kv)) {
            /* llama.cpp allows per-layer K/V heads; LFM2's attention layers
             * share one count, and kgen's buffers are sized by it */
            snprintf(errstr, errstr_size,
                     "model: %s: attention layers with different K/V head counts (%d, %d)", key,
                     n_kv, kv[il]);
            ok = false;
        } else {
            n_kv = kv[il];
        }
    }
    free(kv);
    if (!ok) {
        return false;
    }
    if (n_kv == 0) {
        snprintf(errstr, errstr_size, "model: %s: no attention layer", key);
        return false;
    }
    hp->n_head_kv = n_kv;
    return true;
}

bool kg_model_recurrent_layer(kg_loader_t *ld, kg_model_t *model, int32_t il) {
    const kg_hparams_t *hp = &model->hp;
    kg_layer_weights_t *L = &model->layers[il];
    const int64_t E = hp->n_embd;
    bool bad = false;
    char name[96];
#define KG_T(suffix, ne0, ne1)                                                                     \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     kg_model_find(ld, name, (ne0), (ne1), false, &bad))
    switch (L->kind) {
    case KG_LAYER_SHORTCONV:
        L->sc_in_proj = KG_T("shortconv.in_proj.weight", E, 3 * E);
        L->sc_conv = KG_T("shortconv.conv.weight", hp->shortconv_l_cache, E);
        if (!bad && L->sc_conv->type != KG_GGML_TYPE_F32) {
            /* ggml_ssm_conv reads F32 only; converters and llama-quantize
             * keep it so */
            snprintf(ld->errstr, ld->errstr_size, "model: %s is %s; the convolution must be F32",
                     name, kg_ggml_type_name(L->sc_conv->type));
            bad = true;
        }
        L->sc_out_proj = KG_T("shortconv.out_proj.weight", E, E);
        break;
    case KG_LAYER_DELTANET: {
        /* llama_model_qwen35::load_arch_tensors (qwen3next: ssm_ba for
         * ssm_beta and ssm_alpha) */
        const int64_t HV = hp->ssm_dt_rank, S = hp->ssm_d_state, VD = hp->ssm_d_inner;
        const int64_t CH = 2 * (int64_t)hp->ssm_n_group * S + VD;
        snprintf(name, sizeof(name), "blk.%d.ssm_in.weight", (int)il);
        if (kg_gguf_find_tensor(ld->g, name)) {
            /* llama.cpp still reads this older qwen3next layout (q, k, v, z
             * interleaved per K head); its converter now writes attn_qkv
             * and attn_gate */
            snprintf(ld->errstr, ld->errstr_size,
                     "model: %s: a qwen3next file from an older converter (fused q/k/v/z "
                     "projection); convert it again",
                     name);
            return false;
        }
        L->ssm_in = KG_T("attn_qkv.weight", E, CH);
        L->ssm_gate = KG_T("attn_gate.weight", E, VD);
        L->ssm_conv1d = KG_T("ssm_conv1d.weight", hp->ssm_d_conv, CH);
        if (!bad && L->ssm_conv1d->type != KG_GGML_TYPE_F32) {
            /* ggml_ssm_conv reads F32 only */
            snprintf(ld->errstr, ld->errstr_size, "model: %s is %s; the convolution must be F32",
                     name, kg_ggml_type_name(L->ssm_conv1d->type));
            bad = true;
        }
        L->ssm_dt_b = KG_T("ssm_dt.bias", HV, 0);
        L->ssm_a = KG_T("ssm_a", HV, 0);
        if (hp->arch == KG_ARCH_QWEN3NEXT) {
            L->ssm_ba = KG_T("ssm_ba.weight", E, 2 * HV);
        } else {
            L->ssm_beta = KG_T("ssm_beta.weight", E, HV);
            L->ssm_alpha = KG_T("ssm_alpha.weight", E, HV);
        }
        L->ssm_norm = KG_T("ssm_norm.weight", S, 0);
        L->ssm_out = KG_T("ssm_out.weight", VD, E);
        const kg_gguf_tensor_t *vecs[] = {L->ssm_dt_b, L->ssm_a, L->ssm_norm};
        for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]) && !bad; i++) {
            if (kg_type_block_elems(vecs[i]->type) != 1) {
                snprintf(ld->errstr, ld->errstr_size,
                         "model: blk.%d.%.*s is %s; it must be F32, F16 or BF16", (int)il,
                         (int)vecs[i]->name.len, vecs[i]->name.data,
                         kg_ggml_type_name(vecs[i]->type));
                bad = true;
            }
        }
        break;
    }
    case KG_LAYER_MAMBA2:
        bad = bad || !kg_model_mamba2_layer(ld, model, il);
        break;
    case KG_LAYER_ATTN:
    case KG_LAYER_FFN:
        break;
    }
#undef KG_T
    return !bad;
}

bool kg_model_is_recurrent(const kg_model_t *model) {
    return model->hp.n_layer_recurrent > 0;
}

int64_t kg_model_state_floats(const kg_model_t *model, int32_t il) {
    const kg_hparams_t *hp = &model->hp;
    switch (model->layers[il].kind) {
    case KG_LAYER_SHORTCONV:
        return (int64_t)(hp->shortconv_l_cache - 1) * hp->n_embd;
    case KG_LAYER_DELTANET: {
        /* the convolution's last d_conv - 1 inputs per channel, then one
         * d_state x d_state matrix per V head */
        const int64_t S = hp->ssm_d_state;
        const int64_t CH = 2 * (int64_t)hp->ssm_n_group * S + hp->ssm_d_inner;
        return (int64_t)(hp->ssm_d_conv - 1) * CH + S * S * hp->ssm_dt_rank;
    }
    case KG_LAYER_MAMBA2:
        return kg_model_mamba2_state_floats(hp);
    case KG_LAYER_ATTN:
    case KG_LAYER_FFN:
        break;
    }
    return 0;
}
