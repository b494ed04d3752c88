/* kg_gguf_writer: builds a GGUF v3 file in memory and writes it out.
 *
 * Used by `kgen mkmodel` and by tests to make models of any shape. Metadata
 * and tensors are written in the order they are added (llama.cpp does not
 * care about order, but a deterministic file is easier to diff). */
#pragma once

#include "../core/kg_status.h"
#include "kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_gguf_writer kg_gguf_writer_t;

kg_gguf_writer_t *kg_gguf_writer_new(void);
void kg_gguf_writer_free(kg_gguf_writer_t *w);

/* Metadata. Keys and strings are copied. Setting a key again replaces its
 * value in place (the entry keeps its position). A failed allocation is
 * remembered and reported by kg_gguf_writer_write. */
void kg_gguf_writer_set_u8(kg_gguf_writer_t *w, const char *key, uint8_t v);
void kg_gguf_writer_set_i8(kg_gguf_writer_t *w, const char *key, int8_t v);
void kg_gguf_writer_set_u16(kg_gguf_writer_t *w, const char *key, uint16_t v);
void kg_gguf_writer_set_i16(kg_gguf_writer_t *w, const char *key, int16_t v);
void kg_gguf_writer_set_u64(kg_gguf_writer_t *w, const char *key, uint64_t v);
void kg_gguf_writer_set_i64(kg_gguf_writer_t *w, const char *key, int64_t v);
void kg_gguf_writer_set_f64(kg_gguf_writer_t *w, const char *key, double v);
void kg_gguf_writer_set_u32(kg_gguf_writer_t *w, const char *key, uint32_t v);
void kg_gguf_writer_set_i32(kg_gguf_writer_t *w, const char *key, int32_t v);
void kg_gguf_writer_set_f32(kg_gguf_writer_t *w, const char *key, float v);
void kg_gguf_writer_set_bool(kg_gguf_writer_t *w, const char *key, bool v);
void kg_gguf_writer_set_str(kg_gguf_writer_t *w, const char *key, const char *v);
void kg_gguf_writer_set_arr_str(kg_gguf_writer_t *w,
                                const char *key,
                                const kg_gguf_str_t *v,
                                uint64_t n);
void kg_gguf_writer_set_arr_f32(kg_gguf_writer_t *w, const char *key, const float *v, uint64_t n);
void kg_gguf_writer_set_arr_i32(kg_gguf_writer_t *w, const char *key, const int32_t *v, uint64_t n);
/** An array of any fixed-size element type (not STRING or ARRAY): `n`
 * elements of that type's size, little-endian, at `v`. */
void kg_gguf_writer_set_arr(
    kg_gguf_writer_t *w, const char *key, kg_gguf_type_t elem_type, const void *v, uint64_t n);
/** Copy metadata entry `idx` of another file unchanged (any type, arrays too). */
void kg_gguf_writer_copy_kv(kg_gguf_writer_t *w, const kg_gguf_t *src, int64_t idx);

/** Add a tensor from F32 values, stored as `type` (F32, F16, BF16, Q8_0,
 * Q4_0). ne[0] is the row length and a multiple of the type's block size;
 * names are unique and shorter than 64 bytes (llama.cpp's limit). The data
 * is converted and copied. KG_ERR_INVALID for a bad name, shape or type. */
kg_status_t kg_gguf_writer_add_tensor(kg_gguf_writer_t *w,
                                      const char *name,
                                      kg_ggml_type_t type,
                                      uint32_t n_dims,
                                      const int64_t *ne,
                                      const float *data);

/** Add a tensor whose bytes are already in `type`'s block format (any type
 * the reader knows, Q4_K and Q6_K included): `size` must be the tensor's
 * exact byte size. The bytes are copied. */
kg_status_t kg_gguf_writer_add_tensor_raw(kg_gguf_writer_t *w,
                                          const char *name,
                                          kg_ggml_type_t type,
                                          uint32_t n_dims,
                                          const int64_t *ne,
                                          const void *data,
                                          size_t size);

/** Serialize into a malloc'ed buffer (the caller frees) of *size bytes:
 * exactly the bytes kg_gguf_writer_write puts in a file. */
KG_NODISCARD kg_status_t kg_gguf_writer_to_memory(const kg_gguf_writer_t *w,
                                                  uint8_t **out,
                                                  size_t *size);

/** Write the file: GGUF v3, the metadata in the order it was set (plus
 * general.alignment = 32 at the end unless the caller set it to another u32
 * power of two up to 256), the tensor infos, then each tensor's data padded
 * to the alignment. Same calls, same bytes. A failed write removes the file. */
KG_NODISCARD kg_status_t kg_gguf_writer_write(const kg_gguf_writer_t *w,
                                              const char *path,
                                              char *errstr,
                                              size_t errstr_size);
