/* kg_gguf_writer: builds a GGUF v3 file in memory and writes it out.
 *
 * Used by `kgen mkmodel` and by tests to make models of any shape. Metadata
 * and tensors are written in the order they are added (llama.cpp does not
 * care about order, but a deterministic file is easier to diff). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/kg_status.h"
#include "kg_gguf.h"

typedef struct kg_gguf_writer kg_gguf_writer_t;

kg_gguf_writer_t *kg_gguf_writer_new(void);
void kg_gguf_writer_free(kg_gguf_writer_t *w);

/* Metadata. Keys and strings are copied. */
void kg_gguf_writer_set_u32(kg_gguf_writer_t *w, const char *key, uint32_t v);
void kg_gguf_writer_set_i32(kg_gguf_writer_t *w, const char *key, int32_t v);
void kg_gguf_writer_set_f32(kg_gguf_writer_t *w, const char *key, float v);
void kg_gguf_writer_set_bool(kg_gguf_writer_t *w, const char *key, bool v);
void kg_gguf_writer_set_str(kg_gguf_writer_t *w, const char *key, const char *v);
void kg_gguf_writer_set_arr_str(kg_gguf_writer_t *w, const char *key, const kg_gguf_str_t *v,
                                uint64_t n);
void kg_gguf_writer_set_arr_f32(kg_gguf_writer_t *w, const char *key, const float *v, uint64_t n);
void kg_gguf_writer_set_arr_i32(kg_gguf_writer_t *w, const char *key, const int32_t *v,
                                uint64_t n);
/** Copy metadata entry `idx` of another file unchanged (any type, arrays too). */
void kg_gguf_writer_copy_kv(kg_gguf_writer_t *w, const kg_gguf_t *src, int64_t idx);

/** Add a tensor from F32 values, stored as `type` (F32, F16, BF16, Q8_0,
 * Q4_0). ne[0] is the row length. The data is converted and copied. */
kg_status_t kg_gguf_writer_add_tensor(kg_gguf_writer_t *w, const char *name, kg_ggml_type_t type,
                                      uint32_t n_dims, const int64_t *ne, const float *data);

/** Write the file (alignment 32). */
KG_NODISCARD kg_status_t kg_gguf_writer_write(const kg_gguf_writer_t *w, const char *path,
                                              char *errstr, size_t errstr_size);
