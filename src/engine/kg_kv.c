/* kg_kv: block pool, block tables and prefix cache (see kg_kv.h). */
#include "kg_kv.h"

#include "../core/kg_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kg_kv {
    kg_kv_params_t p;

    // ---- per block ----
    int32_t *ref;         /* (n_blocks) slots referencing the block */
    bool *registered;     /* (n_blocks) in the prefix cache map */
    uint64_t *hash;       /* (n_blocks) chain hash of a registered block */
    uint64_t *key;        /* (n_blocks) the key of the chain a registered block is on */
    int32_t *parent;      /* (n_blocks) parent of a registered block, -1 for a first block */
    uint32_t *parent_gen; /* (n_blocks) gen[parent] when the block was registered */
    uint32_t *gen;        /* (n_blocks) bumped when the block leaves the cache */
    int32_t *tokens;      /* (n_blocks, block_size) token ids of a registered block */
    int32_t *lru_prev;    /* (n_blocks) LRU links of cached (ref 0, registered) blocks */
    int32_t *lru_next;    /* (n_blocks) */
    int32_t lru_head;     /* least recently released cached block, -1 when none */
    int32_t lru_tail;
    int32_t n_cached;
    int32_t *free_stack; /* (n_blocks) unregistered unreferenced blocks */
    int32_t n_free;

    // ---- prefix map: open addressing, linear probing ----
    int32_t *map; /* (map_mask + 1) block ids, -1 when empty */
    uint32_t map_mask;

    // ---- per slot ----
    int32_t *table;       /* (n_slots, max_blocks_per_seq) block ids, -1 when unused */
    int32_t *n_seq;       /* (n_slots) blocks in the table */
    int32_t *n_dropped;   /* (n_slots) leading entries given back (sliding window), -1 now */
    int32_t *n_chain;     /* (n_slots) leading blocks whose cache chain is known */
    uint64_t *chain_hash; /* (n_slots) hash of the last chained block, 0 before the first */
    int32_t *chain_block; /* (n_slots) registered block equal to the last chained one, or -1 */
    uint32_t *chain_gen;  /* (n_slots) its generation */
    uint64_t *slot_key;   /* (n_slots) the key the slot's blocks are cached under */

    kg_kv_stats_t st;
};

// ---- hashing and the map ----

/* FNV-1a over the parent hash and the token ids, then the splitmix64
 * finalizer so that the low bits (the map index) mix well. */
static uint64_t block_hash(uint64_t parent_hash, const int32_t *tok, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < 8; i++) {
        h = (h ^ ((parent_hash >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
    }
    for (int32_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tok[i];
        for (int k = 0; k < 4; k++) {
            h = (h ^ ((t >> (8 * k)) & 0xff)) * 0x100000001b3ULL;
        }
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static void map_insert(kg_kv_t *kv, int32_t b) {
    uint32_t i = (uint32_t)kv->hash[b] & kv->map_mask;
    while (kv->map[i] >= 0) {
        i = (i + 1) & kv->map_mask;
    }
    kv->map[i] = b;
}

/* Backward-shift deletion keeps probe chains intact without tombstones, so
 * lookups stay short however often blocks are cached and evicted. */
static void map_remove(kg_kv_t *kv, int32_t b) {
    uint32_t mask = kv->map_mask;
    uint32_t i = (uint32_t)kv->hash[b] & mask;
    while (kv->map[i] != b) {
        i = (i + 1) & mask;
    }
    kv->map[i] = -1;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (kv->map[j] < 0) {
            break;
        }
        uint32_t home = (uint32_t)kv->hash[kv->map[j]] & mask;
        /* The entry at j may stay unless its home lies cyclically outside (i, j]. */
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) {
            continue;
        }
        kv->map[i] = kv->map[j];
        kv->map[j] = -1;
        i = j;
    }
}

/* The registered block with hash `h`, chain key `key`, parent (parent,
 * pgen) and these token ids, or -1. */
static int32_t map_find(const kg_kv_t *kv,
                        uint64_t key,
                        uint64_t h,
                        int32_t parent,
                        uint32_t pgen,
                        const int32_t *tok) {
    int32_t bs = kv->p.block_size;
    uint32_t i = (uint32_t)h & kv->map_mask;
    for (int32_t b; (b = kv->map[i]) >= 0; i = (i + 1) & kv->map_mask) {
        if (kv->hash[b] == h && kv->key[b] == key && kv->parent[b] == parent &&
            kv->parent_gen[b] == pgen &&
            memcmp(kv->tokens + (size_t)b * (size_t)bs, tok, (size_t)bs * sizeof(int32_t)) == 0) {
            return b;
        }
    }
    return -1;
}

// ---- block lists ----

static void lru_remove(kg_kv_t *kv, int32_t b) {
    int32_t prev = kv->lru_prev[b], next = kv->lru_next[b];
    if (prev >= 0) {
        kv->lru_next[prev] = next;
    } else {
        kv->lru_head = next;
    }
    if (next >= 0) {
        kv->lru_prev[next] = prev;
    } else {
        kv->lru_tail = prev;
    }
    kv->lru_prev[b] = kv->lru_next[b] = -1;
    kv->n_cached--;
}

static void lru_append(kg_kv_t *kv, int32_t b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) {
        kv->lru_next[kv->lru_tail] = b;
    } else {
        kv->lru_head = b;
    }
    kv->lru_tail = b;
    kv->n_cached++;
}

static void unregister_block(kg_kv_t *kv, int32_t b) {
    map_remove(kv, b);
    kv->registered[b] = false;
    /* Children registered under this block now name a stale generation and
     * can never match again. */
    kv->gen[b]++;
}

/* A block with ref 1: a free one, else the least recently used cached one.
 * -1 when the pool has none. */
static int32_t alloc_block(kg_kv_t *kv) {
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else if (kv->lru_head >= 0) {
        b = kv->lru_head;
        lru_remove(kv, b);
        unregister_block(kv, b);
        kv->st.n_evictions++;
    } else {
        return -1;
    }
    kv->ref[b] = 1;
    return b;
}

static void unref_block(kg_kv_t *kv, int32_t b) {
    if (--kv->ref[b] > 0) {
        return;
    }
    if (kv->registered[b]) {
        lru_append(kv, b);
    } else {
        kv->free_stack[kv->n_free++] = b;
    }
}

// ---- lifecycle ----

kg_kv_t *kg_kv_new(const kg_kv_params_t *params, char *errstr, size_t errstr_size) {
    const kg_kv_params_t *p = params;
    if (p->n_blocks < 1 || p->block_size < 1 || p->n_slots < 1 || p->max_blocks_per_seq < 1) {
        snprintf(errstr, errstr_size,
                 "kv: n_blocks (%d), block_size (%d), n_slots (%d) and max_blocks_per_seq (%d) "
                 "must be positive",
                 p->n_blocks, p->block_size, p->n_slots, p->max_blocks_per_seq);
        return NULL;
    }
    if (p->n_blocks > (1 << 28) || (int64_t)p->n_blocks * p->block_size > ((int64_t)1 << 31) - 1) {
        snprintf(errstr, errstr_size, "kv: pool of %d blocks of %d tokens is too large",
                 p->n_blocks, p->block_size);
        return NULL;
    }
    kg_kv_t *kv = calloc(1, sizeof(*kv));
    if (!kv) {
        goto fail;
    }
    kv->p = *p;
    size_t nb = (size_t)p->n_blocks, ns = (size_t)p->n_slots;
    uint32_t cap = 1;
    while (cap < 2 * (uint32_t)p->n_blocks) {
        cap <<= 1;
    }
    kv->map_mask = cap - 1;
    kv->ref = calloc(nb, sizeof(*kv->ref));
    kv->registered = calloc(nb, sizeof(*kv->registered));
    kv->hash = calloc(nb, sizeof(*kv->hash));
    kv->key = calloc(nb, sizeof(*kv->key));
    kv->parent = calloc(nb, sizeof(*kv->parent));
    kv->parent_gen = calloc(nb, sizeof(*kv->parent_gen));
    kv->gen = calloc(nb, sizeof(*kv->gen));
    kv->tokens = calloc(nb * (size_t)p->block_size, sizeof(*kv->tokens));
    kv->lru_prev = malloc(nb * sizeof(*kv->lru_prev));
    kv->lru_next = malloc(nb * sizeof(*kv->lru_next));
    kv->free_stack = malloc(nb * sizeof(*kv->free_stack));
    kv->map = malloc((size_t)cap * sizeof(*kv->map));
    kv->table = malloc(ns * (size_t)p->max_blocks_per_seq * sizeof(*kv->table));
    kv->n_seq = calloc(ns, sizeof(*kv->n_seq));
    kv->n_dropped = calloc(ns, sizeof(*kv->n_dropped));
    kv->n_chain = calloc(ns, sizeof(*kv->n_chain));
    kv->chain_hash = calloc(ns, sizeof(*kv->chain_hash));
    kv->chain_block = malloc(ns * sizeof(*kv->chain_block));
    kv->chain_gen = calloc(ns, sizeof(*kv->chain_gen));
    kv->slot_key = calloc(ns, sizeof(*kv->slot_key));
    if (!kv->ref || !kv->registered || !kv->hash || !kv->parent || !kv->parent_gen || !kv->gen ||
        !kv->tokens || !kv->lru_prev || !kv->lru_next || !kv->free_stack || !kv->map ||
        !kv->table || !kv->n_seq || !kv->n_dropped || !kv->n_chain || !kv->chain_hash ||
        !kv->chain_block || !kv->chain_gen || !kv->key || !kv->slot_key) {
        goto fail;
    }
    /* Stack order: block 0 is handed out first (easier to read in tests). */
    for (int32_t i = 0; i < p->n_blocks; i++) {
        kv->free_stack[i] = p->n_blocks - 1 - i;
        kv->lru_prev[i] = kv->lru_next[i] = -1;
    }
    kv->n_free = p->n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    for (uint32_t i = 0; i < cap; i++) {
        kv->map[i] = -1;
    }
    for (size_t i = 0; i < ns * (size_t)p->max_blocks_per_seq; i++) {
        kv->table[i] = -1;
    }
    for (size_t i = 0; i < ns; i++) {
        kv->chain_block[i] = -1;
    }
    return kv;
fail:
    snprintf(errstr, errstr_size, "kv: out of memory for %d blocks", p->n_blocks);
    kg_kv_free(kv);
    return NULL;
}

void kg_kv_free(kg_kv_t *kv) {
    if (!kv) {
        return;
    }
    free(kv->ref);
    free(kv->registered);
    free(kv->hash);
    free(kv->key);
    free(kv->parent);
    free(kv->parent_gen);
    free(kv->gen);
    free(kv->tokens);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv->free_stack);
    free(kv->map);
    free(kv->table);
    free(kv->n_seq);
    free(kv->n_dropped);
    free(kv->n_chain);
    free(kv->chain_hash);
    free(kv->slot_key);
    free(kv->chain_block);
    free(kv->chain_gen);
    free(kv);
}

// ---- queries ----

int32_t kg_kv_n_total(const kg_kv_t *kv) {
    return kv->p.n_blocks;
}

int32_t kg_kv_n_used(const kg_kv_t *kv) {
    return kv->p.n_blocks - kv->n_free - kv->n_cached;
}

int32_t kg_kv_n_cached(const kg_kv_t *kv) {
    return kv->n_cached;
}

int32_t kg_kv_n_available(const kg_kv_t *kv) {
    return kv->n_free + kv->n_cached;
}

int32_t kg_kv_seq_n_blocks(const kg_kv_t *kv, int32_t slot) {
    return kv->n_seq[slot];
}

int32_t kg_kv_seq_n_held(const kg_kv_t *kv, int32_t slot) {
    return kv->n_seq[slot] - kv->n_dropped[slot];
}

const int32_t *kg_kv_block_table(const kg_kv_t *kv) {
    return kv->table;
}

void kg_kv_stats(const kg_kv_t *kv, kg_kv_stats_t *out) {
    *out = kv->st;
}

int32_t kg_kv_match(const kg_kv_t *kv, const int32_t *tokens, int32_t max_blocks, int32_t *n_idle) {
    return kg_kv_match_key(kv, 0, tokens, max_blocks, n_idle);
}

int32_t kg_kv_match_key(
    const kg_kv_t *kv, uint64_t key, const int32_t *tokens, int32_t max_blocks, int32_t *n_idle) {
    int32_t n = 0, idle = 0;
    if (kv->p.prefix_cache) {
        uint64_t h = key;
        int32_t parent = -1;
        uint32_t pgen = 0;
        int32_t bs = kv->p.block_size;
        for (; n < max_blocks; n++) {
            const int32_t *tok = tokens + (size_t)n * (size_t)bs;
            uint64_t hn = block_hash(h, tok, bs);
            int32_t b = map_find(kv, key, hn, parent, pgen, tok);
            if (b < 0) {
                break;
            }
            idle += kv->ref[b] == 0;
            h = hn;
            parent = b;
            pgen = kv->gen[b];
        }
    }
    if (n_idle) {
        *n_idle = idle;
    }
    return n;
}

// ---- slots ----

kg_status_t kg_kv_seq_assign(
    kg_kv_t *kv, int32_t slot, const int32_t *tokens, int32_t n_hit, int32_t n_blocks) {
    return kg_kv_seq_assign_key(kv, slot, 0, tokens, n_hit, n_blocks);
}

kg_status_t kg_kv_seq_assign_key(kg_kv_t *kv,
                                 int32_t slot,
                                 uint64_t key,
                                 const int32_t *tokens,
                                 int32_t n_hit,
                                 int32_t n_blocks) {
    int32_t idle = 0;
    int32_t got = kg_kv_match_key(kv, key, tokens, n_hit, &idle);
    if (got != n_hit || n_blocks > kv->p.max_blocks_per_seq || n_hit > n_blocks ||
        kv->n_seq[slot] != 0) {
        KG_LOG_ERROR("kv", "bad assign slot=%d hit=%d matched=%d blocks=%d held=%d", slot, n_hit,
                     got, n_blocks, kv->n_seq[slot]);
        return KG_ERR_INVALID;
    }
    if (n_blocks - n_hit > kg_kv_n_available(kv) - idle) {
        return KG_KV_FULL;
    }
    int32_t *row = kv->table + (size_t)slot * (size_t)kv->p.max_blocks_per_seq;
    int32_t bs = kv->p.block_size;
    uint64_t h = key;
    int32_t parent = -1;
    uint32_t pgen = 0;
    for (int32_t i = 0; i < n_hit; i++) {
        const int32_t *tok = tokens + (size_t)i * (size_t)bs;
        h = block_hash(h, tok, bs);
        int32_t b = map_find(kv, key, h, parent, pgen, tok);
        if (kv->ref[b] == 0) {
            lru_remove(kv, b);
        }
        kv->ref[b]++;
        row[i] = b;
        parent = b;
        pgen = kv->gen[b];
    }
    kv->st.n_hit_blocks += n_hit;
    kv->n_chain[slot] = n_hit;
    kv->chain_hash[slot] = h;
    kv->slot_key[slot] = key;
    kv->chain_block[slot] = parent;
    kv->chain_gen[slot] = pgen;
    for (int32_t i = n_hit; i < n_blocks; i++) {
        row[i] = alloc_block(kv); /* cannot fail: counted above */
    }
    kv->n_seq[slot] = n_blocks;
    return KG_OK;
}

bool kg_kv_seq_grow(kg_kv_t *kv, int32_t slot) {
    int32_t n = kv->n_seq[slot];
    if (n >= kv->p.max_blocks_per_seq) {
        return false;
    }
    int32_t b = alloc_block(kv);
    if (b < 0) {
        return false;
    }
    kv->table[(size_t)slot * (size_t)kv->p.max_blocks_per_seq + (size_t)n] = b;
    kv->n_seq[slot] = n + 1;
    return true;
}

bool kg_kv_seq_fork(
    kg_kv_t *kv, int32_t src, int32_t dst, int32_t n_share, int32_t *copy_src, int32_t *copy_dst) {
    const size_t mb = (size_t)kv->p.max_blocks_per_seq;
    const int32_t *from = kv->table + (size_t)src * mb;
    if (n_share < 0 || n_share >= kv->n_seq[src] || kv->n_seq[dst] != 0 || from[n_share] < 0) {
        return false;
    }
    int32_t b = alloc_block(kv);
    if (b < 0) {
        return false;
    }
    int32_t *row = kv->table + (size_t)dst * mb;
    for (int32_t i = 0; i < n_share; i++) {
        row[i] = from[i]; /* -1: given back by src (sliding window), so by dst too */
        if (from[i] >= 0) {
            kv->ref[from[i]]++; /* referenced by src, so never in the LRU list */
        }
    }
    row[n_share] = b;
    kv->n_seq[dst] = n_share + 1;
    kv->slot_key[dst] = kv->slot_key[src];
    kv->chain_hash[dst] = kv->slot_key[src];
    kv->n_dropped[dst] = kv->n_dropped[src] < n_share ? kv->n_dropped[src] : n_share;
    /* the cache chain of dst is walked again from its first block at its
     * first commit; shared blocks are found registered (or equal to
     * registered ones), so the walk registers nothing twice */
    *copy_src = from[n_share];
    *copy_dst = b;
    return true;
}

void kg_kv_seq_commit(kg_kv_t *kv, int32_t slot, const int32_t *tokens, int32_t n_computed) {
    if (!kv->p.prefix_cache) {
        return;
    }
    int32_t bs = kv->p.block_size;
    int32_t n_full = n_computed / bs;
    if (n_full > kv->n_seq[slot]) {
        n_full = kv->n_seq[slot];
    }
    const int32_t *row = kv->table + (size_t)slot * (size_t)kv->p.max_blocks_per_seq;
    for (int32_t i = kv->n_chain[slot]; i < n_full && row[i] >= 0; i++) {
        const int32_t *tok = tokens + (size_t)i * (size_t)bs;
        uint64_t h = block_hash(kv->chain_hash[slot], tok, bs);
        int32_t c =
            map_find(kv, kv->slot_key[slot], h, kv->chain_block[slot], kv->chain_gen[slot], tok);
        if (c < 0) {
            /* First time this block content (after this prefix) is cached. */
            c = row[i];
            kv->hash[c] = h;
            kv->key[c] = kv->slot_key[slot];
            kv->parent[c] = kv->chain_block[slot];
            kv->parent_gen[c] = kv->chain_gen[slot];
            memcpy(kv->tokens + (size_t)c * (size_t)bs, tok, (size_t)bs * sizeof(int32_t));
            kv->registered[c] = true;
            map_insert(kv, c);
            kv->st.n_registered++;
        }
        /* When another slot computed the same block first, our copy stays
         * private and the chain continues through the cached one, so our
         * later blocks still become findable. */
        kv->chain_hash[slot] = h;
        kv->chain_block[slot] = c;
        kv->chain_gen[slot] = kv->gen[c];
        kv->n_chain[slot] = i + 1;
    }
}

void kg_kv_seq_drop_front(kg_kv_t *kv, int32_t slot, int32_t n_blocks) {
    int32_t *row = kv->table + (size_t)slot * (size_t)kv->p.max_blocks_per_seq;
    if (n_blocks > kv->n_seq[slot]) {
        n_blocks = kv->n_seq[slot];
    }
    /* in position order: a windowed sequence leaves its blocks behind one
     * by one as it advances, so its oldest block is also the LRU's oldest */
    for (int32_t i = kv->n_dropped[slot]; i < n_blocks; i++) {
        unref_block(kv, row[i]);
        row[i] = -1;
    }
    if (n_blocks > kv->n_dropped[slot]) {
        kv->n_dropped[slot] = n_blocks;
    }
}

void kg_kv_seq_release(kg_kv_t *kv, int32_t slot) {
    int32_t *row = kv->table + (size_t)slot * (size_t)kv->p.max_blocks_per_seq;
    for (int32_t i = kv->n_seq[slot] - 1; i >= kv->n_dropped[slot]; i--) {
        unref_block(kv, row[i]);
        row[i] = -1;
    }
    kv->n_seq[slot] = 0;
    kv->n_dropped[slot] = 0;
    kv->n_chain[slot] = 0;
    kv->chain_hash[slot] = 0;
    kv->chain_block[slot] = -1;
    kv->chain_gen[slot] = 0;
    kv->slot_key[slot] = 0;
}
