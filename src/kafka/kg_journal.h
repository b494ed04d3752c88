/* kg_journal: the poison-job journal. A job that keeps killing workers
 * (a bug, a device fault, an OOM kill) must get an answer instead of
 * stopping every worker that takes it in turn.
 *
 * DESIGN
 * Rule: a job that was the only job running on a worker that failed,
 * `poison_after` - 1 times (default 2: once), after a failure before that,
 * is not run again; it is answered with an `internal` error event
 * ("poisoned after N attempts") and a copy on the DLQ. Finding that job
 * among the bystanders of a crash is kg_suspects.h's group testing; this
 * journal keeps what it needs on record (strikes, level, alone, solo).
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
 * failure and gets one strike more and moves a level up in the search
 * (kg_inflight_inherit; a job that ran solo gets an alone failure). A
 * revoked partition therefore never counts, and neither does a drain. An
 * owner evicted from the group while alive (its session timed out while the
 * broker restarted) looks dead at first: it revokes, writing its clean
 * snapshot, only at its next heartbeat, and later still when the broker
 * restart left it in its reconnect back-off. So a new owner that finds a
 * snapshot that is not clean, with jobs running, waits a heartbeat interval
 * + 2 s for a clean one before it counts the failure (5 s with librdkafka's
 * defaults; only after a crash or an eviction, never on a plain hand-over),
 * and a heartbeat + reconnect.backoff.max.ms + 2 s (15 s) where the failure
 * would decide a verdict: a job ran solo, or poison_after is 1. A failure
 * counted by mistake elsewhere only moves jobs in the search.
 *
 * Ordering. A job may start only once a snapshot that marks it running is
 * acknowledged (acks=all): a job that crashes the worker at once (a crash in
 * the tokenizer, the test hook) is then always on record. The worker holds
 * the message until then (kg_journal_start returns a ticket; the worker asks
 * kg_journal_durable). Finished jobs leave the record lazily (within
 * LAZY_MS): a job that finished but was still on record when the worker
 * died gets a strike it did not earn, which at worst makes it a suspect.
 *
 * The bystanders. When a worker dies, every job it was running gets a
 * strike, not only the culprit: the suspects are run in groups that are
 * halved while they fail (kg_suspects.h), and only a failure a job was alone
 * in counts toward its verdict. A job that was not running in a failure
 * keeps its strikes: it was in no new failure.
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

/** What the record says of one job (all 0: a job in no failure). */
typedef struct kg_journal_rec {
    int strikes; /* consecutive worker failures it was present in */
    int level;   /* its group in the search for the culprit (kg_suspects.h) */
    int alone;   /* of those failures, the ones it was the only job running in */
} kg_journal_rec_t;

/** The record of the job at (partition, offset) in *rec; false (and *rec
 * zero) when the partition is not protected (journal off, no counterpart
 * partition, a failed write). */
bool kg_journal_lookup(kg_journal_t *j, int32_t partition, int64_t offset, kg_journal_rec_t *rec);

/** The strikes of the job at (partition, offset), or -1 when the partition
 * is not protected. */
int kg_journal_strikes(kg_journal_t *j, int32_t partition, int64_t offset);

/** How many suspects (jobs with strikes) of the partition the record holds
 * that are not running: the worker waits for their messages before it
 * splits a group (kg_suspects.h). 0 when not protected. */
int kg_journal_n_waiting(const kg_journal_t *j, int32_t partition);

/** Mark the job running, `solo` when it runs as the only job on the worker
 * (a failure then is its own: alone + 1). Returns the ticket to wait for:
 * the job may start once kg_journal_durable says so. */
uint64_t kg_journal_start(kg_journal_t *j, int32_t partition, int64_t offset, bool solo);

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
