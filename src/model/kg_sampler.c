/* kg_sampler: penalties, filters and the seeded draw that turn one row of
 * logits into one token id (the order and the rules are in kg_sampler.h).
 *
 * DESIGN: the engine samples every running sequence once per step, so for a
 * 128k vocabulary the cost per call matters as much as a small kernel. The
 * raw logits are copied once (sanitised) into the scratch, indexed by token
 * id; the passes over the whole vocabulary (copy, max, exp and sum) are
 * 8-wide vector kernels, and everything else touches only what it must:
 *   - the raw pass (e^(l - max), needed for the logprobs anyway) is kept and
 *     patched for the few tokens the penalties change, so the filters start
 *     with the probabilities in hand;
 *   - penalties visit the window's tokens, never the vocabulary; their
 *     per-token marks and counts are cleared by visiting the same tokens;
 *   - top-k is a bounded heap over a copy of the candidates; blocks of 8
 *     that cannot enter it are skipped with one vector compare;
 *   - top-p without top-k first takes the best 128 by the same heap, which
 *     settles a peaked distribution; otherwise a histogram of the mass over
 *     logit buckets finds the bucket where the cumulative mass crosses p,
 *     refines inside it, and sorts only the few tokens left at the boundary;
 *   - what top-k/top-p keep is "at least as good as the worst kept", so one
 *     vector pass over the id-ordered logits collects the kept tokens in id
 *     order, with min-p (l_i >= l_max + log(min_p)) as one more compare;
 *   - the draw walks the kept tokens in id order, so the token drawn for a
 *     given u depends only on the kept set and its weights.
 * Ties are broken by the lower token id everywhere, so the result depends
 * only on the logits, the parameters and the RNG state. */
#include "kg_sampler.h"

#include "../core/kg_log.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- random numbers ----

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void kg_rng_seed(kg_rng_t *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        rng->s[i] = splitmix64(&x);
    }
}

static inline uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t kg_rng_next(kg_rng_t *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double kg_rng_uniform(kg_rng_t *rng) {
    return (double)(kg_rng_next(rng) >> 11) * 0x1.0p-53;
}

uint64_t kg_sampler_choice_seed(uint64_t seed, int32_t choice) {
    if (choice <= 0) {
        return seed;
    }
    uint64_t x = seed ^ ((uint64_t)choice * 0xd1342543de82ef95ULL);
    return splitmix64(&x);
}

// ---- logit bias ----

float kg_sampler_biased_logit(const kg_sampling_params_t *p, int32_t token, float logit) {
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token == token) {
            float b = p->logit_bias[i].bias;
            return b <= KG_LOGIT_BIAS_BAN ? -INFINITY : logit + b;
        }
    }
    return logit;
}

// ---- parameters and scratch ----

kg_sampling_params_t kg_sampling_params_default(void) {
    kg_sampling_params_t p = {
        .temperature = 0.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
        .n_logprobs = 0,
    };
    return p;
}

/* Top-p histogram: buckets of equal logit width. The first level spans
 * [l_max - L, l_max] with L from a mass bound (see top_p_unsorted), or
 * [l_max - 40, l_max] when p is too close to 1 for the bound; then
 * everything further below shares bucket 0, whose mass is at most
 * n_vocab * e^-40 of the top token's (the result stays exact if it ever
 * matters, only slower). */
#define HIST_BUCKETS KG_SAMPLER_HIST_BUCKETS
#define HIST_RANGE   KG_SAMPLER_HIST_RANGE
/* Top-p sorts a run of at most this many tokens instead of refining it. */
#define TOP_P_SORT 128

struct kg_sampler_scratch {
    int32_t n_vocab;
    float *val;                       /* (n_vocab) sanitised, penalised logits by token id */
    float *prob;                      /* (n_vocab) unnormalised probabilities (see ref) */
    float *kval;                      /* (n_vocab) candidates the filters reorder: logits */
    int32_t *kidx;                    /* (n_vocab) ... and their token ids */
    int32_t *count;                   /* (n_vocab) output-token counts; zero between calls */
    uint8_t *seen;                    /* (n_vocab) repetition-window marks; zero between calls */
    double hist_mass[HIST_BUCKETS];   /* top-p: probability mass per logit bucket */
    int32_t hist_count[HIST_BUCKETS]; /* ... and tokens per bucket */
    /* After the penalties: prob[i] = e^(val[i] - ref) (temperature 1) over
     * the whole vocabulary in id order and z its sum. The raw pass for the
     * logprobs computes them and the penalties patch the few tokens they
     * touch, so the filters need no second pass over the vocabulary. */
    float ref;
    double z;
};

kg_sampler_scratch_t *kg_sampler_scratch_new(int32_t n_vocab) {
    if (n_vocab <= 0) {
        return NULL;
    }
    kg_sampler_scratch_t *sc = calloc(1, sizeof(*sc));
    if (sc == NULL) {
        goto fail;
    }
    sc->n_vocab = n_vocab;
    sc->val = malloc((size_t)n_vocab * sizeof(*sc->val));
    sc->prob = malloc((size_t)n_vocab * sizeof(*sc->prob));
    sc->kval = malloc((size_t)n_vocab * sizeof(*sc->kval));
    sc->kidx = malloc((size_t)n_vocab * sizeof(*sc->kidx));
    /* calloc: the marks and counts start at zero and every call leaves them so */
    sc->count = calloc((size_t)n_vocab, sizeof(*sc->count));
    sc->seen = calloc((size_t)n_vocab, sizeof(*sc->seen));
    if (sc->val == NULL || sc->prob == NULL || sc->kval == NULL || sc->kidx == NULL ||
        sc->count == NULL || sc->seen == NULL) {
        goto fail;
    }
    return sc;
fail:
    kg_sampler_scratch_free(sc);
    return NULL;
}

void kg_sampler_scratch_free(kg_sampler_scratch_t *sc) {
    if (sc == NULL) {
        return;
    }
    free(sc->val);
    free(sc->prob);
    free(sc->kval);
    free(sc->kidx);
    free(sc->count);
    free(sc->seen);
    free(sc);
}

// ---- vector kernels ----

/* The passes over the whole vocabulary use GCC/clang vector extensions
 * (8 floats: one AVX register, or two SSE ones) instead of relying on the
 * auto-vectoriser, which will not if-convert float selects under the default
 * -ftrapping-math. A short tail is padded to a full vector, so every element
 * goes through the same instructions wherever it sits. Only static
 * functions take or return vectors, so the -Wpsabi note (their calling
 * convention differs with and without AVX) does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline v8f splat(float f) {
    v8f v = {f, f, f, f, f, f, f, f};
    return v;
}

/* m ? a : b, lane by lane (m lanes are all ones or all zeros) */
static inline v8f select8(v8i m, v8f a, v8f b) {
    return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The last n_left < 8 floats, the other lanes set to `pad`. Kept out of the
 * main loops: a variable-size copy there would push the accumulators
 * through memory on every iteration. */
static inline v8f load_tail(const float *p, int32_t n_left, float pad) {
    float f[8];
    for (int i = 0; i < 8; i++) {
        f[i] = i < n_left ? p[i] : pad;
    }
    v8f v;
    memcpy(&v, f, sizeof(v));
    return v;
}

static inline void store_tail(void *p, const void *v, int32_t n_left) {
    memcpy(p, v, (size_t)n_left * sizeof(float));
}

/* Whether any lane of a comparison result is set. */
static inline bool any8(v8i m) {
    uint64_t w[4];
    memcpy(w, &m, sizeof(w));
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}

static inline float hmax8(v8f v) {
    float f[8];
    memcpy(f, &v, sizeof(f));
    float m = f[0];
    for (int i = 1; i < 8; i++) {
        m = f[i] > m ? f[i] : m;
    }
    return m;
}

/* e^x for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, a degree-7
 * polynomial for e^r, 2^n built in the exponent bits). Relative error below
 * 1e-7; x < -87 (where e^x nears FLT_MIN) and -inf give exactly 0. The
 * rounding of n uses the 1.5 * 2^23 trick so no libm call is needed. */
static inline v8f exp8(v8f x) {
    v8i under = x < splat(-87.0f);
    v8f xc = select8(under, splat(-87.0f), x);
    v8f n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v8f r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f y = r * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8f)((v8i)(y * (v8f)bits) & ~under);
}

/* One exp through the same kernel, for the few scalar uses. */
static float exp1(float x) {
    v8f e = exp8(splat(x));
    float f[8];
    memcpy(f, &e, sizeof(f));
    return f[0];
}

/* NaN -> -inf (never chosen), +inf -> FLT_MAX (differences with the max
 * stay finite and the token is still the clear favourite). */
static inline v8f sanitize8(v8f v) {
    v = select8(v != v, splat(-INFINITY), v);
    return select8(v > splat(FLT_MAX), splat(FLT_MAX), v);
}

/* The lanes of tokens i..i+7 that a token bitmask allows (i % 8 == 0). */
static inline v8i mask_lanes(const uint32_t *mask, int32_t i) {
    const int32_t b = (int32_t)((mask[i >> 5] >> (i & 31)) & 0xFFu);
    const v8i bits = {1, 2, 4, 8, 16, 32, 64, 128};
    const v8i all = {b, b, b, b, b, b, b, b};
    return (all & bits) != 0;
}

/* val[i] = the sanitised logits[i], or -inf where `mask` (when not NULL)
 * disallows token i. Returns the max. */
static float load_logits(float *val, const float *logits, const uint32_t *mask, int32_t n) {
    v8f mx = splat(-INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = sanitize8(load8(logits + i));
        if (mask != NULL) {
            v = select8(mask_lanes(mask, i), v, splat(-INFINITY));
        }
        mx = select8(v > mx, v, mx);
        memcpy(val + i, &v, sizeof(v));
    }
    if (i < n) {
        v8f v = sanitize8(load_tail(logits + i, n - i, -INFINITY));
        if (mask != NULL) {
            v = select8(mask_lanes(mask, i), v, splat(-INFINITY));
        }
        mx = select8(v > mx, v, mx);
        store_tail(val + i, &v, n - i);
    }
    return hmax8(mx);
}

/* The max of val[0..n) and, through *first, the first position holding it. */
static float max_at(const float *val, int32_t n, int32_t *first) {
    v8f mx = splat(-INFINITY);
    v8i at = {0};
    v8i id = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = load8(val + i);
        v8i gt = v > mx; /* strict: each lane keeps its earliest max */
        mx = select8(gt, v, mx);
        at = (at & ~gt) | (id & gt);
        id += 8;
    }
    if (i < n) {
        v8f v = load_tail(val + i, n - i, -INFINITY);
        v8i gt = v > mx;
        mx = select8(gt, v, mx);
        at = (at & ~gt) | (id & gt);
    }
    float m = hmax8(mx);
    if (first != NULL) {
        float f[8];
        int32_t a[8];
        memcpy(f, &mx, sizeof(f));
        memcpy(a, &at, sizeof(a));
        int32_t best = n - 1;
        for (int l = 0; l < 8; l++) {
            if (f[l] == m && a[l] < best) {
                best = a[l];
            }
        }
        *first = best;
    }
    return m;
}

/* e^((d) * inv_t) for d = l - l_max: the max gets exactly 1 even when
 * inv_t is infinite, and -inf exactly 0 even when inv_t is 0, so any
 * temperature leaves a valid draw. */
static inline v8f exp_step(v8f d, float inv_t) {
    v8f x = d * inv_t;
    x = select8(x == x, x, splat(0.0f)); /* 0 * inf or -inf * 0: fixed up below */
    v8f e = exp8(x);
    e = select8(d == splat(0.0f), splat(1.0f), e);
    return select8(d < splat(-FLT_MAX), splat(0.0f), e);
}

static inline void add_lanes(v4d *acc, v8f e) {
    v4f lo, hi;
    memcpy(&lo, &e, sizeof(lo));
    memcpy(&hi, (const char *)&e + sizeof(lo), sizeof(hi));
    *acc += __builtin_convertvector(lo, v4d) + __builtin_convertvector(hi, v4d);
}

/* prob[i] = e^((val[i] - max) * inv_t) (prob may be NULL when only the sum
 * is wanted); returns the sum. Runs of 64 vectors are summed in float lanes
 * (error well under 1e-6) and the runs in double, in a fixed order. */
static double exp_sum(float *prob, const float *val, int32_t n, float max, float inv_t) {
    v4d acc = {0.0, 0.0, 0.0, 0.0};
    int32_t i = 0;
    while (i + 8 <= n) {
        v8f run = splat(0.0f);
        int32_t end = n - i >= 512 ? i + 512 : n - (n - i) % 8;
        for (; i < end; i += 8) {
            v8f e = exp_step(load8(val + i) - max, inv_t);
            if (prob != NULL) {
                memcpy(prob + i, &e, sizeof(e));
            }
            run += e;
        }
        add_lanes(&acc, run);
    }
    if (i < n) {
        v8f e = exp_step(load_tail(val + i, n - i, -INFINITY) - max, inv_t);
        if (prob != NULL) {
            store_tail(prob + i, &e, n - i);
        }
        add_lanes(&acc, e);
    }
    double a[4];
    memcpy(a, &acc, sizeof(acc));
    return (a[0] + a[1]) + (a[2] + a[3]);
}

// ---- ordering ----

/* The one total order on candidates: higher logit first, then lower id. */
static inline bool better(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

static inline void swap_cand(float *val, int32_t *idx, int32_t a, int32_t b) {
    float v = val[a];
    val[a] = val[b];
    val[b] = v;
    int32_t t = idx[a];
    idx[a] = idx[b];
    idx[b] = t;
}

/* Sift element i down a heap (val, idx)[0..n) whose root is the worst. */
static void sift_down(float *val, int32_t *idx, int32_t n, int32_t i) {
    float xv = val[i];
    int32_t xi = idx[i];
    for (;;) {
        int32_t w = 2 * i + 1;
        if (w >= n) {
            break;
        }
        if (w + 1 < n && better(val[w], idx[w], val[w + 1], idx[w + 1])) {
            w++;
        }
        if (!better(xv, xi, val[w], idx[w])) {
            break;
        }
        val[i] = val[w];
        idx[i] = idx[w];
        i = w;
    }
    val[i] = xv;
    idx[i] = xi;
}

/* Sort a heap-ordered (val, idx)[0..n) best first (heapsort: the worst
 * goes to the end first). */
static void heap_to_sorted(float *val, int32_t *idx, int32_t n) {
    for (int32_t end = n - 1; end > 0; end--) {
        swap_cand(val, idx, 0, end);
        sift_down(val, idx, end, 0);
    }
}

/* Sort (val, idx)[0..n) best first. */
static void sort_cands(float *val, int32_t *idx, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) {
        sift_down(val, idx, n, i);
    }
    heap_to_sorted(val, idx, n);
}

/* The m best of the id-ordered logits src[0..n) into (val, idx)[0..m),
 * sorted best first. A bounded heap whose root is the worst kept token; a
 * block of 8 with nothing at least as good as the root (nearly all of them
 * once the heap holds good ones) costs one vector compare. */
static void select_top(const float *src, int32_t n, int32_t m, float *val, int32_t *idx) {
    for (int32_t i = 0; i < m; i++) {
        val[i] = src[i];
        idx[i] = i;
    }
    for (int32_t i = m / 2 - 1; i >= 0; i--) {
        sift_down(val, idx, m, i);
    }
    int32_t j = m;
    while (j < n) {
        if (j + 8 <= n && !any8(load8(src + j) >= splat(val[0]))) {
            j += 8;
            continue;
        }
        for (int32_t end = j + 8 < n ? j + 8 : n; j < end; j++) {
            if (better(src[j], j, val[0], idx[0])) {
                val[0] = src[j];
                idx[0] = j;
                sift_down(val, idx, m, 0);
            }
        }
    }
    heap_to_sorted(val, idx, m);
}

// ---- raw logprobs ----

/* Top `want` raw logprobs by an insertion list (want <= 20): scanning ids in
 * ascending order and inserting after equal values keeps ties by lower id.
 * Once the list is full, a block of 8 with nothing above its last entry
 * costs one vector compare. */
static void
top_logprobs(const float *val, int32_t n, int32_t want, double lse, kg_sample_result_t *out) {
    float *lp = out->top_logprob; /* holds raw logits until the end */
    int32_t have = 0;
    int32_t i = 0;
    while (i < n) {
        if (have == want && i + 8 <= n && !any8(load8(val + i) > splat(lp[want - 1]))) {
            i += 8;
            continue;
        }
        for (int32_t end = i + 8 < n ? i + 8 : n; i < end; i++) {
            float x = val[i];
            if (have == want && !(x > lp[want - 1])) {
                continue;
            }
            int32_t pos = have < want ? have++ : want - 1;
            while (pos > 0 && lp[pos - 1] < x) {
                lp[pos] = lp[pos - 1];
                out->top_token[pos] = out->top_token[pos - 1];
                pos--;
            }
            lp[pos] = x;
            out->top_token[pos] = i;
        }
    }
    for (int32_t k = 0; k < have; k++) {
        lp[k] = (float)((double)lp[k] - lse);
    }
    out->n_top = have;
}

// ---- penalties ----

/* NaN -> -inf, +inf -> FLT_MAX, as load_logits does. */
static inline float sanitize(float x) {
    if (x != x) {
        return -INFINITY;
    }
    return x > FLT_MAX ? FLT_MAX : x;
}

/* Set one candidate's logit (still indexed by id) and keep prob/z in step.
 * A logit raised above ref makes z infinite, which prepare() takes as the
 * sign to redo the pass. */
static void set_logit(kg_sampler_scratch_t *sc, int32_t tok, float x) {
    x = sanitize(x);
    sc->z -= sc->prob[tok];
    sc->val[tok] = x;
    sc->prob[tok] = x > sc->ref ? INFINITY : exp1(x - sc->ref);
    sc->z += sc->prob[tok];
}

/* Repetition penalty over toks[from..to): once per distinct token, marked
 * in `seen` (the caller clears the marks over the same range). */
static void penalize_repeats(kg_sampler_scratch_t *sc,
                             int32_t n,
                             const int32_t *toks,
                             int64_t from,
                             int64_t to,
                             float penalty) {
    for (int64_t i = from; i < to; i++) {
        int32_t tok = toks[i];
        if (tok < 0 || tok >= n || sc->seen[tok]) {
            continue;
        }
        sc->seen[tok] = 1;
        float x = sc->val[tok];
        set_logit(sc, tok, x > 0.0f ? x / penalty : x * penalty);
    }
}

static void clear_marks(const int32_t *toks, int64_t from, int64_t to, int32_t n, uint8_t *seen) {
    for (int64_t i = from; i < to; i++) {
        if (toks[i] >= 0 && toks[i] < n) {
            seen[toks[i]] = 0;
        }
    }
}

/* Penalties on val[0..n), which is still indexed by token id. */
static void apply_penalties(const kg_sampling_params_t *p,
                            kg_sampler_scratch_t *sc,
                            int32_t n,
                            const int32_t *prompt,
                            int32_t n_prompt,
                            const int32_t *output,
                            int32_t n_output) {
    float rep = p->repetition_penalty;
    if (rep != 1.0f && rep > 0.0f && p->penalty_last_n != 0) {
        /* The window is the last penalty_last_n tokens of prompt ++ output. */
        int64_t total = (int64_t)n_prompt + n_output;
        int64_t win =
            p->penalty_last_n < 0 || p->penalty_last_n > total ? total : p->penalty_last_n;
        int64_t out_from = win > n_output ? 0 : n_output - win;
        int64_t prompt_from = win > n_output ? n_prompt - (win - n_output) : n_prompt;
        penalize_repeats(sc, n, prompt, prompt_from, n_prompt, rep);
        penalize_repeats(sc, n, output, out_from, n_output, rep);
        clear_marks(prompt, prompt_from, n_prompt, n, sc->seen);
        clear_marks(output, out_from, n_output, n, sc->seen);
    }
    float freq = p->frequency_penalty;
    float pres = p->presence_penalty;
    if (freq != 0.0f || pres != 0.0f) {
        for (int32_t i = 0; i < n_output; i++) {
            if (output[i] >= 0 && output[i] < n) {
                sc->count[output[i]]++;
            }
        }
        /* The second pass applies each distinct token once and clears its count. */
        for (int32_t i = 0; i < n_output; i++) {
            int32_t tok = output[i];
            if (tok < 0 || tok >= n || sc->count[tok] == 0) {
                continue;
            }
            set_logit(sc, tok, sc->val[tok] - ((float)sc->count[tok] * freq + pres));
            sc->count[tok] = 0;
        }
    }
}

// ---- filters ----

/* What top-k and top-p keep is always "every token at least as good as the
 * worst one kept" (in the one total order), so each only has to find that
 * worst token, (t, t_id); one pass over the id-ordered logits then collects
 * the kept tokens in id order, applying min-p on the way. The candidates
 * (kval, kidx) hold the few tokens that are ever sorted. */

/* Top-p over candidates sorted best first: the length of the shortest
 * prefix whose mass reaches p of theirs. */
static int32_t top_p_sorted(const kg_sampler_scratch_t *sc, int32_t n, float top_p) {
    const float *prob = sc->prob;
    const int32_t *kidx = sc->kidx;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        z += prob[kidx[i]];
    }
    double target = (double)top_p * z;
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += prob[kidx[i]];
        if (cum >= target) {
            return i + 1;
        }
    }
    return n;
}

/* The top-p bucket of each lane as a float in [0, HIST_BUCKETS - 1]; its
 * integer part is the bucket. Membership tests compare this same value, so
 * they always agree with the histogram. */
static inline v8f bucket8(v8f v, float lo, float scale) {
    v8f y = (v - lo) * scale;
    y = select8(y > splat(0.0f), y, splat(0.0f));
    return select8(y < splat(HIST_BUCKETS - 1), y, splat(HIST_BUCKETS - 1));
}

/* Mass and count per bucket of val[0..n), whose ids are idx[i] (or i when
 * idx is NULL; prob is by id). */
static void fill_histogram(kg_sampler_scratch_t *sc,
                           const float *val,
                           const int32_t *idx,
                           int32_t n,
                           float lo,
                           float scale) {
    double *mass = sc->hist_mass;
    int32_t *count = sc->hist_count;
    memset(mass, 0, sizeof(sc->hist_mass));
    memset(count, 0, sizeof(sc->hist_count));
    for (int32_t i = 0; i < n; i += 8) {
        int32_t left = n - i;
        v8f v = left >= 8 ? load8(val + i) : load_tail(val + i, left, -INFINITY);
        v8i b = __builtin_convertvector(bucket8(v, lo, scale), v8i);
        int32_t bi[8];
        memcpy(bi, &b, sizeof(bi));
        for (int l = 0; l < 8 && l < left; l++) {
            mass[bi[l]] += sc->prob[idx != NULL ? idx[i + l] : i + l];
            count[bi[l]]++;
        }
    }
}

/* The bucket where the cumulative mass from the top reaches target, adding
 * the mass above it to *cum. If rounding never gets there, the lowest
 * non-empty bucket (everything is kept). Empty buckets are never chosen. */
static int32_t find_edge(const kg_sampler_scratch_t *sc, double *cum, double target) {
    int32_t lowest = HIST_BUCKETS - 1;
    for (int32_t b = HIST_BUCKETS - 1; b >= 0; b--) {
        if (sc->hist_count[b] == 0) {
            continue;
        }
        if (*cum + sc->hist_mass[b] >= target) {
            return b;
        }
        *cum += sc->hist_mass[b];
        lowest = b;
    }
    /* back out the lowest bucket's mass: it is the run to walk */
    *cum -= sc->hist_mass[lowest];
    return lowest;
}

/* Copy the tokens of val[0..n) (ids idx[i], or i when idx is NULL) in
 * bucket `edge` to (kval, kidx)[0..return). In place is fine: the write
 * index never passes the read index. */
static int32_t collect_bucket(kg_sampler_scratch_t *sc,
                              const float *val,
                              const int32_t *idx,
                              int32_t n,
                              float lo,
                              float scale,
                              int32_t edge) {
    const v8f at_edge = splat((float)edge);
    const v8f above_edge = splat((float)(edge + 1));
    int32_t m = 0;
    for (int32_t i = 0; i < n; i += 8) {
        int32_t left = n - i;
        v8f v = left >= 8 ? load8(val + i) : load_tail(val + i, left, -INFINITY);
        v8f y = bucket8(v, lo, scale);
        v8i in = (y >= at_edge) & ~(y >= above_edge);
        if (!any8(in)) {
            continue;
        }
        int32_t h[8];
        memcpy(h, &in, sizeof(h));
        for (int l = 0; l < 8 && l < left; l++) {
            if (h[l]) {
                int32_t id = idx != NULL ? idx[i + l] : i + l;
                sc->kval[m] = val[i + l];
                sc->kidx[m++] = id;
            }
        }
    }
    return m;
}

/* Order (kval, kidx)[0..n) best first when every logit there is equal, so
 * by id: mark the ids in `seen` and collect them in id order. O(n_ids)
 * instead of a sort of a long run of ties (a uniform row). */
static void order_ties_by_id(kg_sampler_scratch_t *sc, int32_t n, int32_t n_ids) {
    for (int32_t i = 0; i < n; i++) {
        sc->seen[sc->kidx[i]] = 1;
    }
    int32_t k = 0;
    for (int32_t id = 0; id < n_ids && k < n; id++) {
        if (sc->seen[id]) {
            sc->seen[id] = 0;
            sc->kidx[k++] = id;
        }
    }
}

/* Append the lanes of the block at val[i..i+8) that `mask` sets to (kval,
 * kidx) from m on; returns the new count. Branch-free: every lane is
 * written, the count moves only for the kept ones (m <= i + l: never past
 * the row). */
static inline int32_t
append_lanes(kg_sampler_scratch_t *sc, int32_t i, int32_t left, v8i mask, int32_t m) {
    int32_t k[8];
    memcpy(k, &mask, sizeof(k));
    for (int l = 0; l < 8 && l < left; l++) {
        sc->kval[m] = sc->val[i + l];
        sc->kidx[m] = i + l;
        m += k[l] & 1;
    }
    return m;
}

/* Copy the tokens of val[0..n) with logit >= lo to (kval, kidx). */
static int32_t collect_above(kg_sampler_scratch_t *sc, int32_t n, float lo) {
    const float *val = sc->val;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i += 8) {
        int32_t left = n - i;
        v8f v = left >= 8 ? load8(val + i) : load_tail(val + i, left, -INFINITY);
        v8i in = v >= splat(lo);
        if (!any8(in)) {
            continue;
        }
        m = append_lanes(sc, i, left, in, m);
    }
    return m;
}

/* Top-p over the whole vocabulary (val, by id) without sorting it; sets
 * the worst kept token (t, t_id). Returns how many tokens are kept when
 * they are the sorted prefix (kval, kidx)[0..return), or 0 when only the
 * threshold is known.
 *
 * 1. A bound first: tokens more than L below the max carry at most
 *    n e^-L of mass (relative to the max), so once that is below half of
 *    1 - p the boundary must lie above max - L, and only the tokens there
 *    (a few thousand at most for a 128k vocabulary, usually far fewer)
 *    take part.
 * 2. While more than TOP_P_SORT remain: bucket their mass by logit, find
 *    the bucket where the cumulative mass (from the top) reaches p, and
 *    keep going inside that bucket (1024 times finer).
 * 3. Sort the few left and take them best first until the mass is reached.
 * Buckets are ordered by logit, so the result is exactly what a full sort
 * would give. Uses prob/z/ref from prepare(). */
static int32_t top_p_unsorted(
    kg_sampler_scratch_t *sc, int32_t n, float max, float top_p, float *t, int32_t *t_id) {
    const double target = (double)top_p * sc->z;
    double bound =
        (double)max - (double)sc->ref + log((double)n / (0.5 * (1.0 - (double)top_p) * sc->z));
    float lo, width;
    const float *run_val;
    const int32_t *run_idx;
    int32_t cnt;
    if (bound < (double)HIST_RANGE) {
        width = bound > 0.0 ? (float)bound : 0.0f;
        lo = max - width;
        cnt = collect_above(sc, n, lo);
        run_val = sc->kval;
        run_idx = sc->kidx;
    } else {
        /* p too close to 1 for the bound: the whole row, the bottom bucket
         * catching everything more than HIST_RANGE below the max */
        width = HIST_RANGE;
        lo = max - width;
        cnt = n;
        run_val = sc->val;
        run_idx = NULL;
    }
    double cum = 0.0;
    bool whole = true; /* whether the run is everything kept so far */
    for (int level = 0; level < 4 && cnt > TOP_P_SORT && width > 0.0f; level++) {
        const float scale = (float)HIST_BUCKETS / width;
        fill_histogram(sc, run_val, run_idx, cnt, lo, scale);
        int32_t edge = find_edge(sc, &cum, target);
        cnt = collect_bucket(sc, run_val, run_idx, cnt, lo, scale, edge);
        run_val = sc->kval;
        run_idx = sc->kidx;
        whole = whole && edge == HIST_BUCKETS - 1;
        lo += (float)edge / scale;
        width /= (float)HIST_BUCKETS;
    }
    if (run_idx == NULL) {
        /* n <= TOP_P_SORT with no bound: the run is still the whole row */
        cnt = collect_above(sc, n, -INFINITY);
    }
    bool all_equal = true;
    for (int32_t i = 1; i < cnt && all_equal; i++) {
        all_equal = sc->kval[i] == sc->kval[0];
    }
    if (all_equal) {
        order_ties_by_id(sc, cnt, n);
    } else {
        sort_cands(sc->kval, sc->kidx, cnt);
    }
    int32_t last = cnt - 1; /* rounding may leave the mass just short: keep all */
    for (int32_t i = 0; i < cnt; i++) {
        cum += sc->prob[sc->kidx[i]];
        if (cum >= target) {
            last = i;
            break;
        }
    }
    *t = sc->kval[last];
    *t_id = sc->kidx[last];
    return whole ? last + 1 : 0;
}

/* Collect into (kval, kidx), in id order, the tokens of val[0..n) at least
 * as good as (t, t_id) that also pass the min-p threshold. Blocks of 8 with
 * none cost one vector compare; the others are written without branches. */
static int32_t gather_kept(kg_sampler_scratch_t *sc, int32_t n, float t, int32_t t_id, float thr) {
    const float *val = sc->val;
    const v8i t_ids = {t_id, t_id, t_id, t_id, t_id, t_id, t_id, t_id};
    int32_t kept = 0;
    v8i id = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int32_t i = 0; i < n; i += 8) {
        int32_t left = n - i;
        v8f v = left >= 8 ? load8(val + i) : load_tail(val + i, left, -INFINITY);
        v8i keep = ((v > splat(t)) | ((v == splat(t)) & (id <= t_ids))) & (v >= splat(thr));
        id += 8;
        if (!any8(keep)) {
            continue;
        }
        kept = append_lanes(sc, i, left, keep, kept);
    }
    return kept;
}

/* Few kept candidates, sorted best first in (kval, kidx)[0..m): apply
 * min-p and put them in id order in place, cheaper than a pass over the
 * vocabulary. */
static int32_t small_kept(kg_sampler_scratch_t *sc, int32_t m, float thr) {
    float *val = sc->kval;
    int32_t *idx = sc->kidx;
    int32_t kept = 0;
    for (int32_t i = 0; i < m; i++) {
        if (val[i] >= thr) {
            float v = val[i];
            int32_t id = idx[i];
            int32_t j = kept++;
            for (; j > 0 && idx[j - 1] > id; j--) {
                val[j] = val[j - 1];
                idx[j] = idx[j - 1];
            }
            val[j] = v;
            idx[j] = id;
        }
    }
    return kept;
}

/* The penalised logits val[0..n) -> the kept tokens, in ascending id
 * order, with their unnormalised probabilities at the temperature in
 * prob[0..return). *ids gets their token ids, or NULL when all n are kept
 * (position = id); *z gets the sum. temperature > 0. */
static int32_t filter(const kg_sampling_params_t *p,
                      kg_sampler_scratch_t *sc,
                      int32_t n,
                      double *z,
                      const int32_t **ids) {
    const bool top_k = p->top_k > 0 && p->top_k < n;
    const bool top_p = p->top_p < 1.0f;
    const bool min_p = p->min_p > 0.0f;
    const float inv_t = 1.0f / p->temperature;
    *ids = NULL;
    if (!top_k && !top_p && !min_p) {
        if (p->temperature == 1.0f) {
            *z = sc->z; /* the whole vocabulary as prepare() left it */
        } else {
            *z = exp_sum(sc->prob, sc->val, n, max_at(sc->val, n, NULL), inv_t);
        }
        return n;
    }
    float max;
    float t = -INFINITY; /* keep what is at least as good as (t, t_id) */
    int32_t t_id = INT32_MAX;
    int32_t sorted = 0; /* > 0: the kept are the sorted (kval, kidx)[0..sorted) */
    if (top_k) {
        select_top(sc->val, n, p->top_k, sc->kval, sc->kidx);
        max = sc->kval[0];
        sorted = top_p ? top_p_sorted(sc, p->top_k, p->top_p) : p->top_k;
        t = sc->kval[sorted - 1];
        t_id = sc->kidx[sorted - 1];
    } else {
        max = max_at(sc->val, n, NULL);
        if (top_p) {
            sorted = top_p_unsorted(sc, n, max, p->top_p, &t, &t_id);
        }
    }
    /* min-p: p_i >= min_p * p_max, i.e. l_i >= l_max + log(min_p) */
    const float thr = !min_p ? -INFINITY : p->min_p >= 1.0f ? max : max + logf(p->min_p);
    int32_t kept =
        sorted > 0 && sorted <= 64 ? small_kept(sc, sorted, thr) : gather_kept(sc, n, t, t_id, thr);
    *ids = sc->kidx;
    /* Temperature: p_i ∝ e^((l_i - l_max) / T). */
    *z = exp_sum(sc->prob, sc->kval, kept, max, inv_t);
    return kept;
}

/* The first i whose cumulative mass exceeds u. Whole blocks of 8 are
 * skipped by their sums first, which do not depend on each other, so the
 * walk is not one long chain of dependent additions. If rounding runs past
 * the end, the last candidate with any mass is the answer. */
static int32_t draw(const float *prob, int32_t n, double u) {
    double cum = 0.0;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float *q = prob + i;
        double b = (((double)q[0] + q[1]) + ((double)q[2] + q[3])) +
                   (((double)q[4] + q[5]) + ((double)q[6] + q[7]));
        if (cum + b > u) {
            break;
        }
        cum += b;
    }
    for (; i < n; i++) {
        cum += prob[i];
        if (u < cum && prob[i] > 0.0f) {
            return i;
        }
    }
    for (i = n - 1; i > 0 && !(prob[i] > 0.0f); i--) {
    }
    return i;
}

// ---- sampling ----

/* Rule 0 on the id-ordered copy: the few biased tokens change (their ids
 * are distinct), then the max is taken again (a bias may raise or lower it). */
static float apply_logit_bias(const kg_sampling_params_t *p, float *val, int32_t n) {
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        int32_t tok = p->logit_bias[i].token;
        float b = p->logit_bias[i].bias;
        if (tok >= 0 && tok < n) {
            val[tok] = b <= KG_LOGIT_BIAS_BAN ? -INFINITY : sanitize(val[tok] + b);
        }
    }
    return max_at(val, n, NULL);
}

/* The shared front half: candidates, the raw log-softmax (and top-n when
 * asked), penalties. Returns the raw log-sum-exp. If no logit is usable
 * (all -inf/NaN), every token counts as 0, a uniform distribution, rather
 * than a NaN softmax. */
static double prepare(const kg_sampling_params_t *p,
                      const float *logits,
                      const uint32_t *mask,
                      int32_t n_vocab,
                      const int32_t *prompt,
                      int32_t n_prompt,
                      const int32_t *output,
                      int32_t n_output,
                      kg_sampler_scratch_t *sc,
                      kg_sample_result_t *out,
                      bool *all_masked) {
    KG_ASSERT(n_vocab > 0 && n_vocab <= sc->n_vocab);
    float max = load_logits(sc->val, logits, mask, n_vocab);
    if (p->n_logit_bias > 0) {
        /* a masked token stays -inf: the bias adds to it */
        max = apply_logit_bias(p, sc->val, n_vocab);
    }
    *all_masked = max == -INFINITY;
    if (*all_masked) {
        /* no usable logit: every token (with a mask, every allowed one)
         * counts as 0, a uniform choice */
        for (int32_t i = 0; i < n_vocab; i++) {
            sc->val[i] = mask == NULL || ((mask[i >> 5] >> (i & 31)) & 1u) ? 0.0f : -INFINITY;
        }
        max = 0.0f;
    }
    sc->ref = max;
    sc->z = exp_sum(sc->prob, sc->val, n_vocab, max, 1.0f);
    double lse = (double)max + log(sc->z);
    if (out != NULL) {
        int32_t want = p->n_logprobs;
        want = want > KG_MAX_LOGPROBS ? KG_MAX_LOGPROBS : want;
        want = want > n_vocab ? n_vocab : want;
        out->n_top = 0;
        if (want > 0) {
            top_logprobs(sc->val, n_vocab, want, lse, out);
        }
    }
    apply_penalties(p, sc, n_vocab, prompt, n_prompt, output, n_output);
    /* Redo the pass when a penalty raised a logit above ref (z is inf or
     * NaN) or pushed the top so far down that the rest of the mass would sit
     * in float underflow relative to ref. */
    if (!(sc->z >= 1e-6 && sc->z < INFINITY)) {
        sc->ref = max_at(sc->val, n_vocab, NULL);
        sc->z = exp_sum(sc->prob, sc->val, n_vocab, sc->ref, 1.0f);
    }
    return lse;
}

/* Greedy: the lowest id holding the max. */
static int32_t argmax(const kg_sampler_scratch_t *sc, int32_t n) {
    int32_t at = 0;
    (void)max_at(sc->val, n, &at);
    return at;
}

void kg_sampler_sample(const kg_sampling_params_t *p,
                       kg_rng_t *rng,
                       const float *logits,
                       int32_t n_vocab,
                       const int32_t *prompt,
                       int32_t n_prompt,
                       const int32_t *output,
                       int32_t n_output,
                       kg_sampler_scratch_t *sc,
                       kg_sample_result_t *out) {
    kg_sampler_sample_masked(p, rng, logits, NULL, n_vocab, prompt, n_prompt, output, n_output, sc,
                             out);
}

void kg_sampler_sample_masked(const kg_sampling_params_t *p,
                              kg_rng_t *rng,
                              const float *logits,
                              const uint32_t *mask,
                              int32_t n_vocab,
                              const int32_t *prompt,
                              int32_t n_prompt,
                              const int32_t *output,
                              int32_t n_output,
                              kg_sampler_scratch_t *sc,
                              kg_sample_result_t *out) {
    bool all_masked = false;
    double lse =
        prepare(p, logits, mask, n_vocab, prompt, n_prompt, output, n_output, sc, out, &all_masked);
    int32_t token;
    /* !(t > 0) also sends a NaN temperature to greedy. */
    if (!(p->temperature > 0.0f)) {
        token = argmax(sc, n_vocab);
    } else {
        double z = 0.0;
        const int32_t *ids = NULL;
        int32_t n = filter(p, sc, n_vocab, &z, &ids);
        int32_t at = draw(sc->prob, n, kg_rng_uniform(rng) * z);
        token = ids != NULL ? ids[at] : at;
    }
    out->token = token;
    float raw = all_masked ? 0.0f : sanitize(logits[token]);
    if (!all_masked && p->n_logit_bias > 0) {
        raw = sanitize(kg_sampler_biased_logit(p, token, raw));
    }
    out->logprob = (float)((double)raw - lse);
}

int32_t kg_sampler_candidates(const kg_sampling_params_t *p,
                              const float *logits,
                              int32_t n_vocab,
                              const int32_t *prompt,
                              int32_t n_prompt,
                              const int32_t *output,
                              int32_t n_output,
                              kg_sampler_scratch_t *sc,
                              int32_t *ids,
                              float *probs) {
    bool all_masked = false;
    (void)prepare(p, logits, NULL, n_vocab, prompt, n_prompt, output, n_output, sc, NULL,
                  &all_masked);
    if (!(p->temperature > 0.0f)) {
        ids[0] = argmax(sc, n_vocab);
        probs[0] = 1.0f;
        return 1;
    }
    double z = 0.0;
    const int32_t *kept = NULL;
    int32_t n = filter(p, sc, n_vocab, &z, &kept);
    for (int32_t i = 0; i < n; i++) {
        ids[i] = kept != NULL ? kept[i] : i;
        probs[i] = (float)(sc->prob[i] / z);
    }
    return n;
}
