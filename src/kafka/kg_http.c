/* kg_http: the metrics and health endpoints. */
#include "kg_http.h"

#include "../backend/kg_backend.h"
#include "../core/kg_clock.h"
#include "../grammar/kg_grammar_cache.h"
#include "../pipeline/kg_loras.h"
#include "../pipeline/kg_runner.h"
#include "../schema/kg_codec_event.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kg_http {
    struct MHD_Daemon *daemon;
    kg_worker_t *w;
};

#define LIVENESS_US (30 * 1000000LL)

static void counter(FILE *f, const char *name, const char *help, long long v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %lld\n", name, help, name, name, v);
}

static void gauge(FILE *f, const char *name, const char *help, double v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s %g\n", name, help, name, name, v);
}

/* One counter or gauge per adapter (read while the kafka thread may add
 * one: entries never move, n is read once). */
static void per_adapter(FILE *f,
                        const kg_loras_t *l,
                        int32_t n,
                        const char *name,
                        const char *type,
                        const char *help,
                        int what) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int32_t i = 0; i < n; i++) {
        const kg_lora_entry_t *e = &l->e[i];
        const kg_adapter_stats_t *as = e->id >= 0 ? kg_adapters_stats(l->adapters, e->id) : NULL;
        long long v = what == 0   ? atomic_load(&e->stats->n_jobs)
                      : what == 1 ? atomic_load(&e->stats->n_tokens)
                      : !as       ? 0
                      : what == 2 ? atomic_load(&as->resident)
                      : what == 3 ? atomic_load(&as->n_loads)
                                  : atomic_load(&as->n_evictions);
        fprintf(f, "%s{adapter=\"%s\"} %lld\n", name, e->name, v);
    }
}

static void lora_metrics(FILE *f, const kg_loras_t *l) {
    const int32_t n = l->n;
    gauge(f, "kgen_lora_adapters_resident", "LoRA adapters held in the backend now.",
          kg_adapters_n_resident(l->adapters));
    gauge(f, "kgen_lora_max_resident",
          "LoRA adapters held at once at most (--max-loras; 0: no cap).",
          kg_adapters_max_resident(l->adapters));
    gauge(f, "kgen_lora_adapters_known",
          "LoRA adapters read and checked (--lora, and --lora-dir ones jobs have named).", n);
    per_adapter(f, l, n, "kgen_lora_jobs_total", "counter", "Jobs accepted per LoRA adapter.", 0);
    per_adapter(f, l, n, "kgen_lora_tokens_total", "counter", "Tokens generated per LoRA adapter.",
                1);
    per_adapter(f, l, n, "kgen_lora_resident", "gauge",
                "1 while the LoRA adapter is held in the backend.", 2);
    per_adapter(f, l, n, "kgen_lora_loads_total", "counter",
                "Loads of the LoRA adapter into the backend (at start, first use, after an "
                "eviction).",
                3);
    per_adapter(f, l, n, "kgen_lora_evictions_total", "counter",
                "Evictions of the LoRA adapter (least recently used, to load another).", 4);
}

char *kg_http_metrics_text(kg_worker_t *w, size_t *len) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) {
        return NULL;
    }
    const kg_worker_metrics_t *m = kg_worker_metrics(w);
    const kg_runner_gauges_t *g = kg_worker_engine_gauges(w);

    fprintf(f,
            "# HELP kgen_jobs_total Jobs finished, by outcome.\n# TYPE kgen_jobs_total counter\n");
    static const char *reasons[] = {"stop", "length", "stop_sequence"};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "kgen_jobs_total{outcome=\"done\",finish_reason=\"%s\"} %lld\n", reasons[i],
                (long long)atomic_load(&m->jobs_by_finish[i]));
    }
    for (int c = 0; c < KG_ERROR_CODE_COUNT_ && c < 16; c++) {
        fprintf(f, "kgen_jobs_total{outcome=\"error\",code=\"%s\"} %lld\n",
                kg_error_code_str((kg_error_code_t)c),
                (long long)atomic_load(&m->jobs_by_error[c]));
    }
    fprintf(f, "kgen_jobs_total{outcome=\"dead_letter\"} %lld\n",
            (long long)atomic_load(&m->jobs_dlq));
    fprintf(f, "kgen_jobs_total{outcome=\"abandoned\"} %lld\n",
            (long long)atomic_load(&m->jobs_cancelled));
    counter(f, "kgen_prompt_tokens_total", "Prompt tokens of finished jobs.",
            (long long)atomic_load(&m->prompt_tokens));
    counter(f, "kgen_generation_tokens_total", "Generated tokens of finished jobs.",
            (long long)atomic_load(&m->generated_tokens));
    counter(f, "kgen_messages_consumed_total", "Messages taken from the jobs topic.",
            (long long)atomic_load(&m->messages_consumed));
    counter(f, "kgen_events_produced_total", "Events handed to the producer.",
            (long long)atomic_load(&m->events_produced));
    counter(f, "kgen_events_refused_total",
            "Events the broker refused for their own sake (size): copied to the DLQ, and a "
            "terminal one replaced by an internal error.",
            (long long)atomic_load(&m->events_refused));
    counter(f, "kgen_jobs_poisoned_total",
            "Jobs not run again: present in --poison-after consecutive worker failures.",
            (long long)atomic_load(&m->jobs_poisoned));
    counter(f, "kgen_prefill_tokens_total", "Tokens computed as prefill (recomputation included).",
            (long long)atomic_load(&g->n_prefill_tokens));
    counter(f, "kgen_decode_tokens_total", "Tokens computed as decode.",
            (long long)atomic_load(&g->n_decode_tokens));
    counter(f, "kgen_prefix_cache_hit_tokens_total", "Prompt tokens served by the prefix cache.",
            (long long)atomic_load(&g->n_prefix_hit_tokens));
    counter(f, "kgen_prefix_cache_query_tokens_total", "Prompt tokens of admitted requests.",
            (long long)atomic_load(&g->n_prompt_tokens));
    counter(f, "kgen_state_snapshots_total",
            "A hybrid model's recurrent states saved at a shared prefix's end (prefix cache).",
            (long long)atomic_load(&g->n_state_saves));
    counter(f, "kgen_state_restores_total",
            "Saved recurrent states a sequence started from instead of computing the prefix.",
            (long long)atomic_load(&g->n_state_restores));
    counter(f, "kgen_preemptions_total", "Sequences preempted for lack of KV blocks.",
            (long long)atomic_load(&g->n_preemptions));
    counter(f, "kgen_lane_preemptions_total",
            "Sequences of a lower lane preempted to give a job of a higher lane a slot or blocks.",
            (long long)atomic_load(&g->n_tier_preemptions));
    counter(f, "kgen_engine_steps_total", "Engine steps (batched forward passes).",
            (long long)atomic_load(&g->n_steps));
    counter(f, "kgen_grammar_masks_total",
            "Allowed-token masks built for constrained sequences (one per sequence-step).",
            (long long)atomic_load(&g->n_grammar_masks));
    fprintf(
        f,
        "# HELP kgen_grammar_mask_seconds_total Time spent building those masks.\n"
        "# TYPE kgen_grammar_mask_seconds_total counter\nkgen_grammar_mask_seconds_total %.6f\n",
        (double)atomic_load(&g->grammar_mask_ns) / 1e9);
    counter(f, "kgen_grammar_forced_tokens_total",
            "Tokens appended without sampling where the grammar allowed one continuation.",
            (long long)atomic_load(&g->n_grammar_forced_tokens));
    const kg_grammar_cache_t *gc = kg_worker_grammar_cache(w);
    kg_grammar_cache_stats_t cs = {0};
    if (gc) {
        kg_grammar_cache_stats(gc, &cs);
    }
    counter(f, "kgen_grammar_cache_hits_total", "Constrained jobs whose grammar was cached.",
            (long long)cs.hits);
    counter(f, "kgen_grammar_cache_misses_total", "Constrained jobs whose grammar was compiled.",
            (long long)cs.misses);
    counter(f, "kgen_grammar_cache_evictions_total", "Compiled grammars evicted (LRU).",
            (long long)cs.evictions);
    fprintf(f,
            "# HELP kgen_grammar_compile_seconds_total Time spent compiling grammars.\n"
            "# TYPE kgen_grammar_compile_seconds_total counter\n"
            "kgen_grammar_compile_seconds_total %.6f\n",
            (double)cs.compile_us / 1e6);
    gauge(f, "kgen_grammar_cache_bytes", "Memory held by cached grammars.", (double)cs.bytes);
    int64_t q = atomic_load(&g->n_prompt_tokens);
    gauge(f, "kgen_prefix_cache_hit_ratio", "Prefix cache hits / prompt tokens since start.",
          q > 0 ? (double)atomic_load(&g->n_prefix_hit_tokens) / (double)q : 0.0);
    gauge(f, "kgen_num_requests_waiting", "Requests waiting for a slot.",
          atomic_load(&g->n_waiting));
    gauge(f, "kgen_num_requests_running", "Sequences running.", atomic_load(&g->n_running));
    gauge(f, "kgen_jobs_inflight", "Jobs taken from Kafka and not finished.",
          atomic_load(&m->inflight));
    gauge(f, "kgen_kv_blocks_used", "KV cache blocks referenced by running sequences.",
          atomic_load(&g->kv_blocks_used));
    gauge(f, "kgen_kv_blocks_cached", "KV cache blocks holding a reusable prefix.",
          atomic_load(&g->kv_blocks_cached));
    gauge(f, "kgen_kv_blocks_total", "KV cache blocks in the pool.",
          atomic_load(&g->kv_blocks_total));
    gauge(f, "kgen_kv_cache_bytes_per_token",
          "KV cache bytes one cached token takes over all layers (the backend's allocation; "
          "multi-head latent attention: its latent row).",
          (double)atomic_load(&g->kv_bytes_per_token));
    gauge(f, "kgen_device_weight_bytes",
          "Bytes the model's weights take in the backend's memory (the GPU's for CUDA, where "
          "quantized GEMM weights stay GGUF blocks; LoRA adapters while loaded).",
          (double)atomic_load(&g->weight_bytes));
    gauge(f, "kgen_recurrent_state_bytes",
          "Bytes of recurrent state a hybrid model's sequence slots hold, all slots (0: "
          "attention only).",
          (double)atomic_load(&g->state_bytes));
    gauge(f, "kgen_recurrent_snapshot_bytes",
          "Bytes the prefix cache's saved recurrent states take (a hybrid model; 0 otherwise).",
          (double)atomic_load(&g->snapshot_bytes));
    int32_t total = atomic_load(&g->kv_blocks_total);
    gauge(f, "kgen_kv_cache_usage_ratio", "Used / total KV blocks.",
          total > 0 ? (double)atomic_load(&g->kv_blocks_used) / total : 0.0);
    gauge(f, "kgen_batch_tokens", "Tokens in the last engine step.",
          atomic_load(&g->last_batch_tokens));
    gauge(f, "kgen_poison_suspects",
          "1 while jobs that were running when a worker failed wait or run (one at a time).",
          atomic_load(&m->suspects));
    const int32_t n_exp = atomic_load(&g->moe_n_expert);
    if (n_exp > 0) {
        fprintf(f, "# HELP kgen_moe_tokens_per_expert_total Token rows routed to each expert, "
                   "summed over layers (mixture-of-experts models).\n"
                   "# TYPE kgen_moe_tokens_per_expert_total counter\n");
        for (int32_t i = 0; i < n_exp && i < KG_MOE_MAX_EXPERTS; i++) {
            fprintf(f, "kgen_moe_tokens_per_expert_total{expert=\"%d\"} %lld\n", (int)i,
                    (long long)atomic_load(&g->moe_per_expert[i]));
        }
        counter(f, "kgen_moe_routed_tokens_total",
                "Token rows through expert GEMMs (tokens x experts per token x layers).",
                (long long)atomic_load(&g->moe_routed));
        counter(f, "kgen_moe_expert_gemms_total",
                "Expert groups run: one gate/up and one down GEMM over an expert's rows of a "
                "layer and step.",
                (long long)atomic_load(&g->moe_groups));
    }
    const kg_loras_t *loras = kg_worker_loras(w);
    if (loras && (loras->n > 0 || loras->dir) && loras->adapters) {
        lora_metrics(f, loras);
    }
    gauge(f, "kgen_consumer_paused", "1 while the consumer is paused for backpressure.",
          atomic_load(&m->paused));
    gauge(f, "kgen_assigned_partitions", "Partitions of the jobs topic assigned to this worker.",
          atomic_load(&m->assigned_partitions));
    kg_backend_counters_t bc;
    kg_worker_backend_counters(w, &bc);
    counter(f, "kgen_backend_graphs_captured_total", "CUDA graphs captured (one per batch size).",
            (long long)bc.graphs_captured);
    counter(f, "kgen_backend_graph_fallbacks_total",
            "Batch sizes that run eagerly because capturing their CUDA graph failed.",
            (long long)bc.graph_fallbacks);
    const char *topics[256];
    int32_t parts[256];
    int64_t lags[256];
    int np = kg_worker_partition_lag(w, topics, parts, lags, 256);
    fprintf(f, "# HELP kgen_consumer_lag_messages Messages behind the end of each assigned "
               "partition.\n# TYPE kgen_consumer_lag_messages gauge\n");
    for (int i = 0; i < np; i++) {
        fprintf(f, "kgen_consumer_lag_messages{topic=\"%s\",partition=\"%d\"} %lld\n", topics[i],
                parts[i], (long long)lags[i]);
    }
    double drain = kg_drain_seconds(&m->drain);
    if (drain >= 0) {
        gauge(f, "kgen_estimated_drain_seconds",
              "Seconds this worker needs for its backlog: (lag + jobs in flight) x mean job "
              "time / slots, smoothed (absent until a job has finished).",
              drain);
    }
    kg_histogram_write(&m->ttft, f, "kgen_time_to_first_token_seconds",
                       "From taking the job off Kafka to its first token.");
    kg_histogram_write(&m->tpot, f, "kgen_time_per_output_token_seconds",
                       "Mean time between output tokens of a job.");
    kg_histogram_write(&m->e2e, f, "kgen_e2e_request_latency_seconds",
                       "From taking the job off Kafka to its terminal event.");
    kg_histogram_write(&g->step, f, "kgen_step_duration_seconds", "One engine step.");
    fclose(f);
    if (len) {
        *len = n;
    }
    return text;
}

static enum MHD_Result reply(struct MHD_Connection *conn,
                             unsigned status,
                             const char *type,
                             char *body,
                             size_t len,
                             enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
    if (!resp) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result handle(void *cls,
                              struct MHD_Connection *conn,
                              const char *url,
                              const char *method,
                              const char *version,
                              const char *upload_data,
                              size_t *upload_data_size,
                              void **con_cls) {
    (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
    kg_http_t *http = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char msg[] = "method not allowed\n";
        return reply(conn, 405, "text/plain", msg, sizeof(msg) - 1, MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/metrics") == 0) {
        size_t len = 0;
        char *text = kg_http_metrics_text(http->w, &len);
        if (!text) {
            return MHD_NO;
        }
        return reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", text, len,
                     MHD_RESPMEM_MUST_FREE);
    }
    const kg_worker_metrics_t *m = kg_worker_metrics(http->w);
    const kg_runner_gauges_t *g = kg_worker_engine_gauges(http->w);
    int64_t now = kg_clock_us();
    if (strcmp(url, "/healthz") == 0) {
        bool kafka_ok = now - atomic_load(&m->last_loop_us) < LIVENESS_US;
        bool engine_ok = now - atomic_load(&g->last_loop_us) < LIVENESS_US;
        static char ok[] = "ok\n", bad[] = "a loop is stuck\n";
        return kafka_ok && engine_ok
                   ? reply(conn, 200, "text/plain", ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT)
                   : reply(conn, 503, "text/plain", bad, sizeof(bad) - 1, MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/readyz") == 0) {
        static char ok[] = "ready\n", bad[] = "not ready: no partitions assigned yet\n";
        return atomic_load(&m->ready) && atomic_load(&m->assigned_partitions) > 0
                   ? reply(conn, 200, "text/plain", ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT)
                   : reply(conn, 503, "text/plain", bad, sizeof(bad) - 1, MHD_RESPMEM_PERSISTENT);
    }
    static char nf[] = "not found: try /metrics, /healthz or /readyz\n";
    return reply(conn, 404, "text/plain", nf, sizeof(nf) - 1, MHD_RESPMEM_PERSISTENT);
}

kg_http_t *
kg_http_new(const char *address, int port, kg_worker_t *w, char *errstr, size_t errstr_size) {
    /* libmicrohttpd binds the address it is given (port included) */
    struct sockaddr_in sa4;
    struct sockaddr_in6 sa6;
    const struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    memset(&sa4, 0, sizeof(sa4));
    memset(&sa6, 0, sizeof(sa6));
    if (inet_pton(AF_INET, address, &sa4.sin_addr) == 1) {
        sa4.sin_family = AF_INET;
        sa4.sin_port = htons((uint16_t)port);
        sa = (const struct sockaddr *)&sa4;
    } else if (inet_pton(AF_INET6, address, &sa6.sin6_addr) == 1) {
        sa6.sin6_family = AF_INET6;
        sa6.sin6_port = htons((uint16_t)port);
        sa = (const struct sockaddr *)&sa6;
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(errstr, errstr_size,
                 "http: --http-address '%s' is not an IPv4 or IPv6 address (0.0.0.0: every "
                 "interface)",
                 address);
        return NULL;
    }
    kg_http_t *http = calloc(1, sizeof(*http));
    if (!http) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    http->w = w;
    http->daemon =
        MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, http, MHD_OPTION_SOCK_ADDR, sa,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!http->daemon) {
        snprintf(errstr, errstr_size,
                 "http: cannot listen on %s port %d (in use, or no such "
                 "local address?)",
                 address, port);
        free(http);
        return NULL;
    }
    return http;
}

void kg_http_free(kg_http_t *http) {
    if (!http) {
        return;
    }
    MHD_stop_daemon(http->daemon);
    free(http);
}
