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
#include <sys/stat.h>

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A name goes into metrics labels and JSON: no quote, backslash or
 * control character. */
static bool name_is_clean(const char *name, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '"' || name[i] == '\\' || (unsigned char)name[i] < 0x20) {
            return false;
        }
    }
    return len > 0;
}

/* A new entry at the end (the array is allocated once, KG_LORAS_MAX long,
 * so a metrics scrape reading entries never sees it move); NULL when full
 * or out of memory. Published by the caller (n + 1) once filled. */
static kg_lora_entry_t *
new_entry(kg_loras_t *l, const char *name, size_t name_len, const char *path, size_t path_len) {
    if (!l->e && !(l->e = calloc(KG_LORAS_MAX, sizeof(*l->e)))) {
        return NULL;
    }
    const int32_t n = atomic_load(&l->n);
    if (n == KG_LORAS_MAX) {
        return NULL;
    }
    kg_lora_entry_t *e = &l->e[n];
    memset(e, 0, sizeof(*e));
    e->name = dup_n(name, name_len);
    e->path = dup_n(path, path_len);
    e->scale = 1.0f;
    e->id = -1;
    e->stats = calloc(1, sizeof(*e->stats));
    if (!e->name || !e->path || !e->stats) {
        free(e->name);
        free(e->path);
        free(e->stats);
        memset(e, 0, sizeof(*e));
        return NULL;
    }
    return e;
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
    if (!name_is_clean(item, name_len)) {
        snprintf(errstr, errstr_size,
                 "--lora: the name '%.*s' has a quote, a backslash or a "
                 "control character",
                 (int)name_len, item);
        return KG_ERR_INVALID;
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
    kg_lora_entry_t *e = new_entry(l, item, name_len, path, path_len);
    if (!e) {
        return KG_ERR_NOMEM;
    }
    e->scale = scale;
    atomic_fetch_add(&l->n, 1);
    return KG_OK;
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

kg_status_t kg_loras_set_dir(kg_loras_t *l, const char *dir, char *errstr, size_t errstr_size) {
    struct stat sb;
    if (!dir || !*dir) {
        return KG_OK;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(errstr, errstr_size, "--lora-dir: '%s' is not a directory (%s)", dir,
                 errno ? strerror(errno) : "not a directory");
        return KG_ERR_INVALID;
    }
    free(l->dir);
    l->dir = strdup(dir);
    return l->dir ? KG_OK : KG_ERR_NOMEM;
}

/* Touch every page of the pairs' data here, on the thread that takes jobs,
 * so that the engine thread's load (which stalls every running job's
 * step) finds them mapped rather than taking a page fault per 4 KiB: on
 * the virtual machine we measured on, those faults were 50-200 ms of a
 * 7B-shaped rank-16 adapter's first load (scripts/bench-lora). */
static void touch_pairs(const kg_lora_t *lora) {
    volatile unsigned char sink = 0;
    for (int32_t il = 0; il < lora->n_layer; il++) {
        for (int p = 0; p < KG_LORA_N_PROJ; p++) {
            const kg_gguf_tensor_t *t[2] = {lora->pairs[il][p].a, lora->pairs[il][p].b};
            for (int h = 0; h < 2 && t[0]; h++) {
                const unsigned char *d = t[h]->data;
                for (size_t at = 0; at < t[h]->size; at += 4096) {
                    sink ^= d[at];
                }
            }
        }
    }
    (void)sink;
}

/* Read and check entry e and add it to the table (not loaded). */
static kg_status_t read_entry(kg_loras_t *l, kg_lora_entry_t *e, char *errstr, size_t errstr_size) {
    char err[480];
    const int64_t t0 = kg_clock_us();
    e->lora = kg_lora_load(e->path, l->model, err, sizeof(err));
    if (!e->lora) {
        snprintf(errstr, errstr_size, "%s", err);
        return KG_ERR_INVALID;
    }
    touch_pairs(e->lora);
    e->id = kg_adapters_add(l->adapters, e->lora, e->name);
    if (e->id < 0) {
        snprintf(errstr, errstr_size, "more than %d adapters", KG_ADAPTERS_MAX);
        return KG_ERR_INVALID;
    }
    KG_LOG_INFO("lora",
                "adapter name=%s path=%s pairs=%d rank=%d alpha=%g scale=%g bytes=%zu read_ms=%.1f",
                e->name, e->path, e->lora->n_pairs, e->lora->max_rank, (double)e->lora->alpha,
                (double)e->scale, e->lora->size, (double)(kg_clock_us() - t0) / 1000.0);
    return KG_OK;
}

kg_status_t kg_loras_load(kg_loras_t *l,
                          const kg_model_t *model,
                          kg_backend_t *be,
                          int32_t max_loras,
                          char *errstr,
                          size_t errstr_size) {
    l->model = model;
    if ((l->dir || l->n > 0) && !kg_backend_has_lora(be)) {
        /* refused now rather than on every job naming one */
        char why[256];
        kg_backend_no_lora_why(be, why, sizeof(why));
        snprintf(errstr, errstr_size, "%s: %s", l->dir ? "--lora-dir" : "--lora", why);
        return KG_ERR_UNSUPPORTED;
    }
    l->adapters = kg_adapters_new(be, max_loras);
    if (!l->adapters) {
        snprintf(errstr, errstr_size, "out of memory");
        return KG_ERR_NOMEM;
    }
    for (int32_t i = 0; i < l->n; i++) {
        kg_lora_entry_t *e = &l->e[i];
        char err[480];
        if (read_entry(l, e, err, sizeof(err)) != KG_OK) {
            snprintf(errstr, errstr_size, "--lora %s: %s", e->name, err);
            return KG_ERR_INVALID;
        }
        if (max_loras > 0 && i >= max_loras) {
            continue; /* checked; loaded when a job needs it */
        }
        kg_status_t st = kg_adapters_load(l->adapters, e->id, err, sizeof(err));
        if (st != KG_OK) {
            snprintf(errstr, errstr_size, "--lora %s: %s", e->name, err);
            return st;
        }
    }
    return KG_OK;
}

kg_status_t kg_loras_resolve(kg_loras_t *l,
                             const char *name,
                             const kg_lora_entry_t **out,
                             char *errstr,
                             size_t errstr_size) {
    *out = kg_loras_find(l, name);
    if (*out || !l || !l->dir || !name || !l->adapters) {
        return KG_OK;
    }
    /* DIR/NAME.gguf: a plain file name, nothing that leaves DIR */
    const size_t len = strlen(name);
    if (!name_is_clean(name, len) || len > 200 || name[0] == '.' || strchr(name, '/')) {
        return KG_OK;
    }
    char path[4096];
    int w = snprintf(path, sizeof(path), "%s/%s.gguf", l->dir, name);
    struct stat sb;
    if (w < 0 || (size_t)w >= sizeof(path) || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        return KG_OK;
    }
    kg_lora_entry_t *e = new_entry(l, name, len, path, (size_t)w);
    if (!e) {
        return atomic_load(&l->n) == KG_LORAS_MAX ? KG_OK : KG_ERR_NOMEM;
    }
    char err[480];
    if (read_entry(l, e, err, sizeof(err)) != KG_OK) {
        /* not kept: the next job naming it reads the file again (it may
         * have been fixed) */
        snprintf(errstr, errstr_size, "lora: adapter \"%.64s\" (%s) cannot be used: %s", name, path,
                 err);
        kg_lora_free(e->lora);
        free(e->name);
        free(e->path);
        free(e->stats);
        memset(e, 0, sizeof(*e));
        return KG_ERR_INVALID;
    }
    atomic_fetch_add(&l->n, 1); /* published: a scrape may read it now */
    *out = e;
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

void kg_loras_clear(kg_loras_t *l) {
    kg_adapters_free(l->adapters); /* takes the resident ones out of the backend first */
    for (int32_t i = 0; i < l->n; i++) {
        kg_lora_free(l->e[i].lora);
        free(l->e[i].name);
        free(l->e[i].path);
        free(l->e[i].stats);
    }
    free(l->e);
    free(l->dir);
    memset(l, 0, sizeof(*l));
}
