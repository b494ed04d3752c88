/* kg_gguf_lookup: the answers of an open GGUF file: metadata keys, their
 * typed values and arrays (with the integer conversions llama.cpp's loader
 * allows), and tensors by index or name. kg_gguf.c checked every offset and
 * size when it built the index, so these are lookups that cannot fail on a
 * bad file; they fail only on a missing key or a value of another type. */
#include "kg_gguf_int.h"
#include "kg_quant.h"

#include <string.h>

// ---- metadata values ----

/** Integer value of a scalar metadata entry, as signed or unsigned 64-bit.
 * Returns false when the entry is not an integer. */
bool kg_gguf_kv_int(const kg_gguf_t *g, const kg_gguf_kv_t *e, bool *neg, uint64_t *mag) {
    const uint8_t *p = g->base + e->val_off;
    int64_t s;
    *neg = false;
    switch (e->type) {
    case KG_GGUF_TYPE_UINT8:
        *mag = p[0];
        return true;
    case KG_GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *mag = v;
        return true;
    }
    case KG_GGUF_TYPE_UINT32:
        *mag = kg_gguf_rd_u32(p);
        return true;
    case KG_GGUF_TYPE_UINT64:
        *mag = kg_gguf_rd_u64(p);
        return true;
    case KG_GGUF_TYPE_INT8:
        // a GGUF int8 is a small signed integer, not a character: sign extension is the point
        s = (int8_t)p[0]; // NOLINT(bugprone-signed-char-misuse,cert-str34-c)
        break;
    case KG_GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        s = v;
        break;
    }
    case KG_GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        s = v;
        break;
    }
    case KG_GGUF_TYPE_INT64:
        memcpy(&s, p, 8);
        break;
    default:
        return false;
    }
    *neg = s < 0;
    // magnitude without overflow for INT64_MIN
    *mag = s < 0 ? (uint64_t)(-(s + 1)) + 1 : (uint64_t)s;
    return true;
}

// ---- metadata accessors ----

int64_t kg_gguf_n_kv(const kg_gguf_t *g) {
    return g->n_kv;
}

int64_t kg_gguf_find_key(const kg_gguf_t *g, const char *key) {
    if (!g->kv_hash) {
        return -1;
    }
    uint64_t len = strlen(key);
    size_t mask = g->kv_hash_cap - 1;
    for (size_t h = (size_t)kg_gguf_hash(key, len) & mask; g->kv_hash[h]; h = (h + 1) & mask) {
        int64_t i = (int64_t)g->kv_hash[h] - 1;
        if (kg_gguf_str_eq(g->kv[i].key, key, len)) {
            return i;
        }
    }
    return -1;
}

kg_gguf_str_t kg_gguf_key(const kg_gguf_t *g, int64_t idx) {
    return g->kv[idx].key;
}

kg_gguf_type_t kg_gguf_kv_type(const kg_gguf_t *g, int64_t idx) {
    return g->kv[idx].type;
}

const void *kg_gguf_kv_raw(const kg_gguf_t *g, int64_t idx, size_t *size) {
    *size = (size_t)g->kv[idx].val_size;
    return g->base + g->kv[idx].val_off;
}

static const kg_gguf_kv_t *find(const kg_gguf_t *g, const char *key) {
    int64_t i = kg_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

bool kg_gguf_get_u32(const kg_gguf_t *g, const char *key, uint32_t *out) {
    const kg_gguf_kv_t *e = find(g, key);
    bool neg;
    uint64_t v;
    if (!e || !kg_gguf_kv_int(g, e, &neg, &v) || neg || v > UINT32_MAX) {
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

bool kg_gguf_get_i64(const kg_gguf_t *g, const char *key, int64_t *out) {
    const kg_gguf_kv_t *e = find(g, key);
    bool neg;
    uint64_t v;
    if (!e || !kg_gguf_kv_int(g, e, &neg, &v)) {
        return false;
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) {
            return false;
        }
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX) {
            return false;
        }
        *out = (int64_t)v;
    }
    return true;
}

bool kg_gguf_get_f32(const kg_gguf_t *g, const char *key, float *out) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e) {
        return false;
    }
    if (e->type == KG_GGUF_TYPE_FLOAT32) {
        memcpy(out, g->base + e->val_off, sizeof(float));
        return true;
    }
    if (e->type == KG_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, g->base + e->val_off, sizeof(d));
        *out = (float)d;
        return true;
    }
    return false;
}

bool kg_gguf_get_bool(const kg_gguf_t *g, const char *key, bool *out) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e || e->type != KG_GGUF_TYPE_BOOL) {
        return false;
    }
    *out = g->base[e->val_off] != 0;
    return true;
}

bool kg_gguf_get_str(const kg_gguf_t *g, const char *key, kg_gguf_str_t *out) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e || e->type != KG_GGUF_TYPE_STRING) {
        return false;
    }
    out->len = kg_gguf_rd_u64(g->base + e->val_off);
    out->data = (const char *)g->base + e->val_off + 8;
    return true;
}

bool kg_gguf_get_arr(const kg_gguf_t *g, const char *key, kg_gguf_type_t *elem_type, uint64_t *n) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e || e->type != KG_GGUF_TYPE_ARRAY) {
        return false;
    }
    *elem_type = e->arr_type;
    *n = e->arr_n;
    return true;
}

kg_gguf_str_t kg_gguf_arr_str(const kg_gguf_t *g, const char *key, uint64_t i) {
    const kg_gguf_kv_t *e = find(g, key);
    kg_gguf_str_t none = {"", 0};
    if (!e || !e->strs || i >= e->arr_n) {
        return none;
    }
    return e->strs[i];
}

/** Element i of an integer array; false when it does not fit int64. */
static bool arr_elem_int(const kg_gguf_t *g, const kg_gguf_kv_t *e, uint64_t i, int64_t *iv) {
    const uint8_t *p = g->base + e->arr_off + i * kg_gguf_type_size(e->arr_type);
    switch (e->arr_type) {
    case KG_GGUF_TYPE_UINT8:
        *iv = p[0];
        return true;
    case KG_GGUF_TYPE_INT8:
        // a GGUF int8 is a small signed integer, not a character: sign extension is the point
        *iv = (int8_t)p[0]; // NOLINT(bugprone-signed-char-misuse,cert-str34-c)
        return true;
    case KG_GGUF_TYPE_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        *iv = x;
        return true;
    }
    case KG_GGUF_TYPE_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        *iv = x;
        return true;
    }
    case KG_GGUF_TYPE_UINT32:
        *iv = kg_gguf_rd_u32(p);
        return true;
    case KG_GGUF_TYPE_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        *iv = x;
        return true;
    }
    case KG_GGUF_TYPE_UINT64: {
        uint64_t x = kg_gguf_rd_u64(p);
        *iv = (int64_t)x;
        return x <= (uint64_t)INT64_MAX;
    }
    case KG_GGUF_TYPE_INT64:
        memcpy(iv, p, 8);
        return true;
    default:
        return false;
    }
}

static bool is_int_type(kg_gguf_type_t t) {
    return kg_gguf_type_size(t) != 0 && t != KG_GGUF_TYPE_BOOL && t != KG_GGUF_TYPE_FLOAT32 &&
           t != KG_GGUF_TYPE_FLOAT64;
}

bool kg_gguf_arr_f32(const kg_gguf_t *g, const char *key, float *dst, uint64_t n) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e || e->type != KG_GGUF_TYPE_ARRAY || e->arr_n != n) {
        return false;
    }
    const uint8_t *p = g->base + e->arr_off;
    if (e->arr_type == KG_GGUF_TYPE_FLOAT32) {
        memcpy(dst, p, (size_t)n * sizeof(float));
        return true;
    }
    if (e->arr_type == KG_GGUF_TYPE_FLOAT64) {
        for (uint64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof(d));
            dst[i] = (float)d;
        }
        return true;
    }
    if (!is_int_type(e->arr_type)) {
        return false;
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t iv = 0;
        if (arr_elem_int(g, e, i, &iv)) {
            dst[i] = (float)iv;
        } else {
            dst[i] = (float)(uint64_t)iv; // a u64 above INT64_MAX
        }
    }
    return true;
}

bool kg_gguf_arr_i32(const kg_gguf_t *g, const char *key, int32_t *dst, uint64_t n) {
    const kg_gguf_kv_t *e = find(g, key);
    if (!e || e->type != KG_GGUF_TYPE_ARRAY || e->arr_n != n || !is_int_type(e->arr_type)) {
        return false;
    }
    // check every element first so dst is untouched on failure
    for (uint64_t i = 0; i < n; i++) {
        int64_t iv = 0;
        if (!arr_elem_int(g, e, i, &iv) || iv < INT32_MIN || iv > INT32_MAX) {
            return false;
        }
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t iv = 0;
        arr_elem_int(g, e, i, &iv);
        dst[i] = (int32_t)iv;
    }
    return true;
}

// ---- tensors ----

int64_t kg_gguf_n_tensors(const kg_gguf_t *g) {
    return g->n_tensors;
}

const kg_gguf_tensor_t *kg_gguf_tensor(const kg_gguf_t *g, int64_t idx) {
    return &g->tensors[idx];
}

const kg_gguf_tensor_t *kg_gguf_find_tensor(const kg_gguf_t *g, const char *name) {
    if (!g->t_hash) {
        return NULL;
    }
    uint64_t len = strlen(name);
    size_t mask = g->t_hash_cap - 1;
    for (size_t h = (size_t)kg_gguf_hash(name, len) & mask; g->t_hash[h]; h = (h + 1) & mask) {
        const kg_gguf_tensor_t *t = &g->tensors[g->t_hash[h] - 1];
        if (kg_gguf_str_eq(t->name, name, len)) {
            return t;
        }
    }
    return NULL;
}

const char *kg_ggml_type_name(kg_ggml_type_t type) {
    const char *name = kg_type_name((uint32_t)type);
    return name ? name : "unknown";
}
