/* cpu_recurrent: the CPU backend's recurrent layers (a hybrid model's
 * non-attention mixers) and the state they keep per sequence slot.
 *
 * A slot's state is every recurrent layer's state side by side, F32. A
 * step first checks each slot's tokens against the position its state has
 * reached (a token at position 0 zeroes the state; any other must follow
 * the last computed one), then each recurrent layer runs its tokens in
 * batch order, which is position order within a slot. A token's state
 * update reads only its own slot's state and its own inputs, so a
 * sequence's result does not depend on its batch mates or on how its
 * prompt was cut into chunks: the recurrence is run token by token in
 * prefill as in decode (no chunked scan), which is what makes chunking
 * invisible to the bits. */
#pragma once

#include "kg_backend_cpu_int.h"

/** Pack layer il's recurrent tensors into L (model->layers[il].kind says
 * which). False with errstr set. */
bool cpu_recurrent_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size);

/** Free what cpu_recurrent_layer_init took for L. */
void cpu_recurrent_layer_clear(cpu_layer_t *L);

/** The states (ctx->rec) for n_slots slots and n_snaps snapshots, when
 * the model is recurrent, and the step's scratch. False with errstr set. */
bool cpu_recurrent_init(
    cpu_ctx_t *ctx, int32_t n_slots, int32_t n_snaps, char *errstr, size_t errstr_size);

/** Free ctx->rec. */
void cpu_recurrent_free(cpu_ctx_t *ctx);

/** Before a step's layers: each token's slot state must be where the
 * token continues it (position 0 zeroes it); grows the states to
 * batch->n_slots. KG_ERR_INVALID with the fault (*bad_seq the slot, or -1
 * for the step) when not; KG_ERR_NOMEM. */
KG_NODISCARD kg_status_t cpu_recurrent_begin(cpu_ctx_t *ctx,
                                             const kg_step_batch_t *batch,
                                             int32_t *bad_seq);

/** After a step's layers: each slot's state has reached its last token. */
void cpu_recurrent_end(cpu_ctx_t *ctx, const kg_step_batch_t *batch);

/** Recurrent layer il on ctx->xn (T, n_embd) into ctx->tmp (T, n_embd),
 * advancing each token's slot state. */
void cpu_recurrent_mixer(cpu_ctx_t *ctx, int32_t il, const kg_step_batch_t *batch);

/** The vtable's state_copy (kg_backend_state_copy). */
KG_NODISCARD kg_status_t cpu_recurrent_copy(kg_backend_t *be,
                                            const int32_t *src,
                                            const int32_t *dst,
                                            int32_t n);

/** The vtable's state_save: slot -> snapshot, or back (restore). */
KG_NODISCARD kg_status_t cpu_recurrent_save(kg_backend_t *be,
                                            int32_t slot,
                                            int32_t snap,
                                            bool restore);

/** Bytes the slots' states take (kg_backend_memory's state_size), or the
 * snapshots' (snapshot_size). */
size_t cpu_recurrent_size(const cpu_ctx_t *ctx, bool snapshots);
