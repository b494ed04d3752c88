/* check_routing: prefix keys (kgen-submit --key prefix[:N]): equal prefixes give equal keys
 * whatever follows, N counts characters (not bytes), a system message is the whole key,
 * prompt_tokens count ids, and the key has its documented shape and value. */
#include "check_common.h"
#include "schema/kg_codec.h"
#include "schema/kg_routing.h"

#include <string.h>

static void key_of(const char *json, int32_t n, char out[KG_ROUTING_KEY_SIZE]) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(kg_codec_decode_job(json, strlen(json), &job, &err), KG_OK);
    kg_routing_prefix_key(job, n, out);
    kg_job_free(job);
}

START_TEST(shape_and_value) {
    char k[KG_ROUTING_KEY_SIZE];
    key_of("{\"request_id\":\"a\",\"prompt\":\"abc\"}", 256, k);
    ck_assert_uint_eq(strlen(k), KG_ROUTING_KEY_SIZE - 1);
    /* FNV-1a 64 of "abc" (a published test value) */
    ck_assert_str_eq(k, "pfx-e71fa2190541574b");
}
END_TEST

START_TEST(prompt_prefix) {
    char a[KG_ROUTING_KEY_SIZE], b[KG_ROUTING_KEY_SIZE], c[KG_ROUTING_KEY_SIZE];
    key_of("{\"request_id\":\"a\",\"prompt\":\"You are terse. Q1\"}", 14, a);
    key_of("{\"request_id\":\"b\",\"prompt\":\"You are terse. Question two\"}", 14, b);
    key_of("{\"request_id\":\"c\",\"prompt\":\"You are brief. Q1\"}", 14, c);
    ck_assert_str_eq(a, b);
    ck_assert_str_ne(a, c);
    /* beyond the shared part the keys part */
    key_of("{\"request_id\":\"b\",\"prompt\":\"You are terse. Question two\"}", 16, b);
    ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(characters_not_bytes) {
    char a[KG_ROUTING_KEY_SIZE], b[KG_ROUTING_KEY_SIZE];
    /* "\u00e9" is two bytes: 3 characters reach into the differing fourth byte only when N
     * counted bytes */
    key_of("{\"request_id\":\"a\",\"prompt\":\"\u00e9\u00e9Xa\"}", 3, a);
    key_of("{\"request_id\":\"b\",\"prompt\":\"\u00e9\u00e9Xb\"}", 3, b);
    ck_assert_str_eq(a, b);
    key_of("{\"request_id\":\"b\",\"prompt\":\"\u00e9\u00e9Yb\"}", 3, b);
    ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(system_message) {
    char a[KG_ROUTING_KEY_SIZE], b[KG_ROUTING_KEY_SIZE], c[KG_ROUTING_KEY_SIZE];
    key_of("{\"request_id\":\"a\",\"messages\":[{\"role\":\"system\",\"content\":\"S1\"},"
           "{\"role\":\"user\",\"content\":\"hi\"}]}",
           1, a);
    key_of("{\"request_id\":\"b\",\"messages\":[{\"role\":\"system\",\"content\":\"S1\"},"
           "{\"role\":\"user\",\"content\":\"something else\"}]}",
           256, b);
    key_of("{\"request_id\":\"c\",\"messages\":[{\"role\":\"system\",\"content\":\"S2\"},"
           "{\"role\":\"user\",\"content\":\"hi\"}]}",
           1, c);
    ck_assert_str_eq(a, b); /* the whole system message, whatever N */
    ck_assert_str_ne(a, c);
    /* no system message: the first N characters of "role\ncontent\n"... */
    key_of(
        "{\"request_id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"same start, A\"}]}",
        16, a);
    key_of(
        "{\"request_id\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"same start, B\"}]}",
        16, b);
    ck_assert_str_eq(a, b);
    key_of(
        "{\"request_id\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"same start, B\"}]}",
        18, b);
    ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(prompt_tokens) {
    char a[KG_ROUTING_KEY_SIZE], b[KG_ROUTING_KEY_SIZE];
    key_of("{\"request_id\":\"a\",\"prompt_tokens\":[1,2,3,4]}", 3, a);
    key_of("{\"request_id\":\"b\",\"prompt_tokens\":[1,2,3,5,6]}", 3, b);
    ck_assert_str_eq(a, b);
    key_of("{\"request_id\":\"b\",\"prompt_tokens\":[1,2,3,5,6]}", 4, b);
    ck_assert_str_ne(a, b);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("routing");
    TCase *tc = tcase_create("prefix_key");
    tcase_add_test(tc, shape_and_value);
    tcase_add_test(tc, prompt_prefix);
    tcase_add_test(tc, characters_not_bytes);
    tcase_add_test(tc, system_message);
    tcase_add_test(tc, prompt_tokens);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
