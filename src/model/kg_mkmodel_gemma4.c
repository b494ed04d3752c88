/* kg_mkmodel_gemma4: the Gemma 4 files `kgen mkmodel --arch gemma4` writes,
 * what convert_hf_to_gguf.py's Gemma4Model writes: the sliding-window
 * flags per layer (every swa_pattern-th layer global), the windowed layers'
 * head (--head-dim) and the global layers' twice as wide with half the K/V
 * heads (the 31B's 256 / 512 and 16 / 4), the global layers' proportional
 * RoPE as rope_freqs (a quarter of the pairs rotate, the rest have divisor
 * 1e30) and no V projection (attention_k_eq_v: V is K's), per-layer
 * inputs (E2B/E4B: per_layer_token_embd, per_layer_model_proj and each
 * layer's inp_gate, proj and post_norm) with --n-embd-per-layer, and with
 * --n-kv-shared the last layers without K/V of their own, whose FFNs are
 * twice as wide (use_double_wide_mlp: feed_forward_length per layer).
 * Every layer has a layer_output_scale. With --n-expert, every layer is
 * a mixture-of-experts layer as in the 26B-A4B (Gemma4Model's converter):
 * the dense MLP stays beside a router (ffn_gate_inp and its .scale), the
 * experts' merged gate and up (ffn_gate_up_exps, from experts.gate_up_proj),
 * their down and per-expert output scale (ffn_down_exps.scale, from the
 * router's per_expert_scale), and the norms pre_ffw_norm_2,
 * post_ffw_norm_1 and post_ffw_norm_2. */
#include "kg_mkmodel_int.h"
#include "kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Gemma 3's default period: five windowed layers, then a global one */
static int64_t period(const kg_mkmodel_opts_t *o) {
    return o->swa_pattern >= 0 ? o->swa_pattern : 6;
}

static bool is_swa(const kg_mkmodel_opts_t *o, int64_t il) {
    const int64_t n = period(o);
    return n == 0 || il % n < n - 1;
}

static int64_t head_dim(const kg_mkmodel_opts_t *o, int64_t il) {
    return is_swa(o, il) ? o->head_dim : 2 * o->head_dim;
}

static int64_t head_kv(const kg_mkmodel_opts_t *o, int64_t il) {
    return is_swa(o, il) || o->n_head_kv < 2 ? o->n_head_kv : o->n_head_kv / 2;
}

static bool shared_kv(const kg_mkmodel_opts_t *o, int64_t il) {
    return il >= o->n_layer - o->n_kv_shared;
}

static int64_t ffn_width(const kg_mkmodel_opts_t *o, int64_t il) {
    return shared_kv(o, il) ? 2 * o->n_ff : o->n_ff;
}

const char *kg_mkmodel_gemma4_check(const kg_mkmodel_opts_t *o) {
    const int64_t kv = o->n_layer - o->n_kv_shared;
    if (o->n_kv_shared > 0 && (kv < 2 || is_swa(o, kv - 1) || !is_swa(o, kv - 2))) {
        return "gemma4: --n-kv-shared must leave a windowed and then a global layer just "
               "before the shared ones (llama.cpp reuses those two)";
    }
    if (o->n_layer > 1024) {
        return "gemma4: at most 1024 layers";
    }
    return NULL;
}

void kg_mkmodel_gemma4_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const int64_t n = o->n_layer;
    bool *swa = malloc((size_t)n * sizeof(bool));
    uint32_t *kvh = malloc((size_t)n * sizeof(uint32_t));
    uint32_t *ff = malloc((size_t)n * sizeof(uint32_t));
    if (swa && kvh && ff) {
        for (int64_t il = 0; il < n; il++) {
            swa[il] = is_swa(o, il);
            kvh[il] = (uint32_t)head_kv(o, il);
            ff[il] = (uint32_t)ffn_width(o, il);
        }
        kg_gguf_writer_set_arr(w, "gemma4.attention.sliding_window_pattern", KG_GGUF_TYPE_BOOL, swa,
                               (uint64_t)n);
        kg_gguf_writer_set_arr(w, "gemma4.attention.head_count_kv", KG_GGUF_TYPE_UINT32, kvh,
                               (uint64_t)n);
        if (o->n_kv_shared > 0) {
            kg_gguf_writer_set_arr(w, "gemma4.feed_forward_length", KG_GGUF_TYPE_UINT32, ff,
                                   (uint64_t)n);
        }
    }
    free(swa);
    free(kvh);
    free(ff);
    kg_gguf_writer_set_u32(w, "gemma4.attention.sliding_window",
                           (uint32_t)(o->sliding_window > 0 ? o->sliding_window : 512));
    kg_gguf_writer_set_u32(w, "gemma4.attention.key_length", (uint32_t)(2 * o->head_dim));
    kg_gguf_writer_set_u32(w, "gemma4.attention.value_length", (uint32_t)(2 * o->head_dim));
    kg_gguf_writer_set_u32(w, "gemma4.attention.key_length_swa", (uint32_t)o->head_dim);
    kg_gguf_writer_set_u32(w, "gemma4.attention.value_length_swa", (uint32_t)o->head_dim);
    kg_gguf_writer_set_u32(w, "gemma4.rope.dimension_count", (uint32_t)(2 * o->head_dim));
    kg_gguf_writer_set_u32(w, "gemma4.rope.dimension_count_swa", (uint32_t)o->head_dim);
    kg_gguf_writer_set_u32(w, "gemma4.attention.shared_kv_layers", (uint32_t)o->n_kv_shared);
    kg_gguf_writer_set_u32(w, "gemma4.embedding_length_per_layer_input",
                           (uint32_t)o->n_embd_per_layer);
    kg_gguf_writer_set_f32(w, "gemma4.final_logit_softcapping",
                           o->final_softcap > 0.0f ? o->final_softcap : 30.0f);
    kg_gguf_writer_set_f32(w, "gemma4.rope.freq_base_swa",
                           o->rope_base_swa > 0.0f ? o->rope_base_swa : 10000.0f);
    if (o->n_expert > 0) {
        kg_gguf_writer_set_u32(w, "gemma4.expert_count", (uint32_t)o->n_expert);
        kg_gguf_writer_set_u32(w, "gemma4.expert_used_count", (uint32_t)o->n_expert_used);
        kg_gguf_writer_set_u32(w, "gemma4.expert_feed_forward_length", (uint32_t)o->n_ff_exp);
    }
}

static float fan_in(int64_t n) {
    return sqrtf(3.0f / (float)n);
}

/* Layer l's MoE block beside its dense MLP. The router reads a vector of
 * norm about 1 (RMS-normed, times 1/sqrt(n_embd), times its scale), so
 * weights of half-width sqrt(3) give unit-variance logits: tokens spread
 * over the experts as the other families' routers spread them. */
static bool add_moe(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, int64_t l, float resid) {
    const kg_ggml_type_t f32 = KG_GGML_TYPE_F32;
    const kg_ggml_type_t xt = o->has_expert_type ? o->expert_type : o->type;
    const int64_t E = o->n_embd, X = o->n_expert, FX = o->n_ff_exp;
    const long long L = (long long)l;
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, suffix)                                              \
    (snprintf(name, sizeof(name), "blk.%lld." suffix, L),                                          \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
#define KG_ADD3(ne0, ne1, scale, suffix)                                                           \
    (snprintf(name, sizeof(name), "blk.%lld." suffix, L),                                          \
     kg_mkmodel_add_random3(w, o, name, xt, (ne0), (ne1), X, (scale)))
    const bool ok = KG_ADD(f32, E, X, 0.0f, sqrtf(3.0f), "ffn_gate_inp.weight") &&
                    KG_ADD(f32, E, 1, 1.0f, 0.2f, "ffn_gate_inp.scale") &&
                    KG_ADD(f32, E, 1, 1.0f, 0.1f, "pre_ffw_norm_2.weight") &&
                    KG_ADD(f32, E, 1, 1.0f, 0.1f, "post_ffw_norm_1.weight") &&
                    KG_ADD(f32, E, 1, 1.0f, 0.1f, "post_ffw_norm_2.weight") &&
                    KG_ADD3(E, 2 * FX, fan_in(E), "ffn_gate_up_exps.weight") &&
                    KG_ADD3(FX, E, fan_in(FX) * resid, "ffn_down_exps.weight") &&
                    KG_ADD(f32, X, 1, 1.0f, 0.3f, "ffn_down_exps.scale");
#undef KG_ADD3
#undef KG_ADD
    return ok;
}

bool kg_mkmodel_gemma4_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, int64_t n_vocab) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const int64_t E = o->n_embd, P = o->n_embd_per_layer, NP = o->n_layer * P;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer), fe = fan_in(E);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))

    /* proportional RoPE (partial_rotary_factor 0.25) over the global head:
     * the first quarter of the pairs rotate, the others are held still;
     * only where a layer is global (every layer windowed, as a short model
     * with the default period is, reads none: llama.cpp and kgen refuse an
     * unread tensor) */
    bool any_global = false;
    for (int64_t il = 0; il < o->n_layer; il++) {
        any_global = any_global || !is_swa(o, il);
    }
    const int64_t half = any_global ? o->head_dim : 0; /* (2 * head_dim) / 2 pairs */
    float *freqs = malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    if (!freqs) {
        return false;
    }
    for (int64_t i = 0; i < half; i++) {
        freqs[i] = i < half / 4 ? 1.0f : 1e30f;
    }
    const int64_t ne_f[2] = {half, 1};
    const kg_status_t st =
        half > 0 ? kg_gguf_writer_add_tensor(w, "rope_freqs.weight", f32, 1, ne_f, freqs) : KG_OK;
    free(freqs);
    if (st != KG_OK) {
        return false;
    }
    if (P > 0 && (!KG_ADD(wt, NP, n_vocab, 0.0f, fan_in(P), "per_layer_token_embd.weight") ||
                  !KG_ADD(wt, E, NP, 0.0f, fe, "per_layer_model_proj.weight") ||
                  !KG_ADD(f32, P, 1, 1.0f, 0.1f, "per_layer_proj_norm.weight"))) {
        return false;
    }
    for (int64_t l = 0; l < o->n_layer; l++) {
        const long long L = (long long)l;
        const int64_t hd = head_dim(o, l), q_dim = o->n_head * hd, kv_dim = head_kv(o, l) * hd;
        const int64_t F = ffn_width(o, l);
        /* Gemma 4 does not scale its scores (f_attention_scale 1): its trained
         * Q/K norms carry the scale. Norms of hd^-1/4 each give q.k the
         * variance 1/sqrt(hd) scaling gives, not scores sharp enough that
         * float rounding decides the softmax */
        const float qk = powf((float)hd, -0.25f);
        bool ok = KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.attn_norm.weight", L) &&
                  KG_ADD(wt, E, q_dim, 0.0f, fe, "blk.%lld.attn_q.weight", L) &&
                  KG_ADD(f32, hd, 1, qk, 0.1f * qk, "blk.%lld.attn_q_norm.weight", L);
        if (!shared_kv(o, l)) {
            ok = ok && KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_k.weight", L) &&
                 KG_ADD(f32, hd, 1, qk, 0.1f * qk, "blk.%lld.attn_k_norm.weight", L) &&
                 (!is_swa(o, l) || KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_v.weight", L));
        }
        ok = ok &&
             KG_ADD(wt, q_dim, E, 0.0f, fan_in(q_dim) * resid, "blk.%lld.attn_output.weight", L) &&
             KG_ADD(f32, E, 1, 3.0f, 0.3f, "blk.%lld.post_attention_norm.weight", L) &&
             KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.ffn_norm.weight", L) &&
             KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate.weight", L) &&
             KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L) &&
             KG_ADD(wt, F, E, 0.0f, fan_in(F) * resid, "blk.%lld.ffn_down.weight", L) &&
             KG_ADD(f32, E, 1, 3.0f, 0.3f, "blk.%lld.post_ffw_norm.weight", L) &&
             KG_ADD(f32, 1, 1, 1.0f, 0.05f, "blk.%lld.layer_output_scale.weight", L);
        if (P > 0) {
            ok = ok && KG_ADD(wt, E, P, 0.0f, fe, "blk.%lld.inp_gate.weight", L) &&
                 KG_ADD(wt, P, E, 0.0f, fan_in(P) * resid, "blk.%lld.proj.weight", L) &&
                 KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.post_norm.weight", L);
        }
        if (!ok || (o->n_expert > 0 && !add_moe(w, o, l, resid))) {
            return false;
        }
    }
#undef KG_ADD
    return true;
}
