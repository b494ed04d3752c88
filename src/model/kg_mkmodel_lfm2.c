/* kg_mkmodel_lfm2: the LFM2 files `kgen mkmodel --arch lfm2` writes, what
 * convert_hf_to_gguf.py's LFM2Model writes: head_count_kv per layer (0 for
 * a convolution layer), shortconv.l_cache 3 (LFM2's L_cache), the final
 * norm under its converter name token_embd_norm; a convolution layer has
 * shortconv.in_proj (n_embd -> 3 n_embd: B, C, x), the F32 kernel
 * shortconv.conv (l_cache, n_embd) and shortconv.out_proj, an attention
 * layer Q/K/V/O with per-head Q/K norms; every layer a SwiGLU FFN.
 * Attention layers are every third, from the third (LFM2-350M has 6 of 16
 * at 2, 5, 8, 10, 12, 14), and the last layer when fewer than three. With
 * --sliding-window the attention layers are windowed (LFM2.5's). */
#include "kg_mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define L_CACHE 3

static bool is_attn(const kg_mkmodel_opts_t *o, int64_t il) {
    return o->n_layer < 3 ? il == o->n_layer - 1 : il % 3 == 2;
}

static float fan_in(int64_t n) {
    return sqrtf(3.0f / (float)n);
}

void kg_mkmodel_lfm2_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const int64_t n = o->n_layer;
    int32_t *kv = malloc((size_t)n * sizeof(int32_t));
    if (kv) { /* else the generic one stays and the file is refused at load */
        for (int64_t il = 0; il < n; il++) {
            kv[il] = is_attn(o, il) ? (int32_t)o->n_head_kv : 0;
        }
        kg_gguf_writer_set_arr(w, "lfm2.attention.head_count_kv", KG_GGUF_TYPE_INT32, kv,
                               (uint64_t)n);
        free(kv);
    }
    kg_gguf_writer_set_u32(w, "lfm2.shortconv.l_cache", L_CACHE);
    if (o->sliding_window > 0) {
        kg_gguf_writer_set_u32(w, "lfm2.attention.sliding_window", (uint32_t)o->sliding_window);
    }
}

bool kg_mkmodel_lfm2_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const int64_t E = o->n_embd, hd = o->head_dim, F = o->n_ff;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer), fe = fan_in(E);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
    for (int64_t l = 0; l < o->n_layer; l++) {
        const long long L = (long long)l;
        bool ok = KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.attn_norm.weight", L);
        if (is_attn(o, l)) {
            ok =
                ok && KG_ADD(wt, E, q_dim, 0.0f, fe, "blk.%lld.attn_q.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_k.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_v.weight", L) &&
                KG_ADD(f32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_q_norm.weight", L) &&
                KG_ADD(f32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_k_norm.weight", L) &&
                KG_ADD(wt, q_dim, E, 0.0f, fan_in(q_dim) * resid, "blk.%lld.attn_output.weight", L);
        } else {
            /* B and C near 1 in magnitude times x: a kernel of fan-in
             * L_CACHE keeps the convolution's output at x's scale */
            ok = ok && KG_ADD(wt, E, 3 * E, 0.0f, fe, "blk.%lld.shortconv.in_proj.weight", L) &&
                 KG_ADD(f32, L_CACHE, E, 0.0f, fan_in(L_CACHE), "blk.%lld.shortconv.conv.weight",
                        L) &&
                 KG_ADD(wt, E, E, 0.0f, fe * resid, "blk.%lld.shortconv.out_proj.weight", L);
        }
        ok = ok && KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.ffn_norm.weight", L) &&
             KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate.weight", L) &&
             KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L) &&
             KG_ADD(wt, F, E, 0.0f, fan_in(F) * resid, "blk.%lld.ffn_down.weight", L);
        if (!ok) {
            return false;
        }
    }
#undef KG_ADD
    return true;
}
