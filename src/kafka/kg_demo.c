/* kg_demo: mock cluster, sample jobs and a printer thread for --demo. */
#include "kg_demo.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"
#include "../model/kg_mkmodel.h"
#include "../schema/kg_codec_event.h"
#include "kg_cancel.h"
#include "kg_kafka_conf.h"
#include "kg_lanes.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEMO_PARTITIONS 4

struct kg_demo {
    kg_config_t *cfg;
    kg_lanes_t lanes;    /* the jobs topics; sample jobs go to the first */
    rd_kafka_t *mock_rk; /* hosts the mock cluster */
    rd_kafka_mock_cluster_t *mc;
    char model_path[256]; /* ours to delete, or "" */
    rd_kafka_t *printer;
    pthread_t thread;
    bool started;
    _Atomic bool stop;
    kg_worker_t *worker;
    int64_t n_jobs;
    _Atomic int64_t n_terminal;
    char **seen; /* request ids with a terminal event (n_jobs) */
};

static rd_kafka_t *
new_client(rd_kafka_type_t type, rd_kafka_conf_t *conf, char *errstr, size_t errstr_size) {
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof(err));
    if (!rk) {
        snprintf(errstr, errstr_size, "%s", err);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

kg_demo_t *kg_demo_new(kg_config_t *cfg, char *errstr, size_t errstr_size) {
    kg_demo_t *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    d->cfg = cfg;
    d->n_jobs = cfg->demo;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (kg_kafka_conf_set(conf, "log_level", "3", errstr, errstr_size) != 0) {
        rd_kafka_conf_destroy(conf);
        goto fail;
    }
    d->mock_rk = new_client(RD_KAFKA_PRODUCER, conf, errstr, errstr_size);
    if (!d->mock_rk) {
        goto fail;
    }
    d->mc = rd_kafka_mock_cluster_new(d->mock_rk, 1);
    if (!d->mc) {
        snprintf(errstr, errstr_size, "cannot start librdkafka's mock cluster");
        goto fail;
    }
    if (kg_lanes_parse(cfg->jobs_topic, &d->lanes, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    for (int l = 0; l < d->lanes.n; l++) {
        const char *topic = d->lanes.lane[l].topic;
        char dlq[512], inflight[512];
        snprintf(dlq, sizeof(dlq), "%s%s", *cfg->dlq_topic ? cfg->dlq_topic : topic,
                 *cfg->dlq_topic ? "" : ".dlq");
        snprintf(inflight, sizeof(inflight), "%s%s",
                 *cfg->inflight_topic ? cfg->inflight_topic : topic,
                 *cfg->inflight_topic ? "" : ".inflight");
        /* a --dlq-topic (or --inflight-topic, which the worker then refuses
         * with its own message) shared by the lanes is created once */
        bool shared_dlq = l > 0 && *cfg->dlq_topic;
        bool shared_inflight = l > 0 && *cfg->inflight_topic;
        if (rd_kafka_mock_topic_create(d->mc, topic, DEMO_PARTITIONS, 1) ||
            (!shared_dlq && rd_kafka_mock_topic_create(d->mc, dlq, 1, 1)) ||
            (!shared_inflight && rd_kafka_mock_topic_create(d->mc, inflight, DEMO_PARTITIONS, 1))) {
            snprintf(errstr, errstr_size, "cannot create the demo topics");
            goto fail;
        }
    }
    /* the cancel topics the worker will read */
    char cancel[KG_CANCEL_TOPICS_MAX][KG_CANCEL_NAME_MAX];
    int n_cancel = kg_cancel_topic_names(cfg, &d->lanes, cancel);
    for (int l = 0; l < n_cancel; l++) {
        if (rd_kafka_mock_topic_create(d->mc, cancel[l], 1, 1)) {
            snprintf(errstr, errstr_size, "cannot create the demo's cancel topic %s", cancel[l]);
            goto fail;
        }
    }
    if (rd_kafka_mock_topic_create(d->mc, cfg->results_topic, DEMO_PARTITIONS, 1)) {
        snprintf(errstr, errstr_size, "cannot create the demo topics");
        goto fail;
    }
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(d->mc);
    if (kg_config_set(cfg, "brokers", bootstrap, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    /* the mock cluster cannot describe its topics (no DescribeConfigs) and
     * takes whatever the producer sends: size events to the producer */
    if (cfg->max_event_bytes == 0 &&
        kg_config_set(cfg, "max-event-bytes", "999488", errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    KG_LOG_INFO("demo", "mock cluster up brokers=%s jobs_topic=%s results_topic=%s", bootstrap,
                cfg->jobs_topic, cfg->results_topic);
    if (!*cfg->model) {
        snprintf(d->model_path, sizeof(d->model_path), "%s/kgen-demo-%d.gguf",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        kg_mkmodel_opts_t mo = kg_mkmodel_opts_default();
        mo.out = d->model_path;
        mo.name = "kgen-demo";
        mo.n_embd = 128;
        mo.n_layer = 4;
        mo.n_head = 4;
        mo.n_head_kv = 2;
        mo.head_dim = 32;
        mo.n_ff = 384;
        mo.ctx = 1024;
        mo.seed = 42;
        mo.have_seed = true;
        mo.n_words = 3000;
        /* a Qwen2-family model with ChatML, as Qwen writes it (its vocabulary
         * has the ChatML tokens), so the demo's chat jobs render */
        mo.arch = "qwen2";
        mo.chat_template = "chatml";
        char err[512];
        if (kg_mkmodel_write(&mo, NULL, err, sizeof(err)) != KG_OK) {
            snprintf(errstr, errstr_size, "cannot write the demo model: %s", err);
            d->model_path[0] = '\0';
            goto fail;
        }
        KG_LOG_INFO("demo", "made a random-weight model path=%s (its text is nonsense by design)",
                    d->model_path);
        if (kg_config_set(cfg, "model", d->model_path, errstr, errstr_size) != KG_OK) {
            goto fail;
        }
    }
    return d;
fail:
    kg_demo_free(d);
    return NULL;
}

/* N varied jobs: text prompts, a stop string, sampling with seeds,
 * logprobs, stream on and off, priorities, chat jobs (rendered with the
 * model's chat template: the demo model's is ChatML; a --model without one
 * answers unsupported_chat_template), and one invalid job (job 11,
 * max_tokens -1: an invalid_job error event) to show what a bad job gets. */
static char *sample_job(int64_t i, size_t *len) {
    static const char *prompts[] = {
        "Once upon a time",  "The weather today is",           "Write a haiku about Kafka",
        "def fibonacci(n):", "The three laws of robotics are", "Dear diary,"};
    char buf[1024];
    int64_t k = i % 12;
    const char *p = prompts[i % 6];
    int n;
    if (i == 11) {
        n = snprintf(buf, sizeof(buf),
                     "{\"request_id\":\"demo-%lld\",\"prompt\":\"x\",\"max_tokens\":-1}",
                     (long long)i);
    } else if (k == 10) {
        n = snprintf(buf, sizeof(buf),
                     "{\"request_id\":\"demo-%lld\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"Hello!\"}],\"max_tokens\":16}",
                     (long long)i);
    } else {
        n = snprintf(buf, sizeof(buf),
                     "{\"request_id\":\"demo-%lld\",\"prompt\":\"%s\",\"max_tokens\":%lld,"
                     "\"temperature\":%s,\"seed\":%lld,\"stream\":%s,\"priority\":%lld%s%s,"
                     "\"metadata\":{\"demo\":true,\"n\":%lld}}",
                     (long long)i, p, (long long)(8 + (i * 7) % 40), k % 3 == 0 ? "0" : "0.8",
                     (long long)i, k % 4 == 3 ? "false" : "true", (long long)(k % 2),
                     k == 5 ? ",\"stop\":[\"ka\"]" : "", k == 7 ? ",\"logprobs\":2" : "",
                     (long long)i);
    }
    char *out = malloc((size_t)n + 1);
    if (out) {
        memcpy(out, buf, (size_t)n + 1);
        *len = (size_t)n;
    }
    return out;
}

static bool produce_jobs(kg_demo_t *d, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = kg_kafka_conf_new(d->cfg, errstr, errstr_size);
    if (!conf) {
        return false;
    }
    rd_kafka_t *p = new_client(RD_KAFKA_PRODUCER, conf, errstr, errstr_size);
    if (!p) {
        return false;
    }
    int64_t n_valid = d->n_jobs;
    for (int64_t i = 0; i < n_valid; i++) {
        size_t len = 0;
        char *job = sample_job(i, &len);
        char key[32];
        int kl = snprintf(key, sizeof(key), "demo-%lld", (long long)i);
        rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__QUEUE_FULL;
        while (job && err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            err = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(d->lanes.lane[0].topic),
                                    RD_KAFKA_V_KEY(key, (size_t)kl), RD_KAFKA_V_VALUE(job, len),
                                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(p, 100);
            }
        }
        free(job);
        if (err) {
            snprintf(errstr, errstr_size, "producing sample jobs: %s", rd_kafka_err2str(err));
            rd_kafka_destroy(p);
            return false;
        }
    }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);
    return true;
}

/* Count a terminal event once per request_id (a redelivery may repeat one). */
static void note_terminal(kg_demo_t *d, const char *request_id) {
    int64_t n = atomic_load(&d->n_terminal);
    for (int64_t i = 0; i < n; i++) {
        if (strcmp(d->seen[i], request_id) == 0) {
            return;
        }
    }
    if (n < d->n_jobs) {
        d->seen[n] = strdup(request_id);
        atomic_store(&d->n_terminal, n + 1);
    }
}

static void *printer_main(void *arg) {
    kg_demo_t *d = arg;
    while (!atomic_load(&d->stop)) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(d->printer, 100);
        if (!rkm) {
            continue;
        }
        if (!rkm->err) {
            fwrite(rkm->payload, 1, rkm->len, stdout);
            fputc('\n', stdout);
            fflush(stdout);
            kg_event_t *ev = NULL;
            char err[256];
            if (kg_codec_decode_event(rkm->payload, rkm->len, &ev, err, sizeof(err)) == KG_OK) {
                if (ev->type == KG_EVENT_DONE) {
                    note_terminal(d, ev->done.common.request_id);
                } else if (ev->type == KG_EVENT_ERROR) {
                    note_terminal(d, ev->error.common.request_id);
                }
                kg_event_free(ev);
            }
            if (d->n_jobs > 0 && atomic_load(&d->n_terminal) >= d->n_jobs) {
                KG_LOG_INFO("demo", "all %lld jobs have their terminal event; stopping",
                            (long long)d->n_jobs);
                kg_worker_stop(d->worker);
            }
        }
        rd_kafka_message_destroy(rkm);
    }
    return NULL;
}

kg_status_t kg_demo_start(kg_demo_t *d, kg_worker_t *w, char *errstr, size_t errstr_size) {
    d->worker = w;
    d->seen = calloc((size_t)(d->n_jobs > 0 ? d->n_jobs : 1), sizeof(char *));
    rd_kafka_conf_t *conf = kg_kafka_conf_new(d->cfg, errstr, errstr_size);
    if (!d->seen || !conf) {
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        return KG_ERR_NOMEM;
    }
    if (kg_kafka_conf_set(conf, "group.id", "kgen-demo-printer", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, errstr_size)) {
        rd_kafka_conf_destroy(conf);
        return KG_ERR_INVALID;
    }
    d->printer = new_client(RD_KAFKA_CONSUMER, conf, errstr, errstr_size);
    if (!d->printer) {
        return KG_ERR_KAFKA;
    }
    /* every partition of the results topic from the start: nothing is missed */
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(DEMO_PARTITIONS);
    for (int i = 0; i < DEMO_PARTITIONS; i++) {
        rd_kafka_topic_partition_list_add(parts, d->cfg->results_topic, i)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(d->printer, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (err) {
        snprintf(errstr, errstr_size, "assign results: %s", rd_kafka_err2str(err));
        return KG_ERR_KAFKA;
    }
    if (d->n_jobs > 0 && !produce_jobs(d, errstr, errstr_size)) {
        return KG_ERR_KAFKA;
    }
    if (pthread_create(&d->thread, NULL, printer_main, d) != 0) {
        snprintf(errstr, errstr_size, "pthread_create failed");
        return KG_ERR_NOMEM;
    }
    d->started = true;
    KG_LOG_INFO("demo", "produced %lld sample jobs; results follow on stdout",
                (long long)d->n_jobs);
    return KG_OK;
}

int kg_demo_finish(kg_demo_t *d) {
    /* let the last events arrive */
    int64_t deadline = kg_clock_us() + 5000000;
    while (d->started && atomic_load(&d->n_terminal) < d->n_jobs && kg_clock_us() < deadline) {
        usleep(20000);
    }
    atomic_store(&d->stop, true);
    if (d->started) {
        pthread_join(d->thread, NULL);
        d->started = false;
    }
    int64_t got = atomic_load(&d->n_terminal);
    if (d->n_jobs > 0 && got < d->n_jobs) {
        KG_LOG_ERROR("demo", "only %lld of %lld jobs finished", (long long)got,
                     (long long)d->n_jobs);
        return 1;
    }
    return 0;
}

void kg_demo_free(kg_demo_t *d) {
    if (!d) {
        return;
    }
    if (d->started) {
        atomic_store(&d->stop, true);
        pthread_join(d->thread, NULL);
    }
    if (d->printer) {
        rd_kafka_consumer_close(d->printer);
        rd_kafka_destroy(d->printer);
    }
    if (d->mc) {
        rd_kafka_mock_cluster_destroy(d->mc);
    }
    if (d->mock_rk) {
        rd_kafka_destroy(d->mock_rk);
    }
    if (d->model_path[0]) {
        unlink(d->model_path);
    }
    for (int64_t i = 0; d->seen && i < d->n_jobs; i++) {
        free(d->seen[i]);
    }
    free(d->seen);
    free(d);
}
