/* check_quant: half-precision conversions, block sizes and the block
 * formats. Blocks are packed here from chosen scales and quants following
 * the ggml layout description, and random blocks are dequantized by an
 * element-by-element reference written in this file from ggml's formulas
 * (dequantize_row_* in ggml-quants.c), so the dequantizer is checked
 * against an independent formula, not against itself. The quantizers are
 * checked by round trips and by the facts of ggml's algorithms. */
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
    ck_assert(kg_type_is_known(3));   /* q4_1 */
    ck_assert(kg_type_is_known(13));  /* q5_k */
    ck_assert(!kg_type_is_known(16)); /* iq2_xxs */
    ck_assert(!kg_type_is_known(4));  /* retired by ggml */
    ck_assert(!kg_type_is_known(0xffffffffu));
    ck_assert_int_eq(kg_type_block_size((kg_ggml_type_t)16), 0);
    ck_assert_int_eq(kg_type_block_elems((kg_ggml_type_t)16), 0);
    /* ggml-common.h: sizeof(block_*) */
    static const struct {
        kg_ggml_type_t t;
        int elems, bytes;
        const char *name;
    } all[] = {
        {KG_GGML_TYPE_Q4_1, 32, 20, "q4_1"},     {KG_GGML_TYPE_Q5_0, 32, 22, "q5_0"},
        {KG_GGML_TYPE_Q5_1, 32, 24, "q5_1"},     {KG_GGML_TYPE_Q2_K, 256, 84, "q2_k"},
        {KG_GGML_TYPE_Q3_K, 256, 110, "q3_k"},   {KG_GGML_TYPE_Q5_K, 256, 176, "q5_k"},
        {KG_GGML_TYPE_IQ4_NL, 32, 18, "iq4_nl"}, {KG_GGML_TYPE_IQ4_XS, 256, 136, "iq4_xs"},
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        ck_assert_int_eq(kg_type_block_elems(all[i].t), all[i].elems);
        ck_assert_int_eq(kg_type_block_size(all[i].t), all[i].bytes);
        ck_assert_str_eq(kg_type_name(all[i].t), all[i].name);
        kg_ggml_type_t back;
        ck_assert(kg_type_from_name(all[i].name, &back) && back == all[i].t);
        ck_assert(kg_type_is_quantized(all[i].t));
    }
    kg_ggml_type_t t;
    ck_assert(kg_type_from_name("Q4_K", &t) && t == KG_GGML_TYPE_Q4_K);
    ck_assert(kg_type_from_name("bf16", &t) && t == KG_GGML_TYPE_BF16);
    ck_assert(!kg_type_from_name("iq2_xxs", &t)); /* named by ggml, not read by kgen */
    ck_assert(!kg_type_from_name("q4_k_m", &t));
    ck_assert(!kg_type_from_name("", &t));
    ck_assert(!kg_type_is_quantized(KG_GGML_TYPE_BF16));
    ck_assert_str_eq(kg_type_name(16), "iq2_xxs");
    ck_assert_str_eq(kg_type_name(35), "tq2_0");
    ck_assert(kg_type_name(4) == NULL);
    ck_assert_str_eq(kg_type_name(39), "mxfp4");
    ck_assert(kg_type_name(40) == NULL);
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
    ck_assert(!kg_quantize(KG_GGML_TYPE_Q4_K, xs, qs, 255));
    ck_assert(!kg_quantize(KG_GGML_TYPE_Q6_K, xs, qs, 32));
    ck_assert(!kg_quantize((kg_ggml_type_t)16, xs, qs, 256));
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

// ---- the reference: element k of a row, from ggml's formulas ----

static const int8_t iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

static float half_at(const uint8_t *p) {
    return kg_fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8)));
}

/* low nibble of byte i % 16 for i < 16, high nibble for 16..31 */
static int nib32(const uint8_t *qs, int i) {
    return i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
}

static int bit_of(const uint8_t *p, int i) {
    return (p[i / 8] >> (i % 8)) & 1;
}

/* q4_k / q5_k: 6-bit scale and min of sub-block j from the 12 bytes */
static void ref_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The value of element k of the row at x (ggml block layout, in order). */
static float ref_elem(kg_ggml_type_t t, const uint8_t *x, int64_t k) {
    const int e32 = (int)(k % 32), e256 = (int)(k % 256);
    switch (t) {
    case KG_GGML_TYPE_Q4_0: {
        const uint8_t *b = x + k / 32 * 18;
        return (float)(nib32(b + 2, e32) - 8) * half_at(b);
    }
    case KG_GGML_TYPE_Q4_1: {
        const uint8_t *b = x + k / 32 * 20;
        return (float)nib32(b + 4, e32) * half_at(b) + half_at(b + 2);
    }
    case KG_GGML_TYPE_Q5_0: {
        const uint8_t *b = x + k / 32 * 22;
        return (float)((nib32(b + 6, e32) | (bit_of(b + 2, e32) << 4)) - 16) * half_at(b);
    }
    case KG_GGML_TYPE_Q5_1: {
        const uint8_t *b = x + k / 32 * 24;
        return (float)(nib32(b + 8, e32) | (bit_of(b + 4, e32) << 4)) * half_at(b) + half_at(b + 2);
    }
    case KG_GGML_TYPE_Q8_0: {
        const uint8_t *b = x + k / 32 * 34;
        return (float)(int8_t)b[2 + e32] * half_at(b);
    }
    case KG_GGML_TYPE_IQ4_NL: {
        const uint8_t *b = x + k / 32 * 18;
        return half_at(b) * (float)iq4nl[nib32(b + 2, e32)];
    }
    case KG_GGML_TYPE_Q2_K: {
        /* scales[16] qs[64] d dmin; element 32 s + l of a 128-half: bits 2 s of qs[half*32+l] */
        const uint8_t *b = x + k / 256 * 84;
        const int q = (b[16 + e256 / 128 * 32 + e256 % 32] >> (2 * (e256 % 128 / 32))) & 3;
        const int sc = b[e256 / 16];
        const float dl = half_at(b + 80) * (float)(sc & 15);
        const float ml = half_at(b + 82) * (float)(sc >> 4);
        return dl * (float)q - ml;
    }
    case KG_GGML_TYPE_Q3_K: {
        /* hmask[32] qs[64] scales[12] d */
        const uint8_t *b = x + k / 256 * 110;
        const int j = e256 / 16;
        const int lo = j < 8 ? (b[96 + j] & 15) : (b[96 + j - 8] >> 4);
        const int hi = (b[96 + 8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = half_at(b + 108) * (float)((lo | (hi << 4)) - 32);
        const int q = (b[32 + e256 / 128 * 32 + e256 % 32] >> (2 * (e256 % 128 / 32))) & 3;
        const int h = (b[e256 % 32] >> (e256 / 32)) & 1;
        return dl * (float)(q - (h ? 0 : 4));
    }
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K: {
        const bool five = t == KG_GGML_TYPE_Q5_K;
        const uint8_t *b = x + k / 256 * (five ? 176 : 144);
        int sc, m;
        ref_scale_min(b + 4, e256 / 32, &sc, &m);
        const uint8_t byte = b[(five ? 48 : 16) + e256 / 64 * 32 + e256 % 32];
        int q = e256 % 64 < 32 ? (byte & 15) : (byte >> 4);
        if (five) {
            q += ((b[16 + e256 % 32] >> (e256 / 32)) & 1) ? 16 : 0;
        }
        const float d1 = half_at(b) * (float)sc, m1 = half_at(b + 2) * (float)m;
        return d1 * (float)q - m1;
    }
    case KG_GGML_TYPE_Q6_K: {
        /* ql[128] qh[64] scales[16] d */
        const uint8_t *b = x + k / 256 * 210;
        const int half = e256 / 128, quarter = e256 % 128 / 32, l = e256 % 32;
        const uint8_t lb = b[half * 64 + l + (quarter & 1) * 32];
        const int lo = quarter < 2 ? (lb & 15) : (lb >> 4);
        const int hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
        const float d = half_at(b + 208);
        return d * (float)(int8_t)b[192 + e256 / 16] * (float)((lo | (hi << 4)) - 32);
    }
    case KG_GGML_TYPE_IQ4_XS: {
        /* d scales_h(u16) scales_l[4] qs[128] */
        const uint8_t *b = x + k / 256 * 136;
        const int ib = e256 / 32;
        const int sh = b[2] | (b[3] << 8);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
        const float dl = half_at(b) * (float)(ls - 32);
        return dl * (float)iq4nl[nib32(b + 8 + ib * 16, e32)];
    }
    default:
        return NAN;
    }
}

static const kg_ggml_type_t qtypes[] = {
    KG_GGML_TYPE_Q4_0, KG_GGML_TYPE_Q4_1, KG_GGML_TYPE_Q5_0,   KG_GGML_TYPE_Q5_1,
    KG_GGML_TYPE_Q8_0, KG_GGML_TYPE_Q2_K, KG_GGML_TYPE_Q3_K,   KG_GGML_TYPE_Q4_K,
    KG_GGML_TYPE_Q5_K, KG_GGML_TYPE_Q6_K, KG_GGML_TYPE_IQ4_NL, KG_GGML_TYPE_IQ4_XS,
};
#define N_QTYPES (int)(sizeof(qtypes) / sizeof(qtypes[0]))

/* Offsets of the fp16 fields of a block (d, and dmin / m where present). */
static int half_fields(kg_ggml_type_t t, int *off) {
    switch (t) {
    case KG_GGML_TYPE_Q4_1:
    case KG_GGML_TYPE_Q5_1:
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K:
        off[0] = 0, off[1] = 2;
        return 2;
    case KG_GGML_TYPE_Q2_K:
        off[0] = 80, off[1] = 82;
        return 2;
    case KG_GGML_TYPE_Q3_K:
        off[0] = 108;
        return 1;
    case KG_GGML_TYPE_Q6_K:
        off[0] = 208;
        return 1;
    default:
        off[0] = 0;
        return 1;
    }
}

/* Random blocks: every byte random, then the fp16 fields replaced by random
 * finite halves of either sign (normal, subnormal or zero). */
static void random_blocks(kg_ggml_type_t t, uint8_t *x, int64_t n_blocks) {
    const size_t bs = kg_type_block_size(t);
    for (size_t i = 0; i < bs * (size_t)n_blocks; i++) {
        x[i] = (uint8_t)rng_next();
    }
    int off[2];
    const int nh = half_fields(t, off);
    for (int64_t b = 0; b < n_blocks; b++) {
        for (int f = 0; f < nh; f++) {
            uint16_t h = (uint16_t)rng_next();
            if ((h & 0x7c00) == 0x7c00) {
                h &= 0xbfff; /* inf/NaN exponent -> a normal one */
            }
            if (rng_next() % 16 == 0) {
                h &= 0x83ff; /* subnormal */
            }
            if (rng_next() % 32 == 0) {
                h = 0;
            }
            x[(size_t)b * bs + (size_t)off[f]] = (uint8_t)h;
            x[(size_t)b * bs + (size_t)off[f] + 1] = (uint8_t)(h >> 8);
        }
    }
}

START_TEST(dequantize_equals_reference_bits) {
    enum { N = 8 * 256 };
    static uint8_t x[N / 32 * 34];
    static float got[N];
    rng_state = 4242;
    for (int it = 0; it < 16; it++) {
        for (int ti = 0; ti < N_QTYPES; ti++) {
            const kg_ggml_type_t t = qtypes[ti];
            random_blocks(t, x, N / kg_type_block_elems(t));
            kg_dequantize(t, x, got, N);
            for (int64_t k = 0; k < N; k++) {
                const float want = ref_elem(t, x, k);
                ck_assert_msg(memcmp(&got[k], &want, sizeof(float)) == 0,
                              "%s element %lld: %a, reference %a", kg_type_name(t), (long long)k,
                              (double)got[k], (double)want);
            }
        }
    }
}
END_TEST

/* A row of activation-like data: mostly normal-ish values with a few
 * outliers, scaled per row; some rows constant or zero. */
static void random_row(float *x, int64_t n, int kind) {
    const float scale = ldexpf(1.0f, (int)(rng_next() % 16) - 8);
    for (int64_t i = 0; i < n; i++) {
        float v = rng_uniform(-1, 1) + rng_uniform(-1, 1) + rng_uniform(-1, 1);
        if (rng_next() % 64 == 0) {
            v *= 8.0f;
        }
        x[i] = kind == 1 ? 0.0f : kind == 2 ? 0.75f * scale : v * scale;
    }
    if (kind == 3) { /* all positive: the min-offset formats matter */
        for (int64_t i = 0; i < n; i++) {
            x[i] = fabsf(x[i]) + scale;
        }
    }
}

/* Round-trip error bound, as a fraction of the block's largest magnitude:
 * half a quantization step for the symmetric formats (2 amax / levels), a
 * little more for the searched ones, whose scale trades the largest value's
 * error for a smaller total. */
static float rt_bound(kg_ggml_type_t t) {
    switch (t) {
    case KG_GGML_TYPE_Q8_0:
        return 0.5f / 127 + 0.002f;
    case KG_GGML_TYPE_Q6_K:
        return 0.04f;
    case KG_GGML_TYPE_Q5_0:
    case KG_GGML_TYPE_Q5_1:
    case KG_GGML_TYPE_Q5_K:
        return 0.07f;
    case KG_GGML_TYPE_Q4_0:
    case KG_GGML_TYPE_Q4_1:
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_IQ4_NL:
    case KG_GGML_TYPE_IQ4_XS:
        return 0.15f;
    case KG_GGML_TYPE_Q3_K:
        return 0.3f;
    default: /* q2_k */
        return 0.6f;
    }
}

/* RMS error over RMS of the data, for the whole test. */
/* RMS error over RMS of the data for the whole test: the measured value
 * (q4_0 0.145, q4_1 0.047, q5_0 0.067, q5_1 0.049, q8_0 0.0092, q2_k 0.318,
 * q3_k 0.193, q4_k 0.083, q5_k 0.045, q6_k 0.027, iq4_nl 0.085, iq4_xs
 * 0.080) plus a 15% margin: a weaker scale search would exceed it. The
 * symmetric formats lose on the all-positive rows. */
static float rt_rms(kg_ggml_type_t t) {
    switch (t) {
    case KG_GGML_TYPE_Q4_0:
        return 0.167f;
    case KG_GGML_TYPE_Q4_1:
        return 0.054f;
    case KG_GGML_TYPE_Q5_0:
        return 0.077f;
    case KG_GGML_TYPE_Q5_1:
        return 0.056f;
    case KG_GGML_TYPE_Q8_0:
        return 0.0106f;
    case KG_GGML_TYPE_Q2_K:
        return 0.366f;
    case KG_GGML_TYPE_Q3_K:
        return 0.222f;
    case KG_GGML_TYPE_Q4_K:
        return 0.095f;
    case KG_GGML_TYPE_Q5_K:
        return 0.052f;
    case KG_GGML_TYPE_Q6_K:
        return 0.031f;
    case KG_GGML_TYPE_IQ4_NL:
        return 0.098f;
    default: /* iq4_xs */
        return 0.092f;
    }
}

START_TEST(quantize_round_trip) {
    enum { N = 16 * 256 };
    static float x[N], y[N];
    static uint8_t q[N / 32 * 34];
    rng_state = 777;
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const kg_ggml_type_t t = qtypes[ti];
        double se = 0, sx = 0;
        for (int it = 0; it < 12; it++) {
            const int kind = it % 6 == 1 ? 1 : it % 6 == 2 ? 2 : it % 6 == 3 ? 3 : 0;
            random_row(x, N, kind);
            ck_assert(kg_quantize(t, x, q, N));
            kg_dequantize(t, q, y, N);
            const int64_t blk = kg_type_block_elems(t);
            for (int64_t b = 0; b < N / blk; b++) {
                float amax = 0;
                for (int64_t j = 0; j < blk; j++) {
                    amax = fmaxf(amax, fabsf(x[b * blk + j]));
                }
                for (int64_t j = 0; j < blk; j++) {
                    const float e = fabsf(y[b * blk + j] - x[b * blk + j]);
                    ck_assert_msg(e <= rt_bound(t) * amax, "%s kind %d block %lld: |%g - %g| > %g",
                                  kg_type_name(t), kind, (long long)b, (double)y[b * blk + j],
                                  (double)x[b * blk + j], (double)(rt_bound(t) * amax));
                    se += (double)e * e;
                    sx += (double)x[b * blk + j] * x[b * blk + j];
                }
            }
            if (kind == 1) {
                for (int64_t i = 0; i < N; i++) {
                    ck_assert(y[i] == 0.0f);
                }
            }
        }
        const double rel = sqrt(se / sx);
        ck_assert_msg(rel <= rt_rms(t), "%s: relative rms error %g > %g", kg_type_name(t), rel,
                      (double)rt_rms(t));
    }
}
END_TEST

/* The same floats always give the same bytes, and a block depends only on
 * its own floats (rows are quantized block by block). */
START_TEST(quantize_deterministic_blockwise) {
    enum { N = 4 * 256 };
    static float x[N];
    static uint8_t a[N / 32 * 34], b[N / 32 * 34];
    rng_state = 31;
    random_row(x, N, 0);
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const kg_ggml_type_t t = qtypes[ti];
        const size_t rs = kg_type_row_size(t, N);
        ck_assert(kg_quantize(t, x, a, N));
        ck_assert(kg_quantize(t, x, b, N));
        ck_assert_mem_eq(a, b, rs);
        const int64_t half = N / 2;
        ck_assert(kg_quantize(t, x + half, b, half));
        ck_assert_mem_eq(a + kg_type_row_size(t, half), b, kg_type_row_size(t, half));
    }
}
END_TEST

/* Facts of ggml's quantizers that a round trip alone would not pin down. */
START_TEST(quantize_ggml_facts) {
    float x[256], y[256];
    uint8_t q[256];
    /* q4_1: d = (max - min) / 15, m = min; the extremes are exact */
    for (int j = 0; j < 32; j++) {
        x[j] = 1.0f + (float)j / 31.0f * 3.0f; /* 1 .. 4 */
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q4_1, x, q, 32));
    ck_assert(half_at(q) == kg_fp16_to_fp32(kg_fp32_to_fp16(3.0f / 15)));
    ck_assert(half_at(q + 2) == 1.0f);
    ck_assert_int_eq(q[4] & 15, 0);
    ck_assert_int_eq(q[4 + 15] >> 4, 15);
    /* q5_0: d = max / -16 with max the signed extreme; it maps to 0 */
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j - 10) * 0.5f; /* -5 .. 10.5: max = 10.5 */
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q5_0, x, q, 32));
    ck_assert(half_at(q) == kg_fp16_to_fp32(kg_fp32_to_fp16(10.5f / -16)));
    ck_assert_int_eq(q[6 + 15] >> 4, 0); /* x[31] = 10.5 -> 0 (5th bit clear) */
    ck_assert_int_eq((q[2 + 3] >> 7) & 1, 0);
    /* iq4_nl: a block holding exactly d * grid values comes back exactly */
    for (int j = 0; j < 32; j++) {
        x[j] = 0.5f * (float)iq4nl[j % 16];
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_IQ4_NL, x, q, 32));
    kg_dequantize(KG_GGML_TYPE_IQ4_NL, q, y, 32);
    for (int j = 0; j < 32; j++) {
        ck_assert_msg(y[j] == x[j], "j=%d %g %g", j, (double)y[j], (double)x[j]);
    }
    /* q6_k: the sub-block scale of largest magnitude is stored as -128 */
    rng_state = 5;
    random_row(x, 256, 0);
    ck_assert(kg_quantize(KG_GGML_TYPE_Q6_K, x, q, 256));
    int min_sc = 127;
    for (int j = 0; j < 16; j++) {
        min_sc = (int8_t)q[192 + j] < min_sc ? (int8_t)q[192 + j] : min_sc;
    }
    ck_assert(min_sc == -128 || min_sc == 127); /* -128 unless every scale flipped sign */
    /* q4_k and q5_k: some sub-block uses the full 6-bit scale (63) */
    ck_assert(kg_quantize(KG_GGML_TYPE_Q4_K, x, q, 256));
    int max_sc = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        ref_scale_min(q + 4, j, &sc, &m);
        max_sc = sc > max_sc ? sc : max_sc;
    }
    ck_assert_int_eq(max_sc, 63);
    /* q2_k and q3_k of zeros: all-zero scales, zero output */
    memset(x, 0, sizeof(x));
    ck_assert(kg_quantize(KG_GGML_TYPE_Q2_K, x, q, 256));
    kg_dequantize(KG_GGML_TYPE_Q2_K, q, y, 256);
    for (int j = 0; j < 256; j++) {
        ck_assert(y[j] == 0.0f);
    }
    ck_assert(kg_quantize(KG_GGML_TYPE_Q3_K, x, q, 256));
    ck_assert(half_at(q + 108) == 0.0f);
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
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, q8_0_block);
    tcase_add_test(tc, q8_0_random_round_trip);
    tcase_add_test(tc, q4_0_block);
    tcase_add_test(tc, q4_k_block);
    tcase_add_test(tc, q6_k_block);
    tcase_add_test(tc, dequantize_equals_reference_bits);
    suite_add_tcase(s, tc);
    tc = tcase_create("quantize");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, quantize_round_trip);
    tcase_add_test(tc, quantize_deterministic_blockwise);
    tcase_add_test(tc, quantize_ggml_facts);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
