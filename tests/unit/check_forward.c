/* check_forward: the CPU forward pass against a naive reference, against
 * itself (one call vs token by token through the paged KV cache, blocks out
 * of order, several sequences in one batch), F16 vs F32 weights, and the
 * stories260K greedy reference from llama.cpp. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "model/kg_model.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// ---- a naive reference: llama2.c-style, one token at a time, all F32 ----

typedef struct ref_model {
    const kg_model_t *m;
    float *kc, *vc; /* (n_layer, n_ctx, n_kv) */
    int n_ctx;
} ref_model_t;

static float *deq(const kg_gguf_tensor_t *t) {
    int64_t n = t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1);
    float *out = malloc((size_t)n * sizeof(float));
    kg_dequantize(t->type, t->data, out, n);
    return out;
}

static void ref_rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
    }
    float s = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) {
        o[i] = x[i] * s * w[i];
    }
}

static void ref_matvec(float *o, const float *x, const float *w, int n_in, int n_out) {
    for (int r = 0; r < n_out; r++) {
        double acc = 0;
        for (int i = 0; i < n_in; i++) {
            acc += (double)w[(size_t)r * n_in + i] * x[i];
        }
        o[r] = (float)acc;
    }
}

/* logits of token `tok` at position `pos` (positions must come in order) */
static void ref_forward(ref_model_t *r, int tok, int pos, float *logits) {
    const kg_hparams_t *hp = &r->m->hp;
    int E = hp->n_embd, hd = hp->head_dim, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    int F = hp->n_ff;
    float *x = calloc((size_t)E, 4), *xb = calloc((size_t)E, 4), *q = calloc((size_t)nq, 4);
    float *att = calloc((size_t)nq, 4), *tmp = calloc((size_t)E, 4), *h1 = calloc((size_t)F, 4);
    float *h3 = calloc((size_t)F, 4), *sc = calloc((size_t)pos + 1, 4);
    float *emb = deq(r->m->tok_embd);
    memcpy(x, emb + (size_t)tok * E, (size_t)E * 4);
    free(emb);
    for (int l = 0; l < hp->n_layer; l++) {
        const kg_layer_weights_t *L = &r->m->layers[l];
        float *an = deq(L->attn_norm), *wq = deq(L->wq), *wk = deq(L->wk), *wv = deq(L->wv);
        float *wo = deq(L->wo), *fn = deq(L->ffn_norm), *wg = deq(L->w_gate), *wu = deq(L->w_up);
        float *wd = deq(L->w_down);
        float *kr = r->kc + ((size_t)l * r->n_ctx + pos) * nkv;
        float *vr = r->vc + ((size_t)l * r->n_ctx + pos) * nkv;
        ref_rmsnorm(xb, x, an, E, hp->norm_eps);
        ref_matvec(q, xb, wq, E, nq);
        ref_matvec(kr, xb, wk, E, nkv);
        ref_matvec(vr, xb, wv, E, nkv);
        for (int i = 0; i < hd / 2; i++) {
            double theta = pos * pow(hp->rope_base, -2.0 * i / hd) * hp->rope_scale;
            float c = (float)cos(theta), s = (float)sin(theta);
            for (int h = 0; h < hp->n_head; h++) {
                float a = q[h * hd + 2 * i], b = q[h * hd + 2 * i + 1];
                q[h * hd + 2 * i] = a * c - b * s;
                q[h * hd + 2 * i + 1] = a * s + b * c;
            }
            for (int h = 0; h < hp->n_head_kv; h++) {
                float a = kr[h * hd + 2 * i], b = kr[h * hd + 2 * i + 1];
                kr[h * hd + 2 * i] = a * c - b * s;
                kr[h * hd + 2 * i + 1] = a * s + b * c;
            }
        }
        for (int h = 0; h < hp->n_head; h++) {
            int g = h / (hp->n_head / hp->n_head_kv);
            float m = -INFINITY;
            for (int p = 0; p <= pos; p++) {
                const float *k = r->kc + ((size_t)l * r->n_ctx + p) * nkv + g * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) {
                    d += (double)q[h * hd + i] * k[i];
                }
                sc[p] = (float)(d / sqrt(hd));
                m = fmaxf(m, sc[p]);
            }
            double sum = 0;
            for (int p = 0; p <= pos; p++) {
                sc[p] = expf(sc[p] - m);
                sum += sc[p];
            }
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p = 0; p <= pos; p++) {
                    acc += sc[p] / sum * r->vc[((size_t)l * r->n_ctx + p) * nkv + g * hd + i];
                }
                att[h * hd + i] = (float)acc;
            }
        }
        ref_matvec(tmp, att, wo, nq, E);
        for (int i = 0; i < E; i++) {
            x[i] += tmp[i];
        }
        ref_rmsnorm(xb, x, fn, E, hp->norm_eps);
        ref_matvec(h1, xb, wg, E, F);
        ref_matvec(h3, xb, wu, E, F);
        for (int i = 0; i < F; i++) {
            h1[i] = h1[i] / (1.0f + expf(-h1[i])) * h3[i];
        }
        ref_matvec(tmp, h1, wd, F, E);
        for (int i = 0; i < E; i++) {
            x[i] += tmp[i];
        }
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
    }
    float *on = deq(r->m->output_norm), *wout = deq(r->m->output);
    ref_rmsnorm(xb, x, on, E, hp->norm_eps);
    ref_matvec(logits, xb, wout, E, hp->n_vocab);
    free(on), free(wout);
    free(x), free(xb), free(q), free(att), free(tmp), free(h1), free(h3), free(sc);
}

/* Normalized mean squared error of b against a. */
static double nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? num / den : num;
}

static kg_backend_t *make_cpu(const kg_model_t *m, int n_blocks, int bs, int max_tokens) {
    char err[256];
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = n_blocks,
                             .kv_block_size = bs,
                             .max_batch_tokens = max_tokens};
    kg_backend_t *be = kg_backend_cpu_new(m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s", err);
    return be;
}

static kg_model_t *load(const char *path) {
    char err[256];
    ck_assert_ptr_nonnull(path);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

/* Run `n` tokens of one sequence (slot `slot` of n_slots) in one call. */
static void run_seq(kg_backend_t *be,
                    const int32_t *toks,
                    int n,
                    int pos0,
                    int slot,
                    int n_slots,
                    const int32_t *table,
                    int mbps,
                    float *logits,
                    bool all_logits) {
    int32_t pos[256], seq[256];
    bool want[256];
    for (int i = 0; i < n; i++) {
        pos[i] = pos0 + i;
        seq[i] = slot;
        want[i] = all_logits || i == n - 1;
    }
    kg_step_batch_t b = {.n_tokens = n,
                         .token = toks,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_outputs = all_logits ? n : 1,
                         .n_slots = n_slots,
                         .max_blocks_per_seq = mbps,
                         .block_table = table};
    ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_OK);
}

static const int32_t toks[] = {1,  40, 200, 7,   99, 13, 250, 3,  77,  120,
                               45, 66, 5,   180, 2,  31, 90,  14, 222, 8};
#define N_TOKS 20

/* backend logits (one call, blocks out of order) vs the naive reference */
static void check_against_reference(const kg_test_model_opts_t *o, double tol) {
    kg_model_t *m = load(kg_test_make_model(o));
    int V = m->hp.n_vocab, bs = 4;
    kg_backend_t *be = make_cpu(m, 16, bs, 64);
    int32_t table[8] = {9, 3, 14, 0, 7, 1, 2, 5}; /* out of order */
    float *got = malloc((size_t)N_TOKS * V * 4), *want = malloc((size_t)V * 4);
    run_seq(be, toks, N_TOKS, 0, 0, 1, table, 8, got, true);
    ref_model_t r = {.m = m, .n_ctx = 32};
    size_t kvn = (size_t)m->hp.n_layer * 32 * m->hp.n_head_kv * m->hp.head_dim;
    r.kc = calloc(kvn, 4);
    r.vc = calloc(kvn, 4);
    for (int i = 0; i < N_TOKS; i++) {
        ref_forward(&r, toks[i], i, want);
        double e = nmse(want, got + (size_t)i * V, V);
        ck_assert_msg(e < tol, "token %d: nmse %g >= %g", i, e, tol);
    }
    free(r.kc), free(r.vc), free(got), free(want);
    kg_backend_free(be);
    kg_model_free(m);
}

START_TEST(reference_gqa_untied) {
    kg_test_model_opts_t o = {
        .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 96, .seed = 1};
    check_against_reference(&o, 1e-5);
}
END_TEST

START_TEST(reference_mha_tied_headdim_ropebase) {
    kg_test_model_opts_t o = {.n_embd = 48,
                              .n_layer = 3,
                              .n_head = 3,
                              .n_head_kv = 3,
                              .n_ff = 80,
                              .head_dim = 32,
                              .rope_base = 500000.0f,
                              .tied = true,
                              .seed = 2};
    check_against_reference(&o, 1e-5);
}
END_TEST

START_TEST(reference_f16) {
    /* fp16 activations and KV: the error budget is fp16 rounding */
    kg_test_model_opts_t o = {.n_embd = 64,
                              .n_layer = 2,
                              .n_head = 8,
                              .n_head_kv = 1,
                              .n_ff = 128,
                              .type = "f16",
                              .seed = 3};
    check_against_reference(&o, 1e-4);
}
END_TEST

/* One call over the whole sequence equals prefill + token-by-token decode,
 * and a batch mixing two sequences equals running each alone: bit for bit,
 * since a token's row must not depend on what shares its step. */
START_TEST(one_call_vs_incremental_and_mixed) {
    kg_test_model_opts_t o = {
        .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 96, .seed = 4};
    kg_model_t *m = load(kg_test_make_model(&o));
    int V = m->hp.n_vocab;
    kg_backend_t *be = make_cpu(m, 32, 4, 64);
    int32_t table[2 * 8] = {5, 6, 7, 8, 9, 10, 11, 12, /* slot 1: */ 20, 1, 30, 2, 25, 3, 4, 0};
    float *whole = malloc((size_t)N_TOKS * V * 4), *one = malloc((size_t)V * 4);
    run_seq(be, toks, N_TOKS, 0, 0, 2, table, 8, whole, true);
    /* prefill 7, then one at a time, in slot 1 */
    float *step = malloc((size_t)V * 4);
    run_seq(be, toks, 7, 0, 1, 2, table, 8, step, false);
    ck_assert_double_eq(nmse(whole + 6 * V, step, V), 0.0); /* bitwise: batch invariance */
    for (int i = 7; i < N_TOKS; i++) {
        run_seq(be, toks + i, 1, i, 1, 2, table, 8, one, false);
        double e = nmse(whole + (size_t)i * V, one, V);
        ck_assert_msg(e == 0.0, "pos %d nmse %g", i, e);
    }
    /* mixed batch: slot 0 re-decodes its last token while slot 1 prefills 5 */
    int32_t mt[6] = {toks[N_TOKS - 1], 11, 22, 33, 44, 55};
    int32_t mp[6] = {N_TOKS - 1, 0, 1, 2, 3, 4}, ms[6] = {0, 1, 1, 1, 1, 1};
    bool mw[6] = {true, false, false, false, false, true};
    float *mixed = malloc((size_t)2 * V * 4);
    kg_step_batch_t b = {.n_tokens = 6,
                         .token = mt,
                         .pos = mp,
                         .seq = ms,
                         .want_logits = mw,
                         .n_outputs = 2,
                         .n_slots = 2,
                         .max_blocks_per_seq = 8,
                         .block_table = table};
    ck_assert_int_eq(kg_backend_forward(be, &b, mixed), KG_OK);
    ck_assert_double_eq(nmse(whole + (size_t)(N_TOKS - 1) * V, mixed, V), 0.0);
    run_seq(be, mt + 1, 5, 0, 1, 2, table, 8, one, false);
    ck_assert_double_eq(nmse(one, mixed + V, V), 0.0);
    free(whole), free(one), free(step), free(mixed);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

/* The same weights stored as F16 give nearly the same logits and argmax. */
START_TEST(f16_vs_f32) {
    kg_test_model_opts_t o = {
        .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 4, .n_ff = 128, .seed = 5};
    char p32[4096];
    snprintf(p32, sizeof(p32), "%s", kg_test_make_model(&o));
    o.type = "f16";
    kg_model_t *m32 = load(p32), *m16 = load(kg_test_make_model(&o));
    int V = m32->hp.n_vocab;
    kg_backend_t *b32 = make_cpu(m32, 8, 4, 32), *b16 = make_cpu(m16, 8, 4, 32);
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *l32 = malloc((size_t)N_TOKS * V * 4), *l16 = malloc((size_t)N_TOKS * V * 4);
    run_seq(b32, toks, N_TOKS, 0, 0, 1, table, 8, l32, true);
    run_seq(b16, toks, N_TOKS, 0, 0, 1, table, 8, l16, true);
    double e = nmse(l32, l16, (int64_t)N_TOKS * V);
    ck_assert_msg(e < 1e-4, "f16 vs f32 nmse %g", e);
    ck_assert_msg(e > 0, "f16 and f32 identical: rounding is not applied");
    free(l32), free(l16);
    kg_backend_free(b32), kg_backend_free(b16);
    kg_model_free(m32), kg_model_free(m16);
}
END_TEST

/* llama.cpp's greedy reference on stories260K, through the CLI. */
START_TEST(stories260k_greedy_reference) {
    const char *model = kg_test_data("models/stories260K.gguf");
    if (!kg_test_exists(model)) {
        ck_abort_msg("missing %s", model);
    }
    size_t len;
    char *readme = kg_test_read_file(kg_test_data("README.md"), &len);
    ck_assert_ptr_nonnull(readme);
    const char *mark = strstr(readme, "Generated token ids (64):");
    ck_assert_ptr_nonnull(mark);
    const char *ids = strstr(mark, "```\n");
    ck_assert_ptr_nonnull(ids);
    ids += 4;
    const char *end = strstr(ids, "\n```");
    ck_assert_ptr_nonnull(end);
    char expected[1024];
    snprintf(expected, sizeof(expected), "%.*s\n", (int)(end - ids), ids);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s/kgen generate --model '%s' --prompt 'Once upon a time' --n-predict 64 --temp 0 "
             "--print-ids --quiet",
             KG_BIN_DIR, model);
    int status;
    char *out = kg_test_run(cmd, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_str_eq(out, expected);
    free(out);
    free(readme);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("forward");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, reference_gqa_untied);
    tcase_add_test(tc, reference_mha_tied_headdim_ropebase);
    tcase_add_test(tc, reference_f16);
    suite_add_tcase(s, tc);
    tc = tcase_create("consistency");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, one_call_vs_incremental_and_mixed);
    tcase_add_test(tc, f16_vs_f32);
    suite_add_tcase(s, tc);
    tc = tcase_create("stories260k");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stories260k_greedy_reference);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
