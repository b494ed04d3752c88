/* kg_answered: the commit metadata that names the jobs answered above a committed offset.
 *
 * Offsets commit contiguously (kg_offsets.h): a job that finished after a still-running job of
 * its partition is not covered by the committed offset, and a new owner of the partition (a
 * rebalance, a drain) would run it again; in test_worker_sigterm 27 of the 50 jobs the first
 * worker answered were answered again by the second. So a worker that gives a partition up
 * commits, beside the offset, the offsets above it that it answered (and those a previous
 * owner named that it has not reached yet), in the offset commit's metadata string, which
 * Kafka keeps with the offset atomically; the next owner reads it on assignment
 * (rd_kafka_committed) and answers nothing twice. The text:
 *
 *     kgen-answered:<d1>,<d2>,...      d = offset - committed offset, ascending, > 0
 *
 * kept under KG_ANSWERED_MAX_BYTES (brokers take 4,096 by default: offset.metadata.max.bytes);
 * offsets that do not fit are left out, and their jobs run again (at least once still holds).
 * The metadata is outside input (any client of the group may commit any string): decoding
 * takes what it can prove and ignores the rest. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define KG_ANSWERED_MAX_BYTES 2048
#define KG_ANSWERED_PREFIX    "kgen-answered:"

/** Write the metadata for `n` ascending offsets above `committed` into buf (cap bytes, NUL
 * terminated); returns how many of the offsets it holds (a prefix of them: those that fit in
 * cap and KG_ANSWERED_MAX_BYTES). Offsets not above `committed` or not ascending are skipped. */
size_t
kg_answered_encode(int64_t committed, const int64_t *offsets, size_t n, char *buf, size_t cap);

/** The bytes `offset` adds to a list encoded above `committed`, its comma counted: a list fits
 * when strlen(KG_ANSWERED_PREFIX) + the sum of its items' bytes - 1 <= KG_ANSWERED_MAX_BYTES
 * (what kg_answered_encode then holds whole), so a list can grow without encoding it again. */
size_t kg_answered_item_bytes(int64_t committed, int64_t offset);

/** The offsets named by `md` (len bytes, need not be NUL terminated) above `committed`, at most
 * `max` into out, ascending; 0 for metadata that is not ours or is malformed (a malformed
 * entry ends the list). */
size_t kg_answered_decode(const char *md, size_t len, int64_t committed, int64_t *out, size_t max);
