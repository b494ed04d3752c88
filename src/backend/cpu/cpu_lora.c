/* cpu_lora: LoRA adapters on the CPU backend (see cpu_lora.h). */
#include "cpu_lora.h"

#include "../../core/kg_log.h"
#include "../../model/kg_quant.h"
#include "cpu_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lora_weights {
    cpu_weight_t a, b; /* a: (r, n_in), b: (n_out, r); a.n_in == 0: not adapted */
    int32_t rank;
} lora_weights_t;

/* The A matrices of the pairs that share an input (Q, K, V; gate, up)
 * stacked into one: one product x·Aᵀ for the set instead of one per pair
 * (one rounding of x, and a product with enough output columns to fill the
 * GEMM's register tiles: a single rank-16 A is one panel, latency-bound).
 * Every output column is still its own chain over the input (cpu_gemm.h),
 * so the stacked product gives each pair's x·Aᵀ bit for bit. */
typedef struct lora_fused {
    cpu_weight_t a; /* (sum of the set's ranks, n_in); a.n_in == 0: not stacked */
    int32_t off[3]; /* where projection first + i's columns start in the product */
} lora_fused_t;

#define LORA_N_SETS 2 /* Q, K, V; gate, up */
static const kg_lora_proj_t k_set_first[LORA_N_SETS] = {KG_LORA_Q, KG_LORA_GATE};
static const int k_set_n[LORA_N_SETS] = {3, 2};

typedef struct lora_adapter {
    int32_t id;
    const kg_lora_t *lora;
    lora_weights_t (*w)[KG_LORA_N_PROJ]; /* (n_layer) */
    lora_fused_t (*fused)[LORA_N_SETS];  /* (n_layer) */
    size_t bytes;                        /* counted in weights_size while added */
} lora_adapter_t;

struct cpu_lora_state {
    lora_adapter_t *ad; /* (n_ad), in increasing id order */
    int32_t n_ad, cap_ad;
    int32_t *count; /* (cap_ad) a step's rows per adapter */
    int32_t next_id;
    int64_t widest; /* the widest projection input or output */
    /* the step's plan: groups in increasing id order, their rows */
    int32_t n_groups;
    int32_t *g_ad;    /* (KG_LORA_SET_MAX * max_tokens) adapter index of group g */
    int32_t *g_off;   /* (KG_LORA_SET_MAX * max_tokens + 1) group g's rows at [off[g], off[g+1]) */
    int32_t *rows;    /* (KG_LORA_SET_MAX * max_tokens) token index */
    float *row_scale; /* (KG_LORA_SET_MAX * max_tokens) the user's scale of that row */
    /* scratch for max_tokens rows */
    float *gx;   /* (T, widest) a group's inputs */
    float *mid;  /* (T, 3 max rank) x·Aᵀ (of a stacked set: the pairs side by side) */
    float *mid1; /* (T, max rank) one pair's columns of a stacked product */
    float *dy;   /* (T, widest) (x·Aᵀ)·Bᵀ */
    float *xr;   /* (T, widest) activations rounded for a float type */
    cpu_qact_t qa;
    cpu_qact_t *tqa; /* (n_threads) x (LORA_QROWS, widest): the side-by-side groups' */
    int64_t max_rank;
    bool exclusive; /* the step's rows use one adapter at most: groups may run side by side */
};

/* Rows a side-by-side group quantizes at a time (its own cpu_qact): the
 * rows are independent, so the chunking changes no result. */
#define LORA_QROWS 64

static void weights_clear(cpu_weight_t *w) {
    cpu_gemm_clear(&w->packed);
    memset(w, 0, sizeof(*w));
}

/* One half of a pair as the model's matrices are held: Q8_0 in place, the
 * float types packed. */
static bool weight_init(cpu_weight_t *w, const kg_gguf_tensor_t *t, size_t *bytes) {
    w->n_in = t->ne[0];
    w->n_out = t->ne[1];
    w->type = t->type;
    if (cpu_qtraits(t->type)) {
        *bytes += t->size;
        return cpu_qmat_init(&w->q, t->type, t->data, w->n_out, w->n_in);
    }
    if (!cpu_gemm_pack(&w->packed, t->type, t->data, w->n_out, w->n_in)) {
        return false;
    }
    *bytes += w->packed.size;
    return true;
}

static void adapter_clear(cpu_ctx_t *ctx, lora_adapter_t *ad) {
    for (int32_t il = 0; ad->w && il < ctx->hp.n_layer; il++) {
        for (int p = 0; p < KG_LORA_N_PROJ; p++) {
            weights_clear(&ad->w[il][p].a);
            weights_clear(&ad->w[il][p].b);
        }
    }
    for (int32_t il = 0; ad->fused && il < ctx->hp.n_layer; il++) {
        for (int s = 0; s < LORA_N_SETS; s++) {
            weights_clear(&ad->fused[il][s].a);
        }
    }
    free(ad->w);
    free(ad->fused);
    ad->w = NULL;
    ad->fused = NULL;
}

/* Stack the A of set s's pairs of layer il when at least two are present
 * and all are of one float type (quantized A stay apart: cpu_qmat reads the
 * file's blocks in place). false: out of memory. */
static bool fuse_set(lora_fused_t *f, const kg_lora_pair_t *pairs, int s, size_t *bytes) {
    const kg_lora_proj_t first = k_set_first[s];
    const kg_gguf_tensor_t *a0 = NULL;
    int64_t rows = 0;
    int n_present = 0;
    for (int i = 0; i < k_set_n[s]; i++) {
        const kg_gguf_tensor_t *a = pairs[first + i].a;
        if (!a) {
            continue;
        }
        if (cpu_qtraits(a->type) || (a0 && (a->type != a0->type || a->ne[0] != a0->ne[0]))) {
            return true;
        }
        a0 = a0 ? a0 : a;
        f->off[i] = (int32_t)rows;
        rows += a->ne[1];
        n_present++;
    }
    if (n_present < 2) {
        return true;
    }
    const size_t row_size = kg_type_row_size(a0->type, a0->ne[0]);
    char *stacked = malloc((size_t)rows * row_size);
    if (!stacked) {
        return false;
    }
    size_t at = 0;
    for (int i = 0; i < k_set_n[s]; i++) {
        const kg_gguf_tensor_t *a = pairs[first + i].a;
        if (a) {
            memcpy(stacked + at, a->data, (size_t)a->ne[1] * row_size);
            at += (size_t)a->ne[1] * row_size;
        }
    }
    const bool ok = cpu_gemm_pack(&f->a.packed, a0->type, stacked, rows, a0->ne[0]);
    free(stacked);
    if (!ok) {
        return false;
    }
    f->a.n_in = a0->ne[0];
    f->a.n_out = rows;
    f->a.type = a0->type;
    *bytes += f->a.packed.size;
    return true;
}

/* The state and its step scratch, made on the first adapter. */
static cpu_lora_state_t *state_new(cpu_ctx_t *ctx) {
    cpu_lora_state_t *st = calloc(1, sizeof(*st));
    if (!st) {
        return NULL;
    }
    const kg_hparams_t *hp = &ctx->hp;
    int64_t widest = hp->n_embd;
    const int64_t dims[] = {hp->n_ff, (int64_t)hp->n_head * hp->head_dim,
                            (int64_t)hp->n_head_kv * hp->head_dim};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        widest = dims[i] > widest ? dims[i] : widest;
    }
    st->widest = widest;
    const size_t T = (size_t)ctx->max_tokens, G = KG_LORA_SET_MAX * T;
    st->g_ad = malloc(G * sizeof(int32_t));
    st->g_off = malloc((G + 1) * sizeof(int32_t));
    st->rows = malloc(G * sizeof(int32_t));
    st->row_scale = malloc(G * sizeof(float));
    st->gx = malloc(T * (size_t)widest * sizeof(float));
    st->dy = malloc(T * (size_t)widest * sizeof(float));
    st->xr = malloc(T * (size_t)widest * sizeof(float));
    st->tqa = calloc((size_t)ctx->n_threads, sizeof(*st->tqa));
    bool ok = st->tqa != NULL;
    for (int i = 0; ok && i < ctx->n_threads; i++) {
        ok = cpu_qact_init(&st->tqa[i], LORA_QROWS, widest);
    }
    if (!ok || !st->g_ad || !st->g_off || !st->rows || !st->row_scale || !st->gx || !st->dy ||
        !st->xr || !cpu_qact_init(&st->qa, (int64_t)T, widest)) {
        ctx->lora = st;
        cpu_lora_free(ctx);
        return NULL;
    }
    ctx->scratch_size += T * (size_t)widest * 3 * sizeof(float) +
                         cpu_qact_size((int64_t)T, widest) +
                         (size_t)ctx->n_threads * cpu_qact_size(LORA_QROWS, widest);
    return st;
}

static int32_t find_adapter(const cpu_lora_state_t *st, int32_t id);

kg_status_t cpu_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size) {
    cpu_ctx_t *ctx = be->ctx;
    if (lora->n_layer != ctx->hp.n_layer) {
        snprintf(errstr, errstr_size, "cpu backend: adapter for %d layers, the model has %d",
                 lora->n_layer, ctx->hp.n_layer);
        return KG_ERR_INVALID;
    }
    if (!ctx->lora && !(ctx->lora = state_new(ctx))) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory for LoRA scratch");
        return KG_ERR_NOMEM;
    }
    cpu_lora_state_t *st = ctx->lora;
    if (lora->max_rank > st->widest) {
        snprintf(errstr, errstr_size, "cpu backend: adapter rank %d above the model's width %lld",
                 lora->max_rank, (long long)st->widest);
        return KG_ERR_INVALID;
    }
    if (lora->max_rank > st->max_rank) {
        const size_t row = (size_t)ctx->max_tokens * (size_t)lora->max_rank * sizeof(float);
        float *mid = realloc(st->mid, 3 * row);
        if (mid) {
            st->mid = mid;
        }
        float *mid1 = mid ? realloc(st->mid1, row) : NULL;
        if (!mid1) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory for LoRA scratch");
            return KG_ERR_NOMEM;
        }
        st->mid1 = mid1;
        st->max_rank = lora->max_rank;
    }
    if (st->n_ad == st->cap_ad) {
        int32_t cap = st->cap_ad ? 2 * st->cap_ad : 8;
        lora_adapter_t *grown = realloc(st->ad, (size_t)cap * sizeof(*grown));
        if (!grown) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            return KG_ERR_NOMEM;
        }
        st->ad = grown;
        int32_t *count = realloc(st->count, (size_t)cap * sizeof(*count));
        if (!count) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory");
            return KG_ERR_NOMEM;
        }
        st->count = count;
        st->cap_ad = cap;
    }
    /* a caller's id (kg_adapters: an adapter reloaded after an eviction keeps
     * its id, so its rows keep their place in the delta order) or the next */
    const int32_t want = *id >= 0 ? *id : st->next_id;
    if (find_adapter(st, want) >= 0) {
        snprintf(errstr, errstr_size, "cpu backend: adapter id %d is taken", want);
        return KG_ERR_INVALID;
    }
    lora_adapter_t ad = {.id = want, .lora = lora};
    ad.w = calloc((size_t)ctx->hp.n_layer, sizeof(*ad.w));
    ad.fused = calloc((size_t)ctx->hp.n_layer, sizeof(*ad.fused));
    bool ok = ad.w != NULL && ad.fused != NULL;
    size_t bytes = 0;
    for (int32_t il = 0; ok && il < ctx->hp.n_layer; il++) {
        bool stacked[KG_LORA_N_PROJ] = {false};
        for (int s = 0; ok && s < LORA_N_SETS; s++) {
            ok = fuse_set(&ad.fused[il][s], lora->pairs[il], s, &bytes);
            for (int i = 0; i < k_set_n[s]; i++) {
                stacked[k_set_first[s] + i] = ad.fused[il][s].a.n_in > 0;
            }
        }
        for (int p = 0; ok && p < KG_LORA_N_PROJ; p++) {
            const kg_lora_pair_t *pair = &lora->pairs[il][p];
            lora_weights_t *lw = &ad.w[il][p];
            if (!pair->a) {
                continue;
            }
            if (stacked[p]) { /* its A lives in the stack: only the shape here */
                lw->a.n_in = pair->a->ne[0];
                lw->a.n_out = pair->a->ne[1];
                lw->a.type = pair->a->type;
            } else {
                ok = weight_init(&lw->a, pair->a, &bytes);
            }
            ok = ok && weight_init(&lw->b, pair->b, &bytes);
            lw->rank = pair->rank;
        }
    }
    if (!ok) {
        adapter_clear(ctx, &ad);
        snprintf(errstr, errstr_size, "cpu backend: out of memory packing an adapter");
        return KG_ERR_NOMEM;
    }
    /* kept in id order */
    int32_t at = st->n_ad;
    while (at > 0 && st->ad[at - 1].id > want) {
        at--;
    }
    memmove(&st->ad[at + 1], &st->ad[at], (size_t)(st->n_ad - at) * sizeof(st->ad[0]));
    st->ad[at] = ad;
    st->n_ad++;
    st->next_id = want >= st->next_id ? want + 1 : st->next_id;
    ctx->weights_size += bytes;
    st->ad[at].bytes = bytes;
    *id = ad.id;
    return KG_OK;
}

void cpu_lora_remove(kg_backend_t *be, int32_t id) {
    cpu_ctx_t *ctx = be->ctx;
    cpu_lora_state_t *st = ctx->lora;
    for (int32_t i = 0; st && i < st->n_ad; i++) {
        if (st->ad[i].id == id) {
            ctx->weights_size -= st->ad[i].bytes; /* an evicted adapter's memory is back */
            adapter_clear(ctx, &st->ad[i]);
            memmove(&st->ad[i], &st->ad[i + 1], (size_t)(st->n_ad - i - 1) * sizeof(st->ad[0]));
            st->n_ad--;
            return;
        }
    }
}

void cpu_lora_free(cpu_ctx_t *ctx) {
    cpu_lora_state_t *st = ctx->lora;
    if (!st) {
        return;
    }
    for (int32_t i = 0; i < st->n_ad; i++) {
        adapter_clear(ctx, &st->ad[i]);
    }
    free(st->ad);
    free(st->count);
    free(st->g_ad);
    free(st->g_off);
    free(st->rows);
    free(st->row_scale);
    free(st->gx);
    free(st->mid);
    free(st->mid1);
    free(st->dy);
    free(st->xr);
    cpu_qact_clear(&st->qa);
    for (int i = 0; st->tqa && i < ctx->n_threads; i++) {
        cpu_qact_clear(&st->tqa[i]);
    }
    free(st->tqa);
    free(st);
    ctx->lora = NULL;
}

static int32_t find_adapter(const cpu_lora_state_t *st, int32_t id) {
    int32_t lo = 0, hi = st->n_ad - 1;
    while (lo <= hi) { /* ids are sorted */
        int32_t mid = (lo + hi) / 2;
        if (st->ad[mid].id == id) {
            return mid;
        }
        if (st->ad[mid].id < id) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return -1;
}

bool cpu_lora_plan(cpu_ctx_t *ctx, const kg_step_batch_t *batch) {
    cpu_lora_state_t *st = ctx->lora;
    if (st) {
        st->n_groups = 0;
        st->exclusive = true;
    }
    if (!batch->slot_lora) {
        return true;
    }
    int32_t n_used = 0;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const kg_lora_set_t *set = &batch->slot_lora[batch->seq[t]];
        if (set->n == 0) {
            continue;
        }
        if (!st || set->n < 0 || set->n > KG_LORA_SET_MAX) {
            KG_LOG_ERROR("cpu", "slot %d: %d adapters, none added", batch->seq[t], set->n);
            return false;
        }
        if (n_used == 0) {
            memset(st->count, 0, (size_t)st->n_ad * sizeof(int32_t));
        }
        for (int32_t j = 0; j < set->n; j++) {
            int32_t a = find_adapter(st, set->id[j]);
            if (a < 0) {
                KG_LOG_ERROR("cpu", "slot %d uses adapter %d, which is not loaded", batch->seq[t],
                             set->id[j]);
                return false;
            }
            st->count[a]++;
            n_used++;
        }
        st->exclusive = st->exclusive && set->n == 1;
    }
    if (n_used == 0) {
        return true;
    }
    /* groups: the adapters with rows, in id order */
    int32_t at = 0;
    for (int32_t a = 0; a < st->n_ad; a++) {
        if (st->count[a] > 0) {
            st->g_ad[st->n_groups] = a;
            st->g_off[st->n_groups] = at;
            st->n_groups++;
            at += st->count[a];
        }
    }
    st->g_off[st->n_groups] = at;
    /* each group's rows in token order */
    for (int32_t g = 0; g < st->n_groups; g++) {
        const int32_t id = st->ad[st->g_ad[g]].id;
        int32_t k = st->g_off[g];
        for (int32_t t = 0; t < batch->n_tokens; t++) {
            const kg_lora_set_t *set = &batch->slot_lora[batch->seq[t]];
            for (int32_t j = 0; j < set->n; j++) {
                if (set->id[j] == id) {
                    st->rows[k] = t;
                    st->row_scale[k] = set->scale[j];
                    k++;
                }
            }
        }
    }
    return true;
}

/* out(m, w->n_out) = in(m, w->n_in) · wᵀ with the activations rounded
 * (into xr) or quantized for w's type, as the base projections are. thread
 * < 0: the product over the pool; else on the calling pool thread alone,
 * with that thread's buffers (the same bits either way: cpu_gemm.h,
 * cpu_vecdot.h). */
static void mm(cpu_ctx_t *ctx,
               int thread,
               const cpu_weight_t *w,
               const float *in,
               float *xr,
               float *out,
               int64_t m) {
    cpu_lora_state_t *st = ctx->lora;
    if (w->q.tr) {
        const cpu_qmat_t *qm = &w->q;
        if (thread < 0) {
            cpu_quant_act(w->q.tr->act, in, m, w->n_in, &st->qa);
            cpu_qgemm(ctx->pool, ctx->qscratch, &st->qa, 1, &qm, &out);
            return;
        }
        for (int64_t r = 0; r < m; r += LORA_QROWS) {
            const int64_t n = m - r < LORA_QROWS ? m - r : LORA_QROWS;
            cpu_quant_act(w->q.tr->act, in + r * w->n_in, n, w->n_in, &st->tqa[thread]);
            float *o = out + r * w->n_out;
            cpu_qgemm_serial(ctx->qscratch, thread, &st->tqa[thread], 1, &qm, &o);
        }
        return;
    }
    const float *a = in;
    if (cpu_round_activations(w->type, in, xr, m, w->n_in)) {
        a = xr;
    }
    cpu_gemm(thread < 0 ? ctx->pool : NULL, a, &w->packed, out, m);
}

/* o += d * s (the delta is a scratch row: never the output). */
static void add_scaled(float *restrict o, const float *restrict d, float s, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        o[j] += d[j] * s;
    }
}

/* The group's rows of out += their delta dy (m, n_out) times their scale. */
static void add_delta(const lora_adapter_t *ad,
                      int32_t il,
                      int p,
                      const cpu_lora_state_t *st,
                      int32_t r0,
                      int32_t m,
                      const float *dy,
                      float *out,
                      int64_t n_out) {
    const kg_lora_pair_t *pair = &ad->lora->pairs[il][p];
    for (int32_t k = 0; k < m; k++) {
        /* ggml_scale then ggml_add, as build_lora_mm does */
        const float s = kg_lora_pair_scale(ad->lora, pair, st->row_scale[r0 + k]);
        add_scaled(out + (int64_t)st->rows[r0 + k] * n_out, dy + (int64_t)k * n_out, s, n_out);
    }
}

typedef struct apply_job {
    cpu_ctx_t *ctx;
    int32_t il;
    kg_lora_proj_t first;
    int n, set;
    const float *in;
    float *const *outs;
} apply_job_t;

/* Group g's deltas of the job's projections, added to its rows. thread < 0:
 * the groups one after another, each product over the pool, the scratch
 * from its start; else one of the groups side by side on pool thread
 * `thread`, in the scratch rows from the group's offset (the step's rows
 * are exclusive, so the groups' rows together fit the scratch, and no two
 * groups add to one row). */
static void group_apply(const apply_job_t *j, int32_t g, int thread) {
    cpu_ctx_t *ctx = j->ctx;
    cpu_lora_state_t *st = ctx->lora;
    const int32_t il = j->il, n = j->n;
    const lora_adapter_t *ad = &st->ad[st->g_ad[g]];
    const int32_t r0 = st->g_off[g], m = st->g_off[g + 1] - r0;
    const int64_t o = thread < 0 ? 0 : r0; /* the group's first scratch row */
    float *gx = st->gx + o * st->widest, *xr = st->xr + o * st->widest;
    float *dy = st->dy + o * st->widest;
    float *mid = st->mid + o * 3 * st->max_rank, *mid1 = st->mid1 + o * st->max_rank;
    const lora_fused_t *f =
        j->set >= 0 && ad->fused[il][j->set].a.n_in > 0 ? &ad->fused[il][j->set] : NULL;
    bool gathered = false;
    for (int i = 0; i < n; i++) {
        const lora_weights_t *lw = &ad->w[il][j->first + i];
        if (lw->a.n_in == 0) {
            continue;
        }
        const int64_t n_in = lw->a.n_in, r = lw->a.n_out;
        if (!gathered) {
            for (int32_t k = 0; k < m; k++) {
                memcpy(gx + (int64_t)k * n_in, j->in + (int64_t)st->rows[r0 + k] * n_in,
                       (size_t)n_in * sizeof(float));
            }
            /* one product for a stacked set, then each pair's B on its columns */
            if (f) {
                mm(ctx, thread, &f->a, gx, xr, mid, m);
            }
            gathered = true;
        }
        const float *x_a = mid;
        if (f) {
            const int64_t R = f->a.n_out;
            for (int32_t k = 0; k < m; k++) {
                memcpy(mid1 + (int64_t)k * r, mid + (int64_t)k * R + f->off[i],
                       (size_t)r * sizeof(float));
            }
            x_a = mid1;
        } else {
            mm(ctx, thread, &lw->a, gx, xr, mid, m);
        }
        mm(ctx, thread, &lw->b, x_a, xr, dy, m);
        add_delta(ad, il, j->first + i, st, r0, m, dy, j->outs[i], lw->b.n_out);
    }
}

static void group_task(void *arg, int64_t task, int thread) {
    group_apply(arg, (int32_t)task, thread);
}

void cpu_lora_apply(cpu_ctx_t *ctx,
                    int32_t il,
                    kg_lora_proj_t first,
                    int n,
                    const float *in,
                    float *const *outs,
                    int64_t T) {
    cpu_lora_state_t *st = ctx->lora;
    (void)T;
    if (!st || st->n_groups == 0) {
        return;
    }
    apply_job_t j = {
        .ctx = ctx, .il = il, .first = first, .n = n, .set = -1, .in = in, .outs = outs};
    for (int s = 0; s < LORA_N_SETS; s++) {
        j.set = first == k_set_first[s] && n == k_set_n[s] ? s : j.set;
    }
    /* A decode step's groups are a few rows each: their products are too
     * small to split over the threads (cpu_gemm runs them inline), so with
     * one adapter per row the groups run side by side instead, one a task. */
    if (st->exclusive && st->n_groups > 1 && ctx->n_threads > 1) {
        kg_pool_run(ctx->pool, st->n_groups, group_task, &j);
        return;
    }
    for (int32_t g = 0; g < st->n_groups; g++) {
        group_apply(&j, g, -1);
    }
}
