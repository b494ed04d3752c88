/* kg_backend: thin dispatch through the vtable, and the checks every
 * backend shares (weight types, KV bytes per token). Choosing a backend is
 * the registry's (src/engine/kg_backend_registry.c): it needs gpu/, and
 * gpu/ stands on this layer. */
#include "kg_backend.h"

#include "../core/kg_log.h"
#include "../model/kg_quant.h"
#include "kg_backend_impl.h"

#include <stdio.h>
#include <string.h>

kg_status_t kg_backend_check_types(const char *backend,
                                   const kg_model_t *model,
                                   const kg_ggml_type_t *types,
                                   int n_types,
                                   char *errstr,
                                   size_t errstr_size) {
    for (int64_t i = 0; i < kg_gguf_n_tensors(model->gguf); i++) {
        const kg_gguf_tensor_t *t = kg_gguf_tensor(model->gguf, i);
        bool ok = false;
        for (int j = 0; j < n_types && !ok; j++) {
            ok = t->type == types[j];
        }
        if (ok) {
            continue;
        }
        char list[256];
        size_t len = 0;
        list[0] = '\0';
        for (int j = 0; j < n_types && len < sizeof(list); j++) {
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", j ? ", " : "",
                                    kg_type_name((uint32_t)types[j]));
        }
        const char *tn = kg_type_name((uint32_t)t->type);
        snprintf(errstr, errstr_size,
                 "backend %s: tensor '%.*s' has type %s, which this backend cannot run (it runs: "
                 "%s)",
                 backend, (int)t->name.len, t->name.data, tn ? tn : "unknown", list);
        return KG_ERR_UNSUPPORTED;
    }
    return KG_OK;
}

void kg_backend_free(kg_backend_t *be) {
    if (be) {
        be->iface.free(be);
    }
}

const char *kg_backend_name(const kg_backend_t *be) {
    return be->iface.name;
}

kg_status_t kg_backend_forward(kg_backend_t *be, const kg_step_batch_t *batch, float *logits) {
    if (batch->n_hidden > 0 && !be->hidden) {
        /* hidden states are written by the backend's forward alone: one that
         * does not know the fields would leave them unset, never fail */
        KG_LOG_ERROR("backend", "backend %s does not return hidden states (embedding jobs)",
                     be->iface.name);
        return KG_ERR_UNSUPPORTED;
    }
    return be->iface.forward(be, batch, logits);
}

bool kg_backend_has_sample(const kg_backend_t *be) {
    return be->sample != NULL;
}

kg_status_t kg_backend_sample(kg_backend_t *be,
                              const kg_sample_request_t *reqs,
                              int32_t n,
                              kg_sample_result_t *out) {
    if (!be->sample) {
        KG_LOG_ERROR("backend", "backend %s has no device sampler", be->iface.name);
        return KG_ERR_UNSUPPORTED;
    }
    return be->sample(be, reqs, n, out);
}

bool kg_backend_has_hidden(const kg_backend_t *be) {
    return be->hidden;
}

bool kg_backend_has_kv_copy(const kg_backend_t *be) {
    return be->kv_copy != NULL;
}

kg_status_t
kg_backend_kv_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    if (!be->kv_copy) {
        return KG_ERR_UNSUPPORTED;
    }
    return n > 0 ? be->kv_copy(be, src, dst, n) : KG_OK;
}

bool kg_backend_has_state(const kg_backend_t *be) {
    return be->state_copy != NULL;
}

kg_status_t
kg_backend_state_copy(kg_backend_t *be, const int32_t *src, const int32_t *dst, int32_t n) {
    if (!be->state_copy) {
        return KG_ERR_UNSUPPORTED;
    }
    return n > 0 ? be->state_copy(be, src, dst, n) : KG_OK;
}

int32_t kg_backend_state_snapshots(const kg_backend_t *be) {
    return be->state_save ? be->n_snapshots : 0;
}

kg_status_t kg_backend_state_save(kg_backend_t *be, int32_t slot, int32_t snap) {
    if (!be->state_save || be->n_snapshots <= 0) {
        return KG_ERR_UNSUPPORTED;
    }
    return be->state_save(be, slot, snap, false);
}

kg_status_t kg_backend_state_restore(kg_backend_t *be, int32_t snap, int32_t slot) {
    if (!be->state_save || be->n_snapshots <= 0) {
        return KG_ERR_UNSUPPORTED;
    }
    return be->state_save(be, slot, snap, true);
}

size_t kg_backend_state_bytes_per_seq(const kg_model_t *model) {
    /* F32, each recurrent layer's own (kg_model_state_floats) */
    size_t n = 0;
    for (int32_t il = 0; il < model->hp.n_layer; il++) {
        n += (size_t)kg_model_state_floats(model, il) * sizeof(float);
    }
    return n;
}

void kg_backend_memory(const kg_backend_t *be, kg_backend_memory_t *out) {
    memset(out, 0, sizeof(*out));
    if (be->iface.memory) {
        be->iface.memory(be, out);
    }
}

void kg_backend_last_fault(const kg_backend_t *be, kg_status_t st, kg_backend_fault_t *out) {
    memset(out, 0, sizeof(*out));
    out->seq = -1;
    out->row = -1;
    if (be->last_fault) {
        be->last_fault(be, out);
        if (out->scope != KG_FAULT_NONE) {
            return;
        }
    }
    out->scope = st == KG_ERR_INVALID ? KG_FAULT_STEP : KG_FAULT_DEVICE;
    snprintf(out->message, sizeof(out->message), "backend %s: %s", be->iface.name,
             kg_status_str(st));
}

void kg_backend_counters(const kg_backend_t *be, kg_backend_counters_t *out) {
    memset(out, 0, sizeof(*out));
    if (be->counters) {
        be->counters(be, out);
    }
}

void kg_backend_moe_stats(const kg_backend_t *be, kg_moe_stats_t *out) {
    memset(out, 0, sizeof(*out));
    if (be->moe_stats) {
        be->moe_stats(be, out);
    }
}

kg_status_t kg_backend_lora_add(
    kg_backend_t *be, const kg_lora_t *lora, int32_t *id, char *errstr, size_t errstr_size) {
    if (!be->lora_add) {
        kg_backend_no_lora_why(be, errstr, errstr_size);
        return KG_ERR_UNSUPPORTED;
    }
    return be->lora_add(be, lora, id, errstr, errstr_size);
}

void kg_backend_no_lora_why(const kg_backend_t *be, char *errstr, size_t errstr_size) {
    if (be->no_lora_why) {
        snprintf(errstr, errstr_size, "the %s backend runs no LoRA adapters on this model (%s)",
                 be->iface.name, be->no_lora_why);
    } else {
        snprintf(errstr, errstr_size,
                 "the %s backend does not run LoRA adapters (the cpu and cuda ones do)",
                 be->iface.name);
    }
}

bool kg_backend_has_lora(const kg_backend_t *be) {
    return be->lora_add != NULL;
}

void kg_backend_lora_remove(kg_backend_t *be, int32_t id) {
    if (be->lora_remove) {
        be->lora_remove(be, id);
    }
}

const char *kg_kv_type_name(kg_kv_type_t t) {
    return t == KG_KV_Q8_0 ? "q8_0" : "f16";
}

kg_status_t kg_kv_type_parse(const char *s, kg_kv_type_t *t) {
    if (s && strcmp(s, "f16") == 0) {
        *t = KG_KV_F16;
    } else if (s && strcmp(s, "q8_0") == 0) {
        *t = KG_KV_Q8_0;
    } else {
        return KG_ERR_INVALID;
    }
    return KG_OK;
}

size_t kg_backend_kv_bytes_per_token(const kg_model_t *model, kg_kv_type_t type) {
    const kg_hparams_t *hp = &model->hp;
    /* K and V per layer, each layer's own shape (fp16: the CPU backend's
     * layout, CUDA's the same size; Q8_0: 34 bytes per 32 values, the CUDA
     * backend's blocks); a layer reading another's K/V (Gemma 4's shared
     * layers) has none; multi-head latent attention caches one latent row
     * (head_dim = kv_lora_rank + rope dims, n_head_kv 1) whose first dims are
     * the values: K only */
    const size_t n_caches = hp->n_lora_kv > 0 ? 1 : 2;
    size_t n = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *L = &model->layers[il];
        /* a recurrent layer keeps a state per sequence instead
         * (kg_backend_state_bytes_per_seq) */
        if (L->kv_layer == il && L->kind == KG_LAYER_ATTN) {
            const size_t row = (size_t)L->n_head_kv * (size_t)L->head_dim;
            /* (rows of a multiple of 32 values, as the backend requires;
             * rounded up so no shape sizes to 0) */
            n += n_caches * (type == KG_KV_Q8_0 ? (row + 31) / 32 * 34 : row * sizeof(uint16_t));
        }
    }
    return n;
}

size_t
kg_backend_kv_bytes_per_block(const kg_model_t *model, kg_kv_type_t type, int32_t block_size) {
    if (type != KG_KV_Q8_0) {
        return kg_backend_kv_bytes_per_token(model, type) * (size_t)block_size;
    }
    const kg_hparams_t *hp = &model->hp;
    const size_t n_caches = hp->n_lora_kv > 0 ? 1 : 2, bs = (size_t)block_size;
    size_t n = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kg_layer_weights_t *L = &model->layers[il];
        if (L->kv_layer == il && L->kind == KG_LAYER_ATTN) {
            const size_t row = (size_t)L->n_head_kv * (size_t)L->head_dim;
            n += n_caches * ((bs * ((row + 31) / 32) * 34 + 15) / 16 * 16); /* kg_kv_block_bytes */
        }
    }
    return n;
}
