/* kg_mkmodel_mamba2: the Mamba-2 hybrid files `kgen mkmodel --arch
 * granitehybrid` and `--arch nemotron_h` write, what convert_hf_to_gguf.py's
 * GraniteHybridModel and NemotronHModel write.
 *
 * Both: the ssm.* sizes (conv_kernel 4, state_size 64, group_count 2,
 * inner_size 2 n_embd as Granite 4's and Nemotron-H's are, time_step_rank
 * the heads of 64 channels), head_count_kv per layer (0 but for the
 * attention layers); a Mamba-2 layer has ssm_in, the F32 ssm_conv1d and its
 * bias, ssm_dt.bias, ssm_a (-exp(A_log): negative), ssm_d, ssm_norm (one
 * row per group) and ssm_out.
 *
 * granitehybrid: every third layer attention (from the third; the last
 * when fewer than three), every layer the SwiGLU FFN, Granite's
 * multipliers (the family table's granite_scales) and
 * rope.scaling.finetuned false: NoPE, as the converter writes it for
 * Granite 4's hybrids.
 * nemotron_h: the layers cycle Mamba-2, MLP, Mamba-2, attention, MLP
 * (Nemotron-H's "M-M*-" pattern, shortened), feed_forward_length per
 * layer (0 but for the MLP layers, whose FFN is up and down: squared ReLU),
 * attention.layer_norm_epsilon; no RoPE, no ffn_norm.
 * granitehybrid with --n-expert (Granite 4.0-H Tiny, Small: GraniteHybridModel with
 * num_local_experts): every layer's FFN experts of --n-ff (feed_forward_length is their
 * width) behind the F32 router ffn_gate_inp, ffn_gate_exps, ffn_up_exps and ffn_down_exps
 * (the converter splits input_linear into gate and up), beside a shared SwiGLU expert
 * twice as wide (ffn_{gate,up,down}_shexp, expert_shared_feed_forward_length, as Tiny's
 * 1024 beside experts of 512).
 * nemotron_h_moe (Nemotron 3 Nano): nemotron_h whose MLP layers are
 * experts (NemotronHModel with n_routed_experts): the F32 router
 * ffn_gate_inp and its selection bias exp_probs_b, ffn_up_exps and
 * ffn_down_exps (no gate: squared ReLU), a shared expert twice an expert's
 * width (ffn_up_shexp, ffn_down_shexp); feed_forward_length is the
 * experts' width in the MLP layers. */
#include "kg_mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D_CONV   4
#define D_STATE  64
#define N_GROUP  2
#define HEAD_DIM 64

typedef enum { M2_MAMBA, M2_ATTN, M2_MLP } m2_kind_t;

static bool is_nemotron(const kg_mkmodel_opts_t *o) {
    return o->arch && strncmp(o->arch, "nemotron_h", 10) == 0;
}

/* nemotron_h_moe: its MLP layers are experts */
static bool is_moe(const kg_mkmodel_opts_t *o) {
    return o->arch && strcmp(o->arch, "nemotron_h_moe") == 0;
}

/* granitehybrid with experts */
static bool is_granite_moe(const kg_mkmodel_opts_t *o) {
    return !is_nemotron(o) && o->n_expert > 0;
}

/* an expert's width, and the shared expert's (twice it, as Nemotron 3 Nano's) */
static int64_t ff_exp(const kg_mkmodel_opts_t *o) {
    return o->n_ff_exp > 0 ? o->n_ff_exp : o->n_ff;
}

static m2_kind_t kind_of(const kg_mkmodel_opts_t *o, int64_t il) {
    if (is_nemotron(o)) {
        static const m2_kind_t cycle[5] = {M2_MAMBA, M2_MLP, M2_MAMBA, M2_ATTN, M2_MLP};
        return cycle[il % 5];
    }
    const bool attn = o->n_layer < 3 ? il == o->n_layer - 1 : il % 3 == 2;
    return attn ? M2_ATTN : M2_MAMBA;
}

static float fan_in(int64_t n) {
    return sqrtf(3.0f / (float)n);
}

const char *kg_mkmodel_mamba2_check(const kg_mkmodel_opts_t *o) {
    if (is_moe(o) && (o->n_expert < 2 || o->n_expert_used < 1 || o->n_expert_used > o->n_expert)) {
        return "nemotron_h_moe needs --n-expert (2 or more) and --n-expert-used (1..n-expert)";
    }
    if (is_nemotron(o) && !is_moe(o) && o->n_expert > 0) {
        return "nemotron_h has no experts (nemotron_h_moe has)";
    }
    if (is_granite_moe(o) && o->n_ff_exp != o->n_ff) {
        return "granitehybrid: --n-ff is the experts' width (no --n-ff-exp)";
    }
    if (is_nemotron(o) && o->n_layer < 4) {
        return "nemotron_h needs --n-layer 4 or more (Mamba-2, MLP, Mamba-2, attention, ...)";
    }
    if ((2 * o->n_embd) % ((int64_t)HEAD_DIM * N_GROUP) != 0) {
        return "granitehybrid and nemotron_h need --n-embd a multiple of 64 (Mamba-2 heads of 64 "
               "channels in 2 groups over 2 n_embd)";
    }
    return NULL;
}

void kg_mkmodel_mamba2_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const char *a = is_moe(o) ? "nemotron_h_moe" : is_nemotron(o) ? "nemotron_h" : "granitehybrid";
    const int64_t n = o->n_layer, d_inner = 2 * o->n_embd;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
    int32_t *kv = malloc((size_t)n * sizeof(int32_t));
    int32_t *ff = malloc((size_t)n * sizeof(int32_t));
    if (kv && ff) { /* else the generic keys stay and the file is refused at load */
        for (int64_t il = 0; il < n; il++) {
            const m2_kind_t k = kind_of(o, il);
            kv[il] = k == M2_ATTN ? (int32_t)o->n_head_kv : 0;
            ff[il] = k != M2_MLP ? 0 : (int32_t)(is_moe(o) ? ff_exp(o) : o->n_ff);
        }
        kg_gguf_writer_set_arr(w, KEY("attention.head_count_kv"), KG_GGUF_TYPE_INT32, kv,
                               (uint64_t)n);
        if (is_nemotron(o)) {
            kg_gguf_writer_set_arr(w, KEY("feed_forward_length"), KG_GGUF_TYPE_INT32, ff,
                                   (uint64_t)n);
        }
    }
    free(kv);
    free(ff);
    kg_gguf_writer_set_u32(w, KEY("ssm.conv_kernel"), D_CONV);
    kg_gguf_writer_set_u32(w, KEY("ssm.state_size"), D_STATE);
    kg_gguf_writer_set_u32(w, KEY("ssm.group_count"), N_GROUP);
    kg_gguf_writer_set_u32(w, KEY("ssm.inner_size"), (uint32_t)d_inner);
    kg_gguf_writer_set_u32(w, KEY("ssm.time_step_rank"), (uint32_t)(d_inner / HEAD_DIM));
    if (is_nemotron(o)) {
        kg_gguf_writer_set_f32(w, KEY("attention.layer_norm_epsilon"), 1e-5f);
        kg_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)o->head_dim);
        kg_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)o->head_dim);
    }
    if (is_moe(o)) {
        /* NemotronHModel's MoE keys (Nemotron 3 Nano: routed_scaling_factor
         * 2.5, norm_topk_prob, one shared expert, n_group 1) */
        kg_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)ff_exp(o));
        kg_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"),
                               (uint32_t)(2 * ff_exp(o)));
        kg_gguf_writer_set_u32(w, KEY("expert_shared_count"), 1);
        kg_gguf_writer_set_bool(w, KEY("expert_weights_norm"), true);
        kg_gguf_writer_set_f32(w, KEY("expert_weights_scale"), 2.5f);
        kg_gguf_writer_set_u32(w, KEY("expert_group_count"), 1);
    }
    if (is_granite_moe(o)) {
        kg_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)o->n_expert);
        kg_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)o->n_expert_used);
        kg_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"),
                               (uint32_t)(2 * o->n_ff));
    }
    if (!is_nemotron(o)) {
        kg_gguf_writer_set_bool(w, KEY("rope.scaling.finetuned"), false);
    }
#undef KEY
}

/* A Mamba-2 layer's tensors (after its attn_norm). */
static bool mamba_layer(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, long long L) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const int64_t E = o->n_embd, DI = 2 * E, H = DI / HEAD_DIM;
    const int64_t n_conv = DI + (int64_t)2 * N_GROUP * D_STATE;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
    /* dt's bias near softplus^-1 of 0.05 (dt in about 0.02..0.13, Mamba's
     * init range), A = -exp(A_log) in -7..-1, D near 1 */
    return KG_ADD(wt, E, DI + n_conv + H, 0.0f, fan_in(E), "blk.%lld.ssm_in.weight", L) &&
           KG_ADD(f32, D_CONV, n_conv, 0.0f, fan_in(D_CONV), "blk.%lld.ssm_conv1d.weight", L) &&
           KG_ADD(f32, n_conv, 1, 0.0f, 0.1f, "blk.%lld.ssm_conv1d.bias", L) &&
           KG_ADD(f32, H, 1, -3.0f, 1.0f, "blk.%lld.ssm_dt.bias", L) &&
           KG_ADD(f32, 1, H, -4.0f, 3.0f, "blk.%lld.ssm_a", L) &&
           KG_ADD(f32, 1, H, 1.0f, 0.5f, "blk.%lld.ssm_d", L) &&
           KG_ADD(f32, DI / N_GROUP, N_GROUP, 1.0f, 0.1f, "blk.%lld.ssm_norm.weight", L) &&
           KG_ADD(wt, DI, E, 0.0f, fan_in(DI) * resid, "blk.%lld.ssm_out.weight", L);
#undef KG_ADD
}

/* nemotron_h_moe's MLP layer (after its attn_norm): the F32 router and
 * selection bias, experts of up and down only (squared ReLU), the shared
 * expert likewise. */
static bool moe_layer(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, long long L) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const int64_t E = o->n_embd, X = o->n_expert, FX = ff_exp(o), FS = 2 * FX;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
#define KG_ADD3(ne0, ne1, scale, ...)                                                              \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random3(w, o, name, wt, (ne0), (ne1), X, (scale)))
    /* the selection bias large enough to change which experts win */
    return KG_ADD(f32, E, X, 0.0f, fan_in(E), "blk.%lld.ffn_gate_inp.weight", L) &&
           KG_ADD(f32, X, 1, 0.0f, 0.3f, "blk.%lld.exp_probs_b.bias", L) &&
           KG_ADD3(E, FX, fan_in(E), "blk.%lld.ffn_up_exps.weight", L) &&
           KG_ADD3(FX, E, fan_in(FX) * resid, "blk.%lld.ffn_down_exps.weight", L) &&
           KG_ADD(wt, E, FS, 0.0f, fan_in(E), "blk.%lld.ffn_up_shexp.weight", L) &&
           KG_ADD(wt, FS, E, 0.0f, fan_in(FS) * resid, "blk.%lld.ffn_down_shexp.weight", L);
#undef KG_ADD
#undef KG_ADD3
}

/* Granite 4's MoE FFN (after its ffn_norm): the F32 router, experts of n_ff with a gate, the
 * shared SwiGLU expert of 2 n_ff. */
static bool granite_moe_layer(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, long long L) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const kg_ggml_type_t xt = o->has_expert_type ? o->expert_type : wt;
    const int64_t E = o->n_embd, X = o->n_expert, F = o->n_ff, FS = 2 * F;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
#define KG_ADD3(ne0, ne1, scale, ...)                                                              \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random3(w, o, name, xt, (ne0), (ne1), X, (scale)))
    return KG_ADD(f32, E, X, 0.0f, fan_in(E), "blk.%lld.ffn_gate_inp.weight", L) &&
           KG_ADD3(E, F, fan_in(E), "blk.%lld.ffn_gate_exps.weight", L) &&
           KG_ADD3(E, F, fan_in(E), "blk.%lld.ffn_up_exps.weight", L) &&
           KG_ADD3(F, E, fan_in(F) * resid, "blk.%lld.ffn_down_exps.weight", L) &&
           KG_ADD(wt, E, FS, 0.0f, fan_in(E), "blk.%lld.ffn_gate_shexp.weight", L) &&
           KG_ADD(wt, E, FS, 0.0f, fan_in(E), "blk.%lld.ffn_up_shexp.weight", L) &&
           KG_ADD(wt, FS, E, 0.0f, fan_in(FS) * resid, "blk.%lld.ffn_down_shexp.weight", L);
#undef KG_ADD
#undef KG_ADD3
}

bool kg_mkmodel_mamba2_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o) {
    const kg_ggml_type_t wt = o->type, f32 = KG_GGML_TYPE_F32;
    const int64_t E = o->n_embd, hd = o->head_dim, F = o->n_ff;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer), fe = fan_in(E);
    const bool nemo = is_nemotron(o);
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     kg_mkmodel_add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))
    for (int64_t l = 0; l < o->n_layer; l++) {
        const long long L = (long long)l;
        const m2_kind_t k = kind_of(o, l);
        bool ok = KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.attn_norm.weight", L);
        if (k == M2_MAMBA) {
            ok = ok && mamba_layer(w, o, L);
        } else if (k == M2_ATTN) {
            ok =
                ok && KG_ADD(wt, E, q_dim, 0.0f, fe, "blk.%lld.attn_q.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_k.weight", L) &&
                KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_v.weight", L) &&
                KG_ADD(wt, q_dim, E, 0.0f, fan_in(q_dim) * resid, "blk.%lld.attn_output.weight", L);
        }
        if (is_moe(o) && k == M2_MLP) {
            ok = ok && moe_layer(w, o, L);
        } else if (nemo && k == M2_MLP) { /* the block is the MLP, normed by attn_norm */
            ok = ok && KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L) &&
                 KG_ADD(wt, F, E, 0.0f, fan_in(F) * resid, "blk.%lld.ffn_down.weight", L);
        } else if (is_granite_moe(o)) {
            ok = ok && KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.ffn_norm.weight", L) &&
                 granite_moe_layer(w, o, L);
        } else if (!nemo) {
            ok = ok && KG_ADD(f32, E, 1, 1.0f, 0.1f, "blk.%lld.ffn_norm.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate.weight", L) &&
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
