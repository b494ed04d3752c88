/* cpu_vecdot_avx2: the AVX2 tiles on unpacked panels (prefill on a CPU
 * without VNNI): register tiles of 1 x 8, 2 x 4 or 4 x 2 outputs, each a
 * block's exact integer sum by maddubs/madd and then the float chain of
 * cpu_vecdot.h, so the bits are the scalar tile's. */
#include "cpu_vecdot_int.h"

#ifdef VECDOT_AVX2
#include "cpu_vecdot_x86.h"

/* The int16 scale vector of a 32-element chunk: lanes 0-7 (elements 0-15)
 * the low half of pr, lanes 8-15 the high half, as madd pairs them. */
QV_INLINE __m256i scale_vec(uint32_t pr) {
    const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32((int)pr), shuf);
}

/* A float per pair q = r * RN + jj from per-column values cols[jj] and
 * per-row values rows[r] (RM * RN = 8). */
QV_INLINE __m256 pair_cols(const int RN, const float *cols) {
    if (RN == 8) {
        return _mm256_loadu_ps(cols);
    }
    if (RN == 4) {
        return _mm256_broadcast_ps((const __m128 *)(const void *)cols);
    }
    return _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)cols));
}

QV_INLINE __m256 pair_rows(const int RM, const float *rows) {
    if (RM == 1) {
        return _mm256_broadcast_ss(rows);
    }
    if (RM == 2) {
        return _mm256_set_m128(_mm_broadcast_ss(rows + 1), _mm_broadcast_ss(rows));
    }
    const __m256i idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(rows)), idx);
}

/* The integer sum of pair q = r * RN + jj over one block. */
QV_INLINE __m256i pair_isum(const int nonneg,
                            const int scaled,
                            const int offs,
                            const int nch,
                            const int8_t *w,
                            const int8_t *aq,
                            const uint32_t *sc,
                            const int16_t *bsums) {
    __m256i p = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int64_t ch = 0; ch < nch; ch++) {
        const __m256i wv = _mm256_load_si256((const __m256i *)(const void *)(w + 32 * ch));
        __m256i t32;
        const __m256i av = _mm256_load_si256((const __m256i *)(const void *)(aq + 32 * ch));
        if (scaled) {
            /* maddubs multiplies unsigned by signed bytes: signed weights move
             * their sign onto the activation */
            const __m256i t16 =
                nonneg ? _mm256_maddubs_epi16(wv, av)
                       : _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            t32 = _mm256_madd_epi16(t16, scale_vec(sc[ch]));
        } else {
            t32 = dot4(0, nonneg, wv, av);
        }
        p = ch == 0 ? t32 : _mm256_add_epi32(p, t32);
    }
    if (offs) {
        /* the panel holds w + offs: take offs * sum over sub-blocks of sc * bsum back */
        const __m256i sc16 = _mm256_load_si256((const __m256i *)(const void *)sc);
        const __m256i bs = _mm256_load_si256((const __m256i *)(const void *)bsums);
        p = _mm256_sub_epi32(p, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), offs == 32 ? 5 : 2));
    }
    return p;
}

QV_INLINE void tile_avx2(const int offs,
                         const int nonneg,
                         const int scaled,
                         const int min_m,
                         const int min_k,
                         const int blk,
                         const int RM,
                         const int RN,
                         const cpu_qpanel_t *p,
                         int col0,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc) {
    const int64_t k = p->k, m = a->m, nb = k / blk;
    const int nch = blk / 32;
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t off = b * blk;
        __m128i half[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i pq[4];
#pragma GCC unroll 4
            for (int q4 = 0; q4 < 4; q4++) {
                const int q = 4 * h + q4, r = q / RN, jj = q % RN;
                const int64_t col = col0 + jj;
                pq[q4] = pair_isum(nonneg, scaled, offs, nch, p->w + col * k + off,
                                   a->qs + (i0 + r) * k + off, p->sc + col * (k / 32) + off / 32,
                                   a->bsums + (i0 + r) * (k / 16) + off / 16);
            }
            half[h] = reduce4(pq[0], pq[1], pq[2], pq[3]);
        }
        const __m256i isum = _mm256_set_m128i(half[1], half[0]);
        const __m256 da = pair_rows(RM, a->d + b * m + i0);
        const __m256 dd = _mm256_mul_ps(pair_cols(RN, p->d + b * NP + col0), da);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        if (min_m) {
            macc = _mm256_fmadd_ps(pair_cols(RN, p->dm + b * NP + col0),
                                   pair_rows(RM, a->s + b * m + i0), macc);
        }
        if (min_k) {
            __m128i mh[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i t[4];
#pragma GCC unroll 4
                for (int q4 = 0; q4 < 4; q4++) {
                    const int q = 4 * h + q4, r = q / RN, jj = q % RN;
                    const int64_t col = col0 + jj;
                    t[q4] = _mm256_madd_epi16(
                        _mm256_load_si256(
                            (const __m256i *)(const void *)(p->mins + col * (k / 16) + b * 16)),
                        _mm256_load_si256((const __m256i *)(const void *)(a->bsums +
                                                                          (i0 + r) * (k / 16) +
                                                                          b * 16)));
                }
                mh[h] = reduce4(t[0], t[1], t[2], t[3]);
            }
            const __m256 dm = _mm256_mul_ps(pair_cols(RN, p->dm + b * NP + col0), da);
            const __m256 neg = _mm256_xor_ps(dm, _mm256_set1_ps(-0.0f));
            macc = _mm256_fmadd_ps(neg, _mm256_cvtepi32_ps(_mm256_set_m128i(mh[1], mh[0])), macc);
        }
    }
    const __m256 res = min_m || min_k ? _mm256_add_ps(acc, macc) : acc;
    float out[8];
    _mm256_storeu_ps(out, res);
    for (int q = 0; q < 8; q++) {
        const int r = q / RN, jj = q % RN;
        if (col0 + jj < nc) {
            c[r * ldc + jj] = out[q];
        }
    }
}

typedef void (*qtile_fn)(const cpu_qpanel_t *p,
                         int col0,
                         const cpu_qact_t *a,
                         int64_t i0,
                         float *c,
                         int64_t ldc,
                         int nc);

#define DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, RM, RN)                             \
    static void NAME##_##RM##x##RN(const cpu_qpanel_t *p, int col0, const cpu_qact_t *a,           \
                                   int64_t i0, float *c, int64_t ldc, int nc) {                    \
        tile_avx2(OFFS, NONNEG, SCALED, MINM, MINK, BLK, RM, RN, p, col0, a, i0, c, ldc, nc);      \
    }
#define DEF_QTILES(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK)                                    \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 1, 8)                                   \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 2, 4)                                   \
    DEF_QTILE(NAME, OFFS, NONNEG, SCALED, MINM, MINK, BLK, 4, 2)                                   \
    static const qtile_fn NAME[3] = {NAME##_1x8, NAME##_2x4, NAME##_4x2};

/* the shapes of dot product (cpu_qtraits), for the AVX2 kernels; with
 * vpdpbusd the interleaved panels' tiles (tile_vnni) take their place */
DEF_QTILES(tiles_sym32, 0, 0, 0, 0, 0, 32) /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 */
DEF_QTILES(tiles_min32, 0, 1, 0, 1, 0, 32) /* Q4_1, Q5_1 */
DEF_QTILES(tiles_mink, 0, 1, 1, 0, 1, 256) /* Q2_K, Q4_K, Q5_K */
DEF_QTILES(tiles_q3k, 4, 1, 1, 0, 0, 256)  /* Q3_K */
DEF_QTILES(tiles_q6k, 32, 1, 1, 0, 0, 256) /* Q6_K */
DEF_QTILES(tiles_symk, 0, 0, 1, 0, 0, 256) /* IQ4_XS */

static const qtile_fn *tiles_for(const cpu_qtraits_t *tr) {
    if (tr->blk == 32) {
        return tr->min_m ? tiles_min32 : tiles_sym32;
    }
    return tr->min_k          ? tiles_mink
           : tr->offset == 4  ? tiles_q3k
           : tr->offset == 32 ? tiles_q6k
                              : tiles_symk;
}

void cpu_vecdot_avx2_rows(const cpu_qtraits_t *tr,
                          const cpu_qpanel_t *p,
                          int nc,
                          const cpu_qact_t *a,
                          int64_t i1,
                          int64_t i2,
                          float *c,
                          int64_t ldc) {
    const qtile_fn *t = tiles_for(tr);
    int64_t i = i1;
    for (; i + 4 <= i2; i += 4) {
        for (int col0 = 0; col0 < NP && col0 < nc; col0 += 2) {
            t[2](p, col0, a, i, c + i * ldc + col0, ldc, nc);
        }
    }
    for (; i + 2 <= i2; i += 2) {
        for (int col0 = 0; col0 < NP && col0 < nc; col0 += 4) {
            t[1](p, col0, a, i, c + i * ldc + col0, ldc, nc);
        }
    }
    for (; i < i2; i++) {
        t[0](p, 0, a, i, c + i * ldc, ldc, nc);
    }
}
#endif
