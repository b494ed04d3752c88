/* kg_mkmodel_qwen35: the Qwen3.5 files `kgen mkmodel --arch qwen35` (and
 * qwen35moe) writes, what convert_hf_to_gguf.py's Qwen3.5 converter
 * writes: attention.recurrent_layers (one flag per layer) beside
 * full_attention_interval, every third layer attention (Qwen3.5 has every
 * fourth; three gives a small model both kinds twice); IMRoPE over a
 * quarter of the head (rope.dimension_count, rope.dimension_sections
 * split as 11/11/10 of 32 pairs); the ssm.* sizes of the gated DeltaNet
 * layers: K heads --ssm-groups (default --n-head-kv), V heads --ssm-heads
 * (default --n-head), both --ssm-state wide (default --head-dim), a
 * convolution of 4; --attn-every N makes every N-th layer attention
 * (default 3; Qwen3.5's is 4).
 *
 * A DeltaNet layer: attn_qkv (n_embd -> q | k | v), attn_gate (z), the F32
 * kernel ssm_conv1d, ssm_dt.bias, ssm_a (negative: -exp(A_log)),
 * ssm_beta, ssm_alpha, ssm_norm, ssm_out. An attention layer: attn_q twice
 * as wide (each head's query, then its output gate), attn_k, attn_v, the
 * per-head Q/K norms, attn_output. Every layer: attn_norm, then
 * post_attention_norm before the FFN (SwiGLU; qwen35moe: softmax-routed
 * experts and a shared expert gated by sigmoid(ffn_gate_inp_shexp x)).
 *
 * qwen3next (Qwen3NextModel's converter): qwen35moe's layers with plain
 * NeoX RoPE (no sections) and one ssm_ba (n_embd -> 2 V heads: per K head
 * its V heads' betas, then their alphas) for ssm_beta and ssm_alpha. */
#include "kg_mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D_CONV 4

static bool is_attn(const kg_mkmodel_opts_t *o, int64_t il) {
    return (il + 1) % (o->attn_every > 0 ? o->attn_every : 3) == 0;
}

/* The DeltaNet sizes: d_state, K heads, V heads */
static int64_t d_state(const kg_mkmodel_opts_t *o) {
    return o->ssm_state > 0 ? o->ssm_state : o->head_dim;
}

static int64_t k_heads(const kg_mkmodel_opts_t *o) {
    return o->ssm_groups > 0 ? o->ssm_groups : o->n_head_kv;
}

static int64_t v_heads(const kg_mkmodel_opts_t *o) {
    return o->ssm_heads > 0 ? o->ssm_heads : o->n_head;
}

static float fan_in(int64_t n) {
    return sqrtf(3.0f / (float)n);
}

static int64_t n_rot(const kg_mkmodel_opts_t *o) {
    return o->n_rot > 0 ? o->n_rot : (o->head_dim / 4) & ~(int64_t)1;
}

void kg_mkmodel_qwen35_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const char *arch) {
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
    const int64_t n = o->n_layer, hd = o->head_dim, pairs = n_rot(o) / 2;
    kg_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)n_rot(o));
    const int32_t sec[4] = {(int32_t)((pairs + 2) / 3), (int32_t)((pairs + 1) / 3),
                            (int32_t)(pairs / 3), 0};
    if (strcmp(arch, "qwen3next") != 0) {
        kg_gguf_writer_set_arr_i32(w, KEY("rope.dimension_sections"), sec, 4);
    }
    kg_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    kg_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    kg_gguf_writer_set_u32(w, KEY("ssm.conv_kernel"), D_CONV);
    kg_gguf_writer_set_u32(w, KEY("ssm.state_size"), (uint32_t)d_state(o));
    kg_gguf_writer_set_u32(w, KEY("ssm.group_count"), (uint32_t)k_heads(o));
    kg_gguf_writer_set_u32(w, KEY("ssm.time_step_rank"), (uint32_t)v_heads(o));
    kg_gguf_writer_set_u32(w, KEY("ssm.inner_size"), (uint32_t)(d_state(o) * v_heads(o)));
    kg_gguf_writer_set_u32(w, KEY("full_attention_interval"),
                           (uint32_t)(o->attn_every > 0 ? o->attn_every : 3));
    uint8_t *recr = malloc((size_t)n);
    if (recr) { /* else the interval alone says the same */
        for (int64_t il = 0; il < n; il++) {
            recr[il] = !is_attn(o, il);
        }
        kg_gguf_writer_set_arr(w, KEY("attention.recurrent_layers"), KG_GGUF_TYPE_BOOL, recr,
                               (uint64_t)n);
        free(recr);
    }
    if (o->n_expert > 0) { /* qwen35moe: the shared expert is n_ff wide */
        kg_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)o->n_ff);
    }
#undef KEY
}

bool kg_mkmodel_qwen35_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const char *arch) {
    const bool moe = o->n_expert > 0, next = strcmp(arch, "qwen3next") == 0;
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const kg_ggml_type_t xt = o->has_expert_type ? o->expert_type : wt;
    const int64_t E = o->n_embd, hd = o->head_dim, F = o->n_ff;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const int64_t S = d_state(o), HV = v_heads(o), VD = S * HV, CH = 2 * k_heads(o) * S + VD;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer), fe = fan_in(E);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
#define KG_ADD3(type, ne0, ne1, scale, ...)                                                        \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random3(w, o, name, (type), (ne0), (ne1), o->n_expert, (scale)))
    for (int64_t l = 0; l < o->n_layer; l++) {
        const long long L = (long long)l;
        bool ok = KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.attn_norm.weight", L);
        if (is_attn(o, l)) {
            ok =
                ok && KG_ADD(wt, E, 2 * q_dim, 0.0f, fe, "blk.%lld.attn_q.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_k.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_v.weight", L) &&
                KG_ADD(f32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_q_norm.weight", L) &&
                KG_ADD(f32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_k_norm.weight", L) &&
                KG_ADD(wt, q_dim, E, 0.0f, fan_in(q_dim) * resid, "blk.%lld.attn_output.weight", L);
        } else {
            /* decays exp(softplus(alpha x + dt_b) * a) of about 0.3 to
             * 0.9, so the state remembers some tokens back; betas near
             * one half */
            ok = ok && KG_ADD(wt, E, CH, 0.0f, fe, "blk.%lld.attn_qkv.weight", L) &&
                 KG_ADD(wt, E, VD, 0.0f, fe, "blk.%lld.attn_gate.weight", L) &&
                 KG_ADD(f32, D_CONV, CH, 0.0f, fan_in(D_CONV), "blk.%lld.ssm_conv1d.weight", L) &&
                 KG_ADD(f32, HV, 1, -1.0f, 0.5f, "blk.%lld.ssm_dt.bias", L) &&
                 KG_ADD(f32, HV, 1, -0.6f, 0.4f, "blk.%lld.ssm_a", L) &&
                 (next ? KG_ADD(wt, E, 2 * HV, 0.0f, fe, "blk.%lld.ssm_ba.weight", L)
                       : KG_ADD(wt, E, HV, 0.0f, fe, "blk.%lld.ssm_beta.weight", L) &&
                             KG_ADD(wt, E, HV, 0.0f, fe, "blk.%lld.ssm_alpha.weight", L)) &&
                 KG_ADD(f32, S, 1, 1.0f, 0.1f, "blk.%lld.ssm_norm.weight", L) &&
                 KG_ADD(wt, VD, E, 0.0f, fan_in(VD) * resid, "blk.%lld.ssm_out.weight", L);
        }
        ok = ok && KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.post_attention_norm.weight", L);
        if (moe) {
            const int64_t FX = o->n_ff_exp;
            ok = ok && KG_ADD(wt, E, o->n_expert, 0.0f, fe, "blk.%lld.ffn_gate_inp.weight", L) &&
                 KG_ADD3(xt, E, FX, fe, "blk.%lld.ffn_gate_exps.weight", L) &&
                 KG_ADD3(xt, E, FX, fe, "blk.%lld.ffn_up_exps.weight", L) &&
                 KG_ADD3(xt, FX, E, fan_in(FX) * resid, "blk.%lld.ffn_down_exps.weight", L) &&
                 KG_ADD(f32, E, 1, 0.0f, fe, "blk.%lld.ffn_gate_inp_shexp.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate_shexp.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up_shexp.weight", L) &&
                 KG_ADD(wt, F, E, 0.0f, fan_in(F) * resid, "blk.%lld.ffn_down_shexp.weight", L);
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
#undef KG_ADD3
    return true;
}
