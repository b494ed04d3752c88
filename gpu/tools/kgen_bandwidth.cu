/* kgen-bandwidth: the memory bandwidths the CUDA backend's roofline uses.
 *
 * Prints one JSON object: device-to-device copy (bytes read + written per
 * second, as vendors and KINDS-style tables count it), a read-only stream
 * (the pattern of a decode step, which reads every weight once) and pinned
 * host-to-device copy. Each is the best of several timed repetitions with
 * CUDA events after a warm-up. Usage: kgen-bandwidth [MiB] (default 2048). The
 * read stream is what scripts/gpu-check's roofline divides by. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = (expr);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "kgen-bandwidth: %s failed: %s\n", #expr, cudaGetErrorString(err_));   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Sum every float4 of the buffer; the result is written only when it is
 * impossible, so the loads cannot be dropped. Each thread issues READ_UNROLL
 * independent 16-byte loads before it uses any of them: a GPU issues in
 * order, so a loop that adds each value as it arrives keeps one load per
 * thread in flight and measures latency, not bandwidth (which made the
 * roofline look better than it was). */
#define READ_UNROLL 8
__global__ void read_kernel(const float4 *__restrict__ p, size_t n, float *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (; i + (READ_UNROLL - 1) * stride < n; i += READ_UNROLL * stride) {
        float4 v[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; u++) {
            v[u] = __ldg(p + i + u * stride);
        }
#pragma unroll
        for (int u = 0; u < READ_UNROLL; u++) {
            acc += (v[u].x + v[u].y) + (v[u].z + v[u].w);
        }
    }
    for (; i < n; i += stride) {
        const float4 v = __ldg(p + i);
        acc += (v.x + v.y) + (v.z + v.w);
    }
    if (acc == -1.2345f) {
        *sink = acc;
    }
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 2048;
    const size_t size = mib << 20;
    const int reps = 10;
    void *a = NULL, *b = NULL, *host = NULL;
    float *sink = NULL;
    cudaEvent_t t0, t1;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(cudaMalloc(&a, size));
    CHECK(cudaMalloc(&b, size));
    CHECK(cudaMalloc((void **)&sink, sizeof(float)));
    CHECK(cudaMallocHost(&host, size));
    CHECK(cudaMemset(a, 1, size));
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));

    float best_copy = 1e30f, best_read = 1e30f, best_h2d = 1e30f, ms = 0.0f;
    /* 2048 threads an SM, 8 loads in flight each */
    const int blocks = prop.multiProcessorCount * 4;
    for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
        CHECK(cudaEventRecord(t0));
        CHECK(cudaMemcpy(b, a, size, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        best_copy = r > 0 && ms < best_copy ? ms : best_copy;

        CHECK(cudaEventRecord(t0));
        read_kernel<<<blocks, 512>>>((const float4 *)a, size / sizeof(float4), sink);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        best_read = r > 0 && ms < best_read ? ms : best_read;

        CHECK(cudaEventRecord(t0));
        CHECK(cudaMemcpy(a, host, size, cudaMemcpyHostToDevice));
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        best_h2d = r > 0 && ms < best_h2d ? ms : best_h2d;
    }
    printf("{\"device\":\"%s\",\"sm\":%d,\"mib\":%zu,\"copy_gbps\":%.1f,\"read_gbps\":%.1f,"
           "\"h2d_gbps\":%.1f}\n",
           prop.name, prop.multiProcessorCount, mib, 2.0 * (double)size / (best_copy * 1e6),
           (double)size / (best_read * 1e6), (double)size / (best_h2d * 1e6));
    cudaFree(a);
    cudaFree(b);
    cudaFree(sink);
    cudaFreeHost(host);
    return 0;
}
