/* cpu_lora: LoRA adapters on the CPU backend. An adapter's pairs are
 * packed like the model's weights (F16/BF16/F32 panels for cpu_gemm, Q8_0
 * blocks used in place by cpu_vecdot, so the activations are rounded as
 * ggml rounds them for that type); a step groups its rows by adapter, and
 * after each base projection (one GEMM over every row) each adapter adds
 * its delta s·(x·Aᵀ)·Bᵀ to the rows that use it (small GEMMs per adapter,
 * like the expert groups of cpu_moe: one x·Aᵀ for the projections that
 * share an input, their float A stacked at load, then one (x·Aᵀ)·Bᵀ per
 * projection).
 *
 * Batch invariance: a row's delta is computed from its own input only
 * (the GEMMs' per-element chains do not depend on the rows beside it), and
 * the adapters of one row are added in increasing id order, whatever else
 * is in the step. */
#pragma once

#include "kg_backend_cpu_int.h"

typedef struct cpu_lora_state cpu_lora_state_t;

/** The vtable's lora_add / lora_remove (see kg_backend_lora_add). */
KG_NODISCARD kg_status_t cpu_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size);
void cpu_lora_remove(kg_backend_t *be, int32_t id);

/** Free every adapter and the scratch (ctx->lora NULL: nothing). */
void cpu_lora_free(cpu_ctx_t *ctx);

/** Group the step's rows by adapter (before the layers). false when a slot
 * names an adapter this backend does not hold (the step is refused). */
bool cpu_lora_plan(cpu_ctx_t *ctx, const kg_step_batch_t *batch);

/** outs[i](T, n_out) += each adapter's delta of projection first + i of
 * layer il on in(T, n_in), for the n projections that share `in` (Q, K, V;
 * gate, up), over the rows the last plan gave each adapter. Nothing when
 * the step uses no adapter. */
void cpu_lora_apply(cpu_ctx_t *ctx,
                    int32_t il,
                    kg_lora_proj_t first,
                    int n,
                    const float *in,
                    float *const *outs,
                    int64_t T);
