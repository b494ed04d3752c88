/* cmd_mkmodel: `kgen mkmodel`, a random-weight Llama model of any shape.
 *
 * The file is what llama.cpp's converter would write for a Llama model:
 * the llama.* hyperparameter keys, a tokenizer, and tensors with
 * llama.cpp's names and ggml shapes (ne[0] is the input dimension). Norm
 * weights stay F32, as llama.cpp keeps 1-D tensors; every 2-D weight takes
 * the chosen type.
 *
 * Weights are deterministic: each tensor draws from its own xoshiro256**
 * stream seeded from (--seed, tensor name), so the same arguments give the
 * same bytes, and changing one tensor's shape leaves the others alone. The
 * scales keep activations sane through many layers: every projection is
 * uniform with variance 1/fan_in (unit-variance outputs for unit-RMS
 * inputs), the two projections that add into the residual stream are
 * further scaled by 1/sqrt(2 n_layer) (GPT-2's init), and norm weights are
 * 1 +- 0.1. The result is a model whose greedy output varies with the
 * prompt, not a constant. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_quant.h"

typedef struct mk_opts {
    const char *out;
    const char *name;
    const char *vocab_from;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, ctx;
    float rope_base;
    bool tied;
    bool have_seed;
    uint64_t seed;
    kg_ggml_type_t type;
} mk_opts_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen mkmodel --out FILE --n-embd N --n-layer L --n-head H --n-head-kv K\n"
            "                    --n-ff F --seed S [options]\n"
            "\n"
            "Write a random-weight Llama model (GGUF v3) that llama.cpp and kgen load.\n"
            "The same arguments always give the same bytes.\n"
            "\n"
            "  --out FILE          the GGUF file to write\n"
            "  --n-embd N          embedding width\n"
            "  --n-layer L         number of blocks\n"
            "  --n-head H          query heads\n"
            "  --n-head-kv K       key/value heads (H must be a multiple of K)\n"
            "  --n-ff F            feed-forward width (SwiGLU)\n"
            "  --seed S            weight seed (0 .. 2^64-1)\n"
            "  --head-dim D        head width (default N / H; even, for RoPE)\n"
            "  --rope-base B       RoPE frequency base (default 10000)\n"
            "  --ctx C             llama.context_length (default 2048)\n"
            "  --tied              no output.weight: the head reuses token_embd\n"
            "  --f16 | --bf16 | --q8_0 | --q4_0\n"
            "                      type of the 2-D weights (default f32; norms stay f32)\n"
            "  --vocab-from FILE   copy every tokenizer.* key of FILE (n_vocab: its token count);\n"
            "                      default: a 259-token SentencePiece byte vocabulary\n"
            "  --name NAME         general.name (default \"kgen-random\")\n"
            "  --help, --version\n");
}

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
static bool add_random(kg_gguf_writer_t *w, const mk_opts_t *o, const char *name,
                       kg_ggml_type_t type, int64_t ne0, int64_t ne1, float center, float scale) {
    int64_t n = ne0 * ne1;
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) {
        fprintf(stderr, "kgen mkmodel: out of memory for %s (%lld x %lld)\n", name,
                (long long)ne0, (long long)ne1);
        return false;
    }
    rng_t r;
    rng_seed(&r, o->seed, name);
    for (int64_t i = 0; i < n; i++) {
        v[i] = center + scale * rng_uniform(&r);
    }
    int64_t ne[2] = {ne0, ne1};
    kg_status_t st = kg_gguf_writer_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, v);
    free(v);
    if (st != KG_OK) {
        fprintf(stderr, "kgen mkmodel: cannot add %s: %s\n", name, kg_status_str(st));
        return false;
    }
    return true;
}

/** Uniform with variance 1/fan_in: the half-width is sqrt(3 / fan_in). */
static float fan_in_scale(int64_t fan_in) {
    return sqrtf(3.0f / (float)fan_in);
}

static bool add_weights(kg_gguf_writer_t *w, const mk_opts_t *o, int64_t n_vocab) {
    const kg_ggml_type_t wt = o->type;
    const int64_t hd = o->head_dim;
    const int64_t q_dim = o->n_head * hd, kv_dim = o->n_head_kv * hd;
    const float resid = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    char name[64];

    if (!add_random(w, o, "token_embd.weight", wt, o->n_embd, n_vocab, 0.0f, 1.0f) ||
        !add_random(w, o, "output_norm.weight", KG_GGML_TYPE_F32, o->n_embd, 1, 1.0f, 0.1f)) {
        return false;
    }
    if (!o->tied && !add_random(w, o, "output.weight", wt, o->n_embd, n_vocab, 0.0f,
                                fan_in_scale(o->n_embd))) {
        return false;
    }
    for (int64_t l = 0; l < o->n_layer; l++) {
        static const struct {
            const char *fmt;
            int in, out; /* 0 n_embd, 1 q_dim, 2 kv_dim, 3 n_ff, -1 (1-D) */
            bool resid;
        } layer[] = {
            {"blk.%lld.attn_norm.weight", 0, -1, false},
            {"blk.%lld.attn_q.weight", 0, 1, false},
            {"blk.%lld.attn_k.weight", 0, 2, false},
            {"blk.%lld.attn_v.weight", 0, 2, false},
            {"blk.%lld.attn_output.weight", 1, 0, true},
            {"blk.%lld.ffn_norm.weight", 0, -1, false},
            {"blk.%lld.ffn_gate.weight", 0, 3, false},
            {"blk.%lld.ffn_down.weight", 3, 0, true},
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
static int64_t add_builtin_vocab(kg_gguf_writer_t *w) {
    enum { N = 3 + 256 };
    static char bytes[256][7];
    kg_gguf_str_t tokens[N];
    float scores[N];
    int32_t types[N];
    tokens[0] = (kg_gguf_str_t){"<unk>", 5};
    tokens[1] = (kg_gguf_str_t){"<s>", 3};
    tokens[2] = (kg_gguf_str_t){"</s>", 4};
    types[0] = 2; // unknown
    types[1] = 3; // control
    types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        tokens[3 + b] = (kg_gguf_str_t){bytes[b], 6};
        types[3 + b] = 6; // byte
    }
    for (int i = 0; i < N; i++) {
        scores[i] = 0.0f;
    }
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, N);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, N);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kg_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    return N;
}

/** Copy every tokenizer.* key of `path`; the vocabulary size, or -1. */
static int64_t copy_vocab(kg_gguf_writer_t *w, const char *path) {
    char err[512];
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    if (!g) {
        fprintf(stderr, "kgen mkmodel: --vocab-from: %s\n", err);
        return -1;
    }
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (!kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) || et != KG_GGUF_TYPE_STRING ||
        n == 0 || n > INT32_MAX) {
        fprintf(stderr, "kgen mkmodel: --vocab-from %s: no tokenizer.ggml.tokens string array\n",
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

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') {
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *out = v;
    return true;
}

/** Parse argv into o; 0 to go on, else the exit status (help, version, usage error). */
static int parse_args(int argc, char **argv, mk_opts_t *o) {
    static const struct {
        const char *flag;
        size_t off;
        int64_t min, max;
    } ints[] = {
        {"--n-embd", offsetof(mk_opts_t, n_embd), 1, 1 << 16},
        {"--n-layer", offsetof(mk_opts_t, n_layer), 1, 1024},
        {"--n-head", offsetof(mk_opts_t, n_head), 1, 1024},
        {"--n-head-kv", offsetof(mk_opts_t, n_head_kv), 1, 1024},
        {"--n-ff", offsetof(mk_opts_t, n_ff), 1, 1 << 20},
        {"--head-dim", offsetof(mk_opts_t, head_dim), 2, 1 << 12},
        {"--ctx", offsetof(mk_opts_t, ctx), 1, 1 << 24},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--version") == 0) {
            kg_cmd_print_version("kgen");
            return -1;
        }
        if (strcmp(a, "--tied") == 0) {
            o->tied = true;
            continue;
        }
        static const struct {
            const char *flag;
            kg_ggml_type_t type;
        } types[] = {{"--f32", KG_GGML_TYPE_F32},
                     {"--f16", KG_GGML_TYPE_F16},
                     {"--bf16", KG_GGML_TYPE_BF16},
                     {"--q8_0", KG_GGML_TYPE_Q8_0},
                     {"--q4_0", KG_GGML_TYPE_Q4_0}};
        bool is_type = false;
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            if (strcmp(a, types[t].flag) == 0) {
                o->type = types[t].type;
                is_type = true;
            }
        }
        if (is_type) {
            continue;
        }
        // every other option takes a value: "--flag VALUE" or "--flag=VALUE"
        char flag[64];
        const char *val;
        const char *eq = strchr(a, '=');
        if (eq && (size_t)(eq - a) < sizeof(flag)) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = '\0';
            val = eq + 1;
        } else {
            snprintf(flag, sizeof(flag), "%s", a);
            if (strncmp(a, "--", 2) != 0 || i + 1 >= argc) {
                val = NULL;
            } else {
                val = argv[++i];
            }
        }
        bool known = false, ok = val != NULL;
        for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
            if (strcmp(flag, ints[k].flag) == 0) {
                known = true;
                ok = ok && kg_cli_parse_i64(val, ints[k].min, ints[k].max,
                                            (int64_t *)((char *)o + ints[k].off));
                if (val && !ok) {
                    fprintf(stderr, "kgen mkmodel: %s: '%s' is not an integer in %lld..%lld\n",
                            flag, val, (long long)ints[k].min, (long long)ints[k].max);
                    return 2;
                }
            }
        }
        if (strcmp(flag, "--out") == 0) {
            known = true;
            o->out = val;
            ok = ok && *val;
        } else if (strcmp(flag, "--name") == 0) {
            known = true;
            o->name = val;
        } else if (strcmp(flag, "--vocab-from") == 0) {
            known = true;
            o->vocab_from = val;
            ok = ok && *val;
        } else if (strcmp(flag, "--seed") == 0) {
            known = true;
            o->have_seed = ok && parse_u64(val, &o->seed);
            if (val && !o->have_seed) {
                fprintf(stderr, "kgen mkmodel: --seed: '%s' is not an integer in 0..2^64-1\n",
                        val);
                return 2;
            }
        } else if (strcmp(flag, "--rope-base") == 0) {
            known = true;
            ok = ok && kg_cli_parse_f32(val, 1.0f, 1e9f, &o->rope_base);
            if (val && !ok) {
                fprintf(stderr, "kgen mkmodel: --rope-base: '%s' is not a number in 1..1e9\n",
                        val);
                return 2;
            }
        }
        if (!known) {
            fprintf(stderr, "kgen mkmodel: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kgen mkmodel: %s needs a value\n", flag);
            return 2;
        }
    }

    static const struct {
        const char *flag;
        size_t off;
    } required[] = {
        {"--n-embd", offsetof(mk_opts_t, n_embd)},
        {"--n-layer", offsetof(mk_opts_t, n_layer)},
        {"--n-head", offsetof(mk_opts_t, n_head)},
        {"--n-head-kv", offsetof(mk_opts_t, n_head_kv)},
        {"--n-ff", offsetof(mk_opts_t, n_ff)},
    };
    if (!o->out) {
        fprintf(stderr, "kgen mkmodel: --out FILE is required (see --help)\n");
        return 2;
    }
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
        if (*(int64_t *)((char *)o + required[k].off) == 0) {
            fprintf(stderr, "kgen mkmodel: %s is required (see --help)\n", required[k].flag);
            return 2;
        }
    }
    if (!o->have_seed) {
        fprintf(stderr, "kgen mkmodel: --seed S is required (see --help)\n");
        return 2;
    }
    if (o->n_head % o->n_head_kv != 0) {
        fprintf(stderr, "kgen mkmodel: --n-head %lld is not a multiple of --n-head-kv %lld\n",
                (long long)o->n_head, (long long)o->n_head_kv);
        return 2;
    }
    if (o->head_dim == 0) {
        if (o->n_embd % o->n_head != 0) {
            fprintf(stderr,
                    "kgen mkmodel: --n-embd %lld is not a multiple of --n-head %lld; "
                    "give --head-dim\n",
                    (long long)o->n_embd, (long long)o->n_head);
            return 2;
        }
        o->head_dim = o->n_embd / o->n_head;
    }
    if (o->head_dim % 2 != 0) {
        fprintf(stderr, "kgen mkmodel: head dim %lld must be even (RoPE rotates pairs)\n",
                (long long)o->head_dim);
        return 2;
    }
    int64_t blck = kg_type_block_elems(o->type);
    if (o->n_embd % blck != 0 || (o->n_head * o->head_dim) % blck != 0 || o->n_ff % blck != 0) {
        fprintf(stderr,
                "kgen mkmodel: --%s needs --n-embd, --n-ff and n_head * head_dim to be "
                "multiples of %lld\n",
                kg_ggml_type_name(o->type), (long long)blck);
        return 2;
    }
    return 0;
}

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

int kg_cmd_mkmodel(int argc, char **argv) {
    mk_opts_t o = {.name = "kgen-random", .ctx = 2048, .rope_base = 10000.0f,
                   .type = KG_GGML_TYPE_F32};
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }

    rc = 1;
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    if (!w) {
        fprintf(stderr, "kgen mkmodel: out of memory\n");
        return 1;
    }
    kg_gguf_writer_set_str(w, "general.architecture", "llama");
    kg_gguf_writer_set_str(w, "general.name", o.name);
    kg_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)o.ctx);
    kg_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)o.n_embd);
    kg_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)o.n_layer);
    kg_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)o.n_ff);
    kg_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)o.head_dim);
    kg_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)o.n_head);
    kg_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)o.n_head_kv);
    if (o.head_dim * o.n_head != o.n_embd) {
        kg_gguf_writer_set_u32(w, "llama.attention.key_length", (uint32_t)o.head_dim);
        kg_gguf_writer_set_u32(w, "llama.attention.value_length", (uint32_t)o.head_dim);
    }
    kg_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kg_gguf_writer_set_f32(w, "llama.rope.freq_base", o.rope_base);
    kg_gguf_writer_set_u32(w, "general.file_type", file_type(o.type));

    int64_t n_vocab = o.vocab_from ? copy_vocab(w, o.vocab_from) : add_builtin_vocab(w);
    if (n_vocab < 0) {
        goto out;
    }
    kg_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)n_vocab);
    if (!add_weights(w, &o, n_vocab)) {
        goto out;
    }
    char err[512];
    if (kg_gguf_writer_write(w, o.out, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        goto out;
    }
    int64_t hd = o.head_dim;
    int64_t per_layer = 2 * o.n_embd + o.n_embd * (o.n_head + 2 * o.n_head_kv) * hd +
                        o.n_head * hd * o.n_embd + 3 * o.n_embd * o.n_ff;
    int64_t params = n_vocab * o.n_embd * (o.tied ? 1 : 2) + o.n_embd + o.n_layer * per_layer;
    FILE *f = fopen(o.out, "rb");
    long bytes = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        bytes = ftell(f);
    }
    if (f) {
        fclose(f);
    }
    printf("kgen mkmodel: wrote %s: llama n_embd=%lld n_layer=%lld n_head=%lld n_head_kv=%lld "
           "head_dim=%lld n_ff=%lld n_vocab=%lld ctx=%lld rope_base=%g type=%s tied=%s "
           "seed=%llu params=%lld bytes=%ld\n",
           o.out, (long long)o.n_embd, (long long)o.n_layer, (long long)o.n_head,
           (long long)o.n_head_kv, (long long)hd, (long long)o.n_ff, (long long)n_vocab,
           (long long)o.ctx, (double)o.rope_base, kg_ggml_type_name(o.type),
           o.tied ? "yes" : "no", (unsigned long long)o.seed, (long long)params, bytes);
    rc = 0;
out:
    kg_gguf_writer_free(w);
    return rc;
}
