/* cpu_quant: the two inputs of the CPU backend's quantized matmul
 * (cpu_vecdot): activations quantized the way ggml quantizes them for a
 * weight type's dot product, and weight blocks unpacked into panels of
 * small integers with their scales.
 *
 * DESIGN
 * Activations. ggml multiplies a quantized weight by activations
 * quantized to the type's vec_dot_type: Q8_0 blocks for Q4_0, Q5_0, Q8_0,
 * IQ4_NL and MXFP4; Q8_1 (Q8_0 plus d * sum(q)) for Q4_1 and Q5_1; Q8_K (256
 * int8 with a float scale and sums of 16) for the K-quants and IQ4_XS. We
 * quantize with ggml-cpu's x86 code paths' exact arithmetic (Q8_0/Q8_1: the
 * AVX2 quantize_row_q8_0/q8_1, rounding half to even; Q8_K:
 * quantize_row_q8_K_ref), so the int8 values and scales equal ggml's.
 *
 * Weight panels. Every weight type is a sum over blocks of
 *     d * sum_k sc(k) * w(k) * a(k)  [- dmin * sum_sub m(sub) * bsum(sub)]  [+ m * s]
 * with integer w(k) that fit int8 and integer sub-block scales sc. A panel
 * holds CPU_QPANEL weight rows (output columns) in that form: w as int8
 * (Q3_K and Q6_K shifted to be non-negative, see cpu_qtraits_t.offset),
 * sc as int16 pairs per 32 elements, d (and dmin or m) as floats, mins as
 * int16 per 16 elements. One unpacking serves every activation row that
 * meets the panel, so prefill pays it once per panel and decode streams
 * the weight bytes once, as they are in the mapped file (nothing is
 * expanded or kept at load). */
#pragma once

#include "../../model/kg_gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Output columns per unpacked panel. */
#define CPU_QPANEL 8

/* ggml's vec_dot_type of a quantized weight type. */
typedef enum cpu_act_kind {
    CPU_ACT_Q8_0, /* 32-blocks: fp16 d, int8 q */
    CPU_ACT_Q8_1, /* 32-blocks: fp16 d, fp16 s = d * sum(q), int8 q */
    CPU_ACT_Q8_K, /* 256-blocks: float d, int8 q, int16 sums of 16 */
} cpu_act_kind_t;

/* How a weight type's dot product is put together (cpu_vecdot's kernels). */
typedef struct cpu_qtraits {
    kg_ggml_type_t type;
    cpu_act_kind_t act;
    int blk;     /* elements per block: 32 or 256 */
    bool nonneg; /* panel w(k) >= 0: no sign trick needed */
    int offset;  /* Q3_K 4, Q6_K 32: the panel holds w(k) + offset (>= 0), and the
                    sums take offset * sum over sub-blocks of sc * bsum back off */
    bool scaled; /* sub-block integer scales sc (the K-quants, IQ4_XS) */
    bool min_m;  /* + m * s per 32-block (Q4_1, Q5_1, with Q8_1 activations) */
    bool min_k;  /* - dmin * sum m(sub) bsum(sub) per 256-block (Q2_K, Q4_K, Q5_K) */
} cpu_qtraits_t;

/** The traits of a quantized type; NULL for F32/F16/BF16. */
const cpu_qtraits_t *cpu_qtraits(kg_ggml_type_t type);

/** Quantized activations: m rows of k elements (k a multiple of the block).
 * Scales are stored block-major, so a tile's rows are contiguous. */
typedef struct cpu_qact {
    cpu_act_kind_t kind;
    int64_t m, k;
    int8_t *qs;     /* (m, k) */
    uint8_t *qu;    /* (m, k) qs + 128, unsigned (for vpdpbusd; see cpu_vecdot) */
    float *d;       /* (k / blk, m): the scale as used in the dot (fp16 value for Q8_0/Q8_1) */
    float *s;       /* Q8_1: (k / 32, m) d * sum(q), fp16 value */
    int32_t *sums;  /* Q8_0/Q8_1: (k / 32, m) sum(q) (cpu_vecdot's offset weights) */
    int16_t *bsums; /* Q8_K: (m, k / 16) sums of 16 q */
} cpu_qact_t;

/** Buffers for up to max_m rows of max_k elements, any kind. The step loop
 * reuses them. Returns false when out of memory. */
bool cpu_qact_init(cpu_qact_t *a, int64_t max_m, int64_t max_k);
void cpu_qact_clear(cpu_qact_t *a);
/** Bytes held by a's buffers. */
size_t cpu_qact_size(int64_t max_m, int64_t max_k);

/** Quantize x (m, k) into a (whose buffers fit m x k) as `kind`. k must be
 * a multiple of the kind's block. @thread any */
void cpu_quant_act(cpu_act_kind_t kind, const float *x, int64_t m, int64_t k, cpu_qact_t *a);

/** Rows [r0, r1) of cpu_quant_act(kind, x, m, k, a): callers that split the
 * rows among threads get what one call writes (every row's blocks are its
 * own). @thread any, disjoint rows */
void cpu_quant_act_rows(cpu_act_kind_t kind,
                        const float *x,
                        int64_t m,
                        int64_t k,
                        cpu_qact_t *a,
                        int64_t r0,
                        int64_t r1);

/** An unpacked panel of CPU_QPANEL weight rows of k elements (see DESIGN). */
typedef struct cpu_qpanel {
    int64_t k;
    int8_t *w;     /* (CPU_QPANEL, k) */
    uint32_t *sc;  /* scaled types: (CPU_QPANEL, k / 32): int16 scale of elements 0-15
                      in the low half, of 16-31 in the high half */
    float *d;      /* (k / blk, CPU_QPANEL) block scale d (MXFP4: its E8M0 halved, exact) */
    float *dm;     /* min_m: (k / 32, CPU_QPANEL) m; min_k: (k / 256, CPU_QPANEL) dmin */
    int16_t *mins; /* min_k: (CPU_QPANEL, k / 16) the min of each 16 elements' sub-block */
    int32_t *corr; /* (k / 32, CPU_QPANEL) -128 * sum over the block of sc * w (the value,
                      signed), which turns sum sc (a + 128) w into sum sc a w: signed
                      32-blocks always, every type in the interleaved form below */
    /* The interleaved form the AVX-VNNI prefill tiles read (cpu_vecdot), built
     * from the above when those tiles run: */
    int8_t *wi;     /* (k / 4, CPU_QPANEL, 4): 4 consecutive values of each row side by
                       side, so one vpdpbusd meets 4 k of all 8 rows (signed values) */
    int32_t *sci;   /* scaled types: (k / 16, CPU_QPANEL) the scale of each 16 */
    uint32_t *mini; /* min_k: (k / 32, CPU_QPANEL) the mins of 16-sub-blocks 2j and 2j + 1
                       as an int16 pair */
} cpu_qpanel_t;

/** Bytes of one panel for rows of k elements. */
size_t cpu_qpanel_size(int64_t k);
/** Lay out panel p in `mem` (cpu_qpanel_size(k) bytes, 32-byte aligned). */
void cpu_qpanel_init(cpu_qpanel_t *p, void *mem, int64_t k);

/** Unpack n_rows <= CPU_QPANEL consecutive weight rows of `type` starting
 * at `rows` (each row_size bytes, ggml layout) into p; the rest of the
 * panel's rows become zero (they contribute nothing). @thread any */
void cpu_quant_unpack(
    const cpu_qtraits_t *tr, const void *rows, size_t row_size, int n_rows, cpu_qpanel_t *p);
