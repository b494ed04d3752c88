/* kg_mkmodel_int: what kg_mkmodel.c shares with the families written in
 * files of their own (kg_mkmodel_bert.c, kg_mkmodel_gemma4.c): its seeded
 * random tensors, the vocabulary copy and the file-type key. */
#pragma once

#include "kg_gguf_writer.h"
#include "kg_mkmodel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Add tensor `name` (ne0, ne1; ne1 1 for a vector) of `type`, uniform in
 * [center - scale, center + scale] from the stream of (o->seed, name), as
 * every family's tensors are drawn. False with err set. */
bool kg_mkmodel_random(kg_gguf_writer_t *w,
                       const kg_mkmodel_opts_t *o,
                       const char *name,
                       kg_ggml_type_t type,
                       int64_t ne0,
                       int64_t ne1,
                       float center,
                       float scale,
                       char *err,
                       size_t cap);

/** Copy every tokenizer.* key of the GGUF at `path`; the vocabulary size,
 * or -1 with err set. */
int64_t kg_mkmodel_copy_vocab(kg_gguf_writer_t *w, const char *path, char *err, size_t cap);

/** llama.cpp's general.file_type for weights of type t. */
uint32_t kg_mkmodel_file_type(kg_ggml_type_t t);

/** kg_mkmodel_write for --arch bert (kg_mkmodel_bert.c). */
kg_status_t kg_mkmodel_write_bert(const kg_mkmodel_opts_t *o,
                                  int64_t *n_vocab_out,
                                  char *errstr,
                                  size_t errstr_size);

/** The size of bert's built-in WordPiece vocabulary without made-up words. */
int64_t kg_mkmodel_bert_vocab_size(void);

/** Add one (ne0, ne1) tensor (ne1 1: a vector) uniform in [center - scale,
 * center + scale], drawn from its own stream of (seed, name) and typed by
 * the current write's quantization mix; false with the write's error set. */
bool kg_mkmodel_add_random(kg_gguf_writer_t *w,
                           const kg_mkmodel_opts_t *o,
                           const char *name,
                           kg_ggml_type_t type,
                           int64_t ne0,
                           int64_t ne1,
                           float center,
                           float scale);

/** Gemma 4's keys beyond the generic ones write_hparams has written (it
 * overwrites head_count_kv, feed_forward_length and the head sizes). */
void kg_mkmodel_gemma4_hparams(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o);

/** Gemma 4's layers, its global layers' RoPE divisors and the per-layer
 * input tensors (token_embd, output_norm and output are written already). */
bool kg_mkmodel_gemma4_weights(kg_gguf_writer_t *w, const kg_mkmodel_opts_t *o, int64_t n_vocab);

/** Why the options cannot make a Gemma 4 file (the shared K/V layers must
 * find a windowed and a global layer just before them), or NULL. */
const char *kg_mkmodel_gemma4_check(const kg_mkmodel_opts_t *o);
