/* attention: paged GQA attention with the online softmax.
 *
 * DESIGN
 * Grid (token, KV head x query-head group, split). A block of 128 threads
 * serves up to 8 query heads of one KV head: it holds their q in shared
 * memory and walks its share of the token's positions in tiles of 32:
 *   1. scores: each warp takes 8 positions; for each, the warp reads the
 *      K row (hd fp16, one coalesced load) once and dots it with all its
 *      heads' q, warp-reducing one score per head;
 *   2. softmax: one warp per head updates the running max and sum over the
 *      tile (kg_online_softmax_step's algebra, vectorized over the tile);
 *   3. values: each thread owns 1-2 of the hd dimensions for every head,
 *      rescales its accumulators and adds the tile's weighted V rows.
 * With n_split > 1 (few tokens: decode), each block covers 1/n_split of the
 * positions and writes (m, l, unnormalized acc); a combine kernel merges
 * the splits. The split count is fixed per launch size and the ranges are
 * derived on the device from pos[t], so CUDA graphs stay valid.
 * Prefill chunks use the same kernel (each token walks its own prefix);
 * tiling the queries of a chunk together would cut K/V reloads and is the
 * next step if prefill attention ever dominates. */
#include "attention.cuh"

#define ATT_THREADS   128
#define ATT_WARPS     (ATT_THREADS / 32)
#define ATT_TILE      32
#define ATT_PER_WARP  (ATT_TILE / ATT_WARPS)
#define ATT_MAX_HEADS 8
#define ATT_MAX_HD    256
#define ATT_DIMS      (ATT_MAX_HD / ATT_THREADS)

typedef struct attn_args {
    kg_cuda_inputs_t in;
    kg_cuda_attn_shape_t sh;
    int32_t n_sub, n_split;
    float scale;
    const __half *q, *kc, *vc;
    float *part_acc; /* (rows, n_head, n_split, hd) */
    float *part_ml;  /* (rows, n_head, n_split, 2) */
    void *out;
    int dt;
} attn_args_t;

__global__ void __launch_bounds__(ATT_THREADS) attention_kernel(attn_args_t a) {
    __shared__ float q_s[ATT_MAX_HEADS][ATT_MAX_HD];
    __shared__ float s_s[ATT_MAX_HEADS][ATT_TILE];
    __shared__ int64_t row_s[ATT_TILE];
    __shared__ float m_s[ATT_MAX_HEADS], l_s[ATT_MAX_HEADS], alpha_s[ATT_MAX_HEADS];

    const int32_t t = blockIdx.x;
    if (t >= a.in.hdr->n_tokens) {
        return;
    }
    const int32_t hd = a.sh.head_dim, group = a.sh.n_head / a.sh.n_head_kv;
    const int32_t g = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int32_t h0 = g * group + sub * ATT_MAX_HEADS;
    const int32_t nh = min(ATT_MAX_HEADS, group - sub * ATT_MAX_HEADS);
    const int32_t split = blockIdx.z;
    const int32_t n_pos = a.in.pos[t] + 1;
    const int32_t chunk = (n_pos + a.n_split - 1) / a.n_split;
    const int32_t p_begin = split * chunk, p_end = min(n_pos, p_begin + chunk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t n_kv_dim = (int64_t)a.sh.n_head_kv * hd;
    const int32_t *table = a.in.table + a.in.tbl_off[t];
    const int32_t bs = a.sh.block_size;

    for (int32_t i = tid; i < nh * hd; i += ATT_THREADS) {
        const int32_t h = i / hd, e = i % hd;
        q_s[h][e] = __half2float(a.q[((int64_t)t * a.sh.n_head + h0 + h) * hd + e]);
    }
    if (tid < ATT_MAX_HEADS) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    float acc[ATT_MAX_HEADS][ATT_DIMS];
#pragma unroll
    for (int h = 0; h < ATT_MAX_HEADS; h++) {
#pragma unroll
        for (int j = 0; j < ATT_DIMS; j++) {
            acc[h][j] = 0.0f;
        }
    }
    __syncthreads();

    for (int32_t p0 = p_begin; p0 < p_end; p0 += ATT_TILE) {
        /* 1. scores of this tile, s_s[h][pi] (-inf past the end) */
        for (int k = 0; k < ATT_PER_WARP; k++) {
            const int32_t pi = warp * ATT_PER_WARP + k, p = p0 + pi;
            if (p < p_end) {
                const int64_t row = (int64_t)table[p / bs] * bs + p % bs;
                if (lane == 0) {
                    row_s[pi] = row;
                }
                const __half2 *kr = (const __half2 *)(a.kc + row * n_kv_dim + (int64_t)g * hd);
                float dot[ATT_MAX_HEADS];
#pragma unroll
                for (int h = 0; h < ATT_MAX_HEADS; h++) {
                    dot[h] = 0.0f;
                }
                for (int32_t e2 = lane; e2 < hd / 2; e2 += 32) {
                    const float2 kf = __half22float2(kr[e2]);
#pragma unroll
                    for (int h = 0; h < ATT_MAX_HEADS; h++) {
                        if (h < nh) {
                            dot[h] += q_s[h][2 * e2] * kf.x + q_s[h][2 * e2 + 1] * kf.y;
                        }
                    }
                }
#pragma unroll
                for (int h = 0; h < ATT_MAX_HEADS; h++) {
                    if (h < nh) {
                        const float d = kg_warp_sum(dot[h]);
                        if (lane == 0) {
                            s_s[h][pi] = d * a.scale;
                        }
                    }
                }
            } else if (lane < ATT_MAX_HEADS) {
                s_s[lane][pi] = -INFINITY;
            }
        }
        __syncthreads();

        /* 2. online softmax over the tile, one warp per head (lane = position) */
        for (int32_t h = warp; h < nh; h += ATT_WARPS) {
            const float s = s_s[h][lane];
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, kg_warp_max(s)); /* finite: p0 < p_end */
            const float e = s == -INFINITY ? 0.0f : expf(s - m_new);
            const float sum = kg_warp_sum(e);
            s_s[h][lane] = e;
            if (lane == 0) {
                const float alpha = expf(m_old - m_new); /* 0 on the first tile */
                alpha_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();

        /* 3. acc = acc * alpha + sum_p e_p * v_p */
        const int32_t n_valid = min(ATT_TILE, p_end - p0);
#pragma unroll
        for (int j = 0; j < ATT_DIMS; j++) {
            const int32_t e = tid + j * ATT_THREADS;
            if (e < hd) {
#pragma unroll
                for (int h = 0; h < ATT_MAX_HEADS; h++) {
                    acc[h][j] *= h < nh ? alpha_s[h] : 0.0f;
                }
                for (int32_t pi = 0; pi < n_valid; pi++) {
                    const float v = __half2float(a.vc[row_s[pi] * n_kv_dim + (int64_t)g * hd + e]);
#pragma unroll
                    for (int h = 0; h < ATT_MAX_HEADS; h++) {
                        if (h < nh) {
                            acc[h][j] += s_s[h][pi] * v;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    if (a.n_split == 1) {
#pragma unroll
        for (int h = 0; h < ATT_MAX_HEADS; h++) {
            if (h < nh) {
                const float inv = 1.0f / l_s[h];
#pragma unroll
                for (int j = 0; j < ATT_DIMS; j++) {
                    const int32_t e = tid + j * ATT_THREADS;
                    if (e < hd) {
                        kg_st(a.out, ((int64_t)t * a.sh.n_head + h0 + h) * hd + e, acc[h][j] * inv,
                              a.dt);
                    }
                }
            }
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < ATT_MAX_HEADS; h++) {
        if (h < nh) {
            const int64_t slot = ((int64_t)t * a.sh.n_head + h0 + h) * a.n_split + split;
#pragma unroll
            for (int j = 0; j < ATT_DIMS; j++) {
                const int32_t e = tid + j * ATT_THREADS;
                if (e < hd) {
                    a.part_acc[slot * hd + e] = acc[h][j];
                }
            }
            if (tid == 0) {
                a.part_ml[slot * 2] = m_s[h];
                a.part_ml[slot * 2 + 1] = l_s[h];
            }
        }
    }
}

/* Merge the splits of one (token, head): weights exp(m_s - M). Split 0 is
 * never empty (it starts at position 0), so M is finite. */
__global__ void __launch_bounds__(ATT_THREADS) attention_combine_kernel(attn_args_t a) {
    const int32_t t = blockIdx.x, h = blockIdx.y;
    if (t >= a.in.hdr->n_tokens) {
        return;
    }
    const int32_t hd = a.sh.head_dim;
    const int64_t base = ((int64_t)t * a.sh.n_head + h) * a.n_split;
    float m = -INFINITY;
    for (int32_t s = 0; s < a.n_split; s++) {
        m = fmaxf(m, a.part_ml[(base + s) * 2]);
    }
    float l = 0.0f;
    for (int32_t s = 0; s < a.n_split; s++) {
        const float ms = a.part_ml[(base + s) * 2];
        l += ms == -INFINITY ? 0.0f : a.part_ml[(base + s) * 2 + 1] * expf(ms - m);
    }
    const float inv = 1.0f / l;
    for (int32_t e = threadIdx.x; e < hd; e += blockDim.x) {
        float o = 0.0f;
        for (int32_t s = 0; s < a.n_split; s++) {
            const float ms = a.part_ml[(base + s) * 2];
            if (ms != -INFINITY) {
                o += a.part_acc[(base + s) * hd + e] * expf(ms - m);
            }
        }
        kg_st(a.out, ((int64_t)t * a.sh.n_head + h) * hd + e, o * inv, a.dt);
    }
}

static int32_t n_sub_groups(const kg_cuda_attn_shape_t *sh) {
    const int32_t group = sh->n_head / sh->n_head_kv;
    return (group + ATT_MAX_HEADS - 1) / ATT_MAX_HEADS;
}

int32_t kg_cuda_attention_splits(int32_t n_launch,
                                 const kg_cuda_attn_shape_t *sh,
                                 int32_t n_sm,
                                 int32_t max_split_rows) {
    const int64_t blocks = (int64_t)n_launch * sh->n_head_kv * n_sub_groups(sh);
    const int64_t target = 2 * (int64_t)n_sm;
    if (n_launch <= 0 || blocks >= target) {
        return 1;
    }
    int64_t s = (target + blocks - 1) / blocks;
    s = s > KG_CUDA_ATT_MAX_SPLIT ? KG_CUDA_ATT_MAX_SPLIT : s;
    const int64_t cap = max_split_rows / n_launch;
    s = s > cap ? cap : s;
    return s < 1 ? 1 : (int32_t)s;
}

size_t kg_cuda_attention_scratch_size(const kg_cuda_attn_shape_t *sh, int32_t max_split_rows) {
    return (size_t)max_split_rows * (size_t)sh->n_head * ((size_t)sh->head_dim + 2) * sizeof(float);
}

kg_status_t kg_cuda_attention(cudaStream_t stream,
                              int32_t n_launch,
                              kg_cuda_inputs_t in,
                              const kg_cuda_attn_shape_t *sh,
                              int32_t n_split,
                              const __half *q16,
                              const __half *k_cache,
                              const __half *v_cache,
                              float *scratch,
                              void *out,
                              kg_cuda_dtype_t dt) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    attn_args_t a;
    a.in = in;
    a.sh = *sh;
    a.n_sub = n_sub_groups(sh);
    a.n_split = n_split;
    a.scale = 1.0f / sqrtf((float)sh->head_dim);
    a.q = q16;
    a.kc = k_cache;
    a.vc = v_cache;
    a.part_acc = scratch;
    a.part_ml = scratch + (size_t)n_launch * sh->n_head * n_split * sh->head_dim;
    a.out = out;
    a.dt = (int)dt;
    dim3 grid((unsigned)n_launch, (unsigned)(sh->n_head_kv * a.n_sub), (unsigned)n_split);
    attention_kernel<<<grid, ATT_THREADS, 0, stream>>>(a);
    KG_CUDA_CHECK_LAUNCH();
    if (n_split > 1) {
        dim3 cgrid((unsigned)n_launch, (unsigned)sh->n_head);
        attention_combine_kernel<<<cgrid, ATT_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
    }
    return KG_OK;
}
