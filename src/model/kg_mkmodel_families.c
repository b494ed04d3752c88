/* kg_mkmodel_families: the table of what llama.cpp's converter writes for each family
 * kg_mkmodel knows (its tensors, keys and built-in vocabulary style), apart from the writer
 * that follows it (kg_mkmodel.c). */
#include "kg_gguf_writer.h"
#include "kg_mkmodel.h"
#include "kg_mkmodel_int.h"
#include "kg_mkvocab.h"

#include <stddef.h>
#include <string.h>

static const kg_mkmodel_family_t families[] = {
    {.arch = "llama", .gguf_arch = "llama", .vocab = KG_MKVOCAB_LLAMA, .rms_eps = 1e-5f},
    {.arch = "qwen2",
     .gguf_arch = "qwen2",
     .qkv_bias = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f},
    {.arch = "qwen3",
     .gguf_arch = "qwen3",
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f},
    {.arch = "gemma2",
     .gguf_arch = "gemma2",
     .post_norms = true,
     .always_tied = true,
     .small_embd = true,
     .vocab = KG_MKVOCAB_GEMMA,
     .rms_eps = 1e-6f},
    {.arch = "gemma3",
     .gguf_arch = "gemma3",
     .qk_norm = true,
     .post_norms = true,
     .small_embd = true,
     .vocab = KG_MKVOCAB_GEMMA,
     .rms_eps = 1e-6f},
    /* EmbeddingGemma (llama.cpp's gemma-embedding): gemma3's layers, no
     * lm_head, mean pooling and the Sentence-Transformers dense projections
     * (kg_mkmodel.c writes those by this arch) */
    {.arch = "gemma-embedding",
     .gguf_arch = "gemma-embedding",
     .qk_norm = true,
     .post_norms = true,
     .always_tied = true,
     .small_embd = true,
     .vocab = KG_MKVOCAB_GEMMA,
     .rms_eps = 1e-6f},
    {.arch = "phi3",
     .gguf_arch = "phi3",
     .fused = true,
     .vocab = KG_MKVOCAB_PHI3,
     .rms_eps = 1e-5f},
    {.arch = "qwen3moe",
     .gguf_arch = "qwen3moe",
     .moe = true,
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f},
    {.arch = "mixtral",
     .gguf_arch = "llama",
     .moe = true,
     .vocab = KG_MKVOCAB_LLAMA,
     .rms_eps = 1e-5f},
    {.arch = "gpt-oss",
     .gguf_arch = "gpt-oss",
     .moe = true,
     .oss = true,
     .qkv_bias = true,
     .vocab = KG_MKVOCAB_GPT_OSS,
     .rms_eps = 1e-5f},
    /* SmolLM3 and Granite ship byte-level BPE vocabularies (the qwen one
     * stands in); RoPE in llama's pairs */
    {.arch = "smollm3",
     .gguf_arch = "smollm3",
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .norm_rope = true},
    {.arch = "granite",
     .gguf_arch = "granite",
     .small_embd = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .norm_rope = true,
     .granite_scales = true},
    /* OLMo 2 (and Olmo 3 with --sliding-window): norms on the blocks'
     * outputs only, Q/K norms over all heads; a byte-level BPE */
    {.arch = "olmo2",
     .gguf_arch = "olmo2",
     .post_norms = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .no_pre_norms = true,
     .qk_norm_full = true},
    /* Ministral 3 / Mistral Small 3.x text: llama with Llama 4's attention
     * temperature and YaRN's betas from the file (Tekken's BPE: the qwen
     * one stands in) */
    {.arch = "mistral3",
     .gguf_arch = "mistral3",
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .norm_rope = true,
     .llama4_temp = true},
    /* Seed-OSS: llama's graph with NeoX pairs, Q/K/V biases, its FFN norm
     * named post_attention_norm; a byte-level BPE */
    {.arch = "seed_oss",
     .gguf_arch = "seed_oss",
     .qkv_bias = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .ffn_norm_post = true},
    /* Apertus: per-head Q/K norms, NeoX pairs, an ungated xIELU FFN; a
     * byte-level BPE */
    {.arch = "apertus",
     .gguf_arch = "apertus",
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .xielu = true},
    /* GLM-4.5/4.6/4.7: Q/K/V biases, per-head Q/K norms (the 355B files;
     * Air has none), partial NeoX RoPE, the FFN norm named
     * post_attention_norm, a sigmoid router with a selection bias, a shared
     * expert, leading dense layers and next-token-prediction blocks; a
     * byte-level BPE with the glm4 pre-tokenizer and GLM-4.5's specials */
    {.arch = "glm4moe",
     .gguf_arch = "glm4moe",
     .moe = true,
     .qkv_bias = true,
     .qk_norm = true,
     .vocab = KG_MKVOCAB_GLM,
     .rms_eps = 1e-5f,
     .ffn_norm_post = true,
     .glm = true},
    /* DeepSeek V3 (V2-Lite with --q-lora-rank 0): multi-head latent
     * attention, llama's RoPE pairs over the rope dims, GLM's MoE (sigmoid
     * router with a selection bias, shared experts, leading dense layers);
     * a byte-level BPE with the deepseek-v3 pre-tokenizer and V3's specials */
    {.arch = "deepseek2",
     .gguf_arch = "deepseek2",
     .moe = true,
     .vocab = KG_MKVOCAB_DEEPSEEK,
     .rms_eps = 1e-6f,
     .mla = true},
    /* Gemma 4: windowed and global layers of different head sizes, per-layer
     * inputs, shared K/V layers (kg_mkmodel_gemma4.c); Gemma's SentencePiece
     * vocabulary stands in for its own BPE one */
    {.arch = "gemma4",
     .gguf_arch = "gemma4",
     .small_embd = true,
     .vocab = KG_MKVOCAB_GEMMA,
     .rms_eps = 1e-6f,
     .gemma4 = true},
    /* LFM2: gated short convolutions, every third layer attention with
     * per-head Q/K norms, NeoX pairs (kg_mkmodel_lfm2.c); a byte-level BPE
     * (the qwen one stands in for its llama3-style one) */
    {.arch = "lfm2",
     .gguf_arch = "lfm2",
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .lfm2 = true},
    /* LFM2-MoE (LFM2-8B-A1B): lfm2's layers, experts after the leading dense
     * ones behind a sigmoid router with a selection bias */
    {.arch = "lfm2moe",
     .gguf_arch = "lfm2moe",
     .moe = true,
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .lfm2 = true},
    /* Qwen3.5: gated DeltaNet and gated attention layers
     * (kg_mkmodel_qwen35.c); Qwen's byte-level BPE with its qwen35
     * pre-tokenizer */
    {.arch = "qwen35",
     .gguf_arch = "qwen35",
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .qwen35 = true},
    {.arch = "qwen35moe",
     .gguf_arch = "qwen35moe",
     .moe = true,
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .qwen35 = true},
    /* Qwen3-Next: qwen35moe's layers, plain NeoX RoPE, ssm_ba; Qwen2's
     * pre-tokenizer (its converter's) */
    {.arch = "qwen3next",
     .gguf_arch = "qwen3next",
     .moe = true,
     .qk_norm = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-6f,
     .qwen35 = true},
    /* Granite 4's hybrids: Mamba-2 layers beside attention, each with
     * Granite's SwiGLU FFN and multipliers, llama's RoPE pairs (unused:
     * NoPE); Nemotron-H: each layer Mamba-2, attention (no RoPE) or a
     * squared-ReLU MLP (kg_mkmodel_mamba2.c); byte-level BPEs (the qwen one
     * stands in) */
    {.arch = "granitehybrid",
     .gguf_arch = "granitehybrid",
     .small_embd = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .norm_rope = true,
     .granite_scales = true,
     .mamba2 = true},
    {.arch = "nemotron_h",
     .gguf_arch = "nemotron_h",
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .mamba2 = true},
    /* Llama 4: dense and MoE layers in turn (one sigmoid-weighted expert of
     * --n-expert-used beside a shared one), chunked attention, NoPE with the
     * temperature on every fourth layer, Q/K L2 norms; llama's RoPE pairs with
     * rope_freqs; a byte-level BPE with the llama4 pre-tokenizer and Llama 4's
     * specials */
    {.arch = "llama4",
     .gguf_arch = "llama4",
     .moe = true,
     .vocab = KG_MKVOCAB_LLAMA4,
     .rms_eps = 1e-5f,
     .norm_rope = true,
     .llama4 = true},
    /* Nemotron 3 (Nano): nemotron_h with experts for its MLPs */
    {.arch = "nemotron_h_moe",
     .gguf_arch = "nemotron_h_moe",
     .moe = true,
     .vocab = KG_MKVOCAB_QWEN,
     .rms_eps = 1e-5f,
     .mamba2 = true},
};

const kg_mkmodel_family_t *kg_mkmodel_find_family(const char *arch) {
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        if (strcmp(families[i].arch, arch ? arch : "llama") == 0) {
            return &families[i];
        }
    }
    return NULL;
}
