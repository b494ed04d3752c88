/* check_mamba2: the Mamba-2 hybrids' loader (kg_model_mamba2.c): the layer
 * kinds granitehybrid and nemotron_h files say (per-layer K/V heads and,
 * for nemotron_h, per-layer FFN widths), the sizes of their states, and the
 * refusals of malformed files, each with a message naming what is wrong.
 * nemotron_h_moe's experts (no gate, a shared expert of its own width).
 * The arithmetic is checked against llama.cpp by check_arch's goldens
 * (granitehybrid, nemotron_h, nemotron_h_moe of tests/data/arch/models.tsv),
 * chunk and batch invariance by its batch cases. Models are written with
 * `kgen mkmodel`, then keys or tensors are changed with the GGUF writer. */
#include "check_common.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRANITE                                                                                    \
    "--arch granitehybrid --n-embd 256 --n-layer 5 --n-head 4 --n-head-kv 2 --n-ff 512 --ctx 256 " \
    "--seed 5"
#define NEMOTRON                                                                                   \
    "--arch nemotron_h --n-embd 256 --n-layer 6 --n-head 4 --n-head-kv 2 --n-ff 512 --ctx 256 "    \
    "--seed 6"
#define NEMOTRON_MOE                                                                               \
    "--arch nemotron_h_moe --n-embd 256 --n-layer 5 --n-head 4 --n-head-kv 2 --n-ff 512 "          \
    "--n-ff-exp 64 --n-expert 4 --n-expert-used 2 --ctx 256 --seed 7"

static char *mk(const char *args) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("mamba2"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    return strdup(path);
}

/* What a rewrite changes: keys left out (NULL-terminated), keys added,
 * one tensor left out, one stored as F16 instead, one extra 1-D F32 tensor
 * of n_extra zeros. */
typedef struct edit {
    const char *const *drop_keys;
    void (*set)(kg_gguf_writer_t *w);
    const char *drop_tensor;
    const char *to_f16;
    const char *extra;
    int64_t n_extra;
} edit_t;

/* A changed copy of src; the new path (caller frees). */
static char *rewrite(const char *src, const edit_t *e) {
    char err[256];
    kg_gguf_t *g = kg_gguf_open(src, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t k = kg_gguf_key(g, i);
        bool skip = false;
        for (int d = 0; e->drop_keys && e->drop_keys[d]; d++) {
            skip |= k.len == strlen(e->drop_keys[d]) && memcmp(k.data, e->drop_keys[d], k.len) == 0;
        }
        if (!skip) {
            kg_gguf_writer_copy_kv(w, g, i);
        }
    }
    if (e->set) {
        e->set(w);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        if (e->drop_tensor && strcmp(name, e->drop_tensor) == 0) {
            continue;
        }
        if (e->to_f16 && strcmp(name, e->to_f16) == 0) {
            ck_assert_int_eq(t->type, KG_GGML_TYPE_F32);
            ck_assert_int_eq(
                kg_gguf_writer_add_tensor(w, name, KG_GGML_TYPE_F16, t->n_dims, t->ne, t->data),
                KG_OK);
            continue;
        }
        ck_assert_int_eq(
            kg_gguf_writer_add_tensor_raw(w, name, t->type, t->n_dims, t->ne, t->data, t->size),
            KG_OK);
    }
    if (e->extra) {
        float *v = calloc((size_t)e->n_extra, sizeof(float));
        int64_t ne[1] = {e->n_extra};
        ck_assert_int_eq(kg_gguf_writer_add_tensor(w, e->extra, KG_GGML_TYPE_F32, 1, ne, v), KG_OK);
        free(v);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("mamba2-rw"));
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_free(g);
    return strdup(path);
}

static kg_model_t *load_ok(const char *path) {
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

/* The rewrite of src fails to load, with a message containing `want`. */
static void refuses(const char *src, const edit_t *e, const char *want) {
    char *path = rewrite(src, e);
    char err[512] = "";
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m == NULL, "loaded despite the edit that should give '%s'", want);
    ck_assert_msg(strstr(err, want) != NULL, "error '%s' lacks '%s'", err, want);
    remove(path);
    free(path);
}

START_TEST(granitehybrid_layers) {
    char *src = mk(GRANITE);
    kg_model_t *m = load_ok(src);
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_GRANITEHYBRID);
    ck_assert(kg_model_is_recurrent(m));
    /* every third layer attention, from the third */
    const kg_layer_kind_t want[5] = {KG_LAYER_MAMBA2, KG_LAYER_MAMBA2, KG_LAYER_ATTN,
                                     KG_LAYER_MAMBA2, KG_LAYER_MAMBA2};
    ck_assert_int_eq(hp->n_layer_recurrent, 4);
    ck_assert_int_eq(hp->n_head_kv, 2);
    ck_assert(hp->ssm_d_conv == 4 && hp->ssm_d_inner == 512 && hp->ssm_d_state == 64 &&
              hp->ssm_dt_rank == 8 && hp->ssm_n_group == 2);
    /* Granite's multipliers; NoPE (rope.scaling.finetuned false) */
    ck_assert(hp->logit_scale == 2.0f && hp->embd_scale == 12.0f && hp->residual_scale == 0.22f);
    for (int il = 0; il < 5; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert_int_eq(L->kind, want[il]);
        ck_assert(L->no_rope);
        ck_assert_int_eq(L->n_ff, 512); /* the FFN in every layer */
        ck_assert_ptr_nonnull(L->ffn_norm);
        /* window (d_conv - 1) x (d_inner + 2 n_group d_state), SSM d_state x d_inner */
        ck_assert_int_eq(kg_model_state_floats(m, il),
                         want[il] == KG_LAYER_MAMBA2 ? 3 * (512 + 256) + 64 * 512 : 0);
        ck_assert(want[il] != KG_LAYER_MAMBA2 || (L->ssm_in && L->ssm_conv1d_b && L->ssm_out));
    }
    kg_model_free(m);

    /* a file without logit_scale loads (llama.cpp reads it as optional here) */
    static const char *const no_logit[] = {"granitehybrid.logit_scale", NULL};
    char *p = rewrite(src, &(edit_t){.drop_keys = no_logit});
    m = load_ok(p);
    ck_assert(m->hp.logit_scale == 0.0f);
    kg_model_free(m);
    remove(p);
    free(p);
    /* the convolution's bias is optional */
    p = rewrite(src, &(edit_t){.drop_tensor = "blk.1.ssm_conv1d.bias"});
    m = load_ok(p);
    ck_assert(m->layers[1].ssm_conv1d_b == NULL && m->layers[0].ssm_conv1d_b != NULL);
    kg_model_free(m);
    remove(p);
    free(p);
    remove(src);
    free(src);
}
END_TEST

START_TEST(nemotron_h_layers) {
    char *src = mk(NEMOTRON);
    kg_model_t *m = load_ok(src);
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_NEMOTRON_H);
    ck_assert_int_eq(hp->ffn_act, KG_FFN_RELU_SQR);
    ck_assert_int_eq(hp->n_ff, 512);
    ck_assert_int_eq(hp->n_head_kv, 2);
    ck_assert_int_eq(hp->n_layer_recurrent, 3);
    /* Mamba-2, MLP, Mamba-2, attention, MLP, Mamba-2 */
    const kg_layer_kind_t want[6] = {KG_LAYER_MAMBA2, KG_LAYER_FFN, KG_LAYER_MAMBA2,
                                     KG_LAYER_ATTN,   KG_LAYER_FFN, KG_LAYER_MAMBA2};
    for (int il = 0; il < 6; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert_int_eq(L->kind, want[il]);
        ck_assert(L->no_rope);
        if (want[il] == KG_LAYER_FFN) { /* the MLP alone, normed by attn_norm, no gate */
            ck_assert_int_eq(L->n_ff, 512);
            ck_assert_ptr_eq(L->ffn_norm, L->attn_norm);
            ck_assert(L->w_up && L->w_down && !L->w_gate && !L->wq && !L->ssm_in);
        } else { /* a mixer alone */
            ck_assert_int_eq(L->n_ff, 0);
            ck_assert(!L->ffn_norm && !L->w_up && !L->w_down);
        }
    }
    kg_model_free(m);
    remove(src);
    free(src);
}
END_TEST

START_TEST(nemotron_h_moe_layers) {
    char *src = mk(NEMOTRON_MOE);
    kg_model_t *m = load_ok(src);
    const kg_hparams_t *hp = &m->hp;
    ck_assert_int_eq(hp->arch, KG_ARCH_NEMOTRON_H_MOE);
    ck_assert_int_eq(hp->ffn_act, KG_FFN_RELU_SQR);
    /* the sigmoid router, renormalised and scaled as the file says; the
     * shared expert's own width */
    ck_assert(hp->n_expert == 4 && hp->n_expert_used == 2 && hp->n_ff_exp == 64);
    ck_assert_int_eq(hp->moe_gating, KG_MOE_SIGMOID);
    ck_assert(hp->moe_norm_w && hp->moe_w_scale == 2.5f && hp->n_ff_shexp == 128);
    const kg_layer_kind_t want[5] = {KG_LAYER_MAMBA2, KG_LAYER_FFN, KG_LAYER_MAMBA2, KG_LAYER_ATTN,
                                     KG_LAYER_FFN};
    for (int il = 0; il < 5; il++) {
        const kg_layer_weights_t *L = &m->layers[il];
        ck_assert_int_eq(L->kind, want[il]);
        if (want[il] == KG_LAYER_FFN) { /* experts without a gate, and the shared expert */
            ck_assert(L->ffn_gate_inp && L->exp_probs_b && L->up_exps && L->down_exps);
            ck_assert(!L->gate_exps && !L->exp_gate && L->exp_up && L->exp_down);
            ck_assert(L->up_shexp && L->down_shexp && !L->gate_shexp && !L->w_up);
            ck_assert_ptr_eq(L->ffn_norm, L->attn_norm);
        } else {
            ck_assert(L->n_ff == 0 && !L->ffn_gate_inp);
        }
    }
    kg_model_free(m);
    remove(src);
    free(src);
}
END_TEST

static void granite_inner_3e(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "granitehybrid.ssm.inner_size", 768);
}

static void granite_heads_7(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "granitehybrid.ssm.time_step_rank", 7);
}

static void granite_groups_3(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "granitehybrid.ssm.group_count", 3);
}

static void granite_kv_short(kg_gguf_writer_t *w) {
    const int32_t kv[4] = {0, 0, 2, 0};
    kg_gguf_writer_set_arr_i32(w, "granitehybrid.attention.head_count_kv", kv, 4);
}

static void granite_kv_mixed(kg_gguf_writer_t *w) {
    const int32_t kv[5] = {0, 4, 2, 0, 0};
    kg_gguf_writer_set_arr_i32(w, "granitehybrid.attention.head_count_kv", kv, 5);
}

static void nemo_ff_mixed(kg_gguf_writer_t *w) {
    const int32_t ff[6] = {0, 512, 0, 0, 256, 0};
    kg_gguf_writer_set_arr_i32(w, "nemotron_h.feed_forward_length", ff, 6);
}

static void nemo_latent(kg_gguf_writer_t *w) {
    kg_gguf_writer_set_u32(w, "nemotron_h_moe.moe_latent_size", 128);
}

static void nemo_no_mlp(kg_gguf_writer_t *w) {
    const int32_t ff[6] = {0, 0, 0, 0, 0, 0};
    kg_gguf_writer_set_arr_i32(w, "nemotron_h.feed_forward_length", ff, 6);
}

START_TEST(malformed_files_are_refused) {
    char *src = mk(GRANITE);
    static const char *const no_state[] = {"granitehybrid.ssm.state_size", NULL};
    refuses(src, &(edit_t){.drop_keys = no_state}, "granitehybrid.ssm.state_size missing");
    refuses(src, &(edit_t){.set = granite_inner_3e}, "2 x embedding_length");
    refuses(src, &(edit_t){.set = granite_heads_7}, "multiple of ssm.time_step_rank");
    refuses(src, &(edit_t){.set = granite_groups_3}, "ssm.group_count");
    refuses(src, &(edit_t){.set = granite_kv_short}, "array of block_count (5)");
    refuses(src, &(edit_t){.set = granite_kv_mixed}, "different K/V head counts (4, 2)");
    refuses(src, &(edit_t){.drop_tensor = "blk.3.ssm_a"}, "missing tensor 'blk.3.ssm_a'");
    refuses(src, &(edit_t){.drop_tensor = "blk.0.ssm_norm.weight"},
            "missing tensor 'blk.0.ssm_norm.weight'");
    refuses(src, &(edit_t){.to_f16 = "blk.1.ssm_conv1d.weight"}, "the convolution must be F32");
    /* a tensor of a variant kgen does not run (an attention layer's is not
     * read in a Mamba-2 layer) */
    refuses(src, &(edit_t){.extra = "blk.0.attn_output.bias", .n_extra = 256},
            "'blk.0.attn_output.bias' is not part of the granitehybrid graph");
    remove(src);
    free(src);

    src = mk(NEMOTRON);
    static const char *const no_eps[] = {"nemotron_h.attention.layer_norm_epsilon", NULL};
    refuses(src, &(edit_t){.drop_keys = no_eps}, "nemotron_h.attention.layer_norm_epsilon");
    refuses(src, &(edit_t){.set = nemo_ff_mixed}, "MLP layers of different widths (512, 256)");
    refuses(src, &(edit_t){.set = nemo_no_mlp}, "no MLP layer");
    refuses(src, &(edit_t){.extra = "blk.1.ffn_up.bias", .n_extra = 512},
            "'blk.1.ffn_up.bias' is not part of the nemotron_h graph");
    remove(src);
    free(src);

    src = mk(NEMOTRON_MOE);
    refuses(src, &(edit_t){.set = nemo_latent}, "no moe_latent_size");
    static const char *const no_shexp[] = {"nemotron_h_moe.expert_shared_feed_forward_length",
                                           NULL};
    refuses(src, &(edit_t){.drop_keys = no_shexp}, "expert_shared_feed_forward_length in 1..2^24");
    refuses(src, &(edit_t){.drop_tensor = "blk.4.exp_probs_b.bias"},
            "missing tensor 'blk.4.exp_probs_b.bias'");
    refuses(src, &(edit_t){.drop_tensor = "blk.1.ffn_up_shexp.weight"},
            "missing tensor 'blk.1.ffn_up_shexp.weight'");
    remove(src);
    free(src);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("mamba2");
    TCase *tc = tcase_create("loader");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, granitehybrid_layers);
    tcase_add_test(tc, nemotron_h_layers);
    tcase_add_test(tc, nemotron_h_moe_layers);
    tcase_add_test(tc, malformed_files_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
