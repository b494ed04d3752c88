/* cpu_vecdot_decode512: phase 1 of the fused decode (cpu_vecdot_decode.c)
 * for one sequence (a single activation row) and the K-quants most GGUF
 * files carry, Q4_K, Q5_K and Q6_K (a Q4_K_M file is nearly all of them),
 * on 512-bit registers.
 *
 * One sequence's decode step meets every weight once, and at 256 weights
 * a superblock the AVX2 tiles spent ~55 vector instructions on each: a
 * Q4_K GEMV ran at ~21 GB/s on one Zen 5 core, under what two cores can
 * stream, where ggml's repacked Q4_K GEMV runs at ~30. Here one zmm
 * register carries two chunks of 32 weights, the pair whose activations
 * are contiguous, so the shifts, masks, multiplies and scale products are
 * half as many: a nibble pair is the same 32 bytes broadcast to both halves,
 * the high half shifted by 4 under a mask, the high bits of Q5_K/Q6_K a
 * 32-bit rotate that brings each byte's bit to place, the scales one
 * in-lane shuffle per register, the scale's multiply-add vpdpwssd.
 *
 * Same integers, same buffers: every superblock's lane sums add up to the
 * exact sum the AVX2 tile forms (the lanes differ, the total cannot), and
 * they are reduced and stored exactly as there, so phase 2 and every
 * output bit are unchanged (check_vecdot compares every kernel with the
 * reference). Compiled with -march=x86-64-v4 (CMakeLists.txt); runs only
 * where the CPU has AVX-512 (F, BW, VL, DQ) and AVX512-VNNI. */
#include "cpu_gemm_int.h"
#include "cpu_vecdot_int.h"

#include <stdatomic.h>

#if defined(VECDOT_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "cpu_vecdot_x86.h"

#define DECODE512 1

/* acc + the int16 pair products of a and b per int32 lane (vpdpwssd on
 * zmm; asm, so that the file needs no -mavx512vnni). */
QV_INLINE __m512i dpwssd512(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* The int32 lanes of a zmm sum folded to 8 (the total is unchanged). */
QV_INLINE __m256i fold512(__m512i p) {
    return _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64(p, 1));
}

/* 32 bytes at x in both halves of a zmm (a load, no shuffle). */
QV_INLINE __m512i both_halves(const uint8_t *x) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)x));
}

/* Per 32-bit lane, r0 in the low half and r1 in the high one. */
QV_INLINE __m512i halves_epi32(int r0, int r1) {
    return _mm512_inserti64x4(_mm512_set1_epi32(r0), _mm256_set1_epi32(r1), 1);
}

/* Bit s of every byte of v moved to bit t (and its neighbours with it):
 * a right rotation of each 32-bit lane by s - t (mod 32) moves bit
 * 8 i + s to 8 i + t within the same byte for every s, t < 8. */
QV_INLINE int rot_to(int s, int t) {
    return (s - t + 32) % 32;
}

/* Q4_K (five 0) or Q5_K (five 1): the lane sums of the superblock at x
 * against the 256 activations aq, scales applied; *pm its mins against
 * the 16 sums bs. Chunk 2 g (the low nibbles of the 32 bytes g) and 2 g + 1
 * (their high nibbles) share register g. */
QV_INLINE __m256i
k4_super(const int five, const uint8_t *x, const int8_t *aq, const int16_t *bs, __m256i *pm) {
    const __m128i sm = k4_scales_mins(x + 4);
    /* scales 0-7 as int16 in every 128-bit lane; register g takes 2 g in
     * its low half and 2 g + 1 in its high one */
    const __m512i scz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __mmask32 hi_half = 0xffff0000u; /* the high nibbles in the high half */
    const uint8_t *qs = x + (five ? 48 : 16);
    const __m512i qh = five ? both_halves(x + 16) : _mm512_setzero_si512();
    __m512i p = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m512i qz = both_halves(qs + 32 * (ptrdiff_t)g);
        __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(qz, hi_half, qz, 4), m4);
        if (five) { /* bit 2 g (low half) or 2 g + 1 (high) of qh to bit 4 */
            const __m512i hb = _mm512_and_si512(
                _mm512_rorv_epi32(qh, halves_epi32(rot_to(2 * g, 4), rot_to(2 * g + 1, 4))),
                _mm512_set1_epi8(0x10));
            w = _mm512_or_si512(w, hb);
        }
        const __m512i av = _mm512_loadu_si512((const void *)(aq + 64 * (ptrdiff_t)g));
        const __m512i sc = _mm512_shuffle_epi8(
            scz, _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * g | (4 * g + 1) << 8)),
                                    _mm256_set1_epi16((short)((4 * g + 2) | (4 * g + 3) << 8)), 1));
        p = dpwssd512(p, _mm512_maddubs_epi16(w, av), sc);
    }
    const __m128i dup_hi =
        _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_hi));
    *pm = _mm256_madd_epi16(mins16, _mm256_load_si256((const __m256i *)(const void *)bs));
    return fold512(p);
}

/* Q6_K: the lane sums of the superblock at x (weights + 32, the offset
 * taken back through the sums bs as the AVX2 tile does). Register 2 h
 * holds chunks 4 h and 4 h + 1 (the low nibbles of the 64 bytes h of ql),
 * register 2 h + 1 chunks 4 h + 2 and 4 h + 3 (their high nibbles); chunk
 * 4 h + c takes bits 2 c, 2 c + 1 of the 32 bytes h of qh as its top two.
 * Its 16 scales (one per 16 weights) go four to a register, one per
 * 128-bit lane: register j lane L scale 4 j + L. */
QV_INLINE __m256i q6k_super(const uint8_t *x, const int8_t *aq, const int16_t *bs) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)(x + 192));
    const __m512i scb = _mm512_broadcast_i32x4(sc8);
    __m512i p = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512((const void *)(x + 64 * (ptrdiff_t)h));
        const __m512i qh = both_halves(x + 128 + 32 * (ptrdiff_t)h);
        __m512i w[2];
        w[0] = _mm512_or_si512(
            _mm512_and_si512(l, m4),
            _mm512_and_si512(_mm512_rorv_epi32(qh, halves_epi32(rot_to(0, 4), rot_to(2, 4))), m30));
        w[1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
            _mm512_and_si512(_mm512_rorv_epi32(qh, halves_epi32(rot_to(4, 4), rot_to(6, 4))), m30));
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            const int j = 2 * h + i;
            const __m512i av =
                _mm512_loadu_si512((const void *)(aq + 128 * (ptrdiff_t)h + 64 * (ptrdiff_t)i));
            /* byte 4 j + L of the scales into the high byte of every int16
             * of lane L, then sign-extended by the arithmetic shift */
            const __m512i pick =
                _mm512_set_epi16((short)((4 * j + 3) << 8 | 0x80), (short)((4 * j + 3) << 8 | 0x80),
                                 (short)((4 * j + 3) << 8 | 0x80), (short)((4 * j + 3) << 8 | 0x80),
                                 (short)((4 * j + 3) << 8 | 0x80), (short)((4 * j + 3) << 8 | 0x80),
                                 (short)((4 * j + 3) << 8 | 0x80), (short)((4 * j + 3) << 8 | 0x80),
                                 (short)((4 * j + 2) << 8 | 0x80), (short)((4 * j + 2) << 8 | 0x80),
                                 (short)((4 * j + 2) << 8 | 0x80), (short)((4 * j + 2) << 8 | 0x80),
                                 (short)((4 * j + 2) << 8 | 0x80), (short)((4 * j + 2) << 8 | 0x80),
                                 (short)((4 * j + 2) << 8 | 0x80), (short)((4 * j + 2) << 8 | 0x80),
                                 (short)((4 * j + 1) << 8 | 0x80), (short)((4 * j + 1) << 8 | 0x80),
                                 (short)((4 * j + 1) << 8 | 0x80), (short)((4 * j + 1) << 8 | 0x80),
                                 (short)((4 * j + 1) << 8 | 0x80), (short)((4 * j + 1) << 8 | 0x80),
                                 (short)((4 * j + 1) << 8 | 0x80), (short)((4 * j + 1) << 8 | 0x80),
                                 (short)((4 * j) << 8 | 0x80), (short)((4 * j) << 8 | 0x80),
                                 (short)((4 * j) << 8 | 0x80), (short)((4 * j) << 8 | 0x80),
                                 (short)((4 * j) << 8 | 0x80), (short)((4 * j) << 8 | 0x80),
                                 (short)((4 * j) << 8 | 0x80), (short)((4 * j) << 8 | 0x80));
            const __m512i sc = _mm512_srai_epi16(_mm512_shuffle_epi8(scb, pick), 8);
            p = dpwssd512(p, _mm512_maddubs_epi16(w[i], av), sc);
        }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i bsv = _mm256_load_si256((const __m256i *)(const void *)bs);
    return _mm256_sub_epi32(fold512(p), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), 5));
}

QV_INLINE void row_t(const kg_ggml_type_t type,
                     const uint8_t *x,
                     int q,
                     const cpu_qact_t *a,
                     __m256i *P,
                     __m256i *MP,
                     uint16_t *D,
                     uint16_t *DM) {
    const int six = type == KG_GGML_TYPE_Q6_K, five = type == KG_GGML_TYPE_Q5_K;
    const size_t bsz = six ? 210 : five ? 176 : 144, doff = six ? 208 : 0;
    const int64_t nb = a->k / 256, ng = (nb + 7) / 8;
    for (int64_t g = 0; g < ng; g++) {
        __m256i pv[8], pm[8];
        const int nj = nb - g * 8 < 8 ? (int)(nb - g * 8) : 8;
        for (int jb = 0; jb < nj; jb++) {
            const int64_t b = g * 8 + jb;
            const uint8_t *xb = x + (size_t)b * bsz;
            prefetch_ahead(xb, bsz);
            memcpy(D + b * NP + q, xb + doff, 2);
            if (six) {
                pv[jb] = q6k_super(xb, a->qs + 256 * b, a->bsums + 16 * b);
            } else {
                memcpy(DM + b * NP + q, xb + 2, 2);
                pv[jb] = k4_super(five, xb, a->qs + 256 * b, a->bsums + 16 * b, &pm[jb]);
            }
        }
        group_store(pv, pm, nj, !six, &P[g * NP + q], &MP[g * NP + q]);
    }
}

/* The panel's NP weight rows from x (row_size bytes apart; rows from nc on
 * repeat the first, computed and not stored) in one call, so that the
 * constants are made once a panel and not once a row. */
QV_INLINE void panel_t(const kg_ggml_type_t type,
                       const uint8_t *x,
                       size_t row_size,
                       int nc,
                       const cpu_qact_t *a,
                       __m256i *P,
                       __m256i *MP,
                       uint16_t *D,
                       uint16_t *DM) {
    for (int q = 0; q < NP; q++) {
        row_t(type, x + (size_t)(q < nc ? q : 0) * row_size, q, a, P, MP, D, DM);
    }
}

/* One function per type, each with its constants folded in. */
#define DEF_PANEL(NAME, TYPE)                                                                      \
    static void NAME(const uint8_t *x, size_t rs, int nc, const cpu_qact_t *a, __m256i *P,         \
                     __m256i *MP, uint16_t *D, uint16_t *DM) {                                     \
        panel_t(TYPE, x, rs, nc, a, P, MP, D, DM);                                                 \
    }
DEF_PANEL(panel_q4_k, KG_GGML_TYPE_Q4_K)
DEF_PANEL(panel_q5_k, KG_GGML_TYPE_Q5_K)
DEF_PANEL(panel_q6_k, KG_GGML_TYPE_Q6_K)

void cpu_vecdot_decode512_panel(kg_ggml_type_t type,
                                const uint8_t *x,
                                size_t row_size,
                                int nc,
                                const cpu_qact_t *a,
                                void *p,
                                void *mp,
                                uint16_t *d,
                                uint16_t *dm) {
    switch (type) {
    case KG_GGML_TYPE_Q4_K:
        panel_q4_k(x, row_size, nc, a, p, mp, d, dm);
        break;
    case KG_GGML_TYPE_Q5_K:
        panel_q5_k(x, row_size, nc, a, p, mp, d, dm);
        break;
    default:
        panel_q6_k(x, row_size, nc, a, p, mp, d, dm);
        break;
    }
}
#endif

bool cpu_vecdot_decode512_has(kg_ggml_type_t type) {
#ifdef DECODE512
    /* cpuid traps to the hypervisor in a VM: asked once (a race between
     * two first callers only asks twice) */
    static _Atomic int runs = -1;
    int r = atomic_load_explicit(&runs, memory_order_relaxed);
    if (r < 0) {
        r = cpu_gemm_avx512_runs() ? 1 : 0;
        atomic_store_explicit(&runs, r, memory_order_relaxed);
    }
    return r &&
           (type == KG_GGML_TYPE_Q4_K || type == KG_GGML_TYPE_Q5_K || type == KG_GGML_TYPE_Q6_K);
#else
    (void)type;
    return false;
#endif
}
