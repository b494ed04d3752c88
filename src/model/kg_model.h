/* kg_model: a Llama-family model read from GGUF: hyperparameters, the
 * tokenizer and views of the weight tensors (still in the file's types;
 * each backend converts them as it needs at load). */
#pragma once

#include "kg_gguf.h"
#include "kg_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_hparams {
    int32_t n_vocab;
    int32_t n_ctx_train; /* llama.context_length */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* n_embd / n_head unless attention.key_length says otherwise */
    int32_t n_rot;    /* rope.dimension_count; == head_dim for Llama */
    int32_t n_ff;
    float norm_eps;   /* attention.layer_norm_rms_epsilon */
    float rope_base;  /* rope.freq_base, default 10000 */
    float rope_scale; /* 1 / rope.scaling.factor for linear scaling; 1 = none */
    bool tied;        /* no output.weight: the head is token_embd */
} kg_hparams_t;

/* Views into the GGUF mapping. Shapes in ggml order: ne[0] is the row
 * (input) dimension, so a weight W of shape (ne0=in, ne1=out) computes
 * y[out] = sum_in W[out][in] x[in]. */
typedef struct kg_layer_weights {
    const kg_gguf_tensor_t *attn_norm; /* (n_embd) */
    const kg_gguf_tensor_t *wq;        /* (n_embd, n_head * head_dim) */
    const kg_gguf_tensor_t *wk;        /* (n_embd, n_head_kv * head_dim) */
    const kg_gguf_tensor_t *wv;        /* (n_embd, n_head_kv * head_dim) */
    const kg_gguf_tensor_t *wo;        /* (n_head * head_dim, n_embd) */
    const kg_gguf_tensor_t *ffn_norm;  /* (n_embd) */
    const kg_gguf_tensor_t *w_gate;    /* (n_embd, n_ff) */
    const kg_gguf_tensor_t *w_up;      /* (n_embd, n_ff) */
    const kg_gguf_tensor_t *w_down;    /* (n_ff, n_embd) */
} kg_layer_weights_t;

typedef struct kg_model {
    kg_gguf_t *gguf;     /* owned */
    kg_tokenizer_t *tok; /* owned */
    kg_hparams_t hp;
    const kg_gguf_tensor_t *tok_embd;    /* (n_embd, n_vocab) */
    const kg_gguf_tensor_t *output_norm; /* (n_embd) */
    const kg_gguf_tensor_t *output;      /* (n_embd, n_vocab); == tok_embd when tied */
    const kg_gguf_tensor_t *rope_freqs;  /* (n_rot / 2) frequency divisors (Llama 3.1) or NULL */
    kg_layer_weights_t *layers;          /* (n_layer) */
    char *chat_template;                 /* tokenizer.chat_template or NULL */
} kg_model_t;

/** Open a GGUF model file. Checks the architecture (llama and its
 * relatives), every hyperparameter and every tensor's presence, type and
 * shape. NULL with one line in errstr on failure. */
kg_model_t *kg_model_load(const char *path, char *errstr, size_t errstr_size);
void kg_model_free(kg_model_t *model);
