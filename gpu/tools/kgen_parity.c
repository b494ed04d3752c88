/* kgen-parity: the CUDA backend against the CPU backend on one model, the
 * way scripts/gpu-check proves parity at a real shape.
 *
 * B sequences (their context lengths given by --contexts, not a power of
 * two) are admitted a few steps apart and run by a small engine-like
 * schedule: every step carries one decode token of each sequence past its
 * prompt, then prefill chunks up to --chunk tokens, so steps mix prefill
 * and decode. Both backends run every step on the same inputs (the same
 * block tables, the same tokens). For every output row:
 *   - logits NMSE of the CUDA row against the CPU row;
 *   - greedy rows (even sequences): the argmax of both; a difference counts
 *     as a failure only when the CPU's top two logits are further apart
 *     than --margin times the row's RMS error (a near tie can flip on
 *     rounding alone, which is not a defect);
 *   - sampled rows (odd sequences, seeded, temperature 0.8, top-p 0.95,
 *     top-k 40 on every third): the device sampler against kg_sampler_sample
 *     on the same (device) logits with the same RNG state, which must agree
 *     (--min-sampled-agree: a draw may differ only where u falls within
 *     expf's last bit of a boundary); the end-to-end agreement (CPU logits
 *     and sampler against device logits and sampler) is reported too.
 * Both sides then continue with the CPU's token, so the runs stay in step.
 * Prints one JSON object; exits 1 when the NMSE bound is exceeded or a
 * greedy pick differs without a near tie, 2 on a setup error.
 *
 * --kv-type q8_0 gives the CUDA backend a Q8_0 KV pool (the CPU keeps
 * f16): the NMSE is then the quantized cache's error as well.
 *
 * usage: kgen-parity --model FILE [--contexts 4096,1500,700,300,97]
 *        [--gen 16] [--chunk 512] [--nmse-max 1e-3] [--margin 8]
 *        [--min-sampled-agree 0.95] [--threads N] [--seed S] [--kv-type f16|q8_0] */
#include "backend/kg_backend.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "engine/kg_backend_registry.h"
#include "model/kg_model.h"
#include "model/kg_sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQS 64
#define BS       16

typedef struct seq {
    int32_t n_ctx;    /* prompt + generated tokens it ends with */
    int32_t n_prompt; /* n_ctx - gen */
    int32_t *tokens;  /* (n_ctx) */
    int32_t n_tokens; /* known tokens: the prompt, then what was picked */
    int32_t n_done;   /* tokens whose K/V are in the cache */
    int32_t start;    /* step at which it is admitted */
    bool sampled;
    kg_sampling_params_t sp;
    kg_rng_t rng_cpu, rng_gpu, rng_before;
} seq_t;

typedef struct opts {
    const char *model;
    int32_t contexts[MAX_SEQS];
    int n_seqs;
    int32_t gen, chunk, threads;
    double nmse_max, margin, min_agree;
    uint64_t seed;
    kg_kv_type_t kv_type; /* the CUDA backend's pool */
} opts_t;

static int parse_list(const char *s, int32_t *out, int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max;
         t = strtok_r(NULL, ",", &save)) {
        out[n++] = atoi(t);
    }
    return n;
}

static int usage(void) {
    fprintf(stderr, "usage: kgen-parity --model FILE [--contexts L1,L2,...] [--gen N] "
                    "[--chunk T] [--nmse-max X] [--margin K] [--min-sampled-agree F] "
                    "[--threads N] [--seed S] [--kv-type f16|q8_0]\n");
    return 2;
}

static double nmse(const float *ref, const float *got, int32_t n, double *rms) {
    double num = 0, den = 0;
    for (int32_t i = 0; i < n; i++) {
        const double d = (double)ref[i] - got[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    *rms = sqrt(num / n);
    return den > 0 ? num / den : num;
}

static int32_t argmax2(const float *l, int32_t n, float *gap) {
    int32_t a = 0, b = -1;
    for (int32_t i = 1; i < n; i++) {
        if (l[i] > l[a]) {
            b = a;
            a = i;
        } else if (b < 0 || l[i] > l[b]) {
            b = i;
        }
    }
    *gap = b >= 0 ? l[a] - l[b] : INFINITY;
    return a;
}

int main(int argc, char **argv) {
    opts_t o = {.gen = 16,
                .chunk = 512,
                .threads = 0,
                .nmse_max = 1e-3,
                .margin = 8.0,
                .min_agree = 0.95,
                .seed = 1};
    o.n_seqs = parse_list("4096,1500,700,300,97", o.contexts, MAX_SEQS);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            return usage();
        }
        if (!strcmp(a, "--model")) {
            o.model = v;
        } else if (!strcmp(a, "--contexts")) {
            o.n_seqs = parse_list(v, o.contexts, MAX_SEQS);
        } else if (!strcmp(a, "--gen")) {
            o.gen = atoi(v);
        } else if (!strcmp(a, "--chunk")) {
            o.chunk = atoi(v);
        } else if (!strcmp(a, "--nmse-max")) {
            o.nmse_max = atof(v);
        } else if (!strcmp(a, "--margin")) {
            o.margin = atof(v);
        } else if (!strcmp(a, "--min-sampled-agree")) {
            o.min_agree = atof(v);
        } else if (!strcmp(a, "--threads")) {
            o.threads = atoi(v);
        } else if (!strcmp(a, "--seed")) {
            o.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--kv-type")) {
            if (kg_kv_type_parse(v, &o.kv_type) != KG_OK) {
                return usage();
            }
        } else {
            return usage();
        }
        i++;
    }
    if (!o.model || o.n_seqs < 1 || o.gen < 1 || o.chunk < o.n_seqs) {
        return usage();
    }
    kg_log_setup(KG_LOG_LEVEL_WARN, KG_LOG_FORMAT_LOGFMT);
    char err[512] = "";
    kg_model_t *m = kg_model_load(o.model, err, sizeof(err));
    if (!m) {
        fprintf(stderr, "kgen-parity: %s\n", err);
        return 2;
    }
    const int32_t V = m->hp.n_vocab;
    int32_t max_ctx = 0, n_blocks = 0;
    seq_t seqs[MAX_SEQS];
    memset(seqs, 0, sizeof(seqs));
    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 7;
    for (int s = 0; s < o.n_seqs; s++) {
        seq_t *q = &seqs[s];
        q->n_ctx = o.contexts[s] > o.gen + 1 ? o.contexts[s] : o.gen + 2;
        q->n_prompt = q->n_ctx - o.gen;
        q->tokens = malloc((size_t)q->n_ctx * sizeof(int32_t));
        for (int32_t i = 0; i < q->n_prompt; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            q->tokens[i] = (int32_t)((rng >> 33) % (uint64_t)V);
        }
        q->n_tokens = q->n_prompt;
        q->start = 2 * s; /* admitted two steps apart: mixed steps */
        q->sampled = s % 2 == 1;
        q->sp = kg_sampling_params_default();
        if (q->sampled) {
            q->sp.temperature = 0.8f;
            q->sp.top_p = 0.95f;
            q->sp.top_k = s % 3 == 0 ? 40 : 0;
            q->sp.seed = o.seed + (uint64_t)s;
        }
        kg_rng_seed(&q->rng_cpu, q->sp.seed);
        q->rng_gpu = q->rng_cpu;
        max_ctx = q->n_ctx > max_ctx ? q->n_ctx : max_ctx;
        n_blocks += (q->n_ctx + BS - 1) / BS;
    }
    const int32_t mb = (max_ctx + BS - 1) / BS;
    int32_t *table = malloc((size_t)o.n_seqs * (size_t)mb * sizeof(int32_t));
    /* blocks handed out interleaved, so no table is contiguous */
    for (int32_t j = 0, k = 0; j < mb; j++) {
        for (int q = 0; q < o.n_seqs; q++) {
            table[q * mb + j] = j < (seqs[q].n_ctx + BS - 1) / BS ? k++ : -1;
        }
    }
    kg_backend_params_t bp = {.n_threads = o.threads,
                              .n_kv_blocks = n_blocks,
                              .kv_block_size = BS,
                              .max_batch_tokens = o.chunk};
    kg_backend_t *cpu = kg_backend_new("cpu", m, &bp, err, sizeof(err));
    bp.kv_type = o.kv_type;
    kg_backend_t *gpu = cpu ? kg_backend_new("cuda", m, &bp, err, sizeof(err)) : NULL;
    if (!cpu || !gpu) {
        fprintf(stderr, "kgen-parity: %s\n", err);
        return 2;
    }
    float *lc = malloc((size_t)o.chunk * (size_t)V * sizeof(float));
    float *lg = malloc((size_t)o.chunk * (size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)o.chunk * sizeof(int32_t)), *pos = malloc((size_t)o.chunk * 4);
    int32_t *sq = malloc((size_t)o.chunk * 4), *row_seq = malloc((size_t)o.chunk * 4);
    bool *want = malloc((size_t)o.chunk);
    kg_sampler_scratch_t *sc = kg_sampler_scratch_new(V);
    kg_sample_request_t *reqs = calloc((size_t)o.chunk, sizeof(*reqs));
    kg_sample_result_t *res = calloc((size_t)o.chunk, sizeof(*res));
    if (!lc || !lg || !table || !tok || !pos || !sq || !row_seq || !want || !sc || !reqs || !res) {
        fprintf(stderr, "kgen-parity: out of memory\n");
        return 2;
    }

    int64_t rows = 0, greedy_rows = 0, greedy_equal = 0, greedy_fail = 0, sampled_rows = 0,
            sampled_equal = 0, sampled_e2e = 0, steps = 0, mixed_steps = 0, prefill_tokens = 0,
            decode_tokens = 0;
    double nmse_max = 0, nmse_sum = 0, t_cpu = 0, t_gpu = 0;
    char first_fail[256] = "";
    for (int32_t step = 0;; step++) {
        int32_t T = 0, n_out = 0;
        bool busy = false, has_decode = false, has_prefill = false;
        /* decodes first, then prefill chunks, as the engine builds a step */
        for (int pass = 0; pass < 2; pass++) {
            for (int s = 0; s < o.n_seqs; s++) {
                seq_t *q = &seqs[s];
                if (q->n_tokens >= q->n_ctx) {
                    continue; /* every token it needs is known */
                }
                busy = true;
                const bool decode = q->n_done >= q->n_prompt;
                if (step < q->start || (pass == 0) != decode || T == o.chunk) {
                    continue;
                }
                int32_t n = q->n_tokens - q->n_done;
                n = n < o.chunk - T ? n : o.chunk - T;
                for (int32_t i = 0; i < n; i++) {
                    tok[T] = q->tokens[q->n_done + i];
                    pos[T] = q->n_done + i;
                    sq[T] = s;
                    want[T] = q->n_done + i == q->n_tokens - 1;
                    if (want[T]) {
                        row_seq[n_out++] = s;
                    }
                    T++;
                }
                q->n_done += n;
                if (decode) {
                    has_decode = true;
                    decode_tokens += n;
                } else {
                    has_prefill = true;
                    prefill_tokens += n;
                }
            }
        }
        if (!busy) {
            break;
        }
        if (T == 0) {
            continue;
        }
        kg_step_batch_t b = {.n_tokens = T,
                             .token = tok,
                             .pos = pos,
                             .seq = sq,
                             .want_logits = want,
                             .n_outputs = n_out,
                             .n_slots = o.n_seqs,
                             .max_blocks_per_seq = mb,
                             .block_table = table};
        int64_t t0 = kg_clock_us();
        kg_status_t st = kg_backend_forward(cpu, &b, lc);
        int64_t t1 = kg_clock_us();
        if (st == KG_OK) {
            st = kg_backend_forward(gpu, &b, lg);
        }
        int64_t t2 = kg_clock_us();
        t_cpu += (double)(t1 - t0) / 1e6;
        t_gpu += (double)(t2 - t1) / 1e6;
        if (st != KG_OK) {
            fprintf(stderr, "kgen-parity: step %d failed: %s\n", step, kg_status_str(st));
            return 2;
        }
        steps++;
        mixed_steps += has_decode && has_prefill;
        /* the device sampler on the device's logits (still there after forward) */
        for (int32_t r = 0; r < n_out; r++) {
            seq_t *q = &seqs[row_seq[r]];
            q->rng_before = q->rng_gpu;
            reqs[r] = (kg_sample_request_t){.params = &q->sp,
                                            .rng = &q->rng_gpu,
                                            .prompt = q->tokens,
                                            .n_prompt = q->n_prompt,
                                            .output = q->tokens + q->n_prompt,
                                            .n_output = q->n_tokens - q->n_prompt};
        }
        if (n_out > 0 && kg_backend_sample(gpu, reqs, n_out, res) != KG_OK) {
            fprintf(stderr, "kgen-parity: device sampling failed at step %d\n", step);
            return 2;
        }
        for (int32_t r = 0; r < n_out; r++) {
            seq_t *q = &seqs[row_seq[r]];
            const float *rc = lc + (size_t)r * V, *rg = lg + (size_t)r * V;
            double rms;
            const double e = nmse(rc, rg, V, &rms);
            nmse_max = e > nmse_max ? e : nmse_max;
            nmse_sum += e;
            rows++;
            kg_sample_result_t want_res;
            kg_sampler_sample(&q->sp, &q->rng_cpu, rc, V, q->tokens, q->n_prompt,
                              q->tokens + q->n_prompt, q->n_tokens - q->n_prompt, sc, &want_res);
            if (!q->sampled) {
                float gap_c, gap_g;
                const int32_t ac = argmax2(rc, V, &gap_c), ag = argmax2(rg, V, &gap_g);
                greedy_rows++;
                if (ac == ag && res[r].token == ac) {
                    greedy_equal++;
                } else if (gap_c > o.margin * rms || res[r].token != ag) {
                    greedy_fail++;
                    if (!first_fail[0]) {
                        snprintf(first_fail, sizeof(first_fail),
                                 "seq %d pos %d: cpu %d, cuda %d (device sampler %d), gap %.4g, "
                                 "rms error %.4g",
                                 row_seq[r], q->n_tokens - 1, ac, ag, res[r].token, gap_c, rms);
                    }
                }
            } else {
                /* the CPU sampler on the device's logits, from the RNG state
                 * the device sampler started from */
                kg_rng_t r_same = q->rng_before;
                kg_sample_result_t same;
                kg_sampler_sample(&q->sp, &r_same, rg, V, q->tokens, q->n_prompt,
                                  q->tokens + q->n_prompt, q->n_tokens - q->n_prompt, sc, &same);
                sampled_rows++;
                sampled_equal += res[r].token == same.token;
                sampled_e2e += res[r].token == want_res.token;
                q->rng_gpu = q->rng_cpu;
            }
            q->tokens[q->n_tokens++] = want_res.token;
        }
    }
    const double agree = sampled_rows > 0 ? (double)sampled_equal / (double)sampled_rows : 1.0;
    const bool ok = nmse_max <= o.nmse_max && greedy_fail == 0 && agree >= o.min_agree;
    printf("{\"model\":\"%s\",\"kv_type\":\"%s\",\"rows\":%lld,\"steps\":%lld,\"mixed_steps\":%lld,"
           "\"prefill_tokens\":%lld,\"decode_tokens\":%lld,\"max_context\":%d,\"seqs\":%d,"
           "\"nmse_max\":%.3g,\"nmse_mean\":%.3g,\"nmse_bound\":%.3g,\"greedy_rows\":%lld,"
           "\"greedy_equal\":%lld,\"greedy_fail\":%lld,\"sampled_rows\":%lld,"
           "\"sampled_equal\":%lld,\"sampled_equal_e2e\":%lld,\"cpu_s\":%.2f,\"cuda_s\":%.2f,"
           "\"ok\":%s,\"first_fail\":\"%s\"}\n",
           o.model, kg_kv_type_name(o.kv_type), (long long)rows, (long long)steps,
           (long long)mixed_steps, (long long)prefill_tokens, (long long)decode_tokens, max_ctx,
           o.n_seqs, nmse_max, rows ? nmse_sum / (double)rows : 0.0, o.nmse_max,
           (long long)greedy_rows, (long long)greedy_equal, (long long)greedy_fail,
           (long long)sampled_rows, (long long)sampled_equal, (long long)sampled_e2e, t_cpu, t_gpu,
           ok ? "true" : "false", first_fail);
    for (int s = 0; s < o.n_seqs; s++) {
        free(seqs[s].tokens);
    }
    free(lc), free(lg), free(tok), free(pos), free(sq), free(row_seq), free(want), free(table);
    free(reqs), free(res);
    kg_sampler_scratch_free(sc);
    kg_backend_free(cpu);
    kg_backend_free(gpu);
    kg_model_free(m);
    return ok ? 0 : 1;
}
