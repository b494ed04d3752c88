/* kg_jinja_int: what the files of the Jinja interpreter share: the arena,
 * strings and containers, the syntax tree, and the render state.
 *
 * DESIGN. Every value lives in an arena with a byte cap, so a render frees
 * everything at once and a template that builds strings in a loop hits the
 * cap instead of the machine's memory. Errors unwind with longjmp to the
 * entry point (kg_jinja_compile / kg_jinja_render): nothing needs freeing on
 * the way, because all memory is the arena's or the output buffer's, which
 * the entry point owns. */
#pragma once

#include "kg_jinja.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- arena ----

typedef struct kj_chunk kj_chunk_t;
typedef struct kj_arena {
    kj_chunk_t *head;
    size_t used; /* bytes handed out, all chunks */
    size_t cap;  /* 0: unlimited */
} kj_arena_t;

/* No single allocation is larger (1 TiB): a size computed from outside input past it fails
 * rather than wrap in the arena's rounding. */
#define KJ_ALLOC_MAX ((size_t)1 << 40)

/** Zeroed memory, or NULL past the cap, past KJ_ALLOC_MAX or on ENOMEM. */
void *kj_alloc(kj_arena_t *a, size_t size);
void kj_arena_clear(kj_arena_t *a);

// ---- strings and containers ----

struct kg_jinja_str {
    size_t len;
    char s[]; /* NUL-terminated */
};

struct kg_jinja_list {
    kg_jinja_value_t *v; /* (cap) */
    size_t n, cap;
};

struct kg_jinja_dict {
    kg_jinja_str_t **k;   /* (cap) the keys as strings, for lookups */
    kg_jinja_value_t *kv; /* (cap) the keys as given ({0: ...} keeps an integer key) */
    kg_jinja_value_t *v;  /* (cap) */
    size_t n, cap;
    bool is_namespace; /* namespace(): attribute assignment allowed */
};

typedef struct kj_node kj_node_t;
typedef struct kj_rs kj_rs_t;

/* A call's arguments: positional then keyword. */
typedef struct kj_args {
    kg_jinja_value_t *pos;
    size_t n_pos;
    const char **kw_names;
    kg_jinja_value_t *kw;
    size_t n_kw;
} kj_args_t;

typedef kg_jinja_value_t (*kj_builtin_fn)(kj_rs_t *rs, const kj_node_t *at, kj_args_t *args);

typedef enum kj_fn_kind { KJ_FN_MACRO, KJ_FN_BUILTIN, KJ_FN_METHOD } kj_fn_kind_t;

struct kg_jinja_fn {
    kj_fn_kind_t kind;
    const kj_node_t *macro;   /* KJ_FN_MACRO: the macro statement (or a call block's body) */
    struct kj_scope *closure; /* KJ_FN_MACRO: the scope it was defined in */
    kg_jinja_value_t caller;  /* KJ_FN_MACRO: `caller` inside, from a call block */
    kj_builtin_fn builtin;    /* KJ_FN_BUILTIN */
    kg_jinja_value_t self;    /* KJ_FN_METHOD: the receiver */
    const char *name;         /* KJ_FN_BUILTIN / KJ_FN_METHOD */
};

// ---- syntax tree ----

typedef enum kj_kind {
    /* statements */
    KJ_S_BODY,      /* items: statements */
    KJ_S_TEXT,      /* lit: the text */
    KJ_S_OUTPUT,    /* a: expression */
    KJ_S_IF,        /* a: cond, items: then, items2: else (an elif is one KJ_S_IF there) */
    KJ_S_FOR,       /* names: targets, a: iterable, b: filter or NULL, items: body, items2: else */
    KJ_S_SET,       /* a: target (name, attr or tuple), b: value */
    KJ_S_SET_BLOCK, /* name, items: body, c: filter chain applied to the body (or NULL) */
    KJ_S_MACRO,     /* name, names: params, items2: defaults (NULL entries), items: body */
    KJ_S_CALL,      /* a: the call expression, names/items2: caller params, items: body */
    KJ_S_FILTER,    /* c: filter chain (a KJ_E_FILTER whose a is NULL), items: body */
    KJ_S_BREAK,
    KJ_S_CONTINUE,
    /* expressions */
    KJ_E_LIT,    /* lit */
    KJ_E_NAME,   /* name */
    KJ_E_ATTR,   /* a.name */
    KJ_E_INDEX,  /* a[b] */
    KJ_E_SLICE,  /* a[b:c:d]: items[0..2] (NULL when absent) */
    KJ_E_CALL,   /* a(items, kw names = names, kw values = items2) */
    KJ_E_FILTER, /* a | name(items, names/items2); a NULL in a filter block */
    KJ_E_TEST,   /* a is [not] name(items); op: 1 when negated */
    KJ_E_UNARY,  /* op ('-', '+', '!'), a */
    KJ_E_BINARY, /* op, a, b */
    KJ_E_AND,
    KJ_E_OR,
    KJ_E_COND,  /* b if a else c */
    KJ_E_LIST,  /* items */
    KJ_E_TUPLE, /* items (a list at run time) */
    KJ_E_DICT,  /* items: keys, items2: values */
} kj_kind_t;

/* Binary operators beyond single characters. */
enum {
    KJ_OP_EQ = 256,
    KJ_OP_NE,
    KJ_OP_LE,
    KJ_OP_GE,
    KJ_OP_IN,
    KJ_OP_NOTIN,
    KJ_OP_FLOORDIV,
    KJ_OP_POW,
};

struct kj_node {
    kj_kind_t kind;
    int op;
    int line, col;
    kg_jinja_value_t lit;
    const char *name;
    kj_node_t *a, *b, *c;
    kj_node_t **items;
    size_t n_items;
    kj_node_t **items2;
    size_t n_items2;
    const char **names;
    size_t n_names;
};

struct kg_jinja_template {
    kj_arena_t arena; /* the tree and its literals */
    kj_node_t *root;  /* KJ_S_BODY */
};

// ---- render state ----

typedef struct kj_var {
    const char *name;
    kg_jinja_value_t v;
} kj_var_t;

typedef struct kj_scope {
    struct kj_scope *parent;
    kj_var_t *vars; /* (cap) */
    size_t n, cap;
} kj_scope_t;

struct kg_jinja_ctx {
    kj_arena_t arena;
    kg_jinja_limits_t lim;
    kj_scope_t *globals;
    bool failed;
    int64_t now_s; /* 0: the system clock */
};

/* The output of a render or of a captured block. */
typedef struct kj_buf {
    char *p;
    size_t len, cap;
    bool heap; /* malloc'ed (the render's output), not the arena's */
} kj_buf_t;

struct kj_rs {
    kg_jinja_ctx_t *ctx;
    kj_arena_t *arena;
    jmp_buf fail;
    char *err;
    size_t err_size;
    kj_buf_t *out;     /* where output goes now (a set block captures) */
    kj_scope_t *scope; /* the scope of the statement being run */
    size_t total_out;
    uint64_t steps;
    int32_t depth;
    int loop_ctl; /* 1: break, 2: continue pending */
};

// ---- shared between the files ----

/** Stop the render (or compile) with "line:col: message". Never returns. */
_Noreturn void kj_fail(kj_rs_t *rs, const kj_node_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** Count one evaluation step; fails past the cap. */
void kj_step(kj_rs_t *rs, const kj_node_t *at, uint64_t n);

kg_jinja_str_t *kj_str_new(kj_rs_t *rs, const char *s, size_t len);
kg_jinja_value_t kj_str(kj_rs_t *rs, const char *s, size_t len);
kg_jinja_value_t kj_cstr(kj_rs_t *rs, const char *s);
kg_jinja_value_t kj_list(kj_rs_t *rs);
kg_jinja_value_t kj_dict(kj_rs_t *rs);
void kj_list_push(kj_rs_t *rs, kg_jinja_value_t list, kg_jinja_value_t v);
void kj_dict_set(kj_rs_t *rs, kg_jinja_value_t dict, kg_jinja_str_t *key, kg_jinja_value_t v);
/** Set with a key of any scalar type (looked up by its string form). */
void kj_dict_set_key(kj_rs_t *rs, kg_jinja_value_t dict, kg_jinja_value_t key, kg_jinja_value_t v);
/** The dict's value for `key`, or NULL. */
kg_jinja_value_t *kj_dict_get(const kg_jinja_dict_t *d, const char *key, size_t len);

bool kj_truthy(kg_jinja_value_t v);
bool kj_equal(kg_jinja_value_t a, kg_jinja_value_t b);
/** Python-style ordering; fails on types that do not compare. */
int kj_compare(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t a, kg_jinja_value_t b);
/** How a value prints in output and `~` / |string. */
void kj_buf_put_value(kj_rs_t *rs, kj_buf_t *b, kg_jinja_value_t v);
kg_jinja_value_t kj_to_string(kj_rs_t *rs, kg_jinja_value_t v);
void kj_buf_put(kj_rs_t *rs, kj_buf_t *b, const char *s, size_t len);
/** JSON as llama.cpp's tojson writes it (indent < 0: one line). */
void kj_buf_put_json(kj_rs_t *rs,
                     kj_buf_t *b,
                     kg_jinja_value_t v,
                     int indent,
                     int level,
                     const char *item_sep,
                     const char *key_sep);
/** A fresh arena buffer's contents as a string value. */
kg_jinja_value_t kj_buf_value(kj_rs_t *rs, kj_buf_t *b);
const char *kj_type_name(kg_jinja_value_t v);

/** Call a callable value. */
kg_jinja_value_t kj_call(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t fn, kj_args_t *args);
/** The attribute (dict key or method) `name` of `v`; undefined if none. */
kg_jinja_value_t kj_getattr(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t v, const char *name);

/* A filter, which is also a method of the types in `types` (bits 1 << type). */
typedef kg_jinja_value_t (*kj_filter_fn)(kj_rs_t *rs,
                                         const kj_node_t *at,
                                         kg_jinja_value_t self,
                                         kj_args_t *args);
typedef struct kj_filter_def {
    const char *name;
    unsigned types;
    kj_filter_fn fn;
} kj_filter_def_t;
#define KJ_T(t)   (1u << (t))
#define KJ_T_ANY  0x1ffu
#define KJ_T_STR  KJ_T(KG_JINJA_STRING)
#define KJ_T_LIST KJ_T(KG_JINJA_LIST)
#define KJ_T_DICT KJ_T(KG_JINJA_DICT)
#define KJ_T_NUM  (KJ_T(KG_JINJA_INT) | KJ_T(KG_JINJA_FLOAT) | KJ_T(KG_JINJA_BOOL))

extern const kj_filter_def_t kj_scalar_filters[]; /* kg_jinja_filters.c, NULL-terminated */
extern const kj_filter_def_t kj_list_filters[];   /* kg_jinja_lists.c, NULL-terminated */
/** Argument `i` after self, or the keyword `name` (may be NULL). */
kg_jinja_value_t kj_arg(const kj_args_t *a, size_t i, const char *name);
/* kg_jinja_methods.c */
kg_jinja_value_t
kj_filter(kj_rs_t *rs, const kj_node_t *at, const char *name, kg_jinja_value_t v, kj_args_t *args);
bool kj_test(
    kj_rs_t *rs, const kj_node_t *at, const char *name, kg_jinja_value_t v, kj_args_t *args);
bool kj_test_exists(const char *name);
/** A global function (range, namespace, dict, raise_exception, strftime_now) or undefined. */
kg_jinja_value_t kj_global_fn(kj_rs_t *rs, const char *name);

/* kg_jinja_methods.c */
/** A method of a string, list or dict, bound to `self`; undefined if none. */
kg_jinja_value_t kj_method(kj_rs_t *rs, kg_jinja_value_t self, const char *name);
kg_jinja_value_t kj_filter_find_apply(kj_rs_t *rs,
                                      const kj_node_t *at,
                                      const char *name,
                                      kg_jinja_value_t v,
                                      kj_args_t *args,
                                      bool *found);
kg_jinja_value_t
kj_call_method(kj_rs_t *rs, const kj_node_t *at, kg_jinja_fn_t *fn, kj_args_t *args);

// ---- tokens (kg_jinja_lexer.c) ----

typedef enum kj_tok_kind {
    KJ_T_EOF,
    KJ_T_TEXT,       /* text outside tags, after whitespace control */
    KJ_T_OPEN_STMT,  /* {% */
    KJ_T_CLOSE_STMT, /* %} */
    KJ_T_OPEN_EXPR,  /* {{ */
    KJ_T_CLOSE_EXPR, /* }} */
    KJ_T_NAME,
    KJ_T_STRING, /* escapes resolved */
    KJ_T_INT,
    KJ_T_FLOAT,
    KJ_T_OP, /* punctuation: text holds it */
} kj_tok_kind_t;

typedef struct kj_tok {
    kj_tok_kind_t kind;
    int line, col;
    const char *text; /* NUL-terminated copy in the template's arena */
    size_t len;
} kj_tok_t;

/** Tokenize; the array (ends with KJ_T_EOF) and texts are in `arena`. */
kj_tok_t *kj_lex(kj_rs_t *rs, kj_arena_t *arena, const char *src, size_t len, size_t *n_tok);

/* kg_jinja_eval.c */
/** Run the tree into rs->out. */
void kj_exec(kj_rs_t *rs, const kj_node_t *root, kj_scope_t *scope);
kj_scope_t *kj_scope_new(kj_rs_t *rs, kj_scope_t *parent);
/** Set a variable in `sc`; false past the arena's cap. */
bool kj_scope_put(kj_arena_t *a, kj_scope_t *sc, const char *name, kg_jinja_value_t v);
/** "fmt % args" with Python's %s %d %i %f %r %%. */
kg_jinja_value_t
kj_percent_format(kj_rs_t *rs, const kj_node_t *at, kg_jinja_value_t fmt, kg_jinja_value_t args);

/* kg_jinja_parser.c */
kj_node_t *kj_parse(kj_rs_t *rs, kj_arena_t *arena, const char *src, size_t len);
