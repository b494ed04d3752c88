/* check_config: precedence (defaults < file < env < flags), librdkafka
 * passthrough, validation and secret redaction. */
#include "check_common.h"
#include "config/kg_config.h"

#include <stdio.h>
#include <string.h>

static kg_status_t parse(kg_config_t *cfg, char **envp, int argc, char **argv, char *err) {
    kg_config_init(cfg);
    return kg_config_parse(cfg, argc, argv, envp, err, 256);
}

START_TEST(defaults) {
    kg_config_t cfg;
    char err[256];
    char *argv[] = {"kgen-worker", "--demo", "3"};
    char *envp[] = {NULL};
    ck_assert_int_eq(parse(&cfg, envp, 3, argv, err), KG_OK);
    ck_assert_str_eq(cfg.jobs_topic, "kgen.jobs");
    ck_assert_str_eq(cfg.results_topic, "kgen.results");
    ck_assert_int_eq(cfg.http_port, 9400);
    ck_assert_int_eq(cfg.demo, 3);
    ck_assert(cfg.prefix_cache);
    kg_config_clear(&cfg);
}
END_TEST

/* --no-NAME for a boolean, as `kgen batch` and kgen-bench spell it; a
 * --no- form of a non-boolean stays unknown */
START_TEST(negated_boolean) {
    kg_config_t cfg;
    char err[256];
    char *envp[] = {NULL};
    char *argv[] = {"kgen-worker", "--demo", "1", "--no-prefix-cache"};
    ck_assert_int_eq(parse(&cfg, envp, 4, argv, err), KG_OK);
    ck_assert(!cfg.prefix_cache);
    kg_config_clear(&cfg);
    char *argv2[] = {"kgen-worker", "--demo", "1", "--prefix-cache", "false", "--prefix-cache"};
    ck_assert_int_eq(parse(&cfg, envp, 6, argv2, err), KG_OK);
    ck_assert(cfg.prefix_cache);
    kg_config_clear(&cfg);
    char *argv3[] = {"kgen-worker", "--demo", "1", "--no-max-batch-size"};
    ck_assert_int_eq(parse(&cfg, envp, 4, argv3, err), KG_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "--no-max-batch-size"));
    kg_config_clear(&cfg);
}
END_TEST

START_TEST(served_model_name_repeats) {
    kg_config_t cfg;
    char err[256];
    /* the environment gives one list; the command line replaces it, and its
     * repeats add up */
    char *envp[] = {"KGEN_SERVED_MODEL_NAME=from-env", NULL};
    char *argv[] = {"kgen-worker",         "--demo", "1",
                    "--served-model-name", "a,b",    "--served-model-name=c"};
    ck_assert_int_eq(parse(&cfg, envp, 6, argv, err), KG_OK);
    ck_assert_str_eq(cfg.served_model_name, "a,b,c");
    kg_config_clear(&cfg);
    char *argv2[] = {"kgen-worker", "--demo", "1"};
    ck_assert_int_eq(parse(&cfg, envp, 3, argv2, err), KG_OK);
    ck_assert_str_eq(cfg.served_model_name, "from-env");
    kg_config_clear(&cfg);
    /* --lora adds up the same way */
    char *envl[] = {"KGEN_LORA=x=x.gguf", NULL};
    char *argv3[] = {"kgen-worker", "--demo", "1", "--lora", "a=a.gguf:0.5", "--lora=b=b.gguf"};
    ck_assert_int_eq(parse(&cfg, envl, 6, argv3, err), KG_OK);
    ck_assert_str_eq(cfg.lora, "a=a.gguf:0.5,b=b.gguf");
    kg_config_clear(&cfg);
    ck_assert_int_eq(parse(&cfg, envl, 3, argv2, err), KG_OK);
    ck_assert_str_eq(cfg.lora, "x=x.gguf");
    kg_config_clear(&cfg);
}
END_TEST

START_TEST(precedence_and_passthrough) {
    const char *path = kg_test_tmp_path("cfg");
    FILE *f = fopen(path, "w");
    fprintf(
        f,
        "# comment\nmax-batch-size = 4\njobs-topic=from-file\nkafka.linger.ms=7\nlog-level=warn\n");
    fclose(f);
    kg_config_t cfg;
    char err[256];
    char *envp[] = {"KGEN_MAX_BATCH_SIZE=8", "KGEN_RDKAFKA_SASL_PASSWORD=hunter2",
                    "KGEN_KAFKA_CACHE=/x", "PATH=/bin", NULL};
    char *argv[] = {"kgen-worker",
                    "--model",
                    "m.gguf",
                    "--config",
                    (char *)path,
                    "--max-batch-size=12",
                    "-X",
                    "security.protocol=SASL_SSL",
                    "-Xsasl.mechanisms=PLAIN",
                    "--prefix-cache",
                    "false"};
    ck_assert_msg(parse(&cfg, envp, 11, argv, err) == KG_OK, "%s", err);
    ck_assert_int_eq(cfg.max_batch_size, 12); /* flag beats env beats file */
    ck_assert_str_eq(cfg.jobs_topic, "from-file");
    ck_assert_str_eq(cfg.log_level, "warn");
    ck_assert(!cfg.prefix_cache);
    ck_assert_int_eq(cfg.n_kafka_props, 4);
    ck_assert_str_eq(cfg.kafka_keys[0], "linger.ms");
    ck_assert_str_eq(cfg.kafka_keys[1], "sasl.password");
    ck_assert_str_eq(cfg.kafka_values[1], "hunter2");
    ck_assert_str_eq(cfg.kafka_keys[2], "security.protocol");
    ck_assert_str_eq(cfg.kafka_values[3], "PLAIN");

    /* the dump never shows the secret */
    char *dump = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&dump, &len);
    kg_config_print(&cfg, mf);
    fclose(mf);
    ck_assert_ptr_null(strstr(dump, "hunter2"));
    ck_assert_ptr_nonnull(strstr(dump, "kafka.sasl.password=[redacted]"));
    ck_assert_ptr_nonnull(strstr(dump, "kafka.security.protocol=SASL_SSL"));
    free(dump);
    kg_config_clear(&cfg);
}
END_TEST

START_TEST(bad_input_is_an_error) {
    struct {
        int argc;
        char *argv[4];
        const char *want;
    } cases[] = {
        {3, {"w", "--max-batch-size", "0"}, "max-batch-size"},
        {3, {"w", "--max-batch-size", "12x"}, "max-batch-size"},
        {2, {"w", "--no-such-flag"}, "unknown option"},
        {3, {"w", "-X", "novalue"}, "key=value"},
        {3, {"w", "--backend", "tpu"}, "backend"},
        {3, {"w", "--log-format", "xml"}, "log-format"},
        {4, {"w", "--demo", "1", "--kv-type=q4_0"}, "expected f16 or q8_0"},
        {4, {"w", "--backend=cpu", "--demo=1", "--kv-type=q8_0"}, "needs the cuda backend"},
        {1, {"w"}, "--model is required"},
        {3, {"w", "--drain-timeout", "nan"}, "drain-timeout"},
        {2, {"w", "--model"}, "needs a value"},
        {4, {"w", "--demo", "1", "--http-address=localhost"}, "IPv4 or IPv6"},
        {4, {"w", "--demo", "1", "--http-address=10.0.0.300"}, "IPv4 or IPv6"},
        {4, {"w", "--demo", "1", "--max-event-bytes=1000"}, "at least 4096"},
        {4, {"w", "--demo", "1", "--poison-after=-1"}, "poison-after"},
        {4, {"w", "--demo", "1", "--propagate-headers=a,,b"}, "propagate-headers"},
        {4, {"w", "--demo", "1", "--propagate-headers=x;y"}, "propagate-headers"},
        {4, {"w", "--demo", "1", "--propagate-headers=kgen-format"}, "worker's own"},
        {4, {"w", "--demo", "1", "--propagate-headers=a,b,c,d,e,f,g,h,i,j,k,l,m,n"}, "at most 13"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_config_t cfg;
        char err[256] = "";
        char *envp[] = {NULL};
        kg_status_t st = parse(&cfg, envp, cases[i].argc, cases[i].argv, err);
        ck_assert_msg(st == KG_ERR_INVALID, "case %zu accepted", i);
        ck_assert_msg(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err,
                      cases[i].want);
        kg_config_clear(&cfg);
    }
    kg_config_t ok;
    char ok_err[256] = "";
    char *ok_envp[] = {NULL};
    char *ok_argv[] = {"w", "--demo", "1", "--propagate-headers= x-tenant , b3"};
    ck_assert_int_eq(parse(&ok, ok_envp, 4, ok_argv, ok_err), KG_OK);
    ck_assert_str_eq(ok.propagate_headers, " x-tenant , b3");
    kg_config_clear(&ok);
    kg_config_t cfg;
    char err[256];
    char *envp[] = {"KGEN_THREADS=lots", NULL};
    char *argv[] = {"w", "--demo", "1"};
    ck_assert_int_eq(parse(&cfg, envp, 3, argv, err), KG_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "environment"));
    kg_config_clear(&cfg);
}
END_TEST

/* --print-config shows what a worker would run with: it needs no --model.
 * --http-address takes IPv4 and IPv6 literals. */
START_TEST(print_config_and_addresses) {
    kg_config_t cfg;
    char err[256] = "";
    char *envp[] = {NULL};
    char *argv[] = {"w", "--print-config", "--http-address", "127.0.0.1"};
    ck_assert_msg(parse(&cfg, envp, 4, argv, err) == KG_OK, "%s", err);
    ck_assert(cfg.print_config);
    ck_assert_str_eq(cfg.http_address, "127.0.0.1");
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    kg_config_print(&cfg, mf);
    fclose(mf);
    ck_assert_ptr_nonnull(strstr(text, "http-address=127.0.0.1\n"));
    ck_assert_ptr_nonnull(strstr(text, "poison-after=2\n"));
    ck_assert_ptr_nonnull(strstr(text, "max-event-bytes=0\n"));
    free(text);
    kg_config_clear(&cfg);
    char *argv6[] = {"w", "--demo", "1", "--http-address=::1"};
    ck_assert_msg(parse(&cfg, envp, 4, argv6, err) == KG_OK, "%s", err);
    ck_assert_str_eq(cfg.http_address, "::1");
    kg_config_clear(&cfg);
}
END_TEST

START_TEST(help_lists_every_option) {
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    kg_config_print_markdown(mf);
    fclose(mf);
    ck_assert_ptr_nonnull(strstr(text, "`--max-batch-size` | `KGEN_MAX_BATCH_SIZE`"));
    ck_assert_ptr_nonnull(
        strstr(text, "`--jobs-topic` | `KGEN_JOBS_TOPIC` | string | `kgen.jobs`"));
    free(text);
    ck_assert(kg_config_is_secret("ssl.key.password"));
    ck_assert(kg_config_is_secret("sasl.password"));
    ck_assert(!kg_config_is_secret("bootstrap.servers"));
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, negated_boolean);
    tcase_add_test(tc, served_model_name_repeats);
    tcase_add_test(tc, precedence_and_passthrough);
    tcase_add_test(tc, bad_input_is_an_error);
    tcase_add_test(tc, print_config_and_addresses);
    tcase_add_test(tc, help_lists_every_option);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
