/* kg_suspects: the group-testing rules for suspects (see kg_suspects.h). */
#include "kg_suspects.h"

#include <stdlib.h>

static int level_of(const kg_suspect_t *x) {
    return x->level < 1 ? 1 : x->level;
}

/* A suspect of the level being halved, with its index in the caller's array. */
typedef struct ranked {
    int32_t partition;
    int64_t offset;
    size_t i;
} ranked_t;

/* (partition, offset) order: the halves do not depend on the order the messages came in. */
static int by_position(const void *a, const void *b) {
    const ranked_t *x = a, *y = b;
    if (x->partition != y->partition) {
        return x->partition < y->partition ? -1 : 1;
    }
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

kg_suspects_round_t kg_suspects_pick(const kg_suspect_t *s, size_t n, bool *pick) {
    kg_suspects_round_t round = {0};
    int top = 0;
    bool any_first = false;
    for (size_t i = 0; i < n; i++) {
        pick[i] = false;
        int l = level_of(&s[i]);
        top = l > top ? l : top;
        any_first |= l == 1;
    }
    if (n == 0) {
        return round;
    }
    if (any_first) {
        /* first all together: a batch of innocents resumes at batch speed */
        for (size_t i = 0; i < n; i++) {
            pick[i] = level_of(&s[i]) == 1;
            round.n += pick[i];
        }
        round.level = 1;
        round.alone = round.n == 1;
        return round;
    }
    ranked_t *at = malloc(n * sizeof(*at));
    if (!at) {
        /* out of memory: one at a time is always sound */
        for (size_t i = 0; i < n; i++) {
            if (level_of(&s[i]) == top) {
                pick[i] = true;
                return (kg_suspects_round_t){.n = 1, .level = top, .alone = true};
            }
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (level_of(&s[i]) == top) {
            at[m++] = (ranked_t){.partition = s[i].partition, .offset = s[i].offset, .i = i};
        }
    }
    qsort(at, m, sizeof(*at), by_position);
    for (size_t k = 0; k < (m + 1) / 2; k++) {
        pick[at[k].i] = true;
    }
    free(at);
    round.n = (m + 1) / 2;
    round.level = top;
    round.alone = round.n == 1;
    return round;
}

bool kg_suspects_is_poison(int strikes, int alone, int poison_after) {
    if (poison_after <= 0) {
        return false;
    }
    if (poison_after == 1) {
        return strikes >= 1;
    }
    return alone >= poison_after - 1;
}
