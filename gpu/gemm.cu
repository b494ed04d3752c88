/* gemm: cuBLAS bound at run time, and the skinny GEMV kernel. */
#include "gemm.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

// ---- cuBLAS through dlopen ----

static kg_cublas_api_t g_cublas;
static bool g_cublas_ok;
static char g_cublas_err[512];
static pthread_once_t g_cublas_once = PTHREAD_ONCE_INIT;

static void *sym(void *lib, const char *name, bool *ok) {
    void *p = dlsym(lib, name);
    if (!p) {
        *ok = false;
        snprintf(g_cublas_err, sizeof(g_cublas_err), "%s has no symbol %s", g_cublas.lib_name,
                 name);
    }
    return p;
}

static void cublas_load_once(void) {
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    char tried[256] = "";
    const char *env = getenv("KGEN_CUBLAS_PATH");
    if (env && env[0]) {
        g_cublas.lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        g_cublas.lib_name = env;
        if (!g_cublas.lib) {
            snprintf(g_cublas_err, sizeof(g_cublas_err),
                     "cannot load cuBLAS from KGEN_CUBLAS_PATH=%s: %s", env, dlerror());
            return;
        }
    }
    for (size_t i = 0; !g_cublas.lib && i < sizeof(names) / sizeof(names[0]); i++) {
        g_cublas.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        g_cublas.lib_name = names[i];
        size_t len = strlen(tried);
        snprintf(tried + len, sizeof(tried) - len, "%s%s", len ? ", " : "", names[i]);
    }
    if (!g_cublas.lib) {
        snprintf(g_cublas_err, sizeof(g_cublas_err),
                 "cuBLAS not found (tried %s; set KGEN_CUBLAS_PATH or LD_LIBRARY_PATH): %s", tried,
                 dlerror());
        return;
    }
    bool ok = true;
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer */
    g_cublas.create = (kg_pfn_cublasCreate_v2)sym(g_cublas.lib, "cublasCreate_v2", &ok);
    g_cublas.destroy = (kg_pfn_cublasDestroy_v2)sym(g_cublas.lib, "cublasDestroy_v2", &ok);
    g_cublas.set_stream = (kg_pfn_cublasSetStream_v2)sym(g_cublas.lib, "cublasSetStream_v2", &ok);
    g_cublas.set_workspace =
        (kg_pfn_cublasSetWorkspace_v2)sym(g_cublas.lib, "cublasSetWorkspace_v2", &ok);
    g_cublas.set_math_mode = (kg_pfn_cublasSetMathMode)sym(g_cublas.lib, "cublasSetMathMode", &ok);
    g_cublas.gemm_ex = (kg_pfn_cublasGemmEx)sym(g_cublas.lib, "cublasGemmEx", &ok);
    g_cublas.status_string =
        (kg_pfn_cublasGetStatusString)dlsym(g_cublas.lib, "cublasGetStatusString");
    g_cublas_ok = ok;
}

bool kg_cublas_load(const kg_cublas_api_t **api, char *errstr, size_t errstr_size) {
    pthread_once(&g_cublas_once, cublas_load_once);
    if (!g_cublas_ok) {
        snprintf(errstr, errstr_size, "%s", g_cublas_err);
        return false;
    }
    *api = &g_cublas;
    return true;
}

const char *kg_cublas_status_str(kg_cublas_status_t st) {
    if (g_cublas_ok && g_cublas.status_string) {
        return g_cublas.status_string(st);
    }
    switch (st) {
    case KG_CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case KG_CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case KG_CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case KG_CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case KG_CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case KG_CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case KG_CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case KG_CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case KG_CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case KG_CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "unknown cuBLAS status";
}

kg_status_t kg_cuda_blas_init(kg_cuda_blas_t *blas,
                              cudaStream_t stream,
                              void *workspace,
                              size_t workspace_size,
                              char *errstr,
                              size_t errstr_size) {
    memset(blas, 0, sizeof(*blas));
    if (!kg_cublas_load(&blas->api, errstr, errstr_size)) {
        return KG_ERR_BACKEND;
    }
    kg_cublas_status_t st = blas->api->create(&blas->handle);
    if (st != KG_CUBLAS_STATUS_SUCCESS) {
        snprintf(errstr, errstr_size, "cublasCreate failed (%s): %s", blas->api->lib_name,
                 kg_cublas_status_str(st));
        blas->handle = NULL;
        return KG_ERR_BACKEND;
    }
    KG_CUBLAS_CHECK(blas->api->set_stream(blas->handle, stream));
    KG_CUBLAS_CHECK(blas->api->set_workspace(blas->handle, workspace, workspace_size));
    KG_CUBLAS_CHECK(blas->api->set_math_mode(blas->handle, KG_CUBLAS_DEFAULT_MATH));
    const char *gemv = getenv("KGEN_CUDA_GEMV");
    blas->gemv = !(gemv && strcmp(gemv, "0") == 0);
    return KG_OK;
}

void kg_cuda_blas_clear(kg_cuda_blas_t *blas) {
    if (blas->api && blas->handle) {
        blas->api->destroy(blas->handle);
    }
    blas->handle = NULL;
}

// ---- skinny GEMV ----

/* Eight 16-bit values (one 16-byte load) as floats. */
__device__ __forceinline__ void unpack8(uint4 v, int dt, float *f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (dt == KG_CUDA_F16) {
            const float2 p = __half22float2(*(const __half2 *)&w[i]);
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        } else {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
}

/* One warp per output row: the warp streams the weight row in 16-byte
 * pieces (512 contiguous bytes per step) and dots it with every input row
 * (which stay in L1/L2, shared by all warps). n_in % 8 == 0. */
__global__ void __launch_bounds__(256) gemv_kernel(const uint16_t *__restrict__ w,
                                                   const uint16_t *__restrict__ x,
                                                   float *__restrict__ y,
                                                   int32_t n_out,
                                                   int32_t n_in,
                                                   int32_t rows,
                                                   int dt) {
    const int lane = threadIdx.x & 31;
    const int32_t o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= n_out) {
        return; /* whole warps leave together */
    }
    float acc[KG_CUDA_GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < KG_CUDA_GEMV_MAX_ROWS; r++) {
        acc[r] = 0.0f;
    }
    const uint4 *wr = (const uint4 *)(w + (int64_t)o * n_in);
    const int32_t n_vec = n_in / 8;
    /* unrolled so each lane keeps several 16-byte weight loads in flight */
#pragma unroll 4
    for (int32_t v = lane; v < n_vec; v += 32) {
        float wf[8], xf[8];
        unpack8(__ldg(wr + v), dt, wf);
#pragma unroll
        for (int r = 0; r < KG_CUDA_GEMV_MAX_ROWS; r++) {
            if (r < rows) {
                unpack8(__ldg((const uint4 *)(x + (int64_t)r * n_in) + v), dt, xf);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[r] += wf[i] * xf[i];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < KG_CUDA_GEMV_MAX_ROWS; r++) {
        if (r < rows) {
            const float s = kg_warp_sum(acc[r]);
            if (lane == 0) {
                y[(int64_t)r * n_out + o] = s;
            }
        }
    }
}

static cudaDataType_t cuda_type(kg_cuda_dtype_t dt) {
    return dt == KG_CUDA_F32 ? CUDA_R_32F : dt == KG_CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

kg_status_t kg_cuda_gemm(const kg_cuda_blas_t *blas,
                         cudaStream_t stream,
                         const kg_cuda_mat_t *w,
                         const void *x,
                         float *y,
                         int32_t rows) {
    if (rows <= 0) {
        return KG_OK;
    }
    if (blas->gemv && rows <= KG_CUDA_GEMV_MAX_ROWS && w->dt != KG_CUDA_F32 && w->n_in % 8 == 0) {
        const int warps = 8;
        const unsigned blocks = (unsigned)((w->n_out + warps - 1) / warps);
        gemv_kernel<<<blocks, warps * 32, 0, stream>>>(
            (const uint16_t *)w->data, (const uint16_t *)x, y, w->n_out, w->n_in, rows, (int)w->dt);
        KG_CUDA_CHECK_LAUNCH();
        return KG_OK;
    }
    /* Row-major Y = X·W^T is column-major Y^T = W·X^T: W (n_in x n_out col-major)
     * transposed, X^T (n_in x rows col-major) as is. */
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = cuda_type(w->dt);
    KG_CUBLAS_CHECK(blas->api->gemm_ex(blas->handle, KG_CUBLAS_OP_T, KG_CUBLAS_OP_N, w->n_out, rows,
                                       w->n_in, &one, w->data, t, w->n_in, x, t, w->n_in, &zero, y,
                                       CUDA_R_32F, w->n_out, KG_CUBLAS_COMPUTE_32F,
                                       KG_CUBLAS_GEMM_DEFAULT));
    return KG_OK;
}
