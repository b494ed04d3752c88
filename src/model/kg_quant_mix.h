/* kg_quant_mix: llama.cpp's file types (llama_ftype) and the type each
 * tensor gets in them, as llama-quantize chooses it (llama-quant.cpp
 * llama_tensor_get_type): a Q4_K_M file keeps most weights in Q4_K but
 * gives attn_v and ffn_down of some layers Q6_K and the output Q6_K, with
 * fallbacks where a row is not a multiple of 256. `kgen mkmodel --type`
 * writes files with exactly the types llama-quantize would choose. */
#pragma once

#include "kg_gguf.h"

#include <stdbool.h>
#include <stdint.h>

/* llama_ftype values (written as general.file_type). */
typedef enum kg_ftype {
    KG_FTYPE_ALL_F32 = 0,
    KG_FTYPE_MOSTLY_F16 = 1,
    KG_FTYPE_MOSTLY_Q4_0 = 2,
    KG_FTYPE_MOSTLY_Q4_1 = 3,
    KG_FTYPE_MOSTLY_Q8_0 = 7,
    KG_FTYPE_MOSTLY_Q5_0 = 8,
    KG_FTYPE_MOSTLY_Q5_1 = 9,
    KG_FTYPE_MOSTLY_Q2_K = 10,
    KG_FTYPE_MOSTLY_Q3_K_S = 11,
    KG_FTYPE_MOSTLY_Q3_K_M = 12,
    KG_FTYPE_MOSTLY_Q3_K_L = 13,
    KG_FTYPE_MOSTLY_Q4_K_S = 14,
    KG_FTYPE_MOSTLY_Q4_K_M = 15,
    KG_FTYPE_MOSTLY_Q5_K_S = 16,
    KG_FTYPE_MOSTLY_Q5_K_M = 17,
    KG_FTYPE_MOSTLY_Q6_K = 18,
    KG_FTYPE_MOSTLY_IQ4_NL = 25,
    KG_FTYPE_MOSTLY_IQ4_XS = 30,
    KG_FTYPE_MOSTLY_BF16 = 32,
    KG_FTYPE_MOSTLY_MXFP4_MOE = 38, /* experts MXFP4, the other matrices Q8_0 */
} kg_ftype_t;

/** The file type named `name` as llama-quantize spells it, any case:
 * "q4_k_m", "Q8_0", "iq4_xs", "f16", and its aliases "q3_k", "q4_k", "q5_k"
 * (the _M mixes). False for anything else. */
bool kg_ftype_from_name(const char *name, kg_ftype_t *out);
/** The canonical lower-case name ("q4_k_m"). */
const char *kg_ftype_name(kg_ftype_t ftype);
/** Every accepted name, for help and error messages. */
const char *kg_ftype_list(void);
/** The type most weights get (llama-quantize's default_type). */
kg_ggml_type_t kg_ftype_base_type(kg_ftype_t ftype);

/** What the policy needs to know about the model. */
typedef struct kg_quant_mix_model {
    const char *arch; /* general.architecture */
    int32_t n_layer;
    int32_t n_head, n_head_kv; /* of layer 0: n_gqa = n_head / n_head_kv */
    bool has_output;           /* output.weight exists (not tied to token_embd) */
    int32_t n_expert;          /* expert_count; 0 for a dense model */
} kg_quant_mix_model_t;

/** The type of tensor `name` (n_dims dimensions, rows of ne0 elements)
 * written from F32 data as file type `ftype`: `src_type` (no change) for
 * what llama-quantize leaves alone (1-D tensors, norms), else the mix's
 * choice, or the base type everywhere when `pure` (llama-quantize --pure).
 * Returns F16 where no block type fits ne0, as llama-quantize does. Layer
 * counters are the layer number in the name ("blk.N."): llama-quantize
 * visits tensors sorted by layer, so for models with one attn_v and one
 * ffn_down per layer its counters equal that number. */
kg_ggml_type_t kg_quant_mix_type(kg_ftype_t ftype,
                                 bool pure,
                                 const kg_quant_mix_model_t *m,
                                 const char *name,
                                 int n_dims,
                                 int64_t ne0,
                                 kg_ggml_type_t src_type);
