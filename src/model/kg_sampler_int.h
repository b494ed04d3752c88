/* kg_sampler_int: what the sampler's two files share, and no one else:
 * the scratch (the per-call working memory, one per sequence slot), the
 * 8-lane vector helpers, and the passes each file calls in the other.
 * kg_sampler.c holds the whole-vocabulary passes, the penalties and the
 * sampling entry points; kg_sampler_filter.c the top-k/top-p/min-p filters
 * and the draw. See kg_sampler.c for the design. */
#pragma once

#include "kg_sampler.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Top-p histogram: buckets of equal logit width. The first level spans
 * [l_max - L, l_max] with L from a mass bound (see top_p_unsorted), or
 * [l_max - 40, l_max] when p is too close to 1 for the bound; then
 * everything further below shares bucket 0, whose mass is at most
 * n_vocab * e^-40 of the top token's (the result stays exact if it ever
 * matters, only slower). */
#define HIST_BUCKETS KG_SAMPLER_HIST_BUCKETS
#define HIST_RANGE   KG_SAMPLER_HIST_RANGE

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

// ---- vector helpers ----

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

/* Whether any lane of a comparison result is set. */
static inline bool any8(v8i m) {
    uint64_t w[4];
    memcpy(w, &m, sizeof(w));
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}

// ---- the passes each file calls in the other ----

/* kg_sampler.c: the max of val[0..n) and, through *first (may be NULL), the
 * first position holding it. */
float kg_sampler_max_at(const float *val, int32_t n, int32_t *first);
/* kg_sampler.c: prob[i] = e^((val[i] - max) * inv_t) (prob may be NULL);
 * returns the sum. */
double kg_sampler_exp_sum(float *prob, const float *val, int32_t n, float max, float inv_t);
/* kg_sampler_filter.c: the penalised logits -> the kept tokens in id order,
 * their unnormalised probabilities at the temperature in sc->prob, their ids
 * in *ids (NULL: all n kept) and the sum in *z. Returns how many. */
int32_t kg_sampler_filter(const kg_sampling_params_t *p,
                          kg_sampler_scratch_t *sc,
                          int32_t n,
                          double *z,
                          const int32_t **ids);
/* kg_sampler_filter.c: the first i whose cumulative mass exceeds u. */
int32_t kg_sampler_draw(const float *prob, int32_t n, double u);
