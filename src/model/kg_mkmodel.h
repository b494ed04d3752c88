/* kg_mkmodel: write a deterministic random-weight Llama GGUF of any shape
 * (what `kgen mkmodel` does; see kg_mkmodel.c for the weight scales). */
#pragma once

#include "../core/kg_status.h"
#include "kg_gguf.h"
#include "kg_quant_mix.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_mkmodel_opts {
    const char *out;        /* the file to write */
    const char *name;       /* general.name */
    const char *vocab_from; /* copy tokenizer.* from this GGUF; NULL: built-in byte vocabulary */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, ctx;
    float rope_base;
    bool tied;
    bool have_seed;
    uint64_t seed;
    kg_ggml_type_t type; /* of every 2-D weight, when ftype is KG_FTYPE_ALL_F32 */
    kg_ftype_t ftype;    /* else: llama-quantize's file type, each tensor typed by its mix */
    bool pure;           /* with ftype: every 2-D weight in the base type (--pure) */
    int32_t n_words;     /* built-in vocabulary only: made-up word tokens after the bytes */
} kg_mkmodel_opts_t;

/** name "kgen-random", ctx 2048, rope base 10000, F32; the caller sets the
 * shape, head_dim (n_embd / n_head when 0 is not allowed: set it) and seed. */
kg_mkmodel_opts_t kg_mkmodel_opts_default(void);

/** Write the model. *n_vocab_out (may be NULL) gets the vocabulary size. */
KG_NODISCARD kg_status_t kg_mkmodel_write(const kg_mkmodel_opts_t *o,
                                          int64_t *n_vocab_out,
                                          char *errstr,
                                          size_t errstr_size);
