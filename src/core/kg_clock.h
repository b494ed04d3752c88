/* kg_clock: monotonic and wall clocks in the units the code needs. */
#pragma once

#include <stdint.h>
#include <time.h>

/** Monotonic time in microseconds. @thread any */
static inline int64_t kg_clock_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/** Wall-clock time in milliseconds since the epoch (deadlines are absolute
 * epoch ms in the job contract). @thread any */
static inline int64_t kg_clock_epoch_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
