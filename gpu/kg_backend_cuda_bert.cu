/* kg_backend_cuda_bert: the CUDA backend's step for the `bert` and
 * `nomic-bert` encoders (kg_model_bert.h), which embedding and rerank jobs
 * run; cpu_bert.c is the reference it follows.
 *
 * DESIGN
 * A bert step is whole inputs, each a run of one sequence's tokens at
 * positions 0 .. n-1 (the engine schedules bert inputs whole); a step that
 * would cut one, or asks for logits (bert has no LM head), is refused. No
 * KV is kept: the backend allocates no pool for bert, and attention reads
 * K and V straight from the step's Q|K|V GEMM output.
 *
 * Per step, all on the stream, eagerly (encoder steps vary in shape, and
 * the decode graphs do not apply): x = LN(tok_embd[token] + token_types[0]
 * + position_embd[pos]); per layer the fused Q|K|V GEMM, the non-causal
 * attention (bias, fp16 rounding and softmax as cpu_bert's), the output
 * GEMM, x = LN(x + attn + bias), the up GEMM, bias + GELU, the down GEMM,
 * x = LN(x + ffn + bias); the rows want_hidden marks are copied back (the
 * last layer's output: bert has no output norm). Pooling and the
 * classification head run on the host (kg_embed.c), as for the CPU
 * backend. The GEMMs compute every row alike whatever the row count and
 * the other kernels work per row or per (token, head) over the token's own
 * input, so an input's vector is the same bits alone or among others.
 *
 * nomic-bert differs where cpu_bert's does: no position rows in the
 * embeddings; Q|K|V (fused in the file, one GEMM here as for bert) get
 * their biases and then RoPE on Q and K (NeoX pairs) before the attention,
 * from a table of angles for positions 0 .. max_tokens - 1 made on the
 * host at start with the CPU's own function (an input's positions start
 * at 0 in every step); and the FFN is the gate|up GEMM, SwiGLU
 * (swiglu.cu) and the down GEMM, without biases. */
#include "kg_backend_cuda_int.cuh"

/* Check the step and pack its inputs (token, pos, the first token and the
 * length of each token's input) into h_in. KG_ERR_INVALID or
 * KG_ERR_UNSUPPORTED with the fault recorded. */
static kg_status_t bert_pack(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t T = batch->n_tokens;
    int32_t *hdr = ctx->h_in;
    int32_t *token = hdr + 4, *pos = token + T, *run0 = pos + T, *run_n = run0 + T;
    if (batch->n_outputs > 0) {
        return cuda_fault(ctx, KG_ERR_UNSUPPORTED, KG_FAULT_STEP, -1, -1,
                          "bert has no LM head: a step asked for %d logits rows", batch->n_outputs);
    }
    int32_t n_hid = 0;
    for (int32_t t = 0; t < T; t++) {
        const int32_t tok = batch->token[t], p = batch->pos[t], seq = batch->seq[t];
        if (seq < 0 || seq >= batch->n_slots) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                              "bad batch entry %d: slot %d of %d", t, seq, batch->n_slots);
        }
        if (tok < 0 || tok >= hp->n_vocab) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                              "slot %d: token id %d outside the model's vocabulary of %d", seq, tok,
                              hp->n_vocab);
        }
        if (p < 0 || p >= hp->n_ctx_train) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                              "slot %d: position %d outside bert's %d positions", seq, p,
                              hp->n_ctx_train);
        }
        token[t] = tok;
        pos[t] = p;
        n_hid += batch->want_hidden && batch->want_hidden[t] ? 1 : 0;
    }
    if (n_hid != batch->n_hidden) {
        return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_STEP, -1, -1,
                          "batch says %d hidden rows, want_hidden has %d", batch->n_hidden, n_hid);
    }
    /* every input whole: positions 0, 1, ..., n-1 in a row, and no
     * sequence in two runs (a token attends to its whole input) */
    for (int32_t t = 0; t < T;) {
        const int32_t seq = batch->seq[t];
        int32_t n = 0;
        while (t + n < T && batch->seq[t + n] == seq && batch->pos[t + n] == n) {
            n++;
        }
        if (n == 0) {
            return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                              "bert: token %d (slot %d position %d) is not part of a whole input "
                              "(an encoder attends both ways: inputs come whole, from position 0)",
                              t, seq, batch->pos[t]);
        }
        for (int32_t u = 0; u < t; u = run0[u] + run_n[u]) {
            if (batch->seq[u] == seq) {
                return cuda_fault(ctx, KG_ERR_INVALID, KG_FAULT_SEQ, seq, -1,
                                  "bert: slot %d comes twice in one step", seq);
            }
        }
        for (int32_t k = 0; k < n; k++) {
            run0[t + k] = t;
            run_n[t + k] = n;
        }
        t += n;
    }
    hdr[0] = T;
    hdr[1] = 0;
    hdr[2] = 0;
    hdr[3] = 0;
    return KG_OK;
}

/* The device part of a step, inputs packed. */
static kg_status_t bert_run(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    const kg_hparams_t *hp = &ctx->hp;
    const int32_t T = batch->n_tokens, E = hp->n_embd, NL = hp->n_layer;
    cudaStream_t st = ctx->stream;
    KG_CUDA_CHECK(cudaMemcpyAsync(ctx->d_in, ctx->h_in,
                                  (4 + KG_CUDA_BERT_INPUT_ARRAYS * (size_t)T) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st));
    KG_CUDA_CHECK(cudaEventRecord(ctx->ev_in, st));
    const kg_cuda_bert_inputs_t in = kg_cuda_bert_inputs_view(ctx->d_in, T);
    KG_TRY(kg_cuda_bert_embed(st, T, in, ctx->emb.data, ctx->emb.dt, ctx->pos_embd, ctx->type_embd,
                              ctx->tok_norm, ctx->tok_norm_b, ctx->x, ctx->xn,
                              ctx->layers[0].wqkv.dt, E, hp->norm_eps));
    const bool nomic = hp->arch == KG_ARCH_NOMIC_BERT;
    for (int32_t il = 0; il < NL; il++) {
        const cuda_layer_t *L = &ctx->layers[il];
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wqkv, ctx->xn, ctx->qkv, T));
        if (nomic) { /* the biases go in here, before the rotation */
            KG_TRY(kg_cuda_bert_rope(st, T, in, ctx->qkv, L->bqkv, ctx->rope_cs, hp->n_head,
                                     hp->head_dim, hp->n_rot));
        }
        KG_TRY(kg_cuda_bert_attention(st, T, in, ctx->qkv, nomic ? NULL : L->bqkv, hp->n_head,
                                      hp->head_dim, ctx->att, L->wo.dt));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wo, ctx->att, ctx->tmp, T));
        KG_TRY(kg_cuda_bert_add_norm(st, T, ctx->tmp, L->bo, L->attn_norm, L->attn_norm_b, ctx->x,
                                     ctx->xn, L->wgu.dt, E, hp->norm_eps));
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wgu, ctx->xn, ctx->gu, T));
        if (nomic) { /* wgu is gate|up: silu(gate) * up */
            KG_TRY(kg_cuda_swiglu(st, T, in.hdr, ctx->gu, ctx->h, L->wdown.dt, hp->n_ff));
        } else { /* wgu is up alone */
            KG_TRY(kg_cuda_bert_gelu(st, T, ctx->gu, L->up_b, ctx->gelu_table, ctx->h, L->wdown.dt,
                                     hp->n_ff));
        }
        KG_TRY(kg_cuda_gemm(&ctx->blas, st, &L->wdown, ctx->h, ctx->tmp, T));
        /* the next layer's Q|K|V GEMM reads xn; after the last, nothing */
        KG_TRY(kg_cuda_bert_add_norm(st, T, ctx->tmp, L->down_b, L->ffn_norm, L->ffn_norm_b, ctx->x,
                                     il + 1 < NL ? ctx->xn : NULL,
                                     il + 1 < NL ? ctx->layers[il + 1].wqkv.dt : KG_CUDA_F32, E,
                                     hp->norm_eps));
    }
    if (batch->n_hidden > 0) {
        KG_TRY(cuda_copy_hidden(ctx, batch, ctx->x));
    }
    return KG_OK;
}

kg_status_t cuda_bert_init(cuda_ctx_t *ctx) {
    const kg_hparams_t *hp = &ctx->hp;
    if (hp->arch != KG_ARCH_NOMIC_BERT) {
        return KG_OK;
    }
    /* cpu_bert_init's table, by the same function and arguments: no YaRN
     * ramp unless rope.scaling.type says yarn (llama_context's cparams) */
    const size_t n = (size_t)ctx->max_tokens * (size_t)hp->n_rot;
    float *cs = (float *)malloc(n * sizeof(float));
    if (!cs) {
        KG_LOG_ERROR("cuda", "out of host memory");
        return KG_ERR_NOMEM;
    }
    float corr[2];
    kg_rope_yarn_corr_dims(hp->n_rot, hp->n_ctx_orig, hp->rope_base, hp->yarn_beta_fast,
                           hp->yarn_beta_slow, corr);
    for (int32_t p = 0; p < ctx->max_tokens; p++) {
        float *row = cs + (size_t)p * (size_t)hp->n_rot;
        kg_rope_cache_yarn(p, hp->n_rot, hp->rope_base, hp->rope_scale, NULL, hp->yarn_ext_factor,
                           hp->yarn_attn_factor, corr, row, row + hp->n_rot / 2);
    }
    const cudaError_t err = cudaMemcpy(ctx->rope_cs, cs, n * sizeof(float), cudaMemcpyHostToDevice);
    free(cs);
    KG_CUDA_CHECK(err);
    return KG_OK;
}

kg_status_t cuda_bert_forward(cuda_ctx_t *ctx, const kg_step_batch_t *batch) {
    KG_TRY(bert_pack(ctx, batch));
    if (bert_run(ctx, batch) != KG_OK) {
        return cuda_mark_dead(ctx, "a bert step");
    }
    return KG_OK;
}
