/* kg_sampler_filter: top-k, top-p and min-p over the penalised logits, and
 * the draw among what they keep (the rules are in kg_sampler.h, the design
 * of the whole sampler in kg_sampler.c).
 *
 * What the filters keep is always "every token at least as good as the
 * worst one kept", so each filter only has to find that worst token: top-k
 * by a bounded heap (the ordering section), top-p by the same heap over the
 * best TOP_P_SORT or by a histogram of the mass over logit buckets; one
 * vector pass then collects the kept tokens in id order, min-p included. */
#include "kg_sampler_int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOP_P_SORT 128

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
    // sc->kidx is allocated with the scratch (kg_sampler.c checks it); the
    // analyzer cannot see that and takes run_idx == NULL to mean it is NULL
    *t_id = sc->kidx[last]; // NOLINT(clang-analyzer-core.NullDereference)
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
int32_t kg_sampler_filter(const kg_sampling_params_t *p,
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
            *z = kg_sampler_exp_sum(sc->prob, sc->val, n, kg_sampler_max_at(sc->val, n, NULL),
                                    inv_t);
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
        max = kg_sampler_max_at(sc->val, n, NULL);
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
    *z = kg_sampler_exp_sum(sc->prob, sc->kval, kept, max, inv_t);
    return kept;
}

/* The first i whose cumulative mass exceeds u. Whole blocks of 8 are
 * skipped by their sums first, which do not depend on each other, so the
 * walk is not one long chain of dependent additions. If rounding runs past
 * the end, the last candidate with any mass is the answer. */
int32_t kg_sampler_draw(const float *prob, int32_t n, double u) {
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
