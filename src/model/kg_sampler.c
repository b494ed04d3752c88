/* kg_sampler: penalties, filters and the seeded draw that turn one row of
 * logits into one token id (the order and the rules are in kg_sampler.h).
 *
 * DESIGN: the engine samples every running sequence once per step, so for a
 * 128k vocabulary the cost per call matters as much as a small kernel. The
 * raw logits are copied once into (logit, id) candidates in the scratch;
 * everything after that touches only what it must:
 *   - penalties visit the window's tokens, never the vocabulary; their
 *     per-token marks and counts are cleared by visiting the same tokens;
 *   - top-k is a bounded heap (one comparison per token for small k);
 *   - top-p without top-k does not sort the vocabulary: a histogram of
 *     probability mass over logit buckets finds the bucket where the
 *     cumulative mass crosses p, and only that bucket's tokens are sorted;
 *   - min-p is a threshold on the logit (p_i >= min_p * p_max is
 *     l_i >= l_max + log(min_p)), so it needs no sort either;
 *   - the draw walks the survivors in their current order.
 * Ties are broken by the lower token id everywhere, so the result depends
 * only on the logits, the parameters and the RNG state. */
#include "kg_sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/kg_log.h"

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

typedef struct cand {
    float logit;
    int32_t id;
} cand_t;

/* Top-p histogram: buckets of equal logit width over [l_max - range, l_max].
 * Everything further below shares bucket 0; its mass is at most
 * n_vocab * e^-40 of the top token's, far below what a float p < 1 can ask
 * for, so the boundary never lands there in practice (it stays correct if
 * it does, only slower). */
#define HIST_BUCKETS 1024
#define HIST_RANGE   40.0f

struct kg_sampler_scratch {
    int32_t n_vocab;
    cand_t *cand;                   /* (n_vocab) candidates, filtered in place */
    float *prob;                    /* (n_vocab) unnormalised probability of cand[i] */
    int32_t *count;                 /* (n_vocab) output-token counts; zero between calls */
    uint8_t *seen;                  /* (n_vocab) repetition-window marks; zero between calls */
    double hist_mass[HIST_BUCKETS]; /* top-p: probability mass per logit bucket */
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
    sc->cand = malloc((size_t)n_vocab * sizeof(*sc->cand));
    sc->prob = malloc((size_t)n_vocab * sizeof(*sc->prob));
    /* calloc: the marks and counts start at zero and every call leaves them so */
    sc->count = calloc((size_t)n_vocab, sizeof(*sc->count));
    sc->seen = calloc((size_t)n_vocab, sizeof(*sc->seen));
    if (sc->cand == NULL || sc->prob == NULL || sc->count == NULL || sc->seen == NULL) {
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
    free(sc->cand);
    free(sc->prob);
    free(sc->count);
    free(sc->seen);
    free(sc);
}

// ---- helpers ----

/* NaN becomes -inf (never chosen), +inf becomes FLT_MAX (so differences
 * with the max stay finite and the token is still the clear favourite). */
static inline float sanitize(float x) {
    if (x != x) {
        return -INFINITY;
    }
    return x > FLT_MAX ? FLT_MAX : x;
}

/* The one total order on candidates: higher logit first, then lower id. */
static inline bool better(cand_t a, cand_t b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* Sift h[i] down a heap whose root is the worst element. */
static void sift_down(cand_t *h, int32_t n, int32_t i) {
    cand_t x = h[i];
    for (;;) {
        int32_t w = 2 * i + 1;
        if (w >= n) {
            break;
        }
        if (w + 1 < n && better(h[w], h[w + 1])) {
            w++;
        }
        if (!better(x, h[w])) {
            break;
        }
        h[i] = h[w];
        i = w;
    }
    h[i] = x;
}

/* Move the m best of c[0..n) to c[0..m), sorted best first; the rest stay
 * in c[m..n) (the array remains a permutation). A bounded heap whose root is
 * the worst kept token: for small m almost every token costs one compare. */
static void select_top(cand_t *c, int32_t n, int32_t m) {
    for (int32_t i = m / 2 - 1; i >= 0; i--) {
        sift_down(c, m, i);
    }
    for (int32_t j = m; j < n; j++) {
        if (better(c[j], c[0])) {
            cand_t t = c[0];
            c[0] = c[j];
            c[j] = t;
            sift_down(c, m, 0);
        }
    }
    for (int32_t end = m - 1; end > 0; end--) {
        cand_t t = c[0];
        c[0] = c[end];
        c[end] = t;
        sift_down(c, end, 0);
    }
}

/* Largest logit and its position (ties: the lowest id). */
static int32_t find_best(const cand_t *c, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (better(c[i], c[best])) {
            best = i;
        }
    }
    return best;
}

/* Sum of exp(c[i].logit - max) with four partial sums, so the additions
 * do not form one long dependency chain. */
static double sum_exp(const cand_t *c, int32_t n, float max) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += expf(c[i].logit - max);
        s1 += expf(c[i + 1].logit - max);
        s2 += expf(c[i + 2].logit - max);
        s3 += expf(c[i + 3].logit - max);
    }
    for (; i < n; i++) {
        s0 += expf(c[i].logit - max);
    }
    return (s0 + s1) + (s2 + s3);
}

// ---- raw logits: candidates, log-softmax, top-n ----

/* Copy the sanitised logits into the candidates. Returns the max; sets
 * *all_masked when no logit is usable, in which case every candidate is 0
 * (a uniform distribution) rather than a NaN softmax. */
static float load_candidates(cand_t *c, const float *logits, int32_t n, bool *all_masked) {
    float max = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float x = sanitize(logits[i]);
        c[i].logit = x;
        c[i].id = i;
        max = x > max ? x : max;
    }
    *all_masked = max == -INFINITY;
    if (*all_masked) {
        for (int32_t i = 0; i < n; i++) {
            c[i].logit = 0.0f;
        }
        max = 0.0f;
    }
    return max;
}

/* Top `want` raw logprobs by an insertion list (want <= 20): scanning ids in
 * ascending order and inserting after equal values keeps ties by lower id. */
static void top_logprobs(const cand_t *c, int32_t n, int32_t want, double lse,
                         kg_sample_result_t *out) {
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        float x = c[i].logit;
        if (have == want && !(x > out->top_logprob[want - 1])) {
            continue;
        }
        int32_t pos = have < want ? have++ : want - 1;
        while (pos > 0 && out->top_logprob[pos - 1] < x) {
            out->top_logprob[pos] = out->top_logprob[pos - 1];
            out->top_token[pos] = out->top_token[pos - 1];
            pos--;
        }
        out->top_logprob[pos] = x;
        out->top_token[pos] = c[i].id;
    }
    for (int32_t i = 0; i < have; i++) {
        out->top_logprob[i] = (float)((double)out->top_logprob[i] - lse);
    }
    out->n_top = have;
}

// ---- penalties ----

/* Repetition penalty over toks[from..to): once per distinct token, marked
 * in `seen` (the caller clears the marks over the same range). */
static void penalize_repeats(cand_t *c, int32_t n, const int32_t *toks, int64_t from, int64_t to,
                             float penalty, uint8_t *seen) {
    for (int64_t i = from; i < to; i++) {
        int32_t tok = toks[i];
        if (tok < 0 || tok >= n || seen[tok]) {
            continue;
        }
        seen[tok] = 1;
        float x = c[tok].logit;
        c[tok].logit = sanitize(x > 0.0f ? x / penalty : x * penalty);
    }
}

static void clear_marks(const int32_t *toks, int64_t from, int64_t to, int32_t n, uint8_t *seen) {
    for (int64_t i = from; i < to; i++) {
        if (toks[i] >= 0 && toks[i] < n) {
            seen[toks[i]] = 0;
        }
    }
}

static void apply_penalties(const kg_sampling_params_t *p, kg_sampler_scratch_t *sc, int32_t n,
                            const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                            int32_t n_output) {
    cand_t *c = sc->cand;
    float rep = p->repetition_penalty;
    if (rep != 1.0f && rep > 0.0f && p->penalty_last_n != 0) {
        /* The window is the last penalty_last_n tokens of prompt ++ output. */
        int64_t total = (int64_t)n_prompt + n_output;
        int64_t win = p->penalty_last_n < 0 || p->penalty_last_n > total ? total
                                                                         : p->penalty_last_n;
        int64_t out_from = win > n_output ? 0 : n_output - win;
        int64_t prompt_from = win > n_output ? n_prompt - (win - n_output) : n_prompt;
        penalize_repeats(c, n, prompt, prompt_from, n_prompt, rep, sc->seen);
        penalize_repeats(c, n, output, out_from, n_output, rep, sc->seen);
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
            float x = c[tok].logit - ((float)sc->count[tok] * freq + pres);
            c[tok].logit = sanitize(x);
            sc->count[tok] = 0;
        }
    }
}

// ---- filters ----

/* Top-p over candidates sorted best first: keep the shortest prefix whose
 * mass reaches p of the total. */
static int32_t top_p_sorted(const cand_t *c, int32_t n, float max, float top_p) {
    double target = (double)top_p * sum_exp(c, n, max);
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += expf(c[i].logit - max);
        if (cum >= target) {
            return i + 1;
        }
    }
    return n;
}

static inline int32_t hist_bucket(float x, float lo, float scale) {
    float d = x - lo;
    if (!(d > 0.0f)) {
        return 0;
    }
    int32_t b = (int32_t)(d * scale);
    return b >= HIST_BUCKETS ? HIST_BUCKETS - 1 : b;
}

/* Top-p over unsorted candidates without sorting them: bucket the mass by
 * logit, find the bucket where the cumulative mass (from the top) reaches
 * p, keep every bucket above it and sort only the boundary bucket to take
 * its best tokens until the mass is reached. The kept tokens end up in
 * c[0..return): first the buckets above (in scan order), then the boundary
 * bucket's best first. The set is exactly the smallest one a full sort
 * would keep, as buckets are ordered by logit. */
static int32_t top_p_unsorted(kg_sampler_scratch_t *sc, cand_t *c, int32_t n, float max,
                              float top_p) {
    double *mass = sc->hist_mass;
    memset(mass, 0, sizeof(sc->hist_mass));
    const float lo = max - HIST_RANGE;
    const float scale = (float)HIST_BUCKETS / HIST_RANGE;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double e = expf(c[i].logit - max);
        z += e;
        mass[hist_bucket(c[i].logit, lo, scale)] += e;
    }
    double target = (double)top_p * z;
    double cum = 0.0;
    int32_t edge = HIST_BUCKETS - 1;
    for (; edge > 0; edge--) {
        if (cum + mass[edge] >= target) {
            break;
        }
        cum += mass[edge];
    }
    /* Buckets above the edge to the front, then the edge bucket after them. */
    int32_t n_sure = 0;
    for (int32_t i = 0; i < n; i++) {
        if (hist_bucket(c[i].logit, lo, scale) > edge) {
            cand_t t = c[n_sure];
            c[n_sure++] = c[i];
            c[i] = t;
        }
    }
    int32_t n_edge = n_sure;
    for (int32_t i = n_sure; i < n; i++) {
        if (hist_bucket(c[i].logit, lo, scale) == edge) {
            cand_t t = c[n_edge];
            c[n_edge++] = c[i];
            c[i] = t;
        }
    }
    select_top(c + n_sure, n_edge - n_sure, n_edge - n_sure);
    for (int32_t i = n_sure; i < n_edge; i++) {
        cum += expf(c[i].logit - max);
        if (cum >= target) {
            return i + 1;
        }
    }
    /* Rounding left the mass just short: keep the whole edge bucket. */
    return n_edge;
}

/* Keep tokens with p_i >= min_p * p_max, i.e. l_i >= l_max + log(min_p);
 * compacts in place keeping the order. The max always survives. */
static int32_t min_p_filter(cand_t *c, int32_t n, float max, float min_p) {
    double thr = min_p >= 1.0f ? (double)max : (double)max + log((double)min_p);
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++) {
        if ((double)c[i].logit >= thr) {
            c[kept++] = c[i];
        }
    }
    return kept;
}

/* Penalised candidates in sc->cand[0..n) -> survivors of top-k, top-p and
 * min-p in sc->cand[0..return) with their unnormalised probabilities at the
 * temperature in sc->prob; *z gets the sum. temperature > 0. */
static int32_t filter(const kg_sampling_params_t *p, kg_sampler_scratch_t *sc, int32_t n,
                      double *z) {
    cand_t *c = sc->cand;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        sorted = true;
    }
    float max = sorted ? c[0].logit : c[find_best(c, n)].logit;
    if (max == -INFINITY) {
        /* Only reachable with infinite penalties: keep the best alone. */
        if (!sorted) {
            c[0] = c[find_best(c, n)];
        }
        sc->prob[0] = 1.0f;
        *z = 1.0;
        return 1;
    }
    if (p->top_p < 1.0f) {
        n = sorted ? top_p_sorted(c, n, max, p->top_p) : top_p_unsorted(sc, c, n, max, p->top_p);
    }
    if (p->min_p > 0.0f) {
        n = min_p_filter(c, n, max, p->min_p);
    }
    /* Temperature: p_i ∝ exp((l_i - l_max) / T). The max gets exactly 1, so
     * even a temperature that underflows everything else leaves a valid draw. */
    const float inv_t = 1.0f / p->temperature;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float d = c[i].logit - max;
        float e = d == 0.0f ? 1.0f : d == -INFINITY ? 0.0f : expf(d * inv_t);
        sc->prob[i] = e;
        sum += e;
    }
    *z = sum;
    return n;
}

// ---- sampling ----

/* The shared front half: candidates, optional raw log-softmax / top-n,
 * penalties. Returns whether the sampling is greedy. */
static bool prepare(const kg_sampling_params_t *p, const float *logits, int32_t n_vocab,
                    const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                    int32_t n_output, kg_sampler_scratch_t *sc, kg_sample_result_t *out,
                    double *lse, bool *all_masked) {
    KG_ASSERT(n_vocab > 0 && n_vocab <= sc->n_vocab);
    float max = load_candidates(sc->cand, logits, n_vocab, all_masked);
    if (out != NULL) {
        *lse = (double)max + log(sum_exp(sc->cand, n_vocab, max));
        int32_t want = p->n_logprobs;
        want = want > KG_MAX_LOGPROBS ? KG_MAX_LOGPROBS : want;
        want = want > n_vocab ? n_vocab : want;
        out->n_top = 0;
        if (want > 0) {
            top_logprobs(sc->cand, n_vocab, want, *lse, out);
        }
    }
    apply_penalties(p, sc, n_vocab, prompt, n_prompt, output, n_output);
    /* !(t > 0) also sends a NaN temperature to greedy. */
    return !(p->temperature > 0.0f);
}

void kg_sampler_sample(const kg_sampling_params_t *p, kg_rng_t *rng, const float *logits,
                       int32_t n_vocab, const int32_t *prompt, int32_t n_prompt,
                       const int32_t *output, int32_t n_output, kg_sampler_scratch_t *sc,
                       kg_sample_result_t *out) {
    double lse = 0.0;
    bool all_masked = false;
    bool greedy = prepare(p, logits, n_vocab, prompt, n_prompt, output, n_output, sc, out, &lse,
                          &all_masked);
    cand_t *c = sc->cand;
    int32_t token;
    if (greedy) {
        token = c[find_best(c, n_vocab)].id;
    } else {
        double z = 0.0;
        int32_t n = filter(p, sc, n_vocab, &z);
        double u = kg_rng_uniform(rng) * z;
        /* Walk the cumulative mass; if rounding runs past the end, the last
         * token with any mass is the answer. */
        int32_t pick = -1;
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            if (sc->prob[i] > 0.0f) {
                pick = i;
                cum += sc->prob[i];
                if (u < cum) {
                    break;
                }
            }
        }
        token = c[pick < 0 ? 0 : pick].id;
    }
    out->token = token;
    float raw = all_masked ? 0.0f : sanitize(logits[token]);
    out->logprob = (float)((double)raw - lse);
}

int32_t kg_sampler_candidates(const kg_sampling_params_t *p, const float *logits, int32_t n_vocab,
                              const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                              int32_t n_output, kg_sampler_scratch_t *sc, int32_t *ids,
                              float *probs) {
    bool all_masked = false;
    bool greedy = prepare(p, logits, n_vocab, prompt, n_prompt, output, n_output, sc, NULL, NULL,
                          &all_masked);
    cand_t *c = sc->cand;
    if (greedy) {
        ids[0] = c[find_best(c, n_vocab)].id;
        probs[0] = 1.0f;
        return 1;
    }
    double z = 0.0;
    int32_t n = filter(p, sc, n_vocab, &z);
    for (int32_t i = 0; i < n; i++) {
        ids[i] = c[i].id;
        probs[i] = (float)(sc->prob[i] / z);
    }
    return n;
}
