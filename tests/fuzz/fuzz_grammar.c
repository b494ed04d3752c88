/* fuzz_grammar: arbitrary bytes as a constraint, through the grammar
 * compiler and the matcher. The first byte picks the kind (GBNF, regex,
 * JSON Schema, choice list); the rest is its text. Whatever compiles is
 * walked: at each step the mask must agree with token-by-token acceptance
 * on a sample of tokens, an allowed token must be accepted, and a forced
 * token must be allowed. A rejection must come with a message. Any crash,
 * leak, sanitizer report or disagreement is a finding. */
#include "grammar/kg_constraint.h"
#include "grammar/kg_grammar.h"
#include "schema/kg_json_schema.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
    if (!ok) {
        abort();
    }
}

/* every byte, and some multi-byte tokens, and one without text */
static kg_gvocab_t *vocab(void) {
    static kg_gvocab_t *v;
    if (v) {
        return v;
    }
    static const char *const extra[] = {"ab",   "\"",  "\":", "{\"", "true", "12",  "  ", "é",
                                        "\xc3", "a\"", "},",  "[1",  "null", "\\n", "xyz"};
    enum { NE = sizeof(extra) / sizeof(extra[0]), N = 256 + NE + 1 };
    static char bytes[256];
    const char *texts[N];
    size_t lens[N];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        texts[i] = &bytes[i];
        lens[i] = 1;
    }
    for (int i = 0; i < NE; i++) {
        texts[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
    }
    texts[N - 1] = "";
    lens[N - 1] = 0;
    char err[128];
    v = kg_gvocab_new_raw(texts, lens, N, err, sizeof(err));
    check(v != NULL);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) {
        return 0;
    }
    static const kg_constraint_kind_t kinds[4] = {KG_CONSTRAINT_GRAMMAR, KG_CONSTRAINT_REGEX,
                                                  KG_CONSTRAINT_JSON_SCHEMA, KG_CONSTRAINT_CHOICE};
    kg_constraint_t k = {
        .kind = kinds[data[0] % 4], .text = (const char *)data + 1, .len = size - 1};
    char *choice = NULL;
    if (k.kind == KG_CONSTRAINT_CHOICE) {
        /* lines of the text are the choices */
        const char *items[64];
        size_t lens[64];
        int32_t n = 0;
        size_t start = 0;
        for (size_t i = 0; i <= k.len && n < 64; i++) {
            if (i == k.len || k.text[i] == '\n') {
                if (i > start) {
                    items[n] = k.text + start;
                    lens[n++] = i - start;
                }
                start = i + 1;
            }
        }
        if (n == 0) {
            return 0;
        }
        size_t len;
        choice = kg_constraint_choice_encode(items, lens, n, &len);
        check(choice != NULL);
        k.text = choice;
        k.len = len;
    }
    char err[512] = "";
    kg_gir_t *ir = kg_constraint_build(&k, kg_json_schema_builder, NULL, err, sizeof(err));
    kg_grammar_t *g = ir ? kg_grammar_compile(ir, vocab(), err, sizeof(err)) : NULL;
    kg_gir_free(ir);
    if (!g) {
        check(err[0] != '\0');
        free(choice);
        return 0;
    }
    const kg_gvocab_t *v = vocab();
    kg_matcher_t *m = kg_matcher_new(), *t = kg_matcher_new();
    uint32_t *mask = malloc((size_t)kg_grammar_mask_words(g) * sizeof(uint32_t));
    check(m && t && mask);
    kg_matcher_reset(m, g);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) {
        h = (h ^ data[i]) * 1099511628211ull;
    }
    for (int step = 0; step < 48; step++) {
        bool any = kg_matcher_fill_mask(m, mask);
        int32_t allowed[64], n_allowed = 0;
        for (int32_t id = 0; id < v->n_vocab; id++) {
            bool bit = (mask[id >> 5] >> (id & 31)) & 1u;
            if (bit && n_allowed < 64) {
                allowed[n_allowed++] = id;
            }
            /* check a sample of tokens against acceptance */
            if ((id + step) % 7 == 0 || bit) {
                kg_matcher_copy(t, m);
                check(kg_matcher_accept(t, id) == bit);
            }
        }
        check(any == (n_allowed > 0));
        int32_t f = kg_matcher_forced(m);
        check(f < 0 || ((mask[f >> 5] >> (f & 31)) & 1u));
        if (n_allowed == 0) {
            break;
        }
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        int32_t pick = f >= 0 ? f : allowed[(h >> 33) % (uint64_t)n_allowed];
        check(kg_matcher_accept(m, pick));
    }
    free(mask);
    kg_matcher_free(m);
    kg_matcher_free(t);
    kg_grammar_unref(g);
    free(choice);
    return 0;
}
