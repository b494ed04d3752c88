/* moe: the mixture-of-experts FFN on the GPU, grouped by expert, as the
 * CPU backend runs it (src/backend/cpu/cpu_moe.h):
 *
 *   route   one thread per token: the router's softmax and top-k (or
 *           gpt-oss's top-k of the logits then a softmax over them, or
 *           glm4moe's sigmoid with the selection bias and group limit, or
 *           llama4's top-k of the logits weighed by their sigmoids),
 *           the renormalisation and scale; the same rules and tie order as
 *           cpu_moe_route, so a token picks the same experts.
 *   align   one block: each expert's rows (token order) laid out after the
 *           previous expert's, every group padded to KG_CUDA_MOE_TILE rows,
 *           so a row tile of the grouped GEMM belongs to one expert (the
 *           layout vLLM's moe_align_block_size makes); no host round trip,
 *           so the whole FFN can be captured in a CUDA graph.
 *   gemm    the grouped GEMM: one block per (column tile, row tile), the
 *           tile's expert looked up, its matrix read once for the tile's
 *           rows (gathered from the token rows for gate/up), F32
 *           accumulation; each output element is one fmaf chain over the
 *           inputs in order, so a row's result does not depend on what else
 *           shares its expert (batch invariance, as on the CPU); expert
 *           biases added after the chain (ggml_add_id). llama4's gathered
 *           rows are multiplied by their weight as they are loaded (the
 *           CPU's cpu_moe_gather_weighted, one rounding).
 *   act     SwiGLU, gpt-oss's clamped SwiGLU or (no gate: nemotron_h_moe)
 *           the up projection's squared ReLU, stored in the down
 *           projection's type.
 *   combine the weighted sum of a token's k outputs in rank order, each
 *           product rounded, then added (ggml_mul, then ggml_add of views);
 *           llama4's outputs unweighted (their weight was on the input).
 *
 * The backend runs them for every expert layer (kg_backend_cuda_step.cu, run_step:
 * the router GEMM through gemm.cu, then route, align, gemm x 3, act,
 * combine); kg_cuda_op_moe_ffn (moe_ops.h) runs them on host data for
 * tests/unit/check_cuda_moe.c. */
#pragma once

#include "cuda_common.cuh"

/* Rows of one grouped-GEMM tile; each expert's group is padded to it. */
#define KG_CUDA_MOE_TILE 8
/* Most experts per token the route kernel keeps (in registers). */
#define KG_CUDA_MOE_MAX_K 32
/* Most expert groups it limits the choice to (one bit each). */
#define KG_CUDA_MOE_MAX_GROUPS 64

/* The router's rule (kg_moe_gating_t). */
typedef struct kg_cuda_moe_router {
    int32_t n_expert, k;
    int top_k_then_softmax; /* gpt-oss; else softmax then top-k */
    int norm_w;             /* divide the k weights by their sum (clamped to 2^-14) */
    float w_scale;          /* then multiply them by it; 0 or 1 = not */
    int sigmoid;            /* glm4moe: sigmoid scores (else softmax) */
    int32_t n_groups;       /* group-limited top-k over n_groups groups (<= 1: not), */
    int32_t n_group_used;   /* n_group_used of them kept */
    /* llama4 (kg_hparams_t.moe_w_before): the logits choose (their sigmoids weigh), each
     * chosen expert's input row is multiplied by its weight (plan->row_w, in the gate/up
     * GEMMs' gather) and the outputs are summed unweighted */
    int w_on_input;
} kg_cuda_moe_router_t;

/* The grouped layout of one step, device buffers for up to `cap` tokens. */
typedef struct kg_cuda_moe_plan {
    int32_t *sel;         /* (cap, k) expert of each token, by rank */
    float *w;             /* (cap, k) its weight */
    int32_t *slot;        /* (cap, k) grouped row of that expert's output */
    int32_t *offset;      /* (n_expert + 1) first (padded) row of each expert */
    int32_t *row_tok;     /* (rows_cap) token of each grouped row; -1: padding */
    int32_t *tile_expert; /* (rows_cap / TILE) expert of each row tile; -1: unused */
    float *row_w;         /* (rows_cap) weight of each grouped row (w_on_input only; else NULL) */
    int32_t rows_cap;     /* kg_cuda_moe_rows_cap of the launch's token count */
    /* the expert load, summed over calls (NULL: not counted): n_layer_steps,
     * n_routed, n_groups, max_group, then (n_expert) rows per expert */
    long long *stats;
} kg_cuda_moe_plan_t;

/** Rows of the grouped layout for `cap` tokens: cap * k rows, each active
 * expert's group padded to a whole tile (at most min(n_expert, cap * k)
 * experts are active), rounded up to a tile. */
static inline int32_t kg_cuda_moe_rows_cap(int32_t cap, int32_t k, int32_t n_expert) {
    const int32_t active = n_expert < cap * k ? n_expert : cap * k;
    const int32_t r = cap * k + active * (KG_CUDA_MOE_TILE - 1);
    return (r + KG_CUDA_MOE_TILE - 1) / KG_CUDA_MOE_TILE * KG_CUDA_MOE_TILE;
}

/** Route hdr->n_tokens tokens by their logits (n_launch, n_expert), plus
 * the router's bias (n_expert) when not NULL (gpt-oss), choosing by the
 * probabilities plus probs_b (n_expert) when not NULL (glm4moe), into
 * plan->sel and plan->w. */
kg_status_t kg_cuda_moe_route(cudaStream_t stream,
                              int32_t n_launch,
                              const kg_cuda_step_hdr_t *hdr,
                              const kg_cuda_moe_router_t *r,
                              const float *logits,
                              const float *bias,
                              const float *probs_b,
                              const kg_cuda_moe_plan_t *plan);

/** The grouped layout of plan->sel: offset, row_tok, slot, tile_expert,
 * row_w (plan->w of each row, 0 for padding) when not NULL; and the load in
 * plan->stats when not NULL. */
kg_status_t kg_cuda_moe_align(cudaStream_t stream,
                              const kg_cuda_step_hdr_t *hdr,
                              const kg_cuda_moe_router_t *r,
                              const kg_cuda_moe_plan_t *plan);

/** y(rows_cap, n_out) F32 = the grouped GEMM: grouped row g of expert e is
 * x[row_tok[g]] (gather != 0; times plan->row_w[g] when that is not NULL)
 * or x[g] (type dt, n_in wide) times expert
 * e's (n_out, n_in) matrix (w + e * n_out * n_in, type dt; or, qtype not
 * 0, rows e * n_out.. of a native matrix of GGUF blocks, bodies at w and
 * tails at w_tail: qblocks.cuh, each weight read as the BF16 value the
 * expansion would have stored), plus bias[e] (n_expert, n_out) F32 when
 * bias is not NULL. Padding rows are not written. F32 experts run as F32
 * FMA chains (the CPU's arithmetic), 16-bit and native ones on tensor
 * cores (inputs rounded to the weights' 16-bit type). */
kg_status_t kg_cuda_moe_gemm(cudaStream_t stream,
                             const kg_cuda_moe_plan_t *plan,
                             const void *w,
                             const float *bias,
                             const void *x,
                             int gather,
                             float *y,
                             int32_t n_out,
                             int32_t n_in,
                             kg_cuda_dtype_t dt,
                             int qtype,
                             const void *w_tail);

/* The experts' activation (kg_cuda_moe_act). */
#define KG_CUDA_MOE_ACT_SWIGLU   0 /* silu(g) * u */
#define KG_CUDA_MOE_ACT_OAI      1 /* gpt-oss's clamped SwiGLU */
#define KG_CUDA_MOE_ACT_RELU_SQR 2 /* nemotron_h_moe's relu(u)^2: no gate, g unread */
#define KG_CUDA_MOE_ACT_GEGLU    3 /* Gemma 4's gelu(g) * u: kg_cuda_moe_act_geglu */

/** h(rows_cap, n_ff) = act(g, u) stored as dt (act: KG_CUDA_MOE_ACT_*), for
 * the grouped rows that hold a token. */
kg_status_t kg_cuda_moe_act(cudaStream_t stream,
                            const kg_cuda_moe_plan_t *plan,
                            const float *g,
                            const float *u,
                            void *h,
                            kg_cuda_dtype_t dt,
                            int32_t n_ff,
                            int act);

/** kg_cuda_moe_act with KG_CUDA_MOE_ACT_GEGLU: GELU read from `table`
 * (kg_cuda_gelu_table_fill's, on the device), as cpu_geglu. */
kg_status_t kg_cuda_moe_act_geglu(cudaStream_t stream,
                                  const kg_cuda_moe_plan_t *plan,
                                  const float *g,
                                  const float *u,
                                  const uint16_t *table,
                                  void *h,
                                  kg_cuda_dtype_t dt,
                                  int32_t n_ff);

/** The shared expert's gate (qwen35moe, qwen3next): for token t <
 * hdr->n_tokens, y[t] (n wide) *= sigmoid(w . x[t]), x (rows, n) in dt,
 * the dot one float sum (a warp's lanes, then across them). */
kg_status_t kg_cuda_moe_shexp_gate(cudaStream_t stream,
                                   int32_t n_launch,
                                   const kg_cuda_step_hdr_t *hdr,
                                   const float *w,
                                   const void *x,
                                   kg_cuda_dtype_t dt,
                                   float *y,
                                   int32_t n);

/** out(n_launch, n) F32 = for token t < hdr->n_tokens, the sum over ranks
 * j in order of w[t][j] * y[slot[t][j]], then + add[t] (n; NULL: none: the
 * shared expert's output). */
kg_status_t kg_cuda_moe_combine(cudaStream_t stream,
                                int32_t n_launch,
                                const kg_cuda_step_hdr_t *hdr,
                                const kg_cuda_moe_router_t *r,
                                const kg_cuda_moe_plan_t *plan,
                                const float *y,
                                const float *add,
                                float *out,
                                int32_t n);
