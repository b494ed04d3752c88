/* kgen-submit: send a JSONL file of jobs and collect their results, in the
 * spirit of a batch API.
 *
 * Every input line is produced as-is to the jobs topic, keyed by its
 * request_id (kgen jobs, OpenAI Batch lines; a line with none is keyed
 * "line-<N>", which is also the request_id a worker gives a bare OpenAI
 * body), after the end offsets of the results topic have been taken, so no
 * result is missed. Results are assembled per request_id and attempt
 * (the events' attempt id): Kafka may run a job twice (a worker died,
 * a partition moved), and token events of an attempt that was superseded
 * are dropped; the first terminal event (done or error) of a job wins and
 * later duplicates are ignored. One line per finished job goes to --output:
 * its terminal event, or with --output-format openai its OpenAI Batch
 * output line (kg_openai_batch_output; failed requests to --error-file when
 * given); --events keeps every raw event. Exits 0 when every line with a
 * usable request_id has finished, 1 on timeout. Lines without one go to the
 * dead-letter topic and are not waited for.
 *
 * RESUMING
 * A small state file beside the output (<output>.kgen-state) records, before
 * the first message is sent, the input's size and hash and the end offsets
 * of the jobs and results topics. Run again with the same input and output
 * (after a crash, a kill, a timeout), kgen-submit
 *   - keeps the output lines already written (a torn last line is cut),
 *   - reads the jobs topic from the recorded offsets and does not send a
 *     line whose key is already there, so nothing is sent twice, and
 *   - reads the results topic from the recorded offsets, so the results
 *     that arrived meanwhile are collected.
 * --status prints OpenAI-style request_counts (total, completed, failed) of
 * the input's jobs from the results topic (from the recorded offsets, or
 * the beginning without a state file). Delete the state file to start over.
 *
 * Results are read with isolation.level=read_committed, always: with
 * --exactly-once workers a terminal event is visible once its transaction
 * commits (an aborted attempt never is); with at-least-once workers nothing
 * is transactional and read_committed costs nothing.
 *
 * --key prefix[:N] sends each job with a key made from the start of its
 * prompt (schema/kg_routing) instead of its request_id, so jobs that share a
 * system prompt land on one partition, one worker, one prefix cache; the
 * request_id then travels in the kgen-request-key header, which resuming
 * reads. --cancel ID... sends cancels and exits; --cancel-on-interrupt
 * cancels the outstanding jobs on the first Ctrl-C and waits for their
 * answers.
 *
 * FILES
 * - submit_main.c (this file): the flags, then the send loop and the
 *   collect loop.
 * - submit_jobs.c: the jobs of the input, the assembly of their results,
 *   cancels.
 * - submit_resume.c: the state file, reading topics from recorded offsets,
 *   output files kept across runs.
 * - submit_int.h: what they share. */
#include "cli_util.h"
#include "config/kg_config.h"
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "kafka/kg_cancel.h"
#include "kafka/kg_kafka_conf.h"
#include "schema/kg_codec.h"
#include "schema/kg_openai.h"
#include "schema/kg_routing.h"
#include "submit_int.h"

#include <errno.h>
#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* --key: 0 = request_id, N > 0 = prefix of N characters. -1 when not understood. */
static int32_t parse_key_mode(const char *s) {
    if (strcmp(s, "request_id") == 0) {
        return 0;
    }
    if (strcmp(s, "prefix") == 0) {
        return KG_ROUTING_PREFIX_CHARS;
    }
    char *end;
    long n = strncmp(s, "prefix:", 7) == 0 ? strtol(s + 7, &end, 10) : -1;
    return n >= 1 && n <= 1 << 20 && *end == '\0' ? (int32_t)n : -1;
}

/* The cancel topic: --cancel-topic, or <jobs-topic>.cancel. */
static void cancel_topic_of(const kg_config_t *cfg, const char *given, char *out, size_t size) {
    if (given) {
        snprintf(out, size, "%s", given);
    } else {
        snprintf(out, size, "%s.cancel", cfg->jobs_topic);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kgen-submit --brokers B --input jobs.jsonl --output results.jsonl\n"
            "                   [--output-format kgen|openai] [--error-file FILE]\n"
            "                   [--events FILE] [--timeout S] [--jobs-topic T]\n"
            "                   [--results-topic R] [-X key=value ...] [--no-progress]\n"
            "                   [--key request_id|prefix[:N]] [--cancel-on-interrupt]\n"
            "                   [--rate R]\n"
            "       kgen-submit --status --brokers B --input jobs.jsonl --output results.jsonl\n"
            "       kgen-submit --brokers B --cancel ID... [--cancel-topic T]\n"
            "Rerun with the same input and output to resume (state: <output>.kgen-state).\n"
            "  --key prefix[:N]       key jobs by a hash of their first N prompt characters\n"
            "                         (or their system message; N default %d) so jobs that\n"
            "                         share a prefix run on one worker (its prefix cache)\n"
            "  --cancel ID...         send cancels for these request_ids and exit\n"
            "  --cancel-topic T       default <jobs-topic>.cancel (a worker reads each of its\n"
            "                         jobs topics' <topic>.cancel unless given one)\n"
            "  --cancel-on-interrupt  on Ctrl-C, cancel the jobs without a result and wait\n"
            "                         for their answers (a second Ctrl-C leaves at once)\n"
            "  --rate R               send R jobs a second (an open-loop load; results are\n"
            "                         collected meanwhile) instead of all at once\n",
            KG_ROUTING_PREFIX_CHARS);
}

int main(int argc, char **argv) {
    const char *in_path = NULL, *out_path = NULL, *events_path = NULL, *err_path = NULL;
    double timeout_s = 600;
    bool progress = isatty(2), status = false, openai = false;
    int32_t key_mode = 0;
    double rate = 0; /* --rate: jobs per second, 0 = as fast as they go */
    bool cancel_mode = false, cancel_on_interrupt = false;
    const char *cancel_topic_arg = NULL;
    char cancel_topic[512];
    kg_config_t cfg;
    kg_config_init(&cfg);
    char err[512];
    enum { O_FORMAT = 256, O_ERRFILE, O_STATUS };
    static const struct option opts[] = {{"brokers", required_argument, 0, 'b'},
                                         {"input", required_argument, 0, 'i'},
                                         {"output", required_argument, 0, 'o'},
                                         {"events", required_argument, 0, 'e'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"jobs-topic", required_argument, 0, 'J'},
                                         {"results-topic", required_argument, 0, 'R'},
                                         {"output-format", required_argument, 0, O_FORMAT},
                                         {"error-file", required_argument, 0, O_ERRFILE},
                                         {"status", no_argument, 0, O_STATUS},
                                         {"no-progress", no_argument, 0, 'P'},
                                         {"key", required_argument, 0, 'K'},
                                         {"cancel", no_argument, 0, 'C'},
                                         {"cancel-topic", required_argument, 0, 'T'},
                                         {"cancel-on-interrupt", no_argument, 0, 'I'},
                                         {"rate", required_argument, 0, 'r'},
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
        case O_FORMAT:
            openai = strcmp(optarg, "openai") == 0;
            if (!openai && strcmp(optarg, "kgen") != 0) {
                snprintf(err, sizeof(err), "--output-format: expected kgen or openai, got '%s'",
                         optarg);
                st = KG_ERR_INVALID;
            }
            break;
        case O_ERRFILE:
            err_path = optarg;
            break;
        case O_STATUS:
            status = true;
            break;
        case 'P':
            progress = false;
            break;
        case 'K':
            key_mode = parse_key_mode(optarg);
            if (key_mode < 0) {
                snprintf(err, sizeof(err),
                         "--key: expected request_id, prefix or prefix:N, got '%s'", optarg);
                st = KG_ERR_INVALID;
            }
            break;
        case 'C':
            cancel_mode = true;
            break;
        case 'T':
            cancel_topic_arg = optarg;
            break;
        case 'I':
            cancel_on_interrupt = true;
            break;
        case 'r':
            if (!kg_cli_parse_f32(optarg, 0.001f, 1e6f, &fv)) {
                snprintf(err, sizeof(err), "--rate: expected jobs per second, got '%s'", optarg);
                st = KG_ERR_INVALID;
            }
            rate = fv;
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
    if (strpbrk(cfg.jobs_topic, ",:")) {
        fprintf(stderr,
                "kgen-submit: --jobs-topic names one topic (the lane to send to), got "
                "'%s'\n",
                cfg.jobs_topic);
        kg_config_clear(&cfg);
        return 2;
    }
    cancel_topic_of(&cfg, cancel_topic_arg, cancel_topic, sizeof(cancel_topic));
    if (cancel_mode) {
        int crc = 2;
        rd_kafka_conf_t *cconf = kg_kafka_conf_new(&cfg, err, sizeof(err));
        rd_kafka_t *cp = cconf ? rd_kafka_new(RD_KAFKA_PRODUCER, cconf, err, sizeof(err)) : NULL;
        if (optind >= argc) {
            fprintf(stderr, "kgen-submit: --cancel needs request_ids\n");
        } else if (!cp) {
            fprintf(stderr, "kgen-submit: %s\n", err);
        } else {
            crc = kg_submit_send_cancels(cp, cancel_topic, argv + optind, (size_t)(argc - optind));
        }
        if (cp) {
            rd_kafka_destroy(cp);
        } else if (cconf) {
            rd_kafka_conf_destroy(cconf);
        }
        kg_config_clear(&cfg);
        return crc;
    }
    if (optind < argc || !in_path || !out_path) {
        fprintf(stderr, "kgen-submit: --input and --output are required\n");
        usage(stderr);
        kg_config_clear(&cfg);
        return 2;
    }
    if (err_path && !openai) {
        fprintf(stderr, "kgen-submit: --error-file goes with --output-format openai\n");
        kg_config_clear(&cfg);
        return 2;
    }
    kg_codec_global_init();
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int rc = 1;
    submit_t s = {.openai = openai};
    rd_kafka_t *producer = NULL, *consumer = NULL;
    rd_kafka_topic_partition_list_t *parts = NULL;
    char *input = NULL;
    size_t in_len = 0;
    static state_t state;
    char state_path[4096];
    if (snprintf(state_path, sizeof(state_path), "%s.kgen-state", out_path) >=
        (int)sizeof(state_path)) {
        fprintf(stderr, "kgen-submit: the --output path is too long\n");
        kg_config_clear(&cfg);
        return 2;
    }
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
    s.by_rid.n_slots = s.by_cid.n_slots = 16;
    while (s.by_rid.n_slots < n_lines * 2) {
        s.by_rid.n_slots = s.by_cid.n_slots = s.by_rid.n_slots << 1;
    }
    s.by_rid.slots = calloc(s.by_rid.n_slots, sizeof(size_t));
    s.by_cid.slots = calloc(s.by_cid.n_slots, sizeof(size_t));
    char **keys = calloc(n_lines, sizeof(char *)); /* the key of every line, NULL for blank */
    if (!s.jobs || !s.by_rid.slots || !s.by_cid.slots || !keys) {
        fprintf(stderr, "kgen-submit: out of memory\n");
        free(keys);
        goto out;
    }
    {
        int line_no = 0;
        for (char *p = input, *end = input + in_len; p < end; line_no++) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
            char *line = p, rid[KG_JOB_REQUEST_ID_MAX + 1], key[KG_JOB_REQUEST_ID_MAX + 1];
            p += len + 1;
            if (len == 0) {
                continue;
            }
            if (kg_submit_line_ids(line, len, line_no + 1, rid, key) &&
                !kg_submit_add_job(&s, rid, line, len)) {
                fprintf(stderr, "kgen-submit: out of memory\n");
                goto out_keys;
            }
            keys[line_no] = strdup(key);
        }
    }

    state.in_size = in_len;
    state.in_hash = kg_submit_hash(input, in_len);
    static state_t saved;
    bool have_state = kg_submit_state_read(state_path, &saved);
    bool resume = have_state && saved.in_size == state.in_size && saved.in_hash == state.in_hash;
    if (have_state && !resume && !status) {
        fprintf(stderr, "kgen-submit: %s is for another input: starting over\n", state_path);
    }
    consumer = kg_submit_new_consumer(&cfg, true, err, sizeof(err));
    if (!consumer) {
        fprintf(stderr, "kgen-submit: %s\n", err);
        goto out_keys;
    }
    int64_t ends[MAX_PARTS];
    int n_parts;
    if (status) {
        /* request_counts from the results topic: from the recorded start,
         * or the beginning without a record */
        parts =
            kg_submit_start_list(consumer, cfg.results_topic, saved.results_part, saved.results_off,
                                 resume ? saved.n_results_parts : 0, ends, &n_parts);
        if (!parts) {
            fprintf(stderr, "kgen-submit: cannot read the metadata of %s\n", cfg.results_topic);
            goto out_keys;
        }
        bool whole = kg_submit_read_to_end(consumer, parts, ends, kg_submit_count_event, &s,
                                           kg_clock_us() + (int64_t)(timeout_s * 1e6), &g_stop);
        printf("{\"total\": %zu, \"completed\": %zu, \"failed\": %zu}\n", s.n_jobs, s.n_completed,
               s.n_failed);
        rc = whole ? 0 : 1;
        goto out_keys;
    }

    size_t kept = 0, kept_err = 0;
    s.out = kg_submit_open_output(&s, out_path, resume, &kept);
    s.err = err_path ? kg_submit_open_output(&s, err_path, resume, &kept_err) : NULL;
    s.events = events_path ? fopen(events_path, resume ? "ab" : "wb") : NULL;
    if (!s.out || (err_path && !s.err) || (events_path && !s.events)) {
        fprintf(stderr, "kgen-submit: cannot open the output files\n");
        goto out_keys;
    }
    if (resume) {
        /* what was sent before is on the jobs topic after the recorded offsets */
        parts = kg_submit_start_list(consumer, cfg.jobs_topic, saved.jobs_part, saved.jobs_off,
                                     saved.n_jobs_parts, ends, &n_parts);
        if (parts && !kg_submit_read_to_end(consumer, parts, ends, kg_submit_mark_sent, &s,
                                            kg_clock_us() + (int64_t)(timeout_s * 1e6), &g_stop)) {
            fprintf(stderr, "kgen-submit: could not read %s to its end\n", cfg.jobs_topic);
            goto out_keys;
        }
        rd_kafka_topic_partition_list_destroy(parts);
        parts = kg_submit_start_list(consumer, cfg.results_topic, saved.results_part,
                                     saved.results_off, saved.n_results_parts, ends, &n_parts);
        size_t n_sent = 0;
        for (size_t i = 0; i < s.n_jobs; i++) {
            n_sent += s.jobs[i].sent;
        }
        fprintf(stderr, "kgen-submit: resuming: %zu of %zu results kept, %zu jobs already sent\n",
                kept + kept_err, s.n_jobs, n_sent);
    } else {
        /* record where both topics end before anything is sent */
        int32_t pp[MAX_PARTS];
        int nj = kg_submit_topic_ends(consumer, cfg.jobs_topic, pp, ends);
        for (int i = 0; i < nj; i++) {
            state.jobs_part[i] = pp[i];
            state.jobs_off[i] = ends[i];
        }
        state.n_jobs_parts = nj > 0 ? nj : 0;
        int nr = kg_submit_topic_ends(consumer, cfg.results_topic, pp, ends);
        for (int i = 0; i < nr; i++) {
            state.results_part[i] = pp[i];
            state.results_off[i] = ends[i];
        }
        state.n_results_parts = nr > 0 ? nr : 0;
        if (nr <= 0) {
            fprintf(stderr, "kgen-submit: cannot read the metadata of %s\n", cfg.results_topic);
            goto out_keys;
        }
        if (!kg_submit_state_write(state_path, &state)) {
            fprintf(stderr, "kgen-submit: cannot write %s: %s\n", state_path, strerror(errno));
            goto out_keys;
        }
        parts = kg_submit_start_list(consumer, cfg.results_topic, state.results_part,
                                     state.results_off, state.n_results_parts, ends, &n_parts);
    }
    if (!parts || rd_kafka_assign(consumer, parts)) {
        fprintf(stderr, "kgen-submit: cannot read %s\n", cfg.results_topic);
        goto out_keys;
    }

    rd_kafka_conf_t *conf = kg_kafka_conf_new(&cfg, err, sizeof(err));
    if (!conf || kg_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err))) {
        fprintf(stderr, "kgen-submit: %s\n", err);
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        goto out_keys;
    }
    producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!producer) {
        rd_kafka_conf_destroy(conf); /* ours again: rd_kafka_new failed */
        fprintf(stderr, "kgen-submit: %s\n", err);
        goto out_keys;
    }
    size_t n_sent = 0;
    /* the clock starts at the first produce: a worker may start on the first
     * job while later ones are still being sent */
    const int64_t t0 = kg_clock_us();
    {
        int line_no = 0;
        rd_kafka_resp_err_t kerr = RD_KAFKA_RESP_ERR_NO_ERROR;
        for (char *p = input, *end = input + in_len; p < end && !g_stop; line_no++) {
            /* --rate: job n goes at t0 + n / rate; results are read while it waits */
            while (rate > 0 && !g_stop &&
                   kg_clock_us() < t0 + (int64_t)((double)n_sent * 1e6 / rate)) {
                rd_kafka_poll(producer, 0);
                rd_kafka_message_t *rkm = rd_kafka_consumer_poll(consumer, 1);
                if (rkm) {
                    if (!rkm->err) {
                        kg_submit_on_event(&s, rkm, true);
                    }
                    rd_kafka_message_destroy(rkm);
                }
            }
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
            char *line = p;
            p += len + 1;
            const char *key = keys[line_no];
            if (len == 0 || !key) {
                continue;
            }
            job_state_t *j = kg_submit_find_job(&s, key);
            if (j && (j->sent || j->done)) {
                continue; /* on the jobs topic already (resuming), or answered */
            }
            if (j) {
                j->sent = true; /* a request_id twice in the input: sent once */
            }
            /* the Kafka key picks the partition: the request_id, or with --key
             * prefix the prompt's prefix; then the request_id travels in a
             * header, for resuming */
            char pkey[KG_ROUTING_KEY_SIZE];
            const char *kkey = key;
            if (key_mode > 0 && kg_submit_route_key(line, len, line_no + 1, key_mode, pkey)) {
                kkey = pkey;
            }
            kerr = RD_KAFKA_RESP_ERR__QUEUE_FULL;
            while (kerr == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_headers_t *h = NULL;
                if (kkey != key) {
                    h = rd_kafka_headers_new(1);
                    rd_kafka_header_add(h, REQUEST_KEY_HEADER, -1, key, (ssize_t)strlen(key));
                }
                kerr = rd_kafka_producev(
                    producer, RD_KAFKA_V_TOPIC(cfg.jobs_topic), RD_KAFKA_V_KEY(kkey, strlen(kkey)),
                    RD_KAFKA_V_VALUE(line, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
                if (kerr && h) {
                    rd_kafka_headers_destroy(h); /* ours again: the produce failed */
                }
                if (kerr == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                    rd_kafka_poll(producer, 50);
                }
            }
            if (kerr) {
                fprintf(stderr, "kgen-submit: produce: %s\n", rd_kafka_err2str(kerr));
                goto out_keys;
            }
            if (j && !j->sent_us) {
                j->sent_us = kg_clock_us();
            }
            n_sent++;
            rd_kafka_poll(producer, 0);
        }
    }
    if (rd_kafka_flush(producer, 60000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kgen-submit: %d jobs not delivered to the broker\n",
                rd_kafka_outq_len(producer));
        goto out_keys;
    }
    KG_LOG_INFO("submit", "produced %zu messages, waiting for %zu results", n_sent,
                s.n_jobs - s.n_done);

    /* --timeout bounds the wait for results, not the sending */
    int64_t deadline = kg_clock_us() + (int64_t)(timeout_s * 1e6), last_draw = 0;
    size_t done0 = s.n_done;
    bool interrupted = g_stop != 0;
    if (g_stop && cancel_on_interrupt) {
        g_stop = 0; /* interrupted while sending: cancel what was sent, then wait */
        kg_submit_cancel_outstanding(&s, producer, cancel_topic);
    }
    for (;;) {
        if (g_stop && cancel_on_interrupt && !interrupted) {
            interrupted = true;
            g_stop = 0; /* the next Ctrl-C leaves at once */
            kg_submit_cancel_outstanding(&s, producer, cancel_topic);
        }
        if (s.n_done >= s.n_jobs || g_stop || kg_clock_us() >= deadline) {
            break;
        }
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(consumer, 100);
        if (rkm) {
            if (!rkm->err) {
                kg_submit_on_event(&s, rkm, true);
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
    char ttft[96];
    kg_submit_ttft_summary(&s, ttft, sizeof(ttft));
    fprintf(stderr, "kgen-submit: %zu/%zu jobs finished in %.2f s (%.2f jobs/s, %.1f tok/s)%s%s\n",
            s.n_done, s.n_jobs, secs, secs > 0 ? (double)(s.n_done - done0) / secs : 0.0,
            secs > 0 ? (double)s.n_tokens / secs : 0.0, ttft,
            s.n_stale ? " (stale attempts dropped)" : "");
    rc = interrupted || g_stop ? 130 : s.n_done == s.n_jobs ? 0 : 1;
out_keys:
    for (size_t i = 0; keys && i < n_lines; i++) {
        free(keys[i]);
    }
    free(keys);
out:
    if (parts) {
        rd_kafka_topic_partition_list_destroy(parts);
    }
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
    if (s.err) {
        fclose(s.err);
    }
    if (s.events) {
        fclose(s.events);
    }
    for (size_t i = 0; i < s.n_jobs; i++) {
        free(s.jobs[i].request_id);
        free(s.jobs[i].cid);
    }
    free(s.jobs);
    free(s.by_rid.slots);
    free(s.by_cid.slots);
    free(input);
    kg_config_clear(&cfg);
    return rc;
}
