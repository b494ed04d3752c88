/* check_gguf: the GGUF reader on the shared model and vocabularies, on
 * hand-built malformed files (each rejected with its own message), on
 * every truncation and on random corruption (never a crash; the sanitizer
 * build runs this too); and the writer's round trip of every type. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static char err[512];

// ---- a little byte builder for hand-made files (independent of the writer) ----

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(buf_t *b, uint32_t v) {
    put(b, &v, 4);
}

static void put_u64(buf_t *b, uint64_t v) {
    put(b, &v, 8);
}

static void put_str(buf_t *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_header(buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

static void put_kv_u32(buf_t *b, const char *key, uint32_t v) {
    put_str(b, key);
    put_u32(b, KG_GGUF_TYPE_UINT32);
    put_u32(b, v);
}

static void put_tensor_info(buf_t *b,
                            const char *name,
                            uint32_t n_dims,
                            const int64_t *ne,
                            uint32_t type,
                            uint64_t offset) {
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) {
        put_u64(b, (uint64_t)ne[d]);
    }
    put_u32(b, type);
    put_u64(b, offset);
}

static void pad_to(buf_t *b, size_t align) {
    static const uint8_t zero[64];
    if (b->n % align) {
        put(b, zero, align - b->n % align);
    }
}

/** Open an exact-size heap copy so ASan sees any read past the end. */
static kg_gguf_t *open_copy(const void *data, size_t n, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    memcpy(*copy, data, n);
    err[0] = '\0';
    return kg_gguf_open_memory(*copy, n, err, sizeof(err));
}

/** Expect the image to be rejected with `needle` in the message. */
static void expect_reject(buf_t *b, const char *needle) {
    uint8_t *copy;
    kg_gguf_t *g = open_copy(b->p, b->n, &copy);
    ck_assert_msg(g == NULL, "accepted; wanted '%s'", needle);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    ck_assert_msg(strchr(err, '\n') == NULL, "multi-line error '%s'", err);
    free(copy);
    free(b->p);
    memset(b, 0, sizeof(*b));
}

// ---- the shared model ----

START_TEST(stories260k_keys) {
    const char *path = kg_test_data("models/stories260K.gguf");
    if (!kg_test_exists(path)) {
        ck_abort_msg("missing %s", path);
    }
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_uint_eq(kg_gguf_version(g), 3);
    ck_assert_uint_eq(kg_gguf_alignment(g), 32);
    ck_assert_int_eq(kg_gguf_n_kv(g), 19);

    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_str(g, "general.architecture", &s));
    ck_assert_int_eq(s.len, 5);
    ck_assert(memcmp(s.data, "llama", 5) == 0);
    uint32_t u;
    ck_assert(kg_gguf_get_u32(g, "llama.embedding_length", &u) && u == 64);
    ck_assert(kg_gguf_get_u32(g, "llama.block_count", &u) && u == 5);
    ck_assert(kg_gguf_get_u32(g, "llama.attention.head_count", &u) && u == 8);
    ck_assert(kg_gguf_get_u32(g, "llama.attention.head_count_kv", &u) && u == 4);
    ck_assert(kg_gguf_get_u32(g, "llama.feed_forward_length", &u) && u == 172);
    ck_assert(kg_gguf_get_u32(g, "llama.context_length", &u) && u == 128);
    ck_assert(kg_gguf_get_u32(g, "llama.rope.dimension_count", &u) && u == 8);
    int64_t i64;
    ck_assert(kg_gguf_get_i64(g, "llama.block_count", &i64) && i64 == 5);
    float f;
    ck_assert(kg_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
    ck_assert(fabsf(f - 1e-5f) < 1e-9f);
    ck_assert(!kg_gguf_get_f32(g, "llama.block_count", &f)); /* integer, not float */
    ck_assert(!kg_gguf_get_u32(g, "general.architecture", &u));
    ck_assert(!kg_gguf_get_str(g, "llama.block_count", &s));
    ck_assert(!kg_gguf_get_u32(g, "llama.rope.freq_base", &u)); /* absent */
    ck_assert_int_eq(kg_gguf_find_key(g, "no.such.key"), -1);
    int64_t k = kg_gguf_find_key(g, "llama.block_count");
    ck_assert_int_ge(k, 0);
    ck_assert(kg_gguf_key(g, k).len == strlen("llama.block_count"));
    ck_assert_int_eq(kg_gguf_kv_type(g, k), KG_GGUF_TYPE_UINT32);

    ck_assert(kg_gguf_get_str(g, "tokenizer.ggml.model", &s));
    ck_assert(s.len == 5 && memcmp(s.data, "llama", 5) == 0);
    ck_assert(kg_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) && u == 1);
    ck_assert(kg_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) && u == 2);
    ck_assert(kg_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &u) && u == 0);

    kg_gguf_type_t et;
    uint64_t n;
    ck_assert(kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n));
    ck_assert_int_eq(et, KG_GGUF_TYPE_STRING);
    ck_assert_int_eq(n, 512);
    s = kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 1);
    ck_assert(s.len == 3 && memcmp(s.data, "<s>", 3) == 0);
    s = kg_gguf_arr_str(g, "tokenizer.ggml.tokens", 13);
    ck_assert(s.len == 6 && memcmp(s.data, "<0x0A>", 6) == 0);
    ck_assert(!kg_gguf_get_arr(g, "llama.block_count", &et, &n));
    ck_assert(!kg_gguf_arr_f32(g, "tokenizer.ggml.tokens", NULL, 512));

    int32_t types[512];
    ck_assert(!kg_gguf_arr_i32(g, "tokenizer.ggml.token_type", types, 511)); /* wrong n */
    ck_assert(kg_gguf_arr_i32(g, "tokenizer.ggml.token_type", types, 512));
    int count[8] = {0};
    for (int i = 0; i < 512; i++) {
        ck_assert(types[i] >= 0 && types[i] < 8);
        count[types[i]]++;
    }
    ck_assert_int_eq(count[1], 253);
    ck_assert_int_eq(count[2], 1);
    ck_assert_int_eq(count[3], 2);
    ck_assert_int_eq(count[6], 256);
    float scores[512];
    ck_assert(kg_gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 512));
    ck_assert(!kg_gguf_arr_i32(g, "tokenizer.ggml.scores", types, 512)); /* float to int */
    kg_gguf_free(g);
}
END_TEST

static void check_shape(const kg_gguf_t *g, const char *name, int64_t ne0, int64_t ne1) {
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
    ck_assert_msg(t != NULL, "no tensor %s", name);
    ck_assert_int_eq(t->type, KG_GGML_TYPE_F32);
    ck_assert_uint_eq(t->n_dims, ne1 ? 2 : 1);
    ck_assert_int_eq(t->ne[0], ne0);
    ck_assert_int_eq(t->ne[1], ne1 ? ne1 : 1);
    ck_assert_int_eq(t->size, (size_t)(ne0 * (ne1 ? ne1 : 1) * 4));
    ck_assert_int_eq((uintptr_t)t->data % 32, 0);
}

START_TEST(stories260k_tensors) {
    kg_gguf_t *g = kg_gguf_open(kg_test_data("models/stories260K.gguf"), err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_int_eq(kg_gguf_n_tensors(g), 48);
    check_shape(g, "token_embd.weight", 64, 512);
    check_shape(g, "output.weight", 64, 512);
    check_shape(g, "output_norm.weight", 64, 0);
    char name[64];
    for (int l = 0; l < 5; l++) {
        snprintf(name, sizeof(name), "blk.%d.attn_q.weight", l);
        check_shape(g, name, 64, 64);
        snprintf(name, sizeof(name), "blk.%d.attn_k.weight", l);
        check_shape(g, name, 64, 32);
        snprintf(name, sizeof(name), "blk.%d.attn_v.weight", l);
        check_shape(g, name, 64, 32);
        snprintf(name, sizeof(name), "blk.%d.attn_output.weight", l);
        check_shape(g, name, 64, 64);
        snprintf(name, sizeof(name), "blk.%d.ffn_gate.weight", l);
        check_shape(g, name, 64, 172);
        snprintf(name, sizeof(name), "blk.%d.ffn_up.weight", l);
        check_shape(g, name, 64, 172);
        snprintf(name, sizeof(name), "blk.%d.ffn_down.weight", l);
        check_shape(g, name, 172, 64);
        snprintf(name, sizeof(name), "blk.%d.attn_norm.weight", l);
        check_shape(g, name, 64, 0);
        snprintf(name, sizeof(name), "blk.%d.ffn_norm.weight", l);
        check_shape(g, name, 64, 0);
    }
    ck_assert_ptr_null(kg_gguf_find_tensor(g, "blk.5.attn_q.weight"));
    ck_assert_ptr_null(kg_gguf_find_tensor(g, "token_embd.weigh"));
    // the README: output.weight is a copy of token_embd.weight
    const kg_gguf_tensor_t *a = kg_gguf_find_tensor(g, "token_embd.weight");
    const kg_gguf_tensor_t *b = kg_gguf_find_tensor(g, "output.weight");
    ck_assert(a->data != b->data);
    ck_assert_mem_eq(a->data, b->data, a->size);
    // every tensor's index entry is what find_tensor returns, and lies in the file
    size_t total = 0;
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        char nm[128];
        snprintf(nm, sizeof(nm), "%.*s", (int)t->name.len, t->name.data);
        ck_assert_ptr_eq(kg_gguf_find_tensor(g, nm), t);
        total += t->size;
    }
    ck_assert_int_eq(total, 292800 * 4); /* llama.cpp counts 292.80 K, the output copy included */
    ck_assert_str_eq(kg_ggml_type_name(a->type), "f32");
    kg_gguf_free(g);
}
END_TEST

START_TEST(vocab_files_open) {
    static const struct {
        const char *file;
        uint64_t n_vocab;
        const char *model;
    } vocabs[] = {
        {"tokenizer-vectors/ggml-vocab-phi-3.gguf", 32064, "llama"},
        {"tokenizer-vectors/ggml-vocab-gpt-2.gguf", 50257, "gpt2"},
        {"tokenizer-vectors/ggml-vocab-falcon.gguf", 65024, "gpt2"},
        {"tokenizer-vectors/ggml-vocab-mpt.gguf", 50432, "gpt2"},
    };
    for (size_t i = 0; i < sizeof(vocabs) / sizeof(vocabs[0]); i++) {
        kg_gguf_t *g = kg_gguf_open(kg_test_data(vocabs[i].file), err, sizeof(err));
        ck_assert_msg(g != NULL, "%s: %s", vocabs[i].file, err);
        ck_assert_int_eq(kg_gguf_n_tensors(g), 0);
        kg_gguf_type_t et;
        uint64_t n;
        ck_assert(kg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n));
        ck_assert_int_eq(et, KG_GGUF_TYPE_STRING);
        ck_assert_int_eq(n, vocabs[i].n_vocab);
        kg_gguf_str_t s;
        ck_assert(kg_gguf_get_str(g, "tokenizer.ggml.model", &s));
        ck_assert(s.len == strlen(vocabs[i].model) && memcmp(s.data, vocabs[i].model, s.len) == 0);
        // the last token is readable and inside the file's bytes
        s = kg_gguf_arr_str(g, "tokenizer.ggml.tokens", n - 1);
        ck_assert(s.len > 0);
        if (strcmp(vocabs[i].model, "gpt2") == 0) {
            ck_assert(kg_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n));
            ck_assert_int_eq(et, KG_GGUF_TYPE_STRING);
            ck_assert(n > 40000);
        }
        kg_gguf_free(g);
    }
}
END_TEST

START_TEST(open_errors) {
    ck_assert_ptr_null(kg_gguf_open("/nonexistent/x.gguf", err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "cannot open '/nonexistent/x.gguf'"));
    ck_assert_ptr_null(kg_gguf_open(KG_TEST_TMP, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    const char *empty = kg_test_tmp_path("empty");
    FILE *f = fopen(empty, "w");
    fclose(f);
    ck_assert_ptr_null(kg_gguf_open(empty, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "truncated"));
    // a NULL / zero-size errstr is allowed
    ck_assert_ptr_null(kg_gguf_open(empty, NULL, 0));
    kg_gguf_free(NULL);
}
END_TEST

// ---- hand-built malformed files ----

START_TEST(malformed_headers) {
    buf_t b = {0};
    put(&b, "GGML", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 0);
    expect_reject(&b, "bad magic at offset 0");

    put_header(&b, 1, 0, 0);
    expect_reject(&b, "version 1 at offset 4 is not supported");
    put_header(&b, 4, 0, 0);
    expect_reject(&b, "version 4 at offset 4 is not supported");
    put_header(&b, 0x03000000, 0, 0);
    expect_reject(&b, "big-endian");

    // the smallest valid file: no keys, no tensors
    put_header(&b, 2, 0, 0);
    uint8_t *copy;
    kg_gguf_t *g = open_copy(b.p, b.n, &copy);
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_uint_eq(kg_gguf_version(g), 2);
    ck_assert_int_eq(kg_gguf_n_kv(g), 0);
    ck_assert_int_eq(kg_gguf_find_key(g, "x"), -1);
    ck_assert_ptr_null(kg_gguf_find_tensor(g, "x"));
    kg_gguf_free(g);
    free(copy);
    free(b.p);
    memset(&b, 0, sizeof(b));

    put_header(&b, 3, 0, 1000000000000ull);
    expect_reject(&b, "key count 1000000000000 at offset 16 cannot fit");
    put_header(&b, 3, UINT64_MAX, 0);
    expect_reject(&b, "tensor count");

    // a string length near 2^64 must not wrap the bounds check
    put_header(&b, 3, 0, 1);
    put_u64(&b, UINT64_MAX - 3);
    put(&b, "abcdefgh", 8);
    expect_reject(&b, "truncated file: key 0 name at offset 32 needs 18446744073709551612 bytes");

    put_header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, 13);
    expect_reject(&b, "key 'k' at offset 33: unknown value type 13");

    put_header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, KG_GGUF_TYPE_ARRAY);
    put_u32(&b, KG_GGUF_TYPE_UINT32);
    put_u64(&b, 1ull << 62); /* n * 4 would wrap */
    expect_reject(&b,
                  "truncated file: key 'k' value at offset 49 needs 4611686018427387904 elements");

    put_header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, KG_GGUF_TYPE_ARRAY);
    put_u32(&b, KG_GGUF_TYPE_STRING);
    put_u64(&b, 1ull << 61);
    expect_reject(&b, "strings of at least 8 bytes");

    put_header(&b, 3, 0, 2);
    put_kv_u32(&b, "a.b", 1);
    put_kv_u32(&b, "a.b", 2);
    expect_reject(&b, "duplicate key 'a.b' at offset 43");
}
END_TEST

START_TEST(malformed_alignment) {
    static const uint32_t bad[] = {0, 3, 48, 0x80000000u};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        buf_t b = {0};
        put_header(&b, 3, 0, 1);
        put_kv_u32(&b, "general.alignment", bad[i]);
        expect_reject(&b, "not a power of two");
    }
    buf_t b = {0};
    put_header(&b, 3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, KG_GGUF_TYPE_FLOAT32);
    put_u32(&b, 0);
    expect_reject(&b, "general.alignment at offset 53 has type f32");

    // alignment 64: a tensor at data offset 32 is misaligned, at 64 it is fine
    int64_t ne[1] = {8};
    for (int ok = 0; ok < 2; ok++) {
        put_header(&b, 3, 1, 1);
        put_kv_u32(&b, "general.alignment", 64);
        put_tensor_info(&b, "t", 1, ne, KG_GGML_TYPE_F32, ok ? 64 : 32);
        pad_to(&b, 64);
        static const uint8_t zero[128];
        put(&b, zero, 128);
        if (ok) {
            uint8_t *copy;
            kg_gguf_t *g = open_copy(b.p, b.n, &copy);
            ck_assert_msg(g != NULL, "%s", err);
            ck_assert_uint_eq(kg_gguf_alignment(g), 64);
            const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, "t");
            ck_assert_ptr_eq(t->data, copy + 128 + 64);
            kg_gguf_free(g);
            free(copy);
            free(b.p);
            memset(&b, 0, sizeof(b));
        } else {
            expect_reject(&b, "data offset 32 is not a multiple of the alignment 64");
        }
    }
}
END_TEST

static void tensor_file(buf_t *b,
                        const char *name,
                        uint32_t n_dims,
                        const int64_t *ne,
                        uint32_t type,
                        uint64_t offset,
                        size_t data_bytes) {
    put_header(b, 3, 1, 0);
    put_tensor_info(b, name, n_dims, ne, type, offset);
    pad_to(b, 32);
    uint8_t *zero = calloc(1, data_bytes + 1);
    put(b, zero, data_bytes);
    free(zero);
}

START_TEST(malformed_tensors) {
    buf_t b = {0};
    int64_t ne[5] = {32, 2, 1, 1, 1};
    tensor_file(&b, "x", 2, ne, 16, 0, 256); /* iq2_xxs: a real ggml type kgen does not read */
    expect_reject(&b, "tensor 'x' has type iq2_xxs (16), which kgen does not support");
    tensor_file(&b, "x", 2, ne, 4, 0, 256); /* an id ggml retired */
    expect_reject(&b, "tensor 'x' has type unknown (4), which kgen does not support");
    tensor_file(&b, "x", 2, ne, 1000, 0, 256);
    expect_reject(&b, "tensor 'x' has type unknown (1000)");
    tensor_file(&b, "x", 0, ne, 0, 0, 256);
    expect_reject(&b, "tensor 'x' at offset 33: n_dims 0 not in 1..4");
    tensor_file(&b, "x", 5, ne, 0, 0, 256);
    expect_reject(&b, "n_dims 5 not in 1..4");
    int64_t neg[2] = {-32, 1};
    tensor_file(&b, "x", 2, neg, 0, 0, 256);
    expect_reject(&b, "tensor 'x' at offset 37: ne[0] is negative");
    int64_t odd[2] = {48, 1};
    tensor_file(&b, "x", 2, odd, KG_GGML_TYPE_Q8_0, 0, 256);
    expect_reject(&b, "ne[0] = 48 is not a multiple of the q8_0 block size 32");
    int64_t huge[4] = {1ll << 40, 1ll << 40, 1, 1};
    tensor_file(&b, "x", 2, huge, 0, 0, 256);
    expect_reject(&b, "element count overflows");
    int64_t big[4] = {1ll << 30, 1ll << 31, 1, 1}; /* 2^61 elements of 4 bytes */
    tensor_file(&b, "x", 2, big, 0, 0, 256);
    expect_reject(&b, "truncated file: tensor 'x' data");
    int64_t wrap[4] = {1ll << 31, 1ll << 31, 1, 1}; /* 2^62 elements: 2^64 bytes */
    tensor_file(&b, "x", 2, wrap, 0, 0, 256);
    expect_reject(&b, "byte size overflows");
    tensor_file(&b, "x", 2, ne, 0, 33, 512);
    expect_reject(&b, "data offset 33 is not a multiple of the alignment 32");
    tensor_file(&b, "x", 2, ne, 0, 0, 255); /* one byte short */
    expect_reject(&b, "truncated file: tensor 'x' data at offset 96 needs 256 bytes, file has 351");
    tensor_file(&b, "x", 2, ne, 0, UINT64_MAX - 31, 256); /* offset + size wraps */
    expect_reject(&b, "truncated file: tensor 'x' data");

    // two tensors with one name
    put_header(&b, 3, 2, 0);
    put_tensor_info(&b, "w", 2, ne, 0, 0);
    put_tensor_info(&b, "w", 2, ne, 0, 256);
    pad_to(&b, 32);
    uint8_t zero[512] = {0};
    put(&b, zero, 512);
    expect_reject(&b, "duplicate tensor 'w' at offset");

    // a truncated tensor info names the tensor index
    put_header(&b, 3, 2, 0);
    put_tensor_info(&b, "w", 2, ne, 0, 0);
    put_u64(&b, 4000);
    put(&b, "abcdefghijabcdefghijabcdefghijabcdefghij", 40);
    expect_reject(&b,
                  "truncated file: tensor info 1 name at offset 73 needs 4000 bytes, file has 113");

    // non-printable names are shown safely
    tensor_file(&b, "a\nb", 2, ne, 19, 0, 256);
    expect_reject(&b, "tensor 'a?b' has type iq1_s (19)");

    // zero-element tensors are fine
    int64_t empty[2] = {0, 4};
    tensor_file(&b, "e", 2, empty, KG_GGML_TYPE_Q4_K, 0, 0);
    uint8_t *copy;
    kg_gguf_t *g = open_copy(b.p, b.n, &copy);
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_int_eq(kg_gguf_tensor(g, 0)->size, 0);
    kg_gguf_free(g);
    free(copy);
    free(b.p);
}
END_TEST

static void nested_array(buf_t *b, int depth) {
    put_header(b, 3, 0, 1);
    put_str(b, "nest");
    put_u32(b, KG_GGUF_TYPE_ARRAY);
    for (int d = 1; d < depth; d++) {
        put_u32(b, KG_GGUF_TYPE_ARRAY);
        put_u64(b, 1);
    }
    put_u32(b, KG_GGUF_TYPE_INT16);
    put_u64(b, 2);
    put_u32(b, 0xffff0007u); /* 7, -1 */
}

START_TEST(nested_arrays) {
    buf_t b = {0};
    nested_array(&b, 2);
    uint8_t *copy;
    kg_gguf_t *g = open_copy(b.p, b.n, &copy);
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_type_t et;
    uint64_t n;
    ck_assert(kg_gguf_get_arr(g, "nest", &et, &n));
    ck_assert_int_eq(et, KG_GGUF_TYPE_ARRAY);
    ck_assert_int_eq(n, 1);
    float f[1];
    ck_assert(!kg_gguf_arr_f32(g, "nest", f, 1));
    kg_gguf_free(g);
    free(copy);
    free(b.p);
    memset(&b, 0, sizeof(b));

    nested_array(&b, 1);
    g = open_copy(b.p, b.n, &copy);
    ck_assert_msg(g != NULL, "%s", err);
    int32_t v[2];
    ck_assert(kg_gguf_arr_i32(g, "nest", v, 2));
    ck_assert_int_eq(v[0], 7);
    ck_assert_int_eq(v[1], -1);
    float fv[2];
    ck_assert(kg_gguf_arr_f32(g, "nest", fv, 2));
    ck_assert(fv[0] == 7.0f && fv[1] == -1.0f);
    kg_gguf_free(g);
    free(copy);
    free(b.p);
    memset(&b, 0, sizeof(b));

    nested_array(&b, 8);
    g = open_copy(b.p, b.n, &copy);
    ck_assert_msg(g != NULL, "%s", err);
    kg_gguf_free(g);
    free(copy);
    free(b.p);
    memset(&b, 0, sizeof(b));

    nested_array(&b, 9);
    expect_reject(&b, "nested deeper than 8");
}
END_TEST

// ---- truncation and corruption of the shared model ----

/** End of the tensor infos (= start of the padding before the data). */
static size_t header_end(const uint8_t *data, size_t size) {
    kg_gguf_t *g = kg_gguf_open_memory(data, size, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    size_t first = size;
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        size_t off = (size_t)((const uint8_t *)kg_gguf_tensor(g, i)->data - data);
        first = off < first ? off : first;
    }
    kg_gguf_free(g);
    return first;
}

START_TEST(stories260k_truncations) {
    size_t size;
    uint8_t *data = (uint8_t *)kg_test_read_file(kg_test_data("models/stories260K.gguf"), &size);
    ck_assert_ptr_nonnull(data);
    ck_assert_int_eq(size, 1185376);
    size_t hdr = header_end(data, size);
    ck_assert(hdr > 1000 && hdr < 20000);
    int n_checked = 0;
    // every length through the metadata and tensor infos, each in an exact-size copy
    for (size_t len = 0; len <= hdr; len++) {
        uint8_t *copy;
        kg_gguf_t *g = open_copy(data, len, &copy);
        ck_assert_msg(g == NULL, "accepted a %zu-byte prefix", len);
        ck_assert_msg(err[0] != '\0', "no error for length %zu", len);
        free(copy);
        n_checked++;
    }
    // then every 997th length through the data (the reader does not read tensor data
    // at open, so the original buffer with a smaller size is exact enough), and the
    // full length minus one
    for (size_t len = hdr + 1; len < size; len += 997) {
        err[0] = '\0';
        ck_assert_ptr_null(kg_gguf_open_memory(data, len, err, sizeof(err)));
        ck_assert_ptr_nonnull(strstr(err, "truncated file: tensor"));
        n_checked++;
    }
    ck_assert_ptr_null(kg_gguf_open_memory(data, size - 1, err, sizeof(err)));
    kg_gguf_t *g = kg_gguf_open_memory(data, size, err, sizeof(err));
    ck_assert_ptr_nonnull(g);
    kg_gguf_free(g);
    ck_assert_int_gt(n_checked, 2000);
    free(data);
}
END_TEST

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/** Touch everything an opened file offers, as a consumer would. */
static void touch_all(const kg_gguf_t *g) {
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        kg_gguf_str_t k = kg_gguf_key(g, i);
        char key[256];
        if (k.len >= sizeof(key) || memchr(k.data, 0, (size_t)k.len)) {
            continue;
        }
        memcpy(key, k.data, (size_t)k.len);
        key[k.len] = '\0';
        ck_assert_int_eq(kg_gguf_find_key(g, key), i);
        kg_gguf_type_t et;
        uint64_t n;
        if (kg_gguf_get_arr(g, key, &et, &n)) {
            if (et == KG_GGUF_TYPE_STRING && n > 0) {
                kg_gguf_str_t s = kg_gguf_arr_str(g, key, n - 1);
                volatile char c = s.len ? s.data[s.len - 1] : 0;
                (void)c;
            } else if (n > 0 && n < 100000) {
                float *f = malloc(n * sizeof(float));
                kg_gguf_arr_f32(g, key, f, n);
                kg_gguf_arr_i32(g, key, (int32_t *)f, n);
                free(f);
            }
        }
        uint32_t u;
        int64_t i64;
        float f;
        bool bo;
        kg_gguf_str_t s;
        kg_gguf_get_u32(g, key, &u);
        kg_gguf_get_i64(g, key, &i64);
        kg_gguf_get_f32(g, key, &f);
        kg_gguf_get_bool(g, key, &bo);
        if (kg_gguf_get_str(g, key, &s) && s.len > 0) {
            volatile char c = s.data[s.len - 1];
            (void)c;
        }
    }
    float row[512];
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(g, i);
        int64_t blck = kg_type_block_elems(t->type);
        int64_t n = t->ne[0] < 256 ? t->ne[0] : 256;
        n -= n % blck;
        if (n > 0 && t->size > 0) {
            kg_dequantize(t->type, t->data, row, n);
        }
    }
}

START_TEST(stories260k_byte_flips) {
    size_t size;
    uint8_t *data = (uint8_t *)kg_test_read_file(kg_test_data("models/stories260K.gguf"), &size);
    size_t hdr = header_end(data, size);
    rng_state = 20240601;
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 3000; it++) {
        size_t pos[4];
        uint8_t old[4];
        int n_flip = 1 + (int)(rng_next() % 4);
        for (int k = 0; k < n_flip; k++) {
            // the fixed header and the first key/tensor bytes get extra attention
            pos[k] = (it & 1) ? rng_next() % hdr : rng_next() % 128;
            old[k] = data[pos[k]];
            data[pos[k]] ^= (uint8_t)(1u << (rng_next() % 8));
            if (rng_next() % 4 == 0) {
                data[pos[k]] = (uint8_t)rng_next();
            }
        }
        err[0] = '\0';
        kg_gguf_t *g = kg_gguf_open_memory(data, size, err, sizeof(err));
        if (g) {
            touch_all(g);
            kg_gguf_free(g);
            n_ok++;
        } else {
            ck_assert_msg(err[0] != '\0', "no error text");
            ck_assert_ptr_nonnull(strstr(err, "gguf: "));
            n_err++;
        }
        for (int k = n_flip - 1; k >= 0; k--) {
            data[pos[k]] = old[k];
        }
    }
    // both outcomes must occur, or the flips are not reaching the parser
    ck_assert_int_gt(n_ok, 100);
    ck_assert_int_gt(n_err, 100);
    free(data);
}
END_TEST

// ---- the writer ----

/** A small file with one entry of every metadata type and one tensor of every
 * tensor type (Q4_K and Q6_K as raw blocks). */
static kg_gguf_writer_t *make_all_types(void) {
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    kg_gguf_writer_set_str(w, "general.architecture", "llama");
    kg_gguf_writer_set_u8(w, "t.u8", 250);
    kg_gguf_writer_set_i8(w, "t.i8", -100);
    kg_gguf_writer_set_u16(w, "t.u16", 65000);
    kg_gguf_writer_set_i16(w, "t.i16", -30000);
    kg_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    kg_gguf_writer_set_i32(w, "t.i32", -2000000000);
    kg_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull);
    kg_gguf_writer_set_i64(w, "t.i64", INT64_MIN);
    kg_gguf_writer_set_f32(w, "t.f32", 0.1f);
    kg_gguf_writer_set_f64(w, "t.f64", 1e300);
    kg_gguf_writer_set_bool(w, "t.bool", true);
    kg_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo");
    kg_gguf_writer_set_str(w, "t.empty", "");
    kg_gguf_str_t strs[3] = {{"a", 1}, {"", 0}, {"with\0nul", 8}};
    kg_gguf_writer_set_arr_str(w, "t.arr_str", strs, 3);
    float fa[3] = {1.5f, -2.0f, 3.25f};
    kg_gguf_writer_set_arr_f32(w, "t.arr_f32", fa, 3);
    int32_t ia[4] = {1, -2, 3, INT32_MIN};
    kg_gguf_writer_set_arr_i32(w, "t.arr_i32", ia, 4);
    uint8_t u8a[2] = {0, 255};
    kg_gguf_writer_set_arr(w, "t.arr_u8", KG_GGUF_TYPE_UINT8, u8a, 2);
    int16_t i16a[2] = {-5, 5};
    kg_gguf_writer_set_arr(w, "t.arr_i16", KG_GGUF_TYPE_INT16, i16a, 2);
    uint64_t u64a[2] = {1, 1ull << 40};
    kg_gguf_writer_set_arr(w, "t.arr_u64", KG_GGUF_TYPE_UINT64, u64a, 2);
    double f64a[1] = {0.5};
    kg_gguf_writer_set_arr(w, "t.arr_f64", KG_GGUF_TYPE_FLOAT64, f64a, 1);
    uint8_t ba[2] = {1, 0};
    kg_gguf_writer_set_arr(w, "t.arr_bool", KG_GGUF_TYPE_BOOL, ba, 2);
    kg_gguf_writer_set_arr(w, "t.arr_empty", KG_GGUF_TYPE_INT32, NULL, 0);
    kg_gguf_writer_set_u32(w, "t.replaced", 1);
    kg_gguf_writer_set_u32(w, "t.replaced", 2); /* replaces in place */

    static float vals[64 * 3];
    for (int i = 0; i < 64 * 3; i++) {
        vals[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    }
    static const kg_ggml_type_t types[] = {KG_GGML_TYPE_F32, KG_GGML_TYPE_F16, KG_GGML_TYPE_BF16,
                                           KG_GGML_TYPE_Q8_0, KG_GGML_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "w.%s", kg_ggml_type_name(types[i]));
        int64_t ne[2] = {64, 3};
        ck_assert_int_eq(kg_gguf_writer_add_tensor(w, name, types[i], 2, ne, vals), KG_OK);
    }
    static uint8_t kblocks[2 * 210];
    for (size_t i = 0; i < sizeof(kblocks); i++) {
        kblocks[i] = (uint8_t)(i * 7 + 3);
    }
    kblocks[0] = 0x00; /* keep the fp16 scales finite: d of the Q4_K block */
    kblocks[1] = 0x3c;
    int64_t ne1[1] = {256};
    ck_assert_int_eq(
        kg_gguf_writer_add_tensor_raw(w, "w.q4_k", KG_GGML_TYPE_Q4_K, 1, ne1, kblocks, 144), KG_OK);
    int64_t ne3[3] = {256, 1, 2};
    ck_assert_int_eq(
        kg_gguf_writer_add_tensor_raw(w, "w.q6_k", KG_GGML_TYPE_Q6_K, 3, ne3, kblocks, 420), KG_OK);
    int64_t ne4[4] = {2, 3, 4, 5};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "w.4d", KG_GGML_TYPE_F32, 4, ne4, vals), KG_OK);
    return w;
}

static bool str_is(kg_gguf_str_t s, const char *want, size_t len) {
    return s.len == len && memcmp(s.data, want, len) == 0;
}

START_TEST(writer_round_trip) {
    kg_gguf_writer_t *w = make_all_types();
    const char *path = kg_test_tmp_path("all-types");
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_uint_eq(kg_gguf_version(g), 3);
    ck_assert_uint_eq(kg_gguf_alignment(g), 32);
    ck_assert_int_eq(kg_gguf_n_kv(g), 25); /* 24 set + general.alignment */
    ck_assert_int_eq(kg_gguf_find_key(g, "general.alignment"), 24);
    ck_assert_int_eq(kg_gguf_find_key(g, "t.replaced"), 23);

    uint32_t u;
    int64_t i;
    float f;
    bool b;
    kg_gguf_str_t s;
    ck_assert(kg_gguf_get_u32(g, "t.u8", &u) && u == 250);
    ck_assert_int_eq(kg_gguf_kv_type(g, kg_gguf_find_key(g, "t.u8")), KG_GGUF_TYPE_UINT8);
    ck_assert(kg_gguf_get_i64(g, "t.i8", &i) && i == -100);
    ck_assert(!kg_gguf_get_u32(g, "t.i8", &u)); /* negative: no u32 */
    ck_assert(kg_gguf_get_u32(g, "t.u16", &u) && u == 65000);
    ck_assert(kg_gguf_get_i64(g, "t.i16", &i) && i == -30000);
    ck_assert(kg_gguf_get_u32(g, "t.u32", &u) && u == 4000000000u);
    ck_assert(kg_gguf_get_i64(g, "t.u32", &i) && i == 4000000000ll);
    ck_assert(kg_gguf_get_i64(g, "t.i32", &i) && i == -2000000000);
    u = 77;
    ck_assert(!kg_gguf_get_u32(g, "t.u64", &u)); /* too big; output untouched */
    ck_assert_uint_eq(u, 77);
    ck_assert(!kg_gguf_get_i64(g, "t.u64", &i));
    ck_assert(kg_gguf_get_i64(g, "t.i64", &i) && i == INT64_MIN);
    ck_assert(kg_gguf_get_f32(g, "t.f32", &f) && f == 0.1f);
    ck_assert(kg_gguf_get_f32(g, "t.f64", &f) && isinf(f)); /* 1e300 as float */
    ck_assert(kg_gguf_get_bool(g, "t.bool", &b) && b);
    ck_assert(!kg_gguf_get_bool(g, "t.u8", &b));
    ck_assert(kg_gguf_get_str(g, "t.str", &s) && str_is(s, "h\xc3\xa9llo", 6));
    ck_assert(kg_gguf_get_str(g, "t.empty", &s) && s.len == 0);
    ck_assert(kg_gguf_get_u32(g, "t.replaced", &u) && u == 2);

    kg_gguf_type_t et;
    uint64_t n;
    ck_assert(kg_gguf_get_arr(g, "t.arr_str", &et, &n) && et == KG_GGUF_TYPE_STRING && n == 3);
    ck_assert(str_is(kg_gguf_arr_str(g, "t.arr_str", 0), "a", 1));
    ck_assert(str_is(kg_gguf_arr_str(g, "t.arr_str", 1), "", 0));
    ck_assert(str_is(kg_gguf_arr_str(g, "t.arr_str", 2), "with\0nul", 8));
    float fa[4];
    ck_assert(kg_gguf_arr_f32(g, "t.arr_f32", fa, 3));
    ck_assert(fa[0] == 1.5f && fa[1] == -2.0f && fa[2] == 3.25f);
    int32_t ia[4];
    ck_assert(kg_gguf_arr_i32(g, "t.arr_i32", ia, 4));
    ck_assert(ia[0] == 1 && ia[1] == -2 && ia[2] == 3 && ia[3] == INT32_MIN);
    ck_assert(kg_gguf_arr_f32(g, "t.arr_i32", fa, 4) && fa[1] == -2.0f); /* ints to float */
    ck_assert(kg_gguf_arr_i32(g, "t.arr_u8", ia, 2) && ia[0] == 0 && ia[1] == 255);
    ck_assert(kg_gguf_arr_i32(g, "t.arr_i16", ia, 2) && ia[0] == -5 && ia[1] == 5);
    ia[0] = 42;
    ck_assert(!kg_gguf_arr_i32(g, "t.arr_u64", ia, 2)); /* 2^40 does not fit int32 */
    ck_assert_int_eq(ia[0], 42);                        /* untouched */
    ck_assert(kg_gguf_arr_f32(g, "t.arr_u64", fa, 2) && fa[1] == 1099511627776.0f);
    ck_assert(kg_gguf_arr_f32(g, "t.arr_f64", fa, 1) && fa[0] == 0.5f);
    ck_assert(!kg_gguf_arr_i32(g, "t.arr_bool", ia, 2));
    ck_assert(kg_gguf_get_arr(g, "t.arr_bool", &et, &n) && et == KG_GGUF_TYPE_BOOL && n == 2);
    ck_assert(kg_gguf_get_arr(g, "t.arr_empty", &et, &n) && et == KG_GGUF_TYPE_INT32 && n == 0);
    ck_assert(kg_gguf_arr_i32(g, "t.arr_empty", ia, 0));

    // tensors: same bytes as a direct conversion, data aligned, shapes kept
    ck_assert_int_eq(kg_gguf_n_tensors(g), 8);
    static float vals[64 * 3];
    for (int k = 0; k < 64 * 3; k++) {
        vals[k] = (float)((k * 37) % 101 - 50) / 25.0f;
    }
    static const kg_ggml_type_t types[] = {KG_GGML_TYPE_F32, KG_GGML_TYPE_F16, KG_GGML_TYPE_BF16,
                                           KG_GGML_TYPE_Q8_0, KG_GGML_TYPE_Q4_0};
    uint8_t want[64 * 3 * 4];
    float back[64 * 3];
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        char name[32];
        snprintf(name, sizeof(name), "w.%s", kg_ggml_type_name(types[k]));
        const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
        ck_assert_msg(t != NULL, "%s", name);
        ck_assert_int_eq(t->type, types[k]);
        ck_assert_uint_eq(t->n_dims, 2);
        ck_assert(t->ne[0] == 64 && t->ne[1] == 3 && t->ne[2] == 1 && t->ne[3] == 1);
        ck_assert_int_eq(t->size, kg_type_row_size(types[k], 64) * 3);
        ck_assert_int_eq(t->offset % 32, 0);
        ck_assert(kg_quantize(types[k], vals, want, 64 * 3));
        ck_assert_mem_eq(t->data, want, t->size);
        kg_dequantize(t->type, t->data, back, 64 * 3);
        for (int e = 0; e < 64 * 3; e++) {
            ck_assert(fabsf(back[e] - vals[e]) <= 0.3f); /* q4_0 step is 2/8 here */
        }
    }
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, "w.q6_k");
    ck_assert(t && t->type == KG_GGML_TYPE_Q6_K && t->n_dims == 3 && t->ne[2] == 2);
    ck_assert_int_eq(t->size, 420);
    t = kg_gguf_find_tensor(g, "w.q4_k");
    ck_assert(t && t->type == KG_GGML_TYPE_Q4_K && t->size == 144);
    t = kg_gguf_find_tensor(g, "w.4d");
    ck_assert(t && t->n_dims == 4 && t->ne[3] == 5 && t->size == 120 * 4);
    ck_assert_mem_eq(t->data, vals, t->size);
    kg_gguf_free(g);

    // the file holds exactly the in-memory serialization, and it is repeatable
    uint8_t *m1, *m2;
    size_t n1, n2, nf;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &m1, &n1), KG_OK);
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &m2, &n2), KG_OK);
    char *file = kg_test_read_file(path, &nf);
    ck_assert_int_eq(n1, nf);
    ck_assert_int_eq(n1 % 32, 0);
    ck_assert_mem_eq(m1, file, n1);
    ck_assert_int_eq(n1, n2);
    ck_assert_mem_eq(m1, m2, n1);
    kg_gguf_writer_t *w2 = make_all_types();
    free(m2);
    ck_assert_int_eq(kg_gguf_writer_to_memory(w2, &m2, &n2), KG_OK);
    ck_assert_int_eq(n1, n2);
    ck_assert_mem_eq(m1, m2, n1);
    free(m1);
    free(m2);
    free(file);
    kg_gguf_writer_free(w);
    kg_gguf_writer_free(w2);
}
END_TEST

START_TEST(writer_copy_kv) {
    // copying every key of a vocabulary file reproduces each value byte for byte
    kg_gguf_t *src =
        kg_gguf_open(kg_test_data("tokenizer-vectors/ggml-vocab-gpt-2.gguf"), err, sizeof(err));
    ck_assert_msg(src != NULL, "%s", err);
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    for (int64_t k = 0; k < kg_gguf_n_kv(src); k++) {
        kg_gguf_writer_copy_kv(w, src, k);
    }
    uint8_t *img;
    size_t n;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &img, &n), KG_OK);
    kg_gguf_t *g = kg_gguf_open_memory(img, n, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    bool src_has_align = false;
    for (int64_t k = 0; k < kg_gguf_n_kv(src); k++) {
        kg_gguf_str_t key = kg_gguf_key(src, k);
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)key.len, key.data);
        src_has_align |= strcmp(name, "general.alignment") == 0;
        int64_t j = kg_gguf_find_key(g, name);
        ck_assert_int_eq(j, k);
        size_t sa, sb;
        const void *a = kg_gguf_kv_raw(src, k, &sa);
        const void *b = kg_gguf_kv_raw(g, j, &sb);
        ck_assert_int_eq(kg_gguf_kv_type(src, k), kg_gguf_kv_type(g, j));
        ck_assert_int_eq(sa, sb);
        ck_assert_mem_eq(a, b, sa);
    }
    ck_assert_int_eq(kg_gguf_n_kv(g), kg_gguf_n_kv(src) + (src_has_align ? 0 : 1));
    kg_gguf_free(g);
    kg_gguf_free(src);
    free(img);
    kg_gguf_writer_free(w);
}
END_TEST

START_TEST(writer_rejects) {
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    float v[64] = {0};
    int64_t ne[2] = {48, 1};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "a", KG_GGML_TYPE_Q8_0, 2, ne, v),
                     KG_ERR_INVALID); /* 48 is not a multiple of 32 */
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "a", KG_GGML_TYPE_F32, 0, ne, v), KG_ERR_INVALID);
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "a", KG_GGML_TYPE_F32, 5, ne, v), KG_ERR_INVALID);
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "a", (kg_ggml_type_t)16, 2, ne, v),
                     KG_ERR_INVALID); /* iq2_xxs: kgen has no quantizer for it */
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "", KG_GGML_TYPE_F32, 2, ne, v), KG_ERR_INVALID);
    char long_name[80];
    memset(long_name, 'x', 64);
    long_name[64] = '\0';
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, long_name, KG_GGML_TYPE_F32, 2, ne, v),
                     KG_ERR_INVALID);
    long_name[63] = '\0';
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, long_name, KG_GGML_TYPE_F32, 2, ne, v), KG_OK);
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, long_name, KG_GGML_TYPE_F32, 2, ne, v),
                     KG_ERR_INVALID); /* duplicate */
    int64_t nk[1] = {256};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "k", KG_GGML_TYPE_Q4_K, 1, ne, v),
                     KG_ERR_INVALID); /* 48 is not a multiple of 256 */
    uint8_t raw[144] = {0};
    ck_assert_int_eq(kg_gguf_writer_add_tensor_raw(w, "k", KG_GGML_TYPE_Q4_K, 1, nk, raw, 143),
                     KG_ERR_INVALID); /* wrong size */
    ck_assert_int_eq(kg_gguf_writer_write(w, "/nonexistent/dir/x.gguf", err, sizeof(err)),
                     KG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err, "cannot create '/nonexistent/dir/x.gguf'"));
    kg_gguf_writer_set_u32(w, "general.alignment", 48);
    const char *path = kg_test_tmp_path("badalign");
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_ERR_INVALID);
    ck_assert(!kg_test_exists(path));
    // a caller-set power of two is used
    kg_gguf_writer_set_u32(w, "general.alignment", 64);
    uint8_t *img;
    size_t n;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &img, &n), KG_OK);
    kg_gguf_t *g = kg_gguf_open_memory(img, n, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_uint_eq(kg_gguf_alignment(g), 64);
    ck_assert_int_eq(kg_gguf_n_kv(g), 1);
    ck_assert_int_eq(n % 64, 0);
    kg_gguf_free(g);
    free(img);
    kg_gguf_writer_free(w);
    kg_gguf_writer_free(NULL);
}
END_TEST

START_TEST(writer_file_truncations) {
    kg_gguf_writer_t *w = make_all_types();
    uint8_t *img;
    size_t n;
    ck_assert_int_eq(kg_gguf_writer_to_memory(w, &img, &n), KG_OK);
    kg_gguf_writer_free(w);
    // the last tensor is a 4-d F32 of 480 bytes padded to 480: any shorter prefix fails
    for (size_t len = 0; len < n; len++) {
        uint8_t *copy;
        kg_gguf_t *g = open_copy(img, len, &copy);
        ck_assert_msg(g == NULL, "accepted a %zu-byte prefix of %zu", len, n);
        ck_assert_msg(err[0] != '\0', "no error for length %zu", len);
        free(copy);
    }
    // random corruption of the whole image: an open or an error, never a crash
    rng_state = 42;
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 4000; it++) {
        uint8_t *copy = malloc(n);
        memcpy(copy, img, n);
        int n_flip = 1 + (int)(rng_next() % 3);
        for (int k = 0; k < n_flip; k++) {
            size_t pos = rng_next() % (n < 1400 ? n : 1400); /* the metadata and infos */
            copy[pos] = (rng_next() & 1) ? (uint8_t)rng_next()
                                         : (uint8_t)(copy[pos] ^ (1u << (rng_next() % 8)));
        }
        kg_gguf_t *g = kg_gguf_open_memory(copy, n, err, sizeof(err));
        if (g) {
            touch_all(g);
            kg_gguf_free(g);
            n_ok++;
        } else {
            ck_assert(err[0] != '\0');
            n_err++;
        }
        free(copy);
    }
    ck_assert_int_gt(n_ok, 100);
    ck_assert_int_gt(n_err, 100);
    free(img);
}
END_TEST

/* Released pages come back from the file: the data reads the same after
 * kg_gguf_release, and releasing a borrowed image leaves it alone. */
START_TEST(release_keeps_the_data) {
    char msg[256];
    kg_gguf_t *g = kg_gguf_open(kg_test_data("models/stories260K.gguf"), msg, sizeof(msg));
    ck_assert_msg(g != NULL, "%s", msg);
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, "token_embd.weight");
    ck_assert_ptr_nonnull(t);
    void *copy = malloc(t->size);
    memcpy(copy, t->data, t->size);
    kg_gguf_release(g, t->data, t->size);
    ck_assert_int_eq(memcmp(copy, t->data, t->size), 0);

    /* a borrowed image: releasing must not zero it */
    size_t len = 0;
    char *bytes = kg_test_read_file(kg_test_data("models/stories260K.gguf"), &len);
    ck_assert_ptr_nonnull(bytes);
    kg_gguf_t *m = kg_gguf_open_memory(bytes, len, msg, sizeof(msg));
    ck_assert_msg(m != NULL, "%s", msg);
    const kg_gguf_tensor_t *mt = kg_gguf_find_tensor(m, "token_embd.weight");
    kg_gguf_release(m, mt->data, mt->size);
    ck_assert_int_eq(memcmp(copy, mt->data, mt->size), 0);
    kg_gguf_free(m);
    free(bytes);
    free(copy);
    kg_gguf_free(g);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("shared_files");
    tcase_add_test(tc, stories260k_keys);
    tcase_add_test(tc, stories260k_tensors);
    tcase_add_test(tc, vocab_files_open);
    tcase_add_test(tc, release_keeps_the_data);
    tcase_add_test(tc, open_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("malformed");
    tcase_add_test(tc, malformed_headers);
    tcase_add_test(tc, malformed_alignment);
    tcase_add_test(tc, malformed_tensors);
    tcase_add_test(tc, nested_arrays);
    suite_add_tcase(s, tc);
    tc = tcase_create("robustness");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stories260k_truncations);
    tcase_add_test(tc, stories260k_byte_flips);
    tcase_add_test(tc, writer_file_truncations);
    suite_add_tcase(s, tc);
    tc = tcase_create("writer");
    tcase_add_test(tc, writer_round_trip);
    tcase_add_test(tc, writer_copy_kv);
    tcase_add_test(tc, writer_rejects);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
