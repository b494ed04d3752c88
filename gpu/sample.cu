/* sample: the device sampler, one block per output row.
 *
 * DESIGN
 * The CPU sampler is the specification (the rules are listed in
 * src/model/kg_sampler.h): the same sanitising (NaN -> -inf, +inf ->
 * FLT_MAX, all masked -> all 0), raw log-softmax and top-n logprobs,
 * penalties, top-k -> top-p -> min-p -> temperature chain, and the same
 * draw: the survivors' weights in ascending id order, u = uniform * sum,
 * the first token whose running sum exceeds u. So greedy picks are
 * identical, and a seeded draw lands on the same token whenever the float
 * results agree (expf here and the CPU's exp may differ in the last bit,
 * which moves a token only when u falls within that rounding of a
 * boundary). The RNG stays on the host: kg_cuda_sampler_run draws each
 * row's uniform exactly as kg_sampler_sample would and sends it along.
 *
 * One total order ranks candidates: higher logit first, then lower id. It
 * is the 64-bit key (orderable logit bits << 32 | ~id). Top-k and top-p
 * both keep a best-first prefix of that order, so together they come down
 * to one floor key: top-k's is a block-wide radix select; top-p's is found
 * by walking the prefix in sorted chunks of up to 1024 keys (radix select
 * of the next 1024 below the last key, bitonic sort in shared memory),
 * after a histogram of the mass over logit buckets (kg_sampler.c's) has
 * skipped everything above the boundary bucket when there is no top-k.
 * The draw is then one prefix-scan walk over the ids. Built with
 * --fmad=false so every product rounds as in the C code. */
#include "sample.cuh"

#include <float.h>
#include <limits.h>
#include <string.h>

#define S_THREADS    512
#define S_WARPS      (S_THREADS / 32)
#define S_CHUNK      1024
#define S_PER_THREAD (S_CHUNK / S_THREADS)
#define S_ITEMS      4    /* ids per thread per tile of an id-order walk */
#define HIST_BUCKETS 1024 /* kg_sampler.c's top-p histogram */
#define HIST_RANGE   40.0f
#define NO_BOUND     0xFFFFFFFFFFFFFFFFull

typedef unsigned long long u64;

typedef struct smem {
    u64 keys[S_CHUNK];         /* a sorted chunk, best first; 0 pads */
    double mass[HIST_BUCKETS]; /* top-p histogram */
    int32_t hist[256];         /* radix-select digit counts */
    double red[32];
    u64 redu[32];
    int32_t i0, i1, i2, i3;
    double d0;
    float f0;
} smem_t;

/* Which candidates a radix select or chunk walk considers. */
typedef struct sel {
    int mode; /* 0: every token; 1: tokens in histogram bucket `edge` */
    int32_t edge;
    float lo, scale;
} sel_t;

/* Draw weights: the temperature probability of a survivor (key >= floor,
 * logit >= thr when min-p is on), 0 for everything else. */
typedef struct wparams {
    float max, inv_t, thr;
    bool use_thr;
    unsigned long long floor;
} wparams_t;

// ---- the order ----

__device__ __forceinline__ float sanitize(float x) {
    if (x != x) {
        return -INFINITY;
    }
    return x > FLT_MAX ? FLT_MAX : x;
}

/* Keys compare as (logit desc, id asc) do; every real key is > 0 and
 * < NO_BOUND (+inf never occurs after sanitize). */
__device__ __forceinline__ u64 make_key(float l, int32_t id) {
    if (l == 0.0f) {
        l = 0.0f; /* -0 ties with +0, as float comparison says */
    }
    uint32_t u = __float_as_uint(l);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (u64)(0xFFFFFFFFu - (uint32_t)id);
}

__device__ __forceinline__ int32_t key_id(u64 k) {
    return (int32_t)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFull));
}

__device__ __forceinline__ float key_logit(u64 k) {
    uint32_t u = (uint32_t)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    return __uint_as_float(u);
}

/* kg_sampler.c hist_bucket, the same float operations. */
__device__ __forceinline__ int32_t hist_bucket(float x, float lo, float scale) {
    const float d = x - lo;
    if (!(d > 0.0f)) {
        return 0;
    }
    const int32_t b = (int32_t)(d * scale);
    return b >= HIST_BUCKETS ? HIST_BUCKETS - 1 : b;
}

__device__ __forceinline__ bool sel_has(const sel_t &s, float l) {
    return s.mode == 0 || hist_bucket(l, s.lo, s.scale) == s.edge;
}

/* kg_sampler.c filter(): w = e^((l - max) / T) for the survivors, the
 * max exactly 1, -inf exactly 0. */
__device__ __forceinline__ double weight_of(float l, int32_t id, const wparams_t &wp) {
    if (make_key(l, id) < wp.floor || (wp.use_thr && !(l >= wp.thr))) {
        return 0.0;
    }
    const float d = l - wp.max;
    const float e = d == 0.0f ? 1.0f : d == -INFINITY ? 0.0f : expf(d * wp.inv_t);
    return (double)e;
}

// ---- block primitives ----

__device__ u64 block_max_u64(u64 x, smem_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y > x ? y : x;
    }
    __syncthreads();
    if (lane == 0) {
        sm->redu[warp] = x;
    }
    __syncthreads();
    x = lane < S_WARPS ? sm->redu[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y > x ? y : x;
    }
    return x;
}

/* Exclusive prefix sum over the block in thread order; *total gets the sum. */
__device__ double block_excl_scan_d(double x, double *total, smem_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inc = x;
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) {
            inc += y;
        }
    }
    double excl = __shfl_up_sync(0xffffffffu, inc, 1);
    excl = lane == 0 ? 0.0 : excl;
    __syncthreads();
    if (lane == 31) {
        sm->red[warp] = inc;
    }
    __syncthreads();
    if (warp == 0) {
        double v = lane < S_WARPS ? sm->red[lane] : 0.0;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) {
                v += y;
            }
        }
        sm->red[lane] = v;
    }
    __syncthreads();
    *total = sm->red[S_WARPS - 1];
    return (warp > 0 ? sm->red[warp - 1] : 0.0) + excl;
}

/* Sort sm->keys descending (bitonic network over S_CHUNK entries). */
__device__ void bitonic_desc(u64 *k) {
    for (int size = 2; size <= S_CHUNK; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < S_CHUNK; i += S_THREADS) {
                const int j = i ^ stride;
                if (j > i) {
                    const u64 a = k[i], b = k[j];
                    const bool desc = (i & size) == 0;
                    if (desc ? a < b : a > b) {
                        k[i] = b;
                        k[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

/* Threshold T such that exactly min(r, eligible) of the eligible tokens
 * (selected by s, key < bound) have key >= T; 1 when all of them do.
 * An MSB-first radix select, 8 bits a pass, stopping as soon as the
 * tokens sharing the current prefix are exactly the ones still needed.
 * r >= 1. */
__device__ u64
radix_select(const float *row, int32_t n, const sel_t &s, u64 bound, int32_t r, smem_t *sm) {
    u64 prefix = 0, mask = 0;
    int32_t need = r;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += S_THREADS) {
            sm->hist[i] = 0;
        }
        __syncthreads();
        for (int32_t i = threadIdx.x; i < n; i += S_THREADS) {
            const float l = row[i];
            if (!sel_has(s, l)) {
                continue;
            }
            const u64 k = make_key(l, i);
            if (k >= bound || (k & mask) != prefix) {
                continue;
            }
            atomicAdd(&sm->hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int32_t c = 0, d = 255;
            for (; d > 0; d--) {
                if (c + sm->hist[d] >= need) {
                    break;
                }
                c += sm->hist[d];
            }
            sm->i0 = d;
            sm->i1 = need - c;
            sm->i2 = c + sm->hist[d] < need;  /* fewer eligible than r */
            sm->i3 = sm->hist[d] == need - c; /* this prefix is exactly what is left */
        }
        __syncthreads();
        const int32_t d = sm->i0;
        const bool short_of = sm->i2 != 0, exact = sm->i3 != 0;
        need = sm->i1;
        __syncthreads(); /* the next pass rewrites hist and i0..i3 */
        if (short_of) {
            return 1;
        }
        prefix |= (u64)d << shift;
        mask |= (u64)0xFF << shift;
        if (exact) {
            return prefix;
        }
    }
    return prefix;
}

/* The eligible tokens with key in [floor, bound), at most S_CHUNK of them
 * by construction of floor, sorted best first into sm->keys. Returns their
 * count. */
__device__ int32_t
gather_sorted(const float *row, int32_t n, const sel_t &s, u64 bound, u64 floor, smem_t *sm) {
    if (threadIdx.x == 0) {
        sm->i0 = 0;
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += S_THREADS) {
        const float l = row[i];
        if (!sel_has(s, l)) {
            continue;
        }
        const u64 k = make_key(l, i);
        if (k < bound && k >= floor) {
            const int32_t slot = atomicAdd(&sm->i0, 1);
            if (slot < S_CHUNK) {
                sm->keys[slot] = k;
            }
        }
    }
    __syncthreads();
    const int32_t cnt = min(sm->i0, S_CHUNK);
    for (int32_t i = cnt + threadIdx.x; i < S_CHUNK; i += S_THREADS) {
        sm->keys[i] = 0;
    }
    __syncthreads();
    bitonic_desc(sm->keys);
    return cnt;
}

/* The next (up to) S_CHUNK best eligible tokens below `bound`, not below
 * `floor`, sorted into sm->keys. */
__device__ int32_t
next_chunk(const float *row, int32_t n, const sel_t &s, u64 bound, u64 floor, smem_t *sm) {
    u64 t = radix_select(row, n, s, bound, S_CHUNK, sm);
    t = t < floor ? floor : t;
    return gather_sorted(row, n, s, bound, t, sm);
}

/* Top-p along a sorted chunk: walk sm->keys[0..cnt) best first adding
 * e^(l - max) to *cum (kg_sampler.c top_p_sorted: every token counts) and
 * return the first index where the sum reaches target, or -1. */
__device__ int32_t walk_chunk(smem_t *sm, int32_t cnt, float max, double target, double *cum) {
    double w[S_PER_THREAD], local = 0.0;
#pragma unroll
    for (int j = 0; j < S_PER_THREAD; j++) {
        const int32_t i = threadIdx.x * S_PER_THREAD + j;
        w[j] = i < cnt ? (double)expf(key_logit(sm->keys[i]) - max) : 0.0;
        local += w[j];
    }
    double total;
    double run = *cum + block_excl_scan_d(local, &total, sm);
    if (threadIdx.x == 0) {
        sm->i1 = INT_MAX;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < S_PER_THREAD; j++) {
        const int32_t i = threadIdx.x * S_PER_THREAD + j;
        if (i < cnt) {
            run += w[j];
            if (run >= target) {
                atomicMin(&sm->i1, i);
                break;
            }
        }
    }
    __syncthreads();
    const int32_t found = sm->i1 == INT_MAX ? -1 : sm->i1;
    *cum += total;
    __syncthreads(); /* i1 is reused */
    return found;
}

/* The draw (kg_sampler.c draw): the survivors in ascending id order with
 * their weights; the first token whose running sum exceeds u, else the
 * last with any weight (rounding ran past the end), else -1. Tiles of
 * S_THREADS * S_ITEMS ids, a block prefix scan per tile. */
__device__ int32_t
walk_ids(const float *row, int32_t n, const wparams_t &wp, double u, smem_t *sm) {
    double cum = 0.0;
    int32_t last_id = -1;
    for (int32_t base = 0; base < n; base += S_THREADS * S_ITEMS) {
        double w[S_ITEMS], local = 0.0;
#pragma unroll
        for (int j = 0; j < S_ITEMS; j++) {
            const int32_t i = base + threadIdx.x * S_ITEMS + j;
            w[j] = i < n ? weight_of(row[i], i, wp) : 0.0;
            local += w[j];
        }
        double total;
        double run = cum + block_excl_scan_d(local, &total, sm);
        if (threadIdx.x == 0) {
            sm->i1 = INT_MAX;
            sm->i2 = -1;
        }
        __syncthreads();
        int32_t mine = -1;
#pragma unroll
        for (int j = 0; j < S_ITEMS; j++) {
            const int32_t i = base + threadIdx.x * S_ITEMS + j;
            if (w[j] > 0.0) {
                mine = i;
                run += w[j];
                if (u < run) {
                    atomicMin(&sm->i1, i);
                    break;
                }
            }
        }
        if (mine >= 0) {
            atomicMax(&sm->i2, mine);
        }
        __syncthreads();
        const int32_t found = sm->i1, last = sm->i2;
        __syncthreads();
        if (found != INT_MAX) {
            return found;
        }
        if (last >= 0) {
            last_id = last;
        }
        cum += total;
    }
    return last_id;
}

// ---- the draw (temperature > 0, max logit finite) ----

/* The survivors of top-k and top-p are the tokens whose key is at least a
 * floor (both keep a best-first prefix of the order); min-p is a logit
 * threshold on top. */
__device__ int32_t
draw(const float *row, int32_t n, const kg_cuda_sample_row_t &p, u64 best, smem_t *sm) {
    const float max = key_logit(best);
    const sel_t all = {0, 0, 0.0f, 0.0f};
    wparams_t wp;
    wp.max = max;
    wp.inv_t = 1.0f / p.temperature;
    wp.use_thr = p.min_p > 0.0f;
    wp.thr = p.min_p >= 1.0f ? max : max + logf(p.min_p);
    wp.floor = 1;

    if (p.top_k > 0 && p.top_k < n) {
        /* top-k: the k best; top-p then keeps the shortest prefix whose
         * mass reaches top_p of the k's mass (top_p_sorted) */
        const u64 tk = radix_select(row, n, all, NO_BOUND, p.top_k, sm);
        wp.floor = tk;
        if (p.top_p < 1.0f) {
            double mass = 0.0;
            for (int32_t i = threadIdx.x; i < n; i += S_THREADS) {
                const float l = row[i];
                if (make_key(l, i) >= tk) {
                    mass += (double)expf(l - max);
                }
            }
            const double target = (double)p.top_p * kg_block_sum_d(mass, sm->red);
            double cum = 0.0;
            u64 bound = NO_BOUND;
            for (;;) {
                const int32_t cnt = next_chunk(row, n, all, bound, tk, sm);
                if (cnt == 0) {
                    break;
                }
                const int32_t at = walk_chunk(sm, cnt, max, target, &cum);
                if (at >= 0) {
                    wp.floor = sm->keys[at];
                    break;
                }
                if (cnt < S_CHUNK) {
                    break;
                }
                bound = sm->keys[cnt - 1];
            }
        }
    } else if (p.top_p < 1.0f) {
        /* top-p alone (top_p_unsorted): the mass per logit bucket finds the
         * bucket where the mass from the top reaches top_p; everything above
         * it is kept, and the bucket itself is walked sorted */
        const float lo = max - HIST_RANGE, scale = (float)HIST_BUCKETS / HIST_RANGE;
        for (int i = threadIdx.x; i < HIST_BUCKETS; i += S_THREADS) {
            sm->mass[i] = 0.0;
        }
        __syncthreads();
        double z = 0.0;
        for (int32_t i = threadIdx.x; i < n; i += S_THREADS) {
            const float l = row[i];
            const double e = (double)expf(l - max);
            z += e;
            atomicAdd(&sm->mass[hist_bucket(l, lo, scale)], e);
        }
        const double target = (double)p.top_p * kg_block_sum_d(z, sm->red);
        __syncthreads();
        if (threadIdx.x == 0) {
            double c = 0.0;
            int32_t e = HIST_BUCKETS - 1;
            for (; e > 0; e--) {
                if (c + sm->mass[e] >= target) {
                    break;
                }
                c += sm->mass[e];
            }
            sm->i0 = e;
            sm->d0 = c;
        }
        __syncthreads();
        const sel_t edge = {1, sm->i0, lo, scale};
        double cum = sm->d0;
        __syncthreads();
        u64 bound = NO_BOUND, lowest = 0;
        bool crossed = false;
        for (;;) {
            const int32_t cnt = next_chunk(row, n, edge, bound, 1, sm);
            if (cnt == 0) {
                break;
            }
            const int32_t at = walk_chunk(sm, cnt, max, target, &cum);
            if (at >= 0) {
                wp.floor = sm->keys[at];
                crossed = true;
                break;
            }
            lowest = sm->keys[cnt - 1];
            if (cnt < S_CHUNK) {
                break;
            }
            bound = lowest;
        }
        if (!crossed) {
            /* rounding left the mass short: the whole boundary bucket */
            wp.floor = lowest ? lowest : 1;
        }
    }

    double z = 0.0;
    for (int32_t i = threadIdx.x; i < n; i += S_THREADS) {
        z += weight_of(row[i], i, wp);
    }
    const double u = p.u * kg_block_sum_d(z, sm->red);
    const int32_t tok = walk_ids(row, n, wp, u, sm);
    return tok >= 0 ? tok : key_id(best);
}

// ---- the kernel ----

__global__ void __launch_bounds__(S_THREADS) sample_kernel(float *logits,
                                                           int32_t n_vocab,
                                                           const kg_cuda_sample_row_t *rows,
                                                           kg_cuda_pen_t *pens,
                                                           kg_sample_result_t *res) {
    __shared__ smem_t sm;
    float *row = logits + (int64_t)blockIdx.x * n_vocab;
    const kg_cuda_sample_row_t p = rows[blockIdx.x];
    kg_sample_result_t *out = res + blockIdx.x;
    const int tid = threadIdx.x;

    /* 1. sanitise in place, best key, raw log-softmax normaliser */
    u64 best = 0;
    for (int32_t i = tid; i < n_vocab; i += S_THREADS) {
        const u64 k = make_key(sanitize(row[i]), i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, &sm);
    const bool all_masked = key_logit(best) == -INFINITY;
    const float m0 = all_masked ? 0.0f : key_logit(best);
    double sum = 0.0;
    for (int32_t i = tid; i < n_vocab; i += S_THREADS) {
        const float x = row[i];
        const float l = all_masked ? 0.0f : sanitize(x);
        if (!(l == x)) {
            row[i] = l;
        }
        sum += (double)expf(l - m0);
    }
    const double lse = (double)m0 + log(kg_block_sum_d(sum, sm.red));
    if (all_masked) {
        best = make_key(0.0f, 0);
    }
    __syncthreads();

    /* 2. top-n logprobs of the raw logits */
    int32_t want = p.n_logprobs < KG_MAX_LOGPROBS ? p.n_logprobs : KG_MAX_LOGPROBS;
    want = want < n_vocab ? want : n_vocab;
    if (want > 0) {
        const sel_t all = {0, 0, 0.0f, 0.0f};
        const u64 t = radix_select(row, n_vocab, all, NO_BOUND, want, &sm);
        const int32_t cnt = gather_sorted(row, n_vocab, all, NO_BOUND, t, &sm);
        if (tid < cnt) {
            out->top_token[tid] = key_id(sm.keys[tid]);
            out->top_logprob[tid] = (float)((double)key_logit(sm.keys[tid]) - lse);
        }
        if (tid == 0) {
            out->n_top = cnt;
        }
        __syncthreads();
    } else if (tid == 0) {
        out->n_top = 0;
    }

    /* 3. penalties (distinct tokens, so no two threads touch one logit) */
    for (int32_t j = tid; j < p.pen_n; j += S_THREADS) {
        kg_cuda_pen_t *pe = pens + p.pen_off + j;
        float x = row[pe->tok];
        pe->raw = x;
        if (pe->rep) {
            x = sanitize(x > 0.0f ? x / p.rep : x * p.rep);
        }
        if (pe->count > 0) {
            x = sanitize(x - ((float)pe->count * p.freq + p.pres));
        }
        row[pe->tok] = x;
    }
    __syncthreads();
    if (p.pen_n > 0) {
        best = 0;
        for (int32_t i = tid; i < n_vocab; i += S_THREADS) {
            const u64 k = make_key(row[i], i);
            best = k > best ? k : best;
        }
        best = block_max_u64(best, &sm);
    }

    /* 4. pick */
    int32_t token;
    if (!(p.temperature > 0.0f) || key_logit(best) == -INFINITY) {
        token = key_id(best); /* greedy, or only -inf left: the best alone */
    } else {
        token = draw(row, n_vocab, p, best, &sm);
    }

    /* 5. logprob of the raw logit at the token */
    if (tid == 0) {
        sm.f0 = row[token];
    }
    __syncthreads();
    for (int32_t j = tid; j < p.pen_n; j += S_THREADS) {
        if (pens[p.pen_off + j].tok == token) {
            sm.f0 = pens[p.pen_off + j].raw;
        }
    }
    __syncthreads();
    if (tid == 0) {
        out->token = token;
        out->logprob = (float)((double)sm.f0 - lse);
    }
}

// ---- host side ----

kg_status_t kg_cuda_sampler_init(kg_cuda_sampler_t *s, int32_t n_vocab, int32_t max_rows) {
    memset(s, 0, sizeof(*s));
    s->n_vocab = n_vocab;
    s->max_rows = max_rows;
    s->pen_cap = 2 * n_vocab > 65536 ? 2 * n_vocab : 65536;
    const size_t rows_size = (size_t)max_rows * sizeof(kg_cuda_sample_row_t);
    const size_t pens_size = (size_t)s->pen_cap * sizeof(kg_cuda_pen_t);
    const size_t res_size = (size_t)max_rows * sizeof(kg_sample_result_t);
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_rows, rows_size));
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_pens, pens_size));
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_res, res_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_rows, rows_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_pens, pens_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_res, res_size));
    s->idx = (int32_t *)malloc((size_t)n_vocab * sizeof(int32_t));
    if (!s->idx) {
        KG_LOG_ERROR("cuda", "sampler: out of host memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        s->idx[i] = -1;
    }
    return KG_OK;
}

void kg_cuda_sampler_clear(kg_cuda_sampler_t *s) {
    cudaFreeHost(s->h_rows);
    cudaFreeHost(s->h_pens);
    cudaFreeHost(s->h_res);
    cudaFree(s->d_rows);
    cudaFree(s->d_pens);
    cudaFree(s->d_res);
    free(s->idx);
    memset(s, 0, sizeof(*s));
}

size_t kg_cuda_sampler_device_size(const kg_cuda_sampler_t *s) {
    return (size_t)s->max_rows * (sizeof(kg_cuda_sample_row_t) + sizeof(kg_sample_result_t)) +
           (size_t)s->pen_cap * sizeof(kg_cuda_pen_t);
}

/* Add the distinct tokens of toks[from..to) as repetition entries. */
static void
add_window(kg_cuda_sampler_t *s, const int32_t *toks, int64_t from, int64_t to, int32_t *n_pens) {
    for (int64_t i = from; i < to; i++) {
        const int32_t tok = toks[i];
        if (tok < 0 || tok >= s->n_vocab || s->idx[tok] >= 0) {
            continue;
        }
        kg_cuda_pen_t *pe = &s->h_pens[*n_pens];
        pe->tok = tok;
        pe->count = 0;
        pe->rep = 1;
        pe->raw = 0.0f;
        s->idx[tok] = (*n_pens)++;
    }
}

/* The row's penalty entries, as kg_sampler.c apply_penalties would visit
 * them: the repetition window is the last penalty_last_n tokens of
 * prompt ++ output, frequency and presence count the output. */
static void pack_penalties(kg_cuda_sampler_t *s, const kg_sample_request_t *q, int32_t *n_pens) {
    const kg_sampling_params_t *p = q->params;
    const int32_t first = *n_pens;
    const float rep = p->repetition_penalty;
    if (rep != 1.0f && rep > 0.0f && p->penalty_last_n != 0) {
        const int64_t total = (int64_t)q->n_prompt + q->n_output;
        const int64_t win =
            p->penalty_last_n < 0 || p->penalty_last_n > total ? total : p->penalty_last_n;
        const int64_t out_from = win > q->n_output ? 0 : q->n_output - win;
        const int64_t prompt_from =
            win > q->n_output ? q->n_prompt - (win - q->n_output) : q->n_prompt;
        add_window(s, q->prompt, prompt_from, q->n_prompt, n_pens);
        add_window(s, q->output, out_from, q->n_output, n_pens);
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (int32_t i = 0; i < q->n_output; i++) {
            const int32_t tok = q->output[i];
            if (tok < 0 || tok >= s->n_vocab) {
                continue;
            }
            if (s->idx[tok] < 0) {
                kg_cuda_pen_t *pe = &s->h_pens[*n_pens];
                pe->tok = tok;
                pe->count = 0;
                pe->rep = 0;
                pe->raw = 0.0f;
                s->idx[tok] = (*n_pens)++;
            }
            s->h_pens[s->idx[tok]].count++;
        }
    }
    for (int32_t i = first; i < *n_pens; i++) {
        s->idx[s->h_pens[i].tok] = -1;
    }
}

/* Upper bound of the entries a request can add. */
static int64_t penalty_bound(const kg_cuda_sampler_t *s, const kg_sample_request_t *q) {
    const kg_sampling_params_t *p = q->params;
    int64_t n = 0;
    if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f && p->penalty_last_n != 0) {
        n += (int64_t)q->n_prompt + q->n_output;
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        n += q->n_output;
    }
    return n < s->n_vocab ? n : s->n_vocab;
}

kg_status_t kg_cuda_sampler_run(kg_cuda_sampler_t *s,
                                cudaStream_t stream,
                                float *d_logits,
                                const kg_sample_request_t *reqs,
                                int32_t n,
                                kg_sample_result_t *out) {
    int32_t done = 0;
    while (done < n) {
        /* a group of rows whose penalty entries fit the buffer (pen_cap >= n_vocab,
         * so every row fits alone) */
        int32_t rows = 0, n_pens = 0;
        while (done + rows < n && rows < s->max_rows) {
            const kg_sample_request_t *q = &reqs[done + rows];
            if (n_pens + penalty_bound(s, q) > s->pen_cap) {
                break;
            }
            const kg_sampling_params_t *p = q->params;
            kg_cuda_sample_row_t *r = &s->h_rows[rows];
            r->u = p->temperature > 0.0f ? kg_rng_uniform(q->rng) : 0.0;
            r->temperature = p->temperature;
            r->top_p = p->top_p;
            r->min_p = p->min_p;
            r->rep = p->repetition_penalty;
            r->freq = p->frequency_penalty;
            r->pres = p->presence_penalty;
            r->top_k = p->top_k;
            r->n_logprobs = p->n_logprobs;
            r->pen_off = n_pens;
            pack_penalties(s, q, &n_pens);
            r->pen_n = n_pens - r->pen_off;
            rows++;
        }
        KG_CUDA_CHECK(cudaMemcpyAsync(s->d_rows, s->h_rows, (size_t)rows * sizeof(*s->h_rows),
                                      cudaMemcpyHostToDevice, stream));
        if (n_pens > 0) {
            KG_CUDA_CHECK(cudaMemcpyAsync(s->d_pens, s->h_pens, (size_t)n_pens * sizeof(*s->h_pens),
                                          cudaMemcpyHostToDevice, stream));
        }
        sample_kernel<<<rows, S_THREADS, 0, stream>>>(d_logits + (size_t)done * s->n_vocab,
                                                      s->n_vocab, s->d_rows, s->d_pens, s->d_res);
        KG_CUDA_CHECK_LAUNCH();
        KG_CUDA_CHECK(cudaMemcpyAsync(s->h_res, s->d_res, (size_t)rows * sizeof(*s->h_res),
                                      cudaMemcpyDeviceToHost, stream));
        KG_CUDA_CHECK(cudaStreamSynchronize(stream));
        memcpy(out + done, s->h_res, (size_t)rows * sizeof(*out));
        done += rows;
    }
    return KG_OK;
}
