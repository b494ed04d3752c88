/* kg_grammar_cache: compiled grammars by (constraint, vocabulary), LRU.
 *
 * A pipeline usually sends the same schema with every job; the cache makes
 * it compile once per worker. One cache serves one vocabulary (the
 * model's), so the key is the constraint's kind and text. Entries are
 * evicted least recently used first once their memory (kg_grammar_memory,
 * plus the key) passes the budget; an evicted grammar lives on while jobs
 * hold references. Failures are cached too (with their message), so a bad
 * schema sent with every job is diagnosed once. Counters are atomics so
 * the metrics thread can read them. @thread kafka (get/put), any (stats) */
#pragma once

#include "kg_constraint.h"
#include "kg_grammar.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kg_grammar_cache kg_grammar_cache_t;

#define KG_GRAMMAR_CACHE_DEFAULT_BYTES ((size_t)256 << 20)
#define KG_GRAMMAR_CACHE_MAX_ENTRIES   1024

typedef struct kg_grammar_cache_stats {
    int64_t hits, misses, evictions, errors;
    int64_t bytes, entries;
    int64_t compile_us; /* total time spent compiling (misses) */
} kg_grammar_cache_stats_t;

/** A cache for `vocab` (a reference is taken) holding up to `budget`
 * bytes. NULL on OOM. */
kg_grammar_cache_t *kg_grammar_cache_new(kg_gvocab_t *vocab, size_t budget);
/** A cache for the vocabulary of `tok` (borrowed; it must outlive the
 * cache), whose token trie is built on the first miss, so a worker that
 * never sees a constrained job never pays for it. */
kg_grammar_cache_t *kg_grammar_cache_new_for(const kg_tokenizer_t *tok, size_t budget);
void kg_grammar_cache_free(kg_grammar_cache_t *c);

/** The compiled grammar of `k` (a new reference: the caller unrefs it),
 * compiling it on a miss; JSON kinds are built by `json` (see
 * kg_constraint_build; NULL refuses them). NULL with the message in errstr
 * when the constraint cannot be compiled. */
kg_grammar_t *kg_grammar_cache_get_with(kg_grammar_cache_t *c,
                                        const kg_constraint_t *k,
                                        kg_gir_builder_fn json,
                                        void *json_ctx,
                                        char *errstr,
                                        size_t errstr_size);

/** kg_grammar_cache_get_with with no JSON builder context. */
kg_grammar_t *kg_grammar_cache_get(kg_grammar_cache_t *c,
                                   const kg_constraint_t *k,
                                   kg_gir_builder_fn json,
                                   char *errstr,
                                   size_t errstr_size);

void kg_grammar_cache_stats(const kg_grammar_cache_t *c, kg_grammar_cache_stats_t *out);
/** The vocabulary the cache compiles for (borrowed; NULL until built). */
kg_gvocab_t *kg_grammar_cache_vocab(const kg_grammar_cache_t *c);
