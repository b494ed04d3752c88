/* kg_backend_cuda: the CUDA backend's C entry points (the rest of the
 * backend is reached through the kg_backend vtable). Compiles as C11 and as
 * CUDA C++. Built only when CMake finds nvcc (KGEN_CUDA); src/ sees it
 * behind KG_USE_CUDA. */
#pragma once

#include "../src/backend/kg_backend.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Whether the CUDA runtime sees at least one device (a driver is loaded
 * and CUDA_VISIBLE_DEVICES leaves one). Says nothing about cuBLAS, which
 * kg_backend_cuda_new loads. @thread any */
bool kg_backend_cuda_available(void);

/** Create the CUDA backend on device 0 (pick another with
 * CUDA_VISIBLE_DEVICES): loads cuBLAS, uploads the weights (BF16; F16 and
 * F32 stay as they are), allocates the F16 KV pool of params->n_kv_blocks
 * blocks of params->kv_block_size tokens and every activation buffer for
 * params->max_batch_tokens tokens. `model` must outlive the backend. NULL
 * with one line in errstr on failure (no device, no libcublas, out of
 * device memory, an unsupported shape). The calling thread and the thread
 * that later runs steps may differ. @thread engine */
kg_backend_t *kg_backend_cuda_new(const kg_model_t *model,
                                  const kg_backend_params_t *params,
                                  char *errstr,
                                  size_t errstr_size);

/** Whether `be` is a CUDA backend. @thread any */
bool kg_backend_is_cuda(const kg_backend_t *be);

#ifdef __cplusplus
}
#endif
