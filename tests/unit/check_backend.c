/* check_backend: backend selection's checks that need no device: a model
 * with a weight type a backend cannot run is refused at startup with a
 * message naming the tensor, its type and what the backend runs. */
#include "backend/kg_backend.h"
#include "check_common.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_model.h"
#include "model/kg_quant.h"

#include <string.h>

static char err[512];

START_TEST(refuses_unrunnable_types) {
    kg_test_model_opts_t o = {.n_embd = 64,
                              .n_layer = 1,
                              .n_head = 2,
                              .n_head_kv = 2,
                              .n_ff = 64,
                              .type = "q8_0",
                              .seed = 3};
    kg_model_t *model = kg_model_load(kg_test_make_model(&o), err, sizeof(err));
    ck_assert_msg(model != NULL, "%s", err);
    /* a backend that runs only float types refuses the first Q8_0 tensor */
    const kg_ggml_type_t floats[] = {KG_GGML_TYPE_F32, KG_GGML_TYPE_F16};
    err[0] = '\0';
    ck_assert_int_eq(kg_backend_check_types("cuda", model, floats, 2, err, sizeof(err)),
                     KG_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err, "backend cuda: tensor '") == err, "%s", err);
    ck_assert_msg(strstr(err, ".weight' has type q8_0, which this backend cannot run (it runs: "
                              "f32, f16)") != NULL,
                  "%s", err);
    /* the CUDA backend's list takes every type kgen reads */
    int n;
    const kg_ggml_type_t *cuda = kg_backend_cuda_types(&n);
    ck_assert_int_eq(kg_backend_check_types("cuda", model, cuda, n, err, sizeof(err)), KG_OK);
    kg_model_free(model);
}
END_TEST

START_TEST(cuda_list_matches_the_dequantizers) {
    /* CUDA uploads through kg_dequantize: it runs exactly the types kgen
     * reads; a type added to kg_quant must be added to the list or be
     * refused (and this test changed to say so) */
    int n;
    const kg_ggml_type_t *cuda = kg_backend_cuda_types(&n);
    for (uint32_t id = 0; id < 64; id++) {
        bool listed = false;
        for (int i = 0; i < n; i++) {
            listed = listed || (uint32_t)cuda[i] == id;
        }
        ck_assert_msg(listed == kg_type_is_known(id), "type %u (%s): listed %d, known %d", id,
                      kg_type_name(id) ? kg_type_name(id) : "?", listed, kg_type_is_known(id));
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("types");
    tcase_add_test(tc, refuses_unrunnable_types);
    tcase_add_test(tc, cuda_list_matches_the_dequantizers);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
