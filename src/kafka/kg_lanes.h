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
 * during a bulk backlog takes the next free slot; a bulk backlog is never starved.
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
