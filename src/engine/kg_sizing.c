/* kg_sizing: engine and backend parameters from the programs' options. */
#include "kg_sizing.h"

#include <stdio.h>
#include <string.h>

kg_engine_options_t kg_engine_options_default(void) {
    kg_engine_options_t o;
    memset(&o, 0, sizeof(o));
    o.prefix_cache = true;
    return o;
}

kg_status_t kg_engine_size(const kg_model_t *model,
                           const kg_engine_options_t *o,
                           kg_engine_params_t *ep,
                           kg_backend_params_t *bp,
                           bool *ctx_clamped,
                           char *errstr,
                           size_t errstr_size) {
    /* kg_engine_params_default brings the model's context and EOG tokens */
    kg_engine_params_t p = kg_engine_params_default(model, 0);
    if (o->max_batch_size > 0) {
        p.max_batch_size = (int32_t)o->max_batch_size;
    }
    p.max_queue_depth = o->max_queue_depth > 0 ? (int32_t)o->max_queue_depth : p.max_batch_size;
    if (o->max_batch_tokens > 0) {
        p.max_batch_tokens = (int32_t)o->max_batch_tokens;
    }
    if (o->ctx > 0) {
        p.max_seq_len = (int32_t)o->ctx;
    }
    if (o->kv_block_size > 0) {
        p.kv_block_size = (int32_t)o->kv_block_size;
    }
    p.prefix_cache = o->prefix_cache;
    if (p.max_batch_tokens < p.max_batch_size) {
        snprintf(errstr, errstr_size,
                 "--max-batch-tokens (%d) must be at least --max-batch-size (%d): every running "
                 "sequence puts one token in each step",
                 p.max_batch_tokens, p.max_batch_size);
        return KG_ERR_INVALID;
    }

    const int64_t bs = p.kv_block_size;
    int64_t n_blocks;
    /* 0 for a file whose layers are all recurrent: no KV, so --kv-memory
     * cannot size anything (and must not divide by it) */
    const int64_t block_bytes =
        (int64_t)kg_backend_kv_bytes_per_block(model, o->kv_type, (int32_t)bs);
    if (o->kv_memory_mib > 0 && block_bytes > 0) {
        n_blocks = ((int64_t)o->kv_memory_mib << 20) / block_bytes;
    } else {
        /* every slot at full context, plus the headroom admission keeps
         * (max(1, n_blocks / 100), kg_engine.h), so all of them fit at once */
        int64_t base = (int64_t)p.max_batch_size * ((p.max_seq_len + bs - 1) / bs);
        n_blocks = base + base / 64 + 1;
    }
    if (n_blocks > (1 << 28)) {
        n_blocks = 1 << 28;
    }
    if (n_blocks * bs < 2) {
        snprintf(errstr, errstr_size,
                 "--kv-memory %lld MiB holds %lld KV blocks of %lld tokens: not even 2 tokens",
                 (long long)o->kv_memory_mib, (long long)n_blocks, (long long)bs);
        return KG_ERR_INVALID;
    }
    p.n_kv_blocks = (int32_t)n_blocks;
    bool clamped = false;
    if (n_blocks * bs < p.max_seq_len) {
        p.max_seq_len = (int32_t)(n_blocks * bs);
        clamped = true;
    }
    if (ctx_clamped) {
        *ctx_clamped = clamped;
    }
    *ep = p;
    memset(bp, 0, sizeof(*bp));
    bp->n_threads = (int32_t)o->threads;
    bp->n_kv_blocks = p.n_kv_blocks;
    bp->kv_block_size = p.kv_block_size;
    bp->kv_type = o->kv_type;
    bp->max_batch_tokens = p.max_batch_tokens;
    bp->max_seq_len = p.max_seq_len;
    bp->n_seq_slots = p.max_batch_size;
    /* a hybrid's prefix cache: a saved state per slot (kg_engine_state.c) */
    ep->n_state_snapshots = p.max_batch_size;
    bp->n_state_snapshots = p.max_batch_size;
    return KG_OK;
}
