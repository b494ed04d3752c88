/* cpu_vecdot_x86: the AVX2 helpers more than one kernel family uses: the
 * 4-byte dot products (maddubs/madd, or vpdpbusd), horizontal sums, the
 * 8 x 8 transpose, and the 32 weight integers of a block-32 format. All
 * inlined into their callers, so every family computes the same integers
 * with the same instructions. Include only under VECDOT_AVX2. */
#pragma once

#include "../../model/kg_mxfp4.h"
#include "../../model/kg_quant.h"
#include "cpu_vecdot_int.h"

#include <immintrin.h>
#include <string.h>

#define QV_INLINE static inline __attribute__((always_inline))

/* How far ahead of the block in use the decode tiles prefetch the weights,
 * in bytes. A decode step streams every weight once from memory, and with
 * the hardware prefetchers alone (each restarting at every 4 KiB page of
 * the mapped file) two threads decoding a Q4_K_M Qwen3.5-0.8B shape read
 * 14 GB/s: 3 KiB ahead took it +19% (1, 2, 3, 4 and 8 KiB tried). */
#define DECODE_PREFETCH 3072

/* The n bytes at p + DECODE_PREFETCH into the caches, a line at a time. */
QV_INLINE void prefetch_ahead(const uint8_t *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) {
        _mm_prefetch((const char *)(p + DECODE_PREFETCH + o), _MM_HINT_T0);
    }
}

/* acc + the 4-byte dot products of unsigned u and signed s, per int32
 * lane: vpdpbusd, VEX-encoded (AVX-VNNI, vnni 1) or EVEX-encoded
 * (AVX512-VNNI with AVX512VL, vnni 2). Written as asm so that this file
 * needs neither -mavxvnni nor -mavx512vnni; each form only runs where the
 * CPU has it. The instruction and its result are the same. */
QV_INLINE __m256i dpbusd(const int vnni, __m256i acc, __m256i u, __m256i sb) {
    if (vnni == 2) {
        __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(sb));
    } else {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(sb));
    }
    return acc;
}

/* acc + the products of the int16 pairs of a and b, per int32 lane: the
 * sum _mm256_madd_epi16(a, b) + acc in one instruction (vpdpwssd, which
 * wraps as the add does; VEX or EVEX as dpbusd). */
QV_INLINE __m256i dpwssd(const int vnni, __m256i acc, __m256i a, __m256i b) {
    if (vnni == 2) {
        __asm__("%{evex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    } else {
        __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    }
    return acc;
}

/* The int32 lanes of sum over 4 bytes of w * a (w signed unless nonneg;
 * |w| <= 128, |a| <= 127, so maddubs' int16 pairs never saturate and both
 * paths give the same integers). */
QV_INLINE __m256i dot4(const int vnni, const int nonneg, __m256i w, __m256i a) {
    const __m256i u = nonneg ? w : _mm256_sign_epi8(w, w);
    const __m256i sb = nonneg ? a : _mm256_sign_epi8(a, w);
    if (vnni) {
        return dpbusd(vnni, _mm256_setzero_si256(), u, sb);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, sb), _mm256_set1_epi16(1));
}

/* Sum of each of 4 int32x8 vectors into lanes 0..3 of the result. */
QV_INLINE __m128i reduce4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Lane j: the sum of p[j]'s 8 lanes. */
QV_INLINE __m256i reduce8_at(const __m256i *p) {
    return _mm256_set_m128i(reduce4(p[4], p[5], p[6], p[7]), reduce4(p[0], p[1], p[2], p[3]));
}

/* The decode tiles' group store: the nj (<= 8) block sums pv of a group
 * (and, with mins, the mins' sums pm) reduced to one vector each, lane j
 * for block j, into *p (*mp); a group of at most 4 (a row's last, or a
 * whole row of k <= 1,024 for the K-quants) reduced as 4. pv and pm are
 * padded with zeros here. */
QV_INLINE void group_store(__m256i *pv, __m256i *pm, int nj, int mins, __m256i *p, __m256i *mp) {
    const int n4 = nj <= 4 ? 4 : 8;
    for (int jb = nj; jb < n4; jb++) {
        pv[jb] = pm[jb] = _mm256_setzero_si256();
    }
    *p = n4 == 4 ? _mm256_set_m128i(_mm_setzero_si128(), reduce4(pv[0], pv[1], pv[2], pv[3]))
                 : reduce8_at(pv);
    if (mins) {
        *mp = n4 == 4 ? _mm256_set_m128i(_mm_setzero_si128(), reduce4(pm[0], pm[1], pm[2], pm[3]))
                      : reduce8_at(pm);
    }
}

QV_INLINE void transpose8(__m256i *r) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

QV_INLINE __m256i nib32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

QV_INLINE __m256i bits5(uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* The 32 weight integers of a block-32 format at x (as cpu_quant_unpack). */
QV_INLINE __m256i w_blk32(const kg_ggml_type_t type, const uint8_t *x) {
    switch (type) {
    case KG_GGML_TYPE_Q4_0:
        return _mm256_sub_epi8(nib32(x + 2), _mm256_set1_epi8(8));
    case KG_GGML_TYPE_Q4_1:
        return nib32(x + 4);
    case KG_GGML_TYPE_Q5_0: {
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        return _mm256_sub_epi8(_mm256_or_si256(nib32(x + 6), bits5(qh)), _mm256_set1_epi8(16));
    }
    case KG_GGML_TYPE_Q5_1: {
        uint32_t qh;
        memcpy(&qh, x + 4, 4);
        return _mm256_or_si256(nib32(x + 8), bits5(qh));
    }
    case KG_GGML_TYPE_IQ4_NL: {
        const __m256i iq4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_iq4nl_values));
        return _mm256_shuffle_epi8(iq4, nib32(x + 2));
    }
    case KG_GGML_TYPE_MXFP4: {
        /* after the E8M0 byte, the codes as Q4_0's nibbles */
        const __m256i fp4 = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)kg_mxfp4_values));
        return _mm256_shuffle_epi8(fp4, nib32(x + 1));
    }
    default: /* Q8_0 */
        return _mm256_loadu_si256((const __m256i *)(const void *)(x + 2));
    }
}

static inline size_t blk32_size(kg_ggml_type_t type) {
    return type == KG_GGML_TYPE_Q4_1    ? 20
           : type == KG_GGML_TYPE_Q5_0  ? 22
           : type == KG_GGML_TYPE_Q5_1  ? 24
           : type == KG_GGML_TYPE_Q8_0  ? 34
           : type == KG_GGML_TYPE_MXFP4 ? 17
                                        : 18;
}

/* A Q4_K/Q5_K superblock's 8 6-bit scales (bytes 0-7) and 8 mins (bytes
 * 8-15) from its 12 packed bytes at s (ggml's get_scale_min_k4 for j =
 * 0..7), in vector registers: scale j < 4 is s[j] & 63, its min s[j + 4] &
 * 63; scale j >= 4 is s[j + 4] & 15 | (s[j - 4] >> 6) << 4, its min
 * s[j + 4] >> 4 | (s[j] >> 6) << 4. The scalar form, with its 16-byte
 * reload of four 4-byte stores, took a third of a Q4_K decode. Reads 16
 * bytes: the 4 after the scales are the block's own (qh or qs). */
QV_INLINE __m128i k4_scales_mins(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)s);
    const __m128i lo =
        _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i low_bits = _mm_or_si128(
        _mm_and_si128(lo,
                      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(lo, 4),
                      _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m128i hi =
        _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    return _mm_or_si128(low_bits, _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
}
