/* kg_mklora: random LoRA adapters for a base model (`kgen mkmodel --lora`),
 * for tests and benchmarks: the file llama.cpp's convert_lora_to_gguf.py
 * writes (see kg_lora.h), with random A and B so that the adapter changes
 * what the model generates (a trained adapter starts with B = 0, which
 * would change nothing). */
#pragma once

#include "../core/kg_status.h"
#include "kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_mklora_opts {
    const char *base; /* the base model's GGUF */
    const char *out;  /* the adapter to write */
    int64_t rank;     /* r of every pair */
    float alpha;      /* adapter.lora.alpha */
    uint64_t seed;
    bool have_seed;
    kg_ggml_type_t type; /* of every pair: f32, f16, bf16 or q8_0 */
    uint32_t targets;    /* bit p: projection kg_lora_proj_t p is adapted */
} kg_mklora_opts_t;

/** Read `kgen mkmodel --lora`'s flags (argv[0] skipped; --lora itself is
 * accepted and ignored). 0: complete, 1: --help, 2: a usage error in
 * errstr. @thread any */
int kg_mklora_parse_args(
    int argc, char **argv, kg_mklora_opts_t *o, char *errstr, size_t errstr_size);

/** The usage text of `kgen mkmodel --lora`. */
const char *kg_mklora_usage(void);

/** Write the adapter. Each tensor draws from its own stream seeded from
 * (seed, tensor name): A uniform with variance 1/n_in, B uniform with
 * variance 1/(4 r), so at scale alpha/r = 1 the delta is about half the
 * base projection's size. *n_pairs_out (may be NULL) gets the pairs
 * written. */
KG_NODISCARD kg_status_t kg_mklora_write(const kg_mklora_opts_t *o,
                                         int32_t *n_pairs_out,
                                         char *errstr,
                                         size_t errstr_size);
