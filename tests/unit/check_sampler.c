/* check_sampler: the RNG, each filter and penalty, the seeded draw's
 * distribution and reproducibility, raw logprobs, and hostile logits. */
#include "check_common.h"
#include "model/kg_sampler.h"

#include <math.h>
#include <string.h>

// ---- helpers ----

/* A test-local generator, independent of the code under test. */
static uint64_t test_rand_state;

static uint64_t test_rand(void) {
    test_rand_state ^= test_rand_state << 13;
    test_rand_state ^= test_rand_state >> 7;
    test_rand_state ^= test_rand_state << 17;
    return test_rand_state;
}

static double test_unit(void) {
    return (double)(test_rand() >> 11) * 0x1.0p-53;
}

/* LLM-like logits: roughly normal (sum of uniforms) with a few spikes. */
static void fill_logits(float *l, int32_t n, uint64_t seed, float scale) {
    test_rand_state = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int32_t i = 0; i < n; i++) {
        double s = test_unit() + test_unit() + test_unit() + test_unit() - 2.0;
        l[i] = (float)(s * scale);
    }
    for (int32_t j = 0; j < 8; j++) {
        l[test_rand() % (uint64_t)n] += scale * (float)(2 + j);
    }
}

/* Logits whose softmax is `probs`. */
static void logits_from_probs(float *l, const double *probs, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        l[i] = (float)log(probs[i]);
    }
}

static int32_t ref_argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    return best;
}

static const float *sort_key;

static int cmp_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (sort_key[x] != sort_key[y]) {
        return sort_key[x] > sort_key[y] ? -1 : 1;
    }
    return x < y ? -1 : 1;
}

/* Reference nucleus: marks in `keep` the smallest set (by full sort, ties by
 * lower id) of the top `k` (0: all) whose softmax mass reaches p. */
static int32_t ref_nucleus(const float *l, int32_t n, int32_t k, double p, bool *keep) {
    int32_t *order = malloc((size_t)n * sizeof(*order));
    for (int32_t i = 0; i < n; i++) {
        order[i] = i;
        keep[i] = false;
    }
    sort_key = l;
    qsort(order, (size_t)n, sizeof(*order), cmp_desc);
    int32_t m = k > 0 && k < n ? k : n;
    double z = 0.0, max = l[order[0]];
    for (int32_t i = 0; i < m; i++) {
        z += exp(l[order[i]] - max);
    }
    double cum = 0.0;
    int32_t kept = 0;
    for (int32_t i = 0; i < m; i++) {
        keep[order[i]] = true;
        kept++;
        cum += exp(l[order[i]] - max);
        if (cum >= p * z) {
            break;
        }
    }
    free(order);
    return kept;
}

static kg_sample_result_t sample_once(const kg_sampling_params_t *p,
                                      kg_rng_t *rng,
                                      const float *l,
                                      int32_t n,
                                      const int32_t *prompt,
                                      int32_t n_prompt,
                                      const int32_t *output,
                                      int32_t n_output) {
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(n);
    ck_assert_ptr_nonnull(sc);
    kg_sample_result_t r;
    memset(&r, 0xab, sizeof(r));
    kg_sampler_sample(p, rng, l, n, prompt, n_prompt, output, n_output, sc, &r);
    kg_sampler_scratch_free(sc);
    return r;
}

static int32_t greedy_pick(const kg_sampling_params_t *p,
                           const float *l,
                           int32_t n,
                           const int32_t *prompt,
                           int32_t n_prompt,
                           const int32_t *output,
                           int32_t n_output) {
    kg_rng_t rng;
    kg_rng_seed(&rng, 1);
    return sample_once(p, &rng, l, n, prompt, n_prompt, output, n_output).token;
}

// ---- rng ----

START_TEST(rng_reference_vectors) {
    /* splitmix64 from 0: the published first outputs. */
    kg_rng_t rng;
    kg_rng_seed(&rng, 0);
    ck_assert_uint_eq(rng.s[0], 0xe220a8397b1dcdafULL);
    ck_assert_uint_eq(rng.s[1], 0x6e789e6aa1b965f4ULL);
    ck_assert_uint_eq(rng.s[2], 0x06c45d188009454fULL);
    ck_assert_uint_eq(rng.s[3], 0xf88bb8a8724c81ecULL);
    /* xoshiro256** from {1, 2, 3, 4}: the reference implementation's outputs. */
    kg_rng_t x = {{1, 2, 3, 4}};
    ck_assert_uint_eq(kg_rng_next(&x), 11520ULL);
    ck_assert_uint_eq(kg_rng_next(&x), 0ULL);
    ck_assert_uint_eq(kg_rng_next(&x), 1509978240ULL);
    ck_assert_uint_eq(kg_rng_next(&x), 1215971899390074240ULL);
}
END_TEST

START_TEST(rng_uniform_53_bits) {
    kg_rng_t a, b;
    kg_rng_seed(&a, 42);
    b = a;
    double mean = 0.0;
    for (int i = 0; i < 10000; i++) {
        uint64_t bits = kg_rng_next(&b);
        double u = kg_rng_uniform(&a);
        ck_assert(u == (double)(bits >> 11) / 9007199254740992.0);
        ck_assert(u >= 0.0 && u < 1.0);
        mean += u;
    }
    ck_assert_double_eq_tol(mean / 10000.0, 0.5, 0.02);
}
END_TEST

START_TEST(seeds_reproduce) {
    enum { N = 300, STEPS = 200 };
    float l[N];
    fill_logits(l, N, 3, 1.0f);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.95f;
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    int32_t seq[3][STEPS];
    uint64_t seeds[3] = {7, 7, 8};
    for (int r = 0; r < 3; r++) {
        kg_rng_t rng;
        kg_rng_seed(&rng, seeds[r]);
        for (int i = 0; i < STEPS; i++) {
            kg_sample_result_t out;
            kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &out);
            seq[r][i] = out.token;
        }
    }
    ck_assert_mem_eq(seq[0], seq[1], sizeof(seq[0]));
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        differ += seq[0][i] != seq[2][i];
    }
    ck_assert_int_gt(differ, STEPS / 4);
    kg_sampler_scratch_free(sc);
}
END_TEST

// ---- defaults, greedy ----

START_TEST(defaults) {
    kg_sampling_params_t p = kg_sampling_params_default();
    ck_assert_float_eq(p.temperature, 0.0f);
    ck_assert_int_eq(p.top_k, 0);
    ck_assert_float_eq(p.top_p, 1.0f);
    ck_assert_float_eq(p.min_p, 0.0f);
    ck_assert_float_eq(p.repetition_penalty, 1.0f);
    ck_assert_float_eq(p.frequency_penalty, 0.0f);
    ck_assert_float_eq(p.presence_penalty, 0.0f);
    ck_assert_int_eq(p.penalty_last_n, 64);
    ck_assert_uint_eq(p.seed, 0);
    ck_assert_int_eq(p.n_logprobs, 0);
    ck_assert_ptr_null(kg_sampler_scratch_new(0));
    kg_sampler_scratch_free(NULL);
}
END_TEST

START_TEST(greedy_argmax_and_ties) {
    float l[] = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f};
    kg_sampling_params_t p = kg_sampling_params_default();
    kg_rng_t rng, before;
    kg_rng_seed(&rng, 5);
    before = rng;
    kg_sample_result_t r = sample_once(&p, &rng, l, 5, NULL, 0, NULL, 0);
    ck_assert_int_eq(r.token, 1);                 /* tie between 1 and 3: the lower id */
    ck_assert_mem_eq(&rng, &before, sizeof(rng)); /* greedy draws nothing */
    p.temperature = -1.0f;
    ck_assert_int_eq(greedy_pick(&p, l, 5, NULL, 0, NULL, 0), 1);
    enum { N = 4096 };
    static float big[N];
    /* ties in the same vector lane (ids 8 apart) and across lanes */
    for (int i = 0; i < N; i++) {
        big[i] = (float)(i % 7) * 0.1f;
    }
    big[1003] = big[1011] = big[3003] = 5.0f;
    ck_assert_int_eq(greedy_pick(&p, big, N, NULL, 0, NULL, 0), 1003);
    big[1002] = 5.0f;
    ck_assert_int_eq(greedy_pick(&p, big, N, NULL, 0, NULL, 0), 1002);
    for (uint64_t s = 1; s <= 20; s++) {
        fill_logits(big, N, s, 2.0f);
        p.temperature = 0.0f;
        ck_assert_int_eq(greedy_pick(&p, big, N, NULL, 0, NULL, 0), ref_argmax(big, N));
    }
}
END_TEST

START_TEST(top_k_one_is_greedy) {
    enum { N = 1000 };
    static float l[N];
    kg_sampling_params_t p = kg_sampling_params_default();
    p.top_k = 1;
    float temps[] = {0.05f, 1.0f, 10.0f, 1000.0f};
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    for (uint64_t s = 1; s <= 10; s++) {
        fill_logits(l, N, s, 1.0f);
        /* a tie for first place: the lower id must win */
        l[N - 1] = l[ref_argmax(l, N)];
        int32_t want = ref_argmax(l, N);
        for (int t = 0; t < 4; t++) {
            p.temperature = temps[t];
            kg_rng_t rng;
            kg_rng_seed(&rng, s * 10 + (uint64_t)t);
            for (int i = 0; i < 20; i++) {
                kg_sample_result_t r;
                kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
                ck_assert_int_eq(r.token, want);
            }
        }
    }
    kg_sampler_scratch_free(sc);
}
END_TEST

// ---- filters ----

/* Probabilities listed out of order so ids and ranks differ. */
static const double five_probs[] = {0.15, 0.5, 0.05, 0.2, 0.1};

static int32_t
candidates(const kg_sampling_params_t *p, const float *l, int32_t n, int32_t *ids, float *probs) {
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(n);
    int32_t k = kg_sampler_candidates(p, l, n, NULL, 0, NULL, 0, sc, ids, probs);
    kg_sampler_scratch_free(sc);
    return k;
}

static bool has_id(const int32_t *ids, int32_t n, int32_t id) {
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] == id) {
            return true;
        }
    }
    return false;
}

START_TEST(top_p_smallest_set) {
    float l[5];
    logits_from_probs(l, five_probs, 5);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 1.0f;
    int32_t ids[5];
    float probs[5];
    /* by rank the ids are 1, 3, 0, 4, 2 (0.5, 0.2, 0.15, 0.1, 0.05); after
     * top-k 4 the mass is renormalised over 0.95 first (0.526, 0.737, 0.895, 1) */
    const int32_t ranked[] = {1, 3, 0, 4, 2};
    struct {
        float top_p;
        int32_t n_all, n_top4;
    } cases[] = {
        {0.3f, 1, 1}, {0.49f, 1, 1}, {0.68f, 2, 2},  {0.72f, 3, 2},
        {0.8f, 3, 3}, {0.9f, 4, 4},  {0.999f, 5, 4},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        p.top_p = cases[c].top_p;
        for (int use_top_k = 0; use_top_k < 2; use_top_k++) {
            p.top_k = use_top_k ? 4 : 0; /* sorted path (top-k first) and unsorted path */
            int32_t n = candidates(&p, l, 5, ids, probs);
            int32_t want_n = use_top_k ? cases[c].n_top4 : cases[c].n_all;
            ck_assert_msg(n == want_n, "top_p=%g top_k=%d: %d kept", (double)p.top_p, p.top_k, n);
            double mass = 0.0;
            for (int32_t i = 0; i < want_n; i++) {
                ck_assert(has_id(ids, n, ranked[i]));
                mass += five_probs[ranked[i]];
            }
            /* survivors are renormalised */
            for (int32_t i = 0; i < n; i++) {
                ck_assert_double_eq_tol(probs[i], five_probs[ids[i]] / mass, 1e-5);
            }
        }
    }
}
END_TEST

/* The histogram path against a full sort on big, LLM-like vocabularies. */
START_TEST(top_p_matches_full_sort) {
    const int32_t sizes[] = {50, 5000, 32000};
    const float ps[] = {0.1f, 0.5f, 0.9f, 0.95f, 0.99f, 0.9999f};
    const float scales[] = {0.3f, 1.0f, 3.0f};
    int32_t nmax = 32000;
    float *l = malloc((size_t)nmax * sizeof(*l));
    bool *keep = malloc((size_t)nmax);
    int32_t *ids = malloc((size_t)nmax * sizeof(*ids));
    float *probs = malloc((size_t)nmax * sizeof(*probs));
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(nmax);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 0.7f;
    for (int si = 0; si < 3; si++) {
        for (int ci = 0; ci < 3; ci++) {
            int32_t n = sizes[si];
            fill_logits(l, n, (uint64_t)(si * 3 + ci + 1), scales[ci]);
            for (int pi = 0; pi < 6; pi++) {
                for (int k = 0; k <= 200; k += 200) {
                    p.top_p = ps[pi];
                    p.top_k = k;
                    int32_t want = ref_nucleus(l, n, k, ps[pi], keep);
                    int32_t got = kg_sampler_candidates(&p, l, n, NULL, 0, NULL, 0, sc, ids, probs);
                    ck_assert_int_eq(got, want);
                    double sum = 0.0;
                    for (int32_t i = 0; i < got; i++) {
                        ck_assert(keep[ids[i]]);
                        sum += probs[i];
                    }
                    ck_assert_double_eq_tol(sum, 1.0, 1e-4);
                }
            }
        }
    }
    kg_sampler_scratch_free(sc);
    free(l);
    free(keep);
    free(ids);
    free(probs);
}
END_TEST

/* Ties at the nucleus boundary go to the lower ids, also in a long run of
 * equal logits (a uniform row). */
START_TEST(top_p_ties_by_lower_id) {
    enum { N = 5000 };
    static float l[N];
    static int32_t ids[N];
    static float probs[N];
    static bool keep[N];
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    for (int32_t i = 0; i < N; i++) {
        l[i] = 1.0f;
    }
    int32_t got = kg_sampler_candidates(&p, l, N, NULL, 0, NULL, 0, sc, ids, probs);
    ck_assert_int_eq(got, N / 2);
    for (int32_t i = 0; i < got; i++) {
        ck_assert_int_lt(ids[i], N / 2);
    }
    /* a run of 3000 ties below a few distinct leaders */
    for (int32_t i = 0; i < N; i++) {
        l[i] = i % 5 == 0 ? 0.5f : (i % 5 == 1 ? -3.0f : 0.0f);
    }
    l[4321] = 9.0f;
    l[17] = 7.5f;
    const float ps[] = {0.95f, 0.99f, 0.999f};
    for (int k = 0; k < 3; k++) {
        p.top_p = ps[k];
        int32_t want = ref_nucleus(l, N, 0, ps[k], keep);
        got = kg_sampler_candidates(&p, l, N, NULL, 0, NULL, 0, sc, ids, probs);
        ck_assert_int_eq(got, want);
        for (int32_t i = 0; i < got; i++) {
            ck_assert(keep[ids[i]]);
        }
    }
    kg_sampler_scratch_free(sc);
}
END_TEST

START_TEST(top_k_keeps_k_best) {
    enum { N = 3000 };
    static float l[N];
    static bool keep[N];
    static int32_t ids[N];
    static float probs[N];
    fill_logits(l, N, 11, 1.0f);
    l[17] = l[2999] = 50.0f; /* a tie at the top */
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 1.0f;
    const int32_t ks[] = {1, 2, 5, 40, 1000, 2999, 3000, 100000};
    for (int i = 0; i < 8; i++) {
        p.top_k = ks[i];
        int32_t want = ref_nucleus(l, N, ks[i], 2.0, keep); /* p > 1: the whole top-k */
        int32_t got = candidates(&p, l, N, ids, probs);
        ck_assert_int_eq(got, want);
        for (int32_t j = 0; j < got; j++) {
            ck_assert(keep[ids[j]]);
        }
    }
    p.top_k = 1;
    ck_assert_int_eq(candidates(&p, l, N, ids, probs), 1);
    ck_assert_int_eq(ids[0], 17);
}
END_TEST

START_TEST(min_p_filter) {
    float l[5];
    logits_from_probs(l, five_probs, 5);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.temperature = 1.0f;
    int32_t ids[5];
    float probs[5];
    p.min_p = 0.25f; /* keep p >= 0.125: ids 1, 3, 0 */
    ck_assert_int_eq(candidates(&p, l, 5, ids, probs), 3);
    ck_assert(has_id(ids, 3, 1) && has_id(ids, 3, 3) && has_id(ids, 3, 0));
    ck_assert_double_eq_tol(probs[0] + probs[1] + probs[2], 1.0, 1e-5);
    p.min_p = 0.35f; /* keep p >= 0.175: ids 1, 3 */
    ck_assert_int_eq(candidates(&p, l, 5, ids, probs), 2);
    ck_assert(has_id(ids, 2, 1) && has_id(ids, 2, 3));
    p.min_p = 1.0f;
    ck_assert_int_eq(candidates(&p, l, 5, ids, probs), 1);
    ck_assert_int_eq(ids[0], 1);
    /* min-p looks at the temperature-1 probabilities even at another temperature */
    p.min_p = 0.25f;
    p.temperature = 3.0f;
    ck_assert_int_eq(candidates(&p, l, 5, ids, probs), 3);
}
END_TEST

START_TEST(temperature_reshapes) {
    float l[5];
    logits_from_probs(l, five_probs, 5);
    kg_sampling_params_t p = kg_sampling_params_default();
    int32_t ids[5];
    float probs[5];
    const float temps[] = {0.5f, 1.0f, 2.0f};
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        ck_assert_int_eq(candidates(&p, l, 5, ids, probs), 5);
        double z = 0.0;
        for (int i = 0; i < 5; i++) {
            z += pow(five_probs[i], 1.0 / temps[t]);
        }
        for (int i = 0; i < 5; i++) {
            ck_assert_double_eq_tol(probs[i], pow(five_probs[ids[i]], 1.0 / temps[t]) / z, 1e-5);
        }
    }
}
END_TEST

// ---- penalties ----

START_TEST(repetition_penalty_flips) {
    float l[] = {2.0f, 1.8f, -1.0f, -1.1f, 0.0f};
    kg_sampling_params_t p = kg_sampling_params_default();
    int32_t prompt[] = {4, 0, 4};
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, NULL, 0), 0);
    p.repetition_penalty = 1.2f; /* 2.0 / 1.2 = 1.67 < 1.8 */
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, NULL, 0), 1);
    /* the window: token 0 is second to last in prompt ++ output */
    int32_t output[] = {3};
    p.penalty_last_n = 2;
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, output, 0), 1);
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, output, 1), 0); /* 0 left the window */
    p.penalty_last_n = 3;
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, output, 1), 1);
    p.penalty_last_n = 0;
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, output, 1), 0);
    p.penalty_last_n = -1;
    ck_assert_int_eq(greedy_pick(&p, l, 5, prompt, 3, output, 1), 1);
    /* a window inside the output: 0 was generated, then left the window */
    int32_t long_out[] = {0, 3, 3};
    p.penalty_last_n = 2;
    ck_assert_int_eq(greedy_pick(&p, l, 5, NULL, 0, long_out, 3), 0);
    p.penalty_last_n = 3;
    ck_assert_int_eq(greedy_pick(&p, l, 5, NULL, 0, long_out, 3), 1);
    p.penalty_last_n = -1;
    /* negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1 */
    float neg[] = {-1.0f, -1.1f};
    int32_t out0[] = {0};
    ck_assert_int_eq(greedy_pick(&p, neg, 2, NULL, 0, out0, 1), 1);
    /* a repeated token is penalised once, not once per occurrence */
    float near[] = {2.0f, 1.5f};
    int32_t rep[] = {0, 0, 0, 0};
    ck_assert_int_eq(greedy_pick(&p, near, 2, rep, 4, NULL, 0), 0); /* 1.67 > 1.5 */
    /* out-of-range ids in the history are ignored */
    int32_t junk[] = {-5, 99, 1 << 30};
    ck_assert_int_eq(greedy_pick(&p, l, 5, junk, 3, junk, 3), 0);
}
END_TEST

START_TEST(frequency_presence_penalties) {
    float l[] = {3.0f, 2.5f, 2.0f};
    int32_t output[] = {0, 2, 0};
    int32_t prompt[] = {1, 1, 1};
    kg_sampling_params_t p = kg_sampling_params_default();
    p.frequency_penalty = 0.2f; /* 3 - 2*0.2 = 2.6 > 2.5 */
    ck_assert_int_eq(greedy_pick(&p, l, 3, prompt, 3, output, 3), 0);
    p.frequency_penalty = 0.3f; /* 2.4 < 2.5; the prompt's 1s do not count */
    ck_assert_int_eq(greedy_pick(&p, l, 3, prompt, 3, output, 3), 1);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.6f; /* 2.4 */
    ck_assert_int_eq(greedy_pick(&p, l, 3, prompt, 3, output, 3), 1);
    p.presence_penalty = 0.4f; /* 2.6 */
    ck_assert_int_eq(greedy_pick(&p, l, 3, prompt, 3, output, 3), 0);
    /* exact values through the distribution: l0' = 3 - 2*0.25 - 0.1 = 2.4,
     * l2' = 2 - 0.25 - 0.1 = 1.65, l1 untouched */
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.1f;
    p.temperature = 1.0f;
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(3);
    int32_t ids[3];
    float probs[3];
    ck_assert_int_eq(kg_sampler_candidates(&p, l, 3, prompt, 3, output, 3, sc, ids, probs), 3);
    double pr[3];
    for (int i = 0; i < 3; i++) {
        pr[ids[i]] = probs[i];
    }
    ck_assert_double_eq_tol(log(pr[0] / pr[1]), 2.4 - 2.5, 1e-5);
    ck_assert_double_eq_tol(log(pr[2] / pr[1]), 1.65 - 2.5, 1e-5);
    /* the counts were cleared: no output now means no penalty */
    ck_assert_int_eq(kg_sampler_candidates(&p, l, 3, prompt, 3, output, 0, sc, ids, probs), 3);
    for (int i = 0; i < 3; i++) {
        pr[ids[i]] = probs[i];
    }
    ck_assert_double_eq_tol(log(pr[0] / pr[1]), 0.5, 1e-5);
    kg_sampler_scratch_free(sc);
}
END_TEST

// ---- the draw ----

/* Chi-square of `draws` seeded draws against the expected distribution. */
static double chi_square(const kg_sampling_params_t *p,
                         const float *l,
                         int32_t n,
                         const double *expect,
                         int draws,
                         uint64_t seed) {
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(n);
    int *hits = calloc((size_t)n, sizeof(*hits));
    kg_rng_t rng;
    kg_rng_seed(&rng, seed);
    for (int i = 0; i < draws; i++) {
        kg_sample_result_t r;
        kg_sampler_sample(p, &rng, l, n, NULL, 0, NULL, 0, sc, &r);
        ck_assert(r.token >= 0 && r.token < n);
        hits[r.token]++;
    }
    double chi = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (expect[i] == 0.0) {
            ck_assert_int_eq(hits[i], 0); /* filtered tokens never come out */
            continue;
        }
        double e = expect[i] * draws;
        chi += (hits[i] - e) * (hits[i] - e) / e;
    }
    free(hits);
    kg_sampler_scratch_free(sc);
    return chi;
}

START_TEST(draws_match_softmax) {
    enum { N = 8, DRAWS = 20000 };
    const float l[N] = {0.0f, 1.0f, -0.5f, 2.0f, 0.3f, -2.0f, 1.5f, -1.0f};
    double expect[N], z = 0.0;
    kg_sampling_params_t p = kg_sampling_params_default();
    /* 7 degrees of freedom: P(chi2 > 40) is about 1e-6; the seeds are fixed,
     * so this cannot flake, and a wrong distribution scores in the hundreds. */
    const double bound = 40.0;
    const float temps[] = {1.0f, 0.6f, 1.7f};
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        z = 0.0;
        for (int i = 0; i < N; i++) {
            expect[i] = exp(l[i] / temps[t]);
            z += expect[i];
        }
        for (int i = 0; i < N; i++) {
            expect[i] /= z;
        }
        double chi = chi_square(&p, l, N, expect, DRAWS, 1234 + (uint64_t)t);
        ck_assert_msg(chi < bound, "T=%g chi2=%g", temps[t], chi);
    }
    /* a wider row, so the draw walks several blocks of 8 */
    enum { W = 61 };
    float wide[W];
    double wexp[W];
    z = 0.0;
    for (int i = 0; i < W; i++) {
        wide[i] = (float)((i * 37) % 11) * 0.25f;
        wexp[i] = exp(wide[i]);
        z += wexp[i];
    }
    for (int i = 0; i < W; i++) {
        wexp[i] /= z;
    }
    p.temperature = 1.0f;
    /* 60 degrees of freedom: P(chi2 > 120) is below 1e-5 */
    double chi_w = chi_square(&p, wide, W, wexp, 40000, 77);
    ck_assert_msg(chi_w < 120.0, "wide chi2=%g", chi_w);
    /* top-k 4 then T=1: the 4 best renormalised (sorted path) */
    p.temperature = 1.0f;
    p.top_k = 4;
    z = 0.0;
    for (int i = 0; i < N; i++) {
        expect[i] = (i == 3 || i == 6 || i == 1 || i == 4) ? exp(l[i]) : 0.0;
        z += expect[i];
    }
    for (int i = 0; i < N; i++) {
        expect[i] /= z;
    }
    ck_assert_double_lt(chi_square(&p, l, N, expect, DRAWS, 99), bound);
    /* top-p 0.85 without top-k (histogram path): tokens 3, 6, 1, 4 hold
     * 0.41 + 0.25 + 0.15 + 0.07 = 0.88 >= 0.85 of the mass, the first three 0.81 */
    p.top_k = 0;
    p.top_p = 0.85f;
    ck_assert_double_lt(chi_square(&p, l, N, expect, DRAWS, 100), bound);
}
END_TEST

/* The documented draw: the kept tokens in ascending id order, the first
 * whose cumulative probability exceeds u, for every filter path. */
START_TEST(draw_is_inverse_cdf_in_id_order) {
    enum { N = 3000 };
    static float l[N];
    static int32_t ids[N];
    static float probs[N];
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    kg_sampling_params_t configs[6];
    for (int c = 0; c < 6; c++) {
        configs[c] = kg_sampling_params_default();
        configs[c].temperature = 0.9f;
    }
    configs[1].top_k = 20;
    configs[2].top_k = 300;
    configs[2].top_p = 0.8f;
    configs[3].top_p = 0.95f; /* the heap fast path on the peaked row */
    configs[4].min_p = 0.02f;
    configs[5].top_p = 0.7f; /* the histogram path on the flat row */
    int mismatches = 0, draws = 0;
    for (int flat = 0; flat < 2; flat++) {
        fill_logits(l, N, 51 + (uint64_t)flat, flat ? 0.2f : 2.0f);
        for (int c = 0; c < 6; c++) {
            int32_t n = kg_sampler_candidates(&configs[c], l, N, NULL, 0, NULL, 0, sc, ids, probs);
            for (int32_t i = 1; i < n; i++) {
                ck_assert_int_lt(ids[i - 1], ids[i]);
            }
            kg_rng_t rng;
            kg_rng_seed(&rng, 1000 + (uint64_t)c);
            for (int d = 0; d < 200; d++) {
                kg_rng_t peek = rng;
                double u = kg_rng_uniform(&peek);
                int32_t want = ids[n - 1];
                double cum = 0.0;
                for (int32_t i = 0; i < n; i++) {
                    cum += probs[i];
                    if (u < cum) {
                        want = ids[i];
                        break;
                    }
                }
                kg_sample_result_t r;
                kg_sampler_sample(&configs[c], &rng, l, N, NULL, 0, NULL, 0, sc, &r);
                mismatches += r.token != want;
                draws++;
            }
        }
    }
    /* float rounding of the normalised reference may move a draw that lands
     * within ~1e-6 of a boundary; more than that is a different rule */
    ck_assert_int_le(mismatches, draws / 1000);
    kg_sampler_scratch_free(sc);
}
END_TEST

START_TEST(one_draw_per_token) {
    enum { N = 2000 };
    static float l[N];
    fill_logits(l, N, 21, 1.0f);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    kg_sampling_params_t configs[6];
    for (int i = 0; i < 6; i++) {
        configs[i] = kg_sampling_params_default();
        configs[i].temperature = 0.8f;
    }
    configs[1].top_k = 1;
    configs[2].top_p = 0.01f; /* leaves one token */
    configs[3].min_p = 1.0f;
    configs[4].top_k = 50;
    configs[4].top_p = 0.9f;
    configs[4].min_p = 0.05f;
    configs[5].repetition_penalty = 1.3f;
    configs[5].frequency_penalty = 0.5f;
    configs[5].n_logprobs = 5;
    int32_t hist[] = {1, 2, 3, 1, 1};
    for (int c = 0; c < 6; c++) {
        kg_rng_t rng, expect;
        kg_rng_seed(&rng, (uint64_t)c);
        for (int step = 0; step < 50; step++) {
            expect = rng;
            (void)kg_rng_next(&expect);
            kg_sample_result_t r;
            kg_sampler_sample(&configs[c], &rng, l, N, hist, 5, hist, 5, sc, &r);
            ck_assert_mem_eq(&rng, &expect, sizeof(rng));
        }
    }
    kg_sampler_scratch_free(sc);
}
END_TEST

// ---- logprobs ----

START_TEST(logprobs_raw_and_sorted) {
    enum { N = 16 };
    float l[N];
    fill_logits(l, N, 31, 1.5f);
    l[9] = l[4]; /* a tie */
    double max = l[ref_argmax(l, N)], z = 0.0;
    for (int i = 0; i < N; i++) {
        z += exp(l[i] - max);
    }
    double lse = max + log(z);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.n_logprobs = N;
    kg_rng_t rng;
    kg_rng_seed(&rng, 3);
    kg_sample_result_t r = sample_once(&p, &rng, l, N, NULL, 0, NULL, 0);
    ck_assert_int_eq(r.n_top, N);
    double sum = 0.0;
    for (int i = 0; i < N; i++) {
        sum += exp(r.top_logprob[i]);
        ck_assert_double_eq_tol(r.top_logprob[i], l[r.top_token[i]] - lse, 1e-5);
        if (i > 0) {
            ck_assert(
                r.top_logprob[i - 1] > r.top_logprob[i] ||
                (r.top_logprob[i - 1] == r.top_logprob[i] && r.top_token[i - 1] < r.top_token[i]));
        }
    }
    ck_assert_double_eq_tol(sum, 1.0, 1e-5);
    /* more than KG_MAX_LOGPROBS is clamped; none asked: none computed */
    enum { M = 500 };
    static float big[M];
    fill_logits(big, M, 32, 1.0f);
    p.n_logprobs = 50;
    r = sample_once(&p, &rng, big, M, NULL, 0, NULL, 0);
    ck_assert_int_eq(r.n_top, KG_MAX_LOGPROBS);
    ck_assert_int_eq(r.top_token[0], ref_argmax(big, M));
    p.n_logprobs = 0;
    r = sample_once(&p, &rng, big, M, NULL, 0, NULL, 0);
    ck_assert_int_eq(r.n_top, 0);
}
END_TEST

START_TEST(logprob_is_raw_under_penalties) {
    float l[] = {2.0f, 1.8f, 0.0f};
    double lse = log(exp(2.0) + exp(1.8) + exp(0.0));
    kg_sampling_params_t p = kg_sampling_params_default();
    p.repetition_penalty = 2.0f;
    p.n_logprobs = 3;
    int32_t prompt[] = {0};
    kg_rng_t rng;
    kg_rng_seed(&rng, 1);
    kg_sample_result_t r = sample_once(&p, &rng, l, 3, prompt, 1, NULL, 0);
    ck_assert_int_eq(r.token, 1);                        /* the penalty moved the choice ... */
    ck_assert_double_eq_tol(r.logprob, 1.8 - lse, 1e-5); /* ... not the logprob */
    ck_assert_int_eq(r.top_token[0], 0);
    ck_assert_double_eq_tol(r.top_logprob[0], 2.0 - lse, 1e-5);
    /* sampled tokens carry their raw logprob too */
    p.temperature = 1.0f;
    for (int i = 0; i < 50; i++) {
        r = sample_once(&p, &rng, l, 3, prompt, 1, NULL, 0);
        ck_assert_double_eq_tol(r.logprob, l[r.token] - lse, 1e-5);
    }
}
END_TEST

// ---- logit_bias and choice seeds ----

START_TEST(logit_bias_ban_force_shift) {
    enum { N = 300 };
    static float l[N];
    fill_logits(l, N, 41, 1.5f);
    int32_t best = ref_argmax(l, N);
    kg_sampling_params_t p = kg_sampling_params_default();
    kg_rng_t rng;
    kg_rng_seed(&rng, 9);
    /* -100 bans: never drawn, not even greedy, and its logprob is -inf */
    kg_logit_bias_t ban = {best, -100.0f};
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    p.n_logprobs = 5;
    kg_sample_result_t r = sample_once(&p, &rng, l, N, NULL, 0, NULL, 0);
    ck_assert_int_ne(r.token, best);
    for (int i = 0; i < r.n_top; i++) {
        ck_assert_int_ne(r.top_token[i], best);
    }
    p.temperature = 2.0f;
    for (int i = 0; i < 2000; i++) {
        ck_assert_int_ne(sample_once(&p, &rng, l, N, NULL, 0, NULL, 0).token, best);
    }
    ck_assert(kg_sampler_biased_logit(&p, best, 1.0f) == -INFINITY);
    ck_assert(kg_sampler_biased_logit(&p, best + 1, 1.0f) == 1.0f);
    /* +100 at temperature 0 forces the token; its logprob is about 0 */
    int32_t worst = 0;
    for (int i = 1; i < N; i++) {
        worst = l[i] < l[worst] ? i : worst;
    }
    kg_logit_bias_t force = {worst, 100.0f};
    p.logit_bias = &force;
    p.temperature = 0.0f;
    r = sample_once(&p, &rng, l, N, NULL, 0, NULL, 0);
    ck_assert_int_eq(r.token, worst);
    ck_assert_double_eq_tol(r.logprob, 0.0, 1e-4);
    ck_assert_int_eq(r.top_token[0], worst);
    /* a moderate bias shifts the distribution exactly by e^bias */
    float two[2] = {0.0f, 0.0f};
    kg_logit_bias_t shift = {1, (float)log(3.0)};
    p.logit_bias = &shift;
    p.temperature = 1.0f;
    p.n_logprobs = 2;
    r = sample_once(&p, &rng, two, 2, NULL, 0, NULL, 0);
    ck_assert_double_eq_tol(r.top_logprob[0], log(0.75), 1e-5);
    ck_assert_int_eq(r.top_token[0], 1);
    int n1 = 0;
    for (int i = 0; i < 20000; i++) {
        n1 += sample_once(&p, &rng, two, 2, NULL, 0, NULL, 0).token == 1;
    }
    ck_assert_double_eq_tol(n1 / 20000.0, 0.75, 0.02);
    /* entries for tokens outside the vocabulary are ignored */
    kg_logit_bias_t outside = {N + 5, 100.0f};
    p.logit_bias = &outside;
    p.temperature = 0.0f;
    ck_assert_int_eq(sample_once(&p, &rng, l, N, NULL, 0, NULL, 0).token, best);
}
END_TEST

START_TEST(choice_seeds) {
    ck_assert_uint_eq(kg_sampler_choice_seed(1234, 0), 1234);
    uint64_t seen[16];
    for (int c = 0; c < 16; c++) {
        seen[c] = kg_sampler_choice_seed(1234, c);
        ck_assert_uint_eq(seen[c], kg_sampler_choice_seed(1234, c)); /* deterministic */
        for (int d = 0; d < c; d++) {
            ck_assert_uint_ne(seen[c], seen[d]);
        }
    }
    ck_assert_uint_ne(kg_sampler_choice_seed(1234, 1), kg_sampler_choice_seed(1235, 1));
}
END_TEST

// ---- big and hostile inputs ----

START_TEST(huge_vocab) {
    enum { N = 128256 };
    float *l = malloc(N * sizeof(*l));
    bool *keep = malloc(N);
    fill_logits(l, N, 41, 2.0f);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    kg_sampling_params_t p = kg_sampling_params_default();
    kg_rng_t rng;
    kg_rng_seed(&rng, 1);
    kg_sample_result_t r;
    kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
    ck_assert_int_eq(r.token, ref_argmax(l, N));
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    ref_nucleus(l, N, 0, 0.9, keep);
    for (int i = 0; i < 30; i++) {
        kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
        ck_assert(r.token >= 0 && r.token < N && keep[r.token]);
    }
    p.top_p = 1.0f;
    p.top_k = 40;
    ref_nucleus(l, N, 40, 2.0, keep);
    for (int i = 0; i < 30; i++) {
        kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
        ck_assert(keep[r.token]);
    }
    /* a smaller vocabulary on the same scratch */
    p.top_k = 0;
    kg_sampler_sample(&p, &rng, l, 1000, NULL, 0, NULL, 0, sc, &r);
    ck_assert(r.token >= 0 && r.token < 1000);
    kg_sampler_scratch_free(sc);
    free(l);
    free(keep);
}
END_TEST

START_TEST(nan_and_inf_logits) {
    enum { N = 64 };
    float l[N];
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(N);
    kg_sampling_params_t p = kg_sampling_params_default();
    p.n_logprobs = 5;
    kg_rng_t rng;
    kg_rng_seed(&rng, 9);
    kg_sample_result_t r;
    /* all NaN: a valid id and a finite logprob (uniform), greedy and sampled */
    for (int i = 0; i < N; i++) {
        l[i] = NAN;
    }
    const float temps[] = {0.0f, 1.0f};
    for (int t = 0; t < 2; t++) {
        p.temperature = temps[t];
        p.top_p = t ? 0.5f : 1.0f;
        kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
        ck_assert(r.token >= 0 && r.token < N);
        ck_assert_double_eq_tol(r.logprob, -log((double)N), 1e-5);
    }
    /* NaN never wins; +inf always does; -inf never drawn */
    for (int i = 0; i < N; i++) {
        l[i] = (i % 3 == 0) ? NAN : (i % 3 == 1) ? -INFINITY : 0.1f * (float)i;
    }
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    for (int i = 0; i < 500; i++) {
        kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
        ck_assert(r.token >= 0 && r.token < N);
        ck_assert_int_eq(r.token % 3, 2);
        ck_assert(isfinite(r.logprob));
    }
    l[40] = INFINITY;
    const float tops[] = {1.0f, 0.9f};
    for (int t = 0; t < 2; t++) {
        p.top_p = tops[t];
        kg_sampler_sample(&p, &rng, l, N, NULL, 0, NULL, 0, sc, &r);
        ck_assert_int_eq(r.token, 40);
        ck_assert_int_eq(r.top_token[0], 40);
    }
    /* hostile parameters: still an id in range */
    p.temperature = INFINITY;
    p.repetition_penalty = 0.001f;
    int32_t hist[] = {40, 2, 5};
    kg_sampler_sample(&p, &rng, l, N, hist, 3, hist, 3, sc, &r);
    ck_assert(r.token >= 0 && r.token < N);
    p.temperature = 1e-30f;
    p.min_p = NAN;
    p.top_p = NAN;
    kg_sampler_sample(&p, &rng, l, N, hist, 3, hist, 3, sc, &r);
    ck_assert_int_eq(r.token, 40);
    kg_sampler_scratch_free(sc);
}
END_TEST

/* Constrained decoding: a mask removes tokens before everything else, so
 * greedy and every filter see only the allowed ones, logprobs are those of
 * the allowed tokens, and with no usable allowed logit the choice is
 * uniform over the allowed tokens. */
START_TEST(masked_sampling) {
    enum { NV = 1003 };
    float logits[NV];
    uint32_t mask[(NV + 31) / 32];
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(NV);
    kg_rng_t rng;
    kg_rng_seed(&rng, 3);
    for (int i = 0; i < NV; i++) {
        logits[i] = (float)((i * 37) % 101) / 10.0f; /* best: i % 101 == 100 */
    }
    memset(mask, 0, sizeof(mask));
    for (int i = 0; i < NV; i += 7) {
        mask[i >> 5] |= 1u << (i & 31);
    }
    kg_sampling_params_t p = kg_sampling_params_default();
    kg_sample_result_t r;
    /* greedy: the best allowed token, with its log-softmax over the allowed */
    kg_sampler_sample_masked(&p, &rng, logits, mask, NV, NULL, 0, NULL, 0, sc, &r);
    int best = -1;
    double z = 0.0;
    for (int i = 0; i < NV; i += 7) {
        if (best < 0 || logits[i] > logits[best]) {
            best = i;
        }
    }
    for (int i = 0; i < NV; i += 7) {
        z += exp((double)logits[i] - logits[best]);
    }
    ck_assert_int_eq(r.token, best);
    ck_assert_double_eq_tol(r.logprob, -log(z), 1e-4);
    /* sampled with filters: always allowed */
    p.temperature = 1.5f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.n_logprobs = 3;
    for (int k = 0; k < 200; k++) {
        kg_sampler_sample_masked(&p, &rng, logits, mask, NV, NULL, 0, NULL, 0, sc, &r);
        ck_assert_int_eq(r.token % 7, 0);
        for (int t = 0; t < r.n_top; t++) {
            ck_assert_int_eq(r.top_token[t] % 7, 0);
        }
    }
    /* no usable allowed logit: uniform over the allowed (greedy: the lowest) */
    for (int i = 0; i < NV; i += 7) {
        logits[i] = i % 2 ? -INFINITY : NAN;
    }
    p = kg_sampling_params_default();
    kg_sampler_sample_masked(&p, &rng, logits, mask, NV, NULL, 0, NULL, 0, sc, &r);
    ck_assert_int_eq(r.token, 0);
    p.temperature = 1.0f;
    int seen[NV] = {0};
    for (int k = 0; k < 2000; k++) {
        kg_sampler_sample_masked(&p, &rng, logits, mask, NV, NULL, 0, NULL, 0, sc, &r);
        ck_assert_int_eq(r.token % 7, 0);
        seen[r.token]++;
        ck_assert_double_eq_tol(r.logprob, -log((NV + 6) / 7), 1e-4);
    }
    int distinct = 0;
    for (int i = 0; i < NV; i++) {
        distinct += seen[i] > 0;
    }
    ck_assert_int_gt(distinct, 100); /* of 144 allowed */
    /* a NULL mask is the unmasked sampler */
    kg_rng_t a, b;
    kg_rng_seed(&a, 9);
    b = a;
    kg_sample_result_t r1, r2;
    for (int i = 0; i < NV; i++) {
        logits[i] = (float)((i * 13) % 17);
    }
    kg_sampler_sample_masked(&p, &a, logits, NULL, NV, NULL, 0, NULL, 0, sc, &r1);
    kg_sampler_sample(&p, &b, logits, NV, NULL, 0, NULL, 0, sc, &r2);
    ck_assert_int_eq(r1.token, r2.token);
    kg_sampler_scratch_free(sc);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("rng");
    tcase_add_test(tc, rng_reference_vectors);
    tcase_add_test(tc, rng_uniform_53_bits);
    tcase_add_test(tc, seeds_reproduce);
    suite_add_tcase(s, tc);
    tc = tcase_create("greedy");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, greedy_argmax_and_ties);
    tcase_add_test(tc, top_k_one_is_greedy);
    tcase_add_test(tc, masked_sampling);
    suite_add_tcase(s, tc);
    tc = tcase_create("filters");
    tcase_add_test(tc, top_p_smallest_set);
    tcase_add_test(tc, top_p_matches_full_sort);
    tcase_add_test(tc, top_p_ties_by_lower_id);
    tcase_add_test(tc, top_k_keeps_k_best);
    tcase_add_test(tc, min_p_filter);
    tcase_add_test(tc, temperature_reshapes);
    suite_add_tcase(s, tc);
    tc = tcase_create("penalties");
    tcase_add_test(tc, repetition_penalty_flips);
    tcase_add_test(tc, frequency_presence_penalties);
    suite_add_tcase(s, tc);
    tc = tcase_create("draw");
    tcase_add_test(tc, draws_match_softmax);
    tcase_add_test(tc, draw_is_inverse_cdf_in_id_order);
    tcase_add_test(tc, one_draw_per_token);
    suite_add_tcase(s, tc);
    tc = tcase_create("logprobs");
    tcase_add_test(tc, logprobs_raw_and_sorted);
    tcase_add_test(tc, logprob_is_raw_under_penalties);
    suite_add_tcase(s, tc);
    tc = tcase_create("bias");
    tcase_add_test(tc, logit_bias_ban_force_shift);
    tcase_add_test(tc, choice_seeds);
    suite_add_tcase(s, tc);
    tc = tcase_create("robustness");
    tcase_add_test(tc, huge_vocab);
    tcase_add_test(tc, nan_and_inf_logits);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
