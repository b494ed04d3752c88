/* check_assignment: the group protocol a worker starts with (--group-protocol, an explicit
 * -X group.protocol winning, auto falling back only on the broker's refusal) and the set of
 * partitions it holds through the rebalance callbacks of each protocol: incremental adds and
 * revokes keep the partitions that do not move; an eager revoke lists them all. */
#include "check_common.h"
#include "kafka/kg_assignment.h"

#include <string.h>

static rd_kafka_topic_partition_list_t *list_of(const char *topic, const int32_t *p, int n) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n > 0 ? n : 1);
    for (int i = 0; i < n; i++) {
        rd_kafka_topic_partition_list_add(l, topic, p[i]);
    }
    return l;
}

/* `held` is exactly `topic`'s partitions `p` (any order). */
static void expect_held(const rd_kafka_topic_partition_list_t *held,
                        const char *topic,
                        const int32_t *p,
                        int n) {
    if (n == 0) {
        ck_assert(held == NULL || held->cnt == 0);
        return;
    }
    ck_assert_ptr_nonnull(held);
    ck_assert_int_eq(held->cnt, n);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(kg_assignment_has(held, topic, p[i]), "partition %d missing", p[i]);
    }
}

START_TEST(protocol_choice) {
    bool fall_back = true;
    ck_assert_int_eq(kg_assignment_protocol("auto", NULL, false, &fall_back), KG_GROUP_CONSUMER);
    ck_assert(fall_back);
    /* settings only the classic protocol takes: auto keeps a classic configuration classic */
    ck_assert_int_eq(kg_assignment_protocol("auto", NULL, true, &fall_back), KG_GROUP_CLASSIC);
    ck_assert(!fall_back);
    /* asked for explicitly: librdkafka refuses the classic settings, with its message */
    ck_assert_int_eq(kg_assignment_protocol("consumer", NULL, true, &fall_back), KG_GROUP_CONSUMER);
    ck_assert_int_eq(kg_assignment_protocol("consumer", NULL, false, &fall_back),
                     KG_GROUP_CONSUMER);
    ck_assert(!fall_back); /* asked for: a refusal is an error, not a switch */
    ck_assert_int_eq(kg_assignment_protocol("classic", NULL, false, &fall_back), KG_GROUP_CLASSIC);
    ck_assert(!fall_back);
    /* -X group.protocol wins over the option, and never falls back */
    ck_assert_int_eq(kg_assignment_protocol("auto", "classic", false, &fall_back),
                     KG_GROUP_CLASSIC);
    ck_assert(!fall_back);
    ck_assert_int_eq(kg_assignment_protocol("classic", "consumer", true, &fall_back),
                     KG_GROUP_CONSUMER);
    ck_assert(!fall_back);
    ck_assert(kg_assignment_refused(RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION));
    ck_assert(kg_assignment_refused(RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE));
    /* other fatal errors stay fatal */
    ck_assert(!kg_assignment_refused(RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED));
    ck_assert(!kg_assignment_refused(RD_KAFKA_RESP_ERR_UNRELEASED_INSTANCE_ID));
    ck_assert(!kg_assignment_refused(RD_KAFKA_RESP_ERR_NO_ERROR));
}
END_TEST

/* KIP-848 / cooperative-sticky: a worker holding 0-3 gives up 1 when a third joins, gets 5
 * when the topic grows; the others stay throughout. */
START_TEST(incremental) {
    rd_kafka_topic_partition_list_t *held = NULL;
    rd_kafka_topic_partition_list_t *a = list_of("jobs", (int32_t[]){0, 1}, 2);
    rd_kafka_topic_partition_list_t *b = list_of("jobs", (int32_t[]){2, 3}, 2);
    kg_assignment_add(&held, a);
    kg_assignment_add(&held, b);
    expect_held(held, "jobs", (int32_t[]){0, 1, 2, 3}, 4);
    kg_assignment_add(&held, a); /* assigned twice (a repeated callback): no duplicates */
    expect_held(held, "jobs", (int32_t[]){0, 1, 2, 3}, 4);
    rd_kafka_topic_partition_list_t *one = list_of("jobs", (int32_t[]){1}, 1);
    kg_assignment_remove(&held, one);
    expect_held(held, "jobs", (int32_t[]){0, 2, 3}, 3);
    ck_assert(!kg_assignment_has(held, "jobs", 1));
    ck_assert(!kg_assignment_has(held, "other", 0)); /* topics count, not just numbers */
    rd_kafka_topic_partition_list_t *five = list_of("jobs", (int32_t[]){5}, 1);
    kg_assignment_add(&held, five);
    expect_held(held, "jobs", (int32_t[]){0, 2, 3, 5}, 4);
    kg_assignment_remove(&held, one); /* revoking what is not held changes nothing */
    expect_held(held, "jobs", (int32_t[]){0, 2, 3, 5}, 4);
    rd_kafka_topic_partition_list_t *empty = list_of("jobs", NULL, 0);
    kg_assignment_add(&held, empty); /* a member's empty incremental assignment */
    expect_held(held, "jobs", (int32_t[]){0, 2, 3, 5}, 4);
    rd_kafka_topic_partition_list_destroy(held);
    rd_kafka_topic_partition_list_destroy(a);
    rd_kafka_topic_partition_list_destroy(b);
    rd_kafka_topic_partition_list_destroy(one);
    rd_kafka_topic_partition_list_destroy(five);
    rd_kafka_topic_partition_list_destroy(empty);
}
END_TEST

/* Eager: the revoke lists every held partition, the next assign the whole new set; two lanes'
 * topics with the same partition numbers stay apart. */
START_TEST(eager) {
    rd_kafka_topic_partition_list_t *held = NULL;
    rd_kafka_topic_partition_list_t *all = list_of("jobs", (int32_t[]){0, 1, 2, 3}, 4);
    rd_kafka_topic_partition_list_add(all, "bulk", 0);
    kg_assignment_add(&held, all);
    ck_assert_int_eq(held->cnt, 5);
    ck_assert(kg_assignment_has(held, "bulk", 0));
    kg_assignment_remove(&held, all);
    ck_assert_ptr_null(held); /* nothing held: NULL, as before any assignment */
    kg_assignment_remove(&held, all);
    ck_assert_ptr_null(held);
    rd_kafka_topic_partition_list_t *some = list_of("jobs", (int32_t[]){0, 3}, 2);
    kg_assignment_add(&held, some);
    expect_held(held, "jobs", (int32_t[]){0, 3}, 2);
    rd_kafka_topic_partition_list_t *bulk = list_of("bulk", (int32_t[]){0}, 1);
    kg_assignment_remove(&held, bulk); /* bulk 0 is not jobs 0 */
    expect_held(held, "jobs", (int32_t[]){0, 3}, 2);
    rd_kafka_topic_partition_list_destroy(held);
    rd_kafka_topic_partition_list_destroy(all);
    rd_kafka_topic_partition_list_destroy(some);
    rd_kafka_topic_partition_list_destroy(bulk);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("assignment");
    TCase *tc = tcase_create("assignment");
    tcase_add_test(tc, protocol_choice);
    tcase_add_test(tc, incremental);
    tcase_add_test(tc, eager);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
