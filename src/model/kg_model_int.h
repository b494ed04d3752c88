/* kg_model_int: what kg_model.c (loading the tensors) and
 * kg_model_hparams.c (reading the hyperparameters) share: the key helpers
 * and the hyperparameter readers the loader calls in order. */
#pragma once

#include "kg_model.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* "<arch>.<suffix>" */
static inline const char *akey(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

static inline bool get_i32(const kg_gguf_t *g, const char *key, int32_t *out) {
    int64_t v;
    if (!kg_gguf_get_i64(g, key, &v) || v < 0 || v > INT32_MAX) {
        return false;
    }
    *out = (int32_t)v;
    return true;
}

/* An optional integer key: absent leaves *out alone; present, it must be
 * a non-negative integer that fits. */
static inline bool get_i32_opt_key(const kg_gguf_t *g, const char *key, int32_t *out) {
    return kg_gguf_find_key(g, key) < 0 || get_i32(g, key, out);
}

static inline bool str_is(kg_gguf_str_t s, const char *lit) {
    return s.len == strlen(lit) && memcmp(s.data, lit, s.len) == 0;
}

/** RoPE scaling as llama.cpp reads it and completes it for a context. */
bool kg_model_read_rope(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *err, size_t cap);

/** The family's switches (llama.cpp's load_arch_hparams): which layers
 * slide (is_swa, n_layer flags), the windowed layers' RoPE base and scale,
 * and every how many layers one runs without RoPE (0: none). */
bool kg_model_read_arch_hparams(const kg_gguf_t *g,
                                const char *arch,
                                kg_hparams_t *hp,
                                bool *is_swa,
                                float *swa_base,
                                float *swa_scale,
                                int32_t *nope_every,
                                char *errstr,
                                size_t errstr_size);

/** The experts' counts, width and router rule. */
bool kg_model_read_moe_hparams(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size);

/** glm4moe's and deepseek2's shared experts, leading dense layers and gating function
 * (`absent`: the family's default when the file names none). */
bool kg_model_read_shared_moe(const kg_gguf_t *g,
                              const char *arch,
                              kg_moe_gating_t absent,
                              kg_hparams_t *hp,
                              char *errstr,
                              size_t errstr_size);

/** Every hyperparameter in range (after the vocabulary is known). */
bool kg_model_check_hparams(const kg_hparams_t *hp, char *errstr, size_t errstr_size);

/** Apertus's per-layer xIELU constants into model->layers (allocated). */
bool kg_model_read_xielu(const kg_gguf_t *g, kg_model_t *model, char *errstr, size_t errstr_size);

/** deepseek2's multi-head latent attention (kg_model_mla.c): the ranks,
 * the head sizes, YaRN's magnitude and the scores' scale; after
 * kg_model_read_rope. */
bool kg_model_read_mla(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size);

/* The tensors a load has taken (kg_model.c), so a tensor the graph would
 * not use is an error, not silently dropped. */
typedef struct kg_loader {
    const kg_gguf_t *g;
    bool *used; /* (n_tensors) */
    char *errstr;
    size_t errstr_size;
} kg_loader_t;

/** Find a weight, check its shape (ne0, ne1; ne1 = 0 for a vector) and
 * mark it taken; NULL with errstr and *bad set when absent (unless
 * optional) or misshapen. */
const kg_gguf_tensor_t *kg_model_find(
    kg_loader_t *ld, const char *name, int64_t ne0, int64_t ne1, bool optional, bool *bad);

/** An integer key that is one value, or (per_layer_ok) an array of
 * positive per-layer values, whose largest it gives. */
bool kg_model_get_count(const kg_gguf_t *g, const char *key, bool per_layer_ok, int32_t *out);

/** Gemma 4's keys (kg_model_gemma4.c): the windowed layers' head size and
 * RoPE dims, per-layer inputs, shared K/V layers, the largest K/V head
 * count; GeGLU, the embedding scale, unscaled attention, V's norm. */
bool kg_model_read_gemma4(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size);

/** Layer il's shape (head size, K/V heads, RoPE dims, FFN width) and the
 * layer whose K/V it reads; model->layers[0..il-1] are loaded, n_swa set. */
bool kg_model_gemma4_shape(kg_model_t *model, int32_t il, bool is_swa, char *errstr, size_t cap);

/** A stack of ne2 (ne0, ne1) matrices (a 3-D expert tensor), marked taken;
 * NULL with errstr and *bad set when absent or misshapen. */
const kg_gguf_tensor_t *
kg_model_find3(kg_loader_t *ld, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, bool *bad);

/** views[e] = rows [row0, row0 + n_rows) of matrix e of the 3-D tensor t
 * (ne[2] of them): a plain 2-D tensor of t's type (rows are whole blocks). */
void kg_model_expert_views(kg_gguf_tensor_t *views,
                           const kg_gguf_tensor_t *t,
                           int64_t row0,
                           int64_t n_rows);

/** Layer il's tensors, by the shape kg_model_gemma4_shape gave it; a MoE
 * layer's experts are cut into exp_views (3 * n_expert of them). */
bool kg_model_gemma4_layer(
    kg_loader_t *ld, kg_model_t *model, int32_t il, bool is_swa, kg_gguf_tensor_t *exp_views);

/** The per-layer inputs' model-wide tensors (none when P is 0). */
bool kg_model_gemma4_inputs(kg_loader_t *ld, kg_model_t *model);

/** The hybrid families' layer kinds (kg_model_recurrent.c): kinds[il] for
 * every layer (KG_LAYER_ATTN for a family without recurrent layers), the
 * keys that size the recurrent ones, n_layer_recurrent; an LFM2 file's
 * per-layer K/V head counts become n_head_kv. */
bool kg_model_read_recurrent(const kg_gguf_t *g,
                             const char *arch,
                             kg_hparams_t *hp,
                             kg_layer_kind_t *kinds,
                             char *errstr,
                             size_t errstr_size);

/** A recurrent layer's own tensors (by model->layers[il].kind); its norms
 * and FFN are load_layer's, as for an attention layer. */
bool kg_model_recurrent_layer(kg_loader_t *ld, kg_model_t *model, int32_t il);

/** The Mamba-2 hybrids' layer kinds (kg_model_mamba2.c; granitehybrid,
 * nemotron_h): the ssm.* sizes, kinds[il] from the per-layer K/V head
 * counts (and nemotron_h's per-layer FFN widths), n_layer_recurrent, the
 * attention layers' n_head_kv and nemotron_h's MLP width n_ff. */
bool kg_model_read_mamba2(const kg_gguf_t *g,
                          const char *arch,
                          kg_hparams_t *hp,
                          kg_layer_kind_t *kinds,
                          char *errstr,
                          size_t errstr_size);

/** A Mamba-2 layer's tensors (ssm_in, ssm_conv1d and its bias, ssm_dt.bias,
 * ssm_a, ssm_d, ssm_norm, ssm_out), shapes and types checked. */
bool kg_model_mamba2_layer(kg_loader_t *ld, kg_model_t *model, int32_t il);

/** Floats of a Mamba-2 layer's state per sequence: the convolution's
 * (d_conv - 1) x (d_inner + 2 n_group d_state) window, then the
 * d_state x d_inner SSM state. */
int64_t kg_model_mamba2_state_floats(const kg_hparams_t *hp);
