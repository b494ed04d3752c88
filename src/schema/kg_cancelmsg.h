/* kg_cancelmsg: the messages of the cancel topic (schemas/cancel.schema.json).
 *
 * A cancel names one job by its request_id, in the value and as the key:
 *   {"request_id": "req-42", "schema_version": 1}
 * The value's request_id is what counts; a message with an empty value is read by its key
 * alone (so `kcat -P -K:` with a bare key cancels too). Unknown fields are ignored. */
#pragma once

#include "../core/kg_status.h"
#include "kg_job.h"

#include <stddef.h>

/** Read a cancel message into `rid` (KG_JOB_REQUEST_ID_MAX + 1 bytes). KG_ERR_INVALID with
 * `why` set when it names no valid request_id; KG_ERR_NOMEM. @thread any */
KG_NODISCARD kg_status_t kg_cancelmsg_decode(const void *key,
                                             size_t key_len,
                                             const void *value,
                                             size_t len,
                                             char *rid,
                                             char *why,
                                             size_t why_size);

/** The value of a cancel for `request_id`: malloc'ed JSON of *len bytes, NULL on out of
 * memory. */
char *kg_cancelmsg_encode(const char *request_id, size_t *len);
