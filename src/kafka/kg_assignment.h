/* kg_assignment: the consumer group protocol a worker runs, and the set of partitions it holds.
 *
 * Three ways to be in a group (docs/DELIVERY.md, Rebalances):
 *   consumer   KIP-848 (Kafka 4): the broker assigns, sticky and incremental; a worker's
 *              rebalance callback gets only the partitions added or taken away;
 *   classic    cooperative-sticky: the same incremental callbacks, computed by a member;
 *   classic    eager (range, roundrobin): every partition is revoked at every rebalance and
 *              the whole new set assigned.
 * librdkafka says which of the two callback kinds a consumer gets (rd_kafka_rebalance_protocol:
 * "COOPERATIVE" for the first two), and refuses the other call ("Changes to the current
 * assignment must be made using incremental_assign()"). The worker keeps its own copy of what
 * it holds (for pause/resume, lag and handoffs) and updates it the same way for all three: the
 * set plus the added, or less the revoked (an eager revoke lists them all). */
#pragma once

#include <librdkafka/rdkafka.h>
#include <stdbool.h>

typedef enum kg_group_protocol {
    KG_GROUP_CLASSIC,
    KG_GROUP_CONSUMER,
} kg_group_protocol_t;

/** The protocol to start with: an explicit -X group.protocol (`x_protocol`, NULL when not
 * given) wins, then --group-protocol (`option`: "classic", "consumer" or "auto"). Auto starts
 * with consumer, unless `classic_settings`: the worker was given settings only the classic
 * protocol takes (a non-default --assignment-strategy, -X session.timeout.ms,
 * heartbeat.interval.ms, partition.assignment.strategy or group.protocol.type, which librdkafka
 * refuses with the consumer protocol), so a configuration written for the classic protocol
 * keeps working as it did. `*may_fall_back` is set when a refusal by the broker may still
 * switch to classic (auto starting with consumer). */
kg_group_protocol_t kg_assignment_protocol(const char *option,
                                           const char *x_protocol,
                                           bool classic_settings,
                                           bool *may_fall_back);

/** Whether librdkafka's fatal error `err` on a consumer of the consumer protocol means the
 * broker does not offer KIP-848 (its ConsumerGroupHeartbeat answered UNSUPPORTED_VERSION, or
 * the broker has no such request). */
bool kg_assignment_refused(rd_kafka_resp_err_t err);

/** `*held` plus the partitions of `parts` it lacks (a new list; `*held` may be NULL). */
void kg_assignment_add(rd_kafka_topic_partition_list_t **held,
                       const rd_kafka_topic_partition_list_t *parts);

/** `*held` less the partitions of `parts`; NULL once it is empty. */
void kg_assignment_remove(rd_kafka_topic_partition_list_t **held,
                          const rd_kafka_topic_partition_list_t *parts);

/** Whether `parts` has `topic` / `partition`. */
bool kg_assignment_has(const rd_kafka_topic_partition_list_t *parts,
                       const char *topic,
                       int32_t partition);
