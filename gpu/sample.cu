/* sample: the device sampler, several blocks per row.
 *
 * One idea: one sampling pass, six launches that share its key order, its
 * block primitives and its argument block, and the host code that runs
 * them in order (kg_cuda_sampler_run); split apart, each half would state
 * only part of the contract the other relies on.
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
 * One total order ranks candidates: higher logit first, then lower id (the
 * 64-bit key: orderable logit bits << 32 | ~id). Top-k and top-p both keep
 * a best-first prefix of that order, so together they come down to one
 * floor key; min-p is a logit threshold on top.
 *
 * Six launches per group of rows, the vocabulary cut into chunks of about
 * 4096 so a 128k row is spread over 32 blocks wherever a pass reads it:
 *   1. chunk stats (rows x chunks): sanitise in place, best key and the sum
 *      of e^(l - chunk max);
 *   2. row (one block a row): log-sum-exp from the chunk stats in chunk
 *      order, top-n logprobs, penalties, the greedy pick; top-k > 64 and
 *      top-k + top-p are settled here (a radix select over per-warp
 *      histograms, then the k best gathered and sorted once);
 *   3. chunk filter (rows x chunks): for top-k <= 64 each chunk's k best;
 *      for top-p alone the probability mass per logit bucket, in 2^-44
 *      fixed point added with integer atomics, so the sum is the same
 *      whatever order the blocks and threads run in (deterministic top-p);
 *   4. row: merge the chunks' candidates, or find the bucket where the
 *      mass from the top reaches p and walk it sorted (integer sums:
 *      exact and ordered);
 *   5. chunk weights (rows x chunks): the sum of the survivors' weights
 *      per chunk, in a fixed order;
 *   6. row: the chunk where the running sum passes u (in chunk order),
 *      then the walk inside it in id order.
 * Every float sum has a fixed order (thread strides and block trees), so a
 * row's result never depends on scheduling. Built with --fmad=false so
 * every product rounds as in the C code. */
#include "sample.cuh"

#include <float.h>
#include <limits.h>
#include <string.h>

#define CHUNK_TARGET   4096
#define MAX_CHUNKS     64
#define ROW_THREADS    512
#define CHUNK_THREADS  256
#define FILTER_THREADS 128 /* 4 warps: one mass histogram each */
#define SORT_N         2048
#define WALK_N         1024
#define ITEMS          4   /* ids per thread per tile of an id-order walk */
#define LOCAL_K        128 /* top-k up to this goes through per-chunk candidates */
#define HIST_B         KG_SAMPLER_HIST_BUCKETS
#define HIST_R         KG_SAMPLER_HIST_RANGE
#define FIXED_ONE      17592186044416.0 /* 2^44: mass in fixed point; 2^17 tokens stay < 2^63 */
#define NO_BOUND       0xFFFFFFFFFFFFFFFFull

typedef unsigned long long u64;

enum {
    MODE_DONE = 0,   /* the token is known (greedy, or nothing left to draw from) */
    MODE_CUT,        /* floor and threshold known: draw */
    MODE_TOPK_LOCAL, /* top-k <= LOCAL_K: chunk candidates, then row 4 */
    MODE_TOPP_HIST,  /* top-p alone: chunk mass histogram, then row 4 */
};

struct kg_cuda_row_state {
    int mode;
    int32_t token;
    u64 best, floor; /* best key after the penalties; keep keys >= floor */
    float max, inv_t, thr;
    int use_thr;
    double lse;
    int all_masked;
};

typedef struct chunk_out {
    u64 best;       /* stage 1: best key of the chunk */
    double sum;     /* stage 1: sum of e^(l - chunk max); stage 5: survivors' weights */
    int32_t last_w; /* stage 5: highest id with weight > 0, or -1 */
    int32_t pad;
} chunk_out_t;

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
    return b >= HIST_B ? HIST_B - 1 : b;
}

/* Fixed-point mass of a logit at temperature 1 (top-p works on those). */
__device__ __forceinline__ u64 fixed_mass(float l, float max) {
    return (u64)((double)expf(l - max) * FIXED_ONE);
}

/* kg_sampler.c exp_step: e^((l - max) / T) for a survivor, the max exactly
 * 1, -inf exactly 0. */
__device__ __forceinline__ double weight_of(float l, int32_t id, const kg_cuda_row_state_t &rs) {
    if (make_key(l, id) < rs.floor || (rs.use_thr && !(l >= rs.thr))) {
        return 0.0;
    }
    const float d = l - rs.max;
    const float e = d == 0.0f ? 1.0f : d == -INFINITY ? 0.0f : expf(d * rs.inv_t);
    return (double)e;
}

// ---- block primitives (blockDim.x a multiple of 32, at most 1024) ----

typedef struct red_smem {
    u64 u[32];
    double d[32];
    int32_t i[4];
} red_smem_t;

__device__ u64 block_max_u64(u64 x, red_smem_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y > x ? y : x;
    }
    __syncthreads();
    if (lane == 0) {
        sm->u[warp] = x;
    }
    __syncthreads();
    x = lane < nw ? sm->u[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y > x ? y : x;
    }
    return x;
}

/* Sum over the block in a fixed tree; every thread gets it. */
__device__ double block_sum_d(double x, red_smem_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = kg_warp_sum_d(x);
    __syncthreads();
    if (lane == 0) {
        sm->d[warp] = x;
    }
    __syncthreads();
    x = lane < nw ? sm->d[lane] : 0.0;
    return kg_warp_sum_d(x);
}

/* Exclusive prefix sum over the block in thread order; *total gets the sum. */
__device__ double block_excl_scan_d(double x, double *total, red_smem_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
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
        sm->d[warp] = inc;
    }
    __syncthreads();
    if (warp == 0) {
        double v = lane < nw ? sm->d[lane] : 0.0;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) {
                v += y;
            }
        }
        sm->d[lane] = v;
    }
    __syncthreads();
    *total = sm->d[nw - 1];
    const double r = (warp > 0 ? sm->d[warp - 1] : 0.0) + excl;
    __syncthreads(); /* d is reused */
    return r;
}

/* Sort k[0..n) descending (bitonic network; n a power of two). */
__device__ void bitonic_desc(u64 *k, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
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

/* Radix-select scratch: one 256-bin histogram per warp (no contention
 * between warps on the hot bins of a peaked distribution). */
typedef struct radix_smem {
    int32_t whist[ROW_THREADS / 32][256];
    int32_t hist[256];
    int32_t sel[4];
} radix_smem_t;

/* Threshold T such that exactly min(r, eligible) of the keys key_of(i),
 * i in [0, n), below `bound` (0 keys are not eligible) are >= T; 1 when all
 * of them are. An MSB-first radix select, 8 bits a pass, stopping as soon
 * as the keys sharing the current prefix are exactly the ones still
 * needed. r >= 1. */
template <class KeyOf>
__device__ u64 radix_select(KeyOf key_of, int32_t n, u64 bound, int32_t r, radix_smem_t *sm) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 prefix = 0, mask = 0;
    int32_t need = r;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < nw * 256; i += blockDim.x) {
            sm->whist[i / 256][i % 256] = 0;
        }
        __syncthreads();
        for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const u64 k = key_of(i);
            if (k == 0 || k >= bound || (k & mask) != prefix) {
                continue;
            }
            atomicAdd(&sm->whist[warp][(k >> shift) & 255], 1);
        }
        __syncthreads();
        for (int d = threadIdx.x; d < 256; d += blockDim.x) {
            int32_t c = 0;
            for (int w = 0; w < nw; w++) {
                c += sm->whist[w][d];
            }
            sm->hist[d] = c;
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
            sm->sel[0] = d;
            sm->sel[1] = need - c;
            sm->sel[2] = c + sm->hist[d] < need;  /* fewer eligible than r */
            sm->sel[3] = sm->hist[d] == need - c; /* this prefix is exactly what is left */
        }
        __syncthreads();
        const int32_t d = sm->sel[0];
        const bool short_of = sm->sel[2] != 0, exact = sm->sel[3] != 0;
        need = sm->sel[1];
        __syncthreads(); /* the next pass rewrites the histograms and sel */
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

/* The keys in [floor, bound) (at most cap of them by construction of floor)
 * into keys[], sorted best first, padded with 0 to the sort size `cap` (a
 * power of two). Returns their count. */
template <class KeyOf>
__device__ int32_t gather_sorted(
    KeyOf key_of, int32_t n, u64 bound, u64 floor, u64 *keys, int32_t cap, int32_t *counter) {
    if (threadIdx.x == 0) {
        *counter = 0;
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const u64 k = key_of(i);
        if (k != 0 && k < bound && k >= floor) {
            const int32_t slot = atomicAdd(counter, 1);
            if (slot < cap) {
                keys[slot] = k;
            }
        }
    }
    __syncthreads();
    const int32_t cnt = min(*counter, cap);
    for (int32_t i = cnt + threadIdx.x; i < cap; i += blockDim.x) {
        keys[i] = 0;
    }
    __syncthreads();
    bitonic_desc(keys, cap);
    return cnt;
}

// ---- 1. chunk stats ----

typedef struct sample_args {
    float *logits;
    int32_t n_vocab, n_chunks, chunk;
    const kg_cuda_sample_row_t *rows;
    kg_cuda_pen_t *pens;
    kg_cuda_row_state_t *state;
    chunk_out_t *chunks; /* (rows, n_chunks) */
    u64 *hist;           /* (rows, HIST_B) */
    u64 *cand;           /* (rows, n_chunks, LOCAL_K) */
    kg_sample_result_t *res;
} sample_args_t;

__global__ void __launch_bounds__(CHUNK_THREADS) sample_stats_kernel(sample_args_t a) {
    __shared__ red_smem_t sm;
    const int32_t row = blockIdx.y, c = blockIdx.x;
    float *l = a.logits + (int64_t)row * a.n_vocab;
    const int32_t lo = c * a.chunk, hi = min(a.n_vocab, lo + a.chunk);
    u64 best = 0;
    for (int32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float x = l[i], y = sanitize(x);
        if (!(y == x)) {
            l[i] = y;
        }
        const u64 k = make_key(y, i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, &sm);
    const float m = key_logit(best);
    double sum = 0.0;
    if (m != -INFINITY) {
        for (int32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            sum += (double)expf(l[i] - m);
        }
    }
    sum = block_sum_d(sum, &sm);
    if (threadIdx.x == 0) {
        chunk_out_t *o = &a.chunks[(int64_t)row * a.n_chunks + c];
        o->best = best;
        o->sum = sum;
    }
}

// ---- 2. row: lse, logprobs, penalties, greedy, the row-local filters ----

typedef struct row_smem {
    red_smem_t red;
    radix_smem_t rad;
    u64 keys[SORT_N];
    int32_t counter;
    float f0;
} row_smem_t;

/* Top-p along keys[0..cnt) sorted best first: add e^(l - max) to *cum and
 * return the first index where the sum reaches target, or -1. */
__device__ int32_t
walk_sorted(const u64 *keys, int32_t cnt, float max, double target, double *cum, row_smem_t *sm) {
    constexpr int PER = SORT_N / ROW_THREADS;
    double w[PER], local = 0.0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int32_t i = threadIdx.x * PER + j;
        w[j] = i < cnt ? (double)expf(key_logit(keys[i]) - max) : 0.0;
        local += w[j];
    }
    double total;
    double run = *cum + block_excl_scan_d(local, &total, &sm->red);
    if (threadIdx.x == 0) {
        sm->counter = INT_MAX;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int32_t i = threadIdx.x * PER + j;
        if (i < cnt) {
            run += w[j];
            if (run >= target) {
                atomicMin(&sm->counter, i);
                break;
            }
        }
    }
    __syncthreads();
    const int32_t found = sm->counter == INT_MAX ? -1 : sm->counter;
    *cum += total;
    __syncthreads();
    return found;
}

/* top-k with k > LOCAL_K, and top-k + top-p, over the whole row. */
__device__ u64
row_top_k(const float *l, int32_t n, const kg_cuda_sample_row_t &p, float max, row_smem_t *sm) {
    auto key_of = [&](int32_t i) { return make_key(l[i], i); };
    const u64 tk = radix_select(key_of, n, NO_BOUND, p.top_k, &sm->rad);
    if (!(p.top_p < 1.0f)) {
        return tk;
    }
    /* top_p_sorted: the shortest best-first prefix of the k whose mass
     * reaches top_p of theirs. The k best are gathered and sorted in
     * chunks of SORT_N, best first: one chunk when k <= SORT_N. */
    double z = 0.0;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (make_key(l[i], i) >= tk) {
            z += (double)expf(l[i] - max);
        }
    }
    const double target = (double)p.top_p * block_sum_d(z, &sm->red);
    double cum = 0.0;
    u64 bound = NO_BOUND, floor = tk;
    for (;;) {
        u64 t = tk;
        if (p.top_k > SORT_N) {
            /* the next SORT_N below bound */
            t = radix_select(key_of, n, bound, SORT_N, &sm->rad);
            t = t < tk ? tk : t;
        }
        const int32_t cnt = gather_sorted(key_of, n, bound, t, sm->keys, SORT_N, &sm->counter);
        if (cnt == 0) {
            break;
        }
        const int32_t at = walk_sorted(sm->keys, cnt, max, target, &cum, sm);
        if (at >= 0) {
            floor = sm->keys[at];
            break;
        }
        floor = sm->keys[cnt - 1];
        if (t == tk) {
            break;
        }
        bound = sm->keys[cnt - 1];
    }
    return floor;
}

__global__ void __launch_bounds__(ROW_THREADS) sample_row_kernel(sample_args_t a) {
    __shared__ row_smem_t sm;
    const int32_t row = blockIdx.x, n = a.n_vocab;
    float *l = a.logits + (int64_t)row * n;
    const kg_cuda_sample_row_t p = a.rows[row];
    kg_cuda_row_state_t *rs = &a.state[row];
    kg_sample_result_t *out = a.res + row;
    const int tid = threadIdx.x;

    /* log-sum-exp of the raw row, the chunks in order */
    const chunk_out_t *co = a.chunks + (int64_t)row * a.n_chunks;
    u64 best = 0;
    for (int32_t c = 0; c < a.n_chunks; c++) {
        best = co[c].best > best ? co[c].best : best;
    }
    const bool all_masked = key_logit(best) == -INFINITY;
    double lse;
    if (all_masked) {
        /* nothing usable: every token counts as 0, a uniform distribution */
        for (int32_t i = tid; i < n; i += blockDim.x) {
            l[i] = 0.0f;
        }
        __syncthreads();
        best = make_key(0.0f, 0);
        lse = log((double)n);
    } else {
        const float m = key_logit(best);
        double z = 0.0;
        for (int32_t c = 0; c < a.n_chunks; c++) {
            const float cm = key_logit(co[c].best);
            if (cm != -INFINITY) {
                z += co[c].sum * exp((double)cm - (double)m);
            }
        }
        lse = (double)m + log(z);
    }

    /* top-n logprobs of the raw logits */
    int32_t want = p.n_logprobs < KG_MAX_LOGPROBS ? p.n_logprobs : KG_MAX_LOGPROBS;
    want = want < n ? want : n;
    auto key_of = [&](int32_t i) { return make_key(l[i], i); };
    if (want > 0) {
        const u64 t = radix_select(key_of, n, NO_BOUND, want, &sm.rad);
        const int32_t cnt = gather_sorted(key_of, n, NO_BOUND, t, sm.keys, 32, &sm.counter);
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

    /* penalties (distinct tokens, so no two threads touch one logit) */
    bool best_hit = false;
    for (int32_t j = tid; j < p.pen_n; j += blockDim.x) {
        kg_cuda_pen_t *pe = a.pens + p.pen_off + j;
        float x = l[pe->tok];
        pe->raw = x;
        if (pe->rep) {
            x = sanitize(x > 0.0f ? x / p.rep : x * p.rep);
        }
        if (pe->count > 0) {
            x = sanitize(x - ((float)pe->count * p.freq + p.pres));
        }
        l[pe->tok] = x;
        best_hit = best_hit || pe->tok == key_id(best);
    }
    if (p.pen_n > 0) {
        if (tid == 0) {
            sm.counter = 0;
        }
        __syncthreads();
        if (best_hit) {
            atomicMax(&sm.counter, 1); /* an atomic: racecheck sees no write-write race */
        }
        __syncthreads();
        u64 nb = 0;
        if (sm.counter) {
            /* the best token itself moved: look at everything again */
            for (int32_t i = tid; i < n; i += blockDim.x) {
                const u64 k = make_key(l[i], i);
                nb = k > nb ? k : nb;
            }
        } else {
            nb = tid == 0 ? best : 0;
            for (int32_t j = tid; j < p.pen_n; j += blockDim.x) {
                const int32_t tok = a.pens[p.pen_off + j].tok;
                const u64 k = make_key(l[tok], tok);
                nb = k > nb ? k : nb;
            }
        }
        best = block_max_u64(nb, &sm.red);
    }

    /* the pick, or what the next stages need */
    const float max = key_logit(best);
    kg_cuda_row_state_t st;
    st.token = key_id(best);
    st.best = best;
    st.floor = 1;
    st.max = max;
    st.inv_t = 1.0f / p.temperature;
    st.use_thr = p.min_p > 0.0f;
    st.thr = p.min_p >= 1.0f ? max : max + logf(p.min_p);
    st.lse = lse;
    st.all_masked = all_masked;
    if (!(p.temperature > 0.0f) || max == -INFINITY) {
        st.mode = MODE_DONE; /* greedy, or only -inf left: the best alone */
    } else if (p.top_k > 0 && p.top_k < n) {
        if (p.top_k <= LOCAL_K) {
            st.mode = MODE_TOPK_LOCAL;
        } else {
            st.mode = MODE_CUT;
            st.floor = row_top_k(l, n, p, max, &sm);
        }
    } else if (p.top_p < 1.0f) {
        st.mode = MODE_TOPP_HIST;
        for (int i = tid; i < HIST_B; i += blockDim.x) {
            a.hist[(int64_t)row * HIST_B + i] = 0;
        }
    } else {
        st.mode = MODE_CUT;
    }
    if (tid == 0) {
        *rs = st;
    }
}

// ---- 3. chunk filter: local top-k candidates, or the top-p mass ----

typedef struct filter_smem {
    union { /* one or the other, by the row's mode */
        radix_smem_t rad;
        u64 mass[FILTER_THREADS / 32][HIST_B];
    } u;
    int32_t counter;
} filter_smem_t;

__global__ void __launch_bounds__(FILTER_THREADS) sample_filter_kernel(sample_args_t a) {
    __shared__ filter_smem_t sm;
    const int32_t row = blockIdx.y, c = blockIdx.x;
    const kg_cuda_row_state_t rs = a.state[row];
    if (rs.mode != MODE_TOPK_LOCAL && rs.mode != MODE_TOPP_HIST) {
        return;
    }
    const float *l = a.logits + (int64_t)row * a.n_vocab;
    const int32_t lo = c * a.chunk, n = min(a.n_vocab, lo + a.chunk) - lo;
    const int warp = threadIdx.x >> 5;
    if (rs.mode == MODE_TOPK_LOCAL) {
        const int32_t k = a.rows[row].top_k;
        auto key_of = [&](int32_t i) { return make_key(l[lo + i], lo + i); };
        const u64 t = radix_select(key_of, n, NO_BOUND, k, &sm.u.rad);
        u64 *cand = a.cand + ((int64_t)row * a.n_chunks + c) * LOCAL_K;
        if (threadIdx.x == 0) {
            sm.counter = 0;
        }
        __syncthreads();
        for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const u64 key = key_of(i);
            if (key >= t) {
                const int32_t slot = atomicAdd(&sm.counter, 1);
                if (slot < LOCAL_K) {
                    cand[slot] = key;
                }
            }
        }
        __syncthreads();
        for (int32_t i = min(sm.counter, LOCAL_K) + threadIdx.x; i < LOCAL_K; i += blockDim.x) {
            cand[i] = 0;
        }
        return;
    }
    /* top-p: mass per bucket of [max - HIST_R, max], one histogram per warp,
     * integers: the totals do not depend on the order of the additions */
    for (int i = threadIdx.x; i < (FILTER_THREADS / 32) * HIST_B; i += blockDim.x) {
        sm.u.mass[i / HIST_B][i % HIST_B] = 0;
    }
    __syncthreads();
    const float hlo = rs.max - HIST_R, scale = (float)HIST_B / HIST_R;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = l[lo + i];
        const u64 m = fixed_mass(x, rs.max);
        if (m != 0) {
            atomicAdd(&sm.u.mass[warp][hist_bucket(x, hlo, scale)], m);
        }
    }
    __syncthreads();
    u64 *hist = a.hist + (int64_t)row * HIST_B;
    for (int b = threadIdx.x; b < HIST_B; b += blockDim.x) {
        u64 m = 0;
        for (int w = 0; w < FILTER_THREADS / 32; w++) {
            m += sm.u.mass[w][b];
        }
        if (m != 0) {
            atomicAdd(&hist[b], m);
        }
    }
}

// ---- 4. row: the cut from the chunks' results ----

__global__ void __launch_bounds__(ROW_THREADS) sample_cut_kernel(sample_args_t a) {
    __shared__ row_smem_t sm;
    const int32_t row = blockIdx.x, n = a.n_vocab;
    kg_cuda_row_state_t *rs = &a.state[row];
    const int mode = rs->mode;
    if (mode != MODE_TOPK_LOCAL && mode != MODE_TOPP_HIST) {
        return;
    }
    const float *l = a.logits + (int64_t)row * n;
    const kg_cuda_sample_row_t p = a.rows[row];
    const float max = rs->max;
    const int tid = threadIdx.x;
    u64 floor = 1;
    if (mode == MODE_TOPK_LOCAL) {
        /* the k best of every chunk hold the k best of the row */
        const u64 *cand = a.cand + (int64_t)row * a.n_chunks * LOCAL_K;
        const int32_t nc = a.n_chunks * LOCAL_K;
        auto key_of = [&](int32_t i) { return cand[i]; };
        const u64 tk = radix_select(key_of, nc, NO_BOUND, p.top_k, &sm.rad);
        /* tk may have low bits cut off: it is exact for the candidates, not
         * for the row; the k-th candidate itself is */
        const int32_t cnt = gather_sorted(key_of, nc, NO_BOUND, tk, sm.keys, SORT_N, &sm.counter);
        floor = sm.keys[cnt - 1];
        if (p.top_p < 1.0f) {
            double z = 0.0;
            for (int32_t i = tid; i < cnt; i += blockDim.x) {
                z += (double)expf(key_logit(sm.keys[i]) - max);
            }
            /* summed in sorted order per thread stride, then a fixed tree */
            const double target = (double)p.top_p * block_sum_d(z, &sm.red);
            double cum = 0.0;
            const int32_t at = walk_sorted(sm.keys, cnt, max, target, &cum, &sm);
            floor = at >= 0 ? sm.keys[at] : sm.keys[cnt - 1];
        }
    } else {
        /* top-p alone: the bucket where the mass from the top reaches p,
         * then that bucket sorted, in exact integer sums */
        const u64 *hist = a.hist + (int64_t)row * HIST_B;
        if (tid == 0) {
            u64 z = 0;
            for (int b = 0; b < HIST_B; b++) {
                z += hist[b];
            }
            const u64 target = (u64)((double)p.top_p * (double)z);
            u64 cum = 0;
            int e = HIST_B - 1;
            for (; e > 0; e--) {
                if (cum + hist[e] >= target) {
                    break;
                }
                cum += hist[e];
            }
            sm.red.u[0] = cum;
            sm.red.u[1] = target;
            sm.red.i[0] = e;
        }
        __syncthreads();
        u64 cum = sm.red.u[0];
        const u64 target = sm.red.u[1];
        const int32_t edge = sm.red.i[0];
        __syncthreads();
        const float hlo = max - HIST_R, scale = (float)HIST_B / HIST_R;
        auto key_of = [&](int32_t i) {
            return hist_bucket(l[i], hlo, scale) == edge && fixed_mass(l[i], max) != 0
                       ? make_key(l[i], i)
                       : (u64)0;
        };
        /* one pass collects the edge bucket (a few hundred tokens as a rule);
         * only when it holds more than SORT_N do radix selects cut it into
         * sorted runs */
        u64 bound = NO_BOUND, t = 1;
        if (tid == 0) {
            sm.counter = 0;
        }
        __syncthreads();
        for (int32_t i = tid; i < n; i += blockDim.x) {
            const u64 k = key_of(i);
            if (k != 0) {
                const int32_t slot = atomicAdd(&sm.counter, 1);
                if (slot < SORT_N) {
                    sm.keys[slot] = k;
                }
            }
        }
        __syncthreads();
        const bool fits = sm.counter <= SORT_N;
        floor = 0;
        for (;;) {
            int32_t cnt;
            if (fits) {
                cnt = sm.counter;
                for (int32_t i = cnt + tid; i < SORT_N; i += blockDim.x) {
                    sm.keys[i] = 0;
                }
                __syncthreads();
                bitonic_desc(sm.keys, SORT_N);
            } else {
                t = radix_select(key_of, n, bound, SORT_N, &sm.rad);
                cnt = gather_sorted(key_of, n, bound, t, sm.keys, SORT_N, &sm.counter);
            }
            if (cnt == 0) {
                break;
            }
            /* integer walk: one thread, at most SORT_N entries */
            if (tid == 0) {
                int32_t at = -1;
                for (int32_t i = 0; i < cnt; i++) {
                    cum += fixed_mass(key_logit(sm.keys[i]), max);
                    if (cum >= target) {
                        at = i;
                        break;
                    }
                }
                sm.red.i[1] = at;
                sm.red.u[2] = cum;
            }
            __syncthreads();
            const int32_t at = sm.red.i[1];
            cum = sm.red.u[2];
            floor = sm.keys[at >= 0 ? at : cnt - 1];
            __syncthreads();
            if (fits || at >= 0 || cnt < SORT_N) {
                break;
            }
            bound = floor;
        }
        floor = floor ? floor : 1;
    }
    if (tid == 0) {
        rs->floor = floor;
        rs->mode = MODE_CUT;
    }
}

// ---- 5. chunk weights ----

__global__ void __launch_bounds__(CHUNK_THREADS) sample_weights_kernel(sample_args_t a) {
    __shared__ red_smem_t sm;
    const int32_t row = blockIdx.y, c = blockIdx.x;
    const kg_cuda_row_state_t rs = a.state[row];
    if (rs.mode != MODE_CUT) {
        return;
    }
    const float *l = a.logits + (int64_t)row * a.n_vocab;
    const int32_t lo = c * a.chunk, hi = min(a.n_vocab, lo + a.chunk);
    double z = 0.0;
    int32_t last = -1;
    for (int32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double w = weight_of(l[i], i, rs);
        z += w;
        last = w > 0.0 ? i : last;
    }
    z = block_sum_d(z, &sm);
    for (int o = 16; o > 0; o >>= 1) {
        last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    }
    if (threadIdx.x == 0) {
        sm.i[0] = -1;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&sm.i[0], last);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        chunk_out_t *o = &a.chunks[(int64_t)row * a.n_chunks + c];
        o->sum = z;
        o->last_w = sm.i[0];
    }
}

// ---- 6. row: the draw and the result ----

__global__ void __launch_bounds__(ROW_THREADS) sample_pick_kernel(sample_args_t a) {
    __shared__ red_smem_t sm;
    const int32_t row = blockIdx.x;
    const float *l = a.logits + (int64_t)row * a.n_vocab;
    const kg_cuda_sample_row_t p = a.rows[row];
    const kg_cuda_row_state_t rs = a.state[row];
    kg_sample_result_t *out = a.res + row;
    const int tid = threadIdx.x;
    int32_t token = rs.token;
    if (rs.mode == MODE_CUT) {
        /* the chunk where the running sum passes u: chunks in order */
        const chunk_out_t *co = a.chunks + (int64_t)row * a.n_chunks;
        double z = 0.0;
        for (int32_t c = 0; c < a.n_chunks; c++) {
            z += co[c].sum;
        }
        const double u = p.u * z;
        double cum = 0.0;
        int32_t c = 0, last_c = -1;
        for (; c < a.n_chunks; c++) {
            if (co[c].last_w >= 0) {
                last_c = c;
            }
            if (cum + co[c].sum > u) {
                break;
            }
            cum += co[c].sum;
        }
        if (c < a.n_chunks) {
            /* walk chunk c in id order, tiles with a block prefix scan */
            const int32_t lo = c * a.chunk, hi = min(a.n_vocab, lo + a.chunk);
            token = -1;
            for (int32_t base = lo; base < hi && token < 0; base += blockDim.x * ITEMS) {
                double w[ITEMS], local = 0.0;
#pragma unroll
                for (int j = 0; j < ITEMS; j++) {
                    const int32_t i = base + tid * ITEMS + j;
                    w[j] = i < hi ? weight_of(l[i], i, rs) : 0.0;
                    local += w[j];
                }
                double total;
                double run = cum + block_excl_scan_d(local, &total, &sm);
                if (tid == 0) {
                    sm.i[0] = INT_MAX;
                }
                __syncthreads();
#pragma unroll
                for (int j = 0; j < ITEMS; j++) {
                    const int32_t i = base + tid * ITEMS + j;
                    if (w[j] > 0.0) {
                        run += w[j];
                        if (u < run) {
                            atomicMin(&sm.i[0], i);
                            break;
                        }
                    }
                }
                __syncthreads();
                token = sm.i[0] == INT_MAX ? -1 : sm.i[0];
                __syncthreads();
                cum += total;
            }
            if (token < 0) {
                /* rounding: the chunk's sum said yes, its walk no */
                token = co[c].last_w;
            }
        }
        if (token < 0) {
            /* rounding ran past the end: the last token with any weight */
            token = last_c >= 0 ? co[last_c].last_w : key_id(rs.best);
        }
    }
    /* logprob of the raw logit at the token */
    if (tid == 0) {
        sm.d[0] = rs.all_masked ? 0.0 : (double)l[token];
    }
    __syncthreads();
    for (int32_t j = tid; j < p.pen_n; j += blockDim.x) {
        if (!rs.all_masked && a.pens[p.pen_off + j].tok == token) {
            sm.d[0] = (double)a.pens[p.pen_off + j].raw;
        }
    }
    __syncthreads();
    if (tid == 0) {
        out->token = token;
        out->logprob = (float)(sm.d[0] - rs.lse);
    }
}

// ---- host side ----

kg_status_t kg_cuda_sampler_init(kg_cuda_sampler_t *s, int32_t n_vocab, int32_t max_rows) {
    memset(s, 0, sizeof(*s));
    s->n_vocab = n_vocab;
    s->max_rows = max_rows;
    s->pen_cap = 2 * n_vocab > 65536 ? 2 * n_vocab : 65536;
    s->n_chunks = (n_vocab + CHUNK_TARGET - 1) / CHUNK_TARGET;
    s->n_chunks = s->n_chunks > MAX_CHUNKS ? MAX_CHUNKS : s->n_chunks;
    s->chunk = (n_vocab + s->n_chunks - 1) / s->n_chunks;
    s->chunk = (s->chunk + 31) & ~31;
    s->n_chunks = (n_vocab + s->chunk - 1) / s->chunk;
    const size_t rows_size = (size_t)max_rows * sizeof(kg_cuda_sample_row_t);
    const size_t pens_size = (size_t)s->pen_cap * sizeof(kg_cuda_pen_t);
    const size_t res_size = (size_t)max_rows * sizeof(kg_sample_result_t);
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_rows, rows_size));
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_pens, pens_size));
    KG_CUDA_CHECK(cudaMallocHost((void **)&s->h_res, res_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_rows, rows_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_pens, pens_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_res, res_size));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_state, (size_t)max_rows * sizeof(kg_cuda_row_state_t)));
    KG_CUDA_CHECK(
        cudaMalloc(&s->d_chunk, (size_t)max_rows * (size_t)s->n_chunks * sizeof(chunk_out_t)));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_hist, (size_t)max_rows * HIST_B * sizeof(u64)));
    KG_CUDA_CHECK(cudaMalloc((void **)&s->d_cand,
                             (size_t)max_rows * (size_t)s->n_chunks * LOCAL_K * sizeof(u64)));
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
    cudaFree(s->d_state);
    cudaFree(s->d_chunk);
    cudaFree(s->d_hist);
    cudaFree(s->d_cand);
    free(s->idx);
    memset(s, 0, sizeof(*s));
}

size_t kg_cuda_sampler_device_size(const kg_cuda_sampler_t *s) {
    const size_t per_row =
        sizeof(kg_cuda_sample_row_t) + sizeof(kg_sample_result_t) + sizeof(kg_cuda_row_state_t) +
        (size_t)s->n_chunks * (sizeof(chunk_out_t) + LOCAL_K * sizeof(u64)) + HIST_B * sizeof(u64);
    return (size_t)s->max_rows * per_row + (size_t)s->pen_cap * sizeof(kg_cuda_pen_t);
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
                                kg_sample_result_t *out,
                                int32_t *bad_row) {
    int32_t done = 0;
    *bad_row = -1;
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
        sample_args_t a;
        a.logits = d_logits + (size_t)done * s->n_vocab;
        a.n_vocab = s->n_vocab;
        a.n_chunks = s->n_chunks;
        a.chunk = s->chunk;
        a.rows = s->d_rows;
        a.pens = s->d_pens;
        a.state = s->d_state;
        a.chunks = (chunk_out_t *)s->d_chunk;
        a.hist = s->d_hist;
        a.cand = s->d_cand;
        a.res = s->d_res;
        const dim3 per_chunk((unsigned)s->n_chunks, (unsigned)rows);
        sample_stats_kernel<<<per_chunk, CHUNK_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        sample_row_kernel<<<rows, ROW_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        sample_filter_kernel<<<per_chunk, FILTER_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        sample_cut_kernel<<<rows, ROW_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        sample_weights_kernel<<<per_chunk, CHUNK_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        sample_pick_kernel<<<rows, ROW_THREADS, 0, stream>>>(a);
        KG_CUDA_CHECK_LAUNCH();
        KG_CUDA_CHECK(cudaMemcpyAsync(s->h_res, s->d_res, (size_t)rows * sizeof(*s->h_res),
                                      cudaMemcpyDeviceToHost, stream));
        KG_CUDA_CHECK(cudaStreamSynchronize(stream));
        memcpy(out + done, s->h_res, (size_t)rows * sizeof(*out));
        for (int32_t r = 0; r < rows; r++) {
            if (out[done + r].token < 0 || out[done + r].token >= s->n_vocab) {
                *bad_row = done + r;
                return KG_ERR_INVALID;
            }
        }
        done += rows;
    }
    return KG_OK;
}
