/* kg_engine_lora: which adapters the backend holds, decided at admission
 * (see kg_engine_set_adapters and kg_adapters.h). */
#include "../core/kg_log.h"
#include "kg_engine_int.h"

#include <string.h>

void kg_engine_set_adapters(kg_engine_t *e, kg_adapters_t *a) {
    e->adapters = a;
}

/* Mark in `used` the adapters of every record in `recs` but `skip`. */
static void mark(const kg_engine_t *e, const int32_t *recs, int32_t n, int32_t skip, bool *used) {
    for (int32_t i = 0; i < n; i++) {
        const kg_seq_t *s = &e->recs[recs[i]];
        for (int32_t j = 0; recs[i] != skip && j < s->lora.n; j++) {
            used[s->lora.id[j]] = true;
        }
    }
}

/* The least recently used resident adapter that is not in `keep` and,
 * when `avoid` is given, not in it either; -1 if none. */
static int32_t lru(const kg_adapters_t *a, const bool *keep, const bool *avoid) {
    int32_t best = -1;
    for (int32_t id = 0; id < KG_ADAPTERS_MAX && kg_adapters_has(a, id); id++) {
        if (!kg_adapters_is_resident(a, id) || keep[id] || (avoid && avoid[id])) {
            continue;
        }
        if (best < 0 || kg_adapters_last_used(a, id) < kg_adapters_last_used(a, best)) {
            best = id;
        }
    }
    return best;
}

int kg_engine_lora_ready(kg_engine_t *e, int32_t r) {
    kg_adapters_t *a = e->adapters;
    const kg_seq_t *seq = &e->recs[r];
    int32_t need[KG_LORA_SET_MAX], n_need = 0;
    for (int32_t j = 0; j < seq->lora.n; j++) {
        if (!kg_adapters_is_resident(a, seq->lora.id[j])) {
            need[n_need++] = seq->lora.id[j];
        }
    }
    if (n_need == 0) {
        return 1;
    }
    const int32_t cap = kg_adapters_max_resident(a);
    int32_t n_evict = cap > 0 ? kg_adapters_n_resident(a) + n_need - cap : 0;
    if (n_evict > 0) {
        /* never one a running sequence or this one uses; among the rest
         * first those no waiting sequence uses. A waiting one's adapter may
         * go too: the queue is FIFO, so the sequences behind this head
         * cannot run before it, and keeping their adapters would leave it
         * waiting for ever. */
        bool keep[KG_ADAPTERS_MAX] = {false}, waiting[KG_ADAPTERS_MAX] = {false};
        mark(e, e->run, e->n_run, -1, keep);
        for (int32_t j = 0; j < seq->lora.n; j++) {
            keep[seq->lora.id[j]] = true;
        }
        mark(e, e->wait, e->n_wait, r, waiting);
        int32_t victims[KG_LORA_SET_MAX], n_victims = 0;
        while (n_victims < n_evict) {
            int32_t v = lru(a, keep, waiting);
            v = v >= 0 ? v : lru(a, keep, NULL);
            if (v < 0) {
                if (!e->lora_blocked) {
                    KG_LOG_INFO("lora",
                                "waiting request=%llu adapter=%s max_loras=%d (every resident "
                                "adapter is in use by a running request)",
                                (unsigned long long)seq->id, kg_adapters_name(a, need[0]), cap);
                }
                e->lora_blocked = true;
                return 0;
            }
            keep[v] = true; /* not chosen twice */
            victims[n_victims++] = v;
        }
        for (int32_t i = 0; i < n_victims; i++) {
            kg_adapters_evict(a, victims[i]);
        }
    }
    e->lora_blocked = false;
    for (int32_t i = 0; i < n_need; i++) {
        char err[256];
        if (kg_adapters_load(a, need[i], err, sizeof(err)) != KG_OK) {
            KG_LOG_ERROR("lora", "load_failed request=%llu adapter=%s error=\"%s\"",
                         (unsigned long long)seq->id, kg_adapters_name(a, need[i]), err);
            return -1;
        }
    }
    return 1;
}
