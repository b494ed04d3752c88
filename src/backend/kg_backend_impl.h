/* kg_backend_impl: the backend vtable, for backend implementations only
 * (ggml-backend-impl.h). Callers use the functions of kg_backend.h. */
#pragma once

#include "kg_backend.h"

struct kg_backend_i {
    const char *name;
    void (*free)(kg_backend_t *be);
    kg_status_t (*forward)(kg_backend_t *be, const kg_step_batch_t *batch, float *logits);
    void (*memory)(const kg_backend_t *be, kg_backend_memory_t *out);
};

struct kg_backend {
    struct kg_backend_i iface;
    void *ctx;
    /* optional: device-side sampling behind kg_backend_sample (NULL: none).
     * Outside kg_backend_i so the tables backends fill positionally need no
     * new entry; backends allocate kg_backend_t zeroed. */
    kg_status_t (*sample)(kg_backend_t *be,
                          const kg_sample_request_t *reqs,
                          int32_t n,
                          kg_sample_result_t *out);
    /* optional: what the last failure hit (NULL: from the status alone) */
    void (*last_fault)(const kg_backend_t *be, kg_backend_fault_t *out);
    /* optional: kg_backend_counters, callable from any thread */
    void (*counters)(const kg_backend_t *be, kg_backend_counters_t *out);
    /* optional: kg_backend_kv_copy (NULL: none; the engine recomputes instead) */
    kg_status_t (*kv_copy)(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n);
    /* optional: the expert load behind kg_backend_moe_stats (NULL: none) */
    void (*moe_stats)(const kg_backend_t *be, kg_moe_stats_t *out);
    /* optional: LoRA adapters behind kg_backend_lora_add/_remove (NULL: none) */
    kg_status_t (*lora_add)(
        kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size);
    void (*lora_remove)(kg_backend_t *be, int32_t id);
    /* with lora_add NULL, why this model takes no adapters here ("multi-head latent
     * attention"), for the refusal; NULL: the backend runs none at all */
    const char *no_lora_why;
    /* a recurrent model's backend: kg_backend_state_copy (NULL: the model
     * has no recurrent layer) */
    kg_status_t (*state_copy)(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n);
    /* optional with state: snapshots (kg_backend_state_save/_restore); n_snapshots 0: none */
    kg_status_t (*state_save)(kg_backend_t *be, int32_t slot, int32_t snap, bool restore);
    int32_t n_snapshots;
    /* optional: forward fills kg_step_batch_t.hidden (false: it refuses a step that asks) */
    bool hidden;
};
