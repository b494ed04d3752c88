/* kv_cache: how one layer's K and V rows sit in the pool, in either of the
 * two element types (--kv-type).
 *
 * f16: row `row` of a plane is n_kv halves at row * n_kv.
 *
 * q8_0: GGUF's Q8_0 blocks (32 int8 values q, one fp16 scale d; a value is
 * d * q), kept apart so every load stays aligned: a pool block of bs rows
 * is bs * n_kv bytes of values (row by row), then the rows' bs * n_kv / 32
 * scales, padded to 16 bytes so that the next block's values start
 * aligned (no padding when bs * n_kv / 32 is a multiple of 8, as with the
 * default 16-token blocks). A pool block is then one contiguous run
 * (kv_copy copies it whole) of about bs * n_kv / 32 * 34 bytes, 1.88x fewer
 * than f16's; kg_backend_kv_bytes_per_block restates the size for the
 * engine's sizing (check_cuda's step_kv_q8_0 holds them equal). n_kv is a
 * multiple of 32, and so is head_dim (the backend checks), so a 32-value
 * block never straddles two heads.
 *
 * Quantization is ggml's quantize_row_q8_0 (and its CUDA cpy kernel):
 * d = amax / 127, q = roundf(x / d) by the reciprocal of the f32 d, the
 * scale stored as fp16. It reads one token's row alone, so a token's
 * cached K/V, and everything attention makes of them, do not depend on its
 * batch mates: batch invariance holds as with f16. */
#pragma once

#include "cuda_common.cuh"

typedef struct kg_cuda_kv {
    void *k, *v; /* the layer's K and V planes (the same layout) */
    int q8;      /* 0: f16 rows; 1: Q8_0 blocks */
} kg_cuda_kv_t;

/** Bytes of one pool block of `bs` rows of n_kv values. */
__host__ __device__ __forceinline__ size_t kg_kv_block_bytes(int q8, int32_t bs, int64_t n_kv) {
    return q8 ? ((size_t)bs * (size_t)(n_kv / 32) * 34 + 15) / 16 * 16
              : (size_t)bs * (size_t)n_kv * 2;
}

/** Q8_0: the first value byte of pool row `row` (block row / bs). */
__device__ __forceinline__ int8_t *
kg_kv_q8_vals(void *plane, int64_t row, int32_t bs, int64_t n_kv) {
    return (int8_t *)plane + (row / bs) * (int64_t)kg_kv_block_bytes(1, bs, n_kv) +
           (row % bs) * n_kv;
}

/** Q8_0: the first scale of pool row `row`. */
__device__ __forceinline__ __half *
kg_kv_q8_scales(void *plane, int64_t row, int32_t bs, int64_t n_kv) {
    return (__half *)((int8_t *)plane + (row / bs) * (int64_t)kg_kv_block_bytes(1, bs, n_kv) +
                      (int64_t)bs * n_kv) +
           (row % bs) * (n_kv / 32);
}

/** Values e .. e + 7 (e a multiple of 8) of pool row `row` as 8 halves,
 * zeros past nothing: f16 rows are read as they are, Q8_0 ones expanded
 * (d * q is exact in f32: 11 x 8 bits; one rounding to fp16, the tile's
 * type). */
__device__ __forceinline__ uint4 kg_kv_load8(
    const kg_cuda_kv_t &kv, const void *plane, int64_t row, int32_t bs, int64_t n_kv, int64_t e) {
    if (!kv.q8) {
        return *(const uint4 *)((const __half *)plane + row * n_kv + e);
    }
    void *p = const_cast<void *>(plane);
    const uint2 raw = *(const uint2 *)(kg_kv_q8_vals(p, row, bs, n_kv) + e);
    const float d = __half2float(kg_kv_q8_scales(p, row, bs, n_kv)[e / 32]);
    const int8_t *q = (const int8_t *)&raw;
    uint4 out;
    __half *h = (__half *)&out;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        h[j] = __float2half_rn(d * (float)q[j]);
    }
    return out;
}

/** Q8_0: quantize the 32 values x[lane] of one block, a lane each, into
 * vals[lane] and *scale (every lane of the warp calls it). */
__device__ __forceinline__ void kg_kv_q8_store32(float x, int lane, int8_t *vals, __half *scale) {
    const float amax = kg_warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    vals[lane] = (int8_t)roundf(x * id);
    if (lane == 0) {
        *scale = __float2half_rn(d);
    }
}
