/* kg_suspects: which suspects run next, and when one is poison. A suspect is
 * a job that was running when a worker failed (kg_journal.h); the worker
 * asks these two pure functions and does what they say
 * (kg_worker_intake.c), so the rules are tested here alone
 * (tests/unit/check_suspects.c).
 *
 * DESIGN: group testing.
 * A failure gives every job that was running a strike, the culprit and its
 * bystanders alike. Running the suspects one at a time (as kgen did before)
 * finds the culprit in one more failure, but it runs a whole batch's work
 * serially after every crash, and most crashes (a kill, an OOM kill, a
 * node lost) have no culprit at all. So the suspects are tested in groups:
 *
 * - Level 1: all suspects at level 1 run together, beside any other jobs,
 *   at batch speed. A failure a group of innocents was in (a kill) costs
 *   nothing more: they finish and leave the record. Suspects that arrive
 *   while a level-1 group runs join it.
 * - A group that fails again moves every job in it one level up, and a
 *   level from 2 on is split: of the suspects at the highest level, the
 *   first half (by partition, then offset) runs; the rest wait. If that
 *   half fails again it goes one level up and is split in turn; the half
 *   that did not run goes back to level 1 (it ran with the culprit's half
 *   before, and will most likely pass as a group now). If the half passes,
 *   the other half is the guilty one and is split next. One culprit among
 *   n suspects is thus alone after about log2(n) failures.
 * - A group of one runs solo: the worker first lets every other job finish
 *   and starts no new one (jobs taken meanwhile wait, deferred) until the
 *   solo job is answered. A failure while it runs solo had no other job on
 *   the worker, of any partition or lane: it is the job's own (alone + 1).
 * - The verdict: a job is poisoned once alone >= poison_after - 1 (with
 *   poison_after 1, at its first failure: no proof is asked for).
 *
 * The guarantee: with --poison-after N >= 2 a job is answered 'poisoned'
 * only after N - 1 failures of workers on which it was the only job
 * running, after at least one failure before those. Another job cannot
 * bring that about (it was not running); what still can is a failure with
 * no job to blame while the job runs solo (a SIGKILL, the host's OOM
 * killer, a lost node), N - 1 times in a row.
 *
 * The state is the record: the level and the alone count live in the
 * journal's snapshot with the strikes (kg_inflight.h), and the rules above
 * read nothing else, so a group survives the crash of the worker testing it
 * and another worker (after a rebalance) goes on where it stopped:
 * - the group that ran is what the failed owner's snapshot marks started
 *   (solo when it ran solo); kg_inflight_inherit moves it a level up (alone
 *   + 1 when solo) and sends the waiting jobs of its level back to level 1;
 * - the split is a function of the suspects and their levels alone.
 * A worker takes the suspects of several partitions (or lanes); a group is
 * drawn from all of them, so each partition's snapshot holds its share of
 * the group. A worker waits until it holds every suspect its partitions'
 * records list (or a second passes) before it picks a group, so that a
 * group is the same whoever draws it and a level-1 group is not started
 * solo with its first message while the rest are on their way.
 *
 * @thread any (pure) */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** A suspect that waits for its turn. */
typedef struct kg_suspect {
    int32_t partition; /* the worker's dense (lane, partition) index */
    int64_t offset;
    int level; /* from the record: 1 runs with everyone at level 1; 0 counts as 1 */
} kg_suspect_t;

/** The next group to run. */
typedef struct kg_suspects_round {
    size_t n;   /* suspects picked (0: none wait) */
    int level;  /* their level */
    bool alone; /* one suspect, to run solo: with no other job on the worker */
} kg_suspects_round_t;

/** Pick the next group among the `n` suspects `s` (any order): pick[i] is
 * set for each suspect in it. Level 1 first (all of it), else the first
 * half of the highest level. */
kg_suspects_round_t kg_suspects_pick(const kg_suspect_t *s, size_t n, bool *pick);

/** Whether a job with this record is poison under --poison-after
 * `poison_after` (0: never). */
bool kg_suspects_is_poison(int strikes, int alone, int poison_after);
