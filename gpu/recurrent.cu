/* recurrent: see the header. Built with --fmad=false, so each product and
 * sum rounds as the CPU backend's C code does (kg_conv_step is the same
 * function on both sides). */
#include "recurrent.cuh"

/* One block per token slot: a token at position 0 zeroes its slot. */
__global__ void rec_reset_kernel(kg_cuda_inputs_t in, float *state, int64_t per_slot) {
    const int32_t t = blockIdx.x;
    if (t >= in.hdr->n_tokens || in.pos[t] != 0) {
        return;
    }
    float *s = state + (int64_t)in.seq[t] * per_slot;
    for (int64_t i = threadIdx.x; i < per_slot; i += blockDim.x) {
        s[i] = 0.0f;
    }
}

kg_status_t kg_cuda_rec_reset(
    cudaStream_t stream, int32_t n_launch, kg_cuda_inputs_t in, float *state, int64_t per_slot) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    rec_reset_kernel<<<(unsigned)n_launch, 256, 0, stream>>>(in, state, per_slot);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* One thread per channel, every token in batch order (cpu_recurrent.c's
 * shortconv_task). */
__global__ void shortconv_kernel(kg_cuda_inputs_t in,
                                 const float *__restrict__ bcx,
                                 const float *__restrict__ kernel,
                                 float *state,
                                 int64_t per_slot,
                                 int64_t off,
                                 int32_t E,
                                 int32_t L,
                                 void *out,
                                 int dt) {
    const int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= E) {
        return;
    }
    const int32_t T = in.hdr->n_tokens;
    const float *k = kernel + (int64_t)c * L;
    for (int32_t t = 0; t < T; t++) {
        const float *row = bcx + (int64_t)t * 3 * E;
        float *win = state + (int64_t)in.seq[t] * per_slot + off + (int64_t)c * (L - 1);
        const float y = row[E + c] * kg_conv_step(win, k, L, row[c] * row[2 * E + c]);
        kg_st(out, (int64_t)t * E + c, y, dt);
    }
}

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
                              kg_cuda_dtype_t dt) {
    shortconv_kernel<<<(unsigned)((E + 127) / 128), 128, 0, stream>>>(
        in, bcx, kernel, state, per_slot, off, E, L, out, (int)dt);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
