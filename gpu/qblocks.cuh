/* qblocks: GGUF quantized blocks kept on the device, and their
 * dequantization in a GEMM's load path.
 *
 * DESIGN
 * A native matrix holds its file's blocks, byte for byte, split in two
 * arrays so that every piece a kernel loads is aligned: the bodies (the
 * part of each block with the quants, n_out x blocks-per-row of them, row
 * by row) and after them the tails (the 2-byte scale that some formats put
 * first or last, which leaves their blocks only 2-byte aligned: Q8_0,
 * Q4_0, IQ4_NL, Q6_K; MXFP4's 1-byte exponent). Formats whose blocks are
 * already 8-byte multiples (Q4_K 144, Q5_K 176, IQ4_XS 136) have no tail.
 * The device takes exactly the file's bytes.
 *
 * A GEMM stages 8 consecutive weights at a time (gemm.cu): qpiece<T>
 * loads what those 8 need (one 8-byte load of quants, the block's scales)
 * and expands them to BF16 with the same float operations, in the same
 * order, as kg_dequantize does on the host (this file builds with
 * --fmad=false where it is included), rounded to nearest even as
 * kg_fp32_to_bf16 rounds: the bits equal those of the BF16 matrix that the
 * upload used to make, so a product's result does not change (and stays
 * batch-invariant). */
#pragma once

#include "cuda_common.cuh"

#include <string.h>

extern "C" {
#include "../src/model/kg_gguf.h"
}

/* Block geometry of a native type: elements per block, body and tail bytes
 * (where the tail was in the file's block: at `tail_at`). elems 0: not a
 * native type. */
typedef struct kg_cuda_qlayout {
    int32_t elems, body, tail, tail_at;
} kg_cuda_qlayout_t;

__host__ __device__ constexpr kg_cuda_qlayout_t kg_cuda_qlayout(int type) {
    switch (type) {
    case KG_GGML_TYPE_Q8_0:
        return {32, 32, 2, 0};
    case KG_GGML_TYPE_Q4_0:
    case KG_GGML_TYPE_IQ4_NL:
        return {32, 16, 2, 0};
    case KG_GGML_TYPE_Q4_K:
        return {256, 144, 0, 0};
    case KG_GGML_TYPE_Q5_K:
        return {256, 176, 0, 0};
    case KG_GGML_TYPE_Q6_K:
        return {256, 208, 2, 208};
    case KG_GGML_TYPE_IQ4_XS:
        return {256, 136, 0, 0};
    case KG_GGML_TYPE_MXFP4:
        return {32, 16, 1, 0};
    default:
        return {0, 0, 0, 0};
    }
}

/** Split n_blocks file blocks of a native type into bodies and tails (the
 * upload's host step; the inverse is only ever done by the kernels). */
static inline void
kg_cuda_qsplit(int type, const void *src, int64_t n_blocks, void *body, void *tail) {
    const kg_cuda_qlayout_t q = kg_cuda_qlayout(type);
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *b = (uint8_t *)body, *t = (uint8_t *)tail;
    const int32_t size = q.body + q.tail;
    if (q.tail == 0) {
        memcpy(b, s, (size_t)n_blocks * (size_t)size);
        return;
    }
    const int32_t body_at = q.tail_at == 0 ? q.tail : 0;
    for (int64_t i = 0; i < n_blocks; i++, s += size) {
        memcpy(b + i * q.body, s + body_at, (size_t)q.body);
        memcpy(t + i * q.tail, s + q.tail_at, (size_t)q.tail);
    }
}

// ---- device side ----

/* kg_fp32_to_bf16 (kg_quant.c) bit for bit, NaNs included */
__device__ __forceinline__ uint16_t kg_q_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 64);
    }
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

__device__ __forceinline__ float kg_q_half(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
}

__device__ __forceinline__ int kg_q_byte(uint2 v, int i) {
    return (int)(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xffu);
}

/* kg_iq4nl_values[i], from two registers' bytes (no table in memory):
 * -127 -104 -83 -65 -49 -35 -22 -10, then 1 13 25 38 53 69 89 113 */
__device__ __forceinline__ int kg_q_iq4nl(int i) {
    const uint64_t v = i < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
    return (int)(int8_t)(uint8_t)((v >> (8 * (i & 7))) & 0xffu);
}

/* scale_min_k4 of kg_quant.c on the 12 scale bytes held in s[0..2] (bytes
 * 4..15 of a Q4_K/Q5_K block, little-endian words) */
__device__ __forceinline__ void kg_q_scale_min(int j, const uint32_t s[3], int *d, int *m) {
    auto byte = [&](int i) { return (int)((s[i >> 2] >> (8 * (i & 3))) & 0xffu); };
    if (j < 4) {
        *d = byte(j) & 63;
        *m = byte(j + 4) & 63;
    } else {
        *d = (byte(j + 4) & 0x0f) | ((byte(j - 4) >> 6) << 4);
        *m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
}

/* A piece: 8 consecutive weights starting at element e (a multiple of 8)
 * of block `blk` (body + blk * body size; tail likewise). load() reads
 * global memory only; expand() does the arithmetic, so a kernel can issue
 * the loads of a later stage before the multiplies of the current one. */
template <int T> struct qpiece;

template <> struct qpiece<KG_GGML_TYPE_Q8_0> {
    uint2 q;
    uint32_t d;
    __device__ __forceinline__ void
    load(const uint8_t *body, const uint8_t *tail, int64_t blk, int e) {
        q = *(const uint2 *)(body + blk * 32 + e);
        d = *(const uint16_t *)(tail + blk * 2);
    }
    __device__ __forceinline__ void expand(int, float y[8]) const {
        const float df = kg_q_half(d);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = (float)(int8_t)kg_q_byte(q, i) * df;
        }
    }
};

/* Q4_0 and IQ4_NL (body: qs[16], tail: d): element j < 16 is the low
 * nibble of byte j, j >= 16 the high nibble of byte j - 16 */
struct qpiece_nib32 {
    uint2 q;
    uint32_t d;
    __device__ __forceinline__ void
    load(const uint8_t *body, const uint8_t *tail, int64_t blk, int e) {
        q = *(const uint2 *)(body + blk * 16 + (e & 15));
        d = *(const uint16_t *)(tail + blk * 2);
    }
};

template <> struct qpiece<KG_GGML_TYPE_Q4_0> : qpiece_nib32 {
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const float df = kg_q_half(d);
        const int sh = e >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = (float)(((kg_q_byte(q, i) >> sh) & 0x0f) - 8) * df;
        }
    }
};

template <> struct qpiece<KG_GGML_TYPE_IQ4_NL> : qpiece_nib32 {
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const float df = kg_q_half(d);
        const int sh = e >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = df * (float)kg_q_iq4nl((kg_q_byte(q, i) >> sh) & 0x0f);
        }
    }
};

/* Q4_K (144 bytes: d, dmin, 12 scale bytes, qs[128]): element 64 c + 32 h
 * + l is nibble h of qs[32 c + l], in sub-block 2 c + h */
template <> struct qpiece<KG_GGML_TYPE_Q4_K> {
    uint4 hdr;
    uint2 q;
    __device__ __forceinline__ void load(const uint8_t *body, const uint8_t *, int64_t blk, int e) {
        const uint8_t *b = body + blk * 144;
        hdr = *(const uint4 *)b;
        q = *(const uint2 *)(b + 16 + 32 * (e >> 6) + (e & 31));
    }
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const uint32_t s[3] = {hdr.y, hdr.z, hdr.w};
        int sc, m;
        kg_q_scale_min(e >> 5, s, &sc, &m);
        const float d1 = kg_q_half(hdr.x) * (float)sc, m1 = kg_q_half(hdr.x >> 16) * (float)m;
        const int sh = (e & 32) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = d1 * (float)((kg_q_byte(q, i) >> sh) & 0x0f) - m1;
        }
    }
};

/* Q5_K (176 bytes: d, dmin, 12 scale bytes, qh[32], qs[128]): Q4_K's
 * nibble plus 16 where bit 2 c + h of qh[l] is set */
template <> struct qpiece<KG_GGML_TYPE_Q5_K> {
    uint4 hdr;
    uint2 q, qh;
    __device__ __forceinline__ void load(const uint8_t *body, const uint8_t *, int64_t blk, int e) {
        const uint8_t *b = body + blk * 176;
        hdr = *(const uint4 *)b;
        qh = *(const uint2 *)(b + 16 + (e & 31));
        q = *(const uint2 *)(b + 48 + 32 * (e >> 6) + (e & 31));
    }
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const uint32_t s[3] = {hdr.y, hdr.z, hdr.w};
        int sc, m;
        kg_q_scale_min(e >> 5, s, &sc, &m);
        const float d1 = kg_q_half(hdr.x) * (float)sc, m1 = kg_q_half(hdr.x >> 16) * (float)m;
        const int sh = (e & 32) ? 4 : 0, bit = e >> 5; /* 2 c + h */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int v =
                ((kg_q_byte(q, i) >> sh) & 0x0f) + ((kg_q_byte(qh, i) >> bit) & 1 ? 16 : 0);
            y[i] = d1 * (float)v - m1;
        }
    }
};

/* Q6_K (body: ql[128], qh[64], scales[16]; tail: d): in half n (128
 * elements), element 32 s + l (s < 4) takes nibble s / 2 of ql[64 n + 32
 * (s % 2) + l], bits 2 s of qh[32 n + l], scale scales[8 n + 2 s + l / 16] */
template <> struct qpiece<KG_GGML_TYPE_Q6_K> {
    uint2 ql, qh;
    uint32_t d;
    int32_t sc;
    __device__ __forceinline__ void
    load(const uint8_t *body, const uint8_t *tail, int64_t blk, int e) {
        const uint8_t *b = body + blk * 208;
        const int n = e >> 7, s = (e >> 5) & 3, l = e & 31;
        ql = *(const uint2 *)(b + 64 * n + 32 * (s & 1) + l);
        qh = *(const uint2 *)(b + 128 + 32 * n + l);
        sc = (int8_t)b[192 + 8 * n + 2 * s + l / 16];
        d = *(const uint16_t *)(tail + blk * 2);
    }
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const int s = (e >> 5) & 3;
        const int sh = s >= 2 ? 4 : 0;
        const float ds = kg_q_half(d) * (float)sc;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int v =
                (((kg_q_byte(ql, i) >> sh) & 0x0f) | (((kg_q_byte(qh, i) >> (2 * s)) & 3) << 4)) -
                32;
            y[i] = ds * (float)v;
        }
    }
};

/* IQ4_XS (136 bytes: d, scales_h, scales_l[4], qs[128]): sub-block ib of 32
 * takes qs[16 ib ..], nibbles as IQ4_NL's, scale ((scales_l nibble) |
 * (scales_h 2 bits) << 4) - 32 */
template <> struct qpiece<KG_GGML_TYPE_IQ4_XS> {
    uint2 hdr, q;
    __device__ __forceinline__ void load(const uint8_t *body, const uint8_t *, int64_t blk, int e) {
        const uint8_t *b = body + blk * 136;
        hdr = *(const uint2 *)b;
        q = *(const uint2 *)(b + 8 + 16 * (e >> 5) + (e & 15));
    }
    __device__ __forceinline__ void expand(int e, float y[8]) const {
        const int ib = e >> 5;
        const int lo = (kg_q_byte(hdr, 4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
        const int ls = lo | (((int)(hdr.x >> 16) >> (2 * ib)) & 3) << 4;
        const float dl = kg_q_half(hdr.x) * (float)(ls - 32);
        const int sh = (e & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = dl * (float)kg_q_iq4nl((kg_q_byte(q, i) >> sh) & 0x0f);
        }
    }
};

/* MXFP4 (body: qs[16] as Q4_0's; tail: the E8M0 exponent e): value
 * kg_mxfp4_values[nibble] * kg_mxfp4_scale(e) */
template <> struct qpiece<KG_GGML_TYPE_MXFP4> {
    uint2 q;
    uint32_t e;
    __device__ __forceinline__ void
    load(const uint8_t *body, const uint8_t *tail, int64_t blk, int el) {
        q = *(const uint2 *)(body + blk * 16 + (el & 15));
        e = tail[blk];
    }
    __device__ __forceinline__ void expand(int el, float y[8]) const {
        /* kg_mxfp4_scale: e < 2 the subnormals 2^-128 and 2^-127, else exponent field e - 1 */
        const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
        const int sh = el >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            /* kg_mxfp4_values: 0 1 2 3 4 6 8 12, then their negatives (0, -1, ...) */
            const int c = (kg_q_byte(q, i) >> sh) & 0x0f;
            const uint64_t v = c < 8 ? 0x0C08060403020100ull : 0xF4F8FAFCFDFEFF00ull;
            y[i] = (float)(int8_t)(uint8_t)((v >> (8 * (c & 7))) & 0xffu) * d;
        }
    }
};

/* A native type as a compile-time value, for kg_q_dispatch's callbacks. */
template <int QT> struct kg_qt { static constexpr int value = QT; };

/** f(kg_qt<T>{}) for the native type T == qtype (f(kg_qt<0>{}) for 0): the
 * one switch from a matrix's run-time type to the kernels' template
 * argument; KG_ERR_INVALID for a type without a native kernel. */
template <class F> kg_status_t kg_q_dispatch(int qtype, F &&f) {
    switch (qtype) {
    case 0:
        return f(kg_qt<0>{});
    case KG_GGML_TYPE_Q8_0:
        return f(kg_qt<KG_GGML_TYPE_Q8_0>{});
    case KG_GGML_TYPE_Q4_0:
        return f(kg_qt<KG_GGML_TYPE_Q4_0>{});
    case KG_GGML_TYPE_IQ4_NL:
        return f(kg_qt<KG_GGML_TYPE_IQ4_NL>{});
    case KG_GGML_TYPE_Q4_K:
        return f(kg_qt<KG_GGML_TYPE_Q4_K>{});
    case KG_GGML_TYPE_Q5_K:
        return f(kg_qt<KG_GGML_TYPE_Q5_K>{});
    case KG_GGML_TYPE_Q6_K:
        return f(kg_qt<KG_GGML_TYPE_Q6_K>{});
    case KG_GGML_TYPE_IQ4_XS:
        return f(kg_qt<KG_GGML_TYPE_IQ4_XS>{});
    case KG_GGML_TYPE_MXFP4:
        return f(kg_qt<KG_GGML_TYPE_MXFP4>{});
    default:
        return KG_ERR_INVALID;
    }
}
