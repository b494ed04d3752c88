/* cmd_mkmodel: `kgen mkmodel`, a random-weight model of any supported
 * family (llama, qwen2, qwen3, gemma2, gemma3, phi3, and the mixtures of
 * experts qwen3moe, mixtral, gpt-oss) and shape.
 *
 * The file is what llama.cpp's converter would write for that family: its
 * <arch>.* hyperparameter keys, a tokenizer, and tensors with llama.cpp's
 * names and ggml shapes (ne[0] is the input dimension); see kg_mkmodel.c.
 * Norm weights and biases stay F32, as llama.cpp keeps 1-D tensors; every
 * 2-D weight takes the chosen type.
 *
 * Weights are deterministic: each tensor draws from its own xoshiro256**
 * stream seeded from (--seed, tensor name), so the same arguments give the
 * same bytes, and changing one tensor's shape leaves the others alone. The
 * scales keep activations sane through many layers: every projection is
 * uniform with variance 1/fan_in (unit-variance outputs for unit-RMS
 * inputs), the two projections that add into the residual stream are
 * further scaled by 1/sqrt(2 n_layer) (GPT-2's init), and norm weights are
 * 1 +- 0.1. The result is a model whose greedy output varies with the
 * prompt, not a constant.
 *
 * The command is thin: the flags are read and checked by
 * kg_mkmodel_parse_args (src/model/kg_mkmodel_args.c, which the tests call
 * too), the model written by kg_mkmodel_write; here are the usage text,
 * the messages' "kgen mkmodel: " prefix and the exit status (0 ok, 1 the
 * write failed, 2 a usage error). */
#include "cmd.h"
#include "model/kg_mklora.h"
#include "model/kg_mkmodel.h"
#include "model/kg_mkmodel_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen mkmodel --out FILE --n-embd N --n-layer L --n-head H --n-head-kv K\n"
            "                    --n-ff F --seed S [options]\n"
            "\n"
            "Write a random-weight model (GGUF v3) of a supported family that llama.cpp and\n"
            "kgen load, with the tensors and keys llama.cpp's converter writes for it.\n"
            "The same arguments always give the same bytes.\n"
            "\n"
            "  --out FILE          the GGUF file to write\n"
            "  --arch A            llama (default), qwen2, qwen3, gemma2, gemma3, phi3, smollm3\n"
            "                      (NoPE every 4th layer), granite (its multipliers), olmo2\n"
            "                      (output norms only; Olmo 3 with --sliding-window), mistral3\n"
            "                      (attention temperature, YaRN betas), seed_oss, apertus\n"
            "                      (xIELU; at most 64 layers), or the\n"
            "                      mixtures of experts qwen3moe, mixtral (llama with experts),\n"
            "                      gpt-oss and glm4moe (GLM-4.5: sigmoid router, shared\n"
            "                      expert, leading dense layers, half-head RoPE), deepseek2\n"
            "                      (DeepSeek V3: multi-head latent attention and GLM's MoE;\n"
            "                      --q-lora-rank 0: V2-Lite's shape; --n-head-kv 1), or the\n"
            "                      encoder bert (embedding and rerank jobs only; K = H;\n"
            "                      a WordPiece vocabulary), or nomic-bert (bert with RoPE,\n"
            "                      a fused QKV and SwiGLU, pooling mean; embedding only;\n"
            "                      nomic-embed-text's --rope-base is 1000)\n"
            "                      gemma4: windowed layers of --head-dim, global ones of\n"
            "                      twice that with half the K/V heads, no V and proportional\n"
            "                      RoPE; --n-embd-per-layer, --n-kv-shared\n"
            "                      gemma-embedding (EmbeddingGemma): gemma3's layers with\n"
            "                      non-causal attention, mean pooling and the dense\n"
            "                      projections n_embd -> 4 n_embd -> n_embd (embed jobs only)\n"
            "                      the hybrids lfm2 (gated short convolutions; lfm2moe:\n"
            "                      with experts after --n-dense-lead dense layers), qwen35\n"
            "                      (gated DeltaNet and gated attention), qwen35moe and\n"
            "                      qwen3next (with experts and a gated shared expert)\n"
            "  --n-embd N          embedding width\n"
            "  --n-layer L         number of blocks\n"
            "  --n-head H          query heads\n"
            "  --n-head-kv K       key/value heads (H must be a multiple of K)\n"
            "  --n-ff F            feed-forward width (the gated FFN's gate and up; mixtral:\n"
            "                      each expert's)\n"
            "  --seed S            weight seed (0 .. 2^64-1)\n"
            "  --head-dim D        head width (default N / H; even, for RoPE)\n"
            "  --rope-base B       RoPE frequency base (default 10000)\n"
            "  --ctx C             <arch>.context_length (default 2048)\n"
            "  --tied              no output.weight: the head reuses token_embd (gemma2: always)\n"
            "  --type T            weight types as llama-quantize's type T writes them (default\n"
            "                      f32; norms, biases and the expert router stay f32): f32,\n"
            "                      f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m,\n"
            "                      q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs\n"
            "                      (q3_k, q4_k, q5_k: the _m mixes), mxfp4_moe (experts MXFP4,\n"
            "                      the rest q8_0: the form gpt-oss ships in). The mixes give\n"
            "                      some tensors more bits (output q6_k, attn_v and ffn_down of\n"
            "                      some layers; 8-expert models attn_k/attn_v q8_0) and fall\n"
            "                      back to 32-blocks where a row is not a multiple of 256,\n"
            "                      exactly as llama-quantize does\n"
            "  --pure              every 2-D weight in T's base type (llama-quantize --pure)\n"
            "  --f16 | --bf16 | --q8_0 | --q4_0 | --mxfp4_moe\n"
            "                      short for --type f16 (bf16, q8_0, q4_0, mxfp4_moe)\n");
    fprintf(
        f,
        "  --n-expert N        qwen3moe, mixtral, gpt-oss, glm4moe, deepseek2: expert_count\n"
        "                      (default 8); gemma4: N experts beside each layer's MLP (26B-A4B);\n"
        "                      granitehybrid: experts of --n-ff beside a shared expert of\n"
        "                      2 --n-ff in every layer (4.0-H Tiny, Small)\n"
        "  --n-expert-used K   experts per token, expert_used_count (default 2)\n"
        "  --n-ff-exp F        qwen3moe, gpt-oss, glm4moe, gemma4: each expert's width\n"
        "                      (default --n-ff)\n"
        "  --n-expert-shared S glm4moe: expert_shared_count, a shared expert S x F wide\n"
        "                      (default 1)\n"
        "  --n-dense-lead D    glm4moe, lfm2moe: leading_dense_block_count (default 1)\n"
        "  --n-nextn N         glm4moe: nextn_predict_layers, N next-token-prediction\n"
        "                      blocks after --n-layer (kgen skips them; default 1)\n"
        "  --n-expert-groups G --n-group-used U\n"
        "                      glm4moe: group-limited top-k over G groups, U used\n"
        "                      (default: not written)\n"
        "                      (deepseek2 takes these four too, not --n-nextn)\n"
        "  --q-lora-rank Q     deepseek2: attention.q_lora_rank (default 3 x the KV rank;\n"
        "                      0: attn_q, softmax router without selection bias: V2-Lite)\n"
        "  --kv-lora-rank R    deepseek2: attention.kv_lora_rank, the cached latent's width\n"
        "                      (default 4 x the nope dims); --head-dim is a query head's\n"
        "                      nope + rope dims, --n-rot its rope dims (default a third)\n"
        "  --v-head-dim V      deepseek2: value_length_mla (default the nope dims)\n"
        "  --vocab-from FILE   copy every tokenizer.* key of FILE (n_vocab: its token count);\n"
        "                      default: the family's built-in vocabulary (llama: 259-token\n"
        "                      SentencePiece bytes; qwen: byte-level BPE, pre qwen2; gemma,\n"
        "                      phi3: SentencePiece pieces; see docs/MODELS.md)\n"
        "  --n-vocab N         built-in vocabulary of N tokens (at least the built-in size):\n"
        "                      made-up words fill the rest (benchmarks at a real model's size)\n"
        "  --chat-template T   tokenizer.chat_template: chatml, llama2, llama3, gemma, phi3,\n"
        "                      phi4, mistral-v7 or qwen2.5 (the family's real Jinja text;\n"
        "                      qwen2.5's has Hermes-style tool calls), qwen3\n"
        "                      or qwen3-thinking (Qwen3-style thinking templates; their\n"
        "                      built-in vocabulary gains <think> and </think>), glm4.6\n"
        "                      (GLM-4.5/4.6's own, for --arch glm4moe), deepseek-v3.1\n"
        "                      (DeepSeek V3.1's own, for --arch deepseek2), gemma4\n"
        "                      (Gemma 4's own, for --arch gemma4), mistral-nemo (Mistral\n"
        "                      Nemo's own, [TOOL_CALLS] calls; with --arch qwen2 its\n"
        "                      vocabulary gains [TOOL_CALLS] as a control token)\n"
        "  --chat-template-file FILE\n"
        "                      tokenizer.chat_template from a file: any model's Jinja\n"
        "                      template (tests/data/chat/jinja/templates/ has llama.cpp's)\n");
    fprintf(f,
            "  --pooling P         <arch>.pooling_type for embedding jobs: none, mean, cls,\n"
            "                      last or rank (default: not written)\n"
            "  --rerank            qwen3: a Qwen3-Reranker head (cls.output.weight with the\n"
            "                      labels yes and no; pooling rank unless --pooling says);\n"
            "                      bert: a classification head (cls, cls.output; one label)\n"
            "  --n-rot R           rope.dimension_count (llama, phi3; phi3 may rotate part of a\n"
            "                      head; default the head width)\n"
            "  --sliding-window W  gemma2, gemma3, gpt-oss, olmo2: the local layers' window\n"
            "                      (default 4096, 512, 128, olmo2 none); phi3 writes the key,\n"
            "                      which llama.cpp ignores\n"
            "  --swa-pattern N     gemma: attention.sliding_window_pattern (every layer il with\n"
            "                      il %% N < N - 1 is local; 0: all; default: not written, so\n"
            "                      llama.cpp's 2 for gemma2, 6 for gemma3)\n"
            "  --rope-base-swa B   gemma: rope.freq_base_swa, the local layers' RoPE base\n"
            "  --rope-scaling S    none, linear, yarn (with --rope-factor; yarn also\n"
            "                      --rope-orig-ctx) or longrope (phi3: LongRoPE factor tensors\n"
            "                      and attn_factor for --ctx over --rope-orig-ctx)\n"
            "  --rope-factor F     rope.scaling.factor\n"
            "  --rope-orig-ctx N   rope.scaling.original_context_length\n"
            "  --attn-softcap C    gemma2: attn_logit_softcapping (default 50)\n"
            "  --final-softcap C   gemma2, gemma3, gemma4: final_logit_softcapping (gemma2 and\n"
            "                      gemma4 default 30)\n"
            "  --n-embd-per-layer P gemma4: per-layer inputs of P per layer (E2B/E4B)\n"
            "  --n-kv-shared N     gemma4: the last N layers read earlier layers' K/V (their\n"
            "                      FFNs twice as wide)\n"
            "  --ssm-state N, --ssm-groups K, --ssm-heads V, --attn-every A\n"
            "                      qwen35, qwen35moe, qwen3next: DeltaNet heads of N (default\n"
            "                      --head-dim), K key heads (default --n-head-kv), V value\n"
            "                      heads (default --n-head); every A-th layer attention\n"
            "                      (default 3)\n"
            "  --name NAME         general.name (default \"kgen-random\")\n"
            "  --lora              write a random LoRA adapter for a base instead (kgen\n"
            "                      mkmodel --lora --help)\n"
            "  --help, --version\n");
}

/* Room for any message: one may quote an argument whole, and the report
 * names the output path. */
static size_t message_room(int argc, char **argv) {
    size_t longest = 0;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]);
        longest = n > longest ? n : longest;
    }
    return 1024 + longest;
}

/* kgen mkmodel --lora: a random adapter for a base (kg_mklora). */
static int mklora(int argc, char **argv) {
    kg_mklora_opts_t o;
    char err[1024];
    switch (kg_mklora_parse_args(argc, argv, &o, err, sizeof(err))) {
    case 0:
        break;
    case 1:
        fputs(kg_mklora_usage(), stdout);
        return 0;
    default:
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        return 2;
    }
    int32_t n_pairs = 0;
    if (kg_mklora_write(&o, &n_pairs, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        return 1;
    }
    printf("kgen mkmodel: wrote %s: lora rank=%lld alpha=%g pairs=%d type=%s\n", o.out,
           (long long)o.rank, (double)o.alpha, n_pairs, kg_ggml_type_name(o.type));
    return 0;
}

int kg_cmd_mkmodel(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--lora") == 0) {
            return mklora(argc, argv);
        }
    }
    kg_mkmodel_opts_t o = kg_mkmodel_opts_default();
    const size_t msg_size = message_room(argc, argv);
    char *msg = malloc(msg_size);
    if (!msg) {
        fprintf(stderr, "kgen mkmodel: out of memory\n");
        return 1;
    }
    int rc = 0;
    switch (kg_mkmodel_parse_args(argc, argv, &o, msg, msg_size)) {
    case KG_MKMODEL_ARGS_OK:
        break;
    case KG_MKMODEL_ARGS_HELP:
        usage(stdout);
        goto out;
    case KG_MKMODEL_ARGS_VERSION:
        kg_cmd_print_version("kgen");
        goto out;
    case KG_MKMODEL_ARGS_INVALID:
        fprintf(stderr, "kgen mkmodel: %s\n", msg);
        rc = 2;
        goto out;
    }

    char err[512];
    int64_t n_vocab = 0;
    if (kg_mkmodel_write(&o, &n_vocab, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen mkmodel: %s\n", err);
        rc = 1;
        goto out;
    }
    kg_mkmodel_summary(&o, n_vocab, msg, msg_size);
    printf("kgen mkmodel: %s\n", msg);
out:
    free(msg);
    return rc;
}
