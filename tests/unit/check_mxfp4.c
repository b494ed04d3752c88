/* check_mxfp4: the MXFP4 block format. The dequantizer is checked against
 * the OCP microscaling formula written independently of ggml's doubled
 * table (an E8M0 power of two times an E2M1 value: sign, 2 exponent bits,
 * 1 mantissa bit), over every scale byte and every code; the quantizer
 * against the rules of ggml's reference (the exponent from the block's
 * largest magnitude, each element the nearest code, the lowest on a tie)
 * and round trips; the type table and the GGUF writer know the type. */
#include "check_common.h"
#include "model/kg_gguf_writer.h"
#include "model/kg_mxfp4.h"
#include "model/kg_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng_state = 7;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* E2M1 (OCP MX spec): code s e1 e0 m: (-1)^s * 2^(e - 1) * (1 + m / 2)
 * for e > 0, (-1)^s * m / 2 for e = 0 (the subnormal 0.5). */
static double e2m1(unsigned code) {
    const unsigned e = (code >> 1) & 3, m = code & 1;
    const double mag = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return (code & 8) ? -mag : mag;
}

/* The spec's element: E2M1(code) * 2^(E8M0 byte - 127). */
static double mx_value(uint8_t e, unsigned code) {
    return e2m1(code) * ldexp(1.0, (int)e - 127);
}

START_TEST(type_table) {
    ck_assert_int_eq(KG_GGML_TYPE_MXFP4, 39);
    ck_assert(kg_type_is_known(39));
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_MXFP4), 32);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_MXFP4), 17);
    ck_assert_int_eq(kg_type_row_size(KG_GGML_TYPE_MXFP4, 2880), 90 * 17);
    ck_assert_str_eq(kg_ggml_type_name(KG_GGML_TYPE_MXFP4), "mxfp4");
}
END_TEST

START_TEST(scale_is_a_power_of_two) {
    for (int e = 0; e < 256; e++) {
        ck_assert_msg(kg_mxfp4_scale((uint8_t)e) == ldexpf(1.0f, e - 128), "e %d", e);
    }
}
END_TEST

/* Every scale byte and every code at every position of the block: the
 * floats equal the spec's values (exact in F32, or infinite where they
 * pass F32's range, from e = 253 up, as in ggml's float product); a
 * negative zero code gives ggml's +0. */
START_TEST(dequantize_matches_the_formula) {
    uint8_t blk[KG_MXFP4_BLOCK_SIZE];
    float y[32];
    for (int e = 0; e < 256; e++) {
        for (int rep = 0; rep < 4; rep++) {
            blk[0] = (uint8_t)e;
            for (int j = 0; j < 16; j++) {
                blk[1 + j] = (uint8_t)(rng_next() & 0xff);
            }
            if (rep == 0) { /* every code in both nibbles once */
                for (int j = 0; j < 16; j++) {
                    blk[1 + j] = (uint8_t)(j | ((15 - j) << 4));
                }
            }
            kg_dequantize(KG_GGML_TYPE_MXFP4, blk, y, 32);
            for (int j = 0; j < 16; j++) {
                const unsigned lo = blk[1 + j] & 15, hi = blk[1 + j] >> 4;
                ck_assert_msg(y[j] == (float)mx_value((uint8_t)e, lo), "e %d j %d code %u", e, j,
                              lo);
                ck_assert_msg(y[j + 16] == (float)mx_value((uint8_t)e, hi), "e %d j %d code %u", e,
                              j + 16, hi);
                ck_assert(lo != 8 || !signbit(y[j]));
            }
        }
    }
}
END_TEST

START_TEST(quantize_follows_the_reference_rules) {
    float x[32 * 64], y[32 * 64];
    uint8_t q[17 * 64];
    for (int i = 0; i < 32 * 64; i++) {
        /* magnitudes over many octaves, some blocks all zero */
        const int b = i / 32;
        const double u = (double)(rng_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        x[i] = b % 9 == 0 ? 0.0f : (float)(u * ldexp(1.0, b % 17 - 8));
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_MXFP4, x, q, 32 * 64));
    ck_assert(!kg_quantize(KG_GGML_TYPE_MXFP4, x, q, 31));
    kg_dequantize(KG_GGML_TYPE_MXFP4, q, y, 32 * 64);
    for (int b = 0; b < 64; b++) {
        const float *xb = x + 32 * b;
        const uint8_t *qb = q + 17 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        const int want_e = amax > 0.0f ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        ck_assert_int_eq(qb[0], want_e);
        const float d = kg_mxfp4_scale(qb[0]);
        for (int j = 0; j < 32; j++) {
            const unsigned code = j < 16 ? qb[1 + j] & 15 : qb[1 + j - 16] >> 4;
            const float err = fabsf((float)kg_mxfp4_values[code] * d - xb[j]);
            for (unsigned c = 0; c < 16; c++) {
                const float other = fabsf((float)kg_mxfp4_values[c] * d - xb[j]);
                /* no code is nearer, and none as near comes before it */
                ck_assert_msg(err < other || (err == other && code <= c),
                              "block %d elem %d: code %u (err %g) but %u has %g", b, j, code,
                              (double)err, c, (double)other);
            }
            ck_assert(y[32 * b + j] == (float)kg_mxfp4_values[code] * d);
        }
    }
}
END_TEST

/* Values already on the grid come back exactly. */
START_TEST(round_trip_on_the_grid) {
    float x[32], y[32];
    uint8_t q[17];
    for (int e = 100; e < 160; e++) {
        const float d = kg_mxfp4_scale((uint8_t)e);
        for (int j = 0; j < 32; j++) {
            x[j] = (float)kg_mxfp4_values[rng_next() % 16] * d;
        }
        x[5] = 12.0f * d; /* the block's largest magnitude sets the scale */
        ck_assert(kg_quantize(KG_GGML_TYPE_MXFP4, x, q, 32));
        ck_assert_int_eq(q[0], e);
        kg_dequantize(KG_GGML_TYPE_MXFP4, q, y, 32);
        for (int j = 0; j < 32; j++) {
            ck_assert_msg(y[j] == x[j], "e %d j %d: %g != %g", e, j, (double)y[j], (double)x[j]);
        }
    }
}
END_TEST

/* A 3-D MXFP4 tensor goes through the GGUF writer and reader intact. */
START_TEST(gguf_tensor) {
    float x[64 * 3 * 2];
    for (int i = 0; i < 64 * 3 * 2; i++) {
        x[i] = (float)((int)(rng_next() % 200) - 100) / 50.0f;
    }
    kg_gguf_writer_t *w = kg_gguf_writer_new();
    int64_t ne[3] = {64, 3, 2};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "e.weight", KG_GGML_TYPE_MXFP4, 3, ne, x), KG_OK);
    int64_t bad[3] = {48, 3, 2};
    ck_assert_int_eq(kg_gguf_writer_add_tensor(w, "b.weight", KG_GGML_TYPE_MXFP4, 3, bad, x),
                     KG_ERR_INVALID);
    char path[4096], err[256];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("mxfp4"));
    ck_assert_int_eq(kg_gguf_writer_write(w, path, err, sizeof(err)), KG_OK);
    kg_gguf_writer_free(w);
    kg_gguf_t *g = kg_gguf_open(path, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    const kg_gguf_tensor_t *t = kg_gguf_find_tensor(g, "e.weight");
    ck_assert(t && t->type == KG_GGML_TYPE_MXFP4 && t->n_dims == 3 && t->size == 12 * 17);
    uint8_t q[12 * 17];
    ck_assert(kg_quantize(KG_GGML_TYPE_MXFP4, x, q, 64 * 6));
    ck_assert_mem_eq(t->data, q, sizeof(q));
    kg_gguf_free(g);
    remove(path);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("mxfp4");
    TCase *tc = tcase_create("format");
    tcase_add_test(tc, type_table);
    tcase_add_test(tc, scale_is_a_power_of_two);
    tcase_add_test(tc, dequantize_matches_the_formula);
    tcase_add_test(tc, quantize_follows_the_reference_rules);
    tcase_add_test(tc, round_trip_on_the_grid);
    tcase_add_test(tc, gguf_tensor);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
