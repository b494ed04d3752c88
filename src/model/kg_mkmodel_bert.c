/* kg_mkmodel_bert: `kgen mkmodel --arch bert`: a random-weight bert
 * encoder (kg_model_bert.h) with the keys and tensors llama.cpp's
 * converter writes for BertModel (and, with --rerank, a sequence
 * classification head: cls.weight/bias, cls.output.weight/bias with one
 * label, as bge-reranker files have), and a WordPiece vocabulary: the
 * built-in one (specials at bert's ids, printable ASCII as word starts
 * and continuations, made-up words) or one copied with --vocab-from.
 * Weights are uniform with variance 1/fan_in, biases small, LayerNorm
 * weights near 1, from the same seeded streams as every family
 * (kg_mkmodel_random).
 *
 * `--arch nomic-bert` writes what llama.cpp's converter writes for
 * NomicBertModel (nomic-embed-text v1.5): no position embeddings but
 * nomic-bert.rope.freq_base (--rope-base; nomic's own is 1000), a fused
 * attn_qkv and an attention output without biases, ffn_gate/ffn_up/ffn_down
 * without biases (SwiGLU), the same LayerNorms, pooling_type mean unless
 * --pooling says, and the same WordPiece vocabulary. */
#include "kg_gguf_writer.h"
#include "kg_mkmodel.h"
#include "kg_mkmodel_int.h"
#include "kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* bert's special ids (llama.cpp's WPM defaults) */
#define BERT_PAD  0
#define BERT_UNK  100
#define BERT_CLS  101
#define BERT_SEP  102
#define BERT_MASK 103

/* The built-in WordPiece vocabulary: [PAD], [unused1..99], [UNK], [CLS],
 * [SEP], [MASK], then every printable ASCII character as a word start
 * ("▁c") and a continuation ("c"), then n_words made-up words ("▁w0"...).
 * Returns its size, or -1. */
static int64_t add_wordpiece_vocab(kg_gguf_writer_t *w, int32_t n_words, char *err, size_t cap) {
    const int64_t n = 104 + 2 * 95 + (int64_t)n_words;
    kg_gguf_str_t *toks = calloc((size_t)n, sizeof(*toks));
    char *text = malloc((size_t)n * 24);
    int32_t *types = malloc((size_t)n * sizeof(int32_t));
    float *scores = calloc((size_t)n, sizeof(float));
    if (!toks || !text || !types || !scores) {
        free(toks);
        free(text);
        free(types);
        free(scores);
        snprintf(err, cap, "out of memory for the vocabulary");
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        char *t = text + i * 24;
        types[i] = 1; /* normal */
        if (i == BERT_PAD || (i >= BERT_UNK && i <= BERT_MASK)) {
            static const char *const names[] = {"[UNK]", "[CLS]", "[SEP]", "[MASK]"};
            snprintf(t, 24, "%s", i == BERT_PAD ? "[PAD]" : names[i - BERT_UNK]);
            types[i] = i == BERT_UNK ? 2 : 3; /* unknown, control */
        } else if (i < BERT_UNK) {
            snprintf(t, 24, "[unused%d]", (int)i);
            types[i] = 5; /* unused */
        } else if (i < 104 + 95) {
            snprintf(t, 24, "\xe2\x96\x81%c", (char)(' ' + 1 + (i - 104)));
        } else if (i < 104 + 2 * 95) {
            snprintf(t, 24, "%c", (char)(' ' + 1 + (i - 104 - 95)));
        } else {
            snprintf(t, 24, "\xe2\x96\x81w%d", (int)(i - 104 - (int64_t)2 * 95));
        }
        toks[i] = (kg_gguf_str_t){t, strlen(t)};
    }
    /* the code points ' ' + 1 + k run over '!'..'~' and one past it (DEL, a
     * control character the tokenizer drops): harmless, never matched */
    kg_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
    kg_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    kg_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n);
    kg_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", 2);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", BERT_CLS);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", BERT_SEP);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", BERT_UNK);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", BERT_PAD);
    kg_gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", BERT_MASK);
    free(toks);
    free(text);
    free(types);
    free(scores);
    return n;
}

int64_t kg_mkmodel_bert_vocab_size(void) {
    return 104 + 2 * 95;
}

kg_status_t kg_mkmodel_write_bert(const kg_mkmodel_opts_t *o,
                                  int64_t *n_vocab_out,
                                  char *errstr,
                                  size_t errstr_size) {
    const int64_t E = o->n_embd, F = o->n_ff, C = o->ctx;
    const bool nomic = strcmp(o->arch, "nomic-bert") == 0;
    const char *arch = nomic ? "nomic-bert" : "bert";
    if (o->n_head <= 0 || E % o->n_head != 0 || o->n_head_kv != o->n_head ||
        o->head_dim * o->n_head != E) {
        snprintf(errstr, errstr_size,
                 "%s: --n-embd must be --n-head x the head width, with --n-head-kv equal to "
                 "--n-head",
                 arch);
        return KG_ERR_INVALID;
    }
    if (nomic && o->rerank) {
        snprintf(errstr, errstr_size, "nomic-bert has no classification head (--rerank)");
        return KG_ERR_INVALID;
    }
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    if (!w) {
        snprintf(errstr, errstr_size, "out of memory");
        return KG_ERR_NOMEM;
    }
    kg_status_t rc = KG_ERR_IO;
    char err[400] = "";
    char key[96];
#define AKEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
    kg_gguf_writer_set_str(w, "general.architecture", arch);
    kg_gguf_writer_set_str(w, "general.name", o->name);
    kg_gguf_writer_set_u32(w, AKEY("context_length"), (uint32_t)C);
    kg_gguf_writer_set_u32(w, AKEY("embedding_length"), (uint32_t)E);
    kg_gguf_writer_set_u32(w, AKEY("feed_forward_length"), (uint32_t)F);
    kg_gguf_writer_set_u32(w, AKEY("block_count"), (uint32_t)o->n_layer);
    kg_gguf_writer_set_u32(w, AKEY("attention.head_count"), (uint32_t)o->n_head);
    kg_gguf_writer_set_f32(w, AKEY("attention.layer_norm_epsilon"), 1e-12f);
    kg_gguf_writer_set_bool(w, AKEY("attention.causal"), false);
    if (nomic) {
        kg_gguf_writer_set_f32(w, AKEY("rope.freq_base"), o->rope_base);
    }
    if (o->pooling >= 0 || o->rerank || nomic) {
        /* nomic-embed-text's sentence-transformers pooling is mean */
        kg_gguf_writer_set_u32(w, AKEY("pooling_type"),
                               (uint32_t)(o->pooling >= 0 ? o->pooling
                                          : o->rerank     ? 4
                                                          : 1));
    }
#undef AKEY
    /* --type names llama-quantize's file type: kg_mkmodel_random types each
     * tensor by its mix; the base type is what a plain matrix gets */
    const bool mix = o->ftype != KG_FTYPE_ALL_F32;
    const kg_ggml_type_t T = mix ? kg_ftype_base_type(o->ftype) : o->type;
    kg_gguf_writer_set_u32(w, "general.file_type",
                           mix ? (uint32_t)o->ftype : kg_mkmodel_file_type(o->type));
    if (kg_type_is_quantized(T)) {
        kg_gguf_writer_set_u32(w, "general.quantization_version", 2);
    }
    int64_t V = o->vocab_from ? kg_mkmodel_copy_vocab(w, o->vocab_from, err, sizeof(err))
                              : add_wordpiece_vocab(w, o->n_words, err, sizeof(err));
    if (V < 0) {
        goto out;
    }
    if (o->vocab_from) {
        kg_gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", 2);
    }
    const kg_ggml_type_t F32 = KG_GGML_TYPE_F32;
    const float sE = sqrtf(3.0f / (float)E), sF = sqrtf(3.0f / (float)F);
    bool ok =
        kg_mkmodel_random(w, o, "token_embd.weight", T, E, V, 0.0f, 1.0f, err, sizeof(err)) &&
        /* F32 whatever --type says, as the converter and llama-quantize keep
         * them (llama.cpp's graph adds them to F32 rows) */
        kg_mkmodel_random(w, o, "token_types.weight", F32, E, 2, 0.0f, 0.5f, err, sizeof(err)) &&
        (nomic || kg_mkmodel_random(w, o, "position_embd.weight", F32, E, C, 0.0f, 0.5f, err,
                                    sizeof(err))) &&
        kg_mkmodel_random(w, o, "token_embd_norm.weight", F32, E, 1, 1.0f, 0.1f, err,
                          sizeof(err)) &&
        kg_mkmodel_random(w, o, "token_embd_norm.bias", F32, E, 1, 0.0f, 0.05f, err, sizeof(err));
    if (o->rerank) {
        const kg_gguf_str_t label = {"LABEL_0", 7};
        kg_gguf_writer_set_arr_str(w, "bert.classifier.output_labels", &label, 1);
        ok = ok && kg_mkmodel_random(w, o, "cls.weight", T, E, E, 0.0f, sE, err, sizeof(err)) &&
             kg_mkmodel_random(w, o, "cls.bias", F32, E, 1, 0.0f, 0.05f, err, sizeof(err)) &&
             kg_mkmodel_random(w, o, "cls.output.weight", T, E, 1, 0.0f, sE, err, sizeof(err)) &&
             kg_mkmodel_random(w, o, "cls.output.bias", F32, 1, 1, 0.0f, 0.05f, err, sizeof(err));
    }
    char name[96];
#define BW(suffix, type, ne0, ne1, center, scale)                                                  \
    (snprintf(name, sizeof(name), "blk.%d." suffix, (int)il),                                      \
     kg_mkmodel_random(w, o, name, (type), (ne0), (ne1), (center), (scale), err, sizeof(err)))
    for (int64_t il = 0; il < o->n_layer && ok && nomic; il++) {
        ok = BW("attn_qkv.weight", T, E, 3 * E, 0.0f, sE) &&
             BW("attn_output.weight", T, E, E, 0.0f, sE) &&
             BW("attn_output_norm.weight", F32, E, 1, 1.0f, 0.1f) &&
             BW("attn_output_norm.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("ffn_up.weight", T, E, F, 0.0f, sE) && BW("ffn_gate.weight", T, E, F, 0.0f, sE) &&
             BW("ffn_down.weight", T, F, E, 0.0f, sF) &&
             BW("layer_output_norm.weight", F32, E, 1, 1.0f, 0.1f) &&
             BW("layer_output_norm.bias", F32, E, 1, 0.0f, 0.05f);
    }
    for (int64_t il = 0; il < o->n_layer && ok && !nomic; il++) {
        ok = BW("attn_q.weight", T, E, E, 0.0f, sE) && BW("attn_q.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("attn_k.weight", T, E, E, 0.0f, sE) && BW("attn_k.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("attn_v.weight", T, E, E, 0.0f, sE) && BW("attn_v.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("attn_output.weight", T, E, E, 0.0f, sE) &&
             BW("attn_output.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("attn_output_norm.weight", F32, E, 1, 1.0f, 0.1f) &&
             BW("attn_output_norm.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("ffn_up.weight", T, E, F, 0.0f, sE) && BW("ffn_up.bias", F32, F, 1, 0.0f, 0.05f) &&
             BW("ffn_down.weight", T, F, E, 0.0f, sF) &&
             BW("ffn_down.bias", F32, E, 1, 0.0f, 0.05f) &&
             BW("layer_output_norm.weight", F32, E, 1, 1.0f, 0.1f) &&
             BW("layer_output_norm.bias", F32, E, 1, 0.0f, 0.05f);
    }
#undef BW
    if (!ok || kg_gguf_writer_write(w, o->out, err, sizeof(err)) != KG_OK) {
        goto out;
    }
    if (n_vocab_out) {
        *n_vocab_out = V;
    }
    rc = KG_OK;
out:
    if (rc != KG_OK) {
        snprintf(errstr, errstr_size, "%s", err[0] ? err : "cannot write the model");
    }
    kg_gguf_writer_free(w);
    return rc;
}
