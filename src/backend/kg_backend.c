/* kg_backend: backend selection and thin dispatch through the vtable. */
#include "kg_backend.h"

#include "../core/kg_log.h"
#include "../model/kg_quant.h"
#include "kg_backend_impl.h"

#include <stdio.h>
#include <string.h>

#ifdef KG_USE_CUDA
#include "../../gpu/kg_backend_cuda.h"
#endif

#ifdef KG_USE_CUDA
/* The KG_MODEL_FEAT_* bits the CUDA backend implements, each checked
 * against the CPU backend on the emulator (tests/unit/check_cuda.c: the
 * kernels, and whole forwards of the tests/data/arch models): the dense
 * families (qwen2, qwen3, gemma2, gemma3, phi3, YaRN) and the experts
 * (qwen3moe, Mixtral, gpt-oss with its sinks). A model that needs anything
 * else is refused for it, and `auto` takes the CPU. */
#define KG_CUDA_FEATURES                                                                           \
    (KG_MODEL_FEAT_QKV_BIAS | KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_POST_NORM |                    \
     KG_MODEL_FEAT_GELU | KG_MODEL_FEAT_EMBD_SCALE | KG_MODEL_FEAT_SOFTCAP |                       \
     KG_MODEL_FEAT_SLIDING_WINDOW | KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_ROPE_PARTIAL |         \
     KG_MODEL_FEAT_ROPE_PER_LAYER | KG_MODEL_FEAT_ROPE_YARN | KG_MODEL_FEAT_ROPE_FACTORS |         \
     KG_MODEL_FEAT_Q_SCALE | KG_MODEL_FEAT_MOE | KG_MODEL_FEAT_MOE_OAI | KG_MODEL_FEAT_ATTN_SINKS)

static bool cuda_runs(const kg_model_t *model, char *why, size_t cap) {
    const uint32_t missing = kg_model_features(model) & ~(uint32_t)KG_CUDA_FEATURES;
    char names[256];
    if (missing == 0) {
        return true;
    }
    snprintf(why, cap, "the cuda backend does not implement what this %s model uses: %s",
             kg_arch_name(model->hp.arch), kg_model_feature_names(missing, names, sizeof(names)));
    return false;
}
#endif

const char *kg_backend_list(void) {
#ifdef KG_USE_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
}

/* The CUDA backend uploads F32 and F16 as they are and every other type
 * dequantized on the host (kg_dequantize) into BF16 (gpu/kg_backend_cuda.cu
 * upload_rows): it runs exactly the types kg_dequantize reads. A type added
 * to the CPU backend without that path is refused here, before the upload. */
static const kg_ggml_type_t cuda_types[] = {
    KG_GGML_TYPE_F32,  KG_GGML_TYPE_F16,    KG_GGML_TYPE_BF16,   KG_GGML_TYPE_Q4_0,
    KG_GGML_TYPE_Q4_1, KG_GGML_TYPE_Q5_0,   KG_GGML_TYPE_Q5_1,   KG_GGML_TYPE_Q8_0,
    KG_GGML_TYPE_Q2_K, KG_GGML_TYPE_Q3_K,   KG_GGML_TYPE_Q4_K,   KG_GGML_TYPE_Q5_K,
    KG_GGML_TYPE_Q6_K, KG_GGML_TYPE_IQ4_NL, KG_GGML_TYPE_IQ4_XS, KG_GGML_TYPE_MXFP4,
};

const kg_ggml_type_t *kg_backend_cuda_types(int *n) {
    *n = (int)(sizeof(cuda_types) / sizeof(cuda_types[0]));
    return cuda_types;
}

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

kg_backend_t *kg_backend_new(const char *name,
                             const kg_model_t *model,
                             const kg_backend_params_t *params,
                             char *errstr,
                             size_t errstr_size) {
    if (strcmp(name, "cpu") == 0) {
        return kg_backend_cpu_new(model, params, errstr, errstr_size);
    }
    if (strcmp(name, "cuda") == 0 || strcmp(name, "auto") == 0) {
#ifdef KG_USE_CUDA
        char why[400];
        if (!cuda_runs(model, why, sizeof(why))) {
            if (strcmp(name, "cuda") == 0) {
                snprintf(errstr, errstr_size, "backend cuda: %s (use --backend cpu)", why);
                return NULL;
            }
            KG_LOG_WARN("backend", "%s; using the CPU backend", why);
            return kg_backend_cpu_new(model, params, errstr, errstr_size);
        }
        /* auto falls back to the CPU only when there is truly no device; a
         * device CUDA cannot use is an error either way, with its reason */
        kg_cuda_probe_t probe;
        kg_cuda_probe(&probe);
        int n_types;
        const kg_ggml_type_t *types = kg_backend_cuda_types(&n_types);
        if (probe.kind == KG_CUDA_PROBE_OK &&
            kg_backend_check_types("cuda", model, types, n_types, errstr, errstr_size) != KG_OK) {
            if (strcmp(name, "cuda") == 0) {
                return NULL;
            }
            KG_LOG_WARN("backend", "%s; using the CPU backend", errstr);
            return kg_backend_cpu_new(model, params, errstr, errstr_size);
        }
        if (probe.kind == KG_CUDA_PROBE_OK) {
            return kg_backend_cuda_new(model, params, errstr, errstr_size);
        }
        if (probe.kind == KG_CUDA_PROBE_UNUSABLE || strcmp(name, "cuda") == 0) {
            snprintf(errstr, errstr_size, "backend %s: %s%s", name, probe.message,
                     probe.kind == KG_CUDA_PROBE_UNUSABLE ? " (--backend cpu runs on the CPU)"
                                                          : "");
            return NULL;
        }
        KG_LOG_WARN("backend", "%s; using the CPU backend", probe.message);
#else
        if (strcmp(name, "cuda") == 0) {
            snprintf(errstr, errstr_size,
                     "backend cuda: this build has no CUDA backend (compiled in: %s)",
                     kg_backend_list());
            return NULL;
        }
#endif
        return kg_backend_cpu_new(model, params, errstr, errstr_size);
    }
    snprintf(errstr, errstr_size, "unknown backend '%s' (expected auto, cpu or cuda)", name);
    return NULL;
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

size_t kg_backend_kv_bytes_per_token(const kg_model_t *model) {
    const kg_hparams_t *hp = &model->hp;
    /* K and V, fp16, per layer (the CPU backend's layout; CUDA's is the same size) */
    return (size_t)2 * (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)hp->head_dim *
           sizeof(uint16_t);
}
