/* kg_inflight: in-flight snapshots, JSON <-> C, and strike inheritance. */
#include "kg_inflight.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DUMP_FLAGS JSON_COMPACT
#define LOAD_FLAGS JSON_REJECT_DUPLICATES

void kg_inflight_clear(kg_inflight_t *s) {
    free(s->jobs_topic);
    free(s->worker_id);
    free(s->runs);
    memset(s, 0, sizeof(*s));
}

static void put(json_t *o, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(o, key, v) != 0) {
        *ok = false;
    }
}

char *kg_inflight_encode(const kg_inflight_t *s, size_t *len) {
    json_t *o = json_object();
    json_t *runs = json_array();
    bool ok = o && runs;
    char *text = NULL;
    for (size_t i = 0; ok && i < s->n_runs; i++) {
        const kg_inflight_run_t *r = &s->runs[i];
        json_t *a =
            json_pack("[IIibiib]", (json_int_t)r->offset, (json_int_t)r->count, (int)r->strikes,
                      (int)r->started, (int)r->level, (int)r->alone, (int)(r->started && r->solo));
        ok = a && json_array_append_new(runs, a) == 0;
    }
    if (ok) {
        put(o, "v", json_integer(KG_INFLIGHT_VERSION), &ok);
        put(o, "jobs_topic", json_string(s->jobs_topic ? s->jobs_topic : ""), &ok);
        put(o, "partition", json_integer(s->partition), &ok);
        put(o, "worker_id", json_string(s->worker_id ? s->worker_id : ""), &ok);
        put(o, "epoch", json_integer(s->epoch), &ok);
        put(o, "seq", json_integer(s->seq), &ok);
        put(o, "clean", json_boolean(s->clean), &ok);
        put(o, "runs", json_incref(runs), &ok);
    }
    if (ok) {
        text = json_dumps(o, DUMP_FLAGS);
    }
    if (text && len) {
        *len = strlen(text);
    }
    json_decref(runs);
    json_decref(o);
    return text;
}

static bool bad(char *errstr, size_t size, const char *what) {
    snprintf(errstr, size, "in-flight snapshot: %s", what);
    return false;
}

static bool get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

static char *get_str(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

/* One run, after `prev` (NULL: first): [offset, count, strikes, started] in
 * version 1, [offset, count, strikes, started, level, alone, solo] in 2. */
static bool
decode_run(json_t *a, int64_t version, const kg_inflight_run_t *prev, kg_inflight_run_t *r) {
    size_t n = version == 1 ? 4 : 7;
    json_t *v[7];
    if (!json_is_array(a) || json_array_size(a) != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = json_array_get(a, i);
        if (!(i == 3 || i == 6 ? json_is_boolean(v[i]) : json_is_integer(v[i]))) {
            return false;
        }
    }
    r->offset = json_integer_value(v[0]);
    r->count = json_integer_value(v[1]);
    json_int_t strikes = json_integer_value(v[2]);
    r->started = json_is_true(v[3]);
    /* version 1 ran suspects one at a time but beside other jobs: never solo */
    json_int_t level = n == 7 ? json_integer_value(v[4]) : strikes;
    json_int_t alone = n == 7 ? json_integer_value(v[5]) : 0;
    r->solo = n == 7 && json_is_true(v[6]);
    if (r->offset < 0 || r->count < 1 || r->count > KG_INFLIGHT_MAX_JOBS || strikes < 0 ||
        strikes > KG_INFLIGHT_MAX_STRIKES || r->offset > INT64_MAX - r->count || level < 0 ||
        level > strikes || alone < 0 || alone > strikes || (r->solo && !r->started)) {
        return false;
    }
    r->strikes = (int32_t)strikes;
    r->level = (int32_t)level;
    r->alone = (int32_t)alone;
    return !prev || r->offset >= prev->offset + prev->count; /* sorted, disjoint */
}

kg_status_t kg_inflight_decode(
    const char *buf, size_t len, kg_inflight_t *out, char *errstr, size_t errstr_size) {
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *o = json_loadb(buf, len, LOAD_FLAGS, &jerr);
    kg_status_t st = KG_ERR_INVALID;
    int64_t v, part;
    json_t *runs = o ? json_object_get(o, "runs") : NULL;
    json_t *clean = o ? json_object_get(o, "clean") : NULL;
    if (!json_is_object(o)) {
        bad(errstr, errstr_size, o ? "not an object" : jerr.text);
        goto out;
    }
    if (!get_int(o, "v", 1, KG_INFLIGHT_VERSION, &v)) {
        bad(errstr, errstr_size, "v: expected 1 or 2");
        goto out;
    }
    if (!get_int(o, "partition", 0, INT32_MAX, &part) ||
        !get_int(o, "epoch", 0, INT64_MAX, &out->epoch) ||
        !get_int(o, "seq", 0, INT64_MAX, &out->seq) || !json_is_boolean(clean) ||
        !json_is_array(runs) || json_array_size(runs) > KG_INFLIGHT_MAX_RUNS) {
        bad(errstr, errstr_size, "partition, epoch, seq, clean or runs missing or out of range");
        goto out;
    }
    out->partition = (int32_t)part;
    out->clean = json_is_true(clean);
    out->jobs_topic = get_str(o, "jobs_topic");
    out->worker_id = get_str(o, "worker_id");
    size_t n = json_array_size(runs);
    out->runs = calloc(n ? n : 1, sizeof(*out->runs));
    if (!out->jobs_topic || !out->worker_id || !out->runs) {
        st = json_is_string(json_object_get(o, "jobs_topic")) &&
                     json_is_string(json_object_get(o, "worker_id"))
                 ? KG_ERR_NOMEM
                 : KG_ERR_INVALID;
        bad(errstr, errstr_size,
            st == KG_ERR_NOMEM ? "out of memory" : "jobs_topic and worker_id must be strings");
        goto out;
    }
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!decode_run(json_array_get(runs, i), v, i ? &out->runs[i - 1] : NULL, &out->runs[i]) ||
            (total += out->runs[i].count) > KG_INFLIGHT_MAX_JOBS) {
            bad(errstr, errstr_size,
                "runs: expected sorted, disjoint [offset, count, strikes, started] (v1) or "
                "[offset, count, strikes, started, level, alone, solo] (v2) within bounds");
            goto out;
        }
        out->n_runs = i + 1;
    }
    st = KG_OK;
out:
    json_decref(o);
    if (st != KG_OK) {
        kg_inflight_clear(out);
    }
    return st;
}

kg_status_t
kg_inflight_inherit(const kg_inflight_t *s, int64_t committed, kg_inflight_run_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    kg_inflight_run_t *runs = calloc(s->n_runs ? s->n_runs : 1, sizeof(*runs));
    if (!runs) {
        return KG_ERR_NOMEM;
    }
    /* the levels of the groups that ran when the owner failed: a waiting job
     * on one of them (2 and up) was in the half that did not run */
    bool ran[KG_INFLIGHT_MAX_STRIKES + 1] = {false};
    for (size_t i = 0; !s->clean && i < s->n_runs; i++) {
        if (s->runs[i].started) {
            ran[s->runs[i].level] = true;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < s->n_runs; i++) {
        kg_inflight_run_t r = s->runs[i];
        if (!s->clean && r.started && r.strikes < KG_INFLIGHT_MAX_STRIKES) {
            r.strikes++; /* it was running when its owner failed */
            r.level++;
            r.alone += r.solo; /* and when it ran solo, the failure was its own */
        } else if (!s->clean && !r.started && r.level >= 2 && ran[r.level]) {
            r.level = 1;
        }
        r.started = r.solo = false;
        if (committed > r.offset) { /* the part below the committed offset is finished */
            int64_t cut = committed - r.offset < r.count ? committed - r.offset : r.count;
            r.offset += cut;
            r.count -= cut;
        }
        if (r.count > 0 && r.strikes > 0) {
            runs[k++] = r;
        }
    }
    if (k == 0) {
        free(runs);
        return KG_OK;
    }
    *out = runs;
    *n = k;
    return KG_OK;
}
