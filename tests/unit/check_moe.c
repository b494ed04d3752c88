/* check_moe: mixture-of-experts models on the CPU.
 *
 * The router (cpu_moe_route) against a double-precision reading of
 * llama.cpp's build_moe_ffn for both gating rules (softmax then top-k with
 * renormalisation and scale; top-k of the logits then a softmax), its tie
 * rule and the grouping of rows by expert; the weighted sum's order; the
 * clamped SwiGLU; attention sinks against a double reference. Then the
 * loader (each family's experts, refusals that name what is wrong, the
 * feature bits and the CUDA refusal), and the backend: a token gives the
 * same logits bit for bit alone and among many others, with expert groups
 * large enough for the pool's GEMM paths and in MXFP4, and the expert load
 * counters add up; Gemma 4's MoE layers (the dense MLP beside the
 * experts, merged or split gate/up, per-expert scales, refusals). llama.cpp
 * agreement of whole models is check_arch's. */
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/kg_backend.h"
#include "backend/kg_math.h"
#include "check_common.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_mkmodel.h"
#include "model/kg_model.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng_state = 3;

static float rng_uniform(float lo, float hi) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

// ---- routing ----

/* The k largest of v by a plain selection (ties: lower index first). */
static void ref_top_k(const double *v, int n, int k, int *idx) {
    bool used[64] = {false};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            if (!used[e] && (best < 0 || v[e] > v[best])) {
                best = e;
            }
        }
        used[best] = true;
        idx[j] = best;
    }
}

static void ref_softmax(const double *x, double *y, int n) {
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < n; i++) {
        m = fmax(m, x[i]);
    }
    for (int i = 0; i < n; i++) {
        y[i] = exp(x[i] - m);
        s += y[i];
    }
    for (int i = 0; i < n; i++) {
        y[i] /= s;
    }
}

/* build_moe_ffn's group limit on the selection values v: groups of n / G
 * scored by their two largest, all but the n_used best set to -inf. */
static void ref_mask_groups(double *v, int n, int G, int n_used) {
    const int per = n / G;
    double score[64] = {0};
    int best[64] = {0};
    for (int gi = 0; gi < G; gi++) {
        const double *gv = v + (ptrdiff_t)gi * per;
        int top2[2] = {0, 1};
        ref_top_k(gv, per, 2, top2);
        score[gi] = gv[top2[0]] + gv[top2[1]];
    }
    ref_top_k(score, G, n_used, best);
    for (int gi = 0; gi < G; gi++) {
        bool keep = false;
        for (int j = 0; j < n_used; j++) {
            keep = keep || best[j] == gi;
        }
        for (int e = 0; !keep && e < per; e++) {
            v[(ptrdiff_t)gi * per + e] = -INFINITY;
        }
    }
}

/* Route T random tokens with `hp`'s rule (and the selection bias probs_b,
 * may be NULL) and compare with the double reference: the same experts in
 * the same order, weights within 1e-6. */
static void check_route_b(const kg_hparams_t *hp, const float *probs_b, int T) {
    const int n = hp->n_expert, k = hp->n_expert_used;
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, n, k, T));
    float *logits = malloc((size_t)(T * n) * sizeof(float));
    for (int i = 0; i < T * n; i++) {
        logits[i] = rng_uniform(-3.0f, 3.0f);
    }
    cpu_moe_route(&plan, hp, logits, probs_b, T);
    for (int t = 0; t < T; t++) {
        double lg[64] = {0}, p[64] = {0}, w[64] = {0};
        int idx[64] = {0};
        for (int e = 0; e < n; e++) {
            lg[e] = logits[t * n + e];
        }
        if (hp->moe_gating == KG_MOE_SIGMOID) {
            /* sigmoid scores; bias and groups choose, the scores weigh */
            double v[64];
            for (int e = 0; e < n; e++) {
                p[e] = 1.0 / (1.0 + exp(-lg[e]));
                v[e] = p[e] + (probs_b ? probs_b[e] : 0.0);
            }
            if (hp->n_expert_groups > 1) {
                ref_mask_groups(v, n, hp->n_expert_groups, hp->n_group_used);
            }
            ref_top_k(v, n, k, idx);
            for (int j = 0; j < k; j++) {
                w[j] = p[idx[j]];
            }
        } else if (hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT) {
            ref_top_k(lg, n, k, idx);
            double chosen[64];
            for (int j = 0; j < k; j++) {
                chosen[j] = lg[idx[j]];
            }
            ref_softmax(chosen, w, k);
        } else {
            ref_softmax(lg, p, n);
            ref_top_k(p, n, k, idx);
            for (int j = 0; j < k; j++) {
                w[j] = p[idx[j]];
            }
        }
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            sum += w[j];
        }
        for (int j = 0; j < k; j++) {
            double want = hp->moe_norm_w ? w[j] / sum : w[j];
            want *= hp->moe_w_scale != 0.0f ? hp->moe_w_scale : 1.0f;
            ck_assert_int_eq(plan.sel[t * k + j], idx[j]);
            ck_assert_msg(fabs(plan.w[t * k + j] - want) < 1e-6, "token %d rank %d: %g vs %g", t, j,
                          (double)plan.w[t * k + j], want);
        }
    }
    /* the groups: every expert's rows in token order, each token's slots
     * pointing at rows of its experts */
    int32_t total = 0;
    for (int e = 0; e < n; e++) {
        ck_assert_int_eq(plan.offset[e], total);
        for (int32_t r = plan.offset[e] + 1; r < plan.offset[e + 1]; r++) {
            ck_assert_int_lt(plan.row_tok[r - 1], plan.row_tok[r]);
        }
        total += plan.offset[e + 1] - plan.offset[e];
    }
    ck_assert_int_eq(total, T * k);
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            const int32_t r = plan.slot[t * k + j], e = plan.sel[t * k + j];
            ck_assert_int_eq(plan.row_tok[r], t);
            ck_assert(r >= plan.offset[e] && r < plan.offset[e + 1]);
        }
    }
    free(logits);
    cpu_moe_plan_clear(&plan);
}

static void check_route(const kg_hparams_t *hp, int T) {
    check_route_b(hp, NULL, T);
}

START_TEST(route_softmax_then_top_k) {
    kg_hparams_t hp = {.n_expert = 8, .n_expert_used = 2, .moe_gating = KG_MOE_SOFTMAX};
    hp.moe_norm_w = true;
    check_route(&hp, 40);
    hp.moe_norm_w = false; /* the weights stay probabilities */
    hp.n_expert = 16;
    hp.n_expert_used = 4;
    check_route(&hp, 40);
    hp.moe_norm_w = true;
    hp.moe_w_scale = 2.5f;
    check_route(&hp, 40);
}
END_TEST

START_TEST(route_top_k_then_softmax) {
    kg_hparams_t hp = {.n_expert = 32, .n_expert_used = 4, .moe_gating = KG_MOE_SOFTMAX_WEIGHT};
    check_route(&hp, 33);
    hp.n_expert_used = 1; /* one expert: weight 1 */
    check_route(&hp, 5);
}
END_TEST

/* glm4moe's router: sigmoid scores, the selection bias choosing (not
 * weighing), group-limited top-k, renormalised and scaled by 2.5. */
START_TEST(route_sigmoid_bias_groups) {
    kg_hparams_t hp = {.n_expert = 16, .n_expert_used = 4, .moe_gating = KG_MOE_SIGMOID};
    float bias[16];
    for (int e = 0; e < 16; e++) {
        bias[e] = rng_uniform(-0.5f, 0.5f);
    }
    check_route_b(&hp, NULL, 40);
    check_route_b(&hp, bias, 40);
    hp.moe_norm_w = true;
    hp.moe_w_scale = 2.5f;
    check_route_b(&hp, bias, 40);
    hp.n_expert_groups = 4;
    hp.n_group_used = 2;
    check_route_b(&hp, bias, 40);
    check_route_b(&hp, NULL, 40);
    /* a large bias on expert 3 picks it always; its weight stays its score */
    bias[3] = 10.0f;
    hp.n_expert_groups = 0;
    hp.moe_norm_w = false;
    hp.moe_w_scale = 0.0f;
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, 16, 4, 1));
    float logits[16];
    for (int e = 0; e < 16; e++) {
        logits[e] = rng_uniform(-1.0f, 1.0f);
    }
    logits[3] = -2.0f;
    cpu_moe_route(&plan, &hp, logits, bias, 1);
    ck_assert_int_eq(plan.sel[0], 3);
    ck_assert(plan.w[0] == 1.0f / (1.0f + expf(2.0f)));
    cpu_moe_plan_clear(&plan);
}
END_TEST

/* Equal logits: the lower expert ranks first, whatever the rest. */
START_TEST(route_ties_go_to_the_lower_expert) {
    kg_hparams_t hp = {.n_expert = 6, .n_expert_used = 3, .moe_gating = KG_MOE_SOFTMAX};
    hp.moe_norm_w = true;
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, 6, 3, 2));
    const float logits[12] = {1, 2, 2, 0, 2, 1, /* */ 0, 0, 0, 0, 0, 0};
    cpu_moe_route(&plan, &hp, logits, NULL, 2);
    ck_assert(plan.sel[0] == 1 && plan.sel[1] == 2 && plan.sel[2] == 4);
    ck_assert(plan.sel[3] == 0 && plan.sel[4] == 1 && plan.sel[5] == 2);
    ck_assert(plan.w[3] == plan.w[4] && plan.w[4] == plan.w[5]);
    cpu_moe_plan_clear(&plan);
}
END_TEST

/* ggml_mul of each expert output by its weight, then ggml_add of the k
 * views in rank order: each product rounded, added left to right. */
START_TEST(combine_in_rank_order) {
    kg_hparams_t hp = {.n_expert = 4, .n_expert_used = 3, .moe_gating = KG_MOE_SOFTMAX};
    cpu_moe_plan_t plan;
    ck_assert(cpu_moe_plan_init(&plan, 4, 3, 3));
    float logits[12];
    for (int i = 0; i < 12; i++) {
        logits[i] = rng_uniform(-2.0f, 2.0f);
    }
    cpu_moe_route(&plan, &hp, logits, NULL, 3);
    const int n = 5;
    float y[9 * 5], out[3 * 5];
    for (int i = 0; i < 9 * n; i++) {
        y[i] = rng_uniform(-1.0f, 1.0f) * 1e3f;
    }
    cpu_moe_combine(&plan, y, n, out, 3);
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < n; i++) {
            volatile float acc = y[plan.slot[t * 3] * n + i] * plan.w[t * 3];
            for (int j = 1; j < 3; j++) {
                volatile float prod = y[plan.slot[t * 3 + j] * n + i] * plan.w[t * 3 + j];
                acc = acc + prod;
            }
            ck_assert(out[t * n + i] == acc);
        }
    }
    /* gather: grouped row r is token row_tok[r]'s row */
    float x[3 * 5], g[9 * 5];
    for (int i = 0; i < 15; i++) {
        x[i] = (float)i;
    }
    cpu_moe_gather(&plan, x, n, g, 3);
    for (int r = 0; r < 9; r++) {
        ck_assert_mem_eq(g + r * n, x + plan.row_tok[r] * n, (size_t)n * sizeof(float));
    }
    cpu_moe_plan_clear(&plan);
}
END_TEST

START_TEST(swiglu_oai_clamps) {
    const float gates[] = {-20.0f, -1.0f, 0.0f, 0.5f, 6.9f, 7.0f, 9.0f, 100.0f};
    const float ups[] = {-9.0f, -7.0f, -0.5f, 0.0f, 3.0f, 7.0f, 8.0f, 1e9f};
    for (size_t i = 0; i < 8; i++) {
        for (size_t j = 0; j < 8; j++) {
            float out;
            cpu_moe_swiglu_oai(&gates[i], &ups[j], &out, 1);
            const double x = fmin(gates[i], 7.0), y = fmax(-7.0, fmin(ups[j], 7.0));
            const double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
            ck_assert_msg(fabs(out - want) <= 1e-5 * (1.0 + fabs(want)), "%g %g: %g vs %g",
                          (double)gates[i], (double)ups[j], (double)out, want);
        }
    }
}
END_TEST

// ---- attention sinks ----

/* One head over 40 positions in two blocks, with sinks from very negative
 * (no effect) to dominant: against softmax over scores plus the sink logit
 * (which has no value) in double. */
START_TEST(attention_sink) {
    enum { HD = 24, N = 40, BSZ = 32 };
    static uint16_t k[2 * BSZ * HD], v[2 * BSZ * HD];
    float q[HD], out[HD], plain[HD], s[N];
    for (int i = 0; i < 2 * BSZ * HD; i++) {
        k[i] = kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f));
        v[i] = kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f));
    }
    for (int i = 0; i < HD; i++) {
        q[i] = kg_fp16_to_fp32(kg_fp32_to_fp16(rng_uniform(-1.0f, 1.0f)));
    }
    const int32_t table[2] = {1, 0};
    const cpu_kv_view_t kv = {
        .k = k, .v = v, .stride = HD, .offset = 0, .table = table, .block_size = BSZ};
    const float scale = 1.0f / sqrtf((float)HD);
    cpu_attn_head(q, &kv, 0, N, HD, scale, 0.0f, s, plain);
    cpu_attn_head_sink(q, &kv, 0, N, HD, scale, 0.0f, -INFINITY, s, out);
    ck_assert_mem_eq(out, plain, sizeof(out)); /* no sink: the same bits */
    const float sinks[] = {-30.0f, -1.0f, 0.0f, 2.0f, 8.0f};
    for (size_t si = 0; si < sizeof(sinks) / sizeof(sinks[0]); si++) {
        for (int p0 = 0; p0 <= 20; p0 += 20) { /* whole, then a window of 20 */
            cpu_attn_head_sink(q, &kv, p0, N, HD, scale, 0.0f, sinks[si], s, out);
            double sc[N], m = sinks[si], sum = 0.0;
            for (int p = p0; p < N; p++) {
                const uint16_t *kr = k + ((int64_t)table[p / BSZ] * BSZ + p % BSZ) * HD;
                double d = 0.0;
                for (int i = 0; i < HD; i++) {
                    d += (double)q[i] * kg_fp16_to_fp32(kr[i]);
                }
                sc[p] = d * scale;
                m = fmax(m, sc[p]);
            }
            for (int p = p0; p < N; p++) {
                sum += exp(sc[p] - m);
            }
            sum += exp(sinks[si] - m);
            for (int i = 0; i < HD; i++) {
                double want = 0.0;
                for (int p = p0; p < N; p++) {
                    const uint16_t *vr = v + ((int64_t)table[p / BSZ] * BSZ + p % BSZ) * HD;
                    want += exp(sc[p] - m) / sum * kg_fp16_to_fp32(vr[i]);
                }
                /* the probabilities are rounded to fp16 as ggml rounds them */
                ck_assert_msg(fabs(out[i] - want) < 2e-3 * (1.0 + fabs(want)),
                              "sink %g p0 %d elem %d: %g vs %g", (double)sinks[si], p0, i,
                              (double)out[i], want);
            }
        }
    }
}
END_TEST

// ---- models ----

/* A model written by kg_mkmodel_write; a copy of its path (caller frees). */
static char *write_model(
    const char *arch, int n_embd, int n_layer, int n_ff, int n_expert, int k, const char *type) {
    kg_mkmodel_opts_t o = kg_mkmodel_opts_default();
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("moe"));
    o.out = path;
    o.arch = arch;
    o.n_embd = n_embd;
    o.n_layer = n_layer;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.head_dim = 16;
    o.n_ff = n_ff;
    o.n_ff_exp = strcmp(arch, "mixtral") == 0 ? 0 : n_ff;
    o.n_expert = n_expert;
    o.n_expert_used = k;
    o.ctx = 256;
    o.seed = 5;
    o.have_seed = true;
    if (strcmp(arch, "gpt-oss") == 0) {
        o.sliding_window = 8;
        o.rope_scaling = "yarn";
        o.rope_factor = 4.0f;
        o.rope_orig_ctx = 64;
    }
    if (strcmp(arch, "glm4moe") == 0) {
        /* layer 0 dense, a shared expert, one nextn block after the
         * trunk; 4 groups of n_expert / 4, 2 used */
        o.n_expert_groups = 4;
        o.n_group_used = 2;
    }
    if (type && strcmp(type, "q8_0") == 0) {
        o.type = KG_GGML_TYPE_Q8_0;
    } else if (type && strcmp(type, "mxfp4_moe") == 0) {
        o.type = KG_GGML_TYPE_Q8_0;
        o.has_expert_type = true;
        o.expert_type = KG_GGML_TYPE_MXFP4;
    }
    ck_assert_msg(kg_mkmodel_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
    return strdup(path);
}

static kg_model_t *load_ok(char *path) {
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    free(path);
    return m;
}

/* A copy of `src` with the keys in `drop` left out, `edit` adding keys,
 * and the tensor named `skip` left out (`*part`: every tensor whose name
 * holds `part`). Returns the new path. */
static char *rewrite(const char *src,
                     const char *const *drop,
                     void (*edit)(kg_gguf_writer_t *w),
                     const char *skip) {
    char err[256];
    kg_gguf_t *g = kg_gguf_open(src, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t key = kg_gguf_key(g, i);
        bool out = false;
        for (int d = 0; drop && drop[d]; d++) {
            out |= key.len == strlen(drop[d]) && memcmp(key.data, drop[d], key.len) == 0;
        }
        if (!out) {
            kg_gguf_writer_copy_kv(w, g, i);
        }
    }
    if (edit) {
        edit(w);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        if (skip && (strcmp(name, skip) == 0 || (skip[0] == '*' && strstr(name, skip + 1)))) {
            continue;
        }
        ck_assert_int_eq(
            kg_gguf_writer_add_tensor_raw(w, name, t->type, t->n_dims, t->ne, t->data, t->size),
            KG_OK);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("moe-rw"));
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_free(g);
    return strdup(path);
}

static void load_fails(char *path, const char *const *want) {
    char err[512] = "";
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m == NULL, "%s loaded", path);
    for (int i = 0; want[i]; i++) {
        ck_assert_msg(strstr(err, want[i]) != NULL, "error '%s' lacks '%s'", err, want[i]);
    }
    remove(path);
    free(path);
}

/* What the loader must read from each family's file (the row's check). */
static void loads_qwen3moe(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_QWEN3MOE);
    ck_assert(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 32);
    ck_assert(hp->moe_gating == KG_MOE_SOFTMAX && hp->moe_norm_w && hp->moe_w_scale == 0.0f);
    const kg_layer_weights_t *L = &m->layers[1];
    ck_assert_ptr_null(L->w_gate);
    ck_assert_ptr_null(L->w_down);
    ck_assert_ptr_nonnull(L->q_norm);
    /* expert e's views are slices of the 3-D tensors */
    ck_assert_int_eq(L->exp_down[5].n_dims, 2);
    ck_assert(L->exp_down[5].ne[0] == 32 && L->exp_down[5].ne[1] == 64);
    ck_assert_ptr_eq(L->exp_down[5].data, (const char *)L->down_exps->data + 5 * 32 * 64 * 4);
    ck_assert_ptr_eq(L->exp_up[7].data, (const char *)L->up_exps->data + 7 * 64 * 32 * 4);
    ck_assert_uint_eq(kg_model_features(m),
                      KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_MOE);
}

/* Mixtral: a llama whose feed_forward_length is each expert's */
static void loads_mixtral(const kg_model_t *m) {
    ck_assert_int_eq(m->hp.arch, KG_ARCH_LLAMA);
    ck_assert(m->hp.n_expert == 4 && m->hp.n_ff_exp == 96 && m->hp.moe_norm_w);
    ck_assert_int_eq(m->layers[0].exp_gate[3].type, KG_GGML_TYPE_Q8_0);
    ck_assert_int_eq(m->layers[0].ffn_gate_inp->type, KG_GGML_TYPE_F32);
    ck_assert_uint_eq(kg_model_features(m), KG_MODEL_FEAT_MOE);
}

/* gpt-oss: even layers windowed, YaRN, biases, sinks, its router */
static void loads_gpt_oss(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_GPT_OSS);
    ck_assert(hp->moe_gating == KG_MOE_SOFTMAX_WEIGHT && !hp->moe_norm_w);
    ck_assert_int_eq(hp->ffn_act, KG_FFN_SWIGLU_OAI);
    ck_assert(m->layers[0].n_swa == 8 && m->layers[1].n_swa == 0 && m->layers[2].n_swa == 8);
    ck_assert_int_eq(kg_model_kv_window(m), 0);
    ck_assert(m->layers[1].attn_sinks && m->layers[1].attn_sinks->ne[0] == 4);
    ck_assert(m->layers[1].bo && m->layers[1].bq && m->layers[1].ffn_gate_inp_b);
    ck_assert(m->layers[1].down_exps_b->ne[0] == 64 && m->layers[1].down_exps_b->ne[1] == 4);
    ck_assert_int_eq(m->layers[1].exp_up[0].type, KG_GGML_TYPE_MXFP4);
    ck_assert_int_eq(m->layers[1].wq->type, KG_GGML_TYPE_Q8_0);
    ck_assert(hp->yarn_ext_factor == 1.0f && hp->rope_scale == 0.25f);
    const uint32_t f = kg_model_features(m);
    ck_assert(f & KG_MODEL_FEAT_MOE && f & KG_MODEL_FEAT_MOE_OAI && f & KG_MODEL_FEAT_ATTN_SINKS);
    ck_assert(f & KG_MODEL_FEAT_SLIDING_WINDOW && f & KG_MODEL_FEAT_ROPE_YARN);
    char names[256];
    ck_assert_ptr_nonnull(
        strstr(kg_model_feature_names(f, names, sizeof(names)), "moe, moe_oai, attn_sinks"));
}

/* glm4moe: the trunk without its nextn block, layer 0 dense, sigmoid
 * router with selection bias and groups, the shared expert, half-head
 * RoPE, GLM-4.5's scale and renormalisation */
static void loads_glm4moe(const kg_model_t *m) {
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_GLM4MOE);
    ck_assert(hp->n_layer == 3 && hp->n_layer_nextn == 1 && hp->n_layer_dense == 1);
    ck_assert(hp->moe_gating == KG_MOE_SIGMOID && hp->moe_norm_w && hp->moe_w_scale == 2.5f);
    ck_assert(hp->n_expert_groups == 4 && hp->n_group_used == 2 && hp->n_expert_shared == 1);
    ck_assert(hp->head_dim == 16 && hp->n_rot == 8 && hp->rope_mode == KG_ROPE_MODE_NEOX);
    ck_assert(m->layers[0].w_gate && m->layers[0].w_down && !m->layers[0].ffn_gate_inp);
    ck_assert(m->layers[0].w_gate->ne[1] == hp->n_ff);
    const kg_layer_weights_t *L = &m->layers[2];
    ck_assert(L->ffn_gate_inp && L->exp_probs_b && L->exp_probs_b->ne[0] == 8);
    ck_assert(L->gate_shexp && L->gate_shexp->ne[1] == hp->n_ff_exp && L->down_shexp);
    ck_assert(!L->w_gate && L->q_norm && L->k_norm && L->bq && !L->bo);
    ck_assert_uint_eq(kg_model_features(m),
                      KG_MODEL_FEAT_QKV_BIAS | KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_ROPE_NEOX |
                          KG_MODEL_FEAT_ROPE_PARTIAL | KG_MODEL_FEAT_MOE |
                          KG_MODEL_FEAT_MOE_SIGMOID | KG_MODEL_FEAT_SHARED_EXPERT);
}

/* The expert families the loader reads (a new family is one row here):
 * write_model's arguments and what the loaded model must hold. */
static const struct moe_family {
    const char *arch;
    int n_embd, n_layer, n_ff, n_expert, k;
    const char *type; /* NULL (F32), "q8_0" or "mxfp4_moe" */
    void (*check)(const kg_model_t *m);
} k_moe_families[] = {
    {"qwen3moe", 64, 2, 32, 8, 2, NULL, loads_qwen3moe},
    {"mixtral", 64, 1, 96, 4, 2, "q8_0", loads_mixtral},
    {"gpt-oss", 64, 3, 32, 4, 2, "mxfp4_moe", loads_gpt_oss},
    {"glm4moe", 64, 3, 32, 8, 2, NULL, loads_glm4moe},
};

static kg_model_t *load_family(const struct moe_family *f) {
    return load_ok(
        write_model(f->arch, f->n_embd, f->n_layer, f->n_ff, f->n_expert, f->k, f->type));
}

START_TEST(loader_reads_each_family) {
    kg_model_t *m = load_family(&k_moe_families[_i]);
    k_moe_families[_i].check(m);
    kg_model_free(m);
}
END_TEST

static void used_too_many(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 9);
}

static void used_per_layer(kg_gguf_writer_t *w) {
    const int32_t v[2] = {2, 2};
    kg_gguf_writer_set_arr_i32(w, "qwen3moe.expert_used_count", v, 2);
}

static void no_renorm(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_bool(w, "qwen3moe.expert_weights_norm", false);
    kg_gguf_writer_set_f32(w, "qwen3moe.expert_weights_scale", 2.0f);
}

static void llama_experts(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "qwen3.expert_count", 4);
    kg_gguf_writer_set_u32(w, "qwen3.expert_used_count", 2);
}

static void qwen_nextn(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "qwen3moe.nextn_predict_layers", 1);
}

static void glm_softplus(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "glm4moe.expert_gating_func", 4);
}

static void glm_softmax(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "glm4moe.expert_gating_func", 1);
}

static void glm_groups_all_used(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "glm4moe.expert_group_used_count", 4);
}

static void lfm2moe_softplus(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "lfm2moe.expert_gating_func", 4);
}

static const char *const drop_lfm2moe_gating[] = {"lfm2moe.expert_gating_func", NULL};
static const char *const drop_lfm2moe_dense[] = {"lfm2moe.leading_dense_block_count", NULL};
static const char *const drop_granite_shexp[] = {"granitehybrid.expert_shared_feed_forward_length",
                                                 NULL};
static const char *const drop_glm_gating[] = {"glm4moe.expert_gating_func", NULL};
static const char *const drop_glm_shared[] = {"glm4moe.expert_shared_count", NULL};
static const char *const drop_glm_nextn[] = {"glm4moe.nextn_predict_layers", NULL};
static const char *const drop_glm_used[] = {"glm4moe.expert_group_used_count", NULL};
static const char *const drop_count[] = {"qwen3moe.expert_count", NULL};
static const char *const drop_used[] = {"qwen3moe.expert_used_count", NULL};
static const char *const drop_ffexp[] = {"qwen3moe.expert_feed_forward_length", NULL};
static const char *const drop_window[] = {"gpt-oss.attention.sliding_window", NULL};

START_TEST(loader_refusals) {
    char *src = write_model("qwen3moe", 64, 2, 32, 8, 2, NULL);
    load_fails(rewrite(src, drop_count, NULL, NULL),
               (const char *[]){"qwen3moe needs", "expert_count > 0", NULL});
    load_fails(rewrite(src, drop_used, NULL, NULL), (const char *[]){"expert_used_count", NULL});
    load_fails(rewrite(src, drop_used, used_too_many, NULL),
               (const char *[]){"expert_used_count 9", NULL});
    load_fails(rewrite(src, drop_used, used_per_layer, NULL),
               (const char *[]){"per-layer array", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.1.ffn_up_exps.weight"),
               (const char *[]){"missing tensor 'blk.1.ffn_up_exps.weight'", NULL});
    /* without expert_feed_forward_length llama.cpp takes n_ff / k = 16,
     * which the 32-wide experts do not have */
    load_fails(rewrite(src, drop_ffexp, NULL, NULL),
               (const char *[]){"blk.0.ffn_gate_exps.weight", "[64, 32, 8]", "[64, 16, 8]", NULL});
    kg_model_t *m = load_ok(rewrite(src, NULL, no_renorm, NULL));
    ck_assert(!m->hp.moe_norm_w && m->hp.moe_w_scale == 2.0f);
    kg_model_free(m);
    /* next-token-prediction blocks are glm4moe's only */
    load_fails(rewrite(src, NULL, qwen_nextn, NULL),
               (const char *[]){"next-token-prediction blocks", NULL});
    remove(src);
    free(src);

    src = write_model("glm4moe", 64, 3, 32, 8, 2, NULL);
    load_fails(rewrite(src, drop_glm_shared, NULL, NULL),
               (const char *[]){"glm4moe.expert_shared_count", NULL});
    load_fails(rewrite(src, drop_glm_gating, glm_softplus, NULL),
               (const char *[]){"expert_gating_func 4 is not supported", NULL});
    load_fails(rewrite(src, drop_glm_used, glm_groups_all_used, NULL),
               (const char *[]){"expert_group_used_count 4", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.2.exp_probs_b.bias"),
               (const char *[]){"missing tensor 'blk.2.exp_probs_b.bias'", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.1.ffn_down_shexp.weight"),
               (const char *[]){"missing tensor 'blk.1.ffn_down_shexp.weight'", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.1.attn_k_norm.weight"),
               (const char *[]){"one of attn_q_norm and attn_k_norm", NULL});
    /* without nextn_predict_layers block 3 is a trunk block, whose nextn
     * tensors no graph of kgen's uses */
    load_fails(rewrite(src, drop_glm_nextn, NULL, NULL),
               (const char *[]){"'blk.3.nextn.", "not part of the glm4moe graph", NULL});
    /* GLM-4.5-Air's files have no Q/K norms at all */
    char *air = rewrite(src, NULL, NULL, "*attn_q_norm");
    m = load_ok(rewrite(air, NULL, NULL, "*attn_k_norm"));
    remove(air);
    free(air);
    for (int il = 0; il < 3; il++) {
        ck_assert(!m->layers[il].q_norm && !m->layers[il].k_norm);
    }
    ck_assert(!(kg_model_features(m) & KG_MODEL_FEAT_QK_NORM));
    kg_model_free(m);
    /* the gating function: sigmoid without the key, softmax when it says 1 */
    m = load_ok(rewrite(src, drop_glm_gating, NULL, NULL));
    ck_assert_int_eq(m->hp.moe_gating, KG_MOE_SIGMOID);
    kg_model_free(m);
    m = load_ok(rewrite(src, drop_glm_gating, glm_softmax, NULL));
    ck_assert_int_eq(m->hp.moe_gating, KG_MOE_SOFTMAX);
    kg_model_free(m);
    remove(src);
    free(src);

    /* lfm2moe (layer 0 dense, 1 and 2 experts): the gating function is required, the
     * selection bias too; without leading_dense_block_count every layer has experts, which
     * layer 0's dense FFN is not */
    src = write_model("lfm2moe", 64, 3, 32, 8, 2, NULL);
    m = load_ok(rewrite(src, NULL, NULL, NULL));
    ck_assert(m->hp.moe_gating == KG_MOE_SIGMOID && m->hp.moe_norm_w && m->hp.n_layer_dense == 1);
    ck_assert(!m->layers[0].ffn_gate_inp && m->layers[1].exp_probs_b && m->layers[2].ffn_gate_inp);
    ck_assert_int_eq(m->layers[2].kind, KG_LAYER_ATTN);
    kg_model_free(m);
    load_fails(rewrite(src, drop_lfm2moe_gating, NULL, NULL),
               (const char *[]){"lfm2moe.expert_gating_func missing", NULL});
    load_fails(rewrite(src, drop_lfm2moe_gating, lfm2moe_softplus, NULL),
               (const char *[]){"expert_gating_func missing or 4", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.1.exp_probs_b.bias"),
               (const char *[]){"missing tensor 'blk.1.exp_probs_b.bias'", NULL});
    load_fails(rewrite(src, drop_lfm2moe_dense, NULL, NULL),
               (const char *[]){"missing tensor 'blk.0.", NULL});
    remove(src);
    free(src);

    /* granitehybrid with experts (Granite 4.0-H Tiny): every layer's FFN experts of
     * feed_forward_length, softmax, renormalised, an ungated shared expert of
     * expert_shared_feed_forward_length; without that key the shared expert's tensors are
     * not part of the graph */
    src = write_model("granitehybrid", 64, 3, 32, 4, 2, NULL);
    m = load_ok(rewrite(src, NULL, NULL, NULL));
    ck_assert(m->hp.moe_gating == KG_MOE_SOFTMAX && m->hp.moe_norm_w && m->hp.n_ff_exp == 32 &&
              m->hp.n_ff_shexp == 64);
    for (int il = 0; il < 3; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert(L->ffn_gate_inp && L->gate_exps && L->gate_shexp && !L->gate_inp_shexp);
        ck_assert(L->down_shexp->ne[0] == 64 && !L->w_gate);
    }
    ck_assert_int_eq(m->layers[2].kind, KG_LAYER_ATTN);
    kg_model_free(m);
    load_fails(rewrite(src, drop_granite_shexp, NULL, NULL),
               (const char *[]){"_shexp.weight' is not part of the granitehybrid graph", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.1.ffn_gate_exps.weight"),
               (const char *[]){"missing tensor 'blk.1.ffn_gate_exps.weight'", NULL});
    remove(src);
    free(src);

    src = write_model("gpt-oss", 64, 2, 32, 4, 2, NULL);
    load_fails(rewrite(src, drop_window, NULL, NULL),
               (const char *[]){"gpt-oss.attention.sliding_window", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.0.attn_sinks.weight"),
               (const char *[]){"attn_sinks", NULL});
    load_fails(rewrite(src, NULL, NULL, "output.weight"),
               (const char *[]){"missing tensor 'output.weight'", NULL});
    remove(src);
    free(src);

    /* experts where kgen (like llama.cpp) runs none */
    kg_mkmodel_opts_t o = kg_mkmodel_opts_default();
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("moe"));
    o.out = path;
    o.arch = "qwen3";
    o.n_embd = 64;
    o.n_layer = 1;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.head_dim = 16;
    o.n_ff = 64;
    o.have_seed = true;
    ck_assert_msg(kg_mkmodel_write(&o, NULL, err, sizeof(err)) == KG_OK, "%s", err);
    load_fails(rewrite(path, NULL, llama_experts, NULL),
               (const char *[]){"qwen3 with experts is not supported", NULL});
    remove(path);
    /* and mkmodel refuses expert options for a dense family */
    o.n_expert = 4;
    ck_assert_int_eq(kg_mkmodel_write(&o, NULL, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "expert options"));
}
END_TEST

/* `kgen mkmodel --mxfp4_moe` and `--q8_0` write the bytes llama.cpp's own
 * quantizer writes from the F32 model (llama_model_quantize with
 * MOSTLY_MXFP4_MOE and MOSTLY_Q8_0): every tensor's type and FNV-1a 64
 * hash as recorded in tests/data/arch/quantize-moe.txt
 * (scripts/goldens/moe-quantize.sh). */
START_TEST(quantized_like_llama_cpp) {
    size_t len;
    char *text = kg_test_read_file(kg_test_data("arch/quantize-moe.txt"), &len);
    ck_assert_ptr_nonnull(text);
    kg_gguf_t *g = NULL;
    char model[64] = "", type[32] = "", path[4096] = "";
    int n_models = 0, n_tensors = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128], ttype[32];
        unsigned long long h;
        if (sscanf(line, "model %63s %31s", model, type) == 2) {
            continue;
        }
        if (strncmp(line, "args ", 5) == 0) {
            char args[8192], err[256];
            kg_gguf_free(g);
            snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("moe-q"));
            snprintf(args, sizeof(args), "%s --%s", line + 5, type);
            ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
            g = kg_gguf_open(path, err, sizeof(err));
            ck_assert_msg(g != NULL, "%s", err);
            remove(path);
            n_models++;
        } else if (sscanf(line, "tensor %127s %31s %llx", name, ttype, &h) == 3) {
            const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
            ck_assert_msg(t != NULL, "%s %s: no %s", model, type, name);
            ck_assert_msg(strcmp(kg_ggml_type_name(t->type), ttype) == 0, "%s %s %s: %s, not %s",
                          model, type, name, kg_ggml_type_name(t->type), ttype);
            uint64_t f = 0xcbf29ce484222325ULL;
            for (size_t i = 0; i < t->size; i++) {
                f = (f ^ ((const uint8_t *)t->data)[i]) * 0x100000001b3ULL;
            }
            ck_assert_msg(f == h, "%s %s %s: bytes differ from llama.cpp's", model, type, name);
            n_tensors++;
        }
    }
    ck_assert_int_eq(n_models, 6);
    ck_assert_int_gt(n_tensors, 200);
    kg_gguf_free(g);
    free(text);
}
END_TEST

/* kgen mkmodel's expert options: usage errors name the problem. */
START_TEST(mkmodel_usage_errors) {
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"--arch qwen3 --n-expert 4",
         "are for qwen3moe, mixtral, gpt-oss, glm4moe, deepseek2, qwen35moe, qwen3next"},
        {"--arch llama --mxfp4_moe",
         "are for qwen3moe, mixtral, gpt-oss, glm4moe, deepseek2, qwen35moe, qwen3next"},
        {"--arch deepseek2", "--n-head-kv must be 1"},
        {"--arch deepseek2 --n-nextn 1", "(deepseek2: all but --n-nextn;"},
        {"--arch glm4moe --kv-lora-rank 8", "are for deepseek2"},
        {"--arch qwen3moe --n-expert-shared 1", "are for glm4moe"},
        {"--arch glm4moe --n-expert-groups 4", "come together"},
        {"--arch glm4moe --n-dense-lead 2", "at most --n-layer leading dense layers"},
        {"--arch mixtral --n-ff-exp 32", "mixtral has no --n-ff-exp"},
        {"--arch qwen3moe --n-expert 4 --n-expert-used 5", "expert_used_count (5)"},
        {"--arch gpt-oss --n-ff-exp 48 --mxfp4_moe", "multiples of mxfp4's block (32)"},
        {"--arch qwen3moe --n-expert 0", "--n-expert: '0' is not an integer in 1..1024"},
        {"--arch gemma4 --n-expert-used 2", "and gemma4 and granitehybrid with --n-expert"},
        {"--arch granitehybrid --n-expert 4 --n-ff-exp 32", "--n-ff is the experts' width"},
        {"--arch nemotron_h --n-embd 64 --n-layer 4 --n-expert 4", "are for qwen3moe"},
        {"--arch lfm2moe --n-expert-shared 1", "(deepseek2: all but --n-nextn; lfm2moe"},
        {"--arch lfm2moe --n-dense-lead 2", "at most --n-layer leading dense layers"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd),
                 "%s/kgen mkmodel --out '%s' --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 2 "
                 "--n-ff 64 --seed 1 %s 2>&1",
                 KG_BIN_DIR, kg_test_tmp_path("never"), cases[i].args);
        int status = 0;
        char *out = kg_test_run(cmd, &status);
        ck_assert_msg(status != 0 && out && strstr(out, cases[i].want), "%s: status %d, '%s'",
                      cases[i].args, status, out ? out : "");
        free(out);
    }
}
END_TEST

/* The expert models (each row of k_moe_families) pass the CUDA backend's
 * feature gate: `cuda` gets as far as the device (an error naming the
 * device where there is none, a backend on a GPU), and `auto` runs.
 * check_cuda's archmore case runs them on the device. */
START_TEST(cuda_takes_experts) {
    kg_model_t *m = load_family(&k_moe_families[_i]);
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 8, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cuda", m, &p, err, sizeof(err));
#ifdef KG_USE_CUDA
    ck_assert_msg(be != NULL || strstr(err, "does not implement") == NULL, "%s", err);
#else
    ck_assert_ptr_null(be);
#endif
    kg_backend_free(be);
    be = kg_backend_new("auto", m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

// ---- the backend ----

#define BLOCK 16
#define N_TOK 48

/* Run `n` tokens, each the first (position 0) of its own sequence, in one
 * step; the logits of every token into logits (n, n_vocab). */
static void run_step(kg_backend_t *be, const int32_t *tokens, int32_t n, float *logits) {
    int32_t pos[N_TOK], seq[N_TOK], table[N_TOK];
    bool want[N_TOK];
    for (int32_t i = 0; i < n; i++) {
        pos[i] = 0;
        seq[i] = i;
        table[i] = N_TOK - 1 - i;
        want[i] = true;
    }
    kg_step_batch_t b = {.n_tokens = n,
                         .token = tokens,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = n,
                         .n_slots = n,
                         .max_blocks_per_seq = 1,
                         .block_table = table};
    ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_OK);
}

/* Token 0's logits alone, then with 47 others in one step (groups of ~24
 * rows: the prefill kernels, on the pool) and with 3 others (the decode
 * kernels): the same bits every time. The expert counters add up. */
static void check_batch_invariance(const char *arch, const char *type) {
    /* experts of 512 x 256 F32 (512 KiB): big enough for the pool */
    kg_model_t *m = load_ok(write_model(arch, 256, 2, 512, 4, 2, type));
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = N_TOK,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = N_TOK,
                             .max_seq_len = 256};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    const int32_t V = m->hp.n_vocab;
    int32_t tokens[N_TOK];
    for (int i = 0; i < N_TOK; i++) {
        tokens[i] = (i * 37 + 11) % V;
    }
    float *alone = malloc((size_t)V * sizeof(float));
    float *many = malloc((size_t)N_TOK * (size_t)V * sizeof(float));
    run_step(be, tokens, 1, alone);
    kg_moe_stats_t st;
    kg_backend_moe_stats(be, &st);
    ck_assert(st.n_expert == 4 && st.n_expert_used == 2);
    ck_assert(st.n_layer_steps == 2 && st.n_routed == 2 * 2 && st.n_groups == 2 * 2);
    run_step(be, tokens, N_TOK, many);
    ck_assert_mem_eq(many, alone, (size_t)V * sizeof(float));
    run_step(be, tokens, 4, many);
    ck_assert_mem_eq(many, alone, (size_t)V * sizeof(float));
    kg_backend_moe_stats(be, &st);
    ck_assert_int_eq(st.n_layer_steps, 6);
    ck_assert_int_eq(st.n_routed, 2 * 2 * (1 + N_TOK + 4));
    int64_t sum = 0;
    for (int e = 0; e < 4; e++) {
        sum += st.n_per_expert[e];
    }
    ck_assert_int_eq(sum, st.n_routed);
    ck_assert(st.n_groups >= 2 * 2 + 2 + 2 && st.n_groups <= 3 * 2 * 4);
    ck_assert(st.max_group > N_TOK * 2 / 4 / 2 && st.max_group <= N_TOK);
    free(alone);
    free(many);
    kg_backend_free(be);
    kg_model_free(m);
}

/* The expert files check_batch_invariance runs (a new family is one row
 * here): F32 experts, and gpt-oss's MXFP4 ones. */
static const char *const k_inv_families[][2] = {
    {"qwen3moe", NULL}, {"gpt-oss", "mxfp4_moe"}, {"gemma4", NULL}};

START_TEST(batch_invariant) {
    check_batch_invariance(k_inv_families[_i][0], k_inv_families[_i][1]);
}
END_TEST

/* MXFP4 experts are multiplied where they lie in the file's mapping, as
 * every quantized type is: the CPU backend's weights take no more bytes
 * than the file's tensors (expanded to F32 they would take 7.5x the
 * experts' bytes). */
START_TEST(mxfp4_experts_in_place) {
    kg_model_t *m = load_ok(write_model("gpt-oss", 256, 2, 512, 4, 2, "mxfp4_moe"));
    size_t file_bytes = 0, expert_bytes = 0;
    for (int64_t i = 0; i < kg_gguf_n_tensors(m->gguf); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(m->gguf, i);
        file_bytes += t->size;
        if (t->type == KG_GGML_TYPE_MXFP4) {
            expert_bytes += t->size;
        }
    }
    ck_assert_uint_eq(expert_bytes, 2 * 3 * (size_t)4 * 512 * 256 / 32 * 17);
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 8};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    kg_backend_memory_t mem;
    kg_backend_memory(be, &mem);
    ck_assert_msg(mem.weights_size >= expert_bytes && mem.weights_size <= file_bytes,
                  "weights %zu bytes, the file's tensors %zu, its MXFP4 experts %zu",
                  mem.weights_size, file_bytes, expert_bytes);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

/* A dense model reports no experts. */
START_TEST(dense_has_no_moe_stats) {
    kg_test_model_opts_t o = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 64, .seed = 1};
    char err[256];
    kg_model_t *m = kg_model_load(kg_test_make_model(&o), err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 4, .kv_block_size = 16, .max_batch_tokens = 8};
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    kg_moe_stats_t st;
    kg_backend_moe_stats(be, &st);
    ck_assert(st.n_expert == 0 && st.n_routed == 0 && st.n_per_expert == NULL);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

// ---- Gemma 4 ----

/* A copy of `src` whose ffn_gate_up_exps (F32) are cut into ffn_gate_exps
 * (each expert's first n_ff_exp rows) and ffn_up_exps (the rest): the same
 * experts in the layout of files that store them apart; `keep`: the merged
 * tensors stay too. */
static char *split_gate_up(const char *src, bool keep) {
    char err[256];
    kg_gguf_t *g = kg_gguf_open(src, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_writer_copy_kv(w, g, i);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        char *at = strstr(name, "ffn_gate_up_exps");
        if (!at || keep) {
            ck_assert_int_eq(
                kg_gguf_writer_add_tensor_raw(w, name, t->type, t->n_dims, t->ne, t->data, t->size),
                KG_OK);
        }
        if (!at) {
            continue;
        }
        ck_assert_int_eq(t->type, KG_GGML_TYPE_F32);
        const int64_t E = t->ne[0], FX = t->ne[1] / 2, X = t->ne[2];
        const size_t half = (size_t)(E * FX) * sizeof(float);
        char *part[2] = {malloc(half * (size_t)X), malloc(half * (size_t)X)};
        for (int64_t e = 0; e < X; e++) {
            memcpy(part[0] + (size_t)e * half, (const char *)t->data + (size_t)(2 * e) * half,
                   half);
            memcpy(part[1] + (size_t)e * half, (const char *)t->data + (size_t)(2 * e + 1) * half,
                   half);
        }
        const int64_t ne[3] = {E, FX, X};
        const char *const suffix[2] = {"ffn_gate_exps.weight", "ffn_up_exps.weight"};
        for (int h = 0; h < 2; h++) {
            snprintf(at, sizeof(name) - (size_t)(at - name), "%s", suffix[h]);
            ck_assert_int_eq(kg_gguf_writer_add_tensor_raw(w, name, KG_GGML_TYPE_F32, 3, ne,
                                                           part[h], half * (size_t)X),
                             KG_OK);
            free(part[h]);
        }
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("moe-split"));
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_free(g);
    return strdup(path);
}

/* Tokens 0..3's logits on the CPU backend (one step, four sequences). */
static float *gemma4_logits(kg_model_t *m) {
    kg_backend_params_t p = {.n_threads = 1,
                             .n_kv_blocks = N_TOK,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = N_TOK,
                             .max_seq_len = 256};
    char err[256];
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    const int32_t tokens[4] = {5, 17, 42, 99};
    float *logits = malloc((size_t)4 * (size_t)m->hp.n_vocab * sizeof(float));
    run_step(be, tokens, 4, logits);
    kg_backend_free(be);
    return logits;
}

static const char *const drop_g4_counts[] = {"gemma4.expert_count", "gemma4.expert_used_count",
                                             NULL};
static const char *const drop_g4_ffexp[] = {"gemma4.expert_feed_forward_length", NULL};

/* Gemma 4's MoE layers (the 26B-A4B's): the loader takes the router, its
 * input scale, the three extra norms, the merged gate/up experts as views
 * (gate rows, then up rows, of each expert), the per-expert scales, and
 * keeps the dense MLP; llama.cpp's literal routing (softmax, renormalised,
 * scale 1) whatever the file says; the same experts stored apart give the
 * same logits bit for bit, and without the per-expert scales other ones;
 * a file short of a piece is refused by name; the CUDA backend takes it
 * (check_cuda's gemma4-moe row). llama.cpp agreement is check_arch's
 * gemma4-moe. */
START_TEST(gemma4_experts) {
    char *src = write_model("gemma4", 64, 2, 32, 8, 2, NULL);
    kg_model_t *m = load_ok(rewrite(src, NULL, NULL, NULL));
    const kg_hparams_t *hp = &m->hp;
    ck_assert(hp->arch == KG_ARCH_GEMMA4 && hp->ffn_act == KG_FFN_GELU);
    ck_assert(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 32);
    ck_assert(hp->moe_gating == KG_MOE_SOFTMAX && hp->moe_norm_w && hp->moe_w_scale == 0.0f);
    for (int il = 0; il < 2; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert(L->ffn_gate_inp && L->ffn_gate_inp_s && L->ffn_pre_norm_2 && L->ffn_post_norm_1 &&
                  L->ffn_post_norm_2 && L->down_exps_s);
        ck_assert(L->w_gate && L->w_up && L->w_down && L->ffn_post_norm);
        ck_assert(!L->gate_exps && !L->up_exps && L->down_exps);
    }
    const kg_gguf_tensor_t *gu = kg_gguf_find_tensor(m->gguf, "blk.1.ffn_gate_up_exps.weight");
    ck_assert(gu && gu->ne[0] == 64 && gu->ne[1] == 64 && gu->ne[2] == 8);
    const kg_layer_weights_t *L1 = &m->layers[1];
    const char *mat5 = (const char *)gu->data + (size_t)5 * 64 * 64 * 4;
    ck_assert_ptr_eq(L1->exp_gate[5].data, mat5);
    ck_assert_ptr_eq(L1->exp_up[5].data, mat5 + (size_t)32 * 64 * 4);
    ck_assert(L1->exp_up[5].ne[0] == 64 && L1->exp_up[5].ne[1] == 32 && L1->exp_up[5].n_dims == 2 &&
              L1->exp_up[5].size == (size_t)32 * 64 * 4);
    const uint32_t f = kg_model_features(m);
    ck_assert((f & KG_MODEL_FEAT_MOE) && (f & KG_MODEL_FEAT_V_NORM));
    kg_backend_params_t p = {
        .n_threads = 1, .n_kv_blocks = 8, .kv_block_size = 16, .max_batch_tokens = 16};
    char err[512] = "";
    kg_backend_t *be = kg_backend_new("cuda", m, &p, err, sizeof(err));
#ifdef KG_USE_CUDA
    /* the CUDA backend runs it (check_cuda's gemma4-moe row): where it
     * cannot start, that is for want of a device, not a refusal */
    ck_assert_msg(be != NULL || strstr(err, "does not implement") == NULL, "%s", err);
#else
    ck_assert_ptr_null(be); /* no CUDA build here */
#endif
    kg_backend_free(be);
    float *merged = gemma4_logits(m);
    const size_t bytes = (size_t)4 * (size_t)hp->n_vocab * sizeof(float);

    kg_model_t *ms = load_ok(split_gate_up(src, false));
    ck_assert(ms->layers[0].gate_exps && ms->layers[0].up_exps);
    float *split = gemma4_logits(ms);
    ck_assert_mem_eq(split, merged, bytes);
    free(split);
    kg_model_free(ms);

    kg_model_t *mu = load_ok(rewrite(src, NULL, NULL, "*ffn_down_exps.scale"));
    ck_assert_ptr_null(mu->layers[0].down_exps_s);
    float *unscaled = gemma4_logits(mu);
    ck_assert(memcmp(unscaled, merged, bytes) != 0);
    free(unscaled);
    kg_model_free(mu);
    free(merged);
    kg_model_free(m);

    load_fails(rewrite(src, NULL, NULL, "blk.1.ffn_gate_inp.scale"),
               (const char *[]){"missing tensor 'blk.1.ffn_gate_inp.scale'", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.0.post_ffw_norm_2.weight"),
               (const char *[]){"missing tensor 'blk.0.post_ffw_norm_2.weight'", NULL});
    load_fails(rewrite(src, NULL, NULL, "blk.0.ffn_down_exps.weight"),
               (const char *[]){"missing tensor 'blk.0.ffn_down_exps.weight'", NULL});
    load_fails(split_gate_up(src, true),
               (const char *[]){"layer 0 has ffn_gate_up_exps and also", NULL});
    load_fails(
        rewrite(src, drop_g4_counts, NULL, NULL),
        (const char *[]){"blk.0.ffn_gate_inp.weight: a router without gemma4.expert_count", NULL});
    load_fails(rewrite(src, drop_g4_ffexp, NULL, NULL),
               (const char *[]){"gemma4.expert_feed_forward_length must be in 1..2^24", NULL});
    /* without its routers a layer is dense, and its expert tensors are
     * left over */
    load_fails(rewrite(src, NULL, NULL, "*ffn_gate_inp.weight"),
               (const char *[]){"not part of the gemma4 graph", NULL});
    remove(src);
    free(src);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("route");
    tcase_add_test(tc, route_softmax_then_top_k);
    tcase_add_test(tc, route_top_k_then_softmax);
    tcase_add_test(tc, route_sigmoid_bias_groups);
    tcase_add_test(tc, route_ties_go_to_the_lower_expert);
    tcase_add_test(tc, combine_in_rank_order);
    tcase_add_test(tc, swiglu_oai_clamps);
    tcase_add_test(tc, attention_sink);
    suite_add_tcase(s, tc);
    tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, loader_reads_each_family, 0,
                        (int)(sizeof(k_moe_families) / sizeof(k_moe_families[0])));
    tcase_add_test(tc, loader_refusals);
    tcase_add_loop_test(tc, cuda_takes_experts, 0,
                        (int)(sizeof(k_moe_families) / sizeof(k_moe_families[0])));
    tcase_add_test(tc, mkmodel_usage_errors);
    tcase_add_test(tc, quantized_like_llama_cpp);
    suite_add_tcase(s, tc);
    tc = tcase_create("backend");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, batch_invariant, 0,
                        (int)(sizeof(k_inv_families) / sizeof(k_inv_families[0])));
    tcase_add_test(tc, mxfp4_experts_in_place);
    tcase_add_test(tc, dense_has_no_moe_stats);
    tcase_add_test(tc, gemma4_experts);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
