/* cublas: libcublas bound at run time (see cublas_shim.h for why).
 *
 * The library must belong to the CUDA runtime kgen was built with: cuBLAS
 * 12 next to a CUDA 13 runtime is not a supported pair (each major is
 * built for its own runtime ABI). So the loader asks for
 * libcublas.so.<runtime major> first, accepts a plain libcublas.so only if
 * cublasGetProperty says it is that major, and refuses a mismatch with a
 * message naming both; $KGEN_CUBLAS_PATH overrides the search but not the
 * check. The backend logs which library it took and its version. */
#include "cuda_common.cuh"
#include "kg_backend_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

static kg_cublas_api_t g_cublas;
static bool g_cublas_ok;
static char g_cublas_err[512];
static pthread_once_t g_cublas_once = PTHREAD_ONCE_INIT;

/* libraryPropertyType (library_types.h) */
enum { PROP_MAJOR = 0, PROP_MINOR = 1, PROP_PATCH = 2 };

extern "C" int
kg_cuda_cublas_candidates(int runtime_version, const char *env_path, char names[][64], int max) {
    int n = 0;
    if (env_path && env_path[0]) {
        if (max > 0) {
            snprintf(names[n++], 64, "%s", env_path);
        }
        return n;
    }
    if (n < max) {
        snprintf(names[n++], 64, "libcublas.so.%d", runtime_version / 1000);
    }
    if (n < max) {
        snprintf(names[n++], 64, "libcublas.so");
    }
    return n;
}

static void *sym(void *lib, const char *name, bool *ok, char *errstr, size_t errstr_size) {
    void *p = dlsym(lib, name);
    if (!p && *ok) {
        *ok = false;
        snprintf(errstr, errstr_size, "has no symbol %s", name);
    }
    return p;
}

/* Open `path`, resolve the entry points into *api and check the major
 * version. On failure the library is closed and errstr says why. */
static bool open_one(
    const char *path, int runtime_version, kg_cublas_api_t *api, char *errstr, size_t errstr_size) {
    char why[256] = "";
    memset(api, 0, sizeof(*api));
    api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *e = dlerror();
        snprintf(errstr, errstr_size, "%s: %s", path, e ? e : "cannot be loaded");
        return false;
    }
    snprintf(api->lib_name, sizeof(api->lib_name), "%s", path);
    bool ok = true;
    void *lib = api->lib;
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer */
    api->create = (kg_pfn_cublasCreate_v2)sym(lib, "cublasCreate_v2", &ok, why, sizeof(why));
    api->destroy = (kg_pfn_cublasDestroy_v2)sym(lib, "cublasDestroy_v2", &ok, why, sizeof(why));
    api->set_stream =
        (kg_pfn_cublasSetStream_v2)sym(lib, "cublasSetStream_v2", &ok, why, sizeof(why));
    api->set_workspace =
        (kg_pfn_cublasSetWorkspace_v2)sym(lib, "cublasSetWorkspace_v2", &ok, why, sizeof(why));
    api->set_math_mode =
        (kg_pfn_cublasSetMathMode)sym(lib, "cublasSetMathMode", &ok, why, sizeof(why));
    api->gemm_ex = (kg_pfn_cublasGemmEx)sym(lib, "cublasGemmEx", &ok, why, sizeof(why));
    api->get_property =
        (kg_pfn_cublasGetProperty)sym(lib, "cublasGetProperty", &ok, why, sizeof(why));
    api->status_string = (kg_pfn_cublasGetStatusString)dlsym(lib, "cublasGetStatusString");
    if (ok && (api->get_property(PROP_MAJOR, &api->major) != KG_CUBLAS_STATUS_SUCCESS ||
               api->get_property(PROP_MINOR, &api->minor) != KG_CUBLAS_STATUS_SUCCESS ||
               api->get_property(PROP_PATCH, &api->patch) != KG_CUBLAS_STATUS_SUCCESS)) {
        ok = false;
        snprintf(why, sizeof(why), "cublasGetProperty failed");
    }
    if (ok && api->major != runtime_version / 1000) {
        ok = false;
        snprintf(why, sizeof(why),
                 "is cuBLAS %d.%d.%d, but kgen was built with the CUDA %d.%d runtime: install "
                 "libcublas %d (the CUDA %d toolkit's)",
                 api->major, api->minor, api->patch, runtime_version / 1000,
                 (runtime_version % 1000) / 10, runtime_version / 1000, runtime_version / 1000);
    }
    if (!ok) {
        snprintf(errstr, errstr_size, "%s %s", path, why);
        dlclose(api->lib);
        memset(api, 0, sizeof(*api));
        return false;
    }
    return true;
}

extern "C" bool kg_cuda_cublas_probe(const char *path,
                                     int runtime_version,
                                     char *version,
                                     size_t version_size,
                                     char *errstr,
                                     size_t errstr_size) {
    kg_cublas_api_t api;
    if (!open_one(path, runtime_version, &api, errstr, errstr_size)) {
        return false;
    }
    snprintf(version, version_size, "%d.%d.%d", api.major, api.minor, api.patch);
    dlclose(api.lib);
    return true;
}

static void cublas_load_once(void) {
    char names[4][64];
    const int n = kg_cuda_cublas_candidates(CUDART_VERSION, getenv("KGEN_CUBLAS_PATH"), names, 4);
    char tried[400] = "";
    for (int i = 0; i < n && !g_cublas_ok; i++) {
        char why[320];
        g_cublas_ok = open_one(names[i], CUDART_VERSION, &g_cublas, why, sizeof(why));
        if (!g_cublas_ok) {
            const size_t len = strlen(tried);
            snprintf(tried + len, sizeof(tried) - len, "%s%s", len ? "; " : "", why);
        }
    }
    if (!g_cublas_ok) {
        snprintf(g_cublas_err, sizeof(g_cublas_err),
                 "cuBLAS for CUDA %d not found (%s); set KGEN_CUBLAS_PATH or LD_LIBRARY_PATH",
                 CUDART_VERSION / 1000, tried);
    }
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
