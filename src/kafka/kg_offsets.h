/* kg_offsets: which offset of each partition may be stored, when jobs finish out of order.
 *
 * At-least-once with parallel jobs (the Confluent parallel-consumer idea): the kafka thread
 * tracks each message it takes, marks it done when the job's terminal event is acknowledged,
 * and stores per partition only the offset after the finished prefix, so a crash or a
 * revocation redelivers every job whose result was not yet durable, and nothing is skipped.
 *
 * Only tracked offsets matter. Offsets the consumer never sees (compacted away, transaction
 * markers) are never waited for: with 5 and 7 tracked and both done, the next offset to store
 * is 8. While 7 is still running it is 6: one past the last offset of the done prefix, never a
 * guess past an offset this worker has not finished.
 *
 * "partition" is a small dense index chosen by the caller (the partition number when there is
 * one jobs topic; an index into its own (topic, partition) table otherwise).
 *
 * DESIGN: each partition keeps a ring of its tracked offsets in ascending order (Kafka delivers
 * a partition in order), each with a done bit. Marking done binary-searches the ring
 * (O(log n)); finished entries are popped from the head (amortized O(1)), which advances the
 * storable offset. A partition's ring is allocated when it is assigned and doubles only when
 * it holds more entries than ever before, so the steady state allocates nothing per message.
 * Entries held (tracked and not yet popped: running, or done behind a running one) are
 * capped worker-wide at n_max_inflight; at the cap, track answers KG_QUEUE_FULL and the caller
 * pauses its partitions. Not thread-safe: the kafka thread owns it. */
#pragma once

#include "core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_offsets kg_offsets_t;

/** The largest partition index + 1 accepted (a guard against garbage, not a real limit). */
#define KG_OFFSETS_MAX_PARTITIONS 65536

/** A tracker holding at most `n_max_inflight` entries over all partitions (> 0).
 * NULL on OOM or a zero cap. @thread kafka */
kg_offsets_t *kg_offsets_new(size_t n_max_inflight);

/** Free the tracker; NULL does nothing. @thread kafka */
void kg_offsets_free(kg_offsets_t *o);

/** Prepare a newly assigned partition: allocate its ring, so tracking it seldom allocates.
 * Idempotent; track also assigns implicitly. KG_ERR_INVALID for a partition outside
 * [0, KG_OFFSETS_MAX_PARTITIONS), KG_ERR_NOMEM on OOM. @thread kafka */
KG_NODISCARD kg_status_t kg_offsets_assign(kg_offsets_t *o, int32_t partition);

/** Record that the message at `offset` was taken and its job is in flight.
 * Offsets of a partition must be tracked in increasing order (as Kafka delivers them); after a
 * seek back, call kg_offsets_revoke first.
 * Returns KG_OK; KG_QUEUE_FULL when n_max_inflight entries are held (pause and retry after
 * completions; nothing was recorded); KG_ERR_INVALID for a bad partition, a negative offset
 * or one not above the last tracked one; KG_ERR_NOMEM when the ring cannot grow.
 * @thread kafka */
KG_NODISCARD kg_status_t kg_offsets_track(kg_offsets_t *o, int32_t partition, int64_t offset);

/** Mark a tracked offset done (its terminal event is durable).
 * Returns true when it was in flight and is now done; false when it is not in flight here
 * (never tracked, already done, or forgotten by a revoke: a late completion of a revoked job is
 * ignored this way). @thread kafka */
bool kg_offsets_done(kg_offsets_t *o, int32_t partition, int64_t offset);

/** The offset to store for a partition, if it advanced since the last call: one past the
 * highest offset such that it and every tracked offset before it are done.
 * Returns true and sets *next_offset once per advance; false when there is nothing new.
 * @thread kafka */
bool kg_offsets_committable(kg_offsets_t *o, int32_t partition, int64_t *next_offset);

/** Take the next partition whose storable offset advanced (in the order they advanced) with
 * that offset, as kg_offsets_committable would report it; false when there is none. Loop on it
 * after a batch of completions to store every advanced partition once. @thread kafka */
bool kg_offsets_next_committable(kg_offsets_t *o, int32_t *partition, int64_t *next_offset);

/** Forget a partition's tracked offsets (it was revoked, or the consumer seeks back): its
 * jobs will be redelivered, and their late completions are ignored. Its ring is kept for a
 * later assignment. Unknown partitions are ignored. @thread kafka */
void kg_offsets_revoke(kg_offsets_t *o, int32_t partition);

/** Entries held over all partitions: tracked and not yet passed by the storable offset. */
size_t kg_offsets_n_held(const kg_offsets_t *o);

/** Tracked offsets of a partition not yet done (0 for an unknown partition). */
size_t kg_offsets_n_pending(const kg_offsets_t *o, int32_t partition);

/** A previous owner's answered offsets of a newly assigned partition above its `committed`
 * offset (kg_answered.h), ascending: messages at these offsets were answered and are not run
 * again (kg_offsets_is_answered). Replaces the partition's list; a revoke forgets it.
 * KG_ERR_INVALID for a partition not assigned, KG_ERR_NOMEM on OOM. @thread kafka */
KG_NODISCARD kg_status_t kg_offsets_set_answered(
    kg_offsets_t *o, int32_t partition, int64_t committed, const int64_t *offsets, size_t n);

/** Whether `offset` of `partition` was answered by a previous owner. @thread kafka */
bool kg_offsets_is_answered(const kg_offsets_t *o, int32_t partition, int64_t offset);

/** What a worker giving `partition` up commits: *position, the offset to commit (its first
 * unfinished tracked offset, or one past the done prefix, or with nothing taken since the
 * assignment the committed offset given to kg_offsets_set_answered; -1 when there is none: then
 * 0 is returned), and up to `max` offsets above it already answered (done
 * here, or named by the previous owner and not reached yet), ascending; returns their count.
 * @thread kafka */
size_t kg_offsets_answered_above(
    const kg_offsets_t *o, int32_t partition, int64_t *position, int64_t *out, size_t max);
