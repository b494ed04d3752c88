/* kg_model: load a Llama-family GGUF: check the architecture, read the
 * hyperparameters with llama.cpp's keys and defaults, find every weight
 * tensor and check its type and shape before any backend touches it. */
#include "kg_model.h"

#include "kg_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Architectures whose tensors and math are the plain Llama graph (no
 * biases, no QK-norm, SwiGLU FFN). Qwen2 has QKV biases and is refused. */
static const char *const llama_like[] = {"llama", "mistral", NULL};

static bool arch_supported(const char *arch) {
    for (int i = 0; llama_like[i]; i++) {
        if (strcmp(arch, llama_like[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* "<arch>.<suffix>" */
static const char *akey(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

static bool get_i32(const kg_gguf_t *g, const char *key, int32_t *out) {
    int64_t v;
    if (!kg_gguf_get_i64(g, key, &v) || v < 0 || v > INT32_MAX) {
        return false;
    }
    *out = (int32_t)v;
    return true;
}

/* Find a weight and check its shape (ne0, ne1; ne1 = 0 for a vector). */
static const kg_gguf_tensor_t *need_tensor(const kg_gguf_t *g,
                                           const char *name,
                                           int64_t ne0,
                                           int64_t ne1,
                                           char *errstr,
                                           size_t errstr_size) {
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
    if (!t) {
        snprintf(errstr, errstr_size, "model: missing tensor '%s'", name);
        return NULL;
    }
    bool ok = ne1 == 0 ? (t->n_dims == 1 && t->ne[0] == ne0)
                       : (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1);
    if (!ok) {
        snprintf(errstr, errstr_size,
                 "model: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]", name,
                 (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0,
                 (long long)ne1);
        return NULL;
    }
    return t;
}

static bool check_hparams(const kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    const char *bad = NULL;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_ff <= 0) {
        bad = "embedding_length, block_count, head_count and feed_forward_length must be > 0";
    } else if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0) {
        bad = "head_count must be a multiple of head_count_kv";
    } else if (hp->head_dim <= 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024) {
        bad = "head dimension must be even and at most 1024";
    } else if (hp->n_rot != hp->head_dim) {
        bad = "rope.dimension_count must equal the head dimension (partial RoPE unsupported)";
    } else if (hp->n_vocab <= 0) {
        bad = "empty vocabulary";
    } else if (!(hp->norm_eps > 0.0f) || !(hp->rope_base > 0.0f) || !(hp->rope_scale > 0.0f)) {
        bad = "rms epsilon, rope base and rope scale must be > 0";
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad hyperparameters: %s", bad);
        return false;
    }
    return true;
}

kg_model_t *kg_model_load(const char *path, char *errstr, size_t errstr_size) {
    kg_model_t *model = calloc(1, sizeof(*model));
    char key[256];
    if (!model) {
        snprintf(errstr, errstr_size, "model: out of memory");
        return NULL;
    }
    model->gguf = kg_gguf_open(path, errstr, errstr_size);
    if (!model->gguf) {
        goto fail;
    }
    const kg_gguf_t *g = model->gguf;
    kg_gguf_str_t s;
    char arch[64] = "";
    if (!kg_gguf_get_str(g, "general.architecture", &s) || s.len == 0 || s.len >= sizeof(arch)) {
        snprintf(errstr, errstr_size, "model: %s has no general.architecture", path);
        goto fail;
    }
    memcpy(arch, s.data, s.len);
    arch[s.len] = '\0';
    if (!arch_supported(arch)) {
        snprintf(errstr, errstr_size,
                 "model: unsupported architecture '%s' (supported: llama, mistral)", arch);
        goto fail;
    }

    kg_hparams_t *hp = &model->hp;
    if (!get_i32(g, akey(key, sizeof(key), arch, "embedding_length"), &hp->n_embd) ||
        !get_i32(g, akey(key, sizeof(key), arch, "block_count"), &hp->n_layer) ||
        !get_i32(g, akey(key, sizeof(key), arch, "feed_forward_length"), &hp->n_ff) ||
        !get_i32(g, akey(key, sizeof(key), arch, "attention.head_count"), &hp->n_head)) {
        snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
        goto fail;
    }
    hp->n_head_kv = hp->n_head;
    get_i32(g, akey(key, sizeof(key), arch, "attention.head_count_kv"), &hp->n_head_kv);
    hp->n_ctx_train = 2048;
    get_i32(g, akey(key, sizeof(key), arch, "context_length"), &hp->n_ctx_train);
    hp->head_dim = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    get_i32(g, akey(key, sizeof(key), arch, "attention.key_length"), &hp->head_dim);
    int32_t v_len = hp->head_dim;
    get_i32(g, akey(key, sizeof(key), arch, "attention.value_length"), &v_len);
    if (v_len != hp->head_dim) {
        snprintf(errstr, errstr_size,
                 "model: attention.value_length %d != key_length %d unsupported", v_len,
                 hp->head_dim);
        goto fail;
    }
    hp->n_rot = hp->head_dim;
    get_i32(g, akey(key, sizeof(key), arch, "rope.dimension_count"), &hp->n_rot);
    hp->norm_eps = 1e-5f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.layer_norm_rms_epsilon"),
                    &hp->norm_eps);
    hp->rope_base = 10000.0f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base"), &hp->rope_base);
    hp->rope_scale = 1.0f;
    if (kg_gguf_get_str(g, akey(key, sizeof(key), arch, "rope.scaling.type"), &s)) {
        float factor = 1.0f;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.factor"), &factor);
        if (s.len == 6 && memcmp(s.data, "linear", 6) == 0 && factor > 0.0f) {
            hp->rope_scale = 1.0f / factor;
        } else if (!(s.len == 4 && memcmp(s.data, "none", 4) == 0)) {
            snprintf(errstr, errstr_size, "model: unsupported rope.scaling.type '%.*s'", (int)s.len,
                     s.data);
            goto fail;
        }
    }

    model->tok = kg_tokenizer_new(g, errstr, errstr_size);
    if (!model->tok) {
        goto fail;
    }
    hp->n_vocab = kg_tokenizer_n_vocab(model->tok);
    if (!check_hparams(hp, errstr, errstr_size)) {
        goto fail;
    }

    int64_t n_q = (int64_t)hp->n_head * hp->head_dim, n_kv = (int64_t)hp->n_head_kv * hp->head_dim;
    model->tok_embd =
        need_tensor(g, "token_embd.weight", hp->n_embd, hp->n_vocab, errstr, errstr_size);
    model->output_norm = need_tensor(g, "output_norm.weight", hp->n_embd, 0, errstr, errstr_size);
    if (!model->tok_embd || !model->output_norm) {
        goto fail;
    }
    if (kg_gguf_find_tensor(g, "output.weight")) {
        model->output =
            need_tensor(g, "output.weight", hp->n_embd, hp->n_vocab, errstr, errstr_size);
        if (!model->output) {
            goto fail;
        }
    } else {
        model->output = model->tok_embd;
        hp->tied = true;
    }
    model->rope_freqs = kg_gguf_find_tensor(g, "rope_freqs.weight");
    if (model->rope_freqs &&
        !need_tensor(g, "rope_freqs.weight", hp->n_rot / 2, 0, errstr, errstr_size)) {
        goto fail;
    }
    model->layers = calloc((size_t)hp->n_layer, sizeof(*model->layers));
    if (!model->layers) {
        snprintf(errstr, errstr_size, "model: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        kg_layer_weights_t *L = &model->layers[il];
        char name[96];
#define KG_NEED(field, suffix, ne0, ne1)                                                           \
    snprintf(name, sizeof(name), "blk.%d." suffix, (int)il);                                       \
    if (!(L->field = need_tensor(g, name, (ne0), (ne1), errstr, errstr_size))) {                   \
        goto fail;                                                                                 \
    }
        KG_NEED(attn_norm, "attn_norm.weight", hp->n_embd, 0);
        KG_NEED(wq, "attn_q.weight", hp->n_embd, n_q);
        KG_NEED(wk, "attn_k.weight", hp->n_embd, n_kv);
        KG_NEED(wv, "attn_v.weight", hp->n_embd, n_kv);
        KG_NEED(wo, "attn_output.weight", n_q, hp->n_embd);
        KG_NEED(ffn_norm, "ffn_norm.weight", hp->n_embd, 0);
        KG_NEED(w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff);
        KG_NEED(w_up, "ffn_up.weight", hp->n_embd, hp->n_ff);
        KG_NEED(w_down, "ffn_down.weight", hp->n_ff, hp->n_embd);
#undef KG_NEED
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
    return model;
fail:
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
    free(model->chat_template);
    free(model);
}
