/* cpu_moe: routing, grouping, activation and combination of the CPU
 * backend's mixture-of-experts FFN (see cpu_moe.h). */
#include "cpu_moe.h"

#include "../kg_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool cpu_moe_plan_init(cpu_moe_plan_t *p, int32_t n_expert, int32_t k, int64_t max_tokens) {
    memset(p, 0, sizeof(*p));
    p->n_expert = n_expert;
    p->k = k;
    p->max_tokens = max_tokens;
    const size_t tk = (size_t)max_tokens * (size_t)k;
    p->sel = malloc(tk * sizeof(*p->sel));
    p->w = malloc(tk * sizeof(*p->w));
    p->slot = malloc(tk * sizeof(*p->slot));
    p->row_tok = malloc(tk * sizeof(*p->row_tok));
    p->count = calloc((size_t)n_expert, sizeof(*p->count));
    p->offset = calloc((size_t)n_expert + 1, sizeof(*p->offset));
    p->probs = malloc((size_t)n_expert * sizeof(*p->probs));
    p->sel_v = malloc((size_t)n_expert * sizeof(*p->sel_v));
    if (!p->sel || !p->w || !p->slot || !p->row_tok || !p->count || !p->offset || !p->probs ||
        !p->sel_v) {
        cpu_moe_plan_clear(p);
        return false;
    }
    return true;
}

void cpu_moe_plan_clear(cpu_moe_plan_t *p) {
    free(p->sel);
    free(p->w);
    free(p->slot);
    free(p->row_tok);
    free(p->count);
    free(p->offset);
    free(p->probs);
    free(p->sel_v);
    memset(p, 0, sizeof(*p));
}

void cpu_moe_softmax(const float *x, float *y, int32_t n) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        m = fmaxf(m, x[i]);
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - m);
        sum += (double)y[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < n; i++) {
        y[i] *= inv;
    }
}

/* The k largest of v[0 .. n) in descending order into idx (ggml_argsort
 * descending, first k): a stable insertion, so of equal values the lower
 * index ranks first. */
static void top_k(const float *v, int32_t n, int32_t k, int32_t *idx) {
    int32_t m = 0;
    for (int32_t e = 0; e < n; e++) {
        if (m == k && !(v[e] > v[idx[k - 1]])) {
            continue;
        }
        int32_t i = m < k ? m++ : k - 1;
        while (i > 0 && v[e] > v[idx[i - 1]]) {
            idx[i] = idx[i - 1];
            i--;
        }
        idx[i] = e;
    }
}

/* Group-limited top-k (build_moe_ffn with n_expert_groups > 1): each of
 * the G groups of n / G experts scores the sum of its two largest values
 * of v; every expert outside the n_used best groups gets -inf. */
static void mask_groups(float *v, int32_t n, int32_t G, int32_t n_used) {
    const int32_t per = n / G; /* >= 2: the loader checks it */
    float score[KG_MOE_MAX_GROUPS] = {0};
    int32_t best[KG_MOE_MAX_GROUPS] = {0};
    for (int32_t gi = 0; gi < G; gi++) {
        const float *gv = v + (int64_t)gi * per;
        int32_t top2[2] = {0, 1};
        top_k(gv, per, 2, top2);
        score[gi] = gv[top2[0]] + gv[top2[1]];
    }
    top_k(score, G, n_used, best);
    for (int32_t gi = 0; gi < G; gi++) {
        bool keep = false;
        for (int32_t j = 0; j < n_used; j++) {
            keep = keep || best[j] == gi;
        }
        for (int32_t e = 0; !keep && e < per; e++) {
            v[(int64_t)gi * per + e] = -INFINITY;
        }
    }
}

void cpu_moe_route(cpu_moe_plan_t *p,
                   const kg_hparams_t *hp,
                   const float *logits,
                   const float *probs_b,
                   int64_t T) {
    const int32_t n = p->n_expert, k = p->k;
    for (int64_t t = 0; t < T; t++) {
        const float *lg = logits + t * n;
        int32_t *sel = p->sel + t * k;
        float *w = p->w + t * k;
        /* the probabilities that weigh the experts (gpt-oss: the logits,
         * softmaxed after the choice) */
        float *probs = p->probs;
        if (hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT) {
            memcpy(probs, lg, (size_t)n * sizeof(float));
        } else if (hp->moe_gating == KG_MOE_SIGMOID) {
            for (int32_t e = 0; e < n; e++) {
                probs[e] = 1.0f / (1.0f + expf(-lg[e])); /* ggml_vec_sigmoid_f32 */
            }
        } else {
            cpu_moe_softmax(lg, probs, n);
        }
        /* the values that choose them: + the selection bias, then the
         * groups' mask */
        const float *choose = hp->moe_w_before ? lg : probs; /* llama4: the logits */
        if (probs_b || hp->n_expert_groups > 1) {
            for (int32_t e = 0; e < n; e++) {
                p->sel_v[e] = probs_b ? choose[e] + probs_b[e] : choose[e];
            }
            if (hp->n_expert_groups > 1) {
                mask_groups(p->sel_v, n, hp->n_expert_groups, hp->n_group_used);
            }
            choose = p->sel_v;
        }
        top_k(choose, n, k, sel);
        for (int32_t j = 0; j < k; j++) {
            w[j] = probs[sel[j]];
        }
        if (hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT) {
            /* gpt-oss: a softmax over the k chosen logits */
            float *chosen = p->sel_v; /* k <= n_expert; the choice is made */
            memcpy(chosen, w, (size_t)k * sizeof(float));
            cpu_moe_softmax(chosen, w, k);
        }
        if (hp->moe_norm_w) {
            double sum = 0.0; /* ggml_sum_rows: a double sum, rounded to float */
            for (int32_t j = 0; j < k; j++) {
                sum += (double)w[j];
            }
            float s = (float)sum;
            s = s < 6.103515625e-5f ? 6.103515625e-5f : s; /* ggml_clamp to F16's smallest */
            for (int32_t j = 0; j < k; j++) {
                w[j] = w[j] / s;
            }
        }
        if (hp->moe_w_scale != 0.0f && hp->moe_w_scale != 1.0f) {
            for (int32_t j = 0; j < k; j++) {
                w[j] *= hp->moe_w_scale;
            }
        }
    }
    /* group: expert e's rows in token order, after the experts before it */
    memset(p->count, 0, (size_t)n * sizeof(*p->count));
    for (int64_t i = 0; i < T * k; i++) {
        p->count[p->sel[i]]++;
    }
    p->offset[0] = 0;
    for (int32_t e = 0; e < n; e++) {
        p->offset[e + 1] = p->offset[e] + p->count[e];
    }
    memset(p->count, 0, (size_t)n * sizeof(*p->count));
    for (int64_t i = 0; i < T * k; i++) {
        const int32_t e = p->sel[i];
        const int32_t r = p->offset[e] + p->count[e]++;
        p->row_tok[r] = (int32_t)(i / k);
        p->slot[i] = r;
    }
}

void cpu_moe_gather(const cpu_moe_plan_t *p, const float *src, int64_t n, float *dst, int64_t T) {
    for (int64_t r = 0; r < T * p->k; r++) {
        memcpy(dst + r * n, src + (int64_t)p->row_tok[r] * n, (size_t)n * sizeof(float));
    }
}

void cpu_moe_gather_weighted(
    cpu_moe_plan_t *p, const float *src, int64_t n, float *dst, int64_t T) {
    for (int64_t i = 0; i < T * p->k; i++) {
        const float *x = src + (i / p->k) * n;
        float *d = dst + (int64_t)p->slot[i] * n;
        for (int64_t c = 0; c < n; c++) {
            d[c] = x[c] * p->w[i]; /* ggml_mul(repeated, weights) */
        }
        p->w[i] = 1.0f; /* spent: y * 1 is y, so the combine adds the outputs as they are */
    }
}

void cpu_moe_combine(const cpu_moe_plan_t *p, const float *y, int64_t n, float *out, int64_t T) {
    const int32_t k = p->k;
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * n;
        const float *y0 = y + (int64_t)p->slot[t * k] * n;
        const float w0 = p->w[t * k];
        for (int64_t i = 0; i < n; i++) {
            o[i] = y0[i] * w0;
        }
        for (int32_t j = 1; j < k; j++) {
            const float *yj = y + (int64_t)p->slot[t * k + j] * n;
            const float wj = p->w[t * k + j];
            for (int64_t i = 0; i < n; i++) {
                const float prod = yj[i] * wj; /* rounded: ISO C contracts nothing */
                o[i] = o[i] + prod;
            }
        }
    }
}

void cpu_moe_swiglu_oai(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = kg_swiglu_oai(gate[i], up[i], 1.702f, 7.0f);
    }
}
