/* kg_acl: authorization errors said as the ACL the worker lacks (kg_acl.h says why). */
#include "kg_acl.h"

#include <stdio.h>

bool kg_acl_denied(rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
           err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED ||
           err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED ||
           err == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
}

const char *kg_acl_hint(
    rd_kafka_resp_err_t err, const char *operation, const char *name, char *buf, size_t size) {
    if (err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED) {
        /* an idempotent producer asks the cluster for its id: Kafka grants it with Write on
         * any topic (IdempotentWrite on the cluster before 2.8) */
        snprintf(buf, size,
                 "needs the ACL Write on a topic, or IdempotentWrite on the cluster "
                 "(docs/OPERATIONS.md, ACLs)");
        return buf;
    }
    const char *kind = err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED ? "group"
                       : err == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                           ? "transactional-id"
                           : "topic";
    snprintf(buf, size, "needs the ACL %s on %s %s (docs/OPERATIONS.md, ACLs)",
             operation ? operation : "Read", kind, name ? name : "");
    return buf;
}
