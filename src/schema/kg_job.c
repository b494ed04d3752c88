/* kg_job: lifetime and contract defaults of a decoded job. */
#include "kg_job.h"

#include <stdlib.h>

void kg_job_free(kg_job_t *job) {
    if (!job) {
        return;
    }
    free(job->request_id);
    free(job->prompt);
    free(job->prompt_tokens);
    for (int32_t i = 0; i < job->n_messages; i++) {
        free((void *)job->messages[i].content); // owned; const only for kg_chat_render
        free(job->message_extra ? job->message_extra[i] : NULL);
    }
    free(job->messages);
    free(job->message_extra);
    for (int32_t i = 0; i < job->n_stop; i++) {
        free(job->stop[i]);
    }
    free(job->stop);
    free(job->metadata_json);
    free(job->model);
    for (int32_t i = 0; i < job->n_lora; i++) {
        free(job->lora[i].name);
    }
    free((void *)job->sampling.logit_bias); // owned; const for the sampler
    free(job->constraint_text);
    free(job->schema_name);
    free(job->template_kwargs_json);
    free(job->reasoning_effort);
    free(job->tools_json);
    free(job->tool_choice_name);
    free(job->topic);
    for (int32_t i = 0; i < job->n_inputs; i++) {
        free(job->inputs[i].text);
        free(job->inputs[i].tokens);
    }
    free(job->inputs);
    free(job->query.text);
    free(job->query.tokens);
    free(job);
}

uint64_t kg_job_default_seed(const char *request_id) {
    uint64_t h = 0xcbf29ce484222325ULL; // FNV-1a 64 offset basis
    for (const unsigned char *p = (const unsigned char *)request_id; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h & 0x7fffffffffffffffULL;
}

kg_sampling_params_t kg_job_sampling_defaults(void) {
    kg_sampling_params_t sp = {
        .temperature = 1.0f,
        .top_k = -1,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .penalty_last_n = -1,
        .seed = 0,
        .n_logprobs = 0,
    };
    return sp;
}
