/* kg_adapters: the adapter table and its residency (see kg_adapters.h). */
#include "kg_adapters.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    const kg_lora_t *lora; /* set before the id is handed out, then read only */
    char *name;
    bool resident; /* engine thread */
    int64_t last_used;
    kg_adapter_stats_t stats;
} entry_t;

struct kg_adapters {
    kg_backend_t *be;
    int32_t max_resident;
    _Atomic int32_t n;          /* entries added (published with release) */
    _Atomic int32_t n_resident; /* written by the engine thread */
    entry_t e[KG_ADAPTERS_MAX];
};

kg_adapters_t *kg_adapters_new(kg_backend_t *be, int32_t max_resident) {
    kg_adapters_t *a = calloc(1, sizeof(*a));
    if (a) {
        a->be = be;
        a->max_resident = max_resident > 0 ? max_resident : 0;
    }
    return a;
}

void kg_adapters_free(kg_adapters_t *a) {
    if (!a) {
        return;
    }
    const int32_t n = atomic_load(&a->n);
    for (int32_t i = 0; i < n; i++) {
        if (a->e[i].resident) {
            kg_backend_lora_remove(a->be, i);
        }
        free(a->e[i].name);
    }
    free(a);
}

int32_t kg_adapters_add(kg_adapters_t *a, const kg_lora_t *lora, const char *name) {
    const int32_t id = atomic_load_explicit(&a->n, memory_order_relaxed);
    if (id == KG_ADAPTERS_MAX) {
        return -1;
    }
    entry_t *e = &a->e[id];
    e->name = strdup(name ? name : "");
    if (!e->name) {
        return -1;
    }
    e->lora = lora;
    atomic_store_explicit(&a->n, id + 1, memory_order_release);
    return id;
}

int32_t kg_adapters_max_resident(const kg_adapters_t *a) {
    return a->max_resident;
}

int32_t kg_adapters_n_resident(const kg_adapters_t *a) {
    return atomic_load(&a->n_resident);
}

bool kg_adapters_has(const kg_adapters_t *a, int32_t id) {
    return id >= 0 && id < atomic_load_explicit(&a->n, memory_order_acquire);
}

const kg_adapter_stats_t *kg_adapters_stats(const kg_adapters_t *a, int32_t id) {
    return &a->e[id].stats;
}

bool kg_adapters_is_resident(const kg_adapters_t *a, int32_t id) {
    return a->e[id].resident;
}

kg_status_t kg_adapters_load(kg_adapters_t *a, int32_t id, char *errstr, size_t errstr_size) {
    entry_t *e = &a->e[id];
    const int64_t t0 = kg_clock_us();
    int32_t got = id;
    kg_status_t st = kg_backend_lora_add(a->be, e->lora, &got, errstr, errstr_size);
    if (st != KG_OK) {
        return st;
    }
    const int64_t us = kg_clock_us() - t0;
    e->resident = true;
    atomic_store(&e->stats.resident, 1);
    atomic_fetch_add(&e->stats.n_loads, 1);
    atomic_store(&e->stats.load_us, us);
    atomic_fetch_add(&a->n_resident, 1);
    KG_LOG_INFO("lora", "loaded adapter=%s id=%d load_ms=%.1f resident=%d max=%d", e->name, id,
                (double)us / 1000.0, atomic_load(&a->n_resident), a->max_resident);
    return KG_OK;
}

void kg_adapters_evict(kg_adapters_t *a, int32_t id) {
    entry_t *e = &a->e[id];
    if (!e->resident) {
        return;
    }
    kg_backend_lora_remove(a->be, id);
    e->resident = false;
    atomic_store(&e->stats.resident, 0);
    atomic_fetch_add(&e->stats.n_evictions, 1);
    atomic_fetch_sub(&a->n_resident, 1);
    KG_LOG_INFO("lora", "evicted adapter=%s id=%d resident=%d", e->name, id,
                atomic_load(&a->n_resident));
}

void kg_adapters_touch(kg_adapters_t *a, int32_t id, int64_t tick) {
    a->e[id].last_used = tick;
}

int64_t kg_adapters_last_used(const kg_adapters_t *a, int32_t id) {
    return a->e[id].last_used;
}

const char *kg_adapters_name(const kg_adapters_t *a, int32_t id) {
    return a->e[id].name;
}
