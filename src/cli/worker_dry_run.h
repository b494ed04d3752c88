/* worker_dry_run: `kgen-worker --dry-run` (see the .c). */
#pragma once

#include "config/kg_config.h"
#include "model/kg_model.h"

#include <stdio.h>

/** Print the memory plan of `model` under cfg's flags to out. Returns the
 * exit code: 0, 1 when --device-memory is given and too small, 2 for flags
 * the engine refuses. */
int kg_worker_dry_run(const kg_config_t *cfg, const kg_model_t *model, FILE *out);
