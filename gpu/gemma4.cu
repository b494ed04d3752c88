/* gemma4: Gemma 4's kernels beside a gemma3 layer's (see gemma4.cuh).
 * Built with --fmad=false so every product rounds as the CPU backend's;
 * the norms sum squares in double, as cpu_rmsnorm_rows does. */
#include "geglu.cuh"
#include "gemma4.cuh"
#include "qblocks.cuh"

#define G4_THREADS 256

/* 1 / rms of row x (n wide) with eps, cpu_rmsnorm_rows's: squares summed in
 * double, 1 / sqrtf(mean + eps). v(i) gives element i. */
template <typename F> __device__ __forceinline__ float inv_rms(F v, int32_t n, float eps) {
    __shared__ double red[32];
    double sum = 0.0;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float a = v(e);
        sum += (double)(a * a);
    }
    sum = kg_block_sum_d(sum, red);
    return 1.0f / sqrtf((float)(sum / (double)n) + eps);
}

/* grid (tokens, layers): one P-wide slice per block. The token table is
 * elements of dt (QT 0), or a native type's GGUF blocks read 8 weights a
 * thread, each the BF16 value the expansion would have stored (P a
 * multiple of 8). */
template <int QT>
__global__ void __launch_bounds__(G4_THREADS) pl_inputs_kernel(kg_cuda_inputs_t in,
                                                               float *__restrict__ pl_in,
                                                               const float *__restrict__ norm_w,
                                                               const void *__restrict__ emb,
                                                               const uint8_t *__restrict__ tail,
                                                               int dt,
                                                               int32_t n_layer,
                                                               int32_t P,
                                                               float proj_scale,
                                                               float tok_scale,
                                                               float in_scale,
                                                               float eps) {
    const int32_t t = blockIdx.x, l = blockIdx.y;
    if (t >= in.hdr->n_tokens) {
        return;
    }
    const int64_t NP = (int64_t)n_layer * P;
    float *s = pl_in + t * NP + (int64_t)l * P;
    /* per_layer_model_proj's output times 1/sqrt(n_embd) (ggml_scale), then
     * its RMSNorm over the layer's slice */
    const float scale = inv_rms([&](int32_t e) { return s[e] * proj_scale; }, P, eps);
    const int64_t row = (int64_t)in.token[t] * NP + (int64_t)l * P;
    /* s[e] from the token table's value at row + e */
    auto join = [&](int32_t e, float tv) {
        const float v = ((s[e] * proj_scale) * scale) * norm_w[e];
        const float tok = tv * tok_scale;
        s[e] = (v + tok) * in_scale;
    };
    if constexpr (QT == 0) {
        for (int32_t e = threadIdx.x; e < P; e += blockDim.x) {
            join(e, kg_ld(emb, row + e, dt));
        }
    } else {
        constexpr kg_cuda_qlayout_t L = kg_cuda_qlayout(QT);
        for (int32_t e = threadIdx.x * 8; e < P; e += blockDim.x * 8) {
            const int64_t i = row + e; /* whole rows of blocks: i / elems is the block */
            qpiece<QT> p;
            p.load((const uint8_t *)emb, tail, i / L.elems, (int)(i % L.elems));
            float f[8];
            p.expand((int)(i % L.elems), f);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                join(e + j, __uint_as_float((uint32_t)kg_q_bf16(f[j]) << 16));
            }
        }
    }
}

kg_status_t kg_cuda_g4_pl_inputs(cudaStream_t stream,
                                 int32_t n_launch,
                                 kg_cuda_inputs_t in,
                                 float *pl_in,
                                 const float *norm_w,
                                 const void *emb,
                                 kg_cuda_dtype_t dt,
                                 int qtype,
                                 const void *emb_tail,
                                 int32_t n_layer,
                                 int32_t P,
                                 float proj_scale,
                                 float tok_scale,
                                 float in_scale,
                                 float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    if (qtype != 0 && P % 8 != 0) {
        return KG_ERR_INVALID; /* the upload expands such a table */
    }
    const dim3 grid((unsigned)n_launch, (unsigned)n_layer);
    const uint8_t *tail = (const uint8_t *)emb_tail;
    return kg_q_dispatch(qtype, [&](auto qt) {
        pl_inputs_kernel<decltype(qt)::value>
            <<<grid, G4_THREADS, 0, stream>>>(in, pl_in, norm_w, emb, tail, (int)dt, n_layer, P,
                                              proj_scale, tok_scale, in_scale, eps);
        KG_CUDA_CHECK_LAUNCH();
        return KG_OK;
    });
}

__global__ void pl_gate_kernel(const kg_cuda_step_hdr_t *hdr,
                               const float *__restrict__ gate,
                               const float *__restrict__ pl_in,
                               const uint16_t *__restrict__ table,
                               int32_t il,
                               int32_t n_layer,
                               int32_t P,
                               void *__restrict__ h,
                               int dt,
                               int64_t total) {
    const int64_t rows = (int64_t)hdr->n_tokens * P;
    const int64_t end = rows < total ? rows : total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / P, e = i % P;
        const float u = pl_in[t * n_layer * P + (int64_t)il * P + e];
        kg_st(h, i, kg_cuda_geglu1(table, gate[i], u), dt);
    }
}

kg_status_t kg_cuda_g4_pl_gate(cudaStream_t stream,
                               int32_t n_launch,
                               const kg_cuda_step_hdr_t *hdr,
                               const float *gate,
                               const float *pl_in,
                               const uint16_t *table,
                               int32_t il,
                               int32_t n_layer,
                               int32_t P,
                               void *h,
                               kg_cuda_dtype_t dt) {
    const int64_t total = (int64_t)n_launch * P;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    pl_gate_kernel<<<(unsigned)blocks, 256, 0, stream>>>(hdr, gate, pl_in, table, il, n_layer, P, h,
                                                         (int)dt, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

/* one block per row */
__global__ void __launch_bounds__(G4_THREADS) residual_kernel(const kg_cuda_step_hdr_t *hdr,
                                                              float *__restrict__ x,
                                                              const float *__restrict__ add,
                                                              const float *__restrict__ w,
                                                              float out_scale,
                                                              int32_t n,
                                                              float eps) {
    const int32_t t = blockIdx.x;
    if (t >= hdr->n_tokens) {
        return;
    }
    float *xr = x + (int64_t)t * n;
    const float *a = add + (int64_t)t * n;
    const float scale = inv_rms([&](int32_t e) { return a[e]; }, n, eps);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const float v = xr[e] + (a[e] * scale) * w[e]; /* cpu_rows_residual */
        xr[e] = out_scale != 0.0f ? v * out_scale : v;
    }
}

kg_status_t kg_cuda_g4_residual(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                float *x,
                                const float *add,
                                const float *w,
                                float out_scale,
                                int32_t n,
                                float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    residual_kernel<<<n_launch, G4_THREADS, 0, stream>>>(hdr, x, add, w, out_scale, n, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void __launch_bounds__(G4_THREADS) router_in_kernel(const kg_cuda_step_hdr_t *hdr,
                                                               const float *__restrict__ x,
                                                               const float *__restrict__ s,
                                                               void *__restrict__ y,
                                                               int dt,
                                                               int32_t n,
                                                               float eps) {
    const int32_t t = blockIdx.x;
    if (t >= hdr->n_tokens) {
        return;
    }
    const float *xr = x + (int64_t)t * n;
    const float scale = inv_rms([&](int32_t e) { return xr[e]; }, n, eps);
    const float inv_sqrt_n = 1.0f / sqrtf((float)n);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        kg_st(y, (int64_t)t * n + e, ((xr[e] * scale) * inv_sqrt_n) * s[e], dt);
    }
}

kg_status_t kg_cuda_g4_router_in(cudaStream_t stream,
                                 int32_t n_launch,
                                 const kg_cuda_step_hdr_t *hdr,
                                 const float *x,
                                 const float *s,
                                 void *y,
                                 kg_cuda_dtype_t dt,
                                 int32_t n,
                                 float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    router_in_kernel<<<n_launch, G4_THREADS, 0, stream>>>(hdr, x, s, y, (int)dt, n, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void expert_scale_kernel(const int32_t *__restrict__ row_tok,
                                    const int32_t *__restrict__ tile_expert,
                                    float *__restrict__ y,
                                    const float *__restrict__ scale,
                                    int32_t n,
                                    int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / n;
        if (row_tok[r] < 0) {
            continue; /* padding: never read */
        }
        y[i] = y[i] * scale[tile_expert[r / KG_CUDA_MOE_TILE]];
    }
}

kg_status_t kg_cuda_g4_expert_scale(
    cudaStream_t stream, const kg_cuda_moe_plan_t *plan, float *y, const float *scale, int32_t n) {
    const int64_t total = (int64_t)plan->rows_cap * n;
    if (total <= 0) {
        return KG_OK;
    }
    int64_t blocks = (total + 255) / 256;
    blocks = blocks > 65536 ? 65536 : blocks;
    expert_scale_kernel<<<(unsigned)blocks, 256, 0, stream>>>(plan->row_tok, plan->tile_expert, y,
                                                              scale, n, total);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}

__global__ void __launch_bounds__(G4_THREADS) moe_join_kernel(const kg_cuda_step_hdr_t *hdr,
                                                              float *__restrict__ moe,
                                                              const float *__restrict__ w,
                                                              const float *__restrict__ dense,
                                                              int32_t n,
                                                              float eps) {
    const int32_t t = blockIdx.x;
    if (t >= hdr->n_tokens) {
        return;
    }
    float *m = moe + (int64_t)t * n;
    const float *d = dense + (int64_t)t * n;
    const float scale = inv_rms([&](int32_t e) { return m[e]; }, n, eps);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        m[e] = d[e] + (m[e] * scale) * w[e]; /* ggml_add(cur_mlp, cur_moe) */
    }
}

kg_status_t kg_cuda_g4_moe_join(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                float *moe,
                                const float *w,
                                const float *dense,
                                int32_t n,
                                float eps) {
    if (n_launch <= 0) {
        return KG_OK;
    }
    moe_join_kernel<<<n_launch, G4_THREADS, 0, stream>>>(hdr, moe, w, dense, n, eps);
    KG_CUDA_CHECK_LAUNCH();
    return KG_OK;
}
