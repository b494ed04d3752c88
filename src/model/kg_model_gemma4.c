/* kg_model_gemma4: what Gemma 4 adds to the loader (llama.cpp's
 * llama_model_gemma4::load_arch_hparams and load_arch_tensors): its keys
 * (the windowed layers' own head size and RoPE dims, per-layer K/V head
 * counts and FFN widths, per-layer inputs, shared K/V layers) and one
 * layer's tensors, whose shapes follow the layer's kind, with the
 * 26B-A4B's experts beside the dense MLP where the layer has a router.
 * kg_model.c calls these; the generic layer loader does not know per-layer
 * shapes. */
#include "kg_model_int.h"
#include "kg_quant.h"

#include <math.h>
#include <stdlib.h>

bool kg_model_get_count(const kg_gguf_t *g, const char *key, bool per_layer_ok, int32_t *out) {
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (!kg_gguf_get_arr(g, key, &et, &n)) {
        return get_i32(g, key, out);
    }
    if (!per_layer_ok || n == 0 || n > 4096) {
        return false;
    }
    int32_t *v = malloc((size_t)n * sizeof(int32_t));
    bool ok = v && kg_gguf_arr_i32(g, key, v, n);
    int32_t max = 0;
    for (uint64_t i = 0; ok && i < n; i++) {
        ok = v[i] > 0;
        max = v[i] > max ? v[i] : max;
    }
    free(v);
    if (ok) {
        *out = max;
    }
    return ok;
}

bool kg_model_read_gemma4(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    char key[128];
    /* GeGLU, embeddings times sqrt(n_embd), Q and K RMS-normed per head and
     * attention unscaled (f_attention_scale 1), V RMS-normed without a
     * weight */
    hp->ffn_act = KG_FFN_GELU;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->kq_scale = 1.0f;
    hp->v_norm = true;
    hp->head_dim_swa = 0;
    int32_t v_swa = -1, shared = 0;
    if (!get_i32(g, akey(key, sizeof(key), arch, "attention.key_length_swa"), &hp->head_dim_swa) ||
        !get_i32(g, akey(key, sizeof(key), arch, "attention.value_length_swa"), &v_swa) ||
        !get_i32(g, akey(key, sizeof(key), arch, "embedding_length_per_layer_input"),
                 &hp->n_embd_per_layer) ||
        !get_i32_opt_key(g, akey(key, sizeof(key), arch, "attention.shared_kv_layers"), &shared) ||
        !kg_model_get_count(g, akey(key, sizeof(key), arch, "attention.head_count_kv"), true,
                            &hp->n_head_kv)) {
        snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
        return false;
    }
    hp->n_rot_swa = hp->n_rot; /* llama.cpp's default: the global layers' */
    get_i32(g, akey(key, sizeof(key), arch, "rope.dimension_count_swa"), &hp->n_rot_swa);
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "final_logit_softcapping"), &hp->final_softcap);
    /* llama.cpp's iSWA cache reuses layer n_layer_kv - 2 for a windowed
     * layer and n_layer_kv - 1 for a global one, so it needs two layers
     * with their own K/V */
    hp->n_layer_kv = hp->n_layer - shared;
    const char *bad = NULL;
    if (v_swa != hp->head_dim_swa || hp->head_dim_swa <= 0 || hp->head_dim_swa % 2 != 0 ||
        hp->head_dim_swa > 1024) {
        bad = "attention.value_length_swa must equal key_length_swa (even, at most 1024)";
    } else if (hp->n_rot_swa <= 0 || hp->n_rot_swa % 2 != 0 || hp->n_rot_swa > hp->head_dim_swa) {
        bad = "rope.dimension_count_swa must be even and at most key_length_swa";
    } else if (shared < 0 || (shared > 0 && hp->n_layer_kv < 2)) {
        bad = "attention.shared_kv_layers must leave at least two layers with their own K/V";
    } else if (hp->n_embd_per_layer < 0 || hp->n_embd_per_layer > 65536) {
        bad = "embedding_length_per_layer_input must be in 0..65536";
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad %s hyperparameters: %s", arch, bad);
        return false;
    }
    return true;
}

/* One per-layer value of an integer key that is one value or an array of
 * n_layer (llama.cpp's get_key_or_arr). */
static bool layer_count(const kg_gguf_t *g, const char *key, int32_t il, int32_t *out) {
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (!kg_gguf_get_arr(g, key, &et, &n)) {
        return get_i32(g, key, out);
    }
    int32_t *v = malloc((size_t)n * sizeof(int32_t));
    bool ok = v && il >= 0 && (uint64_t)il < n && kg_gguf_arr_i32(g, key, v, n);
    if (ok) {
        *out = v[il];
    }
    free(v);
    return ok;
}

bool kg_model_gemma4_shape(kg_model_t *model, int32_t il, bool is_swa, char *errstr, size_t cap) {
    const kg_hparams_t *hp = &model->hp;
    const kg_gguf_t *g = model->gguf;
    const char *arch = kg_arch_name(hp->arch);
    kg_layer_weights_t *L = &model->layers[il];
    char key[128];
    L->head_dim = is_swa ? hp->head_dim_swa : hp->head_dim;
    L->n_rot = is_swa ? hp->n_rot_swa : hp->n_rot;
    if (!layer_count(g, akey(key, sizeof(key), arch, "attention.head_count_kv"), il,
                     &L->n_head_kv) ||
        !layer_count(g, akey(key, sizeof(key), arch, "feed_forward_length"), il, &L->n_ff) ||
        L->n_head_kv <= 0 || hp->n_head % L->n_head_kv != 0 || L->n_ff <= 0) {
        snprintf(errstr, cap,
                 "model: layer %d: bad %s (head_count_kv must divide head_count, widths > 0)",
                 (int)il, key);
        return false;
    }
    L->kv_layer = il;
    if (il >= hp->n_layer_kv) {
        /* llama.cpp's reuse rule (llama_model::create_memory for GEMMA4) */
        const int32_t src = hp->n_layer_kv - (is_swa ? 2 : 1);
        const kg_layer_weights_t *S = &model->layers[src];
        if ((S->n_swa > 0) != is_swa || S->head_dim != L->head_dim ||
            S->n_head_kv != L->n_head_kv) {
            snprintf(errstr, cap,
                     "model: layer %d shares the K/V of layer %d, which is not of its kind "
                     "(window, head size and K/V heads must match)",
                     (int)il, (int)src);
            return false;
        }
        L->kv_layer = src;
    }
    return true;
}

/* A MoE layer's tensors beside its dense MLP (llama_model_gemma4's
 * load_arch_tensors with a router, blk.N.ffn_gate_inp): the router and
 * its input scale, pre_ffw_norm_2, post_ffw_norm_1 and _2, the experts'
 * gate and up (merged, ffn_gate_up_exps: gate rows then up rows, as the
 * converter writes Gemma 4's experts.gate_up_proj; or apart), their down,
 * and each expert's output scale (ffn_down_exps.scale: the router's
 * per_expert_scale) where the file has one. A router is optional per
 * layer, as in llama.cpp: a layer without one is dense. */
static bool load_moe(kg_loader_t *ld, kg_model_t *model, int32_t il, kg_gguf_tensor_t *views) {
    const kg_hparams_t *hp = &model->hp;
    kg_layer_weights_t *L = &model->layers[il];
    const int64_t E = hp->n_embd, X = hp->n_expert, FX = hp->n_ff_exp;
    bool bad = false;
    char name[96];
#define KG_NAME(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il), name)
    if (X == 0) {
        if (kg_gguf_find_tensor(ld->g, KG_NAME("ffn_gate_inp.weight"))) {
            snprintf(ld->errstr, ld->errstr_size,
                     "model: %s: a router without gemma4.expert_count, expert_used_count and "
                     "expert_feed_forward_length",
                     name);
            return false;
        }
        return true;
    }
    L->ffn_gate_inp = kg_model_find(ld, KG_NAME("ffn_gate_inp.weight"), E, X, true, &bad);
    if (!L->ffn_gate_inp) {
        return !bad;
    }
    L->ffn_gate_inp_s = kg_model_find(ld, KG_NAME("ffn_gate_inp.scale"), E, 0, false, &bad);
    L->ffn_pre_norm_2 = kg_model_find(ld, KG_NAME("pre_ffw_norm_2.weight"), E, 0, false, &bad);
    L->ffn_post_norm_1 = kg_model_find(ld, KG_NAME("post_ffw_norm_1.weight"), E, 0, false, &bad);
    L->ffn_post_norm_2 = kg_model_find(ld, KG_NAME("post_ffw_norm_2.weight"), E, 0, false, &bad);
    L->down_exps_s = kg_model_find(ld, KG_NAME("ffn_down_exps.scale"), X, 0, true, &bad);
    const kg_gguf_tensor_t *gate_up =
        kg_gguf_find_tensor(ld->g, KG_NAME("ffn_gate_up_exps.weight"));
    if (gate_up) {
        gate_up = kg_model_find3(ld, name, E, 2 * FX, X, &bad);
        if (!bad && (kg_gguf_find_tensor(ld->g, KG_NAME("ffn_gate_exps.weight")) ||
                     kg_gguf_find_tensor(ld->g, KG_NAME("ffn_up_exps.weight")))) {
            snprintf(ld->errstr, ld->errstr_size,
                     "model: layer %d has ffn_gate_up_exps and also ffn_gate_exps or ffn_up_exps",
                     (int)il);
            bad = true;
        }
    } else {
        L->gate_exps = kg_model_find3(ld, KG_NAME("ffn_gate_exps.weight"), E, FX, X, &bad);
        L->up_exps = kg_model_find3(ld, KG_NAME("ffn_up_exps.weight"), E, FX, X, &bad);
    }
    L->down_exps = kg_model_find3(ld, KG_NAME("ffn_down_exps.weight"), FX, E, X, &bad);
#undef KG_NAME
    if (bad) {
        return false;
    }
    if (gate_up) {
        kg_model_expert_views(views, gate_up, 0, FX);
        kg_model_expert_views(views + X, gate_up, FX, FX);
    } else {
        kg_model_expert_views(views, L->gate_exps, 0, FX);
        kg_model_expert_views(views + X, L->up_exps, 0, FX);
    }
    kg_model_expert_views(views + 2 * X, L->down_exps, 0, E);
    L->exp_gate = views;
    L->exp_up = views + X;
    L->exp_down = views + 2 * X;
    return true;
}

bool kg_model_gemma4_layer(
    kg_loader_t *ld, kg_model_t *model, int32_t il, bool is_swa, kg_gguf_tensor_t *exp_views) {
    const kg_hparams_t *hp = &model->hp;
    kg_layer_weights_t *L = &model->layers[il];
    const int64_t E = hp->n_embd, F = L->n_ff, P = hp->n_embd_per_layer;
    const int64_t hd = L->head_dim;
    const int64_t n_q = (int64_t)hp->n_head * hd, n_kv = (int64_t)L->n_head_kv * hd;
    /* a shared-KV layer may carry no K projection (llama.cpp: not required) */
    const bool own_kv = il < hp->n_layer_kv;
    bool bad = false;
    char name[96];
#define KG_T(suffix, ne0, ne1, opt)                                                                \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     kg_model_find(ld, name, (ne0), (ne1), (opt), &bad))

    L->attn_norm = KG_T("attn_norm.weight", E, 0, false);
    if (kg_gguf_find_tensor(
            ld->g, (snprintf(name, sizeof(name), "blk.%d.attn_qkv.weight", (int)il), name))) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: %s: Gemma 4's fused attn_qkv is not supported (separate Q/K/V are)", name);
        return false;
    }
    L->wq = KG_T("attn_q.weight", E, n_q, false);
    L->wk = KG_T("attn_k.weight", E, n_kv, !own_kv);
    /* use_alternative_attention: no V projection, V is K's projection */
    L->wv = KG_T("attn_v.weight", E, n_kv, true);
    if (!L->wv) {
        L->wv = L->wk;
    }
    L->wo = KG_T("attn_output.weight", n_q, E, false);
    L->q_norm = KG_T("attn_q_norm.weight", hd, 0, false);
    L->k_norm = KG_T("attn_k_norm.weight", hd, 0, !own_kv);
    L->attn_post_norm = KG_T("post_attention_norm.weight", E, 0, false);
    L->ffn_norm = KG_T("ffn_norm.weight", E, 0, false);
    L->w_gate = KG_T("ffn_gate.weight", E, F, false);
    L->w_up = KG_T("ffn_up.weight", E, F, false);
    L->w_down = KG_T("ffn_down.weight", F, E, false);
    L->ffn_post_norm = KG_T("post_ffw_norm.weight", E, 0, false);
    const kg_gguf_tensor_t *scale = KG_T("layer_output_scale.weight", 1, 0, true);
    if (scale) {
        kg_dequantize(scale->type, scale->data, &L->out_scale, 1);
        if (!isfinite(L->out_scale)) {
            snprintf(ld->errstr, ld->errstr_size, "model: %s is not finite", name);
            bad = true;
        }
    }
    if (P > 0) {
        L->pe_gate = KG_T("inp_gate.weight", E, P, false);
        L->pe_proj = KG_T("proj.weight", P, E, false);
        L->pe_post_norm = KG_T("post_norm.weight", E, 0, false);
    }
#undef KG_T
    if (!bad && !is_swa) {
        /* the global layers' proportional RoPE: one rope_freqs tensor
         * (llama.cpp duplicates it into each global layer) */
        L->rope_freqs = kg_model_find(ld, "rope_freqs.weight", L->n_rot / 2, 0, false, &bad);
    }
    if (!bad && !own_kv && (!L->wk) != (!L->k_norm)) {
        /* K's projection without its norm (or the reverse) on a layer
         * whose K is never computed: harmless, but not a file llama.cpp's
         * converter writes */
        snprintf(ld->errstr, ld->errstr_size,
                 "model: layer %d has one of attn_k and attn_k_norm without the other", (int)il);
        bad = true;
    }
    return !bad && load_moe(ld, model, il, exp_views);
}

bool kg_model_gemma4_inputs(kg_loader_t *ld, kg_model_t *model) {
    const kg_hparams_t *hp = &model->hp;
    const int64_t P = hp->n_embd_per_layer, NP = (int64_t)hp->n_layer * P;
    bool bad = false;
    if (P == 0) {
        return true;
    }
    model->pl_tok_embd =
        kg_model_find(ld, "per_layer_token_embd.weight", NP, hp->n_vocab, false, &bad);
    model->pl_model_proj =
        kg_model_find(ld, "per_layer_model_proj.weight", hp->n_embd, NP, false, &bad);
    model->pl_proj_norm = kg_model_find(ld, "per_layer_proj_norm.weight", P, 0, false, &bad);
    return !bad;
}
