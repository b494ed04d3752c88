/* check_bert: the bert and nomic-bert encoders beyond their goldens
 * (check_embed compares their vectors and rerank scores with llama.cpp's):
 * an input's vector is the same bits alone and among 64 others, inputs run
 * whole in one step (the engine never cuts one; the backend refuses a cut
 * one or a step asking for logits), generation is refused, a rerank pair is
 * [CLS] query [SEP] document as llama.cpp's server builds it, and
 * nomic-bert's file is what llama.cpp's converter writes. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_engine.h"
#include "model/kg_embed.h"
#include "model/kg_model.h"
#include "model/kg_model_bert.h"
#include "model/kg_tokenizer.h"
#include "pipeline/kg_embedjob.h"
#include "pipeline/kg_intake.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BERT_ARGS                                                                                  \
    "--arch bert --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 4 --n-ff 128 --ctx 512 "
#define NOMIC_ARGS                                                                                 \
    "--arch nomic-bert --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 4 --n-ff 128 --ctx 512 "     \
    "--rope-base 1000 "

static kg_model_t *make_model(const char *args) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("bert"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    char err[512];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    return m;
}

static kg_engine_t *make_engine(const kg_model_t *m, kg_backend_t **be, int32_t batch_tokens) {
    kg_engine_params_t ep = kg_engine_params_default(m, 0);
    ep.max_batch_size = 8;
    ep.max_queue_depth = 128;
    ep.max_batch_tokens = batch_tokens;
    ep.max_seq_len = 512;
    ep.n_kv_blocks = 8 * 512 / ep.kv_block_size;
    kg_backend_params_t bp = {.n_threads = 2,
                              .n_kv_blocks = ep.n_kv_blocks,
                              .kv_block_size = ep.kv_block_size,
                              .max_batch_tokens = batch_tokens,
                              .max_seq_len = 512};
    char err[256];
    *be = kg_backend_cpu_new(m, &bp, err, sizeof(err));
    ck_assert_msg(*be != NULL, "%s", err);
    kg_engine_t *e = kg_engine_new(*be, &ep, err, sizeof(err));
    ck_assert_msg(e != NULL, "%s", err);
    return e;
}

/* One embedding request to its end; rows out; returns the steps it took. */
static int32_t run_embed(kg_engine_t *e,
                         const int32_t *ids,
                         const int32_t *lens,
                         int32_t n,
                         kg_engine_pool_t pool,
                         float *rows) {
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        total += lens[i];
    }
    kg_request_t req = {.id = 1,
                        .prompt = ids,
                        .n_prompt = total,
                        .max_tokens = 1,
                        .n_inputs = n,
                        .input_len = lens,
                        .pool = pool,
                        .embd = rows};
    ck_assert_int_eq(kg_engine_submit(e, &req), KG_OK);
    const int32_t cap = kg_engine_max_completions(e);
    int32_t done = 0, steps = 0;
    kg_completion_t *c = malloc((size_t)cap * sizeof(*c));
    while (kg_engine_busy(e)) {
        const int32_t k = kg_engine_step(e, c, cap);
        ck_assert_int_ge(k, 0);
        steps++;
        for (int32_t j = 0; j < k; j++) {
            ck_assert_int_eq(c[j].finish, KG_FINISH_STOP);
            done++;
        }
    }
    free(c);
    ck_assert_int_eq(done, n);
    kg_engine_stats_t st;
    kg_engine_stats(e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0); /* nothing kept beyond the job */
    return steps;
}

/* Input 38 of 65 (3 to 92 tokens each) alone, and among the others in
 * steps of up to 256 tokens that pack several whole inputs: the same bits,
 * for mean and CLS pooling, bert (0, 1) and nomic-bert (2, 3: its RoPE
 * angles are each input's own positions, whatever row the input starts at;
 * Q8_0 for 3, whose activations are quantized per row). The engine packs
 * the longest first: input 38 (55 tokens: the one-chunk attention) starts
 * 56 rows into its step; input 9 (85 tokens: the tiled attention, a full
 * tile and a masked tail of 21) is checked the same way. */
START_TEST(batch_invariant) {
    const kg_engine_pool_t pool = _i % 2 == 0 ? KG_ENGINE_POOL_MEAN : KG_ENGINE_POOL_FIRST;
    kg_model_t *m = make_model(_i < 2    ? BERT_ARGS "--seed 41"
                               : _i == 2 ? NOMIC_ARGS "--seed 45"
                                         : NOMIC_ARGS "--seed 45 --type q8_0");
    const int32_t E = m->hp.n_embd, V = m->hp.n_vocab;
    enum { N = 65 };
    static const int32_t targets[] = {38, 9};
    int32_t lens[N], total = 0;
    for (int32_t i = 0; i < N; i++) {
        lens[i] = 3 + (i * 7919) % 90;
        total += lens[i];
    }
    int32_t *ids = malloc((size_t)total * sizeof(int32_t));
    uint32_t x = 12345;
    for (int32_t k = 0; k < total; k++) {
        x = x * 1103515245u + 12345u;
        ids[k] = (int32_t)((x >> 8) % (uint32_t)V);
    }
    float *alone = malloc(2 * (size_t)E * sizeof(float));
    float *rows = malloc((size_t)N * (size_t)E * sizeof(float));
    kg_backend_t *be;
    kg_engine_t *e;
    for (int t = 0; t < 2; t++) {
        int32_t at = 0;
        for (int32_t i = 0; i < targets[t]; i++) {
            at += lens[i];
        }
        e = make_engine(m, &be, 128);
        run_embed(e, ids + at, &lens[targets[t]], 1, pool, alone + (size_t)t * (size_t)E);
        kg_engine_free(e);
        kg_backend_free(be);
    }
    e = make_engine(m, &be, 256);
    const int32_t steps = run_embed(e, ids, lens, N, pool, rows);
    ck_assert_int_lt(steps, N); /* inputs shared steps */
    for (int t = 0; t < 2; t++) {
        ck_assert_mem_eq(alone + (size_t)t * (size_t)E, rows + (size_t)targets[t] * (size_t)E,
                         (size_t)E * sizeof(float));
    }
    kg_engine_free(e);
    kg_backend_free(be);
    free(ids);
    free(alone);
    free(rows);
    kg_model_free(m);
}
END_TEST

/* The encoder's rules in the engine and the backend. */
START_TEST(encoder_rules) {
    kg_model_t *m = make_model(BERT_ARGS "--seed 44");
    ck_assert(kg_model_embed_only(m));
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_ENCODER);
    /* uniform layers, each with its own K/V: no per-layer shapes, no shared K/V */
    ck_assert(!(kg_model_features(m) &
                (KG_MODEL_FEAT_HEAD_PER_LAYER | KG_MODEL_FEAT_KV_SHARED | KG_MODEL_FEAT_BIDIR)));
    kg_backend_t *be;
    kg_engine_t *e = make_engine(m, &be, 32);
    int32_t ids[40];
    for (int32_t k = 0; k < 40; k++) {
        ids[k] = 104 + k;
    }
    float rows[2 * 64];
    /* generation: no LM head */
    kg_request_t gen = {.id = 2, .prompt = ids, .n_prompt = 4, .max_tokens = 4};
    ck_assert_int_eq(kg_engine_submit(e, &gen), KG_ERR_UNSUPPORTED);
    /* an input longer than a step could only run cut: refused */
    int32_t long_len[1] = {33};
    kg_request_t req = {.id = 3,
                        .prompt = ids,
                        .n_prompt = 33,
                        .max_tokens = 1,
                        .n_inputs = 1,
                        .input_len = long_len,
                        .pool = KG_ENGINE_POOL_MEAN,
                        .embd = rows};
    ck_assert_int_eq(kg_engine_submit(e, &req), KG_ERR_INVALID);
    /* two inputs of 20 in steps of 32: each waits for a step with room, whole */
    int32_t lens[2] = {20, 20};
    ck_assert_int_eq(run_embed(e, ids, lens, 2, KG_ENGINE_POOL_MEAN, rows), 2);
    /* the backend itself refuses an input that starts past position 0 (a
     * second chunk would attend causally) and a step asking for logits */
    int32_t tok[2] = {105, 106}, pos[2] = {3, 4}, seq[2] = {0, 0}, table[1] = {0};
    bool want[2] = {false, false}, hid[2] = {true, true};
    float hidden[2 * 64];
    kg_step_batch_t b = {.n_tokens = 2,
                         .token = tok,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want,
                         .n_slots = 1,
                         .max_blocks_per_seq = 1,
                         .block_table = table,
                         .want_hidden = hid,
                         .n_hidden = 2,
                         .hidden = hidden};
    ck_assert_int_eq(kg_backend_forward(be, &b, NULL), KG_ERR_INVALID);
    pos[0] = 0;
    pos[1] = 1;
    ck_assert_int_eq(kg_backend_forward(be, &b, NULL), KG_OK);
    want[1] = true;
    b.n_outputs = 1;
    float logits[512];
    ck_assert_int_eq(kg_backend_forward(be, &b, logits), KG_ERR_UNSUPPORTED);
    kg_engine_free(e);
    kg_backend_free(be);
    kg_model_free(m);
}
END_TEST

/* Jobs: generation is invalid_job with a reason; a rerank pair is
 * [CLS] query [SEP] document, pooled from its CLS row, scored in (0, 1). */
START_TEST(jobs) {
    kg_model_t *m = make_model(BERT_ARGS "--rerank --seed 43");
    ck_assert(kg_embed_can_rank(m));
    kg_intake_limits_t lim = {.max_seq_len = 512, .max_tokens_limit = 64};
    kg_job_t gen = {.task = KG_TASK_GENERATE, .prompt = "hi", .prompt_len = 2, .max_tokens = 4};
    kg_prepared_t prep = {0};
    kg_error_code_t code;
    char msg[256] = "";
    ck_assert_int_eq(kg_intake_prepare(m, &lim, &gen, 0, &prep, &code, msg, sizeof(msg)),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_INVALID_JOB);
    ck_assert_msg(strstr(msg, "encoder") != NULL, "%s", msg);
    kg_job_input_t doc = {.text = "b c", .len = 3};
    kg_job_t rr = {.task = KG_TASK_RERANK,
                   .query = {.text = "a", .len = 1},
                   .inputs = &doc,
                   .n_inputs = 1,
                   .normalize = true,
                   .pooling = KG_POOLING_MODEL};
    ck_assert_int_eq(kg_embedjob_prepare(m, &lim, &rr, &prep, &code, msg, sizeof(msg)), KG_OK);
    const int32_t sep = kg_tokenizer_sep(m->tok), cls = kg_tokenizer_bos(m->tok);
    ck_assert_int_eq(prep.n_tokens, 5);
    ck_assert_int_eq(prep.tokens[0], cls);
    ck_assert_int_eq(prep.tokens[2], sep);
    ck_assert_int_ne(prep.tokens[4], sep);
    ck_assert_int_eq(kg_embedjob_engine_pool(m, prep.pooling), KG_ENGINE_POOL_FIRST);
    /* an input longer than a step (here 4 tokens) is prompt_too_long */
    kg_prepared_t p2 = {0};
    lim.max_step_tokens = 4;
    ck_assert_int_eq(kg_embedjob_prepare(m, &lim, &rr, &p2, &code, msg, sizeof(msg)),
                     KG_ERR_INVALID);
    ck_assert_int_eq(code, KG_ERROR_PROMPT_TOO_LONG);
    ck_assert_msg(strstr(msg, "at most 4") != NULL, "%s", msg);
    kg_backend_t *be;
    kg_engine_t *e = make_engine(m, &be, 64);
    float row[64];
    run_embed(e, prep.tokens, prep.input_len, 1, KG_ENGINE_POOL_FIRST, row);
    const float s = kg_embed_rank_score(m, row);
    ck_assert(s > 0.0f && s < 1.0f);
    kg_engine_free(e);
    kg_backend_free(be);
    kg_prepared_clear(&prep);
    kg_model_free(m);
}
END_TEST

/* nomic-bert's file and model: the converter's keys (pooling mean, the
 * RoPE base), a fused attn_qkv and SwiGLU, no position embeddings, and no
 * classification head to rank with (mkmodel refuses --rerank). */
START_TEST(nomic_model) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("nomic"));
    ck_assert_int_ne(kg_test_mkmodel(path, NOMIC_ARGS "--rerank --seed 46"), 0);
    kg_model_t *m = make_model(NOMIC_ARGS "--seed 46");
    ck_assert_int_eq(m->hp.arch, KG_ARCH_NOMIC_BERT);
    ck_assert(kg_model_embed_only(m));
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_ENCODER);
    ck_assert(kg_model_features(m) & KG_MODEL_FEAT_ROPE_NEOX);
    ck_assert_int_eq(kg_embed_model_pooling(m), KG_EMBED_POOL_MEAN);
    ck_assert(!kg_embed_can_rank(m));
    ck_assert_float_eq(m->hp.rope_base, 1000.0f);
    ck_assert_int_eq(m->hp.n_rot, 16);
    ck_assert_ptr_null(m->bert->pos_embd);
    ck_assert_ptr_nonnull(m->layers[1].w_gate);
    /* the fused matrix's three row views: K starts n_embd rows after Q */
    ck_assert_ptr_eq((const char *)m->layers[1].wk->data,
                     (const char *)m->layers[1].wq->data + m->layers[1].wq->size);
    ck_assert_ptr_null(m->layers[1].bq);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("bert");
    TCase *tc = tcase_create("encoder");
    tcase_add_loop_test(tc, batch_invariant, 0, 4);
    tcase_add_test(tc, nomic_model);
    tcase_add_test(tc, encoder_rules);
    tcase_add_test(tc, jobs);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
