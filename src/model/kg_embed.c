/* kg_embed: pooling defaults, a reranker's head and the final vector. */
#include "kg_embed.h"

#include "kg_quant.h"
#include "kg_quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int32_t kg_embed_model_pooling(const kg_model_t *model) {
    const int32_t p = model->hp.pooling_type;
    return p >= KG_EMBED_POOL_MEAN && p <= KG_EMBED_POOL_RANK ? p : KG_EMBED_POOL_LAST;
}

bool kg_embed_can_rank(const kg_model_t *model) {
    return model->cls_out != NULL && model->n_cls_out >= 1 && model->hp.arch == KG_ARCH_QWEN3;
}

float kg_embed_rank_score(const kg_model_t *model, const float *h) {
    const int32_t E = model->hp.n_embd, n = model->n_cls_out;
    const kg_gguf_tensor_t *w = model->cls_out;
    const size_t row_size = kg_type_row_size(w->type, E);
    float logits[64] = {0}; /* kg_model takes at most 64 labels */
    float *row = malloc((size_t)E * sizeof(float) * 2);
    void *q = malloc(kg_type_row_size(KG_GGML_TYPE_Q8_0, E) + kg_type_row_size(w->type, E));
    if (!row || !q) {
        free(row);
        free(q);
        return NAN;
    }
    /* ggml's matmul rounds the activation first: to the weight's float type,
     * or to Q8_0 blocks for the 32-blocks quants, whose dot products take them */
    float *x = row + E;
    const kg_ggml_type_t act =
        w->type == KG_GGML_TYPE_F16 || w->type == KG_GGML_TYPE_BF16 ? w->type : KG_GGML_TYPE_Q8_0;
    if (w->type != KG_GGML_TYPE_F32 && kg_quantize(act, h, q, E)) {
        kg_dequantize(act, q, x, E);
    } else {
        memcpy(x, h, (size_t)E * sizeof(float));
    }
    for (int32_t i = 0; i < n; i++) {
        kg_dequantize(w->type, (const char *)w->data + (size_t)i * row_size, row, E);
        double dot = 0.0;
        for (int32_t k = 0; k < E; k++) {
            dot += (double)row[k] * (double)x[k];
        }
        logits[i] = (float)dot;
    }
    free(row);
    free(q);
    /* llama.cpp applies ggml_soft_max over the labels for qwen3 and reads
     * the first: p("yes") */
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        sum += exp((double)(logits[i] - mx));
    }
    return (float)(exp((double)(logits[0] - mx)) / sum);
}

int32_t kg_embed_finish(float *v, int32_t n, int32_t dims, bool normalize) {
    if (dims > 0 && dims < n) {
        n = dims;
    }
    if (normalize) {
        /* common_embd_normalize's euclidean norm: the sum in double */
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            sum += (double)v[i] * (double)v[i];
        }
        const double norm = sqrt(sum);
        const float inv = norm > 0.0 ? (float)(1.0 / norm) : 0.0f;
        for (int32_t i = 0; i < n; i++) {
            v[i] *= inv;
        }
    }
    return n;
}
