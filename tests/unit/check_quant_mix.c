/* check_quant_mix: `kgen mkmodel --type T` writes the file llama-quantize
 * writes. The goldens in tests/data/quant-mix (made by
 * scripts/goldens/quant-mix.py with llama.cpp's llama-quantize from the
 * same F32 model) list every tensor of every file type with its type and a
 * hash of its bytes; here kgen writes each file type directly and every
 * tensor must match: the mix policy (kg_quant_mix) picks the same types
 * and the quantizers (kg_quantize) write the same blocks. The policy's
 * rules are also checked one by one on shapes the goldens do not cover. */
#include "check_common.h"
#include "model/kg_gguf.h"
#include "model/kg_quant.h"
#include "model/kg_quant_mix.h"

#include <stdio.h>
#include <string.h>

static char err[512];

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

/* Replay one golden file: group its lines by (ftype, pure), write that file
 * type with kgen mkmodel and compare every tensor. */
static void replay(const char *golden_name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "quant-mix/%s", golden_name);
    size_t len;
    char *text = kg_test_read_file(kg_test_data(rel), &len);
    ck_assert_msg(text != NULL, "cannot read %s", rel);
    /* the mkmodel arguments are quoted in the provenance line */
    const char *a0 = strstr(text, "`kgen mkmodel ");
    ck_assert(a0 != NULL);
    a0 += strlen("`kgen mkmodel ");
    const char *a1 = strchr(a0, '`');
    char args[512];
    snprintf(args, sizeof(args), "%.*s", (int)(a1 - a0), a0);

    char cur_ft[32] = "", path[4096] = "";
    int cur_pure = -1, n_groups = 0, n_tensors = 0, n_in_group = 0;
    kg_gguf_t *g = NULL;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            continue;
        }
        char ft[32], name[128], type[32];
        int pure;
        unsigned long long hash;
        ck_assert_msg(sscanf(line, "%31s %d %127s %31s %llx", ft, &pure, name, type, &hash) == 5,
                      "bad golden line '%s'", line);
        if (strcmp(ft, cur_ft) != 0 || pure != cur_pure) {
            if (g) {
                ck_assert_int_eq(kg_gguf_n_tensors(g), n_in_group);
                kg_gguf_free(g);
            }
            snprintf(cur_ft, sizeof(cur_ft), "%s", ft);
            cur_pure = pure;
            snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("mix"));
            char mk_args[1024];
            snprintf(mk_args, sizeof(mk_args), "%s --type %s%s", args, ft, pure ? " --pure" : "");
            int st = kg_test_mkmodel(path, mk_args);
            ck_assert_msg(st == 0, "kgen mkmodel %s: exit %d", mk_args, st);
            g = kg_gguf_open(path, err, sizeof(err));
            ck_assert_msg(g != NULL, "%s", err);
            uint32_t file_type = 0;
            kg_ftype_t want;
            ck_assert(kg_ftype_from_name(ft, &want));
            ck_assert(kg_gguf_get_u32(g, "general.file_type", &file_type));
            ck_assert_uint_eq(file_type, want);
            n_groups++;
            n_in_group = 0;
        }
        const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, name);
        ck_assert_msg(t != NULL, "%s%s: no tensor %s", ft, pure ? " pure" : "", name);
        ck_assert_msg(strcmp(kg_type_name(t->type), type) == 0, "%s%s %s: type %s, llama %s", ft,
                      pure ? " pure" : "", name, kg_type_name(t->type), type);
        ck_assert_msg(fnv1a64(t->data, t->size) == hash, "%s%s %s (%s): bytes differ", ft,
                      pure ? " pure" : "", name, type);
        n_tensors++;
        n_in_group++;
    }
    if (g) {
        ck_assert_int_eq(kg_gguf_n_tensors(g), n_in_group);
        kg_gguf_free(g);
    }
    ck_assert_int_ge(n_groups, 18);
    ck_assert_int_ge(n_tensors, 18 * 20);
    free(text);
}

START_TEST(llama_quantize_k256) {
    replay("k256.txt");
}
END_TEST

START_TEST(llama_quantize_rows96_tied) {
    replay("r96tied.txt");
}
END_TEST

static kg_ggml_type_t
ty(kg_ftype_t ft, const kg_quant_mix_model_t *m, const char *name, int64_t ne0) {
    return kg_quant_mix_type(ft, false, m, name, 2, ne0, KG_GGML_TYPE_F32);
}

/* Rules the goldens' shapes do not reach. */
START_TEST(policy_rules) {
    kg_quant_mix_model_t m = {
        .arch = "llama", .n_layer = 32, .n_head = 32, .n_head_kv = 8, .has_output = true};
    /* 1-D tensors and norms are never quantized; names not ending in weight neither */
    ck_assert_int_eq(kg_quant_mix_type(KG_FTYPE_MOSTLY_Q4_K_M, false, &m, "blk.0.attn_norm.weight",
                                       1, 4096, KG_GGML_TYPE_F32),
                     KG_GGML_TYPE_F32);
    ck_assert_int_eq(kg_quant_mix_type(KG_FTYPE_MOSTLY_Q4_K_M, false, &m,
                                       "blk.0.attn_q_norm.weight", 2, 128, KG_GGML_TYPE_F32),
                     KG_GGML_TYPE_F32);
    ck_assert_int_eq(kg_quant_mix_type(KG_FTYPE_MOSTLY_Q8_0, false, &m, "blk.0.attn_q.bias", 2,
                                       4096, KG_GGML_TYPE_F32),
                     KG_GGML_TYPE_F32);
    /* GQA 4 (n_gqa >= 4): Q2_K and IQ4_XS give attn_v more bits */
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q2_K, &m, "blk.5.attn_v.weight", 4096), KG_GGML_TYPE_Q4_K);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_IQ4_XS, &m, "blk.5.attn_v.weight", 4096),
                     KG_GGML_TYPE_Q5_K);
    /* Q4_K_M: use_more_bits layers of 32: 0-3, 28-31 and every third from 6 */
    const int more[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    for (int il = 0; il < 32; il++) {
        bool want = false;
        for (size_t k = 0; k < sizeof(more) / sizeof(more[0]); k++) {
            want = want || more[k] == il;
        }
        char name[64];
        snprintf(name, sizeof(name), "blk.%d.ffn_down.weight", il);
        ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &m, name, 14336),
                         want ? KG_GGML_TYPE_Q6_K : KG_GGML_TYPE_Q4_K);
        snprintf(name, sizeof(name), "blk.%d.attn_v.weight", il);
        ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q5_K_M, &m, name, 4096),
                         want ? KG_GGML_TYPE_Q6_K : KG_GGML_TYPE_Q5_K);
    }
    /* Q3_K_M ffn_down: the first n/16 layers Q5_K, the rest Q4_K (not falcon) */
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_M, &m, "blk.1.ffn_down.weight", 14336),
                     KG_GGML_TYPE_Q5_K);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_M, &m, "blk.2.ffn_down.weight", 14336),
                     KG_GGML_TYPE_Q4_K);
    /* fused QKV (phi3) */
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &m, "blk.3.attn_qkv.weight", 3072),
                     KG_GGML_TYPE_Q5_K);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q5_K_M, &m, "blk.3.attn_qkv.weight", 3072),
                     KG_GGML_TYPE_Q6_K);
    /* 70B (llama, 80 layers, GQA): attn_v never below Q5_K */
    kg_quant_mix_model_t big = {
        .arch = "llama", .n_layer = 80, .n_head = 64, .n_head_kv = 8, .has_output = true};
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_S, &big, "blk.40.attn_v.weight", 8192),
                     KG_GGML_TYPE_Q5_K);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_M, &big, "blk.40.attn_v.weight", 8192),
                     KG_GGML_TYPE_Q5_K);
    big.n_head_kv = 64; /* LLaMA-1 65B: not the 70B rule */
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_S, &big, "blk.40.attn_v.weight", 8192),
                     KG_GGML_TYPE_Q3_K);
    big.arch = "qwen2";
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q3_K_S, &big, "blk.40.attn_v.weight", 8192),
                     KG_GGML_TYPE_Q5_K);
    /* rows of 896 (Qwen2.5-0.5B): Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL */
    kg_quant_mix_model_t qw = {
        .arch = "qwen2", .n_layer = 24, .n_head = 14, .n_head_kv = 2, .has_output = false};
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &qw, "blk.4.attn_q.weight", 896),
                     KG_GGML_TYPE_Q5_0);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &qw, "token_embd.weight", 896), KG_GGML_TYPE_Q8_0);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &qw, "blk.0.ffn_down.weight", 4864),
                     KG_GGML_TYPE_Q6_K);
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_IQ4_XS, &qw, "blk.4.ffn_up.weight", 896),
                     KG_GGML_TYPE_IQ4_NL);
    /* rows of 48: no block type fits after the fallback -> F16 */
    ck_assert_int_eq(ty(KG_FTYPE_MOSTLY_Q4_K_M, &qw, "blk.4.attn_q.weight", 48), KG_GGML_TYPE_F16);
    /* pure: the base type everywhere, head included */
    ck_assert_int_eq(kg_quant_mix_type(KG_FTYPE_MOSTLY_Q4_K_M, true, &m, "output.weight", 2, 4096,
                                       KG_GGML_TYPE_F32),
                     KG_GGML_TYPE_Q4_K);
    /* names */
    kg_ftype_t ft;
    ck_assert(kg_ftype_from_name("Q4_K", &ft) && ft == KG_FTYPE_MOSTLY_Q4_K_M);
    ck_assert(kg_ftype_from_name("iq4_xs", &ft) && ft == KG_FTYPE_MOSTLY_IQ4_XS);
    ck_assert(!kg_ftype_from_name("q2_k_s", &ft)); /* needs an importance matrix */
    ck_assert_str_eq(kg_ftype_name(KG_FTYPE_MOSTLY_Q3_K_L), "q3_k_l");
    ck_assert_int_eq(kg_ftype_base_type(KG_FTYPE_MOSTLY_Q5_K_S), KG_GGML_TYPE_Q5_K);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("quant_mix");
    TCase *tc = tcase_create("llama_quantize");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, llama_quantize_k256);
    tcase_add_test(tc, llama_quantize_rows96_tied);
    suite_add_tcase(s, tc);
    tc = tcase_create("policy");
    tcase_add_test(tc, policy_rules);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
