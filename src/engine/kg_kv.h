/* kg_kv: the paged KV block allocator, the per-slot block tables and the
 * prefix cache. It only does bookkeeping: the K/V data live in the backend,
 * which reads the block tables this module keeps.
 *
 * DESIGN
 * The pool has n_blocks blocks of block_size token rows. A block is in one
 * of three states:
 *   - used:   referenced by one or more slots (ref > 0);
 *   - cached: nobody references it but it holds a registered prefix block;
 *             cached blocks sit in an LRU list and are evicted (oldest
 *             first) only when an allocation finds no free block;
 *   - free:   neither; kept on a stack.
 * Prefix cache: when a slot has computed a FULL block, the block is
 * registered under hash = H(parent hash, the block's token ids). A lookup
 * walks a new sequence's blocks from the start and follows the chain while
 * a registered block matches. A match is exact, not probabilistic: besides
 * the 64-bit hash it compares the block's stored token ids and the identity
 * of its parent block (id plus a generation number bumped at each eviction),
 * so a hash collision or a stale child of an evicted parent never matches.
 * Shared blocks are always full and never written again (a sequence always
 * recomputes at least its last token into a block of its own), so sharing
 * needs no copy-on-write. The same holds for a fork (the n choices of one
 * prompt, kg_kv_seq_fork): the choices share the prompt's full blocks and
 * each gets its own block for the one holding the prompt's last token
 * (copied or recomputed by the engine), so no shared block is written.
 * Sliding windows: when every layer of the model is windowed, a sequence's
 * blocks wholly before the window of its next token are never read again;
 * kg_kv_seq_drop_front gives them back (to the LRU when they are in the
 * prefix cache, else to the free stack) and marks their table entries -1.
 * The table keeps its logical length, so position p is still in entry
 * p / block_size. A dropped block that stays cached still matches later
 * sequences with the same prefix; one evicted breaks the chain for the
 * blocks registered after it (they then never match), which loses reuse,
 * never correctness.
 * Nothing here allocates after kg_kv_new. */
#pragma once

#include "../core/kg_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_kv kg_kv_t;

typedef struct kg_kv_params {
    int32_t n_blocks;           /* blocks in the pool */
    int32_t block_size;         /* token rows per block */
    int32_t n_slots;            /* block tables (running sequences at most) */
    int32_t max_blocks_per_seq; /* entries per block table */
    bool prefix_cache;
} kg_kv_params_t;

typedef struct kg_kv_stats {
    int64_t n_evictions;  /* cached blocks reclaimed for a new allocation */
    int64_t n_registered; /* blocks entered into the prefix cache */
    int64_t n_hit_blocks; /* blocks handed out by kg_kv_seq_assign from the cache */
} kg_kv_stats_t;

/** Create the pool and `n_slots` empty block tables. NULL with errstr on a
 * bad parameter or out of memory. */
kg_kv_t *kg_kv_new(const kg_kv_params_t *params, char *errstr, size_t errstr_size);
void kg_kv_free(kg_kv_t *kv);

int32_t kg_kv_n_total(const kg_kv_t *kv);
/** Blocks referenced by some slot. */
int32_t kg_kv_n_used(const kg_kv_t *kv);
/** Unreferenced blocks that hold a cached prefix (evictable). */
int32_t kg_kv_n_cached(const kg_kv_t *kv);
/** Blocks an allocation can obtain now: free plus cached. */
int32_t kg_kv_n_available(const kg_kv_t *kv);

/** Count the leading full blocks of `tokens` (at most `max_blocks` blocks,
 * so the caller bounds how much may come from the cache) that are in the
 * prefix cache, without taking them. *n_idle (may be NULL) gets how many of
 * them are unreferenced: taking those lowers kg_kv_n_available. */
int32_t kg_kv_match(const kg_kv_t *kv, const int32_t *tokens, int32_t max_blocks, int32_t *n_idle);

/** kg_kv_match within the chains of `key` (kg_kv_match is key 0): blocks
 * are cached per key, so the same tokens computed under another key (a
 * LoRA adapter set: other K/V) are never found. */
int32_t kg_kv_match_key(
    const kg_kv_t *kv, uint64_t key, const int32_t *tokens, int32_t max_blocks, int32_t *n_idle);

/** Fill the empty table of `slot`: the first `n_hit` blocks from the cache
 * (as counted by kg_kv_match for the same tokens), then fresh blocks up to
 * `n_blocks` in all. KG_KV_FULL, with the table left empty, when the pool
 * cannot supply them. */
KG_NODISCARD kg_status_t
kg_kv_seq_assign(kg_kv_t *kv, int32_t slot, const int32_t *tokens, int32_t n_hit, int32_t n_blocks);

/** kg_kv_seq_assign under `key` (see kg_kv_match_key): the slot's blocks
 * are registered under it as they are committed; a fork inherits it. */
KG_NODISCARD kg_status_t kg_kv_seq_assign_key(kg_kv_t *kv,
                                              int32_t slot,
                                              uint64_t key,
                                              const int32_t *tokens,
                                              int32_t n_hit,
                                              int32_t n_blocks);

/** Append one block to the table of `slot`, evicting the least recently
 * used cached block when none is free. false when the pool has none. */
bool kg_kv_seq_grow(kg_kv_t *kv, int32_t slot);

int32_t kg_kv_seq_n_blocks(const kg_kv_t *kv, int32_t slot);

/** Tell the cache that `slot` has computed the K/V of its first
 * `n_computed` tokens (`tokens` holds at least that many): every full block
 * among them that is not registered yet is registered (or, when an equal
 * block is already cached, the chain continues through that one). */
void kg_kv_seq_commit(kg_kv_t *kv, int32_t slot, const int32_t *tokens, int32_t n_computed);

/** Fill the empty table of `dst` as a fork of `src`: the first `n_share`
 * blocks of src (full blocks of a computed prefix) are referenced, not
 * copied, and one fresh block follows them; entries src has given back
 * (sliding window) are given back in dst too. *copy_src gets src's block at
 * index n_share and *copy_dst the fresh block, for the caller to copy
 * (kg_backend_kv_copy) or recompute. false, with dst left empty, when src
 * holds fewer than n_share + 1 blocks, its block n_share is given back, or
 * the pool has no free block. */
bool kg_kv_seq_fork(
    kg_kv_t *kv, int32_t src, int32_t dst, int32_t n_share, int32_t *copy_src, int32_t *copy_dst);

/** Give back the blocks of `slot` before entry `n_blocks` (those not given
 * back yet) and set their entries to -1; they must hold no position any
 * future token of the slot reads. */
void kg_kv_seq_drop_front(kg_kv_t *kv, int32_t slot, int32_t n_blocks);

/** Blocks `slot` still holds (its table length minus the dropped ones). */
int32_t kg_kv_seq_n_held(const kg_kv_t *kv, int32_t slot);

/** Drop the references of `slot` and empty its table. Blocks go back last
 * first, so the LRU evicts the tail of a prefix before its head. */
void kg_kv_seq_release(kg_kv_t *kv, int32_t slot);

/** The block tables, (n_slots, max_blocks_per_seq) block ids, -1 where a
 * slot has no block. Borrowed; lives as long as `kv`. */
const int32_t *kg_kv_block_table(const kg_kv_t *kv);

void kg_kv_stats(const kg_kv_t *kv, kg_kv_stats_t *out);
