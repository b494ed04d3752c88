/* kg_codec_embed: the job fields of embedding, rerank and score jobs
 * ("task" other than generate: input, pooling, normalize, dimensions,
 * encoding_format; query, documents, top_n; text_1, text_2), decoded into
 * kg_job_t for kg_codec.c (schemas/job.schema.json has the same rules). */
#include "kg_codec_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Absent and null both mean "the default", as for every job field. */
static json_t *given(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static kg_status_t bad(char *msg, size_t size, const char *field, const char *expect, json_t *v) {
    char what[64];
    kg_codec_describe_json(v, what, sizeof(what));
    snprintf(msg, size, "%s: expected %s, got %s", field, expect, what);
    return KG_ERR_INVALID;
}

/* A non-empty string, or a non-empty array of token ids, into `in`. */
static kg_status_t one_input(json_t *v, kg_job_input_t *in) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) {
            return KG_ERR_INVALID;
        }
        in->len = json_string_length(v);
        in->text = kg_codec_dup_bytes(json_string_value(v), in->len);
        return in->text ? KG_OK : KG_ERR_NOMEM;
    }
    const size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > INT32_MAX / 4) {
        return KG_ERR_INVALID;
    }
    in->tokens = malloc(n * sizeof(int32_t));
    if (!in->tokens) {
        return KG_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        if (!kg_codec_as_int(json_array_get(v, i), 0, INT32_MAX, &id)) {
            return KG_ERR_INVALID;
        }
        in->tokens[i] = (int32_t)id;
    }
    in->n_tokens = (int32_t)n;
    return KG_OK;
}

/* A list of inputs: one string, one token list, or an array of either
 * (OpenAI's input rule: an array of integers is one input). */
static kg_status_t
input_list(json_t *v, bool tokens_alone, kg_job_t *job, const char *field, char *msg, size_t size) {
    const char *expect = "a non-empty string or token id list, or an array of them (at most "
                         "2048)";
    json_t *first = json_array_get(v, 0);
    bool single = json_is_string(v) || (tokens_alone && json_is_array(v) && json_is_integer(first));
    size_t n = single ? 1 : json_array_size(v);
    if ((!single && !json_is_array(v)) || n == 0 || n > KG_JOB_MAX_INPUTS) {
        return bad(msg, size, field, expect, v);
    }
    job->inputs = calloc(n, sizeof(*job->inputs));
    if (!job->inputs) {
        return KG_ERR_NOMEM;
    }
    job->n_inputs = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *x = single ? v : json_array_get(v, i);
        kg_status_t st = one_input(x, &job->inputs[i]);
        if (st == KG_ERR_INVALID) {
            char f[48];
            snprintf(f, sizeof(f), "%s[%zu]", field, i);
            return bad(msg, size, single ? field : f, "a non-empty string or token id list", x);
        }
        if (st != KG_OK) {
            return st;
        }
    }
    return KG_OK;
}

static kg_status_t embed_fields(json_t *root, kg_job_t *job, char *msg, size_t size) {
    json_t *v;
    kg_status_t st;
    if ((st = input_list(json_object_get(root, "input"), true, job, "input", msg, size)) != KG_OK) {
        return st;
    }
    if ((v = given(root, "pooling"))) {
        static const char *const names[] = {"none", "mean", "cls", "last"};
        int k = -1;
        for (int i = 1; i < 4 && json_is_string(v); i++) {
            k = strcmp(json_string_value(v), names[i]) == 0 ? i : k;
        }
        if (k < 0) {
            return bad(msg, size, "pooling", "one of \"mean\", \"cls\" or \"last\"", v);
        }
        job->pooling = (kg_pooling_t)k;
    }
    if ((v = given(root, "normalize"))) {
        if (!json_is_boolean(v)) {
            return bad(msg, size, "normalize", "true or false", v);
        }
        job->normalize = json_is_true(v);
    }
    if ((v = given(root, "dimensions"))) {
        int64_t d;
        if (!kg_codec_as_int(v, 1, INT32_MAX, &d)) {
            return bad(msg, size, "dimensions", "an integer >= 1", v);
        }
        job->dimensions = (int32_t)d;
    }
    if ((v = given(root, "encoding_format"))) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "float") != 0 && strcmp(s, "base64") != 0) {
            return bad(msg, size, "encoding_format", "\"float\" or \"base64\"", v);
        }
        job->base64 = strcmp(s, "base64") == 0;
    }
    return KG_OK;
}

static kg_status_t rerank_fields(json_t *root, kg_job_t *job, char *msg, size_t size) {
    const bool score = job->task == KG_TASK_SCORE;
    const char *qf = score ? "text_1" : "query", *df = score ? "text_2" : "documents";
    json_t *q = json_object_get(root, qf), *v;
    kg_status_t st = q ? one_input(q, &job->query) : KG_ERR_INVALID;
    if (st == KG_ERR_INVALID) {
        return bad(msg, size, qf, "a non-empty string or token id list", q);
    }
    if (st != KG_OK) {
        return st;
    }
    json_t *d = json_object_get(root, df);
    /* documents is always a list; text_2 may be one string */
    if (!score && !json_is_array(d)) {
        return bad(msg, size, df, "an array of 1..2048 strings or token id lists", d);
    }
    if ((st = input_list(d, false, job, df, msg, size)) != KG_OK) {
        return st;
    }
    if (!score && (v = given(root, "top_n"))) {
        int64_t n;
        if (!kg_codec_as_int(v, 1, INT32_MAX, &n)) {
            return bad(msg, size, "top_n", "an integer >= 1", v);
        }
        job->top_n = (int32_t)n;
    }
    return KG_OK;
}

kg_status_t kg_codec_decode_task(json_t *root, kg_job_t *job, char *msg, size_t size) {
    static const char *const names[] = {"generate", "embed", "rerank", "score"};
    json_t *v = given(root, "task");
    job->normalize = true;
    job->pooling = KG_POOLING_MODEL;
    if (!v) {
        return KG_OK;
    }
    int k = -1;
    for (int i = 0; i < 4 && json_is_string(v); i++) {
        k = strcmp(json_string_value(v), names[i]) == 0 ? i : k;
    }
    if (k < 0) {
        return bad(msg, size, "task", "one of \"generate\", \"embed\", \"rerank\" or \"score\"", v);
    }
    job->task = (kg_task_t)k;
    if (job->task == KG_TASK_GENERATE) {
        return KG_OK;
    }
    static const char *const prompts[] = {"prompt", "prompt_tokens", "messages"};
    for (int i = 0; i < 3; i++) {
        if (json_object_get(root, prompts[i])) {
            snprintf(msg, size, "%s: a %s job takes %s, not a prompt", prompts[i], names[k],
                     job->task == KG_TASK_EMBED    ? "input"
                     : job->task == KG_TASK_RERANK ? "query and documents"
                                                   : "text_1 and text_2");
            return KG_ERR_INVALID;
        }
    }
    return job->task == KG_TASK_EMBED ? embed_fields(root, job, msg, size)
                                      : rerank_fields(root, job, msg, size);
}

// ---- the done event's embeddings and results ----

/* base64 (RFC 4648, padded) of n bytes into out (4 * ceil(n / 3) + 1). */
static void base64(const unsigned char *in, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t b = (uint32_t)in[i] << 16;
        b |= i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0;
        b |= i + 2 < n ? in[i + 2] : 0;
        out[o++] = tab[(b >> 18) & 63];
        out[o++] = tab[(b >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(b >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[b & 63] : '=';
    }
    out[o] = '\0';
}

json_t *kg_codec_embeddings_json(const float *v, int32_t n, int32_t dim, bool b64) {
    bool ok = true;
    json_t *arr = json_array();
    const size_t bytes = (size_t)dim * 4;
    unsigned char *raw = b64 ? calloc(bytes + 1, 1) : NULL;
    char *text = b64 ? malloc(4 * ((bytes + 2) / 3) + 1) : NULL;
    if (!arr || (b64 && (!raw || !text))) {
        ok = false;
    }
    for (int32_t i = 0; ok && i < n; i++) {
        const float *row = v + (size_t)i * (size_t)dim;
        if (b64) {
            for (int32_t k = 0; k < dim; k++) { /* little-endian whatever the host */
                uint32_t u;
                memcpy(&u, &row[k], 4);
                for (int b = 0; b < 4; b++) {
                    raw[(size_t)k * 4 + (size_t)b] = (unsigned char)(u >> (8 * b));
                }
            }
            base64(raw, bytes, text);
            kg_codec_append(arr, json_string(text), &ok);
            continue;
        }
        json_t *r = json_array();
        for (int32_t k = 0; r && k < dim; k++) {
            kg_codec_append(r, kg_codec_float_json(row[k]), &ok);
        }
        kg_codec_append(arr, r, &ok);
    }
    free(raw);
    free(text);
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

json_t *kg_codec_results_json(const kg_rank_result_t *r, int32_t n) {
    bool ok = true;
    json_t *arr = json_array();
    for (int32_t i = 0; arr && i < n; i++) {
        json_t *o = json_object();
        kg_codec_put(o, "index", json_integer(r[i].index), &ok);
        kg_codec_put(o, "relevance_score", kg_codec_float_json(r[i].relevance_score), &ok);
        kg_codec_append(arr, o, &ok);
    }
    if (!ok || !arr) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

// ---- encoding the fields (kg_codec_encode_job) ----

static json_t *input_json(const kg_job_input_t *in) {
    if (in->text) {
        return kg_codec_text_json(in->text, in->len);
    }
    json_t *a = json_array();
    bool ok = a != NULL;
    for (int32_t i = 0; ok && i < in->n_tokens; i++) {
        kg_codec_append(a, json_integer(in->tokens[i]), &ok);
    }
    if (!ok) {
        json_decref(a);
        return NULL;
    }
    return a;
}

void kg_codec_put_task(json_t *o, const kg_job_t *job, bool *ok) {
    static const char *const tasks[] = {"generate", "embed", "rerank", "score"};
    static const char *const pools[] = {"none", "mean", "cls", "last", "rank"};
    if (job->task == KG_TASK_GENERATE) {
        return;
    }
    kg_codec_put(o, "task", json_string(tasks[job->task]), ok);
    json_t *list = json_array();
    for (int32_t i = 0; list && i < job->n_inputs; i++) {
        kg_codec_append(list, input_json(&job->inputs[i]), ok);
    }
    const char *field = job->task == KG_TASK_EMBED    ? "input"
                        : job->task == KG_TASK_RERANK ? "documents"
                                                      : "text_2";
    kg_codec_put(o, field, list, ok);
    if (job->task == KG_TASK_EMBED) {
        if (job->pooling > KG_POOLING_NONE && job->pooling <= KG_POOLING_RANK) {
            kg_codec_put(o, "pooling", json_string(pools[job->pooling]), ok);
        }
        if (!job->normalize) {
            kg_codec_put(o, "normalize", json_false(), ok);
        }
        if (job->dimensions > 0) {
            kg_codec_put(o, "dimensions", json_integer(job->dimensions), ok);
        }
        if (job->base64) {
            kg_codec_put(o, "encoding_format", json_string("base64"), ok);
        }
        return;
    }
    kg_codec_put(o, job->task == KG_TASK_RERANK ? "query" : "text_1", input_json(&job->query), ok);
    if (job->top_n > 0) {
        kg_codec_put(o, "top_n", json_integer(job->top_n), ok);
    }
}

// ---- decoding a done event's embeddings and results ----

static int b64_value(char c) {
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

/* A base64 string of little-endian float32 values into out (cap floats);
 * the count, or -1 when it is not that. */
static int64_t unbase64(const char *s, size_t len, float *out, int64_t cap) {
    if (len % 4 != 0) {
        return -1;
    }
    size_t n_bytes = len / 4 * 3 - (len && s[len - 1] == '=') - (len > 1 && s[len - 2] == '=');
    if (n_bytes % 4 != 0 || (int64_t)(n_bytes / 4) > cap) {
        return -1;
    }
    unsigned char quad[4] = {0};
    int at = 0;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t b = 0;
        for (int k = 0; k < 4; k++) {
            int v =
                s[i + (size_t)k] == '=' && i + 4 == len && k >= 2 ? 0 : b64_value(s[i + (size_t)k]);
            if (v < 0) {
                return -1;
            }
            b = b << 6 | (uint32_t)v;
        }
        for (int k = 0; k < 3 && o < n_bytes; k++, o++) {
            quad[at++] = (unsigned char)(b >> (16 - 8 * k));
            if (at == 4) {
                uint32_t u = quad[0] | (uint32_t)quad[1] << 8 | (uint32_t)quad[2] << 16 |
                             (uint32_t)quad[3] << 24;
                memcpy(&out[(o - 3) / 4], &u, 4);
                at = 0;
            }
        }
    }
    return (int64_t)(n_bytes / 4);
}

/* The floats of one embedding (an array of numbers or a base64 string). */
static int64_t one_embedding(const json_t *v, float *out, int64_t cap) {
    if (json_is_string(v)) {
        return unbase64(json_string_value(v), json_string_length(v), out, cap);
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) > cap) {
        return -1;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_number(x)) {
            return -1;
        }
        out[i] = (float)json_number_value(x);
    }
    return (int64_t)json_array_size(v);
}

kg_status_t kg_codec_decode_answer(json_t *root, kg_event_done_t *e, char *msg, size_t size) {
    json_t *em = json_object_get(root, "embeddings"), *res = json_object_get(root, "results");
    if (em) {
        const size_t n = json_array_size(em);
        const json_t *first = json_array_get(em, 0);
        const int64_t dim = json_is_string(first) ? (int64_t)json_string_length(first) / 4 * 3 / 4
                                                  : (int64_t)json_array_size(first);
        if (!json_is_array(em) || n == 0 || n > INT32_MAX || dim <= 0) {
            snprintf(msg, size, "embeddings: expected a non-empty array of vectors");
            return KG_ERR_INVALID;
        }
        float *v = malloc(n * (size_t)dim * sizeof(float));
        if (!v) {
            return KG_ERR_NOMEM;
        }
        e->embeddings = v;
        for (size_t i = 0; i < n; i++) {
            if (one_embedding(json_array_get(em, i), v + i * (size_t)dim, dim) != dim) {
                snprintf(msg, size,
                         "embeddings: expected vectors of one length (numbers or base64 float32)");
                return KG_ERR_INVALID;
            }
        }
        e->n_embeddings = (int32_t)n;
        e->embedding_dim = (int32_t)dim;
        e->embeddings_base64 = json_is_string(first);
    }
    if (res) {
        const size_t n = json_array_size(res);
        kg_rank_result_t *r = malloc((n > 0 ? n : 1) * sizeof(*r));
        if (!r) {
            return KG_ERR_NOMEM;
        }
        e->results = r;
        e->has_results = true;
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(res, i),
                         *score = json_object_get(x, "relevance_score");
            int64_t index;
            if (!kg_codec_as_int(json_object_get(x, "index"), 0, INT32_MAX, &index) ||
                !json_is_number(score)) {
                snprintf(msg, size, "results: expected objects with index and relevance_score");
                return KG_ERR_INVALID;
            }
            r[i] = (kg_rank_result_t){.index = (int32_t)index,
                                      .relevance_score = (float)json_number_value(score)};
            e->n_results = (int32_t)i + 1;
        }
        if (!json_is_array(res)) {
            snprintf(msg, size, "results: expected an array");
            return KG_ERR_INVALID;
        }
    }
    return KG_OK;
}
