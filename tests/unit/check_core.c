/* check_core: status names and the logger's line format. */
#include "check_common.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/kg_log.h"
#include "core/kg_status.h"

START_TEST(status_names) {
    ck_assert_str_eq(kg_status_str(KG_OK), "ok");
    ck_assert_str_eq(kg_status_str(KG_KV_FULL), "kv cache full");
    ck_assert_str_eq(kg_status_str(KG_ERR_INVALID), "invalid argument");
    ck_assert_str_eq(kg_status_str((kg_status_t)12345), "unknown status");
}
END_TEST

/* Capture what one log call writes to stderr. */
static char *capture_log(kg_log_format_t fmt, const char *msg) {
    fflush(stderr);
    int saved = dup(2);
    const char *path = kg_test_tmp_path("log");
    FILE *f = fopen(path, "w");
    dup2(fileno(f), 2);
    kg_log_setup(KG_LOG_LEVEL_DEBUG, fmt);
    KG_LOG_INFO("engine", "%s", msg);
    KG_LOG_DEBUG("engine", "hidden? %d", 1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    kg_log_setup(KG_LOG_LEVEL_INFO, KG_LOG_FORMAT_LOGFMT);
    return kg_test_read_file(path, NULL);
}

START_TEST(logfmt_line) {
    char *out = capture_log(KG_LOG_FORMAT_LOGFMT, "job done request_id=r1 partition=3");
    ck_assert_ptr_nonnull(strstr(out, "level=info module=engine msg=\"job done\" request_id=r1 partition=3\n"));
    ck_assert_ptr_nonnull(strstr(out, "msg=\"hidden? 1\""));
    free(out);
}
END_TEST

START_TEST(json_line) {
    char *out = capture_log(KG_LOG_FORMAT_JSON, "said \"hi\" request_id=r1 reason=\"bad json\"");
    ck_assert_ptr_nonnull(strstr(out, "\"msg\":\"said \\\"hi\\\"\",\"request_id\":\"r1\",\"reason\":\"bad json\"}"));
    free(out);
}
END_TEST

START_TEST(level_parse) {
    ck_assert_int_eq(kg_log_level_parse("debug"), KG_LOG_LEVEL_DEBUG);
    ck_assert_int_eq(kg_log_level_parse("warn"), KG_LOG_LEVEL_WARN);
    ck_assert_int_eq(kg_log_level_parse("loud"), -1);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("status");
    tcase_add_test(tc, status_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("log");
    tcase_add_test(tc, logfmt_line);
    tcase_add_test(tc, json_line);
    tcase_add_test(tc, level_parse);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
