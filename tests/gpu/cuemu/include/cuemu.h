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
 * libcuemu.so. Test tooling: C++20 with the standard library, unlike gpu/. */
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

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

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorNoDevice = 100
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

void emu_launch(dim3 grid, dim3 block, std::function<void()> fn);
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
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
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
