/* kg_model_mla: DeepSeek V2/V3's hyperparameters (llama.cpp's
 * llama_model_deepseek2::load_arch_hparams): multi-head latent attention's
 * ranks and head sizes, YaRN's magnitude factor as llama_context and the
 * deepseek2 graph make it for these files, and the MoE keys with
 * deepseek2's defaults. kg_model.c calls these in its load order. */
#include "kg_model_int.h"

#include <math.h>

/* YaRN's magnitude correction (llama_context's get_mscale). */
static float get_mscale(float scale, float mscale) {
    return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

bool kg_model_read_mla(
    const kg_gguf_t *g, const char *arch, kg_hparams_t *hp, char *errstr, size_t errstr_size) {
    char key[128];
    hp->rope_mode = KG_ROPE_MODE_NORM; /* llama_model_rope_type: LLAMA_ROPE_TYPE_NORM */
    hp->ffn_act = KG_FFN_SILU;
    if (!get_i32(g, akey(key, sizeof(key), arch, "attention.kv_lora_rank"), &hp->n_lora_kv) ||
        hp->n_lora_kv <= 0 ||
        !get_i32_opt_key(g, akey(key, sizeof(key), arch, "attention.q_lora_rank"), &hp->n_lora_q)) {
        snprintf(errstr, errstr_size, "model: missing or bad hyperparameter '%s'", key);
        return false;
    }
    /* Files converted before llama.cpp split attn_kv_b (no key_length_mla)
     * describe full heads, which would need a full-head cache: refused */
    if (!get_i32(g, akey(key, sizeof(key), arch, "attention.key_length_mla"), &hp->mla_k) ||
        !get_i32(g, akey(key, sizeof(key), arch, "attention.value_length_mla"), &hp->mla_v)) {
        snprintf(errstr, errstr_size,
                 "model: %s without %s (a file converted before llama.cpp split attn_kv_b into "
                 "attn_k_b and attn_v_b) is not supported: convert it again",
                 arch, key);
        return false;
    }
    int32_t v_len = hp->head_dim;
    get_i32(g, akey(key, sizeof(key), arch, "attention.value_length"), &v_len);
    if (hp->n_head_kv != 1 || hp->head_dim != hp->n_lora_kv + hp->n_rot || v_len != hp->n_lora_kv ||
        hp->mla_k <= hp->n_rot || hp->mla_k > 1024 || hp->mla_v <= 0 || hp->mla_v > 1024 ||
        hp->n_lora_q > (1 << 16) || hp->n_lora_kv > 4096) {
        snprintf(errstr, errstr_size,
                 "model: bad %s attention: head_count_kv %d must be 1, key_length %d "
                 "kv_lora_rank %d + rope.dimension_count %d, value_length %d kv_lora_rank, "
                 "key_length_mla %d above the RoPE dims, value_length_mla %d in 1..1024",
                 arch, hp->n_head_kv, hp->head_dim, hp->n_lora_kv, hp->n_rot, v_len, hp->mla_k,
                 hp->mla_v);
        return false;
    }
    /* Mistral Large 3's files on this graph scale queries by position;
     * kgen does not run that here */
    if (kg_gguf_find_key(g, akey(key, sizeof(key), arch, "attention.temperature_scale")) >= 0) {
        snprintf(errstr, errstr_size, "model: %s with %s is not supported", arch, key);
        return false;
    }
    /* rope.scaling.yarn_log_multiplier is 0.1 x mscale_all_dim in the file
     * (the converter's factor, cancelled here as llama.cpp does) */
    float log_mul = 0.0f;
    if (kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.yarn_log_multiplier"),
                        &log_mul)) {
        log_mul /= 0.1f;
    }
    if (!isfinite(log_mul)) {
        snprintf(errstr, errstr_size, "model: bad %s", key);
        return false;
    }
    float rope_attn_factor = 1.0f;
    kg_gguf_get_f32(g, akey(key, sizeof(key), arch, "rope.scaling.attn_factor"), &rope_attn_factor);
    const float factor = 1.0f / hp->rope_scale;
    if (hp->yarn_ext_factor != 0.0f) {
        /* llama_context: with mscale_all_dim, mscale(factor, m) /
         * mscale(factor, mscale_all_dim), m = mscale_all_dim unless it is 1
         * (DeepSeek V2's special case), then ggml's own factor cancelled */
        if (log_mul != 0.0f) {
            const float mscale = log_mul != 1.0f ? log_mul : 1.0f;
            hp->yarn_attn_factor = get_mscale(factor, mscale) / get_mscale(factor, log_mul);
        } else {
            hp->yarn_attn_factor = get_mscale(factor, 1.0f);
        }
        hp->yarn_attn_factor *= 1.0f / (1.0f + 0.1f * logf(factor));
        hp->yarn_attn_factor *= rope_attn_factor;
    }
    /* the deepseek2 graph: the original attn_factor back, YaRN's mscale
     * from it, the scores scaled by its square */
    const float attn_factor_org = hp->yarn_attn_factor * (1.0f + 0.1f * logf(factor));
    const float mscale = attn_factor_org * (1.0f + 0.1f * log_mul * logf(factor));
    hp->mla_kq_scale = 1.0f * mscale * mscale / sqrtf((float)hp->mla_k);
    if (!isfinite(hp->mla_kq_scale) || !(hp->mla_kq_scale > 0.0f)) {
        snprintf(errstr, errstr_size, "model: %s's attention scale is not a positive number", arch);
        return false;
    }
    return true;
}
