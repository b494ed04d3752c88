/* kg_device_plan: a model's weights in a backend's memory (see the header). */
#include "kg_device_plan.h"

#include "../model/kg_quant.h"

#include <stdlib.h>
#include <string.h>

bool kg_device_plan_native(kg_ggml_type_t type, int64_t n_in) {
    int64_t block = 0;
    switch (type) {
    case KG_GGML_TYPE_Q8_0:
    case KG_GGML_TYPE_Q4_0:
    case KG_GGML_TYPE_IQ4_NL:
    case KG_GGML_TYPE_MXFP4:
        block = 32;
        break;
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K:
    case KG_GGML_TYPE_Q6_K:
    case KG_GGML_TYPE_IQ4_XS:
        block = 256;
        break;
    default:
        return false;
    }
    return n_in > 0 && n_in % block == 0;
}

static bool name_ends(const kg_gguf_tensor_t *t, const char *suffix) {
    const size_t n = strlen(suffix);
    return t->name.len >= n && memcmp(t->name.data + t->name.len - n, suffix, n) == 0;
}

uint64_t kg_device_plan_tensor(const kg_gguf_tensor_t *t, int flags, bool *kept) {
    int64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        n *= t->ne[d];
    }
    if (kept) {
        *kept = false;
    }
    if (name_ends(t, "layer_output_scale.weight")) {
        return 0; /* Gemma 4's per-layer scalar: kept on the host */
    }
    if (t->n_dims < 2) {
        return (uint64_t)n * 4; /* norms, biases, rope factors: F32 */
    }
    /* read element by element, so never blocks: the routers (upload_mat),
     * deepseek2's per-head latent matrices (mla.cu), an encoder's embeddings
     * (bert.cu) */
    const bool elements = name_ends(t, "ffn_gate_inp.weight") || name_ends(t, "attn_k_b.weight") ||
                          name_ends(t, "attn_v_b.weight") ||
                          ((flags & KG_PLAN_ENCODER) && name_ends(t, "token_embd.weight"));
    if ((flags & KG_PLAN_NATIVE) && !elements && kg_device_plan_native(t->type, t->ne[0])) {
        if (kept) {
            *kept = true;
        }
        return (uint64_t)kg_type_row_size(t->type, t->ne[0]) * (uint64_t)(n / t->ne[0]);
    }
    return (uint64_t)n * (t->type == KG_GGML_TYPE_F32 ? 4 : 2);
}

/* Whether the table has a tensor named like t but with `suffix` for t's
 * last `len` characters ("blk.3.attn_k.weight" -> "blk.3.attn_v.weight"). */
static bool has_sibling(const kg_gguf_tensor_t *const *t,
                        int64_t n,
                        const kg_gguf_tensor_t *of,
                        size_t len,
                        const char *suffix) {
    const size_t stem = of->name.len - len, sl = strlen(suffix);
    for (int64_t i = 0; i < n; i++) {
        if (t[i]->name.len == stem + sl && memcmp(t[i]->name.data, of->name.data, stem) == 0 &&
            memcmp(t[i]->name.data + stem, suffix, sl) == 0) {
            return true;
        }
    }
    return false;
}

void kg_device_plan_tensors(const kg_gguf_tensor_t *const *t,
                            int64_t n,
                            int flags,
                            kg_device_plan_t *out) {
    memset(out, 0, sizeof(*out));
    for (int64_t i = 0; i < n; i++) {
        bool kept;
        uint64_t b = kg_device_plan_tensor(t[i], flags, &kept);
        /* a layer whose values are its keys (Gemma 4's global layers: no
         * attn_v) holds K's rows twice in its fused Q|K|V */
        if (name_ends(t[i], "attn_k.weight") &&
            !has_sibling(t, n, t[i], strlen("attn_k.weight"), "attn_v.weight")) {
            b *= 2;
        }
        int64_t elems = 1;
        for (uint32_t d = 0; d < t[i]->n_dims; d++) {
            elems *= t[i]->ne[d];
        }
        out->file_bytes +=
            kg_type_row_size(t[i]->type, t[i]->ne[0]) * (uint64_t)(elems / t[i]->ne[0]);
        out->weight_bytes += b;
        out->kept_bytes += kept ? b : 0;
        out->n_params += elems;
    }
}

bool kg_device_plan_model(const kg_model_t *m, bool native, kg_device_plan_t *out) {
    const int64_t n = kg_gguf_n_tensors(m->gguf);
    const kg_gguf_tensor_t **t = calloc(n > 0 ? (size_t)n : 1, sizeof(const kg_gguf_tensor_t *));
    memset(out, 0, sizeof(*out));
    if (!t) {
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        t[i] = kg_gguf_tensor(m->gguf, i);
    }
    const int flags = (native ? KG_PLAN_NATIVE : 0) | (m->bert ? KG_PLAN_ENCODER : 0);
    kg_device_plan_tensors(t, n, flags, out);
    free(t);
    return true;
}
