/* kgen-submit: send a JSONL file of jobs and collect their results, in the
 * spirit of a batch API.
 *
 * Every input line is produced as-is to the jobs topic (key = request_id
 * when the line is a job), after the end offsets of the results topic have
 * been taken, so no result is missed. Results are assembled per request_id
 * and attempt (worker_id, partition, offset): Kafka may run a job twice (a
 * worker died, a partition moved), and token events of an attempt that was
 * superseded are dropped; the first terminal event (done or error) of a job
 * wins and later duplicates are ignored. One line per finished job (its
 * terminal event) goes to --output; --events keeps every raw event. Exits
 * 0 when every line with a usable request_id has finished, 1 on timeout.
 * Lines without a usable request_id go to the dead-letter topic and are
 * not waited for. */
#include "cli_util.h"
#include "config/kg_config.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "kafka/kg_kafka_conf.h"
#include "schema/kg_codec.h"

#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct job_state {
    char *request_id;
    bool done;
    char attempt[192]; /* "worker_id/partition/offset" of the attempt being assembled */
    int32_t next_index;
    int64_t tokens;
} job_state_t;

typedef struct submit {
    job_state_t *jobs;
    size_t n_jobs;
    size_t *slots; /* open addressing: request_id -> index + 1 */
    size_t n_slots;
    size_t n_done;
    int64_t n_tokens;
    int64_t n_stale;
    FILE *out, *events;
} submit_t;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    }
    return h;
}

static job_state_t *find_job(submit_t *s, const char *rid) {
    for (size_t i = hash_str(rid) & (s->n_slots - 1);; i = (i + 1) & (s->n_slots - 1)) {
        if (!s->slots[i]) {
            return NULL;
        }
        job_state_t *j = &s->jobs[s->slots[i] - 1];
        if (strcmp(j->request_id, rid) == 0) {
            return j;
        }
    }
}

static void add_job(submit_t *s, const char *rid) {
    if (find_job(s, rid)) {
        return; /* the same request_id twice: one result */
    }
    job_state_t *j = &s->jobs[s->n_jobs];
    j->request_id = strdup(rid);
    for (size_t i = hash_str(rid) & (s->n_slots - 1);; i = (i + 1) & (s->n_slots - 1)) {
        if (!s->slots[i]) {
            s->slots[i] = ++s->n_jobs;
            return;
        }
    }
}

static void on_event(submit_t *s, const rd_kafka_message_t *rkm) {
    if (s->events) {
        fwrite(rkm->payload, 1, rkm->len, s->events);
        fputc('\n', s->events);
    }
    kg_event_t *ev = NULL;
    char err[256];
    if (kg_codec_decode_event(rkm->payload, rkm->len, &ev, err, sizeof(err)) != KG_OK) {
        KG_LOG_WARN("submit", "not an event partition=%d offset=%lld: %s", rkm->partition,
                    (long long)rkm->offset, err);
        return;
    }
    const kg_event_common_t *c = ev->type == KG_EVENT_TOKEN  ? &ev->token.common
                                 : ev->type == KG_EVENT_DONE ? &ev->done.common
                                                             : &ev->error.common;
    job_state_t *j = find_job(s, c->request_id);
    if (!j || j->done) {
        kg_event_free(ev); /* not ours, or a duplicate after the job finished */
        return;
    }
    char attempt[192];
    snprintf(attempt, sizeof(attempt), "%s/%d/%lld", c->worker_id, c->partition,
             (long long)c->offset);
    if (ev->type == KG_EVENT_TOKEN) {
        if (strcmp(attempt, j->attempt) != 0) {
            if (j->attempt[0] && ev->token.index != 0) {
                s->n_stale++; /* the tail of an older attempt: drop it */
                kg_event_free(ev);
                return;
            }
            snprintf(j->attempt, sizeof(j->attempt), "%s", attempt); /* a new attempt starts */
            j->next_index = 0;
            j->tokens = 0;
        }
        if (ev->token.index == j->next_index) {
            j->next_index++;
            j->tokens++;
        }
    } else {
        j->done = true;
        s->n_done++;
        if (ev->type == KG_EVENT_DONE) {
            s->n_tokens += ev->done.completion_tokens;
        }
        fwrite(rkm->payload, 1, rkm->len, s->out);
        fputc('\n', s->out);
        fflush(s->out);
    }
    kg_event_free(ev);
}

static void usage(FILE *f) {
    fprintf(f, "usage: kgen-submit --brokers B --input jobs.jsonl --output results.jsonl\n"
               "                   [--events FILE] [--timeout S] [--jobs-topic T]\n"
               "                   [--results-topic R] [-X key=value ...] [--no-progress]\n");
}

int main(int argc, char **argv) {
    const char *in_path = NULL, *out_path = NULL, *events_path = NULL;
    double timeout_s = 600;
    bool progress = isatty(2);
    kg_config_t cfg;
    kg_config_init(&cfg);
    char err[512];
    static const struct option opts[] = {{"brokers", required_argument, 0, 'b'},
                                         {"input", required_argument, 0, 'i'},
                                         {"output", required_argument, 0, 'o'},
                                         {"events", required_argument, 0, 'e'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"jobs-topic", required_argument, 0, 'J'},
                                         {"results-topic", required_argument, 0, 'R'},
                                         {"no-progress", no_argument, 0, 'P'},
                                         {"version", no_argument, 0, 'V'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    float fv;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "X:h", opts, NULL)) != -1) {
        kg_status_t st = KG_OK;
        switch (c) {
        case 'b':
            st = kg_config_set(&cfg, "brokers", optarg, err, sizeof(err));
            break;
        case 'i':
            in_path = optarg;
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'e':
            events_path = optarg;
            break;
        case 't':
            if (!kg_cli_parse_f32(optarg, 0.1f, 1e7f, &fv)) {
                snprintf(err, sizeof(err), "--timeout: expected seconds, got '%s'", optarg);
                st = KG_ERR_INVALID;
            }
            timeout_s = fv;
            break;
        case 'J':
            st = kg_config_set(&cfg, "jobs-topic", optarg, err, sizeof(err));
            break;
        case 'R':
            st = kg_config_set(&cfg, "results-topic", optarg, err, sizeof(err));
            break;
        case 'P':
            progress = false;
            break;
        case 'X': {
            const char *eq = strchr(optarg, '=');
            if (!eq) {
                snprintf(err, sizeof(err), "-X expects key=value");
                st = KG_ERR_INVALID;
                break;
            }
            char key[256];
            snprintf(key, sizeof(key), "%.*s", (int)(eq - optarg), optarg);
            st = kg_config_set_kafka(&cfg, key, eq + 1, err, sizeof(err));
            break;
        }
        case 'V':
            kg_cmd_print_version("kgen-submit");
            kg_config_clear(&cfg);
            return 0;
        case 'h':
            usage(stdout);
            kg_config_clear(&cfg);
            return 0;
        default:
            fprintf(stderr, "kgen-submit: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            kg_config_clear(&cfg);
            return 2;
        }
        if (st != KG_OK) {
            fprintf(stderr, "kgen-submit: %s\n", err);
            kg_config_clear(&cfg);
            return 2;
        }
    }
    if (optind < argc || !in_path || !out_path) {
        fprintf(stderr, "kgen-submit: --input and --output are required\n");
        usage(stderr);
        kg_config_clear(&cfg);
        return 2;
    }
    kg_codec_global_init();
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int rc = 1;
    submit_t s = {0};
    rd_kafka_t *producer = NULL, *consumer = NULL;
    char *input = NULL;
    size_t in_len = 0;
    FILE *f = fopen(in_path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        input = malloc((size_t)(n > 0 ? n : 0) + 1);
        in_len = input ? fread(input, 1, (size_t)(n > 0 ? n : 0), f) : 0;
        fclose(f);
    }
    if (!input) {
        fprintf(stderr, "kgen-submit: cannot read %s\n", in_path);
        goto out;
    }
    size_t n_lines = 1;
    for (size_t i = 0; i < in_len; i++) {
        n_lines += input[i] == '\n';
    }
    s.jobs = calloc(n_lines, sizeof(*s.jobs));
    s.n_slots = 16;
    while (s.n_slots < n_lines * 2) {
        s.n_slots <<= 1;
    }
    s.slots = calloc(s.n_slots, sizeof(size_t));
    s.out = fopen(out_path, "wb");
    s.events = events_path ? fopen(events_path, "wb") : NULL;
    if (!s.jobs || !s.slots || !s.out || (events_path && !s.events)) {
        fprintf(stderr, "kgen-submit: cannot open the output files\n");
        goto out;
    }

    /* the consumer first: every partition of the results topic from its current end */
    rd_kafka_conf_t *conf = kg_kafka_conf_new(&cfg, err, sizeof(err));
    if (!conf || kg_kafka_conf_set(conf, "group.id", "kgen-submit", err, sizeof(err)) ||
        kg_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err))) {
        fprintf(stderr, "kgen-submit: %s\n", err);
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        goto out;
    }
    consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!consumer) {
        /* rd_kafka_new takes the conf only when it succeeds */
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kgen-submit: %s\n", err);
        goto out;
    }
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(consumer, cfg.results_topic, NULL);
    rd_kafka_resp_err_t kerr = rd_kafka_metadata(consumer, 0, rkt, &md, 15000);
    rd_kafka_topic_destroy(rkt);
    if (kerr || md->topic_cnt != 1 || md->topics[0].err || md->topics[0].partition_cnt == 0) {
        fprintf(
            stderr, "kgen-submit: cannot read the metadata of %s: %s\n", cfg.results_topic,
            kerr ? rd_kafka_err2str(kerr)
                 : rd_kafka_err2str(md->topic_cnt ? md->topics[0].err : RD_KAFKA_RESP_ERR_UNKNOWN));
        if (md) {
            rd_kafka_metadata_destroy(md);
        }
        goto out;
    }
    rd_kafka_topic_partition_list_t *parts =
        rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
    for (int i = 0; i < md->topics[0].partition_cnt; i++) {
        int32_t p = md->topics[0].partitions[i].id;
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(consumer, cfg.results_topic, p, &lo, &hi, 15000)) {
            hi = RD_KAFKA_OFFSET_END;
        }
        rd_kafka_topic_partition_list_add(parts, cfg.results_topic, p)->offset = hi;
    }
    rd_kafka_metadata_destroy(md);
    kerr = rd_kafka_assign(consumer, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (kerr) {
        fprintf(stderr, "kgen-submit: assign: %s\n", rd_kafka_err2str(kerr));
        goto out;
    }

    conf = kg_kafka_conf_new(&cfg, err, sizeof(err));
    if (!conf || kg_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err))) {
        fprintf(stderr, "kgen-submit: %s\n", err);
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        goto out;
    }
    producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!producer) {
        rd_kafka_conf_destroy(conf); /* ours again: rd_kafka_new failed */
        fprintf(stderr, "kgen-submit: %s\n", err);
        goto out;
    }
    size_t n_sent = 0;
    /* the clock starts at the first produce: a worker may start on the first
     * job while later ones are still being sent */
    const int64_t t0 = kg_clock_us();
    for (char *p = input, *end = input + in_len; p < end && !g_stop;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char *line = p;
        p += len + 1;
        if (len == 0) {
            continue;
        }
        kg_job_t *job = NULL;
        kg_codec_error_t cerr;
        const char *rid = NULL;
        kg_status_t st = kg_codec_decode_job(line, len, &job, &cerr);
        if (st == KG_OK) {
            rid = job->request_id;
        } else if (cerr.kind == KG_CODEC_INVALID && cerr.request_id[0]) {
            rid = cerr.request_id;
        }
        if (rid) {
            add_job(&s, rid);
        }
        kerr = RD_KAFKA_RESP_ERR__QUEUE_FULL;
        while (kerr == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            kerr = rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(cfg.jobs_topic),
                                     RD_KAFKA_V_KEY(rid, rid ? strlen(rid) : 0),
                                     RD_KAFKA_V_VALUE(line, len),
                                     RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (kerr == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(producer, 50);
            }
        }
        kg_job_free(job);
        if (kerr) {
            fprintf(stderr, "kgen-submit: produce: %s\n", rd_kafka_err2str(kerr));
            goto out;
        }
        n_sent++;
        rd_kafka_poll(producer, 0);
    }
    if (rd_kafka_flush(producer, 60000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kgen-submit: %d jobs not delivered to the broker\n",
                rd_kafka_outq_len(producer));
        goto out;
    }
    KG_LOG_INFO("submit", "produced %zu messages, waiting for %zu results", n_sent, s.n_jobs);

    /* --timeout bounds the wait for results, not the sending */
    int64_t deadline = kg_clock_us() + (int64_t)(timeout_s * 1e6), last_draw = 0;
    while (s.n_done < s.n_jobs && !g_stop && kg_clock_us() < deadline) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(consumer, 100);
        if (rkm) {
            if (!rkm->err) {
                on_event(&s, rkm);
            } else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                KG_LOG_WARN("submit", "consumer: %s", rd_kafka_message_errstr(rkm));
            }
            rd_kafka_message_destroy(rkm);
        }
        int64_t now = kg_clock_us();
        if (progress && now - last_draw > 200000) {
            last_draw = now;
            double secs = (double)(now - t0) / 1e6;
            int width = 30, fill = s.n_jobs ? (int)(s.n_done * (size_t)width / s.n_jobs) : width;
            fprintf(stderr, "\r[%.*s%*s] %zu/%zu jobs  %.1f tok/s ", fill,
                    "##############################", width - fill, "", s.n_done, s.n_jobs,
                    secs > 0 ? (double)s.n_tokens / secs : 0.0);
        }
    }
    double secs = (double)(kg_clock_us() - t0) / 1e6;
    if (progress) {
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "kgen-submit: %zu/%zu jobs finished in %.2f s (%.2f jobs/s, %.1f tok/s)%s\n",
            s.n_done, s.n_jobs, secs, secs > 0 ? (double)s.n_done / secs : 0.0,
            secs > 0 ? (double)s.n_tokens / secs : 0.0,
            s.n_stale ? " (stale attempts dropped)" : "");
    rc = s.n_done == s.n_jobs ? 0 : 1;
out:
    if (producer) {
        rd_kafka_destroy(producer);
    }
    if (consumer) {
        rd_kafka_consumer_close(consumer);
        rd_kafka_destroy(consumer);
    }
    if (s.out) {
        fclose(s.out);
    }
    if (s.events) {
        fclose(s.events);
    }
    for (size_t i = 0; i < s.n_jobs; i++) {
        free(s.jobs[i].request_id);
    }
    free(s.jobs);
    free(s.slots);
    free(input);
    kg_config_clear(&cfg);
    return rc;
}
