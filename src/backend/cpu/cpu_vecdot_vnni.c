/* cpu_vecdot_vnni: the prefill tiles for CPUs with vpdpbusd, on
 * interleaved panels. AVX-VNNI (VEX) and AVX512-VNNI (EVEX, on ymm
 * registers with AVX512VL) are the same instruction in two encodings, so
 * one template serves both (vnni 1 and 2) and each form runs only where
 * the CPU has it.
 *
 * With vpdpbusd a GEMM needs no horizontal sums: lay 4 consecutive values
 * of the panel's 8 rows side by side (32 bytes), broadcast 4 activation
 * bytes, and one instruction adds 4 products to each of the 8 outputs.
 * The activations go in as a + 128 (unsigned) and the weights as their
 * signed values; the panel's corr takes the 128 back off. Every integer is
 * the same as in the other kernels, so every output is the same bits. */
#include "cpu_vecdot_int.h"

#ifdef VECDOT_AVX2
#include "cpu_vecdot_x86.h"

/* Build wi, sci, mini and corr of an unpacked panel. */
QV_INLINE void interleave_panel_t(const int vnni, const cpu_qtraits_t *tr, cpu_qpanel_t *p) {
    const int64_t k = p->k;
    const __m256i off = _mm256_set1_epi8((char)tr->offset), ones = _mm256_set1_epi8(1);
    for (int64_t c = 0; c < k / 32; c++) {
        __m256i r[8];
        for (int col = 0; col < NP; col++) {
            r[col] = _mm256_load_si256((const __m256i *)(const void *)(p->w + col * k + 32 * c));
            r[col] = _mm256_sub_epi8(r[col], off); /* the signed value */
        }
        transpose8(r);
        for (int g = 0; g < 8; g++) {
            _mm256_store_si256((__m256i *)(void *)(p->wi + (c * 8 + g) * 32), r[g]);
        }
    }
    if (tr->scaled) {
        for (int64_t s16 = 0; s16 < k / 16; s16++) {
            for (int col = 0; col < NP; col++) {
                const uint32_t pr = p->sc[col * (k / 32) + s16 / 2];
                p->sci[s16 * NP + col] = (int16_t)(uint16_t)(s16 % 2 ? pr >> 16 : pr);
            }
        }
    }
    if (tr->min_k) {
        for (int64_t jp = 0; jp < k / 32; jp++) {
            for (int col = 0; col < NP; col++) {
                const int16_t *mn = p->mins + col * (k / 16) + 2 * jp;
                p->mini[jp * NP + col] = (uint32_t)(uint16_t)mn[0] | (uint32_t)(uint16_t)mn[1]
                                                                         << 16;
            }
        }
    }
    /* corr = -128 * sum sc * w per block, from the interleaved values */
    const int blk = tr->blk,
              sub = tr->scaled ? (tr->offset || tr->type == KG_GGML_TYPE_Q2_K ? 16 : 32) : 32;
    for (int64_t b = 0; b < k / blk; b++) {
        __m256i sum = _mm256_setzero_si256();
        for (int64_t s0 = 0; s0 < blk; s0 += sub) {
            __m256i t = _mm256_setzero_si256();
            for (int64_t g = (b * blk + s0) / 4; g < (b * blk + s0 + sub) / 4; g++) {
                t = dpbusd(vnni, t, ones,
                           _mm256_load_si256((const __m256i *)(const void *)(p->wi + g * 32)));
            }
            if (tr->scaled) {
                const __m256i scv = _mm256_load_si256(
                    (const __m256i *)(const void *)(p->sci + ((b * blk + s0) / 16) * NP));
                t = _mm256_mullo_epi32(t, scv);
            }
            sum = _mm256_add_epi32(sum, t);
        }
        _mm256_store_si256((__m256i *)(void *)(p->corr + b * NP),
                           _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    }
}

/* The interleaved panel of 32-block types straight from the file's
 * blocks (one pass: no row-wise panel in between): wi, corr, d and m. */
QV_INLINE void interleave_blk32(const int vnni,
                                const kg_ggml_type_t type,
                                const uint8_t *rows,
                                size_t row_size,
                                int n_rows,
                                cpu_qpanel_t *p) {
    const int64_t k = p->k;
    const size_t bs = blk32_size(type);
    const int min_m = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < k / 32; b++) {
        __m256i r[8];
#pragma GCC unroll 8
        for (int col = 0; col < NP; col++) {
            if (col < n_rows) {
                const uint8_t *x = rows + (size_t)col * row_size + (size_t)b * bs;
                r[col] = w_blk32(type, x);
                uint16_t h;
                memcpy(&h, x, 2);
                p->d[b * NP + col] =
                    type == KG_GGML_TYPE_MXFP4 ? kg_mxfp4_scale(x[0]) : _cvtsh_ss(h);
                if (min_m) {
                    memcpy(&h, x + 2, 2);
                    p->dm[b * NP + col] = _cvtsh_ss(h);
                }
            } else {
                r[col] = _mm256_setzero_si256();
                p->d[b * NP + col] = 0.0f;
                p->dm[b * NP + col] = 0.0f;
            }
        }
        transpose8(r);
        __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            _mm256_store_si256((__m256i *)(void *)(p->wi + (b * 8 + g) * 32), r[g]);
            sum = dpbusd(vnni, sum, ones, r[g]);
        }
        _mm256_store_si256((__m256i *)(void *)(p->corr + b * NP),
                           _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    }
}

static void interleave_panel(const int vnni, const cpu_qtraits_t *tr, cpu_qpanel_t *p) {
    if (vnni == 2) {
        interleave_panel_t(2, tr, p);
    } else {
        interleave_panel_t(1, tr, p);
    }
}

#define DEF_IL32(NAME, TYPE)                                                                       \
    static void NAME(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p) {          \
        interleave_blk32(1, TYPE, rows, row_size, n_rows, p);                                      \
    }                                                                                              \
    static void NAME##_evex(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p) {   \
        interleave_blk32(2, TYPE, rows, row_size, n_rows, p);                                      \
    }
DEF_IL32(il_q4_0, KG_GGML_TYPE_Q4_0)
DEF_IL32(il_q4_1, KG_GGML_TYPE_Q4_1)
DEF_IL32(il_q5_0, KG_GGML_TYPE_Q5_0)
DEF_IL32(il_q5_1, KG_GGML_TYPE_Q5_1)
DEF_IL32(il_q8_0, KG_GGML_TYPE_Q8_0)
DEF_IL32(il_iq4_nl, KG_GGML_TYPE_IQ4_NL)
DEF_IL32(il_mxfp4, KG_GGML_TYPE_MXFP4)

typedef void (*il_fn)(const uint8_t *rows, size_t row_size, int n_rows, cpu_qpanel_t *p);

static il_fn il_for(kg_ggml_type_t type, int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return vnni == 2 ? il_q4_0_evex : il_q4_0;
    case KG_GGML_TYPE_Q4_1:
        return vnni == 2 ? il_q4_1_evex : il_q4_1;
    case KG_GGML_TYPE_Q5_0:
        return vnni == 2 ? il_q5_0_evex : il_q5_0;
    case KG_GGML_TYPE_Q5_1:
        return vnni == 2 ? il_q5_1_evex : il_q5_1;
    case KG_GGML_TYPE_Q8_0:
        return vnni == 2 ? il_q8_0_evex : il_q8_0;
    case KG_GGML_TYPE_IQ4_NL:
        return vnni == 2 ? il_iq4_nl_evex : il_iq4_nl;
    case KG_GGML_TYPE_MXFP4:
        return vnni == 2 ? il_mxfp4_evex : il_mxfp4;
    default:
        return NULL;
    }
}

QV_INLINE __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

QV_INLINE void tile_vnni(const int vnni,
                         const int RM,
                         const int blk,
                         const int scaled,
                         const int sub16,
                         const int min_m,
                         const int min_k,
                         const cpu_qpanel_t *p,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc) {
    const int64_t k = p->k, m = a->m, nb = k / blk;
    __m256 acc[4], macc[4];
    const uint8_t *au[4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        acc[r] = macc[r] = _mm256_setzero_ps();
        au[r] = a->qu + (i0 + r) * k;
    }
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[4];
        const __m256i corr = _mm256_load_si256((const __m256i *)(const void *)(p->corr + b * NP));
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            isum[r] = corr;
        }
        if (!scaled) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const int64_t ga = b * 8 + g;
                const __m256i w =
                    _mm256_load_si256((const __m256i *)(const void *)(p->wi + ga * 32));
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    isum[r] = dpbusd(vnni, isum[r], bcast4(au[r] + 4 * ga), w);
                }
            }
        } else {
            const int sub = sub16 ? 16 : 32, nsub = 256 / sub, gps = sub / 4;
#pragma GCC unroll 16
            for (int64_t sb = 0; sb < nsub; sb++) {
                __m256i t[4];
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    t[r] = _mm256_setzero_si256();
                }
#pragma GCC unroll 8
                for (int gg = 0; gg < gps; gg++) {
                    const int64_t ga = b * 64 + sb * gps + gg;
                    const __m256i w =
                        _mm256_load_si256((const __m256i *)(const void *)(p->wi + ga * 32));
#pragma GCC unroll 4
                    for (int r = 0; r < RM; r++) {
                        t[r] = dpbusd(vnni, t[r], bcast4(au[r] + 4 * ga), w);
                    }
                }
                const __m256i scv = _mm256_load_si256(
                    (const __m256i *)(const void *)(p->sci + (b * 16 + sb * (sub / 16)) * NP));
#pragma GCC unroll 4
                for (int r = 0; r < RM; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(t[r], scv));
                }
            }
        }
        const __m256 dw = _mm256_load_ps(p->d + b * NP);
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const __m256 da = _mm256_broadcast_ss(a->d + b * m + i0 + r);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            if (min_m) {
                macc[r] = _mm256_fmadd_ps(_mm256_load_ps(p->dm + b * NP),
                                          _mm256_broadcast_ss(a->s + b * m + i0 + r), macc[r]);
            }
            if (min_k) {
                __m256i msum = _mm256_setzero_si256();
                const int16_t *bs = a->bsums + (i0 + r) * (k / 16) + 16 * b;
#pragma GCC unroll 8
                for (int64_t jp = 0; jp < 8; jp++) {
                    const __m256i mn = _mm256_load_si256(
                        (const __m256i *)(const void *)(p->mini + (b * 8 + jp) * NP));
                    msum = _mm256_add_epi32(
                        msum, _mm256_madd_epi16(mn, bcast4((const uint8_t *)(bs + 2 * jp))));
                }
                const __m256 dm = _mm256_mul_ps(_mm256_load_ps(p->dm + b * NP), da);
                macc[r] = _mm256_fmadd_ps(_mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)),
                                          _mm256_cvtepi32_ps(msum), macc[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        const __m256 res = min_m || min_k ? _mm256_add_ps(acc[r], macc[r]) : acc[r];
        float out[8];
        _mm256_storeu_ps(out, res);
        for (int q = 0; q < nc; q++) {
            c[r * ldc + q] = out[q];
        }
    }
}

typedef void (*vtile_fn)(
    const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0, float *c, int64_t ldc, int nc);

#define DEF_VTILE(NAME, RM, BLK, SCALED, SUB16, MINM, MINK)                                        \
    static void NAME##_##RM(const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0, float *c,      \
                            int64_t ldc, int nc) {                                                 \
        tile_vnni(1, RM, BLK, SCALED, SUB16, MINM, MINK, p, a, i0, c, ldc, nc);                    \
    }                                                                                              \
    static void NAME##_##RM##_evex(const cpu_qpanel_t *p, const cpu_qact_t *a, int64_t i0,         \
                                   float *c, int64_t ldc, int nc) {                                \
        tile_vnni(2, RM, BLK, SCALED, SUB16, MINM, MINK, p, a, i0, c, ldc, nc);                    \
    }
/* NAME[vnni - 1]: the 1-, 2- and 4-row tiles with vpdpbusd's VEX or EVEX form */
#define DEF_VTILES(NAME, BLK, SCALED, SUB16, MINM, MINK)                                           \
    DEF_VTILE(NAME, 1, BLK, SCALED, SUB16, MINM, MINK)                                             \
    DEF_VTILE(NAME, 2, BLK, SCALED, SUB16, MINM, MINK)                                             \
    DEF_VTILE(NAME, 4, BLK, SCALED, SUB16, MINM, MINK)                                             \
    static const vtile_fn NAME[2][3] = {{NAME##_1, NAME##_2, NAME##_4},                            \
                                        {NAME##_1_evex, NAME##_2_evex, NAME##_4_evex}};

DEF_VTILES(vtiles_32, 32, 0, 0, 0, 0)    /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 */
DEF_VTILES(vtiles_32m, 32, 0, 0, 1, 0)   /* Q4_1, Q5_1 */
DEF_VTILES(vtiles_k32, 256, 1, 0, 0, 0)  /* IQ4_XS */
DEF_VTILES(vtiles_k32m, 256, 1, 0, 0, 1) /* Q4_K, Q5_K */
DEF_VTILES(vtiles_k16, 256, 1, 1, 0, 0)  /* Q3_K, Q6_K */
DEF_VTILES(vtiles_k16m, 256, 1, 1, 0, 1) /* Q2_K */

static const vtile_fn *vtiles_for(const cpu_qtraits_t *tr, int vnni) {
    if (tr->blk == 32) {
        return tr->min_m ? vtiles_32m[vnni - 1] : vtiles_32[vnni - 1];
    }
    const bool sub16 = tr->offset != 0 || tr->type == KG_GGML_TYPE_Q2_K;
    if (sub16) {
        return tr->min_k ? vtiles_k16m[vnni - 1] : vtiles_k16[vnni - 1];
    }
    return tr->min_k ? vtiles_k32m[vnni - 1] : vtiles_k32[vnni - 1];
}
void cpu_vecdot_vnni_panel(int vnni,
                           const cpu_qtraits_t *tr,
                           const uint8_t *src,
                           size_t row_size,
                           int n_rows,
                           cpu_qpanel_t *p) {
    if (tr->blk == 32) {
        il_for(tr->type, vnni)(src, row_size, n_rows, p);
        return;
    }
    cpu_quant_unpack(tr, src, row_size, n_rows, p);
    interleave_panel(vnni, tr, p);
}

void cpu_vecdot_vnni_rows(int vnni,
                          const cpu_qtraits_t *tr,
                          const cpu_qpanel_t *p,
                          int nc,
                          const cpu_qact_t *a,
                          int64_t i1,
                          int64_t i2,
                          float *c,
                          int64_t ldc) {
    const vtile_fn *t = vtiles_for(tr, vnni);
    int64_t i = i1;
    for (; i + 4 <= i2; i += 4) {
        t[2](p, a, i, c + i * ldc, ldc, nc);
    }
    for (; i + 2 <= i2; i += 2) {
        t[1](p, a, i, c + i * ldc, ldc, nc);
    }
    for (; i < i2; i++) {
        t[0](p, a, i, c + i * ldc, ldc, nc);
    }
}
#endif
