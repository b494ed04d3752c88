/* lora: LoRA adapters on the CUDA backend (issue 27), as the CPU backend
 * runs them (src/backend/cpu/cpu_lora.h): after each base projection (one
 * GEMM over every row) each adapter adds s·(x·Aᵀ)·Bᵀ to the rows that use it.
 *
 * Memory. An adapter's pairs are uploaded when the engine adds it (every
 * pair in one allocation, in the device type the base's weights would get:
 * F32 and F16 stay, BF16 stays, Q8_0 becomes BF16) and freed when it is
 * removed (the engine's --max-loras eviction). A device table holds one
 * descriptor per (adapter slot, layer, projection): the pair's pointers,
 * rank, types and alpha; kernels look a row's adapter up there.
 *
 * A step. The host groups the step's (token, adapter) entries by adapter
 * in increasing id order, tokens in order within a group, cuts each group
 * into tiles of LORA_TILE entries, and lists each token's entries in id
 * order; that plan goes to the device with one copy. Per adapted
 * projection (Q, K, V together; gate and up together):
 *   shrink  one block per (tile, LORA_WARPS rank rows, projection): each
 *           warp reads one row of the group's A once for the tile's entries
 *           (the grouping: A is read once per LORA_TILE rows), lanes over
 *           the input in a fixed stride, then a fixed shuffle tree: mid(e, r)
 *           = x[token(e)] · A[r], x rounded to A's type as the CPU rounds it.
 *   expand  one thread per (token, output column, projection): for the
 *           token's entries in id order, d = mid(e) rounded to B's type · B[j]
 *           in rank order, out += d·s (the product rounded, then added, as
 *           ggml_scale then ggml_add; this file builds with --fmad=false).
 *           B is small (n_out × rank) and a step's few adapters' B stay in
 *           L2, so reading it per token costs little DRAM traffic, and the
 *           adds of one row's adapters happen in id order in one thread.
 *
 * Batch invariance. Every number a row gets is computed from its own input
 * and its own adapters in a fixed order (the tile only decides which rows
 * share a read of A, never how a row's sums run), so a row's result does
 * not depend on its batch mates or on the other adapters in the step.
 *
 * Graphs. A step that uses an adapter runs eagerly (its plan's shape
 * changes from step to step); steps without adapters keep their graphs,
 * which hold no LoRA launch. */
#include "kg_backend_cuda_int.cuh"

#define LORA_TILE  8   /* entries of one adapter per shrink block */
#define LORA_WARPS 8   /* rank rows per shrink block, one per warp */
#define LORA_COLS  256 /* output columns per expand block */
#define LORA_MAX_Y 65535

/* One adapted projection of one adapter (device table). */
typedef struct lora_desc {
    const void *a; /* (rank, n_in) type dt_a; NULL: this projection is not adapted */
    const void *b; /* (n_out, rank) type dt_b */
    int32_t rank, dt_a, dt_b;
    float alpha; /* adapter.lora.alpha; 0: the user's scale as it is */
} lora_desc_t;

typedef struct lora_adapter {
    int32_t id, slot;
    void *mem;    /* device: every pair */
    size_t bytes; /* counted in weights_size while added */
} lora_adapter_t;

struct cuda_lora {
    lora_adapter_t *ad; /* (n_ad) in increasing id order */
    int32_t n_ad, cap_ad, next_id;
    int32_t *count;      /* (cap_ad) a step's entries per adapter */
    lora_desc_t *d_desc; /* (cap_slots, n_layer, KG_LORA_N_PROJ) */
    bool *slot_used;     /* (cap_slots) */
    int32_t cap_slots;
    int32_t max_rank;    /* mid's row width */
    float *mid;          /* (3, e_cap, max_rank) x·Aᵀ per entry and projection */
    int32_t e_cap;       /* KG_LORA_SET_MAX * max_tokens */
    int32_t *h_plan;     /* pinned: the step's plan (plan_view) */
    int32_t *d_plan;     /* its device copy */
    cudaEvent_t ev_plan; /* the last plan copy has been read */
    int32_t n_entries, n_tiles, n_tokens;
};

/* The plan's arrays in one buffer of plan_ints(e_cap, T) int32s. */
typedef struct lora_plan_view {
    int32_t *e_tok;   /* (e_cap) token of entry e */
    int32_t *e_slot;  /* (e_cap) its adapter's slot */
    float *e_scale;   /* (e_cap) the user's scale */
    int32_t *tok_ent; /* (T, KG_LORA_SET_MAX) a token's entries in id order, -1 after */
    int32_t *tile_e0; /* (e_cap) first entry of tile i (a tile lies in one group) */
    int32_t *tile_n;  /* (e_cap) entries of tile i */
} lora_plan_view_t;

static size_t plan_ints(int32_t e_cap, int32_t T) {
    return 5 * (size_t)e_cap + (size_t)KG_LORA_SET_MAX * (size_t)T;
}

static lora_plan_view_t plan_view(int32_t *base, int32_t e_cap, int32_t T) {
    lora_plan_view_t v;
    v.e_tok = base;
    v.e_slot = v.e_tok + e_cap;
    v.e_scale = (float *)(v.e_slot + e_cap);
    v.tok_ent = (int32_t *)v.e_scale + e_cap;
    v.tile_e0 = v.tok_ent + (size_t)KG_LORA_SET_MAX * T;
    v.tile_n = v.tile_e0 + e_cap;
    return v;
}

/* x rounded to a weight type, as the CPU rounds the activations it feeds
 * that weight (cpu_round_activations). */
__device__ __forceinline__ float round_to(float x, int dt) {
    if (dt == KG_CUDA_F16) {
        return __half2float(__float2half_rn(x));
    }
    if (dt == KG_CUDA_BF16) {
        return __bfloat162float(__float2bfloat16_rn(x));
    }
    return x;
}

__global__ void __launch_bounds__(LORA_WARPS * 32)
    lora_shrink_kernel(const lora_desc_t *__restrict__ desc,
                       int32_t slot_stride,
                       int32_t d0,
                       lora_plan_view_t plan,
                       const void *__restrict__ x,
                       int xdt,
                       int32_t n_in,
                       float *__restrict__ mid,
                       int32_t e_cap,
                       int32_t max_rank) {
    const int32_t tile = (int32_t)blockIdx.x, p = (int32_t)blockIdx.z;
    const int32_t warp = (int32_t)threadIdx.x / 32, lane = (int32_t)threadIdx.x % 32;
    const int32_t r = (int32_t)blockIdx.y * LORA_WARPS + warp;
    const int32_t e0 = plan.tile_e0[tile], n = plan.tile_n[tile];
    const lora_desc_t d = desc[(int64_t)plan.e_slot[e0] * slot_stride + d0 + p];
    if (!d.a || r >= d.rank) {
        return; /* the same for the whole warp */
    }
    int64_t xrow[LORA_TILE];
    float acc[LORA_TILE];
    for (int k = 0; k < LORA_TILE; k++) {
        xrow[k] = k < n ? (int64_t)plan.e_tok[e0 + k] * n_in : 0;
        acc[k] = 0.0f;
    }
    const int64_t arow = (int64_t)r * n_in;
    for (int32_t i = lane; i < n_in; i += 32) {
        const float a = kg_ld(d.a, arow + i, d.dt_a);
        for (int k = 0; k < LORA_TILE; k++) {
            if (k < n) {
                acc[k] += round_to(kg_ld(x, xrow[k] + i, xdt), d.dt_a) * a;
            }
        }
    }
    for (int k = 0; k < LORA_TILE; k++) {
        if (k < n) {
            const float s = kg_warp_sum(acc[k]);
            if (lane == 0) {
                mid[((int64_t)p * e_cap + e0 + k) * max_rank + r] = s;
            }
        }
    }
}

/* Where the projections of one launch write: out + token * stride + col[p],
 * n_out[p] columns. */
typedef struct lora_outs {
    float *out;
    int32_t stride;
    int32_t col[3], n_out[3];
} lora_outs_t;

__global__ void __launch_bounds__(LORA_COLS)
    lora_expand_kernel(const lora_desc_t *__restrict__ desc,
                       int32_t slot_stride,
                       int32_t d0,
                       lora_plan_view_t plan,
                       int32_t t0,
                       const float *__restrict__ mid,
                       int32_t e_cap,
                       int32_t max_rank,
                       lora_outs_t outs) {
    const int32_t t = t0 + (int32_t)blockIdx.y, p = (int32_t)blockIdx.z;
    const int32_t j = (int32_t)blockIdx.x * LORA_COLS + (int32_t)threadIdx.x;
    const int32_t *ent = plan.tok_ent + (int64_t)t * KG_LORA_SET_MAX;
    if (j >= outs.n_out[p] || ent[0] < 0) {
        return;
    }
    float *o = outs.out + (int64_t)t * outs.stride + outs.col[p] + j;
    float y = *o;
    for (int q = 0; q < KG_LORA_SET_MAX && ent[q] >= 0; q++) {
        const int32_t e = ent[q];
        const lora_desc_t d = desc[(int64_t)plan.e_slot[e] * slot_stride + d0 + p];
        if (!d.a) {
            continue;
        }
        const float *m = mid + ((int64_t)p * e_cap + e) * max_rank;
        const int64_t brow = (int64_t)j * d.rank;
        float acc = 0.0f;
        for (int32_t r = 0; r < d.rank; r++) {
            acc += round_to(m[r], d.dt_b) * kg_ld(d.b, brow + r, d.dt_b);
        }
        /* kg_lora_pair_scale's expression */
        const float s =
            d.alpha != 0.0f ? plan.e_scale[e] * d.alpha / (float)d.rank : plan.e_scale[e];
        y += acc * s;
    }
    *o = y;
}

// ---- adapters ----

static int32_t find_adapter(const cuda_lora_t *lo, int32_t id) {
    int32_t a = 0, b = lo->n_ad - 1;
    while (a <= b) { /* ids are sorted */
        const int32_t m = (a + b) / 2;
        if (lo->ad[m].id == id) {
            return m;
        }
        if (lo->ad[m].id < id) {
            a = m + 1;
        } else {
            b = m - 1;
        }
    }
    return -1;
}

void cuda_lora_free(cuda_ctx_t *ctx) {
    cuda_lora_t *lo = ctx->lora;
    if (!lo) {
        return;
    }
    for (int32_t i = 0; i < lo->n_ad; i++) {
        cudaFree(lo->ad[i].mem);
    }
    cudaFree(lo->d_desc);
    cudaFree(lo->mid);
    cudaFree(lo->d_plan);
    cudaFreeHost(lo->h_plan);
    if (lo->ev_plan) {
        cudaEventDestroy(lo->ev_plan);
    }
    free(lo->ad);
    free(lo->count);
    free(lo->slot_used);
    free(lo);
    ctx->lora = NULL;
}

/* The state and the plan's buffers, made on the first adapter. */
static kg_status_t state_new(cuda_ctx_t *ctx) {
    cuda_lora_t *lo = (cuda_lora_t *)calloc(1, sizeof(*lo));
    if (!lo) {
        return KG_ERR_NOMEM;
    }
    ctx->lora = lo;
    lo->e_cap = KG_LORA_SET_MAX * ctx->max_tokens;
    const size_t bytes = plan_ints(lo->e_cap, ctx->max_tokens) * sizeof(int32_t);
    KG_CUDA_CHECK(cudaMallocHost((void **)&lo->h_plan, bytes));
    KG_CUDA_CHECK(cudaMalloc((void **)&lo->d_plan, bytes));
    KG_CUDA_CHECK(cudaEventCreateWithFlags(&lo->ev_plan, cudaEventDisableTiming));
    ctx->scratch_size += bytes;
    return KG_OK;
}

/* Room for one more adapter on the host, a free device slot (the table
 * grown when full) and mid wide enough for rank. */
static kg_status_t make_room(cuda_ctx_t *ctx, int32_t rank, int32_t *slot) {
    cuda_lora_t *lo = ctx->lora;
    const size_t per_slot = (size_t)ctx->hp.n_layer * KG_LORA_N_PROJ * sizeof(lora_desc_t);
    if (lo->n_ad == lo->cap_ad) {
        const int32_t cap = lo->cap_ad ? 2 * lo->cap_ad : 8;
        lora_adapter_t *ad = (lora_adapter_t *)realloc(lo->ad, (size_t)cap * sizeof(*ad));
        if (!ad) {
            return KG_ERR_NOMEM;
        }
        lo->ad = ad;
        int32_t *count = (int32_t *)realloc(lo->count, (size_t)cap * sizeof(*count));
        if (!count) {
            return KG_ERR_NOMEM;
        }
        lo->count = count;
        lo->cap_ad = cap;
    }
    *slot = -1;
    for (int32_t s = 0; s < lo->cap_slots && *slot < 0; s++) {
        *slot = lo->slot_used[s] ? -1 : s;
    }
    if (*slot < 0) {
        const int32_t cap = lo->cap_slots ? 2 * lo->cap_slots : 8;
        bool *used = (bool *)realloc(lo->slot_used, (size_t)cap * sizeof(*used));
        if (!used) {
            return KG_ERR_NOMEM;
        }
        memset(used + lo->cap_slots, 0, (size_t)(cap - lo->cap_slots) * sizeof(*used));
        lo->slot_used = used;
        lora_desc_t *grown = NULL;
        KG_CUDA_CHECK(cudaMalloc((void **)&grown, (size_t)cap * per_slot));
        KG_CUDA_CHECK(cudaMemset(grown, 0, (size_t)cap * per_slot));
        if (lo->d_desc) {
            /* cudaMemcpy and cudaFree wait for the steps that read the old table */
            KG_CUDA_CHECK(cudaMemcpy(grown, lo->d_desc, (size_t)lo->cap_slots * per_slot,
                                     cudaMemcpyDeviceToDevice));
            KG_CUDA_CHECK(cudaFree(lo->d_desc));
        }
        ctx->scratch_size += (size_t)(cap - lo->cap_slots) * per_slot;
        lo->d_desc = grown;
        *slot = lo->cap_slots;
        lo->cap_slots = cap;
    }
    if (rank > lo->max_rank) {
        const size_t old = 3 * (size_t)lo->e_cap * (size_t)lo->max_rank * sizeof(float);
        const size_t size = 3 * (size_t)lo->e_cap * (size_t)rank * sizeof(float);
        KG_CUDA_CHECK(cudaFree(lo->mid)); /* waits for the steps that use it */
        lo->mid = NULL;
        lo->max_rank = 0;
        ctx->scratch_size -= old;
        KG_CUDA_CHECK(cudaMalloc((void **)&lo->mid, size));
        lo->max_rank = rank;
        ctx->scratch_size += size;
    }
    return KG_OK;
}

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static size_t tensor_bytes(const kg_gguf_tensor_t *t) {
    return (size_t)(t->ne[0] * t->ne[1]) *
           kg_cuda_dtype_size(kg_cuda_weight_dtype((kg_ggml_type_t)t->type));
}

/* Every pair of `lora` into one device allocation (*mem, *bytes), their
 * descriptors into desc (n_layer, KG_LORA_N_PROJ). */
static kg_status_t upload_pairs(const kg_lora_t *lora,
                                void **mem,
                                size_t *bytes,
                                lora_desc_t *desc,
                                char *errstr,
                                size_t errstr_size) {
    size_t total = 0, widest = 0;
    for (int32_t il = 0; il < lora->n_layer; il++) {
        for (int p = 0; p < KG_LORA_N_PROJ; p++) {
            const kg_lora_pair_t *pair = &lora->pairs[il][p];
            if (!pair->a) {
                continue;
            }
            const kg_gguf_tensor_t *ab[2] = {pair->a, pair->b};
            for (int h = 0; h < 2; h++) {
                total += align256(tensor_bytes(ab[h]));
                const size_t n = (size_t)(ab[h]->ne[0] * ab[h]->ne[1]);
                widest = n > widest ? n : widest;
            }
        }
    }
    /* host staging: the converted tensor (at most 4 bytes an element) and
     * kg_dequantize's floats */
    char *stage = (char *)malloc(widest * 8 + 1);
    if (!stage) {
        snprintf(errstr, errstr_size, "cuda backend: out of memory staging an adapter");
        return KG_ERR_NOMEM;
    }
    char *dev = NULL;
    if (cudaMalloc((void **)&dev, total ? total : 1) != cudaSuccess) {
        cudaGetLastError();
        free(stage);
        snprintf(errstr, errstr_size, "cuda backend: no device memory for an adapter of %zu MiB",
                 total >> 20);
        return KG_ERR_NOMEM;
    }
    size_t at = 0;
    kg_status_t st = KG_OK;
    for (int32_t il = 0; st == KG_OK && il < lora->n_layer; il++) {
        for (int p = 0; st == KG_OK && p < KG_LORA_N_PROJ; p++) {
            const kg_lora_pair_t *pair = &lora->pairs[il][p];
            lora_desc_t *d = &desc[il * KG_LORA_N_PROJ + p];
            if (!pair->a) {
                continue;
            }
            const kg_gguf_tensor_t *ab[2] = {pair->a, pair->b};
            for (int h = 0; h < 2; h++) {
                const kg_cuda_dtype_t dt = kg_cuda_weight_dtype((kg_ggml_type_t)ab[h]->type);
                const int64_t n = ab[h]->ne[0] * ab[h]->ne[1];
                kg_cuda_weight_convert((kg_ggml_type_t)ab[h]->type, ab[h]->data, n, dt, stage,
                                       (float *)(stage + widest * 4));
                if (cudaMemcpy(dev + at, stage, tensor_bytes(ab[h]), cudaMemcpyHostToDevice) !=
                    cudaSuccess) {
                    st = KG_ERR_BACKEND;
                    break;
                }
                if (h == 0) {
                    d->a = dev + at;
                    d->dt_a = (int32_t)dt;
                } else {
                    d->b = dev + at;
                    d->dt_b = (int32_t)dt;
                }
                at += align256(tensor_bytes(ab[h]));
            }
            d->rank = pair->rank;
            d->alpha = lora->alpha;
        }
    }
    free(stage);
    if (st != KG_OK) {
        cudaFree(dev);
        snprintf(errstr, errstr_size, "cuda backend: copying an adapter to the device failed");
        return st;
    }
    *mem = dev;
    *bytes = total;
    return KG_OK;
}

kg_status_t cuda_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    if (ctx->dead) {
        snprintf(errstr, errstr_size, "cuda backend: the device failed earlier");
        return KG_ERR_BACKEND;
    }
    if (ctx->hp.attn_out_gate) {
        /* the device's fused Q rows are regrouped (queries, then gates), an
         * adapter's Q delta is interleaved like the file's attn_q */
        snprintf(
            errstr, errstr_size,
            "cuda backend: no LoRA adapters on a %s model (gated attention); use --backend cpu",
            kg_arch_name(ctx->hp.arch));
        return KG_ERR_UNSUPPORTED;
    }
    if (ctx->mla) {
        /* the CPU backend adapts no MLA projection, only the dense layers'
         * FFNs; the CUDA backend's LoRA is not checked on this graph */
        snprintf(errstr, errstr_size,
                 "cuda backend: no LoRA adapters on a %s model (multi-head latent attention); "
                 "use --backend cpu",
                 kg_arch_name(ctx->hp.arch));
        return KG_ERR_UNSUPPORTED;
    }
    if (ctx->g4) {
        /* lora.cu takes one Q/K/V and FFN shape for every layer; Gemma 4's
         * windowed and global layers differ, and its shared-KV layers have
         * no K/V projection (the CPU backend takes no adapter there either) */
        snprintf(errstr, errstr_size,
                 "cuda backend: no LoRA adapters on a %s model (per-layer head sizes and shared "
                 "K/V layers); neither backend runs them",
                 kg_arch_name(ctx->hp.arch));
        return KG_ERR_UNSUPPORTED;
    }
    if (lora->n_layer != ctx->hp.n_layer) {
        snprintf(errstr, errstr_size, "cuda backend: adapter for %d layers, the model has %d",
                 lora->n_layer, ctx->hp.n_layer);
        return KG_ERR_INVALID;
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess) {
        snprintf(errstr, errstr_size, "cuda backend: cudaSetDevice failed");
        return KG_ERR_BACKEND;
    }
    if (!ctx->lora && state_new(ctx) != KG_OK) {
        cuda_lora_free(ctx);
        snprintf(errstr, errstr_size, "cuda backend: no memory for the LoRA step buffers");
        return KG_ERR_NOMEM;
    }
    cuda_lora_t *lo = ctx->lora;
    /* a caller's id (an adapter reloaded after an eviction keeps its id,
     * so its rows keep their place in the delta order) or the next */
    const int32_t want = *id >= 0 ? *id : lo->next_id;
    if (find_adapter(lo, want) >= 0) {
        snprintf(errstr, errstr_size, "cuda backend: adapter id %d is taken", want);
        return KG_ERR_INVALID;
    }
    int32_t slot = -1;
    kg_status_t st = make_room(ctx, lora->max_rank, &slot);
    if (st != KG_OK) {
        snprintf(errstr, errstr_size, "cuda backend: no memory for another adapter");
        return st == KG_ERR_BACKEND ? st : KG_ERR_NOMEM;
    }
    const size_t n_desc = (size_t)ctx->hp.n_layer * KG_LORA_N_PROJ;
    lora_desc_t *desc = (lora_desc_t *)calloc(n_desc, sizeof(*desc));
    if (!desc) {
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        return KG_ERR_NOMEM;
    }
    lora_adapter_t ad = {want, slot, NULL, 0};
    st = upload_pairs(lora, &ad.mem, &ad.bytes, desc, errstr, errstr_size);
    if (st == KG_OK && cudaMemcpy(lo->d_desc + (size_t)slot * n_desc, desc, n_desc * sizeof(*desc),
                                  cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(ad.mem);
        snprintf(errstr, errstr_size, "cuda backend: copying an adapter's table failed");
        st = KG_ERR_BACKEND;
    }
    free(desc);
    if (st != KG_OK) {
        return st;
    }
    int32_t at = lo->n_ad;
    while (at > 0 && lo->ad[at - 1].id > want) {
        at--;
    }
    memmove(&lo->ad[at + 1], &lo->ad[at], (size_t)(lo->n_ad - at) * sizeof(lo->ad[0]));
    lo->ad[at] = ad;
    lo->n_ad++;
    lo->slot_used[slot] = true;
    lo->next_id = want >= lo->next_id ? want + 1 : lo->next_id;
    ctx->weights_size += ad.bytes;
    *id = want;
    return KG_OK;
}

void cuda_lora_remove(kg_backend_t *be, int32_t id) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    cuda_lora_t *lo = ctx->lora;
    const int32_t i = lo ? find_adapter(lo, id) : -1;
    if (i < 0) {
        return;
    }
    cudaSetDevice(ctx->device);
    /* cudaFree waits for the queued steps that may still read it */
    if (cudaFree(lo->ad[i].mem) != cudaSuccess) {
        KG_LOG_ERROR("cuda", "freeing adapter %d failed: %s", id,
                     cudaGetErrorName(cudaGetLastError()));
    }
    ctx->weights_size -= lo->ad[i].bytes; /* an evicted adapter's memory is back */
    lo->slot_used[lo->ad[i].slot] = false;
    memmove(&lo->ad[i], &lo->ad[i + 1], (size_t)(lo->n_ad - i - 1) * sizeof(lo->ad[0]));
    lo->n_ad--;
}

// ---- the step ----

kg_status_t cuda_lora_plan(cuda_ctx_t *ctx, const kg_step_batch_t *batch, bool *used) {
    cuda_lora_t *lo = ctx->lora;
    *used = false;
    if (lo) {
        lo->n_entries = lo->n_tiles = 0;
    }
    if (!batch->slot_lora) {
        return KG_OK;
    }
    const int32_t T = batch->n_tokens;
    int32_t n_used = 0;
    for (int32_t t = 0; t < T; t++) {
        const int32_t seq = batch->seq[t];
        if (seq < 0 || seq >= batch->n_slots) {
            continue; /* pack_inputs refuses the step */
        }
        const kg_lora_set_t *set = &batch->slot_lora[seq];
        if (set->n == 0) {
            continue;
        }
        if (!lo || set->n < 0 || set->n > KG_LORA_SET_MAX) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                              "slot %d: %d adapters, none loaded", seq, set->n);
        }
        if (n_used == 0) {
            memset(lo->count, 0, (size_t)lo->n_ad * sizeof(int32_t));
        }
        for (int32_t q = 0; q < set->n; q++) {
            const int32_t a = find_adapter(lo, set->id[q]);
            if (a < 0) {
                return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                                  "slot %d uses adapter %d, which is not loaded", seq, set->id[q]);
            }
            lo->count[a]++;
            n_used++;
        }
    }
    if (n_used == 0) {
        return KG_OK;
    }
    /* the previous plan's copy must be done before its pinned buffer is rewritten */
    KG_CUDA_CHECK(cudaEventSynchronize(lo->ev_plan));
    const lora_plan_view_t v = plan_view(lo->h_plan, lo->e_cap, ctx->max_tokens);
    for (int32_t i = 0; i < T * KG_LORA_SET_MAX; i++) {
        v.tok_ent[i] = -1;
    }
    int32_t e = 0, nt = 0;
    for (int32_t a = 0; a < lo->n_ad; a++) {
        if (lo->count[a] == 0) {
            continue;
        }
        const int32_t id = lo->ad[a].id, g0 = e;
        for (int32_t t = 0; t < T; t++) {
            const int32_t seq = batch->seq[t];
            if (seq < 0 || seq >= batch->n_slots) {
                continue;
            }
            const kg_lora_set_t *set = &batch->slot_lora[seq];
            for (int32_t q = 0; q < set->n; q++) {
                if (set->id[q] != id) {
                    continue;
                }
                v.e_tok[e] = t;
                v.e_slot[e] = lo->ad[a].slot;
                v.e_scale[e] = set->scale[q];
                int32_t k = 0; /* adapters come in id order: the token's next free place */
                while (v.tok_ent[t * KG_LORA_SET_MAX + k] >= 0) {
                    k++;
                }
                v.tok_ent[t * KG_LORA_SET_MAX + k] = e;
                e++;
            }
        }
        for (int32_t s = g0; s < e; s += LORA_TILE) {
            v.tile_e0[nt] = s;
            v.tile_n[nt] = e - s < LORA_TILE ? e - s : LORA_TILE;
            nt++;
        }
    }
    KG_CUDA_CHECK(cudaMemcpyAsync(lo->d_plan, lo->h_plan,
                                  plan_ints(lo->e_cap, ctx->max_tokens) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KG_CUDA_CHECK(cudaEventRecord(lo->ev_plan, ctx->stream));
    lo->n_entries = e;
    lo->n_tiles = nt;
    lo->n_tokens = T;
    *used = true;
    return KG_OK;
}

kg_status_t cuda_lora_apply(cuda_ctx_t *ctx,
                            int32_t il,
                            kg_lora_proj_t first,
                            int n,
                            const void *x,
                            kg_cuda_dtype_t xdt,
                            int32_t n_in,
                            float *out,
                            int32_t stride,
                            const int32_t *col,
                            const int32_t *n_out) {
    const cuda_lora_t *lo = ctx->lora;
    if (!lo || lo->n_entries == 0) {
        return KG_OK;
    }
    const lora_plan_view_t v = plan_view(lo->d_plan, lo->e_cap, ctx->max_tokens);
    const int32_t slot_stride = ctx->hp.n_layer * KG_LORA_N_PROJ;
    const int32_t d0 = il * KG_LORA_N_PROJ + (int32_t)first;
    lora_outs_t outs;
    outs.out = out;
    outs.stride = stride;
    int32_t widest = 0;
    for (int p = 0; p < 3; p++) {
        outs.col[p] = p < n ? col[p] : 0;
        outs.n_out[p] = p < n ? n_out[p] : 0;
        widest = outs.n_out[p] > widest ? outs.n_out[p] : widest;
    }
    const dim3 g1((unsigned)lo->n_tiles, (unsigned)((lo->max_rank + LORA_WARPS - 1) / LORA_WARPS),
                  (unsigned)n);
    lora_shrink_kernel<<<g1, LORA_WARPS * 32, 0, ctx->stream>>>(
        lo->d_desc, slot_stride, d0, v, x, (int)xdt, n_in, lo->mid, lo->e_cap, lo->max_rank);
    KG_CUDA_CHECK_LAUNCH();
    for (int32_t t0 = 0; t0 < lo->n_tokens; t0 += LORA_MAX_Y) {
        const int32_t nt = lo->n_tokens - t0 < LORA_MAX_Y ? lo->n_tokens - t0 : LORA_MAX_Y;
        const dim3 g2((unsigned)((widest + LORA_COLS - 1) / LORA_COLS), (unsigned)nt, (unsigned)n);
        lora_expand_kernel<<<g2, LORA_COLS, 0, ctx->stream>>>(
            lo->d_desc, slot_stride, d0, v, t0, lo->mid, lo->e_cap, lo->max_rank, outs);
        KG_CUDA_CHECK_LAUNCH();
    }
    return KG_OK;
}
