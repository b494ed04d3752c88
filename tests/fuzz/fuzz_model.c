/* fuzz_model: libFuzzer target for the model loader (kg_model_load_gguf):
 * the hyperparameter keys of every family, the sliding-window pattern
 * (integer, integer array or raw bool array), RoPE scaling, tensor shapes,
 * fused-tensor views, and the experts (counts, 3-D tensors cut into
 * per-expert views, gpt-oss's biases and sinks), deepseek2's latent
 * attention (its ranks and head sizes, the 3-D k_b / v_b cut into per-head
 * views), and bert's and nomic-bert's encoder tensors (a fused attn_qkv
 * cut into views). Any input must load or give one error line, never a
 * crash or an out-of-bounds read. On success the queries backends use are
 * run and every view's bytes are read. */
#include "model/kg_gguf.h"
#include "model/kg_model.h"
#include "model/kg_model_bert.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink; /* keeps the reads from being optimized away */

static void touch(const kg_gguf_tensor_t *t) {
    if (!t) {
        return;
    }
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->size; i += 61) {
        sink += p[i];
    }
    if (t->size > 0) {
        sink += p[t->size - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        return 0;
    }
    memcpy(copy, data, size);
    char err[512];
    kg_gguf_t *g = kg_gguf_open_memory(copy, size, err, sizeof(err));
    kg_model_t *m = g ? kg_model_load_gguf(g, "fuzz", err, sizeof(err)) : NULL;
    if (m) {
        char names[256];
        sink += kg_model_features(m);
        sink += (uint64_t)kg_model_kv_window(m);
        sink += strlen(kg_model_feature_names(kg_model_features(m), names, sizeof(names)));
        touch(kg_model_rope_factors(m, 1 << 20));
        touch(kg_model_rope_factors(m, 1));
        touch(m->tok_embd);
        touch(m->output);
        touch(m->output_b);
        for (int32_t il = 0; il < m->hp.n_layer; il++) {
            const kg_layer_weights_t *L = &m->layers[il];
            const kg_gguf_tensor_t *ts[] = {L->attn_norm,
                                            L->wq,
                                            L->wk,
                                            L->wv,
                                            L->wo,
                                            L->ffn_norm,
                                            L->w_gate,
                                            L->w_up,
                                            L->w_down,
                                            L->bq,
                                            L->bk,
                                            L->bv,
                                            L->bo,
                                            L->q_norm,
                                            L->k_norm,
                                            L->attn_post_norm,
                                            L->ffn_post_norm,
                                            L->ffn_gate_inp,
                                            L->ffn_gate_inp_b,
                                            L->gate_exps_b,
                                            L->up_exps_b,
                                            L->down_exps_b,
                                            L->attn_sinks};
            for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
                touch(ts[i]);
            }
            /* deepseek2's latent attention and its MoE's extras */
            const kg_gguf_tensor_t *mla[] = {L->wq_a,       L->q_a_norm,  L->wq_b,
                                             L->wkv_a_mqa,  L->kv_a_norm, L->exp_probs_b,
                                             L->gate_shexp, L->up_shexp,  L->down_shexp};
            for (size_t i = 0; i < sizeof(mla) / sizeof(mla[0]); i++) {
                touch(mla[i]);
            }
            for (int32_t h = 0; L->k_b && h < m->hp.n_head; h++) {
                touch(&L->k_b[h]);
                touch(&L->v_b[h]);
            }
            for (int32_t e = 0; L->ffn_gate_inp && e < m->hp.n_expert; e++) {
                touch(&L->exp_gate[e]);
                touch(&L->exp_up[e]);
                touch(&L->exp_down[e]);
            }
            sink += (uint64_t)L->n_swa;
        }
        if (m->bert) { /* bert's own tensors */
            const struct kg_bert_weights *b = m->bert;
            const kg_gguf_tensor_t *bs[] = {b->type_embd, b->pos_embd, b->tok_norm,  b->tok_norm_b,
                                            b->cls,       b->cls_b,    b->cls_out_b, m->cls_out};
            for (size_t i = 0; i < sizeof(bs) / sizeof(bs[0]); i++) {
                touch(bs[i]);
            }
            for (int32_t il = 0; il < m->hp.n_layer; il++) {
                const kg_bert_layer_t *BL = &b->layers[il];
                const kg_gguf_tensor_t *ls[] = {BL->attn_out_norm,  BL->attn_out_norm_b,
                                                BL->ffn_up_b,       BL->ffn_down_b,
                                                BL->layer_out_norm, BL->layer_out_norm_b};
                for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) {
                    touch(ls[i]);
                }
            }
        }
    }
    kg_model_free(m);
    free(copy);
    return 0;
}
