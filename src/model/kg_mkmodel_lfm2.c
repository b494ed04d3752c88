/* kg_mkmodel_lfm2: the LFM2 files `kgen mkmodel --arch lfm2` writes, what
 * convert_hf_to_gguf.py's LFM2Model writes: head_count_kv per layer (0 for
 * a convolution layer), shortconv.l_cache 3 (LFM2's L_cache), the final
 * norm under its converter name token_embd_norm; a convolution layer has
 * shortconv.in_proj (n_embd -> 3 n_embd: B, C, x), the F32 kernel
 * shortconv.conv (l_cache, n_embd) and shortconv.out_proj, an attention
 * layer Q/K/V/O with per-head Q/K norms; every layer a SwiGLU FFN.
 * Attention layers are every third, from the third (LFM2-350M has 6 of 16
 * at 2, 5, 8, 10, 12, 14), and the last layer when fewer than three. With
 * --sliding-window the attention layers are windowed (LFM2.5's).
 *
 * lfm2moe (LFM2-8B-A1B, LFM2MoeModel): the same layers, the FFN of each
 * after the --n-dense-lead dense ones (leading_dense_block_count, default
 * 1; the 8B has 2) experts: the F32 router ffn_gate_inp, its F32 selection
 * bias exp_probs_b (the expert_bias the converter writes), ffn_gate_exps,
 * ffn_up_exps and ffn_down_exps; expert_gating_func 2 (sigmoid), the
 * experts' width in expert_feed_forward_length. */
#include "kg_mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L_CACHE 3

static bool is_attn(const kg_mkmodel_opts_t *o, int64_t il) {
    return o->n_layer < 3 ? il == o->n_layer - 1 : il % 3 == 2;
}

static float fan_in(int64_t n) {
    return sqrtf(3.0f / (float)n);
}

static bool is_moe(const kg_mkmodel_opts_t *o) {
    return strcmp(o->arch, "lfm2moe") == 0;
}

const char *kg_mkmodel_lfm2_check(const kg_mkmodel_opts_t *o) {
    if (is_moe(o) && (o->n_expert_shared >= 0 || o->n_nextn >= 0 || o->n_expert_groups > 0 ||
                      o->n_layer_dense > o->n_layer)) {
        return "lfm2moe: no shared experts, nextn blocks or expert groups, and at most --n-layer "
               "leading dense layers";
    }
    return NULL;
}

void kg_mkmodel_lfm2_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const int64_t n = o->n_layer;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, o->arch), key)
    int32_t *kv = malloc((size_t)n * sizeof(int32_t));
    if (kv) { /* else the generic one stays and the file is refused at load */
        for (int64_t il = 0; il < n; il++) {
            kv[il] = is_attn(o, il) ? (int32_t)o->n_head_kv : 0;
        }
        kg_gguf_writer_set_arr(w, KEY("attention.head_count_kv"), KG_GGUF_TYPE_INT32, kv,
                               (uint64_t)n);
        free(kv);
    }
    kg_gguf_writer_set_u32(w, KEY("shortconv.l_cache"), L_CACHE);
    if (o->sliding_window > 0) {
        kg_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)o->sliding_window);
    }
    if (is_moe(o)) {
        kg_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)o->n_layer_dense);
        kg_gguf_writer_set_u32(w, KEY("expert_gating_func"), 2);
    }
#undef KEY
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
        ok = ok && KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.ffn_norm.weight", L);
        if (is_moe(o) && l >= o->n_layer_dense) {
            /* the router F32 (llama-quantize keeps it so), its logits
             * unit-variance; the selection bias large enough to change
             * which experts win */
            const int64_t X = o->n_expert, FX = o->n_ff_exp;
            const kg_ggml_type_t xt = o->has_expert_type ? o->expert_type : wt;
            ok = ok && KG_ADD(f32, E, X, 0.0f, fe, "blk.%lld.ffn_gate_inp.weight", L) &&
                 KG_ADD(f32, X, 1, 0.0f, 0.3f, "blk.%lld.exp_probs_b.bias", L);
            snprintf(name, sizeof(name), "blk.%lld.ffn_gate_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, E, FX, X, fe);
            snprintf(name, sizeof(name), "blk.%lld.ffn_down_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, FX, E, X, fan_in(FX) * resid);
            snprintf(name, sizeof(name), "blk.%lld.ffn_up_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, E, FX, X, fe);
        } else {
            ok = ok && KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L) &&
                 KG_ADD(wt, F, E, 0.0f, fan_in(F) * resid, "blk.%lld.ffn_down.weight", L);
        }
        if (!ok) {
            return false;
        }
    }
#undef KG_ADD
    return true;
}
