/* kgen-worker: wiring only. config -> log -> model -> worker (backend,
 * engine, kafka) -> run loop -> teardown in reverse. --demo N runs the
 * whole path on librdkafka's in-process mock cluster (see demo.c). */
#include "cli_util.h"
#include "config/kg_config.h"
#include "core/kg_log.h"
#include "kafka/kg_demo.h"
#include "kafka/kg_http.h"
#include "kafka/kg_worker.h"
#include "model/kg_model.h"
#include "schema/kg_codec.h"
#include "worker_dry_run.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kg_worker_t *volatile g_worker;
static volatile sig_atomic_t g_signals;

static void on_signal(int sig) {
    (void)sig;
    if (g_signals++ > 0) {
        static const char msg[] = "kgen-worker: second signal, exiting now\n";
        ssize_t n = write(2, msg, sizeof(msg) - 1);
        (void)n;
        _exit(130);
    }
    if (g_worker) {
        kg_worker_stop(g_worker);
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            kg_cmd_print_version("kgen-worker");
            return 0;
        }
    }
    kg_config_t cfg;
    kg_config_init(&cfg);
    char err[1024] = "";
    kg_status_t st = kg_config_parse(&cfg, argc, argv, NULL, err, sizeof(err));
    if (st == KG_AGAIN) {
        kg_config_clear(&cfg);
        return 0;
    }
    if (st != KG_OK) {
        fprintf(stderr, "kgen-worker: %s\n", err);
        kg_config_clear(&cfg);
        return 2;
    }
    kg_log_setup((kg_log_level_t)kg_log_level_parse(cfg.log_level),
                 strcmp(cfg.log_format, "json") == 0 ? KG_LOG_FORMAT_JSON : KG_LOG_FORMAT_LOGFMT);
    if (cfg.print_config) {
        kg_config_print(&cfg, stdout);
        kg_config_clear(&cfg);
        return 0;
    }
    kg_codec_global_init(); /* before any thread: jansson's hash seed */

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    kg_demo_t *demo = NULL;
    kg_model_t *model = NULL;
    kg_worker_t *w = NULL;
    kg_http_t *http = NULL;
    if (cfg.demo >= 0) {
        demo = kg_demo_new(&cfg, err, sizeof(err)); /* mock cluster, topics, model */
        if (!demo) {
            fprintf(stderr, "kgen-worker: demo: %s\n", err);
            goto out;
        }
    }
    model = kg_model_load(cfg.model, err, sizeof(err));
    if (!model) {
        fprintf(stderr, "kgen-worker: %s\n", err);
        goto out;
    }
    if (cfg.dry_run) { /* the memory plan, then out: no Kafka, no backend */
        rc = kg_worker_dry_run(&cfg, model, stdout);
        goto out;
    }
    w = kg_worker_new(&cfg, model, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "kgen-worker: %s\n", err);
        goto out;
    }
    if (cfg.http_port > 0) {
        http = kg_http_new(cfg.http_address, (int)cfg.http_port, w, err, sizeof(err));
        if (!http) {
            fprintf(stderr, "kgen-worker: %s\n", err);
            goto out;
        }
    }
    g_worker = w;
    if (g_signals) {
        kg_worker_stop(w);
    }
    if (demo && kg_demo_start(demo, w, err, sizeof(err)) != KG_OK) {
        fprintf(stderr, "kgen-worker: demo: %s\n", err);
        goto out;
    }
    rc = kg_worker_run(w);
    if (demo) {
        int drc = kg_demo_finish(demo);
        rc = rc ? rc : drc;
    }
out:
    g_worker = NULL;
    kg_http_free(http);
    kg_worker_free(w);
    kg_model_free(model);
    kg_demo_free(demo);
    kg_config_clear(&cfg);
    return rc;
}
