/* kg_model_bert: load a `bert` GGUF (see kg_model_bert.h): llama.cpp's
 * keys, defaults and tensor names, every shape checked, and no tensor left
 * over that the graph would not use. */
#include "kg_model_bert.h"

#include "kg_model_int.h"
#include "kg_quant.h"

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

static bool read_hparams(kg_model_t *model, char *errstr, size_t errstr_size) {
    const kg_gguf_t *g = model->gguf;
    kg_hparams_t *hp = &model->hp;
    char key[128];
    const char *bad = NULL;
    if (!get_i32(g, "bert.context_length", &hp->n_ctx_train) ||
        !get_i32(g, "bert.embedding_length", &hp->n_embd) ||
        !get_i32(g, "bert.block_count", &hp->n_layer) ||
        !get_i32(g, "bert.feed_forward_length", &hp->n_ff) ||
        !get_i32(g, "bert.attention.head_count", &hp->n_head) ||
        !kg_gguf_get_f32(g, "bert.attention.layer_norm_epsilon", &hp->norm_eps)) {
        snprintf(errstr, errstr_size,
                 "model: bert needs context_length, embedding_length, block_count, "
                 "feed_forward_length, attention.head_count and attention.layer_norm_epsilon");
        return false;
    }
    hp->n_head_kv = hp->n_head;
    if (!get_i32_opt_key(g, akey(key, sizeof(key), "bert", "attention.head_count_kv"),
                         &hp->n_head_kv)) {
        snprintf(errstr, errstr_size, "model: bad %s", key);
        return false;
    }
    if (!get_i32(g, "bert.pooling_type", &hp->pooling_type)) {
        hp->pooling_type = -1;
    }
    bool causal = false;
    if (kg_gguf_get_bool(g, "bert.attention.causal", &causal) && causal) {
        snprintf(errstr, errstr_size,
                 "model: bert with attention.causal true is not supported (kgen runs bert as the "
                 "encoder it is)");
        return false;
    }
    hp->head_dim = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    hp->n_rot = hp->head_dim;
    hp->rope_base = 10000.0f; /* unused: bert has absolute positions */
    hp->rope_scale = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->yarn_attn_factor = 1.0f;
    hp->ffn_act = KG_FFN_GELU;
    hp->tied = false;
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
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad bert hyperparameters: %s", bad);
        return false;
    }
    return true;
}

bool kg_model_load_bert(kg_model_t *model, const char *path, char *errstr, size_t errstr_size) {
    const kg_gguf_t *g = model->gguf;
    kg_hparams_t *hp = &model->hp;
    if (!read_hparams(model, errstr, errstr_size)) {
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
                 "model: %s: bert needs tokenizer.ggml.token_type_count (1 to 1024)", path);
        return false;
    }
    /* classifier labels set the head's width, else 1 (llama.cpp's n_cls_out) */
    kg_gguf_type_t et;
    uint64_t n_labels = 0;
    int64_t n_cls_out = 1;
    if (kg_gguf_get_arr(g, "bert.classifier.output_labels", &et, &n_labels) && n_labels > 0) {
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
    model->bert = calloc(1, sizeof(*model->bert) + (size_t)hp->n_layer * sizeof(kg_bert_layer_t));
    if (!ld.used || !model->layers || !model->bert) {
        free(ld.used);
        snprintf(errstr, errstr_size, "model: out of memory");
        return false;
    }
    struct kg_bert_weights *b = model->bert;
    b->n_token_types = (int32_t)n_types;
    model->tok_embd = bt(&ld, "token_embd.weight", E, V, false);
    b->type_embd = bt(&ld, "token_types.weight", E, n_types, true);
    b->pos_embd = bt(&ld, "position_embd.weight", E, hp->n_ctx_train, false);
    b->tok_norm = bt(&ld, "token_embd_norm.weight", E, 0, false);
    b->tok_norm_b = bt(&ld, "token_embd_norm.bias", E, 0, false);
    b->cls = bt(&ld, "cls.weight", E, E, true);
    b->cls_b = bt(&ld, "cls.bias", E, 0, true);
    model->cls_out = bt(&ld, "cls.output.weight", E, n_cls_out, true);
    b->cls_out_b = bt(&ld, "cls.output.bias", n_cls_out, 0, true);
    model->n_cls_out = model->cls_out ? (int32_t)n_cls_out : 0;
    char name[96];
    for (int32_t il = 0; il < hp->n_layer && !ld.bad; il++) {
        kg_layer_weights_t *L = &model->layers[il];
        kg_bert_layer_t *BL = &b->layers[il];
#define BT(suffix, ne0, ne1, opt)                                                                  \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il), bt(&ld, name, (ne0), (ne1), (opt)))
        if (kg_gguf_find_tensor(
                g, (snprintf(name, sizeof(name), "blk.%d.attn_qkv.weight", (int)il), name))) {
            snprintf(errstr, errstr_size,
                     "model: blk.%d.attn_qkv.weight: a fused QKV bert is not supported (convert "
                     "with separate attn_q/k/v)",
                     (int)il);
            ld.bad = true;
            break;
        }
        L->wq = BT("attn_q.weight", E, E, false);
        L->bq = BT("attn_q.bias", E, 0, false);
        L->wk = BT("attn_k.weight", E, E, false);
        L->bk = BT("attn_k.bias", E, 0, false);
        L->wv = BT("attn_v.weight", E, E, false);
        L->bv = BT("attn_v.bias", E, 0, false);
        L->wo = BT("attn_output.weight", E, E, false);
        L->bo = BT("attn_output.bias", E, 0, true);
        BL->attn_out_norm = BT("attn_output_norm.weight", E, 0, false);
        BL->attn_out_norm_b = BT("attn_output_norm.bias", E, 0, false);
        L->w_up = BT("ffn_up.weight", E, F, false);
        BL->ffn_up_b = BT("ffn_up.bias", F, 0, true);
        L->w_down = BT("ffn_down.weight", F, E, false);
        BL->ffn_down_b = BT("ffn_down.bias", E, 0, true);
        BL->layer_out_norm = BT("layer_output_norm.weight", E, 0, false);
        BL->layer_out_norm_b = BT("layer_output_norm.bias", E, 0, false);
#undef BT
        L->rope_base = hp->rope_base;
        L->rope_scale = hp->rope_scale;
        L->no_rope = true;
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g) && !ld.bad; i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        if (!ld.used[i]) {
            snprintf(errstr, errstr_size,
                     "model: tensor '%.*s' is not part of the bert graph kgen runs (a variant it "
                     "does not support)",
                     (int)(t->name.len > 96 ? 96 : t->name.len), t->name.data);
            ld.bad = true;
        }
    }
    free(ld.used);
    return !ld.bad;
}

bool kg_model_embed_only(const kg_model_t *model) {
    return model->hp.arch == KG_ARCH_BERT;
}
