/* kg_mkmodel: a random-weight model of any supported family and shape, as
 * a GGUF file.
 *
 * The file is what llama.cpp's converter (convert_hf_to_gguf.py) would
 * write for that family: its <arch>.* hyperparameter keys, a tokenizer,
 * and tensors with llama.cpp's names and ggml shapes (ne[0] is the input
 * dimension): qwen2's Q/K/V biases, qwen3's and gemma3's Q/K norms,
 * Gemma's post-norms (stored with the +1 already added, as the converter
 * does: weights near 1), phi3's fused attn_qkv and gate+up ffn_up and its
 * LongRoPE factor tensors. Norm weights and biases stay F32, as llama.cpp
 * keeps 1-D tensors; every 2-D weight takes the chosen type.
 *
 * The mixture-of-experts families (qwen3moe; mixtral, which is llama with
 * llama.expert_count; gpt-oss) get a router ffn_gate_inp (F32: llama-
 * quantize never quantizes it) and 3-D expert tensors ffn_{gate,up,down}_exps
 * (n_expert matrices along ne[2]) instead of the dense FFN; gpt-oss adds
 * Q/K/V/output biases, attention sinks, router and expert biases, and names
 * its FFN norm post_attention_norm, as its converter does. The experts take
 * the weights' type, or MXFP4 with the rest Q8_0 (llama-quantize's
 * MXFP4_MOE: the form gpt-oss is published in). Each family
 * gets a built-in vocabulary that exercises its tokenizer path: llama a
 * SentencePiece byte vocabulary; qwen a byte-level BPE with the qwen2
 * pre-tokenizer; gemma and phi3 SentencePiece pieces (gemma without the
 * space prefix); the BPE merges and SentencePiece pieces are trained on a
 * short built-in English text.
 *
 * Weights are deterministic: each tensor draws from its own xoshiro256**
 * stream seeded from (seed, tensor name), so the same options give the
 * same bytes, and changing one tensor's shape leaves the others alone. The
 * scales keep activations sane through many layers: every projection is
 * uniform with variance 1/fan_in (unit-variance outputs for unit-RMS
 * inputs), the two projections that add into the residual stream are
 * further scaled by 1/sqrt(2 n_layer) (GPT-2's init), and norm weights are
 * 1 +- 0.1. The result is a model whose greedy output varies with the
 * prompt, not a constant. Used by `kgen mkmodel`, the worker's demo and the
 * tests. */
#include "kg_mkmodel.h"

#include "kg_gguf.h"
#include "kg_gguf_writer.h"
#include "kg_mkmodel_int.h"
#include "kg_mkvocab.h"
#include "kg_quant.h"
#include "kg_quant_mix.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the first error of the current write (the writer is single-threaded) */
static _Thread_local char g_err[512];

/* The file type of the current write: add_random types each tensor by it
 * (kg_quant_mix), as llama-quantize would. */
static _Thread_local struct {
    bool on;
    kg_ftype_t ftype;
    bool pure;
    kg_quant_mix_model_t model;
} g_mix;

// ---- random numbers ----

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct rng {
    uint64_t s[4];
} rng_t;

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(rng_t *r) { // xoshiro256**
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static void rng_seed(rng_t *r, uint64_t seed, const char *name) {
    uint64_t x = seed;
    for (const char *p = name; *p; p++) { // FNV-1a of the name, folded into the seed
        x = (x ^ (unsigned char)*p) * 1099511628211ull;
    }
    for (int i = 0; i < 4; i++) {
        r->s[i] = splitmix64(&x);
    }
}

/** Uniform in [-1, 1). */
static float rng_uniform(rng_t *r) {
    return (float)(rng_next(r) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// ---- tensors ----

/** Fill and add one tensor: uniform in [center - scale, center + scale]. */
static bool add_random(kg_gguf_writer_t *w,
                       const kg_mkmodel_opts_t *o,
                       const char *name,
                       kg_ggml_type_t type,
                       int64_t ne0,
                       int64_t ne1,
                       float center,
                       float scale) {
    int64_t n = ne0 * ne1;
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) {
        snprintf(g_err, sizeof(g_err), "out of memory for %s (%lld x %lld)", name, (long long)ne0,
                 (long long)ne1);
        return false;
    }
    rng_t r;
    rng_seed(&r, o->seed, name);
    for (int64_t i = 0; i < n; i++) {
        v[i] = center + scale * rng_uniform(&r);
    }
    int64_t ne[2] = {ne0, ne1};
    const int n_dims = ne1 > 1 ? 2 : 1;
    if (g_mix.on) {
        type = kg_quant_mix_type(g_mix.ftype, g_mix.pure, &g_mix.model, name, n_dims, ne0, type);
    }
    if (ne0 % kg_type_block_elems(type) != 0) {
        snprintf(g_err, sizeof(g_err), "%s: rows of %lld elements do not fit %s blocks of %lld",
                 name, (long long)ne0, kg_type_name(type), (long long)kg_type_block_elems(type));
        free(v);
        return false;
    }
    kg_status_t st = kg_gguf_writer_add_tensor(w, name, type, n_dims, ne, v);
    free(v);
    if (st != KG_OK) {
        snprintf(g_err, sizeof(g_err), "cannot add %s: %s", name, kg_status_str(st));
        return false;
    }
    return true;
}

bool kg_mkmodel_add_random(kg_gguf_writer_t *w,
                           const kg_mkmodel_opts_t *o,
                           const char *name,
                           kg_ggml_type_t type,
                           int64_t ne0,
                           int64_t ne1,
                           float center,
                           float scale) {
    return add_random(w, o, name, type, ne0, ne1, center, scale);
}

/* A stack of n_exp (ne0, ne1) matrices (an expert tensor), each matrix
 * drawn as add_random would draw it. */
bool kg_mkmodel_add_random3(kg_gguf_writer_t *w,
                            const kg_mkmodel_opts_t *o,
                            const char *name,
                            kg_ggml_type_t type,
                            int64_t ne0,
                            int64_t ne1,
                            int64_t n_exp,
                            float scale) {
    int64_t n = ne0 * ne1 * n_exp;
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!v) {
        snprintf(g_err, sizeof(g_err), "out of memory for %s (%lld x %lld x %lld)", name,
                 (long long)ne0, (long long)ne1, (long long)n_exp);
        return false;
    }
    rng_t r;
    rng_seed(&r, o->seed, name);
    for (int64_t i = 0; i < n; i++) {
        v[i] = scale * rng_uniform(&r);
    }
    int64_t ne[3] = {ne0, ne1, n_exp};
    if (g_mix.on) {
        type = kg_quant_mix_type(g_mix.ftype, g_mix.pure, &g_mix.model, name, 3, ne0, type);
    }
    if (ne0 % kg_type_block_elems(type) != 0) {
        snprintf(g_err, sizeof(g_err), "%s: rows of %lld elements do not fit %s blocks of %lld",
                 name, (long long)ne0, kg_type_name(type), (long long)kg_type_block_elems(type));
        free(v);
        return false;
    }
    kg_status_t st = kg_gguf_writer_add_tensor(w, name, type, 3, ne, v);
    free(v);
    if (st != KG_OK) {
        snprintf(g_err, sizeof(g_err), "cannot add %s: %s", name, kg_status_str(st));
        return false;
    }
    return true;
}

/** Uniform with variance 1/fan_in: the half-width is sqrt(3 / fan_in). */
static float fan_in_scale(int64_t fan_in) {
    return sqrtf(3.0f / (float)fan_in);
}

// ---- families ----

typedef kg_mkmodel_family_t family_t;

static const family_t *find_family(const char *arch) {
    return kg_mkmodel_find_family(arch);
}

bool kg_mkmodel_arch_is_known(const char *arch) {
    return find_family(arch) != NULL ||
           (arch && (strcmp(arch, "bert") == 0 || strcmp(arch, "nomic-bert") == 0));
}

int64_t kg_mkmodel_builtin_vocab_size(const char *arch) {
    if (arch && (strcmp(arch, "bert") == 0 || strcmp(arch, "nomic-bert") == 0)) {
        return kg_mkmodel_bert_vocab_size();
    }
    const family_t *fam = find_family(arch);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    char err[128];
    int64_t n = fam && w ? kg_mkvocab_add(w, fam->vocab, 0, err, sizeof(err)) : -1;
    kg_gguf_writer_free(w);
    return n;
}

static int64_t n_rot_of(const kg_mkmodel_opts_t *o) {
    return o->n_rot > 0 ? o->n_rot : o->head_dim;
}

static bool is_longrope(const kg_mkmodel_opts_t *o) {
    return o->rope_scaling && strcmp(o->rope_scaling, "longrope") == 0;
}

static bool
add_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const family_t *fam, int64_t n_vocab) {
    const kg_ggml_type_t wt = o->type;
    const int64_t E = o->n_embd, hd = o->head_dim, F = o->n_ff;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const float fe = fan_in_scale(E);
    /* Gemma's post-norms set how much each block adds to the residual
     * stream; at 3 the blocks outweigh the (unit-scale) embedding, so a
     * tied head does not just echo the last token; olmo2's (untied, no
     * input norms) stay near 1, so the residual stream its GEMMs read
     * unnormed grows slowly */
    const float post = fam->no_pre_norms ? 1.0f : 3.0f;
    char name[64];
#define KG_ADD(type, ne0, ne1, center, scale, ...)                                                 \
    (snprintf(name, sizeof(name), __VA_ARGS__),                                                    \
     add_random(w, o, name, (type), (ne0), (ne1), (center), (scale)))

    if (!add_random(w, o, "token_embd.weight", wt, E, n_vocab, 0.0f,
                    fam->small_embd ? 0.5f * fe : 1.0f) ||
        !add_random(w, o, fam->lfm2 ? "token_embd_norm.weight" : "output_norm.weight",
                    KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f)) {
        return false;
    }
    if (!o->tied && !fam->always_tied &&
        !add_random(w, o, "output.weight", wt, E, n_vocab, 0.0f, fe)) {
        return false;
    }
    if (is_longrope(o)) {
        /* LongRoPE frequency divisors: near 1 for short contexts, growing
         * with the pair index for long ones (as Phi-3's are) */
        const int64_t n = n_rot_of(o) / 2;
        if (!add_random(w, o, "rope_factors_long.weight", KG_GGML_TYPE_F32, n, 1, 8.0f, 6.0f) ||
            !add_random(w, o, "rope_factors_short.weight", KG_GGML_TYPE_F32, n, 1, 1.05f, 0.05f)) {
            return false;
        }
    }
    /* Llama 4's rope_freqs (Llama 3's scaling: divisors 1 up to the factor, by frequency) */
    if (fam->llama4 &&
        !add_random(w, o, "rope_freqs.weight", KG_GGML_TYPE_F32, n_rot_of(o) / 2, 1, 4.0f, 3.0f)) {
        return false;
    }
    if (fam->gemma4) {
        return kg_mkmodel_gemma4_weights(w, o, n_vocab);
    }
    if (fam->lfm2) {
        return kg_mkmodel_lfm2_weights(w, o);
    }
    if (fam->qwen35) {
        return kg_mkmodel_qwen35_weights(w, o, fam->gguf_arch);
    }
    if (fam->mamba2) {
        return kg_mkmodel_mamba2_weights(w, o);
    }
    if (strcmp(fam->gguf_arch, "gemma-embedding") == 0 &&
        (!add_random(w, o, "dense_2.weight", wt, E, 4 * E, 0.0f, fe) ||
         !add_random(w, o, "dense_3.weight", wt, 4 * E, E, 0.0f, fan_in_scale(4 * E)))) {
        return false;
    }
    const int64_t n_blocks = o->n_layer + (fam->glm ? o->n_nextn : 0);
    /* MLA (DeepseekV2Model): R latent dims, a query head of hd = nope +
     * rope dims, MV value dims per head */
    const int64_t R = o->kv_lora_rank, QL = o->q_lora_rank, rope = n_rot_of(o), MV = o->v_head_dim;
    for (int64_t l = 0; l < n_blocks; l++) {
        const long long L = (long long)l;
        const bool dense = ((fam->glm || fam->mla) && l < o->n_layer_dense) ||
                           (fam->llama4 && (l + 1) % 2 != 0); /* interleave_moe_layer_step 2 */
        bool ok = fam->no_pre_norms ||
                  KG_ADD(KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f, "blk.%lld.attn_norm.weight", L);
        if (fam->mla) {
            if (QL > 0) {
                ok = ok && KG_ADD(wt, E, QL, 0.0f, fe, "blk.%lld.attn_q_a.weight", L) &&
                     KG_ADD(KG_GGML_TYPE_F32, QL, 1, 1.0f, 0.1f, "blk.%lld.attn_q_a_norm.weight",
                            L) &&
                     KG_ADD(wt, QL, o->n_head * hd, 0.0f, fan_in_scale(QL),
                            "blk.%lld.attn_q_b.weight", L);
            } else {
                ok = ok && KG_ADD(wt, E, o->n_head * hd, 0.0f, fe, "blk.%lld.attn_q.weight", L);
            }
            ok = ok && KG_ADD(wt, E, R + rope, 0.0f, fe, "blk.%lld.attn_kv_a_mqa.weight", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, R, 1, 1.0f, 0.1f, "blk.%lld.attn_kv_a_norm.weight", L);
            snprintf(name, sizeof(name), "blk.%lld.attn_k_b.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, wt, hd - rope, R, o->n_head,
                                              fan_in_scale(hd - rope));
            snprintf(name, sizeof(name), "blk.%lld.attn_v_b.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, wt, R, MV, o->n_head, fan_in_scale(R));
            ok = ok && KG_ADD(wt, o->n_head * MV, E, 0.0f, fan_in_scale(o->n_head * MV) * resid,
                              "blk.%lld.attn_output.weight", L);
        } else if (fam->fused) {
            ok = ok && KG_ADD(wt, E, q_dim + 2 * kv_dim, 0.0f, fe, "blk.%lld.attn_qkv.weight", L);
        } else {
            ok = ok && KG_ADD(wt, E, q_dim, 0.0f, fe, "blk.%lld.attn_q.weight", L) &&
                 KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_k.weight", L) &&
                 KG_ADD(wt, E, kv_dim, 0.0f, fe, "blk.%lld.attn_v.weight", L);
        }
        if (fam->qkv_bias) {
            ok = ok && KG_ADD(KG_GGML_TYPE_F32, q_dim, 1, 0.0f, 0.2f, "blk.%lld.attn_q.bias", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, kv_dim, 1, 0.0f, 0.2f, "blk.%lld.attn_k.bias", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, kv_dim, 1, 0.0f, 0.2f, "blk.%lld.attn_v.bias", L);
        }
        if (fam->qk_norm_full) {
            ok = ok &&
                 KG_ADD(KG_GGML_TYPE_F32, q_dim, 1, 1.0f, 0.1f, "blk.%lld.attn_q_norm.weight", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, kv_dim, 1, 1.0f, 0.1f, "blk.%lld.attn_k_norm.weight", L);
        }
        if (fam->qk_norm) {
            ok = ok &&
                 KG_ADD(KG_GGML_TYPE_F32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_q_norm.weight", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, hd, 1, 1.0f, 0.1f, "blk.%lld.attn_k_norm.weight", L);
        }
        ok = ok && (fam->mla || KG_ADD(wt, q_dim, E, 0.0f, fan_in_scale(q_dim) * resid,
                                       "blk.%lld.attn_output.weight", L));
        if (fam->post_norms) {
            ok = ok && KG_ADD(KG_GGML_TYPE_F32, E, 1, post, 0.1f * post,
                              "blk.%lld.post_attention_norm.weight", L);
        }
        if (fam->oss) {
            ok =
                ok && KG_ADD(KG_GGML_TYPE_F32, E, 1, 0.0f, 0.2f, "blk.%lld.attn_output.bias", L) &&
                KG_ADD(KG_GGML_TYPE_F32, o->n_head, 1, 0.0f, 1.0f, "blk.%lld.attn_sinks.weight", L);
        }
        /* gpt-oss's converter maps post_attention_layernorm to its own name */
        ok = ok && (fam->no_pre_norms ||
                    KG_ADD(KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f,
                           fam->oss || fam->ffn_norm_post ? "blk.%lld.post_attention_norm.weight"
                                                          : "blk.%lld.ffn_norm.weight",
                           L));
        if (fam->moe && !dense) {
            const int64_t X = o->n_expert, FX = o->n_ff_exp;
            const kg_ggml_type_t xt = o->has_expert_type ? o->expert_type : wt;
            /* the router, F32: its logits are unit-variance, so tokens
             * spread over the experts */
            ok = ok && KG_ADD(KG_GGML_TYPE_F32, E, X, 0.0f, fe, "blk.%lld.ffn_gate_inp.weight", L);
            if (fam->oss) {
                ok = ok &&
                     KG_ADD(KG_GGML_TYPE_F32, X, 1, 0.0f, 0.2f, "blk.%lld.ffn_gate_inp.bias", L);
            }
            snprintf(name, sizeof(name), "blk.%lld.ffn_gate_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, E, FX, X, fe);
            snprintf(name, sizeof(name), "blk.%lld.ffn_down_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, FX, E, X, fan_in_scale(FX) * resid);
            snprintf(name, sizeof(name), "blk.%lld.ffn_up_exps.weight", L);
            ok = ok && kg_mkmodel_add_random3(w, o, name, xt, E, FX, X, fe);
            if (fam->oss) {
                ok =
                    ok &&
                    KG_ADD(KG_GGML_TYPE_F32, FX, X, 0.0f, 0.1f, "blk.%lld.ffn_gate_exps.bias", L) &&
                    KG_ADD(KG_GGML_TYPE_F32, FX, X, 0.0f, 0.1f, "blk.%lld.ffn_up_exps.bias", L) &&
                    KG_ADD(KG_GGML_TYPE_F32, E, X, 0.0f, 0.1f * resid,
                           "blk.%lld.ffn_down_exps.bias", L);
            }
            if (fam->glm || fam->mla || fam->llama4) {
                /* the selection bias (DeepSeek V3's e_score_correction_bias):
                 * large enough to change which experts win; V2-Lite and llama4 have none */
                const int64_t FS = fam->llama4 ? FX : o->n_expert_shared * FX;
                ok = ok &&
                     (QL == 0 || fam->llama4 ||
                      KG_ADD(KG_GGML_TYPE_F32, X, 1, 0.0f, 0.3f, "blk.%lld.exp_probs_b.bias", L));
                if (FS > 0) {
                    ok = ok && KG_ADD(wt, E, FS, 0.0f, fe, "blk.%lld.ffn_gate_shexp.weight", L) &&
                         KG_ADD(wt, FS, E, 0.0f, fan_in_scale(FS) * resid,
                                "blk.%lld.ffn_down_shexp.weight", L) &&
                         KG_ADD(wt, E, FS, 0.0f, fe, "blk.%lld.ffn_up_shexp.weight", L);
                }
            }
        } else if (fam->fused) {
            ok = ok && KG_ADD(wt, E, 2 * F, 0.0f, fe, "blk.%lld.ffn_up.weight", L) &&
                 KG_ADD(wt, F, E, 0.0f, fan_in_scale(F) * resid, "blk.%lld.ffn_down.weight", L);
        } else if (fam->xielu) {
            ok = ok &&
                 KG_ADD(wt, F, E, 0.0f, fan_in_scale(F) * resid, "blk.%lld.ffn_down.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L);
        } else {
            ok = ok && KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_gate.weight", L) &&
                 KG_ADD(wt, F, E, 0.0f, fan_in_scale(F) * resid, "blk.%lld.ffn_down.weight", L) &&
                 KG_ADD(wt, E, F, 0.0f, fe, "blk.%lld.ffn_up.weight", L);
        }
        if (fam->post_norms) {
            ok = ok && KG_ADD(KG_GGML_TYPE_F32, E, 1, post, 0.1f * post,
                              "blk.%lld.post_ffw_norm.weight", L);
        }
        if (l >= o->n_layer) {
            /* a next-token-prediction block (Glm4MoeModel's converter): the
             * block's own tensors above plus these */
            ok = ok &&
                 KG_ADD(wt, 2 * E, E, 0.0f, fan_in_scale(2 * E), "blk.%lld.nextn.eh_proj.weight",
                        L) &&
                 KG_ADD(KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f, "blk.%lld.nextn.enorm.weight", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f, "blk.%lld.nextn.hnorm.weight", L) &&
                 KG_ADD(KG_GGML_TYPE_F32, E, 1, 1.0f, 0.1f,
                        "blk.%lld.nextn.shared_head_norm.weight", L);
        }
        if (!ok) {
            return false;
        }
    }
#undef KG_ADD
    return true;
}

// ---- tokenizer ----

/** Copy every tokenizer.* key of `path`; the vocabulary size, or -1. */
static int64_t copy_vocab(kg_gguf_writer_t *w, const char *path) {
    char err[400];
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    if (!g) {
        snprintf(g_err, sizeof(g_err), "--vocab-from: %s", err);
        return -1;
    }
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (!kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) || et != KG_GGUF_TYPE_STRING ||
        n == 0 || n > INT32_MAX) {
        snprintf(g_err, sizeof(g_err), "--vocab-from %s: no tokenizer.ggml.tokens string array",
                 path);
        kg_gguf_free(g);
        return -1;
    }
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t k = kg_gguf_key(g, i);
        if (k.len > 10 && memcmp(k.data, "tokenizer.", 10) == 0) {
            kg_gguf_writer_copy_kv(w, g, i);
        }
    }
    kg_gguf_free(g);
    return (int64_t)n;
}

bool kg_mkmodel_random(kg_gguf_writer_t *w,
                       const kg_mkmodel_opts_t *o,
                       const char *name,
                       kg_ggml_type_t type,
                       int64_t ne0,
                       int64_t ne1,
                       float center,
                       float scale,
                       char *err,
                       size_t cap) {
    if (!add_random(w, o, name, type, ne0, ne1, center, scale)) {
        snprintf(err, cap, "%s", g_err);
        return false;
    }
    return true;
}

int64_t kg_mkmodel_copy_vocab(kg_gguf_writer_t *w, const char *path, char *err, size_t cap) {
    const int64_t n = copy_vocab(w, path);
    if (n < 0) {
        snprintf(err, cap, "%s", g_err);
    }
    return n;
}

// ---- options ----

/** llama.cpp's general.file_type (llama_ftype) for the weights' type. */
static uint32_t file_type(kg_ggml_type_t t) {
    switch (t) {
    case KG_GGML_TYPE_F16:
        return 1;
    case KG_GGML_TYPE_Q4_0:
        return 2;
    case KG_GGML_TYPE_Q8_0:
        return 7;
    case KG_GGML_TYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

uint32_t kg_mkmodel_file_type(kg_ggml_type_t t) {
    return file_type(t);
}

kg_mkmodel_opts_t kg_mkmodel_opts_default(void) {
    kg_mkmodel_opts_t o = {.name = "kgen-random",
                           .arch = "llama",
                           .ctx = 2048,
                           .rope_base = 10000.0f,
                           .type = KG_GGML_TYPE_F32,
                           .swa_pattern = -1,
                           .pooling = -1,
                           .n_expert_shared = -1,
                           .n_layer_dense = -1,
                           .n_nextn = -1,
                           .q_lora_rank = -1};
    return o;
}

/* The hyperparameter keys each family's converter writes (llama.cpp's
 * convert_hf_to_gguf.py: LlamaModel, TextModel for Qwen2/Qwen3, Gemma2Model,
 * Gemma3Model, Phi3MiniModel). */
static void write_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, const family_t *fam) {
    const char *a = fam->gguf_arch;
    char key[128];
    const bool llama = strcmp(a, "llama") == 0, phi3 = strcmp(a, "phi3") == 0;
    /* EmbeddingGemma's keys are Gemma 3's (window, pattern, RoPE bases) */
    const bool gemma_embd = strcmp(a, "gemma-embedding") == 0;
    const bool gemma2 = strcmp(a, "gemma2") == 0, gemma3 = strcmp(a, "gemma3") == 0 || gemma_embd;
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
    kg_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)o->ctx);
    if (phi3 && o->rope_orig_ctx > 0) {
        kg_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                               (uint32_t)o->rope_orig_ctx);
    }
    kg_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)o->n_embd);
    kg_gguf_writer_set_u32(w, KEY("block_count"),
                           (uint32_t)(o->n_layer + (fam->glm ? o->n_nextn : 0)));
    kg_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)o->n_ff);
    if (llama || phi3 || fam->norm_rope || fam->glm || fam->mla) {
        kg_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)n_rot_of(o));
    }
    kg_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)o->n_head);
    kg_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)o->n_head_kv);
    /* Qwen3 and Gemma configs carry head_dim, so their converters always
     * write it; the others only have it when it is not n_embd / n_head */
    if (fam->mla) {
        /* DeepseekV2Model: MLA as MQA over the latent rows */
        const int64_t R = o->kv_lora_rank;
        kg_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)(R + n_rot_of(o)));
        kg_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)R);
        kg_gguf_writer_set_u32(w, KEY("attention.key_length_mla"), (uint32_t)o->head_dim);
        kg_gguf_writer_set_u32(w, KEY("attention.value_length_mla"), (uint32_t)o->v_head_dim);
        kg_gguf_writer_set_u32(w, KEY("attention.kv_lora_rank"), (uint32_t)R);
        /* the converter writes none for V2-Lite (q_lora_rank null), which
         * llama.cpp then only takes at V2-Lite's 27 layers: 0 says it for
         * any depth */
        kg_gguf_writer_set_u32(w, KEY("attention.q_lora_rank"), (uint32_t)o->q_lora_rank);
        if (o->rope_scaling && strcmp(o->rope_scaling, "yarn") == 0) {
            /* 0.1 x V3's mscale_all_dim 1.0 */
            kg_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), 0.1f);
        }
    } else if (strcmp(a, "qwen3") == 0 || strcmp(a, "qwen3moe") == 0 || fam->oss || gemma2 ||
               gemma3 || strcmp(a, "seed_oss") == 0 || o->head_dim * o->n_head != o->n_embd) {
        kg_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)o->head_dim);
        kg_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)o->head_dim);
    }
    kg_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), fam->rms_eps);
    if (!gemma2 || o->rope_base != 10000.0f) { /* Gemma2Model writes no RoPE base */
        kg_gguf_writer_set_f32(w, KEY("rope.freq_base"), o->rope_base);
    }
    if (o->rope_scaling && !is_longrope(o)) {
        kg_gguf_writer_set_str(w, KEY("rope.scaling.type"), o->rope_scaling);
        if (o->rope_factor > 0.0f) {
            kg_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), o->rope_factor);
        }
        if (strcmp(o->rope_scaling, "yarn") == 0 && o->rope_orig_ctx > 0) {
            kg_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                   (uint32_t)o->rope_orig_ctx);
        }
    }
    if (is_longrope(o)) {
        /* Phi3MiniModel: sqrt(1 + ln(scale) / ln(original context)) */
        const double scale = (double)o->ctx / (double)o->rope_orig_ctx;
        const double f = scale > 1.0 ? sqrt(1.0 + log(scale) / log((double)o->rope_orig_ctx)) : 1.0;
        kg_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), (float)f);
    }
    if (gemma2) {
        kg_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"),
                               o->attn_softcap > 0.0f ? o->attn_softcap : 50.0f);
        kg_gguf_writer_set_f32(w, KEY("final_logit_softcapping"),
                               o->final_softcap > 0.0f ? o->final_softcap : 30.0f);
    } else if (gemma3 && o->final_softcap > 0.0f) {
        kg_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), o->final_softcap);
    }
    if (gemma2 || gemma3 || phi3) {
        const int64_t def = gemma2 ? 4096 : gemma3 ? 512 : 0;
        kg_gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                               (uint32_t)(o->sliding_window > 0 ? o->sliding_window : def));
    }
    if (strcmp(a, "olmo2") == 0 && o->sliding_window > 0) { /* Olmo 3 */
        kg_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)o->sliding_window);
    }
    if (fam->oss) {
        kg_gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                               (uint32_t)(o->sliding_window > 0 ? o->sliding_window : 128));
    }
    if (fam->moe) {
        kg_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)o->n_expert);
        kg_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)o->n_expert_used);
        if (strcmp(a, "llama") != 0) {
            kg_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)o->n_ff_exp);
        }
    }
    if (fam->mla) {
        /* DeepSeek V3: routed_scaling_factor 2.5, norm_topk_prob, sigmoid
         * gating; V2-Lite (no q_lora_rank): neither key, softmax by default */
        kg_gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)o->n_expert_shared);
        kg_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)o->n_layer_dense);
        kg_gguf_writer_set_f32(w, KEY("expert_weights_scale"), o->q_lora_rank > 0 ? 2.5f : 1.0f);
        if (o->q_lora_rank > 0) {
            kg_gguf_writer_set_u32(w, KEY("expert_gating_func"), 2);
            kg_gguf_writer_set_bool(w, KEY("expert_weights_norm"), true);
        }
        if (o->n_expert_groups > 0) {
            kg_gguf_writer_set_u32(w, KEY("expert_group_count"), (uint32_t)o->n_expert_groups);
            kg_gguf_writer_set_u32(w, KEY("expert_group_used_count"), (uint32_t)o->n_group_used);
        }
    }
    if (fam->glm) {
        /* Glm4MoeModel: GLM-4.5's routed_scaling_factor 2.5 and
         * norm_topk_prob, sigmoid gating (2) */
        kg_gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)o->n_expert_shared);
        kg_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)o->n_layer_dense);
        kg_gguf_writer_set_u32(w, KEY("expert_gating_func"), 2);
        kg_gguf_writer_set_f32(w, KEY("expert_weights_scale"), 2.5f);
        kg_gguf_writer_set_bool(w, KEY("expert_weights_norm"), true);
        if (o->n_nextn > 0) {
            kg_gguf_writer_set_u32(w, KEY("nextn_predict_layers"), (uint32_t)o->n_nextn);
        }
        if (o->n_expert_groups > 0) {
            kg_gguf_writer_set_u32(w, KEY("expert_group_count"), (uint32_t)o->n_expert_groups);
            kg_gguf_writer_set_u32(w, KEY("expert_group_used_count"), (uint32_t)o->n_group_used);
        }
    }
    if ((gemma2 || gemma3) && o->swa_pattern >= 0) {
        kg_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"),
                               (uint32_t)o->swa_pattern);
    }
    if (fam->llama4_temp) {
        /* Ministral 3's llama_4_scaling_beta and mscale_all_dim 1; betas
         * apart from its (and the default) 32 and 1, small enough to move
         * YaRN's blend range for a short original context, so that reading
         * them is tested */
        kg_gguf_writer_set_f32(w, KEY("attention.temperature_scale"), 0.1f);
        if (o->rope_scaling && strcmp(o->rope_scaling, "yarn") == 0) {
            kg_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 2.0f);
            kg_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 0.5f);
            kg_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), 1.0f);
        }
    }
    if (fam->xielu) {
        /* the raw values ApertusModel writes per layer (op parameters are
         * made from them: softplus), varied by layer as trained ones are */
        float an[64], ap[64], beta[64], eps[64];
        const int64_t n = o->n_layer < 64 ? o->n_layer : 64;
        for (int64_t l = 0; l < n; l++) {
            an[l] = 0.8f + 0.05f * (float)l;
            ap[l] = 0.6f - 0.05f * (float)l;
            beta[l] = 0.5f;
            eps[l] = -1e-6f;
        }
        kg_gguf_writer_set_arr(w, "xielu.alpha_n", KG_GGUF_TYPE_FLOAT32, an, (uint64_t)n);
        kg_gguf_writer_set_arr(w, "xielu.alpha_p", KG_GGUF_TYPE_FLOAT32, ap, (uint64_t)n);
        kg_gguf_writer_set_arr(w, "xielu.beta", KG_GGUF_TYPE_FLOAT32, beta, (uint64_t)n);
        kg_gguf_writer_set_arr(w, "xielu.eps", KG_GGUF_TYPE_FLOAT32, eps, (uint64_t)n);
    }
    if (fam->granite_scales) {
        /* Granite 3.x's multipliers, but a logit scale of 2 rather than 8,
         * so that the random model's greedy picks keep clear margins, and
         * an attention scale apart from 1/sqrt(head_dim) */
        kg_gguf_writer_set_f32(w, KEY("embedding_scale"), 12.0f);
        kg_gguf_writer_set_f32(w, KEY("residual_scale"), 0.22f);
        kg_gguf_writer_set_f32(w, KEY("attention.scale"), 0.75f / sqrtf((float)o->head_dim));
        kg_gguf_writer_set_f32(w, KEY("logit_scale"), 2.0f);
    }
    if ((gemma2 || gemma3) && o->rope_base_swa > 0.0f) {
        kg_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), o->rope_base_swa);
    }
    if (fam->llama4) { /* Llama 4 Maverick's: a dense layer, then a MoE layer */
        kg_gguf_writer_set_u32(w, KEY("interleave_moe_layer_step"), 2);
    }
    if (fam->gemma4) {
        kg_mkmodel_gemma4_hparams(w, o);
    }
    if (fam->lfm2) {
        kg_mkmodel_lfm2_hparams(w, o);
    }
    if (fam->qwen35) {
        kg_mkmodel_qwen35_hparams(w, o, a);
    }
    if (fam->mamba2) {
        kg_mkmodel_mamba2_hparams(w, o);
    }
    if (gemma_embd) {
        /* --sentence-transformers-dense-modules: 768 -> 3072 -> 768 in
         * EmbeddingGemma, n_embd -> 4 n_embd -> n_embd here */
        kg_gguf_writer_set_u32(w, KEY("dense_2_feat_in"), (uint32_t)o->n_embd);
        kg_gguf_writer_set_u32(w, KEY("dense_2_feat_out"), (uint32_t)(4 * o->n_embd));
        kg_gguf_writer_set_u32(w, KEY("dense_3_feat_in"), (uint32_t)(4 * o->n_embd));
        kg_gguf_writer_set_u32(w, KEY("dense_3_feat_out"), (uint32_t)o->n_embd);
    }
#undef KEY
}

static kg_status_t write_model(const kg_mkmodel_opts_t *opts,
                               const char *tmpl_text,
                               int64_t *n_vocab_out,
                               char *errstr,
                               size_t errstr_size);

kg_status_t kg_mkmodel_write(const kg_mkmodel_opts_t *opts,
                             int64_t *n_vocab_out,
                             char *errstr,
                             size_t errstr_size) {
    if (!opts->chat_template_file) {
        return write_model(opts, NULL, n_vocab_out, errstr, errstr_size);
    }
    char *text = kg_mkmodel_read_template(opts->chat_template_file, errstr, errstr_size);
    if (!text) {
        return KG_ERR_IO;
    }
    kg_status_t rc = write_model(opts, text, n_vocab_out, errstr, errstr_size);
    free(text);
    return rc;
}

/* kg_mkmodel_write with the template text read (tmpl_text, or NULL). */
static kg_status_t write_model(const kg_mkmodel_opts_t *opts,
                               const char *tmpl_text,
                               int64_t *n_vocab_out,
                               char *errstr,
                               size_t errstr_size) {
    kg_status_t rc = KG_ERR_IO;
    g_err[0] = '\0';
    const family_t *fam = find_family(opts->arch);
    const char *tmpl = tmpl_text;
    if (!fam && opts->arch &&
        (strcmp(opts->arch, "bert") == 0 || strcmp(opts->arch, "nomic-bert") == 0)) {
        g_mix.on = opts->ftype != KG_FTYPE_ALL_F32; /* each tensor typed by the mix */
        g_mix.ftype = opts->ftype;
        g_mix.pure = opts->pure;
        g_mix.model = (kg_quant_mix_model_t){.arch = opts->arch,
                                             .n_layer = (int32_t)opts->n_layer,
                                             .n_head = (int32_t)opts->n_head,
                                             .n_head_kv = (int32_t)opts->n_head_kv};
        return kg_mkmodel_write_bert(opts, n_vocab_out, errstr, errstr_size);
    }
    if (!fam) {
        snprintf(errstr, errstr_size, "unknown architecture '%s' (known: " KG_MKMODEL_ARCHS ")",
                 opts->arch);
        return KG_ERR_INVALID;
    }
    /* Gemma 4 and Granite 4 have experts when asked for them (26B-A4B; 4.0-H Tiny, Small) */
    const bool moe = fam->moe || ((fam->gemma4 || fam->mamba2) && opts->n_expert > 0);
    kg_mkmodel_opts_t mo = *opts; /* with the expert defaults filled in */
    const kg_mkmodel_opts_t *o = &mo;
    if (fam->mla) {
        mo.n_expert_shared = mo.n_expert_shared >= 0 ? mo.n_expert_shared : 1;
        mo.n_layer_dense = mo.n_layer_dense >= 0 ? mo.n_layer_dense : 1;
        mo.n_expert_groups = mo.n_expert_groups > 0 ? mo.n_expert_groups : 0;
        mo.n_rot = mo.n_rot > 0 ? mo.n_rot : mo.head_dim / 3 / 2 * 2; /* V3: 64 of 192 */
        mo.kv_lora_rank = mo.kv_lora_rank > 0 ? mo.kv_lora_rank : 4 * (mo.head_dim - mo.n_rot);
        mo.q_lora_rank = mo.q_lora_rank >= 0 ? mo.q_lora_rank : 3 * mo.kv_lora_rank;
        mo.v_head_dim = mo.v_head_dim > 0 ? mo.v_head_dim : mo.head_dim - mo.n_rot;
        if (mo.n_rot >= mo.head_dim || mo.n_head_kv != 1 || mo.n_layer_dense > mo.n_layer ||
            mo.n_nextn > 0 || mo.kv_lora_rank + mo.n_rot > 1024) {
            snprintf(errstr, errstr_size,
                     "deepseek2: --n-rot below --head-dim (the nope dims), --n-head-kv 1, at most "
                     "--n-layer leading dense layers, no nextn blocks, kv_lora_rank + n_rot at "
                     "most 1024");
            return KG_ERR_INVALID;
        }
    } else if (mo.q_lora_rank >= 0 || mo.kv_lora_rank > 0 || mo.v_head_dim > 0) {
        snprintf(errstr, errstr_size,
                 "--q-lora-rank, --kv-lora-rank and --v-head-dim are for "
                 "deepseek2");
        return KG_ERR_INVALID;
    } else if (fam->glm) {
        mo.n_expert_shared = mo.n_expert_shared >= 0 ? mo.n_expert_shared : 1;
        mo.n_layer_dense = mo.n_layer_dense >= 0 ? mo.n_layer_dense : 1;
        mo.n_nextn = mo.n_nextn >= 0 ? mo.n_nextn : 1;
        mo.n_expert_groups = mo.n_expert_groups > 0 ? mo.n_expert_groups : 0;
        mo.n_rot =
            mo.n_rot > 0 ? mo.n_rot : mo.head_dim / 2 / 2 * 2; /* partial_rotary_factor 0.5 */
        if (mo.n_layer_dense > mo.n_layer || mo.n_expert_shared > 64 || mo.n_nextn > 4) {
            snprintf(errstr, errstr_size,
                     "glm4moe: at most --n-layer leading dense layers, 64 shared experts and 4 "
                     "nextn blocks");
            return KG_ERR_INVALID;
        }
    } else if (fam->lfm2 && fam->moe) { /* the rest: kg_mkmodel_lfm2_check */
        mo.n_layer_dense = mo.n_layer_dense >= 0 ? mo.n_layer_dense : 1;
    } else if (!fam->mla && (mo.n_expert_shared >= 0 || mo.n_layer_dense >= 0 || mo.n_nextn >= 0 ||
                             mo.n_expert_groups > 0)) {
        snprintf(errstr, errstr_size,
                 "shared experts, leading dense layers, nextn blocks and expert groups are for "
                 "glm4moe, not %s",
                 fam->arch);
        return KG_ERR_INVALID;
    }
    if (moe) {
        mo.n_expert = mo.n_expert > 0 ? mo.n_expert : 8;
        mo.n_expert_used = mo.n_expert_used > 0 ? mo.n_expert_used : 2;
        mo.n_ff_exp =
            mo.n_ff_exp > 0 && strcmp(fam->gguf_arch, "llama") != 0 ? mo.n_ff_exp : mo.n_ff;
        /* the experts' type; a mix falls back to 32-blocks where a row is
         * not a multiple of 256, so 32 is what it needs */
        kg_ggml_type_t xt = mo.has_expert_type ? mo.expert_type : mo.type;
        int64_t xb = kg_type_block_elems(xt);
        if (!mo.has_expert_type && mo.ftype == KG_FTYPE_MOSTLY_MXFP4_MOE) {
            xt = KG_GGML_TYPE_MXFP4;
            xb = kg_type_block_elems(xt);
        } else if (!mo.has_expert_type && mo.ftype != KG_FTYPE_ALL_F32) {
            xt = kg_ftype_base_type(mo.ftype);
            xb = mo.pure ? kg_type_block_elems(xt) : kg_type_is_quantized(xt) ? 32 : 1;
        }
        if (mo.n_expert_used > mo.n_expert || mo.n_expert > 1024 || xb == 0 ||
            mo.n_embd % xb != 0 || mo.n_ff_exp % xb != 0) {
            snprintf(errstr, errstr_size,
                     "experts: need 1 <= expert_used_count (%lld) <= expert_count (%lld) <= 1024, "
                     "and n_embd and the expert width multiples of %s's block (%lld)",
                     (long long)mo.n_expert_used, (long long)mo.n_expert, kg_ggml_type_name(xt),
                     (long long)xb);
            return KG_ERR_INVALID;
        }
    } else if (mo.n_expert > 0 || mo.n_expert_used > 0 || mo.n_ff_exp > 0 || mo.has_expert_type ||
               mo.ftype == KG_FTYPE_MOSTLY_MXFP4_MOE) {
        snprintf(errstr, errstr_size,
                 "expert options are for qwen3moe, mixtral, gpt-oss, glm4moe, deepseek2, "
                 "gemma4 and granitehybrid (with --n-expert), not %s",
                 fam->arch);
        return KG_ERR_INVALID;
    }
    if (o->chat_template) {
        const char *names;
        tmpl = kg_mkmodel_chat_template(o->chat_template, &names);
        if (!tmpl) {
            snprintf(errstr, errstr_size, "unknown chat template '%s' (known: %s)",
                     o->chat_template, names);
            return KG_ERR_INVALID;
        }
    }
    if (is_longrope(o) && (strcmp(fam->arch, "phi3") != 0 || o->rope_orig_ctx <= 0)) {
        snprintf(errstr, errstr_size,
                 "longrope needs --arch phi3 and an original context (rope_orig_ctx)");
        return KG_ERR_INVALID;
    }
    const char *g4 = fam->gemma4   ? kg_mkmodel_gemma4_check(o)
                     : fam->mamba2 ? kg_mkmodel_mamba2_check(o)
                     : fam->lfm2   ? kg_mkmodel_lfm2_check(o)
                                   : NULL;
    if (g4) {
        snprintf(errstr, errstr_size, "%s", g4);
        return KG_ERR_INVALID;
    }
    if (fam->xielu && o->n_layer > 64) {
        snprintf(errstr, errstr_size, "apertus: at most 64 layers (its xielu.* arrays)");
        return KG_ERR_INVALID;
    }
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    if (!w) {
        snprintf(errstr, errstr_size, "out of memory");
        return KG_ERR_NOMEM;
    }
    g_mix.on = o->ftype != KG_FTYPE_ALL_F32;
    g_mix.ftype = o->ftype;
    g_mix.pure = o->pure;
    g_mix.model = (kg_quant_mix_model_t){.arch = fam->gguf_arch,
                                         .n_layer = (int32_t)o->n_layer,
                                         .n_head = (int32_t)o->n_head,
                                         .n_head_kv = (int32_t)o->n_head_kv,
                                         .has_output = !o->tied && !fam->always_tied,
                                         .n_expert = moe ? (int32_t)o->n_expert : 0};
    kg_gguf_writer_set_str(w, "general.architecture", fam->gguf_arch);
    kg_gguf_writer_set_str(w, "general.name", o->name);
    write_hparams(w, o, fam);
    /* llama_ftype: the mix's, or MOSTLY_MXFP4_MOE (38) for MXFP4 experts */
    const bool mxfp4_moe = o->has_expert_type && o->expert_type == KG_GGML_TYPE_MXFP4;
    kg_gguf_writer_set_u32(w, "general.file_type",
                           g_mix.on    ? (uint32_t)o->ftype
                           : mxfp4_moe ? (uint32_t)KG_FTYPE_MOSTLY_MXFP4_MOE
                                       : file_type(o->type));
    if (kg_type_is_quantized(g_mix.on ? kg_ftype_base_type(o->ftype) : o->type)) {
        kg_gguf_writer_set_u32(w, "general.quantization_version", 2); /* ggml's QNT_VERSION */
    }

    int64_t n_vocab =
        o->vocab_from
            ? copy_vocab(w, o->vocab_from)
            : kg_mkvocab_add(w,
                             /* a thinking template needs the think tokens, a tool
                              * template the call markers */
                             fam->vocab == KG_MKVOCAB_QWEN && tmpl && strstr(tmpl, "</think>")
                                 ? KG_MKVOCAB_QWEN3
                             : fam->vocab == KG_MKVOCAB_QWEN && tmpl && strstr(tmpl, "<tool_call>")
                                 ? KG_MKVOCAB_QWEN_TOOLS
                             : fam->vocab == KG_MKVOCAB_QWEN && tmpl && strstr(tmpl, "[TOOL_CALLS]")
                                 ? KG_MKVOCAB_MISTRAL_TOOLS
                             : fam->vocab == KG_MKVOCAB_QWEN && tmpl && strstr(tmpl, "<function=")
                                 ? KG_MKVOCAB_FN_TOOLS
                                 : fam->vocab,
                             o->n_words, g_err, sizeof(g_err));
    if (n_vocab < 0) {
        goto out;
    }
    if (fam->qwen35 && strcmp(fam->gguf_arch, "qwen3next") != 0 && !o->vocab_from) {
        /* Qwen's BPE with Qwen3.5's pre-tokenizer */
        kg_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen35");
    }
    if (tmpl) {
        kg_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
    }
    /* EmbeddingGemma's Sentence-Transformers config pools by the mean */
    const int32_t def_pool = strcmp(fam->gguf_arch, "gemma-embedding") == 0 ? 1 : -1;
    if (o->pooling >= 0 || o->rerank || def_pool >= 0) {
        char key[64];
        snprintf(key, sizeof(key), "%s.pooling_type", fam->gguf_arch);
        kg_gguf_writer_set_u32(w, key,
                               (uint32_t)(o->pooling >= 0 ? o->pooling
                                          : o->rerank     ? 4
                                                          : def_pool));
    }
    if (o->rerank) {
        /* what convert_hf_to_gguf.py writes for Qwen3-Reranker: the head is
         * the lm_head rows of "yes" and "no" (here random rows) */
        const kg_gguf_str_t labels[2] = {{"yes", 3}, {"no", 2}};
        char key[64];
        snprintf(key, sizeof(key), "%s.classifier.output_labels", fam->gguf_arch);
        kg_gguf_writer_set_arr_str(w, key, labels, 2);
        if (!add_random(w, o, "cls.output.weight", o->type, o->n_embd, 2, 0.0f,
                        fan_in_scale(o->n_embd))) {
            goto out;
        }
    }
    if (fam->vocab == KG_MKVOCAB_LLAMA) {
        kg_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)n_vocab);
    }
    if (fam->mla) {
        kg_gguf_writer_set_u32(w, "deepseek2.vocab_size", (uint32_t)n_vocab);
    }
    if (!add_weights(w, o, fam, n_vocab)) {
        goto out;
    }
    if (kg_gguf_writer_write(w, o->out, g_err, sizeof(g_err)) != KG_OK) {
        goto out;
    }
    if (n_vocab_out) {
        *n_vocab_out = n_vocab;
    }
    rc = KG_OK;
out:
    if (rc != KG_OK) {
        snprintf(errstr, errstr_size, "%s", g_err[0] ? g_err : "cannot write the model");
    }
    kg_gguf_writer_free(w);
    return rc;
}
