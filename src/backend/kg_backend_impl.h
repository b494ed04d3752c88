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
};
