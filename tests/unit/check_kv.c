/* check_kv: the KV block pool, block tables and prefix cache. */
#include "check_common.h"
#include "engine/kg_kv.h"

#include <string.h>

static kg_kv_t *make_kv(
    int32_t n_blocks, int32_t block_size, int32_t n_slots, int32_t max_blocks, bool prefix_cache) {
    kg_kv_params_t p = {.n_blocks = n_blocks,
                        .block_size = block_size,
                        .n_slots = n_slots,
                        .max_blocks_per_seq = max_blocks,
                        .prefix_cache = prefix_cache};
    char err[256] = "";
    kg_kv_t *kv = kg_kv_new(&p, err, sizeof(err));
    ck_assert_msg(kv != NULL, "kg_kv_new: %s", err);
    return kv;
}

static const int32_t *row_of(const kg_kv_t *kv, int32_t slot, int32_t max_blocks) {
    return kg_kv_block_table(kv) + slot * max_blocks;
}

START_TEST(bad_params) {
    kg_kv_params_t p = {.n_blocks = 0, .block_size = 16, .n_slots = 1, .max_blocks_per_seq = 1};
    char err[256] = "";
    ck_assert_ptr_null(kg_kv_new(&p, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "n_blocks"));
}
END_TEST

START_TEST(alloc_and_release) {
    kg_kv_t *kv = make_kv(10, 4, 2, 8, false);
    int32_t tok[32] = {0};
    ck_assert_int_eq(kg_kv_n_available(kv), 10);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, tok, 0, 6), KG_OK);
    ck_assert_int_eq(kg_kv_n_used(kv), 6);
    ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 0), 6);
    /* Too many for what is left: nothing is taken. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, tok, 0, 5), KG_KV_FULL);
    ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 1), 0);
    ck_assert_int_eq(kg_kv_n_used(kv), 6);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, tok, 0, 4), KG_OK);
    ck_assert_int_eq(kg_kv_n_available(kv), 0);
    ck_assert(!kg_kv_seq_grow(kv, 0));
    /* Every block id appears once across the two tables. */
    int seen[10] = {0};
    for (int s = 0; s < 2; s++) {
        const int32_t *row = row_of(kv, s, 8);
        for (int i = 0; i < kg_kv_seq_n_blocks(kv, s); i++) {
            ck_assert(row[i] >= 0 && row[i] < 10);
            seen[row[i]]++;
        }
        for (int i = kg_kv_seq_n_blocks(kv, s); i < 8; i++) {
            ck_assert_int_eq(row[i], -1);
        }
    }
    for (int b = 0; b < 10; b++) {
        ck_assert_int_eq(seen[b], 1);
    }
    kg_kv_seq_release(kv, 1);
    ck_assert_int_eq(kg_kv_n_available(kv), 4);
    ck_assert(kg_kv_seq_grow(kv, 0));
    ck_assert(kg_kv_seq_grow(kv, 0));
    ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 0), 8);
    /* The table is full at max_blocks_per_seq even with free blocks left. */
    ck_assert(!kg_kv_seq_grow(kv, 0));
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_n_used(kv), 0);
    ck_assert_int_eq(kg_kv_n_available(kv), 10);
    ck_assert_int_eq(kg_kv_n_cached(kv), 0);
    kg_kv_free(kv);
}
END_TEST

START_TEST(no_cache_when_disabled) {
    kg_kv_t *kv = make_kv(8, 4, 2, 4, false);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = i;
    }
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, tok, 0, 4), KG_OK);
    kg_kv_seq_commit(kv, 0, tok, 16);
    ck_assert_int_eq(kg_kv_match(kv, tok, 4, NULL), 0);
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_n_cached(kv), 0);
    kg_kv_free(kv);
}
END_TEST

START_TEST(prefix_sharing) {
    kg_kv_t *kv = make_kv(16, 4, 3, 8, true);
    int32_t a[14], b[14];
    for (int i = 0; i < 14; i++) {
        a[i] = 100 + i;
        b[i] = 100 + i;
    }
    b[9] = 7; /* b shares blocks 0 and 1 with a, then differs in block 2 */
    ck_assert_int_eq(kg_kv_match(kv, a, 3, NULL), 0);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, a, 0, 4), KG_OK);
    /* Only computed full blocks are registered. */
    kg_kv_seq_commit(kv, 0, a, 7);
    ck_assert_int_eq(kg_kv_match(kv, a, 3, NULL), 1);
    kg_kv_seq_commit(kv, 0, a, 14);
    int32_t idle = -1;
    ck_assert_int_eq(kg_kv_match(kv, a, 3, &idle), 3);
    ck_assert_int_eq(idle, 0);
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 2); /* bounded by the caller */
    ck_assert_int_eq(kg_kv_match(kv, b, 3, NULL), 2);
    ck_assert_int_eq(kg_kv_n_used(kv), 4);

    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, b, 2, 4), KG_OK);
    const int32_t *ra = row_of(kv, 0, 8), *rb = row_of(kv, 1, 8);
    ck_assert_int_eq(rb[0], ra[0]);
    ck_assert_int_eq(rb[1], ra[1]);
    ck_assert_int_ne(rb[2], ra[2]);
    ck_assert_int_eq(kg_kv_n_used(kv), 6); /* 4 + 2 new, the 2 shared counted once */

    /* Releasing a keeps the shared blocks in use; its private ones get cached. */
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_n_used(kv), 4);
    ck_assert_int_eq(kg_kv_n_cached(kv), 1); /* block 2 of a; block 3 was partial */
    ck_assert_int_eq(kg_kv_match(kv, a, 3, &idle), 3);
    ck_assert_int_eq(idle, 1);
    kg_kv_seq_release(kv, 1);
    ck_assert_int_eq(kg_kv_n_used(kv), 0);
    ck_assert_int_eq(kg_kv_n_cached(kv), 3);
    ck_assert_int_eq(kg_kv_n_available(kv), 16);

    /* Taking idle cached blocks removes them from what is available. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 2, a, 3, 4), KG_OK);
    ck_assert_int_eq(kg_kv_n_cached(kv), 0);
    ck_assert_int_eq(kg_kv_n_used(kv), 4);
    kg_kv_stats_t st;
    kg_kv_stats(kv, &st);
    ck_assert_int_eq(st.n_hit_blocks, 5);
    ck_assert_int_eq(st.n_registered, 3);
    kg_kv_seq_release(kv, 2);
    kg_kv_free(kv);
}
END_TEST

/* Sliding windows: blocks before the window go back (cached ones to the
 * LRU, others to the free stack), their entries read -1, the table keeps
 * its length, and the dropped blocks still match while they are cached. */
START_TEST(drop_front) {
    kg_kv_t *kv = make_kv(12, 4, 2, 8, true);
    int32_t a[24];
    for (int i = 0; i < 24; i++) {
        a[i] = 300 + i;
    }
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, a, 0, 6), KG_OK);
    kg_kv_seq_commit(kv, 0, a, 22); /* blocks 0..4 full and registered, 5 partial */
    const int32_t *row = row_of(kv, 0, 8);
    int32_t b0 = row[0], b5 = row[5];
    kg_kv_seq_drop_front(kv, 0, 2);
    ck_assert_int_eq(row[0], -1);
    ck_assert_int_eq(row[1], -1);
    ck_assert_int_eq(row[5], b5);
    ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 0), 6);
    ck_assert_int_eq(kg_kv_seq_n_held(kv, 0), 4);
    ck_assert_int_eq(kg_kv_n_used(kv), 4);
    ck_assert_int_eq(kg_kv_n_cached(kv), 2);
    /* dropping less than already dropped does nothing; more continues */
    kg_kv_seq_drop_front(kv, 0, 1);
    ck_assert_int_eq(kg_kv_seq_n_held(kv, 0), 4);
    /* the prefix still matches, and another slot takes the dropped blocks */
    int32_t idle = 0;
    ck_assert_int_eq(kg_kv_match(kv, a, 5, &idle), 5);
    ck_assert_int_eq(idle, 2);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, a, 5, 6), KG_OK);
    ck_assert_int_eq(row_of(kv, 1, 8)[0], b0);
    /* the table grows past the dropped entries as usual */
    ck_assert(kg_kv_seq_grow(kv, 0));
    ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 0), 7);
    /* release gives back only what is held: the pool adds up */
    kg_kv_seq_release(kv, 0);
    kg_kv_seq_release(kv, 1);
    ck_assert_int_eq(kg_kv_n_used(kv), 0);
    ck_assert_int_eq(kg_kv_n_available(kv), 12);
    kg_kv_free(kv);
}
END_TEST

START_TEST(same_tokens_other_prefix) {
    /* A block equal to a cached one but after a different prefix must not match. */
    kg_kv_t *kv = make_kv(8, 2, 2, 4, true);
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {9, 9, 3, 4};
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, a, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 0, a, 4);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, b, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 1, b, 4);
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 2);
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 2);
    int32_t c[4] = {1, 2, 9, 9};
    ck_assert_int_eq(kg_kv_match(kv, c, 2, NULL), 1);
    kg_kv_seq_release(kv, 0);
    kg_kv_seq_release(kv, 1);
    kg_kv_free(kv);
}
END_TEST

START_TEST(keyed_chains) {
    /* The same tokens under another key (a LoRA adapter set) are other K/V:
     * never matched across keys; a fork keeps its source's key. */
    kg_kv_t *kv = make_kv(16, 2, 3, 4, true);
    int32_t a[4] = {1, 2, 3, 4};
    ck_assert_int_eq(kg_kv_seq_assign_key(kv, 0, 77, a, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 0, a, 4);
    ck_assert_int_eq(kg_kv_match_key(kv, 77, a, 2, NULL), 2);
    ck_assert_int_eq(kg_kv_match_key(kv, 78, a, 2, NULL), 0);
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 0); /* key 0: the base */
    /* the base computes the same tokens: its own entries, both kept */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, a, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 1, a, 4);
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 2);
    ck_assert_int_eq(kg_kv_match_key(kv, 77, a, 2, NULL), 2);
    kg_kv_seq_release(kv, 1);
    /* a fork of slot 0 registers its blocks under 77 */
    int32_t src = -1, dst = -1;
    ck_assert(kg_kv_seq_fork(kv, 0, 2, 1, &src, &dst));
    int32_t b[4] = {1, 2, 5, 6};
    kg_kv_seq_commit(kv, 2, b, 4);
    ck_assert_int_eq(kg_kv_match_key(kv, 77, b, 2, NULL), 2);
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 1);
    kg_kv_seq_release(kv, 0);
    kg_kv_seq_release(kv, 2);
    kg_kv_free(kv);
}
END_TEST

START_TEST(duplicate_blocks_chain) {
    /* Two slots compute the same prefix at once: the second's copies stay
     * private, but its later blocks are still registered through the chain. */
    kg_kv_t *kv = make_kv(16, 2, 2, 8, true);
    int32_t t[6] = {5, 6, 7, 8, 9, 10};
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, t, 0, 3), KG_OK);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, t, 0, 3), KG_OK);
    kg_kv_seq_commit(kv, 0, t, 4);
    kg_kv_seq_commit(kv, 1, t, 6);
    kg_kv_stats_t st;
    kg_kv_stats(kv, &st);
    ck_assert_int_eq(st.n_registered, 3);
    ck_assert_int_eq(kg_kv_match(kv, t, 3, NULL), 3);
    /* Slot 0 continuing now finds its third block already cached. */
    kg_kv_seq_commit(kv, 0, t, 6);
    kg_kv_stats(kv, &st);
    ck_assert_int_eq(st.n_registered, 3);
    kg_kv_seq_release(kv, 0);
    kg_kv_seq_release(kv, 1);
    ck_assert_int_eq(kg_kv_n_cached(kv), 3);
    ck_assert_int_eq(kg_kv_n_used(kv), 0);
    kg_kv_free(kv);
}
END_TEST

START_TEST(lru_eviction) {
    kg_kv_t *kv = make_kv(4, 2, 1, 4, true);
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[2] = {9, 10};
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, a, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 0, a, 4);
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_n_cached(kv), 2);
    /* Free blocks are used before any cached one is evicted. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, b, 0, 2), KG_OK);
    kg_kv_stats_t st;
    kg_kv_stats(kv, &st);
    ck_assert_int_eq(st.n_evictions, 0);
    kg_kv_seq_commit(kv, 0, b, 4);
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_n_cached(kv), 4);
    ck_assert_int_eq(kg_kv_n_available(kv), 4);
    /* LRU order is a's tail, a's head, b's tail, b's head. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, c, 0, 1), KG_OK);
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 1);
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 2);
    ck_assert(kg_kv_seq_grow(kv, 0));
    ck_assert_int_eq(kg_kv_match(kv, a, 2, NULL), 0);
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 2);
    kg_kv_seq_release(kv, 0);
    /* Using b's head makes it recent: b's tail goes before it. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, b, 1, 1), KG_OK);
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, c, 0, 3), KG_OK); /* 2 free + 1 evicted */
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 1);
    ck_assert(kg_kv_seq_grow(kv, 0));
    ck_assert_int_eq(kg_kv_match(kv, b, 2, NULL), 0);
    kg_kv_stats(kv, &st);
    ck_assert_int_eq(st.n_evictions, 4);
    kg_kv_seq_release(kv, 0);
    kg_kv_free(kv);
}
END_TEST

START_TEST(stale_child_after_parent_eviction) {
    /* Slot 1 holds its own copy of block 0 and registers block 1 under the
     * cached block 0 of slot 0. When that parent is evicted and the physical
     * block reused for the same tokens, the old child must not match: its
     * parent's generation changed. */
    kg_kv_t *kv = make_kv(3, 2, 2, 4, true);
    int32_t t[4] = {1, 2, 3, 4}, u[2] = {8, 8};
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, t, 0, 1), KG_OK);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 1, t, 0, 2), KG_OK);
    kg_kv_seq_commit(kv, 0, t, 2);
    kg_kv_seq_commit(kv, 1, t, 4);
    ck_assert_int_eq(kg_kv_match(kv, t, 2, NULL), 2);
    int32_t parent = row_of(kv, 0, 4)[0];
    kg_kv_seq_release(kv, 0);
    /* The parent is the only cached block and no block is free. */
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, u, 0, 1), KG_OK);
    ck_assert_int_eq(kg_kv_match(kv, t, 2, NULL), 0);
    kg_kv_seq_release(kv, 0);
    ck_assert_int_eq(kg_kv_seq_assign(kv, 0, t, 0, 1), KG_OK);
    kg_kv_seq_commit(kv, 0, t, 2);
    ck_assert_int_eq(row_of(kv, 0, 4)[0], parent); /* same physical block, new generation */
    ck_assert_int_eq(kg_kv_match(kv, t, 2, NULL), 1);
    kg_kv_seq_release(kv, 0);
    kg_kv_seq_release(kv, 1);
    kg_kv_free(kv);
}
END_TEST

/* A random workload checked against a model of what each block holds: the
 * prefix whose K/V was computed into it. Every cached block handed out must
 * hold exactly the prefix the new sequence asks for, and counts must add up. */
static uint64_t prefix_hash(const int32_t *tok, int32_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uint32_t)tok[i]) * 1099511628211ULL;
    }
    return h ^ (uint64_t)n;
}

START_TEST(random_workload_sound) {
    enum { NB = 24, BS = 3, NS = 4, MB = 8, N = MB * BS };
    kg_kv_t *kv = make_kv(NB, BS, NS, MB, true);
    uint64_t content[NB] = {0};
    int32_t tok[NS][N];
    int32_t n_tok[NS] = {0}, n_done[NS] = {0};
    bool live[NS] = {false};
    uint64_t rng = 12345;
    int64_t hits = 0;
    for (int it = 0; it < 20000; it++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33);
        int s = (int)(r % NS);
        if (!live[s]) {
            /* Small alphabet so that prefixes repeat often. */
            n_tok[s] = 1 + (int32_t)((r >> 4) % N);
            for (int i = 0; i < n_tok[s]; i++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                tok[s][i] = (int32_t)((rng >> 40) % 2);
            }
            int32_t n_blocks = (n_tok[s] + BS - 1) / BS;
            int32_t idle = 0;
            int32_t hit = kg_kv_match(kv, tok[s], (n_tok[s] - 1) / BS, &idle);
            kg_status_t st = kg_kv_seq_assign(kv, s, tok[s], hit, n_blocks);
            if (st == KG_KV_FULL) {
                ck_assert_int_gt(n_blocks - hit, kg_kv_n_available(kv) - idle);
                continue;
            }
            ck_assert_int_eq(st, KG_OK);
            const int32_t *row = row_of(kv, s, MB);
            for (int i = 0; i < hit; i++) {
                ck_assert_uint_eq(content[row[i]], prefix_hash(tok[s], (i + 1) * BS));
            }
            hits += hit;
            live[s] = true;
            n_done[s] = hit * BS;
        } else if ((r >> 8) % 3 != 0 && n_done[s] < n_tok[s]) {
            /* Compute a chunk: the model writes the blocks it covers. */
            int32_t to = n_done[s] + 1 + (int32_t)((r >> 12) % (uint32_t)(n_tok[s] - n_done[s]));
            const int32_t *row = row_of(kv, s, MB);
            for (int32_t p = n_done[s]; p < to; p++) {
                content[row[p / BS]] = prefix_hash(tok[s], p / BS * BS + BS);
            }
            n_done[s] = to;
            kg_kv_seq_commit(kv, s, tok[s], to);
        } else {
            kg_kv_seq_release(kv, s);
            live[s] = false;
        }
        ck_assert_int_eq(kg_kv_n_used(kv) + kg_kv_n_available(kv), NB);
    }
    for (int s = 0; s < NS; s++) {
        kg_kv_seq_release(kv, s);
    }
    ck_assert_int_eq(kg_kv_n_used(kv), 0);
    ck_assert_int_gt(hits, 100); /* the workload did exercise sharing */
    kg_kv_free(kv);
}
END_TEST

START_TEST(fork_shares_full_blocks) {
    for (int cache = 0; cache < 2; cache++) {
        kg_kv_t *kv = make_kv(8, 4, 3, 6, cache);
        int32_t tok[24];
        for (int i = 0; i < 24; i++) {
            tok[i] = 100 + i;
        }
        /* 10 prompt tokens computed: blocks 0, 1 full, block 2 partial */
        ck_assert_int_eq(kg_kv_seq_assign(kv, 0, tok, 0, 3), KG_OK);
        kg_kv_seq_commit(kv, 0, tok, 10);
        int32_t src = -1, dst = -1;
        ck_assert(!kg_kv_seq_fork(kv, 0, 1, 3, &src, &dst)); /* src has only 3 blocks */
        ck_assert(kg_kv_seq_fork(kv, 0, 1, 2, &src, &dst));
        ck_assert(!kg_kv_seq_fork(kv, 0, 1, 2, &src, &dst)); /* dst is not empty */
        const int32_t *a = row_of(kv, 0, 6), *b = row_of(kv, 1, 6);
        ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 1), 3);
        ck_assert_int_eq(b[0], a[0]);
        ck_assert_int_eq(b[1], a[1]);
        ck_assert_int_eq(src, a[2]);
        ck_assert_int_eq(dst, b[2]);
        ck_assert_int_ne(b[2], a[2]);
        ck_assert_int_eq(kg_kv_n_used(kv), 4);
        /* the fork computes its third block and commits: nothing breaks */
        kg_kv_seq_commit(kv, 1, tok, 12);
        ck_assert(kg_kv_seq_fork(kv, 0, 2, 2, &src, &dst));
        ck_assert_int_eq(kg_kv_n_used(kv), 5);
        /* the shared blocks live while any holder does */
        kg_kv_seq_release(kv, 0);
        ck_assert_int_eq(kg_kv_n_used(kv), 4);
        kg_kv_seq_release(kv, 1);
        ck_assert_int_eq(kg_kv_n_used(kv), 3);
        kg_kv_seq_release(kv, 2);
        ck_assert_int_eq(kg_kv_n_used(kv), 0);
        ck_assert_int_eq(kg_kv_n_available(kv), 8);
        /* a fork needs one free block */
        ck_assert_int_eq(kg_kv_seq_assign(kv, 0, tok, 0, 6), KG_OK);
        ck_assert_int_eq(kg_kv_seq_assign(kv, 1, tok + 8, 0, 2), KG_OK);
        ck_assert(!kg_kv_seq_fork(kv, 0, 2, 1, &src, &dst));
        ck_assert_int_eq(kg_kv_seq_n_blocks(kv, 2), 0);
        kg_kv_free(kv);
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("pool");
    tcase_add_test(tc, bad_params);
    tcase_add_test(tc, alloc_and_release);
    tcase_add_test(tc, no_cache_when_disabled);
    tcase_add_test(tc, fork_shares_full_blocks);
    suite_add_tcase(s, tc);
    tc = tcase_create("prefix");
    tcase_add_test(tc, prefix_sharing);
    tcase_add_test(tc, same_tokens_other_prefix);
    tcase_add_test(tc, keyed_chains);
    tcase_add_test(tc, drop_front);
    tcase_add_test(tc, duplicate_blocks_chain);
    tcase_add_test(tc, stale_child_after_parent_eviction);
    suite_add_tcase(s, tc);
    tc = tcase_create("lru");
    tcase_add_test(tc, lru_eviction);
    suite_add_tcase(s, tc);
    tc = tcase_create("random");
    tcase_add_test(tc, random_workload_sound);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
