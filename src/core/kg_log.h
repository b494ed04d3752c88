/* kg_log: one line per event on stderr.
 *
 * Format is logfmt by default (`ts=... level=info module=engine msg="..." k=v`)
 * or one JSON object per line. The level is checked before the arguments are
 * evaluated (redis serverLog), so DEBUG lines in hot paths cost one load. */
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum kg_log_level {
    KG_LOG_LEVEL_DEBUG = 0,
    KG_LOG_LEVEL_INFO = 1,
    KG_LOG_LEVEL_WARN = 2,
    KG_LOG_LEVEL_ERROR = 3,
    KG_LOG_LEVEL_OFF = 4,
} kg_log_level_t;

typedef enum kg_log_format {
    KG_LOG_FORMAT_LOGFMT = 0,
    KG_LOG_FORMAT_JSON = 1,
} kg_log_format_t;

/* The minimum level: written by kg_log_setup, read by every thread before
 * it formats a line (a relaxed atomic: a plain load on x86-64). C++ (the
 * CUDA backend) reads it through a function, since C++17 has no _Atomic. */
#ifdef __cplusplus
extern "C" int kg_log_min_level_get(void);
#define KG_LOG_MIN_LEVEL() kg_log_min_level_get()
#else
#include <stdatomic.h>
extern _Atomic int kg_log_min_level;
#define KG_LOG_MIN_LEVEL() atomic_load_explicit(&kg_log_min_level, memory_order_relaxed)
int kg_log_min_level_get(void);
#endif

/** Set the minimum level and format. Call before starting threads. @thread main */
void kg_log_setup(kg_log_level_t level, kg_log_format_t format);

/** Parse "debug|info|warn|error|off". Returns -1 when unknown. */
int kg_log_level_parse(const char *s);

/** Write one line. `msg` is printf-formatted; the message may end with
 * extra ` key=value` pairs already formatted by the caller. The calling
 * thread's scope fields (kg_log_scope) follow them. @thread any */
void kg_log_write(kg_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Set the fields (` key=value` pairs, formatted as a message's are) that
 * every line this thread writes carries after its own pairs, until set
 * again: the worker sets a job's `trace_id` while it works on that job, so
 * every line about the job carries it without each call site saying so. A
 * key the line already has is not repeated. NULL or "" clears. `fields` is
 * borrowed until replaced. Returns the previous scope, to restore on the way
 * out (scopes nest). @thread any (each thread has its own) */
const char *kg_log_scope(const char *fields);

#define KG_LOG_(lvl, module, ...)                                                                  \
    do {                                                                                           \
        if ((int)(lvl) >= KG_LOG_MIN_LEVEL()) {                                                    \
            kg_log_write((lvl), (module), __VA_ARGS__);                                            \
        }                                                                                          \
    } while (0)
#define KG_LOG_DEBUG(module, ...) KG_LOG_(KG_LOG_LEVEL_DEBUG, module, __VA_ARGS__)
#define KG_LOG_INFO(module, ...)  KG_LOG_(KG_LOG_LEVEL_INFO, module, __VA_ARGS__)
#define KG_LOG_WARN(module, ...)  KG_LOG_(KG_LOG_LEVEL_WARN, module, __VA_ARGS__)
#define KG_LOG_ERROR(module, ...) KG_LOG_(KG_LOG_LEVEL_ERROR, module, __VA_ARGS__)

/* Invariants stay on in release builds (GGML_ASSERT): a broken invariant in
 * the engine must not silently corrupt a KV cache that other jobs share. */
#define KG_ASSERT(x)                                                                               \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)
