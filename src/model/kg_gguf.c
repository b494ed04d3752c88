/* kg_gguf: the checked GGUF reader (see kg_gguf.h for the design).
 *
 * Layout (v2/v3, little-endian):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x { str key, u32 type, value }      str = u64 len + bytes
 *   n_tensors x { str name, u32 n_dims, i64 ne[n_dims], u32 type, u64 offset }
 *   padding to `alignment`, then the data section; each tensor's data starts
 *   at data section + offset.
 *
 * Every read goes through a cursor that checks the bytes are there before it
 * touches them, with arithmetic that cannot wrap; counts are checked against
 * the bytes left before anything is allocated from them, so a 60-byte file
 * cannot ask for a billion-entry index.
 *
 * This file reads and checks the file and builds the index (open, free);
 * kg_gguf_lookup.c answers from the index (keys, typed values, arrays,
 * tensors); kg_gguf_int.h holds the index they share. */
#include "kg_gguf_int.h"
#include "kg_quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kg_gguf reads little-endian GGUF files in place and needs a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
/* Arrays of arrays are legal but no real file nests them; the bound keeps a
 * hostile file from recursing the stack away. */
#define GGUF_MAX_ARRAY_DEPTH 8

// ---- errors and the cursor ----

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *errstr;
    size_t errstr_size;
} cursor_t;

__attribute__((format(printf, 3, 4))) static void
set_err(char *errstr, size_t errstr_size, const char *fmt, ...) {
    if (!errstr || errstr_size == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    // clang 14's valist checker misses the va_start just above (a known false positive)
    vsnprintf(errstr, errstr_size, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
}

/** Whether n bytes are left at the cursor; if not, write the truncation
 * error naming `what` (printf-formatted). */
__attribute__((format(printf, 3, 4))) static bool
need(cursor_t *c, uint64_t n, const char *what, ...) {
    if (n <= c->size - c->pos) {
        return true;
    }
    char desc[256];
    va_list ap;
    va_start(ap, what);
    // clang 14's valist checker misses the va_start just above (a known false positive)
    vsnprintf(desc, sizeof(desc), what, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    set_err(c->errstr, c->errstr_size,
            "gguf: truncated file: %s at offset %zu needs %llu bytes, file has %zu", desc, c->pos,
            (unsigned long long)n, c->size);
    return false;
}

/* The `what` of these readers is a plain string (already formatted). */
static bool take_u32(cursor_t *c, uint32_t *v, const char *what) {
    if (!need(c, 4, "%s", what)) {
        return false;
    }
    *v = kg_gguf_rd_u32(c->base + c->pos);
    c->pos += 4;
    return true;
}

static bool take_u64(cursor_t *c, uint64_t *v, const char *what) {
    if (!need(c, 8, "%s", what)) {
        return false;
    }
    *v = kg_gguf_rd_u64(c->base + c->pos);
    c->pos += 8;
    return true;
}

/** A length-prefixed string; its bytes stay in the file. */
static bool take_str(cursor_t *c, kg_gguf_str_t *s, const char *what) {
    uint64_t len;
    char lwhat[300];
    // labels are short literals; a longer one is cut, never overrun
    int w = snprintf(lwhat, sizeof(lwhat), "%.280s length", what);
    (void)w;
    if (!take_u64(c, &len, lwhat)) {
        return false;
    }
    if (!need(c, len, "%s", what)) {
        return false;
    }
    s->data = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return true;
}

/** A printable, bounded copy of a file string for error messages. */
static const char *printable(kg_gguf_str_t s, char *buf, size_t cap) {
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)s.data[i];
        buf[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (s.len > n && n + 4 >= cap) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

static size_t hash_cap_for(int64_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) {
        cap *= 2;
    }
    return cap;
}

// ---- metadata values ----

size_t kg_gguf_type_size(uint32_t type) {
    switch (type) {
    case KG_GGUF_TYPE_UINT8:
    case KG_GGUF_TYPE_INT8:
    case KG_GGUF_TYPE_BOOL:
        return 1;
    case KG_GGUF_TYPE_UINT16:
    case KG_GGUF_TYPE_INT16:
        return 2;
    case KG_GGUF_TYPE_UINT32:
    case KG_GGUF_TYPE_INT32:
    case KG_GGUF_TYPE_FLOAT32:
        return 4;
    case KG_GGUF_TYPE_UINT64:
    case KG_GGUF_TYPE_INT64:
    case KG_GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/** Step over one value of `type` (arrays recursively, to a bounded depth). */
static bool skip_value(cursor_t *c, uint32_t type, int depth, const char *what) {
    size_t sz = kg_gguf_type_size(type);
    if (sz) {
        return need(c, sz, "%s", what) && (c->pos += sz, true);
    }
    if (type == KG_GGUF_TYPE_STRING) {
        kg_gguf_str_t s;
        return take_str(c, &s, what);
    }
    if (type != KG_GGUF_TYPE_ARRAY) {
        set_err(c->errstr, c->errstr_size, "gguf: %s at offset %zu: unknown value type %u", what,
                c->pos, type);
        return false;
    }
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
        set_err(c->errstr, c->errstr_size, "gguf: %s at offset %zu: arrays nested deeper than %d",
                what, c->pos, GGUF_MAX_ARRAY_DEPTH);
        return false;
    }
    uint32_t et;
    uint64_t n;
    char w[300];
    snprintf(w, sizeof(w), "%s array type", what);
    if (!take_u32(c, &et, w)) {
        return false;
    }
    snprintf(w, sizeof(w), "%s array length", what);
    if (!take_u64(c, &n, w)) {
        return false;
    }
    size_t esz = kg_gguf_type_size(et);
    if (esz) {
        if (n > (c->size - c->pos) / esz) {
            set_err(c->errstr, c->errstr_size,
                    "gguf: truncated file: %s at offset %zu needs %llu elements of %zu bytes, "
                    "file has %zu",
                    what, c->pos, (unsigned long long)n, esz, c->size);
            return false;
        }
        c->pos += (size_t)(n * esz);
        return true;
    }
    if (et != KG_GGUF_TYPE_STRING && et != KG_GGUF_TYPE_ARRAY) {
        set_err(c->errstr, c->errstr_size, "gguf: %s at offset %zu: unknown array element type %u",
                what, c->pos - 12, et);
        return false;
    }
    for (uint64_t i = 0; i < n; i++) {
        // each element takes at least 8 bytes, so this loop ends within the file
        snprintf(w, sizeof(w), "%s element %llu", what, (unsigned long long)i);
        if (!skip_value(c, et, depth + 1, w)) {
            return false;
        }
    }
    return true;
}

static bool parse_kv(cursor_t *c, kg_gguf_kv_t *e, int64_t idx) {
    char what[300];
    char kbuf[80];
    snprintf(what, sizeof(what), "key %lld name", (long long)idx);
    if (!take_str(c, &e->key, what)) {
        return false;
    }
    uint32_t type;
    snprintf(what, sizeof(what), "key '%s' type", printable(e->key, kbuf, sizeof(kbuf)));
    if (!take_u32(c, &type, what)) {
        return false;
    }
    if (type >= KG_GGUF_TYPE_COUNT) {
        set_err(c->errstr, c->errstr_size, "gguf: key '%s' at offset %zu: unknown value type %u",
                kbuf, c->pos - 4, type);
        return false;
    }
    e->type = (kg_gguf_type_t)type;
    e->val_off = c->pos;
    snprintf(what, sizeof(what), "key '%s' value", kbuf);
    if (type == KG_GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t n;
        snprintf(what, sizeof(what), "key '%s' array type", kbuf);
        if (!take_u32(c, &et, what)) {
            return false;
        }
        snprintf(what, sizeof(what), "key '%s' array length", kbuf);
        if (!take_u64(c, &n, what)) {
            return false;
        }
        if (et >= KG_GGUF_TYPE_COUNT) {
            set_err(c->errstr, c->errstr_size,
                    "gguf: key '%s' at offset %zu: unknown array element type %u", kbuf,
                    c->pos - 12, et);
            return false;
        }
        e->arr_type = (kg_gguf_type_t)et;
        e->arr_n = n;
        e->arr_off = c->pos;
        if (et == KG_GGUF_TYPE_STRING) {
            // index each string: the vocabulary getters are called 100k times
            if (n > (c->size - c->pos) / 8) {
                set_err(c->errstr, c->errstr_size,
                        "gguf: truncated file: key '%s' at offset %zu needs %llu strings of at "
                        "least 8 bytes, file has %zu",
                        kbuf, c->pos, (unsigned long long)n, c->size);
                return false;
            }
            e->strs = malloc((size_t)(n ? n : 1) * sizeof(*e->strs));
            if (!e->strs) {
                set_err(c->errstr, c->errstr_size, "gguf: out of memory indexing key '%s'", kbuf);
                return false;
            }
            for (uint64_t i = 0; i < n; i++) {
                // fast path without formatting: vocabularies have 100k+ strings
                size_t left = c->size - c->pos;
                if (left >= 8) {
                    uint64_t len = kg_gguf_rd_u64(c->base + c->pos);
                    if (len <= left - 8) {
                        e->strs[i].data = (const char *)c->base + c->pos + 8;
                        e->strs[i].len = len;
                        c->pos += 8 + (size_t)len;
                        continue;
                    }
                }
                snprintf(what, sizeof(what), "key '%s' element %llu", kbuf, (unsigned long long)i);
                if (!take_str(c, &e->strs[i], what)) {
                    return false;
                }
            }
        } else {
            // rewind over the array header and step over the whole value
            c->pos = (size_t)e->val_off;
            snprintf(what, sizeof(what), "key '%s' value", kbuf);
            if (!skip_value(c, KG_GGUF_TYPE_ARRAY, 0, what)) {
                return false;
            }
        }
    } else if (!skip_value(c, type, 0, what)) {
        return false;
    }
    e->val_size = c->pos - e->val_off;
    return true;
}

// ---- tensors ----

static bool parse_tensor(kg_gguf_t *g, cursor_t *c, kg_gguf_tensor_t *t, int64_t idx) {
    char what[300];
    char nbuf[80];
    snprintf(what, sizeof(what), "tensor info %lld name", (long long)idx);
    if (!take_str(c, &t->name, what)) {
        return false;
    }
    printable(t->name, nbuf, sizeof(nbuf));
    snprintf(what, sizeof(what), "tensor '%s' n_dims", nbuf);
    size_t at = c->pos;
    if (!take_u32(c, &t->n_dims, what)) {
        return false;
    }
    if (t->n_dims < 1 || t->n_dims > KG_GGUF_MAX_DIMS) {
        set_err(c->errstr, c->errstr_size,
                "gguf: tensor '%s' at offset %zu: n_dims %u not in 1..%d", nbuf, at, t->n_dims,
                KG_GGUF_MAX_DIMS);
        return false;
    }
    for (int d = 0; d < KG_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        at = c->pos;
        snprintf(what, sizeof(what), "tensor '%s' ne[%u]", nbuf, d);
        if (!take_u64(c, &v, what)) {
            return false;
        }
        if (v > (uint64_t)INT64_MAX) {
            set_err(c->errstr, c->errstr_size,
                    "gguf: tensor '%s' at offset %zu: ne[%u] is negative", nbuf, at, d);
            return false;
        }
        t->ne[d] = (int64_t)v;
    }
    uint32_t type;
    at = c->pos;
    snprintf(what, sizeof(what), "tensor '%s' type", nbuf);
    if (!take_u32(c, &type, what)) {
        return false;
    }
    if (!kg_type_is_known(type)) {
        const char *tn = kg_type_name(type);
        set_err(c->errstr, c->errstr_size,
                "gguf: tensor '%s' has type %s (%u), which kgen does not support (at offset %zu; "
                "supported: %s)",
                nbuf, tn ? tn : "unknown", type, at, kg_type_list());
        return false;
    }
    t->type = (kg_ggml_type_t)type;
    snprintf(what, sizeof(what), "tensor '%s' offset", nbuf);
    if (!take_u64(c, &t->offset, what)) {
        return false;
    }

    // element count must fit int64, and the byte size must fit the address space
    uint64_t nel = 1;
    for (int d = 0; d < KG_GGUF_MAX_DIMS; d++) {
        uint64_t ne = (uint64_t)t->ne[d];
        if (ne != 0 && nel > (uint64_t)INT64_MAX / ne) {
            set_err(c->errstr, c->errstr_size,
                    "gguf: tensor '%s' at offset %zu: element count overflows", nbuf, at);
            return false;
        }
        nel *= ne;
    }
    int64_t blck = kg_type_block_elems(t->type);
    if (t->ne[0] % blck != 0) {
        set_err(c->errstr, c->errstr_size,
                "gguf: tensor '%s' at offset %zu: ne[0] = %lld is not a multiple of the %s block "
                "size %lld",
                nbuf, at, (long long)t->ne[0], kg_ggml_type_name(t->type), (long long)blck);
        return false;
    }
    // nel fits int64, and a block is never larger than its elements * 4 + 2 bytes, so
    // (nel / blck) * block_size only overflows for absurd counts: check anyway
    uint64_t n_blocks = nel / (uint64_t)blck;
    uint64_t bsz = kg_type_block_size(t->type);
    if (n_blocks > UINT64_MAX / bsz || n_blocks * bsz > SIZE_MAX) {
        set_err(c->errstr, c->errstr_size, "gguf: tensor '%s' at offset %zu: byte size overflows",
                nbuf, at);
        return false;
    }
    t->size = (size_t)(n_blocks * bsz);
    if (t->offset % g->alignment != 0) {
        set_err(c->errstr, c->errstr_size,
                "gguf: tensor '%s' at offset %zu: data offset %llu is not a multiple of the "
                "alignment %u",
                nbuf, c->pos - 8, (unsigned long long)t->offset, g->alignment);
        return false;
    }
    return true;
}

// ---- open ----

static const char *type_name_kv(uint32_t t) {
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < KG_GGUF_TYPE_COUNT ? names[t] : "?";
}

static bool index_keys(kg_gguf_t *g, cursor_t *c, const size_t *key_offs) {
    g->kv_hash_cap = hash_cap_for(g->n_kv);
    g->kv_hash = calloc(g->kv_hash_cap, sizeof(*g->kv_hash));
    if (!g->kv_hash) {
        set_err(c->errstr, c->errstr_size, "gguf: out of memory indexing %lld keys",
                (long long)g->n_kv);
        return false;
    }
    for (int64_t i = 0; i < g->n_kv; i++) {
        kg_gguf_str_t k = g->kv[i].key;
        size_t mask = g->kv_hash_cap - 1;
        size_t h = (size_t)kg_gguf_hash(k.data, k.len) & mask;
        while (g->kv_hash[h]) {
            kg_gguf_str_t o = g->kv[g->kv_hash[h] - 1].key;
            if (kg_gguf_str_eq(o, k.data, k.len)) {
                char kbuf[80];
                set_err(c->errstr, c->errstr_size, "gguf: duplicate key '%s' at offset %zu",
                        printable(k, kbuf, sizeof(kbuf)), key_offs[i]);
                return false;
            }
            h = (h + 1) & mask;
        }
        g->kv_hash[h] = (uint32_t)(i + 1);
    }
    return true;
}

static bool index_tensors(kg_gguf_t *g, cursor_t *c, const size_t *info_offs) {
    g->t_hash_cap = hash_cap_for(g->n_tensors);
    g->t_hash = calloc(g->t_hash_cap, sizeof(*g->t_hash));
    if (!g->t_hash) {
        set_err(c->errstr, c->errstr_size, "gguf: out of memory indexing %lld tensors",
                (long long)g->n_tensors);
        return false;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kg_gguf_str_t k = g->tensors[i].name;
        size_t mask = g->t_hash_cap - 1;
        size_t h = (size_t)kg_gguf_hash(k.data, k.len) & mask;
        while (g->t_hash[h]) {
            kg_gguf_str_t o = g->tensors[g->t_hash[h] - 1].name;
            if (kg_gguf_str_eq(o, k.data, k.len)) {
                char nbuf[80];
                // parse() wrote info_offs[0..n_tensors) before calling here, and
                // g->n_tensors == n_tensors; the analyzer loses that equality
                // across the parse_tensor(g, ...) calls.
                // NOLINTNEXTLINE(clang-analyzer-core.CallAndMessage)
                set_err(c->errstr, c->errstr_size, "gguf: duplicate tensor '%s' at offset %zu",
                        printable(k, nbuf, sizeof(nbuf)), info_offs[i]);
                return false;
            }
            h = (h + 1) & mask;
        }
        g->t_hash[h] = (uint32_t)(i + 1);
    }
    return true;
}

/** general.alignment: any integer type holding a power of two that fits u32. */
static bool read_alignment(kg_gguf_t *g, cursor_t *c) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t idx = kg_gguf_find_key(g, "general.alignment");
    if (idx < 0) {
        return true;
    }
    const kg_gguf_kv_t *e = &g->kv[idx];
    bool neg;
    uint64_t v;
    if (!kg_gguf_kv_int(g, e, &neg, &v)) {
        set_err(c->errstr, c->errstr_size,
                "gguf: general.alignment at offset %llu has type %s, expected an integer",
                (unsigned long long)e->val_off, type_name_kv(e->type));
        return false;
    }
    if (neg || v == 0 || v > (1u << 30) || (v & (v - 1)) != 0) {
        set_err(c->errstr, c->errstr_size,
                "gguf: general.alignment at offset %llu is %s%llu, not a power of two",
                (unsigned long long)e->val_off, neg ? "-" : "", (unsigned long long)v);
        return false;
    }
    g->alignment = (uint32_t)v;
    return true;
}

static kg_gguf_t *parse(kg_gguf_t *g, char *errstr, size_t errstr_size) {
    cursor_t cur = {g->base, g->size, 0, errstr, errstr_size};
    cursor_t *c = &cur;
    size_t *offs = NULL;

    if (!need(c, 4, "magic")) {
        goto fail;
    }
    if (memcmp(g->base, "GGUF", 4) != 0) {
        set_err(errstr, errstr_size, "gguf: bad magic at offset 0 (not a GGUF file)");
        goto fail;
    }
    c->pos = 4;
    if (!take_u32(c, &g->version, "version")) {
        goto fail;
    }
    if (g->version == 1) {
        set_err(errstr, errstr_size,
                "gguf: version 1 at offset 4 is not supported (only versions 2 and 3); "
                "convert the file with a current llama.cpp");
        goto fail;
    }
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0) {
            set_err(errstr, errstr_size,
                    "gguf: version 0x%08x at offset 4 looks big-endian; only little-endian GGUF "
                    "files are supported",
                    g->version);
        } else {
            set_err(errstr, errstr_size,
                    "gguf: version %u at offset 4 is not supported (only versions 2 and 3)",
                    g->version);
        }
        goto fail;
    }
    uint64_t n_tensors, n_kv;
    if (!take_u64(c, &n_tensors, "tensor count") || !take_u64(c, &n_kv, "key count")) {
        goto fail;
    }
    // a key takes at least 12 bytes (length, type), a tensor info at least 32
    if (n_kv > (c->size - c->pos) / 12) {
        set_err(errstr, errstr_size,
                "gguf: key count %llu at offset 16 cannot fit in a %zu-byte file",
                (unsigned long long)n_kv, c->size);
        goto fail;
    }
    if (n_tensors > (c->size - c->pos) / 32) {
        set_err(errstr, errstr_size,
                "gguf: tensor count %llu at offset 8 cannot fit in a %zu-byte file",
                (unsigned long long)n_tensors, c->size);
        goto fail;
    }
    if (n_kv >= UINT32_MAX || n_tensors >= UINT32_MAX) {
        set_err(errstr, errstr_size, "gguf: too many keys or tensors");
        goto fail;
    }

    g->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof(*g->kv));
    offs = malloc((size_t)(n_kv > n_tensors ? n_kv + 1 : n_tensors + 1) * sizeof(*offs));
    if (!g->kv || !offs) {
        set_err(errstr, errstr_size, "gguf: out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        offs[i] = c->pos;
        g->n_kv = (int64_t)i + 1; // so kg_gguf_free releases a partly indexed entry
        if (!parse_kv(c, &g->kv[i], (int64_t)i)) {
            goto fail;
        }
    }
    g->n_kv = (int64_t)n_kv;
    if (!index_keys(g, c, offs) || !read_alignment(g, c)) {
        goto fail;
    }

    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(*g->tensors));
    if (!g->tensors) {
        set_err(errstr, errstr_size, "gguf: out of memory");
        goto fail;
    }
    g->n_tensors = (int64_t)n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        offs[i] = c->pos;
        if (!parse_tensor(g, c, &g->tensors[i], (int64_t)i)) {
            goto fail;
        }
    }
    if (!index_tensors(g, c, offs)) {
        goto fail;
    }

    // the data section starts at the next multiple of the alignment
    uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
    g->data_off = (uint64_t)c->pos + pad;
    if (n_tensors > 0 && g->data_off > c->size) {
        need(c, pad, "padding before the data section");
        goto fail;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kg_gguf_tensor_t *t = &g->tensors[i];
        uint64_t avail = c->size - g->data_off;
        if (t->offset > avail || t->size > avail - t->offset) {
            char nbuf[80];
            set_err(errstr, errstr_size,
                    "gguf: truncated file: tensor '%s' data at offset %llu needs %zu bytes, file "
                    "has %zu",
                    printable(t->name, nbuf, sizeof(nbuf)),
                    (unsigned long long)g->data_off + t->offset, t->size, c->size);
            goto fail;
        }
        t->data = g->base + g->data_off + t->offset;
    }
    free(offs);
    return g;

fail:
    if (errstr && errstr_size > 0 && errstr[0] == '\0') {
        set_err(errstr, errstr_size, "gguf: invalid file");
    }
    free(offs);
    kg_gguf_free(g);
    return NULL;
}

kg_gguf_t *kg_gguf_open_memory(const void *data, size_t size, char *errstr, size_t errstr_size) {
    if (errstr && errstr_size > 0) {
        errstr[0] = '\0';
    }
    kg_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        set_err(errstr, errstr_size, "gguf: out of memory");
        return NULL;
    }
    g->base = data;
    g->size = size;
    return parse(g, errstr, errstr_size);
}

kg_gguf_t *kg_gguf_open(const char *path, char *errstr, size_t errstr_size) {
    if (errstr && errstr_size > 0) {
        errstr[0] = '\0';
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(errstr, errstr_size, "gguf: cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(errstr, errstr_size, "gguf: fstat('%s') failed: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(errstr, errstr_size, "gguf: '%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < 4) {
        set_err(errstr, errstr_size,
                "gguf: truncated file: magic at offset 0 needs 4 bytes, file has %lld",
                (long long)st.st_size);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); // the mapping keeps the file
    if (map == MAP_FAILED) {
        set_err(errstr, errstr_size, "gguf: mmap('%s') failed: %s", path, strerror(errno));
        return NULL;
    }
    kg_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        munmap(map, size);
        set_err(errstr, errstr_size, "gguf: out of memory");
        return NULL;
    }
    g->base = map;
    g->size = size;
    g->mapped = true;
    g = parse(g, errstr, errstr_size);
    if (!g) {
        return NULL;
    }
    return g;
}

void kg_gguf_free(kg_gguf_t *g) {
    if (!g) {
        return;
    }
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].strs);
    }
    free(g->kv);
    free(g->kv_hash);
    free(g->tensors);
    free(g->t_hash);
    if (g->mapped) {
        munmap((void *)g->base, g->size);
    }
    free(g);
}

uint32_t kg_gguf_version(const kg_gguf_t *g) {
    return g->version;
}

uint32_t kg_gguf_alignment(const kg_gguf_t *g) {
    return g->alignment;
}

void kg_gguf_release(const kg_gguf_t *g, const void *data, size_t size) {
    if (!g->mapped || size == 0) {
        return; /* borrowed memory: dropping its pages would zero it */
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)data + page - 1) & ~(page - 1); /* whole pages inside only */
    uintptr_t hi = ((uintptr_t)data + size) & ~(page - 1);
    if (hi > lo && (const uint8_t *)data >= g->base &&
        (const uint8_t *)data + size <= g->base + g->size) {
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}
