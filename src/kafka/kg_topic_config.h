/* kg_topic_config: what the broker says about our topics, read once at
 * startup with the admin API (DescribeConfigs): the largest message a
 * topic takes (max.message.bytes), so the worker can size its events to
 * fit before it produces them. */
#pragma once

#include "../config/kg_config.h"

#include <stddef.h>
#include <stdint.h>

/** max.message.bytes of each of the n `topics` (the topic's own setting, or
 * the broker default it inherits), read through a short-lived client made
 * from `cfg` (bootstrap servers and -X properties). out[i] is -1 where it
 * could not be read: the topic is missing, DescribeConfigs is not allowed
 * or not supported (librdkafka's mock cluster), or the broker did not
 * answer within timeout_ms; errstr then says why (the first failure).
 * Returns how many were read. @thread kafka (startup) */
int kg_topic_max_message_bytes(const kg_config_t *cfg,
                               const char *const *topics,
                               int n,
                               int timeout_ms,
                               int64_t *out,
                               char *errstr,
                               size_t errstr_size);
