/* check_cuda_recurrent: the hybrid families' recurrent layers on the CUDA
 * backend (gpu/recurrent.cu, the states in device memory) against the CPU
 * backend, per family on a tiny `kgen mkmodel` model (F32):
 *  - vs_cpu: two sequences' prompts in one step, then decode steps of both
 *    (CUDA graphs): every logits row within the NMSE bound of check_cuda's
 *    F32 families (1e-6) of the CPU's;
 *  - chunks: a prompt prefilled in one step and in chunks (one of them
 *    beside another sequence's tokens), then decoded: the same logits bits
 *    (the recurrences run token by token in prefill as in decode);
 *  - fork_snapshot: forks (kg_backend_state_copy) and a restored snapshot
 *    (kg_backend_state_save/_restore) give the bits of recomputing the
 *    prefix; kg_backend_memory counts the states and snapshots;
 *  - position_contract: a token that does not continue its slot's state
 *    fails that slot alone (KG_FAULT_SEQ), and position 0 starts over.
 * Every hybrid family kgen runs has CUDA kernels now (nemotron_h_moe, the
 * last refused by name, included). Runs on a GPU, or on the CPU under scripts/gpu-emulate (tcase
 * "recurrent").
 *
 * Needs a CUDA device: exits 77 (skipped) when the build has no CUDA
 * backend or no device is visible. */
#include "check_common.h"

#ifndef KG_USE_CUDA

#include <stdio.h>

int main(void) {
    fprintf(stderr, "check_cuda_recurrent: built without the CUDA backend, skipping\n");
    return 77;
}

#else

#include "../../gpu/kg_backend_cuda.h"
#include "backend/kg_backend.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK       16
#define MAX_BLK_SEQ 8 /* 128 positions a slot */
#define N_SLOTS     6
#define N_BLOCKS    (N_SLOTS * MAX_BLK_SEQ)
#define MAX_TOKENS  64
#define F32_BOUND   1e-6

typedef struct family {
    const char *name;
    const char *args; /* kgen mkmodel's, tiny */
    /* also chunks and fork_snapshot (one family per kind of recurrence:
     * every emulated second counts against CI's budget) */
    bool deep;
} family_t;

/* one row per family the CUDA backend runs */
static const family_t k_families[] = {
    /* short convolutions at layers 0 and 1, attention at 2 */
    {"lfm2",
     "--arch lfm2 --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 96 --ctx 256 "
     "--seed 61 --type f32",
     true},
    /* lfm2's layers, layer 0's FFN dense, 1 and 2 experts behind the sigmoid router and
     * its selection bias */
    {"lfm2moe",
     "--arch lfm2moe --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 96 "
     "--n-expert 4 --n-expert-used 2 --n-ff-exp 32 --ctx 256 --seed 81 --type f32",
     false},
    /* DeltaNet at 0 to 2 (2 K heads, 4 V heads of 16: V head h reads K head h mod 2), gated
     * attention at 3 */
    {"qwen35",
     "--arch qwen35 --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 96 --ctx 256 "
     "--seed 71 --type f32",
     false},
    /* qwen35's layers with experts and the gated shared expert */
    {"qwen35moe",
     "--arch qwen35moe --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 96 "
     "--n-expert 4 --n-expert-used 2 --n-ff-exp 32 --ctx 256 --seed 75 --type f32",
     false},
    /* ssm_ba, V heads grouped by K head (h / 2) */
    {"qwen3next",
     "--arch qwen3next --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 96 "
     "--n-expert 4 --n-expert-used 2 --n-ff-exp 32 --ctx 256 --seed 76 --type f32",
     true},
    /* Mamba-2 at layers 0 and 1, attention (NoPE) at 2, Granite's multipliers */
    {"granitehybrid",
     "--arch granitehybrid --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 96 "
     "--ctx 256 --seed 71 --type f32",
     false},
    /* granitehybrid's layers with experts (softmax router, renormalised) and the ungated
     * shared expert, Granite's multipliers round both */
    {"granitehybrid-moe",
     "--arch granitehybrid --n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --n-ff 32 "
     "--n-expert 4 --n-expert-used 2 --ctx 256 --seed 91 --type f32",
     false},
    /* Mamba-2, MLP (squared ReLU, no mixer), Mamba-2, attention (NoPE, no FFN) */
    {"nemotron_h",
     "--arch nemotron_h --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 96 --ctx 256 "
     "--seed 72 --type f32",
     false},
    /* nemotron_h's layers, the MLP layer's FFN experts without a gate (up, squared ReLU,
     * down) behind the sigmoid router and its selection bias, beside the ungated shared
     * expert */
    {"nemotron_h_moe",
     "--arch nemotron_h_moe --n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 96 "
     "--n-expert 4 --n-expert-used 2 --n-ff-exp 32 --ctx 256 --seed 73 --type f32",
     false},
};
#define N_FAMILIES  ((int)(sizeof(k_families) / sizeof(k_families[0])))

/* the i-th row with `deep` set (the loop tests over those rows alone) */
static int n_deep(void) {
    int n = 0;
    for (int i = 0; i < N_FAMILIES; i++) {
        n += k_families[i].deep ? 1 : 0;
    }
    return n;
}

static const family_t *nth_deep(int i) {
    for (int r = 0; r < N_FAMILIES; r++) {
        if (k_families[r].deep && i-- == 0) {
            return &k_families[r];
        }
    }
    ck_abort_msg("no deep row %d", i);
    return NULL;
}

static kg_model_t *make_model(const char *args) {
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.gguf", kg_test_tmp_path("cuda-recurrent"));
    ck_assert_msg(kg_test_mkmodel(path, args) == 0, "kgen mkmodel %s failed", args);
    kg_model_t *m = kg_model_load(path, err, sizeof(err));
    ck_assert_msg(m != NULL, "%s", err);
    remove(path);
    return m;
}

/* n_seq_slots below N_SLOTS: the CUDA backend grows its states (and drops
 * its graphs) when a step or a copy names a later slot */
static kg_backend_t *make_backend(const char *name, const kg_model_t *m, int32_t n_snaps) {
    kg_backend_params_t p = {.n_threads = 2,
                             .n_kv_blocks = N_BLOCKS,
                             .kv_block_size = BLOCK,
                             .max_batch_tokens = MAX_TOKENS,
                             .max_seq_len = MAX_BLK_SEQ * BLOCK,
                             .n_seq_slots = 2,
                             .n_state_snapshots = n_snaps};
    char err[512] = "";
    /* through the registry, so its check of what CUDA runs is tested too */
    kg_backend_t *be = kg_backend_new(name, m, &p, err, sizeof(err));
    ck_assert_msg(be != NULL, "%s backend: %s", name, err);
    ck_assert_str_eq(kg_backend_name(be), name);
    ck_assert(kg_backend_has_state(be));
    return be;
}

/* One step under construction, and every slot's block table (slot s owns
 * blocks s * MAX_BLK_SEQ.. unless a fork shares its source's). */
typedef struct step {
    int32_t n, n_out;
    int32_t tok[MAX_TOKENS], pos[MAX_TOKENS], seq[MAX_TOKENS];
    bool want[MAX_TOKENS];
} step_t;

static int32_t g_table[N_SLOTS * MAX_BLK_SEQ];
static int32_t g_n_slots = N_SLOTS; /* the steps' n_slots */

static void tables_reset(void) {
    for (int32_t i = 0; i < N_SLOTS * MAX_BLK_SEQ; i++) {
        g_table[i] = i;
    }
}

/* slot dst reads src's blocks before position `pos` (a fork's prefix) */
static void table_share(int32_t src, int32_t dst, int32_t pos) {
    for (int32_t b = 0; b < pos / BLOCK; b++) {
        g_table[dst * MAX_BLK_SEQ + b] = g_table[src * MAX_BLK_SEQ + b];
    }
}

/* tokens tok[0..n) of slot s at positions p0.. into the step; the last
 * wants logits when `last`, every one when `all` */
static void add(step_t *st, int32_t s, const int32_t *tok, int32_t n, int32_t p0, bool all) {
    for (int32_t i = 0; i < n; i++) {
        ck_assert_int_lt(st->n, MAX_TOKENS);
        st->tok[st->n] = tok[i];
        st->pos[st->n] = p0 + i;
        st->seq[st->n] = s;
        st->want[st->n] = all || i == n - 1;
        st->n_out += st->want[st->n] ? 1 : 0;
        st->n++;
    }
}

static kg_status_t run(kg_backend_t *be, const step_t *st, float *logits) {
    kg_step_batch_t b = {.n_tokens = st->n,
                         .token = st->tok,
                         .pos = st->pos,
                         .seq = st->seq,
                         .want_logits = st->want,
                         .n_outputs = st->n_out,
                         .n_slots = g_n_slots,
                         .max_blocks_per_seq = MAX_BLK_SEQ,
                         .block_table = g_table};
    return kg_backend_forward(be, &b, logits);
}

static void run_ok(kg_backend_t *be, const step_t *st, float *logits) {
    ck_assert_int_eq(run(be, st, logits), KG_OK);
}

static void prompt(int32_t *tok, int32_t n, int32_t n_vocab, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        tok[i] = (int32_t)((seed >> 8) % (uint32_t)n_vocab);
    }
}

static double nmse(const float *ref, const float *got, int32_t n) {
    double num = 0.0, den = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? num / den : num;
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        best = v[i] > v[best] ? i : best;
    }
    return best;
}

static void same_bits(const float *a, const float *b, int32_t n, const char *what) {
    ck_assert_msg(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "%s: logits bits differ (%g vs %g)",
                  what, (double)a[argmax(a, n)], (double)b[argmax(b, n)]);
}

START_TEST(vs_cpu) {
    const family_t *f = &k_families[_i];
    kg_model_t *m = make_model(f->args);
    const int32_t V = m->hp.n_vocab;
    kg_backend_t *cpu = make_backend("cpu", m, 0), *gpu = make_backend("cuda", m, 0);
    float *lc = malloc(2 * (size_t)V * sizeof(float)), *lg = malloc(2 * (size_t)V * sizeof(float));
    int32_t p0[13], p1[7], next[2];
    prompt(p0, 13, V, 1);
    prompt(p1, 7, V, 2);
    tables_reset();
    step_t st = {0};
    add(&st, 0, p0, 13, 0, false);
    add(&st, 3, p1, 7, 0, false); /* a slot past n_seq_slots: the states grow */
    int32_t len[2] = {13, 7};
    double worst = 0.0;
    g_n_slots = 4;
    for (int k = 0; k < 5; k++) {
        /* more slots once the decode graph is captured: the states grow
         * again and the graphs holding the old buffer are captured anew */
        g_n_slots = k == 3 ? N_SLOTS : g_n_slots;
        run_ok(cpu, &st, lc);
        run_ok(gpu, &st, lg);
        for (int r = 0; r < 2; r++) {
            const double e = nmse(lc + (size_t)r * V, lg + (size_t)r * V, V);
            worst = e > worst ? e : worst;
            ck_assert_msg(e < F32_BOUND, "%s step %d row %d: nmse %g", f->name, k, r, e);
            next[r] = argmax(lc + (size_t)r * V, V); /* both decode the CPU's pick */
        }
        /* decode: both slots one token each, every token wanting logits (a
         * graph on CUDA) */
        memset(&st, 0, sizeof(st));
        add(&st, 0, &next[0], 1, len[0]++, true);
        add(&st, 3, &next[1], 1, len[1]++, true);
    }
    kg_backend_counters_t c;
    kg_backend_counters(gpu, &c);
    ck_assert_int_ge(c.graphs_captured, 2); /* the bucket of 2 rows, twice */
    fprintf(stderr, "check_cuda_recurrent: %s: cuda against cpu, worst logits nmse %.3g\n", f->name,
            worst);
    free(lc), free(lg);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

/* prompt of 24 then 2 greedy tokens on slot `s`: prefilled in one step, or
 * in chunks of 7, 1, 9 and 7 (the 9 beside slot 5's prompt); out gets the
 * last prefill row and the two decode rows */
static void
prefill_decode(kg_backend_t *be, int32_t s, const int32_t *p, int32_t V, bool chunked, float *out) {
    static const int32_t cuts[] = {7, 1, 9, 7};
    step_t st = {0};
    if (!chunked) {
        add(&st, s, p, 24, 0, false);
        run_ok(be, &st, out);
    } else {
        int32_t at = 0;
        float *tmp = malloc(2 * (size_t)V * sizeof(float));
        for (int i = 0; i < 4; i++) {
            memset(&st, 0, sizeof(st));
            int32_t other[5];
            prompt(other, 5, V, 99);
            if (i == 2) {
                add(&st, 5, other, 5, 0, false);
            }
            add(&st, s, p + at, cuts[i], at, false);
            run_ok(be, &st, tmp);
            at += cuts[i];
        }
        memcpy(out, tmp + (size_t)(st.n_out - 1) * V, (size_t)V * sizeof(float));
        free(tmp);
    }
    for (int32_t k = 0; k < 2; k++) {
        const int32_t tok = argmax(out + (size_t)k * V, V);
        memset(&st, 0, sizeof(st));
        add(&st, s, &tok, 1, 24 + k, true);
        run_ok(be, &st, out + (size_t)(k + 1) * V);
    }
}

START_TEST(chunks) {
    const family_t *f = nth_deep(_i);
    kg_model_t *m = make_model(f->args);
    const int32_t V = m->hp.n_vocab;
    kg_backend_t *gpu = make_backend("cuda", m, 0);
    float *whole = malloc(3 * (size_t)V * sizeof(float)),
          *cut = malloc(3 * (size_t)V * sizeof(float));
    int32_t p[24];
    prompt(p, 24, V, 3);
    tables_reset();
    prefill_decode(gpu, 0, p, V, false, whole);
    prefill_decode(gpu, 1, p, V, true, cut);
    for (int k = 0; k < 3; k++) {
        char what[64];
        snprintf(what, sizeof(what), "%s %s", f->name, k == 0 ? "prefill" : "decode");
        same_bits(whole + (size_t)k * V, cut + (size_t)k * V, V, what);
    }
    free(whole), free(cut);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

START_TEST(fork_snapshot) {
    const family_t *f = nth_deep(_i);
    kg_model_t *m = make_model(f->args);
    const int32_t V = m->hp.n_vocab, P = BLOCK;
    kg_backend_t *gpu = make_backend("cuda", m, 2);
    ck_assert_int_eq(kg_backend_state_snapshots(gpu), 2);
    float *l = malloc(4 * (size_t)V * sizeof(float)), *ref = malloc((size_t)V * sizeof(float));
    int32_t p[BLOCK + 4];
    prompt(p, P + 4, V, 4);
    const int32_t a = p[P], b = p[P + 1], c = p[P + 2];
    tables_reset();
    step_t st = {0};
    add(&st, 0, p, P, 0, false);
    run_ok(gpu, &st, l);
    ck_assert_int_eq(kg_backend_state_save(gpu, 0, 0), KG_OK);
    /* forks: slots 1 and 2 from slot 0, reading its prompt's blocks */
    const int32_t src[2] = {0, 0}, dst[2] = {1, 2};
    ck_assert_int_eq(kg_backend_state_copy(gpu, src, dst, 2), KG_OK);
    table_share(0, 1, P);
    table_share(0, 2, P);
    memset(&st, 0, sizeof(st));
    add(&st, 0, &a, 1, P, true);
    add(&st, 1, &b, 1, P, true);
    add(&st, 2, &a, 1, P, true);
    run_ok(gpu, &st, l);
    same_bits(l, l + 2 * (size_t)V, V, "fork (the source's token)");
    /* recomputed: slot 3, the prompt and b in one step */
    memset(&st, 0, sizeof(st));
    int32_t pb[BLOCK + 1];
    memcpy(pb, p, (size_t)P * sizeof(int32_t));
    pb[P] = b;
    add(&st, 3, pb, P + 1, 0, false);
    run_ok(gpu, &st, ref);
    same_bits(ref, l + (size_t)V, V, "fork against recomputing");
    /* slot 0 goes on; then snapshot 0 back into it, and into slot 4 */
    for (int32_t k = 1; k < 4; k++) {
        memset(&st, 0, sizeof(st));
        add(&st, 0, &p[P + k], 1, P + k, true);
        run_ok(gpu, &st, l);
    }
    ck_assert_int_eq(kg_backend_state_restore(gpu, 0, 0), KG_OK);
    ck_assert_int_eq(kg_backend_state_restore(gpu, 0, 4), KG_OK);
    table_share(0, 4, P);
    memset(&st, 0, sizeof(st));
    add(&st, 0, &c, 1, P, true);
    add(&st, 4, &c, 1, P, true);
    run_ok(gpu, &st, l);
    memset(&st, 0, sizeof(st));
    pb[P] = c;
    add(&st, 5, pb, P + 1, 0, false);
    run_ok(gpu, &st, ref);
    same_bits(ref, l, V, "restored snapshot against recomputing");
    same_bits(ref, l + (size_t)V, V, "snapshot restored into another slot");
    ck_assert_int_eq(kg_backend_state_save(gpu, 0, 2), KG_ERR_INVALID);
    kg_backend_memory_t mem;
    kg_backend_memory(gpu, &mem);
    const size_t per = kg_backend_state_bytes_per_seq(m);
    ck_assert_uint_gt(per, 0);
    ck_assert_uint_eq(mem.state_size, N_SLOTS * per);
    ck_assert_uint_eq(mem.snapshot_size, 2 * per);
    free(l), free(ref);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

START_TEST(position_contract) {
    const family_t *f = &k_families[_i];
    kg_model_t *m = make_model(f->args);
    const int32_t V = m->hp.n_vocab;
    kg_backend_t *gpu = make_backend("cuda", m, 0);
    float *l = malloc(2 * (size_t)V * sizeof(float)), *first = malloc((size_t)V * sizeof(float));
    int32_t p[8];
    prompt(p, 8, V, 5);
    tables_reset();
    step_t st = {0};
    add(&st, 0, p, 5, 0, false);
    run_ok(gpu, &st, first);
    /* a gap: slot 0's state is at 5 */
    memset(&st, 0, sizeof(st));
    add(&st, 1, p, 2, 0, false);
    add(&st, 0, &p[5], 1, 7, true);
    ck_assert_int_eq(run(gpu, &st, l), KG_ERR_INVALID);
    kg_backend_fault_t fault;
    kg_backend_last_fault(gpu, KG_ERR_INVALID, &fault);
    ck_assert_int_eq(fault.scope, KG_FAULT_SEQ);
    ck_assert_int_eq(fault.seq, 0);
    /* the backend goes on: the right position works, position 0 starts over */
    memset(&st, 0, sizeof(st));
    add(&st, 0, &p[5], 1, 5, true);
    run_ok(gpu, &st, l);
    memset(&st, 0, sizeof(st));
    add(&st, 0, p, 5, 0, false);
    run_ok(gpu, &st, l);
    same_bits(first, l, V, "a sequence started over");
    free(l), free(first);
    kg_backend_free(gpu);
    kg_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("cuda_recurrent");
    TCase *tc = tcase_create("recurrent");
    tcase_set_tags(tc, "gpu");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, vs_cpu, 0, N_FAMILIES);
    tcase_add_loop_test(tc, chunks, 0, n_deep());
    tcase_add_loop_test(tc, fork_snapshot, 0, n_deep());
    tcase_add_loop_test(tc, position_contract, 0, 1); /* the host's check: one family */
    suite_add_tcase(s, tc);
    return s;
}

/* Unforked, as check_cuda (a forked child cannot use the driver its parent
 * initialised). */
int main(void) {
    if (!kg_backend_cuda_available()) {
        fprintf(stderr, "check_cuda_recurrent: no CUDA device visible, skipping\n");
        return 77;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
