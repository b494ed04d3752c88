/* kg_log: logfmt or JSON lines on stderr, one write(2)-sized fputs per line
 * so lines from two threads do not interleave. */
#include "kg_log.h"

#include <string.h>
#include <time.h>

_Atomic int kg_log_min_level = KG_LOG_LEVEL_INFO;

int kg_log_min_level_get(void) {
    return atomic_load_explicit(&kg_log_min_level, memory_order_relaxed);
}
static kg_log_format_t log_format = KG_LOG_FORMAT_LOGFMT;

/* This thread's scope fields (kg_log_scope); borrowed, NULL when none. */
static _Thread_local const char *scope_fields;

const char *kg_log_scope(const char *fields) {
    const char *prev = scope_fields;
    scope_fields = fields && *fields ? fields : NULL;
    return prev;
}

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

void kg_log_setup(kg_log_level_t level, kg_log_format_t format) {
    atomic_store_explicit(&kg_log_min_level, (int)level, memory_order_relaxed);
    log_format = format;
}

int kg_log_level_parse(const char *s) {
    for (int i = 0; i <= KG_LOG_LEVEL_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            return i;
        }
    }
    if (strcmp(s, "warning") == 0) {
        return KG_LOG_LEVEL_WARN;
    }
    return -1;
}

/* Append `s` escaped for a JSON string or a logfmt quoted value (both accept
 * \" and \\ and \n escapes). */
static size_t append_escaped(char *dst, size_t pos, size_t cap, const char *s) {
    for (; *s && pos + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            dst[pos++] = '\\';
            dst[pos++] = (char)c;
        } else if (c == '\n') {
            dst[pos++] = '\\';
            dst[pos++] = 'n';
        } else if (c < 0x20) {
            pos += (size_t)snprintf(dst + pos, cap - pos, "\\u%04x", c);
        } else {
            dst[pos++] = (char)c;
        }
    }
    return pos;
}

/* A logfmt key: what callers write before '=' (request_id, topic.name, kafka:err). */
static int is_key_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-' || c == ':';
}

/* Parse one " key=value" pair at s (leading spaces skipped): a value is "quoted" (no quote
 * inside) or runs to the next space. On success return the end of the pair and set the
 * key/value spans; NULL when s does not start with a pair. */
static const char *parse_pair(const char *s,
                              const char **key,
                              size_t *key_len,
                              const char **val,
                              size_t *val_len,
                              int *quoted) {
    while (*s == ' ') {
        s++;
    }
    const char *k = s;
    while (is_key_char((unsigned char)*s)) {
        s++;
    }
    if (s == k || *s != '=') {
        return NULL;
    }
    *key = k;
    *key_len = (size_t)(s - k);
    s++;
    *quoted = *s == '"';
    if (*quoted) {
        const char *end = strchr(s + 1, '"');
        if (!end || (end[1] != '\0' && end[1] != ' ')) {
            return NULL;
        }
        *val = s + 1;
        *val_len = (size_t)(end - s - 1);
        return end + 1;
    }
    const char *v = s;
    while (*s && *s != ' ' && *s != '"') {
        s++;
    }
    if (*s == '"') {
        return NULL;
    }
    *val = v;
    *val_len = (size_t)(s - v);
    return s;
}

/* Where the trailing " key=value" pairs of a message begin: the first space after which the
 * whole rest is pairs. Text that merely contains a '=' ("create it with cleanup.policy=compact
 * and ...") stays in the message, so a line is always one parseable record. */
static char *find_pairs(char *msg) {
    for (char *p = msg; (p = strchr(p, ' ')) != NULL; p++) {
        const char *s = p, *key, *val;
        size_t key_len, val_len;
        int quoted, n = 0;
        while (*s && (s = parse_pair(s, &key, &key_len, &val, &val_len, &quoted)) != NULL) {
            n++;
            while (*s == ' ') {
                s++;
            }
        }
        if (s && n > 0) {
            return p;
        }
    }
    return NULL;
}

/* Append a logfmt value: bare when it is a plain word, otherwise quoted and escaped. */
static size_t append_value(char *dst, size_t pos, size_t cap, const char *v, size_t n, int json) {
    int bare = !json && n > 0;
    for (size_t i = 0; bare && i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        bare = c > 0x20 && c != '"' && c != '=' && c != '\\' && c < 0x7f;
    }
    char tmp[2048];
    if (n >= sizeof(tmp)) {
        n = sizeof(tmp) - 1;
    }
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    if (bare) {
        pos += (size_t)snprintf(dst + pos, cap - pos, "%s", tmp);
        return pos < cap ? pos : cap - 1;
    }
    if (pos < cap - 1) {
        dst[pos++] = '"';
    }
    pos = append_escaped(dst, pos, cap, tmp);
    if (pos < cap - 1) {
        dst[pos++] = '"';
    }
    return pos;
}

/* Whether the pairs in `pairs` (may be NULL) have the key (key, key_len). */
static int has_key(const char *pairs, const char *key, size_t key_len) {
    const char *s = pairs, *k, *v;
    size_t kl, vl;
    int quoted;
    while (s && (s = parse_pair(s, &k, &kl, &v, &vl, &quoted))) {
        if (kl == key_len && memcmp(k, key, kl) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Append the " key=value" pairs of `pairs` (may be NULL) as fields, leaving out the keys that
 * `skip` (may be NULL) has. */
static size_t
append_pairs(char *line, size_t pos, size_t cap, const char *pairs, const char *skip, int json) {
    const char *s = pairs, *key, *val;
    size_t key_len, val_len;
    int quoted;
    while (s && (s = parse_pair(s, &key, &key_len, &val, &val_len, &quoted))) {
        if (pos + key_len + 8 >= cap) {
            break;
        }
        if (skip && has_key(skip, key, key_len)) {
            continue;
        }
        pos += (size_t)snprintf(line + pos, cap - pos, json ? ",\"%.*s\":" : " %.*s=", (int)key_len,
                                key);
        pos = append_value(line, pos, cap, val, val_len, json);
    }
    return pos;
}

void kg_log_write(kg_log_level_t level, const char *module, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    /* clang-tidy 14's va_list checker loses va_start through the _Atomic level check inlined
     * from kg_log.h's macros: a false positive */
    vsnprintf(msg, sizeof(msg), fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[96];
    snprintf(tbuf, sizeof(tbuf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ts.tv_nsec / 1000000) % 1000);

    /* The message may end in " key=value" pairs: split them off so logfmt keeps them as
     * fields and JSON gets them as members. */
    char *kv = find_pairs(msg);
    char line[4096];
    /* room kept past cap for the closing brace, the newline and the NUL, so a long line is cut
     * inside a value and still closes its quote */
    size_t pos = 0, cap = sizeof(line) - 3;
    int json = log_format == KG_LOG_FORMAT_JSON;
    const char *lvl = level_names[level <= KG_LOG_LEVEL_OFF ? level : KG_LOG_LEVEL_ERROR];
    if (kv) {
        *kv++ = '\0';
    }
    if (json) {
        pos += (size_t)snprintf(line, cap,
                                "{\"ts\":\"%s\",\"level\":\"%s\",\"module\":\"%s\",\"msg\":", tbuf,
                                lvl, module);
    } else {
        pos += (size_t)snprintf(line, cap, "ts=%s level=%s module=%s msg=", tbuf, lvl, module);
    }
    pos = append_value(line, pos, cap, msg, strlen(msg), 1);
    pos = append_pairs(line, pos, cap, kv, NULL, json);
    pos = append_pairs(line, pos, cap, scope_fields, kv, json);
    if (json) {
        line[pos++] = '}';
    }
    line[pos++] = '\n';
    line[pos] = '\0';
    fputs(line, stderr);
}
