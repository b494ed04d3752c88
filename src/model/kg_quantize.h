/* kg_quantize: the quantizers of every block format kgen writes (what
 * `kgen mkmodel --type` and the GGUF writer use), following ggml's
 * deterministic reference quantizers, so a file written here holds the
 * blocks llama-quantize would write for the same floats. */
#pragma once

#include "kg_gguf.h"

#include <stdbool.h>
#include <stdint.h>

/** Quantize `n` floats into `type` at `dst` (kg_type_row_size(type, n)
 * bytes). `n` must be a multiple of the type's block size. Returns false
 * for a type it cannot produce or a bad `n`. @thread any */
bool kg_quantize(kg_ggml_type_t type, const float *src, void *dst, int64_t n);
