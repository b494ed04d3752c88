/* kg_sampler: turns one row of logits into one token id.
 *
 * The order of the filters is llama.cpp's default chain: penalties →
 * top-k → top-p → min-p → temperature → draw. Temperature 0 is greedy.
 * Randomness comes only from the sequence's own RNG (seeded by the job),
 * advanced once per sampled token, so a job's output depends only on
 * (model, prompt, parameters, seed), never on what shares its batch. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct kg_sampling_params {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off (divides positive logits, multiplies negative) */
    float frequency_penalty;  /* 0: off (OpenAI semantics, over generated tokens) */
    float presence_penalty;   /* 0: off */
    int32_t penalty_last_n;   /* window for the repetition penalty over prompt+output; -1 = all */
    uint64_t seed;
    int32_t n_logprobs; /* top-n logprobs to report, 0..20 */
} kg_sampling_params_t;

/** Defaults: greedy, all filters off, seed 0, no logprobs. */
kg_sampling_params_t kg_sampling_params_default(void);

/* xoshiro256** state: small, fast, and identical on every platform. */
typedef struct kg_rng {
    uint64_t s[4];
} kg_rng_t;

void kg_rng_seed(kg_rng_t *rng, uint64_t seed);
uint64_t kg_rng_next(kg_rng_t *rng);
/** Uniform in [0, 1). */
double kg_rng_uniform(kg_rng_t *rng);

#define KG_MAX_LOGPROBS 20

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

kg_sampler_scratch_t *kg_sampler_scratch_new(int32_t n_vocab);
void kg_sampler_scratch_free(kg_sampler_scratch_t *sc);

/** Sample from `logits` (n_vocab floats; modified in place by the penalties
 * and filters). `prompt`/`output` are the sequence's tokens so far, used by
 * the penalties. @thread engine */
void kg_sampler_sample(const kg_sampling_params_t *p, kg_rng_t *rng, float *logits, int32_t n_vocab,
                       const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                       int32_t n_output, kg_sampler_scratch_t *sc, kg_sample_result_t *out);
