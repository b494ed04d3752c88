/* cpu_gemm_int: what cpu_gemm.c's driver asks of the kernels compiled in
 * other files (the AVX-512 one needs its own -march). */
#pragma once

#include "cpu_gemm.h"

/** Whether the AVX-512 kernel is compiled in and this CPU and OS run it
 * (AVX512F/BW/DQ/VL, FMA, F16C, the ZMM state saved). @thread any */
bool cpu_gemm_avx512_runs(void);

/** Panels [p0, p1) of C(m, w->n) = A(m, k) · W^T with the AVX-512 tiles:
 * bit for bit what the AVX2 and scalar kernels give. Only where
 * cpu_gemm_avx512_runs(). @thread any */
void cpu_gemm_avx512_panels(
    const float *a, const cpu_gemm_weights_t *w, float *c, int64_t m, int64_t p0, int64_t p1);
