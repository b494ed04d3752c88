/* cpu_gemm: the CPU backend's GEMM, C(m, n) = A(m, k) · W(n, k)^T, with
 * weights packed once at load and results that do not depend on the batch.
 *
 * DESIGN
 * Batch invariance. Every output element C[i][j] is one chain of fused
 * multiply-adds over k = 0 .. K-1 in order, starting from +0.0f:
 *     acc = fmaf(A[i][k], W[j][k], acc)
 * whatever m, the row's position in A, the thread count or the thread that
 * computes it. The vector kernels keep one accumulator lane per element
 * (an FMA lane rounds exactly as fmaf does), K blocking carries the
 * accumulator through C (a float stored and reloaded is unchanged), and
 * threads split the output columns, never K. So a token's logits are bit
 * for bit the same whether it runs alone or inside any batch, and equal a
 * plain scalar fmaf loop (the portable fallback is that loop).
 *
 * Layout. W is packed into panels of 16 output columns: panel p holds
 * columns 16p .. 16p+15 as (k, 16), K-contiguous, the last panel padded with
 * zero columns. F32 stays F32, F16 stays F16 (converted in the kernel with
 * F16C), BF16 stays BF16 (a shift or mask in the kernel), stored in pairs:
 * 32-bit word j of a k-row holds column j in its low half and column j+8 in
 * its high half. Quantized types are dequantized to F32 at load: their
 * values (fp16 scale times small integers) are exact in F32, not in F16 or
 * BF16, and exact values keep the products equal to llama.cpp's.
 *
 * Kernels (x86-64 with AVX2, FMA and F16C): register tiles of up to 12
 * accumulators, 6 rows x 16 columns for prefill and 1 row x 96 columns for
 * decode (enough independent chains to hide the FMA latency), A broadcast
 * from its rows, W loaded from the panels and prefetched ahead. Prefill
 * blocks in Goto's order (a K block of 96 rows of A in L2, one panel's K
 * block in L1); decode (m <= 6) streams W once. Threads take tasks of a
 * few panels; products under ~50 us of work stay on the calling thread.
 * Where the CPU has AVX-512 (cpu_gemm_avx512.c), products of more than 6
 * rows take tiles of 8 rows x 48 columns in zmm registers instead: twice
 * the multiply-adds per instruction, the same chains, the same bits.
 * Other machines get the scalar fallback: same bits, much slower (no
 * vectors, a libm fmaf per multiply-add: about 0.5 GFLOP/s). */
#pragma once

#include "../../model/kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kg_pool;

/* Output columns per packed panel. */
#define CPU_GEMM_PANEL 16

/** A weight matrix packed for cpu_gemm. */
typedef struct cpu_gemm_weights {
    int64_t n, k;        /* outputs (rows of W in ggml layout), inputs */
    kg_ggml_type_t type; /* element type of the panels: F32, F16 or BF16 */
    void *panels;        /* (ceil(n / 16), k, 16) elements of type, 64-byte aligned */
    size_t size;         /* bytes of panels */
} cpu_gemm_weights_t;

/** Pack the (n, k) matrix `data` of `type` (ggml layout: n rows of k
 * elements, any type kg_dequantize knows) into `w`. F16 and BF16 keep their
 * storage type; the others become F32. k must be a multiple of the type's
 * block size. Returns false when out of memory (w is then cleared).
 * @thread any */
bool cpu_gemm_pack(
    cpu_gemm_weights_t *w, kg_ggml_type_t type, const void *data, int64_t n, int64_t k);

/** cpu_gemm_pack with the panels packed over `pool` (NULL: the calling
 * thread): the same panels. @thread the pool's owner */
bool cpu_gemm_pack_on(struct kg_pool *pool,
                      cpu_gemm_weights_t *w,
                      kg_ggml_type_t type,
                      const void *data,
                      int64_t n,
                      int64_t k);

/** Free the panels of `w` (a zeroed or cleared `w` is fine). */
void cpu_gemm_clear(cpu_gemm_weights_t *w);

/** C(m, w->n) = A(m, w->k) · W^T, A and C row-major F32 with no padding.
 * Parallel over column panels on `pool` (NULL: the calling thread only);
 * small products run on the calling thread. Every C[i][j] is the fmaf chain
 * over k described above: bitwise independent of m, of row i's position and
 * of the threads. @thread engine (the pool is not reentrant) */
void cpu_gemm(
    struct kg_pool *pool, const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m);

/* Most products one cpu_gemm_multi call takes. */
#define CPU_GEMM_MULTI_MAX 4

/** Several products of the same A in one hand-off to the pool (Q, K and V;
 * gate and up): c[i](m, w[i]->n) = A(m, k) · w[i]^T for i < n_w <=
 * CPU_GEMM_MULTI_MAX, every w[i]->k equal. Bitwise the same as n_w cpu_gemm
 * calls. @thread engine */
void cpu_gemm_multi(struct kg_pool *pool,
                    const float *a,
                    int64_t m,
                    int n_w,
                    const cpu_gemm_weights_t *const *w,
                    float *const *c);

/** The portable scalar kernel alone, on the calling thread: what cpu_gemm
 * runs where the vector kernels are not compiled. Its results equal
 * cpu_gemm's bit for bit (tests compare them). */
void cpu_gemm_scalar(const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m);

/** Choose the kernels: "scalar", "avx2", "avx512" (AVX2 for products of
 * up to 6 rows), or "best" / NULL for the best this build and CPU run (the
 * default). All give the same bits; tests and benchmarks compare them.
 * Returns false, changing nothing, for a name this machine cannot run.
 * @thread engine, with no product running */
bool cpu_gemm_set_kernel(const char *name);

/** Name of the kernels in use: "scalar", "avx2" or "avx512". */
const char *cpu_gemm_kernel_name(void);
