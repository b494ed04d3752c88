/* kg_backend_registry: the backends compiled in, the choice among them
 * (auto/cpu/cuda), and what the CUDA backend runs (see the header for why
 * this sits above src/backend/). */
#include "kg_backend_registry.h"

#include "../core/kg_log.h"

#include <stdio.h>
#include <string.h>

#ifdef KG_USE_CUDA
#include "../../gpu/kg_backend_cuda.h"
#endif

// ---- what the CUDA backend runs ----

#ifdef KG_USE_CUDA
/* The KG_MODEL_FEAT_* bits the CUDA backend implements, each checked
 * against the CPU backend on the emulator (tests/unit/check_cuda.c: the
 * kernels, and whole forwards of the tests/data/arch models): the dense
 * families (qwen2, qwen3, gemma2, gemma3, phi3, YaRN, issue 24's) and the
 * experts (qwen3moe, Mixtral, gpt-oss with its sinks, glm4moe's sigmoid
 * router and shared expert, deepseek2's latent attention), llama4 (chunked attention, Q/K L2
 * norms, the NoPE layers' temperature, experts weighted on their input), the bert and
 * nomic-bert encoders, gemma-embedding's non-causal decoder layers (check_cuda_embed.c), and
 * Gemma 4's per-layer shapes, shared K/V, per-layer inputs, V norm and MoE
 * blocks (gpu/kg_backend_cuda_gemma4.cu).
 * A model that needs anything else is refused for it, and `auto` takes
 * the CPU. */
#define KG_CUDA_FEATURES                                                                           \
    (KG_MODEL_FEAT_QKV_BIAS | KG_MODEL_FEAT_QK_NORM | KG_MODEL_FEAT_POST_NORM |                    \
     KG_MODEL_FEAT_GELU | KG_MODEL_FEAT_EMBD_SCALE | KG_MODEL_FEAT_SOFTCAP |                       \
     KG_MODEL_FEAT_SLIDING_WINDOW | KG_MODEL_FEAT_ROPE_NEOX | KG_MODEL_FEAT_ROPE_PARTIAL |         \
     KG_MODEL_FEAT_ROPE_PER_LAYER | KG_MODEL_FEAT_ROPE_YARN | KG_MODEL_FEAT_ROPE_FACTORS |         \
     KG_MODEL_FEAT_Q_SCALE | KG_MODEL_FEAT_MOE | KG_MODEL_FEAT_MOE_OAI |                           \
     KG_MODEL_FEAT_ATTN_SINKS | KG_MODEL_FEAT_NOPE | KG_MODEL_FEAT_SCALES |                        \
     KG_MODEL_FEAT_NO_PRE_NORM | KG_MODEL_FEAT_QK_NORM_FULL | KG_MODEL_FEAT_ATTN_TEMP |            \
     KG_MODEL_FEAT_XIELU | KG_MODEL_FEAT_MOE_SIGMOID | KG_MODEL_FEAT_SHARED_EXPERT |               \
     KG_MODEL_FEAT_ENCODER | KG_MODEL_FEAT_BIDIR | KG_MODEL_FEAT_MLA |                             \
     KG_MODEL_FEAT_HEAD_PER_LAYER | KG_MODEL_FEAT_KV_SHARED | KG_MODEL_FEAT_PER_LAYER_EMBD |       \
     KG_MODEL_FEAT_V_NORM)

/* The hybrid families whose recurrent layers gpu/ has kernels for
 * (gpu/recurrent.cu; per-slot states in device memory), each checked
 * against the CPU backend on the emulator (tests/unit/check_cuda_recurrent.c):
 * LFM2's short convolution (and LFM2-MoE's, its experts moe.cu's),
 * Qwen3.5's and Qwen3-Next's gated DeltaNet (with their gated attention and
 * gated shared expert), Granite 4's and Nemotron-H's Mamba-2 (with Granite's
 * experts and shared expert, Nemotron-H's MLP-only layers and squared ReLU, and
 * Nemotron-H-MoE's gateless squared-ReLU experts and shared expert, moe.cu's). */
static bool cuda_runs_hybrid(kg_arch_t arch) {
    return arch == KG_ARCH_LFM2 || arch == KG_ARCH_LFM2MOE || arch == KG_ARCH_QWEN35 ||
           arch == KG_ARCH_QWEN35MOE || arch == KG_ARCH_QWEN3NEXT ||
           arch == KG_ARCH_GRANITEHYBRID || arch == KG_ARCH_NEMOTRON_H ||
           arch == KG_ARCH_NEMOTRON_H_MOE;
}

static bool cuda_runs(const kg_model_t *model, char *why, size_t cap) {
    /* (per-layer shapes, KG_MODEL_FEAT_HEAD_PER_LAYER, cover nemotron_h's
     * layers without an FFN as well as Gemma 4's: the step takes each
     * layer's own shape) */
    const uint32_t used = kg_model_features(model);
    if (kg_model_is_recurrent(model) && !cuda_runs_hybrid(model->hp.arch)) {
        snprintf(why, cap,
                 "the cuda backend has no kernels for this %s model's recurrent (hybrid) layers "
                 "yet (it runs lfm2's, lfm2moe's, qwen35's, qwen35moe's, qwen3next's, "
                 "granitehybrid's, nemotron_h's and nemotron_h_moe's)",
                 kg_arch_name(model->hp.arch));
        return false;
    }
    if ((used & KG_MODEL_FEAT_ENCODER) && model->hp.arch != KG_ARCH_BERT &&
        model->hp.arch != KG_ARCH_NOMIC_BERT) {
        /* its encoder step (gpu/kg_backend_cuda_bert.cu) knows those two
         * graphs: an encoder added to the CPU backend is not one of them */
        snprintf(why, cap,
                 "the cuda backend runs the bert and nomic-bert encoders only, not this %s model",
                 kg_arch_name(model->hp.arch));
        return false;
    }
    /* (a latent attention's rows are mla.cu's, whose limits cuda_mla_check gives) */
    /* gpu/attention.cu's kernels hold a head in shared memory: up to 512
     * dims (Gemma 4's global layers); the encoders' bert.cu up to 256 */
    const int32_t max_hd = kg_model_embed_only(model) ? 256 : 512;
    for (int32_t il = 0; il < model->hp.n_layer && model->hp.n_lora_kv == 0; il++) {
        if (model->layers[il].head_dim > max_hd) {
            snprintf(why, cap,
                     "the cuda backend's attention takes heads of up to %d dims; layer %d of this "
                     "%s model has %d",
                     (int)max_hd, (int)il, kg_arch_name(model->hp.arch),
                     model->layers[il].head_dim);
            return false;
        }
    }
    const uint32_t missing = used & ~(uint32_t)KG_CUDA_FEATURES;
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
 * dequantized on the host (kg_dequantize) into BF16 (gpu/kg_backend_cuda_weights.cu
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

// ---- the choice ----

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
