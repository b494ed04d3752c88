/* kg_mkmodel_int: what kg_mkmodel.c shares with the families written in
 * files of their own (kg_mkmodel_bert.c, kg_mkmodel_gemma4.c) and with the
 * family table (kg_mkmodel_families.c): its seeded random tensors, the
 * vocabulary copy, the file-type key, the families. */
#pragma once

#include "kg_gguf_writer.h"
#include "kg_mkmodel.h"
#include "kg_mkvocab.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Add tensor `name` (ne0, ne1; ne1 1 for a vector) of `type`, uniform in
 * [center - scale, center + scale] from the stream of (o->seed, name), as
 * every family's tensors are drawn. False with err set. */
bool kg_mkmodel_random(kg_gguf_writer_t *w,
                       const kg_mkmodel_opts_t *o,
                       const char *name,
                       kg_ggml_type_t type,
                       int64_t ne0,
                       int64_t ne1,
                       float center,
                       float scale,
                       char *err,
                       size_t cap);

/** Copy every tokenizer.* key of the GGUF at `path`; the vocabulary size,
 * or -1 with err set. */
int64_t kg_mkmodel_copy_vocab(kg_gguf_writer_t *w, const char *path, char *err, size_t cap);

/** A chat template's Jinja text from a file (--chat-template-file; at most 1 MiB: Gemma 4's,
 * the longest a model ships, is 16 KiB), in kg_mkmodel_args.c. Malloc'ed; NULL with a
 * message in errstr. */
char *kg_mkmodel_read_template(const char *path, char *errstr, size_t errstr_size);

/** llama.cpp's general.file_type for weights of type t. */
uint32_t kg_mkmodel_file_type(kg_ggml_type_t t);

/** kg_mkmodel_write for --arch bert (kg_mkmodel_bert.c). */
kg_status_t kg_mkmodel_write_bert(const kg_mkmodel_opts_t *o,
                                  int64_t *n_vocab_out,
                                  char *errstr,
                                  size_t errstr_size);

/** The size of bert's built-in WordPiece vocabulary without made-up words. */
int64_t kg_mkmodel_bert_vocab_size(void);

/** Add one (ne0, ne1) tensor (ne1 1: a vector) uniform in [center - scale,
 * center + scale], drawn from its own stream of (seed, name) and typed by
 * the current write's quantization mix; false with the write's error set. */
bool kg_mkmodel_add_random(kg_gguf_writer_t *w,
                           const kg_mkmodel_opts_t *o,
                           const char *name,
                           kg_ggml_type_t type,
                           int64_t ne0,
                           int64_t ne1,
                           float center,
                           float scale);

/** Add a stack of n_exp (ne0, ne1) matrices (a 3-D expert tensor), each
 * drawn uniform in [-scale, scale] from the stream of (o->seed, name) and
 * typed by the current write's quantization mix; false with the write's
 * error set. */
bool kg_mkmodel_add_random3(kg_gguf_writer_t *w,
                            const kg_mkmodel_opts_t *o,
                            const char *name,
                            kg_ggml_type_t type,
                            int64_t ne0,
                            int64_t ne1,
                            int64_t n_exp,
                            float scale);

/** Gemma 4's keys beyond the generic ones write_hparams has written (it
 * overwrites head_count_kv, feed_forward_length and the head sizes). */
void kg_mkmodel_gemma4_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** Gemma 4's layers, its global layers' RoPE divisors and the per-layer
 * input tensors (token_embd, output_norm and output are written already). */
bool kg_mkmodel_gemma4_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, int64_t n_vocab);

/** Why the options cannot make a Gemma 4 file (the shared K/V layers must
 * find a windowed and a global layer just before them), or NULL. */
const char *kg_mkmodel_gemma4_check(const kg_mkmodel_opts_t *o);

/** LFM2's keys beyond the generic ones (head_count_kv becomes per layer,
 * 0 for a convolution layer; shortconv.l_cache; lfm2moe's router keys). */
void kg_mkmodel_lfm2_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** LFM2's layers (token_embd, the final norm and output are written; lfm2moe: experts after
 * the leading dense layers). */
bool kg_mkmodel_lfm2_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** Why these options cannot make an lfm2 or lfm2moe model, or NULL. */
const char *kg_mkmodel_lfm2_check(const kg_mkmodel_opts_t *o);

/** Qwen3.5's keys beyond the generic ones (arch: qwen35, qwen35moe or qwen3next):
 * RoPE dims and sections, the ssm.* sizes, which layers are recurrent. */
void kg_mkmodel_qwen35_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const char *arch);

/** Qwen3.5's layers (qwen35moe, qwen3next: routed and shared experts
 * instead of the dense FFN); token_embd, the final norm and output are
 * written. */
bool kg_mkmodel_qwen35_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const char *arch);

/** The Mamba-2 hybrids' keys beyond the generic ones (kg_mkmodel_mamba2.c:
 * granitehybrid, nemotron_h): ssm.*, per-layer head_count_kv (and
 * nemotron_h's feed_forward_length). */
void kg_mkmodel_mamba2_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** Their layers (token_embd, the final norm and output are written). */
bool kg_mkmodel_mamba2_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** Why these options cannot make such a model, or NULL. */
const char *kg_mkmodel_mamba2_check(const kg_mkmodel_opts_t *o);

/* What llama.cpp's converter writes for each family: the tensors of a layer
 * and the built-in vocabulary style (see the metadata in write_hparams). */
typedef struct kg_mkmodel_family {
    const char *arch;      /* the --arch name */
    const char *gguf_arch; /* general.architecture (mixtral is a llama) */
    bool moe;              /* router and 3-D expert tensors instead of the dense FFN */
    bool oss;              /* gpt-oss: sinks, output/router/expert biases, yarn, windows */
    bool qkv_bias;         /* blk.N.attn_{q,k,v}.bias (qwen2) */
    bool qk_norm;          /* blk.N.attn_{q,k}_norm (qwen3, gemma3) */
    bool post_norms;       /* blk.N.post_attention_norm, post_ffw_norm (gemma) */
    bool fused;            /* blk.N.attn_qkv and a 2 * n_ff ffn_up holding gate then up (phi3) */
    bool always_tied;      /* no output.weight (gemma2's converter drops lm_head) */
    bool small_embd;       /* embeddings of variance 1/n_embd: the graph scales them by
                              sqrt(n_embd), so they enter the residual at unit scale (gemma) */
    kg_mkvocab_style_t vocab;
    float rms_eps;
    bool norm_rope;      /* llama's RoPE pairs: the converter writes rope.dimension_count */
    bool granite_scales; /* embedding_scale, residual_scale, attention.scale, logit_scale */
    bool no_pre_norms;   /* no attn_norm / ffn_norm: the post-norms only (olmo2) */
    bool qk_norm_full;   /* attn_q_norm (n_head * head_dim), attn_k_norm (n_head_kv * head_dim) */
    bool llama4_temp;    /* attention.temperature_scale, and YaRN's betas and log multiplier */
    bool ffn_norm_post;  /* the FFN norm named post_attention_norm (gpt-oss, seed_oss) */
    bool xielu;          /* no ffn_gate; xielu.* keys, one value per layer (apertus) */
    bool glm;            /* shared experts, selection bias, leading dense layers, nextn blocks */
    bool mla;            /* multi-head latent attention's tensors and keys (deepseek2) */
    bool gemma4;         /* its own layers and keys: kg_mkmodel_gemma4.c */
    bool lfm2;           /* short-convolution and attention layers: kg_mkmodel_lfm2.c */
    bool qwen35;         /* gated DeltaNet and gated attention layers: kg_mkmodel_qwen35.c */
    bool mamba2;         /* Mamba-2, attention (and MLP) layers: kg_mkmodel_mamba2.c */
    bool llama4;         /* dense and MoE layers in turn (a shared expert), rope_freqs */
} kg_mkmodel_family_t;

/** The family of --arch `arch` (NULL: llama), or NULL when the table has none (bert is written
 * by kg_mkmodel_bert.c). */
const kg_mkmodel_family_t *kg_mkmodel_find_family(const char *arch);
