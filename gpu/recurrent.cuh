/* recurrent: the hybrid models' recurrent layers on the device (the CPU
 * backend's cpu_recurrent.c and cpu_deltanet.c), each slot's state in
 * device memory: (n_slots, per_slot) F32, a layer's part of a slot's state
 * at its offset, laid out as the CPU backend lays it out.
 *
 * Every kernel reads the step's real token count and each token's slot and
 * position from the uploaded inputs (so one captured graph serves every
 * decode step of its bucket, as the other kernels), and walks a slot's
 * tokens in batch order, which is position order within a slot: one
 * thread (or warp) owns one channel (or one row of a DeltaNet head's
 * matrix) and carries it from token to token, exactly as decode does, so
 * a token's result does not depend on its batch mates or on how its
 * prefill was chunked. */
#pragma once

#include "cuda_common.cuh"

/** Zero the state of every slot whose token in this step is at position
 * 0 (a sequence starting over), before the step's layers. */
kg_status_t kg_cuda_rec_reset(
    cudaStream_t stream, int32_t n_launch, kg_cuda_inputs_t in, float *state, int64_t per_slot);

/** LFM2's short convolution of one layer: bcx (rows, 3 E) is in_proj's
 * output, B | C | x; for every token in batch order and channel c,
 * y = C * kg_conv_step(window, kernel row c, L, B * x), the window the
 * layer's (L - 1) x E part of the token's slot state at `off`; y stored
 * as dt (out_proj's type) into out (rows, E). */
kg_status_t kg_cuda_shortconv(cudaStream_t stream,
                              kg_cuda_inputs_t in,
                              const float *bcx,
                              const float *kernel,
                              float *state,
                              int64_t per_slot,
                              int64_t off,
                              int32_t E,
                              int32_t L,
                              void *out,
                              kg_cuda_dtype_t dt);
