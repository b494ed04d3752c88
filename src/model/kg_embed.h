/* kg_embed: the model side of embedding and rerank jobs: which pooling a
 * model asks for, a reranker's head, and the vector's final form
 * (Matryoshka truncation, L2 normalisation), all as llama.cpp does them. */
#pragma once

#include "kg_model.h"

#include <stdbool.h>
#include <stdint.h>

/* llama.cpp's pooling numbers (<arch>.pooling_type). */
#define KG_EMBED_POOL_NONE 0
#define KG_EMBED_POOL_MEAN 1
#define KG_EMBED_POOL_CLS  2
#define KG_EMBED_POOL_LAST 3
#define KG_EMBED_POOL_RANK 4

/** The pooling a job of `model` gets when it names none: the file's
 * <arch>.pooling_type when it is mean, cls, last or rank; else last, the
 * hidden state of the last token, which is what llama.cpp gives for a
 * decoder without the key (pooling none, its last output row, as
 * node-llama-cpp's embedding context reads it). @thread any */
int32_t kg_embed_model_pooling(const kg_model_t *model);

/** Whether the model can rerank: a qwen3 file with a classification head
 * (cls.output.weight, Qwen3-Reranker's yes/no rows). @thread any */
bool kg_embed_can_rank(const kg_model_t *model);

/** A reranker's score from the pooled hidden state `h` (n_embd floats,
 * the last token's, after the output norm): the head's n_cls_out logits,
 * their softmax, and the first label's probability (Qwen3-Reranker's
 * "yes"), as llama.cpp's LLAMA_POOLING_TYPE_RANK graph for qwen3 computes
 * it. @thread any */
float kg_embed_rank_score(const kg_model_t *model, const float *h);

/** The pooled row `v` (n_embd floats) through the model's Sentence-
 * Transformers dense projections, in place (dense_2 then dense_3, as
 * llama.cpp applies them after pooling and before any normalisation); a
 * model without them leaves v as it is. False when out of memory.
 * @thread any */
bool kg_embed_dense(const kg_model_t *model, float *v);

/** The vector a job gets from a pooled row `v` of n floats: the first
 * `dims` (0 or more than n: all), then divided by its L2 norm when
 * `normalize` (a zero vector stays zero). Returns the length kept. */
int32_t kg_embed_finish(float *v, int32_t n, int32_t dims, bool normalize);
