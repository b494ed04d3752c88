/* cpu_vecdot: the CPU backend's matmul for quantized weights,
 * C(m, n) = A(m, k) . W(n, k)^T with W in a GGUF block format, read in
 * place from the mapped file, and A quantized as ggml quantizes it
 * (cpu_quant).
 *
 * DESIGN
 * Numerics. As ggml's vec_dot kernels: per weight block, an exact integer
 * dot product of the weight's integers (times its integer sub-block
 * scales) with the activation's int8 values, then the float scales. Every
 * output element C[i][j] is this fixed chain over the blocks b = 0, 1, ...
 * of row j, starting from +0.0f:
 *     isum = sum over the block of sc(k) * w(k) * a(k)         (exact int32)
 *     acc  = fmaf(d_w[b] * d_a[b], (float)isum, acc)
 *     macc = fmaf(m_w[b], s_a[b], macc)                         (Q4_1, Q5_1)
 *     macc = fmaf(-(dmin_w[b] * d_a[b]), (float)sum_sub m * bsum, macc)
 *                                                               (Q2_K, Q4_K, Q5_K)
 *     C[i][j] = acc + macc
 * ggml splits each block's sum into 8 partial lanes and converts those to
 * float; we convert the exact block sum once, so the products are ggml's
 * and the float rounding is at least as fine.
 *
 * Batch invariance. The integer sums are exact, so how a kernel groups the
 * multiply-adds (register tiles of 1 x 8, 2 x 4 or 4 x 2 elements, the
 * AVX2 maddubs/madd lanes or the scalar loop) cannot change them, and the
 * float chain above is the same instructions in the same order in every
 * kernel. Which kernel a row goes through may therefore depend on the row
 * count (decode takes 1 x 8 tiles, prefill 4 x 2) without changing one bit
 * of its result: a token's logits are the same alone or in any batch, on
 * any thread count (threads split the columns, never k).
 *
 * Layout and blocking. A task is a run of panels of CPU_QPANEL weight
 * rows. It unpacks its panels once (cpu_quant_unpack) into a per-thread
 * buffer, then meets them with the activation rows in blocks that stay in
 * L2: prefill reuses each unpacking for every row, decode streams the
 * weights once. */
#pragma once

#include "cpu_quant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kg_pool;

/** A quantized weight matrix in place: n rows of k elements of `type`. */
typedef struct cpu_qmat {
    const cpu_qtraits_t *tr;
    const void *data; /* (n, k) blocks, row_size bytes per row */
    int64_t n, k;
    size_t row_size;
} cpu_qmat_t;

/** Set up `w` for the (n, k) matrix `data` of quantized `type`. False
 * when the type is not quantized or k is not a multiple of its block. */
bool cpu_qmat_init(cpu_qmat_t *w, kg_ggml_type_t type, const void *data, int64_t n, int64_t k);

/** Per-thread unpacking buffers for rows of up to max_k elements. */
typedef struct cpu_qgemm_scratch cpu_qgemm_scratch_t;
cpu_qgemm_scratch_t *cpu_qgemm_scratch_new(int n_threads, int64_t max_k);
void cpu_qgemm_scratch_free(cpu_qgemm_scratch_t *s);
size_t cpu_qgemm_scratch_size(const cpu_qgemm_scratch_t *s);

/* Most products one cpu_qgemm call takes. */
#define CPU_QGEMM_MAX_W 4

/** c[i](a->m, w[i]->n) = A . w[i]^T for n_w products sharing the quantized
 * activations `a` (every w[i] takes a->kind and has k = a->k). Parallel
 * over column panels on `pool` (NULL: the calling thread), small products
 * inline. Every element is the chain in the DESIGN note.
 * @thread engine (the pool is not reentrant) */
void cpu_qgemm(struct kg_pool *pool,
               cpu_qgemm_scratch_t *scratch,
               const cpu_qact_t *a,
               int n_w,
               const cpu_qmat_t *const *w,
               float *const *c);

/** cpu_qgemm on the calling thread only, with the unpacking buffers of
 * `thread` (a pool thread's index): tasks that each run their own product
 * side by side (the expert groups of a mixture of experts) give each its
 * own buffers. The same bits as cpu_qgemm. @thread the pool thread `thread` */
void cpu_qgemm_serial(cpu_qgemm_scratch_t *scratch,
                      int thread,
                      const cpu_qact_t *a,
                      int n_w,
                      const cpu_qmat_t *const *w,
                      float *const *c);

/** The reference for one element: row i of `a` against row j of `w`, by
 * the chain in the DESIGN note, in plain C from the raw blocks (tests). */
float cpu_vecdot_ref(const cpu_qmat_t *w, int64_t j, const cpu_qact_t *a, int64_t i);

/** Choose the kernels: "scalar" (portable), "avx2", "avxvnni" (AVX2 with
 * AVX-VNNI's vpdpbusd), "avx512vnni" (the same with vpdpbusd's AVX512-VNNI
 * form on ymm registers) or "best"/NULL (the best this CPU runs, the
 * default). False
 * when this build or CPU cannot run the named ones. All give the same bits
 * (tests compare them). Not thread-safe: call before any product. */
bool cpu_vecdot_set_kernel(const char *name);

/** Name of the kernels in use: "scalar", "avx2", "avxvnni" or "avx512vnni". */
const char *cpu_vecdot_kernel_name(void);
