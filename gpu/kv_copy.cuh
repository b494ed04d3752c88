/* kv_copy: whole KV blocks from one block id to another, every layer's K
 * and V rows (the CPU backend's cpu_kv_copy), for the n choices of one
 * prompt (kg_backend_kv_copy, kg_engine's CHOICES). */
#pragma once

#include "cuda_common.cuh"

/** On `stream`: for i < n, the `block_bytes` bytes (even: f16 rows or
 * Q8_0 blocks, kv_cache.cuh) of block src[i] of each of the `n_planes`
 * planes of `kv` (a plane every `plane_bytes`: K and V of a layer) into
 * block dst[i]. src/dst are host arrays; their values travel as kernel
 * arguments, so nothing is allocated. */
kg_status_t kg_cuda_kv_copy(cudaStream_t stream,
                            uint8_t *kv,
                            size_t plane_bytes,
                            int32_t n_planes,
                            size_t block_bytes,
                            const int32_t *src,
                            const int32_t *dst,
                            int32_t n);
