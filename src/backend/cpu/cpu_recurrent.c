/* cpu_recurrent: recurrent layers and their per-slot states (see the
 * header). LFM2's short convolution follows llama.cpp's lfm2.cpp and
 * ggml_ssm_conv: in_proj gives B, C and x; the window of the last l_cache
 * values of B * x (the state's l_cache - 1, then the token's) is dotted
 * with the channel's kernel in ascending order, one float sum as
 * ggml_ssm_conv keeps it; C times that goes through out_proj. Qwen3.5's
 * gated DeltaNet is cpu_deltanet.c's (its weights in cpu_layer_t.dn, its
 * step scratch here); the Mamba-2 mixer (granitehybrid, nemotron_h) is
 * cpu_mamba2.c's, likewise. */
#include "cpu_recurrent.h"

#include "../../core/kg_log.h"
#include "../../model/kg_quant.h"
#include "../kg_math.h"
#include "cpu_deltanet.h"
#include "cpu_mamba2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_rec {
    float *state;     /* (n_slots, per_slot) */
    int64_t per_slot; /* floats of one slot's state */
    int64_t *off;     /* (n_layer) layer il's state in a slot's */
    int32_t *pos;     /* (n_slots) the position each slot's state expects next */
    int32_t *next;    /* (n_slots) the same while a step's tokens are checked */
    int32_t n_slots;
    float *snap;       /* (n_snaps, per_slot) saved states (the engine's prefix cache) */
    int32_t *snap_pos; /* (n_snaps) */
    int32_t n_snaps;
    float *bcx; /* (T, 3 n_embd) a short convolution's in_proj output, then C * conv */
    float *dn;  /* DeltaNet's step scratch (cpu_deltanet_scratch_floats), NULL: none */
    float *m2;  /* Mamba-2's scratch (cpu_mamba2_scratch_floats), or NULL */
};

bool cpu_recurrent_layer_init(
    cpu_ctx_t *ctx, int32_t il, cpu_layer_t *L, char *errstr, size_t errstr_size) {
    const kg_layer_weights_t *src = &ctx->model->layers[il];
    switch (src->kind) {
    case KG_LAYER_SHORTCONV: {
        if (!cpu_weight_init(&L->sc_in, src->sc_in_proj, ctx, errstr, errstr_size) ||
            !cpu_weight_init(&L->sc_out, src->sc_out_proj, ctx, errstr, errstr_size)) {
            return false;
        }
        const size_t n = (size_t)src->sc_conv->ne[0] * (size_t)src->sc_conv->ne[1];
        L->sc_conv = malloc(n * sizeof(float));
        if (!L->sc_conv) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            return false;
        }
        kg_dequantize(src->sc_conv->type, src->sc_conv->data, L->sc_conv, (int64_t)n);
        ctx->weights_size += n * sizeof(float);
        return true;
    }
    case KG_LAYER_DELTANET:
        return cpu_deltanet_layer_init(ctx, il, L, errstr, errstr_size);
    case KG_LAYER_MAMBA2:
        return cpu_mamba2_layer_init(ctx, il, L, errstr, errstr_size);
    case KG_LAYER_FFN: /* no mixer: nothing to pack */
        return true;
    case KG_LAYER_ATTN:
        break;
    }
    snprintf(errstr, errstr_size, "cpu backend: layer %d is not recurrent", (int)il);
    return false;
}

void cpu_recurrent_layer_clear(cpu_layer_t *L) {
    free(L->sc_conv);
    L->sc_conv = NULL;
    cpu_deltanet_layer_clear(L);
    cpu_mamba2_layer_clear(L);
}

/* Room for n_slots states (the new ones zero). */
static bool grow(struct cpu_rec *r, int32_t n_slots) {
    if (n_slots <= r->n_slots) {
        return true;
    }
    float *st = realloc(r->state, (size_t)n_slots * (size_t)r->per_slot * sizeof(float));
    if (!st) {
        return false;
    }
    r->state = st;
    int32_t *pos = realloc(r->pos, (size_t)n_slots * sizeof(int32_t));
    if (!pos) {
        return false;
    }
    r->pos = pos;
    int32_t *next = realloc(r->next, (size_t)n_slots * sizeof(int32_t));
    if (!next) {
        return false;
    }
    r->next = next;
    memset(r->state + (size_t)r->n_slots * (size_t)r->per_slot, 0,
           (size_t)(n_slots - r->n_slots) * (size_t)r->per_slot * sizeof(float));
    for (int32_t s = r->n_slots; s < n_slots; s++) {
        r->pos[s] = 0;
    }
    r->n_slots = n_slots;
    return true;
}

bool cpu_recurrent_init(
    cpu_ctx_t *ctx, int32_t n_slots, int32_t n_snaps, char *errstr, size_t errstr_size) {
    const kg_model_t *model = ctx->model;
    if (!kg_model_is_recurrent(model)) {
        return true;
    }
    struct cpu_rec *r = calloc(1, sizeof(*r));
    ctx->rec = r;
    if (!r || !(r->off = calloc((size_t)model->hp.n_layer, sizeof(*r->off)))) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory");
        return false;
    }
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        r->off[il] = r->per_slot;
        r->per_slot += kg_model_state_floats(model, il);
    }
    const size_t T = (size_t)ctx->max_tokens, E = (size_t)model->hp.n_embd;
    r->bcx = calloc(T * 3 * E, sizeof(float));
    ctx->scratch_size += T * 3 * E * sizeof(float);
    bool deltanet = false;
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        deltanet = deltanet || model->layers[il].kind == KG_LAYER_DELTANET;
    }
    if (deltanet) {
        const int64_t n = cpu_deltanet_scratch_floats(&model->hp, (int64_t)T);
        r->dn = calloc((size_t)n, sizeof(float));
        ctx->scratch_size += (size_t)n * sizeof(float);
        if (!r->dn) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            return false;
        }
    }
    bool mamba2 = false;
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        mamba2 = mamba2 || model->layers[il].kind == KG_LAYER_MAMBA2;
    }
    if (mamba2) {
        const size_t n = (size_t)cpu_mamba2_scratch_floats(&model->hp, (int64_t)T);
        r->m2 = calloc(n, sizeof(float));
        ctx->scratch_size += n * sizeof(float);
        if (!r->m2) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            return false;
        }
    }
    if (!r->bcx || !grow(r, n_slots > 0 ? n_slots : 0)) {
        snprintf(errstr, errstr_size,
                 "cpu backend: out of memory for the recurrent states (%zu MiB for %d slots)",
                 ((size_t)(n_slots > 0 ? n_slots : 0) * (size_t)r->per_slot * sizeof(float)) >> 20,
                 (int)n_slots);
        return false;
    }
    if (n_snaps > 0) {
        r->snap = calloc((size_t)n_snaps * (size_t)r->per_slot, sizeof(float));
        r->snap_pos = calloc((size_t)n_snaps, sizeof(int32_t));
        if (!r->snap || !r->snap_pos) {
            snprintf(errstr, errstr_size,
                     "cpu backend: out of memory for %d recurrent state snapshots (%zu MiB)",
                     (int)n_snaps, ((size_t)n_snaps * (size_t)r->per_slot * sizeof(float)) >> 20);
            return false;
        }
        r->n_snaps = n_snaps;
    }
    return true;
}

void cpu_recurrent_free(cpu_ctx_t *ctx) {
    struct cpu_rec *r = ctx->rec;
    if (r) {
        free(r->state);
        free(r->off);
        free(r->pos);
        free(r->next);
        free(r->bcx);
        free(r->snap);
        free(r->snap_pos);
        free(r->dn);
        free(r->m2);
        free(r);
        ctx->rec = NULL;
    }
}

size_t cpu_recurrent_size(const cpu_ctx_t *ctx, bool snapshots) {
    const struct cpu_rec *r = ctx->rec;
    if (!r) {
        return 0;
    }
    return (size_t)(snapshots ? r->n_snaps : r->n_slots) * (size_t)r->per_slot * sizeof(float);
}

kg_status_t cpu_recurrent_save(kg_backend_t *be, int32_t slot, int32_t snap, bool restore) {
    cpu_ctx_t *ctx = be->ctx;
    struct cpu_rec *r = ctx->rec;
    if (!r || snap < 0 || snap >= r->n_snaps || slot < 0) {
        return KG_ERR_INVALID;
    }
    if (!grow(r, slot + 1)) {
        return KG_ERR_NOMEM;
    }
    const size_t per = (size_t)r->per_slot;
    float *s = r->state + (size_t)slot * per, *p = r->snap + (size_t)snap * per;
    if (restore) {
        memcpy(s, p, per * sizeof(float));
        r->pos[slot] = r->snap_pos[snap];
    } else {
        memcpy(p, s, per * sizeof(float));
        r->snap_pos[snap] = r->pos[slot];
    }
    return KG_OK;
}

kg_status_t cpu_recurrent_begin(cpu_ctx_t *ctx, const kg_step_batch_t *batch, int32_t *bad_seq) {
    struct cpu_rec *r = ctx->rec;
    *bad_seq = -1;
    if (!r) {
        return KG_OK;
    }
    if (!grow(r, batch->n_slots)) {
        KG_LOG_ERROR("cpu", "out of memory for the recurrent states of %d slots", batch->n_slots);
        return KG_ERR_NOMEM;
    }
    /* every token continues its slot: position 0 starts it, any other is
     * the one after the slot's previous token (in this step or before) */
    memcpy(r->next, r->pos, (size_t)r->n_slots * sizeof(int32_t));
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        const int32_t s = batch->seq[t], p = batch->pos[t], want = r->next[s];
        r->next[s] = p + 1;
        if (p != 0 && p != want) {
            KG_LOG_ERROR("cpu",
                         "slot %d: token at position %d, but its recurrent state is at %d (a "
                         "recurrent model's sequence runs in order, from position 0)",
                         s, p, want);
            *bad_seq = s;
            return KG_ERR_INVALID;
        }
    }
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        if (batch->pos[t] == 0) {
            memset(r->state + (size_t)batch->seq[t] * (size_t)r->per_slot, 0,
                   (size_t)r->per_slot * sizeof(float));
        }
    }
    return KG_OK;
}

void cpu_recurrent_end(cpu_ctx_t *ctx, const kg_step_batch_t *batch) {
    struct cpu_rec *r = ctx->rec;
    for (int64_t t = 0; r && t < batch->n_tokens; t++) {
        r->pos[batch->seq[t]] = batch->pos[t] + 1;
    }
}

kg_status_t
cpu_recurrent_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    cpu_ctx_t *ctx = be->ctx;
    struct cpu_rec *r = ctx->rec;
    if (!r) {
        return KG_ERR_UNSUPPORTED;
    }
    int32_t top = 0;
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || dst[i] < 0 || src[i] == dst[i]) {
            return KG_ERR_INVALID;
        }
        top = src[i] > top ? src[i] : top;
        top = dst[i] > top ? dst[i] : top;
    }
    if (!grow(r, top + 1)) {
        return KG_ERR_NOMEM;
    }
    const size_t per = (size_t)r->per_slot;
    for (int32_t i = 0; i < n; i++) {
        memcpy(r->state + (size_t)dst[i] * per, r->state + (size_t)src[i] * per,
               per * sizeof(float));
        r->pos[dst[i]] = r->pos[src[i]];
    }
    return KG_OK;
}

// ---- LFM2's short convolution ----

typedef struct shortconv_job {
    const cpu_ctx_t *ctx;
    const kg_step_batch_t *batch;
    const float *kernel; /* (n_embd, L) */
    float *bcx;          /* (T, 3 E): B | C | x, C's third overwritten by C * conv */
    int64_t off;         /* the layer's state in a slot's */
    int64_t n_chunks;
} shortconv_job_t;

/* Channels [c0, c1) of every token, in batch order (position order
 * within a slot): the window is the state's L - 1 values and B * x. */
static void shortconv_task(void *arg, int64_t w, int thread) {
    (void)thread;
    const shortconv_job_t *j = arg;
    const struct cpu_rec *r = j->ctx->rec;
    const int64_t E = j->ctx->hp.n_embd, L = j->ctx->hp.shortconv_l_cache, T = j->batch->n_tokens;
    const int64_t c0 = E * w / j->n_chunks, c1 = E * (w + 1) / j->n_chunks;
    for (int64_t t = 0; t < T; t++) {
        float *row = j->bcx + t * 3 * E;
        float *st = r->state + (size_t)j->batch->seq[t] * (size_t)r->per_slot + j->off;
        for (int64_t c = c0; c < c1; c++) {
            float *win = st + c * (L - 1); /* (L - 1) oldest first */
            const float *k = j->kernel + c * L;
            row[E + c] *= kg_conv_step(win, k, L, row[c] * row[2 * E + c]); /* C * conv(B x) */
        }
    }
}

static void shortconv(cpu_ctx_t *ctx, int32_t il, const kg_step_batch_t *batch) {
    const cpu_layer_t *L = &ctx->layers[il];
    struct cpu_rec *r = ctx->rec;
    const int64_t T = batch->n_tokens, E = ctx->hp.n_embd;
    const cpu_weight_t *in[1] = {&L->sc_in};
    float *const out[1] = {r->bcx};
    cpu_matmul_n(ctx, 1, in, ctx->xn, out, T);
    int64_t n_chunks = (int64_t)ctx->n_threads * 4;
    n_chunks = n_chunks > E ? E : n_chunks;
    shortconv_job_t job = {.ctx = ctx,
                           .batch = batch,
                           .kernel = L->sc_conv,
                           .bcx = r->bcx,
                           .off = r->off[il],
                           .n_chunks = n_chunks};
    kg_pool_run(ctx->pool, n_chunks, shortconv_task, &job);
    /* out_proj on the C * conv thirds: gathered into xn, which the FFN's
     * norm rewrites next */
    for (int64_t t = 0; t < T; t++) {
        memcpy(ctx->xn + t * E, r->bcx + t * 3 * E + E, (size_t)E * sizeof(float));
    }
    const cpu_weight_t *o[1] = {&L->sc_out};
    float *const oo[1] = {ctx->tmp};
    cpu_matmul_n(ctx, 1, o, ctx->xn, oo, T);
}

void cpu_recurrent_mixer(cpu_ctx_t *ctx, int32_t il, const kg_step_batch_t *batch) {
    switch (ctx->model->layers[il].kind) {
    case KG_LAYER_SHORTCONV:
        shortconv(ctx, il, batch);
        return;
    case KG_LAYER_DELTANET: {
        struct cpu_rec *r = ctx->rec;
        cpu_deltanet_mixer(ctx, il, batch, r->state, r->per_slot, r->off[il], r->dn);
        return;
    }
    case KG_LAYER_MAMBA2: {
        struct cpu_rec *r = ctx->rec;
        cpu_mamba2_mixer(ctx, il, batch, r->m2, r->state + r->off[il], r->per_slot);
        return;
    }
    case KG_LAYER_ATTN:
    case KG_LAYER_FFN:
        break;
    }
}
