/* cuemu: the runtime half (fibers, launches, graphs, memory, fake cuBLAS).
 * See include/cuemu.h. */
#include "cuemu.h"

#include <csetjmp>
#include <cstdio>
#include <string>
#include <ucontext.h>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
uint64_t emu_xbuf[32][32];
long emu_launches;

// ---- fibers ----
/* A fiber starts through makecontext/swapcontext; after that switches use
 * _setjmp/_longjmp, which do not save the signal mask (swapcontext makes a
 * system call each time: most of cuemu's run time). Under ASan the
 * swapcontext path stays, which ASan knows how to follow. A fiber waiting
 * at a barrier is not resumed until that barrier opens. */
#if defined(__SANITIZE_ADDRESS__)
#define FAST_SWITCH 0
#else
#define FAST_SWITCH 1
#endif
struct ebar {
    int count, arrived;
    long gen;
};
struct fiber {
    ucontext_t ctx;
    jmp_buf jb;
    char *stack;
    bool done;
    bool started;
    bool parked;          /* FAST_SWITCH: its body waits at the park for the next block */
    const ebar *wait_bar; /* the barrier it waits at, or null */
    long wait_gen;        /* ... until its generation moves past this */
    unsigned tid;
};
static const size_t STACK = 256 << 10;
static std::vector<fiber> fibers;
static ucontext_t sched;
static jmp_buf sched_jb;
static fiber *cur;
static const std::function<void()> *cur_fn;
static ebar block_bar, warp_bar[32];

static void yield_to_sched() {
#if FAST_SWITCH
    if (_setjmp(cur->jb) == 0) {
        _longjmp(sched_jb, 1);
    }
#else
    swapcontext(&cur->ctx, &sched);
#endif
}

/* Run fiber f until it yields or ends. */
static void resume(fiber &f) {
    cur = &f;
#if FAST_SWITCH
    if (_setjmp(sched_jb) == 0) {
        if (!f.started) {
            f.started = true;
            setcontext(&f.ctx);
        }
        _longjmp(f.jb, 1);
    }
#else
    f.started = true;
    swapcontext(&sched, &f.ctx);
#endif
}

static void bar_wait(ebar *b) {
    long g = b->gen;
    if (++b->arrived == b->count) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    cur->wait_bar = b;
    cur->wait_gen = g;
    while (b->gen == g) {
        yield_to_sched();
    }
    cur->wait_bar = nullptr;
}

void __syncthreads(void) {
    bar_wait(&block_bar);
}
void emu_warp_sync(void) {
    bar_wait(&warp_bar[threadIdx.x >> 5]);
}
void __syncwarp(unsigned) {
    emu_warp_sync();
}

void emu_wmma_check(const void *p, unsigned ldm, size_t elem_size, const char *what) {
    if ((uintptr_t)p % 32 != 0 || (ldm * elem_size) % 16 != 0) {
        fprintf(stderr,
                "cuemu: wmma::%s at %p with ldm %u (%zu-byte elements): the pointer must be "
                "32-byte aligned and ldm a multiple of 16 bytes\n",
                what, p, ldm, elem_size);
        abort();
    }
}

static float wmma_buf[32][32 * 24];
void emu_wmma_exchange(const float *mine, int n, float *all) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    emu_warp_sync();
    memcpy(&wmma_buf[w][lane * n], mine, (size_t)n * sizeof(float));
    emu_warp_sync();
    memcpy(all, wmma_buf[w], (size_t)n * 32 * sizeof(float));
    emu_warp_sync();
}

/* A fiber's body. With FAST_SWITCH it never ends: after a block's thread it
 * parks, and the next block resumes it at the park with the next thread, so
 * a fiber is made (getcontext, makecontext, setcontext: two system calls)
 * once per fiber, not once per thread of every block (the emulator's system
 * time was a quarter of its run). */
static void entry() {
#if FAST_SWITCH
    for (;;) {
        (*cur_fn)();
        cur->done = true;
        cur->parked = true;
        if (_setjmp(cur->jb) == 0) {
            _longjmp(sched_jb, 1);
        }
    }
#else
    (*cur_fn)();
    cur->done = true;
    swapcontext(&cur->ctx, &sched);
#endif
}

/* cuemu_schedule: run blocks, and resume a block's threads, in a shuffled
 * order (0: in order), so a test can show a result does not depend on the
 * order a GPU happens to schedule them in. */
static uint64_t sched_seed;
extern "C" void cuemu_schedule(unsigned long long seed) {
    sched_seed = seed;
}
static uint64_t sched_next(void) {
    sched_seed ^= sched_seed << 13;
    sched_seed ^= sched_seed >> 7;
    sched_seed ^= sched_seed << 17;
    return sched_seed;
}
static void shuffle(std::vector<unsigned> &v) {
    for (size_t i = v.size(); i > 1; i--) {
        std::swap(v[i - 1], v[sched_next() % i]);
    }
}

static void run_block(unsigned n, const std::function<void()> &fn) {
    if (fibers.size() < n) {
        size_t old = fibers.size();
        fibers.resize(n);
        for (size_t i = old; i < n; i++) {
            fibers[i].stack = (char *)malloc(STACK);
        }
    }
    cur_fn = &fn;
    block_bar = {(int)n, 0, 0};
    for (unsigned w = 0; w < 32; w++) {
        int c = (int)n - (int)w * 32;
        warp_bar[w] = {c > 32 ? 32 : (c < 0 ? 0 : c), 0, 0};
    }
    for (unsigned i = 0; i < n; i++) {
        fiber &f = fibers[i];
        f.done = false;
        f.wait_bar = nullptr;
        f.tid = i;
        if (f.parked) {
            continue; /* resumed at its park (FAST_SWITCH), its context made once */
        }
        f.started = false;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &sched;
        makecontext(&f.ctx, entry, 0);
    }
    unsigned left = n;
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; i++)
        order[i] = i;
    while (left > 0) {
        bool progress = false;
        long gens = block_bar.gen;
        for (unsigned w = 0; w < 32; w++)
            gens += warp_bar[w].gen * 7;
        if (sched_seed)
            shuffle(order);
        for (unsigned k = 0; k < n; k++) {
            fiber &f = fibers[order[k]];
            if (f.done || (f.wait_bar && f.wait_bar->gen == f.wait_gen))
                continue;
            threadIdx = {f.tid % blockDim.x, (f.tid / blockDim.x) % blockDim.y,
                         f.tid / (blockDim.x * blockDim.y)};
            resume(f);
            if (f.done) {
                left--;
                progress = true;
            }
        }
        long gens2 = block_bar.gen;
        for (unsigned w = 0; w < 32; w++)
            gens2 += warp_bar[w].gen * 7;
        if (!progress && gens2 == gens && left > 0) {
            fprintf(stderr,
                    "cuemu: deadlock: %u threads wait at a barrier others never reach "
                    "(block %u,%u,%u)\n",
                    left, blockIdx.x, blockIdx.y, blockIdx.z);
            abort();
        }
    }
}

// ---- failing calls ----
struct fault {
    std::string api;
    int countdown;
    cudaError_t err;
};
static std::vector<fault> faults;
static cudaError_t sticky_err = cudaSuccess; /* a poisoned context fails everything */
static cudaError_t launch_err = cudaSuccess; /* what cudaGetLastError reports next */

static bool is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return true;
    default:
        return false;
    }
}

/* Whether this call of `api` is to fail, and with what. */
static cudaError_t fault_check(const char *api) {
    if (sticky_err != cudaSuccess) {
        return sticky_err;
    }
    for (size_t i = 0; i < faults.size(); i++) {
        if (faults[i].api == api && --faults[i].countdown == 0) {
            cudaError_t e = faults[i].err;
            faults.erase(faults.begin() + (long)i);
            if (is_sticky(e)) {
                sticky_err = e;
            }
            return e;
        }
    }
    return cudaSuccess;
}

extern "C" void cuemu_fail(const char *api, int nth, int err) {
    faults.push_back({api, nth < 1 ? 1 : nth, (cudaError_t)err});
}
extern "C" void cuemu_reset(void) {
    faults.clear();
    sticky_err = cudaSuccess;
    launch_err = cudaSuccess;
}

// ---- launches ----
static bool capturing, capture_broken;
static std::vector<std::function<void()>> *capture_list;
/* the distinct __shared__ variables the current launch met (emu_smem) */
static std::vector<const void *> smem_seen;
static size_t smem_total;
static const size_t STATIC_SMEM_LIMIT = 48 << 10; /* static __shared__ per block */

void emu_smem(const void *p, size_t size) {
    for (const void *q : smem_seen) {
        if (q == p) {
            return;
        }
    }
    smem_seen.push_back(p);
    smem_total += size;
}

static void die(const char *name, const char *what, long a, long b) {
    fprintf(stderr, "cuemu: launch of %s: %s (%ld, limit %ld): a GPU refuses this launch\n", name,
            what, a, b);
    abort();
}

static void run_grid(dim3 grid, dim3 block, const char *name, const std::function<void()> &fn) {
    gridDim = grid;
    blockDim = block;
    unsigned n = block.x * block.y * block.z;
    if (n == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "cuemu: launch of %s: empty launch %ux%ux%u x %u\n", name, grid.x, grid.y,
                grid.z, n);
        abort();
    }
    smem_seen.clear();
    smem_total = 0;
    const unsigned n_blocks = grid.x * grid.y * grid.z;
    std::vector<unsigned> order(n_blocks);
    for (unsigned i = 0; i < n_blocks; i++)
        order[i] = i;
    if (sched_seed)
        shuffle(order);
    for (unsigned b : order) {
        blockIdx = {b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
        run_block(n, fn);
        if (smem_total > STATIC_SMEM_LIMIT) {
            die(name, "static __shared__ bytes", (long)smem_total, (long)STATIC_SMEM_LIMIT);
        }
    }
}

void emu_launch(
    dim3 grid, dim3 block, size_t smem, const char *name, int bounds, std::function<void()> fn) {
    emu_launches++;
    const long n = (long)block.x * block.y * block.z;
    if (n > 1024) {
        die(name, "threads per block", n, 1024);
    }
    if (bounds > 0 && n > bounds) {
        die(name, "threads per block above its __launch_bounds__", n, bounds);
    }
    if (grid.y > 65535 || grid.z > 65535 || block.z > 64) {
        die(name, "grid y or z above 65535 (or block z above 64)",
            (long)(grid.y > grid.z ? grid.y : grid.z), 65535);
    }
    if (smem > STATIC_SMEM_LIMIT) {
        die(name, "dynamic shared memory without the opt-in", (long)smem, (long)STATIC_SMEM_LIMIT);
    }
    std::string launch = std::string("launch:") + name;
    cudaError_t e = fault_check("launch");
    if (e == cudaSuccess) {
        e = fault_check(launch.c_str());
    }
    if (e != cudaSuccess) {
        launch_err = e;
        return;
    }
    std::string kname = name;
    if (capturing) {
        capture_list->push_back([=]() { run_grid(grid, block, kname.c_str(), fn); });
        return;
    }
    run_grid(grid, block, name, fn);
}

long cuemu_launches(void) {
    return emu_launches;
}

// ---- runtime ----
#define FAULT(api)                                                                                 \
    do {                                                                                           \
        cudaError_t fault_ = fault_check(api);                                                     \
        if (fault_ != cudaSuccess) {                                                               \
            return fault_;                                                                         \
        }                                                                                          \
    } while (0)

/* a call CUDA forbids while a stream captures: it invalidates the capture */
static cudaError_t capture_forbidden(void) {
    if (capturing) {
        capture_broken = true;
        return cudaErrorStreamCaptureImplicit;
    }
    return cudaSuccess;
}

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : def;
}

cudaError_t cudaDriverGetVersion(int *v) {
    *v = env_int("CUEMU_DRIVER_VERSION", 13000); /* 0: no driver installed */
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 0;
    int drv = env_int("CUEMU_DRIVER_VERSION", 13000);
    if (drv == 0 || drv < CUDART_VERSION) {
        return cudaErrorInsufficientDriver; /* what cudart says with no driver or an old one */
    }
    FAULT("cudaGetDeviceCount");
    if (getenv("CUEMU_NO_DEVICE")) {
        return cudaErrorNoDevice;
    }
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int) {
    FAULT("cudaSetDevice");
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    FAULT("cudaGetDeviceProperties");
    memset(p, 0, sizeof(*p));
    strcpy(p->name, "cuemu");
    p->major = 9;
    p->multiProcessorCount = 8;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
    FAULT("cudaDeviceGetAttribute");
    *v = 8;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    FAULT("cudaStreamCreateWithFlags");
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    if (capturing) {
        capture_broken = true;
        return cudaErrorStreamCaptureUnsupported;
    }
    FAULT("cudaStreamSynchronize");
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    FAULT("cudaMalloc");
    // 256-byte aligned and full of garbage, like real device memory
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (*p)
        memset(*p, 0xA5, n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    FAULT("cudaMallocHost");
    *p = malloc(n);
    if (*p)
        memset(*p, 0xA5, n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    if (cudaError_t e = capture_forbidden()) {
        return e;
    }
    FAULT("cudaMemcpy");
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
    if (capturing) {
        /* an async copy would become a graph node; kgen keeps copies outside graphs */
        fprintf(stderr,
                "cuemu: cudaMemcpyAsync during capture (kgen keeps copies out of graphs)\n");
        abort();
    }
    FAULT("cudaMemcpyAsync");
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (cudaError_t e = capture_forbidden()) {
        return e;
    }
    FAULT("cudaMemset");
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    FAULT("cudaEventCreateWithFlags");
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
    FAULT("cudaEventRecord");
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    FAULT("cudaEventSynchronize");
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    if (sticky_err != cudaSuccess) {
        return sticky_err; /* sticky: never cleared */
    }
    cudaError_t e = launch_err;
    launch_err = cudaSuccess;
    return e;
}

static const struct {
    cudaError_t e;
    const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver",
     "API call is not supported in the installed CUDA driver"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction",
     "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace",
     "operation not supported on global/shared address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch",
     "system has unsupported display driver / cuda driver combination"},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice",
     "forward compatibility was attempted on non supported HW"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const char *cudaGetErrorString(cudaError_t e) {
    for (auto &k : k_errors)
        if (k.e == e)
            return k.text;
    return "unrecognized error code";
}
const char *cudaGetErrorName(cudaError_t e) {
    for (auto &k : k_errors)
        if (k.e == e)
            return k.name;
    return "cudaErrorUnrecognized";
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    FAULT("cudaStreamBeginCapture");
    capturing = true;
    capture_broken = false;
    capture_list = new std::vector<std::function<void()>>();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = nullptr;
    if (!capturing) {
        return cudaErrorIllegalState;
    }
    capturing = false;
    auto *list = capture_list;
    capture_list = nullptr;
    cudaError_t e = fault_check("cudaStreamEndCapture");
    if (e == cudaSuccess && capture_broken) {
        e = cudaErrorStreamCaptureInvalidated;
    }
    if (e != cudaSuccess) {
        delete list;
        return e;
    }
    *g = (cudaGraph_t)list;
    return cudaSuccess;
}
long emu_graph_launches;
long cuemu_graph_launches(void) {
    return emu_graph_launches;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    FAULT("cudaGraphInstantiate");
    *e = (cudaGraphExec_t) new std::vector<std::function<void()>>(
        *(std::vector<std::function<void()>> *)g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    FAULT("cudaGraphLaunch");
    emu_graph_launches++;
    for (auto &f : *(std::vector<std::function<void()>> *)e)
        f();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete (std::vector<std::function<void()>> *)g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete (std::vector<std::function<void()>> *)e;
    return cudaSuccess;
}

// ---- fake cuBLAS (host loops; captured like kernels) ----
static float ld(const void *p, size_t i, int t) {
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    uint16_t u = ((const uint16_t *)p)[i];
    return t == CUDA_R_16F ? kg_fp16_to_fp32(u) : kg_bf16_to_fp32(u);
}
extern "C" {
int cublasCreate_v2(void **h) {
    *h = malloc(1);
    return 0;
}
int cublasDestroy_v2(void *h) {
    free(h);
    return 0;
}
int cublasSetStream_v2(void *, void *) {
    return 0;
}
int cublasSetWorkspace_v2(void *, void *, size_t) {
    return 0;
}
int cublasSetMathMode(void *, int) {
    return 0;
}
const char *cublasGetStatusString(int) {
    return "cuemu cublas";
}
/* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2. The
 * emulated cuBLAS matches the emulated runtime unless CUEMU_CUBLAS_MAJOR says
 * otherwise. */
int cublasGetProperty(int type, int *value) {
    *value = type == 0 ? env_int("CUEMU_CUBLAS_MAJOR", CUDART_VERSION / 1000) : type == 1 ? 0 : 3;
    return 0;
}
long emu_gemms;
int cublasGemmEx(void *,
                 int ta,
                 int tb,
                 int m,
                 int n,
                 int k,
                 const void *alpha,
                 const void *A,
                 int At,
                 int lda,
                 const void *B,
                 int Bt,
                 int ldb,
                 const void *beta,
                 void *C,
                 int Ct,
                 int ldc,
                 int ct,
                 int algo) {
    if (ta != 1 || tb != 0 || Ct != CUDA_R_32F || ct != 68 || algo != -1 || At != Bt) {
        fprintf(stderr, "cuemu: unexpected gemm\n");
        abort();
    }
    float a = *(const float *)alpha, b = *(const float *)beta;
    /* like cuBLAS, the summation order depends on the shape: few columns
     * (rows of kgen's activations) get a split-K of 4 partial sums */
    const int split = n <= 8 && k >= 64 ? 4 : 1;
    auto fn = [=]() {
        emu_gemms++;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0;
                for (int s = 0; s < split; s++) {
                    float part = 0;
                    for (int l = s * k / split; l < (s + 1) * k / split; l++)
                        part += ld(A, (size_t)i * lda + l, At) * ld(B, (size_t)j * ldb + l, Bt);
                    acc += part;
                }
                float *c = (float *)C + (size_t)j * ldc + i;
                *c = a * acc + (b != 0 ? b * *c : 0.0f);
            }
    };
    if (capturing)
        capture_list->push_back(fn);
    else
        fn();
    return 0;
}
}
/* CUEMU_STATS=1: how much ran, e.g. to see that graphs were replayed */
__attribute__((destructor)) static void emu_stats() {
    if (getenv("CUEMU_STATS")) {
        fprintf(stderr, "cuemu: %ld launches, %ld graph launches, %ld gemms\n", emu_launches,
                emu_graph_launches, emu_gemms);
    }
}
