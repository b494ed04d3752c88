/* kg_model: load a GGUF model of a supported family: check the
 * architecture, read the hyperparameters with llama.cpp's keys and
 * defaults (and the values llama.cpp fixes in code), find every weight
 * tensor and check its type and shape before any backend touches it.
 *
 * The references are llama.cpp's llama_model_base::load_hparams (the keys
 * common to all families), each family's load_arch_hparams and
 * load_arch_tensors (src/models/<arch>.cpp), and llama_context's cparams
 * setup (RoPE scaling and YaRN defaults). */
#include "kg_model.h"

#include "kg_model_bert.h"
#include "kg_model_int.h"
#include "kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const arch_names[KG_ARCH_COUNT_] = {
    [KG_ARCH_LLAMA] = "llama",
    [KG_ARCH_MISTRAL] = "mistral",
    [KG_ARCH_QWEN2] = "qwen2",
    [KG_ARCH_QWEN3] = "qwen3",
    [KG_ARCH_GEMMA2] = "gemma2",
    [KG_ARCH_GEMMA3] = "gemma3",
    [KG_ARCH_PHI3] = "phi3",
    [KG_ARCH_QWEN3MOE] = "qwen3moe",
    [KG_ARCH_GPT_OSS] = "gpt-oss",
    [KG_ARCH_SMOLLM3] = "smollm3",
    [KG_ARCH_GRANITE] = "granite",
    [KG_ARCH_OLMO2] = "olmo2",
    [KG_ARCH_MISTRAL3] = "mistral3",
    [KG_ARCH_SEED_OSS] = "seed_oss",
    [KG_ARCH_APERTUS] = "apertus",
    [KG_ARCH_GLM4MOE] = "glm4moe",
    [KG_ARCH_DEEPSEEK2] = "deepseek2",
    [KG_ARCH_BERT] = "bert",
    [KG_ARCH_GEMMA4] = "gemma4",
    [KG_ARCH_GEMMA_EMBED] = "gemma-embedding",
    [KG_ARCH_NOMIC_BERT] = "nomic-bert",
    [KG_ARCH_LFM2] = "lfm2",
    [KG_ARCH_QWEN35] = "qwen35",
    [KG_ARCH_QWEN35MOE] = "qwen35moe",
    [KG_ARCH_QWEN3NEXT] = "qwen3next",
    [KG_ARCH_GRANITEHYBRID] = "granitehybrid",
    [KG_ARCH_NEMOTRON_H] = "nemotron_h",
    [KG_ARCH_NEMOTRON_H_MOE] = "nemotron_h_moe",
    [KG_ARCH_LLAMA4] = "llama4",
    [KG_ARCH_LFM2MOE] = "lfm2moe",
};

#define SUPPORTED_ARCHS                                                                            \
    "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, smollm3, granite, "    \
    "olmo2, mistral3, seed_oss, apertus, glm4moe, deepseek2, bert, gemma4, gemma-embedding, "      \
    "nomic-bert, lfm2, qwen35, qwen35moe, qwen3next, granitehybrid, nemotron_h, nemotron_h_moe, "  \
    "llama4, lfm2moe"

const char *kg_arch_name(kg_arch_t arch) {
    return (int)arch >= 0 && arch < KG_ARCH_COUNT_ ? arch_names[arch] : "unknown";
}

// ---- tensors ----

/* The tensors a load has taken (kg_model_int.h), so a tensor the graph
 * would not use (a bias of a variant kgen does not run) is an error. */
typedef kg_loader_t loader_t;

static void mark_used(loader_t *ld, const kg_gguf_tensor_t *t) {
    if (t) {
        ld->used[t - kg_gguf_tensor(ld->g, 0)] = true;
    }
}

static bool shape_is(const kg_gguf_tensor_t *t, int64_t ne0, int64_t ne1) {
    return ne1 == 0 ? (t->n_dims == 1 && t->ne[0] == ne0)
                    : (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1);
}

/* A stack of n_expert (ne0, ne1) matrices: the 3-D expert tensors. NULL
 * with errstr set when absent or misshapen. */
static const kg_gguf_tensor_t *
find_tensor3(loader_t *ld, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, bool *bad) {
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(ld->g, name);
    if (*bad) {
        return NULL; /* keep the first error of the layer */
    }
    if (!t) {
        snprintf(ld->errstr, ld->errstr_size, "model: missing tensor '%s'", name);
        *bad = true;
        return NULL;
    }
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: tensor '%s' has shape [%lld, %lld, %lld] (%u dims), expected [%lld, "
                 "%lld, %lld]",
                 name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims,
                 (long long)ne0, (long long)ne1, (long long)ne2);
        *bad = true;
        return NULL;
    }
    mark_used(ld, t);
    return t;
}

/* Find a weight and check its shape (ne0, ne1; ne1 = 0 for a vector). NULL
 * with errstr set when absent (unless optional) or misshapen. */
static const kg_gguf_tensor_t *
find_tensor(loader_t *ld, const char *name, int64_t ne0, int64_t ne1, bool optional, bool *bad) {
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(ld->g, name);
    if (!t) {
        if (!optional) {
            snprintf(ld->errstr, ld->errstr_size, "model: missing tensor '%s'", name);
            *bad = true;
        }
        return NULL;
    }
    if (!shape_is(t, ne0, ne1)) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]", name,
                 (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0,
                 (long long)ne1);
        *bad = true;
        return NULL;
    }
    mark_used(ld, t);
    return t;
}

const kg_gguf_tensor_t *kg_model_find(
    kg_loader_t *ld, const char *name, int64_t ne0, int64_t ne1, bool optional, bool *bad) {
    if (*bad) { /* keep the first error of the layer */
        char scratch[8];
        kg_loader_t quiet = *ld;
        quiet.errstr = scratch;
        quiet.errstr_size = sizeof(scratch);
        bool also_bad = false;
        return find_tensor(&quiet, name, ne0, ne1, optional, &also_bad);
    }
    return find_tensor(ld, name, ne0, ne1, optional, bad);
}

/* Row view [row0, row0 + n_rows) of a fused matrix (n_rows = 0 for rows of
 * a vector: elements [row0, row0 + ne0)). Rows of every ggml type are whole
 * blocks, so a view is a plain tensor of the same type. */
static const kg_gguf_tensor_t *make_view(kg_gguf_tensor_t *view,
                                         const kg_gguf_tensor_t *t,
                                         int64_t row0,
                                         int64_t n_rows,
                                         int64_t vec_len) {
    *view = *t;
    if (n_rows > 0) {
        size_t row_size = kg_type_row_size(t->type, t->ne[0]);
        view->ne[1] = n_rows;
        view->data = (const char *)t->data + (size_t)row0 * row_size;
        view->size = (size_t)n_rows * row_size;
    } else {
        size_t elem = kg_type_row_size(t->type, t->ne[0]) / (size_t)t->ne[0];
        view->ne[0] = vec_len;
        view->data = (const char *)t->data + (size_t)row0 * elem;
        view->size = (size_t)vec_len * elem;
    }
    return view;
}

void kg_model_expert_views(kg_gguf_tensor_t *views,
                           const kg_gguf_tensor_t *t,
                           int64_t row0,
                           int64_t n_rows) {
    const size_t row_size = kg_type_row_size(t->type, t->ne[0]);
    const size_t mat_size = row_size * (size_t)t->ne[1];
    for (int64_t e = 0; e < t->ne[2]; e++) {
        const size_t at = (size_t)e * mat_size + (size_t)row0 * row_size;
        kg_gguf_tensor_t *v = &views[e];
        *v = *t;
        v->n_dims = 2;
        v->ne[1] = n_rows;
        v->ne[2] = 1;
        v->data = (const char *)t->data + at;
        v->offset = t->offset + (uint64_t)at;
        v->size = (size_t)n_rows * row_size;
    }
}

/* Expert views[e] = matrix e of the 3-D tensor t (ne[2] of them). */
static void make_expert_views(kg_gguf_tensor_t *views, const kg_gguf_tensor_t *t) {
    kg_model_expert_views(views, t, 0, t->ne[1]);
}

const kg_gguf_tensor_t *kg_model_find3(
    kg_loader_t *ld, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, bool *bad) {
    return find_tensor3(ld, name, ne0, ne1, ne2, bad);
}

// ---- loading ----

/* N of a tensor named "blk.N.*", or -1. */
static int32_t tensor_block(kg_gguf_str_t name) {
    if (name.len < 6 || memcmp(name.data, "blk.", 4) != 0) {
        return -1;
    }
    int64_t n = 0;
    size_t i = 4;
    for (; i < name.len && name.data[i] >= '0' && name.data[i] <= '9' && n < 100000; i++) {
        n = n * 10 + (name.data[i] - '0');
    }
    return i > 4 && i < name.len && name.data[i] == '.' && n < 100000 ? (int32_t)n : -1;
}

/* Every tensor of one layer. Q/K/V come separately or fused (attn_qkv,
 * split into views); biases are optional for every family, as in
 * llama.cpp's create_tensor_qkv; phi3's ffn_up holds gate then up. A
 * mixture-of-experts layer has the router and the 3-D expert tensors
 * instead of the dense FFN (cut into one view per expert in exp_views:
 * 3 * n_expert of them); gpt-oss adds attention sinks and biases on the
 * attention output, the router and the experts. */
static bool load_layer(loader_t *ld,
                       kg_model_t *model,
                       int32_t il,
                       kg_gguf_tensor_t *views,
                       kg_gguf_tensor_t *exp_views,
                       kg_gguf_tensor_t *mla_views) {
    const kg_hparams_t *hp = &model->hp;
    kg_layer_weights_t *L = &model->layers[il];
    const int64_t E = hp->n_embd, F = hp->n_ff;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_kv = (int64_t)hp->n_head_kv * hp->head_dim;
    /* attn_q's width: each head's query, then (qwen35) its output gate */
    const int64_t n_qw = hp->attn_out_gate ? 2 * n_q : n_q;
    const kg_arch_t a = hp->arch;
    const bool qwen35 = a == KG_ARCH_QWEN35 || a == KG_ARCH_QWEN35MOE || a == KG_ARCH_QWEN3NEXT;
    const bool gemma = a == KG_ARCH_GEMMA2 || a == KG_ARCH_GEMMA3 || a == KG_ARCH_GEMMA_EMBED;
    const bool qk_norm = a == KG_ARCH_QWEN3 || a == KG_ARCH_GEMMA3 || a == KG_ARCH_GEMMA_EMBED ||
                         a == KG_ARCH_QWEN3MOE || a == KG_ARCH_APERTUS || a == KG_ARCH_LFM2 ||
                         a == KG_ARCH_LFM2MOE || qwen35;
    const bool oss = a == KG_ARCH_GPT_OSS, olmo2 = a == KG_ARCH_OLMO2;
    const bool glm = a == KG_ARCH_GLM4MOE, ds2 = a == KG_ARCH_DEEPSEEK2;
    const bool nemo_moe = a == KG_ARCH_NEMOTRON_H_MOE, lfm2moe = a == KG_ARCH_LFM2MOE;
    /* glm4moe's (and lfm2moe's) first n_layer_dense layers have a dense FFN, llama4's all but
     * every n_moe_step-th */
    const bool moe_layer = hp->n_expert > 0 && il >= hp->n_layer_dense &&
                           (hp->n_moe_step == 0 || (il + 1) % hp->n_moe_step == 0);
    bool bad = false;
    char name[96];
#define KG_T(suffix, ne0, ne1, opt)                                                                \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     find_tensor(ld, name, (ne0), (ne1), (opt), &bad))

    if (!olmo2) {
        L->attn_norm = KG_T("attn_norm.weight", E, 0, false);
    }
    if (L->kind == KG_LAYER_FFN) { /* no mixer (nemotron_h's MLP layers) */
        goto ffn;
    }
    if (L->kind != KG_LAYER_ATTN) { /* a hybrid's recurrent layer: its own mixer */
        bad = bad || !kg_model_recurrent_layer(ld, model, il);
        goto ffn;
    }
    snprintf(name, sizeof(name), "blk.%d.attn_qkv.weight", (int)il);
    const kg_gguf_tensor_t *qkv = kg_gguf_find_tensor(ld->g, name);
    if (ds2) {
        /* llama_model_deepseek2::load_arch_tensors with MLA: compressed
         * queries (or attn_q: V2-Lite), the latent's down-projection and
         * norm, k_b and v_b (3-D: one matrix per head), the output over
         * n_head x value_length_mla */
        const int64_t H = hp->n_head, R = hp->n_lora_kv, nope = hp->mla_k - hp->n_rot;
        if (hp->n_lora_q > 0) {
            L->wq_a = KG_T("attn_q_a.weight", E, hp->n_lora_q, false);
            L->q_a_norm = KG_T("attn_q_a_norm.weight", hp->n_lora_q, 0, false);
            L->wq_b = KG_T("attn_q_b.weight", hp->n_lora_q, H * hp->mla_k, false);
        } else {
            L->wq = KG_T("attn_q.weight", E, H * hp->mla_k, false);
        }
        L->wkv_a_mqa = KG_T("attn_kv_a_mqa.weight", E, R + hp->n_rot, false);
        L->kv_a_norm = KG_T("attn_kv_a_norm.weight", R, 0, false);
        snprintf(name, sizeof(name), "blk.%d.attn_k_b.weight", (int)il);
        const kg_gguf_tensor_t *kb = find_tensor3(ld, name, nope, R, H, &bad);
        snprintf(name, sizeof(name), "blk.%d.attn_v_b.weight", (int)il);
        const kg_gguf_tensor_t *vb = find_tensor3(ld, name, R, hp->mla_v, H, &bad);
        if (!bad) {
            make_expert_views(mla_views, kb);
            make_expert_views(mla_views + H, vb);
            L->k_b = mla_views;
            L->v_b = mla_views + H;
        }
        L->wo = KG_T("attn_output.weight", H * hp->mla_v, E, false);
    } else if (qkv) {
        qkv = KG_T("attn_qkv.weight", E, n_qw + 2 * n_kv, false);
        if (qkv) {
            L->wq = make_view(&views[0], qkv, 0, n_qw, 0);
            L->wk = make_view(&views[1], qkv, n_qw, n_kv, 0);
            L->wv = make_view(&views[2], qkv, n_qw + n_kv, n_kv, 0);
        }
        const kg_gguf_tensor_t *b =
            hp->attn_out_gate ? NULL : KG_T("attn_qkv.bias", n_q + 2 * n_kv, 0, true);
        if (b && kg_type_block_elems(b->type) != 1) {
            snprintf(ld->errstr, ld->errstr_size,
                     "model: blk.%d.attn_qkv.bias is %s; a split bias must be F32, F16 or BF16",
                     (int)il, kg_ggml_type_name(b->type));
            bad = true;
        } else if (b) {
            L->bq = make_view(&views[3], b, 0, 0, n_q);
            L->bk = make_view(&views[4], b, n_q, 0, n_kv);
            L->bv = make_view(&views[5], b, n_q + n_kv, 0, n_kv);
        }
    } else {
        L->wq = KG_T("attn_q.weight", E, n_qw, false);
        L->wk = KG_T("attn_k.weight", E, n_kv, false);
        L->wv = KG_T("attn_v.weight", E, n_kv, false);
    }
    if (!L->bq && !ds2 && !hp->attn_out_gate) { /* qwen35 has none: refused as unknown */
        L->bq = KG_T("attn_q.bias", n_q, 0, true);
        L->bk = KG_T("attn_k.bias", n_kv, 0, true);
        L->bv = KG_T("attn_v.bias", n_kv, 0, true);
    }
    if (!ds2) {
        L->wo = KG_T("attn_output.weight", n_q, E, false);
    }
    if (a == KG_ARCH_LLAMA || a == KG_ARCH_MISTRAL || a == KG_ARCH_PHI3 || a == KG_ARCH_GRANITE ||
        a == KG_ARCH_MISTRAL3 || a == KG_ARCH_APERTUS || a == KG_ARCH_GRANITEHYBRID ||
        a == KG_ARCH_NEMOTRON_H || a == KG_ARCH_NEMOTRON_H_MOE || oss) {
        L->bo = KG_T("attn_output.bias", E, 0, !oss);
    }
    if (oss) {
        L->attn_sinks = KG_T("attn_sinks.weight", hp->n_head, 0, false);
    }
    if (qk_norm) {
        L->q_norm = KG_T("attn_q_norm.weight", hp->head_dim, 0, false);
        L->k_norm = KG_T("attn_k_norm.weight", hp->head_dim, 0, false);
    }
    if (glm) {
        /* optional (GLM-4.5 355B has them, 4.5-Air not), both or neither */
        L->q_norm = KG_T("attn_q_norm.weight", hp->head_dim, 0, true);
        L->k_norm = KG_T("attn_k_norm.weight", hp->head_dim, 0, true);
        if (!bad && !L->q_norm != !L->k_norm) {
            snprintf(ld->errstr, ld->errstr_size,
                     "model: layer %d has one of attn_q_norm and attn_k_norm without the other",
                     (int)il);
            bad = true;
        }
    }
    if (a == KG_ARCH_APERTUS) {
        /* llama.cpp loads these optional biases and its graph never adds
         * them (build_norm with no bias): taken and ignored alike */
        (void)KG_T("attn_q_norm.bias", hp->head_dim, 0, true);
        (void)KG_T("attn_k_norm.bias", hp->head_dim, 0, true);
    }
    if (olmo2) {
        L->q_norm = KG_T("attn_q_norm.weight", n_q, 0, false);
        L->k_norm = KG_T("attn_k_norm.weight", n_kv, 0, false);
    }
    if (gemma || olmo2) {
        L->attn_post_norm = KG_T("post_attention_norm.weight", E, 0, false);
        L->ffn_post_norm = KG_T("post_ffw_norm.weight", E, 0, false);
    }
ffn:
    if (L->n_ff == 0) {
        goto done; /* a mixer alone (nemotron_h's attention and Mamba-2 layers) */
    }
    /* gpt-oss and seed_oss name their FFN norm post_attention_norm (after
     * the attention); olmo2 has none; a layer without a mixer norms its
     * FFN's input with attn_norm (nemotron_h) */
    if (L->kind == KG_LAYER_FFN) {
        L->ffn_norm = L->attn_norm;
    } else if (!olmo2) {
        /* qwen35's attn_post_norm is the FFN's input norm (of the residual
         * stream after the attention) */
        L->ffn_norm = oss || glm || a == KG_ARCH_SEED_OSS || qwen35
                          ? KG_T("post_attention_norm.weight", E, 0, false)
                          : KG_T("ffn_norm.weight", E, 0, false);
    }
    if (moe_layer) {
        const int64_t X = hp->n_expert, FX = hp->n_ff_exp;
        L->ffn_gate_inp = KG_T("ffn_gate_inp.weight", E, X, false);
        const bool granite = a == KG_ARCH_GRANITEHYBRID;
        if (a == KG_ARCH_QWEN35MOE || a == KG_ARCH_QWEN3NEXT || (granite && hp->n_ff_shexp > 0)) {
            /* the shared expert, gated per token by sigmoid(ffn_gate_inp_shexp . x) (Granite's:
             * ungated, llama_model_granite_hybrid's build_layer_ffn) */
            const int64_t FS = hp->n_ff_shexp;
            L->gate_inp_shexp = granite ? NULL : KG_T("ffn_gate_inp_shexp.weight", E, 0, false);
            L->gate_shexp = KG_T("ffn_gate_shexp.weight", E, FS, false);
            L->up_shexp = KG_T("ffn_up_shexp.weight", E, FS, false);
            L->down_shexp = KG_T("ffn_down_shexp.weight", FS, E, false);
        }
        if (glm || ds2 || nemo_moe || lfm2moe || a == KG_ARCH_LLAMA4) {
            /* optional in DeepSeek V2 files (V3 and Kimi K2 have it), none in llama4's;
             * nemotron_h_moe's and llama4's shared expert have their own width; lfm2moe has
             * none */
            const int64_t FS =
                hp->n_ff_shexp > 0 ? hp->n_ff_shexp : (int64_t)hp->n_expert_shared * FX;
            L->exp_probs_b = a == KG_ARCH_LLAMA4 ? NULL : KG_T("exp_probs_b.bias", X, 0, ds2);
            if (L->exp_probs_b && kg_type_block_elems(L->exp_probs_b->type) != 1) {
                snprintf(ld->errstr, ld->errstr_size,
                         "model: blk.%d.exp_probs_b.bias is %s; it must be F32, F16 or BF16",
                         (int)il, kg_ggml_type_name(L->exp_probs_b->type));
                bad = true;
            }
            if (FS > 0 && nemo_moe) { /* up, squared ReLU, down: no gate */
                L->up_shexp = KG_T("ffn_up_shexp.weight", E, FS, false);
                L->down_shexp = KG_T("ffn_down_shexp.weight", FS, E, false);
            } else if (FS > 0) {
                L->gate_shexp = KG_T("ffn_gate_shexp.weight", E, FS, false);
                L->up_shexp = KG_T("ffn_up_shexp.weight", E, FS, false);
                L->down_shexp = KG_T("ffn_down_shexp.weight", FS, E, false);
            }
        }
#define KG_T3(suffix, ne0, ne1)                                                                    \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     find_tensor3(ld, name, (ne0), (ne1), X, &bad))
        if (!nemo_moe) { /* nemotron_h_moe's experts have no gate */
            L->gate_exps = KG_T3("ffn_gate_exps.weight", E, FX);
        }
        L->up_exps = KG_T3("ffn_up_exps.weight", E, FX);
        L->down_exps = KG_T3("ffn_down_exps.weight", FX, E);
#undef KG_T3
        if (oss) {
            L->ffn_gate_inp_b = KG_T("ffn_gate_inp.bias", X, 0, false);
            L->gate_exps_b = KG_T("ffn_gate_exps.bias", FX, X, false);
            L->up_exps_b = KG_T("ffn_up_exps.bias", FX, X, false);
            L->down_exps_b = KG_T("ffn_down_exps.bias", E, X, false);
            const kg_gguf_tensor_t *vecs[] = {L->ffn_gate_inp_b, L->gate_exps_b, L->up_exps_b,
                                              L->down_exps_b, L->attn_sinks};
            for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]) && !bad; i++) {
                if (vecs[i] && kg_type_block_elems(vecs[i]->type) != 1) {
                    snprintf(ld->errstr, ld->errstr_size,
                             "model: blk.%d.%.*s is %s; biases and sinks must be F32, F16 or BF16",
                             (int)il, (int)vecs[i]->name.len, vecs[i]->name.data,
                             kg_ggml_type_name(vecs[i]->type));
                    bad = true;
                }
            }
        }
        if (!bad) {
            if (L->gate_exps) {
                make_expert_views(exp_views, L->gate_exps);
                L->exp_gate = exp_views;
            }
            make_expert_views(exp_views + X, L->up_exps);
            make_expert_views(exp_views + 2 * X, L->down_exps);
            L->exp_up = exp_views + X;
            L->exp_down = exp_views + 2 * X;
        }
    } else if (a == KG_ARCH_PHI3) {
        const kg_gguf_tensor_t *up = KG_T("ffn_up.weight", E, 2 * F, false);
        if (up) {
            /* ggml_swiglu on the fused output: silu(first half) * second half */
            L->w_gate = make_view(&views[6], up, 0, F, 0);
            L->w_up = make_view(&views[7], up, F, F, 0);
        }
    } else if (hp->ffn_act == KG_FFN_XIELU || hp->ffn_act == KG_FFN_RELU_SQR) { /* no gate */
        L->w_up = KG_T("ffn_up.weight", E, F, false);
    } else {
        L->w_gate = KG_T("ffn_gate.weight", E, F, false);
        L->w_up = KG_T("ffn_up.weight", E, F, false);
    }
    if (!moe_layer) {
        L->w_down = KG_T("ffn_down.weight", F, E, false);
    }
done:
#undef KG_T
    if (!bad && (!L->bq != !L->bk || !L->bq != !L->bv)) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: layer %d has some but not all of the Q/K/V biases", (int)il);
        bad = true;
    }
    return !bad;
}

/* Sentence-Transformers' dense projections (llama_model_gemma_embedding's
 * optional dense_2 / dense_3, sized by <arch>.dense_{2,3}_feat_{in,out}):
 * both or neither, n_embd -> n_dense -> n_embd, as EmbeddingGemma's are.
 * llama.cpp would take one alone, which leaves vectors of another width
 * than n_embd; kgen refuses that. */
static bool load_dense(loader_t *ld, kg_model_t *model, const char *arch) {
    const int64_t E = model->hp.n_embd;
    int32_t f[4] = {0, 0, 0, 0}; /* dense_2 in, out; dense_3 in, out */
    static const char *const names[4] = {"dense_2_feat_in", "dense_2_feat_out", "dense_3_feat_in",
                                         "dense_3_feat_out"};
    char key[160];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "%s.%s", arch, names[i]);
        if (kg_gguf_find_key(ld->g, key) >= 0 && (!get_i32(ld->g, key, &f[i]) || f[i] <= 0)) {
            snprintf(ld->errstr, ld->errstr_size, "model: bad hyperparameter '%s'", key);
            return false;
        }
    }
    const bool has2 = kg_gguf_find_tensor(ld->g, "dense_2.weight") != NULL;
    const bool has3 = kg_gguf_find_tensor(ld->g, "dense_3.weight") != NULL;
    if (!has2 && !has3) {
        return true;
    }
    if (!has2 || !has3 || f[0] != E || f[3] != E || f[1] != f[2] || f[1] <= 0 || f[1] > (1 << 20)) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: the dense projections must come together, n_embd (%lld) -> N -> n_embd, "
                 "with %s.dense_{2,3}_feat_{in,out} saying so (dense_2 %s, dense_3 %s; %d -> %d, "
                 "%d -> %d)",
                 (long long)E, arch, has2 ? "present" : "absent", has3 ? "present" : "absent", f[0],
                 f[1], f[2], f[3]);
        return false;
    }
    bool bad = false;
    model->dense_2 = find_tensor(ld, "dense_2.weight", E, f[1], false, &bad);
    model->dense_3 = find_tensor(ld, "dense_3.weight", f[1], E, false, &bad);
    model->n_dense = f[1];
    return !bad;
}

kg_model_t *kg_model_load(const char *path, char *errstr, size_t errstr_size) {
    kg_gguf_t *g = kg_gguf_open(path, errstr, errstr_size);
    return g ? kg_model_load_gguf(g, path, errstr, errstr_size) : NULL;
}

kg_model_t *
kg_model_load_gguf(kg_gguf_t *gguf, const char *path, char *errstr, size_t errstr_size) {
    kg_model_t *model = calloc(1, sizeof(*model));
    loader_t ld = {.errstr = errstr, .errstr_size = errstr_size};
    bool *is_swa = NULL;
    kg_layer_kind_t *kinds = NULL;
    char key[256];
    if (!model) {
        snprintf(errstr, errstr_size, "model: out of memory");
        kg_gguf_free(gguf);
        return NULL;
    }
    model->gguf = gguf;
    const kg_gguf_t *g = model->gguf;
    ld.g = g;
    kg_gguf_str_t s;
    char arch[64] = "";
    if (!kg_gguf_get_str(g, "general.architecture", &s) || s.len == 0 || s.len >= sizeof(arch)) {
        snprintf(errstr, errstr_size, "model: %s has no general.architecture", path);
        goto fail;
    }
    memcpy(arch, s.data, s.len);
    arch[s.len] = '\0';
    kg_hparams_t *hp = &model->hp;
    hp->arch = KG_ARCH_COUNT_;
    for (int a = 0; a < KG_ARCH_COUNT_; a++) {
        if (strcmp(arch, arch_names[a]) == 0) {
            hp->arch = (kg_arch_t)a;
        }
    }
    if (hp->arch == KG_ARCH_COUNT_) {
        snprintf(errstr, errstr_size,
                 "model: unsupported architecture '%s' (supported: " SUPPORTED_ARCHS ")", arch);
        goto fail;
    }
    if (hp->arch == KG_ARCH_BERT || hp->arch == KG_ARCH_NOMIC_BERT) { /* encoders: their own */
        if (!kg_model_load_bert(model, path, errstr, errstr_size)) {
            goto fail;
        }
        return model;
    }

    if (!get_i32(g, akey(key, sizeof(key), arch, "embedding_length"), &hp->n_embd) ||
        !get_i32(g, akey(key, sizeof(key), arch, "block_count"), &hp->n_layer) ||
        /* Gemma 4's may be per layer (E2B's double-wide kv-shared layers):
         * the widest sizes the buffers, each layer has its own */
        /* nemotron_h's is per layer, 0 where a layer has no FFN
         * (kg_model_read_recurrent reads it) */
        !(hp->arch == KG_ARCH_NEMOTRON_H || hp->arch == KG_ARCH_NEMOTRON_H_MOE ||
          kg_model_get_count(g, akey(key, sizeof(key), arch, "feed_forward_length"),
                             hp->arch == KG_ARCH_GEMMA4, &hp->n_ff)) ||
        !get_i32(g, akey(key, sizeof(key), arch, "attention.head_count"), &hp->n_head)) {
        snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
        goto fail;
    }
    /* block_count includes the next-token-prediction blocks (glm4moe's
     * nextn): the trunk is the blocks before them */
    if (!get_i32_opt_key(g, akey(key, sizeof(key), arch, "nextn_predict_layers"),
                         &hp->n_layer_nextn) ||
        hp->n_layer_nextn >= hp->n_layer) {
        snprintf(errstr, errstr_size,
                 "model: %s must be a non-negative integer below block_count (%d)", key,
                 hp->n_layer);
        goto fail;
    }
    if (hp->n_layer_nextn > 0 && hp->arch != KG_ARCH_GLM4MOE && hp->arch != KG_ARCH_DEEPSEEK2 &&
        hp->arch != KG_ARCH_QWEN35 && hp->arch != KG_ARCH_QWEN35MOE &&
        hp->arch != KG_ARCH_QWEN3NEXT) {
        snprintf(errstr, errstr_size,
                 "model: %s with next-token-prediction blocks (%s) is not supported (glm4moe's, "
                 "deepseek2's and qwen35's are skipped)",
                 arch, key);
        goto fail;
    }
    hp->n_layer -= hp->n_layer_nextn;
    hp->n_head_kv = hp->n_head;
    get_i32(g, akey(key, sizeof(key), arch, "attention.head_count_kv"), &hp->n_head_kv);
    hp->n_ctx_train = 2048;
    get_i32(g, akey(key, sizeof(key), arch, "context_length"), &hp->n_ctx_train);
    hp->head_dim = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    get_i32(g, akey(key, sizeof(key), arch, "attention.key_length"), &hp->head_dim);
    int32_t v_len = hp->head_dim;
    get_i32(g, akey(key, sizeof(key), arch, "attention.value_length"), &v_len);
    /* MLA: value_length is the latent's rank (kg_model_read_mla checks it) */
    if (v_len != hp->head_dim && hp->arch != KG_ARCH_DEEPSEEK2) {
        snprintf(errstr, errstr_size,
                 "model: attention.value_length %d != key_length %d unsupported", v_len,
                 hp->head_dim);
        goto fail;
    }
    hp->n_rot = hp->head_dim;
    get_i32(g, akey(key, sizeof(key), arch, "rope.dimension_count"), &hp->n_rot);
    hp->norm_eps = 1e-5f;
    if (!get_i32(g, akey(key, sizeof(key), arch, "pooling_type"), &hp->pooling_type)) {
        hp->pooling_type = -1;
    }
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.layer_norm_rms_epsilon"),
                    &hp->norm_eps);
    if (!kg_model_read_rope(g, arch, hp, errstr, errstr_size)) {
        goto fail;
    }
    if (hp->n_layer <= 0 || hp->n_layer > 4096) {
        snprintf(errstr, errstr_size, "model: bad hyperparameters: block_count %d", hp->n_layer);
        goto fail;
    }
    is_swa = calloc((size_t)hp->n_layer, sizeof(*is_swa));
    if (!is_swa) {
        snprintf(errstr, errstr_size, "model: out of memory");
        goto fail;
    }
    float swa_base, swa_scale;
    int32_t nope_every;
    if (!kg_model_read_arch_hparams(g, arch, hp, is_swa, &swa_base, &swa_scale, &nope_every, errstr,
                                    errstr_size) ||
        !kg_model_read_moe_hparams(g, arch, hp, errstr, errstr_size)) {
        goto fail;
    }
    kinds = calloc((size_t)hp->n_layer, sizeof(*kinds));
    if (!kinds) {
        snprintf(errstr, errstr_size, "model: out of memory");
        goto fail;
    }
    if (!kg_model_read_recurrent(g, arch, hp, kinds, errstr, errstr_size)) {
        goto fail;
    }
    for (int32_t il = 0; hp->arch == KG_ARCH_LFM2 && il < hp->n_layer; il++) {
        is_swa[il] = hp->n_swa > 0 && kinds[il] == KG_LAYER_ATTN;
    }

    model->tok = kg_tokenizer_new(g, errstr, errstr_size);
    if (!model->tok) {
        goto fail;
    }
    hp->n_vocab = kg_tokenizer_n_vocab(model->tok);
    if (!kg_model_check_hparams(hp, errstr, errstr_size)) {
        goto fail;
    }

    ld.used = calloc((size_t)kg_gguf_n_tensors(g) + 1, sizeof(*ld.used));
    model->layers = calloc((size_t)hp->n_layer, sizeof(*model->layers));
    model->views = calloc((size_t)hp->n_layer * 8, sizeof(*model->views));
    model->expert_views =
        calloc((size_t)hp->n_layer * 3 * (size_t)hp->n_expert + 1, sizeof(*model->expert_views));
    model->mla_views = calloc(hp->n_lora_kv > 0 ? (size_t)hp->n_layer * 2 * (size_t)hp->n_head : 1,
                              sizeof(*model->mla_views));
    if (!ld.used || !model->layers || !model->views || !model->expert_views || !model->mla_views) {
        snprintf(errstr, errstr_size, "model: out of memory");
        goto fail;
    }
    bool bad = false;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    model->tok_embd = find_tensor(&ld, "token_embd.weight", E, V, false, &bad);
    /* LFM2's final norm is named token_embd_norm (llama.cpp's
     * LLM_TENSOR_OUTPUT_NORM_LFM2: a converter's naming, kept for its files) */
    const bool lfm2 = hp->arch == KG_ARCH_LFM2 || hp->arch == KG_ARCH_LFM2MOE;
    model->output_norm =
        find_tensor(&ld, lfm2 ? "token_embd_norm.weight" : "output_norm.weight", E, 0, false, &bad);
    if (bad) {
        goto fail;
    }
    /* Gemma 2's head is always the embedding (llama.cpp ignores an
     * output.weight there); the others use output.weight when present */
    /* llama.cpp requires it for these */
    const bool output_optional = hp->arch != KG_ARCH_GPT_OSS && hp->arch != KG_ARCH_OLMO2;
    model->output = find_tensor(&ld, "output.weight", E, V, output_optional, &bad);
    if (hp->arch == KG_ARCH_GEMMA2) {
        model->output = NULL;
    }
    if (!model->output && !bad) {
        model->output = model->tok_embd;
        hp->tied = true;
    }
    if (hp->arch == KG_ARCH_QWEN2) {
        model->output_b = find_tensor(&ld, "output.bias", V, 0, true, &bad);
    }
    const kg_gguf_tensor_t *cls = kg_gguf_find_tensor(g, "cls.output.weight");
    if (cls && hp->arch == KG_ARCH_QWEN3 && cls->n_dims == 2 && cls->ne[1] <= 64) {
        model->cls_out = find_tensor(&ld, "cls.output.weight", E, cls->ne[1], false, &bad);
        model->n_cls_out = (int32_t)cls->ne[1];
    }
    if (hp->arch == KG_ARCH_LLAMA || hp->arch == KG_ARCH_MISTRAL || hp->arch == KG_ARCH_GRANITE ||
        hp->arch == KG_ARCH_MISTRAL3 || hp->arch == KG_ARCH_APERTUS ||
        hp->arch == KG_ARCH_GRANITEHYBRID || hp->arch == KG_ARCH_LLAMA4) { /* Llama 3.1's */
        model->rope_freqs = find_tensor(&ld, "rope_freqs.weight", hp->n_rot / 2, 0, true, &bad);
    }
    if (hp->arch == KG_ARCH_LLAMA || hp->arch == KG_ARCH_PHI3) {
        model->rope_long =
            find_tensor(&ld, "rope_factors_long.weight", hp->n_rot / 2, 0, true, &bad);
        model->rope_short =
            find_tensor(&ld, "rope_factors_short.weight", hp->n_rot / 2, 0, true, &bad);
        if (!bad && !model->rope_long != !model->rope_short) {
            snprintf(errstr, errstr_size,
                     "model: rope_factors_long and rope_factors_short come together");
            bad = true;
        }
    }
    if (hp->ffn_act == KG_FFN_XIELU && !kg_model_read_xielu(g, model, errstr, errstr_size)) {
        goto fail;
    }
    if (hp->arch == KG_ARCH_GEMMA_EMBED && !load_dense(&ld, model, arch)) {
        goto fail;
    }
    const bool gemma4 = hp->arch == KG_ARCH_GEMMA4;
    if (gemma4 && !kg_model_gemma4_inputs(&ld, model)) {
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer && !bad; il++) {
        kg_layer_weights_t *L = &model->layers[il];
        L->n_swa = is_swa[il] ? hp->n_swa : 0;
        L->head_dim = hp->head_dim;
        L->n_head_kv = hp->n_head_kv;
        L->n_rot = hp->n_rot;
        L->kv_layer = il;
        L->kind = kinds[il];
        /* nemotron_h: a mixer layer has no FFN, an MLP layer no mixer */
        L->n_ff = (hp->arch == KG_ARCH_NEMOTRON_H || hp->arch == KG_ARCH_NEMOTRON_H_MOE) &&
                          L->kind != KG_LAYER_FFN
                      ? 0
                      : hp->n_ff;
        kg_gguf_tensor_t *exp_views = model->expert_views + (size_t)il * 3 * (size_t)hp->n_expert;
        if (gemma4 ? !kg_model_gemma4_shape(model, il, is_swa[il], errstr, errstr_size) ||
                         !kg_model_gemma4_layer(&ld, model, il, is_swa[il], exp_views)
                   : !load_layer(&ld, model, il, model->views + (size_t)il * 8, exp_views,
                                 model->mla_views + (size_t)il * 2 * (size_t)hp->n_head)) {
            bad = true;
            break;
        }
        L->rope_base = is_swa[il] ? swa_base : hp->rope_base;
        L->rope_scale = is_swa[il] ? swa_scale : hp->rope_scale;
        L->no_rope = nope_every > 0 && (il + 1) % nope_every == 0;
        if (!(L->rope_base > 0.0f) || !(L->rope_scale > 0.0f)) {
            snprintf(errstr, errstr_size, "model: layer %d: RoPE base and scale must be > 0",
                     (int)il);
            bad = true;
        }
    }
    if (bad) {
        goto fail;
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        /* a Gemma 2 file's output.weight is a copy llama.cpp ignores too;
         * the next-token-prediction blocks are for speculative decoding,
         * which kgen does not run (llama.cpp skips them too unless asked) */
        const int32_t blk = tensor_block(t->name);
        const bool nextn = blk >= hp->n_layer && blk < hp->n_layer + hp->n_layer_nextn;
        if (!ld.used[i] && !nextn &&
            !(hp->arch == KG_ARCH_GEMMA2 && str_is(t->name, "output.weight"))) {
            snprintf(errstr, errstr_size,
                     "model: tensor '%.*s' is not part of the %s graph kgen runs (a variant it "
                     "does not support)",
                     (int)(t->name.len > 96 ? 96 : t->name.len), t->name.data, arch);
            goto fail;
        }
    }
    if (kg_gguf_get_str(g, "tokenizer.chat_template.rerank", &s)) {
        model->rerank_template = strndup(s.data, s.len);
        if (!model->rerank_template) {
            snprintf(errstr, errstr_size, "model: out of memory");
            goto fail;
        }
    }
    if (kg_gguf_get_str(g, "tokenizer.chat_template", &s)) {
        model->chat_template = malloc(s.len + 1);
        if (!model->chat_template) {
            snprintf(errstr, errstr_size, "model: out of memory");
            goto fail;
        }
        memcpy(model->chat_template, s.data, s.len);
        model->chat_template[s.len] = '\0';
    }
    free(ld.used);
    free(is_swa);
    free(kinds);
    return model;
fail:
    free(ld.used);
    free(is_swa);
    free(kinds);
    kg_model_free(model);
    return NULL;
}

void kg_model_free(kg_model_t *model) {
    if (!model) {
        return;
    }
    kg_tokenizer_free(model->tok);
    kg_gguf_free(model->gguf);
    free(model->layers);
    free(model->views);
    free(model->expert_views);
    free(model->mla_views);
    free(model->chat_template);
    free(model->rerank_template);
    free(model->bert);
    free(model);
}

// ---- queries ----

uint32_t kg_model_features(const kg_model_t *model) {
    const kg_hparams_t *hp = &model->hp;
    uint32_t f = 0;
    if (hp->rope_mode == KG_ROPE_MODE_NEOX) {
        f |= KG_MODEL_FEAT_ROPE_NEOX;
    }
    if (hp->n_rot != hp->head_dim) {
        f |= KG_MODEL_FEAT_ROPE_PARTIAL;
    }
    if (hp->ffn_act == KG_FFN_GELU) {
        f |= KG_MODEL_FEAT_GELU;
    }
    if (hp->embd_scale != 0.0f) {
        f |= KG_MODEL_FEAT_EMBD_SCALE;
    }
    if (hp->attn_softcap != 0.0f || hp->final_softcap != 0.0f) {
        f |= KG_MODEL_FEAT_SOFTCAP;
    }
    if (hp->q_scale != 0.0f) {
        f |= KG_MODEL_FEAT_Q_SCALE;
    }
    if (hp->yarn_ext_factor != 0.0f || hp->yarn_attn_factor != 1.0f) {
        f |= KG_MODEL_FEAT_ROPE_YARN;
    }
    if (model->rope_long) {
        f |= KG_MODEL_FEAT_ROPE_FACTORS;
    }
    if (model->output_b) {
        f |= KG_MODEL_FEAT_QKV_BIAS;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *L = &model->layers[il];
        if (L->bq || L->bo) {
            f |= KG_MODEL_FEAT_QKV_BIAS;
        }
        if (L->q_norm || L->k_norm) {
            f |= KG_MODEL_FEAT_QK_NORM;
        }
        if (L->attn_post_norm || L->ffn_post_norm) {
            f |= KG_MODEL_FEAT_POST_NORM;
        }
        if (L->n_swa > 0) {
            f |= KG_MODEL_FEAT_SLIDING_WINDOW;
        }
        if (L->rope_base != hp->rope_base || L->rope_scale != hp->rope_scale) {
            f |= KG_MODEL_FEAT_ROPE_PER_LAYER;
        }
        if (L->ffn_gate_inp) {
            f |= KG_MODEL_FEAT_MOE;
        }
        if (L->ffn_gate_inp_b || L->gate_exps_b || L->up_exps_b || L->down_exps_b) {
            f |= KG_MODEL_FEAT_MOE_OAI;
        }
        if (L->attn_sinks) {
            f |= KG_MODEL_FEAT_ATTN_SINKS;
        }
        if (L->exp_probs_b) {
            f |= KG_MODEL_FEAT_MOE_SIGMOID;
        }
        if (L->gate_shexp) {
            f |= KG_MODEL_FEAT_SHARED_EXPERT;
        }
        if (L->no_rope) {
            f |= KG_MODEL_FEAT_NOPE;
        }
        if (!L->attn_norm || !L->ffn_norm) {
            f |= KG_MODEL_FEAT_NO_PRE_NORM;
        }
    }
    if (hp->n_lora_kv > 0) {
        f |= KG_MODEL_FEAT_MLA;
    }
    if (hp->qk_norm_full) {
        f |= KG_MODEL_FEAT_QK_NORM_FULL;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) { /* Gemma 4 */
        const kg_layer_weights_t *L = &model->layers[il];
        if (L->head_dim != hp->head_dim || L->n_head_kv != hp->n_head_kv || L->n_rot != hp->n_rot ||
            L->n_ff != hp->n_ff || L->rope_freqs) {
            f |= KG_MODEL_FEAT_HEAD_PER_LAYER;
        }
        if (L->kv_layer != il) {
            f |= KG_MODEL_FEAT_KV_SHARED;
        }
        if (L->out_scale != 0.0f || L->ffn_pre_norm_2) {
            f |= KG_MODEL_FEAT_V_NORM;
        }
    }
    if (model->pl_tok_embd) {
        f |= KG_MODEL_FEAT_PER_LAYER_EMBD;
    }
    if (hp->v_norm) {
        f |= KG_MODEL_FEAT_V_NORM;
    }
    if (hp->attn_temp_scale != 0.0f) {
        f |= KG_MODEL_FEAT_ATTN_TEMP;
    }
    if (hp->ffn_act == KG_FFN_XIELU) {
        f |= KG_MODEL_FEAT_XIELU;
    }
    if (hp->kq_scale != 0.0f || hp->residual_scale != 0.0f || hp->logit_scale != 0.0f) {
        f |= KG_MODEL_FEAT_SCALES;
    }
    if (hp->n_expert > 0 &&
        (hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT || hp->ffn_act != KG_FFN_SILU)) {
        f |= KG_MODEL_FEAT_MOE_OAI;
    }
    if (hp->n_expert > 0 && (hp->moe_gating == KG_MOE_SIGMOID || hp->n_expert_groups > 1)) {
        f |= KG_MODEL_FEAT_MOE_SIGMOID;
    }
    if (kg_model_embed_only(model)) {
        f |= KG_MODEL_FEAT_ENCODER;
    } else if (kg_model_non_causal(model)) {
        /* not the encoder bit: a backend that runs bert's encoder may still
         * have no non-causal path through its decoder layers (CUDA) */
        f |= KG_MODEL_FEAT_BIDIR;
    }
    return f;
}

bool kg_model_non_causal(const kg_model_t *model) {
    return kg_model_embed_only(model) || model->hp.non_causal;
}

const char *kg_model_feature_names(uint32_t mask, char *buf, size_t cap) {
    static const char *const names[] = {
        "qkv_bias",   "qk_norm",        "post_norm",      "gelu",          "embd_scale",
        "softcap",    "sliding_window", "rope_neox",      "rope_partial",  "rope_per_layer",
        "rope_yarn",  "rope_factors",   "q_scale",        "moe",           "moe_oai",
        "attn_sinks", "nope",           "scales",         "no_pre_norm",   "qk_norm_full",
        "attn_temp",  "xielu",          "moe_sigmoid",    "shared_expert", "mla",
        "encoder",    "bidirectional",  "head_per_layer", "kv_shared",     "per_layer_embd",
        "v_norm",
    };
    size_t n = 0;
    if (cap == 0) {
        return buf;
    }
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((mask & (1u << i)) && names[i]) {
            int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", names[i]);
            if (w < 0 || (size_t)w >= cap - n) {
                break;
            }
            n += (size_t)w;
        }
    }
    return buf;
}

int32_t kg_model_kv_window(const kg_model_t *model) {
    int32_t w = 0;
    if (model->hp.non_causal) {
        return 0; /* a symmetric window reaches forward too; an input runs whole anyway */
    }
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        if (model->layers[il].kind != KG_LAYER_ATTN) {
            continue; /* a recurrent layer reads no K/V rows */
        }
        if (model->layers[il].n_swa <= 0) {
            return 0;
        }
        w = model->layers[il].n_swa > w ? model->layers[il].n_swa : w;
    }
    return w;
}

const kg_gguf_tensor_t *kg_model_rope_factors(const kg_model_t *model, int32_t n_ctx_seq) {
    if (model->rope_freqs) {
        return model->rope_freqs;
    }
    if (!model->rope_long) {
        return NULL;
    }
    return n_ctx_seq > model->hp.n_ctx_orig ? model->rope_long : model->rope_short;
}
