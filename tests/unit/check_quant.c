/* check_quant: half-precision conversions, block sizes and the block
 * formats. Q4_K and Q6_K blocks are packed here from chosen scales and
 * quants following the ggml layout description, so the dequantizer is
 * checked against an independent formula, not against itself. */
#include "check_common.h"
#include "model/kg_quant.h"

#include <math.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

START_TEST(block_sizes) {
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_F32), 1);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_F32), 4);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_F16), 2);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_BF16), 2);
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_Q4_0), 32);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_Q4_0), 18);
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_Q8_0), 32);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_Q8_0), 34);
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_Q4_K), 256);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_Q4_K), 144);
    ck_assert_int_eq(kg_type_block_elems(KG_GGML_TYPE_Q6_K), 256);
    ck_assert_int_eq(kg_type_block_size(KG_GGML_TYPE_Q6_K), 210);
    ck_assert_int_eq(kg_type_row_size(KG_GGML_TYPE_Q8_0, 4096), 128 * 34);
    ck_assert_int_eq(kg_type_row_size(KG_GGML_TYPE_F16, 7), 14);
    ck_assert(kg_type_is_known(0));
    ck_assert(kg_type_is_known(30));
    ck_assert(!kg_type_is_known(3)); /* q4_1 */
    ck_assert(!kg_type_is_known(13));
    ck_assert(!kg_type_is_known(0xffffffffu));
    ck_assert_int_eq(kg_type_block_size((kg_ggml_type_t)13), 0);
}
END_TEST

START_TEST(fp16_known_bits) {
    ck_assert_uint_eq(kg_fp32_to_fp16(1.0f), 0x3c00);
    ck_assert_uint_eq(kg_fp32_to_fp16(-2.0f), 0xc000);
    ck_assert_uint_eq(kg_fp32_to_fp16(0.0f), 0x0000);
    ck_assert_uint_eq(kg_fp32_to_fp16(-0.0f), 0x8000);
    ck_assert_uint_eq(kg_fp32_to_fp16(65504.0f), 0x7bff);
    ck_assert_uint_eq(kg_fp32_to_fp16(65519.0f), 0x7bff); /* below the halfway point */
    ck_assert_uint_eq(kg_fp32_to_fp16(65520.0f), 0x7c00); /* halfway rounds to even: inf */
    ck_assert_uint_eq(kg_fp32_to_fp16(1e10f), 0x7c00);
    ck_assert_uint_eq(kg_fp32_to_fp16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(kg_fp32_to_fp16(0.1f), 0x2e66);
    ck_assert_uint_eq(kg_fp32_to_fp16(1.0f / 3.0f), 0x3555);
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(1.0f, -14)), 0x0400);        /* smallest normal */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(1.0f, -24)), 0x0001);        /* smallest subnormal */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);        /* tie: to even (0) */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(3.0f, -26)), 0x0001);        /* 0.75 ulp: up */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(3.0f, -25)), 0x0002);        /* 1.5 ulp tie: to even */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(5.0f, -25)), 0x0002);        /* 2.5 ulp tie: to even */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(1023.0f, -24)), 0x03ff);     /* largest subnormal */
    ck_assert_uint_eq(kg_fp32_to_fp16(ldexpf(2047.0f, -25)), 0x0400);     /* rounds up to normal */
    ck_assert_uint_eq(kg_fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie: even */
    ck_assert_uint_eq(kg_fp32_to_fp16(1.0f + ldexpf(3.0f, -11)), 0x3c02); /* tie: even */
    ck_assert_uint_eq(kg_fp32_to_fp16(1e-10f), 0x0000);
    uint16_t nan = kg_fp32_to_fp16(NAN);
    ck_assert_uint_eq(nan & 0x7c00, 0x7c00);
    ck_assert_uint_ne(nan & 0x03ff, 0);

    ck_assert(kg_fp16_to_fp32(0x3c00) == 1.0f);
    ck_assert(kg_fp16_to_fp32(0xc000) == -2.0f);
    ck_assert(kg_fp16_to_fp32(0x7bff) == 65504.0f);
    ck_assert(kg_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
    ck_assert(kg_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24));
    ck_assert(kg_fp16_to_fp32(0x8000) == 0.0f && signbit(kg_fp16_to_fp32(0x8000)));
    ck_assert(isinf(kg_fp16_to_fp32(0x7c00)) && kg_fp16_to_fp32(0x7c00) > 0);
    ck_assert(isnan(kg_fp16_to_fp32(0x7e00)));
    ck_assert(isnan(kg_fp16_to_fp32(0xfc01)));
}
END_TEST

START_TEST(fp16_round_trip_all) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kg_fp16_to_fp32((uint16_t)h);
        uint16_t back = kg_fp32_to_fp16(f);
        if (isnan(f)) {
            ck_assert_msg((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0, "NaN 0x%04x", h);
            ck_assert_uint_eq(back & 0x8000, h & 0x8000);
        } else {
            ck_assert_msg(back == h, "0x%04x -> %g -> 0x%04x", h, (double)f, back);
        }
    }
}
END_TEST

/* The nearest half to f by arithmetic in double: ties to even through
 * nearbyint (the default rounding mode), exact because f / ulp is exact. */
static double ref_half(float f) {
    double a = fabs((double)f);
    if (a >= 65520.0) {
        return copysign(INFINITY, f);
    }
    int e = a > 0 ? ilogb(a) : -14;
    if (e < -14) {
        e = -14;
    }
    double ulp = ldexp(1.0, e - 10);
    return copysign(nearbyint(a / ulp) * ulp, f);
}

START_TEST(fp16_matches_reference_rounding) {
    rng_state = 7;
    for (int i = 0; i < 200000; i++) {
        // random bit patterns over the whole float range, plus dense values near halves
        float f = (i & 1) ? float_of((uint32_t)rng_next())
                          : ldexpf(rng_uniform(-2.0f, 2.0f), (int)(rng_next() % 44) - 28);
        if (isnan(f)) {
            continue;
        }
        double want = ref_half(f);
        float got = kg_fp16_to_fp32(kg_fp32_to_fp16(f));
        ck_assert_msg((double)got == want || (want == 0 && got == 0), "%a: got %a want %a",
                      (double)f, (double)got, want);
    }
}
END_TEST

START_TEST(bf16_bits) {
    ck_assert_uint_eq(kg_fp32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(kg_fp32_to_bf16(-2.0f), 0xc000);
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x3f808000)), 0x3f80); /* tie: even */
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x3f818000)), 0x3f82); /* tie: even */
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x3f808001)), 0x3f81);
    ck_assert_uint_eq(kg_fp32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x7f7fffff)), 0x7f80); /* max float: inf */
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x00000001)), 0x0000); /* subnormal: 0 */
    ck_assert_uint_eq(kg_fp32_to_bf16(float_of(0x00018000)), 0x0002); /* subnormal tie */
    uint16_t nan = kg_fp32_to_bf16(float_of(0x7f800001)); /* signalling NaN, low payload */
    ck_assert(isnan(kg_bf16_to_fp32(nan)));
    ck_assert(kg_bf16_to_fp32(0x3f80) == 1.0f);
    ck_assert(kg_bf16_to_fp32(0x4049) == float_of(0x40490000));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kg_bf16_to_fp32((uint16_t)h);
        if (!isnan(f)) {
            ck_assert_uint_eq(kg_fp32_to_bf16(f), h);
        }
    }
}
END_TEST

START_TEST(f16_bf16_f32_arrays) {
    float src[100], back[100];
    uint16_t h[100];
    rng_state = 3;
    for (int i = 0; i < 100; i++) {
        src[i] = rng_uniform(-100.0f, 100.0f);
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_F32, src, back, 100));
    ck_assert_mem_eq(src, back, sizeof(src));
    ck_assert(kg_quantize(KG_GGML_TYPE_F16, src, h, 100));
    kg_dequantize(KG_GGML_TYPE_F16, h, back, 100);
    for (int i = 0; i < 100; i++) {
        ck_assert_uint_eq(h[i], kg_fp32_to_fp16(src[i]));
        ck_assert(fabsf(back[i] - src[i]) <= fabsf(src[i]) * (1.0f / 2048.0f));
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_BF16, src, h, 100));
    kg_dequantize(KG_GGML_TYPE_BF16, h, back, 100);
    for (int i = 0; i < 100; i++) {
        ck_assert(fabsf(back[i] - src[i]) <= fabsf(src[i]) * (1.0f / 256.0f));
    }
}
END_TEST

START_TEST(q8_0_block) {
    // 32 values j - 16: amax 16, d = 16/127, q = round(x * 127/16)
    float x[64], y[64];
    uint8_t blk[2 * 34];
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j - 16);
        x[32 + j] = 0.0f; /* an all-zero block gives d = 0 and zeros back */
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q8_0, x, blk, 64));
    uint16_t d16;
    memcpy(&d16, blk, 2);
    ck_assert_uint_eq(d16, kg_fp32_to_fp16(16.0f / 127.0f));
    ck_assert_int_eq((int8_t)blk[2 + 0], -127);
    ck_assert_int_eq((int8_t)blk[2 + 16], 0);
    ck_assert_int_eq((int8_t)blk[2 + 31], 119); /* round(15 * 127 / 16) = round(119.06) */
    kg_dequantize(KG_GGML_TYPE_Q8_0, blk, y, 64);
    float d = kg_fp16_to_fp32(d16);
    for (int j = 0; j < 32; j++) {
        ck_assert(y[j] == (float)(int8_t)blk[2 + j] * d);
        ck_assert(fabsf(y[j] - x[j]) <= d * 0.5f + 0.02f);
        ck_assert(y[32 + j] == 0.0f);
    }
    ck_assert(!kg_quantize(KG_GGML_TYPE_Q8_0, x, blk, 33));
}
END_TEST

START_TEST(q8_0_random_round_trip) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t q[N / 32 * 34];
    rng_state = 11;
    for (int i = 0; i < N; i++) {
        x[i] = rng_uniform(-3.0f, 3.0f) * (float)(1 + i / 256);
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q8_0, x, q, N));
    kg_dequantize(KG_GGML_TYPE_Q8_0, q, y, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        }
        for (int j = 0; j < 32; j++) {
            // half a quant step, plus the fp16 rounding of d (relative 2^-11, times 127)
            float e = fabsf(y[b * 32 + j] - x[b * 32 + j]);
            ck_assert(e <= amax / 127.0f * 0.5f + amax / 1000.0f);
        }
    }
}
END_TEST

START_TEST(q4_0_block) {
    // ggml q4_0: d = max / -8 where max is the signed value of largest magnitude;
    // q = min(15, (int)(x / d + 8.5)); y = (q - 8) * d. Low nibbles hold
    // elements 0..15, high nibbles 16..31.
    float x[32], y[32];
    uint8_t blk[18];
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j - 16) * 0.25f; /* -4 .. 3.75 */
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q4_0, x, blk, 32));
    uint16_t d16;
    memcpy(&d16, blk, 2);
    ck_assert_uint_eq(d16, kg_fp32_to_fp16(0.5f)); /* max = -4 -> d = 0.5 */
    ck_assert_uint_eq(blk[2] & 0xf, 0);            /* -4 / 0.5 + 8.5 = 0.5 -> 0 */
    ck_assert_uint_eq(blk[2] >> 4, 8);             /* x[16] = 0 -> 8 */
    kg_dequantize(KG_GGML_TYPE_Q4_0, blk, y, 32);
    for (int j = 0; j < 32; j++) {
        int q = (int)(x[j] / 0.5f + 8.5f);
        q = q < 15 ? q : 15;
        ck_assert_msg(y[j] == (float)(q - 8) * 0.5f, "j=%d y=%g", j, (double)y[j]);
        int nib = j < 16 ? (blk[2 + j] & 0xf) : (blk[2 + j - 16] >> 4);
        ck_assert_int_eq(nib, q);
    }
    // random data: error within one step (the positive side clamps at 7 d)
    enum { N = 32 * 32 };
    static float xs[N], ys[N];
    static uint8_t qs[N / 32 * 18];
    rng_state = 5;
    for (int i = 0; i < N; i++) {
        xs[i] = rng_uniform(-1.0f, 1.0f);
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q4_0, xs, qs, N));
    kg_dequantize(KG_GGML_TYPE_Q4_0, qs, ys, N);
    for (int b = 0; b < N / 32; b++) {
        uint16_t dh;
        memcpy(&dh, qs + b * 18, 2);
        float d = fabsf(kg_fp16_to_fp32(dh));
        for (int j = 0; j < 32; j++) {
            ck_assert(fabsf(ys[b * 32 + j] - xs[b * 32 + j]) <= d * 1.01f);
        }
    }
    ck_assert(!kg_quantize(KG_GGML_TYPE_Q4_K, xs, qs, 256));
    ck_assert(!kg_quantize(KG_GGML_TYPE_Q6_K, xs, qs, 256));
}
END_TEST

START_TEST(q4_k_block) {
    // Chosen: 8 sub-blocks of 32 with 6-bit scale sc[s] and min m[s], 4-bit quants q[k].
    // Expected: y[k] = d * sc[k/32] * q[k] - dmin * m[k/32].
    uint8_t sc[8], m[8], q[512];
    uint8_t blk[2 * 144];
    float d[2] = {0.5f, -0.0078125f}, dmin[2] = {0.25f, 1.5f};
    rng_state = 99;
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < 2; b++) {
        uint8_t *x = blk + b * 144;
        uint16_t h = kg_fp32_to_fp16(d[b]);
        memcpy(x, &h, 2);
        h = kg_fp32_to_fp16(dmin[b]);
        memcpy(x + 2, &h, 2);
        uint8_t *scales = x + 4;
        for (int s = 0; s < 8; s++) {
            sc[s] = (uint8_t)(rng_next() & 63);
            m[s] = (uint8_t)(rng_next() & 63);
            // the 12 scale bytes: pairs 0..3 in the low 6 bits of bytes 0..3 (scale) and
            // 4..7 (min); pairs 4..7 split into a low nibble in bytes 8..11 (scale low,
            // min high nibble) and 2 high bits in the top of bytes 0..3 (scale) / 4..7 (min)
            if (s < 4) {
                scales[s] |= sc[s];
                scales[s + 4] |= m[s];
            } else {
                scales[s + 4] = (uint8_t)((sc[s] & 15) | ((m[s] & 15) << 4));
                scales[s - 4] |= (uint8_t)((sc[s] >> 4) << 6);
                scales[s] |= (uint8_t)((m[s] >> 4) << 6);
            }
        }
        uint8_t *qs = x + 16;
        for (int k = 0; k < 256; k++) {
            q[b * 256 + k] = (uint8_t)(rng_next() & 15);
        }
        // 64-element groups: 32 bytes whose low nibbles are elements 0..31, high 32..63
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                qs[g * 32 + l] =
                    (uint8_t)(q[b * 256 + g * 64 + l] | (q[b * 256 + g * 64 + 32 + l] << 4));
            }
        }
        float y[256];
        kg_dequantize(KG_GGML_TYPE_Q4_K, x, y, 256);
        float dd = kg_fp16_to_fp32(kg_fp32_to_fp16(d[b]));
        float dm = kg_fp16_to_fp32(kg_fp32_to_fp16(dmin[b]));
        for (int k = 0; k < 256; k++) {
            float want = dd * (float)sc[k / 32] * (float)q[b * 256 + k] - dm * (float)m[k / 32];
            ck_assert_msg(fabsf(y[k] - want) <= 1e-5f * (1 + fabsf(want)), "b=%d k=%d %g vs %g", b,
                          k, (double)y[k], (double)want);
        }
    }
    // two blocks in one call give the same as one at a time
    float y2[512], y1[256];
    kg_dequantize(KG_GGML_TYPE_Q4_K, blk, y2, 512);
    kg_dequantize(KG_GGML_TYPE_Q4_K, blk + 144, y1, 256);
    ck_assert_mem_eq(y2 + 256, y1, sizeof(y1));
}
END_TEST

START_TEST(q6_k_block) {
    // Chosen: 16 int8 scales (one per 16 elements), 6-bit quants q[k] in 0..63.
    // Expected: y[k] = d * sc[k/16] * (q[k] - 32).
    // Layout per 128-element half: element r = quarter*32 + l (l < 32):
    //   low 4 bits in ql[half*64 + l + (quarter & 1)*32], low nibble for quarters 0,1
    //   and high nibble for 2,3; high 2 bits in qh[half*32 + l] at bit 2*quarter.
    uint8_t blk[210];
    int8_t sc[16];
    uint8_t q[256];
    const float d = 0.03125f;
    rng_state = 1234;
    memset(blk, 0, sizeof(blk));
    for (int s = 0; s < 16; s++) {
        sc[s] = (int8_t)(rng_next() & 0xff);
        blk[192 + s] = (uint8_t)sc[s];
    }
    uint16_t h = kg_fp32_to_fp16(d);
    memcpy(blk + 208, &h, 2);
    for (int k = 0; k < 256; k++) {
        q[k] = (uint8_t)(rng_next() & 63);
        int half = k / 128, r = k % 128, quarter = r / 32, l = r % 32;
        int qli = half * 64 + l + (quarter & 1) * 32;
        blk[qli] |= (uint8_t)((q[k] & 15) << (quarter >= 2 ? 4 : 0));
        blk[128 + half * 32 + l] |= (uint8_t)((q[k] >> 4) << (2 * quarter));
    }
    float y[256];
    kg_dequantize(KG_GGML_TYPE_Q6_K, blk, y, 256);
    for (int k = 0; k < 256; k++) {
        float want = d * (float)sc[k / 16] * (float)(q[k] - 32);
        ck_assert_msg(y[k] == want, "k=%d %g vs %g", k, (double)y[k], (double)want);
    }
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("sizes");
    tcase_add_test(tc, block_sizes);
    suite_add_tcase(s, tc);
    tc = tcase_create("half");
    tcase_add_test(tc, fp16_known_bits);
    tcase_add_test(tc, fp16_round_trip_all);
    tcase_add_test(tc, fp16_matches_reference_rounding);
    tcase_add_test(tc, bf16_bits);
    tcase_add_test(tc, f16_bf16_f32_arrays);
    suite_add_tcase(s, tc);
    tc = tcase_create("blocks");
    tcase_add_test(tc, q8_0_block);
    tcase_add_test(tc, q8_0_random_round_trip);
    tcase_add_test(tc, q4_0_block);
    tcase_add_test(tc, q4_k_block);
    tcase_add_test(tc, q6_k_block);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
