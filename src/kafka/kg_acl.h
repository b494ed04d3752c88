/* kg_acl: an authorization error of the broker, said as the ACL the worker lacks.
 *
 * A cluster with an authorizer (every managed one) answers a worker that lacks an ACL with
 * TOPIC_, GROUP_, CLUSTER_ or TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which librdkafka reports
 * where the request happened: a DescribeConfigs result, a topic look-up, a consumer's poll. The
 * worker names the operation and resource the ACL must grant, and the feature that is off
 * meanwhile, so an operator can fix it from the log line alone (docs/OPERATIONS.md lists every
 * ACL per feature). No librdkafka call here: the callers pass its error codes. */
#pragma once

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>

/** True for the four authorization errors (not authentication: that is a login, kg_auth.h). */
bool kg_acl_denied(rd_kafka_resp_err_t err);

/** Writes "needs the ACL <operation> on <kind> <name> (docs/OPERATIONS.md, ACLs)" into buf,
 * the kind read from err (a topic, a group, a transactional id, the cluster). Returns buf. */
const char *kg_acl_hint(
    rd_kafka_resp_err_t err, const char *operation, const char *name, char *buf, size_t size);
