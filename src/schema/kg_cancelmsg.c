/* kg_cancelmsg: decode and encode cancel messages; see kg_cancelmsg.h. */
#include "kg_cancelmsg.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_request_id(const char *s, size_t n) {
    if (n < 1 || n > KG_JOB_REQUEST_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-')) {
            return false;
        }
    }
    return true;
}

kg_status_t kg_cancelmsg_decode(const void *key,
                                size_t key_len,
                                const void *value,
                                size_t len,
                                char *rid,
                                char *why,
                                size_t why_size) {
    rid[0] = '\0';
    if (!value || len == 0) {
        if (key && is_request_id(key, key_len)) {
            memcpy(rid, key, key_len);
            rid[key_len] = '\0';
            return KG_OK;
        }
        snprintf(why, why_size, "an empty cancel whose key is no request_id");
        return KG_ERR_INVALID;
    }
    json_error_t jerr;
    json_t *root = json_loadb(value, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(why, why_size, "not JSON: %s", jerr.text);
        return KG_ERR_INVALID;
    }
    kg_status_t st = KG_ERR_INVALID;
    json_t *v = json_object_get(root, "request_id");
    json_t *ver = json_object_get(root, "schema_version");
    if (!json_is_object(root)) {
        snprintf(why, why_size, "not a JSON object");
    } else if (ver && !json_is_null(ver) &&
               !(json_is_integer(ver) && json_integer_value(ver) == KG_SCHEMA_VERSION)) {
        snprintf(why, why_size, "schema_version: expected %d", KG_SCHEMA_VERSION);
    } else if (!json_is_string(v) || !is_request_id(json_string_value(v), json_string_length(v))) {
        snprintf(why, why_size, "request_id: expected 1..%d characters of [A-Za-z0-9._:-]",
                 KG_JOB_REQUEST_ID_MAX);
    } else {
        memcpy(rid, json_string_value(v), json_string_length(v) + 1);
        st = KG_OK;
    }
    json_decref(root);
    return st;
}

char *kg_cancelmsg_encode(const char *request_id, size_t *len) {
    json_t *o = json_object();
    char *text = NULL;
    if (o && json_object_set_new(o, "request_id", json_string(request_id)) == 0 &&
        json_object_set_new(o, "schema_version", json_integer(KG_SCHEMA_VERSION)) == 0) {
        text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(o);
    if (text && len) {
        *len = strlen(text);
    }
    return text;
}
