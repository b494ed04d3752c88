/* kg_model_bert: the `bert` architecture (BGE, E5, MiniLM, and rerankers
 * with a classification head), an encoder kgen runs for embedding and
 * rerank jobs only: every token of an input attends to every other
 * (non-causal), absolute position and token type embeddings are added to
 * the token's, and each block is post-norm with LayerNorms that have
 * biases: x = LN(x + attn(x)); x = LN(x + down(gelu(up(x)))). No LM head.
 *
 * `nomic-bert` (nomic-embed-text v1/v1.5) is the same encoder as llama.cpp
 * builds it from the same graph (src/models/bert.cpp): no position
 * embeddings but RoPE (NeoX pairs, <arch>.rope.freq_base) on q and k, a
 * fused attn_qkv (usually without bias), and a SwiGLU FFN without biases,
 * x = LN(x + down(silu(gate(x)) * up(x))); the same post-norm placement;
 * no classification head. Its converter writes pooling_type mean.
 *
 * DESIGN
 * The loader fills the parts of kg_model_t every family has (hp, tok,
 * tok_embd, layers[].wq/wk/wv/wo and their biases, w_gate, w_up, w_down,
 * cls_out) and keeps what only bert has here, in model->bert. A fused
 * attn_qkv (either architecture: llama.cpp's create_tensor_qkv takes it
 * for both) is cut into row views in model->views. Keys and tensor names
 * are llama.cpp's (llama_model_bert and llama_model_nomic_bert's
 * load_arch_hparams and load_arch_tensors); llama.cpp's graph adds token
 * type 0's row to every token (it never reads per-token types), and so
 * does kgen. */
#pragma once

#include "kg_model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_bert_layer {
    const kg_gguf_tensor_t *attn_out_norm, *attn_out_norm_b;   /* (n_embd) LN after attention */
    const kg_gguf_tensor_t *ffn_up_b;                          /* (n_ff) or NULL */
    const kg_gguf_tensor_t *ffn_down_b;                        /* (n_embd) or NULL */
    const kg_gguf_tensor_t *layer_out_norm, *layer_out_norm_b; /* (n_embd) LN after the FFN */
} kg_bert_layer_t;

struct kg_bert_weights {
    const kg_gguf_tensor_t *type_embd;             /* (n_embd, n_token_types) or NULL */
    const kg_gguf_tensor_t *pos_embd;              /* (n_embd, n_ctx_train); nomic-bert: NULL */
    const kg_gguf_tensor_t *tok_norm, *tok_norm_b; /* (n_embd) LN of the summed embeddings */
    /* the classification head (rank pooling): cls.weight (n_embd, n_embd)
     * and its bias, then tanh, then cls.output (model->cls_out) and its bias;
     * each optional as in llama.cpp */
    const kg_gguf_tensor_t *cls, *cls_b, *cls_out_b;
    int32_t n_token_types;
    kg_bert_layer_t layers[]; /* (n_layer) */
};

/** Read a `bert` or `nomic-bert` file into `model` (its gguf and hp.arch set): the
 * hyperparameters, the tokenizer and every tensor, checked. False with one
 * line in errstr. Called by kg_model_load_gguf. */
bool kg_model_load_bert(kg_model_t *model, const char *path, char *errstr, size_t errstr_size);
