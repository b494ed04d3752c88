/* cpu_bert: the CPU backend's `bert` encoder (see cpu_bert.c): its weights
 * and scratch, and its forward pass in place of the decoder's. */
#pragma once

#include "kg_backend_cpu_int.h"

#include <stdbool.h>
#include <stddef.h>

/** Pack the encoder's weights into ctx (model, hp, pool, max_tokens set)
 * and allocate its step buffers (no KV cache). False with errstr set; the
 * backend's free releases what was made. */
bool cpu_bert_init(cpu_ctx_t *ctx, char *errstr, size_t errstr_size);

/** Release what cpu_bert_init made beyond the shared cpu_ctx_t fields. */
void cpu_bert_free(cpu_ctx_t *ctx);

/** The forward vtable entry for a bert model: hidden states only (a step
 * asking for logits is refused), whole inputs only. @thread engine */
KG_NODISCARD kg_status_t cpu_bert_forward(kg_backend_t *be,
                                          const kg_step_batch_t *batch,
                                          float *logits);
