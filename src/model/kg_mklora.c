/* kg_mklora: random LoRA adapters (see kg_mklora.h). */
#include "kg_mklora.h"

#include "../core/kg_parse.h"
#include "kg_gguf_writer.h"
#include "kg_lora.h"
#include "kg_model.h"
#include "kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: kgen mkmodel --lora --base BASE.gguf --out FILE --rank R --seed S [options]\n"
    "\n"
    "Write a random LoRA adapter for BASE in llama.cpp's GGUF adapter form (general.type\n"
    "adapter, adapter.type lora, <tensor>.lora_a / .lora_b).\n"
    "\n"
    "  --base FILE      the base model the adapter is for (its architecture and shapes)\n"
    "  --out FILE       the adapter to write\n"
    "  --rank R         rank of every pair\n"
    "  --alpha A        adapter.lora.alpha (default R: scale alpha/R = 1)\n"
    "  --seed S         weight seed (0 .. 2^64-1)\n"
    "  --type T         f32 (default), f16, bf16 or q8_0 (a q8_0 tensor whose rows are\n"
    "                   not a multiple of 32 wide, lora_b below rank 32, is written f16,\n"
    "                   as llama.cpp's convert_lora_to_gguf.py does)\n"
    "  --targets LIST   comma list of q,k,v,o,gate,up,down (default all seven)\n";

const char *kg_mklora_usage(void) {
    return usage_text;
}

static const char *const target_names[KG_LORA_N_PROJ] = {"q", "k", "v", "o", "gate", "up", "down"};

static bool parse_targets(const char *s, uint32_t *out) {
    uint32_t m = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        int found = -1;
        for (int i = 0; i < KG_LORA_N_PROJ; i++) {
            if (strlen(target_names[i]) == len && strncmp(s, target_names[i], len) == 0) {
                found = i;
            }
        }
        if (found < 0) {
            return false;
        }
        m |= 1u << found;
        s += len + (s[len] == ',');
    }
    *out = m;
    return m != 0;
}

int kg_mklora_parse_args(
    int argc, char **argv, kg_mklora_opts_t *o, char *errstr, size_t errstr_size) {
    memset(o, 0, sizeof(*o));
    o->type = KG_GGML_TYPE_F32;
    o->targets = (1u << KG_LORA_N_PROJ) - 1;
    o->alpha = NAN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return 1;
        }
        if (strcmp(a, "--lora") == 0) {
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            snprintf(errstr, errstr_size, "%.64s needs a value (see --help)", a);
            return 2;
        }
        i++;
        int64_t n;
        bool ok = true;
        if (strcmp(a, "--base") == 0) {
            o->base = v;
        } else if (strcmp(a, "--out") == 0) {
            o->out = v;
        } else if (strcmp(a, "--rank") == 0) {
            ok = kg_parse_i64(v, 1, 4096, &o->rank);
        } else if (strcmp(a, "--alpha") == 0) {
            ok = kg_parse_f32(v, 0.0f, 1e6f, &o->alpha);
        } else if (strcmp(a, "--seed") == 0) {
            ok = kg_parse_i64(v, 0, INT64_MAX, &n);
            o->seed = (uint64_t)n;
            o->have_seed = ok;
        } else if (strcmp(a, "--type") == 0) {
            ok = kg_type_from_name(v, &o->type) &&
                 (o->type == KG_GGML_TYPE_F32 || o->type == KG_GGML_TYPE_F16 ||
                  o->type == KG_GGML_TYPE_BF16 || o->type == KG_GGML_TYPE_Q8_0);
        } else if (strcmp(a, "--targets") == 0) {
            ok = parse_targets(v, &o->targets);
        } else {
            snprintf(errstr, errstr_size, "unknown flag %.64s with --lora (see --help)", a);
            return 2;
        }
        if (!ok) {
            snprintf(errstr, errstr_size, "bad value for %s: %.64s (see --help)", a, v);
            return 2;
        }
    }
    const char *missing = !o->base        ? "--base"
                          : !o->out       ? "--out"
                          : o->rank == 0  ? "--rank"
                          : !o->have_seed ? "--seed"
                                          : NULL;
    if (missing) {
        snprintf(errstr, errstr_size, "%s is required with --lora (see --help)", missing);
        return 2;
    }
    if (isnan(o->alpha)) {
        o->alpha = (float)o->rank;
    }
    return 0;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One tensor uniform in [-c, c), its stream seeded from (seed, name). */
static kg_status_t add_random(kg_gguf_writer_t *w,
                              const kg_mklora_opts_t *o,
                              const char *name,
                              int64_t ne0,
                              int64_t ne1,
                              float c) {
    float *v = malloc((size_t)(ne0 * ne1) * sizeof(float));
    if (!v) {
        return KG_ERR_NOMEM;
    }
    uint64_t x = o->seed;
    for (const char *p = name; *p; p++) {
        x = (x ^ (unsigned char)*p) * 1099511628211ull;
    }
    for (int64_t i = 0; i < ne0 * ne1; i++) {
        v[i] = c * ((float)(splitmix64(&x) >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
    const int64_t ne[2] = {ne0, ne1};
    /* q8_0 blocks run along a row: a row of another width (lora_b of a rank
     * under 32) falls back to f16, as llama.cpp's converter does */
    const kg_ggml_type_t type =
        o->type == KG_GGML_TYPE_Q8_0 && ne0 % 32 != 0 ? KG_GGML_TYPE_F16 : o->type;
    kg_status_t st = kg_gguf_writer_add_tensor(w, name, type, 2, ne, v);
    free(v);
    return st;
}

kg_status_t
kg_mklora_write(const kg_mklora_opts_t *o, int32_t *n_pairs_out, char *errstr, size_t errstr_size) {
    kg_model_t *base = kg_model_load(o->base, errstr, errstr_size);
    if (!base) {
        return KG_ERR_INVALID;
    }
    kg_gguf_str_t arch;
    if (!kg_gguf_get_str(base->gguf, "general.architecture", &arch) || arch.len > 63) {
        snprintf(errstr, errstr_size, "%s has no general.architecture", o->base);
        kg_model_free(base);
        return KG_ERR_INVALID;
    }
    char arch_s[64];
    memcpy(arch_s, arch.data, arch.len);
    arch_s[arch.len] = '\0';
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    if (!w) {
        kg_model_free(base);
        return KG_ERR_NOMEM;
    }
    kg_gguf_writer_set_str(w, "general.architecture", arch_s);
    kg_gguf_writer_set_str(w, "general.type", "adapter");
    kg_gguf_writer_set_str(w, "general.name", "kgen random lora");
    kg_gguf_writer_set_str(w, "adapter.type", "lora");
    kg_gguf_writer_set_f32(w, "adapter.lora.alpha", o->alpha);
    kg_status_t st = KG_OK;
    int32_t n_pairs = 0;
    /* the projections into the residual stream are scaled down as the
     * base's are (kg_mkmodel: 1/sqrt(2 n_layer)) so that deep models stay
     * sane */
    const float resid = 1.0f / sqrtf(2.0f * (float)base->hp.n_layer);
    for (int32_t il = 0; il < base->hp.n_layer && st == KG_OK; il++) {
        const kg_layer_weights_t *L = &base->layers[il];
        const kg_gguf_tensor_t *ws[KG_LORA_N_PROJ] = {L->wq,     L->wk,   L->wv,    L->wo,
                                                      L->w_gate, L->w_up, L->w_down};
        for (int p = 0; p < KG_LORA_N_PROJ && st == KG_OK; p++) {
            if (!(o->targets & (1u << p)) || !ws[p]) {
                continue;
            }
            char name[96];
            const int64_t n_in = ws[p]->ne[0], n_out = ws[p]->ne[1];
            const float cb = sqrtf(3.0f / (4.0f * (float)o->rank)) *
                             (p == KG_LORA_O || p == KG_LORA_DOWN ? resid : 1.0f);
            snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_a", il,
                     kg_lora_proj_name((kg_lora_proj_t)p));
            st = add_random(w, o, name, n_in, o->rank, sqrtf(3.0f / (float)n_in));
            if (st == KG_OK) {
                snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_b", il,
                         kg_lora_proj_name((kg_lora_proj_t)p));
                st = add_random(w, o, name, o->rank, n_out, cb);
            }
            n_pairs++;
        }
    }
    if (st != KG_OK) {
        snprintf(errstr, errstr_size, "adding tensors: %s", kg_status_str(st));
    } else if (n_pairs == 0) {
        snprintf(errstr, errstr_size, "the base has none of the --targets projections");
        st = KG_ERR_INVALID;
    } else {
        st = kg_gguf_writer_write(w, o->out, errstr, errstr_size);
    }
    kg_gguf_writer_free(w);
    kg_model_free(base);
    if (n_pairs_out) {
        *n_pairs_out = n_pairs;
    }
    return st;
}
