/* kg_codec_job_encode: a kg_job_t back into a job message with every field
 * explicit, so decoding it gives the same job (kg_codec.h). The worker
 * never encodes jobs: kgen-submit, the round-trip tests and the fuzzers do.
 * Values are written by kg_codec_writer.c, as events are. */
#include "kg_codec.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <stdio.h>

// ---- job encode ----

static json_t *messages_json(const kg_job_t *job) {
    json_t *arr = json_array();
    bool ok = arr != NULL;
    for (int32_t i = 0; ok && i < job->n_messages; i++) {
        json_t *m = json_object();
        kg_codec_append(arr, m, &ok);
        if (ok) {
            kg_codec_put(m, "role", kg_codec_cstr_json(job->messages[i].role), &ok);
            kg_codec_put(m, "content", kg_codec_cstr_json(job->messages[i].content), &ok);
            const char *xj = job->message_extra ? job->message_extra[i] : NULL;
            json_t *extra = xj ? json_loads(xj, KG_LOAD_FLAGS, NULL) : NULL;
            if (extra && json_object_update(m, extra) != 0) {
                ok = false;
            }
            json_decref(extra);
        }
    }
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *tokens_json(const int32_t *ids, int32_t n) {
    json_t *arr = json_array();
    bool ok = arr != NULL;
    for (int32_t i = 0; ok && i < n; i++) {
        kg_codec_append(arr, json_integer(ids[i]), &ok);
    }
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *prompt_json(const kg_job_t *job) {
    switch (job->prompt_kind) {
    case KG_PROMPT_TOKENS:
        return tokens_json(job->prompt_tokens, job->n_prompt_tokens);
    case KG_PROMPT_MESSAGES:
        return messages_json(job);
    default:
        return kg_codec_text_json(job->prompt, job->prompt_len);
    }
}

static void put_sampling(json_t *o, const kg_sampling_params_t *sp, bool *ok) {
    kg_codec_put(o, "temperature", kg_codec_float_json(sp->temperature), ok);
    kg_codec_put(o, "top_k", json_integer(sp->top_k), ok);
    kg_codec_put(o, "top_p", kg_codec_float_json(sp->top_p), ok);
    kg_codec_put(o, "min_p", kg_codec_float_json(sp->min_p), ok);
    kg_codec_put(o, "repetition_penalty", kg_codec_float_json(sp->repetition_penalty), ok);
    kg_codec_put(o, "frequency_penalty", kg_codec_float_json(sp->frequency_penalty), ok);
    kg_codec_put(o, "presence_penalty", kg_codec_float_json(sp->presence_penalty), ok);
    kg_codec_put(o, "seed", json_integer((json_int_t)(sp->seed & 0x7fffffffffffffffULL)), ok);
}

/* The job's constraint in its own field (decoding it gives the same job). */
static void put_constraint(json_t *o, const kg_job_t *job, bool *ok) {
    const char *text = job->constraint_text;
    size_t len = job->constraint_len;
    switch (job->constraint) {
    case KG_CONSTRAINT_JSON_OBJECT:
    case KG_CONSTRAINT_JSON_SCHEMA: {
        json_t *rf = json_object();
        kg_codec_put(o, "response_format", rf, ok);
        if (job->constraint == KG_CONSTRAINT_JSON_OBJECT && !job->schema_name) {
            kg_codec_put(rf, "type", json_string("json_object"), ok);
            break;
        }
        json_t *js = json_object();
        kg_codec_put(rf, "type", json_string("json_schema"), ok);
        kg_codec_put(rf, "json_schema", js, ok);
        kg_codec_put(js, "name", kg_codec_cstr_json(job->schema_name ? job->schema_name : "schema"),
                     ok);
        kg_codec_put(js, "strict", json_boolean(job->schema_strict), ok);
        if (job->constraint == KG_CONSTRAINT_JSON_SCHEMA) {
            json_error_t jerr;
            kg_codec_put(js, "schema", json_loadb(text, len, 0, &jerr), ok);
        }
        break;
    }
    case KG_CONSTRAINT_REGEX:
        kg_codec_put(o, "regex", kg_codec_text_json(text, len), ok);
        break;
    case KG_CONSTRAINT_GRAMMAR:
        kg_codec_put(o, "grammar", kg_codec_text_json(text, len), ok);
        break;
    case KG_CONSTRAINT_CHOICE: {
        json_t *arr = json_array();
        kg_codec_put(o, "choice", arr, ok);
        for (size_t at = 0; arr && at + 4 <= len;) {
            uint32_t l = 0;
            for (int k = 0; k < 4; k++) {
                l |= (uint32_t)(unsigned char)text[at + (size_t)k] << (8 * k);
            }
            at += 4;
            kg_codec_append(arr, kg_codec_text_json(text + at, l), ok);
            at += l;
        }
        break;
    }
    default:
        break;
    }
}

char *kg_codec_encode_job(const kg_job_t *job, size_t *len) {
    static const char *const prompt_keys[] = {"prompt", "prompt_tokens", "messages"};
    char *text = NULL;
    json_t *o = json_object();
    json_t *stop = json_array();
    bool ok = o && stop;
    kg_codec_put(o, "schema_version", json_integer(KG_SCHEMA_VERSION), &ok);
    kg_codec_put(o, "request_id", kg_codec_cstr_json(job->request_id), &ok);
    if (job->task == KG_TASK_GENERATE) {
        kg_codec_put(o, prompt_keys[job->prompt_kind <= KG_PROMPT_MESSAGES ? job->prompt_kind : 0],
                     prompt_json(job), &ok);
    }
    kg_codec_put_task(o, job, &ok);
    kg_codec_put(o, "max_tokens", json_integer(job->max_tokens), &ok);
    put_sampling(o, &job->sampling, &ok);
    for (int32_t i = 0; stop && i < job->n_stop; i++) {
        kg_codec_append(stop, kg_codec_cstr_json(job->stop[i]), &ok);
    }
    kg_codec_put(o, "stop", json_incref(stop), &ok);
    kg_codec_put(o, "stream", json_boolean(job->stream), &ok);
    kg_codec_put(o, "logprobs", json_integer(job->sampling.n_logprobs), &ok);
    if (job->deadline_ms > 0) {
        kg_codec_put(o, "deadline_ms", json_integer(job->deadline_ms), &ok);
    }
    kg_codec_put(o, "priority", json_integer(job->priority), &ok);
    kg_codec_put(o, "ignore_eos", json_boolean(job->ignore_eos), &ok);
    kg_codec_put(o, "n", json_integer(job->n), &ok);
    if (job->model) {
        kg_codec_put(o, "model", kg_codec_cstr_json(job->model), &ok);
    }
    if (job->n_lora > 0) {
        json_t *arr = json_array();
        kg_codec_put(o, "lora", arr, &ok);
        for (int32_t i = 0; arr && i < job->n_lora; i++) {
            json_t *e = json_object();
            ok = ok && e && json_array_append_new(arr, e) == 0;
            if (e) {
                kg_codec_put(e, "name", kg_codec_cstr_json(job->lora[i].name), &ok);
                if (job->lora[i].has_scale) {
                    kg_codec_put(e, "scale", kg_codec_float_json(job->lora[i].scale), &ok);
                }
            }
        }
    }
    if (job->sampling.n_logit_bias > 0) {
        json_t *lb = json_object();
        kg_codec_put(o, "logit_bias", lb, &ok);
        for (int32_t i = 0; lb && i < job->sampling.n_logit_bias; i++) {
            char key[16];
            snprintf(key, sizeof(key), "%d", job->sampling.logit_bias[i].token);
            kg_codec_put(lb, key, kg_codec_float_json(job->sampling.logit_bias[i].bias), &ok);
        }
    }
    put_constraint(o, job, &ok);
    kg_codec_encode_reasoning(o, job, &ok);
    kg_codec_encode_tools(o, job, &ok);
    if (ok) {
        text = kg_codec_dump_with_metadata(o, job->metadata_json, len);
    }
    json_decref(stop);
    json_decref(o);
    return text;
}
