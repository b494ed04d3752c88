/* gemm: the batch-invariant GEMM family, and cuBLAS as an option.
 *
 * DESIGN
 * 16-bit weights (BF16, F16) use tensor cores through WMMA 16x16x16 tiles
 * with F32 accumulators. A block owns a BM x BN tile of Y; its warps own
 * MF x NF fragments each; k advances in BK-wide stages copied into shared
 * memory with cp.async, several stages in flight while the current one is
 * multiplied (6 for decode-sized calls, where the weights' bytes in flight
 * decide the speed; 2 for the big prefill tiles). Every
 * output element is the accumulator chain acc = mma(x[k0:k0+16],
 * w[k0:k0+16], acc) for k0 = 0, 16, 32, ... < n_in, in that order, in every
 * configuration: the configurations only move tiles between warps and
 * blocks, so a row's result does not depend on how many rows the call has.
 * Three configurations: skinny (rows <= 16: decode of small batches; a
 * 16 x 32 tile, six 64-deep stages in flight), mid (<= 64 rows) and large
 * (128 x 128 tiles for prefill).
 * Native quantized weights (qblocks.cuh: a GGUF file's blocks as they are)
 * go through the same kernels: the W side of a stage is not copied but
 * expanded, 8 weights a thread, into the same BF16 shared tile the copy
 * would have filled, with the upload's own arithmetic; the X side and the
 * tensor-core chain are unchanged, so the result has the BF16 matrix's
 * bits. A stage's block loads are issued before the current stage's
 * multiplies and expanded after them, so their latency overlaps the MMAs.
 * F32 weights (tiny test models) use a SIMT kernel whose every output is one
 * FMA chain over k in order. Nothing is split over k, which costs decode
 * some parallelism at very small output counts; the roofline check in
 * scripts/gpu-check measures what that costs against cuBLAS. */
#include "gemm.cuh"
#include "qblocks.cuh"

#include <cuda_pipeline.h>
#include <mma.h>
#include <string.h>

using namespace nvcuda;

// ---- setup ----

kg_status_t kg_cuda_blas_init(kg_cuda_blas_t *blas,
                              kg_cuda_gemm_mode_t mode,
                              cudaStream_t stream,
                              void *workspace,
                              size_t workspace_size,
                              char *errstr,
                              size_t errstr_size) {
    memset(blas, 0, sizeof(*blas));
    blas->mode = mode;
    if (mode != KG_CUDA_GEMM_CUBLAS) {
        const cudaError_t err =
            cudaMalloc((void **)&blas->part,
                       (size_t)KG_CUDA_GEMM_PART_ROWS * KG_CUDA_GEMM_PART_COLS * sizeof(float));
        if (err != cudaSuccess) {
            blas->part = NULL;
            if (errstr) {
                snprintf(errstr, errstr_size, "the GEMM's slice partials: %s",
                         cudaGetErrorName(err));
            }
            return KG_ERR_BACKEND;
        }
        return KG_OK;
    }
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
    return KG_OK;
}

void kg_cuda_blas_clear(kg_cuda_blas_t *blas) {
    if (blas->api && blas->handle) {
        blas->api->destroy(blas->handle);
    }
    blas->handle = NULL;
    cudaFree(blas->part);
    blas->part = NULL;
}

int32_t kg_cuda_gemm_slice(int32_t n_out, int32_t n_in) {
    const int32_t whole = (n_in + 63) / 64 * 64;
    if (n_out <= 0 || n_in <= 0) {
        return whole > 0 ? whole : 64;
    }
    const int32_t tiles = (n_out + 31) / 32; /* the decode configuration's column blocks */
    int32_t s = (264 + tiles - 1) / tiles;
    s = s < n_in / 256 ? s : n_in / 256;
    s = s < KG_CUDA_GEMM_PART_COLS / n_out ? s : KG_CUDA_GEMM_PART_COLS / n_out;
    s = s < 16 ? s : 16;
    if (s <= 1) {
        return whole;
    }
    const int32_t len = (n_in + s - 1) / s;
    return (len + 63) / 64 * 64;
}

// ---- tensor-core GEMM (16-bit weights) ----

#define PAD 8 /* halves of padding per shared row: 16 bytes, keeps WMMA's ldm legal */

/* Stage 8 consecutive elements [k, k+8) of row r of a (n_rows, K) matrix
 * into shared memory at dst, zero outside it. vec (K % 8 == 0: whole 16-byte
 * pieces are in or out): an asynchronous copy (cp.async, zero-filled when
 * out), so several stages are in flight while the tensor cores work; else
 * element by element (tiny test shapes). */
__device__ __forceinline__ void stage8(uint16_t *dst,
                                       const uint16_t *__restrict__ m,
                                       int32_t r,
                                       int32_t n_rows,
                                       int32_t k,
                                       int32_t K,
                                       bool vec) {
    const bool row_in = r < n_rows;
    if (vec) {
        const bool in = row_in && k < K;
        __pipeline_memcpy_async(dst, in ? m + (int64_t)r * K + k : m, 16, in ? 0 : 16);
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        dst[i] = row_in && k + i < K ? m[(int64_t)r * K + k + i] : (uint16_t)0;
    }
}

/* The W side of a native matrix: each thread's pieces of one stage,
 * loaded (global memory) and later expanded into shared memory. */
template <int QT, int BN, int BK, int NT> struct wq_stage {
    static constexpr int PER = (BN * BK / 8 + NT - 1) / NT; /* pieces per thread */
    qpiece<QT> p[PER];
    bool in[PER];

    __device__ __forceinline__ void load(const uint8_t *body,
                                         const uint8_t *tail,
                                         int tid,
                                         int32_t n0,
                                         int32_t N,
                                         int32_t k0,
                                         int32_t K) {
        constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
        const int64_t nb = K / L.elems; /* blocks a row */
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int v = tid + i * NT;
            const int r = v / (BK / 8), k = k0 + (v % (BK / 8)) * 8;
            in[i] = v < BN * BK / 8 && n0 + r < N && k < K;
            if (in[i]) {
                p[i].load(body, tail, (int64_t)(n0 + r) * nb + k / L.elems, k % L.elems);
            }
        }
    }
    __device__ __forceinline__ void store(uint16_t (*sb)[BK + PAD], int tid, int32_t k0) const {
        constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int v = tid + i * NT;
            if (v >= BN * BK / 8) {
                continue;
            }
            const int r = v / (BK / 8), c = (v % (BK / 8)) * 8;
            float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (in[i]) {
                p[i].expand((k0 + c) % L.elems, f);
            }
            uint4 u;
            u.x = (uint32_t)kg_q_bf16(f[0]) | (uint32_t)kg_q_bf16(f[1]) << 16;
            u.y = (uint32_t)kg_q_bf16(f[2]) | (uint32_t)kg_q_bf16(f[3]) << 16;
            u.z = (uint32_t)kg_q_bf16(f[4]) | (uint32_t)kg_q_bf16(f[5]) << 16;
            u.w = (uint32_t)kg_q_bf16(f[6]) | (uint32_t)kg_q_bf16(f[7]) << 16;
            *(uint4 *)&sb[r][c] = u;
        }
    }
};

/* No quantized side (QT 0): nothing to load or expand. */
template <int BN, int BK, int NT> struct wq_stage<0, BN, BK, NT> {
    __device__ __forceinline__ void
    load(const uint8_t *, const uint8_t *, int, int32_t, int32_t, int32_t, int32_t) {
    }
    __device__ __forceinline__ void store(uint16_t (*)[BK + PAD], int, int32_t) const {
    }
};

/* QT: 0 for a 16-bit W (w), else the GGUF type of a native W (wq: bodies,
 * wt: tails). K is cut into slices of `slice` (a multiple of 64, so of BK;
 * kg_cuda_gemm_slice: a property of the weight's shape), each slice's chain
 * starting from zero. SPLIT: block z computes slice z alone and writes it to
 * y + z * M * ldy (the partials, summed in order by slice_sum_kernel; one
 * slice: straight to Y). Otherwise the block runs the slices in turn and
 * adds each to a running total (tot = 0; tot += slice), the sum
 * slice_sum_kernel makes: the same bits either way. */
template <class T, int WM, int WN, int MF, int NF, int BK, int STAGES, int QT, bool SPLIT>
__global__ void __launch_bounds__(WM *WN * 32) mma_gemm_kernel(const uint16_t *__restrict__ w,
                                                               const uint8_t *__restrict__ wq,
                                                               const uint8_t *__restrict__ wt,
                                                               const uint16_t *__restrict__ x,
                                                               float *__restrict__ y,
                                                               int32_t ldy,
                                                               int32_t M,
                                                               int32_t N,
                                                               int32_t K,
                                                               int32_t slice) {
    constexpr int BM = 16 * MF * WM, BN = 16 * NF * WN, NT = WM * WN * 32, LD = BK + PAD;
    constexpr int VA = BM * BK / 8, VB = BN * BK / 8; /* 16-byte pieces per stage */
    __shared__ __align__(32) uint16_t sa[STAGES][BM][LD];
    __shared__ __align__(32) uint16_t sb[STAGES][BN][LD];
    wq_stage<QT, BN, BK, NT> wnext; /* a native W's next stage, between load and store */

    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int32_t m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const bool vec = K % 8 == 0;
    /* this block's stages [s0, s0 + n_stages): one slice (SPLIT), or all */
    const int32_t all_stages = (K + BK - 1) / BK, per_slice = slice / BK;
    const int32_t s0 = SPLIT ? (int32_t)blockIdx.z * per_slice : 0;
    const int32_t n_stages = SPLIT ? min(per_slice, all_stages - s0) : all_stages;
    if (SPLIT) {
        y += (int64_t)blockIdx.z * M * ldy;
    }

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MF][NF];
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> tot[SPLIT ? 1 : MF][SPLIT ? 1 : NF];
#pragma unroll
    for (int i = 0; i < MF; i++) {
#pragma unroll
        for (int j = 0; j < NF; j++) {
            wmma::fill_fragment(acc[i][j], 0.0f);
            if (!SPLIT) {
                wmma::fill_fragment(tot[i][j], 0.0f);
            }
        }
    }
    /* tot += acc, acc = 0: the end of a slice (fragments of one type hold the
     * same (row, column) at the same index) */
    auto close_slice = [&]() {
#pragma unroll
        for (int i = 0; i < MF; i++) {
#pragma unroll
            for (int j = 0; j < NF; j++) {
#pragma unroll
                for (int e = 0; e < acc[i][j].num_elements; e++) {
                    tot[SPLIT ? 0 : i][SPLIT ? 0 : j].x[e] += acc[i][j].x[e];
                }
                wmma::fill_fragment(acc[i][j], 0.0f);
            }
        }
    };
    /* stage s0 + s of X and W into buffer buf */
    auto issue = [&](int32_t s, int buf) {
        const int32_t k0 = (s0 + s) * BK;
        for (int v = tid; v < VA; v += NT) {
            const int r = v / (BK / 8), c = (v % (BK / 8)) * 8;
            stage8(&sa[buf][r][c], x, m0 + r, M, k0 + c, K, vec);
        }
        if (QT == 0) {
            for (int v = tid; v < VB; v += NT) {
                const int r = v / (BK / 8), c = (v % (BK / 8)) * 8;
                stage8(&sb[buf][r][c], w, n0 + r, N, k0 + c, K, vec);
            }
        } else {
            wnext.load(wq, wt, tid, n0, N, k0, K);
        }
    };

    /* STAGES - 1 stages in flight before the first multiply; a commit per
     * stage slot, empty or not, keeps wait_prior's count right */
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_stages) {
            issue(s, s);
            wnext.store(sb[s], tid, (s0 + s) * BK);
        }
        __pipeline_commit();
    }
    for (int32_t s = 0; s < n_stages; s++) {
        const int buf = s % STAGES;
        __pipeline_wait_prior(STAGES - 2); /* stage s has landed (this thread's part) */
        __syncthreads();                   /* ... everybody's; buffer s - 1 is free */
        const bool next = s + STAGES - 1 < n_stages;
        if (next) {
            issue(s + STAGES - 1, (s + STAGES - 1) % STAGES);
        }
        __pipeline_commit();
        if (!SPLIT && s > 0 && s % per_slice == 0) {
            close_slice(); /* stage s starts a slice */
        }
        /* the same k steps in every configuration: k0 + kk < K, ascending */
        const int kk_end = min(BK, K - (s0 + s) * BK);
        for (int kk = 0; kk < kk_end; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[MF];
#pragma unroll
            for (int i = 0; i < MF; i++) {
                wmma::load_matrix_sync(fa[i], (const T *)&sa[buf][(wm * MF + i) * 16][kk], LD);
            }
#pragma unroll
            for (int j = 0; j < NF; j++) {
                /* B(k, n) = W[n][k]: W's rows are B's columns */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, (const T *)&sb[buf][(wn * NF + j) * 16][kk], LD);
#pragma unroll
                for (int i = 0; i < MF; i++) {
                    wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
                }
            }
        }
        if (next) { /* a native W's stage s + STAGES - 1, loaded above; the next
                       __syncthreads publishes it */
            wnext.store(sb[(s + STAGES - 1) % STAGES], tid, (s0 + s + STAGES - 1) * BK);
        }
    }
    if (!SPLIT) {
        close_slice(); /* the last slice; tot holds the sum now */
    }
    __pipeline_wait_prior(0);
    __syncthreads(); /* shared memory is free for the edge patches */

    /* Y: straight from the fragments where a whole 16 x 16 piece is inside
     * and aligned; the edges through a per-warp patch of shared memory
     * (stage 0 of sa, unused now) */
    float *patch = (float *)&sa[0][0][0] + warp * 256;
    /* what a block writes: its slice (SPLIT) or the total */
    auto result = [&](int i,
                      int j) -> const wmma::fragment<wmma::accumulator, 16, 16, 16, float> & {
        if constexpr (SPLIT) {
            return acc[i][j];
        } else {
            return tot[i][j];
        }
    };
    /* whole pieces go straight out when every row of Y starts 32-byte aligned */
    const bool aligned = ldy % 8 == 0 && ((uintptr_t)y & 31) == 0;
#pragma unroll
    for (int i = 0; i < MF; i++) {
#pragma unroll
        for (int j = 0; j < NF; j++) {
            const int32_t r = m0 + (wm * MF + i) * 16, c = n0 + (wn * NF + j) * 16;
            if (r >= M || c >= N) {
                continue; /* the whole warp skips together */
            }
            if (r + 16 <= M && c + 16 <= N && aligned) {
                wmma::store_matrix_sync(y + (int64_t)r * ldy + c, result(i, j), ldy,
                                        wmma::mem_row_major);
            } else {
                wmma::store_matrix_sync(patch, result(i, j), 16, wmma::mem_row_major);
                /* each lane reads what the others stored: store_matrix_sync
                 * is no memory barrier (compute-sanitizer racecheck on an
                 * H200 reported the read-after-write) */
                __syncwarp();
                for (int e = tid & 31; e < 256; e += 32) {
                    const int32_t rr = r + e / 16, cc = c + e % 16;
                    if (rr < M && cc < N) {
                        y[(int64_t)rr * ldy + cc] = patch[e];
                    }
                }
                __syncwarp();
            }
        }
    }
}

/* y[r][c] (rows ldy apart) = the sum of the slices' partials (n_slices
 * planes of M x N) in slice order from 0: the running total's order */
__global__ void slice_sum_kernel(const float *__restrict__ part,
                                 int32_t n_slices,
                                 int32_t M,
                                 int32_t N,
                                 float *__restrict__ y,
                                 int32_t ldy) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)M * N) {
        return;
    }
    float t = 0.0f;
    for (int32_t s = 0; s < n_slices; s++) {
        t += part[(int64_t)s * M * N + i];
    }
    y[(i / N) * ldy + i % N] = t;
}

template <class T, int WM, int WN, int MF, int NF, int BK, int STAGES, int QT, bool SPLIT>
static kg_status_t launch_mma(const kg_cuda_blas_t *blas,
                              cudaStream_t stream,
                              const kg_cuda_mat_t *w,
                              const void *x,
                              float *y,
                              int32_t ldy,
                              int32_t rows) {
    constexpr int BM = 16 * MF * WM, BN = 16 * NF * WN;
    /* the patch for the edges lives in stage 0 of sa */
    static_assert(BM * (BK + PAD) >= WM * WN * 256 * 2, "edge patch does not fit");
    static_assert(64 % BK == 0, "slices are multiples of 64: of every configuration's stage");
    const int32_t slice = kg_cuda_gemm_slice(w->n_out, w->n_in);
    const int32_t n_slices = (w->n_in + slice - 1) / slice;
    /* several slices of a split launch go to the partials (rows <= 16) */
    const bool parts = SPLIT && n_slices > 1;
    if (parts && (rows > KG_CUDA_GEMM_PART_ROWS || !blas->part ||
                  (int64_t)n_slices * w->n_out > KG_CUDA_GEMM_PART_COLS)) {
        return KG_ERR_INVALID; /* kg_cuda_gemm_slice keeps within the workspace */
    }
    const dim3 grid((unsigned)((w->n_out + BN - 1) / BN), (unsigned)((rows + BM - 1) / BM),
                    SPLIT ? (unsigned)n_slices : 1u);
    const uint8_t *wq = (const uint8_t *)w->data, *wt = NULL;
    if (QT != 0) { /* the tails follow the bodies */
        const kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
        wt = wq + (size_t)w->n_out * (size_t)(w->n_in / L.elems) * (size_t)L.body;
    }
    mma_gemm_kernel<T, WM, WN, MF, NF, BK, STAGES, QT, SPLIT><<<grid, WM * WN * 32, 0, stream>>>(
        (const uint16_t *)w->data, wq, wt, (const uint16_t *)x, parts ? blas->part : y,
        parts ? w->n_out : ldy, rows, w->n_out, w->n_in, slice);
    KG_CUDA_CHECK_LAUNCH();
    if (parts) {
        const int64_t n = (int64_t)rows * w->n_out;
        slice_sum_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(blas->part, n_slices,
                                                                          rows, w->n_out, y, ldy);
        KG_CUDA_CHECK_LAUNCH();
    }
    return KG_OK;
}

/* Configurations (all under 48 KiB of shared memory): decode wants many
 * weight bytes in flight per block (6 stages of 64 k), prefill wants big
 * tiles (128 x 128, double-buffered). */
template <class T, int QT>
static kg_status_t gemm_16(const kg_cuda_blas_t *blas,
                           cudaStream_t stream,
                           const kg_cuda_mat_t *w,
                           const void *x,
                           float *y,
                           int32_t ldy,
                           int32_t rows) {
    if (rows <= 16) { /* 16 x 32, 2 warps, the slices over blocks */
        return launch_mma<T, 1, 2, 1, 1, 64, 6, QT, true>(blas, stream, w, x, y, ldy, rows);
    }
    if (rows <= 64) { /* 64 x 32, 4 warps */
        return launch_mma<T, 2, 2, 2, 1, 64, 3, QT, false>(blas, stream, w, x, y, ldy, rows);
    }
    /* 128 x 128, 8 warps */
    return launch_mma<T, 2, 4, 4, 2, 32, 2, QT, false>(blas, stream, w, x, y, ldy, rows);
}

/* A BF16 or native matrix (or segment) into y's columns, rows ldy apart:
 * native blocks expand into BF16 tiles. */
static kg_status_t gemm_bf16_or_native(const kg_cuda_blas_t *blas,
                                       cudaStream_t stream,
                                       const kg_cuda_mat_t *w,
                                       const void *x,
                                       float *y,
                                       int32_t ldy,
                                       int32_t rows) {
    return kg_q_dispatch(w->qtype, [&](auto qt) {
        return gemm_16<__nv_bfloat16, decltype(qt)::value>(blas, stream, w, x, y, ldy, rows);
    });
}

const void *kg_cuda_mat_tail(const kg_cuda_mat_t *m) {
    if (m->qtype == 0) {
        return NULL;
    }
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(m->qtype);
    return (const char *)m->data + (size_t)m->n_out * (size_t)(m->n_in / L.elems) * (size_t)L.body;
}

kg_cuda_mat_t kg_cuda_mat_seg(const kg_cuda_mat_t *m, int i) {
    kg_cuda_mat_t s;
    memset(&s, 0, sizeof(s));
    s.data = (char *)m->data + m->seg[i].offset;
    s.n_out = m->seg[i].n_out;
    s.n_in = m->n_in;
    s.dt = m->dt;
    s.qtype = m->seg[i].qtype;
    return s;
}

bool kg_cuda_gemm_native(int type, int32_t n_in) {
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(type);
    return L.elems > 0 && n_in > 0 && n_in % L.elems == 0;
}

size_t kg_cuda_native_size(int type, int32_t n_out, int32_t n_in) {
    const kg_cuda_qlayout_t L = kg_cuda_qlayout(type);
    return L.elems > 0 ? (size_t)n_out * (size_t)(n_in / L.elems) * (size_t)(L.body + L.tail) : 0;
}

// ---- F32 weights: SIMT, one FMA chain per output ----

#define F_BM 16
#define F_BN 64
#define F_BK 32

__global__ void __launch_bounds__(256) f32_gemm_kernel(const float *__restrict__ w,
                                                       const float *__restrict__ x,
                                                       float *__restrict__ y,
                                                       int32_t M,
                                                       int32_t N,
                                                       int32_t K) {
    __shared__ float sx[F_BM][F_BK + 1];
    __shared__ float sw[F_BN][F_BK + 1];
    const int tid = threadIdx.x;
    const int32_t m0 = blockIdx.y * F_BM, n0 = blockIdx.x * F_BN;
    /* thread -> 4 outputs: row tid / 16, columns (tid % 16) + 16 j */
    const int r = tid / 16, c = tid % 16;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int32_t k0 = 0; k0 < K; k0 += F_BK) {
        for (int i = tid; i < F_BM * F_BK; i += 256) {
            const int32_t rr = m0 + i / F_BK, kk = k0 + i % F_BK;
            sx[i / F_BK][i % F_BK] = rr < M && kk < K ? x[(int64_t)rr * K + kk] : 0.0f;
        }
        for (int i = tid; i < F_BN * F_BK; i += 256) {
            const int32_t nn = n0 + i / F_BK, kk = k0 + i % F_BK;
            sw[i / F_BK][i % F_BK] = nn < N && kk < K ? w[(int64_t)nn * K + kk] : 0.0f;
        }
        __syncthreads();
        const int kn = min(F_BK, K - k0);
        for (int k = 0; k < kn; k++) {
            const float xv = sx[r][k];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                acc[j] = fmaf(xv, sw[c + 16 * j][k], acc[j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int32_t rr = m0 + r, cc = n0 + c + 16 * j;
        if (rr < M && cc < N) {
            y[(int64_t)rr * N + cc] = acc[j];
        }
    }
}

// ---- dispatch ----

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
    if (w->qtype != 0 || w->n_seg > 0) {
        /* cuBLAS has no GGUF blocks: the upload expands them in that mode */
        if (blas->mode != KG_CUDA_GEMM_MMA || w->dt != KG_CUDA_BF16) {
            return KG_ERR_INVALID;
        }
        if (w->n_seg == 0) {
            return kg_cuda_gemm_native(w->qtype, w->n_in)
                       ? gemm_bf16_or_native(blas, stream, w, x, y, w->n_out, rows)
                       : KG_ERR_INVALID;
        }
        /* a segment's columns are the same chains as in one matrix */
        for (int i = 0; i < w->n_seg; i++) {
            const kg_cuda_mat_t seg = kg_cuda_mat_seg(w, i);
            if (seg.qtype != 0 && !kg_cuda_gemm_native(seg.qtype, seg.n_in)) {
                return KG_ERR_INVALID;
            }
            KG_TRY(gemm_bf16_or_native(blas, stream, &seg, x, y + w->seg[i].row0, w->n_out, rows));
        }
        return KG_OK;
    }
    if (blas->mode == KG_CUDA_GEMM_CUBLAS) {
        /* Row-major Y = X·W^T is column-major Y^T = W·X^T: W (n_in x n_out
         * col-major) transposed, X^T (n_in x rows col-major) as is. */
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType_t t = cuda_type(w->dt);
        KG_CUBLAS_CHECK(blas->api->gemm_ex(blas->handle, KG_CUBLAS_OP_T, KG_CUBLAS_OP_N, w->n_out,
                                           rows, w->n_in, &one, w->data, t, w->n_in, x, t, w->n_in,
                                           &zero, y, CUDA_R_32F, w->n_out, KG_CUBLAS_COMPUTE_32F,
                                           KG_CUBLAS_GEMM_DEFAULT));
        return KG_OK;
    }
    switch (w->dt) {
    case KG_CUDA_F32: {
        const dim3 grid((unsigned)((w->n_out + F_BN - 1) / F_BN),
                        (unsigned)((rows + F_BM - 1) / F_BM));
        f32_gemm_kernel<<<grid, 256, 0, stream>>>((const float *)w->data, (const float *)x, y, rows,
                                                  w->n_out, w->n_in);
        KG_CUDA_CHECK_LAUNCH();
        return KG_OK;
    }
    case KG_CUDA_F16:
        return gemm_16<__half, 0>(blas, stream, w, x, y, w->n_out, rows);
    case KG_CUDA_BF16:
        return gemm_16<__nv_bfloat16, 0>(blas, stream, w, x, y, w->n_out, rows);
    }
    return KG_ERR_INVALID;
}
