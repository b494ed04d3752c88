/* kg_lora: LoRA adapters in the GGUF form llama.cpp writes and reads
 * (convert_lora_to_gguf.py, llama-adapter.cpp), checked against the base
 * model they adapt.
 *
 * An adapter file has general.type = "adapter", adapter.type = "lora",
 * adapter.lora.alpha (F32) and general.architecture equal to the base's;
 * for each adapted weight W (ggml shape (n_in, n_out)) a pair of tensors
 * "<W's name>.lora_a" of shape (n_in, r) and "<W's name>.lora_b" of shape
 * (r, n_out). The adapted projection is y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with
 * s = scale·alpha/r (scale alone when alpha is 0), r being that pair's
 * rank (lora_b's ne[0]), as llama_adapter_lora_weight::get_scale does.
 *
 * kgen applies adapters to the projections of every layer (attention
 * q/k/v/output, the dense FFN's gate/up/down): a pair on any other tensor
 * (token embeddings, the head, experts) is refused by name, as is a pair
 * whose base tensor does not exist or has another shape. Pair types:
 * F32, F16, BF16, Q8_0. */
#pragma once

#include "../core/kg_status.h"
#include "kg_gguf.h"
#include "kg_model.h"

#include <stddef.h>
#include <stdint.h>

/* The projections an adapter can change, in the forward pass's order. */
typedef enum kg_lora_proj {
    KG_LORA_Q = 0,
    KG_LORA_K,
    KG_LORA_V,
    KG_LORA_O,
    KG_LORA_GATE,
    KG_LORA_UP,
    KG_LORA_DOWN,
    KG_LORA_N_PROJ,
} kg_lora_proj_t;

typedef struct kg_lora_pair {
    const kg_gguf_tensor_t *a; /* (n_in, r); NULL: this projection is not adapted */
    const kg_gguf_tensor_t *b; /* (r, n_out) */
    int32_t rank;
} kg_lora_pair_t;

typedef struct kg_lora {
    kg_gguf_t *gguf; /* owned: the pairs point into its mapping */
    float alpha;     /* adapter.lora.alpha; 0: scales are taken as given */
    int32_t n_layer;
    kg_lora_pair_t (*pairs)[KG_LORA_N_PROJ]; /* (n_layer) */
    int32_t n_pairs;                         /* pairs present */
    int32_t max_rank;
    size_t size; /* bytes of the pairs' data */
} kg_lora_t;

/** The GGUF tensor-name stem of a projection ("attn_q", ..., "ffn_down"). */
const char *kg_lora_proj_name(kg_lora_proj_t p);

/** Load the adapter at `path` for `base`. NULL with one line in errstr on
 * failure: not an adapter, another architecture, a tensor without its
 * partner, one kgen does not adapt, one whose base tensor is missing or
 * has another shape (each named), or an unsupported type. */
kg_lora_t *kg_lora_load(const char *path, const kg_model_t *base, char *errstr, size_t errstr_size);

/** kg_lora_load on an opened file (fuzzing, tests); takes `gguf` (freed on
 * failure too). `path` names it in messages. */
kg_lora_t *kg_lora_load_gguf(
    kg_gguf_t *gguf, const char *path, const kg_model_t *base, char *errstr, size_t errstr_size);

void kg_lora_free(kg_lora_t *lora);

/** The factor a pair's delta is multiplied by for a user scale (see the
 * header comment). */
float kg_lora_pair_scale(const kg_lora_t *lora, const kg_lora_pair_t *pair, float scale);
