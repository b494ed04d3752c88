/* submit_resume: what lets kgen-submit resume and report --status: the
 * state file (the input's size and hash and both topics' end offsets,
 * recorded before the first send), reading a topic from recorded offsets to
 * its end now (which jobs were sent, which results arrived), and output
 * files that keep their whole lines across runs. See submit_main.c's
 * RESUMING for the whole story. */
#include "core/kg_clock.h"
#include "kafka/kg_kafka_conf.h"
#include "schema/kg_codec.h"
#include "schema/kg_openai.h"
#include "submit_int.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- the state file ----

/* The numbers of a state line, read with strtoll/strtoull (which report what sscanf cannot:
 * no digits, or a value out of range). Each skips leading spaces, as sscanf's %d does, and
 * moves *s past the number; false when there is none or it does not fit. */
static bool read_ll(const char **s, long long *v) {
    char *end;
    errno = 0;
    long long x = strtoll(*s, &end, 10);
    if (end == *s || errno == ERANGE) {
        return false;
    }
    *v = x;
    *s = end;
    return true;
}

static bool read_ull(const char **s, int base, unsigned long long *v) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(*s, &end, base);
    if (end == *s || errno == ERANGE) {
        return false;
    }
    *v = x;
    *s = end;
    return true;
}

static bool read_int(const char **s, int *v) {
    long long x;
    if (!read_ll(s, &x) || x < INT_MIN || x > INT_MAX) {
        return false;
    }
    *v = (int)x;
    return true;
}

/* `line` (after leading spaces) starts with the word `w` followed by a space: the rest */
static const char *after_word(const char *line, const char *w) {
    while (isspace((unsigned char)*line)) {
        line++;
    }
    size_t n = strlen(w);
    return strncmp(line, w, n) == 0 && isspace((unsigned char)line[n]) ? line + n : NULL;
}

bool kg_submit_state_read(const char *path, state_t *st) {
    FILE *f = fopen(path, "r");
    char line[512];
    int version = 0;
    memset(st, 0, sizeof(*st));
    if (!f) {
        return false;
    }
    static const char magic[] = "kgen-submit-state";
    bool ok = fgets(line, sizeof(line), f) && strncmp(line, magic, sizeof(magic) - 1) == 0;
    const char *p = line + sizeof(magic) - 1;
    ok = ok && read_int(&p, &version) && version == 1;
    while (ok && fgets(line, sizeof(line), f)) {
        unsigned long long a, b;
        long long off;
        int part;
        const char *q = line + strlen("input");
        const char *jobs = after_word(line, "jobs");
        const char *r = jobs ? jobs : after_word(line, "results");
        if (strncmp(line, "input", strlen("input")) == 0 && read_ull(&q, 10, &a) &&
            read_ull(&q, 16, &b)) {
            st->in_size = a;
            st->in_hash = b;
        } else if (r && read_int(&r, &part) && read_ll(&r, &off)) {
            int *n = jobs ? &st->n_jobs_parts : &st->n_results_parts;
            if (*n < MAX_PARTS) {
                (jobs ? st->jobs_part : st->results_part)[*n] = part;
                (jobs ? st->jobs_off : st->results_off)[(*n)++] = off;
            }
        }
    }
    fclose(f);
    return ok;
}

/* Written whole to a temporary file and renamed: a crash leaves the old
 * state or the new one, never half of one. */
bool kg_submit_state_write(const char *path, const state_t *st) {
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%.4096s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        return false;
    }
    fprintf(f, "kgen-submit-state 1\ninput %llu %016llx\n", (unsigned long long)st->in_size,
            (unsigned long long)st->in_hash);
    for (int i = 0; i < st->n_jobs_parts; i++) {
        fprintf(f, "jobs %d %lld\n", st->jobs_part[i], (long long)st->jobs_off[i]);
    }
    for (int i = 0; i < st->n_results_parts; i++) {
        fprintf(f, "results %d %lld\n", st->results_part[i], (long long)st->results_off[i]);
    }
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    return ok && rename(tmp, path) == 0;
}

// ---- topics ----

/* The partitions of `topic` and their end offsets. -1 when the topic has
 * no metadata (it does not exist yet). */
int kg_submit_topic_ends(rd_kafka_t *rk, const char *topic, int32_t *parts, int64_t *ends) {
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t kerr = rd_kafka_metadata(rk, 0, rkt, &md, 15000);
    rd_kafka_topic_destroy(rkt);
    int n = -1;
    if (!kerr && md->topic_cnt == 1 && !md->topics[0].err && md->topics[0].partition_cnt > 0) {
        n = 0;
        for (int i = 0; i < md->topics[0].partition_cnt && n < MAX_PARTS; i++) {
            int32_t p = md->topics[0].partitions[i].id;
            int64_t lo = 0, hi = 0;
            if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 15000)) {
                n = -1;
                break;
            }
            parts[n] = p;
            ends[n++] = hi;
        }
    }
    if (md) {
        rd_kafka_metadata_destroy(md);
    }
    return n;
}

/* Where to read `topic` from: the recorded offset of each partition, the
 * beginning of partitions the record does not know. */
rd_kafka_topic_partition_list_t *kg_submit_start_list(rd_kafka_t *rk,
                                                      const char *topic,
                                                      const int32_t *rec_part,
                                                      const int64_t *rec_off,
                                                      int n_rec,
                                                      int64_t *ends,
                                                      int *n_parts) {
    int32_t parts[MAX_PARTS];
    int n = kg_submit_topic_ends(rk, topic, parts, ends);
    *n_parts = n;
    if (n < 0) {
        return NULL;
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n > 0 ? n : 1);
    for (int i = 0; i < n; i++) {
        int64_t from = RD_KAFKA_OFFSET_BEGINNING;
        for (int k = 0; k < n_rec; k++) {
            if (rec_part[k] == parts[i]) {
                from = rec_off[k];
            }
        }
        rd_kafka_topic_partition_list_add(l, topic, parts[i])->offset = from;
    }
    return l;
}

rd_kafka_t *
kg_submit_new_consumer(const kg_config_t *cfg, bool eof, char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = kg_kafka_conf_new(cfg, errstr, errstr_size);
    if (!conf || kg_kafka_conf_set(conf, "group.id", "kgen-submit", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "isolation.level", "read_committed", errstr, errstr_size) ||
        kg_kafka_conf_set(conf, "enable.partition.eof", eof ? "true" : "false", errstr,
                          errstr_size)) {
        if (conf) {
            rd_kafka_conf_destroy(conf);
        }
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, errstr_size);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

/* Read `l` (assigned at its offsets) up to the end offsets `ends` known
 * now, handing each message to `fn`. false when the deadline passed. */
bool kg_submit_read_to_end(rd_kafka_t *rk,
                           rd_kafka_topic_partition_list_t *l,
                           const int64_t *ends,
                           void (*fn)(void *ctx, const rd_kafka_message_t *rkm),
                           void *ctx,
                           int64_t deadline_us,
                           volatile sig_atomic_t *stop) {
    int left = 0;
    int64_t pos[MAX_PARTS];
    for (int i = 0; i < l->cnt; i++) {
        pos[i] = l->elems[i].offset >= 0 ? l->elems[i].offset : 0;
        left += pos[i] < ends[i];
    }
    if (left == 0) {
        return true;
    }
    if (rd_kafka_assign(rk, l)) {
        return false;
    }
    while (left > 0 && !*stop && kg_clock_us() < deadline_us) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(rk, 100);
        if (!rkm) {
            continue;
        }
        for (int i = 0; i < l->cnt; i++) {
            if (l->elems[i].partition != rkm->partition || pos[i] >= ends[i]) {
                continue;
            }
            if (!rkm->err && rkm->offset < ends[i]) {
                fn(ctx, rkm);
            }
            if (!rkm->err || rkm->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                pos[i] = rkm->err ? ends[i] : rkm->offset + 1;
                left -= pos[i] >= ends[i];
            }
        }
        rd_kafka_message_destroy(rkm);
    }
    rd_kafka_assign(rk, NULL);
    return left == 0;
}

void kg_submit_mark_sent(void *ctx, const rd_kafka_message_t *rkm) {
    submit_t *s = ctx;
    char key[KG_JOB_REQUEST_ID_MAX + 1];
    const void *kp = rkm->key;
    size_t kl = rkm->key_len;
    rd_kafka_headers_t *hdrs = NULL;
    const void *hv = NULL;
    size_t hn = 0;
    if (rd_kafka_message_headers(rkm, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, REQUEST_KEY_HEADER, &hv, &hn) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        hv) {
        kp = hv; /* sent with --key prefix: the key is the prefix's */
        kl = hn;
    }
    if (kp && kl > 0 && kl < sizeof(key)) {
        memcpy(key, kp, kl);
        key[kl] = '\0';
        job_state_t *j = kg_submit_find_job(s, key);
        if (j) {
            j->sent = true;
        }
    }
}

void kg_submit_count_event(void *ctx, const rd_kafka_message_t *rkm) {
    kg_submit_on_event(ctx, rkm, false);
}

// ---- output files kept across runs ----

/* Open `path` for appending what is already there (resume), or empty. On
 * resume every whole line marks its job done; a torn last line is cut. */
FILE *kg_submit_open_output(submit_t *s, const char *path, bool resume, size_t *n_kept) {
    FILE *f = fopen(path, resume ? "r+b" : "wb");
    if (!f && resume && errno == ENOENT) {
        f = fopen(path, "wb");
    }
    *n_kept = 0;
    if (!f || !resume) {
        return f;
    }
    char *line = NULL;
    size_t cap = 0;
    long good = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') {
            break; /* torn: written when the last run died */
        }
        good += n;
        char id[512];
        job_state_t *j = NULL;
        if (kg_openai_line_id(line, (size_t)n - 1, id, sizeof(id))) {
            j = s->openai ? kg_submit_find_in(s, &s->by_cid, id, true) : kg_submit_find_job(s, id);
        }
        if (j && !j->done) {
            j->done = true;
            j->sent = true;
            s->n_done++;
            (*n_kept)++;
        }
    }
    free(line);
    if (ftruncate(fileno(f), good) != 0 || fseek(f, good, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    return f;
}
