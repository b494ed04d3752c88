/* cuemu: the runtime half (fibers, launches, graphs, memory, fake cuBLAS).
 * See include/cuemu.h. */
#include "cuemu.h"

#include <cstdio>
#include <ucontext.h>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
uint64_t emu_xbuf[32][32];
long emu_launches;

// ---- fibers ----
struct fiber {
    ucontext_t ctx;
    char *stack;
    bool done;
    bool waiting;
    unsigned tid;
};
static const size_t STACK = 256 << 10;
static std::vector<fiber> fibers;
static ucontext_t sched;
static fiber *cur;
static const std::function<void()> *cur_fn;
struct ebar {
    int count, arrived;
    long gen;
};
static ebar block_bar, warp_bar[32];

static void yield_to_sched() {
    swapcontext(&cur->ctx, &sched);
}

static void bar_wait(ebar *b) {
    long g = b->gen;
    if (++b->arrived == b->count) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    cur->waiting = true;
    while (b->gen == g) {
        yield_to_sched();
    }
    cur->waiting = false;
}

void __syncthreads(void) {
    bar_wait(&block_bar);
}
void emu_warp_sync(void) {
    bar_wait(&warp_bar[threadIdx.x >> 5]);
}

static void entry() {
    (*cur_fn)();
    cur->done = true;
    swapcontext(&cur->ctx, &sched);
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
        f.waiting = false;
        f.tid = i;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &sched;
        makecontext(&f.ctx, entry, 0);
    }
    unsigned left = n;
    while (left > 0) {
        bool progress = false;
        long gens = block_bar.gen;
        for (unsigned w = 0; w < 32; w++)
            gens += warp_bar[w].gen * 7;
        for (unsigned i = 0; i < n; i++) {
            fiber &f = fibers[i];
            if (f.done)
                continue;
            cur = &f;
            threadIdx = {f.tid % blockDim.x, (f.tid / blockDim.x) % blockDim.y,
                         f.tid / (blockDim.x * blockDim.y)};
            swapcontext(&sched, &f.ctx);
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

static bool capturing;
static std::vector<std::function<void()>> *capture_list;

static void run_grid(dim3 grid, dim3 block, const std::function<void()> &fn) {
    gridDim = grid;
    blockDim = block;
    unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "cuemu: bad launch %ux%ux%u x %u\n", grid.x, grid.y, grid.z, n);
        abort();
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                run_block(n, fn);
            }
}

void emu_launch(dim3 grid, dim3 block, std::function<void()> fn) {
    emu_launches++;
    if (capturing) {
        capture_list->push_back([=]() { run_grid(grid, block, fn); });
        return;
    }
    run_grid(grid, block, fn);
}

// ---- runtime ----
cudaError_t cudaGetDeviceCount(int *n) {
    *n = getenv("CUEMU_NO_DEVICE") ? 0 : 1;
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int) {
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof(*p));
    strcpy(p->name, "cuemu");
    p->major = 9;
    p->multiProcessorCount = 8;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
    *v = 8;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    // garbage, like real device memory
    *p = malloc(n);
    if (*p)
        memset(*p, 0xA5, n);
    return *p ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    return cudaMalloc(p, n);
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    if (capturing) {
        fprintf(stderr, "cuemu: memcpy during capture\n");
        abort();
    }
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t) {
    return "cuemu error";
}
const char *cudaGetErrorName(cudaError_t) {
    return "cuemuError";
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    capturing = true;
    capture_list = new std::vector<std::function<void()>>();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    capturing = false;
    *g = (cudaGraph_t)capture_list;
    capture_list = nullptr;
    return cudaSuccess;
}
long emu_graph_launches;
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = (cudaGraphExec_t) new std::vector<std::function<void()>>(
        *(std::vector<std::function<void()>> *)g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
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
    auto fn = [=]() {
        emu_gemms++;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0;
                for (int l = 0; l < k; l++)
                    acc += ld(A, (size_t)i * lda + l, At) * ld(B, (size_t)j * ldb + l, Bt);
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
