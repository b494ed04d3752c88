/* kg_model_mamba2: the Mamba-2 hybrids' layer kinds, sizes and tensors, read
 * as llama.cpp reads them (granite-hybrid.cpp, nemotron-h.cpp).
 *
 * granitehybrid (IBM Granite 4): a layer whose attention.head_count_kv
 * entry is 0 is a Mamba-2 mixer, the others attention; every layer then
 * has the SwiGLU FFN. nemotron_h (NVIDIA Nemotron-H): each layer is one
 * block: Mamba-2 where head_count_kv and feed_forward_length are both 0,
 * attention where only feed_forward_length is 0, else an MLP (squared
 * ReLU) with no mixer.
 *
 * A Mamba-2 layer: ssm_in (n_embd -> z | xBC | dt: d_inner, d_inner +
 * 2 n_group d_state, n_head), a causal depthwise convolution of length
 * d_conv over xBC (ssm_conv1d, F32, and its optional bias), then the
 * selective scan over n_head heads of d_inner / n_head channels with B and C
 * shared by the n_head / n_group heads of a group, ssm_a (A = -exp(A_log)),
 * ssm_d (the skip), ssm_dt.bias, the gated RMSNorm (ssm_norm, one norm per
 * group of d_inner / n_group channels) and ssm_out. Its state is the
 * convolution's last d_conv - 1 inputs and the d_state x d_inner SSM state. */
#include "kg_model_int.h"
#include "kg_quant.h"

#include <stdlib.h>

/* Key `key` as n per-layer integers: an array of n, or one value for
 * every layer. False when absent, malformed or negative. */
static bool layer_ints(const kg_gguf_t *g, const char *key, int32_t n, int32_t *out) {
    kg_gguf_type_t et;
    uint64_t len = 0;
    if (!kg_gguf_get_arr(g, key, &et, &len)) {
        int32_t v;
        if (!get_i32(g, key, &v)) {
            return false;
        }
        for (int32_t i = 0; i < n; i++) {
            out[i] = v;
        }
        return true;
    }
    if (len != (uint64_t)n || !kg_gguf_arr_i32(g, key, out, len)) {
        return false;
    }
    for (int32_t i = 0; i < n; i++) {
        if (out[i] < 0) {
            return false;
        }
    }
    return true;
}

/* The ssm.* sizes, checked as llama.cpp's graph asserts them (and bounded,
 * so a malformed file cannot ask for absurd states). */
static bool read_sizes(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    char key[128];
    static const char *const names[5] = {"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
                                         "ssm.time_step_rank", "ssm.group_count"};
    int32_t *const dst[5] = {&hp->ssm_d_conv, &hp->ssm_d_inner, &hp->ssm_d_state, &hp->ssm_dt_rank,
                             &hp->ssm_n_group};
    for (int i = 0; i < 5; i++) {
        if (!get_i32(g, akey(key, sizeof(key), arch, names[i]), dst[i]) || *dst[i] <= 0) {
            snprintf(errstr, errstr_size, "model: %s missing or not > 0", key);
            return false;
        }
    }
    const int32_t d_inner = hp->ssm_d_inner, n_head = hp->ssm_dt_rank, n_group = hp->ssm_n_group;
    const char *bad = NULL;
    if (hp->ssm_d_conv < 2 || hp->ssm_d_conv > 64) {
        bad = "ssm.conv_kernel must be in 2..64";
    } else if (hp->ssm_d_state > 1024 || d_inner > (1 << 20)) {
        bad = "ssm.state_size (at most 1024) or ssm.inner_size is implausibly large";
    } else if (d_inner % n_head != 0 || n_head % n_group != 0) {
        bad = "ssm.inner_size must be a multiple of ssm.time_step_rank (the heads), and that of "
              "ssm.group_count";
    } else if (hp->arch == KG_ARCH_GRANITEHYBRID && d_inner != 2 * hp->n_embd) {
        bad = "granitehybrid needs ssm.inner_size = 2 x embedding_length (as llama.cpp)";
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad %s hyperparameters: %s", arch, bad);
        return false;
    }
    return true;
}

bool kg_model_read_mamba2(const kg_gguf_t *g,
                          const char *arch,
                          kg_hparams_t *hp,
                          kg_layer_kind_t *kinds,
                          char *errstr,
                          size_t errstr_size) {
    const bool nemo = hp->arch == KG_ARCH_NEMOTRON_H || hp->arch == KG_ARCH_NEMOTRON_H_MOE;
    char kv_key[128], ff_key[128];
    akey(kv_key, sizeof(kv_key), arch, "attention.head_count_kv");
    akey(ff_key, sizeof(ff_key), arch, "feed_forward_length");
    if (!read_sizes(g, arch, hp, errstr, errstr_size)) {
        return false;
    }
    int32_t *kv = malloc((size_t)hp->n_layer * sizeof(*kv));
    int32_t *ff = malloc((size_t)hp->n_layer * sizeof(*ff));
    bool ok = kv && ff;
    if (!ok) {
        snprintf(errstr, errstr_size, "model: out of memory");
    } else if (!layer_ints(g, kv_key, hp->n_layer, kv) ||
               (nemo && !layer_ints(g, ff_key, hp->n_layer, ff))) {
        snprintf(errstr, errstr_size,
                 "model: %s%s%s must be an integer or an array of block_count (%d) "
                 "non-negative integers, 0 for a Mamba-2 layer",
                 kv_key, nemo ? " and " : "", nemo ? ff_key : "", hp->n_layer);
        ok = false;
    }
    int32_t n_kv = 0, n_ff = 0;
    for (int32_t il = 0; ok && il < hp->n_layer; il++) {
        const int32_t f = nemo ? ff[il] : 0;
        if (kv[il] == 0 && f == 0) {
            kinds[il] = KG_LAYER_MAMBA2;
            hp->n_layer_recurrent++;
        } else if (f > 0) { /* nemotron_h's MLP layer (its head_count_kv is not read) */
            kinds[il] = KG_LAYER_FFN;
            if (n_ff != 0 && f != n_ff) {
                /* llama.cpp allows per-layer widths; Nemotron-H's MLP layers
                 * share one, and kgen's buffers and hp->n_ff say one */
                snprintf(errstr, errstr_size, "model: %s: MLP layers of different widths (%d, %d)",
                         ff_key, n_ff, f);
                ok = false;
            }
            n_ff = f;
        } else if (n_kv != 0 && kv[il] != n_kv) {
            snprintf(errstr, errstr_size,
                     "model: %s: attention layers with different K/V head counts (%d, %d)", kv_key,
                     n_kv, kv[il]);
            ok = false;
        } else {
            n_kv = kv[il];
        }
    }
    free(kv);
    free(ff);
    if (!ok) {
        return false;
    }
    if (n_kv == 0 || (nemo && n_ff == 0)) {
        snprintf(errstr, errstr_size, "model: %s: no attention layer%s", arch,
                 nemo ? " or no MLP layer" : "");
        return false;
    }
    hp->n_head_kv = n_kv;
    if (nemo) {
        hp->n_ff = n_ff;
    }
    return true;
}

bool kg_model_mamba2_layer(kg_loader_t *ld, kg_model_t *model, int32_t il) {
    const kg_hparams_t *hp = &model->hp;
    kg_layer_weights_t *L = &model->layers[il];
    const int64_t E = hp->n_embd, DI = hp->ssm_d_inner, DS = hp->ssm_d_state;
    const int64_t H = hp->ssm_dt_rank, G = hp->ssm_n_group;
    const int64_t n_conv = DI + 2 * G * DS; /* the convolution's channels: x, B, C */
    bool bad = false;
    char name[96];
#define KG_T(suffix, ne0, ne1, opt)                                                                \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     kg_model_find(ld, name, (ne0), (ne1), (opt), &bad))
    L->ssm_in = KG_T("ssm_in.weight", E, 2 * DI + 2 * G * DS + H, false);
    L->ssm_conv1d = KG_T("ssm_conv1d.weight", hp->ssm_d_conv, n_conv, false);
    if (!bad && L->ssm_conv1d->type != KG_GGML_TYPE_F32) {
        /* ggml_ssm_conv reads F32 only; converters and llama-quantize keep it so */
        snprintf(ld->errstr, ld->errstr_size, "model: %s is %s; the convolution must be F32", name,
                 kg_ggml_type_name(L->ssm_conv1d->type));
        bad = true;
    }
    L->ssm_conv1d_b = KG_T("ssm_conv1d.bias", n_conv, 0, true);
    L->ssm_dt_b = KG_T("ssm_dt.bias", H, 0, false);
    L->ssm_a = KG_T("ssm_a", 1, H, false); /* no .weight suffix (llama.cpp's names) */
    L->ssm_d = KG_T("ssm_d", 1, H, false);
    L->ssm_norm = KG_T("ssm_norm.weight", DI / G, G, false);
    L->ssm_out = KG_T("ssm_out.weight", DI, E, false);
#undef KG_T
    /* the small vectors are read whole as floats: a block type cannot hold them */
    const kg_gguf_tensor_t *vecs[] = {L->ssm_conv1d_b, L->ssm_dt_b, L->ssm_a, L->ssm_d,
                                      L->ssm_norm};
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]) && !bad; i++) {
        if (vecs[i] && kg_type_block_elems(vecs[i]->type) != 1) {
            snprintf(ld->errstr, ld->errstr_size,
                     "model: blk.%d.%.*s is %s; Mamba-2's vectors must be F32, F16 or BF16",
                     (int)il, (int)vecs[i]->name.len, vecs[i]->name.data,
                     kg_ggml_type_name(vecs[i]->type));
            bad = true;
        }
    }
    return !bad;
}

int64_t kg_model_mamba2_state_floats(const kg_hparams_t *hp) {
    const int64_t n_conv = hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    return (int64_t)(hp->ssm_d_conv - 1) * n_conv + (int64_t)hp->ssm_d_state * hp->ssm_d_inner;
}
