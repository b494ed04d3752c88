/* check_wordpiece: the WordPiece (bert) tokenizer against llama.cpp's test
 * vectors for its bge vocabulary (tokenizer-vectors/ggml-vocab-bert-bge),
 * the [CLS] ... [SEP] framing special tokens add, and decoding. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

static kg_tokenizer_t *load_bge(void) {
    const char *path = kg_test_data("tokenizer-vectors/ggml-vocab-bert-bge.gguf");
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", path, err);
    kg_tokenizer_t *tok = kg_tokenizer_new(g, err, sizeof(err));
    ck_assert_msg(tok != NULL, "%s: %s", path, err);
    kg_gguf_free(g);
    return tok;
}

static int32_t *
encode(const kg_tokenizer_t *tok, const char *s, size_t len, bool special, int64_t *n) {
    const int64_t need = kg_tokenizer_encode(tok, s, len, special, false, NULL, 0);
    ck_assert_int_ge(need, 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    ck_assert_int_eq(kg_tokenizer_encode(tok, s, len, special, false, ids, need), need);
    *n = need;
    return ids;
}

START_TEST(bge_vectors) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    kg_tokenizer_t *tok = load_bge();
    ck_assert_int_eq(kg_tokenizer_kind(tok), KG_TOKENIZER_WPM);
    size_t n_in, n_out;
    char *inp =
        kg_test_read_file(kg_test_data("tokenizer-vectors/ggml-vocab-bert-bge.gguf.inp"), &n_in);
    char *out =
        kg_test_read_file(kg_test_data("tokenizer-vectors/ggml-vocab-bert-bge.gguf.out"), &n_out);
    ck_assert(inp && out);
    char *p = inp, *line = out;
    int n = 0, pass = 0;
    while (p < inp + n_in) {
        char *s = strstr(p, sep);
        ck_assert(s != NULL);
        char *nl = strchr(line, '\n');
        ck_assert(nl != NULL);
        *nl = '\0';
        int32_t want[1024];
        int64_t n_want = 0;
        for (char *q = line, *end;; q = end) {
            const long v = strtol(q, &end, 10);
            if (end == q) {
                break;
            }
            ck_assert_int_lt(n_want, 1024);
            want[n_want++] = (int32_t)v;
        }
        int64_t n_got;
        int32_t *got = encode(tok, p, (size_t)(s - p), false, &n_got);
        if (n_got == n_want && memcmp(got, want, (size_t)n_got * sizeof(int32_t)) == 0) {
            pass++;
        } else {
            fprintf(stderr, "bert-bge string %d: %lld ids, want %lld\n", n, (long long)n_got,
                    (long long)n_want);
        }
        free(got);
        n++;
        p = s + strlen(sep);
        line = nl + 1;
    }
    printf("tokenizer vectors bert-bge: %d/%d\n", pass, n);
    ck_assert_int_eq(n, 46);
    ck_assert_int_eq(pass, n);
    free(inp);
    free(out);
    kg_tokenizer_free(tok);
}
END_TEST

/* Special tokens frame the text as [CLS] ... [SEP] (llama.cpp adds both
 * whenever add_special is set); the rerank separator is [SEP]. */
START_TEST(bge_framing) {
    kg_tokenizer_t *tok = load_bge();
    ck_assert_int_eq(kg_tokenizer_bos(tok), 101);
    ck_assert_int_eq(kg_tokenizer_sep(tok), 102);
    ck_assert_int_eq(kg_tokenizer_eos(tok), -1);
    ck_assert(kg_tokenizer_add_sep(tok));
    ck_assert(!kg_tokenizer_add_eos(tok));
    int64_t n;
    int32_t *ids = encode(tok, "Hello world", 11, true, &n);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(ids[0], 101);
    ck_assert_int_eq(ids[1], 7592); /* "hello": lowercased */
    ck_assert_int_eq(ids[2], 2088);
    ck_assert_int_eq(ids[3], 102);
    free(ids);
    /* a word nothing matches is [UNK] whole; accents are stripped */
    ids = encode(tok, "caf\xc3\xa9 \xf0\x9f\x98\x80", 10, false, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ids[1], 100);
    char piece[32];
    const size_t len = kg_tokenizer_piece(tok, ids[0], false, piece, sizeof(piece));
    ck_assert_uint_eq(len, 5);
    ck_assert(memcmp(piece, " cafe", 5) == 0); /* "▁" decodes as a space */
    free(ids);
    kg_tokenizer_free(tok);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("wordpiece");
    TCase *tc = tcase_create("bge");
    tcase_add_test(tc, bge_vectors);
    tcase_add_test(tc, bge_framing);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
