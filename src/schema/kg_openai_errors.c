/* kg_openai_errors: how a kgen error code becomes an OpenAI Batch output line's error: its
 * HTTP-style status, OpenAI's error type and code, and the request field it is about. Apart
 * from kg_openai.c, which builds the lines, so that file stays one idea under 1,000 lines. */
#include "kg_openai_int.h"

#include <string.h>

/* HTTP-style status, OpenAI error type and code of a kgen error code; 0:
 * not an HTTP error (a batch_expired / batch_cancelled line). */
int kg_openai_error_status(const char *code, const char **type, const char **oa_code) {
    *type = "invalid_request_error";
    *oa_code = code;
    if (strcmp(code, "expired") == 0) {
        *oa_code = "batch_expired";
        return 0;
    }
    if (strcmp(code, "cancelled") == 0) {
        *oa_code = "batch_cancelled";
        return 0;
    }
    if (strcmp(code, "model_not_found") == 0) {
        return 404;
    }
    if (strcmp(code, "prompt_too_long") == 0) {
        *oa_code = "context_length_exceeded";
        return 400;
    }
    if (strcmp(code, "internal") == 0) {
        *type = "server_error";
        return 500;
    }
    if (strcmp(code, "queue_full") == 0 || strcmp(code, "shutdown") == 0) {
        *type = "server_error";
        return 503;
    }
    return 400;
}

/* The constraint field an invalid_schema error is about: the one the request
 * gave (a Batch line's body, a bare body or a kgen job), response_format
 * when the input is not there to say. */
static const char *constraint_param(const json_t *in) {
    static const char *const keys[] = {"response_format", "regex", "choice", "grammar"};
    const json_t *body = json_object_get(in, "body");
    const json_t *req = json_is_object(body) ? body : in;
    for (size_t i = 0; req && i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *v = json_object_get(req, keys[i]);
        if (v && !json_is_null(v)) { /* absent and null both mean "not given" */
            return keys[i];
        }
    }
    return "response_format";
}

const char *kg_openai_error_param(const char *code, bool chat, const json_t *in) {
    if (strcmp(code, "model_not_found") == 0) {
        return "model";
    }
    if (strcmp(code, "prompt_too_long") == 0 || strcmp(code, "unsupported_chat_template") == 0) {
        return chat ? "messages" : "prompt";
    }
    if (strcmp(code, "max_tokens_too_large") == 0) {
        return "max_tokens";
    }
    if (strcmp(code, "invalid_schema") == 0) {
        return constraint_param(in);
    }
    return NULL;
}
