/* kg_mkmodel: write a deterministic random-weight GGUF of any supported
 * family and shape (what `kgen mkmodel` does; see kg_mkmodel.c for the
 * tensors and keys of each family and the weight scales). */
#pragma once

#include "../core/kg_status.h"
#include "kg_gguf.h"
#include "kg_quant_mix.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The families `kgen mkmodel --arch` writes, for messages. */
#define KG_MKMODEL_ARCHS                                                                           \
    "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, mixtral, gpt-oss, smollm3, granite, "    \
    "olmo2, mistral3, seed_oss, apertus, glm4moe, deepseek2, bert, gemma4, nomic-bert, lfm2, "     \
    "granitehybrid, nemotron_h, nemotron_h_moe, llama4, lfm2moe"

typedef struct kg_mkmodel_opts {
    const char *out;        /* the file to write */
    const char *name;       /* general.name */
    const char *arch;       /* one of KG_MKMODEL_ARCHS (default llama; mixtral is a llama
                               with experts) */
    const char *vocab_from; /* copy tokenizer.* from this GGUF; NULL: the family's built-in one */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, ctx;
    float rope_base;
    bool tied;
    bool have_seed;
    uint64_t seed;
    kg_ggml_type_t type; /* of every 2-D weight, when ftype is KG_FTYPE_ALL_F32 */
    kg_ftype_t ftype;    /* else: llama-quantize's file type, each tensor typed by its mix */
    bool pure;           /* with ftype: every 2-D weight in the base type (--pure) */
    int32_t n_words;     /* built-in vocabulary only: made-up word tokens after the family's own */

    int64_t n_rot;             /* rope.dimension_count (phi3: partial rotary); 0: head_dim */
    int64_t sliding_window;    /* gemma2/gemma3/phi3 attention.sliding_window; 0: family default */
    int64_t swa_pattern;       /* gemma: attention.sliding_window_pattern period; -1: not written */
    float rope_base_swa;       /* gemma: rope.freq_base_swa; 0: not written */
    const char *rope_scaling;  /* NULL, "none", "linear", "yarn" or "longrope" */
    float rope_factor;         /* rope.scaling.factor (linear, yarn) */
    int64_t rope_orig_ctx;     /* rope.scaling.original_context_length (yarn, longrope) */
    float attn_softcap;        /* gemma2: attn_logit_softcapping; 0: the family default */
    float final_softcap;       /* gemma2/gemma3: final_logit_softcapping; 0: default/none */
    const char *chat_template; /* a name from kg_mkmodel_chat_template; NULL: none */
    int64_t pooling;           /* <arch>.pooling_type (llama.cpp's numbers); -1: not written */
    bool rerank;               /* qwen3: a Qwen3-Reranker head (cls.output.weight, labels
                                  "yes" and "no", pooling rank unless `pooling` says) */
    /* the chat template as a file of Jinja text, instead of a named one (a real model's, as
     * tests/data/chat/jinja/templates/ holds them); NULL: none */
    const char *chat_template_file;

    /* mixture of experts (qwen3moe, mixtral, gpt-oss) */
    int64_t n_expert;           /* expert_count; 0: 8 */
    int64_t n_expert_used;      /* expert_used_count; 0: 2 */
    int64_t n_ff_exp;           /* qwen3moe, gpt-oss: expert_feed_forward_length; 0: n_ff
                                   (mixtral: n_ff is each expert's width) */
    bool has_expert_type;       /* the experts take expert_type, not type */
    kg_ggml_type_t expert_type; /* mxfp4_moe: MXFP4 experts, the rest Q8_0 */
    /* glm4moe (-1: the family default) */
    int64_t n_expert_shared; /* expert_shared_count (default 1) */
    int64_t n_layer_dense;   /* leading_dense_block_count (default 1) */
    int64_t n_nextn;         /* nextn_predict_layers: extra blocks after --n-layer (default 1) */
    int64_t n_expert_groups; /* expert_group_count and expert_group_used_count (default: */
    int64_t n_group_used;    /* not written) */
    /* deepseek2 (also takes the glm4moe options above): --head-dim is a query
     * head's nope + rope dims (key_length_mla), --n-rot its rope dims */
    int64_t q_lora_rank;  /* attention.q_lora_rank; 0: none, DeepSeek-V2-Lite's shape (attn_q,
                             softmax router without selection bias); -1: 3 x kv_lora_rank */
    int64_t kv_lora_rank; /* attention.kv_lora_rank; 0: 4 x (head_dim - n_rot) */
    int64_t v_head_dim;   /* attention.value_length_mla; 0: head_dim - n_rot */
    /* gemma4 (kg_mkmodel_gemma4.c) */
    int64_t n_embd_per_layer; /* embedding_length_per_layer_input: per-layer inputs; 0: none */
    int64_t n_kv_shared;      /* attention.shared_kv_layers: the last layers read earlier
                                 layers' K/V (their FFNs twice as wide, as E2B's); 0: none */
    /* qwen35, qwen35moe, qwen3next (kg_mkmodel_qwen35.c); 0: the default */
    int64_t ssm_state;  /* ssm.state_size: a DeltaNet head's width; default head_dim */
    int64_t ssm_groups; /* ssm.group_count: DeltaNet K heads; default n_head_kv */
    int64_t ssm_heads;  /* ssm.time_step_rank: DeltaNet V heads; default n_head */
    int64_t attn_every; /* full_attention_interval: every N-th layer attention; default 3 */
} kg_mkmodel_opts_t;

/** name "kgen-random", arch llama, ctx 2048, rope base 10000, F32, no
 * sliding-window pattern key; the caller sets the shape, head_dim
 * (n_embd / n_head when 0 is not allowed: set it) and seed. */
kg_mkmodel_opts_t kg_mkmodel_opts_default(void);

/** Whether `arch` is a family kg_mkmodel_write can write. */
bool kg_mkmodel_arch_is_known(const char *arch);

/** Tokens in the family's built-in vocabulary without made-up words; -1
 * for an unknown family. */
int64_t kg_mkmodel_builtin_vocab_size(const char *arch);

/** The Jinja text of a family's chat template by name ("chatml", "llama2",
 * "llama3", "gemma", "phi3", "phi4", "mistral-v7"), as the model publishers
 * ship it; NULL for an unknown name. `names` (may be NULL) gets the list. */
const char *kg_mkmodel_chat_template(const char *name, const char **names);

/** Write the model. *n_vocab_out (may be NULL) gets the vocabulary size. */
KG_NODISCARD kg_status_t kg_mkmodel_write(const kg_mkmodel_opts_t *o,
                                          int64_t *n_vocab_out,
                                          char *errstr,
                                          size_t errstr_size);
