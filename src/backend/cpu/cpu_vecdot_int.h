/* cpu_vecdot_int: what cpu_vecdot's files share: the blocking constants,
 * the build's x86 kernels switch (VECDOT_AVX2), and each kernel family's
 * entry points, which the driver in cpu_vecdot.c calls:
 *   cpu_vecdot_scalar.c  the portable tile and the reference (every kernel's order)
 *   cpu_vecdot_avx2.c    AVX2 tiles on unpacked panels (prefill without VNNI)
 *   cpu_vecdot_decode.c  AVX2 fused decode tiles, straight from the blocks
 *                        (maddubs, or vpdpbusd in its VEX or EVEX form)
 *   cpu_vecdot_decode512.c  their phase 1 on zmm registers for one sequence
 *                        and Q4_K/Q5_K/Q6_K (AVX-512 with AVX512-VNNI)
 *   cpu_vecdot_vnni.c    AVX-VNNI and AVX512-VNNI tiles on interleaved panels
 * Their shared AVX2 helpers are in cpu_vecdot_x86.h. */
#pragma once

#include "cpu_quant.h"
#include "cpu_vecdot.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VECDOT_AVX2 1
#endif

#define NP CPU_QPANEL

/* Panels a task unpacks and computes: a run of them stays in L2 while the
 * activation rows stream past (prefill), and tasks stay small enough to
 * balance two threads on a decode step. */
#define TASK_PANELS        4
#define TASK_PANELS_DECODE 4
/* qgemm_task keeps TASK_PANELS panels a task (its panels[] and the scratch stride), and
 * qgemm_run hands a decode task up to TASK_PANELS_DECODE of them */
_Static_assert(TASK_PANELS_DECODE <= TASK_PANELS, "a decode task must fit a task's panels");
/* the larger of the two: each thread's scratch holds this many panels */
#if TASK_PANELS > TASK_PANELS_DECODE
#define TASK_PANELS_MAX TASK_PANELS
#else
#define TASK_PANELS_MAX TASK_PANELS_DECODE
#endif

/* Activation rows per block: MC rows of k int8 stay in L2 with the task's
 * panels. */
#define MC 64

/* Below this many activation rows the fused decode tiles read the blocks
 * in place (unpacked panels pay off from there on): 32-block types, whose
 * panels are cheap to build, and the K-quants, whose are not. */
#define FUSED_MAX_ROWS_32 5
#define FUSED_MAX_ROWS_K  17
#define FUSED_MAX_ROWS    17 /* the larger: the fused tiles' buffers hold this many rows */

/* Rows [i1, i2) of a against one unpacked panel (its first nc rows valid):
 * c[i * ldc + j] for the panel's columns, by the scalar tile. */
void cpu_vecdot_scalar_rows(const cpu_qtraits_t *tr,
                            const cpu_qpanel_t *p,
                            int nc,
                            const cpu_qact_t *a,
                            int64_t i1,
                            int64_t i2,
                            float *c,
                            int64_t ldc);

#ifdef VECDOT_AVX2
/* The same by the AVX2 tiles (the panel as cpu_quant_unpack leaves it). */
void cpu_vecdot_avx2_rows(const cpu_qtraits_t *tr,
                          const cpu_qpanel_t *p,
                          int nc,
                          const cpu_qact_t *a,
                          int64_t i1,
                          int64_t i2,
                          float *c,
                          int64_t ldc);

/* Panels [p0, p1) of w against the few rows of a (decode), read from the
 * blocks in place, into c (a->m, w->n); vnni: 0 maddubs, 1 vpdpbusd VEX,
 * 2 vpdpbusd EVEX. mem: the thread's scratch (TASK_PANELS panels). */
void cpu_vecdot_decode(int vnni,
                       const cpu_qmat_t *w,
                       const cpu_qact_t *a,
                       char *mem,
                       int64_t p0,
                       int64_t p1,
                       float *c);

/* Whether cpu_vecdot_decode512_panel runs here for `type` (Q4_K, Q5_K,
 * Q6_K, in a build with x86-64-v4 on a CPU with AVX-512 F/BW/VL/DQ; the
 * caller checks AVX512-VNNI, the EVEX kernels). @thread any */
bool cpu_vecdot_decode512_has(kg_ggml_type_t type);

/* Phase 1 of cpu_vecdot_decode for a single activation row a and the
 * panel of NP weight rows at x (row_size bytes apart; rows from nc on
 * repeat the first): the groups' block sums into p (and the mins' into mp;
 * __m256i each) and the blocks' fp16 scales into d (dm), as the AVX2 tiles
 * write them. */
void cpu_vecdot_decode512_panel(kg_ggml_type_t type,
                                const uint8_t *x,
                                size_t row_size,
                                int nc,
                                const cpu_qact_t *a,
                                void *p,
                                void *mp,
                                uint16_t *d,
                                uint16_t *dm);

/* The interleaved panel p of the n_rows rows at src (row_size bytes each),
 * for the VNNI tiles (vnni 1: VEX, 2: EVEX). */
void cpu_vecdot_vnni_panel(int vnni,
                           const cpu_qtraits_t *tr,
                           const uint8_t *src,
                           size_t row_size,
                           int n_rows,
                           cpu_qpanel_t *p);

/* cpu_vecdot_scalar_rows by the VNNI tiles, on an interleaved panel. */
void cpu_vecdot_vnni_rows(int vnni,
                          const cpu_qtraits_t *tr,
                          const cpu_qpanel_t *p,
                          int nc,
                          const cpu_qact_t *a,
                          int64_t i1,
                          int64_t i2,
                          float *c,
                          int64_t ldc);
#endif
