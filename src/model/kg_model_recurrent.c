/* kg_model_recurrent: the hybrid families' recurrent layers, read as
 * llama.cpp reads them: which layers are recurrent, the keys that size
 * them, their tensors, and the state each keeps per sequence.
 *
 * LFM2 (llama_model_lfm2): a layer whose attention.head_count_kv entry is
 * 0 is a gated short convolution (in_proj to B, C, x; a causal depthwise
 * convolution of length shortconv.l_cache over B * x; C times that;
 * out_proj), the others are attention with Q/K norms; every layer has the
 * SwiGLU FFN. Its state is the last l_cache - 1 inputs of the convolution.
 *
 * The backend keeps these states per sequence slot (kg_backend.h); the
 * attention layers use the paged KV cache as in every other family. */
#include "kg_model_int.h"

#include <stdlib.h>

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
    if (hp->arch != KG_ARCH_LFM2) {
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
    case KG_LAYER_DELTANET: /* not read yet: the loader assigns no such layer */
    case KG_LAYER_MAMBA2:
    case KG_LAYER_ATTN:
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
    case KG_LAYER_DELTANET: /* not read yet: the loader assigns no such layer */
    case KG_LAYER_MAMBA2:
    case KG_LAYER_ATTN:
        break;
    }
    return 0;
}
