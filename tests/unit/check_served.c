/* check_served: the served model names (kg_served) and the intake checks
 * that use them and the other fields of this contract: model_not_found, n
 * against the engine's slots, logit_bias against the vocabulary. */
#include "check_common.h"
#include "pipeline/kg_intake.h"
#include "pipeline/kg_served.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

START_TEST(names_from_the_flag) {
    kg_served_t s;
    char err[128];
    ck_assert_int_eq(kg_served_init(&s, " a ,b,a,  c", NULL, "/m/x.gguf", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(s.n, 3); /* trimmed, repeats once, no defaults */
    ck_assert_str_eq(s.names[0], "a");
    ck_assert_str_eq(s.names[2], "c");
    char d[64];
    kg_served_describe(&s, d, sizeof(d));
    ck_assert_str_eq(d, "a, b, c");
    kg_served_clear(&s);
    ck_assert_int_eq(kg_served_init(&s, "a,,b", NULL, NULL, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "empty name"));
    kg_served_clear(&s);
    char many[4096] = "";
    for (int i = 0; i <= KG_SERVED_MAX; i++) {
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sm%d", i ? "," : "", i);
    }
    ck_assert_int_eq(kg_served_init(&s, many, NULL, NULL, err, sizeof(err)), KG_ERR_INVALID);
    kg_served_clear(&s);
    ck_assert_int_eq(
        kg_served_init(&s, "", NULL, "/models/llama-3.2-1b.Q8_0.gguf", err, sizeof(err)), KG_OK);
    ck_assert_int_eq(s.n, 1);
    ck_assert_str_eq(s.names[0], "llama-3.2-1b.Q8_0");
    kg_served_clear(&s);
}
END_TEST

static kg_model_t *tiny_model(char *path_out, size_t size) {
    kg_test_model_opts_t mo = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 64, .seed = 3};
    const char *path = kg_test_make_model(&mo);
    ck_assert_ptr_nonnull(path);
    snprintf(path_out, size, "%s", path);
    char err[256];
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

START_TEST(names_from_the_model) {
    char path[512];
    kg_model_t *m = tiny_model(path, sizeof(path));
    kg_served_t s;
    char err[128];
    ck_assert_int_eq(kg_served_init(&s, NULL, m, path, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(s.n, 2);
    ck_assert_str_eq(s.names[0], "kgen-random"); /* general.name of kgen mkmodel */
    const char *base = strrchr(path, '/') + 1;
    ck_assert_int_eq(strncmp(s.names[1], base, strlen(s.names[1])), 0);
    kg_served_clear(&s);
    kg_model_free(m);
    unlink(path);
}
END_TEST

static kg_job_t *job_of(const char *text) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_msg(kg_codec_decode_job(text, strlen(text), &job, &err) == KG_OK, "%s", err.message);
    return job;
}

START_TEST(intake_checks) {
    char path[512];
    kg_model_t *m = tiny_model(path, sizeof(path));
    const char *names[] = {"tiny", "tiny-2"};
    kg_intake_limits_t lim = {.max_seq_len = 64,
                              .max_tokens_limit = 32,
                              .max_choices = 4,
                              .served = names,
                              .n_served = 2};
    const struct {
        const char *job;
        kg_status_t st;
        kg_error_code_t code;
        const char *msg;
    } cases[] = {
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 4, \"model\": \"tiny-2\"}",
         KG_OK, 0, NULL},
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"model\": \"gpt-4o\"}", KG_ERR_INVALID,
         KG_ERROR_MODEL_NOT_FOUND,
         "model \"gpt-4o\" is not served here (this worker serves: \"tiny\", \"tiny-2\")"},
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 4, \"n\": 4}", KG_OK, 0, NULL},
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"n\": 5}", KG_ERR_INVALID,
         KG_ERROR_INVALID_JOB, "n: 5 completions exceed this worker's max-batch-size of 4"},
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 4, \"logit_bias\": {\"258\": "
         "5}}",
         KG_OK, 0, NULL},
        {"{\"request_id\": \"a\", \"prompt\": \"x\", \"logit_bias\": {\"259\": 5}}", KG_ERR_INVALID,
         KG_ERROR_INVALID_JOB, "logit_bias: 259 is not a token of this model (vocabulary of 259)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_job_t *job = job_of(cases[i].job);
        kg_prepared_t prep;
        kg_error_code_t code = KG_ERROR_INTERNAL;
        char msg[256] = "";
        kg_status_t st = kg_intake_prepare(m, &lim, job, 1, &prep, &code, msg, sizeof(msg));
        ck_assert_msg(st == cases[i].st, "case %zu: %s", i, msg);
        if (st != KG_OK) {
            ck_assert_int_eq(code, cases[i].code);
            ck_assert_str_eq(msg, cases[i].msg);
        }
        kg_prepared_clear(&prep);
        kg_job_free(job);
    }
    /* no names: any model */
    lim.n_served = 0;
    kg_job_t *job = job_of("{\"request_id\": \"a\", \"prompt\": \"x\", \"model\": \"any\"}");
    kg_prepared_t prep;
    kg_error_code_t code;
    char msg[128];
    lim.max_tokens_limit = 1000;
    ck_assert_int_eq(kg_intake_prepare(m, &lim, job, 1, &prep, &code, msg, sizeof(msg)), KG_OK);
    kg_prepared_clear(&prep);
    kg_job_free(job);
    kg_model_free(m);
    unlink(path);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("served");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, names_from_the_flag);
    tcase_add_test(tc, names_from_the_model);
    tcase_add_test(tc, intake_checks);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
