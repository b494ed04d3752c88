/* kg_backend_cpu_weight: one GGUF tensor made into a cpu_weight_t, for the
 * backend's decoder (kg_backend_cpu.c) and its bert encoder (cpu_bert.c)
 * alike. A file of its own so that cpu_bert.c, which kg_backend_cpu.c
 * calls, reaches it without calling back into kg_backend_cpu.c (the house
 * rule against loops between modules, tests/integration/test_layers.sh). */
#include "../../model/kg_quant.h"
#include "cpu_gemm.h"
#include "cpu_quant.h"
#include "kg_backend_cpu_int.h"

#include <stdio.h>
#include <stdlib.h>

bool cpu_weight_init(
    cpu_weight_t *w, const kg_gguf_tensor_t *t, cpu_ctx_t *ctx, char *errstr, size_t errstr_size) {
    w->n_in = t->ne[0];
    w->n_out = t->n_dims > 1 ? t->ne[1] : 1;
    w->type = t->type;
    if (t->n_dims > 1 && cpu_qtraits(t->type)) {
        /* used in place: the mapped blocks are what cpu_vecdot reads */
        if (!cpu_qmat_init(&w->q, t->type, t->data, w->n_out, w->n_in)) {
            snprintf(errstr, errstr_size, "cpu backend: tensor '%.*s' of type %s has rows of %lld",
                     (int)t->name.len, t->name.data, kg_type_name(t->type), (long long)w->n_in);
            return false;
        }
        ctx->weights_size += t->size;
        return true;
    }
    if (t->n_dims > 1) {
        if (!cpu_gemm_pack_on(ctx->pool, &w->packed, t->type, t->data, w->n_out, w->n_in)) {
            snprintf(errstr, errstr_size, "cpu backend: out of memory packing '%.*s'",
                     (int)t->name.len, t->name.data);
            return false;
        }
        ctx->weights_size += w->packed.size;
        /* the panels are the copy we use: let the file's pages go */
        kg_gguf_release(ctx->model->gguf, t->data, t->size);
        return true;
    }
    if (t->type == KG_GGML_TYPE_F32) {
        w->data = t->data; /* in place from the mapping */
        ctx->weights_size += t->size;
        return true;
    }
    size_t n = (size_t)(w->n_in * w->n_out);
    w->owned = malloc(n * sizeof(float));
    if (!w->owned) {
        snprintf(errstr, errstr_size, "cpu backend: out of memory dequantizing '%.*s' (%zu MiB)",
                 (int)t->name.len, t->name.data, n * sizeof(float) >> 20);
        return false;
    }
    kg_dequantize(t->type, t->data, w->owned, (int64_t)n);
    w->data = w->owned;
    ctx->weights_size += n * sizeof(float);
    return true;
}
