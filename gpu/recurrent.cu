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

// ---- the gated DeltaNet (cpu_deltanet.c) ----

/* One thread per (token, V head): beta = sigmoid, g = softplus(alpha +
 * dt_bias) * a (ggml's softplus threshold of 20) into gates (rows, 2 HV);
 * qwen3next's ssm_ba parted per K head. */
__global__ void dn_gates_kernel(kg_cuda_inputs_t in,
                                kg_cuda_dn_shape_t sh,
                                const float *__restrict__ dt_b,
                                const float *__restrict__ a,
                                const float *__restrict__ buf,
                                int64_t W,
                                int64_t at,
                                float *gates) {
    const int32_t t = blockIdx.x, HV = sh.HV, r = sh.HV / sh.HK;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const float *raw = buf + (int64_t)t * W + at;
    float *out = gates + (int64_t)t * 2 * HV;
    for (int32_t h = threadIdx.x; h < HV; h += blockDim.x) {
        float b, x;
        if (sh.ba) { /* per K head: its r betas, then its r alphas */
            const float *ba = raw + (h / r) * 2 * r;
            b = ba[h % r];
            x = ba[r + h % r];
        } else {
            b = raw[h];
            x = raw[HV + h];
        }
        x = x + dt_b[h];
        out[h] = 1.0f / (1.0f + expf(-b));
        out[HV + h] = (x > 20.0f ? x : logf(1.0f + expf(x))) * a[h];
    }
}

/* One thread per conv channel, every token in batch order: the window is
 * the slot's K - 1 previous inputs; SiLU after (cpu_deltanet's conv_task). */
__global__ void dn_conv_kernel(kg_cuda_inputs_t in,
                               const float *__restrict__ conv,
                               float *buf,
                               int64_t W,
                               int32_t CH,
                               int32_t K,
                               float *state,
                               int64_t per_slot,
                               int64_t off) {
    const int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= CH) {
        return;
    }
    const int32_t T = in.hdr->n_tokens;
    const float *k = conv + (int64_t)c * K;
    for (int32_t t = 0; t < T; t++) {
        float *x = buf + (int64_t)t * W + c;
        float *win = state + (int64_t)in.seq[t] * per_slot + off + (int64_t)c * (K - 1);
        *x = kg_silu(kg_conv_step(win, k, K, *x));
    }
}

/* One warp per (token, q or k head): ggml_rms_norm with eps / S, then
 * times 1 / sqrt(S) (build_gdn_l2_norm); squares summed in double as
 * cpu_rmsnorm_rows. */
__global__ void dn_l2_kernel(kg_cuda_inputs_t in, float *buf, int64_t W, int32_t S, float eps) {
    const int32_t t = blockIdx.x, head = blockIdx.y;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    float *x = buf + (int64_t)t * W + (int64_t)head * S;
    double sum = 0.0;
    for (int32_t i = threadIdx.x; i < S; i += 32) {
        sum += (double)(x[i] * x[i]);
    }
    sum = kg_warp_sum_d(sum);
    const float mean = (float)(sum / (double)S);
    const float scale = 1.0f / sqrtf(mean + eps / (float)S), l2 = 1.0f / sqrtf((float)S);
    for (int32_t i = threadIdx.x; i < S; i += 32) {
        x[i] = (x[i] * scale) * l2;
    }
}

/* One warp per row r of V head h's matrix (the weights of value r, stored
 * as ggml_gated_delta_net keeps them), every token in batch order: m *= eg;
 * delta = (v[r] - m . k) * beta; m += k * delta; o[r] = (m . q) / sqrt(S).
 * A row reads and writes only itself, so rows run side by side. */
__global__ void dn_delta_kernel(kg_cuda_inputs_t in,
                                kg_cuda_dn_shape_t sh,
                                const float *__restrict__ buf,
                                int64_t W,
                                const float *__restrict__ gates,
                                float *state,
                                int64_t per_slot,
                                int64_t off,
                                float *o) {
    const int64_t row_id = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int32_t lane = threadIdx.x & 31, S = sh.S, HK = sh.HK, HV = sh.HV;
    if (row_id >= (int64_t)HV * S) {
        return;
    }
    const int32_t h = (int32_t)(row_id / S), r = (int32_t)(row_id % S);
    const int32_t kh = sh.v_grouped ? h / (HV / HK) : h % HK;
    const int32_t T = in.hdr->n_tokens, VD = HV * S;
    const float scale = 1.0f / sqrtf((float)S);
    for (int32_t t = 0; t < T; t++) {
        const float *row = buf + (int64_t)t * W;
        const float *q = row + (int64_t)kh * S, *k = row + (int64_t)(HK + kh) * S;
        const float v = row[(int64_t)2 * HK * S + (int64_t)h * S + r];
        const float b = gates[(int64_t)t * 2 * HV + h];
        const float eg = expf(gates[(int64_t)t * 2 * HV + HV + h]);
        float *m = state + (int64_t)in.seq[t] * per_slot + off + ((int64_t)h * S + r) * S;
        float s = 0.0f;
        for (int32_t i = lane; i < S; i += 32) {
            const float x = m[i] * eg;
            m[i] = x;
            s += x * k[i];
        }
        const float delta = (v - kg_warp_sum(s)) * b;
        s = 0.0f;
        for (int32_t i = lane; i < S; i += 32) {
            const float x = m[i] + k[i] * delta;
            m[i] = x;
            s += x * q[i];
        }
        s = kg_warp_sum(s);
        if (lane == 0) {
            o[(int64_t)t * VD + (int64_t)h * S + r] = s * scale;
        }
    }
}

/* One warp per (token, V head): o RMS-normed (eps), times ssm_norm, times
 * silu(z) (build_norm_gated), stored as dt. */
__global__ void dn_out_kernel(kg_cuda_inputs_t in,
                              const float *__restrict__ o,
                              const float *__restrict__ buf,
                              int64_t W,
                              int64_t z_at,
                              const float *__restrict__ norm,
                              int32_t S,
                              int32_t HV,
                              float eps,
                              void *act,
                              int dt) {
    const int32_t t = blockIdx.x, h = blockIdx.y;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t VD = (int64_t)HV * S;
    const float *x = o + (int64_t)t * VD + (int64_t)h * S;
    const float *z = buf + (int64_t)t * W + z_at + (int64_t)h * S;
    double sum = 0.0;
    for (int32_t i = threadIdx.x; i < S; i += 32) {
        sum += (double)(x[i] * x[i]);
    }
    sum = kg_warp_sum_d(sum);
    const float mean = (float)(sum / (double)S);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int32_t i = threadIdx.x; i < S; i += 32) {
        kg_st(act, (int64_t)t * VD + (int64_t)h * S + i, ((x[i] * scale) * norm[i]) * kg_silu(z[i]),
              dt);
    }
}

kg_status_t kg_cuda_deltanet(cudaStream_t stream,
                             int32_t n_launch,
                             kg_cuda_inputs_t in,
                             const kg_cuda_dn_shape_t *sh,
                             const kg_cuda_dn_layer_t *L,
                             float *buf,
                             float *gates,
                             float *o,
                             void *act,
                             kg_cuda_dtype_t dt) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    const int32_t S = sh->S, HK = sh->HK, HV = sh->HV, K = sh->K;
    const int32_t CH = 2 * HK * S + HV * S, VD = HV * S;
    const int64_t W = (int64_t)CH + VD + 2 * HV, gate_at = (int64_t)CH + VD;
    const int64_t conv_floats = (int64_t)(K - 1) * CH;
    dn_gates_kernel<<<(unsigned)n_launch, 64, 0, stream>>>(in, *sh, L->dt_b, L->a, buf, W, gate_at,
                                                           gates);
    KG_CUDA_CHECK_LAUNCH();
    dn_conv_kernel<<<(unsigned)((CH + 127) / 128), 128, 0, stream>>>(in, L->conv, buf, W, CH, K,
                                                                     L->state, L->per_slot, L->off);
    KG_CUDA_CHECK_LAUNCH();
    dn_l2_kernel<<<dim3((unsigned)n_launch, (unsigned)(2 * HK)), 32, 0, stream>>>(in, buf, W, S,
                                                                                  sh->eps);
    KG_CUDA_CHECK_LAUNCH();
    const int64_t rows = (int64_t)HV * S;
    dn_delta_kernel<<<(unsigned)((rows + 3) / 4), 128, 0, stream>>>(
        in, *sh, buf, W, gates, L->state, L->per_slot, L->off + conv_floats, o);
    KG_CUDA_CHECK_LAUNCH();
    dn_out_kernel<<<dim3((unsigned)n_launch, (unsigned)HV), 32, 0, stream>>>(
        in, o, buf, W, CH, L->norm, S, HV, sh->eps, act, (int)dt);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void attn_gate_kernel(const kg_cuda_step_hdr_t *hdr,
                                 const float *__restrict__ gate,
                                 int64_t stride,
                                 void *att,
                                 int dt,
                                 int32_t n_q,
                                 int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * n_q;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n_q, e = i % n_q;
        const float g = gate[t * stride + e];
        kg_st(att, i, kg_ld(att, i, dt) * (1.0f / (1.0f + expf(-g))), dt);
    }
}

kg_status_t kg_cuda_attn_gate(cudaStream_t stream,
                              int32_t n_launch,
                              const kg_cuda_step_hdr_t *hdr,
                              const float *gate,
                              int64_t stride,
                              void *att,
                              kg_cuda_dtype_t dt,
                              int32_t n_q) {
    const int64_t total = (int64_t)n_launch * n_q;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    attn_gate_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, gate, stride, att, (int)dt, n_q,
                                                           total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

// ---- Mamba-2 (cpu_mamba2.c) ----

/* One thread per conv channel (x, B, C), every token in batch order: the
 * window's sum (kg_conv_step), the bias, SiLU (ggml_ssm_conv, ggml_add,
 * ggml_silu). */
__global__ void m2_conv_kernel(kg_cuda_inputs_t in,
                               kg_cuda_m2_shape_t sh,
                               const float *__restrict__ conv,
                               const float *__restrict__ conv_b,
                               float *buf,
                               float *state,
                               int64_t per_slot,
                               int64_t off) {
    const int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t n_conv = sh.DI + 2 * sh.G * sh.DS, K = sh.K;
    if (c >= n_conv) {
        return;
    }
    const int64_t W = (int64_t)sh.DI + n_conv + sh.H;
    const int32_t T = in.hdr->n_tokens;
    const float *k = conv + (int64_t)c * K;
    const float b = conv_b ? conv_b[c] : 0.0f;
    for (int32_t t = 0; t < T; t++) {
        float *x = buf + (int64_t)t * W + sh.DI + c;
        float *win = state + (int64_t)in.seq[t] * per_slot + off + (int64_t)c * (K - 1);
        *x = kg_silu(kg_conv_step(win, k, K, *x) + b);
    }
}

/* One thread per inner channel ii (head h = ii / head_dim, its group's B
 * and C), every token in batch order: dt = softplus(dt + dt_bias), dA =
 * exp(dt A), each of the channel's d_state values s = s dA + B (x dt), y =
 * sum of s C in ascending order (ggml's scalar ssm_scan), then (y + x D)
 * silu(z) into y (F32). */
__global__ void m2_scan_kernel(kg_cuda_inputs_t in,
                               kg_cuda_m2_shape_t sh,
                               const float *__restrict__ dt_b,
                               const float *__restrict__ a,
                               const float *__restrict__ d,
                               const float *__restrict__ buf,
                               float *state,
                               int64_t per_slot,
                               int64_t off,
                               float *y) {
    const int32_t ii = blockIdx.x * blockDim.x + threadIdx.x;
    if (ii >= sh.DI) {
        return;
    }
    const int32_t DS = sh.DS, n_conv = sh.DI + 2 * sh.G * sh.DS;
    const int32_t h = ii / (sh.DI / sh.H), g = h / (sh.H / sh.G);
    const int64_t W = (int64_t)sh.DI + n_conv + sh.H;
    const int32_t T = in.hdr->n_tokens;
    for (int32_t t = 0; t < T; t++) {
        const float *row = buf + (int64_t)t * W;
        const float *z = row, *x = row + sh.DI, *B = x + sh.DI + (int64_t)g * DS;
        const float *C = x + sh.DI + (int64_t)sh.G * DS + (int64_t)g * DS;
        const float dt = row[sh.DI + n_conv + h] + dt_b[h];
        const float dt_sp = dt > 20.0f ? dt : logf(1.0f + expf(dt));
        const float dA = expf(dt_sp * a[h]);
        const float x_dt = x[ii] * dt_sp;
        float *si = state + (int64_t)in.seq[t] * per_slot + off + (int64_t)ii * DS;
        float sum = 0.0f;
        for (int32_t i0 = 0; i0 < DS; i0++) {
            const float v = (si[i0] * dA) + (B[i0] * x_dt);
            sum += v * C[i0];
            si[i0] = v;
        }
        const float xd = x[ii] * d[h];
        const float yd = sum + xd;
        y[(int64_t)t * sh.DI + ii] = kg_silu(z[ii]) * yd;
    }
}

/* One warp per (token, group): the group's d_inner / G channels RMS-normed
 * (eps) times its part of ssm_norm, stored as dt. */
__global__ void m2_norm_kernel(kg_cuda_inputs_t in,
                               const float *__restrict__ y,
                               const float *__restrict__ norm,
                               int32_t DI,
                               int32_t gs,
                               float eps,
                               void *act,
                               int dt) {
    const int32_t t = blockIdx.x, g = blockIdx.y;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const float *x = y + (int64_t)t * DI + (int64_t)g * gs;
    const float *w = norm + (int64_t)g * gs;
    double sum = 0.0;
    for (int32_t i = threadIdx.x; i < gs; i += 32) {
        sum += (double)(x[i] * x[i]);
    }
    sum = kg_warp_sum_d(sum);
    const float mean = (float)(sum / (double)gs);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int32_t i = threadIdx.x; i < gs; i += 32) {
        kg_st(act, (int64_t)t * DI + (int64_t)g * gs + i, (x[i] * scale) * w[i], dt);
    }
}

kg_status_t kg_cuda_mamba2(cudaStream_t stream,
                           int32_t n_launch,
                           kg_cuda_inputs_t in,
                           const kg_cuda_m2_shape_t *sh,
                           const kg_cuda_m2_layer_t *L,
                           float *buf,
                           float *y,
                           void *act,
                           kg_cuda_dtype_t dt) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    /* the launch configurations name locals only (cuemu's launch parser
     * reads a '->' there as a closing bracket) */
    const int32_t n_conv = sh->DI + 2 * sh->G * sh->DS, DI = sh->DI, G = sh->G;
    const int64_t conv_floats = (int64_t)(sh->K - 1) * n_conv;
    m2_conv_kernel<<<(unsigned)((n_conv + 127) / 128), 128, 0, stream>>>(
        in, *sh, L->conv, L->conv_b, buf, L->state, L->per_slot, L->off);
    KG_CUDA_CHECK_LAUNCH();
    m2_scan_kernel<<<(unsigned)((DI + 127) / 128), 128, 0, stream>>>(
        in, *sh, L->dt_b, L->a, L->d, buf, L->state, L->per_slot, L->off + conv_floats, y);
    KG_CUDA_CHECK_LAUNCH();
    m2_norm_kernel<<<dim3((unsigned)n_launch, (unsigned)G), 32, 0, stream>>>(
        in, y, L->norm, sh->DI, sh->DI / sh->G, sh->eps, act, (int)dt);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
