/* kg_lora: loading and checking LoRA adapters (see kg_lora.h). */
#include "kg_lora.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const proj_names[KG_LORA_N_PROJ] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

const char *kg_lora_proj_name(kg_lora_proj_t p) {
    return p >= 0 && p < KG_LORA_N_PROJ ? proj_names[p] : "?";
}

static const kg_gguf_tensor_t *base_weight(const kg_model_t *base, int32_t il, kg_lora_proj_t p) {
    const kg_layer_weights_t *L = &base->layers[il];
    const kg_gguf_tensor_t *ws[KG_LORA_N_PROJ] = {L->wq,     L->wk,   L->wv,    L->wo,
                                                  L->w_gate, L->w_up, L->w_down};
    return ws[p];
}

/* Whether `s` equals the C string `c`. */
static bool str_is(kg_gguf_str_t s, const char *c) {
    return s.len == strlen(c) && memcmp(s.data, c, s.len) == 0;
}

/* "blk.N.<proj>.weight" -> (N, proj); false for any other base name. */
static bool parse_name(const char *name, int32_t *il, kg_lora_proj_t *p) {
    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9') {
        return false;
    }
    char *end;
    long layer = strtol(name + 4, &end, 10);
    if (*end != '.' || layer < 0 || layer > INT32_MAX) {
        return false;
    }
    const char *rest = end + 1;
    for (int i = 0; i < KG_LORA_N_PROJ; i++) {
        size_t len = strlen(proj_names[i]);
        if (strncmp(rest, proj_names[i], len) == 0 && strcmp(rest + len, ".weight") == 0) {
            *il = (int32_t)layer;
            *p = (kg_lora_proj_t)i;
            return true;
        }
    }
    return false;
}

static bool type_ok(kg_ggml_type_t t) {
    return t == KG_GGML_TYPE_F32 || t == KG_GGML_TYPE_F16 || t == KG_GGML_TYPE_BF16 ||
           t == KG_GGML_TYPE_Q8_0;
}

/* Check general.* and adapter.* against the base. */
static bool check_header(const kg_gguf_t *g,
                         const char *path,
                         const kg_model_t *base,
                         float *alpha,
                         char *errstr,
                         size_t errstr_size) {
    kg_gguf_str_t s;
    if (!kg_gguf_get_str(g, "general.type", &s) || !str_is(s, "adapter")) {
        snprintf(errstr, errstr_size, "lora: %s: general.type is not \"adapter\"", path);
        return false;
    }
    if (!kg_gguf_get_str(g, "adapter.type", &s) || !str_is(s, "lora")) {
        snprintf(errstr, errstr_size, "lora: %s: adapter.type is not \"lora\"", path);
        return false;
    }
    kg_gguf_str_t arch, base_arch;
    if (!kg_gguf_get_str(g, "general.architecture", &arch)) {
        snprintf(errstr, errstr_size, "lora: %s has no general.architecture", path);
        return false;
    }
    if (!kg_gguf_get_str(base->gguf, "general.architecture", &base_arch) ||
        arch.len != base_arch.len || memcmp(arch.data, base_arch.data, arch.len) != 0) {
        snprintf(errstr, errstr_size,
                 "lora: %s is an adapter for architecture \"%.*s\", the base model is \"%s\"", path,
                 (int)(arch.len > 64 ? 64 : arch.len), arch.data, kg_arch_name(base->hp.arch));
        return false;
    }
    *alpha = 0.0f;
    if (kg_gguf_find_key(g, "adapter.lora.alpha") >= 0 &&
        !kg_gguf_get_f32(g, "adapter.lora.alpha", alpha)) {
        snprintf(errstr, errstr_size, "lora: %s: adapter.lora.alpha is not an F32", path);
        return false;
    }
    return true;
}

/* Enter tensor t (its name ends .lora_a or .lora_b) into the pairs. */
static bool add_tensor(kg_lora_t *lora,
                       const kg_gguf_tensor_t *t,
                       const char *path,
                       const kg_model_t *base,
                       char *errstr,
                       size_t errstr_size) {
    char name[128];
    if (t->name.len >= sizeof(name)) {
        snprintf(errstr, errstr_size, "lora: %s: tensor name of %llu bytes", path,
                 (unsigned long long)t->name.len);
        return false;
    }
    memcpy(name, t->name.data, t->name.len);
    name[t->name.len] = '\0';
    size_t len = t->name.len;
    bool is_a = len > 7 && strcmp(name + len - 7, ".lora_a") == 0;
    bool is_b = len > 7 && strcmp(name + len - 7, ".lora_b") == 0;
    if (!is_a && !is_b) {
        snprintf(errstr, errstr_size, "lora: %s: tensor '%s' is neither a .lora_a nor a .lora_b",
                 path, name);
        return false;
    }
    name[len - 7] = '\0';
    int32_t il;
    kg_lora_proj_t p;
    if (!parse_name(name, &il, &p)) {
        snprintf(errstr, errstr_size,
                 "lora: %s: tensor '%s': kgen adapts only blk.N.{attn_q,attn_k,attn_v,"
                 "attn_output,ffn_gate,ffn_up,ffn_down}.weight",
                 path, name);
        return false;
    }
    if (il >= lora->n_layer || !base_weight(base, il, p)) {
        snprintf(errstr, errstr_size,
                 "lora: %s: tensor '%s' does not exist in the base model (wrong base?)", path,
                 name);
        return false;
    }
    if (!type_ok(t->type) || t->n_dims != 2) {
        snprintf(errstr, errstr_size,
                 "lora: %s: tensor '%s.lora_%c' is %uD %s (adapters: 2D f32, f16, bf16 or q8_0)",
                 path, name, is_a ? 'a' : 'b', t->n_dims, kg_ggml_type_name(t->type));
        return false;
    }
    kg_lora_pair_t *pair = &lora->pairs[il][p];
    const kg_gguf_tensor_t **slot = is_a ? &pair->a : &pair->b;
    if (*slot) {
        snprintf(errstr, errstr_size, "lora: %s: tensor '%s' twice", path, name);
        return false;
    }
    *slot = t;
    lora->size += t->size;
    return true;
}

/* Both halves of every pair, with shapes that fit the base weight. */
static bool check_pairs(
    kg_lora_t *lora, const char *path, const kg_model_t *base, char *errstr, size_t errstr_size) {
    for (int32_t il = 0; il < lora->n_layer; il++) {
        for (int p = 0; p < KG_LORA_N_PROJ; p++) {
            kg_lora_pair_t *pair = &lora->pairs[il][p];
            if (!pair->a && !pair->b) {
                continue;
            }
            const kg_gguf_tensor_t *w = base_weight(base, il, (kg_lora_proj_t)p);
            if (!pair->a || !pair->b) {
                snprintf(errstr, errstr_size,
                         "lora: %s: tensor 'blk.%d.%s.weight' has only its lora_%c", path, il,
                         proj_names[p], pair->a ? 'a' : 'b');
                return false;
            }
            /* A (n_in, r), B (r, n_out) against W (n_in, n_out) */
            if (pair->a->ne[0] != w->ne[0] || pair->b->ne[1] != w->ne[1] ||
                pair->a->ne[1] != pair->b->ne[0] || pair->a->ne[1] <= 0) {
                snprintf(errstr, errstr_size,
                         "lora: %s: tensor 'blk.%d.%s.weight' has incorrect shape: lora_a "
                         "(%lld, %lld), lora_b (%lld, %lld), base (%lld, %lld) (wrong base?)",
                         path, il, proj_names[p], (long long)pair->a->ne[0],
                         (long long)pair->a->ne[1], (long long)pair->b->ne[0],
                         (long long)pair->b->ne[1], (long long)w->ne[0], (long long)w->ne[1]);
                return false;
            }
            pair->rank = (int32_t)pair->b->ne[0];
            lora->max_rank = pair->rank > lora->max_rank ? pair->rank : lora->max_rank;
            lora->n_pairs++;
        }
    }
    if (lora->n_pairs == 0) {
        snprintf(errstr, errstr_size, "lora: %s has no lora_a/lora_b tensors", path);
        return false;
    }
    return true;
}

kg_lora_t *kg_lora_load_gguf(
    kg_gguf_t *gguf, const char *path, const kg_model_t *base, char *errstr, size_t errstr_size) {
    kg_lora_t *lora = calloc(1, sizeof(*lora));
    if (!lora) {
        kg_gguf_free(gguf);
        snprintf(errstr, errstr_size, "lora: out of memory");
        return NULL;
    }
    lora->gguf = gguf;
    lora->n_layer = base->hp.n_layer;
    lora->pairs = calloc((size_t)lora->n_layer, sizeof(*lora->pairs));
    if (!lora->pairs) {
        snprintf(errstr, errstr_size, "lora: out of memory");
        kg_lora_free(lora);
        return NULL;
    }
    if (!check_header(gguf, path, base, &lora->alpha, errstr, errstr_size)) {
        kg_lora_free(lora);
        return NULL;
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(gguf); i++) {
        if (!add_tensor(lora, kg_gguf_tensor(gguf, i), path, base, errstr, errstr_size)) {
            kg_lora_free(lora);
            return NULL;
        }
    }
    if (!check_pairs(lora, path, base, errstr, errstr_size)) {
        kg_lora_free(lora);
        return NULL;
    }
    return lora;
}

kg_lora_t *
kg_lora_load(const char *path, const kg_model_t *base, char *errstr, size_t errstr_size) {
    kg_gguf_t *gguf = kg_gguf_open(path, errstr, errstr_size);
    if (!gguf) {
        return NULL;
    }
    return kg_lora_load_gguf(gguf, path, base, errstr, errstr_size);
}

void kg_lora_free(kg_lora_t *lora) {
    if (!lora) {
        return;
    }
    free(lora->pairs);
    kg_gguf_free(lora->gguf);
    free(lora);
}

float kg_lora_pair_scale(const kg_lora_t *lora, const kg_lora_pair_t *pair, float scale) {
    return lora->alpha != 0.0f ? scale * lora->alpha / (float)pair->rank : scale;
}
