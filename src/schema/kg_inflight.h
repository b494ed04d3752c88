/* kg_inflight: the in-flight snapshot of one jobs partition, the record of
 * the poison-job journal (kafka/kg_journal), JSON <-> C, and the rule that
 * turns the last snapshot of a partition into the strikes its jobs carry.
 *
 * A snapshot says which jobs (offsets) of the partition its owner had
 * taken, for each how many consecutive worker failures it had been present
 * in before (strikes), its place in the search for the culprit (level: the
 * group it is tested in, kafka/kg_suspects.h), how many of those failures
 * it was the only job running on the worker in (alone), and whether it was
 * running (started), alone (solo) or beside others. It is the value of a
 * message on the in-flight topic, partition = the jobs partition, key
 * "<jobs topic>/<partition>":
 *
 *   {"v":2,"jobs_topic":"kgen.jobs","partition":3,"worker_id":"w1",
 *    "epoch":1718000000123,"seq":12,"clean":false,
 *    "runs":[[1187,4,0,true,0,0,false],[1195,1,3,false,1,0,false]]}
 *
 * runs are [first offset, count, strikes, started, level, alone, solo],
 * sorted and disjoint; level <= strikes, alone <= strikes, solo only when
 * started. Version 1 (kgen before group testing) had [first offset, count,
 * strikes, started]: read as level = strikes, alone 0, solo false; a
 * version-1 reader skips version-2 records as unreadable (it sees fewer
 * strikes, never more). clean is true when the owner let the partition go
 * on purpose (a revoke, SIGTERM): its running jobs were not in a failure.
 * The next owner reads the snapshot with the highest (epoch, seq) and
 * applies kg_inflight_inherit.
 *
 * One of the few files that include jansson.h (kg_codec.h lists them). @thread any */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_INFLIGHT_VERSION 2 /* written; 1 is still read */
/* Bounds a reader enforces (a snapshot is outside input). */
#define KG_INFLIGHT_MAX_RUNS    (1 << 20)
#define KG_INFLIGHT_MAX_JOBS    (1 << 20) /* offsets in all runs together */
#define KG_INFLIGHT_MAX_STRIKES 255

typedef struct kg_inflight_run {
    int64_t offset;  /* the first offset of the run */
    int64_t count;   /* offsets offset .. offset + count - 1 */
    int32_t strikes; /* consecutive worker failures each job was present in */
    bool started;    /* running (or about to start) on the snapshot's owner */
    int32_t level;   /* the group-testing level (kafka/kg_suspects.h); 0 with no strike */
    int32_t alone;   /* failures it was the only job running on the worker in */
    bool solo;       /* started as the only job on the worker: a failure now is its own */
} kg_inflight_run_t;

typedef struct kg_inflight {
    char *jobs_topic; /* owned */
    int32_t partition;
    char *worker_id;         /* owned */
    int64_t epoch;           /* the owner's; a later owner writes a larger one */
    int64_t seq;             /* the owner's count of snapshots */
    bool clean;              /* the owner let go on purpose: its running jobs were in no failure */
    kg_inflight_run_t *runs; /* (n_runs) owned, sorted by offset, disjoint */
    size_t n_runs;
} kg_inflight_t;

/** Encode a snapshot as compact JSON. Returns malloc'ed text (the caller
 * frees), length in *len; NULL on out of memory. The strings of `s` are
 * borrowed (they need not be owned when encoding). */
char *kg_inflight_encode(const kg_inflight_t *s, size_t *len);

/** Decode `len` bytes (any content). KG_OK fills `out` (free with
 * kg_inflight_clear); KG_ERR_INVALID with errstr set when the bytes are not
 * a version-1 snapshot within the bounds above; KG_ERR_NOMEM. */
KG_NODISCARD kg_status_t kg_inflight_decode(
    const char *buf, size_t len, kg_inflight_t *out, char *errstr, size_t errstr_size);

/** Free what `s` owns and zero it. Safe on a zeroed snapshot. */
void kg_inflight_clear(kg_inflight_t *s);

/** The strikes a new owner takes over from the last snapshot `s` of a
 * partition whose committed offset is `committed` (-1: unknown): when the
 * owner failed (!clean), every started job was present in that failure and
 * gets one more strike and one more level (alone + 1 when it ran solo);
 * a waiting job on the level of a started one (level >= 2) was in the half
 * that did not run: it goes back to level 1 (run with the whole group next,
 * kg_suspects.h); the others keep theirs. Jobs below `committed` are
 * finished and dropped, and so are jobs with no strike. Returns malloc'ed
 * runs (none started) in *out, their number in *n (0 and NULL when none).
 * KG_ERR_NOMEM. */
KG_NODISCARD kg_status_t kg_inflight_inherit(const kg_inflight_t *s,
                                             int64_t committed,
                                             kg_inflight_run_t **out,
                                             size_t *n);
