/* kg_model_bert: load a `bert` or `nomic-bert` GGUF (see kg_model_bert.h):
 * llama.cpp's keys, defaults and tensor names, every shape checked, and no
 * tensor left over that the graph would not use. */
#include "kg_model_bert.h"

#include "kg_model_int.h"
#include "kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bert_loader {
    const kg_gguf_t *g;
    bool *used;
    char *errstr;
    size_t errstr_size;
    bool bad;
} bert_loader_t;

/* A tensor of shape (ne0) (ne1 0) or (ne0, ne1); NULL when absent
 * (an error unless optional) or misshapen (always an error). */
static const kg_gguf_tensor_t *
bt(bert_loader_t *ld, const char *name, int64_t ne0, int64_t ne1, bool optional) {
    if (ld->bad) {
        return NULL;
    }
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(ld->g, name);
    if (!t) {
        if (!optional) {
            snprintf(ld->errstr, ld->errstr_size, "model: missing tensor '%s'", name);
            ld->bad = true;
        }
        return NULL;
    }
    /* a one-row matrix may be stored as a vector (a one-label head) */
    const bool ok = ne1 == 0 ? t->n_dims == 1 && t->ne[0] == ne0
                    : ne1 == 1
                        ? t->ne[0] == ne0 && (t->n_dims == 1 || (t->n_dims == 2 && t->ne[1] == 1))
                        : t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1;
    if (!ok) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]", name,
                 (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 0), t->n_dims,
                 (long long)ne0, (long long)ne1);
        ld->bad = true;
        return NULL;
    }
    /* vectors are added or multiplied elementwise: a float type only */
    if (ne1 == 0 && kg_type_block_elems(t->type) != 1) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: tensor '%s' is %s; vectors must be F32, F16 or BF16", name,
                 kg_ggml_type_name(t->type));
        ld->bad = true;
        return NULL;
    }
    ld->used[t - kg_gguf_tensor(ld->g, 0)] = true;
    return t;
}

/* Row view [row0, row0 + n) of a fused matrix, or (is_vec) elements
 * [row0, row0 + n) of a fused vector: rows of every ggml type are whole
 * blocks, so a view is a plain tensor of the same type. */
static const kg_gguf_tensor_t *fused_view(
    kg_gguf_tensor_t *view, const kg_gguf_tensor_t *t, int64_t row0, int64_t n, bool is_vec) {
    *view = *t;
    if (!is_vec) {
        const size_t row_size = kg_type_row_size(t->type, t->ne[0]);
        view->ne[1] = n;
        view->data = (const char *)t->data + (size_t)row0 * row_size;
        view->size = (size_t)n * row_size;
    } else {
        const size_t elem = kg_type_row_size(t->type, t->ne[0]) / (size_t)t->ne[0];
        view->ne[0] = n;
        view->data = (const char *)t->data + (size_t)row0 * elem;
        view->size = (size_t)n * elem;
    }
    return view;
}

static bool read_hparams(kg_model_t *model, const char *arch, char *errstr, size_t errstr_size) {
    const kg_gguf_t *g = model->gguf;
    kg_hparams_t *hp = &model->hp;
    const bool nomic = hp->arch == KG_ARCH_NOMIC_BERT;
    char key[128];
    const char *bad = NULL;
    if (!get_i32(g, akey(key, sizeof(key), arch, "context_length"), &hp->n_ctx_train) ||
        !get_i32(g, akey(key, sizeof(key), arch, "embedding_length"), &hp->n_embd) ||
        !get_i32(g, akey(key, sizeof(key), arch, "block_count"), &hp->n_layer) ||
        !get_i32(g, akey(key, sizeof(key), arch, "feed_forward_length"), &hp->n_ff) ||
        !get_i32(g, akey(key, sizeof(key), arch, "attention.head_count"), &hp->n_head) ||
        !kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.layer_norm_epsilon"),
                         &hp->norm_eps)) {
        snprintf(errstr, errstr_size,
                 "model: %s needs context_length, embedding_length, block_count, "
                 "feed_forward_length, attention.head_count and attention.layer_norm_epsilon",
                 arch);
        return false;
    }
    hp->n_head_kv = hp->n_head;
    if (!get_i32_opt_key(g, akey(key, sizeof(key), arch, "attention.head_count_kv"),
                         &hp->n_head_kv)) {
        snprintf(errstr, errstr_size, "model: bad %s", key);
        return false;
    }
    if (!get_i32(g, akey(key, sizeof(key), arch, "pooling_type"), &hp->pooling_type)) {
        hp->pooling_type = -1;
    }
    bool causal = false;
    if (kg_gguf_get_bool(g, akey(key, sizeof(key), arch, "attention.causal"), &causal) && causal) {
        snprintf(errstr, errstr_size,
                 "model: %s with attention.causal true is not supported (kgen runs it as the "
                 "encoder it is)",
                 arch);
        return false;
    }
    hp->head_dim = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    hp->n_rot = hp->head_dim;
    hp->rope_base = 10000.0f; /* unused by bert, which has absolute positions */
    hp->rope_scale = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->yarn_attn_factor = 1.0f;
    hp->ffn_act = KG_FFN_GELU;
    hp->tied = false;
    if (nomic) {
        /* llama.cpp's load_hparams (the RoPE keys every family has, NeoX
         * pairs for nomic-bert: llama_model_rope_type) and the SwiGLU of
         * bert.cpp's graph for nomic-bert */
        if (!kg_model_read_rope(g, arch, hp, errstr, errstr_size)) {
            return false;
        }
        if (hp->rope_scaling == KG_ROPE_SCALING_LONGROPE) {
            snprintf(errstr, errstr_size,
                     "model: nomic-bert with LongRoPE is not supported (its factors are not "
                     "part of the graph)");
            return false;
        }
        hp->rope_mode = KG_ROPE_MODE_NEOX;
        if (!get_i32_opt_key(g, akey(key, sizeof(key), arch, "rope.dimension_count"), &hp->n_rot)) {
            snprintf(errstr, errstr_size, "model: bad %s", key);
            return false;
        }
        hp->ffn_act = KG_FFN_SILU;
    }
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_ff <= 0 ||
        hp->n_ctx_train <= 0) {
        bad = "context_length, embedding_length, block_count, head_count and feed_forward_length "
              "must be > 0";
    } else if (hp->n_layer > 4096 || hp->n_embd > (1 << 20) || hp->n_ff > (1 << 24) ||
               hp->n_ctx_train > (1 << 20)) {
        bad = "a hyperparameter is implausibly large";
    } else if (hp->n_embd % hp->n_head != 0 || hp->n_head_kv != hp->n_head) {
        bad = "embedding_length must be a multiple of head_count, and head_count_kv equal to it";
    } else if (!(hp->norm_eps > 0.0f) || !(hp->norm_eps < 1.0f)) {
        bad = "layer_norm_epsilon must be in (0, 1)";
    } else if (hp->pooling_type > 4) {
        bad = "pooling_type must be 0 (none) to 4 (rank)";
    } else if (nomic && (hp->n_rot <= 0 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)) {
        bad = "rope.dimension_count must be even, > 0 and at most the head width";
    } else if (nomic && !(hp->rope_base > 0.0f && isfinite(hp->rope_base))) {
        bad = "rope.freq_base must be > 0";
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad %s hyperparameters: %s", arch, bad);
        return false;
    }
    return true;
}

/* One layer's Q/K/V, separate or fused (llama.cpp's create_tensor_qkv:
 * attn_qkv.weight, with attn_qkv.bias or else the three separate biases,
 * each optional), cut into row views (`views`, 6 of them) so the backend
 * sees separate matrices. */
static void
load_qkv(bert_loader_t *ld, kg_layer_weights_t *L, int32_t il, int64_t E, kg_gguf_tensor_t *views) {
    char name[96];
#define BT(suffix, ne0, ne1, opt)                                                                  \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il), bt(ld, name, (ne0), (ne1), (opt)))
    snprintf(name, sizeof(name), "blk.%d.attn_qkv.weight", (int)il);
    if (kg_gguf_find_tensor(ld->g, name)) {
        const kg_gguf_tensor_t *w = BT("attn_qkv.weight", E, 3 * E, false);
        const kg_gguf_tensor_t *b = BT("attn_qkv.bias", 3 * E, 0, true);
        if (w) {
            L->wq = fused_view(&views[0], w, 0, E, false);
            L->wk = fused_view(&views[1], w, E, E, false);
            L->wv = fused_view(&views[2], w, 2 * E, E, false);
        }
        if (b) {
            L->bq = fused_view(&views[3], b, 0, E, true);
            L->bk = fused_view(&views[4], b, E, E, true);
            L->bv = fused_view(&views[5], b, 2 * E, E, true);
            return;
        }
    } else {
        L->wq = BT("attn_q.weight", E, E, false);
        L->wk = BT("attn_k.weight", E, E, false);
        L->wv = BT("attn_v.weight", E, E, false);
    }
    L->bq = BT("attn_q.bias", E, 0, true);
    L->bk = BT("attn_k.bias", E, 0, true);
    L->bv = BT("attn_v.bias", E, 0, true);
    /* with a fused weight llama.cpp adds separate biases only when all three
     * are there: one or two would be loaded and silently left out */
    if (L->wq == &views[0] && !ld->bad && (!L->bq || !L->bk || !L->bv) &&
        (L->bq || L->bk || L->bv)) {
        snprintf(ld->errstr, ld->errstr_size,
                 "model: blk.%d has a fused attn_qkv.weight with only some of attn_q/k/v.bias",
                 (int)il);
        ld->bad = true;
    }
#undef BT
}

bool kg_model_load_bert(kg_model_t *model, const char *path, char *errstr, size_t errstr_size) {
    const kg_gguf_t *g = model->gguf;
    kg_hparams_t *hp = &model->hp;
    const bool nomic = hp->arch == KG_ARCH_NOMIC_BERT;
    const char *arch = kg_arch_name(hp->arch);
    if (!read_hparams(model, arch, errstr, errstr_size)) {
        return false;
    }
    model->tok = kg_tokenizer_new(g, errstr, errstr_size);
    if (!model->tok) {
        return false;
    }
    hp->n_vocab = kg_tokenizer_n_vocab(model->tok);
    uint32_t n_types = 0;
    if (!kg_gguf_get_u32(g, "tokenizer.ggml.token_type_count", &n_types) || n_types == 0 ||
        n_types > 1024) {
        /* llama.cpp: "model needs to define token type count" */
        snprintf(errstr, errstr_size,
                 "model: %s: %s needs tokenizer.ggml.token_type_count (1 to 1024)", path, arch);
        return false;
    }
    /* classifier labels set the head's width, else 1 (llama.cpp's n_cls_out) */
    kg_gguf_type_t et;
    uint64_t n_labels = 0;
    int64_t n_cls_out = 1;
    char key[128];
    if (kg_gguf_get_arr(g, akey(key, sizeof(key), arch, "classifier.output_labels"), &et,
                        &n_labels) &&
        n_labels > 0) {
        n_cls_out = (int64_t)n_labels;
    }
    if (n_cls_out > 64) {
        snprintf(errstr, errstr_size, "model: more than 64 classifier labels");
        return false;
    }

    const int64_t E = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    bert_loader_t ld = {.g = g, .errstr = errstr, .errstr_size = errstr_size};
    ld.used = calloc((size_t)kg_gguf_n_tensors(g) + 1, sizeof(*ld.used));
    model->layers = calloc((size_t)hp->n_layer, sizeof(*model->layers));
    model->views = calloc((size_t)hp->n_layer * 6, sizeof(*model->views));
    model->bert = calloc(1, sizeof(*model->bert) + (size_t)hp->n_layer * sizeof(kg_bert_layer_t));
    if (!ld.used || !model->layers || !model->views || !model->bert) {
        free(ld.used);
        snprintf(errstr, errstr_size, "model: out of memory");
        return false;
    }
    struct kg_bert_weights *b = model->bert;
    b->n_token_types = (int32_t)n_types;
    model->tok_embd = bt(&ld, "token_embd.weight", E, V, false);
    b->type_embd = bt(&ld, "token_types.weight", E, n_types, true);
    b->tok_norm = bt(&ld, "token_embd_norm.weight", E, 0, false);
    b->tok_norm_b = bt(&ld, "token_embd_norm.bias", E, 0, false);
    if (!nomic) {
        /* nomic-bert's loader takes neither: RoPE, and no classification head */
        b->pos_embd = bt(&ld, "position_embd.weight", E, hp->n_ctx_train, false);
        b->cls = bt(&ld, "cls.weight", E, E, true);
        b->cls_b = bt(&ld, "cls.bias", E, 0, true);
        model->cls_out = bt(&ld, "cls.output.weight", E, n_cls_out, true);
        b->cls_out_b = bt(&ld, "cls.output.bias", n_cls_out, 0, true);
    }
    model->n_cls_out = model->cls_out ? (int32_t)n_cls_out : 0;
    char name[96];
    for (int32_t il = 0; il < hp->n_layer && !ld.bad; il++) {
        kg_layer_weights_t *L = &model->layers[il];
        kg_bert_layer_t *BL = &b->layers[il];
#define BT(suffix, ne0, ne1, opt)                                                                  \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il), bt(&ld, name, (ne0), (ne1), (opt)))
        load_qkv(&ld, L, il, E, model->views + (size_t)il * 6);
        L->wo = BT("attn_output.weight", E, E, false);
        L->bo = BT("attn_output.bias", E, 0, true);
        BL->attn_out_norm = BT("attn_output_norm.weight", E, 0, false);
        BL->attn_out_norm_b = BT("attn_output_norm.bias", E, 0, false);
        L->w_up = BT("ffn_up.weight", E, F, false);
        BL->ffn_up_b = BT("ffn_up.bias", F, 0, true);
        L->w_down = BT("ffn_down.weight", F, E, false);
        BL->ffn_down_b = BT("ffn_down.bias", E, 0, true);
        if (nomic) {
            L->w_gate = BT("ffn_gate.weight", E, F, false);
            /* llama.cpp's nomic-bert loader takes these two optional biases
             * and its SwiGLU never adds them: taken and ignored alike */
            BL->ffn_up_b = NULL;
            BL->ffn_down_b = NULL;
        }
        BL->layer_out_norm = BT("layer_output_norm.weight", E, 0, false);
        BL->layer_out_norm_b = BT("layer_output_norm.bias", E, 0, false);
#undef BT
        L->rope_base = hp->rope_base;
        L->rope_scale = hp->rope_scale;
        L->n_rot = hp->n_rot;
        L->head_dim = hp->head_dim;
        L->n_head_kv = hp->n_head_kv;
        L->n_ff = hp->n_ff;
        L->kv_layer = il; /* its own K/V (kg_model_features reads it, as for decoders) */
        L->no_rope = !nomic;
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g) && !ld.bad; i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        if (!ld.used[i]) {
            snprintf(errstr, errstr_size,
                     "model: tensor '%.*s' is not part of the %s graph kgen runs (a variant it "
                     "does not support)",
                     (int)(t->name.len > 96 ? 96 : t->name.len), t->name.data, arch);
            ld.bad = true;
        }
    }
    free(ld.used);
    return !ld.bad;
}

bool kg_model_embed_only(const kg_model_t *model) {
    return model->hp.arch == KG_ARCH_BERT || model->hp.arch == KG_ARCH_NOMIC_BERT;
}
