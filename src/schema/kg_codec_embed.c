/* kg_codec_embed: the job fields of embedding, rerank and score jobs
 * ("task" other than generate: input, pooling, normalize, dimensions,
 * encoding_format; query, documents, top_n; text_1, text_2), decoded into
 * kg_job_t for kg_codec.c (schemas/job.schema.json has the same rules). */
#include "kg_codec_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static kg_status_t input_list(
    json_t *v, bool tokens_alone, kg_job_t *job, const char *field, char *msg, size_t size) {
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
    if ((v = json_object_get(root, "pooling"))) {
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
    if ((v = json_object_get(root, "normalize"))) {
        if (!json_is_boolean(v)) {
            return bad(msg, size, "normalize", "true or false", v);
        }
        job->normalize = json_is_true(v);
    }
    if ((v = json_object_get(root, "dimensions"))) {
        int64_t d;
        if (!kg_codec_as_int(v, 1, INT32_MAX, &d)) {
            return bad(msg, size, "dimensions", "an integer >= 1", v);
        }
        job->dimensions = (int32_t)d;
    }
    if ((v = json_object_get(root, "encoding_format"))) {
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
    if (!score && (v = json_object_get(root, "top_n"))) {
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
    json_t *v = json_object_get(root, "task");
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
    unsigned char *raw = b64 ? malloc(bytes + 1) : NULL;
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
