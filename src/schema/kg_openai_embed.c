/* kg_openai_embed: OpenAI's Embeddings request (/v1/embeddings) and the
 * rerank and score shapes llama.cpp's server and vLLM accept (/v1/rerank,
 * /v1/score) into kgen jobs, and their results into the response bodies
 * those APIs return, for kg_openai.c (the contract is in kg_openai.h):
 *   - /v1/embeddings: input (a string, strings, token ids or lists of
 *     them), encoding_format, dimensions, model, user (ignored), and the
 *     kgen extras pooling and normalize -> an embed job; the body is
 *     {"object": "list", "data": [{"object": "embedding", "index",
 *     "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}};
 *   - /v1/rerank: query, documents (strings; a {"text"} object is read as its
 *     text), top_n -> a rerank job; the body is {"id", "object": "list"...,
 *     "results": [{"index", "relevance_score"}], "model", "usage"};
 *   - /v1/score: text_1 (a string), text_2 (a string or strings) -> a score
 *     job; the body is {"id", "object": "list", "data": [{"object": "score",
 *     "index", "score"}], "model", "usage"}.
 * metadata, priority and deadline_ms are copied as for the other shapes. */
#include "kg_codec_int.h"
#include "kg_openai_int.h"

#include <stdio.h>
#include <string.h>

static const char EMBED_URL[] = "/v1/embeddings";
static const char RERANK_URL[] = "/v1/rerank";
static const char SCORE_URL[] = "/v1/score";

static bool is_str(const json_t *v, const char *s) {
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

kg_openai_shape_t kg_openai_answer_url(const json_t *url) {
    return is_str(url, EMBED_URL)    ? KG_OPENAI_SHAPE_EMBED
           : is_str(url, RERANK_URL) ? KG_OPENAI_SHAPE_RERANK
           : is_str(url, SCORE_URL)  ? KG_OPENAI_SHAPE_SCORE
                                     : KG_OPENAI_SHAPE_NONE;
}

kg_openai_shape_t kg_openai_answer_detect(const json_t *body) {
    if (json_object_get(body, "messages") || json_object_get(body, "prompt")) {
        return KG_OPENAI_SHAPE_NONE;
    }
    return json_object_get(body, "input") ? KG_OPENAI_SHAPE_EMBED
           : json_object_get(body, "query") && json_object_get(body, "documents")
               ? KG_OPENAI_SHAPE_RERANK
           : json_object_get(body, "text_1") ? KG_OPENAI_SHAPE_SCORE
                                             : KG_OPENAI_SHAPE_NONE;
}

/* documents as strings: Cohere's and Jina's {"text": ...} objects become their text */
static json_t *documents(const json_t *d) {
    if (!json_is_array(d)) {
        return json_incref((json_t *)d);
    }
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(d); i++) {
        json_t *x = json_array_get(d, i);
        json_t *text = json_object_get(x, "text");
        json_array_append(out, json_is_object(x) && json_is_string(text) ? text : x);
    }
    return out;
}

kg_status_t kg_openai_answer_to_job(const json_t *body,
                                    kg_openai_shape_t shape,
                                    json_t *job,
                                    kg_codec_error_t *err) {
    static const char *const same[] = {"model", "metadata", "priority", "deadline_ms"};
    static const char *const embed[] = {"input", "encoding_format", "dimensions", "pooling",
                                        "normalize"};
    static const char *const score[] = {"text_1", "text_2"};
    bool ok = true;
    const char *task = shape == KG_OPENAI_SHAPE_EMBED    ? "embed"
                       : shape == KG_OPENAI_SHAPE_RERANK ? "rerank"
                                                         : "score";
    kg_codec_put(job, "task", json_string(task), &ok);
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        json_t *v = json_object_get(body, same[i]);
        if (v && !json_is_null(v)) {
            kg_codec_put(job, same[i], json_incref(v), &ok);
        }
    }
    const char *const *keys = shape == KG_OPENAI_SHAPE_EMBED ? embed : score;
    const size_t n_keys = shape == KG_OPENAI_SHAPE_EMBED   ? sizeof(embed) / sizeof(embed[0])
                          : shape == KG_OPENAI_SHAPE_SCORE ? 2
                                                           : 0;
    for (size_t i = 0; i < n_keys; i++) {
        json_t *v = json_object_get(body, keys[i]);
        if (v && !json_is_null(v)) {
            kg_codec_put(job, keys[i], json_incref(v), &ok);
        }
    }
    if (shape == KG_OPENAI_SHAPE_RERANK) {
        json_t *q = json_object_get(body, "query"), *d = json_object_get(body, "documents");
        json_t *n = json_object_get(body, "top_n");
        if (q) {
            kg_codec_put(job, "query", json_incref(q), &ok);
        }
        if (d) {
            kg_codec_put(job, "documents", documents(d), &ok);
        }
        if (n && !json_is_null(n)) {
            kg_codec_put(job, "top_n", json_incref(n), &ok);
        }
    }
    if (!ok) {
        snprintf(err->message, sizeof(err->message), "out of memory");
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

json_t *
kg_openai_answer_body(const json_t *in, const json_t *ev, const char *default_model, bool *ok) {
    const json_t *embd = json_object_get(ev, "embeddings");
    const json_t *res = json_object_get(ev, "results");
    if (!embd && !res) {
        return NULL;
    }
    const json_t *body =
        json_is_object(json_object_get(in, "body")) ? json_object_get(in, "body") : in;
    const bool score =
        is_str(json_object_get(in, "url"), SCORE_URL) ||
        (!json_object_get(in, "url") &&
         (json_object_get(body, "text_1") || is_str(json_object_get(body, "task"), "score")));
    /* the model that answered, else the one the request named, else the worker's */
    const json_t *em = json_object_get(ev, "model"), *bm = json_object_get(body, "model");
    const char *model = json_is_string(em)   ? json_string_value(em)
                        : json_is_string(bm) ? json_string_value(bm)
                        : default_model      ? default_model
                                             : "kgen";
    json_t *out = json_object(), *data = json_array(), *usage = json_object();
    const char *rid = json_string_value(json_object_get(ev, "request_id"));
    char id[160];
    snprintf(id, sizeof(id), "%s%s", embd ? "embd-" : score ? "score-" : "rerank-", rid ? rid : "");
    if (!embd) {
        kg_codec_put(out, "id", json_string(id), ok);
    }
    kg_codec_put(out, "object", json_string("list"), ok);
    kg_codec_put(out, embd || score ? "data" : "results", data, ok);
    for (size_t i = 0; data && embd && i < json_array_size(embd); i++) {
        json_t *o = json_object();
        kg_codec_put(o, "object", json_string("embedding"), ok);
        kg_codec_put(o, "index", json_integer((json_int_t)i), ok);
        kg_codec_put(o, "embedding", json_incref(json_array_get(embd, i)), ok);
        kg_codec_append(data, o, ok);
    }
    for (size_t i = 0; data && !embd && i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        json_t *o = json_object();
        if (score) {
            kg_codec_put(o, "object", json_string("score"), ok);
        }
        kg_codec_put(o, "index", json_incref(json_object_get(r, "index")), ok);
        kg_codec_put(o, score ? "score" : "relevance_score",
                     json_incref(json_object_get(r, "relevance_score")), ok);
        kg_codec_append(data, o, ok);
    }
    kg_codec_put(out, "model", json_string(model), ok);
    json_int_t pt =
        json_integer_value(json_object_get(json_object_get(ev, "usage"), "prompt_tokens"));
    kg_codec_put(out, "usage", usage, ok);
    kg_codec_put(usage, "prompt_tokens", json_integer(pt), ok);
    kg_codec_put(usage, "total_tokens", json_integer(pt), ok);
    if (!out) {
        *ok = false;
    }
    return out;
}
