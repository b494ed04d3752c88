/* kg_served: the names a worker serves its model under (--served-model-name).
 *
 * A job that names a model (kgen's model field, an OpenAI body's model) is
 * run only when the name is one of these; otherwise it gets
 * model_not_found (kg_intake). The names come from the flag (a comma list;
 * the flag may repeat) or, by default, from the model: the GGUF's
 * general.name and the file name without its directory and .gguf suffix,
 * as vLLM defaults to the model path. */
#pragma once

#include "../core/kg_status.h"
#include "../model/kg_model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_SERVED_MAX 32 /* names at most */

typedef struct kg_served {
    char *names[KG_SERVED_MAX]; /* (n) owned, distinct, non-empty */
    int32_t n;
} kg_served_t;

/** Fill `s` from `spec` (comma-separated names; NULL or "" for the
 * defaults of `model`, whose file is `model_path`, which may be NULL).
 * KG_ERR_INVALID with errstr for an empty name or too many; KG_ERR_NOMEM.
 * Clear with kg_served_clear whatever the result. @thread any */
KG_NODISCARD kg_status_t kg_served_init(kg_served_t *s,
                                        const char *spec,
                                        const kg_model_t *model,
                                        const char *model_path,
                                        char *errstr,
                                        size_t errstr_size);

void kg_served_clear(kg_served_t *s);

/** "a, b, c" for logs; writes at most `size` bytes. */
void kg_served_describe(const kg_served_t *s, char *out, size_t size);
