/* kg_gguf_int: the reader's index, shared by kg_gguf.c (which checks the
 * file and builds the index at open) and kg_gguf_lookup.c (which answers
 * from it afterwards), and by no one else. */
#pragma once

#include "kg_gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct kg_gguf_kv {
    kg_gguf_str_t key;
    kg_gguf_type_t type;
    uint64_t val_off;  /* file offset of the value (after the type tag) */
    uint64_t val_size; /* bytes of the value */
    /* arrays only */
    kg_gguf_type_t arr_type;
    uint64_t arr_n;
    uint64_t arr_off;    /* file offset of the first element */
    kg_gguf_str_t *strs; /* (arr_n) when arr_type is STRING, else NULL */
} kg_gguf_kv_t;

struct kg_gguf {
    const uint8_t *base; /* the whole file */
    size_t size;
    bool mapped; /* base is our mmap (kg_gguf_open) rather than borrowed */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off; /* file offset of the data section */

    int64_t n_kv;
    kg_gguf_kv_t *kv;  /* (n_kv) */
    uint32_t *kv_hash; /* open addressing, index + 1, 0 = empty; (hash_cap) */
    size_t kv_hash_cap;

    int64_t n_tensors;
    kg_gguf_tensor_t *tensors; /* (n_tensors) */
    uint32_t *t_hash;          /* like kv_hash */
    size_t t_hash_cap;
};

// ---- little-endian loads (the host is little-endian: kg_gguf.c checks) ----

static inline uint32_t kg_gguf_rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline uint64_t kg_gguf_rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

// ---- hashing (keys and tensor names) ----

static inline uint64_t kg_gguf_hash(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static inline bool kg_gguf_str_eq(kg_gguf_str_t a, const char *b, uint64_t blen) {
    return a.len == blen && memcmp(a.data, b, (size_t)blen) == 0;
}

/** Integer value of a scalar metadata entry, as signed or unsigned 64-bit.
 * Returns false when the entry is not an integer. */
bool kg_gguf_kv_int(const kg_gguf_t *g, const kg_gguf_kv_t *e, bool *neg, uint64_t *mag);
