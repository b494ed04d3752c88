/* kg_routing: the message key that sends jobs sharing a prompt prefix to one worker.
 *
 * Kafka puts a keyed message on partition hash(key) % partitions, and one worker holds a
 * partition, so jobs with equal keys run on one worker, whose prefix cache then serves their
 * common prefix (a system prompt, a few-shot block) once instead of once per worker. The key
 * decides the partition only: events stay keyed by request_id.
 *
 * The rule (kgen-submit --key prefix[:N]; any producer can follow it):
 *   messages       the content of the first message when its role is "system" (the whole
 *                  system prompt); otherwise the first N characters of the messages written
 *                  as "role\ncontent\n" one after the other;
 *   prompt         its first N characters (Unicode code points of the UTF-8 text);
 *   prompt_tokens  its first N token ids.
 * The key is "pfx-" and 16 lower-case hex digits of the 64-bit FNV-1a hash of those bytes (for
 * token ids: each as 4 little-endian bytes). N should not exceed the length of the shared
 * prefix: two jobs whose first N characters differ get different keys. */
#pragma once

#include "kg_job.h"

#include <stddef.h>
#include <stdint.h>

/** Default N of --key prefix: enough to tell typical system prompts and few-shot blocks apart. */
#define KG_ROUTING_PREFIX_CHARS 256

/** Bytes of a key, NUL included. */
#define KG_ROUTING_KEY_SIZE 21

/** Write the prefix key of `job` for the first `n_chars` (> 0) characters into `out`
 * (KG_ROUTING_KEY_SIZE bytes). @thread any */
void kg_routing_prefix_key(const kg_job_t *job, int32_t n_chars, char out[KG_ROUTING_KEY_SIZE]);
