/* kg_backend_cuda: the CUDA backend's C entry points (the rest of the
 * backend is reached through the kg_backend vtable). Compiles as C11 and as
 * CUDA C++. Built only when CMake finds nvcc (KGEN_CUDA); src/ sees it
 * behind KG_USE_CUDA. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the extern "C": the model's functions are C (kg_model_kv_window...) */
#include "../src/backend/kg_backend.h"

// ---- what the driver says (cuda_errors.cu) ----

typedef enum kg_cuda_probe_kind {
    KG_CUDA_PROBE_OK = 0,    /* at least one device CUDA can use */
    KG_CUDA_PROBE_NO_DEVICE, /* no NVIDIA driver, or the driver sees no GPU */
    KG_CUDA_PROBE_UNUSABLE,  /* a driver and a GPU are there, but CUDA cannot use them */
} kg_cuda_probe_kind_t;

typedef struct kg_cuda_probe {
    kg_cuda_probe_kind_t kind;
    int n_devices;
    int error;           /* cudaError_t of cudaGetDeviceCount (0: cudaSuccess) */
    int driver_version;  /* cudaDriverGetVersion: 12040 is CUDA 12.4; 0: no driver */
    int runtime_version; /* the CUDA runtime kgen was built with (CUDART_VERSION) */
    char message[320];   /* one line: the CUDA error by name and what to do */
} kg_cuda_probe_t;

/** Ask the driver: device count, driver and runtime versions, classified
 * with kg_cuda_probe_classify. Leaves no CUDA error pending. @thread any */
void kg_cuda_probe(kg_cuda_probe_t *p);

/** kind and message from p->error, n_devices, driver_version and
 * runtime_version: OK with devices and no error; NO_DEVICE when no driver
 * is installed (driver version 0) or the driver reports no device;
 * UNUSABLE for anything else (cudaErrorInsufficientDriver with a driver
 * present: the driver is older than the runtime). @thread any */
void kg_cuda_probe_classify(kg_cuda_probe_t *p);

const char *kg_cuda_probe_kind_str(kg_cuda_probe_kind_t kind);

/** Whether a cudaError_t poisons the context (every later call fails): a
 * device-wide fault. @thread any */
bool kg_cuda_error_is_sticky(int err);

/** kg_cuda_probe says OK. @thread any */
bool kg_backend_cuda_available(void);

/** The cuBLAS libraries tried, in order, for a CUDA runtime of
 * runtime_version (13000 = 13.0): env_path alone when set
 * ($KGEN_CUBLAS_PATH), else libcublas.so.<major> and then libcublas.so
 * (accepted only if its version matches). Writes up to `max` names and
 * returns how many. @thread any */
int kg_cuda_cublas_candidates(int runtime_version, const char *env_path, char names[][64], int max);

/** Load one libcublas and check that its major version is the runtime's
 * (cuBLAS 12 with a CUDA 13 runtime is refused). *version gets e.g.
 * "13.0.3". false with one line in errstr. @thread any */
bool kg_cuda_cublas_probe(const char *path,
                          int runtime_version,
                          char *version,
                          size_t version_size,
                          char *errstr,
                          size_t errstr_size);

// ---- the backend ----

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
