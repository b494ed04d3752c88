/* kg_cancel: cancellation. Cancel messages (schema/kg_cancelmsg) on the cancel topic name
 * jobs by request_id; every worker reads every partition of that topic, so a cancel reaches
 * whichever worker holds the job, and remembers each cancel for a while, so a job that
 * arrives later (not yet consumed, redelivered, or moved here by a rebalance) is cancelled
 * when it arrives.
 *
 * DESIGN
 * Reader. Its own consumer, assign() only (no group membership, no commits): at startup and
 * for partitions added later it starts at the first cancel younger than the memo's TTL
 * (offsetsForTimes), which for a quiet topic is its end; so a worker that starts, or takes
 * over a partition, after a cancel was sent still learns of it. The topic is looked up again
 * every 30 s (partitions added, a topic created after the worker started). Without the topic
 * the worker runs without cancellation, with one warning.
 * Memo. The request_ids of the cancels read in the last ttl_ms, at most `capacity` of them
 * (the oldest is forgotten first): a hash table with chaining over a ring of entries, so a
 * cancel costs O(1) and the memory is fixed (about 160 bytes an entry) at startup.
 * What the worker does with a cancel is in kg_worker_jobs.c (apply_cancel): a job still waiting
 * in the worker ends at once, one in the engine is cancelled there and ends within one engine
 * step; either way with an error event, code cancelled, carrying the text so far.
 * @thread kafka (every function) */
#pragma once

#include "../config/kg_config.h"
#include "../core/kg_status.h"
#include "../schema/kg_job.h"
#include "kg_lanes.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- the memo of recent cancels ----

typedef struct kg_cancel_memo kg_cancel_memo_t;

/** A memo of at most `capacity` (> 0) request_ids, each kept for ttl_ms. NULL on OOM. */
kg_cancel_memo_t *kg_cancel_memo_new(int32_t capacity, int64_t ttl_ms);
void kg_cancel_memo_free(kg_cancel_memo_t *m);

/** Remember a cancel of `rid` read at now_ms (again: its time is renewed). When full, the
 * oldest entry is forgotten. */
void kg_cancel_memo_add(kg_cancel_memo_t *m, const char *rid, int64_t now_ms);

/** Whether `rid` was cancelled within the TTL before now_ms. */
bool kg_cancel_memo_has(const kg_cancel_memo_t *m, const char *rid, int64_t now_ms);

/** Entries held (expired ones included until they are overwritten). */
int32_t kg_cancel_memo_size(const kg_cancel_memo_t *m);

// ---- the reader ----

typedef struct kg_cancel kg_cancel_t;

#define KG_CANCEL_TOPICS_MAX 8 /* one per jobs topic (lane) at most */
#define KG_CANCEL_NAME_MAX   512

/** The cancel topics of a worker reading `lanes`: --cancel-topic for every lane, or each
 * lane's "<topic>.cancel", so a producer that knows only the topic it sends to
 * (kgen-submit --jobs-topic T --cancel) reaches the worker; none with --cancel-topic none.
 * Fills names[0 .. n-1]; returns n. */
int kg_cancel_topic_names(const kg_config_t *cfg,
                          const kg_lanes_t *lanes,
                          char names[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX]);

/** The reader of `topics` (n_topics of them, 1 .. KG_CANCEL_TOPICS_MAX: a worker with lanes
 * reads each lane's `<topic>.cancel`, so a producer that knows only its own jobs topic reaches
 * it) with a memo of `capacity` cancels for ttl_ms (capacity 0: cancels reach only jobs that
 * are here when they arrive). Makes its own consumer. NULL with errstr set on a bad librdkafka
 * property, a count out of range or out of memory; a missing topic is not an error. */
kg_cancel_t *kg_cancel_new(const kg_config_t *cfg,
                           const char *const *topics,
                           int n_topics,
                           const char *worker_id,
                           int32_t capacity,
                           int64_t ttl_ms,
                           char *errstr,
                           size_t errstr_size);
void kg_cancel_free(kg_cancel_t *c);

/** Take the cancels that arrived (up to `max`, no waiting): each is remembered, and its
 * request_id copied into rids[i] (KG_JOB_REQUEST_ID_MAX + 1 bytes each). Returns how many. */
int kg_cancel_poll(kg_cancel_t *c, char (*rids)[KG_JOB_REQUEST_ID_MAX + 1], int max);

/** Whether a job with this request_id is to be cancelled on arrival (remembered). */
bool kg_cancel_is_cancelled(const kg_cancel_t *c, const char *rid);

/** Cancels read since startup. */
int64_t kg_cancel_n_read(const kg_cancel_t *c);

/** The cancel partitions read (over every topic): those the look-ups found so far. */
int32_t kg_cancel_n_partitions(const kg_cancel_t *c);

/** Look the topics up again at the next poll instead of up to 30 s later (tests). */
void kg_cancel_look_up_soon(kg_cancel_t *c);

/** Whether a periodic look-up has been started and its answer not yet taken by a poll (tests:
 * a poll that returns while this holds did not wait for the look-up). @thread the loop's */
bool kg_cancel_lookup_pending(const kg_cancel_t *c);

// ---- the sending side (kgen-submit --cancel) ----

/** Produce a cancel of `request_id` to `topic` on `producer` (key and value name the job;
 * the caller flushes). RD_KAFKA_RESP_ERR__QUEUE_FULL is waited out. Returns librdkafka's
 * error, or RD_KAFKA_RESP_ERR__INVALID_ARG for a request_id the contract does not allow.
 * @thread any */
rd_kafka_resp_err_t kg_cancel_send(rd_kafka_t *producer, const char *topic, const char *request_id);
