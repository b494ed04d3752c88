/* kg_jinja: the entry points: compiling a template, render contexts and
 * their variables, rendering under the limits. */
#include "kg_jinja.h"

#include "kg_jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kg_jinja_limits_t defaults = {
    .max_output_bytes = (size_t)4 << 20,
    .max_memory_bytes = (size_t)64 << 20,
    .max_steps = 10000000,
    .max_depth = 100,
};

/* setjmp's caller: `rs` lives in the caller, so nothing local changes
 * between setjmp and longjmp here. */
static bool parse_guarded(kj_rs_t *rs, kg_jinja_template_t *t, const char *src, size_t len) {
    if (setjmp(rs->fail)) {
        return false;
    }
    t->root = kj_parse(rs, &t->arena, src, len);
    return true;
}

kg_jinja_template_t *
kg_jinja_compile(const char *src, size_t len, char *errstr, size_t errstr_size) {
    kg_jinja_template_t *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    /* a template is text of a few KiB; its tree is a small multiple of it */
    t->arena.cap = 64 * len + ((size_t)1 << 20);
    kj_rs_t rs = {.arena = &t->arena, .err = errstr, .err_size = errstr_size};
    if (!parse_guarded(&rs, t, src ? src : "", src ? len : 0)) {
        kg_jinja_template_free(t);
        return NULL;
    }
    return t;
}

void kg_jinja_template_free(kg_jinja_template_t *tmpl) {
    if (!tmpl) {
        return;
    }
    kj_arena_clear(&tmpl->arena);
    free(tmpl);
}

kg_jinja_ctx_t *kg_jinja_ctx_new(const kg_jinja_limits_t *lim) {
    kg_jinja_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        return NULL;
    }
    ctx->lim = defaults;
    if (lim) {
        ctx->lim.max_output_bytes =
            lim->max_output_bytes ? lim->max_output_bytes : defaults.max_output_bytes;
        ctx->lim.max_memory_bytes =
            lim->max_memory_bytes ? lim->max_memory_bytes : defaults.max_memory_bytes;
        ctx->lim.max_steps = lim->max_steps ? lim->max_steps : defaults.max_steps;
        ctx->lim.max_depth = lim->max_depth ? lim->max_depth : defaults.max_depth;
    }
    ctx->arena.cap = ctx->lim.max_memory_bytes;
    ctx->globals = kj_alloc(&ctx->arena, sizeof(kj_scope_t));
    if (!ctx->globals) {
        kg_jinja_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

void kg_jinja_ctx_free(kg_jinja_ctx_t *ctx) {
    if (!ctx) {
        return;
    }
    kj_arena_clear(&ctx->arena);
    free(ctx);
}

kg_status_t kg_jinja_ctx_set(kg_jinja_ctx_t *ctx, const char *name, kg_jinja_value_t v) {
    size_t n = strlen(name);
    char *copy = kj_alloc(&ctx->arena, n + 1);
    if (copy) {
        memcpy(copy, name, n + 1);
    }
    if (!copy || !kj_scope_put(&ctx->arena, ctx->globals, copy, v)) {
        ctx->failed = true;
        return KG_ERR_NOMEM;
    }
    return KG_OK;
}

void kg_jinja_ctx_set_time(kg_jinja_ctx_t *ctx, int64_t epoch_s) {
    ctx->now_s = epoch_s;
}

static bool render_guarded(kj_rs_t *rs, const kg_jinja_template_t *tmpl) {
    if (setjmp(rs->fail)) {
        return false;
    }
    kj_scope_t *top = kj_scope_new(rs, rs->ctx->globals);
    kj_exec(rs, tmpl->root, top);
    return true;
}

kg_status_t kg_jinja_render(const kg_jinja_template_t *tmpl,
                            kg_jinja_ctx_t *ctx,
                            char **out,
                            size_t *out_len,
                            char *errstr,
                            size_t errstr_size) {
    *out = NULL;
    *out_len = 0;
    if (ctx->failed) {
        snprintf(errstr, errstr_size,
                 "the template's variables passed its memory limit of %zu bytes",
                 ctx->lim.max_memory_bytes);
        return KG_ERR_INVALID;
    }
    kj_buf_t buf = {.heap = true};
    kj_rs_t rs = {
        .ctx = ctx, .arena = &ctx->arena, .err = errstr, .err_size = errstr_size, .out = &buf};
    if (!render_guarded(&rs, tmpl)) {
        free(buf.p);
        return KG_ERR_INVALID;
    }
    if (!buf.p) {
        buf.p = malloc(1);
        if (!buf.p) {
            return KG_ERR_NOMEM;
        }
        buf.p[0] = '\0';
    }
    *out = buf.p;
    *out_len = buf.len;
    return KG_OK;
}
