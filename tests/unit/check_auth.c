/* check_auth: the streak behind --auth-timeout (kg_auth: login failures, and authorization
 * failures that count the same but are said as a missing ACL) and the ACL named for each kind
 * of authorization error (kg_acl). */
#include "check_common.h"
#include "kafka/kg_acl.h"
#include "kafka/kg_auth.h"

#include <string.h>

START_TEST(streak_from_start) {
    kg_auth_t a;
    kg_auth_start(&a, 1000);
    ck_assert_int_eq(kg_auth_failing_ms(&a, 2000), 0);
    /* never logged in: the streak counts from the worker's start */
    kg_auth_failed(&a, 3000, "SASL authentication error: Invalid username or password");
    ck_assert_int_eq(kg_auth_failing_ms(&a, 4000), 3000);
    ck_assert(!a.denied);
    kg_auth_ok(&a);
    ck_assert_int_eq(kg_auth_failing_ms(&a, 5000), 0);
    /* once logged in, a new streak counts from its first failure */
    kg_auth_failed(&a, 10000, "again");
    ck_assert_int_eq(kg_auth_failing_ms(&a, 12000), 2000);
    /* quiet for longer than KG_AUTH_QUIET_MS: over */
    ck_assert_int_eq(kg_auth_failing_ms(&a, 10000 + KG_AUTH_QUIET_MS + 1), 0);
}
END_TEST

START_TEST(denied_counts_as_a_failure) {
    kg_auth_t a;
    kg_auth_start(&a, 1000);
    kg_auth_denied(&a, 2000, "needs the ACL Read on group g");
    ck_assert(a.denied);
    ck_assert_int_eq(kg_auth_failing_ms(&a, 7000), 6000);
    ck_assert_str_eq(a.reason, "needs the ACL Read on group g");
    /* the latest failure decides how the end is said */
    kg_auth_failed(&a, 8000, "login");
    ck_assert(!a.denied);
    ck_assert_int_eq(kg_auth_failing_ms(&a, 9000), 8000);
    kg_auth_ok(&a);
    ck_assert_int_eq(kg_auth_failing_ms(&a, 9000), 0);
}
END_TEST

START_TEST(acl_errors) {
    ck_assert(kg_acl_denied(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED));
    ck_assert(kg_acl_denied(RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED));
    ck_assert(kg_acl_denied(RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED));
    ck_assert(kg_acl_denied(RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED));
    ck_assert(!kg_acl_denied(RD_KAFKA_RESP_ERR_NO_ERROR));
    ck_assert(!kg_acl_denied(RD_KAFKA_RESP_ERR__AUTHENTICATION));
    ck_assert(!kg_acl_denied(RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED));
    ck_assert(!kg_acl_denied(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART));
}
END_TEST

START_TEST(acl_hints) {
    char buf[320];
    ck_assert_str_eq(kg_acl_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, "DescribeConfigs",
                                 "kgen.results", buf, sizeof(buf)),
                     "needs the ACL DescribeConfigs on topic kgen.results (docs/OPERATIONS.md, "
                     "ACLs)");
    ck_assert_str_eq(kg_acl_hint(RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED, "Describe",
                                 "g.cancel-reader", buf, sizeof(buf)),
                     "needs the ACL Describe on group g.cancel-reader (docs/OPERATIONS.md, ACLs)");
    ck_assert_str_eq(kg_acl_hint(RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Write",
                                 "kgen-g-", buf, sizeof(buf)),
                     "needs the ACL Write on transactional-id kgen-g- (docs/OPERATIONS.md, ACLs)");
    ck_assert_ptr_nonnull(strstr(
        kg_acl_hint(RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, "Write", "x", buf, sizeof(buf)),
        "IdempotentWrite on the cluster"));
    /* a short buffer is cut, never overrun */
    char small[16];
    kg_acl_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, "Read", "t", small, sizeof(small));
    ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_add_test(tc, streak_from_start);
    tcase_add_test(tc, denied_counts_as_a_failure);
    tcase_add_test(tc, acl_errors);
    tcase_add_test(tc, acl_hints);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
