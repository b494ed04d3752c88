/* lora-steps: the CPU backend's steps with LoRA adapters against the same
 * steps on the base, interleaved step by step in one process (scripts/bench-lora
 * --steps builds and runs it), so that a shared machine's load, which
 * swings whole-process figures by tens of percent from run to run, falls
 * on both alike.
 *
 * One round: a prefill of N sequences of P tokens each (one step), then D
 * decode steps of the N sequences; every step runs twice, on the base
 * alone and with sequence i on adapter i % A (the order of the two swapped
 * every step), each timed by this thread's CPU clock (with one thread the
 * backend computes on the calling thread; with more, the process's CPU
 * clock is used) and the wall clock. Prints per round the base's and the
 * adapters' seconds and their ratio base / adapters (the adapters'
 * throughput as a fraction of the base's, both doing the same tokens;
 * also for the prefill step and the decode steps apart), then the medians
 * over the rounds (after a warm-up round that is not counted).
 *
 * Usage: lora-steps BASE.gguf THREADS ROUNDS N P D ADAPTER.gguf... */
#include "backend/kg_backend.h"
#include "model/kg_lora.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ADAPT 64

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: lora-steps BASE.gguf THREADS ROUNDS N P D ADAPTER.gguf...\n");
        return 2;
    }
    const int threads = atoi(argv[2]), rounds = atoi(argv[3]), N = atoi(argv[4]), P = atoi(argv[5]),
              D = atoi(argv[6]);
    const int A = argc - 7;
    if (threads < 1 || rounds < 1 || N < 1 || P < 1 || D < 0 || A > MAX_ADAPT) {
        fprintf(stderr, "lora-steps: bad arguments\n");
        return 2;
    }
    char err[512];
    kg_model_t *m = kg_model_load(argv[1], err, sizeof(err));
    if (!m) {
        fprintf(stderr, "lora-steps: %s\n", err);
        return 1;
    }
    const int block = 16, per_seq = (P + D + block - 1) / block;
    kg_backend_params_t bp = {.n_threads = threads,
                              .n_kv_blocks = N * per_seq,
                              .kv_block_size = block,
                              .max_batch_tokens = N * P,
                              .max_seq_len = per_seq * block};
    kg_backend_t *be = kg_backend_cpu_new(m, &bp, err, sizeof(err));
    if (!be) {
        fprintf(stderr, "lora-steps: %s\n", err);
        return 1;
    }
    kg_lora_t *loras[MAX_ADAPT];
    int32_t ids[MAX_ADAPT];
    for (int a = 0; a < A; a++) {
        loras[a] = kg_lora_load(argv[7 + a], m, err, sizeof(err));
        ids[a] = -1;
        if (!loras[a] || kg_backend_lora_add(be, loras[a], &ids[a], err, sizeof(err)) != KG_OK) {
            fprintf(stderr, "lora-steps: %s: %s\n", argv[7 + a], err);
            return 1;
        }
    }
    const size_t T = (size_t)N * (size_t)P;
    int32_t *token = malloc(T * sizeof(int32_t)), *pos = malloc(T * sizeof(int32_t)),
            *seq = malloc(T * sizeof(int32_t)), *table = malloc((size_t)N * per_seq * 4);
    bool *want = malloc(T * sizeof(bool));
    float *logits = malloc((size_t)N * (size_t)m->hp.n_vocab * sizeof(float));
    kg_lora_set_t *sets = calloc((size_t)N, sizeof(*sets));
    double *rb = malloc((size_t)rounds * sizeof(double)),
           *rl = malloc((size_t)rounds * sizeof(double));
    double *rr = malloc((size_t)rounds * sizeof(double)),
           *rw = malloc((size_t)rounds * sizeof(double));
    if (!token || !pos || !seq || !table || !want || !logits || !sets || !rb || !rl || !rr || !rw) {
        fprintf(stderr, "lora-steps: out of memory\n");
        return 1;
    }
    for (int i = 0; i < N * per_seq; i++) {
        table[i] = i;
    }
    for (int s = 0; s < N; s++) {
        sets[s].n = A > 0 ? 1 : 0;
        sets[s].id[0] = A > 0 ? ids[s % A] : 0;
        sets[s].scale[0] = 1.0f;
    }
    const clockid_t cpu = threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
    uint64_t x = 1;
    /* round -1 is a warm-up, not counted: the first steps fault in the KV
     * pool's and the scratch's pages */
    for (int r = -1; r < rounds; r++) {
        double t_base = 0, t_lora = 0, w_base = 0, w_lora = 0, pf_base = 0, pf_lora = 0;
        for (int step = 0; step <= D; step++) {
            /* step 0: the prefill of every sequence; then one token each */
            const int n_tok = step == 0 ? P : 1, p0 = step == 0 ? 0 : P + step - 1;
            int32_t n = 0;
            for (int s = 0; s < N; s++) {
                for (int i = 0; i < n_tok; i++) {
                    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                    token[n] = (int32_t)((x >> 33) % (uint64_t)(m->hp.n_vocab - 1)) + 1;
                    pos[n] = p0 + i;
                    seq[n] = s;
                    want[n] = i == n_tok - 1;
                    n++;
                }
            }
            kg_step_batch_t b = {.n_tokens = n,
                                 .token = token,
                                 .pos = pos,
                                 .seq = seq,
                                 .want_logits = want,
                                 .n_outputs = N,
                                 .n_slots = N,
                                 .max_blocks_per_seq = per_seq,
                                 .block_table = table};
            for (int k = 0; k < 2; k++) {
                const bool lora = (k + step) % 2 == 1;
                b.slot_lora = lora ? sets : NULL;
                const double c0 = now(cpu), w0 = now(CLOCK_MONOTONIC);
                if (kg_backend_forward(be, &b, logits) != KG_OK) {
                    fprintf(stderr, "lora-steps: a step failed\n");
                    return 1;
                }
                const double c = now(cpu) - c0, w = now(CLOCK_MONOTONIC) - w0;
                *(lora ? &t_lora : &t_base) += c;
                *(lora ? &w_lora : &w_base) += w;
                if (step == 0) {
                    *(lora ? &pf_lora : &pf_base) += c;
                }
            }
        }
        if (r < 0) {
            continue;
        }
        rb[r] = t_base;
        rl[r] = t_lora;
        rr[r] = t_base / t_lora;
        rw[r] = w_base / w_lora;
        printf("round %d: base %.3f s, %d adapters %.3f s (CPU); ratio %.3f (CPU), %.3f (wall); "
               "prefill alone %.3f, decode alone %.3f (CPU)\n",
               r + 1, t_base, A, t_lora, rr[r], rw[r], pf_base / pf_lora,
               (t_base - pf_base) / (t_lora - pf_lora));
        fflush(stdout);
    }
    const double mb = median(rb, rounds), ml = median(rl, rounds);
    printf("median of %d: base %.3f s, adapters %.3f s; ratio base/adapters %.3f (CPU), %.3f "
           "(wall)\n",
           rounds, mb, ml, median(rr, rounds), median(rw, rounds));
    kg_backend_free(be);
    for (int a = 0; a < A; a++) {
        kg_lora_free(loras[a]);
    }
    kg_model_free(m);
    free(token);
    free(pos);
    free(seq);
    free(table);
    free(want);
    free(logits);
    free(sets);
    free(rb);
    free(rl);
    free(rr);
    free(rw);
    return 0;
}
