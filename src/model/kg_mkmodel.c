/* kg_mkmodel: a random-weight Llama model of any shape, as a GGUF file.
 *
 * The file is what llama.cpp's converter would write for a Llama model:
 * the llama.* hyperparameter keys, a tokenizer, and tensors with
 * llama.cpp's names and ggml shapes (ne[0] is the input dimension). Norm
 * weights stay F32, as llama.cpp keeps 1-D tensors; every 2-D weight takes
 * the chosen type.
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
#include "kg_quant.h"
#include "kg_quant_mix.h"

#include <errno.h>
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

/** Uniform with variance 1/fan_in: the half-width is sqrt(3 / fan_in). */
static float fan_in_scale(int64_t fan_in) {
    return sqrtf(3.0f / (float)fan_in);
}

static bool add_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, int64_t n_vocab) {
    const kg_ggml_type_t wt = o->type;
    const int64_t hd = o->head_dim;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    char name[64];

    if (!add_random(w, o, "token_embd.weight", wt, o->n_embd, n_vocab, 0.0f, 1.0f) ||
        !add_random(w, o, "output_norm.weight", KG_GGML_TYPE_F32, o->n_embd, 1, 1.0f, 0.1f)) {
        return false;
    }
    if (!o->tied &&
        !add_random(w, o, "output.weight", wt, o->n_embd, n_vocab, 0.0f, fan_in_scale(o->n_embd))) {
        return false;
    }
    for (int64_t l = 0; l < o->n_layer; l++) {
        static const struct {
            const char *fmt;
            int in, out; /* 0 n_embd, 1 q_dim, 2 kv_dim, 3 n_ff, -1 (1-D) */
            bool resid;
        } layer[] = {
            {"blk.%lld.attn_norm.weight", 0, -1, false}, {"blk.%lld.attn_q.weight", 0, 1, false},
            {"blk.%lld.attn_k.weight", 0, 2, false},     {"blk.%lld.attn_v.weight", 0, 2, false},
            {"blk.%lld.attn_output.weight", 1, 0, true}, {"blk.%lld.ffn_norm.weight", 0, -1, false},
            {"blk.%lld.ffn_gate.weight", 0, 3, false},   {"blk.%lld.ffn_down.weight", 3, 0, true},
            {"blk.%lld.ffn_up.weight", 0, 3, false},
        };
        const int64_t dims[4] = {o->n_embd, q_dim, kv_dim, o->n_ff};
        for (size_t i = 0; i < sizeof(layer) / sizeof(layer[0]); i++) {
            snprintf(name, sizeof(name), layer[i].fmt, (long long)l);
            bool ok;
            if (layer[i].out < 0) {
                ok = add_random(w, o, name, KG_GGML_TYPE_F32, dims[layer[i].in], 1, 1.0f, 0.1f);
            } else {
                int64_t fan_in = dims[layer[i].in];
                float scale = fan_in_scale(fan_in) * (layer[i].resid ? resid : 1.0f);
                ok = add_random(w, o, name, wt, fan_in, dims[layer[i].out], 0.0f, scale);
            }
            if (!ok) {
                return false;
            }
        }
    }
    return true;
}

// ---- tokenizer ----

/** The built-in vocabulary: SentencePiece "llama" with <unk> <s> </s> and
 * the 256 byte-fallback tokens, what llama.cpp needs to encode any text. */
static int64_t add_builtin_vocab(kg_gguf_writer_t *w, int32_t n_words) {
    /* <unk> <s> </s>, the 256 byte tokens, then n_words made-up words
     * ("\xe2\x96\x81" + 2-4 syllables) so a random model prints readable nonsense
     * instead of random bytes (the worker demo uses them) */
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ta", "ru", "so", "vi", "de", "po",
                                "ha", "li", "mo", "ze", "fa", "gu", "be", "ri", "no", "sa"};
    const int64_t N = 3 + 256 + n_words;
    kg_gguf_str_t *tokens = calloc((size_t)N, sizeof(*tokens));
    float *scores = calloc((size_t)N, sizeof(float));
    int32_t *types = calloc((size_t)N, sizeof(int32_t));
    char *text = calloc((size_t)N, 16);
    if (!tokens || !scores || !types || !text) {
        free(tokens), free(scores), free(types), free(text);
        snprintf(g_err, sizeof(g_err), "out of memory");
        return -1;
    }
    tokens[0] = (kg_gguf_str_t){"<unk>", 5};
    tokens[1] = (kg_gguf_str_t){"<s>", 3};
    tokens[2] = (kg_gguf_str_t){"</s>", 4};
    types[0] = 2; // unknown
    types[1] = 3; // control
    types[2] = 3;
    for (int b = 0; b < 256; b++) {
        char *t = text + (size_t)(3 + b) * 16;
        snprintf(t, 16, "<0x%02X>", b);
        tokens[3 + b] = (kg_gguf_str_t){t, 6};
        types[3 + b] = 6; // byte
    }
    for (int32_t k = 0; k < n_words; k++) {
        /* word k spells k + 20 in base 20 with syllables: distinct for every k */
        char *t = text + (size_t)(259 + k) * 16;
        int n = snprintf(t, 16, "\xe2\x96\x81"); /* SentencePiece's word-start mark */
        char digits[8];
        int nd = 0;
        for (uint32_t x = (uint32_t)k + 20; x > 0 && nd < 5; x /= 20) {
            digits[nd++] = (char)(x % 20);
        }
        while (nd > 0 && n + 2 < 16) {
            n += snprintf(t + n, (size_t)(16 - n), "%s", syl[(int)digits[--nd]]);
        }
        tokens[259 + k] = (kg_gguf_str_t){t, (uint64_t)n};
        types[259 + k] = 1; // normal
        scores[259 + k] = -(float)k;
    }
    const int64_t n_unique = N;
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n_unique);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n_unique);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n_unique);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    free(tokens), free(scores), free(types), free(text);
    return n_unique;
}

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

kg_mkmodel_opts_t kg_mkmodel_opts_default(void) {
    kg_mkmodel_opts_t o = {
        .name = "kgen-random", .ctx = 2048, .rope_base = 10000.0f, .type = KG_GGML_TYPE_F32};
    return o;
}

kg_status_t kg_mkmodel_write(const kg_mkmodel_opts_t *o,
                             int64_t *n_vocab_out,
                             char *errstr,
                             size_t errstr_size) {
    kg_status_t rc = KG_ERR_IO;
    g_err[0] = '\0';
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    if (!w) {
        snprintf(errstr, errstr_size, "out of memory");
        return KG_ERR_NOMEM;
    }
    const char *arch = "llama";
    g_mix.on = o->ftype != KG_FTYPE_ALL_F32;
    g_mix.ftype = o->ftype;
    g_mix.pure = o->pure;
    g_mix.model = (kg_quant_mix_model_t){.arch = arch,
                                         .n_layer = (int32_t)o->n_layer,
                                         .n_head = (int32_t)o->n_head,
                                         .n_head_kv = (int32_t)o->n_head_kv,
                                         .has_output = !o->tied};
    kg_gguf_writer_set_str(w, "general.architecture", arch);
    kg_gguf_writer_set_str(w, "general.name", o->name);
    kg_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)o->ctx);
    kg_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)o->n_embd);
    kg_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)o->n_layer);
    kg_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)o->n_ff);
    kg_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)o->head_dim);
    kg_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)o->n_head);
    kg_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)o->n_head_kv);
    if (o->head_dim * o->n_head != o->n_embd) {
        kg_gguf_writer_set_u32(w, "llama.attention.key_length", (uint32_t)o->head_dim);
        kg_gguf_writer_set_u32(w, "llama.attention.value_length", (uint32_t)o->head_dim);
    }
    kg_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kg_gguf_writer_set_f32(w, "llama.rope.freq_base", o->rope_base);
    kg_gguf_writer_set_u32(w, "general.file_type",
                           g_mix.on ? (uint32_t)o->ftype : file_type(o->type));
    if (kg_type_is_quantized(g_mix.on ? kg_ftype_base_type(o->ftype) : o->type)) {
        kg_gguf_writer_set_u32(w, "general.quantization_version", 2); /* ggml's QNT_VERSION */
    }

    int64_t n_vocab =
        o->vocab_from ? copy_vocab(w, o->vocab_from) : add_builtin_vocab(w, o->n_words);
    if (n_vocab < 0) {
        goto out;
    }
    kg_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)n_vocab);
    if (!add_weights(w, o, n_vocab)) {
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
