/* kg_demo: `kgen-worker --demo N`, the whole path with nothing installed.
 *
 * Starts librdkafka's in-process mock cluster (it listens on a loopback
 * port, so kgen-submit can be pointed at it too), creates the topics,
 * makes a small random-weight model with the GGUF writer unless --model is
 * given, produces N varied sample jobs, and prints every result event as
 * one JSON line on stdout; when all N jobs have their terminal event it
 * stops the worker. With N = 0 it produces nothing and runs until a
 * signal. */
#pragma once

#include "../config/kg_config.h"
#include "../core/kg_status.h"
#include "kg_worker.h"

#include <stddef.h>

typedef struct kg_demo kg_demo_t;

/** Mock cluster, topics and (when cfg->model is empty) a model; sets
 * cfg->brokers and cfg->model accordingly. */
kg_demo_t *kg_demo_new(kg_config_t *cfg, char *errstr, size_t errstr_size);
/** Produce the sample jobs and start printing results. */
KG_NODISCARD kg_status_t kg_demo_start(kg_demo_t *demo,
                                       kg_worker_t *w,
                                       char *errstr,
                                       size_t errstr_size);
/** Stop printing; 0 when every sample job got its terminal event. */
int kg_demo_finish(kg_demo_t *demo);
void kg_demo_free(kg_demo_t *demo);
