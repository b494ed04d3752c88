/* cublas_shim: the few cuBLAS declarations kgen uses, bound at run time.
 *
 * Why a shim and dlopen: the CUDA toolkit kgen is built with does not always
 * carry cuBLAS (the CI and development image has nvcc, cudart and the CCCL
 * headers, but no cublas_v2.h and no libcublas), while the machines that run
 * the worker do (the worker image ships libcublas, and GPU hosts have it
 * through the driver bundle or the nvidia-cublas wheel). Declaring the
 * handful of types and entry points here and resolving them with
 * dlopen/dlsym at backend start keeps `KGEN_CUDA=ON` building anywhere nvcc
 * exists; a host without libcublas gets one clear startup error instead of a
 * link failure.
 *
 * Every value below is cuBLAS's public ABI, stable since cuBLAS 11 and
 * unchanged in 12 and 13. Source: NVIDIA's cublas_api.h (cuBLAS 13.x, as
 * vendored in public repositories, e.g. wesleyrparsons/WesChat12
 * cublas_api.h) and the cuBLAS documentation
 * (docs.nvidia.com/cuda/cublas: "cublasStatus_t", "cublasOperation_t",
 * "cublasComputeType_t", "cublasGemmAlgo_t", "cublasMath_t",
 * "cublasGemmEx()"). The exported symbol names carry the `_v2` suffix where
 * cublas_api.h declares them with it (cublasCreate_v2, cublasDestroy_v2,
 * cublasSetStream_v2, cublasSetWorkspace_v2); cublasGemmEx,
 * cublasSetMathMode, cublasGetProperty and cublasGetStatusString have none.
 *
 * cudaDataType_t (CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14) comes
 * from the toolkit's own library_types.h, which is installed everywhere. */
#pragma once

#include <cuda_runtime_api.h>
#include <library_types.h>
#include <stddef.h>

/* cublas_api.h: typedef enum { ... } cublasStatus_t; */
typedef enum kg_cublas_status {
    KG_CUBLAS_STATUS_SUCCESS = 0,
    KG_CUBLAS_STATUS_NOT_INITIALIZED = 1,
    KG_CUBLAS_STATUS_ALLOC_FAILED = 3,
    KG_CUBLAS_STATUS_INVALID_VALUE = 7,
    KG_CUBLAS_STATUS_ARCH_MISMATCH = 8,
    KG_CUBLAS_STATUS_MAPPING_ERROR = 11,
    KG_CUBLAS_STATUS_EXECUTION_FAILED = 13,
    KG_CUBLAS_STATUS_INTERNAL_ERROR = 14,
    KG_CUBLAS_STATUS_NOT_SUPPORTED = 15,
    KG_CUBLAS_STATUS_LICENSE_ERROR = 16,
} kg_cublas_status_t;

/* cublas_api.h: cublasOperation_t (CUBLAS_OP_N = 0, CUBLAS_OP_T = 1) */
typedef enum kg_cublas_op {
    KG_CUBLAS_OP_N = 0,
    KG_CUBLAS_OP_T = 1,
} kg_cublas_op_t;

/* cublas_api.h: cublasMath_t (CUBLAS_DEFAULT_MATH = 0). The default keeps
 * FP32 GEMMs in true FP32 (no TF32), which the F32 parity path relies on. */
typedef enum kg_cublas_math {
    KG_CUBLAS_DEFAULT_MATH = 0,
} kg_cublas_math_t;

/* cublas_api.h: cublasComputeType_t (CUBLAS_COMPUTE_32F = 68) */
typedef enum kg_cublas_compute {
    KG_CUBLAS_COMPUTE_32F = 68,
} kg_cublas_compute_t;

/* cublas_api.h: cublasGemmAlgo_t (CUBLAS_GEMM_DEFAULT = -1) */
typedef enum kg_cublas_algo {
    KG_CUBLAS_GEMM_DEFAULT = -1,
} kg_cublas_algo_t;

/* cublas_api.h: struct cublasContext; typedef struct cublasContext *cublasHandle_t; */
typedef struct cublasContext *kg_cublas_handle_t;

/* The C ABI passes these enums as int: the function pointer types use the
 * enums above, whose values and underlying type match cuBLAS's. */
typedef kg_cublas_status_t (*kg_pfn_cublasCreate_v2)(kg_cublas_handle_t *handle);
typedef kg_cublas_status_t (*kg_pfn_cublasDestroy_v2)(kg_cublas_handle_t handle);
typedef kg_cublas_status_t (*kg_pfn_cublasSetStream_v2)(kg_cublas_handle_t handle,
                                                        cudaStream_t stream);
typedef kg_cublas_status_t (*kg_pfn_cublasSetWorkspace_v2)(kg_cublas_handle_t handle,
                                                           void *workspace,
                                                           size_t size);
typedef kg_cublas_status_t (*kg_pfn_cublasSetMathMode)(kg_cublas_handle_t handle,
                                                       kg_cublas_math_t mode);
typedef const char *(*kg_pfn_cublasGetStatusString)(kg_cublas_status_t status);
/* cublasGetProperty(libraryPropertyType type, int *value): MAJOR_VERSION = 0,
 * MINOR_VERSION = 1, PATCH_LEVEL = 2 (library_types.h) */
typedef kg_cublas_status_t (*kg_pfn_cublasGetProperty)(int type, int *value);
/* cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
 *              beta, C, Ctype, ldc, computeType, algo) */
typedef kg_cublas_status_t (*kg_pfn_cublasGemmEx)(kg_cublas_handle_t handle,
                                                  kg_cublas_op_t transa,
                                                  kg_cublas_op_t transb,
                                                  int m,
                                                  int n,
                                                  int k,
                                                  const void *alpha,
                                                  const void *A,
                                                  cudaDataType_t Atype,
                                                  int lda,
                                                  const void *B,
                                                  cudaDataType_t Btype,
                                                  int ldb,
                                                  const void *beta,
                                                  void *C,
                                                  cudaDataType_t Ctype,
                                                  int ldc,
                                                  kg_cublas_compute_t computeType,
                                                  kg_cublas_algo_t algo);

/* The resolved entry points. */
typedef struct kg_cublas_api {
    void *lib; /* dlopen handle */
    char lib_name[64];
    int major, minor, patch; /* cublasGetProperty */
    kg_pfn_cublasCreate_v2 create;
    kg_pfn_cublasDestroy_v2 destroy;
    kg_pfn_cublasSetStream_v2 set_stream;
    kg_pfn_cublasSetWorkspace_v2 set_workspace;
    kg_pfn_cublasSetMathMode set_math_mode;
    kg_pfn_cublasGetStatusString status_string; /* may be NULL (cuBLAS < 11.4.2) */
    kg_pfn_cublasGemmEx gemm_ex;
    kg_pfn_cublasGetProperty get_property;
} kg_cublas_api_t;

/** Load the libcublas of the CUDA runtime kgen was built with
 * (cublas.cu): $KGEN_CUBLAS_PATH when set, else libcublas.so.<major>, then
 * libcublas.so, through the dynamic loader's search path; a library of
 * another major version is refused. The library stays loaded for the life of the process (cuBLAS
 * keeps global state, and unloading it under live handles is not supported). Returns false with one
 * line in errstr naming what was tried. Thread-safe; loads once. @thread any */
bool kg_cublas_load(const kg_cublas_api_t **api, char *errstr, size_t errstr_size);

/** Name of a cuBLAS status (cublasGetStatusString when available). */
const char *kg_cublas_status_str(kg_cublas_status_t st);
