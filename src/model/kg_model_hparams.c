/* kg_model_hparams: a GGUF model's hyperparameters with llama.cpp's keys
 * and defaults: the RoPE scaling, each family's switches (its
 * load_arch_hparams, with the values llama.cpp fixes in code), the experts
 * and the checks; kg_model.c calls these before it finds the tensors. */
#include "kg_model_int.h"

#include <math.h>
#include <stdlib.h>

/* Which layers slide (llama_model_base::load_swa_pattern and
 * llama_hparams::set_swa_pattern with dense_first = false): an array of
 * n_layer bools or integers in <arch>.attention.sliding_window_pattern, or
 * a period N there (default `n_pattern`): layer il slides when
 * il % N < N - 1, every layer when N = 0. */
static bool read_swa_pattern(
    const kg_gguf_t *g, const char *arch, int32_t n_pattern, int32_t n_layer, bool *is_swa) {
    char key[128];
    kg_gguf_type_t et;
    uint64_t n = 0;
    akey(key, sizeof(key), arch, "attention.sliding_window_pattern");
    if (kg_gguf_get_arr(g, key, &et, &n)) {
        if (n != (uint64_t)n_layer) {
            return false;
        }
        if (et == KG_GGUF_TYPE_BOOL) {
            size_t size = 0;
            const uint8_t *raw = kg_gguf_kv_raw(g, kg_gguf_find_key(g, key), &size);
            /* element type (u32), count (u64), then one byte per element */
            if (size < 12 + n) {
                return false;
            }
            for (int32_t il = 0; il < n_layer; il++) {
                is_swa[il] = raw[12 + il] != 0;
            }
            return true;
        }
        int32_t *v = malloc((size_t)n_layer * sizeof(int32_t));
        bool ok = v && kg_gguf_arr_i32(g, key, v, n);
        for (int32_t il = 0; ok && il < n_layer; il++) {
            is_swa[il] = v[il] != 0;
        }
        free(v);
        return ok;
    }
    uint32_t period = (uint32_t)n_pattern;
    if (kg_gguf_find_key(g, key) >= 0 && !kg_gguf_get_u32(g, key, &period)) {
        return false;
    }
    for (int32_t il = 0; il < n_layer; il++) {
        is_swa[il] = period == 0 || ((uint32_t)il % period < period - 1);
    }
    return true;
}

/* YaRN's magnitude correction (llama_context's get_mscale). */
static float yarn_mscale(float scale, float mscale) {
    return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

/* RoPE scaling as llama.cpp reads it (load_hparams) and completes it for a
 * context (llama_context: rope_freq_scale, yarn_* defaults). */
bool kg_model_read_rope(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *err, size_t cap) {
    char key[128];
    kg_gguf_str_t s;
    hp->rope_base = 10000.0f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base"), &hp->rope_base);
    hp->rope_scaling = KG_ROPE_SCALING_LINEAR; /* llama.cpp's default when the key is absent */
    if (kg_gguf_get_str(g, akey(key, sizeof(key), arch, "rope.scaling.type"), &s)) {
        if (str_is(s, "none")) {
            hp->rope_scaling = KG_ROPE_SCALING_NONE;
        } else if (str_is(s, "linear")) {
            hp->rope_scaling = KG_ROPE_SCALING_LINEAR;
        } else if (str_is(s, "yarn")) {
            hp->rope_scaling = KG_ROPE_SCALING_YARN;
        } else if (str_is(s, "longrope")) {
            hp->rope_scaling = KG_ROPE_SCALING_LONGROPE;
        } else {
            snprintf(err, cap,
                     "model: unsupported %s.rope.scaling.type '%.*s' (supported: none, linear, "
                     "yarn, longrope)",
                     arch, (int)(s.len > 64 ? 64 : s.len), s.data);
            return false;
        }
    }
    float factor = 0.0f;
    if (!kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.factor"), &factor)) {
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scale_linear"), &factor);
    }
    if (factor < 0.0f || !isfinite(factor)) {
        snprintf(err, cap, "model: bad %s.rope.scaling.factor %g", arch, (double)factor);
        return false;
    }
    hp->rope_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    hp->n_ctx_orig = hp->n_ctx_train;
    get_i32(g, akey(key, sizeof(key), arch, "rope.scaling.original_context_length"),
            &hp->n_ctx_orig);
    if (hp->n_ctx_orig == 0) {
        hp->n_ctx_orig = hp->n_ctx_train;
    }
    float rope_attn_factor = 1.0f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.attn_factor"), &rope_attn_factor);

    /* llama_context: no scaling means no frequency scale; YaRN extrapolates
     * (ext_factor 1) with the magnitude correction computed for the factor,
     * cancelled by the one ggml's rope applies itself (llama.cpp #17945). */
    if (hp->rope_scaling == KG_ROPE_SCALING_NONE) {
        hp->rope_scale = 1.0f;
    }
    hp->yarn_ext_factor = hp->rope_scaling == KG_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    hp->yarn_attn_factor = 1.0f;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    if (hp->yarn_ext_factor != 0.0f) {
        const float f = 1.0f / hp->rope_scale;
        hp->yarn_attn_factor = f <= 1.0f ? 1.0f : 0.1f * 1.0f * logf(f) + 1.0f;
        hp->yarn_attn_factor *= 1.0f / (1.0f + 0.1f * logf(f));
    }
    hp->yarn_attn_factor *= rope_attn_factor;
    return true;
}

bool kg_model_check_hparams(const kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    const char *bad = NULL;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_ff <= 0) {
        bad = "embedding_length, block_count, head_count and feed_forward_length must be > 0";
    } else if (hp->n_layer > 4096 || hp->n_embd > (1 << 20) || hp->n_ff > (1 << 24)) {
        bad = "block_count, embedding_length or feed_forward_length is implausibly large";
    } else if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0) {
        bad = "head_count must be a multiple of head_count_kv";
    } else if (hp->head_dim <= 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024) {
        bad = "head dimension must be even and at most 1024";
    } else if (hp->n_rot <= 0 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim) {
        bad = "rope.dimension_count must be even and at most the head dimension";
    } else if (hp->arch != KG_ARCH_MISTRAL && hp->arch != KG_ARCH_QWEN2 &&
               hp->arch != KG_ARCH_QWEN3 && hp->arch != KG_ARCH_GEMMA2 &&
               hp->arch != KG_ARCH_GEMMA3 && hp->arch != KG_ARCH_PHI3 &&
               hp->arch != KG_ARCH_GLM4MOE && hp->arch != KG_ARCH_DEEPSEEK2 &&
               hp->arch != KG_ARCH_QWEN35 && hp->arch != KG_ARCH_QWEN35MOE &&
               hp->arch != KG_ARCH_QWEN3NEXT && hp->n_rot != hp->head_dim) {
        bad = "this family needs rope.dimension_count equal to the head dimension (as llama.cpp)";
    } else if (hp->arch == KG_ARCH_OLMO2 && (int64_t)hp->n_head * hp->head_dim != hp->n_embd) {
        bad = "olmo2 needs head_count x key_length equal to embedding_length (as llama.cpp)";
    } else if (hp->n_vocab <= 0) {
        bad = "empty vocabulary";
    } else if (!(hp->norm_eps > 0.0f) || !(hp->rope_base > 0.0f) || !(hp->rope_scale > 0.0f) ||
               !isfinite(hp->rope_base) || !(hp->n_ctx_orig > 0)) {
        bad = "rms epsilon, rope base, rope scale and the original context must be > 0";
    } else if (hp->n_swa < 0 || !(hp->attn_softcap >= 0.0f) || !(hp->final_softcap >= 0.0f) ||
               !isfinite(hp->attn_softcap) || !isfinite(hp->final_softcap)) {
        bad = "sliding_window and the soft-capping values must not be negative";
    }
    if (bad) {
        snprintf(errstr, errstr_size, "model: bad hyperparameters: %s", bad);
        return false;
    }
    return true;
}

/* The family's switches, llama.cpp's load_arch_hparams for each. */
bool kg_model_read_arch_hparams(const kg_gguf_t *g,
                                const char *arch,
                                kg_hparams_t *hp,
                                bool *is_swa,
                                float *swa_base,
                                float *swa_scale,
                                int32_t *nope_every,
                                char *errstr,
                                size_t errstr_size) {
    char key[128];
    *nope_every = 0;
    *swa_base = hp->rope_base;
    *swa_scale = hp->rope_scale;
    hp->rope_mode = KG_ROPE_MODE_NEOX;
    hp->ffn_act = KG_FFN_SILU;
    switch (hp->arch) {
    case KG_ARCH_LLAMA:
    case KG_ARCH_MISTRAL:
        hp->rope_mode = KG_ROPE_MODE_NORM;
        break;
    case KG_ARCH_QWEN2:
    case KG_ARCH_QWEN3:
        break;
    case KG_ARCH_PHI3:
        /* llama.cpp disables Phi's sliding window (phi3.cpp, PR 13676): the
         * key is read and ignored */
        hp->q_scale = 1.0f / sqrtf((float)hp->head_dim);
        break;
    case KG_ARCH_GEMMA2:
    case KG_ARCH_GEMMA3: {
        const bool g2 = hp->arch == KG_ARCH_GEMMA2;
        hp->ffn_act = KG_FFN_GELU;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        if (g2) {
            hp->n_swa = 4096; /* Gemma 2's window when the file does not say */
            get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa);
            hp->attn_softcap = 50.0f;
            kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attn_logit_softcapping"),
                            &hp->attn_softcap);
            hp->final_softcap = 30.0f;
        } else {
            /* Gemma 3: windowed only when the file gives a window; local
             * layers keep RoPE base 10000 and no frequency scale unless
             * rope.freq_base_swa says otherwise */
            get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa);
            *swa_base = 10000.0f;
            *swa_scale = 1.0f;
            hp->final_softcap = 0.0f;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "final_logit_softcapping"),
                        &hp->final_softcap);
        if (hp->n_swa > 0 && !read_swa_pattern(g, arch, g2 ? 2 : 6, hp->n_layer, is_swa)) {
            snprintf(errstr, errstr_size,
                     "model: bad %s.attention.sliding_window_pattern (a period, or %d flags)", arch,
                     hp->n_layer);
            return false;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base_swa"), swa_base);
        /* query_pre_attn_scalar: not in the file; llama.cpp takes the 27B
         * shape (46 layers for Gemma 2, 62 for Gemma 3) to mean
         * n_embd / n_head (an integer division there too), every other
         * shape head_dim */
        const bool is_27b = hp->n_layer == (g2 ? 46 : 62);
        const int32_t scale_dim = is_27b ? hp->n_embd / hp->n_head : hp->head_dim;
        hp->q_scale = 1.0f / sqrtf((float)scale_dim);
        break;
    }
    case KG_ARCH_QWEN3MOE:
    case KG_ARCH_SEED_OSS: /* llama_model_seed_oss: the llama graph with NeoX pairs */
        break;
    case KG_ARCH_GLM4MOE: {
        /* llama_model_glm4_moe: NeoX pairs over rope.dimension_count (half
         * the head in GLM-4.5: partial RoPE); rope.dimension_sections with
         * two non-zero sections means M-RoPE (the vision files), which
         * kgen does not run */
        akey(key, sizeof(key), arch, "rope.dimension_sections");
        kg_gguf_type_t et;
        uint64_t n = 0;
        int32_t sec[4] = {0, 0, 0, 0};
        if (kg_gguf_get_arr(g, key, &et, &n) && n >= 2 &&
            (n > 4 || !kg_gguf_arr_i32(g, key, sec, n) || (sec[0] > 0 && sec[1] > 0))) {
            snprintf(errstr, errstr_size,
                     "model: %s with multi-section RoPE (%s, the vision files) is not supported",
                     arch, key);
            return false;
        }
        break;
    }
    case KG_ARCH_BERT: /* kg_model_bert.c reads its own */
    case KG_ARCH_NOMIC_BERT:
        break;
    case KG_ARCH_LFM2:
        /* llama_model_lfm2: NeoX pairs; with a window, every attention
         * layer is windowed (set once the layer kinds are known) */
        get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa);
        break;
    case KG_ARCH_LFM2MOE: /* llama_model_lfm2moe: NeoX pairs; no window is read */
        break;
    case KG_ARCH_QWEN3NEXT:
        /* llama_model_qwen3next: qwen35's gated attention with plain NeoX
         * RoPE over rope.dimension_count */
        hp->attn_out_gate = true;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.scale"), &hp->kq_scale);
        if (!isfinite(hp->kq_scale) || hp->kq_scale < 0.0f) {
            snprintf(errstr, errstr_size, "model: bad %s", key);
            return false;
        }
        break;
    case KG_ARCH_QWEN35:
    case KG_ARCH_QWEN35MOE: {
        /* llama_model_qwen35(moe): LLAMA_ROPE_TYPE_IMROPE over
         * rope.dimension_count (a quarter of the head) with the required
         * rope.dimension_sections. A text token carries its one position in
         * every section (llama_batch_allocr broadcasts it), so each pair's
         * angle is pos * base^(-2i/n_rot) whichever section it falls in:
         * plain NeoX pairs over n_rot dims. Gated attention (the Q
         * projection holds each head's output gate), the optional
         * attention.scale; the DeltaNet layers are kg_model_recurrent.c's. */
        akey(key, sizeof(key), arch, "rope.dimension_sections");
        kg_gguf_type_t et;
        uint64_t n = 0;
        int32_t sec[4] = {0, 0, 0, 0};
        if (!kg_gguf_get_arr(g, key, &et, &n) || n < 1 || n > 4 ||
            !kg_gguf_arr_i32(g, key, sec, n) || sec[0] < 0 || sec[1] < 0 || sec[2] < 0 ||
            sec[3] < 0 || sec[0] + sec[1] + sec[2] == 0 ||
            sec[0] + sec[1] + sec[2] + sec[3] > hp->head_dim) {
            snprintf(errstr, errstr_size,
                     "model: %s missing or bad (up to 4 non-negative section sizes, not all of "
                     "the first three 0, at most the head dimension in all, as ggml asserts)",
                     key);
            return false;
        }
        hp->attn_out_gate = true;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.scale"), &hp->kq_scale);
        if (!isfinite(hp->kq_scale) || hp->kq_scale < 0.0f) {
            snprintf(errstr, errstr_size, "model: bad %s", key);
            return false;
        }
        break;
    }
    case KG_ARCH_NEMOTRON_H:
    case KG_ARCH_NEMOTRON_H_MOE: {
        /* llama_model_nemotron_h: no RoPE at all (LLAMA_ROPE_TYPE_NONE: its
         * attention layers see positions through the Mamba-2 layers only),
         * the MLP layers' squared ReLU; attention.layer_norm_epsilon is
         * required and stands for the RMS epsilon when that is absent */
        *nope_every = 1;
        hp->ffn_act = KG_FFN_RELU_SQR;
        float eps = 0.0f;
        if (!kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.layer_norm_epsilon"),
                             &eps) ||
            !(eps > 0.0f) || !(eps < 1.0f)) {
            snprintf(errstr, errstr_size, "model: %s missing or outside (0, 1)", key);
            return false;
        }
        if (kg_gguf_find_key(g, akey(key, sizeof(key), arch, "attention.layer_norm_rms_epsilon")) <
            0) {
            hp->norm_eps = eps;
        }
        break;
    }
    case KG_ARCH_SMOLLM3:
        /* llama_model_smollm3: n_no_rope_layer_step is fixed at 4 in code
         * (no key): layers 3, 7, 11, ... attend without RoPE */
        hp->rope_mode = KG_ROPE_MODE_NORM;
        *nope_every = 4;
        break;
    case KG_ARCH_GRANITE:
    case KG_ARCH_GRANITEHYBRID: {
        /* llama_model_granite: logit_scale is required, the other
         * multipliers optional (0: not applied); rope.scaling.finetuned
         * (default true there) switches RoPE on for every layer.
         * llama_model_granite_hybrid: the same keys, logit_scale optional
         * too (its converter writes rope.scaling.finetuned false: NoPE) */
        hp->rope_mode = KG_ROPE_MODE_NORM;
        const bool hybrid = hp->arch == KG_ARCH_GRANITEHYBRID;
        if (!kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "logit_scale"), &hp->logit_scale) &&
            !hybrid) {
            snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
            return false;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "residual_scale"), &hp->residual_scale);
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "embedding_scale"), &hp->embd_scale);
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.scale"), &hp->kq_scale);
        bool rope_on = true;
        kg_gguf_get_bool(g, akey(key, sizeof(key), arch, "rope.scaling.finetuned"), &rope_on);
        *nope_every = rope_on ? 0 : 1;
        if ((!hybrid && !(hp->logit_scale != 0.0f)) || !isfinite(hp->logit_scale) ||
            !isfinite(hp->residual_scale) || !isfinite(hp->embd_scale) || !isfinite(hp->kq_scale)) {
            snprintf(errstr, errstr_size,
                     "model: %s.logit_scale must be finite and not 0, and the residual, "
                     "embedding and attention scales finite",
                     arch);
            return false;
        }
        break;
    }
    case KG_ARCH_MISTRAL3: {
        /* llama_model_mistral3: YaRN's betas and its log multiplier
         * (mscale_all_dim) from the file, and Llama 4's attention
         * temperature over blocks of the original context */
        hp->rope_mode = KG_ROPE_MODE_NORM;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.yarn_beta_fast"),
                        &hp->yarn_beta_fast);
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.yarn_beta_slow"),
                        &hp->yarn_beta_slow);
        float log_mul = 0.0f;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.yarn_log_multiplier"),
                        &log_mul);
        if (log_mul != 0.0f && hp->yarn_ext_factor != 0.0f) {
            /* llama_context: mscale(factor, 1) / mscale(factor, mscale_all_dims),
             * then the same cancelling and rope.scaling.attn_factor as read_rope */
            const float f = 1.0f / hp->rope_scale;
            float rope_attn_factor = 1.0f;
            kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.attn_factor"),
                            &rope_attn_factor);
            hp->yarn_attn_factor = yarn_mscale(f, 1.0f) / yarn_mscale(f, log_mul);
            hp->yarn_attn_factor *= 1.0f / (1.0f + 0.1f * logf(f));
            hp->yarn_attn_factor *= rope_attn_factor;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "attention.temperature_scale"),
                        &hp->attn_temp_scale);
        hp->attn_temp_floor = hp->n_ctx_orig;
        if (!isfinite(hp->attn_temp_scale) || !isfinite(log_mul) || !(hp->yarn_beta_fast > 0.0f) ||
            !(hp->yarn_beta_slow > 0.0f) || !isfinite(hp->yarn_beta_fast) ||
            !isfinite(hp->yarn_beta_slow)) {
            snprintf(errstr, errstr_size,
                     "model: bad %s YaRN betas, log multiplier or attention temperature", arch);
            return false;
        }
        break;
    }
    case KG_ARCH_APERTUS:
        /* llama_model_apertus: per-head Q/K norms, xIELU (its xielu.* keys
         * are read per layer with the tensors) */
        hp->ffn_act = KG_FFN_XIELU;
        break;
    case KG_ARCH_OLMO2:
        /* llama_model_olmo2: Q/K norms over the whole projection, and with
         * attention.sliding_window > 0 (Olmo 3) windows on three layers of
         * every four (pattern 4), whose RoPE has the global base but no
         * frequency scale and no YaRN (freq_scale 1, ext_factor 0,
         * attn_factor 1 in its graph) */
        hp->qk_norm_full = true;
        get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa);
        if (hp->n_swa > 0) {
            if (!read_swa_pattern(g, arch, 4, hp->n_layer, is_swa)) {
                snprintf(errstr, errstr_size,
                         "model: bad %s.attention.sliding_window_pattern (a period, or %d flags)",
                         arch, hp->n_layer);
                return false;
            }
            /* llama.cpp reads rope.freq_base_swa here but its graph rotates
             * the windowed layers with the global base */
            *swa_scale = 1.0f;
            if (hp->yarn_ext_factor != 0.0f || hp->yarn_attn_factor != 1.0f) {
                /* kgen's YaRN factors are the model's, not a layer's */
                snprintf(errstr, errstr_size,
                         "model: %s with sliding windows and YaRN or rope.scaling.attn_factor is "
                         "not supported (the windowed layers run without them)",
                         arch);
                return false;
            }
        }
        break;
    case KG_ARCH_GPT_OSS:
        /* llama_model_openai_moe: every other layer slides (pattern 2:
         * layers 0, 2, 4, ...), with the global RoPE unless
         * rope.freq_base_swa says otherwise; attention.sliding_window is
         * required */
        hp->ffn_act = KG_FFN_SWIGLU_OAI;
        if (!get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa)) {
            snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
            return false;
        }
        if (!read_swa_pattern(g, arch, 2, hp->n_layer, is_swa)) {
            snprintf(errstr, errstr_size,
                     "model: bad %s.attention.sliding_window_pattern (a period, or %d flags)", arch,
                     hp->n_layer);
            return false;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base_swa"), swa_base);
        break;
    case KG_ARCH_DEEPSEEK2:
        if (!kg_model_read_mla(g, arch, hp, errstr, errstr_size)) {
            return false;
        }
        break;
    case KG_ARCH_GEMMA4: {
        /* llama_model_gemma4: the window and the per-layer flags are
         * required (no period); the windowed layers' RoPE base 10000 and
         * scale 1 unless rope.freq_base_swa says otherwise */
        kg_gguf_type_t et;
        uint64_t n = 0;
        if (!get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa) ||
            !kg_gguf_get_arr(g, akey(key, sizeof(key), arch, "attention.sliding_window_pattern"),
                             &et, &n) ||
            !read_swa_pattern(g, arch, 0, hp->n_layer, is_swa)) {
            snprintf(errstr, errstr_size,
                     "model: missing or bad %s (sliding_window, and a pattern of %d flags)", key,
                     hp->n_layer);
            return false;
        }
        *swa_base = 10000.0f;
        *swa_scale = 1.0f;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base_swa"), swa_base);
        return kg_model_read_gemma4(g, arch, hp, errstr, errstr_size);
    }
    case KG_ARCH_GEMMA_EMBED:
        /* llama_model_gemma_embedding: gemma3's layers without the causal
         * mask; the window is required and symmetric, five windowed layers
         * in six by default, their RoPE base 10000 unless rope.freq_base_swa
         * says otherwise; queries scaled by 1/sqrt(head_dim) at every size;
         * no soft-capping */
        hp->ffn_act = KG_FFN_GELU;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->non_causal = true;
        if (!get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &hp->n_swa) ||
            hp->n_swa <= 0) {
            snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
            return false;
        }
        if (!read_swa_pattern(g, arch, 6, hp->n_layer, is_swa)) {
            snprintf(errstr, errstr_size,
                     "model: bad %s.attention.sliding_window_pattern (a period, or %d flags)", arch,
                     hp->n_layer);
            return false;
        }
        *swa_base = 10000.0f;
        *swa_scale = 1.0f;
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base_swa"), swa_base);
        hp->q_scale = 1.0f / sqrtf((float)hp->head_dim);
        break;
    case KG_ARCH_LLAMA4: {
        /* llama_model_llama4: LLaMA's RoPE pairs; chunked attention (chunks of 8192, fixed in
         * code whatever attention.sliding_window says, unless it says 0) on three layers of four
         * (sliding_window_pattern, period 4), their RoPE base rope.freq_base_swa when given;
         * every fourth layer without RoPE, with the attention temperature (scale 0.1 over
         * blocks of 8192 positions, offset 1, fixed in code); interleave_moe_layer_step
         * required (0: no MoE layer) */
        hp->rope_mode = KG_ROPE_MODE_NORM;
        int32_t swa = -1;
        int32_t step = -1;
        get_i32(g, akey(key, sizeof(key), arch, "attention.sliding_window"), &swa);
        if (swa == 0) {
            /* MobileLLM-R1's files: llama.cpp then leaves the NoPE last layer's temperature
             * unset and stops at its assertion (llm_graph_input_attn_temp) */
            snprintf(errstr, errstr_size,
                     "model: %s with attention.sliding_window 0 (no chunks: MobileLLM-R1) is not "
                     "supported",
                     arch);
            return false;
        }
        if (!get_i32(g, akey(key, sizeof(key), arch, "interleave_moe_layer_step"), &step) ||
            step < 0 || step > hp->n_layer) {
            snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
            return false;
        }
        hp->n_moe_step = step;
        hp->n_layer_dense = step == 0 ? hp->n_layer : 0;
        hp->n_swa = 8192;
        hp->swa_chunked = true;
        if (!read_swa_pattern(g, arch, 4, hp->n_layer, is_swa)) {
            snprintf(errstr, errstr_size,
                     "model: bad %s.attention.sliding_window_pattern (a period, or %d flags)", arch,
                     hp->n_layer);
            return false;
        }
        kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.freq_base_swa"), swa_base);
        *nope_every = 4;
        hp->attn_temp_scale = 0.1f;
        hp->attn_temp_floor = 8192;
        hp->attn_temp_nope = true;
        break;
    }
    case KG_ARCH_COUNT_:
        break;
    }
    return true;
}

/* An integer key that may be absent (*out untouched) but, when present,
 * must be one non-negative integer: llama.cpp also takes per-layer arrays
 * for some of these, which kgen does not run. */
static bool get_i32_opt(const kg_gguf_t *g,
                        const char *arch,
                        const char *suffix,
                        int32_t *out,
                        char *errstr,
                        size_t errstr_size) {
    char key[128];
    akey(key, sizeof(key), arch, suffix);
    if (kg_gguf_find_key(g, key) < 0 || get_i32(g, key, out)) {
        return true;
    }
    kg_gguf_type_t et;
    uint64_t n;
    snprintf(errstr, errstr_size, "model: %s %s", key,
             kg_gguf_get_arr(g, key, &et, &n)
                 ? "is a per-layer array; kgen runs one value for every layer"
                 : "must be a non-negative integer");
    return false;
}

/* llama_model_lfm2moe's router: expert_gating_func is required (1 softmax,
 * 2 sigmoid: LFM2-8B-A1B's), the selection bias exp_probs_b with it; the
 * graph renormalises the chosen weights and scales them by nothing
 * (build_moe_ffn's norm_w true, expert_weights_scale never read, so 0);
 * the first leading_dense_block_count layers (default 0) are dense. */
static bool read_lfm2moe(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    char key[128];
    int32_t func = 0;
    if (!get_i32(g, akey(key, sizeof(key), arch, "expert_gating_func"), &func) || func < 1 ||
        func > 2) {
        snprintf(errstr, errstr_size,
                 "model: %s missing or %d, not supported (1 softmax, 2 sigmoid)", key, func);
        return false;
    }
    hp->moe_gating = func == 1 ? KG_MOE_SOFTMAX : KG_MOE_SIGMOID;
    hp->moe_norm_w = true;
    hp->moe_w_scale = 0.0f;
    if (!get_i32_opt_key(g, akey(key, sizeof(key), arch, "leading_dense_block_count"),
                         &hp->n_layer_dense) ||
        hp->n_layer_dense > hp->n_layer) {
        snprintf(errstr, errstr_size,
                 "model: %s must be a non-negative integer at most block_count (%d)", key,
                 hp->n_layer);
        return false;
    }
    return true;
}

/* The experts (llama_model_base::load_hparams, then each family): the
 * counts for every family (0 experts: dense), the expert width and the
 * router's rule, which llama.cpp fixes per family in code: softmax, top-k,
 * renormalised, for qwen3moe and llama (Mixtral); top-k of the logits, then
 * a softmax over them, for gpt-oss. <arch>.expert_weights_norm and
 * expert_weights_scale, which llama.cpp reads for other MoE families, are
 * honoured when a file has them. */
bool kg_model_read_moe_hparams(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    char key[128];
    const kg_arch_t a = hp->arch;
    if (!get_i32_opt(g, arch, "expert_count", &hp->n_expert, errstr, errstr_size) ||
        !get_i32_opt(g, arch, "expert_used_count", &hp->n_expert_used, errstr, errstr_size) ||
        !get_i32_opt(g, arch, "expert_feed_forward_length", &hp->n_ff_exp, errstr, errstr_size)) {
        return false;
    }
    const bool moe_arch = a == KG_ARCH_QWEN3MOE || a == KG_ARCH_GPT_OSS || a == KG_ARCH_GLM4MOE ||
                          a == KG_ARCH_DEEPSEEK2 || a == KG_ARCH_QWEN35MOE ||
                          a == KG_ARCH_QWEN3NEXT || a == KG_ARCH_NEMOTRON_H_MOE ||
                          a == KG_ARCH_LLAMA4 || a == KG_ARCH_LFM2MOE;
    if (hp->n_expert == 0) {
        if (moe_arch || hp->n_expert_used != 0) {
            snprintf(errstr, errstr_size,
                     "model: %s needs %s.expert_count > 0 and expert_used_count > 0",
                     kg_arch_name(a), arch);
            return false;
        }
        hp->n_ff_exp = 0;
        return true;
    }
    if (!moe_arch && a != KG_ARCH_LLAMA && a != KG_ARCH_GEMMA4 && a != KG_ARCH_GRANITEHYBRID) {
        snprintf(errstr, errstr_size,
                 "model: %s with experts is not supported (experts: llama/Mixtral, qwen3moe, "
                 "gpt-oss, glm4moe, deepseek2, gemma4, qwen35moe, qwen3next, nemotron_h_moe, "
                 "lfm2moe, granitehybrid, llama4)",
                 kg_arch_name(a));
        return false;
    }
    if (hp->n_expert > KG_MOE_MAX_EXPERTS || hp->n_expert_used < 1 ||
        hp->n_expert_used > hp->n_expert) {
        snprintf(errstr, errstr_size,
                 "model: bad hyperparameters: expert_count %d (1..1024) and expert_used_count %d "
                 "(1..expert_count)",
                 hp->n_expert, hp->n_expert_used);
        return false;
    }
    if (a == KG_ARCH_LLAMA || a == KG_ARCH_GRANITEHYBRID) {
        /* Mixtral's and Granite's feed_forward_length is each expert's (llama.cpp reads no
         * expert_feed_forward_length for them) */
        hp->n_ff_exp = hp->n_ff;
    } else if ((a == KG_ARCH_QWEN3MOE || a == KG_ARCH_GLM4MOE || a == KG_ARCH_DEEPSEEK2 ||
                a == KG_ARCH_QWEN35MOE || a == KG_ARCH_QWEN3NEXT) &&
               hp->n_ff_exp == 0) {
        hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    }
    if (hp->n_ff_exp <= 0 || hp->n_ff_exp > (1 << 24)) {
        snprintf(errstr, errstr_size, "model: %s.expert_feed_forward_length must be in 1..2^24",
                 arch);
        return false;
    }
    hp->moe_gating = a == KG_ARCH_GPT_OSS   ? KG_MOE_SOFTMAX_WEIGHT
                     : a == KG_ARCH_GLM4MOE ? KG_MOE_SIGMOID
                                            : KG_MOE_SOFTMAX;
    /* llama_hparams' default is false; llama.cpp's qwen3moe and Mixtral
     * graphs renormalise whatever the file says */
    hp->moe_norm_w = a != KG_ARCH_GPT_OSS && a != KG_ARCH_GLM4MOE && a != KG_ARCH_DEEPSEEK2 &&
                     a != KG_ARCH_NEMOTRON_H_MOE;
    kg_gguf_get_bool(g, akey(key, sizeof(key), arch, "expert_weights_norm"), &hp->moe_norm_w);
    if (a == KG_ARCH_QWEN35MOE || a == KG_ARCH_QWEN3NEXT) {
        /* llama_model_qwen35moe, qwen3next: the shared expert's width, n_ff without
         * the key; softmax routing, renormalised (build_moe_ffn's norm_w) */
        hp->n_ff_shexp = hp->n_ff;
        if (!get_i32_opt(g, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, errstr,
                         errstr_size)) {
            return false;
        }
        if (hp->n_ff_shexp <= 0 || hp->n_ff_shexp > (1 << 24)) {
            snprintf(errstr, errstr_size,
                     "model: %s.expert_shared_feed_forward_length must be in 1..2^24", arch);
            return false;
        }
    }
    if ((a == KG_ARCH_GLM4MOE || a == KG_ARCH_DEEPSEEK2) &&
        !kg_model_read_shared_moe(g, arch, a == KG_ARCH_GLM4MOE ? KG_MOE_SIGMOID : KG_MOE_SOFTMAX,
                                  hp, errstr, errstr_size)) {
        return false;
    }
    /* group-limited top-k: llama_model_base reads the keys for every family */
    if (!get_i32_opt(g, arch, "expert_group_count", &hp->n_expert_groups, errstr, errstr_size) ||
        !get_i32_opt(g, arch, "expert_group_used_count", &hp->n_group_used, errstr, errstr_size)) {
        return false;
    }
    if (hp->n_expert_groups > 1) {
        const int32_t per = hp->n_expert / hp->n_expert_groups;
        if (hp->n_expert_groups > KG_MOE_MAX_GROUPS || hp->n_expert % hp->n_expert_groups != 0 ||
            per < 2 || hp->n_group_used < 1 || hp->n_group_used >= hp->n_expert_groups ||
            hp->n_group_used * per < hp->n_expert_used) {
            snprintf(errstr, errstr_size,
                     "model: bad %s.expert_group_count %d / expert_group_used_count %d (groups "
                     "of at least 2 that divide the %d experts, at most %d groups, 1..groups-1 "
                     "used, holding at least expert_used_count experts)",
                     arch, hp->n_expert_groups, hp->n_group_used, hp->n_expert, KG_MOE_MAX_GROUPS);
            return false;
        }
    } else {
        hp->n_expert_groups = 0; /* one group: no limit */
        hp->n_group_used = 0;
    }
    hp->moe_w_scale = 0.0f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "expert_weights_scale"), &hp->moe_w_scale);
    if (!isfinite(hp->moe_w_scale) || hp->moe_w_scale < 0.0f) {
        snprintf(errstr, errstr_size, "model: bad %s.expert_weights_scale %g", arch,
                 (double)hp->moe_w_scale);
        return false;
    }
    if (a == KG_ARCH_NEMOTRON_H_MOE) {
        /* llama_model_nemotron_h's graph: a sigmoid router with the
         * selection bias exp_probs_b (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
         * whatever the file says), a shared expert of
         * expert_shared_feed_forward_length; the latent projections of
         * Nemotron 3 Super (moe_latent_size) are not run */
        hp->moe_gating = KG_MOE_SIGMOID;
        int32_t latent = 0;
        if (!get_i32_opt(g, arch, "expert_shared_count", &hp->n_expert_shared, errstr,
                         errstr_size) ||
            !get_i32_opt(g, arch, "moe_latent_size", &latent, errstr, errstr_size) ||
            !get_i32_opt(g, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, errstr,
                         errstr_size)) {
            return false;
        }
        if (latent > 0 || hp->n_ff_shexp <= 0 || hp->n_ff_shexp > (1 << 24)) {
            snprintf(errstr, errstr_size,
                     "model: %s needs expert_shared_feed_forward_length in 1..2^24 and no "
                     "moe_latent_size (Nemotron 3 Super's latent experts are not supported)",
                     arch);
            return false;
        }
    }
    if (a == KG_ARCH_LFM2MOE && !read_lfm2moe(g, arch, hp, errstr, errstr_size)) {
        return false;
    }
    if (a == KG_ARCH_GRANITEHYBRID) {
        /* llama_model_granite_hybrid (Granite 4.0-H Tiny, Small): every layer's FFN experts,
         * softmax routing, renormalised, no scale (its graph passes these and reads no
         * expert_weights_scale); the shared expert when expert_shared_feed_forward_length
         * is there */
        hp->moe_gating = KG_MOE_SOFTMAX;
        hp->moe_norm_w = true;
        hp->moe_w_scale = 0.0f;
        if (!get_i32_opt(g, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, errstr,
                         errstr_size)) {
            return false;
        }
        if (hp->n_ff_shexp < 0 || hp->n_ff_shexp > (1 << 24)) {
            snprintf(errstr, errstr_size,
                     "model: %s.expert_shared_feed_forward_length must be in 0..2^24", arch);
            return false;
        }
    }
    if (a == KG_ARCH_GEMMA4) {
        /* llama_model_gemma4's graph passes these to build_moe_ffn as
         * literals (softmax, renormalised, scale 1), whatever the file says */
        hp->moe_gating = KG_MOE_SOFTMAX;
        hp->moe_norm_w = true;
        hp->moe_w_scale = 0.0f;
    }
    if (a == KG_ARCH_LLAMA4) {
        /* llama_model_llama4's graph: build_moe_ffn with sigmoid gating, the logits choosing,
         * no renormalisation, no scale (expert_weights_scale is not read for llama4), each
         * chosen expert's input times its weight; a shared expert as wide as a routed one;
         * Q/K L2 norms unless the model has 128 experts (Maverick: LLM_TYPE_17B_128E) */
        hp->moe_gating = KG_MOE_SIGMOID;
        hp->moe_norm_w = false;
        hp->moe_w_scale = 0.0f;
        hp->moe_w_before = true;
        hp->n_ff_shexp = hp->n_ff_exp;
        hp->qk_l2_norm = hp->n_expert != 128;
    }
    return true;
}

/* The shared-expert MoE keys of glm4moe and deepseek2 (llama_model_glm4_moe's and
 * llama_model_deepseek2's load_arch_hparams): the shared experts (required), the leading dense
 * layers, the gating function (1 softmax, 2 sigmoid; absent or 0: the family's default, sigmoid
 * for GLM, softmax for DeepSeek V2/V2.5 files, as llama.cpp; its GLM-4.7 Lite exception is a
 * glm file on the deepseek2 graph, which kgen does not special-case). */
bool kg_model_read_shared_moe(const kg_gguf_t *g,
                              const char *arch,
                              kg_moe_gating_t absent,
                              kg_hparams_t *hp,
                              char *errstr,
                              size_t errstr_size) {
    char key[128];
    if (!get_i32(g, akey(key, sizeof(key), arch, "expert_shared_count"), &hp->n_expert_shared) ||
        !get_i32_opt_key(g, akey(key, sizeof(key), arch, "leading_dense_block_count"),
                         &hp->n_layer_dense)) {
        snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
        return false;
    }
    int32_t func = 0;
    if (!get_i32_opt_key(g, akey(key, sizeof(key), arch, "expert_gating_func"), &func) ||
        func > 2) {
        snprintf(errstr, errstr_size,
                 "model: %s %d is not supported (1 softmax, 2 sigmoid; absent: %s)", key, func,
                 absent == KG_MOE_SIGMOID ? "sigmoid" : "softmax");
        return false;
    }
    hp->moe_gating = func == 1 ? KG_MOE_SOFTMAX : func == 2 ? KG_MOE_SIGMOID : absent;
    if (hp->n_layer_dense > hp->n_layer || hp->n_expert_shared > 64) {
        snprintf(errstr, errstr_size,
                 "model: %s.leading_dense_block_count %d must be at most the %d trunk layers and "
                 "expert_shared_count %d at most 64",
                 arch, hp->n_layer_dense, hp->n_layer, hp->n_expert_shared);
        return false;
    }
    return true;
}

/* One float per layer: <key> holds one value for every layer or an array
 * of n_layer (llama.cpp's get_key_or_arr). */
static bool get_f32_per_layer(const kg_gguf_t *g, const char *key, int32_t n_layer, float *out) {
    kg_gguf_type_t et;
    uint64_t n = 0;
    if (kg_gguf_get_arr(g, key, &et, &n)) {
        return et == KG_GGUF_TYPE_FLOAT32 && n == (uint64_t)n_layer &&
               kg_gguf_arr_f32(g, key, out, n);
    }
    float v;
    if (!kg_gguf_get_f32(g, key, &v)) {
        return false;
    }
    for (int32_t il = 0; il < n_layer; il++) {
        out[il] = v;
    }
    return true;
}

/* ggml_compute_softplus_f32 */
static float softplus(float x) {
    return x > 20.0f ? x : logf(1 + expf(x));
}

/* Apertus's xIELU constants (the keys have no architecture prefix), made
 * into ggml_xielu's op parameters for each layer. */
bool kg_model_read_xielu(const kg_gguf_t *g, kg_model_t *model, char *errstr, size_t errstr_size) {
    static const char *const keys[4] = {"xielu.alpha_n", "xielu.alpha_p", "xielu.beta",
                                        "xielu.eps"};
    const int32_t n_layer = model->hp.n_layer;
    float *v = malloc((size_t)n_layer * 4 * sizeof(float));
    bool ok = v != NULL;
    for (int k = 0; ok && k < 4; k++) {
        if (!get_f32_per_layer(g, keys[k], n_layer, v + (size_t)k * n_layer)) {
            snprintf(errstr, errstr_size,
                     "model: missing or bad '%s' (one F32, or an array of %d: one per layer)",
                     keys[k], n_layer);
            ok = false;
        }
    }
    for (int32_t il = 0; ok && il < n_layer; il++) {
        kg_layer_weights_t *L = &model->layers[il];
        const float an = v[il], ap = v[n_layer + il], beta = v[2 * n_layer + il];
        L->xielu_an = beta + softplus(an);
        L->xielu_ap = softplus(ap);
        L->xielu_beta = beta;
        L->xielu_eps = v[3 * n_layer + il];
        if (!isfinite(L->xielu_an) || !isfinite(L->xielu_ap) || !isfinite(L->xielu_beta) ||
            !isfinite(L->xielu_eps)) {
            snprintf(errstr, errstr_size, "model: layer %d: xielu values must be finite", (int)il);
            ok = false;
        }
    }
    if (!v) {
        snprintf(errstr, errstr_size, "model: out of memory");
    }
    free(v);
    return ok;
}
