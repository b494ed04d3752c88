/* kg_engine_state: a hybrid (recurrent) model's prefix cache.
 *
 * An attention model's prefix cache shares K/V blocks: any cached block
 * can be read by a later sequence. A recurrent layer's state after a
 * prefix cannot be rebuilt from blocks, only saved when a sequence passes
 * that prefix's end and copied into the next sequence that shares it. So
 * the engine keeps a few saved states (snapshots), each tagged with the
 * tokens it covers (whole blocks, and the adapter key), and saves one at a
 * point it knows is shared:
 *
 *  - where a waiting request's prompt leaves a running sequence's
 *    (kg_engine_step.c's prefix_in_flight: the request waits, the running
 *    one stops its prefill chunk at that block boundary and saves there),
 *    so 16 jobs sent together with one system prompt compute it once;
 *  - where the K/V cache's hit for an admitted request ends but no
 *    snapshot reaches (the blocks prove that prefix was seen before: the
 *    request computes it and saves there for the next one).
 *
 * An admitted request restores the snapshot that covers the most of its
 * cached blocks and starts after it; the K/V blocks of those tokens come
 * from the block cache as for any model. The least recently used snapshot
 * makes room. A snapshot is a copy of one slot's state (the backend's
 * kg_backend_state_save): kg_backend_state_bytes_per_seq each. */
#include "kg_engine_int.h"

#include <stdlib.h>
#include <string.h>

struct kg_state_snap {
    bool used;
    int32_t n_tokens; /* tokens covered: a multiple of the block size */
    uint64_t lora_key;
    uint64_t last_use; /* e->snap_clock when saved or last restored */
};

bool kg_engine_state_init(kg_engine_t *e) {
    int32_t n = e->p.n_state_snapshots;
    const int32_t have = kg_backend_state_snapshots(e->be);
    n = !e->state || !e->p.prefix_cache || n <= 0 ? 0 : n > have ? have : n;
    e->n_snaps = n;
    if (n == 0) {
        return true;
    }
    e->snaps = calloc((size_t)n, sizeof(*e->snaps));
    e->snap_toks = malloc((size_t)n * (size_t)e->p.max_seq_len * sizeof(int32_t));
    return e->snaps && e->snap_toks;
}

void kg_engine_state_free(kg_engine_t *e) {
    free(e->snaps);
    free(e->snap_toks);
    e->snaps = NULL;
    e->snap_toks = NULL;
}

static const int32_t *snap_tokens(const kg_engine_t *e, int32_t i) {
    return e->snap_toks + (size_t)i * (size_t)e->p.max_seq_len;
}

int32_t
kg_engine_state_find(kg_engine_t *e, const kg_seq_t *seq, int32_t max_tokens, int32_t *n_tokens) {
    int32_t best = -1;
    *n_tokens = 0;
    for (int32_t i = 0; i < e->n_snaps; i++) {
        const struct kg_state_snap *s = &e->snaps[i];
        if (s->used && s->n_tokens > *n_tokens && s->n_tokens <= max_tokens &&
            s->lora_key == seq->lora_key &&
            memcmp(snap_tokens(e, i), seq->tokens, (size_t)s->n_tokens * sizeof(int32_t)) == 0) {
            best = i;
            *n_tokens = s->n_tokens;
        }
    }
    return best;
}

bool kg_engine_state_restore(kg_engine_t *e, kg_seq_t *seq, int32_t snap) {
    if (kg_backend_state_restore(e->be, snap, seq->slot) != KG_OK) {
        return false;
    }
    e->snaps[snap].last_use = ++e->snap_clock;
    e->st.n_state_restores++;
    return true;
}

void kg_engine_state_save(kg_engine_t *e, kg_seq_t *seq) {
    const int32_t n = seq->n_computed;
    int32_t have = 0, victim = 0;
    if (e->n_snaps == 0 || n <= 0) {
        return;
    }
    if (kg_engine_state_find(e, seq, n, &have) >= 0 && have == n) {
        return; /* those tokens are saved already */
    }
    for (int32_t i = 1; i < e->n_snaps; i++) {
        const struct kg_state_snap *s = &e->snaps[i], *v = &e->snaps[victim];
        if (v->used && (!s->used || s->last_use < v->last_use)) {
            victim = i;
        }
    }
    struct kg_state_snap *s = &e->snaps[victim];
    s->used = false; /* until the backend has it */
    if (kg_backend_state_save(e->be, seq->slot, victim) != KG_OK) {
        return;
    }
    memcpy(e->snap_toks + (size_t)victim * (size_t)e->p.max_seq_len, seq->tokens,
           (size_t)n * sizeof(int32_t));
    s->used = true;
    s->n_tokens = n;
    s->lora_key = seq->lora_key;
    s->last_use = ++e->snap_clock;
    e->st.n_state_saves++;
}
