/* submit_jobs: kgen-submit's jobs and their results. Every input line with
 * a request_id becomes a job, found by request_id or custom_id through two
 * open-addressing tables; the events of the results topic are assembled per
 * job and attempt (the events' attempt id: a superseded attempt's
 * token events are dropped, the first terminal event wins), and the
 * terminal one is written out, as is or as an OpenAI Batch output line.
 * Cancelling the jobs without a result is here too. */
#include "core/kg_clock.h"
#include "core/kg_log.h"
#include "kafka/kg_cancel.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"
#include "schema/kg_openai.h"
#include "schema/kg_routing.h"
#include "submit_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t kg_submit_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    }
    return h;
}

// ---- the jobs of the input ----

job_state_t *
kg_submit_find_in(const submit_t *s, const id_table_t *t, const char *id, bool by_cid) {
    for (size_t i = kg_submit_hash(id, strlen(id)) & (t->n_slots - 1);;
         i = (i + 1) & (t->n_slots - 1)) {
        if (!t->slots[i]) {
            return NULL;
        }
        job_state_t *j = &s->jobs[t->slots[i] - 1];
        if (strcmp(by_cid ? j->cid : j->request_id, id) == 0) {
            return j;
        }
    }
}

static void put_in(id_table_t *t, const char *id, size_t index) {
    for (size_t i = kg_submit_hash(id, strlen(id)) & (t->n_slots - 1);;
         i = (i + 1) & (t->n_slots - 1)) {
        if (!t->slots[i]) {
            t->slots[i] = index + 1;
            return;
        }
    }
}

job_state_t *kg_submit_find_job(const submit_t *s, const char *rid) {
    return kg_submit_find_in(s, &s->by_rid, rid, false);
}

bool kg_submit_add_job(submit_t *s, const char *rid, const char *line, size_t len) {
    if (kg_submit_find_job(s, rid)) {
        return true; /* the same request_id twice: one result */
    }
    char cid[512];
    job_state_t *j = &s->jobs[s->n_jobs];
    j->request_id = strdup(rid);
    j->cid = strdup(kg_openai_line_id(line, len, cid, sizeof(cid)) ? cid : rid);
    j->line = line;
    j->line_len = len;
    if (!j->request_id || !j->cid) {
        return false;
    }
    put_in(&s->by_rid, j->request_id, s->n_jobs);
    if (!kg_submit_find_in(s, &s->by_cid, j->cid, true)) {
        put_in(&s->by_cid, j->cid, s->n_jobs);
    }
    s->n_jobs++;
    return true;
}

/* The request_id a worker will give `line` (NULL: none, the line is
 * dead-lettered) and the key to send it with (`key`, always set). */
const char *kg_submit_line_ids(const char *line, size_t len, int line_no, char *rid, char *key) {
    kg_job_t *job = NULL;
    kg_codec_error_t cerr;
    kg_codec_opts_t o = kg_codec_opts_default();
    snprintf(key, 32, "line-%d", line_no);
    o.key = key;
    o.key_len = strlen(key);
    const char *got = NULL;
    if (kg_codec_decode_job_opts(line, len, &o, &job, &cerr) == KG_OK) {
        got = job->request_id;
    } else if (cerr.kind == KG_CODEC_INVALID && cerr.request_id[0]) {
        got = cerr.request_id;
    }
    if (got) {
        snprintf(rid, KG_JOB_REQUEST_ID_MAX + 1, "%s", got);
        snprintf(key, KG_JOB_REQUEST_ID_MAX + 1, "%s", got);
    }
    kg_job_free(job);
    return got ? rid : NULL;
}

/* --key prefix:N: the routing key of `line` (kg_routing) in `out`; false when
 * the line is no job kgen can read (it keeps its request key). */
bool kg_submit_route_key(const char *line, size_t len, int line_no, int32_t n, char *out) {
    kg_job_t *job = NULL;
    kg_codec_error_t cerr;
    kg_codec_opts_t o = kg_codec_opts_default();
    char key[32];
    snprintf(key, sizeof(key), "line-%d", line_no);
    o.key = key;
    o.key_len = strlen(key);
    if (kg_codec_decode_job_opts(line, len, &o, &job, &cerr) != KG_OK) {
        return false;
    }
    kg_routing_prefix_key(job, n, out);
    kg_job_free(job);
    return true;
}

// ---- results ----

static void write_result(submit_t *s, job_state_t *j, const char *event, size_t len, bool failed) {
    if (!s->openai) {
        fwrite(event, 1, len, s->out);
        fputc('\n', s->out);
        fflush(s->out);
        return;
    }
    kg_openai_output_opts_t oo = {.default_model = s->default_model};
    char *line = NULL, msg[128];
    size_t n = 0;
    bool is_error = failed;
    if (kg_openai_batch_output(j->line, j->line_len, event, len, &oo, &line, &n, &is_error, msg,
                               sizeof(msg)) != KG_OK) {
        KG_LOG_WARN("submit", "no OpenAI line for request_id=%s: %s", j->request_id, msg);
        return;
    }
    FILE *f = is_error && s->err ? s->err : s->out;
    fwrite(line, 1, n, f);
    fputc('\n', f);
    fflush(f);
    free(line);
}

void kg_submit_on_event(submit_t *s, const rd_kafka_message_t *rkm, bool write) {
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
    job_state_t *j = kg_submit_find_job(s, c->request_id);
    if (!j || j->done) {
        kg_event_free(ev); /* not ours, or a duplicate after the job finished */
        return;
    }
    if (!j->first_us) {
        j->first_us = kg_clock_us();
    }
    /* an event's attempt id; workers before it had none, and then the best key is the triple,
     * which two runs on one worker share */
    char attempt[192];
    if (c->attempt) {
        snprintf(attempt, sizeof(attempt), "%s", c->attempt);
    } else {
        snprintf(attempt, sizeof(attempt), "%s/%d/%lld", c->worker_id, c->partition,
                 (long long)c->offset);
    }
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
            s->n_completed++;
            s->n_tokens += ev->done.completion_tokens;
        } else {
            s->n_failed++;
        }
        if (write) {
            write_result(s, j, rkm->payload, rkm->len, ev->type == KG_EVENT_ERROR);
        }
    }
    kg_event_free(ev);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Time to first token as a submitter sees it: from a job's produce to its
 * first event (a token, or the terminal event of a job that streams none),
 * over the jobs that have one: "ttft_ms p50=... p90=... max=..." in `out`. */
void kg_submit_ttft_summary(const submit_t *s, char *out, size_t size) {
    int64_t *v = malloc((s->n_jobs ? s->n_jobs : 1) * sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; v && i < s->n_jobs; i++) {
        if (s->jobs[i].first_us && s->jobs[i].sent_us) {
            v[n++] = s->jobs[i].first_us - s->jobs[i].sent_us;
        }
    }
    out[0] = '\0';
    if (n > 0) {
        qsort(v, n, sizeof(*v), cmp_i64);
        const size_t i50 = n / 2, i90 = n * 9 / 10; /* the quantiles' ranks */
        snprintf(out, size, " ttft_ms p50=%.1f p90=%.1f max=%.1f", (double)v[i50] / 1e3,
                 (double)v[i90] / 1e3, (double)v[n - 1] / 1e3);
    }
    free(v);
}

/* Send cancels for `ids` (n of them) and wait for the broker to have them. */
int kg_submit_send_cancels(rd_kafka_t *producer, const char *topic, char *const *ids, size_t n) {
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        rd_kafka_resp_err_t err = kg_cancel_send(producer, topic, ids[i]);
        if (err) {
            fprintf(stderr, "kgen-submit: cancel %s: %s\n", ids[i], rd_kafka_err2str(err));
            continue;
        }
        sent++;
    }
    if (rd_kafka_flush(producer, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kgen-submit: %d cancels not delivered\n", rd_kafka_outq_len(producer));
        return 1;
    }
    fprintf(stderr, "kgen-submit: sent %zu cancels to %s\n", sent, topic);
    return sent == n ? 0 : 1;
}

/* --cancel-on-interrupt: cancel every job that has no result yet. */
void kg_submit_cancel_outstanding(const submit_t *s, rd_kafka_t *producer, const char *topic) {
    size_t n = 0;
    char **ids = malloc((s->n_jobs ? s->n_jobs : 1) * sizeof(*ids));
    for (size_t i = 0; ids && i < s->n_jobs; i++) {
        if (!s->jobs[i].done) {
            ids[n++] = s->jobs[i].request_id;
        }
    }
    fprintf(stderr, "\nkgen-submit: interrupted: cancelling %zu jobs (Ctrl-C again to leave)\n", n);
    if (ids) {
        (void)kg_submit_send_cancels(producer, topic, ids, n);
    }
    free(ids);
}
