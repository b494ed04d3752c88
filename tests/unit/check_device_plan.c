/* check_device_plan: what a model's weights take on the CUDA backend's
 * device, from the tensor table alone (kg_device_plan, `kgen-worker
 * --dry-run`): each rule (GGUF blocks kept for the native types, routers
 * and encoder embeddings expanded, norms in F32), and the arithmetic of a
 * Llama-3.1-70B shape in Q4_K_M (the types llama-quantize gives each
 * tensor): its weights within 1.1x of the file's bytes and, with a KV pool
 * of 16 sequences of 4096 tokens, inside an 80 GB GPU, where the BF16
 * expansion of the same file could not load at all. That the plan equals
 * the backend's own count is check_cuda's step_native_blocks (a device or
 * the emulator). */
#include "check_common.h"
#include "engine/kg_device_plan.h"
#include "model/kg_quant.h"
#include "model/kg_quant_mix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tensor of the table: its name kept in `names` (the caller's storage). */
static kg_gguf_tensor_t
tensor(const char *name, int n_dims, int64_t ne0, int64_t ne1, kg_ggml_type_t type) {
    kg_gguf_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.name.data = name;
    t.name.len = strlen(name);
    t.n_dims = (uint32_t)n_dims;
    t.ne[0] = ne0;
    t.ne[1] = n_dims > 1 ? ne1 : 1;
    t.ne[2] = t.ne[3] = 1;
    t.type = type;
    t.size = kg_type_row_size(type, ne0) * (size_t)t.ne[1];
    return t;
}

START_TEST(rules) {
    const kg_gguf_tensor_t q4 = tensor("blk.0.attn_q.weight", 2, 4096, 512, KG_GGML_TYPE_Q4_K);
    bool kept = false;
    /* blocks kept: the file's bytes */
    ck_assert_uint_eq(kg_device_plan_tensor(&q4, KG_PLAN_NATIVE, &kept), q4.size);
    ck_assert(kept);
    /* not allowed (KGEN_CUDA_NATIVE_QUANT=0, cuBLAS): BF16 */
    ck_assert_uint_eq(kg_device_plan_tensor(&q4, 0, &kept), (uint64_t)4096 * 512 * 2);
    ck_assert(!kept);
    /* a router is read element by element: BF16 */
    const kg_gguf_tensor_t router =
        tensor("blk.3.ffn_gate_inp.weight", 2, 4096, 8, KG_GGML_TYPE_Q8_0);
    ck_assert_uint_eq(kg_device_plan_tensor(&router, KG_PLAN_NATIVE, &kept),
                      (uint64_t)4096 * 8 * 2);
    /* experts keep blocks (moe.cu), Gemma 4's fused gate|up too */
    const kg_gguf_tensor_t exps =
        tensor("blk.1.ffn_up_exps.weight", 2, 256, 64, KG_GGML_TYPE_MXFP4);
    ck_assert_uint_eq(kg_device_plan_tensor(&exps, KG_PLAN_NATIVE, &kept), exps.size);
    ck_assert(kept);
    const kg_gguf_tensor_t g4 =
        tensor("blk.1.ffn_gate_up_exps.weight", 2, 256, 128, KG_GGML_TYPE_Q8_0);
    ck_assert_uint_eq(kg_device_plan_tensor(&g4, KG_PLAN_NATIVE, &kept), g4.size);
    ck_assert(kept);
    /* an encoder's embeddings: BF16; a decoder's: blocks */
    const kg_gguf_tensor_t emb = tensor("token_embd.weight", 2, 256, 1000, KG_GGML_TYPE_Q8_0);
    ck_assert_uint_eq(kg_device_plan_tensor(&emb, KG_PLAN_NATIVE | KG_PLAN_ENCODER, &kept),
                      (uint64_t)256 * 1000 * 2);
    ck_assert_uint_eq(kg_device_plan_tensor(&emb, KG_PLAN_NATIVE, &kept), emb.size);
    /* no native kernel (Q3_K), or rows that are not whole blocks: BF16 */
    const kg_gguf_tensor_t q3 = tensor("blk.0.ffn_down.weight", 2, 512, 64, KG_GGML_TYPE_Q3_K);
    ck_assert_uint_eq(kg_device_plan_tensor(&q3, KG_PLAN_NATIVE, &kept), (uint64_t)512 * 64 * 2);
    ck_assert(!kg_device_plan_native(KG_GGML_TYPE_Q4_K, 384));
    ck_assert(kg_device_plan_native(KG_GGML_TYPE_Q4_K, 512));
    ck_assert(kg_device_plan_native(KG_GGML_TYPE_Q8_0, 96));
    ck_assert(!kg_device_plan_native(KG_GGML_TYPE_F16, 512));
    /* F16 stays 2 bytes, F32 4, a norm F32 whatever its type */
    const kg_gguf_tensor_t f16 = tensor("output.weight", 2, 64, 10, KG_GGML_TYPE_F16);
    const kg_gguf_tensor_t f32 = tensor("output.weight", 2, 64, 10, KG_GGML_TYPE_F32);
    const kg_gguf_tensor_t norm = tensor("blk.0.attn_norm.weight", 1, 64, 1, KG_GGML_TYPE_F16);
    ck_assert_uint_eq(kg_device_plan_tensor(&f16, KG_PLAN_NATIVE, &kept), 64 * 10 * 2);
    ck_assert_uint_eq(kg_device_plan_tensor(&f32, KG_PLAN_NATIVE, &kept), 64 * 10 * 4);
    ck_assert_uint_eq(kg_device_plan_tensor(&norm, KG_PLAN_NATIVE, &kept), 64 * 4);
}
END_TEST

/* Llama-3.1-70B: 80 layers of 8192, 64 query and 8 KV heads of 128, FFN
 * 28672, vocabulary 128256, untied head. */
#define L70_LAYERS 80
#define L70_EMBD   8192
#define L70_KV     1024
#define L70_FF     28672
#define L70_VOCAB  128256

START_TEST(llama70b_q4_k_m_fits_an_80gb_gpu) {
    enum { PER_LAYER = 9, N = L70_LAYERS * PER_LAYER + 3 };
    static char names[N][48];
    static kg_gguf_tensor_t t[N];
    const kg_gguf_tensor_t *tp[N];
    const kg_quant_mix_model_t mm = {.arch = "llama",
                                     .n_layer = L70_LAYERS,
                                     .n_head = 64,
                                     .n_head_kv = 8,
                                     .has_output = true,
                                     .n_expert = 0};
    static const struct {
        const char *name;
        int n_dims;
        int64_t ne0, ne1;
    } layer[PER_LAYER] = {
        {"attn_norm.weight", 1, L70_EMBD, 1},          {"attn_q.weight", 2, L70_EMBD, L70_EMBD},
        {"attn_k.weight", 2, L70_EMBD, L70_KV},        {"attn_v.weight", 2, L70_EMBD, L70_KV},
        {"attn_output.weight", 2, L70_EMBD, L70_EMBD}, {"ffn_norm.weight", 1, L70_EMBD, 1},
        {"ffn_gate.weight", 2, L70_EMBD, L70_FF},      {"ffn_up.weight", 2, L70_EMBD, L70_FF},
        {"ffn_down.weight", 2, L70_FF, L70_EMBD},
    };
    int n = 0;
    int64_t q6 = 0;
    for (int il = 0; il < L70_LAYERS; il++) {
        for (int j = 0; j < PER_LAYER; j++, n++) {
            snprintf(names[n], sizeof(names[n]), "blk.%d.%s", il, layer[j].name);
            const kg_ggml_type_t type =
                kg_quant_mix_type(KG_FTYPE_MOSTLY_Q4_K_M, false, &mm, names[n], layer[j].n_dims,
                                  layer[j].ne0, KG_GGML_TYPE_F32);
            t[n] = tensor(names[n], layer[j].n_dims, layer[j].ne0, layer[j].ne1, type);
            q6 += type == KG_GGML_TYPE_Q6_K;
        }
    }
    const struct {
        const char *name;
        int n_dims;
        int64_t ne0, ne1;
    } globals[3] = {{"token_embd.weight", 2, L70_EMBD, L70_VOCAB},
                    {"output_norm.weight", 1, L70_EMBD, 1},
                    {"output.weight", 2, L70_EMBD, L70_VOCAB}};
    for (int j = 0; j < 3; j++, n++) {
        snprintf(names[n], sizeof(names[n]), "%s", globals[j].name);
        const kg_ggml_type_t type =
            kg_quant_mix_type(KG_FTYPE_MOSTLY_Q4_K_M, false, &mm, names[n], globals[j].n_dims,
                              globals[j].ne0, KG_GGML_TYPE_F32);
        t[n] = tensor(names[n], globals[j].n_dims, globals[j].ne0, globals[j].ne1, type);
    }
    ck_assert_int_eq(n, N);
    ck_assert_int_gt(q6, 40); /* the mix's Q6_K attn_v and ffn_down of many layers */
    for (int i = 0; i < N; i++) {
        tp[i] = &t[i];
    }
    kg_device_plan_t p, px;
    kg_device_plan_tensors(tp, N, KG_PLAN_NATIVE, &p);
    kg_device_plan_tensors(tp, N, 0, &px);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    /* llama.cpp's 70B Q4_K_M is 42.5 GB (39.6 GiB) */
    ck_assert_msg(p.n_params > 70000000000LL && p.n_params < 71000000000LL, "%lld weights",
                  (long long)p.n_params);
    ck_assert_msg(p.file_bytes > 38.5 * gib && p.file_bytes < 41.0 * gib, "file %.2f GiB",
                  (double)p.file_bytes / gib);
    ck_assert_msg((double)p.weight_bytes <= 1.1 * (double)p.file_bytes, "%.2f GiB for %.2f GiB",
                  (double)p.weight_bytes / gib, (double)p.file_bytes / gib);
    /* the KV pool: 16 sequences of 4096 tokens, fp16 K and V of 8 heads of
     * 128 in 80 layers (320 KiB a token) */
    const uint64_t kv = (uint64_t)16 * 4096 * L70_LAYERS * 2 * L70_KV * 2;
    const uint64_t h100 = (uint64_t)81559 << 20; /* an H100 80GB's memory (nvidia-smi's MiB) */
    ck_assert_msg(p.weight_bytes + kv + ((uint64_t)4 << 30) < h100,
                  "weights %.2f GiB + kv %.2f GiB + 4 GiB of buffers do not fit %.2f GiB",
                  (double)p.weight_bytes / gib, (double)kv / gib, (double)h100 / gib);
    /* the BF16 expansion (before native blocks) does not even hold the weights */
    ck_assert_msg(px.weight_bytes > h100, "expanded %.2f GiB", (double)px.weight_bytes / gib);
    fprintf(stderr,
            "check_device_plan: llama 70B Q4_K_M: file %.2f GiB, cuda weights %.2f GiB (%.3fx), "
            "+ kv 16 x 4096 tokens %.2f GiB = %.2f GiB of %.2f; expanded %.2f GiB\n",
            (double)p.file_bytes / gib, (double)p.weight_bytes / gib,
            (double)p.weight_bytes / (double)p.file_bytes, (double)kv / gib,
            (double)(p.weight_bytes + kv) / gib, (double)h100 / gib, (double)px.weight_bytes / gib);
}
END_TEST

static Suite *plan_suite(void) {
    Suite *s = suite_create("device_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, rules);
    tcase_add_test(tc, llama70b_q4_k_m_fits_an_80gb_gpu);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(plan_suite)
