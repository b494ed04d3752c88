/* kg_gguf: a checked reader for GGUF files (versions 2 and 3).
 *
 * DESIGN
 * The file is mmapped read-only and parsed once at open. Every offset, size,
 * count, string length, alignment and tensor extent is checked against the
 * file size before it is used, so a truncated or corrupt file gives one error
 * that names the problem (and its byte offset), never a crash. After a
 * successful open all accessors are infallible lookups into an index built
 * at open time; tensor data pointers point straight into the mapping.
 *
 * Spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_gguf kg_gguf_t;

/* Metadata value types (gguf_type in the spec). */
typedef enum kg_gguf_type {
    KG_GGUF_TYPE_UINT8 = 0,
    KG_GGUF_TYPE_INT8 = 1,
    KG_GGUF_TYPE_UINT16 = 2,
    KG_GGUF_TYPE_INT16 = 3,
    KG_GGUF_TYPE_UINT32 = 4,
    KG_GGUF_TYPE_INT32 = 5,
    KG_GGUF_TYPE_FLOAT32 = 6,
    KG_GGUF_TYPE_BOOL = 7,
    KG_GGUF_TYPE_STRING = 8,
    KG_GGUF_TYPE_ARRAY = 9,
    KG_GGUF_TYPE_UINT64 = 10,
    KG_GGUF_TYPE_INT64 = 11,
    KG_GGUF_TYPE_FLOAT64 = 12,
    KG_GGUF_TYPE_COUNT,
} kg_gguf_type_t;

/* Tensor element types (ggml_type). Only the ones kgen understands are
 * named; the reader rejects a tensor of any other type at open, naming it
 * (kg_type_name knows every ggml type id). */
typedef enum kg_ggml_type {
    KG_GGML_TYPE_F32 = 0,
    KG_GGML_TYPE_F16 = 1,
    KG_GGML_TYPE_Q4_0 = 2,
    KG_GGML_TYPE_Q4_1 = 3,
    KG_GGML_TYPE_Q5_0 = 6,
    KG_GGML_TYPE_Q5_1 = 7,
    KG_GGML_TYPE_Q8_0 = 8,
    KG_GGML_TYPE_Q2_K = 10,
    KG_GGML_TYPE_Q3_K = 11,
    KG_GGML_TYPE_Q4_K = 12,
    KG_GGML_TYPE_Q5_K = 13,
    KG_GGML_TYPE_Q6_K = 14,
    KG_GGML_TYPE_IQ4_NL = 20,
    KG_GGML_TYPE_IQ4_XS = 23,
    KG_GGML_TYPE_BF16 = 30,
    KG_GGML_TYPE_MXFP4 = 39, /* gpt-oss experts: see kg_mxfp4.h */
} kg_ggml_type_t;

/* A string inside the file: not NUL-terminated. */
typedef struct kg_gguf_str {
    const char *data;
    uint64_t len;
} kg_gguf_str_t;

#define KG_GGUF_MAX_DIMS 4

typedef struct kg_gguf_tensor {
    kg_gguf_str_t name;
    uint32_t n_dims;
    int64_t ne[KG_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    kg_ggml_type_t type;
    uint64_t offset;  /* from the start of the data section */
    const void *data; /* into the mapping; aligned to the file's alignment */
    size_t size;      /* bytes */
} kg_gguf_tensor_t;

/** Open and validate `path`. On failure returns NULL and writes one line
 * naming the problem into errstr. The caller owns the result (kg_gguf_free). */
kg_gguf_t *kg_gguf_open(const char *path, char *errstr, size_t errstr_size);

/** Parse a GGUF image already in memory (fuzzing, tests). `data` is
 * borrowed and must outlive the result. */
kg_gguf_t *kg_gguf_open_memory(const void *data, size_t size, char *errstr, size_t errstr_size);

/** Unmap and free. NULL does nothing. */
void kg_gguf_free(kg_gguf_t *g);

uint32_t kg_gguf_version(const kg_gguf_t *g);
uint32_t kg_gguf_alignment(const kg_gguf_t *g);

/* ---- metadata ---- */

int64_t kg_gguf_n_kv(const kg_gguf_t *g);
/** Index of `key`, or -1. */
int64_t kg_gguf_find_key(const kg_gguf_t *g, const char *key);
kg_gguf_str_t kg_gguf_key(const kg_gguf_t *g, int64_t idx);
kg_gguf_type_t kg_gguf_kv_type(const kg_gguf_t *g, int64_t idx);
/** The serialized value of entry `idx` exactly as stored after its type tag
 * (for an array: element type, count, elements). Borrowed from the mapping;
 * used to copy entries between files unchanged. */
const void *kg_gguf_kv_raw(const kg_gguf_t *g, int64_t idx, size_t *size);

/* Typed getters by key. They return false when the key is absent or its type
 * cannot be converted without loss (any integer type into an integer that
 * holds its value; F32/F64 into float). Outputs are untouched on false. */
bool kg_gguf_get_u32(const kg_gguf_t *g, const char *key, uint32_t *out);
bool kg_gguf_get_i64(const kg_gguf_t *g, const char *key, int64_t *out);
bool kg_gguf_get_f32(const kg_gguf_t *g, const char *key, float *out);
bool kg_gguf_get_bool(const kg_gguf_t *g, const char *key, bool *out);
/** The string borrows the mapping. */
bool kg_gguf_get_str(const kg_gguf_t *g, const char *key, kg_gguf_str_t *out);

/** Array metadata. On success *elem_type and *n are set. Returns false when
 * absent or not an array. */
bool kg_gguf_get_arr(const kg_gguf_t *g, const char *key, kg_gguf_type_t *elem_type, uint64_t *n);
/** Element i of a string array (borrowed). i must be < n. */
kg_gguf_str_t kg_gguf_arr_str(const kg_gguf_t *g, const char *key, uint64_t i);
/** Copy a numeric array into `dst` converting each element to float
 * (F32, integers) or int32 (integers); returns false on a type mismatch.
 * `n` must equal the array length. */
bool kg_gguf_arr_f32(const kg_gguf_t *g, const char *key, float *dst, uint64_t n);
bool kg_gguf_arr_i32(const kg_gguf_t *g, const char *key, int32_t *dst, uint64_t n);

/* ---- tensors ---- */

int64_t kg_gguf_n_tensors(const kg_gguf_t *g);
const kg_gguf_tensor_t *kg_gguf_tensor(const kg_gguf_t *g, int64_t idx);
/** By name, or NULL. */
const kg_gguf_tensor_t *kg_gguf_find_tensor(const kg_gguf_t *g, const char *name);

/** Tell the kernel the pages of a tensor's data are not needed for now: a
 * backend that copied the weights into its own layout calls this so the
 * file's pages do not stay resident as well. Reading the data later still
 * works (the pages come back from the file). Does nothing for an image
 * opened with kg_gguf_open_memory. */
void kg_gguf_release(const kg_gguf_t *g, const void *data, size_t size);

/** Bytes of one value of a fixed-size metadata type (1, 2, 4 or 8); 0 for
 * STRING, ARRAY and unknown types. Shared by the reader and the writer. */
size_t kg_gguf_type_size(uint32_t type);

/** Name of a tensor type ("f32", "q8_0", ...), or "unknown". */
const char *kg_ggml_type_name(kg_ggml_type_t type);
