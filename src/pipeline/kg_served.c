/* kg_served: the served model names (see kg_served.h). */
#include "kg_served.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kg_status_t add(kg_served_t *s, const char *name, size_t len, char *errstr, size_t size) {
    while (len > 0 && (*name == ' ' || *name == '\t')) {
        name++;
        len--;
    }
    while (len > 0 && (name[len - 1] == ' ' || name[len - 1] == '\t')) {
        len--;
    }
    if (len == 0) {
        snprintf(errstr, size, "--served-model-name: empty name");
        return KG_ERR_INVALID;
    }
    for (int32_t i = 0; i < s->n; i++) {
        if (strlen(s->names[i]) == len && memcmp(s->names[i], name, len) == 0) {
            return KG_OK; /* once is enough */
        }
    }
    if (s->n == KG_SERVED_MAX) {
        snprintf(errstr, size, "--served-model-name: more than %d names", KG_SERVED_MAX);
        return KG_ERR_INVALID;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        snprintf(errstr, size, "out of memory");
        return KG_ERR_NOMEM;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    s->names[s->n++] = copy;
    return KG_OK;
}

kg_status_t kg_served_init(kg_served_t *s,
                           const char *spec,
                           const kg_model_t *model,
                           const char *model_path,
                           char *errstr,
                           size_t errstr_size) {
    memset(s, 0, sizeof(*s));
    kg_status_t st = KG_OK;
    if (spec && *spec) {
        /* the names given replace the defaults, as vLLM's --served-model-name does */
        for (const char *p = spec;; p++) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if ((st = add(s, p, len, errstr, errstr_size)) != KG_OK || !comma) {
                return st;
            }
            p = comma;
        }
    }
    kg_gguf_str_t name;
    if (model && model->gguf && kg_gguf_get_str(model->gguf, "general.name", &name) &&
        name.len > 0 && (st = add(s, name.data, name.len, errstr, errstr_size)) != KG_OK) {
        return st;
    }
    if (model_path && *model_path) {
        const char *base = strrchr(model_path, '/');
        base = base ? base + 1 : model_path;
        size_t len = strlen(base);
        if (len > 5 && strcmp(base + len - 5, ".gguf") == 0) {
            len -= 5;
        }
        if (len > 0 && (st = add(s, base, len, errstr, errstr_size)) != KG_OK) {
            return st;
        }
    }
    return KG_OK;
}

void kg_served_clear(kg_served_t *s) {
    for (int32_t i = 0; i < s->n; i++) {
        free(s->names[i]);
    }
    memset(s, 0, sizeof(*s));
}

void kg_served_describe(const kg_served_t *s, char *out, size_t size) {
    size_t at = 0;
    if (size > 0) {
        out[0] = '\0';
    }
    for (int32_t i = 0; i < s->n && at < size; i++) {
        int w = snprintf(out + at, size - at, "%s%s", i ? ", " : "", s->names[i]);
        if (w < 0) {
            break;
        }
        at += (size_t)w;
    }
}
