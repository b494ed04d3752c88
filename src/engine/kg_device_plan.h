/* kg_device_plan: what a model's weights take in a backend's memory,
 * computed from the GGUF tensor table alone (no device, no weights read),
 * for `kgen-worker --dry-run` and for sizing a fleet before buying it.
 *
 * The CUDA backend (gpu/kg_backend_cuda_weights.cu) keeps every matrix it
 * reads through its GEMMs, expert GEMMs or embedding gather as the file's
 * GGUF blocks when their type has a native kernel (gpu/qblocks.cuh), and
 * expands the rest: routers, deepseek2's per-head k_b/v_b and an encoder's
 * embeddings to BF16 when quantized; F16/BF16 stay 2 bytes a weight, F32
 * 4; 1-D tensors (norms, biases) become F32 (Gemma 4's per-layer output
 * scale stays on the host); a layer whose values are its keys (no attn_v)
 * holds K twice. kg_device_plan_tensor and kg_device_plan_tensors mirror
 * those rules; check_cuda's step_native_blocks holds it to the backend's
 * own count on the emulator, so the two cannot drift apart silently. */
#pragma once

#include "../model/kg_gguf.h"
#include "../model/kg_model.h"

#include <stdbool.h>
#include <stdint.h>

/** Whether the CUDA backend keeps a matrix of `type` with rows of n_in
 * weights as GGUF blocks (Q8_0, Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS,
 * MXFP4, rows of whole blocks): gpu/qblocks.cuh's kg_cuda_qlayout. */
bool kg_device_plan_native(kg_ggml_type_t type, int64_t n_in);

/* What of a model changes the rules (kg_device_plan_tensor's flags). */
#define KG_PLAN_NATIVE  1 /* blocks allowed: not KGEN_CUDA_NATIVE_QUANT=0, not cuBLAS */
#define KG_PLAN_ENCODER 2 /* a bert model: its embeddings are read element by element */

/** Device bytes of tensor t on the CUDA backend under `flags`; *kept says
 * whether it stays GGUF blocks (may be NULL). */
uint64_t kg_device_plan_tensor(const kg_gguf_tensor_t *t, int flags, bool *kept);

typedef struct kg_device_plan {
    uint64_t file_bytes;   /* the tensors' bytes in the file */
    uint64_t weight_bytes; /* on the CUDA backend's device */
    uint64_t kept_bytes;   /* of which GGUF blocks as in the file */
    int64_t n_params;      /* weights (elements) */
} kg_device_plan_t;

/** The plan of n tensors (a model's, or a made-up table for a shape). */
void kg_device_plan_tensors(const kg_gguf_tensor_t *const *t,
                            int64_t n,
                            int flags,
                            kg_device_plan_t *out);

/** The plan of a loaded model's tensors (native: KG_PLAN_NATIVE; the
 * model's own flags added). Exact for the attention families; an estimate
 * where the backend uploads a tensor twice or not at all (LongRoPE's two
 * factor sets, of which it keeps one; Gemma 4's per-layer tables). False
 * when out of memory. */
bool kg_device_plan_model(const kg_model_t *m, bool native, kg_device_plan_t *out);
