/* check_cancel: the memo of recent cancels (TTL, renewal, the bound forgets the oldest first,
 * hash chains stay consistent under churn) and the cancel message (value, key-only, rejects). */
#include "check_common.h"
#include "config/kg_config.h"
#include "kafka/kg_cancel.h"
#include "kafka/kg_lanes.h"
#include "schema/kg_cancelmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(memo_ttl) {
    kg_cancel_memo_t *m = kg_cancel_memo_new(8, 1000);
    ck_assert_ptr_nonnull(m);
    ck_assert(!kg_cancel_memo_has(m, "a", 0));
    kg_cancel_memo_add(m, "a", 100);
    ck_assert(kg_cancel_memo_has(m, "a", 100));
    ck_assert(kg_cancel_memo_has(m, "a", 1100));
    ck_assert(!kg_cancel_memo_has(m, "a", 1101)); /* expired */
    kg_cancel_memo_add(m, "a", 1050);             /* a second cancel renews it */
    ck_assert(kg_cancel_memo_has(m, "a", 2000));
    ck_assert_int_eq(kg_cancel_memo_size(m), 1);
    ck_assert(!kg_cancel_memo_has(m, "b", 100));
    kg_cancel_memo_free(m);
    ck_assert_ptr_null(kg_cancel_memo_new(0, 1000));
}
END_TEST

START_TEST(memo_bound) {
    kg_cancel_memo_t *m = kg_cancel_memo_new(3, 1000000);
    kg_cancel_memo_add(m, "a", 1);
    kg_cancel_memo_add(m, "b", 2);
    kg_cancel_memo_add(m, "c", 3);
    kg_cancel_memo_add(m, "a", 4); /* renewed: now the newest */
    kg_cancel_memo_add(m, "d", 5); /* full: b, the oldest, goes */
    ck_assert(kg_cancel_memo_has(m, "a", 6));
    ck_assert(!kg_cancel_memo_has(m, "b", 6));
    ck_assert(kg_cancel_memo_has(m, "c", 6));
    ck_assert(kg_cancel_memo_has(m, "d", 6));
    ck_assert_int_eq(kg_cancel_memo_size(m), 3);
    kg_cancel_memo_free(m);
}
END_TEST

/* Many ids through a small memo: exactly the last `cap` distinct ids are known. */
START_TEST(memo_churn) {
    const int cap = 100, n = 5000;
    kg_cancel_memo_t *m = kg_cancel_memo_new(cap, 1000000);
    char id[32];
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "job-%d", i);
        kg_cancel_memo_add(m, id, i);
    }
    ck_assert_int_eq(kg_cancel_memo_size(m), cap);
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "job-%d", i);
        ck_assert_msg(kg_cancel_memo_has(m, id, n) == (i >= n - cap), "%s", id);
    }
    kg_cancel_memo_free(m);
}
END_TEST

static kg_status_t decode(const char *key, const char *value, char *rid) {
    char why[160] = "";
    kg_status_t st = kg_cancelmsg_decode(key, key ? strlen(key) : 0, value,
                                         value ? strlen(value) : 0, rid, why, sizeof(why));
    ck_assert(st == KG_OK || why[0] != '\0');
    return st;
}

START_TEST(message) {
    char rid[KG_JOB_REQUEST_ID_MAX + 1];
    ck_assert_int_eq(decode("k", "{\"request_id\":\"req-42\",\"schema_version\":1}", rid), KG_OK);
    ck_assert_str_eq(rid, "req-42"); /* the value wins over the key */
    ck_assert_int_eq(decode("by-key.1", NULL, rid), KG_OK);
    ck_assert_str_eq(rid, "by-key.1");
    ck_assert_int_eq(decode("x", "{\"request_id\":\"a\",\"extra\":[1]}", rid), KG_OK);
    ck_assert_int_eq(decode("bad key", NULL, rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode(NULL, NULL, rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "not json", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "[\"req\"]", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":\"a b\"}", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":7}", rid), KG_ERR_INVALID);
    ck_assert_int_eq(decode("k", "{\"request_id\":\"a\",\"schema_version\":2}", rid),
                     KG_ERR_INVALID);
    char long_id[200];
    memset(long_id, 'x', 129);
    long_id[129] = '\0';
    ck_assert_int_eq(decode(long_id, NULL, rid), KG_ERR_INVALID);
    size_t len;
    char *enc = kg_cancelmsg_encode("req-42", &len);
    ck_assert_str_eq(enc, "{\"request_id\":\"req-42\",\"schema_version\":1}");
    ck_assert_uint_eq(len, strlen(enc));
    free(enc);
}
END_TEST

/* Which cancel topics a worker reads: each lane's <topic>.cancel by default,
 * --cancel-topic for all lanes, none with "none". */
START_TEST(topic_names) {
    kg_config_t cfg;
    kg_config_init(&cfg);
    kg_lanes_t lanes;
    char err[256], names[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX];
    ck_assert(kg_lanes_parse("jobs.hi:4,jobs.bulk:1", &lanes, err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 2);
    ck_assert_str_eq(names[0], "jobs.hi.cancel");
    ck_assert_str_eq(names[1], "jobs.bulk.cancel");
    ck_assert(kg_config_set(&cfg, "cancel-topic", "stop", err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 1);
    ck_assert_str_eq(names[0], "stop");
    ck_assert(kg_config_set(&cfg, "cancel-topic", "none", err, sizeof(err)) == KG_OK);
    ck_assert_int_eq(kg_cancel_topic_names(&cfg, &lanes, names), 0);
    kg_config_clear(&cfg);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cancel");
    TCase *tc = tcase_create("memo");
    tcase_add_test(tc, memo_ttl);
    tcase_add_test(tc, memo_bound);
    tcase_add_test(tc, memo_churn);
    suite_add_tcase(s, tc);
    tc = tcase_create("message");
    tcase_add_test(tc, message);
    tcase_add_test(tc, topic_names);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
