/* kg_loras: the served LoRA adapters (see kg_loras.h). */
#include "kg_loras.h"

#include "../core/kg_clock.h"
#include "../core/kg_log.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* One NAME=PATH[:SCALE] of `len` bytes. */
static kg_status_t
add_one(kg_loras_t *l, const char *item, size_t len, char *errstr, size_t errstr_size) {
    const char *eq = memchr(item, '=', len);
    if (!eq || eq == item || eq + 1 == item + len) {
        snprintf(errstr, errstr_size, "--lora: '%.*s' is not NAME=PATH[:SCALE]", (int)len, item);
        return KG_ERR_INVALID;
    }
    const char *path = eq + 1;
    size_t path_len = (size_t)(item + len - path);
    float scale = 1.0f;
    const char *colon = NULL;
    for (const char *p = path; p < item + len; p++) {
        colon = *p == ':' ? p : colon;
    }
    if (colon && colon > path) {
        char num[32];
        size_t n = (size_t)(item + len - colon - 1);
        if (n > 0 && n < sizeof(num)) {
            memcpy(num, colon + 1, n);
            num[n] = '\0';
            char *end;
            errno = 0;
            double v = strtod(num, &end);
            if (*end == '\0' && errno == 0 && isfinite(v)) {
                scale = (float)v;
                path_len = (size_t)(colon - path);
            }
        }
    }
    const size_t name_len = (size_t)(eq - item);
    for (size_t i = 0; i < name_len; i++) {
        if (item[i] == '"' || item[i] == '\\' || (unsigned char)item[i] < 0x20) {
            snprintf(errstr, errstr_size,
                     "--lora: the name '%.*s' has a quote, a backslash or a "
                     "control character",
                     (int)name_len, item);
            return KG_ERR_INVALID;
        }
    }
    for (int32_t i = 0; i < l->n; i++) {
        if (strlen(l->e[i].name) == name_len && memcmp(l->e[i].name, item, name_len) == 0) {
            snprintf(errstr, errstr_size, "--lora: the name '%.*s' twice", (int)name_len, item);
            return KG_ERR_INVALID;
        }
    }
    if (l->n == KG_LORAS_MAX) {
        snprintf(errstr, errstr_size, "--lora: more than %d adapters", KG_LORAS_MAX);
        return KG_ERR_INVALID;
    }
    kg_lora_entry_t *grown = realloc(l->e, (size_t)(l->n + 1) * sizeof(*grown));
    if (!grown) {
        return KG_ERR_NOMEM;
    }
    l->e = grown;
    kg_lora_entry_t *e = &l->e[l->n];
    memset(e, 0, sizeof(*e));
    e->name = dup_n(item, name_len);
    e->path = dup_n(path, path_len);
    e->scale = scale;
    e->id = -1;
    e->stats = calloc(1, sizeof(*e->stats));
    l->n++;
    return e->name && e->path && e->stats ? KG_OK : KG_ERR_NOMEM;
}

kg_status_t kg_loras_parse(kg_loras_t *l, const char *spec, char *errstr, size_t errstr_size) {
    memset(l, 0, sizeof(*l));
    for (const char *s = spec; s && *s;) {
        size_t len = strcspn(s, ",");
        if (len == 0) {
            snprintf(errstr, errstr_size, "--lora: an empty entry");
            return KG_ERR_INVALID;
        }
        kg_status_t st = add_one(l, s, len, errstr, errstr_size);
        if (st != KG_OK) {
            return st;
        }
        s += len + (s[len] == ',');
    }
    return KG_OK;
}

kg_status_t kg_loras_load(
    kg_loras_t *l, const kg_model_t *model, kg_backend_t *be, char *errstr, size_t errstr_size) {
    for (int32_t i = 0; i < l->n; i++) {
        kg_lora_entry_t *e = &l->e[i];
        char err[480];
        const int64_t t0 = kg_clock_us();
        e->lora = kg_lora_load(e->path, model, err, sizeof(err));
        if (!e->lora) {
            snprintf(errstr, errstr_size, "--lora %s: %s", e->name, err);
            return KG_ERR_INVALID;
        }
        kg_status_t st = kg_backend_lora_add(be, e->lora, &e->id, err, sizeof(err));
        if (st != KG_OK) {
            snprintf(errstr, errstr_size, "--lora %s: %s", e->name, err);
            return st;
        }
        KG_LOG_INFO("lora",
                    "adapter name=%s path=%s pairs=%d rank=%d alpha=%g scale=%g bytes=%zu "
                    "load_ms=%.1f",
                    e->name, e->path, e->lora->n_pairs, e->lora->max_rank, (double)e->lora->alpha,
                    (double)e->scale, e->lora->size, (double)(kg_clock_us() - t0) / 1000.0);
    }
    return KG_OK;
}

const kg_lora_entry_t *kg_loras_find(const kg_loras_t *l, const char *name) {
    for (int32_t i = 0; l && name && i < l->n; i++) {
        if (strcmp(l->e[i].name, name) == 0) {
            return &l->e[i];
        }
    }
    return NULL;
}

void kg_loras_count(const kg_loras_t *l, const kg_lora_set_t *set, int64_t jobs, int64_t tokens) {
    for (int32_t j = 0; l && j < set->n; j++) {
        for (int32_t i = 0; i < l->n; i++) {
            if (l->e[i].id == set->id[j]) {
                atomic_fetch_add(&l->e[i].stats->n_jobs, jobs);
                atomic_fetch_add(&l->e[i].stats->n_tokens, tokens);
                break;
            }
        }
    }
}

void kg_loras_clear(kg_loras_t *l, kg_backend_t *be) {
    for (int32_t i = 0; i < l->n; i++) {
        if (be && l->e[i].id >= 0) {
            kg_backend_lora_remove(be, l->e[i].id);
        }
        kg_lora_free(l->e[i].lora);
        free(l->e[i].name);
        free(l->e[i].path);
        free(l->e[i].stats);
    }
    free(l->e);
    memset(l, 0, sizeof(*l));
}
