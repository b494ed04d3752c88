/* kg_txn: exactly-once results (--exactly-once). A job's terminal event (done or error), its
 * DLQ copies and its consumed offset are written in one Kafka transaction, so a reader with
 * isolation.level=read_committed sees exactly one terminal event per job, even when a worker
 * dies mid-run, partitions move or a broker restarts: a transaction that did not commit is
 * invisible and its jobs run again; one that did also moved the group's offsets past them.
 *
 * DESIGN
 * Producers. A transactional producer (transactional.id "kgen-<group>-<worker id>") writes the
 * transactions; token events go through the worker's other, idempotent producer, outside them
 * (they stay at least once and carry the attempt, as without --exactly-once).
 * Batching. Answers are kept in memory (copied) as they are made and written when a
 * transaction is committed: every txn_interval_ms, at KG_TXN_MAX_ENTRIES answers, on a revoke
 * and at shutdown. An answer goes only into a transaction that also takes its job off the
 * group's hands (were it committed alone, a revoke would hand the job, not yet consumed as far
 * as the group knows, to a new owner that answers it again): jobs finish out of order, and the
 * offset of a partition moves only over its finished prefix, so the answer of a job that
 * finished before an earlier one of its partition is named in the offset commit's metadata
 * (kg_answered.h: the jobs answered above the committed offset), which the transaction commits
 * with it and the next owner reads and skips (issue 29: the answer of a short job behind a long
 * one is visible at the next transaction, not when the long one ends). Only what the metadata
 * has room for (KG_ANSWERED_MAX_BYTES) goes early; the rest waits for the prefix. A commit flushes
 * the token producer first, so in every results partition a job's token events precede its terminal
 * event; then begin, produce the answers, send_offsets_to_transaction (the storable offsets,
 * kg_offsets, with the consumer's group metadata, so a zombie of an older group generation is
 * fenced), commit. It blocks the kafka thread for a few round trips (the engine thread goes on
 * stepping). Failures. A retriable error (a timeout, a broker restarting) leaves everything
 * buffered and the next turn tries again. An abortable one aborts the transaction, and the answers
 * stay buffered for the next attempt, except those the broker refused for their own sake (size:
 * kg_txn_refused_fn replaces them, as the at-least-once path does, with a small internal error
 * and a DLQ copy). Answers of partitions that were revoked meanwhile are dropped
 * (kg_txn_drop): their jobs run again on the new owner, and nothing of ours was visible. A
 * fatal error (fenced by a newer producer with our transactional.id) stops the worker.
 * Offsets. Never auto-committed: the consumer runs with enable.auto.commit=false and only a
 * transaction moves them.
 * @thread kafka (every function) */
#pragma once

#include "../config/kg_config.h"
#include "../core/kg_status.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Answers in one transaction at most; more commit at once. */
#define KG_TXN_MAX_ENTRIES 1000

typedef struct kg_txn kg_txn_t;

/* Called once an answer is committed (visible): `opaque` is what kg_txn_add was given (the
 * callee owns it from then on). */
typedef void (*kg_txn_committed_fn)(void *ctx, void *opaque, const void *key, size_t key_len);

/* Called when the broker refused an answer for its own sake (is a message fault): the callee
 * answers the job otherwise (kg_txn_add again) and owns `opaque` from then on. */
typedef void (*kg_txn_refused_fn)(void *ctx,
                                  const char *topic,
                                  const void *key,
                                  size_t key_len,
                                  const void *value,
                                  size_t len,
                                  const rd_kafka_headers_t *hdrs,
                                  void *opaque,
                                  rd_kafka_resp_err_t err);

/* Dropping an answer whose partition was revoked: the callee frees `opaque`. */
typedef void (*kg_txn_dropped_fn)(void *ctx, void *opaque);

typedef struct kg_txn_callbacks {
    void *ctx;
    kg_txn_committed_fn committed;
    kg_txn_refused_fn refused;
    kg_txn_dropped_fn dropped;
    bool (*is_message_fault)(rd_kafka_resp_err_t err);
} kg_txn_callbacks_t;

/** The transactional producer for `worker_id`, with `conf` (taken over whatever the result),
 * initialised (init_transactions: fences an older instance with the same id and aborts its
 * open transaction; retried for up to 60 s while the coordinator is not reachable). NULL with
 * errstr set. */
kg_txn_t *kg_txn_new(const kg_config_t *cfg,
                     rd_kafka_conf_t *conf,
                     const char *worker_id,
                     const kg_txn_callbacks_t *cb,
                     char *errstr,
                     size_t errstr_size);
void kg_txn_free(kg_txn_t *t);

/** The producer (for its configuration and for tests). */
rd_kafka_t *kg_txn_producer(kg_txn_t *t);

/** Keep an answer for a transaction: copied; `hdrs` (may be NULL) copied; `opaque`
 * travels to a callback. `partition` and `offset` are the job's on `jobs_topic` (-1: an
 * answer tied to no job): the answer commits in the first transaction whose offsets pass the
 * job (kg_txn_set_offset), never before, so a job whose answer is visible is never consumed
 * again. KG_ERR_NOMEM. */
KG_NODISCARD kg_status_t kg_txn_add(kg_txn_t *t,
                                    const char *topic,
                                    const void *key,
                                    size_t key_len,
                                    const void *value,
                                    size_t len,
                                    const rd_kafka_headers_t *hdrs,
                                    const char *jobs_topic,
                                    int32_t partition,
                                    int64_t offset,
                                    void *opaque);

/** The next offset to commit for a jobs partition (one past its finished prefix); `topic` is
 * borrowed for the worker's lifetime. It never moves back. */
void kg_txn_set_offset(kg_txn_t *t, const char *topic, int32_t partition, int64_t next);

/** A job of a partition consumed: the partition's offset starts there when nothing set it
 * before (kg_txn_seed_answered, kg_txn_set_offset), so answers above it can commit early. */
void kg_txn_track(kg_txn_t *t, const char *topic, int32_t partition, int64_t offset);

/** On assignment: the partition's committed offset and the jobs a previous owner answered above
 * it (read from the commit's metadata, ascending, all above `committed`), which every later
 * commit of the partition names again until its offset passes them. KG_ERR_NOMEM. */
kg_status_t kg_txn_seed_answered(kg_txn_t *t,
                                 const char *topic,
                                 int32_t partition,
                                 int64_t committed,
                                 const int64_t *offsets,
                                 size_t n);

/** The jobs of a partition that its last committed transaction named answered above its offset
 * (kg_answered.h), with that offset in *committed (-1: none committed yet); at most `max`. */
size_t kg_txn_answered_above(const kg_txn_t *t,
                             const char *topic,
                             int32_t partition,
                             int64_t *committed,
                             int64_t *out,
                             size_t max);

/** Answers buffered and not committed. */
size_t kg_txn_n_pending(const kg_txn_t *t);

/** Commit when due (txn_interval_ms since the last commit, or KG_TXN_MAX_ENTRIES answers), or
 * now with `force`. `tokens` (the token producer) is flushed first; `consumer` gives the group
 * metadata. KG_OK (committed, or nothing to do), KG_AGAIN (not committed; everything kept for
 * the next try), KG_ERR_KAFKA (fatal: stop). */
KG_NODISCARD kg_status_t
kg_txn_commit(kg_txn_t *t, rd_kafka_t *tokens, rd_kafka_t *consumer, int64_t now_us, bool force);

/** Forget the answers and offsets of these partitions of `jobs_topic` (revoked; NULL: all):
 * their jobs run again elsewhere. */
void kg_txn_drop(kg_txn_t *t, const char *jobs_topic, const rd_kafka_topic_partition_list_t *parts);

/** Transactions committed and aborted so far. */
int64_t kg_txn_n_committed(const kg_txn_t *t);
int64_t kg_txn_n_aborted(const kg_txn_t *t);
