/* worker_dry_run: `kgen-worker --dry-run`: what the model and the flags
 * would take in memory, from the GGUF tensor table and the engine's own
 * sizing, without Kafka or a GPU: the weights on the CUDA backend's device
 * (kg_device_plan: quantized matrices as their GGUF blocks, the rest
 * expanded), the KV pool the flags size (kg_engine_size, the worker's own
 * call), and with --device-memory whether both fit. */
#include "worker_dry_run.h"

#include "backend/kg_backend.h"
#include "engine/kg_device_plan.h"
#include "engine/kg_sizing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gib(uint64_t bytes) {
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

/* "39.61 GiB", "12.3 MiB", "768 KiB": the unit that keeps a small model's
 * figures readable */
static const char *size_str(uint64_t bytes, char *buf, size_t size) {
    if (bytes >= (1ull << 30)) {
        snprintf(buf, size, "%.2f GiB", gib(bytes));
    } else if (bytes >= (1ull << 20)) {
        snprintf(buf, size, "%.1f MiB", (double)bytes / 1048576.0);
    } else {
        snprintf(buf, size, "%.1f KiB", (double)bytes / 1024.0);
    }
    return buf;
}

int kg_worker_dry_run(const kg_config_t *cfg, const kg_model_t *model, FILE *out) {
    kg_engine_options_t o = kg_engine_options_default();
    o.max_batch_size = cfg->max_batch_size;
    o.max_batch_tokens = cfg->max_batch_tokens;
    o.ctx = cfg->ctx;
    o.kv_block_size = cfg->kv_block_size;
    o.kv_memory_mib = cfg->kv_memory_mib;
    if (kg_kv_type_parse(cfg->kv_type, &o.kv_type) != KG_OK) {
        fprintf(stderr, "kgen-worker --dry-run: --kv-type: expected f16 or q8_0, got '%s'\n",
                cfg->kv_type);
        return 2;
    }
    o.prefix_cache = cfg->prefix_cache;
    o.threads = cfg->threads;
    kg_engine_params_t ep;
    kg_backend_params_t bp;
    bool clamped = false;
    char err[512];
    if (kg_engine_size(model, &o, &ep, &bp, &clamped, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen-worker --dry-run: %s\n", err);
        return 2;
    }
    /* the CUDA backend keeps blocks unless told not to (gpu/README.md) */
    const char *nq = getenv("KGEN_CUDA_NATIVE_QUANT"), *gemm = getenv("KGEN_CUDA_GEMM");
    const bool native = !(nq && strcmp(nq, "0") == 0) && !(gemm && strcmp(gemm, "cublas") == 0);
    kg_device_plan_t p, px;
    if (!kg_device_plan_model(model, native, &p) || !kg_device_plan_model(model, false, &px)) {
        fprintf(stderr, "kgen-worker --dry-run: out of memory\n");
        return 2;
    }
    const uint64_t per_block = kg_backend_kv_bytes_per_block(model, o.kv_type, ep.kv_block_size);
    const uint64_t per_token = per_block / (uint64_t)ep.kv_block_size;
    const uint64_t kv = (uint64_t)ep.n_kv_blocks * per_block;
    char a[32], b[32], c[32];
    fprintf(out, "model       %s: %s, %.3f B weights, %s of tensors in the file\n", cfg->model,
            kg_arch_name(model->hp.arch), (double)p.n_params / 1e9,
            size_str(p.file_bytes, a, sizeof(a)));
    fprintf(out,
            "cuda        weights %s (%.2fx the file; %s kept as GGUF blocks%s; all expanded: %s)\n",
            size_str(p.weight_bytes, a, sizeof(a)),
            p.file_bytes ? (double)p.weight_bytes / (double)p.file_bytes : 0.0,
            size_str(p.kept_bytes, b, sizeof(b)),
            native ? "" : ", KGEN_CUDA_NATIVE_QUANT=0 or cuBLAS",
            size_str(px.weight_bytes, c, sizeof(c)));
    fprintf(out,
            "kv cache    %s of %s: %d blocks of %d tokens x %.1f KiB a token (%d sequences, "
            "context %d%s)\n",
            size_str(kv, a, sizeof(a)), kg_kv_type_name(o.kv_type), ep.n_kv_blocks,
            ep.kv_block_size, (double)per_token / 1024.0, ep.max_batch_size, ep.max_seq_len,
            clamped ? ", cut to what the pool holds" : "");
    const uint64_t total = p.weight_bytes + kv;
    fprintf(out,
            "cuda total  %s (weights + kv cache; the step's buffers and the CUDA context come on "
            "top)\n",
            size_str(total, a, sizeof(a)));
    if (o.kv_type == KG_KV_F16) {
        fprintf(out, "cpu         weights %s (the file, mapped) + kv cache %s\n",
                size_str(p.file_bytes, a, sizeof(a)), size_str(kv, b, sizeof(b)));
    } else {
        fprintf(out, "cpu         --kv-type %s: the cpu backend keeps K/V in f16 only\n",
                kg_kv_type_name(o.kv_type));
    }
    if (cfg->device_memory_mib > 0) {
        const uint64_t dev = (uint64_t)cfg->device_memory_mib << 20;
        if (total > dev) {
            fprintf(out, "device      %s: does not fit (%s short)\n", size_str(dev, a, sizeof(a)),
                    size_str(total - dev, b, sizeof(b)));
            fprintf(stderr,
                    "kgen-worker --dry-run: the weights and the KV pool (%s) do not fit in "
                    "--device-memory %lld MiB: lower --max-batch-size, --ctx or --kv-memory, or "
                    "use a smaller quantization\n",
                    size_str(total, a, sizeof(a)), (long long)cfg->device_memory_mib);
            return 1;
        }
        fprintf(out, "device      %s: fits, %s left for the step's buffers and the CUDA context\n",
                size_str(dev, a, sizeof(a)), size_str(dev - total, b, sizeof(b)));
    }
    return 0;
}
