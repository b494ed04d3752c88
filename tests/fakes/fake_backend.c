/* fake_backend: a recording, checking backend for engine tests (see fake_backend.h). */
#include "fake_backend.h"

#include "backend/kg_backend_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fake_ctx {
    kg_fake_backend_params_t p;
    int32_t *cell;     /* (n_kv_blocks, kv_block_size) token id written there, -1 never */
    int32_t *hist;     /* (n_kv_blocks * kv_block_size) history read back for one row */
    int32_t *last_pos; /* (n_slots) last position of the slot in this step, -1 none */
    int32_t fail_next;
    float *dev_logits;     /* (max_batch_tokens, n_vocab) with device_sample */
    int32_t n_dev_rows;    /* rows of the last forward(NULL) not yet sampled */
    int32_t fail_row_next; /* -1: none */
    kg_sampler_scratch_t *sc;
    kg_backend_fault_t fault_next; /* scope NONE: none pending */
    kg_backend_fault_t last_fault; /* what the last failed call reports */
    kg_fake_backend_stats_t st;
} fake_ctx_t;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The logits after a history of n tokens of which `seen` (the last ones,
 * at most a window) are given. */
static void logits_of(const kg_fake_backend_params_t *params,
                      const int32_t *seen,
                      int32_t n_seen,
                      int32_t n,
                      float *logits) {
    uint64_t h = mix64(params->salt + 0x9e3779b97f4a7c15ULL);
    for (int32_t i = 0; i < n_seen; i++) {
        h = mix64(h ^ (uint64_t)(uint32_t)seen[i]);
    }
    for (int32_t v = 0; v < params->n_vocab; v++) {
        uint64_t r = mix64(h + (uint64_t)v * 0x632be59bd9b4e019ULL);
        /* 24 random bits spread over [-3, 3): ties are practically impossible. */
        logits[v] = (float)((double)(r >> 40) / (double)(1 << 24) * 6.0 - 3.0);
    }
    if (params->eog_at_len > 0 && params->eog_token >= 0 && params->eog_token < params->n_vocab) {
        logits[params->eog_token] = n >= params->eog_at_len ? 10.0f : -10.0f;
    }
}

void kg_fake_backend_logits(const kg_fake_backend_params_t *params,
                            const int32_t *history,
                            int32_t n,
                            float *logits) {
    const int32_t w = params->window > 0 && n > params->window ? params->window : n;
    logits_of(params, history + (n - w), w, n, logits);
}

int32_t
kg_fake_backend_argmax(const kg_fake_backend_params_t *params, const int32_t *history, int32_t n) {
    float logits[4096];
    if (params->n_vocab > 4096) {
        return -1;
    }
    kg_fake_backend_logits(params, history, n, logits);
    int32_t best = 0;
    for (int32_t v = 1; v < params->n_vocab; v++) {
        if (logits[v] > logits[best]) {
            best = v;
        }
    }
    return best;
}

static void violation(fake_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void violation(fake_ctx_t *c, const char *fmt, ...) {
    if (c->st.n_violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->st.first_violation, sizeof(c->st.first_violation), fmt, ap);
        va_end(ap);
    }
}

/* A block written by `seq` must appear exactly once in its own table and in
 * no other slot's table: shared prefix blocks are read-only. */
static void check_exclusive(fake_ctx_t *c, const kg_step_batch_t *batch, int32_t seq, int32_t b) {
    int32_t own = 0, other = 0;
    for (int32_t s = 0; s < batch->n_slots; s++) {
        const int32_t *row = batch->block_table + (size_t)s * (size_t)batch->max_blocks_per_seq;
        for (int32_t i = 0; i < batch->max_blocks_per_seq; i++) {
            if (row[i] == b) {
                if (s == seq) {
                    own++;
                } else {
                    other++;
                }
            }
        }
    }
    if (own != 1 || other != 0) {
        violation(c, "slot %d writes block %d which it holds %d times and others %d times", seq, b,
                  own, other);
    }
}

static kg_status_t fake_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    fake_ctx_t *c = be->ctx;
    const kg_fake_backend_params_t *p = &c->p;
    int32_t bs = p->kv_block_size, mb = batch->max_blocks_per_seq;
    c->last_fault.scope = KG_FAULT_NONE;
    c->n_dev_rows = 0;
    if (!logits) {
        if (!c->dev_logits) {
            violation(c, "forward without logits on a backend that does not sample");
            return KG_ERR_INVALID;
        }
        logits = c->dev_logits;
    }
    if (c->fail_next > 0) {
        c->fail_next--;
        c->st.n_failed++;
        return KG_ERR_BACKEND;
    }
    if (c->fault_next.scope != KG_FAULT_NONE) {
        /* a SEQ fault only fires in a step that holds that slot */
        bool hit = c->fault_next.scope != KG_FAULT_SEQ;
        for (int32_t i = 0; !hit && i < batch->n_tokens; i++) {
            hit = batch->seq[i] == c->fault_next.seq;
        }
        if (hit) {
            c->last_fault = c->fault_next;
            c->fault_next.scope = KG_FAULT_NONE;
            c->st.n_failed++;
            return c->last_fault.scope == KG_FAULT_DEVICE ? KG_ERR_BACKEND : KG_ERR_INVALID;
        }
    }
    if (batch->n_tokens < 1 || batch->n_tokens > p->max_batch_tokens) {
        violation(c, "step of %d tokens (max %d)", batch->n_tokens, p->max_batch_tokens);
        return KG_ERR_INVALID;
    }
    if (batch->n_slots != p->n_slots) {
        violation(c, "n_slots %d, expected %d", batch->n_slots, p->n_slots);
        return KG_ERR_INVALID;
    }
    int32_t n_want = 0;
    for (int32_t s = 0; s < p->n_slots; s++) {
        c->last_pos[s] = -1;
    }
    /* Pass 1: check every token and write its K/V (its id) into its row. */
    for (int32_t i = 0; i < batch->n_tokens; i++) {
        int32_t seq = batch->seq[i], pos = batch->pos[i], tok = batch->token[i];
        n_want += batch->want_logits[i];
        if (seq < 0 || seq >= p->n_slots || pos < 0 || pos / bs >= mb ||
            (p->window <= 0 && pos >= p->n_kv_blocks * bs) || tok < 0 || tok >= p->n_vocab) {
            violation(c, "token %d: seq %d pos %d id %d out of range", i, seq, pos, tok);
            return KG_ERR_INVALID;
        }
        if (c->last_pos[seq] >= 0 && pos != c->last_pos[seq] + 1) {
            violation(c, "slot %d: position %d after %d in one step", seq, pos, c->last_pos[seq]);
        }
        int32_t b = batch->block_table[(size_t)seq * (size_t)mb + (size_t)(pos / bs)];
        if (b < 0 || b >= p->n_kv_blocks) {
            violation(c, "slot %d pos %d: block %d out of range", seq, pos, b);
            return KG_ERR_INVALID;
        }
        if (c->last_pos[seq] < 0 || pos % bs == 0) {
            check_exclusive(c, batch, seq, b);
        }
        c->last_pos[seq] = pos;
        c->cell[(size_t)b * (size_t)bs + (size_t)(pos % bs)] = tok;
    }
    if (n_want != batch->n_outputs) {
        violation(c, "n_outputs %d but %d tokens want logits", batch->n_outputs, n_want);
        return KG_ERR_INVALID;
    }
    /* Pass 2: every row attends to what the block table shows for 0..pos. */
    int32_t row = 0;
    for (int32_t i = 0; i < batch->n_tokens; i++) {
        if (!batch->want_logits[i]) {
            continue;
        }
        int32_t seq = batch->seq[i], pos = batch->pos[i];
        const int32_t q0 = p->window > 0 && pos + 1 > p->window ? pos + 1 - p->window : 0;
        for (int32_t q = q0; q <= pos; q++) {
            int32_t b = batch->block_table[(size_t)seq * (size_t)mb + (size_t)(q / bs)];
            int32_t t = -1;
            if (b >= 0 && b < p->n_kv_blocks) {
                t = c->cell[(size_t)b * (size_t)bs + (size_t)(q % bs)];
            }
            if (t < 0) {
                violation(c, "slot %d pos %d reads an unwritten row at pos %d (block %d)", seq, pos,
                          q, b);
                t = 0;
            }
            c->hist[q - q0] = t;
        }
        logits_of(p, c->hist, pos + 1 - q0, pos + 1, logits + (size_t)row * (size_t)p->n_vocab);
        row++;
    }
    if (logits == c->dev_logits) {
        c->n_dev_rows = batch->n_outputs;
    }
    if (c->st.n_steps < KG_FAKE_MAX_STEPS) {
        c->st.step_tokens[c->st.n_steps] = batch->n_tokens;
        c->st.step_outputs[c->st.n_steps] = batch->n_outputs;
    }
    c->st.n_steps++;
    c->st.n_tokens += batch->n_tokens;
    c->st.n_outputs += batch->n_outputs;
    if (batch->n_tokens > c->st.max_step_tokens) {
        c->st.max_step_tokens = batch->n_tokens;
    }
    if (batch->n_outputs > c->st.max_step_outputs) {
        c->st.max_step_outputs = batch->n_outputs;
    }
    return KG_OK;
}

static kg_status_t
fake_sample(kg_backend_t *be, const kg_sample_request_t *reqs, int32_t n, kg_sample_result_t *out) {
    fake_ctx_t *c = be->ctx;
    const int32_t V = c->p.n_vocab;
    c->last_fault.scope = KG_FAULT_NONE;
    if (n < 0 || n > c->n_dev_rows) {
        violation(c, "sample of %d rows, the last step left %d", n, c->n_dev_rows);
        return KG_ERR_INVALID;
    }
    for (int32_t r = 0; r < n; r++) {
        const kg_sample_request_t *q = &reqs[r];
        kg_sampler_sample(q->params, q->rng, c->dev_logits + (size_t)r * (size_t)V, V, q->prompt,
                          q->n_prompt, q->output, q->n_output, c->sc, &out[r]);
    }
    c->n_dev_rows = 0;
    if (c->fail_row_next >= 0 && c->fail_row_next < n) {
        c->last_fault.scope = KG_FAULT_SEQ;
        c->last_fault.seq = -1;
        c->last_fault.row = c->fail_row_next;
        snprintf(c->last_fault.message, sizeof(c->last_fault.message), "fake row fault");
        c->fail_row_next = -1;
        c->st.n_failed++;
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

static void fake_free(kg_backend_t *be) {
    fake_ctx_t *c = be->ctx;
    free(c->dev_logits);
    kg_sampler_scratch_free(c->sc);
    free(c->cell);
    free(c->hist);
    free(c->last_pos);
    free(c);
    free(be);
}

static void fake_memory(const kg_backend_t *be, kg_backend_memory_t *out) {
    const fake_ctx_t *c = be->ctx;
    out->kv_size = (size_t)c->p.n_kv_blocks * (size_t)c->p.kv_block_size * sizeof(int32_t);
}

/* The fake's KV is the token id per cell: a copy copies the cells. */
static kg_status_t
fake_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    fake_ctx_t *c = be->ctx;
    const size_t bs = (size_t)c->p.kv_block_size;
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= c->p.n_kv_blocks || dst[i] < 0 || dst[i] >= c->p.n_kv_blocks ||
            src[i] == dst[i]) {
            violation(c, "kv_copy of block %d into %d", src[i], dst[i]);
            return KG_ERR_INVALID;
        }
        memcpy(c->cell + (size_t)dst[i] * bs, c->cell + (size_t)src[i] * bs, bs * sizeof(*c->cell));
        c->st.n_kv_copies++;
    }
    return KG_OK;
}

static void fake_last_fault(const kg_backend_t *be, kg_backend_fault_t *out) {
    *out = ((const fake_ctx_t *)be->ctx)->last_fault;
}

static const struct kg_backend_i fake_iface = {
    /* .name    = */ "fake",
    /* .free    = */ fake_free,
    /* .forward = */ fake_forward,
    /* .memory  = */ fake_memory,
};

kg_backend_t *kg_fake_backend_new(const kg_fake_backend_params_t *params) {
    const kg_fake_backend_params_t *p = params;
    if (p->n_vocab < 2 || p->n_kv_blocks < 1 || p->kv_block_size < 1 || p->max_batch_tokens < 1 ||
        p->n_slots < 1) {
        return NULL;
    }
    kg_backend_t *be = calloc(1, sizeof(*be));
    fake_ctx_t *c = calloc(1, sizeof(*c));
    size_t n_cells = (size_t)p->n_kv_blocks * (size_t)p->kv_block_size;
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    c->p = *p;
    c->cell = malloc(n_cells * sizeof(*c->cell));
    c->hist = malloc(n_cells * sizeof(*c->hist));
    c->last_pos = malloc((size_t)p->n_slots * sizeof(*c->last_pos));
    be->iface = fake_iface;
    be->ctx = c;
    be->last_fault = fake_last_fault;
    c->fail_row_next = -1;
    if (p->device_sample) {
        be->sample = fake_sample;
        c->dev_logits = malloc((size_t)p->max_batch_tokens * (size_t)p->n_vocab * sizeof(float));
        c->sc = kg_sampler_scratch_new(p->n_vocab);
        if (!c->dev_logits || !c->sc) {
            fake_free(be);
            return NULL;
        }
    }
    be->kv_copy = p->no_kv_copy ? NULL : fake_kv_copy;
    if (!c->cell || !c->hist || !c->last_pos) {
        fake_free(be);
        return NULL;
    }
    for (size_t i = 0; i < n_cells; i++) {
        c->cell[i] = -1;
    }
    return be;
}

void kg_fake_backend_fail_next(kg_backend_t *be, int32_t n) {
    ((fake_ctx_t *)be->ctx)->fail_next = n;
}

void kg_fake_backend_fail_sample_row(kg_backend_t *be, int32_t row) {
    ((fake_ctx_t *)be->ctx)->fail_row_next = row;
}

void kg_fake_backend_fault_next(kg_backend_t *be, kg_fault_scope_t scope, int32_t seq) {
    fake_ctx_t *c = be->ctx;
    memset(&c->fault_next, 0, sizeof(c->fault_next));
    c->fault_next.scope = scope;
    c->fault_next.seq = scope == KG_FAULT_SEQ ? seq : -1;
    c->fault_next.row = -1;
    snprintf(c->fault_next.message, sizeof(c->fault_next.message), "fake %s fault",
             scope == KG_FAULT_SEQ    ? "sequence"
             : scope == KG_FAULT_STEP ? "step"
                                      : "device");
}

const kg_fake_backend_stats_t *kg_fake_backend_stats(const kg_backend_t *be) {
    return &((const fake_ctx_t *)be->ctx)->st;
}
