/* kg_assignment: the group protocol and the held partitions (kg_assignment.h says why). */
#include "kg_assignment.h"

#include <string.h>

kg_group_protocol_t kg_assignment_protocol(const char *option,
                                           const char *x_protocol,
                                           bool classic_settings,
                                           bool *may_fall_back) {
    *may_fall_back = false;
    if (x_protocol) {
        return strcmp(x_protocol, "consumer") == 0 ? KG_GROUP_CONSUMER : KG_GROUP_CLASSIC;
    }
    if (strcmp(option, "classic") == 0 || (strcmp(option, "auto") == 0 && classic_settings)) {
        return KG_GROUP_CLASSIC;
    }
    *may_fall_back = strcmp(option, "auto") == 0;
    return KG_GROUP_CONSUMER;
}

bool kg_assignment_refused(rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION ||
           err == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE;
}

bool kg_assignment_has(const rd_kafka_topic_partition_list_t *parts,
                       const char *topic,
                       int32_t partition) {
    for (int i = 0; parts && i < parts->cnt; i++) {
        if (parts->elems[i].partition == partition && strcmp(parts->elems[i].topic, topic) == 0) {
            return true;
        }
    }
    return false;
}

void kg_assignment_add(rd_kafka_topic_partition_list_t **held,
                       const rd_kafka_topic_partition_list_t *parts) {
    int n = (*held ? (*held)->cnt : 0) + (parts ? parts->cnt : 0);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n > 0 ? n : 1);
    for (int i = 0; *held && i < (*held)->cnt; i++) {
        rd_kafka_topic_partition_list_add(l, (*held)->elems[i].topic, (*held)->elems[i].partition);
    }
    for (int i = 0; parts && i < parts->cnt; i++) {
        if (!kg_assignment_has(l, parts->elems[i].topic, parts->elems[i].partition)) {
            rd_kafka_topic_partition_list_add(l, parts->elems[i].topic, parts->elems[i].partition);
        }
    }
    if (*held) {
        rd_kafka_topic_partition_list_destroy(*held);
    }
    *held = l;
}

void kg_assignment_remove(rd_kafka_topic_partition_list_t **held,
                          const rd_kafka_topic_partition_list_t *parts) {
    if (!*held) {
        return;
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((*held)->cnt);
    for (int i = 0; i < (*held)->cnt; i++) {
        if (!kg_assignment_has(parts, (*held)->elems[i].topic, (*held)->elems[i].partition)) {
            rd_kafka_topic_partition_list_add(l, (*held)->elems[i].topic,
                                              (*held)->elems[i].partition);
        }
    }
    rd_kafka_topic_partition_list_destroy(*held);
    *held = l->cnt > 0 ? l : NULL;
    if (l->cnt == 0) {
        rd_kafka_topic_partition_list_destroy(l);
    }
}
