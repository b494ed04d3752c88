/* cpu_vecdot_decode: the AVX2 fused decode tiles: 1 activation row (or a
 * few) x 8 weight rows, straight from the file's blocks, with the 4-byte
 * dot products by maddubs/madd or by vpdpbusd (AVX-VNNI's VEX or
 * AVX512-VNNI's EVEX form) where the CPU has it.
 *
 * A decode step meets each weight block once, so unpacking it to a panel
 * first would only add a trip through memory: these kernels unpack in
 * registers. Same integers, same float chain, same bits as the panel
 * tiles (tests compare them). */
#include "cpu_vecdot_int.h"

#ifdef VECDOT_AVX2
#include "cpu_vecdot_x86.h"

/* The fused decode multiplies a signed block-32 format as unsigned weights
 * u = w + off against the signed activations and takes off * sum(a) back in
 * phase 2: the same integer, without the two sign instructions per block
 * (nor Q4_0/Q5_0's subtraction) that signed weights need. Without VNNI the
 * pairs of u * a meet in int16, so only u <= 31 (2 * 31 * 127 fits); with
 * VNNI every offset fits (Q8_0 and IQ4_NL: w + 128 as a byte). 0: the
 * format keeps the sign path (unsigned already: Q4_1, Q5_1). */
QV_INLINE int blk32_offset(const kg_ggml_type_t type, const int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return 8;
    case KG_GGML_TYPE_Q5_0:
        return 16;
    case KG_GGML_TYPE_MXFP4:
        return 12; /* the doubled E2M1 values are -12..12 */
    case KG_GGML_TYPE_Q8_0:
    case KG_GGML_TYPE_IQ4_NL:
        return vnni ? 128 : 0;
    default:
        return 0;
    }
}

/* w + blk32_offset(type) of the block at x, as bytes 0..255. */
QV_INLINE __m256i u_blk32(const kg_ggml_type_t type, const uint8_t *x) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return nib32(x + 2);
    case KG_GGML_TYPE_Q5_0: {
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        return _mm256_or_si256(nib32(x + 6), bits5(qh));
    }
    case KG_GGML_TYPE_MXFP4:
        return _mm256_add_epi8(w_blk32(type, x), _mm256_set1_epi8(12));
    default: /* Q8_0, IQ4_NL: + 128 */
        return _mm256_xor_si256(w_blk32(type, x), _mm256_set1_epi8((char)0x80));
    }
}

/* The 8 lane sums of one block-32 row against activations av: through the
 * offset weights when the format has an offset (phase 2 takes it back). */
QV_INLINE __m256i dot_blk32(const int vnni,
                            const int nonneg,
                            const int off,
                            const kg_ggml_type_t type,
                            const uint8_t *x,
                            __m256i av) {
    return off ? dot4(vnni, 1, u_blk32(type, x), av) : dot4(vnni, nonneg, w_blk32(type, x), av);
}

static inline size_t blk256_size(kg_ggml_type_t type) {
    return type == KG_GGML_TYPE_Q2_K   ? 84
           : type == KG_GGML_TYPE_Q3_K ? 110
           : type == KG_GGML_TYPE_Q4_K ? 144
           : type == KG_GGML_TYPE_Q5_K ? 176
           : type == KG_GGML_TYPE_Q6_K ? 210
                                       : 136;
}

/* The 16 int16 scales of a superblock (one per 16 elements, in order)
 * regrouped for chunk_scale: scales 0, 2, .., 14 in the low lane, 1, 3,
 * .., 15 in the high one. Two shuffles per superblock, where a
 * cross-lane permute per chunk (with its index broadcast) took four. */
QV_INLINE __m256i scales_by_lane(__m256i sc16) {
    const __m256i evens_odds =
        _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                         13, 2, 3, 6, 7, 10, 11, 14, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(sc16, evens_odds), _MM_SHUFFLE(3, 1, 2, 0));
}

/* The madd scale vector of chunk ch (32 elements) from scales_by_lane's
 * vector: int16 lanes 0-7 scale 2 ch, 8-15 scale 2 ch + 1. One in-lane
 * shuffle; its mask is a constant once the chunk loop is unrolled. */
QV_INLINE __m256i chunk_scale(__m256i scl, int ch) {
    return _mm256_shuffle_epi8(scl, _mm256_set1_epi16((short)(2 * ch | (2 * ch + 1) << 8)));
}

/* 16 bytes, each of the low 8 twice: 8 per-32 values -> 16 per-16 values */
QV_INLINE __m128i dup8(__m128i v, int from) {
    const __m128i lo = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i hi = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    return _mm_shuffle_epi8(v, from ? hi : lo);
}

/* K-quants and IQ4_XS: the 8 chunks of 32 weight integers of the
 * superblock at x, their 16 int16 scales (one per 16 elements), the same
 * in scales_by_lane's layout (scl) and, for the types with mins, the 16
 * int16 mins (as cpu_quant_unpack). */
QV_INLINE void kunpack(const kg_ggml_type_t type,
                       const uint8_t *x,
                       __m256i *w,
                       __m256i *sc16,
                       __m256i *scl,
                       __m256i *mins16) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    switch (type) {
    case KG_GGML_TYPE_Q2_K: {
#pragma GCC unroll 8
        for (int64_t h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(x + 16 + 32 * h));
#pragma GCC unroll 8
            for (int64_t s2 = 0; s2 < 4; s2++) {
                w[4 * h + s2] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2);
            }
        }
        const __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)x);
        const __m128i m4x = _mm_set1_epi8(0x0f);
        *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, m4x));
        *mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), m4x));
        *scl = scales_by_lane(*sc16);
        return;
    }
    case KG_GGML_TYPE_Q3_K: {
        const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)x);
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            const __m256i q =
                _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 + 32 * (int64_t)h));
#pragma GCC unroll 8
            for (int s2 = 0; s2 < 4; s2++) {
                const int ch = 4 * h + s2;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), m2);
                const __m256i hb = _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hm, ch), _mm256_set1_epi8(1)), 2);
                w[ch] = _mm256_add_epi8(lo, hb); /* the value + 4 */
            }
        }
        /* 16 6-bit scales: low nibbles in bytes 0-7 (scales 0-7) and their high
         * nibbles (8-15); the top 2 bits in bytes 8-11 at bit 2 (j / 4) */
        uint32_t aux[3];
        memcpy(aux, x + 96, 12);
        const uint32_t k2 = 0x0f0f0f0f, k1 = 0x03030303;
        const __m128i s128 =
            _mm_set_epi32((int)(((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4)),
                          (int)(((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4)),
                          (int)((aux[1] & k2) | (((aux[2] >> 2) & k1) << 4)),
                          (int)((aux[0] & k2) | ((aux[2] & k1) << 4)));
        *sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(s128, _mm_set1_epi8(32)));
        *scl = scales_by_lane(*sc16);
        return;
    }
    case KG_GGML_TYPE_Q4_K:
    case KG_GGML_TYPE_Q5_K: {
        const bool five = type == KG_GGML_TYPE_Q5_K;
        const uint8_t *ql = x + (five ? 48 : 16);
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)(x + 16))
                                : _mm256_setzero_si256();
        const __m256i one = _mm256_set1_epi8(1);
#pragma GCC unroll 8
        for (int64_t g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32 * g));
            w[2 * g] = _mm256_and_si256(q, m4);
            w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                w[2 * g] = _mm256_or_si256(
                    w[2 * g],
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                w[2 * g + 1] = _mm256_or_si256(
                    w[2 * g + 1],
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
        }
        const __m128i sm = k4_scales_mins(x + 4);
        *sc16 = _mm256_cvtepu8_epi16(dup8(sm, 0));
        *mins16 = _mm256_cvtepu8_epi16(dup8(sm, 1));
        /* one scale per 32: each chunk's, in both lanes (scales_by_lane's layout) */
        *scl = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        return;
    }
    case KG_GGML_TYPE_Q6_K:
#pragma GCC unroll 8
        for (int64_t h = 0; h < 2; h++) {
            const uint8_t *ql = x + 64 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            const __m256i qh =
                _mm256_loadu_si256((const __m256i *)(const void *)(x + 128 + 32 * h));
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
#pragma GCC unroll 8
            for (int64_t q4 = 0; q4 < 4; q4++) {
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * q4), m2);
                /* the value + 32 */
                w[4 * h + q4] = _mm256_or_si256(lo[q4], _mm256_slli_epi16(hi, 4));
            }
        }
        *sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x + 192)));
        *scl = scales_by_lane(*sc16);
        return;
    default: { /* IQ4_XS */
        const __m256i iq4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_iq4nl_values));
#pragma GCC unroll 8
        for (int64_t ib = 0; ib < 8; ib++) {
            w[ib] = _mm256_shuffle_epi8(iq4, nib32(x + 8 + 16 * ib));
        }
        /* ls = a nibble of scales_l | 2 bits of scales_h << 4, per 32 */
        uint16_t sh;
        uint32_t sl;
        memcpy(&sh, x + 2, 2);
        memcpy(&sl, x + 4, 4);
        const uint64_t ls =
            _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | (_pdep_u64(sh, 0x0303030303030303ull) << 4);
        const __m128i l8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)ls), _mm_set1_epi8(32));
        *sc16 = _mm256_cvtepi8_epi16(dup8(l8, 0));
        *scl = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(l8)); /* one per 32 */
        return;
    }
    }
}

/* Two phases. 1: each of the 8 weight rows in turn (one sequential stream
 * through the matrix, as the prefetchers like it) is unpacked block by
 * block in registers and met with the activation rows; the 8 lane sums of
 * a group of 8 blocks are reduced there to the blocks' exact sums (one
 * vector, lane j for block 8g + j), which go to a buffer with the block
 * scales as they are stored (fp16). The reduction is arithmetic the memory
 * stream hides; done in phase 2 it took a third of a Q8_0 decode. 2: per
 * activation row and group, the 8 weight rows' vectors are transposed
 * (lane q for weight row q) and the float chain runs across the 8 outputs,
 * block by block in order. */

/* The lane sums of one superblock (unpacked: w, sc16, scl) against 256
 * activations aq with their 16 sums bs, sub-block scales applied. With
 * VNNI the scale's madd and the add are one vpdpwssd, in two chains (even
 * and odd chunks) so that its latency overlaps; the sums are exact, so
 * either way gives the same integers. */
QV_INLINE __m256i kblock_dot(const int vnni,
                             const int nonneg,
                             const int offs,
                             const __m256i *w,
                             __m256i sc16,
                             __m256i scl,
                             const int8_t *aq,
                             const int16_t *bs) {
    __m256i p = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ch = 0; ch < 8; ch++) {
        const __m256i av =
            _mm256_load_si256((const __m256i *)(const void *)(aq + 32 * (int64_t)ch));
        const __m256i t16 = nonneg ? _mm256_maddubs_epi16(w[ch], av)
                                   : _mm256_maddubs_epi16(_mm256_sign_epi8(w[ch], w[ch]),
                                                          _mm256_sign_epi8(av, w[ch]));
        if (!vnni) {
            p = _mm256_add_epi32(p, _mm256_madd_epi16(t16, chunk_scale(scl, ch)));
        } else if (ch % 2 == 0) {
            p = dpwssd(vnni, p, t16, chunk_scale(scl, ch));
        } else {
            p1 = dpwssd(vnni, p1, t16, chunk_scale(scl, ch));
        }
    }
    if (vnni) {
        p = _mm256_add_epi32(p, p1);
    }
    if (offs) {
        const __m256i bsv = _mm256_load_si256((const __m256i *)(const void *)bs);
        p = _mm256_sub_epi32(p,
                             _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), offs == 32 ? 5 : 2));
    }
    return p;
}

typedef struct fused_buf {
    __m256i *p;   /* (m, ng, 8): the sums of group g's 8 blocks, for weight row q */
    __m256i *mp;  /* min_k: (m, ng, 8) the same of mins * bsums */
    uint16_t *d;  /* (nb, 8) fp16 d of each block and weight row (MXFP4: its E8M0 byte) */
    uint16_t *dm; /* (nb, 8) its fp16 m (min_m) or dmin (min_k) */
} fused_buf_t;

/* A block's scales as stored, for phase 2: its fp16 d (MXFP4: the E8M0
 * byte) and, with `second`, the fp16 after it (m or dmin). */
QV_INLINE void fused_scales(const kg_ggml_type_t type,
                            const uint8_t *xb,
                            size_t doff,
                            int second,
                            uint16_t *d,
                            uint16_t *dm) {
    if (type == KG_GGML_TYPE_MXFP4) {
        *d = xb[0];
    } else {
        memcpy(d, xb + doff, 2);
    }
    if (second) {
        memcpy(dm, xb + doff + 2, 2);
    }
}

QV_INLINE void fused_phase1(const int vnni,
                            const kg_ggml_type_t type,
                            const int blk,
                            const uint8_t *x,
                            int q,
                            const cpu_qact_t *a,
                            const fused_buf_t *fb) {
    const int64_t k = a->k, nb = k / blk, m = a->m;
    const int nonneg = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1 ||
                       type == KG_GGML_TYPE_Q2_K || type == KG_GGML_TYPE_Q4_K ||
                       type == KG_GGML_TYPE_Q5_K || type == KG_GGML_TYPE_Q3_K ||
                       type == KG_GGML_TYPE_Q6_K;
    /* Q3_K and Q6_K unpack as value + offs (>= 0; see cpu_qtraits_t.offset) */
    const int offs = type == KG_GGML_TYPE_Q3_K ? 4 : type == KG_GGML_TYPE_Q6_K ? 32 : 0;
    const int off = blk == 32 ? blk32_offset(type, vnni) : 0;
    const int min_m = type == KG_GGML_TYPE_Q4_1 || type == KG_GGML_TYPE_Q5_1;
    const int min_k =
        type == KG_GGML_TYPE_Q2_K || type == KG_GGML_TYPE_Q4_K || type == KG_GGML_TYPE_Q5_K;
    const size_t bs = blk == 32 ? blk32_size(type) : blk256_size(type);
    const size_t doff = type == KG_GGML_TYPE_Q2_K   ? 80
                        : type == KG_GGML_TYPE_Q3_K ? 108
                        : type == KG_GGML_TYPE_Q6_K ? 208
                                                    : 0;
    const int8_t *restrict qs = a->qs;
    const int16_t *restrict bsums = a->bsums;
    __m256i *restrict P = fb->p;
    __m256i *restrict MP = fb->mp;
    uint16_t *restrict D = fb->d;
    uint16_t *restrict DM = fb->dm;
    const int64_t ng = (nb + 7) / 8;
    const __m256i zero = _mm256_setzero_si256();
    if (blk == 32 && m == 1) {
        /* decode of one sequence: the common case, the group in registers */
        for (int64_t g = 0; g < ng; g++) {
            __m256i pv[8];
#pragma GCC unroll 8
            for (int jb = 0; jb < 8; jb++) {
                const int64_t b = g * 8 + jb;
                if (b >= nb) {
                    pv[jb] = zero;
                    continue;
                }
                const uint8_t *xb = x + (size_t)b * bs;
                prefetch_ahead(xb, bs);
                fused_scales(type, xb, doff, min_m, D + b * NP + q, DM + b * NP + q);
                const __m256i av = _mm256_load_si256((const __m256i *)(const void *)(qs + 32 * b));
                pv[jb] = dot_blk32(vnni, nonneg, off, type, xb, av);
            }
            P[g * NP + q] = reduce8_at(pv);
        }
        return;
    }
    if (m == 1) {
        /* decode of one sequence, K-quants: one superblock after another,
         * without the row loop's branches; a group of at most 4 (the last
         * of a row, or a whole row of k <= 1,024) reduced as 4 */
        for (int64_t g = 0; g < ng; g++) {
            __m256i pv[8], pm[8];
            const int nj = nb - g * 8 < 8 ? (int)(nb - g * 8) : 8;
            for (int jb = 0; jb < nj; jb++) {
                const int64_t b = g * 8 + jb;
                const uint8_t *xb = x + (size_t)b * bs;
                prefetch_ahead(xb, bs);
                fused_scales(type, xb, doff, min_k, D + b * NP + q, DM + b * NP + q);
                __m256i w[8], sc16, scl, mins16 = zero;
                kunpack(type, xb, w, &sc16, &scl, &mins16);
                pv[jb] = kblock_dot(vnni, nonneg, offs, w, sc16, scl, qs + 256 * b, bsums + 16 * b);
                pm[jb] =
                    min_k ? _mm256_madd_epi16(
                                mins16,
                                _mm256_load_si256((const __m256i *)(const void *)(bsums + 16 * b)))
                          : zero;
            }
            group_store(pv, pm, nj, min_k, &P[g * NP + q], &MP[g * NP + q]);
        }
        return;
    }
    /* the group's lane sums of every activation row, reduced at its end */
    __m256i S[FUSED_MAX_ROWS][8], SM[FUSED_MAX_ROWS][8];
    for (int64_t g = 0; g < ng; g++) {
        for (int jb = 0; jb < 8; jb++) {
            const int64_t b = g * 8 + jb;
            if (b >= nb) {
                for (int64_t r = 0; r < m; r++) {
                    S[r][jb] = SM[r][jb] = zero;
                }
                continue;
            }
            const uint8_t *xb = x + (size_t)b * bs;
            prefetch_ahead(xb, bs);
            fused_scales(type, xb, doff, min_m || min_k, D + b * NP + q, DM + b * NP + q);
            if (blk == 32) {
                const __m256i w = off ? u_blk32(type, xb) : w_blk32(type, xb);
                for (int64_t r = 0; r < m; r++) {
                    const __m256i av =
                        _mm256_load_si256((const __m256i *)(const void *)(qs + r * k + 32 * b));
                    S[r][jb] = dot4(vnni, off ? 1 : nonneg, w, av);
                }
                continue;
            }
            __m256i w[8], sc16, scl, mins16 = zero;
            kunpack(type, xb, w, &sc16, &scl, &mins16);
            if (m == 1) {
                /* no row loop for the compiler to hoist the scale vectors out of:
                 * they stay in the instruction stream instead of in spills */
                S[0][jb] =
                    kblock_dot(vnni, nonneg, offs, w, sc16, scl, qs + 256 * b, bsums + 16 * b);
                if (min_k) {
                    SM[0][jb] = _mm256_madd_epi16(
                        mins16, _mm256_load_si256((const __m256i *)(const void *)(bsums + 16 * b)));
                }
                continue;
            }
            for (int64_t r = 0; r < m; r++) {
                const int16_t *bsr = bsums + r * (k / 16) + 16 * b;
                S[r][jb] = kblock_dot(vnni, nonneg, offs, w, sc16, scl, qs + r * k + 256 * b, bsr);
                if (min_k) {
                    SM[r][jb] = _mm256_madd_epi16(
                        mins16, _mm256_load_si256((const __m256i *)(const void *)bsr));
                }
            }
        }
        for (int64_t r = 0; r < m; r++) {
            P[(r * ng + g) * NP + q] = reduce8_at(S[r]);
            if (min_k) {
                MP[(r * ng + g) * NP + q] = reduce8_at(SM[r]);
            }
        }
    }
}

QV_INLINE __m256 halves8(const uint16_t *h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
}

/* 8 MXFP4 scales from their E8M0 bytes (one per uint16), each the float
 * kg_mxfp4_scale gives: 2^(e - 128), the subnormals 0x00200000 << e below
 * e = 2, else the exponent field e - 1. */
QV_INLINE __m256 e8m0_halves8(const uint16_t *h) {
    const __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)h));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, is_normal));
}

QV_INLINE void fused_phase2_t(const int e8m0,
                              const int off,
                              const cpu_qtraits_t *tr,
                              const cpu_qact_t *a,
                              const fused_buf_t *fb,
                              float *c,
                              int64_t ldc,
                              int nc) {
    const int64_t k = a->k, m = a->m, nb = k / tr->blk, ng = (nb + 7) / 8;
    for (int64_t r = 0; r < m; r++) {
        __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m256i t[8], tm[8];
#pragma GCC unroll 8
            for (int q = 0; q < NP; q++) {
                t[q] = _mm256_load_si256(fb->p + (r * ng + g) * NP + q);
            }
            transpose8(t); /* t[jb]: block 8g + jb of each weight row */
            if (tr->min_k) {
#pragma GCC unroll 8
                for (int q = 0; q < NP; q++) {
                    tm[q] = _mm256_load_si256(fb->mp + (r * ng + g) * NP + q);
                }
                transpose8(tm);
            }
            const int nj = nb - g * 8 < 8 ? (int)(nb - g * 8) : 8;
            for (int jb = 0; jb < nj; jb++) {
                const int64_t b = g * 8 + jb;
                __m256i isum = t[jb];
                if (off) { /* the offset weights' extra off * sum(a) (blk32_offset) */
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * a->sums[b * m + r]));
                }
                const __m256 da = _mm256_broadcast_ss(a->d + b * m + r);
                const __m256 dw = e8m0 ? e8m0_halves8(fb->d + b * NP) : halves8(fb->d + b * NP);
                const __m256 dd = _mm256_mul_ps(dw, da);
                acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
                if (tr->min_m) {
                    macc = _mm256_fmadd_ps(halves8(fb->dm + b * NP),
                                           _mm256_broadcast_ss(a->s + b * m + r), macc);
                } else if (tr->min_k) {
                    const __m256i msum = tm[jb];
                    const __m256 dm = _mm256_mul_ps(halves8(fb->dm + b * NP), da);
                    macc = _mm256_fmadd_ps(_mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)),
                                           _mm256_cvtepi32_ps(msum), macc);
                }
            }
        }
        const __m256 res = tr->min_m || tr->min_k ? _mm256_add_ps(acc, macc) : acc;
        float out[8];
        _mm256_storeu_ps(out, res);
        for (int q = 0; q < nc; q++) {
            c[r * ldc + q] = out[q];
        }
    }
}

/* Phase 2 with the block scales stored as fp16 (every type but MXFP4) or
 * as E8M0 bytes (MXFP4). */
static void fused_phase2(const cpu_qtraits_t *tr,
                         const int off,
                         const cpu_qact_t *a,
                         const fused_buf_t *fb,
                         float *c,
                         int64_t ldc,
                         int nc) {
    if (tr->type == KG_GGML_TYPE_MXFP4) {
        fused_phase2_t(1, off, tr, a, fb, c, ldc, nc);
    } else {
        fused_phase2_t(0, off, tr, a, fb, c, ldc, nc);
    }
}

typedef void (*fused_fn)(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb);

#define DEF_FUSED(NAME, TYPE, BLK)                                                                 \
    static void NAME(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) {        \
        fused_phase1(0, TYPE, BLK, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_vnni(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(1, TYPE, BLK, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_evex(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(2, TYPE, BLK, x, q, a, fb);                                                   \
    }
DEF_FUSED(fused_q4_0, KG_GGML_TYPE_Q4_0, 32)
DEF_FUSED(fused_q4_1, KG_GGML_TYPE_Q4_1, 32)
DEF_FUSED(fused_q5_0, KG_GGML_TYPE_Q5_0, 32)
DEF_FUSED(fused_q5_1, KG_GGML_TYPE_Q5_1, 32)
DEF_FUSED(fused_q8_0, KG_GGML_TYPE_Q8_0, 32)
DEF_FUSED(fused_iq4_nl, KG_GGML_TYPE_IQ4_NL, 32)
DEF_FUSED(fused_mxfp4, KG_GGML_TYPE_MXFP4, 32)

#define DEF_FUSED_K(NAME, TYPE)                                                                    \
    static void NAME(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) {        \
        fused_phase1(0, TYPE, 256, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_vnni(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(1, TYPE, 256, x, q, a, fb);                                                   \
    }                                                                                              \
    static void NAME##_evex(const uint8_t *x, int q, const cpu_qact_t *a, const fused_buf_t *fb) { \
        fused_phase1(2, TYPE, 256, x, q, a, fb);                                                   \
    }
DEF_FUSED_K(fused_q2_k, KG_GGML_TYPE_Q2_K)
DEF_FUSED_K(fused_q3_k, KG_GGML_TYPE_Q3_K)
DEF_FUSED_K(fused_q4_k, KG_GGML_TYPE_Q4_K)
DEF_FUSED_K(fused_q5_k, KG_GGML_TYPE_Q5_K)
DEF_FUSED_K(fused_q6_k, KG_GGML_TYPE_Q6_K)
DEF_FUSED_K(fused_iq4_xs, KG_GGML_TYPE_IQ4_XS)

static fused_fn fused_for(kg_ggml_type_t type, int vnni) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return vnni == 2 ? fused_q4_0_evex : vnni ? fused_q4_0_vnni : fused_q4_0;
    case KG_GGML_TYPE_Q4_1:
        return vnni == 2 ? fused_q4_1_evex : vnni ? fused_q4_1_vnni : fused_q4_1;
    case KG_GGML_TYPE_Q5_0:
        return vnni == 2 ? fused_q5_0_evex : vnni ? fused_q5_0_vnni : fused_q5_0;
    case KG_GGML_TYPE_Q5_1:
        return vnni == 2 ? fused_q5_1_evex : vnni ? fused_q5_1_vnni : fused_q5_1;
    case KG_GGML_TYPE_Q8_0:
        return vnni == 2 ? fused_q8_0_evex : vnni ? fused_q8_0_vnni : fused_q8_0;
    case KG_GGML_TYPE_IQ4_NL:
        return vnni == 2 ? fused_iq4_nl_evex : vnni ? fused_iq4_nl_vnni : fused_iq4_nl;
    case KG_GGML_TYPE_MXFP4:
        return vnni == 2 ? fused_mxfp4_evex : vnni ? fused_mxfp4_vnni : fused_mxfp4;
    case KG_GGML_TYPE_Q2_K:
        return vnni == 2 ? fused_q2_k_evex : vnni ? fused_q2_k_vnni : fused_q2_k;
    case KG_GGML_TYPE_Q3_K:
        return vnni == 2 ? fused_q3_k_evex : vnni ? fused_q3_k_vnni : fused_q3_k;
    case KG_GGML_TYPE_Q4_K:
        return vnni == 2 ? fused_q4_k_evex : vnni ? fused_q4_k_vnni : fused_q4_k;
    case KG_GGML_TYPE_Q5_K:
        return vnni == 2 ? fused_q5_k_evex : vnni ? fused_q5_k_vnni : fused_q5_k;
    case KG_GGML_TYPE_Q6_K:
        return vnni == 2 ? fused_q6_k_evex : vnni ? fused_q6_k_vnni : fused_q6_k;
    case KG_GGML_TYPE_IQ4_XS:
        return vnni == 2 ? fused_iq4_xs_evex : vnni ? fused_iq4_xs_vnni : fused_iq4_xs;
    default:
        return NULL;
    }
}

void cpu_vecdot_decode(int vnni,
                       const cpu_qmat_t *w,
                       const cpu_qact_t *a,
                       char *mem,
                       int64_t p0,
                       int64_t p1,
                       float *c) {
    const fused_fn f = fused_for(w->tr->type, vnni);
    const int off = w->tr->blk == 32 ? blk32_offset(w->tr->type, vnni) : 0;
    const int64_t nb = w->k / w->tr->blk, ng = (nb + 7) / 8;
    fused_buf_t fb;
    fb.p = (__m256i *)(void *)mem;
    fb.mp = fb.p + a->m * ng * NP;
    fb.d = (uint16_t *)(void *)(fb.mp + (w->tr->min_k ? a->m * ng * NP : 0));
    fb.dm = fb.d + nb * NP;
    /* one sequence, EVEX kernels: the K-quants' phase 1 on zmm registers */
    const bool zmm = vnni == 2 && a->m == 1 && cpu_vecdot_decode512_has(w->tr->type);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t r0 = p * NP;
        const int nc = (int)(w->n - r0 < NP ? w->n - r0 : NP);
        const uint8_t *x = (const uint8_t *)w->data + (size_t)r0 * w->row_size;
        if (zmm) {
            cpu_vecdot_decode512_panel(w->tr->type, x, w->row_size, nc, a, fb.p, fb.mp, fb.d,
                                       fb.dm);
        } else {
            for (int q = 0; q < NP; q++) {
                /* missing rows of the last panel repeat the first: computed, not stored */
                f(x + (size_t)(q < nc ? q : 0) * w->row_size, q, a, &fb);
            }
        }
        fused_phase2(w->tr, off, a, &fb, c + r0, w->n, nc);
    }
}
#endif
