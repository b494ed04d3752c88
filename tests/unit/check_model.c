/* check_model: the model loader. Each family's switches and per-layer
 * attributes as llama.cpp reads them (including the values llama.cpp
 * fixes in code: Gemma's layer patterns, window and soft-capping defaults,
 * the 27B query scale, Gemma 3's local RoPE base; YaRN's factors; Phi-3's
 * ignored window and LongRoPE choice), fused-tensor views, the refusals
 * (unknown architecture or RoPE scaling, a tensor the graph would not
 * use), the feature bits and the backend choice they drive. Models are
 * written with `kgen mkmodel`, then some keys or tensors are changed with
 * the GGUF writer. */
#include "backend/kg_backend.h"
#include "backend/kg_math.h"
#include "check_common.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SMALL "--n-embd 32 --n-head 2 --n-head-kv 1 --n-ff 64 --ctx 256 --seed 3"

/* `kgen mkmodel --out <tmp> <args>`, in process; a copy of the path (caller frees). */
static char *mk(const char *args) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("model"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    return strdup(path);
}

/* A changed copy of `src`: keys in `drop` (NULL-terminated) left out, then
 * `edit` may add keys; an extra 1-D F32 tensor `extra` (of n elements) when
 * not NULL. Returns the new path (caller frees). */
static char *rewrite(const char *src,
                     const char *const *drop,
                     void (*edit)(kg_gguf_writer_t *w),
                     const char *extra,
                     int64_t n_extra) {
    char err[256];
    kg_gguf_t *g = kg_gguf_open(src, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t k = kg_gguf_key(g, i);
        bool skip = false;
        for (int d = 0; drop && drop[d]; d++) {
            skip |= k.len == strlen(drop[d]) && memcmp(k.data, drop[d], k.len) == 0;
        }
        if (!skip) {
            kg_gguf_writer_copy_kv(w, g, i);
        }
    }
    if (edit) {
        edit(w);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        ck_assert_int_eq(
            kg_gguf_writer_add_tensor_raw(w, name, t->type, t->n_dims, t->ne, t->data, t->size),
            KG_OK);
    }
    if (extra) {
        float *v = calloc((size_t)n_extra, sizeof(float));
        int64_t ne[1] = {n_extra};
        ck_assert_int_eq(kg_gguf_writer_add_tensor(w, extra, KG_GGML_TYPE_F32, 1, ne, v), KG_OK);
        free(v);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("model-rw"));
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_free(g);
    return strdup(path);
}

static kg_model_t *load_ok(char *path) {
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    free(path);
    return m;
}

/* Loading fails with a message containing every string of `want`. */
static void load_fails(char *path, const char *const *want) {
    char err[512] = "";
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m == NULL, "%s loaded", path);
    for (int i = 0; want[i]; i++) {
        ck_assert_msg(strstr(err, want[i]) != NULL, "error '%s' lacks '%s'", err, want[i]);
    }
    remove(path);
    free(path);
}

// ---- each family's switches ----

/* What the loader must read from each family's file (the rows' checks). */
static void loads_llama(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.arch, KG_ARCH_LLAMA);
    ck_assert_int_eq(m->hp.rope_mode, KG_ROPE_MODE_NORM);
    ck_assert_int_eq(m->hp.rope_scaling, KG_ROPE_SCALING_LINEAR); /* llama.cpp's default */
    ck_assert(m->hp.rope_scale == 1.0f && m->hp.yarn_ext_factor == 0.0f);
    ck_assert(m->hp.yarn_attn_factor == 1.0f && m->hp.q_scale == 0.0f);
    ck_assert_uint_eq(kg_model_features(m), 0);
    ck_assert_int_eq(kg_model_kv_window(m), 0);
    for (int il = 0; il < 2; il++) {
        ck_assert_int_eq(m->layers[il].n_swa, 0);
        ck_assert(m->layers[il].rope_base == 10000.0f && m->layers[il].rope_scale == 1.0f);
        ck_assert_ptr_null(m->layers[il].bq);
    }
}

/* qwen2: biases and YaRN */
static void loads_qwen2(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->rope_mode, KG_ROPE_MODE_NEOX);
    ck_assert_int_eq(hp->rope_scaling, KG_ROPE_SCALING_YARN);
    ck_assert(hp->rope_scale == 0.25f && hp->yarn_ext_factor == 1.0f);
    ck_assert(hp->yarn_beta_fast == 32.0f && hp->yarn_beta_slow == 1.0f);
    ck_assert_int_eq(hp->n_ctx_orig, 64);
    /* llama_context: mscale(4) times its cancellation, in float */
    float f = 4.0f, want = 0.1f * 1.0f * logf(f) + 1.0f;
    want *= 1.0f / (1.0f + 0.1f * logf(f));
    ck_assert(hp->yarn_attn_factor == want);
    ck_assert_ptr_nonnull(m->layers[1].bq);
    ck_assert_int_eq(m->layers[1].bk->ne[0], 16);
    ck_assert_uint_eq(kg_model_features(m),
                      KG_MODEL_FEAT_QKV_BIAS | KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_ROPE_YARN);
}

/* qwen3: the QK norms and a head dimension of its own */
static void loads_qwen3(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.head_dim, 64); /* key_length, not n_embd / n_head */
    ck_assert_int_eq(m->hp.n_rot, 64);
    ck_assert_int_eq(m->layers[0].q_norm->ne[0], 64);
    ck_assert_int_eq(m->layers[0].wq->ne[1], 128);
    ck_assert_int_eq(m->layers[0].wo->ne[0], 128);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_ROPE_NEOX);
}

/* gemma2 without its window and soft-capping keys: llama.cpp's values from code */
static void loads_gemma2_defaults(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->n_swa, 4096);
    ck_assert(hp->attn_softcap == 50.0f && hp->final_softcap == 30.0f);
    ck_assert(hp->embd_scale == sqrtf(32.0f));
    ck_assert(hp->q_scale == 1.0f / sqrtf(32.0f)); /* head_dim */
    ck_assert_int_eq(hp->ffn_act, KG_FFN_GELU);
    ck_assert(hp->tied);
    /* pattern 2: even layers local */
    ck_assert_int_eq(m->layers[0].n_swa, 4096);
    ck_assert_int_eq(m->layers[1].n_swa, 0);
    ck_assert_int_eq(m->layers[2].n_swa, 4096);
    ck_assert_int_eq(kg_model_kv_window(m), 0);
    ck_assert_ptr_nonnull(m->layers[2].ffn_post_norm);
}

/* the 27B shape (46 layers): n_embd / n_head instead of head_dim */
static void loads_gemma2_27b(const kg_model_t *m) {
    ck_assert(m->hp.q_scale == 1.0f / sqrtf(16.0f));
}

/* default pattern 6 over 7 layers: 0..4 local (base 10000, unscaled),
 * 5 global (the file's base and linear factor), 6 local */
static void loads_gemma3(const kg_model_t *m) {
    for (int il = 0; il < 7; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        const bool global = il == 5;
        ck_assert_int_eq(L->n_swa, global ? 0 : 16);
        ck_assert(L->rope_base == (global ? 1000000.0f : 10000.0f));
        ck_assert(L->rope_scale == (global ? 0.125f : 1.0f));
        ck_assert_ptr_nonnull(L->k_norm);
    }
    ck_assert(m->hp.final_softcap == 0.0f && m->hp.attn_softcap == 0.0f);
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_ROPE_PER_LAYER);
    ck_assert(!m->hp.tied);
}

/* phi3: fused-tensor views and LongRoPE */
static void loads_phi3(const kg_model_t *m) {
    const kg_layer_weights_t *L = &m->layers[0];
    const kg_gguf_tensor_t *qkv = kg_gguf_find_tensor(m->gguf, "blk.0.attn_qkv.weight");
    const kg_gguf_tensor_t *up = kg_gguf_find_tensor(m->gguf, "blk.0.ffn_up.weight");
    ck_assert_ptr_eq(L->wq->data, qkv->data);
    ck_assert_ptr_eq(L->wk->data, (const char *)qkv->data + 32 * 32 * 4);
    ck_assert_ptr_eq(L->wv->data, (const char *)qkv->data + 64 * 32 * 4);
    ck_assert_int_eq(L->wv->ne[1], 32);
    ck_assert_ptr_eq(L->w_gate->data, up->data); /* gate first, then up */
    ck_assert_ptr_eq(L->w_up->data, (const char *)up->data + 64 * 32 * 4);
    ck_assert_int_eq(L->n_swa, 0); /* llama.cpp ignores Phi's window */
    ck_assert(m->hp.q_scale == 1.0f / sqrtf(16.0f));
    ck_assert_int_eq(m->hp.n_rot, 8);
    ck_assert_int_eq(m->hp.n_ctx_orig, 64);
    /* attn_factor sqrt(1 + ln(256 / 64) / ln(64)) is the magnitude */
    ck_assert(fabsf(m->hp.yarn_attn_factor - sqrtf(1.0f + logf(4.0f) / logf(64.0f))) < 1e-6f);
    ck_assert_ptr_eq(kg_model_rope_factors(m, 256), m->rope_long);
    ck_assert_ptr_eq(kg_model_rope_factors(m, 64), m->rope_short);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_ROPE_PARTIAL |
                                                KG_MODEL_FEAT_ROPE_YARN |
                                                KG_MODEL_FEAT_ROPE_FACTORS | KG_MODEL_FEAT_Q_SCALE);
    char names[256];
    ck_assert_str_eq(kg_model_feature_names(kg_model_features(m), names, sizeof(names)),
                     "rope_neox, rope_partial, rope_yarn, rope_factors, q_scale");
}

/* smollm3: llama's RoPE pairs, no RoPE on every fourth layer (3, 7) */
static void loads_smollm3(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.rope_mode, KG_ROPE_MODE_NORM);
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        ck_assert_int_eq(m->layers[il].no_rope, il % 4 == 3);
    }
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_NOPE);
}

/* granite: the four multipliers as the file gives them */
static void loads_granite(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.rope_mode, KG_ROPE_MODE_NORM);
    ck_assert_float_eq(m->hp.embd_scale, 12.0f);
    ck_assert_float_eq(m->hp.residual_scale, 0.22f);
    ck_assert_float_eq(m->hp.kq_scale, 0.75f / sqrtf(16.0f));
    ck_assert_float_eq(m->hp.logit_scale, 2.0f);
    ck_assert(!m->layers[0].no_rope && !m->layers[1].no_rope);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_EMBD_SCALE | KG_MODEL_FEAT_SCALES);
}

/* granite without the optional multipliers, and rope.scaling.finetuned
 * false: no scales but the logit one, and no RoPE in any layer */
static const char *const granite_optional[] = {"granite.residual_scale", "granite.embedding_scale",
                                               "granite.attention.scale", NULL};

static void set_granite_no_rope(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_bool(w, "granite.rope.scaling.finetuned", false);
}

/* olmo2 with a window (Olmo 3): no input norms, Q/K norms over all heads,
 * layers 0-2 of 4 windowed with the global base and no frequency scale */
static void loads_olmo2(const kg_model_t *m) {
    ck_assert(m->hp.qk_norm_full);
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert_ptr_null(L->attn_norm);
        ck_assert_ptr_null(L->ffn_norm);
        ck_assert_int_eq(L->q_norm->ne[0], 32);
        ck_assert_int_eq(L->k_norm->ne[0], 16);
        ck_assert_ptr_nonnull(L->attn_post_norm);
        ck_assert_int_eq(L->n_swa, il % 4 < 3 ? 16 : 0);
        ck_assert_float_eq(L->rope_base, 500000.0f);
        ck_assert_float_eq(L->rope_scale, il % 4 < 3 ? 1.0f : 0.5f);
    }
    ck_assert(!m->hp.tied);
}

/* mistral3: YaRN's betas and log multiplier from the file (factor 4:
 * mscale(4, 1) / mscale(4, 1) / (1 + 0.1 ln 4)), the attention
 * temperature over blocks of the original context */
static void loads_mistral3(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.rope_mode, KG_ROPE_MODE_NORM);
    ck_assert_float_eq(m->hp.yarn_beta_fast, 2.0f);
    ck_assert_float_eq(m->hp.yarn_beta_slow, 0.5f);
    ck_assert_float_eq(m->hp.yarn_attn_factor, 1.0f / (1.0f + 0.1f * logf(4.0f)));
    ck_assert_float_eq(m->hp.attn_temp_scale, 0.1f);
    ck_assert_int_eq(m->hp.attn_temp_floor, 64);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_ROPE_YARN | KG_MODEL_FEAT_ATTN_TEMP);
    /* the temperature: 1 in the first block, log(2) * 0.1 + 1 in the second */
    ck_assert_float_eq(kg_attn_temp(0.1f, 64, 63), 1.0f);
    ck_assert_float_eq(kg_attn_temp(0.1f, 64, 64), (float)(log(2.0) * 0.1f + 1.0));
}

/* llama4: what llama.cpp fixes in code (chunks of 8192 on layers 0-2 of each 4, NoPE and the
 * temperature over blocks of 8192 on the fourth), MoE layers 1 and 3 (interleave step 2) with a
 * shared expert as wide as a routed one, the router's weight on the experts' input, Q/K L2
 * norms (not 128 experts), rope_freqs; the CUDA backend's gate lets it through (`cuda` gets as
 * far as the device: an error naming the device where there is none; check_cuda runs it) */
static void loads_llama4(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert(hp->swa_chunked && hp->attn_temp_nope && hp->qk_l2_norm && hp->moe_w_before);
    ck_assert_int_eq(hp->rope_mode, KG_ROPE_MODE_NORM);
    ck_assert_int_eq(hp->moe_gating, KG_MOE_SIGMOID);
    ck_assert(!hp->moe_norm_w);
    ck_assert_float_eq(hp->attn_temp_scale, 0.1f);
    ck_assert_int_eq(hp->attn_temp_floor, 8192);
    ck_assert_int_eq(hp->n_moe_step, 2);
    ck_assert_ptr_nonnull(m->rope_freqs);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert_int_eq(L->n_swa, il % 4 < 3 ? 8192 : 0);
        ck_assert(L->no_rope == (il % 4 == 3));
        ck_assert(!L->ffn_gate_inp == (il % 2 == 0));
        ck_assert(!L->w_down == (il % 2 == 1));
        ck_assert(!L->gate_shexp || L->gate_shexp->ne[1] == hp->n_ff_exp);
    }
    kg_backend_params_t bp = {
        .n_threads = 1, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cuda", m, &bp, err, sizeof(err));
#ifdef KG_USE_CUDA
    ck_assert_msg(be != NULL || (strstr(err, "llama4") == NULL && strstr(err, "implement") == NULL),
                  "%s", err);
#else
    ck_assert_ptr_null(be);
#endif
    kg_backend_free(be);
}

/* seed_oss: NeoX pairs, the biases, its FFN norm from post_attention_norm */
static void loads_seed_oss(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.rope_mode, KG_ROPE_MODE_NEOX);
    ck_assert_int_eq(m->hp.head_dim, 32);
    ck_assert_ptr_nonnull(m->layers[0].bq);
    ck_assert_ptr_nonnull(m->layers[0].ffn_norm);
    ck_assert_ptr_null(m->layers[0].attn_post_norm);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_QKV_BIAS);
}

/* apertus: no gate, xIELU's op parameters per layer from the raw values
 * (layer 1: alpha_n 0.85, alpha_p 0.55, beta 0.5, eps -1e-6) */
static void loads_apertus(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.ffn_act, KG_FFN_XIELU);
    ck_assert_ptr_null(m->layers[1].w_gate);
    ck_assert_ptr_nonnull(m->layers[1].q_norm);
    ck_assert_float_eq(m->layers[1].xielu_an, 0.5f + logf(1 + expf(0.8f + 0.05f)));
    ck_assert_float_eq(m->layers[1].xielu_ap, logf(1 + expf(0.6f - 0.05f)));
    ck_assert_float_eq(m->layers[1].xielu_beta, 0.5f);
    ck_assert_float_eq(m->layers[1].xielu_eps, -1e-6f);
    ck_assert_uint_eq(kg_model_features(m),
                      KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_XIELU);
    /* the two branches of the op */
    ck_assert_float_eq(kg_xielu(2.0f, 1.0f, 0.5f, 0.25f, -1e-6f), 0.5f * 2 * 2 + 0.25f * 2);
    ck_assert_float_eq(kg_xielu(-1.0f, 1.0f, 0.5f, 0.25f, -1e-6f),
                       (expm1f(-1.0f) + 1.0f) * 1.0f - 0.25f);
}

static const char *const gemma2_defaults[] = {"gemma2.attention.sliding_window",
                                              "gemma2.attn_logit_softcapping",
                                              "gemma2.final_logit_softcapping", NULL};

/* The families the loader reads (a new family is one row here): `kgen
 * mkmodel` arguments, the keys then left out of the file (NULL: none), and
 * what the loaded model must hold. */
static const struct model_family {
    const char *name;
    const char *args;
    const char *const *drop;
    void (*check)(const kg_model_t *m);
} k_model_families[] = {
    {"llama", "--arch llama --n-layer 2 " SMALL, NULL, loads_llama},
    {"qwen2",
     "--arch qwen2 --n-layer 2 --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 64 " SMALL, NULL,
     loads_qwen2},
    {"qwen3", "--arch qwen3 --n-layer 1 --head-dim 64 " SMALL, NULL, loads_qwen3},
    {"gemma2", "--arch gemma2 --n-layer 3 --head-dim 32 " SMALL, gemma2_defaults,
     loads_gemma2_defaults},
    {"gemma2 27B", "--arch gemma2 --n-layer 46 --head-dim 32 " SMALL, NULL, loads_gemma2_27b},
    {"gemma3",
     "--arch gemma3 --n-layer 7 --head-dim 32 --sliding-window 16 --rope-base 1000000 "
     "--rope-scaling linear --rope-factor 8 " SMALL,
     NULL, loads_gemma3},
    {"phi3",
     "--arch phi3 --n-layer 1 --n-rot 8 --rope-scaling longrope --rope-orig-ctx 64 "
     "--sliding-window 16 --ctx 256 --n-embd 32 --n-head 2 --n-head-kv 2 --n-ff 64 --seed 3",
     NULL, loads_phi3},
    {"smollm3", "--arch smollm3 --n-layer 8 " SMALL, NULL, loads_smollm3},
    {"granite", "--arch granite --n-layer 2 " SMALL, NULL, loads_granite},
    {"olmo2",
     "--arch olmo2 --n-layer 4 --sliding-window 16 --rope-base 500000 --rope-scaling linear "
     "--rope-factor 2 " SMALL,
     NULL, loads_olmo2},
    {"mistral3",
     "--arch mistral3 --n-layer 1 --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 64 " SMALL,
     NULL, loads_mistral3},
    {"seed_oss", "--arch seed_oss --n-layer 1 --head-dim 32 " SMALL, NULL, loads_seed_oss},
    {"apertus", "--arch apertus --n-layer 2 " SMALL, NULL, loads_apertus},
    {"llama4", "--arch llama4 --n-layer 4 --n-ff-exp 32 --n-expert 4 --n-expert-used 1 " SMALL,
     NULL, loads_llama4},
};

/* The row's model, written, edited and loaded. */
static kg_model_t *load_family(const struct model_family *f) {
    char *src = mk(f->args);
    if (!f->drop) {
        return load_ok(src);
    }
    kg_model_t *m = load_ok(rewrite(src, f->drop, NULL, NULL, 0));
    remove(src);
    free(src);
    return m;
}

START_TEST(each_family_loads) {
    kg_model_t *m = load_family(&k_model_families[_i]);
    k_model_families[_i].check(m);
    kg_model_free(m);
}
END_TEST

// ---- refusals ----

static void set_arch_t5(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_str(w, "general.architecture", "t5");
}

static void set_scaling_su(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_str(w, "qwen2.rope.scaling.type", "su");
}

static void set_llama_rot8(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "llama.rope.dimension_count", 8);
}

static void set_llama4_no_chunks(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "llama4.attention.sliding_window", 0);
}

START_TEST(refusals_name_what_is_supported) {
    char *src = mk("--arch qwen2 --n-layer 1 " SMALL);
    load_fails(
        rewrite(src, NULL, set_arch_t5, NULL, 0),
        (const char *[]){"unsupported architecture 't5'", "qwen3", "gemma3", "phi3", "bert", NULL});
    load_fails(rewrite(src, NULL, set_scaling_su, NULL, 0),
               (const char *[]){"rope.scaling.type 'su'", "none, linear, yarn, longrope", NULL});
    /* a tensor the qwen2 graph does not use: refused, not ignored */
    load_fails(rewrite(src, NULL, NULL, "blk.0.ffn_up.bias", 64),
               (const char *[]){"'blk.0.ffn_up.bias'", "qwen2 graph", NULL});
    remove(src);
    free(src);
    /* llama rotating part of a head is refused (llama.cpp refuses it too) */
    char *l = mk("--arch llama --n-layer 1 " SMALL);
    load_fails(rewrite(l, NULL, set_llama_rot8, NULL, 0),
               (const char *[]){"rope.dimension_count equal to the head dimension", NULL});
    remove(l);
    free(l);
    /* llama4: interleave_moe_layer_step is required; sliding_window 0 (MobileLLM-R1, which
     * llama.cpp's graph cannot run either) is refused by name */
    char *l4 = mk("--arch llama4 --n-layer 4 --n-ff-exp 32 --n-expert 4 --n-expert-used 1 " SMALL);
    load_fails(
        rewrite(l4, (const char *[]){"llama4.interleave_moe_layer_step", NULL}, NULL, NULL, 0),
        (const char *[]){"llama4.interleave_moe_layer_step", NULL});
    load_fails(rewrite(l4, NULL, set_llama4_no_chunks, NULL, 0),
               (const char *[]){"attention.sliding_window 0", NULL});
    remove(l4);
    free(l4);
    /* granite's logit_scale is required (llama.cpp's get_key without a default) */
    char *gr = mk("--arch granite --n-layer 1 " SMALL);
    load_fails(rewrite(gr, (const char *[]){"granite.logit_scale", NULL}, NULL, NULL, 0),
               (const char *[]){"granite.logit_scale", NULL});
    /* without the optional ones: defaults; finetuned false: no RoPE at all */
    kg_model_t *m = load_ok(rewrite(gr, granite_optional, set_granite_no_rope, NULL, 0));
    ck_assert(m->hp.embd_scale == 0.0f && m->hp.residual_scale == 0.0f && m->hp.kq_scale == 0.0f);
    ck_assert(m->layers[0].no_rope);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_NOPE | KG_MODEL_FEAT_SCALES);
    kg_model_free(m);
    remove(gr);
    free(gr);
    /* Olmo 3's windowed layers run without YaRN: a file asking for both is
     * refused rather than run with YaRN on every layer */
    char *ol =
        mk("--arch olmo2 --n-layer 4 --sliding-window 16 --rope-scaling yarn --rope-factor 4 "
           "--rope-orig-ctx 64 " SMALL);
    load_fails(ol, (const char *[]){"olmo2 with sliding windows and YaRN", NULL});
    /* apertus's xielu values: required, one per layer */
    char *ap = mk("--arch apertus --n-layer 2 " SMALL);
    load_fails(rewrite(ap, (const char *[]){"xielu.beta", NULL}, NULL, NULL, 0),
               (const char *[]){"'xielu.beta'", "one per layer", NULL});
    remove(ap);
    free(ap);
}
END_TEST

// ---- gemma3's window patterns ----

static void pattern_bools(kg_gguf_writer_t *w) {
    const uint8_t v[4] = {0, 1, 1, 0};
    kg_gguf_writer_set_arr(w, "gemma3.attention.sliding_window_pattern", KG_GGUF_TYPE_BOOL, v, 4);
}

static void pattern_short(kg_gguf_writer_t *w) {
    const int32_t v[3] = {1, 1, 1};
    kg_gguf_writer_set_arr_i32(w, "gemma3.attention.sliding_window_pattern", v, 3);
}

static const char *const gemma3_window[] = {"gemma3.attention.sliding_window", NULL};

/* gemma3's window pattern beyond the default one (each_family_loads'
 * row): patterns as a bool array, of the wrong length, and no window */
START_TEST(gemma3_window_patterns) {
    char *src = mk("--arch gemma3 --n-layer 4 --head-dim 32 --sliding-window 16 "
                   "--rope-base-swa 20000 " SMALL);
    /* every layer local (pattern 6 over 4 layers), rope.freq_base_swa read */
    char *copy = rewrite(src, NULL, NULL, NULL, 0);
    kg_model_t *m = load_ok(copy);
    ck_assert_int_eq(kg_model_kv_window(m), 16);
    ck_assert(m->layers[3].rope_base == 20000.0f);
    kg_model_free(m);
    /* a bool array pattern */
    m = load_ok(rewrite(src, NULL, pattern_bools, NULL, 0));
    ck_assert_int_eq(m->layers[0].n_swa, 0);
    ck_assert_int_eq(m->layers[1].n_swa, 16);
    ck_assert_int_eq(m->layers[2].n_swa, 16);
    ck_assert_int_eq(m->layers[3].n_swa, 0);
    kg_model_free(m);
    /* an array of the wrong length */
    load_fails(rewrite(src, NULL, pattern_short, NULL, 0),
               (const char *[]){"sliding_window_pattern", NULL});
    /* no window in the file: no local layers at all */
    m = load_ok(rewrite(src, gemma3_window, NULL, NULL, 0));
    for (int il = 0; il < 4; il++) {
        ck_assert_int_eq(m->layers[il].n_swa, 0);
        ck_assert(m->layers[il].rope_base == 10000.0f);
    }
    kg_model_free(m);
    remove(src);
    free(src);
}
END_TEST

static const char *const gemma_embd_dense_keys[] = {"gemma-embedding.dense_2_feat_out",
                                                    "gemma-embedding.dense_3_feat_in", NULL};
static const char *const gemma_embd_window[] = {"gemma-embedding.attention.sliding_window", NULL};

/* gemma-embedding: gemma3's switches, non-causal (embedding jobs only, no
 * KV window), a required window in five layers of six (RoPE base 10000
 * there, the file's in the global ones), queries scaled by
 * 1/sqrt(head_dim), mean pooling, the dense projections n_embd -> 4 n_embd
 * -> n_embd; without the keys that size them, or without the window, the
 * file is refused by name */
START_TEST(gemma_embedding_loads) {
    char *src = mk("--arch gemma-embedding --n-layer 7 --head-dim 32 --sliding-window 16 "
                   "--rope-base 1000000 " SMALL);
    kg_model_t *m = load_ok(rewrite(src, NULL, NULL, NULL, 0));
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_GEMMA_EMBED);
    ck_assert(hp->non_causal && kg_model_non_causal(m) && !kg_model_embed_only(m));
    ck_assert(hp->ffn_act == KG_FFN_GELU && hp->embd_scale == sqrtf(32.0f));
    ck_assert(hp->q_scale == 1.0f / sqrtf(32.0f) && hp->final_softcap == 0.0f);
    ck_assert_int_eq(hp->pooling_type, 1);
    ck_assert(hp->tied && m->layers[0].q_norm && m->layers[0].ffn_post_norm);
    for (int il = 0; il < 7; il++) {
        ck_assert_int_eq(m->layers[il].n_swa, il == 5 ? 0 : 16);
        ck_assert(m->layers[il].rope_base == (il == 5 ? 1000000.0f : 10000.0f));
    }
    ck_assert_int_eq(kg_model_kv_window(m), 0);
    ck_assert_int_eq(m->n_dense, 4 * 32);
    ck_assert(m->dense_2->ne[0] == 32 && m->dense_2->ne[1] == 128);
    ck_assert(m->dense_3->ne[0] == 128 && m->dense_3->ne[1] == 32);
    /* non-causal decoder layers, which the CUDA backend has no path for (its
     * encoder bit is bert's) */
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_BIDIR);
    ck_assert(!(kg_model_features(m) & KG_MODEL_FEAT_ENCODER));
    kg_model_free(m);
    load_fails(rewrite(src, gemma_embd_dense_keys, NULL, NULL, 0),
               (const char *[]){"dense projections must come together", NULL});
    load_fails(rewrite(src, gemma_embd_window, NULL, NULL, 0),
               (const char *[]){"gemma-embedding.attention.sliding_window", NULL});
    remove(src);
    free(src);
}
END_TEST

/* Gemma 4: each layer's shape from its kind (windowed: key_length_swa;
 * global: key_length, rope_freqs, its own K/V head count), the shared-KV
 * layers reading the last earlier layer of their kind, per-layer FFN
 * widths, the KV bytes per token of the layers that keep K/V; a file
 * without a required key or with K/V layers missing is refused by name,
 * and the CPU backend runs it without LoRA (one shape per layer there). */
START_TEST(gemma4_layers) {
    char *src = mk("--arch gemma4 --n-layer 4 --head-dim 16 --swa-pattern 2 --sliding-window 8 "
                   "--n-embd-per-layer 16 --n-kv-shared 2 " SMALL);
    kg_model_t *m = load_ok(rewrite(src, NULL, NULL, NULL, 0));
    const kg_layer_weights_t *L = m->layers;
    ck_assert_int_eq(L[0].head_dim, 16);
    ck_assert_int_eq(L[0].n_swa, 8);
    ck_assert_ptr_null(L[0].rope_freqs);
    ck_assert_int_eq(L[1].head_dim, 32);
    ck_assert_int_eq(L[1].n_swa, 0);
    ck_assert_ptr_nonnull(L[1].rope_freqs);
    ck_assert_int_eq(L[2].kv_layer, 0);
    ck_assert_int_eq(L[3].kv_layer, 1);
    ck_assert_int_eq(L[1].n_ff, 64);
    ck_assert_int_eq(L[2].n_ff, 128);
    ck_assert(m->pl_tok_embd != NULL && L[3].pe_gate != NULL);
    /* K and V in fp16 of layers 0 (1 x 16) and 1 (1 x 32) only */
    ck_assert_uint_eq(kg_backend_kv_bytes_per_token(m, KG_KV_F16), 2 * 2 * (16 + 32));
    const uint32_t f = kg_model_features(m);
    ck_assert(f & KG_MODEL_FEAT_HEAD_PER_LAYER);
    ck_assert(f & KG_MODEL_FEAT_KV_SHARED);
    ck_assert(f & KG_MODEL_FEAT_PER_LAYER_EMBD);
    ck_assert(f & KG_MODEL_FEAT_V_NORM);
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 8, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cpu", m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    ck_assert(!kg_backend_has_lora(be));
    kg_backend_free(be);
    be = kg_backend_new("cuda", m, &p, err, sizeof(err));
#ifdef KG_USE_CUDA
    /* the CUDA backend runs it (check_cuda's gemma4 rows): where it cannot
     * start, that is for want of a device, not a refusal of the model */
    ck_assert_msg(be != NULL || strstr(err, "does not implement") == NULL, "%s", err);
#else
    ck_assert_ptr_null(be); /* no CUDA build here */
#endif
    kg_backend_free(be);
    kg_model_free(m);
    load_fails(
        rewrite(src, (const char *[]){"gemma4.attention.key_length_swa", NULL}, NULL, NULL, 0),
        (const char *[]){"gemma4.attention.key_length_swa", NULL});
    /* without shared_kv_layers every layer must have its K projection */
    load_fails(
        rewrite(src, (const char *[]){"gemma4.attention.shared_kv_layers", NULL}, NULL, NULL, 0),
        (const char *[]){"blk.2.attn_k.weight", NULL});
    remove(src);
    free(src);
}
END_TEST

// ---- Qwen3.5's hybrid layers ----

static void qwen35_bad_inner(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "qwen35.ssm.inner_size", 48); /* not state_size x V heads */
}

static void qwen35_short_flags(kg_gguf_writer_t *w) {
    const uint8_t v[2] = {1, 1};
    kg_gguf_writer_set_arr(w, "qwen35.attention.recurrent_layers", KG_GGUF_TYPE_BOOL, v, 2);
}

/* Layers 2 and 5 of 6 are attention (mkmodel's interval 3) */
static void qwen35_kinds(const kg_model_t *m) {
    for (int il = 0; il < 6; il++) {
        ck_assert_int_eq(m->layers[il].kind,
                         il == 2 || il == 5 ? KG_LAYER_ATTN : KG_LAYER_DELTANET);
    }
    ck_assert_int_eq(m->hp.n_layer_recurrent, 4);
}

/* qwen35's layer kinds (the per-layer flags, else full_attention_interval),
 * its gated attention, the DeltaNet sizes and state, and the refusals;
 * qwen3next's ssm_ba and grouped V heads */
START_TEST(qwen35_layers) {
    char *src = mk("--arch qwen35 --n-layer 6 " SMALL); /* heads of 16: d_state 16, 1 K head,
                                                           2 V heads */
    kg_model_t *m = load_ok(rewrite(src, NULL, NULL, NULL, 0));
    qwen35_kinds(m);
    ck_assert(m->hp.attn_out_gate && !m->hp.ssm_v_grouped);
    ck_assert_int_eq(m->hp.n_rot, 4);             /* a quarter of the head */
    ck_assert_int_eq(m->layers[2].wq->ne[1], 64); /* 2 heads of 16: queries and gates */
    ck_assert_ptr_nonnull(m->layers[0].ssm_beta);
    ck_assert_ptr_null(m->layers[0].ssm_ba);
    /* 3 conv inputs of 2 x 16 + 32 channels, then 2 V heads of 16 x 16 */
    ck_assert_int_eq(kg_model_state_floats(m, 0), 192 + 512);
    ck_assert_int_eq(kg_model_state_floats(m, 2), 0);
    kg_model_free(m);
    m = load_ok(
        rewrite(src, (const char *[]){"qwen35.attention.recurrent_layers", NULL}, NULL, NULL, 0));
    qwen35_kinds(m); /* full_attention_interval 3 says the same */
    kg_model_free(m);
    /* neither key: llama.cpp's interval 4 makes layer 2 a DeltaNet layer,
     * whose tensors this file lacks */
    load_fails(rewrite(src,
                       (const char *[]){"qwen35.attention.recurrent_layers",
                                        "qwen35.full_attention_interval", NULL},
                       NULL, NULL, 0),
               (const char *[]){"blk.2.attn_qkv.weight", NULL});
    load_fails(rewrite(src, NULL, qwen35_bad_inner, NULL, 0),
               (const char *[]){"ssm.* sizes", "inner_size 48", NULL});
    load_fails(rewrite(src, NULL, qwen35_short_flags, NULL, 0),
               (const char *[]){"qwen35.attention.recurrent_layers", "block_count", NULL});
    load_fails(
        rewrite(src, (const char *[]){"qwen35.rope.dimension_sections", NULL}, NULL, NULL, 0),
        (const char *[]){"qwen35.rope.dimension_sections", NULL});
    load_fails(rewrite(src, (const char *[]){"qwen35.ssm.state_size", NULL}, NULL, NULL, 0),
               (const char *[]){"qwen35.ssm.state_size", NULL});
    remove(src);
    free(src);
    char *nx = mk("--arch qwen3next --n-layer 3 " SMALL);
    m = load_ok(rewrite(nx, NULL, NULL, NULL, 0));
    ck_assert(m->hp.attn_out_gate && m->hp.ssm_v_grouped && m->hp.n_expert == 8);
    ck_assert_ptr_nonnull(m->layers[0].ssm_ba);
    ck_assert_ptr_null(m->layers[0].ssm_beta);
    ck_assert_ptr_nonnull(m->layers[0].gate_inp_shexp);
    ck_assert_int_eq(m->hp.n_ff_shexp, 64);
    kg_model_free(m);
    /* the older converters' fused q/k/v/z projection */
    load_fails(rewrite(nx, NULL, NULL, "blk.0.ssm_in.weight", 32),
               (const char *[]){"blk.0.ssm_in.weight", "convert it again", NULL});
    remove(nx);
    free(nx);
}
END_TEST

// ---- backends ----

/* The dense families (each row of k_model_families) pass the CUDA
 * backend's feature gate: `cuda` gets as far as the device (an error naming
 * the device here, where there is none; a backend on a GPU) and `auto` runs.
 * The experts are check_moe's cuda_takes_experts. */
START_TEST(cuda_takes_the_dense_families) {
    kg_model_t *m = load_family(&k_model_families[_i]);
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 8, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cuda", m, &p, err, sizeof(err));
#ifdef KG_USE_CUDA
    ck_assert_msg(be != NULL || strstr(err, "does not implement") == NULL, "%s", err);
#else
    ck_assert_ptr_null(be);
    ck_assert_msg(strstr(err, "no CUDA backend") != NULL, "%s", err);
#endif
    kg_backend_free(be);
    be = kg_backend_new("auto", m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("families");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, each_family_loads, 0,
                        (int)(sizeof(k_model_families) / sizeof(k_model_families[0])));
    tcase_add_test(tc, refusals_name_what_is_supported);
    tcase_add_test(tc, gemma3_window_patterns);
    tcase_add_test(tc, gemma4_layers);
    tcase_add_test(tc, gemma_embedding_loads);
    tcase_add_test(tc, qwen35_layers);
    tcase_add_loop_test(tc, cuda_takes_the_dense_families, 0,
                        (int)(sizeof(k_model_families) / sizeof(k_model_families[0])));
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
