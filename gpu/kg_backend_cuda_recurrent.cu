/* kg_backend_cuda_recurrent: a hybrid model's recurrent layers on the CUDA
 * backend (the CPU backend's cpu_recurrent.c): the per-slot states in
 * device memory, the position each has reached (host), the snapshots of
 * the prefix cache, forks, and each layer's mixer as kernels
 * (recurrent.cuh) between its projections' GEMMs.
 *
 * A slot's state is every recurrent layer's state side by side, F32, laid
 * out as the CPU backend lays it out, so kg_backend_state_bytes_per_seq
 * holds for both. Copies, saves and restores are device-to-device copies on
 * the backend's stream, ordered with the steps. The position check runs on
 * the host before a step is packed (a token that does not continue its
 * slot fails that sequence alone); the zeroing of a slot that starts over
 * runs on the device inside the step, so a decode graph holds it too. */
#include "kg_backend_cuda_int.cuh"

struct cuda_rec {
    float *state;     /* (n_slots, per_slot) device */
    int64_t per_slot; /* floats of one slot's state */
    int64_t *off;     /* (n_layer) layer il's state in a slot's */
    int32_t *pos;     /* (n_slots) host: the position each slot's state expects next */
    int32_t *next;    /* (n_slots) the same while a step's tokens are checked */
    int32_t n_slots;
    float *snap;       /* (n_snaps, per_slot) device: saved states */
    int32_t *snap_pos; /* (n_snaps) host */
    int32_t n_snaps;
    float *in;    /* (T, in_w) F32: the in-projection's output */
    int64_t in_w; /* the widest in-projection of the layers */
    void *act;    /* (T, act_w) the out-projection's input, in its type */
    int64_t act_w;
    float *o;     /* (T, d_inner) the DeltaNet's delta-rule output (NULL: no DeltaNet layer) */
    float *gates; /* (T, 2 V heads) its beta | g */
};

static kg_status_t rec_fail(char *errstr, size_t errstr_size, const char *what) {
    snprintf(errstr, errstr_size, "cuda backend: %s for the recurrent layers failed (see the log)",
             what);
    return KG_ERR_BACKEND;
}

/* Room for n states (the new ones zero); drops the captured graphs when the
 * buffer moves. */
static kg_status_t grow(cuda_ctx_t *ctx, int32_t n) {
    cuda_rec_t *r = ctx->rec;
    if (n <= r->n_slots) {
        return KG_OK;
    }
    int32_t *pos = (int32_t *)realloc(r->pos, (size_t)n * sizeof(int32_t));
    if (pos) {
        r->pos = pos;
    }
    int32_t *next = pos ? (int32_t *)realloc(r->next, (size_t)n * sizeof(int32_t)) : NULL;
    if (next) {
        r->next = next;
    }
    if (!pos || !next) {
        KG_LOG_ERROR("cuda", "out of host memory for %d recurrent states", n);
        return KG_ERR_NOMEM;
    }
    const size_t per = (size_t)r->per_slot * sizeof(float);
    float *st = NULL;
    KG_CUDA_CHECK(cudaMalloc((void **)&st, (size_t)n * per));
    if (r->n_slots > 0) {
        KG_CUDA_CHECK(cudaMemcpyAsync(st, r->state, (size_t)r->n_slots * per,
                                      cudaMemcpyDeviceToDevice, ctx->stream));
    }
    KG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    KG_CUDA_CHECK(cudaMemset(st + (size_t)r->n_slots * (size_t)r->per_slot, 0,
                             (size_t)(n - r->n_slots) * per));
    cudaFree(r->state);
    r->state = st;
    for (int32_t s = r->n_slots; s < n; s++) {
        r->pos[s] = 0;
    }
    r->n_slots = n;
    /* the graphs hold the old buffer: capture them again */
    for (int i = 0; i < ctx->n_buckets; i++) {
        if (ctx->buckets[i].exec) {
            cudaGraphExecDestroy(ctx->buckets[i].exec);
            ctx->buckets[i].exec = NULL;
        }
        if (ctx->buckets[i].state == BUCKET_GRAPH) {
            ctx->buckets[i].state = BUCKET_NEW;
        }
    }
    return KG_OK;
}

kg_status_t
cuda_rec_init(cuda_ctx_t *ctx, int32_t n_slots, int32_t n_snaps, char *errstr, size_t errstr_size) {
    const kg_model_t *model = ctx->model;
    const kg_hparams_t *hp = &ctx->hp;
    if (!kg_model_is_recurrent(model)) {
        return KG_OK;
    }
    cuda_rec_t *r = (cuda_rec_t *)calloc(1, sizeof(*r));
    ctx->rec = r;
    if (!r || !(r->off = (int64_t *)calloc((size_t)hp->n_layer, sizeof(*r->off)))) {
        snprintf(errstr, errstr_size, "cuda backend: out of memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        r->off[il] = r->per_slot;
        r->per_slot += kg_model_state_floats(model, il);
        r->in_w = L->rin.n_out > r->in_w ? L->rin.n_out : r->in_w;
        r->act_w = L->rout.n_in > r->act_w ? L->rout.n_in : r->act_w;
    }
    const size_t T = (size_t)ctx->max_tokens;
    size_t es = 2;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        es = ctx->layers[il].rout.data && ctx->layers[il].rout.dt == KG_CUDA_F32 ? 4 : es;
    }
    if (cudaMalloc((void **)&r->in, T * (size_t)r->in_w * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&r->act, T * (size_t)r->act_w * es) != cudaSuccess) {
        return rec_fail(errstr, errstr_size, "allocating the step buffers");
    }
    ctx->scratch_size += T * (size_t)r->in_w * sizeof(float) + T * (size_t)r->act_w * es;
    bool deltanet = false, mamba2 = false;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        deltanet = deltanet || model->layers[il].kind == KG_LAYER_DELTANET;
        mamba2 = mamba2 || model->layers[il].kind == KG_LAYER_MAMBA2;
    }
    if (deltanet || mamba2) { /* o: the DeltaNet's delta-rule output, or Mamba-2's y */
        const size_t n = T * (size_t)hp->ssm_d_inner * sizeof(float);
        const size_t ng = T * 2 * (size_t)hp->ssm_dt_rank * sizeof(float);
        if (cudaMalloc((void **)&r->o, n) != cudaSuccess ||
            cudaMalloc((void **)&r->gates, ng) != cudaSuccess) {
            return rec_fail(errstr, errstr_size, "allocating the step buffers");
        }
        ctx->scratch_size += n + ng;
    }
    if (n_slots > 0 && grow(ctx, n_slots) != KG_OK) {
        snprintf(errstr, errstr_size,
                 "cuda backend: allocating the recurrent states of %d slots (%zu MiB) failed",
                 (int)n_slots, ((size_t)n_slots * (size_t)r->per_slot * sizeof(float)) >> 20);
        return KG_ERR_BACKEND;
    }
    if (n_snaps > 0) {
        const size_t size = (size_t)n_snaps * (size_t)r->per_slot * sizeof(float);
        r->snap_pos = (int32_t *)calloc((size_t)n_snaps, sizeof(int32_t));
        if (!r->snap_pos || cudaMalloc((void **)&r->snap, size) != cudaSuccess ||
            cudaMemset(r->snap, 0, size) != cudaSuccess) {
            snprintf(errstr, errstr_size,
                     "cuda backend: allocating %d recurrent state snapshots (%zu MiB) failed",
                     (int)n_snaps, size >> 20);
            return KG_ERR_BACKEND;
        }
        r->n_snaps = n_snaps;
    }
    return KG_OK;
}

void cuda_rec_free(cuda_ctx_t *ctx) {
    cuda_rec_t *r = ctx->rec;
    if (!r) {
        return;
    }
    cudaFree(r->state);
    cudaFree(r->snap);
    cudaFree(r->in);
    cudaFree(r->act);
    cudaFree(r->o);
    cudaFree(r->gates);
    free(r->off);
    free(r->pos);
    free(r->next);
    free(r->snap_pos);
    free(r);
    ctx->rec = NULL;
}

size_t cuda_rec_size(const cuda_ctx_t *ctx, bool snapshots) {
    const cuda_rec_t *r = ctx->rec;
    return r ? (size_t)(snapshots ? r->n_snaps : r->n_slots) * (size_t)r->per_slot * sizeof(float)
             : 0;
}

kg_status_t cuda_rec_begin(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    cuda_rec_t *r = ctx->rec;
    if (!r) {
        return KG_OK;
    }
    /* pack_inputs checks the slots again, with the step's other faults */
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        if (batch->seq[t] < 0 || batch->seq[t] >= batch->n_slots) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                              "bad batch entry %d: slot %d of %d", t, batch->seq[t],
                              batch->n_slots);
        }
    }
    KG_TRY(grow(ctx, batch->n_slots));
    /* every token continues its slot: position 0 starts it, any other is
     * the one after the slot's previous token (in this step or before) */
    memcpy(r->next, r->pos, (size_t)r->n_slots * sizeof(int32_t));
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const int32_t s = batch->seq[t], p = batch->pos[t], want = r->next[s];
        r->next[s] = p + 1;
        if (p != 0 && p != want) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, s, -1,
                              "cuda: slot %d's recurrent state does not continue at this token "
                              "(position %d, the state is at %d)",
                              s, p, want);
        }
    }
    return KG_OK;
}

void cuda_rec_end(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    cuda_rec_t *r = ctx->rec;
    for (int32_t t = 0; r && t < batch->n_tokens; t++) {
        r->pos[batch->seq[t]] = batch->pos[t] + 1;
    }
}

kg_status_t cuda_rec_reset(cuda_ctx_t *ctx, int32_t rows) {
    const cuda_rec_t *r = ctx->rec;
    return r ? kg_cuda_rec_reset(ctx->stream, rows, kg_cuda_inputs_view(ctx->d_in, rows), r->state,
                                 r->per_slot)
             : KG_OK;
}

kg_status_t cuda_rec_mixer(cuda_ctx_t *ctx, int32_t il, int32_t rows) {
    cuda_rec_t *r = ctx->rec;
    const cuda_layer_t *L = &ctx->layers[il];
    const kg_hparams_t *hp = &ctx->hp;
    const kg_cuda_inputs_t in = kg_cuda_inputs_view(ctx->d_in, rows);
    cudaStream_t st = ctx->stream;
    KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->rin, ctx->xn, r->in, rows));
    switch (ctx->model->layers[il].kind) {
    case KG_LAYER_SHORTCONV:
        KG_TRY(kg_cuda_shortconv(st, in, r->in, L->rconv, r->state, r->per_slot, r->off[il],
                                 hp->n_embd, hp->shortconv_l_cache, r->act, L->rout.dt));
        break;
    case KG_LAYER_DELTANET: {
        const kg_cuda_dn_shape_t sh = {hp->ssm_d_state,   hp->ssm_n_group,
                                       hp->ssm_dt_rank,   hp->ssm_d_conv,
                                       hp->ssm_v_grouped, ctx->model->layers[il].ssm_ba != NULL,
                                       hp->norm_eps};
        const kg_cuda_dn_layer_t dl = {L->rconv, L->dt_b,     L->ssm_a,  L->ssm_norm,
                                       r->state, r->per_slot, r->off[il]};
        KG_TRY(kg_cuda_deltanet(st, rows, in, &sh, &dl, r->in, r->gates, r->o, r->act, L->rout.dt));
        break;
    }
    case KG_LAYER_MAMBA2: {
        const kg_cuda_m2_shape_t sh = {hp->ssm_d_inner, hp->ssm_d_state, hp->ssm_dt_rank,
                                       hp->ssm_n_group, hp->ssm_d_conv,  hp->norm_eps};
        const kg_cuda_m2_layer_t ml = {L->rconv,    L->conv_b, L->dt_b,     L->ssm_a,  L->ssm_d,
                                       L->ssm_norm, r->state,  r->per_slot, r->off[il]};
        KG_TRY(kg_cuda_mamba2(st, rows, in, &sh, &ml, r->in, r->o, r->act, L->rout.dt));
        break;
    }
    case KG_LAYER_FFN:
    case KG_LAYER_ATTN:
        KG_LOG_ERROR("cuda", "layer %d: no CUDA mixer for its kind", (int)il);
        return KG_ERR_UNSUPPORTED;
    }
    return kg_cuda_gemm(&ctx->blas, st, &L->rout, r->act, ctx->tmp, rows);
}

// ---- the state API ----

kg_status_t cuda_state_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    cuda_rec_t *r = ctx->rec;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    int32_t top = 0;
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || dst[i] < 0 || src[i] == dst[i]) {
            return KG_ERR_INVALID;
        }
        top = src[i] > top ? src[i] : top;
        top = dst[i] > top ? dst[i] : top;
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess || grow(ctx, top + 1) != KG_OK) {
        return cuda_mark_dead(ctx, "growing the recurrent states");
    }
    const size_t per = (size_t)r->per_slot;
    for (int32_t i = 0; i < n; i++) {
        if (cudaMemcpyAsync(r->state + (size_t)dst[i] * per, r->state + (size_t)src[i] * per,
                            per * sizeof(float), cudaMemcpyDeviceToDevice,
                            ctx->stream) != cudaSuccess) {
            return cuda_mark_dead(ctx, "the recurrent state copy");
        }
        r->pos[dst[i]] = r->pos[src[i]];
    }
    return KG_OK;
}

kg_status_t cuda_state_save(kg_backend_t *be, int32_t slot, int32_t snap, bool restore) {
    cuda_ctx_t *ctx = (cuda_ctx_t *)be->ctx;
    cuda_rec_t *r = ctx->rec;
    if (ctx->dead) {
        return KG_ERR_BACKEND;
    }
    if (!r || snap < 0 || snap >= r->n_snaps || slot < 0) {
        return KG_ERR_INVALID;
    }
    if (cudaSetDevice(ctx->device) != cudaSuccess || grow(ctx, slot + 1) != KG_OK) {
        return cuda_mark_dead(ctx, "growing the recurrent states");
    }
    const size_t per = (size_t)r->per_slot;
    float *s = r->state + (size_t)slot * per, *p = r->snap + (size_t)snap * per;
    if (cudaMemcpyAsync(restore ? s : p, restore ? p : s, per * sizeof(float),
                        cudaMemcpyDeviceToDevice, ctx->stream) != cudaSuccess) {
        return cuda_mark_dead(ctx, restore ? "restoring a recurrent state snapshot"
                                           : "saving a recurrent state snapshot");
    }
    if (restore) {
        r->pos[slot] = r->snap_pos[snap];
    } else {
        r->snap_pos[snap] = r->pos[slot];
    }
    return KG_OK;
}
