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
 * only on the logits, the parameters and the RNG state.
 *
 * The filters (top-k, top-p, min-p) and the draw are in
 * kg_sampler_filter.c; the scratch and the vector helpers both files use
 * are in kg_sampler_int.h. */
#include "../core/kg_log.h"
#include "kg_sampler_int.h"

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

typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline void store_tail(void *p, const void *v, int32_t n_left) {
    memcpy(p, v, (size_t)n_left * sizeof(float));
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
float kg_sampler_max_at(const float *val, int32_t n, int32_t *first) {
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
double kg_sampler_exp_sum(float *prob, const float *val, int32_t n, float max, float inv_t) {
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
    return kg_sampler_max_at(val, n, NULL);
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
    sc->z = kg_sampler_exp_sum(sc->prob, sc->val, n_vocab, max, 1.0f);
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
        sc->ref = kg_sampler_max_at(sc->val, n_vocab, NULL);
        sc->z = kg_sampler_exp_sum(sc->prob, sc->val, n_vocab, sc->ref, 1.0f);
    }
    return lse;
}

/* Greedy: the lowest id holding the max. */
static int32_t argmax(const kg_sampler_scratch_t *sc, int32_t n) {
    int32_t at = 0;
    (void)kg_sampler_max_at(sc->val, n, &at);
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
        int32_t n = kg_sampler_filter(p, sc, n_vocab, &z, &ids);
        int32_t at = kg_sampler_draw(sc->prob, n, kg_rng_uniform(rng) * z);
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
    int32_t n = kg_sampler_filter(p, sc, n_vocab, &z, &kept);
    for (int32_t i = 0; i < n; i++) {
        ids[i] = kept != NULL ? kept[i] : i;
        probs[i] = (float)(sc->prob[i] / z);
    }
    return n;
}
