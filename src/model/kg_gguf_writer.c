/* kg_gguf_writer: a GGUF v3 file built in memory, written in one pass.
 *
 * Metadata values are kept already serialized (the bytes that follow the
 * type tag in the file), so copying an entry from another file is a memcpy
 * and writing is a concatenation. Tensor data is converted to its stored
 * type when added. Nothing depends on addresses, time or hash order, so the
 * same calls give the same bytes. */
#include "kg_gguf_writer.h"

#include "kg_quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WRITER_ALIGNMENT 32
#define MAX_NAME         64 /* GGML_MAX_NAME: llama.cpp rejects longer tensor names */

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* serialized value (after the type tag) */
    size_t val_size;
} wkv_t;

typedef struct wtensor {
    char *name;
    kg_ggml_type_t type;
    uint32_t n_dims;
    int64_t ne[KG_GGUF_MAX_DIMS];
    uint8_t *data; /* (size) bytes in `type`'s format */
    size_t size;
} wtensor_t;

struct kg_gguf_writer {
    wkv_t *kv; /* (n_kv) in insertion order */
    size_t n_kv, cap_kv;
    wtensor_t *tensors; /* (n_tensors) in insertion order */
    size_t n_tensors, cap_tensors;
    bool oom; /* a setter could not allocate: write fails with KG_ERR_NOMEM */
};

kg_gguf_writer_t *kg_gguf_writer_new(void) {
    return calloc(1, sizeof(kg_gguf_writer_t));
}

void kg_gguf_writer_free(kg_gguf_writer_t *w) {
    if (!w) {
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->kv);
    free(w->tensors);
    free(w);
}

// ---- metadata ----

/** Store a serialized value under `key`; takes ownership of `val`. */
static void
set_kv_owned(kg_gguf_writer_t *w, const char *key, uint32_t type, uint8_t *val, size_t val_size) {
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_size = val_size;
            return;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv_t *kv = realloc(w->kv, cap * sizeof(*kv));
        if (!kv) {
            w->oom = true;
            free(val);
            return;
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        w->oom = true;
        free(val);
        return;
    }
    w->kv[w->n_kv++] = (wkv_t){k, type, val, val_size};
}

static void
set_kv(kg_gguf_writer_t *w, const char *key, uint32_t type, const void *val, size_t val_size) {
    uint8_t *copy = malloc(val_size ? val_size : 1);
    if (!copy) {
        w->oom = true;
        return;
    }
    memcpy(copy, val, val_size);
    set_kv_owned(w, key, type, copy, val_size);
}

void kg_gguf_writer_set_u8(kg_gguf_writer_t *w, const char *key, uint8_t v) {
    set_kv(w, key, KG_GGUF_TYPE_UINT8, &v, sizeof(v));
}

void kg_gguf_writer_set_i8(kg_gguf_writer_t *w, const char *key, int8_t v) {
    set_kv(w, key, KG_GGUF_TYPE_INT8, &v, sizeof(v));
}

void kg_gguf_writer_set_u16(kg_gguf_writer_t *w, const char *key, uint16_t v) {
    set_kv(w, key, KG_GGUF_TYPE_UINT16, &v, sizeof(v));
}

void kg_gguf_writer_set_i16(kg_gguf_writer_t *w, const char *key, int16_t v) {
    set_kv(w, key, KG_GGUF_TYPE_INT16, &v, sizeof(v));
}

void kg_gguf_writer_set_u32(kg_gguf_writer_t *w, const char *key, uint32_t v) {
    set_kv(w, key, KG_GGUF_TYPE_UINT32, &v, sizeof(v));
}

void kg_gguf_writer_set_i32(kg_gguf_writer_t *w, const char *key, int32_t v) {
    set_kv(w, key, KG_GGUF_TYPE_INT32, &v, sizeof(v));
}

void kg_gguf_writer_set_u64(kg_gguf_writer_t *w, const char *key, uint64_t v) {
    set_kv(w, key, KG_GGUF_TYPE_UINT64, &v, sizeof(v));
}

void kg_gguf_writer_set_i64(kg_gguf_writer_t *w, const char *key, int64_t v) {
    set_kv(w, key, KG_GGUF_TYPE_INT64, &v, sizeof(v));
}

void kg_gguf_writer_set_f32(kg_gguf_writer_t *w, const char *key, float v) {
    set_kv(w, key, KG_GGUF_TYPE_FLOAT32, &v, sizeof(v));
}

void kg_gguf_writer_set_f64(kg_gguf_writer_t *w, const char *key, double v) {
    set_kv(w, key, KG_GGUF_TYPE_FLOAT64, &v, sizeof(v));
}

void kg_gguf_writer_set_bool(kg_gguf_writer_t *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    set_kv(w, key, KG_GGUF_TYPE_BOOL, &b, 1);
}

void kg_gguf_writer_set_str(kg_gguf_writer_t *w, const char *key, const char *v) {
    uint64_t len = strlen(v);
    uint8_t *val = malloc(8 + len);
    if (!val) {
        w->oom = true;
        return;
    }
    memcpy(val, &len, 8);
    // a GGUF string is length-prefixed (the u64 just written), never NUL-terminated
    memcpy(val + 8, v, len); // NOLINT(bugprone-not-null-terminated-result)
    set_kv_owned(w, key, KG_GGUF_TYPE_STRING, val, 8 + len);
}

void kg_gguf_writer_set_arr(
    kg_gguf_writer_t *w, const char *key, kg_gguf_type_t elem_type, const void *v, uint64_t n) {
    size_t esz = kg_gguf_type_size(elem_type);
    if (esz == 0 || n > (SIZE_MAX - 12) / esz) {
        w->oom = true; // a programming error; fail the write rather than the process
        return;
    }
    size_t size = 12 + (size_t)n * esz;
    uint8_t *val = malloc(size);
    if (!val) {
        w->oom = true;
        return;
    }
    uint32_t et = elem_type;
    memcpy(val, &et, 4);
    memcpy(val + 4, &n, 8);
    if (n) {
        memcpy(val + 12, v, (size_t)n * esz);
    }
    set_kv_owned(w, key, KG_GGUF_TYPE_ARRAY, val, size);
}

void kg_gguf_writer_set_arr_f32(kg_gguf_writer_t *w, const char *key, const float *v, uint64_t n) {
    kg_gguf_writer_set_arr(w, key, KG_GGUF_TYPE_FLOAT32, v, n);
}

void kg_gguf_writer_set_arr_i32(kg_gguf_writer_t *w,
                                const char *key,
                                const int32_t *v,
                                uint64_t n) {
    kg_gguf_writer_set_arr(w, key, KG_GGUF_TYPE_INT32, v, n);
}

void kg_gguf_writer_set_arr_str(kg_gguf_writer_t *w,
                                const char *key,
                                const kg_gguf_str_t *v,
                                uint64_t n) {
    size_t size = 12;
    for (uint64_t i = 0; i < n; i++) {
        size += 8 + (size_t)v[i].len;
    }
    uint8_t *val = malloc(size);
    if (!val) {
        w->oom = true;
        return;
    }
    uint32_t et = KG_GGUF_TYPE_STRING;
    memcpy(val, &et, 4);
    memcpy(val + 4, &n, 8);
    size_t pos = 12;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(val + pos, &v[i].len, 8);
        if (v[i].len) {
            memcpy(val + pos + 8, v[i].data, (size_t)v[i].len);
        }
        pos += 8 + (size_t)v[i].len;
    }
    set_kv_owned(w, key, KG_GGUF_TYPE_ARRAY, val, size);
}

void kg_gguf_writer_copy_kv(kg_gguf_writer_t *w, const kg_gguf_t *src, int64_t idx) {
    kg_gguf_str_t k = kg_gguf_key(src, idx);
    char *key = malloc((size_t)k.len + 1);
    if (!key) {
        w->oom = true;
        return;
    }
    memcpy(key, k.data, (size_t)k.len);
    key[k.len] = '\0';
    size_t size;
    const void *raw = kg_gguf_kv_raw(src, idx, &size);
    set_kv(w, key, kg_gguf_kv_type(src, idx), raw, size);
    free(key);
}

// ---- tensors ----

static kg_status_t add_tensor(kg_gguf_writer_t *w,
                              const char *name,
                              kg_ggml_type_t type,
                              uint32_t n_dims,
                              const int64_t *ne,
                              const float *f32,
                              const void *raw,
                              size_t raw_size) {
    size_t name_len = strlen(name);
    if (name_len == 0 || name_len >= MAX_NAME || n_dims < 1 || n_dims > KG_GGUF_MAX_DIMS ||
        !kg_type_is_known(type)) {
        return KG_ERR_INVALID;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            return KG_ERR_INVALID;
        }
    }
    wtensor_t t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 0 || (ne[d] > 0 && nel > (uint64_t)INT64_MAX / (uint64_t)ne[d])) {
            return KG_ERR_INVALID;
        }
        t.ne[d] = ne[d];
        nel *= (uint64_t)ne[d];
    }
    if (t.ne[0] % kg_type_block_elems(type) != 0) {
        return KG_ERR_INVALID;
    }
    t.size = (size_t)(nel / (uint64_t)kg_type_block_elems(type)) * kg_type_block_size(type);
    if (raw && raw_size != t.size) {
        return KG_ERR_INVALID;
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor_t *ts = realloc(w->tensors, cap * sizeof(*ts));
        if (!ts) {
            return KG_ERR_NOMEM;
        }
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    t.name = strdup(name);
    t.data = malloc(t.size ? t.size : 1);
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        return KG_ERR_NOMEM;
    }
    if (raw) {
        memcpy(t.data, raw, t.size);
    } else if (!kg_quantize(type, f32, t.data, (int64_t)nel)) {
        free(t.name);
        free(t.data);
        return KG_ERR_INVALID; // a type the quantizer cannot produce (Q4_K, Q6_K)
    }
    w->tensors[w->n_tensors++] = t;
    return KG_OK;
}

kg_status_t kg_gguf_writer_add_tensor(kg_gguf_writer_t *w,
                                      const char *name,
                                      kg_ggml_type_t type,
                                      uint32_t n_dims,
                                      const int64_t *ne,
                                      const float *data) {
    return add_tensor(w, name, type, n_dims, ne, data, NULL, 0);
}

kg_status_t kg_gguf_writer_add_tensor_raw(kg_gguf_writer_t *w,
                                          const char *name,
                                          kg_ggml_type_t type,
                                          uint32_t n_dims,
                                          const int64_t *ne,
                                          const void *data,
                                          size_t size) {
    return add_tensor(w, name, type, n_dims, ne, NULL, data, size);
}

// ---- serialization ----

/* Output goes either to a FILE or to a growing buffer. */
typedef struct sink {
    FILE *f;
    uint8_t *buf;
    size_t n, cap;
    bool failed;
} sink_t;

static void emit(sink_t *s, const void *p, size_t n) {
    if (s->failed || n == 0) {
        return;
    }
    if (s->f) {
        s->failed = fwrite(p, 1, n, s->f) != n;
        s->n += n;
        return;
    }
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n) {
            cap *= 2;
        }
        uint8_t *b = realloc(s->buf, cap);
        if (!b) {
            s->failed = true;
            return;
        }
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->n, p, n);
    s->n += n;
}

static void emit_u32(sink_t *s, uint32_t v) {
    emit(s, &v, 4);
}

static void emit_u64(sink_t *s, uint64_t v) {
    emit(s, &v, 8);
}

static void emit_str(sink_t *s, const char *str) {
    emit_u64(s, strlen(str));
    emit(s, str, strlen(str));
}

static void emit_pad(sink_t *s, size_t align) {
    static const uint8_t zero[256];
    if (s->n % align) {
        emit(s, zero, align - s->n % align);
    }
}

/** general.alignment as set by the caller (a u32 power of two), else 32. */
static uint32_t alignment_of(const kg_gguf_writer_t *w, bool *present) {
    *present = false;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") == 0) {
            *present = true;
            uint32_t v;
            if (w->kv[i].type == KG_GGUF_TYPE_UINT32) {
                memcpy(&v, w->kv[i].val, 4);
                if (v != 0 && v <= 256 && (v & (v - 1)) == 0) {
                    return v;
                }
            }
            return 0;
        }
    }
    return WRITER_ALIGNMENT;
}

static kg_status_t serialize(const kg_gguf_writer_t *w, sink_t *s) {
    if (w->oom) {
        return KG_ERR_NOMEM;
    }
    bool has_align;
    uint32_t align = alignment_of(w, &has_align);
    if (align == 0) {
        return KG_ERR_INVALID;
    }
    emit(s, "GGUF", 4);
    emit_u32(s, 3);
    emit_u64(s, w->n_tensors);
    emit_u64(s, w->n_kv + (has_align ? 0 : 1));
    for (size_t i = 0; i < w->n_kv; i++) {
        emit_str(s, w->kv[i].key);
        emit_u32(s, w->kv[i].type);
        emit(s, w->kv[i].val, w->kv[i].val_size);
    }
    if (!has_align) {
        emit_str(s, "general.alignment");
        emit_u32(s, KG_GGUF_TYPE_UINT32);
        emit_u32(s, align);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor_t *t = &w->tensors[i];
        emit_str(s, t->name);
        emit_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            emit_u64(s, (uint64_t)t->ne[d]);
        }
        emit_u32(s, t->type);
        emit_u64(s, offset);
        offset += (t->size + align - 1) / align * align;
    }
    emit_pad(s, align);
    for (size_t i = 0; i < w->n_tensors; i++) {
        emit(s, w->tensors[i].data, w->tensors[i].size);
        emit_pad(s, align);
    }
    return s->failed ? (s->f ? KG_ERR_IO : KG_ERR_NOMEM) : KG_OK;
}

kg_status_t kg_gguf_writer_to_memory(const kg_gguf_writer_t *w, uint8_t **out, size_t *size) {
    sink_t s = {0};
    kg_status_t st = serialize(w, &s);
    if (st != KG_OK) {
        free(s.buf);
        return st;
    }
    *out = s.buf ? s.buf : malloc(1);
    *size = s.n;
    return *out ? KG_OK : KG_ERR_NOMEM;
}

kg_status_t kg_gguf_writer_write(const kg_gguf_writer_t *w,
                                 const char *path,
                                 char *errstr,
                                 size_t errstr_size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(errstr, errstr_size, "gguf writer: cannot create '%s': %s", path, strerror(errno));
        return KG_ERR_IO;
    }
    sink_t s = {.f = f};
    kg_status_t st = serialize(w, &s);
    int saved = errno;
    if (fclose(f) != 0 && st == KG_OK) {
        saved = errno;
        st = KG_ERR_IO;
    }
    if (st != KG_OK) {
        if (st == KG_ERR_IO) {
            snprintf(errstr, errstr_size, "gguf writer: writing '%s' failed: %s", path,
                     strerror(saved));
        } else if (st == KG_ERR_INVALID) {
            snprintf(errstr, errstr_size,
                     "gguf writer: general.alignment must be a u32 power of two up to 256");
        } else {
            snprintf(errstr, errstr_size, "gguf writer: out of memory building '%s'", path);
        }
        unlink(path); // never leave a half-written model behind
    }
    return st;
}
