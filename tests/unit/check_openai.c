/* check_openai: OpenAI Batch lines and request bodies into kgen jobs (through
 * the job decoder), and terminal events into OpenAI Batch output lines. */
#include "check_common.h"
#include "schema/kg_codec.h"
#include "schema/kg_job.h"
#include "schema/kg_openai.h"

#include <jansson.h>
#include <string.h>

// ---- helpers ----

/* Decode `text` with format `f` and key `key` (may be NULL). */
static kg_status_t decode(
    const char *text, kg_job_format_t f, const char *key, kg_job_t **job, kg_codec_error_t *err) {
    kg_codec_opts_t o = kg_codec_opts_default();
    o.format = f;
    o.key = key;
    o.key_len = key ? strlen(key) : 0;
    return kg_codec_decode_job_opts(text, strlen(text), &o, job, err);
}

static kg_job_t *decode_ok(const char *text) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    kg_status_t st = decode(text, KG_JOB_FORMAT_AUTO, "key-1", &job, &err);
    ck_assert_msg(st == KG_OK, "%s: %s", text, err.message);
    return job;
}

/* The job is refused with an invalid_job message starting with `prefix`,
 * answered under `rid`. */
static void decode_invalid(const char *text, const char *rid, const char *prefix) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(decode(text, KG_JOB_FORMAT_AUTO, NULL, &job, &err), KG_ERR_INVALID);
    ck_assert_ptr_null(job);
    ck_assert_msg(err.kind == KG_CODEC_INVALID, "%s: kind %d (%s)", text, err.kind, err.message);
    ck_assert_str_eq(err.request_id, rid);
    ck_assert_msg(strncmp(err.message, prefix, strlen(prefix)) == 0, "%s:\n  got  %s\n  want %s...",
                  text, err.message, prefix);
}

static void decode_dlq(const char *text, const char *key, kg_codec_dlq_reason_t reason) {
    kg_job_t *job = NULL;
    kg_codec_error_t err;
    ck_assert_int_eq(decode(text, KG_JOB_FORMAT_AUTO, key, &job, &err), KG_ERR_INVALID);
    ck_assert_msg(err.kind == KG_CODEC_DLQ && err.reason == reason, "%s: kind %d reason %d (%s)",
                  text, err.kind, err.reason, err.message);
}

#define CHAT "\"url\": \"/v1/chat/completions\""
#define CMPL "\"url\": \"/v1/completions\""

// ---- jobs in ----

START_TEST(formats_and_shapes) {
    kg_job_format_t f;
    ck_assert(kg_codec_job_format_parse("openai-chat", 11, &f) && f == KG_JOB_FORMAT_OPENAI_CHAT);
    ck_assert(kg_codec_job_format_parse("kgen", 4, &f) && f == KG_JOB_FORMAT_KGEN);
    ck_assert(!kg_codec_job_format_parse("openai-embeddings", 17, &f));
    ck_assert(!kg_codec_job_format_parse("kge", 3, &f));
    /* a Batch line is recognised; a kgen job (request_id) stays one, model or not */
    kg_job_t *job = decode_ok("{\"custom_id\": \"r-1\", \"method\": \"POST\", " CHAT
                              ", \"body\": {\"model\": \"m\", \"messages\": [{\"role\": \"user\", "
                              "\"content\": \"hi\"}]}}");
    ck_assert_str_eq(job->request_id, "r-1");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_MESSAGES);
    ck_assert_str_eq(job->model, "m");
    ck_assert(!job->stream); /* OpenAI's default */
    ck_assert_int_eq(job->max_tokens, KG_JOB_DEFAULT_MAX_TOKENS);
    kg_job_free(job);
    job = decode_ok("{\"request_id\": \"k-1\", \"model\": \"m\", \"prompt\": \"x\"}");
    ck_assert(job->stream); /* kgen's default */
    ck_assert_int_eq(job->max_tokens, KG_JOB_DEFAULT_MAX_TOKENS);
    kg_job_free(job);
    /* a bare Completions body takes the key; OpenAI's default max_tokens is 16 */
    job = decode_ok("{\"model\": \"m\", \"prompt\": \"x\"}");
    ck_assert_str_eq(job->request_id, "key-1");
    ck_assert_int_eq(job->max_tokens, 16);
    kg_job_free(job);
    /* the kgen-format header wins over the shape */
    kg_codec_error_t err;
    job = NULL;
    ck_assert_int_eq(
        decode("{\"model\": \"m\", \"prompt\": \"x\"}", KG_JOB_FORMAT_KGEN, "k", &job, &err),
        KG_ERR_INVALID);
    ck_assert(err.kind == KG_CODEC_DLQ && err.reason == KG_DLQ_MISSING_REQUEST_ID);
    ck_assert_int_eq(decode("{\"request_id\": \"x-1\", \"messages\": [{\"role\": \"developer\", "
                            "\"content\": \"be brief\"}]}",
                            KG_JOB_FORMAT_OPENAI_CHAT, NULL, &job, &err),
                     KG_OK);
    ck_assert_str_eq(job->request_id, "x-1");
    ck_assert_str_eq(job->messages[0].role, "system");
    kg_job_free(job);
}
END_TEST

START_TEST(request_ids) {
    kg_job_t *job = decode_ok("{\"custom_id\": \"has space\", \"body\": {\"prompt\": \"x\"}}");
    ck_assert_int_eq(strncmp(job->request_id, "cid-", 4), 0);
    ck_assert_uint_eq(strlen(job->request_id), 36);
    char first[64];
    strcpy(first, job->request_id);
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"has space\", \"body\": {\"prompt\": \"y\"}}");
    ck_assert_str_eq(job->request_id, first);           /* derived from the custom_id alone */
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TEXT); /* no url: the body says */
    kg_job_free(job);
    job = decode_ok(
        "{\"custom_id\": \"c\", \"request_id\": \"mine\", \"body\": {\"prompt\": \"y\"}}");
    ck_assert_str_eq(job->request_id, "mine");
    kg_job_free(job);
    decode_dlq("{\"method\": \"POST\", \"body\": {\"prompt\": \"x\"}, \"custom_id\": null}", NULL,
               KG_DLQ_MISSING_REQUEST_ID);
    decode_dlq("{\"custom_id\": 7, \"body\": {}}", NULL, KG_DLQ_BAD_REQUEST_ID);
    decode_dlq("{\"custom_id\": \"c\", \"request_id\": \"a b\", \"body\": {}}", NULL,
               KG_DLQ_BAD_REQUEST_ID);
    decode_dlq("{\"messages\": []}", NULL, KG_DLQ_MISSING_REQUEST_ID);
    decode_dlq("{\"messages\": []}", "a/b", KG_DLQ_BAD_REQUEST_ID);
}
END_TEST

START_TEST(line_and_url_errors) {
    decode_invalid("{\"custom_id\": \"r\", \"method\": \"GET\", " CHAT ", \"body\": {}}", "r",
                   "method: expected \"POST\"");
    decode_invalid("{\"custom_id\": \"r\", \"url\": \"/v1/moderations\", \"body\": {}}", "r",
                   "url: /v1/moderations is not served here");
    decode_invalid("{\"custom_id\": \"r\", " CHAT ", \"body\": [1]}", "r",
                   "body: expected an object");
    /* a chat url without messages: the job decoder names what is missing */
    decode_invalid("{\"custom_id\": \"r\", " CHAT ", \"body\": {\"prompt\": \"x\"}}", "r",
                   "prompt: expected exactly one of");
}
END_TEST

START_TEST(messages) {
    kg_job_t *job = decode_ok(
        "{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": ["
        "{\"role\": \"developer\", \"content\": \"rules\"},"
        "{\"role\": \"user\", \"name\": \"x\", \"content\": [{\"type\": \"text\", \"text\": "
        "\"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": null},"
        "{\"role\": \"tool\", \"content\": \"42\", \"tool_call_id\": \"t\"}]}}");
    ck_assert_int_eq(job->n_messages, 4);
    ck_assert_str_eq(job->messages[0].role, "system");
    ck_assert_str_eq(job->messages[1].content, "a\nb");
    ck_assert_str_eq(job->messages[2].content, "");
    ck_assert_str_eq(job->messages[3].role, "tool");
    kg_job_free(job);
    decode_invalid("{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                   "\"user\", \"content\": [{\"type\": \"input_audio\"}]}]}}",
                   "m", "messages[0].content[0]: \"input_audio\" parts are not supported");
    decode_invalid("{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                   "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"t\"}]}]}}",
                   "m", "messages[0].tool_calls: expected an array of");
    decode_invalid("{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                   "\"function\", \"content\": \"x\"}]}}",
                   "m", "messages[0].role: \"function\"");
    decode_invalid("{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                   "\"user\", \"content\": [{\"type\": \"text\"}]}]}}",
                   "m", "messages[0].content[0]: expected a text part");
    decode_invalid("{\"custom_id\": \"m\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                   "\"user\", \"content\": 5}]}}",
                   "m", "messages[0].content: expected a string");
}
END_TEST

START_TEST(prompts) {
    kg_job_t *job =
        decode_ok("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": [1, 2, 3]}}");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TOKENS);
    ck_assert_int_eq(job->n_prompt_tokens, 3);
    ck_assert_int_eq(job->max_tokens, 16);
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": [[7, 8]]}}");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TOKENS);
    ck_assert_int_eq(job->prompt_tokens[1], 8);
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": [\"one\"], "
                    "\"max_tokens\": 5, \"max_completion_tokens\": 9}}");
    ck_assert_int_eq(job->prompt_kind, KG_PROMPT_TEXT);
    ck_assert_str_eq(job->prompt, "one");
    ck_assert_int_eq(job->max_tokens, 9); /* max_completion_tokens wins */
    kg_job_free(job);
    decode_invalid("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": [\"a\", \"b\"]}}", "p",
                   "prompt: several prompts in one request are not supported");
    decode_invalid("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": \"a\", "
                   "\"max_completion_tokens\": 0}}",
                   "p", "max_completion_tokens: expected an integer >= 1, got 0");
    decode_invalid("{\"custom_id\": \"p\", " CMPL ", \"body\": {\"prompt\": \"\"}}", "p",
                   "prompt: expected a non-empty string");
}
END_TEST

START_TEST(sampling_and_logprobs) {
    kg_job_t *job = decode_ok(
        "{\"custom_id\": \"s\", " CHAT ", \"body\": {\"messages\": [{\"role\": \"user\", "
        "\"content\": \"x\"}], \"temperature\": 0.5, \"top_p\": 0.9, \"n\": 3, \"seed\": 11, "
        "\"stop\": \"END\", \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, "
        "\"logit_bias\": {\"50256\": -100, \"7\": 3}, \"logprobs\": true, \"top_logprobs\": 0, "
        "\"stream\": true, \"user\": \"u\", \"store\": false, \"metadata\": {\"k\": \"v\"}, "
        "\"top_k\": 5, \"ignore_eos\": true, \"response_format\": {\"type\": \"text\"}, "
        "\"tool_choice\": \"none\", \"tools\": [{\"type\": \"function\"}]}}");
    ck_assert(job->sampling.temperature == 0.5f && job->sampling.top_p == 0.9f);
    ck_assert_int_eq(job->n, 3);
    ck_assert_uint_eq(job->sampling.seed, 11);
    ck_assert_int_eq(job->n_stop, 1);
    ck_assert(job->sampling.presence_penalty == 0.5f && job->sampling.frequency_penalty == -0.5f);
    ck_assert_int_eq(job->sampling.n_logit_bias, 2);
    ck_assert_int_eq(job->sampling.logit_bias[0].token, 50256);
    ck_assert(job->sampling.logit_bias[0].bias == -100.0f);
    ck_assert_int_eq(job->sampling.n_logprobs, 1); /* logprobs true, top 0: the token's own */
    ck_assert(job->stream && job->ignore_eos);
    ck_assert_int_eq(job->sampling.top_k, 5);
    ck_assert_str_eq(job->metadata_json, "{\"k\":\"v\"}");
    /* tools with tool_choice "none" reach the template (shown, never called) */
    ck_assert_str_eq(job->tools_json, "[{\"type\":\"function\"}]");
    kg_job_free(job);
    /* tools with any tool_choice, parallel_tool_calls, and a conversation with calls */
    job = decode_ok(
        "{\"custom_id\": \"t\", " CHAT ", \"body\": {\"messages\": [{\"role\": \"user\", "
        "\"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"name\": "
        "\"f\", \"content\": \"1\"}], \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}], \"tool_choice\": "
        "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
        "\"parallel_tool_calls\": false}}");
    ck_assert_int_eq(job->tool_choice, KG_TOOL_CHOICE_FUNCTION);
    ck_assert_str_eq(job->tool_choice_name, "f");
    ck_assert(job->no_parallel_tool_calls);
    ck_assert_int_eq(job->n_messages, 3);
    ck_assert_str_eq(job->messages[1].content, "");
    ck_assert_ptr_null(job->message_extra[0]);
    ck_assert_str_eq(job->message_extra[1],
                     "{\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                     "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    ck_assert_str_eq(job->message_extra[2], "{\"tool_call_id\":\"c1\",\"name\":\"f\"}");
    kg_job_free(job);
    /* vLLM's template and reasoning extensions pass through to the job */
    job = decode_ok("{\"custom_id\": \"r\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                    "\"user\", \"content\": \"x\"}], \"chat_template_kwargs\": "
                    "{\"enable_thinking\": false}, \"reasoning_effort\": \"low\", "
                    "\"reasoning_format\": \"none\", \"thinking_token_budget\": 7}}");
    ck_assert_str_eq(job->template_kwargs_json, "{\"enable_thinking\":false}");
    ck_assert_str_eq(job->reasoning_effort, "low");
    ck_assert_int_eq(job->reasoning_format, KG_REASONING_NONE);
    ck_assert(job->has_thinking_budget && job->thinking_token_budget == 7);
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"s\", " CMPL ", \"body\": {\"prompt\": \"x\", \"logprobs\": "
                    "4, \"best_of\": 1, \"echo\": false, \"suffix\": \"\"}}");
    ck_assert_int_eq(job->sampling.n_logprobs, 4);
    kg_job_free(job);
    const char *chat = "{\"custom_id\": \"s\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                       "\"user\", \"content\": \"x\"}], %s}}";
    const struct {
        const char *extra, *prefix;
    } bad[] = {
        {"\"top_logprobs\": 2", "top_logprobs: needs logprobs: true"},
        {"\"logprobs\": true, \"top_logprobs\": 21", "top_logprobs: expected an integer in 0..20"},
        {"\"logprobs\": 3", "logprobs: expected true or false"},
        {"\"n\": 17", "n: expected an integer in 1..16"},
        {"\"tool_choice\": \"required\", \"tools\": [{}]", "tools[0]: expected {\"type\""},
        {"\"tool_choice\": {\"type\": \"function\"}", "tool_choice: expected \"auto\""},
        {"\"tool_choice\": \"required\"", "tool_choice: \"required\" needs tools"},
        {"\"tools\": [{\"type\": \"function\"}]", "tools[0]: expected {\"type\""},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]",
         "tools[0].function.name: expected 1..256 characters"},
        {"\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}, "
         "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
         "tool_choice: \"g\" is not one of the tools"},
        {"\"parallel_tool_calls\": 1", "parallel_tool_calls: expected true or false"},
        {"\"functions\": [{\"name\": \"f\"}]", "functions: the deprecated functions"},
        {"\"modalities\": [\"text\", \"audio\"]", "modalities: audio output is not supported"},
        {"\"audio\": {\"voice\": \"x\"}", "audio: audio output is not supported"},
        {"\"web_search_options\": {}", "web_search_options: web search is not supported"},
        {"\"response_format\": {\"type\": \"json_schema\"}",
         "response_format.json_schema: expected an object, got nothing"},
        {"\"logit_bias\": {\"x\": 1}", "logit_bias: expected keys that are token ids"},
        {"\"seed\": -1", "seed: expected an integer in 0..9223372036854775807"},
        {"\"temperature\": 3", "temperature: expected a number in 0..2"},
    };
    char text[512];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(text, sizeof(text), chat, bad[i].extra);
        decode_invalid(text, "s", bad[i].prefix);
    }
    const char *cmpl = "{\"custom_id\": \"c\", " CMPL ", \"body\": {\"prompt\": \"x\", %s}}";
    const struct {
        const char *extra, *prefix;
    } bad_c[] = {
        {"\"logprobs\": 21", "logprobs: expected an integer in 0..20"},
        {"\"logprobs\": true", "logprobs: expected an integer in 0..20"},
        {"\"echo\": true", "echo: echoing the prompt is not supported"},
        {"\"suffix\": \"tail\"", "suffix: insertion"},
        {"\"best_of\": 3", "best_of: expected 1 or the same as n"},
    };
    for (size_t i = 0; i < sizeof(bad_c) / sizeof(bad_c[0]); i++) {
        snprintf(text, sizeof(text), cmpl, bad_c[i].extra);
        decode_invalid(text, "c", bad_c[i].prefix);
    }
    job =
        decode_ok("{\"custom_id\": \"c\", " CMPL ", \"body\": {\"prompt\": \"x\", \"best_of\": 2, "
                  "\"n\": 2}}");
    ck_assert_int_eq(job->n, 2);
    kg_job_free(job);
}
END_TEST

START_TEST(response_format_copied_unchanged) {
    /* an OpenAI body's response_format becomes the kgen job's, decoded by the
     * same rules (kg_codec.c) */
    kg_job_t *job =
        decode_ok("{\"custom_id\": \"r\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                  "\"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
                  "\"json_object\"}}}");
    ck_assert_int_eq(job->constraint, KG_CONSTRAINT_JSON_OBJECT);
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"r\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                    "\"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
                    "\"json_schema\", \"json_schema\": {\"name\": \"p\", \"strict\": true, "
                    "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                    "\"boolean\"}}}}}}}");
    ck_assert_int_eq(job->constraint, KG_CONSTRAINT_JSON_SCHEMA);
    ck_assert_str_eq(job->schema_name, "p");
    ck_assert(job->schema_strict);
    ck_assert_str_eq(job->constraint_text,
                     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}");
    kg_job_free(job);
    job = decode_ok("{\"model\": \"m\", \"prompt\": \"x\", \"response_format\": {\"type\": "
                    "\"text\"}}");
    ck_assert_int_eq(job->constraint, KG_CONSTRAINT_NONE);
    kg_job_free(job);
    decode_invalid("{\"custom_id\": \"r\", " CMPL ", \"body\": {\"prompt\": \"x\", "
                   "\"response_format\": {\"type\": \"yaml\"}}}",
                   "r", "response_format.type:");
}
END_TEST

START_TEST(vllm_guided_decoding) {
    /* vLLM's guided_* extras and kgen's own fields become the job's constraint */
    kg_job_t *job = decode_ok("{\"model\": \"m\", \"prompt\": \"x\", \"guided_json\": "
                              "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                              "\"integer\"}}}}");
    ck_assert_int_eq(job->constraint, KG_CONSTRAINT_JSON_SCHEMA);
    ck_assert_str_eq(job->constraint_text,
                     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    kg_job_free(job);
    job = decode_ok("{\"model\": \"m\", \"prompt\": \"x\", \"guided_json\": "
                    "\"{\\\"type\\\": \\\"string\\\"}\"}");
    ck_assert_int_eq(job->constraint, KG_CONSTRAINT_JSON_SCHEMA);
    ck_assert_str_eq(job->constraint_text, "{\"type\":\"string\"}");
    kg_job_free(job);
    static const struct {
        const char *field;
        kg_constraint_kind_t kind;
        const char *text;
    } cases[] = {
        {"\"guided_regex\": \"[0-9]+\"", KG_CONSTRAINT_REGEX, "[0-9]+"},
        {"\"regex\": \"[a-z]+\"", KG_CONSTRAINT_REGEX, "[a-z]+"},
        {"\"guided_choice\": [\"yes\", \"no\"]", KG_CONSTRAINT_CHOICE, NULL},
        {"\"choice\": [\"yes\", \"no\"]", KG_CONSTRAINT_CHOICE, NULL},
        {"\"guided_grammar\": \"root ::= \\\"a\\\"\"", KG_CONSTRAINT_GRAMMAR, "root ::= \"a\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"custom_id\": \"g\", " CHAT ", \"body\": {\"messages\": [{\"role\": "
                 "\"user\", \"content\": \"x\"}], %s}}",
                 cases[i].field);
        job = decode_ok(body);
        ck_assert_msg(job->constraint == cases[i].kind, "%s", cases[i].field);
        if (cases[i].text) {
            ck_assert_str_eq(job->constraint_text, cases[i].text);
        }
        kg_job_free(job);
    }
    decode_invalid("{\"custom_id\": \"g\", " CMPL ", \"body\": {\"prompt\": \"x\", "
                   "\"guided_json\": \"{not json\"}}",
                   "g", "guided_json: expected a JSON Schema (an object or its JSON text), got");
    decode_invalid("{\"custom_id\": \"g\", " CMPL ", \"body\": {\"prompt\": \"x\", "
                   "\"guided_json\": 3}}",
                   "g", "guided_json: expected a JSON Schema");
    decode_invalid("{\"custom_id\": \"g\", " CMPL ", \"body\": {\"prompt\": \"x\", "
                   "\"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": \"a\"}}",
                   "g",
                   "guided_regex: only one output constraint may be given (response_format is "
                   "already there)");
}
END_TEST

// ---- results out ----

static json_t *output(const char *in, const char *ev, bool *is_error) {
    kg_openai_output_opts_t o = {.default_model = "served-name"};
    char *line = NULL, msg[128] = "";
    size_t len = 0;
    kg_status_t st = kg_openai_batch_output(in, strlen(in), ev, strlen(ev), &o, &line, &len,
                                            is_error, msg, sizeof(msg));
    ck_assert_msg(st == KG_OK, "%s", msg);
    ck_assert_uint_eq(len, strlen(line));
    json_t *v = json_loads(line, 0, NULL);
    ck_assert_ptr_nonnull(v);
    free(line);
    return v;
}

static const char *str_at(json_t *v, const char *path) {
    /* "a.b.0.c": object keys and array indexes */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, ".")) {
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    }
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static json_int_t int_at(json_t *v, const char *path) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, ".")) {
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    }
    ck_assert_msg(json_is_integer(v), "%s is not an integer", path);
    return json_integer_value(v);
}

static json_t *at(json_t *v, const char *path) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, ".")) {
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    }
    return v;
}

#define EV_COMMON                                                                                  \
    "\"worker_id\":\"w\",\"partition\":1,\"offset\":5,\"schema_version\":1,\"ts_ms\":"             \
    "1718000002500"

START_TEST(chat_completion_line) {
    const char *in = "{\"custom_id\": \"request-1\", \"method\": \"POST\", " CHAT
                     ", \"body\": {\"model\": \"gpt-4o-mini\", \"messages\": [], \"logprobs\": "
                     "true, \"top_logprobs\": 1}}";
    const char *ev =
        "{\"type\":\"done\",\"request_id\":\"request-1\"," EV_COMMON
        ",\"finish_reason\":\"stop_sequence\",\"text\":\"Hi!\",\"stop\":\"\\n\","
        "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"cached_tokens\":16},"
        "\"timings\":{\"queue_ms\":0,\"ttft_ms\":1,\"total_ms\":2,\"tokens_per_s\":3},"
        "\"logprobs\":[{\"token_id\":5,\"text\":\"Hi\",\"logprob\":-0.5,\"top\":[{\"token_id\":5,"
        "\"text\":\"Hi\",\"logprob\":-0.5},{\"token_id\":6,\"text\":\"Ho\",\"logprob\":-1.5}]},"
        "{\"token_id\":0,\"text\":\"!\",\"logprob\":-9999.0,\"top\":[]}]}";
    bool is_error = true;
    json_t *o = output(in, ev, &is_error);
    ck_assert(!is_error);
    ck_assert_int_eq(strncmp(str_at(o, "id"), "batch_req_", 10), 0);
    ck_assert_str_eq(str_at(o, "custom_id"), "request-1");
    ck_assert(json_is_null(json_object_get(o, "error")));
    ck_assert_int_eq(int_at(o, "response.status_code"), 200);
    ck_assert_uint_eq(strlen(str_at(o, "response.request_id")), 32);
    ck_assert_str_eq(str_at(o, "response.body.object"), "chat.completion");
    ck_assert_str_eq(str_at(o, "response.body.id"), "chatcmpl-request-1");
    ck_assert_str_eq(str_at(o, "response.body.model"), "gpt-4o-mini");
    ck_assert_int_eq(int_at(o, "response.body.created"), 1718000002);
    ck_assert_str_eq(str_at(o, "response.body.choices.0.message.role"), "assistant");
    ck_assert_str_eq(str_at(o, "response.body.choices.0.message.content"), "Hi!");
    ck_assert_str_eq(str_at(o, "response.body.choices.0.finish_reason"), "stop");
    ck_assert_int_eq(int_at(o, "response.body.usage.total_tokens"), 22);
    ck_assert_int_eq(int_at(o, "response.body.usage.prompt_tokens_details.cached_tokens"), 16);
    json_t *lp = at(o, "response.body.choices.0.logprobs.content");
    ck_assert_uint_eq(json_array_size(lp), 2);
    ck_assert_str_eq(str_at(lp, "0.token"), "Hi");
    ck_assert_uint_eq(json_array_size(at(lp, "0.top_logprobs")), 1); /* as many as asked */
    ck_assert_int_eq(int_at(lp, "0.bytes.1"), 'i');
    ck_assert(json_real_value(at(lp, "1.logprob")) == -9999.0);
    json_decref(o);
    /* the same event for a request without logprobs: logprobs null */
    o = output("{\"custom_id\": \"request-1\", " CHAT ", \"body\": {\"messages\": []}}", ev,
               &is_error);
    ck_assert(json_is_null(at(o, "response.body.choices.0.logprobs")));
    ck_assert_str_eq(str_at(o, "response.body.model"), "served-name");
    ck_assert_ptr_null(at(o, "response.body.choices.0.message.reasoning_content"));
    json_decref(o);
    /* a parsed thought: content is the answer, the thought in reasoning_content and reasoning */
    const char *think =
        "{\"type\":\"done\",\"request_id\":\"request-1\"," EV_COMMON
        ",\"finish_reason\":\"stop\",\"text\":\"{}\",\"reasoning\":\"hmm\","
        "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":5,\"cached_tokens\":0},"
        "\"timings\":{\"queue_ms\":0,\"ttft_ms\":1,\"total_ms\":2,\"tokens_per_s\":3}}";
    o = output("{\"custom_id\": \"request-1\", " CHAT ", \"body\": {\"messages\": []}}", think,
               &is_error);
    ck_assert_str_eq(str_at(o, "response.body.choices.0.message.content"), "{}");
    ck_assert_str_eq(str_at(o, "response.body.choices.0.message.reasoning_content"), "hmm");
    ck_assert_str_eq(str_at(o, "response.body.choices.0.message.reasoning"), "hmm");
    json_decref(o);
}
END_TEST

START_TEST(text_completion_line_with_choices) {
    const char *in = "{\"custom_id\": \"c-9\", " CMPL
                     ", \"body\": {\"prompt\": \"x\", \"n\": 2, \"logprobs\": 0}}";
    const char *ev =
        "{\"type\":\"done\",\"request_id\":\"c-9\"," EV_COMMON
        ",\"finish_reason\":\"length\",\"text\":\"ab\",\"model\":\"tiny\","
        "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"cached_tokens\":0},"
        "\"timings\":{\"queue_ms\":0,\"ttft_ms\":1,\"total_ms\":2,\"tokens_per_s\":3},"
        "\"choices\":[{\"index\":0,\"finish_reason\":\"length\",\"text\":\"ab\","
        "\"completion_tokens\":2,\"logprobs\":[{\"token_id\":1,\"text\":\"a\",\"logprob\":-1,"
        "\"top\":[{\"token_id\":1,\"text\":\"a\",\"logprob\":-1}]},{\"token_id\":2,\"text\":\"b\","
        "\"logprob\":-2,\"top\":[]}]},{\"index\":1,\"finish_reason\":\"stop\",\"text\":\"c\","
        "\"completion_tokens\":2}]}";
    bool is_error;
    json_t *o = output(in, ev, &is_error);
    ck_assert_str_eq(str_at(o, "response.body.object"), "text_completion");
    ck_assert_str_eq(str_at(o, "response.body.id"), "cmpl-c-9");
    ck_assert_str_eq(str_at(o, "response.body.model"), "tiny"); /* the event's model */
    ck_assert_uint_eq(json_array_size(at(o, "response.body.choices")), 2);
    ck_assert_str_eq(str_at(o, "response.body.choices.1.text"), "c");
    ck_assert_int_eq(int_at(o, "response.body.choices.1.index"), 1);
    json_t *lp = at(o, "response.body.choices.0.logprobs");
    ck_assert_str_eq(str_at(lp, "tokens.1"), "b");
    ck_assert_int_eq(int_at(lp, "text_offset.1"), 1);
    ck_assert_uint_eq(json_object_size(at(lp, "top_logprobs.0")), 0); /* logprobs 0 */
    ck_assert(json_is_null(at(o, "response.body.choices.1.logprobs")));
    json_decref(o);
}
END_TEST

START_TEST(error_lines) {
    const char *in = "{\"custom_id\": \"e\", " CHAT ", \"body\": {\"messages\": []}}";
    const struct {
        const char *code;
        int status;
        const char *oa_code, *type, *param;
    } cases[] = {
        {"model_not_found", 404, "model_not_found", "invalid_request_error", "model"},
        {"prompt_too_long", 400, "context_length_exceeded", "invalid_request_error", "messages"},
        {"invalid_job", 400, "invalid_job", "invalid_request_error", NULL},
        {"max_tokens_too_large", 400, "max_tokens_too_large", "invalid_request_error",
         "max_tokens"},
        {"invalid_schema", 400, "invalid_schema", "invalid_request_error", "response_format"},
        {"internal", 500, "internal", "server_error", NULL},
        {"shutdown", 503, "shutdown", "server_error", NULL},
        {"expired", 0, "batch_expired", NULL, NULL},
        {"cancelled", 0, "batch_cancelled", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char ev[512];
        snprintf(ev, sizeof(ev),
                 "{\"type\":\"error\",\"request_id\":\"e\"," EV_COMMON
                 ",\"code\":\"%s\",\"message\":\"why\"}",
                 cases[i].code);
        bool is_error = false;
        json_t *o = output(in, ev, &is_error);
        ck_assert(is_error);
        if (cases[i].status == 0) {
            ck_assert(json_is_null(json_object_get(o, "response")));
            ck_assert_str_eq(str_at(o, "error.code"), cases[i].oa_code);
            ck_assert_str_eq(str_at(o, "error.message"), "why");
        } else {
            ck_assert(json_is_null(json_object_get(o, "error")));
            ck_assert_int_eq(int_at(o, "response.status_code"), cases[i].status);
            json_t *e = at(o, "response.body.error");
            ck_assert_str_eq(str_at(e, "code"), cases[i].oa_code);
            ck_assert_str_eq(str_at(e, "type"), cases[i].type);
            ck_assert_str_eq(str_at(e, "message"), "why");
            if (cases[i].param) {
                ck_assert_str_eq(str_at(e, "param"), cases[i].param);
            } else {
                ck_assert(json_is_null(json_object_get(e, "param")));
            }
        }
        json_decref(o);
    }
    /* invalid_schema names the constraint field the request gave */
    bool is_error;
    json_t *o = output("{\"request_id\": \"e\", \"prompt\": \"x\", \"regex\": \"(\"}",
                       "{\"type\":\"error\",\"request_id\":\"e\"," EV_COMMON
                       ",\"code\":\"invalid_schema\",\"message\":\"m\"}",
                       &is_error);
    ck_assert_str_eq(str_at(o, "response.body.error.param"), "regex");
    json_decref(o);
    /* an input that is not JSON: custom_id from the event */
    o = output("not json",
               "{\"type\":\"error\",\"request_id\":\"line-3\"," EV_COMMON
               ",\"code\":\"invalid_job\",\"message\":\"m\"}",
               &is_error);
    ck_assert_str_eq(str_at(o, "custom_id"), "line-3");
    json_decref(o);
    /* not a terminal event */
    char *line = NULL, msg[64];
    size_t len;
    const char *tok = "{\"type\":\"token\",\"request_id\":\"x\"}";
    ck_assert_int_eq(kg_openai_batch_output(in, strlen(in), tok, strlen(tok), NULL, &line, &len,
                                            &is_error, msg, sizeof(msg)),
                     KG_ERR_INVALID);
    ck_assert_ptr_null(line);
}
END_TEST

START_TEST(line_ids) {
    char id[64];
    const char *a = "{\"custom_id\": \"c\", \"request_id\": \"r\"}";
    ck_assert(kg_openai_line_id(a, strlen(a), id, sizeof(id)));
    ck_assert_str_eq(id, "c");
    const char *b = "{\"type\": \"done\", \"request_id\": \"r\"}";
    ck_assert(kg_openai_line_id(b, strlen(b), id, sizeof(id)));
    ck_assert_str_eq(id, "r");
    ck_assert(!kg_openai_line_id("{\"x\": 1}", 8, id, sizeof(id)));
    ck_assert(!kg_openai_line_id("{\"request_id\": \"toolong\"}", 25, id, 4));
    ck_assert(!kg_openai_line_id("nope", 4, id, sizeof(id)));
}
END_TEST

/* /v1/embeddings, /v1/rerank and /v1/score: Batch lines and bare bodies
 * become embed, rerank and score jobs; their done events become OpenAI's
 * embedding list, a rerank body and a score list. */
START_TEST(embeddings_rerank_score) {
    kg_job_t *job = decode_ok("{\"custom_id\": \"e1\", \"method\": \"POST\", \"url\": "
                              "\"/v1/embeddings\", \"body\": {\"model\": \"m\", \"input\": "
                              "[\"a\", \"b\"], \"encoding_format\": \"base64\", \"dimensions\": 8, "
                              "\"user\": \"u\"}}");
    ck_assert_int_eq(job->task, KG_TASK_EMBED);
    ck_assert_int_eq(job->n_inputs, 2);
    ck_assert_str_eq(job->inputs[1].text, "b");
    ck_assert(job->base64 && job->normalize);
    ck_assert_int_eq(job->dimensions, 8);
    ck_assert_str_eq(job->model, "m");
    kg_job_free(job);
    job = decode_ok("{\"input\": [[1, 2, 3]]}"); /* a bare Embeddings body: token ids */
    ck_assert_int_eq(job->task, KG_TASK_EMBED);
    ck_assert_int_eq(job->inputs[0].n_tokens, 3);
    ck_assert_str_eq(job->request_id, "key-1");
    kg_job_free(job);
    job = decode_ok("{\"custom_id\": \"r1\", \"url\": \"/v1/rerank\", \"body\": {\"query\": \"q\", "
                    "\"documents\": [\"x\", {\"text\": \"y\"}], \"top_n\": 1}}");
    ck_assert_int_eq(job->task, KG_TASK_RERANK);
    ck_assert_str_eq(job->query.text, "q");
    ck_assert_str_eq(job->inputs[1].text, "y");
    ck_assert_int_eq(job->top_n, 1);
    kg_job_free(job);
    job = decode_ok("{\"text_1\": \"q\", \"text_2\": \"x\"}");
    ck_assert_int_eq(job->task, KG_TASK_SCORE);
    ck_assert_int_eq(job->n_inputs, 1);
    kg_job_free(job);
    decode_invalid("{\"custom_id\": \"e2\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": "
                   "\"a\", \"encoding_format\": \"int8\"}}",
                   "e2", "encoding_format:");

    bool is_error = true;
    json_t *v = output("{\"custom_id\": \"e1\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": "
                       "[\"a\", \"b\"]}}",
                       "{\"type\": \"done\", \"request_id\": \"e1\", \"ts_ms\": 5000, "
                       "\"usage\": {\"prompt_tokens\": 6}, \"embeddings\": [[0.6, 0.8], [1, 0]]}",
                       &is_error);
    ck_assert(!is_error);
    json_t *body = json_object_get(json_object_get(v, "response"), "body");
    ck_assert_str_eq(json_string_value(json_object_get(body, "object")), "list");
    ck_assert_str_eq(json_string_value(json_object_get(body, "model")), "served-name");
    json_t *d1 = json_array_get(json_object_get(body, "data"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(d1, "object")), "embedding");
    ck_assert_int_eq(json_integer_value(json_object_get(d1, "index")), 1);
    ck_assert_int_eq(json_array_size(json_object_get(d1, "embedding")), 2);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(body, "usage"), "total_tokens")), 6);
    json_decref(v);
    const char *res = "{\"type\": \"done\", \"request_id\": \"r1\", \"model\": \"rr\", "
                      "\"usage\": {\"prompt_tokens\": 9}, \"results\": [{\"index\": 1, "
                      "\"relevance_score\": 0.75}]}";
    v = output("{\"custom_id\": \"r1\", \"url\": \"/v1/rerank\", \"body\": {}}", res, &is_error);
    body = json_object_get(json_object_get(v, "response"), "body");
    json_t *r0 = json_array_get(json_object_get(body, "results"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(r0, "index")), 1);
    ck_assert(json_real_value(json_object_get(r0, "relevance_score")) == 0.75);
    ck_assert_str_eq(json_string_value(json_object_get(body, "model")), "rr");
    json_decref(v);
    v = output("{\"custom_id\": \"s1\", \"url\": \"/v1/score\", \"body\": {}}", res, &is_error);
    body = json_object_get(json_object_get(v, "response"), "body");
    r0 = json_array_get(json_object_get(body, "data"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(r0, "object")), "score");
    ck_assert(json_real_value(json_object_get(r0, "score")) == 0.75);
    json_decref(v);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("openai");
    TCase *tc = tcase_create("jobs");
    tcase_add_test(tc, formats_and_shapes);
    tcase_add_test(tc, request_ids);
    tcase_add_test(tc, line_and_url_errors);
    tcase_add_test(tc, messages);
    tcase_add_test(tc, prompts);
    tcase_add_test(tc, sampling_and_logprobs);
    tcase_add_test(tc, response_format_copied_unchanged);
    tcase_add_test(tc, vllm_guided_decoding);
    suite_add_tcase(s, tc);
    tc = tcase_create("results");
    tcase_add_test(tc, chat_completion_line);
    tcase_add_test(tc, text_completion_line_with_choices);
    tcase_add_test(tc, error_lines);
    tcase_add_test(tc, line_ids);
    tcase_add_test(tc, embeddings_rerank_score);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
