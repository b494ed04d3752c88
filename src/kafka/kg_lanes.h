/* kg_lanes: priority lanes. A worker can read several jobs topics, each with a weight:
 *   --jobs-topic kgen.jobs.interactive:8,kgen.jobs.bulk:1
 * (a plain topic name is one lane of weight 1, as before).
 *
 * DESIGN
 * Admission. Prepared jobs wait in the worker, one queue per lane (priority, then arrival,
 * within a lane), and enter the engine only as slots free up (the engine holds
 * max_batch_size running plus a small slack waiting, so a slot never idles). Which lane's job
 * goes next is weighted fair (stride scheduling): every lane has a pass value; the lane with
 * waiting jobs and the smallest pass goes, and its pass grows by STRIDE / weight. A lane that
 * was idle starts at the current pass (no credit for idling), so with weights 8:1 and both
 * lanes backlogged, 8 of every 9 free slots go to the first; an interactive job that arrives
 * during a bulk backlog takes a slot at once (below); a bulk backlog is never starved by
 * the choice here, though higher lanes whose jobs alone fill every slot run first.
 * A slot without waiting. A lane's jobs enter the engine with a tier (the number of distinct
 * weights below the lane's): the engine gives a job of a higher tier that finds every slot
 * taken the slot of the newest running job of a lower tier, which is preempted (its tokens
 * kept, its KV blocks left in the prefix cache, so it resumes by recomputing its last partial
 * block). Without this an interactive job waits for a bulk job to finish: with bulk jobs of 128
 * tokens that was 8-10x the idle time to first token. Preemption rather than slots reserved per
 * lane, as vLLM's priority scheduling does: reserved slots idle whenever the high lane does,
 * which costs the bulk lane their share of the batch all the time, where a preemption costs a
 * partial block of recompute once per interactive job. And a lane may have jobs in the engine
 * while those of its tier or higher number fewer than the room (max_batch_size + a slack):
 * lower lanes do not count, so a full engine of bulk jobs does not keep an interactive job
 * out. Equal weights share a tier: neither preempts the other. The price: where the higher
 * lanes' jobs alone keep every slot busy, lower lanes wait (strict priority in the engine, as
 * in vLLM), where slots freed one by one went 1 in 9 to them.
 * Backpressure. Lanes are paused lowest weight first: the lane of rank r (0 = the highest
 * weight) pauses when the jobs taken reach cap - r * cap / (4 * (n - 1)) (the lowest at 3/4
 * of the cap) and resumes at 3/4 of that, so a bulk backlog leaves room for interactive jobs
 * to be fetched and admitted at once.
 * Pure logic (no Kafka): the worker keeps the queues and the consumer. @thread kafka */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_LANES_MAX       8
#define KG_LANE_MAX_WEIGHT 1000

typedef struct kg_lane {
    char topic[256];
    int32_t weight; /* 1..KG_LANE_MAX_WEIGHT */
    int32_t rank;   /* 0 = the highest weight (ties: the order given) */
    int32_t tier;   /* the engine's request tier: distinct weights below this one's */
    uint64_t pass;  /* stride scheduling */
} kg_lane_t;

typedef struct kg_lanes {
    kg_lane_t lane[KG_LANES_MAX];
    int n;
    uint64_t vtime; /* the pass of the last lane picked */
} kg_lanes_t;

/** Parse "topic[:weight][,topic[:weight]]...". KG_ERR_INVALID with errstr set on an empty or
 * repeated topic, a weight outside 1..1000, or more than KG_LANES_MAX lanes. */
KG_NODISCARD kg_status_t kg_lanes_parse(const char *spec,
                                        kg_lanes_t *out,
                                        char *errstr,
                                        size_t errstr_size);

/** The lane of `topic`, or -1. */
int kg_lanes_find(const kg_lanes_t *l, const char *topic);

/** The lane whose waiting job goes next (has_work[i]: lane i has one), weighted fair; -1 when
 * none has work. Advances that lane's pass. */
int kg_lanes_pick(kg_lanes_t *l, const bool *has_work);

/** How many jobs taken (in flight in the worker) pause lane `i`, out of a cap of `cap`. */
int32_t kg_lanes_pause_at(const kg_lanes_t *l, int i, int32_t cap);

/** Whether lane `i` may put another job into the engine: the jobs in the engine of lanes of
 * its tier or higher (n_in_engine[k]: lane k's) are fewer than `room`. */
bool kg_lanes_has_room(const kg_lanes_t *l, int i, const int32_t *n_in_engine, int32_t room);
