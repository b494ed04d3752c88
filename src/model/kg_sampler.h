/* kg_sampler: turns one row of logits into one token id.
 *
 * The order of the filters is llama.cpp's default chain: penalties →
 * top-k → top-p → min-p → temperature → draw. Temperature 0 is greedy.
 * Randomness comes only from the sequence's own RNG (seeded by the job),
 * advanced once per sampled token, so a job's output depends only on
 * (model, prompt, parameters, seed), never on what shares its batch.
 *
 * The exact rules, for any other implementation (a device sampler) to
 * follow; ties are always broken by the lower token id:
 *   0. logit_bias (OpenAI's): each entry's bias is added to its token's
 *      logit; a bias of -100 or less bans the token (its logit becomes
 *      -inf), as OpenAI describes -100. Everything below sees the biased
 *      logits as "the raw values" (the distribution the job asked for).
 *   1. NaN logits count as -inf, +inf as FLT_MAX; if all are -inf/NaN,
 *      all count as 0. logprob and top-n come from these raw values.
 *   2. Repetition penalty (CTRL/llama.cpp: l > 0 ? l / r : l * r) once per
 *      distinct token among the last penalty_last_n of prompt ++ output;
 *      then l -= count * frequency + (count > 0) * presence over output.
 *   3. temperature <= 0 (or NaN): the argmax. Otherwise:
 *   4. top-k keeps the k best; top-p then keeps the shortest best-first
 *      prefix whose softmax mass (temperature 1, over what is left)
 *      reaches p; min-p keeps l >= l_max + logf(min_p).
 *   5. Weights w = e^((l - l_max) / T) of the kept tokens taken in
 *      ascending id order; u = kg_rng_uniform() * sum(w); the token is the
 *      first whose cumulative weight exceeds u. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* One entry of a job's logit_bias: token id -> bias in [-100, 100]. */
typedef struct kg_logit_bias {
    int32_t token;
    float bias;
} kg_logit_bias_t;

#define KG_MAX_LOGIT_BIAS 300       /* entries per job (OpenAI's limit) */
#define KG_LOGIT_BIAS_BAN (-100.0f) /* a bias at or below it bans the token */

typedef struct kg_sampling_params {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off (divides positive logits, multiplies negative) */
    float frequency_penalty;  /* 0: off (OpenAI semantics, over generated tokens) */
    float presence_penalty;   /* 0: off */
    int32_t penalty_last_n;   /* repetition-penalty window over prompt+output; -1 all, 0 none */
    uint64_t seed;
    int32_t n_logprobs; /* top-n logprobs to report, 0..20 */
    /* (n_logit_bias) borrowed; the token ids are distinct (the job decoder and
     * kg_engine_submit refuse repeats); NULL: none */
    const kg_logit_bias_t *logit_bias;
    int32_t n_logit_bias; /* 0..KG_MAX_LOGIT_BIAS */
} kg_sampling_params_t;

/** Defaults: greedy, all filters and penalties off (1, 0, 0), penalty
 * window 64, seed 0, no logprobs. @thread any */
kg_sampling_params_t kg_sampling_params_default(void);

/* xoshiro256** state: small, fast, and identical on every platform. */
typedef struct kg_rng {
    uint64_t s[4];
} kg_rng_t;

/** Fill the state from `seed` with splitmix64 (as the xoshiro authors
 * recommend), so nearby seeds give unrelated streams. @thread any */
void kg_rng_seed(kg_rng_t *rng, uint64_t seed);
/** Next 64 random bits. @thread any */
uint64_t kg_rng_next(kg_rng_t *rng);
/** Uniform in [0, 1) with 53 random bits (one kg_rng_next). @thread any */
double kg_rng_uniform(kg_rng_t *rng);

/** The seed of choice `choice` of a job with n > 1 choices: choice 0 keeps
 * the job's seed (so n = 1 samples as before), the others get a splitmix64
 * mix of (seed, choice): independent streams, the same on every
 * redelivery. @thread any */
uint64_t kg_sampler_choice_seed(uint64_t seed, int32_t choice);

/** The logit a token gets from `logit` under p's logit_bias (rule 0):
 * logit + bias, or -inf for a banned token; `logit` when it has no entry.
 * @thread any */
float kg_sampler_biased_logit(const kg_sampling_params_t *p, int32_t token, float logit);

#define KG_MAX_LOGPROBS 20

/* Top-p histogram of both samplers (kg_sampler.c, gpu/sample.cu): buckets
 * of equal logit width over [l_max - KG_SAMPLER_HIST_RANGE, l_max]. */
#define KG_SAMPLER_HIST_BUCKETS 1024
#define KG_SAMPLER_HIST_RANGE   40.0f

typedef struct kg_sample_result {
    int32_t token;
    float logprob; /* log-softmax of the raw logits at `token` */
    int32_t n_top;
    int32_t top_token[KG_MAX_LOGPROBS];
    float top_logprob[KG_MAX_LOGPROBS];
} kg_sample_result_t;

/* Scratch space for one sampling call, sized for the vocabulary once at
 * startup so the step loop never allocates. Not shared between threads. */
typedef struct kg_sampler_scratch kg_sampler_scratch_t;

/** Scratch for vocabularies of up to `n_vocab` tokens (about 21 bytes per
 * token). Returns NULL when n_vocab <= 0 or memory is short; the caller
 * frees it with kg_sampler_scratch_free. @thread any */
kg_sampler_scratch_t *kg_sampler_scratch_new(int32_t n_vocab);
/** Free a scratch; NULL does nothing. @thread any */
void kg_sampler_scratch_free(kg_sampler_scratch_t *sc);

/** Sample one token from `logits` (n_vocab floats, read only: penalties
 * and filters work on a copy in `sc`). `prompt`/`output` are the sequence's
 * tokens so far, used by the penalties; ids outside [0, n_vocab) are
 * ignored. Draws exactly one kg_rng_uniform from `rng` when temperature > 0
 * and none when greedy. NaN logits count as -inf, +inf as FLT_MAX; if every
 * logit is -inf/NaN all tokens are treated as equally likely. `out->logprob`
 * is always filled (raw log-softmax, may be -inf for a masked token);
 * `out->top_*` only when p->n_logprobs > 0. Never allocates.
 * Requires 0 < n_vocab <= the scratch's n_vocab. @thread engine */
void kg_sampler_sample(const kg_sampling_params_t *p,
                       kg_rng_t *rng,
                       const float *logits,
                       int32_t n_vocab,
                       const int32_t *prompt,
                       int32_t n_prompt,
                       const int32_t *output,
                       int32_t n_output,
                       kg_sampler_scratch_t *sc,
                       kg_sample_result_t *out);

/** kg_sampler_sample with a token bitmask (constrained decoding): when
 * `mask` is not NULL (ceil(n_vocab / 32) words; bit id % 32 of word id / 32
 * is token id), the tokens it leaves out count as -inf before anything
 * else, so penalties, filters, the draw and the logprobs (then those of the
 * allowed tokens) all see only the allowed ones. If no allowed token has a
 * usable logit, the allowed tokens count as 0 (a uniform choice among
 * them). The mask must allow at least one token. @thread engine */
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
                              kg_sample_result_t *out);

/** The distribution kg_sampler_sample draws from: the tokens that survive
 * the penalties and filters, with their probabilities at the temperature
 * (summing to 1), in the order the draw walks them. Greedy gives the one
 * argmax token with probability 1. `ids` and `probs` need room for n_vocab
 * entries. Returns the number of candidates (>= 1). For tests and for
 * checking a device sampler against this reference. @thread engine */
int32_t kg_sampler_candidates(const kg_sampling_params_t *p,
                              const float *logits,
                              int32_t n_vocab,
                              const int32_t *prompt,
                              int32_t n_prompt,
                              const int32_t *output,
                              int32_t n_output,
                              kg_sampler_scratch_t *sc,
                              int32_t *ids,
                              float *probs);
