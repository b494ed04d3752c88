/* cuemu: a small CUDA emulator that runs gpu/ on the CPU, for machines with
 * no GPU (scripts/gpu-emulate). It checks the logic of the kernels (indexing,
 * block and warp synchronisation, the algorithms) and of the backend glue,
 * not timing or the GPU's memory model.
 *
 * Every CUDA thread of a block is a fiber (ucontext) on one OS thread;
 * __syncthreads and the warp shuffles are barriers (a barrier some threads
 * never reach aborts with "deadlock"); blocks run one after another, so
 * __shared__ is `static`; device memory is host memory (cudaMalloc fills it
 * with 0xA5 garbage, as real device memory is not zeroed); launches run at
 * once, or are recorded while a stream is being captured and replayed by
 * cudaGraphLaunch. cuemu.cpp also exports the cuBLAS entry points that
 * gpu/cublas_shim.h loads (a host GEMM), so KGEN_CUBLAS_PATH can point at
 * libcuemu.so. Test tooling: C++20 with the standard library, unlike gpu/.
 *
 * What a real GPU would refuse, cuemu refuses too (it aborts with the
 * reason): more than 1024 threads or more threads than the kernel's
 * __launch_bounds__, grid y/z above 65535, more than 48 KiB of static
 * __shared__ memory in one kernel (cu2cpp.py tags every __shared__
 * variable), a synchronous call or a stream sync while capturing (that
 * invalidates the capture, as CUDA does). WMMA (nvcuda::wmma, 16x16x16
 * half/bf16 -> float) is emulated with warp-collective barriers, so a
 * fragment operation some lanes of a warp skip deadlocks as it would hang
 * on a GPU. Tests can make any runtime call fail (cuemu_fail below), and
 * the driver and runtime versions come from CUEMU_DRIVER_VERSION (default
 * 13000; 0 = no driver installed) and CUDART_VERSION. */
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n)   __attribute__((aligned(n)))
#define CUDART_VERSION 13000

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {
    }
};
struct uint3 {
    unsigned x, y, z;
};
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* the values of the toolkit's driver_types.h */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorCallRequiresNewerDriver = 36,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalState = 401,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorECCUncorrectable = 214,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorSystemDriverMismatch = 803,
    cudaErrorCompatNotSupportedOnDevice = 804,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999
} cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice
};
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal,
    cudaStreamCaptureModeThreadLocal,
    cudaStreamCaptureModeRelaxed
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
typedef enum cudaDataType_t { CUDA_R_16F = 2, CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) {
    return cudaMalloc((void **)p, n);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
template <class T> cudaError_t cudaMallocHost(T **p, size_t n) {
    return cudaMallocHost((void **)p, n);
}
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t
cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode m);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);

/* cu2cpp.py turns name<<<grid, block, smem, stream>>>(args) into this; bounds
 * is the kernel's __launch_bounds__ (0: none) */
void emu_launch(
    dim3 grid, dim3 block, size_t smem, const char *name, int bounds, std::function<void()> fn);
/* cu2cpp.py adds one after every __shared__ variable: the launch adds up
 * the distinct ones it meets */
void emu_smem(const void *p, size_t size);
void __syncwarp(unsigned mask = 0xffffffffu);
void __syncthreads(void);
void emu_warp_sync(void);
extern uint64_t emu_xbuf[32][32];
extern long emu_launches;

// ---- warp shuffles ----
template <class T> inline T emu_shfl_from(T v, int src) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    emu_xbuf[w][lane] = b;
    emu_warp_sync();
    T r = v;
    if (src >= 0 && src < 32) {
        memcpy(&r, &emu_xbuf[w][src], sizeof(T));
    }
    emu_warp_sync();
    return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_shfl_from(v, (int)(threadIdx.x & 31) ^ o);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) {
    return emu_shfl_from(v, src & 31);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int d) {
    int lane = threadIdx.x & 31;
    return emu_shfl_from(v, lane + d < 32 ? lane + d : lane);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, int d) {
    int lane = threadIdx.x & 31;
    return emu_shfl_from(v, lane - d >= 0 ? lane - d : lane);
}

// ---- atomics (one OS thread: plain operations) ----
inline int atomicAdd(int *p, int v) {
    int o = *p;
    *p += v;
    return o;
}
inline double atomicAdd(double *p, double v) {
    double o = *p;
    *p += v;
    return o;
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long o = *p;
    *p += v;
    return o;
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    unsigned o = *p;
    *p += v;
    return o;
}
inline int atomicMin(int *p, int v) {
    int o = *p;
    *p = v < o ? v : o;
    return o;
}
inline int atomicMax(int *p, int v) {
    int o = *p;
    *p = v > o ? v : o;
    return o;
}

// ---- bits and halves ----
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
template <class T> inline T __ldg(const T *p) {
    return *p;
}
extern "C" { /* the project's half conversions, checked against their declarations */
#include "../../../../src/model/kg_quant.h"
}
struct __half {
    uint16_t x;
};
struct __half2 {
    __half a, b;
};
struct __nv_bfloat16 {
    uint16_t x;
};
struct float2 {
    float x, y;
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
inline float __half2float(__half h) {
    return kg_fp16_to_fp32(h.x);
}
inline __half __float2half_rn(float f) {
    __half h;
    h.x = kg_fp32_to_fp16(f);
    return h;
}
inline __half __ushort_as_half(uint16_t u) {
    __half h;
    h.x = u;
    return h;
}
inline uint16_t __half_as_ushort(__half h) {
    return h.x;
}
inline float2 __half22float2(__half2 h) {
    float2 f;
    f.x = __half2float(h.a);
    f.y = __half2float(h.b);
    return f;
}
inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t u) {
    __nv_bfloat16 b;
    b.x = u;
    return b;
}
inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 b) {
    return b.x;
}
inline float __bfloat162float(__nv_bfloat16 b) {
    return kg_bf16_to_fp32(b.x);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 b;
    b.x = kg_fp32_to_bf16(f);
    return b;
}

inline int min(int a, int b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}

// ---- cp.async (cuda_pipeline.h): copies happen at once ----
inline void __pipeline_memcpy_async(void *dst, const void *src, size_t size, size_t zfill = 0) {
    memcpy(dst, src, size - zfill);
    memset((char *)dst + (size - zfill), 0, zfill);
}
inline void __pipeline_commit(void) {
}
inline void __pipeline_wait_prior(size_t) {
}

// ---- failing calls, for tests ----
extern "C" {
/** The nth call from now (1 = the next) of `api` fails with `err`: a runtime
 * function by name ("cudaStreamEndCapture", "cudaGraphInstantiate", ...),
 * "launch" (any kernel: cudaGetLastError reports it and the kernel does not
 * run) or "launch:<kernel name>". A sticky error (an illegal address, a
 * launch failure, ...) then fails every later call, as a real context
 * would. */
void cuemu_fail(const char *api, int nth, int err);
/** Forget pending failures and a sticky error (a fresh context). */
void cuemu_reset(void);
/** Run blocks and resume threads in an order shuffled by `seed` (0: in
 * order): a result that depends on scheduling changes with the seed. */
void cuemu_schedule(unsigned long long seed);
/** Kernel launches so far, and graph launches. */
long cuemu_launches(void);
long cuemu_graph_launches(void);
}

// ---- WMMA (mma.h) ----
/* Fragments of 16x16 tiles, 8 elements per lane: lane l holds elements
 * 8l..8l+7 of the tile in row-major order (a GPU's layout is unspecified,
 * and code that stays portable never depends on it: it may read x[i] of an
 * accumulator only through a map it loaded, as gpu/attention.cu does).
 * load/store/mma are warp-collective: every lane of the warp must call. */
void emu_wmma_exchange(const float *mine, int n_per_lane, float *all);
/* WMMA's rules (CUDA C++ Programming Guide, "Warp Matrix Functions"): the
 * pointer 256-bit aligned, ldm a multiple of 16 bytes */
void emu_wmma_check(const void *p, unsigned ldm, size_t elem_size, const char *what);
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static const int num_elements = 8;
    T x[8];
};
inline float emu_to_f(float v) {
    return v;
}
inline float emu_to_f(__half v) {
    return __half2float(v);
}
inline float emu_to_f(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <class T> inline T emu_from_f(float v);
template <> inline float emu_from_f<float>(float v) {
    return v;
}
template <> inline __half emu_from_f<__half>(float v) {
    return __float2half_rn(v);
}
template <> inline __nv_bfloat16 emu_from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
/* element (r, c) of a tile at p with leading dimension ldm */
template <class P> inline P *emu_at(P *p, unsigned ldm, int r, int c, bool row_major_mem) {
    return row_major_mem ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r;
}
template <class Use, class T, class L, class P>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const P *p, unsigned ldm) {
    /* matrix_a (M x K) and matrix_b (K x N): Layout says how memory holds it */
    const bool rm = std::is_same<L, row_major>::value;
    const int lane = threadIdx.x & 31;
    emu_wmma_check(p, ldm, sizeof(P), "load_matrix_sync");
    for (int i = 0; i < 8; i++) {
        const int e = lane * 8 + i;
        f.x[i] = *emu_at(p, ldm, e / 16, e % 16, rm);
    }
    emu_warp_sync();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f,
                             const float *p,
                             unsigned ldm,
                             layout_t layout) {
    const int lane = threadIdx.x & 31;
    emu_wmma_check(p, ldm, sizeof(float), "load_matrix_sync");
    for (int i = 0; i < 8; i++) {
        const int e = lane * 8 + i;
        f.x[i] = *emu_at(p, ldm, e / 16, e % 16, layout == mem_row_major);
    }
    emu_warp_sync();
}
inline void store_matrix_sync(float *p,
                              const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm,
                              layout_t layout) {
    const int lane = threadIdx.x & 31;
    emu_wmma_check(p, ldm, sizeof(float), "store_matrix_sync");
    emu_warp_sync();
    for (int i = 0; i < 8; i++) {
        const int e = lane * 8 + i;
        *emu_at(p, ldm, e / 16, e % 16, layout == mem_row_major) = f.x[i];
    }
    emu_warp_sync();
}
template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v) {
    for (int i = 0; i < 8; i++) {
        f.x[i] = emu_from_f<T>(v);
    }
}
/* d = a * b + c, each element summed over k in order in float */
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    float mine[24], all[24 * 32];
    for (int i = 0; i < 8; i++) {
        mine[i] = emu_to_f(a.x[i]);
        mine[8 + i] = emu_to_f(b.x[i]);
        mine[16 + i] = c.x[i];
    }
    emu_wmma_exchange(mine, 24, all);
    /* element e of a tile sits at lane e / 8, slot e % 8 */
    auto A = [&](int r, int k) { return all[(r * 16 + k) / 8 * 24 + (r * 16 + k) % 8]; };
    auto B = [&](int k, int n) { return all[(k * 16 + n) / 8 * 24 + 8 + (k * 16 + n) % 8]; };
    auto C = [&](int r, int n) { return all[(r * 16 + n) / 8 * 24 + 16 + (r * 16 + n) % 8]; };
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < 8; i++) {
        const int e = lane * 8 + i, r = e / 16, n = e % 16;
        float acc = C(r, n);
        for (int k = 0; k < 16; k++) {
            acc += A(r, k) * B(k, n);
        }
        d.x[i] = acc;
    }
}
} // namespace wmma
} // namespace nvcuda
