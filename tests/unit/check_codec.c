/* check_codec: the job/event codec against the examples in schemas/ (jq
 * tests/jq.test style: the data drives the test) and against hostile input.
 *
 * This test reads JSON with jansson itself, independently of the codec, to
 * compare documents as values: it checks the codec, so it must not use the
 * codec to judge the codec's output. */
#include "check_common.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"
#include "schema/kg_job.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define EXAMPLES KG_SOURCE_DIR "/schemas/examples"

// ---- helpers ----

/* Sorted names in `dir` starting with `prefix`; NULL-terminated, caller frees. */
static char **list_dir(const char *dir, const char *prefix, size_t *n) {
    DIR *d = opendir(dir);
    char **names = calloc(256, sizeof(char *));
    struct dirent *de;
    *n = 0;
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)) != NULL && *n < 255) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) {
            names[(*n)++] = strdup(de->d_name);
        }
    }
    closedir(d);
    for (size_t i = 0; i < *n; i++) { // insertion sort: a few dozen names
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    }
    return names;
}

static void free_list(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
}

static char *read_example(const char *sub, const char *name, size_t *len) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s/%s", EXAMPLES, sub, name);
    char *data = kg_test_read_file(path, len);
    ck_assert_msg(data != NULL, "cannot read %s", path);
    return data;
}

static json_t *parse(const char *text, size_t len) {
    json_error_t e;
    json_t *v = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_ANY, &e);
    ck_assert_msg(v != NULL, "test could not parse: %s in [%.*s]", e.text, (int)len, text);
    return v;
}

/* Equality of JSON values where numbers compare by value (1 == 1.0), as
 * JSON Schema and most readers see them. */
static bool same(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b)) {
            return json_integer_value(a) == json_integer_value(b);
        }
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b)) {
        return false;
    }
    if (json_is_string(a)) {
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    }
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) {
            return false;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            if (!same(json_array_get(a, i), json_array_get(b, i))) {
                return false;
            }
        }
        return true;
    }
    if (json_is_object(a)) {
        const char *k;
        json_t *v;
        if (json_object_size(a) != json_object_size(b)) {
            return false;
        }
        json_object_foreach((json_t *)a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !same(v, w)) {
                return false;
            }
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b); // true, false, null
}

static char *show(const json_t *v) {
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

static void assert_same(const json_t *want, const json_t *got, const char *what) {
    if (!same(want, got)) {
        char *w = show(want);
        char *g = show(got);
        ck_abort_msg("%s:\nwant %s\n got %s", what, w, g ? g : "(absent)");
    }
}

// ---- valid jobs: decode, re-encode, compare as values ----

/* The job fields and their defaults ("seed" derives from request_id,
 * deadline_ms and metadata are absent when not given). */
static const struct {
    const char *key;
    const char *default_json;
} job_keys[] = {
    {"schema_version", "1"},
    {"request_id", NULL},
    {"prompt", NULL},
    {"prompt_tokens", NULL},
    {"messages", NULL},
    {"max_tokens", "256"},
    {"temperature", "1.0"},
    {"top_k", "-1"},
    {"top_p", "1.0"},
    {"min_p", "0.0"},
    {"repetition_penalty", "1.0"},
    {"frequency_penalty", "0.0"},
    {"presence_penalty", "0.0"},
    {"seed", NULL},
    {"stop", "[]"},
    {"stream", "true"},
    {"logprobs", "0"},
    {"deadline_ms", NULL},
    {"priority", "0"},
    {"ignore_eos", "false"},
    {"n", "1"},
    {"model", NULL},
    {"lora", NULL},
    {"logit_bias", NULL},
    {"metadata", NULL},
    {"response_format", NULL},
    {"regex", NULL},
    {"choice", NULL},
    {"grammar", NULL},
    {"task", NULL},
    {"input", NULL},
    {"pooling", NULL},
    {"normalize", NULL},
    {"dimensions", NULL},
    {"encoding_format", NULL},
    {"query", NULL},
    {"documents", NULL},
    {"top_n", NULL},
    {"text_1", NULL},
    {"text_2", NULL},
    /* kg_codec_reasoning.c */
    {"chat_template_kwargs", NULL},
    {"reasoning_effort", NULL},
    {"tools", NULL},
    {"tool_choice", NULL},
    {"parallel_tool_calls", NULL},
    {"reasoning_format", NULL},
    {"thinking_token_budget", NULL},
};
#define N_JOB_KEYS (sizeof(job_keys) / sizeof(job_keys[0]))

static bool is_job_key(const char *k) {
    for (size_t i = 0; i < N_JOB_KEYS; i++) {
        if (strcmp(job_keys[i].key, k) == 0) {
            return true;
        }
    }
    return false;
}

/* What the original says for `key` in canonical form: stop as an array,
 * messages without the extra fields the codec ignores; NULL when absent. */
static json_t *canonical(json_t *orig, const char *key) {
    json_t *v = json_object_get(orig, key);
    if (!v || json_is_null(v)) {
        return NULL;
    }
    if (strcmp(key, "stop") == 0 && json_is_string(v)) {
        return json_pack("[O]", v);
    }
    /* embed inputs and text_2 as a list; the defaults of normalize and
     * encoding_format are not echoed */
    if ((strcmp(key, "input") == 0 || strcmp(key, "text_2") == 0) &&
        (json_is_string(v) || json_is_integer(json_array_get(v, 0)))) {
        return json_pack("[O]", v);
    }
    if ((strcmp(key, "normalize") == 0 && json_is_true(v)) ||
        (strcmp(key, "encoding_format") == 0 && strcmp(json_string_value(v), "float") == 0) ||
        (strcmp(key, "task") == 0 && strcmp(json_string_value(v), "generate") == 0)) {
        return NULL;
    }
    if (strcmp(key, "response_format") == 0) {
        /* text is no constraint (not echoed); json_schema is echoed with its
         * name, strict (default false) and schema, without the description */
        const char *type = json_string_value(json_object_get(v, "type"));
        if (type && strcmp(type, "text") == 0) {
            return NULL;
        }
        json_t *js = json_object_get(v, "json_schema");
        if (!js) {
            return json_incref(v);
        }
        json_t *strict = json_object_get(js, "strict");
        json_t *out_js = json_pack("{s:O,s:b}", "name", json_object_get(js, "name"), "strict",
                                   json_is_true(strict));
        if (json_object_get(js, "schema") && !json_is_null(json_object_get(js, "schema"))) {
            json_object_set(out_js, "schema", json_object_get(js, "schema"));
        }
        return json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", out_js);
    }
    if ((strcmp(key, "parallel_tool_calls") == 0 && json_is_true(v)) ||
        (strcmp(key, "tool_choice") == 0 && json_is_string(v) &&
         strcmp(json_string_value(v), "auto") == 0)) {
        return NULL; /* the defaults are not echoed */
    }
    if (strcmp(key, "messages") == 0) {
        /* role and content (null beside tool calls: ""), a turn's tool calls, a tool
         * result's tool_call_id and name */
        json_t *arr = json_array();
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *m = json_array_get(v, i);
            json_t *content = json_object_get(m, "content");
            json_t *o = json_pack("{s:O,s:o}", "role", json_object_get(m, "role"), "content",
                                  json_is_null(content) ? json_string("") : json_incref(content));
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *calls = json_object_get(m, "tool_calls");
            if (json_array_size(calls) > 0) {
                json_object_set(o, "tool_calls", calls);
            }
            if (json_object_get(m, "tool_call_id")) {
                json_object_set(o, "tool_call_id", json_object_get(m, "tool_call_id"));
            }
            if (role && strcmp(role, "tool") == 0 && json_object_get(m, "name")) {
                json_object_set(o, "name", json_object_get(m, "name"));
            }
            json_array_append_new(arr, o);
        }
        return arr;
    }
    return json_incref(v);
}

static void check_round_trip(const char *name, json_t *orig, json_t *enc) {
    char what[256];
    const char *rid = json_string_value(json_object_get(orig, "request_id"));
    for (size_t i = 0; i < N_JOB_KEYS; i++) {
        const char *key = job_keys[i].key;
        json_t *want = canonical(orig, key);
        json_t *got = json_object_get(enc, key);
        snprintf(what, sizeof(what), "%s: %s", name, key);
        if (!want && strcmp(key, "seed") == 0) {
            want = json_integer((json_int_t)kg_job_default_seed(rid));
        } else if (!want && job_keys[i].default_json) {
            want = json_loads(job_keys[i].default_json, JSON_DECODE_ANY, NULL);
        }
        if (want) {
            ck_assert_msg(got != NULL, "%s is missing from the encoding", what);
            assert_same(want, got, what);
        } else {
            ck_assert_msg(got == NULL, "%s should be absent from the encoding", what);
        }
        json_decref(want);
    }
    const char *k;
    json_t *v;
    json_object_foreach(enc, k, v) {
        ck_assert_msg(is_job_key(k), "%s: unknown field %s was echoed", name, k);
    }
}

static void check_same_job(const kg_job_t *a, const kg_job_t *b) {
    ck_assert_str_eq(a->request_id, b->request_id);
    ck_assert_int_eq(a->prompt_kind, b->prompt_kind);
    ck_assert_uint_eq(a->prompt_len, b->prompt_len);
    ck_assert(a->prompt_len == 0 || memcmp(a->prompt, b->prompt, a->prompt_len) == 0);
    ck_assert_int_eq(a->n_prompt_tokens, b->n_prompt_tokens);
    for (int32_t i = 0; i < a->n_prompt_tokens; i++) {
        ck_assert_int_eq(a->prompt_tokens[i], b->prompt_tokens[i]);
    }
    ck_assert_int_eq(a->n_messages, b->n_messages);
    for (int32_t i = 0; i < a->n_messages; i++) {
        ck_assert_str_eq(a->messages[i].role, b->messages[i].role);
        ck_assert_str_eq(a->messages[i].content, b->messages[i].content);
    }
    ck_assert_int_eq(a->n_stop, b->n_stop);
    for (int32_t i = 0; i < a->n_stop; i++) {
        ck_assert_str_eq(a->stop[i], b->stop[i]);
    }
    const kg_sampling_params_t *x = &a->sampling;
    const kg_sampling_params_t *y = &b->sampling;
    ck_assert(x->temperature == y->temperature && x->top_p == y->top_p && x->min_p == y->min_p);
    ck_assert(x->repetition_penalty == y->repetition_penalty);
    ck_assert(x->frequency_penalty == y->frequency_penalty);
    ck_assert(x->presence_penalty == y->presence_penalty);
    ck_assert_int_eq(x->top_k, y->top_k);
    ck_assert_int_eq(x->penalty_last_n, y->penalty_last_n);
    ck_assert_uint_eq(x->seed, y->seed);
    ck_assert_int_eq(x->n_logprobs, y->n_logprobs);
    ck_assert_int_eq(a->max_tokens, b->max_tokens);
    ck_assert_int_eq(a->stream, b->stream);
    ck_assert_int_eq(a->ignore_eos, b->ignore_eos);
    ck_assert_int_eq(a->deadline_ms, b->deadline_ms);
    ck_assert_int_eq(a->priority, b->priority);
    ck_assert_int_eq(a->n, b->n);
    ck_assert_int_eq(a->model == NULL, b->model == NULL);
    if (a->model) {
        ck_assert_str_eq(a->model, b->model);
    }
    ck_assert_int_eq(x->n_logit_bias, y->n_logit_bias);
    for (int32_t i = 0; i < x->n_logit_bias; i++) {
        ck_assert_int_eq(x->logit_bias[i].token, y->logit_bias[i].token);
        ck_assert(x->logit_bias[i].bias == y->logit_bias[i].bias);
    }
    ck_assert_int_eq(a->reasoning_format, b->reasoning_format);
    ck_assert_int_eq(a->has_thinking_budget, b->has_thinking_budget);
    ck_assert_int_eq(a->thinking_token_budget, b->thinking_token_budget);
    ck_assert_str_eq(a->template_kwargs_json ? a->template_kwargs_json : "-",
                     b->template_kwargs_json ? b->template_kwargs_json : "-");
    ck_assert_str_eq(a->tools_json ? a->tools_json : "-", b->tools_json ? b->tools_json : "-");
    ck_assert_int_eq(a->tool_choice, b->tool_choice);
    ck_assert_str_eq(a->tool_choice_name ? a->tool_choice_name : "-",
                     b->tool_choice_name ? b->tool_choice_name : "-");
    ck_assert_int_eq(a->no_parallel_tool_calls, b->no_parallel_tool_calls);
    ck_assert_int_eq(a->message_extra == NULL, b->message_extra == NULL);
    for (int32_t i = 0; a->message_extra && i < a->n_messages; i++) {
        ck_assert_str_eq(a->message_extra[i] ? a->message_extra[i] : "-",
                         b->message_extra[i] ? b->message_extra[i] : "-");
    }
    ck_assert_str_eq(a->reasoning_effort ? a->reasoning_effort : "-",
                     b->reasoning_effort ? b->reasoning_effort : "-");
    ck_assert_int_eq(a->metadata_json == NULL, b->metadata_json == NULL);
    if (a->metadata_json) {
        ck_assert_str_eq(a->metadata_json, b->metadata_json);
    }
    ck_assert_int_eq(a->constraint, b->constraint);
    ck_assert_uint_eq(a->constraint_len, b->constraint_len);
    if (a->constraint_len > 0) {
        ck_assert(memcmp(a->constraint_text, b->constraint_text, a->constraint_len) == 0);
    }
    ck_assert_int_eq(a->schema_strict, b->schema_strict);
    ck_assert_int_eq(a->schema_name == NULL, b->schema_name == NULL);
    if (a->schema_name) {
        ck_assert_str_eq(a->schema_name, b->schema_name);
    }
}

START_TEST(valid_jobs_round_trip) {
    size_t n;
    char **names = list_dir(EXAMPLES "/valid", "job-", &n);
    ck_assert_uint_ge(n, 8);
    for (size_t i = 0; i < n; i++) {
        size_t len, enc_len, enc2_len;
        char *text = read_example("valid", names[i], &len);
        kg_job_t *job = NULL;
        kg_job_t *job2 = NULL;
        kg_codec_error_t err;
        kg_status_t st = kg_codec_decode_job(text, len, &job, &err);
        ck_assert_msg(st == KG_OK, "%s: %s", names[i], err.message);
        ck_assert_int_eq(err.kind, KG_CODEC_OK);
        ck_assert_int_eq(job->partition, -1);
        ck_assert_ptr_null(job->topic);

        char *enc = kg_codec_encode_job(job, &enc_len);
        ck_assert_ptr_nonnull(enc);
        ck_assert_uint_eq(enc_len, strlen(enc));
        json_t *orig = parse(text, len);
        json_t *encv = parse(enc, enc_len);
        check_round_trip(names[i], orig, encv);

        // Decoding the encoding gives the same job, and encoding is a fixpoint.
        st = kg_codec_decode_job(enc, enc_len, &job2, &err);
        ck_assert_msg(st == KG_OK, "%s re-decode: %s", names[i], err.message);
        check_same_job(job, job2);
        char *enc2 = kg_codec_encode_job(job2, &enc2_len);
        ck_assert_str_eq(enc, enc2);

        json_decref(orig);
        json_decref(encv);
        free(enc);
        free(enc2);
        kg_job_free(job);
        kg_job_free(job2);
        free(text);
    }
    free_list(names, n);
}
END_TEST

static kg_job_t *decode_file_ok(const char *name) {
    size_t len;
    char *text = read_example("valid", name, &len);
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_msg(kg_codec_decode_job(text, len, &job, &err) == KG_OK, "%s", err.message);
    free(text);
    return job;
}

START_TEST(decoded_fields) {
    kg_job_t *job = decode_file_ok("job-02-sampling.json");
    ck_assert_str_eq(job->request_id, "sampling:all.fields_2");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TEXT);
    ck_assert_int_eq(job->max_tokens, 64);
    ck_assert(job->sampling.temperature == 0.7f);
    ck_assert_int_eq(job->sampling.top_k, 40);
    ck_assert(job->sampling.top_p == 0.95f && job->sampling.min_p == 0.05f);
    ck_assert(job->sampling.repetition_penalty == 1.1f);
    ck_assert(job->sampling.presence_penalty == -0.25f);
    ck_assert_uint_eq(job->sampling.seed, 42);
    ck_assert_int_eq(job->sampling.n_logprobs, 3);
    ck_assert_int_eq(job->sampling.penalty_last_n, -1);
    kg_job_free(job);

    job = decode_file_ok("job-03-prompt-tokens.json");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TOKENS);
    ck_assert_int_eq(job->n_prompt_tokens, 5);
    ck_assert_int_eq(job->prompt_tokens[4], 31999);
    ck_assert(job->sampling.temperature == 0.0f);
    ck_assert(!job->stream);
    kg_job_free(job);

    job = decode_file_ok("job-04-messages.json");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_MESSAGES);
    ck_assert_int_eq(job->n_messages, 5);
    ck_assert_str_eq(job->messages[3].role, "tool");
    ck_assert_str_eq(job->messages[3].content, "{\"result\": 4}");
    ck_assert_int_eq(job->n_stop, 2);
    ck_assert_str_eq(job->stop[0], "\n\n");
    kg_job_free(job);

    job = decode_file_ok("job-05-stop-string-metadata.json");
    ck_assert_int_eq(job->n_stop, 1);
    ck_assert_str_eq(job->stop[0], "\n");
    ck_assert_int_eq(job->deadline_ms, 1893456000000LL);
    ck_assert_int_eq(job->priority, 5);
    ck_assert_uint_eq(job->sampling.seed, 123456789012345ULL);
    ck_assert_str_eq(job->metadata_json, "{\"tenant\":\"acme\",\"trace\":{\"span\":\"a1b2\","
                                         "\"sampled\":true},\"tags\":[\"x\",\"y\"],\"n\":null}");
    kg_job_free(job);

    // Defaults, including the seed derived from the request_id.
    job = decode_file_ok("job-06-nulls-mean-defaults.json");
    ck_assert_int_eq(job->max_tokens, 256);
    ck_assert(job->sampling.temperature == 1.0f && job->sampling.top_p == 1.0f);
    ck_assert_int_eq(job->sampling.top_k, -1);
    ck_assert_uint_eq(job->sampling.seed, kg_job_default_seed("nulls-6"));
    ck_assert(job->stream && !job->ignore_eos);
    ck_assert_int_eq(job->n_stop, 0);
    ck_assert_int_eq(job->deadline_ms, 0);
    ck_assert_ptr_null(job->metadata_json);
    kg_job_free(job);

    job = decode_file_ok("job-08-boundaries.json");
    ck_assert_uint_eq(job->sampling.seed, 9223372036854775807ULL);
    ck_assert_int_eq(job->priority, INT32_MIN);
    ck_assert_int_eq(job->max_tokens, INT32_MAX);
    ck_assert_int_eq(job->n_stop, 8);
    ck_assert_uint_eq(strlen(job->stop[7]), 512); // 256 two-byte characters
    kg_job_free(job);
}
END_TEST

/* The template variables and reasoning fields (kg_codec_reasoning.c). */
START_TEST(reasoning_fields) {
    kg_job_t *job = decode_file_ok("job-17-reasoning.json");
    ck_assert_str_eq(job->template_kwargs_json,
                     "{\"enable_thinking\":true,\"custom\":[1,\"two\"]}");
    ck_assert_str_eq(job->reasoning_effort, "high");
    ck_assert_ptr_nonnull(strstr(job->tools_json, "\"name\":\"factor\""));
    ck_assert_int_eq(job->reasoning_format, KG_REASONING_DEEPSEEK);
    ck_assert(job->has_thinking_budget);
    ck_assert_int_eq(job->thinking_token_budget, 64);
    /* the template sees reasoning_effort and tools, then the kwargs' keys */
    bool oom = true;
    char *vars = kg_job_template_vars(job, &oom);
    ck_assert(!oom);
    json_t *v = parse(vars, strlen(vars));
    ck_assert_str_eq(json_string_value(json_object_get(v, "reasoning_effort")), "high");
    ck_assert(json_is_true(json_object_get(v, "enable_thinking")));
    ck_assert_int_eq(json_array_size(json_object_get(v, "tools")), 1);
    ck_assert_int_eq(json_array_size(json_object_get(v, "custom")), 2);
    json_decref(v);
    free(vars);
    kg_job_free(job);
    /* a kwarg overrides kgen's own variable; a job without any has none */
    static const char both[] = "{\"request_id\":\"r\",\"prompt\":\"x\",\"reasoning_effort\":"
                               "\"low\",\"chat_template_kwargs\":{\"reasoning_effort\":\"high\"}}";
    kg_codec_error_t err;
    ck_assert_int_eq(kg_codec_decode_job(both, strlen(both), &job, &err), KG_OK);
    vars = kg_job_template_vars(job, &oom);
    ck_assert_str_eq(vars, "{\"reasoning_effort\":\"high\"}");
    free(vars);
    kg_job_free(job);
    job = decode_file_ok("job-01-minimal.json");
    ck_assert_ptr_null(kg_job_template_vars(job, &oom));
    ck_assert(!oom);
    ck_assert_int_eq(job->reasoning_format, KG_REASONING_AUTO);
    ck_assert(!job->has_thinking_budget);
    kg_job_free(job);
}
END_TEST

START_TEST(metadata_verbatim) {
    // Numbers keep the producer's digits; only whitespace outside strings goes.
    kg_job_t *job = decode_file_ok("job-09-unicode-and-numbers.json");
    ck_assert_str_eq(job->metadata_json,
                     "{\"pi\":3.141592653589793,\"price\":1.10,\"big\":1234567890123456789,"
                     "\"exp\":1E+2,\"neg\":-0.0,\"s\":\"\\u00e9\\n\",\"nested\":{\"a\":[1,{\"b\":"
                     "[]}]}}");
    // The prompt holds a NUL and a non-BMP character.
    static const char prompt[] = "caf\xc3\xa9 \0 na\xc3\xafve \xf0\x9f\x98\x80 \"q\" \\ \t end";
    ck_assert_uint_eq(job->prompt_len, sizeof(prompt) - 1);
    ck_assert(memcmp(job->prompt, prompt, sizeof(prompt) - 1) == 0);
    ck_assert_str_eq(job->stop[1], "\xf0\x9f\x98\x80");

    // The done event carries the same text.
    kg_event_done_t ev = {.common = {.request_id = "uni-9", .worker_id = "w"},
                          .metadata_json = job->metadata_json};
    char *out = kg_codec_encode_done(&ev, NULL);
    ck_assert_ptr_nonnull(strstr(out, ",\"metadata\":{\"pi\":3.141592653589793,\"price\":1.10,"));
    free(out);
    kg_job_free(job);

    job = decode_file_ok("job-10-whitespace.json");
    ck_assert_str_eq(job->metadata_json, "{\"k\":[1,2.50,\"a b\"],\"e\":{}}");
    ck_assert_str_eq(job->prompt, "  spaced  ");
    ck_assert_int_eq(job->max_tokens, 3); // 3.0 is an integer
    kg_job_free(job);
}
END_TEST

// ---- invalid jobs: the manifest says how each must fail ----

START_TEST(invalid_jobs_fail_as_listed) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/invalid/manifest.tsv", EXAMPLES);
    char *manifest = kg_test_read_file(path, NULL);
    ck_assert_ptr_nonnull(manifest);
    int n_rows = 0;
    int n_dlq = 0;
    for (char *line = strtok(manifest, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        }
        char name[256], code[64], kind[16], schema[16], prefix[256];
        int got = sscanf(line, "%255[^\t]\t%63[^\t]\t%15[^\t]\t%15[^\t]\t%255[^\n]", name, code,
                         kind, schema, prefix);
        ck_assert_msg(got == 5, "bad manifest line: %s", line);
        size_t len;
        char *text = read_example("invalid", name, &len);
        kg_job_t *job = (kg_job_t *)1;
        kg_codec_error_t err;
        kg_status_t st = kg_codec_decode_job(text, len, &job, &err);
        ck_assert_msg(st == KG_ERR_INVALID, "%s: decoded (status %d)", name, st);
        ck_assert_ptr_null(job);
        ck_assert_msg(strncmp(err.message, prefix, strlen(prefix)) == 0,
                      "%s: message [%s] does not start with [%s]", name, err.message, prefix);
        if (strcmp(kind, "dlq") == 0) {
            ck_assert_msg(err.kind == KG_CODEC_DLQ, "%s: kind %d, want dlq", name, err.kind);
            ck_assert_str_eq(kg_codec_dlq_reason_str(err.reason), code);
            ck_assert_str_eq(err.request_id, "");
            n_dlq++;
        } else {
            ck_assert_msg(err.kind == KG_CODEC_INVALID, "%s: kind %d (%s), want invalid", name,
                          err.kind, err.message);
            ck_assert_str_eq(code, "invalid_job");
            ck_assert_str_eq(err.request_id, "bad-job");
        }
        free(text);
        n_rows++;
    }
    ck_assert_int_ge(n_rows, 40);
    ck_assert_int_ge(n_dlq, 10);
    free(manifest);
}
END_TEST

// ---- events ----

static char *encode_event(const kg_event_t *ev, size_t *len) {
    switch (ev->type) {
    case KG_EVENT_TOKEN:
        return kg_codec_encode_token(&ev->token, len);
    case KG_EVENT_DONE:
        return kg_codec_encode_done(&ev->done, len);
    default:
        return kg_codec_encode_error(&ev->error, len);
    }
}

START_TEST(valid_events_round_trip) {
    size_t n;
    char **names = list_dir(EXAMPLES "/valid", "event-", &n);
    bool seen[3] = {false, false, false};
    for (size_t i = 0; i < n; i++) {
        size_t len, enc_len;
        char err[256] = "";
        char *text = read_example("valid", names[i], &len);
        kg_event_t *ev = NULL;
        kg_status_t st = kg_codec_decode_event(text, len, &ev, err, sizeof(err));
        ck_assert_msg(st == KG_OK, "%s: %s", names[i], err);
        ck_assert_msg(strncmp(names[i] + 6, kg_event_type_str(ev->type),
                              strlen(kg_event_type_str(ev->type))) == 0,
                      "%s decoded as %s", names[i], kg_event_type_str(ev->type));
        seen[ev->type] = true;
        char *enc = encode_event(ev, &enc_len);
        ck_assert_ptr_nonnull(enc);
        json_t *orig = parse(text, len);
        json_t *encv = parse(enc, enc_len);
        assert_same(orig, encv, names[i]);
        json_decref(orig);
        json_decref(encv);
        free(enc);
        kg_event_free(ev);
        free(text);
    }
    ck_assert(seen[KG_EVENT_TOKEN] && seen[KG_EVENT_DONE] && seen[KG_EVENT_ERROR]);
    free_list(names, n);
}
END_TEST

/* The worker's span on a terminal event: read back as written, and refused when its ids are not
 * W3C's (lowercase hex of the right length, not all zero) or it ends before it starts. */
START_TEST(event_span) {
    size_t len;
    char err[256];
    char *text = read_example("valid", "event-done-span.json", &len);
    kg_event_t *ev = NULL;
    ck_assert_int_eq(kg_codec_decode_event(text, len, &ev, err, sizeof(err)), KG_OK);
    ck_assert(ev->done.common.has_span);
    ck_assert_str_eq(ev->done.common.span.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(ev->done.common.span.span_id, "53995c3f42cd8ad8");
    ck_assert_str_eq(ev->done.common.span.parent_span_id, "00f067aa0ba902b7");
    ck_assert_int_eq(ev->done.common.span.start_unix_nano, 1718000001119871003LL);
    ck_assert_int_eq(ev->done.common.span.end_unix_nano, 1718000001199871004LL);
    kg_event_free(ev);
    free(text);
    text = read_example("valid", "event-done-stop.json", &len);
    ck_assert_int_eq(kg_codec_decode_event(text, len, &ev, err, sizeof(err)), KG_OK);
    ck_assert(!ev->done.common.has_span);
    kg_event_free(ev);
    free(text);
    static const struct {
        const char *span, *want;
    } bad[] = {
        {"[]", "span: expected an object"},
        {"{\"span_id\":\"53995c3f42cd8ad8\"}", "trace_id: expected 32"},
        {"{\"trace_id\":\"4BF92F3577B34DA6A3CE929D0E0E4736\"}", "trace_id: expected 32"},
        {"{\"trace_id\":\"00000000000000000000000000000000\"}", "trace_id: expected 32"},
        {"{\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"span_id\":\"53995c3f42cd8a\"}",
         "span_id: expected 16"},
        {"{\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"span_id\":\"53995c3f42cd8ad8\","
         "\"parent_span_id\":\"0000000000000000\"}",
         "parent_span_id: expected 16"},
        {"{\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"span_id\":\"53995c3f42cd8ad8\","
         "\"parent_span_id\":\"00f067aa0ba902b7\",\"start_unix_nano\":5,\"end_unix_nano\":4}",
         "end_unix_nano: expected an integer"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char buf[1024];
        int n = snprintf(buf, sizeof(buf),
                         "{\"type\":\"error\",\"request_id\":\"r\",\"worker_id\":\"w\","
                         "\"partition\":0,\"offset\":0,\"schema_version\":1,\"ts_ms\":1,"
                         "\"code\":\"internal\",\"message\":\"m\",\"span\":%s}",
                         bad[i].span);
        ev = (kg_event_t *)1;
        err[0] = '\0';
        ck_assert_int_eq(kg_codec_decode_event(buf, (size_t)n, &ev, err, sizeof(err)),
                         KG_ERR_INVALID);
        ck_assert_ptr_null(ev);
        ck_assert_msg(strncmp(err, bad[i].want, strlen(bad[i].want)) == 0, "%zu: %s", i, err);
    }
}
END_TEST

START_TEST(event_fields) {
    size_t len;
    char err[256];
    char *text = read_example("valid", "event-token-logprobs.json", &len);
    kg_event_t *ev = NULL;
    ck_assert_int_eq(kg_codec_decode_event(text, len, &ev, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(ev->type, KG_EVENT_TOKEN);
    ck_assert_str_eq(ev->token.common.topic, "kgen.jobs");
    ck_assert_int_eq(ev->token.common.partition, 3);
    ck_assert_int_eq(ev->token.common.offset, 1042);
    ck_assert(ev->token.has_logprobs);
    ck_assert_int_eq(ev->token.logprobs.n_top, 3);
    ck_assert(ev->token.logprobs.token.logprob == -0.125f);
    ck_assert(ev->token.logprobs.top[2].logprob == -9999.0f);
    ck_assert_str_eq(ev->token.logprobs.top[2].text, "\n");
    kg_event_free(ev);
    free(text);

    text = read_example("valid", "event-done-stop-sequence.json", &len);
    ck_assert_int_eq(kg_codec_decode_event(text, len, &ev, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(ev->done.finish_reason, KG_FINISH_REASON_STOP_SEQUENCE);
    ck_assert_str_eq(ev->done.stop, "\n");
    ck_assert_int_eq(ev->done.cached_tokens, 4);
    ck_assert(ev->done.tokens_per_s == 350.5);
    ck_assert_ptr_nonnull(ev->done.metadata_json);
    kg_event_free(ev);
    free(text);
}
END_TEST

/* Parse an encoded event with jansson and return member `key` (borrowed
 * from *root, which the caller frees). */
static json_t *member(const char *text, const char *key, json_t **root) {
    *root = parse(text, strlen(text));
    return json_object_get(*root, key);
}

START_TEST(encode_is_defensive) {
    json_t *root;
    // Invalid UTF-8 becomes U+FFFD per maximal ill-formed subpart.
    static const char bad[] = "a\xff"
                              "b\xe2\x82"
                              "c\xed\xa0\x80"
                              "d\xc0\xaf"
                              "\xf0\x9f\x98";
    kg_event_token_t tok = {
        .common = {.request_id = "r1", .worker_id = "w", .partition = 2, .offset = 5, .ts_ms = 7},
        .index = 0,
        .token_id = 1,
        .text = bad,
        .text_len = sizeof(bad) - 1};
    char *out = kg_codec_encode_token(&tok, NULL);
    ck_assert_ptr_nonnull(out);
    json_t *t = member(out, "text", &root);
    ck_assert_str_eq(json_string_value(t), "a\xef\xbf\xbd"
                                           "b\xef\xbf\xbd"
                                           "c\xef\xbf\xbd\xef\xbf"
                                           "\xbd\xef\xbf\xbd"
                                           "d\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    ck_assert_ptr_null(json_object_get(root, "topic"));
    ck_assert_ptr_null(json_object_get(root, "logprobs"));
    json_decref(root);
    free(out);

    // A NUL byte in text survives as \u0000; NULL text is "".
    tok.text = "x\0y";
    tok.text_len = 3;
    out = kg_codec_encode_token(&tok, NULL);
    ck_assert_ptr_nonnull(strstr(out, "\"text\":\"x\\u0000y\""));
    free(out);
    tok.text = NULL;
    tok.text_len = 0;
    out = kg_codec_encode_token(&tok, NULL);
    ck_assert_ptr_nonnull(strstr(out, "\"text\":\"\""));
    free(out);

    // -inf and NaN logprobs are written as -9999.0; floats in shortest form.
    tok.has_logprobs = true;
    tok.logprobs.token.logprob = -INFINITY;
    tok.logprobs.n_top = 2;
    tok.logprobs.top[0] = (kg_logprob_entry_t){5, "\xff", 1, -0.7f};
    tok.logprobs.top[1] = (kg_logprob_entry_t){6, "ok", 2, NAN};
    out = kg_codec_encode_token(&tok, NULL);
    ck_assert_ptr_nonnull(strstr(out, "\"logprobs\":{\"logprob\":-9999.0,\"top\":[{\"token_id\":5,"
                                      "\"text\":\"\xef\xbf\xbd\",\"logprob\":-0.7},{\"token_id\":6,"
                                      "\"text\":\"ok\",\"logprob\":-9999.0}]}"));
    free(out);

    // Metadata that is not an object is left out; the event is still made.
    kg_event_error_t er = {
        .common = {.request_id = "r2", .worker_id = "w", .partition = -1, .offset = -1},
        .code = KG_ERROR_PROMPT_TOO_LONG,
        .message = "too long",
        .metadata_json = "[1,2]"};
    out = kg_codec_encode_error(&er, NULL);
    ck_assert_ptr_nonnull(out);
    ck_assert_ptr_null(member(out, "metadata", &root));
    ck_assert_str_eq(json_string_value(json_object_get(root, "code")), "prompt_too_long");
    json_decref(root);
    free(out);
    er.metadata_json = "{\"a\":1";
    out = kg_codec_encode_error(&er, NULL);
    ck_assert_ptr_null(strstr(out, "metadata"));
    free(out);
}
END_TEST

START_TEST(done_timings_and_logprobs) {
    kg_token_logprobs_t lps[2] = {{.token = {10, "a", 1, -0.5f}, .n_top = 0},
                                  {.token = {11, "b", 1, -1.5f}, .n_top = 1}};
    lps[1].top[0] = (kg_logprob_entry_t){11, "b", 1, -1.5f};
    kg_event_done_t ev = {.common = {.request_id = "r",
                                     .worker_id = "w",
                                     .topic = "t",
                                     .partition = 1,
                                     .offset = 9,
                                     .ts_ms = 100},
                          .finish_reason = KG_FINISH_REASON_LENGTH,
                          .text = "ab",
                          .text_len = 2,
                          .prompt_tokens = 3,
                          .completion_tokens = 2,
                          .queue_ms = 1.23456789,
                          .ttft_ms = -4,
                          .total_ms = 1e6 / 3,
                          .tokens_per_s = NAN,
                          .logprobs = lps,
                          .n_logprobs = 2};
    size_t len;
    char *out = kg_codec_encode_done(&ev, &len);
    ck_assert_ptr_nonnull(strstr(out,
                                 "\"timings\":{\"queue_ms\":1.235,\"ttft_ms\":0.0,\"total_ms\":"
                                 "333333.333,\"tokens_per_s\":0.0}"));
    char err[128];
    kg_event_t *back = NULL;
    ck_assert_int_eq(kg_codec_decode_event(out, len, &back, err, sizeof(err)), KG_OK);
    ck_assert_int_eq(back->done.n_logprobs, 2);
    ck_assert_int_eq(back->done.logprobs[1].token.token_id, 11);
    ck_assert_int_eq(back->done.logprobs[1].n_top, 1);
    ck_assert(back->done.logprobs[0].token.logprob == -0.5f);
    ck_assert_ptr_null(back->done.stop);
    ck_assert_ptr_null(back->done.metadata_json);
    kg_event_free(back);
    free(out);
}
END_TEST

START_TEST(decode_event_rejects) {
    static const char *bad[] = {
        "",
        "[]",
        "42",
        "{}",
        "{\"type\":\"tok\"}",
        "{\"type\":\"token\",\"request_id\":\"r\",\"worker_id\":\"w\",\"partition\":0,"
        "\"offset\":0,\"schema_version\":1,\"ts_ms\":0,\"index\":-1,\"token_id\":1,\"text\":\"\"}",
        "{\"type\":\"error\",\"request_id\":\"r\",\"worker_id\":\"w\",\"partition\":0,"
        "\"offset\":0,\"schema_version\":1,\"ts_ms\":0,\"code\":\"oops\",\"message\":\"m\"}",
        "{\"type\":\"done\",\"request_id\":\"r\",\"worker_id\":\"w\",\"partition\":0,"
        "\"offset\":0,\"schema_version\":1,\"ts_ms\":0,\"finish_reason\":\"stop\",\"text\":\"\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kg_event_t *ev = (kg_event_t *)1;
        char err[128] = "";
        ck_assert_int_eq(kg_codec_decode_event(bad[i], strlen(bad[i]), &ev, err, sizeof(err)),
                         KG_ERR_INVALID);
        ck_assert_ptr_null(ev);
        ck_assert_msg(err[0] != '\0', "no message for %s", bad[i]);
    }
}
END_TEST

START_TEST(names) {
    static const char *codes[] = {"invalid_job",    "prompt_too_long", "max_tokens_too_large",
                                  "expired",        "cancelled",       "unsupported_chat_template",
                                  "internal",       "queue_full",      "shutdown",
                                  "invalid_schema", "model_not_found"};
    for (int i = 0; i < KG_ERROR_CODE_COUNT_; i++) {
        ck_assert_str_eq(kg_error_code_str((kg_error_code_t)i), codes[i]);
    }
    ck_assert_str_eq(kg_finish_reason_str(KG_FINISH_REASON_STOP_SEQUENCE), "stop_sequence");
    ck_assert_str_eq(kg_codec_dlq_reason_str(KG_DLQ_BAD_REQUEST_ID), "bad_request_id");
    // FNV-1a 64 test vectors, top bit cleared.
    ck_assert_uint_eq(kg_job_default_seed(""), 0xcbf29ce484222325ULL & INT64_MAX);
    ck_assert_uint_eq(kg_job_default_seed("a"), 0xaf63dc4c8601ec8cULL & INT64_MAX);
}
END_TEST

// ---- hostile input ----

static kg_status_t decode(const char *text, size_t len, kg_job_t **job, kg_codec_error_t *err) {
    // Copy into an exact-size buffer without a NUL, so reading past `len`
    // is caught by ASan.
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    kg_status_t st = kg_codec_decode_job(copy, len, job, err);
    free(copy);
    return st;
}

static void expect_dlq(const char *text, size_t len, kg_codec_dlq_reason_t reason) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(decode(text, len, &job, &err), KG_ERR_INVALID);
    ck_assert_msg(err.kind == KG_CODEC_DLQ && err.reason == reason, "kind %d reason %s: %s",
                  err.kind, kg_codec_dlq_reason_str(err.reason), err.message);
}

static void expect_dlq_str(const char *text, kg_codec_dlq_reason_t reason) {
    expect_dlq(text, strlen(text), reason);
}

static kg_job_t *expect_ok(const char *text) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    kg_status_t st = decode(text, strlen(text), &job, &err);
    ck_assert_msg(st == KG_OK, "%s: %s", text, err.message);
    return job;
}

static void expect_invalid(const char *text, const char *prefix) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(decode(text, strlen(text), &job, &err), KG_ERR_INVALID);
    ck_assert_msg(err.kind == KG_CODEC_INVALID, "%s: kind %d: %s", text, err.kind, err.message);
    ck_assert_msg(strncmp(err.message, prefix, strlen(prefix)) == 0, "[%s] vs [%s]", err.message,
                  prefix);
}

START_TEST(huge_string) {
    size_t n = 10u << 20;
    char *text = malloc(n + 64);
    int head = sprintf(text, "{\"request_id\":\"big\",\"prompt\":\"");
    memset(text + head, 'a', n);
    size_t len = (size_t)head + n;
    memcpy(text + len, "\"}", 2);
    len += 2;
    expect_dlq(text, len, KG_DLQ_TOO_LARGE);
    // A bigger limit takes it whole.
    kg_codec_opts_t opts = kg_codec_opts_default();
    opts.max_message_size = 16u << 20;
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(kg_codec_decode_job_opts(text, len, &opts, &job, &err), KG_OK);
    ck_assert_uint_eq(job->prompt_len, n);
    kg_job_free(job);
    // The limit is inclusive.
    opts.max_message_size = len;
    ck_assert_int_eq(kg_codec_decode_job_opts(text, len, &opts, &job, &err), KG_OK);
    kg_job_free(job);
    opts.max_message_size = len - 1;
    ck_assert_int_eq(kg_codec_decode_job_opts(text, len, &opts, &job, &err), KG_ERR_INVALID);
    ck_assert_int_eq(err.reason, KG_DLQ_TOO_LARGE);
    free(text);
}
END_TEST

/* --default-max-tokens reaches jobs that give no max_tokens, and only them */
START_TEST(default_max_tokens_option) {
    kg_codec_opts_t opts = kg_codec_opts_default();
    ck_assert_int_eq(opts.default_max_tokens, KG_JOB_DEFAULT_MAX_TOKENS);
    opts.default_max_tokens = 33;
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    const char *a = "{\"request_id\":\"a\",\"prompt\":\"x\"}";
    ck_assert_int_eq(kg_codec_decode_job_opts(a, strlen(a), &opts, &job, &err), KG_OK);
    ck_assert_int_eq(job->max_tokens, 33);
    kg_job_free(job);
    const char *b = "{\"request_id\":\"b\",\"prompt\":\"x\",\"max_tokens\":7}";
    ck_assert_int_eq(kg_codec_decode_job_opts(b, strlen(b), &opts, &job, &err), KG_OK);
    ck_assert_int_eq(job->max_tokens, 7);
    kg_job_free(job);
}
END_TEST

START_TEST(deep_nesting) {
    size_t n = 100000;
    char *text = malloc(n + 256);
    memset(text, '[', n);
    expect_dlq(text, n, KG_DLQ_INVALID_JSON);
    // Deep inside metadata: still refused by the parser's depth bound.
    int head = sprintf(text, "{\"request_id\":\"d\",\"prompt\":\"x\",\"metadata\":");
    for (size_t i = 0; i < n; i++) {
        text[head + i] = i % 2 ? '[' : '{';
    }
    expect_dlq(text, head + n, KG_DLQ_INVALID_JSON);
    free(text);

    // 1000 levels of metadata are fine and echo back unchanged.
    size_t depth = 1000;
    text = malloc(depth * 6 + 256);
    size_t p = (size_t)sprintf(text, "{\"request_id\":\"d\",\"prompt\":\"x\",\"metadata\":");
    for (size_t i = 0; i < depth; i++) {
        p += (size_t)sprintf(text + p, "{\"a\":");
    }
    text[p++] = '1';
    memset(text + p, '}', depth + 1);
    p += depth + 1;
    text[p] = '\0';
    kg_job_t *job = expect_ok(text);
    ck_assert_uint_eq(strlen(job->metadata_json), depth * 6 + 1);
    kg_event_error_t er = {.common = {.request_id = "d", .worker_id = "w"},
                           .code = KG_ERROR_INTERNAL,
                           .message = "m",
                           .metadata_json = job->metadata_json};
    char *out = kg_codec_encode_error(&er, NULL);
    ck_assert_ptr_nonnull(strstr(out, job->metadata_json));
    free(out);
    kg_job_free(job);
    free(text);
}
END_TEST

START_TEST(garbage_bytes) {
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    char buf[512];
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = (size_t)(iter % 500);
        for (size_t i = 0; i < len; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (char)(s >> 56);
        }
        if (iter % 3 == 0 && len > 0) {
            buf[0] = '{'; // reach deeper into the parser
        }
        kg_job_t *job = NULL;
        kg_codec_error_t err;
        ck_assert_int_eq(decode(buf, len, &job, &err), KG_ERR_INVALID);
        ck_assert_int_eq(err.kind, KG_CODEC_DLQ);
        ck_assert(strlen(err.message) > 0);
    }
    expect_dlq_str("", KG_DLQ_INVALID_JSON);
    expect_dlq_str("\xef\xbb\xbf{\"request_id\":\"a\",\"prompt\":\"x\"}", KG_DLQ_INVALID_JSON);
}
END_TEST

START_TEST(nul_bytes) {
    // \u0000 inside strings: fine in the prompt, kept with its length.
    kg_job_t *job = expect_ok("{\"request_id\":\"n\",\"prompt\":\"a\\u0000b\"}");
    ck_assert_uint_eq(job->prompt_len, 3);
    ck_assert(memcmp(job->prompt, "a\0b", 4) == 0);
    kg_job_free(job);
    // A raw NUL byte is a control character JSON does not allow.
    static const char raw[] = "{\"request_id\":\"n\",\"prompt\":\"a\0b\"}";
    expect_dlq(raw, sizeof(raw) - 1, KG_DLQ_INVALID_JSON);
    // Bytes after the object (a buffer reused without clearing) are outside len.
    static const char tail[] = "{\"request_id\":\"n\",\"prompt\":\"x\"}GARBAGE";
    job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(decode(tail, sizeof(tail) - 1 - 7, &job, &err), KG_OK);
    kg_job_free(job);
    expect_dlq(tail, sizeof(tail) - 1, KG_DLQ_INVALID_JSON);
    // NUL in a key is refused by the parser.
    static const char key[] = "{\"request_id\":\"n\",\"prompt\":\"x\",\"a\\u0000\":1}";
    expect_dlq(key, sizeof(key) - 1, KG_DLQ_INVALID_JSON);
}
END_TEST

START_TEST(numbers_at_the_edges) {
    kg_job_t *job;
    // max_tokens beyond int32 is kept as sent, so intake can quote it.
    job = expect_ok("{\"request_id\":\"n\",\"prompt\":\"x\",\"max_tokens\":1000000000000}");
    ck_assert_int_eq(job->max_tokens, 1000000000000LL);
    kg_job_free(job);
    // Integral reals are integers; 2^63 as a real is out of range.
    job = expect_ok("{\"request_id\":\"n\",\"prompt\":\"x\",\"seed\":9.2e18,\"max_tokens\":1e2}");
    ck_assert_uint_eq(job->sampling.seed, 9200000000000000000ULL);
    ck_assert_int_eq(job->max_tokens, 100);
    kg_job_free(job);
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"seed\":9223372036854775808.0}",
                   "seed:");
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"seed\":-0.5}", "seed:");
    expect_dlq_str("{\"request_id\":\"n\",\"prompt\":\"x\",\"seed\":9223372036854775808}",
                   KG_DLQ_INVALID_JSON);
    expect_dlq_str("{\"request_id\":\"n\",\"prompt\":\"x\",\"max_tokens\":1e400}",
                   KG_DLQ_INVALID_JSON);
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"top_k\":2147483648}", "top_k:");
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"max_tokens\":-3}",
                   "max_tokens: expected an integer >= 1, got -3");
    // A huge repetition penalty saturates at FLT_MAX instead of becoming inf.
    job = expect_ok("{\"request_id\":\"n\",\"prompt\":\"x\",\"repetition_penalty\":1e300,"
                    "\"temperature\":1e-320}");
    ck_assert(isfinite(job->sampling.repetition_penalty) &&
              job->sampling.repetition_penalty > 1e38f);
    ck_assert(job->sampling.temperature == 0.0f);
    kg_job_free(job);
    // What was got is said: an empty array is not "an array" (issue 30).
    expect_invalid("{\"request_id\":\"n\",\"prompt_tokens\":[]}",
                   "prompt_tokens: expected a non-empty array of token ids, got an empty array");
    expect_invalid("{\"request_id\":\"n\",\"messages\":[]}",
                   "messages: expected a non-empty array of {role, content}, got an empty array");
    expect_invalid(
        "{\"request_id\":\"n\",\"prompt\":\"x\",\"stop\":{}}",
        "stop: expected a string or an array of at most 8 strings, each 1..256 characters "
        "without U+0000, got an empty object");
    // Strict booleans, and the first bad field in schema order is named.
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"stream\":0}", "stream:");
    expect_invalid("{\"request_id\":\"n\",\"prompt\":\"x\",\"ignore_eos\":\"false\",\"top_p\":0}",
                   "top_p:");
    expect_invalid("{\"request_id\":\"n\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                   "\"prompt\":\"y\"}",
                   "prompt: expected exactly one of prompt, prompt_tokens or messages, got 2");
    expect_invalid("{\"request_id\":\"n\"}", "prompt: expected exactly one");
    // Error messages show strings safely and shortly.
    kg_codec_error_t err;
    job = NULL;
    static const char longrole[] =
        "{\"request_id\":\"n\",\"messages\":[{\"role\":\"\\n"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"content\":\"\"}]}";
    ck_assert_int_eq(decode(longrole, sizeof(longrole) - 1, &job, &err), KG_ERR_INVALID);
    ck_assert_str_eq(err.message, "messages[0].role: expected one of system, user, assistant, "
                                  "tool, got \"?aaaaaaaaaaaaaaaaaaaaaaa\"...");
    ck_assert_str_eq(err.request_id, "n");
}
END_TEST

START_TEST(duplicates_and_versions) {
    expect_dlq_str("{\"request_id\":\"a\",\"prompt\":\"x\",\"metadata\":{\"k\":1,\"k\":2}}",
                   KG_DLQ_INVALID_JSON);
    kg_job_t *job = expect_ok("{\"request_id\":\"a\",\"prompt\":\"x\",\"schema_version\":1.0}");
    ck_assert_int_eq(job->schema_version, 1);
    kg_job_free(job);
    expect_invalid("{\"request_id\":\"a\",\"prompt\":\"x\",\"schema_version\":2}",
                   "schema_version: unsupported version 2");
    // The request_id is reported even when a later field is bad.
    kg_codec_error_t err;
    job = NULL;
    static const char text[] = "{\"prompt\":\"x\",\"max_tokens\":0,\"request_id\":\"late.id:1\"}";
    ck_assert_int_eq(decode(text, sizeof(text) - 1, &job, &err), KG_ERR_INVALID);
    ck_assert_str_eq(err.request_id, "late.id:1");
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("codec");
    TCase *tc = tcase_create("examples");
    tcase_add_test(tc, valid_jobs_round_trip);
    tcase_add_test(tc, decoded_fields);
    tcase_add_test(tc, reasoning_fields);
    tcase_add_test(tc, metadata_verbatim);
    tcase_add_test(tc, invalid_jobs_fail_as_listed);
    tcase_add_test(tc, valid_events_round_trip);
    tcase_add_test(tc, event_fields);
    tcase_add_test(tc, event_span);
    suite_add_tcase(s, tc);
    tc = tcase_create("encode");
    tcase_add_test(tc, encode_is_defensive);
    tcase_add_test(tc, done_timings_and_logprobs);
    tcase_add_test(tc, decode_event_rejects);
    tcase_add_test(tc, names);
    suite_add_tcase(s, tc);
    tc = tcase_create("hostile");
    tcase_add_test(tc, huge_string);
    tcase_add_test(tc, default_max_tokens_option);
    tcase_add_test(tc, deep_nesting);
    tcase_add_test(tc, garbage_bytes);
    tcase_add_test(tc, nul_bytes);
    tcase_add_test(tc, numbers_at_the_edges);
    tcase_add_test(tc, duplicates_and_versions);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
