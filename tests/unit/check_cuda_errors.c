/* check_cuda_errors: what the CUDA backend makes of the driver's answers
 * (gpu/cuda_errors.cu) and which cuBLAS it loads (gpu/cublas.cu), with no
 * device needed: the classification and the library choice are functions
 * of plain facts, so every case is run on any machine that builds the CUDA
 * backend. The probe of this machine and the backend selection that
 * follows from it are checked too, whatever the machine has. */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda_errors: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "backend/kg_backend.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <string.h>

/* cudaError_t values (the toolkit's driver_types.h; stable ABI) */
enum {
    E_SUCCESS = 0,
    E_INVALID_VALUE = 1,
    E_MEMORY = 2,
    E_INIT = 3,
    E_CONFIG = 9,
    E_INSUFFICIENT_DRIVER = 35,
    E_UNAVAILABLE = 46,
    E_NO_DEVICE = 100,
    E_ECC = 214,
    E_ILLEGAL_ADDRESS = 700,
    E_OUT_OF_RESOURCES = 701,
    E_LAUNCH_FAILURE = 719,
    E_DRIVER_MISMATCH = 803,
    E_COMPAT = 804,
    E_CAPTURE_INVALIDATED = 901,
    E_UNKNOWN = 999,
};

static kg_cuda_probe_t classify(int err, int n, int drv, int rt) {
    kg_cuda_probe_t p;
    memset(&p, 0, sizeof(p));
    p.error = err;
    p.n_devices = n;
    p.driver_version = drv;
    p.runtime_version = rt;
    kg_cuda_probe_classify(&p);
    return p;
}

static void has(const kg_cuda_probe_t *p, const char *s) {
    ck_assert_msg(strstr(p->message, s) != NULL, "'%s' not in: %s", s, p->message);
}

START_TEST(classify_device_found) {
    kg_cuda_probe_t p = classify(E_SUCCESS, 2, 13000, 13000);
    ck_assert_int_eq(p.kind, KG_CUDA_PROBE_OK);
    has(&p, "2 CUDA device(s)");
    has(&p, "CUDA 13.0");
}
END_TEST

/* cudart says cudaErrorInsufficientDriver both when there is no driver
 * and when it is too old: the driver version tells them apart. */
START_TEST(classify_no_driver_vs_old_driver) {
    kg_cuda_probe_t p = classify(E_INSUFFICIENT_DRIVER, 0, 0, 13000);
    ck_assert_int_eq(p.kind, KG_CUDA_PROBE_NO_DEVICE);
    has(&p, "no NVIDIA driver");
    has(&p, "cudaErrorInsufficientDriver");

    p = classify(E_INSUFFICIENT_DRIVER, 0, 12040, 13000);
    ck_assert_int_eq(p.kind, KG_CUDA_PROBE_UNUSABLE);
    has(&p, "cudaErrorInsufficientDriver");
    has(&p, "CUDA 12.4");
    has(&p, "CUDA 13.0 runtime");
    has(&p, "update the NVIDIA driver");
    ck_assert_str_eq(kg_cuda_probe_kind_str(p.kind), "unusable");
}
END_TEST

START_TEST(classify_driver_without_device) {
    kg_cuda_probe_t p = classify(E_NO_DEVICE, 0, 13000, 13000);
    ck_assert_int_eq(p.kind, KG_CUDA_PROBE_NO_DEVICE);
    has(&p, "sees none");
    has(&p, "CUDA_VISIBLE_DEVICES");
    p = classify(E_SUCCESS, 0, 13000, 13000); /* CUDA_VISIBLE_DEVICES="" */
    ck_assert_int_eq(p.kind, KG_CUDA_PROBE_NO_DEVICE);
}
END_TEST

/* Everything else with a driver present: the device is there but unusable,
 * named by its CUDA error, with what to do. */
START_TEST(classify_unusable) {
    const struct {
        int err;
        const char *name, *hint;
    } cases[] = {
        {E_DRIVER_MISMATCH, "cudaErrorSystemDriverMismatch", "reinstall the driver"},
        {E_COMPAT, "cudaErrorCompatNotSupportedOnDevice", "forward compatibility"},
        {E_UNAVAILABLE, "cudaErrorDevicesUnavailable", "exclusive-process"},
        {E_INIT, "cudaErrorInitializationError", "failed to initialise"},
        {E_UNKNOWN, "cudaErrorUnknown", "nvidia-smi"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_cuda_probe_t p = classify(cases[i].err, 0, 13000, 13000);
        ck_assert_int_eq(p.kind, KG_CUDA_PROBE_UNUSABLE);
        has(&p, cases[i].name);
        has(&p, cases[i].hint);
    }
}
END_TEST

START_TEST(sticky_errors) {
    const int sticky[] = {E_ILLEGAL_ADDRESS, E_LAUNCH_FAILURE, E_ECC, E_UNKNOWN};
    const int not_sticky[] = {E_SUCCESS,   E_INVALID_VALUE,      E_MEMORY,
                              E_CONFIG,    E_OUT_OF_RESOURCES,   E_INSUFFICIENT_DRIVER,
                              E_NO_DEVICE, E_CAPTURE_INVALIDATED};
    for (size_t i = 0; i < sizeof(sticky) / sizeof(sticky[0]); i++) {
        ck_assert_msg(kg_cuda_error_is_sticky(sticky[i]), "%d should be sticky", sticky[i]);
    }
    for (size_t i = 0; i < sizeof(not_sticky) / sizeof(not_sticky[0]); i++) {
        ck_assert_msg(!kg_cuda_error_is_sticky(not_sticky[i]), "%d is not sticky", not_sticky[i]);
    }
}
END_TEST

/* The libcublas of the runtime's major version, never another one first. */
START_TEST(cublas_candidates) {
    char names[4][64];
    int n = kg_cuda_cublas_candidates(13000, NULL, names, 4);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(names[0], "libcublas.so.13");
    ck_assert_str_eq(names[1], "libcublas.so");
    n = kg_cuda_cublas_candidates(12080, "", names, 4);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(names[0], "libcublas.so.12");
    n = kg_cuda_cublas_candidates(13000, "/opt/cuda/lib64/libcublas.so.13", names, 4);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(names[0], "/opt/cuda/lib64/libcublas.so.13");
    ck_assert_int_eq(kg_cuda_cublas_candidates(13000, NULL, names, 1), 1);
}
END_TEST

START_TEST(cublas_probe_missing) {
    char ver[32], err[512] = "";
    ck_assert(!kg_cuda_cublas_probe("/nonexistent/libcublas.so.13", 13000, ver, sizeof(ver), err,
                                    sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/libcublas.so.13"));
}
END_TEST

/* This machine: the probe is consistent, and backend selection follows it
 * (auto falls back to the CPU only with no device; cuda refuses with the
 * probe's reason; a usable device gives the CUDA backend). */
START_TEST(probe_and_selection_here) {
    kg_cuda_probe_t p;
    kg_cuda_probe(&p);
    ck_assert_int_gt(p.runtime_version, 0);
    ck_assert(p.message[0] != '\0');
    kg_cuda_probe_t again = classify(p.error, p.n_devices, p.driver_version, p.runtime_version);
    ck_assert_int_eq(again.kind, p.kind);
    fprintf(stderr, "check_cuda_errors: this machine: %s (%s)\n", p.message,
            kg_cuda_probe_kind_str(p.kind));

    kg_test_model_opts_t o = {
        .n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 2, .n_ff = 32, .seed = 3};
    char err[512] = "";
    kg_model_t *m = kg_model_load(kg_test_make_model(&o), err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    kg_backend_params_t bp = {
        .n_threads = 1, .n_kv_blocks = 8, .kv_block_size = 4, .max_batch_tokens = 8};
    kg_backend_t *be_auto = kg_backend_new("auto", m, &bp, err, sizeof(err));
    kg_backend_t *be_cuda = kg_backend_new("cuda", m, &bp, err, sizeof(err));
    switch (p.kind) {
    case KG_CUDA_PROBE_NO_DEVICE:
        ck_assert_ptr_nonnull(be_auto);
        ck_assert_str_eq(kg_backend_name(be_auto), "cpu");
        ck_assert_ptr_null(be_cuda);
        ck_assert_msg(strstr(err, p.message) != NULL, "'%s' lacks '%s'", err, p.message);
        break;
    case KG_CUDA_PROBE_UNUSABLE:
        ck_assert_ptr_null(be_auto);
        ck_assert_ptr_null(be_cuda);
        ck_assert_msg(strstr(err, p.message) != NULL, "'%s' lacks '%s'", err, p.message);
        break;
    case KG_CUDA_PROBE_OK:
        ck_assert_msg(be_cuda != NULL, "%s", err);
        ck_assert_str_eq(kg_backend_name(be_cuda), "cuda");
        ck_assert_str_eq(kg_backend_name(be_auto), "cuda");
        break;
    }
    kg_backend_free(be_auto);
    kg_backend_free(be_cuda);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda_errors");
    TCase *tc = tcase_create("probe");
    tcase_add_test(tc, classify_device_found);
    tcase_add_test(tc, classify_no_driver_vs_old_driver);
    tcase_add_test(tc, classify_driver_without_device);
    tcase_add_test(tc, classify_unusable);
    tcase_add_test(tc, sticky_errors);
    tcase_add_test(tc, probe_and_selection_here);
    suite_add_tcase(s, tc);
    tc = tcase_create("cublas");
    tcase_add_test(tc, cublas_candidates);
    tcase_add_test(tc, cublas_probe_missing);
    suite_add_tcase(s, tc);
    return s;
}

/* Unforked: the probe initialises the CUDA driver when there is one, and a
 * forked child could not use it. */
int main(void) {
    SRunner *sr = srunner_create(make_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
