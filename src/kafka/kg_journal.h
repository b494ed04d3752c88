/* kg_journal: the poison-job journal. A job that keeps killing workers
 * (a bug, a device fault, an OOM kill) must get an answer instead of
 * stopping every worker that takes it in turn.
 *
 * DESIGN
 * Rule: a job present in `poison_after` (default 2) consecutive worker
 * failures is not run again; it is answered with an `internal` error event
 * ("poisoned after 2 attempts") and a copy on the DLQ.
 *
 * Record. What a worker is running must outlive the worker and reach the
 * next owner of the partition, which may be another host, so it lives in
 * Kafka: the in-flight topic (default <jobs topic>.inflight, compacted),
 * partition p holding the snapshots of jobs partition p (schema/kg_inflight:
 * the offsets the owner has taken, each with its strikes and whether it
 * runs). Only the owner of jobs partition p writes to in-flight partition p,
 * so its last record is the owner's last word, and the next owner reads
 * just the tail of one partition on assignment (RD_KAFKA_OFFSET_TAIL), not
 * a whole topic. A zombie (an owner that lost the partition without
 * knowing, e.g. SIGSTOPped) may still write after the new owner: every
 * owner writes a larger epoch (max(last epoch + 1, now in ms)) and a reader
 * takes the record with the largest (epoch, seq) among the last few.
 *
 * Failure. An owner that lets a partition go on purpose (a revoke, SIGTERM,
 * a Kafka-side fatal error) writes a final snapshot marked clean and waits
 * for it: its running jobs were in no failure. An owner that dies (crash,
 * SIGKILL, OOM kill, abort, a device fault that stops it) leaves a snapshot
 * that is not clean: every job marked running in it was present in that
 * failure and gets one strike more (kg_inflight_inherit). A revoked
 * partition therefore never counts, and neither does a drain. An owner
 * evicted from the group while alive (its session timed out while the broker
 * restarted) looks dead at first: it revokes, writing its clean snapshot,
 * only at its next heartbeat. So a new owner that finds a snapshot that is
 * not clean, with jobs running, waits a heartbeat interval + 2 s for a clean
 * one before it counts the failure (5 s with librdkafka's defaults; only
 * after a crash or an eviction, never on a plain hand-over).
 *
 * Ordering. A job may start only once a snapshot that marks it running is
 * acknowledged (acks=all): a job that crashes the worker at once (a crash in
 * the tokenizer, the test hook) is then always on record. The worker holds
 * the message until then (kg_journal_start returns a ticket; the worker asks
 * kg_journal_durable). Finished jobs leave the record lazily (within
 * LAZY_MS): a job that finished but was still on record when the worker
 * died gets a strike it did not earn, which at worst makes it a suspect.
 *
 * Consecutive, and the bystanders. When a worker dies, every job it was
 * running gets a strike, not only the culprit. Were those suspects run
 * together again, the culprit's second crash would give all of them their
 * second strike. So a worker runs at most one suspect (a job with a strike)
 * at a time, alongside jobs with none: a failure then finds at most one
 * suspect running, the one that was present in both. A job that was not
 * running in a failure keeps its strikes: it was in no new failure.
 *
 * Cost on the hot path: one small produce per partition per turn of the
 * worker loop that took jobs (the jobs of one poll share it), on its own
 * producer with linger.ms=0, written without waiting for the previous one,
 * and the wait for its ack before those jobs start (one round trip to the
 * partition leader with acks=all; the worker loop waits on that ack rather
 * than on the consumer meanwhile). Finished jobs ride on the next write or
 * a lazy one. Measured with scripts/bench-journal: +3.6 ms of queue time
 * per job and -2% jobs/s with 8-token jobs on a 64-wide model, where the
 * engine's own work is smallest. Reading on assignment: the tail of one
 * partition per assigned partition (16 ms for 4 partitions on one broker).
 *
 * Coverage. The in-flight topic needs at least as many partitions as the
 * jobs topic; a jobs partition without a counterpart (or the whole worker,
 * when the topic is missing) runs unprotected, with a warning; the topic is
 * looked up again at every assignment, so one created (or grown) later, or
 * a broker that was down at startup, takes effect at the next rebalance. A
 * snapshot that cannot be written switches the partition to unprotected
 * until it is assigned again: jobs must not wait on the journal.
 *
 * @thread kafka (every function) */
#pragma once

#include "../config/kg_config.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_journal kg_journal_t;

/** The journal for `jobs_topic` (one of the worker's lanes), writing to
 * `inflight_topic` ("" or NULL means "<jobs_topic>.inflight"). It makes its
 * own producer and reader; when the topic is missing it works in the "off"
 * state (every partition unprotected) with a warning. NULL with errstr set
 * on a bad librdkafka property or out of memory. */
kg_journal_t *kg_journal_new(const kg_config_t *cfg,
                             const char *jobs_topic,
                             const char *inflight_topic,
                             const char *worker_id,
                             char *errstr,
                             size_t errstr_size);

/** Flush nothing, free everything. NULL does nothing. */
void kg_journal_free(kg_journal_t *j);

/** Partitions assigned (from the rebalance callback, before
 * rd_kafka_assign): read each one's last snapshot and take over its
 * strikes. Blocks for at most a few seconds. */
void kg_journal_assign(kg_journal_t *j, const rd_kafka_topic_partition_list_t *parts);

/** Partitions revoked, or the worker stops: when `clean`, write each one's
 * final snapshot marked clean and wait for it (bounded); then forget them.
 * Not clean (the worker failed for a reason that may be a job's): write
 * nothing, so the last snapshot stands for the failure. */
void kg_journal_revoke(kg_journal_t *j, const rd_kafka_topic_partition_list_t *parts, bool clean);

/** The strikes of the job at (partition, offset), or -1 when the partition
 * is not protected (journal off, no counterpart partition, a failed write). */
int kg_journal_strikes(kg_journal_t *j, int32_t partition, int64_t offset);

/** Mark the job running. Returns the ticket to wait for: the job may start
 * once kg_journal_durable says so. */
uint64_t kg_journal_start(kg_journal_t *j, int32_t partition, int64_t offset, int strikes);

/** Whether the snapshot of `ticket` has been acknowledged (or the partition
 * is no longer protected: nothing to wait for). */
bool kg_journal_durable(const kg_journal_t *j, int32_t partition, uint64_t ticket);

/** The job was answered (its terminal event produced): off the record. */
void kg_journal_finish(kg_journal_t *j, int32_t partition, int64_t offset);

/** The job was given back unfinished (drain, abandon): it keeps its strikes
 * but is no longer running here. */
void kg_journal_release(kg_journal_t *j, int32_t partition, int64_t offset);

/** Write the snapshots that are due and serve delivery reports, waiting up
 * to timeout_ms for one (the worker waits here while jobs wait for their
 * snapshot). Call every turn of the worker loop. */
void kg_journal_poll(kg_journal_t *j, int64_t now_us, int timeout_ms);
