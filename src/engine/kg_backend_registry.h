/* kg_backend_registry: which backends this build has and which one a
 * model runs on ("auto", "cpu" or "cuda"), with what the CUDA backend is
 * known to run (its model features and weight types).
 *
 * It lives above src/backend/ (as ggml keeps its backend registry apart
 * from the backends): the choice needs the CUDA backend's C entry point
 * (gpu/kg_backend_cuda.h), and gpu/ stands on src/backend/, so the backend
 * layer itself never reaches up into gpu/. */
#pragma once

#include "../backend/kg_backend.h"
#include "../model/kg_model.h"

#include <stddef.h>

/** Pick and create a backend by name: "cpu", "cuda" or "auto". `auto`
 * takes CUDA when it is compiled in, a device is there and the model uses
 * only what CUDA runs, else the CPU with a WARN; an explicit `cuda` that
 * cannot run is an error (NULL, one line in errstr). */
kg_backend_t *kg_backend_new(const char *name,
                             const kg_model_t *model,
                             const kg_backend_params_t *params,
                             char *errstr,
                             size_t errstr_size);

/** Names of the backends compiled in, e.g. "cpu" or "cpu,cuda". */
const char *kg_backend_list(void);

/** The weight types the CUDA backend runs (it converts them on upload),
 * and their count in *n. Defined in every build (tests check the table
 * without CUDA). */
const kg_ggml_type_t *kg_backend_cuda_types(int *n);
