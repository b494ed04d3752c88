/* submit_int: what kgen-submit's files share: the jobs of the input and
 * their results (submit_jobs.c), resuming and the topics it reads
 * (submit_resume.c), and main's flags and loops (submit_main.c). */
#pragma once

#include "config/kg_config.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_PARTS 1024

typedef struct job_state {
    char *request_id;
    char *cid; /* the line's custom_id, else its request_id: the id of its OpenAI line */
    const char *line;
    size_t line_len;
    bool sent;
    bool done;
    char attempt[192]; /* the attempt id being assembled (worker_id/partition/offset if none) */
    int32_t next_index;
    int64_t tokens;
    int64_t sent_us;  /* its produce call returned (kg_clock_us) */
    int64_t first_us; /* its first event (token, or the terminal one) arrived; 0 until then */
} job_state_t;

typedef struct id_table {
    size_t *slots; /* open addressing: id -> job index + 1 */
    size_t n_slots;
} id_table_t;

typedef struct submit {
    job_state_t *jobs;
    size_t n_jobs;
    id_table_t by_rid, by_cid;
    size_t n_done, n_completed, n_failed;
    int64_t n_tokens;
    int64_t n_stale;
    bool openai;
    const char *default_model;
    FILE *out, *err, *events;
} submit_t;

/* What the state file records: topic end offsets before the first send. */
typedef struct state {
    uint64_t in_size, in_hash;
    int n_jobs_parts, n_results_parts;
    int32_t jobs_part[MAX_PARTS], results_part[MAX_PARTS];
    int64_t jobs_off[MAX_PARTS], results_off[MAX_PARTS];
} state_t;

/* The header that carries a job's request key when --key prefix chose the
 * Kafka key (resuming reads it). */
#define REQUEST_KEY_HEADER "kgen-request-key"

// ---- the jobs of the input and their results (submit_jobs.c) ----

/** FNV-1a of `n` bytes: the id tables, and the input's hash in the state file. */
uint64_t kg_submit_hash(const char *s, size_t n);
/** The job whose request_id (or, by_cid, whose custom_id) is `id`, or NULL. */
job_state_t *kg_submit_find_in(const submit_t *s, const id_table_t *t, const char *id, bool by_cid);
/** The job of request_id `rid`, or NULL. */
job_state_t *kg_submit_find_job(const submit_t *s, const char *rid);
/** Add the job of `line` (a request_id seen twice keeps its first line);
 * false when memory ran out. */
bool kg_submit_add_job(submit_t *s, const char *rid, const char *line, size_t len);
/** The request_id a worker will give `line` (NULL: none, the line is
 * dead-lettered) and the key to send it with (`key`, always set). */
const char *kg_submit_line_ids(const char *line, size_t len, int line_no, char *rid, char *key);
/** --key prefix:N: the routing key of `line` in `out`; false when the line
 * is no job kgen can read (it keeps its request key). */
bool kg_submit_route_key(const char *line, size_t len, int line_no, int32_t n, char *out);
/** One event of the results topic: assembled into its job's attempt, and
 * with `write` the terminal event's line written to the output. */
void kg_submit_on_event(submit_t *s, const rd_kafka_message_t *rkm, bool write);
/** " ttft_ms p50=... p90=... max=..." over the jobs with a first event, or "". */
void kg_submit_ttft_summary(const submit_t *s, char *out, size_t size);
/** Send cancels for `ids` (n of them) and wait for the broker to have them;
 * the exit status (0: all sent). */
int kg_submit_send_cancels(rd_kafka_t *producer, const char *topic, char *const *ids, size_t n);
/** --cancel-on-interrupt: cancel every job that has no result yet. */
void kg_submit_cancel_outstanding(const submit_t *s, rd_kafka_t *producer, const char *topic);

// ---- resuming and the topics (submit_resume.c) ----

/** Read the state file at `path` into *st; false when there is none or it
 * is not one. */
bool kg_submit_state_read(const char *path, state_t *st);
/** Write *st to `path` whole (a temporary file renamed over it). */
bool kg_submit_state_write(const char *path, const state_t *st);
/** The partitions of `topic` and their end offsets; -1 when the topic has
 * no metadata. */
int kg_submit_topic_ends(rd_kafka_t *rk, const char *topic, int32_t *parts, int64_t *ends);
/** Where to read `topic` from: the recorded offset of each partition, the
 * beginning of those the record does not know; *ends and *n_parts get the
 * topic's ends now. NULL when the topic has no metadata. */
rd_kafka_topic_partition_list_t *kg_submit_start_list(rd_kafka_t *rk,
                                                      const char *topic,
                                                      const int32_t *rec_part,
                                                      const int64_t *rec_off,
                                                      int n_rec,
                                                      int64_t *ends,
                                                      int *n_parts);
/** kgen-submit's consumer: no group commits, read_committed, with
 * partition EOF events when `eof`. */
rd_kafka_t *
kg_submit_new_consumer(const kg_config_t *cfg, bool eof, char *errstr, size_t errstr_size);
/** Read `l` up to `ends`, handing each message to `fn`; false when the
 * deadline passed or *stop was set first. */
bool kg_submit_read_to_end(rd_kafka_t *rk,
                           rd_kafka_topic_partition_list_t *l,
                           const int64_t *ends,
                           void (*fn)(void *ctx, const rd_kafka_message_t *rkm),
                           void *ctx,
                           int64_t deadline_us,
                           volatile sig_atomic_t *stop);
/** kg_submit_read_to_end callbacks (ctx: the submit_t): a job message marks its job
 * sent; a result event is counted without writing it. */
void kg_submit_mark_sent(void *ctx, const rd_kafka_message_t *rkm);
void kg_submit_count_event(void *ctx, const rd_kafka_message_t *rkm);
/** Open an output file: on resume keep its whole lines (each marks its job
 * done; *n_kept counts them) and cut a torn last one; else empty it. */
FILE *kg_submit_open_output(submit_t *s, const char *path, bool resume, size_t *n_kept);
