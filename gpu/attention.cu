/* attention: paged GQA attention on tensor cores, flash-attention style.
 *
 * DESIGN
 * Work item: (tile, KV head [x query-head subgroup], split). A tile is a
 * run of consecutive tokens of one sequence (a decode token alone, or up to
 * 64 / group tokens of a prefill chunk); its rows are (token, query head)
 * pairs of the KV head's group, 16 x rt of them, so the group's heads share
 * every K/V load (GQA) and a prefill tile shares them between its tokens
 * too (query tiling). A split is the positions [s * split_len, (s + 1) *
 * split_len) of the sequence; the item walks them in KV tiles of 32
 * positions (16 for head_dim > 128): K and V into shared memory (for 512-dim
 * heads, one tile: V replaces K once S is done), S = Q K^T
 * on tensor cores (WMMA 16x16x16, fp16 in, f32 out), the online softmax
 * per row in f32 (one warp per row, a lane per position), then O = O *
 * alpha + P V on tensor cores, O staying in accumulator fragments (rows are
 * found through a fragment loaded from a map of row numbers, so nothing
 * depends on the fragments' unspecified layout). A token whose context
 * fits one split is written out directly; longer ones leave (m, l, O) per
 * split and a combine kernel merges the splits in order.
 *
 * Non-causal layers (gemma-embedding). The step holds each input whole
 * (its K/V rows are all stored before attention runs), and a row's
 * visible positions are [lo, hi] instead of [window start, pos]: its whole
 * input, or pos -+ n_swa / 2 within it in a windowed layer (llama.cpp's
 * symmetric window). Both ends grow along a tile's tokens as the causal
 * ones do, so the same tiles, splits and combine serve both.
 *
 * Batch invariance. Every value a row produces depends only on its own q,
 * its own positions and the fixed cut of positions into splits and KV
 * tiles (both aligned to absolute positions): a tensor-core row is computed
 * independently of the other rows of its tile, a position another row of
 * the tile may see but this one may not enters as an exact 0 (p = 0, alpha
 * = 1), and splits are merged in ascending order. So a token gets the same
 * bits alone, in a batch of 64, in a prefill chunk of any length or as a
 * decode token, which is what keeps a job's tokens independent of its batch
 * mates, of preemption (recomputing a sequence runs its generated tokens
 * through the prefill path) and of the prefix cache.
 *
 * Parallelism. Splits give decode its parallelism at any batch size for
 * long contexts (B x n_kv x splits blocks, e.g. 8 x 16 = 128 for one 4096
 * token sequence of an 8B model); the host cuts the tiles into groups
 * whose partial results fit the scratch. */
#include "attention.cuh"

#include <mma.h>

using namespace nvcuda;

#define ATT_THREADS 128
#define ATT_WARPS   4
#define SPLIT_MIN   256

typedef struct attn_args {
    kg_cuda_inputs_t in;
    kg_cuda_attn_shape_t sh;
    int32_t split_len, max_splits;
    int32_t tile0, tok0; /* the launch's first tile and first token */
    int32_t n_sub;       /* query-head subgroups per KV head */
    float scale, softcap;
    int32_t n_swa;
    bool chunked;
    bool non_causal;
    const float *sinks; /* (n_head) or NULL */
    const __half *q;
    kg_cuda_kv_t kv; /* the layer's K and V planes, f16 or Q8_0 (kv_cache.cuh) */
    float *part_acc; /* (n_tok, n_head, max_splits, hd) */
    float *part_ml;  /* (n_tok, n_head, max_splits, 2) */
    void *out;
    int dt;
} attn_args_t;

/* Rows per KV head: the group's heads, or R of them per subgroup. */
__device__ __host__ __forceinline__ int32_t heads_per_item(int32_t group, int32_t rows) {
    return group <= rows ? group : rows;
}

/* The positions token t sees, [*lo, *hi]: causal, up to its own (its last
 * n_swa in a windowed layer, or from the start of its chunk of n_swa in a
 * chunked one); non-causal, its whole input, or within n_swa / 2 either
 * side in a windowed layer (cpu's attention_task). Either way lo never
 * falls as pos rises, which the tiles rely on. */
__device__ __forceinline__ void visible(const attn_args_t &a, int32_t t, int32_t *lo, int32_t *hi) {
    const int32_t p = a.in.pos[t];
    if (!a.non_causal) {
        *hi = p;
        *lo = a.n_swa > 0 && p + 1 > a.n_swa ? p + 1 - a.n_swa : 0;
        if (a.chunked && a.n_swa > 0) { /* llama4 */
            *lo = p - p % a.n_swa;
        }
        return;
    }
    const int32_t half = a.n_swa / 2, end = a.in.pos_end[t];
    *hi = a.n_swa > 0 && end > p + half + 1 ? p + half : end - 1;
    *lo = a.n_swa > 0 && p > half ? p - half : 0;
}

template <int RT, int HDMAX, int KT>
__global__ void __launch_bounds__(ATT_THREADS) attention_kernel(attn_args_t a) {
    constexpr int R = 16 * RT;
    constexpr int NCF = HDMAX / 16;                            /* column fragments of O */
    constexpr int OF = (RT * NCF + ATT_WARPS - 1) / ATT_WARPS; /* O fragments per warp */
    constexpr int SF = (RT * (KT / 16) + ATT_WARPS - 1) / ATT_WARPS;
    /* 512-dim heads: q, K and V tiles of 16 KiB each would pass the 48 KiB
     * of static shared memory, so V takes K's tile once the scores are
     * computed (v_s is then an unused row) */
    constexpr bool KV_ONE_TILE = HDMAX > 256;
    static_assert(!KV_ONE_TILE || (RT == 1 && KT == 16), "512-dim heads: RT 1, KT 16 only");
    __shared__ __align__(32) __half q_s[R][HDMAX];
    __shared__ __align__(32) __half k_s[KT][HDMAX];
    __shared__ __align__(32) __half v_s[KV_ONE_TILE ? 1 : KT][HDMAX];
    __half(*const vt)[HDMAX] = KV_ONE_TILE ? k_s : v_s; /* V's tile */
    __shared__ __align__(32) float s_s[R][KT];
    __shared__ __align__(32) __half p_s[R][KT];
    __shared__ float m_s[R];
    __shared__ float l_s[R];
    __shared__ float alpha_s[R];
    __shared__ int32_t pos_s[R]; /* the row's last visible position; -1: a padding row */
    __shared__ int32_t lo_s[R];  /* its first */

    const int32_t tile = a.tile0 + blockIdx.x;
    if (tile >= a.in.hdr->n_tiles) {
        return;
    }
    const int32_t hd = a.sh.head_dim, hd16 = (hd + 15) & ~15;
    const int32_t group = a.sh.n_head / a.sh.n_head_kv;
    const int32_t hs = heads_per_item(group, R), qt = R / hs;
    const int32_t g = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int32_t h0 = g * group + sub * hs, nh = min(hs, group - sub * hs);
    const int32_t t0 = a.in.tile_tok0[tile], nt = min(a.in.tile_n[tile], qt);
    /* both ends of the visible positions grow along the tile: the last
     * token's last one, and the first token's first one (a windowed layer
     * never reads before it: the engine may have given those blocks back) */
    int32_t ws, last, unused;
    visible(a, t0 + nt - 1, &unused, &last);
    visible(a, t0, &ws, &unused);
    const int32_t split = blockIdx.z, sl = a.split_len;
    const int32_t p_begin = split * sl;
    if (p_begin > last || p_begin + sl <= ws) {
        return;
    }
    const int32_t p_end = min(p_begin + sl, last + 1);
    /* KV tiles stay at absolute multiples of KT (split_len is one), so a
     * row meets the same tiles whatever its tile mates' windows; a tile
     * wholly outside a row's window changes nothing for it (p = 0, alpha = 1) */
    const int32_t p_first = max(p_begin, ws / KT * KT);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t n_kv_dim = (int64_t)a.sh.n_head_kv * hd;
    const int32_t *table = a.in.table + a.in.tbl_off[t0];
    const int32_t bs = a.sh.block_size;

    /* rows: (token tt, head hh) at r = tt * hs + hh */
    for (int r = tid; r < R; r += ATT_THREADS) {
        const int tt = r / hs, hh = r % hs;
        int32_t lo = 0, hi = -1;
        if (r < qt * hs && tt < nt && hh < nh) {
            visible(a, t0 + tt, &lo, &hi);
        }
        pos_s[r] = hi;
        lo_s[r] = lo;
        m_s[r] = -INFINITY;
        l_s[r] = 0.0f;
    }
    for (int i = tid; i < R * HDMAX; i += ATT_THREADS) {
        const int r = i / HDMAX, e = i % HDMAX, tt = r / hs, hh = r % hs;
        float v = 0.0f;
        if (e < hd && r < qt * hs && tt < nt && hh < nh) {
            v = __half2float(a.q[((int64_t)(t0 + tt) * a.sh.n_head + h0 + hh) * hd + e]);
        }
        q_s[r][e] = __float2half_rn(v);
    }
    for (int i = tid; i < KT * HDMAX; i += ATT_THREADS) {
        k_s[i / HDMAX][i % HDMAX] = __float2half_rn(0.0f);
        vt[i / HDMAX][i % HDMAX] = __float2half_rn(0.0f);
    }
    /* row and column numbers of each accumulator element, for the rescale
     * and the output (s_s is free until the first tile) */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> rmap, cmap;
    for (int i = tid; i < 256; i += ATT_THREADS) {
        s_s[i / 16][i % 16] = (float)(i / 16);
    }
    __syncthreads();
    wmma::load_matrix_sync(rmap, &s_s[0][0], KT, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < 256; i += ATT_THREADS) {
        s_s[i / 16][i % 16] = (float)(i % 16);
    }
    __syncthreads();
    wmma::load_matrix_sync(cmap, &s_s[0][0], KT, wmma::mem_row_major);
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[OF];
#pragma unroll
    for (int j = 0; j < OF; j++) {
        wmma::fill_fragment(o[j], 0.0f);
    }

    for (int32_t p0 = p_first; p0 < p_end; p0 += KT) {
        /* 1. K and V rows of positions p0 .. p0 + KT - 1 (zeros past p_end
         * and before the window; V after step 2 where it takes K's tile).
         * Columns hd .. hd16 stay the zeros written above. */
        const int32_t chunks = hd / 8;
        for (int i = tid; i < KT * chunks; i += ATT_THREADS) {
            const int pi = i / chunks, c = i % chunks;
            const int32_t p = p0 + pi;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (p < p_end && p >= ws) {
                const int64_t row = (int64_t)table[p / bs] * bs + p % bs;
                const int64_t e = (int64_t)g * hd + c * 8;
                kv = kg_kv_load8(a.kv, a.kv.k, row, bs, n_kv_dim, e);
                if (!KV_ONE_TILE) {
                    vv = kg_kv_load8(a.kv, a.kv.v, row, bs, n_kv_dim, e);
                }
            }
            *(uint4 *)&k_s[pi][c * 8] = kv;
            if (!KV_ONE_TILE) {
                *(uint4 *)&v_s[pi][c * 8] = vv;
            }
        }
        __syncthreads();

        /* 2. S = Q K^T (R x KT), each element over k in ascending order */
#pragma unroll
        for (int j = 0; j < SF; j++) {
            const int f = warp + j * ATT_WARPS;
            if (f < RT * (KT / 16)) {
                const int rf = f / (KT / 16), cf = f % (KT / 16);
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
                wmma::fill_fragment(s, 0.0f);
                for (int kk = 0; kk < hd16; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fq;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fk;
                    wmma::load_matrix_sync(fq, &q_s[rf * 16][kk], HDMAX);
                    wmma::load_matrix_sync(fk, &k_s[cf * 16][kk], HDMAX);
                    wmma::mma_sync(s, fq, fk, s);
                }
                wmma::store_matrix_sync(&s_s[rf * 16][cf * 16], s, KT, wmma::mem_row_major);
            }
        }
        __syncthreads();
        if (KV_ONE_TILE) { /* every warp is done with K: V into its tile */
            for (int i = tid; i < KT * chunks; i += ATT_THREADS) {
                const int pi = i / chunks, c = i % chunks;
                const int32_t p = p0 + pi;
                uint4 vv = make_uint4(0u, 0u, 0u, 0u);
                if (p < p_end && p >= ws) {
                    const int64_t row = (int64_t)table[p / bs] * bs + p % bs;
                    vv = kg_kv_load8(a.kv, a.kv.v, row, bs, n_kv_dim, (int64_t)g * hd + c * 8);
                }
                *(uint4 *)&vt[pi][c * 8] = vv;
            }
        }

        /* 3. online softmax, one warp per row, a lane per position */
        for (int r = warp; r < R; r += ATT_WARPS) {
            const int32_t pr = pos_s[r];
            const int32_t p = p0 + lane;
            const bool on = pr >= 0 && lane < KT && p < p_end && p <= pr && p >= lo_s[r];
            float sc = -INFINITY;
            if (on) {
                /* cpu_attn_scores: soft-capping works on the raw dot product */
                const float raw = s_s[r][lane];
                sc = a.softcap > 0.0f ? kg_softcap(raw, a.softcap) * a.scale : raw * a.scale;
            }
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, kg_warp_max(sc));
            float e = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                e = on ? expf(sc - m_new) : 0.0f;
                alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            }
            const float sum = kg_warp_sum(e);
            /* every lane has read m_s[r] before lane 0 overwrites it (a
             * shuffle is no memory barrier: racecheck's warning on an H200) */
            __syncwarp();
            if (lane < KT) {
                p_s[r][lane] = __float2half_rn(e);
            }
            if (lane == 0) {
                l_s[r] = l_s[r] * alpha + sum;
                m_s[r] = m_new;
                alpha_s[r] = alpha;
            }
        }
        __syncthreads();

        /* 4. O = O * alpha + P V */
#pragma unroll
        for (int j = 0; j < OF; j++) {
            const int f = warp + j * ATT_WARPS;
            if (f < RT * NCF && (f % NCF) * 16 < hd16) {
                const int rf = f / NCF, cf = f % NCF;
#pragma unroll
                for (int i = 0; i < o[j].num_elements; i++) {
                    o[j].x[i] *= alpha_s[rf * 16 + (int)rmap.x[i]];
                }
                for (int kk = 0; kk < KT; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fp;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fv;
                    wmma::load_matrix_sync(fp, &p_s[rf * 16][kk], KT);
                    wmma::load_matrix_sync(fv, &vt[kk][cf * 16], HDMAX);
                    wmma::mma_sync(o[j], fp, fv, o[j]);
                }
            }
        }
        __syncthreads();
    }

    /* 5. rows whose context fits one split: the output (times c / l, where
     * a sink adds exp(sink - m') to l after rescaling to m' = max(m, sink):
     * 1 / l without one); the others: this split's (m, l, O) for the
     * combine kernel */
    for (int r = tid; r < R; r += ATT_THREADS) {
        const int32_t pr = pos_s[r];
        if (pr >= 0 && pr < sl && p_begin == 0) {
            float c = 1.0f, l = l_s[r];
            if (a.sinks) {
                const float sk = a.sinks[h0 + r % hs], m = m_s[r], m2 = fmaxf(m, sk);
                c = expf(m - m2);
                l = l * c + expf(sk - m2);
            }
            alpha_s[r] = c / l;
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < OF; j++) {
        const int f = warp + j * ATT_WARPS;
        if (f < RT * NCF && (f % NCF) * 16 < hd16) {
            const int rf = f / NCF, cf = f % NCF;
#pragma unroll
            for (int i = 0; i < o[j].num_elements; i++) {
                const int r = rf * 16 + (int)rmap.x[i], e = cf * 16 + (int)cmap.x[i];
                const int32_t pr = pos_s[r];
                if (pr < 0 || e >= hd || p_begin > pr) {
                    continue;
                }
                const int32_t t = t0 + r / hs, h = h0 + r % hs;
                if (pr < sl) {
                    kg_st(a.out, ((int64_t)t * a.sh.n_head + h) * hd + e, o[j].x[i] * alpha_s[r],
                          a.dt);
                } else {
                    const int64_t slot =
                        ((int64_t)(t - a.tok0) * a.sh.n_head + h) * a.max_splits + split;
                    a.part_acc[slot * hd + e] = o[j].x[i];
                }
            }
        }
    }
    for (int r = tid; r < R; r += ATT_THREADS) {
        const int32_t pr = pos_s[r];
        if (pr >= sl && p_begin <= pr) {
            const int32_t t = t0 + r / hs, h = h0 + r % hs;
            const int64_t slot = ((int64_t)(t - a.tok0) * a.sh.n_head + h) * a.max_splits + split;
            a.part_ml[slot * 2] = m_s[r];
            a.part_ml[slot * 2 + 1] = l_s[r];
        }
    }
}

/* Merge the splits of one (token, head) in ascending order:
 * (M, L, O) <- (max, L e^(M - M') + l e^(m - M'), O e^(M - M') + o e^(m - M')). */
__global__ void __launch_bounds__(ATT_THREADS) attention_combine_kernel(attn_args_t a) {
    const int32_t t = a.tok0 + blockIdx.x, h = blockIdx.y;
    if (t >= a.in.hdr->n_tokens) {
        return;
    }
    int32_t ws, last;
    visible(a, t, &ws, &last);
    const int32_t n_split = last / a.split_len + 1;
    if (n_split == 1) {
        return; /* written by the attention kernel */
    }
    /* splits before the token's window hold nothing of it (and may not have
     * been written: no block of its tile reached them) */
    const int32_t hd = a.sh.head_dim;
    const int64_t base = ((int64_t)(t - a.tok0) * a.sh.n_head + h) * a.max_splits;
    for (int32_t e = threadIdx.x; e < hd; e += blockDim.x) {
        float m = -INFINITY, l = 0.0f, o = 0.0f;
        for (int32_t s = ws / a.split_len; s < n_split; s++) {
            const float ms = a.part_ml[(base + s) * 2], ls = a.part_ml[(base + s) * 2 + 1];
            if (ms == -INFINITY) {
                continue;
            }
            const float mn = fmaxf(m, ms);
            const float ca = m == -INFINITY ? 0.0f : expf(m - mn), cb = expf(ms - mn);
            l = l * ca + ls * cb;
            o = o * ca + a.part_acc[(base + s) * hd + e] * cb;
            m = mn;
        }
        if (a.sinks) { /* the sink joins the max and the sum, not the values */
            const float sk = a.sinks[h], mn = fmaxf(m, sk), ca = expf(m - mn);
            l = l * ca + expf(sk - mn);
            o = o * ca;
        }
        kg_st(a.out, ((int64_t)t * a.sh.n_head + h) * hd + e, o * (1.0f / l), a.dt);
    }
}

// ---- host side ----

int32_t kg_cuda_attention_split_len(int32_t max_ctx) {
    int32_t sl = SPLIT_MIN;
    while ((int64_t)sl * 16 < max_ctx) {
        sl += SPLIT_MIN;
    }
    return sl;
}

int32_t kg_cuda_attention_prefill_rt(const kg_cuda_attn_shape_t *sh) {
    const int32_t hd16 = (sh->head_dim + 15) & ~15;
    return hd16 > 256 ? 1 : hd16 > 128 ? 2 : 4; /* 512: q's tile alone is 16 KiB a 16 rows */
}

int32_t kg_cuda_attention_tile_tokens(const kg_cuda_attn_shape_t *sh, int32_t rt) {
    const int32_t group = sh->n_head / sh->n_head_kv;
    return 16 * rt / heads_per_item(group, 16 * rt);
}

size_t kg_cuda_attention_scratch_size(const kg_cuda_attn_shape_t *sh, int32_t pair_cap) {
    return (size_t)pair_cap * (size_t)sh->n_head * ((size_t)sh->head_dim + 2) * sizeof(float);
}

template <int RT, int HDMAX, int KT>
static kg_status_t launch(cudaStream_t stream, const attn_args_t *a, int32_t n_tiles) {
    const dim3 grid((unsigned)n_tiles, (unsigned)(a->sh.n_head_kv * a->n_sub),
                    (unsigned)a->max_splits);
    attention_kernel<RT, HDMAX, KT><<<grid, ATT_THREADS, 0, stream>>>(*a);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

kg_status_t kg_cuda_attention(cudaStream_t stream,
                              kg_cuda_inputs_t in,
                              const kg_cuda_attn_shape_t *sh,
                              const kg_cuda_attn_plan_t *plan,
                              const kg_cuda_attn_layer_t *layer,
                              int32_t tile0,
                              int32_t n_tiles,
                              int32_t tok0,
                              int32_t n_tok,
                              const __half *q16,
                              kg_cuda_kv_t kv,
                              float *scratch,
                              void *out,
                              kg_cuda_dtype_t dt) {
    if (n_tiles <= 0 || n_tok <= 0) {
        return KG_OK;
    }
    const int32_t hd16 = (sh->head_dim + 15) & ~15, group = sh->n_head / sh->n_head_kv;
    const int32_t rows = 16 * plan->rt;
    attn_args_t a;
    a.in = in;
    a.sh = *sh;
    a.split_len = plan->split_len;
    a.max_splits = plan->max_splits;
    a.tile0 = tile0;
    a.tok0 = tok0;
    a.n_sub = (group + rows - 1) / rows;
    a.scale = layer->scale;
    a.softcap = layer->softcap;
    a.n_swa = layer->n_swa;
    a.chunked = layer->chunked;
    a.non_causal = layer->non_causal;
    a.sinks = layer->sinks;
    a.q = q16;
    a.kv = kv;
    a.part_acc = scratch;
    a.part_ml = scratch + (size_t)n_tok * sh->n_head * plan->max_splits * sh->head_dim;
    a.out = out;
    a.dt = (int)dt;
    kg_status_t st = KG_ERR_INVALID;
    if (hd16 <= 64) {
        st = plan->rt == 1 ? launch<1, 64, 32>(stream, &a, n_tiles)
                           : launch<4, 64, 32>(stream, &a, n_tiles);
    } else if (hd16 <= 128) {
        st = plan->rt == 1 ? launch<1, 128, 32>(stream, &a, n_tiles)
                           : launch<4, 128, 32>(stream, &a, n_tiles);
    } else if (hd16 <= 256) {
        st = plan->rt == 1 ? launch<1, 256, 16>(stream, &a, n_tiles)
                           : launch<2, 256, 16>(stream, &a, n_tiles);
    } else if (hd16 <= 512 && plan->rt == 1) {
        st = launch<1, 512, 16>(stream, &a, n_tiles);
    }
    if (st != KG_OK) {
        return st;
    }
    if (plan->max_splits > 1) {
        const dim3 cgrid((unsigned)n_tok, (unsigned)sh->n_head);
        attention_combine_kernel<<<cgrid, ATT_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
    }
    return KG_OK;
}
