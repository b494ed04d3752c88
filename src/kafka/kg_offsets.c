/* kg_offsets: per-partition rings of tracked offsets with done bits; see kg_offsets.h. */
#include "kg_offsets.h"

#include <stdlib.h>
#include <string.h>

/* Offsets are >= 0, so the sign bit of a ring entry is free to say "done". */
#define DONE_BIT ((uint64_t)1 << 63)
/* A fresh partition's ring: 256 entries (2 KiB), so a typical load never grows it. */
#define RING_INITIAL 256u

typedef struct part {
    uint64_t *ring;     /* (cap) tracked offsets ascending from head, DONE_BIT when done */
    uint32_t cap;       /* a power of two, 0 until assigned once */
    uint32_t head;      /* ring index of the oldest held entry */
    uint32_t len;       /* entries held */
    uint32_t n_pending; /* held entries not done */
    int64_t last;       /* last tracked offset, -1 when none since assign/revoke */
    int64_t next;       /* storable offset (one past the done prefix), -1 when none yet */
    int64_t reported;   /* last next reported by committable, -1 when none */
    bool assigned;
    bool dirty;        /* next > reported and the partition is on the dirty list */
    int64_t *answered; /* (n_answered) answered by a previous owner, ascending (kg_answered.h) */
    uint32_t n_answered;
    int64_t committed; /* the committed offset they are above; -1 when none */
} part_t;

struct kg_offsets {
    part_t *parts;       /* (n_parts) indexed by partition */
    int32_t *dirty;      /* (n_parts) FIFO of partitions whose next advanced, from dirty_head */
    uint32_t n_parts;    /* entries allocated in parts and dirty */
    uint32_t n_dirty;    /* entries in the dirty FIFO */
    uint32_t dirty_head; /* index into dirty of the oldest entry */
    size_t n_held;       /* entries held over all partitions */
    size_t n_max_inflight;
};

kg_offsets_t *kg_offsets_new(size_t n_max_inflight) {
    if (n_max_inflight == 0 || n_max_inflight > ((size_t)1 << 31)) {
        return NULL;
    }
    kg_offsets_t *o = calloc(1, sizeof(*o));
    if (!o) {
        return NULL;
    }
    o->n_max_inflight = n_max_inflight;
    return o;
}

void kg_offsets_free(kg_offsets_t *o) {
    if (!o) {
        return;
    }
    for (uint32_t i = 0; i < o->n_parts; i++) {
        free(o->parts[i].ring);
        free(o->parts[i].answered);
    }
    free(o->parts);
    free(o->dirty);
    free(o);
}

// ---- partitions ----

static bool valid_partition(int32_t partition) {
    return partition >= 0 && partition < KG_OFFSETS_MAX_PARTITIONS;
}

/* The partition's slot, or NULL when it was never assigned. */
static part_t *find_part(const kg_offsets_t *o, int32_t partition) {
    if (!valid_partition(partition) || (uint32_t)partition >= o->n_parts) {
        return NULL;
    }
    part_t *p = &o->parts[partition];
    return p->assigned ? p : NULL;
}

/* Make room for partition index `partition` in the tables (doubling). */
static kg_status_t grow_parts(kg_offsets_t *o, int32_t partition) {
    uint32_t need = (uint32_t)partition + 1;
    if (need <= o->n_parts) {
        return KG_OK;
    }
    uint32_t n = o->n_parts ? o->n_parts : 8;
    while (n < need) {
        n *= 2;
    }
    part_t *parts = realloc(o->parts, n * sizeof(*parts));
    if (!parts) {
        return KG_ERR_NOMEM;
    }
    o->parts = parts;
    memset(parts + o->n_parts, 0, (n - o->n_parts) * sizeof(*parts));
    int32_t *dirty = malloc(n * sizeof(*dirty));
    if (!dirty) {
        return KG_ERR_NOMEM; /* parts grew, which is harmless: n_parts still says the old size */
    }
    /* Unroll the dirty FIFO to the start of the new array. */
    for (uint32_t i = 0; o->n_parts > 0 && i < o->n_dirty; i++) {
        dirty[i] = o->dirty[(o->dirty_head + i) % o->n_parts];
    }
    free(o->dirty);
    o->dirty = dirty;
    o->dirty_head = 0;
    o->n_parts = n;
    return KG_OK;
}

kg_status_t kg_offsets_assign(kg_offsets_t *o, int32_t partition) {
    if (!valid_partition(partition)) {
        return KG_ERR_INVALID;
    }
    kg_status_t st = grow_parts(o, partition);
    if (st != KG_OK) {
        return st;
    }
    part_t *p = &o->parts[partition];
    if (p->assigned) {
        return KG_OK;
    }
    if (!p->ring) {
        p->ring = malloc(RING_INITIAL * sizeof(*p->ring));
        if (!p->ring) {
            return KG_ERR_NOMEM;
        }
        p->cap = RING_INITIAL;
    }
    p->head = p->len = p->n_pending = 0;
    p->last = p->next = p->reported = p->committed = -1;
    p->dirty = false;
    p->assigned = true;
    return KG_OK;
}

// ---- the ring ----

static uint64_t *entry(const part_t *p, uint32_t i) {
    return &p->ring[(p->head + i) & (p->cap - 1)];
}

/* Double the ring, keeping the entries in order from index 0. */
static kg_status_t grow_ring(part_t *p) {
    uint32_t cap = p->cap * 2;
    uint64_t *ring = malloc((size_t)cap * sizeof(*ring));
    if (!ring) {
        return KG_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < p->len; i++) {
        ring[i] = *entry(p, i);
    }
    free(p->ring);
    p->ring = ring;
    p->cap = cap;
    p->head = 0;
    return KG_OK;
}

static void mark_dirty(kg_offsets_t *o, int32_t partition, part_t *p) {
    if (p->dirty || p->next <= p->reported) {
        return;
    }
    p->dirty = true;
    /* At most one entry per partition, so the array (n_parts long) never overflows. */
    o->dirty[(o->dirty_head + o->n_dirty) % o->n_parts] = partition;
    o->n_dirty++;
}

/* Pop done entries off the head; each moves the storable offset past itself. */
static void pop_done(kg_offsets_t *o, int32_t partition, part_t *p) {
    while (p->len > 0 && (p->ring[p->head] & DONE_BIT)) {
        p->next = (int64_t)(p->ring[p->head] & ~DONE_BIT) + 1;
        p->head = (p->head + 1) & (p->cap - 1);
        p->len--;
        o->n_held--;
    }
    mark_dirty(o, partition, p);
}

kg_status_t kg_offsets_track(kg_offsets_t *o, int32_t partition, int64_t offset) {
    if (!valid_partition(partition) || offset < 0 || offset == INT64_MAX) {
        return KG_ERR_INVALID;
    }
    part_t *p = find_part(o, partition);
    if (!p) {
        kg_status_t st = kg_offsets_assign(o, partition);
        if (st != KG_OK) {
            return st;
        }
        p = &o->parts[partition];
    }
    if (offset <= p->last) {
        return KG_ERR_INVALID;
    }
    if (o->n_held >= o->n_max_inflight) {
        return KG_QUEUE_FULL;
    }
    if (p->len == p->cap) {
        kg_status_t st = grow_ring(p);
        if (st != KG_OK) {
            return st;
        }
    }
    *entry(p, p->len) = (uint64_t)offset;
    p->len++;
    p->n_pending++;
    p->last = offset;
    o->n_held++;
    return KG_OK;
}

bool kg_offsets_done(kg_offsets_t *o, int32_t partition, int64_t offset) {
    part_t *p = find_part(o, partition);
    if (!p || p->len == 0 || offset < 0) {
        return false;
    }
    /* Binary search: the held entries ascend from the head. */
    uint32_t lo = 0, hi = p->len;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((int64_t)(*entry(p, mid) & ~DONE_BIT) < offset) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == p->len) {
        return false;
    }
    uint64_t *e = entry(p, lo);
    if ((int64_t)(*e & ~DONE_BIT) != offset || (*e & DONE_BIT)) {
        return false;
    }
    *e |= DONE_BIT;
    p->n_pending--;
    if (lo == 0) {
        pop_done(o, partition, p);
    }
    return true;
}

bool kg_offsets_committable(kg_offsets_t *o, int32_t partition, int64_t *next_offset) {
    part_t *p = find_part(o, partition);
    if (!p || p->next <= p->reported) {
        return false;
    }
    p->reported = p->next;
    *next_offset = p->next;
    /* Its dirty-list entry, if any, is skipped when kg_offsets_next_committable reaches it. */
    return true;
}

bool kg_offsets_next_committable(kg_offsets_t *o, int32_t *partition, int64_t *next_offset) {
    while (o->n_dirty > 0) {
        int32_t part = o->dirty[o->dirty_head];
        o->dirty_head = (o->dirty_head + 1) % o->n_parts;
        o->n_dirty--;
        o->parts[part].dirty = false;
        if (kg_offsets_committable(o, part, next_offset)) {
            *partition = part;
            return true;
        }
    }
    return false;
}

void kg_offsets_revoke(kg_offsets_t *o, int32_t partition) {
    part_t *p = find_part(o, partition);
    if (!p) {
        return;
    }
    if (p->dirty) {
        /* Drop its dirty entry, so a reassignment can queue it again without a duplicate.
         * Revocations are rare; a pass over at most n_parts entries is fine. */
        uint32_t kept = 0;
        for (uint32_t i = 0; i < o->n_dirty; i++) {
            int32_t part = o->dirty[(o->dirty_head + i) % o->n_parts];
            if (part != partition) {
                o->dirty[(o->dirty_head + kept) % o->n_parts] = part;
                kept++;
            }
        }
        o->n_dirty = kept;
        p->dirty = false;
    }
    o->n_held -= p->len;
    p->head = p->len = p->n_pending = 0;
    p->last = p->next = p->reported = -1;
    p->assigned = false;
    free(p->answered);
    p->answered = NULL;
    p->n_answered = 0;
    p->committed = -1;
}

size_t kg_offsets_n_held(const kg_offsets_t *o) {
    return o->n_held;
}

size_t kg_offsets_n_pending(const kg_offsets_t *o, int32_t partition) {
    const part_t *p = find_part(o, partition);
    return p ? p->n_pending : 0;
}

// ---- answered above the committed offset (kg_answered.h) ----

kg_status_t kg_offsets_set_answered(
    kg_offsets_t *o, int32_t partition, int64_t committed, const int64_t *offsets, size_t n) {
    part_t *p = find_part(o, partition);
    if (!p || n > UINT32_MAX) {
        return KG_ERR_INVALID;
    }
    int64_t *a = NULL;
    if (n > 0) {
        a = malloc(n * sizeof(*a));
        if (!a) {
            return KG_ERR_NOMEM;
        }
        memcpy(a, offsets, n * sizeof(*a));
    }
    free(p->answered);
    p->answered = a;
    p->n_answered = (uint32_t)n;
    p->committed = committed;
    return KG_OK;
}

bool kg_offsets_is_answered(const kg_offsets_t *o, int32_t partition, int64_t offset) {
    const part_t *p = find_part(o, partition);
    uint32_t lo = 0, hi = p ? p->n_answered : 0;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->answered[mid] < offset) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return p && lo < p->n_answered && p->answered[lo] == offset;
}

size_t kg_offsets_answered_above(
    const kg_offsets_t *o, int32_t partition, int64_t *position, int64_t *out, size_t max) {
    const part_t *p = find_part(o, partition);
    *position = -1;
    if (!p) {
        return 0;
    }
    /* the head entry is never done (pop_done), so it is the first unfinished offset */
    *position = p->len > 0     ? (int64_t)(p->ring[p->head] & ~DONE_BIT)
                : p->next >= 0 ? p->next
                               : p->committed; /* nothing taken yet: pass the list on as it came */
    if (*position < 0) {
        return 0;
    }
    /* merge the done entries held with the previous owner's list, both ascending */
    size_t n = 0;
    uint32_t i = 0, j = 0;
    while (n < max && (i < p->len || j < p->n_answered)) {
        int64_t v;
        if (i < p->len && !(*entry(p, i) & DONE_BIT)) {
            i++;
            continue;
        }
        int64_t a = i < p->len ? (int64_t)(*entry(p, i) & ~DONE_BIT) : INT64_MAX;
        int64_t b = j < p->n_answered ? p->answered[j] : INT64_MAX;
        if (a <= b) {
            v = a;
            i++;
            j += a == b;
        } else {
            v = b;
            j++;
        }
        if (v > *position && (n == 0 || v > out[n - 1])) {
            out[n++] = v;
        }
    }
    return n;
}
