/* fuzz_lora: libFuzzer target for the LoRA adapter loader
 * (kg_lora_load_gguf) against a fixed small llama base (kgen mkmodel
 * --n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 64 --seed 1):
 * the header keys, tensor names, pairs, types and shapes. Any input must
 * load or give one error line, never a crash or an out-of-bounds read. On
 * success every pair's bytes are read. */
#include "model/kg_gguf.h"
#include "model/kg_lora.h"
#include "model/kg_mkmodel.h"
#include "model/kg_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;
static kg_model_t *g_base;

static void touch(const kg_gguf_tensor_t *t) {
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->size; i += 61) {
        sink += p[i];
    }
    if (t->size > 0) {
        sink += p[t->size - 1];
    }
}

static kg_model_t *base(void) {
    if (g_base) {
        return g_base;
    }
    char path[] = "/tmp/kgen-fuzz-lora-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        abort();
    }
    close(fd);
    kg_mkmodel_opts_t o = kg_mkmodel_opts_default();
    o.out = path;
    o.n_embd = 32;
    o.n_layer = 2;
    o.n_head = 2;
    o.n_head_kv = 1;
    o.n_ff = 64;
    o.head_dim = 16;
    o.have_seed = true;
    o.seed = 1;
    char err[512];
    if (kg_mkmodel_write(&o, NULL, err, sizeof(err)) != KG_OK ||
        !(g_base = kg_model_load(path, err, sizeof(err)))) {
        fprintf(stderr, "fuzz_lora: base: %s\n", err);
        abort();
    }
    unlink(path);
    return g_base;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const kg_model_t *m = base();
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        return 0;
    }
    memcpy(copy, data, size);
    char err[512];
    kg_gguf_t *g = kg_gguf_open_memory(copy, size, err, sizeof(err));
    kg_lora_t *lora = g ? kg_lora_load_gguf(g, "fuzz", m, err, sizeof(err)) : NULL;
    if (getenv("KG_FUZZ_VERBOSE")) {
        fprintf(stderr, "fuzz_lora: %s\n", lora ? "loaded" : err);
    }
    if (lora) {
        for (int32_t il = 0; il < lora->n_layer; il++) {
            for (int p = 0; p < KG_LORA_N_PROJ; p++) {
                const kg_lora_pair_t *pair = &lora->pairs[il][p];
                if (pair->a) {
                    touch(pair->a);
                    touch(pair->b);
                    /* the scale's bits: any float (a negative alpha is a valid file) */
                    float scale = kg_lora_pair_scale(lora, pair, 1.0f);
                    uint32_t bits;
                    memcpy(&bits, &scale, sizeof(bits));
                    sink += bits;
                }
            }
        }
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    kg_lora_free(lora);
    free(copy);
    return 0;
}
