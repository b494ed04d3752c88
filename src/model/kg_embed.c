/* kg_embed: pooling defaults, a reranker's head and the final vector. */
#include "kg_embed.h"

#include "kg_model_bert.h"
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
    return model->cls_out != NULL && model->n_cls_out >= 1 &&
           (model->hp.arch == KG_ARCH_QWEN3 || model->hp.arch == KG_ARCH_BERT);
}

/* out[i] = W[i] · x for the n_out rows of W (n_in wide), x rounded first as
 * ggml's matmul rounds the activation: to the weight's float type, or to
 * Q8_0 blocks for the 32-blocks quants, whose dot products take them.
 * False when out of memory. */
static bool
head_matmul(const kg_gguf_tensor_t *w, const float *h, int32_t n_in, int32_t n_out, float *out) {
    const size_t row_size = kg_type_row_size(w->type, n_in);
    float *row = malloc((size_t)n_in * sizeof(float) * 2);
    void *q = malloc(kg_type_row_size(KG_GGML_TYPE_Q8_0, n_in) + kg_type_row_size(w->type, n_in));
    if (!row || !q) {
        free(row);
        free(q);
        return false;
    }
    float *x = row + n_in;
    const kg_ggml_type_t act =
        w->type == KG_GGML_TYPE_F16 || w->type == KG_GGML_TYPE_BF16 ? w->type : KG_GGML_TYPE_Q8_0;
    if (w->type != KG_GGML_TYPE_F32 && kg_quantize(act, h, q, n_in)) {
        kg_dequantize(act, q, x, n_in);
    } else {
        memcpy(x, h, (size_t)n_in * sizeof(float));
    }
    for (int32_t i = 0; i < n_out; i++) {
        kg_dequantize(w->type, (const char *)w->data + (size_t)i * row_size, row, n_in);
        double dot = 0.0;
        for (int32_t k = 0; k < n_in; k++) {
            dot += (double)row[k] * (double)x[k];
        }
        out[i] = (float)dot;
    }
    free(row);
    free(q);
    return true;
}

/* bert's head (llama.cpp's build_pooling, RANK, on the CLS row):
 * tanh(cls · h + cls_b), then cls.output · that + its bias; the score is
 * the first label's logit (llama.cpp applies no softmax there). */
static float bert_rank_score(const kg_model_t *model, const float *h) {
    const struct kg_bert_weights *b = model->bert;
    const int32_t E = model->hp.n_embd;
    float *y = malloc((size_t)E * sizeof(float));
    float logits[64] = {0};
    if (!y) {
        return NAN;
    }
    memcpy(y, h, (size_t)E * sizeof(float));
    bool ok = true;
    if (b->cls) {
        float *t = malloc((size_t)E * sizeof(float));
        ok = t && head_matmul(b->cls, y, E, E, t);
        if (ok) {
            float bias[1];
            for (int32_t i = 0; i < E; i++) {
                if (b->cls_b) {
                    kg_dequantize(b->cls_b->type,
                                  (const char *)b->cls_b->data +
                                      (size_t)i * kg_type_row_size(b->cls_b->type, 1),
                                  bias, 1);
                    t[i] = t[i] + bias[0];
                }
                y[i] = tanhf(t[i]);
            }
        }
        free(t);
    }
    ok = ok && head_matmul(model->cls_out, y, E, model->n_cls_out, logits);
    free(y);
    if (!ok) {
        return NAN;
    }
    if (b->cls_out_b) {
        float bias[1];
        kg_dequantize(b->cls_out_b->type, b->cls_out_b->data, bias, 1);
        logits[0] = logits[0] + bias[0];
    }
    /* a probability, as for qwen3 (and as node-llama-cpp and vLLM give
     * bert rerankers' scores): the sigmoid of the first label's logit */
    return (float)(1.0 / (1.0 + exp(-(double)logits[0])));
}

float kg_embed_rank_score(const kg_model_t *model, const float *h) {
    if (model->bert) {
        return bert_rank_score(model, h);
    }
    const int32_t E = model->hp.n_embd, n = model->n_cls_out;
    float logits[64] = {0}; /* kg_model takes at most 64 labels */
    if (!head_matmul(model->cls_out, h, E, n, logits)) {
        return NAN;
    }
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

bool kg_embed_dense(const kg_model_t *model, float *v) {
    if (!model->dense_2) {
        return true;
    }
    const int32_t E = model->hp.n_embd, N = model->n_dense;
    float *mid = malloc((size_t)N * sizeof(float));
    /* llama.cpp's build_dense_out: two ggml_mul_mat after pooling, no bias
     * and no activation between them */
    const bool ok = mid && head_matmul(model->dense_2, v, E, N, mid) &&
                    head_matmul(model->dense_3, mid, N, E, v);
    free(mid);
    return ok;
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
