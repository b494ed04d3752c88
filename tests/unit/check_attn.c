/* check_attn: the CPU attention kernel (cpu_attn_head) against a
 * double-precision softmax-attention reference, and its fixed arithmetic:
 * the result is bitwise the same wherever the sequence's blocks lie in the
 * cache, equals the element-by-element chains the header describes, and
 * handles head sizes that are not a multiple of 8; and the flash
 * attention kernels embedding inputs take (cpu_attn_head_flash): near the
 * same reference, ggml's arithmetic written out element by element, bits
 * that do not depend on where the blocks lie. */
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_attn_flash.h"
#include "backend/cpu/cpu_expf.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/kg_math.h"
#include "check_common.h"
#include "model/kg_quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define BS         16
#define MAX_BLOCKS 8
#define MAX_POS    (BS * MAX_BLOCKS)

static uint64_t rng_state;

static float rng_uniform(float lo, float hi) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

/* A cache of MAX_BLOCKS blocks with rows of n_kv_heads heads of hd, filled
 * with random fp16 values; the sequence's blocks in the order `table`. */
typedef struct cache {
    uint16_t *k, *v;
    int64_t stride;
} cache_t;

static cache_t cache_new(int n_kv_heads, int hd) {
    cache_t c = {.stride = (int64_t)n_kv_heads * hd};
    const int64_t n = (int64_t)MAX_POS * c.stride;
    c.k = malloc((size_t)n * sizeof(uint16_t));
    c.v = malloc((size_t)n * sizeof(uint16_t));
    ck_assert(c.k && c.v);
    for (int64_t i = 0; i < n; i++) {
        c.k[i] = kg_fp32_to_fp16(rng_uniform(-2.0f, 2.0f));
        c.v[i] = kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f));
    }
    return c;
}

static void cache_free(cache_t *c) {
    free(c->k);
    free(c->v);
}

static const uint16_t *
row(const cache_t *c, const uint16_t *base, const int32_t *table, int p, int64_t off) {
    return base + ((int64_t)table[p / BS] * BS + p % BS) * c->stride + off;
}

/* Move the sequence's blocks to other places in the cache: same contents,
 * different rows. */
static void relocate(cache_t *c, const int32_t *from, const int32_t *to, int n_blocks) {
    const size_t bytes = (size_t)BS * (size_t)c->stride * sizeof(uint16_t);
    uint16_t *k = malloc(bytes * MAX_BLOCKS), *v = malloc(bytes * MAX_BLOCKS);
    ck_assert(k && v);
    memcpy(k, c->k, bytes * MAX_BLOCKS);
    memcpy(v, c->v, bytes * MAX_BLOCKS);
    for (int b = 0; b < n_blocks; b++) {
        memcpy((char *)c->k + to[b] * bytes, (char *)k + from[b] * bytes, bytes);
        memcpy((char *)c->v + to[b] * bytes, (char *)v + from[b] * bytes, bytes);
    }
    free(k);
    free(v);
}

START_TEST(matches_reference) {
    static const int hds[] = {8, 12, 64, 72, 128, 130};
    rng_state = 1;
    for (size_t ih = 0; ih < sizeof(hds) / sizeof(hds[0]); ih++) {
        const int hd = hds[ih], n_kv = 2;
        cache_t c = cache_new(n_kv, hd);
        const int32_t table[MAX_BLOCKS] = {5, 2, 7, 0, 3, 6, 1, 4};
        float *q = malloc((size_t)hd * sizeof(float)), *out = malloc((size_t)hd * sizeof(float));
        float s[MAX_POS];
        ck_assert(q && out);
        for (int n_pos = 1; n_pos <= MAX_POS; n_pos += 7) {
            for (int i = 0; i < hd; i++) {
                q[i] = kg_fp16_to_fp32(kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f)));
            }
            const int g = n_pos % n_kv;
            const cpu_kv_view_t kv = {.k = c.k,
                                      .v = c.v,
                                      .stride = c.stride,
                                      .offset = (int64_t)g * hd,
                                      .table = table,
                                      .block_size = BS};
            const float scale = 1.0f / sqrtf((float)hd);
            cpu_attn_head(q, &kv, 0, n_pos, hd, scale, 0.0f, s, out);
            double ref_s[MAX_POS], m = -INFINITY, sum = 0.0;
            for (int p = 0; p < n_pos; p++) {
                const uint16_t *k = row(&c, c.k, table, p, kv.offset);
                double d = 0.0;
                for (int i = 0; i < hd; i++) {
                    d += (double)q[i] * kg_fp16_to_fp32(k[i]);
                }
                ref_s[p] = d * scale;
                m = fmax(m, ref_s[p]);
            }
            for (int p = 0; p < n_pos; p++) {
                ref_s[p] = exp(ref_s[p] - m);
                sum += ref_s[p];
            }
            for (int i = 0; i < hd; i++) {
                double o = 0.0;
                for (int p = 0; p < n_pos; p++) {
                    o += ref_s[p] / sum * kg_fp16_to_fp32(row(&c, c.v, table, p, kv.offset)[i]);
                }
                /* probabilities rounded to fp16: about 1e-3 relative */
                ck_assert_msg(fabs(out[i] - o) <= 2e-3 * (1.0 + fabs(o)),
                              "hd %d n_pos %d elem %d: %g vs %g", hd, n_pos, i, out[i], o);
            }
        }
        free(q);
        free(out);
        cache_free(&c);
    }
}
END_TEST

/* The arithmetic the header fixes, written out element by element. */
static void chains(const float *q,
                   const cache_t *c,
                   const int32_t *table,
                   int64_t off,
                   int n_pos,
                   int hd,
                   float scale,
                   float *s,
                   float *out) {
    for (int p = 0; p < n_pos; p++) {
        const uint16_t *k = row(c, c->k, table, p, off);
        float lane[8] = {0};
        int i = 0;
        for (; i + 8 <= hd; i += 8) {
            for (int l = 0; l < 8; l++) {
                lane[l] = fmaf(q[i + l], kg_fp16_to_fp32(k[i + l]), lane[l]);
            }
        }
        /* lo + hi, then two horizontal adds */
        float x[4] = {lane[0] + lane[4], lane[1] + lane[5], lane[2] + lane[6], lane[3] + lane[7]};
        float h[2] = {x[0] + x[1], x[2] + x[3]};
        float sum = h[0] + h[1];
        for (; i < hd; i++) {
            sum += q[i] * kg_fp16_to_fp32(k[i]);
        }
        s[p] = sum * scale;
    }
    float m = -INFINITY, pr[MAX_POS];
    for (int p = 0; p < n_pos; p++) {
        m = fmaxf(m, s[p]);
    }
    double total = 0.0;
    for (int p = 0; p < n_pos; p++) {
        pr[p] = expf(s[p] - m);
        total += (double)pr[p];
    }
    const float inv = (float)(1.0 / total);
    for (int p = 0; p < n_pos; p++) {
        pr[p] = kg_fp16_to_fp32(kg_fp32_to_fp16(pr[p] * inv));
    }
    for (int i = 0; i < hd; i++) {
        float acc = 0.0f;
        for (int p = 0; p < n_pos; p++) {
            acc = fmaf(pr[p], kg_fp16_to_fp32(row(c, c->v, table, p, off)[i]), acc);
        }
        out[i] = acc;
    }
}

START_TEST(fixed_arithmetic) {
    if (strcmp(cpu_attn_kernel_name(), "avx2") != 0) {
        return; /* the lanes are those of the vector build; the portable one sums in order */
    }
    /* a tail only, one register, a full 8-register pass, a pass plus one,
     * two passes plus a tail */
    static const int hds[] = {4, 8, 12, 64, 72, 130};
    rng_state = 7;
    for (size_t ih = 0; ih < sizeof(hds) / sizeof(hds[0]); ih++) {
        const int hd = hds[ih];
        cache_t c = cache_new(3, hd);
        const int32_t table[MAX_BLOCKS] = {3, 0, 6, 1, 7, 2, 5, 4};
        float q[130], out[130], want[130], s[MAX_POS], want_s[MAX_POS];
        for (int n_pos = 1; n_pos <= MAX_POS; n_pos += 5) {
            for (int i = 0; i < hd; i++) {
                q[i] = rng_uniform(-1.0f, 1.0f);
            }
            const cpu_kv_view_t kv = {.k = c.k,
                                      .v = c.v,
                                      .stride = c.stride,
                                      .offset = hd,
                                      .table = table,
                                      .block_size = BS};
            chains(q, &c, table, hd, n_pos, hd, 0.125f, want_s, want);
            cpu_attn_scores(q, &kv, 0, n_pos, hd, 0.125f, 0.0f, s);
            ck_assert_msg(memcmp(s, want_s, (size_t)n_pos * sizeof(float)) == 0,
                          "hd %d n_pos %d: scores differ from the chains", hd, n_pos);
            cpu_attn_head(q, &kv, 0, n_pos, hd, 0.125f, 0.0f, s, out);
            ck_assert_msg(memcmp(out, want, (size_t)hd * sizeof(float)) == 0,
                          "hd %d n_pos %d differs from the chains", hd, n_pos);
        }
        cache_free(&c);
    }
}
END_TEST

START_TEST(placement_does_not_change_bits) {
    rng_state = 11;
    const int hd = 72, n_pos = 100; /* 7 blocks, the last partial; a tail of 0 */
    cache_t c = cache_new(1, hd);
    const int32_t t1[MAX_BLOCKS] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t t2[MAX_BLOCKS] = {7, 3, 5, 1, 6, 0, 2, 4};
    float q[72], a[72], b[72], s[MAX_POS];
    for (int i = 0; i < hd; i++) {
        q[i] = rng_uniform(-1.0f, 1.0f);
    }
    cpu_kv_view_t kv = {.k = c.k, .v = c.v, .stride = c.stride, .table = t1, .block_size = BS};
    cpu_attn_head(q, &kv, 0, n_pos, hd, 0.1f, 0.0f, s, a);
    relocate(&c, t1, t2, MAX_BLOCKS);
    kv.table = t2;
    cpu_attn_head(q, &kv, 0, n_pos, hd, 0.1f, 0.0f, s, b);
    ck_assert(memcmp(a, b, sizeof(a)) == 0);
    cache_free(&c);
}
END_TEST

/* A sliding window [p0, n_pos): the same scores (bits) as the full row at
 * those positions, and softmax . V over them only (double reference); with
 * soft-capping each score is cap * tanh(raw / cap) * scale, as ggml's
 * scale, tanh, scale and then the softmax's scale compute it. */
START_TEST(window_and_softcap) {
    rng_state = 21;
    const int hd = 64;
    cache_t c = cache_new(1, hd);
    const int32_t table[MAX_BLOCKS] = {2, 7, 4, 0, 5, 1, 6, 3};
    const cpu_kv_view_t kv = {
        .k = c.k, .v = c.v, .stride = c.stride, .table = table, .block_size = BS};
    float q[64], out[64], full[MAX_POS], win[MAX_POS], raw[MAX_POS], s[MAX_POS];
    for (int i = 0; i < hd; i++) {
        q[i] = kg_fp16_to_fp32(kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f)));
    }
    const int n_pos = 100;
    for (int p0 = 0; p0 < n_pos; p0 += 13) {
        for (int capped = 0; capped < 2; capped++) {
            const float cap = capped ? 1.5f : 0.0f, scale = 0.25f;
            cpu_attn_scores(q, &kv, 0, n_pos, hd, scale, 0.0f, full);
            cpu_attn_scores(q, &kv, 0, n_pos, hd, 1.0f, 0.0f, raw);
            cpu_attn_scores(q, &kv, p0, n_pos, hd, scale, cap, win);
            for (int p = p0; p < n_pos; p++) {
                const float want = capped ? kg_softcap(raw[p], cap) * scale : full[p];
                ck_assert_msg(memcmp(&win[p - p0], &want, sizeof(float)) == 0,
                              "p0 %d cap %g pos %d: %g vs %g", p0, (double)cap, p, win[p - p0],
                              want);
            }
            cpu_attn_head(q, &kv, p0, n_pos, hd, scale, cap, s, out);
            double m = -INFINITY, sum = 0.0, w[MAX_POS];
            for (int p = p0; p < n_pos; p++) {
                w[p] = capped ? cap * tanh(raw[p] / cap) * scale : (double)full[p];
                m = fmax(m, w[p]);
            }
            for (int p = p0; p < n_pos; p++) {
                w[p] = exp(w[p] - m);
                sum += w[p];
            }
            for (int i = 0; i < hd; i++) {
                double o = 0.0;
                for (int p = p0; p < n_pos; p++) {
                    o += w[p] / sum * kg_fp16_to_fp32(row(&c, c.v, table, p, 0)[i]);
                }
                ck_assert_msg(fabs(out[i] - o) <= 2e-3 * (1.0 + fabs(o)),
                              "p0 %d cap %g elem %d: %g vs %g", p0, (double)cap, i, out[i], o);
            }
        }
    }
    cache_free(&c);
}
END_TEST

static float round_h(float x) {
    return kg_fp16_to_fp32(kg_fp32_to_fp16(x));
}

/* ggml-cpu's two flash attention kernels for one row, element by element
 * (ops.cpp: flash_attn_ext_f16_one_chunk below 64 query rows, as ggml's
 * scalar loops run for these heads; flash_attn_ext_tiled from 64, its
 * softmax in the AVX2 build's form). */
static void flash_chains(const float *q,
                         const cache_t *c,
                         const int32_t *table,
                         int p0,
                         int n_pos,
                         int hd,
                         float scale,
                         float cap,
                         bool tiled,
                         float *out) {
    const float sc = cap > 0.0f ? scale / cap : scale;
    float M = -INFINITY, S = 0.0f, acc[MAX_POS];
    for (int i = 0; i < hd; i++) {
        acc[i] = 0.0f;
    }
    if (!tiled) {
        for (int p = p0; p < n_pos; p++) {
            const uint16_t *k = row(c, c->k, table, p, 0), *v = row(c, c->v, table, p, 0);
            double d = 0.0;
            for (int i = 0; i < hd; i++) {
                d += (double)(round_h(q[i]) * kg_fp16_to_fp32(k[i]));
            }
            float s = (float)d * sc;
            s = cap > 0.0f ? cap * tanhf(s) : s;
            float ms = 1.0f, vs = 1.0f;
            if (s > M) {
                ms = expf(M - s);
                M = s;
                for (int i = 0; i < hd; i++) {
                    acc[i] = round_h(acc[i] * ms);
                }
            } else {
                vs = expf(s - M);
            }
            for (int i = 0; i < hd; i++) {
                acc[i] = round_h(fmaf(kg_fp16_to_fp32(v[i]), vs, acc[i]));
            }
            S = S * ms + vs;
        }
    } else {
        for (int t0 = 0; t0 < n_pos; t0 += 64) {
            float e[64], tmax = -INFINITY;
            for (int j = 0; j < 64; j++) {
                const int p = t0 + j;
                e[j] = -INFINITY; /* masked: before the window, past the row */
                if (p >= p0 && p < n_pos) {
                    const uint16_t *k = row(c, c->k, table, p, 0);
                    float a = 0.0f;
                    for (int i = 0; i < hd; i++) {
                        a = fmaf(q[i], kg_fp16_to_fp32(k[i]), a);
                    }
                    a *= sc;
                    e[j] = cap > 0.0f ? tanhf(a) * cap : a;
                }
                tmax = fmaxf(tmax, e[j]);
            }
            if (tmax == -INFINITY) {
                continue;
            }
            const float mn = fmaxf(M, tmax);
            if (mn > M) {
                const float ms = expf(M - mn);
                for (int i = 0; i < hd; i++) {
                    acc[i] *= ms;
                }
                S *= ms;
            }
            M = mn;
            /* ggml_vec_soft_max_f32's AVX2 form: ggml_v_expf on 8 at a
             * time, each 8 summed pairwise as its horizontal add does */
            double sum = 0.0;
            for (int j = 0; j < 64; j += 8) {
                float *v = e + j;
                for (int l = 0; l < 8; l++) {
                    v[l] = cpu_v_expf1(v[l] - M);
                }
                sum += (double)(((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])));
            }
            S = (float)((double)S + sum);
            for (int j = 0; j < 64 && t0 + j < n_pos; j++) {
                if (t0 + j >= p0) {
                    const uint16_t *v = row(c, c->v, table, t0 + j, 0);
                    for (int i = 0; i < hd; i++) {
                        acc[i] = fmaf(kg_fp16_to_fp32(v[i]), e[j], acc[i]);
                    }
                }
            }
        }
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < hd; i++) {
        out[i] = acc[i] * inv;
    }
}

START_TEST(flash_kernels) {
    static const int hds[] = {8, 12, 32, 72};
    rng_state = 31;
    const int32_t t1[MAX_BLOCKS] = {4, 1, 6, 0, 3, 7, 2, 5};
    const int32_t t2[MAX_BLOCKS] = {0, 5, 2, 7, 1, 4, 6, 3};
    for (size_t ih = 0; ih < sizeof(hds) / sizeof(hds[0]); ih++) {
        const int hd = hds[ih];
        float q[72], out[72], want[72], again[72];
        float *scratch = malloc((size_t)cpu_attn_flash_scratch(hd) * sizeof(float));
        ck_assert(scratch);
        for (int n_pos = 1; n_pos <= MAX_POS; n_pos += 9) {
            for (int f = 0; f < 8; f++) {
                const bool tiled = f & 1, capped = f & 2;
                const int p0 = f & 4 ? n_pos / 3 : 0; /* a window */
                const float cap = capped ? 1.5f : 0.0f, scale = 1.0f / sqrtf((float)hd);
                cache_t c = cache_new(1, hd);
                for (int i = 0; i < hd; i++) {
                    q[i] = rng_uniform(-1.0f, 1.0f);
                }
                cpu_kv_view_t kv = {
                    .k = c.k, .v = c.v, .stride = c.stride, .table = t1, .block_size = BS};
                cpu_attn_head_flash(q, &kv, p0, n_pos, hd, scale, cap, tiled, scratch, out);
                flash_chains(q, &c, t1, p0, n_pos, hd, scale, cap, tiled, want);
                ck_assert_msg(memcmp(out, want, (size_t)hd * sizeof(float)) == 0,
                              "hd %d n_pos %d p0 %d cap %g tiled %d: not ggml's chains", hd, n_pos,
                              p0, (double)cap, tiled);
                relocate(&c, t1, t2, MAX_BLOCKS);
                kv.table = t2;
                cpu_attn_head_flash(q, &kv, p0, n_pos, hd, scale, cap, tiled, scratch, again);
                ck_assert(memcmp(out, again, (size_t)hd * sizeof(float)) == 0);
                /* near softmax attention in double (the one-chunk kernel rounds q
                 * and its accumulator to fp16) */
                double w[MAX_POS], m = -INFINITY, sum = 0.0;
                for (int p = p0; p < n_pos; p++) {
                    const uint16_t *k = row(&c, c.k, t2, p, 0);
                    double d = 0.0;
                    for (int i = 0; i < hd; i++) {
                        d += (double)q[i] * kg_fp16_to_fp32(k[i]);
                    }
                    w[p] = capped ? cap * tanh(d * scale / cap) : d * scale;
                    m = fmax(m, w[p]);
                }
                for (int p = p0; p < n_pos; p++) {
                    w[p] = exp(w[p] - m);
                    sum += w[p];
                }
                for (int i = 0; i < hd; i++) {
                    double o = 0.0;
                    for (int p = p0; p < n_pos; p++) {
                        o += w[p] / sum * kg_fp16_to_fp32(row(&c, c.v, t2, p, 0)[i]);
                    }
                    ck_assert_msg(fabs(out[i] - o) <= (tiled ? 1e-5 : 4e-3) * (1.0 + fabs(o)),
                                  "hd %d n_pos %d p0 %d tiled %d elem %d: %g vs %g", hd, n_pos, p0,
                                  tiled, i, out[i], o);
                }
                cache_free(&c);
            }
        }
        free(scratch);
    }
}
END_TEST

/* ggml's vector expf (cpu_expf.h, the bert attention's softmax): the
 * scalar twin gives the vector's bits on every input class (the
 * polynomial's range, the |n| > 126 and > 192 branches, -inf, lanes of
 * several classes in one vector), and the result is within 2 ulp of exp
 * in double wherever it is a normal float. */
START_TEST(ggml_expf) {
    enum { N = 300000 };
    static const float special[8] = {-INFINITY, 0.0f,    -1.0f,  -87.5f,
                                     -100.0f,   -150.0f, -1e-8f, 88.0f};
    for (int64_t i = -1; i < N; i++) {
        float x[8], one[8];
        for (int l = 0; l < 8; l++) {
            /* -200 .. 90 in steps of ~1e-4 (consecutive lanes straddle the
             * branches' edges), then the special values */
            x[l] = i < 0 ? special[l] : -200.0f + 290.0f * (float)(i * 8 + l) / (float)(8 * N);
            one[l] = cpu_v_expf1(x[l]);
            if (x[l] > -87.0f && x[l] < 88.0f) {
                const double want = exp((double)x[l]);
                const double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
                if (fabs((double)one[l] - want) > 2.0 * ulp) { /* (Check logs every assert) */
                    ck_abort_msg("expf(%a) = %a, exp %a", (double)x[l], (double)one[l], want);
                }
            }
            if (!(one[l] >= 0.0f)) {
                ck_abort_msg("expf(%a) = %a", (double)x[l], (double)one[l]);
            }
        }
        if (i < 0) {
            ck_assert(one[0] == 0.0f && one[1] == 1.0f);
        }
#if defined(__AVX2__) && defined(__FMA__)
        float vec[8];
        _mm256_storeu_ps(vec, cpu_v_expf8(_mm256_loadu_ps(x)));
        for (int l = 0; l < 8; l++) {
            if (memcmp(&vec[l], &one[l], sizeof(float)) != 0) {
                ck_abort_msg("expf(%a): vector %a, scalar %a", (double)x[l], (double)vec[l],
                             (double)one[l]);
            }
        }
#endif
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("attn");
    TCase *tc = tcase_create("attn");
    tcase_add_test(tc, matches_reference);
    tcase_add_test(tc, fixed_arithmetic);
    tcase_add_test(tc, placement_does_not_change_bits);
    tcase_add_test(tc, window_and_softcap);
    tcase_add_test(tc, flash_kernels);
    tcase_add_test(tc, ggml_expf);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
