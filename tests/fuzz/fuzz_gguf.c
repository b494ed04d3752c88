/* fuzz_gguf: libFuzzer target for the GGUF reader.
 *
 * Any input must give either a valid file or one error line, never a crash,
 * leak or out-of-bounds read. On success every accessor is exercised the way
 * the model loader and tokenizer use them: every key through find_key and
 * the typed getters, every string array element, numeric arrays converted,
 * and the first rows of every tensor dequantized. The input is copied into
 * an exact-size heap buffer so the sanitizer sees a read one byte past it. */
#include "model/kg_gguf.h"
#include "model/kg_quant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink; /* keeps the reads from being optimized away */

static void touch_str(kg_gguf_str_t s) {
    for (uint64_t i = 0; i < s.len; i++) {
        sink += (unsigned char)s.data[i];
    }
}

static void touch_key(const kg_gguf_t *g, int64_t idx) {
    kg_gguf_str_t k = kg_gguf_key(g, idx);
    touch_str(k);
    size_t raw_size;
    const uint8_t *raw = kg_gguf_kv_raw(g, idx, &raw_size);
    for (size_t i = 0; i < raw_size; i++) {
        sink += raw[i];
    }
    sink += (uint64_t)kg_gguf_kv_type(g, idx);
    char key[128];
    if (k.len >= sizeof(key) || memchr(k.data, '\0', (size_t)k.len)) {
        return; // not reachable by a C-string lookup
    }
    memcpy(key, k.data, (size_t)k.len);
    key[k.len] = '\0';
    if (kg_gguf_find_key(g, key) != idx) {
        abort(); // keys are unique, so the lookup must find this entry
    }
    uint32_t u;
    int64_t i64;
    float f;
    bool b;
    kg_gguf_str_t s;
    sink += kg_gguf_get_u32(g, key, &u) ? u : 0;
    sink += kg_gguf_get_i64(g, key, &i64) ? (uint64_t)i64 : 0;
    sink += kg_gguf_get_f32(g, key, &f) ? (uint64_t)(f == f) : 0;
    sink += kg_gguf_get_bool(g, key, &b) ? b : 0;
    if (kg_gguf_get_str(g, key, &s)) {
        touch_str(s);
    }
    kg_gguf_type_t et;
    uint64_t n;
    if (!kg_gguf_get_arr(g, key, &et, &n)) {
        return;
    }
    if (et == KG_GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < n; j++) {
            touch_str(kg_gguf_arr_str(g, key, j));
        }
        return;
    }
    if (n == 0 || n > (1u << 20)) {
        return;
    }
    float *fv = malloc((size_t)n * sizeof(float));
    int32_t *iv = malloc((size_t)n * sizeof(int32_t));
    if (fv && kg_gguf_arr_f32(g, key, fv, n)) {
        sink += (uint64_t)(fv[n - 1] == fv[n - 1]);
    }
    if (iv && kg_gguf_arr_i32(g, key, iv, n)) {
        sink += (uint64_t)iv[n - 1];
    }
    free(fv);
    free(iv);
}

static void touch_tensor(const kg_gguf_t *g, int64_t idx) {
    enum { MAX_ELEMS = 4096 };
    static float row[MAX_ELEMS];
    const kg_gguf_tensor_t *t = kg_gguf_tensor(g, idx);
    char name[128];
    if (t->name.len < sizeof(name) && !memchr(t->name.data, '\0', (size_t)t->name.len)) {
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = '\0';
        if (kg_gguf_find_tensor(g, name) != t) {
            abort(); // names are unique
        }
    }
    int64_t blck = kg_type_block_elems(t->type);
    int64_t nel = 1;
    for (int d = 0; d < KG_GGUF_MAX_DIMS; d++) {
        nel = t->ne[d] == 0 ? 0 : (nel > INT64_MAX / t->ne[d] ? INT64_MAX : nel * t->ne[d]);
    }
    // the first rows, up to a bounded count of whole blocks; their bytes are in the tensor
    int64_t n = nel < MAX_ELEMS ? nel : MAX_ELEMS;
    n -= n % blck;
    if (n <= 0) {
        return;
    }
    if (kg_type_row_size(t->type, n) > t->size) {
        abort(); // the reader promised `size` bytes for all `nel` elements
    }
    kg_dequantize(t->type, t->data, row, n);
    sink += (uint64_t)(row[n - 1] == row[n - 1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        return 0;
    }
    memcpy(copy, data, size);
    char err[256];
    kg_gguf_t *g = kg_gguf_open_memory(copy, size, err, sizeof(err));
    if (!g) {
        if (err[0] == '\0' || memchr(err, '\n', strlen(err))) {
            abort(); // a failure always says why, in one line
        }
        free(copy);
        return 0;
    }
    sink += kg_gguf_version(g) + kg_gguf_alignment(g);
    for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) {
        touch_key(g, i);
    }
    for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++) {
        touch_tensor(g, i);
    }
    kg_gguf_free(g);
    free(copy);
    return 0;
}
